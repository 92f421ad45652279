"""The calibration check of a live deployment: measured over predicted, the prediction the same one `simulate` makes
for each group at its share of the window's rate, and the window recorded in the cluster store."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
from _support.metrics_servers import MetricsPage, exposition, serving

from tuner.cli import main
from tuner.cluster import ClusterKey, ClusterStore
from tuner.deployment import parse_deployment
from tuner.errors import ConfigError
from tuner.hardware import get_gpu
from tuner.live import check_deployment, engine_from_flags, record_window
from tuner.models import load_model
from tuner.perf import RooflineModel, default_calibration, predict_traffic
from tuner.topology import Role
from tuner.workload import LiveTraffic, live_traffic, parse_exposition


@pytest.fixture(scope="module")
def live() -> LiveTraffic:
    before = parse_exposition(exposition("cpu_idle.txt"), "s")
    after = parse_exposition(exposition("cpu_after_40.txt"), "s")
    return live_traffic(after.minus(before, source="s"), 8.0, ("s",))


@pytest.fixture(scope="module")
def perf(models_dir: Path) -> RooflineModel:
    gpu = get_gpu("gb300")
    return RooflineModel(load_model(models_dir / "llama-3.1-70b"), gpu, default_calibration(gpu.name))


def test_serve_flags_set_the_engine_fields_and_say_what_they_ignore() -> None:
    engine, ignored = engine_from_flags("--max-num-seqs 64 --port 8000 --enforce-eager --gpu-memory-utilization=0.8 "
                                        "--kv-cache-dtype fp8")
    assert engine == {"max_num_seqs": "64", "gpu_memory_utilization": "0.8", "kv_cache_dtype": "fp8"}
    assert ignored == ["--port", "--enforce-eager"]
    with pytest.raises(ConfigError, match="needs a value"):
        engine_from_flags("--max-num-seqs")
    assert parse_deployment("2x:TP4", **engine).groups[0].topology.max_num_seqs == 64



def test_every_engine_knob_is_read_back_from_the_flags_a_plan_prints() -> None:
    """The flags come from the knob registry: a DEP8 with every engine knob off its default, printed as KNOBS
    prints each, reads back to the same topology (EPLB's JSON flag and DBO's switch included)."""
    from tuner.live import SERVE_FLAGS
    from tuner.topology import KNOBS, knob_default

    engine_knobs = set(SERVE_FLAGS.values())
    assert engine_knobs == {n for n, k in KNOBS.items() if not k.layout and n != "mtp"}
    topo = parse_deployment("DEP8").groups[0].topology.model_copy(update={
        "gpu_memory_utilization": 0.85, "max_num_seqs": 96, "max_num_batched_tokens": 4096, "kv_cache_dtype": "fp8",
        "num_redundant_experts": 32, "max_cudagraph_capture_size": 512, "stream_interval": 4,
        "all2all_backend": "deepep_low_latency", "dbo": True})
    changed = {n for n in engine_knobs if getattr(topo, n) != knob_default(n)}
    assert changed == engine_knobs  # the test covers every knob the flags can set
    argv = [f for n in sorted(engine_knobs) for f in KNOBS[n].vllm_flags(getattr(topo, n), knob_default(n))]
    engine, ignored = engine_from_flags(shlex.join(["--port", "8000", *argv]))
    assert ignored == ["--port", "--enable-eplb"]
    assert parse_deployment("DEP8", **engine).groups[0].topology == topo


def test_dotted_aliased_and_negated_knob_flags() -> None:
    engine, _ = engine_from_flags("--eplb-config.num_redundant_experts 16 --enable-dbo --no-enable-dbo "
                                  "--all2all-backend=deepep_high_throughput")
    assert engine == {"num_redundant_experts": "16", "dbo": False, "all2all_backend": "deepep_high_throughput"}
    assert engine_from_flags("--num-redundant-experts 8")[0] == {"num_redundant_experts": "8"}
    with pytest.raises(ConfigError, match="needs a JSON object"):
        engine_from_flags("--eplb-config 32")

def test_aggregated_replicas_each_get_their_share_of_the_rate(perf: RooflineModel, live: LiveTraffic) -> None:
    plan = parse_deployment("2x:TP4")
    check = check_deployment(perf, plan, live)
    topo = plan.groups[0].topology
    alone = predict_traffic(perf, topo, Role.BOTH, live.workload.model_copy(
        update={"request_rates": (live.arrival_rps / 2,)}), replicas=2).points[0]
    assert check.prediction.ttft is not None and check.prediction.itl is not None
    assert check.prediction.ttft.mean_ms == pytest.approx(alone.ttft_ms_mean)
    assert check.prediction.itl.p99_ms == pytest.approx(alone.itl_ms_p99)
    assert check.factor("ttft") == pytest.approx(live.ttft.mean_ms / alone.ttft_ms_mean)
    assert live.request_itl is not None
    assert check.factor("itl") == pytest.approx(live.request_itl.mean_ms / alone.itl_ms_mean)
    assert check.factor("ttft", "p90") == pytest.approx(live.ttft.p90_ms / alone.ttft_ms_at("p90"))


def test_pd_ttft_adds_both_sides(perf: RooflineModel, live: LiveTraffic) -> None:
    check = check_deployment(perf, parse_deployment("1P:TP4,2D:TP4"), live)
    p, d = check.prediction.points[Role.PREFILL], check.prediction.points[Role.DECODE]
    assert check.prediction.ttft is not None and check.prediction.itl is not None
    assert check.prediction.ttft.mean_ms == pytest.approx(p.ttft_ms_mean + d.ttft_ms_mean)
    assert check.prediction.itl.mean_ms == pytest.approx(d.itl_ms_mean)
    assert d.offered_rps == pytest.approx(live.arrival_rps / 2)


def test_a_rate_the_deployment_cannot_carry_is_said(perf: RooflineModel, live: LiveTraffic) -> None:
    busy = dataclasses.replace(live, arrival_rps=1e5)
    check = check_deployment(perf, parse_deployment("TP4"), busy)
    assert check.prediction.ttft is None and "capacity" in (check.prediction.saturated or "")
    assert check.factor("ttft") is None


def test_the_window_is_recorded_as_one_instances_measured_run(perf: RooflineModel, live: LiveTraffic,
                                                              tmp_path: Path) -> None:
    store = ClusterStore(f"sqlite:///{tmp_path / 'c.db'}")
    key = ClusterKey.of(get_gpu("gb300"), "0.32.0")
    check = check_deployment(perf, parse_deployment("2x:TP4"), live)
    record_window(check, store, key, model_name="m", model_path="/m", label="w", at_s=1000.0)
    record_window(check, store, key, model_name="m", model_path="/m", label="w", at_s=1000.0)  # once per window
    (run,) = store.read_runs(key)
    assert run.study == "live:w" and run.trial == 1000 and run.role is Role.BOTH
    (point,) = run.points
    assert point.request_throughput_rps == pytest.approx(live.arrival_rps / 2)
    assert point.ttft_ms_mean == pytest.approx(live.ttft.mean_ms)
    assert run.workload.request_rates == (pytest.approx(live.arrival_rps / 2),)
    with pytest.raises(ConfigError, match="PD"):
        record_window(check_deployment(perf, parse_deployment("1P:TP4,1D:TP4"), live), store, key, model_name="m",
                      model_path="/m", label="w", at_s=1.0)


def test_live_check_cli(models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    with serving(MetricsPage(exposition("cpu_idle.txt"), exposition("cpu_after_40.txt"))) as url:
        code = main(["live-check", str(models_dir / "llama-3.1-70b"), "--deployment", "TP4",
                     "--serve-flags", "--max-num-seqs 64 --port 8000", "--from-metrics", url, "--window", "1s",
                     "--record", "--storage", db, "--vllm-version", "0.32.0", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["deployment"] == "TP4" and data["ignored_flags"] == ["--port"]
    assert data["factor"]["ttft"]["mean"] == pytest.approx(
        data["measured"]["ttft_ms"]["mean"] / data["predicted"]["ttft_ms"]["mean"], rel=1e-3)
    assert data["recorded"]["study"].startswith("live:TP4")
    assert len(ClusterStore(db).read_runs(ClusterKey.of(get_gpu("gb300"), "0.32.0"))) == 1
