"""The deployment question as a library call: `advise(AdviseRequest) -> Advice`.

For a model, hardware, traffic and SLA: both fronts (PD-disaggregated and aggregated, closed loop or at one
offered request rate), the recommendation under the SLA and the deployment to run at its operating point. The CLI
(`topotune frontier`) and the service (`POST /v1/advice`, the advice page) only build the request and render the
answer; errors name the request's fields (`gpus`, `sla.max_ttft_ms`), which each face maps to its own names.
"""

from tuner.advise._advise import Advice, advise, offered_traffic
from tuner.advise._fronts import Fronts, SweepProgress
from tuner.advise._recommend import (
    TIE_MARGIN,
    Recommendation,
    aggregated_json,
    operating_deployment,
    point_json,
    recommend,
)
from tuner.advise._request import MAX_MTP_DEPTH, SERVING_MODES, AdviseRequest, ServeOptions, ServingMode, Sla
from tuner.advise._verify import ReplayDecision, replay_verified

__all__ = [
    "MAX_MTP_DEPTH", "SERVING_MODES", "TIE_MARGIN", "Advice", "AdviseRequest", "Fronts",
    "Recommendation",
    "ReplayDecision", "ServeOptions",
    "ServingMode", "Sla", "SweepProgress", "advise", "aggregated_json",
    "offered_traffic", "operating_deployment", "point_json", "recommend", "replay_verified",
]
