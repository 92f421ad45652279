"""Traffic from a running vLLM, for real: the vLLM CPU build serves two traffic phases AIPerf generates (different
length mixes, prefix sharing and rates, constant arrivals); the workload read from its /metrics matches what AIPerf
sent, the deployment watch fires once, on the phase change, and Prometheus (Debian's package, when installed)
scraping the same server gives the same workload through --from-prometheus.

Nothing is timed: windows are read on the wall clock they took, and the phases are told apart by AIPerf's own
per-request timestamps. A window counts as inside a phase when it starts after the phase's first request was sent
(plus a settling margin) and ends before its last one was.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from _support.cpu_vllm import CPU_SETTINGS, needs_envs
from fastapi.testclient import TestClient

from tuner.backends.vllm import default_envs_dir
from tuner.cluster import ClusterKey, ClusterStore
from tuner.deployment import parse_deployment
from tuner.hardware import get_gpu
from tuner.launch import start_on_free_ports
from tuner.live import Thresholds, WatchAdviceRequest, WatchState, WatchTarget, check_deployment, record_window, tick
from tuner.models import load_model
from tuner.perf import RooflineModel, default_calibration
from tuner.workload import LiveTraffic, VllmCounters, live_traffic, scrape, traffic_from_prometheus

pytestmark = pytest.mark.slow

WINDOW_S = 15.0
SETTLE_S = 3.0  # after a phase's first request, before a window may count as inside it
PHASES = {
    # name: AIPerf arguments (constant arrivals: the count in a window is the rate x its length, +-1)
    "chat": ["--isl", "150", "--isl-stddev", "40", "--osl", "30", "--osl-stddev", "8", "--prefix-prompt-length",
             "128", "--prefix-prompt-pool-size", "1", "--request-rate", "1.5", "--request-count", "90"],
    "summarise": ["--isl", "450", "--isl-stddev", "0", "--osl", "90", "--osl-stddev", "0", "--request-rate", "0.6",
                  "--request-count", "54"],
}


PROMETHEUS_LISTENING = re.compile(r'msg="Listening on" address=127\.0\.0\.1:(\d+)')


def _start_vllm(model: Path, tmp: Path) -> tuple[subprocess.Popen, int]:
    """vLLM serving `model`, healthy, and its port, from free_port_block (below the ephemeral ports that outgoing
    connections take) through start_on_free_ports: again on another when another process bound it before vLLM
    did (vLLM takes no bound socket nor reports a port-0 bind)."""
    env = {**os.environ, **CPU_SETTINGS.vllm_env, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto"}

    def log(attempt: int) -> Path:
        return tmp / ("vllm.log" if attempt == 0 else f"vllm-{attempt}.log")

    def start(port: int, attempt: int) -> tuple[subprocess.Popen, int]:
        vllm = subprocess.Popen(
            [*CPU_SETTINGS.vllm_argv, "serve", str(model), "--served-model-name", "tiny", "--host", "127.0.0.1",
             "--port", str(port), "--max-num-seqs", "8", "--max-model-len", "1024", *CPU_SETTINGS.extra_vllm_flags],
            env=env, stdout=log(attempt).open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_http(f"http://127.0.0.1:{port}/health", 900, vllm)
        except BaseException:
            _stop(vllm)
            raise
        return vllm, port

    return start_on_free_ports(start, ports=1, logs=lambda n: [log(n).read_text(errors="replace")], where=tmp)


def _start_prometheus(binary: str, target_port: int, tmp: Path) -> tuple[subprocess.Popen, str]:
    """Prometheus scraping the server every second, on a port it binds itself (port 0, read back from its log)."""
    config = tmp / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vllm\n"
                      f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n")
    log = tmp / "prometheus.log"
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         "--web.listen-address=127.0.0.1:0"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (found := PROMETHEUS_LISTENING.search(log.read_text(errors="replace"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise AssertionError(f"prometheus did not say where it listens: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    url = f"http://127.0.0.1:{found.group(1)}"
    _wait_http(f"{url}/-/ready", 120, proc)
    return proc, url


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url} did not answer in {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Phase:
    name: str
    first_start_s: float  # wall clock of the first request sent
    last_start_s: float
    requests: list[tuple[float, int, int]]  # (end wall clock, input tokens, output tokens)
    throughput_rps: float  # AIPerf's request_throughput (completed / its duration, the last latency included)

    @property
    def arrival_rps(self) -> float:
        """The rate AIPerf sent at: its requests' start times (constant arrivals)."""
        return (len(self.requests) - 1) / (self.last_start_s - self.first_start_s)


@dataclass
class Run:
    url: str
    scrapes: list[tuple[float, VllmCounters]]  # (wall clock, counters)
    phases: list[Phase]
    prometheus: str | None
    model_dir: Path
    service_history: list[dict]  # the service's own watch over the same run, newest first


def _phase(name: str, folder: Path) -> Phase:
    rows = [json.loads(line) for line in (folder / "profile_export.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["metadata"].get("benchmark_phase", "profiling") == "profiling"]
    starts = [r["metadata"]["request_start_ns"] / 1e9 for r in rows]
    summary = json.loads((folder / "profile_export_aiperf.json").read_text())
    return Phase(name, min(starts), max(starts),
                 [(r["metadata"]["request_end_ns"] / 1e9, int(r["metrics"]["input_sequence_length"]["value"]),
                   int(r["metrics"]["output_sequence_length"]["value"])) for r in rows],
                 float(summary["request_throughput"]["avg"]))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Run]:
    if CPU_SETTINGS.missing_executables():
        pytest.skip("CPU vLLM venvs missing: run `make cpu-vllm`")
    tmp = tmp_path_factory.mktemp("live")
    model = tiny_model
    vllm, port = _start_vllm(model, tmp)
    prometheus: subprocess.Popen | None = None
    try:
        prom_url = None
        binary = shutil.which("prometheus")
        if binary:
            prometheus, prom_url = _start_prometheus(binary, port, tmp)
        url = f"http://127.0.0.1:{port}/metrics"
        with _service(tmp, url, model) as (client, watch_id):
            scrapes = _serve_phases(url, port, model, tmp)
            history = client.get(f"/v1/watches/{watch_id}/history?limit=2000").json()
        if prometheus is not None:
            time.sleep(3)  # its last 1 s scrapes of the final counters
        _stop(vllm)
        yield Run(url, scrapes, [_phase(name, tmp / name) for name in PHASES], prom_url, model, history)
    finally:
        _stop(vllm)
        if prometheus is not None:
            _stop(prometheus)


@contextlib.contextmanager
def _service(tmp: Path, url: str, model: Path) -> Iterator[tuple[TestClient, int]]:
    """The service (SQLite, no model watcher, the model's folder as its store) with a deployment watch on the
    server, every WINDOW_S."""
    from api.config import ApiSettings
    from api.main import create_app

    token = "live-test-token-" + "x" * 24
    settings = ApiSettings(data_dir=tmp / "service", storage=f"sqlite:///{tmp / 'service.db'}", api_token=token,
                           executor="local", models_dir=model.parent, watch_models=False)
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/watches", headers={"Authorization": f"Bearer {token}"}, json={
            "name": "tiny", "urls": [url], "deployment": "TP1", "serve_flags": "--max-num-seqs 8",
            "model_path": model.name, "hardware": "cpu", "max_gpus": 2, "period_s": WINDOW_S})
        assert r.status_code == 201, r.text
        yield client, r.json()["id"]


def _serve_phases(url: str, port: int, model: Path, tmp: Path) -> list[tuple[float, VllmCounters]]:
    """AIPerf's phases one after the other in a thread; a scrape every WINDOW_S meanwhile, and one window after."""
    done = threading.Event()
    failures: list[str] = []
    aiperf = str(default_envs_dir() / "aiperf" / "bin" / "aiperf")

    def generate() -> None:
        try:
            for name, args in PHASES.items():
                out = subprocess.run(
                    [aiperf, "profile", "--model", "tiny", "--tokenizer", str(model), "--url",
                     f"http://127.0.0.1:{port}", "--endpoint-type", "completions", "--streaming", "--extra-inputs",
                     "ignore_eos:true", "--use-server-token-count", "--arrival-pattern", "constant", *args,
                     "--random-seed", "7", "--ui", "none", "--no-gpu-telemetry", "--no-server-metrics",
                     "--artifact-dir", str(tmp / name)],
                    capture_output=True, text=True, timeout=1800)
                if out.returncode != 0:
                    failures.append(f"aiperf {name}: {out.stdout[-2000:]}{out.stderr[-2000:]}")
                    return
        finally:
            done.set()

    generator = threading.Thread(target=generate, daemon=True)
    scrapes = [(time.time(), scrape(url))]
    generator.start()
    while not done.is_set():
        done.wait(WINDOW_S)
        scrapes.append((time.time(), scrape(url)))
    time.sleep(WINDOW_S)
    scrapes.append((time.time(), scrape(url)))
    generator.join()
    assert not failures, failures[0]
    return scrapes


def _inner(run: Run, phase: Phase) -> tuple[int, int]:
    """The first and last scrape inside the phase (see the module docstring)."""
    idx = [i for i, (t, _) in enumerate(run.scrapes) if phase.first_start_s + SETTLE_S <= t <= phase.last_start_s]
    assert len(idx) >= 2, f"phase {phase.name}: fewer than two scrapes inside it ({len(run.scrapes)} in all)"
    return idx[0], idx[-1]


def _window(run: Run, i: int, j: int) -> tuple[LiveTraffic, float, float]:
    (t0, c0), (t1, c1) = run.scrapes[i], run.scrapes[j]
    return live_traffic(c1.minus(c0, source=run.url), t1 - t0, (run.url,)), t0, t1


@needs_envs
@pytest.mark.parametrize("phase_index", [0, 1])
def test_the_workload_matches_what_aiperf_sent(run: Run, phase_index: int) -> None:
    phase = run.phases[phase_index]
    i, j = _inner(run, phase)
    live, t0, t1 = _window(run, i, j)
    assert live.increase is not None
    inc = live.increase
    print(f"\n{phase.name}: window {t1 - t0:.1f} s, {live.requests:.0f} finished, {live.arrival_rps:.4f} req/s "
          f"arrived vs AIPerf's {phase.arrival_rps:.4f} sent ({live.arrival_rps / phase.arrival_rps - 1:+.2%}; its "
          f"request_throughput {phase.throughput_rps:.4f}); "
          f"input mean {inc.prompt_tokens.mean:.1f}, output mean {inc.generation_tokens.mean:.1f}, prefix hits "
          f"{live.prefix_hit_share:.1%}")
    # the rate: what AIPerf sent at (constant arrivals), within 5 %
    assert live.arrival_rps == pytest.approx(phase.arrival_rps, rel=0.05), (live.arrival_rps, phase.arrival_rps)
    # the lengths, bucket by bucket: the requests AIPerf saw finish in the window (its clock is the client's, so
    # a request finishing at a window's edge may fall on the other side: at most one per edge and side)
    sent = [(inp, out) for end, inp, out in phase.requests if t0 < end <= t1]
    for side, hist, lengths in ((0, live.increase.prompt_tokens, live.workload.input_tokens),
                                (1, live.increase.generation_tokens, live.workload.output_tokens)):
        for lo, hi, count in hist.bins:
            generated = sum(1 for r in sent if lo < r[side] <= hi)
            assert abs(count - generated) <= 2, (phase.name, side, lo, hi, count, generated)
            built = sum(w for tokens, w in lengths.bins if lo < tokens <= hi)
            assert built == count  # the workload keeps vLLM's bucket counts, at a length inside each bucket
        mean_sent = sum(r[side] for r in sent) / len(sent)
        assert hist.mean == pytest.approx(mean_sent, rel=0.05)
    if phase.name == "chat":
        assert live.prefix_hit_share > 0.3  # the shared 128-token prefix of every prompt
    else:
        assert live.prefix_hit_share < 0.05


@needs_envs
def test_the_watch_fires_once_on_the_phase_change(run: Run) -> None:
    target = WatchTarget(deployment="TP1", serve_flags="--max-num-seqs 8",
                         advice=WatchAdviceRequest(model_path=str(run.model_dir), hardware="cpu", max_gpus=2,
                                              max_ttft_ms=None, max_itl_ms=None),
                         thresholds=Thresholds())
    state = WatchState()
    ticks = []
    for (t0, c0), (t1, c1) in zip(run.scrapes, run.scrapes[1:], strict=False):
        result = tick(target, state, c1.minus(c0, source=run.url), t1 - t0, (run.url,))
        state = result.state
        ticks.append((t1, result))
    kinds = [r.kind for _, r in ticks]
    print(f"\nwatch periods: {' '.join(kinds)}")
    fired = [(t, r) for t, r in ticks if r.fired]
    assert len(fired) == 1, kinds
    at, advice = fired[0]
    assert at > run.phases[1].first_start_s, (kinds, at, run.phases[1].first_start_s)
    assert any("input length" in reason for reason in advice.reasons), advice.reasons
    assert "baseline" in kinds[: kinds.index("advice")]


@needs_envs
def test_prometheus_gives_the_same_workload(run: Run) -> None:
    if run.prometheus is None:
        pytest.skip("no prometheus binary on PATH (Debian: apt-get install prometheus; `make prometheus`)")
    phase = run.phases[0]
    i, j = _inner(run, phase)
    direct, t0, t1 = _window(run, i, j)
    via = traffic_from_prometheus(run.prometheus, '{job="vllm"}', t1 - t0, at=t1)
    print(f"\nprometheus vs two scrapes: {via.arrival_rps:.4f} vs {direct.arrival_rps:.4f} req/s, input mean "
          f"{via.workload.input_tokens.expected:.1f} vs {direct.workload.input_tokens.expected:.1f}, output mean "
          f"{via.workload.output_tokens.expected:.1f} vs {direct.workload.output_tokens.expected:.1f}, prefix "
          f"{via.prefix_hit_share:.3f} vs {direct.prefix_hit_share:.3f}")
    # increase() extrapolates to the range's ends from 1 s scrapes: the counts differ by about a second's worth
    assert via.arrival_rps == pytest.approx(direct.arrival_rps, rel=0.05)
    # the lengths: the requests that finished between the first and the last sample increase() read (its
    # extrapolation scales a histogram's sum and count alike, so its mean is theirs), against AIPerf's own lengths
    # of those requests; a request finishing within EDGE_S of a sample may fall on either side of it (the client's
    # clock and the scrape's)
    first_s, last_s = _prometheus_samples(run.prometheus, '{job="vllm"}', t1 - t0, t1)
    assert via.increase is not None
    for side, hist in ((1, via.increase.prompt_tokens), (2, via.increase.generation_tokens)):
        low, high = _mean_bounds([r[side] for r in phase.requests if first_s + EDGE_S < r[0] <= last_s - EDGE_S],
                                 [r[side] for r in phase.requests
                                  if abs(r[0] - first_s) <= EDGE_S or abs(r[0] - last_s) <= EDGE_S])
        assert low * (1 - 1e-9) <= hist.mean <= high * (1 + 1e-9), (side, hist.mean, low, high)
    assert via.prefix_hit_share == pytest.approx(direct.prefix_hit_share, abs=0.03)
    assert via.models == ("tiny",)
    assert not math.isnan(via.ttft.p50_ms)


EDGE_S = 1.0


def _prometheus_samples(base: str, selector: str, range_s: float, at: float) -> tuple[float, float]:
    """The first and last sample times of vLLM's finished-request counter in the range increase() reads."""
    query = urllib.parse.urlencode({"query": f"vllm:request_success_total{selector}[{round(range_s)}s]", "time": at})
    data = json.loads(urllib.request.urlopen(f"{base}/api/v1/query?{query}", timeout=10).read())
    stamps = [float(t) for series in data["data"]["result"] for t, _ in series["values"]]
    return min(stamps), max(stamps)


def _mean_bounds(core: list[int], either: list[int]) -> tuple[float, float]:
    """The lowest and highest mean of `core` plus any subset of `either` (the k smallest, or largest, extremise
    it for each k)."""
    ranked = sorted(either)
    means = [(sum(core) + sum(extra)) / (len(core) + len(extra))
             for k in range(len(ranked) + 1) for extra in (ranked[:k], ranked[len(ranked) - k:]) if core or extra]
    return min(means), max(means)


@needs_envs
def test_the_services_watch_fires_once_on_the_phase_change(run: Run) -> None:
    """The service's own timer, watching the same server through the run: one advice, after the change."""
    kinds = [e["kind"] for e in reversed(run.service_history)]
    print(f"\nservice watch periods: {' '.join(kinds)}")
    advice = [e for e in run.service_history if e["kind"] == "advice"]
    assert len(advice) == 1, kinds
    (event,) = advice
    at = datetime.fromisoformat(event["at"])
    when = (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).timestamp()  # SQLite keeps naive UTC
    assert when > run.phases[1].first_start_s, kinds
    assert "vllm serve" in event["detail"]["advice"]["commands"]
    assert "baseline" in kinds[: kinds.index("advice")]


@needs_envs
def test_calibration_check_of_the_cpu_server(run: Run, tmp_path: Path) -> None:
    """The measured TTFT and ITL of each phase against the model's prediction for TP1 on the CPU entry of the GPU
    catalog, recorded as a measured run: the factors are printed (the CPU is far from a GPU roofline)."""
    spec = load_model(run.model_dir)
    gpu = get_gpu("cpu")
    perf = RooflineModel(spec, gpu, default_calibration(gpu.name))
    store = ClusterStore(f"sqlite:///{tmp_path / 'cluster.db'}")
    key = ClusterKey.of(gpu, "0.32.0")
    for phase in run.phases:
        live, _, t1 = _window(run, *_inner(run, phase))
        check = check_deployment(perf, parse_deployment("TP1", max_num_seqs=8), live)
        ttft, itl = check.factor("ttft"), check.factor("itl")
        assert check.prediction.saturated is None and ttft is not None and itl is not None
        print(f"\n{phase.name}: TTFT {check.measured_ttft.mean_ms:.1f} ms measured / "
              f"{check.prediction.ttft.mean_ms if check.prediction.ttft else 0:.1f} predicted = {ttft:.3g}x; ITL "
              f"{check.measured_itl.mean_ms:.2f} / {check.prediction.itl.mean_ms if check.prediction.itl else 0:.2f} "
              f"= {itl:.3g}x")
        record_window(check, store, key, model_name=spec.name, model_path=str(run.model_dir), label=phase.name,
                      at_s=t1)
    runs = store.read_runs(key)
    assert [r.study for r in runs] == ["live:chat", "live:summarise"]
    assert runs[1].points[0].request_throughput_rps == pytest.approx(run.phases[1].arrival_rps, rel=0.05)
