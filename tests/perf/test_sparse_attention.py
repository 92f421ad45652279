"""DeepSeek Sparse Attention (DeepSeek-V3.2): the attention reads index_topk tokens, the indexer scores them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import Calibration, RooflineModel
from tuner.perf._kernels import INDEXER_KERNELS, layer_kernels
from tuner.perf._steps import attended_context
from tuner.topology import Role, Topology

TOPO = Topology.parse("TP8", gpu_memory_utilization=0.9)
NO_FIXED = Calibration(step_overhead_ms=0.0, kernel_latency_us=0.0, allreduce_latency_us=0.0)


@pytest.fixture(scope="module")
def v32(models_dir: Path) -> RooflineModel:
    return RooflineModel(load_model(models_dir / "deepseek-v3.2-exp"), get_gpu("h200"), NO_FIXED)


@pytest.fixture(scope="module")
def v3(models_dir: Path) -> RooflineModel:
    return RooflineModel(load_model(models_dir / "deepseek-v3"), get_gpu("h200"), NO_FIXED)


def test_topk_is_read_from_the_config(v32: RooflineModel, v3: RooflineModel) -> None:
    assert v32.model.mla is not None and v32.model.mla.index_topk == 2048  # config.json "index_topk": 2048
    assert v3.model.mla is not None and v3.model.mla.index_topk is None


def test_attended_context_caps_at_topk_and_averages_over_a_causal_prompt(v32: RooflineModel,
                                                                          v3: RooflineModel) -> None:
    sparse = v32.state(TOPO, Role.BOTH, isl=1000, osl=10).costs.target
    dense = v3.state(TOPO, Role.BOTH, isl=1000, osl=10).costs.target
    assert attended_context(dense, 30000.0) == 30000.0
    assert attended_context(sparse, 1000.0) == 1000.0 and attended_context(sparse, 30000.0) == 2048
    # a 32K prompt's queries see min(position, 2048) tokens: 2048 - 2048^2 / (2 x 32000) on average
    assert attended_context(sparse, 16000.0, prompt_tokens=32000) == pytest.approx(2048 - 2048**2 / 64000)
    assert attended_context(sparse, 1000.0, prompt_tokens=2000) == 1000.0


def test_decode_reads_topk_latents_and_every_indexer_key(v32: RooflineModel) -> None:
    """Past top-k, one more context token costs its indexer key (132 B x 61 layers) and no latent."""
    costs = v32.state(TOPO, Role.DECODE, isl=32000, osl=2).costs.target
    assert costs.index_kv_bytes_per_token == 61 * 132 and costs.kv_bytes_per_token == 61 * 576 * 2
    short = v32.decode_step(TOPO, 1, isl=8000, osl=2).kv_bytes
    long = v32.decode_step(TOPO, 1, isl=24000, osl=2).kv_bytes
    assert long - short == pytest.approx(16000 * 61 * 132)


def _flops_per_prompt_token(perf: RooflineModel, topo: Topology, isl: int) -> float:
    return perf.prefill_step(topo, 16, isl=isl).flops / 8192  # a full 8192-token chunk


def test_long_prompts_pay_the_indexer_and_topk_attention(v32: RooflineModel, v3: RooflineModel) -> None:
    """Per prompt token, V3's dense attention grows with the whole prompt; V3.2's sparse attention stops growing
    at top-k and what keeps growing is the indexer (FP8 logits over every earlier token, replicated on each TP
    rank: vLLM's Indexer is ReplicatedLinear). On the FP8 (fp8_ds_mla) cache the sparse kernel reads only the
    valid top-k slots of the rank's 16 heads."""
    v3_growth = _flops_per_prompt_token(v3, TOPO, 32000) - _flops_per_prompt_token(v3, TOPO, 4000)
    assert v3_growth == pytest.approx(61 * 2 * 16 * (128 + 64 + 128) * (16000 - 2000), rel=1e-4)  # + lm_head
    indexer = 61 * 2 * 64 * 128 * (16000 - 2000)  # logits over the extra mean context, every layer, not split
    attention = 61 * 2 * 16 * (2 * 512 + 64) * ((2048 - 2048**2 / 64000) - (2048 - 2048**2 / 8000))
    fp8 = TOPO.model_copy(update={"kv_cache_dtype": "fp8"})
    assert (_flops_per_prompt_token(v32, fp8, 32000) - _flops_per_prompt_token(v32, fp8, 4000)
            == pytest.approx(indexer + attention, rel=1e-4))
    # the BF16 cache's kernel already runs every top-k slot at 4K: only the indexer grows
    assert (_flops_per_prompt_token(v32, TOPO, 32000) - _flops_per_prompt_token(v32, TOPO, 4000)
            == pytest.approx(indexer, rel=1e-4))


@pytest.mark.parametrize(("gpu", "padded_heads"), [("h200", 64), ("b200", 128)])
def test_bf16_cache_pads_heads_and_runs_every_topk_slot(models_dir: Path, gpu: str, padded_heads: int) -> None:
    """vLLM's BF16-cache sparse path (flashmla_sparse.py `_forward_bf16_kv`, every token) pads the rank's heads to
    64 on Hopper and 128 on Blackwell, and FlashMLA's kernel masks, not skips, the top-k slots a short context
    leaves empty: a 1K prompt costs the same attention per token as a 2K one, for 16 heads x 4 (or x 8)."""
    perf = RooflineModel(load_model(models_dir / "deepseek-v3.2-exp"), get_gpu(gpu), NO_FIXED)
    fp8 = TOPO.model_copy(update={"kv_cache_dtype": "fp8"})
    per_slot = 61 * 2 * (2 * 512 + 64)
    bf16_1k, bf16_2k = (_flops_per_prompt_token(perf, TOPO, isl) for isl in (1000, 2000))
    indexer_1k_to_2k = 61 * 2 * 64 * 128 * (1000 - 500)
    assert bf16_2k - bf16_1k == pytest.approx(indexer_1k_to_2k, rel=1e-3)  # + lm_head of prompts ending
    fp8_1k = _flops_per_prompt_token(perf, fp8, 1000)
    assert bf16_1k - fp8_1k == pytest.approx(per_slot * (padded_heads * 2048 - 16 * 500), rel=1e-4)


def test_indexer_kernels_are_counted(v32: RooflineModel, v3: RooflineModel) -> None:
    from tuner.models import LayerKind

    assert (layer_kernels(v32.model, LayerKind.MLA, True) - layer_kernels(v3.model, LayerKind.MLA, True)
            == INDEXER_KERNELS)
