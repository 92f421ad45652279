"""POST /v1/advice answers what `topotune frontier` answers for the same inputs; bad input is a 422 naming the
body's field; it is a write route like the others (sign-in, CSRF)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from api_helpers import AUTH, FAST_STUDY, REFERENCE_MODEL, REPO, TOKEN, finished, wait_for

from tuner.cli import main

LOGNORMAL = {"input_tokens": {"distribution": "lognormal", "mean": 2000, "stddev": 1500, "max_tokens": 16000},
             "output_tokens": {"distribution": "normal", "mean": 300, "stddev": 100},
             "prefix": {"shared_tokens": 1024, "num_prefixes": 8}}


@pytest.fixture
def client(sqlite_url, make_settings, client_for):  # type: ignore[no-untyped-def]
    return client_for(make_settings(sqlite_url))


def _frontier(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["frontier", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("case", ["closed-loop lognormal SLA", "open loop at a rate"])
def test_advice_and_frontier_give_the_same_recommendation(client, model_store: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          capsys: pytest.CaptureFixture[str], case: str) -> None:
    model = str(model_store / REFERENCE_MODEL)
    if case.startswith("closed"):
        body = {"model_path": REFERENCE_MODEL, "hardware": "gb300", "gpus": 32, "workload": LOGNORMAL, "max_mtp": 1,
                "sla": {"max_ttft_ms": 1500, "max_itl_ms": 40, "min_tok_s_user": 30, "percentile": "p90"}}
        workload = tmp_path / "workload.yaml"
        workload.write_text(yaml.safe_dump(LOGNORMAL))
        args = [model, "--hardware", "gb300", "--gpus", "32", "--workload", str(workload), "--max-mtp", "1",
                "--max-ttft-ms", "1500", "--max-itl-ms", "40", "--min-tok-s-user", "30", "--percentile", "p90"]
    else:
        body = {"model_path": REFERENCE_MODEL, "gpus": 32, "request_rate": 5, "max_mtp": 0,
                "workload": {"isl": 2000, "osl": 200}, "sla": {"max_ttft_ms": 2000, "max_itl_ms": 40}}
        args = [model, "--gpus", "32", "--request-rate", "5", "--max-mtp", "0", "--isl", "2000", "--osl", "200",
                "--max-ttft-ms", "2000", "--max-itl-ms", "40"]
    r = client.post("/v1/advice", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    advice, printed = r.json(), _frontier(args, capsys)
    assert advice["recommendation"] == printed["recommendation"]
    assert advice["recommendation"]["winner"] is not None
    assert advice["front"] == printed["front"] and advice["aggregated_front"] == printed["aggregated_front"]
    assert advice["reason"].startswith(advice["recommendation"]["winner"])
    assert "vllm serve" in advice["commands"] and advice["operating_deployment"]


@pytest.mark.parametrize(("change", "loc", "says"), [
    ({"sla": {"max_ttft_ms": -1}}, ["body", "sla", "max_ttft_ms"], "greater than 0"),
    ({"sla": {"max_ttft_ms": 10}}, ["body", "sla", "max_ttft_ms"], "no prefill point meets TTFT <= 10 ms"),
    ({"gpus": 8, "request_rate": 60, "max_mtp": 0, "workload": {"isl": 2000, "osl": 200}}, ["body", "gpus"],
     "about 24 GPUs would carry it (fix: allow at least 24 GPUs (gpus 24) or offer a lower request_rate)"),
    ({"hardware": "h900"}, ["body", "hardware"], "unknown hardware"),
    ({"workload": {"input_tokens": {"distribution": "zipf", "mean": 3}, "osl": 10}}, ["body", "workload"], ""),
    ({"workload": {"trace": "/etc/passwd"}}, ["body", "workload", "trace"], "outside the allowed roots"),
    ({"workload": {"trace": "chat.jsonl"}}, ["body", "workload", "trace"],  # where a relative trace is looked for
     "no such trace file: chat.jsonl (fix: a relative trace path starts at "),
    ({"model_path": "../etc"}, ["body", "model_path"], ".."),
    ({"model_path": "no-such-model"}, ["body", "model_path"], "(No such file or directory) (fix: give a model folder"),
    ({"arrival": "trace"}, ["body", "arrival"], "needs a trace with timestamps"),
    ({"mode": "disagg", "gpus": 8}, ["body", "gpus"], "the smallest 1P1D pair needs"),
])
def test_bad_input_is_a_422_naming_the_field(client, change: dict, loc: list[str], says: str) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/v1/advice", json={"model_path": REFERENCE_MODEL, **change}, headers=AUTH)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"][:len(loc)] == loc, detail
    assert says in detail["msg"], detail
    # the loc names the field; the message does not repeat it (its fix stays)
    assert not detail["msg"].startswith((f"{detail['loc'][-1]}:", ".".join(map(str, detail["loc"][1:])) + ":")), detail


@pytest.mark.parametrize(("calibration", "loc", "says"), [
    ('{"hbm_efficency": 0.8}', ["body", "calibration", "hbm_efficency"], "unknown factor 'hbm_efficency'"),
    ('{"hbm_efficiency": 3}', ["body", "calibration", "hbm_efficiency"], "less than or equal to 1"),
    ('{"hbm_efficiency": "0.8"}', ["body", "calibration", "hbm_efficiency"], "must be a number, got text"),
    ('{"hbm_efficiency": true}', ["body", "calibration", "hbm_efficiency"], "must be a number, got a boolean"),
    ('{"step_overhead_ms": 1e400}', ["body", "calibration", "step_overhead_ms"], "must be finite"),
    ('{"hbm_efficiency": null}', ["body", "calibration", "hbm_efficiency"], "must be a number, got null"),
    ('"/work/calibration.yaml"', ["body", "calibration"], "valid dictionary"),  # never a path the service reads
    ("[0.8]", ["body", "calibration"], "valid dictionary"),
])
def test_a_bad_calibration_is_a_422_naming_the_factor(client, calibration: str, loc: list[str],  # type: ignore[no-untyped-def]
                                                      says: str) -> None:
    """The body's calibration is checked by the library's one reader (tuner.perf.calibrated), as the CLI's
    --calibration file is (tests/cli/test_perf_cli.py); the body is sent raw so 1e400 arrives as JSON has it."""
    body = f'{{"model_path": "{REFERENCE_MODEL}", "gpus": 8, "max_mtp": 0, "calibration": {calibration}}}'
    r = client.post("/v1/advice", content=body, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"][:len(loc)] == loc and says in detail["msg"], detail
    assert "(fix: " in detail["msg"] or loc == ["body", "calibration"], detail
    assert not detail["msg"].startswith(".".join(map(str, detail["loc"][1:])) + ":"), detail  # the loc names it


def test_a_calibration_answers_as_frontier_with_that_file(client, model_store: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    factors = {"hbm_efficiency": 0.6, "step_overhead_ms": 3}
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(factors))
    r = client.post("/v1/advice", json={"model_path": REFERENCE_MODEL, "gpus": 16, "max_mtp": 0,
                                        "calibration": factors}, headers=AUTH)
    assert r.status_code == 200, r.text
    printed = _frontier([str(model_store / REFERENCE_MODEL), "--gpus", "16", "--max-mtp", "0", "--calibration",
                         str(path)], capsys)
    assert r.json()["calibration"] == printed["calibration"] and printed["calibration"]["hbm_efficiency"] == 0.6
    assert r.json()["recommendation"] == printed["recommendation"]


def test_advice_is_a_write_route(client) -> None:  # type: ignore[no-untyped-def]
    """Signed in or a bearer token; a browser session also needs this origin and the page's CSRF token."""
    body = {"model_path": REFERENCE_MODEL, "gpus": 8, "max_mtp": 0, "workload": {"isl": 1000, "osl": 100}}
    assert client.post("/v1/advice", json=body).status_code == 401
    assert client.post("/v1/advice", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    origin = {"Origin": "http://testserver"}
    client.post("/ui/login", data={"token": TOKEN, "next": "/ui"}, headers=origin, follow_redirects=False)
    csrf = re.search(r'<meta name="csrf-token" content="([^"]*)">', client.get("/ui").text).group(1)  # type: ignore[union-attr]
    refused = client.post("/v1/advice", json=body, headers=origin)
    assert refused.status_code == 403 and refused.json()["detail"][0]["loc"] == ["header", "x-csrf-token"]
    assert client.post("/v1/advice", json=body, headers={**origin, "X-CSRF-Token": csrf}).status_code == 200


def test_the_study_page_recommends_and_numbers_its_front(client) -> None:  # type: ignore[no-untyped-def]
    """A finished study: the page marks the measured recommendation (the library's pick over the composed front),
    its chart labels each front point with the table's `point`, and the advice for the study's traffic and SLA
    is POST /v1/advice's answer for the same inputs."""
    sid = client.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
    assert wait_for(client, sid, finished)["status"] == "succeeded"
    front = client.get(f"/v1/studies/{sid}/pareto").json()["composed_front"]
    assert front
    page = client.get(f"/ui/studies/{sid}").text
    best = max(range(len(front)), key=lambda i: front[i]["total_tok_s_per_gpu"])
    row = re.search(r'<tr class="ok" id="recommended-row"[^>]*><td>(\d+) &#9733;</td>', page)
    assert row and int(row.group(1)) == best, row
    assert f"Measured: point #{best}," in page
    loads = re.findall(r'<td class="l load">([^<]*)</td>', page)
    assert len(loads) == len(front) and all(re.fullmatch(r"P \d+, D \d+ clients", x) for x in loads), loads
    (composed, *_) = client.get(f"/ui/studies/{sid}/figures").json()["figures"]
    labels = next(t["text"] for t in composed["data"] if t["name"] == "combined Pareto front")
    assert labels == [f"#{i}" for i in range(len(front))]

    answer = client.get(f"/ui/studies/{sid}/advice").json()
    assert answer["error"] is None, answer
    space = yaml.safe_load((REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml").read_text())
    c = space["constraints"]
    asked = {"model_path": REFERENCE_MODEL, "hardware": space["cluster"]["gpu"], "gpus": space["cluster"]["num_gpus"],
             "workload": {"isl": space["workload"]["isl"], "osl": space["workload"]["osl"]},
             "sla": {"max_ttft_ms": c.get("max_ttft_ms"), "max_itl_ms": c.get("max_itl_ms"),
                     "percentile": c.get("percentile", "p90")},
             "mode": "disagg", "max_mtp": max(space["phases"]["decode"]["mtp"])}
    direct = client.post("/v1/advice", json=asked, headers=AUTH).json()
    assert answer["advice"]["recommendation"] == direct["recommendation"]
    assert answer["advice"]["reason"] == direct["reason"] and direct["recommendation"]["winner"]


def test_an_uploaded_trace_answers_as_the_trace_file(client, model_store: Path,  # type: ignore[no-untyped-def]
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = REPO / "examples" / "traces" / "chat-multiturn.jsonl"
    body = {"model_path": REFERENCE_MODEL, "gpus": 16, "max_mtp": 0, "arrival": "trace",
            "trace_jsonl": trace.read_text(), "sla": {"max_ttft_ms": 1000, "max_itl_ms": 30}}
    r = client.post("/v1/advice", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    printed = _frontier([str(model_store / REFERENCE_MODEL), "--gpus", "16", "--max-mtp", "0", "--workload",
                         str(trace), "--arrival", "trace", "--max-ttft-ms", "1000", "--max-itl-ms", "30"], capsys)
    assert r.json()["recommendation"] == printed["recommendation"] and printed["offered_rps"] == r.json()["offered_rps"]
    assert not list((client.app.state.settings.data_dir / "uploads").iterdir())  # nothing of it stays on disk

    lines = '{"input_length": 10, "output_length": 5}\n{"input_length": -1, "output_length": 5}\n'
    bad = {**body, "trace_jsonl": lines}
    r = client.post("/v1/advice", json=bad, headers=AUTH)
    assert r.status_code == 422
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "trace_jsonl"] and detail["msg"].startswith("line 2: input_length:"), detail
    both = {**body, "workload": {"isl": 100, "osl": 10}}
    assert client.post("/v1/advice", json=both, headers=AUTH).json()["detail"][0]["loc"] == ["body", "trace_jsonl"]


def test_compare_says_when_the_studies_measured_different_traffic_or_sla(client) -> None:  # type: ignore[no-untyped-def]
    same = [client.post("/v1/studies", json={**FAST_STUDY, "seed": s}, headers=AUTH).json()["id"] for s in (1, 2)]
    other = client.post("/v1/studies", json={**FAST_STUDY, "constraints": {"max_itl_ms": 40}}, headers=AUTH).json()
    assert 'id="compare-differs"' not in client.get(f"/ui/compare?a={same[0]}&b={same[1]}").text
    page = client.get(f"/ui/compare?a={same[0]}&b={other['id']}").text
    assert 'id="compare-differs"' in page and "ITL &lt;= 40 ms at p90" in page and "ITL &lt;= 50 ms at p90" in page
