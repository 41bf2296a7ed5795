/*
 * Wan 2.1 diffusion transformer (diffusers WanTransformer3DModel, text-to-video
 * path): one flow-prediction forward over a latent video.
 *
 *   x (C, T, Y, X) --patchify--> (N, P) --patch_embedding--> h (N, D)
 *   timestep --sinusoid--> (Fq,) --time_embedder--> temb (D,)
 *            --silu, time_proj--> tproj (6, D)
 *   context (L, Dt) --text_embedder--> ctx (L, D)
 *   for each block i:
 *       h += gate   * attn1(ln(h) * (1 + scale) + shift)      self, rope, rms q/k
 *       h +=          attn2(norm2(h), ctx)                     cross, rms q/k
 *       h += c_gate * ffn(ln(h) * (1 + c_scale) + c_shift)     gelu(tanh)
 *   ln(h) * (1 + scale_o) + shift_o --proj_out--> (N, Po) --unpatchify--> out
 *
 * Dimension letters (see internal.h): N tokens = (T/pt)(Y/py)(X/px),
 * D model dim = H * Dh, F ffn dim, L text length, Dt text dim, Fq freq dim,
 * P = C*pt*py*px patch vector, Po = Co*pt*py*px output patch vector,
 * (gt, gy, gx) the token grid.
 *
 * Numerics follow diffusers in float32, operation by operation: the timestep
 * sinusoid is computed in float32 as torch does, rope angles in float64 and
 * rounded to float32 (WanRotaryPosEmbed's buffers), (1 + scale) formed before
 * the product. Every per-row loop is split over rows only, so results do not
 * depend on the thread count.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "models.h"

#define WAN_MAX_DIM     (1 << 16)  /* elements; bounds every config width */
#define WAN_MAX_LAYERS  1024
#define WAN_MAX_PATCH   16
#define WAN_ROPE_THETA  10000.0    /* WanRotaryPosEmbed default */
#define WAN_FFN_ROWS    256        /* rows of the FFN hidden (R, F) done at once */

/* ---------------------------------------------------------------- weights */

typedef struct {
    const h3r_tensor *q_w, *q_b;   /* (D, D), (D)  q from the hidden states */
    const h3r_tensor *k_w, *k_b;   /* (D, D), (D)  k from hidden (self) or ctx (cross) */
    const h3r_tensor *v_w, *v_b;   /* (D, D), (D) */
    const h3r_tensor *o_w, *o_b;   /* (D, D), (D)  to_out.0 */
    const float *norm_q, *norm_k;  /* (D)  RMSNorm over all heads */
} wan_attn;

typedef struct {
    wan_attn self, cross;
    const float *norm2_w, *norm2_b;   /* (D) each, NULL when cross_attn_norm is false */
    const h3r_tensor *up_w, *up_b;    /* (F, D), (F)  ffn.net.0.proj */
    const h3r_tensor *down_w, *down_b;/* (D, F), (D)  ffn.net.2 */
    const float *sst;                 /* (6, D)  scale_shift_table */
} wan_block;

struct wan_dit {
    /* config, validated at load */
    int in_ch, out_ch;          /* C, Co */
    int text_dim, freq_dim;     /* Dt, Fq */
    int dim, heads, head_dim;   /* D = H * Dh */
    int ffn_dim, n_layers;      /* F, number of blocks */
    int patch[3];               /* pt, py, px */
    int rope_max;               /* positions per axis the rope table holds */
    int rope_t, rope_h, rope_w; /* rope sub-dims of a head, t + h + w = Dh */
    int cross_attn_norm;
    float eps;
    char path[512];             /* for messages */

    /* weights: const views into the mapping */
    const h3r_tensor *patch_w, *patch_b;     /* (D, P), (D) */
    const h3r_tensor *time1_w, *time1_b;     /* (D, Fq), (D) */
    const h3r_tensor *time2_w, *time2_b;     /* (D, D), (D) */
    const h3r_tensor *tproj_w, *tproj_b;     /* (6D, D), (6D) */
    const h3r_tensor *text1_w, *text1_b;     /* (D, Dt), (D) */
    const h3r_tensor *text2_w, *text2_b;     /* (D, D), (D) */
    const float *out_sst;                    /* (2, D) */
    const h3r_tensor *proj_w, *proj_b;       /* (Po, D), (Po) */
    wan_block *blocks;                       /* (n_layers) */
};

/* ---------------------------------------------------------------- loading */

/*
 * Read an integer config value "h3r.<key>" into *out and check it lies in
 * [lo, hi]. A missing key takes `def` when `required` is 0. Returns 0, or
 * H3R_ERR_FORMAT with a message naming the file, key, value and range.
 */
static int cfg_int(const gguf_file *g, const char *key, int required, int64_t def,
                   int64_t lo, int64_t hi, int *out) {
    char full[128];
    snprintf(full, sizeof(full), "h3r.%s", key);
    int64_t v = def;
    if (required || gguf_has_key(g, full)) {
        int rc = gguf_get_int(g, full, &v);
        if (rc < 0) return rc;
    }
    if (v < lo || v > hi)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: config %s = %lld is out of range [%lld, %lld]",
                          gguf_path(g), full, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

/*
 * Look up a tensor with the expected GGML-order shape (ne0, ne1, ne2) and
 * require float32 data when f32 is non-NULL (biases, norms, tables), or a
 * matmul-capable type otherwise. Returns 0 or a negative code with a message
 * naming the file and tensor.
 */
static int get_w(const gguf_file *g, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                 const h3r_tensor **t, const float **f32) {
    int rc = gguf_get_tensor(g, name, ne0, ne1, ne2, 1, t);
    if (rc < 0) return rc;
    if ((*t)->n_dims > 3 && (*t)->ne[3] != 1)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has an unexpected 4th dim %lld",
                          gguf_path(g), name, (long long)(*t)->ne[3]);
    if (f32) {
        rc = tensor_f32(*t, f32);
        if (rc < 0)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is %s; it must be f32",
                              gguf_path(g), name, ggml_type_name((*t)->type));
        return 0;
    }
    switch ((*t)->type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q6_K:
        return 0;
    default:
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has type %s, not usable as a matmul "
                          "weight (f32, f16, q8_0, q4_0, q6_k)",
                          gguf_path(g), name, ggml_type_name((*t)->type));
    }
}

/* A linear layer "<prefix>.weight" (out, in) and "<prefix>.bias" (out). */
static int get_linear(const gguf_file *g, const char *prefix, int64_t in, int64_t out,
                      const h3r_tensor **w, const h3r_tensor **b) {
    char name[256];
    const float *unused;
    snprintf(name, sizeof(name), "%s.weight", prefix);
    int rc = get_w(g, name, in, out, 1, w, NULL);
    if (rc < 0) return rc;
    snprintf(name, sizeof(name), "%s.bias", prefix);
    return get_w(g, name, out, 1, 1, b, &unused);
}

/* A 1-D float32 vector "<name>" of n elements. */
static int get_vec(const gguf_file *g, const char *name, int64_t n, const float **out) {
    const h3r_tensor *t;
    return get_w(g, name, n, 1, 1, &t, out);
}

/*
 * The weights of attention `which` ("attn1" self, "attn2" cross) of block i:
 * four (D, D) linears and the two (D) RMSNorm weights. Refuses image-to-video
 * checkpoints (add_k_proj present) with H3R_ERR_UNSUPPORTED. Returns 0 or a
 * negative code naming file and tensor.
 */
static int get_attn(const gguf_file *g, int i, const char *which, int D, wan_attn *a) {
    char p[128];
    int rc;
#define LIN(field, sub)                                                        \
    snprintf(p, sizeof(p), "blocks.%d.%s.%s", i, which, sub);                  \
    if ((rc = get_linear(g, p, D, D, &a->field##_w, &a->field##_b)) < 0) return rc;
    LIN(q, "to_q")
    LIN(k, "to_k")
    LIN(v, "to_v")
    LIN(o, "to_out.0")
#undef LIN
    snprintf(p, sizeof(p), "blocks.%d.%s.norm_q.weight", i, which);
    if ((rc = get_vec(g, p, D, &a->norm_q)) < 0) return rc;
    snprintf(p, sizeof(p), "blocks.%d.%s.norm_k.weight", i, which);
    if ((rc = get_vec(g, p, D, &a->norm_k)) < 0) return rc;
    /* Image-conditioned (I2V) checkpoints carry extra k/v projections. */
    snprintf(p, sizeof(p), "blocks.%d.%s.add_k_proj.weight", i, which);
    if (gguf_find(g, p))
        return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: tensor '%s' belongs to an image-to-video "
                          "model; only text-to-video Wan 2.1 is supported", gguf_path(g), p);
    return 0;
}

/*
 * Read and validate the config: every width bounded, the head dim even (rope
 * rotates pairs), T2V only. Returns 0 or a negative code naming file and key.
 */
static int load_config(const gguf_file *g, wan_dit *m) {
    const char *path = gguf_path(g);
    const char *arch;
    size_t alen;
    int rc;
    if (gguf_has_key(g, "general.architecture")) {
        if ((rc = gguf_get_str(g, "general.architecture", &arch, &alen)) < 0) return rc;
        if (alen != 7 || memcmp(arch, "wan_dit", 7) != 0)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: general.architecture is '%.*s', expected "
                              "'wan_dit' (a converted Wan transformer)", path,
                              (int)(alen > 64 ? 64 : alen), arch);
    }
    int64_t ps[3];
    int nps = 0;
    if ((rc = gguf_get_int_array(g, "h3r.patch_size", ps, 3, &nps)) < 0) return rc;
    if (nps != 3)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: config h3r.patch_size has %d entries; expected 3 "
                          "(t, h, w)", path, nps);
    for (int i = 0; i < 3; i++) {
        if (ps[i] < 1 || ps[i] > WAN_MAX_PATCH)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: config h3r.patch_size[%d] = %lld is out of "
                              "range [1, %d]", path, i, (long long)ps[i], WAN_MAX_PATCH);
        m->patch[i] = (int)ps[i];
    }
    if ((rc = cfg_int(g, "num_attention_heads", 1, 0, 1, 1024, &m->heads)) < 0) return rc;
    if ((rc = cfg_int(g, "attention_head_dim", 1, 0, 2, 1024, &m->head_dim)) < 0) return rc;
    if (m->head_dim % 2 != 0)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: config h3r.attention_head_dim = %d must be even "
                          "(rope rotates pairs)", path, m->head_dim);
    if ((int64_t)m->heads * m->head_dim > WAN_MAX_DIM)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: config heads x head dim = %d x %d exceeds %d",
                          path, m->heads, m->head_dim, WAN_MAX_DIM);
    m->dim = m->heads * m->head_dim;
    if ((rc = cfg_int(g, "in_channels", 1, 0, 1, 4096, &m->in_ch)) < 0) return rc;
    /* out_channels null in config.json (not stored) means in_channels. */
    if ((rc = cfg_int(g, "out_channels", 0, m->in_ch, 1, 4096, &m->out_ch)) < 0) return rc;
    if ((rc = cfg_int(g, "text_dim", 1, 0, 1, WAN_MAX_DIM, &m->text_dim)) < 0) return rc;
    if ((rc = cfg_int(g, "freq_dim", 0, 256, 2, WAN_MAX_DIM, &m->freq_dim)) < 0) return rc;
    if ((rc = cfg_int(g, "ffn_dim", 1, 0, 1, 4 * WAN_MAX_DIM, &m->ffn_dim)) < 0) return rc;
    if ((rc = cfg_int(g, "num_layers", 1, 0, 1, WAN_MAX_LAYERS, &m->n_layers)) < 0) return rc;
    if ((rc = cfg_int(g, "rope_max_seq_len", 0, 1024, 1, 1 << 20, &m->rope_max)) < 0) return rc;

    m->eps = 1e-6f;
    if (gguf_has_key(g, "h3r.eps")) {
        double eps;
        if ((rc = gguf_get_float(g, "h3r.eps", &eps)) < 0) return rc;
        if (!(eps > 0.0 && eps < 1.0))
            return h3r_seterr(H3R_ERR_FORMAT, "%s: config h3r.eps = %g must be in (0, 1)", path, eps);
        m->eps = (float)eps;
    }
    m->cross_attn_norm = 1;
    if (gguf_has_key(g, "h3r.cross_attn_norm") &&
        (rc = gguf_get_bool(g, "h3r.cross_attn_norm", &m->cross_attn_norm)) < 0)
        return rc;
    if (gguf_has_key(g, "h3r.qk_norm")) {
        const char *s;
        size_t n;
        if ((rc = gguf_get_str(g, "h3r.qk_norm", &s, &n)) < 0) return rc;
        if (n != 21 || memcmp(s, "rms_norm_across_heads", 21) != 0)
            return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: config h3r.qk_norm = '%.*s'; only "
                              "'rms_norm_across_heads' is supported", path,
                              (int)(n > 64 ? 64 : n), s);
    }
    static const char *const i2v_keys[] = {"h3r.image_dim", "h3r.added_kv_proj_dim",
                                           "h3r.pos_embed_seq_len"};
    for (size_t i = 0; i < sizeof(i2v_keys) / sizeof(i2v_keys[0]); i++)
        if (gguf_has_key(g, i2v_keys[i]))
            return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: config %s is set: an image-to-video "
                              "model; only text-to-video Wan 2.1 is supported", path, i2v_keys[i]);
    /* WanRotaryPosEmbed: h and w get 2*(Dh/6) dims each, t the rest. */
    m->rope_h = m->rope_w = 2 * (m->head_dim / 6);
    m->rope_t = m->head_dim - m->rope_h - m->rope_w;
    snprintf(m->path, sizeof(m->path), "%s", path);
    return 0;
}

/*
 * The converter flattened the Conv3d weight to 2-D; its original shape
 * h3r.shape.patch_embedding.weight must be (D, C, pt, py, px), the order in
 * which forward gathers a patch vector. Returns 0 or H3R_ERR_FORMAT.
 */
static int check_patch_shape(const gguf_file *g, const wan_dit *m) {
    const char *key = "h3r.shape.patch_embedding.weight";
    int64_t s[5];
    int n = 0;
    int rc = gguf_get_int_array(g, key, s, 5, &n);
    if (rc < 0) return rc;
    int64_t want[5] = {m->dim, m->in_ch, m->patch[0], m->patch[1], m->patch[2]};
    int ok = n == 5;
    for (int i = 0; ok && i < 5; i++) ok = s[i] == want[i];
    if (!ok)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: %s is not (%lld, %lld, %lld, %lld, %lld) "
                          "(dim, in_channels, patch t, h, w)", gguf_path(g), key,
                          (long long)want[0], (long long)want[1], (long long)want[2],
                          (long long)want[3], (long long)want[4]);
    return 0;
}

/*
 * Load the DiT from an open GGUF file: validate the config and the presence,
 * type and shape of every tensor the forward touches. On success *out holds
 * views into g's mapping (g must outlive it) and 0 is returned; on failure
 * *out is NULL and a negative code is returned with a message naming the file,
 * tensor or key.
 */
int wan_dit_load(const gguf_file *g, wan_dit **out) {
    *out = NULL;
    wan_dit *m = calloc(1, sizeof(*m));
    if (!m) return h3r_seterr(H3R_ERR_NOMEM, "wan_dit: out of memory");
    int rc = load_config(g, m);
    if (rc < 0) goto fail;
    const int D = m->dim, P = m->in_ch * m->patch[0] * m->patch[1] * m->patch[2];
    const int Po = m->out_ch * m->patch[0] * m->patch[1] * m->patch[2];
    if ((rc = check_patch_shape(g, m)) < 0) goto fail;
    if ((rc = get_linear(g, "patch_embedding", P, D, &m->patch_w, &m->patch_b)) < 0) goto fail;
    if ((rc = get_linear(g, "condition_embedder.time_embedder.linear_1", m->freq_dim, D,
                         &m->time1_w, &m->time1_b)) < 0) goto fail;
    if ((rc = get_linear(g, "condition_embedder.time_embedder.linear_2", D, D,
                         &m->time2_w, &m->time2_b)) < 0) goto fail;
    if ((rc = get_linear(g, "condition_embedder.time_proj", D, 6 * D,
                         &m->tproj_w, &m->tproj_b)) < 0) goto fail;
    if ((rc = get_linear(g, "condition_embedder.text_embedder.linear_1", m->text_dim, D,
                         &m->text1_w, &m->text1_b)) < 0) goto fail;
    if ((rc = get_linear(g, "condition_embedder.text_embedder.linear_2", D, D,
                         &m->text2_w, &m->text2_b)) < 0) goto fail;
    if (gguf_find(g, "condition_embedder.image_embedder.norm1.weight")) {
        rc = h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: tensor 'condition_embedder.image_embedder.*' "
                        "belongs to an image-to-video model; only text-to-video Wan 2.1 is "
                        "supported", m->path);
        goto fail;
    }
    const h3r_tensor *t;
    if ((rc = get_w(g, "scale_shift_table", D, 2, 1, &t, &m->out_sst)) < 0) goto fail;
    if ((rc = get_linear(g, "proj_out", D, Po, &m->proj_w, &m->proj_b)) < 0) goto fail;

    m->blocks = calloc((size_t)m->n_layers, sizeof(wan_block));
    if (!m->blocks) { rc = h3r_seterr(H3R_ERR_NOMEM, "wan_dit: out of memory"); goto fail; }
    for (int i = 0; i < m->n_layers; i++) {
        wan_block *b = &m->blocks[i];
        char p[128];
        if ((rc = get_attn(g, i, "attn1", D, &b->self)) < 0) goto fail;
        if ((rc = get_attn(g, i, "attn2", D, &b->cross)) < 0) goto fail;
        if (m->cross_attn_norm) {
            snprintf(p, sizeof(p), "blocks.%d.norm2.weight", i);
            if ((rc = get_vec(g, p, D, &b->norm2_w)) < 0) goto fail;
            snprintf(p, sizeof(p), "blocks.%d.norm2.bias", i);
            if ((rc = get_vec(g, p, D, &b->norm2_b)) < 0) goto fail;
        }
        snprintf(p, sizeof(p), "blocks.%d.ffn.net.0.proj", i);
        if ((rc = get_linear(g, p, D, m->ffn_dim, &b->up_w, &b->up_b)) < 0) goto fail;
        snprintf(p, sizeof(p), "blocks.%d.ffn.net.2", i);
        if ((rc = get_linear(g, p, m->ffn_dim, D, &b->down_w, &b->down_b)) < 0) goto fail;
        snprintf(p, sizeof(p), "blocks.%d.scale_shift_table", i);
        if ((rc = get_w(g, p, D, 6, 1, &t, &b->sst)) < 0) goto fail;
    }
    /* A block past num_layers means the config and the tensors disagree. */
    char extra[64];
    snprintf(extra, sizeof(extra), "blocks.%d.scale_shift_table", m->n_layers);
    if (gguf_find(g, extra)) {
        rc = h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' exists but config h3r.num_layers = %d",
                        m->path, extra, m->n_layers);
        goto fail;
    }
    *out = m;
    return 0;
fail:
    wan_dit_free(m);
    return rc;
}

void wan_dit_free(wan_dit *m) {
    if (!m) return;
    free(m->blocks);
    free(m);
}

int wan_dit_in_channels(const wan_dit *m) { return m->in_ch; }
int wan_dit_out_channels(const wan_dit *m) { return m->out_ch; }
int wan_dit_text_dim(const wan_dit *m) { return m->text_dim; }
void wan_dit_patch_size(const wan_dit *m, int patch[3]) {
    patch[0] = m->patch[0];
    patch[1] = m->patch[1];
    patch[2] = m->patch[2];
}

/* ---------------------------------------------------------------- row kernels
 * Each runs over a contiguous range of rows chosen only by (ith, nth), and
 * each row's result depends on that row alone, so any thread count gives the
 * same bytes. */

enum {
    ROWS_MODNORM,   /* y[n] = ln(x[n]) * onep + shift            (N, D) */
    ROWS_AFFNORM,   /* y[n] = ln(x[n]) * w + b  (w, b may be NULL) */
    ROWS_GATED_ADD, /* x[n] += y[n] * gate  (gate NULL: x[n] += y[n]) */
    ROWS_RMS2,      /* rmsnorm x[n] with w and y[n] with w2 (q and k) */
    ROWS_ROPE,      /* rotate pairs of x[n] and y[n] by cos/sin (N, Dh/2) */
    ROWS_GELU,      /* x[n] = gelu_tanh(x[n]) */
};

typedef struct {
    int kind;
    int64_t rows, D;
    float *x, *y;
    const float *w, *w2, *b;        /* onep/shift or norm weights */
    const float *cos, *sin;         /* (N, Dh/2) */
    int heads, head_dim;
    int64_t rows2;                  /* ROWS_RMS2: rows of y (may differ from rows of x) */
    float eps;
} rows_job;

/*
 * Pool worker: applies job->kind to rows [n*ith/nth, n*(ith+1)/nth) of the
 * job's buffers (n = rows, or max(rows, rows2) for ROWS_RMS2), writing in
 * place (x) or into y as the kind says. No return value, no allocation.
 */
static void rows_worker(void *ctx, int ith, int nth) {
    const rows_job *j = ctx;
    const int64_t n_all = j->kind == ROWS_RMS2 ? (j->rows > j->rows2 ? j->rows : j->rows2)
                                               : j->rows;
    const int64_t r0 = n_all * ith / nth, r1 = n_all * (ith + 1) / nth;
    const int64_t D = j->D;
    for (int64_t r = r0; r < r1; r++) {
        switch (j->kind) {
        case ROWS_MODNORM:
        case ROWS_AFFNORM: {
            float *dst = j->y + r * D;
            memcpy(dst, j->x + r * D, (size_t)D * sizeof(float));
            if (j->kind == ROWS_AFFNORM) {
                op_layernorm(dst, 1, D, j->w, j->b, j->eps);
            } else {
                op_layernorm(dst, 1, D, NULL, NULL, j->eps);
                for (int64_t d = 0; d < D; d++) dst[d] = dst[d] * j->w[d] + j->b[d];
            }
            break;
        }
        case ROWS_GATED_ADD: {
            float *dst = j->x + r * D;
            const float *src = j->y + r * D;
            if (j->w)
                for (int64_t d = 0; d < D; d++) dst[d] = dst[d] + src[d] * j->w[d];
            else
                for (int64_t d = 0; d < D; d++) dst[d] = dst[d] + src[d];
            break;
        }
        case ROWS_GELU:
            op_gelu_tanh(j->x + r * D, D);
            break;
        case ROWS_RMS2:
            if (r < j->rows) op_rmsnorm(j->x + r * D, 1, D, j->w, j->eps);
            if (r < j->rows2) op_rmsnorm(j->y + r * D, 1, D, j->w2, j->eps);
            break;
        case ROWS_ROPE: {
            const int half = j->head_dim / 2;
            const float *c = j->cos + r * half, *s = j->sin + r * half;
            for (int which = 0; which < 2; which++) {
                float *row = (which ? j->y : j->x) + r * D;
                for (int h = 0; h < j->heads; h++) {
                    float *v = row + (int64_t)h * j->head_dim;
                    for (int i = 0; i < half; i++) {
                        const float x1 = v[2 * i], x2 = v[2 * i + 1];
                        v[2 * i] = x1 * c[i] - x2 * s[i];
                        v[2 * i + 1] = x1 * s[i] + x2 * c[i];
                    }
                }
            }
            break;
        }
        }
    }
}

static void run_rows(h3r_pool *p, rows_job *j) { h3r_pool_run(p, rows_worker, j); }

/* ---------------------------------------------------------------- forward pieces */

/*
 * Sinusoidal timestep embedding as diffusers' get_timestep_embedding with
 * flip_sin_to_cos=True, downscale_freq_shift=0, in float32 as torch computes it:
 *   out (Fq,) = [cos(t * f_i), sin(t * f_i)], f_i = exp(-ln(1e4) * i / (Fq/2)),
 * zero-padded when Fq is odd.
 */
static void timestep_sinusoid(float t, int freq_dim, float *out) {
    const int half = freq_dim / 2;
    const float c = (float)(-log(10000.0));
    for (int i = 0; i < half; i++) {
        float e = (c * (float)i) / (float)half;
        float arg = t * expf(e);
        out[i] = cosf(arg);
        out[half + i] = sinf(arg);
    }
    if (freq_dim % 2) out[freq_dim - 1] = 0.0f;
}

/*
 * Rope tables for the token grid (gt, gy, gx), as WanRotaryPosEmbed: a head's
 * Dh/2 pairs are split into t, h, w parts of rope_t/2, rope_h/2, rope_w/2
 * pairs; pair i of a part of d dims at position p turns by
 * p / 10000^(2i/d), computed in float64 and rounded to float32.
 *   cos, sin (N, Dh/2), token n = (f*gy + y)*gx + x.
 * The angles depend on one axis each, so the trig is done once per axis
 * position into ax (gt + gy + gx rows of at most Dh/2 pairs, cos then sin)
 * and the per-token rows are copied from there.
 */
static void rope_tables(const wan_dit *m, int gt, int gy, int gx, float *ax,
                        float *cos_t, float *sin_t) {
    const int half = m->head_dim / 2;
    const int parts[3] = {m->rope_t / 2, m->rope_h / 2, m->rope_w / 2}; /* pairs per axis */
    const int len[3] = {gt, gy, gx};
    float *tab[3][2];                        /* [axis][cos|sin] (len, parts) */
    float *next = ax;
    for (int a = 0; a < 3; a++) {
        tab[a][0] = next;
        tab[a][1] = next + (int64_t)len[a] * parts[a];
        next = tab[a][1] + (int64_t)len[a] * parts[a];
        for (int p = 0; p < len[a]; p++)
            for (int i = 0; i < parts[a]; i++) {
                double inv = 1.0 / pow(WAN_ROPE_THETA, (double)(2 * i) / (2 * parts[a]));
                double ang = (double)p * inv;
                tab[a][0][(int64_t)p * parts[a] + i] = (float)cos(ang);
                tab[a][1][(int64_t)p * parts[a] + i] = (float)sin(ang);
            }
    }
    int64_t n = 0;
    for (int f = 0; f < gt; f++)
        for (int y = 0; y < gy; y++)
            for (int x = 0; x < gx; x++, n++) {
                const int pos[3] = {f, y, x};
                for (int w = 0; w < 2; w++) {
                    float *row = (w ? sin_t : cos_t) + n * half;
                    for (int a = 0; a < 3; a++) {
                        memcpy(row, tab[a][w] + (int64_t)pos[a] * parts[a],
                               (size_t)parts[a] * sizeof(float));
                        row += parts[a];
                    }
                }
            }
}

/*
 * One attention sub-layer.
 *   xq (Nq, D) query source, xkv (Nk, D) key/value source (== xq for self)
 *   -> out (Nq, D) after to_out.0, with q/k RMS-normed over all heads and,
 *   when cos is non-NULL, rope applied to q and k.
 * Writes q, k, v (rows Nq / Nk / Nk) and att (Nq, D) as scratch.
 */
static int attention_layer(const wan_dit *m, h3r_pool *p, const wan_attn *a,
                           const float *xq, int64_t Nq, const float *xkv, int64_t Nk,
                           const float *cos, const float *sin,
                           float *q, float *k, float *v, float *att, float *out) {
    const int64_t D = m->dim;
    int rc;
    if ((rc = op_matmul(p, q, xq, a->q_w, a->q_b, Nq)) < 0) return rc;
    if ((rc = op_matmul(p, k, xkv, a->k_w, a->k_b, Nk)) < 0) return rc;
    if ((rc = op_matmul(p, v, xkv, a->v_w, a->v_b, Nk)) < 0) return rc;
    rows_job j = {.kind = ROWS_RMS2, .rows = Nq, .rows2 = Nk, .D = D, .x = q, .y = k,
                  .w = a->norm_q, .w2 = a->norm_k, .eps = m->eps};
    run_rows(p, &j);
    if (cos) {
        /* self-attention only: Nq == Nk == N */
        rows_job r = {.kind = ROWS_ROPE, .rows = Nq, .D = D, .x = q, .y = k, .cos = cos,
                      .sin = sin, .heads = m->heads, .head_dim = m->head_dim};
        run_rows(p, &r);
    }
    const float scale = 1.0f / sqrtf((float)m->head_dim);
    if ((rc = op_attention(p, att, q, k, v, Nq, Nk, m->heads, m->head_dim, scale, NULL)) < 0)
        return rc;
    return op_matmul(p, out, att, a->o_w, a->o_b, Nq);
}

/* ---------------------------------------------------------------- forward */

/*
 * Check a forward's shapes: C the model's in_channels; T, Y, X positive
 * multiples of the patch size whose token grid fits the rope table; L in
 * [1, 2^20]. Returns 0, or H3R_ERR_INVALID with a message naming the value.
 * The forward calls it, and so does the engine's estimate, so a bad size gets
 * one message from both.
 */
int wan_dit_check_shape(const wan_dit *m, int C, int T, int Y, int X, int L) {
    if (C != m->in_ch)
        return h3r_seterr(H3R_ERR_INVALID, "dit forward: x has %d channels; %s wants "
                          "in_channels = %d", C, m->path, m->in_ch);
    const int dims[3] = {T, Y, X};
    const char *names[3] = {"frames (T)", "height (Y)", "width (X)"};
    for (int a = 0; a < 3; a++) {
        if (dims[a] < 1 || dims[a] % m->patch[a] != 0)
            return h3r_seterr(H3R_ERR_INVALID, "dit forward: latent %s = %d must be a positive "
                              "multiple of the patch size %d", names[a], dims[a], m->patch[a]);
        if (dims[a] / m->patch[a] > m->rope_max)
            return h3r_seterr(H3R_ERR_INVALID, "dit forward: latent %s = %d gives %d positions; "
                              "the rope table holds %d (rope_max_seq_len)", names[a], dims[a],
                              dims[a] / m->patch[a], m->rope_max);
    }
    if (L < 1 || L > (1 << 20))
        return h3r_seterr(H3R_ERR_INVALID, "dit forward: context length %d must be in [1, %d]",
                          L, 1 << 20);
    return 0;
}

/* The forward's scratch block, part by part, in floats: the one table the
 * forward carves its buffers from and the estimate sums. */
enum {
    DS_PATCHES, /* (N, P) patch vectors */
    DS_H,       /* (N, D) hidden states */
    DS_NRM,     /* (N, D) normed input of a sub-layer, attention output */
    DS_Q,       /* (N, D) q, sub-layer output */
    DS_K,       /* (max(N, L), D) */
    DS_V,       /* (max(N, L), D) */
    DS_CTX,     /* (L, D) embedded context */
    DS_FF,      /* (R, F) FFN hidden for R rows */
    DS_RCOS,    /* (N, Dh/2) rope cos */
    DS_RSIN,    /* (N, Dh/2) rope sin */
    DS_TFREQ,   /* (Fq) timestep sinusoid */
    DS_T1,      /* (D) */
    DS_TEMB,    /* (D) */
    DS_TPROJ,   /* (6, D) */
    DS_ONEP,    /* (D) */
    DS_RAX,     /* (gt + gy + gx, Dh) rope per-axis cos, sin (<= Dh/2 each) */
    DS_PROJ,    /* (N, Po) output patches */
    DS_PARTS
};

/* Token grid of a checked shape. */
static void token_grid(const wan_dit *m, int T, int Y, int X, int *gt, int *gy, int *gx) {
    *gt = T / m->patch[0];
    *gy = Y / m->patch[1];
    *gx = X / m->patch[2];
}

static void scratch_sizes(const wan_dit *m, int T, int Y, int X, int L, int64_t sz[DS_PARTS]) {
    int gt, gy, gx;
    token_grid(m, T, Y, X, &gt, &gy, &gx);
    const int64_t N = (int64_t)gt * gy * gx, D = m->dim, F = m->ffn_dim;
    const int64_t ps = (int64_t)m->patch[0] * m->patch[1] * m->patch[2];
    const int64_t NL = N > L ? N : L, R = N < WAN_FFN_ROWS ? N : WAN_FFN_ROWS;
    sz[DS_PATCHES] = N * m->in_ch * ps;
    sz[DS_H] = sz[DS_NRM] = sz[DS_Q] = N * D;
    sz[DS_K] = sz[DS_V] = NL * D;
    sz[DS_CTX] = (int64_t)L * D;
    sz[DS_FF] = R * F;
    sz[DS_RCOS] = sz[DS_RSIN] = N * (m->head_dim / 2);
    sz[DS_TFREQ] = m->freq_dim;
    sz[DS_T1] = sz[DS_TEMB] = sz[DS_ONEP] = D;
    sz[DS_TPROJ] = 6 * D;
    sz[DS_RAX] = (int64_t)(gt + gy + gx) * m->head_dim;
    sz[DS_PROJ] = N * m->out_ch * ps;
}

int64_t wan_dit_scratch_floats(const wan_dit *m, int T, int Y, int X, int L) {
    int64_t sz[DS_PARTS], total = 0;
    scratch_sizes(m, T, Y, X, L, sz);
    for (int i = 0; i < DS_PARTS; i++) {
        if (sz[i] < 0 || total > INT64_MAX / 8 - sz[i]) return -1;
        total += sz[i];
    }
    return total;
}

/* Largest scratch one op of the forward allocates on top of the block: every
 * matmul with the rows it is called with, and the attention tiles. */
static int64_t op_scratch_max(const wan_dit *m, int64_t N, int L, int nth) {
    const int64_t R = N < WAN_FFN_ROWS ? N : WAN_FFN_ROWS;
    struct { const h3r_tensor *w; int64_t rows; } mm[] = {
        {m->patch_w, N}, {m->time1_w, 1}, {m->time2_w, 1}, {m->tproj_w, 1},
        {m->text1_w, L}, {m->text2_w, L}, {m->proj_w, N},
    };
    int64_t mx = op_attention_scratch_bytes(m->head_dim, nth);
#define MM_MAX(W, rows)                                                                 \
    do {                                                                                \
        int64_t b_ = op_matmul_scratch_bytes((W)->type, (W)->ne[0], (rows), nth);       \
        if (b_ > mx) mx = b_;                                                           \
    } while (0)
    for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++) MM_MAX(mm[i].w, mm[i].rows);
    for (int i = 0; i < m->n_layers; i++) {
        const wan_block *b = &m->blocks[i];
        const wan_attn *a[2] = {&b->self, &b->cross};
        for (int s = 0; s < 2; s++) {
            MM_MAX(a[s]->q_w, N);
            MM_MAX(a[s]->k_w, s ? L : N);
            MM_MAX(a[s]->v_w, s ? L : N);
            MM_MAX(a[s]->o_w, N);
        }
        MM_MAX(b->up_w, R);
        MM_MAX(b->down_w, R);
    }
#undef MM_MAX
    return mx;
}

int64_t wan_dit_forward_bytes(const wan_dit *m, int T, int Y, int X, int L, int nth) {
    int64_t floats = wan_dit_scratch_floats(m, T, Y, X, L);
    if (floats < 0 || floats > INT64_MAX / 8) return -1;
    int gt, gy, gx;
    token_grid(m, T, Y, X, &gt, &gy, &gx);
    return floats * (int64_t)sizeof(float) + op_scratch_max(m, (int64_t)gt * gy * gx, L, nth);
}

/*
 * One DiT forward: x (C, T, Y, X), a scalar timestep and context (L, Dt)
 * -> out (Co, T, Y, X), the flow prediction. The shapes must pass
 * wan_dit_check_shape. Allocates one scratch block laid out by scratch_sizes,
 * frees it before returning. Calls tap (if non-NULL) with each named stage.
 * Returns 0, or a negative code with a message: H3R_ERR_INVALID for bad
 * arguments, H3R_ERR_NOMEM, or an op error.
 */
int wan_dit_forward(const wan_dit *m, h3r_pool *p, const float *x, int C, int T, int Y, int X,
                    float timestep, const float *context, int L, float *out,
                    h3r_tap_fn tap, void *tap_user) {
    const int pt = m->patch[0], py = m->patch[1], px = m->patch[2];
    if (!x || !context || !out)
        return h3r_seterr(H3R_ERR_INVALID, "dit forward: x, context and out must not be NULL");
    int rc = wan_dit_check_shape(m, C, T, Y, X, L);
    if (rc < 0) return rc;
    if (!isfinite(timestep))
        return h3r_seterr(H3R_ERR_INVALID, "dit forward: timestep is not finite");

    int gt, gy, gx;
    token_grid(m, T, Y, X, &gt, &gy, &gx);
    const int64_t N = (int64_t)gt * gy * gx, D = m->dim, F = m->ffn_dim;
    const int64_t P = (int64_t)C * pt * py * px, Po = (int64_t)m->out_ch * pt * py * px;
    const int64_t R = N < WAN_FFN_ROWS ? N : WAN_FFN_ROWS;

    int64_t sz[DS_PARTS];
    scratch_sizes(m, T, Y, X, L, sz);
    const int64_t total = wan_dit_scratch_floats(m, T, Y, X, L);
    if (total < 0)
        return h3r_seterr(H3R_ERR_NOMEM, "dit forward: scratch size overflows");
    if ((uint64_t)total > SIZE_MAX / sizeof(float))
        return h3r_seterr(H3R_ERR_NOMEM, "dit forward: scratch of %lld floats does not fit memory",
                          (long long)total);
    float *buf = malloc((size_t)total * sizeof(float));
    if (!buf)
        return h3r_seterr(H3R_ERR_NOMEM, "dit forward: cannot allocate %lld MB of scratch for "
                          "%lld tokens", (long long)(total * 4 >> 20), (long long)N);
    float *part[DS_PARTS];
    part[0] = buf;
    for (int i = 1; i < DS_PARTS; i++) part[i] = part[i - 1] + sz[i - 1];
    float *patches = part[DS_PATCHES], *h = part[DS_H], *nrm = part[DS_NRM], *q = part[DS_Q];
    float *k = part[DS_K], *v = part[DS_V], *ctx = part[DS_CTX], *ff = part[DS_FF];
    float *rcos = part[DS_RCOS], *rsin = part[DS_RSIN];
    float *tfreq = part[DS_TFREQ], *t1 = part[DS_T1], *temb = part[DS_TEMB];
    float *tproj = part[DS_TPROJ], *onep = part[DS_ONEP], *rax = part[DS_RAX];
    float *proj = part[DS_PROJ];
    char name[48];

    /* patchify: patches (N, P), P index = ((c*pt + kt)*py + ky)*px + kx */
    for (int f = 0; f < gt; f++)
        for (int yy = 0; yy < gy; yy++)
            for (int xx = 0; xx < gx; xx++) {
                float *row = patches + (((int64_t)f * gy + yy) * gx + xx) * P;
                for (int c = 0; c < C; c++)
                    for (int kt = 0; kt < pt; kt++)
                        for (int ky = 0; ky < py; ky++) {
                            const float *src = x + (((int64_t)c * T + f * pt + kt) * Y +
                                                    yy * py + ky) * X + (int64_t)xx * px;
                            memcpy(row, src, (size_t)px * sizeof(float));
                            row += px;
                        }
            }
    if ((rc = op_matmul(p, h, patches, m->patch_w, m->patch_b, N)) < 0) goto done;
    if (tap) tap(tap_user, "dit.patch_embed", h, N * D);

    /* condition embedder: temb (D), tproj (6, D), ctx (L, D) */
    timestep_sinusoid(timestep, m->freq_dim, tfreq);
    if ((rc = op_matmul(p, t1, tfreq, m->time1_w, m->time1_b, 1)) < 0) goto done;
    op_silu(t1, D);
    if ((rc = op_matmul(p, temb, t1, m->time2_w, m->time2_b, 1)) < 0) goto done;
    if (tap) tap(tap_user, "dit.temb", temb, D);
    memcpy(t1, temb, (size_t)D * sizeof(float));
    op_silu(t1, D);
    if ((rc = op_matmul(p, tproj, t1, m->tproj_w, m->tproj_b, 1)) < 0) goto done;
    if (tap) tap(tap_user, "dit.timestep_proj", tproj, 6 * D);
    /* text embedder: linear_1, gelu(tanh), linear_2; k is free scratch here */
    if ((rc = op_matmul(p, k, context, m->text1_w, m->text1_b, L)) < 0) goto done;
    op_gelu_tanh(k, (int64_t)L * D);
    if ((rc = op_matmul(p, ctx, k, m->text2_w, m->text2_b, L)) < 0) goto done;
    if (tap) tap(tap_user, "dit.context", ctx, (int64_t)L * D);

    rope_tables(m, gt, gy, gx, rax, rcos, rsin);

    for (int i = 0; i < m->n_layers; i++) {
        const wan_block *b = &m->blocks[i];
        /* mod (6, D) = sst + tproj: shift, scale, gate, c_shift, c_scale, c_gate */
        float *shift = t1; /* reuse: t1 (D) is free after the embedder */
        /* 1. self-attention: nrm = ln(h) * (1 + scale) + shift */
        for (int64_t d = 0; d < D; d++) {
            onep[d] = 1.0f + (b->sst[1 * D + d] + tproj[1 * D + d]);
            shift[d] = b->sst[0 * D + d] + tproj[0 * D + d];
        }
        rows_job j = {.kind = ROWS_MODNORM, .rows = N, .D = D, .x = h, .y = nrm, .w = onep,
                      .b = shift, .eps = m->eps};
        run_rows(p, &j);
        if ((rc = attention_layer(m, p, &b->self, nrm, N, nrm, N, rcos, rsin, q, k, v, nrm, q)) < 0)
            goto done;
        for (int64_t d = 0; d < D; d++) onep[d] = b->sst[2 * D + d] + tproj[2 * D + d]; /* gate */
        rows_job ga = {.kind = ROWS_GATED_ADD, .rows = N, .D = D, .x = h, .y = q, .w = onep};
        run_rows(p, &ga);

        /* 2. cross-attention on the context, no gate */
        rows_job n2 = {.kind = ROWS_AFFNORM, .rows = N, .D = D, .x = h, .y = nrm,
                       .w = b->norm2_w, .b = b->norm2_b, .eps = m->eps};
        if (m->cross_attn_norm) run_rows(p, &n2);
        else memcpy(nrm, h, (size_t)(N * D) * sizeof(float));
        if ((rc = attention_layer(m, p, &b->cross, nrm, N, ctx, L, NULL, NULL, q, k, v, nrm, q)) < 0)
            goto done;
        rows_job ad = {.kind = ROWS_GATED_ADD, .rows = N, .D = D, .x = h, .y = q, .w = NULL};
        run_rows(p, &ad);

        /* 3. FFN: nrm = ln(h) * (1 + c_scale) + c_shift; h += c_gate * ffn(nrm) */
        for (int64_t d = 0; d < D; d++) {
            onep[d] = 1.0f + (b->sst[4 * D + d] + tproj[4 * D + d]);
            shift[d] = b->sst[3 * D + d] + tproj[3 * D + d];
        }
        rows_job j3 = {.kind = ROWS_MODNORM, .rows = N, .D = D, .x = h, .y = nrm, .w = onep,
                       .b = shift, .eps = m->eps};
        run_rows(p, &j3);
        for (int64_t r0 = 0; r0 < N; r0 += R) {
            const int64_t nr = N - r0 < R ? N - r0 : R;
            if ((rc = op_matmul(p, ff, nrm + r0 * D, b->up_w, b->up_b, nr)) < 0) goto done;
            rows_job gl = {.kind = ROWS_GELU, .rows = nr, .D = F, .x = ff};
            run_rows(p, &gl);
            if ((rc = op_matmul(p, q + r0 * D, ff, b->down_w, b->down_b, nr)) < 0) goto done;
        }
        for (int64_t d = 0; d < D; d++) onep[d] = b->sst[5 * D + d] + tproj[5 * D + d];
        rows_job g3 = {.kind = ROWS_GATED_ADD, .rows = N, .D = D, .x = h, .y = q, .w = onep};
        run_rows(p, &g3);

        snprintf(name, sizeof(name), "dit.block.%d", i);
        if (tap) tap(tap_user, name, h, N * D);
    }

    /* head: ln(h) * (1 + scale) + shift with (shift, scale) = out_sst + temb */
    {
        float *shift = t1;
        for (int64_t d = 0; d < D; d++) {
            shift[d] = m->out_sst[d] + temb[d];
            onep[d] = 1.0f + (m->out_sst[D + d] + temb[d]);
        }
        rows_job j = {.kind = ROWS_MODNORM, .rows = N, .D = D, .x = h, .y = nrm, .w = onep,
                      .b = shift, .eps = m->eps};
        run_rows(p, &j);
    }
    if ((rc = op_matmul(p, proj, nrm, m->proj_w, m->proj_b, N)) < 0) goto done;

    /* unpatchify: proj (N, Po), Po index = ((kt*py + ky)*px + kx)*Co + c
     * -> out (Co, T, Y, X) */
    {
        const int Co = m->out_ch;
        for (int f = 0; f < gt; f++)
            for (int yy = 0; yy < gy; yy++)
                for (int xx = 0; xx < gx; xx++) {
                    const float *row = proj + (((int64_t)f * gy + yy) * gx + xx) * Po;
                    for (int kt = 0; kt < pt; kt++)
                        for (int ky = 0; ky < py; ky++)
                            for (int kx = 0; kx < px; kx++)
                                for (int c = 0; c < Co; c++)
                                    out[(((int64_t)c * T + f * pt + kt) * Y + yy * py + ky) * X +
                                        xx * px + kx] = *row++;
                }
    }
    if (tap) tap(tap_user, "dit.out", out, (int64_t)m->out_ch * T * Y * X);
done:
    free(buf);
    return rc;
}
