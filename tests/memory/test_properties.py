"""Property tests: scaling a topology up never shrinks the KV budget per GPU; every figure adds up."""

from __future__ import annotations

from functools import cache

from _support.paths import MODELS as MODELS_DIR
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.errors import TopologyError
from tuner.hardware import get_gpu
from tuner.memory import GIB, MemoryInputs, compute_memory
from tuner.models import ModelSpec, load_model
from tuner.topology import Topology

MODELS = MODELS_DIR
NAMES = ["qwen3.8-2.4t-a95b-nvfp4", "qwen3-next-80b-a3b", "deepseek-v3", "llama-3.1-70b"]


@cache
def model(name: str) -> ModelSpec:
    return load_model(MODELS / name)


pow2 = st.sampled_from([1, 2, 4, 8, 16])
topologies = st.builds(lambda tp, dp, ep, mtp, util, seqs: (tp, dp, ep, mtp, util, seqs), pow2, pow2,
                       st.booleans(), st.integers(0, 3), st.floats(0.5, 0.98), st.sampled_from([64, 256, 1024]))


def _valid(spec: ModelSpec, tp: int, dp: int, ep: bool, mtp: int, util: float, seqs: int) -> Topology | None:
    topo = Topology(tp=tp, dp=dp, ep=ep and tp * dp > 1, mtp=mtp if spec.num_mtp_layers else 0,
                    gpu_memory_utilization=util, max_num_seqs=seqs)
    try:
        topo.check(spec)
    except TopologyError:
        return None
    return topo


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(NAMES), shape=topologies, grow_tp=st.booleans(),
       gpu=st.sampled_from(["gb300", "h200", "b200"]))
def test_more_gpus_never_lower_kv_budget_per_gpu(name: str, shape: tuple, grow_tp: bool, gpu: str) -> None:
    spec = model(name)
    small = _valid(spec, *shape)
    tp, dp = shape[0], shape[1]
    bigger = _valid(spec, tp * 2 if grow_tp else tp, dp if grow_tp else dp * 2, *shape[2:])
    if small is None or bigger is None:
        return
    a = compute_memory(spec, get_gpu(gpu), small)
    b = compute_memory(spec, get_gpu(gpu), bigger)
    assert b.kv_budget_bytes >= a.kv_budget_bytes
    assert b.weights.total_bytes <= a.weights.total_bytes


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(NAMES), shape=topologies, isl=st.integers(1, 300_000), osl=st.integers(0, 8192),
       gpu=st.sampled_from(["gb300", "h100", "gb200"]))
def test_every_number_is_consistent_with_the_breakdown(name: str, shape: tuple, isl: int, osl: int, gpu: str) -> None:
    spec = model(name)
    topo = _valid(spec, *shape)
    if topo is None:
        return
    b = compute_memory(spec, get_gpu(gpu), topo, MemoryInputs(isl=isl, osl=osl))
    reserved = b.weights.total_bytes + (b.non_torch_gib + b.activation_gib + b.cuda_graph_gib) * GIB
    assert abs(b.requested_gib * GIB - reserved - b.kv_budget_bytes) <= 2
    lay = b.layout
    assert b.num_gpu_blocks == max(0, b.kv_budget_bytes // lay.page_size_bytes // lay.group_size)
    assert b.kv_cache_gib * GIB <= max(b.kv_budget_bytes, 0)
    assert lay.page_size_bytes == lay.block_size * lay.attn_bytes_per_token
    assert lay.page_size_bytes >= lay.state_bytes
    assert b.blocks_per_request * lay.page_size_bytes >= (isl + osl) // lay.block_size * lay.attn_bytes_per_token
    assert b.max_concurrency_instance == b.max_concurrency * topo.dp
    # vLLM starts only if one workload request and one max-model-len request each fit
    assert b.fits == (b.kv_budget_bytes > 0 and b.num_gpu_blocks >= max(b.blocks_per_request,
                                                                          b.blocks_per_request_max_model_len))
    assert (b.shortfall_gib == 0) == b.fits or b.kv_budget_bytes <= 0
    if not b.fits:
        assert f"{b.shortfall_gib:.2f} GiB" in b.verdict()
    d = b.to_dict()
    assert d["num_gpu_blocks"] == b.num_gpu_blocks and d["fits"] == b.fits


def test_a_request_that_fits_but_a_max_model_len_one_does_not() -> None:
    """vLLM refuses to start when one max-model-len request does not fit, even if the workload's does: the
    verdict says so and the shortfall is that request's (found by a random draw of the property test above)."""
    b = compute_memory(model("llama-3.1-70b"), get_gpu("gb300"),
                       Topology(tp=1, max_num_seqs=256, gpu_memory_utilization=0.512667),
                       MemoryInputs(isl=8500, osl=1009))
    assert b.blocks_per_request <= b.num_gpu_blocks < b.blocks_per_request_max_model_len
    assert not b.fits and b.shortfall_gib > 0
    assert "max-model-len 10,240" in b.verdict() and "--max-model-len" in b.verdict()
