"""The int8 pre-filter gives the same answers as the plain float32 search.

``ModelIndex.top_k(prefilter=True)`` scores an int8 copy of the rows, keeps every row
whose error-bounded upper score reaches the k-th best lower score, and re-scores those in
float32. These tests compare it with the brute-force path (``prefilter=False``) on data
built to break a bound: random rows, tight clusters (near-duplicates whose scores differ by
less than the quantisation error), exact duplicates (ties), zero rows, NaN rows (served as
zero vectors), deltas that re-quantise only changed rows, and k up to the largest allowed.
"Same" means the same words in the same order, except that two words whose scores agree to
float32 rounding (the two paths sum the products in different orders) may swap.
"""
from __future__ import annotations

import numpy as np
import pytest

from online.frontend.model_index import ModelIndex, _quantise
from online.frontend.settings import FrontendSettings
from online.frontend.sources import ModelDelta
from online.vocab import word_key

MAX_K = FrontendSettings().max_k
TIE = 3e-6          # float32 rounding of a dot product of two unit vectors, both paths


def _index(vectors: np.ndarray, version: int = 1) -> ModelIndex:
    words = [f"w{i}" for i in range(len(vectors))]
    keys = np.array([word_key(w) for w in words], dtype=np.uint64)
    return ModelIndex.from_arrays(version, keys, words, vectors)


def _assert_same(fast, brute):
    assert len(fast) == len(brute)
    for f, b in zip(fast, brute):                              # same score at every rank
        assert abs(f.score - b.score) <= TIE, (f, b)
    if not brute:
        return
    kth = brute[-1].score
    fast_words = {n.word for n in fast}
    brute_words = {n.word for n in brute}
    # above the k-th score by more than rounding, no tie is possible: the same words
    assert {n.word for n in brute if n.score > kth + 2 * TIE} <= fast_words
    assert {n.word for n in fast if n.score > kth + 2 * TIE} <= brute_words
    for f, b in zip(fast, brute):                              # a swap only between equal scores
        if f.word != b.word:
            assert abs(f.score - b.score) <= TIE


def _compare(index: ModelIndex, rng, queries: int = 12, ks=(1, 10, 100, MAX_K)):
    n = index.n
    rows = rng.choice(n, size=min(queries, n), replace=False)
    qs, exclude = [], []
    for r in rows.tolist():
        qs.append(index.query_vector([r], []))
        exclude.append([r])
    a, b, c = rng.choice(n, 3, replace=False).tolist()            # an analogy-style query
    qs.append(index.query_vector([a, b], [c]))
    exclude.append([a, b, c])
    q = np.stack(qs).astype(np.float32)
    for k in ks:
        kk = [k] * len(q)
        fast = index.top_k(q, exclude, kk, prefilter=True)
        brute = index.top_k(q, exclude, kk, prefilter=False)
        for f, b in zip(fast, brute):
            _assert_same(f, b)
    mixed = [int(x) for x in rng.integers(1, MAX_K + 1, len(q))]  # different k in one batch
    for f, b in zip(index.top_k(q, exclude, mixed, prefilter=True), index.top_k(q, exclude, mixed, prefilter=False)):
        _assert_same(f, b)


@pytest.mark.parametrize("seed", range(4))
def test_random_rows(seed):
    rng = np.random.default_rng(seed)
    dim = int(rng.choice([8, 32, 100]))
    _compare(_index(rng.standard_normal((3000, dim)).astype(np.float32)), rng)


@pytest.mark.parametrize("seed", range(4))
def test_clustered_rows_and_near_duplicates(seed):
    rng = np.random.default_rng(100 + seed)
    centres = rng.standard_normal((20, 50)).astype(np.float32)
    noise = float(rng.choice([1e-2, 1e-4, 1e-6]))
    v = centres[rng.integers(0, 20, 4000)] + noise * rng.standard_normal((4000, 50)).astype(np.float32)
    _compare(_index(v.astype(np.float32)), rng)


def test_exact_duplicates():
    rng = np.random.default_rng(7)
    base = rng.standard_normal((40, 16)).astype(np.float32)
    v = np.repeat(base, 50, axis=0)[rng.permutation(2000)]          # every vector 50 times
    index = _index(v)
    q = index.unit[:5].copy()
    for k in (1, 49, 50, 51, 500):
        fast = index.top_k(q, [[i] for i in range(5)], [k] * 5, prefilter=True)
        brute = index.top_k(q, [[i] for i in range(5)], [k] * 5, prefilter=False)
        for f, b in zip(fast, brute):          # BLAS may round copies of one row differently: ties
            _assert_same(f, b)


def test_zero_and_nan_rows():
    rng = np.random.default_rng(11)
    v = rng.standard_normal((2500, 24)).astype(np.float32)
    v[rng.choice(2500, 300, replace=False)] = 0.0
    v[rng.choice(2500, 20, replace=False), 3] = np.nan
    v[rng.choice(2500, 5, replace=False)] = np.inf
    index = _index(v)
    assert index.bad_rows == 25
    _compare(index, rng, ks=(1, 10, MAX_K))
    zero = int(np.flatnonzero(~index.unit.any(axis=1))[0])        # a zero query: every score is 0
    q = index.query_vector([zero], [])[None, :]
    fast = index.top_k(q, [[zero]], [10], prefilter=True)[0]
    brute = index.top_k(q, [[zero]], [10], prefilter=False)[0]
    assert fast == brute and all(n.score == 0 for n in fast)


def test_fewer_rows_than_k_and_all_excluded():
    index = _index(np.random.default_rng(3).standard_normal((7, 5)).astype(np.float32))
    q = index.unit[:2].copy()
    for k in (1, 6, 7, MAX_K):
        assert (index.top_k(q, [[0], list(range(7))], [k, k], prefilter=True)
                == index.top_k(q, [[0], list(range(7))], [k, k], prefilter=False))


def test_deltas_requantise_changed_rows():
    rng = np.random.default_rng(5)
    index = _index(rng.standard_normal((3000, 40)).astype(np.float32))
    for version in range(2, 6):
        changed = rng.choice(index.n + 50, 400, replace=False)    # some existing rows, some new words
        words = [f"w{i}" for i in changed.tolist()]
        keys = np.array([word_key(w) for w in words], dtype=np.uint64)
        vectors = rng.standard_normal((len(words), 40)).astype(np.float32) * rng.uniform(0.1, 10)
        removed = np.array([word_key(f"w{i}") for i in rng.choice(index.n, 30, replace=False).tolist()],
                           dtype=np.uint64)
        index = index.apply(ModelDelta(keys, words, vectors, np.zeros(len(words), np.int64), version,
                                       removed=removed))
        codes, scale, error = _quantise(index.unit)                # what a full build would hold
        assert np.array_equal(index.codes, codes)                  # the delta re-quantised what changed
        assert np.array_equal(index.code_scale, scale) and np.array_equal(index.code_error, error)
        _compare(index, rng, queries=6, ks=(10, MAX_K))


def test_quantisation_error_bound_holds():
    rng = np.random.default_rng(9)
    v = rng.standard_normal((5000, 100)).astype(np.float32) * rng.uniform(1e-3, 1e3, (5000, 1)).astype(np.float32)
    index = _index(v)
    x_hat = index.codes.astype(np.float32) * index.code_scale[:, None]
    err = np.linalg.norm(index.unit.astype(np.float64) - x_hat.astype(np.float64), axis=1)
    assert np.all(err <= index.code_error)
    assert index.code_error.max() < 0.05                          # and it is tight enough to prune
