"""GET /v1/clusters: the cluster store of the service's database, as `topotune calibrate --json` shows it."""

from __future__ import annotations

from _support.truth_runs import measured_runs

from tuner.cluster import ClusterKey, ClusterStore
from tuner.hardware import get_gpu


def test_clusters_lists_what_the_store_learnt(sqlite_url, make_settings, client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for(make_settings(sqlite_url))
    assert client.get("/v1/clusters").json() == {"clusters": []}
    key = ClusterKey.of(get_gpu("gb300"), None, "lab")
    store = ClusterStore(sqlite_url)
    for run in measured_runs("qwen3-235b-a22b", 4):
        store.record_run(key, run)
    body = client.get("/v1/clusters").json()
    (cluster,) = body["clusters"]
    assert cluster["cluster"] == "lab" and cluster["runs"] == 4 and cluster["models"] == ["qwen3-235b-a22b"]
    assert cluster["held_out"] is None  # not asked (and one model cannot be left out)
    assert all(set(f) == {"default", "learnt", "moved_pct", "runs", "models", "transfers_to"}
               for f in cluster["factors"].values())
    assert all(f["runs"] >= 1 and f["models"] == 1 and f["transfers_to"] == "shared"
               for f in cluster["factors"].values())
    # kernel factors per group of kernel kinds (here qwen3's alone), shown apart from the shared ones (four runs:
    # the fit keeps the defaults, as it did before kernel kinds; tests/cli/test_calibrate_cluster.py has moved ones)
    assert all(f["models"] == ["qwen3-235b-a22b"] and "expert_weights=bf16" in f["transfers_to"]
               for f in cluster["kernel_factors"])
    assert cluster["guards"] == []
