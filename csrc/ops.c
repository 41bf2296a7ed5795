/*
 * Ops of the CPU engine: matmul, attention, norms, activations.
 *
 * Shapes use the letters of internal.h: N rows (tokens), K input dim,
 * M output dim, H heads, Dh head dim, Nq/Nk query/key tokens, D row width.
 *
 * Determinism: each output element is computed by exactly one thread, and
 * its reduction order is fixed by the data shape alone (8 interleaved partial
 * sums combined in a fixed tree, then a scalar tail). Threads split the
 * outermost independent loop (matmul output columns, attention head x query
 * tile) into contiguous chunks, so the thread count never changes a result.
 *
 * Kernels come as a scalar _ref and an AVX variant computing the same sums in
 * the same order, every product fused into its sum (fmaf in the _ref, FMA
 * instructions in SIMD: one rounding each, the same in both), so the two
 * agree bit for bit. Nothing else is contracted (-ffp-contract=off).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include "internal.h"
#include "quant.h"
#include "test_exports.h"   /* h3r_ops_force_ref */

/* The x86 f32 kernels need AVX and FMA (every product is fused into its sum,
 * as fmaf does in the scalar _ref); without both the scalar kernels run. */
#if defined(__AVX__) && defined(__FMA__)
#define OPS_AVX 1
#else
#define OPS_AVX 0
#endif

/* ---------------------------------------------------------------- dot product */

/* Set by tests (test_exports.c) to run the scalar _ref kernels only; the SIMD
 * kernels must give bit-identical results. Read once per op, never in a loop. */
int h3r_ops_force_ref = 0;

/* a (n,) . b (n,): lanes acc[l] = fma(a[k], b[k], acc[l]) for k = l mod 8
 * over whole 8-blocks, combined as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)),
 * then the tail fused in order. Every kernel below computes exactly this. */
static inline float dot_ref(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int l = 0; l < 8; l++) acc[l] = fmaf(a[k + l], b[k + l], acc[l]);
    float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; k < n; k++) s = fmaf(a[k], b[k], s);
    return s;
}

#if OPS_AVX
/* The fixed tree of dot_ref over the 8 lanes of acc. */
static inline float hsum_avx(__m256 acc) {
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)); /* l + l+4 */
    __m128 t = _mm_add_ps(v, _mm_movehl_ps(v, v));                                    /* (0+2),(1+3) */
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/* Same sums as dot_ref, 8 lanes in one register. */
static inline float dot_avx(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    float s = hsum_avx(acc);
    for (; k < n; k++) s = fmaf(a[k], b[k], s);
    return s;
}
#define dot dot_avx
#else
#define dot dot_ref
#endif

/* ---------------------------------------------------------------- matmul */

/* weight rows (output columns) converted and used together: the AVX-512 tile's
 * 8, else 2 triples of the AVX2 tile (measured against 3 and 12 at K 512 and
 * 2048: 6 was as fast at 512 and ~10% faster at 2048) */
#if defined(__AVX512F__) && OPS_AVX
#define MM_JB 8
#else
#define MM_JB 6
#endif
#define MM_NB 4   /* activation rows per register tile */
/* Converted weight rows are MM_PAD floats (one cache line) longer than K: at a
 * power-of-two K the rows of a block would otherwise share their L1 sets with
 * each other and with the x rows, and evict the x chunk the tile reuses. */
#define MM_PAD 16

typedef struct {
    float *y;              /* (N, M) */
    const float *x;        /* (N, K) */
    const h3r_tensor *W;   /* ne = {K, M} */
    const float *b;        /* (M,) or NULL */
    int64_t N, K, M;
    float *scratch;        /* nth x (MM_PACK + 1) x (MM_JB, K + MM_PAD) */
} mm_ctx;

/* F16 row (K,) -> f32, exact. */
static void f16_row_to_f32(const uint16_t *src, float *dst, int64_t K) {
    int64_t k = 0;
#if defined(__F16C__)
    for (; k + 8 <= K; k += 8)
        _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + k))));
#endif
    for (; k < K; k++) dst[k] = h3r_f16_to_f32(src[k]);
}

/* Weight row j as f32: for F32 a pointer into the mapping, or with copy_f32 a
 * copy in buf (K,); F16 converted into buf. */
static const float *weight_row(const h3r_tensor *W, int64_t j, int64_t K, float *buf, int copy_f32) {
    if (W->type == GGML_TYPE_F32) {
        if (!copy_f32) return (const float *)W->data + j * K;
        memcpy(buf, (const float *)W->data + j * K, (size_t)K * sizeof(float));
        return buf;
    }
    f16_row_to_f32((const uint16_t *)W->data + j * K, buf, K);  /* GGML_TYPE_F16 */
    return buf;
}

/* One output element: x row . w row (+ bias), the dot_ref order. */
static inline float mm_one(const float *xr, const float *wr, int64_t K, const float *b, int ref) {
    float s = ref ? dot_ref(xr, wr, K) : dot(xr, wr, K);
    return b ? s + *b : s;
}

#if OPS_AVX
/*
 * Register tile of raw dots: s[i][c] = x_i . w_c for 4 rows x_i (stride ldx)
 * and 2 rows w0, w1, each summed exactly as dot_ref (8 lanes, fixed tree,
 * ordered tail), so the tile is bit-identical to 8 separate dots; x and w
 * loads are shared.  x (4, K) at stride ldx, w0 w1 (K,) -> s (4, 2).
 */
static inline void dots_4x2_avx(const float *x, int64_t ldx, const float *w0, const float *w1,
                                int64_t K, float s[4][2]) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
    __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k), u;
        /* keep every loaded row in a register: folded into each FMA it would be
         * loaded 2 or 4 times, making the tile load-bound */
        __asm__("" : "+x"(v0), "+x"(v1));
        u = _mm256_loadu_ps(x0 + k);
        __asm__("" : "+x"(u));
        a00 = _mm256_fmadd_ps(u, v0, a00);
        a01 = _mm256_fmadd_ps(u, v1, a01);
        u = _mm256_loadu_ps(x1 + k);
        __asm__("" : "+x"(u));
        a10 = _mm256_fmadd_ps(u, v0, a10);
        a11 = _mm256_fmadd_ps(u, v1, a11);
        u = _mm256_loadu_ps(x2 + k);
        __asm__("" : "+x"(u));
        a20 = _mm256_fmadd_ps(u, v0, a20);
        a21 = _mm256_fmadd_ps(u, v1, a21);
        u = _mm256_loadu_ps(x3 + k);
        __asm__("" : "+x"(u));
        a30 = _mm256_fmadd_ps(u, v0, a30);
        a31 = _mm256_fmadd_ps(u, v1, a31);
    }
    s[0][0] = hsum_avx(a00); s[0][1] = hsum_avx(a01);
    s[1][0] = hsum_avx(a10); s[1][1] = hsum_avx(a11);
    s[2][0] = hsum_avx(a20); s[2][1] = hsum_avx(a21);
    s[3][0] = hsum_avx(a30); s[3][1] = hsum_avx(a31);
    const float *xs[4] = {x0, x1, x2, x3};
    for (int i = 0; i < 4; i++)
        for (int64_t t = k; t < K; t++) {
            s[i][0] = fmaf(xs[i][t], w0[t], s[i][0]);
            s[i][1] = fmaf(xs[i][t], w1[t], s[i][1]);
        }
}

/*
 * acc += the lanes of x_i . w_c over k in [k0, k1) (whole 8-blocks) for 4 rows
 * x_i (stride ldx) and 3 weight rows w_c: acc[3i + c] is the 8-lane chain of
 * dot_ref for (i, c), resumed where the previous chunk left it, so summing K in
 * chunks gives the same bits as one pass. 12 chains hide the FMA latency of two
 * ports; 3 weight and 1 x register, 7 loads per 12 FMAs.
 */
static inline void acc_4x3_avx(const float *x, int64_t ldx, const float *const *w, int64_t k0, int64_t k1,
                               __m256 acc[12]) {
    __m256 a00 = acc[0], a01 = acc[1], a02 = acc[2], a10 = acc[3], a11 = acc[4], a12 = acc[5];
    __m256 a20 = acc[6], a21 = acc[7], a22 = acc[8], a30 = acc[9], a31 = acc[10], a32 = acc[11];
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2];
    for (int64_t k = k0; k < k1; k += 8) {
        __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k), v2 = _mm256_loadu_ps(w2 + k);
        /* keep every loaded row in a register: folded into each FMA it would be
         * loaded 3 or 4 times, making the tile load-bound */
        __asm__("" : "+x"(v0), "+x"(v1), "+x"(v2));
#define ACC_ROW(xr, c0, c1, c2)                                                                  \
    do {                                                                                         \
        __m256 u = _mm256_loadu_ps((xr) + k);                                                    \
        __asm__("" : "+x"(u));                                                                   \
        c0 = _mm256_fmadd_ps(u, v0, c0); c1 = _mm256_fmadd_ps(u, v1, c1); c2 = _mm256_fmadd_ps(u, v2, c2); \
    } while (0)
        ACC_ROW(x0, a00, a01, a02);
        ACC_ROW(x1, a10, a11, a12);
        ACC_ROW(x2, a20, a21, a22);
        ACC_ROW(x3, a30, a31, a32);
#undef ACC_ROW
    }
    acc[0] = a00; acc[1] = a01; acc[2] = a02; acc[3] = a10; acc[4] = a11; acc[5] = a12;
    acc[6] = a20; acc[7] = a21; acc[8] = a22; acc[9] = a30; acc[10] = a31; acc[11] = a32;
}

/* The 12 chains of acc_4x3_avx summed: s[i][c] = hsum_avx(acc[3i + c]), then
 * the ordered tail k in [K8, K) fused in (x_i stride ldx, w_c rows). */
static inline void dots_4x3_finish(const __m256 acc[12], const float *x, int64_t ldx, const float *const *w,
                                   int64_t K8, int64_t K, float s[4][3]) {
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < 3; c++) {
            float v = hsum_avx(acc[3 * i + c]);
            for (int64_t k = K8; k < K; k++) v = fmaf(x[i * ldx + k], w[c][k], v);
            s[i][c] = v;
        }
}

#define MM_KC 256   /* K chunk: the 4 x rows' chunk (4 KiB) stays in L1 while every weight triple passes */

/*
 * y[i][r] (stride ldy) for 4 rows of x (stride K) and 3 * ntrip weight rows
 * (+ b[r]): K in chunks of MM_KC, every triple of weight rows meeting the
 * same L1-resident chunk of x (a full-K pass per triple would stream 7 rows
 * from L2, more than it delivers), then each chain's fixed tree and the
 * ordered tail: bit-identical to dot_ref per output.
 */
static void mm_tile_4x3n_avx(const float *x, int64_t K, const float *const *rows, int ntrip, const float *b,
                             float *y, int64_t ldy) {
    __m256 acc[MM_JB / 3][12];
    const int64_t K8 = K / 8 * 8;
    for (int t = 0; t < ntrip; t++)
        for (int a = 0; a < 12; a++) acc[t][a] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < K8; k0 += MM_KC) {
        int64_t k1 = k0 + MM_KC < K8 ? k0 + MM_KC : K8;
        for (int t = 0; t < ntrip; t++) acc_4x3_avx(x, K, rows + 3 * t, k0, k1, acc[t]);
    }
    for (int t = 0; t < ntrip; t++) {
        float s[4][3];
        dots_4x3_finish(acc[t], x, K, rows + 3 * t, K8, K, s);
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < 3; c++) y[i * ldy + 3 * t + c] = b ? s[i][c] + b[3 * t + c] : s[i][c];
    }
}

/* y[i][c] (stride ldy) = dots_4x2 (+ b[c]) for the matmul. */
static void mm_tile_4x2_avx(const float *x, int64_t K, const float *w0, const float *w1,
                            const float *b, float *y, int64_t ldy) {
    float s[4][2];
    dots_4x2_avx(x, K, w0, w1, K, s);
    for (int i = 0; i < 4; i++) {
        y[i * ldy] = b ? s[i][0] + b[0] : s[i][0];
        y[i * ldy + 1] = b ? s[i][1] + b[1] : s[i][1];
    }
}
#endif

#if OPS_AVX && defined(__F16C__)
#define GEMV_PF_BYTES 2048   /* software prefetch distance per weight row */
/*
 * GEMV rows of an F16 weight: s[r] = x . w_r for one x row (K,) and 4 F16
 * weight rows at stride ldw, the halves converted in registers (F16C, exact)
 * inside the dot loop: no scratch row. Each dot is summed as dot_ref (8
 * lanes, fixed tree, ordered tail), so the result is bit-identical to
 * converting the row first; the 4 rows are 4 independent add chains instead
 * of one latency-bound chain. Four interleaved streams defeat the hardware
 * prefetcher, so each row is prefetched GEMV_PF_BYTES ahead, one line per
 * 32 halves (measured: ~20 -> ~32 GB/s on one thread, a plain read's rate).
 */
static void dots_f16_1x4_avx(const float *x, const uint16_t *w, int64_t ldw, int64_t K, float s[4]) {
    const uint16_t *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
#define F16_STEP(kk)                                                                                    \
    do {                                                                                                \
        __m256 u = _mm256_loadu_ps(x + (kk));                                                           \
        a0 = _mm256_fmadd_ps(u, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w0 + (kk)))), a0); \
        a1 = _mm256_fmadd_ps(u, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w1 + (kk)))), a1); \
        a2 = _mm256_fmadd_ps(u, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w2 + (kk)))), a2); \
        a3 = _mm256_fmadd_ps(u, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w3 + (kk)))), a3); \
    } while (0)
#if defined(__AVX512F__)
    /* rows 0|1 and 2|3 side by side in 512-bit registers: the same lane
     * chains, half the instructions */
    __m512 a01 = _mm512_setzero_ps(), a23 = _mm512_setzero_ps();
    for (; k + 32 <= K; k += 32) {
        _mm_prefetch((const char *)(w0 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w1 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w2 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w3 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        for (int kk = k; kk < k + 32; kk += 8) {
            const __m512 u = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + kk));
            const __m512 v01 = _mm512_cvtph_ps(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w0 + kk))),
                _mm_loadu_si128((const __m128i *)(w1 + kk)), 1));
            const __m512 v23 = _mm512_cvtph_ps(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w2 + kk))),
                _mm_loadu_si128((const __m128i *)(w3 + kk)), 1));
            a01 = _mm512_fmadd_ps(u, v01, a01);
            a23 = _mm512_fmadd_ps(u, v23, a23);
        }
    }
    a0 = _mm512_castps512_ps256(a01);
    a1 = _mm512_extractf32x8_ps(a01, 1);
    a2 = _mm512_castps512_ps256(a23);
    a3 = _mm512_extractf32x8_ps(a23, 1);
#endif
    for (; k + 32 <= K; k += 32) {
        _mm_prefetch((const char *)(w0 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w1 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w2 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w3 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        F16_STEP(k);
        F16_STEP(k + 8);
        F16_STEP(k + 16);
        F16_STEP(k + 24);
    }
    for (; k + 8 <= K; k += 8) F16_STEP(k);
#undef F16_STEP
    s[0] = hsum_avx(a0); s[1] = hsum_avx(a1); s[2] = hsum_avx(a2); s[3] = hsum_avx(a3);
    const uint16_t *ws[4] = {w0, w1, w2, w3};
    for (int r = 0; r < 4; r++)
        for (int64_t t = k; t < K; t++) s[r] = fmaf(x[t], h3r_f16_to_f32(ws[r][t]), s[r]);
}

/* The same for 4 F32 weight rows (one 64-byte line per 16 floats): 4 chains
 * instead of one latency-bound chain per row, bit-identical to dot_ref. */
static void dots_f32_1x4_avx(const float *x, const float *w, int64_t ldw, int64_t K, float s[4]) {
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = 0;
#if defined(__AVX512F__)
    __m512 a01 = _mm512_setzero_ps(), a23 = _mm512_setzero_ps();   /* rows 0|1, 2|3 */
    for (; k + 16 <= K; k += 16) {
        _mm_prefetch((const char *)(w0 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w1 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w2 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w3 + k) + GEMV_PF_BYTES, _MM_HINT_T0);
        for (int64_t kk = k; kk < k + 16; kk += 8) {
            const __m512 u = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + kk));
            const __m512 v01 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(w0 + kk)),
                                                  _mm256_loadu_ps(w1 + kk), 1);
            const __m512 v23 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(w2 + kk)),
                                                  _mm256_loadu_ps(w3 + kk), 1);
            a01 = _mm512_fmadd_ps(u, v01, a01);
            a23 = _mm512_fmadd_ps(u, v23, a23);
        }
    }
    a0 = _mm512_castps512_ps256(a01);
    a1 = _mm512_extractf32x8_ps(a01, 1);
    a2 = _mm512_castps512_ps256(a23);
    a3 = _mm512_extractf32x8_ps(a23, 1);
#endif
    for (; k + 8 <= K; k += 8) {
        __m256 u = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w0 + k), a0);
        a1 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w1 + k), a1);
        a2 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w2 + k), a2);
        a3 = _mm256_fmadd_ps(u, _mm256_loadu_ps(w3 + k), a3);
    }
    s[0] = hsum_avx(a0); s[1] = hsum_avx(a1); s[2] = hsum_avx(a2); s[3] = hsum_avx(a3);
    const float *ws[4] = {w0, w1, w2, w3};
    for (int r = 0; r < 4; r++)
        for (int64_t t = k; t < K; t++) s[r] = fmaf(x[t], ws[r][t], s[r]);
}
#endif

#if defined(__AVX512F__) && OPS_AVX
#define MM_PACK 1   /* the AVX-512 tile below needs the paired copy of the weight rows */
/*
 * Pack 8 weight rows w_0..w_7 (K,) as 4 pairs for the 512-bit tile: pair p,
 * step s holds w_2p[8s .. 8s+8] then w_2p+1[8s .. 8s+8] (16 floats), over
 * the K8 = K - K % 8 leading elements.  -> pk (4, K8 / 8, 16)
 */
static void mm_pack8(const float *const *rows, int64_t K, float *pk) {
    const int64_t K8 = K / 8 * 8;
    for (int p = 0; p < 4; p++)
        for (int64_t k = 0; k < K8; k += 8) {
            float *dst = pk + (size_t)p * K8 * 2 + k * 2;
            memcpy(dst, rows[2 * p] + k, 8 * sizeof(float));
            memcpy(dst + 8, rows[2 * p + 1] + k, 8 * sizeof(float));
        }
}

/*
 * Register tile: y[i][c] for 4 rows of x (stride K) and the 8 packed weight
 * rows, 16 accumulators of two 8-lane chains each (low half w_2p, high half
 * w_2p+1): every output is summed exactly as dot_ref (8 lanes, fixed tree,
 * ordered tail), so bit-identical to mm_tile_4x2_avx, with twice the work
 * per instruction.
 */
static void mm_tile_4x8_512(const float *x, int64_t K, const float *pk, const float *const *rows,
                            const float *b, float *y, int64_t ldy) {
    const int64_t K8 = K / 8 * 8;
    __m512 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int p = 0; p < 4; p++) acc[i][p] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K8; k += 8) {
        __m512 w[4];
        for (int p = 0; p < 4; p++) {
            w[p] = _mm512_loadu_ps(pk + (size_t)p * K8 * 2 + k * 2);
            /* keep it in a register: folded into each FMA it would be loaded 4 times,
             * making the tile load-bound (measured ~2x slower) */
            __asm__("" : "+v"(w[p]));
        }
        for (int i = 0; i < 4; i++) {
            const __m512 u = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + i * K + k));
            for (int p = 0; p < 4; p++) acc[i][p] = _mm512_fmadd_ps(u, w[p], acc[i][p]);
        }
    }
    for (int i = 0; i < 4; i++) {
        const float *xi = x + i * K;
        for (int p = 0; p < 4; p++) {
            float s0 = hsum_avx(_mm512_castps512_ps256(acc[i][p]));
            float s1 = hsum_avx(_mm512_extractf32x8_ps(acc[i][p], 1));
            for (int64_t t = K8; t < K; t++) {
                s0 = fmaf(xi[t], rows[2 * p][t], s0);
                s1 = fmaf(xi[t], rows[2 * p + 1][t], s1);
            }
            y[i * ldy + 2 * p] = b ? s0 + b[2 * p] : s0;
            y[i * ldy + 2 * p + 1] = b ? s1 + b[2 * p + 1] : s1;
        }
    }
}
#define MM_COPY_F32 0
#else
#define MM_PACK 0
#define MM_COPY_F32 OPS_AVX   /* the AVX2 tile reads F32 rows from the padded copy */
#endif

/* Thread ith computes output columns [j0, j1), a contiguous chunk of M,
 * MM_JB weight rows at a time, sweeping all rows of x for each block. */
static void matmul_worker(void *arg, int ith, int nth) {
    mm_ctx *c = arg;
    const int ref = h3r_ops_force_ref;
    const int64_t K = c->K, M = c->M;
    int64_t chunk = (M + nth - 1) / nth;
    int64_t j0 = chunk * ith, j1 = j0 + chunk < M ? j0 + chunk : M;
    const int64_t ldb = K + MM_PAD;
    float *buf = c->scratch + (size_t)ith * (MM_PACK + 1) * MM_JB * ldb;
    const float *rows[MM_JB];
#if OPS_AVX && defined(__F16C__)
    /* Fewer rows than a register tile (the GEMV of one token): F16 and F32
     * weights stream straight from the mapping, 4 rows at a time (4 chains),
     * no scratch. */
    if (!ref && c->N < MM_NB) {
        int64_t j = j0;
        for (; j + 4 <= j1; j += 4)
            for (int64_t n = 0; n < c->N; n++) {
                float s[4];
                if (c->W->type == GGML_TYPE_F16)
                    dots_f16_1x4_avx(c->x + n * K, (const uint16_t *)c->W->data + j * K, K, K, s);
                else
                    dots_f32_1x4_avx(c->x + n * K, (const float *)c->W->data + j * K, K, K, s);
                for (int r = 0; r < 4; r++) c->y[n * M + j + r] = c->b ? s[r] + c->b[j + r] : s[r];
            }
        for (; j < j1; j++) {
            const float *wr = weight_row(c->W, j, K, buf, 0);
            for (int64_t n = 0; n < c->N; n++)
                c->y[n * M + j] = mm_one(c->x + n * K, wr, K, c->b ? c->b + j : NULL, 0);
        }
        return;
    }
#endif
    /* F32 rows too go to the padded copy for the AVX2 tile (cheap: each row then
     * meets all N rows of x) */
    const int copy_f32 = MM_COPY_F32 && !ref && c->N >= MM_NB;
    for (int64_t j = j0; j < j1; j += MM_JB) {
        int jb = j1 - j < MM_JB ? (int)(j1 - j) : MM_JB;
        for (int r = 0; r < jb; r++) rows[r] = weight_row(c->W, j + r, K, buf + (size_t)r * ldb, copy_f32);
        const float *bj = c->b ? c->b + j : NULL;
        int64_t n = 0;
#if MM_PACK
        if (!ref && jb == MM_JB && c->N >= MM_NB) {
            float *pk = buf + (size_t)MM_JB * ldb;
            mm_pack8(rows, K, pk);
            for (; n + MM_NB <= c->N; n += MM_NB)
                mm_tile_4x8_512(c->x + n * K, K, pk, rows, bj, c->y + n * M + j, M);
        }
#endif
#if OPS_AVX
        if (!ref) {
            for (; n + MM_NB <= c->N; n += MM_NB) {
                int r = 0;
                if (jb >= 3) {
                    mm_tile_4x3n_avx(c->x + n * K, K, rows, jb / 3, bj, c->y + n * M + j, M);
                    r = jb / 3 * 3;
                }
                for (; r + 2 <= jb; r += 2)
                    mm_tile_4x2_avx(c->x + n * K, K, rows[r], rows[r + 1], bj ? bj + r : NULL,
                                    c->y + n * M + j + r, M);
                for (; r < jb; r++)
                    for (int i = 0; i < MM_NB; i++)
                        c->y[(n + i) * M + j + r] = mm_one(c->x + (n + i) * K, rows[r], K, bj ? bj + r : NULL, 0);
            }
        }
#endif
        for (; n < c->N; n++) {
            const float *xr = c->x + n * K;
            float *yr = c->y + n * M + j;
            for (int r = 0; r < jb; r++) yr[r] = mm_one(xr, rows[r], K, bj ? bj + r : NULL, ref);
        }
    }
}

/* ---------------------------------------------------------------- quantized matmul
 *
 * W (M, K) in Q8_0 / Q4_0 / Q6_K blocks. Phase 1 quantizes x (N, K) once into
 * xq (N, K/32) activation blocks, rows split over threads. Phase 2 splits the
 * M output columns into one contiguous chunk per thread; within it, QMM_JB
 * weight rows (a few KiB, cache-resident) meet every activation row, four
 * activation rows per kernel call so each weight load feeds four dots (eight
 * in the AVX-512 Q8_0 GEMM, which then also sums the 8 rows' lanes at once):
 *
 *   for each block of QMM_JB weight rows in the chunk:
 *     for n in 0, 4, 8, ... N:           (then single rows for N mod 4)
 *       for each weight row j:  y[n..n+3][j] = vec_dot(w_j, xq[n..n+3]) + b[j]
 *
 * Each y element comes from one vec_dot chain whatever the tiling, so the
 * result is the same for every thread count.
 */

#define QMM_JB 16   /* weight rows per cache block */
#define QMM_L2_HALF (256 * 1024)   /* bytes of weight rows per cache block in the Q8_0 GEMM */

typedef struct {
    float *y;              /* (N, M) */
    const float *x;        /* (N, K) */
    blk_q8x *xq;           /* (N, nb) */
    const uint8_t *w;      /* M rows of row_bytes */
    size_t row_bytes;
    int type;
    const float *b;        /* (M,) or NULL */
    int64_t N, K, M, nb;
    int ref;
    uint8_t *xp;           /* (N, prep) prepared rows for the Q8_0 GEMM, or NULL */
    size_t prep;           /* bytes per prepared row */
} qmm_ctx;

/* Phase 1: rows [N*ith/nth, N*(ith+1)/nth) of x -> xq. */
static void qmm_quantize_worker(void *arg, int ith, int nth) {
    qmm_ctx *c = arg;
    int64_t r0 = c->N * ith / nth, r1 = c->N * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        quantize_row_q8x(c->x + r * c->K, c->xq + r * c->nb, c->K);
        if (c->xp) q8_gemm_prep(c->xq + r * c->nb, c->nb, c->xp + (size_t)r * c->prep);
    }
}

/* Phase 2: output columns [j0, j1) for all N rows. */
static void qmm_worker(void *arg, int ith, int nth) {
    qmm_ctx *c = arg;
    const int64_t N = c->N, M = c->M, nb = c->nb;
    int64_t chunk = (M + nth - 1) / nth;
    int64_t j0 = chunk * ith, j1 = j0 + chunk < M ? j0 + chunk : M;
    void (*dot)(int, int64_t, const void *, const blk_q8x *const *, int, float *) =
        c->ref ? vec_dot_ref : vec_dot;
    /* rows of x left over after the 4-row groups: weight rows 4 at a time;
     * the Q8_0 GEMM takes the groups 8 rows at a time (then one of 4) */
    const int64_t N4 = c->ref ? N : N / 4 * 4;
    const int G = c->xp ? 8 : 4;
    /* the Q8_0 GEMM: its prepared rows (2 bytes per weight) outweigh a weight
     * row, so the weight block is as large as half an L2 holds and each 8-row
     * group of them stays in L1 while the block streams past */
    int64_t JB = QMM_JB;
    if (c->xp && (int64_t)(QMM_L2_HALF / c->row_bytes) > JB) JB = (int64_t)(QMM_L2_HALF / c->row_bytes);
    for (int64_t jb = j0; jb < j1; jb += JB) {
        int64_t je = jb + JB < j1 ? jb + JB : j1;
        for (int64_t n = 0; n < N4; n += G) {
            int nr = N4 - n < G ? (int)(N4 - n) : G;
            const blk_q8x *xs[8];
            for (int r = 0; r < nr; r++) xs[r] = c->xq + (n + r) * nb;
            const uint8_t *xps[8];
            if (c->xp)
                for (int r = 0; r < nr; r++) xps[r] = c->xp + (size_t)(n + r) * c->prep;
            for (int64_t j = jb; j < je; j++) {
                float s[8];
                if (c->xp) q8_gemm_dot(nb, c->w + (size_t)j * c->row_bytes, xps, xs, nr, s);
                else dot(c->type, nb, c->w + (size_t)j * c->row_bytes, xs, nr, s);
                for (int r = 0; r < nr; r++) c->y[(n + r) * M + j] = c->b ? s[r] + c->b[j] : s[r];
            }
        }
    }
    /* one call per left-over row over the whole chunk: the weights stream
     * once, the activation row is laid out once */
    for (int64_t n = N4; n < N && j1 > j0; n++) {
        float *yr = c->y + n * M;
        vec_dot_rows(c->type, nb, c->w + (size_t)j0 * c->row_bytes, c->row_bytes, (int)(j1 - j0),
                     c->xq + n * nb, yr + j0);
        if (c->b)
            for (int64_t j = j0; j < j1; j++) yr[j] += c->b[j];
    }
}

/* Activations quantized to q8 blocks: (N, nb). */
static size_t qmm_xq_bytes(int64_t N, int64_t nb) { return (size_t)N * (size_t)nb * sizeof(blk_q8x); }

/* The Q8_0 GEMM's prepared activation rows, or 0 where that path is not taken. */
static size_t qmm_xp_bytes(int type, int64_t N, int64_t nb) {
    size_t prep;
    if (type != GGML_TYPE_Q8_0 || h3r_ops_force_ref || N < 4 || (prep = q8_gemm_prep_bytes(nb)) == 0 ||
        (uint64_t)N > SIZE_MAX / prep)
        return 0;
    return (size_t)N * prep;
}

/* The float path's per-thread weight-row copies (converted F16 rows, packed or
 * padded F32 rows), or 0 where the rows are read in place. */
static size_t mm_rows_bytes(int type, int64_t K, int nth) {
    if (type == GGML_TYPE_F32 && !MM_PACK && !MM_COPY_F32) return 0;
    return (size_t)nth * (MM_PACK + 1) * MM_JB * (size_t)(K + MM_PAD) * sizeof(float);
}

int64_t op_matmul_scratch_bytes(int type, int64_t K, int64_t N, int nth) {
    if (N <= 0) return 0;
    if (quant_is_matmul_type(type)) {
        int64_t nb = K / QK8X;
        return (int64_t)(qmm_xq_bytes(N, nb) + qmm_xp_bytes(type, N, nb));
    }
    return (int64_t)mm_rows_bytes(type, K, nth);
}

/* Quantized branch of op_matmul; arguments already checked. */
static int matmul_quant(h3r_pool *p, float *y, const float *x, const h3r_tensor *W, const float *b,
                        int64_t N) {
    const char *wn = W->name ? W->name : "(unnamed)";
    int64_t K = W->ne[0], M = W->ne[1];
    int bs = quant_block_elems(W->type);
    if (K % bs)
        return h3r_seterr(H3R_ERR_FORMAT, "matmul: weight '%s' is %s with %lld inputs, not a multiple "
                          "of its block size %d", wn, ggml_type_name(W->type), (long long)K, bs);
    int64_t nb = K / QK8X;
    if ((uint64_t)N > SIZE_MAX / sizeof(blk_q8x) / (uint64_t)nb)
        return h3r_seterr(H3R_ERR_NOMEM, "matmul: %lld x %lld activations overflow", (long long)N, (long long)K);
    blk_q8x *xq = malloc(qmm_xq_bytes(N, nb));
    if (!xq)
        return h3r_seterr(H3R_ERR_NOMEM, "matmul: out of memory quantizing %lld x %lld activations",
                          (long long)N, (long long)K);
    qmm_ctx c = {y, x, xq, W->data, ggml_type_nbytes(W->type, K), W->type, b, N, K, M, nb,
                 h3r_ops_force_ref, NULL, 0};
    /* Q8_0 with 4- and 8-row tiles: activation rows prepared once for the AVX-512 GEMM */
    size_t xp_bytes = qmm_xp_bytes(W->type, N, nb);
    if (xp_bytes > 0) {
        c.prep = q8_gemm_prep_bytes(nb);
        c.xp = malloc(xp_bytes);   /* NULL: fall back to vec_dot */
    }
    h3r_pool_run(p, qmm_quantize_worker, &c);
    h3r_pool_run(p, qmm_worker, &c);
    free(c.xp);
    free(xq);
    return 0;
}

/*
 * y (N, M) = x (N, K) @ W^T + b, W ne = {K, M} (F32, F16, Q8_0, Q4_0, Q6_K),
 * b (M,) F32 or NULL. Returns 0, or a negative code naming the tensor when W is not 2-D,
 * of an unsupported type, or b does not match.
 */
int op_matmul(h3r_pool *p, float *y, const float *x, const h3r_tensor *W, const h3r_tensor *b,
              int64_t N) {
    if (!W || !y || !x) return h3r_seterr(H3R_ERR_INVALID, "op_matmul: NULL argument");
    const char *wn = W->name ? W->name : "(unnamed)";
    if (W->ne[2] != 1 || W->ne[3] != 1)
        return h3r_seterr(H3R_ERR_FORMAT, "matmul: weight '%s' must be 2-D, has ne = [%lld, %lld, %lld, %lld]",
                          wn, (long long)W->ne[0], (long long)W->ne[1], (long long)W->ne[2], (long long)W->ne[3]);
    if (W->type != GGML_TYPE_F32 && W->type != GGML_TYPE_F16 && !quant_is_matmul_type(W->type))
        return h3r_seterr(H3R_ERR_UNSUPPORTED, "matmul: weight '%s' has type %s (supported: f32, f16, "
                          "q8_0, q4_0, q6_k)", wn, ggml_type_name(W->type));
    int64_t K = W->ne[0], M = W->ne[1];
    if (b) {
        const char *bn = b->name ? b->name : "(unnamed)";
        if (b->type != GGML_TYPE_F32)
            return h3r_seterr(H3R_ERR_FORMAT, "matmul: bias '%s' has type %s (must be f32)", bn,
                              ggml_type_name(b->type));
        if (b->ne[0] * b->ne[1] * b->ne[2] * b->ne[3] != M)
            return h3r_seterr(H3R_ERR_FORMAT, "matmul: bias '%s' has %lld elements, weight '%s' has %lld outputs",
                              bn, (long long)(b->ne[0] * b->ne[1] * b->ne[2] * b->ne[3]), wn, (long long)M);
    }
    if (N < 0) return h3r_seterr(H3R_ERR_INVALID, "matmul: N = %lld < 0", (long long)N);
    if (N == 0) return 0;
    if (quant_is_matmul_type(W->type)) return matmul_quant(p, y, x, W, b ? (const float *)b->data : NULL, N);
    int nth = h3r_pool_size(p);
    float *scratch = NULL;
    size_t rows_bytes = mm_rows_bytes(W->type, K, nth);
    if (rows_bytes > 0) {
        scratch = malloc(rows_bytes);
        if (!scratch) return h3r_seterr(H3R_ERR_NOMEM, "matmul: out of memory (%d x %d x %lld floats)",
                                        nth, MM_JB, (long long)K);
    }
    mm_ctx c = {y, x, W, b ? (const float *)b->data : NULL, N, K, M, scratch};
    h3r_pool_run(p, matmul_worker, &c);
    free(scratch);
    return 0;
}

/* ---------------------------------------------------------------- attention */

#define ATT_BQ 16   /* query rows per work item */
#define ATT_BK 64   /* key rows per inner tile */

typedef struct {
    float *out;
    const float *q, *k, *v, *bias;
    int64_t Nq, Nk;
    int H, Dh;
    float scale;
    int64_t n_qt;            /* query tiles per head */
    float *scratch;          /* nth x per_thread */
    size_t per_thread;       /* floats: S (BQ,BK) + O (BQ,Dh) + m, l (BQ) + qp (BQ,Dh) */
    int ref;                 /* scalar kernels only (tests) */
} att_ctx;

/*
 * Scores of one tile: S[i][j] = scale * (q_i . k_j) (+ bias[i][j]) for query
 * rows q_i (bq of them, stride ld) and key rows k_j (bk, stride ld), each dot
 * in the dot_ref order; the AVX path computes 4 x 2 blocks of them with
 * shared loads (bit-identical). brow: bias row of query 0 (stride Nk) or NULL.
 *   q (bq, Dh), k (bk, Dh) -> S (bq, ATT_BK)
 */
static void att_scores(const float *q, const float *qp, const float *k, int64_t ld, int Dh, int bq,
                       int bk, float scale, const float *brow, int64_t ldb, float *S, int ref) {
    int i = 0;
#if MM_PACK
    /* 8 query rows (4 packed pairs) x 4 keys per register tile */
    if (!ref && Dh >= 8) {
        const int64_t D8 = Dh / 8 * 8;
        for (; i + 8 <= bq; i += 8) {
            const float *pp = qp + (size_t)(i / 2) * D8 * 2;   /* pairs i/2 .. i/2+3 */
            int j = 0;
            for (; j + 4 <= bk; j += 4) {
                __m512 acc[4][4];
                for (int p = 0; p < 4; p++)
                    for (int c = 0; c < 4; c++) acc[p][c] = _mm512_setzero_ps();
                for (int64_t t = 0; t < D8; t += 8) {
                    __m512 qv[4];
                    for (int p = 0; p < 4; p++) {
                        qv[p] = _mm512_loadu_ps(pp + (size_t)p * D8 * 2 + t * 2);
                        __asm__("" : "+v"(qv[p]));   /* in a register, not re-loaded by each FMA */
                    }
                    for (int c = 0; c < 4; c++) {
                        const __m512 kv = _mm512_broadcast_f32x8(_mm256_loadu_ps(k + (j + c) * ld + t));
                        for (int p = 0; p < 4; p++) acc[p][c] = _mm512_fmadd_ps(qv[p], kv, acc[p][c]);
                    }
                }
                if (D8 == Dh) {
                    /* hsum_avx's tree for all 32 dots at once: acc[p][c] (a = 4p + c)
                     * holds rows 2p | 2p+1 in its 128-bit lanes L0 L1 | L2 L3.
                     * s1[k]: l + l+4 of acc a = 2k, 2k+1 (lane q: a = 2k + q/2, row
                     * 2p + q%2); s2[m]: (s0+s2), (s1+s3) of s1[2m], s1[2m+1]; s3[n]:
                     * t0 + t1 of s2[2n], s2[2n+1], element e of lane q from s1[4n+e] */
                    __m512 s1[8], s2[4], s3[2];
#define ATT_S1(kk, X, Y)                                                                        \
    s1[kk] = _mm512_add_ps(_mm512_shuffle_f32x4(X, Y, _MM_SHUFFLE(2, 0, 2, 0)),                \
                           _mm512_shuffle_f32x4(X, Y, _MM_SHUFFLE(3, 1, 3, 1)))
                    ATT_S1(0, acc[0][0], acc[0][1]); ATT_S1(1, acc[0][2], acc[0][3]);
                    ATT_S1(2, acc[1][0], acc[1][1]); ATT_S1(3, acc[1][2], acc[1][3]);
                    ATT_S1(4, acc[2][0], acc[2][1]); ATT_S1(5, acc[2][2], acc[2][3]);
                    ATT_S1(6, acc[3][0], acc[3][1]); ATT_S1(7, acc[3][2], acc[3][3]);
#undef ATT_S1
#pragma GCC unroll 4
                    for (int m2 = 0; m2 < 4; m2++)
                        s2[m2] = _mm512_add_ps(_mm512_shuffle_ps(s1[2 * m2], s1[2 * m2 + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                               _mm512_shuffle_ps(s1[2 * m2], s1[2 * m2 + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 2
                    for (int n2 = 0; n2 < 2; n2++)
                        s3[n2] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * n2], s2[2 * n2 + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                               _mm512_shuffle_ps(s2[2 * n2], s2[2 * n2 + 1], _MM_SHUFFLE(3, 1, 3, 1)));
                    float buf[32];
                    _mm512_storeu_ps(buf, _mm512_mul_ps(_mm512_set1_ps(scale), s3[0]));
                    _mm512_storeu_ps(buf + 16, _mm512_mul_ps(_mm512_set1_ps(scale), s3[1]));
#pragma GCC unroll 32
                    for (int idx = 0; idx < 32; idx++) {
                        const int n2 = idx >> 4, ql = (idx >> 2) & 3, e = idx & 3;
                        const int a = 2 * (4 * n2 + e) + (ql >> 1);
                        S[(i + 2 * (a >> 2) + (ql & 1)) * ATT_BK + j + (a & 3)] = buf[idx];
                    }
                    continue;
                }
                for (int p = 0; p < 4; p++)
                    for (int c = 0; c < 4; c++) {
                        const float *q0 = q + (i + 2 * p) * ld, *q1 = q0 + ld, *kc = k + (j + c) * ld;
                        float s0 = hsum_avx(_mm512_castps512_ps256(acc[p][c]));
                        float s1 = hsum_avx(_mm512_extractf32x8_ps(acc[p][c], 1));
                        for (int64_t t = D8; t < Dh; t++) {
                            s0 = fmaf(q0[t], kc[t], s0);
                            s1 = fmaf(q1[t], kc[t], s1);
                        }
                        S[(i + 2 * p) * ATT_BK + j + c] = scale * s0;
                        S[(i + 2 * p + 1) * ATT_BK + j + c] = scale * s1;
                    }
            }
            for (; j < bk; j++)
                for (int r = 0; r < 8; r++)
                    S[(i + r) * ATT_BK + j] = scale * dot(q + (i + r) * ld, k + j * ld, Dh);
        }
    }
#endif
#if OPS_AVX
    if (!ref)
        for (; i + 4 <= bq; i += 4) {
            int j = 0;
            const int64_t D8 = Dh / 8 * 8;
            for (; j + 3 <= bk; j += 3) {   /* 4 queries x 3 keys: 12 chains */
                const float *kr[3] = {k + j * ld, k + (j + 1) * ld, k + (j + 2) * ld};
                __m256 acc[12];
                for (int a = 0; a < 12; a++) acc[a] = _mm256_setzero_ps();
                acc_4x3_avx(q + i * ld, ld, kr, 0, D8, acc);
                float s[4][3];
                dots_4x3_finish(acc, q + i * ld, ld, kr, D8, Dh, s);
                for (int r = 0; r < 4; r++)
                    for (int c = 0; c < 3; c++) S[(i + r) * ATT_BK + j + c] = scale * s[r][c];
            }
            for (; j + 2 <= bk; j += 2) {
                float s[4][2];
                dots_4x2_avx(q + i * ld, ld, k + j * ld, k + (j + 1) * ld, Dh, s);
                for (int r = 0; r < 4; r++) {
                    S[(i + r) * ATT_BK + j] = scale * s[r][0];
                    S[(i + r) * ATT_BK + j + 1] = scale * s[r][1];
                }
            }
            for (; j < bk; j++)
                for (int r = 0; r < 4; r++)
                    S[(i + r) * ATT_BK + j] = scale * dot(q + (i + r) * ld, k + j * ld, Dh);
        }
#endif
    for (; i < bq; i++)
        for (int j = 0; j < bk; j++)
            S[i * ATT_BK + j] = scale * (ref ? dot_ref(q + i * ld, k + j * ld, Dh)
                                             : dot(q + i * ld, k + j * ld, Dh));
    if (brow)
        for (i = 0; i < bq; i++)
            for (int j = 0; j < bk; j++) S[i * ATT_BK + j] += brow[i * ldb + j];
}

/*
 * O (bq, Dh) += P (bq, bk) @ V (bk, Dh), P = the tile's probabilities in S
 * (stride ATT_BK), V rows at stride ld. Each O element gets its bk terms in
 * key order, product then add, so the AVX path (4 rows x 64 / 32 / 16 columns kept in
 * registers across the keys) is bit-identical to the scalar loop.
 */
static void att_pv(float *O, int Dh, const float *S, int bq, int bk, const float *v, int64_t ld,
                   int ref) {
    int i = 0;
#if OPS_AVX
    if (!ref)
        for (; i + 4 <= bq; i += 4) {
            float *o0 = O + (size_t)i * Dh, *o1 = o0 + Dh, *o2 = o1 + Dh, *o3 = o2 + Dh;
            const float *p0 = S + (size_t)i * ATT_BK, *p1 = p0 + ATT_BK, *p2 = p1 + ATT_BK,
                        *p3 = p2 + ATT_BK;
            int d = 0;
#if defined(__AVX512F__)
            for (; d + 64 <= Dh; d += 64) {   /* 4 rows x 64 columns: each v load serves 4 FMAs */
                float *o[4] = {o0, o1, o2, o3};
                const float *pr[4] = {p0, p1, p2, p3};
                __m512 c[4][4];
                for (int r = 0; r < 4; r++)
                    for (int u = 0; u < 4; u++) c[r][u] = _mm512_loadu_ps(o[r] + d + 16 * u);
                for (int j = 0; j < bk; j++) {
                    const float *vj = v + j * ld + d;
                    __m512 vv[4];
                    for (int u = 0; u < 4; u++) {
                        vv[u] = _mm512_loadu_ps(vj + 16 * u);
                        __asm__("" : "+v"(vv[u]));   /* loaded once for the 4 rows */
                    }
                    for (int r = 0; r < 4; r++) {
                        const __m512 p = _mm512_set1_ps(pr[r][j]);
                        for (int u = 0; u < 4; u++) c[r][u] = _mm512_fmadd_ps(p, vv[u], c[r][u]);
                    }
                }
                for (int r = 0; r < 4; r++)
                    for (int u = 0; u < 4; u++) _mm512_storeu_ps(o[r] + d + 16 * u, c[r][u]);
            }
            for (; d + 32 <= Dh; d += 32) {   /* the same chains, 16 columns per register */
                __m512 c00 = _mm512_loadu_ps(o0 + d), c01 = _mm512_loadu_ps(o0 + d + 16);
                __m512 c10 = _mm512_loadu_ps(o1 + d), c11 = _mm512_loadu_ps(o1 + d + 16);
                __m512 c20 = _mm512_loadu_ps(o2 + d), c21 = _mm512_loadu_ps(o2 + d + 16);
                __m512 c30 = _mm512_loadu_ps(o3 + d), c31 = _mm512_loadu_ps(o3 + d + 16);
                for (int j = 0; j < bk; j++) {
                    const float *vj = v + j * ld + d;
                    __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16), p;
                    __asm__("" : "+v"(v0), "+v"(v1));   /* loaded once for the 4 rows */
                    p = _mm512_set1_ps(p0[j]);
                    c00 = _mm512_fmadd_ps(p, v0, c00);
                    c01 = _mm512_fmadd_ps(p, v1, c01);
                    p = _mm512_set1_ps(p1[j]);
                    c10 = _mm512_fmadd_ps(p, v0, c10);
                    c11 = _mm512_fmadd_ps(p, v1, c11);
                    p = _mm512_set1_ps(p2[j]);
                    c20 = _mm512_fmadd_ps(p, v0, c20);
                    c21 = _mm512_fmadd_ps(p, v1, c21);
                    p = _mm512_set1_ps(p3[j]);
                    c30 = _mm512_fmadd_ps(p, v0, c30);
                    c31 = _mm512_fmadd_ps(p, v1, c31);
                }
                _mm512_storeu_ps(o0 + d, c00); _mm512_storeu_ps(o0 + d + 16, c01);
                _mm512_storeu_ps(o1 + d, c10); _mm512_storeu_ps(o1 + d + 16, c11);
                _mm512_storeu_ps(o2 + d, c20); _mm512_storeu_ps(o2 + d + 16, c21);
                _mm512_storeu_ps(o3 + d, c30); _mm512_storeu_ps(o3 + d + 16, c31);
            }
#endif
            for (; d + 24 <= Dh; d += 24) {   /* 4 rows x 24 columns: 12 chains, each v load serves 4 FMAs */
                float *o[4] = {o0, o1, o2, o3};
                const float *pr[4] = {p0, p1, p2, p3};
                __m256 c[4][3];
                for (int r = 0; r < 4; r++)
                    for (int u = 0; u < 3; u++) c[r][u] = _mm256_loadu_ps(o[r] + d + 8 * u);
                for (int j = 0; j < bk; j++) {
                    const float *vj = v + j * ld + d;
                    __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8), v2 = _mm256_loadu_ps(vj + 16);
                    __asm__("" : "+x"(v0), "+x"(v1), "+x"(v2));
                    for (int r = 0; r < 4; r++) {
                        const __m256 p = _mm256_broadcast_ss(pr[r] + j);
                        c[r][0] = _mm256_fmadd_ps(p, v0, c[r][0]);
                        c[r][1] = _mm256_fmadd_ps(p, v1, c[r][1]);
                        c[r][2] = _mm256_fmadd_ps(p, v2, c[r][2]);
                    }
                }
                for (int r = 0; r < 4; r++)
                    for (int u = 0; u < 3; u++) _mm256_storeu_ps(o[r] + d + 8 * u, c[r][u]);
            }
            for (; d + 16 <= Dh; d += 16) {
                __m256 c00 = _mm256_loadu_ps(o0 + d), c01 = _mm256_loadu_ps(o0 + d + 8);
                __m256 c10 = _mm256_loadu_ps(o1 + d), c11 = _mm256_loadu_ps(o1 + d + 8);
                __m256 c20 = _mm256_loadu_ps(o2 + d), c21 = _mm256_loadu_ps(o2 + d + 8);
                __m256 c30 = _mm256_loadu_ps(o3 + d), c31 = _mm256_loadu_ps(o3 + d + 8);
                for (int j = 0; j < bk; j++) {
                    const float *vj = v + j * ld + d;
                    __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8), p;
                    __asm__("" : "+x"(v0), "+x"(v1));   /* loaded once for the 4 rows */
                    p = _mm256_broadcast_ss(p0 + j);
                    c00 = _mm256_fmadd_ps(p, v0, c00);
                    c01 = _mm256_fmadd_ps(p, v1, c01);
                    p = _mm256_broadcast_ss(p1 + j);
                    c10 = _mm256_fmadd_ps(p, v0, c10);
                    c11 = _mm256_fmadd_ps(p, v1, c11);
                    p = _mm256_broadcast_ss(p2 + j);
                    c20 = _mm256_fmadd_ps(p, v0, c20);
                    c21 = _mm256_fmadd_ps(p, v1, c21);
                    p = _mm256_broadcast_ss(p3 + j);
                    c30 = _mm256_fmadd_ps(p, v0, c30);
                    c31 = _mm256_fmadd_ps(p, v1, c31);
                }
                _mm256_storeu_ps(o0 + d, c00); _mm256_storeu_ps(o0 + d + 8, c01);
                _mm256_storeu_ps(o1 + d, c10); _mm256_storeu_ps(o1 + d + 8, c11);
                _mm256_storeu_ps(o2 + d, c20); _mm256_storeu_ps(o2 + d + 8, c21);
                _mm256_storeu_ps(o3 + d, c30); _mm256_storeu_ps(o3 + d + 8, c31);
            }
            for (; d + 8 <= Dh; d += 8) {
                __m256 c0 = _mm256_loadu_ps(o0 + d), c1 = _mm256_loadu_ps(o1 + d);
                __m256 c2 = _mm256_loadu_ps(o2 + d), c3 = _mm256_loadu_ps(o3 + d);
                for (int j = 0; j < bk; j++) {
                    __m256 vj = _mm256_loadu_ps(v + j * ld + d);
                    __asm__("" : "+x"(vj));
                    c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), vj, c0);
                    c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), vj, c1);
                    c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p2 + j), vj, c2);
                    c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p3 + j), vj, c3);
                }
                _mm256_storeu_ps(o0 + d, c0); _mm256_storeu_ps(o1 + d, c1);
                _mm256_storeu_ps(o2 + d, c2); _mm256_storeu_ps(o3 + d, c3);
            }
            for (; d < Dh; d++)
                for (int j = 0; j < bk; j++) {
                    const float vj = v[j * ld + d];
                    o0[d] = fmaf(p0[j], vj, o0[d]);
                    o1[d] = fmaf(p1[j], vj, o1[d]);
                    o2[d] = fmaf(p2[j], vj, o2[d]);
                    o3[d] = fmaf(p3[j], vj, o3[d]);
                }
        }
#endif
    for (; i < bq; i++) {
        float *Oi = O + (size_t)i * Dh;
        const float *Pi = S + (size_t)i * ATT_BK;
        for (int j = 0; j < bk; j++) {
            const float *vj = v + j * ld;
            const float pj = Pi[j];
            for (int d = 0; d < Dh; d++) Oi[d] = fmaf(pj, vj[d], Oi[d]);
        }
    }
}

/*
 * exp for the softmax, x <= 0 in use: Cephes' expf (Cody-Waite reduction
 * x = n ln2 + r, |r| <= ln2/2, degree-7 polynomial, within 2 ulp of expf),
 * with x clamped to [-88, 88] and 2^n built in the exponent bits, so
 * x <= -88 (and -inf, a masked score) gives exactly 0 (no denormals).
 * Every step is one rounding (fmaf, or a lone * / +), so the SIMD kernel
 * below, doing the same steps lane by lane, is bit-identical.
 */
static inline float exp_ref(float x) {
    x = -88.0f > x ? -88.0f : x;   /* as max_ps(-88, x): NaN passes */
    x = 88.0f < x ? 88.0f : x;     /* as min_ps(88, x) */
    const float n = rintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    const float z = r * r;
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    const float y = fmaf(p, z, r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    return y * s;
}

#if OPS_AVX && defined(__AVX2__)
/* exp_ref on 8 lanes, step for step. */
static inline __m256 exp_avx(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-88.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#define OPS_EXP_AVX 1
#else
#define OPS_EXP_AVX 0
#endif

/*
 * One row of a score tile: S[j] = exp_ref(S[j] - mx) for j < bk, returns
 * their sum in lanes acc[l] += S[j] for l = j mod 8 (in j order), combined
 * as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). The AVX path computes exactly
 * this (ref: scalar only).
 */
static float softmax_exp_row(float *S, int bk, float mx, int ref) {
    float acc[8] = {0};
    int j = 0;
#if OPS_EXP_AVX
    if (!ref) {
        const __m256 m = _mm256_set1_ps(mx);
        __m256 a = _mm256_setzero_ps();
        for (; j + 8 <= bk; j += 8) {
            const __m256 e = exp_avx(_mm256_sub_ps(_mm256_loadu_ps(S + j), m));
            _mm256_storeu_ps(S + j, e);
            a = _mm256_add_ps(a, e);
        }
        _mm256_storeu_ps(acc, a);
    }
#endif
    for (; j < bk; j++) {
        S[j] = exp_ref(S[j] - mx);
        acc[j % 8] += S[j];
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/*
 * One work item: head h, query rows [i0, i0+bq). Online softmax over key
 * tiles: running max m, running sum l and unnormalised output O per row,
 * rescaled by exp(m_old - m_new) when the max grows. Per tile: scores S
 * (att_scores), then per row the new max, the rescale of O and
 * p = exp(S - max) in key order, then O += P V (att_pv). Rows whose scores
 * are all -inf so far (fully masked) get p = 0 and produce zeros.
 */
static void attention_tile(const att_ctx *c, float *ws, int h, int64_t i0, int bq) {
    const int64_t ld = (int64_t)c->H * c->Dh;   /* row stride of q, k, v, out */
    const int Dh = c->Dh;
    float *S = ws;                               /* (bq, BK) */
    float *O = S + ATT_BQ * ATT_BK;              /* (bq, Dh) */
    float *m = O + (size_t)ATT_BQ * Dh;          /* (bq,) */
    float *l = m + ATT_BQ;                       /* (bq,) */
    float *qp = l + ATT_BQ;                      /* (bq/2, Dh/8, 16) query pairs, MM_PACK only */
    const float *qh = c->q + i0 * ld + (int64_t)h * Dh;
#if MM_PACK
    if (!c->ref && Dh >= 8) {
        const int64_t D8 = Dh / 8 * 8;
        for (int p = 0; p + 1 < bq; p += 2)
            for (int64_t t = 0; t < D8; t += 8) {
                float *dst = qp + (size_t)(p / 2) * D8 * 2 + t * 2;
                memcpy(dst, qh + p * ld + t, 8 * sizeof(float));
                memcpy(dst + 8, qh + (p + 1) * ld + t, 8 * sizeof(float));
            }
    }
#endif
    for (int i = 0; i < bq; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
    memset(O, 0, sizeof(float) * (size_t)bq * Dh);
    for (int64_t j0 = 0; j0 < c->Nk; j0 += ATT_BK) {
        int bk = c->Nk - j0 < ATT_BK ? (int)(c->Nk - j0) : ATT_BK;
        const float *kh = c->k + j0 * ld + (int64_t)h * Dh;
        const float *vh = c->v + j0 * ld + (int64_t)h * Dh;
        const float *brow = c->bias ? c->bias + ((int64_t)h * c->Nq + i0) * c->Nk + j0 : NULL;
        att_scores(qh, qp, kh, ld, Dh, bq, bk, c->scale, brow, c->Nk, S, c->ref);
        for (int i = 0; i < bq; i++) {
            float *Si = S + (size_t)i * ATT_BK;
            float mt = -INFINITY;
            int j = 0;
#if OPS_EXP_AVX
            if (!c->ref && bk >= 8) {   /* max is exact: the lane order only moves a +-0 tie */
                __m256 mv = _mm256_set1_ps(-INFINITY);
                for (; j + 8 <= bk; j += 8) mv = _mm256_max_ps(_mm256_loadu_ps(Si + j), mv);
                float ml[8];
                _mm256_storeu_ps(ml, mv);
                for (int u = 0; u < 8; u++)
                    if (ml[u] > mt) mt = ml[u];
            }
#endif
            for (; j < bk; j++)
                if (Si[j] > mt) mt = Si[j];
            float mn = m[i] > mt ? m[i] : mt;
            if (mn == -INFINITY) {               /* everything so far masked */
                for (int j = 0; j < bk; j++) Si[j] = 0.0f;
                continue;
            }
            float corr = m[i] == -INFINITY ? 0.0f : expf(m[i] - mn);
            float *Oi = O + (size_t)i * Dh;
            if (corr != 1.0f)
                for (int d = 0; d < Dh; d++) Oi[d] *= corr;
            float sum = softmax_exp_row(Si, bk, mn, c->ref);
            l[i] = l[i] * corr + sum;
            m[i] = mn;
        }
        att_pv(O, Dh, S, bq, bk, vh, ld, c->ref);
    }
    for (int i = 0; i < bq; i++) {
        float *dst = c->out + (i0 + i) * ld + (int64_t)h * Dh;
        const float *Oi = O + (size_t)i * Dh;
        float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        for (int d = 0; d < Dh; d++) dst[d] = Oi[d] * inv;
    }
}

/* One thread's tiles: S (BQ, BK), O and qp (BQ, Dh), m and l (BQ). */
static size_t att_per_thread_floats(int Dh) {
    return (size_t)ATT_BQ * ATT_BK + 2 * (size_t)ATT_BQ * Dh + 2 * ATT_BQ;
}

int64_t op_attention_scratch_bytes(int Dh, int nth) {
    return (int64_t)((size_t)nth * att_per_thread_floats(Dh) * sizeof(float));
}

/* Work items (head, query tile) numbered h * n_qt + t, split contiguously. */
static void attention_worker(void *arg, int ith, int nth) {
    att_ctx *c = arg;
    int64_t total = (int64_t)c->H * c->n_qt;
    int64_t a = total * ith / nth, b = total * (ith + 1) / nth;
    float *ws = c->scratch + (size_t)ith * c->per_thread;
    for (int64_t it = a; it < b; it++) {
        int h = (int)(it / c->n_qt);
        int64_t i0 = (it % c->n_qt) * ATT_BQ;
        int bq = c->Nq - i0 < ATT_BQ ? (int)(c->Nq - i0) : ATT_BQ;
        attention_tile(c, ws, h, i0, bq);
    }
}

/*
 * out (Nq, H*Dh) = softmax(scale * q k^T + bias) v per head, q (Nq, H*Dh),
 * k, v (Nk, H*Dh), bias NULL or (H, Nq, Nk). Scratch is O(threads x tile).
 * Returns 0, or H3R_ERR_INVALID / H3R_ERR_NOMEM with a message.
 */
int op_attention(h3r_pool *p, float *out, const float *q, const float *k, const float *v,
                 int64_t Nq, int64_t Nk, int H, int Dh, float scale, const float *bias) {
    if (!out || !q || !k || !v) return h3r_seterr(H3R_ERR_INVALID, "attention: NULL argument");
    if (Nq < 0 || Nk < 1 || H < 1 || Dh < 1)
        return h3r_seterr(H3R_ERR_INVALID, "attention: bad shape Nq=%lld Nk=%lld H=%d Dh=%d "
                          "(need Nq >= 0, Nk, H, Dh >= 1)", (long long)Nq, (long long)Nk, H, Dh);
    if (Nq == 0) return 0;
    int nth = h3r_pool_size(p);
    size_t per = att_per_thread_floats(Dh);
    float *scratch = malloc((size_t)op_attention_scratch_bytes(Dh, nth));
    if (!scratch) return h3r_seterr(H3R_ERR_NOMEM, "attention: out of memory (Dh=%d, %d threads)", Dh, nth);
    att_ctx c = {out, q, k, v, bias, Nq, Nk, H, Dh, scale, (Nq + ATT_BQ - 1) / ATT_BQ, scratch, per,
                 h3r_ops_force_ref};
    h3r_pool_run(p, attention_worker, &c);
    free(scratch);
    return 0;
}

/* ---------------------------------------------------------------- norms */

/* Each row of x (N, D): (x - mean) / sqrt(var + eps) * w + b, statistics in
 * double (biased variance, as torch's layer_norm). */
void op_layernorm(float *x, int64_t N, int64_t D, const float *w, const float *b, float eps) {
    for (int64_t n = 0; n < N; n++) {
        float *r = x + n * D;
        /* sums in 8 double lanes (l = d mod 8, d in order; the compiler
         * vectorizes the lanes) combined by a fixed tree, then the tail in
         * order: one order whatever the build, and no serial add chain */
        double am[8] = {0}, av[8] = {0};
        int64_t d = 0;
        for (; d + 8 <= D; d += 8)
            for (int l = 0; l < 8; l++) am[l] += r[d + l];
        double mean = ((am[0] + am[4]) + (am[2] + am[6])) + ((am[1] + am[5]) + (am[3] + am[7]));
        for (; d < D; d++) mean += r[d];
        mean /= (double)D;
        for (d = 0; d + 8 <= D; d += 8)
            for (int l = 0; l < 8; l++) { double t = r[d + l] - mean; av[l] += t * t; }
        double var = ((av[0] + av[4]) + (av[2] + av[6])) + ((av[1] + av[5]) + (av[3] + av[7]));
        for (; d < D; d++) { double t = r[d] - mean; var += t * t; }
        var /= (double)D;
        double rstd = 1.0 / sqrt(var + (double)eps);
        for (int64_t d = 0; d < D; d++) {
            float y = (float)((r[d] - mean) * rstd);
            if (w) y *= w[d];
            if (b) y += b[d];
            r[d] = y;
        }
    }
}

/* Each row of x (N, D): x / sqrt(mean(x^2) + eps) * w, mean in double. */
void op_rmsnorm(float *x, int64_t N, int64_t D, const float *w, float eps) {
    for (int64_t n = 0; n < N; n++) {
        float *r = x + n * D;
        double as[8] = {0};   /* 8 lanes and a fixed tree, as in op_layernorm */
        int64_t d = 0;
        for (; d + 8 <= D; d += 8)
            for (int l = 0; l < 8; l++) as[l] += (double)r[d + l] * r[d + l];
        double ss = ((as[0] + as[4]) + (as[2] + as[6])) + ((as[1] + as[5]) + (as[3] + as[7]));
        for (; d < D; d++) ss += (double)r[d] * r[d];
        double rstd = 1.0 / sqrt(ss / (double)D + (double)eps);
        for (int64_t d = 0; d < D; d++) {
            float y = (float)(r[d] * rstd);
            r[d] = w ? y * w[d] : y;
        }
    }
}

/* ---------------------------------------------------------------- elementwise */

void op_silu(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

/*
 * gelu(approximate="tanh") = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 * Computed as the identical x / (1 + exp(-2u)): for negative x, 1 + tanh(u)
 * cancels and loses up to ~5e-5 relative in float; the sigmoid form does not.
 */
void op_gelu_tanh(float *x, int64_t n) {
    const float c2 = 1.5957691216057308f; /* 2 sqrt(2/pi) */
    int64_t i = 0;
#if OPS_EXP_AVX
    if (!h3r_ops_force_ref) {   /* the loop below, 8 lanes at a time (bit-identical) */
        const __m256 k3 = _mm256_set1_ps(0.044715f), nc2 = _mm256_set1_ps(-c2), one = _mm256_set1_ps(1.0f);
        for (; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            const __m256 c = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(k3, v), v), v);
            const __m256 e = exp_avx(_mm256_mul_ps(nc2, _mm256_add_ps(v, c)));
            _mm256_storeu_ps(x + i, _mm256_div_ps(v, _mm256_add_ps(one, e)));
        }
    }
#endif
    for (; i < n; i++) {
        float v = x[i];
        x[i] = v / (1.0f + exp_ref(-c2 * (v + 0.044715f * v * v * v)));
    }
}

/* Exact gelu 0.5 x (1 + erf(x / sqrt(2))), computed as the identical
 * 0.5 x erfc(-x / sqrt(2)), which does not cancel for negative x. */
void op_gelu_erf(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * erfcf(-x[i] * 0.7071067811865476f);
}

void op_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void op_mul(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= x[i];
}

/* Data of an F32 tensor, or H3R_ERR_FORMAT naming the tensor and its type. */
int tensor_f32(const h3r_tensor *t, const float **out) {
    *out = NULL;
    if (t->type != GGML_TYPE_F32)
        return h3r_seterr(H3R_ERR_FORMAT, "tensor '%s' has type %s, expected f32",
                          t->name ? t->name : "(unnamed)", ggml_type_name(t->type));
    *out = (const float *)t->data;
    return 0;
}
