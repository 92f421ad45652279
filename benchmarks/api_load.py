"""API latency on large studies: GET /v1/studies/{id}/pareto and GET /v1/studies/{id} at 1k, 5k and 10k stored
trials, cold (first request) and warm (p50/p99), while trials are being added and after a restart; 8 concurrent
cold requests against one; and POST /v1/studies under 20 concurrent clients. A real uvicorn server on 127.0.0.1
(a free port), SQLite in a temp dir, a bounded number of requests.

The trials are a real 3-trial simulated campaign whose measured points are replicated with a seeded perturbation
(so the fronts are computed over thousands of points). Set-up only: the copies are bulk-inserted with SQL into
Optuna's SQLite tables (Optuna's add_trials writes ~15 trials/s on a loaded 2-core machine); the service reads
them through Optuna like any trial.

Goals (issue 14): cold < 0.5 s, warm p99 < 100 ms, 8 concurrent cold requests no slower than one. "After a
restart" is a service that saw the trials before it stopped (its snapshot file is current); the rebuild without a
snapshot file (every trial read through Optuna) is printed too, alone and 8 at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import random
import shutil
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import httpx2
import uvicorn

warnings.filterwarnings("ignore")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from api.config import ApiSettings  # noqa: E402
from api.main import create_app  # noqa: E402

TOKEN = "bench-token-" + "x" * 20
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SIZES = (1_000, 5_000, 10_000)
WARM_REQUESTS = 200
CONCURRENT = 8
POST_CLIENTS = 20
POSTS_PER_CLIENT = 10
RATE_KEYS = ("total_tok_s", "output_tok_s", "total_tok_s_per_gpu", "output_tok_s_per_gpu", "request_throughput_rps")


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


class Server:
    """create_app under uvicorn in a thread: start, stop, start again on the same database (a restart)."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> str:
        """Its base URL. The socket is bound here and handed to uvicorn (which closes it on stop), so no other
        process can take the port between its choice and the bind; a restart binds a fresh one."""
        # proto IPPROTO_TCP, not socket()'s 0: asyncio disables Nagle only on sockets whose proto says TCP
        # (base_events._set_nodelay), and without it every keep-alive request waited ~44 ms for a delayed ACK
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_app(self.settings), host="127.0.0.1", port=port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        assert self.server is not None and self.thread is not None
        self.server.should_exit = True
        self.thread.join(timeout=120)


def _replicate(db: Path, campaign: str, target: int, rng: random.Random) -> int:
    """Add perturbed copies of the campaign's measured points until its phase studies hold `target` trials."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA synchronous=OFF")
    studies = [sid for (sid,) in conn.execute("SELECT study_id FROM studies WHERE study_name IN (?, ?)",
                                              (f"{campaign}/prefill", f"{campaign}/decode"))]
    total = conn.execute(f"SELECT COUNT(*) FROM trials WHERE study_id IN ({','.join('?' * len(studies))})",
                         studies).fetchone()[0]
    per_study = (target - total) // len(studies)
    next_id = conn.execute("SELECT MAX(trial_id) FROM trials").fetchone()[0] + 1
    for sid in studies:
        base = [tid for (tid,) in conn.execute(
            "SELECT t.trial_id FROM trials t JOIN trial_user_attributes a ON a.trial_id = t.trial_id "
            "WHERE t.study_id = ? AND t.state = 'COMPLETE' AND a.key = 'metrics'", (sid,))]
        number = conn.execute("SELECT MAX(number) FROM trials WHERE study_id = ?", (sid,)).fetchone()[0] + 1
        rows: dict[str, list[tuple]] = {"trials": [], "values": [], "params": [], "user": [], "system": []}
        for i in range(per_study):
            src, f = base[i % len(base)], 1.0 + rng.uniform(-0.2, 0.05)
            rows["trials"] += [(next_id, number, sid, *r) for r in conn.execute(
                "SELECT state, datetime_start, datetime_complete FROM trials WHERE trial_id = ?", (src,))]
            rows["values"] += [(next_id, o, v * f, vt) for o, v, vt in conn.execute(
                "SELECT objective, value, value_type FROM trial_values WHERE trial_id = ?", (src,))]
            rows["params"] += [(next_id, *r) for r in conn.execute(
                "SELECT param_name, param_value, distribution_json FROM trial_params WHERE trial_id = ?", (src,))]
            rows["system"] += [(next_id, *r) for r in conn.execute(
                "SELECT key, value_json FROM trial_system_attributes WHERE trial_id = ?", (src,))]
            for key, value in conn.execute("SELECT key, value_json FROM trial_user_attributes WHERE trial_id = ?",
                                           (src,)):
                if key in ("load_levels", "told_level"):  # a copy is one point (as a study stored before levels
                    continue  # were kept in their trial stored each level): 10k copies are 10k points, as before
                if key == "metrics":
                    m = json.loads(value)
                    value = json.dumps({**m, **{k: m[k] * f for k in RATE_KEYS}})
                elif key == "kind":
                    value = json.dumps("extra")
                rows["user"].append((next_id, key, value))
            rows["user"].append((next_id, "parent_trial", json.dumps(number)))
            next_id, number = next_id + 1, number + 1
        conn.executemany("INSERT INTO trials (trial_id, number, study_id, state, datetime_start, "
                         "datetime_complete) VALUES (?, ?, ?, ?, ?, ?)", rows["trials"])
        conn.executemany("INSERT INTO trial_values (trial_id, objective, value, value_type) VALUES (?, ?, ?, ?)",
                         rows["values"])
        conn.executemany("INSERT INTO trial_params (trial_id, param_name, param_value, distribution_json) "
                         "VALUES (?, ?, ?, ?)", rows["params"])
        conn.executemany("INSERT OR IGNORE INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, ?, ?)",
                         rows["user"])
        conn.executemany("INSERT INTO trial_system_attributes (trial_id, key, value_json) VALUES (?, ?, ?)",
                         rows["system"])
    conn.commit()
    total = conn.execute(f"SELECT COUNT(*) FROM trials WHERE study_id IN ({','.join('?' * len(studies))})",
                         studies).fetchone()[0]
    conn.close()
    return total


def _timed_get(http: httpx2.Client, path: str) -> float:
    t0 = time.perf_counter()
    r = http.get(path)
    assert r.status_code == 200, r.text
    return (time.perf_counter() - t0) * 1000


def _measure(base: str, sid: int, label: str) -> dict[str, float]:
    """Cold /pareto and /v1/studies/{id} (first requests), then warm p50/p99 of each."""
    with httpx2.Client(base_url=base, timeout=300) as http:
        cold_status = _timed_get(http, f"/v1/studies/{sid}")
        cold_front = _timed_get(http, f"/v1/studies/{sid}/pareto")
        rebuilt = _timed_get(http, f"/v1/studies/{sid}/trials?limit=1")  # waits for the background rebuild
        warm_front = [_timed_get(http, f"/v1/studies/{sid}/pareto") for _ in range(WARM_REQUESTS)]
        warm_status = [_timed_get(http, f"/v1/studies/{sid}") for _ in range(WARM_REQUESTS)]
    out = {"cold_status_ms": cold_status, "cold_pareto_ms": cold_front, "rebuilt_ms": rebuilt,
           "warm_pareto_p50_ms": _pct(warm_front, 50), "warm_pareto_p99_ms": _pct(warm_front, 99),
           "warm_status_p50_ms": _pct(warm_status, 50), "warm_status_p99_ms": _pct(warm_status, 99)}
    print(f"  {label:<34} cold: status {cold_status:6.0f} ms, pareto {cold_front:6.0f} ms (rebuilt in the "
          f"background in {rebuilt / 1000:.1f} s) | then warm p50/p99: "
          f"pareto {out['warm_pareto_p50_ms']:.1f}/{out['warm_pareto_p99_ms']:.1f} ms, "
          f"status {out['warm_status_p50_ms']:.1f}/{out['warm_status_p99_ms']:.1f} ms", flush=True)
    return out


def _concurrent_cold(base: str, sid: int) -> float:
    """Wall time of 8 simultaneous first GET /pareto (they must share one rebuild)."""
    barrier = threading.Barrier(CONCURRENT)

    def one(_i: int) -> float:
        with httpx2.Client(base_url=base, timeout=300) as http:
            barrier.wait()
            return _timed_get(http, f"/v1/studies/{sid}/pareto")

    with cf.ThreadPoolExecutor(CONCURRENT) as pool:
        return max(pool.map(one, range(CONCURRENT)))


def _while_adding(base: str, sid: int, db: Path, campaign: str, target: int) -> dict[str, float]:
    """GETs while trials keep landing (batches of 25 every 0.5 s): each poll sees new trials."""
    stop = threading.Event()
    rng = random.Random(1)

    def writer() -> None:
        total = target
        while not stop.is_set():
            total = _replicate(db, campaign, total + 50, rng)
            stop.wait(0.5)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    fronts, statuses = [], []
    try:
        with httpx2.Client(base_url=base, timeout=300) as http:
            deadline = time.monotonic() + 8.0
            while time.monotonic() < deadline:
                fronts.append(_timed_get(http, f"/v1/studies/{sid}/pareto"))
                statuses.append(_timed_get(http, f"/v1/studies/{sid}"))
                time.sleep(0.1)
    finally:
        stop.set()
        thread.join()
    out = {"adding_pareto_p50_ms": _pct(fronts, 50), "adding_pareto_max_ms": max(fronts),
           "adding_status_p50_ms": _pct(statuses, 50), "adding_status_max_ms": max(statuses)}
    print(f"  {'while trials are added':<34} pareto p50 {out['adding_pareto_p50_ms']:.0f} ms, max "
          f"{out['adding_pareto_max_ms']:.0f} ms | status p50 {out['adding_status_p50_ms']:.0f} ms, max "
          f"{out['adding_status_max_ms']:.0f} ms ({len(fronts)} polls)", flush=True)
    return out


def _posts(base: str) -> None:
    def client(_i: int) -> list[float]:
        out = []
        with httpx2.Client(base_url=base, timeout=60) as c:
            for _ in range(POSTS_PER_CLIENT):
                t0 = time.perf_counter()
                r = c.post("/v1/studies", json={"model_path": "ref", "trials": 1, "sampler": "random",
                                                "phases": ["decode"], "warm_start": False}, headers=AUTH)
                out.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 201, r.text
        return out

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(POST_CLIENTS) as pool:
        posts = [x for chunk in pool.map(client, range(POST_CLIENTS)) for x in chunk]
    wall = time.perf_counter() - t0
    print(f"POST /v1/studies, {POST_CLIENTS} concurrent clients x {POSTS_PER_CLIENT}: p50 {_pct(posts, 50):.1f} ms,"
          f" p99 {_pct(posts, 99):.1f} ms, {len(posts) / wall:.0f} requests/s")
    with httpx2.Client(base_url=base, timeout=60) as http:  # stop the queued studies before shutting down
        for item in http.get("/v1/studies", params={"limit": 500}).json()["items"]:
            if item["status"] in ("queued", "running"):
                http.post(f"/v1/studies/{item['id']}/cancel", headers=AUTH)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="topotune-bench-"))
    models = tmp / "models"
    models.mkdir()
    shutil.copytree(REPO / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4", models / "ref")
    settings = ApiSettings(data_dir=tmp, api_token=TOKEN, executor="local", models_dir=models, watch_models=False,
                           allowed_roots=[models, REPO / "search_spaces"], max_parallel_studies=1)
    db = Path(settings.database_url.split("///", 1)[1])
    server = Server(settings)
    base = server.start()
    with httpx2.Client(base_url=base, timeout=120) as http:
        sid = http.post("/v1/studies", json={"model_path": "ref", "trials": 3, "sampler": "random"},
                        headers=AUTH).json()["id"]
        while http.get(f"/v1/studies/{sid}").json()["status"] not in ("succeeded", "failed"):
            time.sleep(0.3)
        campaign = http.get(f"/v1/studies/{sid}").json()["campaign"]
    server.stop()
    rng = random.Random(0)
    snapshot = settings.data_dir / "snapshots" / f"{sid}.json"
    worst_cold = worst_p99 = 0.0
    for size in SIZES:
        stored = _replicate(db, campaign, size, rng)
        print(f"{stored} stored trials:", flush=True)
        snapshot.unlink(missing_ok=True)  # no snapshot file: every trial is read (the rebuild)
        base = server.start()
        with httpx2.Client(base_url=base, timeout=300) as http:
            rebuild_ms = _timed_get(http, f"/v1/studies/{sid}/pareto")
        server.stop()
        snapshot.unlink(missing_ok=True)
        base = server.start()
        concurrent_ms = _concurrent_cold(base, sid)
        server.stop()
        base = server.start()  # the service saw every trial before it stopped: the snapshot file answers
        figures = _measure(base, sid, "after a restart")
        figures |= _while_adding(base, sid, db, campaign, stored)
        server.stop()
        print(f"  rebuild without a snapshot file (every trial read): one cold GET /pareto {rebuild_ms:.0f} ms; "
              f"{CONCURRENT} concurrent: slowest {concurrent_ms:.0f} ms (ratio {concurrent_ms / rebuild_ms:.2f}: "
              "one shared rebuild)", flush=True)
        worst_cold = max(worst_cold, figures["cold_pareto_ms"], figures["cold_status_ms"])
        worst_p99 = max(worst_p99, figures["warm_pareto_p99_ms"], figures["warm_status_p99_ms"])
    print(f"worst cold after a restart {worst_cold:.0f} ms (goal < 500), worst warm p99 {worst_p99:.1f} ms "
          "(goal < 100)")
    base = server.start()
    try:
        _posts(base)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
