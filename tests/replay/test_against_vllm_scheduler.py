"""The replay's engine against vLLM's own V1 Scheduler, step by step, on the same requests.

vLLM's Scheduler runs in the CPU vLLM venv with no model (tests/replay/vllm_scheduler_steps.py feeds it one
sampled token per finished prompt or decode step); the replay's Engine runs the same requests with a step of
1 ms, so a request sent before step s arrives at s ms. Compared: every step's batch (tokens scheduled per
request), which requests were preempted, and each request's prefix-cache hit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _support.cpu_vllm import needs_envs

from tuner.backends.vllm import default_envs_dir
from tuner.replay import Engine, SchedulerLimits
from tuner.replay._requests import EngineRequest, RequestSpec

DRIVER = Path(__file__).with_name("vllm_scheduler_steps.py")
BS = 16


class _UnitStep:
    """Every step takes 1 ms: the replay's clock counts steps."""

    accepted = 1.0

    def step_ms(self, *_: float) -> float:
        return 1.0


def _requests() -> list[dict]:
    """Prompts built from 16-token blocks: three share a 3-block system prompt, two share 2 blocks of another,
    one repeats an earlier prompt whole; answers long enough that a small cache runs out while they decode."""
    system = [[100 + b * BS + i for i in range(BS)] for b in range(3)]
    other = [[300 + b * BS + i for i in range(BS)] for b in range(2)]
    shapes = [  # (shared blocks, own tokens, max_tokens, arrival step)
        (system, 21, 40, 0), (system, 5, 30, 1), (other, 40, 50, 2), (system, 33, 25, 6),
        (other, 7, 60, 9), ([], 70, 35, 12), (system, 21, 20, 40), ([], 90, 30, 41)]
    out = []
    for n, (shared, own, max_tokens, arrive) in enumerate(shapes):
        prompt = [t for block in shared for t in block] + [1000 + 97 * n + i for i in range(own)]
        if n == 6:  # the same prompt as request 0: a full hit but its last token
            prompt = out[0]["prompt"]
        out.append({"id": str(n), "prompt": prompt, "max_tokens": max_tokens, "arrive_step": arrive})
    return out


def _units(prompt: list[int], max_tokens: int) -> tuple:
    """One unit per full block of the prompt, then of the answer (its tokens are the driver's 7s), chained."""
    units = []
    tokens = [*prompt, *([7] * max_tokens)]
    key: tuple = ()
    for b in range(len(tokens) // BS):
        key = (key, tuple(tokens[b * BS:(b + 1) * BS]))
        units.append((hash(key), 1))
    return tuple(units)


def _replay_steps(spec: dict) -> tuple[list[dict[str, int]], dict[str, int], list[list[str]]]:
    limits = SchedulerLimits(max_num_seqs=spec["max_num_seqs"], max_num_batched_tokens=spec["max_num_batched_tokens"],
                             long_prefill_token_threshold=spec["long_prefill_token_threshold"],
                             block_size=BS, num_blocks=spec["num_blocks"] - 1)  # vLLM keeps one null block
    engine = Engine("rank 0", _UnitStep(), limits)  # type: ignore[arg-type]
    engine.log = []
    pending = sorted(spec["requests"], key=lambda r: r["arrive_step"])
    requests = []
    preempted_by_step: list[list[str]] = []
    while pending or engine.has_work:
        while pending and pending[0]["arrive_step"] <= engine.clock + 1e-9:
            r = pending.pop(0)
            s = RequestSpec(prompt_tokens=len(r["prompt"]), output_tokens=r["max_tokens"],
                            units=_units(r["prompt"], r["max_tokens"]))
            req = EngineRequest(rid=int(r["id"]), spec=s, sent_ms=r["arrive_step"], prompt_tokens=s.prompt_tokens,
                                output_tokens=s.output_tokens, units=s.units)
            requests.append(req)
            engine.add(req, float(r["arrive_step"]))
        if not engine.has_work:
            engine.clock = float(pending[0]["arrive_step"])
            continue
        before = {r.rid: r.preemptions for r in requests}
        logged = len(engine.log)
        engine.advance(pending[0]["arrive_step"] if pending else float("inf"))
        hit = sorted(str(r.rid) for r in requests if r.preemptions > before[r.rid])
        for i in range(len(engine.log) - logged):
            preempted_by_step.append(hit if i == 0 else [])
    steps = [{str(k): int(v) for k, v in step.items()} for step in engine.log]
    return steps, {str(r.rid): r.hit_tokens for r in requests}, preempted_by_step


# (num_blocks, threshold). 200 blocks: no pressure (prefix hits, chunking at the 64-token budget, 4 seqs at most);
# 16 blocks: the cache runs out while requests decode and vLLM preempts the newest; a long-prefill threshold of 24
# tokens; then tight caches under a threshold, where prefills of one prefix overlap: 12/24 needs a step's blocks
# cached when it is scheduled (request 4 hits the block re-admitted request 2 computes in that very step), 10/24
# and 11/24 a recomputed block's second cached copy (it outlives the evicted first: request 4's 2-block hit).
CASES = [(200, 0), (16, 0), (200, 24), (12, 24), (10, 24), (11, 24), (12, 16), (14, 32), (10, 16), (11, 16),
         (13, 24), (9, 24), (10, 32), (12, 8)]


def _spec(num_blocks: int, threshold: int) -> dict:
    return {"block_size": BS, "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 512,
            "num_blocks": num_blocks, "long_prefill_token_threshold": threshold, "requests": _requests()}


@pytest.fixture(scope="module")
def vllm_runs(tiny_model: Path) -> dict[tuple[int, int], dict]:
    """vLLM's Scheduler over every case, in one driver process (one vLLM import; a fresh Scheduler per case)."""
    python = default_envs_dir() / "vllm" / "bin" / "python"
    done = subprocess.run([str(python), str(DRIVER), str(tiny_model)],  # the session's model, read only
                          input=json.dumps([_spec(*case) for case in CASES]), capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(zip(CASES, json.loads(done.stdout.strip().splitlines()[-1]), strict=True))


@needs_envs
@pytest.mark.slow
@pytest.mark.parametrize(("num_blocks", "threshold"), CASES)
def test_step_by_step_batches_match_vllms_scheduler(vllm_runs: dict[tuple[int, int], dict], num_blocks: int,
                                                    threshold: int) -> None:
    """Every step's batch, every first-admission prefix hit, the step count; preemptions exactly when tight."""
    theirs = vllm_runs[(num_blocks, threshold)]
    their_steps = [s["batch"] for s in theirs["steps"] if s["batch"]]
    ours, hits, _ = _replay_steps(_spec(num_blocks, threshold))
    assert {k: hits[k] for k in theirs["hits"]} == theirs["hits"]
    for index, (mine, vllm) in enumerate(zip(ours, their_steps, strict=False)):
        assert mine == vllm, f"step {index}: replay {mine} vs vLLM {vllm}"
    assert len(ours) == len(their_steps)
    preempted = sum(len(s["preempted"]) for s in theirs["steps"])
    assert (preempted > 0) == (num_blocks < 100)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
