"""--stream-interval: the API server streams a request's tokens N at a time, so the streamed share of the
per-request host cost is paid once per N tokens; the flag reaches vLLM only where the targeted version has it."""

from __future__ import annotations

import pytest

from tuner.backends.vllm import PlanSettings, build_plan, keep_names, pack_hosts, topology_flags
from tuner.deployment import parse_deployment
from tuner.errors import ConfigError
from tuner.hardware import GpuSpec
from tuner.models import ModelSpec
from tuner.perf import Calibration, RooflineModel
from tuner.perf._steps import request_step_us
from tuner.topology import Role, Topology


def test_the_streamed_share_is_paid_once_per_interval(reference: ModelSpec, gb300: GpuSpec) -> None:
    cal = Calibration(request_step_us=60.0, streamed_request_share=0.4)
    perf = RooflineModel(reference, gb300, cal)
    every = perf.decode_step(Topology.parse("DEP16"), 512, isl=2000, osl=2000)
    fifty = perf.decode_step(Topology.parse("DEP16", stream_interval=50), 512, isl=2000, osl=2000)
    per_request_us = 60.0 * (1 - 0.4 + 0.4 / 50)  # 36.48 us: the engine part stays, the streamed part / 50
    assert request_step_us(cal, 50) == pytest.approx(per_request_us)
    assert fifty.requests_ms == pytest.approx(every.requests_ms * per_request_us / 60.0)
    assert every.requests_ms == pytest.approx(60.0e-3 * every.requests_per_rank)
    # nothing else in the step moves: the interval is host work, not GPU work
    assert (fifty.memory_ms, fifty.compute_ms, fifty.comm_ms, fifty.overhead_ms) == (
        every.memory_ms, every.compute_ms, every.comm_ms, every.overhead_ms)
    mixed = [perf.predict(Topology.parse("TEP8", stream_interval=n), Role.BOTH, isl=2000, osl=500,
                          concurrency=256).output_tok_s_per_gpu for n in (1, 10)]
    assert mixed[1] > mixed[0]  # aggregated steps carry the same cost


def test_the_flag_and_label_and_its_error() -> None:
    topo = Topology.parse("DEP8", stream_interval=50)
    flags = topology_flags(topo)
    assert flags[flags.index("--stream-interval") + 1] == "50"
    assert "stream=50" in topo.label()
    assert "--stream-interval" not in topology_flags(Topology.parse("DEP8"))  # vLLM's default, not repeated
    with pytest.raises(ConfigError) as err:
        Topology.create(tp=8, stream_interval=0)
    assert err.value.field == "stream-interval" and "1 streams every token" in err.value.fix


def test_an_older_vllm_is_refused_naming_the_version() -> None:
    dep = parse_deployment("1P:TP4DP2+EP,1D:DEP8", stream_interval=50)
    settings = dict(model_path="/m", served_model_name="m", multi_node_nvlink=True)
    plan = build_plan(dep, pack_hosts(dep, 4), PlanSettings(**settings, vllm_version="0.12.0"), resolve=keep_names)
    assert all(p.argv[p.argv.index("--stream-interval") + 1] == "50" for p in plan.servers)
    with pytest.raises(ConfigError) as err:
        build_plan(dep, pack_hosts(dep, 4), PlanSettings(**settings, vllm_version="0.11.0"), resolve=keep_names)
    assert err.value.field == "stream_interval" and ">= 0.12.0" in err.value.fix


def test_a_space_searches_it_and_every_config_carries_it(tmp_path, reference_model_path) -> None:  # type: ignore[no-untyped-def]
    """A knob the space varies is a trial parameter at every value, 1 included: the guided sampler's candidates
    and repairs (SearchSpace.params_of) and the stored trials agree."""
    import optuna

    from tuner.backends import SimulatedBackend
    from tuner.executors import LocalExecutor
    from tuner.space import parse_space
    from tuner.study import Campaign, TuneOptions, open_storage

    space = parse_space("""
name: stream
cluster: {gpu: gb300, num_gpus: 16}
workload: {isl: 2048, osl: 1024}
phases:
  decode: {tp: [4, 8], dp: [1, 2], ep: [true], max_num_seqs: [256], concurrency: [64, 256],
           stream_interval: [1, 50]}
""")
    names = space.param_choices("decode")
    assert names["stream_interval"] == [1, 50]
    plain = space.topology("decode", {**{k: v[0] for k, v in names.items()}})
    assert space.params_of("decode", plain)["stream_interval"] == 1  # present at the default too
    assert space.params_of("decode", plain) == {k: v[0] for k, v in names.items()}  # the inverse of topology()
    url = f"sqlite:///{tmp_path / 's.db'}"
    campaign = Campaign(model_path=str(reference_model_path), space=space, backend_name="simulated",
                        executor=LocalExecutor(SimulatedBackend(), max_parallel=1), storage_url=url,
                        options=TuneOptions(trials=8, sampler="auto"), artifacts_dir=tmp_path / "a",
                        phases=("decode",))
    result = campaign.run()
    study = optuna.load_study(study_name=campaign.phase_study_name("decode"), storage=open_storage(url))
    assert len({t.params["stream_interval"] for t in study.trials if t.params}) == 2
    assert all(set(t.params) == set(names) for t in study.trials if t.params)
    completed = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert completed >= 4  # one trial per configuration, its load levels inside it
    points = result.phases["decode"].points  # every measured point of the phase (each trial's load levels)
    assert len(points) == 2 * completed  # both concurrencies of every completed trial
    assert {p.metrics.concurrency for p in points} == {64, 256}
