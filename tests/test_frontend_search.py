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

from online.search import int8_prefilter
from online.search.int8_prefilter import code_matrix, quantise
from online.search.model_index import ModelIndex
from online.frontend.settings import FrontendSettings
from online.search.delta import ModelDelta
from online.learner.keys import word_key

MAX_K = FrontendSettings().max_k
TIE = 3e-6          # float32 rounding of a dot product of two unit vectors, both paths
# Every way of scoring the int8 rows: the AVX-512 VNNI and AVX2 kernels (only where the CPU has them),
# the same C loop without intrinsics, and dequantise + BLAS (the build without a compiler).
SCANS = int8_prefilter.available_scans()


@pytest.fixture(params=SCANS, autouse=True)
def scan(request, monkeypatch):
    monkeypatch.setattr(int8_prefilter, "SCAN", request.param)
    return request.param


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
        codes, scale, error, csum = quantise(index.unit)           # what a full build would hold
        assert np.array_equal(index.codes, codes)                  # the delta re-quantised what changed
        assert np.array_equal(index.code_scale, scale) and np.array_equal(index.code_error, error)
        assert np.array_equal(index.code_sum, csum)
        _compare(index, rng, queries=6, ks=(10, MAX_K))


def test_quantisation_error_bound_holds():
    rng = np.random.default_rng(9)
    v = rng.standard_normal((5000, 100)).astype(np.float32) * rng.uniform(1e-3, 1e3, (5000, 1)).astype(np.float32)
    index = _index(v)
    codes = code_matrix(index.codes, index.n, index.dim)
    x_hat = codes.astype(np.float32) * index.code_scale[:index.n, None]
    err = np.linalg.norm(index.unit.astype(np.float64) - x_hat.astype(np.float64), axis=1)
    assert np.all(err <= index.code_error[:index.n])
    assert index.code_error.max() < 0.05                          # and it is tight enough to prune
    assert np.array_equal(index.code_sum[:index.n], codes.sum(axis=1, dtype=np.int32))


def test_kernel_scores_are_the_quantised_products(scan):
    """Each path's approximate score is q_hat . x_hat, and within the bound of q . x."""
    rng = np.random.default_rng(13)
    n, dim = 1000, 37                                             # partial last tile, partial dim group
    index = _index(rng.standard_normal((n, dim)).astype(np.float32))
    q = index.unit[rng.choice(n, 5, replace=False)].copy()
    q[0] = 0.0                                                    # a zero query scores 0 everywhere
    approx, tile_max, qerror = int8_prefilter.approx_scores(index.codes, index.code_scale, index.code_sum, q, n, scan)
    x_hat = code_matrix(index.codes, n, dim).astype(np.float64) * index.code_scale[:n, None]
    if scan == "numpy":
        q_hat = q.astype(np.float64)
    else:
        packed, qscale, _ = int8_prefilter.quantise_queries(q, index.codes.shape[1])
        q_hat = (packed[:, :dim].astype(np.float64) - 128) * qscale[:, None]
    assert np.allclose(approx, q_hat @ x_hat.T, rtol=1e-5, atol=1e-6)
    exact = q.astype(np.float64) @ index.unit.astype(np.float64).T
    bound = (np.linalg.norm(q, axis=1)[:, None] * index.code_error[None, :n]
             + qerror[:, None] * (1 + index.code_error[None, :n]) + 1e-5)
    assert np.all(np.abs(approx - exact) <= bound)
    assert np.all(approx[0] == 0)
    padded = np.full((len(q), tile_max.shape[1] * 64), -np.inf)
    padded[:, :n] = approx
    assert np.all(tile_max >= padded.reshape(len(q), -1, 64).max(axis=2) - 1e-7)


def test_exact_int8_rows_need_the_query_error_in_the_bound():
    """Rows whose int8 codes are exact (error ~0): only the query's own quantisation error
    separates the kernel's order from the exact one, so leaving it out of the bound loses
    true neighbours."""
    rng = np.random.default_rng(21)
    c = rng.integers(-127, 128, (6000, 16)).astype(np.float32)
    c[np.arange(6000), rng.integers(0, 16, 6000)] = 127.0           # max |code| is 127: x / scale is c exactly
    index = _index(c)
    assert index.code_error.max() < 1e-5
    _compare(index, rng, queries=20, ks=(1, 10, 50))


def test_a_tile_is_skipped_only_when_its_error_bound_allows():
    """Tile 0 holds rows that int8 represents exactly; tile 1 holds rows that score higher
    but whose codes round down along the query. After tile 0 the k-th lower bound is tile
    0's exact score, above tile 1's best approximate score: only tile 1's error keeps it in
    the search, and it holds the whole true top 10."""
    m = 60
    r = np.concatenate([np.full(64, m / 127), np.full(64, (m + 0.45) / 127)])   # x = (1, r) / |(1, r)|
    v = np.stack([np.ones(128), r], axis=1).astype(np.float32)
    index = _index(v)
    assert index.code_error[:64].max() < 1e-5 and index.code_error[64:128].min() > 1e-3
    q = np.array([[0.0, 1.0]], np.float32)
    fast = index.top_k(q, [[]], [10], prefilter=True)[0]
    brute = index.top_k(q, [[]], [10], prefilter=False)[0]
    assert {n.word for n in brute} <= {f"w{i}" for i in range(64, 128)}
    _assert_same(fast, brute)


def _probed_vs_scanned_rows(unit, slot_row, queries, tile_ids, tile_ptr, exclude, k):
    """``probed_top_k`` and the float32 top k of exactly the rows its tiles hold (``_best_of_scanned``)."""
    codes = quantise(unit)
    row_phys = np.arange(len(unit), dtype=np.int64)
    ptr = np.cumsum([0] + [len(e) for e in exclude]).astype(np.int64)
    flat = np.array([r for e in exclude for r in e], np.int64)
    got = int8_prefilter.probed_top_k(unit, row_phys, codes, slot_row, queries, tile_ids, tile_ptr, ptr, flat, k)
    top, scores = np.empty((len(queries), k), np.int64), np.empty((len(queries), k), np.float32)
    for i in range(len(queries)):
        int8_prefilter._best_of_scanned(unit, row_phys, slot_row, queries, tile_ids, tile_ptr, ptr, flat, k, top,
                                        scores, i)
    return got, (top, scores)


@pytest.mark.parametrize("k", [1, 10, 100])
def test_the_probed_tiles_answer_exactly_over_the_rows_they_hold(scan, k):
    """What the inverted file asks the kernel: per query, some tiles in any order, slots that hold no
    row (-1: free, -2: left), the query's own rows excluded. The compiled kernel filters the
    candidates while it scans (``scan_select``); its answer must be the float32 top k of exactly
    those rows, as the plain path computes it."""
    rng = np.random.default_rng(31 + k)
    n, dim = 64 * 40, 24
    centres = rng.standard_normal((12, dim))
    x = (centres[rng.integers(0, 12, n)] + 0.3 * rng.standard_normal((n, dim))).astype(np.float32)
    x[rng.choice(n, 40, replace=False)] = x[0]                    # exact duplicates: ties across tiles
    unit = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    slot_row = np.arange(n, dtype=np.int64)
    slot_row[rng.choice(n, n // 5, replace=False)] = rng.choice([-1, -2], n // 5)
    queries = unit[rng.choice(n, 9, replace=False)].copy()
    queries[-1] = unit[0] + unit[5] - unit[9]                     # not a unit vector, as analogies are not
    tiles, lists = [], []
    for i in range(len(queries)):
        tiles.append(rng.permutation(40)[:rng.integers(1, 12) if i else 0])   # query 0 scans no tile at all
    tile_ptr = np.cumsum([0] + [len(t) for t in tiles]).astype(np.int64)
    tile_ids = np.concatenate(tiles).astype(np.int64)
    exclude = [[int(r) for r in rng.choice(n, rng.integers(0, 3))] for _ in range(len(queries))]
    exclude[1] = [int(r) for r in slot_row[tiles[1][0] * 64:(tiles[1][0] + 1) * 64] if r >= 0]   # a whole tile out
    (top, scores, searched), (want_top, want_scores) = _probed_vs_scanned_rows(unit, slot_row, queries, tile_ids,
                                                                               tile_ptr, exclude, k)
    assert np.array_equal(searched, np.diff(tile_ptr) * 64)
    assert np.all(top[0] == -1)
    for i in range(len(queries)):
        filled = want_top[i] >= 0
        assert np.array_equal(top[i] >= 0, filled), i
        assert np.allclose(scores[i][filled], want_scores[i][filled], atol=TIE), i
        ties = np.isclose(scores[i][:, None], want_scores[i][None, :], atol=TIE)
        for r, s in zip(top[i][filled], scores[i][filled]):          # the same rows, up to equal scores
            assert r in want_top[i] or np.any(np.isclose(s, want_scores[i][filled], atol=TIE)), (i, r)
        assert not set(top[i][filled].tolist()) & set(exclude[i])
        assert ties.any(axis=1)[filled].all()


def test_the_fused_scan_rejects_what_would_read_outside_its_arrays():
    if "portable" not in SCANS:
        pytest.skip("built without the C kernel: nothing to misuse")
    unit = np.eye(4, 8, dtype=np.float32)
    codes, scale, error, csum = quantise(unit)
    slot_row = np.array([0, 1, 2, 3] + [-1] * 60, np.int64)
    q, qscale = np.full((1, 8), 128, np.uint8), np.ones(1, np.float32)
    one, two = np.ones(1, np.float32), np.zeros(2, np.int64)

    def call(tile_ids, rows=slot_row, k=10, space=64):
        int8_prefilter._int8_scan.scan_select(
            codes, csum, scale, error, rows, q, qscale, one, one, np.asarray(tile_ids, np.int64),
            np.array([0, len(tile_ids)], np.int64), two, np.zeros(0, np.int64), k, np.empty(space, np.int64),
            np.empty(space, np.float32), np.empty(space, np.float32), np.empty(2, np.int64), np.empty(1, np.float32),
            codes.shape[1], 1, isa=0)
    call([0])
    with pytest.raises(ValueError, match="tile id is out of range"):
        call([1])
    with pytest.raises(ValueError, match="tile id is out of range"):
        call([0], rows=slot_row[:32])                             # slot_row shorter than the codes' tile
    with pytest.raises(ValueError, match="candidate buffers"):
        call([0, 0], space=100)
    with pytest.raises(ValueError, match="positive"):
        call([0], k=0)
