"""The front end's copy of the model: an immutable snapshot swapped in whole.

A ``ModelIndex`` is never modified after it is built. ``apply(delta)`` builds the next
snapshot (copy-on-write) in the sync thread and ``ModelHolder.swap`` publishes it with a
single reference assignment, so a query, which reads ``holder.current`` once and uses
only that object, sees version v or version v+1 and never half of a sync. The price is
one copy of the matrices per sync with changes (about 10 ms per 100k x 100 on this
machine), which is paid off the query path.

Search is exact: cosine similarity is a product with the row-normalised float32 matrix
``unit``, and the top k come from ``argpartition`` then a sort of those k only. At 100k
x 100 that is about 1.4 ms for one query on one core, and about 0.3 ms per query when 64
are fused into one matrix product (see ``query_engine``). An HNSW index was rejected for
the default path: it cannot follow a model that changes 10^5-10^6 rows per second
(bench/README.md).
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np

from online.frontend.sources import ModelDelta

_HIGHEST_CHAR = "\U0010ffff"


class ModelDeltaError(ValueError):
    """A delta from a source is malformed (wrong shapes, wrong dimension)."""


@dataclass(frozen=True)
class Neighbour:
    word: str
    score: float


def _normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0           # a zero vector stays zero: similarity 0 with everything
    return (vectors / norms).astype(np.float32, copy=False)


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


class ModelIndex:
    """One immutable version of the model, with what queries need precomputed."""

    def __init__(self, version: int, keys: np.ndarray, words: list[str], counts: np.ndarray,
                 vectors: np.ndarray, unit: np.ndarray, alpha_rows: np.ndarray | None = None,
                 updated_at: float | None = None, bad_rows: int = 0, *,
                 row_of_key: dict[int, int] | None = None, row_of_word: dict[str, int] | None = None,
                 alpha_words: list[str] | None = None):
        self.version = int(version)
        self.keys = keys
        self.words = words
        self.counts = counts
        self.vectors = vectors
        self.unit = unit
        self.updated_at = time.time() if updated_at is None else updated_at
        self.bad_rows = bad_rows
        self.row_of_key: dict[int, int] = (dict(zip(keys.tolist(), range(len(keys))))
                                           if row_of_key is None else row_of_key)
        self.row_of_word: dict[str, int] = dict(zip(words, range(len(words)))) if row_of_word is None else row_of_word
        if alpha_rows is None:
            alpha_rows = np.asarray(sorted(range(len(words)), key=words.__getitem__), dtype=np.int64)
            alpha_words = None
        self.alpha_rows = alpha_rows
        self.alpha_words = [words[r] for r in alpha_rows.tolist()] if alpha_words is None else alpha_words
        for a in (self.keys, self.counts, self.vectors, self.unit, self.alpha_rows):
            a.flags.writeable = False

    # ---------------------------------------------------------------- building
    @classmethod
    def empty(cls) -> "ModelIndex":
        z = np.zeros((0, 0), np.float32)
        return cls(0, np.zeros(0, np.uint64), [], np.zeros(0, np.int64), z, z.copy(), updated_at=0.0)

    @classmethod
    def from_arrays(cls, version: int, keys, words, vectors, counts=None) -> "ModelIndex":
        counts = np.zeros(len(words), np.int64) if counts is None else counts
        return cls.empty().apply(ModelDelta(np.asarray(keys, np.uint64), list(words),
                                            np.asarray(vectors, np.float32), np.asarray(counts, np.int64),
                                            version, full=True))

    def apply(self, delta: ModelDelta) -> "ModelIndex":
        """The snapshot after ``delta`` (this one is left untouched)."""
        keys, words, vectors, counts, removed, bad = _check_delta(delta)
        if delta.full:
            return ModelIndex(delta.version, keys, words, counts, vectors.copy(), _normalise(vectors), bad_rows=bad)
        if len(keys) == 0 and len(removed) == 0:
            return ModelIndex(delta.version, self.keys, self.words, self.counts, self.vectors, self.unit,
                              self.alpha_rows, bad_rows=self.bad_rows, row_of_key=self.row_of_key,
                              row_of_word=self.row_of_word, alpha_words=self.alpha_words)
        dim = self.dim if self.n else vectors.shape[1]
        if len(keys) and vectors.shape[1] != dim:
            raise ModelDeltaError(f"delta has dimension {vectors.shape[1]}, the model has {dim}")
        get = self.row_of_key.get
        rows = np.fromiter((get(k, -1) for k in keys.tolist()), dtype=np.int64, count=len(keys))
        is_new = rows < 0
        n_old, n_new = self.n, int(is_new.sum())
        rows[is_new] = np.arange(n_old, n_old + n_new)
        if n_old:
            new_vectors = np.concatenate([self.vectors, np.empty((n_new, dim), np.float32)])
            new_unit = np.concatenate([self.unit, np.empty((n_new, dim), np.float32)])
        else:
            new_vectors = np.empty((n_new, dim), np.float32)
            new_unit = np.empty((n_new, dim), np.float32)
        new_vectors[rows] = vectors
        new_unit[rows] = _normalise(vectors)
        new_counts = np.concatenate([self.counts, np.zeros(n_new, np.int64)])
        new_counts[rows] = counts
        new_keys = np.concatenate([self.keys, keys[is_new]])
        new_words = self.words + [w for w, fresh in zip(words, is_new.tolist()) if fresh]
        renamed = False
        for r, w, fresh in zip(rows.tolist(), words, is_new.tolist()):
            if not fresh and new_words[r] != w:     # a key's word string changed (hash collision, fix-up)
                new_words[r] = w
                renamed = True

        drop_rows = [self.row_of_key.get(k, -1) for k in removed.tolist()] if len(removed) else []
        if drop_rows:
            changed = set(keys.tolist())
            drop_rows = [r for r, k in zip(drop_rows, removed.tolist()) if r >= 0 and k not in changed]
        # alphabetical order: the old order (still sorted) followed by the new rows; timsort merges the two runs.
        if n_new or renamed:
            alpha = self.alpha_rows.tolist() + rows[is_new].tolist()
            alpha.sort(key=new_words.__getitem__)
            alpha_rows, alpha_words = np.asarray(alpha, dtype=np.int64), None
        else:
            alpha_rows, alpha_words = self.alpha_rows, self.alpha_words
        if drop_rows:
            keep = np.ones(len(new_keys), dtype=bool)
            keep[drop_rows] = False
            remap = np.cumsum(keep) - 1
            alpha_rows = remap[alpha_rows[keep[alpha_rows]]]
            new_vectors, new_unit = new_vectors[keep], new_unit[keep]
            new_counts, new_keys = new_counts[keep], new_keys[keep]
            new_words = [w for w, k in zip(new_words, keep.tolist()) if k]
            return ModelIndex(delta.version, new_keys, new_words, new_counts, new_vectors, new_unit,
                              alpha_rows.astype(np.int64, copy=False), bad_rows=self.bad_rows + bad)
        # no row moved: extend copies of the lookup tables instead of rebuilding them
        row_of_key = self.row_of_key.copy()
        row_of_key.update(zip(keys[is_new].tolist(), rows[is_new].tolist()))
        row_of_word = self.row_of_word.copy()
        if renamed:
            row_of_word = dict(zip(new_words, range(len(new_words))))
        else:
            row_of_word.update((new_words[r], r) for r in rows[is_new].tolist())
        return ModelIndex(delta.version, new_keys, new_words, new_counts, new_vectors, new_unit, alpha_rows,
                          bad_rows=self.bad_rows + bad, row_of_key=row_of_key, row_of_word=row_of_word,
                          alpha_words=alpha_words)

    # ----------------------------------------------------------------- reading
    @property
    def n(self) -> int:
        return len(self.words)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def row(self, word: str) -> int:
        """Row of ``word`` (exact, else its lower-case form), or -1."""
        r = self.row_of_word.get(word)
        if r is None:
            r = self.row_of_word.get(word.lower(), -1)
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

    def top_k(self, queries: np.ndarray, exclude: list[list[int]], ks: list[int]) -> list[list[Neighbour]]:
        """Exact top ``ks[i]`` rows by cosine for each row of ``queries`` (float32 [b, dim], unit length)."""
        b, n = len(ks), self.n
        if n == 0 or b == 0:
            return [[] for _ in range(b)]
        scores = queries @ self.unit.T                       # [b, n], one BLAS call for the whole batch
        for i, rows in enumerate(exclude):
            if rows:
                scores[i, rows] = -np.inf
        kk = min(max(ks), n)
        if kk < n:
            cand = np.argpartition(scores, n - kk, axis=1)[:, n - kk:]
        else:
            cand = np.broadcast_to(np.arange(n), (b, n))
        cand_scores = np.take_along_axis(scores, cand, axis=1)
        order = np.argsort(-cand_scores, axis=1, kind="stable")
        top = np.take_along_axis(cand, order, axis=1)
        top_scores = np.take_along_axis(cand_scores, order, axis=1)
        words = self.words
        out = []
        for i, k in enumerate(ks):
            row_scores = top_scores[i, :k].tolist()
            out.append([Neighbour(words[r], round(s, 6)) for r, s in zip(top[i, :k].tolist(), row_scores)
                        if s != -np.inf])
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
