"""HogBatch: the in-place SGNS kernel with one set of negatives per window (``LIVEVEC_KERNEL=hogbatch``).

Why. ``sgns_kernel.train_inplace_rows`` (word2vec.c's order) trains each (context, centre) pair against the
centre's output row and ``negative`` negatives of its own: about 6 random output rows per pair, each a row of a
matrix larger than the caches. The kernel waits on those loads more than it computes (see its docstring).
HogBatch (Ji et al. 2016, "Parallelizing Word2Vec in shared and distributed memory"; Intel's pWord2Vec) draws
the negatives once per centre word and shares them among the centre's context words, so a window of m
context words costs 1 + N random rows instead of m (1 + N), and the m x (1 + N) dot products become one small
dense block (level-3 work instead of m level-1 passes over rows that come from memory).

Maths. For centre word w (output row v_0 = v_w, label y_0 = 1) with negatives n_1..n_N (v_k, y_k = 0) and
context words c_1..c_m (input rows u_j), the window's loss is the sum over the block of the SGNS terms

    L = -sum_j [log s(u_j . v_0) + sum_k log s(-u_j . v_k)],     f_jt = u_j . v_t,  g_jt = y_t - s(f_jt),

and its gradients are dL/dv_t = -sum_j g_jt u_j, dL/du_j = -sum_t g_jt v_t. All of f, g and both sums are
computed from the rows as they were when the window started, and each row takes ONE step per window, by the
optimizer's rule, along minus its summed gradient (word2vec.c's g, which moves along +g):

    v_t += rate_t * sum_j g_jt u_j,      u_j += rate_j * sum_t g_jt v_t.

Row-wise AdaGrad (the default) accumulates the squared norm of the step's gradient, h += |sum_j g_jt u_j|^2 /
dim, once per window, where the pairs kernel adds m per-pair terms; per-coordinate AdaGrad likewise adds the
summed gradient's squares; SGD moves at ``eta``. Between windows it is hogwild and in place, as the pairs
kernel: the next centre sees this window's updates (its context rows overlap this window's).

Its rate. Under an AdaGrad a row's travel over a pass grows about as the square root of its number of steps, and
a row here takes one step per window where the pairs kernel gives it one per pair (m of them), so at the same
``eta`` it learns more slowly; at twice the rate (``trainer.KERNEL_ETA_SCALE``) it matches the pairs kernel on
analogy and WS353. With SGD the summed step is the sum of the pair steps.

Draws. The window reduction b and the negatives come from the same generator (``_lcg``, ``_draw``) in the same
order as the pairs kernel's; the first context's N draws are the window's shared negatives, the other (m - 1) N
are stepped over in one jump (``_jumps``). So both kernels train exactly the same windows and pairs, and a
comparison of the two isolates the batching from the sampling.

Speed. The window's work is 3 m (1 + N) passes over d plus a step per row, all in L1 (``window_passes``): what
costs is the shape of each pass, so the kernel is written for the compiler (``train_hogbatch_rows`` says how).
Design: docs/design/0002-kernels.md
"""
from __future__ import annotations

import numpy as np
from numba import njit

from online.learner.sgns_kernel import (_LCG_ADD, _LCG_MUL, OPT_ADAGRAD, OPT_ROW_ADAGRAD, _ONE32, _ZERO32, _draw,
                                        _lcg, _next_sentence, _pair_loss, _prefetch, _prefetch_row, _sigmoid32)
from online.learner.window_passes import (dot, dots6, dots12, step, step2_row_adagrad, sum6x2, sum_rows,
                                          sum_rows_x2)

BLOCK = 6                # targets per pass of the dots: the centre and N = 5 negatives, the default
DIM_COMPILED = 100       # the d compiled as a constant (other d run the same code with d read at run time)


@njit(inline="always")
def _jumps(n):
    """(A_k, C_k) for k = 0..n: k steps of the generator are s -> A_k s + C_k (mod 2^64)."""
    mul = np.empty(n + 1, dtype=np.uint64)
    add = np.empty(n + 1, dtype=np.uint64)
    mul[0] = np.uint64(1)
    add[0] = np.uint64(0)
    for k in range(1, n + 1):
        mul[k] = mul[k - 1] * _LCG_MUL
        add[k] = add[k - 1] * _LCG_MUL + _LCG_ADD
    return mul, add


@njit(inline="always")
def _plan_window(i, lo, hi, window, negative, out_rows, noise_rows, state, targets, buf, jump_mul, jump_add):
    """Centre ``i``'s reduced window and its targets into ``targets[buf]``: the centre's output row first, then
    the shared negatives. Returns (j0, j1, targets held, state). Per centre the generator draws the window, then
    ``negative`` draws for each of its m contexts, as the pairs kernel does: the first context's N are the shared
    negatives (-1 entries and draws equal to the positive skipped, as there), the other (m - 1) N are stepped
    over in one jump (the generator's k-step map, s -> A_k s + C_k, ``_jumps``)."""
    state = _lcg(state)
    b = np.int64(state % np.uint64(window))
    reach = window - b
    j0 = max(lo, i - reach)
    j1 = min(hi, i + reach + 1)
    m = j1 - j0 - 1
    word_out = out_rows[i]
    targets[buf, 0] = word_out
    nt = 1
    n_noise = noise_rows.shape[0]
    if m > 0 and n_noise > 0 and negative > 0:
        for k in range(negative):
            state = _lcg(state)
            t = np.int64(noise_rows[_draw(state, n_noise)])
            if t >= 0 and t != word_out:
                targets[buf, nt] = t
                nt += 1
        skip = (m - 1) * negative          # the pairs kernel's draws for the other contexts
        state = state * jump_mul[skip] + jump_add[skip]
    return j0, j1, nt, state


@njit(inline="always")
def _prefetch_with_acc(mat, acc, r, optimizer):
    """Row ``r`` of ``mat`` and what the optimizer reads of its accumulator (one entry, or the row)."""
    _prefetch_row(mat, r)
    if optimizer == OPT_ROW_ADAGRAD:
        _prefetch(acc, r, 0)
    elif optimizer == OPT_ADAGRAD:
        _prefetch_row(acc, r)


@njit(inline="always")
def _prefetch_window(syn0, syn1, acc0, acc1, in_rows, targets, buf, nt, nj0, nj1, ni, j0, j1, i, optimizer):
    """Prefetch the next window's target rows and the context rows the current window does not hold (with
    their accumulators): they arrive while the current window computes."""
    for t in range(nt):
        _prefetch_with_acc(syn1, acc1, targets[buf, t], optimizer)
    for j in range(nj0, nj1):
        if j == ni or (j0 <= j < j1 and j != i):
            continue
        _prefetch_with_acc(syn0, acc0, in_rows[j], optimizer)


def train_hogbatch_rows(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows,
                        window, negative, eta, optimizer, seed, touched, curv, loss):
    """Train every window of the batch in place, HogBatch's way; return the pair count (context words trained).

    The arguments, ``touched``, ``curv`` and ``loss`` are those of ``sgns_kernel.train_inplace_rows`` (one may
    replace the other). Per window, three steps over a block small enough to stay in L1 (m <= 2 window
    context rows, 1 + N target rows, 400 B each at d=100):

    1. for each context j, f_jt for every target t from the old rows (six targets a pass, two contexts where
       no side output is asked), g_jt kept, and the context's gradient sum_t g_jt v_t (old v_t) into a buffer,
       with its norm: a target row comes from memory for j = 1 only;
    2. for each target t, sum_j g_jt u_j (old u_j: the contexts have not moved; two targets a pass where no side
       output is asked), then its one step;
    3. each context's one step along its buffered gradient.

    ``curv`` (length 0: off) gets, for a target row, rate * sum_j s'(f_jt) |u_j|^2 and, for a context row,
    rate * sum_t s'(f_jt) |v_t|^2: the pairs kernel's contraction summed over the window, with the rate of
    the row's one step. ``loss`` (length >= 2) samples every 32nd window: loss[0] += all its m (1 + N) terms,
    loss[1] += m (pairs).

    Written for the compiler:
    - d = 100 (the default) is compiled as a constant, so every pass is six 16-float vectors and a tail of 4,
      unrolled, where a run-time d leaves each pass a vector loop, a narrower epilogue loop and a scalar one;
    - rows are read as ``mat[r, d]``, never as ``mat[r]``: a row view is a reference-counted object, and each one
      costs an atomic increment and decrement;
    - the dots take one context against six targets a pass (six independent sums hide the adds' latency, the context
      row is loaded once), and the gradient sums take up to six rows a pass with the AdaGrad norm of the finished
      sum folded into the last one, so the sum is read and written once;
    - where the window needs no side output (no contraction, no sampled loss: a hogbatch replica, ``livevec
      train``), two contexts share a pass of the dots and of their gradient sums, and two targets share a pass of
      theirs: a pass is bound by its loads (the rows are 400 B apart, so most 64 B vectors straddle two cache
      lines), and each row loaded serves two sums. Nothing is written to a row before every sum is taken, so the
      order is the same maths.

    The two d's are two compiled functions, so a process compiles only the one it uses: each takes about 15 s on
    a cold cache (``trainer.warm_up`` compiles it before a worker joins its cluster).
    """
    kernel = _train_d100 if syn0.shape[1] == DIM_COMPILED else _train_any_d
    return kernel(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows, window, negative, eta, optimizer,
                  seed, touched, curv, loss)


@njit(nogil=True, fastmath=True, cache=True)
def _train_d100(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows, window, negative, eta, optimizer,
                seed, touched, curv, loss):
    return _train_windows(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows, window, negative, eta,
                          optimizer, seed, touched, curv, loss, DIM_COMPILED)


@njit(nogil=True, fastmath=True, cache=True)
def _train_any_d(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows, window, negative, eta, optimizer,
                 seed, touched, curv, loss):
    return _train_windows(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows, window, negative, eta,
                          optimizer, seed, touched, curv, loss, syn0.shape[1])


@njit(inline="always")
def _train_windows(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows, window, negative, eta,
                   optimizer, seed, touched, curv, loss, dim):
    """``train_hogbatch_rows`` for one d: a constant where the caller passes one (see the module docstring)."""
    max_ctx = 2 * window
    max_t = negative + 1
    width = -(-max_t // BLOCK) * BLOCK                     # the targets padded to whole blocks of the dots
    targets = np.empty((2, width), dtype=np.int64)         # [buffer, target]: the centre's row, the negatives
    ctx = np.empty(max_ctx + 1, dtype=np.int64)             # + 1: an odd count's padding
    sig = np.empty((max_ctx, width), dtype=np.float32)     # f_jt, then s(f_jt)
    gct = np.zeros((max_ctx, width), dtype=np.float32)     # g_jt, by context (0 for the padding)
    gtc = np.empty((width, max_ctx + 1), dtype=np.float32) # g_jt, by target
    grad_in = np.empty((max_ctx, dim), dtype=np.float32)   # sum_t g_jt v_t per context
    nn_in = np.empty(max_ctx, dtype=np.float32)            # and its squared norm
    grad_out = np.empty((2, dim), dtype=np.float32)        # sum_j g_jt u_j for the target(s) at hand
    uu = np.zeros(max_ctx, dtype=np.float32)               # |u_j|^2 and |v_t|^2: the contraction only
    vv = np.zeros(width, dtype=np.float32)
    jump_mul, jump_add = _jumps(max_ctx * max(negative, 1))
    state = np.uint64(seed) * np.uint64(2654435761) + np.uint64(1)
    n_sent = starts.shape[0] - 1
    pairs = 0
    windows = 0
    eta32 = np.float32(eta)
    inv_dim = np.float32(1.0 / dim)
    track = curv.shape[0] > 0
    sample_loss = loss.shape[0] >= 2
    s = _next_sentence(starts, 0)
    if s >= n_sent:
        return 0
    i = starts[s]
    cur = 0
    j0, j1, nt, state = _plan_window(i, starts[s], starts[s + 1], window, negative, out_rows, noise_rows, state,
                                     targets, cur, jump_mul, jump_add)
    while True:
        hi = starts[s + 1]
        ni = i + 1
        ns = s if ni < hi else _next_sentence(starts, s + 1)
        more = ns < n_sent
        nj0 = nj1 = nnt = 0
        if more:      # the next window's draws now, and its rows on their way while this one computes
            nj0, nj1, nnt, state = _plan_window(ni, starts[ns], starts[ns + 1], window, negative, out_rows,
                                                noise_rows, state, targets, 1 - cur, jump_mul, jump_add)
            _prefetch_window(syn0, syn1, acc0, acc1, in_rows, targets, 1 - cur, nnt, nj0, nj1, ni, j0, j1, i,
                             optimizer)
        m = 0
        for j in range(j0, j1):
            if j != i:
                ctx[m] = in_rows[j]
                m += 1
        if m > 0:
            sample = sample_loss and (windows & 31) == 0
            windows += 1
            tg = targets[cur]
            padded = -(-nt // BLOCK) * BLOCK
            for t in range(nt, padded):                    # the padding: a real row, weight 0
                tg[t] = tg[0]
            if track:
                for t in range(nt):
                    vv[t] = dot(syn1, tg[t], syn1, tg[t], dim)
            # 1. the block of f's from the old rows; each context's gradient against the old targets
            c = 0
            if padded == BLOCK and not track and not sample:
                while c + 1 < m:       # two contexts a pass: each target row loaded once for both
                    dots12(syn0, ctx[c], ctx[c + 1], syn1, tg, 0, sig, c, dim)
                    for cc in range(c, c + 2):
                        for t in range(nt):
                            sg = _sigmoid32(sig[cc, t])
                            sig[cc, t] = sg
                            g = (_ONE32 if t == 0 else _ZERO32) - sg
                            gct[cc, t] = g
                            gtc[t, cc] = g
                        for t in range(nt, BLOCK):     # the padding's weight (a last window's g is there)
                            gct[cc, t] = _ZERO32
                    nn_in[c], nn_in[c + 1] = sum6x2(grad_in, c, syn1, tg, gct, c, dim)
                    c += 2
            for c in range(c, m):
                l1 = ctx[c]
                if track:
                    uu[c] = dot(syn0, l1, syn0, l1, dim)
                for k in range(0, padded, BLOCK):
                    dots6(syn0, l1, syn1, tg, k, sig, c, dim)
                for t in range(nt):
                    f = sig[c, t]
                    sg = _sigmoid32(f)
                    sig[c, t] = sg
                    g = (_ONE32 if t == 0 else _ZERO32) - sg
                    gct[c, t] = g
                    gtc[t, c] = g
                    if sample:
                        loss[0] += _pair_loss(f, 1.0 if t == 0 else 0.0)
                nn_in[c] = sum_rows(grad_in, c, syn1, tg, gct, c, nt, dim)
            # 2. each target's one step along sum_j g_jt u_j (the contexts' old rows)
            t = 0
            if not track:         # two targets a pass: each context row loaded once for both
                me = m
                if m & 1:         # an odd count (a sentence's edge): one more context of weight 0
                    ctx[m] = ctx[0]
                    for q in range(nt):
                        gtc[q, m] = _ZERO32
                    me = m + 1
                while t + 1 < nt:
                    nn0, nn1 = sum_rows_x2(grad_out, syn0, ctx, gtc, t, me, dim)
                    r = tg[t]
                    step(syn1, acc1, r, grad_out, 0, nn0, eta32, inv_dim, optimizer, dim)
                    touched[r] = 1
                    r = tg[t + 1]
                    step(syn1, acc1, r, grad_out, 1, nn1, eta32, inv_dim, optimizer, dim)
                    touched[r] = 1
                    t += 2
            for t in range(t, nt):
                r = tg[t]
                nn = sum_rows(grad_out, 0, syn0, ctx, gtc, t, m, dim)
                rate = step(syn1, acc1, r, grad_out, 0, nn, eta32, inv_dim, optimizer, dim)
                touched[r] = 1
                if track:
                    a = _ZERO32
                    for c in range(m):
                        a += sig[c, t] * (_ONE32 - sig[c, t]) * uu[c]
                    curv[r] += rate * a
            # 3. each context's one step along sum_t g_jt v_t
            c = 0
            if not track and optimizer == OPT_ROW_ADAGRAD:
                while c + 1 < m:
                    step2_row_adagrad(syn0, acc0, ctx[c], ctx[c + 1], grad_in, c, nn_in[c], nn_in[c + 1], eta32,
                                      inv_dim, dim)
                    touched[ctx[c]] = 1
                    touched[ctx[c + 1]] = 1
                    c += 2
            for c in range(c, m):
                l1 = ctx[c]
                rate = step(syn0, acc0, l1, grad_in, c, nn_in[c], eta32, inv_dim, optimizer, dim)
                touched[l1] = 1
                if track:
                    a = _ZERO32
                    for t in range(nt):
                        a += sig[c, t] * (_ONE32 - sig[c, t]) * vv[t]
                    curv[l1] += rate * a
            if sample:
                loss[1] += m
            pairs += m
        if not more:
            break
        i, s, j0, j1, nt, cur = ni, ns, nj0, nj1, nnt, 1 - cur
    return pairs
