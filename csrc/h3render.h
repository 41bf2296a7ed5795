/*
 * h3render engine ABI, version 2 (2 added h3r_estimate_json).
 *
 * One small, stable C interface that the Python binding (h3render/engine/binding.py)
 * loads through ctypes. Two implementations exist: the portable CPU engine
 * (GGUF weights, Wan 2.1 architecture) and the bridge to antirez's h3.c on macOS.
 *
 * Rules every implementation keeps:
 *   - no exit(), abort() or printing to stdout; every failure returns a negative
 *     H3R_ERR_* code and leaves a message for h3r_last_error();
 *   - every pointer argument is borrowed for the duration of the call only;
 *   - callbacks run on the calling thread; a non-zero return cancels generation,
 *     which then returns H3R_ERR_CANCELED.
 *
 * Engine information is returned as a JSON object (h3r_info_json) so that new
 * fields never break an old binding. Requests are a C struct whose first field is
 * its own size, so a newer library can accept an older, shorter struct.
 */
#ifndef H3RENDER_H
#define H3RENDER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define H3R_API __declspec(dllexport)
#else
#define H3R_API __attribute__((visibility("default")))
#endif

#define H3R_ABI_VERSION 2

/* Return codes. 0 is success. */
enum {
    H3R_OK = 0,
    H3R_ERR_IO = -1,          /* file missing or unreadable */
    H3R_ERR_FORMAT = -2,      /* model file malformed, truncated or inconsistent */
    H3R_ERR_INVALID = -3,     /* bad request argument (size, frames, quant, ...) */
    H3R_ERR_NOMEM = -4,       /* allocation failed */
    H3R_ERR_CANCELED = -5,    /* a callback returned non-zero */
    H3R_ERR_NUMERIC = -6,     /* NaN or Inf appeared in the latents */
    H3R_ERR_UNSUPPORTED = -7, /* feature or quant level not available */
    H3R_ERR_INTERNAL = -8,    /* engine bug or test-only crash trigger */
};

/* Phases reported to the progress callback. */
enum {
    H3R_PHASE_LOAD = 0,      /* mapping weights, prewarm */
    H3R_PHASE_ENCODE = 1,    /* text encoder */
    H3R_PHASE_DENOISE = 2,   /* one tick per sampler step */
    H3R_PHASE_DECODE = 3,    /* VAE decode, one tick per latent frame */
};

/* Samplers. */
enum {
    H3R_SAMPLER_UNIPC = 0,   /* diffusers UniPCMultistepScheduler, flow_prediction, bh2, order 2 */
    H3R_SAMPLER_EULER = 1,   /* diffusers FlowMatchEulerDiscreteScheduler */
};

/* Frame kinds passed to the frame callback. */
enum {
    H3R_FRAME_FINAL = 0,     /* decoded output frame `index` of the video */
    H3R_FRAME_PREVIEW = 1,   /* a cheap preview after denoising step `index` */
};

typedef struct h3r_engine h3r_engine;

/* Return non-zero to cancel. */
typedef int (*h3r_progress_fn)(void *user, int phase, int done, int total);
/* rgb: height*width*3 bytes, row-major, valid only during the call. */
typedef int (*h3r_frame_fn)(void *user, int kind, int index, int width, int height,
                            const uint8_t *rgb);

typedef struct h3r_request {
    uint32_t struct_size;          /* sizeof(h3r_request) as the caller knows it */
    const char *prompt;            /* raw text (engines whose info says prompt=text) */
    const char *negative_prompt;   /* raw text, may be NULL */
    const int32_t *prompt_ids;     /* token ids (engines whose info says prompt=token_ids) */
    int32_t n_prompt_ids;
    const int32_t *negative_ids;   /* may be NULL when guidance <= 1 */
    int32_t n_negative_ids;
    uint64_t seed;
    int32_t width, height, frames, steps;
    float guidance;                /* classifier-free guidance; <= 1 disables the negative pass */
    float shift;                   /* flow shift of the sigma schedule */
    int32_t sampler;               /* H3R_SAMPLER_* */
    const char *quant;             /* quant level of the DiT file: "f32", "f16", ... */
    int32_t threads;               /* 0: the count given to h3r_open */
    const float *init_latents;     /* optional (C, T', H', W') initial noise, else from seed */
    int64_t n_init_latents;        /* element count of init_latents */
    float *out_latents;            /* optional: receives the final latents (C, T', H', W') */
    int64_t n_out_latents;
    int32_t preview_every;         /* 0: no previews; n: a preview every n steps */
    const char *options;           /* engine-specific "key=value;key=value", may be NULL */
    h3r_progress_fn on_progress;   /* may be NULL */
    h3r_frame_fn on_frame;         /* may be NULL; receives every output frame */
    void *user;                    /* passed to both callbacks */
} h3r_request;

/* ABI version the library was built with (H3R_ABI_VERSION). */
H3R_API int h3r_abi_version(void);

/* Open a model directory. On success *out is a new engine and 0 is returned;
 * on failure *out is NULL, a negative code is returned and h3r_last_error(NULL)
 * says why, naming the file. threads <= 0 means one per online CPU. */
H3R_API int h3r_open(const char *model_dir, int threads, h3r_engine **out);
H3R_API void h3r_close(h3r_engine *e);

/* Message of the last failure on this engine, or of this thread when e is NULL.
 * Never NULL; empty when there was no failure. Valid until the next call. */
H3R_API const char *h3r_last_error(const h3r_engine *e);

/* JSON object describing engine and model, owned by the engine:
 * {"engine","engine_version","abi","model","quant_levels":[...],
 *  "frame_rule":{"multiple":4,"offset":1},"size_multiple":16,"max_pixels":0,
 *  "fps":16,"weight_bytes":{quant: bytes},"prompt":"token_ids"|"text",
 *  "text_len":N,"latent_channels":C,"vae_stride":[4,8,8],"patch_size":[1,2,2],
 *  "defaults":{...}} */
H3R_API const char *h3r_info_json(h3r_engine *e);

/* Render one video. Frames arrive through req->on_frame. */
H3R_API int h3r_generate(h3r_engine *e, const h3r_request *req);

/* Peak memory of the render req describes, without rendering it. The request is
 * checked exactly as h3r_generate checks it (a request generate refuses gets the
 * same code and message here); nothing that scales with it is allocated. On
 * success *out is a JSON object owned by the engine, valid until the next
 * h3r_estimate_json or h3r_close on it; all sizes are bytes:
 *   {"weights","encode","denoise","decode","total","threads","tokens",
 *    "latent":[C,T',H',W'],
 *    "files":{"transformer"|"text_encoder"|"vae":{"file","bytes","read"}},
 *    "parts":{"buffers","text_encoder","sampler","dit_forward","preview",
 *             "video","vae_decode"}}
 * weights: the pages of the mapped files the render reads (headers and every
 * tensor the components use; files.*.bytes are the whole files). encode,
 * denoise, decode: the peak of the buffers the engine allocates in that phase.
 * total = weights + max(encode, denoise, decode): the engine's own peak, with
 * no allowance for the calling process. Engines that cannot estimate return
 * H3R_ERR_UNSUPPORTED. */
H3R_API int h3r_estimate_json(h3r_engine *e, const h3r_request *req, const char **out);

/* ---- Component entry points: verify mode and numerics tests. ---- */

/* Called with the output of each named stage ("dit.patch_embed", "dit.block.3",
 * "umt5.block.0", "vae.up.1", ...). Pass fn=NULL to remove. */
typedef void (*h3r_tap_fn)(void *user, const char *name, const float *data, int64_t n);
H3R_API void h3r_set_tap(h3r_engine *e, h3r_tap_fn fn, void *user);

/* quant selects the component file for the component entry points below:
 * "f32" or "f16" (the file text_encoder-<quant>.gguf / vae-<quant>.gguf), or NULL
 * for the most precise file present. */

/* ids (n,) -> out (text_len, text_dim); rows past n are zero, as Wan's pipeline pads. */
H3R_API int h3r_encode_text(h3r_engine *e, const char *quant, const int32_t *ids, int n,
                            float *out, int64_t n_out);

/* One DiT forward.  x (C, T', H', W'), timestep scalar, context (text_len, text_dim)
 * -> out (C, T', H', W') flow prediction. */
H3R_API int h3r_dit_forward(h3r_engine *e, const char *quant, const float *x, int c, int t,
                            int h, int w, float timestep, const float *context, int n_ctx,
                            float *out);

/* VAE decode of de-normalised latents z (C, T', H', W') -> video (3, F, H, W) in [-1, 1],
 * F = 1 + 4*(T'-1), H = 8*H', W = 8*W'. */
H3R_API int h3r_vae_decode(h3r_engine *e, const char *quant, const float *z, int c, int t,
                           int h, int w, float *out, int64_t n_out);

/* Sigma schedule as the sampler uses it: sigmas (steps+1,), timesteps (steps,). */
H3R_API int h3r_schedule(int sampler, int steps, float shift, float *sigmas, float *timesteps);

#ifdef __cplusplus
}
#endif
#endif
