"""One replica for all the worker processes of a host, in shared memory (``LIVEVEC_HOST_REPLICA``).

Why. A frequent word's output row is drawn as a negative hundreds of times per replica between two syncs, so k
replicas take k sets of hundreds of steps from one value, and their deltas must be merged
(``online.learner.concurrent_merge``); the more replicas, the shorter their syncs and the more bytes per token.
The worker processes of one host need no merge among themselves: they train a single replica in place, hogwild,
exactly as the threads of one process do, and only hosts exchange deltas. It also keeps one copy of the rows per
host instead of one per process. Design: docs/design/0004-host-replica.md

What is shared, in one file in a tmpfs (``/dev/shm``, or a memory-backed volume in a container): the
replica's rows, their base copies, accumulators, keys, version stamps and confirmed flags, the key index
(open addressing, twice as many slots as rows, never rehashed) and the counters ``collect`` reads. Each
process keeps its own vocabulary, noise table, sampling stream, Kafka partitions and ps-lite node.

Locks, all ``flock`` on files beside the segment, so a process that dies releases them:

* ``<path>.lock``: the shard's lock (row creation, collect, apply); inside one process an
  ``RLock`` in front of it, since ``flock`` does not tell a process's threads apart;
* ``<path>.sync``: one sync at a time per host (two interleaved would add one delta twice);
* the segment itself, held shared by every attached process: one that gets it exclusively at
  start knows nobody is attached and initialises it.

Versions: the layout is in the header and the file name; a worker checks both at start (``segment_check``).

Reclaiming the memory (a segment is hundreds of MB of RAM until its file is removed): the last
member removes it at a clean exit (``HostSegment.detach``); when every member was killed, the
next worker that starts on the host removes it (``reclaim_dead_segments``), and ``livevec up``
reclaims its earlier runs' directories at start (``online.deployment.orphans``).

Consequences, each handled where it matters:

* a sync sends what *any* process of the host trained, so each process counts the batches it
  finished (its member slot in the header), each acknowledged sync records the counts its
  collect saw (``covered``), and a process commits the batches any acknowledged sync carried.
  A checkpoint's hold is the host's: no process of the host starts a sync while one holds;
* the host's syncs are one worker's successive deltas, so every sync names the segment's group
  (``group`` in ``HEAD_TRAINABLE_SINCE``) and the servers merge by it (``concurrent_merge``);
* rows are never freed (a word one process evicts may be trained by another): the bound is
  ``LIVEVEC_HOST_REPLICA_ROWS`` rows, reserved when the segment is made, so a tmpfs too small
  for it fails at start with the setting named, not with SIGBUS later.
"""
from __future__ import annotations

import fcntl
import logging
import mmap
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from online.cluster.replica_shard import ReplicaShard
from online.cluster.segment_check import (HostReplicaError, _read_header, _still_named, header_problem,
                                          release_number, wanted_header)
from online.cluster.segment_layout import (H_ACCUM, H_COUNTED, H_COVERED, H_FINISHED, H_GROUP, H_HELD,
                                           H_LAST_SYNC, H_NEXT_ROW, H_REFRESH, H_RELEASE, H_SIZE, H_SYNCED,
                                           H_VERSION, LAYOUT, MAX_MEMBERS, PAGE, segment_layout)
from ps_bridge.structured_logging import log_event
from online.learner.key_index import EMPTY, KeyIndex, _insert

log = logging.getLogger("livevec.worker")

def _segment_stem(root_uri: str, root_port: int, node_host: str | None) -> str:
    name = f"livevec-{root_uri}-{root_port}-{node_host or socket.gethostname()}"
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in name)


def segment_path(directory: str | Path, root_uri: str, root_port: int, node_host: str | None) -> Path:
    """The file the workers of one cluster (its scheduler's address) on one host (the address they advertise,
    ``DMLC_NODE_HOST``, else the host name) and of one layout share. So hosts that share a tmpfs without being
    one host (network namespaces on one machine, or a pod's containers, which do share their address) each get
    their own, and so do the workers of two releases with different layouts on one host during an upgrade."""
    return Path(directory) / f"{_segment_stem(root_uri, root_port, node_host)}-layout{LAYOUT}.replica"


SIDE_LOCKS = (".lock", ".sync")


def _remove_segment_files(path: Path) -> None:
    """The data file, the member files and the side locks, ``.lock`` last (the caller holds it)."""
    names = [path, *sorted(path.parent.glob(f"{path.name}.member*"))] + [Path(f"{path}{s}") for s in SIDE_LOCKS[::-1]]
    for name in names:
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


def reclaim_dead_segments(directory: str | Path, keep: str | Path | None = None) -> list[tuple[Path, int]]:
    """Remove the host-replica files in ``directory`` that no live process holds (with their member files and
    side locks), except ``keep``; returns each removed data file with its size. A segment is dead when its
    ``.lock`` can be taken at once (nobody is creating, attaching or detaching it) and then its data file
    exclusively (every attached process holds it shared until it exits, however it exits). Every worker runs
    this when it attaches, so the segments of workers that were all killed (``kill -9``, a crashed agent, a
    ``livevec up`` killed with its tasks) are reclaimed by the next worker that starts on the host, of any
    cluster; the local runner runs it at start over the directories of earlier runs."""
    directory = Path(directory)
    keep = Path(keep) if keep is not None else None
    names = set()
    for pattern in ("livevec-*.replica", *(f"livevec-*.replica{suffix}" for suffix in SIDE_LOCKS)):
        for p in directory.glob(pattern) if directory.is_dir() else ():
            names.add(p.name[:p.name.rindex(".replica") + len(".replica")])
    reclaimed = []
    for name in sorted(names):
        path = directory / name
        if keep is not None and path == keep:
            continue
        size = _reclaim(path)
        if size is not None:
            reclaimed.append((path, size))
            log_event(log, "host_replica_reclaimed", path=str(path), mib=round(size / 2**20, 1),
                      reason="no live process holds it")
    return reclaimed


def _reclaim(path: Path) -> int | None:
    """Remove one dead segment's files; its size, or None when a live process holds it."""
    lock_path = f"{path}.lock"
    try:
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    data_fd = None
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        if not _still_named(lock_fd, lock_path):   # removed and made again meanwhile: someone is there
            return None
        try:
            data_fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            size = 0   # only side files are left
        else:
            try:
                fcntl.flock(data_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            size = os.fstat(data_fd).st_size
        _remove_segment_files(path)
        return size
    finally:
        if data_fd is not None:
            os.close(data_fd)
        os.close(lock_fd)


class _HostLock:
    """Re-entrant across a process's threads, exclusive across processes (``flock``)."""

    def __init__(self, fd: int):
        self._fd = fd
        self._local = threading.RLock()
        self._depth = 0

    def acquire(self) -> None:
        self._local.acquire()
        if self._depth == 0:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except BaseException:
                self._local.release()
                raise
        self._depth += 1

    def try_acquire(self) -> bool:
        if not self._local.acquire(blocking=False):
            return False
        if self._depth == 0:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._local.release()
                return False
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._local.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class HostSegment:
    """The shared file: created and initialised by the first process of the host, attached by the others."""

    def __init__(self, path: str | Path, *, dim: int, rows: int, optimizer: str, seed: int):
        self.path = Path(path)
        want, size = wanted_header(dim, rows, optimizer, seed)
        self.arrays, self.slots, _size = segment_layout(dim, rows, want[H_ACCUM])
        fds = []
        try:
            reclaim_dead_segments(self.path.parent, keep=self.path)
            fds += self._open_locked()          # the data file is made, attached and removed under .lock
            try:
                fds.append(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
                self._fd = fds[-1]
                self.created = self._attach(size, want)
                self.member, self._member_fd = self._claim_member()
            finally:
                self.lock.release()
        except BaseException as exc:
            for fd in fds:
                os.close(fd)
            if isinstance(exc, OSError):
                raise HostReplicaError("LIVEVEC_HOST_REPLICA", f"cannot open {self.path}: {exc.strerror}") from exc
            raise

    def _open_locked(self) -> list[int]:
        """Open ``.lock`` and ``.sync`` and take ``.lock``. The last member (``detach``) or a sweep
        (``reclaim_dead_segments``) removes both under ``.lock``; a process that waited for the lock on the
        removed file then holds a lock nobody else will ever take, so it opens them again."""
        while True:
            fds = [os.open(f"{self.path}{suffix}", os.O_RDWR | os.O_CREAT, 0o600) for suffix in SIDE_LOCKS]
            self.lock, self.sync_lock = _HostLock(fds[0]), _HostLock(fds[1])
            try:
                self.lock.acquire()
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
            if all(_still_named(fd, f"{self.path}{suffix}") for fd, suffix in zip(fds, SIDE_LOCKS)):
                return fds
            self.lock.release()
            for fd in fds:
                os.close(fd)

    def _member_file(self, m: int) -> str:
        return f"{self.path}.member{m}"

    def _claim_member(self) -> tuple[int, int]:
        """The first member slot whose file nobody locks (free, or its process is gone), locked for life;
        its counters start again from zero."""
        for m in range(MAX_MEMBERS):
            fd = os.open(self._member_file(m), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            for base in (H_FINISHED, H_COVERED, H_HELD, H_COUNTED):
                self.header[base + m] = 0
            return m, fd
        raise HostReplicaError("LIVEVEC_HOST_REPLICA", f"more than {MAX_MEMBERS} workers of one cluster share "
                                                       f"{self.path}")

    def alive(self, m: int) -> bool:
        """Member ``m``'s process still holds its slot."""
        fd = os.open(self._member_file(m), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)   # (releases the lock if it was taken)
        return False

    def members(self) -> int:
        """Processes attached now (each holds its member slot's lock); opens the slots' files, so call it seldom."""
        n = 0
        for m in range(MAX_MEMBERS):
            try:
                fd = os.open(self._member_file(m), os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                n += 1
            finally:
                os.close(fd)
        return n

    def detach(self) -> bool:
        """At exit: the last process of the host removes the data file (its memory goes with the last
        mapping), the member files and the side locks. Returns whether it did."""
        with self.lock:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # only if nobody else holds it
            except BlockingIOError:
                return False
            # (slots are claimed under the same lock, so none is being claimed now)
            _remove_segment_files(self.path)
            return True

    def _attach(self, size: int, want: dict[int, int]) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        if alone:
            self._initialise(size, want)
        fcntl.flock(self._fd, fcntl.LOCK_SH)   # attached until this process exits
        problem = header_problem(self.path, _read_header(self._fd), os.fstat(self._fd).st_size, want, size)
        if problem is not None:
            raise problem
        self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.header = np.frombuffer(self._map, dtype=np.int64, count=PAGE // 8)
        return alone

    def _initialise(self, size: int, want: dict[int, int]) -> None:
        os.ftruncate(self._fd, 0)   # a segment of processes that are gone: start afresh
        os.ftruncate(self._fd, size)
        try:
            os.posix_fallocate(self._fd, 0, size)
        except OSError as exc:
            os.ftruncate(self._fd, 0)
            raise HostReplicaError("LIVEVEC_HOST_REPLICA_ROWS", f"{size / 2**20:.0f} MiB do not fit in "
                                                                f"{self.path.parent} ({exc.strerror}); give the tmpfs "
                                                                "more room or lower the rows") from exc
        m = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            header = np.frombuffer(m, dtype=np.int64, count=PAGE // 8)
            at, shape, dtype = self.arrays["tvals"]
            np.frombuffer(m, dtype=dtype, count=int(np.prod(shape)), offset=at)[:] = EMPTY
            for slot, value in want.items():
                header[slot] = value
            header[H_RELEASE] = release_number()
            del header
        finally:
            m.close()

    def array(self, name: str) -> np.ndarray:
        at, shape, dtype = self.arrays[name]
        return np.frombuffer(self._map, dtype=dtype, count=int(np.prod(shape)), offset=at).reshape(shape)


class _SharedKeyIndex(KeyIndex):
    """``KeyIndex`` over the segment's table: fixed size (never rehashed), no deletions."""

    def __init__(self, segment: HostSegment):
        self.tkeys = segment.array("tkeys")
        self.tvals = segment.array("tvals")
        self.shift = np.uint64(64 - int(np.log2(segment.slots)))
        self.tombstones = 0
        self._header = segment.header

    @property
    def size(self) -> int:
        return int(self._header[H_SIZE])

    @size.setter
    def size(self, value: int) -> None:
        self._header[H_SIZE] = value

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        _insert(self.tkeys, self.tvals, self.shift, keys, np.ascontiguousarray(rows, dtype=np.int64))
        self.size = self.size + len(keys)


def _header_field(slot: int):
    def get(self):
        return int(self._hdr[slot])

    def put(self, value):
        self._hdr[slot] = value
    return property(get, put)


class SharedReplicaShard(ReplicaShard):
    """A ``ReplicaShard`` whose arrays and counters live in a ``HostSegment`` (see the module docstring)."""

    shared = True
    version = _header_field(H_VERSION)
    synced_version = _header_field(H_SYNCED)
    _refresh_at = _header_field(H_REFRESH)
    _next_row = _header_field(H_NEXT_ROW)

    def __init__(self, dim: int, path: str | Path, rows: int, refresh_share: float = 0.1, **options):
        self._hdr = np.zeros(PAGE // 8, dtype=np.int64)   # until the segment is attached
        super().__init__(dim, refresh_share, initial_rows=16, **options)
        self.segment = HostSegment(path, dim=self.dim, rows=int(rows), optimizer=self.optimizer, seed=self.seed)
        seg = self.segment
        self._hdr = seg.header
        self.vectors, self.base = seg.array("vectors"), seg.array("base")
        self.accum = seg.array("accum") if self.accum.shape[0] else self.accum
        self.base_acc, self.confirmed = seg.array("base_acc"), seg.array("confirmed")
        self.contraction = seg.array("contraction")
        self.row_keys, self.row_version = seg.array("row_keys"), seg.array("row_version")
        self.row_born, self.counts = seg.array("row_born"), seg.array("counts")
        self._index = _SharedKeyIndex(seg)
        self._lock = seg.lock
        self.rows_refused = 0   # keys this process found no room for (``rows_for``)
        self.member = seg.member
        self._finished = seg.header[H_FINISHED:H_FINISHED + MAX_MEMBERS]
        self._covered = seg.header[H_COVERED:H_COVERED + MAX_MEMBERS]
        self._held = seg.header[H_HELD:H_HELD + MAX_MEMBERS]
        self._counted = seg.header[H_COUNTED:H_COUNTED + MAX_MEMBERS]
        self.collected_finished = self._finished.copy()

    @property
    def group(self) -> int:
        """The id the servers merge this host's deltas under: the first node id that asked for one."""
        return int(self._hdr[H_GROUP])

    def claim_group(self, node_id: int) -> int:
        with self._lock:
            if not self._hdr[H_GROUP]:
                self._hdr[H_GROUP] = node_id
            return self.group

    @contextmanager
    def host_sync(self):
        with self.segment.sync_lock:
            yield

    def since_last_sync(self) -> float:
        """Seconds since a sync of the host last began (``CLOCK_MONOTONIC`` is the kernel's, shared by its
        processes and containers)."""
        return (time.monotonic_ns() - int(self._hdr[H_LAST_SYNC])) / 1e9

    def sync_began(self) -> None:
        self._hdr[H_LAST_SYNC] = time.monotonic_ns()

    def members(self) -> int:
        return self.segment.members()

    def held_elsewhere(self) -> bool:
        """Whether a live process of the host holds syncs for a checkpoint (a holder that died is cleared:
        the rollback its death brings releases the others)."""
        for m in np.flatnonzero(self._held).tolist():
            if m == self.member:
                continue
            if self.segment.alive(m):
                return True
            self._held[m] = 0
        return False

    def wait_host_idle(self, timeout: float) -> bool:
        """Wait until no process of the host is in a sync (False after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while not self.segment.sync_lock.try_acquire():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        self.segment.sync_lock.release()
        return True

    def close(self) -> None:
        self.segment.detach()

    def rows_for(self, keys: np.ndarray, create: bool = True) -> np.ndarray:
        """As ``ReplicaShard.rows_for``; when the segment is full, the keys that do not fit get -1 (their words
        are not trained on this host: the subsampler skips a word without both rows), and are counted and
        logged with the setting named, since the segment cannot grow."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if not create:
            return super().rows_for(keys, create=False)
        with self._lock:
            missing = np.unique(keys[self._index.lookup(keys) < 0])
            room = self.capacity - self._next_row
            if len(missing) <= room:
                return super().rows_for(keys, create=True)
            refused = missing[room:]
            self.rows_refused += len(refused)
            if self.rows_refused == len(refused) or self.rows_refused // 100_000 != \
                    (self.rows_refused - len(refused)) // 100_000:
                log_event(log, "host_replica_full", logging.ERROR, rows=self.capacity, refused=self.rows_refused,
                          setting="LIVEVEC_HOST_REPLICA_ROWS",
                          error="the host's replica is full: new words are not trained here; raise the setting")
            fits = ~np.isin(keys, refused)
            out = np.full(len(keys), -1, dtype=np.int64)
            out[fits] = super().rows_for(keys[fits], create=True)
            return out

    def _grow(self, needed: int) -> None:
        raise HostReplicaError("LIVEVEC_HOST_REPLICA_ROWS", f"the host's replica is full ({self.capacity} rows)")

    def free(self, keys: np.ndarray) -> int:
        """Never: another process of the host may still train the word."""
        return self.version

    def release_freed(self) -> int:
        return 0
