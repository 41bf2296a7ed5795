/*
 * The three Wan 2.1 components of the CPU engine and the sampler, as engine.c
 * uses them. Each component is loaded from its own GGUF file (written by
 * h3render/engine/convert.py) whose tensors keep the diffusers names and whose
 * metadata holds every scalar of the component's diffusers config.json under
 * "h3r.<key>" (ints as int64, floats as float64, lists as arrays). Tensors of
 * 3 or more dims named "*.weight" are flattened to 2-D (dim0, rest) and their
 * original numpy shape is stored under "h3r.shape.<tensor name>".
 *
 * Every loader validates the config and the presence, type and shape of every
 * tensor it will touch, returning a negative code with a message naming the
 * file, tensor and problem; nothing is read later that was not checked here.
 * A loaded component holds const pointers into the mapping (weights) and is
 * immutable; scratch buffers are allocated per call and freed before return.
 */
#ifndef H3R_MODELS_H
#define H3R_MODELS_H

#include "internal.h"

/* ---------------------------------------------------------------- DiT
 * diffusers WanTransformer3DModel.  x (C, T, Y, X) -> out (C, T, Y, X).
 * context (L, text_dim) is the padded text encoder output. */
typedef struct wan_dit wan_dit;
int wan_dit_load(const gguf_file *g, wan_dit **out);
void wan_dit_free(wan_dit *m);
int wan_dit_in_channels(const wan_dit *m);
int wan_dit_out_channels(const wan_dit *m);
int wan_dit_text_dim(const wan_dit *m);
void wan_dit_patch_size(const wan_dit *m, int patch[3]);  /* (t, y, x) */
int wan_dit_forward(const wan_dit *m, h3r_pool *p, const float *x, int C, int T, int Y, int X,
                    float timestep, const float *context, int L, float *out,
                    h3r_tap_fn tap, void *tap_user);
/* 0, or H3R_ERR_INVALID naming the bad value: the shape checks of the forward. */
int wan_dit_check_shape(const wan_dit *m, int C, int T, int Y, int X, int L);
/* Floats of the forward's scratch block (-1 on overflow), and every byte one
 * forward allocates on nth threads: that block plus the largest op scratch. */
int64_t wan_dit_scratch_floats(const wan_dit *m, int T, int Y, int X, int L);
int64_t wan_dit_forward_bytes(const wan_dit *m, int T, int Y, int X, int L, int nth);

/* ---------------------------------------------------------------- UMT5
 * transformers UMT5EncoderModel.  ids (n,) -> out (n, d_model), final norm applied. */
typedef struct umt5 umt5;
int umt5_load(const gguf_file *g, umt5 **out);
void umt5_free(umt5 *m);
int umt5_d_model(const umt5 *m);
int umt5_vocab_size(const umt5 *m);
int umt5_encode(const umt5 *m, h3r_pool *p, const int32_t *ids, int n, float *out,
                h3r_tap_fn tap, void *tap_user);
/* 0, or H3R_ERR_INVALID: the token checks of umt5_encode. */
int umt5_check_ids(const umt5 *m, const int32_t *ids, int n);
/* Every byte one umt5_encode of n tokens allocates on nth threads. */
int64_t umt5_encode_bytes(const umt5 *m, int n, int nth);

/* ---------------------------------------------------------------- VAE
 * diffusers AutoencoderKLWan decoder path (post_quant_conv + decoder), with the
 * per-chunk causal cache diffusers uses: latent frame 0 first, then one latent
 * frame at a time.  z (C, T, Y, X), already de-normalised with latents_mean/std
 * -> video (3, 1 + 4*(T-1), 8*Y, 8*X), clamped to [-1, 1].
 * progress (may be NULL) is called after each latent frame; non-zero cancels. */
typedef struct wan_vae wan_vae;
int wan_vae_load(const gguf_file *g, wan_vae **out);
void wan_vae_free(wan_vae *m);
int wan_vae_z_dim(const wan_vae *m);
/* latents_mean / latents_std from the config, z_dim entries each. */
const float *wan_vae_latents_mean(const wan_vae *m);
const float *wan_vae_latents_std(const wan_vae *m);
int wan_vae_decode(const wan_vae *m, h3r_pool *p, const float *z, int C, int T, int Y, int X,
                   float *out, int (*progress)(void *user, int done, int total), void *user,
                   h3r_tap_fn tap, void *tap_user);
/* 0, or H3R_ERR_INVALID naming the bad value: the shape checks of the decode. */
int wan_vae_check_shape(const wan_vae *m, int C, int T, int Y, int X);
/* Every byte one decode of (T, Y, X) latents allocates on nth threads (with_tap:
 * with a tap set), the output video aside; -1 when even the count fails. */
int64_t wan_vae_decode_bytes(const wan_vae *m, int T, int Y, int X, int nth, int with_tap);

/* ---------------------------------------------------------------- sampler
 * Flow-matching samplers, exactly as diffusers' FlowMatchEulerDiscreteScheduler
 * and UniPCMultistepScheduler(prediction_type="flow_prediction",
 * use_flow_sigmas=True, flow_shift=shift), num_train_timesteps 1000.
 * The sampler owns its history buffers; n is the latent element count. */
typedef struct h3r_sampler h3r_sampler;
int sampler_create(int kind, int steps, float shift, int64_t n, h3r_sampler **out);
void sampler_free(h3r_sampler *s);
/* (n,) history buffers sampler_create allocates for `kind`, and every byte a
 * sampler of `steps` steps over n elements holds (struct, schedule, history). */
int sampler_history_buffers(int kind);
int64_t sampler_bytes(int kind, int steps, int64_t n);
const float *sampler_sigmas(const h3r_sampler *s);      /* (steps + 1,) */
const float *sampler_timesteps(const h3r_sampler *s);   /* (steps,) model timestep input */
/* Advance x (n,) in place by one step given the model's flow prediction v (n,). */
int sampler_step(h3r_sampler *s, int step_index, const float *v, float *x);

/* ---------------------------------------------------------------- RNG
 * The engine's documented noise source (docs/ENGINE.md): Philox4x32-10 keyed by
 * the 64-bit seed, counter = element index, Box-Muller on pairs.  Same seed,
 * same noise, on every machine and thread count. */
void h3r_randn(uint64_t seed, float *out, int64_t n);

#endif
