"""The same small Campaign on LocalExecutor and RayExecutor; and the local default Ray head."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from _support.executors import GPUS_PER_HOST, TOTAL_GPUS
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

from tuner.backends import make_backend
from tuner.executors import BackendSpec, LocalExecutor
from tuner.testing import small_campaign


def _run(executor, tmp_path: Path, tag: str):
    campaign = small_campaign(model_path=REFERENCE_MODEL, space_path=REFERENCE_SPACE, executor=executor,
                              storage_url=f"sqlite:///{tmp_path / tag}.db",
                              artifacts_dir=tmp_path / tag, trials=4, num_gpus=TOTAL_GPUS,
                              gpus_per_host=GPUS_PER_HOST, seed=3)
    try:
        return campaign.run().phases["decode"]
    finally:
        executor.shutdown()


def test_local_and_ray_executors_give_the_same_study(ray_cluster, tmp_path: Path) -> None:
    from tuner.executors import RayExecutor

    local = _run(LocalExecutor(make_backend("simulated"), max_parallel=2, num_gpus=TOTAL_GPUS), tmp_path, "local")
    remote = _run(RayExecutor(BackendSpec("simulated"), gpus_per_host=GPUS_PER_HOST, max_parallel=2),
                  tmp_path, "ray")
    assert local.launched == remote.launched == 4
    assert local.counts == remote.counts
    assert local.front and remote.front
    artifacts = [p for p in (tmp_path / "ray").rglob("trial.log")]
    assert len(artifacts) == 4  # each Ray trial's output is in its artifacts folder


def test_local_default_starts_a_token_authenticated_head_off_the_redis_port(tmp_path: Path) -> None:
    """No RAY_ADDRESS: RayExecutor.start starts a local head with the space's logical GPUs (in a subprocess,
    since this test process is already connected to the test cluster)."""
    script = textwrap.dedent("""
        import json, os, ray
        from tuner.executors import RayExecutor, shutdown_ray
        from tuner.settings import TunerSettings
        from tuner.space import ClusterSpec
        ex = RayExecutor.start(TunerSettings(), ClusterSpec(gpu="gb300", num_gpus=8, gpus_per_host=4),
                               "simulated", {}, max_parallel=2)
        again = RayExecutor.start(TunerSettings(), ClusterSpec(gpu="gb300", num_gpus=8), "simulated")
        from tuner.executors import current_session
        s = current_session()
        print(json.dumps({"address": s.address, "local": s.local, "gpus": ray.cluster_resources().get("GPU"),
                          "auth": os.environ.get("RAY_AUTH_MODE"), "per_host": again.gpus_per_host}))
        ex.shutdown(); again.shutdown(); shutdown_ray()
    """)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["TOPOTUNE_DATA_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["local"] and info["gpus"] == 8 and info["auth"] == "token" and info["per_host"] == 4
    assert not info["address"].endswith(":6379")


def _requests(tmp_path: Path) -> list:
    """Four trials: three that measure, one that cannot start (does not fit: a failed result, not an error)."""
    from tuner.backends import TrialRequest
    from tuner.deployment import Deployment
    from tuner.topology import Role, Topology
    from tuner.workload import Workload

    layouts = ("TP8", "TEP8", "TP4DP2+EP", "TP1")
    return [TrialRequest(trial_id=f"t{i}-{name}", model_path=str(REFERENCE_MODEL), gpu="gb300",
                         deployment=Deployment.single(Topology.parse(name, role=Role.DECODE)),
                         workload=Workload(isl=1024, osl=128, concurrency=(1, 8)),
                         artifacts_dir=str(tmp_path / f"t{i}"), timeout_s=300) for i, name in enumerate(layouts)]


def test_local_executor_conforms(tmp_path: Path) -> None:
    from tuner.testing import check_executor

    handles = check_executor(LocalExecutor(make_backend("simulated", delay_s=0.05), max_parallel=2,
                                           num_gpus=TOTAL_GPUS), _requests(tmp_path))
    assert [h.result.status.value for h in handles] == ["ok", "ok", "ok", "oom"]


def test_ray_executor_conforms(ray_cluster, tmp_path: Path) -> None:
    from tuner.executors import RayExecutor
    from tuner.testing import check_executor

    handles = check_executor(RayExecutor(BackendSpec("simulated"), gpus_per_host=GPUS_PER_HOST, max_parallel=2),
                             _requests(tmp_path))
    assert [h.result.status.value for h in handles] == ["ok", "ok", "ok", "oom"]
