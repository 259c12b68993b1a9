"""A worker's local replica of the rows it trains, synchronised with the servers by deltas.

A worker trains its replica in place with the same kernel and optimizer as ``livevec train``
(hogwild across its threads), so every pair updates the rows before the next pair reads them,
and at intervals sends the servers only what changed. The optimizer runs here; the servers only add.

The sync, per interval (``LIVEVEC_SYNC_MS`` or the interval in tokens, ``online.cluster.sync_interval``,
whichever comes first). The replica keeps, per row, ``base``: the value the servers last confirmed.

1. **Collect** the rows changed since the last sync (their version stamps), and the held rows the servers
   changed since this worker last asked (``HEAD_CHANGED_ROWS``, read right before the collect):
   ``delta = row - base`` and the AdaGrad accumulator's ``acc - base_acc``; then ``base = row``.
   Rows written by a kernel that is still running are stamped when it ends, so whatever it
   writes after the copy is collected by the next sync: nothing is lost.
2. **One pushpull per server** (``CMD_DELTA``; ``CMD_DELTA_FRESH`` for rows created here): the server merges
   the deltas of concurrent workers (``online.learner.concurrent_merge``; by contraction for the ``pairs``
   kernel, by alignment for ``hogbatch``: ``MERGE_BY_CONTRACTION``) and answers with the merged row ``S``.
3. **Apply**: ``row += S - base`` (the other workers' contributions; what this replica
   trained since step 1 stays on top), ``base = S``. Same for the accumulator, so the
   optimizer's state is the cluster's, as it would be in one process.

The vocabulary travels with the sync too (no round trip on the training path): the count increments of every
word read (``CMD_WORD_COUNTS``: the servers answer with the cluster's totals), the strings of words that became
trainable (``HEAD_SET_WORDS``), and each server's journal of the words that became trainable since this worker
last asked (``HEAD_TRAINABLE_SINCE``, ``TrainableJournal``). The replica holds the rows of every word the cluster
makes trainable, fetched with their accumulators in the same sync (``_hold_new_words``), so it never meets a word
with an empty accumulator. A row first created here starts from the initial value every node agrees on
(``embedding_shard.init_rows``), so it needs no round trip. A word the worker's own table evicts loses its replica
rows after their last delta is sent, never its rows on the servers.

Bounds: staleness is one sync interval. The replica holds at most ``LIVEVEC_VOCAB_CAPACITY`` words, about
16 * dim + 60 bytes each (1.7 KB at dim 100). Rows held but not trained here are refreshed in turn, a tenth
of the changed rows' number per sync (``LIVEVEC_REFRESH_SHARE``).

Design: docs/design/0001-replica-exchange.md
"""
from __future__ import annotations

import threading
import time

import numpy as np
import orjson

from online.cluster import delta_wire
from online.cluster import ps_commands as pc
from online.cluster.host_replica import SharedReplicaShard
from online.cluster.replica_shard import FLUSH_EVERY_DEFAULT, SEND_SHARE_DEFAULT, ReplicaShard
from online.learner.embedding_shard import EmbeddingShard
from online.learner.keys import word_rows
from ps_bridge.kv_app import KVWorker
from ps_bridge.metrics import Registry
from ps_bridge.settings import Setting, SettingGroup

# Read by workers (how often they sync) and servers (the window in which deltas count as concurrent).
SYNC_MS = Setting("sync_ms", "LIVEVEC_SYNC_MS", int, 250, minimum=1, maximum=60_000,
                  help="replica: longest time between syncs with the servers, in ms (the staleness bound)")
SYNC = SettingGroup("delta sync (workers and servers)", (SYNC_MS,))
# Read by workers only: how fast rows held but not trained here catch up with the other workers' work.
REFRESH_SHARE = Setting("refresh_share", "LIVEVEC_REFRESH_SHARE", float, 0.1, minimum=0.0, maximum=1000.0,
                        help="replica: rows not changed here that each sync refreshes, as a share of the changed "
                             "ones (each costs a zero delta out and the row back; 1000: every held row)")
HOST_REPLICA = Setting("host_replica", "LIVEVEC_HOST_REPLICA", str, "",
                       help="replica: a directory in a tmpfs (e.g. /dev/shm) where the worker processes of one host "
                            "share one replica, in a file named by the cluster and DMLC_NODE_HOST "
                            "(online.cluster.host_replica); empty: a replica per process")
HOST_REPLICA_ROWS = Setting("host_replica_rows", "LIVEVEC_HOST_REPLICA_ROWS", int, 0, minimum=0,
                            help="replica: rows the shared replica reserves, two per word "
                                 "(0: twice LIVEVEC_VOCAB_CAPACITY)")
SEND_THRESHOLD = Setting("send_threshold", "LIVEVEC_SEND_THRESHOLD", float, SEND_SHARE_DEFAULT, minimum=0.0,
                         maximum=10.0,
                         help="replica: a changed row's delta waits (and grows) until it reaches this share of the "
                              "row's norm (0: every changed row goes at every sync)")
FLUSH_SYNCS = Setting("flush_syncs", "LIVEVEC_FLUSH_SYNCS", int, FLUSH_EVERY_DEFAULT, minimum=1, maximum=1000,
                      help="replica: every this many syncs every waiting delta goes, whatever its size")
DELTA_WIRE = Setting("delta_wire", "LIVEVEC_DELTA_WIRE", str, "auto", choices=("auto", "float16", "float32"),
                     help="replica: auto, int8 deltas out and rows back in int8 where every server speaks exchange 3 "
                          "(float16 where one speaks 2); float16, rows back in float16 at most; float32, full rows")
REPLICA = SettingGroup("replica (workers)", (REFRESH_SHARE, HOST_REPLICA, HOST_REPLICA_ROWS, SEND_THRESHOLD,
                                             FLUSH_SYNCS, DELTA_WIRE))

_SYNC_CHUNK = 1 << 16   # keys per pushpull message: bounds a message at ~26 MB at dim 100


def summed_counts(counts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The buffered ``(slots, keys, increments)`` of several batches as (distinct sorted keys, each one's summed
    increment, the latest slot reported for it)."""
    slots = np.concatenate([c[0] for c in counts])
    keys = np.concatenate([c[1] for c in counts])
    deltas = np.concatenate([c[2] for c in counts])
    uniq, inverse = np.unique(keys, return_inverse=True)
    summed = np.bincount(inverse, weights=deltas, minlength=len(uniq))
    last = np.full(len(uniq), -1, dtype=np.int64)
    last[inverse] = slots          # the latest slot reported for each key
    return uniq, summed, last


class TrainableJournal:
    """A worker's copy of each server's trainable journal (``online.learner.word_counts``): the keys of the
    words the cluster trains, per server, and where to ask from next. Bounded by the servers' word tables."""

    def __init__(self, servers: int):
        self._keys = [np.zeros(0, dtype=np.uint64) for _ in range(servers)]
        self._at = [(0, 0)] * servers     # (generation, position) per server
        self.changed = False              # the known keys changed since the flag was last cleared

    def ask(self, rank: int, group: int = 0) -> bytes:
        """``group``: the replica's merge group, when several processes share it (``host_replica``)."""
        generation, since = self._at[rank]
        ask = {"generation": generation, "since": since}
        if group:
            ask["group"] = group
        return orjson.dumps(ask)

    def answer(self, rank: int, reply: tuple[int, int, np.ndarray]) -> np.ndarray:
        """Take one server's reply; returns the keys new to this worker."""
        generation, position, keys = reply
        keys = np.unique(keys)
        known = self._keys[rank]
        if len(known):   # a binary search per key answered (a set difference sorted everything known again)
            at = np.minimum(np.searchsorted(known, keys), len(known) - 1)
            new = keys[known[at] != keys]
        else:
            new = keys
        if generation != self._at[rank][0]:   # a new log (restart, rollback, churn): it lists everything
            self.changed |= len(keys) != len(self._keys[rank]) or len(new) > 0
            self._keys[rank] = keys
        elif len(new):                        # both sorted: an insert, not a sort of everything known
            self._keys[rank] = np.insert(known, np.searchsorted(known, new), new)
        self.changed |= len(new) > 0
        self._at[rank] = (generation, position)
        return new

    def known(self) -> np.ndarray:
        """Every key listed, sorted: the servers' key ranges are disjoint, so their sorted lists are laid end to end
        in the order of their first keys (ranks need not follow the ranges)."""
        parts = sorted((k for k in self._keys if len(k)), key=lambda k: int(k[0]))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


# Whether the servers combine the deltas a kernel made by their contraction (which the kernel then measures) or by
# their alignment (``online.learner.concurrent_merge``): contraction for ``pairs``; ``hogbatch``'s deltas combine
# better by alignment. Design: docs/design/0001-replica-exchange.md
MERGE_BY_CONTRACTION = {"pairs": True, "hogbatch": False}


class ReplicaStore:
    """The trainer's ``ParamStore`` on a worker: a ``ReplicaShard`` trained in place, and ``sync``.

    ``online.learner.param_store`` gives the contract. ``local_shard`` returns the replica, so
    the trainer takes its in-place path; counts and words are buffered for the next sync.
    ``on_totals(slots, keys, totals)`` is told the cluster's count of the words this worker read, and
    ``on_trainable(known, new)`` the words the cluster trains (each server's journal, read at every sync).
    """

    counts_every_word = True   # the trainer reports every word's count increments, not only trainable ones
    OWN_SYNC_EVERY = 4         # paced syncs of a shared replica: this process's own at least every 4 gaps

    def __init__(self, worker: KVWorker, dim: int, *, optimizer: str = "rowadagrad", eta: float | None = None,
                 seed: int = 1, timeout: float = 30.0, registry: Registry | None = None,
                 refresh_share: float = REFRESH_SHARE.default, host_replica: str = "", host_rows: int = 0,
                 prefetch_rows: int = 1_000_000, kernel: str = "pairs",
                 send_threshold: float = SEND_THRESHOLD.default, flush_syncs: int = FLUSH_SYNCS.default,
                 delta_wire: str = DELTA_WIRE.default):
        registry = registry or Registry()
        self.worker = worker
        self.dim = int(dim)
        self.timeout = timeout
        if host_replica:
            self.shard = SharedReplicaShard(dim, host_replica, host_rows, refresh_share, optimizer=optimizer,
                                            eta=eta, seed=seed)
        else:
            self.shard = ReplicaShard(dim, refresh_share, optimizer=optimizer, eta=eta, seed=seed)
        self.shard.tracks_contraction = MERGE_BY_CONTRACTION[kernel]
        self.shard.send_share = float(send_threshold)
        self.shard.flush_every = int(flush_syncs)
        self.delta_wire = delta_wire
        self.exchange: int | None = None   # the version every server speaks (asked at the first sync)
        self.on_totals = None
        self.on_trainable = None   # (every key the cluster trains, sorted; the ones new here)
        self.prefetch_rows = int(prefetch_rows)   # rows held at most when the cluster's new words are taken in
        self.journal = TrainableJournal(len(worker.po.server_ids()))
        self._buffer_lock = threading.Lock()
        self._counts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # (slots, keys, deltas)
        self._words: dict[int, str] = {}
        self._sync_lock = threading.Lock()
        self._unsent: list | None = None   # the parts of a collected payload not yet acknowledged
        self._unsent_finished = self.shard.collected_finished   # the batches that payload carries
        self._own_last_sync = 0.0
        self._seen = [(0, 0)] * len(worker.po.server_ids())   # per server: (epoch, version) of its changed rows read
        self.m_syncs = registry.counter("livevec_worker_syncs_total", "delta syncs with the servers")
        self.m_rows = registry.counter("livevec_worker_rows_synced_total", "rows whose delta was sent")
        self.m_stale = registry.counter("livevec_worker_rows_stale_total", "keys the servers changed since this "
                                        "worker last asked (held ones are refreshed by the next sync)")
        self.m_prefetched = registry.counter("livevec_worker_rows_prefetched_total", "rows of words the cluster "
                                             "trains fetched before this worker met them (new words' rows)")
        self.m_seconds = registry.histogram("livevec_worker_sync_seconds", "collect + pushpull + apply of a sync")
        registry.gauge("livevec_worker_replica_rows", "rows held by the replica", fn=lambda: float(len(self.shard)))
        registry.gauge("livevec_worker_rows_waiting", "changed rows whose delta waits to grow "
                       "(LIVEVEC_SEND_THRESHOLD), as of the last collect", fn=lambda: float(self.shard.waiting))
        registry.gauge("livevec_worker_exchange_version", "the replica exchange's version this worker speaks "
                       "(0: not asked yet)", fn=lambda: float(self.exchange or 0))
        registry.gauge("livevec_worker_replica_rows_refused", "rows a full shared replica had no room for "
                       "(LIVEVEC_HOST_REPLICA_ROWS; their words are not trained here)",
                       fn=lambda: float(self.shard.rows_refused))
        self._server_ids = worker.po.server_ids()
        self._starts = np.array([r[0] for r in worker.po.server_key_ranges()], dtype=np.uint64)

    # ---------------------------------------------------------- ParamStore
    def local_shard(self) -> EmbeddingShard:
        return self.shard

    def pull(self, keys: np.ndarray) -> np.ndarray:
        return self.shard.pull(keys)

    def push(self, keys: np.ndarray, grads: np.ndarray) -> None:
        self.shard.push(keys, grads)

    def free(self, keys: np.ndarray) -> None:
        self.shard.free(keys)

    def add_counts(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        self.count_words(np.full(len(keys), -1, np.int64), keys, deltas)

    def count_words(self, slots: np.ndarray, keys: np.ndarray, deltas: np.ndarray) -> None:
        with self._buffer_lock:
            self._counts.append((np.asarray(slots, np.int64).copy(), np.asarray(keys, np.uint64).copy(),
                                 np.asarray(deltas, np.int64).copy()))

    def set_words(self, keys: np.ndarray, words: list[str]) -> None:
        with self._buffer_lock:
            self._words.update(zip(np.asarray(keys, dtype=np.uint64).tolist(), words))

    # ---------------------------------------------------------------- sync
    def has_pending(self) -> bool:
        """Counts or words wait to be sent (e.g. the words named again after a rollback)."""
        return bool(self._counts or self._words or self._unsent is not None or self.shard.waiting)

    def sync(self, min_gap: float = 0.0, flush: bool = False, remainders: bool = False) -> int | None:
        """One sync (see the module docstring); returns the rows sent (None: skipped, because a checkpoint
        holds another process's syncs on a replica the host shares, or because another process of the host
        began one less than ``min_gap`` seconds ago: the host then syncs about as often as one worker would,
        not once per process and interval, and each process commits what those syncs carried; a skipped sync
        still exchanges what only this process has: its new words, its counts, the journal's news). Afterwards
        ``shard.covered_batches()`` counts this process's batches the servers have. The words, the counts and every
        chunk of deltas are all on the wire before the first answer is awaited, so a sync costs one
        round trip per server. Raises ``RequestTimeout`` / ``SendError`` when a server does not answer:
        what was not acknowledged is kept and sent again by the next call (the caller asks for a
        rollback, which makes a partly applied sync exact). ``flush``: every waiting delta goes, in float32 (a
        checkpoint's snapshot must hold what the batches it counts trained, up to the int8 remainders, each under
        half a step of its row's last delta, which ride with the row's next delta); ``remainders``: those too (a
        drain's last sync: the servers then hold exactly what the replica does)."""
        with self._sync_lock, self.shard.host_sync():
            if self.shard.held_elsewhere():   # a checkpoint is snapshotting the servers
                return None
            now = time.monotonic()
            kv = self.worker
            group = self.shard.claim_group(kv.po.node_id)
            if min_gap and self._unsent is None and self.shard.since_last_sync() < min_gap \
                    and now - self._own_last_sync < self.OWN_SYNC_EVERY * min_gap:
                # The other process's sync carries the rows; what only this process has goes now: the strings
                # of words that became trainable here (the front end cannot show a word whose string the servers
                # lack), its counts and the journal's news (otherwise a word's trainability would wait for one
                # of this process's own syncs, up to 4 intervals, its occurrences meanwhile untrained).
                # Design: docs/design/0004-host-replica.md
                self._await_vocabulary(self._send_vocabulary(group))
                return None
            self._own_last_sync = now
            self.shard.sync_began()
            t0 = time.perf_counter()
            vocabulary = self._send_vocabulary(group)
            if self.exchange is None:
                self.exchange = self._ask_exchange()
            if self._unsent is None:
                self._read_changed_rows()
                flushing, self.shard.flush = self.shard.flush, self.shard.flush or flush
                self.shard.flush_remainders = remainders
                try:
                    collected = self.shard.collect_parts()
                finally:
                    self.shard.flush, self.shard.flush_remainders = flushing, False
                # a flush goes in float32: the snapshot it precedes then holds exactly what was trained
                keys, rows, deltas, pushed, fresh = collected
                command = None if self.shard.flush or flush else self._packed()
                self._unsent = self._parts(*collected, packed=(command, self.shard.pack(deltas[:pushed], rows[:pushed]))
                                           if command else None)
                self._unsent_finished = self.shard.collected_finished
            parts = self._unsent
            sent = [(kv.pull(k, cmd=cmd) if d is None else kv.pushpull(k, d.reshape(-1), cmd=cmd), k, r)
                    for cmd, k, d, r in parts]
            self._await_vocabulary(vocabulary)
            rows_sent = 0
            for i, (ts, k, r) in enumerate(sent):
                res = kv.wait(ts, self.timeout)
                rows_back = pc.ROWS_BACK.get(parts[i][0])
                if rows_back is not None:
                    merged = delta_wire.unpack_answer_sparse(res.vals, res.lens, len(k), self.dim, self.shard.base[r],
                                                             rows_back)
                else:
                    merged = np.asarray(res.vals, np.float32).reshape(len(k), self.dim + 1)
                # Fresh rows too: what was trained on them while this sync was in flight stays on top of the
                # servers' answer (adopting the answer would lose a burst trained whole during a slow first sync).
                self.shard.apply(k, merged, rows=r)
                self._unsent = parts[i + 1:]
                rows_sent += len(k)
            self._unsent = None
            self._fetch_new_rows()
            self.shard.cover(self._unsent_finished)
            self.shard.release_freed()
            self.m_syncs.inc()
            self.m_rows.inc(rows_sent)
            self.m_seconds.observe(time.perf_counter() - t0)
            return rows_sent

    def _read_changed_rows(self) -> None:
        """Ask every server which rows changed since this worker last asked, and mark them stale, so that the
        collect that follows refreshes the held ones (``ReplicaShard.mark_stale``). Asked right before the
        collect, not with the vocabulary: read one sync later, a row trained here meanwhile started from a
        value a whole interval older (one round trip per server more per sync)."""
        kv = self.worker
        pending = [kv.request(pc.HEAD_CHANGED_ROWS, orjson.dumps({"epoch": epoch, "since": since}), sid)
                   for (epoch, since), sid in zip(self._seen, self._server_ids)]
        for rank, ts in enumerate(pending):
            epoch, version, keys = pc.decode_changed_rows(kv.wait(ts, self.timeout)[0].body)
            if self._seen[rank][0] and epoch != self._seen[rank][0]:
                # a restarted server may be another release: float32 until the next sync asks it again
                self.exchange = None
            self._seen[rank] = (epoch, version)
            if len(keys):
                self.shard.mark_stale(keys)
                self.m_stale.inc(len(keys))

    def _packed(self) -> int | None:
        """The packed command this worker's deltas and refreshes go by (None: float32 ``CMD_DELTA``): the newest
        every server speaks, or the one ``LIVEVEC_DELTA_WIRE`` pins."""
        version = self.exchange or 1
        if self.delta_wire == "float32" or version < 2:
            return None
        if self.delta_wire == "float16" or version < 3:
            return pc.CMD_DELTA_PACKED
        return pc.CMD_DELTA_PACKED_I8

    def _ask_exchange(self) -> int:
        """The replica exchange's version every server speaks (``HEAD_EXCHANGE``; a server that predates it
        answers an error: version 1)."""
        kv = self.worker
        pending = [kv.request(pc.HEAD_EXCHANGE, b"", sid) for sid in self._server_ids]
        versions = []
        for ts in pending:
            try:
                answer = orjson.loads(kv.wait(ts, self.timeout)[0].body or b"{}")
            except orjson.JSONDecodeError:
                answer = {}
            versions.append(int(answer.get("exchange", 1)) if isinstance(answer, dict) else 1)
        return max(1, min(min(versions, default=1), pc.EXCHANGE_VERSION))

    @staticmethod
    def _parts(keys, rows, deltas, pushed, fresh, packed: tuple[int, np.ndarray] | None = None) \
            -> list[tuple[int, np.ndarray, np.ndarray | None, np.ndarray]]:
        """``collect_parts``' payload as requests of at most ``_SYNC_CHUNK`` keys, each (command, keys, deltas or
        None, rows), all slices of it: the rows changed here as ``CMD_DELTA`` pushpulls, the rows created here as
        ``CMD_DELTA_FRESH`` pushpulls, and the rows only refreshed as ``CMD_DELTA`` pulls (data None), which carry
        no zeros out. ``packed`` (a packed command, and ``ReplicaShard.pack`` of the first block): the changed rows'
        deltas go by that command (int8 with error feedback: ``online.cluster.delta_wire``), as do the refreshes, and
        the answers carry the rows in float16 or int8 (``ps_commands.ROWS_BACK``); fresh rows stay float32."""
        command, changed = packed if packed is not None else (pc.CMD_DELTA, deltas)
        blocks = ((command, changed, 0, pushed), (pc.CMD_DELTA_FRESH, deltas, pushed, pushed + fresh),
                  (command, None, pushed + fresh, len(keys)))
        return [(cmd, keys[a:min(a + _SYNC_CHUNK, hi)], None if data is None else data[a:min(a + _SYNC_CHUNK, hi)],
                 rows[a:min(a + _SYNC_CHUNK, hi)]) for cmd, data, lo, hi in blocks for a in range(lo, hi, _SYNC_CHUNK)]

    def _requeue(self, counts, words) -> None:
        """Sent again next time (words are idempotent; counts applied twice are undone by the rollback
        that a failed sync leads to)."""
        with self._buffer_lock:
            self._counts[:0] = counts
            self._words = {**words, **self._words}

    def _send_counts(self, counts):
        """The summed increments of each word, as one pushpull; returns (ts, slot of each key, keys) or None."""
        if not counts:
            return None
        uniq, summed, last = summed_counts(counts)
        return self.worker.pushpull(uniq, summed.astype(np.float32), cmd=pc.CMD_WORD_COUNTS), last, uniq

    def _send_vocabulary(self, group: int):
        """Put the buffered words and counts and the journal's questions on the wire (not awaited, so a sync's
        deltas go out meanwhile); what ``_await_vocabulary`` takes."""
        kv = self.worker
        with self._buffer_lock:
            # Read before the swap: a batch is counted finished only after its counts were buffered.
            finished = self.shard.finished_batches()
            counts, self._counts = self._counts, []
            words, self._words = self._words, {}
        try:
            pending_words = self._send_words(words)
            pending_counts = self._send_counts(counts)
            pending_trainable = [kv.request(pc.HEAD_TRAINABLE_SINCE, self.journal.ask(rank, group), sid)
                                 for rank, sid in enumerate(self._server_ids)]
        except BaseException:
            self._requeue(counts, words)
            raise
        return counts, words, finished, pending_words, pending_counts, pending_trainable

    def _await_vocabulary(self, sent) -> None:
        """The servers' answers: the cluster's totals of the words counted, and the words the cluster made
        trainable since this worker last asked (``on_totals`` / ``on_trainable``)."""
        kv = self.worker
        counts, words, finished, pending_words, pending_counts, pending_trainable = sent
        try:
            for ts in pending_words:
                kv.wait(ts, self.timeout)
            if pending_counts is not None:
                ts, slots, uniq = pending_counts
                totals = np.rint(np.asarray(kv.wait(ts, self.timeout).vals, np.float64)).astype(np.int64)
                if self.on_totals is not None:
                    self.on_totals(slots, uniq, totals)
            self.shard.counts_sent(finished)
            news = [self.journal.answer(rank, pc.decode_trainable(kv.wait(ts, self.timeout)[0].body))
                    for rank, ts in enumerate(pending_trainable)]
            if self.on_trainable is not None and self.journal.changed:
                self.journal.changed = False
                new = np.concatenate(news)
                self.on_trainable(self.journal.known(), new)
                self._hold_new_words(new)
        except BaseException:
            self._requeue(counts, words)
            raise

    def _hold_new_words(self, keys: np.ndarray) -> None:
        """Rows for the words the cluster made trainable, held from now on (up to ``prefetch_rows`` rows in
        all), so that this replica meets a word with the cluster's row and AdaGrad accumulator. Created only
        when first met, a row would start from the initial value with an empty accumulator: its first step would
        be a full-size one, taken again by every replica that meets the word late, and summed
        (docs/design/0001-replica-exchange.md). ``_fetch_new_rows`` fills them."""
        room = (self.prefetch_rows - len(self.shard)) // 2
        if len(keys) and room > 0:
            self.shard.rows_for(word_rows(np.ascontiguousarray(keys[:room], dtype=np.uint64)), create=True)

    def _fetch_new_rows(self) -> None:
        """The servers' values of the rows created here since the last sync that no kernel has trained yet
        (one pull per chunk). A row trained meanwhile keeps that work on top (``apply``); a fetch that fails
        leaves the rows to the next sync's collect, which sends them as fresh."""
        created = self.shard.take_created()
        if not len(created):
            return
        kv = self.worker
        cmd = self._packed() or pc.CMD_DELTA   # packed: the rows come in float16 or int8
        pending = [(kv.pull(k, cmd=cmd), k)
                   for k in (created[a:a + _SYNC_CHUNK] for a in range(0, len(created), _SYNC_CHUNK))]
        for ts, k in pending:
            res = kv.wait(ts, self.timeout)
            if cmd in pc.ROWS_BACK:
                rows = delta_wire.unpack_answer(res.vals, len(k), self.dim, pc.ROWS_BACK[cmd])
            else:
                rows = np.asarray(res.vals, np.float32).reshape(len(k), self.dim + 1)
            self.shard.apply(k, rows)
            self.m_prefetched.inc(len(k))

    def _send_words(self, words: dict[int, str]) -> list[int]:
        if not words:
            return []
        keys = np.fromiter(words.keys(), dtype=np.uint64, count=len(words))
        names = list(words.values())
        owner = np.searchsorted(self._starts, keys, side="right") - 1
        pending = []
        for rank in np.unique(owner).tolist():
            pos = np.flatnonzero(owner == rank)
            body = pc.encode_words(keys[pos], [names[i] for i in pos.tolist()])
            pending.append(self.worker.request(pc.HEAD_SET_WORDS, body, self._server_ids[rank]))
        return pending

    def reload(self) -> int:
        """After a rollback reloaded the servers: drop every unsynced delta and count, and set every
        row to the servers' value (one zero-delta pushpull per chunk); returns the rows fetched.
        The worker is paused meanwhile, so no kernel writes the replica (with a replica shared by the
        host's processes, every one of them is paused by the rollback and reloads it; that is idempotent)."""
        with self._sync_lock, self.shard.host_sync():
            with self._buffer_lock:
                self._counts = []
            self._unsent = None
            self.exchange = None   # the reloaded servers may be another release: asked again at the next sync
            keys = np.sort(self.shard.keys())
            for a in range(0, len(keys), _SYNC_CHUNK):
                k = keys[a:a + _SYNC_CHUNK]
                zeros = np.zeros(len(k) * (self.dim + 1), dtype=np.float32)
                res = self.worker.wait(self.worker.pushpull(k, zeros, cmd=pc.CMD_DELTA), self.timeout)
                self.shard.overwrite(k, np.asarray(res.vals, np.float32).reshape(len(k), self.dim + 1))
            self.shard.synced_version = self.shard.version
            return int(len(keys))
