"""The replay's token gaps (vllm bench serve's ITL: every streamed chunk's gap, pooled over requests) on cases
small enough to check by hand, beside the per-request ITL (AIPerf's), and their sums on a replay that preempts."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.deployment import parse_deployment
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, Engine, Percentiles, ReplayPlan, SchedulerLimits, Sessions, replay
from tuner.replay import _replay as replay_module
from tuner.replay._gaps import token_gap_percentiles
from tuner.replay._requests import EngineRequest, RequestSpec
from tuner.workload import Workload


class _ChunkCosts:
    """A step takes 1 ms, 10 ms when it carries a prompt chunk; decodes gain `accepted` tokens a step."""

    def __init__(self, accepted: float = 1.0) -> None:
        self.accepted = accepted

    def step_ms(self, decode_requests: int, decode_context: float, chunk_tokens: float,
                chunk_context: float) -> float:
        return 10.0 if chunk_tokens > 0 else 1.0


def _run(arrivals: list[tuple[int, int, float]], *, mtp: int = 0, accepted: float = 1.0,
         stream_interval: int = 1) -> tuple[Engine, list[EngineRequest]]:
    """(prompt tokens, output tokens, arrival ms) through one engine with room for everything."""
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=256, block_size=16, num_blocks=100, mtp=mtp,
                             stream_interval=stream_interval)
    engine = Engine("rank 0", _ChunkCosts(accepted), limits)  # type: ignore[arg-type]
    pending = sorted(arrivals, key=lambda a: a[2])
    requests: list[EngineRequest] = []
    while pending or engine.has_work:
        while pending and pending[0][2] <= engine.clock + 1e-9:
            prompt, output, at = pending.pop(0)
            spec = RequestSpec(prompt_tokens=prompt, output_tokens=output)
            r = EngineRequest(rid=len(requests), spec=spec, sent_ms=at, prompt_tokens=prompt, output_tokens=output,
                              units=())
            requests.append(r)
            engine.add(r, at)
        if not engine.has_work:
            engine.clock = pending[0][2]
            continue
        engine.advance(pending[0][2] if pending else float("inf"))
    return engine, requests


def _per_request_itl(requests: list[EngineRequest]) -> Percentiles:
    return Percentiles.of([(r.finish_ms - r.first_token_ms) / (r.output_tokens - 1) for r in requests])


def test_a_prefill_chunk_among_decode_steps_is_one_gap_not_every_tokens() -> None:
    """A (16-token prompt, 5 tokens) at 0: its prefill ends at 10 ms, a decode step at 11. B (16, 3) arrives at
    11: its prefill rides A's next step (10 ms, to 21), then both decode at 22 and 23. A's chunks arrive at 10, 11,
    21, 22, 23 (gaps 1, 10, 1, 1), B's at 21, 22, 23 (gaps 1, 1): vllm bench serve pools [1, 10, 1, 1, 1, 1] (median
    1 ms); the per-request ITL is A's 13 ms / 4 and B's 2 ms / 2 (median 2.125 ms)."""
    engine, (a, b) = _run([(16, 5, 0.0), (16, 3, 11.0)])
    assert (a.first_token_ms, a.finish_ms, b.first_token_ms, b.finish_ms) == (10.0, 23.0, 21.0, 23.0)
    gaps = token_gap_percentiles([engine.gaps])
    assert gaps == Percentiles.of([1.0, 10.0, 1.0, 1.0, 1.0, 1.0])
    assert (gaps.mean, gaps.p50) == (2.5, 1.0)
    assert gaps.p90 == pytest.approx(5.5) and gaps.p99 == pytest.approx(9.55)
    itl = _per_request_itl([a, b])
    assert (itl.mean, itl.p50) == (2.125, 2.125)
    assert gaps.p50 < itl.p50 and gaps.mean > itl.mean  # the long step: one gap of six, a quarter of A's ITL


def test_mtp_streams_one_chunk_per_step() -> None:
    """1 MTP draft, 1.5 tokens accepted a step: 31 tokens are the first plus 20 decode steps of 1 ms, so 20 gaps
    of 1 ms (vLLM streams each step's tokens as one event) where the per-request ITL is 20 ms / 30 tokens."""
    engine, (r,) = _run([(16, 31, 0.0)], mtp=1, accepted=1.5)
    assert r.finish_ms - r.first_token_ms == pytest.approx(20.0)
    gaps = token_gap_percentiles([engine.gaps])
    assert (gaps.mean, gaps.p50, gaps.p99) == (1.0, 1.0, 1.0)
    assert engine.gaps.arrays()[1].sum() == 20
    assert _per_request_itl([r]).p50 == pytest.approx(20 / 30)


def test_a_stream_interval_sends_chunks_of_several_steps() -> None:
    """--stream-interval 4, 101 tokens at 1 ms a step: a chunk every 4 steps (25 gaps), about 4 ms each."""
    engine, (r,) = _run([(16, 101, 0.0)], stream_interval=4)
    assert engine.gaps.arrays()[1].sum() == pytest.approx(25)
    gaps = token_gap_percentiles([engine.gaps])
    assert gaps.p50 == 4.0 and gaps.mean == pytest.approx(4.0, rel=0.02)
    assert _per_request_itl([r]).p50 == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_percentiles_are_numpys_on_the_expanded_list(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.choice([1.0, 2.5, 3.0, 7.0, 40.0], size=9)
    weights = rng.integers(0, 6, size=9).astype(float)
    weights[0] = 1.0
    expanded = [v for v, w in zip(values, weights, strict=True) for _ in range(int(w))]
    mine = Percentiles.weighted(values, weights)
    numpy = Percentiles.of(expanded)
    for got, want in zip((mine.mean, mine.p50, mine.p90, mine.p99), (numpy.mean, numpy.p50, numpy.p90, numpy.p99),
                         strict=True):
        assert got == pytest.approx(want, rel=1e-12)


def test_gaps_sum_to_every_answers_decode_time(small_kv: RooflineModel, chunked_mix: Workload,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With preemption (recomputed requests: gaps taken one by one), sessions and a warm-up, and PD: the gaps are
    one per token after the first of every measured request (no MTP, stream interval 1) and add up to their
    first-to-last-token times; the token-gap median sits below the per-request ITL's (prefill steps weigh less)."""
    small, mix = small_kv, chunked_mix
    engines: list[list[Engine]] = []
    report = replay_module._Run._report

    def keep(run: replay_module._Run) -> object:
        engines.append(run.engines)
        return report(run)

    monkeypatch.setattr(replay_module._Run, "_report", keep)
    for deployment, sessions in (("TP8", Sessions(turns=3, think_ms=300)), ("1P:TP4,1D:TP8", None)):
        out = replay(small, ReplayPlan(deployment=parse_deployment(deployment), workload=mix,
                                       arrival=ArrivalProcess("poisson", rate_rps=4), sessions=sessions,
                                       num_requests=150, warmup_share=0.1))
        assert out.preemptions > 0
        parts = [e.gaps.arrays() for e in engines[-1]]
        values = np.concatenate([v for v, _ in parts])
        weights = np.concatenate([w for _, w in parts])
        assert weights.sum() == sum(r.output_tokens - 1 for r in out.requests)
        assert values @ weights == pytest.approx(sum(r.e2e_ms - r.ttft_ms for r in out.requests), rel=1e-9)
        assert sum(len(e.gaps.single) for e in engines[-1]) > 0
        assert out.token_gap_ms.p50 < out.itl_ms.p50
        assert out.as_json()["token_gap_ms"] == {"mean": out.token_gap_ms.mean, "p50": out.token_gap_ms.p50,
                                                 "p90": out.token_gap_ms.p90, "p99": out.token_gap_ms.p99}
