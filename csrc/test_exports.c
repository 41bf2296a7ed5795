/*
 * Test-only exports (see test_exports.h): thin wrappers that give the Python
 * tests ctypes access to the GGUF reader and the ops. Not a stable ABI.
 */
#include <stdlib.h>
#include "internal.h"
#include "quant.h"
#include "test_exports.h"

int h3r_test_gguf_check(const char *path) {
    gguf_file *g = NULL;
    h3r_clear_error();
    int rc = gguf_open(path, &g);
    gguf_close(g);
    return rc;
}

int h3r_test_gguf_open(const char *path, void **out) {
    gguf_file *g = NULL;
    h3r_clear_error();
    int rc = gguf_open(path, &g);
    *out = g;
    return rc;
}

void h3r_test_gguf_close(void *g) { gguf_close(g); }

int h3r_test_gguf_n_tensors(const void *g) { return gguf_n_tensors(g); }

int h3r_test_gguf_tensor(const void *g, int i, const char **name, int *type, int *n_dims,
                         int64_t ne[4], const void **data, uint64_t *nbytes) {
    const h3r_tensor *t = gguf_tensor_at(g, i);
    if (!t) return h3r_seterr(H3R_ERR_INVALID, "tensor index %d out of range [0, %d)", i, gguf_n_tensors(g));
    *name = t->name;
    *type = t->type;
    *n_dims = t->n_dims;
    for (int d = 0; d < 4; d++) ne[d] = t->ne[d];
    *data = t->data;
    *nbytes = t->nbytes;
    return 0;
}

int h3r_test_gguf_find(const void *g, const char *name) {
    const h3r_tensor *t = gguf_find(g, name);
    if (!t) return -1;
    for (int i = 0; i < gguf_n_tensors(g); i++)
        if (gguf_tensor_at(g, i) == t) return i;
    return -1;
}

int h3r_test_gguf_get_tensor(const void *g, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                             int64_t ne3, int *index) {
    const h3r_tensor *t;
    int rc = gguf_get_tensor(g, name, ne0, ne1, ne2, ne3, &t);
    *index = rc ? -1 : h3r_test_gguf_find(g, name);
    return rc;
}

int h3r_test_gguf_has_key(const void *g, const char *key) { return gguf_has_key(g, key); }
int h3r_test_gguf_get_int(const void *g, const char *key, int64_t *out) { return gguf_get_int(g, key, out); }
int h3r_test_gguf_get_float(const void *g, const char *key, double *out) { return gguf_get_float(g, key, out); }
int h3r_test_gguf_get_bool(const void *g, const char *key, int *out) { return gguf_get_bool(g, key, out); }

int h3r_test_gguf_get_str(const void *g, const char *key, const char **out, uint64_t *len) {
    size_t n = 0;
    int rc = gguf_get_str(g, key, out, &n);
    *len = n;
    return rc;
}

int h3r_test_gguf_get_int_array(const void *g, const char *key, int64_t *out, int max, int *n) {
    return gguf_get_int_array(g, key, out, max, n);
}

int h3r_test_gguf_get_float_array(const void *g, const char *key, double *out, int max, int *n) {
    return gguf_get_float_array(g, key, out, max, n);
}

/* ---- thread pool */

typedef struct {
    int *calls;        /* (nth,) times each ith ran in this round */
    int nth_seen;      /* nth passed to fn (same for all) */
    int bad_nth;
} pool_probe;

static void pool_probe_fn(void *arg, int ith, int nth) {
    pool_probe *pp = arg;
    if (nth != pp->nth_seen || ith < 0 || ith >= nth) { pp->bad_nth = 1; return; }
    pp->calls[ith]++;  /* each ith is run by exactly one thread: no race */
}

int h3r_test_pool(int threads, int rounds) {
    h3r_pool *p = h3r_pool_create(threads);
    if (!p) return H3R_ERR_NOMEM;
    int n = h3r_pool_size(p), rc = 0;
    int *calls = calloc((size_t)n, sizeof(int));
    if (!calls) { h3r_pool_free(p); return h3r_seterr(H3R_ERR_NOMEM, "h3r_test_pool: out of memory"); }
    pool_probe pp = {calls, n, 0};
    for (int r = 0; r < rounds && rc == 0; r++) {
        h3r_pool_run(p, pool_probe_fn, &pp);
        for (int i = 0; i < n; i++)
            if (calls[i] != r + 1)
                rc = h3r_seterr(H3R_ERR_INTERNAL, "pool of %d: round %d: ith %d ran %d times in total, expected %d",
                                n, r, i, calls[i], r + 1);
        if (pp.bad_nth) rc = h3r_seterr(H3R_ERR_INTERNAL, "pool of %d: fn got a bad ith or nth", n);
    }
    free(calls);
    h3r_pool_free(p);
    return rc == 0 ? n : rc;
}

/* ---- ops */

int h3r_test_matmul(int threads, float *y, const float *x, const void *w, int wtype, const float *b,
                    int64_t N, int64_t K, int64_t M) {
    if (wtype != GGML_TYPE_F32 && wtype != GGML_TYPE_F16 && !quant_is_matmul_type(wtype))
        return h3r_seterr(H3R_ERR_INVALID, "h3r_test_matmul: wtype %d (allowed 0 f32, 1 f16, 2 q4_0, "
                          "8 q8_0, 14 q6_k)", wtype);
    h3r_tensor W = {"test.weight", wtype, 2, {K, M, 1, 1}, w, ggml_type_nbytes(wtype, K * M)};
    h3r_tensor B = {"test.bias", GGML_TYPE_F32, 1, {M, 1, 1, 1}, b, (size_t)M * 4};
    h3r_pool *p = h3r_pool_create(threads);
    if (!p) return H3R_ERR_NOMEM;
    int rc = op_matmul(p, y, x, &W, b ? &B : NULL, N);
    h3r_pool_free(p);
    return rc;
}

int h3r_test_attention(int threads, float *out, const float *q, const float *k, const float *v,
                       int64_t Nq, int64_t Nk, int H, int Dh, float scale, const float *bias) {
    h3r_pool *p = h3r_pool_create(threads);
    if (!p) return H3R_ERR_NOMEM;
    int rc = op_attention(p, out, q, k, v, Nq, Nk, H, Dh, scale, bias);
    h3r_pool_free(p);
    return rc;
}

int h3r_test_layernorm(float *x, int64_t N, int64_t D, const float *w, const float *b, float eps) {
    op_layernorm(x, N, D, w, b, eps);
    return 0;
}

int h3r_test_rmsnorm(float *x, int64_t N, int64_t D, const float *w, float eps) {
    op_rmsnorm(x, N, D, w, eps);
    return 0;
}

int h3r_test_activation(int which, float *x, int64_t n) {
    switch (which) {
    case 0: op_gelu_tanh(x, n); return 0;
    case 1: op_gelu_erf(x, n); return 0;
    case 2: op_silu(x, n); return 0;
    default: return h3r_seterr(H3R_ERR_INVALID, "h3r_test_activation: which=%d (allowed 0..2)", which);
    }
}

int h3r_test_gelu_tanh(float *x, int64_t n) { return h3r_test_activation(0, x, n); }

int h3r_test_f16_to_f32(const uint16_t *in, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = h3r_f16_to_f32(in[i]);
    return 0;
}

int h3r_test_f32_to_f16(const float *in, uint16_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = h3r_f32_to_f16(in[i]);
    return 0;
}

int h3r_test_force_ref(int on) {
    h3r_ops_force_ref = on != 0;
    return 0;
}

uint64_t h3r_test_type_nbytes(int type, int64_t n) { return ggml_type_nbytes(type, n); }

/* ---- quant blocks */

int h3r_test_dequantize(int type, const void *src, float *dst, int64_t n) {
    return dequantize_row(type, src, dst, n);
}

int h3r_test_quantize(int type, const float *x, void *dst, int64_t n) {
    if (n < 0 || n % 32)
        return h3r_seterr(H3R_ERR_INVALID, "h3r_test_quantize: n = %lld is not a multiple of 32", (long long)n);
    switch (type) {
    case GGML_TYPE_Q8_0: quantize_row_q8_0(x, dst, n); return 0;
    case GGML_TYPE_Q4_0: quantize_row_q4_0(x, dst, n); return 0;
    case 99: quantize_row_q8x(x, dst, n); return 0;
    default:
        return h3r_seterr(H3R_ERR_INVALID, "h3r_test_quantize: type %d (allowed 8 q8_0, 2 q4_0, 99 activations)", type);
    }
}

int h3r_test_vec_dot(int type, int ref, int64_t K, const void *w, const float *x, int nr, float *out) {
    if (!quant_is_matmul_type(type))
        return h3r_seterr(H3R_ERR_INVALID, "h3r_test_vec_dot: type %d (allowed 2 q4_0, 8 q8_0, 14 q6_k)", type);
    if (nr < 1 || nr > 4 || K <= 0 || K % quant_block_elems(type))
        return h3r_seterr(H3R_ERR_INVALID, "h3r_test_vec_dot: nr = %d (1..4) or K = %lld (multiple of %d)", nr,
                          (long long)K, quant_block_elems(type));
    int64_t nb = K / QK8X;
    blk_q8x *xq = malloc((size_t)nr * (size_t)nb * sizeof(blk_q8x));
    if (!xq) return h3r_seterr(H3R_ERR_NOMEM, "h3r_test_vec_dot: out of memory");
    const blk_q8x *xs[4];
    for (int r = 0; r < nr; r++) {
        quantize_row_q8x(x + r * K, xq + r * nb, K);
        xs[r] = xq + r * nb;
    }
    (ref ? vec_dot_ref : vec_dot)(type, nb, w, xs, nr, out);
    free(xq);
    return 0;
}

const char *h3r_test_simd_name(void) { return quant_simd_name(); }

typedef struct {
    const uint8_t *p;
    uint64_t n;
    uint64_t part[256];   /* per-thread xor, combined in ith order */
} read_ctx;

static void read_worker(void *arg, int ith, int nth) {
    read_ctx *c = arg;
    uint64_t words = c->n / 8, a = words * (uint64_t)ith / (uint64_t)nth, b = words * (uint64_t)(ith + 1) / (uint64_t)nth;
    const uint64_t *w = (const uint64_t *)c->p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, i = a;
    for (; i + 4 <= b; i += 4) { s0 ^= w[i]; s1 ^= w[i + 1]; s2 ^= w[i + 2]; s3 ^= w[i + 3]; }
    for (; i < b; i++) s0 ^= w[i];
    c->part[ith] = s0 ^ s1 ^ s2 ^ s3;
}

int h3r_test_read_bytes(int threads, const void *p, uint64_t n, uint64_t *sum) {
    if (threads < 1 || threads > 256)
        return h3r_seterr(H3R_ERR_INVALID, "h3r_test_read_bytes: threads = %d (allowed 1..256)", threads);
    h3r_pool *pool = h3r_pool_create(threads);
    if (!pool) return H3R_ERR_NOMEM;
    read_ctx c = {p, n, {0}};
    h3r_pool_run(pool, read_worker, &c);
    uint64_t s = 0;
    for (int i = 0; i < threads; i++) s ^= c.part[i];
    *sum = s;
    h3r_pool_free(pool);
    return 0;
}
