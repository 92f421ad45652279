"""--all2all-backend: vLLM's default gathers every token on every EP rank, a routed backend sends a token only to
its experts' ranks; the model prices the one the plan launches, and the flag reaches vLLM only where it matters."""

from __future__ import annotations

import pytest

from tuner.backends.vllm import PlanSettings, build_plan, keep_names, pack_hosts, topology_flags
from tuner.deployment import parse_deployment
from tuner.errors import ConfigError, TopologyError
from tuner.hardware import GpuSpec
from tuner.models import ModelSpec
from tuner.perf import RooflineModel
from tuner.perf._comm import pass_comm
from tuner.perf._costs import instance_costs
from tuner.space import parse_space
from tuner.topology import Role, Topology

ROUTED = "flashinfer_nvlink_one_sided"


def test_the_gathered_volume_is_the_routed_one_times_the_fan_out(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    k = reference.moe.experts_per_token  # type: ignore[union-attr]
    for name in ("TP2DP4+EP", "TP4DP4+EP", "DEP16"):
        gathered = Topology.parse(name)
        routed = Topology.parse(name, all2all_backend=ROUTED)
        ep = gathered.ep_size
        costs = {t.all2all_backend: instance_costs(reference, gb300, t) for t in (gathered, routed)}
        # every other rank receives a token (allgather), against 1 - (1 - 1/EP)^k of them (routed)
        assert costs[ROUTED].a2a_remote_ranks / costs["allgather_reducescatter"].a2a_remote_ranks == pytest.approx(
            1 - (1 - 1 / ep) ** k)
        # the busiest rank's extra routed tokens cost a routed backend more; a gather is blind to routing
        comm = {b: [pass_comm(256, 10, 10, c, perf.calibration, load_factor=f).alltoall_s for f in (1.0, 1.5)]
                for b, c in costs.items()}
        assert comm[ROUTED][1] > comm[ROUTED][0]
        assert comm["allgather_reducescatter"][1] == comm["allgather_reducescatter"][0]
        assert comm["allgather_reducescatter"][0] > comm[ROUTED][0]
        # so decode steps are slower on vLLM's default, by their all-to-all alone
        steps = [perf.decode_step(t, 256, isl=8192, osl=1024) for t in (gathered, routed)]
        assert steps[0].comm_ms > steps[1].comm_ms
        assert (steps[0].memory_ms, steps[0].compute_ms) == (steps[1].memory_ms, steps[1].compute_ms)


def test_no_backend_without_ep_over_dp_ranks(reference: ModelSpec, gb300: GpuSpec) -> None:
    """TEP and plain DP have no all-to-all in vLLM: the field reads its default there, so equal layouts are equal
    and their figures do not move."""
    for name in ("TEP8", "TP8", "TP2DP4"):
        assert Topology.parse(name, all2all_backend=ROUTED) == Topology.parse(name)
        assert "--all2all-backend" not in topology_flags(Topology.parse(name, all2all_backend=ROUTED))
    perf = RooflineModel(reference, gb300)
    tep = [perf.predict(Topology.parse("TEP8", all2all_backend=b), Role.DECODE, isl=8192, osl=1024,
                        concurrency=64).output_tok_s_per_gpu for b in ("allgather_reducescatter", ROUTED)]
    assert tep[0] == tep[1]


def test_the_flag_label_dbo_and_errors(reference: ModelSpec) -> None:
    topo = Topology.parse("TP4DP4+EP", all2all_backend=ROUTED)
    flags = topology_flags(topo)
    assert flags[flags.index("--all2all-backend") + 1] == ROUTED and f"a2a={ROUTED}" in topo.label()
    assert "--all2all-backend" not in topology_flags(Topology.parse("TP4DP4+EP"))  # vLLM's default, not repeated
    dbo = topology_flags(Topology.parse("TP2DP4+EP", dbo=True))  # DBO without a backend: DeepEP low latency
    assert "--enable-dbo" in dbo and dbo[dbo.index("--all2all-backend") + 1] == "deepep_low_latency"
    with pytest.raises(TopologyError) as refused:
        Topology.parse("TP2DP4+EP", dbo=True, all2all_backend=ROUTED).check(reference)
    assert refused.value.field == "all2all-backend" and "deepep" in refused.value.fix
    with pytest.raises(ConfigError) as err:
        Topology.create(tp=2, dp=4, ep=True, all2all_backend="pplx")  # removed in vLLM 0.32
    assert err.value.field == "all2all-backend" and "allgather_reducescatter" in err.value.fix
    with pytest.raises(ConfigError) as err:  # refused where no all-to-all runs too, not dropped as unused
        Topology.create(tp=8, all2all_backend="pplx")
    assert err.value.field == "all2all-backend"


def test_an_older_vllm_is_refused_naming_the_version() -> None:
    dep = parse_deployment("1P:TP4DP2+EP,1D:DEP8", all2all_backend=ROUTED)
    settings = dict(model_path="/m", served_model_name="m", multi_node_nvlink=True)
    plan = build_plan(dep, pack_hosts(dep, 4), PlanSettings(**settings, vllm_version="0.26.1"), resolve=keep_names)
    assert all(p.argv[p.argv.index("--all2all-backend") + 1] == ROUTED for p in plan.servers)
    with pytest.raises(ConfigError) as err:
        build_plan(dep, pack_hosts(dep, 4), PlanSettings(**settings, vllm_version="0.20.0"), resolve=keep_names)
    assert err.value.field == "all2all_backend" and ">= 0.21.0" in err.value.fix


def test_a_space_sets_it_or_searches_it() -> None:
    """One backend is a setting of every EP-over-DP layout (no trial parameter, so studies and samplers see the
    same parameters as before); two are a knob."""
    text = """
name: a2a
cluster: {{gpu: gb300, num_gpus: 16}}
workload: {{isl: 2048, osl: 1024}}
phases:
  decode: {{tp: [4, 8], dp: [1, 2], ep: [false, true], max_num_seqs: [256], concurrency: [64],
           all2all_backend: {backends}}}
"""
    fixed = parse_space(text.format(backends=f"[{ROUTED}]"))
    assert "all2all_backend" not in fixed.param_choices("decode")
    params = {k: v[0] for k, v in fixed.param_choices("decode").items()}
    assert fixed.topology("decode", {**params, "tp": 4, "dp": 2, "ep": True}).all2all_backend == ROUTED
    assert fixed.topology("decode", {**params, "tp": 8, "dp": 1, "ep": True}).all2all_backend == (
        "allgather_reducescatter")  # TEP8: no all-to-all
    knob = parse_space(text.format(backends=f"[allgather_reducescatter, {ROUTED}]"))
    assert knob.param_choices("decode")["all2all_backend"] == ["allgather_reducescatter", ROUTED]
    topo = knob.topology("decode", {**params, "tp": 4, "dp": 2, "ep": True, "all2all_backend": ROUTED})
    assert knob.params_of("decode", topo)["all2all_backend"] == ROUTED

