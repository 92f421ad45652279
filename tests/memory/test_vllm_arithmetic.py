"""The memory model pinned on vLLM's own numbers, plus hand-computed MLA and GQA cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.hardware import get_gpu
from tuner.memory import GIB, MemoryInputs, compute_memory
from tuner.models import LayerKind, load_model
from tuner.topology import Topology


@pytest.fixture(scope="module")
def qwen3_next(models_dir: Path):  # type: ignore[no-untyped-def]
    return load_model(models_dir / "qwen3-next-80b-a3b")


@pytest.mark.parametrize(("tp", "block"), [(1, 544), (4, 272)])
def test_qwen3_next_block_size_seen_in_vllm_logs(qwen3_next, tp: int, block: int) -> None:  # type: ignore[no-untyped-def]
    b = compute_memory(qwen3_next, get_gpu("h200"), Topology(tp=tp))
    assert b.layout.block_size == block
    assert b.layout.page_size_bytes == block * (2 * max(1, 2 // tp) * 256 * 2)


def test_qwen3_next_40gib_budget_262k(qwen3_next) -> None:  # type: ignore[no-untyped-def]
    inputs = MemoryInputs(isl=262_144, osl=0, kv_cache_memory_bytes=40 * GIB)
    b = compute_memory(qwen3_next, get_gpu("h200"), Topology(tp=1), inputs)
    assert b.layout.group_size == 12 and b.layout.num_groups == 4
    assert b.num_gpu_blocks == 3212
    assert b.blocks_per_request == 485
    assert f"{b.max_concurrency:.2f}" == "6.62"


def test_reference_model_tp1_two_spec_tokens(reference_model_path: Path) -> None:
    ref = load_model(reference_model_path)
    b = compute_memory(ref, get_gpu("gb300"), Topology(tp=1, mtp=2))
    assert b.layout.state_bytes == 4_317_184  # 4 MiB SSM (fp32) + 120 KiB conv at 2 spec tokens
    assert b.layout.conv_state_bytes == 120 * 1024
    assert b.layout.block_size == 2112
    assert b.layout.page_size_bytes == int(4.125 * 1024**2)
    # MTP adds its full-attention layer to the attention group; mamba groups need 1 + 2 pages per request
    assert b.layout.layers_by_kind == {LayerKind.LINEAR_ATTENTION: 69, LayerKind.FULL_ATTENTION: 24}
    assert b.layout.group_size == 24 and b.layout.num_groups == 4
    assert b.blocks_per_request == -(-9216 // 2112) + 3 * (1 + 2)


def test_deepseek_v3_mla_hand_computed(models_dir: Path) -> None:
    ds = load_model(models_dir / "deepseek-v3")
    inputs = MemoryInputs(isl=8192, osl=1024, kv_cache_memory_bytes=10 * GIB)
    b = compute_memory(ds, get_gpu("h200"), Topology(tp=8), inputs)
    # latent 512 + rope 64 = 576 values x 2 B, one "head", not split by TP; FlashMLA block 64 on Hopper
    assert b.layout.attn_bytes_per_token == 1152
    assert b.layout.block_size == 64
    assert b.layout.page_size_bytes == 73_728
    assert b.layout.group_size == 61
    assert b.num_gpu_blocks == 10 * GIB // 73_728 // 61 == 2387
    assert b.blocks_per_request == 144  # ceil(9216 / 64)
    assert b.max_concurrency == pytest.approx(2387 / 144)
    assert compute_memory(ds, get_gpu("gb300"), Topology(tp=8), inputs).layout.block_size == 128  # CUTLASS MLA


def test_llama_gqa_hand_computed(models_dir: Path) -> None:
    llama = load_model(models_dir / "llama-3.1-70b")
    inputs = MemoryInputs(isl=8192, osl=1024, kv_cache_memory_bytes=20 * GIB)
    b = compute_memory(llama, get_gpu("h100"), Topology(tp=4), inputs)
    assert b.layout.attn_bytes_per_token == 2 * 2 * 128 * 2  # K and V, 8/4 KV heads, head_dim 128, bf16
    assert b.layout.block_size == 16 and b.layout.group_size == 80
    assert b.num_gpu_blocks == 20 * GIB // 16_384 // 80 == 16_384
    assert b.blocks_per_request == 576
    assert b.kv_cache_tokens == 16_384 * 16
    # TP16 > 8 KV heads: one head per GPU, KV per token stops shrinking
    b16 = compute_memory(llama, get_gpu("h100"), Topology(tp=16), inputs)
    assert b16.layout.attn_bytes_per_token == 2 * 1 * 128 * 2


def test_llama_weights_and_budget(models_dir: Path) -> None:
    llama = load_model(models_dir / "llama-3.1-70b")
    gpu = get_gpu("h100")
    b = compute_memory(llama, gpu, Topology(tp=4, gpu_memory_utilization=0.9),
                       MemoryInputs(activation_gib=1.0, cuda_graph_gib=0.5, non_torch_gib=0.7))
    # ~141 GB of bf16 weights over 4 GPUs; embedding and lm_head padded to 64 rows then split
    assert 32.5 < b.weights_gib < 33.5
    expected = b.requested_gib - b.weights_gib - 1.0 - 0.5 - 0.7
    assert b.kv_budget_bytes / GIB == pytest.approx(expected, abs=1e-6)


def test_does_not_fit_says_by_how_much(reference_model_path: Path) -> None:
    ref = load_model(reference_model_path)
    b = compute_memory(ref, get_gpu("gb300"), Topology(tp=4))
    assert not b.fits
    assert b.shortfall_gib > 50  # 91/4 + 1242/4 GiB of weights alone exceed 279 GiB
    assert "does not fit" in b.verdict() and f"{b.shortfall_gib:.2f}" in b.verdict()


def test_reference_topologies_from_the_campaign(reference_model_path: Path) -> None:
    ref = load_model(reference_model_path)
    gpu = get_gpu("gb300")
    conc = {name: compute_memory(ref, gpu, Topology.parse(name)) for name in
            ("TP8", "TEP8", "TP4DP2+EP", "TP2DP4+EP", "TP4DP4+EP")}
    assert all(b.fits for b in conc.values())
    # "Topologies that shard the weights over more GPUs (TP4DP4+EP) leave the most KV space per GPU"
    best = max(conc, key=lambda n: conc[n].kv_budget_bytes)
    assert best == "TP4DP4+EP"
    # about 254 GiB is left after the 8% margin and ~2.7 GiB of driver/context
    b = conc["TP4DP4+EP"]
    assert b.requested_gib - b.non_torch_gib == pytest.approx(254, abs=0.5)
    # non-weight memory about 20 GiB, as in the campaign
    assert 15 < b.non_torch_gib + b.activation_gib + b.cuda_graph_gib < 25


def test_mtp_adds_weights_and_state_pages(reference_model_path: Path) -> None:
    ref = load_model(reference_model_path)
    gpu = get_gpu("gb300")
    off = compute_memory(ref, gpu, Topology.parse("TP4DP4+EP"))
    on = compute_memory(ref, gpu, Topology.parse("TP4DP4+EP", mtp=3))
    assert on.weights.mtp_bytes > 0 and off.weights.mtp_bytes == 0
    assert on.layout.conv_state_bytes > off.layout.conv_state_bytes
    assert on.blocks_per_request > off.blocks_per_request
    assert on.max_concurrency < off.max_concurrency
