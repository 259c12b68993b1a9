"""Kafka -> workers -> parameter servers, with real processes and the real broker."""
from __future__ import annotations

import collections
import os
import threading
import time

import numpy as np
import pytest

from online.stream.producer import produce
from online.stream.sample_corpus import generate_lines
from tests.cluster_harness import Cluster, read_model, wait_until
from tests.support.planted import planted_hits

pytestmark = pytest.mark.slow


def produced_counts(lines: list[str]) -> collections.Counter:
    return collections.Counter(tok for line in lines for tok in line.split())


def server_counts(model) -> dict[str, int]:
    return dict(zip(model.words, model.counts.tolist()))


def cluster_env(bootstrap: str, topic: str, group: str) -> dict[str, str]:
    return {"LIVEVEC_KAFKA_BOOTSTRAP": bootstrap, "LIVEVEC_KAFKA_TOPICS": topic, "LIVEVEC_KAFKA_GROUP": group,
            "LIVEVEC_DIM": "32", "LIVEVEC_MIN_COUNT": "3", "LIVEVEC_KAFKA_BATCH_RECORDS": "50"}


def test_planted_pairs_become_neighbours_on_the_servers(tmp_path, kafka_bootstrap, kafka_topic):
    topic = kafka_topic(4)
    lines = generate_lines(30_000, seed=7)
    produce(lines, bootstrap=kafka_bootstrap, topic=topic, lines_per_record=20, create_topic=False)
    cluster = Cluster(tmp_path, servers=2, workers=2, env=cluster_env(kafka_bootstrap, topic, "g-planted"))
    try:
        cluster.start("scheduler", "scheduler")
        for i in range(2):
            cluster.start(f"server{i}", "server")
        for i in range(2):
            cluster.start(f"worker{i}", "worker")
        expected = sum(produced_counts(lines).values())
        wait_until(lambda: sum(cluster.metric(f"worker{i}", "livevec_worker_tokens_total") for i in range(2))
                   >= expected, 120, message="all produced tokens trained")
        cluster.assert_alive()
        # right away: the figures cover the last minute or so, and the checks below can outlast it on a loaded host
        _assert_cost_per_token_shown(cluster, ["worker0", "worker1", "server0", "server1"])
        model, stats = read_model(cluster)
        # Both servers hold part of the model: keys are split by range.
        per_server = [s for s in (cluster.metric(f"server{i}", "livevec_server_words") for i in range(2))]
        assert all(n > 0 for n in per_server), per_server
        assert stats["servers"] == 2
        assert planted_hits(model.words, model.vectors) >= 0.9
        _assert_cpu_by_stage_adds_up(cluster, ["worker0", "worker1"])
    finally:
        cluster.stop()


def _assert_cost_per_token_shown(cluster: Cluster, names: list[str]) -> None:
    """Every worker that trained and every server shows its CPU and ps-lite bytes per trained token over the last
    minute (``online.cluster.token_cost``), and the process CPU and token counters behind them."""
    tokens = {"worker": "livevec_worker_tokens_total", "server": "livevec_server_tokens_total"}
    shown = []
    for name in names:
        if cluster.metric(name, tokens[name.rstrip("0123456789")]) == 0:
            continue   # a worker the group gave no partition
        assert cluster.metric(name, "process_cpu_seconds_total") > 0, name
        figures = {metric: cluster.metric(name, metric) for metric in (
            "livevec_cpu_us_per_token", "livevec_pslite_sent_bytes_per_token",
            "livevec_pslite_received_bytes_per_token")}
        assert all(v > 0 for v in figures.values()), (name, figures)   # NaN: no token in the window
        shown.append(name)
    assert {"server0", "server1"} <= set(shown) and any(n.startswith("worker") for n in shown), shown


def _assert_cpu_by_stage_adds_up(cluster: Cluster, names: list[str]) -> None:
    """The workers' CPU by stage (``livevec_worker_cpu_seconds_total``, the event loop's thread) is each stage's
    own share: every stage ran (summed over the workers: the group may give one of them no partition), and in
    each worker together they stay within the process's CPU as the kernel counts it."""
    totals = dict.fromkeys(("prepare", "kernel", "sync", "loop"), 0.0)
    for name in names:
        stages = {stage: cluster.metric(name, "livevec_worker_cpu_seconds_total", stage=stage)
                  for stage in ("prepare", "kernel", "sync")}
        stages["loop"] = cluster.metric(name, "livevec_worker_event_loop_cpu_seconds")
        with open(f"/proc/{cluster.procs[name].pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        process = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        assert sum(stages.values()) <= process + 0.05, (name, stages, process)
        for stage, value in stages.items():
            totals[stage] += value
    assert all(v > 0 for v in totals.values()), totals


def test_worker_killed_and_added_mid_stream_loses_nothing(tmp_path, kafka_bootstrap, kafka_topic):
    topic = kafka_topic(4)
    lines = generate_lines(40_000, seed=11)
    cluster = Cluster(tmp_path, servers=1, workers=2, env=cluster_env(kafka_bootstrap, topic, "g-kill"))
    try:
        cluster.start("scheduler", "scheduler")
        cluster.start("server0", "server")
        cluster.start("worker0", "worker")
        cluster.start("worker1", "worker")
        # The stream keeps flowing (100 records/s) while the workers change, so every member of the
        # group always has something to read, whatever order the processes start in.
        first = threading.Thread(target=produce, args=(lines[:20_000],), kwargs=dict(
            bootstrap=kafka_bootstrap, topic=topic, lines_per_record=20, rate=100, create_topic=False))
        first.start()
        wait_until(lambda: cluster.metric("worker1", "livevec_worker_records_total") > 20, 120,
                   message="worker1 training")
        cluster.kill("worker1")                       # kill -9 mid-stream
        cluster.start("worker2", "worker")            # a third worker joins the running cluster
        first.join()
        produce(lines[20_000:], bootstrap=kafka_bootstrap, topic=topic, lines_per_record=20, rate=100,
                create_topic=False)
        wait_until(lambda: cluster.metric("worker2", "livevec_worker_records_total") > 0, 120,
                   message="the new worker receives partitions and trains")
        expected = produced_counts(lines)
        total = sum(expected.values())
        wait_until(lambda: cluster.metric("server0", "livevec_server_tokens_counted") >= total, 120,
                   message="every produced token counted on the server")
        # Redelivered records are counted again, so the total can pass the produced count while the last
        # sync of another worker is still on its way: every word must get there, within a few syncs.

        def missing():
            model, _ = read_model(cluster)
            counts = server_counts(model)
            gone = {w: (n, counts.get(w, 0)) for w, n in expected.items() if counts.get(w, 0) < n}
            return (model, gone)
        model, gone = missing()
        deadline = time.monotonic() + 15
        while gone and time.monotonic() < deadline:
            time.sleep(0.5)
            model, gone = missing()
        assert not gone, f"words counted fewer times than produced: {list(gone.items())[:10]}"
        assert cluster.metric("worker2", "livevec_worker_tokens_total") > 0
        assert planted_hits(model.words, model.vectors) >= 0.9
    finally:
        cluster.stop()
