"""~80 malformed and hostile requests against a real `topotune serve` app (uvicorn on 127.0.0.1, SQLite), after
one finished study: alias bombs, recursive and deep YAML, non-finite numbers, oversized bodies, unbounded
requests, paths out of the roots, bad ids and queries, missing or wrong tokens; and issue 47's service cases:
hostile traces named by a space (non-finite lengths, a directory, deep nesting, non-UTF-8, a line with no end,
hash_ids beyond the prompt's blocks, a FIFO, /dev/zero, a secret and a missing file outside the roots), the
new-study form beside such a space, a cluster row whose GPU left the catalog, and writes through the embedded
Optuna dashboard.

Prints each request's status and time, then the figures issues 14 and 47 ask for: inputs sent, responses 5xx
(goal 0), tracebacks the server logged (goal 0), stored rows lost (trials, studies, phase-study names, cluster
rows; goal 0), slowest answer (goal < 2 s), the service healthy after.
Usage: .venv/bin/python benchmarks/hostile_requests.py
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import httpx2
import uvicorn
import yaml

warnings.filterwarnings("ignore")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from api.config import ApiSettings  # noqa: E402
from api.main import create_app  # noqa: E402

TOKEN = "bench-token-" + "x" * 20
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "content-type": "application/json"}
STUDY = {"model_path": "ref", "trials": 3, "sampler": "random", "seed": 1}
BOMB = "\n".join(['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
                 + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]) + "\nname: bomb\n"


def _space(**decode: object) -> dict:
    space = yaml.safe_load((REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml").read_text())
    space["phases"]["decode"].update(decode)
    return space


def requests(models: Path, sid: int) -> list[tuple[str, str, str, dict]]:
    """(label, method, path, httpx2 kwargs)."""
    raw = json.dumps(STUDY)[:-1]
    inf_space = json.dumps({**STUDY, "space": {**_space(), "constraints": {"max_ttft_ms": "X"}}})
    inf_space = inf_space.replace('"X"', "1e400")

    def post(label: str, body: object = None, **kw: object) -> tuple[str, str, str, dict]:
        return (label, "POST", "/v1/studies", {"json": body, "headers": AUTH} if body is not None else kw)

    def chunks():  # no Content-Length
        for _ in range(16):
            yield b"x" * 2**20

    return [
        post("alias bomb (inline space)", {**STUDY, "space": BOMB}),
        post("alias bomb (space_path file)", {**STUDY, "space_path": str(models / "bomb.yaml")}),
        post("recursive alias", {**STUDY, "space": "a: &a [*a]\nname: loop\n"}),
        post("5,000-deep nesting", {**STUDY, "space": "[" * 5000 + "]" * 5000}),
        post("200 aliases", {**STUDY, "space": "x: &x {a: 1}\n" + "\n".join(f"k{i}: *x" for i in range(200))}),
        post("10 MB JSON space", {**STUDY, "space": {"name": "x", "description": "y" * 10 * 2**20}}),
        post("16 MB chunked body", content=chunks(), headers=JSON),
        post("trials 1e400", content=raw + ', "trials": 1e400}', headers=JSON),
        post("trial_delay_s NaN", content=raw + ', "trial_delay_s": NaN}', headers=JSON),
        post("noise -Infinity", content=raw + ', "noise": -Infinity}', headers=JSON),
        post("seed 1e400", content=raw + ', "seed": 1e400}', headers=JSON),
        post("space max_ttft_ms 1e400", content=inf_space, headers=JSON),
        post("range step 1e-12", {**STUDY, "space": _space(gpu_memory_utilization={"low": 0.1, "high": 0.9,
                                                                                 "step": 1e-12})}),
        post("4 million configurations", {**STUDY, "space": _space(max_num_seqs=list(range(1, 200)),
                                                                  max_num_batched_tokens=list(range(1, 200)))}),
        post("max_num_seqs 10**30", {**STUDY, "space": _space(max_num_seqs=[10**30])}),
        post("trials 0", {**STUDY, "trials": 0}),
        post("trials 5000", {**STUDY, "trials": 5000}),
        post("trial_delay_s 3600", {**STUDY, "trial_delay_s": 3600}),
        post("1000 trials x 100 s", {**STUDY, "trials": 1000, "trial_delay_s": 100}),
        post("sampler bogus", {**STUDY, "sampler": "bogus"}),
        post("backend x", {**STUDY, "backend": "x"}),
        post("phases [middle]", {**STUDY, "phases": ["middle"]}),
        post("unknown field", {**STUDY, "unknown": 1}),
        post("model_path ../", {**STUDY, "model_path": "../models/ref"}),
        post("model_path /etc/passwd", {**STUDY, "model_path": "/etc/passwd"}),
        post("model_path symlink out", {**STUDY, "model_path": "escape"}),
        post("model_path NUL", {**STUDY, "model_path": "ref\x00"}),
        post("model_path 5,000 chars", {**STUDY, "model_path": "a" * 5000}),
        post("space_path /etc/passwd", {**STUDY, "space_path": "/etc/passwd"}),
        post("space and space_path", {**STUDY, "space": "name: x", "space_path": "gb300-nvl72-8k1k.yaml"}),
        post("YAML syntax error", {**STUDY, "space": "name: [unclosed\n"}),
        post("space a YAML list", {**STUDY, "space": "- 1\n- 2\n"}),
        post("body not JSON", content=b"{not json", headers=JSON),
        post("body a JSON array", content=b"[1, 2]", headers=JSON),
        post("text/plain body", content=b"model_path=ref", headers={**AUTH, "content-type": "text/plain"}),
        ("models: path out of the roots", "POST", "/v1/models", {"json": {"path": "/etc"}, "headers": AUTH}),
        ("models: symlink out", "POST", "/v1/models", {"json": {"path": "escape"}, "headers": AUTH}),
        ("study 0", "GET", "/v1/studies/0", {}),
        ("study 10**11", "GET", "/v1/studies/99999999999", {}),
        ("export point -1", "GET", f"/v1/studies/{sid}/export?point=-1", {}),
        ("export point 100001", "GET", f"/v1/studies/{sid}/export?point=100001", {}),
        ("export format exe", "GET", f"/v1/studies/{sid}/export?format=exe", {}),
        ("trials limit 100000", "GET", f"/v1/studies/{sid}/trials?limit=100000", {}),
        ("list status bogus", "GET", "/v1/studies?status=bogus", {}),
        ("cancel a missing study", "POST", "/v1/studies/424242/cancel", {"headers": AUTH}),
        ("POST without a token", "POST", "/v1/studies", {"json": STUDY}),
        ("POST with a wrong token", "POST", "/v1/studies", {"json": STUDY,
                                                             "headers": {"Authorization": "Bearer " + "y" * 32}}),
    ]


def _trace_space(trace: str) -> dict:
    """The reference space measuring prefill only, its traffic the trace at `trace`."""
    space = _space()
    space["workload"] = {"trace": trace}
    space["phases"] = {"prefill": {k: v for k, v in space["phases"]["prefill"].items() if k != "workload"}}
    return space


OUTSIDE = ("shadow outside", "missing outside", "fifo outside", "/dev/zero")


def issue47_files(tmp: Path, models: Path, spaces: Path) -> dict[str, str]:
    """Hostile traces inside the roots, and a secret, a missing file, a FIFO and /dev/zero outside them."""
    inside = {
        "inf": '{"input_length": Infinity, "output_length": 1}\n',
        "nan": '{"input_length": NaN, "output_length": 1}\n',
        "1e400": '{"input_length": 1e400, "output_length": 1}\n',
        "deep": "[" * 100_000 + "]" * 100_000 + "\n",
        "hash_ids": json.dumps({"input_length": 1, "output_length": 1, "hash_ids": list(range(110_000))}) + "\n",
    }
    paths = {}
    for name, text in inside.items():
        (models / f"{name}.jsonl").write_text(text)
        paths[name] = str(models / f"{name}.jsonl")
    (models / "latin1.jsonl").write_bytes(b'{"input_length": 5, "output_length": 1, "x": "\xe9"}\n')
    paths["latin1"] = str(models / "latin1.jsonl")
    (models / "dir.jsonl").mkdir()
    paths["dir"] = str(models / "dir.jsonl")
    with (models / "noend.jsonl").open("wb") as handle:  # 1.5 GB without a newline, sparse
        handle.truncate(1500 * 2**20)
    paths["noend"] = str(models / "noend.jsonl")
    os.mkfifo(models / "fifo.jsonl")
    paths["fifo inside"] = str(models / "fifo.jsonl")
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "shadow").write_text("root:$6$secret$:19000:0:99999:7:::\n")
    os.mkfifo(outside / "fifo")
    paths |= {"shadow outside": str(outside / "shadow"), "missing outside": str(outside / "nope"),
              "fifo outside": str(outside / "fifo"), "/dev/zero": "/dev/zero"}
    for name in ("shadow outside", "missing outside", "fifo outside", "/dev/zero", "inf"):
        (models / f"space-{name.replace('/', '').replace(' ', '-')}.yaml").write_text(
            yaml.safe_dump(_trace_space(paths[name])))
    # a space in the service's own folder of spaces naming a trace with an infinite length: /ui/new lists it
    (spaces / "inf.jsonl").write_text(inside["inf"])
    (spaces / "hostile.yaml").write_text(yaml.safe_dump({**_trace_space("inf.jsonl"), "name": "hostile"}))
    return paths


def issue47_requests(models: Path, paths: dict[str, str], phase_study_id: int) -> list[tuple[str, str, str, dict]]:
    out = []
    for name, path in paths.items():
        out.append((f"trace {name} (inline space)", "POST", "/v1/studies",
                    {"json": {**STUDY, "space": _trace_space(path), "phases": ["prefill"]}, "headers": AUTH}))
    for name in ("shadow outside", "missing outside", "fifo outside", "/dev/zero", "inf"):
        space_file = models / f"space-{name.replace('/', '').replace(' ', '-')}.yaml"
        out.append((f"space_path naming {name}", "POST", "/v1/studies",
                    {"json": {**STUDY, "space_path": str(space_file), "phases": ["prefill"]}, "headers": AUTH}))
    for name in ("shadow outside", "missing outside", "fifo outside", "/dev/zero"):
        out.append((f"space_path {name}", "POST", "/v1/studies",
                    {"json": {**STUDY, "space_path": paths[name]}, "headers": AUTH}))
        out.append((f"model_path {name}", "POST", "/v1/studies",
                    {"json": {**STUDY, "model_path": paths[name]}, "headers": AUTH}))
    dash = {"headers": AUTH}
    out += [
        ("new-study form, hostile space", "GET", "/ui/new", {"headers": AUTH}),
        ("clusters, GPU not in catalog", "GET", "/v1/clusters", {}),
        ("clusters held out, GPU gone", "GET", "/v1/clusters?held_out=true", {}),
        ("dashboard: create a study", "POST", "/api/studies",
         {"json": {"study_name": "made-here", "directions": ["maximize"]}, **dash}),
        ("dashboard: rename a phase study", "POST", f"/api/studies/{phase_study_id}/rename",
         {"json": {"study_name": "renamed"}, **dash}),
        ("dashboard: delete a phase study", "DELETE", f"/api/studies/{phase_study_id}",
         {"json": {"remove_associated_artifacts": False}, **dash}),
        ("dashboard: note", "PUT", f"/api/studies/{phase_study_id}/note", {"json": {"version": 0, "body": "x"},
                                                                           **dash}),
        ("dashboard: tell unknown trial", "POST", "/api/trials/999999/tell", {"json": {"state": "Fail"}, **dash}),
        ("dashboard: rename unknown", "POST", "/api/studies/999999/rename", {"json": {"study_name": "y"}, **dash}),
        ("dashboard: plot unknown study", "GET", "/api/studies/999999/plot/contour", {}),
        ("dashboard: importances unknown", "GET", "/api/studies/999999/param_importances", {}),
        ("dashboard: csv unknown", "GET", "/csv/999999", {}),
    ]
    return out


class _Tracebacks(logging.Handler):
    """Counts the log records that carry a traceback (uvicorn's "Exception in ASGI application", log.exception)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.count += 1
            if len(self.first) < 3:
                self.first.append(self.format(record).splitlines()[-1])


def _stored(http: httpx2.Client, sid: int, url: str) -> dict[str, object]:
    """What must never be lost or changed: the finished study's trials, the study list, the Optuna study names
    (the phase studies' too) and the cluster store's rows."""
    import optuna
    import sqlalchemy as sa

    from tuner.cluster import cluster_metadata
    from tuner.study import open_storage

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                    for t in cluster_metadata().sorted_tables}
    finally:
        engine.dispose()
    return {"trials": http.get(f"/v1/studies/{sid}/trials", params={"limit": 1000}).json()["items"],
            "studies": http.get("/v1/studies").json()["total"],
            "optuna studies": sorted((s.study_name, s.n_trials)
                                     for s in optuna.get_all_study_summaries(open_storage(url))),
            "cluster rows": rows}


def _lost(before: dict[str, object], after: dict[str, object]) -> int:
    """Rows of `before` missing or changed in `after` (new rows are not losses)."""
    lost = 0
    trials_after = {json.dumps(t, sort_keys=True) for t in after["trials"]}  # type: ignore[union-attr]
    lost += sum(json.dumps(t, sort_keys=True) not in trials_after for t in before["trials"])  # type: ignore[union-attr]
    lost += max(0, before["studies"] - after["studies"])  # type: ignore[operator]
    lost += len(set(before["optuna studies"]) - set(after["optuna studies"]))  # type: ignore[arg-type]
    lost += sum(max(0, n - after["cluster rows"].get(t, 0))  # type: ignore[union-attr]
                for t, n in before["cluster rows"].items())  # type: ignore[union-attr]
    return lost


def main() -> None:
    from tuner.cluster import ClusterKey, ClusterStore, StoredFailure
    from tuner.topology import Topology
    from tuner.trial_status import TrialStatus

    tmp = Path(tempfile.mkdtemp(prefix="topotune-hostile-"))
    models = tmp / "models"
    models.mkdir()
    shutil.copytree(REPO / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4", models / "ref")
    (models / "bomb.yaml").write_text(BOMB)
    os.symlink("/etc", models / "escape")
    spaces = tmp / "spaces"
    spaces.mkdir()
    shutil.copy(REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml", spaces / "gb300-nvl72-8k1k.yaml")
    paths = issue47_files(tmp, models, spaces)
    settings = ApiSettings(data_dir=tmp, api_token=TOKEN, executor="local", models_dir=models, watch_models=False,
                           default_space=spaces / "gb300-nvl72-8k1k.yaml",
                           allowed_roots=[models, REPO / "search_spaces", spaces], max_parallel_studies=1)
    tracebacks = _Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    # bound here and handed to uvicorn: no window for another process to take the port;
    # proto IPPROTO_TCP, not socket()'s 0: asyncio disables Nagle only on sockets whose proto says TCP
    # (base_events._set_nodelay), and without it every keep-alive request waited ~44 ms for a delayed ACK
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=sock.getsockname()[1],
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    for name in ("uvicorn.error", "uvicorn.access", "uvicorn"):  # uvicorn's loggers do not propagate
        logging.getLogger(name).addHandler(tracebacks)
    base = f"http://127.0.0.1:{server.config.port}"
    try:
        with httpx2.Client(base_url=base, timeout=60) as http:
            sid = http.post("/v1/studies", json=STUDY, headers=AUTH).json()["id"]
            while http.get(f"/v1/studies/{sid}").json()["status"] not in ("succeeded", "failed"):
                time.sleep(0.3)
            control = {}
            for query in ("", "?held_out=true"):  # the cost of the fit itself, before the row whose GPU is gone
                t0 = time.perf_counter()
                http.get(f"/v1/clusters{query}").raise_for_status()
                control[query] = time.perf_counter() - t0
            gone = ClusterKey("old", "no-such-gpu", "nvlink8+infiniband", "unknown", "hopper")
            ClusterStore(settings.database_url).record_failure(gone, StoredFailure(
                model_name="m", topology=Topology(tp=2), status=TrialStatus.CRASHED, reason="x", study="s/decode"))
            phase_study_id = http.get("/api/studies").json()["study_summaries"][0]["study_id"]
            before = _stored(http, sid, settings.database_url)
            results = []
            outside_answers: dict[str, set[str]] = {}
            for label, method, path, kwargs in [*requests(models, sid),
                                                *issue47_requests(models, paths, phase_study_id)]:
                t0 = time.perf_counter()
                try:
                    response = http.request(method, path, **kwargs)
                    status: int | str = response.status_code
                    for name in OUTSIDE:  # one answer per request kind, whichever outside file it names
                        if name in label:
                            outside_answers.setdefault(label.replace(name, "*"), set()).add(response.text)
                except httpx2.HTTPError as exc:  # the server closed the connection: a refusal, not a 5xx
                    status = f"closed ({type(exc).__name__})"
                took = time.perf_counter() - t0
                results.append((label, status, took))
                print(f"  {label:<36} {status!s:>5}  {took * 1000:7.0f} ms", flush=True)
            health = http.get("/healthz").json()
            after = _stored(http, sid, settings.database_url)
        server_errors = [r for r in results if isinstance(r[1], int) and r[1] >= 500]
        slowest = max(results, key=lambda r: r[2])
        disclosing = sorted(k for k, answers in outside_answers.items() if len(answers) > 1)
        print(f"{len(results)} hostile inputs: {len(server_errors)} responses 5xx (goal 0), {tracebacks.count} "
              f"tracebacks logged (goal 0), {_lost(before, after)} stored rows lost (goal 0), slowest "
              f"{slowest[2]:.2f} s ({slowest[0]}; goal < 2 s), health after: {health['status']}, outside-the-roots "
              f"answers that differ by file: {len(disclosing)} {disclosing or ''}(goal 0), studies "
              f"{before['studies']} -> {after['studies']}")
        print(f"control (not a hostile input): GET /v1/clusters before the row whose GPU left the catalog took "
              f"{control['']:.2f} s, with held_out=true {control['?held_out=true']:.2f} s")
        if tracebacks.first:
            print("first tracebacks:", *tracebacks.first, sep="\n  ")
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)  # its FIFOs and the sparse 1.5 GB file with it


if __name__ == "__main__":
    main()
