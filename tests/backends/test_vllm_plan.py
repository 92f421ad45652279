"""Exact argv of the reference deployments (what an engineer would have typed), and placement rules."""

from __future__ import annotations

import pytest

from tuner.backends import HostAssignment
from tuner.backends.vllm import PlanSettings, build_plan, keep_names, place_instances, uniform_hosts
from tuner.deployment import Deployment, parse_deployment
from tuner.errors import ConfigError, TopologyError
from tuner.topology import Role, Topology

SETTINGS = PlanSettings(model_path="/models/qwen3", served_model_name="qwen3", max_model_len=9216)
ENGINE = ["--gpu-memory-utilization", "0.92", "--max-num-seqs", "1024", "--max-num-batched-tokens", "8192"]
MTP3 = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}']
HEAD = ["vllm", "serve", "/models/qwen3", "--served-model-name", "qwen3"]
PRODUCER = ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}']
CONSUMER = ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}']
BLOCK = ["--block-size", "64"]  # pinned on both PD sides (version table)
GRAPHS_MTP3 = ["--max-cudagraph-capture-size", "4096"]  # 1024 sequences x (1 + 3)


def plan_of(deployment: Deployment, hosts_: object, settings: PlanSettings = SETTINGS):  # type: ignore[no-untyped-def]
    """Placeholder host names stay names (a real run resolves them: see the resolver tests)."""
    return build_plan(deployment, hosts_, settings, resolve=keep_names)  # type: ignore[arg-type]


def hosts(*addresses: str, gpus: int = 4) -> tuple[HostAssignment, ...]:
    return tuple(HostAssignment(address=a, gpu_ids=tuple(range(gpus))) for a in addresses)


def test_tep8_decode_mtp3_on_two_4gpu_hosts() -> None:
    topo = Topology.parse("TEP8", mtp=3, role=Role.DECODE)
    plan = build_plan(Deployment.single(topo), hosts("10.0.0.1", "10.0.0.2"), SETTINGS)
    assert [p.host for p in plan.processes] == ["10.0.0.1", "10.0.0.2"]
    tail = ["--tensor-parallel-size", "8", "--enable-expert-parallel", *MTP3, *ENGINE, *GRAPHS_MTP3,
            "--max-model-len", "9216", "--nnodes", "2"]
    assert list(plan.processes[0].argv) == [
        *HEAD, *tail, "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29500",
        "--host", "0.0.0.0", "--port", "8100"]
    assert list(plan.processes[1].argv) == [
        *HEAD, *tail, "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500", "--headless"]
    assert plan.processes[0].env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "VLLM_PORT": "20000"}
    assert plan.processes[1].env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "VLLM_PORT": "20010"}
    assert plan.processes[0].health_url == "http://10.0.0.1:8100/health"
    assert plan.processes[1].health_url is None and plan.processes[1].port is None
    assert plan.endpoint == "http://10.0.0.1:8100"
    assert plan.fronts == ()


def test_tp4dp4_ep_decode_over_four_hosts() -> None:
    topo = Topology.parse("TP4DP4+EP", role=Role.DECODE)
    plan = plan_of(Deployment.single(topo), hosts("h0", "h1", "h2", "h3"))
    base = [*HEAD, "--tensor-parallel-size", "4", "--data-parallel-size", "4", "--enable-expert-parallel",
            *ENGINE, "--max-cudagraph-capture-size", "1024", "--max-model-len", "9216",
            "--data-parallel-size-local", "1", "--data-parallel-address", "h0", "--data-parallel-rpc-port", "13345"]
    assert list(plan.processes[0].argv) == [*base, "--host", "0.0.0.0", "--port", "8100"]
    for rank in (1, 2, 3):
        assert list(plan.processes[rank].argv) == [*base, "--data-parallel-start-rank", str(rank), "--headless"]
        assert plan.processes[rank].host == f"h{rank}"
    assert [p.name for p in plan.processes] == ["decode0-node0", "decode0-node1", "decode0-node2", "decode0-node3"]


def test_3p_tp4dp2_ep_1d_tep8_mtp3_with_router() -> None:
    dep = parse_deployment("3P:TP4DP2+EP,1D:TEP8", mtp=3)
    addresses = [f"10.0.0.{i}" for i in range(1, 9)]
    plan = build_plan(dep, hosts(*addresses), SETTINGS)
    assert len(plan.processes) == 3 * 2 + 2 + 1
    prefill_tail = ["--tensor-parallel-size", "4", "--data-parallel-size", "2", "--enable-expert-parallel", *MTP3,
                    *ENGINE, "--max-model-len", "9216", *PRODUCER, *BLOCK, "--data-parallel-size-local", "1"]
    for i in range(3):
        head_host, second = addresses[2 * i], addresses[2 * i + 1]
        p0, p1 = plan.processes[2 * i], plan.processes[2 * i + 1]
        dp = ["--data-parallel-address", head_host, "--data-parallel-rpc-port", str(13345 + i)]
        assert list(p0.argv) == [*HEAD, *prefill_tail, *dp, "--host", "0.0.0.0", "--port", str(8100 + i)]
        assert list(p1.argv) == [*HEAD, *prefill_tail, *dp, "--data-parallel-start-rank", "1", "--headless"]
        nixl_port = str(5600 + 8 * i)
        assert p0.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "VLLM_NIXL_SIDE_CHANNEL_HOST": head_host,
                          "VLLM_NIXL_SIDE_CHANNEL_PORT": nixl_port, "VLLM_PORT": str(20000 + 20 * i)}
        assert p1.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == second
        assert (p0.host, p1.host) == (head_host, second)
        assert p0.role == "prefill"
    d0, d1 = plan.processes[6], plan.processes[7]
    decode_tail = ["--tensor-parallel-size", "8", "--enable-expert-parallel", *MTP3, *ENGINE, *GRAPHS_MTP3,
                   "--max-model-len", "9216", *CONSUMER, *BLOCK, "--nnodes", "2"]
    assert list(d0.argv) == [*HEAD, *decode_tail, "--node-rank", "0", "--master-addr", "10.0.0.7",
                             "--master-port", "29503", "--host", "0.0.0.0", "--port", "8103"]
    assert list(d1.argv) == [*HEAD, *decode_tail, "--node-rank", "1", "--master-addr", "10.0.0.7",
                             "--master-port", "29503", "--headless"]
    assert d0.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5624"
    router = plan.processes[8]
    assert router.role == "router" and router.host == "10.0.0.1"
    assert list(router.argv) == [
        "vllm-router", "--host", "0.0.0.0", "--port", "8000", "--prometheus-port", "8001", "--vllm-pd-disaggregation",
        "--prefill", "http://10.0.0.1:8100", "--prefill", "http://10.0.0.3:8101", "--prefill", "http://10.0.0.5:8102",
        "--decode", "http://10.0.0.7:8103", "--policy", "round_robin"]
    assert plan.endpoint == "http://10.0.0.1:8000"
    assert plan.hosts() == addresses


def test_cpu_pd_1p1d_binds_one_core_each_and_buffers_kv_on_cpu() -> None:
    settings = PlanSettings(vllm_argv=("/envs/vllm/bin/python", "/x/_launcher.py"), router_argv=("/r/vllm-router",),
                            model_path="/tmp/tiny", served_model_name="tiny", device="cpu", bind_host="127.0.0.1",
                            api_port_base=8100, router_port=8300, nixl_side_channel_port_base=5600,
                            extra_flags=("--dtype", "bfloat16", "--enforce-eager"),
                            env={"HF_HUB_OFFLINE": "1"})
    dep = parse_deployment("1P:TP1,1D:TP1")
    plan = build_plan(dep, [HostAssignment(address="127.0.0.1", gpu_ids=(0, 1))], settings)
    prefill, decode, router = plan.processes
    assert prefill.argv[:4] == ("/envs/vllm/bin/python", "/x/_launcher.py", "serve", "/tmp/tiny")
    assert "--kv-transfer-config" in prefill.argv
    kv = prefill.argv[prefill.argv.index("--kv-transfer-config") + 1]
    assert kv == '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"cpu"}'
    assert prefill.env == {"HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_PORT": "20000",
                           "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}
    assert decode.env["VLLM_PORT"] == "20010"  # one range per process on the shared host
    assert "--block-size" not in prefill.argv and "--max-cudagraph-capture-size" not in decode.argv  # CPU
    assert decode.env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert decode.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5608"
    assert list(router.argv) == ["/r/vllm-router", "--host", "127.0.0.1", "--port", "8300", "--prometheus-port", "8301",
                                 "--vllm-pd-disaggregation", "--prefill", "http://127.0.0.1:8100",
                                 "--decode", "http://127.0.0.1:8101", "--policy", "round_robin"]
    assert prefill.argv[-4:] == ("--host", "127.0.0.1", "--port", "8100")


def test_cpu_single_tp1_uses_auto_bind_and_no_front() -> None:
    settings = PlanSettings(model_path="/tmp/tiny", device="cpu")
    plan = build_plan(Deployment.single(Topology.parse("TP1")), uniform_hosts(1, 2, ["127.0.0.1"]), settings)
    (server,) = plan.processes
    assert server.env == {"VLLM_CPU_OMP_THREADS_BIND": "auto", "VLLM_PORT": "20000"}
    assert "--kv-transfer-config" not in server.argv


def test_cpu_tp2_binds_each_worker() -> None:
    settings = PlanSettings(model_path="/tmp/tiny", device="cpu")
    plan = build_plan(Deployment.single(Topology.parse("TP2")), uniform_hosts(2, 2, ["127.0.0.1"]), settings)
    assert plan.processes[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"


def test_two_aggregated_instances_get_a_round_robin_front() -> None:
    plan = plan_of(parse_deployment("2x:TP4"), hosts("a", "b"))
    assert [p.name for p in plan.processes] == ["both0", "both1", "router"]
    assert list(plan.processes[2].argv) == ["vllm-router", "--host", "0.0.0.0", "--port", "8000", "--prometheus-port",
                                            "8001", "--worker-urls", "http://a:8100", "http://b:8101", "--policy",
                                            "round_robin"]


def test_placement_consumes_devices_in_instance_order() -> None:
    dep = parse_deployment("1P:TP2,1D:TP2")
    placed = place_instances(dep, [HostAssignment(address="a", gpu_ids=(0, 1, 2, 3)),
                                   HostAssignment(address="b", gpu_ids=(0, 1, 2, 3))])
    assert [(p.role, [(h.address, h.gpu_ids) for h in p.hosts]) for p in placed] == [
        (Role.PREFILL, [("a", (0, 1))]), (Role.DECODE, [("a", (2, 3))])]


def test_tp_straddling_hosts_with_dp_is_refused() -> None:
    dep = Deployment.single(Topology.parse("TP4DP2"))
    with pytest.raises(TopologyError, match="unevenly"):
        plan_of(dep, [HostAssignment(address="a", gpu_ids=(0, 1)), HostAssignment(address="b", gpu_ids=(0, 1, 2)),
                      HostAssignment(address="c", gpu_ids=(0, 1, 2))])
    with pytest.raises(TopologyError, match="straddle"):  # TP2 ranks, but one host holds 3 devices
        plan_of(Deployment.single(Topology.parse("TP2DP2")),
                [HostAssignment(address="a", gpu_ids=(0,)), HostAssignment(address="b", gpu_ids=(0, 1, 2))])


def test_too_few_devices_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs 8 devices"):
        build_plan(Deployment.single(Topology.parse("TEP8")), hosts("a"), SETTINGS)


@pytest.mark.parametrize("text", ["", "3P:TP4", "1P:TP4,1P:TP2", "1Q:TP4,1D:TP4"])
def test_bad_deployment_strings(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_deployment(text)


def test_shell_rendering_quotes_json() -> None:
    plan = plan_of(Deployment.single(Topology.parse("TP1", mtp=1)), hosts("a", gpus=1))
    line = plan.processes[0].shell()
    assert line.startswith("CUDA_VISIBLE_DEVICES=0 VLLM_PORT=20000 vllm serve /models/qwen3")
    assert "'{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'" in line


def test_loopback_bound_servers_are_reached_on_loopback_whatever_the_node_ip() -> None:
    """Under Ray a host's address is the node IP; a CPU server bound to 127.0.0.1 is only reachable there."""
    from tuner.backends import HostAssignment
    from tuner.backends.vllm import PlanSettings, build_plan
    from tuner.deployment import Deployment
    from tuner.topology import Topology

    hosts = (HostAssignment(address="192.0.2.2", node_id="n1", gpu_ids=(0, 1)),)
    pd = Deployment.disaggregated(Topology(tp=1), 1, Topology(tp=1), 1)
    plan = build_plan(pd, hosts, PlanSettings(model_path="/m", bind_host="127.0.0.1", device="cpu"))
    assert plan.endpoint.startswith("http://127.0.0.1:")
    assert all(p.health_url.startswith("http://127.0.0.1:") for p in plan.processes if p.health_url)
    router = plan.fronts[0]
    assert all(a.startswith("http://127.0.0.1:") for a in router.argv if a.startswith("http://"))
    assert {p.host for p in plan.processes} == {"192.0.2.2"}  # where to start them is still the node
    wide = build_plan(pd, hosts, PlanSettings(model_path="/m"))
    assert wide.endpoint.startswith("http://192.0.2.2:")
