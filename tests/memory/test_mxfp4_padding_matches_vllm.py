"""MXFP4 expert padding checked against vLLM's own rounding function, run in the installed CPU vLLM (0.32):
each backend the memory model knows must pad as `mxfp4_round_up_hidden_size_and_intermediate_size` does for it
(FlashInfer TRT-LLM and Triton: vLLM's defaults on Blackwell and Hopper; Marlin: Hopper before vLLM 0.12)."""

from __future__ import annotations

import json
import subprocess

import pytest
from _support.cpu_vllm import needs_envs

from tuner.backends.vllm import default_envs_dir
from tuner.memory._weights import Mxfp4Backend, mxfp4_padded_sizes

pytestmark = [pytest.mark.slow, needs_envs]

BACKENDS = {Mxfp4Backend.FLASHINFER_TRTLLM: "FLASHINFER_TRTLLM_MXFP4_BF16", Mxfp4Backend.TRITON: "TRITON",
            Mxfp4Backend.MARLIN: "MARLIN", Mxfp4Backend.FLASHINFER_CUTLASS: "FLASHINFER_CUTLASS_MXFP4_BF16"}
# gpt-oss (hidden 2880, expert intermediate 2880) at TP1/2/4/8, and shapes off every alignment
SHAPES = [(2880, 2880), (2880, 1440), (2880, 720), (2880, 360), (4096, 1000), (1000, 4100)]

_PROBE = """
import json, sys
from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
    Mxfp4MoeBackend, mxfp4_round_up_hidden_size_and_intermediate_size as round_up)
cases = json.loads(sys.argv[1])
print(json.dumps([list(round_up(Mxfp4MoeBackend[b], h, i)) for b, h, i in cases]))
"""


def test_padding_is_vllms() -> None:
    cases = [(ours, theirs, h, i) for ours, theirs in BACKENDS.items() for h, i in SHAPES]
    python = default_envs_dir() / "vllm" / "bin" / "python"
    out = subprocess.run([str(python), "-c", _PROBE, json.dumps([[b, h, i] for _, b, h, i in cases])],
                         capture_output=True, text=True, timeout=600, check=True)
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    ours = [list(mxfp4_padded_sizes(backend, h, i)) for backend, _, h, i in cases]
    assert ours == theirs
    assert theirs[0] == [3072, 2944]  # gpt-oss on B200: H 2880 -> 3072, I 2880 -> 2944
