"""A Kafka broker killed and restarted from its data directory (issue #28, item 3).

Each test starts a broker of its own (the session's is shared, and these kill theirs) on a fixed port and data
directory, kills it with SIGKILL, waits, and starts it again from the same directory, as an operator's restart
would. What must hold: the Kafka client's own lines are summarised (``online.stream.client_logs``): one
``kafka_unreachable`` line, one ``kafka_reachable`` line, ``livevec_kafka_reachable`` 0 during the outage and 1
after, few warning/error lines in all; and the cluster's training resumes with every record trained exactly once
(the #8 ledger).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from online.stream.kafka_broker import KafkaBroker, _free_port
from online.stream.settings import KafkaBrokerSettings


class RestartableBroker:
    """A single-node broker on a fixed port and data directory that can be SIGKILLed and started again."""

    def __init__(self, data_dir: Path):
        self.settings = dataclasses.replace(KafkaBrokerSettings.from_env(), port=_free_port(), data_dir=data_dir,
                                            state_file=None)
        self.broker: KafkaBroker | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.settings.host}:{self.settings.port}"

    def start(self) -> float:
        """Start (or restart from the same data directory); the seconds until it answered."""
        self.broker = KafkaBroker(self.settings)
        self.broker.start()
        return self.broker.start_seconds

    def kill(self) -> None:
        proc = self.broker.process
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        self.broker._terminate(grace=1.0)   # closes its log file; the data directory is not the broker's to remove

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop(grace=10.0)


@pytest.fixture
def own_broker(tmp_path):
    broker = RestartableBroker(tmp_path / "kafka")
    broker.start()
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
async def test_a_consumer_summarises_a_broker_outage(own_broker):
    """In process, one consumer (a KafkaStream as a worker has): the broker killed for 12 s, then restarted."""
    from online.stream.client_logs import uninstall
    from online.stream.producer import ensure_topic
    from online.stream.reader import KafkaStream
    from online.stream.settings import StreamSettings
    from ps_bridge.metrics import Registry

    topic = f"outage-{uuid.uuid4().hex[:8]}"
    await ensure_topic(own_broker.bootstrap, topic, 2)
    lines = _Lines()
    root = logging.getLogger()
    root.addHandler(lines)
    old_level = root.level
    root.setLevel(logging.INFO)
    uninstall()
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
        root.removeHandler(lines)
        root.setLevel(old_level)
        uninstall()
