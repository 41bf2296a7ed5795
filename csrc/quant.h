/*
 * Quantized weight blocks (GGML layouts) and the integer dot kernels of the
 * CPU engine. Internal to the library; ops.c, test_exports.c and the C unit
 * tests in tests/c use it.
 *
 * A quantized matmul never dequantizes its weights: each activation row is
 * quantized once per matmul into 8-bit blocks of 32 (blk_q8x, one f32 scale
 * per block), and every weight block meets an activation block in an integer
 * dot product, scaled by one f32 (weight scale x activation scale) per block
 * pair and accumulated in f32.
 *
 * Letters: K input dim (a multiple of the weight type's block size), nb = K/32
 * activation blocks per row.
 */
#ifndef H3R_QUANT_H
#define H3R_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include "internal.h"

#define QK8_0 32   /* elements per Q8_0 block */
#define QK4_0 32   /* elements per Q4_0 block */
#define QK_K 256   /* elements per Q6_K super-block */
#define QK8X 32    /* elements per activation block */

/*
 * Q8_0, 34 bytes per 32 elements:   x[i] = d * qs[i]
 *   +--------+--------------------------------+
 *   | d  f16 | qs[32]  int8                   |
 *   +--------+--------------------------------+
 */
typedef struct {
    uint16_t d;
    int8_t qs[QK8_0];
} blk_q8_0;

/*
 * Q4_0, 18 bytes per 32 elements:   x[i] = d * (nibble(i) - 8)
 *   +--------+--------------------------------+
 *   | d  f16 | qs[16]: byte j = x[j] | x[j+16] << 4  |
 *   +--------+--------------------------------+
 * (low nibbles hold elements 0-15, high nibbles 16-31)
 */
typedef struct {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
} blk_q4_0;

/*
 * Q6_K, 210 bytes per 256 elements: x[i] = d * scales[i/16] * (q(i) - 32),
 * q(i) 6 bits = 4 low bits from ql, 2 high bits from qh. For element
 *   i = 128*h + 32*s + l   (half h in 0..1, quarter s in 0..3, l in 0..31)
 *   low  = ql[64*h + 32*(s&1) + l] >> (4*(s>>1)) & 0xF
 *   high = qh[32*h + l] >> (2*s) & 3
 *   +-----------+----------+---------------+--------+
 *   | ql[128]   | qh[64]   | scales[16] i8 | d  f16 |
 *   +-----------+----------+---------------+--------+
 */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
} blk_q6_k;

/* Activation block: 36 bytes per 32 elements, x[i] ~ d * qs[i], qs in [-127, 127]. */
typedef struct {
    float d;
    int8_t qs[QK8X];
} blk_q8x;

_Static_assert(sizeof(blk_q8_0) == 34, "blk_q8_0 must match ggml's block_q8_0");
_Static_assert(sizeof(blk_q4_0) == 18, "blk_q4_0 must match ggml's block_q4_0");
_Static_assert(sizeof(blk_q6_k) == 210, "blk_q6_k must match ggml's block_q6_K");
_Static_assert(sizeof(blk_q8x) == 36, "blk_q8x is 4 + 32 bytes");

/* 1 if `type` is a quantized type the matmul kernels take (Q8_0, Q4_0, Q6_K). */
int quant_is_matmul_type(int type);
/* Elements per block of a quantized type, 0 for others. */
int quant_block_elems(int type);

/* src: n elements of `type` (F32, F16, Q8_0, Q4_0, Q6_K) -> dst (n,) f32.
 * n must be a multiple of the block size. Returns 0 or H3R_ERR_UNSUPPORTED /
 * H3R_ERR_INVALID with a message. Bit-identical to gguf-py's dequantize. */
int dequantize_row(int type, const void *src, float *dst, int64_t n);

/* x (n,) -> n/32 blocks, as gguf-py's quantize (and ggml's _ref quantizers)
 * compute them, bit for bit. n must be a multiple of 32. */
void quantize_row_q8_0(const float *x, blk_q8_0 *dst, int64_t n);
void quantize_row_q4_0(const float *x, blk_q4_0 *dst, int64_t n);

/* Activations x (n,) -> n/32 blocks: d = max|x| / 127, qs = round(x / d)
 * (half away from zero), d = 0 and qs = 0 for an all-zero block. */
void quantize_row_q8x(const float *x, blk_q8x *dst, int64_t n);

/*
 * Dot products of one weight row w (K = 32*nb elements of `type`) with nr
 * activation rows x[r] (nb blocks each), nr in 1..4 -> out[r].
 *   vec_dot_ref: the scalar ground truth, block terms summed in order.
 *   vec_dot:     the SIMD kernel (AVX2+FMA, NEON[+dotprod]) where built,
 *                else the scalar tail; same integer block sums, f32
 *                accumulation in lanes (x86: block b feeds chain b mod 2,
 *                or b mod 4 on AVX-512 builds, chains summed in a fixed
 *                tree). out[r] does not depend on nr.
 * type must satisfy quant_is_matmul_type; nb is a multiple of 8 for Q6_K.
 */
void vec_dot_ref(int type, int64_t nb, const void *w, const blk_q8x *const *x, int nr, float *out);
void vec_dot(int type, int64_t nb, const void *w, const blk_q8x *const *x, int nr, float *out);

/*
 * nw weight rows (1..4) at w + r * row_bytes, each of K = 32*nb elements of
 * `type`, with ONE activation row x (nb blocks) -> out[r]: the GEMV kernel
 * (independent chains per weight row, the activation block loaded once).
 * out[r] is bit-identical to vec_dot(type, nb, w_r, &x, 1, &out[r]).
 */
void vec_dot_rows(int type, int64_t nb, const void *w, size_t row_bytes, int nw, const blk_q8x *x,
                  float *out);

/*
 * Q8_0 GEMM with prepared activation rows (AVX-512 VNNI builds): each row of
 * nb blocks is first laid out by q8_gemm_prep into q8_gemm_prep_bytes(nb)
 * bytes (0 where the kernel is not built: then use vec_dot). q8_gemm_dot
 * takes one weight row, nr (1..8) prepared rows xp[r] and the same rows x[r]
 * -> out[r], bit-identical to vec_dot(GGML_TYPE_Q8_0, nb, w, x, nr, out).
 */
size_t q8_gemm_prep_bytes(int64_t nb);
void q8_gemm_prep(const blk_q8x *x, int64_t nb, void *dst);
void q8_gemm_dot(int64_t nb, const void *w, const uint8_t *const *xp, const blk_q8x *const *x, int nr,
                 float *out);

/* Name of the SIMD variant compiled in: "avx512-vnni", "avx2", "neon-dotprod", "neon" or "scalar". */
const char *quant_simd_name(void);

/* Read every page of every tensor of g in file order, so the first step does
 * not wait on page faults. Returns the bytes touched. */
uint64_t gguf_prewarm(const gguf_file *g);

#endif
