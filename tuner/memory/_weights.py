"""Weight bytes each GPU holds under a topology (vLLM's sharding of every tensor kind)."""

from __future__ import annotations

from dataclasses import dataclass

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


# What vLLM rounds MXFP4 experts' (intermediate, hidden) sizes to, per GPU architecture's default backend.
_MXFP4_ALIGN = {"blackwell": (128, 256), "hopper": (64, 1)}


def mxfp4_padded_sizes(architecture: str, hidden: int, intermediate: int) -> tuple[int, int]:
    """(hidden, per-partition intermediate) as the default MXFP4 MoE backend allocates them, in the order of vLLM
    0.32's `mxfp4_round_up_hidden_size_and_intermediate_size` (fused_moe/oracle/mxfp4.py): gpt-oss's first choice
    on data-centre Blackwell, FlashInfer TRT-LLM, rounds I to 128 and H to 256 (gpt-oss 2880 -> 2944 and 3072);
    the Triton kernels on Hopper round I to 64. (Older releases differ: vLLM 0.10 rounded both to 256 on
    Blackwell, and on Hopper fell back to Marlin, I to 128 and H to 256, when triton_kernels was not installed.)"""
    align_i, align_h = _MXFP4_ALIGN[architecture]
    return _round_up(hidden, align_h), _round_up(intermediate, align_i)


def mxfp4_padding_factor(model: ModelSpec, topo: Topology, architecture: str | None) -> float:
    """Bytes vLLM allocates for MXFP4 experts over the checkpoint's bytes (quantization/mxfp4.py create_weights):
    w13 [2I, H/2 + H/32], w2 [H, I/2 + I/32] and the bf16 biases, at the sizes `mxfp4_padded_sizes` gives."""
    if model.moe is None or not model.quantization.startswith("mxfp4") or architecture not in _MXFP4_ALIGN:
        return 1.0
    hidden = model.hidden_size
    inter = model.moe.expert_intermediate_size if topo.ep else model.moe.expert_intermediate_size // topo.ep_size

    def per_expert(i: int, h: int) -> float:
        return 3 * i * h * (1 / 2 + 1 / 32) + 2 * (2 * i + h)

    padded_h, padded_i = mxfp4_padded_sizes(architecture, hidden, inter)
    return per_expert(padded_i, padded_h) / per_expert(inter, hidden)


def weights_per_gpu(model: ModelSpec, topo: Topology, architecture: str | None = None) -> WeightsPerGpu:
    """Bytes on the fullest GPU; `architecture` applies the padding a GPU's MoE kernels add (MXFP4)."""
    non_expert = expert = mtp = 0.0
    for (sharding, is_mtp), nbytes in model.bytes_by_sharding.items():
        share = nbytes * shard_fraction(sharding, model, topo)
        if is_mtp:
            mtp += share
        elif sharding is Sharding.EXPERTS:
            expert += share
        else:
            non_expert += share
    expert *= mxfp4_padding_factor(model, topo, architecture)
    return WeightsPerGpu(non_expert_bytes=round(non_expert), expert_bytes=round(expert),
                         mtp_bytes=round(mtp) if topo.mtp else 0)
