/*
 * Weak placeholders for component functions whose translation units have not
 * landed yet, so the shared library links and loads while the components are
 * built in parallel. A real definition (strong symbol) replaces each one.
 * Every placeholder fails with H3R_ERR_UNSUPPORTED. This file is deleted once
 * every component exists.
 */
#include "models.h"

#define PENDING(what) h3r_seterr(H3R_ERR_UNSUPPORTED, "%s is not built into this engine yet", what)
#define WEAK __attribute__((weak))

WEAK int wan_dit_load(const gguf_file *g, wan_dit **out) { *out = NULL; return PENDING("the Wan DiT"); }
WEAK void wan_dit_free(wan_dit *m) {}
WEAK int wan_dit_in_channels(const wan_dit *m) { return 0; }
WEAK int wan_dit_out_channels(const wan_dit *m) { return 0; }
WEAK int wan_dit_text_dim(const wan_dit *m) { return 0; }
WEAK void wan_dit_patch_size(const wan_dit *m, int patch[3]) { patch[0] = 1; patch[1] = patch[2] = 2; }
WEAK int wan_dit_forward(const wan_dit *m, h3r_pool *p, const float *x, int C, int T, int Y, int X,
                         float timestep, const float *context, int L, float *out, h3r_tap_fn tap,
                         void *tap_user) { return PENDING("the Wan DiT"); }

WEAK int umt5_load(const gguf_file *g, umt5 **out) { *out = NULL; return PENDING("UMT5"); }
WEAK void umt5_free(umt5 *m) {}
WEAK int umt5_d_model(const umt5 *m) { return 0; }
WEAK int umt5_vocab_size(const umt5 *m) { return 0; }
WEAK int umt5_encode(const umt5 *m, h3r_pool *p, const int32_t *ids, int n, float *out,
                     h3r_tap_fn tap, void *tap_user) { return PENDING("UMT5"); }

WEAK int wan_vae_load(const gguf_file *g, wan_vae **out) { *out = NULL; return PENDING("the Wan VAE"); }
WEAK void wan_vae_free(wan_vae *m) {}
WEAK int wan_vae_z_dim(const wan_vae *m) { return 0; }
WEAK const float *wan_vae_latents_mean(const wan_vae *m) { return 0; }
WEAK const float *wan_vae_latents_std(const wan_vae *m) { return 0; }
WEAK int wan_vae_decode(const wan_vae *m, h3r_pool *p, const float *z, int C, int T, int Y, int X,
                        float *out, int (*progress)(void *user, int done, int total), void *user,
                        h3r_tap_fn tap, void *tap_user) { return PENDING("the Wan VAE"); }

WEAK int sampler_create(int kind, int steps, float shift, int64_t n, h3r_sampler **out) { *out = 0; return PENDING("the sampler"); }
WEAK void sampler_free(h3r_sampler *s) {}
WEAK const float *sampler_sigmas(const h3r_sampler *s) { return 0; }
WEAK const float *sampler_timesteps(const h3r_sampler *s) { return 0; }
WEAK int sampler_step(h3r_sampler *s, int step_index, const float *v, float *x) { return PENDING("the sampler"); }
WEAK void h3r_randn(uint64_t seed, float *out, int64_t n) { for (int64_t i = 0; i < n; i++) out[i] = 0; }
WEAK int h3r_schedule(int sampler, int steps, float shift, float *sigmas, float *timesteps) { return PENDING("the sampler"); }

WEAK int op_matmul(h3r_pool *p, float *y, const float *x, const h3r_tensor *W, const h3r_tensor *b, int64_t N) { return PENDING("op_matmul"); }
WEAK void op_layernorm(float *x, int64_t N, int64_t D, const float *w, const float *b, float eps) {}
WEAK void op_rmsnorm(float *x, int64_t N, int64_t D, const float *w, float eps) {}
WEAK void op_silu(float *x, int64_t n) {}
WEAK void op_gelu_tanh(float *x, int64_t n) {}
WEAK void op_gelu_erf(float *x, int64_t n) {}
WEAK void op_add(float *y, const float *x, int64_t n) {}
WEAK void op_mul(float *y, const float *x, int64_t n) {}
WEAK int op_attention(h3r_pool *p, float *out, const float *q, const float *k, const float *v,
                      int64_t Nq, int64_t Nk, int H, int Dh, float scale, const float *bias) { return PENDING("op_attention"); }
WEAK int tensor_f32(const h3r_tensor *t, const float **out) { return PENDING("tensor_f32"); }
