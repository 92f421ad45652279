"""Each server the tests and benchmarks start on a port chosen beforehand, started for real on a port another
process holds: it exits, and tuner.launch.lost_port reads the lost port from its log (the sign by which
tuner.launch.start_on_free_ports starts it again on a fresh port; its loop is tested in tests/launch)."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from _support.cpu_vllm import CPU_SETTINGS, needs_envs
from _support.paths import REPO

from tuner.launch import lost_port

HANG_GUARD_S = 600  # not a timing assertion: only so a server that never exits fails instead of blocking the run


def _exit_and_log(argv: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env={**os.environ, **(env or {})}, timeout=HANG_GUARD_S, start_new_session=True)
    return done.returncode, log.read_text(errors="replace")


def test_a_python_bind_failure_is_a_lost_port(held_port: int) -> None:
    with socket.socket() as sock, pytest.raises(OSError) as caught:
        sock.bind(("127.0.0.1", held_port))
    assert lost_port(str(caught.value))
    assert not lost_port("OSError: [Errno 99] Cannot assign requested address")


def test_topotune_serve_on_a_taken_port(held_port: int, tmp_path: Path) -> None:
    """uvicorn under `topotune serve` (what benchmarks/fault_injection.py starts)."""
    env = {"PYTHONPATH": str(REPO), "TOPOTUNE_API_TOKEN": "lost-port-" + "x" * 24, "TOPOTUNE_DATA_DIR": str(tmp_path),
           "TOPOTUNE_MODELS_DIR": str(tmp_path), "TOPOTUNE_WATCH_MODELS": "false", "TOPOTUNE_EXECUTOR": "local"}
    code, log = _exit_and_log([sys.executable, "-c", "from api.cli import main; main()", "serve", "--port",
                               str(held_port), "--log-level", "warning"], tmp_path, env)
    assert code != 0 and lost_port(log), log[-2000:]


def test_prometheus_on_a_taken_port(held_port: int, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary on PATH")
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 1s\n")
    code, log = _exit_and_log([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{held_port}"], tmp_path)
    assert code != 0 and lost_port(log), log[-2000:]


class _Healthy(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 200: the router only checks its workers are up before it binds its own port."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"data": [{"id": "tiny"}]}')

    def log_message(self, *args: object) -> None:
        pass


@needs_envs
def test_vllm_router_on_a_taken_port(held_port: int, tmp_path: Path) -> None:
    """vllm-router (what a trial's PD front is): it binds after its worker answers, here a stand-in HTTP server."""
    worker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    try:
        code, log = _exit_and_log([*CPU_SETTINGS.router_argv, "--host", "127.0.0.1", "--port", str(held_port),
                                   "--worker-urls", f"http://127.0.0.1:{worker.server_address[1]}"], tmp_path)
    finally:
        worker.shutdown()
        worker.server_close()
    assert code != 0 and lost_port(log), log[-2000:]


@needs_envs
@pytest.mark.slow
def test_vllm_on_a_taken_port(held_port: int, tmp_path: Path, tiny_model: Path) -> None:
    """vLLM on CPU (what tests/backends/test_live_traffic_cpu.py and benchmarks/replay_cpu_validation.py start):
    it binds its API socket before it loads the model."""
    code, log = _exit_and_log([*CPU_SETTINGS.vllm_argv, "serve", str(tiny_model), "--host", "127.0.0.1", "--port",
                               str(held_port), "--max-model-len", "1024", *CPU_SETTINGS.extra_vllm_flags],
                              tmp_path, dict(CPU_SETTINGS.vllm_env))
    assert code != 0 and lost_port(log), log[-2000:]
