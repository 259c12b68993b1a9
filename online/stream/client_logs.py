"""The Kafka client's own log lines, summarised, and whether the brokers answer: ``kafka_unreachable since=T``.

Why: aiokafka logs every failed connect, fetch, heartbeat and coordinator lookup at ERROR, and retries each many
times a second. A broker restarted for a minute makes each worker write 5,000 - 8,000 such lines (about 80 a
second), while no line of the client says what happened. An operator's log pipeline drowns in that
and an alert on "error lines" fires for the wrong reason.

What this module does, in every process that runs a Kafka client (the workers' consumer, ``livevec produce``):

* ``ClientLogGate``, a ``logging.Handler`` installed on the ``aiokafka`` and ``kafka`` loggers (which then stop
  propagating; the gate forwards what it lets through to the root logger's handlers, so formats and levels stay
  the operator's). Lines below WARNING pass untouched. Warning and error lines pass while the brokers are
  reachable, at most ``LIVEVEC_KAFKA_CLIENT_LOG_BURST`` per ``LIVEVEC_KAFKA_LOG_SUMMARY_INTERVAL`` (so the first
  lines of any new trouble are seen as they are); beyond that, and all along an outage, they are counted
  (``livevec_kafka_client_log_lines_suppressed_total``) and the newest is kept as the "last error".
* ``KafkaReachability``, one per client: the reachability state, from something real rather than from counting
  log lines. It asks the brokers for metadata on the client's own connections (``fetch_all_metadata``: the
  same TLS and SASL as the client, any broker of the cluster may answer) every ``LIVEVEC_KAFKA_CHECK_INTERVAL``
  seconds, every second while they do not answer, and at once (at most once a second) when the client logs a
  warning or an error, or when records arrive during an outage. Two failed checks in a row (a second apart) make
  the state "unreachable" (``since`` is the first client error line since the last good check, or the first
  failed check); two good ones make it "reachable" again (a restarting broker may answer once, then not). Why a metadata check and not the consumer's fetches: a worker with nothing to read
  fetches nothing that succeeds, a producer has no fetches at all, and aiokafka retries internally without
  telling its caller. One dead broker of three is not an outage (another answers the metadata request), which
  is what a rolling restart should look like; the gate still caps that broker's connection errors.
* Its lines, through ``log_event`` (livevec's own): ``kafka_unreachable`` (error; ``since``, the client's
  ``last_error``), ``kafka_still_unreachable`` (warning; at most one per summary interval, a minute by
  default, with the lines suppressed since the last one and in all), ``kafka_reachable`` (info; the outage's
  ``seconds`` and the client lines it ``suppressed``), and ``kafka_client_lines_suppressed`` (warning; at most
  one per interval) when lines were capped while the brokers answered. On ``/metrics``: ``livevec_kafka_reachable``
  (1/0) and the suppressed counter.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from ps_bridge.settings import Setting, SettingGroup
from ps_bridge.structured_logging import log_event

logger = logging.getLogger("livevec.kafka")

CLIENT_LOGGERS = ("aiokafka", "kafka")

KAFKA_CLIENT_LOGS = SettingGroup("Kafka client logs and reachability", (
    Setting("check_interval", "LIVEVEC_KAFKA_CHECK_INTERVAL", float, 5.0, minimum=0.5, maximum=300.0, flags=(),
            help="seconds between metadata requests that check the brokers answer (every second while they do "
                 "not, and at once after a client error line)"),
    Setting("summary_interval", "LIVEVEC_KAFKA_LOG_SUMMARY_INTERVAL", float, 60.0, minimum=1.0, maximum=86400.0,
            flags=(), help="at most one kafka_still_unreachable (or kafka_client_lines_suppressed) line this often"),
    Setting("burst", "LIVEVEC_KAFKA_CLIENT_LOG_BURST", int, 10, minimum=0, maximum=100_000, flags=(),
            help="the Kafka client's own warning/error lines shown per summary interval while the brokers answer; "
                 "the rest are counted (all of them during an outage)"),
))


@dataclass(frozen=True)
class ClientLogSettings:
    check_interval: float = 5.0
    summary_interval: float = 60.0
    burst: int = 10

    @classmethod
    def from_args(cls, args: argparse.Namespace | None, env: Mapping[str, str] | None = None) -> "ClientLogSettings":
        return cls(**KAFKA_CLIENT_LOGS.read(args, os.environ if env is None else env))


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


class ClientLogGate(logging.Handler):
    """The process's one handler on the Kafka client's loggers; see the module docstring."""

    def __init__(self, settings: ClientLogSettings):
        super().__init__(logging.NOTSET)
        self.settings = settings
        self._watchers: weakref.WeakSet[KafkaReachability] = weakref.WeakSet()
        self._counters: list = []
        self._lock = threading.Lock()
        self.suppressed = 0            # in all, since the process started
        self.passed = 0
        self.last_error: str | None = None
        self._window_start = time.monotonic()
        self._window_passed = 0
        self._capped = 0               # suppressed while reachable, not yet summarised

    def add_counter(self, counter) -> None:
        self._counters.append(counter)
        counter.inc(self.suppressed)

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING:
            self._forward(record)
            return
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not break logging
            message = str(record.msg)
        now = time.time()
        watchers = list(self._watchers)
        with self._lock:
            self.last_error = f"{record.name}: {message}"[:300]
            outage = any(not w.reachable for w in watchers)
            mono = time.monotonic()
            if mono - self._window_start >= self.settings.summary_interval:
                self._window_start, self._window_passed = mono, 0
            show = not outage and self._window_passed < self.settings.burst
            if show:
                self._window_passed += 1
                self.passed += 1
            else:
                self.suppressed += 1
                if not outage:
                    self._capped += 1
        for w in watchers:
            w.client_error(now)
        if show:
            self._forward(record)
        else:
            for counter in self._counters:
                counter.inc()

    def take_capped(self) -> int:
        with self._lock:
            capped, self._capped = self._capped, 0
            return capped

    @staticmethod
    def _forward(record: logging.LogRecord) -> None:
        logging.getLogger().handle(record)


_gate: ClientLogGate | None = None
_gate_lock = threading.Lock()


def install(settings: ClientLogSettings | None = None) -> ClientLogGate:
    """The process's gate, installed on the first call (later calls return it; the first settings hold)."""
    global _gate
    with _gate_lock:
        if _gate is None:
            _gate = ClientLogGate(settings or ClientLogSettings())
            for name in CLIENT_LOGGERS:
                client_logger = logging.getLogger(name)
                client_logger.addHandler(_gate)
                client_logger.propagate = False
        return _gate


def uninstall() -> None:
    """Give the client's loggers back their own propagation (tests)."""
    global _gate
    with _gate_lock:
        if _gate is not None:
            for name in CLIENT_LOGGERS:
                client_logger = logging.getLogger(name)
                client_logger.removeHandler(_gate)
                client_logger.propagate = True
        _gate = None


class KafkaReachability:
    """Whether one Kafka client's brokers answer, checked with metadata requests; see the module docstring.

    ``client`` is an ``aiokafka.AIOKafkaClient`` (a consumer's ``_client``, a producer's ``client``); ``what``
    names it in the lines (``consumer``, ``producer``). ``start()`` runs the checks on the current event loop,
    ``stop()`` ends them. ``reachable`` starts True: the client was just started, which needs the brokers.
    """

    RETRY = 1.0   # seconds between checks while the brokers do not answer, and the least between two checks
    CONFIRM = 2   # checks in a row that change the state

    def __init__(self, client, *, what: str, settings: ClientLogSettings | None = None, registry=None,
                 gate: ClientLogGate | None = None, bootstrap: str = ""):
        self.client = client
        self.what = what
        self.bootstrap = bootstrap
        self.settings = settings or ClientLogSettings()
        self.gate = gate or install(self.settings)
        self.reachable = True
        self.since: float | None = None          # wall clock of the outage's start
        self.outages = 0
        self.checks = 0
        self.failed_checks = 0
        self._first_error: float | None = None   # first client error line since the last good check
        self._suppressed_at_start = 0
        self._suppressed_at_summary = 0
        self._last_summary = 0.0
        self._last_check = 0.0
        self._fails = self._goods = 0
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self.gate._watchers.add(self)
        if registry is not None:
            registry.gauge("livevec_kafka_reachable", "1 while the Kafka brokers answer metadata requests, 0 during "
                           "an outage", fn=lambda: 1.0 if self.reachable else 0.0, client=what)
            self.gate.add_counter(registry.counter(
                "livevec_kafka_client_log_lines_suppressed_total",
                "the Kafka client's own warning/error lines not written (counted; summarised in kafka_* lines)"))
            registry.gauge("livevec_kafka_unreachable_seconds", "seconds since the Kafka brokers stopped answering "
                           "(0 while they answer)", fn=self.outage_seconds, client=what)

    def outage_seconds(self) -> float:
        return 0.0 if self.reachable or self.since is None else max(0.0, time.time() - self.since)

    # -- evidence from the client
    def client_error(self, when: float) -> None:
        """A warning or error line of the client (any thread): note when trouble began, check soon."""
        if self._first_error is None:
            self._first_error = when
        self._poke()

    def saw_records(self) -> None:
        """Records arrived: if an outage is on, check now whether it is over."""
        if not self.reachable:
            self._poke()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        try:
            if asyncio.get_running_loop() is loop:
                wake.set()
                return
        except RuntimeError:
            pass
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(wake.set)

    # -- lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._last_check = time.monotonic()
        self._task = asyncio.create_task(self._run(), name=f"kafka-reachability-{self.what}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.gate._watchers.discard(self)
        if not self.reachable and await self._check() is None:
            self._good()   # a client stopping just after the brokers came back (a producer's last flush) says so
        if not self.reachable:
            log_event(logger, "kafka_still_unreachable", logging.WARNING, client=self.what, since=_iso(self.since),
                      seconds=round(self.outage_seconds(), 1), stopping=True,
                      suppressed=self.gate.suppressed - self._suppressed_at_start)

    # -- the checks
    async def _run(self) -> None:
        while True:
            settled = self.reachable and not self._fails
            interval = self.settings.check_interval if settled else self.RETRY
            due = self._last_check + interval
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, due - time.monotonic()))
            self._wake.clear()
            # a burst of client lines wakes this many times: at most one check a second
            await asyncio.sleep(max(0.0, self._last_check + self.RETRY - time.monotonic()))
            error = await self._check()
            self._last_check = time.monotonic()
            # Two checks in a row (a second apart) decide a change either way: a broker that restarts may
            # answer one request and fail the next while it registers, and that is one outage, not two.
            if error is None:
                self._fails, self._goods = 0, self._goods + 1
                if self.reachable or self._goods >= self.CONFIRM:
                    self._good()
            else:
                self._goods, self._fails = 0, self._fails + 1
                if self._first_error is None:
                    self._first_error = time.time()
                if not self.reachable or self._fails >= self.CONFIRM:
                    self._bad(error)
            self._summaries()

    async def _check(self) -> str | None:
        """None when a broker answered a metadata request, else what went wrong."""
        self.checks += 1
        try:
            await asyncio.wait_for(self.client.fetch_all_metadata(), timeout=max(5.0, self.settings.check_interval))
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure means the brokers did not answer
            self.failed_checks += 1
            return f"{type(exc).__name__}: {exc}"[:300]

    def _good(self) -> None:
        self._first_error = None
        if self.reachable:
            return
        self.reachable = True
        seconds = time.time() - (self.since or time.time())
        log_event(logger, "kafka_reachable", client=self.what, bootstrap=self.bootstrap, since=_iso(self.since),
                  seconds=round(seconds, 1), suppressed=self.gate.suppressed - self._suppressed_at_start,
                  failed_checks=self.failed_checks)
        self.since = None

    def _bad(self, error: str) -> None:
        if not self.reachable:
            return
        self.reachable = False
        self.outages += 1
        self.since = min(self._first_error or time.time(), time.time())
        self._suppressed_at_start = self._suppressed_at_summary = self.gate.suppressed
        self._last_summary = time.monotonic()
        log_event(logger, "kafka_unreachable", logging.ERROR, client=self.what, bootstrap=self.bootstrap,
                  since=_iso(self.since), last_error=self.gate.last_error or error, check=error)

    def _summaries(self) -> None:
        now = time.monotonic()
        if now - self._last_summary < self.settings.summary_interval:
            return
        if not self.reachable:
            self._last_summary = now
            total = self.gate.suppressed
            log_event(logger, "kafka_still_unreachable", logging.WARNING, client=self.what, since=_iso(self.since),
                      seconds=round(self.outage_seconds(), 1), suppressed=total - self._suppressed_at_summary,
                      suppressed_total=total - self._suppressed_at_start, last_error=self.gate.last_error)
            self._suppressed_at_summary = total
            return
        capped = self.gate.take_capped()
        if capped:
            self._last_summary = now
            log_event(logger, "kafka_client_lines_suppressed", logging.WARNING, client=self.what, suppressed=capped,
                      last_error=self.gate.last_error)
