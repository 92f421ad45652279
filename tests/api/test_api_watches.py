"""Deployment watches in the service (SQLite and PostgreSQL): CRUD with sign-in, periods driven through
POST /v1/watches/{id}/check against a loopback /metrics page serving real vLLM windows, one advice per traffic
change, the history, the timer, and the page."""

from __future__ import annotations

import itertools
import re
import time

import pytest
from _support.metrics_servers import MetricsPage, cumulative, exposition, serving
from api_helpers import AUTH, MODELS

from tuner.workload import parse_exposition

ORIGIN = {"Origin": "http://testserver"}


def _inc(before: str, after: str):
    return parse_exposition(exposition(after), "s").minus(parse_exposition(exposition(before), "s"), source="s")


START = parse_exposition(exposition("cpu_idle.txt"), "s")
PHASE1 = _inc("cpu_idle.txt", "cpu_after_40.txt")  # ~350-token prompts, 70% prefix hits
PHASE2 = _inc("cpu_after_40.txt", "cpu_after_56.txt")  # 600-token prompts, no prefix hits


@pytest.fixture
def client(database_url, make_settings, client_for, tmp_path):
    import shutil

    store = tmp_path / "models"
    shutil.copytree(MODELS / "llama-3.1-70b", store / "llama-3.1-70b")
    c = client_for(make_settings(database_url, models_dir=store))
    ticks = itertools.count(0.0, 8.0)  # every period an 8 s window, whatever the wall clock did
    c.app.state.deployment_watcher.clock = lambda: next(ticks)
    return c


def _body(url: str, **extra: object) -> dict:
    return {"name": "chat", "urls": [url], "deployment": "TP4", "serve_flags": "--max-num-seqs 64",
            "model_path": "llama-3.1-70b", "hardware": "gb300", "max_gpus": 16, "period_s": 3600,
            "enabled": False, **extra}


def test_a_watch_fires_once_on_a_traffic_change(client) -> None:
    scrapes = cumulative(START, PHASE1, PHASE1, PHASE1, PHASE2, PHASE2, PHASE2)
    with serving(MetricsPage(*scrapes)) as url:
        r = client.post("/v1/watches", json=_body(url), headers=AUTH)
        assert r.status_code == 201, r.text
        wid = r.json()["id"]
        assert r.json()["urls"] == [f"{url}/metrics"]
        kinds = [client.post(f"/v1/watches/{wid}/check", headers=AUTH).json()["kind"] for _ in scrapes]
    assert kinds == ["primed", "baseline", "baseline", "steady", "pending", "advice", "baseline"]
    detail = client.get(f"/v1/watches/{wid}").json()
    advice = detail["latest_advice"]
    assert advice["kind"] == "advice" and "input length p50" in " ".join(advice["detail"]["reasons"])
    assert "vllm serve" in advice["detail"]["advice"]["commands"]
    assert advice["detail"]["expected"]["gpus_now"] == 4
    assert detail["baseline"]["input_p50"] == pytest.approx(600)
    history = client.get(f"/v1/watches/{wid}/history").json()
    assert [h["kind"] for h in history] == list(reversed(kinds))  # newest first
    page = client.get(f"/ui/watches/{wid}").text
    assert "vllm serve" in page and 'id="latest-advice"' in page and "input length p50" in page
    listing = client.get("/ui/watches").text
    assert 'href="/ui/watches/' in listing
    assert 'id="new-watch"' not in listing  # a reader without sign-in gets no form


def test_bad_input_names_the_field(client) -> None:
    cases = [({"urls": ["file:///etc/passwd"]}, ["body", "urls", 0]),
             ({"deployment": "TP4X"}, ["body", "deployment"]),
             ({"serve_flags": "--max-num-seqs"}, ["body", "serve_flags"]),
             ({"model_path": "/etc"}, ["body", "model_path"]),
             ({"hardware": "tpu9"}, ["body", "hardware"]),
             ({"period_s": 0}, ["body", "period_s"])]
    for extra, loc in cases:
        r = client.post("/v1/watches", json=_body("http://127.0.0.1:9/metrics", **extra), headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, (extra, r.text)
    assert client.get("/v1/watches").json() == {"watches": []}


def test_writes_need_sign_in_and_csrf(client) -> None:
    body = _body("http://127.0.0.1:9/metrics")
    assert client.post("/v1/watches", json=body).status_code == 401
    r = client.post("/v1/watches", json=body, headers=AUTH)
    wid = r.json()["id"]
    assert client.delete(f"/v1/watches/{wid}").status_code == 401
    signed = client.post("/ui/login", data={"token": AUTH["Authorization"].split()[1], "next": "/ui"},
                         headers=ORIGIN, follow_redirects=False)
    assert signed.status_code == 303
    refused = client.patch(f"/v1/watches/{wid}", json={"enabled": True}, headers=ORIGIN)  # cookie, no CSRF token
    assert refused.status_code == 403
    listing = client.get("/ui/watches").text
    assert 'id="new-watch"' in listing and 'window.topotune.send("POST", "/v1/watches", body)' in listing
    assert 'id="check-now"' in client.get(f"/ui/watches/{wid}").text
    csrf = re.search(r'<meta name="csrf-token" content="([^"]*)">', listing).group(1)
    ok = client.patch(f"/v1/watches/{wid}", json={"name": "renamed"}, headers={**ORIGIN, "X-CSRF-Token": csrf})
    assert ok.status_code == 200 and ok.json()["name"] == "renamed"
    assert client.delete(f"/v1/watches/{wid}", headers={**ORIGIN, "X-CSRF-Token": csrf}).status_code == 204
    assert client.get(f"/v1/watches/{wid}").status_code == 404


def test_an_unreachable_server_is_a_period_with_its_error(client) -> None:
    wid = client.post("/v1/watches", json=_body("http://127.0.0.1:9/metrics"), headers=AUTH).json()["id"]
    event = client.post(f"/v1/watches/{wid}/check", headers=AUTH).json()
    assert event["kind"] == "error" and "cannot reach http://127.0.0.1:9/metrics" in event["message"]
    assert client.get(f"/v1/watches/{wid}").json()["last_error"] == event["message"]


def test_the_timer_checks_enabled_watches_every_period(client) -> None:
    with serving(MetricsPage(*cumulative(START, PHASE1, PHASE1, PHASE1, PHASE1))) as url:
        wid = client.post("/v1/watches", json=_body(url, enabled=True, period_s=1), headers=AUTH).json()["id"]
        deadline = time.monotonic() + 120
        kinds: list[str] = []
        while time.monotonic() < deadline and "baseline" not in kinds:
            kinds = [h["kind"] for h in client.get(f"/v1/watches/{wid}/history").json()]
            time.sleep(0.2)
        client.patch(f"/v1/watches/{wid}", json={"enabled": False}, headers=AUTH)
    assert kinds[-2:] == ["baseline", "primed"]
