"""Background work at a lower CPU priority than the similarity queries.

The front end shares its core between the queries (the compute thread and the event loop) and
background work: syncs (at 10M words and 20,000 changed rows a second, about 95 ms of CPU every
0.5 s), the recall monitor's exact searches (about 50 ms each at 10M), the inverted file's
builds (a minute), drift checkpoints and analytics requests. At equal priority a burst of it
takes half the core while it runs and queries queue behind it: at 10M words and 500 req/s the
core is 60 - 70 % busy and p99 still 20 - 90 ms (``bench/query_load.py``).

Linux keeps a nice value per thread, so the threads behind ``asyncio.to_thread`` (the loop's
default executor, which every such job uses) take a higher one. When both want the core the
queries get most of it (nice 10: weight 110 against 1,024, about 90 %); when the queries leave
the core idle, background work gets all of it. The priority lowers only CPU share: a background
thread holding the GIL is never starved by a query thread waiting for it, because a waiting
thread does not run.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import threading

from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend")

MAX_NICE = 19
_refused = False          # logged once: a refusal repeats for every thread of the pool


def lower_this_thread(by: int) -> int:
    """Raise the calling thread's nice value by ``by`` (capped at 19); its value afterwards (0 when
    refused). A sandbox that refuses the call (seccomp) leaves the thread as it was and says so once:
    the pool must still start, or every sync would fail."""
    tid = threading.get_native_id()
    try:
        nice = min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, tid) + by)
        if by > 0:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        return nice
    except OSError as exc:
        global _refused
        if not _refused:
            _refused = True
            log_event(log, "background_priority_refused", logging.WARNING, error=repr(exc),
                      note="background work runs at the queries' priority")
        return 0


def background_executor(nice: int, max_workers: int | None = None) -> concurrent.futures.ThreadPoolExecutor:
    """A thread pool whose threads run ``nice`` steps below the thread that made it."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="background",
                                                 initializer=lower_this_thread, initargs=(nice,))
