"""The front end's copy of the model: immutable snapshots, swapped in whole.

A ``ModelIndex`` is a ``snapshot.Snapshot`` that answers queries: it never changes once built.
``apply(delta)`` (``snapshot_writer``) builds the next snapshot in the sync thread and ``ModelHolder.swap`` publishes it with a single
reference assignment, so a query, which reads ``holder.current`` once and uses only that
object, sees version v or version v+1 and never half of a sync. The rows and codes live once
per lineage, written out of place, and the small maps in two buffers (``row_store``): a sync
writes only what no published snapshot reads, so it costs O(changed rows), not a copy of the
model, and the model is held once.

Search. ``top_k`` is exact: cosine similarity against the unit rows, an int8 copy scored
first (``int8_prefilter``; AVX-512 VNNI or AVX2 kernel) and only rows that can still make
the top k re-scored in float32 (same answers as the float32 product; without a kernel, the
float32 product and a compiled top-k heap answer). ``search`` is what queries use: on a
model with an inverted file (``ivf``, built in the background from ``ivf_min_rows`` rows)
it scores only the ``ivf_nprobe`` lists nearest to each query, which is approximate, and
says so per query ("ivf" or "exact"); ``LIVEVEC_SEARCH=exact`` keeps every query exact.
The lists follow a changing model by re-filing changed rows, where a graph index would be rebuilt.
Design: docs/design/0005-serving-index.md
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from online.search import int8_prefilter
from online.search import ivf as ivf_lists
from online.search import snapshot_writer
from online.search.delta import ModelDelta
from online.search.snapshot import SEARCH_MODES, SearchConfig, Snapshot

__all__ = ["SEARCH_MODES", "ModelHolder", "ModelIndex", "Neighbour", "SearchConfig", "answered_by", "warm_up"]


@dataclass(frozen=True)
class Neighbour:
    word: str
    score: float


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
    from online.search import ivf_build
    rows = np.eye(4, dtype=np.float32)
    ivf_lists.nearest_among(rows, np.arange(4), np.zeros(4, np.int64), np.zeros((1, 1), np.int64), rows[:1])
    ivf_lists.moved_far(rows, np.arange(4), rows, np.arange(4), 0.9)
    ivf_lists._probe(rows, 2, np.arange(5, dtype=np.int64), np.arange(4, dtype=np.int64))
    ivf_lists.merge_probes(np.zeros(1, np.int64), np.array([0, 1], np.int64), np.zeros(1, np.int64),
                           np.array([0, 1], np.int64))
    from online.search import row_store
    row_store.scatter_rows(rows.copy(), np.arange(4), rows, np.arange(4))
    for a in (np.zeros(4, np.float32), np.zeros(4, np.int64)):
        row_store.scatter(a, np.arange(4), a.copy(), np.arange(4))
    int8_prefilter._copy_per_slot(np.zeros(1, np.int64), np.zeros(1, np.int64), *([np.zeros(1, np.float32)] * 2),
                                  np.zeros(1, np.int32), *([np.zeros(1, np.float32)] * 2), np.zeros(1, np.int32))
    ivf_build._best_member(rows, np.zeros((4, 1), np.int64), np.array([0, 1], np.int64), np.zeros(1, np.int64),
                           rows[:1])
    ivf_lists._take_free(np.zeros(1, np.int64), np.array([0, 1], np.int64), np.zeros(1, np.int64),
                         np.zeros(1, np.int64), np.full(64, -1, np.int64), np.zeros(1, np.int64),
                         np.zeros(0, np.int64), np.zeros(2, np.int64), np.empty(1, np.int64))


class ModelIndex(Snapshot):
    """A snapshot that answers queries: exact top k, the inverted file's probe, the words of an answer.

    Build one with ``empty``/``from_arrays`` and ``apply``.
    """

    # ---------------------------------------------------------------- building
    @classmethod
    def from_arrays(cls, version: int, keys, words, vectors, counts=None,
                    config: SearchConfig | None = None) -> "ModelIndex":
        counts = np.zeros(len(words), np.int64) if counts is None else counts
        return cls.empty(config).apply(ModelDelta(np.asarray(keys, np.uint64), list(words),
                                                  np.asarray(vectors, np.float32), np.asarray(counts, np.int64),
                                                  version, full=True))

    def apply(self, delta: ModelDelta) -> "ModelIndex":
        """The snapshot after ``delta`` (this one is left untouched)."""
        return snapshot_writer.apply(self, delta)

    SEARCHED = ("_pool", "row_phys", "row_slot", "slot_row", "codes", "code_scale", "code_error", "code_sum",
                "tile_err")

    @classmethod
    def for_search(cls, n: int, dim: int, n_tiles: int, config: SearchConfig, arrays: dict,
                   ivf: ivf_lists.IvfLists | None, ivf_next: ivf_lists.IvfLists | None = None) -> "ModelIndex":
        """A snapshot that can only ``search_rows``: the arrays ``SEARCHED`` of one held elsewhere (a search
        process's view of the front end's snapshot, mapped from shared memory)."""
        self = cls.__new__(cls)
        self.version, self.store, self._buffer, self.config = -1, None, None, config
        self._n, self._dim, self.n_tiles, self.ivf, self.ivf_next = int(n), int(dim), int(n_tiles), ivf, ivf_next
        for name in cls.SEARCHED:
            setattr(self, name, arrays[name])
        return self

    def needs_apply(self) -> bool:
        """Whether a sync should call ``apply`` even without changes: new lists wait to be installed."""
        return self.store is not None and (self.store.pending_ivf is not None or self.store.relayout is not None)

    # ------------------------------------------------------------------ search
    def query_vector(self, positive_rows: list[int], negative_rows: list[int]) -> np.ndarray:
        """3CosAdd direction: sum of the unit vectors of positive minus negative, normalised."""
        q = self.unit_rows(positive_rows).sum(axis=0)
        if negative_rows:
            q = q - self.unit_rows(negative_rows).sum(axis=0)
        norm = float(np.linalg.norm(q))
        return (q / norm if norm > 0 else q).astype(np.float32)

    def scores_against(self, vectors: np.ndarray) -> np.ndarray:
        """``unit @ vectors`` for every row (``vectors``: [dim] or [dim, m]) without a copy of the
        rows: one product against the pool, then the rows' entries in row order."""
        return (self._pool @ vectors)[self.row_phys]

    def search_mode(self) -> str:
        """How ``search`` answers now: "ivf" or "exact"."""
        return "ivf" if self.ivf is not None and self.config.search != "exact" else "exact"

    def search(self, queries: np.ndarray, exclude: list[list[int]], ks: list[int], *,
               exact: bool | None = None, why: list | None = None, floor: float | None = None,
               nprobe: int | None = None) -> tuple[list[list[Neighbour]], list[str]]:
        """Top ``ks[i]`` for each query as queries are answered, and how each was answered:
        "ivf" (the ``ivf_nprobe`` nearest lists only; approximate) or "exact". An ivf answer is
        redone exactly when its probed lists hold fewer than k rows it may return ("short") or
        when its k-th score is below ``ivf_exact_below`` ("weak": where the lists miss neighbours).
        ``why``, if given, receives per query "ivf", "exact" (no lists, or asked), "short" or "weak";
        ``floor`` overrides ``ivf_exact_below`` (the recall monitor asks for 0: the lists' own answer) and
        ``nprobe`` the lists scanned (``SearchConfig.nprobe``)."""
        top, top_scores, reasons = self.search_rows(queries, exclude, ks, exact=exact, floor=floor, nprobe=nprobe)
        if why is not None:
            why[:] = reasons
        return self.neighbours(top, top_scores, ks), answered_by(reasons)

    def search_rows(self, queries: np.ndarray, exclude: list[list[int]], ks: list[int], *,
                    exact: bool | None = None, floor: float | None = None,
                    nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """``search`` in rows: [b, k] rows (-1: none) and scores, best first, and each query's reason. It
        reads only the arrays a search process maps (``search_processes``), never the words."""
        b = len(ks)
        if exact or self.search_mode() == "exact" or b == 0 or self.n == 0:
            top, top_scores = self._top_rows(queries, exclude, ks)
            return top, top_scores, ["exact"] * b
        kk = min(max(ks), self.n)
        ptr, flat = _exclusions(exclude)
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        tile_ids, tile_ptr = ivf_lists.probe(self.ivf, queries, nprobe or self.config.nprobe)
        if self.ivf_next is not None:          # an install under way: its lists hold the rows moved so far
            tile_ids, tile_ptr = ivf_lists.merge_probes(
                tile_ids, tile_ptr, *ivf_lists.probe(self.ivf_next, queries, nprobe or self.config.nprobe))
        top, top_scores, _ = int8_prefilter.probed_top_k(self._pool, self.row_phys, self._code_arrays,
                                                         self.slot_row, queries, tile_ids, tile_ptr, ptr, flat, kk)
        valid = (top >= 0) & (top_scores != -np.inf)
        reasons = ["ivf"] * b
        floor = self.config.ivf_exact_below if floor is None else floor
        for i, k in enumerate(ks):
            got = np.flatnonzero(valid[i, :k])
            if len(got) < min(k, self.n - len(set(exclude[i]))):
                reasons[i] = "short"
            elif floor > 0 and len(got) and round(float(top_scores[i, got[-1]]), 6) < floor:
                reasons[i] = "weak"
        redo = [i for i, r in enumerate(reasons) if r != "ivf"]
        if redo:
            rt, rs = self._top_rows(queries[redo], [exclude[i] for i in redo], [ks[i] for i in redo])
            w = rt.shape[1]
            top[redo, :w], top_scores[redo, :w] = rt, rs
            top[redo, w:], top_scores[redo, w:] = -1, -np.inf
        return top, top_scores, reasons

    def top_k(self, queries: np.ndarray, exclude: list[list[int]], ks: list[int], *,
              prefilter: bool | None = None) -> list[list[Neighbour]]:
        """Exact top ``ks[i]`` rows by cosine for each row of ``queries`` (float32 [b, dim], unit length).

        ``prefilter`` (default: at least ``int8_prefilter.MIN_ROWS_FOR_CODES`` rows and at
        most ``MAX_BATCH_FOR_CODES`` queries) scores
        the int8 copy first and re-scores in float32 only the rows that can still make the
        top k; the answer is the same as without it.
        """
        top, top_scores = self._top_rows(queries, exclude, ks, prefilter=prefilter)
        return self.neighbours(top, top_scores, ks)

    def _top_rows(self, queries: np.ndarray, exclude: list[list[int]], ks: list[int], *,
                  prefilter: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
        b, n = len(ks), self.n
        if n == 0 or b == 0:
            return np.full((b, 0), -1, np.int64), np.full((b, 0), -np.inf, np.float32)
        kk = min(max(ks), n)
        ptr, flat = _exclusions(exclude)
        if prefilter is None:
            prefilter = (n >= int8_prefilter.MIN_ROWS_FOR_CODES
                         and b <= int8_prefilter.MAX_BATCH_FOR_CODES[int8_prefilter.SCAN])
        if prefilter and self.dim:
            return int8_prefilter.prefiltered_top_k(
                self._pool, self.row_phys, self._code_arrays, self.tile_err, queries, ptr, flat, kk, self.slot_row,
                self.row_slot,
                self.n_tiles * int8_prefilter.TILE_ROWS)
        # [b, n] in one BLAS call against the pool (small models, no int8 kernel), not a gathered copy of the rows
        scores = np.ascontiguousarray(self.scores_against(queries.T).T)
        top = np.empty((b, kk), dtype=np.int64)
        top_scores = np.empty((b, kk), dtype=np.float32)
        _select_top_k(scores, ptr, flat, kk, top, top_scores)
        return top, top_scores

    def neighbours(self, top: np.ndarray, top_scores: np.ndarray, ks: list[int]) -> list[list[Neighbour]]:
        """The words of ``search_rows``' answer (rows -1 or scored -inf are no answer)."""
        words = self.words._words            # rows in top are < n: the shared arena is safe to index
        out = []
        for i, k in enumerate(ks):
            row_scores = top_scores[i, :k].tolist()
            out.append([Neighbour(words[r], round(s, 6)) for r, s in zip(top[i, :k].tolist(), row_scores)
                        if r >= 0 and s != -np.inf])
        return out

    @property
    def _code_arrays(self):
        return self.codes, self.code_scale, self.code_error, self.code_sum

    def most_similar(self, positive: list[str], negative: list[str] = (), k: int = 10) -> list[Neighbour]:
        """Convenience for tests and scripts: one exact query, unknown words raise KeyError."""
        pos = [self.row(w) for w in positive]
        neg = [self.row(w) for w in negative]
        missing = [w for w, r in zip(list(positive) + list(negative), pos + neg) if r < 0]
        if missing:
            raise KeyError(missing)
        q = self.query_vector(pos, neg)[None, :]
        return self.top_k(q, [pos + neg], [k])[0]

    def memory(self) -> dict[str, int]:
        """Bytes this snapshot's lineage holds, by structure (``/v1/stats`` ``search.memory``). Capacities,
        not pages touched: spare rows and tiles of ``np.zeros`` arrays cost no memory until written.
        ``words`` is the arena's UTF-8 and offsets; the alphabetical index's recent level holds pointers."""
        out = {"rows_float32": int(self._pool.nbytes), "norms": 0, "codes_int8": 0,
               "per_slot": 0, "per_row_maps": 0, "keys": int(self.keys.nbytes), "counts": int(self.counts.nbytes),
               "key_index": sum(int(a.nbytes) for a in (self.key_index.base_keys, self.key_index.base_rows,
                                                         self.key_index.recent_keys, self.key_index.recent_rows)),
               "alpha_index": 8 * len(self.alpha.recent_words)
               + int(self.alpha.base_rows.nbytes + self.alpha.recent_rows.nbytes),
               "ivf_lists": 0, "words": 0}
        if self.store is not None:
            cs = self.store.codes
            out["codes_int8"] = int(cs.codes.nbytes)
            out["per_slot"] = int(cs.scale.nbytes + cs.error.nbytes + cs.csum.nbytes + cs.tile_err.nbytes)
            for b in self.store.buffers:
                out["per_slot"] += int(b.slot_row.nbytes)
                out["per_row_maps"] += int(b.row_phys.nbytes + b.row_slot.nbytes)
                out["norms"] += int(b.norms.nbytes)
        if self.ivf is not None:
            out["ivf_lists"] = sum(int(getattr(self.ivf, f).nbytes) for f in
                                   ("centroids", "neighbours", "list_ptr", "list_tiles", "tile_list", "free"))
        n = self.n
        if n:
            out["words"] = self.words._words.nbytes()
        out["total"] = sum(out.values())
        return out

    def describe_search(self) -> dict:
        """The search's state for ``/v1/stats``."""
        out = {"mode": self.config.search, "answering": self.search_mode(), "scan": int8_prefilter.SCAN,
               "ivf_min_rows": self.config.ivf_min_rows, "nprobe": self.config.ivf_nprobe,
               "nprobe_auto": self.config.ivf_nprobe_auto, "nprobe_served": self.config.nprobe,
               "exact_below": round(self.config.ivf_exact_below, 4),
               "exact_below_auto": self.config.ivf_exact_below_auto, "ivf": None}
        if self.ivf is not None:
            ivf = self.ivf.describe()
            ivf["age_seconds"] = round(time.time() - self.ivf.built_at, 1)
            ivf["rows_placed_fraction"] = round(self.ivf.drift / max(self.ivf.built_rows, 1), 4)
            ivf["rows_probed_per_query"] = int(min(self.n, math.ceil(self.n * min(1.0, self.config.nprobe
                                                                                    / self.ivf.lists))))
            out["ivf"] = ivf
        if self.store is not None:
            out["buffers"] = {"count": len(self.store.buffers), "bytes": self.store.nbytes(),
                              **self.store.counters}
            pool = self.store.pool
            out["pool"] = {"rows": pool.cap, "free": pool.n_free, "retired": pool.retired_rows(), **pool.counters}
        out["memory"] = self.memory()
        return out


def answered_by(reasons: list[str]) -> list[str]:
    """How each answer of ``search_rows`` was made: "ivf", or "exact" (asked, no lists, or redone: short, weak)."""
    return ["ivf" if r == "ivf" else "exact" for r in reasons]


def _exclusions(exclude: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(exclude) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(rows) for rows in exclude])
    flat = np.fromiter((r for rows in exclude for r in rows), dtype=np.int64, count=int(ptr[-1]))
    return ptr, flat


class ModelHolder:
    """The current snapshot; ``swap`` is one reference assignment, which is atomic for readers."""

    def __init__(self, config: SearchConfig | None = None):
        self.current: ModelIndex = ModelIndex.empty(config)
        self.loaded = False
        self.swapped_at: float | None = None

    def swap(self, index: ModelIndex) -> None:
        self.current = index
        self.swapped_at = time.time()
        self.loaded = True
