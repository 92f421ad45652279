"""A service study honours its cluster's known risks whatever the sampler (random here): a config that crashed on
this cluster for another model is screened with the failure seen, never launched; `retry_risks` (the new-study
form's checkbox) launches them again."""

from __future__ import annotations

from _support.known_risks import record_crash
from api_helpers import AUTH, FAST_STUDY, REFERENCE_MODEL, finished, wait_for

from tuner.cluster import ClusterKey, ClusterStore
from tuner.hardware import get_gpu
from tuner.topology import Topology

SPACE = """
name: risky-service
cluster: {gpu: gb300, num_gpus: 32, gpus_per_host: 4}
workload: {isl: 1024, osl: 256}
phases:
  decode:
    tp: [4, 8]
    dp: [1, 2, 4]
    ep: [false, true]
    max_num_seqs: [64]
    concurrency: [8, 64]
"""
SAFE = Topology(tp=4, dp=2, max_num_seqs=64)  # the one config of the space that did not crash


def _launched(client, sid: int) -> tuple[list[dict], list[dict]]:
    trials = client.get(f"/v1/studies/{sid}/trials", params={"limit": 1000}).json()["items"]
    return ([t for t in trials if t["kind"] == "sampled"],
            [t for t in trials if "known risk on this cluster" in (t["reason"] or "")])


def test_service_studies_skip_known_risks_unless_asked(database_url, make_settings, client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for(make_settings(database_url))
    assert 'id="retry-risks"' in client.get("/ui/new").text and "retry_risks: $(" in client.get("/ui/new").text
    store = ClusterStore(database_url)
    key = ClusterKey.of(get_gpu("gb300"))
    for tp in (4, 8):
        for dp in (1, 2, 4):
            for ep in (False, True):
                topo = Topology(tp=tp, dp=dp, ep=ep, max_num_seqs=64)
                if topo != SAFE:
                    record_crash(store, key, topo, "glm-4.6", reason="NCCL timeout")
    body = {**FAST_STUDY, "model_path": REFERENCE_MODEL, "space": SPACE, "trials": 4, "phases": ["decode"],
            "warm_start": False}  # (a warm start would enqueue the one safe config first: nothing to screen)

    sid = client.post("/v1/studies", json=body, headers=AUTH).json()["id"]
    assert wait_for(client, sid, finished)["status"] == "succeeded"
    launched, screened = _launched(client, sid)
    assert [(t["params"]["tp"], t["params"]["dp"], t["params"]["ep"]) for t in launched] == [(4, 2, False)]
    assert screened and all("crashed for glm-4.6" in t["reason"] and t["feasible"] is False for t in screened)

    r = client.post("/v1/studies", json={**body, "retry_risks": True}, headers=AUTH)
    assert r.status_code == 201, r.text
    retried = r.json()["id"]
    assert wait_for(client, retried, finished)["status"] == "succeeded"
    launched, screened = _launched(client, retried)
    assert len(launched) == 4 and not screened  # the risks ran again (the simulator does not crash them)
    assert "Retries the cluster's known risks" in client.get(f"/ui/studies/{retried}").text
    assert "Retries the cluster's known risks" not in client.get(f"/ui/studies/{sid}").text
