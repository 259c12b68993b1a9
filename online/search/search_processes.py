"""Processes that search the front end's model without a copy of it: reads that scale across cores.

One front-end process searches on one core (the query thread holds the GIL between kernels), so
without them the only way to serve more queries is another front end, with another model: 7.5 GB
more at 10M words. With ``LIVEVEC_SEARCH_PROCESSES=N`` the front end keeps parsing requests, resolving words
and formatting answers, and hands each batch's *search* to one of N processes that map the
model's rows, codes and maps from it (``shared_arrays``: memfd blocks the front end allocates,
mapped read-only here). A process adds its interpreter and the few pages it maps privately,
not a model.

Why this is safe without a lock across processes: the snapshot a batch searches must not be
written while it is searched, and in one process that already holds for as long as anyone refers
to the snapshot (``row_store``: a sync writes only rows, slots and buffers no live snapshot
reads). The front end's compute thread holds the snapshot for the whole call, so the process
reads exactly what the thread would have read. The inverted file's small arrays (lists,
centroids: a few MB) are not in shared blocks; they travel by value once per version and are
cached on the other side by identity.

A process that dies (killed, out of memory) costs nothing but speed: its batch is searched in the
front end itself, one line is logged, ``livevec_frontend_search_process_restarts_total`` counts
it and the process is started again. A process exits when the front end's end of its socket
closes, so a killed front end leaves none behind.
"""
from __future__ import annotations

import argparse
import logging
import os
import pickle
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref

import numpy as np

from online.search import shared_arrays
from online.search.ivf import IvfLists
from online.search.model_index import ModelIndex
from ps_bridge.structured_logging import log_event

log = logging.getLogger("livevec.frontend.search_processes")

IVF_FIELDS = ("centroids", "neighbours", "list_ptr", "list_tiles", "tile_list", "free")
IVF_SCALARS = ("n_tiles", "built_version", "built_rows", "built_at", "build_seconds", "drift")
MEMORY_EVERY = 5.0             # seconds between two readings of the processes' memory
RESTART_BACKOFF = 1.0          # seconds between restarts of one slot's process
_HEADER = struct.Struct("<Q")


VALUE_LIMIT = 64 << 20         # bytes of an array not in shared memory that may still travel by value


class SearchProcessLost(Exception):
    """The process died or broke the protocol mid-call."""


class NotShared(Exception):
    """A large array of the snapshot is not in shared memory (a bug: the front end searches it itself)."""


def _send(sock: socket.socket, obj) -> None:
    payload = pickle.dumps(obj, protocol=5)
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _recv(sock: socket.socket):
    head = _recv_exactly(sock, _HEADER.size)
    return pickle.loads(_recv_exactly(sock, _HEADER.unpack(head)[0]))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError("the peer closed the socket")
        got += k
    return bytes(buf)


def memory_of(pid: int) -> dict[str, int]:
    """Bytes of ``pid`` from ``/proc/<pid>/smaps_rollup``: rss, pss, private (what it alone holds: what a
    process adds) and shared."""
    out = {"rss": 0, "pss": 0, "private": 0, "shared": 0}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3 or parts[-1] != "kB":
                continue
            key, kb = parts[0].rstrip(":"), int(parts[1]) * 1024
            if key == "Rss":
                out["rss"] = kb
            elif key == "Pss":
                out["pss"] = kb
            elif key in ("Private_Clean", "Private_Dirty"):
                out["private"] += kb
            elif key in ("Shared_Clean", "Shared_Dirty"):
                out["shared"] += kb
    return out


class _Process:
    """One search process and what it has been sent (the front end's side)."""

    def __init__(self, slot: int):
        self.slot = slot
        ours, theirs = socket.socketpair()
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.popen = subprocess.Popen([sys.executable, "-m", "online.search.search_processes",
                                       "--owner", str(os.getpid()), "--fd", str(theirs.fileno())],
                                      pass_fds=(theirs.fileno(),), env=env)
        theirs.close()
        self.sock = ours
        self.values: dict[int, tuple[int, weakref.ref]] = {}   # id(array) -> (token, the array)
        self.next_token = 0
        self.forget_blocks: list[int] = []          # blocks that died since its last call (SearchProcesses fills)
        self.added: list[int] = []
        self.forget_values: list[int] = []
        self.snapshot: weakref.ref | None = None      # the snapshot the process has built its view of
        self.snapshot_token = 0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _ship(self, a: np.ndarray, forget_values: list[int]):
        desc = shared_arrays.describe(a)
        if desc is not None:
            return ("shared", desc)
        entry = self.values.get(id(a))
        if entry is not None and entry[1]() is a:
            return ("cached", entry[0])
        if entry is not None:
            forget_values.append(entry[0])
        if a.nbytes > VALUE_LIMIT:
            raise NotShared(f"an array of {a.nbytes} bytes {a.shape} is not in shared memory")
        self.next_token += 1
        self.values[id(a)] = (self.next_token, weakref.ref(a))
        self.added.append(id(a))
        return ("value", self.next_token, np.asarray(a))

    def call(self, index: ModelIndex, queries, exclude, ks, forget_blocks: list[int]) -> tuple:
        """``index.search_rows`` there; ``forget_blocks``: blocks that died since its last call."""
        forget_values = self.forget_values
        for key, (token, ref) in list(self.values.items()):
            if ref() is None:
                del self.values[key]
                forget_values.append(token)
        base = {"op": "search", "queries": np.ascontiguousarray(queries, np.float32), "exclude": exclude,
                "ks": list(ks)}
        if self.snapshot is not None and self.snapshot() is index:     # the same snapshot as the last call
            return self._exchange({**base, "forget_blocks": forget_blocks, "forget_values": forget_values,
                                   "snapshot": self.snapshot_token})
        self.added = []
        try:
            arrays = {name: self._ship(getattr(index, name), forget_values) for name in ModelIndex.SEARCHED}
            ivf, ivf_next = (None if lists is None else self._ship_lists(lists, forget_values)
                             for lists in (index.ivf, index.ivf_next))
        except NotShared:
            for key in self.added:                 # not sent after all
                self.values.pop(key, None)
            raise
        self.snapshot_token += 1
        self.snapshot = weakref.ref(index)
        return self._exchange({**base, "forget_blocks": forget_blocks, "forget_values": forget_values,
                               "snapshot": self.snapshot_token, "n": index.n, "dim": index.dim,
                               "n_tiles": index.n_tiles, "config": index.config, "arrays": arrays, "ivf": ivf,
                               "ivf_next": ivf_next})

    def _ship_lists(self, lists: IvfLists, forget_values: list) -> dict:
        out = {name: self._ship(getattr(lists, name), forget_values) for name in IVF_FIELDS}
        out["centroid_codes"] = tuple(self._ship(a, forget_values) for a in lists.centroid_codes)
        out.update({name: getattr(lists, name) for name in IVF_SCALARS})
        return out

    def _exchange(self, request: dict) -> tuple:
        try:
            _send(self.sock, request)
            self.forget_values = []
            answer = _recv(self.sock)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            raise SearchProcessLost(f"search process {self.pid}: {exc!r}") from None
        if answer[0] != "ok":
            raise SearchProcessLost(f"search process {self.pid} failed: {answer[1]}")
        return answer[1:]

    def ask(self, op: str) -> dict:
        try:
            _send(self.sock, {"op": op})
            return _recv(self.sock)[1]
        except (OSError, EOFError) as exc:
            raise SearchProcessLost(f"search process {self.pid}: {exc!r}") from None

    def close(self, timeout: float = 5.0) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class SearchProcesses:
    """N search processes; ``search_rows`` takes an idle one, or waits for one (one call in flight each)."""

    def __init__(self, count: int, registry=None):
        if not shared_arrays.enabled():
            raise RuntimeError("shared_arrays.enable() must be called before the model loads")
        self.count = int(count)
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._procs: list[_Process | None] = [None] * self.count
        self._dead_since = [0.0] * self.count
        self._start_failing = [False] * self.count
        self._lock = threading.Lock()
        self._closed = False
        self._warned = False
        self._memory: tuple[float, list] = (-1e9, [])
        self.counters = {"calls": 0, "fallbacks": 0, "restarts": 0}
        self._restarts = self._fallbacks = None
        if registry is not None:
            self._restarts = registry.counter("livevec_frontend_search_process_restarts_total",
                                              "search processes that died and were started again")
            self._fallbacks = registry.counter("livevec_frontend_search_process_fallbacks_total",
                                               "query batches the front end searched itself: no search process "
                                               "was alive")
            registry.gauge("livevec_frontend_search_processes", "search processes alive",
                           fn=lambda: float(sum(p is not None and p.popen.poll() is None for p in self._procs)))

    def start(self) -> None:
        for slot in range(self.count):
            self._procs[slot] = _Process(slot)
            self._idle.put(slot)
        log_event(log, "search_processes_started", count=self.count, pids=self.pids())

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None]

    def search_rows(self, index: ModelIndex, queries, exclude, ks) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """``index.search_rows`` in a search process (in this one if none is alive); the caller holds ``index``
        for the call, which keeps every array it maps unwritten."""
        slot = self._idle.get()
        try:
            proc = self._procs[slot] or self._restart(slot)
            if proc is not None:
                gone = self._forget_blocks(proc)
                try:
                    out = proc.call(index, queries, exclude, ks, gone)
                    self.counters["calls"] += 1
                    return out
                except SearchProcessLost as exc:
                    self._lost(slot, proc, exc)
                except NotShared as exc:
                    with self._lock:
                        proc.forget_blocks.extend(gone)
                    if not self._warned:
                        self._warned = True
                        log_event(log, "search_not_shared", logging.ERROR, error=str(exc))
            self.counters["fallbacks"] += 1
            if self._fallbacks is not None:
                self._fallbacks.inc()
            return index.search_rows(queries, exclude, ks)
        finally:
            self._idle.put(slot)

    def _forget_blocks(self, proc: _Process) -> list[int]:
        """The blocks ``proc`` should unmap: every process hears of each dead block once."""
        with self._lock:
            gone = shared_arrays.forgotten()
            for p in self._procs:
                if p is not None:
                    p.forget_blocks.extend(gone)
            out, proc.forget_blocks = proc.forget_blocks, []
        return out

    def _lost(self, slot: int, proc: _Process, exc: Exception) -> None:
        code = proc.popen.poll()
        log_event(log, "search_process_lost", logging.WARNING, pid=proc.pid, exit_code=code, error=str(exc))
        try:
            proc.close(timeout=1.0)
        except OSError:
            pass
        self._procs[slot] = None
        self._dead_since[slot] = time.monotonic()

    def _restart(self, slot: int) -> _Process | None:
        if self._closed or time.monotonic() - self._dead_since[slot] < RESTART_BACKOFF:
            return None
        try:
            proc = _Process(slot)
        except OSError as exc:             # no fork, no fds: search here, try again after the back-off
            self._dead_since[slot] = time.monotonic()
            if not self._start_failing[slot]:        # one line per streak of failures, not one a second
                self._start_failing[slot] = True
                log_event(log, "search_process_start_failed", logging.WARNING, slot=slot, error=repr(exc))
            return None
        self._start_failing[slot] = False
        self._procs[slot] = proc
        self.counters["restarts"] += 1
        if self._restarts is not None:
            self._restarts.inc()
        log_event(log, "search_process_restarted", pid=proc.pid, slot=slot)
        return proc

    def memory(self) -> list[dict]:
        """Each live process's memory (``memory_of``), for ``/v1/stats`` and the bench; read at most every
        ``MEMORY_EVERY`` seconds (a large mapping's page tables take milliseconds to walk)."""
        now = time.monotonic()
        if now - self._memory[0] < MEMORY_EVERY:
            return self._memory[1]
        out = []
        for p in self._procs:
            if p is not None and p.popen.poll() is None:
                try:
                    out.append({"pid": p.pid, **memory_of(p.pid)})
                except OSError:
                    pass
        self._memory = (now, out)
        return out

    def report(self) -> dict:
        return {"count": self.count, "pids": self.pids(), **self.counters, "processes": self.memory(),
                "shared_blocks": shared_arrays.report()}

    def stop(self) -> None:
        self._closed = True
        for slot, p in enumerate(self._procs):
            if p is not None:
                p.close()
                self._procs[slot] = None


# --------------------------------------------------------------------- the search process
def serve(sock: socket.socket, owner_pid: int) -> None:
    """Answer the owner's requests until it closes the socket."""
    attached = shared_arrays.Attached(owner_pid)
    values: dict[int, np.ndarray] = {}
    # the last snapshot described: (its token, its search view). The owner names it again only while it
    # holds that snapshot for the call, so the view's rows are unwritten whenever it is searched
    view: list = [0, None]

    def take(item):
        if item[0] == "shared":
            return attached.array(item[1])
        if item[0] == "value":
            values[item[1]] = item[2]
            return item[2]
        return values[item[1]]

    while True:
        try:
            request = _recv(sock)
        except EOFError:
            return
        if request["op"] == "memory":
            _send(sock, ("ok", {"pid": os.getpid(), "blocks_mapped": len(attached), "values": len(values),
                                **memory_of(os.getpid())}))
            continue
        try:
            if "arrays" not in request and request["snapshot"] != view[0]:
                raise ValueError(f"snapshot {request['snapshot']} was never described (have {view[0]})")
            view[1] = None if "arrays" in request else view[1]     # let go of its mappings before forgetting
            attached.forget(request["forget_blocks"])
            for token in request["forget_values"]:
                values.pop(token, None)
            if "arrays" in request:
                arrays = {name: take(item) for name, item in request["arrays"].items()}
                ivf, ivf_next = (None if spec is None else IvfLists(
                    **{name: take(spec[name]) for name in IVF_FIELDS},
                    centroid_codes=tuple(take(item) for item in spec["centroid_codes"]),
                    **{name: spec[name] for name in IVF_SCALARS}) for spec in (request["ivf"], request["ivf_next"]))
                view[:] = [request["snapshot"], ModelIndex.for_search(request["n"], request["dim"], request["n_tiles"],
                                                                      request["config"], arrays, ivf, ivf_next)]
                del arrays, ivf, ivf_next
            top, scores, reasons = view[1].search_rows(request["queries"], request["exclude"], request["ks"])
            answer = ("ok", top, scores, reasons)
        except Exception as exc:       # a bug here must not take the process down: the owner falls back
            log_event(log, "search_request_failed", logging.ERROR, error=repr(exc))
            answer = ("error", repr(exc))
        _send(sock, answer)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="a search process of a livevec front end (started by it)")
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sock = socket.socket(fileno=args.fd)
    from online.search.model_index import warm_up
    warm_up()
    try:
        serve(sock, args.owner)
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
