"""/ui/clusters and GET /v1/clusters refit a cluster's calibration only when its store changed, not per request."""

from __future__ import annotations

import pytest
from _support.truth_runs import measured_runs

import api.cluster_view as cluster_view
from tuner.cluster import ClusterKey, ClusterStore, StoredFailure
from tuner.hardware import get_gpu
from tuner.topology import Topology
from tuner.trial_status import TrialStatus


def test_what_was_learnt_is_kept_until_the_store_changes(sqlite_url, make_settings, client_for,  # type: ignore[no-untyped-def]
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    client = client_for(make_settings(sqlite_url))
    store = ClusterStore(sqlite_url)
    key = ClusterKey.of(get_gpu("gb300"), None, "lab")
    for run in measured_runs("qwen3-235b-a22b", 6):
        store.record_run(key, run)
    fits: list[ClusterKey] = []
    real = cluster_view.load_knowledge

    def counted(store, key, gpu, *, held_out):  # type: ignore[no-untyped-def]
        fits.append(key)
        return real(store, key, gpu, held_out=held_out)

    monkeypatch.setattr(cluster_view, "load_knowledge", counted)
    first = client.get("/ui/clusters")
    assert first.status_code == 200 and len(fits) == 1
    assert client.get("/ui/clusters").text == first.text and len(fits) == 1  # no refit
    served = client.get("/v1/clusters").json()
    assert len(fits) == 1 and served["clusters"][0]["runs"] == 6  # the JSON reads the same fit
    store.record_failure(key, StoredFailure(model_name="qwen3-235b-a22b", topology=Topology(tp=4, dp=2, ep=True),
                                            status=TrialStatus.CRASHED, reason="boom", study="s"))
    after = client.get("/v1/clusters").json()
    assert len(fits) == 2 and after["clusters"][0]["launch_failures"] == 1  # the store changed: refitted once
    client.get("/ui/clusters")
    assert len(fits) == 2
    client.get("/ui/clusters?held_out=true")
    assert len(fits) == 3  # the held-out score is another fit, cached on its own
