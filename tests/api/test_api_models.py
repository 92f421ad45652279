"""POST /v1/models: registration starts one study; a model that fits nowhere is registered with the reason."""

from __future__ import annotations

import json
import shutil

from api_helpers import AUTH, MODELS, finished, wait_for


def huge_model(store, name: str = "too-big") -> str:
    """A dense model far larger than 72 GB300 GPUs can hold (every other field real)."""
    folder = store / name
    folder.mkdir()
    config = json.loads((MODELS / "llama-3.1-70b" / "config.json").read_text())
    config["num_hidden_layers"] = 20_000
    (folder / "config.json").write_text(json.dumps(config))
    return name


def test_register_model_starts_one_study(sqlite_url, make_settings, client_for, model_store):
    shutil.copytree(MODELS / "llama-3.1-70b", model_store / "llama-3.1-70b")
    client = client_for(make_settings(sqlite_url))
    r = client.post("/v1/models", json={"path": "llama-3.1-70b"}, headers=AUTH)
    assert r.status_code == 201, r.text
    model = r.json()
    assert model["status"] == "tuning" and model["study_id"]
    again = client.post("/v1/models", json={"path": str(model_store / "llama-3.1-70b")}, headers=AUTH)
    assert again.status_code == 200 and again.json()["id"] == model["id"]
    assert client.get("/v1/studies").json()["total"] == 1
    detail = wait_for(client, model["study_id"], finished, timeout_s=120)
    assert detail["status"] == "succeeded", detail
    listed = client.get("/v1/models").json()
    assert listed["total"] == 1 and listed["items"][0]["name"] == "llama-3.1-70b"


def test_model_that_cannot_fit_gets_no_study(sqlite_url, make_settings, client_for, model_store):
    client = client_for(make_settings(sqlite_url))
    r = client.post("/v1/models", json={"path": huge_model(model_store)}, headers=AUTH)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "does_not_fit" and body["study_id"] is None
    assert "cannot fit anywhere" in body["reason"]
    assert client.get("/v1/studies").json()["total"] == 0


def test_half_written_config_is_refused_not_crashed(sqlite_url, make_settings, client_for, model_store):
    (model_store / "partial").mkdir()
    (model_store / "partial" / "config.json").write_text('{"model_type": "llama", "hidden_si')
    client = client_for(make_settings(sqlite_url))
    r = client.post("/v1/models", json={"path": "partial"}, headers=AUTH)
    assert r.status_code == 422 and "not complete JSON" in r.json()["detail"][0]["msg"]
    assert client.get("/v1/models").json()["total"] == 0  # nothing registered: a later retry can succeed
