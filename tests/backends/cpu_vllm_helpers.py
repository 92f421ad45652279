"""Real vLLM-on-CPU helpers shared by the slow tests (imported by name, like executor_helpers)."""

from __future__ import annotations

import glob
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


def processes_mentioning(needle: str) -> list[str]:
    """Command lines of live processes that mention `needle` (a trial folder or model path): must be none."""
    left = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            text = Path(cmdline).read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in text:
            left.append(text)
    return left
