/*
 * int8 scoring of rows against a batch of queries: the front end's hot loop.
 *
 * Why C: a 100k x 100 query is 10M multiply-adds. float32 BLAS does them at about 1.4 ms
 * for one query (it streams 40 MB) and 0.35 - 0.5 ms per query in batches. Here rows and
 * queries are int8: AVX-512 VNNI's vpdpbusd does 64 int8 multiply-adds per instruction,
 * AVX2's vpmaddubsw + vpmaddwd 32 per pair; the work is a fraction of the instructions over a
 * quarter of the bytes. numba emits neither.
 * Design: docs/design/0005-serving-index.md
 *
 * The scores are approximate (both sides are quantised); int8_prefilter.py turns them into
 * exact answers with an error bound per row and a float32 re-score of the few candidates.
 *
 * Maths. Slot r has codes c[r, t] in [-127, 127] with x[r, t] ~ scale[r] * c[r, t]; a query
 * has codes p[t] in [-127, 127] with q[t] ~ qscale * p[t]. vpdpbusd multiplies unsigned by
 * signed bytes, so the query is sent as u[t] = p[t] + 128 in [1, 255], and
 *     sum_t u[t] c[r, t] = sum_t p[t] c[r, t] + 128 * csum[r],   csum[r] = sum_t c[r, t],
 * hence score[r] = qscale * scale[r] * (sum_t u[t] c[r, t] - 128 csum[r]). AVX2's vpmaddubsw
 * saturates its int16 pair sums, so the AVX2 loop takes p = u - 128 back and multiplies |p|
 * (unsigned) by sign(p) * c (signed): a pair is at most 2 * 127 * 127 < 2^15, no saturation,
 * and no csum correction. No overflow anywhere: a lane adds 4 products of at most 255 * 127
 * per step; 512 dims stay below 2^24, so the int32 -> float32 conversion is exact too.
 *
 * Layout (written by int8_prefilter._quantise_rows): slots in tiles of 64, dims in groups of
 * 4, codes[tile][group][sub-block of 16 slots][slot in sub-block][dim in group]. One 64-byte
 * load is then 16 slots x 4 dims, exactly one vpdpbusd operand (two AVX2 operands of 8
 * slots), and a tile keeps independent accumulators in flight. Slot R, dim t lives at
 * ((R / 64 * groups + t / 4) * 4 + R / 16 % 4) * 64 + R % 16 * 4 + t % 4.
 *
 * scan() scores every tile against every query of the batch, tile by tile and, inside a
 * tile, query by query: a tile's codes (groups x 256 bytes) are read from memory once per
 * batch and then from L1 for every further query (the exact search). scan_select()
 * scores, for each query, only the tiles it names (the inverted file's probed lists) and filters
 * the candidates (score + error bound still reaching the k-th lower bound) while the tile is in L1.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_BUILD 1
#else
#define HAVE_X86_BUILD 0
#endif

#define TILE_ROWS 64

enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_VNNI = 2 };

typedef void (*tile_fn)(const int8_t *ct, const int32_t *cs, const float *sc, const uint8_t *qi, float qscale,
                        Py_ssize_t groups, float *o, float *best);

#if HAVE_X86_BUILD
/* One tile (64 slots) against one query: 64 scores into o, their largest into *best. */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void tile_vnni(const int8_t *ct, const int32_t *cs, const float *sc, const uint8_t *qi, float qscale,
                      Py_ssize_t groups, float *o, float *best)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (Py_ssize_t g = 0; g < groups; g++) {
        int32_t four;
        memcpy(&four, qi + 4 * g, 4);
        const __m512i qb = _mm512_set1_epi32(four);          /* 4 query bytes in every lane */
        const int8_t *cg = ct + g * 256;
        a0 = _mm512_dpbusd_epi32(a0, qb, _mm512_loadu_si512((const void *)(cg)));
        a1 = _mm512_dpbusd_epi32(a1, qb, _mm512_loadu_si512((const void *)(cg + 64)));
        a2 = _mm512_dpbusd_epi32(a2, qb, _mm512_loadu_si512((const void *)(cg + 128)));
        a3 = _mm512_dpbusd_epi32(a3, qb, _mm512_loadu_si512((const void *)(cg + 192)));
    }
    const __m512 qs = _mm512_set1_ps(qscale);
    __m512i acc[4] = {a0, a1, a2, a3};
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int s = 0; s < 4; s++) {
        __m512i bias = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(cs + 16 * s)), 7);   /* 128 csum */
        __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[s], bias));
        v = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_loadu_ps(sc + 16 * s)), qs);
        _mm512_storeu_ps(o + 16 * s, v);
        m = _mm512_max_ps(m, v);
    }
    *best = _mm512_reduce_max_ps(m);
}

__attribute__((target("avx2")))
static void tile_avx2(const int8_t *ct, const int32_t *cs, const float *sc, const uint8_t *qi, float qscale,
                      Py_ssize_t groups, float *o, float *best)
{
    (void)cs;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i acc[8];
    for (int h = 0; h < 8; h++)
        acc[h] = _mm256_setzero_si256();
    for (Py_ssize_t g = 0; g < groups; g++) {
        int32_t four;
        memcpy(&four, qi + 4 * g, 4);
        const __m256i qs = _mm256_xor_si256(_mm256_set1_epi32(four), flip);   /* p = u - 128, signed */
        const __m256i qa = _mm256_abs_epi8(qs);
        const int8_t *cg = ct + g * 256;
        for (int h = 0; h < 8; h++) {                   /* 32 bytes = 8 slots x 4 dims: slots 8h .. 8h + 7 */
            const __m256i c = _mm256_loadu_si256((const __m256i *)(cg + 32 * h));
            const __m256i p16 = _mm256_maddubs_epi16(qa, _mm256_sign_epi8(c, qs));
            acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(p16, ones));
        }
    }
    const __m256 q = _mm256_set1_ps(qscale);
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int h = 0; h < 8; h++) {
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[h]), _mm256_loadu_ps(sc + 8 * h)), q);
        _mm256_storeu_ps(o + 8 * h, v);
        m = _mm256_max_ps(m, v);
    }
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_shuffle_ps(r, r, 1));
    *best = _mm_cvtss_f32(r);
}
#endif

/* The same sums without SIMD intrinsics, for CPUs with neither. */
static void tile_portable(const int8_t *ct, const int32_t *cs, const float *sc, const uint8_t *qi, float qscale,
                          Py_ssize_t groups, float *o, float *best)
{
    int32_t acc[TILE_ROWS];
    memset(acc, 0, sizeof(acc));
    for (Py_ssize_t g = 0; g < groups; g++) {
        const int8_t *cg = ct + g * 256;
        for (int r = 0; r < TILE_ROWS; r++)
            for (int t = 0; t < 4; t++)
                acc[r] += (int32_t)qi[4 * g + t] * (int32_t)cg[r * 4 + t];
    }
    float m = -INFINITY;
    for (int r = 0; r < TILE_ROWS; r++) {
        o[r] = ((float)(acc[r] - 128 * cs[r]) * sc[r]) * qscale;
        if (o[r] > m)
            m = o[r];
    }
    *best = m;
}

static int cpu_has(int isa)
{
#if HAVE_X86_BUILD
    __builtin_cpu_init();
    if (isa == ISA_AVX2)
        return __builtin_cpu_supports("avx2");
    if (isa == ISA_VNNI)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
            && __builtin_cpu_supports("avx512vnni");
#endif
    return isa == ISA_PORTABLE;
}

static tile_fn tile_kernel(int isa)
{
#if HAVE_X86_BUILD
    if (isa == ISA_VNNI && cpu_has(ISA_VNNI))
        return tile_vnni;
    if (isa == ISA_AVX2 && cpu_has(ISA_AVX2))
        return tile_avx2;
#endif
    return tile_portable;
}

static int check(int ok, const char *what)
{
    if (!ok)
        PyErr_Format(PyExc_ValueError, "int8 scan: %s", what);
    return ok;
}

PyDoc_STRVAR(scan_doc,
"scan(codes, csum, scale, queries, qscale, out, tile_max, tiles, groups, batch, out_stride, isa=0)\n\n"
"out[i, r] = qscale[i] * scale[r] * (sum_t queries[i, t] * codes[r, t] - 128 * csum[r]) for the\n"
"tiles * 64 slots, and tile_max[i, tile] = the largest of a tile's 64 scores (lets the caller skip\n"
"whole tiles); buffers are C-contiguous (int8, int32, float32, uint8, float32, float32, float32);\n"
"codes, csum and scale may hold more tiles than are scanned. isa: 0 portable, 1 AVX2, 2 AVX-512\n"
"VNNI (falls back to portable where the CPU lacks it). Runs without the GIL.");

static PyObject *scan(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"codes", "csum", "scale", "queries", "qscale", "out", "tile_max", "tiles", "groups",
                             "batch", "out_stride", "isa", NULL};
    Py_buffer codes, csum, scale, queries, qscale, out, tile_max;
    Py_ssize_t tiles, groups, batch, out_stride;
    int isa = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*y*y*y*w*w*nnnn|i", kwlist, &codes, &csum, &scale,
                                     &queries, &qscale, &out, &tile_max, &tiles, &groups, &batch, &out_stride,
                                     &isa))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t rows = tiles * TILE_ROWS;
    if (!check(tiles >= 0 && groups > 0 && batch >= 0, "tiles, groups and batch must be non-negative")
        || !check(codes.len >= tiles * groups * 256 && codes.len % (groups * 256) == 0,
                  "codes must hold at least tiles * groups * 256 bytes")
        || !check(csum.len >= rows * 4, "csum must hold tiles * 64 int32")
        || !check(scale.len >= rows * 4, "scale must hold tiles * 64 float32")
        || !check(queries.len == batch * groups * 4, "queries must hold batch * groups * 4 bytes")
        || !check(qscale.len == batch * 4, "qscale must hold batch float32")
        || !check(out_stride >= rows && out.len >= (batch ? ((batch - 1) * out_stride + rows) * 4 : 0),
                  "out is too small for batch rows of out_stride float32")
        || !check(tile_max.len == batch * tiles * 4, "tile_max must hold batch * tiles float32"))
        goto done;
    tile_fn kernel = tile_kernel(isa);
    const int8_t *cb = codes.buf;
    const int32_t *cs = csum.buf;
    const float *sc = scale.buf, *qsc = qscale.buf;
    const uint8_t *qb = queries.buf;
    float *ob = out.buf, *tm = tile_max.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t tile = 0; tile < tiles; tile++)
        for (Py_ssize_t i = 0; i < batch; i++)
            kernel(cb + tile * groups * 256, cs + tile * TILE_ROWS, sc + tile * TILE_ROWS, qb + i * groups * 4,
                   qsc[i], groups, ob + i * out_stride + tile * TILE_ROWS, tm + i * tiles + tile);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&codes);
    PyBuffer_Release(&csum);
    PyBuffer_Release(&scale);
    PyBuffer_Release(&queries);
    PyBuffer_Release(&qscale);
    PyBuffer_Release(&out);
    PyBuffer_Release(&tile_max);
    return result;
}

/* A lower bound in the size-k min-heap of the k best lower bounds (the root is the k-th best); new size. */
static Py_ssize_t heap_push(float *heap, Py_ssize_t size, Py_ssize_t k, float v)
{
    Py_ssize_t pos;
    if (size < k) {
        pos = size++;
        while (pos > 0) {
            Py_ssize_t parent = (pos - 1) / 2;
            if (heap[parent] <= v)
                break;
            heap[pos] = heap[parent];
            pos = parent;
        }
        heap[pos] = v;
    } else if (v > heap[0]) {
        pos = 0;
        for (;;) {
            Py_ssize_t child = 2 * pos + 1;
            if (child >= k)
                break;
            if (child + 1 < k && heap[child + 1] < heap[child])
                child++;
            if (v <= heap[child])
                break;
            heap[pos] = heap[child];
            pos = child;
        }
        heap[pos] = v;
    }
    return size;
}

/* Bit t set where slot t of the tile may still reach the threshold: score + factor * error + constant >= thr. */
typedef uint64_t (*reach_fn)(const float *o, const float *err, float factor, float constant, float thr);

static uint64_t reach_portable(const float *o, const float *err, float factor, float constant, float thr)
{
    uint64_t mask = 0;
    for (int t = 0; t < TILE_ROWS; t++)
        if (!(o[t] + (factor * err[t] + constant) < thr))
            mask |= (uint64_t)1 << t;
    return mask;
}

#if HAVE_X86_BUILD
__attribute__((target("avx512f")))
static uint64_t reach_avx512(const float *o, const float *err, float factor, float constant, float thr)
{
    const __m512 f = _mm512_set1_ps(factor), c = _mm512_set1_ps(constant), th = _mm512_set1_ps(thr);
    uint64_t mask = 0;
    for (int s = 0; s < 4; s++) {
        __m512 ub = _mm512_add_ps(_mm512_loadu_ps(o + 16 * s),
                                  _mm512_add_ps(_mm512_mul_ps(f, _mm512_loadu_ps(err + 16 * s)), c));
        mask |= (uint64_t)_mm512_cmp_ps_mask(ub, th, _CMP_NLT_UQ) << (16 * s);
    }
    return mask;
}
#endif

PyDoc_STRVAR(scan_select_doc,
"scan_select(codes, csum, scale, error, slot_row, queries, qscale, factor, constant, tile_ids, tile_ptr,\n"
"            exclude_ptr, exclude_rows, k, cand_rows, cand_lb, cand_ub, cand_ptr, kth, groups, batch, isa=0)\n\n"
"The probed lists' scan and the candidates' filter in one pass, so no score leaves the cache: for query i, the\n"
"slots of tiles tile_ids[tile_ptr[i]:tile_ptr[i + 1]] whose upper bound (score + factor[i] * error[slot]\n"
"+ constant[i]) still reaches the k-th best lower bound seen so far, that hold a row (slot_row >= 0) and\n"
"whose row is not in exclude_rows[exclude_ptr[i]:exclude_ptr[i + 1]], go to cand_rows / cand_lb / cand_ub\n"
"[cand_ptr[i]:cand_ptr[i + 1]] in scan order; kth[i] gets the k-th best lower bound (-inf: fewer than k).\n"
"The candidate buffers must hold 64 entries per tile id. Runs without the GIL.");

static PyObject *scan_select(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"codes", "csum", "scale", "error", "slot_row", "queries", "qscale", "factor",
                             "constant", "tile_ids", "tile_ptr", "exclude_ptr", "exclude_rows", "k", "cand_rows",
                             "cand_lb", "cand_ub", "cand_ptr", "kth", "groups", "batch", "isa", NULL};
    Py_buffer codes, csum, scale, error, slot_row, queries, qscale, factor, constant, tile_ids, tile_ptr, ex_ptr,
        ex_rows, cand_rows, cand_lb, cand_ub, cand_ptr, kth;
    Py_ssize_t k, groups, batch;
    int isa = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*y*y*y*y*y*y*y*y*y*y*y*nw*w*w*w*w*nn|i", kwlist, &codes,
                                     &csum, &scale, &error, &slot_row, &queries, &qscale, &factor, &constant,
                                     &tile_ids, &tile_ptr, &ex_ptr, &ex_rows, &k, &cand_rows, &cand_lb, &cand_ub,
                                     &cand_ptr, &kth, &groups, &batch, &isa))
        return NULL;
    PyObject *result = NULL;
    float *heap = NULL;
    const int64_t *ids = tile_ids.buf, *ptr = tile_ptr.buf, *xp = ex_ptr.buf, *xr = ex_rows.buf;
    const int64_t *srow = slot_row.buf;
    Py_ssize_t total = tile_ids.len / 8, tiles = groups > 0 ? codes.len / (groups * 256) : 0;
    /* a tile id must have all of its 64 slots in every per-slot array (some may hold spare capacity) */
    Py_ssize_t per_slot = csum.len / 4;
    per_slot = scale.len / 4 < per_slot ? scale.len / 4 : per_slot;
    per_slot = error.len / 4 < per_slot ? error.len / 4 : per_slot;
    per_slot = slot_row.len / 8 < per_slot ? slot_row.len / 8 : per_slot;
    if (per_slot / TILE_ROWS < tiles)
        tiles = per_slot / TILE_ROWS;
    if (!check(groups > 0 && batch >= 0 && k > 0, "groups, batch and k must be positive")
        || !check(codes.len % (groups * 256) == 0, "codes must hold whole tiles of groups * 256 bytes")
        || !check(queries.len == batch * groups * 4, "queries must hold batch * groups * 4 bytes")
        || !check(qscale.len == batch * 4 && factor.len == batch * 4 && constant.len == batch * 4
                  && kth.len == batch * 4, "qscale, factor, constant and kth must hold batch float32")
        || !check(tile_ptr.len == (batch + 1) * 8 && ex_ptr.len == (batch + 1) * 8 && cand_ptr.len == (batch + 1) * 8,
                  "tile_ptr, exclude_ptr and cand_ptr must hold batch + 1 int64")
        || !check(cand_rows.len >= total * TILE_ROWS * 8 && cand_lb.len >= total * TILE_ROWS * 4
                  && cand_ub.len >= total * TILE_ROWS * 4, "the candidate buffers must hold 64 entries per tile id"))
        goto done;
    if (batch && !check(ptr[0] == 0 && ptr[batch] == total, "tile_ptr must run from 0 to len(tile_ids)"))
        goto done;
    for (Py_ssize_t i = 0; i < batch; i++)
        if (!check(ptr[i] <= ptr[i + 1] && xp[i] <= xp[i + 1] && xp[i] >= 0 && xp[i + 1] <= ex_rows.len / 8,
                   "tile_ptr and exclude_ptr must not decrease and must stay in their arrays"))
            goto done;
    for (Py_ssize_t j = 0; j < total; j++)
        if (!check(ids[j] >= 0 && ids[j] < tiles, "a tile id is out of range"))
            goto done;
    heap = PyMem_RawMalloc(k * sizeof(float));
    if (heap == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    tile_fn kernel = tile_kernel(isa);
    reach_fn reach = reach_portable;
#if HAVE_X86_BUILD
    if (isa == ISA_VNNI && cpu_has(ISA_VNNI))
        reach = reach_avx512;
#endif
    const int8_t *cb = codes.buf;
    const int32_t *cs = csum.buf;
    const float *sc = scale.buf, *qsc = qscale.buf, *er = error.buf, *fa = factor.buf, *co = constant.buf;
    const uint8_t *qb = queries.buf;
    int64_t *crow = cand_rows.buf, *cptr = cand_ptr.buf;
    float *clb = cand_lb.buf, *cub = cand_ub.buf, *kb = kth.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t c = 0;
    float o[TILE_ROWS];
    cptr[0] = 0;
    for (Py_ssize_t i = 0; i < batch; i++) {
        const float qn = fa[i], margin = co[i];
        float threshold = -INFINITY, best;
        Py_ssize_t size = 0;
        for (int64_t j = ptr[i]; j < ptr[i + 1]; j++) {
            const int64_t tile = ids[j];
            if (j + 1 < ptr[i + 1])
                __builtin_prefetch(cb + ids[j + 1] * groups * 256);
            kernel(cb + tile * groups * 256, cs + tile * TILE_ROWS, sc + tile * TILE_ROWS, qb + i * groups * 4,
                   qsc[i], groups, o, &best);
            uint64_t mask = reach(o, er + tile * TILE_ROWS, qn, margin, threshold);
            while (mask) {
                const int t = __builtin_ctzll(mask);
                mask &= mask - 1;
                const int64_t slot = tile * TILE_ROWS + t;
                const float slack = qn * er[slot] + margin;
                if (o[t] + slack < threshold)           /* the threshold rose within this tile */
                    continue;
                const int64_t row = srow[slot];
                if (row < 0)
                    continue;
                int excluded = 0;
                for (int64_t e = xp[i]; e < xp[i + 1]; e++)
                    excluded |= xr[e] == row;
                if (excluded)
                    continue;
                crow[c] = row;
                clb[c] = o[t] - slack;
                cub[c] = o[t] + slack;
                c++;
                size = heap_push(heap, size, k, o[t] - slack);
                if (size >= k)
                    threshold = heap[0];
            }
        }
        cptr[i + 1] = c;
        kb[i] = size >= k ? heap[0] : -INFINITY;
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_RawFree(heap);
    PyBuffer_Release(&codes);
    PyBuffer_Release(&csum);
    PyBuffer_Release(&scale);
    PyBuffer_Release(&error);
    PyBuffer_Release(&slot_row);
    PyBuffer_Release(&queries);
    PyBuffer_Release(&qscale);
    PyBuffer_Release(&factor);
    PyBuffer_Release(&constant);
    PyBuffer_Release(&tile_ids);
    PyBuffer_Release(&tile_ptr);
    PyBuffer_Release(&ex_ptr);
    PyBuffer_Release(&ex_rows);
    PyBuffer_Release(&cand_rows);
    PyBuffer_Release(&cand_lb);
    PyBuffer_Release(&cand_ub);
    PyBuffer_Release(&cand_ptr);
    PyBuffer_Release(&kth);
    return result;
}

static PyObject *has_vnni(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(cpu_has(ISA_VNNI));
}

static PyObject *has_avx2(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(cpu_has(ISA_AVX2));
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_VARARGS | METH_KEYWORDS, scan_doc},
    {"scan_select", (PyCFunction)(void (*)(void))scan_select, METH_VARARGS | METH_KEYWORDS, scan_select_doc},
    {"has_vnni", has_vnni, METH_NOARGS, "Whether this CPU runs the AVX-512 VNNI kernel."},
    {"has_avx2", has_avx2, METH_NOARGS, "Whether this CPU runs the AVX2 kernel."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_int8_scan", "int8 x int8 scoring kernel of the front end (see int8_scan.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__int8_scan(void)
{
    return PyModule_Create(&module);
}
