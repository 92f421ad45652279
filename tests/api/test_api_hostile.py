"""Issue 14's holes, each answered with a 4xx naming the field (never a 5xx, never a hang): alias bombs, non-finite
numbers, oversized bodies, unbounded requests, symlinks out of the roots found by the watcher, unreadable configs,
a model left "tuning", a two-phase study said to have one phase."""

from __future__ import annotations

import json
import os
import time

import yaml
from api_helpers import AUTH, FAST_STUDY, MODELS, REFERENCE_MODEL, REPO, finished, wait_for

BOMB = "\n".join(['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
                 + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]) + "\nname: bomb\n"


def _timed(fn):
    started = time.monotonic()
    r = fn()
    return r, time.monotonic() - started


def test_alias_bomb_is_422_on_body_space_and_service_stays_healthy(sqlite_url, make_settings, client_for, model_store):
    client = client_for(make_settings(sqlite_url))
    r, took = _timed(lambda: client.post("/v1/studies", json={**FAST_STUDY, "space": BOMB}, headers=AUTH))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "space"], r.text
    assert "YAML nodes" in r.json()["detail"][0]["msg"] and took < 2.0
    (model_store / "bomb.yaml").write_text(BOMB)
    r = client.post("/v1/studies", json={**FAST_STUDY, "space_path": str(model_store / "bomb.yaml")}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "space_path"], r.text
    health, took = _timed(lambda: client.get("/healthz"))
    assert health.json()["status"] == "ok" and took < 1.0
    assert client.get("/v1/studies").json()["total"] == 0


def test_model_path_too_long_for_the_filesystem_is_422(sqlite_url, make_settings, client_for):
    """A path component over the filesystem's 255 bytes raised OSError (a 500) where the fuzz test found it."""
    client = client_for(make_settings(sqlite_url))
    for raw in ("~" * 300 + "/config.json", "%s" * 200):
        r = client.post("/v1/models", json={"path": raw}, headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "path"], r.text
    assert client.get("/healthz").status_code == 200


def test_non_finite_numbers_are_422_not_500(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url))
    base = json.dumps(FAST_STUDY)[:-1]
    space = yaml.safe_load((REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml").read_text())
    for raw, field in [(base + ', "trials": 1e400}', "trials"), (base + ', "trial_delay_s": NaN}', "trial_delay_s"),
                       (base + ', "noise": -Infinity}', "noise"), (base + ', "seed": 1e400}', "seed")]:
        r = client.post("/v1/studies", content=raw, headers={**AUTH, "content-type": "application/json"})
        assert r.status_code == 422, (raw, r.text)
        assert r.json()["detail"][0]["loc"] == ["body", field], r.text
    space["constraints"]["max_ttft_ms"] = "PLACEHOLDER"
    raw = json.dumps({**FAST_STUDY, "space": space}).replace('"PLACEHOLDER"', "1e400")
    r = client.post("/v1/studies", content=raw, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "space"], r.text
    assert "max_ttft_ms" in r.json()["detail"][0]["msg"]


def test_oversized_body_refused_fast(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url))
    huge = {**FAST_STUDY, "space": {"name": "x", "description": "y" * (10 * 2**20)}}
    r, took = _timed(lambda: client.post("/v1/studies", json=huge, headers=AUTH))
    assert r.status_code == 413 and r.json()["detail"][0]["loc"] == ["body"], r.text
    assert took < 2.0, took

    def chunks():  # no Content-Length: the running count refuses it
        for _ in range(20):
            yield b"x" * 2**20

    r = client.post("/v1/studies", content=chunks(), headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 413
    assert client.get("/healthz").json()["status"] == "ok"


def test_requests_are_bounded(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url))
    for extra, field in [({"trials": 5000}, "trials"), ({"trial_delay_s": 3600}, "trial_delay_s"),
                         ({"trials": 1000, "trial_delay_s": 100}, "trial_delay_s")]:
        r = client.post("/v1/studies", json={**FAST_STUDY, **extra}, headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], r.text


def test_watcher_refuses_symlinks_out_and_registers_broken_configs(sqlite_url, make_settings, client_for, tmp_path,
                                                                     monkeypatch):
    import api.watcher

    monkeypatch.setattr(api.watcher, "SETTLE_S", 1.0)
    store = tmp_path / "watched"
    store.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text((MODELS / "llama-3.1-70b" / "config.json").read_text())
    os.symlink(outside, store / "escape")  # inside the store, leading out of it
    (store / "notjson").mkdir()
    (store / "notjson" / "config.json").write_text("model_type: llama\n")
    (store / "huge").mkdir()
    with open(store / "huge" / "config.json", "wb") as f:
        f.truncate(17 * 2**20)
    client = client_for(make_settings(sqlite_url, models_dir=store, watch_models=True, allowed_roots=[store]))
    deadline = time.monotonic() + 20
    items: dict = {}
    while time.monotonic() < deadline and len(items) < 2:
        items = {m["name"]: m for m in client.get("/v1/models").json()["items"]}
        time.sleep(0.2)
    assert set(items) == {"notjson", "huge"}, items
    assert items["notjson"]["status"] == "unsupported" and "not complete JSON" in items["notjson"]["reason"]
    assert items["huge"]["status"] == "unsupported" and "larger than 16 MiB" in items["huge"]["reason"]
    watcher = client.app.state.watcher
    assert "outside the allowed roots" in watcher.refused[store / "escape"]
    assert client.get("/v1/studies").json()["total"] == 0  # nothing outside the roots was ever tuned


def test_model_is_tuned_after_its_study_succeeds(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url))
    model = client.post("/v1/models", json={"path": REFERENCE_MODEL}, headers=AUTH).json()
    assert model["status"] == "tuning"
    assert wait_for(client, model["study_id"], finished)["status"] == "succeeded"
    assert client.get("/v1/models").json()["items"][0]["status"] == "tuned"


def test_two_phase_study_waiting_for_decode_does_not_say_one_phase(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url))
    sid = client.post("/v1/studies", json={**FAST_STUDY, "trials": 20, "trial_delay_s": 0.3}, headers=AUTH).json()["id"]
    wait_for(client, sid, lambda d: d["phases"]["prefill"]["launched"] >= 1)
    front = client.get(f"/v1/studies/{sid}/pareto").json()
    assert "decode" not in front["phases"]  # 20 prefill trials of 0.3 s come first
    assert "one phase only" not in front["composition_error"] and "no decode trials yet" in front["composition_error"]
    client.post(f"/v1/studies/{sid}/cancel", headers=AUTH)


def test_cancel_and_shutdown_stop_a_long_trial_within_seconds(sqlite_url, make_settings, client_for):
    import optuna

    from tuner.study import open_storage

    settings = make_settings(sqlite_url, max_parallel_studies=1)
    client = client_for(settings)
    long = {**FAST_STUDY, "trials": 2, "trial_delay_s": 600, "warm_start": False}
    first = client.post("/v1/studies", json=long, headers=AUTH).json()["id"]
    wait_for(client, first, lambda d: d["status"] == "running" and any(
        e["kind"] == "launched" for e in d["recent_events"]), timeout_s=60)
    started = time.monotonic()
    assert client.post(f"/v1/studies/{first}/cancel", headers=AUTH).json()["status"] == "cancelling"
    assert wait_for(client, first, finished, timeout_s=30)["status"] == "cancelled"
    assert time.monotonic() - started < 15, "cancel must stop a running trial within seconds"
    # the one runner thread is free again: the next long study starts, then the service stops under it
    second = client.post("/v1/studies", json=long, headers=AUTH).json()["id"]
    wait_for(client, second, lambda d: d["status"] == "running" and any(
        e["kind"] == "launched" for e in d["recent_events"]), timeout_s=60)
    campaign = client.get(f"/v1/studies/{second}").json()["campaign"]
    started = time.monotonic()
    client.__exit__(None, None, None)
    assert time.monotonic() - started < 15, "shutdown must stop a running trial within seconds"
    study = optuna.load_study(study_name=f"{campaign}/prefill", storage=open_storage(settings.database_url))
    trials = study.get_trials()
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    stopped = [t for t in trials if t.user_attrs.get("reason") == "driver stopped"]
    queued = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert stopped and {t.user_attrs.get("retry_of") for t in queued} >= {t.number for t in stopped}
