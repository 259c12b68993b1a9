"""The front end's copy of the model: an immutable snapshot swapped in whole.

A ``ModelIndex`` is never modified after it is built. ``apply(delta)`` builds the next
snapshot (copy-on-write) in the sync thread and ``ModelHolder.swap`` publishes it with a
single reference assignment, so a query, which reads ``holder.current`` once and uses
only that object, sees version v or version v+1 and never half of a sync. The price is
one copy of the normalised matrix per sync with changes (about 4 ms per 100k x 100 on
this machine; the raw vectors are kept as unit rows times their norms, so there is one
matrix to copy, not two), paid off the query path.

Search is exact: cosine similarity against the row-normalised float32 matrix ``unit``.
On a large model an int8 copy of ``unit`` is scored first and only the rows that can still
reach the top k are re-scored in float32 (``int8_prefilter``; same answers): about 0.2 ms
for one query at 100k x 100 against 1.5 ms for the float32 BLAS product it replaced.
Without its kernel (no compiler at install time, or a CPU without VNNI) the float32
product and a compiled top-k heap answer. An HNSW index was rejected for the
default path: it cannot follow a model that changes 10^5-10^6 rows per second
(bench/README.md).
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from online.frontend import int8_prefilter
from online.frontend.sources import ModelDelta
from online.learner.keys import word_key

_HIGHEST_CHAR = "\U0010ffff"


class ModelDeltaError(ValueError):
    """A delta from a source is malformed (wrong shapes, wrong dimension)."""


@dataclass(frozen=True)
class Neighbour:
    word: str
    score: float


def _normalise(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit rows and the norms that restore the vectors (a zero vector stays zero)."""
    norms = np.linalg.norm(vectors, axis=1).astype(np.float32)
    safe = np.where(norms == 0, np.float32(1.0), norms)
    return (vectors / safe[:, None]).astype(np.float32, copy=False), norms


def _check_delta(delta: ModelDelta) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray, int]:
    keys = np.asarray(delta.keys, dtype=np.uint64).reshape(-1)
    words = list(delta.words)
    vectors = np.asarray(delta.vectors, dtype=np.float32)
    counts = np.asarray(delta.counts, dtype=np.int64).reshape(-1)
    removed = np.asarray(delta.removed, dtype=np.uint64).reshape(-1)
    if vectors.ndim != 2:
        raise ModelDeltaError(f"vectors must be 2-d, got shape {vectors.shape}")
    n = len(keys)
    if not (len(words) == n and vectors.shape[0] == n and len(counts) == n):
        raise ModelDeltaError(f"delta has {n} keys, {len(words)} words, {vectors.shape[0]} vectors and "
                              f"{len(counts)} counts; they must match")
    bad = ~np.isfinite(vectors).all(axis=1) if n else np.zeros(0, bool)
    if bad.any():                       # a NaN row would win every top-k; serve it as a zero vector
        vectors = vectors.copy()
        vectors[bad] = 0.0
    if n and len(np.unique(keys)) != n:  # duplicate keys: the last occurrence wins
        _, last = np.unique(keys[::-1], return_index=True)
        keep = np.sort(n - 1 - last)
        keys, vectors, counts = keys[keep], vectors[keep], counts[keep]
        words = [words[i] for i in keep.tolist()]
    return keys, words, np.ascontiguousarray(vectors), counts, removed, int(bad.sum())


@njit(nogil=True, cache=True)
def _select_top_k(scores, exclude_ptr, exclude_rows, k, out_rows, out_scores):
    """Best ``k`` columns of each row of ``scores`` (best first; ties: lower column first).

    A size-k min-heap per row, in one compiled call that holds no GIL: the event loop
    keeps serving while a batch is ranked, and a 100k-column row costs about one pass of
    comparisons (most scores lose against the heap's root), less than ``argpartition``.
    Excluded columns (the query words) are set to -inf first; unfilled slots get -1.
    """
    b, n = scores.shape
    for i in range(b):
        for j in range(exclude_ptr[i], exclude_ptr[i + 1]):
            scores[i, exclude_rows[j]] = -np.inf
        heap_v = np.empty(k, dtype=np.float32)
        heap_r = np.empty(k, dtype=np.int64)
        size = 0
        for col in range(n):
            v = scores[i, col]
            if size < k:                                   # sift up
                pos = size
                size += 1
                while pos > 0:
                    parent = (pos - 1) // 2
                    pv, pr = heap_v[parent], heap_r[parent]
                    if pv < v or (pv == v and pr < col):  # the root is the worst element
                        break
                    heap_v[pos], heap_r[pos] = pv, pr
                    pos = parent
                heap_v[pos], heap_r[pos] = v, col
            elif v > heap_v[0]:                            # replace the worst, sift down
                pos = 0
                while True:
                    child = 2 * pos + 1
                    if child >= k:
                        break
                    if child + 1 < k:
                        cv, cr = heap_v[child], heap_r[child]
                        dv, dr = heap_v[child + 1], heap_r[child + 1]
                        if dv < cv or (dv == cv and dr > cr):
                            child += 1
                    cv, cr = heap_v[child], heap_r[child]
                    if v < cv or (v == cv and col > cr):
                        break
                    heap_v[pos], heap_r[pos] = cv, cr
                    pos = child
                heap_v[pos], heap_r[pos] = v, col
        order = np.argsort(heap_r[:size])                  # ties: lower column first ...
        order = order[np.argsort(-heap_v[:size][order], kind="mergesort")]   # ... then best score first
        for t in range(size):
            out_rows[i, t] = heap_r[order[t]]
            out_scores[i, t] = heap_v[order[t]]
        for t in range(size, k):
            out_rows[i, t] = -1
            out_scores[i, t] = -np.inf


def warm_up() -> None:
    """Compile (or load from numba's cache) the search kernels before the first query needs them."""
    _select_top_k(np.zeros((1, 3), np.float32), np.zeros(2, np.int64), np.zeros(0, np.int64), 2,
                  np.empty((1, 2), np.int64), np.empty((1, 2), np.float32))
    int8_prefilter.warm_up()


class ModelIndex:
    """One immutable version of the model, with what queries need precomputed.

    Words are found through their keys: ``word_key(word)`` then a binary search in the
    sorted key array, so no per-word dict has to be copied at every sync (copying two
    100k-entry dicts holds the GIL, and so stalls the event loop, for several ms).
    """

    def __init__(self, version: int, keys: np.ndarray, words: list[str], counts: np.ndarray,
                 unit: np.ndarray, norms: np.ndarray, *, alpha_rows: np.ndarray | None = None,
                 alpha_words: list[str] | None = None, key_order: np.ndarray | None = None,
                 updated_at: float | None = None, bad_rows: int = 0,
                 codes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None):
        self.version = int(version)
        self.keys = keys
        self.words = words
        self.counts = counts
        self.unit = unit                                 # the searched matrix: rows of length 1 (or 0)
        self.norms = norms                               # unit * norms = the vectors (only unit is copied per sync)
        if codes is None:
            codes = int8_prefilter.quantise(unit)
        # int8 copy of unit for the pre-filter, in the kernel's packed layout (rows padded to
        # whole tiles with zero codes); per row: scale, |x - x_hat| and the code sum
        self.codes, self.code_scale, self.code_error, self.code_sum = codes
        self._tile_err: np.ndarray | None = None
        self.updated_at = time.time() if updated_at is None else updated_at
        self.bad_rows = bad_rows
        if key_order is None:
            key_order = np.argsort(keys, kind="stable")
        self.key_order = key_order                       # rows in key order
        self.sorted_keys = keys[key_order]
        if alpha_rows is None:
            alpha_rows = np.asarray(sorted(range(len(words)), key=words.__getitem__), dtype=np.int64)
            alpha_words = None
        self.alpha_rows = alpha_rows                     # rows in alphabetical order of their words
        self.alpha_words = [words[r] for r in alpha_rows.tolist()] if alpha_words is None else alpha_words
        for a in (self.keys, self.counts, self.norms, self.unit, self.alpha_rows, self.key_order,
                  self.sorted_keys, self.codes, self.code_scale, self.code_error, self.code_sum):
            a.flags.writeable = False

    # ---------------------------------------------------------------- building
    @classmethod
    def empty(cls) -> "ModelIndex":
        z = np.zeros((0, 0), np.float32)
        return cls(0, np.zeros(0, np.uint64), [], np.zeros(0, np.int64), z, np.zeros(0, np.float32), updated_at=0.0)

    @classmethod
    def from_arrays(cls, version: int, keys, words, vectors, counts=None) -> "ModelIndex":
        counts = np.zeros(len(words), np.int64) if counts is None else counts
        return cls.empty().apply(ModelDelta(np.asarray(keys, np.uint64), list(words),
                                            np.asarray(vectors, np.float32), np.asarray(counts, np.int64),
                                            version, full=True))

    def rows_of_keys(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, -1 where absent (vectorised binary search)."""
        keys = np.asarray(keys, dtype=np.uint64)
        if len(self.sorted_keys) == 0 or len(keys) == 0:
            return np.full(len(keys), -1, dtype=np.int64)
        pos = np.searchsorted(self.sorted_keys, keys)
        pos[pos == len(self.sorted_keys)] = 0
        return np.where(self.sorted_keys[pos] == keys, self.key_order[pos], -1)

    def apply(self, delta: ModelDelta) -> "ModelIndex":
        """The snapshot after ``delta`` (this one is left untouched)."""
        keys, words, vectors, counts, removed, bad = _check_delta(delta)
        if delta.full:
            return ModelIndex(delta.version, keys, words, counts, *_normalise(vectors), bad_rows=bad)
        if len(keys) == 0 and len(removed) == 0:
            return ModelIndex(delta.version, self.keys, self.words, self.counts, self.unit, self.norms,
                              alpha_rows=self.alpha_rows, alpha_words=self.alpha_words, key_order=self.key_order,
                              bad_rows=self.bad_rows, codes=self._code_arrays)
        dim = self.dim if self.n else vectors.shape[1]
        if len(keys) and vectors.shape[1] != dim:
            raise ModelDeltaError(f"delta has dimension {vectors.shape[1]}, the model has {dim}")
        rows = self.rows_of_keys(keys)
        is_new = rows < 0
        n_old, n_new = self.n, int(is_new.sum())
        rows[is_new] = np.arange(n_old, n_old + n_new)
        if n_old:
            new_unit = np.concatenate([self.unit, np.empty((n_new, dim), np.float32)])
        else:
            new_unit = np.empty((n_new, dim), np.float32)
        new_norms = np.concatenate([self.norms, np.empty(n_new, np.float32)])
        new_unit[rows], new_norms[rows] = _normalise(vectors)
        new_codes = int8_prefilter.grown_codes(self._code_arrays, n_old, n_old + n_new, dim)
        int8_prefilter.quantise(new_unit, rows, new_codes)                           # only the changed rows
        new_counts = np.concatenate([self.counts, np.zeros(n_new, np.int64)])
        new_counts[rows] = counts
        fresh_keys, fresh_rows = keys[is_new], rows[is_new]
        new_keys = np.concatenate([self.keys, fresh_keys])
        new_words = self.words + [w for w, fresh in zip(words, is_new.tolist()) if fresh]
        renamed = False
        for r, w, fresh in zip(rows.tolist(), words, is_new.tolist()):
            if not fresh and new_words[r] != w:     # a key's word string changed (hash collision, fix-up)
                new_words[r] = w
                renamed = True

        # key order: insert the new keys into the sorted array (no full sort)
        by_key = np.argsort(fresh_keys, kind="stable")
        at = np.searchsorted(self.sorted_keys, fresh_keys[by_key])
        key_order = np.insert(self.key_order, at, fresh_rows[by_key]) if n_new else self.key_order
        # alphabetical order: likewise, the few new words go in by binary search
        if renamed:
            alpha_rows, alpha_words = None, None
        elif n_new:
            fresh_words = [new_words[r] for r in fresh_rows.tolist()]
            by_word = sorted(range(n_new), key=fresh_words.__getitem__)
            sorted_fresh = [fresh_words[i] for i in by_word]
            at_words = [bisect.bisect_left(self.alpha_words, w) for w in sorted_fresh]
            alpha_rows = np.insert(self.alpha_rows, at_words, fresh_rows[by_word])
            alpha_words, prev = [], 0
            for pos, w in zip(at_words, sorted_fresh):
                alpha_words.extend(self.alpha_words[prev:pos])
                alpha_words.append(w)
                prev = pos
            alpha_words.extend(self.alpha_words[prev:])
        else:
            alpha_rows, alpha_words = self.alpha_rows, self.alpha_words

        drop_rows = self.rows_of_keys(removed) if len(removed) else np.zeros(0, np.int64)
        if len(drop_rows):
            drop_rows = drop_rows[(drop_rows >= 0) & ~np.isin(removed, keys)]   # changed again: keep
        if len(drop_rows):
            keep = np.ones(len(new_keys), dtype=bool)
            keep[drop_rows] = False
            remap = np.cumsum(keep) - 1
            if alpha_rows is not None:
                kept_alpha = keep[alpha_rows]
                alpha_words = [w for w, k in zip(alpha_words, kept_alpha.tolist()) if k]
                alpha_rows = remap[alpha_rows[kept_alpha]]
            new_unit, new_norms = new_unit[keep], new_norms[keep]
            new_codes = int8_prefilter.quantise(new_unit)          # rows move between tiles: re-quantise all (removals are rare)
            new_counts, new_keys = new_counts[keep], new_keys[keep]
            new_words = [w for w, k in zip(new_words, keep.tolist()) if k]
            key_order = None
        return ModelIndex(delta.version, new_keys, new_words, new_counts, new_unit, new_norms,
                          alpha_rows=alpha_rows, alpha_words=alpha_words, key_order=key_order,
                          bad_rows=self.bad_rows + bad, codes=new_codes)

    def _tile_error(self) -> np.ndarray:
        """Largest |x - x_hat| per tile (computed on first use; the snapshot never changes)."""
        if self._tile_err is None:
            self._tile_err = int8_prefilter.tile_error(self.code_error)
        return self._tile_err

    @property
    def _code_arrays(self):
        return self.codes, self.code_scale, self.code_error, self.code_sum

    # ----------------------------------------------------------------- reading
    @property
    def n(self) -> int:
        return len(self.words)

    @property
    def dim(self) -> int:
        return int(self.unit.shape[1])

    def vector(self, row: int) -> np.ndarray:
        """The vector of ``row`` as the source sent it (to float32 rounding)."""
        return self.unit[row] * self.norms[row]

    @property
    def vectors(self) -> np.ndarray:
        """All vectors (a new array; for scripts and tests, not the query path)."""
        return self.unit * self.norms[:, None]

    def _row_of_word(self, word: str) -> int:
        if not self.n:
            return -1
        r = int(self.rows_of_keys(np.array([word_key(word)], dtype=np.uint64))[0])
        return r if r >= 0 and self.words[r] == word else -1

    def row(self, word: str) -> int:
        """Row of ``word`` (exact, else its lower-case form), or -1."""
        r = self._row_of_word(word)
        if r < 0:
            lower = word.lower()
            if lower != word:
                r = self._row_of_word(lower)
        return r

    def prefix(self, prefix: str, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` words starting with ``prefix``, most frequent first (then alphabetical)."""
        lo = bisect.bisect_left(self.alpha_words, prefix)
        hi = bisect.bisect_left(self.alpha_words, prefix + _HIGHEST_CHAR, lo)
        rows = self.alpha_rows[lo:hi]               # alphabetical
        if len(rows) > limit:
            c = self.counts[rows]
            threshold = np.partition(c, len(c) - limit)[len(c) - limit]    # the limit-th largest count
            above = rows[c > threshold]
            tied = rows[c == threshold][:limit - len(above)]              # ties: alphabetical order wins
            rows = np.concatenate([above, tied])
        order = sorted(rows.tolist(), key=lambda r: (-int(self.counts[r]), self.words[r]))
        return [(self.words[r], int(self.counts[r])) for r in order]

    def prefix_total(self, prefix: str) -> int:
        lo = bisect.bisect_left(self.alpha_words, prefix)
        return bisect.bisect_left(self.alpha_words, prefix + _HIGHEST_CHAR, lo) - lo

    def query_vector(self, positive_rows: list[int], negative_rows: list[int]) -> np.ndarray:
        """3CosAdd direction: sum of the unit vectors of positive minus negative, normalised."""
        q = self.unit[positive_rows].sum(axis=0)
        if negative_rows:
            q = q - self.unit[negative_rows].sum(axis=0)
        norm = float(np.linalg.norm(q))
        return (q / norm if norm > 0 else q).astype(np.float32)

    def top_k(self, queries: np.ndarray, exclude: list[list[int]], ks: list[int], *,
              prefilter: bool | None = None) -> list[list[Neighbour]]:
        """Exact top ``ks[i]`` rows by cosine for each row of ``queries`` (float32 [b, dim], unit length).

        ``prefilter`` (default: at least ``int8_prefilter.MIN_ROWS_FOR_CODES`` rows and at
        most ``MAX_BATCH_FOR_CODES`` queries) scores
        the int8 copy first and re-scores in float32 only the rows that can still make the
        top k; the answer is the same as without it.
        """
        b, n = len(ks), self.n
        if n == 0 or b == 0:
            return [[] for _ in range(b)]
        kk = min(max(ks), n)
        ptr = np.zeros(b + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(rows) for rows in exclude])
        flat = np.fromiter((r for rows in exclude for r in rows), dtype=np.int64, count=int(ptr[-1]))
        if prefilter is None:
            prefilter = (n >= int8_prefilter.MIN_ROWS_FOR_CODES
                         and b <= int8_prefilter.MAX_BATCH_FOR_CODES[int8_prefilter.SCAN])
        if prefilter and self.dim:
            top, top_scores = int8_prefilter.prefiltered_top_k(self.unit, self._code_arrays, self._tile_error(),
                                                               queries, ptr, flat, kk)
        else:
            scores = queries @ self.unit.T                   # [b, n], one BLAS call for the whole batch
            top = np.empty((b, kk), dtype=np.int64)
            top_scores = np.empty((b, kk), dtype=np.float32)
            _select_top_k(scores, ptr, flat, kk, top, top_scores)
        words = self.words
        out = []
        for i, k in enumerate(ks):
            row_scores = top_scores[i, :k].tolist()
            out.append([Neighbour(words[r], round(s, 6)) for r, s in zip(top[i, :k].tolist(), row_scores)
                        if r >= 0 and s != -np.inf])
        return out

    def most_similar(self, positive: list[str], negative: list[str] = (), k: int = 10) -> list[Neighbour]:
        """Convenience for tests and scripts: one query, unknown words raise KeyError."""
        pos = [self.row(w) for w in positive]
        neg = [self.row(w) for w in negative]
        missing = [w for w, r in zip(list(positive) + list(negative), pos + neg) if r < 0]
        if missing:
            raise KeyError(missing)
        q = self.query_vector(pos, neg)[None, :]
        return self.top_k(q, [pos + neg], [k])[0]


class ModelHolder:
    """The current snapshot; ``swap`` is one reference assignment, which is atomic for readers."""

    def __init__(self):
        self.current: ModelIndex = ModelIndex.empty()
        self.loaded = False
        self.swapped_at: float | None = None

    def swap(self, index: ModelIndex) -> None:
        self.current = index
        self.swapped_at = time.time()
        self.loaded = True
