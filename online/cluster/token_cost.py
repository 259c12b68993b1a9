"""What one process spends per trained token, on its ``/metrics``: CPU and ps-lite bytes over the last minute.

A worker divides by the tokens it trained (``livevec_worker_tokens_total``). A server divides by the word
occurrences counted on its shard (``livevec_server_tokens_total``): every worker sends the counts of the words it
reads to the shard that holds them, so the servers' counts add up to the cluster's tokens, and each server's
figure is its CPU over its share of them. The gauges show one process's figure at a glance; the cluster's, over
all roles and against the cluster's trained tokens, are the counters' rates in Prometheus
(``deploy/prometheus/livevec-rules.yml``, ``docs/operations.md#exchange-cost``).
"""
from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable

from ps_bridge.metrics import Registry

WINDOW_SECONDS = 60.0   # the span the gauges cover, at least (see TokenCost)
STEP_SECONDS = 1.0      # readings closer together than this are not kept

# (gauge, help) of the three figures, in the order of a reading's values after the tokens
FIGURES = (
    ("livevec_cpu_us_per_token",
     "CPU µs of this process (all its threads) per trained token over the last minute; NaN while it trained none"),
    ("livevec_pslite_sent_bytes_per_token",
     "ps-lite payload bytes this process sent per trained token over the last minute; NaN while it trained none"),
    ("livevec_pslite_received_bytes_per_token",
     "ps-lite payload bytes this process received per trained token over the last minute; NaN while it trained "
     "none"),
)


class TokenCost:
    """Per-token figures over a sliding window of readings.

    ``read()`` returns the counters now: (tokens, CPU seconds, bytes sent, bytes received). A reading is taken
    when asked for a figure and the last one is at least ``step`` s old, and one when made, so a first scrape after
    training has a base. The figures run from the newest reading at least ``window`` s old (the oldest while none
    is) to the latest: with scrapes every 15 s they cover 60 - 75 s, with rarer ones the time since the one before.
    No token trained between the two: NaN, since 0 CPU per token would read as free.
    """

    def __init__(self, read: Callable[[], tuple[float, float, float, float]], window: float = WINDOW_SECONDS,
                 step: float = STEP_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.read, self.window, self.step, self.clock = read, window, step, clock
        self._readings: collections.deque = collections.deque()
        self._lock = threading.Lock()   # scrapes run on the metrics server's threads
        self.update()

    def update(self) -> None:
        with self._lock:
            now = self.clock()
            if not self._readings or now - self._readings[-1][0] >= self.step:
                self._readings.append((now, *self.read()))
            while len(self._readings) > 2 and now - self._readings[1][0] >= self.window:
                self._readings.popleft()

    def per_token(self) -> tuple[float, float, float]:
        """(CPU µs, bytes sent, bytes received) per token over the window; NaNs when no token was trained."""
        self.update()
        with self._lock:
            (_, tokens0, *first), (_, tokens1, *last) = self._readings[0], self._readings[-1]
        tokens = tokens1 - tokens0
        if tokens <= 0:
            return math.nan, math.nan, math.nan
        cpu, sent, received = (b - a for a, b in zip(first, last))
        return 1e6 * cpu / tokens, sent / tokens, received / tokens


def process_cpu(registry: Registry) -> None:
    """``process_cpu_seconds_total`` on ``registry``, as Prometheus' client libraries name it."""
    registry.counter("process_cpu_seconds_total", "CPU seconds (user and system) of all of this process's threads",
                     fn=time.process_time)


def export(registry: Registry, tokens: Callable[[], float]) -> TokenCost:
    """Register on ``registry`` the process's CPU (``process_cpu``) and the three per-token gauges, counted
    against ``tokens()``; the ps-lite bytes are the node's ``pslite_sent_bytes_total`` and
    ``pslite_received_bytes_total`` on the same registry."""
    process_cpu(registry)
    cost = TokenCost(lambda: (tokens(), time.process_time(), registry.total("pslite_sent_bytes_total"),
                              registry.total("pslite_received_bytes_total")))
    for i, (name, help_text) in enumerate(FIGURES):
        registry.gauge(name, help_text, fn=lambda i=i: cost.per_token()[i])
    return cost
