"""Every path a client names (a space file, the trace a space names, a model) is confined to the allowed roots
before anything opens it, and "outside" is answered the same whether the file exists, is missing, is a FIFO or a
device (issue 47 item 7: a space under the models folder naming /etc/shadow got "shadow line 1: not JSON", a FIFO
blocked a worker, /dev/zero answered 500 after 8 s). Hostile files inside the roots get clear 422s."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
import yaml
from api_helpers import AUTH, FAST_STUDY, REPO

SPACE = yaml.safe_load((REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml").read_text())
SECRET = "root:$6$do-not-disclose$:19000:0:99999:7:::\n"
_NO_HANG_S = 120  # a refusal takes milliseconds; only a blocked worker reaches this


def _space_naming(trace: str) -> dict:
    return {**SPACE, "workload": {"trace": trace},
            "phases": {"prefill": {k: v for k, v in SPACE["phases"]["prefill"].items() if k != "workload"}}}


@pytest.fixture
def outside(tmp_path: Path) -> dict[str, str]:
    """Paths outside every allowed root: a readable secret, a missing file, a FIFO, and /dev/zero."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "shadow").write_text(SECRET)
    os.mkfifo(folder / "fifo")
    yield {"present": str(folder / "shadow"), "missing": str(folder / "nope"), "fifo": str(folder / "fifo"),
           "device": "/dev/zero"}
    (folder / "fifo").unlink()


def _post(client, body: dict):  # type: ignore[no-untyped-def]
    """POST /v1/studies from a thread: a request that blocks (a FIFO opened) fails the test instead of hanging."""
    answer: list = []
    worker = threading.Thread(target=lambda: answer.append(client.post("/v1/studies", json=body, headers=AUTH)),
                              daemon=True)
    worker.start()
    worker.join(_NO_HANG_S)
    assert answer, f"the request blocked: {body}"
    return answer[0]


def _same_outside_answer(answers: dict[str, object], loc: list[str]) -> None:
    messages = set()
    for kind, r in answers.items():
        assert r.status_code == 422, (kind, r.text)
        detail = r.json()["detail"][0]
        assert detail["loc"] == loc, (kind, detail)
        assert "outside the allowed roots" in detail["msg"], (kind, detail)
        assert "do-not-disclose" not in r.text and "not JSON" not in r.text and "line 1" not in r.text
        messages.add(detail["msg"])
    assert len(messages) == 1, messages  # existence, FIFO or device: never told apart


def test_a_space_file_naming_a_trace_outside_the_roots(sqlite_url, make_settings, client_for, model_store,
                                                       outside):
    client = client_for(make_settings(sqlite_url))
    answers = {}
    for kind, path in outside.items():
        space_file = model_store / f"space-{kind}.yaml"
        space_file.write_text(yaml.safe_dump(_space_naming(path)))
        answers[kind] = _post(client, {**FAST_STUDY, "space_path": str(space_file), "phases": ["prefill"]})
    _same_outside_answer(answers, ["body", "space_path"])
    assert client.get("/v1/studies").json()["total"] == 0


def test_an_inline_space_naming_a_trace_outside_the_roots(sqlite_url, make_settings, client_for, outside):
    client = client_for(make_settings(sqlite_url))
    answers = {kind: _post(client, {**FAST_STUDY, "space": _space_naming(path), "phases": ["prefill"]})
               for kind, path in outside.items()}
    _same_outside_answer(answers, ["body", "space", "workload", "trace"])


def test_space_and_model_paths_outside_the_roots(sqlite_url, make_settings, client_for, outside):
    client = client_for(make_settings(sqlite_url))
    _same_outside_answer({kind: _post(client, {**FAST_STUDY, "space_path": path}) for kind, path in outside.items()},
                         ["body", "space_path"])
    _same_outside_answer({kind: _post(client, {**FAST_STUDY, "model_path": path}) for kind, path in outside.items()},
                         ["body", "model_path"])
    for path in outside.values():
        r = client.post("/v1/models", json={"path": path}, headers=AUTH)
        assert r.status_code == 422 and "outside the allowed roots" in r.json()["detail"][0]["msg"], r.text
    assert client.get("/healthz").status_code == 200


def test_a_symlink_inside_the_roots_leading_out_is_outside(sqlite_url, make_settings, client_for, model_store,
                                                            outside):
    os.symlink(outside["present"], model_store / "trace.jsonl")
    client = client_for(make_settings(sqlite_url))
    r = _post(client, {**FAST_STUDY, "space": _space_naming(str(model_store / "trace.jsonl")), "phases": ["prefill"]})
    _same_outside_answer({"symlink": r}, ["body", "space", "workload", "trace"])


@pytest.mark.parametrize(("content", "says"), [
    ('{"input_length": Infinity, "output_length": 1}\n', "line 1: input_length"),
    ('{"input_length": NaN, "output_length": 1}\n', "line 1: input_length"),
    ("[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    ('{"input_length": 1, "output_length": 1, "hash_ids": [' + ",".join(map(str, range(110_000))) + "]}\n",
     "110,000 block ids for a 1-token prompt"),
])
def test_hostile_traces_inside_the_roots_are_422(sqlite_url, make_settings, client_for, model_store, content, says):
    (model_store / "t.jsonl").write_text(content)
    (model_store / "space.yaml").write_text(yaml.safe_dump(_space_naming("t.jsonl")))
    client = client_for(make_settings(sqlite_url))
    for body in ({"space_path": str(model_store / "space.yaml")},
                 {"space": _space_naming(str(model_store / "t.jsonl"))}):
        r = _post(client, {**FAST_STUDY, **body, "phases": ["prefill"]})
        assert r.status_code == 422 and says in r.json()["detail"][0]["msg"], r.text


def test_special_files_inside_the_roots_are_422(sqlite_url, make_settings, client_for, model_store):
    os.mkfifo(model_store / "fifo.jsonl")
    os.mkfifo(model_store / "fifo.yaml")
    (model_store / "dir.jsonl").mkdir()
    client = client_for(make_settings(sqlite_url))
    try:
        for name, kind in (("fifo.jsonl", "FIFO"), ("dir.jsonl", "directory")):
            r = _post(client, {**FAST_STUDY, "space": _space_naming(str(model_store / name)), "phases": ["prefill"]})
            assert r.status_code == 422 and kind in r.json()["detail"][0]["msg"], r.text
        r = _post(client, {**FAST_STUDY, "space_path": str(model_store / "fifo.yaml")})
        assert r.status_code == 422 and "FIFO" in r.json()["detail"][0]["msg"], r.text
    finally:
        (model_store / "fifo.jsonl").unlink()
        (model_store / "fifo.yaml").unlink()


def test_new_study_page_with_a_space_naming_a_hostile_trace(sqlite_url, make_settings, client_for, tmp_path):
    """GET /ui/new answered 500 while any space in the spaces folder named a trace with non-finite lengths: the
    form lists spaces without reading their traces."""
    spaces = tmp_path / "spaces"
    spaces.mkdir()
    shutil.copy(REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml", spaces / "default.yaml")
    (spaces / "inf.jsonl").write_text('{"input_length": Infinity, "output_length": 1}\n')
    (spaces / "hostile.yaml").write_text(yaml.safe_dump({**_space_naming("inf.jsonl"), "name": "hostile"}))
    client = client_for(make_settings(sqlite_url, default_space=spaces / "default.yaml"))
    page = client.get("/ui/new", headers=AUTH)
    assert page.status_code == 200, page.text[:500]
    r = _post(client, {**FAST_STUDY, "space_path": str(spaces / "hostile.yaml"), "phases": ["prefill"]})
    assert r.status_code == 422 and "inf.jsonl line 1: input_length" in r.json()["detail"][0]["msg"], r.text
