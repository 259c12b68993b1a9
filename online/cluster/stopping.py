"""How long a role may take to stop (``LIVEVEC_STOP_TIMEOUT``), and the deadline that enforces it.

Every role (scheduler, server, worker, front end) stops on SIGTERM within this many seconds whatever
its peers' state: a server gone, the scheduler gone, Kafka down. What a role does in that time is its
own (a worker's final sync, its leave of the cluster, its Kafka consumer's close; a front end's
requests in flight); each step gets what is left of the budget, and a step that waits on a peer is
bounded by it (``StopDeadline.remaining``).

A step may still block where nothing can bound it (a thread stuck in a native call, a ZeroMQ context
that will not terminate). So ``StopDeadline.arm`` also starts a watchdog thread: when the budget is
spent and the process is still there one second later, it logs ``stop_deadline_exceeded`` (ERROR,
once) and ends the process with ``os._exit``. What such an exit leaves behind is what a crash leaves:
uncommitted Kafka offsets (the records go to the partitions' next owner) and, for a worker, its
attachment to the host replica, which the next worker of the host reclaims
(``online.cluster.host_replica``).

Marathon's ``taskKillGracePeriodSeconds`` and Kubernetes' ``terminationGracePeriodSeconds`` in the
deploy files are all at least 10 s, so the default (8 s, plus the watchdog's second) is always inside
them: a role is never SIGKILLed in the middle of a stop it would have finished.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from ps_bridge.settings import Setting, SettingGroup
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.stopping")

STOP_TIMEOUT = Setting(
    "stop_timeout", "LIVEVEC_STOP_TIMEOUT", float, 8.0, minimum=0.5, maximum=3600.0,
    help="seconds a role may take to stop after SIGTERM (a worker's final sync and leave included), whatever "
         "its peers' state; after one more second it exits regardless")
STOPPING = SettingGroup("stopping", (STOP_TIMEOUT,))

WATCHDOG_GRACE = 1.0   # seconds past the budget before the watchdog ends the process


class StopDeadline:
    """The stop budget of one process, from the first ``arm``."""

    def __init__(self, timeout: float, role: str, *, exit_code: int = 0,
                 last_words: Callable[[], None] | None = None):
        self.timeout = float(timeout)
        self.role = role
        self.exit_code = exit_code
        self.last_words = last_words   # called by the watchdog before it exits (must not block)
        self.started: float | None = None
        self._lock = threading.Lock()

    @property
    def armed(self) -> bool:
        return self.started is not None

    def arm(self) -> None:
        """Start the clock (idempotent: a second SIGTERM does not extend it) and the watchdog."""
        with self._lock:
            if self.started is not None:
                return
            self.started = time.monotonic()
        log_event(log, "stop_requested", role=self.role, stop_timeout_s=self.timeout, pid=os.getpid())
        threading.Thread(target=self._watch, name="stop-watchdog", daemon=True).start()

    def remaining(self, reserve: float = 0.0, floor: float = 0.0) -> float:
        """Seconds left of the budget after keeping ``reserve`` for later steps (at least ``floor``); the
        whole budget while not armed."""
        spent = 0.0 if self.started is None else time.monotonic() - self.started
        return max(floor, self.timeout - spent - reserve)

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def _watch(self) -> None:
        time.sleep(self.timeout + WATCHDOG_GRACE)
        log_event(log, "stop_deadline_exceeded", logging.ERROR, role=self.role, waited_s=round(self.elapsed(), 2),
                  setting="LIVEVEC_STOP_TIMEOUT", error="the stop did not finish in time; exiting without it")
        try:
            if self.last_words is not None:
                self.last_words()
        except Exception as exc:   # the exit must happen whatever the last words do
            log_event(log, "stop_last_words_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(self.exit_code)
