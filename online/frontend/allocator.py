"""glibc's allocator, told to give a long-running front end's freed memory back to the system.

A sync builds the next snapshot in a worker thread: a delta's rows, their codes and the tiles
they touch are temporaries of megabytes, allocated and freed every half second. By default
glibc raises its mmap threshold each time such a block is freed (up to 32 MB), so later
temporaries come from the heaps it keeps per thread, and what they free stays resident
there; with more threads it keeps more heaps. At 1M words (``bench/query_load.py``) the front end
grows 0.22 GB over a run with glibc's defaults and 0.11 GB with a fixed 4 MB threshold and two
heaps, at the same latency. Query temporaries (a few hundred KB) stay below the threshold, so
queries pay no ``mmap`` of their own. A ``MALLOC_ARENA_MAX`` or ``MALLOC_MMAP_THRESHOLD_`` in the
environment (glibc's own tunables) is the operator's choice and is left alone."""
from __future__ import annotations

import ctypes
import logging
import os

from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend.allocator")

M_MMAP_THRESHOLD = -3          # glibc's mallopt parameters (malloc.h)
M_ARENA_MAX = -8
MMAP_THRESHOLD = 4 << 20       # blocks this large and larger are mapped, and unmapped when freed
ARENA_MAX = 2                  # heaps: the event loop's, and one the sync and query threads share


def give_freed_memory_back() -> dict[str, int]:
    """Fix glibc's mmap threshold and its number of heaps (call before the threads start); returns what
    was set. On a C library without ``mallopt`` (musl), nothing."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = {}
    for name, param, value in (("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                               ("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENA_MAX)):
        if name not in os.environ and mallopt(param, value) == 1:
            done[name] = value
    if done:
        log_event(log, "allocator_tuned", **{k.strip("_").lower(): v for k, v in done.items()})
    return done
