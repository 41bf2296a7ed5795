/*
 * Wan 2.1 causal 3D VAE decoder, as diffusers' AutoencoderKLWan decodes:
 *
 *   z (C, T, Y, X) -> post_quant_conv (1x1x1)
 *     -> for each latent frame i (a "chunk"), with a per-conv causal cache:
 *          conv_in (3x3x3) -> mid block (res, attention, res)
 *          -> up blocks: (num_res_blocks + 1) residual blocks, then except for
 *             the last block an upsampler (upsample3d: time_conv doubles the
 *             frames, then nearest 2x + Conv2d 3x3; upsample2d: only the latter)
 *          -> RMS norm, SiLU, conv_out (3x3x3)
 *     -> clamp to [-1, 1]   video (3, 1 + 4 (T - 1), 8 Y, 8 X) for Wan's layout.
 *
 * Causal cache. diffusers keeps, for every causal conv, the last CACHE_T = 2
 * frames of that conv's input across chunks (feat_cache). Because every chunk
 * after the first has at least one frame, that cache always holds the last two
 * frames of the conv's whole input stream, and the first chunk sees two zero
 * frames of causal padding. So each 3x3x3 conv here keeps a two-frame history
 * of its input, zero-initialised, and convolves [history, chunk]. The upsample3d
 * time_conv is the exception ("Rep" in diffusers): on the first chunk it is not
 * applied at all (the frame is not doubled), and from the second chunk on it
 * runs with zero padding, so its history starts at zero at chunk 1. Chunk 0
 * therefore yields one video frame and each later chunk 2^(temporal upsamples).
 *
 * Layout. Activations are channels-last per frame, (t, P, C) with P = H*W
 * pixels, so a conv is an im2col gather into a bounded tile of rows followed by
 * op_matmul against the weight stored (out, in*kt*ky*kx), and the attention
 * block's per-frame single head is op_attention on (P, C) rows directly. The
 * output is written channel-first (3, F, H, W) as the ABI wants.
 *
 * Memory. Scratch is sized from one chunk (at most 2^(temporal upsamples)
 * frames at each stage) plus the two-frame caches, never from T.
 *
 * Dimension letters (see internal.h): C channels, T latent frames, Y X latent
 * height and width, t frames in one chunk at a stage, H W pixel height and width
 * at a stage, P = H*W, K = in*kt*ky*kx, M output channels.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "models.h"

#define VAE_MAX_UP 6          /* up blocks (len(dim_mult)); Wan has 4 */
#define VAE_MAX_RES 16        /* residual blocks per up block (num_res_blocks + 1) */
#define VAE_MAX_DIM 8192      /* channels at any stage */
#define VAE_MAX_LATENT 4096   /* T, Y and X of one decode, each */
#define VAE_TILE_FLOATS (1 << 20) /* im2col tile budget, floats (4 MiB; 16 MiB measured slower) */
#define VAE_NORM_EPS 1e-12f   /* F.normalize's eps */

/* ================================================================ weights */

/* A convolution: W (M, K) as stored, K = cin*kt*ky*kx in (ci, dt, dy, dx) order;
 * b (M,) F32. Spatial padding is (k - 1) / 2 (Wan uses padding 1 for 3x3 and
 * 0 for 1x1); time padding is causal, through the cache. */
typedef struct {
    const h3r_tensor *w;  /* ne = {K, M} */
    const h3r_tensor *b;  /* ne = {M} */
    int cin, cout, kt, ky, kx;
} vae_conv;

typedef struct {
    int cin, cout;
    const float *gamma1;   /* (cin,) */
    vae_conv conv1;        /* cin -> cout, 3x3x3 causal */
    const float *gamma2;   /* (cout,) */
    vae_conv conv2;        /* cout -> cout, 3x3x3 causal */
    int has_shortcut;
    vae_conv shortcut;     /* cin -> cout, 1x1x1, when cin != cout */
} vae_res;

typedef struct {
    int dim;
    const float *gamma;    /* (dim,) */
    vae_conv qkv;          /* dim -> 3 dim, 1x1 */
    vae_conv proj;         /* dim -> dim, 1x1 */
} vae_attn;

enum { UP_NONE = 0, UP_2D = 1, UP_3D = 2 };

typedef struct {
    int cin, cout;          /* block input channels, residual output channels */
    int n_res;
    vae_res res[VAE_MAX_RES];
    int mode;               /* UP_* */
    vae_conv time_conv;     /* UP_3D: cout -> 2 cout, (3, 1, 1) causal */
    vae_conv resample;      /* UP_2D / UP_3D: cout -> cout / 2, 3x3 on the 2x image */
} vae_up;

struct wan_vae {
    const char *path;       /* owned by the gguf_file, for messages */
    int z_dim, dec_dim, n_up, num_res_blocks, n_temporal;
    float *latents_mean, *latents_std;  /* (z_dim,) each, owned */
    vae_conv post_quant;    /* z -> z, 1x1x1 */
    vae_conv conv_in;       /* z -> dims[0], 3x3x3 causal */
    vae_res mid_res[2];
    vae_attn mid_attn;
    vae_up up[VAE_MAX_UP];
    const float *gamma_out; /* (dims[n_up],) */
    vae_conv conv_out;      /* dims[n_up] -> 3, 3x3x3 causal */
    int n_slots;            /* causal caches: 3x3x3 convs + time_convs */
};

/* ================================================================ loading */

/* Name printf into buf (size 256); names from the config are short. */
#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)

/*
 * Find tensor `name`, check it has exactly `numel` elements over its dims and
 * is F32 (norm gammas and biases). Returns 0 and *out, or H3R_ERR_FORMAT
 * naming file and tensor.
 */
static int get_f32_vec(const gguf_file *g, const char *name, int64_t numel, const float **out) {
    const h3r_tensor *t = gguf_find(g, name);
    if (!t) return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is missing", gguf_path(g), name);
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (n != numel)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has %lld elements, expected %lld", gguf_path(g),
                          name, (long long)n, (long long)numel);
    if (t->type != GGML_TYPE_F32)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has type %s, expected f32", gguf_path(g), name,
                          ggml_type_name(t->type));
    return tensor_f32(t, out);
}

/*
 * Load "<prefix>.weight" and "<prefix>.bias" of a conv with original shape
 * (cout, cin, kt, ky, kx) (3-D conv) or (cout, cin, ky, kx) when conv2d. The
 * weight must be stored flattened 2-D (cout, K) with that original shape in
 * "h3r.shape.<prefix>.weight", and be F32 or F16; the bias F32 (cout,).
 */
static int get_conv(const gguf_file *g, const char *prefix, int cout, int cin, int kt, int ky, int kx,
                    int conv2d, vae_conv *cv) {
    char name[256], key[300];
    const char *path = gguf_path(g);
    int64_t K = (int64_t)cin * kt * ky * kx;
    snprintf(name, sizeof name, "%s.weight", prefix);
    const h3r_tensor *w = gguf_find(g, name);
    if (!w) return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
    if (w->n_dims != 2 || w->ne[0] != K || w->ne[1] != cout)
        return h3r_seterr(H3R_ERR_FORMAT,
                          "%s: tensor '%s' has ne=[%lld, %lld, %lld, %lld] (GGML order), expected the "
                          "flattened [%lld, %d] of a (%d, %d, %d, %d, %d) conv", path, name,
                          (long long)w->ne[0], (long long)w->ne[1], (long long)w->ne[2],
                          (long long)w->ne[3], (long long)K, cout, cout, cin, kt, ky, kx);
    if (w->type != GGML_TYPE_F32 && w->type != GGML_TYPE_F16)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has type %s; the VAE takes f32 or f16", path, name,
                          ggml_type_name(w->type));
    /* The original shape says which axis is which; K alone cannot. */
    int64_t shp[8];
    int n = 0;
    snprintf(key, sizeof key, "h3r.shape.%s", name);
    int rc = gguf_get_int_array(g, key, shp, 8, &n);
    if (rc) return rc;
    int64_t want[5] = {cout, cin, kt, ky, kx};
    const int64_t *wp = conv2d ? (int64_t[4]){cout, cin, ky, kx} : want;
    int wn = conv2d ? 4 : 5;
    int ok = n == wn;
    for (int i = 0; ok && i < wn; i++) ok = shp[i] == wp[i];
    if (!ok) {
        char got[128];
        int off = 0;
        for (int i = 0; i < n && off < (int)sizeof got - 24; i++)
            off += snprintf(got + off, sizeof got - off, "%s%lld", i ? ", " : "", (long long)shp[i]);
        got[off] = 0;
        if (conv2d)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: '%s' is (%s), expected (%d, %d, %d, %d)", path, key, got,
                              cout, cin, ky, kx);
        return h3r_seterr(H3R_ERR_FORMAT, "%s: '%s' is (%s), expected (%d, %d, %d, %d, %d)", path, key, got,
                          cout, cin, kt, ky, kx);
    }
    snprintf(name, sizeof name, "%s.bias", prefix);
    const h3r_tensor *b = gguf_find(g, name);
    if (!b) return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
    if (b->n_dims != 1 || b->ne[0] != cout || b->type != GGML_TYPE_F32)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is %s with %lld elements, expected f32 (%d,)", path,
                          name, ggml_type_name(b->type), (long long)(b->ne[0] * b->ne[1] * b->ne[2] * b->ne[3]),
                          cout);
    cv->w = w;
    cv->b = b;
    cv->cin = cin;
    cv->cout = cout;
    cv->kt = kt;
    cv->ky = ky;
    cv->kx = kx;
    return 0;
}

/* One WanResidualBlock under `prefix`: norm1, conv1, norm2, conv2, and
 * conv_shortcut when cin != cout. Adds its two causal convs to *slots. */
static int get_res(const gguf_file *g, const char *prefix, int cin, int cout, vae_res *r, int *slots) {
    char name[256];
    int rc;
    r->cin = cin;
    r->cout = cout;
    if ((rc = get_f32_vec(g, NAME("%s.norm1.gamma", prefix), cin, &r->gamma1))) return rc;
    if ((rc = get_conv(g, NAME("%s.conv1", prefix), cout, cin, 3, 3, 3, 0, &r->conv1))) return rc;
    if ((rc = get_f32_vec(g, NAME("%s.norm2.gamma", prefix), cout, &r->gamma2))) return rc;
    if ((rc = get_conv(g, NAME("%s.conv2", prefix), cout, cout, 3, 3, 3, 0, &r->conv2))) return rc;
    r->has_shortcut = cin != cout;
    if (r->has_shortcut &&
        (rc = get_conv(g, NAME("%s.conv_shortcut", prefix), cout, cin, 1, 1, 1, 0, &r->shortcut)))
        return rc;
    if (!r->has_shortcut && gguf_find(g, NAME("%s.conv_shortcut.weight", prefix)))
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is present but the block maps %d -> %d channels",
                          gguf_path(g), name, cin, cout);
    *slots += 2;
    return 0;
}

/* Read an optional int config key; absent keeps *out. */
static int opt_int(const gguf_file *g, const char *key, int64_t *out) {
    return gguf_has_key(g, key) ? gguf_get_int(g, key, out) : 0;
}

/* Fail with a message naming file, key, value and the allowed range. */
static int check_range(const gguf_file *g, const char *key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: config '%s' = %lld, allowed %lld..%lld", gguf_path(g), key,
                          (long long)v, (long long)lo, (long long)hi);
    return 0;
}

/*
 * Build a wan_vae from a converted vae-<quant>.gguf: validate the config
 * (h3r.z_dim, h3r.base_dim / h3r.decoder_base_dim, h3r.dim_mult,
 * h3r.num_res_blocks, h3r.temperal_downsample, h3r.latents_mean/std, and that
 * is_residual, patch_size, out_channels describe Wan 2.1) and the type and
 * shape of every decoder tensor. Returns 0 and *out, or a negative code with a
 * message naming file, key or tensor; *out is NULL then. Allocates the struct
 * and the latents_mean / latents_std copies.
 */
int wan_vae_load(const gguf_file *g, wan_vae **out) {
    *out = NULL;
    const char *path = gguf_path(g);
    char name[256];
    int rc;
    int64_t z_dim, base_dim, dec_dim, nrb, out_ch = 3, is_res = 0;
    if ((rc = gguf_get_int(g, "h3r.z_dim", &z_dim))) return rc;
    if ((rc = check_range(g, "h3r.z_dim", z_dim, 1, VAE_MAX_DIM))) return rc;
    if ((rc = gguf_get_int(g, "h3r.base_dim", &base_dim))) return rc;
    if ((rc = check_range(g, "h3r.base_dim", base_dim, 1, VAE_MAX_DIM))) return rc;
    dec_dim = base_dim;
    if ((rc = opt_int(g, "h3r.decoder_base_dim", &dec_dim))) return rc;
    if ((rc = check_range(g, "h3r.decoder_base_dim", dec_dim, 1, VAE_MAX_DIM))) return rc;
    if ((rc = gguf_get_int(g, "h3r.num_res_blocks", &nrb))) return rc;
    if ((rc = check_range(g, "h3r.num_res_blocks", nrb, 0, VAE_MAX_RES - 1))) return rc;
    if ((rc = opt_int(g, "h3r.out_channels", &out_ch))) return rc;
    if (out_ch != 3)
        return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: config 'h3r.out_channels' = %lld, only 3 (RGB) is supported",
                          path, (long long)out_ch);
    if (gguf_has_key(g, "h3r.is_residual")) {
        int b = 0;
        if ((rc = gguf_get_bool(g, "h3r.is_residual", &b))) return rc;
        is_res = b;
    }
    if (is_res)
        return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: config 'h3r.is_residual' is true (the Wan 2.2 VAE); only the "
                          "Wan 2.1 decoder (is_residual false) is supported", path);
    if (gguf_has_key(g, "h3r.patch_size"))
        return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: config 'h3r.patch_size' is set; only the Wan 2.1 VAE "
                          "(patch_size null) is supported", path);

    int64_t mult[VAE_MAX_UP], td[VAE_MAX_UP];
    int n_up = 0, n_td = 0;
    if ((rc = gguf_get_int_array(g, "h3r.dim_mult", mult, VAE_MAX_UP, &n_up))) return rc;
    if (n_up < 1)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: config 'h3r.dim_mult' is empty (1..%d entries allowed)", path,
                          VAE_MAX_UP);
    for (int i = 0; i < n_up; i++)
        if (mult[i] < 1 || mult[i] * dec_dim > VAE_MAX_DIM)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: config 'h3r.dim_mult'[%d] = %lld, allowed 1..%lld", path, i,
                              (long long)mult[i], (long long)(VAE_MAX_DIM / dec_dim));
    if (n_up > 1) {
        if ((rc = gguf_get_int_array(g, "h3r.temperal_downsample", td, VAE_MAX_UP, &n_td))) return rc;
        if (n_td != n_up - 1)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: config 'h3r.temperal_downsample' has %d entries; with %d "
                              "'h3r.dim_mult' entries it must have %d", path, n_td, n_up, n_up - 1);
    }

    wan_vae *m = calloc(1, sizeof(*m));
    if (!m) return h3r_seterr(H3R_ERR_NOMEM, "%s: out of memory for the VAE", path);
    m->path = path;
    m->z_dim = (int)z_dim;
    m->dec_dim = (int)dec_dim;
    m->n_up = n_up;
    m->num_res_blocks = (int)nrb;
    m->latents_mean = malloc(sizeof(float) * z_dim);
    m->latents_std = malloc(sizeof(float) * z_dim);
    double *tmp = malloc(sizeof(double) * z_dim);
    if (!m->latents_mean || !m->latents_std || !tmp) {
        free(tmp);
        wan_vae_free(m);
        return h3r_seterr(H3R_ERR_NOMEM, "%s: out of memory for the VAE", path);
    }
    static const char *stat_keys[2] = {"h3r.latents_mean", "h3r.latents_std"};
    for (int s = 0; s < 2; s++) {
        int n = 0;
        rc = gguf_get_float_array(g, stat_keys[s], tmp, (int)z_dim, &n);
        if (rc == 0 && n != z_dim)
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: config '%s' has %d entries, expected z_dim = %lld", path,
                            stat_keys[s], n, (long long)z_dim);
        for (int i = 0; rc == 0 && i < n; i++) {
            if (!isfinite(tmp[i]) || (s == 1 && !(tmp[i] > 0)))
                rc = h3r_seterr(H3R_ERR_FORMAT, "%s: config '%s'[%d] = %g, expected a finite%s number", path,
                                stat_keys[s], i, tmp[i], s ? " positive" : "");
            (s ? m->latents_std : m->latents_mean)[i] = (float)tmp[i];
        }
        if (rc) break;
    }
    free(tmp);
    if (rc) goto fail;

    /* dims = dec_dim * [dim_mult[-1]] + dec_dim * dim_mult[::-1] (WanDecoder3d). */
    int dims[VAE_MAX_UP + 1];
    dims[0] = (int)(dec_dim * mult[n_up - 1]);
    for (int i = 0; i < n_up; i++) dims[i + 1] = (int)(dec_dim * mult[n_up - 1 - i]);

    int slots = 0;
    if ((rc = get_conv(g, "post_quant_conv", m->z_dim, m->z_dim, 1, 1, 1, 0, &m->post_quant))) goto fail;
    if ((rc = get_conv(g, "decoder.conv_in", dims[0], m->z_dim, 3, 3, 3, 0, &m->conv_in))) goto fail;
    slots++;
    for (int r = 0; r < 2; r++)
        if ((rc = get_res(g, NAME("decoder.mid_block.resnets.%d", r), dims[0], dims[0], &m->mid_res[r], &slots)))
            goto fail;
    m->mid_attn.dim = dims[0];
    if ((rc = get_f32_vec(g, "decoder.mid_block.attentions.0.norm.gamma", dims[0], &m->mid_attn.gamma))) goto fail;
    if ((rc = get_conv(g, "decoder.mid_block.attentions.0.to_qkv", 3 * dims[0], dims[0], 1, 1, 1, 1,
                       &m->mid_attn.qkv)))
        goto fail;
    if ((rc = get_conv(g, "decoder.mid_block.attentions.0.proj", dims[0], dims[0], 1, 1, 1, 1, &m->mid_attn.proj)))
        goto fail;

    for (int i = 0; i < n_up; i++) {
        vae_up *u = &m->up[i];
        /* Wan 2.1: every block after the first gets the previous upsampler's dim / 2. */
        u->cin = i == 0 ? dims[0] : dims[i] / 2;
        u->cout = dims[i + 1];
        if (u->cin < 1) {
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: up block %d would have %d input channels (decoder dims %d / 2)",
                            path, i, u->cin, dims[i]);
            goto fail;
        }
        u->n_res = m->num_res_blocks + 1;
        for (int r = 0; r < u->n_res; r++)
            if ((rc = get_res(g, NAME("decoder.up_blocks.%d.resnets.%d", i, r), r ? u->cout : u->cin, u->cout,
                              &u->res[r], &slots)))
                goto fail;
        /* temperal_upsample = temperal_downsample[::-1], indexed by block. */
        u->mode = i == n_up - 1 ? UP_NONE : td[n_td - 1 - i] ? UP_3D : UP_2D;
        if (u->mode != UP_NONE && u->cout / 2 < 1) {
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: up block %d has %d channels, too few to upsample", path, i,
                            u->cout);
            goto fail;
        }
        if (u->mode == UP_3D) {
            if ((rc = get_conv(g, NAME("decoder.up_blocks.%d.upsamplers.0.time_conv", i), 2 * u->cout, u->cout, 3,
                               1, 1, 0, &u->time_conv)))
                goto fail;
            slots++;
            m->n_temporal++;
        } else if (gguf_find(g, NAME("decoder.up_blocks.%d.upsamplers.0.time_conv.weight", i))) {
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is present but config 'h3r.temperal_downsample' "
                            "gives up block %d no temporal upsampling", path, name, i);
            goto fail;
        }
        if (u->mode != UP_NONE) {
            if ((rc = get_conv(g, NAME("decoder.up_blocks.%d.upsamplers.0.resample.1", i), u->cout / 2, u->cout,
                               1, 3, 3, 1, &u->resample)))
                goto fail;
        } else if (gguf_find(g, NAME("decoder.up_blocks.%d.upsamplers.0.resample.1.weight", i))) {
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is present but the last up block does not upsample",
                            path, name);
            goto fail;
        }
    }
    if (gguf_find(g, NAME("decoder.up_blocks.%d.resnets.0.conv1.weight", n_up)) ||
        gguf_find(g, NAME("decoder.up_blocks.0.resnets.%d.conv1.weight", m->num_res_blocks + 1))) {
        rc = h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is present but config 'h3r.dim_mult' / "
                        "'h3r.num_res_blocks' give no such block", path, name);
        goto fail;
    }
    if ((rc = get_f32_vec(g, "decoder.norm_out.gamma", dims[n_up], &m->gamma_out))) goto fail;
    if ((rc = get_conv(g, "decoder.conv_out", 3, dims[n_up], 3, 3, 3, 0, &m->conv_out))) goto fail;
    slots++;
    m->n_slots = slots;
    *out = m;
    return 0;
fail:
    wan_vae_free(m);
    return rc;
}

void wan_vae_free(wan_vae *m) {
    if (!m) return;
    free(m->latents_mean);
    free(m->latents_std);
    free(m);
}

int wan_vae_z_dim(const wan_vae *m) { return m->z_dim; }
const float *wan_vae_latents_mean(const wan_vae *m) { return m->latents_mean; }
const float *wan_vae_latents_std(const wan_vae *m) { return m->latents_std; }

/* ================================================================ kernels */

/* Two frames of one causal conv's input stream: buf (2, P, C), zeros at first. */
typedef struct {
    float *buf;
    int64_t frame;          /* P * C floats */
} vae_cache;

/* Run state of one decode: every buffer the decode writes, freed at the end. */
typedef struct {
    const wan_vae *m;
    h3r_pool *pool;
    float *col;              /* im2col tile, col_cap floats */
    int64_t col_cap;
    vae_cache *caches;       /* n_slots, allocated on first use */
    const int64_t *slot_frame; /* n_slots: P * cin of each slot's conv (cache_frames) */
    int slot;                /* next cache slot in this chunk (diffusers' feat_idx) */
    int chunk;               /* latent frame index */
} vae_run;

/* im2col gather job: rows [r0, r0 + rows) of output pixels of one frame. */
typedef struct {
    float *col;                  /* (rows, K) */
    const float *src[3];         /* kt source frames, each (Hs*Ws, cin) */
    int cin, kt, ky, kx, up;     /* up: nearest upsampling factor of the source (1 or 2) */
    int Hs, Ws, Ho, Wo;          /* source and output frame sizes */
    int64_t r0, rows;
} vae_gather;

/*
 * Fill col rows for pixels r0.. of the output frame: col[r][((ci*kt + dt)*ky
 * + dy)*kx + dx] = src[dt][(sy, sx), ci] with (sy, sx) the source pixel of the
 * (upsampled) padded position, or 0 in the padding. Rows split by ith.
 */
static void gather_rows(void *ctx, int ith, int nth) {
    const vae_gather *a = ctx;
    int64_t per = (a->rows + nth - 1) / nth;
    int64_t lo = per * ith, hi = lo + per < a->rows ? lo + per : a->rows;
    const int ntap = a->kt * a->ky * a->kx, py = (a->ky - 1) / 2, px = (a->kx - 1) / 2;
    const int64_t K = (int64_t)a->cin * ntap;
    for (int64_t r = lo; r < hi; r++) {
        int64_t p = a->r0 + r;
        int oy = (int)(p / a->Wo), ox = (int)(p % a->Wo);
        float *row = a->col + r * K;
        for (int tap = 0; tap < ntap; tap++) {
            int dt = tap / (a->ky * a->kx), dy = (tap / a->kx) % a->ky, dx = tap % a->kx;
            int vy = oy + dy - py, vx = ox + dx - px;
            if (vy < 0 || vy >= a->Ho || vx < 0 || vx >= a->Wo) {
                for (int ci = 0; ci < a->cin; ci++) row[(int64_t)ci * ntap + tap] = 0.0f;
                continue;
            }
            const float *s = a->src[dt] + ((int64_t)(vy / a->up) * a->Ws + vx / a->up) * a->cin;
            for (int ci = 0; ci < a->cin; ci++) row[(int64_t)ci * ntap + tap] = s[ci];
        }
    }
}

/*
 * One output frame of a conv: y (Ho*Wo, M) = im2col(src frames) @ W^T + b,
 * tile by tile so col never exceeds run->col_cap floats.
 */
static int conv_frame(vae_run *run, const vae_conv *cv, const float *const *src, int Hs, int Ws, int up,
                      float *y) {
    const int64_t K = (int64_t)cv->cin * cv->kt * cv->ky * cv->kx;
    const int Ho = Hs * up, Wo = Ws * up;
    const int64_t P = (int64_t)Ho * Wo;
    int64_t R = run->col_cap / K;
    if (R < 1) R = 1;
    vae_gather a = {.col = run->col, .cin = cv->cin, .kt = cv->kt, .ky = cv->ky, .kx = cv->kx, .up = up,
                    .Hs = Hs, .Ws = Ws, .Ho = Ho, .Wo = Wo};
    for (int i = 0; i < cv->kt; i++) a.src[i] = src[i];
    for (int64_t r0 = 0; r0 < P; r0 += R) {
        a.r0 = r0;
        a.rows = P - r0 < R ? P - r0 : R;
        h3r_pool_run(run->pool, gather_rows, &a);
        int rc = op_matmul(run->pool, y + r0 * cv->cout, run->col, cv->w, cv->b, a.rows);
        if (rc) return rc;
    }
    return 0;
}

/* 1x1 conv over n rows: y (n, M) = x (n, cin) @ W^T + b. */
static int conv_1x1(vae_run *run, const vae_conv *cv, const float *x, int64_t n, float *y) {
    return op_matmul(run->pool, y, x, cv->w, cv->b, n);
}

/* The next cache slot, allocated (zeroed) on first use: (2, P, cin). */
static int next_cache(vae_run *run, int64_t P, int cin, vae_cache **out) {
    if (run->slot >= run->m->n_slots)
        return h3r_seterr(H3R_ERR_INTERNAL, "%s: VAE cache slot %d of %d", run->m->path, run->slot,
                          run->m->n_slots);
    vae_cache *c = &run->caches[run->slot];
    if (!c->buf) {
        c->frame = run->slot_frame[run->slot];
        if (c->frame != P * cin)
            return h3r_seterr(H3R_ERR_INTERNAL, "%s: VAE cache slot %d is %lld floats a frame; its conv "
                              "reads %lld", run->m->path, run->slot, (long long)c->frame, (long long)(P * cin));
        c->buf = calloc((size_t)(2 * c->frame), sizeof(float));
        if (!c->buf) return h3r_seterr(H3R_ERR_NOMEM, "%s: out of memory for the VAE cache", run->m->path);
    } else if (c->frame != P * cin) {
        return h3r_seterr(H3R_ERR_INTERNAL, "%s: VAE cache slot %d changed size", run->m->path, run->slot);
    }
    run->slot++;
    *out = c;
    return 0;
}

/*
 * Causal conv (kt = 3, time padding 2) over one chunk: x (t, H*W, cin) ->
 * y (t, H*W, cout), reading the conv's cache as the two frames before x, then
 * storing the last two frames of [cache, x] back (diffusers' cache_x).
 */
static int conv_causal(vae_run *run, const vae_conv *cv, const float *x, int t, int H, int W, float *y) {
    const int64_t P = (int64_t)H * W;
    vae_cache *c = NULL;
    int rc = next_cache(run, P, cv->cin, &c);
    if (rc) return rc;
    for (int j = 0; j < t; j++) {
        const float *src[3];
        for (int dt = 0; dt < 3; dt++) {
            int f = j + dt;  /* index into [cache0, cache1, x0, x1, ...] */
            src[dt] = f < 2 ? c->buf + f * c->frame : x + (int64_t)(f - 2) * c->frame;
        }
        if ((rc = conv_frame(run, cv, src, H, W, 1, y + (int64_t)j * P * cv->cout))) return rc;
    }
    if (t >= 2) {
        memcpy(c->buf, x + (int64_t)(t - 2) * c->frame, sizeof(float) * (size_t)(2 * c->frame));
    } else {
        memmove(c->buf, c->buf + c->frame, sizeof(float) * (size_t)c->frame);
        memcpy(c->buf + c->frame, x, sizeof(float) * (size_t)c->frame);
    }
    return 0;
}

/* Row job for norm: x (n, C) -> y, optional SiLU. */
typedef struct {
    float *y;
    const float *x;
    const float *gamma;
    int64_t n;
    int C, silu;
} vae_norm;

/*
 * WanRMS_norm over channels, then optional SiLU, rows split by ith:
 *   y = x / max(||x||_2, 1e-12) * sqrt(C) * gamma  (F.normalize order)
 *   y = y * sigmoid(y)
 */
static void norm_rows(void *ctx, int ith, int nth) {
    const vae_norm *a = ctx;
    int64_t per = (a->n + nth - 1) / nth;
    int64_t lo = per * ith, hi = lo + per < a->n ? lo + per : a->n;
    const float scale = sqrtf((float)a->C);
    for (int64_t r = lo; r < hi; r++) {
        const float *x = a->x + r * a->C;
        float *y = a->y + r * a->C;
        double ss = 0.0;
        for (int c = 0; c < a->C; c++) ss += (double)x[c] * x[c];
        float den = (float)sqrt(ss);
        if (den < VAE_NORM_EPS) den = VAE_NORM_EPS;
        for (int c = 0; c < a->C; c++) {
            float v = x[c] / den * scale * a->gamma[c];
            y[c] = a->silu ? v / (1.0f + expf(-v)) : v;
        }
    }
}

static void norm_silu(vae_run *run, float *y, const float *x, int64_t n, int C, const float *gamma, int silu) {
    vae_norm a = {.y = y, .x = x, .gamma = gamma, .n = n, .C = C, .silu = silu};
    h3r_pool_run(run->pool, norm_rows, &a);
}

/* ================================================================ blocks */

/* Three activation buffers, each big enough for any stage of one chunk. */
typedef struct {
    float *a, *b, *c;
} vae_bufs;

/*
 * WanResidualBlock on x = *bufs->a (t, P, cin) -> result in bufs->a
 * (t, P, cout); the buffers rotate.
 *   h = conv1(silu(norm1(x))); h = conv2(silu(norm2(h))); out = h + shortcut(x)
 */
static int res_block(vae_run *run, const vae_res *r, vae_bufs *bf, int t, int H, int W) {
    const int64_t n = (int64_t)t * H * W;
    int rc;
    norm_silu(run, bf->b, bf->a, n, r->cin, r->gamma1, 1);
    if ((rc = conv_causal(run, &r->conv1, bf->b, t, H, W, bf->c))) return rc;
    norm_silu(run, bf->c, bf->c, n, r->cout, r->gamma2, 1);
    if ((rc = conv_causal(run, &r->conv2, bf->c, t, H, W, bf->b))) return rc;
    const float *skip = bf->a;
    if (r->has_shortcut) {
        if ((rc = conv_1x1(run, &r->shortcut, bf->a, n, bf->c))) return rc;
        skip = bf->c;
    }
    op_add(bf->b, skip, n * r->cout);
    float *tmp = bf->a;
    bf->a = bf->b;
    bf->b = tmp;
    return 0;
}

/* Attention scratch: q, k, v, o (P, C) and qkv (P, 3C). */
typedef struct {
    float *qkv, *q, *k, *v, *o;
} vae_attn_buf;

/*
 * WanAttentionBlock, frame by frame on bufs->a (t, P, C), in place:
 *   h = norm(x); q, k, v = split(to_qkv(h)); x += proj(softmax(q k^T / sqrt(C)) v)
 */
static int attn_block(vae_run *run, const vae_attn *at, vae_bufs *bf, vae_attn_buf *ab, int t, int64_t P) {
    const int C = at->dim;
    int rc;
    for (int j = 0; j < t; j++) {
        float *x = bf->a + (int64_t)j * P * C;
        norm_silu(run, bf->b, x, P, C, at->gamma, 0);
        if ((rc = conv_1x1(run, &at->qkv, bf->b, P, ab->qkv))) return rc;
        for (int64_t p = 0; p < P; p++) {
            const float *s = ab->qkv + p * 3 * C;
            memcpy(ab->q + p * C, s, sizeof(float) * C);
            memcpy(ab->k + p * C, s + C, sizeof(float) * C);
            memcpy(ab->v + p * C, s + 2 * C, sizeof(float) * C);
        }
        if ((rc = op_attention(run->pool, ab->o, ab->q, ab->k, ab->v, P, P, 1, C, 1.0f / sqrtf((float)C), NULL)))
            return rc;
        if ((rc = conv_1x1(run, &at->proj, ab->o, P, bf->b))) return rc;
        op_add(x, bf->b, P * C);
    }
    return 0;
}

/*
 * WanResample upsample2d / upsample3d on bufs->a (t, H*W, C) -> bufs->a
 * (t', 2H*2W, C/2), t' = 2t for upsample3d after the first chunk, else t.
 */
static int upsample(vae_run *run, const vae_up *u, vae_bufs *bf, int *t, int H, int W) {
    const int C = u->cout;
    const int64_t P = (int64_t)H * W;
    int rc;
    if (u->mode == UP_3D) {
        if (run->chunk == 0) {
            /* diffusers marks the cache "Rep" and skips time_conv on the first chunk. */
            run->slot++;
        } else {
            /* time_conv: (t, P, C) -> (t, P, 2C); channel block s is output frame 2j + s. */
            if ((rc = conv_causal(run, &u->time_conv, bf->a, *t, H, W, bf->b))) return rc;
            for (int j = 0; j < *t; j++)
                for (int s = 0; s < 2; s++) {
                    float *dst = bf->c + (int64_t)(2 * j + s) * P * C;
                    const float *src = bf->b + (int64_t)j * P * 2 * C + (int64_t)s * C;
                    for (int64_t p = 0; p < P; p++) memcpy(dst + p * C, src + p * 2 * C, sizeof(float) * C);
                }
            *t *= 2;
            float *tmp = bf->a;
            bf->a = bf->c;
            bf->c = tmp;
        }
    }
    /* Nearest 2x (folded into the gather) + Conv2d 3x3, padding 1, per frame. */
    for (int j = 0; j < *t; j++) {
        const float *src[1] = {bf->a + (int64_t)j * P * C};
        if ((rc = conv_frame(run, &u->resample, src, H, W, 2, bf->b + (int64_t)j * 4 * P * u->resample.cout)))
            return rc;
    }
    float *tmp = bf->a;
    bf->a = bf->b;
    bf->b = tmp;
    return 0;
}

/* ================================================================ decode */

/* Tap one chunk's (t, P, C) channels-last activation as (C, t, H, W). */
static void tap_chunk(h3r_tap_fn tap, void *user, const char *name, float *tmp, const float *x, int t, int64_t P,
                      int C) {
    for (int j = 0; j < t; j++)
        for (int64_t p = 0; p < P; p++)
            for (int c = 0; c < C; c++) tmp[((int64_t)c * t + j) * P + p] = x[((int64_t)j * P + p) * C + c];
    tap(user, name, tmp, (int64_t)C * t * P);
}

/*
 * Largest (t * P * channels) of any activation in a chunk of at most
 * 2^n_temporal frames, and of the attention scratch; no overflow for the
 * bounded Y, X and channel counts.
 */
static int64_t max_activation(const wan_vae *m, int Y, int X) {
    int64_t P = (int64_t)Y * X, t = 1, mx = P * (m->z_dim > m->conv_in.cout ? m->z_dim : m->conv_in.cout);
    for (int i = 0; i < m->n_up; i++) {
        const vae_up *u = &m->up[i];
        int64_t c = u->cin > u->cout ? u->cin : u->cout;
        if (t * P * c > mx) mx = t * P * c;
        if (u->mode == UP_3D) {
            if (t * P * 2 * u->cout > mx) mx = t * P * 2 * u->cout;
            t *= 2;
        }
        if (u->mode != UP_NONE) {
            P *= 4;
            if (t * P * u->resample.cout > mx) mx = t * P * u->resample.cout;
        }
    }
    if (t * P * 3 > mx) mx = t * P * 3;
    return mx;
}

/*
 * The causal caches of one decode at latent size (Y, X), slot by slot in the
 * order the decode takes them: frame[i] = P * cin of slot i's conv input (its
 * cache holds two such frames), first[i] = the first chunk that uses it (1 for
 * an upsample3d time_conv, which chunk 0 skips; else 0). The decode allocates
 * each cache from this table; the estimate sums it.
 */
static void cache_frames(const wan_vae *m, int Y, int X, int64_t *frame, int *first) {
    int64_t P = (int64_t)Y * X;
    int n = 0;
#define SLOT(p, cin, f)                \
    do {                               \
        if (n < m->n_slots) {          \
            frame[n] = (p) * (cin);    \
            first[n] = (f);            \
        }                              \
        n++;                           \
    } while (0)
    SLOT(P, m->conv_in.cin, 0);
    for (int r = 0; r < 2; r++) {
        SLOT(P, m->mid_res[r].conv1.cin, 0);
        SLOT(P, m->mid_res[r].conv2.cin, 0);
    }
    for (int u = 0; u < m->n_up; u++) {
        const vae_up *up = &m->up[u];
        for (int r = 0; r < up->n_res; r++) {
            SLOT(P, up->res[r].conv1.cin, 0);
            SLOT(P, up->res[r].conv2.cin, 0);
        }
        if (up->mode == UP_3D) SLOT(P, up->time_conv.cin, 1);
        if (up->mode != UP_NONE) P *= 4;
    }
    SLOT(P, m->conv_out.cin, 0);
#undef SLOT
}

int wan_vae_check_shape(const wan_vae *m, int C, int T, int Y, int X) {
    if (C != m->z_dim)
        return h3r_seterr(H3R_ERR_INVALID, "VAE decode: latent channels C = %d, this VAE (%s) takes z_dim = %d",
                          C, m->path, m->z_dim);
    if (T < 1 || T > VAE_MAX_LATENT || Y < 1 || Y > VAE_MAX_LATENT || X < 1 || X > VAE_MAX_LATENT)
        return h3r_seterr(H3R_ERR_INVALID, "VAE decode: latent (T, Y, X) = (%d, %d, %d), each must be 1..%d", T, Y,
                          X, VAE_MAX_LATENT);
    return 0;
}

/* The decode's other buffers, in floats: the table it allocates from and the
 * estimate sums. */
typedef struct {
    int64_t col;    /* im2col tile */
    int64_t zq;     /* (T, P0, C) channels-last latents and their post_quant_conv */
    int64_t act;    /* each of the three activation buffers (max_activation) */
    int64_t qkv;    /* attention: qkv (P0, 3C) and q, k, v, o (P0, C) */
    int64_t tap;    /* the tap's channel-first copy (only with a tap) */
} vae_sizes;

static void decode_sizes(const wan_vae *m, int T, int Y, int X, vae_sizes *s) {
    const int64_t P0 = (int64_t)Y * X, C = m->z_dim;
    int64_t maxK = 0;
    const vae_conv *all[] = {&m->conv_in, &m->conv_out, &m->mid_res[0].conv1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        int64_t k = (int64_t)all[i]->cin * all[i]->kt * all[i]->ky * all[i]->kx;
        if (k > maxK) maxK = k;
    }
    for (int i = 0; i < m->n_up; i++) {
        int64_t k = (int64_t)(m->up[i].cin > m->up[i].cout ? m->up[i].cin : m->up[i].cout) * 27;
        if (k > maxK) maxK = k;
    }
    s->col = maxK > VAE_TILE_FLOATS ? maxK : VAE_TILE_FLOATS;
    s->zq = P0 * C * T * 2;
    s->act = max_activation(m, Y, X);
    s->qkv = P0 * m->mid_attn.dim * 7;
    s->tap = s->act > P0 * C * T ? s->act : P0 * C * T;
}

/* Every matmul weight of the decoder and the rows it is called with, for the
 * largest op scratch: 1x1 convs over a whole frame (post_quant over all T),
 * 3x3 convs over at most one tile of rows. */
static int64_t op_scratch_max(const wan_vae *m, int T, int Y, int X, int64_t col, int nth) {
    int64_t mx = op_attention_scratch_bytes(m->mid_attn.dim, nth);
    int64_t P = (int64_t)Y * X, t = 1;
#define CONV(cv, rows)                                                                           \
    do {                                                                                         \
        const int64_t K_ = (int64_t)(cv)->cin * (cv)->kt * (cv)->ky * (cv)->kx;                  \
        int64_t r_ = (cv)->kt * (cv)->ky * (cv)->kx == 1 ? (rows) : col / K_ < 1 ? 1 : col / K_; \
        if (r_ > (rows)) r_ = (rows);                                                            \
        int64_t b_ = op_matmul_scratch_bytes((cv)->w->type, K_, r_, nth);                        \
        if (b_ > mx) mx = b_;                                                                    \
    } while (0)
    CONV(&m->post_quant, (int64_t)T * P);
    CONV(&m->conv_in, P);
    CONV(&m->mid_attn.qkv, P);
    CONV(&m->mid_attn.proj, P);
    for (int r = 0; r < 2; r++) {
        CONV(&m->mid_res[r].conv1, P);
        CONV(&m->mid_res[r].conv2, P);
    }
    for (int u = 0; u < m->n_up; u++) {
        const vae_up *up = &m->up[u];
        for (int r = 0; r < up->n_res; r++) {
            CONV(&up->res[r].conv1, P);
            CONV(&up->res[r].conv2, P);
            if (up->res[r].has_shortcut) CONV(&up->res[r].shortcut, t * P);
        }
        if (up->mode == UP_3D) {
            CONV(&up->time_conv, P);
            if (T > 1) t *= 2;
        }
        if (up->mode != UP_NONE) {
            P *= 4;
            CONV(&up->resample, P);
        }
    }
    CONV(&m->conv_out, P);
#undef CONV
    return mx;
}

int64_t wan_vae_decode_bytes(const wan_vae *m, int T, int Y, int X, int nth, int with_tap) {
    vae_sizes s;
    decode_sizes(m, T, Y, X, &s);
    int64_t floats = s.col + s.zq + 3 * s.act + s.qkv + (with_tap ? s.tap : 0);
    int64_t *frame = malloc(sizeof(int64_t) * (size_t)m->n_slots);
    int *first = malloc(sizeof(int) * (size_t)m->n_slots);
    if (!frame || !first) {
        free(frame);
        free(first);
        return -1;
    }
    cache_frames(m, Y, X, frame, first);
    for (int i = 0; i < m->n_slots; i++)
        if (first[i] < T) floats += 2 * frame[i];
    free(frame);
    free(first);
    return floats * (int64_t)sizeof(float) + (int64_t)m->n_slots * (int64_t)sizeof(vae_cache) +
           op_scratch_max(m, T, Y, X, s.col, nth);
}

/*
 * Decode de-normalised latents z (C, T, Y, X) into out (3, F, 8Y, 8X) for Wan's
 * layout (F = 1 + 2^n_temporal (T - 1), spatial factor 2^(n_up - 1)), clamped to
 * [-1, 1]. Latent frame 0 is one chunk, then each following latent frame, as
 * diffusers' _decode. progress(user, i + 1, T) after each latent frame; a
 * non-zero return cancels (H3R_ERR_CANCELED). Taps, when tap is set:
 *   "vae.post_quant_conv"  once, (C, T, Y, X)
 *   "vae.mid", "vae.up.<i>" once per latent frame, that chunk's (C', t, H', W')
 *                          (what a diffusers forward hook on the module sees)
 *   "vae.out"              once, the whole clamped video (3, F, H, W)
 * Returns 0, or a negative code with a message. Writes only out and its own
 * scratch (sized by decode_sizes and cache_frames), which is freed before
 * returning.
 */
int wan_vae_decode(const wan_vae *m, h3r_pool *p, const float *z, int C, int T, int Y, int X, float *out,
                   int (*progress)(void *user, int done, int total), void *user, h3r_tap_fn tap, void *tap_user) {
    int rc = wan_vae_check_shape(m, C, T, Y, X);
    if (rc) return rc;
    const int ss = 1 << (m->n_up - 1), st = 1 << m->n_temporal;
    const int Ho = Y * ss, Wo = X * ss;
    const int64_t Po = (int64_t)Ho * Wo, F = 1 + (int64_t)st * (T - 1);
    const int64_t P0 = (int64_t)Y * X;

    vae_run run = {.m = m, .pool = p};
    vae_bufs bf = {0};
    vae_attn_buf ab = {0};
    float *zq = NULL, *tapbuf = NULL, *base[3] = {0};
    int64_t *slot_frame = malloc(sizeof(int64_t) * (size_t)m->n_slots);
    int *slot_first = malloc(sizeof(int) * (size_t)m->n_slots);
    vae_sizes sz;
    decode_sizes(m, T, Y, X, &sz);
    const int64_t act = sz.act;
    const int64_t Ca = m->mid_attn.dim;
    run.col_cap = sz.col;
    run.col = malloc(sizeof(float) * (size_t)sz.col);
    run.caches = calloc((size_t)m->n_slots, sizeof(vae_cache));
    run.slot_frame = slot_frame;
    zq = malloc(sizeof(float) * (size_t)sz.zq);
    for (int i = 0; i < 3; i++) base[i] = malloc(sizeof(float) * (size_t)act);
    ab.qkv = malloc(sizeof(float) * (size_t)sz.qkv);
    if (tap) tapbuf = malloc(sizeof(float) * (size_t)sz.tap);
    if (!slot_frame || !slot_first || !run.col || !run.caches || !zq || !base[0] || !base[1] || !base[2] ||
        !ab.qkv || (tap && !tapbuf)) {
        rc = h3r_seterr(H3R_ERR_NOMEM, "VAE decode: out of memory for scratch (%lld floats per activation)",
                        (long long)act);
        goto done;
    }
    cache_frames(m, Y, X, slot_frame, slot_first);
    ab.q = ab.qkv + P0 * Ca * 3;
    ab.k = ab.q + P0 * Ca;
    ab.v = ab.k + P0 * Ca;
    ab.o = ab.v + P0 * Ca;

    /* post_quant_conv (1x1x1, no time padding) on the whole latent, channels-last:
     * zq (T, P0, C) from z (C, T, P0), result in zq + T*P0*C. */
    float *zin = zq, *zpq = zq + (int64_t)T * P0 * C;
    for (int c = 0; c < C; c++)
        for (int64_t f = 0; f < (int64_t)T * P0; f++) zin[f * C + c] = z[(int64_t)c * T * P0 + f];
    if ((rc = conv_1x1(&run, &m->post_quant, zin, (int64_t)T * P0, zpq))) goto done;
    if (tap) tap_chunk(tap, tap_user, "vae.post_quant_conv", tapbuf, zpq, T, P0, C);

    int64_t f0 = 0;  /* first output frame of this chunk */
    for (int i = 0; i < T; i++) {
        run.chunk = i;
        run.slot = 0;
        bf.a = base[0];
        bf.b = base[1];
        bf.c = base[2];
        int t = 1, H = Y, W = X;
        if ((rc = conv_causal(&run, &m->conv_in, zpq + (int64_t)i * P0 * C, 1, H, W, bf.a))) goto done;
        if ((rc = res_block(&run, &m->mid_res[0], &bf, t, H, W))) goto done;
        if ((rc = attn_block(&run, &m->mid_attn, &bf, &ab, t, P0))) goto done;
        if ((rc = res_block(&run, &m->mid_res[1], &bf, t, H, W))) goto done;
        if (tap) tap_chunk(tap, tap_user, "vae.mid", tapbuf, bf.a, t, P0, m->mid_attn.dim);
        for (int u = 0; u < m->n_up; u++) {
            const vae_up *up = &m->up[u];
            for (int r = 0; r < up->n_res; r++)
                if ((rc = res_block(&run, &up->res[r], &bf, t, H, W))) goto done;
            int cout = up->cout;
            if (up->mode != UP_NONE) {
                if ((rc = upsample(&run, up, &bf, &t, H, W))) goto done;
                H *= 2;
                W *= 2;
                cout = up->resample.cout;
            }
            if (tap) {
                char name[32];
                snprintf(name, sizeof name, "vae.up.%d", u);
                tap_chunk(tap, tap_user, name, tapbuf, bf.a, t, (int64_t)H * W, cout);
            }
        }
        /* Head: norm_out, SiLU, conv_out -> (t, Po, 3), then clamp into out (3, F, Ho, Wo). */
        const int cl = m->conv_out.cin;
        norm_silu(&run, bf.b, bf.a, (int64_t)t * Po, cl, m->gamma_out, 1);
        if ((rc = conv_causal(&run, &m->conv_out, bf.b, t, H, W, bf.c))) goto done;
        if (run.slot != m->n_slots) {
            rc = h3r_seterr(H3R_ERR_INTERNAL, "VAE decode used %d cache slots of %d", run.slot, m->n_slots);
            goto done;
        }
        for (int j = 0; j < t; j++)
            for (int c = 0; c < 3; c++) {
                float *dst = out + ((int64_t)c * F + f0 + j) * Po;
                const float *src = bf.c + (int64_t)j * Po * 3 + c;
                for (int64_t q = 0; q < Po; q++) {
                    float v = src[q * 3];
                    dst[q] = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;  /* NaN passes, as torch.clamp */
                }
            }
        f0 += t;
        if (progress && progress(user, i + 1, T)) {
            rc = h3r_seterr(H3R_ERR_CANCELED, "VAE decode canceled after latent frame %d of %d", i + 1, T);
            goto done;
        }
    }
    if (f0 != F) {
        rc = h3r_seterr(H3R_ERR_INTERNAL, "VAE decode produced %lld frames, expected %lld", (long long)f0,
                        (long long)F);
        goto done;
    }
    if (tap) tap(tap_user, "vae.out", out, 3 * F * Po);
done:
    if (run.caches)
        for (int i = 0; i < m->n_slots; i++) free(run.caches[i].buf);
    free(run.caches);
    free(run.col);
    free(zq);
    for (int i = 0; i < 3; i++) free(base[i]);
    free(ab.qkv);
    free(tapbuf);
    free(slot_frame);
    free(slot_first);
    return rc;
}
