"""The vocabulary's word -> slot index over token spans, in compiled code.

``OnlineVocab`` (``online.learner.vocab``) indexes words by their bytes. A Python dict would
cost a string and a dict look-up per token; this is an open-addressing table (linear probing,
power-of-two size, load <= 1/2) of slots, probed with each span's ``span_hash``
(``online.learner.spans``) and confirmed by comparing the bytes, which live in one arena
(``arena[offset[s]:offset[s] + length[s]]`` for slot ``s``). A mini-batch's look-ups, the
de-duplication of its new words and their insertion each take one compiled call. Words are
removed only by a Misra-Gries eviction, which rebuilds the table and compacts the arena
(``rebuild``), at a cost in line with the eviction's own pass over every count.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_FIB = np.uint64(0x9E3779B97F4A7C15)


@njit(inline="always")
def _home(h, shift):
    return np.int64((h * _FIB) >> shift)


@njit(inline="always")
def _same(a, a_start, b, b_start, n):
    for k in range(n):
        if a[a_start + k] != b[b_start + k]:
            return False
    return True


@njit(nogil=True, cache=True)
def lookup(tslot, thash, shift, arena, offset, length, buf, start, span_length, hashes, out):
    """Slot of every span (-1 when absent); returns how many are absent."""
    mask = tslot.shape[0] - 1
    missing = 0
    for i in range(start.shape[0]):
        h = hashes[i]
        n = span_length[i]
        a = start[i]
        pos = _home(h, shift)
        found = -1
        while True:
            s = tslot[pos]
            if s < 0:
                break
            if thash[pos] == h and length[s] == n and _same(arena, offset[s], buf, a, n):
                found = s
                break
            pos = (pos + 1) & mask
        out[i] = found
        if found < 0:
            missing += 1
    return missing


@njit(nogil=True, cache=True)
def distinct_missing(buf, start, span_length, hashes, slots, n_missing, ordinal):
    """The distinct words among the spans with ``slots < 0``, in order of first occurrence:
    returns the index of each one's first span; ``ordinal[i]`` is span i's word among them."""
    size = 16
    while size < 2 * n_missing:
        size *= 2
    shift = np.uint64(64 - int(np.log2(size)))
    mask = size - 1
    table = np.full(size, -1, dtype=np.int64)
    first = np.empty(n_missing, dtype=np.int64)
    k = 0
    for i in range(start.shape[0]):
        if slots[i] >= 0:
            continue
        h = hashes[i]
        n = span_length[i]
        pos = _home(h, shift)
        while True:
            w = table[pos]
            if w < 0:
                table[pos] = k
                first[k] = i
                ordinal[i] = k
                k += 1
                break
            j = first[w]
            if hashes[j] == h and span_length[j] == n and _same(buf, start[j], buf, start[i], n):
                ordinal[i] = w
                break
            pos = (pos + 1) & mask
    return first[:k]


@njit(nogil=True, cache=True)
def insert(tslot, thash, shift, arena, used, offset, length, word_hash, buf, start, span_length, hashes,
           spans, slots):
    """Add the words of spans ``spans`` (absent, distinct) at ``slots``; returns the arena's new fill."""
    mask = tslot.shape[0] - 1
    for k in range(spans.shape[0]):
        i = spans[k]
        s = slots[k]
        n = span_length[i]
        a = start[i]
        for b in range(n):
            arena[used + b] = buf[a + b]
        offset[s] = used
        length[s] = n
        word_hash[s] = hashes[i]
        used += n
        pos = _home(hashes[i], shift)
        while tslot[pos] >= 0:
            pos = (pos + 1) & mask
        tslot[pos] = s
        thash[pos] = hashes[i]
    return used


@njit(nogil=True, cache=True)
def resolve_missing(slots, ordinal, new_slots):
    """Give the absent spans (-1; -2 marks a dropped one) their words' new slots (-1 for words
    that found no room)."""
    for i in range(slots.shape[0]):
        if slots[i] == -1:
            k = ordinal[i]
            slots[i] = new_slots[k] if k < new_slots.shape[0] else -1


@njit(nogil=True, cache=True)
def drop_slots(slots, gone):
    """Mark the spans whose slot is set in ``gone`` (uint8 per slot) with -2 (not counted)."""
    for i in range(slots.shape[0]):
        s = slots[i]
        if s >= 0 and gone[s]:
            slots[i] = -2


@njit(nogil=True, cache=True)
def rebuild(tslot, thash, shift, old_arena, new_arena, offset, length, word_hash, live):
    """Re-insert the ``live`` slots into an empty table, copying their bytes into ``new_arena``;
    returns its fill."""
    mask = tslot.shape[0] - 1
    used = 0
    for k in range(live.shape[0]):
        s = live[k]
        n = length[s]
        a = offset[s]
        for b in range(n):
            new_arena[used + b] = old_arena[a + b]
        offset[s] = used
        used += n
        h = word_hash[s]
        pos = _home(h, shift)
        while tslot[pos] >= 0:
            pos = (pos + 1) & mask
        tslot[pos] = s
        thash[pos] = h
    return used


@njit(nogil=True, cache=True)
def count_slots(slots, counts, seen, touched, old):
    """Add every span's occurrence to ``counts``; ``touched`` gets the distinct slots in order of
    first occurrence and ``old`` their counts before. ``seen`` (uint8 per slot) is left all zero."""
    k = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        if s < 0:
            continue
        if seen[s] == 0:
            seen[s] = 1
            touched[k] = s
            old[k] = counts[s]
            k += 1
        counts[s] += 1
    for j in range(k):
        seen[touched[j]] = 0
    return k


@njit(nogil=True, cache=True)
def settle(touched, old, counts, trainable, cluster_trainable, min_count, new, crossed):
    """After ``count_slots``: new counts, trainability (local count >= min_count or the cluster's
    verdict), the slots that crossed into it; returns (crossed, change of the trainable total)."""
    n_crossed = 0
    delta = 0
    for j in range(touched.shape[0]):
        s = touched[j]
        c = counts[s]
        new[j] = c
        was = trainable[s]
        now = c >= min_count or cluster_trainable[s]
        trainable[s] = now
        if now:
            if was:
                delta += c - old[j]
            else:
                delta += c
                crossed[n_crossed] = s
                n_crossed += 1
    return n_crossed, delta


@njit(nogil=True, cache=True)
def gather_bytes(arena, offset, length, slots, out):
    """The bytes of ``slots``' words, one after the other (to decode them in one call)."""
    used = 0
    for k in range(slots.shape[0]):
        s = slots[k]
        a = offset[s]
        for b in range(length[s]):
            out[used + b] = arena[a + b]
        used += length[s]
    return used
