"""The replica's two row passes, compiled: take the deltas to send, merge the servers' answer.

Why compiled: with numpy each pass was six fancy-indexed temporaries over the synced rows, and the
host's shard lock is held throughout, so the other worker processes of the host wait in their
batch preparation meanwhile. One pass per row reads each value once, which is also the right
reading of a row a kernel may still be writing (hogwild): the value sent and the new base are the
same number.

Layout (``online.cluster.replica.ReplicaShard``): ``vectors``/``base`` [rows, dim] float32; ``accum``
the optimizer's accumulators, [rows, 1] (row-wise AdaGrad), [rows, dim] (AdaGrad) or [0, dim] (SGD: none);
``base_acc`` [rows, 1], the accumulator's mean the servers last confirmed; ``seen`` [rows] float64, the row's
cumulative contraction ``K`` on the servers when ``base`` was set (``online.learner.concurrent_merge``, the base
rule).

The wire (``CMD_DELTA``, float32 values): a replica sends per key [dim deltas, the accumulator's, the contraction,
the base's K as the two halves of a float64] (``dim + WIRE_EXTRA``); the servers answer [dim values, the
accumulator, K as two halves] (``dim + ANSWER_EXTRA``). K is a float64 carried bit for bit, because it only
grows and only differences of it matter: a float32 would round a hot row's K of 10^5 to 0.01.
"""
from __future__ import annotations

import numpy as np
from numba import njit

WIRE_EXTRA = 4     # columns after a delta's dim values: accumulator, contraction, K (two float32 halves)
ANSWER_EXTRA = 3   # columns after an answer's dim values: accumulator, K (two float32 halves)


def put_seen(out: np.ndarray, seen: np.ndarray) -> None:
    """Write the float64 ``seen`` into the last two float32 columns of ``out``, bit for bit."""
    out[:, -2:] = np.ascontiguousarray(seen, dtype=np.float64).view(np.float32).reshape(-1, 2)


def answer_seen(answer: np.ndarray, dim: int) -> np.ndarray:
    """The float64 K carried in columns ``dim + 1`` and ``dim + 2`` of a servers' answer; 0 (nothing to discount)
    for an answer without it (``dim + 1`` columns, from a server that does not keep K)."""
    if answer.shape[1] < dim + ANSWER_EXTRA:
        return np.zeros(answer.shape[0], np.float64)
    return np.ascontiguousarray(answer[:, dim + 1:dim + 3], dtype=np.float32).view(np.float64).reshape(-1)


def seen_column(vals: np.ndarray, at: int) -> np.ndarray:
    """The float64 K carried in columns ``at`` and ``at + 1`` of a replica's deltas."""
    return np.ascontiguousarray(vals[:, at:at + 2], dtype=np.float32).view(np.float64).reshape(-1)


@njit(nogil=True, cache=True)
def take_deltas(vectors, accum, base, base_acc, contraction, rows, out):
    """out[i] = (row - base, mean accumulator - base_acc[, contraction]) of ``rows[i]``; then base = what was
    sent and the contraction restarts, so the next collect sends only what is trained after this one. The
    contraction column is written when ``out`` has room for it (dim + 2 columns)."""
    dim = vectors.shape[1]
    has_acc = accum.shape[0] > 0
    width = accum.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for d in range(dim):
            v = vectors[r, d]
            out[i, d] = v - base[r, d]
            base[r, d] = v
        a = np.float32(0.0)
        if has_acc:
            for c in range(width):
                a += accum[r, c]
            a /= np.float32(width)
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
