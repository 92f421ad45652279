"""A study through the API on SQLite and PostgreSQL: start, poll, front, export, trials, cancel, restart/resume."""

from __future__ import annotations

import optuna
import pytest
import yaml
from api_helpers import AUTH, FAST_STUDY, REPO, finished, wait_for

from tuner.study import open_storage


def test_study_lifecycle(database_url, make_settings, client_for):
    client = client_for(make_settings(database_url))
    r = client.post("/v1/studies", json=FAST_STUDY, headers=AUTH)
    assert r.status_code == 201, r.text
    study = r.json()
    assert study["status"] == "queued" and r.headers["location"] == f"/v1/studies/{study['id']}"

    detail = wait_for(client, study["id"], finished)
    assert detail["status"] == "succeeded", detail
    assert detail["launched"] == detail["budget"] == 6 and detail["progress_fraction"] == 1.0
    for phase in ("prefill", "decode"):
        assert detail["phases"][phase]["launched"] == 3
        assert sum(detail["phases"][phase]["counts"].values()) >= 3
    assert {e["kind"] for e in detail["recent_events"]} >= {"succeeded", "front"}

    listing = client.get("/v1/studies").json()
    assert listing["total"] == 1 and listing["items"][0]["id"] == study["id"]

    front = client.get(f"/v1/studies/{study['id']}/pareto").json()
    assert front["composed_front"], front["composition_error"]
    assert all(p["constraints"] and all(v <= 0 for v in p["constraints"].values())
               for ph in front["phases"].values() for p in ph["front"])
    assert front["exportable_points"] == len(front["composed_front"])
    tok = [p["total_tok_s_per_gpu"] for p in front["composed_front"]]
    assert tok == sorted(tok) or tok == sorted(tok, reverse=True)  # a front is monotone in one axis

    for fmt in ("vllm", "compose", "kubernetes", "dynamo", "srt-slurm"):
        e = client.get(f"/v1/studies/{study['id']}/export", params={"point": 0, "format": fmt})
        assert e.status_code == 200 and "topotune" in e.text, e.text
    assert "vllm serve" in client.get(f"/v1/studies/{study['id']}/export?point=0").text
    yaml.safe_load(client.get(f"/v1/studies/{study['id']}/export?point=0&format=compose").text)
    bad = client.get(f"/v1/studies/{study['id']}/export", params={"point": 999})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "point"]

    # a trial is one tried configuration: its load levels are listed under it, never as trials of their own
    page = client.get(f"/v1/studies/{study['id']}/trials", params={"limit": 2, "phase": "decode"}).json()
    assert len(page["items"]) == 2 and page["total"] == sum(detail["phases"]["decode"]["counts"].values())
    assert all(t["phase"] == "decode" and t["kind"] != "extra" for t in page["items"])
    page2 = client.get(f"/v1/studies/{study['id']}/trials", params={"limit": 2, "offset": 2, "phase": "decode"})
    assert page2.json()["items"][0]["trial_number"] != page["items"][0]["trial_number"]
    every = client.get(f"/v1/studies/{study['id']}/trials", params={"phase": "decode"}).json()["items"]
    launched = [t for t in every if t["kind"] == "sampled" and t["status"] == "ok"]
    assert len(launched) == 3 and all(len(t["levels"]) > 1 for t in launched)  # each measured at several loads
    # one trial is one Optuna trial: numbered #0, #1, ..., holding its levels, told exactly one of them
    assert sorted(t["trial_number"] for t in every) == list(range(len(every)))
    assert all(lv["stored_as"] == t["trial_number"] for t in every for lv in t["levels"])
    assert all(sum(lv["told"] for lv in t["levels"]) == 1 for t in launched)
    levels = {(t["trial_number"], lv["level"]) for t in every for lv in t["levels"]}
    for p in front["phases"]["decode"]["front"]:  # a front point names its trial and level, as the table does
        assert (p["trial_number"], p["level"]) in levels and p["level"] == f"c{p['concurrency']}"

    metrics = client.get("/metrics").text
    assert 'topotune_studies{status="succeeded"} 1.0' in metrics
    assert 'topotune_trials{state="COMPLETE"}' in metrics
    assert "topotune_trial_duration_seconds_count" in metrics
    assert client.get("/v1/studies/999").status_code == 404


def test_inline_space_and_space_file(sqlite_url, make_settings, client_for):
    client = client_for(make_settings(sqlite_url))
    space = yaml.safe_load((REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml").read_text())
    space["constraints"]["max_itl_ms"] = 12.0
    r = client.post("/v1/studies", json={**FAST_STUDY, "space": space, "phases": ["decode"]}, headers=AUTH)
    assert r.status_code == 201, r.text
    r2 = client.post("/v1/studies", json={**FAST_STUDY, "space_path": "gb300-nvl72-8k1k.yaml",
                                          "phases": ["prefill"]}, headers=AUTH)
    assert r2.status_code == 201, r2.text
    d = wait_for(client, r.json()["id"], finished)
    assert d["status"] == "succeeded" and list(d["phases"]) == ["decode"] and d["constraints"]["max_itl_ms"] == 12
    front = client.get(f"/v1/studies/{d['id']}/pareto").json()
    assert all(p["itl_ms_p50"] <= 12.0 for p in front["phases"]["decode"]["front"])
    trials = client.get(f"/v1/studies/{d['id']}/trials", params={"limit": 1000}).json()["items"]
    # an SLA-violating point is stored, marked infeasible, and kept off the front
    slow = [t for t in trials if t["constraints"].get("itl", 0) > 0]
    assert all(not t["feasible"] for t in slow)
    assert wait_for(client, r2.json()["id"], finished)["status"] == "succeeded"
    # a broken inline space names the field and the line
    bad = client.post("/v1/studies", json={**FAST_STUDY, "space": "name: x\ncluster: {gpu: gb300}\n"}, headers=AUTH)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "space"]


def test_cancel_running_study(database_url, make_settings, client_for):
    client = client_for(make_settings(database_url))
    body = {**FAST_STUDY, "trials": 30, "trial_delay_s": 0.5}
    sid = client.post("/v1/studies", json=body, headers=AUTH).json()["id"]
    wait_for(client, sid, lambda d: d["status"] == "running" and d["phases"]["prefill"]["launched"] >= 1)
    r = client.post(f"/v1/studies/{sid}/cancel", headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] in ("cancelling", "cancelled")
    detail = wait_for(client, sid, finished, timeout_s=30)
    assert detail["status"] == "cancelled"
    assert detail["launched"] < 30
    storage = open_storage(client.app.state.settings.database_url)
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))  # nothing left running
    # cancelling again is a no-op; a queued study is cancelled at once
    assert client.post(f"/v1/studies/{sid}/cancel", headers=AUTH).json()["status"] == "cancelled"


def test_restart_mid_study_resumes_without_losing_trials(database_url, make_settings, client_for):
    settings = make_settings(database_url)
    first = client_for(settings)
    body = {**FAST_STUDY, "trials": 4, "trial_delay_s": 0.4}
    sid = first.post("/v1/studies", json=body, headers=AUTH).json()["id"]
    wait_for(first, sid, lambda d: d["phases"]["prefill"]["launched"] >= 1)
    first.__exit__(None, None, None)  # the service stops mid-study

    second = client_for(settings)
    detail = wait_for(second, sid, finished)
    assert detail["status"] == "succeeded", detail
    assert detail["resumes"] == 1
    assert {e["kind"] for e in second.get(f"/v1/studies/{sid}").json()["recent_events"]} >= {"succeeded"}
    storage = open_storage(settings.database_url)
    for phase in ("prefill", "decode"):
        study = optuna.load_study(study_name=f"{detail['campaign']}/{phase}", storage=storage)
        trials = study.get_trials()
        sampled = [t for t in trials if t.user_attrs.get("kind") == "sampled"
                   and t.state == optuna.trial.TrialState.COMPLETE]
        assert len(sampled) == 4, phase  # the whole budget, exactly once
        assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        interrupted = [t for t in trials if t.user_attrs.get("status") == "cancelled"]
        retried = {t.user_attrs.get("retry_of") for t in trials if t.state == optuna.trial.TrialState.COMPLETE}
        assert all(t.number in retried for t in interrupted), "an interrupted trial was not run again"


@pytest.mark.parametrize("field,value", [("trials", 0), ("sampler", "bogus"), ("seed", -1), ("backend", "x"),
                                         ("phases", ["middle"]), ("noise", 2.0), ("unknown", 1)])
def test_invalid_bodies_name_the_field(sqlite_url, make_settings, client_for, field, value):
    client = client_for(make_settings(sqlite_url))
    r = client.post("/v1/studies", json={**FAST_STUDY, field: value}, headers=AUTH)
    assert r.status_code == 422
    assert field in r.json()["detail"][0]["loc"], r.json()


def test_inline_space_with_a_trace_is_confined_and_read_at_request_time(sqlite_url, make_settings, client_for,
                                                                        tmp_path):
    """A trace the space names is read only under an allowed root, and read now: a bad line is the request's 422
    naming the line; a good one starts a study whose page says its traffic."""
    space = yaml.safe_load((REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml").read_text())
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "chat.jsonl").write_text((REPO / "examples" / "traces" / "chat-multiturn.jsonl").read_text())
    (traces / "bad.jsonl").write_text('{"input_length": 10, "output_length": 2}\n{"output_length": 2}\n')
    settings = make_settings(sqlite_url)
    client = client_for(make_settings(sqlite_url, allowed_roots=[*settings.allowed_roots, traces]))

    def post(trace: str):  # type: ignore[no-untyped-def]
        body = {**space, "workload": {"trace": trace}, "phases": {"prefill": {
            k: v for k, v in space["phases"]["prefill"].items() if k != "workload"}}}
        return client.post("/v1/studies", json={**FAST_STUDY, "space": body, "phases": ["prefill"]}, headers=AUTH)

    outside = post("/etc/passwd")
    assert outside.status_code == 422 and outside.json()["detail"][0]["loc"] == ["body", "space", "workload", "trace"]
    bad = post(str(traces / "bad.jsonl"))
    assert bad.status_code == 422 and "bad.jsonl line 2: input_length" in bad.json()["detail"][0]["msg"]
    good = post(str(traces / "chat.jsonl"))
    assert good.status_code == 201, good.text
    page = client.get(f"/ui/studies/{good.json()['id']}").text
    assert f"trace {traces / 'chat.jsonl'}" in page
    assert wait_for(client, good.json()["id"], finished)["status"] == "succeeded"


def test_cancel_never_overwrites_the_drivers_end(database_url, make_settings, client_for):
    """The race behind a study stuck at "cancelling": the driver ends the study while the cancel request holds a
    stale "running" record; the cancel must not write over the end."""
    from sqlalchemy import update

    from api.models import StudyRecord, StudyStatus

    client = client_for(make_settings(database_url))
    sid = client.post("/v1/studies", json={**FAST_STUDY, "trials": 30, "trial_delay_s": 0.5}, headers=AUTH).json()["id"]
    wait_for(client, sid, lambda d: d["status"] == "running")
    sessions, runner = client.app.state.sessions, client.app.state.runner
    with sessions() as request_session:
        stale = request_session.get(StudyRecord, sid)
        assert stale.status is StudyStatus.RUNNING
        with sessions() as driver_session:  # the driver ends the study meanwhile
            driver_session.execute(update(StudyRecord).where(StudyRecord.id == sid)
                                   .values(status=StudyStatus.CANCELLED))
            driver_session.commit()
        assert runner.cancel(request_session, stale) is StudyStatus.CANCELLED
    assert client.get(f"/v1/studies/{sid}").json()["status"] == "cancelled"
    client.post(f"/v1/studies/{sid}/cancel", headers=AUTH)  # stop the driver itself
    wait_for(client, sid, finished, timeout_s=30)


def test_a_pd_study_without_a_composed_front_refuses_export_as_the_cli_does(sqlite_url, make_settings, client_for):
    """The library's one rule (CampaignResult.exports_composed): a PD study whose phases compose nothing has no
    deployment to export, and says why with the composition's fix once (it used to say "no front yet")."""
    client = client_for(make_settings(sqlite_url))
    study = client.post("/v1/studies", json={**FAST_STUDY, "constraints": {"max_ttft_ms": 1}}, headers=AUTH).json()
    assert wait_for(client, study["id"], finished)["status"] == "succeeded"
    front = client.get(f"/v1/studies/{study['id']}/pareto").json()
    assert not front["composed_front"] and front["composition_error"]
    refused = client.get(f"/v1/studies/{study['id']}/export", params={"point": 0})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "point"]
    msg = refused.json()["detail"][0]["msg"]
    assert "no composed PD front to export" in msg and msg.count("(fix: ") == 1, msg
    assert f"/v1/studies/{study['id']}/pareto" in msg and "topotune export" not in msg
