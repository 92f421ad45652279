"""Re-verification through the service: POST /v1/studies/{id}/reverify after an emulated vLLM upgrade, the
report at GET .../reverify, the page's front per version with regressions marked, the recipe naming its version."""

from __future__ import annotations

from api_helpers import AUTH, FAST_STUDY, finished, reverified, wait_for

from tuner.backends._version_shift import SIMULATED_VLLM_VERSION, VersionShift
from tuner.space import SearchSpace

VERSION = "0.33.0"


def test_reverify_endpoint_page_and_export(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url))
    study = client.post("/v1/studies", json={**FAST_STUDY, "trials": 4}, headers=AUTH).json()
    sid = study["id"]
    assert wait_for(client, sid, finished)["status"] == "succeeded"
    assert client.get(f"/v1/studies/{sid}/reverify").json() == {"id": sid, "running": False, "error": None,
                                                                "reports": []}
    simulated = f"simulated (vLLM {SIMULATED_VLLM_VERSION.rsplit('.', 1)[0]} rules)"  # not "Verified on" (#46)
    assert simulated in client.get(f"/v1/studies/{sid}/export?point=0").text
    page = client.get(f"/ui/studies/{sid}").text
    assert ">measured on<" in page and simulated in page  # the study page's front says so too

    # bad bodies name the field; the token is required
    bad = client.post(f"/v1/studies/{sid}/reverify", json={"repeats": 0}, headers=AUTH)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "repeats"]
    assert client.post(f"/v1/studies/{sid}/reverify", json={}).status_code == 401
    assert client.post("/v1/studies/9999/reverify", json={}, headers=AUTH).status_code == 404

    r = client.post(f"/v1/studies/{sid}/reverify", json={"budget": 30, "repeats": 2, "emulate_vllm": VERSION,
                                                         "reopen": False}, headers=AUTH)
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/v1/studies/{sid}/reverify"
    body = reverified(client, sid)
    assert body["error"] is None
    (report,) = body["reports"]
    assert report["vllm_version"] == VERSION and report["rows"]
    # every verdict is the emulation's (its changes are beyond the noise test's grey zone)
    space = SearchSpace.model_validate(_space(client, sid))
    shift = VersionShift(SIMULATED_VLLM_VERSION, VERSION)
    for row in report["rows"]:
        topo = space.topology(row["phase"], row["params"])
        factor = shift.step_factor(topo)
        want = ("no longer starts" if shift.stops_starting(topo) else "unchanged" if factor == 1.0
                else "slower" if factor > 1 else "faster")
        assert row["verdict"] == want, row
    assert sum(report["counts"].values()) == len(report["rows"])
    events = client.get(f"/v1/studies/{sid}").json()["recent_events"]
    assert {"reverify", "reverified"} <= {e["kind"] for e in events}

    # the page: the last report's table, a front per version, regressions marked
    page = client.get(f"/ui/studies/{sid}").text
    assert 'id="reverify-table"' in page and f"Re-verified on vLLM {VERSION}" in page
    regressions = [r for r in report["rows"] if r["verdict"] in ("slower", "no longer starts")]
    assert page.count("bad regression") == len(regressions)
    figs = client.get(f"/ui/studies/{sid}/figures").json()["figures"]
    history = [f for f in figs if f["layout"].get("meta", {}).get("kind") == "version-history"]
    assert history
    names = {t["name"] for f in history for t in f["data"]}
    assert any(n.startswith(f"vLLM {SIMULATED_VLLM_VERSION}") for n in names)
    assert any(n.startswith(f"vLLM {VERSION}") for n in names)
    marked = sum(len(t["x"]) for f in history for t in f["data"] if t["name"].startswith("regression"))
    assert marked == len(regressions)


def _space(client, sid: int) -> dict:
    from api.models import StudyRecord

    with client.app.state.sessions() as s:
        return s.get(StudyRecord, sid).space


def test_watcher_reverifies_on_a_new_cluster_vllm_or_new_weights(sqlite_url, make_settings, client_for,
                                                                  model_store):
    from api.main import reverify_trigger
    from api.watcher import ModelWatcher

    settings = make_settings(sqlite_url)
    client = client_for(settings)
    sid = client.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
    assert wait_for(client, sid, finished)["status"] == "succeeded"
    calls: list[tuple[int, str, str | None]] = []
    watcher = ModelWatcher(settings, client.app.state.sessions, lambda _id: None,
                           lambda *call: calls.append(call))
    assert watcher.check_versions() == [] and calls == []  # nothing changed: no re-verification

    settings.cluster_vllm_version_file.parent.mkdir(parents=True, exist_ok=True)
    settings.cluster_vllm_version_file.write_text(f"{SIMULATED_VLLM_VERSION}\n")
    assert watcher.check_versions() == []  # the version the study ran on
    settings.cluster_vllm_version_file.write_text(f"{VERSION}\n")
    assert [c[0] for c in watcher.check_versions()] == [sid]
    assert calls[-1][0] == sid and calls[-1][2] == VERSION and f"vLLM {VERSION}" in calls[-1][1]
    assert watcher.check_versions() == []  # once per change
    settings.cluster_vllm_version_file.unlink()

    # new weights in the model's folder change its revision
    (model_store / FAST_STUDY["model_path"] / "pytorch_model.bin").write_bytes(b"new weights")
    assert [c[0] for c in watcher.check_versions()] == [sid]
    assert "weights changed" in calls[-1][1] and calls[-1][2] is None

    # the service's trigger runs the same re-verification as the endpoint, on the cluster's new version
    reverify_trigger(client.app.state.sessions, client.app.state.runner)(sid, "test: new vLLM", VERSION)
    (report,) = reverified(client, sid)["reports"]
    assert report["vllm_version"] == VERSION
