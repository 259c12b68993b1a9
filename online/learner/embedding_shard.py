"""EmbeddingShard: the part of the model one parameter server holds (also used in-process).

Keys and values follow the model's key layout (``online.learner.keys``): a word's input
vector (syn0) and its output vector (syn1neg) at two keys, each ``dim`` float32.

* **Rows are created on first touch** (pull, push or ``rows_for(create=True)``) with a
  deterministic value that depends only on the key and the seed: input rows uniform in
  [-0.5/dim, 0.5/dim) from a SplitMix64 stream seeded by the key (word2vec.c's range),
  output rows zero (word2vec.c and gensim do the same). Every server, worker and
  restart therefore agrees on a row it has never seen, and nothing has to be
  broadcast when a new word appears.
* **push carries gradients** dL/d(row) of the SGNS loss (summed over the batch's pairs
  by the worker, see ``sgns_kernel.batch_gradients``); the shard applies its optimizer.
  The default is row-wise AdaGrad (``accum`` [rows, 1] holds each row's summed mean
  squared gradient; ``optimizer="adagrad"`` keeps one per coordinate, [rows, dim]),
  which needs no corpus length (docs/design/0002-kernels.md has the figures that chose it).
  Duplicate keys in one push are applied one after the other.
* **Per-word counts and word strings** are kept for the front end (``add_counts``,
  ``set_words``); they describe input keys.
* **Deltas** (``add_deltas``): workers that train a local replica (``online.cluster.replica``)
  send the change of each row since their last sync, and the row's AdaGrad accumulator
  increment; the shard adds them, so deltas from any number of workers merge, and answers
  with the merged values.
* **The cluster's word counts** (``count_words``, ``online.learner.word_counts``): totals of
  every word of this key range, in bounded memory; a word whose total reaches
  ``min_count`` gets its rows and its count here, one whose trainable total is evicted loses them.
* **Eviction**: ``free(keys)`` deletes rows (their storage is reused).
* **Versions**: every mutating call (push, assign, free, or ``mark_changed`` from the
  in-process trainer) bumps ``version`` and stamps the rows it changed, so
  ``changes_since(v)`` returns the keys changed and the keys removed after version v
  (the front end's incremental sync) without scanning a log of updates.
* **Arrays in, arrays out**: every method takes uint64 key arrays and float32 value
  arrays and runs without a per-key Python loop, so a ps-lite KVServer handle can call
  it straight from the message buffers.

Thread-safety: one internal lock serialises pull/push/free/assign/rows_for. The
in-process trainer runs its kernels on ``vectors``/``accum`` directly (hogwild) inside
``training()``, which only blocks against storage growth (growth reallocates the arrays).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from numba import njit

from online.learner.concurrent_merge import ConcurrentMerge
from online.learner.key_index import KeyIndex
from online.learner.keys import OUTPUT_BIT, word_rows
from online.learner.shard_passes import add_rows, answer_rows
from online.learner.word_counts import WordCounts

OPTIMIZERS = ("adagrad", "rowadagrad", "sgd")
DEFAULT_ETA = {"adagrad": 0.1, "rowadagrad": 0.1, "sgd": 0.025}


@njit(inline="always")
def _splitmix64(state):
    state = state + np.uint64(0x9E3779B97F4A7C15)
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@njit(nogil=True, cache=True)
def init_rows(vectors, rows, keys, seed):
    """Deterministic initial value of each key's row (see the module docstring)."""
    dim = vectors.shape[1]
    scale = 1.0 / dim
    for i in range(rows.shape[0]):
        r = rows[i]
        k = keys[i]
        if k & OUTPUT_BIT:
            for d in range(dim):
                vectors[r, d] = 0.0
        else:
            state = k ^ np.uint64(seed)
            for d in range(dim):
                state, z = _splitmix64(state)
                u = np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)  # [0, 1), 53 bits
                vectors[r, d] = np.float32((u - 0.5) * scale)


@njit(nogil=True, fastmath=True, cache=True)
def _apply_adagrad(vectors, accum, rows, grads, eta):
    dim = vectors.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for d in range(dim):
            g = grads[i, d]
            h = accum[r, d] + g * g
            accum[r, d] = h
            if h > 0:
                vectors[r, d] -= eta * g / np.sqrt(h)


@njit(nogil=True, fastmath=True, cache=True)
def _apply_row_adagrad(vectors, accum, rows, grads, eta):
    dim = vectors.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        gg = np.float32(0.0)
        for d in range(dim):
            gg += grads[i, d] * grads[i, d]
        h = accum[r, 0] + gg / dim
        accum[r, 0] = h
        if h > 0:
            step = eta / np.sqrt(h)
            for d in range(dim):
                vectors[r, d] -= step * grads[i, d]


@njit(nogil=True, fastmath=True, cache=True)
def _apply_sgd(vectors, rows, grads, eta):
    for i in range(rows.shape[0]):
        r = rows[i]
        for d in range(vectors.shape[1]):
            vectors[r, d] -= eta * grads[i, d]


def _writable(a: np.ndarray) -> np.ndarray:
    """``a`` as a writable C-contiguous array, copied only when it is not one already."""
    return a if a.flags.c_contiguous and a.flags.writeable else np.array(a, order="C")


@dataclass
class ShardChanges:
    version: int             # the shard's version when this answer was made; ask again with it
    changed: np.ndarray      # uint64 keys whose rows changed (or were created) after the asked version
    removed: np.ndarray      # uint64 keys freed after it and not re-created since
    full_resync: bool        # the asked version is older than the removal log: reload everything


class _GrowthLock:
    """Many concurrent trainers (shared) or one storage reallocation (exclusive)."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False

    @contextmanager
    def shared(self):
        with self._cond:
            while self._writer:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self):
        with self._cond:
            while self._writer or self._readers:
                self._cond.wait()
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class EmbeddingShard:
    """Rows of uint64 keys -> ``dim`` float32, with optimizer state, counts, words and versions."""

    REMOVAL_LOG_LIMIT = 1 << 20   # removed keys remembered for changes_since before a full resync

    def __init__(self, dim: int = 100, *, optimizer: str = "rowadagrad", eta: float | None = None,
                 adagrad_init: float = 1e-8, seed: int = 0, initial_rows: int = 1024,
                 min_count: int = 5, word_capacity: int = 1_000_000):
        if dim < 1:
            raise ValueError("dim must be >= 1")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        self.dim = int(dim)
        self.optimizer = optimizer
        self.eta = float(DEFAULT_ETA[optimizer] if eta is None else eta)
        self.adagrad_init = float(adagrad_init)
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        cap = max(16, int(initial_rows))
        self.vectors = np.zeros((cap, self.dim), dtype=np.float32)
        self.accum = np.zeros(self._accum_shape(cap), dtype=np.float32)
        self.row_keys = np.zeros(cap, dtype=np.uint64)
        self.row_version = np.zeros(cap, dtype=np.int64)
        self.row_born = np.zeros(cap, dtype=np.int64)      # the version a row was created at
        self.fresh_dropped = 0   # fresh deltas dropped because their row had moved on (add_deltas)
        self._last_mover = np.zeros(0, dtype=np.int64)      # the sender whose delta last moved a row (servers)
        self.counts = np.zeros(cap, dtype=np.int64)
        self._index = KeyIndex(cap)
        self._free_rows = np.zeros(0, dtype=np.int64)
        self._next_row = 0
        self.words: dict[int, str] = {}
        self.version = 0
        self._removed_keys: list[np.ndarray] = []
        self._removed_versions: list[int] = []
        self._removed_total = 0
        self._removal_floor = 0   # changes_since(v) with v < this needs a full resync
        self._lock = threading.RLock()
        self._growth = _GrowthLock()
        self.word_counts = WordCounts(word_capacity, min_count)
        self._merge: ConcurrentMerge | None = None   # how concurrent deltas combine (``merge_window``)

    @property
    def merge_window(self) -> float:
        """Seconds within which deltas of different workers to a row are combined as concurrent
        (``online.learner.concurrent_merge``); 0: every delta is simply added."""
        return self._merge.window if self._merge is not None else 0.0

    @merge_window.setter
    def merge_window(self, seconds: float) -> None:
        self._merge = ConcurrentMerge(self.dim, seconds) if seconds > 0 else None

    def _accum_shape(self, rows: int) -> tuple[int, int]:
        return {"adagrad": (rows, self.dim), "rowadagrad": (rows, 1), "sgd": (0, self.dim)}[self.optimizer]

    # ------------------------------------------------------------------ rows
    def __len__(self) -> int:
        return len(self._index)

    @property
    def capacity(self) -> int:
        return self.vectors.shape[0]

    @property
    def rows_in_use(self) -> int:
        """Every row handed out is below this (it only grows), so a scan for rows a kernel wrote can stop
        there instead of at the capacity, which a host's replica reserves far ahead."""
        return self._next_row

    def rows_for(self, keys: np.ndarray, create: bool = True) -> np.ndarray:
        """Row index of each key (creating missing rows if ``create``, else -1)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        with self._lock:
            rows = self._index.lookup(keys)
            if not create:
                return rows
            missing = rows < 0
            if missing.any():
                new_keys = np.unique(keys[missing])
                new_rows = self._allocate(len(new_keys))
                self._index.insert(new_keys, new_rows)
                self.row_keys[new_rows] = new_keys
                init_rows(self.vectors, new_rows, new_keys, np.uint64(self.seed))
                if self.accum.shape[0]:
                    self.accum[new_rows] = self.adagrad_init
                self.counts[new_rows] = 0
                self.version += 1
                self.row_version[new_rows] = self.version
                self.row_born[new_rows] = self.version
                rows[missing] = self._index.lookup(keys[missing])
            return rows

    def _allocate(self, n: int) -> np.ndarray:
        take = min(n, len(self._free_rows))
        rows = self._free_rows[len(self._free_rows) - take:]
        self._free_rows = self._free_rows[:len(self._free_rows) - take]
        rest = n - take
        if self._next_row + rest > self.capacity:
            self._grow(self._next_row + rest)
        fresh = np.arange(self._next_row, self._next_row + rest, dtype=np.int64)
        self._next_row += rest
        return np.concatenate([rows, fresh])

    def _grow(self, needed: int) -> None:
        cap = self.capacity
        while cap < needed:
            cap *= 2
        with self._growth.exclusive():
            def grown(a):
                if not a.shape[0]:
                    return a
                # zeros come from the OS's zeroed pages (calloc); a fill pass would write every byte first (2.5 % of a
                # ``livevec train`` run's samples)
                out = np.zeros((cap,) + a.shape[1:], dtype=a.dtype)
                out[:a.shape[0]] = a
                return out
            self.vectors = grown(self.vectors)
            if self.accum.shape[0]:
                self.accum = grown(self.accum)
            self.row_keys = grown(self.row_keys)
            self.row_version = grown(self.row_version)
            self.row_born = grown(self.row_born)
            self.counts = grown(self.counts)

    @contextmanager
    def training(self):
        """Hold while a kernel writes ``vectors``/``accum`` in place: storage will not move."""
        with self._growth.shared():
            yield self

    # ------------------------------------------------------------- ps-lite KV
    def pull(self, keys: np.ndarray) -> np.ndarray:
        """Values of ``keys`` as float32 [len(keys), dim] (a copy); creates missing rows."""
        with self._lock:
            rows = self.rows_for(keys, create=True)
            return self.vectors[rows]

    def push(self, keys: np.ndarray, grads: np.ndarray) -> int:
        """Apply gradients dL/d(row) (float32 [len(keys), dim]) with the optimizer; returns the new version."""
        grads = np.ascontiguousarray(grads, dtype=np.float32).reshape(len(keys), self.dim)
        with self._lock:
            rows = self.rows_for(keys, create=True)
            if self.optimizer == "adagrad":
                _apply_adagrad(self.vectors, self.accum, rows, grads, np.float32(self.eta))
            elif self.optimizer == "rowadagrad":
                _apply_row_adagrad(self.vectors, self.accum, rows, grads, np.float32(self.eta))
            else:
                _apply_sgd(self.vectors, rows, grads, np.float32(self.eta))
            return self._stamp(rows)

    def assign(self, keys: np.ndarray, values: np.ndarray, accum: np.ndarray | None = None) -> int:
        """Set rows to ``values`` (checkpoint restore, tests); returns the new version."""
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(len(keys), self.dim)
        with self._lock:
            rows = self.rows_for(keys, create=True)
            self.vectors[rows] = values
            if accum is not None and self.accum.shape[0]:
                self.accum[rows] = np.asarray(accum, dtype=np.float32).reshape(len(keys), self.accum.shape[1])
            return self._stamp(rows)

    def add_deltas(self, keys: np.ndarray, deltas: np.ndarray, accum_deltas: np.ndarray,
                   fresh: bool = False, sender: int = 0, now: float | None = None,
                   contraction: np.ndarray | None = None) -> np.ndarray:
        """Add workers' row changes (float32 [n, dim]) and AdaGrad accumulator increments ([n]);
        returns the merged rows as a sync's answer: float32 [n, dim + 1], each row's values and then its
        row-wise accumulator (``online.learner.shard_passes``).

        The accumulator is the row-wise one (the mean squared gradient summed): with a
        per-coordinate AdaGrad shard the increment goes to every coordinate, which keeps the
        mean over coordinates equal to the row-wise value; SGD has none (answered as 0).

        ``fresh``: the worker created these rows from the initial value and trained them
        without knowing the servers' value. Such a delta is only valid where the row here is
        still at that initial value (never changed since it was created: a word new to the
        cluster); elsewhere it is a trajectory from the wrong point, with an optimizer state
        that has not seen the row's history, and it is dropped (the answer still carries the
        row, which the worker adopts). A row stays "at the initial value" while every delta it
        got was fresh (workers that discovered a new word at the same time all count); the
        first ordinary delta, a push or an assignment establishes it."""
        # One argument type for ``add_rows`` whatever the caller passes (a read-only view of the wire's rows, an
        # unpacked int8 delta, a merge's sum): numba compiles, and caches, a kernel per type, and the image's
        # cache holds the one the warm-up ran (``online.cli.kernel_warm``).
        deltas = _writable(np.asarray(deltas, dtype=np.float32).reshape(len(keys), self.dim))
        accum_deltas = _writable(np.asarray(accum_deltas, dtype=np.float32).reshape(len(keys)))
        with self._lock:
            rows = self.rows_for(keys, create=True)
            rows_all = rows
            if fresh:
                keep = self.row_version[rows] == self.row_born[rows]
                self.fresh_dropped += int(len(keep) - keep.sum())
                rows, deltas, accum_deltas = rows[keep], deltas[keep], accum_deltas[keep]
                if contraction is not None:
                    contraction = np.asarray(contraction)[keep]
            if self._merge is not None:
                now = time.monotonic() if now is None else now   # (a simulation passes its own clock)
                if not self._merge.alone(sender, now):
                    deltas, accum_deltas = self._merge.combine(rows, deltas, accum_deltas, sender, now, contraction)
            moved = np.empty(len(rows), dtype=np.bool_)
            out = np.empty((0 if fresh else len(rows), self.dim + 1), dtype=np.float32)
            add_rows(self.vectors, self.accum, np.ascontiguousarray(rows, np.int64), deltas, accum_deltas, moved, out)
            # Only rows that moved are stamped: a zero delta (a replica refreshing a row) is no change, and
            # stamped it would be listed as changed to every other replica, whose refreshes would stamp it again.
            moved = rows[moved]
            if len(moved):
                self._stamp(moved)
                self._note_writer(moved, sender)
                if fresh:   # still nothing but deltas from the initial value: later fresh ones add up too
                    self.row_born[moved] = self.version
            return self._answer(rows_all) if fresh else out

    def read_rows(self, keys: np.ndarray) -> np.ndarray:
        """The rows of ``keys`` with their row-wise accumulators, in ``add_deltas``' answer layout ([n, dim + 1]),
        created at their initial value if absent, changing nothing else: what a replica refreshing rows it did
        not train reads (``CMD_DELTA`` pulled)."""
        with self._lock:
            return self._answer(self.rows_for(np.ascontiguousarray(keys, dtype=np.uint64), create=True))

    def _answer(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), self.dim + 1), dtype=np.float32)
        answer_rows(self.vectors, self.accum, np.ascontiguousarray(rows, np.int64), out)
        return out

    def count_words(self, keys: np.ndarray, deltas: np.ndarray) -> np.ndarray:
        """Add occurrence counts of words (distinct input keys) to the cluster's totals; returns the totals.

        Words whose total reaches ``min_count`` get rows and carry the total as their count;
        trainable words the bounded table evicts lose their rows here, and only here."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        with self._lock:
            totals, evicted = self.word_counts.add(keys, deltas)
            if len(evicted):
                self.free(word_rows(evicted))
            trainable = totals >= self.word_counts.min_count
            if trainable.any():
                tkeys = keys[trainable]
                rows = self.rows_for(tkeys, create=True)
                self.counts[rows] = totals[trainable]
            return totals

    def trainable_since(self, generation: int, since: int) -> tuple[int, int, np.ndarray]:
        """``WordCounts.trainable_since`` under the shard's lock: the words workers should train from their
        first occurrence."""
        with self._lock:
            return self.word_counts.trainable_since(generation, since)

    def free(self, keys: np.ndarray) -> int:
        """Delete the rows of ``keys`` (evicted words; absent keys are ignored)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        with self._lock:
            rows = self._index.delete(keys)
            gone = rows >= 0
            if not gone.any():
                return self.version
            freed_rows, freed_keys = rows[gone], keys[gone]
            self._free_rows = np.concatenate([self._free_rows, freed_rows])
            self.row_version[freed_rows] = 0
            if self._merge is not None:
                self._merge.forget(freed_rows)
            for k in freed_keys.tolist():
                self.words.pop(k, None)
            self.version += 1
            self._removed_keys.append(freed_keys)
            self._removed_versions.append(self.version)
            self._removed_total += len(freed_keys)
            while self._removed_total > self.REMOVAL_LOG_LIMIT and len(self._removed_keys) > 1:
                self._removed_total -= len(self._removed_keys.pop(0))
                self._removal_floor = self._removed_versions.pop(0)
            return self.version

    def mark_changed(self, rows: np.ndarray) -> int:
        """Stamp rows changed by an in-place kernel; returns the new version. Call it inside ``training()``
        (the arrays cannot move then).

        Without the shard's lock: a worker's sync holds that lock while it copies the changed rows, and
        the training threads would wait for it here 14 % of their time (py-spy, full corpus).
        The stamps are written before ``version`` moves, so a reader of ``version`` (the replica's
        ``collect``) sees each stamp either now or, being above what it read, at its next call; at worst a
        row is collected twice, which sends a zero delta. Two threads stamping at once may share a version."""
        rows = np.asarray(rows, dtype=np.int64)
        version = self.version + 1
        self.row_version[rows] = version
        self.version = max(self.version, version)
        return version

    def _stamp(self, rows: np.ndarray) -> int:
        self.version += 1
        self.row_version[rows] = self.version
        return self.version

    # -------------------------------------------------------------- metadata
    def add_counts(self, keys: np.ndarray, deltas: np.ndarray) -> None:
        """Add occurrence counts of words (input keys); creates their rows."""
        with self._lock:
            rows = self.rows_for(keys, create=True)
            np.add.at(self.counts, rows, np.asarray(deltas, dtype=np.int64))

    def set_words(self, keys: np.ndarray, words: list[str]) -> None:
        """Remember the strings of input keys (for the front end and output files)."""
        with self._lock:
            self.words.update(zip(np.asarray(keys, dtype=np.uint64).tolist(), words))

    def named_input_rows(self, keys: np.ndarray) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
        """(keys, words, vectors, counts) of those ``keys`` that have a row and a word string.

        What readers of the model (the front end's sync, exports) need; nothing is created.
        Read under the lock, so a row freed and reused for another key between the lookup
        and the copy cannot hand back the wrong vector.
        """
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        with self._lock:
            rows = self.rows_for(keys, create=False)
            words = self.words_for(keys)
            known = (rows >= 0) & np.fromiter((w is not None for w in words), dtype=bool, count=len(words))
            rows = rows[known]
            vectors = self.vectors[rows]            # fancy indexing copies
            counts = self.counts[rows].copy()
        return keys[known], [w for w, ok in zip(words, known.tolist()) if ok], vectors, counts

    def words_for(self, keys: np.ndarray) -> list[str | None]:
        get = self.words.get
        return [get(k) for k in np.asarray(keys, dtype=np.uint64).tolist()]

    def counts_for(self, keys: np.ndarray) -> np.ndarray:
        with self._lock:
            rows = self._index.lookup(np.asarray(keys, dtype=np.uint64))
            out = np.zeros(len(rows), dtype=np.int64)
            out[rows >= 0] = self.counts[rows[rows >= 0]]
            return out

    def keys(self) -> np.ndarray:
        """All live keys."""
        with self._lock:
            return self._index.items()[0]

    # ------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        """Everything needed to rebuild this shard: arrays aligned on ``keys`` plus settings."""
        with self._lock:
            keys, rows = self._index.items()
            order = np.argsort(keys)
            keys, rows = keys[order], rows[order]
            return {"dim": self.dim, "optimizer": self.optimizer, "eta": self.eta,
                    "adagrad_init": self.adagrad_init, "seed": self.seed, "version": self.version,
                    "keys": keys, "vectors": self.vectors[rows],
                    "accum": self.accum[rows] if self.accum.shape[0] else None,
                    "counts": self.counts[rows], "words": self.words_for(keys),
                    "word_counts": self.word_counts.state()}

    @classmethod
    def from_state(cls, state: dict, **options) -> "EmbeddingShard":
        """``options``: the word-count table's settings (``min_count``, ``word_capacity``), which are the
        loading server's, not the checkpoint's."""
        shard = cls(state["dim"], optimizer=state["optimizer"], eta=state["eta"],
                    adagrad_init=state["adagrad_init"], seed=state["seed"], initial_rows=max(16, len(state["keys"])),
                    **options)
        keys = np.asarray(state["keys"], dtype=np.uint64)
        if len(keys):
            shard.assign(keys, state["vectors"], state.get("accum"))
            shard.add_counts(keys, state["counts"])
            named = [(k, w) for k, w in zip(keys.tolist(), state["words"]) if w is not None]
            if named:
                shard.set_words(np.array([k for k, _ in named], dtype=np.uint64), [w for _, w in named])
        if state.get("word_counts") is not None:
            shard.word_counts.load(*state["word_counts"])
        shard.version = max(shard.version, int(state["version"]))
        return shard

    # --------------------------------------------------------------- versions
    def _note_writer(self, rows: np.ndarray, sender: int) -> None:
        """Who last moved each row by a delta (``changed_keys_since`` leaves a replica's own changes out)."""
        need = int(rows.max()) + 1
        if need > len(self._last_mover):
            grown = np.zeros(max(need, 2 * len(self._last_mover), 1024), dtype=np.int64)
            grown[:len(self._last_mover)] = self._last_mover
            self._last_mover = grown
        self._last_mover[rows] = sender

    def last_movers(self, keys: np.ndarray) -> np.ndarray:
        """The sender whose delta last moved each key's row (-1: none, or no row): a sender that moved a row last
        holds its value, so the answer to its next delta of it may leave the row out
        (``online.cluster.delta_wire``)."""
        with self._lock:
            rows = self._index.lookup(np.ascontiguousarray(keys, dtype=np.uint64))
            out = np.full(len(rows), -1, dtype=np.int64)
            known = (rows >= 0) & (rows < len(self._last_mover))
            out[known] = self._last_mover[rows[known]]
            return out

    def changed_keys_since(self, version: int, asker: int = -1, listing=None) -> tuple[int, np.ndarray]:
        """(the version now, the keys of the live rows changed after ``version``): what a worker's replica
        refreshes (``online.cluster.replica``); one pass over the stamps, no removal log. Rows ``asker`` moved
        last are left out: the answer to its own sync already brought what others did before it. ``listing``
        (``online.cluster.change_listing.ChangeListing``): only the rows it listed after ``version``."""
        with self._lock:
            if listing is None:
                rows = np.flatnonzero(self.row_version[:self._next_row] > version)
            else:
                rows = listing.listed_since(version, self._next_row)
                rows = rows[self._index.lookup(self.row_keys[rows]) == rows]   # live rows only
            if asker >= 0 and len(rows):
                writer = np.full(len(rows), -1, dtype=np.int64)
                known = rows < len(self._last_mover)
                writer[known] = self._last_mover[rows[known]]
                rows = rows[writer != asker]
            return self.version, self.row_keys[rows]

    def changes_since(self, version: int) -> ShardChanges:
        """Keys changed and removed after ``version`` (0 = everything)."""
        with self._lock:
            now = self.version
            live_rows = np.flatnonzero(self.row_version[:self._next_row] > version)
            changed = self.row_keys[live_rows]
            full = version < self._removal_floor
            if self._removed_keys:
                recent = [k for v, k in zip(self._removed_versions, self._removed_keys) if v > version]
                removed = np.unique(np.concatenate(recent)) if recent else np.zeros(0, dtype=np.uint64)
                if len(removed):
                    removed = removed[self._index.lookup(removed) < 0]   # re-created keys count as changed
            else:
                removed = np.zeros(0, dtype=np.uint64)
            return ShardChanges(now, changed, removed, full)
