"""Schemathesis against the app's own OpenAPI schema: >= 500 generated requests, no 5xx, every 422 names the
field, and every unauthenticated mutating call is refused."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import schemathesis
from api_helpers import AUTH, FAST_STUDY, finished, wait_for
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def _send(client, case, headers: dict[str, str]):
    kwargs: dict = {"params": case.query or None, "headers": {**(case.headers or {}), **headers}}
    body = case.body
    if isinstance(body, bytes | str) and case.media_type and "json" not in case.media_type:
        kwargs["content"] = body
        kwargs["headers"]["content-type"] = case.media_type
    elif body is not None and type(body).__name__ != "NotSet":
        kwargs["content"] = json.dumps(body, default=str)
        kwargs["headers"]["content-type"] = "application/json"
    return client.request(case.method, case.formatted_path, **kwargs)


def _check_422(case, response) -> None:
    detail = response.json()["detail"]
    assert detail and all(d["loc"] for d in detail), response.text
    first = detail[0]["loc"]
    if first[0] == "body" and len(first) == 1:  # the body itself is the wrong type
        assert not isinstance(case.body, dict), (case.body, response.text)
    else:
        assert first[0] in ("body", "query", "path", "header") and len(first) >= 2, response.text


@pytest.fixture
def fuzz_client(sqlite_url, make_settings, client_for):
    return client_for(make_settings(sqlite_url, max_parallel_studies=1))


@pytest.fixture
def fuzz_client_with_study(fuzz_client):
    """Study 1 exists and is finished, so generated ids hit real fronts, trials and exports too."""
    sid = fuzz_client.post("/v1/studies", json=FAST_STUDY, headers=AUTH).json()["id"]
    assert wait_for(fuzz_client, sid, finished)["status"] == "succeeded"
    return fuzz_client


def test_generated_requests(fuzz_client_with_study):
    fuzz_client = fuzz_client_with_study
    schema = schemathesis.openapi.from_dict(fuzz_client.get("/openapi.json").json())
    statuses: Counter[int] = Counter()
    for mode, examples in ((GenerationMode.POSITIVE, 320), (GenerationMode.NEGATIVE, 320)):
        strategy = schema.as_strategy(generation_mode=mode)

        @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case) -> None:
            response = _send(fuzz_client, case, AUTH)
            statuses[response.status_code] += 1
            assert response.status_code < 500, (case.method, case.formatted_path, case.body, response.text)
            if response.status_code == 422:
                _check_422(case, response)

        run()
    total = sum(statuses.values())
    assert statuses[200] >= 50
    print(f"\n{total} generated requests: {dict(sorted(statuses.items()))}")
    assert total >= 500
    assert not [s for s in statuses if s >= 500]


def test_unauthenticated_mutations_all_refused(fuzz_client):
    schema = schemathesis.openapi.from_dict(fuzz_client.get("/openapi.json").json())
    mutating = [op for op in schema.get_all_operations() if op.ok().method.upper() in MUTATING]
    assert len(mutating) >= 3
    strategy = st.one_of([op.ok().as_strategy(generation_mode=m) for op in mutating
                          for m in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)])
    seen = Counter()

    @settings(max_examples=150, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy, header=st.sampled_from([{}, {"Authorization": "Bearer nope"},
                                                  {"Authorization": "Basic abc"}, {"Authorization": ""}]))
    def run(case, header) -> None:
        headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
        case.headers = headers
        response = _send(fuzz_client, case, header)
        seen[response.status_code] += 1
        assert response.status_code == 401, (case.method, case.formatted_path, response.text)

    run()
    assert seen[401] >= 100
    assert fuzz_client.get("/v1/studies", headers=AUTH).json()["total"] == 0  # nothing slipped through
