"""Bytes per hidden element that vLLM puts on the wire when it moves tokens to an MoE layer's experts.

Read in vLLM 0.32.0 (model_executor/layers/fused_moe/: prepare_finalize/*.py, all2all_utils.py, oracle/fp8.py):
every prepare step quantises the tokens to the experts' activation format before it sends them, unless the
backend or the expert kernel takes them unquantised; the outputs always come back in BF16. So an NVFP4 model
dispatches 0.56 bytes per element where a BF16 model dispatches 2, on every path below:
- the default allgather_reducescatter (`naive_dp_ep.py`, `_quantize_and_setup_dispatch`, then `all_gatherv`),
  which is also what plain DP without EP runs ("Falling back to AllGather+ReduceScatter");
- FlashInfer's NVLink one-sided and two-sided all-to-alls (`flashinfer_nvlink_*_sided.py`);
- DeepEP, high-throughput and low-latency, send only FP8 with 128x128 block scales quantised (`deepep_ht.py`:
  "DeepEP only supports fp8 block scales"; `all2all_utils.py` use_fp8_dispatch); NVFP4 goes as BF16 (low-latency
  dispatches NVFP4 only with VLLM_DEEPEPLL_NVFP4_DISPATCH=1, which a plan does not set).
On Hopper, block-FP8 experts with EP run FlashInfer's CUTLASS kernel first (`oracle/fp8.py`), which takes
unquantised inputs (`expects_unquantized_inputs`): those tokens travel as BF16, except on DeepEP's low-latency
kernels. Those hand the experts a batched activation layout (`FusedMoEParallelConfig.use_batched_activation_format`
is `use_deepep_ll_kernels`, fused_moe/config.py) that FlashInfer's CUTLASS experts do not take
(`FlashInferExperts.activation_format()` is Standard, flashinfer_cutlass_moe.py), so the oracle's next choice, the
batched DeepGEMM experts, runs on tokens DeepEP dispatched in FP8 with 128-element block scales.
"""

from __future__ import annotations

from tuner.models import ModelSpec, WeightFormat
from tuner.topology import DEEPEP_BACKENDS, All2AllBackend

BF16_BYTES = 2.0  # activations on the wire unquantised; every combine and reduce-scatter returns BF16

#: Bytes per element of the activations as each expert format quantises them (scales included): NVFP4 is 4 bits
#: plus an e4m3 scale per 16 elements, block FP8 a byte plus an fp32 scale per 128; per-tensor and per-token FP8
#: carry one scale per tensor or per token (negligible per element). Weight-only formats (INT4, AWQ, MXFP4 on
#: Hopper's Marlin and Triton kernels) keep BF16 activations.
QUANTISED_ACTIVATION_BYTES: dict[WeightFormat, float] = {
    WeightFormat.NVFP4: 0.5 + 1 / 16,
    WeightFormat.FP8_BLOCK: 1 + 4 / 128,
    WeightFormat.FP8: 1.0,
    WeightFormat.FP8_CHANNEL: 1.0,
}


_FORMATS: dict[int, tuple[ModelSpec, WeightFormat | None]] = {}


def expert_format(model: ModelSpec) -> WeightFormat | None:
    """The routed experts' weight format (their largest tensor's, so biases and MTP copies do not decide it);
    None for a dense model. Found once per model: the tensor list holds every layer's, and a sweep asks per
    topology."""
    hit = _FORMATS.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    experts = [t for t in model.tensors if t.is_expert and not t.is_mtp]
    fmt = max(experts, key=lambda t: t.nbytes).fmt if experts else None
    _FORMATS[id(model)] = (model, fmt)
    return fmt


def dispatch_bytes(fmt: WeightFormat | None, backend: All2AllBackend, *, expert_parallel: bool,
                   architecture: str) -> float:
    """Bytes per hidden element of one token sent to the experts (EP dispatch, or plain DP's all-gather)."""
    quantised = QUANTISED_ACTIVATION_BYTES.get(fmt) if fmt is not None else None
    if quantised is None:
        return BF16_BYTES
    if (fmt is WeightFormat.FP8_BLOCK and expert_parallel and architecture == "hopper"
            and backend != "deepep_low_latency"):
        return BF16_BYTES  # FlashInfer CUTLASS experts quantise after the dispatch (not on DeepEP LL's batched layout)
    if expert_parallel and backend in DEEPEP_BACKENDS and fmt is not WeightFormat.FP8_BLOCK:
        return BF16_BYTES
    return quantised
