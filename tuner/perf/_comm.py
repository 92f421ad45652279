"""Collective costs: ring all-reduce for tensor parallelism, all-to-all dispatch/combine for experts."""

from __future__ import annotations

import math

from tuner.perf._calibration import Calibration
from tuner.perf._costs import ACT_BYTES, DISPATCH_BYTES, InstanceCosts


def allreduce_s(message_bytes: float, group: int, link_bytes_s: float, cal: Calibration) -> float:
    """One all-reduce: latency per doubling of the group (tree / NVLS stages) plus 2(n-1)/n of the message."""
    if group <= 1:
        return 0.0
    wire = 2.0 * (group - 1) / group * message_bytes
    stages = math.ceil(math.log2(group))
    return cal.allreduce_latency_us * 1e-6 * stages + wire / (link_bytes_s * cal.allreduce_bw_efficiency)


def alltoall_pair_s(tokens_per_gpu: float, costs: InstanceCosts, cal: Calibration) -> float:
    """EP dispatch (FP8) + combine (BF16) of one MoE layer: tokens go to the ranks holding their experts."""
    wire = tokens_per_gpu * costs.hidden_size * costs.a2a_remote_ranks * (DISPATCH_BYTES + ACT_BYTES)
    return 2 * cal.alltoall_latency_us * 1e-6 + wire / (costs.ep_link_bytes_s * cal.alltoall_bw_efficiency)


def layer_comm_s(tokens_per_rank: float, num_layers: int, num_moe_layers: int, costs: InstanceCosts,
                 cal: Calibration) -> float:
    """Communication of one forward pass over `num_layers` layers for `tokens_per_rank` tokens per DP rank.

    TP: two all-reduces per layer (after attention and after the MLP/MoE). Experts over DP ranks with EP:
    an all-to-all dispatch + combine per MoE layer, each TP rank sending its 1/TP of the tokens. Experts
    tensor-parallel over TP x DP (no EP): the DP ranks' tokens are gathered and reduced like an all-reduce.
    """
    message = tokens_per_rank * costs.hidden_size * ACT_BYTES
    total = 2 * num_layers * allreduce_s(message, costs.tp, costs.tp_link_bytes_s, cal)
    if num_moe_layers and costs.dp > 1:
        if costs.expert_parallel:
            total += num_moe_layers * alltoall_pair_s(tokens_per_rank / costs.tp, costs, cal)
        else:
            total += num_moe_layers * allreduce_s(message * costs.dp, costs.ep_size, costs.ep_link_bytes_s, cal)
    return total
