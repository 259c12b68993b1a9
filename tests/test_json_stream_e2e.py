"""A JSON stream of shopping sessions with malformed records, trained end to end: the real broker, the
production group (scheduler, server, worker, front end) with checkpoints and the batch ledger. Every
offset is processed exactly once, malformed records included; only the valid ones are trained, their
items byte for byte; each malformed one is counted by its reason on the worker's /metrics and the front end's /v1/stats."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.parse
import uuid

import pytest

from online.checkpoint.store import CheckpointStore
from online.cli.up import local_cluster
from online.stream.sample_sessions import generate_session_records
from tests.cluster_harness import runner_metric, wait_until
from tests.support.http import get
from tests.test_checkpoint_recovery import ClusterProbe, _ledger

PARTITIONS = 4
MALFORMED = {                      # value -> the reason the stream gives (None: valid, trained)
    b"{not json": "invalid_json",
    b'{"user": "u-1", "ts": 3}': "missing_field",
    b'{"user": "u-2", "items": ["sku-1", 7]}': "wrong_type",
    b'{"user": "u-3", "items": "sku-1 sku-2"}': None,   # a string: text for the tokenizer
}


def _values(n_sessions: int) -> list[bytes]:
    values = [r.encode() for r in generate_session_records(n_sessions, seed=5)]
    odd = list(MALFORMED)
    for i in range(0, len(values), 25):     # one odd record in every 25, spread over the partitions
        values.insert(i, odd[(i // 25) % len(odd)])
    return values


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for i, value in enumerate(values):
            await producer.send(topic, value, partition=i % PARTITIONS)
        await producer.flush()
    finally:
        await producer.stop()


def _malformed(runner, reason: str) -> float:
    lines = get(runner.url("worker", "metrics", "/metrics")).text().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("livevec_stream_malformed_total{") and f'reason="{reason}"' in line)


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_json_session_stream_with_malformed_records_trains_exactly_once(kafka_bootstrap, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=PARTITIONS, prefix="sessions")
    values = _values(6000)
    trained = [json.loads(v)["items"] for v in values if MALFORMED.get(v) is None]
    tokens = sum(len(items) if isinstance(items, list) else len(items.split()) for items in trained)
    reasons: dict[str, int] = {}
    for v in values:
        if MALFORMED.get(v):
            reasons[MALFORMED[v]] = reasons.get(MALFORMED[v], 0) + 1
    env = {"LIVEVEC_RECORD_FORMAT": "json", "LIVEVEC_RECORD_FIELD": "items", "LIVEVEC_TOKENIZER": "tokens",
           "LIVEVEC_DIM": "16", "LIVEVEC_MIN_COUNT": "3", "LIVEVEC_SYNC_MS": "200",
           "LIVEVEC_CHECKPOINT_INTERVAL": "2", "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3",
           "LIVEVEC_KAFKA_GROUP": f"g-{uuid.uuid4().hex[:8]}"}
    runner = local_cluster(tmp_path / "run", kafka_bootstrap, topic, servers=1, workers=1, env=env)
    probe = None
    try:
        runner.start()
        assert runner.wait_healthy(timeout=120), "cluster did not become healthy"
        probe = ClusterProbe(runner.port("scheduler", "ps"), servers=1)
        asyncio.run(_produce(kafka_bootstrap, topic, values))
        ends = {f"{topic}/{p}": len(range(p, len(values), PARTITIONS)) for p in range(PARTITIONS)}
        ledger = wait_until(lambda: (lambda led: led if led and led.get("frontier") == ends else False)(
            _ledger(probe.stats())), 90, interval=0.25, message="every produced offset processed")
        assert ledger["gaps"] == 0 and ledger["overlaps"] == 0, ledger
        assert ledger["offsets"] == len(values), ledger
        assert ledger["records"] == len(trained), ledger
        assert ledger["tokens"] == tokens, ledger
        for reason, n in reasons.items():
            assert _malformed(runner, reason) == n, reason
        assert runner_metric(runner, "worker", "livevec_stream_malformed_total") == sum(reasons.values())
        # and on the front end's /v1/stats, by reason, through the workers' reports to server 0
        stats_url = runner.url("frontend", "http", "/v1/stats")
        wait_until(lambda: {r: n for r, n in (get(stats_url).json({}).get("records_malformed") or {}).items() if n}
                   == reasons, 30, interval=0.5,
                   message=f"/v1/stats to count the malformed records by reason: {reasons}")

        # The IDs came through byte for byte, and a bundle's items (planted co-purchases) are neighbours.
        url = runner.url("frontend", "http", "/v1/similar?" + urllib.parse.urlencode({"word": "sku-tent-2p", "k": 50}))
        partners = {"sku-sleeping-bag", "sku-camp-stove"}

        def neighbours():
            body = get(url).json(None)
            words = [n["word"] for n in body["neighbours"]] if body else []
            return words if partners <= set(words) else False

        words = wait_until(neighbours, 30, message="sku-tent-2p's planted partners among its neighbours")
        assert all(w.startswith("sku-") for w in words), words

        # The checkpoints say how the stream was read, and a worker started reading it another way stops
        # at start, naming the setting.
        store = CheckpointStore(tmp_path / "run" / "shared" / "livevec" / "checkpoints")
        ckpt = wait_until(lambda: store.latest_complete(check_data=False), 30, message="a checkpoint")
        assert ckpt.manifest["reading"] == {"tokenizer": "tokens", "language": "auto", "record_format": "json",
                                            "record_field": "items"}
        worker_env = {**os.environ, **env, "DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1",
                      "DMLC_PS_ROOT_PORT": str(runner.port("scheduler", "ps")), "DMLC_NUM_SERVER": "1",
                      "DMLC_NUM_WORKER": "1", "LIVEVEC_KAFKA_BOOTSTRAP": kafka_bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
                      "LIVEVEC_CHECKPOINT_DIR": str(store.root)}
        for setting, value in (("LIVEVEC_TOKENIZER", "unicode"), ("LIVEVEC_RECORD_FIELD", "basket")):
            done = subprocess.run([sys.executable, "-m", "online.cli", "worker"], env={**worker_env, setting: value},
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode != 0 and f"configuration error: {setting}" in done.stderr, done.stderr[-2000:]
    finally:
        if probe is not None:
            probe.close()
        runner.stop()
