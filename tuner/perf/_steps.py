"""One engine step on one GPU: a decode step (with MTP drafting) or a prefill chunk, as a roofline.

step = max(bytes read / (HBM x eff), FLOPs / (peak x eff)) + communication + kernel-latency floor + step overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.hardware import GpuSpec
from tuner.perf._calibration import Calibration
from tuner.perf._comm import layer_comm_s
from tuner.perf._costs import FlopsByDtype, InstanceCosts, PassCosts


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """Where the time of one decode step goes, per GPU (milliseconds and bytes)."""

    requests_per_rank: float
    tokens_per_request: int  # verified per step: 1 + MTP depth
    accepted_tokens: float  # expected tokens a request gains per step: 1 + sum a^i
    weight_bytes: float  # non-expert shard + lm_head
    expert_bytes: float  # local experts the batch activates
    kv_bytes: float
    state_bytes: float  # GDN state read + written
    memory_ms: float
    compute_ms: float
    comm_ms: float
    overhead_ms: float
    draft_ms: float  # MTP draft passes (their own roofline, comm and overhead)

    @property
    def bytes_read(self) -> float:
        return self.weight_bytes + self.expert_bytes + self.kv_bytes + self.state_bytes

    @property
    def step_ms(self) -> float:
        return max(self.memory_ms, self.compute_ms) + self.comm_ms + self.overhead_ms + self.draft_ms

    @property
    def itl_ms(self) -> float:
        return self.step_ms / self.accepted_tokens


@dataclass(frozen=True, slots=True)
class PrefillStep:
    """One chunked-prefill step of `tokens` tokens per DP rank, per GPU."""

    tokens: float
    bytes_read: float
    flops: float
    memory_ms: float
    compute_ms: float
    comm_ms: float
    overhead_ms: float

    @property
    def step_ms(self) -> float:
        return max(self.memory_ms, self.compute_ms) + self.comm_ms + self.overhead_ms


def accepted_tokens(depth: int, acceptance: float) -> float:
    """Expected tokens per step with `depth` drafts, each accepted with `acceptance` given the previous was."""
    return 1.0 + sum(acceptance**i for i in range(1, depth + 1))


def _pass_flops(p: PassCosts, costs: InstanceCosts, tokens_rank: float, tokens_ep: float, context: float,
                logits_tokens: float) -> FlopsByDtype:
    dense = p.dense_flops_per_token.scaled(tokens_rank)
    experts = p.expert_flops_per_token.scaled(tokens_ep / costs.ep_size)
    head = costs.lm_head_flops_per_token.scaled(logits_tokens)
    window = min(context, costs.sliding_window) if costs.sliding_window else 0.0
    mixer = tokens_rank * (p.attn_flops_per_token_ctx * context + p.window_attn_flops_per_token_ctx * window
                           + p.gdn_flops_per_token)
    return FlopsByDtype(dense.bf16 + experts.bf16 + head.bf16 + mixer, dense.fp8 + experts.fp8 + head.fp8,
                        dense.fp4 + experts.fp4 + head.fp4)


def _kv_read(p: PassCosts, costs: InstanceCosts, context: float) -> float:
    window = min(context, costs.sliding_window) if costs.sliding_window else 0.0
    return p.kv_bytes_per_token * context + p.window_kv_bytes_per_token * window


def decode_step(costs: InstanceCosts, gpu: GpuSpec, cal: Calibration, *, requests_per_rank: float,
                total_requests: float, context_tokens: float, mtp_depth: int) -> DecodeStep:
    """One decode step with `requests_per_rank` running requests on each busy DP rank."""
    hbm = gpu.hbm_bandwidth_tb_s * 1e12 * cal.hbm_efficiency
    q = 1 + mtp_depth
    t = costs.target
    tokens_rank = requests_per_rank * q
    tokens_ep = total_requests * q if costs.expert_parallel or costs.dp > 1 else tokens_rank
    weights = t.dense_bytes + costs.lm_head_bytes
    experts = t.expert_bytes * costs.expert_active_fraction(tokens_ep)
    kv = requests_per_rank * _kv_read(t, costs, context_tokens)
    state = requests_per_rank * t.state_bytes * (1 + q)  # read once, one state written per verified token
    flops = _pass_flops(t, costs, tokens_rank, tokens_ep, context_tokens, tokens_rank)
    comm = layer_comm_s(tokens_rank, t.num_layers, t.num_moe_layers, costs, cal)
    overhead = cal.step_overhead_ms + cal.layer_overhead_us * 1e-3 * t.num_layers
    draft_ms = 0.0
    if mtp_depth and costs.draft is not None:
        d = costs.draft
        requests_ep = total_requests if costs.expert_parallel or costs.dp > 1 else requests_per_rank
        d_bytes = (d.dense_bytes + costs.lm_head_bytes + d.expert_bytes * costs.expert_active_fraction(requests_ep)
                   + requests_per_rank * (_kv_read(d, costs, context_tokens) + 2 * d.state_bytes))
        d_flops = _pass_flops(d, costs, requests_per_rank, requests_ep, context_tokens, requests_per_rank)
        one = (max(d_bytes / hbm, d_flops.seconds(gpu, cal.flop_efficiency)) * 1e3
               + layer_comm_s(requests_per_rank, d.num_layers, d.num_moe_layers, costs, cal) * 1e3
               + cal.layer_overhead_us * 1e-3 * d.num_layers + cal.draft_overhead_ms)
        draft_ms = mtp_depth * one
    return DecodeStep(
        requests_per_rank=requests_per_rank, tokens_per_request=q,
        accepted_tokens=accepted_tokens(mtp_depth, cal.mtp_acceptance), weight_bytes=weights,
        expert_bytes=experts, kv_bytes=kv, state_bytes=state,
        memory_ms=(weights + experts + kv + state) / hbm * 1e3,
        compute_ms=flops.seconds(gpu, cal.flop_efficiency) * 1e3, comm_ms=comm * 1e3, overhead_ms=overhead,
        draft_ms=draft_ms)


def prefill_step(costs: InstanceCosts, gpu: GpuSpec, cal: Calibration, *, tokens_per_rank: float,
                 busy_ranks: int, prompt_tokens: int) -> PrefillStep:
    """One chunk of `tokens_per_rank` prompt tokens (from prompts of `prompt_tokens`) on each busy DP rank."""
    hbm = gpu.hbm_bandwidth_tb_s * 1e12 * cal.hbm_efficiency
    t = costs.target
    tokens_ep = tokens_per_rank * busy_ranks if costs.expert_parallel or costs.dp > 1 else tokens_per_rank
    prompts = tokens_per_rank / prompt_tokens  # requests whose prefill this chunk advances (fractional)
    mean_context = prompt_tokens / 2  # causal attention: a prompt token sees half the prompt on average
    kv_written = tokens_per_rank * (t.kv_bytes_per_token + t.window_kv_bytes_per_token)
    bytes_read = (t.dense_bytes + costs.lm_head_bytes + t.expert_bytes * costs.expert_active_fraction(tokens_ep)
                  + kv_written + prompts * _kv_read(t, costs, mean_context) + 2 * prompts * t.state_bytes)
    flops = _pass_flops(t, costs, tokens_per_rank, tokens_ep, mean_context, prompts)
    comm = layer_comm_s(tokens_per_rank, t.num_layers, t.num_moe_layers, costs, cal)
    layers = t.num_layers
    if costs.draft is not None:  # with MTP on, the drafter also runs over the prompt (its KV is needed too)
        d = costs.draft
        bytes_read += (d.dense_bytes + d.expert_bytes * costs.expert_active_fraction(tokens_ep)
                       + tokens_per_rank * d.kv_bytes_per_token)
        d_flops = _pass_flops(d, costs, tokens_per_rank, tokens_ep, mean_context, prompts)
        flops = FlopsByDtype(flops.bf16 + d_flops.bf16, flops.fp8 + d_flops.fp8, flops.fp4 + d_flops.fp4)
        comm += layer_comm_s(tokens_per_rank, d.num_layers, d.num_moe_layers, costs, cal)
        layers += d.num_layers
    return PrefillStep(
        tokens=tokens_per_rank, bytes_read=bytes_read,
        flops=flops.bf16 + flops.fp8 + flops.fp4, memory_ms=bytes_read / hbm * 1e3,
        compute_ms=flops.seconds(gpu, cal.prefill_flop_efficiency) * 1e3, comm_ms=comm * 1e3,
        overhead_ms=cal.step_overhead_ms + cal.layer_overhead_us * 1e-3 * layers)
