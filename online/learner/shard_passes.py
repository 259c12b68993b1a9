"""A server shard's row passes for the replica exchange, compiled: add a sync's deltas, answer rows.

Why compiled: a sync's rows arrive a few thousand at a time, about two rows per five tokens trained, and in
numpy each request takes six fancy-indexed temporaries: the rows gathered, the deltas added and scattered back,
a boolean copy of the deltas to find the rows that moved, the rows and their accumulators gathered again and
stacked into the answer, about 0.8 µs of a server's CPU per token trained. One pass per row reads each value
once and writes the answer in its wire layout (about 0.3 µs per token).

Layout (``online.learner.embedding_shard``): ``vectors`` [rows, dim] float32; ``accum`` the optimizer's
accumulators, [rows, 1] (row-wise AdaGrad), [rows, dim] (AdaGrad) or [0, dim] (SGD: none). A wire row is
``dim`` values, then the row's mean accumulator. Keys within one request are distinct, so no row repeats.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(inline="always")
def row_accumulator(accum, r):
    """Row ``r``'s accumulator as the wire carries it: the mean of its columns (0 without an optimizer state)."""
    a = np.float32(0.0)
    if accum.shape[0] > 0:
        width = accum.shape[1]
        for c in range(width):
            a += accum[r, c]
        a /= np.float32(width)
    return a


@njit(nogil=True, cache=True)
def add_rows(vectors, accum, rows, deltas, acc_deltas, moved, out):
    """vectors[rows[i]] += deltas[i]; each accumulator column += acc_deltas[i]; ``moved[i]``: anything of the
    two was non-zero (a zero delta is a replica refreshing a row, not a change to stamp). With room in ``out``
    (n rows, not 0), also the answer of ``answer_rows``, while the row is in cache."""
    dim = vectors.shape[1]
    has_acc = accum.shape[0] > 0
    width = accum.shape[1]
    answer = out.shape[0] > 0
    for i in range(rows.shape[0]):
        r = rows[i]
        nonzero = 0
        for d in range(dim):
            x = deltas[i, d]
            v = vectors[r, d] + x
            vectors[r, d] = v
            nonzero |= x != 0
            if answer:
                out[i, d] = v
        a = acc_deltas[i]
        if has_acc:
            for c in range(width):
                accum[r, c] += a
        if answer:
            out[i, dim] = row_accumulator(accum, r)
        moved[i] = nonzero != 0 or a != 0


@njit(nogil=True, cache=True)
def answer_rows(vectors, accum, rows, out):
    """out[i] = (the row ``rows[i]``, its mean accumulator; 0 without one): the answer to a sync."""
    dim = vectors.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for d in range(dim):
            out[i, d] = vectors[r, d]
        out[i, dim] = row_accumulator(accum, r)

