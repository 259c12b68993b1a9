"""The per-token cost a worker and a server show on /metrics (``online.cluster.token_cost``): pure logic, a fake
clock and fake counters."""
from __future__ import annotations

import math

from online.cluster.token_cost import TokenCost, export
from ps_bridge.metrics import Registry


class Counters:
    def __init__(self):
        self.t, self.tokens, self.cpu, self.sent, self.received = 0.0, 0.0, 0.0, 0.0, 0.0

    def read(self):
        return self.tokens, self.cpu, self.sent, self.received

    def run(self, seconds: float, tokens: float, cpu: float, sent: float = 0.0, received: float = 0.0):
        self.t += seconds
        self.tokens += tokens
        self.cpu += cpu
        self.sent += sent
        self.received += received


def test_the_figures_are_the_counters_deltas_over_the_tokens():
    c = Counters()
    cost = TokenCost(c.read, window=60, step=1, clock=lambda: c.t)
    c.run(10, tokens=1_000_000, cpu=2.0, sent=80e6, received=90e6)
    cpu_us, sent, received = cost.per_token()
    assert math.isclose(cpu_us, 2.0) and math.isclose(sent, 80.0) and math.isclose(received, 90.0)


def test_no_token_in_the_window_is_nan_not_zero():
    c = Counters()
    cost = TokenCost(c.read, window=60, step=1, clock=lambda: c.t)
    assert all(math.isnan(x) for x in cost.per_token())   # one reading only
    c.run(30, tokens=0, cpu=0.5)
    assert all(math.isnan(x) for x in cost.per_token())   # idle: CPU but no token


def test_the_window_slides_and_forgets_what_came_before_it():
    c = Counters()
    cost = TokenCost(c.read, window=60, step=1, clock=lambda: c.t)
    for _ in range(10):           # 150 s at 1 µs per token, read every 15 s (a scrape interval)
        c.run(15, tokens=1_000_000, cpu=1.0)
        cost.per_token()
    for _ in range(8):            # then 120 s at 20 µs per token: after a minute only these count
        c.run(15, tokens=1_000_000, cpu=20.0)
        got = cost.per_token()[0]
    assert math.isclose(got, 20.0)
    # the span is the newest reading at least 60 s old to now: 60 s here (readings every 15 s)
    assert len(cost._readings) == 5


def test_the_window_covers_at_least_its_length():
    c = Counters()
    cost = TokenCost(c.read, window=60, step=1, clock=lambda: c.t)
    c.run(50, tokens=500, cpu=1.0)
    cost.per_token()
    c.run(20, tokens=100, cpu=1.0)   # the reading at 50 s is only 20 s old: the base stays the first one
    assert math.isclose(cost.per_token()[0], 1e6 * 2.0 / 600)
    c.run(100, tokens=100, cpu=3.0)  # both older than the window now: the base is the newest of them (70 s)
    assert math.isclose(cost.per_token()[0], 1e6 * 3.0 / 100)


def test_readings_closer_than_a_step_are_not_kept():
    c = Counters()
    cost = TokenCost(c.read, window=60, step=1, clock=lambda: c.t)
    for _ in range(1000):   # a scrape every 10 ms
        c.run(0.01, tokens=10, cpu=1e-5)
        cost.per_token()
    assert len(cost._readings) <= 12
    assert math.isclose(cost.per_token()[0], 1.0, rel_tol=1e-6)


def test_export_puts_the_cpu_counter_and_the_gauges_on_the_registry():
    r = Registry({"role": "worker"})
    sent = r.counter("pslite_sent_bytes_total", "payload bytes sent")
    tokens = r.counter("livevec_worker_tokens_total", "tokens read")
    cost = export(r, lambda: tokens.value)
    page = r.render()
    assert '# TYPE process_cpu_seconds_total counter' in page
    assert 'livevec_cpu_us_per_token{role="worker"} nan' in page   # nothing trained yet
    sum(i * i for i in range(200_000))   # some CPU
    tokens.inc(1000)
    sent.inc(50_000)
    cost._readings[0] = (cost._readings[0][0] - 2.0, *cost._readings[0][1:])   # the first reading 2 s ago
    cpu_us, per_sent, per_received = cost.per_token()
    assert cpu_us > 0 and math.isclose(per_sent, 50.0) and per_received == 0.0
    assert r.total("process_cpu_seconds_total") > 0
    assert f'livevec_pslite_sent_bytes_per_token{{role="worker"}} {per_sent!r}' in r.render()
