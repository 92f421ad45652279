"""API latency: GET /v1/studies/{id}/pareto with 10,000 stored trials, and POST /v1/studies under 20 concurrent
clients. A real uvicorn server on 127.0.0.1 (a free port), a bounded number of requests, SQLite in a temp dir.

The 10,000 trials are a real 3-trial simulated campaign whose measured points are replicated with a seeded
perturbation (so the composed front is computed over thousands of points, as in a long campaign).
Goal: p99 < 100 ms for the front (served from the per-study cache keyed by the trials' state counts).
"""

from __future__ import annotations

import concurrent.futures as cf
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import httpx
import optuna
import uvicorn
from sqlalchemy import event

warnings.filterwarnings("ignore")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from api.config import ApiSettings  # noqa: E402
from api.main import create_app  # noqa: E402
from tuner.study import open_storage  # noqa: E402

TOKEN = "bench-token-" + "x" * 20
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TARGET_TRIALS = 10_000
FRONT_REQUESTS = 400
POST_CLIENTS = 20
POSTS_PER_CLIENT = 10


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def _inflate(storage_url: str, campaign: str, target: int) -> int:
    """Copy the campaign's measured points (perturbed) until the phase studies hold `target` trials in total."""
    storage = open_storage(storage_url)
    engine = storage.engine

    @event.listens_for(engine, "connect")
    def _fast(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]  # bench set-up only: no fsync
        dbapi_conn.execute("PRAGMA synchronous=OFF")

    engine.dispose()
    studies = [optuna.load_study(study_name=f"{campaign}/{p}", storage=storage) for p in ("prefill", "decode")]
    rng = random.Random(0)
    for study in studies:
        base = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE and t.values
                and "metrics" in t.user_attrs]
        need = target // 2 - len(study.get_trials())
        batch = []
        for i in range(need):
            t = base[i % len(base)]
            f = 1.0 + rng.uniform(-0.2, 0.05)
            attrs = dict(t.user_attrs)
            m = dict(attrs["metrics"])
            for k in ("total_tok_s", "output_tok_s", "total_tok_s_per_gpu", "output_tok_s_per_gpu",
                      "request_throughput_rps"):
                m[k] = m[k] * f
            attrs.update(metrics=m, kind="extra", parent_trial=t.number)
            batch.append(optuna.trial.create_trial(params=t.params, distributions=t.distributions,
                                                   values=[v * f for v in t.values], user_attrs=attrs,
                                                   constraints=t.constraints))
        study.add_trials(batch)
    return sum(len(s.get_trials()) for s in studies)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="topotune-bench-"))
    models = tmp / "models"
    models.mkdir()
    shutil.copytree(REPO / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4", models / "ref")
    settings = ApiSettings(data_dir=tmp, api_token=TOKEN, executor="local", models_dir=models, watch_models=False,
                           allowed_roots=[models, REPO / "search_spaces"], max_parallel_studies=1)
    port = _port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=120) as http:
            sid = http.post("/v1/studies", json={"model_path": "ref", "trials": 3, "sampler": "random"},
                            headers=AUTH).json()["id"]
            while http.get(f"/v1/studies/{sid}").json()["status"] not in ("succeeded", "failed"):
                time.sleep(0.3)
            campaign = http.get(f"/v1/studies/{sid}").json()["campaign"]
            t0 = time.perf_counter()
            stored = _inflate(settings.database_url, campaign, TARGET_TRIALS)
            print(f"stored trials: {stored} (inflated in {time.perf_counter() - t0:.1f} s)")

            t0 = time.perf_counter()
            cold = http.get(f"/v1/studies/{sid}/pareto")
            cold_ms = (time.perf_counter() - t0) * 1000
            body = cold.json()
            print(f"front: {len(body['composed_front'])} composed points, "
                  + ", ".join(f"{p} {len(v['front'])} of {v['points_total']}" for p, v in body["phases"].items()))
            lat = []
            for _ in range(FRONT_REQUESTS):
                t0 = time.perf_counter()
                r = http.get(f"/v1/studies/{sid}/pareto")
                lat.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200
            print(f"GET /pareto, 10k trials: cold {cold_ms:.0f} ms (loads and composes), then {FRONT_REQUESTS} "
                  f"requests: p50 {_pct(lat, 50):.1f} ms, p99 {_pct(lat, 99):.1f} ms  (goal p99 < 100 ms)")

        def client(_i: int) -> list[float]:
            out = []
            with httpx.Client(base_url=base, timeout=60) as c:
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
        with httpx.Client(base_url=base, timeout=60) as http:  # stop the queued studies before shutting down
            for item in http.get("/v1/studies", params={"limit": 500}).json()["items"]:
                if item["status"] in ("queued", "running"):
                    http.post(f"/v1/studies/{item['id']}/cancel", headers=AUTH)
    finally:
        server.should_exit = True
        thread.join(timeout=120)


if __name__ == "__main__":
    main()
