"""POST /v1/replay answers what `topotune replay --json` prints for the same inputs (one library call,
`replay_stream`); bad input is a 422 naming the body's field; it is a write route like the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_helpers import AUTH, REFERENCE_MODEL

from tuner.cli import main


@pytest.fixture
def client(sqlite_url, make_settings, client_for):  # type: ignore[no-untyped-def]
    return client_for(make_settings(sqlite_url))


def test_replay_and_the_cli_give_the_same_answer(client, model_store: Path,  # type: ignore[no-untyped-def]
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    body = {"model_path": REFERENCE_MODEL, "hardware": "gb300", "deployment": "1P:TP8,1D:TP8", "request_rate": 3,
            "workload": {"isl": 2000, "osl": 100, "prefix": {"shared_tokens": 1024, "num_prefixes": 4}},
            "num_requests": 120, "knobs": {"max_num_seqs": 64}, "max_ttft_ms": 500, "router": "round_robin"}
    r = client.post("/v1/replay", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    served = r.json()
    workload = model_store.parent / "workload.yaml"
    workload.write_text(json.dumps(body["workload"]))
    assert main(["replay", str(model_store / REFERENCE_MODEL), "--hardware", "gb300", "--deployment", "1P:TP8,1D:TP8",
                 "--request-rate", "3", "--workload", str(workload), "--num-requests", "120",
                 "--max-num-seqs", "64", "--max-ttft-ms", "500", "--router", "round_robin", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert served == printed
    assert served["requests"] == 120 and served["num_gpus"] == 16 and served["prefix_hit_share"] > 0
    assert 0 < served["sla_attainment"] <= 1


@pytest.mark.parametrize(("change", "loc", "says"), [
    ({"request_rate": 2, "concurrency": 4}, ["body", "concurrency"], "not both"),
    ({}, ["body", "request_rate"], "no load given"),
    ({"concurrency": 1, "turns": 0}, ["body", "turns"], "1..1000"),
    ({"concurrency": 1, "router": "sticky"}, ["body", "router"], "unknown router policy"),
    ({"concurrency": 1, "deployment": "2P:TP8"}, ["body", "deployment"], ""),
    ({"concurrency": 1, "deployment": "2x:TPX8"}, ["body", "deployment"], "TPX8"),
    ({"concurrency": 1, "knobs": {"max_num_seqs": 0}}, ["body", "knobs", "max_num_seqs"], "greater than or equal"),
    ({"request_rate": 1, "arrival": "gamma", "burstiness_cv": 50}, ["body", "burstiness_cv"], "(0, 20]"),
    ({"concurrency": 1, "warmup_share": 1.5}, ["body", "warmup_share"], "[0, 1)"),
    ({"concurrency": 1, "calibration": {"hbm_efficency": 0.5}}, ["body", "calibration", "hbm_efficency"],
     "hbm_efficiency"),
    ({"concurrency": 1, "num_requests": 10**6}, ["body", "num_requests"], "less than or equal"),
    ({"concurrency": 1, "knobs": {"bogus": 1}}, ["body", "knobs", "bogus"], "max_num_seqs"),
    ({"concurrency": 1, "knobs": {"tp": 4}}, ["body", "knobs", "tp"], "the deployment's"),
    ({"concurrency": 1, "workload": {"isl": 10**7, "osl": 10}}, ["body", "deployment"], "does not fit"),
    ({"concurrency": 1, "deployment": "100000x:TP8"}, ["body", "deployment"], "800,000 GPUs"),
    ({"request_rate": 500, "num_requests": 2000, "max_horizon_s": 20, "workload": {"isl": 8000, "osl": 500}},
     ["body", "max_horizon_s"], "requests answered"),
])
def test_bad_replay_input_is_a_422_naming_the_body_field(client, change: dict, loc: list[str],  # type: ignore[no-untyped-def]
                                                         says: str) -> None:
    body = {"model_path": REFERENCE_MODEL, "deployment": "TP8", "workload": {"isl": 1000, "osl": 50},
            "num_requests": 50, **change}
    r = client.post("/v1/replay", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    [detail] = r.json()["detail"]
    assert detail["loc"] == loc and says in detail["msg"], detail
    assert "--" not in detail["msg"], detail  # the body's names, never the CLI's flags


def test_replay_is_a_write_route(client) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/v1/replay", json={"model_path": REFERENCE_MODEL, "concurrency": 1})
    assert r.status_code == 401
