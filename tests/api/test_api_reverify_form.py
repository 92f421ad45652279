"""The study page's re-verify form: its fields and bounds come from the endpoint's schema, a signed-in browser posts
them to POST /v1/studies/{id}/reverify with the session's CSRF token (refused without it), the page then shows the
verdicts; the emulated version change is offered on simulated studies only. The page also links its cluster."""

from __future__ import annotations

import re

from api_helpers import AUTH, FAST_STUDY, TOKEN, finished, reverified, wait_for

from api.models import StudyRecord

ORIGIN = {"Origin": "http://testserver"}
VERSION = "0.33.0"


def _csrf(page: str) -> str:
    return re.search(r'<meta name="csrf-token" content="([^"]*)">', page).group(1)


def _input(page: str, element_id: str) -> dict[str, str]:
    tag = re.search(rf'<input id="{element_id}"[^>]*>', page)
    assert tag, element_id
    return dict(re.findall(r'(\w+)="([^"]*)"', tag.group(0)))


def test_reverify_form_posts_with_the_session_csrf_token(sqlite_url, make_settings, client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for(make_settings(sqlite_url))
    sid = client.post("/v1/studies", json={**FAST_STUDY, "trials": 4}, headers=AUTH).json()["id"]
    assert wait_for(client, sid, finished)["status"] == "succeeded"

    anonymous = client.get(f"/ui/studies/{sid}").text
    assert 'id="reverify-form"' in anonymous and 'id="reverify-needs-sign-in"' in anonymous
    assert re.search(r'id="reverify-start" type="submit"\s+disabled', anonymous)
    # the study records into its cluster's store: the page links that cluster's section, which exists
    link = re.search(r'href="/ui/clusters#([^"]+)" id="cluster-link">gb300-nvlink72\+infiniband<', anonymous)
    assert link and f'id="{link.group(1)}"' in client.get("/ui/clusters").text

    assert client.post("/ui/login", data={"token": TOKEN, "next": "/ui"}, headers=ORIGIN,
                       follow_redirects=False).status_code == 303
    page = client.get(f"/ui/studies/{sid}").text
    assert 'id="reverify-needs-sign-in"' not in page
    assert not re.search(r'id="reverify-start" type="submit"\s+disabled', page)
    budget, repeats = _input(page, "rv-budget"), _input(page, "rv-repeats")
    assert (budget["value"], budget["max"], repeats["value"], repeats["max"]) == ("8", "200", "3", "20")  # the schema's
    assert "checked" in re.search(r'<input id="rv-reopen"[^>]*>', page).group(0)
    assert 'id="rv-emulate"' in page  # a simulated study can emulate a version change
    # the script posts the form's JSON to the endpoint through the CSRF-carrying helper
    assert f'const rvUrl = "/v1/studies/{sid}/reverify"' in page
    assert 'window.topotune.send("POST", rvUrl, rvBody())' in page

    body = {"budget": int(budget["value"]), "repeats": int(repeats["value"]), "reopen": False, "emulate_vllm": VERSION}
    refused = client.post(f"/v1/studies/{sid}/reverify", json=body, headers=ORIGIN)  # the cookie alone
    assert refused.status_code == 403 and refused.json()["detail"][0]["loc"] == ["header", "x-csrf-token"]
    csrf = _csrf(page)
    bad = client.post(f"/v1/studies/{sid}/reverify", json={**body, "budget": 0},
                      headers={**ORIGIN, "X-CSRF-Token": csrf})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "budget"]
    assert 'data-field="budget"' in page  # where the form shows that error
    r = client.post(f"/v1/studies/{sid}/reverify", json=body, headers={**ORIGIN, "X-CSRF-Token": csrf})
    assert r.status_code == 202, r.text
    (report,) = reverified(client, sid)["reports"]
    assert report["vllm_version"] == VERSION and report["repeats"] == 3 and report["rows"]
    after = client.get(f"/ui/studies/{sid}").text
    assert f"Re-verified on vLLM {VERSION}" in after and "let reportsBefore = 1;" in after

    # a real-backend study re-runs on the hosts' vLLM: no emulation offered, and the endpoint refuses one
    with client.app.state.sessions() as s:
        s.get(StudyRecord, sid).backend = "vllm"
        s.commit()
    real = client.get(f"/ui/studies/{sid}").text
    assert 'id="reverify-form"' in real and 'id="rv-emulate"' not in real
    r = client.post(f"/v1/studies/{sid}/reverify", json=body, headers={**ORIGIN, "X-CSRF-Token": csrf})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "emulate_vllm"]
