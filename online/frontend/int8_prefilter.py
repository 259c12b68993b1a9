"""The int8 pre-filter: score a quarter of the bytes first, re-score only what can win.

The exact search streams the whole float32 matrix per batch (1.5 ms for one query at
100k x 100). An int8 copy of the unit rows (per-row scale) is a quarter of the bytes, and
the query is quantised to int8 too; then the C kernel (int8_scan.c, AVX-512 VNNI) scores
every row with 64 int8 multiply-adds per instruction (about 0.2 ms for one query, 0.1 ms
per query in batches of 8). Those scores are within a per-row bound of the exact ones,
    |q.x - q_hat.x_hat| <= |q| |x - x_hat| + |q - q_hat| |x_hat|,   |x_hat| <= 1 + |x - x_hat|,
so the rows that can still reach the k-th best are known exactly and only those are
re-scored in float32. The answer is the exact one (up to float32 rounding of equal
scores); only the work changes. Without the compiled kernel the int8 rows are dequantised
block by block and scored with BLAS against the float32 query (|q - q_hat| = 0).

The codes are built at sync time, copy-on-write like the rest of a ``ModelIndex``, and
only changed rows are re-quantised. They travel as one 4-tuple ``(packed codes, scale,
error, code sum)`` in the kernel's layout (rows padded to whole tiles with zero codes).
"""
from __future__ import annotations

import numpy as np
from numba import njit

TILE_ROWS = 64                  # the kernel's layout: rows in tiles of 64, dims in groups of 4 (int8_scan.c)
CODE_BLOCK_ROWS = 4096          # numpy fallback: rows dequantised per step (1.6 MB of float32 stays in L2)
MIN_ROWS_FOR_CODES = 8192       # below this the float32 product is cheap enough
# float32 rounding of a dot product over d terms is at most about d * 2^-24 * |q| |x|; the
# approximate and the exact score each carry it, so every bound is widened by twice that, x2.
_ROUNDING_PER_DIM = 4 * 2.0 ** -24

try:
    from online.frontend import _int8_scan
except ImportError:             # built without a C compiler: the numpy fallback serves
    _int8_scan = None


def _default_scan() -> str:
    if _int8_scan is None:
        return "numpy"
    return "vnni" if _int8_scan.has_vnni() else "portable"


# "vnni" (AVX-512 VNNI kernel), "portable" (the same C loop without intrinsics) or "numpy"
# (dequantise + BLAS). Chosen once at import; tests switch it to cover every path.
SCAN = _default_scan()
# Largest batch that uses the int8 pre-filter by default. The VNNI kernel beats the float32
# product at every batch size; the portable C loop and dequantise + BLAS lose to it at every
# batch size here (bench/README.md), so they only run when asked (``prefilter=True``, tests).
MAX_BATCH_FOR_CODES = {"vnni": 1 << 30, "portable": 0, "numpy": 0}


def _layout(n: int, dim: int) -> tuple[int, int]:
    """(tiles, groups) of the packed code array for ``n`` rows of ``dim``."""
    return -(-n // TILE_ROWS), -(-dim // 4)


def _empty_codes(n: int, dim: int):
    tiles, groups = _layout(n, dim)
    rows = tiles * TILE_ROWS
    return (np.zeros((tiles, groups, 4, 16, 4), np.int8), np.zeros(rows, np.float32),
            np.zeros(rows, np.float32), np.zeros(rows, np.int32))


@njit(nogil=True, cache=True)
def _quantise_rows(unit, rows, codes, scale, error, csum):
    """int8 codes of ``unit[rows]`` (per-row scale max|x|/127) into the packed layout, with
    |x - x_hat| rounded up and the code sum the kernel's unsigned-query correction needs."""
    d = unit.shape[1]
    for r in rows:
        m = np.float32(0.0)
        for t in range(d):
            a = abs(unit[r, t])
            if a > m:
                m = a
        s = np.float32(m / np.float32(127.0))
        inv = np.float32(127.0) / m if m > 0 else np.float32(0.0)
        e2 = 0.0
        total = 0
        tile, sub, lane = r >> 6, (r >> 4) & 3, r & 15
        for t in range(d):
            c = np.floor(unit[r, t] * inv + np.float32(0.5))                 # any rounding will do: the error is measured
            c = min(max(c, np.float32(-127.0)), np.float32(127.0))
            ci = np.int8(c)
            codes[tile, t >> 2, sub, lane, t & 3] = ci
            total += np.int32(ci)
            diff = np.float64(unit[r, t]) - np.float64(np.float32(c) * s)    # x_hat exactly as _dequantise makes it
            e2 += diff * diff
        scale[r] = s
        error[r] = np.float32(np.sqrt(e2) * 1.000001 + 1e-9)
        csum[r] = total


@njit(nogil=True, cache=True)
def _dequantise(codes, scale, lo, hi, out):
    d = out.shape[1]
    for j in range(lo, hi):
        s = scale[j]
        tile, sub, lane = j >> 6, (j >> 4) & 3, j & 15
        for t in range(d):
            out[j - lo, t] = np.float32(codes[tile, t >> 2, sub, lane, t & 3]) * s


@njit(nogil=True, cache=True)
def _candidates(approx, tile_max, tile_error, qnorm, margins, error, exclude_ptr, exclude_rows, k, counts,
                out_rows):
    """Rows whose upper bound reaches the k-th best lower bound, per query (``approx`` is [b, n]).

    One pass per query over its approximate scores: a value heap tracks the k-th largest
    lower bound so far, rows whose upper bound reaches it are collected, and at the end those
    the final k-th lower bound rules out are dropped (rows tied with the k-th stay). Any row
    of the exact top k has upper bound >= its exact score >= the k-th exact score >= the
    k-th largest lower bound, so it is kept. ``out_rows`` is [b, cap]; a query with more than ``cap`` candidates
    gets ``counts[i] = -1`` and the caller scores all rows exactly. Excluded rows are never
    candidates. A row's slack is ``qnorm[i] * error[row] + margins[i]``.

    Rows come in tiles of TILE_ROWS with their best approximate score (``tile_max``, [b,
    tiles]) and largest error (``tile_error``): once the threshold is known, a tile whose
    best upper bound misses it is skipped whole, so most of the 100k rows are never looked
    at one by one.
    """
    b, n = approx.shape
    tiles = tile_max.shape[1]
    cap = out_rows.shape[1]
    heap = np.empty(k, dtype=np.float32)
    for i in range(b):
        for j in range(exclude_ptr[i], exclude_ptr[i + 1]):
            approx[i, exclude_rows[j]] = -np.inf
        qn = qnorm[i]
        margin = margins[i]
        size = 0
        c = 0
        threshold = -np.inf
        for tile in range(tiles):
            if tile_max[i, tile] + (qn * tile_error[tile] + margin) < threshold:
                continue
            for j in range(tile * TILE_ROWS, min(n, (tile + 1) * TILE_ROWS)):
                s = approx[i, j]
                if s == -np.inf:
                    continue
                slack = qn * error[j] + margin
                if s + slack < threshold:          # cannot reach the current k-th lower bound
                    continue
                if c >= 0:
                    if c >= cap:
                        c = -1
                    else:
                        out_rows[i, c] = j
                        c += 1
                v = s - slack
                if size < k:
                    pos = size
                    size += 1
                    while pos > 0:
                        parent = (pos - 1) // 2
                        if heap[parent] <= v:
                            break
                        heap[pos] = heap[parent]
                        pos = parent
                    heap[pos] = v
                elif v > heap[0]:
                    pos = 0
                    while True:
                        child = 2 * pos + 1
                        if child >= k:
                            break
                        if child + 1 < k and heap[child + 1] < heap[child]:
                            child += 1
                        if v <= heap[child]:
                            break
                        heap[pos] = heap[child]
                        pos = child
                    heap[pos] = v
                if size >= k:                      # the heap is full: its root is the k-th lower bound
                    threshold = heap[0]
        if c > 0:                                  # drop those the final k-th lower bound rules out
            threshold = heap[0] if size >= k else -np.inf
            kept = 0
            for t in range(c):
                j = out_rows[i, t]
                if approx[i, j] + (qn * error[j] + margin) >= threshold:
                    out_rows[i, kept] = j
                    kept += 1
            c = kept
        counts[i] = c


def quantise_queries(queries: np.ndarray, groups: int):
    """int8 codes of the queries, sent as unsigned bytes (code + 128; see int8_scan.c), their
    scales, and |q - q_hat| rounded up."""
    b, dim = queries.shape
    m = np.abs(queries).max(axis=1) if dim else np.zeros(b, np.float32)
    qscale = (m / np.float32(127.0)).astype(np.float32)
    inv = np.divide(np.float32(127.0), m, out=np.zeros_like(m), where=m > 0)
    codes = np.clip(np.rint(queries * inv[:, None]), -127, 127)
    packed = np.full((b, groups * 4), 128, np.uint8)
    packed[:, :dim] = (codes + 128).astype(np.uint8)
    diff = queries.astype(np.float64) - codes * qscale.astype(np.float64)[:, None]
    error = (np.sqrt((diff * diff).sum(axis=1)) * 1.000001 + 1e-9).astype(np.float32)
    return packed, qscale, error


def approx_scores(codes: np.ndarray, scale: np.ndarray, csum: np.ndarray, queries: np.ndarray, n: int,
                   scan: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[b, n] scores of the int8 rows, the best score of each tile ([b, tiles]) and, per query,
    |q - q_hat| (0 where q is not quantised)."""
    tiles, groups = codes.shape[0], codes.shape[1]
    b, dim = queries.shape
    if scan != "numpy":
        packed, qscale, qerror = quantise_queries(queries, groups)
        out = np.empty((b, tiles * TILE_ROWS), dtype=np.float32)
        tile_max = np.empty((b, tiles), dtype=np.float32)
        _int8_scan.scan(codes, csum, scale, packed, qscale, out, tile_max, tiles, groups, b, tiles * TILE_ROWS,
                        portable=scan == "portable")
        return out[:, :n], tile_max, qerror
    out = np.full((b, tiles * TILE_ROWS), -np.inf, dtype=np.float32)
    rows = min(CODE_BLOCK_ROWS, n)
    block = np.empty((rows, dim), dtype=np.float32)
    part = np.empty((b, rows), dtype=np.float32)
    for lo in range(0, n, CODE_BLOCK_ROWS):
        hi = min(n, lo + CODE_BLOCK_ROWS)
        _dequantise(codes, scale, lo, hi, block)
        if hi - lo == rows:
            np.matmul(queries, block.T, out=part)
            out[:, lo:hi] = part
        else:
            out[:, lo:hi] = queries @ block[:hi - lo].T
    return out[:, :n], out.reshape(b, tiles, TILE_ROWS).max(axis=2), np.zeros(b, np.float32)


def quantise(unit: np.ndarray, rows: np.ndarray | None = None, codes=None):
    """Codes of ``unit`` (all rows, or only ``rows`` into the given ``codes`` arrays):
    (packed codes, scale, error, csum)."""
    n, dim = unit.shape
    if codes is None:
        codes = _empty_codes(n, dim)
    packed, scale, error, csum = codes
    rows = np.arange(n, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
    if len(rows) and dim:
        _quantise_rows(unit, rows, packed, scale, error, csum)
    elif len(rows):
        scale[rows] = 0
        error[rows] = 0
        csum[rows] = 0
    return codes


def code_matrix(codes: np.ndarray, n: int, dim: int) -> np.ndarray:
    """The packed codes as an [n, dim] int8 matrix (for tests and inspection)."""
    tiles, groups = codes.shape[0], codes.shape[1]
    return codes.transpose(0, 2, 3, 1, 4).reshape(tiles * TILE_ROWS, groups * 4)[:n, :dim]


def grown_codes(codes, n_old: int, n: int, dim: int):
    """Writable copies of ``codes`` (for ``n_old`` rows), with room for ``n`` rows (copy-on-write)."""
    packed, scale, error, csum = codes
    if n_old == 0 or packed.shape[1] != -(-dim // 4):
        return _empty_codes(n, dim)
    tiles, _ = _layout(n, dim)
    extra = tiles - packed.shape[0]
    pad = extra * TILE_ROWS
    return (np.concatenate([packed, np.zeros((extra,) + packed.shape[1:], np.int8)]),
            np.concatenate([scale, np.zeros(pad, np.float32)]),
            np.concatenate([error, np.zeros(pad, np.float32)]),
            np.concatenate([csum, np.zeros(pad, np.int32)]))


def tile_error(error: np.ndarray) -> np.ndarray:
    """Largest |x - x_hat| per tile: lets ``_candidates`` skip whole tiles."""
    return error.reshape(-1, TILE_ROWS).max(axis=1) if len(error) else np.zeros(0, np.float32)


def prefiltered_top_k(unit: np.ndarray, codes, tile_errors: np.ndarray, queries: np.ndarray,
                      ptr: np.ndarray, flat: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows and scores of the exact top ``kk`` of each query ([b, kk]; -1 / -inf where unfilled),
    excluding ``flat[ptr[i]:ptr[i + 1]]`` for query i."""
    packed, scale, error, csum = codes
    b, n = len(queries), len(unit)
    dim = unit.shape[1]
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    approx, tile_max, qerror = approx_scores(packed, scale, csum, queries, n, SCAN)
    qnorm = np.linalg.norm(queries, axis=1).astype(np.float32)
    cap = max(4 * kk + 256, n // 16)
    counts = np.empty(b, dtype=np.int64)
    cand = np.empty((b, cap), dtype=np.int64)
    margins = (qnorm * np.float32(_ROUNDING_PER_DIM * dim) + np.float32(1e-6)).astype(np.float32)
    # slack of row j: |q| e_j + |q - q_hat| (1 + e_j) + margin = (|q| + |q - q_hat|) e_j + (|q - q_hat| + margin)
    _candidates(approx, tile_max, tile_errors, (qnorm + qerror).astype(np.float32),
                (margins + qerror).astype(np.float32), error, ptr, flat, kk, counts, cand)
    top = np.full((b, kk), -1, dtype=np.int64)
    top_scores = np.full((b, kk), -np.inf, dtype=np.float32)
    for i in range(b):
        if counts[i] < 0:                                # too many near-ties (e.g. a zero query): all rows
            scores = unit @ queries[i]
            rows_i = np.arange(n, dtype=np.int64)
            ex = flat[ptr[i]:ptr[i + 1]]
            keep = np.ones(n, dtype=bool)
            keep[ex] = False
            rows_i, scores = rows_i[keep], scores[keep]
        else:
            rows_i = cand[i, :counts[i]]                 # ascending row order
            scores = unit[rows_i] @ queries[i]
        order = np.lexsort((rows_i, -scores))[:kk]      # best first, ties: lower row first
        m = len(order)
        top[i, :m] = rows_i[order]
        top_scores[i, :m] = scores[order]
    return top, top_scores


def warm_up() -> None:
    """Compile (or load from numba's cache) the pre-filter's kernels before the first query needs them."""
    unit = np.eye(3, dtype=np.float32)
    codes, scale, error, csum = quantise(unit)
    _dequantise(codes, scale, 0, 3, np.empty((3, 3), np.float32))
    for approx in (np.zeros((1, 3), np.float32), np.zeros((1, 4), np.float32)[:, :3]):   # contiguous and a view
        _candidates(approx, np.zeros((1, 1), np.float32), np.zeros(1, np.float32), np.ones(1, np.float32),
                    np.ones(1, np.float32), error, np.zeros(2, np.int64), np.zeros(0, np.int64), 2,
                    np.empty(1, np.int64), np.empty((1, 3), np.int64))
