"""Issue 11's launch-plan defects 1-8, one test (or more) each, on the plans `topotune plan`, trials and
exported recipes produce. Each would have failed before the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuner.backends import HostAssignment, TrialRequest
from tuner.backends.vllm import (
    LaunchPlan,
    PlanSettings,
    VllmBackend,
    VllmBackendSettings,
    build_plan,
    keep_names,
    launch_rules,
    pack_hosts,
    place_instances,
    resolve_address,
)
from tuner.backends.vllm._versions import TABLE, VllmVersion, table_markdown
from tuner.deployment import Deployment, parse_deployment
from tuner.errors import ConfigError, TopologyError
from tuner.executors._placement import instance_shapes, spread_ok
from tuner.export import RecipeContext, export_deployment
from tuner.frontier import ComposedPoint
from tuner.memory import MemoryInputs, compute_memory
from tuner.topology import Role, Topology
from tuner.workload import Workload, served_context_tokens

GB300 = dict(model_path="/m", served_model_name="m", multi_node_nvlink=True)


def plan_of(dep: Deployment, settings: PlanSettings | None = None, gpus_per_host: int = 4) -> LaunchPlan:
    return build_plan(dep, pack_hosts(dep, gpus_per_host), settings or PlanSettings(**GB300), resolve=keep_names)


def arg(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def by_role(plan: LaunchPlan, role: str) -> list:
    return [p for p in plan.servers if p.role == role]


# -- 1. MTP on both PD sides -----------------------------------------------------------------------------

def test_1_prefill_gets_the_decode_speculative_config_in_plan_trial_and_recipes(tmp_path: Path) -> None:
    plan = plan_of(parse_deployment("1P:TP4DP2+EP,1D:TEP8", mtp=3))
    spec = {arg(p.argv, "--speculative-config") for p in plan.servers}
    assert spec == {'{"method": "mtp", "num_speculative_tokens": 3}'}  # prefill and decode, every node
    # a composed front point (prefill measured without MTP) launches its prefill with the decode's depth
    point = Deployment.disaggregated(Topology.parse("TP2DP4+EP"), 3, Topology.parse("TEP8", mtp=2), 1)
    assert {g.topology.mtp for g in point.groups} == {2}
    assert ComposedPoint.__dataclass_fields__["prefill_topology"]  # composition builds through Deployment too
    ctx = RecipeContext(model_path="/m", model_name="m", gpu="gb300", gpus_per_host=4, isl=8192, osl=1024)
    srt = yaml.safe_load(export_deployment(point, "srt-slurm", ctx))["backend"]["vllm_config"]
    assert srt["prefill"]["speculative-config"] == srt["decode"]["speculative-config"] == {
        "method": "mtp", "num_speculative_tokens": 2}
    script = export_deployment(point, "vllm", ctx)
    assert script.count('"num_speculative_tokens": 2') == 3 * 2 + 2  # 3 prefill x 2 hosts, 1 decode x 2 hosts


# -- 2. hybrid PD settings per version --------------------------------------------------------------------

def test_2_hybrid_pd_sets_the_ds_conv_layout_and_what_the_version_needs() -> None:
    dep = parse_deployment("1P:TEP4,1D:TEP4", mtp=1)
    new = plan_of(dep, PlanSettings(**GB300, model_is_hybrid=True, vllm_version="0.32.0"))
    assert all(p.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS" for p in new.servers)
    assert all("--no-disable-hybrid-kv-cache-manager" not in p.argv for p in new.servers)
    old = plan_of(dep, PlanSettings(**GB300, model_is_hybrid=True, vllm_version="0.20.2rc1"))
    assert all("--no-disable-hybrid-kv-cache-manager" in p.argv for p in old.servers)
    plain = plan_of(dep, PlanSettings(**GB300, model_is_hybrid=False))
    assert all("VLLM_SSM_CONV_STATE_LAYOUT" not in p.env for p in plain.servers)
    # a phase trial of a hybrid model (no connector) needs none of it
    alone = plan_of(Deployment.single(Topology.parse("TEP4", role=Role.DECODE)),
                    PlanSettings(**GB300, model_is_hybrid=True))
    assert "VLLM_SSM_CONV_STATE_LAYOUT" not in alone.servers[0].env


def test_2_the_backend_reads_hybrid_from_the_model_and_the_version_from_the_request(
        reference_model_path: Path) -> None:
    backend = VllmBackend(VllmBackendSettings(vllm_argv=("/nonexistent/vllm",)))
    dep = parse_deployment("1P:TEP4,1D:TEP4")
    request = TrialRequest(trial_id="t", model_path=str(reference_model_path), gpu="gb300", deployment=dep,
                           workload=Workload(isl=1024, osl=128, concurrency=(1,)), vllm_version="0.22.0",
                           hosts=(HostAssignment(address="127.0.0.1", gpu_ids=(0, 1, 2, 3)),
                                  HostAssignment(address="127.0.0.2", gpu_ids=(0, 1, 2, 3))))
    plan = backend.plan(request, port_base=9000)
    assert all(p.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS" for p in plan.servers)
    assert all("--no-disable-hybrid-kv-cache-manager" in p.argv for p in plan.servers)
    assert all(p.env["UCX_CUDA_IPC_ENABLE_MNNVL"] == "y" for p in plan.servers)  # GB300: multi-node NVLink


# -- 3. TP groups within one host or over whole hosts -------------------------------------------------------

def test_3_tep8_after_three_tp2_prefills_spans_two_whole_hosts() -> None:
    plan = plan_of(parse_deployment("3P:TP2,1D:TEP8"))
    decode = by_role(plan, "decode")
    assert [len(p.env["CUDA_VISIBLE_DEVICES"].split(",")) for p in decode] == [4, 4]
    assert {arg(p.argv, "--nnodes") for p in decode} == {"2"}
    assert len({p.host for p in decode} & {p.host for p in by_role(plan, "prefill")}) == 0
    assert all(len(p.env["CUDA_VISIBLE_DEVICES"].split(",")) == 2 for p in by_role(plan, "prefill"))


def test_3_a_tp4_decode_is_not_split_two_plus_two() -> None:
    plan = plan_of(parse_deployment("1P:TP2,1D:TP4"))
    (decode,) = by_role(plan, "decode")
    assert decode.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and "--nnodes" not in decode.argv


def test_3_uneven_splits_are_refused_with_the_reason_locally_and_on_ray() -> None:
    dep = parse_deployment("3P:TP2,1D:TEP8")
    uneven = [HostAssignment(address=a, gpu_ids=ids) for a, ids in  # the TEP8 as 2/4/2
              [("h0", (0, 1, 2, 3)), ("h1", (0, 1)), ("h1", (2, 3)), ("h2", (0, 1, 2, 3)), ("h3", (0, 1))]]
    with pytest.raises(TopologyError, match=r"unevenly \(\[2, 4, 2\] devices\)"):
        build_plan(dep, uneven, PlanSettings(**GB300), resolve=keep_names)
    shape = instance_shapes(Deployment.single(Topology.parse("TP4DP3")), gpus_per_host=8)[0]
    assert spread_ok(["a"] * 8 + ["b"] * 4, shape)
    assert not spread_ok(["a"] * 6 + ["b"] * 6, shape)  # a TP4 group would straddle: Ray re-places


def test_3_tp_over_hosts_combined_with_dp_as_srt_slurm_does() -> None:
    plan = plan_of(Deployment.single(Topology.parse("TP8DP2", role=Role.DECODE)))
    assert len(plan.servers) == 4
    head = plan.servers[0].host
    for rank, proc in enumerate(plan.servers):
        assert arg(proc.argv, "--nnodes") == "4" and arg(proc.argv, "--node-rank") == str(rank)
        assert arg(proc.argv, "--data-parallel-size") == "2" and arg(proc.argv, "--data-parallel-address") == head
        assert ("--headless" in proc.argv) == (rank > 0)
    assert "--data-parallel-size-local" not in plan.servers[0].argv  # vLLM infers it from --nnodes
    with pytest.raises(TopologyError, match="cannot span whole hosts"):
        pack_hosts(Deployment.single(Topology.parse("TP6")), 4)


# -- 4. no front that cannot run --------------------------------------------------------------------------

def test_4_no_dynamo_front_is_offered() -> None:
    assert "front" not in PlanSettings.model_fields and "dynamo_python" not in PlanSettings.model_fields
    plan = plan_of(parse_deployment("1P:TP4,1D:TP4"))
    assert plan.fronts[0].argv[0] == "vllm-router"
    assert not any("dynamo" in " ".join(p.argv) for p in plan.processes)


# -- 5. block size and TP pairing -------------------------------------------------------------------------

def test_5_block_size_is_pinned_equal_on_both_pd_sides() -> None:
    plan = plan_of(parse_deployment("1P:TP2DP4+EP,1D:TEP8", mtp=3), PlanSettings(**GB300, model_is_hybrid=True))
    assert {arg(p.argv, "--block-size") for p in plan.servers} == {"64"}
    cpu = build_plan(parse_deployment("1P:TP1,1D:TP1"), [HostAssignment(address="127.0.0.1", gpu_ids=(0, 1))],
                     PlanSettings(model_path="/m", device="cpu", pd_block_size=128))
    assert {arg(p.argv, "--block-size") for p in cpu.servers} == {"128"}


def test_5_hybrid_pairs_across_tp_where_the_version_allows_and_are_refused_naming_it() -> None:
    dep = parse_deployment("1P:TP4DP2+EP,1D:TEP8", mtp=3)
    # (the model is unreadable here: only the TP and version rules apply)
    assert plan_of(dep, PlanSettings(**GB300, model_is_hybrid=True, vllm_version="0.26.1rc1")).servers
    with pytest.raises(TopologyError, match=r"vLLM 0\.19\.1 cannot .*target vLLM >= 0\.20\.0"):
        plan_of(dep, PlanSettings(**GB300, model_is_hybrid=True, vllm_version="0.19.1"))
    assert plan_of(dep, PlanSettings(**GB300, model_is_hybrid=False, vllm_version="0.19.1")).servers


def test_5_composition_and_warm_start_pair_the_campaigns_own_front(reference_model_path: Path) -> None:
    from tuner.models import load_model
    from tuner.space import parse_space
    from tuner.study._campaign import pairing_limits_tp, pd_pairing

    model = load_model(reference_model_path)
    text = ("name: x\ncluster: {gpu: gb300, num_gpus: 72%s}\nworkload: {isl: 8192, osl: 1024}\n"
            "phases: {decode: {tp: [4, 8], concurrency: [1]}}\n")
    # 0.32: hetero TP transfers, but the TP-dependent hybrid block size meets prefix caching: equal TP only
    newest = pd_pairing(parse_space(text % ""), model)
    assert newest(Topology(tp=4), Topology(tp=4)) is None
    assert newest(Topology(tp=4), Topology(tp=8)).startswith("hybrid_prefix_caching_blocks")
    assert pairing_limits_tp(parse_space(text % ""), model)
    # TP1 pairs with TP2 (equal blocks), neither with TP8: some pairs refused is enough to seed equal TPs
    assert newest(Topology(tp=1, mtp=3), Topology(tp=2, mtp=3)) is None
    assert pairing_limits_tp(parse_space(text.replace("tp: [4, 8]", "tp: [1, 2, 8]") % ""), model)
    assert newest(Topology(tp=4), Topology(tp=8, mtp=1)).startswith("speculative_config")
    # 0.21: prefix-caching check not there yet, but no GDN transfer at all
    assert pd_pairing(parse_space(text % ", vllm_version: 0.21.0"), model)(
        Topology(tp=4), Topology(tp=4)).startswith("hybrid_family")
    assert pd_pairing(parse_space(text % ", vllm_version: 0.19.1"), model)(
        Topology(tp=4), Topology(tp=8)).startswith("hybrid_hetero_tp_version")


# -- 6. context headroom ----------------------------------------------------------------------------------

def test_6_max_model_len_has_headroom_and_the_memory_model_accounts_for_it(reference_model_path: Path) -> None:
    assert served_context_tokens(8192, 1024) == 9728 > 9216
    assert served_context_tokens(100, 28) == 512  # at least 256 tokens of headroom, whole 256s
    backend = VllmBackend(VllmBackendSettings(vllm_argv=("/nonexistent/vllm",), vllm_version="0.32.0"))
    request = TrialRequest(trial_id="t", model_path="/m", gpu="gb300", deployment=parse_deployment("TP1"),
                           workload=Workload(isl=8192, osl=1024, concurrency=(1,)))
    assert arg(backend.plan(request).servers[0].argv, "--max-model-len") == "9728"
    from tuner.hardware import get_gpu
    from tuner.models import load_model

    breakdown = compute_memory(load_model(reference_model_path), get_gpu("gb300"), Topology.parse("TEP8"),
                               MemoryInputs(isl=8192, osl=1024))
    assert breakdown.max_model_len == 9728


# -- 7. CUDA-graph capture sizes --------------------------------------------------------------------------

def test_7_capture_sizes_cover_decode_batch_times_one_plus_mtp_and_are_a_knob() -> None:
    topo = Topology.parse("TEP8", mtp=3, max_num_seqs=256, role=Role.DECODE)
    plan = plan_of(Deployment.single(topo))
    assert {arg(p.argv, "--max-cudagraph-capture-size") for p in plan.servers} == {"1024"}  # 256 x 4 > 512
    assert Topology.parse("TEP8", max_num_seqs=4096, mtp=3).cudagraph_capture_tokens == 8192  # batched cap
    assert Topology.parse("TEP8", role=Role.PREFILL).cudagraph_capture_tokens is None  # vLLM's default
    legacy = plan_of(Deployment.single(topo), PlanSettings(**GB300, vllm_version="0.10.2"))
    assert arg(legacy.servers[0].argv, "--cuda-graph-sizes") == "1024"
    from tuner.space import parse_space

    space = parse_space("name: x\ncluster: {gpu: gb300, num_gpus: 8}\nworkload: {isl: 1024, osl: 128}\n"
                        "phases: {decode: {tp: [8], max_cudagraph_capture_size: [auto, 512], concurrency: [1]}}\n")
    assert space.param_choices("decode")["max_cudagraph_capture_size"] == ["auto", 512]
    params = {"tp": 8, "dp": 1, "ep": False, "mtp": 0, "gpu_memory_utilization": 0.9, "max_num_seqs": 256,
              "max_num_batched_tokens": 8192}
    assert space.topology("decode", {**params, "max_cudagraph_capture_size": 512}).cudagraph_capture_tokens == 512
    assert space.topology("decode", {**params, "max_cudagraph_capture_size": "auto"}).cudagraph_capture_tokens == 256


# -- 8. multi-host hygiene --------------------------------------------------------------------------------

def test_8_ucx_vllm_port_resolved_addresses_and_warmup() -> None:
    plan = plan_of(parse_deployment("3P:TP2,1D:TEP8", mtp=1))
    assert all(p.env["UCX_CUDA_IPC_ENABLE_MNNVL"] == "y" and p.env["UCX_TLS"] == "cuda_copy,cuda_ipc,tcp"
               for p in plan.servers)
    shared = [p for p in plan.servers if p.host == "host0"]
    assert len(shared) == 2 and len({p.env["VLLM_PORT"] for p in shared}) == 2
    dep = parse_deployment("1P:TP4,1D:TP4")
    named = build_plan(dep, (HostAssignment(address="localhost", gpu_ids=(0, 1, 2, 3, 4, 5, 6, 7)),),
                       PlanSettings(model_path="/m"))
    assert {p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] for p in named.servers} == {"127.0.0.1"}
    assert resolve_address("192.0.2.7") == "192.0.2.7"
    with pytest.raises(ConfigError, match="does not resolve"):
        resolve_address("no-such-host.invalid")
    with pytest.raises(ConfigError, match="resolves to loopback"):
        build_plan(dep, (HostAssignment(address="localhost", gpu_ids=(0, 1, 2, 3)),
                         HostAssignment(address="192.0.2.7", gpu_ids=(0, 1, 2, 3))), PlanSettings(model_path="/m"))
    assert VllmBackendSettings(warmup_requests=0).warmup_requests == 0  # allowed, but _aiperf_run sends >= 1
    import inspect

    from tuner.backends.vllm._backend import VllmBackend as Backend

    assert "max(1, self.settings.warmup_requests)" in inspect.getsource(Backend._aiperf_run)


# -- the version table --------------------------------------------------------------------------------------

def test_version_table_is_one_table_with_sources_shown_in_the_docs() -> None:
    assert VllmVersion.parse("0.26.1rc1.dev12+gabc") == VllmVersion(0, 26, 1)
    assert VllmVersion.parse("v0.32.0+cpu") > VllmVersion.parse("0.26.1")
    with pytest.raises(ConfigError, match=r"cluster\.vllm_version"):
        VllmVersion.parse("latest")
    assert all(e.source and e.basis for e in TABLE)
    assert launch_rules("0.32.0").hybrid_hetero_tp and not launch_rules("0.19.1").hybrid_hetero_tp
    assert launch_rules("0.20.0").hybrid_hetero_tp  # PR #37635: absent in the 0.19.1 wheel, present in 0.20.0
    assert launch_rules("0.21.0").conv_split_kinds == ("mamba2",)
    assert launch_rules("0.32.0").conv_split_kinds == ("mamba1", "mamba2", "gdn_attn")
    assert not launch_rules("0.26.1").hybrid_mla_prefill_wider and launch_rules("0.27.0").hybrid_mla_prefill_wider
    sources = " ".join(e.source for e in TABLE)
    assert "#49612" not in sources and "#58034" not in sources and "#54387" in sources
    docs = (Path(__file__).parents[2] / "docs" / "vllm-backend.md").read_text()
    assert table_markdown() in docs, "docs/vllm-backend.md must show the version table as _versions.py has it"


def test_space_names_the_targeted_version_and_refuses_a_bad_one() -> None:
    from tuner.space import parse_space

    text = "name: x\ncluster: {gpu: gb300, num_gpus: 8, vllm_version: %s}\nworkload: {isl: 1, osl: 1}\n" \
           "phases: {decode: {concurrency: [1]}}\n"
    assert parse_space(text % "0.26.1rc1").cluster.vllm_version == "0.26.1rc1"
    with pytest.raises(ConfigError, match="vllm_version"):
        parse_space(text % "latest")


def test_exported_recipes_carry_the_trial_plans_settings() -> None:
    dep = parse_deployment("2P:TP4DP2+EP,1D:TP4DP4+EP", mtp=3)
    ctx = RecipeContext(model_path="/m", model_name="m", gpu="gb300", gpus_per_host=4, isl=8192, osl=1024)
    srt = yaml.safe_load(export_deployment(dep, "srt-slurm", ctx))
    decode = srt["backend"]["vllm_config"]["decode"]
    assert decode["block-size"] == "64" and decode["max-model-len"] == "9728"
    assert decode["max-cudagraph-capture-size"] == "4096"
    assert "nnodes" not in decode and "headless" not in decode  # srt-slurm derives those itself
    assert srt["backend"]["decode_environment"]["UCX_CUDA_IPC_ENABLE_MNNVL"] == "y"
    compose = yaml.safe_load(export_deployment(dep, "compose", ctx))
    assert len(compose["services"]) == 2 * 2 + 4 + 1
    placed = place_instances(dep, pack_hosts(dep, 4))
    assert all(len(h.gpu_ids) == 4 for p in placed for h in p.hosts)
    assert json.loads(json.dumps(decode["speculative-config"]))["num_speculative_tokens"] == 3


def test_a_plan_the_targeted_vllm_cannot_run_ends_the_trial_unsupported_with_the_reason(tmp_path: Path,
                                                                                        reference_model_path: Path
                                                                                        ) -> None:
    backend = VllmBackend(VllmBackendSettings(vllm_argv=("/nonexistent/vllm",), port_base=9000))
    request = TrialRequest(trial_id="t", model_path=str(reference_model_path), gpu="gb300",
                           deployment=parse_deployment("1P:TP4,1D:TEP8"), vllm_version="0.24.0",
                           workload=Workload(isl=1024, osl=128, concurrency=(1,)), artifacts_dir=str(tmp_path),
                           hosts=tuple(HostAssignment(address=f"192.0.2.{i}", gpu_ids=(0, 1, 2, 3)) for i in range(3)))
    result = backend.run(request)
    assert result.status.value == "unsupported" and "prefix caching with physical blocks" in result.reason
    assert "TP4" in result.reason and "--no-enable-prefix-caching" in result.reason
    assert not (tmp_path / "logs").exists()  # nothing was launched
