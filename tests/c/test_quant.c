/*
 * C unit tests of the quant blocks, dot kernels and quantized matmul
 * (csrc/quant.c, csrc/ops.c), built outside the shared library so they run
 *   - under AddressSanitizer + UndefinedBehaviorSanitizer on the host, and
 *   - cross-compiled for aarch64 (NEON, with and without dotprod) under qemu.
 * tests/test_quant_c.py builds and runs them; the build line is in
 * tests/c/README.md. Exit status 0 when every check passes; the last line is
 * "N passed, M failed".
 *
 * Checks:
 *   layout   Q4_0 nibble order and Q6_K bit packing against hand-packed blocks
 *   quant    Q8_0 round trip within half a step, Q4_0 within one
 *   dot      SIMD vec_dot vs scalar vec_dot_ref, per type and K (TOL_DOT)
 *   tiling   a row's dot is bit-identical whether it shares a call with 0-3 rows
 *   gemv     vec_dot_rows (one activation row, many weight rows) is
 *            bit-identical to vec_dot
 *   matmul   op_matmul vs a double reference on the dequantized operands
 *            (TOL_MM), byte-identical for 1, 2 and 3 threads
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "quant.h"

/* SIMD vs scalar dot: identical integer block sums, f32 block terms added in
 * another order: a few ulps of the sum of |terms| (measured < 3e-7). */
#define TOL_DOT 1e-5
/* op_matmul vs double on the same dequantized weights and activation blocks:
 * f32 rounding of K/32 block terms; relative to max |ref| (measured < 3e-7). */
#define TOL_MM 1e-5

static int n_pass, n_fail;

static void check(int ok, const char *what) {
    if (ok) n_pass++;
    else { n_fail++; printf("FAIL %s\n", what); }
}

/* xorshift64*: the same numbers on every platform */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd_u32(void) {
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float rnd_normal(void) {  /* Box-Muller */
    double u1 = (rnd_u32() + 1.0) / 4294967297.0, u2 = rnd_u32() / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static const int TYPES[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q6_K};

/* Random weight row of K elements of `type`: quantized normals for Q8_0/Q4_0,
 * random bytes with a finite f16 scale for Q6_K. Caller frees. */
static void *random_row(int type, int64_t K, float *tmp) {
    size_t bytes = ggml_type_nbytes(type, K);
    uint8_t *w = malloc(bytes);
    if (type == GGML_TYPE_Q6_K) {
        for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd_u32();
        for (int64_t b = 0; b < K / QK_K; b++)
            ((blk_q6_k *)w)[b].d = h3r_f32_to_f16(rnd_normal() * 0.01f);
        return w;
    }
    for (int64_t i = 0; i < K; i++) tmp[i] = rnd_normal();
    if (type == GGML_TYPE_Q8_0) quantize_row_q8_0(tmp, (blk_q8_0 *)w, K);
    else quantize_row_q4_0(tmp, (blk_q4_0 *)w, K);
    return w;
}

static void test_layout(void) {
    /* Q4_0: byte j holds element j (low nibble) and j + 16 (high nibble). */
    blk_q4_0 b4;
    b4.d = h3r_f32_to_f16(0.5f);
    for (int j = 0; j < 16; j++) b4.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    float y[QK_K];
    check(dequantize_row(GGML_TYPE_Q4_0, &b4, y, 32) == 0, "layout: q4_0 dequantize rc");
    int ok = 1;
    for (int j = 0; j < 16; j++) ok &= y[j] == 0.5f * (j - 8) && y[j + 16] == 0.5f * (7 - j);
    check(ok, "layout: q4_0 low nibbles are elements 0-15");

    /* Q6_K: element i = 128h + 32s + l gets q = (i * 7) % 64, packed by hand. */
    blk_q6_k b6;
    memset(&b6, 0, sizeof(b6));
    for (int i = 0; i < QK_K; i++) {
        int q = (i * 7) % 64, h = i / 128, s = (i % 128) / 32, l = i % 32;
        b6.ql[64 * h + 32 * (s & 1) + l] |= (uint8_t)((q & 0xF) << (4 * (s >> 1)));
        b6.qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * s));
    }
    for (int j = 0; j < 16; j++) b6.scales[j] = (int8_t)(j - 8);
    b6.d = h3r_f32_to_f16(0.25f);
    check(dequantize_row(GGML_TYPE_Q6_K, &b6, y, QK_K) == 0, "layout: q6_k dequantize rc");
    ok = 1;
    for (int i = 0; i < QK_K; i++) ok &= y[i] == (0.25f * (float)(i / 16 - 8)) * (float)((i * 7) % 64 - 32);
    check(ok, "layout: q6_k ql/qh/scales packing");
}

static void test_quant_round_trip(void) {
    enum { K = 1024 };
    float x[K], y[K];
    for (int i = 0; i < K; i++) x[i] = rnd_normal() * (i < 512 ? 1.0f : 1e-3f);
    blk_q8_0 q8[K / 32];
    blk_q4_0 q4[K / 32];
    quantize_row_q8_0(x, q8, K);
    quantize_row_q4_0(x, q4, K);
    /* Half a step, plus the f16 rounding of d seen through |q| <= 127 (q8_0) or
     * 8 (q4_0): 2^-11 relative for a normal d, 2^-25 absolute for a subnormal one. */
    int ok8 = dequantize_row(GGML_TYPE_Q8_0, q8, y, K) == 0;
    for (int i = 0; i < K; i++) {
        float d = h3r_f16_to_f32(q8[i / 32].d);
        ok8 &= fabsf(y[i] - x[i]) <= 0.5f * d + 127.0f * (d * 0x1p-11f + 0x1p-25f);
    }
    check(ok8, "quant: q8_0 round trip within half a step");
    int ok4 = dequantize_row(GGML_TYPE_Q4_0, q4, y, K) == 0;
    for (int i = 0; i < K; i++) {
        float d = fabsf(h3r_f16_to_f32(q4[i / 32].d));
        /* one whole step: an element of the sign opposite to the block's max
         * maps up to +8, which Q4_0 clips to +7 */
        ok4 &= fabsf(y[i] - x[i]) <= 1.0f * d + 8.0f * (d * 0x1p-11f + 0x1p-25f);
    }
    check(ok4, "quant: q4_0 round trip within one step");
}

static void test_dot(void) {
    static const int64_t KS[] = {256, 512, 4096};
    char what[128];
    for (size_t t = 0; t < sizeof(TYPES) / sizeof(TYPES[0]); t++)
        for (size_t kk = 0; kk < sizeof(KS) / sizeof(KS[0]); kk++) {
            int type = TYPES[t];
            int64_t K = KS[kk], nb = K / QK8X;
            float *tmp = malloc(sizeof(float) * (size_t)K), *wf = malloc(sizeof(float) * (size_t)K);
            float *xf = malloc(sizeof(float) * (size_t)K * 4);
            void *w = random_row(type, K, tmp);
            dequantize_row(type, w, wf, K);
            blk_q8x *xq = malloc(sizeof(blk_q8x) * (size_t)nb * 4);
            const blk_q8x *xs[4];
            for (int r = 0; r < 4; r++) {
                float scale = r == 3 ? 100.0f : r == 2 ? 1e-3f : 1.0f;
                for (int64_t i = 0; i < K; i++) xf[r * K + i] = rnd_normal() * scale;
                quantize_row_q8x(xf + r * K, xq + r * nb, K);
                xs[r] = xq + r * nb;
            }
            float simd[4], ref[4];
            vec_dot(type, nb, w, xs, 4, simd);
            vec_dot_ref(type, nb, w, xs, 4, ref);
            double worst = 0.0;
            int same = 1;
            for (int r = 0; r < 4; r++) {
                double mag = 0.0;
                for (int64_t i = 0; i < K; i++)
                    mag += fabs((double)wf[i] * xs[r][i / 32].d * xs[r][i / 32].qs[i % 32]);
                double e = fabs((double)simd[r] - ref[r]) / (mag > 0 ? mag : 1.0);
                if (e > worst) worst = e;
                for (int nr = 1; nr <= 4 - r; nr++) {
                    float one[4];
                    vec_dot(type, nb, w, xs + r, nr, one);
                    same &= memcmp(&one[0], &simd[r], sizeof(float)) == 0;
                }
            }
            snprintf(what, sizeof(what), "dot: %s K=%lld %s vs ref rel %.2e < %.0e", ggml_type_name(type),
                     (long long)K, quant_simd_name(), worst, TOL_DOT);
            check(worst < TOL_DOT, what);
            printf("  %s\n", what);
            snprintf(what, sizeof(what), "tiling: %s K=%lld result independent of rows per call",
                     ggml_type_name(type), (long long)K);
            check(same, what);
            free(w); free(tmp); free(wf); free(xf); free(xq);
        }
}

/* GEMV kernel: vec_dot_rows over 5 contiguous weight rows (pairs and a
 * single) equals vec_dot with one activation row, bit for bit, for block
 * counts that are odd, a multiple of 8, and past the AVX-512 path's limit. */
static void test_gemv_rows(void) {
    static const int64_t KS[] = {32, 96, 544, 4096, 16416, 256, 768, 16640};
    char what[160];
    for (size_t t = 0; t < sizeof(TYPES) / sizeof(TYPES[0]); t++)
        for (size_t kk = 0; kk < sizeof(KS) / sizeof(KS[0]); kk++) {
            int type = TYPES[t];
            int64_t K = KS[kk], nb = K / QK8X;
            if (K % quant_block_elems(type)) continue;
            size_t rb = ggml_type_nbytes(type, K);
            float *tmp = malloc(sizeof(float) * (size_t)K), *xf = malloc(sizeof(float) * (size_t)K);
            uint8_t *w = malloc(rb * 5);
            for (int r = 0; r < 5; r++) {
                void *row = random_row(type, K, tmp);
                memcpy(w + r * rb, row, rb);
                free(row);
            }
            blk_q8x *xq = malloc(sizeof(blk_q8x) * (size_t)nb);
            for (int64_t i = 0; i < K; i++) xf[i] = rnd_normal();
            quantize_row_q8x(xf, xq, K);
            const blk_q8x *xs[1] = {xq};
            float rows[5], one;
            vec_dot_rows(type, nb, w, rb, 5, xq, rows);
            int same = 1;
            for (int r = 0; r < 5; r++) {
                vec_dot(type, nb, w + r * rb, xs, 1, &one);
                same &= memcmp(&one, &rows[r], sizeof(float)) == 0;
            }
            snprintf(what, sizeof(what), "gemv: %s K=%lld vec_dot_rows bit-identical to vec_dot",
                     ggml_type_name(type), (long long)K);
            check(same, what);
            free(tmp); free(xf); free(w); free(xq);
        }
}

static void test_matmul(void) {
    static const int64_t SH[][3] = {{1, 256, 1}, {5, 256, 19}, {4, 512, 33}, {13, 768, 40}};
    char what[160];
    for (size_t t = 0; t < sizeof(TYPES) / sizeof(TYPES[0]); t++)
        for (size_t s = 0; s < sizeof(SH) / sizeof(SH[0]); s++) {
            int type = TYPES[t];
            int64_t N = SH[s][0], K = SH[s][1], M = SH[s][2], nb = K / QK8X;
            size_t rb = ggml_type_nbytes(type, K);
            uint8_t *w = malloc(rb * (size_t)M);
            float *tmp = malloc(sizeof(float) * (size_t)K);
            for (int64_t j = 0; j < M; j++) {
                void *row = random_row(type, K, tmp);
                memcpy(w + j * rb, row, rb);
                free(row);
            }
            float *x = malloc(sizeof(float) * (size_t)(N * K)), *b = malloc(sizeof(float) * (size_t)M);
            for (int64_t i = 0; i < N * K; i++) x[i] = rnd_normal();
            for (int64_t j = 0; j < M; j++) b[j] = rnd_normal();
            h3r_tensor W = {"w", type, 2, {K, M, 1, 1}, w, rb * (size_t)M};
            h3r_tensor B = {"b", GGML_TYPE_F32, 1, {M, 1, 1, 1}, b, (size_t)M * 4};
            float *y[3];
            int rc = 0;
            for (int th = 1; th <= 3; th++) {
                h3r_pool *p = h3r_pool_create(th);
                y[th - 1] = malloc(sizeof(float) * (size_t)(N * M));
                rc |= op_matmul(p, y[th - 1], x, &W, &B, N);
                h3r_pool_free(p);
            }
            snprintf(what, sizeof(what), "matmul: %s N=%lld K=%lld M=%lld rc", ggml_type_name(type),
                     (long long)N, (long long)K, (long long)M);
            check(rc == 0, what);
            int same = memcmp(y[0], y[1], sizeof(float) * (size_t)(N * M)) == 0 &&
                       memcmp(y[0], y[2], sizeof(float) * (size_t)(N * M)) == 0;
            snprintf(what, sizeof(what), "matmul: %s N=%lld K=%lld M=%lld same for 1, 2, 3 threads",
                     ggml_type_name(type), (long long)N, (long long)K, (long long)M);
            check(same, what);
            /* double reference on the same quantized operands */
            float *wf = malloc(sizeof(float) * (size_t)K);
            blk_q8x *xq = malloc(sizeof(blk_q8x) * (size_t)nb);
            double emax = 0.0, rmax = 0.0;
            for (int64_t n = 0; n < N; n++) {
                quantize_row_q8x(x + n * K, xq, K);
                for (int64_t j = 0; j < M; j++) {
                    dequantize_row(type, w + j * rb, wf, K);
                    double acc = b[j];
                    for (int64_t i = 0; i < K; i++) acc += (double)wf[i] * xq[i / 32].d * xq[i / 32].qs[i % 32];
                    emax = fmax(emax, fabs(acc - y[0][n * M + j]));
                    rmax = fmax(rmax, fabs(acc));
                }
            }
            snprintf(what, sizeof(what), "matmul: %s N=%lld K=%lld M=%lld vs double rel %.2e < %.0e",
                     ggml_type_name(type), (long long)N, (long long)K, (long long)M, emax / rmax, TOL_MM);
            check(emax / rmax < TOL_MM, what);
            printf("  %s\n", what);
            for (int i = 0; i < 3; i++) free(y[i]);
            free(w); free(tmp); free(x); free(b); free(wf); free(xq);
        }
}

int main(void) {
    printf("quant C tests, SIMD variant: %s\n", quant_simd_name());
    test_layout();
    test_quant_round_trip();
    test_dot();
    test_gemv_rows();
    test_matmul();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
