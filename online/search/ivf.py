"""The inverted file: the first stage of the approximate search on large vocabularies.

Exact search costs every row per query: at 1M x 100 the AVX2 int8 kernel needs about 3 ms
per query, a core cannot serve 500 queries/s that way. The inverted file splits the rows
into ``L`` lists (about sqrt(n)) around spherical k-means centroids (``ivf_build``); a query
scores the L centroids (from their int8 codes, with the rows' kernel), takes the ``nprobe`` best
lists and runs the same int8 scan and error-bounded re-rank as the exact search
(``int8_prefilter.probed_top_k``) on their rows only, so its answer is the exact top k *of the
probed rows*. What can be missed is a true neighbour filed in a list the query did not probe;
``/v1/stats`` reports the measured recall@10 (``ivf_build.RecallMonitor``) and every answer says
how it was made.

Layout. Each list owns whole tiles of the code array (the kernel's 64-slot tiles), so a
probed list is a contiguous scan; ``list_ptr``/``list_tiles`` (CSR) name a list's tiles and
``tile_list`` the list of a tile. Slots of a list that hold no row (a row moved away, the
end of the last tile) have ``slot_row`` -1 and are never candidates.

Keeping up with a live model, per sync and O(changed rows):

* a new row goes to its nearest list at once (one product with the L centroids);
* a changed row is re-assigned among the ``NEIGHBOURS`` lists nearest to its current one
  (a row that moved a little ends up in one of them), and moves if it has a better one; a
  row that jumped (cosine to its previous vector below ``FAR_COSINE``) is compared with
  all L centroids, as a new row;
* a row goes into a free slot of its list, else into a new tile taken from the spare
  tiles at the end of the array. The centroids themselves stay as built: ``drift`` counts
  rows placed since the build and the builder rebuilds when it passes a fraction of n.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
from numba import njit

from online.search import int8_prefilter
from online.search.int8_prefilter import TILE_ROWS, approx_scores, quantise

NEIGHBOURS = 16           # lists a changed row may move to: its own and the nearest others
FAR_COSINE = 0.9          # below this cosine to its previous vector a changed row is filed from scratch
ASSIGN_CHUNK = 16384      # rows per product with the centroids


@dataclass(frozen=True)
class IvfLists:
    """One version of the lists (immutable; a sync that places rows makes the next one)."""

    centroids: np.ndarray          # [L, dim] float32, unit rows
    neighbours: np.ndarray         # [L, M] int64: each list's nearest lists, itself first
    list_ptr: np.ndarray           # [L + 1] int64 into list_tiles
    list_tiles: np.ndarray         # int64 tile ids, grouped by list
    tile_list: np.ndarray          # [tiles] int64: the list of each tile in use
    free: np.ndarray               # [L] int64: empty slots in each list's tiles
    n_tiles: int                   # tiles in use
    built_version: int             # the model version the centroids were trained on
    built_rows: int                # rows at that time
    built_at: float = field(default_factory=time.time)
    build_seconds: float = 0.0
    drift: int = 0                 # rows placed (new or moved) since the build
    # the centroids' int8 codes (int8_prefilter's layout): the probe scans these with the rows' kernel,
    # a quarter of the float32 centroids' bytes. At 10M words with 12,649 lists the float32 product
    # streamed 5 MB per query batch: 0.36 ms a query, against 0.08 from the codes (in process, batches
    # of 2), and recall@10 the same (0.9910 / 0.9915 at nprobe 32). The codes' error (about 0.01)
    # only reorders lists whose scores are that close, at the edge of the nprobe best
    centroid_codes: tuple | None = None
    # whole tiles below ``n_tiles`` filed in no list (``tile_list`` -1): tiles an install emptied, taken
    # before the tiles beyond ``n_tiles``
    spare: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self):
        if self.centroid_codes is None and len(self.centroids):
            object.__setattr__(self, "centroid_codes", quantise(np.ascontiguousarray(self.centroids, np.float32)))

    @property
    def lists(self) -> int:
        return len(self.centroids)

    def list_of_slots(self, slots: np.ndarray) -> np.ndarray:
        return self.tile_list[np.asarray(slots) // TILE_ROWS]

    def describe(self) -> dict:
        sizes = np.diff(self.list_ptr)
        return {"lists": self.lists, "tiles": self.n_tiles, "built_version": self.built_version,
                "built_rows": self.built_rows, "built_at": round(self.built_at, 3),
                "build_seconds": round(self.build_seconds, 2), "rows_placed_since_build": self.drift,
                "spare_tiles": len(self.spare),
                "largest_list_tiles": int(sizes.max(initial=0))}


def neighbour_lists(centroids: np.ndarray, m: int = NEIGHBOURS) -> np.ndarray:
    """Each centroid's ``m`` nearest centroids (itself first)."""
    m = min(m, len(centroids))
    out = np.empty((len(centroids), m), np.int64)
    for lo in range(0, len(centroids), ASSIGN_CHUNK):
        s = centroids[lo:lo + ASSIGN_CHUNK] @ centroids.T
        s[np.arange(len(s)), np.arange(lo, lo + len(s))] = np.inf
        part = np.argpartition(-s, m - 1, axis=1)[:, :m]
        order = np.argsort(-np.take_along_axis(s, part, axis=1), axis=1, kind="stable")
        out[lo:lo + len(s)] = np.take_along_axis(part, order, axis=1)
    return out


def nearest(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The nearest centroid (largest dot product) of each row."""
    out = np.empty(len(vectors), np.int64)
    for lo in range(0, len(vectors), ASSIGN_CHUNK):
        out[lo:lo + ASSIGN_CHUNK] = np.argmax(vectors[lo:lo + ASSIGN_CHUNK] @ centroids.T, axis=1)
    return out


@njit(nogil=True, cache=True, fastmath=True)
def nearest_among(vectors, which, current, neighbours, centroids):
    """For row ``vectors[which[i]]``, the best of the neighbour lists of its current list ``current[i]``."""
    out = np.empty(len(which), np.int64)
    d = vectors.shape[1]
    for i in range(len(which)):
        r = which[i]
        best, best_s = current[i], -np.inf
        for j in range(neighbours.shape[1]):
            c = neighbours[current[i], j]
            s = np.float32(0.0)
            for t in range(d):
                s += vectors[r, t] * centroids[c, t]
            if s > best_s:
                best, best_s = c, s
        out[i] = best
    return out


@njit(nogil=True, cache=True, fastmath=True)
def moved_far(new, which, old, old_rows, cosine):
    """Whether unit row ``new[which[i]]`` has cosine below ``cosine`` with ``old[old_rows[i]]``."""
    out = np.empty(len(which), np.bool_)
    d = new.shape[1]
    for i in range(len(which)):
        s = np.float32(0.0)
        for t in range(d):
            s += new[which[i], t] * old[old_rows[i], t]
        out[i] = s < cosine
    return out


def plan_layout(assign: np.ndarray, lists: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Slots for rows ``0..len(assign)-1`` filed by list: (slot of each row, list_ptr, list_tiles,
    tile_list, free slots per list). List l's rows fill its tiles in row order."""
    sizes = np.bincount(assign, minlength=lists).astype(np.int64)
    tiles_per = -(-sizes // TILE_ROWS)
    list_ptr = np.zeros(lists + 1, np.int64)
    np.cumsum(tiles_per, out=list_ptr[1:])
    n_tiles = int(list_ptr[-1])
    order = np.argsort(assign, kind="stable")                       # rows grouped by list, in row order
    starts = np.zeros(lists + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    rank = np.empty(len(assign), np.int64)                           # position of each row within its list
    rank[order] = np.arange(len(assign)) - np.repeat(starts[:-1], sizes)
    slot_of_row = list_ptr[assign] * TILE_ROWS + rank
    tile_list = np.repeat(np.arange(lists, dtype=np.int64), tiles_per)
    return slot_of_row, list_ptr, np.arange(n_tiles, dtype=np.int64), tile_list, tiles_per * TILE_ROWS - sizes


@njit(nogil=True, cache=True)
def _take_free(targets, list_ptr, list_tiles, free, slot_row, rows, freed, freed_ptr, out):
    """A free slot of list ``targets[i]`` for row ``rows[i]`` (marked taken), or -1 if it has none.
    The slots reclaimed for this write (``freed``, grouped by list: ``freed_ptr``) are taken first:
    in steady state a sync takes about as many slots per list as an earlier one left, so the scan
    of a list's tiles (last first: that is where the gaps are) is the exception."""
    nxt = freed_ptr[:-1].copy()
    for i in range(len(targets)):
        lst = targets[i]
        out[i] = -1
        if free[lst] <= 0:
            continue
        while nxt[lst] < freed_ptr[lst + 1]:
            s = freed[nxt[lst]]
            nxt[lst] += 1
            if slot_row[s] == -1:
                slot_row[s] = rows[i]
                free[lst] -= 1
                out[i] = s
                break
        if out[i] >= 0:
            continue
        for j in range(list_ptr[lst + 1] - 1, list_ptr[lst] - 1, -1):
            base = list_tiles[j] * 64
            found = -1
            for t in range(64):
                if slot_row[base + t] == -1:           # -2: left by a row, not free until reclaimed
                    found = base + t
                    break
            if found >= 0:
                slot_row[found] = rows[i]
                free[lst] -= 1
                out[i] = found
                break


def place(ivf: IvfLists, targets: np.ndarray, rows: np.ndarray, slot_row: np.ndarray, freed_slots: np.ndarray,
          cap_tiles: int, drift: int | None = None,
          freed_tiles: np.ndarray | None = None) -> tuple[IvfLists, np.ndarray, np.ndarray]:
    """Slots in lists ``targets`` for ``rows`` (every row a sync writes), marked in ``slot_row``
    (the buffer being written); ``freed_slots`` are free again (reclaimed), one more in each one's list
    (slots of tiles filed in no list are not counted); ``freed_tiles``: whole tiles free again (their
    slots already -1), spare from now on; ``drift``: how many of the rows are new or changed list
    (default all). A list that needs tiles takes spare ones first, then those beyond ``n_tiles``.
    Returns the next lists, the slots, and the tiles taken."""
    drift = len(rows) if drift is None else drift
    freed_slots = np.asarray(freed_slots, np.int64)
    if len(freed_slots):
        freed_slots = freed_slots[ivf.tile_list[freed_slots // TILE_ROWS] >= 0]
    spare = ivf.spare if freed_tiles is None or not len(freed_tiles) else \
        np.concatenate([ivf.spare, np.asarray(freed_tiles, np.int64)])
    freed_lists = ivf.list_of_slots(freed_slots)
    free = ivf.free.copy()
    np.add.at(free, freed_lists, 1)
    slots = np.empty(len(rows), np.int64)
    by_list = np.argsort(freed_lists, kind="stable")
    freed_ptr = np.zeros(ivf.lists + 1, np.int64)
    np.cumsum(np.bincount(freed_lists, minlength=ivf.lists), out=freed_ptr[1:])
    _take_free(targets, ivf.list_ptr, ivf.list_tiles, free, slot_row, rows,
               np.ascontiguousarray(freed_slots[by_list], dtype=np.int64), freed_ptr, slots)
    full = np.flatnonzero(slots < 0)
    if not len(full):
        return replace(ivf, free=free, drift=ivf.drift + drift, spare=spare), slots, np.zeros(0, np.int64)
    by_list = np.argsort(targets[full], kind="stable")
    full = full[by_list]
    ordered = targets[full]                       # runs of one list each (np.unique hashes: 0.14 s for 400k rows)
    first = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    lists, counts = ordered[first], np.diff(np.append(first, len(ordered)))
    need = -(-counts // TILE_ROWS)
    total = int(need.sum())
    reused = min(total, len(spare))
    n_tiles = ivf.n_tiles + total - reused
    if n_tiles > cap_tiles:
        raise OverflowError(f"the inverted file needs {n_tiles} tiles, the buffer has {cap_tiles}")
    new_tiles = np.concatenate([spare[len(spare) - reused:], np.arange(ivf.n_tiles, n_tiles, dtype=np.int64)])
    spare = spare[:len(spare) - reused]
    tile_start = np.concatenate([[0], np.cumsum(need)[:-1]])          # first new tile of each list
    at = np.empty(len(full), np.int64)                                # each row's rank among its list's new rows
    at[:] = np.arange(len(full)) - np.repeat(first, counts)
    slots[full] = new_tiles[np.repeat(tile_start, counts) + at // TILE_ROWS] * TILE_ROWS + at % TILE_ROWS
    np.add.at(free, lists, need * TILE_ROWS - counts)
    slot_row[slots[full]] = rows[full]
    # the CSR gains the new tiles at the end of each list
    tiles_per = np.diff(ivf.list_ptr)
    add = np.zeros(ivf.lists, np.int64)
    add[lists] = need
    list_ptr = np.zeros(ivf.lists + 1, np.int64)
    np.cumsum(tiles_per + add, out=list_ptr[1:])
    list_tiles = np.empty(int(list_ptr[-1]), np.int64)
    keep_pos = np.repeat(list_ptr[:-1], tiles_per) + (np.arange(len(ivf.list_tiles))
                                                      - np.repeat(ivf.list_ptr[:-1], tiles_per))
    list_tiles[keep_pos] = ivf.list_tiles
    new_pos = np.repeat(list_ptr[:-1] + tiles_per, add) + (np.arange(total) - np.repeat(np.cumsum(add) - add, add))
    list_tiles[new_pos] = new_tiles
    tile_list = np.full(n_tiles, -1, np.int64)
    tile_list[:ivf.n_tiles] = ivf.tile_list[:ivf.n_tiles]
    tile_list[new_tiles] = np.repeat(lists, need)
    return (replace(ivf, list_ptr=list_ptr, list_tiles=list_tiles, tile_list=tile_list, free=free,
                    n_tiles=n_tiles, drift=ivf.drift + drift, spare=spare), slots, new_tiles)


def without_tiles(ivf: IvfLists, below: int) -> IvfLists:
    """``ivf`` with every tile below ``below`` taken out of its lists (tiles an install has emptied)."""
    keep = ivf.list_tiles >= below
    owner = np.repeat(np.arange(ivf.lists, dtype=np.int64), np.diff(ivf.list_ptr))
    list_ptr = np.zeros(ivf.lists + 1, np.int64)
    np.cumsum(np.bincount(owner[keep], minlength=ivf.lists), out=list_ptr[1:])
    return replace(ivf, list_ptr=list_ptr, list_tiles=ivf.list_tiles[keep])


@njit(nogil=True, cache=True)
def merge_probes(tiles_a, ptr_a, tiles_b, ptr_b):
    """Per query, the tiles of one probe then those of another (an install's two sets of lists)."""
    b = len(ptr_a) - 1
    ptr = ptr_a + ptr_b
    out = np.empty(ptr[b], np.int64)
    for i in range(b):
        at = ptr[i]
        for j in range(ptr_a[i], ptr_a[i + 1]):
            out[at] = tiles_a[j]
            at += 1
        for j in range(ptr_b[i], ptr_b[i + 1]):
            out[at] = tiles_b[j]
            at += 1
    return out, ptr


def probe(ivf: IvfLists, queries: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
    """The tiles of each query's ``nprobe`` best lists, best list first, as (tile ids, per-query offsets)."""
    if ivf.centroid_codes is not None and int8_prefilter.SCAN != "numpy":
        packed, scale, _, csum = ivf.centroid_codes
        scores = np.ascontiguousarray(approx_scores(packed, scale, csum, queries, ivf.lists, int8_prefilter.SCAN)[0])
    else:
        scores = np.ascontiguousarray(queries @ ivf.centroids.T, dtype=np.float32)
    return _probe(scores, min(nprobe, ivf.lists), ivf.list_ptr, ivf.list_tiles)


@njit(nogil=True, cache=True)
def _probe(scores, nprobe, list_ptr, list_tiles):
    b, lists = scores.shape
    best = np.empty((b, nprobe), np.int64)
    heap = np.empty(nprobe, np.float32)              # min-heap of the best scores so far
    idx = np.empty(nprobe, np.int64)
    tile_ptr = np.zeros(b + 1, np.int64)
    for i in range(b):
        size = 0
        for l in range(lists):
            v = scores[i, l]
            if size < nprobe:
                pos = size
                size += 1
                while pos > 0 and heap[(pos - 1) // 2] > v:
                    heap[pos], idx[pos] = heap[(pos - 1) // 2], idx[(pos - 1) // 2]
                    pos = (pos - 1) // 2
                heap[pos], idx[pos] = v, l
            elif v > heap[0]:
                pos = 0
                while True:
                    child = 2 * pos + 1
                    if child >= nprobe:
                        break
                    if child + 1 < nprobe and heap[child + 1] < heap[child]:
                        child += 1
                    if v <= heap[child]:
                        break
                    heap[pos], idx[pos] = heap[child], idx[child]
                    pos = child
                heap[pos], idx[pos] = v, l
        order = np.argsort(-heap[:size])          # best list first: the k-th bound rises early, fewer candidates
        total = 0
        for j in range(size):
            best[i, j] = idx[order[j]]
            total += list_ptr[best[i, j] + 1] - list_ptr[best[i, j]]
        tile_ptr[i + 1] = tile_ptr[i] + total
    out = np.empty(tile_ptr[b], np.int64)
    for i in range(b):
        at = tile_ptr[i]
        for j in range(min(nprobe, lists)):
            l = best[i, j]
            for t in range(list_ptr[l], list_ptr[l + 1]):
                out[at] = list_tiles[t]
                at += 1
    return out, tile_ptr
