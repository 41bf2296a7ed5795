/*
 * engine.c: the public ABI (h3render.h) of the CPU engine.
 *
 * A model directory holds one GGUF file per component and quant level:
 *   transformer-<q>.gguf   the Wan DiT, one per quant level the user converted
 *   text_encoder-<q>.gguf  UMT5, f32 or f16
 *   vae-<q>.gguf           the Wan VAE, f32 or f16
 * h3r_open maps and validates every file it finds (headers, config, tensor
 * shapes), so a bad file is found at open, never in the middle of a night's
 * queue. A file that fails is set aside with its message (info "broken_files")
 * and the others stay usable: each quant level stands alone, and a render of a
 * level whose DiT is broken fails naming the file. Every component is optional
 * at open; a render needs all three.
 *
 * Lifetimes, as llama2.c splits them:
 *   h3r_engine      the directory, the mapped files and loaded components
 *                   (read-only weights), the thread pool, the last error;
 *   one generate()  context, latents, sampler history, decoded video: all
 *                   allocated at the start of the call and freed before it
 *                   returns, so nothing leaks into the next job.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "quant.h"   /* gguf_prewarm */
#include "models.h"

#define H3R_ENGINE_NAME "h3render-cpu"
#define H3R_ENGINE_VERSION "0.1.0"
#define MAX_LEVELS 8      /* DiT quant levels in one directory */
#define QUANT_NAME_MAX 16
#define ERR_MAX 1024

typedef struct {
    char quant[QUANT_NAME_MAX];
    gguf_file *file;
    void *model;          /* wan_dit, umt5 or wan_vae */
} component;

struct h3r_engine {
    char dir[PATH_MAX];
    char name[128];
    h3r_pool *pool;
    int threads;
    char err[ERR_MAX];
    char *info_json;
    char *estimate_json;  /* the last h3r_estimate_json answer */

    component dit[MAX_LEVELS];
    int n_dit;
    component te[MAX_LEVELS];
    int n_te;
    component vae[MAX_LEVELS];
    int n_vae;

    /* files that failed to load at open, with why: info "broken_files" */
    struct {
        char file[256];
        char kind[16];
        char quant[QUANT_NAME_MAX];
        char why[512];
        int code;
    } broken[3 * MAX_LEVELS];
    int n_broken;

    /* pipeline values stored by the converter (h3r.pipeline.*) */
    int text_len;
    int fps;
    int vae_stride_t, vae_stride_s;

    h3r_tap_fn tap;
    void *tap_user;
};

/* ---------------------------------------------------------------- errors */

static int fail(h3r_engine *e, int code) {
    if (e) snprintf(e->err, sizeof(e->err), "%s", h3r_tls_error());
    return code;
}

H3R_API int h3r_abi_version(void) { return H3R_ABI_VERSION; }

H3R_API const char *h3r_last_error(const h3r_engine *e) {
    return e ? e->err : h3r_tls_error();
}

/* ---------------------------------------------------------------- opening */

/* Precision rank of a quant level name: lower is more precise. */
static int quant_rank(const char *q) {
    static const char *order[] = {"f32", "f16", "q8_0", "q6_k", "q4_k", "q4_0"};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
        if (strcmp(q, order[i]) == 0) return (int)i;
    return 100;
}

static int cmp_component(const void *a, const void *b) {
    const component *x = a, *y = b;
    int d = quant_rank(x->quant) - quant_rank(y->quant);
    return d ? d : strcmp(x->quant, y->quant);
}

/* Parse "<prefix>-<quant>.gguf"; 1 and the quant on a match. */
static int match_file(const char *fname, const char *prefix, char quant[QUANT_NAME_MAX]) {
    size_t pl = strlen(prefix), fl = strlen(fname);
    if (fl <= pl + 1 + 5 || strncmp(fname, prefix, pl) != 0 || fname[pl] != '-') return 0;
    if (strcmp(fname + fl - 5, ".gguf") != 0) return 0;
    size_t ql = fl - pl - 1 - 5;
    if (ql == 0 || ql >= QUANT_NAME_MAX) return 0;
    memcpy(quant, fname + pl + 1, ql);
    quant[ql] = 0;
    for (size_t i = 0; i < ql; i++) {
        char c = quant[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return 0;
    }
    return 1;
}

static void free_component(component *c, void (*free_model)(void *)) {
    if (c->model) free_model(c->model);
    if (c->file) gguf_close(c->file);
    c->model = NULL;
    c->file = NULL;
}

static void dit_free_v(void *m) { wan_dit_free(m); }
static void umt5_free_v(void *m) { umt5_free(m); }
static void vae_free_v(void *m) { wan_vae_free(m); }

/* Open and validate one component file; on failure the message names the file. */
static int load_component(h3r_engine *e, const char *fname, const char *kind, component *c) {
    char path[PATH_MAX + 256];
    snprintf(path, sizeof(path), "%s/%s", e->dir, fname);
    int rc = gguf_open(path, &c->file);
    if (rc) return rc;
    if (strcmp(kind, "transformer") == 0) rc = wan_dit_load(c->file, (wan_dit **)&c->model);
    else if (strcmp(kind, "text_encoder") == 0) rc = umt5_load(c->file, (umt5 **)&c->model);
    else rc = wan_vae_load(c->file, (wan_vae **)&c->model);
    if (rc) {
        gguf_close(c->file);
        c->file = NULL;
        return rc;
    }
    return 0;
}

static void read_pipeline_values(h3r_engine *e, const gguf_file *g) {
    int64_t v;
    const char *s;
    size_t len;
    if (gguf_has_key(g, "h3r.pipeline.text_len") && gguf_get_int(g, "h3r.pipeline.text_len", &v) == 0 &&
        v > 0 && v <= 65536)
        e->text_len = (int)v;
    if (gguf_has_key(g, "h3r.pipeline.fps") && gguf_get_int(g, "h3r.pipeline.fps", &v) == 0 && v > 0 &&
        v <= 1000)
        e->fps = (int)v;
    if (!e->name[0] && gguf_has_key(g, "general.name") && gguf_get_str(g, "general.name", &s, &len) == 0) {
        if (len >= sizeof(e->name)) len = sizeof(e->name) - 1;
        memcpy(e->name, s, len);
        e->name[len] = 0;
    }
}

/* Wan VAE: temporal stride 2^(number of temporal downsamples), spatial stride
 * 2^(number of downsample stages), as diffusers' WanPipeline computes them. */
static void read_vae_strides(h3r_engine *e, const gguf_file *g) {
    int64_t td[16];
    int n = 0;
    if (gguf_has_key(g, "h3r.temperal_downsample") &&
        gguf_get_int_array(g, "h3r.temperal_downsample", td, 16, &n) == 0 && n > 0) {
        int st = 1;
        for (int i = 0; i < n; i++) st *= td[i] ? 2 : 1;
        e->vae_stride_t = st;
        e->vae_stride_s = 1 << n;
    }
}

H3R_API int h3r_open(const char *model_dir, int threads, h3r_engine **out) {
    h3r_clear_error();
    if (!out) return h3r_seterr(H3R_ERR_INVALID, "h3r_open: out is NULL");
    *out = NULL;
    if (!model_dir || !*model_dir) return h3r_seterr(H3R_ERR_INVALID, "h3r_open: empty model directory");
    if (strlen(model_dir) >= PATH_MAX) return h3r_seterr(H3R_ERR_INVALID, "h3r_open: path too long");

    DIR *d = opendir(model_dir);
    if (!d) return h3r_seterr(H3R_ERR_IO, "%s: cannot open model directory: %s", model_dir, strerror(errno));

    h3r_engine *e = calloc(1, sizeof(*e));
    if (!e) {
        closedir(d);
        return h3r_seterr(H3R_ERR_NOMEM, "h3r_open: out of memory");
    }
    snprintf(e->dir, sizeof(e->dir), "%s", model_dir);
    e->text_len = 512;
    e->fps = 16;
    e->vae_stride_t = 4;
    e->vae_stride_s = 8;

    int rc = 0;
    struct dirent *ent;
    static const char *kinds[3] = {"transformer", "text_encoder", "vae"};
    while (rc == 0 && (ent = readdir(d)) != NULL) {
        char quant[QUANT_NAME_MAX];
        for (int k = 0; k < 3 && rc == 0; k++) {
            if (!match_file(ent->d_name, kinds[k], quant)) continue;
            component *list = k == 0 ? e->dit : k == 1 ? e->te : e->vae;
            int *n = k == 0 ? &e->n_dit : k == 1 ? &e->n_te : &e->n_vae;
            if (*n >= MAX_LEVELS) {
                rc = h3r_seterr(H3R_ERR_FORMAT, "%s: more than %d %s files", model_dir, MAX_LEVELS, kinds[k]);
                break;
            }
            component *c = &list[*n];
            snprintf(c->quant, sizeof(c->quant), "%s", quant);
            int lrc = load_component(e, ent->d_name, kinds[k], c);
            if (lrc == 0) {
                (*n)++;
            } else if (lrc == H3R_ERR_NOMEM || e->n_broken >= (int)(sizeof(e->broken) / sizeof(e->broken[0]))) {
                rc = lrc;
            } else { /* set aside: the other files stay usable */
                snprintf(e->broken[e->n_broken].file, sizeof(e->broken[0].file), "%s", ent->d_name);
                snprintf(e->broken[e->n_broken].kind, sizeof(e->broken[0].kind), "%s", kinds[k]);
                snprintf(e->broken[e->n_broken].quant, sizeof(e->broken[0].quant), "%s", quant);
                snprintf(e->broken[e->n_broken].why, sizeof(e->broken[0].why), "%s", h3r_tls_error());
                e->broken[e->n_broken].code = lrc;
                e->n_broken++;
                memset(c, 0, sizeof(*c));
                h3r_clear_error();
            }
        }
    }
    closedir(d);
    if (rc == 0 && e->n_dit + e->n_te + e->n_vae == 0 && e->n_broken > 0)
        rc = h3r_seterr(e->broken[0].code, "%s", e->broken[0].why); /* nothing usable: the first reason */
    else if (rc == 0 && e->n_dit + e->n_te + e->n_vae == 0)
        rc = h3r_seterr(H3R_ERR_IO,
                        "%s: no model files (expected transformer-<quant>.gguf, text_encoder-<quant>.gguf, "
                        "vae-<quant>.gguf; convert a checkpoint with `h3render convert`)",
                        model_dir);
    if (rc) {
        h3r_close(e);
        return rc;
    }
    qsort(e->dit, e->n_dit, sizeof(component), cmp_component);
    qsort(e->te, e->n_te, sizeof(component), cmp_component);
    qsort(e->vae, e->n_vae, sizeof(component), cmp_component);
    for (int i = 0; i < e->n_dit; i++) read_pipeline_values(e, e->dit[i].file);
    for (int i = 0; i < e->n_te; i++) read_pipeline_values(e, e->te[i].file);
    if (e->n_vae) read_vae_strides(e, e->vae[0].file);
    if (!e->name[0]) {
        const char *base = strrchr(e->dir, '/');
        snprintf(e->name, sizeof(e->name), "%.127s", base ? base + 1 : e->dir);
    }

    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    e->threads = threads;
    e->pool = h3r_pool_create(threads);
    if (!e->pool) {
        rc = H3R_ERR_NOMEM;
        h3r_close(e);
        return rc;
    }
    *out = e;
    return 0;
}

H3R_API void h3r_close(h3r_engine *e) {
    if (!e) return;
    for (int i = 0; i < e->n_dit; i++) free_component(&e->dit[i], dit_free_v);
    for (int i = 0; i < e->n_te; i++) free_component(&e->te[i], umt5_free_v);
    for (int i = 0; i < e->n_vae; i++) free_component(&e->vae[i], vae_free_v);
    /* a component that failed to load mid-way is already closed by load_component */
    if (e->pool) h3r_pool_free(e->pool);
    free(e->info_json);
    free(e->estimate_json);
    free(e);
}

H3R_API void h3r_set_tap(h3r_engine *e, h3r_tap_fn fn, void *user) {
    if (!e) return;
    e->tap = fn;
    e->tap_user = user;
}

/* ---------------------------------------------------------------- selection */

static component *find_quant(component *list, int n, const char *quant) {
    for (int i = 0; i < n; i++)
        if (strcmp(list[i].quant, quant) == 0) return &list[i];
    return NULL;
}

/* The broken DiT file of a quant level, or -1. */
static int broken_dit(const h3r_engine *e, const char *quant) {
    for (int i = 0; i < e->n_broken; i++)
        if (strcmp(e->broken[i].kind, "transformer") == 0 && quant && strcmp(e->broken[i].quant, quant) == 0)
            return i;
    return -1;
}

/* The DiT file for a quant level, or an error naming its broken file or listing what exists. */
static int pick_dit(h3r_engine *e, const char *quant, component **out) {
    int b = broken_dit(e, quant);
    if (b >= 0)
        return h3r_seterr(e->broken[b].code, "quant=%s of model %s is unusable: %s", quant, e->name,
                          e->broken[b].why);
    if (e->n_dit == 0)
        return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: no usable transformer-<quant>.gguf in the model directory%s%s",
                          e->dir, e->n_broken ? "; broken: " : "", e->n_broken ? e->broken[0].why : "");
    if (!quant || !*quant) {
        *out = &e->dit[0];
        return 0;
    }
    component *c = find_quant(e->dit, e->n_dit, quant);
    if (c) {
        *out = c;
        return 0;
    }
    char have[256] = "";
    for (int i = 0; i < e->n_dit; i++) {
        strncat(have, i ? ", " : "", sizeof(have) - strlen(have) - 1);
        strncat(have, e->dit[i].quant, sizeof(have) - strlen(have) - 1);
    }
    return h3r_seterr(H3R_ERR_UNSUPPORTED, "quant=%s is not available for model %s; available: %s", quant,
                      e->name, have);
}

/* Text encoder and VAE: the requested level if present, else f16 for any
 * level other than f32, else the most precise file present. A level whose own
 * file is broken is unusable (a silent substitute would change its frames);
 * a level that only borrows the f16 file falls back to a healthy one. */
static int pick_small(h3r_engine *e, component *list, int n, const char *what, const char *quant,
                      int explicit_only, component **out) {
    for (int i = 0; quant && *quant && i < e->n_broken; i++)
        if (strcmp(e->broken[i].kind, what) == 0 && strcmp(e->broken[i].quant, quant) == 0)
            return h3r_seterr(e->broken[i].code, "quant=%s of model %s is unusable: %s", quant, e->name,
                              e->broken[i].why);
    if (n == 0) return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: no usable %s-<quant>.gguf in the model directory", e->dir, what);
    if (quant && *quant) {
        component *c = find_quant(list, n, quant);
        if (c) {
            *out = c;
            return 0;
        }
        if (explicit_only)
            return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s-%s.gguf is not in %s", what, quant, e->dir);
        if (strcmp(quant, "f32") != 0 && (c = find_quant(list, n, "f16")) != NULL) {
            *out = c;
            return 0;
        }
    }
    *out = &list[0];
    return 0;
}

static h3r_pool *pool_for(h3r_engine *e, int threads, h3r_pool **temp) {
    *temp = NULL;
    if (threads <= 0 || threads == h3r_pool_size(e->pool)) return e->pool;
    *temp = h3r_pool_create(threads);
    return *temp;
}

/* ---------------------------------------------------------------- info */

static int appendf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0) return -1;
        if (*len + (size_t)n < *cap) {
            *len += (size_t)n;
            return 0;
        }
        size_t ncap = (*cap + (size_t)n + 1) * 2;
        char *nb = realloc(*buf, ncap);
        if (!nb) return -1;
        *buf = nb;
        *cap = ncap;
    }
}

/* JSON-escape a string from a model file (it is untrusted). */
static int append_json_str(char **buf, size_t *len, size_t *cap, const char *s) {
    if (appendf(buf, len, cap, "\"")) return -1;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int r = (c == '"' || c == '\\') ? appendf(buf, len, cap, "\\%c", c)
                : c < 0x20             ? appendf(buf, len, cap, "\\u%04x", c)
                                       : appendf(buf, len, cap, "%c", c);
        if (r) return -1;
    }
    return appendf(buf, len, cap, "\"");
}

static int get_default(const h3r_engine *e, const char *key, double *out) {
    const gguf_file *g = e->n_dit ? e->dit[0].file : e->n_te ? e->te[0].file : NULL;
    if (!g || !gguf_has_key(g, key)) return -1;
    int64_t iv;
    if (gguf_get_float(g, key, out) == 0) return 0;
    if (gguf_get_int(g, key, &iv) == 0) {
        *out = (double)iv;
        return 0;
    }
    return -1;
}

/*
 * Valid frame counts. The VAE turns F frames into T = (F - 1) / st + 1 latent
 * frames, and the DiT's patches need T to be a multiple of pt, so
 * F = st * pt * m - st + 1 for m >= 1: F = multiple * k + offset with
 * multiple = st * pt, offset = (1 - st) mod multiple, at least st * (pt - 1) + 1,
 * which is the offset, or the multiple when the offset is 0.
 * Wan 2.1 (st 4, pt 1): 4k+1 from 1. A model patching all 9 of its latent
 * frames at once (st 1, pt 9): 9k from 9.
 */
static void frame_rule(int st, int pt, int *multiple, int *offset) {
    *multiple = st * pt;
    *offset = ((1 - st) % *multiple + *multiple) % *multiple;
}

H3R_API const char *h3r_info_json(h3r_engine *e) {
    if (!e) return NULL;
    if (e->info_json) return e->info_json;
    size_t len = 0, cap = 1024;
    char *b = malloc(cap);
    if (!b) {
        h3r_seterr(H3R_ERR_NOMEM, "h3r_info_json: out of memory");
        fail(e, H3R_ERR_NOMEM);
        return NULL;
    }
    b[0] = 0;
    int patch[3] = {1, 2, 2};
    int in_ch = 16, text_dim = 0, fmul, foff;
    if (e->n_dit) {
        wan_dit_patch_size(e->dit[0].model, patch);
        in_ch = wan_dit_in_channels(e->dit[0].model);
        text_dim = wan_dit_text_dim(e->dit[0].model);
    } else if (e->n_vae) {
        in_ch = wan_vae_z_dim(e->vae[0].model);
    }
    if (e->n_te) text_dim = umt5_d_model(e->te[0].model);
    frame_rule(e->vae_stride_t, patch[0], &fmul, &foff);
    int r = 0;
    r |= appendf(&b, &len, &cap, "{\"engine\":\"%s\",\"engine_version\":\"%s\",\"abi\":%d,\"model\":",
                 H3R_ENGINE_NAME, H3R_ENGINE_VERSION, H3R_ABI_VERSION);
    r |= append_json_str(&b, &len, &cap, e->name);
    /* a level is usable unless a file of its own (DiT, text encoder or VAE) is broken */
    const char *why_unusable[MAX_LEVELS] = {0};
    for (int i = 0; i < e->n_dit; i++)
        for (int j = 0; j < e->n_broken; j++)
            if (!why_unusable[i] && strcmp(e->broken[j].quant, e->dit[i].quant) == 0) why_unusable[i] = e->broken[j].why;
    r |= appendf(&b, &len, &cap, ",\"quant_levels\":[");
    for (int i = 0, k = 0; i < e->n_dit; i++) {
        if (why_unusable[i]) continue;
        r |= appendf(&b, &len, &cap, k++ ? "," : "");
        r |= append_json_str(&b, &len, &cap, e->dit[i].quant);
    }
    r |= appendf(&b, &len, &cap, "],\"unusable_levels\":{");
    int nu = 0;
    for (int i = 0; i < e->n_dit; i++) {
        if (!why_unusable[i]) continue;
        r |= appendf(&b, &len, &cap, nu++ ? "," : "");
        r |= append_json_str(&b, &len, &cap, e->dit[i].quant);
        r |= appendf(&b, &len, &cap, ":");
        r |= append_json_str(&b, &len, &cap, why_unusable[i]);
    }
    for (int j = 0; j < e->n_broken; j++) { /* levels whose DiT itself is broken */
        if (strcmp(e->broken[j].kind, "transformer") != 0) continue;
        r |= appendf(&b, &len, &cap, nu++ ? "," : "");
        r |= append_json_str(&b, &len, &cap, e->broken[j].quant);
        r |= appendf(&b, &len, &cap, ":");
        r |= append_json_str(&b, &len, &cap, e->broken[j].why);
    }
    r |= appendf(&b, &len, &cap, "},\"weight_bytes\":{");
    for (int i = 0, k = 0; i < e->n_dit; i++) {
        if (why_unusable[i]) continue;
        component *te = NULL, *vae = NULL;
        size_t bytes = gguf_mapped_bytes(e->dit[i].file);
        if (e->n_te && pick_small(e, e->te, e->n_te, "text_encoder", e->dit[i].quant, 0, &te) == 0)
            bytes += gguf_mapped_bytes(te->file);
        if (e->n_vae && pick_small(e, e->vae, e->n_vae, "vae", e->dit[i].quant, 0, &vae) == 0)
            bytes += gguf_mapped_bytes(vae->file);
        r |= appendf(&b, &len, &cap, "%s\"%s\":%zu", k++ ? "," : "", e->dit[i].quant, bytes);
    }
    h3r_clear_error(); /* pick_small above may have named a broken file: info itself succeeded */
    r |= appendf(&b, &len, &cap,
                 "},\"frame_rule\":{\"multiple\":%d,\"offset\":%d},\"size_multiple\":%d,\"max_pixels\":0,"
                 "\"fps\":%d,\"prompt\":\"token_ids\",\"text_len\":%d,\"text_dim\":%d,\"latent_channels\":%d,"
                 "\"vae_stride\":[%d,%d,%d],\"patch_size\":[%d,%d,%d],\"threads\":%d,"
                 "\"samplers\":[\"unipc\",\"euler\"],"
                 "\"components\":{\"transformer\":%s,\"text_encoder\":%s,\"vae\":%s},\"defaults\":{",
                 fmul, foff, e->vae_stride_s * (patch[1] > patch[2] ? patch[1] : patch[2]),
                 e->fps, e->text_len, text_dim, in_ch, e->vae_stride_t, e->vae_stride_s, e->vae_stride_s,
                 patch[0], patch[1], patch[2], h3r_pool_size(e->pool), e->n_dit ? "true" : "false",
                 e->n_te ? "true" : "false", e->n_vae ? "true" : "false");
    static const char *keys[] = {"width", "height", "frames", "steps", "guidance", "shift"};
    int first = 1;
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        char key[64];
        double v;
        snprintf(key, sizeof(key), "h3r.pipeline.%s", keys[i]);
        if (get_default(e, key, &v) == 0 && isfinite(v)) {
            r |= appendf(&b, &len, &cap, "%s\"%s\":%.9g", first ? "" : ",", keys[i], v);
            first = 0;
        }
    }
    static const char *str_keys[] = {"negative_prompt", "sampler"};
    const gguf_file *g0 = e->n_dit ? e->dit[0].file : e->n_te ? e->te[0].file : NULL;
    for (size_t i = 0; g0 && i < sizeof(str_keys) / sizeof(str_keys[0]); i++) {
        char key[64];
        const char *v;
        size_t vlen;
        snprintf(key, sizeof(key), "h3r.pipeline.%s", str_keys[i]);
        if (!gguf_has_key(g0, key) || gguf_get_str(g0, key, &v, &vlen) != 0 || vlen > 4000) continue;
        char *copy = malloc(vlen + 1); /* GGUF strings are not NUL-terminated */
        if (!copy) {
            r = -1;
            break;
        }
        memcpy(copy, v, vlen);
        copy[vlen] = 0;
        r |= appendf(&b, &len, &cap, "%s\"%s\":", first ? "" : ",", str_keys[i]);
        r |= append_json_str(&b, &len, &cap, copy);
        free(copy);
        first = 0;
    }
    r |= appendf(&b, &len, &cap, "},\"broken_files\":[");
    for (int i = 0; i < e->n_broken; i++) {
        r |= appendf(&b, &len, &cap, "%s{\"file\":", i ? "," : "");
        r |= append_json_str(&b, &len, &cap, e->broken[i].file);
        r |= appendf(&b, &len, &cap, ",\"component\":");
        r |= append_json_str(&b, &len, &cap, e->broken[i].kind);
        r |= appendf(&b, &len, &cap, ",\"quant\":");
        r |= append_json_str(&b, &len, &cap, e->broken[i].quant);
        r |= appendf(&b, &len, &cap, ",\"error\":");
        r |= append_json_str(&b, &len, &cap, e->broken[i].why);
        r |= appendf(&b, &len, &cap, "}");
    }
    r |= appendf(&b, &len, &cap, "]}");
    if (r) {
        free(b);
        h3r_seterr(H3R_ERR_NOMEM, "h3r_info_json: out of memory");
        fail(e, H3R_ERR_NOMEM);
        return NULL;
    }
    e->info_json = b;
    return b;
}

/* ---------------------------------------------------------------- components */

H3R_API int h3r_encode_text(h3r_engine *e, const char *quant, const int32_t *ids, int n, float *out,
                            int64_t n_out) {
    h3r_clear_error();
    if (!e || !out || (n > 0 && !ids)) return h3r_seterr(H3R_ERR_INVALID, "h3r_encode_text: NULL argument");
    component *te = NULL;
    int rc = pick_small(e, e->te, e->n_te, "text_encoder", quant, 1, &te);
    if (rc) return fail(e, rc);
    int dim = umt5_d_model(te->model);
    if (n < 0 || n > e->text_len) {
        h3r_seterr(H3R_ERR_INVALID, "prompt has %d tokens; the model takes at most text_len=%d", n, e->text_len);
        return fail(e, H3R_ERR_INVALID);
    }
    if (n_out != (int64_t)e->text_len * dim) {
        h3r_seterr(H3R_ERR_INVALID, "h3r_encode_text: output holds %lld floats, needs text_len*dim = %d*%d",
                   (long long)n_out, e->text_len, dim);
        return fail(e, H3R_ERR_INVALID);
    }
    memset(out, 0, (size_t)n_out * sizeof(float));
    if (n == 0) return 0;
    rc = umt5_encode(te->model, e->pool, ids, n, out, e->tap, e->tap_user);
    return rc ? fail(e, rc) : 0;
}

H3R_API int h3r_dit_forward(h3r_engine *e, const char *quant, const float *x, int c, int t, int h, int w,
                            float timestep, const float *context, int n_ctx, float *out) {
    h3r_clear_error();
    if (!e || !x || !context || !out) return h3r_seterr(H3R_ERR_INVALID, "h3r_dit_forward: NULL argument");
    component *dit = NULL;
    int rc = pick_dit(e, quant, &dit);
    if (rc) return fail(e, rc);
    rc = wan_dit_forward(dit->model, e->pool, x, c, t, h, w, timestep, context, n_ctx, out, e->tap, e->tap_user);
    return rc ? fail(e, rc) : 0;
}

H3R_API int h3r_vae_decode(h3r_engine *e, const char *quant, const float *z, int c, int t, int h, int w,
                           float *out, int64_t n_out) {
    h3r_clear_error();
    if (!e || !z || !out) return h3r_seterr(H3R_ERR_INVALID, "h3r_vae_decode: NULL argument");
    component *vae = NULL;
    int rc = pick_small(e, e->vae, e->n_vae, "vae", quant, 1, &vae);
    if (rc) return fail(e, rc);
    if (c <= 0 || t <= 0 || h <= 0 || w <= 0) {
        h3r_seterr(H3R_ERR_INVALID, "h3r_vae_decode: latent shape (%d, %d, %d, %d) must be positive", c, t, h, w);
        return fail(e, H3R_ERR_INVALID);
    }
    int64_t need = 3LL * (1 + (int64_t)e->vae_stride_t * (t - 1)) * ((int64_t)e->vae_stride_s * h) *
                   ((int64_t)e->vae_stride_s * w);
    if (n_out != need) {
        h3r_seterr(H3R_ERR_INVALID, "h3r_vae_decode: output holds %lld floats, the video needs %lld",
                   (long long)n_out, (long long)need);
        return fail(e, H3R_ERR_INVALID);
    }
    rc = wan_vae_decode(vae->model, e->pool, z, c, t, h, w, out, NULL, NULL, e->tap, e->tap_user);
    return rc ? fail(e, rc) : 0;
}

/* ---------------------------------------------------------------- generate */

typedef struct {
    const h3r_request *req;
    int crash_at_step;       /* test trigger, -1 when off */
    int prewarm;             /* 1: read the DiT weights in file order before step 0 */
} gen_opts;

/* Parse "key=value;..." engine options. Unknown keys are an error, so a typo
 * in a sweep does not silently render with defaults. */
static int parse_options(const char *opts, gen_opts *o) {
    o->crash_at_step = -1;
    o->prewarm = 0;
    if (!opts || !*opts) return 0;
    const char *p = opts;
    while (*p) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[256];
        if (len >= sizeof(item)) return h3r_seterr(H3R_ERR_INVALID, "engine option too long: %.40s...", p);
        memcpy(item, p, len);
        item[len] = 0;
        char *eq = strchr(item, '=');
        if (len > 0) {
            if (!eq) return h3r_seterr(H3R_ERR_INVALID, "engine option '%s' is not key=value", item);
            *eq = 0;
            const char *key = item, *val = eq + 1;
            if (strcmp(key, "test_crash_at_step") == 0) {
                const char *gate = getenv("H3RENDER_ENABLE_TEST_TRIGGERS");
                if (!gate || strcmp(gate, "1") != 0)
                    return h3r_seterr(H3R_ERR_INVALID,
                                      "engine option test_crash_at_step is a test trigger; it needs "
                                      "H3RENDER_ENABLE_TEST_TRIGGERS=1 in the worker's environment");
                char *ep;
                long v = strtol(val, &ep, 10);
                if (*ep || v < 0 || v > 100000)
                    return h3r_seterr(H3R_ERR_INVALID, "test_crash_at_step=%s is not a step number", val);
                o->crash_at_step = (int)v;
            } else if (strcmp(key, "prewarm") == 0) {
                if (strcmp(val, "0") && strcmp(val, "1"))
                    return h3r_seterr(H3R_ERR_INVALID, "engine option prewarm=%s: allowed 0 or 1", val);
                o->prewarm = val[0] == '1';
            } else {
                return h3r_seterr(H3R_ERR_INVALID,
                                  "engine option '%s' is not known to the CPU engine (known: prewarm, "
                                  "test_crash_at_step)", key);
            }
        }
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

static int validate_request(h3r_engine *e, const h3r_request *r, int patch[3]) {
    if (r->struct_size < sizeof(h3r_request))
        return h3r_seterr(H3R_ERR_INVALID, "request struct is %u bytes; this engine needs %zu (ABI %d)",
                          r->struct_size, sizeof(h3r_request), H3R_ABI_VERSION);
    int mult = e->vae_stride_s * (patch[1] > patch[2] ? patch[1] : patch[2]);
    int fmul, foff;
    frame_rule(e->vae_stride_t, patch[0], &fmul, &foff);
    const int fmin = foff ? foff : fmul;
    if (r->width <= 0 || r->width % mult)
        return h3r_seterr(H3R_ERR_INVALID, "width=%d must be a positive multiple of %d (nearest: %d)", r->width,
                          mult, r->width <= mult ? mult : (r->width + mult / 2) / mult * mult);
    if (r->height <= 0 || r->height % mult)
        return h3r_seterr(H3R_ERR_INVALID, "height=%d must be a positive multiple of %d (nearest: %d)",
                          r->height, mult, r->height <= mult ? mult : (r->height + mult / 2) / mult * mult);
    if (r->frames < fmin || (r->frames - foff) % fmul) {
        int below = r->frames < fmin ? fmin : (r->frames - foff) / fmul * fmul + foff;
        int above = below + fmul;
        if (foff)
            return h3r_seterr(H3R_ERR_INVALID, "frames=%d must be %dk+%d (nearest: %d or %d)", r->frames, fmul,
                              foff, below, above);
        return h3r_seterr(H3R_ERR_INVALID, "frames=%d must be a positive multiple of %d (nearest: %d or %d)",
                          r->frames, fmul, below, above);
    }
    if (r->steps <= 0 || r->steps > 1000)
        return h3r_seterr(H3R_ERR_INVALID, "steps=%d must be between 1 and 1000", r->steps);
    if (!isfinite(r->guidance) || r->guidance < 0 || r->guidance > 100)
        return h3r_seterr(H3R_ERR_INVALID, "guidance=%g must be between 0 and 100", r->guidance);
    if (!isfinite(r->shift) || r->shift <= 0 || r->shift > 100)
        return h3r_seterr(H3R_ERR_INVALID, "shift=%g must be greater than 0 and at most 100", r->shift);
    if (r->sampler != H3R_SAMPLER_UNIPC && r->sampler != H3R_SAMPLER_EULER)
        return h3r_seterr(H3R_ERR_INVALID, "sampler=%d is not known (0 unipc, 1 euler)", r->sampler);
    if (r->n_prompt_ids < 0 || (r->n_prompt_ids > 0 && !r->prompt_ids))
        return h3r_seterr(H3R_ERR_INVALID, "prompt_ids: %d ids but no array", r->n_prompt_ids);
    if (r->n_negative_ids < 0 || (r->n_negative_ids > 0 && !r->negative_ids))
        return h3r_seterr(H3R_ERR_INVALID, "negative_ids: %d ids but no array", r->n_negative_ids);
    if (r->preview_every < 0) return h3r_seterr(H3R_ERR_INVALID, "preview_every=%d must be >= 0", r->preview_every);
    return 0;
}

static int has_nonfinite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 1;
    return 0;
}

static inline uint8_t to_u8(float v) {
    /* diffusers' postprocess: (x / 2 + 0.5).clamp(0, 1), then x * 255 rounded */
    float u = v / 2.0f + 0.5f;
    u = u < 0.0f ? 0.0f : u > 1.0f ? 1.0f : u;
    return (uint8_t)lrintf(u * 255.0f);
}

/* Convert frame f of a (3, F, H, W) video in [-1, 1] to (H, W, 3) uint8. */
static void frame_to_rgb(const float *video, int F, int H, int W, int f, uint8_t *rgb) {
    const int64_t plane = (int64_t)F * H * W;
    const float *r = video + (int64_t)f * H * W;
    for (int64_t i = 0; i < (int64_t)H * W; i++) {
        rgb[3 * i + 0] = to_u8(r[i]);
        rgb[3 * i + 1] = to_u8(r[plane + i]);
        rgb[3 * i + 2] = to_u8(r[2 * plane + i]);
    }
}

typedef struct {
    const h3r_request *req;
} vae_progress_ctx;

static int vae_progress(void *user, int done, int total) {
    const h3r_request *req = ((vae_progress_ctx *)user)->req;
    return req->on_progress ? req->on_progress(req->user, H3R_PHASE_DECODE, done, total) : 0;
}

/*
 * One render's plan: the components a request picks, its options and the
 * shapes it implies. h3r_generate renders from it; h3r_estimate_json sizes it.
 */
typedef struct {
    component *dit, *te, *vae;
    gen_opts opts;
    int C, T, Y, X;     /* latent channels and grid */
    int D, L;           /* text encoder width, text length */
    int F, H, W;        /* output frames, height, width */
    int cfg;            /* 1: a negative pass each step */
    int nth;            /* threads the render runs on */
    int64_t n;          /* latent elements C*T*Y*X */
} gen_plan;

/* Buffers h3r_generate allocates itself, in bytes: the table its mallocs take
 * their sizes from and the estimate sums. */
enum {
    GB_CTX,       /* (L, D) prompt context */
    GB_NEG,       /* (L, D) negative context, with guidance > 1 */
    GB_X,         /* (C, T, Y, X) latents */
    GB_V,         /* (C, T, Y, X) flow prediction */
    GB_VU,        /* (C, T, Y, X) unconditional prediction, with guidance > 1 */
    GB_RGB,       /* (H, W, 3) one frame for the frame callback */
    GB_LIVE,      /* the above live from start to end */
    GB_VIDEO = GB_LIVE, /* (3, F, H, W) decoded video, from the decode on */
    GB_PREVIEW_Z,       /* (C, Y, X) one preview's latent frame */
    GB_PREVIEW_FRAME,   /* (3, H, W) one preview's decoded frame */
    GB_PARTS
};

static void gen_sizes(const gen_plan *p, size_t sz[GB_PARTS]) {
    const size_t f = sizeof(float), ctx = (size_t)p->L * p->D * f, lat = (size_t)p->n * f;
    sz[GB_CTX] = ctx;
    sz[GB_NEG] = p->cfg ? ctx : 0;
    sz[GB_X] = sz[GB_V] = lat;
    sz[GB_VU] = p->cfg ? lat : 0;
    sz[GB_RGB] = (size_t)p->H * p->W * 3;
    sz[GB_VIDEO] = (size_t)3 * p->F * p->H * p->W * f;
    sz[GB_PREVIEW_Z] = (size_t)p->C * p->Y * p->X * f;
    sz[GB_PREVIEW_FRAME] = (size_t)3 * p->H * p->W * f;
}

/* The prompt checks encode_context makes before it encodes: at most text_len
 * tokens, every id in the vocabulary. */
static int check_ids(h3r_engine *e, component *te, const int32_t *ids, int n) {
    if (n > e->text_len)
        return h3r_seterr(H3R_ERR_INVALID, "prompt has %d tokens; the model takes at most text_len=%d", n, e->text_len);
    return umt5_check_ids(te->model, ids, n);
}

/*
 * Pick the components, validate the request and its options, check the
 * components agree, derive the shapes and check them against each
 * component's limits. Every check of a render is made here, before anything
 * is allocated, so the estimate refuses what generate refuses, with the same
 * message. Returns 0 or a negative code (message set).
 */
static int plan_request(h3r_engine *e, const h3r_request *req, gen_plan *p) {
    int rc;
    memset(p, 0, sizeof(*p));
    if ((rc = pick_dit(e, req->quant, &p->dit)) ||
        (rc = pick_small(e, e->te, e->n_te, "text_encoder", req->quant, 0, &p->te)) ||
        (rc = pick_small(e, e->vae, e->n_vae, "vae", req->quant, 0, &p->vae)))
        return rc;
    int patch[3];
    wan_dit_patch_size(p->dit->model, patch);
    if ((rc = validate_request(e, req, patch)) || (rc = parse_options(req->options, &p->opts))) return rc;

    const int C = wan_dit_in_channels(p->dit->model);
    if (wan_vae_z_dim(p->vae->model) != C || wan_dit_out_channels(p->dit->model) != C)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: transformer channels (%d in, %d out) do not match the VAE's z_dim %d",
                          e->dir, C, wan_dit_out_channels(p->dit->model), wan_vae_z_dim(p->vae->model));
    if (umt5_d_model(p->te->model) != wan_dit_text_dim(p->dit->model))
        return h3r_seterr(H3R_ERR_FORMAT, "%s: text encoder width %d does not match the transformer's text_dim %d",
                          e->dir, umt5_d_model(p->te->model), wan_dit_text_dim(p->dit->model));
    p->C = C;
    p->T = (req->frames - 1) / e->vae_stride_t + 1;
    p->Y = req->height / e->vae_stride_s;
    p->X = req->width / e->vae_stride_s;
    p->n = (int64_t)C * p->T * p->Y * p->X;
    p->D = umt5_d_model(p->te->model);
    p->L = e->text_len;
    p->cfg = req->guidance > 1.0f;
    p->F = 1 + e->vae_stride_t * (p->T - 1);
    p->H = req->height;
    p->W = req->width;
    p->nth = req->threads <= 0 ? h3r_pool_size(e->pool) : h3r_pool_threads(req->threads);

    if (req->init_latents && req->n_init_latents != p->n)
        return h3r_seterr(H3R_ERR_INVALID,
                          "init_latents has %lld values; a %dx%d, %d-frame video needs (%d, %d, %d, %d) = %lld",
                          (long long)req->n_init_latents, p->W, p->H, req->frames, C, p->T, p->Y, p->X,
                          (long long)p->n);
    if (req->out_latents && req->n_out_latents != p->n)
        return h3r_seterr(H3R_ERR_INVALID, "out_latents holds %lld values; needs %lld", (long long)req->n_out_latents,
                          (long long)p->n);
    /* the components' own limits (rope table, VAE grid, prompt), before any buffer is sized */
    if ((rc = wan_dit_check_shape(p->dit->model, C, p->T, p->Y, p->X, p->L)) ||
        (rc = wan_vae_check_shape(p->vae->model, C, p->T, p->Y, p->X)) ||
        (rc = check_ids(e, p->te, req->prompt_ids, req->n_prompt_ids)) ||
        (p->cfg && (rc = check_ids(e, p->te, req->negative_ids, req->n_negative_ids))))
        return rc;
    return 0;
}

/*
 * A cheap preview after denoising step `step`: the flow model's current
 * estimate of the clean latents, x0 = x - sigma * v, for latent frame 0 only,
 * de-normalised and decoded by the VAE into one RGB frame. Costs one
 * single-frame VAE decode. Returns 0, or H3R_ERR_CANCELED if on_frame asks.
 */
static int send_preview(const gen_plan *gp, const size_t sz[GB_PARTS], h3r_pool *pool, const h3r_request *req,
                        int step, const float *x, const float *v, float sigma, uint8_t *rgb) {
    const int C = gp->C, Y = gp->Y, X = gp->X, H = gp->H, W = gp->W;
    const int64_t plane = (int64_t)Y * X, tplane = (int64_t)gp->T * plane;
    float *z = malloc(sz[GB_PREVIEW_Z]);
    float *frame = malloc(sz[GB_PREVIEW_FRAME]);
    int rc = 0;
    if (!z || !frame) {
        rc = h3r_seterr(H3R_ERR_NOMEM, "out of memory for a preview frame");
        goto out;
    }
    const float *mean = wan_vae_latents_mean(gp->vae->model), *std = wan_vae_latents_std(gp->vae->model);
    for (int c = 0; c < C; c++) {
        const float inv_std = 1.0f / std[c];
        for (int64_t k = 0; k < plane; k++) {
            float x0 = x[c * tplane + k] - sigma * v[c * tplane + k];
            z[c * plane + k] = x0 / inv_std + mean[c];
        }
    }
    if ((rc = wan_vae_decode(gp->vae->model, pool, z, C, 1, Y, X, frame, NULL, NULL, NULL, NULL))) goto out;
    frame_to_rgb(frame, 1, H, W, 0, rgb);
    if (req->on_frame(req->user, H3R_FRAME_PREVIEW, step, W, H, rgb))
        rc = h3r_seterr(H3R_ERR_CANCELED, "canceled by the frame callback");
out:
    free(z);
    free(frame);
    return rc;
}

/* Encode ids into a zero-padded (text_len, dim) context. */
static int encode_context(h3r_engine *e, component *te, h3r_pool *pool, const int32_t *ids, int n, float *ctx) {
    int rc = check_ids(e, te, ids, n);
    if (rc) return rc;
    memset(ctx, 0, (size_t)e->text_len * umt5_d_model(te->model) * sizeof(float));
    if (n == 0) return 0;
    return umt5_encode(te->model, pool, ids, n, ctx, e->tap, e->tap_user);
}

/*
 * One render: encode prompt (and negative prompt when guidance > 1), draw or
 * take the initial noise, run the sampler with classifier-free guidance
 *     v = v_neg + guidance * (v_pos - v_neg)
 * checking the latents for NaN/Inf after every step, de-normalise
 *     z = x / (1 / latents_std) + latents_mean      (as WanPipeline does)
 * decode with the VAE and hand every frame to on_frame as RGB uint8.
 * Returns 0, H3R_ERR_CANCELED when a callback asked to stop, or another
 * negative code with the message set. Frees everything it allocated.
 */
H3R_API int h3r_generate(h3r_engine *e, const h3r_request *req) {
    h3r_clear_error();
    if (!e || !req) return h3r_seterr(H3R_ERR_INVALID, "h3r_generate: NULL argument");
    int rc;
    gen_plan gp;
    if ((rc = plan_request(e, req, &gp))) return fail(e, rc);
    component *dit = gp.dit, *te = gp.te, *vae = gp.vae;
    const gen_opts opts = gp.opts;
    const int C = gp.C, T = gp.T, Y = gp.Y, X = gp.X, L = gp.L, cfg = gp.cfg;
    const int F = gp.F, H = gp.H, W = gp.W;
    const int64_t n = gp.n;
    size_t sz[GB_PARTS];
    gen_sizes(&gp, sz);

    h3r_pool *temp_pool;
    h3r_pool *pool = pool_for(e, req->threads, &temp_pool);
    if (!pool) return fail(e, H3R_ERR_NOMEM);

    float *ctx = NULL, *neg = NULL, *x = NULL, *v = NULL, *vu = NULL, *video = NULL;
    uint8_t *rgb = NULL;
    h3r_sampler *s = NULL;
    ctx = calloc(1, sz[GB_CTX]);
    neg = sz[GB_NEG] ? calloc(1, sz[GB_NEG]) : NULL;
    x = malloc(sz[GB_X]);
    v = malloc(sz[GB_V]);
    vu = sz[GB_VU] ? malloc(sz[GB_VU]) : NULL;
    rgb = malloc(sz[GB_RGB]);
    if (!ctx || (cfg && !neg) || !x || !v || (cfg && !vu) || !rgb) {
        rc = h3r_seterr(H3R_ERR_NOMEM, "out of memory for a %dx%d, %d-frame render", W, H, req->frames);
        goto done;
    }

#define PROGRESS(phase, d, t)                                                                             \
    do {                                                                                                  \
        if (req->on_progress && req->on_progress(req->user, (phase), (d), (t))) {                         \
            rc = h3r_seterr(H3R_ERR_CANCELED, "canceled by the progress callback");                       \
            goto done;                                                                                    \
        }                                                                                                 \
    } while (0)

    PROGRESS(H3R_PHASE_ENCODE, 0, cfg ? 2 : 1);
    if ((rc = encode_context(e, te, pool, req->prompt_ids, req->n_prompt_ids, ctx))) goto done;
    PROGRESS(H3R_PHASE_ENCODE, 1, cfg ? 2 : 1);
    if (cfg) {
        if ((rc = encode_context(e, te, pool, req->negative_ids, req->n_negative_ids, neg))) goto done;
        PROGRESS(H3R_PHASE_ENCODE, 2, 2);
    }

    if (req->init_latents) memcpy(x, req->init_latents, (size_t)n * sizeof(float));
    else h3r_randn(req->seed, x, n);

    if ((rc = sampler_create(req->sampler, req->steps, req->shift, n, &s))) goto done;
    const float *timesteps = sampler_timesteps(s);
    if (opts.prewarm) gguf_prewarm(dit->file);
    PROGRESS(H3R_PHASE_DENOISE, 0, req->steps);
    for (int i = 0; i < req->steps; i++) {
        if (opts.crash_at_step == i) raise(SIGSEGV); /* test trigger, see parse_options */
        if ((rc = wan_dit_forward(dit->model, pool, x, C, T, Y, X, timesteps[i], ctx, L, v, e->tap, e->tap_user)))
            goto done;
        if (cfg) {
            if ((rc = wan_dit_forward(dit->model, pool, x, C, T, Y, X, timesteps[i], neg, L, vu, e->tap, e->tap_user)))
                goto done;
            const float g = req->guidance;
            for (int64_t k = 0; k < n; k++) v[k] = vu[k] + g * (v[k] - vu[k]);
        }
        if (req->preview_every > 0 && req->on_frame && ((i + 1) % req->preview_every == 0 || i + 1 == req->steps)) {
            if ((rc = send_preview(&gp, sz, pool, req, i, x, v, sampler_sigmas(s)[i], rgb))) goto done;
        }
        if ((rc = sampler_step(s, i, v, x))) goto done;
        if (has_nonfinite(x, n)) {
            rc = h3r_seterr(H3R_ERR_NUMERIC, "NaN or Inf in the latents after denoising step %d of %d", i + 1,
                            req->steps);
            goto done;
        }
        PROGRESS(H3R_PHASE_DENOISE, i + 1, req->steps);
    }
    if (req->out_latents) memcpy(req->out_latents, x, (size_t)n * sizeof(float));

    {
        const float *mean = wan_vae_latents_mean(vae->model), *std = wan_vae_latents_std(vae->model);
        const int64_t plane = (int64_t)T * Y * X;
        for (int c = 0; c < C; c++) {
            const float inv_std = 1.0f / std[c];
            for (int64_t k = 0; k < plane; k++) x[c * plane + k] = x[c * plane + k] / inv_std + mean[c];
        }
    }
    video = malloc(sz[GB_VIDEO]);
    if (!video) {
        rc = h3r_seterr(H3R_ERR_NOMEM, "out of memory for the decoded video (%zu bytes)", sz[GB_VIDEO]);
        goto done;
    }
    vae_progress_ctx vctx = {req};
    PROGRESS(H3R_PHASE_DECODE, 0, T);
    rc = wan_vae_decode(vae->model, pool, x, C, T, Y, X, video, vae_progress, &vctx, e->tap, e->tap_user);
    if (rc) {
        if (rc == H3R_ERR_CANCELED) h3r_seterr(H3R_ERR_CANCELED, "canceled by the progress callback");
        goto done;
    }
    if (req->on_frame) {
        for (int f = 0; f < F; f++) {
            frame_to_rgb(video, F, H, W, f, rgb);
            if (req->on_frame(req->user, H3R_FRAME_FINAL, f, W, H, rgb)) {
                rc = h3r_seterr(H3R_ERR_CANCELED, "canceled by the frame callback");
                goto done;
            }
        }
    }
    rc = 0;
#undef PROGRESS

done:
    sampler_free(s);
    free(ctx);
    free(neg);
    free(x);
    free(v);
    free(vu);
    free(video);
    free(rgb);
    if (temp_pool) h3r_pool_free(temp_pool);
    return rc ? fail(e, rc) : 0;
}

/* ---------------------------------------------------------------- estimate */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static const char *base_name(const gguf_file *g) {
    const char *p = gguf_path(g), *slash = strrchr(p, '/');
    return slash ? slash + 1 : p;
}

/*
 * Peak bytes of the render `req` describes, from the size tables its
 * allocations use (h3render.h documents the JSON). Runs plan_request, so a
 * request generate would refuse is refused with the same code and message;
 * allocates nothing that scales with the request.
 */
H3R_API int h3r_estimate_json(h3r_engine *e, const h3r_request *req, const char **out) {
    h3r_clear_error();
    if (out) *out = NULL;
    if (!e || !req || !out) return h3r_seterr(H3R_ERR_INVALID, "h3r_estimate_json: NULL argument");
    gen_plan gp;
    int rc = plan_request(e, req, &gp);
    if (rc) return fail(e, rc);
    size_t sz[GB_PARTS];
    gen_sizes(&gp, sz);
    int64_t live = 0;
    for (int i = 0; i < GB_LIVE; i++) live += (int64_t)sz[i];
    const int64_t text = max64(umt5_encode_bytes(gp.te->model, req->n_prompt_ids, gp.nth),
                               gp.cfg ? umt5_encode_bytes(gp.te->model, req->n_negative_ids, gp.nth) : 0);
    const int64_t sampler = sampler_bytes(req->sampler, req->steps, gp.n);
    const int64_t dit = wan_dit_forward_bytes(gp.dit->model, gp.T, gp.Y, gp.X, gp.L, gp.nth);
    const int64_t vae = wan_vae_decode_bytes(gp.vae->model, gp.T, gp.Y, gp.X, gp.nth, e->tap != NULL);
    /* previews counted whenever asked for: the estimate has no frame callback to look at */
    const int64_t preview_vae = req->preview_every > 0 ? wan_vae_decode_bytes(gp.vae->model, 1, gp.Y, gp.X, gp.nth, 0)
                                                       : 0;
    if (dit < 0 || vae < 0 || preview_vae < 0) {
        h3r_seterr(H3R_ERR_NOMEM, "estimate: the scratch size of a %dx%d, %d-frame render overflows", gp.W, gp.H,
                   req->frames);
        return fail(e, H3R_ERR_NOMEM);
    }
    const int64_t preview =
        req->preview_every > 0 ? (int64_t)(sz[GB_PREVIEW_Z] + sz[GB_PREVIEW_FRAME]) + preview_vae : 0;
    const int64_t encode = live + text;
    const int64_t denoise = live + sampler + max64(dit, preview);
    const int64_t decode = live + sampler + (int64_t)sz[GB_VIDEO] + vae;
    const component *files[3] = {gp.dit, gp.te, gp.vae};
    static const char *kinds[3] = {"transformer", "text_encoder", "vae"};
    int64_t weights = 0;
    for (int i = 0; i < 3; i++) weights += (int64_t)gguf_bound_bytes(files[i]->file);
    int patch[3];
    wan_dit_patch_size(gp.dit->model, patch);
    const int64_t tokens = (int64_t)(gp.T / patch[0]) * (gp.Y / patch[1]) * (gp.X / patch[2]);

    size_t len = 0, cap = 1024;
    char *b = malloc(cap);
    int r = b ? 0 : -1;
    if (b) b[0] = 0;
    if (!r)
        r |= appendf(&b, &len, &cap,
                     "{\"weights\":%lld,\"encode\":%lld,\"denoise\":%lld,\"decode\":%lld,\"total\":%lld,"
                     "\"threads\":%d,\"tokens\":%lld,\"latent\":[%d,%d,%d,%d],\"files\":{",
                     (long long)weights, (long long)encode, (long long)denoise, (long long)decode,
                     (long long)(weights + max64(encode, max64(denoise, decode))), gp.nth, (long long)tokens, gp.C,
                     gp.T, gp.Y, gp.X);
    for (int i = 0; i < 3 && !r; i++) {
        r |= appendf(&b, &len, &cap, "%s\"%s\":{\"file\":", i ? "," : "", kinds[i]);
        r |= append_json_str(&b, &len, &cap, base_name(files[i]->file));
        r |= appendf(&b, &len, &cap, ",\"bytes\":%zu,\"read\":%zu}", gguf_mapped_bytes(files[i]->file),
                     gguf_bound_bytes(files[i]->file));
    }
    if (!r)
        r |= appendf(&b, &len, &cap,
                     "},\"parts\":{\"buffers\":%lld,\"text_encoder\":%lld,\"sampler\":%lld,\"dit_forward\":%lld,"
                     "\"preview\":%lld,\"video\":%zu,\"vae_decode\":%lld}}",
                     (long long)live, (long long)text, (long long)sampler, (long long)dit, (long long)preview,
                     sz[GB_VIDEO], (long long)vae);
    if (r) {
        free(b);
        h3r_seterr(H3R_ERR_NOMEM, "h3r_estimate_json: out of memory");
        return fail(e, H3R_ERR_NOMEM);
    }
    free(e->estimate_json);
    e->estimate_json = b;
    *out = b;
    return 0;
}
