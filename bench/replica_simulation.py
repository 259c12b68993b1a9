"""k worker replicas against one shard, in one process, deterministically: how the delta exchange learns.

    .venv/bin/python bench/replica_simulation.py [--workers 8] [--max-tokens 3000000] [--sync-tokens 25000]
        [--merge contraction|align|sum] [--seeds]
    .venv/bin/python bench/replica_simulation.py --seeds --sweep 1,2,4,8,16,32,64 [--interval round|k2|fixed]
    .venv/bin/python bench/replica_simulation.py --seeds --workers 16 --sync-tokens 625 [--lag 0.5 | --jitter 0.3]
    .venv/bin/python bench/replica_simulation.py --seeds --workers 64 --sync-tokens 2500 [--tiers 256]
        [--send-threshold 0.05 --max-hold 8] [--list-threshold 0.1] [--wire-out i8 --wire-in f16]

Why: the real pipeline (``cluster_learning.py``) mixes the exchange's arithmetic with Kafka, scheduling
and load on two cores, and one run takes minutes. This runs the same pieces (``Trainer`` with its in-place
kernel, ``ReplicaShard`` collect/apply, ``EmbeddingShard.add_deltas`` with the fresh-row rule and the
concurrent merge, the cluster's word counts) in rounds: every worker trains ``--sync-tokens`` tokens of
its own share of the corpus (5,000-token batches, dealt round-robin), then every worker syncs, in order.
So staleness and concurrency are exact and repeatable, and a change to how deltas combine is judged in
about a minute. It is a model of the exchange, not a measurement of the product: no threads, no
network, no timing. Prints gensim's evaluators on the shard's input rows (analogy, WS353, SimLex) and
the norms of the most frequent words' rows (a diverging exchange shows as norms of 30 - 70 against ~2).
``--lag`` and ``--jitter`` bring in two things the lockstep rounds leave out: training while a sync is in flight,
and replicas that sync on their own clocks (the first costs quality, the second does not:
``docs/design/0001-replica-exchange.md``).
``--sweep`` runs several cluster sizes on the same tokens, each replica syncing at the interval ``--interval``
names for it, and prints a table against the first (1 replica: one shared model).
The exchange's cost is counted per kept token: rows out (deltas, each merged by the servers), rows in (answers,
refreshes, new rows), the keys of changed rows listed, the payload's bytes, and the time in the servers' calls.
The candidates for a cost that does not grow with the replicas are options: tiers of rows by frequency
(``--tiers``), deltas held back until they grow (``--send-threshold``, ``--send-contraction``, ``--top-rows``),
changed rows listed to the others only once they moved enough (``--list-threshold``), and fewer bits on the wire
(``--wire-out``, ``--wire-in``): docs/design/0008-scalable-exchange.md.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from online.cluster.delta_rows import take_deltas       # noqa: E402
from online.cluster.replica import REFRESH_SHARE, ReplicaShard, TrainableJournal, summed_counts  # noqa: E402
from online.cluster.server import MERGE_WINDOW_SYNCS     # noqa: E402
from online.cluster.sync_interval import SYNC_TOKENS_MAX, default_sync_tokens  # noqa: E402
from online.learner.concurrent_merge import CONTRACTION_SCALE  # noqa: E402
from online.learner.embedding_shard import EmbeddingShard  # noqa: E402
from online.learner.keys import word_key, word_rows      # noqa: E402
from online.learner.trainer import LearnerConfig, Trainer, kernel_for  # noqa: E402
from quality_vs_gensim import evaluate                   # noqa: E402
from stream_throughput import DEFAULT_CORPUS, read_prefix  # noqa: E402

BATCH_TOKENS = 5_000


class HeldBackShard(ReplicaShard):
    """A ``ReplicaShard`` whose collect sends only the rows due at this sync. A changed row that is not due keeps
    its base, so its delta, its accumulator increment and its contraction go on adding up until it is sent (error
    feedback: nothing trained is lost, it only waits); a row the servers changed that is not due keeps waiting for
    its refresh. Rows created here (fresh) and rows about to be freed always go. The rules, each optional:

    * ``tiers`` (``--tiers N``): pWord2Vec's schedule. The rows of the N words the cluster counts most are due at
      every sync, the next N at every 2nd, the next 2N at every 4th, and so on up to every ``2^tier_levels``-th;
      rows of words not ranked are in the last tier. Deltas, refreshes, or both.
    * ``send_threshold`` (``--send-threshold X``): a changed row is due once ``|row - base| >= X |row|``.
    * ``contraction_threshold`` (``--send-contraction X``): a changed row is due once the contraction the kernel
      measured since it was last sent reaches X (``pairs`` only; every row's steps count alike, so the rows per
      token are the kernel's contraction per token / X, whatever the replicas).
    * ``max_hold``: a row held back this many syncs is due whatever its size.
    * ``refresh_recent`` (``--refresh-recent M``): of the rows the servers list as changed, only those trained
      here within the last M syncs are refreshed (the workers' rule, ``online.cluster.replica_shard``).
    * ``flush_every`` (``--flush-every M``): every M-th sync sends every held row (the workers' rule,
      ``online.cluster.replica_shard``: no per-row age is kept).
    * ``top_rows`` (``--top-rows K``): of the changed rows otherwise due, the K with the largest delta.

    The size rules are judged when a kernel wrote the row (a held row's delta changes only then: a refresh moves
    the row and its base together)."""

    def __init__(self, dim: int, refresh_share: float, *, tier_levels: int = 0, tiered: str = "both",
                 send_threshold: float = 0.0, contraction_threshold: float = 0.0, max_hold: int = 0,
                 flush_every: int = 0, refresh_recent: int = 0,
                 top_rows: int = 0, **options):
        super().__init__(dim, refresh_share, **options)
        self.tier_levels = int(tier_levels)
        self.tiered_deltas = tiered in ("both", "deltas")     # the tiers hold back deltas,
        self.tiered_refresh = tiered in ("both", "refresh")   # refreshes, or both
        self.send_threshold = float(send_threshold)
        self.contraction_threshold = float(contraction_threshold)
        self.max_hold = int(max_hold)
        self.flush_every = int(flush_every)
        self.refresh_recent = int(refresh_recent)
        self._past_versions = collections.deque([0], maxlen=max(self.refresh_recent, 1))
        self.top_rows = int(top_rows)
        self.flushing = False                       # every row due (the end of a run: nothing stays held)
        self.syncs = 0
        self.tier = np.zeros(self.capacity, dtype=np.int8)
        self.held = np.zeros(self.capacity, dtype=bool)        # changed here, not sent yet
        self.big = np.zeros(self.capacity, dtype=bool)         # held, and large enough to go
        self.held_since = np.zeros(self.capacity, dtype=np.int64)

    def _grow(self, needed: int) -> None:
        super()._grow(needed)
        cap, old = self.capacity, self.held.shape[0]
        if old < cap:
            self.tier = np.concatenate([self.tier, np.full(cap - old, self.tier_levels, np.int8)])
            self.held = np.concatenate([self.held, np.zeros(cap - old, bool)])
            self.big = np.concatenate([self.big, np.zeros(cap - old, bool)])
            self.held_since = np.concatenate([self.held_since, np.zeros(cap - old, np.int64)])

    def rank(self, keys: np.ndarray, tiers: np.ndarray) -> None:
        """Each row key's tier (rows of other keys: the last tier)."""
        with self._lock:
            self.tier[:] = self.tier_levels
            rows = self._index.lookup(np.ascontiguousarray(keys, dtype=np.uint64))
            known = rows >= 0
            self.tier[rows[known]] = tiers[known]

    def _tier_due(self, rows: np.ndarray, tiered: bool) -> np.ndarray:
        if not self.tier_levels or self.flushing or not tiered:
            return np.ones(len(rows), dtype=bool)
        return self.syncs % (np.int64(1) << self.tier[rows].astype(np.int64)) == 0

    def _large(self, rows: np.ndarray) -> np.ndarray:
        """Which of the rows a kernel just wrote are large enough to go (the size rules)."""
        if not (self.send_threshold or self.contraction_threshold):
            return np.ones(len(rows), dtype=bool)
        large = np.zeros(len(rows), dtype=bool)
        if self.send_threshold:
            d = self.vectors[rows] - self.base[rows]
            v = self.vectors[rows]
            large |= np.einsum("ij,ij->i", d, d) >= self.send_threshold ** 2 * np.einsum("ij,ij->i", v, v)
        if self.contraction_threshold:
            large |= self.contraction[rows] * CONTRACTION_SCALE >= self.contraction_threshold
        return large

    def _push(self, n: int) -> np.ndarray:
        """The held rows whose deltas go at this sync."""
        held = np.flatnonzero(self.held[:n])
        due = self.big[held] | ~self.confirmed[held] | self.flushing
        if self.max_hold:
            due |= self.syncs - self.held_since[held] >= self.max_hold
        if self.flush_every and self.syncs % self.flush_every == 0:
            due[:] = True
        if self.pending_free:
            due |= np.isin(self.row_keys[held], np.fromiter(self.pending_free, np.uint64))
        due &= self._tier_due(held, self.tiered_deltas) | ~self.confirmed[held]
        push = held[due]
        if self.top_rows and len(push) > self.top_rows and not self.flushing:
            d = self.vectors[push] - self.base[push]
            push = push[np.argsort(-np.einsum("ij,ij->i", d, d), kind="stable")[:self.top_rows]]
        return push[self._index.lookup(self.row_keys[push]) == push]     # live rows only

    def collect_parts(self):
        """``ReplicaShard.collect_parts`` with only the rows due, in the same blocks and layout: the changed rows
        due push their deltas (fresh ones as such), the stale rows due are pulled, a turn of the other held rows
        is pulled. A held-back row may be pulled: the answer comes in under what it holds (``apply``), so its
        delta still waits whole."""
        with self._lock:
            self.syncs += 1
            self.collected_finished = self._finished.copy()
            now, before = self.version, self.synced_version
            n = self._next_row
            stamps = self.row_version[:n]
            written = np.flatnonzero(stamps > before)
            self.held_since[written[~self.held[written]]] = self.syncs
            self.held[written] = True
            self.big[written] = self._large(written)
            push = self._push(n)
            self.held[push] = False
            self.big[push] = False
            stale = np.zeros(0, dtype=np.int64)
            if len(self._stale):
                stale = self._index.lookup(self._stale)
                stale = stale[(stale >= 0) & (stale < n)]
                stale = stale[self._index.lookup(self.row_keys[stale]) == stale]
                waits = ~self._tier_due(stale, self.tiered_refresh)
                self._stale = self.row_keys[stale[waits]]
                stale = stale[~waits]
                if self.refresh_recent:   # only the rows trained here lately (the others catch up when next sent)
                    stale = stale[stamps[stale] > self._past_versions[0]]
            self._past_versions.append(now)
            budget = max(self.REFRESH_MIN, int(len(push) * self.refresh_share))
            lo = self._refresh_at if self._refresh_at < n else 0
            turn = np.arange(lo, lo + min(budget, n), dtype=np.int64) % max(n, 1)
            self._refresh_at = int(turn[-1]) + 1 if len(turn) else 0
            turn = turn[stamps[turn] > 0]
            turn = turn[self._index.lookup(self.row_keys[turn]) == turn]
            wanted = np.zeros(n, dtype=bool)
            wanted[push] = True
            wanted[stale] = True
            wanted[turn] = True
            pushing = np.zeros(n, dtype=bool)
            pushing[push] = True
            rows = np.flatnonzero(wanted)
            self.synced_version = now
            keys = self.row_keys[rows]
            block = np.where(~self.confirmed[rows], 1, np.where(pushing[rows], 0, 2)).astype(np.int8)
            order = np.argsort(keys)
            order = order[np.argsort(block[order], kind="stable")]
            rows, keys, block = rows[order], keys[order], block[order]
            pushed, fresh_n = int(np.count_nonzero(block == 0)), int(np.count_nonzero(block == 1))
            out = np.empty((pushed + fresh_n, self.dim + (2 if self.tracks_contraction else 1)), dtype=np.float32)
            take_deltas(self.vectors, self.accum, self.base, self.base_acc, self.contraction,
                        rows[:pushed + fresh_n], out)
            return keys, rows, out, pushed, fresh_n


class ListingShard(EmbeddingShard):
    """The servers' shard with a thresholded list of changed rows (``--list-threshold X``): a merged delta makes a
    row listed to the other replicas (``changed_keys_since``, which they refresh) only once the merges moved it by
    X |row| since it was last listed, measured as the sum of the norms of the deltas sent (one float a row, a bound on
    the distance the merges moved it: ``online.cluster.change_listing``). The answers to a replica's own deltas still carry the whole merged row; a row not listed yet
    waits for the replica's next delta of it, its tier's refresh turn, or the merges that follow."""

    def __init__(self, dim: int, list_threshold: float, **options):
        super().__init__(dim, **options)
        self.list_threshold = float(list_threshold)
        self.listed = np.zeros(self.capacity, dtype=np.int64)      # the version a row was last listed at
        self.moved = np.zeros(self.capacity, dtype=np.float32)     # what the merges moved it by since

    def _grow(self, needed: int) -> None:
        super()._grow(needed)
        cap = self.capacity
        if self.listed.shape[0] < cap:
            self.listed = np.concatenate([self.listed, np.zeros(cap - self.listed.shape[0], np.int64)])
            self.moved = np.concatenate([self.moved, np.zeros(cap - self.moved.shape[0], np.float32)])

    def add_deltas(self, keys, deltas, accum_deltas, fresh=False, sender=0, now=None, contraction=None):
        with self._lock:
            rows = self.rows_for(np.ascontiguousarray(keys, dtype=np.uint64), create=True)
            out = super().add_deltas(keys, deltas, accum_deltas, fresh, sender, now, contraction)
            after = self.vectors[rows]
            step = np.linalg.norm(deltas, axis=1)   # the delta sent, a bound on the merged step (the servers' rule)
            moved = step > 0
            rows, step, after = rows[moved], step[moved], after[moved]
            np.add.at(self.moved, rows, step)
            due = self.moved[rows] >= self.list_threshold * np.linalg.norm(after, axis=1)
            self.listed[rows[due]] = self.version
            self.moved[rows[due]] = 0.0
            return out

    def changed_keys_since(self, version: int, asker: int = -1) -> tuple[int, np.ndarray]:
        with self._lock:
            rows = np.flatnonzero(self.listed[:self._next_row] > version)
            rows = rows[self._index.lookup(self.row_keys[rows]) == rows]
            if asker >= 0 and len(rows):
                writer = np.full(len(rows), -1, dtype=np.int64)
                known = rows < len(self._last_mover)
                writer[known] = self._last_mover[rows[known]]
                rows = rows[writer != asker]
            return self.version, self.row_keys[rows]


WIRE_BYTES = {"f32": 4, "f16": 2, "i8": 1}   # bytes per value of a row on the wire (i8: and a 4-byte scale per row)


def on_the_wire(values: np.ndarray, wire: str) -> np.ndarray:
    """Rows of values [n, dim] as the other end reads them: float32 as they are, float16, or int8 codes with a
    scale per row (max |value| / 127)."""
    if wire == "f16":
        return values.astype(np.float16).astype(np.float32)
    if wire == "i8":
        scale = np.abs(values).max(axis=1, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
        return (np.clip(np.rint(values / scale), -127, 127) * scale).astype(np.float32)
    return values


def row_bytes(dim: int, wire: str) -> int:
    """A row's values on the wire (its accumulator, key and contraction not counted)."""
    return dim * WIRE_BYTES[wire] + (4 if wire == "i8" else 0)


class SimulatedReplica:
    """The ``ParamStore`` of one simulated worker: ``online.cluster.replica.ReplicaStore`` without ps-lite."""

    counts_every_word = True

    def __init__(self, server: EmbeddingShard, dim: int, node_id: int, seed: int, shard: ReplicaShard | None = None,
                 refresh_share: float = REFRESH_SHARE.default, rules: dict | None = None):
        self.server, self.dim, self.node_id = server, dim, node_id
        self.shared = shard is not None     # one replica for all workers, as threads would share it: no deltas
        self.contraction = True             # send each row's contraction (the merge's contraction rule)
        self.stale_refresh = True           # refresh held rows the servers changed (``ReplicaShard.mark_stale``)
        self.fetch_new_rows = True          # the cluster's new words held, fetched before they are trained
        self.seen_version = 0
        self.rows_sent = 0                  # rows answered (deltas merged, refreshes, new rows fetched): in
        self.rows_out = 0                   # rows whose delta went out (each merged on the servers): out
        self.keys_listed = 0                # keys of changed rows the servers listed (8 bytes each)
        self.server_seconds = 0.0           # in the servers' calls (counts, journal, changed rows, merge, reads)
        self.merge_seconds = 0.0            # of which in add_deltas: the merge and the answers to the deltas
        self.wire_out = self.wire_in = "f32"  # how deltas go out and merged rows come back (``on_the_wire``)
        self.sync_seconds = 0.0             # the replica's side of its syncs (collect, apply)
        self.lag = False                    # answers applied one interval late (``--lag``)
        self.pending: list = []
        if shard is None:
            shard = HeldBackShard(dim, refresh_share, optimizer="rowadagrad", seed=seed, **rules) if rules else \
                ReplicaShard(dim, refresh_share, optimizer="rowadagrad", seed=seed)
        self.shard = shard
        self.on_totals = None
        self.on_trainable = None
        self.journal = TrainableJournal(1)
        self._counts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def local_shard(self):
        return self.shard

    def pull(self, keys):
        return self.shard.pull(keys)

    def push(self, keys, grads):
        self.shard.push(keys, grads)

    def free(self, keys):
        self.shard.free(keys)

    def add_counts(self, keys, deltas):
        self.count_words(np.full(len(keys), -1, np.int64), keys, deltas)

    def count_words(self, slots, keys, deltas):
        self._counts.append((np.asarray(slots, np.int64).copy(), np.asarray(keys, np.uint64).copy(),
                             np.asarray(deltas, np.int64).copy()))

    def set_words(self, keys, words):
        pass

    def sync(self, now: float) -> None:
        t0 = time.perf_counter()
        server_t = self.server_seconds
        if self._counts:
            uniq, summed, last = summed_counts(self._counts)
            self._counts = []
            totals = self._server(self.server.count_words, uniq, np.rint(summed).astype(np.int64))
            if self.on_totals is not None:
                self.on_totals(last, uniq, totals)
        if self.on_trainable is not None:
            generation, since = self.journal._at[0]
            new = self.journal.answer(0, self._server(self.server.trainable_since, generation, since))
            if self.journal.changed:
                self.journal.changed = False
                self.on_trainable(self.journal.known(), new)
                if self.fetch_new_rows and len(new) and not self.shared:   # held before this replica meets them
                    self.shard.rows_for(word_rows(np.asarray(new, np.uint64)), create=True)   # (no bound here)
        if self.shared:
            return
        created = self.shard.take_created()
        if self.fetch_new_rows and len(created):   # the cluster's values of rows new here, before they are trained
            self.shard.adopt(created, self._received(self._server(self.server.read_rows, created)))
            self.rows_sent += len(created)
        if self.stale_refresh:   # the rows the servers changed since the last sync, refreshed by this one
            self.seen_version, changed = self._server(self.server.changed_keys_since, self.seen_version,
                                                      asker=self.node_id)
            self.keys_listed += len(changed)
            self.shard.mark_stale(changed)
        keys, deltas, fresh, pushed = self.collect()
        self.rows_sent += len(keys)
        self.rows_out += pushed
        answers = []
        for pick, is_fresh in ((~fresh, False), (fresh, True)):
            dim = self.dim
            merged = self._server(self.server.add_deltas, keys[pick], deltas[pick, :dim], deltas[pick, dim],
                                  fresh=is_fresh, sender=self.node_id, now=now,
                                  contraction=deltas[pick, dim + 1] if self.contraction else None)
            answers.append((keys[pick], merged))
        if self.lag:   # the answer arrives while the next interval trains (``simulate`` applies it)
            self.apply_pending()
            self.pending = answers
        else:
            for k, merged in answers:
                self.shard.apply(k, self._received(merged))
        self.shard.release_freed()
        self.sync_seconds += time.perf_counter() - t0 - (self.server_seconds - server_t)

    def collect(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``ReplicaShard.collect``'s payload (sorted keys, deltas with zeros for the rows only refreshed, fresh)
        and how many rows carry a delta."""
        keys, rows, deltas, pushed, fresh_n = self.shard.collect_parts()
        if self.wire_out != "f32" and len(deltas):   # what the wire drops stays in the row: base = what was sent
            sent = on_the_wire(deltas[:, :self.dim], self.wire_out)
            self.shard.base[rows[:len(deltas)]] -= deltas[:, :self.dim] - sent
            deltas[:, :self.dim] = sent
        out = np.zeros((len(keys), deltas.shape[1]), dtype=np.float32)
        out[:len(deltas)] = deltas
        fresh = np.zeros(len(keys), dtype=bool)
        fresh[pushed:pushed + fresh_n] = True
        order = np.argsort(keys)
        return keys[order], out[order], fresh[order], pushed + fresh_n

    def _received(self, merged: np.ndarray) -> np.ndarray:
        """The servers' answer as the wire brings it (the accumulators stay float32)."""
        if self.wire_in == "f32" or not len(merged):
            return merged
        merged = merged.copy()
        merged[:, :self.dim] = on_the_wire(merged[:, :self.dim], self.wire_in)
        return merged

    def _server(self, call, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent = time.perf_counter() - t0
            self.server_seconds += spent
            if call.__name__ == "add_deltas":
                self.merge_seconds += spent

    def apply_pending(self) -> None:
        for k, merged in self.pending:
            self.shard.apply(k, self._received(merged))
        self.pending = []

    def sync_hot(self, keys: np.ndarray, now: float) -> None:
        """Only the rows of ``keys`` held here and known to the servers: the hot tier, synced between the full syncs
        (their stamps stay, so the next full sync sends them again, with only what was trained since)."""
        if self.shared:
            return
        shard, dim = self.shard, self.dim
        rows = shard.rows_for(keys, create=False)
        pick = rows >= 0
        pick[pick] = shard.confirmed[rows[pick]]
        keys, rows = keys[pick], rows[pick]
        if not len(rows):
            return
        out = np.empty((len(rows), dim + 2), dtype=np.float32)
        take_deltas(shard.vectors, shard.accum, shard.base, shard.base_acc, shard.contraction, rows.astype(np.int64),
                    out)
        self.rows_sent += len(keys)
        self.rows_out += len(keys)
        shard.apply(keys, self._server(self.server.add_deltas, keys, out[:, :dim], out[:, dim], fresh=False,
                                       sender=self.node_id, now=now,
                                       contraction=out[:, dim + 1] if self.contraction else None))


def simulate_async(args, workers, batches, per_sync: int, server: EmbeddingShard) -> int:
    """``--jitter``: the replicas sync when their own clocks say so, not in lockstep. Each trains ``per_sync``
    batches per interval, and an interval lasts a lognormal time (median 1, sigma ``--jitter``), as processes
    time-slicing two cores do; the merge window is ``MERGE_WINDOW_SYNCS`` intervals, as on the servers. So
    rounds fragment (a replica that syncs twice while another has not synced once ends the round), which the
    lockstep mode never shows. A replica's training only reads its own rows, so training a whole interval at
    its sync's moment is exact."""
    import heapq
    rng = np.random.default_rng(7)
    server.merge_window = float(args.window_syncs)
    clock = [(float(rng.uniform(0, 1)), i) for i in range(len(workers))]
    heapq.heapify(clock)
    b = syncs = 0
    while b < len(batches):
        now, i = heapq.heappop(clock)
        trainer, store = workers[i]
        for _ in range(per_sync):
            if b < len(batches):
                trainer.train_records(batches[b])
                b += 1
        store.sync(now)
        syncs += 1
        heapq.heappush(clock, (now + float(rng.lognormal(0.0, args.jitter)), i))
        if syncs % len(workers) == 0:
            print(f"\r{len(workers)} replicas, {syncs:,} syncs: {b:,} batches", end="",
                  file=sys.stderr)
    for _, store in workers:   # the last intervals' work
        store.sync(now + 1.0)
    return syncs // len(workers)


def hot_keys(server: EmbeddingShard, words: list[str], n: int) -> np.ndarray:
    """The input and output rows' keys of the ``n`` words the cluster counted most."""
    if not n or not words:
        return np.zeros(0, np.uint64)
    keys = np.array([word_key(w) for w in words], np.uint64)
    top = keys[np.argsort(-server.word_counts.totals(keys), kind="stable")[:n]]
    return np.sort(word_rows(top))


def tiers(server: EmbeddingShard, words: list[str], first: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """(row keys, tier of each): the words ranked by the cluster's counts, ranks below ``first`` in tier 0,
    below ``2^t first`` in tier t, the rest in tier ``levels`` (pWord2Vec's ``min_sync_words`` schedule)."""
    keys = np.array([word_key(w) for w in words], np.uint64)
    rank = np.empty(len(keys), np.int64)
    rank[np.argsort(-server.word_counts.totals(keys), kind="stable")] = np.arange(len(keys))
    tier = np.minimum(np.ceil(np.log2(np.maximum(rank + 1, first) / first)), levels).astype(np.int8)
    return word_rows(keys), np.repeat(tier, 2)


def interval_for(args, k: int) -> int:
    """A replica's tokens per sync in a sweep over cluster sizes (``--interval``)."""
    if args.interval == "k2":
        return default_sync_tokens(k)
    if args.interval == "fixed":
        return args.sync_tokens
    return max(100, args.round_tokens // k)


def simulate(args, workers_n: int, sync_tokens: int, tokens: list[str]) -> dict:
    """One run: ``workers_n`` replicas, each training ``sync_tokens`` tokens between syncs."""
    batch_tokens = max(100, min(args.batch_tokens, sync_tokens))
    records = [" ".join(tokens[i:i + 100]) for i in range(0, len(tokens), 100)]
    per_batch = max(1, batch_tokens // 100)
    batches = [records[i:i + per_batch] for i in range(0, len(records), per_batch)]
    server = ListingShard(100, args.list_threshold, optimizer="rowadagrad", seed=1, min_count=args.min_count,
                          word_capacity=200_000) if args.list_threshold else \
        EmbeddingShard(100, optimizer="rowadagrad", seed=1, min_count=args.min_count, word_capacity=200_000)
    if args.merge in ("align", "contraction"):
        server.merge_window = 0.5          # rounds are 1 "second" apart: a round ends with it at the latest
        server._merge.floor = args.floor
        server._merge.contraction_scale = args.contraction_scale
        if args.acc == "sum":
            combine = server._merge.combine

            def combine_summing_accumulators(rows, deltas, accum_deltas, sender, now, contraction=None):
                out, _ = combine(rows, deltas, accum_deltas, sender, now, contraction)
                return out, np.asarray(accum_deltas, np.float32).reshape(-1)
            server._merge.combine = combine_summing_accumulators
    config = LearnerConfig(dim=100, vocab_capacity=200_000, min_count=args.min_count, eta=args.eta,
                           kernel=kernel_for(args.kernel, 1 if args.shared_replica else workers_n))
    workers = []
    shared = ReplicaShard(100, optimizer="rowadagrad", seed=1) if args.shared_replica else None
    rules = {name: value for name, value in (("tier_levels", args.tier_levels if args.tiers else 0),
                                             ("tiered", args.tiered if args.tiers else None),
                                             ("send_threshold", args.send_threshold),
                                             ("contraction_threshold", args.send_contraction),
                                             ("max_hold", args.max_hold),
                                             ("flush_every", args.flush_every),
                                             ("refresh_recent", args.refresh_recent), ("top_rows", args.top_rows)) if value}
    for i in range(workers_n):
        store = SimulatedReplica(server, 100, 9 + 2 * i, seed=1, shard=shared, refresh_share=args.refresh_share,
                                 rules=rules)
        trainer = Trainer(config, store)
        if args.seeds:
            trainer.reseed(9 + 2 * i)
        store.on_totals = trainer.apply_cluster_counts
        if not args.no_journal:
            store.on_trainable = trainer.learn_cluster_trainable
        store.contraction = args.merge == "contraction"
        store.stale_refresh = not args.no_stale_refresh
        store.fetch_new_rows = not args.no_prefetch
        store.lag = args.lag > 0
        store.wire_out, store.wire_in = args.wire_out, args.wire_in
        workers.append((trainer, store))
    t0 = time.perf_counter()
    per_sync = max(1, sync_tokens // batch_tokens)
    b = rounds = 0
    hot = np.zeros(0, np.uint64)
    if args.jitter > 0:
        rounds = simulate_async(args, workers, batches, per_sync, server)
    while b < len(batches) and not args.jitter:
        rounds += 1
        if args.grow_from:   # the interval grows as the square root of the tokens the cluster trained
            grown = sync_tokens * max(1.0, (b * batch_tokens / args.grow_from) ** 0.5)
            per_sync = max(1, int(min(grown, SYNC_TOKENS_MAX)) // batch_tokens)
        if args.hot_rows and rounds % 10 == 1:
            hot = hot_keys(server, sorted({w for trainer, _ in workers for w in trainer.export()[0]}), args.hot_rows)
        if args.tiers and rounds % args.tier_recount == 1 and shared is None:
            ranked = tiers(server, sorted({w for trainer, _ in workers for w in trainer.export()[0]}), args.tiers,
                           args.tier_levels)
            for _, store in workers:
                store.shard.rank(*ranked)
        if not args.hot_rows:
            for trainer, store in workers:
                records = [r for batch in batches[b:b + per_sync] for r in batch]
                b += per_sync
                early = int(round(args.lag * len(records)))   # trained before the last sync's answer arrives
                if early:
                    trainer.train_records(records[:early])
                store.apply_pending()
                if records[early:]:
                    trainer.train_records(records[early:])
        for j in range(per_sync if args.hot_rows else 0):   # the replicas' j-th batches, then the hot tier's sync
            for trainer, _ in workers:
                if b < len(batches):
                    trainer.train_records(batches[b])
                    b += 1
            if len(hot) and j < per_sync - 1:
                for _, store in workers:
                    store.sync_hot(hot, rounds + (j + 1) / (per_sync + 1))
        for _, store in workers:
            store.sync(float(rounds))
        print(f"\r{workers_n} replicas, round {rounds}: {min(b, len(batches)) * batch_tokens:,} tokens", end="",
              file=sys.stderr)
    print(file=sys.stderr)
    if rules:   # what the replicas still hold goes, as it would within the longest hold
        for _, store in workers:
            store.shard.flushing = True
        for _, store in workers:
            store.sync(float(rounds + 1))

    words = sorted({w for trainer, _ in workers for w in trainer.export()[0]})
    keys = np.array([word_key(w) for w in words], np.uint64)
    order = np.argsort(-server.word_counts.totals(keys), kind="stable")
    words, keys = [words[i] for i in order], keys[order]
    model = shared if shared is not None else server
    rows = model.rows_for(keys, create=False)
    held = rows >= 0
    from gensim.models import KeyedVectors
    kv = KeyedVectors(100)
    kv.add_vectors([w for w, h in zip(words, held) if h], model.vectors[rows[held]])
    quality = evaluate(kv)
    out_rows = model.rows_for(word_rows(keys[:10])[10:], create=False)
    kept = max(sum(trainer.totals.kept for trainer, _ in workers), 1)
    total = {name: sum(getattr(store, name) for _, store in workers)
             for name in ("rows_sent", "rows_out", "keys_listed", "server_seconds", "merge_seconds", "sync_seconds")}
    return {"replicas": workers_n, "sync_tokens": sync_tokens, "rounds": rounds, "seconds": time.perf_counter() - t0,
            "kept": kept, "tokens": len(tokens), "pairs": sum(trainer.totals.pairs for trainer, _ in workers),
            "rows_per_token": total["rows_sent"] / kept, "rows_out_per_token": total["rows_out"] / kept,
            "keys_per_token": total["keys_listed"] / kept, "server_us": 1e6 * total["server_seconds"] / kept,
            "merge_us": 1e6 * total["merge_seconds"] / kept,
            # the exchange's payload: a delta row's key, values, accumulator (and contraction); a pulled row's key;
            # an answered row's values and accumulator; a listed key (word counts and strings left out)
            "bytes_out": (total["rows_out"] * (12 + row_bytes(100, args.wire_out) + 4 * (args.merge == "contraction"))
                          + (total["rows_sent"] - total["rows_out"]) * 8) / kept,
            "bytes_in": (total["rows_sent"] * (row_bytes(100, args.wire_in) + 4) + total["keys_listed"] * 8) / kept,
            "sync_us": 1e6 * total["sync_seconds"] / kept, **quality,
            "norms_in": np.linalg.norm(model.vectors[rows[:10]], axis=1).round(1).tolist(),
            "norms_out": np.linalg.norm(model.vectors[out_rows], axis=1).round(1).tolist()}


def report(args, r: dict) -> None:
    print(f"replica_simulation: {r['replicas']} replicas, {r['tokens']:,} tokens, {r['sync_tokens']:,} tokens per "
          f"replica per sync, merge {args.merge}"
          + (f" (floor {args.floor}, accumulators {args.acc})" if args.merge == "align" else
             f" (scale {args.contraction_scale})" if args.merge == "contraction" else "")
          + f", {'own' if args.seeds else 'shared'} sampling streams, eta {args.eta or 'default'}, refresh share "
          f"{args.refresh_share}{'' if args.no_stale_refresh else ' + the rows the servers changed'}, "
          f"{'rows new to a replica from init' if args.no_prefetch else 'new words prefetched'}, "
          + (f"{args.wire_out} deltas out, {args.wire_in} rows in, " if (args.wire_out, args.wire_in) != ("f32", "f32")
             else "")
          + (f"tiers of {args.tiers} words over {args.tier_levels + 1} rates ({args.tiered}), " if args.tiers else "")
          + (f"deltas held below {args.send_threshold} of the row, " if args.send_threshold else "")
          + (f"deltas held below a contraction of {args.send_contraction}, " if args.send_contraction else "")
          + (f"at most {args.top_rows} deltas a sync, " if args.top_rows else "")
          + (f"held at most {args.max_hold} syncs, " if args.max_hold else "")
          + (f"every held row sent every {args.flush_every} syncs, " if args.flush_every else "")
          + (f"listed rows refreshed if trained in the last {args.refresh_recent} syncs, " if args.refresh_recent else "")
          + (f"rows listed once moved {args.list_threshold} of the row, " if args.list_threshold else "")
          + (f"interval grown as sqrt(tokens / {args.grow_from:,.0f}), " if args.grow_from else "")
          + f"{r['rounds']} rounds, {r['seconds']:.0f} s")
    print(f"trained: {r['kept']:,} tokens kept ({r['kept'] / r['tokens']:.1%} of those read), {r['pairs']:,} pairs; "
          f"per kept token: {r['rows_out_per_token']:.2f} rows out (deltas merged), {r['rows_per_token']:.2f} rows in "
          f"(answered), {r['keys_per_token']:.1f} changed keys listed, about {r['bytes_out']:,.0f} / "
          f"{r['bytes_in']:,.0f} B out / in; {r['server_us']:.1f} µs in the servers' calls ({r['merge_us']:.1f} in "
          f"add_deltas), "
          f"{r['sync_us']:.1f} µs in the replicas' collect and apply")
    print(f"analogy {r['analogy']:.2%}  WS353 {r['ws353']:.3f}  SimLex {r['simlex']:.3f}  "
          f"vocabulary {r['vocabulary']:,}")
    print("norms of the 10 most frequent words, input rows:", r["norms_in"], "output rows:", r["norms_out"],
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--max-tokens", type=int, default=3_000_000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--sync-tokens", type=int, default=25_000, help="tokens each worker trains between its syncs")
    ap.add_argument("--sweep", default="",
                    help="replica counts to run one after the other (e.g. 1,2,4,8,16,32,64), each replica syncing "
                         "after --round-tokens / replicas tokens: the cluster trains the same tokens per sync "
                         "interval whatever its size (its throughput is fixed, as on this machine)")
    ap.add_argument("--round-tokens", type=int, default=80_000,
                    help="with --sweep --interval round: tokens the whole cluster trains between two syncs of each "
                         "replica")
    ap.add_argument("--interval", choices=("round", "k2", "fixed"), default="round",
                    help="with --sweep, a replica's tokens per sync for k replicas: round, --round-tokens / k (at "
                         "least 100); k2, the workers' default (online.cluster.sync_interval: 160,000 / k^2, at "
                         "least 100); fixed, --sync-tokens whatever k (a sync on a clock, at a replica's speed)")
    ap.add_argument("--tiers", type=int, default=0,
                    help="rows tiered by the cluster's word counts (pWord2Vec's min_sync_words): the N most counted "
                         "words' rows sync at every sync, the next N at every 2nd, the next 2N at every 4th, ...; a "
                         "row not due keeps its delta and its refresh for a later sync (0: every row every sync)")
    ap.add_argument("--tier-levels", type=int, default=4,
                    help="with --tiers: the slowest tier syncs every 2^LEVELS syncs (rows of rarer words too)")
    ap.add_argument("--tiered", choices=("both", "deltas", "refresh"), default="both",
                    help="with --tiers: what the tiers hold back: the deltas and the refreshes, or only one of them")
    ap.add_argument("--tier-recount", type=int, default=10, help="with --tiers: rounds between two rankings")
    ap.add_argument("--send-threshold", type=float, default=0.0,
                    help="a changed row's delta is held until |row - base| >= X |row| (error feedback: it adds up "
                         "until sent; 0: every changed row is sent)")
    ap.add_argument("--send-contraction", type=float, default=0.0,
                    help="a changed row's delta is held until the contraction the kernel measured since its last "
                         "send (times the merge's scale) reaches X (pairs kernel only)")
    ap.add_argument("--max-hold", type=int, default=0,
                    help="with --send-threshold / --send-contraction: a delta held this many syncs is sent whatever "
                         "its size (0: no limit)")
    ap.add_argument("--flush-every", type=int, default=0,
                    help="with --send-threshold: every M-th sync sends every held delta (the workers' rule)")
    ap.add_argument("--refresh-recent", type=int, default=0,
                    help="only the listed rows trained here within the last M syncs are refreshed (0: every held one)")
    ap.add_argument("--list-threshold", type=float, default=0.0,
                    help="the servers list a row as changed to the other replicas (which refresh it) once the merges "
                         "moved it by X |row| since it was last listed (0: at every change)")
    ap.add_argument("--wire-out", choices=tuple(WIRE_BYTES), default="f32",
                    help="deltas on the wire: float32, float16, or int8 with a scale per row; what the rounding "
                         "drops stays in the replica's row and goes with its next delta (error feedback)")
    ap.add_argument("--wire-in", choices=tuple(WIRE_BYTES), default="f32",
                    help="the servers' merged rows on the wire (the replica's base is what it received)")
    ap.add_argument("--top-rows", type=int, default=0,
                    help="at most N deltas a sync, the largest (the rest held, as with --send-threshold)")
    ap.add_argument("--contraction-scale", type=float, default=CONTRACTION_SCALE,
                    help="contraction merge: the measured contraction's weight "
                         f"(online.learner.concurrent_merge.CONTRACTION_SCALE, {CONTRACTION_SCALE})")
    ap.add_argument("--merge", choices=("sum", "align", "contraction"), default="contraction",
                    help="how the shard combines concurrent deltas (online.learner.concurrent_merge; contraction: "
                         "by the rows' measured contraction, the servers' rule for pairs replicas; align: by the "
                         "deltas' alignment, their rule for hogbatch replicas, which send no contraction)")
    ap.add_argument("--floor", type=float, default=2.0, help="the merge's floor (align only)")
    ap.add_argument("--shared-replica", action="store_true",
                    help="diagnostic: every worker trains one shared replica (threads, no deltas); each keeps its "
                         "own vocabulary, noise table and sampling, and the servers still count the words")
    ap.add_argument("--no-stale-refresh", action="store_true",
                    help="diagnostic: held rows the servers changed wait for the refresh turn")
    ap.add_argument("--min-count", type=int, default=5)
    ap.add_argument("--no-journal", action="store_true",
                    help="diagnostic: workers learn trainability only from the totals of the words they report")
    ap.add_argument("--grow-from", type=float, default=0.0,
                    help="the interval times sqrt(N / this), N the tokens the cluster trained so far (0: fixed)")
    ap.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS, help=f"tokens per batch ({BATCH_TOKENS})")
    ap.add_argument("--seeds", action="store_true", help="each worker its own sampling stream (as the workers do)")
    ap.add_argument("--acc", choices=("merged", "sum"), default="merged",
                    help="align and contraction: the AdaGrad accumulator increments get the merge's weight "
                         "(merged), or are summed in full (sum)")
    ap.add_argument("--refresh-share", type=float, default=REFRESH_SHARE.default,
                    help="rows not changed by a worker that its sync refreshes, as a share of the changed ones "
                         f"(LIVEVEC_REFRESH_SHARE, {REFRESH_SHARE.default}; 1000: every held row)")
    ap.add_argument("--hot-rows", type=int, default=0,
                    help="experiment: the rows of the N most counted words also sync after every batch (a hot tier, "
                         "as pWord2Vec's); with --batch-tokens below the tokens per sync")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="diagnostic: rows of words new to a replica start from the initial value with an empty "
                         "accumulator instead of the servers' values, fetched when the cluster makes the "
                         "word trainable (ReplicaStore._hold_new_words)")
    ap.add_argument("--lag", type=float, default=0.0,
                    help="the share of the next interval a replica trains before its sync's answer arrives (a round "
                         "trip that long: training goes on while a sync is in flight, as in the workers; lockstep "
                         "mode without --hot-rows)")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="replicas sync on their own clocks: each interval lasts lognormal(0, JITTER) (0: lockstep "
                         "rounds)")
    ap.add_argument("--window-syncs", type=float, default=float(MERGE_WINDOW_SYNCS),
                    help=f"with --jitter: the servers' merge window in median intervals ({MERGE_WINDOW_SYNCS}, as "
                         "online.cluster.server sets it)")
    ap.add_argument("--kernel", default=LearnerConfig.kernel,
                    help="the in-place kernel (LIVEVEC_KERNEL; auto: as a worker of a cluster of --workers picks it)")
    ap.add_argument("--eta", type=float, default=None,
                    help="the workers' AdaGrad step (default: the kernel's, 0.1 for pairs and 0.2 for hogbatch)")
    args = ap.parse_args()

    print(f"load average at start: {os.getloadavg()}", flush=True)
    tokens = " ".join(read_prefix(Path(args.corpus), args.max_tokens)).split()
    if not args.sweep:
        report(args, simulate(args, args.workers, args.sync_tokens, tokens))
        return 0
    results = []
    for k in [int(x) for x in args.sweep.split(",") if x.strip()]:
        r = simulate(args, k, interval_for(args, k), tokens)
        report(args, r)
        results.append(r)
    one = results[0]
    print(f"\n| replicas | tokens per replica per sync | analogy | vs {one['replicas']} | WS353 | vs {one['replicas']} "
          f"| SimLex | rows out per token | rows in per token | servers' µs per token |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['replicas']} | {r['sync_tokens']:,} | {r['analogy']:.2%} "
              f"| {100 * (r['analogy'] - one['analogy']):+.2f} | {r['ws353']:.3f} | {r['ws353'] - one['ws353']:+.3f} "
              f"| {r['simlex']:.3f} "
              f"| {r['rows_out_per_token']:.2f} | {r['rows_per_token']:.2f} | {r['server_us']:.1f} |")
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
