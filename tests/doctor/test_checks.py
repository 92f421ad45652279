"""The preflight's verdicts on constructed node facts (the real probes run in tests/backends/test_doctor_cpu.py)."""

from __future__ import annotations

from pathlib import Path

from tuner.doctor._checks import (
    CheckStatus,
    check_cluster_size,
    check_gpus,
    check_imex,
    check_model,
    check_nixl,
    check_ports,
    check_tool,
    check_wide_ep,
    needs_imex,
)
from tuner.doctor._probe import (
    DeepEPFacts,
    ModelFacts,
    NixlFacts,
    NodeFacts,
    PortFacts,
    RdmaDevice,
    ToolFacts,
    _model,
    _ports,
    rdma_devices,
    stream_mem_ops,
)
from tuner.hardware import get_gpu

GB300 = get_gpu("gb300")
H100 = get_gpu("h100")


def facts(**changes: object) -> NodeFacts:
    model = ModelFacts(path="/models/m", exists=True, config_ok=True, weight_files=3, weight_bytes=2**31)
    base = NodeFacts(node="gpu-07", address="10.0.0.7", cpu_count=2,
                     gpus=tuple(f"GPU {i}: NVIDIA GB300" for i in range(4)), gpu_source="nvidia-smi",
                     imex_channels=("channel0",), model=model,
                     tools={"vllm": ToolFacts(name="vllm", argv=("vllm",), path="/usr/bin/vllm", ran=True,
                                              version="0.26.1")},
                     nixl=NixlFacts(version="1.5.1", plugins=("POSIX", "UCX")), ports=PortFacts(base=20000, size=200))
    return base.model_copy(update=changes)


def test_gpu_count_per_node_names_node_and_counts() -> None:
    assert check_gpus(facts(), GB300, 4).status is CheckStatus.PASS
    other = check_gpus(facts(gpus=tuple(f"GPU {i}: NVIDIA H100 80GB HBM3" for i in range(4))), GB300, 4)
    assert other.status is CheckStatus.WARN and "H100" in other.detail and "cluster.gpu" in other.fix
    bad = check_gpus(facts(gpus=("GPU 0: NVIDIA GB300",) * 2), GB300, 4)
    assert bad.status is CheckStatus.FAIL and bad.node == "gpu-07"
    assert "needs 4 gb300 GPUs per host" in bad.detail and "has 2" in bad.detail and bad.fix
    none = check_gpus(facts(gpus=(), gpu_source="none"), GB300, 4)
    assert "has 0" in none.detail and "no nvidia-smi" in none.detail and "cpu-tiny" in none.fix


def test_cpu_space_needs_cores_not_gpus() -> None:
    assert check_gpus(facts(gpus=(), cpu_count=2), None, 2).status is CheckStatus.PASS
    short = check_gpus(facts(gpus=(), cpu_count=1), None, 2)
    assert short.status is CheckStatus.FAIL and "has 1" in short.detail and "gpus_per_host to 1" in short.fix


def test_cluster_too_small() -> None:
    result = check_cluster_size([facts()], GB300, 72, 4)
    assert result.status is CheckStatus.FAIL and "72 GPUs (18 hosts x 4)" in result.detail and "has 4" in result.detail
    assert check_cluster_size([facts()] * 18, GB300, 72, 4).status is CheckStatus.PASS


def test_model_missing_unreadable_or_incomplete(tmp_path: Path) -> None:
    missing = check_model(facts(model=_model(str(tmp_path / "nope"))))
    assert missing.status is CheckStatus.FAIL and "not a folder on this node" in missing.detail
    assert "gpu-07" in missing.fix
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{not json")
    assert "config.json" in check_model(facts(model=_model(str(tmp_path / "m")))).detail
    (tmp_path / "m" / "config.json").write_text("{}")
    assert "no weight files" in check_model(facts(model=_model(str(tmp_path / "m")))).detail
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\0" * 64)
    assert check_model(facts(model=_model(str(tmp_path / "m")))).status is CheckStatus.PASS
    assert check_model(facts(model=_model(""))).status is CheckStatus.WARN


def test_tool_not_found_says_how_to_install() -> None:
    missing = facts(tools={"aiperf": ToolFacts(name="aiperf", argv=("/envs/aiperf/bin/aiperf",),
                                               error="/envs/aiperf/bin/aiperf not found")})
    result = check_tool(missing, "aiperf")
    assert result.status is CheckStatus.FAIL and "setup-cpu-vllm --only aiperf" in result.fix
    assert "0.26.1" in check_tool(facts(), "vllm").detail


def test_nixl_without_ucx_is_a_warning_for_phase_trials_and_a_failure_for_pd() -> None:
    no_ucx = facts(nixl=NixlFacts(version="1.5.1", plugins=("POSIX",)))
    assert check_nixl(no_ucx, needed=False).status is CheckStatus.WARN
    assert check_nixl(no_ucx, needed=True).status is CheckStatus.FAIL
    assert check_nixl(facts(), needed=True).status is CheckStatus.PASS


def test_busy_fixed_ports_fail_and_real_bind_sees_them() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        port = sock.getsockname()[1]
        probed = _ports(port - 1, 4)
    assert port in probed.busy
    result = check_ports(facts(ports=probed), fixed=True)
    assert result.status is CheckStatus.FAIL and str(port) in result.detail and "port_base" in result.fix


def test_imex_needed_only_for_multi_node_nvlink() -> None:
    assert needs_imex(GB300, 4, 72) and not needs_imex(GB300, 4, 4) and not needs_imex(H100, 8, 16)
    assert not needs_imex(None, 2, 2)
    missing = check_imex(facts(imex_channels=()), GB300, 4, 72)
    assert missing.status is CheckStatus.FAIL and "imex-channels" in missing.detail and "nvidia-imex" in missing.fix
    assert check_imex(facts(), GB300, 4, 72).status is CheckStatus.PASS
    assert check_imex(facts(imex_channels=()), H100, 8, 16).status is CheckStatus.PASS


def test_vllm_version_must_match_the_space_and_lists_required_settings() -> None:
    from tuner.doctor._checks import check_same_vllm, check_vllm_version

    ok = check_vllm_version(facts(), None, hybrid=True, multi_node_nvlink=True)
    assert ok.status is CheckStatus.PASS and ok.detail.startswith("vLLM 0.26.1")
    assert "VLLM_SSM_CONV_STATE_LAYOUT=DS" in ok.detail and "UCX_CUDA_IPC_ENABLE_MNNVL=y" in ok.detail
    assert "across TP allowed" in ok.detail  # hybrid state between different TP from 0.20.0 (PR #37635)
    assert "NIXL transfers mamba1, mamba2, gdn_attn state" in ok.detail
    old = facts(tools={"vllm": ToolFacts(name="vllm", argv=("vllm",), path="/v", ran=True, version="0.19.1")})
    older = check_vllm_version(old, None, hybrid=True, multi_node_nvlink=False)
    assert "--no-disable-hybrid-kv-cache-manager" in older.detail and "only at equal TP" in older.detail
    mismatch = check_vllm_version(facts(), "0.32.0", hybrid=False, multi_node_nvlink=False)
    assert mismatch.status is CheckStatus.FAIL and "targets vLLM 0.32.0" in mismatch.detail
    assert "runs 0.26.1" in mismatch.detail and "cluster.vllm_version: 0.26.1" in mismatch.fix
    newer = facts(tools={"vllm": ToolFacts(name="vllm", argv=("vllm",), path="/v", ran=True, version="0.40.0")})
    assert check_vllm_version(newer, None, hybrid=False, multi_node_nvlink=False).status is CheckStatus.WARN
    broken = facts(tools={"vllm": ToolFacts(name="vllm", argv=("vllm",), error="vllm not found")})
    assert check_vllm_version(broken, None, hybrid=False, multi_node_nvlink=False).status is CheckStatus.FAIL
    split = check_same_vllm([facts(), newer.model_copy(update={"node": "gpu-08"})])
    assert split.status is CheckStatus.FAIL and "gpu-07 0.26.1" in split.detail and "gpu-08 0.40.0" in split.detail


# -- wide EP across hosts: RDMA devices, DeepEP/NVSHMEM in vLLM's Python, IBGDA ------------------------------------


def test_wide_ep_is_not_checked_inside_one_nvlink_domain() -> None:
    assert check_wide_ep(facts(), H100, 8, deepep=True).status is CheckStatus.PASS
    assert check_wide_ep(facts(), GB300, 72, deepep=True).status is CheckStatus.PASS  # the rack's NVLink


def test_wide_ep_needs_an_active_rdma_device_on_every_node() -> None:
    none = check_wide_ep(facts(), H100, 32, deepep=False)
    assert none.status is CheckStatus.FAIL and "gpu-07" in none.detail and "RDMA" in none.detail
    down = check_wide_ep(facts(rdma_devices=(RdmaDevice(name="mlx5_0", link_layer="InfiniBand", state="1: DOWN"),)),
                         H100, 32, deepep=False)
    assert down.status is CheckStatus.FAIL and "mlx5_0 1: DOWN" in down.detail
    up = (RdmaDevice(name="mlx5_0", link_layer="Ethernet", state="4: ACTIVE"),)
    assert check_wide_ep(facts(rdma_devices=up), H100, 32, deepep=False).status is CheckStatus.PASS


def test_wide_ep_on_deepep_needs_deepep_and_ibgda() -> None:
    up = (RdmaDevice(name="mlx5_0", link_layer="InfiniBand", state="4: ACTIVE"),)
    missing = check_wide_ep(facts(rdma_devices=up, deepep=DeepEPFacts(error="No module named 'deep_ep'")), H100, 32,
                            deepep=True)
    assert missing.status is CheckStatus.FAIL and "deep_ep" in missing.detail and "ep_kernels" in missing.fix
    ready = facts(rdma_devices=up, deepep=DeepEPFacts(deep_ep="1.2.1", nvshmem="3.3.9"), stream_mem_ops=True)
    ok = check_wide_ep(ready, H100, 32, deepep=True)
    assert ok.status is CheckStatus.PASS and "NVSHMEM 3.3.9" in ok.detail
    no_ibgda = check_wide_ep(ready.model_copy(update={"stream_mem_ops": False}), H100, 32, deepep=True)
    assert no_ibgda.status is CheckStatus.FAIL and "EnableStreamMemOPs" in no_ibgda.fix


def test_rdma_devices_and_driver_params_are_read_from_sysfs(tmp_path: Path) -> None:
    port = tmp_path / "infiniband" / "mlx5_3" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "state").write_text("4: ACTIVE\n")
    assert rdma_devices(tmp_path / "infiniband") == (RdmaDevice(name="mlx5_3", link_layer="InfiniBand",
                                                                state="4: ACTIVE"),)
    assert rdma_devices(tmp_path / "none") == ()
    params = tmp_path / "params"
    params.write_text("ResmanDebugLevel: 4294967295\nEnableStreamMemOPs: 1\n")
    assert stream_mem_ops(params) is True
    assert stream_mem_ops(tmp_path / "missing") is None
