"""``livevec produce``: stream a text file (plain, .gz, .xz) or stdin into a Kafka topic.

A record is UTF-8 text; each line in it is one sentence for the learner. Input lines are passed through as
bytes (no decode/encode round trip: the consumers own validation, see ``online.stream.reader``), grouped
``lines_per_record`` to a record. Lines longer than ``words_per_record`` words are cut into chunks of that many
words first, like word2vec.c's 1000-word sentence cap: corpora such as wiki17m hold one whole article per line
(~16 KB), and records of a few KB keep partitions balanced and consumer batches small enough to commit often.

Python API (used by ``livevec up``, tests and benchmarks)::

    stats = produce(source, bootstrap="127.0.0.1:9092", topic="text", partitions=4)      # blocking
    stats = await produce_async(source, bootstrap=..., topic=...)                         # inside a loop
    await ensure_topic(bootstrap, topic, partitions)                                      # create if missing

``source`` is a path (``.gz``/``.xz`` recognised by their magic bytes), ``"-"`` for stdin, or any iterable of
``str``/``bytes`` lines. Records go round-robin over the partitions and are sent without awaiting each one;
aiokafka batches them (``linger_ms``, up to 1 MiB per partition batch). The call returns when every record is
acknowledged (acks=all) and raises ``ProduceError`` if any record was not. The producer is idempotent, so a
batch retried when a partition's leader moved (a broker restarting) is still written once.
"""
from __future__ import annotations

import asyncio
import gzip
import io
import logging
import lzma
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ps_bridge.structured_logging import log_event
from online.stream.client_logs import ClientLogSettings, KafkaReachability, install
from online.stream.security import check_kafka, client_options
from online.stream.settings import KafkaSecurity, validate_topic
from ps_bridge.settings import SettingError

logger = logging.getLogger("livevec.produce")

DEFAULT_PARTITIONS = 4
DEFAULT_WORDS_PER_RECORD = 1000
MAX_RECORD_BYTES = 1024 * 1024 - 512  # aiokafka's default max_request_size, less the record overhead
_XZ_MAGIC = b"\xfd7zXZ\x00"
_GZ_MAGIC = b"\x1f\x8b"
_READ_SIZE = 1 << 20


class ProduceError(RuntimeError):
    """Some records were not acknowledged by Kafka (the message says how many and why)."""


# ----------------------------------------------------------------------------- text -> records

def split_long_line(line: bytes, words_per_record: int) -> list[bytes]:
    """Cut a line into pieces of at most ``words_per_record`` whitespace-separated words (0 = never cut)."""
    if words_per_record <= 0 or line.count(b" ") < words_per_record:
        return [line]
    words = line.split()
    return [b" ".join(words[i:i + words_per_record]) for i in range(0, len(words), words_per_record)]


class RecordBuilder:
    """Turns lines (bytes, without the newline) into record values.

    Blank lines are skipped (counted in ``blank_lines``); ``flush`` returns the last, partial record. The same
    builder backs ``FileStream`` so that offline training sees exactly the records Kafka would carry.
    """

    def __init__(self, lines_per_record: int = 1, words_per_record: int = DEFAULT_WORDS_PER_RECORD):
        if lines_per_record < 1:
            raise SettingError("--lines-per-record", f"must be >= 1, got {lines_per_record}")
        if words_per_record < 0:
            raise SettingError("--words-per-record", f"must be >= 0 (0 = never cut lines), got {words_per_record}")
        self.lines_per_record = lines_per_record
        self.words_per_record = words_per_record
        self.lines = 0
        self.blank_lines = 0
        self._pending: list[bytes] = []

    def add(self, line: bytes) -> list[bytes]:
        line = line.rstrip(b"\r\n")
        if not line.strip():
            self.blank_lines += 1
            return []
        self.lines += 1
        out: list[bytes] = []
        for piece in split_long_line(line, self.words_per_record):
            self._pending.append(piece)
            if len(self._pending) >= self.lines_per_record:
                out.append(b"\n".join(self._pending))
                self._pending = []
        return out

    def flush(self) -> list[bytes]:
        if not self._pending:
            return []
        record, self._pending = b"\n".join(self._pending), []
        return [record]


class TextSource:
    """A binary line source over a file (plain, gzip or xz by magic bytes), stdin, or an iterable of lines.

    ``read_chunk`` returns whatever complete lines are available (one underlying ``read1``), so a slow pipe
    on stdin still gets its lines sent promptly. ``bytes_read`` and ``total_bytes`` (compressed, on disk) drive
    the progress bar.
    """

    def __init__(self, source: str | os.PathLike | Iterable[str | bytes]):
        self.name = "-"
        self.total_bytes: int | None = None
        self._raw = None
        self._stream = None
        self._lines: Iterator[str | bytes] | None = None
        self._rest = b""
        self.eof = False
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            if path == "-":
                self._raw = sys.stdin.buffer
            else:
                self.name = path
                try:
                    self._raw = open(path, "rb")
                    self.total_bytes = os.fstat(self._raw.fileno()).st_size
                except OSError as exc:
                    raise SettingError("FILE", f"cannot read {path}: {exc.strerror or exc}") from None
            self._stream = self._open_decompressed(self._raw)
        else:
            self.name = "<lines>"
            self._lines = iter(source)

    @staticmethod
    def _open_decompressed(raw):
        buffered = raw if hasattr(raw, "peek") else io.BufferedReader(raw)
        magic = buffered.peek(6)[:6]
        if magic.startswith(_XZ_MAGIC):
            return lzma.LZMAFile(buffered)
        if magic.startswith(_GZ_MAGIC):
            return gzip.GzipFile(fileobj=buffered)
        return buffered

    @property
    def bytes_read(self) -> int:
        if self._raw is None or self._raw is sys.stdin.buffer:
            return 0
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return 0

    def read_chunk(self) -> list[bytes]:
        """Next complete lines; [] only at end of input (then ``eof`` is True)."""
        if self.eof:
            return []
        if self._lines is not None:
            out = []
            for item in self._lines:
                out.append(item.encode("utf-8", "surrogateescape") if isinstance(item, str) else item)
                if len(out) >= 1024:
                    return out
            self.eof = True
            return out
        while True:
            try:
                data = self._stream.read1(_READ_SIZE)
            except (EOFError, OSError, lzma.LZMAError) as exc:
                raise SettingError("FILE", f"{self.name}: corrupt or truncated compressed input ({exc})") from None
            if not data:
                self.eof = True
                rest, self._rest = self._rest, b""
                return [rest] if rest else []
            data = self._rest + data
            lines = data.split(b"\n")
            self._rest = lines.pop()
            if lines:
                return lines

    def close(self) -> None:
        if self._stream is not None and self._stream is not self._raw:
            self._stream.close()
        if self._raw is not None and self._raw is not sys.stdin.buffer:
            self._raw.close()


# ----------------------------------------------------------------------------- topic admin

async def ensure_topic(bootstrap: str, topic: str, partitions: int = DEFAULT_PARTITIONS,
                       replication_factor: int = 1, timeout: float = 30.0,
                       security: KafkaSecurity | None = None) -> bool:
    """Create ``topic`` unless it exists; wait until every partition has a leader. True when it was created."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    validate_topic(topic)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000),
                                **client_options(security or KafkaSecurity()))
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(topic, partitions, replication_factor)])
        _name, code, message = response.topic_errors[0][:3]
        created = code == 0
        if code not in (0, 36):  # 36 = TOPIC_ALREADY_EXISTS
            raise ProduceError(f"cannot create topic {topic!r}: error {code} {message or ''}".strip())
        deadline = time.monotonic() + timeout
        while True:
            described = (await admin.describe_topics([topic]))[0]
            parts = described.get("partitions") or []
            if described.get("error_code", 0) == 0 and parts and all(p.get("leader", -1) >= 0 for p in parts):
                break
            if time.monotonic() > deadline:
                raise ProduceError(f"topic {topic!r} has no leader for every partition after {timeout:.0f} s")
            await asyncio.sleep(0.1)
        if not created and len(parts) != partitions:
            log_event(logger, "topic_exists_with_other_partition_count", level=logging.WARNING, topic=topic,
                      partitions=len(parts), requested=partitions)
        elif created:
            log_event(logger, "topic_created", topic=topic, partitions=partitions)
        return created
    finally:
        await admin.close()


# ----------------------------------------------------------------------------- progress

class ProgressBar:
    """One self-overwriting line on a terminal; a plain line every ``plain_every`` seconds otherwise."""

    def __init__(self, stream=None, width: int = 28, plain_every: float = 10.0):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.width = width
        self.every = 0.2 if self.tty else plain_every
        self._last = 0.0

    def update(self, stats: "ProduceStats", done: int, total: int | None, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.every:
            return
        self._last = now
        rate = stats.records_per_s
        mbs = stats.mb_per_s
        if total:
            frac = min(1.0, done / total)
            filled = int(frac * self.width)
            bar = "[" + "#" * filled + "." * (self.width - filled) + f"] {frac * 100:5.1f}% "
        else:
            bar = ""
        text = f"{bar}{stats.records:,} records  {rate:,.0f} records/s  {mbs:.1f} MB/s"
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._last:
            self.stream.write("\n")
            self.stream.flush()


# ----------------------------------------------------------------------------- producing

@dataclass
class ProduceStats:
    topic: str = ""
    records: int = 0        # acknowledged by Kafka
    lines: int = 0          # non-blank input lines
    blank_lines: int = 0
    bytes: int = 0          # record payload bytes acknowledged
    oversized: int = 0      # records over max_record_bytes, skipped
    failed: int = 0         # records Kafka did not acknowledge
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    _started: float = field(default_factory=time.monotonic, repr=False)

    @property
    def records_per_s(self) -> float:
        elapsed = self.seconds or (time.monotonic() - self._started)
        return self.records / elapsed if elapsed > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        elapsed = self.seconds or (time.monotonic() - self._started)
        return self.bytes / 1e6 / elapsed if elapsed > 0 else 0.0

    def summary(self) -> str:
        text = (f"produced {self.records:,} records ({self.lines:,} lines, {self.bytes / 1e6:.1f} MB) to "
                f"{self.topic} in {self.seconds:.1f} s: {self.records_per_s:,.0f} records/s, "
                f"{self.mb_per_s:.1f} MB/s")
        if self.oversized:
            text += f"; skipped {self.oversized} records over the size limit"
        if self.failed:
            text += f"; {self.failed} records FAILED"
        return text


class _Reader:
    """Reads and decompresses the input in a thread of its own, so that aiokafka's sender keeps running
    while it reads; hands the record values over a small queue."""

    def __init__(self, source: TextSource, builder: RecordBuilder):
        self.source, self.builder = source, builder
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=8)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._read, name="produce-reader", daemon=True)

    def start(self) -> None:
        self.thread.start()

    async def next_records(self) -> list[bytes] | None:
        """The next record values; None at the end of the input. An error of the reader is raised here."""
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def stop(self) -> bool:
        """Stop reading; whether the thread finished. It is unblocked if it waits on a full queue; one stuck
        on a silent stdin is a daemon thread and is left behind."""
        self.stopping.set()
        deadline = time.monotonic() + 2.0
        while self.thread.is_alive() and time.monotonic() < deadline:
            while not self.queue.empty():
                self.queue.get_nowait()
            await asyncio.sleep(0.01)
        return not self.thread.is_alive()

    def _read(self) -> None:
        try:
            while not self.stopping.is_set():
                lines = self.source.read_chunk()
                records = [r for line in lines for r in self.builder.add(line)]
                if self.source.eof:
                    records.extend(self.builder.flush())
                if records:
                    self._put(records)
                if self.source.eof:
                    break
            self._put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the async side, which re-raises it
            if not self.loop.is_closed():
                self._put(exc)

    def _put(self, item: list[bytes] | BaseException | None) -> None:
        asyncio.run_coroutine_threadsafe(self.queue.put(item), self.loop).result()


class _Sender:
    """Sends record values round-robin over the topic's partitions without awaiting each one, at most
    ``rate`` a second, and counts their acknowledgements into ``stats``."""

    ACK_TIMEOUT = 120.0   # seconds the last records may take to be acknowledged

    def __init__(self, producer, topic: str, partitions: list[int], stats: ProduceStats, max_record_bytes: int,
                 rate: float | None):
        self.producer, self.topic, self.partitions, self.stats = producer, topic, partitions, stats
        self.max_record_bytes, self.rate = max_record_bytes, rate
        self.sent = 0
        self.started = time.monotonic()
        self.in_flight: deque[tuple[asyncio.Future, int]] = deque()

    async def send(self, value: bytes) -> None:
        from aiokafka.errors import KafkaError

        if len(value) > self.max_record_bytes:
            self.stats.oversized += 1
            log_event(logger, "record_oversized_skipped", level=logging.WARNING, bytes=len(value),
                      limit=self.max_record_bytes)
            return
        await self._keep_to_rate()
        partition = self.partitions[self.sent % len(self.partitions)]
        try:
            fut = await self.producer.send(self.topic, value, partition=partition)
        except KafkaError as exc:
            self._failed(repr(exc))
            return
        self.sent += 1
        self.in_flight.append((fut, len(value)))

    async def _keep_to_rate(self) -> None:
        if self.rate is not None:
            ahead = self.started + self.sent / self.rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)

    def settle_acknowledged(self) -> None:
        """Count the records acknowledged so far, in the order they were sent."""
        while self.in_flight and self.in_flight[0][0].done():
            self._settle(*self.in_flight.popleft())

    async def settle_all(self) -> None:
        """Flush, wait for every acknowledgement (``ACK_TIMEOUT``) and count them; one not come is a failure."""
        await self.producer.flush()
        if self.in_flight:
            await asyncio.wait([fut for fut, _ in self.in_flight], timeout=self.ACK_TIMEOUT)
        for fut, size in self.in_flight:
            if fut.done():
                self._settle(fut, size)
            else:
                self._failed(f"no acknowledgement within {self.ACK_TIMEOUT:.0f} s")
        self.in_flight.clear()

    def _settle(self, fut: asyncio.Future, size: int) -> None:
        exc = fut.exception()
        if exc is None:
            self.stats.records += 1
            self.stats.bytes += size
        else:
            self._failed(repr(exc))

    def _failed(self, error: str) -> None:
        self.stats.failed += 1
        if len(self.stats.errors) < 5:
            self.stats.errors.append(error)


def _check_arguments(topic: str, partitions: int, rate: float | None) -> None:
    validate_topic(topic)
    if partitions < 1:
        raise SettingError("--partitions", f"must be >= 1, got {partitions}")
    if rate is not None and rate <= 0:
        raise SettingError("--rate", f"must be > 0 records/s, got {rate}")


async def _check_brokers(src: TextSource, bootstrap: str, security: KafkaSecurity, client_id: str | None) -> None:
    """The brokers take these TLS and SASL settings; else the input is closed and ``SettingError`` raised."""
    try:
        await check_kafka(bootstrap, security, client_id=client_id or "livevec-produce")
    except BaseException:
        src.close()
        raise


async def _start_producer(bootstrap: str, linger_ms: int, compression: str | None, security: KafkaSecurity,
                          client_id: str | None):
    from aiokafka import AIOKafkaProducer

    # idempotent: a batch retried after a leader moved (a broker restart) is written once, not twice
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=linger_ms,
                                max_batch_size=1024 * 1024, max_request_size=1024 * 1024,
                                compression_type=compression, request_timeout_ms=60000,
                                **({"client_id": client_id} if client_id else {}), **client_options(security))
    await producer.start()
    return producer


def _report_progress(stats: ProduceStats, builder: RecordBuilder, src: TextSource, bar: ProgressBar | None,
                     on_progress: Callable[[ProduceStats], None] | None) -> None:
    stats.lines, stats.blank_lines = builder.lines, builder.blank_lines
    if bar:
        bar.update(stats, src.bytes_read, src.total_bytes)
    if on_progress:
        on_progress(stats)


def _finish(stats: ProduceStats, builder: RecordBuilder, src: TextSource, bar: ProgressBar | None) -> ProduceStats:
    """The final counts, the last progress line and ``produce_done``; ``ProduceError`` if records failed."""
    stats.lines, stats.blank_lines = builder.lines, builder.blank_lines
    stats.seconds = time.monotonic() - stats._started
    if bar:
        bar.update(stats, src.total_bytes or 0, src.total_bytes, force=True)
        bar.close()
    log_event(logger, "produce_done", topic=stats.topic, records=stats.records, lines=stats.lines,
              bytes=stats.bytes, seconds=round(stats.seconds, 2), records_per_s=round(stats.records_per_s),
              mb_per_s=round(stats.mb_per_s, 1), oversized=stats.oversized, failed=stats.failed)
    if stats.failed:
        raise ProduceError(f"{stats.failed} of {stats.failed + stats.records} records were not acknowledged "
                           f"by Kafka, e.g. {'; '.join(stats.errors)}")
    return stats


async def produce_async(source: str | os.PathLike | Iterable[str | bytes], *, bootstrap: str, topic: str,
                        partitions: int = DEFAULT_PARTITIONS, rate: float | None = None,
                        lines_per_record: int = 1, words_per_record: int = DEFAULT_WORDS_PER_RECORD,
                        max_record_bytes: int = MAX_RECORD_BYTES, compression: str | None = None,
                        linger_ms: int = 20, create_topic: bool = True,
                        progress: bool | ProgressBar = False,
                        on_progress: Callable[[ProduceStats], None] | None = None,
                        security: KafkaSecurity | None = None, client_id: str | None = None,
                        client_logs: ClientLogSettings | None = None) -> ProduceStats:
    """Stream ``source`` into ``topic``; see the module docstring. Raises ProduceError if records failed.

    The Kafka client's own log lines are summarised, and an outage logged once (``online.stream.client_logs``,
    ``client_logs``: its settings, by default from the environment).

    ``security`` (TLS, SASL) is checked against the brokers first: a wrong password or an untrusted CA raises
    ``SettingError`` naming the setting before any record is read from the input or sent."""
    _check_arguments(topic, partitions, rate)
    builder = RecordBuilder(lines_per_record, words_per_record)
    security = security or KafkaSecurity()
    src = TextSource(source)   # a missing file is named before Kafka is contacted
    client_logs = client_logs or ClientLogSettings.from_args(None)
    install(client_logs)
    await _check_brokers(src, bootstrap, security, client_id)
    if create_topic:
        await ensure_topic(bootstrap, topic, partitions, security=security)
    bar = progress if isinstance(progress, ProgressBar) else (ProgressBar() if progress else None)
    stats = ProduceStats(topic=topic)
    producer = await _start_producer(bootstrap, linger_ms, compression, security, client_id)
    health = KafkaReachability(producer.client, what="producer", settings=client_logs, bootstrap=bootstrap)
    health.start()
    reader = _Reader(src, builder)
    try:
        topic_partitions = sorted(await producer.partitions_for(topic) or []) or list(range(partitions))
        reader.start()
        sender = _Sender(producer, topic, topic_partitions, stats, max_record_bytes, rate)
        while (values := await reader.next_records()) is not None:
            for value in values:
                await sender.send(value)
            sender.settle_acknowledged()
            _report_progress(stats, builder, src, bar, on_progress)
        await sender.settle_all()
    finally:
        if await reader.stop():
            src.close()
        await health.stop()
        await producer.stop()
    return _finish(stats, builder, src, bar)


def produce(source, **kwargs) -> ProduceStats:
    """Blocking form of :func:`produce_async` (also safe to call while another event loop runs)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(produce_async(source, **kwargs))
    box: dict = {}

    def target() -> None:
        try:
            box["stats"] = asyncio.run(produce_async(source, **kwargs))
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    thread = threading.Thread(target=target, name="produce")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["stats"]
