"""The replica's two row passes, compiled: take the deltas to send, merge the servers' answer.

Why compiled: with numpy each pass would be six fancy-indexed temporaries over the synced rows, and the
host's shard lock is held throughout, so the other worker processes of the host wait in their
batch preparation meanwhile. One pass per row reads each value once, which is also the right
reading of a row a kernel may still be writing (hogwild): the value sent and the new base are the
same number.

Layout (``online.cluster.replica.ReplicaShard``): ``vectors``/``base`` [rows, dim] float32; ``accum``
the optimizer's accumulators, [rows, 1] (row-wise AdaGrad), [rows, dim] (AdaGrad) or [0, dim] (SGD: none);
``base_acc`` [rows, 1], the accumulator's mean the servers last confirmed. The wire row is
[dim deltas or values, then the accumulator's].
"""
from __future__ import annotations

import numpy as np
from numba import njit

from online.learner.shard_passes import row_accumulator


@njit(nogil=True, cache=True)
def take_deltas(vectors, accum, base, base_acc, contraction, rows, out):
    """out[i] = (row - base, mean accumulator - base_acc[, contraction]) of ``rows[i]``; then base = what was
    sent and the contraction restarts, so the next collect sends only what is trained after this one. The
    contraction column is written when ``out`` has room for it (dim + 2 columns)."""
    dim = vectors.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for d in range(dim):
            v = vectors[r, d]
            out[i, d] = v - base[r, d]
            base[r, d] = v
        a = row_accumulator(accum, r)
        out[i, dim] = a - base_acc[r, 0]
        base_acc[r, 0] = a
        if out.shape[1] > dim + 1:
            out[i, dim + 1] = contraction[r]
            contraction[r] = 0.0


@njit(nogil=True, cache=True)
def merge_answer(vectors, accum, base, base_acc, rows, merged):
    """row += S - base and base = S for the servers' merged values ``merged[i]`` of ``rows[i]``: the other
    workers' contributions come in, and what this replica trained since the collect stays on top. The
    accumulator's increment is added to each of its columns."""
    dim = vectors.shape[1]
    has_acc = accum.shape[0] > 0
    width = accum.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for d in range(dim):
            m = merged[i, d]
            vectors[r, d] += m - base[r, d]
            base[r, d] = m
        m = merged[i, dim]
        if has_acc:
            inc = m - base_acc[r, 0]
            for c in range(width):
                accum[r, c] += inc
        base_acc[r, 0] = m


@njit(nogil=True, cache=True)
def large_deltas(vectors, base, rows, share, out):
    """out[i] = |row - base| >= share * |row| for ``rows[i]``: a delta large enough to send now (the rest wait
    and grow: ``ReplicaShard.collect_parts``)."""
    dim = vectors.shape[1]
    s2 = share * share
    for i in range(rows.shape[0]):
        r = rows[i]
        dd = 0.0
        vv = 0.0
        for d in range(dim):
            v = vectors[r, d]
            x = v - base[r, d]
            dd += x * x
            vv += v * v
        out[i] = dd >= s2 * vv


@njit(nogil=True, cache=True)
def unsent_rows(vectors, base, confirmed, n):
    """The rows among the first ``n`` whose value differs from their base though confirmed: what a flush must
    send besides the stamped rows (the remainders of int8 deltas, ``online.cluster.delta_wire``)."""
    dim = vectors.shape[1]
    out = np.empty(n, dtype=np.int64)
    k = 0
    for r in range(n):
        if not confirmed[r]:
            continue
        for d in range(dim):
            if vectors[r, d] != base[r, d]:
                out[k] = r
                k += 1
                break
    return out[:k]
