"""``ModelIndex.apply``: the next snapshot from a delta, in the sync thread.

The writer reads a ``snapshot.Snapshot`` and builds the next one of the same type (``type(index)``).

Three ways, by cost:

incremental (the sync's usual case: the newest snapshot, rows changed and added, nothing removed)
    O(changed rows). The rows go into the store's other buffer (``row_store``: caught up with
    the last sync's rows first), changed rows are re-quantised into their slots, and with an
    inverted file new rows are filed in their nearest list and changed rows re-filed among
    their list's neighbours (``ivf``). Keys and words are appended to the shared arrays, the
    key and prefix indexes get a small recent level (``word_lookup``). Counts are copied
    (8 bytes a row: each snapshot has its own, see ``row_store``). New lists (``Store.pending_ivf``)
    are installed a part per sync (``Relayout``): O(``RELAYOUT_ROWS``) more, in the same code arrays.
full build (``delta.full``, or the first rows of an empty model)
    A new store; the vectors are normalised straight into its buffer.
rebuild (a delta with removals, or applied to a snapshot that is no longer the newest)
    O(n): a new store holding the old rows minus the removed ones plus the delta, rows
    renumbered; an inverted file keeps its centroids and is laid out again. Removals are
    rare (vocabulary pruning); applying twice to one snapshot happens in tests and scripts.
"""
from __future__ import annotations

import math
import operator
import time
import weakref

import numpy as np

from online.search import int8_prefilter, shared_arrays
from online.search import ivf as ivf_lists
from online.search.int8_prefilter import TILE_ROWS
from online.search.row_store import (Buffer, Change, CodeStore, Store, UnitPool, copy_prefix, distinct, scatter,
                                     scatter_rows)
from online.search.delta import ModelDelta, ModelDeltaError
from online.search.snapshot import Snapshot
from online.search.word_lookup import AlphaIndex, KeyIndex, WordArena, WordsView

HEADROOM = 1.25        # rows of capacity per row at a full build
PIECE = 8192           # rows per numpy call in the sync's path (numpy holds the GIL; the event loop waits)


def normalise_into(vectors: np.ndarray, unit: np.ndarray, norms: np.ndarray) -> None:
    """Unit rows of ``vectors`` into ``unit`` and their norms into ``norms`` (a zero vector stays zero)."""
    for lo in range(0, len(vectors), PIECE):
        v = vectors[lo:lo + PIECE]
        nrm = np.sqrt(np.einsum("ij,ij->i", v, v, dtype=np.float64)).astype(np.float32)
        norms[lo:lo + len(v)] = nrm
        np.divide(v, np.where(nrm == 0, np.float32(1.0), nrm)[:, None], out=unit[lo:lo + len(v)])
        time.sleep(0)


_LOAD_BUFFERS: "weakref.WeakValueDictionary[int, np.ndarray]" = weakref.WeakValueDictionary()


def full_load_buffer(n: int, dim: int) -> np.ndarray:
    """Where a source assembles a full load's ``n`` float32 rows: a view of the first ``n`` rows of a buffer
    with the capacity a full build gives its pool. ``build`` normalises such rows in place and makes the
    buffer the pool, so a full load holds the model once, not twice (10M x 100: 4 GB less at the peak).
    The delta's vectors are then the index's: the source must not read them again."""
    cap = _capacity(n)[0]
    buffer = shared_arrays.zeros((cap, dim), np.float32)   # calloc: spare rows cost no memory until written
    _LOAD_BUFFERS[id(buffer)] = buffer
    return buffer[:n]


def _adoptable(vectors: np.ndarray, cap_rows: int) -> np.ndarray | None:
    """The buffer under ``vectors`` if a source made it with ``full_load_buffer`` and it can be the pool (its
    rows are the pool's capacity: ``UnitPool`` hands out exactly ``cap_rows``)."""
    base = vectors.base
    if base is None or _LOAD_BUFFERS.get(id(base)) is not base or not base.flags.writeable:
        return None
    if base.shape[0] != cap_rows or base.shape[1:] != vectors.shape[1:] or \
            base.__array_interface__["data"][0] != vectors.__array_interface__["data"][0]:
        return None
    del _LOAD_BUFFERS[id(base)]                     # adopted once
    return base


def normalise(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    unit = np.empty(vectors.shape, np.float32)
    norms = np.empty(len(vectors), np.float32)
    normalise_into(vectors, unit, norms)
    return unit, norms


def check_delta(delta: ModelDelta, screen: bool = True) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray,
                                                                np.ndarray, int]:
    """The delta's arrays, checked: shapes, duplicate keys (the last wins) and, with ``screen``, rows with a
    non-finite entry zeroed (a full build screens them as it normalises: one pass less over a full load)."""
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
    bad = np.zeros(n, bool)
    for lo in range(0, n if screen else 0, PIECE):   # in pieces: a bool copy of a 10M x 100 delta is 1 GB
        bad[lo:lo + PIECE] = ~np.isfinite(vectors[lo:lo + PIECE]).all(axis=1)
    if bad.any():                       # a NaN row would win every top-k; serve it as a zero vector
        vectors = vectors.copy()
        vectors[bad] = 0.0
    # duplicate keys (the last occurrence wins), found by sorting (row_store.distinct): np.unique
    # (hash-based in numpy 2) took 10.6 s of a 10M-word full load's 28 s, a sort takes about 1
    if n > 1 and len(distinct(keys)) != n:
        _, last = np.unique(keys[::-1], return_index=True)
        keep = np.sort(n - 1 - last)
        keys, vectors, counts = keys[keep], vectors[keep], counts[keep]
        words = [words[i] for i in keep.tolist()]
    return keys, words, np.ascontiguousarray(vectors), counts, removed, int(bad.sum())


def apply(index: Snapshot, delta: ModelDelta) -> Snapshot:
    keys, words, vectors, counts, removed, bad = check_delta(delta, screen=not delta.full)
    if delta.full or (index.n == 0 and len(keys)):
        return build(type(index), index.config, delta.version, keys, words, counts, vectors=vectors, bad_rows=bad)
    if index.n == 0:
        return _same(index, delta.version)
    if len(keys) and vectors.shape[1] != index.dim:
        raise ModelDeltaError(f"delta has dimension {vectors.shape[1]}, the model has {index.dim}")
    rows = index.rows_of_keys(keys)
    drop = index.rows_of_keys(removed) if len(removed) else np.zeros(0, np.int64)
    if len(drop):
        drop = drop[(drop >= 0) & ~np.isin(removed, keys)]       # removed and changed again: keep
    store = index.store
    head = store.head() if store.head is not None else None
    if head is not index or len(drop):
        return _rebuild(index, keys, words, vectors, counts, rows, drop, bad, delta.version)
    pending = store.pending_ivf
    if pending is not None and pending.generation != store.generation:
        with store.lock:
            store.pending_ivf, store.watch, store.building = None, None, False
        pending = None
    if not len(keys) and pending is None and store.relayout is None:
        return _same(index, delta.version)
    return _incremental(index, keys, words, vectors, counts, rows, bad, delta.version, pending)


def _publish(store: Store, snapshot: Snapshot) -> Snapshot:
    store.head = weakref.ref(snapshot)
    return snapshot


def _same(index: Snapshot, version: int) -> Snapshot:
    """The same rows under another version number (nothing changed)."""
    snapshot = type(index)(version, index.store, index._buffer, index.n, index.n_tiles, index.keys, index.words._words,
                          index.counts, index.key_index, index.alpha, index.ivf, index.bad_rows, config=index.config,
                          ivf_next=index.ivf_next)
    return _publish(index.store, snapshot) if index.store is not None else snapshot


def _capacity(n: int) -> tuple[int, int]:
    rows = max(1024, int(n * HEADROOM))
    return rows, -(-rows // TILE_ROWS) + int(math.ceil(math.sqrt(rows))) + 64


def build(snapshot_type: type, config, version: int, keys: np.ndarray, words: list[str], counts: np.ndarray, *,
          vectors: np.ndarray | None = None, unit: np.ndarray | None = None, norms: np.ndarray | None = None,
          bad_rows: int = 0, ivf: ivf_lists.IvfLists | None = None, assign: np.ndarray | None = None) -> Snapshot:
    """A new store holding these rows (raw ``vectors``, or ``unit`` and ``norms`` already normalised);
    with ``ivf`` and ``assign`` (each row's list) laid out list by list, else slot = row."""
    n = len(keys)
    dim = int(vectors.shape[1] if vectors is not None else unit.shape[1])
    cap_rows, cap_tiles = _capacity(n)
    if ivf is not None:
        slot_of_row, list_ptr, list_tiles, tile_list, free = ivf_lists.plan_layout(assign, ivf.lists)
        ivf = ivf_lists.IvfLists(ivf.centroids, ivf.neighbours, list_ptr, list_tiles, tile_list, free,
                                 len(list_tiles), ivf.built_version, ivf.built_rows, ivf.built_at,
                                 ivf.build_seconds, ivf.drift)
        cap_tiles = max(cap_tiles, ivf.n_tiles + (cap_rows - n) // TILE_ROWS + ivf.lists + 64)
        n_tiles = ivf.n_tiles
    else:
        slot_of_row = np.arange(n, dtype=np.int64)
        n_tiles = -(-n // TILE_ROWS)
    buffer = Buffer(cap_rows, cap_tiles, dim)
    adopted = _adoptable(vectors, cap_rows) if vectors is not None else None
    pool = UnitPool(cap_rows, dim, used=n, array=adopted)   # row r at physical row r to begin with
    codes = CodeStore(cap_tiles, dim)
    all_rows = np.arange(n, dtype=np.int64)
    if vectors is not None:             # in place when adopted; rows not finite are served as zero vectors
        bad_rows += int8_prefilter.normalise_quantise(vectors, pool.array[:n], buffer.norms[:n], codes.code_arrays,
                                                      slot_of_row)
    else:
        copy_prefix(pool.array, unit, n)
        buffer.norms[:n] = norms
        int8_prefilter.quantise(pool.array, all_rows, codes.code_arrays, slot_of_row)
    copy_prefix(buffer.row_phys, all_rows, n)
    buffer.pool_array, buffer.code_store = pool.array, codes
    copy_prefix(buffer.row_slot, slot_of_row, n)
    scatter(buffer.slot_row, slot_of_row, all_rows, all_rows)
    codes.tile_err[:n_tiles] = int8_prefilter.tile_error(codes.error[:n_tiles * TILE_ROWS])
    buffer.used_tiles = n_tiles
    keys_all = np.zeros(cap_rows, np.uint64)
    keys_all[:n] = keys
    store = Store(config, dim, keys_all, WordArena(words), buffer, pool, codes)
    buffer.state = store.next_state()
    alpha = AlphaIndex.build(words, WordsView(store.words_all, n))
    snapshot = snapshot_type(version, store, buffer, n, n_tiles, keys_all, store.words_all,
                          np.array(counts, dtype=np.int64), KeyIndex.build(keys), alpha, ivf,
                          bad_rows, config=config)
    return _publish(store, snapshot)


def _rebuild(index: Snapshot, keys, words, vectors, counts, rows, drop, bad, version) -> Snapshot:
    """The O(n) path: the old rows minus ``drop``, then the delta, renumbered into a new store."""
    keep = np.ones(index.n, dtype=bool)
    keep[drop] = False
    remap = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep)
    is_new = rows < 0
    n_kept, n_new = len(kept), int(is_new.sum())
    new_rows = np.where(is_new, 0, remap[np.maximum(rows, 0)])
    new_rows[is_new] = np.arange(n_kept, n_kept + n_new)
    unit = np.empty((n_kept + n_new, index.dim), np.float32)
    norms = np.empty(n_kept + n_new, np.float32)
    unit[:n_kept], norms[:n_kept] = index.unit_rows(kept), index.norms[kept]
    changed_unit, changed_norms = normalise(vectors)
    unit[new_rows], norms[new_rows] = changed_unit, changed_norms
    all_counts = np.concatenate([index.counts[kept], np.zeros(n_new, np.int64)])
    all_counts[new_rows] = counts
    all_keys = np.concatenate([index.keys[kept], keys[is_new]])
    old_words = index.words.tolist()
    all_words = [old_words[r] for r in kept.tolist()] + [w for w, f in zip(words, is_new.tolist()) if f]
    for r, w in zip(new_rows.tolist(), words):
        all_words[r] = w                                     # a key's word string may change (fix-up)
    assign = None
    relayout = index.store.relayout if index.store is not None else None
    lists = relayout.ivf if relayout is not None else index.ivf       # an install under way is finished here
    if lists is not None:
        assign = np.empty(n_kept + n_new, np.int64)
        assign[:n_kept] = relayout.lists_of(index, kept) if relayout is not None else \
            lists.list_of_slots(index.row_slot[kept])
        assign[new_rows] = ivf_lists.nearest(changed_unit, lists.centroids)
    return build(type(index), index.config, version, all_keys, all_words, all_counts, unit=unit, norms=norms,
                 bad_rows=index.bad_rows + bad, ivf=lists, assign=assign)


RELAYOUT_ROWS = 131_072   # rows an install moves into the new lists per sync (at 10M words: 80 syncs)
RELAYOUT_BACKLOG = 3      # parts whose emptied tiles may wait for reclaiming before the install pauses


class Relayout:
    """New lists being installed, a part per sync: every sync moves the rows of the next
    ``RELAYOUT_ROWS / 64`` tiles of the old layout (the list-free one, or the old lists) into the new
    lists, and files the rows it writes there too. A moved row keeps its unit row; its code is copied
    to a slot of its list, out of place like any write, so snapshots still reading the old slot keep
    it, and an emptied tile becomes the new lists' spare once no snapshot reads it. So the install
    never holds two layouts of the codes (at 10M words that was 1.3 GB on top of the model, and
    15 - 20 s of one sync while the model fell behind), and no sync does more than a part of it.

    Until the last part, answers come as before: exact on a model that had no lists; with old lists,
    from the old lists' remaining tiles and the new ones (``Snapshot.ivf_next``), both probed."""

    def __init__(self, index: Snapshot, pending):
        self.pending, self.old = pending, index.ivf
        if index.ivf is None:
            self.old_tiles = np.arange(index.n_tiles, dtype=np.int64)
            n_tiles, spare = index.n_tiles, np.zeros(0, np.int64)
        else:
            self.old_tiles = np.sort(index.ivf.list_tiles)
            n_tiles, spare = index.ivf.n_tiles, index.ivf.spare
        lists = len(pending.centroids)
        self.ivf = ivf_lists.IvfLists(pending.centroids, pending.neighbours, np.zeros(lists + 1, np.int64),
                                      np.zeros(0, np.int64), np.full(n_tiles, -1, np.int64), np.zeros(lists, np.int64),
                                      n_tiles, pending.version, len(pending.assign), build_seconds=pending.seconds,
                                      spare=spare)
        self.cursor = 0                  # old tiles before this one have been emptied
        self.moved = 0
        self.paused = 0                  # syncs that moved nothing (``sweep``)
        self.started = time.monotonic()

    @property
    def done(self) -> bool:
        return self.cursor >= len(self.old_tiles)

    def lists_of(self, index: Snapshot, rows: np.ndarray, refine: bool = False) -> np.ndarray:
        """The new list of each of ``rows`` (of ``index``): where it is filed already, else where the build
        put it, else (a row added since the build read the rows) its nearest list. ``refine``: a row changed
        since the build read it goes to the best of its build list's neighbours (as a sync re-files a changed
        row; the writer does that itself for the rows it writes)."""
        out = np.full(len(rows), -1, np.int64)
        tiles = index.row_slot[rows] // TILE_ROWS
        inside = tiles < len(self.ivf.tile_list)
        out[inside] = self.ivf.tile_list[tiles[inside]]
        assign, watch = self.pending.assign, index.store.watch
        known = np.flatnonzero((out < 0) & (rows < len(assign)))
        out[known] = assign[rows[known]]
        if refine and watch is not None and len(known):
            changed = known[watch[np.minimum(rows[known], len(watch) - 1)] & (rows[known] < len(watch))]
            if len(changed):
                unit = index.unit_rows(rows[changed])
                out[changed] = ivf_lists.nearest_among(unit, np.arange(len(changed), dtype=np.int64), out[changed],
                                                       self.ivf.neighbours, self.ivf.centroids)
        redo = np.flatnonzero(out < 0)
        if len(redo):
            out[redo] = self.pending.assigner(index.unit_rows(rows[redo]))
        return out

    def sweep(self, index: Snapshot, writing: np.ndarray) -> "_Sweep":
        """The next part: the rows of the next old tiles, but for those this sync writes anyway. None (a pause)
        while ``RELAYOUT_BACKLOG`` parts' tiles wait to be reclaimed: a snapshot held for long (a drift
        checkpoint copying 10M rows, an export) keeps them, and the lists would take new tiles meanwhile,
        up to growing the code arrays (the copy the install avoids)."""
        part = RELAYOUT_ROWS // TILE_ROWS
        if sum(len(t) for _, t in index.store.pool.retired_tiles) >= RELAYOUT_BACKLOG * part:
            self.paused += 1
            return None
        hi = min(len(self.old_tiles), self.cursor + part)
        tiles = self.old_tiles[self.cursor:hi]
        slots = (tiles[:, None] * TILE_ROWS + np.arange(TILE_ROWS, dtype=np.int64)).ravel()
        rows = index.slot_row[slots] if len(slots) else np.zeros(0, np.int64)
        keep = rows >= 0
        if len(writing):
            keep[keep] = ~np.isin(rows[keep], writing)
        rows, slots = rows[keep], slots[keep]
        return _Sweep(tiles, rows, slots, self.lists_of(index, rows, refine=True), hi)

    def old_remaining(self, cursor: int) -> ivf_lists.IvfLists | None:
        """The old lists without the tiles emptied so far (None on a model that had none)."""
        if self.old is None:
            return None
        below = int(self.old_tiles[cursor]) if cursor < len(self.old_tiles) else self.old.n_tiles
        return ivf_lists.without_tiles(self.old, below)

    def describe(self) -> dict:
        return {"tiles_emptied": self.cursor, "tiles": len(self.old_tiles), "rows_moved": self.moved,
                "paused_syncs": self.paused, "seconds": round(time.monotonic() - self.started, 1)}


class _Sweep:
    """One part of an install: the old ``tiles`` it empties, the ``rows`` it moves (from ``slots``) and their
    lists (``targets``); ``end``: the install's cursor after it."""

    def __init__(self, tiles, rows, slots, targets, end):
        self.tiles, self.rows, self.slots, self.targets, self.end = tiles, rows, slots, targets, end


class _Filing:
    """Where the delta's rows go in the inverted file: each row's list (``targets``), and the tiles the
    lists may need."""

    def __init__(self, index: Snapshot, ivf: ivf_lists.IvfLists, relayout: Relayout | None, unit_rows: np.ndarray,
                 rows: np.ndarray, old: np.ndarray, fresh: np.ndarray, sweep: _Sweep | None):
        src = index._buffer
        if relayout is not None:
            current = relayout.lists_of(index, rows[old])
        else:
            current = ivf.list_of_slots(src.row_slot[rows[old]])
        targets = np.empty(len(rows), np.int64)
        targets[old] = ivf_lists.nearest_among(unit_rows, old, current, ivf.neighbours, ivf.centroids)
        # a row that jumped (not a small training step) may belong far from its list's neighbours
        far = old[ivf_lists.moved_far(unit_rows, old, src.pool_array, src.row_phys[rows[old]], ivf_lists.FAR_COSINE)]
        targets[far] = ivf_lists.nearest(unit_rows[far], ivf.centroids)
        targets[fresh] = ivf_lists.nearest(unit_rows[fresh], ivf.centroids)
        self.targets = targets
        self.placed_since_build = int((targets[old] != current).sum()) + len(fresh)   # moves and new rows
        # every changed row takes a free slot: its old one stays readable by older snapshots
        # (the tiles the lists' free slots cannot take, beyond the spare ones)
        per_list = np.bincount(targets if sweep is None else np.concatenate([targets, sweep.targets]),
                               minlength=ivf.lists)
        new_tiles = int((-(-np.maximum(per_list - ivf.free, 0) // TILE_ROWS)).sum())
        self.need_tiles = ivf.n_tiles + max(0, new_tiles - len(ivf.spare))


def _incremental(index: Snapshot, keys, words, vectors, counts, rows, bad, version, pending) -> Snapshot:
    """The O(changed rows) path (the module's docstring): the rows written out of place into the other
    buffer (with an install under way, a part of the rows moved into the new lists too), the words and
    counts appended, the snapshot published."""
    store, src, n_old = index.store, index._buffer, index.n
    rows, old, fresh = _numbered(rows, n_old)
    n = n_old + len(fresh)
    unit_rows, norm_rows = normalise(vectors)
    relayout = store.relayout
    if relayout is None and pending is not None:
        relayout = Relayout(index, pending)
    sweep = relayout.sweep(index, rows[old]) if relayout is not None else None
    ivf = relayout.ivf if relayout is not None else index.ivf
    if ivf is not None:
        filing = _Filing(index, ivf, relayout, unit_rows, rows, old, fresh, sweep)
        need_tiles = filing.need_tiles
    else:
        filing = None
        store.pool.reserve(len(rows))      # slot = physical row: all of them within the tiles sized here
        need_tiles = -(-store.pool.cap // TILE_ROWS)
    target = store.writable(src, n_old, index.n_tiles, n, need_tiles)
    target.state = -1                      # half-written until the end: a failure leaves it to a full copy
    state = store.next_state()
    ivf, n_tiles, change = _write_rows(store, src, target, state, ivf, filing, rows, old, unit_rows, norm_rows, n,
                                       sweep)
    new_counts = store.counts_array(n)
    copy_prefix(new_counts, index.counts, n_old)
    scatter(new_counts, rows, counts, np.arange(len(rows), dtype=np.int64))
    keys_all, words_all, key_index, alpha = _append_words(index, keys, words, rows, old, fresh, n)
    target.state = change.to_state
    target.used_tiles = max(target.used_tiles, n_tiles)
    ivf_next = None
    if relayout is not None:
        relayout.ivf = ivf
        if sweep is not None:         # its tiles are free once no snapshot reads this state (not before it is whole)
            store.pool.retire_tiles(change.to_state, sweep.tiles)
            relayout.cursor, relayout.moved = sweep.end, relayout.moved + len(sweep.rows)
        if not relayout.done:          # answered as before the install (see ``Relayout``)
            rest = relayout.old_remaining(relayout.cursor)
            ivf, ivf_next = (rest, ivf) if rest is not None else (None, None)
    with store.lock:
        store.change = change
        if relayout is not None and relayout.done:
            store.relayout, store.pending_ivf, store.watch, store.building = None, None, None, False
        elif relayout is not None:
            store.relayout, store.pending_ivf = relayout, None
        else:
            store.mark_changed(rows)
    snapshot = type(index)(version, store, target, n, n_tiles, keys_all, words_all, new_counts, key_index, alpha, ivf,
                           index.bad_rows + bad, config=index.config, ivf_next=ivf_next)
    return _publish(store, snapshot)


def _numbered(rows: np.ndarray, n_old: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each delta row's row in the next snapshot (a new word takes the next free number), with the
    positions of the rows that exist (``old``) and of the new words (``fresh``)."""
    is_new = rows < 0
    fresh = np.flatnonzero(is_new)
    rows = rows.copy()
    rows[fresh] = np.arange(n_old, n_old + len(fresh))
    return rows, np.flatnonzero(~is_new), fresh


def _write_rows(store: Store, src: Buffer, target: Buffer, state: int, ivf: ivf_lists.IvfLists | None,
                filing: _Filing | None, rows: np.ndarray, old: np.ndarray, unit_rows: np.ndarray,
                norm_rows: np.ndarray, n: int, sweep: _Sweep | None) -> tuple[ivf_lists.IvfLists | None, int, Change]:
    """The rows' unit vectors, norms and codes, out of place: new physical rows and code slots. The ones
    left stay readable by older snapshots (slot -2 here: filed nowhere, not free) until no snapshot reads
    them; then they are free again. A ``sweep`` (an install's part) moves its rows' codes into slots of
    their new lists the same way (the caller retires the tiles it empties). Returns the lists after the filing,
    the tiles in use and the change the other buffer catches up with."""
    order = np.arange(len(rows), dtype=np.int64)
    pool, codes = store.pool, store.codes
    left = target.row_phys[rows[old]]
    left_slots = target.row_slot[rows[old]]
    freed = pool.take_freed_slots()
    freed_tiles = pool.take_freed_tiles()
    target.slot_row[freed] = -1
    freed_tile_slots = (freed_tiles[:, None] * TILE_ROWS + np.arange(TILE_ROWS, dtype=np.int64)).ravel()
    target.slot_row[freed_tile_slots] = -1
    target.slot_row[left_slots] = -2
    phys = pool.take(len(rows))
    scatter_rows(pool.array, phys, unit_rows, order)
    scatter(target.row_phys, rows, phys, order)
    target.pool_array, target.code_store = pool.array, codes
    scatter(target.norms, rows, norm_rows, order)
    new_tiles = np.zeros(0, np.int64)
    moved, moved_slots = np.zeros(0, np.int64), np.zeros(0, np.int64)
    if ivf is None:
        slots = phys                       # without lists a row's code sits in its physical row's slot
        target.slot_row[slots] = rows      # (with lists, ``place`` marks the slots it hands out)
        n_tiles = -(-pool.high // TILE_ROWS)
    else:
        targets, filed = filing.targets, rows
        if sweep is not None:
            target.slot_row[sweep.slots] = -2
            targets, filed = np.concatenate([targets, sweep.targets]), np.concatenate([rows, sweep.rows])
        ivf, slots, new_tiles = ivf_lists.place(ivf, targets, filed, target.slot_row, freed, target.cap_tiles,
                                                filing.placed_since_build, freed_tiles)
        codes.tile_err[new_tiles] = 0      # a tile taken anew holds no row any snapshot files
        n_tiles = ivf.n_tiles
        if sweep is not None:
            slots, moved_slots, moved = slots[:len(rows)], slots[len(rows):], sweep.rows
            int8_prefilter._copy_slots(sweep.slots, moved_slots, *codes.code_arrays, *codes.code_arrays)
            scatter(target.row_slot, moved, moved_slots, np.arange(len(moved), dtype=np.int64))
            np.maximum.at(codes.tile_err, moved_slots // TILE_ROWS, codes.error[moved_slots])
    target.row_slot[rows] = slots
    int8_prefilter.quantise(pool.array, phys, codes.code_arrays, slots)
    np.maximum.at(codes.tile_err, slots // TILE_ROWS, codes.error[slots])
    pool.retire(state, left, left_slots)
    touched = np.concatenate([slots, left_slots, freed, freed_tile_slots, moved_slots,
                              sweep.slots if sweep is not None else moved_slots[:0]])
    change = Change(src.state, state, np.concatenate([rows, moved]), touched,
                    distinct(np.concatenate([touched // TILE_ROWS, new_tiles])), n, n_tiles)
    return ivf, n_tiles, change


def _append_words(index: Snapshot, keys, words, rows: np.ndarray, old: np.ndarray, fresh: np.ndarray,
                  n: int) -> tuple[np.ndarray, WordArena, KeyIndex, AlphaIndex]:
    """The new words' keys and spellings appended to the shared arrays, and the key and prefix lookups
    with them; a row whose word changed spelling gets a new arena (older snapshots keep theirs)."""
    store = index.store
    renamed = _renamed(index.words._words, words, rows, old)
    fresh_words = [words[i] for i in fresh.tolist()]
    keys_all, words_all = store.append_rows(index.n, keys[fresh], fresh_words)
    key_index = index.key_index.with_rows(keys[fresh], rows[fresh])
    if renamed:                            # a key's word string changed (hash collision, fix-up): rare
        listed = words_all.tolist(n)
        for r, w in renamed:
            listed[r] = w
        words_all = store.words_all = WordArena(listed)     # a new arena: older snapshots keep theirs
        alpha = AlphaIndex.build(listed, WordsView(words_all, n))
    else:
        alpha = index.alpha.with_rows(fresh_words, rows[fresh], WordsView(words_all, n))
    return keys_all, words_all, key_index, alpha


def _renamed(words_all: WordArena, words, rows: np.ndarray, old: np.ndarray) -> list[tuple[int, str]]:
    """(row, word) of the existing rows whose word the delta spells differently."""
    renamed = []
    for lo in range(0, len(old), PIECE):   # compared as bytes in numpy, in pieces that let the loop in
        part = old[lo:lo + PIECE]
        got = operator.itemgetter(*part.tolist())(words) if len(part) > 1 else (words[int(part[0])],)
        renamed += [(int(rows[part[i]]), got[i]) for i in words_all.unequal(rows[part], got).tolist()]
        time.sleep(0)
    return renamed
