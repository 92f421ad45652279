"""Reading a running deployment's traffic over HTTP: two scrapes of vLLM's /metrics, or Prometheus's increase().

The only I/O of the live-traffic path (tuner.workload._metrics is pure): bounded reads with timeouts, http(s) only,
every failure a MetricsError naming the URL and the fix.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from tuner.workload._metrics import (
    COUNTERS,
    FAILED_REASONS,
    GENERATION_TOKENS,
    HISTOGRAMS,
    IN_FLIGHT,
    ITL_SECONDS,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    REQUEST_ITL_SECONDS,
    REQUEST_SUCCESS,
    TTFT_SECONDS,
    Histogram,
    LiveTraffic,
    MetricsError,
    VllmCounters,
    live_traffic,
    parse_exposition,
    sum_counters,
)

MAX_RESPONSE_BYTES = 32 * 2**20  # a vLLM /metrics page is ~50 KB per engine; a Prometheus answer here is small
DEFAULT_TIMEOUT_S = 10.0
MAX_WINDOW_S = 7 * 86400.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str, option: str) -> float:
    """'10m', '90s', '1h', '2d' or plain seconds; a window of at least one second and at most a week."""
    match = _DURATION.match(text)
    seconds = float(match[1]) * _UNIT_S[match[2]] if match else math.nan
    if not (1.0 <= seconds <= MAX_WINDOW_S):
        raise MetricsError(f"cannot read {text!r} as a window of 1 s to 7 d", field=option,
                           fix="give a duration such as 90s, 10m or 1h")
    return seconds


def metrics_url(url: str) -> str:
    """The URL to scrape: http(s) only; a bare host:port gets vLLM's /metrics path."""
    try:
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        parts.port  # noqa: B018 - a port that is not a number raises here, not at the first scrape
    except ValueError:  # an unbalanced IPv6 bracket, a bad port
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise MetricsError(f"{url!r} is not an http(s) URL", field="--from-metrics",
                           fix="give the server's metrics URL, e.g. http://10.0.0.5:8000/metrics")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def fetch_text(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = MAX_RESPONSE_BYTES,
               field: str = "--from-metrics") -> str:
    """GET `url` and return its body as text; at most `max_bytes`, `timeout_s` per connect and read."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain, application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        raise MetricsError(f"{url} answered HTTP {exc.code} ({exc.reason})", field=field,
                           fix="check the path: vLLM serves /metrics on its API port") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise MetricsError(f"cannot reach {url} ({reason})", field=field,
                           fix="check the host and port, and that the server is up and reachable from here") from None
    if len(body) > max_bytes:
        raise MetricsError(f"{url} answered more than {max_bytes // 2**20} MiB", field=field,
                           fix="give a vLLM /metrics URL (a few hundred KB at most)")
    return body.decode("utf-8", errors="replace")


def scrape(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> VllmCounters:
    """One scrape of one vLLM server."""
    url = metrics_url(url)
    return parse_exposition(fetch_text(url, timeout_s=timeout_s), url)


def traffic_from_servers(urls: list[str], window_s: float, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         sleep: Callable[[float], None] = time.sleep,
                         clock: Callable[[], float] = time.monotonic) -> LiveTraffic:
    """Scrape every server, wait `window_s`, scrape again: the deployment's traffic in between (its servers'
    increases summed, each over its own measured interval)."""
    if not urls:
        raise MetricsError("no URL given", field="--from-metrics", fix="give one or more vLLM /metrics URLs")
    targets = [metrics_url(u) for u in urls]
    first = {u: (clock(), scrape(u, timeout_s=timeout_s)) for u in targets}
    sleep(window_s)
    increases = []
    elapsed = []
    for url in targets:
        then, before = first[url]
        after = scrape(url, timeout_s=timeout_s)
        elapsed.append(clock() - then)
        increases.append((url, after.minus(before, source=url)))
    # The servers were scraped one after the other; their intervals differ by the scrape time only.
    return live_traffic(sum_counters(increases), sum(elapsed) / len(elapsed), tuple(targets))


# -- Prometheus's HTTP API ------------------------------------------------------------------------------------------
_SELECTOR = re.compile(r'^\s*\{?\s*((?:[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*,?\s*)*)\}?\s*$')


def _matchers(selector: str) -> str:
    """The label matchers of `selector` ('{job="vllm"}', 'job="vllm",namespace="prod"' or ''), without braces."""
    match = _SELECTOR.match(selector)
    if match is None:
        raise MetricsError(f"cannot read {selector!r} as label matchers", field="--query",
                           fix='give label matchers only, e.g. \'{job="vllm",namespace="prod"}\' (no metric name)')
    return match[1].strip().rstrip(",")


class PrometheusApi:
    """Instant queries against Prometheus's /api/v1/query (bounded reads, as fetch_text)."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise MetricsError(f"{url!r} is not an http(s) URL", field="--from-prometheus",
                               fix="give Prometheus's base URL, e.g. http://prometheus:9090")
        self.base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.timeout_s = timeout_s

    def query(self, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
        url = f"{self.base}/api/v1/query?{urllib.parse.urlencode(params)}"
        text = fetch_text(url, timeout_s=self.timeout_s, field="--from-prometheus")
        try:
            answer = json.loads(text)
        except json.JSONDecodeError:
            raise MetricsError(f"{self.base} did not answer Prometheus's JSON", field="--from-prometheus",
                               fix="give Prometheus's base URL (its /api/v1/query answers JSON)") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            error = answer.get("error", "unknown error") if isinstance(answer, dict) else "not an object"
            raise MetricsError(f"Prometheus refused {promql!r}: {error}", field="--query",
                               fix="check the label matchers")
        data = answer.get("data") or {}
        if data.get("resultType") != "vector":
            raise MetricsError(f"{self.base} answered a {data.get('resultType')!r}, not a vector",
                               field="--from-prometheus", fix="give Prometheus's base URL")
        out = []
        for item in data.get("result") or []:
            value = float(item["value"][1])
            out.append((dict(item.get("metric") or {}), value if math.isfinite(value) else 0.0))
        return out


def traffic_from_prometheus(url: str, selector: str, range_s: float, *, at: float | None = None,
                            timeout_s: float = DEFAULT_TIMEOUT_S) -> LiveTraffic:
    """The same window from Prometheus: increase() of each series over `range_s` (it handles counter resets),
    summed over every series the matchers select (engines, servers)."""
    api = PrometheusApi(url, timeout_s=timeout_s)
    matchers = _matchers(selector)
    end = time.time() if at is None else at
    window = f"{round(range_s)}s"

    def increase(series: str, by: str = "") -> list[tuple[dict[str, str], float]]:
        grouping = f" by ({by})" if by else ""
        return api.query(f"sum{grouping}(increase({series}{{{matchers}}}[{window}]))", end)

    def scalar(series: str) -> float:
        return sum(v for _, v in increase(series))

    def histogram(name: str) -> Histogram | None:
        rows = increase(f"{name}_bucket", "le")
        if not rows:
            return None
        by_le = sorted((float(labels.get("le", "nan")), v) for labels, v in rows)
        if not math.isinf(by_le[-1][0]):
            raise MetricsError(f"{name}_bucket has no +Inf bucket in Prometheus", field="--query",
                               fix="select whole vLLM series (do not match on le)")
        return Histogram(tuple(le for le, _ in by_le), tuple(v for _, v in by_le), scalar(f"{name}_sum"),
                         scalar(f"{name}_count"))

    success = increase(f"{REQUEST_SUCCESS}_total", "finished_reason")
    if not success:
        raise MetricsError(f"Prometheus at {api.base} has no {REQUEST_SUCCESS}_total series matching "
                           f"{{{matchers}}} over {window}", field="--query",
                           fix="check the matchers (e.g. {job=\"vllm\"}) and that Prometheus scrapes the vLLM servers")
    hists = {name: histogram(name) for name in HISTOGRAMS}
    missing = [n for n in (PROMPT_TOKENS, GENERATION_TOKENS, TTFT_SECONDS, ITL_SECONDS) if hists[n] is None]
    if missing:
        raise MetricsError(f"Prometheus has no {', '.join(missing)} matching {{{matchers}}}", field="--query",
                           fix="select the vLLM servers' series (they export these histograms unless started with "
                               "--disable-log-stats)")
    models = tuple(sorted({labels["model_name"] for labels, _ in api.query(
        f"count by (model_name)({REQUEST_SUCCESS}_total{{{matchers}}})", end) if "model_name" in labels}))

    def in_flight(when: float) -> float:
        return sum(v for name in IN_FLIGHT for _, v in api.query(f"sum({name}{{{matchers}}})", when))

    counters = {name: scalar(f"{name}_total") for name in COUNTERS if name != REQUEST_SUCCESS}
    increase_all = VllmCounters(
        prompt_tokens=hists[PROMPT_TOKENS], generation_tokens=hists[GENERATION_TOKENS],  # type: ignore[arg-type]
        ttft_s=hists[TTFT_SECONDS], itl_s=hists[ITL_SECONDS], request_itl_s=hists[REQUEST_ITL_SECONDS],  # type: ignore[arg-type]
        finished=sum(v for _, v in success),
        failed=sum(v for labels, v in success if labels.get("finished_reason") in FAILED_REASONS),
        prefix_queries=counters[PREFIX_QUERIES], prefix_hits=counters[PREFIX_HITS], preemptions=counters[PREEMPTIONS],
        in_flight=in_flight(end) - in_flight(end - range_s), models=models)
    return live_traffic(increase_all, range_s, (f"{api.base} {{{matchers}}}",))
