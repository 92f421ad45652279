"""The MoE collectives' wire bytes follow vLLM 0.32: tokens leave quantised to the experts' activation format
(NVFP4 0.56 bytes, block FP8 1.03, BF16 2) except where DeepEP or Hopper's FlashInfer experts take them unquantised,
and plain DP all-gathers them and reduce-scatters BF16 outputs over the DP group instead of an all-reduce."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.hardware import GpuSpec, get_gpu
from tuner.models import ModelSpec, WeightFormat, load_model
from tuner.perf import RooflineModel
from tuner.perf._comm import allreduce_s, gather_scatter_s, pass_comm
from tuner.perf._costs import instance_costs
from tuner.perf._wire import dispatch_bytes, expert_format
from tuner.topology import Topology

BACKENDS = ("allgather_reducescatter", "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided",
            "deepep_high_throughput", "deepep_low_latency")


def test_each_checkpoint_dispatches_at_its_experts_activation_format(models_dir: Path, reference: ModelSpec,
                                                                     dense: ModelSpec) -> None:
    fp8_block = load_model(models_dir / "deepseek-v3")
    bf16 = load_model(models_dir / "qwen3-next-80b-a3b")
    assert (expert_format(reference), expert_format(fp8_block), expert_format(bf16), expert_format(dense)) == (
        WeightFormat.NVFP4, WeightFormat.FP8_BLOCK, WeightFormat.BF16, None)
    gb300, h200 = get_gpu("gb300"), get_gpu("h200")
    for backend in BACKENDS:
        ep = Topology.parse("TP2DP4+EP", all2all_backend=backend)
        deepep = backend.startswith("deepep")
        # NVFP4: 4 bits + an e4m3 scale per 16 where the backend quantises first; DeepEP sends it as BF16
        assert instance_costs(reference, gb300, ep).dispatch_bytes == (2.0 if deepep else 0.5625)
        # block FP8: a byte + an fp32 scale per 128 on Blackwell; on Hopper FlashInfer's CUTLASS experts take
        # BF16 tokens, except behind DeepEP's low-latency kernels, whose batched layout those experts do not take
        # (batched DeepGEMM experts run on the FP8 tokens DeepEP dispatched)
        assert instance_costs(fp8_block, gb300, ep).dispatch_bytes == pytest.approx(1 + 4 / 128)
        hopper_fp8 = backend == "deepep_low_latency"
        assert instance_costs(fp8_block, h200, ep).dispatch_bytes == (pytest.approx(1 + 4 / 128) if hopper_fp8
                                                                      else 2.0)
        assert instance_costs(bf16, gb300, ep).dispatch_bytes == 2.0
    # without EP Hopper's block FP8 runs Triton (EP size 1), which quantises before plain DP's gather
    assert instance_costs(fp8_block, h200, Topology.parse("TP2DP4")).dispatch_bytes == pytest.approx(1 + 4 / 128)
    assert dispatch_bytes(WeightFormat.INT4, "allgather_reducescatter", expert_parallel=True,
                          architecture="blackwell") == 2.0  # weight-only: BF16 activations


def test_plain_dp_gathers_and_reduce_scatters_over_the_dp_group(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    cal = perf.calibration.model_copy(update={"allreduce_latency_us": 0.0})
    tokens = 512
    for name in ("TP2DP8", "TP4DP4", "TP1DP8"):
        topo = Topology.parse(name)
        costs = instance_costs(reference, gb300, topo)
        # every GPU receives its dp - 1 peers' tokens (NVFP4) and sends their BF16 outputs back
        wire = (topo.dp - 1) * tokens * costs.hidden_size * (0.5625 + 2)
        assert gather_scatter_s(tokens, topo.dp, costs, cal) == pytest.approx(
            wire / (costs.ep_link_bytes_s * cal.allreduce_bw_efficiency))
        # what it replaced, a BF16 all-reduce of every DP rank's tokens over TP x DP, moved 1.5-2.0x the bytes
        old = allreduce_s(tokens * costs.hidden_size * 2 * topo.dp, topo.ep_size, costs.ep_link_bytes_s, cal)
        n = topo.ep_size
        assert old / gather_scatter_s(tokens, topo.dp, costs, cal) == pytest.approx(
            2 * (n - 1) / n * 2 * topo.dp / ((topo.dp - 1) * (0.5625 + 2)))
        assert 1.5 < old / gather_scatter_s(tokens, topo.dp, costs, cal) < 2.0
        # a layer's TP all-reduces are unchanged beside it
        moe_layers = 3
        tp_only = pass_comm(tokens, 4, 0, costs, cal).allreduce_s
        assert pass_comm(tokens, 4, moe_layers, costs, cal).allreduce_s == pytest.approx(
            tp_only + moe_layers * gather_scatter_s(tokens, topo.dp, costs, cal))
    # one DP rank: nothing to gather
    assert gather_scatter_s(tokens, 1, instance_costs(reference, gb300, Topology.parse("TP8")), cal) == 0.0
