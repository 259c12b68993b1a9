"""The dense passes over d of a HogBatch window (``hogbatch_kernel``): the dots, the gradient sums and the steps.

Why a module of their own: they are where the kernel's time goes, and each is written for what the compiler
makes of it (``hogbatch_kernel``'s docstring has the measurements). Every pass reads rows as ``mat[r, d]``
(a row view ``mat[r]`` is a reference-counted object: an atomic increment and decrement per view), keeps its
sums in scalars the compiler holds in vector registers, and runs over a ``dim`` the caller passes, a constant
where the caller has one, so the loop is unrolled into whole vectors. The gradient sums return the squared norm
of what they wrote (row-wise AdaGrad's h += |g|^2 / d), taken in the pass that finishes the sum, not in one more.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from online.learner.sgns_kernel import OPT_ADAGRAD, OPT_ROW_ADAGRAD, _ZERO32


@njit(inline="always")
def dot(mat, r, other, q, dim):
    """mat[r] . other[q]."""
    f = _ZERO32
    for d in range(dim):
        f += mat[r, d] * other[q, d]
    return f


@njit(inline="always")
def dots6(a, ra, b, rows, k, out, o, dim):
    """out[o, k + t] = a[ra] . b[rows[k + t]] for t < 6, in one pass over a[ra]."""
    r0 = rows[k]
    r1 = rows[k + 1]
    r2 = rows[k + 2]
    r3 = rows[k + 3]
    r4 = rows[k + 4]
    r5 = rows[k + 5]
    f0 = _ZERO32
    f1 = _ZERO32
    f2 = _ZERO32
    f3 = _ZERO32
    f4 = _ZERO32
    f5 = _ZERO32
    for d in range(dim):
        x = a[ra, d]
        f0 += x * b[r0, d]
        f1 += x * b[r1, d]
        f2 += x * b[r2, d]
        f3 += x * b[r3, d]
        f4 += x * b[r4, d]
        f5 += x * b[r5, d]
    out[o, k] = f0
    out[o, k + 1] = f1
    out[o, k + 2] = f2
    out[o, k + 3] = f3
    out[o, k + 4] = f4
    out[o, k + 5] = f5


@njit(inline="always")
def sum_rows(out, oi, mat, rows, w, wi, n, dim):
    """out[oi] = sum_k w[wi, k] mat[rows[k]] for k < n (n >= 1); returns |out[oi]|^2, the row-wise AdaGrad's
    norm, from the last pass over the finished sum. The first pass takes six rows, four, two or one, the later
    ones four, two or one, so a sum of 2 - 10 rows (window 5) takes one to three passes."""
    nn = _ZERO32
    if n >= 6:
        r0 = rows[0]
        r1 = rows[1]
        r2 = rows[2]
        r3 = rows[3]
        r4 = rows[4]
        r5 = rows[5]
        w0 = w[wi, 0]
        w1 = w[wi, 1]
        w2 = w[wi, 2]
        w3 = w[wi, 3]
        w4 = w[wi, 4]
        w5 = w[wi, 5]
        for d in range(dim):
            o = (w0 * mat[r0, d] + w1 * mat[r1, d] + w2 * mat[r2, d] + w3 * mat[r3, d] + w4 * mat[r4, d]
                 + w5 * mat[r5, d])
            out[oi, d] = o
            nn += o * o
        k = 6
    elif n >= 4:
        r0 = rows[0]
        r1 = rows[1]
        r2 = rows[2]
        r3 = rows[3]
        w0 = w[wi, 0]
        w1 = w[wi, 1]
        w2 = w[wi, 2]
        w3 = w[wi, 3]
        for d in range(dim):
            o = w0 * mat[r0, d] + w1 * mat[r1, d] + w2 * mat[r2, d] + w3 * mat[r3, d]
            out[oi, d] = o
            nn += o * o
        k = 4
    elif n >= 2:
        r0 = rows[0]
        r1 = rows[1]
        w0 = w[wi, 0]
        w1 = w[wi, 1]
        for d in range(dim):
            o = w0 * mat[r0, d] + w1 * mat[r1, d]
            out[oi, d] = o
            nn += o * o
        k = 2
    else:
        r0 = rows[0]
        w0 = w[wi, 0]
        for d in range(dim):
            o = w0 * mat[r0, d]
            out[oi, d] = o
            nn += o * o
        k = 1
    while n - k >= 4:
        r0 = rows[k]
        r1 = rows[k + 1]
        r2 = rows[k + 2]
        r3 = rows[k + 3]
        w0 = w[wi, k]
        w1 = w[wi, k + 1]
        w2 = w[wi, k + 2]
        w3 = w[wi, k + 3]
        nn = _ZERO32
        for d in range(dim):
            o = out[oi, d] + w0 * mat[r0, d] + w1 * mat[r1, d] + w2 * mat[r2, d] + w3 * mat[r3, d]
            out[oi, d] = o
            nn += o * o
        k += 4
    if n - k >= 2:
        r0 = rows[k]
        r1 = rows[k + 1]
        w0 = w[wi, k]
        w1 = w[wi, k + 1]
        nn = _ZERO32
        for d in range(dim):
            o = out[oi, d] + w0 * mat[r0, d] + w1 * mat[r1, d]
            out[oi, d] = o
            nn += o * o
        k += 2
    if k < n:
        r0 = rows[k]
        w0 = w[wi, k]
        nn = _ZERO32
        for d in range(dim):
            o = out[oi, d] + w0 * mat[r0, d]
            out[oi, d] = o
            nn += o * o
    return nn


@njit(inline="always")
def dots12(a, ra0, ra1, b, rows, k, out, o, dim):
    """out[o + i, k + t] = a[ra_i] . b[rows[k + t]], two contexts against six targets in one pass."""
    r0 = rows[k]
    r1 = rows[k + 1]
    r2 = rows[k + 2]
    r3 = rows[k + 3]
    r4 = rows[k + 4]
    r5 = rows[k + 5]
    f0 = _ZERO32
    f1 = _ZERO32
    f2 = _ZERO32
    f3 = _ZERO32
    f4 = _ZERO32
    f5 = _ZERO32
    e0 = _ZERO32
    e1 = _ZERO32
    e2 = _ZERO32
    e3 = _ZERO32
    e4 = _ZERO32
    e5 = _ZERO32
    for d in range(dim):
        x = a[ra0, d]
        y = a[ra1, d]
        v = b[r0, d]
        f0 += x * v
        e0 += y * v
        v = b[r1, d]
        f1 += x * v
        e1 += y * v
        v = b[r2, d]
        f2 += x * v
        e2 += y * v
        v = b[r3, d]
        f3 += x * v
        e3 += y * v
        v = b[r4, d]
        f4 += x * v
        e4 += y * v
        v = b[r5, d]
        f5 += x * v
        e5 += y * v
    out[o, k] = f0
    out[o, k + 1] = f1
    out[o, k + 2] = f2
    out[o, k + 3] = f3
    out[o, k + 4] = f4
    out[o, k + 5] = f5
    out[o + 1, k] = e0
    out[o + 1, k + 1] = e1
    out[o + 1, k + 2] = e2
    out[o + 1, k + 3] = e3
    out[o + 1, k + 4] = e4
    out[o + 1, k + 5] = e5


@njit(inline="always")
def sum6x2(out, oi, mat, rows, w, wi, dim):
    """out[oi + i] = sum_t w[wi + i, t] mat[rows[t]] for i = 0, 1 and six rows, in one pass (the rows loaded
    once for both); returns both squared norms."""
    r0 = rows[0]
    r1 = rows[1]
    r2 = rows[2]
    r3 = rows[3]
    r4 = rows[4]
    r5 = rows[5]
    w0 = w[wi, 0]
    w1 = w[wi, 1]
    w2 = w[wi, 2]
    w3 = w[wi, 3]
    w4 = w[wi, 4]
    w5 = w[wi, 5]
    q0 = w[wi + 1, 0]
    q1 = w[wi + 1, 1]
    q2 = w[wi + 1, 2]
    q3 = w[wi + 1, 3]
    q4 = w[wi + 1, 4]
    q5 = w[wi + 1, 5]
    n0 = _ZERO32
    n1 = _ZERO32
    for d in range(dim):
        v0 = mat[r0, d]
        v1 = mat[r1, d]
        v2 = mat[r2, d]
        v3 = mat[r3, d]
        v4 = mat[r4, d]
        v5 = mat[r5, d]
        o = w0 * v0 + w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4 + w5 * v5
        p = q0 * v0 + q1 * v1 + q2 * v2 + q3 * v3 + q4 * v4 + q5 * v5
        out[oi, d] = o
        out[oi + 1, d] = p
        n0 += o * o
        n1 += p * p
    return n0, n1


@njit(inline="always")
def sum_rows_x2(out, mat, rows, w, wi, n, dim):
    """out[i] = sum_k w[wi + i, k] mat[rows[k]] for i = 0, 1 and k < n (n even, >= 2): two targets' gradient
    sums in passes of four rows, then two, each row loaded once for both; returns both squared norms (from the
    last pass)."""
    n0 = _ZERO32
    n1 = _ZERO32
    if n >= 4:
        r0 = rows[0]
        r1 = rows[1]
        r2 = rows[2]
        r3 = rows[3]
        a0 = w[wi, 0]
        a1 = w[wi, 1]
        a2 = w[wi, 2]
        a3 = w[wi, 3]
        b0 = w[wi + 1, 0]
        b1 = w[wi + 1, 1]
        b2 = w[wi + 1, 2]
        b3 = w[wi + 1, 3]
        for d in range(dim):
            u0 = mat[r0, d]
            u1 = mat[r1, d]
            u2 = mat[r2, d]
            u3 = mat[r3, d]
            o = a0 * u0 + a1 * u1 + a2 * u2 + a3 * u3
            q = b0 * u0 + b1 * u1 + b2 * u2 + b3 * u3
            out[0, d] = o
            out[1, d] = q
            n0 += o * o
            n1 += q * q
        k = 4
    else:
        r0 = rows[0]
        r1 = rows[1]
        a0 = w[wi, 0]
        a1 = w[wi, 1]
        b0 = w[wi + 1, 0]
        b1 = w[wi + 1, 1]
        for d in range(dim):
            u0 = mat[r0, d]
            u1 = mat[r1, d]
            o = a0 * u0 + a1 * u1
            q = b0 * u0 + b1 * u1
            out[0, d] = o
            out[1, d] = q
            n0 += o * o
            n1 += q * q
        k = 2
    while n - k >= 4:
        r0 = rows[k]
        r1 = rows[k + 1]
        r2 = rows[k + 2]
        r3 = rows[k + 3]
        a0 = w[wi, k]
        a1 = w[wi, k + 1]
        a2 = w[wi, k + 2]
        a3 = w[wi, k + 3]
        b0 = w[wi + 1, k]
        b1 = w[wi + 1, k + 1]
        b2 = w[wi + 1, k + 2]
        b3 = w[wi + 1, k + 3]
        n0 = _ZERO32
        n1 = _ZERO32
        for d in range(dim):
            u0 = mat[r0, d]
            u1 = mat[r1, d]
            u2 = mat[r2, d]
            u3 = mat[r3, d]
            o = out[0, d] + a0 * u0 + a1 * u1 + a2 * u2 + a3 * u3
            q = out[1, d] + b0 * u0 + b1 * u1 + b2 * u2 + b3 * u3
            out[0, d] = o
            out[1, d] = q
            n0 += o * o
            n1 += q * q
        k += 4
    if n - k >= 2:
        r0 = rows[k]
        r1 = rows[k + 1]
        a0 = w[wi, k]
        a1 = w[wi, k + 1]
        b0 = w[wi + 1, k]
        b1 = w[wi + 1, k + 1]
        n0 = _ZERO32
        n1 = _ZERO32
        for d in range(dim):
            u0 = mat[r0, d]
            u1 = mat[r1, d]
            o = out[0, d] + a0 * u0 + a1 * u1
            q = out[1, d] + b0 * u0 + b1 * u1
            out[0, d] = o
            out[1, d] = q
            n0 += o * o
            n1 += q * q
    return n0, n1


@njit(inline="always")
def step(mat, acc, r, grad, gi, nn, eta32, inv_dim, optimizer, dim):
    """Row ``r``'s one step along grad[gi] (squared norm ``nn``) by the optimizer's rule; returns its rate."""
    if optimizer == OPT_ROW_ADAGRAD:
        h = acc[r, 0] + nn * inv_dim
        acc[r, 0] = h
        rate = eta32 / np.sqrt(h)
        for d in range(dim):
            mat[r, d] += rate * grad[gi, d]
        return rate
    elif optimizer == OPT_ADAGRAD:
        for d in range(dim):
            gd = grad[gi, d]
            h = acc[r, d] + gd * gd
            acc[r, d] = h
            mat[r, d] += eta32 * gd / np.sqrt(h)
        return eta32 / np.sqrt(acc[r, 0])
    for d in range(dim):
        mat[r, d] += eta32 * grad[gi, d]
    return eta32


@njit(inline="always")
def step2_row_adagrad(mat, acc, r0, r1, grad, gi, nn0, nn1, eta32, inv_dim, dim):
    """Rows r0 and r1 one row-wise AdaGrad step each, along grad[gi] and grad[gi + 1], in one pass. The same
    row twice (a word twice in a window) takes both steps in order, as two calls of ``step`` would: its second
    h includes the first's increment."""
    h = acc[r0, 0] + nn0 * inv_dim
    acc[r0, 0] = h
    rate0 = eta32 / np.sqrt(h)
    h = acc[r1, 0] + nn1 * inv_dim
    acc[r1, 0] = h
    rate1 = eta32 / np.sqrt(h)
    for d in range(dim):
        mat[r0, d] += rate0 * grad[gi, d]
        mat[r1, d] += rate1 * grad[gi + 1, d]
