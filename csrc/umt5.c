/*
 * UMT5 text encoder: transformers' UMT5EncoderModel, forward over the real tokens.
 *
 * Legend (see internal.h):  n real tokens   D d_model   H heads   Dh d_kv
 *                           F d_ff          V vocab     B relative attention buckets
 *
 *   x = embed[ids]                                         (n, D)
 *   for each block:
 *     h = rmsnorm(x) * ln_attn
 *     q, k, v = h @ Wq^T, h @ Wk^T, h @ Wv^T               (n, H*Dh)
 *     bias[h][i][j] = rel_bias[bucket(j - i)][h]           (H, n, n)   every layer has its own table
 *     x += softmax(q k^T + bias) v @ Wo^T                  no 1/sqrt(Dh) scaling
 *     h = rmsnorm(x) * ln_ff
 *     x += (gelu_tanh(h @ wi_0^T) * (h @ wi_1^T)) @ wo^T   (n, F) -> (n, D)
 *   out = rmsnorm(x) * final_layer_norm                    (n, D)
 *
 * The Wan pipeline runs the encoder over ids padded to text_len with an attention
 * mask and keeps the first n rows. Masked keys get -inf before the softmax, so they
 * contribute exactly nothing to real rows, and the relative bias depends only on
 * j - i: running the n real tokens alone gives the same rows. The engine pads the
 * output with zero rows, as the pipeline does.
 *
 * Tensor names are those transformers writes with save_pretrained:
 *   shared.weight (or encoder.embed_tokens.weight)            (V, D)
 *   encoder.block.<i>.layer.0.layer_norm.weight               (D,)
 *   encoder.block.<i>.layer.0.SelfAttention.{q,k,v}.weight    (H*Dh, D)
 *   encoder.block.<i>.layer.0.SelfAttention.o.weight          (D, H*Dh)
 *   encoder.block.<i>.layer.0.SelfAttention.relative_attention_bias.weight  (B, H)
 *   encoder.block.<i>.layer.1.layer_norm.weight               (D,)
 *   encoder.block.<i>.layer.1.DenseReluDense.wi_{0,1}.weight  (F, D)
 *   encoder.block.<i>.layer.1.DenseReluDense.wo.weight        (D, F)
 *   encoder.final_layer_norm.weight                           (D,)
 * Shapes above are numpy (out, in); in GGML order ne = {in, out}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models.h"

/* Sanity bounds on config values, far above any released UMT5 (xxl: D 4096,
 * F 10240, H 64, 24 layers, V 256384). They keep every size product inside
 * int64 and every per-token dimension inside int. */
#define UMT5_MAX_DIM     (1 << 16)  /* D, F, H*Dh */
#define UMT5_MAX_VOCAB   (1 << 24)
#define UMT5_MAX_LAYERS  1024
#define UMT5_MAX_BUCKETS 4096
#define UMT5_MAX_TOKENS  (1 << 16)  /* per encode call */

typedef struct {
    const float *ln_attn;          /* (D,) */
    const h3r_tensor *q, *k, *v;   /* (H*Dh, D) */
    const h3r_tensor *o;           /* (D, H*Dh) */
    const h3r_tensor *rel_bias;    /* (B, H), F32 or F16 */
    const float *ln_ff;            /* (D,) */
    const h3r_tensor *wi0, *wi1;   /* (F, D) */
    const h3r_tensor *wo;          /* (D, F) */
} umt5_layer;

struct umt5 {
    /* config, validated once at load */
    int vocab, d_model, d_kv, n_heads, d_ff, n_layers;
    int num_buckets, max_distance;
    float eps;
    /* weights: const pointers into the read-only mapping */
    const h3r_tensor *embed;       /* (V, D), F32 or F16 */
    const float *final_norm;       /* (D,) */
    umt5_layer *layers;            /* (n_layers,) */
};

/* ---------------------------------------------------------------- loading */

/* Read an integer config key "h3r.<key>" into *out, requiring lo <= value <= hi.
 * Returns 0, or a negative code with a message naming file, key, value and range. */
static int cfg_int(const gguf_file *g, const char *key, int64_t lo, int64_t hi, int *out) {
    char full[128];
    snprintf(full, sizeof full, "h3r.%s", key);
    int64_t v;
    int rc = gguf_get_int(g, full, &v);
    if (rc < 0) return rc;
    if (v < lo || v > hi)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: config %s = %lld is out of range [%lld, %lld]",
                          gguf_path(g), full, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

/* A weight (rows, cols) in numpy order, i.e. ne = {cols, rows}; gguf_get_tensor
 * checks presence, every dim and that the type is known. Tensors whose rows we read
 * directly (embedding, bias tables) must also be F32 or F16. */
static int get_weight(const gguf_file *g, const char *name, int64_t rows, int64_t cols,
                      int need_rows_readable, const h3r_tensor **out) {
    int rc = gguf_get_tensor(g, name, cols, rows, 1, 1, out);
    if (rc < 0) return rc;
    const h3r_tensor *t = *out;
    if (need_rows_readable && t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16)
        return h3r_seterr(H3R_ERR_UNSUPPORTED,
                          "%s: tensor '%s' has type %s; the UMT5 encoder reads it by rows and "
                          "needs F32 or F16", gguf_path(g), name, ggml_type_name(t->type));
    return 0;
}

/* An F32 vector of exactly d elements (the RMSNorm weights). */
static int get_norm(const gguf_file *g, const char *name, int d, const float **out) {
    const h3r_tensor *t;
    int rc = gguf_get_tensor(g, name, d, 1, 1, 1, &t);
    if (rc < 0) return rc;
    if (t->type != GGML_TYPE_F32)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has type %s; norm weights must be F32",
                          gguf_path(g), name, ggml_type_name(t->type));
    return tensor_f32(t, out);
}

/* Check the optional string/bool config keys that change the architecture. We only
 * implement the encoder with the gated-GELU FFN ("gated-gelu", act gelu_new). */
static int check_arch(const gguf_file *g) {
    const char *s;
    size_t len;
    if (gguf_has_key(g, "h3r.feed_forward_proj")) {
        int rc = gguf_get_str(g, "h3r.feed_forward_proj", &s, &len);
        if (rc < 0) return rc;
        if (len != strlen("gated-gelu") || memcmp(s, "gated-gelu", len) != 0)
            return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: config h3r.feed_forward_proj = '%.*s'; "
                              "only 'gated-gelu' (UMT5) is supported", gguf_path(g),
                              (int)(len > 64 ? 64 : len), s);
    }
    if (gguf_has_key(g, "h3r.dense_act_fn")) {
        int rc = gguf_get_str(g, "h3r.dense_act_fn", &s, &len);
        if (rc < 0) return rc;
        if (len != strlen("gelu_new") || memcmp(s, "gelu_new", len) != 0)
            return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: config h3r.dense_act_fn = '%.*s'; "
                              "only 'gelu_new' is supported", gguf_path(g),
                              (int)(len > 64 ? 64 : len), s);
    }
    if (gguf_has_key(g, "h3r.is_decoder")) {
        int dec;
        int rc = gguf_get_bool(g, "h3r.is_decoder", &dec);
        if (rc < 0) return rc;
        if (dec)
            return h3r_seterr(H3R_ERR_UNSUPPORTED, "%s: config h3r.is_decoder = true; only the "
                              "UMT5 encoder is supported", gguf_path(g));
    }
    return 0;
}

/* Load a UMT5 encoder from a GGUF file written by convert.py.
 * Validates the config (ranges, bucket geometry) and the name, shape and type of
 * every tensor used by umt5_encode. On success *out owns a new model that points
 * into g's mapping (g must outlive it) and 0 is returned; on failure *out is NULL
 * and a negative code is returned with a message naming the file and key/tensor. */
int umt5_load(const gguf_file *g, umt5 **out) {
    *out = NULL;
    umt5 *m = calloc(1, sizeof *m);
    if (!m) return h3r_seterr(H3R_ERR_NOMEM, "%s: out of memory for the UMT5 model", gguf_path(g));
    int rc;
    double eps = 1e-6;
    if ((rc = check_arch(g)) < 0) goto fail;
    if ((rc = cfg_int(g, "vocab_size", 1, UMT5_MAX_VOCAB, &m->vocab)) < 0) goto fail;
    if ((rc = cfg_int(g, "d_model", 1, UMT5_MAX_DIM, &m->d_model)) < 0) goto fail;
    if ((rc = cfg_int(g, "d_kv", 1, UMT5_MAX_DIM, &m->d_kv)) < 0) goto fail;
    if ((rc = cfg_int(g, "num_heads", 1, UMT5_MAX_DIM, &m->n_heads)) < 0) goto fail;
    if ((rc = cfg_int(g, "d_ff", 1, UMT5_MAX_DIM, &m->d_ff)) < 0) goto fail;
    if ((rc = cfg_int(g, "num_layers", 1, UMT5_MAX_LAYERS, &m->n_layers)) < 0) goto fail;
    /* Bidirectional buckets: B/2 per direction, of which B/4 exact; B >= 4 keeps
     * max_exact >= 1 so the logarithm below is defined. */
    if ((rc = cfg_int(g, "relative_attention_num_buckets", 4, UMT5_MAX_BUCKETS,
                      &m->num_buckets)) < 0) goto fail;
    if ((rc = cfg_int(g, "relative_attention_max_distance", 1, 1 << 30, &m->max_distance)) < 0)
        goto fail;
    if (m->max_distance <= m->num_buckets / 4) {
        rc = h3r_seterr(H3R_ERR_FORMAT, "%s: config h3r.relative_attention_max_distance = %d must "
                        "exceed relative_attention_num_buckets/4 = %d (the exact buckets)",
                        gguf_path(g), m->max_distance, m->num_buckets / 4);
        goto fail;
    }
    if ((int64_t)m->n_heads * m->d_kv > UMT5_MAX_DIM) {
        rc = h3r_seterr(H3R_ERR_FORMAT, "%s: config num_heads * d_kv = %d * %d exceeds %d",
                        gguf_path(g), m->n_heads, m->d_kv, UMT5_MAX_DIM);
        goto fail;
    }
    if (gguf_has_key(g, "h3r.layer_norm_epsilon")) {
        if ((rc = gguf_get_float(g, "h3r.layer_norm_epsilon", &eps)) < 0) goto fail;
        if (!(eps > 0.0 && eps < 1.0)) {
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: config h3r.layer_norm_epsilon = %g must be in "
                            "(0, 1)", gguf_path(g), eps);
            goto fail;
        }
    }
    m->eps = (float)eps;

    const int D = m->d_model, F = m->d_ff, HD = m->n_heads * m->d_kv;
    const char *embed_name = gguf_find(g, "shared.weight") ? "shared.weight"
                                                           : "encoder.embed_tokens.weight";
    if ((rc = get_weight(g, embed_name, m->vocab, D, 1, &m->embed)) < 0) goto fail;
    if ((rc = get_norm(g, "encoder.final_layer_norm.weight", D, &m->final_norm)) < 0) goto fail;

    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) {
        rc = h3r_seterr(H3R_ERR_NOMEM, "%s: out of memory for %d UMT5 layers", gguf_path(g),
                        m->n_layers);
        goto fail;
    }
    for (int i = 0; i < m->n_layers; i++) {
        umt5_layer *L = &m->layers[i];
        char name[160];
#define NAME(suffix) (snprintf(name, sizeof name, "encoder.block.%d.%s", i, suffix), name)
        if ((rc = get_norm(g, NAME("layer.0.layer_norm.weight"), D, &L->ln_attn)) < 0) goto fail;
        if ((rc = get_weight(g, NAME("layer.0.SelfAttention.q.weight"), HD, D, 0, &L->q)) < 0)
            goto fail;
        if ((rc = get_weight(g, NAME("layer.0.SelfAttention.k.weight"), HD, D, 0, &L->k)) < 0)
            goto fail;
        if ((rc = get_weight(g, NAME("layer.0.SelfAttention.v.weight"), HD, D, 0, &L->v)) < 0)
            goto fail;
        if ((rc = get_weight(g, NAME("layer.0.SelfAttention.o.weight"), D, HD, 0, &L->o)) < 0)
            goto fail;
        if ((rc = get_weight(g, NAME("layer.0.SelfAttention.relative_attention_bias.weight"),
                             m->num_buckets, m->n_heads, 1, &L->rel_bias)) < 0)
            goto fail;
        if ((rc = get_norm(g, NAME("layer.1.layer_norm.weight"), D, &L->ln_ff)) < 0) goto fail;
        if ((rc = get_weight(g, NAME("layer.1.DenseReluDense.wi_0.weight"), F, D, 0, &L->wi0)) < 0)
            goto fail;
        if ((rc = get_weight(g, NAME("layer.1.DenseReluDense.wi_1.weight"), F, D, 0, &L->wi1)) < 0)
            goto fail;
        if ((rc = get_weight(g, NAME("layer.1.DenseReluDense.wo.weight"), D, F, 0, &L->wo)) < 0)
            goto fail;
#undef NAME
    }
    *out = m;
    return 0;
fail:
    umt5_free(m);
    return rc;
}

void umt5_free(umt5 *m) {
    if (!m) return;
    free(m->layers);
    free(m);
}

int umt5_d_model(const umt5 *m) { return m->d_model; }
int umt5_vocab_size(const umt5 *m) { return m->vocab; }

/* ---------------------------------------------------------------- forward */

/* Element (row, col) of an F32 or F16 2-D tensor with ne = {cols, rows}. */
static float tensor_get(const h3r_tensor *t, int64_t row, int64_t col) {
    int64_t i = row * t->ne[0] + col;
    if (t->type == GGML_TYPE_F16) return h3r_f16_to_f32(((const uint16_t *)t->data)[i]);
    return ((const float *)t->data)[i];
}

/* Bucket of relative position rel = key_pos - query_pos for a bidirectional
 * encoder, exactly as UMT5Attention._relative_position_bucket (is_decoder=False):
 * half the buckets for rel > 0; within a half, |rel| < max_exact maps to itself,
 * larger |rel| to max_exact + floor(log(|rel|/max_exact) / log(max_distance/max_exact)
 * * (half - max_exact)), capped at half - 1. The arithmetic is float32 in the
 * same order as torch, so the truncation lands on the same side at every rel. */
static int rel_bucket(int rel, int num_buckets, int max_distance) {
    int half = num_buckets / 2;
    int bucket = rel > 0 ? half : 0;
    int a = rel < 0 ? -rel : rel;
    int max_exact = half / 2;
    if (a < max_exact) return bucket + a;
    float denom = (float)log((double)max_distance / (double)max_exact);
    float r = logf((float)a / (float)max_exact) / denom;
    r = r * (float)(half - max_exact);
    int64_t large = (int64_t)max_exact + (int64_t)r;
    if (large > half - 1) large = half - 1;
    return bucket + (int)large;
}

/* Copy the n*D floats at src into dst and apply RMSNorm with weight w. */
static void norm_into(float *dst, const float *src, int64_t n, int64_t D, const float *w,
                      float eps) {
    memcpy(dst, src, (size_t)(n * D) * sizeof(float));
    op_rmsnorm(dst, n, D, w, eps);
}

/* 0, or H3R_ERR_INVALID naming the problem: n outside [0, 65536], or an id
 * outside the vocabulary. umt5_encode checks with it; so does the estimate. */
int umt5_check_ids(const umt5 *m, const int32_t *ids, int n) {
    if (n < 0 || n > UMT5_MAX_TOKENS)
        return h3r_seterr(H3R_ERR_INVALID, "umt5: token count n = %d must be in [0, %d]", n,
                          UMT5_MAX_TOKENS);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->vocab)
            return h3r_seterr(H3R_ERR_INVALID, "umt5: token id %d at position %d is outside the "
                              "vocabulary: ids must be in [0, %d) (vocab_size %d)", (int)ids[i],
                              i, m->vocab, m->vocab);
    return 0;
}

/* Scratch of one encode of n tokens, buffer by buffer: the table umt5_encode
 * allocates from and the estimate sums. Float buffers, then the bucket ints. */
enum {
    US_X,      /* (n, D) residual stream */
    US_H,      /* (n, D) normed input */
    US_Y,      /* (n, D) sublayer output */
    US_Q,      /* (n, H*Dh) */
    US_K,      /* (n, H*Dh) */
    US_V,      /* (n, H*Dh) */
    US_A,      /* (n, H*Dh) attention output */
    US_G0,     /* (n, F) gelu branch */
    US_G1,     /* (n, F) linear branch */
    US_BIAS,   /* (H, n, n) */
    US_TABLE,  /* (B, H) one layer's table */
    US_FLOATS,
    US_BUCKET = US_FLOATS, /* (2n-1,) ints by rel + n-1 */
    US_PARTS
};

static void encode_sizes(const umt5 *m, int64_t N, size_t sz[US_PARTS]) {
    const int64_t D = m->d_model, F = m->d_ff, H = m->n_heads, HD = (int64_t)m->n_heads * m->d_kv;
    sz[US_X] = sz[US_H] = sz[US_Y] = (size_t)(N * D) * sizeof(float);
    sz[US_Q] = sz[US_K] = sz[US_V] = sz[US_A] = (size_t)(N * HD) * sizeof(float);
    sz[US_G0] = sz[US_G1] = (size_t)(N * F) * sizeof(float);
    sz[US_BIAS] = (size_t)(H * N * N) * sizeof(float);
    sz[US_TABLE] = (size_t)(m->num_buckets * H) * sizeof(float);
    sz[US_BUCKET] = (size_t)(2 * N - 1) * sizeof(int);
}

int64_t umt5_encode_bytes(const umt5 *m, int n, int nth) {
    if (n <= 0) return 0;
    size_t sz[US_PARTS];
    encode_sizes(m, n, sz);
    int64_t total = 0, ops = op_attention_scratch_bytes(m->d_kv, nth);
    for (int i = 0; i < US_PARTS; i++) total += (int64_t)sz[i];
    for (int li = 0; li < m->n_layers; li++) {
        const umt5_layer *L = &m->layers[li];
        const h3r_tensor *w[] = {L->q, L->k, L->v, L->o, L->wi0, L->wi1, L->wo};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
            int64_t b = op_matmul_scratch_bytes(w[i]->type, w[i]->ne[0], n, nth);
            if (b > ops) ops = b;
        }
    }
    return total + ops;
}

/* Encode n token ids into out (n, d_model), final norm applied.
 * Returns 0; H3R_ERR_INVALID naming the position, id and vocabulary size for an id
 * outside [0, vocab), or for n outside [0, 65536]; H3R_ERR_NOMEM if scratch cannot
 * be allocated. Scratch is allocated here and freed before return; out is written
 * only on success paths (partially on failure). Calls tap (if not NULL) with
 * "umt5.embed", "umt5.block.<i>" (residual stream after block i) and "umt5.final". */
int umt5_encode(const umt5 *m, h3r_pool *p, const int32_t *ids, int n, float *out,
                h3r_tap_fn tap, void *tap_user) {
    int rc = umt5_check_ids(m, ids, n);
    if (rc < 0) return rc;
    if (n == 0) return 0;

    const int64_t D = m->d_model, F = m->d_ff, H = m->n_heads;
    const int64_t B = m->num_buckets;
    const int64_t N = n;
    size_t sz[US_PARTS];
    encode_sizes(m, N, sz);
    void *buf[US_PARTS];
    int ok = 1;
    for (int i = 0; i < US_PARTS; i++) ok &= (buf[i] = malloc(sz[i])) != NULL;
    float *x = buf[US_X], *h = buf[US_H], *y = buf[US_Y];
    float *q = buf[US_Q], *k = buf[US_K], *v = buf[US_V], *a = buf[US_A];
    float *g0 = buf[US_G0], *g1 = buf[US_G1], *bias = buf[US_BIAS], *table = buf[US_TABLE];
    int *bucket = buf[US_BUCKET];
    if (!ok) {
        rc = h3r_seterr(H3R_ERR_NOMEM, "umt5: out of memory for scratch of %d tokens", n);
        goto done;
    }

    /* x (n, D) = embed[ids] */
    for (int64_t i = 0; i < N; i++) {
        float *row = x + i * D;
        if (m->embed->type == GGML_TYPE_F32) {
            memcpy(row, (const float *)m->embed->data + (int64_t)ids[i] * D,
                   (size_t)D * sizeof(float));
        } else {
            for (int64_t c = 0; c < D; c++) row[c] = tensor_get(m->embed, ids[i], c);
        }
    }
    if (tap) tap(tap_user, "umt5.embed", x, N * D);

    for (int64_t r = -(N - 1); r <= N - 1; r++)
        bucket[r + N - 1] = rel_bucket((int)r, m->num_buckets, m->max_distance);

    for (int li = 0; li < m->n_layers; li++) {
        const umt5_layer *L = &m->layers[li];

        /* self-attention: x += o(attn(norm(x))) */
        norm_into(h, x, N, D, L->ln_attn, m->eps);
        if ((rc = op_matmul(p, q, h, L->q, NULL, N)) < 0) goto done;
        if ((rc = op_matmul(p, k, h, L->k, NULL, N)) < 0) goto done;
        if ((rc = op_matmul(p, v, h, L->v, NULL, N)) < 0) goto done;
        /* bias (H, n, n): head hh, query i, key j -> table[bucket(j - i)][hh] */
        for (int64_t b = 0; b < B; b++)
            for (int64_t hh = 0; hh < H; hh++) table[b * H + hh] = tensor_get(L->rel_bias, b, hh);
        for (int64_t hh = 0; hh < H; hh++)
            for (int64_t i = 0; i < N; i++) {
                float *brow = bias + (hh * N + i) * N;
                const int *bk = bucket + (N - 1 - i);  /* bk[j] = bucket of rel j - i */
                for (int64_t j = 0; j < N; j++) brow[j] = table[bk[j] * H + hh];
            }
        if ((rc = op_attention(p, a, q, k, v, N, N, (int)H, m->d_kv, 1.0f, bias)) < 0) goto done;
        if ((rc = op_matmul(p, y, a, L->o, NULL, N)) < 0) goto done;
        op_add(x, y, N * D);

        /* gated-GELU FFN: x += wo(gelu_tanh(wi_0 h) * wi_1 h), h = norm(x) */
        norm_into(h, x, N, D, L->ln_ff, m->eps);
        if ((rc = op_matmul(p, g0, h, L->wi0, NULL, N)) < 0) goto done;
        if ((rc = op_matmul(p, g1, h, L->wi1, NULL, N)) < 0) goto done;
        op_gelu_tanh(g0, N * F);
        op_mul(g0, g1, N * F);
        if ((rc = op_matmul(p, y, g0, L->wo, NULL, N)) < 0) goto done;
        op_add(x, y, N * D);

        if (tap) {
            char name[32];
            snprintf(name, sizeof name, "umt5.block.%d", li);
            tap(tap_user, name, x, N * D);
        }
    }

    norm_into(out, x, N, D, m->final_norm, m->eps);
    if (tap) tap(tap_user, "umt5.final", out, N * D);

done:
    for (int i = 0; i < US_PARTS; i++) free(buf[i]);
    return rc;
}
