"""Wide EP across hosts: the scale-out network as data, and the all-to-all priced as DeepEP and NCCL move it.

A multi-host EP group's tokens cross the hosts' RDMA NICs; DeepEP's high-throughput kernels send a token once per
destination host (then NVLink), its low-latency kernels once per (token, expert), vLLM's default gathers every
token. Inside one NVLink domain nothing here applies: those prices are the ones they always were.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.paths import REPO

from tuner.errors import ConfigError
from tuner.hardware import GpuSpec, get_gpu
from tuner.models import ModelSpec, load_model
from tuner.perf import RooflineModel, default_calibration
from tuner.perf._comm import alltoall_pair_s, pass_comm
from tuner.perf._costs import a2a_sm_share, ep_domains, instance_costs
from tuner.topology import Topology


@pytest.fixture(scope="module")
def deepseek() -> ModelSpec:
    return load_model(REPO / "examples" / "models" / "deepseek-v3")


@pytest.fixture(scope="module")
def h100() -> GpuSpec:
    return get_gpu("h100")


def test_the_catalog_describes_the_hosts_network() -> None:
    h100 = get_gpu("h100")
    assert h100.scale_out is not None and h100.scale_out.nics_per_host == 8 and h100.scale_out.nic_gbit_s == 400
    assert h100.scale_out.fabric == "infiniband" and h100.scale_out.rdma
    assert h100.inter_host_bandwidth_gb_s == 50.0  # derived: 8 x 400 Gb/s / 8 bits / 8 GPUs
    assert not get_gpu("cpu").network.rdma  # TCP, no GPUDirect RDMA: DeepEP cannot cross those hosts


def test_an_old_file_keeps_its_single_figure_and_a_new_one_derives_it(tmp_path: Path) -> None:
    base = """  - name: {name}
    memory_gib: 80
    hbm_bandwidth_tb_s: 3
    peak_tflops: {{bf16: 900}}
    nvlink_bandwidth_gb_s: 900
    gpus_per_host: 8
    nvlink_domain_gpus: 8
    non_torch_memory_gib: 1
"""
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n" + base.format(name="old") + "    inter_host_bandwidth_gb_s: 25\n"
                    + base.format(name="roce") + "    scale_out: {nics_per_host: 4, nic_gbit_s: 400, fabric: roce}\n")
    old, roce = get_gpu("old", path), get_gpu("roce", path)
    assert old.inter_host_bandwidth_gb_s == 25 and old.scale_out is None
    assert old.network.gb_s_per_gpu(old.gpus_per_host) == 25  # read as one NIC per GPU at that rate
    assert roce.inter_host_bandwidth_gb_s == 25 and roce.network.fabric == "roce" and roce.network.rdma


def test_a_figure_that_disagrees_with_the_nics_names_both(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("""gpus:
  - name: bad
    memory_gib: 80
    hbm_bandwidth_tb_s: 3
    peak_tflops: {bf16: 900}
    nvlink_bandwidth_gb_s: 900
    inter_host_bandwidth_gb_s: 100
    scale_out: {nics_per_host: 8, nic_gbit_s: 400}
    gpus_per_host: 8
    nvlink_domain_gpus: 8
    non_torch_memory_gib: 1
""")
    with pytest.raises(ConfigError, match="disagrees with scale_out"):
        get_gpu("bad", path)


def test_domains_follow_the_nvlink_domain(h100: GpuSpec) -> None:
    assert ep_domains(h100, 8) == (1, 8)
    assert ep_domains(h100, 32) == (4, 8)
    assert ep_domains(get_gpu("gb300"), 72) == (1, 72)  # the NVL72 rack never crosses the network


def test_deepep_high_throughput_crosses_the_network_once_per_host(deepseek: ModelSpec, h100: GpuSpec) -> None:
    """RDMA copies of a token: (H - 1)(1 - (1 - 1/H)^k) hosts for DeepEP's normal kernels, k (G - L) / G experts
    for its low-latency kernels, H - 1 per-rank shares for a gather (each with its BF16 combine)."""
    perf = RooflineModel(deepseek, h100)
    cal = perf.calibration.model_copy(update={"alltoall_latency_us": 0.0, "allreduce_latency_us": 0.0})
    k = deepseek.moe.experts_per_token  # type: ignore[union-attr]
    tokens = 16384
    rdma_s = {}
    wire = {}  # bytes per hidden element there and back: dispatch (BF16, or FP8 behind DeepEP LL) + BF16 combine
    for backend in ("deepep_high_throughput", "deepep_low_latency", "allgather_reducescatter"):
        costs = instance_costs(deepseek, h100, Topology.parse("DEP32", all2all_backend=backend))
        assert (costs.ep_domains, costs.ep_ranks_per_domain) == (4, 8)
        rdma_s[backend] = alltoall_pair_s(tokens, costs, cal)
        wire[backend] = costs.dispatch_bytes + 2
    assert wire["deepep_low_latency"] == pytest.approx(1 + 4 / 128 + 2)
    assert wire["deepep_high_throughput"] == wire["allgather_reducescatter"] == 4.0
    per_token_s = tokens * deepseek.hidden_size * 4.0 / (costs.scale_out_bytes_s * cal.scale_out_bw_efficiency)
    assert rdma_s["deepep_high_throughput"] == pytest.approx(3 * (1 - 0.75 ** k) * per_token_s)
    assert rdma_s["deepep_low_latency"] == pytest.approx(k * 24 / 32 * per_token_s * wire["deepep_low_latency"] / 4)
    # the gather also lands the other 28 ranks' shares of the three remote hosts and its own host over NVLink
    nvlink_s = 28 * tokens * deepseek.hidden_size * (costs.dispatch_bytes + 2) / (
        costs.nvlink_bytes_s * cal.alltoall_bw_efficiency)
    assert rdma_s["allgather_reducescatter"] == pytest.approx(max(3 * per_token_s, nvlink_s))
    # DeepEP's normal kernels cross the network least; the low-latency ones send k copies, but in FP8, and land
    # under the gather, whose NVLink leg (28 BF16 shares) is the slower one here
    assert rdma_s["deepep_high_throughput"] < rdma_s["deepep_low_latency"] < rdma_s["allgather_reducescatter"]


def test_more_nics_make_the_cross_host_all_to_all_cheaper(deepseek: ModelSpec, h100: GpuSpec) -> None:
    half = h100.model_copy(update={"inter_host_bandwidth_gb_s": 25.0})
    topo = Topology.parse("DEP16", all2all_backend="deepep_low_latency")
    cal = RooflineModel(deepseek, h100).calibration
    full_s, half_s = (pass_comm(128, 61, 58, instance_costs(deepseek, g, topo), cal).alltoall_s for g in (h100, half))
    assert half_s > 1.8 * full_s


def test_wide_ep_prefill_across_four_hosts_is_compute_bound(deepseek: ModelSpec, h100: GpuSpec) -> None:
    """The issue's case: DeepSeek-V3 EP32 over four H100 hosts on InfiniBand with DeepEP's high-throughput kernels
    and DBO, 16K prompt tokens per rank. It was priced at ~5 s of communication against ~3.4 s of compute; the
    deployments that ran it were compute-bound."""
    perf = RooflineModel(deepseek, h100)
    topo = Topology.parse("DEP32", all2all_backend="deepep_high_throughput", dbo=True, max_num_batched_tokens=16384)
    step = perf.prefill_step(topo, 32 * 8, isl=2048)
    assert step.comm_ms < 0.5 * step.compute_ms
    no_dbo = perf.prefill_step(topo.model_copy(update={"dbo": False}), 32 * 8, isl=2048)
    assert no_dbo.comm_ms > step.comm_ms  # DBO hides part of it behind the other micro-batch's compute


def test_single_domain_prices_do_not_move(deepseek: ModelSpec, h100: GpuSpec) -> None:
    """Inside one NVLink domain the all-to-all keeps the per-rank NVLink price (the GB300 reference's physics)."""
    cal = RooflineModel(deepseek, h100).calibration
    costs = instance_costs(deepseek, h100, Topology.parse("DEP8", all2all_backend="deepep_high_throughput"))
    assert costs.ep_domains == 1
    wire = 512 * deepseek.hidden_size * costs.a2a_remote_ranks * (costs.dispatch_bytes + 2)
    assert alltoall_pair_s(512, costs, cal) == pytest.approx(
        2 * cal.alltoall_latency_us * 1e-6 + wire / (costs.ep_link_bytes_s * cal.alltoall_bw_efficiency))


def test_dbo_leaves_exposed_the_sms_deepep_normal_kernels_hold(deepseek: ModelSpec, h100: GpuSpec) -> None:
    """Under dual-batch overlap the all-to-all of one micro-batch runs under the other's compute. DeepEP's normal
    kernels hold 20 SMs meanwhile (vLLM's num_sms), so a compute-bound step still pays 20/132 of the all-to-all
    on H100; the low-latency kernels hold none (max_sms_used = 0), so there only what the compute cannot cover
    stays exposed. Without an SM count nothing is held."""
    cal = RooflineModel(deepseek, h100).calibration
    assert cal.dbo_overlap == 1.0 and default_calibration("gb300").dbo_overlap == 0.7  # the reference's stays
    ht = instance_costs(deepseek, h100, Topology.parse("DEP32", all2all_backend="deepep_high_throughput", dbo=True))
    ll = instance_costs(deepseek, h100, Topology.parse("DEP32", all2all_backend="deepep_low_latency", dbo=True))
    assert ht.a2a_sm_share == pytest.approx(20 / 132) and ll.a2a_sm_share == 0.0
    unknown = h100.model_copy(update={"sm_count": None})
    assert a2a_sm_share("deepep_high_throughput", unknown) == 0.0
    for costs in (ht, ll):
        comm = pass_comm(16384, 61, 58, costs, cal)
        assert comm.alltoall_s > 0
        compute_bound = comm.visible_s(costs, cal, 10 * comm.total_s, 16384, 512)
        assert compute_bound == pytest.approx(comm.allreduce_s + costs.a2a_sm_share * comm.alltoall_s)
        comm_bound = comm.visible_s(costs, cal, 0.1 * comm.alltoall_s, 16384, 512)
        assert comm_bound == pytest.approx(comm.total_s - 0.1 * comm.alltoall_s)  # the compute hides, a - c stays
        assert comm.visible_s(costs, cal, 10 * comm.total_s, 256, 512) == comm.total_s  # below vLLM's threshold
