"""The embedded Optuna dashboard is read-only inside topotune (issue 47 item 12): signed in with a cookie and a
same-site Origin, or with the token, its write endpoints answer 405 and change nothing (a rename through it used
to move a topotune phase study to a new name behind topotune's back); its reads of an unknown study id answer
404, not 500."""

from __future__ import annotations

from collections.abc import Iterator

import optuna
import pytest
from api_helpers import AUTH, FAST_STUDY, api_settings, finished, reference_model_store, wait_for
from fastapi.testclient import TestClient

from api.config import ApiSettings
from api.main import create_app
from tuner.study import open_storage

ORIGIN = {"Origin": "http://testserver"}


def _tuned(client: TestClient, settings: ApiSettings) -> tuple[TestClient, optuna.storages.RDBStorage, dict]:
    sid = client.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
    assert wait_for(client, sid, finished)["status"] == "succeeded"
    storage = open_storage(settings.database_url)
    summaries = {s.study_name: s._study_id for s in optuna.get_all_study_summaries(storage)}
    return client, storage, summaries


@pytest.fixture
def tuned(sqlite_url, make_settings, client_for):  # type: ignore[no-untyped-def]
    settings = make_settings(sqlite_url)
    return _tuned(client_for(settings), settings)


@pytest.fixture(scope="module")
def tuned_to_read(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, object, dict]]:
    """One finished study for the reads below, which change nothing (a study each took most of their time)."""
    folder = tmp_path_factory.mktemp("dashboard-reads")
    settings = api_settings(folder, f"sqlite:///{folder / 'topotune.db'}", reference_model_store(folder))
    with TestClient(create_app(settings)) as client:
        yield _tuned(client, settings)


def _writes(study_id: int, trial_id: int) -> list[tuple[str, str, dict]]:
    return [
        ("POST", "/api/studies", {"study_name": "made-here", "directions": ["maximize"]}),
        ("POST", f"/api/studies/{study_id}/rename", {"study_name": "renamed-behind-topotunes-back"}),
        ("DELETE", f"/api/studies/{study_id}", {"remove_associated_artifacts": False}),
        ("PUT", f"/api/studies/{study_id}/note", {"version": 0, "body": "x"}),
        ("POST", f"/api/trials/{trial_id}/tell", {"state": "Fail"}),
        ("POST", f"/api/trials/{trial_id}/user-attrs", {"user_attrs": {"x": 1}}),
        ("POST", f"/api/studies/{study_id}/0/skip", {}),
        ("PUT", f"/api/studies/{study_id}/0/note", {"version": 0, "body": "x"}),
        ("POST", "/api/trials/999999/tell", {"state": "Fail"}),  # unknown ids: refused the same, no 500
        ("POST", "/api/studies/999999/rename", {"study_name": "y"}),
    ]


def test_dashboard_writes_are_refused_signed_in_or_with_the_token(tuned):  # type: ignore[no-untyped-def]
    client, storage, summaries = tuned
    name, study_id = next(iter(summaries.items()))
    trial_id = optuna.load_study(study_name=name, storage=storage).trials[0]._trial_id
    before = {s.study_name: (s._study_id, s.n_trials) for s in optuna.get_all_study_summaries(storage)}
    client.post("/ui/login", data={"token": AUTH["Authorization"].split()[1], "next": "/ui"}, headers=ORIGIN,
                follow_redirects=False)
    for method, path, body in _writes(study_id, trial_id):
        for headers in (ORIGIN, AUTH):  # the session cookie with a same-site Origin; the bearer token
            r = client.request(method, path, json=body, headers=headers)
            assert r.status_code == 405, (method, path, r.status_code, r.text)
            assert "read-only inside topotune" in r.json()["reason"] and r.headers["allow"] == "GET, HEAD"
    after = {s.study_name: (s._study_id, s.n_trials) for s in optuna.get_all_study_summaries(storage)}
    assert after == before  # nothing created, renamed or deleted
    trial = optuna.load_study(study_name=name, storage=storage).trials[0]
    assert "x" not in trial.user_attrs
    assert client.get(f"/api/studies/{study_id}").status_code == 200  # reading stays open


@pytest.mark.parametrize("path", ["/api/studies/999999", "/api/studies/999999/param_importances",
                                  "/api/studies/999999/plot/contour", "/api/studies/999999/plot/slice",
                                  "/csv/999999"])
def test_dashboard_reads_of_unknown_ids_are_404(tuned_to_read, path):  # type: ignore[no-untyped-def]
    client, _, _ = tuned_to_read
    r = client.get(path)
    assert r.status_code == 404, (path, r.status_code, r.text[:200])
    assert "999999" in r.text
