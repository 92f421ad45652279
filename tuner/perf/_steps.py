"""One engine step on one GPU: a decode step (with MTP drafting), a prefill chunk, or both at once (aggregated).

step = max(bytes read / (HBM x eff), FLOPs / (peak x eff)) + visible communication + kernel-latency floor
       + step overhead (+ MTP draft passes).

With expert parallelism every term that depends on routed tokens is taken at the busiest EP rank
(`tuner/perf/_experts.py`). A mixed step (vLLM's chunked prefill in an aggregated instance) reads the weights
once for its decode tokens and its prefill chunk together.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from tuner.hardware import GpuSpec
from tuner.perf._calibration import Calibration
from tuner.perf._comm import pass_comm
from tuner.perf._costs import FlopsByDtype, InstanceCosts, PassCosts
from tuner.perf._experts import busiest_rank_factor

DBO_DECODE_THRESHOLD = 32  # vLLM ParallelConfig.dbo_decode_token_threshold (default)
DBO_PREFILL_THRESHOLD = 512  # vLLM ParallelConfig.dbo_prefill_token_threshold (default)


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """Where the time of one decode step goes, per GPU (milliseconds and bytes).

    Expert bytes stream at `moe_gemm_efficiency` of the HBM rate other weights reach (grouped GEMM kernels).
    """

    requests_per_rank: float
    tokens_per_request: int  # verified per step: 1 + MTP depth
    accepted_tokens: float  # expected tokens a request gains per step: 1 + sum a^i
    weight_bytes: float  # non-expert shard + lm_head
    expert_bytes: float  # local experts the batch activates (busiest EP rank)
    kv_bytes: float
    state_bytes: float  # GDN state read + written
    memory_ms: float
    compute_ms: float
    comm_ms: float  # what the step waits for (after dual-batch overlap)
    overhead_ms: float
    draft_ms: float  # MTP draft passes (their own roofline, comm and overhead)
    ep_load_factor: float = 1.0  # busiest EP rank's routed tokens over the mean
    requests_ms: float = 0.0  # request_step_us x the rank's running requests

    @property
    def bytes_read(self) -> float:
        return self.weight_bytes + self.expert_bytes + self.kv_bytes + self.state_bytes

    @property
    def step_ms(self) -> float:
        return max(self.memory_ms, self.compute_ms) + self.comm_ms + self.overhead_ms + self.requests_ms + self.draft_ms

    @property
    def itl_ms(self) -> float:
        return self.step_ms / self.accepted_tokens


@dataclass(frozen=True, slots=True)
class PrefillStep:
    """One chunked-prefill step of `tokens` tokens per DP rank, per GPU."""

    tokens: float
    bytes_read: float
    flops: float  # time-equivalent: expert FLOPs weighted by 1 / moe_gemm_efficiency
    memory_ms: float
    compute_ms: float
    comm_ms: float
    overhead_ms: float
    ep_load_factor: float = 1.0

    @property
    def step_ms(self) -> float:
        return max(self.memory_ms, self.compute_ms) + self.comm_ms + self.overhead_ms


@dataclass(frozen=True, slots=True)
class MixedStep:
    """One aggregated step: `decode_requests` decoding requests plus a prefill chunk of `chunk_tokens`."""

    decode_requests: float
    chunk_tokens: float
    memory_ms: float
    compute_ms: float
    comm_ms: float
    overhead_ms: float
    draft_ms: float
    ep_load_factor: float = 1.0
    attention_ms: float = 0.0  # with a chunk: the attention kernels' own roofline (decode KV vs chunk attention)
    requests_ms: float = 0.0  # request_step_us x the rank's decoding requests

    @property
    def step_ms(self) -> float:
        return (max(self.memory_ms, self.compute_ms) + self.attention_ms + self.comm_ms + self.overhead_ms
                + self.requests_ms + self.draft_ms)


@functools.lru_cache(maxsize=256)
def accepted_tokens(depth: int, acceptance: float) -> float:
    """Expected tokens per step with `depth` drafts, each accepted with `acceptance` given the previous was
    (cached: every step of a sweep asks for the same few)."""
    return 1.0 + sum(acceptance**i for i in range(1, depth + 1))


def ep_load_factor(costs: InstanceCosts, cal: Calibration, tokens_ep: float) -> float:
    """Busiest EP rank over the mean for `tokens_ep` tokens in the EP group; 1 when experts are TP-sharded."""
    if not costs.expert_parallel:
        return 1.0
    return busiest_rank_factor(tokens_ep, num_experts=costs.num_experts, experts_per_token=costs.experts_per_token,
                               ep_size=costs.ep_size, redundant_experts=costs.redundant_experts, cal=cal)


def attended_context(p: PassCosts, context: float, prompt_tokens: int | None = None) -> float:
    """Context tokens the full attention reads per query: all of them, or DSA's top-k.

    `prompt_tokens` marks a causal prefill whose queries see 0..prompt tokens (mean `context`): the mean of
    min(position, k) over the prompt is k - k^2 / (2 prompt) once the prompt is longer than k.
    """
    k = p.sparse_topk
    if not k:
        return context
    if prompt_tokens is None or prompt_tokens <= k:
        return min(context, k)
    return k - k * k / (2.0 * prompt_tokens)


def _pass_flops(p: PassCosts, costs: InstanceCosts, tokens_rank: float, tokens_ep: float, context: float,
                logits_tokens: float, load: float = 1.0, moe_efficiency: float = 1.0,
                prompt_tokens: int | None = None) -> FlopsByDtype:
    """FLOPs of one pass on one GPU; expert FLOPs are weighted by 1 / moe_efficiency (they run slower).

    The DSA indexer's logits (FP8, every context token) join the FP8 FLOPs; the attention itself reads only
    the attended context (`attended_context`)."""
    # FlopsByDtype.scaled of the dense, expert and head FLOPs, summed per dtype, written out: the hottest line of
    # a sweep (the same products and sums, in the same order, without three intermediate objects)
    dense, experts, head = p.dense_flops_per_token, p.expert_flops_per_token, costs.lm_head_flops_per_token
    e = tokens_ep * load / costs.ep_size / moe_efficiency
    window = min(context, costs.sliding_window) if costs.sliding_window else 0.0
    attended = p.sparse_topk if p.sparse_math_all_slots else attended_context(p, context, prompt_tokens)
    mixer = tokens_rank * (p.attn_flops_per_token_ctx * attended + p.window_attn_flops_per_token_ctx * window
                           + p.gdn_flops_per_token)
    index = tokens_rank * p.index_flops_per_token_ctx * context
    return FlopsByDtype(dense.bf16 * tokens_rank + experts.bf16 * e + head.bf16 * logits_tokens,
                        dense.fp8 * tokens_rank + experts.fp8 * e + head.fp8 * logits_tokens + index,
                        dense.fp4 * tokens_rank + experts.fp4 * e + head.fp4 * logits_tokens, mixer)


def prefill_efficiency(cal: Calibration, step_tokens: float) -> float:
    """The share of the peak a step's prefill GEMMs reach with `step_tokens` tokens per rank in them: a GEMM pays
    about `prefill_half_tokens` tokens' work per step beyond its own (its last partial wave of tiles, prologue and
    epilogue), so efficiency grows with the step, n / (n + half), toward `prefill_flop_efficiency`."""
    half = cal.prefill_half_tokens
    if half <= 0.0 or step_tokens <= 0.0:
        return cal.prefill_flop_efficiency
    return cal.prefill_flop_efficiency * step_tokens / (step_tokens + half)


def _sum(a: FlopsByDtype, b: FlopsByDtype) -> FlopsByDtype:
    return FlopsByDtype(a.bf16 + b.bf16, a.fp8 + b.fp8, a.fp4 + b.fp4, a.attn + b.attn)


def _kv_read(p: PassCosts, costs: InstanceCosts, context: float, prompt_tokens: int | None = None) -> float:
    """KV bytes one query's attention reads: the attended context (DSA: top-k) plus the indexer's K cache."""
    window = min(context, costs.sliding_window) if costs.sliding_window else 0.0
    return (p.kv_bytes_per_token * attended_context(p, context, prompt_tokens)
            + p.window_kv_bytes_per_token * window + p.index_kv_bytes_per_token * context)


def _tokens_ep(costs: InstanceCosts, rank_tokens: float, group_tokens: float) -> float:
    """Tokens the experts of one GPU see: the whole EP/DP group's with EP or DP, else the rank's own."""
    return group_tokens if costs.expert_parallel or costs.dp > 1 else rank_tokens


def _fixed_ms(cal: Calibration, p: PassCosts) -> float:
    return cal.kernel_latency_us * 1e-3 * p.num_kernels


def _draft_pass_ms(costs: InstanceCosts, gpu: GpuSpec, cal: Calibration, requests_rank: float,
                   requests_group: float, context: float) -> float:
    """One MTP draft pass over the running requests: its own roofline, comm, kernels and sampling."""
    d = costs.draft
    assert d is not None
    hbm = gpu.hbm_bandwidth_tb_s * 1e12 * cal.hbm_efficiency
    requests_ep = _tokens_ep(costs, requests_rank, requests_group)
    load = ep_load_factor(costs, cal, requests_ep)
    d_bytes = (d.dense_bytes + costs.lm_head_bytes
               + d.expert_bytes * costs.expert_active_fraction(requests_ep * load) / cal.moe_gemm_efficiency
               + requests_rank * (_kv_read(d, costs, context) + 2 * d.state_bytes))
    d_flops = _pass_flops(d, costs, requests_rank, requests_ep, context, requests_rank, load, cal.moe_gemm_efficiency)
    compute_s = d_flops.seconds(gpu, cal.flop_efficiency, cal.fp8_gemm_efficiency)
    comm = pass_comm(requests_rank, d.num_layers, d.num_moe_layers, costs, cal, load)
    return (max(d_bytes / hbm, compute_s) * 1e3
            + comm.visible_s(costs, cal, compute_s, requests_rank, DBO_DECODE_THRESHOLD) * 1e3
            + _fixed_ms(cal, d) + cal.draft_overhead_ms)


def request_step_us(cal: Calibration, stream_interval: int) -> float:
    """Host time per running request per step: the streamed share is paid once per `stream_interval` tokens."""
    share = cal.streamed_request_share
    return cal.request_step_us * (1.0 - share + share / stream_interval)


def decode_step(costs: InstanceCosts, gpu: GpuSpec, cal: Calibration, *, requests_per_rank: float,
                total_requests: float, context_tokens: float, mtp_depth: int, stream_interval: int = 1) -> DecodeStep:
    """One decode step with `requests_per_rank` running requests on each busy DP rank."""
    hbm = gpu.hbm_bandwidth_tb_s * 1e12 * cal.hbm_efficiency
    q = 1 + mtp_depth
    t = costs.target
    tokens_rank = requests_per_rank * q
    tokens_ep = _tokens_ep(costs, tokens_rank, total_requests * q)
    load = ep_load_factor(costs, cal, tokens_ep)
    weights = t.dense_bytes + costs.lm_head_bytes
    experts = t.expert_bytes * costs.expert_active_fraction(tokens_ep * load)
    kv = requests_per_rank * _kv_read(t, costs, context_tokens)
    state = requests_per_rank * t.state_bytes * (1 + q)  # read once, one state written per verified token
    compute_s = _pass_flops(t, costs, tokens_rank, tokens_ep, context_tokens, tokens_rank, load,
                            cal.moe_gemm_efficiency).seconds(
        gpu, cal.flop_efficiency, cal.fp8_gemm_efficiency)
    comm = pass_comm(tokens_rank, t.num_layers, t.num_moe_layers, costs, cal, load)
    draft_ms = 0.0
    if mtp_depth and costs.draft is not None and requests_per_rank > 0:
        draft_ms = mtp_depth * _draft_pass_ms(costs, gpu, cal, requests_per_rank, total_requests, context_tokens)
    return DecodeStep(
        requests_per_rank=requests_per_rank, tokens_per_request=q,
        accepted_tokens=accepted_tokens(mtp_depth, cal.mtp_acceptance), weight_bytes=weights,
        expert_bytes=experts, kv_bytes=kv, state_bytes=state,
        memory_ms=(weights + experts / cal.moe_gemm_efficiency + kv + state) / hbm * 1e3, compute_ms=compute_s * 1e3,
        comm_ms=comm.visible_s(costs, cal, compute_s, tokens_rank, DBO_DECODE_THRESHOLD) * 1e3,
        overhead_ms=cal.step_overhead_ms + _fixed_ms(cal, t), draft_ms=draft_ms, ep_load_factor=load,
        requests_ms=request_step_us(cal, stream_interval) * 1e-3 * requests_per_rank)


@dataclass(frozen=True, slots=True)
class _ChunkWork:
    """Bytes and FLOPs a prefill chunk adds to a step (beyond the weights every step reads)."""

    expert_tokens_ep: float
    bytes_read: float  # KV written, KV and state read for the prompts, drafter weights and KV
    flops: FlopsByDtype
    extra_layers_kernels: int  # the MTP drafter also runs over the prompt


def _chunk_work(costs: InstanceCosts, tokens_rank: float, busy_ranks: int, prompt_tokens: int,
                load: float, moe_efficiency: float) -> _ChunkWork:
    t = costs.target
    tokens_ep = _tokens_ep(costs, tokens_rank, tokens_rank * busy_ranks)
    prompts = tokens_rank / prompt_tokens  # requests whose prefill this chunk advances (fractional)
    mean_context = prompt_tokens / 2  # causal attention: a prompt token sees half the prompt on average
    bytes_read = (tokens_rank * (t.kv_bytes_per_token + t.window_kv_bytes_per_token + t.index_kv_bytes_per_token)
                  + prompts * _kv_read(t, costs, mean_context, prompt_tokens) + 2 * prompts * t.state_bytes)
    flops = _pass_flops(t, costs, tokens_rank, tokens_ep, mean_context, prompts, load, moe_efficiency,
                        prompt_tokens)
    kernels = 0
    if costs.draft is not None:  # with MTP on, the drafter also runs over the prompt (its KV is needed too)
        d = costs.draft
        bytes_read += d.dense_bytes + tokens_rank * d.kv_bytes_per_token
        flops = _sum(flops, _pass_flops(d, costs, tokens_rank, tokens_ep, mean_context, prompts, load,
                                        moe_efficiency, prompt_tokens))
        kernels = d.num_kernels
    return _ChunkWork(expert_tokens_ep=tokens_ep, bytes_read=bytes_read, flops=flops, extra_layers_kernels=kernels)


def prefill_step(costs: InstanceCosts, gpu: GpuSpec, cal: Calibration, *, tokens_per_rank: float,
                 busy_ranks: int, prompt_tokens: int) -> PrefillStep:
    """One chunk of `tokens_per_rank` prompt tokens (from prompts of `prompt_tokens`) on each busy DP rank."""
    hbm = gpu.hbm_bandwidth_tb_s * 1e12 * cal.hbm_efficiency
    t = costs.target
    tokens_ep = _tokens_ep(costs, tokens_per_rank, tokens_per_rank * busy_ranks)
    load = ep_load_factor(costs, cal, tokens_ep)
    work = _chunk_work(costs, tokens_per_rank, busy_ranks, prompt_tokens, load, cal.moe_gemm_efficiency)
    active = costs.expert_active_fraction(tokens_ep * load)
    expert_bytes = t.expert_bytes * active + (costs.draft.expert_bytes * active if costs.draft else 0.0)
    bytes_read = t.dense_bytes + costs.lm_head_bytes + expert_bytes + work.bytes_read
    compute_s = work.flops.seconds(gpu, prefill_efficiency(cal, tokens_per_rank), cal.fp8_gemm_efficiency,
                                   cal.attention_flop_efficiency or cal.prefill_flop_efficiency)
    comm = pass_comm(tokens_per_rank, t.num_layers, t.num_moe_layers, costs, cal, load)
    comm_s = comm.visible_s(costs, cal, compute_s, tokens_per_rank, DBO_PREFILL_THRESHOLD)
    if costs.draft is not None:
        d = costs.draft
        comm_s += pass_comm(tokens_per_rank, d.num_layers, d.num_moe_layers, costs, cal, load).total_s
    return PrefillStep(
        tokens=tokens_per_rank, bytes_read=bytes_read, flops=work.flops.total,
        memory_ms=(bytes_read + expert_bytes * (1 / cal.moe_gemm_efficiency - 1)) / hbm * 1e3,
        compute_ms=compute_s * 1e3, comm_ms=comm_s * 1e3,
        overhead_ms=cal.step_overhead_ms + cal.kernel_latency_us * 1e-3 * (t.num_kernels + work.extra_layers_kernels),
        ep_load_factor=load)


def mixed_step(costs: InstanceCosts, gpu: GpuSpec, cal: Calibration, *, decode_requests_per_rank: float,
               total_decode_requests: float, context_tokens: float, mtp_depth: int, chunk_tokens_per_rank: float,
               busy_ranks: int, prompt_tokens: int, stream_interval: int = 1) -> MixedStep:
    """Decode tokens and a prefill chunk in one forward pass (vLLM chunked prefill, aggregated serving).

    Weights and activated experts are read once for both; the decode part's FLOPs run at `flop_efficiency`, the
    chunk's at `prefill_flop_efficiency`; collectives carry every token of the step.
    """
    hbm = gpu.hbm_bandwidth_tb_s * 1e12 * cal.hbm_efficiency
    q = 1 + mtp_depth
    t = costs.target
    d_rank = decode_requests_per_rank * q
    c = chunk_tokens_per_rank
    tokens_ep = _tokens_ep(costs, d_rank + c, total_decode_requests * q + c * busy_ranks)
    load = ep_load_factor(costs, cal, tokens_ep)
    work = _chunk_work(costs, c, busy_ranks, prompt_tokens, load, cal.moe_gemm_efficiency) if c > 0 else None
    experts = t.expert_bytes * costs.expert_active_fraction(tokens_ep * load)
    decode_kv = decode_requests_per_rank * _kv_read(t, costs, context_tokens)
    bytes_read = (t.dense_bytes + costs.lm_head_bytes + experts + decode_requests_per_rank * t.state_bytes * (1 + q)
                  + (work.bytes_read if work else decode_kv))
    dec_ep = _tokens_ep(costs, d_rank, total_decode_requests * q)
    compute_s = _pass_flops(t, costs, d_rank, dec_ep, context_tokens, d_rank, load,
                            cal.moe_gemm_efficiency).seconds(gpu, cal.flop_efficiency, cal.fp8_gemm_efficiency)
    attention_ms = 0.0
    if work is not None:
        # The attention kernels run apart from the GEMMs: the decode requests' KV reads cannot hide under the
        # chunk's GEMM FLOPs (one roofline per kernel, not one for the whole step). The attention phase is
        # its own roofline: the decode KV bytes vs the chunk's attention FLOPs; the GEMM phase has the rest.
        # Where the backend runs the chunk's and the decodes' attention as two kernels (`split_attention`),
        # the two add.
        compute_s += replace(work.flops, attn=0.0).seconds(gpu, prefill_efficiency(cal, d_rank + c),
                                                           cal.fp8_gemm_efficiency)
        chunk_attn_s = FlopsByDtype(attn=work.flops.attn).seconds(gpu, cal.prefill_flop_efficiency,
                                                                  attention_efficiency=cal.attention_flop_efficiency)
        decode_attn_s = decode_kv / hbm
        attention_ms = (decode_attn_s + chunk_attn_s if t.split_attention
                        else max(decode_attn_s, chunk_attn_s)) * 1e3
    comm = pass_comm(d_rank + c, t.num_layers, t.num_moe_layers, costs, cal, load)
    threshold = DBO_PREFILL_THRESHOLD if c > 0 else DBO_DECODE_THRESHOLD
    draft_ms = 0.0
    if mtp_depth and costs.draft is not None and decode_requests_per_rank > 0:
        draft_ms = mtp_depth * _draft_pass_ms(costs, gpu, cal, decode_requests_per_rank, total_decode_requests,
                                              context_tokens)
    kernels = t.num_kernels + (work.extra_layers_kernels if work else 0)
    return MixedStep(
        decode_requests=decode_requests_per_rank, chunk_tokens=c,
        memory_ms=(bytes_read + experts * (1 / cal.moe_gemm_efficiency - 1)) / hbm * 1e3,
        compute_ms=compute_s * 1e3, comm_ms=comm.visible_s(costs, cal, compute_s, d_rank + c, threshold) * 1e3,
        overhead_ms=cal.step_overhead_ms + cal.kernel_latency_us * 1e-3 * kernels, draft_ms=draft_ms,
        ep_load_factor=load, attention_ms=attention_ms,
        requests_ms=request_step_us(cal, stream_interval) * 1e-3 * decode_requests_per_rank)
