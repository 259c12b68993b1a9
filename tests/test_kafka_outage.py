"""A Kafka broker killed and restarted from its data directory.

Each test starts a broker of its own (the session's is shared, and these kill theirs) on a data directory of its
own, kills it with SIGKILL, waits, and starts it again from the same directory on the same port, as an operator's
restart would. What must hold: the Kafka client's own lines are summarised (``online.stream.client_logs``): one
``kafka_unreachable`` line, one ``kafka_reachable`` line, ``livevec_kafka_reachable`` 0 during the outage and 1
after, few warning/error lines in all; and the cluster's training resumes with every record trained exactly once
(the servers' batch ledger).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
import uuid

import pytest

from online.stream.kafka_broker import KafkaBroker
from online.stream.settings import KafkaBrokerSettings


@pytest.fixture
def own_broker(tmp_path):
    """A broker of the test's own on a data directory of its own, that comes back on the port it first got, so
    that ``kill()`` then ``start()`` is an operator's restart."""
    broker = KafkaBroker(dataclasses.replace(KafkaBrokerSettings.from_env(), port=0,
                                             data_dir=tmp_path / "kafka", state_file=None))
    broker.start()
    broker.settings = dataclasses.replace(broker.settings, port=broker.port)
    try:
        yield broker
    finally:
        broker.stop()


class _Lines(logging.Handler):
    """Every record that reaches the root logger's handlers, as the process's log would hold it."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def events(self, name: str) -> list[logging.LogRecord]:
        return [r for r in self.records if r.getMessage() == name]

    def loud(self, since: float = 0.0) -> list[logging.LogRecord]:
        return [r for r in self.records if r.levelno >= logging.WARNING and r.created >= since]


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_consumer_summarises_a_broker_outage(own_broker, lines):
    """In process, one consumer (a KafkaStream as a worker has): the broker killed for 12 s, then restarted."""
    from online.stream.producer import ensure_topic
    from online.stream.reader import KafkaStream
    from online.stream.settings import StreamSettings
    from ps_bridge.metrics import Registry

    topic = f"outage-{uuid.uuid4().hex[:8]}"
    await ensure_topic(own_broker.bootstrap, topic, 2)
    registry = Registry()
    stream = KafkaStream(StreamSettings.from_env(env={}, bootstrap=own_broker.bootstrap, topics=[topic],
                                                 group=f"g-{uuid.uuid4().hex[:6]}", session_timeout_ms=6000),
                         metrics=registry)

    def gauge() -> float:
        return next(float(line.rsplit(" ", 1)[1]) for line in registry.render().splitlines()
                    if line.startswith("livevec_kafka_reachable"))

    try:
        stream.settings = dataclasses.replace(stream.settings, client_logs=dataclasses.replace(
            stream.settings.client_logs, summary_interval=5.0))
        await stream.start()
        await stream.next_batch(timeout=3.0)
        assert gauge() == 1.0
        killed = time.time()
        await asyncio.to_thread(own_broker.kill)
        down = 12.0
        saw_zero = False
        while time.time() < killed + down:
            await stream.next_batch(timeout=0.5)
            saw_zero = saw_zero or gauge() == 0.0
        assert saw_zero, "livevec_kafka_reachable never went to 0 during the outage"
        restarted = time.time()
        await asyncio.to_thread(own_broker.start)
        deadline = time.monotonic() + 60
        while gauge() != 1.0 and time.monotonic() < deadline:
            await stream.next_batch(timeout=0.5)
        assert gauge() == 1.0, "livevec_kafka_reachable not back to 1 a minute after the restart"
        unreachable, reachable = lines.events("kafka_unreachable"), lines.events("kafka_reachable")
        assert len(unreachable) == 1 and len(reachable) == 1, [r.getMessage() for r in lines.loud()]
        assert killed - 1 <= unreachable[0].created <= killed + 5, unreachable[0].created - killed
        assert unreachable[0].last_error and reachable[0].suppressed > 0
        assert down <= reachable[0].seconds <= time.time() - killed + 1
        still = lines.events("kafka_still_unreachable")
        outage = reachable[0].created - unreachable[0].created
        assert 1 <= len(still) <= outage / 5 + 1, outage   # at most one per summary interval (5 s here)
        loud = lines.loud(killed)
        print(f"outage {restarted - killed:.1f}s + restart; warning/error lines: {len(loud)}; "
              f"suppressed {reachable[0].suppressed}; client lines passed: "
              f"{sum(r.name.startswith(('aiokafka', 'kafka.')) for r in loud)}")
        assert len(loud) <= 40, "\n".join(f"{r.name} {r.getMessage()[:150]}" for r in loud)
    finally:
        await stream.stop()


# ----------------------------------------------------------------------------- a cluster through an outage

PARTITIONS = 4
_TS = re.compile(r"^ts=(\S+) level=(\w+) ")


@pytest.fixture
def lines():
    """What reaches the root logger at INFO and above while the test runs, with the client-log gate installed
    afresh by the test's Kafka client and removed after."""
    from online.stream.client_logs import uninstall

    captured = _Lines()
    root = logging.getLogger()
    root.addHandler(captured)
    old_level = root.level
    root.setLevel(logging.INFO)
    uninstall()
    try:
        yield captured
    finally:
        root.removeHandler(captured)
        root.setLevel(old_level)
        uninstall()


def _loud_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if _TS.match(line) and _TS.match(line).group(2) in ("warning", "error")]


async def _produce(bootstrap: str, topic: str, records: list[str], first: int, rate: float) -> None:
    """``records`` at ``rate`` per second, record ``first + i`` to partition ``(first + i) % PARTITIONS`` (so the
    ledger's expected end of each partition is known: ``cluster_harness.assert_trained_exactly_once``)."""
    from aiokafka import AIOKafkaProducer

    # idempotent, as ``livevec produce`` is: a send retried across a leader change lands once
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        t0 = time.monotonic()
        for i, record in enumerate(records):
            await producer.send_and_wait(topic, record.encode(), partition=(first + i) % PARTITIONS)
            delay = t0 + (i + 1) / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
    finally:
        await producer.stop()


def _ledger_cluster(tmp_path, bootstrap: str, topic: str):
    """1 server and 2 workers with checkpoints (so server 0 keeps the batch ledger), reading ``topic``."""
    from tests.cluster_harness import Cluster

    return Cluster(tmp_path, servers=1, workers=2, env={
        "LIVEVEC_KAFKA_BOOTSTRAP": bootstrap, "LIVEVEC_KAFKA_TOPICS": topic,
        "LIVEVEC_KAFKA_GROUP": f"g-{topic}", "LIVEVEC_DIM": "24", "LIVEVEC_MIN_COUNT": "3",
        "LIVEVEC_KAFKA_BATCH_RECORDS": "15", "LIVEVEC_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "LIVEVEC_CHECKPOINT_INTERVAL": "2", "PS_HEARTBEAT_TIMEOUT": "3", "LIVEVEC_REQUEST_TIMEOUT": "4",
        "LIVEVEC_KAFKA_LOG_SUMMARY_INTERVAL": "10", "LIVEVEC_LOG_LEVEL": "INFO"})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cluster_trains_through_a_broker_outage_exactly_once(own_broker, tmp_path):
    """1 server and 2 workers (with checkpoints, so server 0 keeps the batch ledger); the broker SIGKILLed for 25 s
    while the workers train, then restarted from its data directory. Training resumes, every record is trained
    exactly once, and each worker wrote one kafka_unreachable line, one kafka_reachable line and few others."""
    from online.learner.tokenizers import Tokenizer
    from online.stream.producer import ensure_topic
    from online.stream.sample_corpus import generate_lines
    from tests.cluster_harness import assert_trained_exactly_once, wait_until
    from tests.test_checkpoint_recovery import LINES_PER_RECORD, ClusterProbe, _ledger

    topic = f"outage-{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topic(own_broker.bootstrap, topic, PARTITIONS))
    lines = generate_lines(3200, seed=28)
    records = ["\n".join(lines[i:i + LINES_PER_RECORD]) for i in range(0, len(lines), LINES_PER_RECORD)]  # 800
    before, after = records[:480], records[480:]
    tokens_expected = sum(len(s) for s in Tokenizer("text8").sentences_of(records))
    down = 25.0
    workers = ("worker0", "worker1")
    cluster = _ledger_cluster(tmp_path, own_broker.bootstrap, topic)
    probe = None
    try:
        cluster.start("scheduler", "scheduler")
        cluster.start("server0", "server")
        for name in workers:
            cluster.start(name, "worker")
        probe = ClusterProbe(cluster.root_port, servers=1)
        producing = __import__("threading").Thread(target=lambda: asyncio.run(
            _produce(own_broker.bootstrap, topic, before, 0, rate=40.0)), daemon=True)
        producing.start()
        # kill the broker while the workers train (records produced but not all trained yet)
        wait_until(lambda: cluster.assert_alive() or (_ledger(probe.stats()) or {}).get("records", 0) >= 200, 90,
                   interval=0.25, message="training to start")
        producing.join(timeout=60)
        assert all(cluster.metric(name, "livevec_kafka_reachable") == 1.0 for name in workers)
        log_offsets = {name: len(cluster.log(name)) for name in workers}
        trained_at_kill = _ledger(probe.stats())["records"]
        killed = time.monotonic()
        own_broker.kill()
        seen_down = set()
        while time.monotonic() < killed + down:
            cluster.assert_alive()
            seen_down |= {name for name in workers if cluster.metric(name, "livevec_kafka_reachable") == 0.0}
            time.sleep(0.5)
        assert seen_down == set(workers), f"livevec_kafka_reachable 0 during the outage only on {seen_down}"
        own_broker.start()
        restart_seconds = own_broker.start_seconds
        restarted = time.monotonic()
        wait_until(lambda: all(cluster.metric(name, "livevec_kafka_reachable") == 1.0 for name in workers), 60,
                   interval=0.25, message="livevec_kafka_reachable back to 1 on every worker")
        back = time.monotonic() - restarted
        asyncio.run(_produce(own_broker.bootstrap, topic, after, len(before), rate=200.0))
        wait_until(lambda: (_ledger(probe.stats()) or {}).get("records", 0) > len(before), 90, interval=0.25,
                   message="training to resume after the restart")
        resumed = time.monotonic() - restarted
        ledger = assert_trained_exactly_once(probe.stats, topic, len(records), tokens_expected,
                                             partitions=PARTITIONS, timeout=120,
                                             idle=lambda: cluster.metric("scheduler", "livevec_recovering") == 0.0)
        cluster.assert_alive()
        report = [f"outage {down:.0f} s (+{restart_seconds:.1f} s broker start), trained at kill "
                  f"{trained_at_kill}/{len(before)}, reachable again {back:.1f} s and trained again "
                  f"{resumed:.1f} s after the restart; ledger {ledger['records']} records, "
                  f"{ledger['overlaps']} overlaps, {ledger['gaps']} gaps"]
        for name in workers:
            text = cluster.log(name)[log_offsets[name]:]
            loud = _loud_lines(text)
            unreachable = [line for line in text.splitlines() if " event=kafka_unreachable " in line]
            reachable = [line for line in text.splitlines() if " event=kafka_reachable " in line]
            still = [line for line in text.splitlines() if " event=kafka_still_unreachable " in line]
            suppressed = int(re.search(r" suppressed=(\d+)", reachable[0]).group(1)) if reachable else -1
            report.append(f"{name}: {len(loud)} warning/error lines, {len(still)} still_unreachable, "
                          f"{suppressed} client lines suppressed")
            assert len(unreachable) == 1 and len(reachable) == 1, "\n".join(loud[:60])
            assert "last_error=" in unreachable[0] and suppressed > 0, unreachable[0]
            assert len(loud) <= 200, "\n".join(loud[:200])
            # one per 10 s (LIVEVEC_KAFKA_LOG_SUMMARY_INTERVAL) of the outage as the worker saw it (~30 s; longer
            # when a loaded machine restarts the broker slowly)
            seen = float(re.search(r" seconds=([\d.]+)", reachable[0]).group(1))
            assert 1 <= len(still) <= int(seen // 10) + 1, (seen, still)
            assert cluster.metric(name, "livevec_kafka_client_log_lines_suppressed_total") >= suppressed
        print("\n".join(report))
    finally:
        if probe is not None:
            probe.close()
        cluster.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_producer_rides_out_a_short_outage_and_says_so_once(own_broker, lines):
    """``produce_async`` (what ``livevec produce`` runs) at 40 records/s, the broker killed for 8 s meanwhile: every
    record is acknowledged once the broker is back (within the producer's 60 s request timeout), and the outage
    is one kafka_unreachable and one kafka_reachable line with client=producer, not the client's flood."""
    from online.stream.client_logs import ClientLogSettings
    from online.stream.producer import ensure_topic, produce_async
    from online.stream.reader import KafkaStream
    from online.stream.settings import StreamSettings

    topic = f"outage-p-{uuid.uuid4().hex[:8]}"
    await ensure_topic(own_broker.bootstrap, topic, 2)
    texts = [f"record {i} of the outage test" for i in range(600)]
    producing = asyncio.create_task(produce_async(texts, bootstrap=own_broker.bootstrap, topic=topic,
                                                  rate=40.0, create_topic=False, linger_ms=5,
                                                  client_logs=ClientLogSettings(summary_interval=5.0)))
    await asyncio.sleep(3.0)
    killed = time.time()
    await asyncio.to_thread(own_broker.kill)
    await asyncio.sleep(8.0)
    await asyncio.to_thread(own_broker.start)
    stats = await asyncio.wait_for(producing, 120)
    assert stats.records == len(texts) and stats.failed == 0
    unreachable = [r for r in lines.events("kafka_unreachable") if r.client == "producer"]
    reachable = [r for r in lines.events("kafka_reachable") if r.client == "producer"]
    assert len(unreachable) == 1 and len(reachable) == 1, [r.getMessage() for r in lines.loud()]
    loud = lines.loud(killed)
    print(f"producer: {len(loud)} warning/error lines, {reachable[0].suppressed} client lines suppressed, "
          f"outage {reachable[0].seconds} s")
    assert len(loud) <= 40, "\n".join(f"{r.name} {r.getMessage()[:150]}" for r in loud)
    # and each record is in the topic
    stream = KafkaStream(StreamSettings.from_env(env={}, bootstrap=own_broker.bootstrap, topics=[topic],
                                                 group=f"g-{uuid.uuid4().hex[:6]}"))
    await stream.start()
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    try:
        while len(seen) < len(texts) and time.monotonic() < deadline:
            batch = await stream.next_batch(timeout=1.0)
            seen.update(batch.texts if batch else ())
    finally:
        await stream.stop()
    assert seen == set(texts)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_rolling_restart_of_three_brokers_trains_every_record_exactly_once(tmp_path):
    """Three brokers (``KafkaCluster``: replication 3, min.insync.replicas 2), restarted one at a time as an
    upgrade does (SIGTERM, a few seconds down, back from its data) while the producer sends with acks=all and
    1 server and 2 workers train. Each restart moves partition leaderships and the group's coordinator: the
    batch ledger ends with every record trained exactly once, and no worker floods its log."""
    from online.learner.tokenizers import Tokenizer
    from tests.support.kafka_cluster import KafkaCluster
    from online.stream.producer import ensure_topic
    from online.stream.sample_corpus import generate_lines
    from tests.cluster_harness import assert_trained_exactly_once, wait_until
    from tests.test_checkpoint_recovery import LINES_PER_RECORD, ClusterProbe, _ledger

    kafka = KafkaCluster(3)
    kafka.start()
    topic = f"rolling-{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topic(kafka.bootstrap, topic, PARTITIONS, replication_factor=3))
    lines = generate_lines(2000, seed=29)
    records = ["\n".join(lines[i:i + LINES_PER_RECORD]) for i in range(0, len(lines), LINES_PER_RECORD)]  # 500
    tokens_expected = sum(len(s) for s in Tokenizer("text8").sentences_of(records))
    workers = ("worker0", "worker1")
    cluster = _ledger_cluster(tmp_path, kafka.bootstrap, topic)
    probe = None
    producing_error: list[BaseException] = []

    def produce() -> None:
        try:
            asyncio.run(_produce(kafka.bootstrap, topic, records, 0, rate=16.0))   # ~31 s, through every restart
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            producing_error.append(exc)
    try:
        cluster.start("scheduler", "scheduler")
        cluster.start("server0", "server")
        for name in workers:
            cluster.start(name, "worker")
        probe = ClusterProbe(cluster.root_port, servers=1)
        producing = __import__("threading").Thread(target=produce, daemon=True)
        producing.start()
        wait_until(lambda: cluster.assert_alive() or (_ledger(probe.stats()) or {}).get("records", 0) >= 60, 90,
                   interval=0.25, message="training to start")
        log_offsets = {name: len(cluster.log(name)) for name in workers}
        report = []
        for index in range(3):
            trained = _ledger(probe.stats())["records"]
            back_in = kafka.restart(index, down_seconds=2.0)
            # training goes on after each restart, before the next broker goes down
            # (or everything produced is trained: under load the producer can finish before the last restart)
            wait_until(lambda: cluster.assert_alive()
                       or _ledger(probe.stats())["records"] >= min(trained + 16, len(records)), 60,
                       interval=0.25, message=f"training after the restart of broker {index + 1}")
            report.append(f"broker {index + 1}: back in {back_in:.1f} s, trained {trained} before it")
        producing.join(timeout=120)
        assert not producing.is_alive() and not producing_error, producing_error
        ledger = assert_trained_exactly_once(probe.stats, topic, len(records), tokens_expected,
                                             partitions=PARTITIONS, timeout=120,
                                             idle=lambda: cluster.metric("scheduler", "livevec_recovering") == 0.0)
        cluster.assert_alive()
        report.append(f"ledger {ledger['records']} records, {ledger['overlaps']} overlaps, {ledger['gaps']} gaps")
        for name in workers:
            loud = _loud_lines(cluster.log(name)[log_offsets[name]:])
            report.append(f"{name}: {len(loud)} warning/error lines over the three restarts")
            assert len(loud) <= 200, "\n".join(loud[:200])
        print("\n".join(report))
    except BaseException:
        for name in ("scheduler", "server0", *workers):   # pytest shows this only when the test fails
            print(f"--- {name}, last lines ---\n" + "\n".join(cluster.log(name).splitlines()[-40:]))
        raise
    finally:
        if probe is not None:
            probe.close()
        cluster.stop()
        kafka.stop()
