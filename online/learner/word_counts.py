"""The cluster's word counts: each server counts the words of its key range, in bounded memory.

Why on the servers. Each worker sees only its Kafka partitions. If each decided on its own
when a word reaches ``min_count``, a new word would need about N x min_count occurrences
before anyone trained it with N workers, and a worker that forgot a word would free rows
other workers still train. So workers send the count increments of every word they read
(keyed by the word's input key, ``online.learner.keys``) and the server that owns the key
adds them up and answers with the total: a word is trainable once the *cluster's* count
reaches ``min_count``, whichever workers saw it.

Bounded memory. A stream has unboundedly many types, so the table holds at most
``capacity`` keys, managed with batched Misra-Gries as the workers' vocabulary is
(``online.learner.vocab``): when new keys do not fit, every count drops by the smallest
``d`` that frees enough entries and the keys that reach zero leave. A total never exceeds
the true count and undercounts by at most N / capacity after N occurrences, so frequent
words stay. The keys of *trainable* words that leave are returned: only the server that
owns a word frees its rows. Cost: about 40 bytes per key (the hash index at load <= 1/2
and the count).

The trainable journal. A worker learns a word's total only when it reports the word, so with
N workers each would drop its first occurrences of a word the cluster already trains until
its next sync answered, about N x more lost occurrences than one process loses, most of a
mid-frequency word's (8 simulated workers sharing one model train 15 % fewer tokens and
reach WS353 0.18 against 0.35 for one). So the table also logs, in order, every key whose
total reaches ``min_count``, and ``trainable_since`` hands each worker the keys it has not
seen yet: a worker then trains a word from its first occurrence there. The log is bounded:
past ``2 x capacity`` entries it restarts as the keys trainable now, under a new
``generation``, and a worker of another generation gets all of them again (8 bytes a key).
"""
from __future__ import annotations

import secrets

import numpy as np

from online.learner.key_index import KeyIndex

_EMPTY_U64 = np.zeros(0, dtype=np.uint64)


class WordCounts:
    """uint64 input key -> cluster count, at most ``capacity`` keys. Not thread-safe (the shard locks it)."""

    def __init__(self, capacity: int = 1_000_000, min_count: int = 5):
        if capacity < 1:
            raise ValueError("word count capacity must be >= 1")
        if min_count < 1:
            raise ValueError("min_count must be >= 1")
        self.capacity = int(capacity)
        self.min_count = int(min_count)
        self._index = KeyIndex(min(self.capacity, 1 << 16))
        self._keys = np.zeros(0, dtype=np.uint64)
        self._counts = np.zeros(0, dtype=np.int64)
        self._free: list[np.ndarray] = []
        self._next = 0
        self.evictions = 0
        self._new_journal(_EMPTY_U64)

    def __len__(self) -> int:
        return len(self._index)

    def totals(self, keys: np.ndarray) -> np.ndarray:
        """Current count of each key (0 where unknown)."""
        slots = self._index.lookup(np.ascontiguousarray(keys, dtype=np.uint64))
        out = np.zeros(len(slots), dtype=np.int64)
        known = slots >= 0
        out[known] = self._counts[slots[known]]
        return out

    def add(self, keys: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add ``deltas`` (int64, >= 0) to distinct ``keys``; returns (totals after, keys of trainable words evicted).

        A key that cannot be admitted even after eviction (more new keys in one call than the
        table holds) is counted as 0: its occurrences are forgotten, as Misra-Gries forgets."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        deltas = np.asarray(deltas, dtype=np.int64)
        slots = self._index.lookup(keys)
        evicted = _EMPTY_U64
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            room = self.capacity - len(self._index)
            if len(missing) > room:
                evicted = self._make_room(len(missing) - room)
                slots[slots >= 0] = self._index.lookup(keys[slots >= 0])   # survivors keep their slots
                missing = np.flatnonzero(slots < 0)
                room = self.capacity - len(self._index)
            admit = missing[:room]
            slots[admit] = self._admit(keys[admit])
        known = slots >= 0
        before = self._counts[slots[known]]
        after = before + deltas[known]
        self._counts[slots[known]] = after
        crossed = (before < self.min_count) & (after >= self.min_count)
        if crossed.any():
            self._log(keys[known][crossed])
        out = np.zeros(len(keys), dtype=np.int64)
        out[known] = after
        return out, evicted

    # -- the trainable journal (see the module docstring)
    def _new_journal(self, keys: np.ndarray) -> None:
        self.generation = secrets.randbits(62)
        self._journal = np.zeros(max(1024, 2 * len(keys)), dtype=np.uint64)
        self._journal_len = 0
        self._log(keys)

    def _log(self, keys: np.ndarray) -> None:
        end = self._journal_len + len(keys)
        if end > 2 * self.capacity:          # churn: start again from what is trainable now
            self._new_journal(self.trainable_keys())
            return
        if end > len(self._journal):
            grown = np.zeros(max(end, 2 * len(self._journal)), dtype=np.uint64)
            grown[:self._journal_len] = self._journal[:self._journal_len]
            self._journal = grown
        self._journal[self._journal_len:end] = keys
        self._journal_len = end

    def trainable_keys(self) -> np.ndarray:
        """Every key whose total is at least ``min_count``."""
        keys, slots = self._index.items()
        return keys[self._counts[slots] >= self.min_count]

    def trainable_since(self, generation: int, since: int) -> tuple[int, int, np.ndarray]:
        """(generation, position to ask from next time, the keys that became trainable since ``since``);
        a position of another generation (or past the end) gets the whole log. A key evicted meanwhile
        may still be listed: its first delta creates its rows again, as any worker's would."""
        if generation != self.generation or not 0 <= since <= self._journal_len:
            since = 0
        return self.generation, self._journal_len, self._journal[since:self._journal_len].copy()

    def _admit(self, keys: np.ndarray) -> np.ndarray:
        reuse = np.concatenate(self._free) if self._free else np.zeros(0, dtype=np.int64)
        take = reuse[:len(keys)]
        self._free = [reuse[len(keys):]] if len(reuse) > len(keys) else []
        rest = len(keys) - len(take)
        if self._next + rest > len(self._keys):
            size = max(1024, len(self._keys))
            while size < self._next + rest:
                size *= 2
            self._keys = np.concatenate([self._keys, np.zeros(size - len(self._keys), np.uint64)])
            self._counts = np.concatenate([self._counts, np.zeros(size - len(self._counts), np.int64)])
        slots = np.concatenate([take, np.arange(self._next, self._next + rest, dtype=np.int64)])
        self._next += rest
        self._keys[slots] = keys
        self._counts[slots] = 0
        self._index.insert(keys, slots)
        return slots

    def _make_room(self, needed: int) -> np.ndarray:
        """Batched Misra-Gries: subtract the smallest d that frees ``needed`` entries."""
        live_keys, live = self._index.items()
        counts = self._counts[live]
        d = int(counts.max()) if needed >= len(live) else int(np.partition(counts, needed - 1)[needed - 1])
        d = max(d, 1)
        self._counts[live] -= d
        gone = self._counts[live] <= 0
        gone_slots, gone_keys = live[gone], live_keys[gone]
        trainable = counts[gone] >= self.min_count
        self._index.delete(gone_keys)
        self._counts[gone_slots] = 0
        self._free.append(gone_slots)
        self.evictions += len(gone_slots)
        return gone_keys[trainable]

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, counts) of every counted key, sorted by key (for checkpoints)."""
        keys, slots = self._index.items()
        order = np.argsort(keys)
        return keys[order], self._counts[slots[order]].copy()

    def load(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Add saved (keys, counts) to an empty table."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if len(keys):
            self.add(keys[:self.capacity], np.asarray(counts, dtype=np.int64)[:self.capacity])
