"""The adaptive noise distribution for negative sampling: unigram^0.75 over a stream.

word2vec.c fills a table of 10^8 word ids once, each word taking a share proportional
to ``count^0.75``; a negative sample is a uniform draw from it. On a stream the counts
change forever, so livevec keeps yskip's reservoir-updated table (Kaji & Kobayashi
2017, Algorithm 2): each time a word's weight ``count^0.75`` grows by ``F``, the running
total ``z`` grows by ``F`` and

* while the table is not full, ``round(F * fill_scale)`` copies of the word are
  appended (yskip appends ``round(F)``; livevec appends 16 per unit of weight so
  that a word at min_count, weight 5^0.75 = 3.3, is not rounded by +-15%);
* once it is full, ``round(F / z * size)`` entries chosen uniformly at random are
  overwritten with the word.

By induction every word's expected share of the table is its weight divided by ``z``
at every moment, which is the exact unigram^0.75 distribution of the counts so far,
at O(F / z * size) work per update. Rounding is probabilistic (``floor(x)`` plus one with
probability ``frac(x)``) so small weights are not rounded away.

livevec applies it per mini-batch: a word counted ``c`` times in the batch adds
``new^0.75 - old^0.75`` at once. Only trainable words (count >= min_count) are in the
table; a word that becomes trainable adds its whole weight. After an eviction the
vocabulary's counts have all moved (Misra-Gries), so the table is rebuilt exactly from
them (as yskip does after ``reduce_vocab``).
"""
from __future__ import annotations

import numpy as np

DEFAULT_TABLE_SIZE = 1 << 24   # 64 MiB of int32; word2vec.c uses 10^8


def _random_round(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    base = np.floor(x)
    return (base + (rng.random(len(x)) < (x - base))).astype(np.int64)


class NoiseTable:
    """Table of vocabulary slots, sampled uniformly; not thread-safe (the trainer locks it)."""

    def __init__(self, size: int = DEFAULT_TABLE_SIZE, power: float = 0.75, seed: int | None = 1,
                 fill_scale: float = 16.0):
        if size < 1:
            raise ValueError("noise table size must be >= 1")
        self.size = int(size)
        self.power = float(power)
        self.fill_scale = float(fill_scale)
        self.table = np.zeros(self.size, dtype=np.int32)
        self.filled = 0
        self.z = 0.0
        self.rng = np.random.default_rng(seed)

    def weight(self, counts) -> np.ndarray:
        return np.asarray(counts, dtype=np.float64) ** self.power

    def add(self, slots: np.ndarray, old_counts: np.ndarray, new_counts: np.ndarray, min_count: int) -> None:
        """Account for counts growing from ``old_counts`` to ``new_counts`` (one entry per slot)."""
        live = new_counts >= min_count
        if not live.any():
            return
        slots, old, new = slots[live], old_counts[live], new_counts[live]
        delta = self.weight(new) - np.where(old >= min_count, self.weight(old), 0.0)
        self.z += float(delta.sum())
        if self.filled < self.size:
            n = _random_round(delta * self.fill_scale, self.rng)
            ids = np.repeat(slots.astype(np.int32), n)
            take = min(len(ids), self.size - self.filled)
            if take < len(ids):  # the last ones would not fit: shuffle so no slot is favoured
                self.rng.shuffle(ids)
            self.table[self.filled:self.filled + take] = ids[:take]
            self.filled += take
            return
        n = _random_round(delta / self.z * self.size, self.rng)
        total = int(n.sum())
        if total:
            ids = np.repeat(slots.astype(np.int32), n)
            self.table[self.rng.integers(0, self.size, total)] = ids

    def rebuild(self, slots: np.ndarray, counts: np.ndarray) -> None:
        """Exact table for ``counts`` of ``slots`` (used after evictions)."""
        w = self.weight(counts)
        self.z = float(w.sum())
        if self.z <= 0:
            self.filled = 0
            return
        # Keep a partly-filled table at the fill scale (entries per unit of weight)
        # so later ``add`` calls keep appending; cap it at the table size.
        target = min(self.size, int(np.ceil(self.z * self.fill_scale)))
        n = _random_round(w / self.z * target, self.rng)
        ids = np.repeat(slots.astype(np.int32), n)
        self.rng.shuffle(ids)
        k = min(len(ids), self.size)
        self.table[:k] = ids[:k]
        self.filled = k

    def active(self) -> np.ndarray:
        """The filled part of the table (a view), what samplers draw from."""
        return self.table[:self.filled]

    def sample(self, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
        if self.filled == 0:
            raise ValueError("the noise table is empty: no trainable word yet")
        rng = rng or self.rng
        return self.table[rng.integers(0, self.filled, n)]
