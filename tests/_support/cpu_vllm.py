"""Real vLLM-on-CPU helpers shared by the slow tests of tests/backends and tests/executors."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tuner.backends.vllm import TINY_MODEL_SCRIPT, VllmBackendSettings, default_envs_dir

# The gate's mechanics only: the tiny random model scores ~0 whatever the question count.
CPU_SETTINGS = VllmBackendSettings.for_cpu(accuracy_questions=4, accuracy_max_tokens=32)
MISSING = CPU_SETTINGS.missing_executables()
needs_envs = pytest.mark.skipif(bool(MISSING), reason=f"CPU vLLM venvs missing ({', '.join(MISSING)}): run "
                                                      "`make cpu-vllm` or `topotune setup-cpu-vllm`")


def make_tiny_model(out: Path, *, moe: bool = False) -> Path:
    python = default_envs_dir() / "vllm" / "bin" / "python"
    subprocess.run([str(python), str(TINY_MODEL_SCRIPT), str(out), *(["--moe"] if moe else [])], check=True,
                   capture_output=True)
    return out


