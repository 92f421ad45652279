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

from tuner.backends import HostAssignment
from tuner.backends.vllm import PlanSettings, build_plan, keep_names
from tuner.deployment import parse_deployment
from tuner.launch import RunningProcess, free_port_block, lost_port, start_process, terminate, wait_healthy

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



@needs_envs
def test_two_trials_routers_run_side_by_side_on_one_host(tmp_path: Path) -> None:
    """Two trials' plans on one host, each on its own free port block: both routers come up at once. vllm-router binds
    a Prometheus exporter besides its port, at 29000 unless told (its `--prometheus-port` default), so before the plan
    gave it a port of the trial's block the second router exited with "Address already in use"."""
    workers: list[http.server.ThreadingHTTPServer] = []
    routers: list[RunningProcess] = []
    try:
        for trial in range(2):
            base = free_port_block(300)
            settings = PlanSettings(model_path="/models/tiny", router_argv=CPU_SETTINGS.router_argv,
                                    bind_host="127.0.0.1", api_port_base=base, router_port=base + 60)
            plan = build_plan(parse_deployment("2x:TP1"), (HostAssignment(address="127.0.0.1", gpu_ids=(0, 1)),),
                              settings, resolve=keep_names)
            for server in plan.servers:  # stand-ins where the plan's API servers listen: the router waits for them
                workers.append(http.server.ThreadingHTTPServer(("127.0.0.1", server.port), _Healthy))
                threading.Thread(target=workers[-1].serve_forever, daemon=True).start()
            (front,) = plan.fronts
            routers.append(start_process(front, tmp_path / f"trial{trial}"))  # as the backend starts its fronts
        failure = wait_healthy(routers, HANG_GUARD_S, poll_s=0.2)  # the guard is not a timing assertion
        assert failure is None, (failure, [r.log_text()[-2000:] for r in routers])
        assert all(r.popen.poll() is None for r in routers)  # neither lost a port to the other
    finally:
        terminate(routers, grace_s=10)
        for worker in workers:
            worker.shutdown()
            worker.server_close()
