"""The periodic pull of changed rows from the model source into the front end's copy.

Every ``interval`` seconds: ask the source for ``changes_since(current version)``,
build the next snapshot in a worker thread (``ModelIndex.apply``) and swap it in (a large delta a
part at a time, ``MAX_DELTA_ROWS``). When the
source fails (servers restarting, network), the front end keeps answering from its last
copy; the failure is counted and logged, the retry interval backs off to at most
``max_backoff`` seconds, and ``/v1/stats`` shows how old the copy is and why.

Training statistics (``source.stats()``) are pulled by a separate task, so a slow stats
call never delays the model, and kept as a short history for the page's chart.
"""
from __future__ import annotations

import asyncio
import collections
import gc
import logging
import time
from typing import Any

from online.search.model_index import ModelHolder
from online.frontend.sources import ModelSource
from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend.sync")

HISTORY_POINTS = 300
# Rows a snapshot takes from one delta. A larger delta (the rows that changed during a 10M-word full load, 0.3 -
# 0.5M at 20,000 rows/s, or while the front end was starved of CPU: 1.6M rows) is applied and served a part at a
# time: each part's apply is bounded (8 - 15 µs a row at 10M words, so under a second), the served model moves
# forward with every part, and the rows a part leaves are reused once the next part is served, where one apply of
# 1.6M rows held them all and the rows' pool grew by half (a 5 GB copy at 10M words).
MAX_DELTA_ROWS = 65_536
# Seconds the first load may take: the source computes or reads the whole model (10M words: 15 - 30 s on a quiet
# core, past a minute on a busy one), and the sync's usual timeout cut it short, every retry from scratch.
FIRST_LOAD_TIMEOUT = 600.0
FREEZE_SHARE = 0.01     # of the wall time, at most, spent in the collection before a freeze


class ModelSync:
    def __init__(self, source: ModelSource, holder: ModelHolder, *, interval: float = 0.5,
                 stats_interval: float = 1.0, registry: Registry | None = None,
                 max_backoff: float = 5.0, timeout: float | None = None, freeze: bool = False):
        self.source = source
        self.holder = holder
        self.interval = interval
        self.stats_interval = stats_interval
        self.max_backoff = max(max_backoff, interval)
        self.timeout = timeout if timeout is not None else max(60.0, 20 * interval)
        self.first_load_timeout = timeout if timeout is not None else max(self.timeout, FIRST_LOAD_TIMEOUT)
        self.started_at = time.time()
        self.last_attempt_at: float | None = None
        self.last_success_at: float | None = None
        self.last_change_at: float | None = None
        self.last_sync_seconds: float | None = None
        self.last_full_sync_seconds: float | None = None
        self.last_delta_rows = 0
        self.syncs = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.last_error: str | None = None
        self.source_stats: dict[str, Any] = {}
        self.stats_at: float | None = None
        self.stats_errors = 0
        self.last_stats_error: str | None = None
        self.history: collections.deque = collections.deque(maxlen=HISTORY_POINTS)
        self._prev_words: tuple[float, float] | None = None
        self.applies = {"full": 0, "delta": 0}          # snapshots built (ModelIndex.apply), and their times
        self.apply_seconds = {"full": 0.0, "delta": 0.0}
        self.last_apply_seconds: dict[str, float | None] = {"full": None, "delta": None}
        self.max_apply_seconds = {"full": 0.0, "delta": 0.0}
        self._stopping = False
        self.freeze = freeze
        self.frozen_objects = 0                         # objects kept out of the cyclic collector (``_freeze_long_lived``)
        self._freeze_due = False                        # a full load was swapped in: freeze once its sync has returned
        self.freezes = 0
        self._next_freeze_at = 0.0                      # (monotonic) freezes take at most FREEZE_SHARE of the time
        registry = registry or Registry()
        self._m_syncs = registry.counter("livevec_frontend_syncs_total", "successful model syncs")
        self._m_errors = registry.counter("livevec_frontend_sync_errors_total",
                                          "model syncs that failed (the previous copy kept serving)")
        self._m_rows = registry.counter("livevec_frontend_synced_rows_total", "rows received from the source")
        self._m_seconds = registry.histogram("livevec_frontend_sync_seconds", "duration of one sync (pull + swap)")
        registry.gauge("livevec_frontend_model_version", "version of the model being served",
                       fn=lambda: float(self.holder.current.version))
        registry.gauge("livevec_frontend_vocab_size", "words in the model being served",
                       fn=lambda: float(self.holder.current.n))
        registry.gauge("livevec_frontend_seconds_since_sync", "age of the served copy (seconds since the "
                       "last successful sync)", fn=lambda: self.seconds_since_sync() or 0.0)
        registry.gauge("livevec_frontend_model_age_seconds", "seconds since the served copy last changed "
                       "(since the start before the first change)",
                       fn=lambda: time.time() - (self.last_change_at or self.started_at))

    # ------------------------------------------------------------------ model
    async def sync_once(self) -> bool:
        """One pull and swap; returns False (and keeps the old copy) if the source failed."""
        self.last_attempt_at = time.time()
        started = time.perf_counter()
        current = self.holder.current
        try:
            bound = self.timeout if self.holder.loaded else self.first_load_timeout
            async with asyncio.timeout(bound):          # not wait_for: on 3.11 it can swallow a cancel
                delta = await self.source.changes_since(current.version if self.holder.loaded else 0)
            if delta.full or len(delta) or len(delta.removed) or delta.version != current.version \
                    or current.needs_apply():             # new inverted-file lists wait to be installed
                for part in delta.parts(MAX_DELTA_ROWS, current.version if self.holder.loaded else 0):
                    applying = time.perf_counter()
                    index = await asyncio.to_thread(current.apply, part)
                    self._timed(part, time.perf_counter() - applying)
                    if self.holder.current is not current:
                        raise RuntimeError("the model was swapped by someone else during the sync")
                    self.holder.swap(index)
                    current = index
                    del index
                    self.last_change_at = time.time()
                self._freeze_due |= bool(delta.full) and self.freeze
            elif not self.holder.loaded:
                self.holder.swap(current)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.errors += 1
            self.consecutive_errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            self._m_errors.inc()
            log_event(log, "model_sync_failed", logging.WARNING, error=self.last_error,
                      consecutive=self.consecutive_errors, serving_version=current.version)
            return False
        elapsed = time.perf_counter() - started
        if self.consecutive_errors:
            log_event(log, "model_sync_recovered", after_errors=self.consecutive_errors)
        self.consecutive_errors = 0
        self.syncs += 1
        self.last_success_at = time.time()
        self.last_sync_seconds = elapsed
        self.last_delta_rows = len(delta)
        if delta.full:
            self.last_full_sync_seconds = elapsed      # a full load: the source's answer and the snapshot
        self._m_syncs.inc()
        self._m_rows.inc(len(delta))
        self._m_seconds.observe(elapsed)
        if delta.full or len(delta) > 10_000:
            log_event(log, "model_synced", version=delta.version, rows=len(delta), removed=len(delta.removed),
                      full=delta.full, vocab=self.holder.current.n, ms=round(elapsed * 1e3, 1))
        return True

    def _freeze_long_lived(self) -> None:
        """After a full load, move the model's objects out of the cyclic collector's reach.

        A full collection traverses every tracked object, all of it holding the GIL, so every
        query in flight waits for it: at 1M words, while the words were a list of strings, one
        ``gc.collect()`` took 56 - 62 ms (0 ms once frozen). The words are an arena of bytes now
        (``word_lookup.WordArena``), which the collector does not track, so what is left to
        freeze is small; the freeze stays for whatever a source's full load leaves behind. What was
        frozen at the previous full load is thawed and collected first: the model it replaced
        may sit in a reference cycle (a store and its inverted file's hand-over), and frozen it
        would never be freed. That collection is the only pause. A source that sends full loads
        more often than the pause is worth (one every few milliseconds, in a test) gets it at most
        ``FREEZE_SHARE`` of the time: a full load in between is frozen with the next one."""
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        seconds = time.perf_counter() - started
        self._next_freeze_at = time.monotonic() + seconds / FREEZE_SHARE
        self.frozen_objects = gc.get_freeze_count()
        self.freezes += 1
        log_event(log, "model_frozen", objects=self.frozen_objects, ms=round(seconds * 1e3, 1))

    def _timed(self, delta, seconds: float) -> None:
        """Time of building the next snapshot, kept apart for full loads and deltas."""
        kind = "full" if delta.full else "delta"
        self.apply_seconds[kind] += seconds
        self.applies[kind] += 1
        self.last_apply_seconds[kind] = seconds
        self.max_apply_seconds[kind] = max(self.max_apply_seconds[kind], seconds)

    def stop(self) -> None:
        self._stopping = True

    async def run(self) -> None:
        while not self._stopping:
            ok = await self.sync_once()
            if self._freeze_due and time.monotonic() >= self._next_freeze_at:   # the sync's references are gone
                self._freeze_due = False
                self._freeze_long_lived()
            delay = self.interval if ok else min(self.max_backoff, self.interval * 2 ** min(self.consecutive_errors, 10))
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------ stats
    async def stats_once(self) -> bool:
        try:
            async with asyncio.timeout(self.timeout):
                stats = await self.source.stats()
            if not isinstance(stats, dict):
                raise TypeError(f"stats() returned {type(stats).__name__}, not dict")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats_errors += 1
            self.last_stats_error = f"{type(exc).__name__}: {exc}"[:500]
            if self.stats_errors == 1 or self.stats_errors % 60 == 0:
                log_event(log, "source_stats_failed", logging.WARNING, error=self.last_stats_error,
                          errors=self.stats_errors)
            return False
        now = time.time()
        stats = dict(stats)
        words = stats.get("words_trained")
        if stats.get("words_per_second") is None and isinstance(words, (int, float)):
            if self._prev_words is not None and now > self._prev_words[0]:
                stats["words_per_second"] = max(0.0, (words - self._prev_words[1]) / (now - self._prev_words[0]))
            self._prev_words = (now, float(words))
        self.source_stats = stats
        self.stats_at = now
        self.history.append({
            "t": round(now, 3),
            "words_per_second": _number(stats.get("words_per_second")),
            "vocab_size": _number(stats.get("vocab_size", self.holder.current.n)),
            "kafka_lag": _number(stats.get("kafka_lag")),
            "freshness_seconds": self.seconds_since_sync(),
        })
        return True

    async def run_stats(self) -> None:
        while not self._stopping:
            await self.stats_once()
            await asyncio.sleep(self.stats_interval)

    # ----------------------------------------------------------------- report
    def seconds_since_sync(self) -> float | None:
        return None if self.last_success_at is None else max(0.0, time.time() - self.last_success_at)

    def report(self) -> dict[str, Any]:
        since = self.seconds_since_sync()
        return {
            "source_reachable": self.consecutive_errors == 0 and self.last_success_at is not None,
            "interval_seconds": self.interval,
            "last_attempt_at": self.last_attempt_at,
            "last_success_at": self.last_success_at,
            "last_change_at": self.last_change_at,
            "seconds_since_sync": None if since is None else round(since, 3),
            "last_sync_ms": None if self.last_sync_seconds is None else round(self.last_sync_seconds * 1e3, 2),
            "last_delta_rows": self.last_delta_rows,
            "last_full_sync_ms": None if self.last_full_sync_seconds is None
            else round(self.last_full_sync_seconds * 1e3, 1),
            "apply": {kind: {"count": self.applies[kind],
                             "mean_ms": round(1e3 * self.apply_seconds[kind] / max(self.applies[kind], 1), 2),
                             "last_ms": None if self.last_apply_seconds[kind] is None
                             else round(1e3 * self.last_apply_seconds[kind], 2),
                             "max_ms": round(1e3 * self.max_apply_seconds[kind], 2)} for kind in ("full", "delta")},
            "syncs": self.syncs,
            "frozen_objects": self.frozen_objects,
            "freezes": self.freezes,
            "errors": self.errors,
            "consecutive_errors": self.consecutive_errors,
            "last_error": self.last_error,
            "stats_errors": self.stats_errors,
            "last_stats_error": self.last_stats_error,
        }


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
