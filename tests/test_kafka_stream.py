"""KafkaStream against the real broker: a group of two, malformed records, seeking, metrics."""
from __future__ import annotations

import asyncio
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from ps_bridge.metrics import Registry
from online.stream.producer import produce_async
from online.stream.reader import KafkaStream
from online.stream.settings import StreamSettings


def settings(bootstrap: str, topic: str, group: str, **kw) -> StreamSettings:
    kw.setdefault("batch_records", 100)
    kw.setdefault("session_timeout_ms", 6000)
    return StreamSettings(bootstrap=bootstrap, topics=(topic,), group=group, **kw)


class Collector:
    """Runs a stream like a worker: next batch, 'train', mark processed."""

    def __init__(self, stream: KafkaStream):
        self.stream = stream
        self.records = []
        self.task = asyncio.create_task(self._run())

    async def _run(self):
        while not self.stream.exhausted:
            batch = await self.stream.next_batch(timeout=0.2)
            if batch is not None:
                self.records.extend(batch.records)
                await self.stream.mark_processed(batch)

    async def stop(self):
        await self.stream.stop()
        await asyncio.wait_for(self.task, 10)


async def until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def committed_offset(bootstrap: str, topic: str, group: str, partition: int = 0):
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, partition))
    finally:
        await consumer.stop()


async def test_group_of_two_splits_partitions_sees_every_record_and_nothing_twice(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=4)
    group = f"pair-{uuid.uuid4().hex[:8]}"
    one = KafkaStream(settings(kafka_bootstrap, topic, group))
    two = KafkaStream(settings(kafka_bootstrap, topic, group))
    await one.start()
    c1 = Collector(one)
    await until(lambda: len(one.assignment()) == 4, 30, "the first reader to own every partition")
    await two.start()
    c2 = Collector(two)
    await until(lambda: len(one.assignment()) == 2 and len(two.assignment()) == 2, 30, "a 2/2 split")
    assert one.assignment().isdisjoint(two.assignment())

    lines = [f"line {i} of the first wave" for i in range(1000)]
    await produce_async(lines, bootstrap=kafka_bootstrap, topic=topic, partitions=4)
    await until(lambda: len(c1.records) + len(c2.records) >= len(lines), 30, "every record")
    await asyncio.sleep(0.5)  # anything delivered twice would show up now
    texts = [r.text for r in c1.records + c2.records]
    assert sorted(texts) == sorted(lines) and len(texts) == len(set(texts))
    assert c1.records and c2.records
    assert {(r.topic, r.partition) for r in c1.records} <= one.assignment()
    assert {(r.topic, r.partition) for r in c2.records} <= two.assignment()
    assert one.counters.records + two.counters.records == len(lines)
    assert one.counters.commits > 0 and two.counters.commits > 0
    assert all(lag == 0 for lag in {**one.lag(), **two.lag()}.values())
    await c1.stop()
    await c2.stop()

    # A new member of the same group starts from the committed offsets: only the second wave arrives.
    three = KafkaStream(settings(kafka_bootstrap, topic, group))
    await three.start()
    c3 = Collector(three)
    second = [f"line {i} of the second wave" for i in range(100)]
    await produce_async(second, bootstrap=kafka_bootstrap, topic=topic, partitions=4)
    await until(lambda: len(c3.records) >= len(second), 30, "the second wave")
    await asyncio.sleep(0.5)
    await c3.stop()
    assert sorted(r.text for r in c3.records) == sorted(second)


async def test_malformed_records_are_counted_skipped_and_committed(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=1)
    group = f"bad-{uuid.uuid4().hex[:8]}"
    values = [b"good one", b"", b"\xff\xfe not utf-8", b"   \n ", b"x" * 300, "good two, naïve café".encode(),
              b"\xc3\x28", b""]  # ends with a run of malformed records only
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    for value in values:
        await producer.send_and_wait(topic, value, partition=0)
    await producer.stop()

    registry = Registry()
    stream = KafkaStream(settings(kafka_bootstrap, topic, group, max_record_bytes=200), metrics=registry)
    await stream.start()
    collector = Collector(stream)
    await until(lambda: stream.counters.malformed_total == 6, 30, "every malformed record to be counted")
    await until(lambda: stream.committed().get((topic, 0)) == len(values), 10, "the commit past the tail")
    await collector.stop()

    assert [r.text for r in collector.records] == ["good one", "good two, naïve café"]
    assert [r.offset for r in collector.records] == [0, 5]
    # a text stream never counts the JSON records' reasons
    assert stream.counters.malformed == {"invalid_utf8": 2, "empty": 3, "too_large": 1,
                                         "invalid_json": 0, "missing_field": 0, "wrong_type": 0}
    rendered = registry.render()
    assert 'livevec_stream_malformed_total{reason="invalid_utf8"} 2.0' in rendered
    assert "livevec_stream_records_total 2.0" in rendered
    # Their offsets count as processed: the group will not read them again.
    assert (await committed_offset(kafka_bootstrap, topic, group)) == len(values)
    again = KafkaStream(settings(kafka_bootstrap, topic, group, max_record_bytes=200))
    await again.start()
    assert await again.next_batch(timeout=3.0) is None
    assert again.counters.malformed_total == 0
    await again.stop()


async def test_seek_to_restarts_partitions_at_checkpoint_offsets(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=2)
    lines = [f"record {i}" for i in range(200)]
    await produce_async(lines, bootstrap=kafka_bootstrap, topic=topic, partitions=2)
    group = f"seek-{uuid.uuid4().hex[:8]}"

    # Sought before start: applied when the partitions are assigned.
    stream = KafkaStream(settings(kafka_bootstrap, topic, group))
    await stream.seek_to({(topic, 0): 90, (topic, 1): 95})
    await stream.start()
    collector = Collector(stream)
    await until(lambda: len(collector.records) == 15, 30, "the records after the sought offsets")
    assert min(r.offset for r in collector.records if r.partition == 0) == 90
    assert min(r.offset for r in collector.records if r.partition == 1) == 95
    assert stream.positions() == {(topic, 0): 100, (topic, 1): 100}

    # Sought while assigned: rewinds at once, and the processed frontier moves back with it.
    before = len(collector.records)
    await stream.seek_to({(topic, 1): 98})
    await until(lambda: len(collector.records) == before + 2, 30, "the rewound records")
    assert [r.offset for r in collector.records[before:]] == [98, 99]
    await collector.stop()
    assert (await committed_offset(kafka_bootstrap, topic, group, 1)) == 100


async def test_a_seek_for_a_partition_held_elsewhere_is_not_applied_after_a_later_rebalance(kafka_bootstrap, kafka_topic):
    """A rollback seeks every partition on every worker. One that another worker holds is sought by
    that owner; if it later moves here, rewinding it to the old offset would retrain what the owner
    trained since the rollback (a checkpoint could then hold records trained twice)."""
    topic = kafka_topic(partitions=2)
    group = f"stale-seek-{uuid.uuid4().hex[:8]}"
    await produce_async([f"s{i}" for i in range(100)], bootstrap=kafka_bootstrap, topic=topic, partitions=2)
    one = KafkaStream(settings(kafka_bootstrap, topic, group, batch_records=10))
    two = KafkaStream(settings(kafka_bootstrap, topic, group, batch_records=10))
    await one.start()
    await two.start()
    c1, c2 = Collector(one), Collector(two)
    await until(lambda: len(one.assignment()) == 1 and len(two.assignment()) == 1, 30, "one partition each")
    await until(lambda: len(c1.records) + len(c2.records) == 100, 30, "every record")
    assignments_before, seen_before = one.counters.assignments, len(c1.records)
    theirs = next(iter(two.assignment()))
    await one.seek_to({theirs: 0})      # not held here: the owner (two) is the one to seek it
    await c2.stop()                     # its partition moves to `one`, committed at its end
    await until(lambda: len(one.assignment()) == 2, 30, "the partition to move")
    assert one.counters.assignments > assignments_before
    await asyncio.sleep(2.0)
    assert not [r for r in c1.records[seen_before:] if (r.topic, r.partition) == theirs], "a stale seek rewound the moved partition"
    await c1.stop()


async def test_in_flight_batch_of_a_revoked_partition_is_dropped_not_committed(kafka_bootstrap, kafka_topic):
    topic = kafka_topic(partitions=2)
    group = f"revoke-{uuid.uuid4().hex[:8]}"
    await produce_async([f"r{i}" for i in range(40)], bootstrap=kafka_bootstrap, topic=topic, partitions=2)
    one = KafkaStream(settings(kafka_bootstrap, topic, group, batch_records=10, revoke_grace=0.5))
    await one.start()
    held = await one.next_batch(timeout=10)
    assert held is not None and one.is_current(held)
    # A second member joins; `one` is asked to give its partitions up while `held` is still being processed.
    two = KafkaStream(settings(kafka_bootstrap, topic, group, batch_records=10))
    await two.start()
    c2 = Collector(two)
    polling = asyncio.create_task(_poll(one))
    await until(lambda: one.counters.rebalances >= 1 and two.assignment(), 30, "the rebalance")
    assert not one.is_current(held)
    await one.mark_processed(held)  # too late: nothing is committed for it
    assert one.counters.stale_batches == 1 and one.counters.redelivered >= len(held.records)
    held_texts = {r.text for r in held.records if (r.topic, r.partition) in two.assignment()}
    await until(lambda: held_texts <= {r.text for r in c2.records}, 30, "the dropped records to be redelivered")
    polling.cancel()
    await c2.stop()
    await one.stop()


async def _poll(stream: KafkaStream):
    while True:
        batch = await stream.next_batch(timeout=0.2)
        if batch is not None:
            await stream.mark_processed(batch)


async def test_a_worker_started_before_its_topic_exists_waits_for_it(kafka_bootstrap):
    topic = f"late-{uuid.uuid4().hex[:8]}"
    stream = KafkaStream(settings(kafka_bootstrap, topic, f"late-{uuid.uuid4().hex[:8]}"))
    await stream.start()  # must not fail although the topic is missing
    collector = Collector(stream)
    await asyncio.sleep(0.5)
    await produce_async(["early bird", "second"], bootstrap=kafka_bootstrap, topic=topic, partitions=2)
    await until(lambda: len(collector.records) == 2, 30, "records of the topic created after the stream started")
    await collector.stop()
    assert sorted(r.text for r in collector.records) == ["early bird", "second"]
