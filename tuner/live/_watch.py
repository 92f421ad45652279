"""A deployment watch: every period, the traffic since the last look; when it has moved from what the deployment
serves well (rate, length quantiles, prefix share) or the SLA attainment falls below target, new advice.

Pure state and decisions; who scrapes, when, and where the state is kept is the caller's (the service's
api/deployment_watch.py, the slow test's loop). Nothing here applies anything: advice is shown, never run.

Drift is read against a baseline that settles over the first `confirm_windows` windows with traffic (each replaces
it: a watch's first window, like the one that fires, is often partial), and again after each advice. A change
must hold for `confirm_windows` consecutive windows with traffic before it fires, so a window straddling a change
(half old traffic, half new) does not fire on its own and the window after it, compared with the same baseline,
confirms it; a window without requests breaks the chain: one change, one advice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from tuner.errors import TopotuneError
from tuner.live._advice import WatchAdvice, WatchAdviceRequest, advise_traffic
from tuner.live._check import predict_deployment
from tuner.workload import LiveTraffic, VllmCounters, live_traffic


@dataclass(frozen=True)
class Thresholds:
    """How far the traffic may move before the advice is asked again."""

    rate_rel: float = 0.25  # |rate / baseline - 1|
    length_rel: float = 0.25  # |quantile / baseline - 1| of the input or output length at p50 or p90
    prefix_abs: float = 0.15  # |hit share - baseline| (a share, 0..1)
    min_attainment: float = 0.9  # measured share of requests within the SLA
    confirm_windows: int = 2  # consecutive windows a change must hold


@dataclass(frozen=True)
class TrafficProfile:
    """What a window's traffic is, in the terms drift is judged on."""

    rate_rps: float
    input_p50: float
    input_p90: float
    output_p50: float
    output_p90: float
    prefix_share: float
    attainment: float  # measured share within the SLA (nan: no SLA bound)
    requests: float

    @classmethod
    def of(cls, live: LiveTraffic, *, max_ttft_ms: float | None, max_itl_ms: float | None) -> TrafficProfile:
        w = live.workload
        attainment = (live.share_within(max_ttft_ms=max_ttft_ms, max_itl_ms=max_itl_ms)
                      if max_ttft_ms is not None or max_itl_ms is not None else math.nan)
        return cls(rate_rps=live.arrival_rps, input_p50=w.input_tokens.quantile(0.5),
                   input_p90=w.input_tokens.quantile(0.9), output_p50=w.output_tokens.quantile(0.5),
                   output_p90=w.output_tokens.quantile(0.9), prefix_share=live.prefix_hit_share,
                   attainment=attainment, requests=live.requests)

    def as_json(self) -> dict[str, float | None]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else round(v, 4)) for k, v in asdict(self).items()}


def _rel(now: float, then: float) -> float:
    return abs(now / then - 1) if then > 0 else (0.0 if now == 0 else math.inf)


def drift_reasons(baseline: TrafficProfile, now: TrafficProfile, t: Thresholds) -> list[str]:
    """Every way `now` moved past a threshold from `baseline`, in words."""
    out = []
    if _rel(now.rate_rps, baseline.rate_rps) > t.rate_rel:
        out.append(f"request rate {baseline.rate_rps:.3g} -> {now.rate_rps:.3g} req/s")
    for name in ("input_p50", "input_p90", "output_p50", "output_p90"):
        a, b = getattr(baseline, name), getattr(now, name)
        if _rel(b, a) > t.length_rel:
            side, q = name.split("_")
            out.append(f"{side} length {q} {a:,.0f} -> {b:,.0f} tokens")
    if abs(now.prefix_share - baseline.prefix_share) > t.prefix_abs:
        out.append(f"prefix-cache hit share {baseline.prefix_share:.0%} -> {now.prefix_share:.0%}")
    return out


@dataclass(frozen=True)
class WatchTarget:
    """What is watched and what the advice is asked under."""

    deployment: str  # as parse_deployment reads it
    serve_flags: str
    advice: WatchAdviceRequest
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass(frozen=True)
class WatchState:
    """What a watch carries from one period to the next (JSON-able: the service stores it)."""

    baseline: TrafficProfile | None = None
    baseline_windows: int = 0  # windows the baseline has settled over (it is judged against from confirm_windows)
    pending: int = 0  # consecutive windows past a threshold, not yet fired
    sla_alerted: bool = False  # fired for attainment below target; re-armed when it recovers


@dataclass(frozen=True)
class Expected:
    """What following the advice is expected to give, against the deployment running now."""

    gpus_now: int
    gpus_advised: int
    attainment_now: float  # measured in the window
    attainment_advised: float  # predicted for the advice
    current_carries: bool  # the model says the running deployment carries the new rate
    summary: str


@dataclass(frozen=True)
class WatchTick:
    """One period: the window read, what the watch decided, and the advice when it fired."""

    kind: str  # baseline, steady, pending, advice, idle, error
    state: WatchState
    profile: TrafficProfile | None = None
    reasons: tuple[str, ...] = ()
    advice: WatchAdvice | None = None
    expected: Expected | None = None
    message: str = ""

    @property
    def fired(self) -> bool:
        return self.kind == "advice"

    def as_json(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, "reasons": list(self.reasons),
                "profile": None if self.profile is None else self.profile.as_json(),
                "advice": None if self.advice is None else self.advice.as_json(),
                "expected": None if self.expected is None else {
                    k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self.expected).items()}}


def expected_gain(target: WatchTarget, live: LiveTraffic, advice: WatchAdvice, attainment_now: float) -> Expected:
    """GPUs saved (the advice needs fewer) or SLA regained (the running deployment misses it, the advice meets it),
    from the measured attainment now and the model's for the advice."""
    from tuner.deployment import parse_deployment
    from tuner.hardware import get_gpu
    from tuner.live._check import engine_from_flags
    from tuner.models import load_model
    from tuner.perf import RooflineModel, default_calibration

    engine, _ = engine_from_flags(target.serve_flags)
    running = parse_deployment(target.deployment, **engine)
    gpu = get_gpu(target.advice.hardware)
    perf = RooflineModel(load_model(target.advice.model_path), gpu, default_calibration(gpu.name))
    carries = predict_deployment(perf, running, live.workload, live.arrival_rps).saturated is None
    now = running.num_gpus
    parts = []
    if advice.num_gpus < now:
        parts.append(f"{now - advice.num_gpus} GPUs saved ({now} -> {advice.num_gpus})")
    elif advice.num_gpus > now:
        parts.append(f"{advice.num_gpus - now} more GPUs ({now} -> {advice.num_gpus})")
    if not math.isnan(attainment_now) and advice.predicted_attainment > attainment_now + 1e-9:
        parts.append(f"SLA attainment {attainment_now:.0%} measured -> {advice.predicted_attainment:.0%} predicted")
    if not carries:
        parts.append(f"the running {running.name} cannot carry {live.arrival_rps:.3g} req/s (the model's verdict)")
    return Expected(gpus_now=now, gpus_advised=advice.num_gpus, attainment_now=attainment_now,
                    attainment_advised=advice.predicted_attainment, current_carries=carries,
                    summary="; ".join(parts) or f"same GPUs ({now}); {advice.deployment} suits the new traffic")


def tick(target: WatchTarget, state: WatchState, increase: VllmCounters, window_s: float, sources: tuple[str, ...],
         *, advise: Callable[..., WatchAdvice] = advise_traffic,
         gain: Callable[..., Expected] = expected_gain) -> WatchTick:
    """Decide on one window's increase (`advise` and `gain` are the frontier adapter and the comparison with the
    running deployment; tests of the decisions alone pass cheaper ones).

    The baseline settles over `confirm_windows` windows with traffic (each replaces it: the first window of a
    watch, or the one after a change, is often partial); a window without requests breaks a pending change."""
    try:
        live = live_traffic(increase, window_s, sources)
    except TopotuneError as exc:
        return WatchTick("idle", replace(state, pending=0), message=exc.user_message())
    a = target.advice
    profile = TrafficProfile.of(live, max_ttft_ms=a.max_ttft_ms, max_itl_ms=a.max_itl_ms)
    t = target.thresholds
    settled = state.baseline is not None and state.baseline_windows >= t.confirm_windows
    reasons = drift_reasons(state.baseline, profile, t) if settled and state.baseline is not None else []
    below = not math.isnan(profile.attainment) and profile.attainment < t.min_attainment
    sla_alerted = state.sla_alerted and below  # re-armed once attainment recovers
    if below and not state.sla_alerted:
        reasons.append(f"SLA attainment {profile.attainment:.0%} < target {t.min_attainment:.0%}")
    if not settled:
        state = replace(state, baseline=profile, baseline_windows=state.baseline_windows + 1)
        if not reasons:
            return WatchTick("baseline", replace(state, pending=0, sla_alerted=sla_alerted), profile,
                             message=f"baseline ({state.baseline_windows} of {t.confirm_windows} windows): "
                                     f"{live.workload.describe()}")
    if not reasons:
        return WatchTick("steady", replace(state, pending=0, sla_alerted=sla_alerted), profile)
    pending = state.pending + 1
    if pending < t.confirm_windows:
        return WatchTick("pending", replace(state, pending=pending, sla_alerted=sla_alerted), profile,
                         tuple(reasons), message=f"changed for {pending} of {t.confirm_windows} windows")
    fired_state = WatchState(baseline=profile, baseline_windows=1, pending=0, sla_alerted=below)
    try:
        advice = advise(a, live.workload)
        expected = gain(target, live, advice, profile.attainment)
    except TopotuneError as exc:
        return WatchTick("advice", fired_state, profile, tuple(reasons),
                         message=f"no advice for the new traffic: {exc.user_message()}")
    return WatchTick("advice", fired_state, profile, tuple(reasons), advice, expected,
                     message=f"advice: {advice.deployment} on {advice.num_gpus} GPUs; {expected.summary}")


def state_json(state: WatchState) -> dict[str, object]:
    return {"baseline": None if state.baseline is None else state.baseline.as_json(),
            "baseline_windows": state.baseline_windows, "pending": state.pending,
            "sla_alerted": state.sla_alerted}


def state_from_json(data: dict[str, object] | None) -> WatchState:
    if not data:
        return WatchState()
    base = data.get("baseline")
    profile = None
    if isinstance(base, dict):
        profile = TrafficProfile(**{k: math.nan if v is None else float(v) for k, v in base.items()})
    return WatchState(baseline=profile, baseline_windows=int(data.get("baseline_windows", 0)),
                      pending=int(data.get("pending", 0)), sla_alerted=bool(data.get("sla_alerted", False)))
