"""The int8 pre-filter: score a quarter of the bytes first, re-score only what can win.

The exact search streams the whole float32 matrix per batch (1.5 ms for one query at
100k x 100). An int8 copy of the unit rows (per-row scale) is a quarter of the bytes, and
the query is quantised to int8 too; then the C kernel (int8_scan.c: AVX-512 VNNI, else
AVX2) scores every row with 64 (32) int8 multiply-adds per instruction (VNNI: about 0.2 ms
for one query, 0.1 ms per query in batches of 8). Those scores are within a per-row bound of
the exact ones,
    |q.x - q_hat.x_hat| <= |q| |x - x_hat| + |q - q_hat| |x_hat|,   |x_hat| <= 1 + |x - x_hat|,
so the rows that can still reach the k-th best are known exactly and only those are
re-scored in float32. The answer is the exact one (up to float32 rounding of equal
scores); only the work changes. Without the compiled kernel the int8 rows are dequantised
block by block and scored with BLAS against the float32 query (|q - q_hat| = 0).

The codes are built at sync time and only changed rows are re-quantised. They travel as
one 4-tuple ``(packed codes, scale, error, code sum)`` in the kernel's layout, indexed by
*slot*: without an inverted file slot r holds row r (rows padded to whole tiles with zero
codes); with one (``ivf``) each list owns whole tiles, so its rows are contiguous, and
``slot_row`` maps a slot back to its row (-1: an empty slot, never a candidate). The
same bound serves both: ``prefiltered_top_k`` scans every tile (exact), and
``probed_top_k`` only the tiles it is given (exact among the rows of the probed lists).
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
    from online.search import _int8_scan
except ImportError:             # built without a C compiler: the numpy fallback serves
    _int8_scan = None


ISA = {"portable": 0, "avx2": 1, "vnni": 2}          # int8_scan.c's kernels


def available_scans() -> list[str]:
    """Every way this build and CPU can score the int8 rows (tests run them all)."""
    if _int8_scan is None:
        return ["numpy"]
    return ["numpy", "portable"] + (["avx2"] if _int8_scan.has_avx2() else []) + \
        (["vnni"] if _int8_scan.has_vnni() else [])


# "vnni" (AVX-512 VNNI kernel), "avx2" (AVX2 kernel), "portable" (the same C loop without
# intrinsics) or "numpy" (dequantise + BLAS). Chosen once at import, the fastest this CPU
# runs; tests switch it to cover every path.
SCAN = available_scans()[-1]
# Largest batch that uses the int8 pre-filter by default. The VNNI and AVX2 kernels beat the
# float32 product at every batch size; the portable C loop and dequantise + BLAS lose to it at
# every batch size (docs/design/0005-serving-index.md), so they only run when asked (``prefilter=True``, tests).
MAX_BATCH_FOR_CODES = {"vnni": 1 << 30, "avx2": 1 << 30, "portable": 0, "numpy": 0}


def _layout(n: int, dim: int) -> tuple[int, int]:
    """(tiles, groups) of the packed code array for ``n`` rows of ``dim``."""
    return -(-n // TILE_ROWS), -(-dim // 4)


def _empty_codes(n: int, dim: int):
    tiles, groups = _layout(n, dim)
    rows = tiles * TILE_ROWS
    return (np.zeros((tiles, groups, 4, 16, 4), np.int8), np.zeros(rows, np.float32),
            np.zeros(rows, np.float32), np.zeros(rows, np.int32))


@njit(nogil=True, cache=True, inline="always")
def _quantise_one(unit, r, slot, row_codes, codes, scale, error, csum):
    """int8 code of ``unit[r]`` (per-row scale max|x|/127) into slot ``slot`` of the packed layout (``codes``
    viewed as int32 words: [tiles, groups, 4, 16]), with |x - x_hat| rounded up and the code sum the kernel's
    unsigned-query correction needs. ``row_codes``: int8 scratch of groups x 4 (the padding stays 0)."""
    d = unit.shape[1]
    m = np.float32(0.0)
    for t in range(d):
        m = max(m, abs(unit[r, t]))
    s = np.float32(m / np.float32(127.0))
    inv = np.float32(127.0) / m if m > 0 else np.float32(0.0)
    e2 = 0.0
    total = 0
    for t in range(d):          # dense, so it vectorises; the scattered stores come after
        c = np.floor(unit[r, t] * inv + np.float32(0.5))                 # any rounding will do: the error is measured
        c = min(max(c, np.float32(-127.0)), np.float32(127.0))
        row_codes[t] = np.int8(c)
        total += np.int32(c)
        diff = np.float64(unit[r, t]) - np.float64(np.float32(c) * s)    # x_hat exactly as _dequantise makes it
        e2 += diff * diff
    tile, sub, lane = slot >> 6, (slot >> 4) & 3, slot & 15
    row_words = row_codes.view(np.int32)                # a group's 4 codes are one int32 of the packed layout
    for g in range(len(row_words)):
        codes[tile, g, sub, lane] = row_words[g]
    scale[slot] = s
    error[slot] = np.float32(np.sqrt(e2) * 1.000001 + 1e-9)
    csum[slot] = total


@njit(nogil=True, cache=True)
def _quantise_rows(unit, rows, slots, codes, scale, error, csum):
    """int8 codes of ``unit[rows[i]]`` into slot ``slots[i]`` of the packed layout (``_quantise_one``)."""
    row_codes = np.zeros(codes.shape[1] * 4, np.int8)      # one row's codes, stored 4 at a time
    for i in range(len(rows)):
        _quantise_one(unit, rows[i], slots[i], row_codes, codes, scale, error, csum)


@njit(nogil=True, cache=True)
def _normalise_quantise_rows(vectors, unit, norms, slots, codes, scale, error, csum):
    """Row i: ``norms[i]`` = |vectors[i]|, ``unit[i]`` = vectors[i] / that (zero for a zero vector, and for
    one with a non-finite entry: it would win every top k), then its code as ``_quantise_rows`` makes it.
    ``unit`` may be ``vectors`` itself. Returns the rows that were not finite. One pass over the rows, where
    normalising with numpy and quantising after read a full load's 4 GB (10M x 100) three times."""
    d = vectors.shape[1]
    row_codes = np.zeros(codes.shape[1] * 4, np.int8)
    bad = 0
    for i in range(vectors.shape[0]):
        acc = 0.0
        finite = True
        for t in range(d):
            x = np.float64(vectors[i, t])
            acc += x * x
            finite &= np.isfinite(x)
        if not finite:
            bad += 1
            acc = 0.0
        nrm = np.float32(np.sqrt(acc))
        div = nrm if nrm != 0 else np.float32(1.0)
        for t in range(d):
            unit[i, t] = vectors[i, t] / div if finite else np.float32(0.0)
        norms[i] = nrm
        _quantise_one(unit, i, slots[i], row_codes, codes, scale, error, csum)
    return bad


def normalise_quantise(vectors: np.ndarray, unit: np.ndarray, norms: np.ndarray, codes, slots: np.ndarray) -> int:
    """``_normalise_quantise_rows`` over every row of ``vectors`` into ``unit``, ``norms`` and the ``codes``
    arrays at ``slots``; returns the rows that were not finite (served as zero vectors)."""
    if not len(vectors):
        return 0
    packed, scale, error, csum = codes
    return int(_normalise_quantise_rows(vectors, unit, norms, np.asarray(slots, np.int64), _words(packed), scale,
                                        error, csum))


def _words(packed: np.ndarray) -> np.ndarray:
    """The packed codes [tiles, groups, 4, 16, 4] as int32 words [tiles, groups, 4, 16] (a view)."""
    return packed.view(np.int32).reshape(packed.shape[:4])


@njit(nogil=True, cache=True)
def _copy_words(src, dst, src_words, words):
    """``words[tile(b), :, sub(b), lane(b)] = src_words[...a...]`` for pairs (a, b) of slots: a
    slot's code is one int32 (4 dims) per group in the packed layout viewed as int32."""
    groups = words.shape[1]
    for i in range(len(src)):
        a, b = src[i], dst[i]
        ta, sa, la = a >> 6, (a >> 4) & 3, a & 15
        tb, sb, lb = b >> 6, (b >> 4) & 3, b & 15
        for g in range(groups):
            words[tb, g, sb, lb] = src_words[ta, g, sa, la]


def _copy_slots(src, dst, src_codes, src_scale, src_error, src_csum, codes, scale, error, csum):
    """Move the codes of slots ``src[i]`` (in the ``src_*`` arrays) to slots ``dst[i]``."""
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    if not len(src):
        return
    _copy_words(src, dst, src_codes.view(np.int32).reshape(src_codes.shape[:4]),
                codes.view(np.int32).reshape(codes.shape[:4]))
    _copy_per_slot(src, dst, src_scale, src_error, src_csum, scale, error, csum)


@njit(nogil=True, cache=True)
def _copy_per_slot(src, dst, src_scale, src_error, src_csum, scale, error, csum):
    for i in range(len(src)):
        scale[dst[i]] = src_scale[src[i]]
        error[dst[i]] = src_error[src[i]]
        csum[dst[i]] = src_csum[src[i]]


@njit(nogil=True, cache=True)
def _dequantise(codes, scale, lo, hi, out):
    d = out.shape[1]
    for j in range(lo, hi):
        s = scale[j]
        tile, sub, lane = j >> 6, (j >> 4) & 3, j & 15
        for t in range(d):
            out[j - lo, t] = np.float32(codes[tile, t >> 2, sub, lane, t & 3]) * s


@njit(nogil=True, cache=True, inline="always")
def _heap_push(heap, size, k, v):
    """Insert ``v`` into the size-``k`` min-heap of lower bounds (the root is the k-th best); new size."""
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
    return size


@njit(nogil=True, cache=True, fastmath=True, inline="always")
def _dot(unit, row, queries, i):
    """float32 q . x in a vectorised loop (the only exact score the re-rank computes)."""
    acc = np.float32(0.0)
    for t in range(unit.shape[1]):
        acc += unit[row, t] * queries[i, t]
    return acc


@njit(nogil=True, cache=True, inline="always")
def _insert(out_rows, out_scores, i, k, filled, row, acc):
    """Put (row, acc) into query i's exact top k (best first; ties: lower row first); new fill."""
    if filled < k:
        at = filled
        filled += 1
    elif acc > out_scores[i, k - 1] or (acc == out_scores[i, k - 1] and row < out_rows[i, k - 1]):
        at = k - 1
    else:
        return filled
    while at > 0 and (out_scores[i, at - 1] < acc or (out_scores[i, at - 1] == acc and out_rows[i, at - 1] > row)):
        out_scores[i, at] = out_scores[i, at - 1]
        out_rows[i, at] = out_rows[i, at - 1]
        at -= 1
    out_scores[i, at] = acc
    out_rows[i, at] = row
    return filled


@njit(nogil=True, cache=True)
def _ivf_select(approx, tile_max, tile_ids, tile_ptr, tile_error, factor, constant, error, slot_row, exclude_ptr,
                exclude_rows, unit, row_phys, queries, k, cap, out_rows, out_scores, status):
    """Candidates over the tiles each query scanned (query i's tiles are
    ``tile_ids[tile_ptr[i]:tile_ptr[i + 1]]``, their scores ``approx[64 j : 64 j + 64]``; the full
    scan is the case where every query lists every tile) and the exact re-rank in one call
    (row r's unit vector is ``unit[row_phys[r]]``).
    ``out_rows``/``out_scores`` get the exact top k of the scanned rows (ties: lower row first;
    -1 / -inf where unfilled); ``status[i]`` is the number of candidates.

    There is no cap on the candidates (the buffers grow): rows of a dense cone, e.g. the
    mid-frequency words of a one-epoch skip-gram model, have thousands of rows within the int8
    error of the k-th score (18k of 220k, cosines 0.95 - 0.98), and the old way out (every scanned
    row in numpy, then a sort) cost 5 - 20 ms a query. The compiled kernel's ``scan_select``
    makes the same candidates while it scans (``probed_top_k``); this loop serves the full scan."""
    b = len(tile_ptr) - 1
    heap = np.empty(k, dtype=np.float32)
    cap = max(cap, 16)
    lb = np.empty(cap, dtype=np.float32)
    ub = np.empty(cap, dtype=np.float32)
    rows = np.empty(cap, dtype=np.int64)
    kth = np.empty(1, dtype=np.float32)
    two = np.zeros(2, dtype=np.int64)
    for i in range(b):
        qn, margin = factor[i], constant[i]
        size = 0
        c = 0
        threshold = -np.inf
        for j in range(tile_ptr[i], tile_ptr[i + 1]):
            tile = tile_ids[j]
            if tile_max[j] + (qn * tile_error[tile] + margin) < threshold:
                continue
            for t in range(TILE_ROWS):
                s = approx[j * TILE_ROWS + t]
                slot = tile * TILE_ROWS + t
                slack = qn * error[slot] + margin
                if s + slack < threshold:
                    continue
                row = slot_row[slot]
                if row < 0:
                    continue
                excluded = False
                for e in range(exclude_ptr[i], exclude_ptr[i + 1]):
                    if exclude_rows[e] == row:
                        excluded = True
                if excluded:
                    continue
                if c >= len(rows):                      # grow the candidate buffers
                    grown = 2 * len(rows)
                    lb2, ub2 = np.empty(grown, np.float32), np.empty(grown, np.float32)
                    rows2 = np.empty(grown, np.int64)
                    lb2[:c], ub2[:c], rows2[:c] = lb[:c], ub[:c], rows[:c]
                    lb, ub, rows = lb2, ub2, rows2
                lb[c] = s - slack
                ub[c] = s + slack
                rows[c] = row
                c += 1
                size = _heap_push(heap, size, k, s - slack)
                if size >= k:
                    threshold = heap[0]
        status[i] = c
        kth[0] = heap[0] if size >= k else -np.inf
        two[1] = c
        _rerank(rows, lb, ub, two, kth, unit, row_phys, queries[i:i + 1], k, out_rows[i:i + 1], out_scores[i:i + 1])


@njit(nogil=True, cache=True)
def _rerank(rows, lb, ub, cand_ptr, kth, unit, row_phys, queries, k, out_rows, out_scores):
    """The exact top k of each query's candidates ``rows[cand_ptr[i]:cand_ptr[i + 1]]`` (their int8
    bounds ``lb``/``ub``; ``kth[i]``: the k-th best lower bound) into ``out_rows``/``out_scores``
    (best first, ties: lower row first; -1 / -inf where unfilled). No sort: the candidates whose
    lower bound is among the k best are scored first (the k-th of their exact scores is a lower
    bound of the final k-th), then every other candidate whose upper bound still reaches the
    current k-th exact score. Any row of the scanned rows' exact top k has upper bound >= its
    score >= the k-th exact score >= the k-th lower bound, so it is scored."""
    for i in range(len(cand_ptr) - 1):
        for t in range(k):
            out_rows[i, t] = -1
            out_scores[i, t] = -np.inf
        threshold = kth[i]
        filled = 0
        lo, hi = cand_ptr[i], cand_ptr[i + 1]
        for o in range(lo, hi):                         # the k best lower bounds (and ties) first
            if lb[o] >= threshold:
                filled = _insert(out_rows, out_scores, i, k, filled, rows[o],
                                 _dot(unit, row_phys[rows[o]], queries, i))
        for o in range(lo, hi):                         # then whatever can still reach the k-th
            if lb[o] >= threshold or ub[o] < threshold:
                continue
            if filled >= k and ub[o] < out_scores[i, k - 1]:
                continue
            filled = _insert(out_rows, out_scores, i, k, filled, rows[o], _dot(unit, row_phys[rows[o]], queries, i))


@njit(nogil=True, cache=True)
def _quantise_queries(queries, groups, packed, qscale, qerror, factor, constant):
    """int8 codes of the queries as unsigned bytes (code + 128; see int8_scan.c) into ``packed``,
    their scales and |q - q_hat| rounded up (the compiled twin of ``quantise_queries``), and the
    slack terms of ``_margins``."""
    b, dim = queries.shape
    for i in range(b):
        m = np.float32(0.0)
        q2 = 0.0
        for t in range(dim):
            q2 += np.float64(queries[i, t]) * queries[i, t]
            a = abs(queries[i, t])
            if a > m:
                m = a
        s = np.float32(m / np.float32(127.0))
        inv = np.float32(127.0) / m if m > 0 else np.float32(0.0)
        e2 = 0.0
        for t in range(groups * 4):
            packed[i, t] = 128
        for t in range(dim):
            c = min(max(np.rint(queries[i, t] * inv), -127.0), 127.0)
            packed[i, t] = np.uint8(c + 128)
            diff = np.float64(queries[i, t]) - c * np.float64(s)
            e2 += diff * diff
        qscale[i] = s
        qerror[i] = np.float32(np.sqrt(e2) * 1.000001 + 1e-9)
        qnorm = np.float32(np.sqrt(q2))
        factor[i] = qnorm + qerror[i]
        constant[i] = np.float32(qnorm * np.float32(_ROUNDING_PER_DIM * dim) + np.float32(1e-6)) + qerror[i]


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
    """[b, n] scores of the first ``n`` int8 slots, the best score of each of their tiles ([b,
    tiles]) and, per query, |q - q_hat| (0 where q is not quantised). ``codes`` may hold
    more tiles (spare capacity); only ceil(n / 64) are scanned."""
    out, tile_max, qerror = _approx_full(codes, scale, csum, queries, n, scan)
    return out[:, :n], tile_max, qerror


def _approx_full(codes, scale, csum, queries, n, scan):
    """``approx_scores`` with whole tiles ([b, tiles * 64]; slots beyond ``n`` score 0, or -inf in numpy)."""
    groups = codes.shape[1]
    tiles = -(-n // TILE_ROWS)
    b, dim = queries.shape
    if scan != "numpy":
        packed, qscale, qerror = quantise_queries(queries, groups)
        out = np.empty((b, tiles * TILE_ROWS), dtype=np.float32)
        tile_max = np.empty((b, tiles), dtype=np.float32)
        _int8_scan.scan(codes, csum, scale, packed, qscale, out, tile_max, tiles, groups, b, tiles * TILE_ROWS,
                        isa=ISA[scan])
        return out, tile_max, qerror
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
    return out, out.reshape(b, tiles, TILE_ROWS).max(axis=2), np.zeros(b, np.float32)


def quantise(unit: np.ndarray, rows: np.ndarray | None = None, codes=None, slots: np.ndarray | None = None):
    """Codes of ``unit`` (all rows, or only ``rows`` into the given ``codes`` arrays, at
    ``slots`` or else at the same positions): (packed codes, scale, error, csum)."""
    n, dim = unit.shape
    if codes is None:
        codes = _empty_codes(n, dim)
    packed, scale, error, csum = codes
    rows = np.arange(n, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
    slots = rows if slots is None else np.asarray(slots, np.int64)
    if len(rows) and dim:
        _quantise_rows(unit, rows, slots, _words(packed), scale, error, csum)
    elif len(rows):
        scale[slots] = 0
        error[slots] = 0
        csum[slots] = 0
    return codes


def code_matrix(codes: np.ndarray, n: int, dim: int) -> np.ndarray:
    """The packed codes as an [n, dim] int8 matrix (for tests and inspection)."""
    tiles, groups = codes.shape[0], codes.shape[1]
    return codes.transpose(0, 2, 3, 1, 4).reshape(tiles * TILE_ROWS, groups * 4)[:n, :dim]


def tile_error(error: np.ndarray) -> np.ndarray:
    """Largest |x - x_hat| per tile: lets ``_ivf_select`` skip whole tiles."""
    return error.reshape(-1, TILE_ROWS).max(axis=1) if len(error) else np.zeros(0, np.float32)


def _margins(queries: np.ndarray, qerror: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query: the factor of a slot's error and the constant of its slack,
    |q| e + |q - q_hat| (1 + e) + rounding = (|q| + |q - q_hat|) e + (|q - q_hat| + rounding)."""
    qnorm = np.sqrt(np.einsum("ij,ij->i", queries, queries)).astype(np.float32)
    margins = (qnorm * np.float32(_ROUNDING_PER_DIM * dim) + np.float32(1e-6)).astype(np.float32)
    return (qnorm + qerror).astype(np.float32), (margins + qerror).astype(np.float32)


def _best(rows_i: np.ndarray, scores: np.ndarray, kk: int, top: np.ndarray, top_scores: np.ndarray, i: int):
    order = np.lexsort((rows_i, -scores))[:kk]           # best first, ties: lower row first
    m = len(order)
    top[i, :m] = rows_i[order]
    top_scores[i, :m] = scores[order]


def prefiltered_top_k(unit: np.ndarray, row_phys: np.ndarray, codes, tile_errors: np.ndarray, queries: np.ndarray,
                      ptr: np.ndarray, flat: np.ndarray, kk: int, slot_row: np.ndarray | None = None,
                      row_slot: np.ndarray | None = None, slots: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows and scores of the exact top ``kk`` of each query ([b, kk]; -1 / -inf where unfilled),
    excluding rows ``flat[ptr[i]:ptr[i + 1]]`` for query i. ``slot_row``/``row_slot`` map the
    code slots to rows and back (default: slot r is row r); ``slots`` is how many are in use.
    Every tile is scanned, then ``_ivf_select`` picks and re-ranks as for the probed lists.
    Row r's unit vector is ``unit[row_phys[r]]``."""
    packed, scale, error, csum = codes
    b, n = len(queries), len(row_phys)
    dim = unit.shape[1]
    slots = n if slots is None else slots
    tiles = -(-slots // TILE_ROWS)
    if slot_row is None:
        slot_row = np.arange(n, dtype=np.int64)
    if len(slot_row) < tiles * TILE_ROWS:                # the end of the last tile holds no row
        slot_row = np.concatenate([slot_row[:slots], np.full(tiles * TILE_ROWS - slots, -1, np.int64)])
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    approx, tile_max, qerror = _approx_full(packed, scale, csum, queries, slots, SCAN)
    factor, constant = _margins(queries, qerror, dim)
    top = np.empty((b, kk), dtype=np.int64)
    top_scores = np.empty((b, kk), dtype=np.float32)
    tile_ids = np.tile(np.arange(tiles, dtype=np.int64), b)
    tile_ptr = np.arange(b + 1, dtype=np.int64) * tiles
    _ivf_select(approx.reshape(-1), tile_max.reshape(-1), tile_ids, tile_ptr, tile_errors, factor, constant, error,
                np.ascontiguousarray(slot_row, dtype=np.int64), ptr, flat, unit, row_phys, queries, kk, 4 * kk + 1024, top,
                top_scores, np.empty(b, dtype=np.int64))
    return top, top_scores


def probed_top_k(unit: np.ndarray, row_phys: np.ndarray, codes, slot_row: np.ndarray, queries: np.ndarray,
                 tile_ids: np.ndarray, tile_ptr: np.ndarray, ptr: np.ndarray, flat: np.ndarray,
                 kk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Like ``prefiltered_top_k``, but query i searches only the slots of the tiles
    ``tile_ids[tile_ptr[i]:tile_ptr[i + 1]]``: the exact top ``kk`` among those rows. Also
    returns how many slots each query scanned."""
    packed, scale, error, csum = codes
    b, dim = queries.shape
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    tile_ids = np.ascontiguousarray(tile_ids, dtype=np.int64)
    tile_ptr = np.ascontiguousarray(tile_ptr, dtype=np.int64)
    top = np.full((b, kk), -1, dtype=np.int64)
    top_scores = np.full((b, kk), -np.inf, dtype=np.float32)
    searched = np.diff(tile_ptr) * TILE_ROWS
    if SCAN == "numpy":            # no kernel: score the probed rows exactly in float32
        for i in range(b):
            _best_of_scanned(unit, row_phys, slot_row, queries, tile_ids, tile_ptr, ptr, flat, kk, top, top_scores, i)
        return top, top_scores, searched
    groups = packed.shape[1]
    packed_q = np.empty((b, groups * 4), np.uint8)
    qscale, qerror = np.empty(b, np.float32), np.empty(b, np.float32)
    factor, constant = np.empty(b, np.float32), np.empty(b, np.float32)
    _quantise_queries(queries, groups, packed_q, qscale, qerror, factor, constant)
    # at most every scanned slot is a candidate: untouched pages of these cost nothing
    space = len(tile_ids) * TILE_ROWS
    cand_rows, cand_lb, cand_ub = np.empty(space, np.int64), np.empty(space, np.float32), np.empty(space, np.float32)
    cand_ptr, kth = np.empty(b + 1, np.int64), np.empty(b, np.float32)
    _int8_scan.scan_select(packed, csum, scale, error, slot_row, packed_q, qscale, factor, constant, tile_ids,
                           tile_ptr, np.ascontiguousarray(ptr, np.int64), np.ascontiguousarray(flat, np.int64), kk,
                           cand_rows, cand_lb, cand_ub, cand_ptr, kth, groups, b, isa=ISA[SCAN])
    _rerank(cand_rows, cand_lb, cand_ub, cand_ptr, kth, unit, row_phys, queries, kk, top, top_scores)
    return top, top_scores, searched


def _best_of_scanned(unit, row_phys, slot_row, queries, tile_ids, tile_ptr, ptr, flat, kk, top, top_scores,
                     i) -> None:
    slots = (tile_ids[tile_ptr[i]:tile_ptr[i + 1], None] * TILE_ROWS + np.arange(TILE_ROWS)).ravel()
    rows_i = slot_row[slots]
    rows_i = np.sort(rows_i[(rows_i >= 0) & ~np.isin(rows_i, flat[ptr[i]:ptr[i + 1]])])
    top[i] = -1
    top_scores[i] = -np.inf
    _best(rows_i, unit[row_phys[rows_i]] @ queries[i], kk, top, top_scores, i)


def warm_up() -> None:
    """Compile (or load from numba's cache) the pre-filter's kernels before the first query needs them."""
    unit = np.eye(3, dtype=np.float32)
    codes, scale, error, csum = quantise(unit)
    _dequantise(codes, scale, 0, 3, np.empty((3, 3), np.float32))
    _copy_slots(np.zeros(1, np.int64), np.ones(1, np.int64), codes, scale, error, csum, codes, scale, error, csum)
    normalise_quantise(unit.copy(), unit.copy(), np.empty(3, np.float32), (codes, scale, error, csum), np.arange(3))
    _quantise_queries(unit, 1, np.empty((3, 4), np.uint8), *[np.empty(3, np.float32) for _ in range(4)])
    three = np.full(64, -1, np.int64)
    three[:3] = np.arange(3)
    _ivf_select(np.zeros(64, np.float32), np.zeros(1, np.float32), np.zeros(1, np.int64), np.array([0, 1], np.int64),
                np.zeros(1, np.float32), np.ones(1, np.float32), np.ones(1, np.float32), error, three,
                np.zeros(2, np.int64), np.zeros(0, np.int64), unit, np.arange(3, dtype=np.int64), unit[:1].copy(), 2, 8,
                np.empty((1, 2), np.int64), np.empty((1, 2), np.float32), np.empty(1, np.int64))
