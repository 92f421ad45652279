"""Weight bytes each GPU holds under a topology (vLLM's sharding of every tensor kind)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tuner.models import ModelSpec, Sharding
from tuner.topology import Topology

VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE


@dataclass(frozen=True)
class WeightsPerGpu:
    non_expert_bytes: int
    expert_bytes: int
    mtp_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.non_expert_bytes + self.expert_bytes + self.mtp_bytes


def local_experts(num_experts: int, topo: Topology) -> int:
    """Physical experts on the fullest EP rank.

    vllm/model_executor/layers/fused_moe/layer.py determine_expert_map: base = E // EP and the first E % EP ranks
    hold one more. With EPLB the E + R physical experts (R redundant copies of hot experts) are split the same way
    (EPLB requires E + R to be a multiple of EP, so every rank holds (E + R) / EP).
    """
    physical = num_experts + topo.num_redundant_experts
    return -(-physical // topo.ep_size)


def shard_fraction(sharding: Sharding, model: ModelSpec, topo: Topology) -> float:
    """Fraction of a tensor's bytes that lands on the fullest GPU."""
    tp = topo.tp
    match sharding:
        case Sharding.SPLIT:
            return 1 / tp
        case Sharding.REPLICATED:
            return 1.0
        case Sharding.KV_HEADS:
            kv = model.attention.num_kv_heads if model.attention else tp
            return max(1, kv // tp) / kv
        case Sharding.VOCAB:
            padded = -(-model.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
            return -(-padded // tp) / model.vocab_size
        case Sharding.EXPERTS:
            if topo.ep and model.moe:
                return local_experts(model.moe.num_experts, topo) / model.moe.num_experts
            return 1 / topo.ep_size  # MoE tensor parallel over TP x DP
    raise AssertionError(sharding)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class Mxfp4Backend(StrEnum):
    """vLLM's MXFP4 MoE kernels (fused_moe/oracle/mxfp4.py Mxfp4MoeBackend): each allocates padded experts."""

    MARLIN = "marlin"  # weight-only, dequantised to BF16; any GPU
    TRITON = "triton"  # OpenAI triton_kernels (SM90-SM100)
    FLASHINFER_TRTLLM = "flashinfer-trtllm"  # SM100
    FLASHINFER_CUTLASS = "flashinfer-cutlass"


# (intermediate, hidden) multiples each backend rounds MXFP4 experts up to, as vLLM 0.32's
# `mxfp4_round_up_hidden_size_and_intermediate_size` does (tests/memory/test_mxfp4_padding_matches_vllm.py runs it)
_MXFP4_ALIGN = {Mxfp4Backend.MARLIN: (128, 256), Mxfp4Backend.TRITON: (64, 1),
                Mxfp4Backend.FLASHINFER_TRTLLM: (128, 256), Mxfp4Backend.FLASHINFER_CUTLASS: (128, 128)}
# What vLLM picks for gpt-oss without overrides: FlashInfer TRT-LLM on data-centre Blackwell, the Triton kernels on
# Hopper. Before triton_kernels became a vLLM dependency (vLLM PRs #27370, #28788; 0.12) a stock install on Hopper
# fell back to Marlin: benchmarks/fidelity.py replays such rows with MARLIN (docs/perf-model.md, gpt-oss).
DEFAULT_MXFP4_BACKEND = {"blackwell": Mxfp4Backend.FLASHINFER_TRTLLM, "hopper": Mxfp4Backend.TRITON}


def mxfp4_backend(architecture: str | None, chosen: Mxfp4Backend | None = None) -> Mxfp4Backend | None:
    """The backend whose padding applies: the chosen one, else vLLM's default for the GPU (None: no padding
    modelled, e.g. the CPU build)."""
    return chosen if chosen is not None else DEFAULT_MXFP4_BACKEND.get(architecture or "")


def mxfp4_padded_sizes(backend: Mxfp4Backend, hidden: int, intermediate: int) -> tuple[int, int]:
    """(hidden, per-partition intermediate) as `backend` allocates them: gpt-oss's 2880 x 2880 becomes 3072 x 2944
    on FlashInfer TRT-LLM and Marlin, stays 2880 x 2880 on Triton."""
    align_i, align_h = _MXFP4_ALIGN[backend]
    return _round_up(hidden, align_h), _round_up(intermediate, align_i)


def mxfp4_padding_factor(model: ModelSpec, topo: Topology, backend: Mxfp4Backend | None) -> float:
    """Bytes vLLM allocates for MXFP4 experts over the checkpoint's bytes (quantization/mxfp4.py create_weights):
    w13 [2I, H/2 + H/32], w2 [H, I/2 + I/32] and the bf16 biases, at the sizes `mxfp4_padded_sizes` gives.
    Marlin on gpt-oss-120b: x1.090, 65.9 GiB on one GPU, as vLLM 0.10.1 and 0.11.2 logged (65.97 GiB)."""
    if model.moe is None or not model.quantization.startswith("mxfp4") or backend is None:
        return 1.0
    hidden = model.hidden_size
    inter = model.moe.expert_intermediate_size if topo.ep else model.moe.expert_intermediate_size // topo.ep_size

    def per_expert(i: int, h: int) -> float:
        return 3 * i * h * (1 / 2 + 1 / 32) + 2 * (2 * i + h)

    padded_h, padded_i = mxfp4_padded_sizes(backend, hidden, inter)
    return per_expert(padded_i, padded_h) / per_expert(inter, hidden)


def weights_per_gpu(model: ModelSpec, topo: Topology, mxfp4: Mxfp4Backend | None = None) -> WeightsPerGpu:
    """Bytes on the fullest GPU; `mxfp4` (see `mxfp4_backend`) applies the padding its MoE kernels add."""
    non_expert = expert = mtp = 0.0
    for (sharding, is_mtp), nbytes in model.bytes_by_sharding.items():
        share = nbytes * shard_fraction(sharding, model, topo)
        if is_mtp:
            mtp += share
        elif sharding is Sharding.EXPERTS:
            expert += share
        else:
            non_expert += share
    expert *= mxfp4_padding_factor(model, topo, mxfp4)
    return WeightsPerGpu(non_expert_bytes=round(non_expert), expert_bytes=round(expert),
                         mtp_bytes=round(mtp) if topo.mtp else 0)
