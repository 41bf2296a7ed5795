/*
 * GGML tensor types: one table indexed by type number, and IEEE half floats.
 *
 * Block layouts follow ggml so files stay readable by gguf-py, ggml tools,
 * sd.cpp and ComfyUI-GGUF. A type with blck == 0 is unknown to this engine;
 * GGUF files using it are rejected by the reader with a message naming the
 * tensor and the type number.
 */
#include <math.h>
#include <string.h>
#include "internal.h"

typedef struct {
    const char *name;
    int64_t blck;      /* elements per block */
    size_t blck_bytes; /* bytes per block */
} type_traits;

/* Sizes as in ggml.c / gguf-py GGML_QUANT_SIZES. QK_K = 256. */
static const type_traits TYPES[GGML_TYPE_COUNT] = {
    [GGML_TYPE_F32]  = {"f32", 1, 4},
    [GGML_TYPE_F16]  = {"f16", 1, 2},
    [GGML_TYPE_Q4_0] = {"q4_0", 32, 2 + 16},             /* d f16, 32 x 4-bit */
    [3]              = {"q4_1", 32, 2 + 2 + 16},
    [6]              = {"q5_0", 32, 2 + 4 + 16},
    [7]              = {"q5_1", 32, 2 + 2 + 4 + 16},
    [GGML_TYPE_Q8_0] = {"q8_0", 32, 2 + 32},             /* d f16, 32 x int8 */
    [9]              = {"q8_1", 32, 4 + 4 + 32},
    [10]             = {"q2_k", 256, 2 + 2 + 256 / 16 + 256 / 4},
    [11]             = {"q3_k", 256, 2 + 256 / 4 + 256 / 8 + 12},
    [12]             = {"q4_k", 256, 2 + 2 + 256 / 2 + 12},
    [13]             = {"q5_k", 256, 2 + 2 + 256 / 2 + 256 / 8 + 12},
    [GGML_TYPE_Q6_K] = {"q6_k", 256, 2 + 256 / 2 + 256 / 4 + 256 / 16}, /* 210 */
    [15]             = {"q8_k", 256, 4 + 256 + 256 / 8},
    [24]             = {"i8", 1, 1},
    [25]             = {"i16", 1, 2},
    [26]             = {"i32", 1, 4},
    [27]             = {"i64", 1, 8},
    [28]             = {"f64", 1, 8},
    [30]             = {"bf16", 1, 2},
};

_Static_assert(sizeof(float) == 4, "float must be IEEE binary32");
_Static_assert(sizeof(uint16_t) == 2, "uint16_t must be 2 bytes");

/*
 * Bytes needed for n elements of `type`. Returns 0 when the type is unknown,
 * n <= 0, n is not a whole number of blocks, or the size overflows size_t.
 */
size_t ggml_type_nbytes(int type, int64_t n) {
    if (type < 0 || type >= GGML_TYPE_COUNT || TYPES[type].blck == 0 || n <= 0) return 0;
    const type_traits *t = &TYPES[type];
    if (n % t->blck != 0) return 0;
    uint64_t blocks = (uint64_t)(n / t->blck);
    if (blocks > SIZE_MAX / t->blck_bytes) return 0;
    return (size_t)blocks * t->blck_bytes;
}

/* Short lower-case name ("f16"), or "unknown" for types not in the table. */
const char *ggml_type_name(int type) {
    if (type < 0 || type >= GGML_TYPE_COUNT || TYPES[type].blck == 0) return "unknown";
    return TYPES[type].name;
}

/* ---------------------------------------------------------------- half floats
 *
 *   binary16:  s eeeee mmmmmmmmmm     bias 15
 *   binary32:  s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   bias 127
 */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Exact conversion: every half value is representable as a float. */
float h3r_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / nan */
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);                           /* +-0 */
        /* subnormal: man * 2^-24, exact in float */
        float f = (float)man * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/*
 * Round to nearest, ties to even. Overflow gives +-inf, NaN stays NaN (quiet,
 * payload truncated but never turned into inf), tiny values become half
 * subnormals or +-0.
 */
uint16_t h3r_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;
    if (exp == 0xff) {                                   /* inf or nan */
        if (man == 0) return sign | 0x7c00u;
        return sign | 0x7e00u | (uint16_t)(man >> 13);
    }
    int32_t e = (int32_t)exp - 127 + 15;                 /* half exponent */
    if (e >= 0x1f) return sign | 0x7c00u;                /* overflow -> inf */
    if (e <= 0) {
        /* Subnormal half (or zero): value = m * 2^-24 with m = round(|f| * 2^24). */
        if (e < -10) return sign;                        /* below half the smallest subnormal */
        uint32_t m = man | 0x800000u;                    /* implicit 1, 24 bits */
        int shift = 14 - e;                              /* 14..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return sign | (uint16_t)q;                       /* q may carry into exponent 1: correct */
    }
    uint32_t q = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++; /* carry may round up to inf: correct */
    return sign | (uint16_t)q;
}
