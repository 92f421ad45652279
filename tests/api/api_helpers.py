"""Constants and polling helpers shared by the service tests (imported by name from tests/api)."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
from _support.paths import MODELS as MODELS  # re-exported for the service tests
from _support.paths import REPO

from api.config import ApiSettings

REFERENCE_MODEL = "qwen3.8-2.4t-a95b-nvfp4"
TOKEN = "test-token-" + "x" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PG_DSN = "host=127.0.0.1 port=5432 dbname=test user=root connect_timeout=3"
ARTIFACTS = REPO / "test-artifacts"

FAST_STUDY: dict[str, Any] = {"model_path": REFERENCE_MODEL, "trials": 3, "sampler": "random", "seed": 1}


def reference_model_store(folder: Path) -> Path:
    """A model store under `folder` holding a copy of the reference model (clients name models relative to it)."""
    store = folder / "models"
    store.mkdir()
    shutil.copytree(MODELS / REFERENCE_MODEL, store / REFERENCE_MODEL)
    return store


def api_settings(folder: Path, database_url: str, models_dir: Path, **overrides: Any) -> ApiSettings:
    """The service's settings of these tests: local executor, small studies, data under `folder`."""
    values: dict[str, Any] = dict(data_dir=folder / "data", storage=database_url, api_token=TOKEN,
                                  executor="local", models_dir=models_dir, watch_models=False,
                                  max_parallel_studies=2, default_trials=3, default_sampler="random")
    values.update(overrides)
    return ApiSettings(**values)


def wait_for(client: httpx2.Client, study_id: int, until: Callable[[dict], bool], timeout_s: float = 300.0,
              ) -> dict[str, Any]:
    """The study's detail once `until` holds (the test client, or a client of a live server)."""
    deadline = time.monotonic() + timeout_s
    while True:
        detail = client.get(f"/v1/studies/{study_id}").json()
        if until(detail):
            return detail
        if time.monotonic() > deadline:
            raise AssertionError(f"study {study_id} still {detail['status']} after {timeout_s} s: {detail}")
        time.sleep(0.3)


def finished(detail: dict) -> bool:
    return detail["status"] in ("succeeded", "failed", "cancelled")


def reverified(client: httpx2.Client, study_id: int, timeout_s: float = 120.0) -> dict[str, Any]:
    """GET /v1/studies/{id}/reverify once the re-verification ended (its reports, or its error)."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(f"/v1/studies/{study_id}/reverify").json()
        if not body["running"] and (body["reports"] or body["error"]):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.3)


@contextmanager
def served(app: Any) -> Iterator[str]:
    """The app on a real port in a thread (what a browser reaches), its base URL; stopped on exit. The socket is
    bound here and handed to uvicorn, so no other process can take the port between its choice and the bind."""
    import uvicorn

    # proto IPPROTO_TCP, not socket()'s 0: asyncio disables Nagle only on sockets whose proto says TCP
    # (base_events._set_nodelay), and without it every keep-alive request waited ~44 ms for a delayed ACK
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # keep-alive longer than any pause a loaded machine puts between two polls: at uvicorn's 5 s the server can
    # close the idle connection just as the client reuses it ("Server disconnected without sending a response",
    # seen once with the suite at nice 19 beside two benchmark processes)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_keep_alive=120))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
