"""The online vocabulary: word keys, bounded-memory counts, trainability and eviction.

Word keys
---------
Each word is stored under ``word_key(token)`` (``online.learner.keys`` owns the layout:
BLAKE2b-64, the input row at the key and the output row at the next one).

Collisions: if two words share a key they share both rows on the servers: each reads and
writes the same vectors, so they end up with one blended embedding, and whichever word
was recorded last owns the key's string on the server. Nothing crashes and no other word
is affected; the vocabulary itself still keeps their counts apart because it is indexed
by the string.

Bounded counts
--------------
A stream has an unbounded number of types (typos, ids, URLs), so counts live in a table
of fixed ``capacity`` managed with the Misra-Gries algorithm, as yskip does: when new
words do not fit, every count is decreased by the smallest amount ``d`` that frees
enough slots and the words that reach zero are evicted. (Misra-Gries decrements by one,
repeatedly; doing it once by ``d`` for a whole mini-batch is the same thing batched.)
Estimates never exceed the true count and undercount by at most about N / capacity
after N tokens, so frequent words are never evicted and a word's count in a table
that never fills is exact. A word is *trainable* while its count is at least
``min_count``; only trainable words get rows on the servers, so when a trainable word is
evicted its key is reported in ``VocabUpdate.evicted_keys`` for the caller to free both
of its rows.

Cluster trainability
--------------------
On a cluster the servers own each word's total count (``online.cluster.word_counts``): a
word whose ``min_count`` occurrences are spread over many workers never reaches it in any
one worker's table. ``mark_trainable`` records the servers' verdict; a word is then
trainable while either its local count reaches ``min_count`` or the cluster said so. Local
counts stay what subsampling and the noise table estimate frequencies from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from online.learner.keys import word_key

_EMPTY_I64 = np.zeros(0, dtype=np.int64)
_EMPTY_U64 = np.zeros(0, dtype=np.uint64)


@dataclass
class VocabUpdate:
    """What one ``OnlineVocab.update`` changed; consumed by the noise table and the trainer."""

    slots: np.ndarray                 # int64 slot of every token, in order
    touched: np.ndarray               # int64 distinct slots counted in this update
    old_counts: np.ndarray            # their counts before
    new_counts: np.ndarray            # and after
    newly_trainable: np.ndarray = field(default_factory=lambda: _EMPTY_I64)  # slots that reached min_count
    evicted_slots: np.ndarray = field(default_factory=lambda: _EMPTY_I64)
    evicted_keys: np.ndarray = field(default_factory=lambda: _EMPTY_U64)     # keys of evicted TRAINABLE words
    counts_rescaled: bool = False     # a Misra-Gries decrement changed counts outside ``touched``


class OnlineVocab:
    """Word -> slot table with Misra-Gries counts in ``capacity`` slots. Not thread-safe."""

    def __init__(self, capacity: int = 1_000_000, min_count: int = 5):
        if capacity < 1:
            raise ValueError("vocabulary capacity must be >= 1")
        if min_count < 1:
            raise ValueError("min_count must be >= 1")
        self.capacity = int(capacity)
        self.min_count = int(min_count)
        self._index: dict[str, int] = {}
        self.words: list[str | None] = [None] * self.capacity
        self.counts = np.zeros(self.capacity, dtype=np.int64)
        self.keys = np.zeros(self.capacity, dtype=np.uint64)
        self.trainable = np.zeros(self.capacity, dtype=bool)
        self.cluster_trainable = np.zeros(self.capacity, dtype=bool)   # the servers' verdict (see above)
        self._free: list[int] = list(range(self.capacity - 1, -1, -1))
        self.total_tokens = 0          # every token ever counted
        self.trainable_total = 0       # sum of counts of trainable words (subsampling's T)
        self.evictions = 0

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, token: str) -> bool:
        return token in self._index

    def slot(self, token: str) -> int:
        return self._index.get(token, -1)

    def lookup(self, tokens: list[str]) -> np.ndarray:
        """Slot of each token, -1 for unknown words; counts nothing."""
        return np.array(list(map(self._index.get, tokens, repeat(-1))), dtype=np.int64)

    def count(self, token: str) -> int:
        s = self._index.get(token, -1)
        return int(self.counts[s]) if s >= 0 else 0

    def trainable_slots(self) -> np.ndarray:
        """Trainable slots, most frequent first (ties by word, for reproducible files)."""
        slots = np.flatnonzero(self.trainable)
        order = np.lexsort((np.array([self.words[s] for s in slots], dtype=object).astype(str),
                            -self.counts[slots])) if len(slots) else slots
        return slots[order]

    def num_trainable(self) -> int:
        return int(self.trainable.sum())

    # ---------------------------------------------------------------- updates
    def update(self, tokens: list[str]) -> VocabUpdate:
        """Count ``tokens``; admit new words (evicting if full); return what changed."""
        n = len(tokens)
        if n == 0:
            return VocabUpdate(_EMPTY_I64, _EMPTY_I64, _EMPTY_I64, _EMPTY_I64)
        slots = self.lookup(tokens)
        evicted_slots, evicted_keys, rescaled = _EMPTY_I64, _EMPTY_U64, False
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            new_words = list(dict.fromkeys(tokens[i] for i in missing))
            if len(new_words) > len(self._free):
                evicted_slots, evicted_keys = self._make_room(len(new_words))
                rescaled = True
            self._admit(new_words)
            get = self._index.get
            for i in missing:   # only the misses; a missing word must be admitted by now or skipped
                slots[i] = get(tokens[i], -1)
        valid = slots[slots >= 0] if rescaled and (slots < 0).any() else slots
        touched, c = np.unique(valid, return_counts=True)
        old = self.counts[touched].copy()
        new = old + c
        self.counts[touched] = new
        self.total_tokens += n
        was = self.trainable[touched]
        now = (new >= self.min_count) | self.cluster_trainable[touched]
        self.trainable[touched] = now
        crossed = touched[now & ~was]
        self.trainable_total += int((new - old)[was & now].sum()) + int(new[now & ~was].sum())
        return VocabUpdate(slots, touched, old, new, crossed, evicted_slots, evicted_keys, rescaled)

    def _admit(self, words: list[str]) -> None:
        take = min(len(words), len(self._free))
        for w in words[:take]:
            s = self._free.pop()
            self._index[w] = s
            self.words[s] = w
            self.keys[s] = word_key(w)
            self.counts[s] = 0
            self.trainable[s] = False
            self.cluster_trainable[s] = False

    def mark_trainable(self, slots: np.ndarray, trainable: np.ndarray) -> np.ndarray:
        """Record the cluster's verdict on ``slots`` (bool each); returns the slots that became trainable."""
        slots = np.asarray(slots, dtype=np.int64)
        trainable = np.asarray(trainable, dtype=bool)
        live = slots >= 0
        slots, trainable = slots[live], trainable[live]
        self.cluster_trainable[slots] = trainable
        was = self.trainable[slots]
        now = trainable | (self.counts[slots] >= self.min_count)
        self.trainable[slots] = now
        crossed = slots[now & ~was]
        dropped = slots[was & ~now]
        self.trainable_total += int(self.counts[crossed].sum()) - int(self.counts[dropped].sum())
        return crossed

    def _make_room(self, needed: int) -> tuple[np.ndarray, np.ndarray]:
        """Batched Misra-Gries: subtract the smallest d that frees ``needed`` slots."""
        occupied = np.fromiter(self._index.values(), dtype=np.int64, count=len(self._index))
        to_free = needed - len(self._free)
        if to_free >= len(occupied):
            d = int(self.counts[occupied].max())
        else:
            d = int(np.partition(self.counts[occupied], to_free - 1)[to_free - 1])
        d = max(d, 1)
        self.counts[occupied] -= d
        gone = occupied[self.counts[occupied] <= 0]
        was_trainable = self.trainable[gone]
        evicted_keys = self.keys[gone][was_trainable].copy()
        for s in gone.tolist():
            del self._index[self.words[s]]
            self.words[s] = None
            self._free.append(s)
        self.counts[gone] = 0
        self.keys[gone] = 0
        self.trainable[gone] = False
        self.cluster_trainable[gone] = False
        self.trainable[occupied] &= (self.counts[occupied] >= self.min_count) | self.cluster_trainable[occupied]
        self.trainable_total = int(self.counts[self.trainable].sum())
        self.evictions += len(gone)
        return gone, evicted_keys
