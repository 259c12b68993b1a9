/*
 * int8 scoring of the whole vocabulary against a batch of queries: the front end's hot loop.
 *
 * Why C: a 100k x 100 query is 10M multiply-adds. float32 BLAS does them at about 1.4 ms
 * for one query (it streams 40 MB) and 0.35 - 0.5 ms per query in batches. Here rows and
 * queries are int8, and AVX-512 VNNI's vpdpbusd does 64 int8 multiply-adds per
 * instruction into 16 int32 sums, so the same work is a fifth of the instructions over a
 * quarter of the bytes (10 MB, which fits this machine's L3). numba cannot emit
 * vpdpbusd; the measurement is in bench/README.md.
 *
 * The scores are approximate (both sides are quantised); int8_prefilter.py turns them into
 * exact answers with an error bound per row and a float32 re-score of the few candidates.
 *
 * Maths. Row r has codes c[r, t] in [-127, 127] with x[r, t] ~ scale[r] * c[r, t]; a query
 * has codes p[t] in [-127, 127] with q[t] ~ qscale * p[t]. vpdpbusd multiplies unsigned by
 * signed bytes, so the query is sent as u[t] = p[t] + 128 in [1, 255], and
 *     sum_t u[t] c[r, t] = sum_t p[t] c[r, t] + 128 * csum[r],   csum[r] = sum_t c[r, t],
 * hence score[r] = qscale * scale[r] * (sum_t u[t] c[r, t] - 128 csum[r]). No overflow: a
 * lane adds 4 products of at most 255 * 127 per step; 512 dims stay below 2^24, so the
 * int32 -> float32 conversion is exact too.
 *
 * Layout (written by int8_prefilter._quantise_rows): rows in tiles of 64, dims in groups of 4,
 * codes[tile][group][sub-block of 16 rows][row in sub-block][dim in group]. One 64-byte load
 * is then 16 rows x 4 dims, exactly one vpdpbusd operand, and a tile keeps four
 * independent accumulators in flight (vpdpbusd's latency is about 4 cycles). Row R, dim t
 * lives at ((R / 64 * groups + t / 4) * 4 + R / 16 % 4) * 64 + R % 16 * 4 + t % 4.
 *
 * The loop runs tile by tile and, inside a tile, query by query: a tile's codes (groups x
 * 256 bytes) are read from memory once per batch and then from L1 for every further query.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_VNNI_BUILD 1
#else
#define HAVE_VNNI_BUILD 0
#endif

#define TILE_ROWS 64

#if HAVE_VNNI_BUILD
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static void scan_vnni(const int8_t *codes, const int32_t *csum, const float *scale, const uint8_t *queries,
                      const float *qscale, float *out, float *tile_max, Py_ssize_t tiles, Py_ssize_t groups,
                      Py_ssize_t batch, Py_ssize_t out_stride)
{
    for (Py_ssize_t tile = 0; tile < tiles; tile++) {
        const int8_t *ct = codes + tile * groups * 256;
        const int32_t *cs = csum + tile * TILE_ROWS;
        const float *sc = scale + tile * TILE_ROWS;
        __m512i bias[4];
        __m512 rs[4];
        for (int s = 0; s < 4; s++) {
            bias[s] = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(cs + 16 * s)), 7);  /* 128 csum */
            rs[s] = _mm512_loadu_ps(sc + 16 * s);
        }
        for (Py_ssize_t i = 0; i < batch; i++) {
            const uint8_t *qi = queries + i * groups * 4;
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
            const __m512 qs = _mm512_set1_ps(qscale[i]);
            float *o = out + i * out_stride + tile * TILE_ROWS;
            __m512i acc[4] = {a0, a1, a2, a3};
            __m512 best = _mm512_set1_ps(-INFINITY);
            for (int s = 0; s < 4; s++) {
                __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[s], bias[s]));
                v = _mm512_mul_ps(_mm512_mul_ps(v, rs[s]), qs);
                _mm512_storeu_ps(o + 16 * s, v);
                best = _mm512_max_ps(best, v);
            }
            tile_max[i * tiles + tile] = _mm512_reduce_max_ps(best);
        }
    }
}
#endif

/* The same sums without SIMD intrinsics, for CPUs without AVX-512 VNNI. */
static void scan_portable(const int8_t *codes, const int32_t *csum, const float *scale, const uint8_t *queries,
                          const float *qscale, float *out, float *tile_max, Py_ssize_t tiles, Py_ssize_t groups,
                          Py_ssize_t batch, Py_ssize_t out_stride)
{
    int32_t acc[TILE_ROWS];
    for (Py_ssize_t tile = 0; tile < tiles; tile++) {
        const int8_t *ct = codes + tile * groups * 256;
        for (Py_ssize_t i = 0; i < batch; i++) {
            const uint8_t *qi = queries + i * groups * 4;
            memset(acc, 0, sizeof(acc));
            for (Py_ssize_t g = 0; g < groups; g++) {
                const int8_t *cg = ct + g * 256;
                for (int r = 0; r < TILE_ROWS; r++)
                    for (int t = 0; t < 4; t++)
                        acc[r] += (int32_t)qi[4 * g + t] * (int32_t)cg[r * 4 + t];
            }
            float *o = out + i * out_stride + tile * TILE_ROWS;
            float best = -INFINITY;
            for (int r = 0; r < TILE_ROWS; r++) {
                int32_t v = acc[r] - 128 * csum[tile * TILE_ROWS + r];
                o[r] = ((float)v * scale[tile * TILE_ROWS + r]) * qscale[i];
                if (o[r] > best)
                    best = o[r];
            }
            tile_max[i * tiles + tile] = best;
        }
    }
}

static int cpu_has_vnni(void)
{
#if HAVE_VNNI_BUILD
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

static int use_vnni = -1;

static int check(int ok, const char *what)
{
    if (!ok)
        PyErr_Format(PyExc_ValueError, "int8 scan: %s", what);
    return ok;
}

PyDoc_STRVAR(scan_doc,
"scan(codes, csum, scale, queries, qscale, out, tile_max, tiles, groups, batch, out_stride, portable=False)\n\n"
"out[i, r] = qscale[i] * scale[r] * (sum_t queries[i, t] * codes[r, t] - 128 * csum[r]) for the\n"
"tiles * 64 rows, and tile_max[i, tile] = the largest of a tile's 64 scores (lets the caller skip\n"
"whole tiles); buffers are C-contiguous (int8, int32, float32, uint8, float32, float32, float32).\n"
"Runs without the GIL.");

static PyObject *scan(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"codes", "csum", "scale", "queries", "qscale", "out", "tile_max", "tiles", "groups",
                             "batch", "out_stride", "portable", NULL};
    Py_buffer codes, csum, scale, queries, qscale, out, tile_max;
    Py_ssize_t tiles, groups, batch, out_stride;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*y*y*y*w*w*nnnn|p", kwlist, &codes, &csum, &scale,
                                     &queries, &qscale, &out, &tile_max, &tiles, &groups, &batch, &out_stride,
                                     &portable))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t rows = tiles * TILE_ROWS;
    if (!check(tiles >= 0 && groups > 0 && batch >= 0, "tiles, groups and batch must be non-negative")
        || !check(codes.len == tiles * groups * 256, "codes must hold tiles * groups * 256 bytes")
        || !check(csum.len == rows * 4, "csum must hold tiles * 64 int32")
        || !check(scale.len == rows * 4, "scale must hold tiles * 64 float32")
        || !check(queries.len == batch * groups * 4, "queries must hold batch * groups * 4 bytes")
        || !check(qscale.len == batch * 4, "qscale must hold batch float32")
        || !check(out_stride >= rows && out.len >= (batch ? ((batch - 1) * out_stride + rows) * 4 : 0),
                  "out is too small for batch rows of out_stride float32")
        || !check(tile_max.len == batch * tiles * 4, "tile_max must hold batch * tiles float32"))
        goto done;
    if (use_vnni < 0)
        use_vnni = cpu_has_vnni();
    Py_BEGIN_ALLOW_THREADS
#if HAVE_VNNI_BUILD
    if (use_vnni && !portable)
        scan_vnni(codes.buf, csum.buf, scale.buf, queries.buf, qscale.buf, out.buf, tile_max.buf, tiles, groups, batch,
                  out_stride);
    else
#endif
        scan_portable(codes.buf, csum.buf, scale.buf, queries.buf, qscale.buf, out.buf, tile_max.buf, tiles, groups,
                      batch, out_stride);
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

static PyObject *has_vnni(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(cpu_has_vnni());
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_VARARGS | METH_KEYWORDS, scan_doc},
    {"has_vnni", has_vnni, METH_NOARGS, "Whether this CPU runs the AVX-512 VNNI kernel."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_int8_scan", "int8 x int8 scoring kernel of the front end (see int8_scan.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__int8_scan(void)
{
    return PyModule_Create(&module);
}
