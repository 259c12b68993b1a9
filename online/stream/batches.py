"""What a stream hands out and what it owes Kafka: records, batches, and the offset frontier.

Kept apart from the consumer so the at-least-once bookkeeping (which offsets may be
committed when batches finish out of order, or when partitions move) is plain code,
tested without a broker.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from online.stream.records import JSON_REASONS, RecordFormat

TopicPartitionKey = tuple[str, int]
MALFORMED_REASONS = ("invalid_utf8", "empty", "too_large", *JSON_REASONS)


class TextRecord(NamedTuple):
    """One per record of a batch: a tuple, where a frozen dataclass cost 0.6 us to build (0.1 us a token on a
    stream of short ID sessions)."""
    topic: str
    partition: int
    offset: int
    text: str           # or a token-list record (a JSON record's list of items, ``online.stream.records``)


@dataclass
class Batch:
    """Records handed out together. ``records``: ``TextRecord(topic, partition, offset, text)`` each, a text
    of one or more lines, each line a sentence (``online.stream.producer``); ``texts``: just the strings;
    ``ranges``: ``{(topic, partition): (first_offset, end_offset)}`` covering every record handed out,
    malformed ones included; ``malformed``: how many were skipped."""

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
    assignments: int = 0      # partitions handed to this consumer (the end of a rebalance)
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
    if text[0] == "\x1e":      # the mark of a token-list record (online.learner.tokenizers.TokenList): text it is
        text = " " + text[1:]
    return text, None


def decode_records(values: list[bytes | None], max_bytes: int,
                   record_format: RecordFormat) -> list[tuple[str | None, str | None]]:
    """What the stream makes of a batch of values: ``decode_record`` of each, then the record format.

    A JSON value is never decoded whole: the record format's scan checks the batch for UTF-8 in one call
    and cuts the fields out of the bytes, so a record of a few IDs costs no string of its own (one per
    record cost a sixth of such a stream's reading)."""
    if record_format.is_text:
        return [decode_record(v, max_bytes) for v in values]
    try:     # a value of blanks alone is the scan's to call empty, one not UTF-8 the record format's
        lengths = list(map(len, values))
        if lengths and 0 < min(lengths) and max(lengths) <= max_bytes:
            return record_format.extract_many(values)
    except TypeError:  # a None (a tombstone)
        pass
    reasons = [decode_record(v, max_bytes)[1] if not v or len(v) > max_bytes else None for v in values]
    extracted = iter(record_format.extract_many([v for v, reason in zip(values, reasons) if reason is None]))
    return [next(extracted) if reason is None else (None, reason) for reason in reasons]


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
