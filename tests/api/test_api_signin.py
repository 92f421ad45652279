"""Browser sign-in: the session cookie's flags, CSRF and Origin rules for cookie-carried mutations, sign-out, and
the pages that drive the service (form JSON through the same validation as the API, live view, compare)."""

from __future__ import annotations

import re
import time

import pytest
from api_helpers import AUTH, FAST_STUDY, TOKEN, finished, wait_for

from api.sessions import SESSION_COOKIE, SessionSigner

ORIGIN = {"Origin": "http://testserver"}


def sign_in(client, token: str = TOKEN, next_url: str = "/ui"):
    return client.post("/ui/login", data={"token": token, "next": next_url}, headers=ORIGIN, follow_redirects=False)


def csrf_of(client) -> str:
    page = client.get("/ui").text
    return re.search(r'<meta name="csrf-token" content="([^"]*)">', page).group(1)


@pytest.fixture
def app_client(sqlite_url, make_settings, client_for):
    return client_for(make_settings(sqlite_url))


def test_sign_in_sets_a_strict_httponly_session_cookie(app_client):
    r = sign_in(app_client, next_url="/ui/new")
    assert r.status_code == 303 and r.headers["location"] == "/ui/new"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=v1.")
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/", "max-age=43200"} <= flags
    assert "secure" not in flags  # plain http here; https or TOPOTUNE_COOKIE_SECURE sets it
    assert TOKEN not in cookie
    assert 'id="sign-out"' in app_client.get("/ui").text and csrf_of(app_client)


def test_cookie_secure_setting(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url, cookie_secure=True, session_hours=1))
    flags = {p.strip().lower() for p in sign_in(client).headers["set-cookie"].split(";")[1:]}
    assert {"secure", "max-age=3600"} <= flags


@pytest.mark.parametrize("token", ["", "wrong-token-wrong-token", TOKEN + "x", TOKEN[:-1]])
def test_wrong_token_is_refused_without_a_cookie(app_client, token):
    r = sign_in(app_client, token=token)
    assert r.status_code == 401 and "wrong token" in r.text and "set-cookie" not in r.headers
    assert 'id="sign-in"' in app_client.get("/ui").text


def test_sign_in_posted_from_another_site_is_refused(app_client):
    r = app_client.post("/ui/login", data={"token": TOKEN}, headers={"Origin": "http://evil.example"},
                        follow_redirects=False)
    assert r.status_code == 403 and "set-cookie" not in r.headers


@pytest.mark.parametrize("target", ["//evil.example/x", "http://evil.example", "javascript:alert(1)", "/\\evil"])
def test_sign_in_never_redirects_off_site(app_client, target):
    assert sign_in(app_client, next_url=target).headers["location"] == "/ui"


def test_cookie_mutations_need_the_csrf_token_and_this_origin(app_client):
    sign_in(app_client)
    csrf = csrf_of(app_client)
    cases = [({**ORIGIN}, ["header", "x-csrf-token"]),
             ({**ORIGIN, "X-CSRF-Token": "forged"}, ["header", "x-csrf-token"]),
             ({"Origin": "http://evil.example", "X-CSRF-Token": csrf}, ["header", "origin"]),
             ({"Referer": "http://evil.example/page", "X-CSRF-Token": csrf}, ["header", "origin"]),
             ({"X-CSRF-Token": csrf}, ["header", "origin"]),  # neither Origin nor Referer
             ({"Origin": "null", "X-CSRF-Token": csrf}, ["header", "origin"])]
    for headers, loc in cases:
        r = app_client.post("/v1/studies", json=FAST_STUDY, headers=headers)
        assert r.status_code == 403 and r.json()["detail"][0]["loc"] == loc, (headers, r.text)
    assert app_client.get("/v1/studies").json()["total"] == 0
    r = app_client.post("/v1/studies", json=FAST_STUDY, headers={**ORIGIN, "X-CSRF-Token": csrf})
    assert r.status_code == 201, r.text
    r = app_client.post("/v1/studies", json=FAST_STUDY, headers={"Referer": "http://testserver/ui/new",
                                                                "X-CSRF-Token": csrf})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    r = app_client.post(f"/v1/studies/{sid}/cancel", headers={**ORIGIN, "X-CSRF-Token": csrf})
    assert r.status_code == 200 and r.json()["status"] in ("cancelled", "cancelling", "succeeded")


def test_bearer_clients_need_neither_csrf_nor_origin(app_client):
    r = app_client.post("/v1/studies", json=FAST_STUDY, headers={**AUTH, "Origin": "http://elsewhere.example"})
    assert r.status_code == 201
    assert app_client.post("/v1/studies", json=FAST_STUDY, headers=AUTH).status_code == 201


def test_the_dashboards_mutations_are_refused_even_signed_in(app_client):
    """Signed out, the auth check refuses a dashboard write first (401); signed in, a cross-site Origin is still
    refused (403); a same-site one reaches the dashboard, which is read-only inside topotune (405, nothing made)."""
    body = {"study_name": "from-the-dashboard", "directions": ["minimize"]}
    r = app_client.post("/api/studies", json=body, headers=ORIGIN)
    assert r.status_code == 401 and "/ui/login" in r.json()["detail"][0]["msg"]
    sign_in(app_client)
    assert app_client.post("/api/studies", json=body, headers={"Origin": "http://evil.example"}).status_code == 403
    assert app_client.post("/api/studies", json=body).status_code == 403  # no Origin, no Referer
    r = app_client.post("/api/studies", json=body, headers=ORIGIN)
    assert r.status_code == 405 and "read-only inside topotune" in r.json()["reason"], r.text
    names = [s["study_name"] for s in app_client.get("/api/studies").json()["study_summaries"]]
    assert "from-the-dashboard" not in names


def test_sign_out_ends_the_session(app_client):
    sign_in(app_client)
    stolen = app_client.cookies[SESSION_COOKIE]
    csrf = csrf_of(app_client)
    assert app_client.post("/ui/logout", headers=ORIGIN).status_code == 403  # sign-out is CSRF-protected too
    r = app_client.post("/ui/logout", headers={**ORIGIN, "X-CSRF-Token": csrf})
    assert r.status_code == 200 and f'{SESSION_COOKIE}=""' in r.headers["set-cookie"]
    app_client.cookies.set(SESSION_COOKIE, stolen)  # a copy of the cookie is dead too (revoked in this process)
    r = app_client.post("/v1/studies", json=FAST_STUDY, headers={**ORIGIN, "X-CSRF-Token": csrf})
    assert r.status_code == 401


def test_forged_and_expired_cookies_are_refused(app_client):
    other = SessionSigner("another-token-another-token", 3600)
    expired, _ = SessionSigner(TOKEN, 3600).issue(now=time.time() - 7200)
    for cookie in (other.issue()[0], expired, "v1.9999999999.nonce.sig", "garbage"):
        app_client.cookies.set(SESSION_COOKIE, cookie)
        r = app_client.post("/v1/studies", json=FAST_STUDY, headers=ORIGIN)
        assert r.status_code == 401, cookie
    assert app_client.get("/v1/studies").json()["total"] == 0


def test_read_auth_sends_browsers_to_the_sign_in(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url, read_auth=True))
    r = client.get("/ui/studies/1?x=1", headers={"Accept": "text/html"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=%2Fui%2Fstudies%2F1%3Fx%3D1"
    assert client.get("/ui/login").status_code == 200
    assert client.get("/v1/studies").status_code == 401
    sign_in(client)
    assert client.get("/v1/studies").status_code == 200 and client.get("/ui").status_code == 200


def test_auth_off_still_refuses_cross_origin_mutations(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url, auth=False, api_token=None))
    r = client.post("/v1/studies", json=FAST_STUDY, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["detail"][0]["loc"] == ["header", "origin"]
    assert client.post("/v1/studies", json=FAST_STUDY, headers=ORIGIN).status_code == 201
    assert "auth off" in client.get("/ui").text


# -- the pages that drive it -----------------------------------------------------------------------------------------
def test_new_study_page_offers_models_and_spaces(app_client):
    page = app_client.get("/ui/new").text
    assert "sign-in-needed" in page and re.search(r'id="start" type="submit"\s+disabled', page)
    assert "qwen3.8-2.4t-a95b-nvfp4" in page and "gb300-nvl72-8k1k.yaml" in page and "(default)" in page
    sign_in(app_client)
    page = app_client.get("/ui/new").text
    assert "sign-in-needed" not in page and not re.search(r'id="start" type="submit"\s+disabled', page)


def test_form_constraints_go_through_the_api_schema(app_client):
    bad = app_client.post("/v1/studies", json={**FAST_STUDY, "constraints": {"max_ttft_ms": -5, "percentile": "p95"}},
                          headers=AUTH)
    assert bad.status_code == 422
    assert {tuple(e["loc"]) for e in bad.json()["detail"]} == {("body", "constraints", "max_ttft_ms"),
                                                              ("body", "constraints", "percentile")}
    huge = app_client.post("/v1/studies", content=b'{"model_path": "x", "constraints": {"max_itl_ms": 1e400}}',
                           headers={**AUTH, "Content-Type": "application/json"})
    assert huge.status_code == 422 and huge.json()["detail"][0]["loc"] == ["body", "constraints", "max_itl_ms"]
    r = app_client.post("/v1/studies", json={**FAST_STUDY, "space_path": "gb300-nvl72-8k1k.yaml",
                                             "constraints": {"max_itl_ms": 25.0, "min_accuracy": None}},
                        headers=AUTH)
    assert r.status_code == 201, r.text
    detail = wait_for(app_client, r.json()["id"], finished)
    assert detail["constraints"]["max_itl_ms"] == 25.0 and detail["constraints"]["min_accuracy"] is None
    default = app_client.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
    assert app_client.get(f"/v1/studies/{default}").json()["constraints"]["max_itl_ms"] != 25.0


def test_live_view_shows_trials_in_flight_with_their_log(app_client):
    r = app_client.post("/v1/studies", json={**FAST_STUDY, "trials": 3, "trial_delay_s": 5.0, "phases": ["decode"]},
                        headers=AUTH)
    sid = r.json()["id"]
    deadline = time.monotonic() + 120
    while True:
        live = app_client.get(f"/ui/studies/{sid}/live").json()
        # the trial's thread may write its log before the driver records the launch event (and the file may
        # exist a moment before its first line): wait for the view to show all three
        if (live["in_flight"] and live["in_flight"][0]["logs"] and live["in_flight"][0]["logs"][0]["tail"]
                and any(e["kind"] == "launched" for e in live["events"])):
            break
        assert time.monotonic() < deadline, live
        time.sleep(0.2)
    trial = live["in_flight"][0]
    assert trial["phase"] == "decode" and "tp=" in trial["config"] and trial["running_s"] >= 0
    assert trial["logs"][0]["name"] == "trial.log" and "started in thread" in trial["logs"][0]["tail"]
    assert live["active"] and live["last_event_id"] > 0 and any(e["kind"] == "launched" for e in live["events"])
    page = app_client.get(f"/ui/studies/{sid}").text
    assert 'id="in-flight"' in page and 'id="cancel-needs-sign-in"' in page
    assert app_client.post(f"/v1/studies/{sid}/cancel", headers=AUTH).status_code == 200
    wait_for(app_client, sid, finished, timeout_s=120)
    assert app_client.get(f"/ui/studies/{sid}/live").json()["in_flight"] == []


def test_compare_page_defaults_to_the_two_newest(app_client):
    ids = [app_client.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"] for _ in range(2)]
    page = app_client.get("/ui/compare").text
    assert f"const ids = [{ids[0]}, {ids[1]}]" in page
    assert '"decode": ["total tokens/s per GPU (within the SLA)", "generated tokens/s per user"]' in page  # PHASE_AXES
    page = app_client.get(f"/ui/compare?a={ids[1]}&b={ids[0]}").text
    assert f"const ids = [{ids[1]}, {ids[0]}]" in page


def test_the_dashboard_page_says_why_it_is_read_only(app_client):
    page = app_client.get("/dashboard")
    assert page.status_code == 200 and 'id="topotune-banner"' in page.text and "Read-only inside topotune" in page.text
    assert int(page.headers["content-length"]) == len(page.content)
    assert "topotune-banner" not in app_client.get("/api/studies").text  # the JSON API is untouched
    sign_in(app_client)
    assert "Read-only inside topotune" in app_client.get("/dashboard").text  # signed in too: it stays read-only


def test_live_log_tails_are_bounded_and_stay_in_the_artifacts_folder(tmp_path):
    from api.live import LOG_TAIL_BYTES, read_trial_logs

    root = tmp_path / "artifacts"
    trial = root / "study_decode" / "trial-0001"
    trial.mkdir(parents=True)
    (trial / "trial.log").write_text("".join(f"line {i}\n" for i in range(5000)))
    (trial / "vllm").mkdir()
    (trial / "vllm" / "decode-0.log").write_text("INFO started\n")
    logs, note = read_trial_logs(str(trial), root)
    assert note is None and [t.name for t in logs] == ["trial.log", "vllm/decode-0.log"]
    assert len(logs[0].tail) <= LOG_TAIL_BYTES and logs[0].tail.startswith("line ") and logs[0].tail.endswith(
        "line 4999\n") and logs[0].size_bytes > LOG_TAIL_BYTES
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "trial.log").write_text("secret\n")
    (root / "escape").symlink_to(outside)
    for folder in (str(outside), str(root / "escape"), "/etc"):
        logs, note = read_trial_logs(folder, root)
        assert logs == [] and "outside the service's artifacts folder" in note
    logs, note = read_trial_logs(str(root / "not-yet"), root)
    assert logs == [] and "no log folder on this machine yet" in note
