/*
 * h3bridge.c: the h3render engine ABI (csrc/h3render.h) on top of antirez's
 * h3.c (MiniMax-H3 on Metal), using only h3.c's public header h3.h.
 *
 * This file is compiled only by cmake/h3bridge.cmake, on macOS, when the build
 * is pointed at the user's h3.c checkout (H3_SOURCE_DIR). It lives in a
 * subdirectory so the CPU engine's glob of csrc/<name>.c never sees it. It contains no
 * h3.c code: it includes h3.h and links the libh3.a the user built.
 *
 * Mapping, one request at a time:
 *
 *   h3r_request                          h3_params (from H3_PARAMS_DEFAULT)
 *   -----------------------------------  -----------------------------------
 *   prompt (text)                        h3_generate(ctx, prompt, &params)
 *   width, height, frames, steps, seed   .width .height .frames .steps .seed
 *   quant "bf16"                         .use_slower_bf16_mlp/_qkv/
 *                                        _attention_output = 1
 *   quant "int8" (default)               (engine defaults)
 *   quant "int8-row"                     .use_int8_row_fc2 = 1
 *   preview_every > 0                    .preview_denoise = 1
 *   options "key=value;..."              .denoise_reuse .dit_layers
 *                                        .core_reuse .token_reduction
 *                                        .render_width .render_height
 *                                        .ssd_streaming .preview_denoise
 *                                        .output_path (absolute; h3.c then
 *                                        writes the mp4 with audio itself)
 *   on_progress(user, phase, done, tot)  .on_progress(phase text, ...)
 *   on_frame(user, kind, index, ...)     .on_frame(h3_frame *, ...)
 *
 * h3_params is filled by field name starting from H3_PARAMS_DEFAULT, so
 * fields that h3.c adds later keep their defaults. Python never sees it.
 *
 * Working directory: h3.c compiles its Metal shaders from the relative path
 * "h3_shaders.metal". When that file is not in the current directory, the
 * bridge finds it in $H3RENDER_H3_DIR or in the checkout the library was built
 * against (H3R_H3_SOURCE_DIR), switches to that directory only while h3.c code
 * runs, and switches back around every callback and before returning, so the
 * caller never observes a different working directory. Paths handed to h3.c
 * (model directory, output path) are absolute for that reason.
 *
 * Lifetimes: h3r_engine owns the h3_ctx (metadata and Metal device; weights
 * stay unmapped until a render), the absolute model path, the info JSON and
 * the last error. Everything a render allocates is freed before
 * h3r_generate returns.
 */
#define _DARWIN_C_SOURCE
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "h3render.h"
#include "h3.h"

#define BRIDGE_NAME "h3.c"
#define BRIDGE_VERSION "h3bridge-1"
#define ERR_MAX 1024            /* bytes of an error message, with NUL */
#define OPT_ITEM_MAX 512        /* bytes of one "key=value" option */
#define SHADER_FILE "h3_shaders.metal"

/* h3.c's documented limits (README "Pick resolution and duration"). */
#define H3B_SIZE_MULTIPLE 32            /* pixels */
#define H3B_MAX_PIXELS (768 * 1344)     /* width * height */
#define H3B_FPS 24
#define H3B_FRAME_MULTIPLE 17           /* frames are 5 + 17n ... */
#define H3B_FRAME_OFFSET 5
#define H3B_MIN_FRAMES 22               /* ... with n >= 1 (one decoder chunk) */
#define H3B_MAX_FRAMES 362
#define H3B_MIN_STEPS 2
#define H3B_MAX_STEPS 1000
#define H3B_MIN_DIT_LAYERS 35
#define H3B_MAX_DIT_LAYERS 50

struct h3r_engine {
    h3_ctx *ctx;
    char *model_dir;         /* absolute */
    char *shader_dir;        /* where h3_shaders.metal is, or NULL: the cwd has it */
    char *info_json;
    char err[ERR_MAX];
};

static _Thread_local char tls_err[ERR_MAX];

/* ---------------------------------------------------------------- errors */

/* Format a message into this thread's buffer (and the engine's, when e is
 * not NULL) and return `code`, so callers can `return seterr(e, CODE, ...)`. */
static int seterr(h3r_engine *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int seterr(h3r_engine *e, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_err, sizeof(tls_err), fmt, ap);
    va_end(ap);
    if (e) snprintf(e->err, sizeof(e->err), "%s", tls_err);
    return code;
}

/* Our error code for an h3.c failure message. h3.c reports failures as text
 * only, so the class is read from the wording of its messages. */
static int classify_h3_error(const char *msg) {
    if (!msg) return H3R_ERR_INTERNAL;
    if (strstr(msg, "cancelled")) return H3R_ERR_CANCELED;
    if (strstr(msg, "out of memory")) return H3R_ERR_NOMEM;
    if (strstr(msg, "missing required") || strstr(msg, "No such file") || strstr(msg, "no safetensors"))
        return H3R_ERR_IO;
    if (strstr(msg, "Metal") || strstr(msg, "requires an M5") || strstr(msg, "requires the Ref2VA"))
        return H3R_ERR_UNSUPPORTED;
    if (strstr(msg, "must") || strstr(msg, "cannot be combined") || strstr(msg, "requires") ||
        strstr(msg, "exceeds"))
        return H3R_ERR_INVALID;
    if (strstr(msg, "safetensors") || strstr(msg, "header") || strstr(msg, "tensor")) return H3R_ERR_FORMAT;
    return H3R_ERR_INTERNAL;
}

/* ---------------------------------------------------------------- cwd guard */

/*
 * While h3.c runs, the working directory must hold h3_shaders.metal.
 * cwd_enter() switches to e->shader_dir (when set) and remembers the caller's
 * directory in *saved; cwd_leave() switches back. Both return 0 or a negative
 * H3R_ERR_*. With shader_dir NULL they do nothing and *saved stays -1.
 */
static int cwd_enter(h3r_engine *e, int *saved) {
    *saved = -1;
    if (!e->shader_dir) return 0;
    int fd = open(".", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return seterr(e, H3R_ERR_IO, "h3bridge: cannot open the working directory: %s", strerror(errno));
    if (chdir(e->shader_dir) != 0) {
        int err = errno;
        close(fd);
        return seterr(e, H3R_ERR_IO, "h3bridge: cannot enter the h3.c directory %s: %s", e->shader_dir,
                      strerror(err));
    }
    *saved = fd;
    return 0;
}

static int cwd_leave(h3r_engine *e, int *saved) {
    if (*saved < 0) return 0;
    int rc = fchdir(*saved) == 0 ? 0 : seterr(e, H3R_ERR_IO, "h3bridge: cannot restore the working directory: %s",
                                               strerror(errno));
    close(*saved);
    *saved = -1;
    return rc;
}

static int file_readable(const char *dir, const char *name) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path)) return 0;
    return access(path, R_OK) == 0;
}

/*
 * Decide where h3.c's shaders come from: the current directory when it has
 * SHADER_FILE, else $H3RENDER_H3_DIR, else the checkout the bridge was built
 * against. Sets e->shader_dir (NULL for the cwd). Returns 0, or
 * H3R_ERR_IO naming every place tried.
 */
static int find_shader_dir(h3r_engine *e) {
    if (access(SHADER_FILE, R_OK) == 0) return 0;
    const char *tried[2] = {getenv("H3RENDER_H3_DIR"), NULL};
#ifdef H3R_H3_SOURCE_DIR
    tried[1] = H3R_H3_SOURCE_DIR;
#endif
    for (int i = 0; i < 2; i++) {
        if (!tried[i] || !*tried[i]) continue;
        if (!file_readable(tried[i], SHADER_FILE)) continue;
        char abs[PATH_MAX];
        if (!realpath(tried[i], abs)) continue;
        e->shader_dir = strdup(abs);
        if (!e->shader_dir) return seterr(e, H3R_ERR_NOMEM, "h3bridge: out of memory");
        return 0;
    }
    return seterr(e, H3R_ERR_IO,
                  "h3.c compiles its Metal shaders from ./%s, which is not in the working directory, "
                  "$H3RENDER_H3_DIR (%s) or the build's h3.c checkout (%s); set H3RENDER_H3_DIR to your "
                  "h3.c checkout",
                  SHADER_FILE, tried[0] ? tried[0] : "unset", tried[1] ? tried[1] : "not recorded");
}

/* ---------------------------------------------------------------- JSON */

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;              /* an allocation failed; the text is incomplete */
} jbuf;

static void jb_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jb_printf(jbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->buf ? b->buf + b->len : NULL, b->buf ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (b->buf && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->failed = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
}

/* A JSON string literal of s (quotes, backslashes and control bytes escaped). */
static void jb_str(jbuf *b, const char *s) {
    jb_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') jb_printf(b, "\\%c", *p);
        else if (*p < 0x20) jb_printf(b, "\\u%04x", *p);
        else jb_printf(b, "%c", *p);
    }
    jb_printf(b, "\"");
}

/* Option keys the bridge accepts, in the order the info JSON lists them. */
static const char *const option_keys[] = {
    "denoise_reuse", "dit_layers", "core_reuse", "token_reduction", "render_width",
    "render_height", "ssd_streaming", "preview_denoise", "output_path",
};
#define N_OPTION_KEYS (sizeof(option_keys) / sizeof(option_keys[0]))

static const char *const quant_levels[] = {"bf16", "int8", "int8-row"};
#define N_QUANT_LEVELS (sizeof(quant_levels) / sizeof(quant_levels[0]))

/*
 * Build the info JSON from h3_device and h3_model. Weights are never mapped
 * at open, so "weight_bytes" is the on-disk tensor bytes of the FL2VA DiT
 * (the largest phase) for every quant level. Returns the malloc'ed text or
 * NULL (message set).
 */
static char *build_info(h3r_engine *e) {
    const h3_device_info *dev = h3_device(e->ctx);
    const h3_model_info *mi = h3_model(e->ctx);
    jbuf b = {0};
    const char *base = strrchr(e->model_dir, '/');
    base = base && base[1] ? base + 1 : e->model_dir;
    uint64_t dit = mi ? mi->fl2va_transformer.tensor_bytes : 0;

    jb_printf(&b, "{\"engine\":\"%s\",\"engine_version\":\"%s\",\"abi\":%d,\"model\":", BRIDGE_NAME,
              BRIDGE_VERSION, H3R_ABI_VERSION);
    jb_str(&b, base);
    jb_printf(&b, ",\"quant_levels\":[");
    for (size_t i = 0; i < N_QUANT_LEVELS; i++) jb_printf(&b, "%s\"%s\"", i ? "," : "", quant_levels[i]);
    jb_printf(&b, "],\"weight_bytes\":{");
    for (size_t i = 0; i < N_QUANT_LEVELS; i++)
        jb_printf(&b, "%s\"%s\":%llu", i ? "," : "", quant_levels[i], (unsigned long long)dit);
    jb_printf(&b,
              "},\"frame_rule\":{\"multiple\":%d,\"offset\":%d},\"min_frames\":%d,\"max_frames\":%d,"
              "\"size_multiple\":%d,\"max_pixels\":%d,\"fps\":%d,\"prompt\":\"text\",\"samplers\":[\"euler\"],"
              "\"steps_range\":[%d,%d],\"ignored_fields\":[\"guidance\",\"shift\",\"threads\"],"
              "\"options\":[",
              H3B_FRAME_MULTIPLE, H3B_FRAME_OFFSET, H3B_MIN_FRAMES, H3B_MAX_FRAMES, H3B_SIZE_MULTIPLE,
              H3B_MAX_PIXELS, H3B_FPS, H3B_MIN_STEPS, H3B_MAX_STEPS);
    for (size_t i = 0; i < N_OPTION_KEYS; i++) jb_printf(&b, "%s\"%s\"", i ? "," : "", option_keys[i]);
    jb_printf(&b, "],\"components\":{");
    if (mi) {
        const struct { const char *name; const h3_component_info *c; } comp[] = {
            {"text_encoder", &mi->text_encoder},     {"fl2va_transformer", &mi->fl2va_transformer},
            {"ref2va_transformer", &mi->ref2va_transformer}, {"video_vae", &mi->video_vae},
            {"audio_vae", &mi->audio_vae},
        };
        for (size_t i = 0; i < sizeof(comp) / sizeof(comp[0]); i++)
            jb_printf(&b, "%s\"%s\":{\"bytes\":%llu,\"tensor_bytes\":%llu,\"files\":%zu,\"tensors\":%zu}",
                      i ? "," : "", comp[i].name, (unsigned long long)comp[i].c->bytes,
                      (unsigned long long)comp[i].c->tensor_bytes, comp[i].c->files, comp[i].c->tensors);
    }
    jb_printf(&b, "},\"device\":");
    if (dev) {
        jb_printf(&b, "{\"name\":");
        jb_str(&b, dev->name);
        jb_printf(&b, ",\"architecture\":");
        jb_str(&b, dev->architecture);
        jb_printf(&b,
                  ",\"physical_memory\":%llu,\"recommended_working_set\":%llu,\"max_buffer_length\":%llu,"
                  "\"apple_gpu_family\":%d,\"metal4\":%s,\"unified_memory\":%s}",
                  (unsigned long long)dev->physical_memory, (unsigned long long)dev->recommended_working_set,
                  (unsigned long long)dev->max_buffer_length, dev->apple_gpu_family,
                  dev->metal4 ? "true" : "false", dev->unified_memory ? "true" : "false");
    } else {
        jb_printf(&b, "null");
    }
    /* Defaults as h3_params carries them, read by field name. */
    h3_params params = H3_PARAMS_DEFAULT;
    jb_printf(&b,
              ",\"defaults\":{\"width\":%d,\"height\":%d,\"frames\":%d,\"steps\":%d,\"sampler\":\"euler\","
              "\"quant\":\"int8\",\"denoise_reuse\":%d,\"dit_layers\":%d,\"core_reuse\":%d,"
              "\"token_reduction\":%d,\"ssd_streaming\":%d,\"preview_denoise\":%d}}",
              params.width, params.height, params.frames, params.steps, params.denoise_reuse,
              params.dit_layers, params.core_reuse, params.token_reduction, params.ssd_streaming,
              params.preview_denoise);
    if (b.failed) {
        free(b.buf);
        seterr(e, H3R_ERR_NOMEM, "h3r_info_json: out of memory");
        return NULL;
    }
    return b.buf;
}

/* ---------------------------------------------------------------- open/close */

H3R_API int h3r_abi_version(void) { return H3R_ABI_VERSION; }

/*
 * Open an H3 snapshot directory (FL2VA/, optional Ref2VA/) with h3_load_dir,
 * which reads metadata and probes the Metal device; weights stay unmapped.
 * threads is ignored (h3.c schedules its own GPU and I/O work). Returns 0
 * and *out, or a negative code with the message in h3r_last_error(NULL).
 */
H3R_API int h3r_open(const char *model_dir, int threads, h3r_engine **out) {
    (void)threads;
    tls_err[0] = '\0';
    if (!out) return seterr(NULL, H3R_ERR_INVALID, "h3r_open: out is NULL");
    *out = NULL;
    if (!model_dir || !*model_dir) return seterr(NULL, H3R_ERR_INVALID, "h3r_open: model_dir is empty");
    char abs[PATH_MAX];
    if (!realpath(model_dir, abs))
        return seterr(NULL, H3R_ERR_IO, "%s: cannot open model directory: %s", model_dir, strerror(errno));

    h3r_engine *e = calloc(1, sizeof(*e));
    if (!e) return seterr(NULL, H3R_ERR_NOMEM, "h3r_open: out of memory");
    e->model_dir = strdup(abs);
    int rc = e->model_dir ? find_shader_dir(e) : seterr(e, H3R_ERR_NOMEM, "h3r_open: out of memory");
    int saved = -1;
    if (rc == 0) rc = cwd_enter(e, &saved);
    if (rc == 0) {
        e->ctx = h3_load_dir(e->model_dir);
        int back = cwd_leave(e, &saved);
        if (!e->ctx) {
            const char *msg = h3_last_error(NULL);
            rc = seterr(e, classify_h3_error(msg), "h3.c cannot open %s: %s", e->model_dir,
                        msg && *msg ? msg : "unknown error");
        } else {
            rc = back;
        }
    }
    if (rc == 0 && !(e->info_json = build_info(e))) rc = H3R_ERR_NOMEM;
    if (rc != 0) {
        snprintf(tls_err, sizeof(tls_err), "%s", e->err);
        h3r_close(e);
        return rc;
    }
    *out = e;
    return 0;
}

H3R_API void h3r_close(h3r_engine *e) {
    if (!e) return;
    if (e->ctx) h3_free(e->ctx);
    free(e->model_dir);
    free(e->shader_dir);
    free(e->info_json);
    free(e);
}

H3R_API const char *h3r_last_error(const h3r_engine *e) { return e ? e->err : tls_err; }

H3R_API const char *h3r_info_json(h3r_engine *e) {
    if (!e) {
        seterr(NULL, H3R_ERR_INVALID, "h3r_info_json: engine is NULL");
        return NULL;
    }
    return e->info_json;
}

/* ---------------------------------------------------------------- options */

/* Parse a whole decimal int in [lo, hi] for option `key`; 0 or H3R_ERR_INVALID. */
static int parse_int(h3r_engine *e, const char *key, const char *val, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (!*val || *end || errno)
        return seterr(e, H3R_ERR_INVALID, "engine option %s=%s is not an integer (allowed: %ld..%ld)", key,
                      val, lo, hi);
    if (v < lo || v > hi)
        return seterr(e, H3R_ERR_INVALID, "engine option %s=%ld is outside %ld..%ld (nearest: %ld)", key, v,
                      lo, hi, v < lo ? lo : hi);
    *out = (int)v;
    return 0;
}

/* Parse 0/1/true/false for option `key`; 0 or H3R_ERR_INVALID. */
static int parse_bool(h3r_engine *e, const char *key, const char *val, int *out) {
    if (!strcmp(val, "1") || !strcmp(val, "true")) *out = 1;
    else if (!strcmp(val, "0") || !strcmp(val, "false")) *out = 0;
    else return seterr(e, H3R_ERR_INVALID, "engine option %s=%s is not a boolean (allowed: 0, 1, true, false)",
                       key, val);
    return 0;
}

/*
 * Apply "key=value;..." engine options to params. Unknown keys are an error,
 * so a typo in a sweep never renders silently with defaults. output_path is
 * copied into out_path (it must be absolute: h3.c may run in another working
 * directory). Returns 0 or H3R_ERR_INVALID naming key, value and rule.
 */
static int apply_options(h3r_engine *e, const char *opts, h3_params *p, char *out_path, size_t out_cap) {
    out_path[0] = '\0';
    for (const char *s = opts; s && *s;) {
        const char *end = strchr(s, ';');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        char item[OPT_ITEM_MAX];
        if (len >= sizeof(item)) return seterr(e, H3R_ERR_INVALID, "engine option too long: %.40s...", s);
        memcpy(item, s, len);
        item[len] = '\0';
        s = end ? end + 1 : s + len;
        if (!len) continue;
        char *eq = strchr(item, '=');
        if (!eq) return seterr(e, H3R_ERR_INVALID, "engine option '%s' is not key=value", item);
        *eq = '\0';
        const char *key = item, *val = eq + 1;
        int rc;
        if (!strcmp(key, "denoise_reuse")) rc = parse_int(e, key, val, 1, 3, &p->denoise_reuse);
        else if (!strcmp(key, "dit_layers"))
            rc = parse_int(e, key, val, H3B_MIN_DIT_LAYERS, H3B_MAX_DIT_LAYERS, &p->dit_layers);
        else if (!strcmp(key, "core_reuse")) rc = parse_int(e, key, val, 1, 6, &p->core_reuse);
        else if (!strcmp(key, "token_reduction")) rc = parse_bool(e, key, val, &p->token_reduction);
        else if (!strcmp(key, "render_width")) rc = parse_int(e, key, val, 0, 1344, &p->render_width);
        else if (!strcmp(key, "render_height")) rc = parse_int(e, key, val, 0, 1344, &p->render_height);
        else if (!strcmp(key, "ssd_streaming")) rc = parse_bool(e, key, val, &p->ssd_streaming);
        else if (!strcmp(key, "preview_denoise")) rc = parse_bool(e, key, val, &p->preview_denoise);
        else if (!strcmp(key, "output_path")) {
            if (val[0] != '/')
                return seterr(e, H3R_ERR_INVALID, "engine option output_path=%s must be an absolute path", val);
            if (strlen(val) >= out_cap)
                return seterr(e, H3R_ERR_INVALID, "engine option output_path is longer than %zu bytes",
                              out_cap - 1);
            snprintf(out_path, out_cap, "%s", val);
            rc = 0;
        } else {
            char known[256] = "";
            for (size_t i = 0; i < N_OPTION_KEYS; i++) {
                strncat(known, i ? ", " : "", sizeof(known) - strlen(known) - 1);
                strncat(known, option_keys[i], sizeof(known) - strlen(known) - 1);
            }
            return seterr(e, H3R_ERR_INVALID, "engine option '%s' is not known to h3.c (known: %s)", key, known);
        }
        if (rc) return rc;
    }
    return 0;
}

/* Nearest multiple of m to v, at least m. */
static int nearest_multiple(int v, int m) { return v <= m ? m : (v + m / 2) / m * m; }

/*
 * Check the request against h3.c's documented limits before any weight is
 * touched, so the message names our field, its value and the nearest valid
 * value. h3.c checks again; this only makes the errors ours and early.
 */
static int validate(h3r_engine *e, const h3r_request *r, const h3_params *p) {
    if (r->width < H3B_SIZE_MULTIPLE || r->width % H3B_SIZE_MULTIPLE)
        return seterr(e, H3R_ERR_INVALID, "width=%d must be a multiple of %d, at least %d (nearest: %d)", r->width,
                      H3B_SIZE_MULTIPLE, H3B_SIZE_MULTIPLE, nearest_multiple(r->width, H3B_SIZE_MULTIPLE));
    if (r->height < H3B_SIZE_MULTIPLE || r->height % H3B_SIZE_MULTIPLE)
        return seterr(e, H3R_ERR_INVALID, "height=%d must be a multiple of %d, at least %d (nearest: %d)",
                      r->height, H3B_SIZE_MULTIPLE, H3B_SIZE_MULTIPLE, nearest_multiple(r->height, H3B_SIZE_MULTIPLE));
    if ((long long)r->width * r->height > H3B_MAX_PIXELS)
        return seterr(e, H3R_ERR_INVALID, "width*height=%dx%d is %lld pixels; h3.c allows at most 768*1344 = %d",
                      r->width, r->height, (long long)r->width * r->height, H3B_MAX_PIXELS);
    if (r->frames < H3B_MIN_FRAMES || r->frames > H3B_MAX_FRAMES ||
        (r->frames - H3B_FRAME_OFFSET) % H3B_FRAME_MULTIPLE) {
        int up = r->frames < H3B_MIN_FRAMES ? H3B_MIN_FRAMES
                 : r->frames > H3B_MAX_FRAMES
                     ? H3B_MAX_FRAMES
                     : H3B_FRAME_OFFSET + H3B_FRAME_MULTIPLE * ((r->frames - H3B_FRAME_OFFSET + H3B_FRAME_MULTIPLE - 1) /
                                                                H3B_FRAME_MULTIPLE);
        return seterr(e, H3R_ERR_INVALID, "frames=%d must be 17n+5 in %d..%d (nearest: %d; the job layer rounds up)",
                      r->frames, H3B_MIN_FRAMES, H3B_MAX_FRAMES, up);
    }
    if (r->steps < H3B_MIN_STEPS || r->steps > H3B_MAX_STEPS)
        return seterr(e, H3R_ERR_INVALID, "steps=%d must be in %d..%d", r->steps, H3B_MIN_STEPS, H3B_MAX_STEPS);
    if (r->sampler != H3R_SAMPLER_EULER)
        return seterr(e, H3R_ERR_UNSUPPORTED, "sampler=%d: h3.c has only its own flow Euler sampler (euler)",
                      r->sampler);
    if (!r->prompt || !*r->prompt)
        return seterr(e, H3R_ERR_INVALID, "prompt is empty; h3.c takes prompt text (info prompt=text)");
    if (r->negative_prompt && *r->negative_prompt)
        return seterr(e, H3R_ERR_UNSUPPORTED, "negative_prompt is not supported by h3.c; leave it empty");
    if (r->init_latents || r->n_init_latents)
        return seterr(e, H3R_ERR_UNSUPPORTED, "init_latents are not supported by h3.c");
    if (r->out_latents || r->n_out_latents)
        return seterr(e, H3R_ERR_UNSUPPORTED, "out_latents are not supported by h3.c");
    if (r->preview_every < 0)
        return seterr(e, H3R_ERR_INVALID, "preview_every=%d must be >= 0", r->preview_every);
    if ((p->render_width == 0) != (p->render_height == 0))
        return seterr(e, H3R_ERR_INVALID, "render_width=%d and render_height=%d must be set together",
                      p->render_width, p->render_height);
    if (p->render_width) {
        if (p->render_width % H3B_SIZE_MULTIPLE || p->render_height % H3B_SIZE_MULTIPLE ||
            p->render_width < H3B_SIZE_MULTIPLE || p->render_height < H3B_SIZE_MULTIPLE)
            return seterr(e, H3R_ERR_INVALID, "render size %dx%d must be multiples of %d", p->render_width,
                          p->render_height, H3B_SIZE_MULTIPLE);
        if (p->render_width > r->width || p->render_height > r->height)
            return seterr(e, H3R_ERR_INVALID, "render size %dx%d must not exceed the output %dx%d",
                          p->render_width, p->render_height, r->width, r->height);
        if ((long long)p->render_width * r->height != (long long)p->render_height * r->width)
            return seterr(e, H3R_ERR_INVALID, "render size %dx%d must have the output's aspect %dx%d",
                          p->render_width, p->render_height, r->width, r->height);
    }
    if (p->core_reuse > 1 && p->denoise_reuse > 1)
        return seterr(e, H3R_ERR_INVALID, "core_reuse=%d and denoise_reuse=%d cannot be combined; set one to 1",
                      p->core_reuse, p->denoise_reuse);
    if (p->ssd_streaming && p->use_int8_row_fc2)
        return seterr(e, H3R_ERR_INVALID, "ssd_streaming=1 cannot be combined with quant=int8-row; use bf16 or int8");
    if (p->use_int8_row_fc2) {
        const h3_device_info *dev = h3_device(e->ctx);
        if (dev && !dev->metal4)
            return seterr(e, H3R_ERR_UNSUPPORTED, "quant=int8-row needs an M5-class Metal 4 GPU; this is %s",
                          dev->name);
    }
    return 0;
}

/* ---------------------------------------------------------------- callbacks */

typedef struct {
    h3r_engine *e;
    const h3r_request *req;
    int saved_cwd;           /* caller's directory while h3.c runs, else -1 */
    int canceled;            /* the caller's callback asked to stop */
    int fail_code;           /* the bridge itself stopped h3.c (message set), else 0 */
    uint8_t *pack;           /* repacked rows when h3.c's stride has padding */
    size_t pack_cap;
} bridge_state;

/* Map h3.c's phase text to H3R_PHASE_*. Unknown phases count as loading. */
static int phase_of(const char *name) {
    static const struct { const char *prefix; int phase; } map[] = {
        {"denoise", H3R_PHASE_DENOISE},       {"tokenizer", H3R_PHASE_ENCODE},
        {"text encoder", H3R_PHASE_ENCODE},   {"refine text", H3R_PHASE_ENCODE},
        {"Qwen vision", H3R_PHASE_ENCODE},    {"video VAE encoder", H3R_PHASE_ENCODE},
        {"audio VAE encoder", H3R_PHASE_ENCODE}, {"preview VAE", H3R_PHASE_LOAD},
        {"video VAE", H3R_PHASE_DECODE},      {"audio VAE", H3R_PHASE_DECODE},
        {"FFmpeg", H3R_PHASE_DECODE},
    };
    if (!name) return H3R_PHASE_LOAD;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (!strncmp(name, map[i].prefix, strlen(map[i].prefix))) return map[i].phase;
    return H3R_PHASE_LOAD;
}

/* Run the caller's callback in the caller's working directory. */
static void callback_enter(bridge_state *st) {
    if (st->saved_cwd >= 0 && fchdir(st->saved_cwd) != 0)
        st->fail_code = seterr(st->e, H3R_ERR_IO, "h3bridge: cannot restore the working directory for a callback: %s",
                               strerror(errno));
}

static void callback_leave(bridge_state *st) {
    if (st->saved_cwd >= 0 && chdir(st->e->shader_dir) != 0)
        st->fail_code = seterr(st->e, H3R_ERR_IO, "h3bridge: cannot re-enter the h3.c directory %s: %s",
                               st->e->shader_dir, strerror(errno));
}

/* h3.c progress -> our progress. Returns non-zero to make h3.c stop. */
static int on_h3_progress(const char *phase, int completed, int total, void *opaque) {
    bridge_state *st = opaque;
    if (st->canceled || st->fail_code) return 1;
    if (!st->req->on_progress) return 0;
    callback_enter(st);
    int stop = st->req->on_progress(st->req->user, phase_of(phase), completed, total);
    callback_leave(st);
    if (stop) st->canceled = 1;
    return stop || st->fail_code;
}

/*
 * h3.c frame -> our frame. A frame with denoise_step >= 0 is a preview after
 * that step: forwarded as H3R_FRAME_PREVIEW every preview_every steps (every
 * step when preview_every is 0 and previews were asked through options).
 * Rows are repacked when h3.c's stride is wider than width*3.
 */
static int on_h3_frame(const h3_frame *fr, void *opaque) {
    bridge_state *st = opaque;
    if (st->canceled || st->fail_code) return 1;
    if (!st->req->on_frame) return 0;
    if (!fr || !fr->rgb || fr->width <= 0 || fr->height <= 0 || fr->stride < fr->width * 3) {
        st->fail_code = seterr(st->e, H3R_ERR_INTERNAL, "h3.c delivered a malformed frame (%dx%d, stride %d)",
                               fr ? fr->width : 0, fr ? fr->height : 0, fr ? fr->stride : 0);
        return 1;
    }
    int kind = fr->denoise_step >= 0 ? H3R_FRAME_PREVIEW : H3R_FRAME_FINAL;
    int index = kind == H3R_FRAME_PREVIEW ? fr->denoise_step : fr->frame_index;
    int every = st->req->preview_every > 0 ? st->req->preview_every : 1;
    if (kind == H3R_FRAME_PREVIEW && (index + 1) % every != 0 && index + 1 != fr->denoise_steps) return 0;
    const uint8_t *rgb = fr->rgb;
    size_t row = (size_t)fr->width * 3;
    if ((size_t)fr->stride != row) {
        size_t need = row * (size_t)fr->height;
        if (need > st->pack_cap) {
            uint8_t *nb = realloc(st->pack, need);
            if (!nb) {
                st->fail_code = seterr(st->e, H3R_ERR_NOMEM, "h3bridge: out of memory repacking a %dx%d frame",
                                       fr->width, fr->height);
                return 1;
            }
            st->pack = nb;
            st->pack_cap = need;
        }
        for (int y = 0; y < fr->height; y++) memcpy(st->pack + row * y, fr->rgb + (size_t)fr->stride * y, row);
        rgb = st->pack;
    }
    callback_enter(st);
    int stop = st->req->on_frame(st->req->user, kind, index, fr->width, fr->height, rgb);
    callback_leave(st);
    if (stop) st->canceled = 1;
    return stop || st->fail_code;
}

/* ---------------------------------------------------------------- generate */

/*
 * Translate the request into h3_params (by field name, from
 * H3_PARAMS_DEFAULT), validate it, and run h3_generate. Frames arrive
 * through req->on_frame. Returns 0, H3R_ERR_CANCELED when a callback asked to
 * stop, or another negative code with h3.c's message.
 */
H3R_API int h3r_generate(h3r_engine *e, const h3r_request *req) {
    if (!e) return seterr(NULL, H3R_ERR_INVALID, "h3r_generate: engine is NULL");
    e->err[0] = '\0';
    if (!req) return seterr(e, H3R_ERR_INVALID, "h3r_generate: request is NULL");
    if (req->struct_size < sizeof(h3r_request))
        return seterr(e, H3R_ERR_INVALID, "request struct is %u bytes; this engine needs %zu (ABI %d)",
                      req->struct_size, sizeof(h3r_request), H3R_ABI_VERSION);

    h3_params params = H3_PARAMS_DEFAULT;
    params.width = req->width;
    params.height = req->height;
    params.frames = req->frames;
    params.steps = req->steps;
    params.seed = req->seed;

    const char *quant = req->quant && *req->quant ? req->quant : "int8";
    if (!strcmp(quant, "bf16")) {
        params.use_slower_bf16_mlp = 1;
        params.use_slower_bf16_qkv = 1;
        params.use_slower_bf16_attention_output = 1;
    } else if (!strcmp(quant, "int8-row") || !strcmp(quant, "int8_row")) {
        params.use_int8_row_fc2 = 1;
    } else if (strcmp(quant, "int8") != 0) {
        return seterr(e, H3R_ERR_UNSUPPORTED, "quant=%s is not an h3.c level (allowed: bf16, int8, int8-row)", quant);
    }

    char out_path[PATH_MAX];
    int rc = apply_options(e, req->options, &params, out_path, sizeof(out_path));
    if (rc) return rc;
    if (req->preview_every > 0) params.preview_denoise = 1;
    if ((rc = validate(e, req, &params))) return rc;
    if (params.preview_denoise && !req->on_frame)
        return seterr(e, H3R_ERR_INVALID, "previews (preview_every or preview_denoise) need a frame callback");

    bridge_state st = {.e = e, .req = req, .saved_cwd = -1};
    params.output_path = out_path[0] ? out_path : NULL;
    params.on_progress = on_h3_progress;
    params.on_frame = on_h3_frame;
    params.callback_opaque = &st;

    if ((rc = cwd_enter(e, &st.saved_cwd))) return rc;
    h3_result *res = h3_generate(e->ctx, req->prompt, &params);
    int back = cwd_leave(e, &st.saved_cwd);
    free(st.pack);

    if (!res) {
        const char *msg = h3_last_error(e->ctx);
        if (st.fail_code) return st.fail_code; /* our message is already set */
        if (st.canceled) return seterr(e, H3R_ERR_CANCELED, "canceled by a callback (%s)", msg ? msg : "");
        return seterr(e, classify_h3_error(msg), "h3.c: %s", msg && *msg ? msg : "generation failed");
    }
    if (res->frames != req->frames || res->width != req->width || res->height != req->height)
        rc = seterr(e, H3R_ERR_INTERNAL, "h3.c rendered %dx%dx%d; the request was %dx%dx%d", res->width,
                    res->height, res->frames, req->width, req->height, req->frames);
    h3_result_free(res);
    if (rc) return rc;
    return back;
}

/* ---------------------------------------------------------------- estimate */

/* h3.c sizes its Metal buffers itself and exposes no sizes; its jobs are
 * estimated in Python from the snapshot (h3render/engine/h3/estimate.py). */
H3R_API int h3r_estimate_json(h3r_engine *e, const h3r_request *req, const char **out) {
    (void)req;
    if (out) *out = NULL;
    return seterr(e, H3R_ERR_UNSUPPORTED, "h3r_estimate_json: the h3.c engine has no memory estimate of its own "
                  "(h3.c jobs are estimated by h3render.engine.h3.estimate)");
}

/* ---------------------------------------------------------------- components */

/* The component entry points serve the CPU engine's verify mode and numerics
 * tests; h3.c exposes no component API, so each says so. */

H3R_API void h3r_set_tap(h3r_engine *e, h3r_tap_fn fn, void *user) {
    (void)fn;
    (void)user;
    if (e) seterr(e, H3R_ERR_UNSUPPORTED, "h3r_set_tap: h3.c has no per-stage taps");
}

H3R_API int h3r_encode_text(h3r_engine *e, const char *quant, const int32_t *ids, int n, float *out,
                            int64_t n_out) {
    (void)quant, (void)ids, (void)n, (void)out, (void)n_out;
    return seterr(e, H3R_ERR_UNSUPPORTED, "h3r_encode_text: not available with the h3.c engine (whole renders only)");
}

H3R_API int h3r_dit_forward(h3r_engine *e, const char *quant, const float *x, int c, int t, int h, int w,
                            float timestep, const float *context, int n_ctx, float *out) {
    (void)quant, (void)x, (void)c, (void)t, (void)h, (void)w, (void)timestep, (void)context, (void)n_ctx, (void)out;
    return seterr(e, H3R_ERR_UNSUPPORTED, "h3r_dit_forward: not available with the h3.c engine (whole renders only)");
}

H3R_API int h3r_vae_decode(h3r_engine *e, const char *quant, const float *z, int c, int t, int h, int w,
                           float *out, int64_t n_out) {
    (void)quant, (void)z, (void)c, (void)t, (void)h, (void)w, (void)out, (void)n_out;
    return seterr(e, H3R_ERR_UNSUPPORTED, "h3r_vae_decode: not available with the h3.c engine (whole renders only)");
}

H3R_API int h3r_schedule(int sampler, int steps, float shift, float *sigmas, float *timesteps) {
    (void)sampler, (void)steps, (void)shift, (void)sigmas, (void)timesteps;
    return seterr(NULL, H3R_ERR_UNSUPPORTED, "h3r_schedule: h3.c does not expose its sigma schedule");
}
