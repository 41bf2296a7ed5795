/*
 * Internal interfaces shared by the CPU engine's translation units.
 * Nothing here is exported from the shared library; tests reach internals
 * through the h3r_test_* entry points in test_exports.h (not a stable ABI).
 *
 * Dimension letters used in shape comments across csrc/:
 *   N tokens (rows of activations)   D model dim        F FFN hidden dim
 *   H heads   Dh head dim            L text length      C channels
 *   T latent frames  Y latent height  X latent width   K input dim of a matmul
 * Activations are float32, row-major, (rows, cols) with cols contiguous.
 */
#ifndef H3R_INTERNAL_H
#define H3R_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>
#include "h3render.h"

/* ---------------------------------------------------------------- errors
 * Every failing internal function calls h3r_seterr() and returns a negative
 * H3R_ERR_* code. The message lives in thread-local storage; API entry points
 * copy it into the engine so h3r_last_error(e) survives later calls. */
int h3r_seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *h3r_tls_error(void);
void h3r_clear_error(void);

/* ---------------------------------------------------------------- tensors
 * GGML type numbers, so GGUF files are readable by gguf-py and ggml tools. */
enum {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_COUNT = 40,
};

/* A read-only view of one tensor inside a mapped GGUF file.
 * ne[] is in GGML order: ne[0] is the contiguous (innermost) dimension, so a
 * numpy array of shape (out, in) has ne = {in, out}. */
typedef struct {
    const char *name;
    int type;              /* GGML_TYPE_* */
    int n_dims;            /* 1..4 */
    int64_t ne[4];         /* unused dims are 1 */
    const void *data;      /* points into the read-only mapping */
    size_t nbytes;
} h3r_tensor;

/* Bytes for n elements of a type, or 0 if the type is unknown or n is not a
 * multiple of the type's block size. */
size_t ggml_type_nbytes(int type, int64_t n);
const char *ggml_type_name(int type);

/* float16 <-> float32, IEEE half, round to nearest even. */
float h3r_f16_to_f32(uint16_t h);
uint16_t h3r_f32_to_f16(float f);

/* ---------------------------------------------------------------- GGUF
 * gguf_open maps the file read-only and validates every count, string length,
 * dimension and offset against the file size before anything is used.
 * On failure it returns a negative code with a message naming the file. */
typedef struct gguf_file gguf_file;

int gguf_open(const char *path, gguf_file **out);
void gguf_close(gguf_file *g);
const char *gguf_path(const gguf_file *g);
size_t gguf_mapped_bytes(const gguf_file *g);

int gguf_n_tensors(const gguf_file *g);
const h3r_tensor *gguf_tensor_at(const gguf_file *g, int i);
/* NULL if absent (no error is set). A tensor found counts as bound. */
const h3r_tensor *gguf_find(const gguf_file *g, const char *name);
/* Bytes of the header plus every bound tensor: what a render maps in. */
size_t gguf_bound_bytes(const gguf_file *g);
/* Like gguf_find, but fails with a message naming file and tensor when the
 * tensor is missing, has another number of elements than expected (pass -1
 * for "any" per dim, dims in GGML order), or has a type not allowed. */
int gguf_get_tensor(const gguf_file *g, const char *name, int64_t ne0, int64_t ne1,
                    int64_t ne2, int64_t ne3, const h3r_tensor **out);

/* Metadata. Each returns 0 on success; a negative code with a message naming
 * the file and key if the key is missing or has an incompatible type.
 * Integer getters accept any integer GGUF type that fits. */
int gguf_get_int(const gguf_file *g, const char *key, int64_t *out);
int gguf_get_float(const gguf_file *g, const char *key, double *out);
int gguf_get_bool(const gguf_file *g, const char *key, int *out);
int gguf_get_str(const gguf_file *g, const char *key, const char **out, size_t *len);
/* Integer array: up to max elements into out, count into *n. */
int gguf_get_int_array(const gguf_file *g, const char *key, int64_t *out, int max, int *n);
int gguf_get_float_array(const gguf_file *g, const char *key, double *out, int max, int *n);
int gguf_has_key(const gguf_file *g, const char *key);

/* ---------------------------------------------------------------- threads
 * A fixed pool. h3r_pool_run calls fn(ctx, ith, nth) once for every ith in
 * [0, nth) and returns when all calls are done; the calling thread takes
 * ith 0. Work split by ith must not depend on timing, so results are the
 * same for every thread count. */
typedef struct h3r_pool h3r_pool;
h3r_pool *h3r_pool_create(int n_threads); /* NULL + error on failure */
int h3r_pool_threads(int n_threads);      /* the size h3r_pool_create(n_threads) would have */
void h3r_pool_free(h3r_pool *p);
int h3r_pool_size(const h3r_pool *p);
void h3r_pool_run(h3r_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* ---------------------------------------------------------------- ops
 * All ops are deterministic and independent of the thread count: each output
 * element is reduced by one thread in a fixed order. */

/* y (N, M) = x (N, K) @ W^T + b.  W is a GGUF tensor with ne = {K, M} of any
 * supported type; b is NULL or an F32 tensor of M elements. */
int op_matmul(h3r_pool *p, float *y, const float *x, const h3r_tensor *W,
              const h3r_tensor *b, int64_t N);

/* Bytes op_matmul allocates, and frees before it returns, for N rows against a
 * weight of `type` with K inputs on a pool of nth threads: the quantized
 * activations of the integer path, or the per-thread weight-row copies of the
 * float path. op_matmul sizes its allocation with it; so does the memory
 * estimate (engine.c). */
int64_t op_matmul_scratch_bytes(int type, int64_t K, int64_t N, int nth);

/* In place over rows of x (N, D).  w, b may be NULL (no affine). */
void op_layernorm(float *x, int64_t N, int64_t D, const float *w, const float *b, float eps);
/* T5/Wan RMSNorm: x * rsqrt(mean(x^2) + eps) * w.  w may be NULL. */
void op_rmsnorm(float *x, int64_t N, int64_t D, const float *w, float eps);

void op_silu(float *x, int64_t n);
void op_gelu_tanh(float *x, int64_t n);   /* gelu(approximate="tanh") */
void op_gelu_erf(float *x, int64_t n);    /* exact gelu */
void op_add(float *y, const float *x, int64_t n);       /* y += x */
void op_mul(float *y, const float *x, int64_t n);       /* y *= x */

/* Multi-head attention.
 *   q (Nq, H*Dh), k (Nk, H*Dh), v (Nk, H*Dh) -> out (Nq, H*Dh)
 *   softmax(scale * q k^T + bias) v per head. bias is NULL or (H, Nq, Nk).
 * Memory use is O(Nq*H*Dh + tile), never Nq*Nk, when bias is NULL. */
int op_attention(h3r_pool *p, float *out, const float *q, const float *k, const float *v,
                 int64_t Nq, int64_t Nk, int H, int Dh, float scale, const float *bias);

/* Bytes op_attention allocates (per-thread tiles) for head dim Dh on nth threads. */
int64_t op_attention_scratch_bytes(int Dh, int nth);

/* Read an F32 tensor's data, or fail naming the tensor if it is not F32. */
int tensor_f32(const h3r_tensor *t, const float **out);

#endif
