"""Wide EP across hosts against the TP/DP alternatives: the decode and prefill fronts of DeepSeek-V3 on the shipped
4 x 8 H200 space (search_spaces/deepseek-v3-4x8-h200.yaml), every point with the communication it leaves exposed.

Each layout runs as many instances as fit in the 32 GPUs; a point is one layout at one load. Columns: throughput
per GPU, per-user speed, the step time and how much of it is exposed (not overlapped) MoE/TP communication,
and whether the EP group crosses hosts (RDMA). Prints the layouts' best points and the Pareto front of both.

Run: PYTHONPATH=. .venv/bin/python benchmarks/wide_ep_frontier.py [--space PATH] [--phase decode|prefill]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import TopotuneError
from tuner.frontier import pareto_front
from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import RooflineModel
from tuner.perf._costs import ep_domains
from tuner.space import load_space
from tuner.topology import Role, Topology

REPO = Path(__file__).resolve().parents[1]
SPACE = REPO / "search_spaces" / "deepseek-v3-4x8-h200.yaml"
MODEL = REPO / "examples" / "models" / "deepseek-v3"
#: The layouts compared, each with the backend, DBO and EPLB its phase would use (an EP group over DP ranks runs
#: DeepEP: high-throughput kernels for prefill, low-latency for decode; the others have no all-to-all).
LAYOUTS = ("TP8", "TEP8", "TP4DP2", "TP2DP4+EP", "DEP8", "TP4DP4+EP", "DEP16", "TP8DP4+EP", "DEP32")


@dataclass(frozen=True)
class Point:
    layout: str
    instances: int
    hosts_per_instance: int
    concurrency: int
    tok_s_per_gpu: float
    tok_s_per_user: float
    step_ms: float
    comm_ms: float

    @property
    def exposed_share(self) -> float:
        return self.comm_ms / self.step_ms if self.step_ms else 0.0


def _topology(name: str, phase: str, max_num_batched_tokens: int, max_num_seqs: int) -> Topology:
    base = Topology.parse(name)
    wide = base.ep and base.dp > 1
    backend = ("deepep_high_throughput" if phase == "prefill" else "deepep_low_latency") if wide \
        else "allgather_reducescatter"
    return Topology.parse(name, role=Role.PREFILL if phase == "prefill" else Role.DECODE, all2all_backend=backend,
                          dbo=wide, num_redundant_experts=32 if wide else 0, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, gpu_memory_utilization=0.9)


def sweep(phase: str, space_path: Path = SPACE) -> list[Point]:
    space = load_space(space_path)
    gpu = get_gpu(space.cluster.gpu)
    perf = RooflineModel(load_model(MODEL), gpu)
    ph = space.phases[phase]
    isl = (ph.workload.isl or space.workload.isl)
    osl = (ph.workload.osl or space.workload.osl)
    points = []
    for name in LAYOUTS:
        topo = _topology(name, phase, max(ph.max_num_batched_tokens), max(ph.max_num_seqs))
        if topo.num_gpus > space.cluster.num_gpus:
            continue
        instances = space.cluster.num_gpus // topo.num_gpus
        hosts, _ = ep_domains(gpu, topo.num_gpus)
        for c in ph.concurrency:
            try:
                m = perf.predict(topo, topo.role, isl=isl, osl=osl, concurrency=c)
                step = perf.prefill_step(topo, c, isl=isl) if phase == "prefill" else \
                    perf.decode_step(topo, c, isl=isl, osl=osl)
            except TopotuneError:
                continue  # does not fit (memory) or vLLM would refuse it
            speed = m.request_throughput_rps * isl / m.num_gpus if phase == "prefill" else m.output_tok_s_per_gpu
            user = 1000.0 / m.ttft_ms_mean * isl if phase == "prefill" else m.tok_s_per_user
            points.append(Point(topo.label().split(" seqs=")[0], instances, hosts, c, speed, user, step.step_ms,
                                step.comm_ms))
    return points


def _print(points: Sequence[Point], title: str) -> None:
    print(f"\n{title}")
    print(f"{'layout':<50} {'inst':>4} {'hosts':>5} {'conc':>5} {'tok/s/GPU':>10} {'tok/s/user':>10} "
          f"{'step ms':>8} {'exposed comm ms':>16}")
    for p in points:
        print(f"{p.layout:<50} {p.instances:>4} {p.hosts_per_instance:>5} {p.concurrency:>5} "
              f"{p.tok_s_per_gpu:>10,.0f} {p.tok_s_per_user:>10,.1f} {p.step_ms:>8.1f} {p.comm_ms:>8.1f} "
              f"({p.exposed_share:>4.0%})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", type=Path, default=SPACE)
    parser.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    args = parser.parse_args(argv)
    points = sweep(args.phase, args.space)
    best = {}
    for p in points:
        if p.layout not in best or p.tok_s_per_gpu > best[p.layout].tok_s_per_gpu:
            best[p.layout] = p
    _print(sorted(best.values(), key=lambda p: -p.tok_s_per_gpu), f"{args.phase}: each layout's best throughput "
           f"(ranked)")
    front = pareto_front(points, "tok_s_per_gpu", "tok_s_per_user")
    _print(sorted(front, key=lambda p: -p.tok_s_per_gpu), f"{args.phase}: Pareto front (tok/s/GPU vs tok/s/user)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
