"""Bearer token, refused default tokens, paths confined to the roots, configs read as JSON only."""

from __future__ import annotations

import json
import os

import pytest
from api_helpers import AUTH, FAST_STUDY, MODELS, REFERENCE_MODEL, TOKEN
from pydantic import ValidationError

from api.config import ApiSettings

MUTATING = [("post", "/v1/studies", FAST_STUDY), ("post", "/v1/studies/1/cancel", None),
            ("post", "/v1/models", {"path": REFERENCE_MODEL}), ("delete", "/api/studies/1", None),
            ("put", "/v1/studies", {}), ("post", "/api/studies", {"study_name": "x", "directions": ["minimize"]})]


@pytest.mark.parametrize("method,path,body", MUTATING)
@pytest.mark.parametrize("header", [None, "Bearer wrong-token-wrong-token", f"Basic {TOKEN}", f"bearer{TOKEN}"])
def test_unauthenticated_mutations_are_refused(sqlite_url, make_settings, client_for, method, path, body, header):
    client = client_for(make_settings(sqlite_url))
    headers = {"Authorization": header} if header else {}
    r = client.request(method.upper(), path, json=body, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert client.get("/v1/studies").json()["total"] == 0


def test_read_auth_flag(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url, read_auth=True))
    assert client.get("/v1/studies").status_code == 401
    assert client.get("/ui").status_code == 401
    assert client.get("/v1/studies", headers=AUTH).status_code == 200
    assert client.get("/healthz").status_code == 200  # the orchestrator's probe stays open


@pytest.mark.parametrize("token", [None, "", "changeme", "secret", "short-token"])
def test_default_or_empty_token_refused(tmp_path, token):
    with pytest.raises(ValidationError, match="TOPOTUNE_API_TOKEN"):
        ApiSettings(data_dir=tmp_path, api_token=token)


def test_auth_off_only_on_loopback(tmp_path):
    assert ApiSettings(data_dir=tmp_path, auth=False).token() is None
    with pytest.raises(ValidationError, match="loopback"):
        ApiSettings(data_dir=tmp_path, auth=False, host="0.0.0.0")


def test_settings_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOTUNE_API_TOKEN", TOKEN)
    monkeypatch.setenv("TOPOTUNE_STORAGE", "postgresql://u@db/topotune")
    monkeypatch.setenv("TOPOTUNE_ALLOWED_ROOTS", json.dumps([str(tmp_path)]))
    monkeypatch.setenv("TOPOTUNE_DATA_DIR", str(tmp_path))
    s = ApiSettings()
    assert s.database_url == "postgresql+psycopg://u@db/topotune" and s.allowed_roots == [tmp_path]
    assert s.model_store == tmp_path / "models"


@pytest.mark.parametrize("path", ["../models/" + REFERENCE_MODEL, f"{REFERENCE_MODEL}/../../etc", "/etc",
                                  str(MODELS / REFERENCE_MODEL), "/etc/passwd", "escape"])
def test_paths_confined_to_roots(sqlite_url, make_settings, client_for, model_store, path):
    os.symlink("/etc", model_store / "escape")  # a symlink inside the root that leads out of it
    client = client_for(make_settings(sqlite_url))
    r = client.post("/v1/studies", json={**FAST_STUDY, "model_path": path}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "model_path"], r.text
    r = client.post("/v1/studies", json={**FAST_STUDY, "space_path": "/etc/passwd"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "space_path"]
    r = client.post("/v1/models", json={"path": path}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "path"]


def test_model_config_is_json_only(sqlite_url, make_settings, client_for, model_store):
    """A config asking for remote code is read as data: the auto_map is never imported or run."""
    evil = model_store / "evil"
    evil.mkdir()
    config = json.loads((MODELS / REFERENCE_MODEL / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    config["trust_remote_code"] = True
    (evil / "config.json").write_text(json.dumps(config))
    (evil / "configuration_evil.py").write_text(f"open({str(model_store / 'pwned')!r}, 'w').write('x')\n")
    client = client_for(make_settings(sqlite_url))
    r = client.post("/v1/models", json={"path": "evil", "auto_tune": False}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert not (model_store / "pwned").exists()
    fifo = model_store / "fifo-model"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")  # would block a naive reader forever
    r = client.post("/v1/models", json={"path": "fifo-model"}, headers=AUTH)
    assert r.status_code == 422 and "regular file" in r.json()["detail"][0]["msg"]
