/*
 * Quantized blocks and integer dot kernels (see quant.h for the layouts).
 *
 * Every kernel has a scalar _ref that the tests treat as ground truth. The
 * fast kernel has one prologue, then `#if __AVX2__ ... #elif __ARM_NEON ...
 * #endif`, then one scalar loop for whatever blocks the SIMD loop left (all
 * of them when no SIMD is built). Integer block sums are exact in every
 * variant; only the order of the f32 accumulation of block terms differs
 * between _ref and SIMD, so they agree to a few ulps of the sum of |terms|.
 *
 * For one output element the SIMD kernels do the same operations whatever
 * the number of activation rows nr handled together, so a result never
 * depends on tiling or on the thread count.
 */
#include <math.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif
#include "quant.h"

/* AVX-512 (BW, VNNI) builds: the GEMV kernels take two blocks per 512-bit
 * step, and every x86 dot kernel keeps four f32 chains over the blocks
 * (block b feeds chain b mod 4) instead of two, so one row is not bound by
 * the FMA latency. The chains are summed as ((c0 + c2) + (c1 + c3)). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && \
    defined(__FMA__)
#define H3R_AVX512_GEMV 1
#define GEMV_MAX_NB 512   /* K <= 16384 takes the AVX-512 Q8_0/Q4_0 GEMV (37 KiB of stack) */
#else
#define H3R_AVX512_GEMV 0
#endif

/* ---------------------------------------------------------------- helpers */

/* Half -> float, using the hardware conversion where there is one. */
static inline float fp16(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#elif defined(__ARM_NEON) && defined(__aarch64__)
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
#else
    return h3r_f16_to_f32(h);
#endif
}

int quant_is_matmul_type(int type) {
    return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q6_K;
}

int quant_block_elems(int type) {
    switch (type) {
    case GGML_TYPE_Q8_0: return QK8_0;
    case GGML_TYPE_Q4_0: return QK4_0;
    case GGML_TYPE_Q6_K: return QK_K;
    default: return 0;
    }
}

const char *quant_simd_name(void) {
#if H3R_AVX512_GEMV
    return "avx512-vnni";   /* AVX2 kernels plus the AVX-512 VNNI GEMM/GEMV paths */
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2";
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
    return "neon-dotprod";
#elif defined(__ARM_NEON)
    return "neon";
#else
    return "scalar";
#endif
}

/* ---------------------------------------------------------------- dequantize */

/* Q6_K element i of block b as the signed 6-bit value q - 32. */
static inline int q6k_value(const blk_q6_k *b, int i) {
    int h = i / 128, s = (i % 128) / 32, l = i % 32;
    int lo = (b->ql[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0xF;
    int hi = (b->qh[32 * h + l] >> (2 * s)) & 3;
    return (lo | (hi << 4)) - 32;
}

/*
 * src: n elements of `type` -> dst (n,) f32. Each value is computed as gguf-py
 * does, in f32: Q8_0 d*q, Q4_0 d*(q-8), Q6_K (d*scale)*(q-32), so the result
 * is bit-identical. Returns 0, or a negative code when the type is not
 * supported or n is not a whole number of blocks.
 */
int dequantize_row(int type, const void *src, float *dst, int64_t n) {
    int64_t bs = type == GGML_TYPE_F32 || type == GGML_TYPE_F16 ? 1 : quant_block_elems(type);
    if (bs == 0)
        return h3r_seterr(H3R_ERR_UNSUPPORTED, "dequantize: type %s (%d) is not supported "
                          "(f32, f16, q8_0, q4_0, q6_k)", ggml_type_name(type), type);
    if (n < 0 || n % bs)
        return h3r_seterr(H3R_ERR_INVALID, "dequantize: %lld elements is not a whole number of "
                          "%s blocks of %lld", (long long)n, ggml_type_name(type), (long long)bs);
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case GGML_TYPE_F16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = h3r_f16_to_f32(h[i]);
        break;
    }
    case GGML_TYPE_Q8_0: {
        const blk_q8_0 *b = src;
        for (int64_t k = 0; k < n / QK8_0; k++) {
            float d = h3r_f16_to_f32(b[k].d);
            for (int i = 0; i < QK8_0; i++) dst[k * QK8_0 + i] = (float)b[k].qs[i] * d;
        }
        break;
    }
    case GGML_TYPE_Q4_0: {
        const blk_q4_0 *b = src;
        for (int64_t k = 0; k < n / QK4_0; k++) {
            float d = h3r_f16_to_f32(b[k].d);
            for (int j = 0; j < QK4_0 / 2; j++) {
                dst[k * QK4_0 + j] = d * (float)((b[k].qs[j] & 0xF) - 8);
                dst[k * QK4_0 + j + 16] = d * (float)((b[k].qs[j] >> 4) - 8);
            }
        }
        break;
    }
    case GGML_TYPE_Q6_K: {
        const blk_q6_k *b = src;
        for (int64_t k = 0; k < n / QK_K; k++) {
            float d = h3r_f16_to_f32(b[k].d);
            for (int i = 0; i < QK_K; i++) {
                float ds = d * (float)b[k].scales[i / 16];
                dst[k * QK_K + i] = ds * (float)q6k_value(&b[k], i);
            }
        }
        break;
    }
    }
    return 0;
}

/* ---------------------------------------------------------------- quantize */

/*
 * Q8_0 as ggml's quantize_row_q8_0_ref and gguf-py: d = amax / 127 in f32,
 * q = roundf(x * (1/d)) (half away from zero), d stored as f16. One case is
 * defined here where gguf-py's is not: a block whose max |x| is below
 * 127 * 2^-126 (1/d overflows; numpy then casts inf to int8) gets q = 0, d = 0.
 */
void quantize_row_q8_0(const float *x, blk_q8_0 *dst, int64_t n) {
    for (int64_t k = 0; k < n / QK8_0; k++) {
        const float *xb = x + k * QK8_0;
        float amax = 0.0f;
        for (int i = 0; i < QK8_0; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        if (!isfinite(id)) id = 0.0f;  /* d subnormal: gguf-py casts inf to int (undefined) */
        dst[k].d = h3r_f32_to_f16(d);
        for (int i = 0; i < QK8_0; i++) dst[k].qs[i] = (int8_t)roundf(xb[i] * id);
    }
}

/*
 * Q4_0 as gguf-py: m = the element of largest magnitude (first on ties),
 * d = m / -8, q = min(15, trunc(x * (1/d) + 8.5)), d stored as f16. When
 * 1/d overflows (|m| < 8 * 2^-126) q = 8, d = 0 (gguf-py: undefined casts).
 */
void quantize_row_q4_0(const float *x, blk_q4_0 *dst, int64_t n) {
    for (int64_t k = 0; k < n / QK4_0; k++) {
        const float *xb = x + k * QK4_0;
        float amax = 0.0f, m = 0.0f;
        for (int i = 0; i < QK4_0; i++)
            if (fabsf(xb[i]) > amax) { amax = fabsf(xb[i]); m = xb[i]; }
        float d = m / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        if (!isfinite(id)) id = 0.0f;  /* as for Q8_0 */
        dst[k].d = h3r_f32_to_f16(d);
        uint8_t q[QK4_0];
        for (int i = 0; i < QK4_0; i++) {
            float t = truncf(xb[i] * id + 8.5f);
            q[i] = !(t >= 0.0f) ? 0 : t > 15.0f ? 15 : (uint8_t)t;   /* NaN -> 0 */
        }
        for (int j = 0; j < QK4_0 / 2; j++) dst[k].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

/* Activations: one f32 scale d = amax/127 per 32, q = roundf(x * 127/amax) in [-127, 127].
 * The AVX2 path computes the same values: max is exact in any order,
 * x * id is the same product, and roundf (half away from zero) is
 * trunc(v) + sign(v) when |v - trunc(v)| >= 0.5, the difference being exact. */
void quantize_row_q8x(const float *x, blk_q8x *dst, int64_t n) {
    int64_t k = 0;
#if defined(__AVX2__)
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    for (; k < n / QK8X; k++) {
        const float *xb = x + k * QK8X;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);   /* NaN x: keeps m, as fmaxf */
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 127.0f / amax : 0.0f;
        dst[k].d = d;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            const __m256 p = _mm256_mul_ps(v[i], vid);
            const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(p, t)), half, _CMP_GE_OQ);
            const __m256 step = _mm256_and_ps(up, _mm256_or_ps(one, _mm256_and_ps(sign, p)));
            q[i] = _mm256_cvttps_epi32(_mm256_add_ps(t, step));
        }
        /* int32 x 32 -> int8 x 32 in element order (packs work per 128-bit lane) */
        __m256i w16 = _mm256_packs_epi32(q[0], q[1]), w16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i b8 = _mm256_packs_epi16(w16, w16b);
        b8 = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)dst[k].qs, b8);
    }
#endif
    for (; k < n / QK8X; k++) {
        const float *xb = x + k * QK8X;
        float amax = 0.0f;
        for (int i = 0; i < QK8X; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 127.0f / amax : 0.0f;
        dst[k].d = d;
        for (int i = 0; i < QK8X; i++) dst[k].qs[i] = (int8_t)roundf(xb[i] * id);
    }
}

/* ---------------------------------------------------------------- dot: scalar reference */

/* Integer sum of one weight block (32 elements) times activation block a.
 * For Q6_K, blk is the super-block and j the 32-element sub-block (0..7). */
static inline int32_t isum_q8_0(const blk_q8_0 *w, const int8_t *a) {
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += (int32_t)w->qs[i] * a[i];
    return s;
}

static inline int32_t isum_q4_0(const blk_q4_0 *w, const int8_t *a) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        s += ((w->qs[j] & 0xF) - 8) * a[j];
        s += ((w->qs[j] >> 4) - 8) * a[j + 16];
    }
    return s;
}

static inline int32_t isum_q6_k(const blk_q6_k *w, int j, const int8_t *a) {
    int32_t s0 = 0, s1 = 0;
    for (int l = 0; l < 16; l++) s0 += q6k_value(w, 32 * j + l) * a[l];
    for (int l = 16; l < 32; l++) s1 += q6k_value(w, 32 * j + l) * a[l];
    return s0 * w->scales[2 * j] + s1 * w->scales[2 * j + 1];
}

/* Weight scale of 32-element block b of a row, and its integer dot with a. */
static inline __attribute__((always_inline)) float wscale_isum(int type, const void *w, int64_t b, const int8_t *a, int32_t *is) {
    switch (type) {
    case GGML_TYPE_Q8_0: {
        const blk_q8_0 *p = (const blk_q8_0 *)w + b;
        *is = isum_q8_0(p, a);
        return fp16(p->d);
    }
    case GGML_TYPE_Q4_0: {
        const blk_q4_0 *p = (const blk_q4_0 *)w + b;
        *is = isum_q4_0(p, a);
        return fp16(p->d);
    }
    default: {
        const blk_q6_k *p = (const blk_q6_k *)w + b / 8;
        *is = isum_q6_k(p, (int)(b % 8), a);
        return fp16(p->d);
    }
    }
}

/*
 * w row (32*nb elements of `type`) . x[r] (nb blocks) -> out[r], r < nr:
 *   sum over blocks b, in order, of (dw_b * dx_b) * isum_b   (f32).
 */
void vec_dot_ref(int type, int64_t nb, const void *w, const blk_q8x *const *x, int nr, float *out) {
    for (int r = 0; r < nr; r++) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            int32_t is;
            float dw = wscale_isum(type, w, b, x[r][b].qs, &is);
            acc += (dw * x[r][b].d) * (float)is;
        }
        out[r] = acc;
    }
}

/* ---------------------------------------------------------------- dot: SIMD */

#if defined(__AVX2__) && defined(__FMA__)
/* Sum of the 8 lanes in a fixed tree: (l + l+4), then pairs. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* acc + 8 int32 lanes, lane l = sum of u[4l+i] * s[4l+i] (u unsigned, s
 * signed bytes). Without VNNI it goes through int16 pair sums, which is exact
 * as long as |u[2m] s[2m] + u[2m+1] s[2m+1]| <= 32767: true for every use
 * here (|w| <= 127 with |a| <= 127; nibbles and 6-bit values with a). */
static inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* 32 signed weights w . 32 activations a -> 8 int32 lanes (pairs of 4
 * products each): |w| as u8 times sign(a, w) as s8, as ggml's mul_sum_i8. */
static inline __m256i dot32_i8(__m256i w, __m256i a) {
    return dpbusd(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

/* Same with int16 scales per pair lane (Q6_K: 8 lanes of sc0 then 8 of sc1). */
static inline __m256i dot32_i8_scaled(__m256i w, __m256i a, __m256i sc16) {
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p16, sc16);
}

/* The 32 weights of block b as int8, and its scale (Q6_K: also its two
 * sub-block scales as 16-bit lanes). */
static inline __attribute__((always_inline)) __m256i load_w_avx2(int type, const void *w, int64_t b, float *dw, __m256i *sc16) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    switch (type) {
    case GGML_TYPE_Q8_0: {
        const blk_q8_0 *p = (const blk_q8_0 *)w + b;
        *dw = fp16(p->d);
        return _mm256_loadu_si256((const __m256i *)p->qs);
    }
    case GGML_TYPE_Q4_0: {
        const blk_q4_0 *p = (const blk_q4_0 *)w + b;
        *dw = fp16(p->d);
        __m128i q = _mm_loadu_si128((const __m128i *)p->qs);
        __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);   /* hi: elements 16-31 */
        return _mm256_sub_epi8(_mm256_and_si256(v, m4), _mm256_set1_epi8(8));
    }
    default: {
        const blk_q6_k *p = (const blk_q6_k *)w + b / 8;
        int j = (int)(b % 8), h = j / 4, s = j % 4;
        *dw = fp16(p->d);
        __m256i lo = _mm256_loadu_si256((const __m256i *)(p->ql + 64 * h + 32 * (s & 1)));
        __m256i hi = _mm256_loadu_si256((const __m256i *)(p->qh + 32 * h));
        lo = _mm256_and_si256(_mm256_srl_epi16(lo, _mm_cvtsi32_si128(4 * (s >> 1))), m4);
        hi = _mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(2 * s)), _mm256_set1_epi8(3));
        hi = _mm256_slli_epi16(hi, 4);
        *sc16 = _mm256_set_m128i(_mm_set1_epi16(p->scales[2 * j + 1]), _mm_set1_epi16(p->scales[2 * j]));
        return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
    }
    }
}
#endif

#if defined(__ARM_NEON)
/* 16 x int8 . 16 x int8 -> 4 int32 lanes. */
static inline int32x4_t dot16_i8(int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), w, a);
#else
    int16x8_t p0 = vmull_s8(vget_low_s8(w), vget_low_s8(a));
    int16x8_t p1 = vmull_s8(vget_high_s8(w), vget_high_s8(a));
    return vpadalq_s16(vpaddlq_s16(p0), p1);
#endif
}

/* Sum of the 4 lanes: (l0 + l2) + (l1 + l3). */
static inline float hsum4(float32x4_t v) {
    float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(s, 0) + vget_lane_f32(s, 1);
}

/* Weights of block b as two int8x16 halves (elements 0-15, 16-31), its scale,
 * and for Q6_K the two sub-block scales. */
static inline __attribute__((always_inline)) void load_w_neon(int type, const void *w, int64_t b, int8x16_t *w0, int8x16_t *w1,
                               float *dw, int32_t sc[2]) {
    switch (type) {
    case GGML_TYPE_Q8_0: {
        const blk_q8_0 *p = (const blk_q8_0 *)w + b;
        *dw = fp16(p->d);
        *w0 = vld1q_s8(p->qs);
        *w1 = vld1q_s8(p->qs + 16);
        return;
    }
    case GGML_TYPE_Q4_0: {
        const blk_q4_0 *p = (const blk_q4_0 *)w + b;
        *dw = fp16(p->d);
        uint8x16_t q = vld1q_u8(p->qs);
        *w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
        *w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
        return;
    }
    default: {
        const blk_q6_k *p = (const blk_q6_k *)w + b / 8;
        int j = (int)(b % 8), h = j / 4, s = j % 4;
        *dw = fp16(p->d);
        const uint8_t *ql = p->ql + 64 * h + 32 * (s & 1), *qh = p->qh + 32 * h;
        int8x16_t shl = vdupq_n_s8((int8_t)(-4 * (s >> 1))), shh = vdupq_n_s8((int8_t)(-2 * s));
        const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(3);
        for (int half = 0; half < 2; half++) {
            uint8x16_t lo = vandq_u8(vshlq_u8(vld1q_u8(ql + 16 * half), shl), m4);
            uint8x16_t hi = vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * half), shh), m2);
            int8x16_t v = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4))), vdupq_n_s8(32));
            if (half == 0) *w0 = v; else *w1 = v;
        }
        sc[0] = p->scales[2 * j];
        sc[1] = p->scales[2 * j + 1];
        return;
    }
    }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* Block b of the weight row against block b of each activation row r < nr:
 * v[r] += (dw * dx_r) * int32 lanes, one FMA per row. */
static inline __attribute__((always_inline)) void
vec_dot_block_avx2(const int type, const void *w, int64_t b, const blk_q8x *const *x, int nr, __m256 *v) {
    float dw;
    __m256i sc16 = _mm256_setzero_si256();
    __m256i wq = load_w_avx2(type, w, b, &dw, &sc16);
    for (int r = 0; r < nr; r++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)x[r][b].qs);
        __m256i is = type == GGML_TYPE_Q6_K ? dot32_i8_scaled(wq, a, sc16) : dot32_i8(wq, a);
        v[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x[r][b].d), _mm256_cvtepi32_ps(is), v[r]);
    }
}
#endif

/*
 * The SIMD kernel for one weight type (a constant after inlining, so the hot
 * loop has no type test). Per output element and block: an exact int32 lane
 * vector, converted to f32 and fused-multiply-added with the scale dw*dx into
 * a lane accumulator; lanes summed in a fixed tree. The nr activation rows
 * share each weight load; each row's chain of operations is the same for any nr.
 */
static inline __attribute__((always_inline)) void
vec_dot_t(const int type, int64_t nb, const void *w, const blk_q8x *const *x, int nr, float *out) {
    int64_t b = 0;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#if defined(__AVX2__) && defined(__FMA__)
    {
        /* two accumulators per row, even and odd blocks, so one row (GEMV) is
         * not bound by the FMA latency; summed lane-wise, then the lane tree */
#if H3R_AVX512_GEMV
        __m256 c0[4], c1[4], c2[4], c3[4];   /* chains b mod 4 (32 registers with AVX-512VL) */
        for (int r = 0; r < 4; r++) c0[r] = c1[r] = c2[r] = c3[r] = _mm256_setzero_ps();
        for (; b + 4 <= nb; b += 4) {
            vec_dot_block_avx2(type, w, b, x, nr, c0);
            vec_dot_block_avx2(type, w, b + 1, x, nr, c1);
            vec_dot_block_avx2(type, w, b + 2, x, nr, c2);
            vec_dot_block_avx2(type, w, b + 3, x, nr, c3);
        }
        if (b < nb) vec_dot_block_avx2(type, w, b++, x, nr, c0);
        if (b < nb) vec_dot_block_avx2(type, w, b++, x, nr, c1);
        if (b < nb) vec_dot_block_avx2(type, w, b++, x, nr, c2);
        for (int r = 0; r < nr; r++)
            acc[r] = hsum8(_mm256_add_ps(_mm256_add_ps(c0[r], c2[r]), _mm256_add_ps(c1[r], c3[r])));
#else
        __m256 ve[4], vo[4];   /* chains b mod 2 */
        for (int r = 0; r < 4; r++) ve[r] = vo[r] = _mm256_setzero_ps();
        for (; b + 2 <= nb; b += 2) {
            vec_dot_block_avx2(type, w, b, x, nr, ve);
            vec_dot_block_avx2(type, w, b + 1, x, nr, vo);
        }
        if (b < nb) vec_dot_block_avx2(type, w, b++, x, nr, ve);
        for (int r = 0; r < nr; r++) acc[r] = hsum8(_mm256_add_ps(ve[r], vo[r]));
#endif
    }
#elif defined(__ARM_NEON)
    {
        float32x4_t va[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        for (; b < nb; b++) {
            float dw;
            int8x16_t w0, w1;
            int32_t sc[2] = {1, 1};
            load_w_neon(type, w, b, &w0, &w1, &dw, sc);
            for (int r = 0; r < nr; r++) {
                int32x4_t p0 = dot16_i8(w0, vld1q_s8(x[r][b].qs));
                int32x4_t p1 = dot16_i8(w1, vld1q_s8(x[r][b].qs + 16));
                int32x4_t is = type == GGML_TYPE_Q6_K ? vmlaq_n_s32(vmulq_n_s32(p0, sc[0]), p1, sc[1])
                                                      : vaddq_s32(p0, p1);
                va[r] = vfmaq_n_f32(va[r], vcvtq_f32_s32(is), dw * x[r][b].d);
            }
        }
        for (int r = 0; r < nr; r++) acc[r] = hsum4(va[r]);
    }
#endif
    /* scalar tail: every block the SIMD loop did not take */
    for (; b < nb; b++)
        for (int r = 0; r < nr; r++) {
            int32_t is;
            float dw = wscale_isum(type, w, b, x[r][b].qs, &is);
            acc[r] += (dw * x[r][b].d) * (float)is;
        }
    for (int r = 0; r < nr; r++) out[r] = acc[r];
}

#if H3R_AVX512_GEMV
static void vec_dot_q8_0_512(int64_t nb, const void *w, const blk_q8x *const *x, int nr, float *out);
#endif

void vec_dot(int type, int64_t nb, const void *w, const blk_q8x *const *x, int nr, float *out) {
    if (nr > 4) nr = 4;
    /* type and nr constants in each instance: no type test in the loop, and the
     * per-row accumulators stay in registers */
#define VEC_DOT_NR(T)                                                  \
    do {                                                               \
        if (nr == 4) vec_dot_t(T, nb, w, x, 4, out);                   \
        else if (nr == 3) vec_dot_t(T, nb, w, x, 3, out);              \
        else if (nr == 2) vec_dot_t(T, nb, w, x, 2, out);              \
        else vec_dot_t(T, nb, w, x, 1, out);                           \
    } while (0)
    switch (type) {
#if H3R_AVX512_GEMV
    case GGML_TYPE_Q8_0: vec_dot_q8_0_512(nb, w, x, nr, out); break;
#else
    case GGML_TYPE_Q8_0: VEC_DOT_NR(GGML_TYPE_Q8_0); break;
#endif
    case GGML_TYPE_Q4_0: VEC_DOT_NR(GGML_TYPE_Q4_0); break;
    default: VEC_DOT_NR(GGML_TYPE_Q6_K); break;
    }
#undef VEC_DOT_NR
}

/* ---------------------------------------------------------------- GEMV: weight rows x one activation row
 *
 * For a single activation row (N = 1, the GEMV of one token) the kernel above
 * pays for setup shared by 4 activation rows. vec_dot_rows streams weight
 * rows one after the other against the one activation row with the leanest
 * unpacking. Each output gets exactly the operations vec_dot gives it (same
 * int32 lanes, same per-block scale product, same two FMA chains over even
 * and odd blocks, same lane tree), so the results are bit-identical to
 * vec_dot with nr = 1.
 *
 * Q4_0 and Q6_K weights are used unsigned (nibble q, 6-bit q) and the offset
 * taken out in integers: lane (q - o) . a = (q . a) - (o . a), where o . a
 * (o = 8 or 32 in every byte) is one more dot. Exact, so the lanes equal
 * the signed ones.
 */
#ifndef QPF_BYTES
#define QPF_BYTES 4096   /* software prefetch distance in the weight stream (measured best of 0.5-4 KiB) */
#endif

#if H3R_AVX512_GEMV
/*
 * AVX-512 GEMV, two blocks per step: blocks b (even) and b+1 (odd) side by
 * side in one 512-bit register, so the low 256 bits carry exactly the even-
 * block chain and the high 256 bits the odd-block chain of the AVX2 kernel,
 * lane for lane (same int32 lanes, same scale product, same FMA); the two
 * halves are then added and summed by the same tree. Bit-identical to the
 * AVX2 path, with half the instructions per block.
 */

/* (fp16(d0) * xd0) in lanes 0-7, (fp16(d1) * xd1) in lanes 8-15. */
static inline __m512 scale_pair(uint16_t d0, float xd0, uint16_t d1, float xd1) {
    const float s0 = fp16(d0) * xd0, s1 = fp16(d1) * xd1;
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0)), _mm256_set1_ps(s1), 1);
}

/*
 * vec_dot for Q8_0 on AVX-512 builds (the GEMM kernel): a weight row against
 * nr <= 4 activation rows, blocks b, b+1 side by side in 512-bit registers,
 * so each step does the work of two AVX2 steps. Per row the chains are those
 * of vec_dot_t (block b feeds chain b mod 4: pairs b = 0 mod 4 go to the
 * register holding chains 0|1, pairs b = 2 mod 4 to 2|3), the lanes those of
 * dot32_i8 and the scales the same f32 products, so every output is
 * bit-identical to vec_dot_t's and to the GEMV kernel's.
 */
/*
 * One row's Q8_0 dot from the two pair chains of the 512-bit kernels: the
 * eight 8-lane chains c0 | c1 (acc0) and c2 | c3 (acc1), plus the single
 * block b left when nb is odd (into chain 2 after a left-over pair, else
 * chain 0), summed in vec_dot_q8_0's order.
 */
static inline __attribute__((always_inline)) float
q8_pairs_sum(__m512 acc0, __m512 acc1, const blk_q8_0 *p, const blk_q8x *x, int64_t b, int64_t nb,
             int pair_left) {
    __m256 c0 = _mm512_castps512_ps256(acc0), c1 = _mm512_extractf32x8_ps(acc0, 1);
    __m256 c2 = _mm512_castps512_ps256(acc1), c3 = _mm512_extractf32x8_ps(acc1, 1);
    if (b < nb) {
        const __m256i is = dot32_i8(_mm256_loadu_si256((const __m256i *)p[b].qs),
                                    _mm256_loadu_si256((const __m256i *)x[b].qs));
        const __m256 sc = _mm256_set1_ps(fp16(p[b].d) * x[b].d);
        if (pair_left) c2 = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(is), c2);
        else c0 = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(is), c0);
    }
    return hsum8(_mm256_add_ps(_mm256_add_ps(c0, c2), _mm256_add_ps(c1, c3)));
}

static inline __attribute__((always_inline)) void
vec_dot_q8_0_512_t(int64_t nb, const void *w, const blk_q8x *const *x, const int nr, float *out) {
    const blk_q8_0 *p = w;
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc0[4], acc1[4];
    for (int r = 0; r < 4; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
#define Q8_PAIR(b, acc)                                                                                  \
    do {                                                                                                 \
        const __m512i wq = _mm512_inserti64x4(                                                           \
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p[b].qs)),                        \
            _mm256_loadu_si256((const __m256i *)p[(b) + 1].qs), 1);                                      \
        const __m512i aw = _mm512_abs_epi8(wq);                                                          \
        const __mmask64 neg = _mm512_movepi8_mask(wq);                                                   \
        const __m512 dw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(fp16(p[b].d))),       \
                                             _mm256_set1_ps(fp16(p[(b) + 1].d)), 1);                     \
        for (int r = 0; r < nr; r++) {                                                                   \
            const __m512i a = _mm512_inserti64x4(                                                        \
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x[r][b].qs)),                 \
                _mm256_loadu_si256((const __m256i *)x[r][(b) + 1].qs), 1);                               \
            const __m512i is = _mm512_dpbusd_epi32(zero, aw, _mm512_mask_sub_epi8(a, neg, zero, a));     \
            const __m512 xd = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_broadcast_ss(&x[r][b].d)), \
                                                 _mm256_broadcast_ss(&x[r][(b) + 1].d), 1);              \
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, xd), _mm512_cvtepi32_ps(is), acc[r]);             \
        }                                                                                                \
    } while (0)
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        _mm_prefetch((const char *)(p + b) + QPF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + b) + QPF_BYTES + 64, _MM_HINT_T0);
        Q8_PAIR(b, acc0);
        Q8_PAIR(b + 2, acc1);
    }
    int pair_left = b + 2 <= nb;
    if (pair_left) {
        Q8_PAIR(b, acc0);
        b += 2;
    }
#undef Q8_PAIR
    for (int r = 0; r < nr; r++) out[r] = q8_pairs_sum(acc0[r], acc1[r], p, x[r], b, nb, pair_left);
}

/* nr a constant in each instance, so the accumulators stay in registers. */
static void vec_dot_q8_0_512(int64_t nb, const void *w, const blk_q8x *const *x, int nr, float *out) {
    switch (nr) {
    case 4: vec_dot_q8_0_512_t(nb, w, x, 4, out); break;
    case 3: vec_dot_q8_0_512_t(nb, w, x, 3, out); break;
    case 2: vec_dot_q8_0_512_t(nb, w, x, 2, out); break;
    default: vec_dot_q8_0_512_t(nb, w, x, 1, out); break;
    }
}

/*
 * Prepared activation row for the Q8_0 GEMM (q8_gemm_prep): the qs of the
 * row as unsigned bytes qs + 128 (nb * 32), then per block pair the scales
 * as a 512-bit vector [x[b].d x 8 | x[b+1].d x 8] (nb/2 * 64 bytes).
 */
size_t q8_gemm_prep_bytes(int64_t nb) { return (size_t)nb * 32 + (size_t)(nb / 2) * 64; }

void q8_gemm_prep(const blk_q8x *x, int64_t nb, void *dst) {
    uint8_t *u = dst;
    float *xd = (float *)(u + nb * 32);
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++)
        _mm256_storeu_si256((__m256i *)(u + 32 * b),
                            _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)x[b].qs), bias));
    for (int64_t b = 0; b + 2 <= nb; b += 2) {
        _mm256_storeu_ps(xd + 8 * b, _mm256_set1_ps(x[b].d));
        _mm256_storeu_ps(xd + 8 * b + 8, _mm256_set1_ps(x[b + 1].d));
    }
}

/*
 * vec_dot for Q8_0 with prepared activation rows xp[r] (and the plain rows
 * x[r] for an odd last block). (a + 128) . w = a . w + 128 * sum(w): the
 * dpbusd starts from -128 * sum(w) lanes (once per weight pair, shared by the
 * rows), so its lanes are exactly those of dot32_i8 without a sign fix-up per
 * row; scales are the same f32 products. Bit-identical to vec_dot.
 */
static inline __attribute__((always_inline)) void
q8_gemm_t(int64_t nb, const void *w, const uint8_t *const *xp, const blk_q8x *const *x, const int nr,
          float *out) {
    const blk_q8_0 *p = w;
    const __m512i zero = _mm512_setzero_si512(), c128 = _mm512_set1_epi8((char)0x80);
    __m512 acc0[8], acc1[8];
    for (int r = 0; r < 8; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
#define Q8P_PAIR(b, acc)                                                                                 \
    do {                                                                                                 \
        const __m512i wq = _mm512_inserti64x4(                                                           \
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p[b].qs)),                        \
            _mm256_loadu_si256((const __m256i *)p[(b) + 1].qs), 1);                                      \
        const __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, c128, wq));                \
        const __m512 dw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(fp16(p[b].d))),       \
                                             _mm256_set1_ps(fp16(p[(b) + 1].d)), 1);                     \
        for (int r = 0; r < nr; r++) {                                                                   \
            const __m512i a = _mm512_loadu_si512((const void *)(xp[r] + 32 * (b)));                      \
            const __m512 xd = _mm512_loadu_ps((const float *)(xp[r] + 32 * nb) + 8 * (b));              \
            const __m512i is = _mm512_dpbusd_epi32(corr, a, wq);                                         \
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, xd), _mm512_cvtepi32_ps(is), acc[r]);             \
        }                                                                                                \
    } while (0)
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        _mm_prefetch((const char *)(p + b) + QPF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(p + b) + QPF_BYTES + 64, _MM_HINT_T0);
        Q8P_PAIR(b, acc0);
        Q8P_PAIR(b + 2, acc1);
    }
    int pair_left = b + 2 <= nb;
    if (pair_left) {
        Q8P_PAIR(b, acc0);
        b += 2;
    }
#undef Q8P_PAIR
    if (nr == 8 && b == nb) {
        /* the per-row sums of the loop below for 8 rows at once: per row
         * u = acc0 + acc1 is (c0 + c2) | (c1 + c3), l = low + high half its
         * 8 lanes, s_i = l_i + l_(i+4), t0 = s0 + s2, t1 = s1 + s3, out =
         * t0 + t1: hsum8's tree, rows r and r+4 in the two 128-bit halves */
        __m256 l[8], s[4], t[4];
        for (int r = 0; r < 8; r++) {
            const __m512 u = _mm512_add_ps(acc0[r], acc1[r]);
            l[r] = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
        }
        for (int r = 0; r < 4; r++)   /* s lanes: s(row r) 0-3 | s(row r+4) 0-3 */
            s[r] = _mm256_add_ps(_mm256_permute2f128_ps(l[r], l[r + 4], 0x20),
                                 _mm256_permute2f128_ps(l[r], l[r + 4], 0x31));
        for (int r = 0; r < 4; r += 2)   /* t lanes: t0, t1 of row r, of row r+1 (| rows +4) */
            t[r / 2] = _mm256_add_ps(_mm256_shuffle_ps(s[r], s[r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm256_shuffle_ps(s[r], s[r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        _mm256_storeu_ps(out, _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                            _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1))));
        return;
    }
    for (int r = 0; r < nr; r++) out[r] = q8_pairs_sum(acc0[r], acc1[r], p, x[r], b, nb, pair_left);
}

void q8_gemm_dot(int64_t nb, const void *w, const uint8_t *const *xp, const blk_q8x *const *x, int nr,
                 float *out) {
    switch (nr) {
    case 8: q8_gemm_t(nb, w, xp, x, 8, out); break;
    case 7: q8_gemm_t(nb, w, xp, x, 7, out); break;
    case 6: q8_gemm_t(nb, w, xp, x, 6, out); break;
    case 5: q8_gemm_t(nb, w, xp, x, 5, out); break;
    case 4: q8_gemm_t(nb, w, xp, x, 4, out); break;
    case 3: q8_gemm_t(nb, w, xp, x, 3, out); break;
    case 2: q8_gemm_t(nb, w, xp, x, 2, out); break;
    default: q8_gemm_t(nb, w, xp, x, 1, out); break;
    }
}


/* One activation row laid out for the GEMV: block qs contiguous (a pair of
 * blocks is one 64-byte load), the scales contiguous (8 at a time), and for
 * Q4_0 / Q6_K the lanes -(o . a) (the offset o = 8 / 32 of the unsigned
 * weights) computed once for every row. */
typedef struct {
    _Alignas(64) int8_t qs[GEMV_MAX_NB * 32];
    _Alignas(64) int32_t na8[GEMV_MAX_NB * 8];   /* -(o . a) lanes, the start of each Q4_0 / Q6_K dot */
    float xd[GEMV_MAX_NB];
} gemv_act;

static void gemv_act_fill(int type, int64_t nb, const blk_q8x *x, gemv_act *g) {
    for (int64_t b = 0; b < nb; b++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)x[b].qs);
        _mm256_store_si256((__m256i *)(g->qs + 32 * b), a);
        if (type != GGML_TYPE_Q8_0)   /* Q4_0: o = 8, Q6_K: o = 32 */
            _mm256_store_si256((__m256i *)(g->na8 + 8 * b),
                               _mm256_sub_epi32(_mm256_setzero_si256(),
                                                dpbusd(_mm256_setzero_si256(),
                                                       _mm256_set1_epi8(type == GGML_TYPE_Q4_0 ? 8 : 32), a)));
        g->xd[b] = x[b].d;
    }
}

/* The 8 f16 scales d of blocks p[0..7] (stride `stride`: 18 for Q4_0, 34
 * for Q8_0) as floats, converted exactly. With AVX-512 VBMI the 16 scale
 * bytes are picked out of the 8 blocks (144 / 272 bytes, all read inside the
 * blocks) by two-table byte permutes; otherwise one insert per block. */
static inline __m256 fp16x8(const uint8_t *p, size_t stride) {
#if defined(__AVX512VBMI__)
    if (stride == sizeof(blk_q4_0)) {
        const __m512i idx = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                            127, 126, 109, 108, 91, 90, 73, 72, 55, 54, 37, 36, 19, 18, 1, 0);
        const __m512i h = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)p), idx,
                                                   _mm512_loadu_si512((const void *)(p + 64)));
        return _mm256_cvtph_ps(_mm512_castsi512_si128(h));
    }
    if (stride == sizeof(blk_q8_0)) {
        /* blocks 0-3: d at 0, 34, 68, 102 (bytes 0-127); blocks 4-7: 136 .. 238 (128-255) */
        const __m512i i0 = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                           0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                           0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                           0, 0, 0, 0, 0, 0, 0, 0, 103, 102, 69, 68, 35, 34, 1, 0);
        const __m512i i1 = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                           0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                           0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                           111, 110, 77, 76, 43, 42, 9, 8, 0, 0, 0, 0, 0, 0, 0, 0);
        const __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)p), i0,
                                                    _mm512_loadu_si512((const void *)(p + 64)));
        const __m512i hi = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)(p + 128)), i1,
                                                    _mm512_loadu_si512((const void *)(p + 192)));
        return _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_mask_blend_epi8((__mmask64)0xFF00, lo, hi)));
    }
#endif
    __m128i h = _mm_cvtsi32_si128(*(const uint16_t *)p);
    h = _mm_insert_epi16(h, *(const uint16_t *)(p + 1 * stride), 1);
    h = _mm_insert_epi16(h, *(const uint16_t *)(p + 2 * stride), 2);
    h = _mm_insert_epi16(h, *(const uint16_t *)(p + 3 * stride), 3);
    h = _mm_insert_epi16(h, *(const uint16_t *)(p + 4 * stride), 4);
    h = _mm_insert_epi16(h, *(const uint16_t *)(p + 5 * stride), 5);
    h = _mm_insert_epi16(h, *(const uint16_t *)(p + 6 * stride), 6);
    h = _mm_insert_epi16(h, *(const uint16_t *)(p + 7 * stride), 7);
    return _mm256_cvtph_ps(h);
}

/* Blocks b, b+1 of a Q8_0 / Q4_0 row against activation blocks x[b], x[b+1]
 * -> 16 int32 lanes (block b in lanes 0-7, b+1 in 8-15), as dot32_i8 or
 * the unsigned Q4_0 form would give them. */
static inline __attribute__((always_inline)) __m512i
pair_isum_512(const int type, const uint8_t *w, int64_t b, const gemv_act *g) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i a = _mm512_load_si512((const void *)(g->qs + 32 * b));
    if (type == GGML_TYPE_Q8_0) {
        const blk_q8_0 *p = (const blk_q8_0 *)w + b;
        const __m512i wq = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p[0].qs)),
            _mm256_loadu_si256((const __m256i *)p[1].qs), 1);
        /* |w| . (a with w's sign): the lanes of dot32_i8 */
        const __m512i as = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(wq), zero, a);
        return _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(wq), as);
    }
#if defined(__AVX512VBMI__)
    /* the two blocks' 36 bytes in one masked load (no access past them), qs
     * bytes spread by one byte permute: [qs_b, qs_b, qs_b+1, qs_b+1], then
     * the second copy of each shifted to its upper nibbles */
    const __m512i raw = _mm512_maskz_loadu_epi8((__mmask64)0xFFFFFFFFFull, w + b * sizeof(blk_q4_0));
    const __m512i spread = _mm512_permutexvar_epi8(
        _mm512_set_epi8(35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,
                        35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,
                        17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,
                        17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2), raw);
    const __m512i q = _mm512_and_si512(_mm512_srlv_epi64(spread, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)),
                                       _mm512_set1_epi8(0x0F));
#else
    const blk_q4_0 *p = (const blk_q4_0 *)w + b;
    const __m256i shift = _mm256_set_epi64x(4, 4, 0, 0);   /* high 128 bits: upper nibbles */
    const __m256i q0 = _mm256_srlv_epi64(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p[0].qs)), shift);
    const __m256i q1 = _mm256_srlv_epi64(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p[1].qs)), shift);
    const __m512i q = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1),
                                       _mm512_set1_epi8(0x0F));
#endif
    return _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(g->na8 + 8 * b)), q, a);
}

/*
 * Q8_0 / Q4_0 weight row . one activation row. xd (nb,) holds the
 * activation scales x[b].d contiguously, so the scale products of 8 blocks
 * are one vector multiply (the same f32 products as the scalar ones).
 */
static inline __attribute__((always_inline)) float
vec_dot_row1_512(const int type, int64_t nb, const uint8_t *w, const blk_q8x *x, const gemv_act *g) {
    const float *xd = g->xd;
    const size_t bs = type == GGML_TYPE_Q8_0 ? sizeof(blk_q8_0) : sizeof(blk_q4_0);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();   /* chains 0|1 and 2|3 */
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        _mm_prefetch((const char *)w + b * bs + QPF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)w + b * bs + QPF_BYTES + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)w + b * bs + QPF_BYTES + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)w + b * bs + QPF_BYTES + 192, _MM_HINT_T0);
        if (type == GGML_TYPE_Q8_0) _mm_prefetch((const char *)w + b * bs + QPF_BYTES + 256, _MM_HINT_T0);
        /* scales of blocks b .. b+7: fp16(d) * xd */
        const __m512 s8 = _mm512_castps256_ps512(_mm256_mul_ps(fp16x8(w + b * bs, bs), _mm256_loadu_ps(xd + b)));
        for (int t = 0; t < 4; t++) {
            /* block b+2t in lanes 0-7, b+2t+1 in lanes 8-15 */
            const __m512i idx = _mm512_set_epi32(2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1,
                                                 2 * t + 1, 2 * t + 1, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t,
                                                 2 * t, 2 * t);
            const __m512i is = pair_isum_512(type, w, b + 2 * t, g);
            const __m512 term = _mm512_cvtepi32_ps(is);
            if (t % 2 == 0) acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, s8), term, acc0);
            else acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, s8), term, acc1);
        }
    }
    for (; b + 2 <= nb; b += 2) {
        const uint16_t d0 = *(const uint16_t *)(w + b * bs), d1 = *(const uint16_t *)(w + (b + 1) * bs);
        const __m512i is = pair_isum_512(type, w, b, g);
        const __m512 sc = scale_pair(d0, x[b].d, d1, x[b + 1].d);
        if ((b & 2) == 0) acc0 = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(is), acc0);
        else acc1 = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(is), acc1);
    }
    __m256 c0 = _mm512_castps512_ps256(acc0), c1 = _mm512_extractf32x8_ps(acc0, 1);
    __m256 c2 = _mm512_castps512_ps256(acc1), c3 = _mm512_extractf32x8_ps(acc1, 1);
    if (b < nb) {   /* one block left (b even): chain b mod 4, as in vec_dot */
        const __m256i a = _mm256_loadu_si256((const __m256i *)x[b].qs);
        float dw;
        __m256i is;
        if (type == GGML_TYPE_Q8_0) {
            const blk_q8_0 *p = (const blk_q8_0 *)w + b;
            is = dot32_i8(_mm256_loadu_si256((const __m256i *)p->qs), a);
            dw = fp16(p->d);
        } else {
            const blk_q4_0 *p = (const blk_q4_0 *)w + b;
            __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p->qs));
            q = _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F));
            is = _mm256_sub_epi32(dpbusd(_mm256_setzero_si256(), q, a),
                                  dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(8), a));
            dw = fp16(p->d);
        }
        const __m256 sc = _mm256_set1_ps(dw * x[b].d);
        if ((b & 2) == 0) c0 = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(is), c0);
        else c2 = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(is), c2);
    }
    return hsum8(_mm256_add_ps(_mm256_add_ps(c0, c2), _mm256_add_ps(c1, c3)));
}

/* Q6_K weight row . one activation row: sub-blocks 2i (even) and 2i+1 (odd)
 * of a super-block per step. */
static inline float vec_dot_row1_q6k_512(int64_t nb, const uint8_t *w, const gemv_act *g) {
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};   /* chains 0|1 and 2|3 */
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl01 = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);   /* s = 0: << 4, s = 1: << 2 */
    const __m512i shr23 = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);   /* s = 2: >> 0, s = 3: >> 2 */
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const blk_q6_k *p = (const blk_q6_k *)w + sb;
        _mm_prefetch((const char *)p + QPF_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)p + QPF_BYTES + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)p + QPF_BYTES + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)p + QPF_BYTES + 192, _MM_HINT_T0);
        /* dw * dx of the 8 sub-blocks, the same f32 products as the scalar ones */
        const __m512 s8 = _mm512_castps256_ps512(
            _mm256_mul_ps(_mm256_set1_ps(fp16(p->d)), _mm256_loadu_ps(g->xd + 8 * sb)));
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p->scales)); /* (16) */
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(p->ql + 64 * h));   /* ql0 | ql1 */
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p->qh + 32 * h)));
            __m512i q[2];
            q[0] = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                   _mm512_and_si512(_mm512_sllv_epi64(qh, shl01), m30));       /* s 0 | 1 */
            q[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                   _mm512_and_si512(_mm512_srlv_epi64(qh, shr23), m30));       /* s 2 | 3 */
            for (int t = 0; t < 2; t++) {
                const int j = 4 * h + 2 * t;   /* sub-blocks j (even) and j + 1 (odd) */
                const int64_t bj = 8 * sb + j;
                const __m512i a = _mm512_load_si512((const void *)(g->qs + 32 * bj));
                /* lanes 0-3 scale 2j, 4-7 2j+1, 8-11 2j+2, 12-15 2j+3 */
                const __m512i idx = _mm512_add_epi32(
                    _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), _mm512_set1_epi32(2 * j));
                /* sub-block j in lanes 0-7, j + 1 in lanes 8-15 */
                const __m512i sidx = _mm512_set_epi32(j + 1, j + 1, j + 1, j + 1, j + 1, j + 1, j + 1, j + 1,
                                                      j, j, j, j, j, j, j, j);
                __m512i is = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(g->na8 + 8 * bj)), q[t], a);
                is = _mm512_mullo_epi32(is, _mm512_permutexvar_epi32(idx, sc));
                acc[t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(sidx, s8), _mm512_cvtepi32_ps(is),
                                         acc[t]);   /* j mod 4 = 2t */
            }
        }
    }
    const __m256 c0 = _mm512_castps512_ps256(acc[0]), c1 = _mm512_extractf32x8_ps(acc[0], 1);
    const __m256 c2 = _mm512_castps512_ps256(acc[1]), c3 = _mm512_extractf32x8_ps(acc[1], 1);
    return hsum8(_mm256_add_ps(_mm256_add_ps(c0, c2), _mm256_add_ps(c1, c3)));
}
#endif
#if defined(__AVX2__) && defined(__FMA__) && !H3R_AVX512_GEMV   /* 2 chains, as vec_dot without AVX-512 */
static inline __attribute__((always_inline)) void
vec_dot_row1_t(const int type, int64_t nb, const uint8_t *w, const blk_q8x *x, float *out) {
    __m256 va[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};   /* even, odd blocks */
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (type == GGML_TYPE_Q8_0) {
#define Q8_STEP(b, acc)                                                                           \
        do {                                                                                      \
            const blk_q8_0 *p = (const blk_q8_0 *)w + (b);                                        \
            __m256i is = dot32_i8(_mm256_loadu_si256((const __m256i *)p->qs),                     \
                                  _mm256_loadu_si256((const __m256i *)x[b].qs));                  \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(p->d) * x[b].d), _mm256_cvtepi32_ps(is), acc); \
        } while (0)
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            _mm_prefetch((const char *)((const blk_q8_0 *)w + b) + QPF_BYTES, _MM_HINT_T0);
            Q8_STEP(b, va[0]);
            Q8_STEP(b + 1, va[1]);
        }
        if (b < nb) Q8_STEP(b, va[0]);
#undef Q8_STEP
    } else if (type == GGML_TYPE_Q4_0) {
        const __m256i shift = _mm256_set_epi64x(4, 4, 0, 0);   /* high 128 bits: upper nibbles */
#define Q4_STEP(b, acc)                                                                           \
        do {                                                                                      \
            const blk_q4_0 *p = (const blk_q4_0 *)w + (b);                                        \
            const __m256i a = _mm256_loadu_si256((const __m256i *)x[b].qs);                       \
            const __m256i a8 = dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(8), a);            \
            __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p->qs));     \
            q = _mm256_and_si256(_mm256_srlv_epi64(q, shift), m4);                                \
            __m256i is = _mm256_sub_epi32(dpbusd(_mm256_setzero_si256(), q, a), a8);              \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(p->d) * x[b].d), _mm256_cvtepi32_ps(is), acc); \
        } while (0)
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            _mm_prefetch((const char *)((const blk_q4_0 *)w + b) + QPF_BYTES, _MM_HINT_T0);
            Q4_STEP(b, va[0]);
            Q4_STEP(b + 1, va[1]);
        }
        if (b < nb) Q4_STEP(b, va[0]);
#undef Q4_STEP
    } else { /* Q6_K: 8 activation blocks per super-block */
        const __m256i m30 = _mm256_set1_epi8(0x30);
        const __m256i lo4 = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const blk_q6_k *p = (const blk_q6_k *)w + sb;
            const blk_q8x *xs = x + 8 * sb;
            _mm_prefetch((const char *)p + QPF_BYTES, _MM_HINT_T0);
            _mm_prefetch((const char *)p + QPF_BYTES + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)p + QPF_BYTES + 128, _MM_HINT_T0);
            _mm_prefetch((const char *)p + QPF_BYTES + 192, _MM_HINT_T0);
            const float dw = fp16(p->d);
            const __m256i sc[2] = {
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p->scales)),
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p->scales + 8)))};
            for (int h = 0; h < 2; h++) {
                const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(p->ql + 64 * h));
                const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(p->ql + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(p->qh + 32 * h));
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                       _mm256_and_si256(qh, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
#define Q6_STEP(s, acc)                                                                           \
                do {                                                                              \
                    const int j = 4 * h + (s);   /* sub-block: elements 32j .. 32j+31 */          \
                    const __m256i a = _mm256_loadu_si256((const __m256i *)xs[j].qs);              \
                    const __m256i a32 = dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(32), a);  \
                    /* lanes 0-3 scale 2j, lanes 4-7 scale 2j+1 */                                \
                    __m256i scj = _mm256_permutevar8x32_epi32(                                    \
                        sc[h], _mm256_add_epi32(lo4, _mm256_set1_epi32(2 * (s))));                \
                    __m256i is = _mm256_sub_epi32(dpbusd(_mm256_setzero_si256(), q[s], a), a32);  \
                    is = _mm256_mullo_epi32(is, scj);                                             \
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * xs[j].d), _mm256_cvtepi32_ps(is), acc); \
                } while (0)
                Q6_STEP(0, va[0]);
                Q6_STEP(1, va[1]);
                Q6_STEP(2, va[0]);
                Q6_STEP(3, va[1]);
#undef Q6_STEP
            }
        }
    }
    *out = hsum8(_mm256_add_ps(va[0], va[1]));
}
#endif

/*
 * Weight rows r = 0 .. nw-1 (nw >= 1) at w + r * row_bytes, each K = 32*nb
 * elements of `type`, dotted with one activation row x (nb blocks) -> out[r],
 * bit-identical to vec_dot(type, nb, w_r, &x, 1, &out[r]). The rows are taken
 * one after the other: one sequential stream of weights (interleaving rows
 * measured slower on the memory side).
 */
void vec_dot_rows(int type, int64_t nb, const void *w, size_t row_bytes, int nw, const blk_q8x *x,
                  float *out) {
    const uint8_t *wb = w;
#if H3R_AVX512_GEMV
    if ((type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0) && nb <= GEMV_MAX_NB) {
        gemv_act g;   /* 37 KiB of stack at most */
        gemv_act_fill(type, nb, x, &g);
        for (int r = 0; r < nw; r++)
            out[r] = type == GGML_TYPE_Q8_0 ? vec_dot_row1_512(GGML_TYPE_Q8_0, nb, wb + r * row_bytes, x, &g)
                                            : vec_dot_row1_512(GGML_TYPE_Q4_0, nb, wb + r * row_bytes, x, &g);
        return;
    }
    if (type == GGML_TYPE_Q6_K && nb <= GEMV_MAX_NB) {
        gemv_act g;
        gemv_act_fill(type, nb, x, &g);
        for (int r = 0; r < nw; r++) out[r] = vec_dot_row1_q6k_512(nb, wb + r * row_bytes, &g);
        return;
    }
    const blk_q8x *xs1[1] = {x};   /* long rows: the 4-chain AVX2 kernel */
    for (int r = 0; r < nw; r++) vec_dot(type, nb, wb + (size_t)r * row_bytes, xs1, 1, out + r);
#elif defined(__AVX2__) && defined(__FMA__)
    for (int r = 0; r < nw; r++) {
        switch (type) {
        case GGML_TYPE_Q8_0: vec_dot_row1_t(GGML_TYPE_Q8_0, nb, wb + r * row_bytes, x, out + r); break;
        case GGML_TYPE_Q4_0: vec_dot_row1_t(GGML_TYPE_Q4_0, nb, wb + r * row_bytes, x, out + r); break;
        default: vec_dot_row1_t(GGML_TYPE_Q6_K, nb, wb + r * row_bytes, x, out + r); break;
        }
    }
#else
    const blk_q8x *xs[1] = {x};
    for (int r = 0; r < nw; r++) vec_dot(type, nb, wb + (size_t)r * row_bytes, xs, 1, out + r);
#endif
}

/* ---------------------------------------------------------------- prewarm */

/*
 * Touch one byte per 4 KiB page of every tensor, in file order, so the
 * kernel reads the weights sequentially (with readahead) before the first
 * step instead of faulting them in at random. Returns the bytes covered.
 */
uint64_t gguf_prewarm(const gguf_file *g) {
    volatile uint8_t sink = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const h3r_tensor *t = gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        uint8_t s = 0;
        for (size_t o = 0; o < t->nbytes; o += 4096) s ^= p[o];
        if (t->nbytes) s ^= p[t->nbytes - 1];
        sink ^= s;
        bytes += t->nbytes;
    }
    (void)sink;
    return bytes;
}

#if !H3R_AVX512_GEMV
/* Without the AVX-512 kernel there is nothing to prepare: the callers check
 * q8_gemm_prep_bytes() == 0 and use vec_dot. */
size_t q8_gemm_prep_bytes(int64_t nb) { (void)nb; return 0; }
void q8_gemm_prep(const blk_q8x *x, int64_t nb, void *dst) { (void)x; (void)nb; (void)dst; }
void q8_gemm_dot(int64_t nb, const void *w, const uint8_t *const *xp, const blk_q8x *const *x, int nr,
                 float *out) {
    (void)xp;
    vec_dot(GGML_TYPE_Q8_0, nb, w, x, nr, out);
}
#endif
