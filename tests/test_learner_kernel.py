"""The SGNS kernels (finite differences, in-place vs gradient agreement) and EmbeddingShard."""
from __future__ import annotations

import numpy as np
import pytest

from online.learner.embedding_shard import EmbeddingShard
from online.learner.key_index import KeyIndex
from online.learner.param_store import LocalParamStore, ParamStore, server_range_starts
from numba import njit

from online.learner.gradient_kernel import batch_gradients, plan_pairs, walk_gradients
from online.learner.sgns_kernel import OPT_ADAGRAD, OPT_ROW_ADAGRAD, OPT_SGD, _sigmoid32, train_inplace
from online.learner.keys import output_rows, word_keys, word_rows


def _loss_and_grads(in_vecs, out_vecs, pair_in, pair_out, negs):
    g_in = np.zeros_like(in_vecs)
    g_out = np.zeros_like(out_vecs)
    loss = batch_gradients(in_vecs, out_vecs, pair_in, pair_out, negs, g_in, g_out)
    return loss, g_in, g_out


def test_batch_gradients_match_finite_differences_of_the_loss():
    rng = np.random.default_rng(0)
    in_vecs = rng.normal(0, 0.7, (3, 6))
    out_vecs = rng.normal(0, 0.7, (4, 6))
    pair_in = np.array([0, 1, 2, 0, 1])
    pair_out = np.array([1, 2, 3, 0, 1])
    negs = np.array([[2, 3], [0, -1], [1, 1], [3, 2], [-1, 0]])
    loss, g_in, g_out = _loss_and_grads(in_vecs, out_vecs, pair_in, pair_out, negs)

    def sigmoid(x):
        return 1 / (1 + np.exp(-x))
    direct = 0.0                                  # the loss written out, independently of the kernel
    for p in range(len(pair_in)):
        u = in_vecs[pair_in[p]]
        direct -= np.log(sigmoid(u @ out_vecs[pair_out[p]]))
        direct -= sum(np.log(sigmoid(-u @ out_vecs[n])) for n in negs[p] if n >= 0)
    assert loss == pytest.approx(direct, rel=1e-6)
    h = 1e-6
    for mat, grad in ((in_vecs, g_in), (out_vecs, g_out)):
        for idx in np.ndindex(*mat.shape):
            saved = mat[idx]
            mat[idx] = saved + h
            up = _loss_and_grads(in_vecs, out_vecs, pair_in, pair_out, negs)[0]
            mat[idx] = saved - h
            down = _loss_and_grads(in_vecs, out_vecs, pair_in, pair_out, negs)[0]
            mat[idx] = saved
            assert grad[idx] == pytest.approx((up - down) / (2 * h), abs=1e-5), idx


def _toy_batch(seed=1):
    rng = np.random.default_rng(seed)
    n_words = 7
    tokens = rng.integers(0, n_words, 40).astype(np.int64)
    starts = np.array([0, 15, 16, 40], dtype=np.int64)          # includes a one-word sentence
    noise = rng.integers(0, n_words, 50).astype(np.int32)
    vectors = rng.normal(0, 0.3, (2 * n_words, 8)).astype(np.float32)  # rows 0..6 input, 7..13 output
    slot_out_row = np.arange(n_words, 2 * n_words, dtype=np.int64)
    return n_words, tokens, starts, noise, vectors, slot_out_row


def test_in_place_sgd_moves_along_minus_the_batch_gradient_for_a_small_step():
    n_words, tokens, starts, noise, vectors, slot_out_row = _toy_batch()
    window, negative, seed, eta = 3, 4, 99, 1e-4
    pair_in, pair_out, negs = plan_pairs(tokens, starts, noise, window, negative, seed)
    assert len(pair_in) > 50 and (negs == -1).any()
    _, g_in, g_out = _loss_and_grads(vectors[:n_words].astype(np.float64), vectors[n_words:].astype(np.float64),
                                     pair_in, pair_out, negs)
    updated = vectors.copy()
    touched = np.zeros(len(vectors), dtype=np.uint8)
    pairs = train_inplace(updated, updated, np.zeros((0, 8), np.float32), np.zeros((0, 8), np.float32),
                          tokens, tokens + n_words, starts, noise, slot_out_row, window, negative, eta, OPT_SGD,
                          seed, touched)
    assert pairs == len(pair_in)
    delta = (updated - vectors).astype(np.float64)
    expected = -eta * np.vstack([g_in, g_out])
    # The kernel takes s(f) from a table (error <= 2e-6, test_the_sigmoid_table_...): each term's dL/df may be
    # off by that much, so a row may be off by eta * 2e-6 * the sum of |partner row| over its terms.
    bound = np.zeros(len(vectors))
    row_max = np.abs(vectors.astype(np.float64)).max(axis=1)
    for p in range(len(pair_in)):
        for t in [pair_out[p]] + [n for n in negs[p] if n >= 0]:
            bound[pair_in[p]] += row_max[n_words + t]
            bound[n_words + t] += row_max[pair_in[p]]
    atol = 2e-3 * np.abs(expected).max() + eta * SIGMOID_TABLE_ERROR * bound[:, None]
    assert (np.abs(delta - expected) <= atol).all()
    assert (eta * SIGMOID_TABLE_ERROR * bound).max() < 0.05 * np.abs(expected).max(), "the bound says something"
    changed = np.flatnonzero(np.any(updated != vectors, axis=1))
    assert np.flatnonzero(touched).tolist() == changed.tolist()


SIGMOID_TABLE_ERROR = 2e-6       # linear interpolation over bins of h = 12/1000: h^2/8 max|s''| = 1.7e-6


def _table_sigmoid(f):
    """s(f) as the in-place kernel takes it, written independently: 0 / 1 beyond +-6, else s interpolated
    linearly between the edges of f's bin among 1000 equal bins over [-6, 6]."""
    if f >= 6:
        return 1.0
    if f <= -6:
        return 0.0
    k = np.floor((f + 6) / 0.012)
    x0 = -6 + k * 0.012
    s0, s1 = 1 / (1 + np.exp(-x0)), 1 / (1 + np.exp(-(x0 + 0.012)))
    return s0 + (s1 - s0) * (f - x0) / 0.012


def test_the_sigmoid_table_is_within_its_bound_and_clips_like_word2vec():
    f = np.concatenate([np.linspace(-7, 7, 200_001), [-6, 6, np.nextafter(np.float32(6), 0), -np.nextafter(np.float32(6), 0)]])
    table = _sigmoid32_of(f.astype(np.float32))
    exact = 1 / (1 + np.exp(-f))
    inside = np.abs(f) < 6
    err = np.abs(table[inside] - exact[inside])
    assert 0.5 * SIGMOID_TABLE_ERROR < err.max() <= SIGMOID_TABLE_ERROR   # interpolated (a step table: 0.003)
    assert (table[f >= 6] == 1).all() and (table[f <= -6] == 0).all()
    assert (np.diff(table[np.argsort(f)]) >= -1e-7).all()                  # monotone, up to float32 rounding
    grid = np.linspace(-5.99, 5.99, 997)
    np.testing.assert_allclose(_sigmoid32_of(grid.astype(np.float32)),       # the same interpolation
                               [_table_sigmoid(x) for x in grid.astype(np.float64)], rtol=0, atol=3e-7)
    order = np.argsort(f[inside])
    assert np.abs(np.diff(table[inside][order])).max() < 1e-4, "continuous inside +-6: no jump at the bins' edges"


@njit
def _sigmoid32_of(f):
    out = np.empty(len(f), np.float32)
    for i in range(len(f)):
        out[i] = _sigmoid32(f[i])
    return out


def _reference_inplace(vectors, acc, tokens, n_words, starts, noise, window, negative, eta, optimizer, seed):
    """The in-place kernel written out in numpy (float64), pair by pair in word2vec.c's order: for each
    target, g = y - s(u.v_t), neu1e += g v_t with the OLD v_t, then v_t's step; u's step once, after the
    targets. Draws from plan_pairs (the kernel's generator); rows: token t -> t (input), n_words + t (output)."""
    pair_in, pair_out, negs = plan_pairs(tokens, starts, noise, window, negative, seed)
    x, a = vectors.astype(np.float64), acc.astype(np.float64)
    dim = x.shape[1]
    for p in range(len(pair_in)):
        i = pair_in[p]
        u = x[i].copy()
        neu1e = np.zeros(dim)
        for t, y in [(n_words + pair_out[p], 1.0)] + [(n_words + n, 0.0) for n in negs[p] if n >= 0]:
            g = y - _table_sigmoid(u @ x[t])
            neu1e += g * x[t]
            if optimizer == OPT_ROW_ADAGRAD:
                a[t, 0] += g * g * (u @ u) / dim
                x[t] += eta * g / np.sqrt(a[t, 0]) * u
            elif optimizer == OPT_ADAGRAD:
                a[t] += (g * u) ** 2
                x[t] += eta * g * u / np.sqrt(a[t])
            else:
                x[t] += eta * g * u
        if optimizer == OPT_ROW_ADAGRAD:
            a[i, 0] += neu1e @ neu1e / dim
            x[i] += eta / np.sqrt(a[i, 0]) * neu1e
        elif optimizer == OPT_ADAGRAD:
            a[i] += neu1e ** 2
            x[i] += eta * neu1e / np.sqrt(a[i])
        else:
            x[i] += eta * neu1e
    return len(pair_in), x, a


@pytest.mark.parametrize("optimizer", [OPT_SGD, OPT_ROW_ADAGRAD, OPT_ADAGRAD])
@pytest.mark.parametrize("case", ["default", "empty sentences", "no noise", "no negatives"])
def test_the_in_place_kernel_is_word2vecs_sequential_update(optimizer, case):
    """The kernel draws one centre word ahead, prefetches, and fuses the neu1e and v_t passes: none of it may
    change what it computes. Against the numpy reference, pair by pair, over several sentences (one of one
    word, and in "empty sentences" empty ones, at the start, in the middle and at the end)."""
    n_words, tokens, starts, noise, vectors, slot_out_row = _toy_batch(5)
    window, negative, seed, eta = 3, 4, 17, 0.05
    if case == "empty sentences":
        starts = np.array([0, 0, 15, 15, 16, 40, 40], dtype=np.int64)
    elif case == "no noise":
        noise = noise[:0]
    elif case == "no negatives":
        negative = 0
    vectors = vectors * 4          # |f| up to about 3: the table's middle and the clipping both met
    acc = np.full((len(vectors), 8 if optimizer == OPT_ADAGRAD else 1), 1e-3, np.float32)
    want_pairs, want_x, want_a = _reference_inplace(vectors, acc, tokens, n_words, starts, noise, window, negative,
                                                    eta, optimizer, seed)
    got_x, got_a = vectors.copy(), acc.copy()
    touched = np.zeros(len(vectors), np.uint8)
    pairs = train_inplace(got_x, got_x, got_a, got_a, tokens, tokens + n_words, starts, noise, slot_out_row, window,
                          negative, eta, optimizer, seed, touched)
    assert pairs == want_pairs > 50
    moved = np.abs(want_x - vectors).max()
    assert moved > 0.1
    # float32 against float64; a wrong order or a missing term is off by eta * g * |v|, 100x more
    np.testing.assert_allclose(got_x, want_x, rtol=0, atol=5e-4 * moved)
    if optimizer != OPT_SGD:
        np.testing.assert_allclose(got_a, want_a, rtol=2e-3)
    assert np.flatnonzero(touched).tolist() == np.flatnonzero(np.any(want_x != vectors, axis=1)).tolist()


def test_walk_with_rate_zero_is_the_snapshot_gradient():
    n_words, tokens, starts, noise, vectors, _ = _toy_batch(3)
    pair_in, pair_out, negs = plan_pairs(tokens, starts, noise, 3, 4, 5)
    in_vecs, out_vecs = vectors[:n_words] * 0.5, vectors[n_words:] * 0.5   # |f| < 6: no clipping
    loss, g_in, g_out = _loss_and_grads(in_vecs, out_vecs, pair_in, pair_out, negs)
    w_in, w_out = np.zeros_like(in_vecs), np.zeros_like(out_vecs)
    w_loss = walk_gradients(in_vecs, out_vecs, pair_in, pair_out, negs, 0.0, w_in, w_out)
    assert w_loss == pytest.approx(loss, rel=1e-5)
    np.testing.assert_allclose(w_in, g_in, atol=1e-5)
    np.testing.assert_allclose(w_out, g_out, atol=1e-5)


def test_walk_sums_the_gradients_met_along_sequential_sgd_steps():
    """The walk's sum is (snapshot - sequentially updated copy) / rate, and differs from the snapshot gradient."""
    n_words, tokens, starts, noise, vectors, _ = _toy_batch(4)
    pair_in, pair_out, negs = plan_pairs(tokens, starts, noise, 3, 4, 6)
    in_vecs, out_vecs = vectors[:n_words].copy(), vectors[n_words:].copy()
    rate = 0.2
    u, v = in_vecs.astype(np.float64), out_vecs.astype(np.float64)   # word2vec.c's order, written out in numpy
    for p in range(len(pair_in)):
        i = pair_in[p]
        neu1e = np.zeros(u.shape[1])
        for t, label in [(pair_out[p], 1.0)] + [(n, 0.0) for n in negs[p] if n >= 0]:
            g = label - 1 / (1 + np.exp(-(u[i] @ v[t])))
            neu1e += g * v[t]
            v[t] += rate * g * u[i]
        u[i] += rate * neu1e
    w_in, w_out = np.zeros_like(in_vecs), np.zeros_like(out_vecs)
    walk_gradients(in_vecs, out_vecs, pair_in, pair_out, negs, rate, w_in, w_out)
    np.testing.assert_array_equal(in_vecs, vectors[:n_words])          # the pulled rows are not written
    np.testing.assert_allclose(in_vecs - rate * w_in, u, atol=1e-4)
    np.testing.assert_allclose(out_vecs - rate * w_out, v, atol=1e-4)
    _, g_in, _ = _loss_and_grads(in_vecs, out_vecs, pair_in, pair_out, negs)
    assert np.abs(w_in - g_in).max() > 0.05 * np.abs(g_in).max()


def test_windows_stay_inside_sentences():
    tokens = np.arange(10, dtype=np.int64)
    starts = np.array([0, 4, 10], dtype=np.int64)
    pair_in, pair_out, _ = plan_pairs(tokens, starts, np.zeros(1, np.int32), 5, 1, 3)
    assert ((pair_in < 4) == (pair_out < 4)).all()
    assert len(pair_in) > 0 and (np.abs(pair_in - pair_out) <= 5).all()


@pytest.mark.parametrize("optimizer", [OPT_ADAGRAD, OPT_ROW_ADAGRAD])
def test_in_place_adagrad_lowers_the_loss_of_its_batch(optimizer):
    n_words, tokens, starts, noise, vectors, slot_out_row = _toy_batch(2)
    window, negative, seed = 3, 4, 5
    pair_in, pair_out, negs = plan_pairs(tokens, starts, noise, window, negative, seed)
    before = _loss_and_grads(vectors[:n_words], vectors[n_words:], pair_in, pair_out, negs)[0]
    acc = np.full((len(vectors), 8 if optimizer == OPT_ADAGRAD else 1), 1e-8, np.float32)
    for _ in range(5):
        train_inplace(vectors, vectors, acc, acc, tokens, tokens + n_words, starts, noise, slot_out_row, window,
                      negative, 0.05, optimizer, seed, np.zeros(len(vectors), np.uint8))
    after = _loss_and_grads(vectors[:n_words], vectors[n_words:], pair_in, pair_out, negs)[0]
    assert after < 0.9 * before
    assert (acc > 1e-8).any()


def test_shard_init_is_deterministic_per_key_and_seed():
    keys = word_keys(["the", "cat", "köln"])
    out_keys = output_rows(keys)
    a = EmbeddingShard(dim=50, seed=3)
    b = EmbeddingShard(dim=50, seed=3, initial_rows=16)
    b.pull(word_keys([f"x{i}" for i in range(40)]))           # other rows first, growth in between
    va, vb = a.pull(keys), b.pull(keys[::-1])[::-1]
    np.testing.assert_array_equal(va, vb)
    assert (np.abs(va) < 0.5 / 50).all() and va.std() > 0.1 / 50
    assert not np.allclose(va[0], va[1])
    assert (a.pull(out_keys) == 0).all()                       # output rows start at zero (word2vec.c)
    assert not np.allclose(EmbeddingShard(dim=50, seed=4).pull(keys), va)


def test_shard_push_applies_adagrad_and_sgd_and_tracks_versions():
    keys = np.array([10, 12, 10], dtype=np.uint64)             # duplicate key: applied twice in order
    grads = np.array([[1.0, -2.0], [0.5, 0.5], [1.0, 0.0]], np.float32)
    shard = EmbeddingShard(dim=2, optimizer="adagrad", eta=0.1, adagrad_init=0.0)
    before = shard.pull(keys[:2])
    v0 = shard.version
    v1 = shard.push(keys, grads)
    assert v1 > v0
    h = grads[0] ** 2
    x = before[0] - 0.1 * grads[0] / np.sqrt(h)
    h = h + grads[2] ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        x = x - np.where(h > 0, 0.1 * grads[2] / np.sqrt(h), 0)
    np.testing.assert_allclose(shard.pull(keys[:1])[0], x, rtol=1e-6)
    sgd = EmbeddingShard(dim=2, optimizer="sgd", eta=0.5)
    start = sgd.pull(keys[1:2])
    sgd.push(keys[1:2], grads[1:2])
    np.testing.assert_allclose(sgd.pull(keys[1:2]), start - 0.5 * grads[1:2])
    row = EmbeddingShard(dim=2, optimizer="rowadagrad", eta=0.1, adagrad_init=0.0)
    start = row.pull(keys[1:2])
    row.push(keys[1:2], grads[1:2])
    np.testing.assert_allclose(row.pull(keys[1:2]), start - 0.1 * grads[1:2] / np.sqrt(0.25), rtol=1e-6)


def test_changes_since_reports_changed_created_and_removed_keys():
    shard = EmbeddingShard(dim=4)
    a, b, c = (np.array([k], dtype=np.uint64) for k in (100, 200, 300))
    shard.pull(np.concatenate([a, b]))
    v = shard.version
    assert set(shard.changes_since(0).changed.tolist()) == {100, 200}
    shard.push(a, np.ones((1, 4), np.float32))
    shard.pull(c)
    shard.free(b)
    ch = shard.changes_since(v)
    assert set(ch.changed.tolist()) == {100, 300} and ch.removed.tolist() == [200] and not ch.full_resync
    assert ch.version == shard.version and len(shard) == 2
    assert shard.rows_for(b, create=False)[0] == -1
    assert shard.changes_since(ch.version).changed.size == 0
    shard.pull(b)                                              # re-created: changed, no longer removed
    ch2 = shard.changes_since(v)
    assert 200 in ch2.changed.tolist() and ch2.removed.size == 0


def test_shard_words_counts_and_free_reuses_rows():
    shard = EmbeddingShard(dim=3, initial_rows=16)
    keys = word_keys([f"w{i}" for i in range(100)])
    shard.set_words(keys, [f"w{i}" for i in range(100)])
    shard.add_counts(keys, np.arange(100))
    shard.add_counts(keys[:1], np.array([5]))
    assert shard.words_for(keys[:2]) == ["w0", "w1"]
    assert shard.counts_for(keys[:3]).tolist() == [5, 1, 2]
    cap = shard.capacity
    shard.free(keys[:50])
    assert len(shard) == 50 and shard.words_for(keys[:1]) == [None]
    shard.pull(word_keys([f"v{i}" for i in range(50)]))
    assert shard.capacity == cap and len(shard) == 100


def test_key_index_agrees_with_a_dict_under_inserts_and_deletes():
    rng = np.random.default_rng(0)
    index = KeyIndex(4)
    truth: dict[int, int] = {}
    for step in range(30):
        new = np.setdiff1d(rng.integers(0, 1 << 63, 300, dtype=np.uint64), np.array(list(truth), np.uint64))
        new = np.unique(new)
        rows = np.arange(step * 1000, step * 1000 + len(new))
        index.insert(new, rows)
        truth.update(zip(new.tolist(), rows.tolist()))
        gone = np.array(list(truth)[::3][:50], dtype=np.uint64)
        assert (index.delete(gone) >= 0).all()
        for k in gone.tolist():
            del truth[k]
    probe = np.concatenate([np.array(list(truth), np.uint64), np.array([1, 2, 3], np.uint64)])
    expected = [truth.get(k, -1) for k in probe.tolist()]
    assert index.lookup(probe).tolist() == expected and len(index) == len(truth)
    small = KeyIndex()
    small.insert(np.arange(5, dtype=np.uint64), np.arange(5) + 7)   # sequential keys (C++ ps-lite tests)
    assert small.lookup(np.arange(6, dtype=np.uint64)).tolist() == [7, 8, 9, 10, 11, -1]


def test_local_store_routes_key_ranges_like_ps_lite():
    starts = server_range_starts(3)
    assert starts[0] == 0 and starts[1] == (2**64 - 1) // 3
    store = LocalParamStore(num_shards=3, dim=5)
    assert isinstance(store, ParamStore) and store.local_shard() is None
    keys = word_keys([f"w{i}" for i in range(300)])
    keys = word_rows(keys)
    values = store.pull(keys)
    single = LocalParamStore(dim=5)
    np.testing.assert_array_equal(values, single.pull(keys))
    for i, shard in enumerate(store.shards):
        own = shard.keys()
        hi = starts[i + 1] if i + 1 < 3 else np.uint64(2**64 - 1)
        assert len(own) > 50 and (own >= starts[i]).all() and (own <= hi).all()
    store.push(keys[:10], np.ones((10, 5), np.float32))
    assert not np.allclose(store.pull(keys[:10]), values[:10])
    store.free(keys[:10])
    assert sum(len(s) for s in store.shards) == len(keys) - 10


def test_shard_state_round_trips():
    shard = EmbeddingShard(dim=4, optimizer="adagrad")
    keys = word_keys(["a", "b", "c"])
    shard.push(keys, np.ones((3, 4), np.float32))
    shard.set_words(keys[:2], ["a", "b"])
    shard.add_counts(keys, np.array([3, 2, 1]))
    state = shard.state()
    copy = EmbeddingShard.from_state(state)
    np.testing.assert_array_equal(copy.pull(keys), shard.pull(keys))
    np.testing.assert_array_equal(copy.state()["accum"], state["accum"])
    assert copy.words_for(keys) == ["a", "b", None] and copy.counts_for(keys).tolist() == [3, 2, 1]
    assert copy.version >= state["version"] and copy.optimizer == "adagrad"
