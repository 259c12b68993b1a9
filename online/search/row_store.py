"""The rows behind the snapshots: one copy of the rows and codes, two of the small maps.

A snapshot must never change while anyone holds it (a query batch, an export that streams for a
minute). Copy-on-write gives that, but copies the whole model per sync: at 1M x 100 that is 400 MB
of float32 plus 100 MB of int8 codes every 0.5 s (150 - 400 ms of the front end's core). Keeping
two copies and writing the one no reader holds avoids the copy but doubles the memory: 10 GB of a
10M-word front end's 19. So (design: docs/design/0005-serving-index.md):

- **The float32 unit rows and the int8 codes live once, written out of place.** A sync writes
  each changed row into a free physical row of the pool (``UnitPool``) and its code into a free
  slot (of its list, with an inverted file; else the slot of its physical row, ``CodeStore``),
  and points the row at both. What the row left is *retired* with the sync's state: the old
  slot reads -2 (filed nowhere, not free) in the maps of the newer snapshots, and the old
  physical row and slot are reused only once no snapshot older than that state is alive. So a
  reader never sees a row or a code it uses change, and the rows and codes cost 1x their size
  plus what the last sync or two left (a pinned snapshot, an export, keeps what it reads, and
  the pool and the lists lend new room meanwhile). A tile's largest error only grows, so it
  stays a bound for every snapshot that reads the tile.
- **The small maps live in two ``Buffer``s** per lineage of snapshots (a ``Store``): per row its
  physical row, norm and code slot; per slot the row it holds (-1 empty, -2 left). The newest
  snapshot reads one buffer; the next sync writes the *other* one, which only older snapshots
  read:

  1. wait until nothing refers to the other buffer's arrays but the buffer itself. Every
     numpy view of an array holds a reference to it, so ``sys.getrefcount`` counts the
     snapshots on that buffer *and* any array anyone took from one of them (a slice kept
     after its snapshot died counts too). The query thread lets go of its snapshot after
     every batch, so this is a few ms. If a reference stays longer than ``PIN_WAIT`` (an
     export streaming one snapshot), give up on that buffer: it stays with whoever holds it
     and is freed with them, and a fresh copy takes its place (the one O(n) case besides
     growth and rebuilds).
  2. catch it up: it is one sync behind, so copy from the newest buffer the rows and slots
     the last sync wrote (``Change``), O(changed rows).
  3. write this sync's changes into it, publish the new snapshot on it.

So no array element anyone can still read is ever written. New lists (an inverted file) are filled in
the same code arrays, out of place too, a part per sync (``snapshot_writer.Relayout``). Counts are not in the buffers: they are small (8 bytes a row) and kept by reference as history
(``whats_new``), so each snapshot that changes them gets its own array. Rows beyond a snapshot's
``n`` and tiles beyond its ``tiles`` are spare capacity (``np.zeros``: untouched pages cost nothing).
"""
from __future__ import annotations

import sys
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np
from numba import njit

from online.search import shared_arrays
from online.search.int8_prefilter import TILE_ROWS

PIN_WAIT = 0.5          # seconds the sync waits for the other buffer's last reader before it copies instead
GROWTH = 1.5            # capacity factor when rows or tiles run out
COUNTS_KEPT = 4         # count arrays still read by someone that the store keeps an eye on
ARRAYS = ("row_phys", "norms", "row_slot", "slot_row")
CHUNK_BYTES = 4 << 20   # a numpy call that holds the GIL moves at most this much (the event loop waits meanwhile)


@njit(nogil=True, cache=True)
def scatter_rows(dst, dst_rows, src, src_rows):
    """``dst[dst_rows[i]] = src[src_rows[i]]`` for 2-d arrays, without the GIL (numpy's fancy
    indexing holds it: 10k rows of 100 floats stall the event loop for milliseconds)."""
    d = dst.shape[1]
    for i in range(len(dst_rows)):
        a, b = dst_rows[i], src_rows[i]
        for t in range(d):
            dst[a, t] = src[b, t]


@njit(nogil=True, cache=True)
def scatter(dst, dst_idx, src, src_idx):
    """``dst[dst_idx[i]] = src[src_idx[i]]`` for 1-d arrays, without the GIL."""
    for i in range(len(dst_idx)):
        dst[dst_idx[i]] = src[src_idx[i]]


def distinct(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` by a sort and a mask: numpy 2.4's ``unique`` (hash-based) takes about 2.5 ms for
    25k integers, ten times as long, twice in every sync."""
    s = np.sort(np.asarray(a).reshape(-1))
    if len(s) < 2:
        return s
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def copy_prefix(dst: np.ndarray, src: np.ndarray, n: int) -> None:
    """``dst[:n] = src[:n]`` in pieces of ``CHUNK_BYTES`` (numpy holds the GIL for a copy)."""
    step = max(1, CHUNK_BYTES // max(1, src[:1].nbytes))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        dst[lo:hi] = src[lo:hi]
        time.sleep(0)                   # let the event loop take the GIL between pieces


def filled(shape, value, dtype) -> np.ndarray:
    out = shared_arrays.empty(shape, dtype)
    copy_fill(out, value)
    return out


def copy_fill(out: np.ndarray, value) -> None:
    step = max(1, CHUNK_BYTES // max(1, out[:1].nbytes))
    for lo in range(0, len(out), step):
        out[lo:lo + step] = value
        time.sleep(0)


class CodeStore:
    """The int8 codes by slot (tiles of 64, the kernel's layout), once per lineage: per slot the
    code, scale, error and code sum, per tile the largest error. A sync writes codes only into
    slots that no live snapshot files (see the module docstring), so these arrays need no second
    copy. A tile's largest error only grows between layouts, which keeps it a bound for every
    snapshot that reads the tile."""

    def __init__(self, cap_tiles: int, dim: int):
        groups = -(-dim // 4) if dim else 1
        slots = cap_tiles * TILE_ROWS
        self.codes = shared_arrays.zeros((cap_tiles, groups, 4, 16, 4), np.int8)
        self.scale = shared_arrays.zeros(slots, np.float32)
        self.error = shared_arrays.zeros(slots, np.float32)
        self.csum = shared_arrays.zeros(slots, np.int32)
        self.tile_err = shared_arrays.zeros(cap_tiles, np.float32)

    @property
    def cap_tiles(self) -> int:
        return len(self.tile_err)

    @property
    def code_arrays(self):
        return self.codes, self.scale, self.error, self.csum

    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scale.nbytes + self.error.nbytes + self.csum.nbytes
                   + self.tile_err.nbytes)

    def grown(self, cap_tiles: int, n_tiles: int) -> "CodeStore":
        """A larger copy (its first ``n_tiles`` tiles); published snapshots keep reading this one."""
        out = CodeStore(cap_tiles, self.codes.shape[1] * 4)
        s = n_tiles * TILE_ROWS
        copy_prefix(out.codes, self.codes, n_tiles)
        for name in ("scale", "error", "csum"):
            copy_prefix(getattr(out, name), getattr(self, name), s)
        copy_prefix(out.tile_err, self.tile_err, n_tiles)
        return out


class Buffer:
    """One copy of the small per-row and per-slot maps (see the module docstring)."""

    def __init__(self, cap_rows: int, cap_tiles: int, dim: int):
        slots = cap_tiles * TILE_ROWS
        self.dim = dim
        self.row_phys = filled(cap_rows, -1, np.int64)   # each row's place in the pool's array
        self.pool_array: np.ndarray | None = None        # the pool's array as of this buffer's last write
        self.code_store: CodeStore | None = None         # the codes as of this buffer's last write
        self.norms = shared_arrays.zeros(cap_rows, np.float32)
        self.row_slot = filled(cap_rows, -1, np.int64)
        self.slot_row = filled(slots, -1, np.int64)      # -1 empty, -2 left by a row (not free yet)
        self.state = 0                  # which write of its store it holds (Store.seq; 0: none yet)
        self.used_tiles = 0             # tiles that may hold data (what a full copy has to clear beyond)

    @property
    def cap_rows(self) -> int:
        return len(self.norms)

    @property
    def cap_tiles(self) -> int:
        return len(self.slot_row) // TILE_ROWS

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in ARRAYS)

    def in_use(self) -> bool:
        """Whether anything but this buffer refers to one of its arrays (a snapshot's views, or a
        view someone kept): 2 = the attribute and getrefcount's own argument."""
        return any(sys.getrefcount(getattr(self, name)) > 2 for name in ARRAYS)

    def copy_used(self, src: "Buffer", n_rows: int, n_tiles: int) -> None:
        """This buffer := ``src`` on its first ``n_rows`` rows and ``n_tiles`` tiles (and spare tiles
        beyond are cleared, so a tile taken from the pool later starts empty)."""
        s = n_tiles * TILE_ROWS
        for name in ("row_phys", "norms", "row_slot"):
            copy_prefix(getattr(self, name), getattr(src, name), n_rows)
        self.pool_array, self.code_store = src.pool_array, src.code_store
        copy_prefix(self.slot_row, src.slot_row, s)
        self.clear_tiles(np.arange(n_tiles, min(self.cap_tiles, max(n_tiles, self.used_tiles)), dtype=np.int64))
        self.used_tiles = n_tiles
        self.state = src.state

    def copy_change(self, src: "Buffer", change: "Change") -> None:
        rows, slots, tiles = change.rows, change.slots, change.tiles
        if len(rows):
            scatter(self.row_phys, rows, src.row_phys, rows)
            scatter(self.norms, rows, src.norms, rows)
            scatter(self.row_slot, rows, src.row_slot, rows)
        if len(slots):
            scatter(self.slot_row, slots, src.slot_row, slots)
        self.used_tiles = max(self.used_tiles, change.n_tiles)
        self.state = change.to_state
        self.pool_array, self.code_store = src.pool_array, src.code_store

    def clear_tiles(self, tiles: np.ndarray) -> None:
        """Empty whole tiles of the slot map (their codes need no clearing: an empty slot is not read)."""
        for lo in range(0, len(tiles), 256):             # in pieces: numpy holds the GIL
            part = tiles[lo:lo + 256]
            self.slot_row[(part[:, None] * TILE_ROWS + np.arange(TILE_ROWS)).ravel()] = -1
            time.sleep(0)


class UnitPool:
    """The float32 unit rows of one lineage, written out of place (see the module docstring).

    ``array`` holds the rows; a snapshot reads it through its buffer's ``row_phys``. ``take``
    hands out free physical rows, ``retire`` files the rows a write left under that write's
    state, and ``reclaim(s)`` frees those retired by writes up to state ``s`` once every
    live snapshot reads a state >= ``s``. When no free row is left the array grows by
    ``GROWTH`` into a new array: snapshots already published keep reading the old one, which is
    never written again."""

    def __init__(self, cap: int, dim: int, used: int = 0, array: np.ndarray | None = None):
        # ``array``: rows 0..used-1 already written (a full load's buffer, adopted: no second copy)
        self.array = shared_arrays.zeros((cap, dim), np.float32) if array is None else array
        self.free = np.arange(cap - 1, used - 1, -1, dtype=np.int64)   # a stack: the lowest rows first
        self.n_free = cap - used
        self.high = used                             # rows below this have been written at some time
        # (state, physical rows, the code slots they held): what a write left, free once no snapshot reads it
        self.retired: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.freed_slots: list[np.ndarray] = []      # slots reclaimed, for the next write to mark empty
        self.retired_tiles: list[tuple[int, np.ndarray]] = []   # whole code tiles an install emptied, by state
        self.freed_tiles: list[np.ndarray] = []      # tiles reclaimed, for the next write to make spare
        self.counters = {"grown": 0, "retired_rows": 0}

    @property
    def cap(self) -> int:
        return len(self.array)

    def take(self, k: int) -> np.ndarray:
        self.reserve(k)
        self.n_free -= k
        out = self.free[self.n_free:self.n_free + k][::-1].copy()
        if len(out):
            self.high = max(self.high, int(out.max()) + 1)
        return out

    def reserve(self, k: int) -> None:
        """Make sure ``k`` rows can be taken without growing later (the caller sizes by ``cap``)."""
        if k > self.n_free:
            self._grow(k)

    def retire(self, state: int, phys: np.ndarray, slots: np.ndarray) -> None:
        if len(phys) or len(slots):
            self.retired.append((state, np.asarray(phys, np.int64), np.asarray(slots, np.int64)))
            self.counters["retired_rows"] += len(phys)

    def retire_tiles(self, state: int, tiles: np.ndarray) -> None:
        """Whole tiles a write emptied (an install moving their rows into lists): free for other lists
        once no snapshot reads state ``state`` or older."""
        if len(tiles):
            self.retired_tiles.append((state, np.asarray(tiles, np.int64)))

    def take_freed_tiles(self) -> np.ndarray:
        out = np.concatenate(self.freed_tiles) if self.freed_tiles else np.zeros(0, np.int64)
        self.freed_tiles = []
        return out

    def retired_rows(self) -> int:
        return sum(len(p) for _, p, _ in self.retired)

    def reclaim(self, oldest_live_state: int) -> None:
        keep = []
        for state, phys, slots in self.retired:
            if state <= oldest_live_state:
                self._give_back(phys)
                if len(slots):
                    self.freed_slots.append(slots)
            else:
                keep.append((state, phys, slots))
        self.retired = keep
        self.freed_tiles += [tiles for state, tiles in self.retired_tiles if state <= oldest_live_state]
        self.retired_tiles = [(state, tiles) for state, tiles in self.retired_tiles if state > oldest_live_state]

    def take_freed_slots(self) -> np.ndarray:
        out = np.concatenate(self.freed_slots) if self.freed_slots else np.zeros(0, np.int64)
        self.freed_slots = []
        return out

    def _give_back(self, phys: np.ndarray) -> None:
        if self.n_free + len(phys) > len(self.free):
            grown = np.empty(max(self.n_free + len(phys), len(self.free) * 2), np.int64)
            grown[:self.n_free] = self.free[:self.n_free]
            self.free = grown
        self.free[self.n_free:self.n_free + len(phys)] = phys
        self.n_free += len(phys)

    def _grow(self, k: int) -> None:
        cap = max(int(self.cap * GROWTH), self.cap + k, 1024)
        grown = shared_arrays.zeros((cap, self.array.shape[1]), np.float32)
        copy_prefix(grown, self.array, self.cap)
        self._give_back(np.arange(cap - 1, self.cap - 1, -1, dtype=np.int64))
        self.array = grown                      # published snapshots keep the old array
        self.counters["grown"] += 1

    def nbytes(self) -> int:
        return self.array.nbytes + self.free.nbytes


@dataclass
class Change:
    """What one write put into a buffer: replaying it from that buffer brings the other one, which
    holds ``from_state``, to ``to_state``."""

    from_state: int
    to_state: int
    rows: np.ndarray
    slots: np.ndarray
    tiles: np.ndarray
    n_rows: int
    n_tiles: int


class Store:
    """One lineage of snapshots: its two buffers, the append-only key and word arrays they
    share, the last ``Change``, and the inverted file's hand-over (``pending_ivf``, ``watch``, ``relayout``)."""

    def __init__(self, config, dim: int, keys_all: np.ndarray, words_all: WordArena, buffer: Buffer,
                 pool: UnitPool, codes: CodeStore):
        self.config = config
        self.dim = dim
        self.pool = pool
        self.codes = codes
        self.left: list[tuple[weakref.ref, int]] = []   # buffers given up while still read, and their state
        self.keys_all = keys_all              # append-only; a snapshot reads its first n entries
        self.words_all = words_all
        self.buffers: list[Buffer] = [buffer]
        self.head: weakref.ref | None = None  # the newest snapshot; only it may be applied to in place
        self.change: Change | None = None
        self.lock = threading.Lock()          # apply vs the IVF builder's hand-over
        self.pending_ivf = None               # a finished build waiting to be installed by the next sync
        self.relayout = None                  # its install under way (snapshot_writer.Relayout): a part per sync
        self.watch: np.ndarray | None = None  # rows changed since the running build read them
        self.building = False
        self.generation = 0                   # a build started in another generation is void
        self.seq = buffer.state               # writes so far (a buffer's state names the write it holds)
        self.counters = {"pinned_copies": 0, "full_copies": 0, "grown": 0, "catch_up_rows": 0,
                         "counts_recycled": 0}
        self._counts: list[np.ndarray] = []   # count arrays of past snapshots, reused once nothing reads them

    # ----------------------------------------------------------------- counts
    def counts_array(self, n: int) -> np.ndarray:
        """``n`` int64 entries for the next snapshot's counts: an array a dead snapshot left, when nothing
        references it any more (no snapshot, no view of it, no history sample), else a new one with room
        to grow. Why: a new 80 MB array per sync at 10M words cost 30 ms of page faults; reused memory is
        already paged in, so the copy into it is a plain memcpy. Arrays still read by someone are dropped
        from the list (their readers free them), so it stays a few arrays long."""
        keep = []
        found = None
        for i in range(len(self._counts)):
            referenced = sys.getrefcount(self._counts[i]) > 2     # this list's reference and the call's
            a = self._counts[i]
            if found is None and not referenced and len(a) >= n:
                found = a
            elif referenced and len(keep) < COUNTS_KEPT:
                keep.append(a)
        if found is None:
            found = np.empty(max(n, int(n * GROWTH), 1024), np.int64)
        else:
            self.counters["counts_recycled"] += 1
        self._counts = [found, *keep]
        return found[:n]

    # ----------------------------------------------------------------- buffers
    def writable(self, src: Buffer, n_rows: int, n_tiles: int, need_rows: int, need_tiles: int) -> Buffer:
        """A buffer other than ``src`` that no live snapshot reads, holding what ``src`` holds
        and with room for ``need_rows`` rows and ``need_tiles`` tiles."""
        if need_rows > src.cap_rows or need_tiles > src.cap_tiles:
            # only what ran out grows: the maps are filled with -1, so all of their capacity is resident
            # (an install needs more tiles, not more rows: 1.5x the rows cost 200 MB more at 10M words)
            cap_rows = src.cap_rows if need_rows <= src.cap_rows else max(need_rows, int(src.cap_rows * GROWTH), 1024)
            cap_tiles = src.cap_tiles if need_tiles <= src.cap_tiles else max(need_tiles, int(src.cap_tiles * GROWTH))
            cap_tiles = max(cap_tiles, -(-cap_rows // TILE_ROWS) + 16)
            target = Buffer(cap_rows, cap_tiles, self.dim)
            target.copy_used(src, n_rows, n_tiles)
            if cap_tiles > self.codes.cap_tiles:
                self.codes = self.codes.grown(cap_tiles, max(n_tiles, src.used_tiles))
            self._leave(self.buffers)         # the old pair stays with the snapshots that read it
            self.buffers = [target]
            self.counters["grown"] += 1
            self._reclaim()
            return target
        others = [b for b in self.buffers if b is not src]
        target = others[0] if others else None
        if target is not None and not _drained(target):
            self.counters["pinned_copies"] += 1
            self._leave([target])
            target = None
        if target is None:
            target = Buffer(src.cap_rows, src.cap_tiles, self.dim)
            target.copy_used(src, n_rows, n_tiles)
            self.buffers = [src, target]
            self.counters["full_copies"] += 1
            self._reclaim()
            return target
        change = self.change
        if (change is not None and change.to_state == src.state
                and change.from_state == target.state):
            target.copy_change(src, change)
            self.counters["catch_up_rows"] += len(change.rows)
        elif target.state != src.state:
            target.copy_used(src, n_rows, n_tiles)
            self.counters["full_copies"] += 1
        self._reclaim()
        return target

    def _leave(self, buffers: list[Buffer]) -> None:
        for b in buffers:
            if b.in_use():
                self.left.append((weakref.ref(b), b.state))

    def _reclaim(self) -> None:
        """Free the pool rows no live snapshot can read: the buffers in use are the newest one
        (``buffers[0]`` or the one just written) and those left to pinned snapshots."""
        self.left = [(ref, state) for ref, state in self.left if ref() is not None and ref().in_use()]
        states = [b.state for b in self.buffers if b.state > 0] + [state for _, state in self.left]
        self.pool.reclaim(min(states) if states else 0)

    def next_state(self) -> int:
        self.seq += 1
        return self.seq

    def nbytes(self) -> int:
        return sum(b.nbytes() for b in self.buffers) + self.keys_all.nbytes + self.pool.nbytes() + self.codes.nbytes()

    # ------------------------------------------------------------- key/words
    def append_rows(self, n: int, keys: np.ndarray, words: list[str]) -> tuple[np.ndarray, WordArena]:
        """Append rows n.. to the shared key and word arrays (the caller is the head, so nothing beyond
        n is in use); returns the arrays the new snapshot reads (a new key array if it had to grow)."""
        self.words_all.truncate(n)
        self.words_all.extend(words)
        m = n + len(keys)
        if m > len(self.keys_all):
            grown = np.zeros(max(m, int(len(self.keys_all) * GROWTH), 1024), np.uint64)
            grown[:n] = self.keys_all[:n]
            self.keys_all = grown
        self.keys_all[n:m] = keys
        return self.keys_all, self.words_all

    # ----------------------------------------------------------------- watch
    def mark_changed(self, rows: np.ndarray) -> None:
        """Rows written while a build runs: it re-assigns them when it is installed."""
        watch = self.watch
        if watch is None or not len(rows):
            return
        if rows.max() >= len(watch):
            grown = np.zeros(max(int(rows.max()) + 1, int(len(watch) * GROWTH)), bool)
            grown[:len(watch)] = watch
            self.watch = watch = grown
        watch[rows] = True


def _drained(buffer: Buffer) -> bool:
    """True once nothing refers to ``buffer``'s arrays, waiting at most ``PIN_WAIT`` for it."""
    deadline = time.monotonic() + PIN_WAIT
    while buffer.in_use():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True
