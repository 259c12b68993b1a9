"""CountSamples keeps only the rows that changed between samples; it must answer exactly what full
copies of the counts answered, through appends, growth, rollbacks and renumbered rows."""
from __future__ import annotations

import numpy as np
import pytest

from online.frontend.count_samples import CountSamples


class FullCopies:
    """The reference: a full copy of the counts per sample (what whats_new kept before), -1 for absent rows."""

    def __init__(self, keep: int):
        self.keep, self.samples = keep, []

    def add(self, t, counts):
        self.samples = (self.samples + [(t, counts.copy())])[-self.keep:]

    def remap(self, rows_in_old):
        out = []
        for t, c in self.samples:
            ok = (rows_in_old >= 0) & (rows_in_old < len(c))
            moved = np.full(len(rows_in_old), -1, c.dtype)
            moved[ok] = c[rows_in_old[ok]]
            out.append((t, moved))
        self.samples = out

    def then(self, when, current):
        chosen = next((s for s in reversed(self.samples) if s[0] <= when), None)
        partial = chosen is None
        t, then = self.samples[0] if partial else chosen
        then = then[:min(len(then), len(current))]
        present = np.flatnonzero(then >= 0)
        c_then = then[present]
        moved = current[present] != c_then
        return t, partial, present[moved], c_then[moved], int(c_then.sum())


@pytest.mark.parametrize("seed", range(6))
def test_sparse_samples_answer_as_full_copies(seed):
    rng = np.random.default_rng(seed)
    keep = int(rng.integers(1, 6))
    sparse, full = CountSamples(keep), FullCopies(keep)
    counts = rng.integers(0, 50, 200).astype(np.int64)
    for step in range(40):
        t = float(step)
        counts = counts.copy()                                   # a sync makes a new array
        touched = rng.choice(len(counts), int(rng.integers(0, 30)), replace=False)
        counts[touched] += rng.integers(1, 20, len(touched))
        if rng.random() < 0.1:                                   # a rollback lowers some counts
            counts[touched[:3]] = np.maximum(0, counts[touched[:3]] - 30)
        if rng.random() < 0.3:                                   # new words
            counts = np.concatenate([counts, rng.integers(1, 5, int(rng.integers(1, 10)))])
        if rng.random() < 0.15:                                  # a reload renumbers, drops and adds rows
            n = len(counts)
            rows_in_old = rng.permutation(n)[:n - int(rng.integers(0, 10))]
            rows_in_old = np.concatenate([rows_in_old, np.full(int(rng.integers(0, 5)), -1)])
            rng.shuffle(rows_in_old)
            sparse.remap(rows_in_old)
            full.remap(rows_in_old)
            counts = np.where(rows_in_old >= 0, counts[np.maximum(rows_in_old, 0)], 1).astype(np.int64)
        if rng.random() < 0.7:
            sparse.add(t, counts)
            full.add(t, counts)
        assert sparse.times() == [s[0] for s in full.samples]
        if not full.samples:
            assert sparse.then(t, counts) is None
            continue
        for when in (t, t - 1.5, t - 4, -10.0):
            got, want = sparse.then(when, counts), full.then(when, counts)
            assert got[:2] == want[:2]
            moved = counts[got[2]] != got[3]      # a row may be listed and be back at its count then
            got = got[:2] + (got[2][moved], got[3][moved], got[4])
            order = np.argsort(want[2])
            assert np.array_equal(got[2], want[2][order]) and np.array_equal(got[3], want[3][order])
            assert got[4] == want[4], (step, when)


def test_a_sample_holds_the_rows_that_changed_not_the_vocabulary():
    samples = CountSamples(31)
    counts = np.zeros(1_000_000, np.int64)
    for t in range(31):
        counts = counts.copy()
        counts[t * 1000:(t + 1) * 1000] += 1
        samples.add(float(t), counts)
    assert len(samples) == 31
    assert samples.nbytes() <= 30 * 1000 * 16              # full copies: 31 x 4 MB
