"""The counts at past moments, kept as what changed between them (``/v1/rising``).

A rise over a window is a word's count now minus its count at the window's start. A full
copy of the counts per sample would cost 4 bytes a word each: the 31 samples of a 10M-word
model would hold 1.2 GB, more than its int8 search codes. But counts only move where training
touched a row, so a sample keeps only the rows that changed before the next sample, with
their counts at its time (16 bytes a changed row). The newest sample is the served
snapshot's counts array itself, by reference: a sync never writes a published array, it
makes a new one.

A word's count at sample j is then its value in the first of samples j, j+1, ... that lists
it, else its count in the newest sample, and a word that no later sample lists did not move
since j. The total of all counts then (what ``lift`` divides by) is the total now minus the
rises. Rows that move (a removal or a full reload renumbers them) are renumbered here once
(``remap``); which rows existed at a sample's time is then kept as a mask.
"""
from __future__ import annotations

from collections import deque

import numpy as np


class CountSamples:
    """Up to ``keep`` samples (time, counts), oldest first; thread safety is the caller's."""

    def __init__(self, keep: int):
        self.keep = max(1, int(keep))
        # (time, present, rows, counts then): rows that changed between this sample and the next.
        # present: rows that existed then, a prefix length or (after a remap) a boolean mask
        self._older: deque[tuple[float, int | np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._newest: tuple[float, np.ndarray] | None = None   # its counts: -1 where a row did not exist
        self._newest_own = False                                # remapped: our array, not a snapshot's

    def __len__(self) -> int:
        return len(self._older) + (self._newest is not None)

    def times(self) -> list[float]:
        return [t for t, *_ in self._older] + ([self._newest[0]] if self._newest is not None else [])

    def nbytes(self) -> int:
        """Bytes these samples hold of their own (the newest one's array is the served snapshot's). Safe
        without the history's lock (``WhatsNew.nbytes``): it reads a copy of the list and one tuple."""
        own = sum(rows.nbytes + counts.nbytes + (present.nbytes if isinstance(present, np.ndarray) else 0)
                  for _, present, rows, counts in list(self._older))
        newest, newest_own = self._newest, self._newest_own
        return int(own + (newest[1].nbytes if newest_own and newest is not None else 0))

    def add(self, t: float, counts: np.ndarray) -> None:
        """A sample of ``counts`` (a snapshot's array, never written again) at time ``t``."""
        if self._newest is not None:
            t0, c0 = self._newest
            changed = _changed(c0, counts)
            self._older.append((t0, _present_of(c0), changed, c0[changed].copy()))
            while len(self._older) >= self.keep:
                self._older.popleft()
        self._newest, self._newest_own = (t, counts), False

    def remap(self, rows_in_old: np.ndarray) -> None:
        """Rows moved: new row r was old row ``rows_in_old[r]`` (-1: a new word)."""
        if self._newest is None:
            return
        kept = rows_in_old >= 0
        t, c = self._newest
        source = np.where(kept & (rows_in_old < len(c)), rows_in_old, -1)
        moved = np.full(len(rows_in_old), -1, dtype=c.dtype)
        ok = source >= 0
        moved[ok] = c[source[ok]]
        self._newest, self._newest_own = (t, moved), True
        old_n = max(len(c), int(rows_in_old.max()) + 1 if len(rows_in_old) else 0)
        new_of_old = np.full(old_n, -1, np.int64)
        new_of_old[rows_in_old[kept]] = np.flatnonzero(kept)
        remapped = deque()
        for t, present, rows, counts in self._older:
            was = np.zeros(len(rows_in_old), bool)
            if isinstance(present, np.ndarray):
                inside = kept & (rows_in_old < len(present))
                was[inside] = present[rows_in_old[inside]]
            else:
                was = kept & (rows_in_old < present)
            new_rows = new_of_old[rows[rows < old_n]]
            counts = counts[rows < old_n]
            stay = new_rows >= 0
            remapped.append((t, was, new_rows[stay], counts[stay]))
        self._older = remapped

    def then(self, when: float, current: np.ndarray) -> tuple[float, bool, np.ndarray, np.ndarray, int] | None:
        """The newest sample at or before ``when`` (else the oldest: ``partial``), against ``current``
        (the served counts): (its time, partial, the rows present then whose count moved since, their
        counts then, the total of all counts then over the rows present then and now)."""
        if self._newest is None:
            return None
        times = self.times()
        j = next((i for i in range(len(times) - 1, -1, -1) if times[i] <= when), None)
        partial = j is None
        j = 0 if partial else j
        t_newest, newest = self._newest
        m = min(len(newest), len(current))
        since_newest = np.flatnonzero(newest[:m] != current[:m])
        since_newest = since_newest[newest[since_newest] >= 0]
        later = list(self._older)[j:]
        rows = np.concatenate([rows for _, _, rows, _ in later] + [since_newest])
        counts = np.concatenate([counts for _, _, _, counts in later] + [newest[since_newest]]).astype(np.int64)
        rows, first = np.unique(rows, return_index=True)   # the first listing is the count at sample j
        counts = counts[first]
        if j < len(self._older):
            t_then, present = self._older[j][0], self._older[j][1]
        else:
            t_then, present = t_newest, _present_of(newest)
        inside = rows < len(current)
        rows, counts = rows[inside], counts[inside]
        mask = np.zeros(len(current), bool)
        if isinstance(present, np.ndarray):
            mask[:min(len(present), len(current))] = present[:len(current)]
        else:
            mask[:min(present, len(current))] = True
        keep = mask[rows]
        rows, counts = rows[keep], counts[keep]
        total = int(current[mask].sum()) - int((current[rows] - counts).sum())
        return t_then, partial, rows, counts, total


def _changed(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Rows of ``before`` (that existed then) whose count differs in ``after`` or that are gone."""
    m = min(len(before), len(after))
    rows = np.flatnonzero(before[:m] != after[:m])
    gone = np.arange(m, len(before), dtype=np.int64)
    rows = np.concatenate([rows, gone]) if len(gone) else rows
    return rows[before[rows] >= 0]


def _present_of(counts: np.ndarray) -> int | np.ndarray:
    """The rows that existed at a sample: all of them, or (after a remap) those not -1."""
    if len(counts) and counts.min() < 0:
        return counts >= 0
    return len(counts)
