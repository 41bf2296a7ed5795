/*
 * GGUF reader: maps a file read-only and validates it completely before any
 * of it is used.
 *
 * File layout (little-endian, versions 2 and 3):
 *
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x      { string key | u32 value_type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to general.alignment (default 32)
 *   tensor data; each tensor at data_start + offset, offset aligned
 *
 *   string = u64 length | length bytes (no NUL)
 *   array  = u32 elem_type | u64 count | count elements (no nested arrays)
 *
 * Every count, length and offset is checked against the bytes that remain
 * before it is used or allocated for, so a truncated or corrupted file gives a
 * message naming the path and the problem, never a crash or a huge allocation.
 * Keys and tensor names are copied into one heap block with NUL terminators;
 * tensor data and numeric arrays stay in the mapping.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "internal.h"

#define GGUF_MAGIC 0x46554747u      /* "GGUF" read as little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32   /* bytes */
#define GGUF_MAX_DIMS 4

enum {
    GV_UINT8 = 0, GV_INT8 = 1, GV_UINT16 = 2, GV_INT16 = 3, GV_UINT32 = 4, GV_INT32 = 5,
    GV_FLOAT32 = 6, GV_BOOL = 7, GV_STRING = 8, GV_ARRAY = 9, GV_UINT64 = 10, GV_INT64 = 11,
    GV_FLOAT64 = 12, GV_COUNT = 13,
};

static const char *const GV_NAMES[GV_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};
static const size_t GV_SIZES[GV_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* One metadata entry. Scalars are decoded; strings are copied (NUL-terminated);
 * arrays point into the mapping (raw little-endian elements, or for string
 * arrays the first length field). */
typedef struct {
    const char *key;
    size_t key_len;
    int type;                 /* GV_* */
    union { int64_t i; uint64_t u; double f; } v;
    const char *str;          /* GV_STRING: heap copy */
    size_t str_len;
    int arr_type;             /* GV_ARRAY: element type */
    uint64_t arr_n;
    const uint8_t *arr_data;  /* GV_ARRAY: first element in the mapping */
} gguf_kv;

struct gguf_file {
    char *path;
    const uint8_t *map;
    size_t size;              /* file bytes */
    uint32_t version;
    size_t alignment;
    size_t data_start;        /* offset of the tensor data section */
    int64_t n_kv;
    gguf_kv *kv;
    int64_t n_tensors;
    h3r_tensor *tensors;
    int *by_name;             /* tensor indices sorted by name, for gguf_find */
    unsigned char *bound;     /* per tensor: 1 once gguf_find returned it (gguf_bound_bytes) */
    char *strings;            /* heap block holding all keys, names and strings */
};

/* ---------------------------------------------------------------- cursor */

typedef struct {
    const uint8_t *p;
    size_t size, pos;
    const char *path;
    char *strbuf;             /* next free byte of gguf_file.strings */
    size_t strfree;
} cursor;

static int need(cursor *c, size_t n, const char *what) {
    if (n > c->size - c->pos)
        return h3r_seterr(H3R_ERR_FORMAT,
                          "%s: truncated: %s at offset %zu needs %zu bytes, only %zu remain "
                          "(file is %zu bytes)", c->path, what, c->pos, n, c->size - c->pos, c->size);
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what) {
    int rc = need(c, 4, what);
    if (rc) return rc;
    const uint8_t *b = c->p + c->pos;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    c->pos += 4;
    return 0;
}

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what) {
    int rc = need(c, 8, what);
    if (rc) return rc;
    *v = le64(c->p + c->pos);
    c->pos += 8;
    return 0;
}

/*
 * Read a GGUF string. When `copy` is set it is copied NUL-terminated into the
 * string block (sized beforehand to hold every string of the header), else it
 * is only skipped. Fails if the length exceeds the bytes remaining.
 */
static int rd_str(cursor *c, const char **out, size_t *len, int copy, const char *what) {
    uint64_t n;
    int rc = rd_u64(c, &n, what);
    if (rc) return rc;
    if (n > c->size - c->pos)
        return h3r_seterr(H3R_ERR_FORMAT,
                          "%s: %s at offset %zu has length %" PRIu64 " but only %zu bytes remain",
                          c->path, what, c->pos - 8, n, c->size - c->pos);
    if (copy) {
        if ((size_t)n + 1 > c->strfree)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: %s at offset %zu changed while the file was read",
                              c->path, what, c->pos - 8);
        memcpy(c->strbuf, c->p + c->pos, (size_t)n);
        c->strbuf[n] = '\0';
        if (out) *out = c->strbuf;
        c->strbuf += n + 1;
        c->strfree -= n + 1;
    }
    if (len) *len = (size_t)n;
    c->pos += (size_t)n;
    return 0;
}

/* Sign- or zero-extend a little-endian integer of GGUF value type t. */
static int64_t rd_int_at(const uint8_t *b, int t, uint64_t *u_out) {
    uint64_t u = 0;
    size_t n = GV_SIZES[t];
    for (size_t i = 0; i < n; i++) u |= (uint64_t)b[i] << (8 * i);
    int64_t s;
    switch (t) {
    case GV_INT8: s = (int8_t)u; break;
    case GV_INT16: s = (int16_t)u; break;
    case GV_INT32: s = (int32_t)u; break;
    case GV_INT64: memcpy(&s, &u, 8); break;
    default: s = (int64_t)u; break;  /* unsigned; caller checks u for uint64 range */
    }
    if (u_out) *u_out = u;
    return s;
}

static double rd_float_at(const uint8_t *b, int t) {
    if (t == GV_FLOAT32) {
        uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint64_t u = le64(b);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static int is_int_type(int t) {
    return t == GV_UINT8 || t == GV_INT8 || t == GV_UINT16 || t == GV_INT16 || t == GV_UINT32 ||
           t == GV_INT32 || t == GV_UINT64 || t == GV_INT64;
}

static const char *gv_name(int t) { return (t >= 0 && t < GV_COUNT) ? GV_NAMES[t] : "unknown"; }

/* ---------------------------------------------------------------- parsing */

/*
 * Pass 1 over the header: walk every key/value and tensor record, checking
 * lengths against the file, and add up the bytes of all strings to copy.
 * Nothing is stored. Returns 0 with *strbytes set, or a negative code.
 */
static int scan_header(cursor *c, uint64_t n_kv, uint64_t n_tensors, size_t *strbytes) {
    size_t total = 0;
    int rc;
    for (uint64_t i = 0; i < n_kv; i++) {
        size_t len;
        if ((rc = rd_str(c, NULL, &len, 0, "metadata key"))) return rc;
        total += len + 1;
        uint32_t t;
        if ((rc = rd_u32(c, &t, "metadata value type"))) return rc;
        if (t >= GV_COUNT)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata entry %" PRIu64 " has unknown value type %u "
                              "(allowed 0..12)", c->path, i, t);
        if (t == GV_STRING) {
            if ((rc = rd_str(c, NULL, &len, 0, "metadata string value"))) return rc;
            total += len + 1;
        } else if (t == GV_ARRAY) {
            uint32_t et;
            uint64_t n;
            if ((rc = rd_u32(c, &et, "array element type"))) return rc;
            if ((rc = rd_u64(c, &n, "array length"))) return rc;
            if (et >= GV_COUNT || et == GV_ARRAY)
                return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata entry %" PRIu64 " is an array of "
                                  "element type %u (%s), which is not allowed (scalars and strings only)",
                                  c->path, i, et, gv_name((int)et));
            if (et == GV_STRING) {
                if (n > (c->size - c->pos) / 8)
                    return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata entry %" PRIu64 " claims %" PRIu64
                                      " strings but only %zu bytes remain", c->path, i, n, c->size - c->pos);
                for (uint64_t j = 0; j < n; j++)
                    if ((rc = rd_str(c, NULL, NULL, 0, "array string element"))) return rc;
            } else {
                size_t es = GV_SIZES[et];
                if (n > (c->size - c->pos) / es)
                    return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata entry %" PRIu64 " claims %" PRIu64
                                      " elements of %s (%zu bytes each) but only %zu bytes remain",
                                      c->path, i, n, gv_name((int)et), es, c->size - c->pos);
                c->pos += (size_t)n * es;
            }
        } else {
            if ((rc = need(c, GV_SIZES[t], "metadata value"))) return rc;
            c->pos += GV_SIZES[t];
        }
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        size_t len;
        if ((rc = rd_str(c, NULL, &len, 0, "tensor name"))) return rc;
        total += len + 1;
        uint32_t nd;
        if ((rc = rd_u32(c, &nd, "tensor n_dims"))) return rc;
        if (nd < 1 || nd > GGUF_MAX_DIMS)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor %" PRIu64 " has n_dims %u (allowed 1..%d)",
                              c->path, i, nd, GGUF_MAX_DIMS);
        if ((rc = need(c, 8u * nd + 4 + 8, "tensor dims, type and offset"))) return rc;
        c->pos += 8u * nd + 4 + 8;
    }
    *strbytes = total;
    return 0;
}

/*
 * Pass 2: decode one metadata entry into kv. Pass 1 validated the same bytes,
 * but every type and length is checked again: another process may rewrite the
 * file under a MAP_PRIVATE mapping, and a changed byte must not become an
 * out-of-bounds read.
 */
static int read_kv(cursor *c, gguf_kv *kv) {
    int rc;
    uint32_t t;
    if ((rc = rd_str(c, &kv->key, &kv->key_len, 1, "metadata key"))) return rc;
    if ((rc = rd_u32(c, &t, "metadata value type"))) return rc;
    if (t >= GV_COUNT)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' has unknown value type %u (allowed 0..12)",
                          c->path, kv->key, t);
    kv->type = (int)t;
    if (t != GV_STRING && t != GV_ARRAY && (rc = need(c, GV_SIZES[t], "metadata value"))) return rc;
    const uint8_t *b = c->p + c->pos;
    switch (t) {
    case GV_STRING:
        return rd_str(c, &kv->str, &kv->str_len, 1, "metadata string value");
    case GV_ARRAY: {
        uint32_t et;
        if ((rc = rd_u32(c, &et, "array element type"))) return rc;
        if ((rc = rd_u64(c, &kv->arr_n, "array length"))) return rc;
        if (et >= GV_COUNT || et == GV_ARRAY)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' is an array of element type %u, which is "
                              "not allowed (scalars and strings only)", c->path, kv->key, et);
        kv->arr_type = (int)et;
        kv->arr_data = c->p + c->pos;
        if (et == GV_STRING) {
            for (uint64_t j = 0; j < kv->arr_n; j++)
                if ((rc = rd_str(c, NULL, NULL, 0, "array string element"))) return rc;
        } else {
            if (kv->arr_n > (c->size - c->pos) / GV_SIZES[et])
                return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' claims %" PRIu64 " elements but only "
                                  "%zu bytes remain", c->path, kv->key, kv->arr_n, c->size - c->pos);
            c->pos += (size_t)kv->arr_n * GV_SIZES[et];
        }
        return 0;
    }
    case GV_FLOAT32:
    case GV_FLOAT64:
        kv->v.f = rd_float_at(b, (int)t);
        break;
    case GV_BOOL:
        if (b[0] > 1)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' is a bool with value %u (allowed 0 or 1)",
                              c->path, kv->key, b[0]);
        kv->v.i = b[0];
        break;
    default:
        /* v is a union: for uint64 v.u holds the value (v.i the same bits),
         * for every other integer type v.i holds it sign- or zero-extended. */
        kv->v.i = rd_int_at(b, (int)t, NULL);
        break;
    }
    c->pos += GV_SIZES[t];
    return 0;
}

static int cmp_kv_key(const void *a, const void *b) {
    const gguf_kv *x = *(const gguf_kv *const *)a, *y = *(const gguf_kv *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int r = memcmp(x->key, y->key, n);
    return r ? r : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* qsort has no context argument; the comparators below read the tensor
 * array through the index, so the array is passed via a thread-local. */
static _Thread_local const h3r_tensor *sort_tensors;

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(sort_tensors[*(const int *)a].name, sort_tensors[*(const int *)b].name);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const uint8_t *x = sort_tensors[*(const int *)a].data, *y = sort_tensors[*(const int *)b].data;
    return (x > y) - (x < y);
}

/* Look up a metadata key; NULL if absent. */
static const gguf_kv *find_kv(const gguf_file *g, const char *key) {
    size_t n = strlen(key);
    for (int64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key_len == n && memcmp(g->kv[i].key, key, n) == 0) return &g->kv[i];
    return NULL;
}

/*
 * Read general.alignment if present. It must be an unsigned 32-bit integer
 * (as gguf-py writes it), non-zero and a power of two.
 */
static int read_alignment(gguf_file *g) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = find_kv(g, "general.alignment");
    if (!kv) return 0;
    if (!is_int_type(kv->type))
        return h3r_seterr(H3R_ERR_FORMAT, "%s: general.alignment has type %s (expected an integer)",
                          g->path, gv_name(kv->type));
    int64_t a = kv->v.i;
    if (kv->type == GV_UINT64 && kv->v.u > (uint64_t)INT64_MAX) a = -1;
    if (a <= 0 || a > (int64_t)1 << 30 || (a & (a - 1)) != 0)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: general.alignment is %" PRId64
                          " (must be a power of two between 1 and 2^30)", g->path, a);
    g->alignment = (size_t)a;
    return 0;
}

/*
 * Pass 2 over the tensor records: decode name, dims, type and offset, and
 * check each against the file (dims 1..4, each ne > 0, element count without
 * overflow, known type, whole blocks per row, aligned offset, data inside the
 * file). Data pointers are set once data_start is known.
 */
static int read_tensor(cursor *c, gguf_file *g, int64_t i, uint64_t *offset) {
    h3r_tensor *t = &g->tensors[i];
    int rc;
    size_t len;
    if ((rc = rd_str(c, &t->name, &len, 1, "tensor name"))) return rc;
    if (len == 0) return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor %" PRId64 " has an empty name", g->path, i);
    if (strlen(t->name) != len)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor %" PRId64 " name '%s' contains a NUL byte",
                          g->path, i, t->name);
    uint32_t nd;
    if ((rc = rd_u32(c, &nd, "tensor n_dims"))) return rc;
    if (nd < 1 || nd > GGUF_MAX_DIMS)   /* checked in pass 1 too; see read_kv */
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has n_dims %u (allowed 1..%d)",
                          g->path, t->name, nd, GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    int64_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne;
        if ((rc = rd_u64(c, &ne, "tensor dim"))) return rc;
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has ne[%u] = %" PRIu64
                              " (each dim must be between 1 and 2^63-1)", g->path, t->name, d, ne);
        if ((int64_t)ne > INT64_MAX / nel)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' element count overflows (ne[%u] = %" PRIu64 ")",
                              g->path, t->name, d, ne);
        t->ne[d] = (int64_t)ne;
        nel *= (int64_t)ne;
    }
    uint32_t type;
    if ((rc = rd_u32(c, &type, "tensor type"))) return rc;
    if (type >= GGML_TYPE_COUNT || ggml_type_nbytes((int)type, 1 << 20) == 0)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has unknown type %u", g->path, t->name, type);
    t->type = (int)type;
    if (ggml_type_nbytes(t->type, t->ne[0]) == 0)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' of type %s has ne[0] = %" PRId64
                          ", not a whole number of blocks", g->path, t->name, ggml_type_name(t->type), t->ne[0]);
    t->nbytes = ggml_type_nbytes(t->type, nel);
    if (t->nbytes == 0)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' byte size overflows (%" PRId64 " elements of %s)",
                          g->path, t->name, nel, ggml_type_name(t->type));
    if ((rc = rd_u64(c, offset, "tensor offset"))) return rc;
    if (*offset % g->alignment != 0)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' data offset %" PRIu64 " is not a multiple of "
                          "the alignment %zu", g->path, t->name, *offset, g->alignment);
    return 0;
}

/*
 * Validate the whole file held in g->map. Fills kv and tensors. Returns 0 or
 * a negative code with a message; partially filled arrays are freed by the
 * caller through gguf_close.
 */
static int parse(gguf_file *g) {
    cursor c = {g->map, g->size, 0, g->path, NULL, 0};
    int rc;
    uint32_t magic = 0;
    if ((rc = rd_u32(&c, &magic, "magic"))) return rc;
    if (magic != GGUF_MAGIC)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: not a GGUF file (magic 0x%08x, expected 0x%08x \"GGUF\")",
                          g->path, magic, GGUF_MAGIC);
    if ((rc = rd_u32(&c, &g->version, "version"))) return rc;
    if (g->version == 1)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: GGUF version 1 is not supported (allowed 2 or 3)", g->path);
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: GGUF version 0x%08x looks byte-swapped: big-endian "
                              "files are not supported", g->path, g->version);
        return h3r_seterr(H3R_ERR_FORMAT, "%s: unsupported GGUF version %u (allowed 2 or 3)", g->path, g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(&c, &n_tensors, "tensor count"))) return rc;
    if ((rc = rd_u64(&c, &n_kv, "metadata count"))) return rc;
    /* Smallest records: kv = 8 (key length) + 4 (type) + 1 (u8 value);
     * tensor = 8 (name length) + 4 (n_dims) + 8 (ne) + 4 (type) + 8 (offset). */
    size_t rest = g->size - c.pos;
    if (n_kv > rest / 13)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata count %" PRIu64 " cannot fit in the %zu bytes "
                          "after the header", g->path, n_kv, rest);
    if (n_tensors > rest / 32 || n_tensors > INT32_MAX)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor count %" PRIu64 " cannot fit in the %zu bytes "
                          "after the header", g->path, n_tensors, rest);
    size_t hdr = c.pos, strbytes = 0;
    if ((rc = scan_header(&c, n_kv, n_tensors, &strbytes))) return rc;

    /* Allocate once, sized from the validated scan. */
    g->strings = malloc(strbytes ? strbytes : 1);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof(gguf_kv));
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(h3r_tensor));
    g->by_name = calloc(n_tensors ? n_tensors : 1, sizeof(int));
    g->bound = calloc(n_tensors ? n_tensors : 1, 1);
    uint64_t *offsets = calloc(n_tensors ? n_tensors : 1, sizeof(uint64_t));
    const gguf_kv **kvs = calloc(n_kv ? n_kv : 1, sizeof(gguf_kv *));
    if (!g->strings || !g->kv || !g->tensors || !g->by_name || !g->bound || !offsets || !kvs) {
        free(offsets);
        free(kvs);
        return h3r_seterr(H3R_ERR_NOMEM, "%s: out of memory reading the header (%" PRIu64 " keys, %"
                          PRIu64 " tensors)", g->path, n_kv, n_tensors);
    }

    c.pos = hdr;
    c.strbuf = g->strings;
    c.strfree = strbytes ? strbytes : 1;
    for (uint64_t i = 0; i < n_kv; i++) {
        if ((rc = read_kv(&c, &g->kv[i]))) goto done;
        g->n_kv = (int64_t)i + 1;
    }
    /* Duplicate keys: sort pointers by key, compare neighbours. */
    for (uint64_t i = 0; i < n_kv; i++) kvs[i] = &g->kv[i];
    qsort(kvs, n_kv, sizeof(*kvs), cmp_kv_key);
    for (uint64_t i = 1; i < n_kv; i++)
        if (cmp_kv_key(&kvs[i - 1], &kvs[i]) == 0) {
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: duplicate metadata key '%s'", g->path, kvs[i]->key);
            goto done;
        }
    if ((rc = read_alignment(g))) goto done;

    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((rc = read_tensor(&c, g, (int64_t)i, &offsets[i]))) goto done;
        g->n_tensors = (int64_t)i + 1;
    }
    /* Data section starts at the next multiple of the alignment. */
    size_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    if (n_tensors > 0 && pad > g->size - c.pos) {
        rc = h3r_seterr(H3R_ERR_FORMAT, "%s: truncated: data section would start at offset %zu, past the "
                        "end of file (%zu bytes)", g->path, c.pos + pad, g->size);
        goto done;
    }
    g->data_start = c.pos + pad;
    for (uint64_t i = 0; i < n_tensors; i++) {
        h3r_tensor *t = &g->tensors[i];
        size_t avail = g->size > g->data_start ? g->size - g->data_start : 0;
        if (offsets[i] > avail || t->nbytes > avail - offsets[i]) {
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' data [offset %" PRIu64 ", %zu bytes] runs past "
                            "end of file (%zu bytes, data section starts at %zu)",
                            g->path, t->name, offsets[i], t->nbytes, g->size, g->data_start);
            goto done;
        }
        t->data = g->map + g->data_start + offsets[i];
        g->by_name[i] = (int)i;
    }
    /* Overlaps: sort by data offset, each tensor must end before the next begins. */
    sort_tensors = g->tensors;
    int *order = calloc(n_tensors ? n_tensors : 1, sizeof(int));
    if (!order) { rc = h3r_seterr(H3R_ERR_NOMEM, "%s: out of memory", g->path); goto done; }
    for (uint64_t i = 0; i < n_tensors; i++) order[i] = (int)i;
    qsort(order, n_tensors, sizeof(int), cmp_tensor_offset);
    for (uint64_t i = 1; i < n_tensors; i++) {
        const h3r_tensor *a = &g->tensors[order[i - 1]], *b = &g->tensors[order[i]];
        if ((const uint8_t *)a->data + a->nbytes > (const uint8_t *)b->data) {
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: tensors '%s' [offset %zu, %zu bytes] and '%s' [offset %zu] "
                            "overlap", g->path, a->name, (size_t)((const uint8_t *)a->data - g->map - g->data_start),
                            a->nbytes, b->name, (size_t)((const uint8_t *)b->data - g->map - g->data_start));
            free(order);
            goto done;
        }
    }
    free(order);
    /* Duplicate names: sort the name index, compare neighbours. */
    qsort(g->by_name, n_tensors, sizeof(int), cmp_tensor_name);
    for (uint64_t i = 1; i < n_tensors; i++)
        if (strcmp(g->tensors[g->by_name[i - 1]].name, g->tensors[g->by_name[i]].name) == 0) {
            rc = h3r_seterr(H3R_ERR_FORMAT, "%s: duplicate tensor name '%s'", g->path,
                            g->tensors[g->by_name[i]].name);
            goto done;
        }
    rc = 0;
done:
    sort_tensors = NULL;
    free(offsets);
    free(kvs);
    return rc;
}

/* ---------------------------------------------------------------- open/close */

/*
 * Map `path` read-only and validate it. On success *out owns the mapping and
 * 0 is returned; on failure *out is NULL and a negative code is returned with
 * a message naming the file (H3R_ERR_IO if it cannot be opened or mapped,
 * H3R_ERR_FORMAT if it is malformed).
 */
int gguf_open(const char *path, gguf_file **out) {
    *out = NULL;
    if (!path) return h3r_seterr(H3R_ERR_INVALID, "gguf_open: path is NULL");
    gguf_file *g = calloc(1, sizeof(*g));
    if (!g) return h3r_seterr(H3R_ERR_NOMEM, "%s: out of memory", path);
    g->path = strdup(path);
    if (!g->path) { free(g); return h3r_seterr(H3R_ERR_NOMEM, "%s: out of memory", path); }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = h3r_seterr(H3R_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        gguf_close(g);
        return rc;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int rc = h3r_seterr(H3R_ERR_IO, "%s: not a regular file", path);
        close(fd);
        gguf_close(g);
        return rc;
    }
    if (st.st_size < 24) {  /* magic + version + two counts */
        int rc = h3r_seterr(H3R_ERR_FORMAT, "%s: truncated: %lld bytes, a GGUF header needs at least 24",
                            path, (long long)st.st_size);
        close(fd);
        gguf_close(g);
        return rc;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        gguf_close(g);
        return h3r_seterr(H3R_ERR_IO, "%s: too large to map", path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        int rc = h3r_seterr(H3R_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        gguf_close(g);
        return rc;
    }
    g->map = m;
    g->size = (size_t)st.st_size;
    int rc = parse(g);
    if (rc) {
        gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* Unmap and free everything. NULL is a no-op. */
void gguf_close(gguf_file *g) {
    if (!g) return;
    if (g->map) munmap((void *)g->map, g->size);
    free(g->kv);
    free(g->tensors);
    free(g->by_name);
    free(g->bound);
    free(g->strings);
    free(g->path);
    free(g);
}

const char *gguf_path(const gguf_file *g) { return g->path; }
size_t gguf_mapped_bytes(const gguf_file *g) { return g->size; }
int gguf_n_tensors(const gguf_file *g) { return (int)g->n_tensors; }

const h3r_tensor *gguf_tensor_at(const gguf_file *g, int i) {
    if (i < 0 || i >= g->n_tensors) return NULL;
    return &g->tensors[i];
}

/* Binary search of the sorted name index; NULL if absent (no error set). */
const h3r_tensor *gguf_find(const gguf_file *g, const char *name) {
    int64_t lo = 0, hi = g->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const h3r_tensor *t = &g->tensors[g->by_name[mid]];
        int r = strcmp(t->name, name);
        if (r == 0) {
            g->bound[g->by_name[mid]] = 1;
            return t;
        }
        if (r < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}

/* The header (read at open) and every tensor a loader looked up: the pages of
 * the mapping a render reads. Tensors no loader asked for (the VAE's encoder
 * half, say) stay unread and never become resident. */
size_t gguf_bound_bytes(const gguf_file *g) {
    size_t bytes = g->data_start;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (g->bound[i]) bytes += g->tensors[i].nbytes;
    return bytes < g->size ? bytes : g->size;
}

/* Types a component may use for weights: those the ops have kernels for or
 * will have in the quant work (op_matmul reports the unsupported ones). */
static int type_allowed(int type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_Q8_0 ||
           type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q6_K;
}

/*
 * Find tensor `name` and check its dims (GGML order, -1 = any) and type.
 * Returns 0 with *out set, or H3R_ERR_FORMAT naming file, tensor and problem.
 */
int gguf_get_tensor(const gguf_file *g, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                    int64_t ne3, const h3r_tensor **out) {
    *out = NULL;
    const h3r_tensor *t = gguf_find(g, name);
    if (!t) return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' is missing", g->path, name);
    int64_t want[4] = {ne0, ne1, ne2, ne3};
    for (int d = 0; d < 4; d++) {
        if (want[d] >= 0 && t->ne[d] != want[d]) {
            char a[128], b[128];
            snprintf(a, sizeof a, "[%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]",
                     t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
            int n = snprintf(b, sizeof b, "[");
            for (int k = 0; k < 4; k++) {
                if (want[k] < 0) n += snprintf(b + n, sizeof b - n, "%s*", k ? ", " : "");
                else n += snprintf(b + n, sizeof b - n, "%s%" PRId64, k ? ", " : "", want[k]);
            }
            snprintf(b + n, sizeof b - n, "]");
            return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has shape ne=%s (GGML order), expected %s",
                              g->path, name, a, b);
        }
    }
    if (!type_allowed(t->type))
        return h3r_seterr(H3R_ERR_FORMAT, "%s: tensor '%s' has type %s, not allowed (f32, f16, q8_0, q4_0, "
                          "q6_k)", g->path, name, ggml_type_name(t->type));
    *out = t;
    return 0;
}

/* ---------------------------------------------------------------- metadata */

static int kv_lookup(const gguf_file *g, const char *key, const gguf_kv **out) {
    *out = find_kv(g, key);
    if (!*out) return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' is missing", g->path, key);
    return 0;
}

static int kv_wrong(const gguf_file *g, const gguf_kv *kv, const char *want) {
    if (kv->type == GV_ARRAY)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' is an array of %s, expected %s",
                          g->path, kv->key, gv_name(kv->arr_type), want);
    return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' has type %s, expected %s",
                      g->path, kv->key, gv_name(kv->type), want);
}

int gguf_has_key(const gguf_file *g, const char *key) { return find_kv(g, key) != NULL; }

/* Any integer type whose value fits int64. */
int gguf_get_int(const gguf_file *g, const char *key, int64_t *out) {
    const gguf_kv *kv;
    int rc = kv_lookup(g, key, &kv);
    if (rc) return rc;
    if (!is_int_type(kv->type)) return kv_wrong(g, kv, "an integer");
    if (kv->type == GV_UINT64 && kv->v.u > (uint64_t)INT64_MAX)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' = %" PRIu64 " does not fit int64",
                          g->path, key, kv->v.u);
    *out = kv->v.i;
    return 0;
}

/* float32, float64, or any integer (configs may write 10000 for 10000.0). */
int gguf_get_float(const gguf_file *g, const char *key, double *out) {
    const gguf_kv *kv;
    int rc = kv_lookup(g, key, &kv);
    if (rc) return rc;
    if (kv->type == GV_FLOAT32 || kv->type == GV_FLOAT64) *out = kv->v.f;
    else if (kv->type == GV_UINT64) *out = (double)kv->v.u;
    else if (is_int_type(kv->type)) *out = (double)kv->v.i;
    else return kv_wrong(g, kv, "a number");
    return 0;
}

int gguf_get_bool(const gguf_file *g, const char *key, int *out) {
    const gguf_kv *kv;
    int rc = kv_lookup(g, key, &kv);
    if (rc) return rc;
    if (kv->type != GV_BOOL) return kv_wrong(g, kv, "a bool");
    *out = (int)kv->v.i;
    return 0;
}

/* *out is NUL-terminated and owned by g; *len (may be NULL) excludes the NUL. */
int gguf_get_str(const gguf_file *g, const char *key, const char **out, size_t *len) {
    const gguf_kv *kv;
    int rc = kv_lookup(g, key, &kv);
    if (rc) return rc;
    if (kv->type != GV_STRING) return kv_wrong(g, kv, "a string");
    *out = kv->str;
    if (len) *len = kv->str_len;
    return 0;
}

/*
 * Integer array into out[0..max). *n receives the element count. Fails when
 * the array holds more than max elements (so a caller's fixed buffer is never
 * silently truncated), unless out is NULL, which only queries the count.
 */
int gguf_get_int_array(const gguf_file *g, const char *key, int64_t *out, int max, int *n) {
    const gguf_kv *kv;
    int rc = kv_lookup(g, key, &kv);
    if (rc) return rc;
    if (kv->type != GV_ARRAY || !is_int_type(kv->arr_type)) return kv_wrong(g, kv, "an integer array");
    if (kv->arr_n > INT32_MAX)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' array has %" PRIu64 " elements, too many",
                          g->path, key, kv->arr_n);
    *n = (int)kv->arr_n;
    if (!out) return 0;
    if (kv->arr_n > (uint64_t)(max < 0 ? 0 : max))
        return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' has %" PRIu64 " elements, at most %d allowed",
                          g->path, key, kv->arr_n, max);
    size_t es = GV_SIZES[kv->arr_type];
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint64_t u;
        int64_t v = rd_int_at(kv->arr_data + i * es, kv->arr_type, &u);
        if (kv->arr_type == GV_UINT64 && u > (uint64_t)INT64_MAX)
            return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s'[%" PRIu64 "] = %" PRIu64 " does not fit int64",
                              g->path, key, i, u);
        out[i] = v;
    }
    return 0;
}

/* Float (or integer) array; same count rules as gguf_get_int_array. */
int gguf_get_float_array(const gguf_file *g, const char *key, double *out, int max, int *n) {
    const gguf_kv *kv;
    int rc = kv_lookup(g, key, &kv);
    if (rc) return rc;
    int et = kv->arr_type;
    if (kv->type != GV_ARRAY || !(et == GV_FLOAT32 || et == GV_FLOAT64 || is_int_type(et)))
        return kv_wrong(g, kv, "a number array");
    if (kv->arr_n > INT32_MAX)
        return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' array has %" PRIu64 " elements, too many",
                          g->path, key, kv->arr_n);
    *n = (int)kv->arr_n;
    if (!out) return 0;
    if (kv->arr_n > (uint64_t)(max < 0 ? 0 : max))
        return h3r_seterr(H3R_ERR_FORMAT, "%s: metadata key '%s' has %" PRIu64 " elements, at most %d allowed",
                          g->path, key, kv->arr_n, max);
    size_t es = GV_SIZES[et];
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        const uint8_t *b = kv->arr_data + i * es;
        if (et == GV_FLOAT32 || et == GV_FLOAT64) out[i] = rd_float_at(b, et);
        else {
            uint64_t u;
            int64_t v = rd_int_at(b, et, &u);
            out[i] = et == GV_UINT64 ? (double)u : (double)v;
        }
    }
    return 0;
}
