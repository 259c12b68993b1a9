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
product per pair (|u|^2 is shared by the 1 + N targets); it runs at 88 % of SGD's speed
where per-coordinate AdaGrad runs at 27 %, and keeps most of its quality (bench/README.md).
``OPT_SGD`` is plain SGD at the rate ``eta`` the caller passes (word2vec.c's schedule if
the caller decays it); it exists to compare against gensim and is not used on streams.

Two kernels:

``train_inplace_rows``
    The in-process path. Walks sentences of row indices and updates the shared
    matrices in place after every pair, hogwild-style (no locks; concurrent threads
    may overwrite each other's coordinate updates, which word2vec.c and gensim accept).
    In-place updates matter for quality: within a mini-batch a frequent word takes
    part in hundreds of pairs, and summing those gradients against one stale copy of
    its row overshoots. Its noise table holds output ROWS (the slot table mapped
    through the trainer's slot -> row map once per change, not per draw), so a
    negative costs one load from a table that stays in the cache. ``train_inplace``
    is the same kernel for callers that hold a table of slots and a slot -> row map.
    It is bound by memory rather than arithmetic: each negative is a random output row
    of a matrix larger than the caches (plus its AdaGrad accumulator). So it draws a
    centre word's windows and negatives one centre ahead of the updates (the same
    generator in the same order: the same draws) and prefetches the next pair's
    target rows while it trains the current pair (1.5 - 1.6x the pairs/s, see
    ``bench/kernel_speed.py``); s(f) comes from word2vec.c's table (interpolated), in float32.

``walk_gradients``
    The parameter-server path. The caller pulled the batch's rows once into compact
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
    (the top 32 bits scaled to n, no division) was measured against it with the row table: no
    faster (two threads, same batches, interleaved: 1.43M pairs/s against 1.50M) and it draws
    another stream, so the modulo stays and the kernels draw exactly what they drew before.
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
    elif optimizer == OPT_ADAGRAD:
        for d in range(dim):
            gd = neu1e[d]
            h = acc0[l1, d] + gd * gd
            acc0[l1, d] = h
            syn0[l1, d] += eta32 * gd / np.sqrt(h)
    else:
        for d in range(dim):
            syn0[l1, d] += eta32 * neu1e[d]


@njit(inline="always")
def _update_target(syn0, syn1, acc1, l1, target, f, label, uu, eta32, inv_dim, optimizer, neu1e, first):
    """One (input l1, target) term, f = u . v_t: g = y - s(f); neu1e += g v_t (old v_t; ``first``: the
    pair's first term, neu1e = g v_t, which spares zeroing it); v_t moves along g u.

    For every optimizer the step on v_t is known before v_t is read again: SGD's eta g; row-wise
    AdaGrad's eta g / sqrt(h) with h += g^2 |u|^2 / dim (|u|^2 = ``uu``, computed once per pair);
    per-coordinate AdaGrad's needs only g u_d. So one pass over the row does both the neu1e term and
    the update, reading v_t[d] once, with the old value going into neu1e exactly as in word2vec.c."""
    dim = syn0.shape[1]
    g = label - _sigmoid32(f)
    if optimizer == OPT_ROW_ADAGRAD:
        h = acc1[target, 0] + g * g * uu * inv_dim
        acc1[target, 0] = h
        step = eta32 * g / np.sqrt(h)
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
    else:
        step = eta32 * g
        for d in range(dim):
            v = syn1[target, d]
            neu1e[d] = g * v if first else neu1e[d] + g * v
            syn1[target, d] = v + step * syn0[l1, d]


@njit(nogil=True, fastmath=True, cache=True)
def train_inplace_rows(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_rows,
                       window, negative, eta, optimizer, seed, touched):
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
            f = _ZERO32                       # the positive's u . v, and |u|^2 for row-wise AdaGrad, in one pass
            uu = _ZERO32
            for d in range(dim):
                u = syn0[l1, d]
                f += u * syn1[word_out, d]
                uu += u * u
            _update_target(syn0, syn1, acc1, l1, word_out, f, _ONE32, uu, eta32, inv_dim, optimizer, neu1e, True)
            touched[word_out] = 1
            for k in range(negative):
                target = negs[cur, q, k]
                if target < 0:
                    continue
                f = _ZERO32
                for d in range(dim):
                    f += syn0[l1, d] * syn1[target, d]
                _update_target(syn0, syn1, acc1, l1, target, f, _ZERO32, uu, eta32, inv_dim, optimizer, neu1e,
                               False)
                touched[target] = 1
            touched[l1] = 1
            _update_input(syn0, acc0, l1, neu1e, eta32, inv_dim, optimizer)
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
    lo = np.searchsorted(noise_slots, changed_slots, side="left")
    lengths = np.searchsorted(noise_slots, changed_slots, side="right") - lo
    out = noise_rows.copy()
    total = int(lengths.sum())
    if total:
        first = np.repeat(lo - (np.cumsum(lengths) - lengths), lengths)   # each entry's run start, less its offset
        out[first + np.arange(total)] = np.repeat(rows, lengths).astype(out.dtype, copy=False)
    return out


def train_inplace(syn0, syn1, acc0, acc1, in_rows, out_rows, starts, noise_slots, slot_out_row,
                  window, negative, eta, optimizer, seed, touched):
    """``train_inplace_rows`` for a noise table of vocabulary slots (int32) and their output rows
    ``slot_out_row`` (-1 = no row): maps the table once, then trains. Same draws and result as
    ``train_inplace_rows`` on ``noise_rows_of(noise_slots, slot_out_row)``; a caller that trains many
    batches against one table should map it once and call that kernel (``Trainer`` does)."""
    return train_inplace_rows(syn0, syn1, acc0, acc1, in_rows, out_rows, starts,
                              noise_rows_of(noise_slots, slot_out_row), window, negative, eta, optimizer,
                              seed, touched)


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
