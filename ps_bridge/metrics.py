"""Prometheus metrics without a client library: counters, gauges and histograms
rendered in the text exposition format (version 0.0.4).

Every long-running role owns one ``Registry``; processes without an aiohttp app serve it
with ``serve_http`` (a daemon thread on the metrics/health port the orchestrator probes).
"""
from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _labels_text(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{str(v)}"'.replace("\n", " ") for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, labels: dict[str, str] | None = None):
        self.name, self.help, self.labels = name, help_text, dict(labels or {})
        self._lock = threading.Lock()

    def samples(self) -> Iterable[tuple[str, dict[str, str], float]]:  # pragma: no cover - abstract
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, *a, fn: Callable[[], float] | None = None, **kw):   # fn: read when scraped
        super().__init__(*a, **kw)
        self.value, self._fn = 0.0, fn

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def samples(self):
        yield self.name, self.labels, (self._fn() if self._fn else self.value)


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, *a, fn: Callable[[], float] | None = None, **kw):
        super().__init__(*a, **kw)
        self.value = 0.0
        self._fn = fn

    def set(self, value: float) -> None:
        self.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def samples(self):
        yield self.name, self.labels, (self._fn() if self._fn else self.value)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, *a, buckets: tuple[float, ...] = DEFAULT_BUCKETS, **kw):
        super().__init__(*a, **kw)
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        with self._lock:
            self.counts[i] += 1
            self.sum += value
            self.count += 1

    def samples(self):
        running = 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            yield f"{self.name}_bucket", {**self.labels, "le": repr(float(bound))}, running
        yield f"{self.name}_bucket", {**self.labels, "le": "+Inf"}, self.count
        yield f"{self.name}_sum", self.labels, self.sum
        yield f"{self.name}_count", self.labels, self.count


class Registry:
    def __init__(self, const_labels: dict[str, str] | None = None):
        self.const_labels = dict(const_labels or {})
        self._metrics: list[_Metric] = []

    def _add(self, metric: _Metric):
        metric.labels = {**self.const_labels, **metric.labels}
        self._metrics.append(metric)
        return metric

    def counter(self, name: str, help_text: str, fn: Callable[[], float] | None = None, **labels: str) -> Counter:
        return self._add(Counter(name, help_text, labels, fn=fn))

    def gauge(self, name: str, help_text: str, fn: Callable[[], float] | None = None, **labels: str) -> Gauge:
        return self._add(Gauge(name, help_text, labels, fn=fn))

    def histogram(self, name: str, help_text: str, buckets: tuple[float, ...] = DEFAULT_BUCKETS,
                  **labels: str) -> Histogram:
        return self._add(Histogram(name, help_text, labels, buckets=buckets))

    def total(self, name: str) -> float:   # a metric's samples summed over their labels (0: none)
        return sum(v for m in self._metrics if m.name == name for s, _, v in m.samples() if s == name)

    def render(self) -> str:
        lines: list[str] = []
        seen: set[str] = set()
        for m in self._metrics:
            if m.name not in seen:
                seen.add(m.name)
                lines += [f"# HELP {m.name} {m.help}", f"# TYPE {m.name} {m.kind}"]
            for sample_name, labels, value in m.samples():
                lines.append(f"{sample_name}{_labels_text(labels)} {float(value)!r}")
        return "\n".join(lines) + "\n"


def serve_http(registry: Registry, host: str, port: int,
               ready: Callable[[], bool] = lambda: True) -> ThreadingHTTPServer:
    """Serve ``/metrics``, ``/health`` (alive) and ``/ready`` from a daemon thread.

    Returns the server; its ``server_address[1]`` is the bound port (useful with port 0).
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path.startswith("/metrics"):
                body, status, ctype = registry.render().encode(), 200, CONTENT_TYPE
            elif self.path.startswith("/health") or self.path.startswith("/healthz"):
                body, status, ctype = b'{"status":"ok"}', 200, "application/json"
            elif self.path.startswith("/ready"):
                ok = ready()
                body = b'{"ready":true}' if ok else b'{"ready":false}'
                status, ctype = (200 if ok else 503), "application/json"
            else:
                body, status, ctype = b'{"error":"not found"}', 404, "application/json"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # keep access logs out of the structured log
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
