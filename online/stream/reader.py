"""Text batches for the workers, from a Kafka consumer group (``KafkaStream``) or a file (``FileStream``).

Delivery is AT LEAST ONCE: offsets are committed only for batches the worker declares fully processed, so a
worker that dies mid-batch loses nothing; its uncommitted records go to whoever owns the partition next.

The interface (both classes; the streaming worker builds on it)::

    stream = KafkaStream(StreamSettings.from_env())      # or FileStream("corpus.txt.xz")
    await stream.start()                                 # joins the group (or opens the file)
    async for batch in stream:                           # Batch objects; ends only for a FileStream at EOF
        train(batch.texts)                               # list[str]: decoded, valid records
        await push_and_wait_for_acks(...)
        await stream.mark_processed(batch)               # commits (per partition: last offset + 1)
    await stream.stop()                                  # commits what is done, leaves the group

``Batch``
    ``records``: list of ``TextRecord(topic, partition, offset, text)``; ``texts``: just the strings;
    ``ranges``: ``{(topic, partition): (first_offset, end_offset)}`` covering every record handed out,
    malformed ones included; ``malformed``: how many were skipped. A record's text may hold several lines;
    each line is a sentence (see ``online.stream.producer``).

``await stream.next_batch(max_records=None, timeout=1.0) -> Batch | None``
    At most ``max_records`` (default ``settings.batch_records``) records; None when nothing arrived within
    ``timeout`` seconds (or, for a FileStream, at end of file: then ``stream.exhausted`` is True).

``await stream.mark_processed(batch)``
    Batches may be completed out of order (a worker that prefetches): per partition the committed offset only
    advances over a contiguous run of completed batches. A batch whose partitions were revoked in between is
    ignored (``stream.is_current(batch)`` tells beforehand): its records are redelivered to the new owner.

``await stream.seek_to({(topic, partition): offset, ...})``
    Checkpoint recovery: the next batches of those partitions start at ``offset``. Partitions not assigned to
    this member now are sought when they are assigned. ``stream.positions()`` returns the processed frontier
    ``{(topic, partition): next_offset}`` to store with a checkpoint.

Counters (``stream.counters``): records, bytes, malformed by reason (``invalid_utf8``, ``empty``, ``too_large``),
batches, commits, commit_failures, rebalances, stale_batches, redelivered (records handed out but revoked
before completion), fetch_errors. ``stream.lag()`` is ``{(topic, partition): high watermark - processed
frontier}``. A topic that does not exist yet is picked up within seconds of its creation. Pass a
``ps_bridge.metrics.Registry`` as ``metrics=`` to export all of them (``livevec_stream_*``).

Malformed records (not UTF-8, empty or blank, over ``max_record_bytes``) are counted, logged (rate limited)
and skipped; never fatal. Their offsets count as processed so they are not read again and again.

Rebalances (a ``ConsumerRebalanceListener``): on revocation the stream waits up to ``revoke_grace`` seconds
for batches in flight to be marked processed and commits them, so a normal rebalance redelivers nothing; what
is still in flight after that is dropped and will be read again by the partition's next owner.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, ConsumerStoppedError, IllegalStateError, KafkaError

from online.stream.producer import DEFAULT_WORDS_PER_RECORD, RecordBuilder, TextSource, validate_topic
from ps_bridge.structured_logging import log_event
from ps_bridge.settings import SettingError, current_env, env_float, env_int, env_str

logger = logging.getLogger("livevec.stream")

TopicPartitionKey = tuple[str, int]
MALFORMED_REASONS = ("invalid_utf8", "empty", "too_large")


# ----------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class StreamSettings:
    """What a worker's stream needs; every field has a ``LIVEVEC_KAFKA_*`` variable (flags win)."""

    bootstrap: str
    topics: tuple[str, ...]
    group: str = "livevec"
    batch_records: int = 500
    max_record_bytes: int = 1024 * 1024
    offset_reset: str = "earliest"
    session_timeout_ms: int = 10000
    revoke_grace: float = 5.0
    client_id: str = "livevec"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> "StreamSettings":
        env = dict(current_env() if env is None else env)
        names = {"bootstrap": "LIVEVEC_KAFKA_BOOTSTRAP", "topics": "LIVEVEC_KAFKA_TOPICS",
                 "group": "LIVEVEC_KAFKA_GROUP", "batch_records": "LIVEVEC_KAFKA_BATCH_RECORDS",
                 "max_record_bytes": "LIVEVEC_KAFKA_MAX_RECORD_BYTES", "offset_reset": "LIVEVEC_KAFKA_OFFSET_RESET",
                 "session_timeout_ms": "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS",
                 "revoke_grace": "LIVEVEC_KAFKA_REVOKE_GRACE", "client_id": "LIVEVEC_KAFKA_CLIENT_ID"}
        for key, value in overrides.items():
            if key not in names:
                raise TypeError(f"unknown StreamSettings field {key!r}")
            if value is not None:
                env[names[key]] = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
        bootstrap = env_str(env, "LIVEVEC_KAFKA_BOOTSTRAP", required=True).strip()
        for server in bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise SettingError("LIVEVEC_KAFKA_BOOTSTRAP", f"must be HOST:PORT[,HOST:PORT...], got {bootstrap!r}")
        topics = tuple(t.strip() for t in env_str(env, "LIVEVEC_KAFKA_TOPICS", required=True).split(",")
                       if t.strip())
        if not topics:
            raise SettingError("LIVEVEC_KAFKA_TOPICS", "must name at least one topic")
        for topic in topics:
            validate_topic(topic, "LIVEVEC_KAFKA_TOPICS")
        group = env_str(env, "LIVEVEC_KAFKA_GROUP", "livevec").strip()
        if not group:
            raise SettingError("LIVEVEC_KAFKA_GROUP", "must not be blank")
        reset = env_str(env, "LIVEVEC_KAFKA_OFFSET_RESET", "earliest").strip().lower()
        if reset not in ("earliest", "latest"):
            raise SettingError("LIVEVEC_KAFKA_OFFSET_RESET", f"must be earliest or latest, got {reset!r}")
        return cls(
            bootstrap=bootstrap, topics=topics, group=group,
            batch_records=env_int(env, "LIVEVEC_KAFKA_BATCH_RECORDS", 500, minimum=1, maximum=1_000_000),
            max_record_bytes=env_int(env, "LIVEVEC_KAFKA_MAX_RECORD_BYTES", 1024 * 1024, minimum=1),
            offset_reset=reset,
            # The broker accepts 6 s .. 30 min by default (group.min/max.session.timeout.ms).
            session_timeout_ms=env_int(env, "LIVEVEC_KAFKA_SESSION_TIMEOUT_MS", 10000, minimum=6000,
                                       maximum=1_800_000),
            revoke_grace=env_float(env, "LIVEVEC_KAFKA_REVOKE_GRACE", 5.0, minimum=0.0),
            client_id=env_str(env, "LIVEVEC_KAFKA_CLIENT_ID", "livevec"),
        )


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags mirroring the LIVEVEC_KAFKA_* variables; pass them to ``StreamSettings.from_args``."""
    g = parser.add_argument_group("Kafka input (flags override the environment variables)")
    g.add_argument("--kafka-bootstrap", help="LIVEVEC_KAFKA_BOOTSTRAP: HOST:PORT[,HOST:PORT...]")
    g.add_argument("--kafka-topics", help="LIVEVEC_KAFKA_TOPICS: comma-separated topics")
    g.add_argument("--kafka-group", help="LIVEVEC_KAFKA_GROUP: consumer group (livevec)")
    g.add_argument("--kafka-batch-records", type=int, help="LIVEVEC_KAFKA_BATCH_RECORDS: records per batch (500)")
    g.add_argument("--kafka-max-record-bytes", type=int,
                   help="LIVEVEC_KAFKA_MAX_RECORD_BYTES: larger records are skipped as malformed (1 MiB)")
    g.add_argument("--kafka-offset-reset", help="LIVEVEC_KAFKA_OFFSET_RESET: earliest|latest for a new group")


def stream_settings_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> StreamSettings:
    return StreamSettings.from_env(
        env, bootstrap=getattr(args, "kafka_bootstrap", None), topics=getattr(args, "kafka_topics", None),
        group=getattr(args, "kafka_group", None), batch_records=getattr(args, "kafka_batch_records", None),
        max_record_bytes=getattr(args, "kafka_max_record_bytes", None),
        offset_reset=getattr(args, "kafka_offset_reset", None))


# ----------------------------------------------------------------------------- batches and bookkeeping

@dataclass(frozen=True)
class TextRecord:
    topic: str
    partition: int
    offset: int
    text: str


@dataclass
class Batch:
    id: int
    records: list[TextRecord]
    ranges: dict[TopicPartitionKey, tuple[int, int]]
    malformed: int = 0
    bytes: int = 0
    epochs: dict[TopicPartitionKey, int] = field(default_factory=dict, repr=False)

    @property
    def texts(self) -> list[str]:
        return [r.text for r in self.records]

    def __len__(self) -> int:
        return len(self.records)


@dataclass
class StreamCounters:
    records: int = 0
    bytes: int = 0
    malformed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MALFORMED_REASONS, 0))
    batches: int = 0
    commits: int = 0
    commit_failures: int = 0
    rebalances: int = 0
    stale_batches: int = 0
    redelivered: int = 0
    fetch_errors: int = 0

    @property
    def malformed_total(self) -> int:
        return sum(self.malformed.values())


def decode_record(value: bytes | None, max_bytes: int) -> tuple[str | None, str | None]:
    """``(text, None)`` for a usable record, ``(None, reason)`` for a malformed one."""
    if value is None or len(value) == 0:
        return None, "empty"
    if len(value) > max_bytes:
        return None, "too_large"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return None, "invalid_utf8"
    if not text.strip():
        return None, "empty"
    return text, None


class _PartitionProgress:
    """Offsets handed out but not yet processed, for one partition, in offset order."""

    def __init__(self, epoch: int):
        self.epoch = epoch
        self.outstanding: OrderedDict[int, tuple[int, int]] = OrderedDict()  # batch id -> (start, end)
        self.done: set[int] = set()
        self.frontier: int | None = None   # everything below is processed
        self.committed: int | None = None  # last offset committed to Kafka

    def advance(self) -> int | None:
        while self.outstanding:
            batch_id, (start, end) = next(iter(self.outstanding.items()))
            if batch_id not in self.done:
                break
            self.outstanding.popitem(last=False)
            self.done.discard(batch_id)
            self.frontier = end
        return self.frontier


class OffsetTracker:
    """Which offsets may be committed, given batches completed in any order; pure bookkeeping (unit-tested).

    A partition's epoch changes when it is revoked or sought: batches of an older epoch no longer count.
    """

    def __init__(self) -> None:
        self._partitions: dict[TopicPartitionKey, _PartitionProgress] = {}
        self._epoch = 0
        self._next_batch_id = 0

    def _progress(self, tp: TopicPartitionKey) -> _PartitionProgress:
        progress = self._partitions.get(tp)
        if progress is None:
            self._epoch += 1
            progress = self._partitions[tp] = _PartitionProgress(self._epoch)
        return progress

    def new_batch(self, records: list[TextRecord], ranges: dict[TopicPartitionKey, tuple[int, int]],
                  malformed: int = 0, nbytes: int = 0) -> Batch:
        self._next_batch_id += 1
        batch = Batch(self._next_batch_id, records, ranges, malformed, nbytes)
        for tp, (start, end) in ranges.items():
            progress = self._progress(tp)
            if progress.frontier is None:
                progress.frontier = start
            progress.outstanding[batch.id] = (start, end)
            batch.epochs[tp] = progress.epoch
        return batch

    def is_current(self, batch: Batch) -> bool:
        return all(tp in self._partitions and self._partitions[tp].epoch == epoch
                   for tp, epoch in batch.epochs.items())

    def complete(self, batch: Batch) -> tuple[dict[TopicPartitionKey, int], bool]:
        """Mark done; return (offsets newly committable, whether any part of the batch was stale)."""
        stale = False
        out: dict[TopicPartitionKey, int] = {}
        for tp, epoch in batch.epochs.items():
            progress = self._partitions.get(tp)
            if progress is None or progress.epoch != epoch or batch.id not in progress.outstanding:
                stale = True
                continue
            progress.done.add(batch.id)
            before = progress.frontier
            frontier = progress.advance()
            if frontier != before and (progress.committed is None or frontier > progress.committed):
                out[tp] = frontier
        return out, stale

    def mark_committed(self, offsets: Mapping[TopicPartitionKey, int]) -> None:
        for tp, offset in offsets.items():
            progress = self._partitions.get(tp)
            if progress is not None and (progress.committed is None or offset > progress.committed):
                progress.committed = offset

    def uncommitted(self, tps=None) -> dict[TopicPartitionKey, int]:
        out = {}
        for tp, progress in self._partitions.items():
            if (tps is None or tp in tps) and progress.frontier is not None and (
                    progress.committed is None or progress.frontier > progress.committed):
                out[tp] = progress.frontier
        return out

    def outstanding_records(self, tps) -> int:
        return sum(end - start for tp in tps if tp in self._partitions
                   for start, end in self._partitions[tp].outstanding.values())

    def has_outstanding(self, tps) -> bool:
        return any(self._partitions[tp].outstanding for tp in tps if tp in self._partitions)

    def reset(self, tp: TopicPartitionKey, frontier: int | None = None, committed: int | None = None) -> None:
        """Forget in-flight batches of ``tp`` (they become stale); start over at ``frontier``."""
        self._epoch += 1
        progress = self._partitions[tp] = _PartitionProgress(self._epoch)
        progress.frontier = frontier
        progress.committed = committed

    def forget(self, tp: TopicPartitionKey) -> None:
        self._partitions.pop(tp, None)

    def positions(self) -> dict[TopicPartitionKey, int]:
        return {tp: p.frontier for tp, p in self._partitions.items() if p.frontier is not None}

    def committed(self) -> dict[TopicPartitionKey, int]:
        return {tp: p.committed for tp, p in self._partitions.items() if p.committed is not None}

    def partitions(self) -> list[TopicPartitionKey]:
        return list(self._partitions)


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

    def __init__(self, *, batch_records: int, max_record_bytes: int, metrics=None):
        self.batch_records = batch_records
        self.max_record_bytes = max_record_bytes
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
        for topic, partition, offset, value in raw:
            tp = (topic, partition)
            start, _end = ranges.get(tp, (offset, offset))
            ranges[tp] = (start, offset + 1)
            text, reason = decode_record(value, self.max_record_bytes)
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
        """Processed frontier per partition: the offsets to store with a checkpoint."""
        return self.tracker.positions()

    def committed(self) -> dict[TopicPartitionKey, int]:
        """Offsets this stream committed (Kafka) or would have (file), per partition it still tracks."""
        return self.tracker.committed()

    async def mark_processed(self, batch: Batch) -> None:
        """The worker finished ``batch`` (trained and pushed): its offsets may be committed."""
        offsets, stale = self.tracker.complete(batch)
        if stale:
            self.counters.stale_batches += 1
            log_event(logger, "stale_batch_completed", level=logging.INFO, batch=batch.id, records=len(batch))
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
        raise NotImplementedError  # pragma: no cover


# ----------------------------------------------------------------------------- Kafka

class KafkaStream(_TextStreamBase):
    """A member of a Kafka consumer group that yields text batches; see the module docstring."""

    def __init__(self, settings: StreamSettings, *, metrics=None, consumer_options: dict | None = None):
        super().__init__(batch_records=settings.batch_records, max_record_bytes=settings.max_record_bytes,
                         metrics=metrics)
        self.settings = settings
        self._consumer_options = dict(consumer_options or {})
        self._consumer = None
        self._pending_seeks: dict[TopicPartitionKey, int] = {}
        self._assignment: set[TopicPartitionKey] = set()
        self._started = False

    # -- lifecycle
    async def start(self) -> None:
        options = dict(
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
        log_event(logger, "stream_started", bootstrap=self.settings.bootstrap, topics=",".join(self.settings.topics),
                  group=self.settings.group)

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self.exhausted = True
        with contextlib.suppress(Exception):
            await self.commit()
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
                batch = self._build_batch(raw)
                if batch.records:
                    return batch
                await self.mark_processed(batch)  # all malformed: done already, nothing for the worker
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
        """Next batches of these partitions start at the given offsets (now, or when assigned)."""
        for (topic, partition), offset in offsets.items():
            if offset < 0:
                raise ValueError(f"offset for {topic}[{partition}] must be >= 0, got {offset}")
            tp = (topic, partition)
            if tp in self._assignment:
                self._consumer.seek(TopicPartition(topic, partition), offset)
                self.tracker.reset(tp, frontier=offset)
            else:
                self._pending_seeks[tp] = offset
        log_event(logger, "stream_seek", partitions=len(offsets), pending=len(self._pending_seeks))

    # -- rebalance callbacks
    async def _on_revoked(self, revoked) -> None:
        tps = {(tp.topic, tp.partition) for tp in revoked}
        self.counters.rebalances += 1
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
        self._assignment = set(tps)
        for tp in tps:
            if tp in self._pending_seeks:
                offset = self._pending_seeks.pop(tp)
                self._consumer.seek(TopicPartition(*tp), offset)
                self.tracker.reset(tp, frontier=offset)
            if self._metrics:
                self._metrics.partition_seen(tp)
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
                 topic: str | None = None, metrics=None):
        super().__init__(batch_records=batch_records, max_record_bytes=max_record_bytes, metrics=metrics)
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
        while True:
            values = await asyncio.to_thread(self._read, max_records or self.batch_records)
            if not values:
                self.exhausted = True
                return None
            first = self._next_offset
            self._next_offset += len(values)
            batch = self._build_batch([(self.topic, 0, first + i, v) for i, v in enumerate(values)])
            if batch.records:
                return batch
            await self.mark_processed(batch)

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
