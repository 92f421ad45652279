from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tuner.backends.vllm import topology_flags
from tuner.errors import ConfigError, TopologyError
from tuner.models import ModelSpec, load_model
from tuner.topology import Topology, enumerate_topologies


@pytest.mark.parametrize(("name", "tp", "dp", "ep"), [
    ("TP8", 8, 1, False), ("TEP8", 8, 1, True), ("DEP8", 1, 8, True), ("TP4DP4+EP", 4, 4, True),
    ("TP2DP4+EP", 2, 4, True), ("TP4DP2", 4, 2, False), ("DP2", 1, 2, False), ("tp8+ep", 8, 1, True),
])
def test_names_parse_and_print(name: str, tp: int, dp: int, ep: bool) -> None:
    topo = Topology.parse(name)
    assert (topo.tp, topo.dp, topo.ep) == (tp, dp, ep)
    assert Topology.parse(topo.name) == topo
    assert topo.num_gpus == tp * dp


def test_canonical_names() -> None:
    assert Topology(tp=8, ep=True).name == "TEP8"
    assert Topology(tp=1, dp=8, ep=True).name == "DEP8"
    assert Topology(tp=4, dp=4, ep=True).name == "TP4DP4+EP"


@pytest.mark.parametrize("bad", ["TP", "EP8", "TP0", "8", "TP4DP"])
def test_bad_names(bad: str) -> None:
    with pytest.raises(ConfigError):
        Topology.parse(bad)


def test_field_errors_name_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        Topology.create(gpu_memory_utilization=1.2)
    assert err.value.field == "gpu-memory-utilization"
    with pytest.raises(ConfigError) as err:
        Topology.create(gpu_memory_utilization=-0.1)
    assert "fraction" in str(err.value)


def test_validation_against_model(reference_model_path: Path, models_dir: Path) -> None:
    ref = load_model(reference_model_path)
    with pytest.raises(TopologyError, match="attention heads"):
        Topology(tp=3).check(ref)
    assert Topology(tp=1, ep=True) == Topology(tp=1)  # EP on one GPU is no EP: the same layout, and valid
    assert Topology.parse("TEP1").name == "TP1" and not Topology.parse("DEP1", dbo=False).ep
    Topology(tp=1, ep=True).check(ref)
    with pytest.raises(TopologyError, match="cluster has 8"):
        Topology(tp=4, dp=4).check(ref, cluster_gpus=8)
    # vLLM splits 512 experts over EP3 unevenly (171/171/170, determine_expert_map); EPLB needs E + R % EP == 0
    Topology(tp=1, dp=3, ep=True).check(ref)
    with pytest.raises(TopologyError, match="experts"):
        Topology(tp=1, dp=3, ep=True, num_redundant_experts=2).check(ref)
    Topology(tp=1, dp=3, ep=True, num_redundant_experts=1).check(ref)
    Topology(tp=4, dp=4, ep=True, mtp=3).check(ref, cluster_gpus=72)
    llama = load_model(models_dir / "llama-3.1-70b")
    with pytest.raises(TopologyError, match="dense"):
        Topology(tp=8, ep=True).check(llama)
    with pytest.raises(TopologyError, match="MTP"):
        Topology(tp=8, mtp=1).check(llama)
    with pytest.raises(TopologyError, match="KV heads"):
        Topology(tp=2).check(_with_kv(llama, 3))


def _with_kv(spec: ModelSpec, kv: int) -> ModelSpec:
    return dataclasses.replace(spec, attention=dataclasses.replace(spec.attention, num_kv_heads=kv, num_heads=6))


def test_vllm_flags() -> None:
    flags = topology_flags(Topology.parse("TP4DP4+EP", mtp=3, gpu_memory_utilization=0.92, max_num_seqs=256))
    assert flags[:5] == ["--tensor-parallel-size", "4", "--data-parallel-size", "4", "--enable-expert-parallel"]
    assert flags[5:7] == ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}']
    assert "--gpu-memory-utilization" in flags and flags[flags.index("--max-num-seqs") + 1] == "256"
    assert "--data-parallel-size" not in topology_flags(Topology(tp=8))


def test_enumeration_covers_campaign_topologies() -> None:
    shapes = set(enumerate_topologies(72))
    for name in ("TP8", "TEP8", "TP4DP2+EP", "TP2DP4+EP", "TP4DP4+EP", "DEP8"):
        t = Topology.parse(name)
        assert (t.tp, t.dp, t.ep) in shapes
    assert all(tp * dp <= 72 for tp, dp, _ in shapes)


def test_accepted_topologies_apply_an_engine_knob_where_it_exists_or_rule_out_the_rest(
        reference_model_path: Path) -> None:
    """A sweep's DBO choice applies to the layouts that have EP over DP ranks and leaves the others at its default;
    asked strictly (a user's `memory --sweep --enable-dbo`), only the layouts DBO runs on are listed, each with it."""
    from tuner.topology import accepted_topologies

    ref = load_model(reference_model_path)
    every = accepted_topologies(ref, 16)
    dbo = {"dbo": True, "all2all_backend": "deepep_low_latency"}
    sweep = accepted_topologies(ref, 16, **dbo)
    strict = accepted_topologies(ref, 16, knobs_where_they_apply=False, **dbo)
    assert [(t.tp, t.dp, t.ep) for t in sweep] == [(t.tp, t.dp, t.ep) for t in every]
    assert {t.dbo for t in sweep} == {True, False}
    assert all(t.dbo == (t.ep and t.dp > 1) for t in sweep)
    assert strict and all(t.dbo and t.ep and t.dp > 1 for t in strict)
    assert {t.name for t in strict} == {t.name for t in sweep if t.dbo}
