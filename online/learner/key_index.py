"""uint64 key -> row index map for arrays of keys, with no per-key Python loop.

A parameter server answers pulls of thousands of keys per message; a Python dict would
cost a Python-level lookup per key. This is an open-addressing hash table (linear
probing, power-of-two size, load <= 1/2) whose lookups and inserts run in numba over
whole key arrays. Keys are mixed with a Fibonacci multiplier before probing, so
sequential keys (ps-lite's C++ tests use 0, 1, 2, ...) spread as well as word hashes.
Deletion leaves a tombstone; the table is rebuilt when tombstones and live keys together
pass the load limit.
"""
from __future__ import annotations

import numpy as np
from numba import njit

EMPTY = -1
TOMBSTONE = -2
_FIB = np.uint64(0x9E3779B97F4A7C15)


@njit(inline="always")
def _home(key, shift):
    return np.int64((key * _FIB) >> shift)


@njit(nogil=True, cache=True)
def _lookup(tkeys, tvals, shift, keys, out):
    mask = tkeys.shape[0] - 1
    for i in range(keys.shape[0]):
        k = keys[i]
        pos = _home(k, shift)
        out[i] = EMPTY
        while True:
            v = tvals[pos]
            if v == EMPTY:
                break
            if v != TOMBSTONE and tkeys[pos] == k:
                out[i] = v
                break
            pos = (pos + 1) & mask


@njit(nogil=True, cache=True)
def _insert(tkeys, tvals, shift, keys, rows):
    """Insert distinct keys known to be absent; returns how many tombstones were reused."""
    mask = tkeys.shape[0] - 1
    reused = 0
    for i in range(keys.shape[0]):
        k = keys[i]
        pos = _home(k, shift)
        while tvals[pos] >= 0:
            pos = (pos + 1) & mask
        if tvals[pos] == TOMBSTONE:
            reused += 1
        tkeys[pos] = k
        tvals[pos] = rows[i]
    return reused


@njit(nogil=True, cache=True)
def _delete(tkeys, tvals, shift, keys, out_rows):
    mask = tkeys.shape[0] - 1
    n = 0
    for i in range(keys.shape[0]):
        k = keys[i]
        pos = _home(k, shift)
        out_rows[i] = EMPTY
        while True:
            v = tvals[pos]
            if v == EMPTY:
                break
            if v != TOMBSTONE and tkeys[pos] == k:
                out_rows[i] = v
                tvals[pos] = TOMBSTONE
                n += 1
                break
            pos = (pos + 1) & mask
    return n


class KeyIndex:
    """Map of distinct uint64 keys to int64 rows. Not thread-safe: the shard locks it."""

    def __init__(self, capacity: int = 1024):
        self._alloc(max(16, 1 << int(np.ceil(np.log2(max(2 * capacity, 16))))))
        self.size = 0

    def _alloc(self, slots: int) -> None:
        self.tkeys = np.zeros(slots, dtype=np.uint64)
        self.tvals = np.full(slots, EMPTY, dtype=np.int64)
        self.shift = np.uint64(64 - int(np.log2(slots)))
        self.tombstones = 0

    def __len__(self) -> int:
        return self.size

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, -1 where absent."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        out = np.empty(len(keys), dtype=np.int64)
        _lookup(self.tkeys, self.tvals, self.shift, keys, out)
        return out

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Add distinct keys that are not in the map yet."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if 2 * (self.size + self.tombstones + len(keys)) > len(self.tkeys):
            self._rehash(self.size + len(keys))
        self.tombstones -= _insert(self.tkeys, self.tvals, self.shift, keys, rows)
        self.size += len(keys)

    def delete(self, keys: np.ndarray) -> np.ndarray:
        """Remove keys; returns the row each had (-1 if absent)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        out = np.empty(len(keys), dtype=np.int64)
        n = _delete(self.tkeys, self.tvals, self.shift, keys, out)
        self.size -= n
        self.tombstones += n
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        live = self.tvals >= 0
        return self.tkeys[live].copy(), self.tvals[live].copy()

    def _rehash(self, needed: int) -> None:
        keys, rows = self.items()
        slots = len(self.tkeys)
        while 2 * needed > slots:
            slots *= 2
        self._alloc(slots)
        _insert(self.tkeys, self.tvals, self.shift, keys, rows)
