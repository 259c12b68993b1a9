"""Text batches for the workers, from a Kafka consumer group (``KafkaStream``) or a file (``FileStream``).

Delivery is AT LEAST ONCE: offsets are committed only for batches the worker declares fully processed, so a
worker that dies mid-batch loses nothing; its uncommitted records go to whoever owns the partition next.

The interface (both classes; the streaming worker builds on it)::

    stream = KafkaStream(StreamSettings.from_env())      # or FileStream("corpus.txt.xz")
    await stream.start()                                 # joins the group (or opens the file)
    async for batch in stream:                           # Batch objects; ends only for a FileStream at EOF
        train(batch.texts)                               # list[str]: decoded, valid records
        await send_to_the_servers_and_wait_for_acks(...)
        await stream.mark_processed(batch)               # commits (per partition: last offset + 1)
    await stream.stop()                                  # commits what is done, leaves the group

What a batch holds is ``online.stream.batches.Batch``; how batches come, complete and restart is
``next_batch``, ``mark_processed`` and ``seek_to`` (checkpoint recovery, with ``positions``).

Counters (``stream.counters``): records, bytes, malformed by reason (``invalid_utf8``, ``empty``, ``too_large``,
``invalid_json``, ``missing_field``, ``wrong_type``),
batches, commits, commit_failures, rebalances, stale_batches, redelivered (records handed out but revoked
before completion), fetch_errors. ``stream.lag()`` is ``{(topic, partition): high watermark - processed
frontier}``. A topic that does not exist yet is picked up within seconds of its creation. Pass a
``ps_bridge.metrics.Registry`` as ``metrics=`` to export all of them (``livevec_stream_*``).

Malformed records (not UTF-8, empty or blank, over ``max_record_bytes``; with JSON records
(``online.stream.records``) also not JSON, without the field, or of the wrong type) are counted, logged
(rate limited) and skipped; never fatal. Their offsets count as processed so they are not read again and again.

Rebalances (a ``ConsumerRebalanceListener``): on revocation the stream waits up to ``revoke_grace`` seconds
for batches in flight to be marked processed and commits them, so a normal rebalance redelivers nothing; what
is still in flight after that is dropped and will be read again by the partition's next owner.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, ConsumerStoppedError, IllegalStateError, KafkaError

from online.stream.batches import (MALFORMED_REASONS, Batch, OffsetTracker, StreamCounters, TextRecord,
                                   TopicPartitionKey, decode_records)
from online.stream.client_logs import KafkaReachability, install
from online.stream.producer import DEFAULT_WORDS_PER_RECORD, RecordBuilder, TextSource
from online.stream.records import RecordFormat
from online.stream.security import check_kafka, client_options
from online.stream.settings import StreamSettings
from ps_bridge.structured_logging import log_event

logger = logging.getLogger("livevec.stream")



class _MalformedLog:
    """Logs the first few malformed records, then one in a thousand: a flood must not flood the log."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, reason: str, topic: str, partition: int, offset: int, size: int) -> None:
        self.count += 1
        if self.count <= 10 or self.count % 1000 == 0:
            log_event(logger, "malformed_record_skipped", level=logging.WARNING, reason=reason, topic=topic,
                      partition=partition, offset=offset, bytes=size, total=self.count)


class _StreamMetrics:
    def __init__(self, registry, stream: "_TextStreamBase"):
        self.registry = registry
        self.stream = stream
        self.records = registry.counter("livevec_stream_records_total", "valid text records handed to the worker")
        self.bytes = registry.counter("livevec_stream_bytes_total", "bytes of valid records handed to the worker")
        self.malformed = {r: registry.counter("livevec_stream_malformed_total", "records skipped as malformed",
                                              reason=r) for r in MALFORMED_REASONS}
        self.commits = registry.counter("livevec_stream_commits_total", "offset commits that succeeded")
        self.commit_failures = registry.counter("livevec_stream_commit_failures_total",
                                                "offset commits that failed (records will be redelivered)")
        self.rebalances = registry.counter("livevec_stream_rebalances_total", "consumer group rebalances")
        self.redelivered = registry.counter("livevec_stream_redelivered_total",
                                            "records handed out but revoked before they were processed")
        registry.gauge("livevec_stream_lag_records", "records behind the high watermark, all partitions",
                       fn=lambda: float(sum(stream.lag().values())))
        self._lag_gauges: set[TopicPartitionKey] = set()

    def partition_seen(self, tp: TopicPartitionKey) -> None:
        if tp not in self._lag_gauges:
            self._lag_gauges.add(tp)
            self.registry.gauge("livevec_stream_partition_lag_records", "records behind the high watermark",
                                fn=lambda tp=tp: float(self.stream.lag().get(tp, 0)),
                                topic=tp[0], partition=str(tp[1]))


class _TextStreamBase:
    """What KafkaStream and FileStream share: counters, batching of decoded records, completion bookkeeping."""

    exhausted = False

    def __init__(self, *, batch_records: int, max_record_bytes: int, metrics=None,
                 record_format: RecordFormat | None = None):
        self.batch_records = batch_records
        self.max_record_bytes = max_record_bytes
        self.record_format = record_format or RecordFormat()
        self.counters = StreamCounters()
        self.tracker = OffsetTracker()
        self._log_malformed = _MalformedLog()
        self._metrics = _StreamMetrics(metrics, self) if metrics is not None else None
        self._completed = asyncio.Event()

    def _build_batch(self, raw: list[tuple[str, int, int, bytes | None]]) -> Batch:
        """``raw``: (topic, partition, offset, value) in offset order per partition."""
        records: list[TextRecord] = []
        ranges: dict[TopicPartitionKey, tuple[int, int]] = {}
        malformed = 0
        nbytes = 0
        decoded = decode_records([value for _t, _p, _o, value in raw], self.max_record_bytes, self.record_format)
        for (topic, partition, offset, value), (text, reason) in zip(raw, decoded):
            tp = (topic, partition)
            start, _end = ranges.get(tp, (offset, offset))
            ranges[tp] = (start, offset + 1)
            if reason is not None:
                malformed += 1
                self.counters.malformed[reason] += 1
                if self._metrics:
                    self._metrics.malformed[reason].inc()
                self._log_malformed(reason, topic, partition, offset, len(value or b""))
                continue
            records.append(TextRecord(topic, partition, offset, text))
            nbytes += len(value)
        batch = self.tracker.new_batch(records, ranges, malformed, nbytes)
        self.counters.records += len(records)
        self.counters.bytes += nbytes
        self.counters.batches += 1
        if self._metrics:
            self._metrics.records.inc(len(records))
            self._metrics.bytes.inc(nbytes)
            for tp in ranges:
                self._metrics.partition_seen(tp)
        return batch

    def is_current(self, batch: Batch) -> bool:
        """False once a partition of the batch was revoked or sought: finishing it commits nothing."""
        return self.tracker.is_current(batch)

    def positions(self) -> dict[TopicPartitionKey, int]:
        """Processed frontier per partition, ``{(topic, partition): next_offset}``: the offsets to store with a
        checkpoint."""
        return self.tracker.positions()

    def committed(self) -> dict[TopicPartitionKey, int]:
        """Offsets this stream committed (Kafka) or would have (file), per partition it still tracks."""
        return self.tracker.committed()

    async def mark_processed(self, batch: Batch) -> None:
        """The worker finished ``batch`` (trained, and on the servers): its offsets may be committed.

        Batches may be completed out of order (a worker that prefetches): per partition the committed offset
        only advances over a contiguous run of completed batches. A batch whose partitions were revoked in
        between is ignored (``is_current`` tells beforehand): its records are redelivered to the new owner."""
        await self.mark_all_processed([batch])

    async def mark_all_processed(self, batches: list[Batch]) -> None:
        """``mark_processed`` for several batches, with one commit."""
        offsets: dict[TopicPartitionKey, int] = {}
        for batch in batches:
            done, stale = self.tracker.complete(batch)
            if stale:
                self.counters.stale_batches += 1
                log_event(logger, "stale_batch_completed", level=logging.INFO, batch=batch.id, records=len(batch))
            offsets.update(done)
        if offsets:
            await self._commit(offsets)
        self._completed.set()

    async def commit(self) -> None:
        """Commit every processed offset not committed yet (``mark_processed`` already does; this retries)."""
        offsets = self.tracker.uncommitted()
        if offsets:
            await self._commit(offsets)

    async def _commit(self, offsets: dict[TopicPartitionKey, int]) -> None:
        self.tracker.mark_committed(offsets)
        self.counters.commits += 1
        if self._metrics:
            self._metrics.commits.inc()

    async def _wait_for_outstanding(self, tps, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.tracker.has_outstanding(tps):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._completed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._completed.wait(), remaining)

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        while not self.exhausted:
            batch = await self.next_batch()
            if batch is not None:
                yield batch

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # implemented by subclasses
    async def start(self) -> None:  # pragma: no cover
        raise NotImplementedError

    async def stop(self) -> None:  # pragma: no cover
        raise NotImplementedError

    async def next_batch(self, max_records: int | None = None, timeout: float = 1.0) -> Batch | None:
        """At most ``max_records`` (default ``batch_records``) records; None when nothing arrived within
        ``timeout`` seconds (or, for a FileStream, at end of file: then ``exhausted`` is True). A batch whose
        records were all malformed comes out too, with no records and its ``ranges``: the consumer completes
        it in order with the others, so that whatever it reports per batch (the workers' ledger, checkpoint
        positions) covers those offsets as well."""
        raise NotImplementedError  # pragma: no cover


# ----------------------------------------------------------------------------- Kafka

class KafkaStream(_TextStreamBase):
    """A member of a Kafka consumer group that yields text batches; see the module docstring."""

    def __init__(self, settings: StreamSettings, *, metrics=None, consumer_options: dict | None = None):
        super().__init__(batch_records=settings.batch_records, max_record_bytes=settings.max_record_bytes,
                         metrics=metrics, record_format=settings.records)
        self.settings = settings
        self._consumer_options = dict(consumer_options or {})
        self._consumer = None
        self._pending_seeks: dict[TopicPartitionKey, int] = {}
        self._between_generations = True   # from start or a revocation until the next assignment
        self._assignment: set[TopicPartitionKey] = set()
        self._started = False
        self._registry = metrics
        self.health: KafkaReachability | None = None   # the brokers answer? (online.stream.client_logs)

    # -- lifecycle
    async def check(self) -> None:
        """Connect to the brokers as the consumer will, before joining the group: a wrong password, an untrusted
        CA or the wrong protocol raises ``SettingError`` naming the setting (``online.stream.security``)."""
        await check_kafka(self.settings.bootstrap, self.settings.security, client_id=self.settings.client_id)

    async def start(self) -> None:
        install(self.settings.client_logs)   # from the first connection on, the client's lines are summarised
        await self.check()
        options = dict(
            **client_options(self.settings.security),
            bootstrap_servers=self.settings.bootstrap, group_id=self.settings.group,
            client_id=self.settings.client_id, enable_auto_commit=False,
            auto_offset_reset=self.settings.offset_reset, session_timeout_ms=self.settings.session_timeout_ms,
            heartbeat_interval_ms=max(1000, self.settings.session_timeout_ms // 3),
            max_poll_records=self.settings.batch_records, metadata_max_age_ms=5000,
            # Read records past the size limit too: they are skipped as malformed instead of stalling the
            # partition (a consumer that cannot fetch the next record would never move past it).
            max_partition_fetch_bytes=max(1024 * 1024, self.settings.max_record_bytes + 4096),
        )
        options.update(self._consumer_options)
        self._consumer = AIOKafkaConsumer(**options)
        # Subscribe after start: AIOKafkaConsumer.start() with a subscription fails when a topic does not exist
        # yet, while a worker may well start before anything was produced. The group picks the topic up on the
        # next metadata refresh (metadata_max_age_ms) once it exists.
        await self._consumer.start()
        self._consumer.subscribe(list(self.settings.topics), listener=_RebalanceListener(self))
        self._started = True
        # aiokafka's consumer has no public accessor for its client; its metadata requests are the check
        self.health = KafkaReachability(self._consumer._client, what="consumer", settings=self.settings.client_logs,
                                        registry=self._registry, bootstrap=self.settings.bootstrap)
        self.health.start()
        log_event(logger, "stream_started", bootstrap=self.settings.bootstrap, topics=",".join(self.settings.topics),
                  group=self.settings.group, security=self.settings.security.describe())

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self.exhausted = True
        with contextlib.suppress(Exception):
            await self.commit()
        if self.health is not None:
            await self.health.stop()
        await self._consumer.stop()
        log_event(logger, "stream_stopped", group=self.settings.group, records=self.counters.records,
                  malformed=self.counters.malformed_total, commits=self.counters.commits)

    # -- reading
    def assignment(self) -> set[TopicPartitionKey]:
        return set(self._assignment)

    async def next_batch(self, max_records: int | None = None, timeout: float = 1.0) -> Batch | None:
        deadline = time.monotonic() + timeout
        while self._started:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                fetched = await self._consumer.getmany(timeout_ms=int(remaining * 1000),
                                                       max_records=max_records or self.batch_records)
            except ConsumerStoppedError:
                return None
            except KafkaError as exc:  # the broker away for a moment: report, back off, let the worker go on
                self.counters.fetch_errors += 1
                log_event(logger, "fetch_failed", level=logging.WARNING, error=type(exc).__name__,
                          detail=str(exc)[:200])
                await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                return None
            raw = [(tp.topic, tp.partition, r.offset, r.value) for tp, records in fetched.items() for r in records]
            if raw:
                if self.health is not None:
                    self.health.saw_records()
                return self._build_batch(raw)   # records may be empty (all malformed): see the module docstring
            if time.monotonic() >= deadline:
                return None
        return None

    def lag(self) -> dict[TopicPartitionKey, int]:
        """High watermark minus processed frontier, for assigned partitions this member has read from."""
        out: dict[TopicPartitionKey, int] = {}
        if self._consumer is None:
            return out
        positions = self.tracker.positions()
        for topic, partition in list(self._assignment):
            high = self._consumer.highwater(TopicPartition(topic, partition))
            frontier = positions.get((topic, partition))
            if high is not None and frontier is not None:
                out[(topic, partition)] = max(0, high - frontier)
        return out

    async def beginning_offsets(self) -> dict[TopicPartitionKey, int]:
        """First offset still in the log of every partition of the subscribed topics, assigned or not
        (checkpoint recovery: a partition absent from a checkpoint had nothing trained, so it starts here)."""
        tps = [TopicPartition(topic, p) for topic in self.settings.topics
               for p in sorted(self._consumer.partitions_for_topic(topic) or ())]
        if not tps:
            return {}
        found = await self._consumer.beginning_offsets(tps)
        return {(tp.topic, tp.partition): int(off) for tp, off in found.items()}

    # -- committing
    async def _commit(self, offsets: dict[TopicPartitionKey, int]) -> None:
        mine = {tp: off for tp, off in offsets.items() if tp in self._assignment}
        if not mine:
            return  # between revocation and assignment: committed on assignment if the partition stays here
        try:
            await self._consumer.commit({TopicPartition(t, p): off for (t, p), off in mine.items()})
        except (CommitFailedError, IllegalStateError, KafkaError) as exc:
            self.counters.commit_failures += 1
            if self._metrics:
                self._metrics.commit_failures.inc()
            log_event(logger, "commit_failed", level=logging.WARNING, error=type(exc).__name__,
                      detail=str(exc)[:200], partitions=len(mine))
            return
        await super()._commit(mine)

    # -- seeking
    async def seek_to(self, offsets: Mapping[TopicPartitionKey, int]) -> None:
        """Checkpoint recovery: the next batches of these partitions start at the given offsets (now, or for a
        partition not assigned to this member, when it is)."""
        for (topic, partition), offset in offsets.items():
            if offset < 0:
                raise ValueError(f"offset for {topic}[{partition}] must be >= 0, got {offset}")
            tp = (topic, partition)
            if tp in self._assignment:
                self._consumer.seek(TopicPartition(topic, partition), offset)
                self.tracker.reset(tp, frontier=offset)
            elif self._between_generations:
                # Nobody holds it during a rebalance; whoever is assigned it next starts at the offset.
                self._pending_seeks[tp] = offset
            # else: another member holds it and seeks it itself. Keeping the offset for a later rebalance
            # would rewind what that owner trained meanwhile.
        log_event(logger, "stream_seek", partitions=len(offsets), pending=len(self._pending_seeks))

    # -- rebalance callbacks
    async def _on_revoked(self, revoked) -> None:
        tps = {(tp.topic, tp.partition) for tp in revoked}
        self.counters.rebalances += 1
        self._between_generations = True
        if self._metrics:
            self._metrics.rebalances.inc()
        if tps and self.settings.revoke_grace > 0 and self.tracker.has_outstanding(tps):
            await self._wait_for_outstanding(tps, self.settings.revoke_grace)
        offsets = self.tracker.uncommitted(tps)
        if offsets:
            await self._commit(offsets)
        dropped = self.tracker.outstanding_records(tps)
        if dropped:
            self.counters.redelivered += dropped
            if self._metrics:
                self._metrics.redelivered.inc(dropped)
        for tp in tps:
            self.tracker.forget(tp)  # in-flight batches become stale; the partition's next owner reads them
        self._assignment -= tps
        log_event(logger, "partitions_revoked", partitions=_fmt_tps(tps), dropped_in_flight=dropped)

    async def _on_assigned(self, assigned) -> None:
        tps = {(tp.topic, tp.partition) for tp in assigned}
        self.counters.assignments += 1
        self._assignment = set(tps)
        for tp in tps:
            if tp in self._pending_seeks:
                offset = self._pending_seeks.pop(tp)
                self._consumer.seek(TopicPartition(*tp), offset)
                self.tracker.reset(tp, frontier=offset)
            if self._metrics:
                self._metrics.partition_seen(tp)
        # A seek made during the rebalance covers only the partitions it handed out; the rest are other members'.
        self._pending_seeks.clear()
        self._between_generations = False
        log_event(logger, "partitions_assigned", partitions=_fmt_tps(tps))


def _fmt_tps(tps) -> str:
    return ",".join(f"{t}[{p}]" for t, p in sorted(tps)) or "-"


class _RebalanceListener(ConsumerRebalanceListener):
    def __init__(self, stream: KafkaStream):
        self.stream = stream

    async def on_partitions_revoked(self, revoked):
        await self.stream._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned):
        await self.stream._on_assigned(assigned)


# ----------------------------------------------------------------------------- file

class FileStream(_TextStreamBase):
    """The same interface over a text file (plain, .gz, .xz), for offline training and machines without Kafka.

    Records are built exactly as ``livevec produce`` builds them (same ``lines_per_record`` and
    ``words_per_record``), on one partition, 0, of a pseudo topic named after the file; a record's offset is
    its index, so ``seek_to`` and ``positions`` work as with Kafka. Nothing is committed anywhere.
    """

    def __init__(self, path: str | os.PathLike, *, batch_records: int = 500, lines_per_record: int = 1,
                 words_per_record: int = DEFAULT_WORDS_PER_RECORD, max_record_bytes: int = 1024 * 1024,
                 topic: str | None = None, metrics=None, record_format: RecordFormat | None = None):
        super().__init__(batch_records=batch_records, max_record_bytes=max_record_bytes, metrics=metrics,
                         record_format=record_format)
        if not self.record_format.is_text:
            # one JSON record per line, never grouped nor cut
            lines_per_record, words_per_record = 1, 0
        self.path = Path(path)
        self.topic = topic or self.path.name
        self.lines_per_record = lines_per_record
        self.words_per_record = words_per_record
        self._source: TextSource | None = None
        self._builder: RecordBuilder | None = None
        self._buffer: list[bytes] = []
        self._next_offset = 0
        self._input_done = False

    async def start(self) -> None:
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        if self._source is not None:
            self._source.close()
        self._source = TextSource(self.path)
        self._builder = RecordBuilder(self.lines_per_record, self.words_per_record)
        self._buffer = []
        self._next_offset = 0
        self._input_done = False
        self.exhausted = False

    async def stop(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def assignment(self) -> set[TopicPartitionKey]:
        return {(self.topic, 0)}

    def _read(self, n: int) -> list[bytes]:
        while len(self._buffer) < n and not self._input_done:
            lines = self._source.read_chunk()
            for line in lines:
                self._buffer.extend(self._builder.add(line))
            if self._source.eof:
                self._buffer.extend(self._builder.flush())
                self._input_done = True
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    async def next_batch(self, max_records: int | None = None, timeout: float = 1.0) -> Batch | None:
        values = await asyncio.to_thread(self._read, max_records or self.batch_records)
        if not values:
            self.exhausted = True
            return None
        first = self._next_offset
        self._next_offset += len(values)
        return self._build_batch([(self.topic, 0, first + i, v) for i, v in enumerate(values)])

    async def seek_to(self, offsets: Mapping[TopicPartitionKey, int]) -> None:
        for (topic, partition), offset in offsets.items():
            if (topic, partition) != (self.topic, 0):
                raise ValueError(f"a FileStream has one partition, ({self.topic!r}, 0); got ({topic!r}, {partition})")
            if offset < 0:
                raise ValueError(f"offset must be >= 0, got {offset}")
            await asyncio.to_thread(self._skip_to, offset)
            self.tracker.reset((self.topic, 0), frontier=offset)

    def _skip_to(self, offset: int) -> None:
        if offset < self._next_offset:
            self._open()
        while self._next_offset < offset:
            got = self._read(min(10000, offset - self._next_offset))
            if not got:
                break
            self._next_offset += len(got)

    def lag(self) -> dict[TopicPartitionKey, int]:
        return {(self.topic, 0): len(self._buffer)}
