"""The live read path: one refresh shared among concurrent requests, status never waiting for a front, and a
restarted service answering from the persisted snapshot at once."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

from api_helpers import AUTH, FAST_STUDY, finished, wait_for

from tuner.study import LiveCampaign


def test_concurrent_requests_share_one_refresh_and_status_never_waits(sqlite_url, make_settings, client_for,
                                                                        monkeypatch):
    client = client_for(make_settings(sqlite_url))
    sid = client.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
    assert wait_for(client, sid, finished)["status"] == "succeeded"
    cache = client.app.state.cache
    cache.snapshot_dir = None
    cache._entries.clear()  # cold, as after a restart without a snapshot file
    calls, release = [], threading.Event()
    original = LiveCampaign.refresh

    def slow_refresh(self):
        calls.append(1)
        release.wait(5)
        return original(self)

    monkeypatch.setattr(LiveCampaign, "refresh", slow_refresh)
    with cf.ThreadPoolExecutor(8) as pool:
        fronts = [pool.submit(client.get, f"/v1/studies/{sid}/pareto") for _ in range(8)]
        time.sleep(0.5)  # the first request is refreshing; the others wait for it
        started = time.monotonic()
        status = client.get(f"/v1/studies/{sid}")  # served the last snapshot, does not wait
        assert status.status_code == 200 and time.monotonic() - started < 2.0
        release.set()
        bodies = [f.result().json() for f in fronts]
    assert len(calls) == 1, "8 concurrent cold requests must share one refresh"
    assert all(b == bodies[0] for b in bodies) and bodies[0]["composed_front"]


def test_restart_answers_from_the_persisted_snapshot(sqlite_url, make_settings, client_for):
    settings = make_settings(sqlite_url)
    first = client_for(settings)
    sid = first.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
    assert wait_for(first, sid, finished)["status"] == "succeeded"
    before = first.get(f"/v1/studies/{sid}/pareto").json()
    detail_before = first.get(f"/v1/studies/{sid}").json()
    first.__exit__(None, None, None)
    assert (settings.data_dir / "snapshots" / f"{sid}.json").is_file()

    second = client_for(settings)
    second.app.state.cache._entries.clear()  # whatever the start-up warm-up built: the file answers
    after = second.get(f"/v1/studies/{sid}/pareto").json()
    assert after == before
    assert second.get(f"/v1/studies/{sid}").json()["phases"] == detail_before["phases"]
    deadline = time.monotonic() + 60  # the background rebuild lands and gives the same front
    while time.monotonic() < deadline and second.app.state.cache._entries[sid].snapshot.version < 0:
        time.sleep(0.1)
    assert second.get(f"/v1/studies/{sid}/pareto").json() == before
    assert second.get(f"/v1/studies/{sid}/trials").json()["total"] == before["trials_stored"]
