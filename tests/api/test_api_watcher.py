"""The model store watcher: a dropped folder starts a study that finishes; half-written configs are retried;
a duplicate does not start a second study."""

from __future__ import annotations

import json
import shutil
import time

from api_helpers import AUTH, MODELS, finished, wait_for


def _wait_models(client, n: int, timeout_s: float = 90.0) -> list[dict]:
    """The registered models once `n` are, polled: the bound is for a loaded 2-core machine (15 s failed there with
    a study's trials running beside the watcher), not a speed the watcher is held to."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items = client.get("/v1/models").json()["items"]
        if len(items) >= n:
            return items
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} models registered after {timeout_s} s")


def test_dropped_model_folder_is_tuned(sqlite_url, make_settings, client_for, tmp_path):
    store = tmp_path / "watched"
    store.mkdir()
    client = client_for(make_settings(sqlite_url, models_dir=store, watch_models=True,
                                      allowed_roots=[store]))
    assert client.get("/healthz").json()["watcher"] == "watching"

    # a checkpoint being copied: the folder first, config.json truncated, completed a moment later
    folder = store / "llama-3.1-70b"
    folder.mkdir()
    text = (MODELS / "llama-3.1-70b" / "config.json").read_text()
    (folder / "config.json").write_text(text[: len(text) // 2])
    time.sleep(1.5)  # the watcher saw it and must retry, not register it broken
    assert client.get("/v1/models").json()["total"] == 0
    (folder / "config.json").write_text(text)
    model = _wait_models(client, 1)[0]  # retried once complete: registered, not left as broken
    assert model["status"] == "tuning" and model["source"] == "watcher"
    detail = wait_for(client, model["study_id"], finished, timeout_s=120)
    assert detail["status"] == "succeeded", detail

    # the same model again: touched, re-announced over the webhook -> still one study
    (folder / "config.json").write_text(text)
    r = client.post("/v1/models", json={"path": str(folder)}, headers=AUTH)
    assert r.status_code == 200
    time.sleep(1.5)
    assert client.get("/v1/models").json()["total"] == 1
    assert client.get("/v1/studies").json()["total"] == 1

    # a second, different folder is picked up too (and a non-fitting one is registered with its reason)
    shutil.copytree(MODELS / "llama-3.1-70b", store / "copy-of-llama")
    big = json.loads(text)
    big["num_hidden_layers"] = 20_000
    (store / "giant").mkdir()
    (store / "giant" / "config.json").write_text(json.dumps(big))
    items = {m["name"]: m for m in _wait_models(client, 3)}
    assert items["giant"]["status"] == "does_not_fit" and items["giant"]["study_id"] is None
    assert items["copy-of-llama"]["status"] == "tuning"
    client.post(f"/v1/studies/{items['copy-of-llama']['study_id']}/cancel", headers=AUTH)
