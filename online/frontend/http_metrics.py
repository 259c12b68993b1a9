"""Per-route HTTP metrics for the front end's ``/metrics``.

``ps_bridge.metrics.Registry`` renders metrics in registration order, and a metric created
lazily for a new (route, status) would land away from its family, which the Prometheus
text format forbids. So each family here is one registered object that renders all of
its labelled children together.
"""
from __future__ import annotations

import bisect
import threading
import time
from typing import Any

from ps_bridge.metrics import DEFAULT_BUCKETS, Registry


class _Family:
    kind = "untyped"

    def __init__(self, name: str, help_text: str):
        self.name, self.help, self.labels = name, help_text, {}
        self._lock = threading.Lock()


class CounterFamily(_Family):
    kind = "counter"

    def __init__(self, name: str, help_text: str):
        super().__init__(name, help_text)
        self._values: dict[tuple[tuple[str, str], ...], float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def samples(self):
        with self._lock:
            items = list(self._values.items())
        for key, value in items:
            yield self.name, {**self.labels, **dict(key)}, value


class HistogramFamily(_Family):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...] = DEFAULT_BUCKETS):
        super().__init__(name, help_text)
        self.buckets = tuple(sorted(buckets))
        self._children: dict[tuple[tuple[str, str], ...], list] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        i = bisect.bisect_left(self.buckets, value)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = [[0] * (len(self.buckets) + 1), 0.0, 0]
            child[0][i] += 1
            child[1] += value
            child[2] += 1

    def samples(self):
        with self._lock:
            items = [(k, (list(c[0]), c[1], c[2])) for k, c in self._children.items()]
        for key, (counts, total, count) in items:
            labels = {**self.labels, **dict(key)}
            running = 0
            for bound, n in zip(self.buckets, counts):
                running += n
                yield f"{self.name}_bucket", {**labels, "le": repr(float(bound))}, running
            yield f"{self.name}_bucket", {**labels, "le": "+Inf"}, count
            yield f"{self.name}_sum", labels, total
            yield f"{self.name}_count", labels, count


class HttpMetrics:
    """Requests and latency by route and status, and the count of unexpected errors."""

    def __init__(self, registry: Registry):
        self.requests = registry._add(CounterFamily("livevec_frontend_http_requests_total",
                                                    "HTTP requests by route, method and status"))
        self.latency = registry._add(HistogramFamily("livevec_frontend_http_request_seconds",
                                                     "HTTP request latency by route"))
        self.errors_500 = registry.counter("livevec_frontend_internal_errors_total",
                                           "requests that ended in an unexpected exception (a bug)")
        self.total = 0
        self.started = time.time()

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.total += 1
        self.requests.inc(route=route, method=method, status=str(status))
        self.latency.observe(seconds, route=route)

    def summary(self) -> dict[str, Any]:
        return {"requests": self.total, "internal_errors": int(self.errors_500.value)}
