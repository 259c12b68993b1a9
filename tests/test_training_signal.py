"""A cluster never trains garbage silently: the workers' training signal and its alert.

In process: the signal tells a healthy trainer from one with an absurd learning rate, and an overflowed model is
exported as +Inf (never NaN, which no alert bound catches). End to end: two real clusters read one real Kafka
topic, one with ``LIVEVEC_ETA=1000`` and one with the default; their workers' ``/metrics`` are scraped and
promtool evaluates ``LivevecTrainingDiverging`` of deploy/prometheus/livevec-rules.yml on what was scraped: it
fires for the first and not for the second.
"""
from __future__ import annotations

import asyncio
import math
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import orjson
import pytest
import yaml
from aiohttp.test_utils import TestServer

from online.cluster import ps_commands as pc
from online.cluster.training_signal import HOT_ROW_NORM_BOUND, TrainingSignal, summarise_reports
from online.frontend.app import create_app
from online.frontend.ps_source import ParameterServerSource
from online.frontend.settings import FrontendSettings
from online.frontend.synthetic import SyntheticSource
from online.learner.trainer import LearnerConfig, Trainer
from online.stream.producer import produce
from online.stream.sample_corpus import generate_lines
from ps_bridge.metrics import Registry
from tests.cluster_harness import Cluster, wait_until

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "prometheus" / "livevec-rules.yml"
ALERT = "LivevecTrainingDiverging"


def _trained(eta: float, optimizer: str = "rowadagrad", lines: int = 3000) -> tuple[TrainingSignal, Registry]:
    trainer = Trainer(LearnerConfig(dim=16, min_count=2, eta=eta, optimizer=optimizer))
    registry = Registry()
    signal = TrainingSignal(registry, trainer.vocab, trainer.store.local_shard())
    text = generate_lines(lines, seed=3)
    for i in range(0, len(text), 200):
        signal.record(trainer.train_records(text[i:i + 200]))
    signal.measure()
    return signal, registry


def _samples(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` of a /metrics page (labels as rendered)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


# ----------------------------------------------------------------------------- in process
def test_the_signal_tells_an_absurd_learning_rate_from_a_healthy_one():
    healthy, _ = _trained(0.1)
    diverged, registry = _trained(1000.0)
    h, d = healthy.report(), diverged.report()
    assert 1.0 < h["loss"] < 4.5, h
    for kind in ("input", "output"):
        assert 0.5 < h["hot_rows"][kind]["mean"] < 5.0, h
        assert d["hot_rows"][kind]["mean"] > 10 * HOT_ROW_NORM_BOUND, d
    assert h["hot_rows"]["words"] == 100 and h["nonfinite_batches"] == 0 and h["hot_rows"]["nonfinite"] == 0
    assert d["loss"] > 100 * h["loss"], (h, d)
    scraped = _samples(registry.render())
    assert math.isclose(scraped['livevec_worker_hot_row_norm{kind="output",stat="mean"}'],
                        d["hot_rows"]["output"]["mean"], rel_tol=1e-4)
    ratio = scraped["livevec_worker_training_loss_sum_total"] / scraped["livevec_worker_training_loss_pairs_total"]
    assert ratio > 1000


def test_an_overflowed_model_is_exported_as_infinite_not_nan():
    # constant-rate SGD at 2 overflows in its first batch: every row and loss is NaN
    signal, registry = _trained(2.0, optimizer="sgd", lines=400)
    values = _samples(registry.render())
    assert all(v == math.inf for k, v in values.items() if k.startswith("livevec_worker_hot_row_norm")), values
    assert values["livevec_worker_training_loss"] == math.inf
    assert values["livevec_worker_training_loss_sum_total"] == 0.0   # the counters keep out what is not finite
    report = signal.report()   # JSON has no infinity: None, and counted
    assert report["loss"] is None and report["nonfinite_batches"] > 0
    assert report["hot_rows"]["input"]["mean"] is None and report["hot_rows"]["nonfinite"] > 0
    cluster = summarise_reports([{"node": 9, "training": report}])
    assert cluster["diverging"] and cluster["nonfinite_rows"] > 0


def test_a_signal_not_measured_yet_is_nan_and_no_alert_bound_catches_it():
    registry = Registry()
    TrainingSignal(registry, vocab=None, shard=None)
    values = _samples(registry.render())
    assert math.isnan(values["livevec_worker_training_loss"])
    assert all(math.isnan(v) for k, v in values.items() if k.startswith("livevec_worker_hot_row_norm"))


def test_the_cluster_summary_weighs_the_loss_and_shows_the_worst_worker():
    def report(loss, pairs, mean_in, mean_out):
        return {"loss": loss, "loss_pairs": pairs, "nonfinite_batches": 0, "window_seconds": 30.0,
                "hot_rows": {"words": 100, "nonfinite": 0, "input": {"mean": mean_in, "max": 2 * mean_in},
                             "output": {"mean": mean_out, "max": 2 * mean_out}}}
    healthy = summarise_reports([{"node": 11, "training": report(2.0, 300, 2.0, 3.0)},
                                 {"node": 9, "training": report(3.0, 100, 2.5, 2.0)},
                                 {"node": 13, "lag": 0}])   # a worker of an older version: no signal
    assert healthy["loss"] == pytest.approx(2.25) and healthy["loss_pairs"] == 400
    assert healthy["hot_row_norm"] == {"input": {"mean": 2.5, "max": 5.0}, "output": {"mean": 3.0, "max": 6.0}}
    assert not healthy["diverging"] and [w["node"] for w in healthy["workers"]] == [9, 11]
    one_bad = summarise_reports([{"node": 9, "training": report(2.0, 300, 2.0, 3.0)},
                                 {"node": 11, "training": report(2.0, 300, 2.0, HOT_ROW_NORM_BOUND + 1)}])
    assert one_bad["diverging"] and one_bad["hot_row_norm"]["output"]["mean"] == HOT_ROW_NORM_BOUND + 1
    assert summarise_reports([{"node": 9, "lag": 3}]) is None


def test_the_alert_and_the_page_use_the_same_bound():
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r.get("alert") == ALERT)
    bound = re.search(r'livevec_worker_hot_row_norm\{stat="mean"\}\)\s*>\s*([\d.]+)', rule["expr"])
    assert bound and float(bound.group(1)) == HOT_ROW_NORM_BOUND, rule["expr"]


# ----------------------------------------------------------------------------- the front end
def _report(loss: float, mean: float, nonfinite: int = 0) -> dict:
    return {"loss": loss, "loss_pairs": 500, "nonfinite_batches": 0, "window_seconds": 30.0,
            "hot_rows": {"words": 100, "nonfinite": nonfinite, "input": {"mean": mean, "max": 3 * mean},
                         "output": {"mean": mean, "max": 3 * mean}}}


class _Servers(ParameterServerSource):
    """A ps source whose servers answer ``HEAD_STATS`` with these bodies (no cluster to join)."""

    def __init__(self, answers: dict[int, dict]):
        self._answers, self._rate = answers, None

    def _worker(self):
        return SimpleNamespace(po=SimpleNamespace(server_ids=lambda: sorted(self._answers)))

    async def _ask(self, head: int, body: bytes, server_id: int) -> bytes:
        assert head == pc.HEAD_STATS
        return orjson.dumps(self._answers[server_id])


async def test_the_ps_source_summarises_the_reports_server_0_passes_on():
    base = {"workers_reporting": 2, "kafka_lag": 0, "workers_words_per_second": 1.0, "words": 10, "rows": 20}
    reports = [{"node": 9, "lag": 0, "training": _report(2.5, 3.0)},
               {"node": 11, "lag": 0, "training": _report(700.0, 80.0)}]
    stats = await _Servers({8: {**base, "worker_reports": reports}, 10: base}).stats()
    training = stats["training"]
    assert training["diverging"] and training["hot_row_norm"]["input"]["mean"] == 80.0
    assert [w["node"] for w in training["workers"]] == [9, 11]
    assert training["loss"] == pytest.approx((2.5 + 700.0) / 2)
    assert (await _Servers({8: base, 10: base}).stats())["training"] is None   # servers without the reports


class _Diverging(SyntheticSource):
    async def stats(self):
        return {**await super().stats(), "training": summarise_reports([{"node": 9, "training": _report(9e5, 400.0)}])}


@pytest.mark.parametrize("source, diverging", [(SyntheticSource, False), (_Diverging, True)])
async def test_v1_stats_carries_the_signal_to_the_page(source, diverging):
    settings = FrontendSettings(source="in-process", sync_interval=0.05, stats_interval=0.1).validate()
    server = TestServer(create_app(settings, source(n=300, dim=8)), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                async with session.get(server.make_url("/v1/stats")) as r:
                    body = await r.json()
                if body["training"] is not None:
                    break
                await asyncio.sleep(0.05)
    finally:
        await server.close()
    training = body["training"]
    assert training["diverging"] is diverging and training["hot_row_norm_bound"] == HOT_ROW_NORM_BOUND
    assert body["source"]["training"] == training
    assert (training["hot_row_norm"]["output"]["mean"] > HOT_ROW_NORM_BOUND) is diverging


# ----------------------------------------------------------------------------- end to end
SIGNAL_METRICS = ("livevec_worker_hot_row_norm", "livevec_worker_training_loss_sum_total",
                  "livevec_worker_training_loss_pairs_total")
RECORDS = 150          # produced: 3,000 lines, 20 a record
PROGRESS = ("livevec_stream_records_total", "livevec_worker_inflight_batches")
REPORT_INTERVAL = 2.0  # a worker measures its hot rows this often (WorkerSettings.report_interval)


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The signal's samples, and the worker's progress, on its /metrics: ``{(name, labels): value}``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) in (*SIGNAL_METRICS, *PROGRESS):
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def _measured(samples) -> bool:
    norms = [v for (name, _), v in samples.items() if name == "livevec_worker_hot_row_norm"]
    pairs = sum(v for (name, _), v in samples.items() if name == "livevec_worker_training_loss_pairs_total")
    return len(norms) == 4 and not any(math.isnan(v) for v in norms) and pairs > 0


def _series(samples, instance: str) -> list[dict]:
    """promtool input series that hold what a worker exported: the norms as scraped, the counters growing by
    1,000 sampled pairs a minute at the loss per pair they measured."""
    per_pair = samples[("livevec_worker_training_loss_sum_total", (("role", "worker"),))] \
        / samples[("livevec_worker_training_loss_pairs_total", (("role", "worker"),))]
    out = []
    for (name, labels), value in samples.items():
        if name not in SIGNAL_METRICS:
            continue
        selector = ",".join(f'{k}="{v}"' for k, v in (*labels, ("instance", instance), ("job", "livevec-worker")))
        if name == "livevec_worker_hot_row_norm":
            values = f"{'+Inf' if math.isinf(value) else repr(value)}x30"
        elif name.endswith("_pairs_total"):
            values = "0+1000x30"
        else:
            values = f"0+{1000 * per_pair:.6f}x30"
        out.append({"series": f"{name}{{{selector}}}", "values": values})
    return out


def _loss_switch(healthy, diverged, instance: str) -> list[dict]:
    """A worker that trained like the healthy one for 80 minutes, then like the diverged one (its counters only:
    the loss branch of the alert alone)."""
    def per_pair(samples):
        return samples[("livevec_worker_training_loss_sum_total", (("role", "worker"),))] \
            / samples[("livevec_worker_training_loss_pairs_total", (("role", "worker"),))]
    before, after = 1000 * per_pair(healthy), 1000 * per_pair(diverged)
    selector = f'instance="{instance}",job="livevec-worker",role="worker"'
    return [{"series": f"livevec_worker_training_loss_pairs_total{{{selector}}}", "values": "0+1000x110"},
            {"series": f"livevec_worker_training_loss_sum_total{{{selector}}}",
             "values": f"0+{before:.6f}x80 {80 * before + after:.6f}+{after:.6f}x29"}]


def _alert(instance: str, state: str = "firing") -> dict:
    """The sample of ``ALERTS`` that says the alert is ``state`` for a worker."""
    return {"labels": f'ALERTS{{alertname="{ALERT}",alertstate="{state}",instance="{instance}",'
                      f'job="livevec-worker",role="worker",severity="critical"}}', "value": 1}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_trained_with_an_absurd_learning_rate_fires_the_alert(tmp_path, kafka_bootstrap, kafka_topic):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run `make ops-tools` (Debian's prometheus package provides it)"
    topic = kafka_topic(2)
    produce(generate_lines(3000, seed=5), bootstrap=kafka_bootstrap, topic=topic, lines_per_record=20,
            create_topic=False)
    clusters = {}
    # The replica the worker measures is what it trained: its syncs wait (LIVEVEC_SYNC_MS, 60 s, and far more
    # tokens than the stream holds), so what the servers' merge answers is not under test here. (With the merge
    # as it was while this was written, an answer sometimes put rows trained at this rate back to their initial
    # values after the training: the signal said so, hot_rows_recovered, and the test saw a healthy model.)
    for name, eta in (("diverging", {"LIVEVEC_ETA": "1000"}), ("healthy", {})):
        (tmp_path / name).mkdir()
        clusters[name] = Cluster(tmp_path / name, servers=1, workers=1, env={
            "LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
            "LIVEVEC_KAFKA_GROUP": f"g-{name}-{topic}", "LIVEVEC_DIM": "16", "LIVEVEC_MIN_COUNT": "2",
            "LIVEVEC_KAFKA_BATCH_RECORDS": "20", "LIVEVEC_SYNC_MS": "60000",
            "LIVEVEC_SYNC_TOKENS": "1000000", **eta})
    try:
        for cluster in clusters.values():
            cluster.start("scheduler", "scheduler")
            cluster.start("server0", "server")
            cluster.start("worker0", "worker")
        # Every record read and trained: the rows hold still, so the next report measures the model the whole
        # stream made.
        for name, cluster in clusters.items():
            port = cluster.metrics_ports["worker0"]

            def trained(cluster=cluster, port=port):
                cluster.assert_alive()
                try:
                    samples = _scrape(port)
                except OSError:
                    return False
                return samples.get(("livevec_stream_records_total", (("role", "worker"),)), 0) >= RECORDS \
                    and samples.get(("livevec_worker_inflight_batches", (("role", "worker"),))) == 0
            wait_until(trained, 60, message=f"the {name} worker training every record")
        time.sleep(2 * REPORT_INTERVAL + 0.5)
        scraped = {name: _scrape(cluster.metrics_ports["worker0"]) for name, cluster in clusters.items()}
        diverging_log = clusters["diverging"].log("worker0")
        healthy_log = clusters["healthy"].log("worker0")
    finally:
        for cluster in clusters.values():
            if cluster.procs.get("worker0") is not None and cluster.procs["worker0"].poll() is None:
                cluster.kill("worker0")   # its unsynced rows would wait for servers that are stopping too
            cluster.stop()

    assert all(_measured(samples) for samples in scraped.values()), scraped

    def mean(name, kind):
        return scraped[name][("livevec_worker_hot_row_norm", (("kind", kind), ("role", "worker"), ("stat", "mean")))]
    for kind in ("input", "output"):
        assert mean("diverging", kind) > HOT_ROW_NORM_BOUND, (scraped["diverging"], diverging_log[-3000:])
        assert mean("healthy", kind) < HOT_ROW_NORM_BOUND / 2, (scraped["healthy"], healthy_log[-3000:])
    assert "hot_rows_diverging" in diverging_log and "hot_rows_diverging" not in healthy_log

    # promtool evaluates the alert of the rules file, `for:` included, on series that hold the scraped values
    tests = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [
        {"name": "the scraped workers", "interval": "1m",
         "input_series": _series(scraped["diverging"], "diverging:1") + _series(scraped["healthy"], "healthy:1"),
         "promql_expr_test": [
             {"expr": f'ALERTS{{alertname="{ALERT}"}}', "eval_time": "3m",   # pending: not yet for 5m
              "exp_samples": [_alert("diverging:1", "pending")]},
             {"expr": f'ALERTS{{alertname="{ALERT}"}}', "eval_time": "10m",
              "exp_samples": [_alert("diverging:1")]}]},
        {"name": "a worker whose loss turns from the healthy one's to the diverging one's", "interval": "1m",
         "input_series": _loss_switch(scraped["healthy"], scraped["diverging"], "switched:1")
         + _loss_switch(scraped["healthy"], scraped["healthy"], "steady:1"),
         "promql_expr_test": [
             {"expr": f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}', "eval_time": "79m", "exp_samples": []},
             {"expr": f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}', "eval_time": "100m",
              "exp_samples": [_alert("switched:1")]}]}]}
    path = tmp_path / "scraped.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr + path.read_text()



def test_the_windows_running_loss_equals_the_sum_over_its_batches(monkeypatch):
    """The window's sums are kept as batches come and go (not summed afresh per batch); they must equal a fresh
    sum over what is in the window, with a non-finite batch while it is in it and after it left."""
    import online.cluster.training_signal as ts
    clock = [1000.0]
    monkeypatch.setattr(ts.time, "monotonic", lambda: clock[0])
    signal = TrainingSignal(Registry(), vocab=None, window=10.0)
    losses = [0.25 * (i % 17) for i in range(6000)]
    losses[3000] = math.inf
    for i, loss in enumerate(losses):
        clock[0] += 0.01                      # 1,000 batches in the window at a time
        signal.record(SimpleNamespace(loss_sampled=loss, loss_pairs=1 + i % 5))
        if i in (2999, 3500, 5999):
            kept = list(signal._batches)
            mean, pairs, nonfinite = signal._window_loss()
            assert pairs == sum(n for _, _, n in kept) and nonfinite == (i == 3500)
            if i == 3500:
                assert math.isinf(mean)
            else:
                assert mean == pytest.approx(sum(x for _, x, _ in kept) / pairs, rel=1e-12)
