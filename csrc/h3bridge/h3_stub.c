/*
 * h3_stub.c: a stand-in for libh3.a, for testing the bridge without Metal.
 *
 * Written for h3render's tests (tests/test_h3_bridge.py); it contains no h3.c
 * code. It implements the public functions of h3.h with scripted behaviour,
 * compiled against the user's real h3.h (H3_HEADER_DIR), so the bridge is
 * linked and driven through the Python binding exactly as on a Mac:
 *
 *   h3_load_dir   needs <dir>/FL2VA/transformer/config.json, like h3.c;
 *   h3_generate   needs ./h3_shaders.metal in the working directory (h3.c
 *                 compiles its shaders from that relative path), writes the
 *                 h3_params it received as JSON to $H3STUB_PARAMS_OUT,
 *                 reports progress with h3.c's phase names, delivers one
 *                 preview per step when preview_denoise is set (rows padded
 *                 to a wider stride, as a real producer may), then every
 *                 frame; a non-zero callback return cancels, as in h3.c.
 *   $H3STUB_FAIL  makes h3_generate fail with that message.
 *   $H3STUB_METAL4=0 reports a GPU without Metal 4.
 *
 * Frame pixels: rgb[y][x][c] = (17*frame + 3*y + 5*x + c) & 255 (previews use
 * 200 + step in place of frame), so the test can check every byte.
 * Never built into the shipped library (cmake/h3bridge.cmake ignores it).
 */
#define _XOPEN_SOURCE 700
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "h3.h"

struct h3_ctx {
    char dir[4096];
    char error[512];
    h3_device_info device;
    h3_model_info model;
};

static char global_error[512];

static void set_error(h3_ctx *ctx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx ? ctx->error : global_error, 512, fmt, ap);
    va_end(ap);
}

h3_ctx *h3_load_dir(const char *model_dir) {
    global_error[0] = '\0';
    char path[4200];
    struct stat st;
    snprintf(path, sizeof(path), "%s/FL2VA/transformer/config.json", model_dir ? model_dir : "");
    if (!model_dir || stat(path, &st) != 0) {
        set_error(NULL, "missing required model file: %s", path);
        return NULL;
    }
    h3_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) return NULL;
    snprintf(ctx->dir, sizeof(ctx->dir), "%s", model_dir);
    snprintf(ctx->device.name, sizeof(ctx->device.name), "Stub \"GPU\"");
    snprintf(ctx->device.architecture, sizeof(ctx->device.architecture), "stub");
    ctx->device.physical_memory = 128ull << 30;
    ctx->device.recommended_working_set = 100ull << 30;
    ctx->device.max_buffer_length = 64ull << 30;
    ctx->device.apple_gpu_family = 10;
    const char *m4 = getenv("H3STUB_METAL4");
    ctx->device.metal4 = !(m4 && !strcmp(m4, "0"));
    ctx->device.unified_memory = 1;
    ctx->model.fl2va_transformer.bytes = 1000;
    ctx->model.fl2va_transformer.tensor_bytes = 900;
    ctx->model.fl2va_transformer.files = 2;
    ctx->model.fl2va_transformer.tensors = 7;
    ctx->model.text_encoder.bytes = 300;
    ctx->model.text_encoder.tensor_bytes = 280;
    ctx->model.text_encoder.files = 1;
    ctx->model.text_encoder.tensors = 3;
    return ctx;
}

void h3_free(h3_ctx *ctx) { free(ctx); }

const char *h3_last_error(const h3_ctx *ctx) { return ctx ? ctx->error : global_error; }
const h3_device_info *h3_device(const h3_ctx *ctx) { return ctx ? &ctx->device : NULL; }
const h3_model_info *h3_model(const h3_ctx *ctx) { return ctx ? &ctx->model : NULL; }

static int align_frames(int n) {
    int v = n < 5 ? 5 : n;
    int r = (v - 5) % 17;
    return r ? v + 17 - r : v;
}

static void dump_params(const char *prompt, const h3_params *p) {
    const char *out = getenv("H3STUB_PARAMS_OUT");
    if (!out) return;
    FILE *f = fopen(out, "w");
    if (!f) return;
    char cwd[4096];
    if (!getcwd(cwd, sizeof(cwd))) cwd[0] = '\0';
    fprintf(f,
            "{\"prompt\":\"%s\",\"cwd\":\"%s\",\"width\":%d,\"height\":%d,\"frames\":%d,\"steps\":%d,"
            "\"seed\":%llu,\"output_path\":\"%s\",\"denoise_reuse\":%d,\"dit_layers\":%d,\"core_reuse\":%d,"
            "\"token_reduction\":%d,\"use_int8_row_fc2\":%d,\"ssd_streaming\":%d,\"render_width\":%d,"
            "\"render_height\":%d,\"use_slower_bf16_mlp\":%d,\"use_slower_bf16_qkv\":%d,"
            "\"use_slower_bf16_attention_output\":%d,\"preview_denoise\":%d,"
            "\"use_reference_rope\":%d,\"use_slower_grouped_quantizer\":%d}",
            prompt, cwd, p->width, p->height, p->frames, p->steps, (unsigned long long)p->seed,
            p->output_path ? p->output_path : "", p->denoise_reuse, p->dit_layers, p->core_reuse,
            p->token_reduction, p->use_int8_row_fc2, p->ssd_streaming, p->render_width, p->render_height,
            p->use_slower_bf16_mlp, p->use_slower_bf16_qkv, p->use_slower_bf16_attention_output,
            p->preview_denoise, p->use_reference_rope, p->use_slower_grouped_quantizer);
    fclose(f);
}

static int progress(h3_ctx *ctx, const h3_params *p, const char *phase, int done, int total) {
    if (p->on_progress && p->on_progress(phase, done, total, p->callback_opaque)) {
        set_error(ctx, "generation cancelled during %s", phase);
        return 1;
    }
    return 0;
}

/* Fill one frame (stride bytes per row) with the documented pattern. */
static void fill(uint8_t *rgb, int w, int h, int stride, int tag) {
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) rgb[(size_t)y * stride + 3 * x + c] = (uint8_t)((17 * tag + 3 * y + 5 * x + c) & 255);
}

h3_result *h3_generate(h3_ctx *ctx, const char *prompt, const h3_params *p) {
    dump_params(prompt, p);
    if (access("h3_shaders.metal", R_OK) != 0) {
        set_error(ctx, "cannot read Metal shader source h3_shaders.metal");
        return NULL;
    }
    const char *fail = getenv("H3STUB_FAIL");
    if (fail) {
        set_error(ctx, "%s", fail);
        return NULL;
    }
    int frames = align_frames(p->frames), w = p->width, h = p->height;
    if (progress(ctx, p, "tokenizer", 1, 1) || progress(ctx, p, "text encoder", 50, 50) ||
        progress(ctx, p, "load transformer core", 1, 1))
        return NULL;
    int stride = w * 3 + 16;
    uint8_t *buf = malloc((size_t)stride * h * (frames > 1 ? frames : 1));
    if (!buf) return NULL;
    for (int s = 0; s < p->steps; s++) {
        if (progress(ctx, p, "denoise", s + 1, p->steps)) goto fail;
        if (p->preview_denoise && p->on_frame) {
            fill(buf, w, h, stride, 200 + s);
            h3_frame fr = {w, h, stride, buf, frames / 2, frames, s, p->steps};
            if (p->on_frame(&fr, p->callback_opaque)) {
                set_error(ctx, "generation cancelled during denoising preview %d", s + 1);
                goto fail;
            }
        }
    }
    if (progress(ctx, p, "audio VAE", 7, 7) || progress(ctx, p, "video VAE load", 36, 36)) goto fail;
    for (int f = 0; f < frames; f++) {
        uint8_t *rgb = buf + (size_t)f * w * 3 * h;
        fill(rgb, w, h, w * 3, f);
        h3_frame fr = {w, h, w * 3, rgb, f, frames, -1, 0};
        if (p->on_frame && p->on_frame(&fr, p->callback_opaque)) {
            set_error(ctx, "generation cancelled while delivering frame %d", f);
            goto fail;
        }
    }
    free(buf);
    h3_result *r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->width = w;
    r->height = h;
    r->frames = frames;
    r->fps = 24;
    r->sample_rate = 32000;
    r->seed = p->seed;
    return r;
fail:
    free(buf);
    return NULL;
}

void h3_result_free(h3_result *result) { free(result); }

void h3_cache_set_enabled(h3_ctx *ctx, int enabled) { (void)ctx, (void)enabled; }
void h3_cache_clear(h3_ctx *ctx) { (void)ctx; }
void h3_cache_get_info(const h3_ctx *ctx, h3_cache_info *info) {
    (void)ctx;
    if (info) memset(info, 0, sizeof(*info));
}
