"""How far the model is from a running deployment: the latencies measured in a window against the prediction for
that deployment at that traffic, and the window as a measured run in the cluster store.

The prediction is the one `simulate` and `frontier` make (tuner.perf.predict_traffic, open loop at the window's
request rate, each instance of a group offered its share of it); a PD deployment's TTFT adds its prefill and
decode sides as `frontier` composes them.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass

from tuner.cluster import ClusterKey, ClusterStore, StoredRun
from tuner.deployment import Deployment, InstanceGroup
from tuner.errors import ConfigError
from tuner.metrics import PERCENTILES, ServingMetrics
from tuner.perf import RooflineModel, predict_traffic
from tuner.topology import KNOBS, Role, knob_default
from tuner.workload import LatencySummary, LiveTraffic, Workload

# The engine knobs a `vllm serve` command line sets, by the flag vLLM spells each with (tuner.topology.KNOBS: the
# flag and topotune's earlier spellings), so a knob is defined once; the parallel layout and MTP come from the
# deployment string.
_FROM_DEPLOYMENT = frozenset({"mtp"})
SERVE_FLAGS = {flag: name for name, knob in KNOBS.items() if not knob.layout and name not in _FROM_DEPLOYMENT
               for flag in (knob.flag, *knob.aliases)}
# A dotted flag is a key of a JSON flag (--eplb-config.num_redundant_experts 32 or --eplb-config
# '{"num_redundant_experts": 32}', as vLLM's FlexibleArgumentParser reads both): the JSON flag's keys that are knobs.
_JSON_FLAGS: dict[str, dict[str, str]] = {}
for _flag, _name in SERVE_FLAGS.items():
    if "." in _flag:
        _parent, _key = _flag.split(".", 1)
        _JSON_FLAGS.setdefault(_parent, {})[_key] = _name
# On/off knobs (--enable-dbo) take no value; --no-... turns them off (vLLM gives every bool field argparse's
# BooleanOptionalAction: vllm/engine/arg_utils.py get_kwargs).
_SWITCHES = {flag: name for flag, name in SERVE_FLAGS.items() if isinstance(knob_default(name), bool)}
_SWITCHES_OFF = {f"--no-{flag[2:]}": name for flag, name in _SWITCHES.items()}


def engine_from_flags(serve_flags: str) -> tuple[dict[str, object], list[str]]:
    """The Topology fields a `vllm serve` command line sets (--max-num-seqs 128 or --max-num-seqs=128, --enable-dbo),
    and the flags the model does not read (said, not refused: --port, --served-model-name, ...)."""
    try:
        argv = shlex.split(serve_flags)
    except ValueError as exc:
        raise ConfigError(f"cannot split the serve flags ({exc})", field="--serve-flags",
                          fix="quote them as one shell string, e.g. '--max-num-seqs 128'") from None
    engine: dict[str, object] = {}
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        flag, _, inline = argv[i].partition("=")
        i += 1
        if not inline and (flag in _SWITCHES or flag in _SWITCHES_OFF):
            engine[_SWITCHES.get(flag) or _SWITCHES_OFF[flag]] = flag in _SWITCHES
            continue
        takes_value = not inline and i < len(argv) and not argv[i].startswith("--")
        value = inline or (argv[i] if takes_value else "")
        if takes_value:
            i += 1
        if flag in SERVE_FLAGS or flag in _JSON_FLAGS:
            if not value:
                raise ConfigError(f"{flag} needs a value", field="--serve-flags", fix=f"write e.g. {flag} 128")
            engine.update(_json_knobs(flag, value) if flag in _JSON_FLAGS else {SERVE_FLAGS[flag]: value})
        elif flag.startswith("--"):
            ignored.append(flag)
    return engine, ignored


def _json_knobs(flag: str, value: str) -> dict[str, object]:
    """The knobs a JSON flag's object sets (its other keys are not knobs)."""
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ConfigError(f"{flag} needs a JSON object, got {value!r}", field="--serve-flags",
                          fix=f"""write e.g. {flag} '{{"{next(iter(_JSON_FLAGS[flag]))}": 32}}'""")
    return {name: data[key] for key, name in _JSON_FLAGS[flag].items() if key in data}


@dataclass(frozen=True)
class DeploymentPrediction:
    """What the model predicts for a deployment at a traffic: None latencies when a group saturates."""

    ttft: LatencySummary | None
    itl: LatencySummary | None
    points: dict[Role, ServingMetrics]  # one instance of each group, at its share of the rate
    saturated: str | None = None


def _per_instance(workload: Workload, rate: float, count: int) -> Workload:
    return workload.model_copy(update={"arrival": "poisson", "request_rates": (rate / count,)})


def _latencies(points: list[ServingMetrics], *, ttft: bool) -> LatencySummary:
    if ttft:
        return LatencySummary(sum(p.ttft_ms_mean for p in points), *(sum(p.ttft_ms_at(q) for p in points)
                                                                for q in PERCENTILES))
    p = points[-1]
    return LatencySummary(p.itl_ms_mean, p.itl_ms_p50, p.itl_ms_at("p90"), p.itl_ms_p99)


def predict_deployment(perf: RooflineModel, deployment: Deployment, workload: Workload, rate_rps: float, *,
                       cache_aware: bool = True) -> DeploymentPrediction:
    """Every group at its share of `rate_rps` (PD: TTFT = prefill's + decode's, as `frontier` composes it; ITL is
    the decode side's)."""
    points: dict[Role, ServingMetrics] = {}
    for group in deployment.groups_in_launch_order:
        curve = predict_traffic(perf, group.topology, group.role, _per_instance(workload, rate_rps, group.count),
                                cache_aware=cache_aware, replicas=group.count)
        if not curve.points:
            s = curve.saturated[0]
            return DeploymentPrediction(None, None, points, saturated=(
                f"{group.count} x {group.topology.name} {group.role.value}: {s.describe()}"))
        points[group.role] = curve.points[0]
    ordered = [points[g.role] for g in deployment.groups_in_launch_order]
    return DeploymentPrediction(_latencies(ordered, ttft=True), _latencies(ordered, ttft=False), points)


@dataclass(frozen=True)
class CalibrationCheck:
    """Measured over predicted for one window of one deployment (1.0: the model is right; 2.0: the deployment is
    twice as slow as predicted). Means are exact in vLLM's histograms; percentiles are read at bucket resolution."""

    deployment: Deployment
    live: LiveTraffic
    prediction: DeploymentPrediction
    measured_ttft: LatencySummary
    measured_itl: LatencySummary
    itl_source: str  # which vLLM histogram the measured ITL is

    def factor(self, which: str, stat: str = "mean") -> float | None:
        predicted = self.prediction.ttft if which == "ttft" else self.prediction.itl
        measured = self.measured_ttft if which == "ttft" else self.measured_itl
        if predicted is None:
            return None
        p, m = (predicted.mean_ms, measured.mean_ms) if stat == "mean" else (predicted.at(stat), measured.at(stat))
        return m / p if p > 0 and math.isfinite(m) else None

    def as_json(self) -> dict[str, object]:
        p = self.prediction
        return {
            "deployment": self.deployment.name, "num_gpus": self.deployment.num_gpus,
            "window": self.live.summary_json(), "saturated": p.saturated, "itl_source": self.itl_source,
            "measured": {"ttft_ms": self.measured_ttft.as_json(), "itl_ms": self.measured_itl.as_json()},
            "predicted": {"ttft_ms": None if p.ttft is None else p.ttft.as_json(),
                          "itl_ms": None if p.itl is None else p.itl.as_json()},
            "factor": {w: {s: _round(self.factor(w, s)) for s in ("mean", *PERCENTILES)} for w in ("ttft", "itl")},
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def check_deployment(perf: RooflineModel, deployment: Deployment, live: LiveTraffic, *,
                     cache_aware: bool = True) -> CalibrationCheck:
    """The window's measured TTFT and ITL against the prediction for `deployment` at the window's traffic."""
    prediction = predict_deployment(perf, deployment, live.workload, live.arrival_rps, cache_aware=cache_aware)
    itl, source = ((live.request_itl, "vllm:request_time_per_output_token_seconds (per request mean)")
                   if live.request_itl is not None else (live.itl, "vllm:inter_token_latency_seconds (every token)"))
    return CalibrationCheck(deployment, live, prediction, live.ttft, itl, source)


def measured_point(check: CalibrationCheck, group: InstanceGroup) -> ServingMetrics:
    """One instance's share of the window as a measured point (what a trial stores): its share of the rate, the
    measured latencies; the KV-cache capacity is the model's (vLLM's metrics do not export it per request)."""
    live, w = check.live, check.live.workload
    rate = live.arrival_rps / group.count
    isl, osl = w.isl, w.osl
    itl = check.measured_itl
    latency_s = (check.measured_ttft.mean_ms + max(0, osl - 1) * itl.mean_ms) / 1000
    predicted = check.prediction.points.get(group.role)
    running = rate * latency_s  # Little's law
    return ServingMetrics(
        concurrency=max(1, round(running)), num_gpus=group.topology.num_gpus, isl=isl, osl=osl,
        total_tok_s=rate * (isl + osl), output_tok_s=rate * osl,
        total_tok_s_per_gpu=rate * (isl + osl) / group.topology.num_gpus,
        output_tok_s_per_gpu=rate * osl / group.topology.num_gpus,
        tok_s_per_user=1000 / itl.mean_ms if itl.mean_ms > 0 else 0.0,
        ttft_ms_mean=check.measured_ttft.mean_ms, ttft_ms_p50=check.measured_ttft.p50_ms,
        ttft_ms_p90=check.measured_ttft.p90_ms, ttft_ms_p99=check.measured_ttft.p99_ms,
        itl_ms_mean=itl.mean_ms, itl_ms_p50=itl.p50_ms, itl_ms_p90=itl.p90_ms, itl_ms_p99=itl.p99_ms,
        offered_rps=rate, prefix_hit_share=live.prefix_hit_share, request_throughput_rps=rate,
        max_concurrency=predicted.max_concurrency if predicted is not None else 0.0, running_requests=running,
        error_rate=min(1.0, live.failed / live.requests) if live.requests else 0.0)


def record_window(check: CalibrationCheck, store: ClusterStore, key: ClusterKey, *, model_name: str,
                  model_path: str, label: str, at_s: float) -> StoredRun:
    """The window as a measured run of the cluster store (study `live:<label>`, trial = the window's end in
    seconds: a window is recorded once). One group only: a PD window measures the pair end to end, not each
    side, and the store keeps one instance's points."""
    if len(check.deployment.groups) != 1:
        raise ConfigError("a PD deployment's window measures prefill and decode together; the store keeps one "
                          "role's instance", field="--record", fix="record an aggregated deployment's window, or "
                                                                   "drop --record")
    group = check.deployment.groups[0]
    point = measured_point(check, group)
    run = StoredRun(model_name=model_name, model_path=model_path, role=group.role, topology=group.topology,
                    workload=_per_instance(check.live.workload, check.live.arrival_rps, group.count),
                    points=(point,), study=f"live:{label}"[:512], trial=int(at_s))
    store.record_run(key, run)
    return run

