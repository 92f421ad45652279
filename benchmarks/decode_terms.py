"""What the model prices for one small-batch decode step of a TP8 MoE on H200, term by term, beside what the source
measured (#45: gs-dsr1-h200-sharegpt-c4's ITL is x0.58 held out).

For each row: the held-out calibration (the Hopper class fitted on the fixed-length table without the row's source,
as benchmarks/workload_fidelity.py does), the decode step at the row's batch (decode only: the median ITL of a
closed loop is a step without a prefill chunk) at the mean context, split into the weights read (non-expert + lm_head,
and the routed experts a batch of b touches: 1 - (1 - k/E)^b of each GPU's slices), the HBM time (experts at
moe_gemm_efficiency), the all-reduces, the kernel floor (kernels x kernel_latency_us), the fixed step overhead and
the per-request host cost. Then the gap to the measured ITL p50 (or TPOT), per step and per decoder layer, and what
one factor alone would have to be to close it (each against the range its Field documents).

Run: PYTHONPATH=. .venv/bin/python benchmarks/decode_terms.py   (~15 s: three class fits)
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fidelity
import workload_fidelity as wf

from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import Calibration, DecodeStep, RooflineModel
from tuner.perf._steps import decode_step
from tuner.topology import Role, Topology

#: (row id, table, batch): the vLLM TP8 MoE closed loops at concurrency 4 on H200
ROWS = (("gs-dsr1-h200-sharegpt-c4", "workload", 4), ("gs-glm46-h200-sharegpt-c4", "workload", 4),
        ("kimik25-int4-h200-tp8-c4", "fixed", 4))


def _row(row_id: str, table: str) -> dict:
    path = wf.TABLE if table == "workload" else fidelity.TABLE
    return next(r for r in yaml.safe_load(path.read_text())["rows"] if r["id"] == row_id)


def _shape(row: dict, table: str) -> tuple[float, float, str]:
    """(mean context, the measured per-token time in ms, which figure it is) of a row."""
    if table == "workload":
        w, m = row["workload"], row["measured"]
        return float(w["isl_mean"]) + float(w["osl_mean"]) / 2, float(m["itl_ms"]["p50"]), "ITL p50"
    return float(row["isl"]) + float(row["osl"]) / 2, float(row["measured"]["tpot_ms"]), "TPOT mean"


def implied_factors(costs, gpu, cal: Calibration, step: DecodeStep, measured_ms: float) -> dict[str, float]:
    """Each factor's value that alone makes the priced decode step `step` last `measured_ms` (all else kept): the
    kernel floor, the experts' streaming rate, the HBM rate of every byte, or the fixed step overhead."""
    gap = measured_ms - step.step_ms
    hbm = gpu.hbm_bandwidth_tb_s * 1e12 * cal.hbm_efficiency
    kernels_ms = cal.kernel_latency_us * 1e-3 * costs.target.num_kernels
    expert_ms = step.expert_bytes / cal.moe_gemm_efficiency / hbm * 1e3
    return {"kernel_latency_us": (kernels_ms + gap) / costs.target.num_kernels * 1e3,
            "moe_gemm_efficiency": step.expert_bytes / hbm / ((expert_ms + gap) * 1e-3),
            "hbm_efficiency": cal.hbm_efficiency * step.memory_ms / (step.memory_ms + gap),
            "step_overhead_ms": cal.step_overhead_ms + gap}


def main() -> int:
    cals = wf.Calibrations()
    print("decode step at batch b, held-out Hopper calibration, per GPU (ms unless stated)")
    for row_id, table, batch in ROWS:
        row = _row(row_id, table)
        cal, _ = cals.held_out(str(row["gpu"]), str(row["source"]))
        model = load_model(wf._model_dir(str(row["model"])))
        gpu = get_gpu(str(row["gpu"]))
        topo = Topology.parse(str(row["topology"]), role=Role.BOTH)
        perf = RooflineModel(model, gpu, cal)
        costs = perf.state(topo, Role.BOTH, isl=1024, osl=128).costs
        t = costs.target
        context, measured, what = _shape(row, table)
        s = decode_step(costs, gpu, cal, requests_per_rank=batch, total_requests=batch, context_tokens=context,
                        mtp_depth=0, stream_interval=1)
        hbm = gpu.hbm_bandwidth_tb_s * 1e12 * cal.hbm_efficiency
        dense_ms = s.weight_bytes / hbm * 1e3
        expert_ms = s.expert_bytes / cal.moe_gemm_efficiency / hbm * 1e3
        kernels_ms = cal.kernel_latency_us * 1e-3 * t.num_kernels
        moe = model.moe
        touched = moe.num_experts * costs.expert_active_fraction(batch) if moe else 0.0
        gap = measured - s.step_ms
        print(f"\n{row_id} ({row['checkpoint']}, vLLM {row['engine_version']}, {row['topology']}, batch {batch}, "
              f"context {context:.0f}; held out of {row['source']})")
        print(f"  weights read: non-expert + lm_head {s.weight_bytes / 1e9:.2f} GB -> {dense_ms:.2f}; routed experts "
              f"{s.expert_bytes / 1e9:.2f} GB ({touched:.1f} of {moe.num_experts if moe else 0} experts touched per "
              f"layer, top-{moe.experts_per_token if moe else 0}) at moe_gemm_efficiency "
              f"{cal.moe_gemm_efficiency:.2f} -> {expert_ms:.2f}; KV {s.kv_bytes / 1e6:.1f} MB")
        print(f"  memory {s.memory_ms:.2f} (compute {s.compute_ms:.2f}) + all-reduces {s.comm_ms:.2f} "
              f"({2 * t.num_layers} x {cal.allreduce_latency_us:.1f} us x log2 TP) + kernels {kernels_ms:.2f} "
              f"({t.num_kernels} x {cal.kernel_latency_us:.2f} us) + step {cal.step_overhead_ms:.2f} + requests "
              f"{s.requests_ms:.2f} = {s.step_ms:.2f} ms")
        print(f"  measured {what} {measured:.2f} ms: priced x{s.step_ms / measured:.2f}; gap {gap:+.2f} ms per step, "
              f"{gap / t.num_layers * 1e3:+.0f} us per decoder layer ({t.num_layers} layers)")
        if gap > 0:
            f = implied_factors(costs, gpu, cal, s, measured)
            print(f"  one factor alone to close it: kernel_latency_us {f['kernel_latency_us']:.1f} (documented 2-6), "
                  f"moe_gemm_efficiency {f['moe_gemm_efficiency']:.2f} (0.3-1), hbm_efficiency "
                  f"{f['hbm_efficiency']:.2f} (0.7-0.9), step_overhead_ms {f['step_overhead_ms']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
