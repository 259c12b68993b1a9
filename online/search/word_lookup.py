"""Finding rows by key and words by prefix, updated in O(new words) per sync.

A sync that adds a few words must not rebuild structures the size of the vocabulary: at
10M words one ``np.insert`` into the sorted keys moves 80 MB and rebuilding the sorted
word list holds the GIL (and so the event loop) for a tenth of a second. Both indexes
here have two levels, an immutable sorted *base* shared by every snapshot and a small
sorted *recent* level copied per sync; a lookup searches both. When the recent level
passes ``max(MERGE_MIN, base / MERGE_FRACTION)`` entries it is merged into a new base,
O(n) once per that many new words.

``WordsView`` is a snapshot's words: the first ``n`` entries of the list its store appends
to, read-only. A later sync appends beyond ``n``, which no view of an older snapshot shows.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import time
from collections.abc import Sequence

import numpy as np

MERGE_MIN = 4096
MERGE_FRACTION = 64
_HIGHEST_CHAR = "\U0010ffff"


class WordsView(Sequence):
    """The first ``n`` words of a shared append-only list (a snapshot's vocabulary, in row order)."""

    __slots__ = ("_words", "_n")

    def __init__(self, words: list[str], n: int):
        self._words, self._n = words, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._words[:self._n][i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("word row out of range")
        return self._words[i]

    def __iter__(self):
        return itertools.islice(self._words, self._n)

    def __contains__(self, word) -> bool:
        return any(w == word for w in self)

    def __eq__(self, other) -> bool:
        if not isinstance(other, (list, tuple, WordsView)):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"WordsView({self._n} words)"

    def tolist(self) -> list[str]:
        return self._words[:self._n]


class KeyIndex:
    """uint64 key -> row, for the rows of one snapshot."""

    __slots__ = ("base_keys", "base_rows", "recent_keys", "recent_rows")

    def __init__(self, base_keys: np.ndarray, base_rows: np.ndarray, recent_keys: np.ndarray | None = None,
                 recent_rows: np.ndarray | None = None):
        self.base_keys, self.base_rows = base_keys, base_rows
        self.recent_keys = np.zeros(0, np.uint64) if recent_keys is None else recent_keys
        self.recent_rows = np.zeros(0, np.int64) if recent_rows is None else recent_rows
        for a in (self.base_keys, self.base_rows, self.recent_keys, self.recent_rows):
            a.flags.writeable = False

    @classmethod
    def build(cls, keys: np.ndarray) -> "KeyIndex":
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], order.astype(np.int64))

    def __len__(self) -> int:
        return len(self.base_keys) + len(self.recent_keys)

    def rows_of(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, -1 where absent (vectorised binary search in both levels)."""
        keys = np.asarray(keys, dtype=np.uint64)
        out = _search(self.base_keys, self.base_rows, keys)
        if len(self.recent_keys) and len(keys):
            missing = out < 0
            if missing.any():
                out[missing] = _search(self.recent_keys, self.recent_rows, keys[missing])
        return out

    def with_rows(self, keys: np.ndarray, rows: np.ndarray) -> "KeyIndex":
        """This index plus ``keys`` (absent so far) at ``rows``."""
        if not len(keys):
            return self
        all_keys = np.concatenate([self.recent_keys, keys])
        all_rows = np.concatenate([self.recent_rows, np.asarray(rows, np.int64)])
        order = np.argsort(all_keys, kind="stable")
        recent_keys, recent_rows = all_keys[order], all_rows[order]
        if len(recent_keys) <= max(MERGE_MIN, len(self.base_keys) // MERGE_FRACTION):
            return KeyIndex(self.base_keys, self.base_rows, recent_keys, recent_rows)
        at = np.searchsorted(self.base_keys, recent_keys)
        return KeyIndex(np.insert(self.base_keys, at, recent_keys), np.insert(self.base_rows, at, recent_rows))

    def sorted_keys(self) -> np.ndarray:
        """All keys in order (for tests and inspection)."""
        return np.sort(np.concatenate([self.base_keys, self.recent_keys]))


SEARCH_CHUNK = 4096        # keys per searchsorted call: numpy holds the GIL while it searches


def _search(sorted_keys: np.ndarray, rows: np.ndarray, keys: np.ndarray) -> np.ndarray:
    if len(sorted_keys) == 0 or len(keys) == 0:
        return np.full(len(keys), -1, dtype=np.int64)
    out = np.empty(len(keys), np.int64)
    for lo in range(0, len(keys), SEARCH_CHUNK):
        part = keys[lo:lo + SEARCH_CHUNK]
        pos = np.searchsorted(sorted_keys, part)
        pos[pos == len(sorted_keys)] = 0
        out[lo:lo + len(part)] = np.where(sorted_keys[pos] == part, rows[pos], -1)
        if lo:
            time.sleep(0)              # a large delta's lookup lets the event loop in between pieces
    return out


class AlphaIndex:
    """The rows of one snapshot in alphabetical order of their words (prefix search)."""

    __slots__ = ("base_words", "base_rows", "recent_words", "recent_rows")

    def __init__(self, base_words: list[str], base_rows: np.ndarray, recent_words: list[str] | None = None,
                 recent_rows: np.ndarray | None = None):
        self.base_words, self.base_rows = base_words, base_rows
        self.recent_words = [] if recent_words is None else recent_words
        self.recent_rows = np.zeros(0, np.int64) if recent_rows is None else recent_rows
        self.base_rows.flags.writeable = False
        self.recent_rows.flags.writeable = False

    @classmethod
    def build(cls, words: Sequence[str]) -> "AlphaIndex":
        words = list(words)
        rows = sorted(range(len(words)), key=words.__getitem__)
        return cls([words[r] for r in rows], np.asarray(rows, dtype=np.int64))

    def with_rows(self, words: list[str], rows: np.ndarray) -> "AlphaIndex":
        """This index plus ``words`` at ``rows`` (new rows)."""
        if not len(words):
            return self
        pairs = sorted(itertools.chain(zip(self.recent_words, self.recent_rows.tolist()),
                                       zip(words, np.asarray(rows).tolist())))
        recent_words = [w for w, _ in pairs]
        recent_rows = np.fromiter((r for _, r in pairs), dtype=np.int64, count=len(pairs))
        if len(pairs) <= max(MERGE_MIN, len(self.base_words) // MERGE_FRACTION):
            return AlphaIndex(self.base_words, self.base_rows, recent_words, recent_rows)
        merged = list(heapq.merge(zip(self.base_words, self.base_rows.tolist()), pairs))
        return AlphaIndex([w for w, _ in merged], np.fromiter((r for _, r in merged), np.int64, len(merged)))

    def _ranges(self, prefix: str) -> tuple[int, int, int, int]:
        lo = bisect.bisect_left(self.base_words, prefix)
        hi = bisect.bisect_left(self.base_words, prefix + _HIGHEST_CHAR, lo)
        rlo = bisect.bisect_left(self.recent_words, prefix)
        rhi = bisect.bisect_left(self.recent_words, prefix + _HIGHEST_CHAR, rlo)
        return lo, hi, rlo, rhi

    def total(self, prefix: str) -> int:
        lo, hi, rlo, rhi = self._ranges(prefix)
        return (hi - lo) + (rhi - rlo)

    def prefix(self, prefix: str, limit: int, counts: np.ndarray, words: Sequence[str]) -> list[tuple[str, int]]:
        """Up to ``limit`` words starting with ``prefix``, most frequent first (then alphabetical)."""
        lo, hi, rlo, rhi = self._ranges(prefix)
        base, recent = self.base_rows[lo:hi], self.recent_rows[rlo:rhi]
        rows = np.concatenate([base, recent]) if len(recent) else base
        if len(rows) > limit:
            c = counts[rows]
            threshold = np.partition(c, len(c) - limit)[len(c) - limit]    # the limit-th largest count
            above = rows[c > threshold]
            # ties: the alphabetically first; each level's tied rows are in order, merge the two
            tied_base = base[counts[base] == threshold]
            tied_recent = recent[counts[recent] == threshold]
            want = limit - len(above)
            merged = heapq.merge(((words[r], r) for r in tied_base.tolist()),
                                 ((words[r], r) for r in tied_recent.tolist()))
            tied = [r for _, r in itertools.islice(merged, want)]
            rows = np.concatenate([above, np.asarray(tied, dtype=np.int64)])
        order = sorted(rows.tolist(), key=lambda r: (-int(counts[r]), words[r]))
        return [(words[r], int(counts[r])) for r in order]

    def words(self) -> list[str]:
        """Every word in alphabetical order (for tests and inspection)."""
        return list(heapq.merge(self.base_words, self.recent_words))

    def rows(self) -> np.ndarray:
        merged = heapq.merge(zip(self.base_words, self.base_rows.tolist()),
                             zip(self.recent_words, self.recent_rows.tolist()))
        return np.fromiter((r for _, r in merged), dtype=np.int64, count=len(self.base_words) + len(self.recent_words))
