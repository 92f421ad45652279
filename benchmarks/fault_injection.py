"""Fault injection on a real multi-node Ray cluster on this machine (3 hosts x 4 logical GPUs):

1. kill -9 loop: a Campaign (reference model and space, decode phase, simulated backend with a delay, every trial
   also starting a child process in its own session) runs while trial workers are killed with SIGKILL;
2. driver restart: the Campaign's driver process is killed mid-study and started again.
Prints the counts the acceptance asks for. Usage: .venv/bin/python benchmarks/fault_injection.py [--kills 10]
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4"
SPACE = REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml"
HOSTS, GPUS_PER_HOST = 3, 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_loop(work: Path, kills: int, trials: int, grace_s: float) -> dict:
    from tuner.executors import BackendSpec, RayExecutor
    from tuner.testing import (
        ProbeBackend,
        alive_pids,
        kill_runners,
        small_campaign,
        spawned_children,
        study_counts,
    )

    records = work / "kill-records"
    spec = BackendSpec("probe", factory=functools.partial(
        ProbeBackend, str(records), delay_s=2.0, spawn=True, inner=BackendSpec("simulated")))
    executor = RayExecutor(spec, gpus_per_host=GPUS_PER_HOST, max_parallel=3, max_retries=2)
    storage = f"sqlite:///{work / 'kill.db'}"
    campaign = small_campaign(model_path=MODEL, space_path=SPACE, executor=executor, storage_url=storage,
                              artifacts_dir=work / "kill-art", trials=trials, num_gpus=HOSTS * GPUS_PER_HOST,
                              gpus_per_host=GPUS_PER_HOST)
    stop, reports = threading.Event(), []
    killer = threading.Thread(target=lambda: reports.append(
        kill_runners(executor, kills=kills, interval_s=0.7, grace_s=grace_s, stop=stop)))
    killer.start()
    completed = False
    try:
        result = campaign.run()
        completed = result.phases["decode"].launched == trials
    finally:
        stop.set()
        killer.join(timeout=60)
        executor.shutdown()
    report = reports[0]
    counts = study_counts(storage, campaign.phase_study_name("decode"))
    retried = sum(1 for line in (work / "kill-art").rglob("executor.json") if '"attempts": 1,' not in line.read_text())
    return {"kills": report.kills, "recovered within grace": report.recovered,
            "max recovery (s)": round(report.max_recovery_s, 2), "trials retried": retried,
            "trials stuck RUNNING after grace": report.stuck + counts.get("running", 0),
            "surviving processes": len(alive_pids(spawned_children(records))),
            "study completed": "yes" if completed else "no", "trial states": counts}


def driver_restart(work: Path, address: str, trials: int) -> dict:
    from tuner.testing import alive_pids, spawned_children, study_counts

    storage = f"sqlite:///{work / 'restart.db'}"
    records = work / "restart-records"
    args = [sys.executable, "-m", "tuner.testing.driver", str(MODEL), str(SPACE), storage,
            str(work / "restart-art"), str(records), str(trials), "2.0"]
    env = {**os.environ, "RAY_ADDRESS": address}
    first = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    name, before = None, {}
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and first.poll() is None:
        name = name or _study(storage)
        before = study_counts(storage, name) if name else {}
        if before.get("complete", 0) >= 2 and before.get("running", 0) >= 1:
            break
        time.sleep(0.3)
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    after = study_counts(storage, name) if name else {}
    return {"in flight when killed": before.get("running", 0), "reclaimed and re-run": after.get("fail_reclaimed", 0),
            "launched (complete)": after.get("complete", 0), "budget": trials,
            "stuck RUNNING": after.get("running", 0), "no trial lost": after.get("complete", 0) == trials,
            "restarted driver exit code": second.returncode,
            "surviving processes": len(alive_pids(spawned_children(records)))}


def _study(storage_url: str) -> str | None:
    import optuna

    from tuner.study import open_storage

    try:
        names = [s.study_name for s in optuna.get_all_study_summaries(open_storage(storage_url),
                                                                       include_best_trial=False)]
    except Exception:
        return None
    return next((n for n in names if n.endswith("/decode")), None)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--grace-s", type=float, default=15.0)
    a = p.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "num_gpus": GPUS_PER_HOST, "object_store_memory": 80 * 2**20}
    cluster = Cluster(initialize_head=True,
                      head_node_args={**node, "include_dashboard": False, "gcs_server_port": _free_port()})
    try:
        for _ in range(HOSTS - 1):
            cluster.add_node(**node)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory(prefix="topotune-faults-") as tmp:
            work = Path(tmp)
            kill = kill_loop(work, a.kills, a.trials, a.grace_s)
            restart = driver_restart(work, cluster.address, 6)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"kill -9 loop ({HOSTS} hosts x {GPUS_PER_HOST} GPUs, {a.trials} trials, 3 in flight, 2 retries):")
    for k, v in kill.items():
        print(f"  {k}: {v}")
    print("driver killed mid-study and restarted:")
    for k, v in restart.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
