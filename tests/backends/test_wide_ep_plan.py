"""Wide EP across 8-GPU hosts: the exact per-host argv vLLM needs (DP local size, address, RPC port, start rank,
the DeepEP backend, DBO, EPLB with redundant experts), and the backends that cannot cross hosts refused."""

from __future__ import annotations

import json

import pytest

from tuner.backends import HostAssignment
from tuner.backends.vllm import PlanSettings, build_plan, keep_names
from tuner.deployment import Deployment, parse_deployment
from tuner.errors import ConfigError
from tuner.topology import Role, Topology

SETTINGS = PlanSettings(model_path="/models/dsv3", served_model_name="dsv3", max_model_len=4096)


def hgx(*names: str) -> tuple[HostAssignment, ...]:
    return tuple(HostAssignment(address=n, gpu_ids=tuple(range(8))) for n in names)


def test_dep32_decode_over_four_hgx_hosts() -> None:
    topo = Topology.parse("DEP32", role=Role.DECODE, all2all_backend="deepep_low_latency", dbo=True,
                          num_redundant_experts=32, max_num_seqs=256, max_num_batched_tokens=256)
    plan = build_plan(Deployment.single(topo), hgx("n0", "n1", "n2", "n3"), SETTINGS, resolve=keep_names)
    assert [p.host for p in plan.processes] == ["n0", "n1", "n2", "n3"]
    for rank, proc in enumerate(plan.processes):
        argv = list(proc.argv)
        assert argv[argv.index("--data-parallel-size") + 1] == "32"
        assert argv[argv.index("--data-parallel-size-local") + 1] == "8"
        assert argv[argv.index("--data-parallel-address") + 1] == "n0"
        assert argv[argv.index("--data-parallel-rpc-port") + 1].isdigit()
        assert "--enable-expert-parallel" in argv and "--enable-dbo" in argv and "--enable-eplb" in argv
        assert argv[argv.index("--all2all-backend") + 1] == "deepep_low_latency"
        assert json.loads(argv[argv.index("--eplb-config") + 1]) == {"num_redundant_experts": 32}
        assert proc.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        if rank:  # the headless hosts start at their first DP rank
            assert argv[argv.index("--data-parallel-start-rank") + 1] == str(8 * rank) and "--headless" in argv
        else:
            assert "--data-parallel-start-rank" not in argv and "--port" in argv


def test_prefill_dep16_and_decode_dep32_pd_over_six_hosts() -> None:
    dep = parse_deployment("1P:DEP16,1D:DEP32", all2all_backend="deepep_high_throughput", num_redundant_experts=32)
    plan = build_plan(dep, hgx(*(f"n{i}" for i in range(6))), SETTINGS, resolve=keep_names)
    servers = plan.servers
    assert [p.name for p in servers] == [*(f"prefill0-node{i}" for i in range(2)),
                                         *(f"decode0-node{i}" for i in range(4))]
    prefill_heads = {p.argv[p.argv.index("--data-parallel-address") + 1] for p in servers if p.role == "prefill"}
    decode_heads = {p.argv[p.argv.index("--data-parallel-address") + 1] for p in servers if p.role == "decode"}
    assert prefill_heads == {"n0"} and decode_heads == {"n2"}  # one DP head per instance


@pytest.mark.parametrize("backend", ["flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided"])
def test_an_nvlink_all_to_all_cannot_cross_hgx_hosts(backend: str) -> None:
    topo = Topology.parse("DEP16", role=Role.DECODE, all2all_backend=backend)
    with pytest.raises(ConfigError, match="multi-node NVLink") as err:
        build_plan(Deployment.single(topo), hgx("n0", "n1"), SETTINGS, resolve=keep_names)
    assert err.value.field == "all2all_backend" and "deepep" in err.value.fix
    # inside one host, or over multi-node NVLink (GB200/GB300 racks), it is the kernel vLLM runs
    build_plan(Deployment.single(Topology.parse("DEP8", all2all_backend=backend)), hgx("n0"), SETTINGS,
               resolve=keep_names)
    nvl72 = SETTINGS.model_copy(update={"multi_node_nvlink": True})
    build_plan(Deployment.single(topo), hgx("n0", "n1"), nvl72, resolve=keep_names)
