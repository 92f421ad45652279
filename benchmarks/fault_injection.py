"""Fault injection on a real multi-node Ray cluster on this machine (3 hosts x 4 logical GPUs):

1. kill -9 loop: a Campaign (reference model and space, decode phase, simulated backend with a delay, every trial
   also starting a child process in its own session) runs while trial workers are killed with SIGKILL;
2. driver restart: the Campaign's driver process is killed mid-study and started again.
Prints the counts the acceptance asks for. Usage: .venv/bin/python benchmarks/fault_injection.py [--kills 10]

--service: the service instead (issue 14): a real `topotune serve` subprocess with the Ray executor (its own
local head) runs a two-phase study while trial workers are killed with SIGKILL (--worker-kills) and the service
itself is killed with SIGKILL (--service-kills) and restarted, then stopped once with SIGTERM mid-study and
started again to finish. Prints trials lost and duplicated, processes left 10 s after each kill, listening
sockets outside loopback, and how the SIGTERM stop left the in-flight trials.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
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


def kill_loop(work: Path, kills: int, trials: int, grace_s: float) -> dict:
    from tuner.testing import alive_pids, campaign_under_kills, spawned_children

    run = campaign_under_kills(model_path=MODEL, space_path=SPACE, work=work / "kill", trials=trials, kills=kills,
                               grace_s=grace_s, num_gpus=HOSTS * GPUS_PER_HOST, gpus_per_host=GPUS_PER_HOST)
    report, counts = run.report, run.counts
    retried = sum(1 for line in run.artifacts.rglob("executor.json") if '"attempts": 1,' not in line.read_text())
    return {"kills": report.kills, "recovered within grace": report.recovered,
            "max recovery (s)": round(report.max_recovery_s, 2), "trials retried": retried,
            "trials stuck RUNNING after grace": report.stuck + counts.get("running", 0),
            "surviving processes": len(alive_pids(spawned_children(run.records))),
            "study completed": "yes" if run.launched == trials else "no", "trial states": counts}


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


# -- the service under kill -9 and SIGTERM ----------------------------------------------------------------------
TOKEN = "fault-token-" + "x" * 20


def _listening_outside_loopback(pids: set[int]) -> list[str]:
    """Listening TCP sockets of these processes bound to anything but 127.0.0.1 / ::1."""
    inodes: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes[target[8:-1]] = pid
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                addr = local.split(":")[0]
                if state == "0A" and inode in inodes and addr not in (  # 127.0.0.1, ::1, ::ffff:127.0.0.1
                        "0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"):
                    out.append(f"pid {inodes[inode]} {local}")
    return out


def _alive_of(known: dict[int, int]) -> list[int]:
    from tuner.executors._reaper import _stat

    left = []
    for pid, started in known.items():
        st = _stat(pid)
        if st is None or st[1] != started:
            continue
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                left.append(pid)
    return left


class _Service:
    def __init__(self, work: Path) -> None:
        import shutil

        self.work = work
        models = work / "models"
        models.mkdir(exist_ok=True)
        if not (models / "ref").exists():
            shutil.copytree(REPO / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4", models / "ref")
        self.port = 0  # chosen at each start
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "TOPOTUNE_API_TOKEN": TOKEN,
                    "TOPOTUNE_DATA_DIR": str(work / "data"), "TOPOTUNE_MODELS_DIR": str(models),
                    "TOPOTUNE_WATCH_MODELS": "false", "TOPOTUNE_EXECUTOR": "ray",
                    "TOPOTUNE_MAX_PARALLEL_TRIALS": "2", "TOPOTUNE_MAX_PARALLEL_STUDIES": "1"}
        self.env.pop("RAY_ADDRESS", None)
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """`topotune serve` on a port from free_port_block (below the ephemeral ports outgoing connections take), a
        fresh one at each start, through start_on_free_ports: again on another when another process took it."""
        from tuner.launch import start_on_free_ports

        log_path = self.work / "serve.log"
        logged = 0  # serve.log's size before this start: what follows is its log

        def this_start() -> str:
            with open(log_path, "rb") as fh:
                fh.seek(logged)
                return fh.read().decode(errors="replace")

        def start(port: int, _attempt: int) -> None:
            nonlocal logged
            self.port = port
            logged = log_path.stat().st_size if log_path.exists() else 0
            self.proc = subprocess.Popen([sys.executable, "-c", "from api.cli import main; main()", "serve",
                                          "--port", str(self.port),
                                          "--log-level", "warning"], env=self.env, stdout=subprocess.DEVNULL,
                                         stderr=open(log_path, "a"))  # noqa: SIM115
            if not self._healthy():
                self.proc.kill()  # not healthy in 120 s, or exited
                self.proc.wait()
                raise RuntimeError(f"the service did not start within 120 s; serve.log ends:\n{this_start()[-3000:]}")

        start_on_free_ports(start, ports=1, logs=lambda _: [this_start()], where=log_path)

    def _healthy(self) -> bool:
        """Until /healthz answers (True) or the process exits or 120 s pass (False)."""
        import httpx2

        assert self.proc is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(self.base + "/healthz", timeout=2).status_code in (200, 503):
                    return True
            time.sleep(0.3)
        return False

    def detail(self, sid: int) -> dict:
        import httpx2

        return httpx2.get(f"{self.base}/v1/studies/{sid}", timeout=30).json()


def _kill_workers(artifacts: Path, kills: int, stop: threading.Event, done: list[int]) -> None:
    """kill -9 the runner of a trial in flight (its pid file), every ~1.5 s, `kills` times."""
    from tuner.executors._host import RUNNER_PID

    while len(done) < kills and not stop.is_set():
        stop.wait(1.5)
        for pid_file in artifacts.rglob(RUNNER_PID):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                done.append(int(pid_file.read_text()))
                break


def _study_trials(storage_url: str, campaign: str) -> dict[str, dict[str, int]]:
    import optuna

    from tuner.study import open_storage

    out = {}
    for phase in ("prefill", "decode"):
        study = optuna.load_study(study_name=f"{campaign}/{phase}", storage=open_storage(storage_url))
        trials = study.get_trials(deepcopy=False)
        sampled = [t for t in trials if t.user_attrs.get("kind") == "sampled"
                   and t.state == optuna.trial.TrialState.COMPLETE]
        keys = [tuple(sorted(t.params.items())) for t in sampled]
        out[phase] = {"launched": len(sampled), "duplicated": len(keys) - len(set(keys)),
                      "running": sum(t.state == optuna.trial.TrialState.RUNNING for t in trials),
                      "driver stopped": sum(t.user_attrs.get("reason") == "driver stopped" for t in trials),
                      "reclaimed": sum(t.user_attrs.get("status") == "reclaimed" for t in trials)}
    return out


def service_faults(work: Path, worker_kills: int, service_kills: int, trials: int) -> dict:
    import httpx2

    from tuner.executors._reaper import descendants

    svc = _Service(work)
    svc.start()
    sid = httpx2.post(svc.base + "/v1/studies", json={"model_path": "ref", "trials": trials, "sampler": "random",
                                                      "trial_delay_s": 2.0, "warm_start": False},
                     headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).json()["id"]
    stop, killed_workers = threading.Event(), []
    killer = threading.Thread(target=_kill_workers, args=(work / "data" / "artifacts", worker_kills, stop,
                                                          killed_workers), daemon=True)
    killer.start()
    left_after, exposed, sigterm = [], set(), {}
    for round_ in range(service_kills + 1):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and svc.detail(sid)["launched"] < (round_ + 1) * trials * 2 // (
                service_kills + 3):
            time.sleep(0.5)
        assert svc.proc is not None
        known = descendants(svc.proc.pid)
        known[svc.proc.pid] = 0
        exposed.update(_listening_outside_loopback(set(known)))
        if round_ < service_kills:
            svc.proc.send_signal(signal.SIGKILL)
        else:  # the last stop is graceful: in-flight trials must end "driver stopped", none left RUNNING
            t0 = time.monotonic()
            svc.proc.send_signal(signal.SIGTERM)
        svc.proc.wait()
        if round_ == service_kills:
            sigterm["exit (s)"] = round(time.monotonic() - t0, 1)
        known.pop(svc.proc.pid)
        time.sleep(10)
        left_after.append(len(_alive_of(known)))
        if round_ == service_kills:
            storage = f"sqlite:///{work / 'data' / 'topotune.db'}"
            sigterm["left RUNNING"] = sum(v["running"] for v in _study_trials(
                storage, _campaign_of(storage, sid)).values())
        svc.start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and svc.detail(sid)["status"] not in ("succeeded", "failed", "cancelled"):
        time.sleep(1)
    stop.set()
    detail = svc.detail(sid)
    assert svc.proc is not None
    known = descendants(svc.proc.pid)
    exposed.update(_listening_outside_loopback({svc.proc.pid, *known}))
    svc.proc.send_signal(signal.SIGTERM)
    svc.proc.wait()
    time.sleep(10)
    left_after.append(len(_alive_of(known)))
    storage = f"sqlite:///{work / 'data' / 'topotune.db'}"
    counts = _study_trials(storage, detail["campaign"])
    return {"study": detail["status"], "resumes": detail["resumes"], "trial workers killed": len(killed_workers),
            "service kill -9": service_kills, "budget per phase": trials,
            "trials lost": sum(max(0, trials - c["launched"]) for c in counts.values()),
            "trials duplicated": sum(c["duplicated"] for c in counts.values()),
            "processes left 10 s after each stop": left_after,
            "listening sockets outside loopback": sorted(exposed),
            "SIGTERM mid-study": sigterm, "per phase": counts}


def _campaign_of(storage_url: str, sid: int) -> str:
    from sqlalchemy import create_engine, text

    with create_engine(storage_url).connect() as conn:
        return conn.execute(text("SELECT campaign FROM topotune_studies WHERE id = :i"), {"i": sid}).scalar_one()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--service", action="store_true", help="kill -9 / SIGTERM the service (Ray executor)")
    p.add_argument("--worker-kills", type=int, default=20)
    p.add_argument("--service-kills", type=int, default=5)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--grace-s", type=float, default=15.0)
    a = p.parse_args()
    if a.service:
        with tempfile.TemporaryDirectory(prefix="topotune-service-faults-") as tmp:
            figures = service_faults(Path(tmp), a.worker_kills, a.service_kills, a.trials)
        print(f"service under faults (Ray executor, {a.trials} trials per phase, 2 in flight):")
        for k, v in figures.items():
            print(f"  {k}: {v}")
        return
    from tuner.testing import ray_test_cluster

    node = {"num_cpus": 1, "num_gpus": GPUS_PER_HOST, "object_store_memory": 80 * 2**20}
    # every port of the cluster is one its Ray process binds itself
    with ray_test_cluster(node, [node] * (HOSTS - 1)) as cluster, \
            tempfile.TemporaryDirectory(prefix="topotune-faults-") as tmp:
        work = Path(tmp)
        kill = kill_loop(work, a.kills, a.trials, a.grace_s)
        restart = driver_restart(work, cluster.address, 6)
    print(f"kill -9 loop ({HOSTS} hosts x {GPUS_PER_HOST} GPUs, {a.trials} trials, 3 in flight, 2 retries):")
    for k, v in kill.items():
        print(f"  {k}: {v}")
    print("driver killed mid-study and restarted:")
    for k, v in restart.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
