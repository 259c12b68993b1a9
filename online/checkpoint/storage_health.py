"""Whether the checkpoint directory takes writes: a metric, one log line per outage, and no flood.

Why its own piece: a shared file system fails for minutes at a time (a MooseFS chunkserver or
master restarting, a mount gone or read-only, a full disk), and the coordinator retries every
few seconds meanwhile, each server with it. Logging every failed attempt would bury the one line
an operator needs, so an outage is told as:

* ``checkpoint_storage_unavailable`` (ERROR) at the first failure: what failed and why;
* ``checkpoint_storage_still_unavailable`` (WARNING) at most once per ``REPEAT`` seconds while it
  lasts, with the failures counted since;
* ``checkpoint_storage_back`` (INFO) at the first success after it, with the outage's length.

The same state is on ``/metrics``: ``livevec_checkpoint_storage_ok`` (1/0) and
``livevec_checkpoint_storage_errors_total{op}``, which the ``LivevecCheckpointStorageUnavailable``
alert watches (deploy/prometheus/livevec-rules.yml).
"""
from __future__ import annotations

import errno
import logging
import threading
import time

from ps_bridge.metrics import Registry
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.checkpoint")


def describe(exc: BaseException | str) -> str:
    """An OSError as an operator reads it: the errno's name first (ENOSPC, EROFS, ENOTCONN, ETIMEDOUT);
    a string is a description already (a server's, passed on by the coordinator)."""
    if isinstance(exc, str):
        return exc[:400]
    name = errno.errorcode.get(getattr(exc, "errno", None) or 0)
    return f"{name + ': ' if name else ''}{type(exc).__name__}: {exc}"[:400]


class StorageHealth:
    REPEAT = 60.0   # seconds between "still unavailable" lines

    def __init__(self, registry: Registry, where: str, *, clock=time.monotonic):
        self.where = where              # the directory, named in every line
        self.clock = clock
        self._lock = threading.Lock()
        self._ok_gauge = registry.gauge("livevec_checkpoint_storage_ok",
                                        "1 while the checkpoint directory takes writes, 0 after a failed write")
        self._ok_gauge.set(1)
        self._registry = registry
        self._errors: dict[str, object] = {}
        self.down_since: float | None = None
        self.failures = 0               # in the current outage
        self._last_line = 0.0

    @property
    def ok(self) -> bool:
        return self.down_since is None

    def failed(self, op: str, exc: BaseException | str, **fields) -> None:
        now = self.clock()
        with self._lock:
            counter = self._errors.get(op)
            if counter is None:
                counter = self._errors[op] = self._registry.counter(
                    "livevec_checkpoint_storage_errors_total", "failed calls on the checkpoint directory", op=op)
            counter.inc()
            self._ok_gauge.set(0)
            self.failures += 1
            if self.down_since is None:
                self.down_since = now
                self._last_line = now
                line = ("checkpoint_storage_unavailable", logging.ERROR)
            elif now - self._last_line >= self.REPEAT:
                self._last_line = now
                line = ("checkpoint_storage_still_unavailable", logging.WARNING)
            else:
                return
            since = round(now - self.down_since, 1)
            failures = self.failures
        log_event(log, line[0], line[1], dir=self.where, op=op, error=describe(exc), down_seconds=since,
                  failures=failures, **fields)

    def succeeded(self, **fields) -> float | None:
        """Seconds the outage lasted when this success ends one, else None."""
        now = self.clock()
        with self._lock:
            self._ok_gauge.set(1)
            if self.down_since is None:
                return None
            seconds, failures = now - self.down_since, self.failures
            self.down_since, self.failures = None, 0
        log_event(log, "checkpoint_storage_back", dir=self.where, down_seconds=round(seconds, 1), failures=failures,
                  **fields)
        return seconds
