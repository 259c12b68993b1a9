"""The skip-gram negative-sampling maths, compiled with numba (word2vec.c / yskip style).

Model. Every word w has an input vector u_w (syn0, key k) and an output vector v_w
(syn1neg, key k|1). For a centre word w at position i and a context word c at
position j (|i - j| <= b, with b drawn uniformly from 1..window per centre word, as
word2vec.c does), SGNS maximises

    log s(u_c . v_w) + sum_{n in N} log s(-u_c . v_n),      s(x) = 1 / (1 + e^-x),

with N = ``negative`` words drawn from the noise distribution (unigram^0.75). The roles
follow word2vec.c and gensim: the *context* word's input vector predicts the *centre*
word's output vector. With label y = 1 for w and 0 for the negatives and f = u_c . v_t,
the loss of one (input, target) term is L = -[y log s(f) + (1-y) log s(-f)] and

    dL/df = s(f) - y,      dL/dv_t = (s(f) - y) u_c,      dL/du_c = sum_t (s(f) - y) v_t.

word2vec.c writes g = (y - s(f)) (the negative of dL/df) and moves along +g; so do the
kernels below. As in word2vec.c, a negative equal to the positive target is skipped and
the input vector's update is accumulated over the 1 + N targets (``neu1e``) and applied
once, after the output vectors have been updated against the old input vector.

Optimizer. ``OPT_ADAGRAD`` is per-coordinate AdaGrad (Duchi et al. 2011), as in yskip:
for a gradient coordinate g, ``h += g^2; x -= eta * g / sqrt(h)``. It needs no corpus
length: each coordinate's step shrinks with its own accumulated gradient, so frequent
words anneal and a new word arriving late in the stream still learns at full speed.
``OPT_ROW_ADAGRAD`` (the default) keeps one accumulator per row: ``h += |g|^2 / dim;
x -= eta * g / sqrt(h)``. For an output row g = -(label - s) u, so |g|^2 costs one dot
product per pair (|u|^2 is shared by the 1 + N targets); it runs at 88 % of SGD's speed where per-coordinate
AdaGrad runs at 27 %, and keeps most of its quality. ``OPT_SGD`` is plain SGD at the rate ``eta`` the caller
passes (word2vec.c's schedule if the caller decays it); it exists to compare against gensim.

The in-process kernel, ``train_inplace_rows``, walks sentences of row indices and updates the shared matrices in
place after every pair, hogwild-style (no locks; concurrent threads may overwrite each other's coordinate
updates, which word2vec.c and gensim accept). In-place updates matter for quality: within a mini-batch a frequent
word takes part in hundreds of pairs, and summing those gradients against one stale copy of its row overshoots.
Its noise table holds output ROWS, so a negative costs one load; it draws one centre ahead and prefetches the
next pair's rows, since it waits on memory more than it computes. ``train_inplace`` is the same kernel for
callers that hold a table of slots and a slot -> row map. Design: docs/design/0002-kernels.md

The parameter-server path (``plan_pairs``, ``walk_gradients``) is ``online.learner.gradient_kernel``.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.core.extending import intrinsic

OPT_ADAGRAD = 0       # per-coordinate AdaGrad: accumulators [rows, dim]
OPT_SGD = 1
OPT_ROW_ADAGRAD = 2   # row-wise AdaGrad: one accumulator per row, [rows, 1]
MAX_EXP = 6.0   # word2vec.c clips f to [-6, 6]: s(f) is then within 0.25% of 0 or 1

# word2vec.c's linear congruential generator: cheap, deterministic, per-call state.
_LCG_MUL = np.uint64(25214903917)
_LCG_ADD = np.uint64(11)
_U16 = np.uint64(16)


@njit(inline="always")
def _lcg(state):
    return state * _LCG_MUL + _LCG_ADD


@njit(inline="always")
def _draw(state, n):
    """Entry of a table of ``n`` entries for the generator's ``state``: word2vec.c's
    ``(state >> 16) % n``, bits 16..63 of the state reduced modulo n (n is a prime by default,
    see ``online.learner.noise``, so the entry depends on all of them).

    The one place both kernels draw a negative. The multiply-shift ``((state >> 32) * n) >> 32``
    (the top 32 bits scaled to n, no division) is no faster with the row table (two threads, same
    batches, interleaved: 1.43M pairs/s against 1.50M) and draws another stream, so the modulo stays.
    """
    return np.int64((state >> _U16) % np.uint64(n))


@njit(inline="always")
def _sigmoid(f):
    if f > MAX_EXP:
        return 1.0
    if f < -MAX_EXP:
        return 0.0
    return 1.0 / (1.0 + np.exp(-f))


@njit(inline="always")
def _pair_loss(f, label):
    """-log s(f) for a positive, -log s(-f) for a negative, as log(1 + e^-x) in a form that cannot overflow."""
    x = -f if label == 1.0 else f
    if x > 0:
        return x + np.log1p(np.exp(-x))
    return np.log1p(np.exp(x))


@intrinsic
def _prefetch(typingctx, ary, row, col):
    """Hint the CPU to fetch the cache line of ``ary[row, col]`` (``llvm.prefetch``: read, keep in
    all cache levels, data). No load and no fault: an address outside the array is harmless."""
    if not (isinstance(ary, types.Array) and isinstance(row, types.Integer) and isinstance(col, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        aryty, rowty, colty = signature.args
        array = context.make_array(aryty)(context, builder, args[0])
        inds = [context.cast(builder, args[1], rowty, types.intp), context.cast(builder, args[2], colty, types.intp)]
        ptr = cgutils.get_item_pointer(context, builder, aryty, array, inds)
        i8p = ir.PointerType(ir.IntType(8))
        fnty = ir.FunctionType(ir.VoidType(), [i8p, ir.IntType(32), ir.IntType(32), ir.IntType(32)])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], fnty)
        i32 = ir.IntType(32)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(ary, row, col), codegen


@njit(inline="always")
def _prefetch_row(mat, row):
    """Prefetch every cache line of ``mat[row]`` (a 400-byte row of d=100 spans 7 or 8 lines)."""
    n = mat.shape[1]
    for c in range(0, n, 16):          # 16 float32 = one 64-byte line
        _prefetch(mat, row, c)
    _prefetch(mat, row, n - 1)


# How many pairs ahead the targets' rows are prefetched. A pair (1 + 5 targets, d=100) takes about as long
# as a row takes to come from memory; 2 pairs ahead measured the same as 1, 3 lower (the lines arrive and
# are evicted again, or the fill buffers are full), prefetching only a row's first two lines 20 % lower.
PREFETCH_PAIRS = 1


@njit(inline="always")
def _prefetch_negatives(syn1, acc1, negs, buf, q, negative, row_acc):
    """Prefetch the output rows (and row-wise accumulators) of the negatives ``negs[buf, q]``."""
    for k in range(negative):
        t = negs[buf, q, k]
        if t >= 0:
            _prefetch_row(syn1, t)
            if row_acc:
                _prefetch(acc1, t, 0)


# s(f) from a table, as word2vec.c and gensim do (EXP_TABLE_SIZE 1000 bins over [-MAX_EXP, MAX_EXP]), but
# interpolated linearly between s at the bins' edges: the error is at most h^2/8 max|s''| = 0.012^2/8 * 0.0962
# = 1.7e-6 (h = 12/1000, |s''| <= 1/(6 sqrt 3)), where word2vec.c's step table is off by up to 0.003, and s stays
# continuous in f: two runs whose f differ by a rounding error get s differing by as little (a step table jumps
# by a whole bin there, and the runs drift apart). A multiply, a conversion, two loads from 4 KB that stay in L1
# and one multiply-add, where exp and a division sat on the path from f to the updates.
EXP_TABLE_SIZE = 1000
_SIG_SCALE = np.float32(EXP_TABLE_SIZE / (2 * MAX_EXP))
_SIG_TABLE = (1.0 / (1.0 + np.exp(-(np.arange(EXP_TABLE_SIZE + 1) / EXP_TABLE_SIZE * 2 - 1) * MAX_EXP))
              ).astype(np.float32)                                   # s at the 1001 edges of the bins
_MAX_EXP32 = np.float32(MAX_EXP)
_ONE32 = np.float32(1.0)
_ZERO32 = np.float32(0.0)
NO_CURVATURE = np.zeros(0, dtype=np.float32)   # ``train_inplace_rows``' curv: not measured
NO_LOSS = np.zeros(0, dtype=np.float64)        # ``train_inplace_rows``' loss: not sampled


@njit(inline="always")
def _sigmoid32(f):
    """s(f) in float32: 0 or 1 outside [-MAX_EXP, MAX_EXP] (word2vec.c's clipping), else the table."""
    if f >= _MAX_EXP32:
        return _ONE32
    if f <= -_MAX_EXP32:
        return _ZERO32
    z = (f + _MAX_EXP32) * _SIG_SCALE
    k = min(max(np.int64(z), 0), EXP_TABLE_SIZE - 1)     # the clamp: rounding at the edge, and NaN
    lo = _SIG_TABLE[k]
    return lo + (_SIG_TABLE[k + 1] - lo) * (z - np.float32(k))


@njit(inline="always")
def _plan_centre(i, lo, hi, window, negative, out_rows, noise_rows, state, negs, buf):
    """Draw centre ``i``'s reduced window and the negatives of its pairs into ``negs[buf]`` (pair q,
    draw k; -1 = skipped: a word without a row, or the positive target itself), in word2vec.c's order:
    the window first, then ``negative`` draws per context word j = j0..j1-1, j != i. Returns
    (j0, j1, state). Drawing ahead of the updates does not change what is drawn (the generator never
    sees the model), so the kernel draws exactly what it drew when it drew each negative in place."""
    state = _lcg(state)
    b = np.int64(state % np.uint64(window))
    reach = window - b
    j0 = max(lo, i - reach)
    j1 = min(hi, i + reach + 1)
    n_noise = noise_rows.shape[0]
    word_out = out_rows[i]
    q = 0
    for j in range(j0, j1):
        if j == i:
            continue
        for k in range(negative):
            t = np.int64(-1)
            if n_noise > 0:
                state = _lcg(state)
                t = np.int64(noise_rows[_draw(state, n_noise)])
                if t == word_out:
                    t = -1
            negs[buf, q, k] = t
        q += 1
    return j0, j1, state


@njit(inline="always")
def _next_sentence(starts, s):
    """The first non-empty sentence from ``s`` on (``len(starts) - 1`` if none)."""
    n_sent = starts.shape[0] - 1
    while s < n_sent and starts[s] == starts[s + 1]:
        s += 1
    return s


@njit(inline="always")
def _update_input(syn0, acc0, l1, neu1e, eta32, inv_dim, optimizer):
    """The input row's step along ``neu1e``, the gradient it accumulated over the pair's 1 + N targets
    (applied once, after the targets, as word2vec.c does), by the optimizer's rule."""
    dim = syn0.shape[1]
    if optimizer == OPT_ROW_ADAGRAD:
        nn = _ZERO32
        for d in range(dim):
            nn += neu1e[d] * neu1e[d]
        h = acc0[l1, 0] + nn * inv_dim
        acc0[l1, 0] = h
        step = eta32 / np.sqrt(h)
        for d in range(dim):
            syn0[l1, d] += step * neu1e[d]
        return step
    elif optimizer == OPT_ADAGRAD:
        for d in range(dim):
            gd = neu1e[d]
            h = acc0[l1, d] + gd * gd
            acc0[l1, d] = h
            syn0[l1, d] += eta32 * gd / np.sqrt(h)
        return eta32 / np.sqrt(acc0[l1, 0])
    else:
        for d in range(dim):
            syn0[l1, d] += eta32 * neu1e[d]
        return eta32


@njit(inline="always")
def _update_target(syn0, syn1, acc1, l1, target, f, label, uu, eta32, inv_dim, optimizer, neu1e, first):
    """One (input l1, target) term, f = u . v_t: g = y - s(f); neu1e += g v_t (old v_t; ``first``: the
    pair's first term, neu1e = g v_t, which spares zeroing it); v_t moves along g u.

    For every optimizer the step on v_t is known before v_t is read again: SGD's eta g; row-wise
    AdaGrad's eta g / sqrt(h) with h += g^2 |u|^2 / dim (|u|^2 = ``uu``, computed once per pair);
    per-coordinate AdaGrad's needs only g u_d. So one pass over the row does both the neu1e term and
    the update, reading v_t[d] once, with the old value going into neu1e exactly as in word2vec.c."""
    dim = syn0.shape[1]
    sig = _sigmoid32(f)
    g = label - sig
    rate = eta32
    if optimizer == OPT_ROW_ADAGRAD:
        h = acc1[target, 0] + g * g * uu * inv_dim
        acc1[target, 0] = h
        rate = eta32 / np.sqrt(h)
        step = rate * g
        for d in range(dim):
            v = syn1[target, d]
            neu1e[d] = g * v if first else neu1e[d] + g * v
            syn1[target, d] = v + step * syn0[l1, d]
    elif optimizer == OPT_ADAGRAD:
        for d in range(dim):
            v = syn1[target, d]
            neu1e[d] = g * v if first else neu1e[d] + g * v
            gd = g * syn0[l1, d]
            h = acc1[target, d] + gd * gd
            acc1[target, d] = h
            syn1[target, d] = v + eta32 * gd / np.sqrt(h)
        rate = eta32 / np.sqrt(acc1[target, 0])
    else:
        step = eta32 * g
        for d in range(dim):
            v = syn1[target, d]
            neu1e[d] = g * v if first else neu1e[d] + g * v
            syn1[target, d] = v + step * syn0[l1, d]
    return rate, sig * (_ONE32 - sig)     # the step's rate and s'(f): the row's contraction is their product * |u|^2


@njit(nogil=True, fastmath=True, cache=True)
def train_inplace_rows(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows,
                       window, negative, eta, optimizer, seed, touched, curv, loss):
    """Train every (context, centre) pair of the batch in place; return the pair count.

    syn0/syn1: float32 [rows, dim] input/output matrices (acc0/acc1: AdaGrad
    accumulators of the same shape, unused for SGD). in_rows/out_rows: int64 row of
    each kept token's input/output vector. starts: int64 sentence boundaries into
    them (len = sentences + 1). noise_rows: int32 or int64 output row of each entry
    of the noise table (-1 = a word without a row: the draw is skipped, as is a draw
    equal to the positive target); a negative is entry ``_draw(state, len)``, one load
    where the table of slots needed two (a slot, then its row: a cache miss). Every
    row written gets ``touched[row] = 1``: a uint8 mask private to the calling thread,
    which the caller turns into the shard's version stamps after the batch. (Writing
    the shard's shared version array here instead costs 40% of the throughput with two
    threads: the hot rows' stamps share cache lines that both cores keep writing.)
    syn0 and syn1 may be the same matrix (one shard holds both kinds of rows).

    The kernel waits on memory more than it computes: a negative's output row is a
    random row of a matrix larger than the caches. So the draws run one centre word
    ahead of the updates (``_plan_centre``: same generator, same order, the same
    negatives), and while a pair is trained the rows (and accumulators) of the next
    pair's targets are prefetched; they arrive while the current pair computes.
    All of the arithmetic is float32 (s(f) from ``_sigmoid32``'s interpolated table).

    Two measurements for the cluster, both optional:

    * ``curv`` (float32 [rows], private to the thread like ``touched``; length 0: off) adds up each
      row's *contraction*: the curvature of the loss along the direction a step moves the row, times
      the step's rate. For an output row v_t moved along g u that is rate * s'(f) |u|^2 (s' = s (1 - s));
      for the input row, moved once along neu1e, rate * sum_t s'(f_t) |v_t|^2 over its 1 + N targets.
      Summed over an interval it says how far the row went towards the optimum its data pull it to:
      after steps of total contraction c, a row on a quadratic has covered 1 - e^-c of the way. The
      replicas' delta merge (``online.learner.delta_merge``) needs exactly that to tell a row that
      saturated (hundreds of steps; several replicas' deltas must be averaged) from one that took a few
      independent steps (they must be added). Costs one multiply-add per coordinate of each target
      (|v_t|^2 rides in the dot product's pass) and a store per target.
    * ``loss`` (float64 [2]): adds the SGNS loss of every 32nd pair (all its 1 + N terms) to loss[0]
      and the pairs sampled to loss[1]: a live training signal (a diverging model shows it first).
    """
    dim = syn0.shape[1]
    neu1e = np.zeros(dim, dtype=np.float32)
    negs = np.empty((2, 2 * window, max(negative, 1)), dtype=np.int64)   # [buffer, pair, draw]
    state = np.uint64(seed) * np.uint64(2654435761) + np.uint64(1)
    n_sent = starts.shape[0] - 1
    row_acc = optimizer == OPT_ROW_ADAGRAD
    pairs = 0
    eta32 = np.float32(eta)
    inv_dim = np.float32(1.0 / dim)
    track = curv.shape[0] > 0
    sample_loss = loss.shape[0] >= 2
    curv_in = _ZERO32
    s = _next_sentence(starts, 0)
    if s >= n_sent:
        return 0
    i = starts[s]
    cur = 0
    j0, j1, state = _plan_centre(i, starts[s], starts[s + 1], window, negative, out_rows, noise_rows, state, negs,
                                 cur)
    while True:
        hi = starts[s + 1]
        word_out = out_rows[i]
        # the next centre word (maybe in the next non-empty sentence): draw its pairs now
        ni = i + 1
        ns = s if ni < hi else _next_sentence(starts, s + 1)
        more = ns < n_sent
        nj0 = nj1 = 0
        if more:
            nj0, nj1, state = _plan_centre(ni, starts[ns], starts[ns + 1], window, negative, out_rows, noise_rows,
                                           state, negs, 1 - cur)
            _prefetch_row(syn1, out_rows[ni])
        n_pairs = j1 - j0 - 1
        q = 0
        for j in range(j0, j1):
            if j == i:
                continue
            # prefetch the targets of the pair PREFETCH_PAIRS on: this centre's, or the next centre's
            ahead = q + PREFETCH_PAIRS
            if ahead < n_pairs:
                _prefetch_negatives(syn1, acc1, negs, cur, ahead, negative, row_acc)
            elif more and ahead - n_pairs < nj1 - nj0 - 1:
                _prefetch_negatives(syn1, acc1, negs, 1 - cur, ahead - n_pairs, negative, row_acc)
            l1 = in_rows[j]
            sample = sample_loss and (pairs & 31) == 0
            f = _ZERO32                       # the positive's u . v, and |u|^2 for row-wise AdaGrad, in one pass
            uu = _ZERO32
            vv = _ZERO32                      # |v_t|^2, only when the contraction is measured
            if track:
                for d in range(dim):
                    u = syn0[l1, d]
                    v = syn1[word_out, d]
                    f += u * v
                    uu += u * u
                    vv += v * v
            else:
                for d in range(dim):
                    u = syn0[l1, d]
                    f += u * syn1[word_out, d]
                    uu += u * u
            if sample:
                loss[0] += _pair_loss(f, 1.0)
            rate, ds = _update_target(syn0, syn1, acc1, l1, word_out, f, _ONE32, uu, eta32, inv_dim, optimizer,
                                      neu1e, True)
            if track:
                curv_in = ds * vv
                curv[word_out] += rate * ds * uu
            touched[word_out] = 1
            for k in range(negative):
                target = negs[cur, q, k]
                if target < 0:
                    continue
                f = _ZERO32
                if track:
                    vv = _ZERO32
                    for d in range(dim):
                        v = syn1[target, d]
                        f += syn0[l1, d] * v
                        vv += v * v
                else:
                    for d in range(dim):
                        f += syn0[l1, d] * syn1[target, d]
                if sample:
                    loss[0] += _pair_loss(f, 0.0)
                rate, ds = _update_target(syn0, syn1, acc1, l1, target, f, _ZERO32, uu, eta32, inv_dim, optimizer,
                                          neu1e, False)
                if track:
                    curv_in += ds * vv
                    curv[target] += rate * ds * uu
                touched[target] = 1
            touched[l1] = 1
            rate = _update_input(syn0, acc0, l1, neu1e, eta32, inv_dim, optimizer)
            if track:   # the input row's rate, after its accumulator took this pair's gradient
                curv[l1] += curv_in * rate
            if sample:
                loss[1] += 1.0
            pairs += 1
            q += 1
        if not more:
            break
        i, s, j0, j1, cur = ni, ns, nj0, nj1, 1 - cur
    return pairs


@njit(nogil=True, cache=True)
def _gather_rows32(noise_slots, slot_out_row, out):
    """out[i] = slot_out_row[noise_slots[i]] as int32, in one pass; False if a row does not fit."""
    for i in range(noise_slots.shape[0]):
        r = slot_out_row[noise_slots[i]]
        if r >= 2147483647:
            return False
        out[i] = r
    return True


def noise_rows_of(noise_slots, slot_out_row):
    """The noise table as output rows: ``slot_out_row[noise_slots]`` (-1 where a slot has no row),
    int32 when the rows fit (half the cache footprint of int64), else int64. A new array. One compiled
    pass: numpy's gather, max and cast took 1.5 ms at the default table size, and a worker early in a
    stream lays its table out again most batches."""
    noise_slots, slot_out_row = np.asarray(noise_slots), np.asarray(slot_out_row)
    out = np.empty(len(noise_slots), dtype=np.int32)
    if _gather_rows32(noise_slots, slot_out_row, out):
        return out
    return slot_out_row[noise_slots].astype(np.int64, copy=False)


def patched_noise_rows(noise_rows, noise_slots, changed_slots, slot_out_row):
    """``noise_rows_of(noise_slots, slot_out_row)`` when only ``changed_slots`` (unique) changed rows since
    ``noise_rows`` was made from the same table: a copy with their entries set again. The table is laid out
    in slot order (``noise._layout``), so a slot's entries are one run, found by binary search; a full
    mapping reads every entry of the table for a few slots. A new array."""
    changed_slots = np.asarray(changed_slots, dtype=np.int64)
    rows = np.asarray(slot_out_row)[changed_slots]
    if len(rows) and noise_rows.dtype == np.int32 and rows.max() >= np.iinfo(np.int32).max:
        return noise_rows_of(noise_slots, slot_out_row)
    wanted = changed_slots.astype(noise_slots.dtype, copy=False)   # a mixed search converts the whole table
    lo = np.searchsorted(noise_slots, wanted, side="left")
    lengths = np.searchsorted(noise_slots, wanted, side="right") - lo
    out = noise_rows.copy()
    total = int(lengths.sum())
    if total:
        first = np.repeat(lo - (np.cumsum(lengths) - lengths), lengths)   # each entry's run start, less its offset
        out[first + np.arange(total)] = np.repeat(rows, lengths).astype(out.dtype, copy=False)
    return out


def train_inplace(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_slots, slot_out_row,
                  window, negative, eta, optimizer, seed, touched, curv=None, loss=None):
    """``train_inplace_rows`` for a noise table of vocabulary slots (int32) and their output rows
    ``slot_out_row`` (-1 = no row): maps the table once, then trains. Same draws and result as
    ``train_inplace_rows`` on ``noise_rows_of(noise_slots, slot_out_row)``; a caller that trains many
    batches against one table should map it once and call that kernel (``Trainer`` does)."""
    return train_inplace_rows(syn0, syn1, acc0, acc1, in_rows, out_rows, starts,
                              noise_rows_of(noise_slots, slot_out_row), window, negative, eta, optimizer,
                              seed, touched, NO_CURVATURE if curv is None else curv,
                              NO_LOSS if loss is None else loss)


@njit(nogil=True, cache=True)
def take_touched(touched, n):
    """The rows below ``n`` a kernel marked in ``touched``, ascending, with their marks cleared for its next batch.
    Two compiled passes over the mask: numpy's search and reset take 0.28 ms a batch at 136k rows (1.7 % of a
    ``livevec train`` run's samples)."""
    count = 0
    for r in range(n):
        if touched[r]:
            count += 1
    out = np.empty(count, dtype=np.int64)
    k = 0
    for r in range(n):
        if touched[r]:
            out[k] = r
            k += 1
            touched[r] = 0
    return out
