"""Nothing outlives the local runner: its tasks die with it, and what a killed run left in /dev/shm is
reclaimed by the next one.

**Tasks die with the runner, even when it is killed with SIGKILL.** Each task process is started with
the kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set between fork and exec, and
kept across the exec of the task's command), so the kernel kills it the moment the runner dies, however
it dies. Why this and not the alternatives:

* a process group or session (the tasks already have one each, for ``killpg``) needs someone alive to
  signal it: after a SIGKILL of the runner, nobody is;
* a cgroup needs root or a delegated cgroup v2 subtree, and the same someone to kill it (or a systemd
  scope), which ``livevec up`` on a laptop does not have;
* a watchdog process of its own could itself be killed (``kill -9 -PGID`` takes it down with the runner).

The signal is SIGKILL, not SIGTERM: the runner that would have waited for a graceful stop and escalated
is gone, so a crash of the runner is treated as a crash of the agent. What that leaves is what any crash
leaves: uncommitted Kafka offsets (redelivered), the cluster's checkpoints (a restart rolls back to the
latest), and the host-replica files, which the next run reclaims (below).

The kernel sends the signal when the *thread* that forked the task ends, not the process. The runner
forks from several threads (the caller's ``start()``, the supervisor's relaunches, a restart), any of which
may end long before the runner does, so every task is forked by one thread that is started once and never
ends (``spawn``): it dies with the process and only then. A child that finds its parent already gone before
the signal was armed (the race between fork and prctl) exits at once. Tasks run their ``cmd`` with
``exec`` (the deploy files do), so the signal reaches the role itself, not only a shell in front of it.

A container task's process is the ``podman run`` client, and killing it would leave its container running
(conmon keeps it). So the client gets SIGTERM instead, which it passes on to the container (``podman
run``'s ``--sig-proxy``, on by default when attached): the role stops as at any SIGTERM (within
``LIVEVEC_STOP_TIMEOUT``), the container exits and ``--rm`` removes it.

**Shared memory of killed runs.** Each run keeps the agents' /dev/shm (the workers' host replica) in a
directory of this machine's own, ``/dev/shm/livevec-local-<id>``, removed at a clean stop. A run holds
``.runner.lock`` in it (``flock`` shared) for as long as it lives; at start, a runner removes every such
directory whose lock nobody holds and whose replica files no live worker holds (``reclaim_dead_runs``,
with ``online.cluster.host_replica.reclaim_dead_segments`` for the files). So a ``livevec up`` killed with
SIGKILL leaves its 354 MB segment only until the next ``livevec up``, ``livevec deploy run-local`` or the
next worker started over that directory.
"""
from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from online.cluster.host_replica import reclaim_dead_segments
from ps_bridge.structured_logging import log_event

logger = logging.getLogger("livevec.local_runner")

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl   # looked up before any fork: the child only calls it
except (OSError, AttributeError):   # not Linux: no parent-death signal (the tasks outlive a killed runner)
    _prctl = None

RUN_LOCK = ".runner.lock"
RUN_DIR_PREFIX = "livevec-local-"
UNLOCKED_RUN_MIN_AGE = 60.0   # a directory without a lock file (a runner just starting it) is left this long


def parent_death_preexec(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` that arms the parent-death signal in the child, and exits if the parent is gone."""
    parent = os.getpid()

    def preexec() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:   # died between fork and prctl: the signal will never come
            os._exit(1)
    return preexec


class _Spawner:
    """The one thread that forks every task (see the module docstring): started at first use, never ended."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="task-spawner", daemon=True)
                self._thread.start()
        if threading.current_thread() is self._thread:
            return fn()
        box: dict = {}
        done = threading.Event()
        self._queue.put((fn, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _run(self) -> None:
        while True:
            fn, box, done = self._queue.get()
            try:
                box["result"] = fn()
            except BaseException as exc:   # handed to the caller
                box["error"] = exc
            finally:
                done.set()


_SPAWNER = _Spawner()


def spawn(argv: list[str], death_signal: int = signal.SIGKILL, **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(argv, ...)`` for a task: forked by the spawner thread, sent ``death_signal`` by the
    kernel when this process dies."""
    return _SPAWNER.call(lambda: subprocess.Popen(argv, preexec_fn=parent_death_preexec(death_signal),
                                                  **popen_kwargs))


def hold_run_dir(directory: Path) -> int:
    """Make this run's shared-memory directory and hold its ``.runner.lock`` (shared) until the returned fd is
    closed or the process dies."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _run_is_live(directory: Path) -> bool:
    try:
        fd = os.open(directory / RUN_LOCK, os.O_RDWR)
    except FileNotFoundError:
        try:
            return time.time() - directory.stat().st_mtime < UNLOCKED_RUN_MIN_AGE
        except FileNotFoundError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def reclaim_dead_runs(root: Path, keep: Path | None = None) -> list[Path]:
    """Remove the run directories under ``root`` (``livevec-local-*``) of runners that are gone, once no live
    worker holds a replica file in them; returns the removed directories."""
    removed = []
    for directory in sorted(root.glob(f"{RUN_DIR_PREFIX}*")) if root.is_dir() else []:
        try:
            if directory == keep or not directory.is_dir() or _run_is_live(directory):
                continue
            freed = 0
            for sub in [directory, *(p for p in directory.rglob("*") if p.is_dir())]:
                freed += sum(size for _, size in reclaim_dead_segments(sub))
            if any(directory.rglob("livevec-*.replica")):   # an orphaned worker of an older runner holds one
                continue
        except OSError:   # another runner reclaiming it at the same time: its business
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory)
        log_event(logger, "run_dir_reclaimed", path=str(directory), mib=round(freed / 2**20, 1))
    return removed
