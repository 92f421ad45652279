"""Collective costs: ring all-reduce for tensor parallelism, all-to-all dispatch/combine for experts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.perf._calibration import Calibration
from tuner.perf._costs import ACT_BYTES, InstanceCosts


@dataclass(frozen=True, slots=True)
class PassComm:
    """Communication of one forward pass, seconds: all-reduces (never overlapped) and EP all-to-alls."""

    allreduce_s: float
    alltoall_s: float

    @property
    def total_s(self) -> float:
        return self.allreduce_s + self.alltoall_s

    def visible_s(self, costs: InstanceCosts, cal: Calibration, compute_s: float, tokens_per_rank: float,
                  threshold_tokens: int) -> float:
        """What the step waits for: with dual-batch overlap (and enough tokens to split into two micro-batches,
        vLLM's dbo_*_token_threshold) one micro-batch's all-to-all runs under the other's compute. While the
        all-to-all kernels hold a share s of the SMs (`a2a_sm_share`: DeepEP's normal kernels), the compute they
        overlap runs on the rest, so with comm a and compute c the step pays max(a, c + s a): up to
        `dbo_overlap` x (1 - s) of the all-to-all hides, never more than the compute."""
        if not costs.dbo or tokens_per_rank <= threshold_tokens:
            return self.total_s
        hidden = min(self.alltoall_s * cal.dbo_overlap * (1.0 - costs.a2a_sm_share), compute_s)
        return self.total_s - hidden


def allreduce_s(message_bytes: float, group: int, link_bytes_s: float, cal: Calibration) -> float:
    """One all-reduce: latency per doubling of the group (tree / NVLS stages) plus 2(n-1)/n of the message."""
    if group <= 1:
        return 0.0
    wire = 2.0 * (group - 1) / group * message_bytes
    stages = math.ceil(math.log2(group))
    return cal.allreduce_latency_us * 1e-6 * stages + wire / (link_bytes_s * cal.allreduce_bw_efficiency)


def _scale_out_s(rdma_bytes: float, nvlink_bytes: float, costs: InstanceCosts, cal: Calibration) -> float:
    """A collective with an RDMA leg (this GPU's NIC share) and an NVLink leg that run at once (DeepEP forwards
    over NVLink while RDMA traffic arrives; NCCL's rings use both): the slower leg sets the time."""
    return max(rdma_bytes / (costs.scale_out_bytes_s * cal.scale_out_bw_efficiency),
               nvlink_bytes / (costs.nvlink_bytes_s * cal.alltoall_bw_efficiency))


def _gathered_across_domains_s(tokens_per_rank: float, group: int, costs: InstanceCosts, cal: Calibration) -> float:
    """All-gatherv of every rank's tokens (dispatch dtype) + reduce-scatter of the BF16 outputs over a group that
    spans `ep_domains` NVLink domains: each domain imports the other domains' tokens once over its NICs
    ((domains - 1) x tokens_per_rank per GPU's NIC, what NCCL's bandwidth-optimal rings move), and every GPU
    receives the other group - 1 ranks' tokens over NVLink or the network."""
    per_rank = tokens_per_rank * costs.hidden_size * (costs.dispatch_bytes + ACT_BYTES)
    rdma = (costs.ep_domains - 1) * per_rank
    nvlink = (group - costs.ep_domains) * per_rank
    stages = math.ceil(math.log2(group))
    return 2 * cal.allreduce_latency_us * 1e-6 * stages + _scale_out_s(rdma, nvlink, costs, cal)


def gather_scatter_s(tokens_per_rank: float, group: int, costs: InstanceCosts, cal: Calibration) -> float:
    """Plain DP's MoE collectives (no EP): every DP rank's tokens all-gathered at the dispatch dtype, the BF16
    outputs reduce-scattered back, over the DP group (vLLM's naive DP/EP prepare/finalize, the same as EP's
    default backend; the TP all-reduce after it is the layer's own). Each GPU receives its group - 1 peers'
    tokens and sends them their outputs: 0.5-0.65x the bytes of the BF16 all-reduce over TP x DP priced before
    for NVFP4 experts (tests/perf/test_wire.py)."""
    if group <= 1:
        return 0.0
    if costs.ep_domains > 1:
        return _gathered_across_domains_s(tokens_per_rank, group, costs, cal)
    wire = (group - 1) * tokens_per_rank * costs.hidden_size * (costs.dispatch_bytes + ACT_BYTES)
    stages = math.ceil(math.log2(group))
    return 2 * cal.allreduce_latency_us * 1e-6 * stages + wire / (costs.ep_link_bytes_s * cal.allreduce_bw_efficiency)


def alltoall_pair_s(tokens_per_gpu: float, costs: InstanceCosts, cal: Calibration, load_factor: float = 1.0) -> float:
    """EP dispatch (at the experts' activation dtype, tuner/perf/_wire.py) + combine (BF16) of one MoE layer.

    A routed backend (DeepEP, FlashInfer's NVLink all-to-alls) sends a token to the ranks holding its experts; the
    busiest rank receives `load_factor` times the mean share (expert load imbalance), and every rank waits for it.
    vLLM's default, allgather_reducescatter, gathers every token on every EP rank (quantised, as vLLM's naive
    DP/EP prepare step does before its all_gatherv) and reduce-scatters the outputs: (EP - 1) remote ranks per
    token, whatever the routing, so 1 / (1 - (1 - 1/EP)^k) times the routed volume.
    """
    if costs.ep_domains > 1:
        return cross_domain_alltoall_s(tokens_per_gpu, costs, cal, load_factor)
    load = load_factor if costs.a2a_routed else 1.0
    wire = tokens_per_gpu * costs.hidden_size * costs.a2a_remote_ranks * (costs.dispatch_bytes + ACT_BYTES) * load
    return 2 * cal.alltoall_latency_us * 1e-6 + wire / (costs.ep_link_bytes_s * cal.alltoall_bw_efficiency)


def cross_domain_alltoall_s(tokens_per_gpu: float, costs: InstanceCosts, cal: Calibration,
                            load_factor: float = 1.0) -> float:
    """EP dispatch + combine of one MoE layer when the EP group spans several NVLink domains (hosts), per backend.

    With G EP ranks in H domains of L, k experts per token, B bytes per token (dispatch dtype + BF16 combine):
    - deepep_high_throughput (DeepEP's normal internode kernels, csrc/kernels/internode.cu): a token crosses the
      network once per destination domain, to the same-index GPU there, which forwards it over NVLink to the ranks
      holding its experts. RDMA: (H - 1)(1 - (1 - 1/H)^k) copies per token; NVLink: one per remote rank.
    - deepep_low_latency (csrc/kernels/internode_ll.cu) and any other routed kernel: one message per (token,
      expert) straight to the expert's rank, no deduplication by rank or host: k (G - L) / G copies over RDMA,
      k (L - 1) / G over NVLink (DeepEP's NVLink path for same-host peers).
    - allgather_reducescatter: every token gathered on every rank (`_gathered_across_domains_s`).
    The busiest rank receives `load_factor` times the mean (routed backends); the legs overlap (`_scale_out_s`).
    """
    group = costs.ep_size
    if not costs.a2a_routed:
        return _gathered_across_domains_s(tokens_per_gpu, group, costs, cal)
    domains, local, k = costs.ep_domains, costs.ep_ranks_per_domain, costs.experts_per_token
    per_token = tokens_per_gpu * costs.hidden_size * (costs.dispatch_bytes + ACT_BYTES) * load_factor
    if costs.all2all_backend == "deepep_high_throughput":
        rdma = (domains - 1) * (1.0 - (1.0 - 1.0 / domains) ** k) * per_token
        nvlink = costs.a2a_remote_ranks * per_token
    else:
        rdma = k * (group - local) / group * per_token
        nvlink = k * (local - 1) / group * per_token
    return 2 * cal.alltoall_latency_us * 1e-6 + _scale_out_s(rdma, nvlink, costs, cal)


def pass_comm(tokens_per_rank: float, num_layers: int, num_moe_layers: int, costs: InstanceCosts,
              cal: Calibration, load_factor: float = 1.0) -> PassComm:
    """Communication of one forward pass over `num_layers` layers for `tokens_per_rank` tokens per DP rank.

    TP: two all-reduces per layer (after attention and after the MLP/MoE); TEP (EP with DP 1) keeps exactly
    this path. Experts over DP ranks with EP: an all-to-all dispatch + combine per MoE layer, each TP rank
    sending its 1/TP of the tokens. Experts tensor-parallel over TP x DP (no EP): the DP ranks' tokens are
    all-gathered and their outputs reduce-scattered over the DP group (`gather_scatter_s`).
    """
    message = tokens_per_rank * costs.hidden_size * ACT_BYTES
    reduce = 2 * num_layers * allreduce_s(message, costs.tp, costs.tp_link_bytes_s, cal)
    a2a = 0.0
    if num_moe_layers and costs.dp > 1:
        if costs.all2all:
            a2a = num_moe_layers * alltoall_pair_s(tokens_per_rank / costs.tp, costs, cal, load_factor)
        else:
            reduce += num_moe_layers * gather_scatter_s(tokens_per_rank, costs.dp, costs, cal)
    return PassComm(allreduce_s=reduce, alltoall_s=a2a)


def layer_comm_s(tokens_per_rank: float, num_layers: int, num_moe_layers: int, costs: InstanceCosts,
                 cal: Calibration) -> float:
    """Total communication of one pass without overlap (uniform expert load)."""
    return pass_comm(tokens_per_rank, num_layers, num_moe_layers, costs, cal).total_s
