"""Constants and polling helpers shared by the service tests (imported by name from tests/api)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from _support.paths import MODELS as MODELS  # re-exported for the service tests
from _support.paths import REPO
from fastapi.testclient import TestClient

REFERENCE_MODEL = "qwen3.8-2.4t-a95b-nvfp4"
TOKEN = "test-token-" + "x" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PG_DSN = "host=127.0.0.1 port=5432 dbname=test user=root connect_timeout=3"
ARTIFACTS = REPO / "test-artifacts"

FAST_STUDY: dict[str, Any] = {"model_path": REFERENCE_MODEL, "trials": 3, "sampler": "random", "seed": 1}


def wait_for(client: TestClient, study_id: int, until: Callable[[dict], bool], timeout_s: float = 300.0,
              ) -> dict[str, Any]:
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
