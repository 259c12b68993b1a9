"""The parameter-server path of the SGNS maths (``LIVEVEC_EXCHANGE=pullpush`` and stock ps-lite workers).

The model, the loss and the roles are ``online.learner.sgns_kernel``'s, which also draws the windows and the
negatives the same way (``_lcg``, ``_draw``).

``walk_gradients``: the caller pulled the batch's rows once into compact
matrices (``plan_pairs`` draws the windows and negatives first, so the rows are
known before the pull). The kernel walks the pairs in order on a private copy of
those rows, moving it by plain SGD at a small local rate after every pair, and
sums the gradient met at each step; that sum is pushed once and the server's
optimizer (``embedding_shard``) applies it. Against one frozen snapshot the sum
would be a single mini-batch step, which is what ``batch_gradients`` computes: a
word seen for the first time then gets one step along the plain sum of its
contexts' output vectors, dominated by the function words around it, and lands
next to them rather than next to the word whose contexts it shares (the freshness
benchmark found the planted neighbour in about half its trials). Walking lets
the terms saturate as word2vec.c's per-pair updates do, so the new word's step
points at what is distinctive about its contexts.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from online.learner.sgns_kernel import _draw, _lcg, _pair_loss, _sigmoid


@njit(nogil=True, cache=True)
def plan_pairs(tokens, starts, noise_slots, window, negative, seed):
    """Draw the windows and negatives of a batch: (inputs, targets, negatives).

    tokens: int64 ids (any id space, e.g. vocabulary slots) of the kept tokens;
    returns pair_in[P] (context token id), pair_out[P] (centre token id) and
    negs[P, negative] (noise ids, -1 where the draw equalled the centre word).
    Same window rule, generator and draw (``_draw``) as ``train_inplace_rows``: on the
    same batch and seed, its negatives are the kernel's, as slots instead of rows.
    """
    state = np.uint64(seed) * np.uint64(2654435761) + np.uint64(1)
    n_noise = noise_slots.shape[0]
    cap = 0
    for s in range(starts.shape[0] - 1):
        n = starts[s + 1] - starts[s]
        cap += n * min(2 * window, max(n - 1, 0))
    pair_in = np.empty(cap, dtype=np.int64)
    pair_out = np.empty(cap, dtype=np.int64)
    negs = np.full((cap, negative), -1, dtype=np.int64)
    p = 0
    for s in range(starts.shape[0] - 1):
        lo = starts[s]
        hi = starts[s + 1]
        for i in range(lo, hi):
            state = _lcg(state)
            b = np.int64(state % np.uint64(window))
            reach = window - b
            for j in range(max(lo, i - reach), min(hi, i + reach + 1)):
                if j == i:
                    continue
                pair_in[p] = tokens[j]
                pair_out[p] = tokens[i]
                for k in range(negative):
                    if n_noise == 0:
                        break
                    state = _lcg(state)
                    t = np.int64(noise_slots[_draw(state, n_noise)])
                    if t != tokens[i]:
                        negs[p, k] = t
                p += 1
    return pair_in[:p], pair_out[:p], negs[:p]


@njit(nogil=True, fastmath=True, cache=True)
def batch_gradients(in_vecs, out_vecs, pair_in, pair_out, negs, grad_in, grad_out):
    """Loss of the pairs and its gradients against one snapshot of the rows.

    in_vecs/out_vecs: float32 [n_in, dim] / [n_out, dim] pulled rows; pair_in,
    pair_out, negs: local row indices (negs -1 = skip). Adds dL/d(row) into
    grad_in/grad_out (same shapes, zeroed by the caller) and returns the summed loss
    L = sum over pairs of -log s(u.v_pos) - sum_neg log s(-u.v_neg), computed with the
    exact sigmoid (no clipping) so that the finite-difference check holds everywhere.
    """
    dim = in_vecs.shape[1]
    loss = 0.0
    for p in range(pair_in.shape[0]):
        l1 = pair_in[p]
        for k in range(negs.shape[1] + 1):
            if k == 0:
                t = pair_out[p]
                label = 1.0
            else:
                t = negs[p, k - 1]
                if t < 0:
                    continue
                label = 0.0
            f = 0.0
            for d in range(dim):
                f += in_vecs[l1, d] * out_vecs[t, d]
            loss += _pair_loss(f, label)
            s = 1.0 / (1.0 + np.exp(-f))
            dldf = np.float32(s - label)
            for d in range(dim):
                grad_in[l1, d] += dldf * out_vecs[t, d]
                grad_out[t, d] += dldf * in_vecs[l1, d]
    return loss


@njit(nogil=True, fastmath=True, cache=True)
def walk_gradients(in_vecs, out_vecs, pair_in, pair_out, negs, rate, grad_in, grad_out):
    """The gradients met while walking the pairs in order with local SGD steps; returns the loss.

    Same arguments as ``batch_gradients`` plus ``rate``. in_vecs/out_vecs are not
    written: the walk moves private copies u, v. For pair p (input row i, targets t with
    labels y) and g_t = y - s(u_i . v_t) (word2vec.c's sign, clipped as in
    ``train_inplace_rows``):

        grad_out[t] += -g_t u_i,   v_t += rate g_t u_i          (for each target, old u_i)
        grad_in[i]  += -sum_t g_t v_t,   u_i += rate sum_t g_t v_t   (once, after the targets)

    so grad = (snapshot - walked copy) / rate: the gradient each row met along the walk.
    With rate 0 this is ``batch_gradients`` (up to the clipping). The loss is summed
    along the walk, before each step.
    """
    dim = in_vecs.shape[1]
    u = in_vecs.copy()
    v = out_vecs.copy()
    neu1e = np.zeros(dim, dtype=np.float32)
    rate32 = np.float32(rate)
    loss = 0.0
    for p in range(pair_in.shape[0]):
        l1 = pair_in[p]
        for d in range(dim):
            neu1e[d] = 0.0
        for k in range(negs.shape[1] + 1):
            if k == 0:
                t = pair_out[p]
                label = 1.0
            else:
                t = negs[p, k - 1]
                if t < 0:
                    continue
                label = 0.0
            f = np.float32(0.0)
            for d in range(dim):
                f += u[l1, d] * v[t, d]
            loss += _pair_loss(f, label)
            g = np.float32(label - _sigmoid(f))
            step = rate32 * g
            for d in range(dim):
                neu1e[d] += g * v[t, d]
                grad_out[t, d] -= g * u[l1, d]
                v[t, d] += step * u[l1, d]
        for d in range(dim):
            grad_in[l1, d] -= neu1e[d]
            u[l1, d] += rate32 * neu1e[d]
    return loss
