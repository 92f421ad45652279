"""The shipped multi-host wide-EP space: DBO is a knob of layouts with EP over DP ranks, and the space expands to
wide EP over 2-4 hosts next to the TP/DP alternatives inside one host."""

from __future__ import annotations

from _support.paths import REPO

from tuner.backends.vllm import topology_flags
from tuner.models import load_model
from tuner.space import load_space

SPACE = REPO / "search_spaces" / "deepseek-v3-4x8-h200.yaml"


def test_dbo_is_a_knob_only_where_vllm_splits_micro_batches() -> None:
    space = load_space(SPACE)
    assert space.param_choices("decode")["dbo"] == [False, True]
    base = {"tp": 1, "dp": 32, "ep": True, "mtp": 0, "gpu_memory_utilization": 0.9, "max_num_seqs": 256,
            "max_num_batched_tokens": 8192, "all2all_backend": "deepep_low_latency", "dbo": True}
    wide = space.topology("decode", base)
    assert wide.dbo and wide.all2all_backend == "deepep_low_latency" and "--enable-dbo" in topology_flags(wide)
    assert space.params_of("decode", wide)["dbo"] is True
    tp = space.topology("decode", {**base, "tp": 8, "dp": 1, "ep": False})
    assert not tp.dbo and "--enable-dbo" not in topology_flags(tp)  # no all-to-all, nothing to overlap
    # a space that does not search DBO keeps its earlier parameter set (stored studies stay valid)
    assert "dbo" not in load_space(REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml").param_choices("decode")


def test_the_space_spans_hosts_with_deepep_and_keeps_the_alternatives() -> None:
    space = load_space(SPACE)
    model = load_model(REPO / "examples" / "models" / "deepseek-v3")
    decode = space.expand("decode", model)
    names = {t.name for t in decode}
    assert {"TP8", "TEP8", "DEP8", "DEP16", "DEP32"} <= names
    across = [t for t in decode if t.num_gpus > 8 and t.ep and t.dp > 1]
    assert any(t.dbo and t.all2all_backend == "deepep_low_latency" and t.num_redundant_experts == 32 for t in across)
    prefill = space.expand("prefill", model)
    assert any(t.num_gpus > 8 and t.all2all_backend == "deepep_high_throughput" and t.dbo for t in prefill)
