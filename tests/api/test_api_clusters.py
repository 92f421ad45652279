"""GET /v1/clusters: the cluster store of the service's database, as `topotune calibrate --json` shows it."""

from __future__ import annotations

from _support.truth_runs import measured_runs

from tuner.cluster import ClusterKey, ClusterStore, StoredFailure
from tuner.hardware import get_gpu
from tuner.topology import Topology
from tuner.trial_status import TrialStatus


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


def test_a_cluster_whose_gpu_left_the_catalog_is_listed_with_its_error(sqlite_url, make_settings, client_for
                                                                        ) -> None:  # type: ignore[no-untyped-def]
    """A stored row whose GPU is not in the catalog used to make GET /v1/clusters answer 500 (issue 47 item 8):
    it is listed with what the store holds and the error; the other clusters are served as before."""
    client = client_for(make_settings(sqlite_url))
    store = ClusterStore(sqlite_url)
    good = ClusterKey.of(get_gpu("gb300"), None, "lab")
    for run in measured_runs("qwen3-235b-a22b", 4):
        store.record_run(good, run)
    gone = ClusterKey("old", "no-such-gpu", "nvlink8+infiniband", "unknown", "hopper")
    store.record_failure(gone, StoredFailure(model_name="m", topology=Topology(tp=2), status=TrialStatus.CRASHED,
                                             reason="x", study="s/decode"))
    for held_out in ("false", "true"):
        r = client.get(f"/v1/clusters?held_out={held_out}")
        assert r.status_code == 200, r.text
        by_name = {c["cluster"]: c for c in r.json()["clusters"]}
        assert by_name["lab"]["error"] is None and by_name["lab"]["runs"] == 4
        old = by_name["old"]
        assert "no-such-gpu" in old["error"] and old["error"].startswith("cannot learn this cluster")
        assert (old["gpu_class"], old["runs"], old["launch_failures"], old["models"]) == ("no-such-gpu", 0, 1, ["m"])
        assert set(old) == set(by_name["lab"])  # one shape for every row
