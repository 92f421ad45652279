"""An event-driven replay of vLLM's engine: requests stepped through the V1 scheduler's rules (chunked prefill,
prefix cache, KV blocks, preemption), each step priced by the step cost model, behind a router.

The analytic model (tuner/perf) screens a space in milliseconds; the replay measures what a candidate does with
the real stream: per-request TTFT and ITL, bursts, cache hits that are bimodal, queues that drain or grow.
"""

from tuner.replay._arrivals import MAX_REPLAY_REQUESTS, ArrivalProcess, Sessions
from tuner.replay._engine import Engine, Sample, SchedulerLimits
from tuner.replay._replay import ReplayPlan, replay
from tuner.replay._report import Percentiles, QueueTrend, ReplayReport, RequestRecord, Sla, TimelinePoint
from tuner.replay._router import check_router
from tuner.replay._stream import Arrival, ReplayAnswer, ReplayRequest, replay_stream
from tuner.replay._verify import Candidate, Verified, VerifiedChoice, fewest_instances_for_rate, verify_candidates

__all__ = [
    "MAX_REPLAY_REQUESTS",
    "Arrival",
    "ArrivalProcess",
    "Candidate",
    "Engine",
    "Percentiles",
    "QueueTrend",
    "ReplayAnswer",
    "ReplayPlan",
    "ReplayReport",
    "ReplayRequest",
    "RequestRecord",
    "Sample",
    "SchedulerLimits",
    "Sessions",
    "Sla",
    "TimelinePoint",
    "Verified",
    "VerifiedChoice",
    "check_router",
    "fewest_instances_for_rate",
    "replay",
    "replay_stream",
    "verify_candidates",
]
