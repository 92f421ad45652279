"""PD first contact and the measured window's KV-transfer check, against an HTTP server that answers like
vllm-router (/v1/completions) and a decode server (/metrics, vLLM's counter names).

Why: NIXL's handshake is made by the first request with a 5 s zmq timeout; on a loaded 2-core machine it failed
once, decode recomputed that prompt, and the old check (failed transfers since start > 0) failed a trial whose
measured requests all moved KV. A failure inside the measured window must still fail the trial.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from tuner.backends import TrialStatus
from tuner.backends.vllm import VllmBackend, VllmBackendSettings
from tuner.backends.vllm._backend import PD_CONNECT_REQUESTS, _TrialFailed


class FakeCluster:
    """Counters as decode reports them; each completion runs the next scripted outcome."""

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = list(outcomes)  # "fail": handshake lost, prompt recomputed; "kv": prompt moved over NIXL
        self.external = self.local = self.failed = 0.0
        self.completions = 0

    def complete(self) -> None:
        self.completions += 1
        outcome = self.outcomes.pop(0) if self.outcomes else "kv"
        if outcome == "fail":
            self.failed += 1
            self.local += 100
        else:
            self.external += 100

    def metrics(self) -> str:
        return (f'vllm:prompt_tokens_by_source_total{{engine="0",source="external_kv_transfer"}} {self.external}\n'
                f'vllm:prompt_tokens_by_source_total{{engine="0",source="local_compute"}} {self.local}\n'
                f'vllm:nixl_num_failed_transfers_total{{engine="0"}} {self.failed}\n')


@pytest.fixture
def cluster() -> Iterator[tuple[FakeCluster, object]]:
    state = FakeCluster([])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(state.metrics().encode())

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            state.complete()
            self._send(json.dumps({"choices": [{"text": "hi"}], "usage": {"completion_tokens": 2}}).encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    plan = SimpleNamespace(endpoint=f"http://127.0.0.1:{port}",
                           servers=[SimpleNamespace(name="decode0", role="decode", host="127.0.0.1", port=port)])
    try:
        yield state, plan
    finally:
        server.shutdown()
        server.server_close()


def _backend() -> VllmBackend:
    return VllmBackend(VllmBackendSettings.for_cpu())


REQUEST = SimpleNamespace(workload=SimpleNamespace(isl=256))


def test_a_lost_first_handshake_is_retried_and_left_out_of_the_measured_window(cluster) -> None:
    state, plan = cluster
    state.outcomes = ["fail"]
    backend = _backend()
    baseline = backend._connect_pd(REQUEST, plan)
    assert baseline["pd_connect_requests"] == 2 and state.completions == 2
    for _ in range(8):  # the measured requests: all over the connector
        state.complete()
    window = backend._verify_kv_transfer(plan, baseline)
    assert window["pd_nixl_failed_transfers"] == 0 and window["pd_local_compute_tokens"] == 0
    assert window["pd_external_kv_tokens"] == 800
    assert window["pd_connect_failed_transfers"] == 1


def test_a_failed_transfer_while_measured_fails_the_trial(cluster) -> None:
    state, plan = cluster
    backend = _backend()
    baseline = backend._connect_pd(REQUEST, plan)
    assert baseline["pd_connect_requests"] == 1
    state.outcomes = ["kv", "fail", "kv"]
    for _ in range(3):
        state.complete()
    with pytest.raises(_TrialFailed) as err:
        backend._verify_kv_transfer(plan, baseline)
    assert err.value.failure.status is TrialStatus.BENCHMARK_FAILED
    assert "while measured" in err.value.failure.reason and "1 failed NIXL transfers" in err.value.failure.reason


def test_no_kv_transfer_at_all_fails_first_contact(cluster) -> None:
    state, plan = cluster
    state.outcomes = ["fail"] * (PD_CONNECT_REQUESTS + 1)
    with pytest.raises(_TrialFailed) as err:
        _backend()._connect_pd(REQUEST, plan)
    assert state.completions == PD_CONNECT_REQUESTS
    assert "no prompt KV over the connector" in err.value.failure.reason
    assert f"{PD_CONNECT_REQUESTS:g} failed NIXL transfers" in err.value.failure.reason
