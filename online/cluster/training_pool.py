"""The threads a worker trains its batches on, at a lower CPU priority than the rest of the process.

A worker's training threads run the kernel for most of its CPU. Its sync, its Kafka consumer and the servers on the
same cores need a few percent of that, but a worker at its unsynced bound waits for them: at equal priority a sync
gets a share of a core against the training it would release (4 hosts x 2 workers on 2 cores: a sync took 600 ms of
wall time for 60 ms of CPU). Linux schedules threads, so lowering the training threads' priority (their nice value,
``LIVEVEC_TRAIN_NICE``) leaves the process's other threads at theirs. One replica has a bound of 8 intervals that
its syncs never reach, and there a sync that comes sooner only carries fewer tokens: the default lowers the
priority only where replicas merge. Design: docs/design/0003-sync-interval.md
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import threading

from online.cluster.sync_interval import servers_merge
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.worker")


AUTO_NICE = 5          # LIVEVEC_TRAIN_NICE=-1 where the servers merge the replicas' deltas


def train_nice(setting: int, declared_workers: int) -> int:
    """The nice the training threads take: ``setting`` (``LIVEVEC_TRAIN_NICE``), or where it is -1 ``AUTO_NICE``
    in a cluster whose servers merge (``sync_interval.servers_merge``), else 0."""
    if setting >= 0:
        return setting
    return AUTO_NICE if servers_merge(declared_workers) else 0


def lower_thread_priority(nice: int) -> None:
    """Lower the calling thread's CPU priority by ``nice`` (at most to 19, the lowest)."""
    if nice <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except (AttributeError, OSError) as exc:   # not Linux, or not allowed: the same priority, said once a thread
        log_event(log, "train_priority_unchanged", logging.INFO, error=f"{type(exc).__name__}: {exc}",
                  setting="LIVEVEC_TRAIN_NICE")


def training_pool(threads: int, nice: int, declared_workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """``threads`` threads (one per batch in flight), each ``train_nice(nice, declared_workers)`` below the
    process's priority."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="train",
                                                 initializer=lower_thread_priority,
                                                 initargs=(train_nice(nice, declared_workers),))
