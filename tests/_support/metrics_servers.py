"""Loopback HTTP servers for the live-traffic tests: a /metrics page whose text the test changes, and a server
answering Prometheus's /api/v1/query (JSON format of its HTTP API) for the queries tuner.workload sends, computed
from two real vLLM expositions (the increase between them). 127.0.0.1 only."""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from prometheus_client.parser import text_string_to_metric_families

from tuner.workload import VllmCounters
from tuner.workload._metrics import (
    GENERATION_TOKENS,
    ITL_SECONDS,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    REQUEST_ITL_SECONDS,
    REQUEST_SUCCESS,
    TTFT_SECONDS,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_metrics"


def exposition(name: str) -> str:
    return (DATA / name).read_text()


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def reply(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _MetricsHandler(_Handler):
    def do_GET(self) -> None:
        owner: MetricsPage = self.server.owner  # type: ignore[attr-defined]
        if urlsplit(self.path).path != "/metrics":
            self.send_error(404)
            return
        self.reply(owner.next_body().encode(), "text/plain; version=0.0.4")


class MetricsPage(_Server):
    """Serves `bodies` in turn, one per scrape (the last one again once they run out)."""

    def __init__(self, *bodies: str) -> None:
        super().__init__(_MetricsHandler)
        self.bodies = list(bodies)
        self.scrapes = 0
        self._lock = threading.Lock()

    def next_body(self) -> str:
        with self._lock:
            body = self.bodies[min(self.scrapes, len(self.bodies) - 1)]
            self.scrapes += 1
            return body


def render(c: VllmCounters, model: str = "tiny") -> str:
    """vLLM-shaped exposition text of `c` (one engine): the series and labels vLLM's PrometheusStatLogger writes,
    so a test can serve cumulative counters built from real windows (after + increase)."""
    labels = f'engine="0",model_name="{model}"'
    lines: list[str] = []
    for name, h in ((PROMPT_TOKENS, c.prompt_tokens), (GENERATION_TOKENS, c.generation_tokens),
                    (TTFT_SECONDS, c.ttft_s), (ITL_SECONDS, c.itl_s), (REQUEST_ITL_SECONDS, c.request_itl_s)):
        if h is None:
            continue
        lines.append(f"# TYPE {name} histogram")
        for le, cum in zip(h.bounds, h.cumulative, strict=True):
            bound = "+Inf" if le == float("inf") else repr(float(le))
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {cum!r}')
        lines += [f"{name}_count{{{labels}}} {h.count!r}", f"{name}_sum{{{labels}}} {h.total!r}"]
    lines += [f"# TYPE {REQUEST_SUCCESS}_total counter",
              f'{REQUEST_SUCCESS}_total{{{labels},finished_reason="length"}} {c.finished - c.failed!r}',
              f'{REQUEST_SUCCESS}_total{{{labels},finished_reason="abort"}} {c.failed!r}']
    for name, value in ((PREFIX_QUERIES, c.prefix_queries), (PREFIX_HITS, c.prefix_hits), (PREEMPTIONS, c.preemptions)):
        lines += [f"# TYPE {name}_total counter", f"{name}_total{{{labels}}} {value!r}"]
    return "\n".join(lines) + "\n"


def cumulative(start: VllmCounters, *windows: VllmCounters) -> list[str]:
    """The scrapes of a server that starts at `start` and then serves each window's increase in turn."""
    texts, now = [render(start)], start
    for w in windows:
        now = now.plus(w, source="test")
        texts.append(render(now))
    return texts


# -- Prometheus's query API over two expositions -----------------------------------------------------------------
_QUERY = re.compile(r"^(?P<agg>sum|count)(?: by \((?P<by>[a-z_]+)\))?\((?:increase\()?(?P<series>[a-zA-Z_:]+)"
                    r"\{(?P<matchers>[^}]*)\}(?:\[(?P<window>\d+)s\]\))?\)$")


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def _matches(labels: dict[str, str], matchers: str) -> bool:
    return all(labels.get(name) == value for name, value in re.findall(r'([a-zA-Z_]+)="([^"]*)"', matchers))


class _PromHandler(_Handler):
    def do_GET(self) -> None:
        owner: PrometheusAnswers = self.server.owner  # type: ignore[attr-defined]
        parts = urlsplit(self.path)
        if parts.path != "/api/v1/query":
            self.send_error(404)
            return
        params = parse_qs(parts.query)
        query = params.get("query", [""])[0]
        owner.queries.append(query)
        self.reply(json.dumps(owner.answer(query, float(params.get("time", ["inf"])[0]))).encode(), "application/json")


class PrometheusAnswers(_Server):
    """/api/v1/query answering `sum [by (l)](increase(S{m}[Ns]))` and `count by (l)(S{m})` from the increase between
    two real expositions (what Prometheus would answer over a window spanning the two scrapes), and `sum(G{m})` of a
    gauge from the exposition at the query's time (`before` until `split_at`, `after` from then)."""

    def __init__(self, before: str, after: str, *, split_at: float = 0.0) -> None:
        super().__init__(_PromHandler)
        self.before = {(n, tuple(sorted(labels.items()))): v for n, labels, v in _samples(before)}
        self.before_samples = _samples(before)
        self.after = _samples(after)
        self.split_at = split_at
        self.queries: list[str] = []

    def answer(self, query: str, at: float = math.inf) -> dict[str, object]:
        match = _QUERY.match(query)
        if match is None:
            return {"status": "error", "errorType": "bad_data", "error": f"parse error in {query!r}"}
        groups: dict[str, float] = {}
        raw = match["window"] is None and match["agg"] == "sum"
        for name, labels, value in (self.before_samples if raw and at < self.split_at else self.after):
            if name != match["series"] or not _matches(labels, match["matchers"]):
                continue
            key = labels.get(match["by"] or "", "")
            if match["agg"] == "count":
                groups[key] = groups.get(key, 0.0) + 1
            elif raw:
                groups[key] = groups.get(key, 0.0) + value
            else:
                groups[key] = groups.get(key, 0.0) + value - self.before.get((name, tuple(sorted(labels.items()))), 0)
        result = [{"metric": {match["by"]: k} if match["by"] else {}, "value": [1.0, repr(v)]}
                  for k, v in groups.items()]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}


@contextmanager
def serving(server: _Server) -> Iterator[str]:
    with server:
        yield server.url
