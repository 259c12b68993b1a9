"""The adaptive noise distribution for negative sampling: unigram^0.75 over a stream.

word2vec.c fills a table of 10^8 word ids once, each word taking a share proportional
to ``count^0.75``; a negative sample is a uniform draw from it. On a stream the counts
change forever, so livevec keeps the weight ``count^0.75`` of every trainable word (count
>= min_count) as the counts grow, and lays the table out again from those weights whenever
they have moved by more than ``refresh`` (0.5 %) of their total ``z`` since the last layout
(every batch early in a stream, every few batches later: 442 layouts over wiki17m's 17M tokens).

A layout is systematic: the words are placed one after the other in slot order, word ``s``
ending at entry ``round(M * (w_0 + ... + w_s) / z)`` of the ``M`` entries, so each word holds its
exact share of the table to within one entry, deterministically. Between layouts the table lags
the counts by less than ``refresh`` of the mass (a word that just became trainable waits for
the next layout, a batch or a few later). Each layout is a new array, so a kernel still
sampling from the previous one is never disturbed, and ``layouts`` counts them: the table's content
changes exactly when ``layouts`` does (the in-place trainer keeps the table mapped to output rows
and maps it again only then, or when a word in it gets or loses its row).

Why a systematic layout and not yskip's reservoir update, and why 524,287 entries: see
``DEFAULT_TABLE_SIZE``.

livevec applies it per mini-batch: a word counted ``c`` times in the batch adds
``new^0.75 - old^0.75`` at once. After an eviction the vocabulary's counts have all moved
(Misra-Gries), so the weights are set again from them (``rebuild``).

In a cluster each worker keeps its own table from its own counts, which estimate the cluster's
counts divided by the number of workers: the same distribution. But a word becomes trainable
when the *cluster* counts it ``min_count`` times, and at 64 workers a word counted 300 times is seen
about 5 times by each. A table that admitted a word only at a *local* min_count would leave out
most of the vocabulary's middle on most workers: those words would never be negatives there, and
their output rows would only ever be pulled towards their contexts. So a word the cluster trains
joins the table at its first local count (``early``), weighted by that count like any other
(docs/design/0001-replica-exchange.md). One process is unchanged, since there a word is trainable
exactly when its own count reaches min_count.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# Why not yskip's reservoir update (Kaji & Kobayashi 2017: overwrite ``round(F / z * M)`` random
# entries when a word's weight grows by F): its shares are right only in expectation, so the table
# must be large for them to be close, and a large table costs a cache miss per negative in the
# kernels, which read it at a random entry five times per pair.
# At the end of wiki17m (68k trainable words) the reservoir's 2^24 entries (64 MiB) misplace
# 1.1 % of the probability mass (2^20 entries: 5.7 %); the default 524,287 entries laid out
# systematically (2 MiB, in the cache) misplace 2.0 %, almost all of it on the rarest words (the
# 1,000 most frequent are within 0.24 % of their share, against 0.7 % in the reservoir), and the
# in-place kernel runs about 1.5x as many pairs per second with two threads as against the 64 MiB
# table (``bench/kernel_speed.py``). The length is a prime so that the
# kernels' index ``(state >> 16) % M`` (``sgns_kernel._draw``) depends on all the high bits of their
# generator's state (a power of two would take bits 16..35 of word2vec.c's LCG alone, whose low bits
# have short periods, on a table in slot order); no difference in quality is measurable, and it costs
# nothing.
DEFAULT_TABLE_SIZE = 524_287    # 2 MiB of int32 (stays in the cache), a prime; word2vec.c: 10^8
DEFAULT_REFRESH = 0.005


@njit(nogil=True, cache=True)
def _layout(weights, slots, table):
    """Systematic layout of ``weights[slots]`` (the positive ones, in slot order) over ``table``; returns their
    sum. Given the slots, not all of them: a stream's vocabulary table holds several times as many words as are
    trainable, and a scan of every slot would be two thirds of a layout (3.6 ms for 1M slots, 68k trainable)."""
    z = 0.0
    for i in range(slots.shape[0]):
        z += weights[slots[i]]
    m = table.shape[0]
    if z <= 0:
        return z
    acc = 0.0
    pos = 0
    last = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        acc += weights[s]
        end = min(m, np.int64(acc / z * m + 0.5))
        while pos < end:
            table[pos] = s
            pos += 1
        last = s
    while pos < m:          # rounding can leave the last entry
        table[pos] = last
        pos += 1
    return z


@njit(nogil=True, cache=True)
def _grow(weights, slots, new_counts, min_count, early, power, joined):
    """Set the weights of the slots whose counts reached ``min_count`` (or 1 where ``early``); returns
    the weight added, and marks in ``joined`` the slots that were not in the table yet."""
    added = 0.0
    for k in range(slots.shape[0]):
        joined[k] = False
        c = new_counts[k]
        if c < min_count and not (early[k] and c > 0):
            continue
        w = float(c) ** power
        before = weights[slots[k]]
        joined[k] = before <= 0
        added += w - before                  # 0 for a word not in the table yet
        weights[slots[k]] = w
    return added


class NoiseTable:
    """Table of vocabulary slots, sampled uniformly; not thread-safe (the trainer locks it)."""

    def __init__(self, size: int = DEFAULT_TABLE_SIZE, power: float = 0.75, seed: int | None = 1,
                 refresh: float = DEFAULT_REFRESH):
        if size < 1:
            raise ValueError("noise table size must be >= 1")
        if refresh < 0:
            raise ValueError("refresh must be >= 0")
        self.size = int(size)
        self.power = float(power)
        self.refresh = float(refresh)
        self.table = np.zeros(0, dtype=np.int32)
        self.filled = 0
        self.z = 0.0                 # total weight of the trainable words
        self.layouts = 0             # how many times the table was laid out: its generation
        self.rng = np.random.default_rng(seed)
        self._weights = np.zeros(1024, dtype=np.float64)
        self._n_slots = 0            # weights beyond this are all 0
        self._moved = 0.0            # weight added since the last layout
        self._in_table = np.zeros(0, dtype=np.int64)   # the slots of positive weight, ascending (what is laid out)

    def weight(self, counts) -> np.ndarray:
        return np.asarray(counts, dtype=np.float64) ** self.power

    def _reserve(self, top: int) -> None:
        if top > len(self._weights):
            grown = np.zeros(max(top, 2 * len(self._weights)), dtype=np.float64)
            grown[:self._n_slots] = self._weights[:self._n_slots]
            self._weights = grown
        self._n_slots = max(self._n_slots, top)

    def add(self, slots: np.ndarray, new_counts: np.ndarray, min_count: int, early: np.ndarray | None = None) -> None:
        """Account for the counts of ``slots`` now being ``new_counts``: a word joins the table at
        ``min_count``, or at its first count where ``early`` (a word the cluster trains: see the module
        docstring)."""
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) == 0:
            return
        self._reserve(int(slots.max()) + 1)
        early = np.zeros(len(slots), dtype=np.bool_) if early is None else np.asarray(early, dtype=np.bool_)
        joined = np.empty(len(slots), dtype=np.bool_)
        added = _grow(self._weights, slots, np.asarray(new_counts, dtype=np.int64), int(min_count), early, self.power,
                      joined)
        if joined.any():   # both sorted: an insert, not a scan of every slot's weight
            new = np.unique(slots[joined])
            self._in_table = np.insert(self._in_table, np.searchsorted(self._in_table, new), new)
        if added <= 0 and self.filled:
            return
        self.z += added
        self._moved += added
        if self._moved > self.refresh * self.z or (self.filled == 0 and self.z > 0):
            self._lay_out()

    def rebuild(self, slots: np.ndarray, counts: np.ndarray) -> None:
        """Exact table for ``counts`` of ``slots`` (used after evictions)."""
        slots = np.asarray(slots, dtype=np.int64)
        self._weights[:self._n_slots] = 0.0
        self._n_slots = 0
        if len(slots):
            self._reserve(int(slots.max()) + 1)
            self._weights[slots] = self.weight(counts)
        self._in_table = np.flatnonzero(self._weights[:self._n_slots] > 0)
        self._lay_out()

    def _lay_out(self) -> None:
        table = np.empty(self.size, dtype=np.int32)
        self.z = float(_layout(self._weights, self._in_table, table))
        self._moved = 0.0
        self.layouts += 1
        if self.z > 0:
            self.table, self.filled = table, self.size
        else:
            self.table, self.filled = np.zeros(0, dtype=np.int32), 0

    def active(self) -> np.ndarray:
        """The current table, what samplers draw from (empty until a word is trainable)."""
        return self.table[:self.filled]

    def sample(self, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
        if self.filled == 0:
            raise ValueError("the noise table is empty: no trainable word yet")
        rng = rng or self.rng
        return self.table[rng.integers(0, self.filled, n)]
