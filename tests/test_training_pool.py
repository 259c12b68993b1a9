"""The worker's training threads run below the process's CPU priority, and only they do."""
from __future__ import annotations

import os
import threading

from online.cluster.training_pool import AUTO_NICE, train_nice, training_pool


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_training_threads_run_below_the_process_and_the_rest_does_not():
    base = _own_nice()
    pool = training_pool(2, 5, 2)
    try:
        seen = {pool.submit(_own_nice).result() for _ in range(8)}
    finally:
        pool.shutdown()
    assert seen == {min(19, base + 5)}
    assert _own_nice() == base                       # the caller's thread keeps its priority
    other = []
    t = threading.Thread(target=lambda: other.append(_own_nice()))
    t.start()
    t.join()
    assert other == [base]                           # and so does a thread it starts afterwards


def test_nice_zero_keeps_the_priority():
    base = _own_nice()
    pool = training_pool(1, 0, 8)
    try:
        assert pool.submit(_own_nice).result() == base
    finally:
        pool.shutdown()


def test_auto_lowers_the_priority_only_where_replicas_merge():
    assert train_nice(-1, 1) == train_nice(-1, 2) == 0          # one replica, or two the servers add as they are
    assert train_nice(-1, 3) == train_nice(-1, 16) == AUTO_NICE
    assert train_nice(7, 2) == 7 and train_nice(0, 16) == 0     # a set value is taken as it is
    base = _own_nice()
    pool = training_pool(1, -1, 8)
    try:
        assert pool.submit(_own_nice).result() == min(19, base + AUTO_NICE)
    finally:
        pool.shutdown()
