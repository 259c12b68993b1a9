"""The ``pullpush`` exchange end to end, with real processes and the real broker.

``LIVEVEC_EXCHANGE=pullpush`` makes a worker pull its mini-batch's rows from the servers, walk the pairs against
them, and push the summed gradients, which the servers apply with per-coordinate AdaGrad; stock ps-lite workers
take the same path. Here a scheduler, two servers and two such workers train a Kafka topic fed by the sample
corpus, and the test checks what the exchange promises: both workers train, the servers' rows move by pushed
gradients (no replica deltas), the planted groups become each other's neighbours, every record is trained exactly
once and its offset committed, and every process stays healthy and stops cleanly.
"""
from __future__ import annotations

import asyncio
import re
import signal
import time

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from online.learner.embedding_shard import EmbeddingShard
from online.learner.param_store import LocalParamStore
from online.learner.trainer import LearnerConfig, Trainer
from online.stream.producer import produce
from online.stream.sample_corpus import PLANTED_PAIRS, generate_lines
from tests.cluster_harness import Cluster, read_model, wait_until
from tests.support.planted import planted_hits

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 4
WORKERS = 2
SERVERS = 2
DIM = 32
SEED = 1   # LIVEVEC_SEED: the rows' initial values depend only on it and the key


def _metric(cluster: Cluster, names: list[str], metric: str, **labels: str) -> float:
    return sum(cluster.metric(name, metric, **labels) for name in names)


def _assigned(cluster: Cluster, name: str) -> list[str] | None:
    """The partitions of the worker's latest assignment (None before its first)."""
    found = re.findall(r"event=partitions_assigned partitions=(\S+)", cluster.log(name))
    return None if not found else [p for p in found[-1].split(",") if p != "-"]


def _offsets(bootstrap: str, topic: str, group: str) -> tuple[dict[int, int], dict[int, int]]:
    """(the group's committed offset, the log end offset) per partition of ``topic``."""
    async def read():
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            committed = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await consumer.start()
        try:
            ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
        finally:
            await consumer.stop()
        return ({tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic},
                {tp.partition: offset for tp, offset in ends.items()})
    return asyncio.run(read())


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)


def _pair_cosines(words: list[str], vectors: np.ndarray) -> tuple[float, float]:
    """Mean cosine of the planted pairs, and of as many pairs of other words drawn at random."""
    v = _unit(vectors)
    index = {w: i for i, w in enumerate(words)}
    planted = [float(v[index[a]] @ v[index[b]]) for a, b in PLANTED_PAIRS]
    rng = np.random.default_rng(0)
    drawn = rng.choice(len(words), size=(200, 2))
    randoms = [float(v[i] @ v[j]) for i, j in drawn if i != j]
    return float(np.mean(planted)), float(np.mean(randoms))


def test_pullpush_workers_train_the_servers_rows_exactly_once(tmp_path, kafka_bootstrap, kafka_topic):
    # The walk and the plan are compiled (numba's cache beside the code) before two workers would at once.
    Trainer(LearnerConfig(dim=DIM, min_count=1), LocalParamStore(dim=DIM, optimizer="adagrad")).train_records(
        generate_lines(20, seed=1))
    topic, group = kafka_topic(PARTITIONS), "g-pullpush"
    cluster = Cluster(tmp_path, servers=SERVERS, workers=WORKERS, env={
        "LIVEVEC_EXCHANGE": "pullpush", "LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
        "LIVEVEC_KAFKA_GROUP": group, "LIVEVEC_DIM": str(DIM), "LIVEVEC_MIN_COUNT": "3", "LIVEVEC_SEED": str(SEED),
        "LIVEVEC_KAFKA_BATCH_RECORDS": "50"})
    workers = [f"worker{i}" for i in range(WORKERS)]
    servers = [f"server{i}" for i in range(SERVERS)]
    try:
        cluster.start("scheduler", "scheduler")
        for name in servers:
            cluster.start(name, "server")
        for name in workers:
            cluster.start(name, "worker")
        # Both workers hold their share of the partitions before anything is produced: no rebalance moves a batch
        # in flight, so each record is handed out exactly once.
        wait_until(lambda: cluster.assert_alive() or all(
            len(_assigned(cluster, name) or ()) == PARTITIONS // WORKERS for name in workers),
            60, message="both workers in the group, with two partitions each")

        lines = generate_lines(30_000, seed=7)
        produced = produce(lines, bootstrap=kafka_bootstrap, topic=topic, lines_per_record=20, create_topic=False)
        assert produced.failed == 0 and produced.records == len(lines) // 20, produced.summary()
        tokens = sum(len(line.split()) for line in lines)

        wait_until(lambda: _metric(cluster, workers, "livevec_worker_tokens_total") >= tokens, 90,
                   message="every produced token trained")
        committed, ends = wait_until(
            lambda: (o := _offsets(kafka_bootstrap, topic, group))[0] == o[1] and o, 30,
            message="the group's committed offsets at the end of every partition")
        assert sum(ends.values()) == produced.records and set(committed) == set(range(PARTITIONS)), (committed, ends)
        time.sleep(2.0)   # anything read twice would show up in the counters by now

        # Every record and token trained exactly once, by both workers, and nothing redelivered or skipped.
        assert _metric(cluster, workers, "livevec_worker_tokens_total") == tokens
        assert _metric(cluster, workers, "livevec_worker_records_total") == produced.records
        assert all(cluster.metric(name, "livevec_worker_tokens_total") > 0 for name in workers)
        assert _metric(cluster, workers, "livevec_stream_redelivered_total") == 0
        assert _metric(cluster, workers, "livevec_worker_records_skipped_total") == 0
        assert _metric(cluster, workers, "livevec_worker_batch_errors_total") == 0

        # The exchange is pull/push: each mini-batch one pull and one push per server it touches, no replica
        # deltas; the pulls read what the pushes wrote, key by key.
        for name in servers:
            assert cluster.metric(name, "livevec_server_requests_total", kind="push") > 0, name
            assert cluster.metric(name, "livevec_server_keys_pushed_total") > 0, name
            assert cluster.metric(name, "livevec_server_requests_total", kind="deltas") == 0, name
            assert cluster.metric(name, "livevec_server_rejected_total") == 0, name
            assert cluster.metric(name, "livevec_server_fenced_total") == 0, name
        assert _metric(cluster, workers, "livevec_worker_keys_pulled_total") > 0

        # The servers' rows moved away from their initial values, and the planted groups learnt each other.
        model, stats = read_model(cluster)
        assert stats["servers"] == SERVERS and len(model.words) > 100
        initial = EmbeddingShard(DIM, optimizer="adagrad", seed=SEED).pull(np.asarray(model.keys, dtype=np.uint64))
        moved = np.linalg.norm(model.vectors - initial, axis=1) > 1e-3
        assert moved.mean() > 0.95, f"{moved.sum()} of {len(moved)} rows moved"
        hits = planted_hits(model.words, model.vectors)
        planted, random_pairs = _pair_cosines(model.words, model.vectors)
        assert hits >= 0.9, hits
        assert planted > random_pairs + 0.3, (planted, random_pairs)

        cluster.assert_alive()
        for name in workers:   # a clean stop: nothing left in flight, exit 0
            cluster.kill(name, signal.SIGTERM)
            assert cluster.procs[name].returncode == 0, cluster.log(name)[-3000:]
    finally:
        cluster.stop()
