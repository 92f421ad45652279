"""Issue 38: PD pairings vLLM 0.32 refuses or corrupts are refused by topotune's one pairing check, naming the
rule, the vLLM source and the fix (defects 1-5), and the CUDA-graph cap follows vLLM's capture grid (4)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tuner.backends.vllm import (
    PairingContext,
    PlanSettings,
    build_plan,
    keep_names,
    launch_rules,
    pack_hosts,
    pairing_refusal,
    side_blocks,
)
from tuner.deployment import parse_deployment
from tuner.errors import TopologyError
from tuner.memory._estimates import cudagraph_capture_sizes
from tuner.models import LayerKind, MambaSpec, ModelSpec, load_model
from tuner.topology import Role, Topology

EXAMPLES = Path(__file__).parents[2] / "examples" / "models"
GB300 = {"model_path": "/models/m", "served_model_name": "m", "multi_node_nvlink": True, "vllm_version": "0.32.0"}


def plan(dep: str, model: ModelSpec, *, mtp: int = 0, extra: tuple[str, ...] = (),  # type: ignore[no-untyped-def]
         per_host: int = 4):
    d = parse_deployment(dep, mtp=mtp)
    settings = PlanSettings(**GB300, model_is_hybrid=model.is_hybrid, extra_flags=extra)
    return build_plan(d, pack_hosts(d, per_host), settings, resolve=keep_names, model=model)


@pytest.fixture(scope="module")
def reference() -> ModelSpec:
    return load_model(EXAMPLES / "qwen3.8-2.4t-a95b-nvfp4")


def mamba2(reference: ModelSpec, groups: int) -> ModelSpec:
    """The reference model's layout with Mamba2 mixers (Falcon-H1-like: 64 heads of 64, state 128) in place of
    its GDN layers: what vLLM issue #55208 reproduces with Falcon-H1 (n_groups=1)."""
    kinds = tuple(LayerKind.MAMBA if k is LayerKind.LINEAR_ATTENTION else k for k in reference.layer_kinds)
    spec = MambaSpec(num_heads=64, head_dim=64, state_size=128, num_groups=groups, conv_kernel=4,
                     intermediate_size=4096)
    return replace(reference, linear_attention=None, mamba=spec, layer_kinds=kinds)


# -- 1. silent corruption: Mamba2 with replicated B/C across TP --------------------------------------------

def test_1_mamba2_with_replicated_groups_across_tp_is_refused_naming_the_issue(reference: ModelSpec) -> None:
    no_prefix = ("--no-enable-prefix-caching",)  # isolate the conv-split rule from the block-size one
    with pytest.raises(TopologyError, match=r"#55208.*ssm_conv_transfer_utils\.py") as info:
        plan("1P:TP2,1D:TP4", mamba2(reference, groups=1), extra=no_prefix)
    assert "equal TP" in info.value.fix
    assert plan("1P:TP4,1D:TP4", mamba2(reference, groups=1), extra=no_prefix).servers  # equal TP: B/C alike
    assert plan("1P:TP2,1D:TP4", mamba2(reference, groups=8), extra=no_prefix).servers  # B/C sharded: correct


# -- 2. hybrid block sizes follow TP ------------------------------------------------------------------------

def test_2_hybrid_block_size_is_raised_per_tp_and_pairs_that_cannot_handshake_are_refused(
        reference: ModelSpec) -> None:
    # --block-size 64 is only a floor: _align_hybrid_block_size raises it until a page holds a GDN state
    blocks = {tp: side_blocks(reference, Topology(tp=tp, mtp=3), "blackwell", 64) for tp in (2, 4, 8)}
    assert [b.logical for b in blocks.values()] == [2176, 1088, 576]
    assert [b.kernel for b in blocks.values()] == [128, 64, 64]  # FlashInfer's largest exact size dividing it
    with pytest.raises(TopologyError, match=r"block_size_ratio|kernel block \(64 tokens at TP4\) is not a multiple"):
        plan("1P:TP2,1D:TP4", reference, mtp=3)
    with pytest.raises(TopologyError, match=r"physical blocks per logical block 17 .* vs 9") as info:
        plan("1P:TP4,1D:TP8", reference, mtp=3)
    assert "--no-enable-prefix-caching" in info.value.fix and "base_worker.py" in str(info.value)
    assert plan("1P:TP4,1D:TP8", reference, mtp=3, extra=("--no-enable-prefix-caching",)).servers
    assert plan("1P:TP4DP2+EP,1D:TEP4", reference, mtp=3).servers  # equal TP: same block sizes


# -- 3. non-hybrid pairings: TP divisibility and replicated KV heads ----------------------------------------

def test_3_tps_that_do_not_divide_and_wider_prefill_with_replicated_kv_heads_are_refused() -> None:
    llama = load_model(EXAMPLES / "llama-3.1-70b")  # 8 KV heads
    with pytest.raises(TopologyError, match=r"TP4 and decode TP6 do not divide.*kv_connector/utils\.py"):
        plan("1P:TP4,1D:TP6", llama, per_host=12)
    with pytest.raises(TopologyError, match=r"prefill TP16 > decode TP8 with the 8 KV heads replicated") as info:
        plan("1P:TP16,1D:TP8", llama)
    assert "TP <= 8" in info.value.fix
    assert plan("1P:TP8,1D:TP16", llama).servers and plan("1P:TP8,1D:TP4", llama).servers
    mla = load_model(EXAMPLES / "deepseek-v3")  # MLA: the latent is replicated by design, any dividing TP pairs
    assert pairing_refusal(Topology(tp=16), Topology(tp=8), launch_rules(), PairingContext(model=mla)) is None


# -- 4. CUDA graphs up to the largest batch -----------------------------------------------------------------

def test_4_the_capture_cap_is_aligned_to_vllms_grid_and_an_explicit_one_truncated_as_vllm_does() -> None:
    decode = Topology(max_num_seqs=100, mtp=2, role=Role.DECODE)
    assert decode.cudagraph_capture_tokens == 304  # 300 tokens per step, rounded up: vLLM would keep 288 of 300
    assert cudagraph_capture_sizes(decode, "blackwell")[-1] == 304
    explicit = Topology(max_num_seqs=100, mtp=2, role=Role.DECODE, max_cudagraph_capture_size=300)
    assert explicit.cudagraph_capture_tokens == 288  # what vLLM captures ("Truncating ... to 288")
    d = parse_deployment("TP4", mtp=2, max_num_seqs=100)
    (server,) = build_plan(d, pack_hosts(d, 4), PlanSettings(**GB300), resolve=keep_names).servers
    assert server.argv[server.argv.index("--max-cudagraph-capture-size") + 1] == "304"
    from tuner.space import parse_space  # the searched knob is what vLLM keeps: 300 and 288 are one config

    text = ("name: x\ncluster: {gpu: gb300, num_gpus: 8}\nworkload: {isl: 1, osl: 1}\n"
            "phases: {decode: {concurrency: [1], max_cudagraph_capture_size: [auto, 300, 288, 512, 3]}}\n")
    assert parse_space(text).phases["decode"].max_cudagraph_capture_size == ["auto", 2, 288, 512]
    # prefill keeps vLLM's default cap: 1024 on SM10x (the catalog's blackwell), 512 elsewhere
    prefill = Topology(max_num_seqs=1024, role=Role.PREFILL)
    assert cudagraph_capture_sizes(prefill, "blackwell")[-1] == 1024
    assert cudagraph_capture_sizes(prefill, "hopper")[-1] == 512


# -- 5. hybrid families NIXL cannot transfer ----------------------------------------------------------------

def test_5_a_hybrid_family_without_conv_split_is_refused_even_with_equal_tp(reference: ModelSpec) -> None:
    assert reference.state_kind == "gdn_attn"
    minimax = replace(reference, linear_attention=replace(reference.linear_attention, kind="linear"))
    with pytest.raises(TopologyError, match=r"cannot transfer linear state.*derive_mamba_conv_split") as info:
        plan("1P:TP4,1D:TP4", minimax)
    assert "aggregated" in info.value.fix
    d = parse_deployment("2x:TP4")  # aggregated serving needs no transfer
    assert build_plan(d, pack_hosts(d, 4), PlanSettings(**GB300, model_is_hybrid=True), resolve=keep_names,
                      model=minimax).servers
    # GDN itself transferred only from 0.22.0 (vLLM PR #41869)
    gdn_old = PlanSettings(**{**GB300, "vllm_version": "0.21.0"}, model_is_hybrid=True)
    with pytest.raises(TopologyError, match=r"target vLLM >= 0\.22\.0"):
        d = parse_deployment("1P:TP4,1D:TP4")
        build_plan(d, pack_hosts(d, 4), gdn_old, resolve=keep_names, model=reference)
