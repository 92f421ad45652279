"""~45 malformed and hostile requests against a real `topotune serve` app (uvicorn on 127.0.0.1, SQLite), after
one finished study: alias bombs, recursive and deep YAML, non-finite numbers, oversized bodies, unbounded
requests, paths out of the roots, bad ids and queries, missing or wrong tokens.

Prints each request's status and time, then the figures issue 14 asks for: responses 5xx (goal 0), slowest
answer (goal < 2 s), the service healthy after, the stored trials unchanged.
Usage: .venv/bin/python benchmarks/hostile_requests.py
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import httpx
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


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _space(**decode: object) -> dict:
    space = yaml.safe_load((REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml").read_text())
    space["phases"]["decode"].update(decode)
    return space


def requests(models: Path, sid: int) -> list[tuple[str, str, str, dict]]:
    """(label, method, path, httpx kwargs)."""
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


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="topotune-hostile-"))
    models = tmp / "models"
    models.mkdir()
    shutil.copytree(REPO / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4", models / "ref")
    (models / "bomb.yaml").write_text(BOMB)
    os.symlink("/etc", models / "escape")
    settings = ApiSettings(data_dir=tmp, api_token=TOKEN, executor="local", models_dir=models, watch_models=False,
                           allowed_roots=[models, REPO / "search_spaces"], max_parallel_studies=1)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{server.config.port}"
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            sid = http.post("/v1/studies", json=STUDY, headers=AUTH).json()["id"]
            while http.get(f"/v1/studies/{sid}").json()["status"] not in ("succeeded", "failed"):
                time.sleep(0.3)
            before = http.get(f"/v1/studies/{sid}/trials", params={"limit": 1000}).json()
            studies_before = http.get("/v1/studies").json()["total"]
            results = []
            for label, method, path, kwargs in requests(models, sid):
                t0 = time.perf_counter()
                try:
                    status = http.request(method, path, **kwargs).status_code
                except httpx.HTTPError as exc:  # the server closed the connection: a refusal, not a 5xx
                    status = f"closed ({type(exc).__name__})"
                took = time.perf_counter() - t0
                results.append((label, status, took))
                print(f"  {label:<34} {status!s:>5}  {took * 1000:7.0f} ms", flush=True)
            health = http.get("/healthz").json()
            after = http.get(f"/v1/studies/{sid}/trials", params={"limit": 1000}).json()
            studies_after = http.get("/v1/studies").json()["total"]
        server_errors = [r for r in results if isinstance(r[1], int) and r[1] >= 500]
        slowest = max(results, key=lambda r: r[2])
        print(f"{len(results)} hostile requests: {len(server_errors)} responses 5xx (goal 0), slowest "
              f"{slowest[2]:.2f} s ({slowest[0]}; goal < 2 s), health after: {health['status']}, stored trials "
              f"{'unchanged' if after == before else 'CHANGED'} ({before['total']}), studies "
              f"{studies_before} -> {studies_after}")
    finally:
        server.should_exit = True
        thread.join(timeout=60)


if __name__ == "__main__":
    main()
