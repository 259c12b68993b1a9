"""Finding rows by key and words by prefix, updated in O(new words) per sync.

A sync that adds a few words must not rebuild structures the size of the vocabulary: at
10M words one ``np.insert`` into the sorted keys moves 80 MB and rebuilding the sorted
word list holds the GIL (and so the event loop) for a tenth of a second. Both indexes
here have two levels, an immutable sorted *base* shared by every snapshot and a small
sorted *recent* level copied per sync; a lookup searches both. When the recent level
passes ``max(MERGE_MIN, base / MERGE_FRACTION)`` entries it is merged into a new base,
O(n) once per that many new words.

``WordArena`` holds every row's word once, as UTF-8 bytes end to end with their end offsets:
about 16 bytes a word, where a list of ``str`` costs about 65 (10M words: 0.16 GB, not 0.65).
A word is decoded when it is read, which answers read a few dozen of. ``WordsView`` is a
snapshot's words: the first ``n`` of the arena its store appends to, read-only. A later sync
appends beyond ``n``, which no view of an older snapshot shows. The alphabetical index holds
rows only and reads their words through the arena, so no second copy of the words exists.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import time
from array import array
from collections.abc import Iterable, Sequence

import numpy as np

MERGE_MIN = 4096
MERGE_FRACTION = 64
_HIGHEST_CHAR = "\U0010ffff"


class WordArena:
    """Append-only words in UTF-8: ``_data`` holds them end to end, ``_ends[r]`` where row r's ends.

    Only the store's head writes (``truncate`` to its ``n``, then ``extend``), and only beyond the
    rows any snapshot reads, so readers in other threads need no lock: a ``bytearray`` slice and
    an ``array`` item are each read whole under the GIL. Surrogates pass through (a word is any
    string the sources hand over)."""

    __slots__ = ("_data", "_ends")

    def __init__(self, words: Iterable[str] = ()):
        self._data = bytearray()
        self._ends = array("q")
        self.extend(words)

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, r) -> str:
        ends = self._ends
        return self._data[ends[r - 1] if r else 0:ends[r]].decode("utf-8", "surrogatepass")

    def extend(self, words: Iterable[str]) -> None:
        it = iter(words)
        while chunk := list(itertools.islice(it, 65_536)):      # bounded temporaries
            start = len(self._data)
            joined = "".join(chunk)
            data = joined.encode("utf-8", "surrogatepass")
            if len(data) == len(joined):       # ASCII: a word's bytes are its characters (one encode, not 65k)
                lengths = map(len, chunk)
            else:
                encoded = [w.encode("utf-8", "surrogatepass") for w in chunk]
                lengths = map(len, encoded)
            self._data += data
            self._ends.extend(itertools.islice(itertools.accumulate(lengths, initial=start), 1, None))

    def truncate(self, n: int) -> None:
        """Forget rows n.. (the head's rows beyond its ``n``, which no snapshot reads)."""
        if n < len(self._ends):
            del self._data[self._ends[n - 1] if n else 0:]
            del self._ends[n:]

    def unequal(self, rows: np.ndarray, words: Sequence[str]) -> np.ndarray:
        """Positions i at which row ``rows[i]`` does not hold ``words[i]``: compared as UTF-8 bytes in
        numpy, where decoding each row to compare strings cost 11 ms of a 12k-row sync at 10M words."""
        rows = np.asarray(rows, np.int64)
        encoded = [w.encode("utf-8", "surrogatepass") for w in words]
        got_len = np.fromiter(map(len, encoded), np.int64, len(encoded))
        ends = np.frombuffer(self._ends, np.int64)        # views: released on return, before any extend
        data = np.frombuffer(self._data, np.uint8)
        stop = ends[rows]
        start = np.where(rows > 0, ends[rows - 1], 0)
        same_len = np.flatnonzero(stop - start == got_len)
        lengths = got_len[same_len]
        total = int(lengths.sum())
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        which = np.repeat(same_len, lengths)
        blob = np.frombuffer(b"".join(encoded), np.uint8)
        offsets = np.cumsum(got_len) - got_len
        differs = data[start[which] + within] != blob[offsets[which] + within]
        bad = np.ones(len(rows), bool)
        bad[same_len] = False
        bad[which[differs]] = True
        del ends, data
        return np.flatnonzero(bad)

    def tolist(self, n: int | None = None) -> list[str]:
        """The first ``n`` words as strings (one pass when they are ASCII, as most vocabularies are)."""
        n = len(self._ends) if n is None else n
        if not n:
            return []
        end = self._ends[n - 1]
        text = self._data[:end].decode("utf-8", "surrogatepass")
        if len(text) != end:                                    # not ASCII: offsets are in bytes
            return [self[r] for r in range(n)]
        ends = self._ends[:n]
        return [text[a:b] for a, b in zip(itertools.chain((0,), ends), ends)]

    def nbytes(self) -> int:
        return len(self._data) + self._ends.itemsize * len(self._ends)


class WordsView(Sequence):
    """The first ``n`` words of a shared ``WordArena`` (a snapshot's vocabulary, in row order)."""

    __slots__ = ("_words", "_n")

    def __init__(self, words: WordArena, n: int):
        self._words, self._n = words, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._words[r] for r in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("word row out of range")
        return self._words[i]

    def __iter__(self):
        words = self._words
        return (words[r] for r in range(self._n))

    def __contains__(self, word) -> bool:
        return any(w == word for w in self)

    def __eq__(self, other) -> bool:
        if not isinstance(other, (list, tuple, WordsView)):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"WordsView({self._n} words)"

    def tolist(self) -> list[str]:
        return self._words.tolist(self._n)


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
        order = np.argsort(keys)        # keys are distinct (``check_delta``): no ties, so no stable sort (2 s at 10M)
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
        order = np.argsort(part)         # sorted needles: each search starts where the last one ended
        pos = np.empty(len(part), np.int64)
        pos[order] = np.searchsorted(sorted_keys, part[order])
        pos[pos == len(sorted_keys)] = 0
        out[lo:lo + len(part)] = np.where(sorted_keys[pos] == part, rows[pos], -1)
        if lo:
            time.sleep(0)              # a large delta's lookup lets the event loop in between pieces
    return out


class AlphaIndex:
    """The rows of one snapshot in alphabetical order of their words (prefix search).

    The base level holds rows only and reads their words through ``base_words`` (a snapshot's
    ``WordsView``), so the vocabulary is not held twice; the small recent level keeps its
    strings. UTF-8 bytes sort as their code points do, so either spelling gives one order."""

    __slots__ = ("base_words", "base_rows", "recent_words", "recent_rows")

    def __init__(self, base_words: Sequence[str], base_rows: np.ndarray, recent_words: list[str] | None = None,
                 recent_rows: np.ndarray | None = None):
        self.base_words, self.base_rows = base_words, base_rows
        self.recent_words = [] if recent_words is None else recent_words
        self.recent_rows = np.zeros(0, np.int64) if recent_rows is None else recent_rows
        self.base_rows.flags.writeable = False
        self.recent_rows.flags.writeable = False

    @classmethod
    def build(cls, words: Sequence[str], view: Sequence[str] | None = None) -> "AlphaIndex":
        """Of ``words`` (row order); ``view``: what the index reads them through later (default: ``words``)."""
        listed = words if isinstance(words, list) else list(words)
        # an argsort of the strings by reference: sorted(range(n), key=...) made n int objects and a list of them
        # (560 MB at 10M words, at the full load's peak), for the same order
        refs = np.empty(len(listed), object)
        refs[:] = listed
        rows = np.argsort(refs, kind="stable").astype(np.int64, copy=False)
        del refs
        return cls(listed if view is None else view, rows)

    def with_rows(self, words: list[str], rows: np.ndarray, view: Sequence[str]) -> "AlphaIndex":
        """This index plus ``words`` at ``rows`` (new rows); ``view``: the new snapshot's words."""
        if not len(words):
            return self
        pairs = sorted(itertools.chain(zip(self.recent_words, self.recent_rows.tolist()),
                                       zip(words, np.asarray(rows).tolist())))
        recent_words = [w for w, _ in pairs]
        recent_rows = np.fromiter((r for _, r in pairs), dtype=np.int64, count=len(pairs))
        if len(pairs) <= max(MERGE_MIN, len(self.base_rows) // MERGE_FRACTION):
            return AlphaIndex(self.base_words, self.base_rows, recent_words, recent_rows)
        base = self.base_words
        merged = heapq.merge(((base[r], r) for r in self.base_rows.tolist()), pairs)
        return AlphaIndex(view, np.fromiter((r for _, r in merged), np.int64, len(self.base_rows) + len(pairs)))

    def _ranges(self, prefix: str) -> tuple[int, int, int, int]:
        word = self.base_words.__getitem__
        lo = bisect.bisect_left(self.base_rows, prefix, key=word)
        hi = bisect.bisect_left(self.base_rows, prefix + _HIGHEST_CHAR, lo, key=word)
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

    def _base(self):
        base = self.base_words
        return ((base[r], r) for r in self.base_rows.tolist())

    def words(self) -> list[str]:
        """Every word in alphabetical order (for tests and inspection)."""
        return [w for w, _ in heapq.merge(self._base(), zip(self.recent_words, self.recent_rows.tolist()))]

    def rows(self) -> np.ndarray:
        merged = heapq.merge(self._base(), zip(self.recent_words, self.recent_rows.tolist()))
        return np.fromiter((r for _, r in merged), dtype=np.int64, count=len(self.base_rows) + len(self.recent_words))
