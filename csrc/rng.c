/*
 * The engine's noise source: Philox4x32-10 counter-based RNG + Box-Muller.
 *
 * Same seed, same noise, on every machine and thread count, and simple enough
 * to re-implement in a few lines of numpy (tests/test_sampler.py does). The
 * exact algorithm is specified in docs/ENGINE.md ("Noise"); in short:
 *
 *   key     = (k0, k1) = (seed & 0xffffffff, seed >> 32)
 *   for pair index p = 0, 1, ... (element 2p and 2p+1):
 *     counter = (c0, c1, c2, c3) = (p & 0xffffffff, p >> 32, 0, 0)
 *     (x0, x1, x2, x3) = philox4x32_10(counter, key)
 *     a  = ((x0 << 32) | x1) >> 11            53 random bits
 *     b  = ((x2 << 32) | x3) >> 11
 *     u1 = (a + 0.5) * 2^-53                  in (0, 1), never 0
 *     u2 = (b + 0.5) * 2^-53
 *     r  = sqrt(-2 ln u1)                     all in double
 *     out[2p]   = (float)(r * cos(2 pi u2))
 *     out[2p+1] = (float)(r * sin(2 pi u2))   (dropped when n is odd)
 *
 * Philox4x32-10 is Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"
 * (SC'11), with the Random123 constants: ten rounds, the key bumped by the Weyl
 * constants between rounds.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "models.h"

#define PHILOX_M0 0xD2511F53u /* multiplier of words 0/1 */
#define PHILOX_M1 0xCD9E8D57u /* multiplier of words 2/3 */
#define PHILOX_W0 0x9E3779B9u /* key bump, golden ratio */
#define PHILOX_W1 0xBB67AE85u /* key bump, sqrt(3) - 1 */

/* One Philox4x32 round:
 *   (hi0, lo0) = M0 * c0,  (hi1, lo1) = M1 * c2   (32x32 -> 64 bit products)
 *   c' = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0) */
static inline void philox_round(uint32_t c[4], uint32_t k0, uint32_t k1) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k0;
    uint32_t n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

/* Philox4x32-10 of counter c (in place) under key (k0, k1). */
static void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        philox_round(c, k0, k1);
    }
}

/* Fill out (n,) with float32 N(0, 1) samples for this seed (see the header
 * comment for the exact algorithm). Element i depends only on (seed, i).
 * No side effects; n <= 0 writes nothing. */
void h3r_randn(uint64_t seed, float *out, int64_t n) {
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const double two_pi = 6.283185307179586476925286766559;
    const double inv53 = 1.0 / 9007199254740992.0; /* 2^-53 */
    for (int64_t i = 0; i < n; i += 2) {
        uint64_t p = (uint64_t)i >> 1;
        uint32_t c[4] = {(uint32_t)p, (uint32_t)(p >> 32), 0u, 0u};
        philox4x32_10(c, k0, k1);
        uint64_t a = ((((uint64_t)c[0]) << 32) | c[1]) >> 11;
        uint64_t b = ((((uint64_t)c[2]) << 32) | c[3]) >> 11;
        double u1 = ((double)a + 0.5) * inv53;
        double u2 = ((double)b + 0.5) * inv53;
        double r = sqrt(-2.0 * log(u1));
        double th = two_pi * u2;
        out[i] = (float)(r * cos(th));
        if (i + 1 < n) out[i + 1] = (float)(r * sin(th));
    }
}

/* ---------------------------------------------------------------- test entry
 * Test entry points, NOT stable ABI (tests/test_sampler.py). */

/* One Philox4x32-10 block: out (4,) = philox(counter ctr (4,), key (2,)). */
H3R_API void h3r_test_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
H3R_API void h3r_test_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    philox4x32_10(c, key[0], key[1]);
    memcpy(out, c, sizeof c);
}

/* h3r_randn into out (n,); 0, or H3R_ERR_INVALID for n < 0 or a NULL buffer. */
H3R_API int h3r_test_randn(uint64_t seed, float *out, int64_t n);
H3R_API int h3r_test_randn(uint64_t seed, float *out, int64_t n) {
    if (n < 0 || (n > 0 && !out))
        return h3r_seterr(H3R_ERR_INVALID, "h3r_test_randn: n=%lld with out=%p; need n >= 0 "
                          "and a buffer of n floats", (long long)n, (void *)out);
    h3r_randn(seed, out, n);
    return 0;
}
