"""Do closed and open loop agree? (#45) A deployment replayed closed loop at C clients sustains some rate R; offered
0.9 R open loop (Poisson), it must be stable (its queue does not grow) and meet what the closed loop measured within
10% (TTFT and ITL p50/p90 no more than 1.1 x the closed loop's).

The closed loop's R is read two ways: `request_rps` (measured requests over first send to last answer: the drain
after the last request is sent, with fewer than C clients left, counts as time) and `sustained_rps` (answers per
second while every client is busy: warm-up done to the last request sent), the definition the replay reports.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/closed_open_agreement.py
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.deployment import parse_deployment
from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, ReplayPlan, ReplayReport, replay
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[1]
SHARE = 0.9
TOLERANCE = 1.10
REQUESTS = 800

LOGNORMAL = Workload.model_validate({
    "input_tokens": {"distribution": "lognormal", "mean": 2000, "stddev": 1500, "max_tokens": 16000},
    "output_tokens": {"distribution": "normal", "mean": 300, "stddev": 100},
    "prefix": {"shared_tokens": 1024, "num_prefixes": 8}})
FIXED = Workload.fixed(2000, 200, concurrency=(1,))
CASES: list[tuple[str, str, Workload, int]] = [  # name, deployment, workload, clients
    ("TP8, 2000/200", "TP8", FIXED, 32),
    ("TP8, lognormal chat", "TP8", LOGNORMAL, 48),
    ("2x TP4, lognormal chat", "2x:TP4", LOGNORMAL, 48),
    ("TP4DP2, 2000/200", "TP4DP2", FIXED, 64),
    ("1P TP4 + 1D TP4, 2000/200", "1P:TP4,1D:TP4", FIXED, 32),
]


@dataclass(frozen=True)
class Agreement:
    name: str
    closed: ReplayReport
    open: ReplayReport
    rate_rps: float

    def ratios(self) -> dict[str, float]:
        c, o = self.closed, self.open
        return {"TTFT p50": o.ttft_ms.p50 / c.ttft_ms.p50, "TTFT p90": o.ttft_ms.p90 / c.ttft_ms.p90,
                "ITL p50": o.itl_ms.p50 / c.itl_ms.p50, "ITL p90": o.itl_ms.p90 / c.itl_ms.p90}

    @property
    def agrees(self) -> bool:
        return not self.open.queue.grows and all(r <= TOLERANCE for r in self.ratios().values())


def agreement(perf: RooflineModel, name: str, deployment: str, workload: Workload, clients: int,
              requests: int = REQUESTS) -> Agreement:
    """Closed loop at `clients`, then open loop at SHARE x its sustained rate, same deployment and traffic."""
    d = parse_deployment(deployment)
    closed = replay(perf, ReplayPlan(deployment=d, workload=workload, arrival=ArrivalProcess("closed",
                                                                                             concurrency=clients),
                                     num_requests=requests, warmup_share=0.1))
    rate = SHARE * closed.sustained_rps
    opened = replay(perf, ReplayPlan(deployment=d, workload=workload, arrival=ArrivalProcess("poisson", rate_rps=rate),
                                     num_requests=requests, warmup_share=0.1))
    return Agreement(name, closed, opened, rate)


def main() -> None:
    perf = RooflineModel(load_model(REPO / "examples/models/llama-3.1-70b"), get_gpu("h200"))
    print(f"Llama-3.1-70B on H200, {REQUESTS} requests per replay (10% warm-up); open loop at {SHARE:.0%} of the "
          "closed loop's sustained rate; ratios open / closed (agreement: <= 1.10 and a queue that drains)")
    print(f"{'case':<28} {'C':>3} {'req/s old':>9} {'sustained':>9} {'offered':>8} {'open req/s':>10} "
          f"{'TTFT50':>7} {'TTFT90':>7} {'ITL50':>6} {'ITL90':>6} {'queue':>6}  agrees")
    agreed = 0
    for name, deployment, workload, clients in CASES:
        a = agreement(perf, name, deployment, workload, clients)
        r = a.ratios()
        agreed += a.agrees
        print(f"{name:<28} {clients:>3} {a.closed.request_rps:>9.2f} {a.closed.sustained_rps:>9.2f} "
              f"{a.rate_rps:>8.2f} {a.open.request_rps:>10.2f} {r['TTFT p50']:>7.2f} {r['TTFT p90']:>7.2f} "
              f"{r['ITL p50']:>6.2f} {r['ITL p90']:>6.2f} {'grows' if a.open.queue.grows else 'drains':>6}  "
              f"{'yes' if a.agrees else 'NO'}")
    print(f"{agreed} of {len(CASES)} cases agree")


if __name__ == "__main__":
    main()
