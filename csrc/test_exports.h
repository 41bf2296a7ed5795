/*
 * Test-only entry points into the engine's internals (GGUF reader, ops, half
 * floats), for the Python tests through ctypes.
 *
 * NOT part of the stable ABI: names, arguments and behaviour may change with
 * any commit. Production code (the binding, the worker) must not call them.
 * Every function returns 0 or a negative H3R_ERR_* code; the message is read
 * with h3r_last_error(NULL) on the same thread.
 */
#ifndef H3R_TEST_EXPORTS_H
#define H3R_TEST_EXPORTS_H

#include <stddef.h>
#include <stdint.h>
#include "h3render.h"

/* ---- GGUF reader */
/* Open, validate and close path. */
H3R_API int h3r_test_gguf_check(const char *path);
/* Keep a file open to inspect it; *out is an opaque handle. */
H3R_API int h3r_test_gguf_open(const char *path, void **out);
H3R_API void h3r_test_gguf_close(void *g);
H3R_API int h3r_test_gguf_n_tensors(const void *g);
/* Tensor i: name (NUL-terminated, owned by g), GGML type, n_dims, ne[4]
 * (GGML order), data pointer into the mapping and its byte size. */
H3R_API int h3r_test_gguf_tensor(const void *g, int i, const char **name, int *type, int *n_dims,
                                 int64_t ne[4], const void **data, uint64_t *nbytes);
/* Index of the tensor gguf_find returns, or -1. */
H3R_API int h3r_test_gguf_find(const void *g, const char *name);
/* gguf_get_tensor with its shape check (-1 = any dim); *index receives the index. */
H3R_API int h3r_test_gguf_get_tensor(const void *g, const char *name, int64_t ne0, int64_t ne1,
                                     int64_t ne2, int64_t ne3, int *index);
H3R_API int h3r_test_gguf_has_key(const void *g, const char *key);
H3R_API int h3r_test_gguf_get_int(const void *g, const char *key, int64_t *out);
H3R_API int h3r_test_gguf_get_float(const void *g, const char *key, double *out);
H3R_API int h3r_test_gguf_get_bool(const void *g, const char *key, int *out);
H3R_API int h3r_test_gguf_get_str(const void *g, const char *key, const char **out, uint64_t *len);
H3R_API int h3r_test_gguf_get_int_array(const void *g, const char *key, int64_t *out, int max, int *n);
H3R_API int h3r_test_gguf_get_float_array(const void *g, const char *key, double *out, int max, int *n);

/* ---- thread pool */
/* Create a pool of `threads`, run `rounds` jobs checking that every ith in
 * [0, nth) ran exactly once per job, free it. Returns the pool size, or < 0. */
H3R_API int h3r_test_pool(int threads, int rounds);

/* ---- ops; `threads` sizes a private pool for the call */
/* y (N, M) = x (N, K) @ W^T + b; w (M, K) raw data of GGML type wtype (0 f32, 1 f16,
 * 2 q4_0, 8 q8_0, 14 q6_k; rows of K elements); b (M,) or NULL. */
H3R_API int h3r_test_matmul(int threads, float *y, const float *x, const void *w, int wtype,
                            const float *b, int64_t N, int64_t K, int64_t M);
/* out (Nq, H*Dh) = attention(q (Nq, H*Dh), k, v (Nk, H*Dh)), bias NULL or (H, Nq, Nk). */
H3R_API int h3r_test_attention(int threads, float *out, const float *q, const float *k, const float *v,
                               int64_t Nq, int64_t Nk, int H, int Dh, float scale, const float *bias);
/* In place over x (N, D); w, b may be NULL. */
H3R_API int h3r_test_layernorm(float *x, int64_t N, int64_t D, const float *w, const float *b, float eps);
H3R_API int h3r_test_rmsnorm(float *x, int64_t N, int64_t D, const float *w, float eps);
/* In place over x (n,); which: 0 gelu_tanh, 1 gelu_erf, 2 silu. */
H3R_API int h3r_test_activation(int which, float *x, int64_t n);
H3R_API int h3r_test_gelu_tanh(float *x, int64_t n);
/* Half floats: bits (n,) <-> floats (n,). */
H3R_API int h3r_test_f16_to_f32(const uint16_t *in, float *out, int64_t n);
H3R_API int h3r_test_f32_to_f16(const float *in, uint16_t *out, int64_t n);
/* on != 0: ops use only their scalar _ref kernels (to compare with SIMD). */
H3R_API int h3r_test_force_ref(int on);

/* Internal hook behind h3r_test_force_ref, defined in ops.c (not exported). */
extern int h3r_ops_force_ref;

/* ---- quant blocks and dot kernels (quant.h) */
/* n elements of GGML type `type` -> dst (n,) f32. */
H3R_API int h3r_test_dequantize(int type, const void *src, float *dst, int64_t n);
/* x (n,) -> blocks of type 8 (q8_0), 2 (q4_0) or 99 (the activation blocks, 36 bytes). */
H3R_API int h3r_test_quantize(int type, const float *x, void *dst, int64_t n);
/* One weight row w (K elements of `type`) . nr activation rows x (nr, K) f32,
 * quantized to activation blocks first -> out (nr,). ref != 0: scalar reference. */
H3R_API int h3r_test_vec_dot(int type, int ref, int64_t K, const void *w, const float *x, int nr, float *out);
/* Bench: read n bytes at p with `threads` threads (contiguous chunks, 64-bit
 * loads), the plain-read baseline a GEMV's weight streaming is compared with.
 * *sum receives the xor of all words, so the reads cannot be optimized away. */
H3R_API int h3r_test_read_bytes(int threads, const void *p, uint64_t n, uint64_t *sum);
/* "avx2", "neon-dotprod", "neon" or "scalar". */
H3R_API const char *h3r_test_simd_name(void);

/* Bytes of n elements of a GGML type (0: unknown type or partial block). */
H3R_API uint64_t h3r_test_type_nbytes(int type, int64_t n);

#endif
