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


def weights_per_gpu(model: ModelSpec, topo: Topology) -> WeightsPerGpu:
    non_expert = expert = mtp = 0.0
    for (sharding, is_mtp), nbytes in model.bytes_by_sharding.items():
        share = nbytes * shard_fraction(sharding, model, topo)
        if is_mtp:
            mtp += share
        elif sharding is Sharding.EXPERTS:
            expert += share
        else:
            non_expert += share
    return WeightsPerGpu(non_expert_bytes=round(non_expert), expert_bytes=round(expert),
                         mtp_bytes=round(mtp) if topo.mtp else 0)
