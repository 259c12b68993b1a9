"""The online vocabulary: word keys, bounded-memory counts, trainability and eviction.

**Word keys.** Each word is stored under ``word_key(token)`` (``online.learner.keys`` owns the layout:
BLAKE2b-64, the input row at the key and the output row at the next one).

Collisions: if two words share a key they share both rows on the servers: each reads and
writes the same vectors, so they end up with one blended embedding, and whichever word
was recorded last owns the key's string on the server. Nothing crashes and no other word
is affected; the vocabulary itself still keeps their counts apart because it is indexed
by the word's bytes.

**The index.** Words are found by their UTF-8 bytes in a compiled hash table (``online.learner.word_table``),
a whole mini-batch of token spans (``online.learner.spans.TokenSpans``) per call:
``update_spans`` and ``lookup_spans`` are the trainer's per-token path and never make a
Python string of a token; only admitted words are decoded (``words``) and keyed (``keys``).
``update`` and ``lookup`` take lists of strings and go the same way.

**Bounded counts.** A stream has an unbounded number of types (typos, ids, URLs), so counts live in a table
of fixed ``capacity`` managed with the Misra-Gries algorithm, as yskip does: when new
words do not fit, every count is decreased by the smallest amount ``d`` that frees
enough slots and the words that reach zero are evicted. (Misra-Gries decrements by one,
repeatedly; doing it once by ``d`` for a whole mini-batch is the same thing batched.)
Estimates never exceed the true count and undercount by at most about N / capacity
after N tokens, so frequent words are never evicted and a word's count in a table
that never fills is exact. The occurrences, in the batch that forces an eviction, of a word
evicted by it are not counted (the word is gone; it comes back when it occurs again).
A word is *trainable* while its count is at least
``min_count``; only trainable words get rows on the servers, so when a trainable word is
evicted its key is reported in ``VocabUpdate.evicted_keys`` for the caller to free both
of its rows.

**Cluster trainability.** On a cluster the servers own each word's total count (``online.learner.word_counts``): a
word whose ``min_count`` occurrences are spread over many workers never reaches it in any
one worker's table. ``mark_trainable`` records the servers' verdict; a word is then
trainable while either its local count reaches ``min_count`` or the cluster said so. Local
counts stay what subsampling and the noise table estimate frequencies from.
``known_trainable`` holds the keys the servers' journals listed as trainable
(``online.learner.word_counts``), so that a word new to this table is trainable from its first
occurrence here when the cluster already trains it, instead of from this worker's next sync.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from online.learner import word_table as wt
from online.learner.key_index import KeyIndex
from online.learner.keys import word_key
from online.learner.spans import TokenSpans, spans_of_tokens

_EMPTY_I64 = np.zeros(0, dtype=np.int64)
_EMPTY_U64 = np.zeros(0, dtype=np.uint64)


def _members(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Which ``keys`` are in ``sorted_keys`` (a binary search each)."""
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys


@dataclass
class VocabUpdate:
    """What one ``OnlineVocab.update`` changed; consumed by the noise table and the trainer."""

    slots: np.ndarray                 # int64 slot of every token, in order (-1: not counted)
    touched: np.ndarray               # int64 distinct slots counted in this update (first occurrence first)
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
        self.words: list[str | None] = [None] * self.capacity
        self.counts = np.zeros(self.capacity, dtype=np.int64)
        self.keys = np.zeros(self.capacity, dtype=np.uint64)
        self.trainable = np.zeros(self.capacity, dtype=bool)
        self.cluster_trainable = np.zeros(self.capacity, dtype=bool)   # the servers' verdict (see above)
        self.known_trainable = _EMPTY_U64   # sorted keys the cluster trains (``learn_trainable``)
        self._free: list[int] = list(range(self.capacity - 1, -1, -1))
        self._size = 0
        self._live = np.zeros(self.capacity, dtype=bool)
        # key -> slot of the live words: the servers' news names keys, not words (16 - 32 B per word, the table
        # kept at most half full; a search of every live key per sync with news would be 15 % of a sync's CPU)
        self._by_key = KeyIndex()
        # the word index (see online.learner.word_table): slot -> bytes in the arena, hash -> slot
        self._offset = np.zeros(self.capacity, dtype=np.int64)
        self._length = np.zeros(self.capacity, dtype=np.int64)
        self._hash = np.zeros(self.capacity, dtype=np.uint64)
        self._seen = np.zeros(self.capacity, dtype=np.uint8)
        self._arena = np.zeros(1 << 16, dtype=np.uint8)
        self._used = 0
        self._new_table(1024)
        self.total_tokens = 0          # every token ever counted
        self.trainable_total = 0       # sum of counts of trainable words (subsampling's T)
        self.evictions = 0

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return self._size

    def __contains__(self, token: str) -> bool:
        return self.slot(token) >= 0

    def slot(self, token: str) -> int:
        return int(self.lookup([token])[0])

    def lookup(self, tokens: list[str]) -> np.ndarray:
        """Slot of each token, -1 for unknown words; counts nothing."""
        return self.lookup_spans(spans_of_tokens(tokens))

    def lookup_spans(self, spans: TokenSpans) -> np.ndarray:
        """Slot of each token span, -1 for unknown words; counts nothing."""
        out = np.empty(spans.num_tokens, dtype=np.int64)
        wt.lookup(self._tslot, self._thash, self._shift, self._arena, self._offset, self._length,
                  spans.buf, spans.start, spans.length, spans.hash, out)
        return out

    def count(self, token: str) -> int:
        s = self.slot(token)
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
        return self.update_spans(spans_of_tokens(tokens))

    def update_spans(self, spans: TokenSpans) -> VocabUpdate:
        """``update`` for a mini-batch of token spans (the trainer's path)."""
        n = spans.num_tokens
        if n == 0:
            return VocabUpdate(_EMPTY_I64, _EMPTY_I64, _EMPTY_I64, _EMPTY_I64)
        slots = np.empty(n, dtype=np.int64)
        missing = wt.lookup(self._tslot, self._thash, self._shift, self._arena, self._offset, self._length,
                            spans.buf, spans.start, spans.length, spans.hash, slots)
        evicted_slots, evicted_keys, rescaled = _EMPTY_I64, _EMPTY_U64, False
        if missing:
            ordinal = np.empty(n, dtype=np.int64)
            first = wt.distinct_missing(spans.buf, spans.start, spans.length, spans.hash, slots, missing, ordinal)
            if len(first) > len(self._free):
                evicted_slots, evicted_keys = self._make_room(len(first))
                rescaled = True
                gone = np.zeros(self.capacity, dtype=np.uint8)
                gone[evicted_slots] = 1
                wt.drop_slots(slots, gone)      # their words are gone: -2, not counted
            new_slots = self._admit(spans, first[:len(self._free)])
            wt.resolve_missing(slots, ordinal, new_slots)
            if rescaled:
                slots[slots == -2] = -1
        touched = np.empty(n, dtype=np.int64)
        old = np.empty(n, dtype=np.int64)
        k = wt.count_slots(slots, self.counts, self._seen, touched, old)
        touched, old = touched[:k], old[:k]
        new = np.empty(k, dtype=np.int64)
        crossed = np.empty(k, dtype=np.int64)
        n_crossed, delta = wt.settle(touched, old, self.counts, self.trainable, self.cluster_trainable,
                                     self.min_count, new, crossed)
        self.total_tokens += n
        self.trainable_total += int(delta)
        return VocabUpdate(slots, touched, old, new, crossed[:n_crossed], evicted_slots, evicted_keys, rescaled)

    def _admit(self, spans: TokenSpans, first: np.ndarray) -> np.ndarray:
        """Give the words of spans ``first`` (absent, distinct) free slots; returns the slots."""
        k = len(first)
        if k == 0:
            return _EMPTY_I64
        slots = np.array(self._free[-k:][::-1], dtype=np.int64)
        del self._free[-k:]
        if 2 * (self._size + k) > len(self._tslot):
            self._size += k     # rebuild() sizes the table for the words being added too
            self._rebuild()
            self._size -= k
        lengths = spans.length[first]
        nbytes = int(lengths.sum())
        if self._used + nbytes > len(self._arena):
            grown = np.zeros(max(2 * len(self._arena), self._used + nbytes), dtype=np.uint8)
            grown[:self._used] = self._arena[:self._used]
            self._arena = grown
        self._used = wt.insert(self._tslot, self._thash, self._shift, self._arena, self._used, self._offset,
                               self._length, self._hash, spans.buf, spans.start, spans.length, spans.hash,
                               first, slots)
        words = self._decode(slots, lengths, nbytes)
        for s, w in zip(slots.tolist(), words):
            self.words[s] = w
        self.keys[slots] = np.fromiter(map(word_key, words), dtype=np.uint64, count=k)
        self._index_keys(slots)
        self.counts[slots] = 0
        self.trainable[slots] = False
        self.cluster_trainable[slots] = _members(self.keys[slots], self.known_trainable)
        self._live[slots] = True
        self._size += k
        return slots

    def _decode(self, slots: np.ndarray, lengths: np.ndarray, nbytes: int) -> list[str]:
        raw = np.empty(nbytes, dtype=np.uint8)
        wt.gather_bytes(self._arena, self._offset, self._length, slots, raw)
        data = raw.tobytes()
        ends = np.cumsum(lengths).tolist()
        begins = [0] + ends[:-1]
        text = data.decode("utf-8", "surrogatepass")
        if len(text) == len(data):      # ASCII: byte offsets are character offsets
            return [text[a:b] for a, b in zip(begins, ends)]
        return [data[a:b].decode("utf-8", "surrogatepass") for a, b in zip(begins, ends)]

    def _new_table(self, size: int) -> None:
        # (slot, hash) side by side: a probe reads one cache line
        table = np.empty((size, 2), dtype=np.int64)
        table[:, 0] = -1
        table[:, 1] = 0
        self._tslot = table[:, 0]
        self._thash = table[:, 1].view(np.uint64)
        self._shift = np.uint64(64 - int(np.log2(size)))

    def _rebuild(self) -> None:
        """A fresh table for the live words (sized for load <= 1/2), with a compacted arena."""
        size = 1024
        while 2 * self._size > size:
            size *= 2
        self._new_table(size)
        live = np.flatnonzero(self._live)
        arena = np.zeros(max(1 << 16, 2 * int(self._length[live].sum())), dtype=np.uint8)
        self._used = wt.rebuild(self._tslot, self._thash, self._shift, self._arena, arena, self._offset,
                                self._length, self._hash, live)
        self._arena = arena

    def learn_trainable(self, known: np.ndarray, new_keys: np.ndarray) -> np.ndarray:
        """The cluster trains ``known`` (sorted keys, all of them), of which ``new_keys`` are news; returns
        the slots of words in this table that the news made trainable."""
        self.known_trainable = np.asarray(known, dtype=np.uint64)
        hit = self._by_key.lookup(np.unique(np.asarray(new_keys, dtype=np.uint64)))
        hit = hit[hit >= 0]     # (a search of every live word's key, per sync with news, would be 15 % of a sync's CPU)
        return self.mark_trainable(hit, np.ones(len(hit), dtype=bool))

    def _index_keys(self, slots: np.ndarray) -> None:
        keys, first = np.unique(self.keys[slots], return_index=True)
        fresh = self._by_key.lookup(keys) < 0   # (two words of one 64-bit key: the first keeps it)
        self._by_key.insert(keys[fresh], slots[first[fresh]])

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
        occupied = np.flatnonzero(self._live)
        if not len(occupied):   # one batch brings more new words than the table holds: the rest go uncounted
            return _EMPTY_I64, _EMPTY_U64
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
        indexed = self._by_key.lookup(self.keys[gone]) == gone
        self._by_key.delete(self.keys[gone][indexed])
        for s in gone.tolist():
            self.words[s] = None
        self._free.extend(gone.tolist())
        self._live[gone] = False
        self._size -= len(gone)
        self.counts[gone] = 0
        self.keys[gone] = 0
        self.trainable[gone] = False
        self.cluster_trainable[gone] = False
        self.trainable[occupied] &= (self.counts[occupied] >= self.min_count) | self.cluster_trainable[occupied]
        self.trainable_total = int(self.counts[self.trainable].sum())
        self.evictions += len(gone)
        self._rebuild()
        return gone, evicted_keys
