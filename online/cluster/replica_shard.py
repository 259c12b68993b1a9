"""A worker's replica of the rows it trains: the values, and what the servers last confirmed of each.

The arithmetic of the exchange, replica side (the servers' side is ``online.learner.concurrent_merge``). Per
row the replica keeps ``base``, the servers' last confirmed value, and, since the last collect, the row's
*contraction* (the ``pairs`` kernel's, ``sgns_kernel.train_inplace_rows``; ``tracks_contraction``):

* **collect**: ``delta = row - base`` (and the AdaGrad accumulator's), with the contraction ``c`` where it is
  tracked; then ``base = row``. The rows: those changed here since the last collect, those the servers changed
  since this replica last asked (``mark_stale``: so a row trained here next starts from the cluster's value),
  and a turn of the other held rows (``REFRESH_SHARE``);
* the servers combine the concurrent deltas of a row (by their contraction when it is sent, else by their
  alignment) and answer the merged value ``S``;
* **apply**: ``row += S - base``, ``base = S``: the others' work comes in, this replica's since the collect
  stays on top.

``online.cluster.replica`` runs the sync (the wire, the vocabulary, the batches a sync carried);
``online.cluster.host_replica`` keeps these arrays in a segment the processes of a host share.
Design: docs/design/0001-replica-exchange.md
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from online.cluster.delta_rows import large_deltas, merge_answer, take_deltas, unsent_rows
from online.cluster.delta_wire import pack_deltas, packed_buffer
from online.learner.embedding_shard import EmbeddingShard

REFRESH_SHARE_DEFAULT = 0.1   # ``online.cluster.replica.REFRESH_SHARE``'s default
SEND_SHARE_DEFAULT = 0.05     # ``online.cluster.replica.SEND_SHARE``'s default
FLUSH_EVERY_DEFAULT = 8       # ``online.cluster.replica.FLUSH_EVERY``'s default


class ReplicaShard(EmbeddingShard):
    """An ``EmbeddingShard`` that also keeps the servers' last confirmed value of every row."""

    REFRESH_MIN = 256     # idle rows a sync refreshes at least: every held row within rows / that syncs
    tracks_contraction = True   # the trainer's kernel measures each row's contraction, and ``collect`` sends it
                                # (False: the servers merge these deltas by their alignment)
    shared = False        # one replica for several processes (``online.cluster.host_replica``)
    group = 0             # the id servers merge this replica's deltas under (0: the sending node's)
    rows_refused = 0      # keys a full replica had no room for (only a shared one cannot grow)
    send_share = 0.0      # a changed row's delta waits until |row - base| >= send_share |row| (0: sent at once)
    flush_every = FLUSH_EVERY_DEFAULT   # every this many collects, every waiting delta goes
    flush = False         # every waiting delta goes at the next collects (checkpoints, drains)
    flush_remainders = False   # and, with ``flush``, every int8 remainder (a drain's last sync)
    waiting = 0           # rows whose delta waited at the last collect

    def __init__(self, dim: int, refresh_share: float = REFRESH_SHARE_DEFAULT, **options):
        super().__init__(dim, **options)
        self.refresh_share = float(refresh_share)   # idle rows refreshed per sync, as a share of the changed ones
        self._created: list[np.ndarray] = []   # keys of rows created since the last take_created
        self.base = np.zeros_like(self.vectors)
        self.base_acc = np.zeros((self.capacity, 1), dtype=np.float32)
        self.contraction = np.zeros(self.capacity, dtype=np.float32)   # since the last collect (the kernel's)
        self.confirmed = np.zeros(self.capacity, dtype=bool)   # the servers' value has been applied
        self.synced_version = 0
        self._refresh_at = 0
        self._collects = 0
        self._stale = np.zeros(0, dtype=np.uint64)   # keys the servers changed since this replica last read them
        self.pending_free: set[int] = set()
        # Batches finished, batches whose word counts the servers acknowledged, and batches carried, per member
        # process (one here; a host's in ``host_replica``): a batch may be committed once a sync that collected
        # after it finished was acknowledged, and its counts were too.
        self.member = 0
        self._finished = np.zeros(1, dtype=np.int64)
        self._counted = np.zeros(1, dtype=np.int64)
        self._covered = np.zeros(1, dtype=np.int64)
        self._held = np.zeros(1, dtype=np.int64)
        self.collected_finished = self._finished.copy()   # ``_finished`` as the last collect saw it

    def _grow(self, needed: int) -> None:
        super()._grow(needed)
        cap = self.capacity
        if self.base.shape[0] < cap:
            base = np.zeros((cap, self.dim), dtype=np.float32)
            base[:self.base.shape[0]] = self.base
            acc = np.zeros((cap, 1), dtype=np.float32)
            acc[:self.base_acc.shape[0]] = self.base_acc
            confirmed = np.zeros(cap, dtype=bool)
            confirmed[:self.confirmed.shape[0]] = self.confirmed
            contraction = np.zeros(cap, dtype=np.float32)
            contraction[:self.contraction.shape[0]] = self.contraction
            self.base, self.base_acc, self.confirmed, self.contraction = base, acc, confirmed, contraction

    def rows_for(self, keys: np.ndarray, create: bool = True) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        with self._lock:
            if not create:
                return super().rows_for(keys, create=False)
            missing = self._index.lookup(keys) < 0
            rows = super().rows_for(keys, create=True)
            if missing.any():
                new = rows[missing]
                self.base[new] = self.vectors[new]
                self.base_acc[new] = self._accum_column(new)
                self.confirmed[new] = False
                self._created.append(keys[missing])
            if self.pending_free:
                self.pending_free.difference_update(keys.tolist())
            return rows

    @contextmanager
    def host_sync(self):
        """Held for a whole sync; only a replica shared by several processes needs it."""
        yield

    def claim_group(self, node_id: int) -> int:
        return 0

    # ------------------------------------------------ batches and the syncs that carried them
    def batch_finished(self) -> None:
        """This process finished training one more batch (its rows are stamped)."""
        self._finished[self.member] += 1

    def finished_batches(self) -> int:
        return int(self._finished[self.member])

    def covered_batches(self) -> int:
        """This process's batches that an acknowledged sync carried (whichever process ran it), and whose word counts
        the servers acknowledged. The counts go out before the collect (a round trip earlier), so a batch finished
        in between has its deltas in one sync and its counts in the next; committed on the deltas alone, its
        counts would be lost with a worker killed before that next sync, and its records never read again. With
        a replica the host shares, the counts are the process's own: another's sync carries only the deltas."""
        m = self.member
        return int(min(self._covered[m], self._counted[m]))

    def counts_sent(self, finished: int) -> None:
        """The servers acknowledged the word counts of this process's first ``finished`` batches."""
        with self._lock:
            self._counted[self.member] = max(int(self._counted[self.member]), int(finished))

    def cover(self, finished: np.ndarray) -> None:
        """A sync whose collect saw ``finished`` was acknowledged."""
        with self._lock:
            np.maximum(self._covered, finished, out=self._covered)

    def hold(self, held: bool) -> None:
        """A checkpoint holds this process's syncs (and, shared, every sync of the host)."""
        self._held[self.member] = int(held)

    def members(self) -> int:
        """Processes that train this replica (a host's, when shared: ``online.cluster.sync_interval``)."""
        return 1

    def held_elsewhere(self) -> bool:
        """Another process of the host holds syncs; never with a process's own replica."""
        return False

    def since_last_sync(self) -> float:
        """Seconds since a sync of this replica began (the host's, when shared)."""
        return float("inf")

    def sync_began(self) -> None:
        pass

    def wait_host_idle(self, timeout: float) -> bool:
        """No other process of the host is in a sync (always, with a process's own replica)."""
        return True

    def close(self) -> None:
        """Nothing to release for a process's own replica."""

    def _accum_column(self, rows: np.ndarray) -> np.ndarray:
        if not self.accum.shape[0]:
            return np.zeros((len(rows), 1), dtype=np.float32)
        return self.accum[rows].mean(axis=1, keepdims=True)

    def add_contraction(self, rows: np.ndarray, values: np.ndarray) -> None:
        """A batch's contraction of the rows it trained (``sgns_kernel.train_inplace_rows``), added without
        the lock like the kernel's own writes: a sum lost to a race only weakens one row's merge weight."""
        self.contraction[rows] += values

    def take_created(self) -> np.ndarray:
        """Keys of the rows created here since the last call that no kernel has written since and the servers
        have not answered: rows to fetch before they are trained (a word new to this replica is rarely new to
        the cluster)."""
        with self._lock:
            if not self._created:
                return np.zeros(0, dtype=np.uint64)
            keys = np.unique(np.concatenate(self._created))
            self._created = []
            rows = self._index.lookup(keys)
            live = rows >= 0
            keys, rows = keys[live], rows[live]
            untouched = (~self.confirmed[rows]) & (self.row_version[rows] == self.row_born[rows])
            return keys[untouched]

    def mark_stale(self, keys: np.ndarray) -> None:
        """Keys whose rows the servers changed (other replicas' deltas): the next collect refreshes the ones held
        here, so that a row trained here next starts from the cluster's value, not from one several syncs old
        (a delta from a stale row moves it towards its data from the wrong point; with many replicas the
        largest loss after the merge rule, docs/design/0001-replica-exchange.md)."""
        with self._lock:
            self._stale = np.union1d(self._stale, np.asarray(keys, dtype=np.uint64))

    def free(self, keys: np.ndarray) -> int:
        """Deferred: the rows leave after the next sync has sent their last delta."""
        with self._lock:
            self.pending_free.update(np.asarray(keys, dtype=np.uint64).tolist())
            return self.version

    def collect_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
        """A sync's payload: (keys, rows, deltas, pushed, fresh), the keys ascending within three blocks:

        * the first ``pushed``: rows changed here since the last collect (stamped) that the servers answered for
          before: their deltas go out (``CMD_DELTA``). With ``send_share`` set, only the rows whose delta reached
          that share of the row's norm, or all of them at every ``flush_every``-th collect or while ``flush`` is
          set; the others keep their base, so their delta grows until it goes (error feedback: nothing trained
          is lost), and are stamped again so the next collect weighs them anew;
        * the next ``fresh``: rows created here that no answer of the servers has reached yet: their deltas go
          out as such (``CMD_DELTA_FRESH``);
        * the rest: rows only refreshed, so that a row trained here next starts from the cluster's value: the
          servers changed them (``mark_stale``), or it is their turn (the next ``refresh_share`` of the other
          rows held, so rows no longer trained here also learn what other workers did). They are pulled, and
          their base is left as it is: whatever a kernel still running wrote to them unstamped stays to send.

        ``deltas`` [pushed + fresh, dim + 1 (+ 1: the contraction)] holds the first two blocks' rows in order, so
        each request is a slice of it (splitting it by a mask would copy the payload once more per sync).
        ``rows`` lets ``apply`` skip the key look-ups."""
        with self._lock:
            self.collected_finished = self._finished.copy()   # before the stamps: those batches are in
            now, before = self.version, self.synced_version
            stamps = self.row_version[:self._next_row]
            changed = np.flatnonzero(stamps > before)
            if self.flush and self.flush_remainders:   # the int8 deltas' remainders too: the servers get all of it
                changed = np.union1d(changed, unsent_rows(self.vectors, self.base, self.confirmed, self._next_row))
            self._collects += 1
            waiting = self._waiting(changed)
            if len(waiting):
                changed = np.setdiff1d(changed, waiting, assume_unique=True)
            budget = max(self.REFRESH_MIN, int(len(changed) * self.refresh_share))
            lo = self._refresh_at if self._refresh_at < self._next_row else 0
            turn = np.arange(lo, lo + min(budget, self._next_row), dtype=np.int64) % max(self._next_row, 1)
            self._refresh_at = int(turn[-1]) + 1 if len(turn) else 0
            turn = turn[stamps[turn] > 0]                                    # freed rows have no stamp
            wanted = np.zeros(self._next_row, dtype=bool)                   # the union, without a sort
            wanted[changed] = True
            wanted[turn] = True
            if len(self._stale):
                stale = self._index.lookup(self._stale)
                wanted[stale[(stale >= 0) & (stale < self._next_row)]] = True
                self._stale = np.zeros(0, dtype=np.uint64)
            rows = np.flatnonzero(wanted)
            rows = rows[self._index.lookup(self.row_keys[rows]) == rows]   # live rows only
            self.synced_version = now
            self.waiting = len(waiting)
            if len(waiting):   # stamped past this collect: the next one weighs them again
                stamp = self.version + 1
                self.row_version[waiting] = stamp
                self.version = max(self.version, stamp)
            keys = self.row_keys[rows]
            fresh = ~self.confirmed[rows]
            pushing = np.zeros(self._next_row, dtype=bool)   # a waiting row may be refreshed, never pushed
            pushing[changed] = True
            block = np.where(fresh, 1, np.where(pushing[rows], 0, 2)).astype(np.int8)
            order = np.argsort(keys)
            order = order[np.argsort(block[order], kind="stable")]
            rows, keys, block = rows[order], keys[order], block[order]
            pushed, fresh_n = int(np.count_nonzero(block == 0)), int(np.count_nonzero(block == 1))
            out = np.empty((pushed + fresh_n, self.dim + (2 if self.tracks_contraction else 1)), dtype=np.float32)
            take_deltas(self.vectors, self.accum, self.base, self.base_acc, self.contraction,
                        rows[:pushed + fresh_n], out)
            return keys, rows, out, pushed, fresh_n

    def _waiting(self, changed: np.ndarray) -> np.ndarray:
        """The rows of ``changed`` whose delta waits: too small for ``send_share``, confirmed by the servers, not
        about to be freed, and neither a flush nor the ``flush_every``-th collect."""
        if not self.send_share or self.flush or not len(changed) or self._collects % max(self.flush_every, 1) == 0:
            return np.zeros(0, dtype=np.int64)
        large = np.empty(len(changed), dtype=np.bool_)
        large_deltas(self.vectors, self.base, changed.astype(np.int64), np.float32(self.send_share), large)
        wait = ~large & self.confirmed[changed]
        if self.pending_free and wait.any():
            freeing = np.fromiter(self.pending_free, dtype=np.uint64, count=len(self.pending_free))
            wait &= ~np.isin(self.row_keys[changed], freeing)
        return changed[wait]

    def pack(self, deltas: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``deltas`` [n, dim + 1 (+ 1)] that ``collect_parts`` took for ``rows`` as packed wire rows [n, width]
        (``online.cluster.delta_wire``); each base moves back by what the int8 codes cannot say, which the next
        collect sends (error feedback)."""
        wire, head, codes = packed_buffer(len(rows), self.dim, deltas.shape[1] > self.dim + 1)
        with self._lock:
            pack_deltas(deltas, self.base, np.ascontiguousarray(rows, dtype=np.int64), head, codes)
        return wire

    def collect(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``collect_parts`` as one payload by key: (sorted keys, deltas [n, width], fresh), the rows only
        refreshed with zero deltas (what ``bench/replica_simulation.py`` sends, and tests read)."""
        keys, _, deltas, pushed, fresh_n = self.collect_parts()
        out = np.zeros((len(keys), deltas.shape[1]), dtype=np.float32)
        out[:len(deltas)] = deltas
        fresh = np.zeros(len(keys), dtype=bool)
        fresh[pushed:pushed + fresh_n] = True
        order = np.argsort(keys)
        return keys[order], out[order], fresh[order]

    def apply(self, keys: np.ndarray, merged: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Bring in the servers' merged values (``merged`` [n, dim + 1]), keeping local changes on top. ``rows``:
        those of ``keys``, as ``collect_parts`` gave them (a row is freed only after the sync that sent it)."""
        with self._lock:
            if rows is None:
                rows = self._index.lookup(keys)
                live = rows >= 0
                rows, merged = rows[live], merged[live]
            merged = np.ascontiguousarray(merged, dtype=np.float32)
            merge_answer(self.vectors, self.accum, self.base, self.base_acc, rows, merged)
            self.confirmed[rows] = True

    def adopt(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Set rows and their base to the servers' values (``values`` [n, dim + 1]), dropping what was
        trained here since the collect: a reload after a rollback (``overwrite``). A sync's answers, fresh
        rows' included, go through ``apply``, which keeps that work."""
        with self._lock:
            rows = self._index.lookup(keys)
            live = rows >= 0
            rows, values = rows[live], values[live]
            self.vectors[rows] = values[:, :self.dim]
            self.base[rows] = values[:, :self.dim]
            if self.accum.shape[0]:
                self.accum[rows] = values[:, self.dim:]
            self.base_acc[rows, 0] = values[:, self.dim]
            self.confirmed[rows] = True

    def overwrite(self, keys: np.ndarray, values: np.ndarray) -> None:
        """``adopt`` every row of ``keys`` (a reload after a rollback): nothing is pending after."""
        with self._lock:
            self.adopt(keys, values)
            self.synced_version = self.version

    def release_freed(self) -> int:
        """Drop the rows of evicted words (their last delta has been sent)."""
        with self._lock:
            if not self.pending_free:
                return 0
            keys = np.fromiter(self.pending_free, dtype=np.uint64, count=len(self.pending_free))
            self.pending_free.clear()
            return super().free(keys)
