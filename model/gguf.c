/* GGUF v2/v3 reader and v3 writer (see gguf.h).
 * The reader treats the file as hostile: every read goes through a cursor that checks
 * the remaining bytes first, every size is computed with overflow checks, and counts
 * are compared with what the remaining bytes could possibly hold before anything is
 * allocated. Integers are decoded byte by byte, so the host byte order does not matter
 * for the metadata. */
#include "base/fileio.h"
#include "model/gguf.h"

#include "base/checksum.h"
#include "base/errors.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/quant.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
/* Smallest encodings, used to reject counts the file cannot hold before allocating:
 * a kv is a key length, a type and at least a one-byte value; a tensor info is a name
 * length, n_dims, one dimension, a type and an offset. */
#define KV_MIN_BYTES (8 + 4 + 1)
#define TENSOR_MIN_BYTES (8 + 4 + 8 + 4 + 8)

/* Names of ggml types, for messages only (gaps are removed types). */
static const char *const ggml_names[] = {
    "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
    "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64",
    "IQ1_M", "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",
    "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
};
#define N_GGML_NAMES (sizeof ggml_names / sizeof ggml_names[0])

/* A name from the file, made printable for messages (control bytes become '?', long
 * names are cut). */
static const char *printable(const kvp_gguf_str *s, char *buf, size_t cap)
{
    size_t n = s->len < cap - 4 ? (size_t)s->len : cap - 4;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s->ptr[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (n < s->len)
        memcpy(buf + n, "...", 4);
    else
        buf[n] = 0;
    return buf;
}

/* ---------------------------------------------------------------- reader cursor */

typedef struct cursor {
    const uint8_t *p;
    size_t size, off;
    char *err;
    size_t errlen;
} cursor;

static bool need(cursor *c, uint64_t n, const char *what)
{
    if (n <= c->size - c->off)
        return true;
    kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: %s needs %llu bytes but only %zu remain "
           "(file size %zu)", c->off, what, (unsigned long long)n, c->size - c->off, c->size);
    return false;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static bool rd(cursor *c, int n, uint64_t *v, const char *what)
{
    if (!need(c, (uint64_t)n, what))
        return false;
    *v = le(c->p + c->off, n);
    c->off += (size_t)n;
    return true;
}

static bool rd_u32(cursor *c, uint32_t *v, const char *what)
{
    uint64_t x;
    if (!rd(c, 4, &x, what))
        return false;
    *v = (uint32_t)x;
    return true;
}

static bool rd_str(cursor *c, kvp_gguf_str *s, const char *what)
{
    size_t at = c->off;
    uint64_t len;
    if (!rd(c, 8, &len, what))
        return false;
    if (len > c->size - c->off) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: %s has length %llu, past the end of the "
               "file (%zu bytes remain)", at, what, (unsigned long long)len, c->size - c->off);
        return false;
    }
    s->ptr = (const char *)c->p + c->off;
    s->len = len;
    c->off += (size_t)len;
    return true;
}

/* Size of a fixed-size kv type; 0 for STRING, ARRAY and unknown types. */
static int scalar_size(uint32_t t)
{
    switch (t) {
    case KVP_GGUF_UINT8: case KVP_GGUF_INT8: case KVP_GGUF_BOOL:
        return 1;
    case KVP_GGUF_UINT16: case KVP_GGUF_INT16:
        return 2;
    case KVP_GGUF_UINT32: case KVP_GGUF_INT32: case KVP_GGUF_FLOAT32:
        return 4;
    case KVP_GGUF_UINT64: case KVP_GGUF_INT64: case KVP_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static bool read_scalar(cursor *c, uint32_t t, kvp_gguf_kv *kv, const char *what)
{
    int n = scalar_size(t);
    uint64_t x;
    if (!rd(c, n, &x, what))
        return false;
    switch (t) {
    case KVP_GGUF_INT8:
        kv->val.i64 = (int8_t)x;
        break;
    case KVP_GGUF_INT16:
        kv->val.i64 = (int16_t)x;
        break;
    case KVP_GGUF_INT32:
        kv->val.i64 = (int32_t)x;
        break;
    case KVP_GGUF_INT64:
        kv->val.i64 = (int64_t)x;
        break;
    case KVP_GGUF_FLOAT32: {
        uint32_t b = (uint32_t)x;
        float f;
        memcpy(&f, &b, sizeof f);
        kv->val.f64 = f;
        break;
    }
    case KVP_GGUF_FLOAT64:
        memcpy(&kv->val.f64, &x, sizeof x);
        break;
    case KVP_GGUF_BOOL:
        kv->val.u64 = x != 0;
        break;
    default:
        kv->val.u64 = x;
    }
    return true;
}

static bool read_value(cursor *c, kvp_gguf_kv *kv, const char *key)
{
    size_t at = c->off - 4;
    if (kv->type == KVP_GGUF_STRING)
        return rd_str(c, &kv->val.str, "string value");
    if (kv->type != KVP_GGUF_ARRAY) {
        if (!scalar_size(kv->type)) {
            kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: key '%s' has unknown value type %u",
                   at, key, kv->type);
            return false;
        }
        return read_scalar(c, kv->type, kv, "value");
    }

    uint32_t et;
    uint64_t n;
    if (!rd_u32(c, &et, "array element type") || !rd(c, 8, &n, "array length"))
        return false;
    if (et == KVP_GGUF_ARRAY) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: key '%s' is a nested array "
               "(arrays of arrays are not supported)", at, key);
        return false;
    }
    kv->val.arr.type = et;
    kv->val.arr.n = n;
    kv->val.arr.data = c->p + c->off;
    if (et == KVP_GGUF_STRING) {
        /* Each element is at least its 8-byte length: reject impossible counts before
         * walking them. */
        if (n > (c->size - c->off) / 8) {
            kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: key '%s': %llu strings cannot fit "
                   "in the %zu bytes that remain", at, key, (unsigned long long)n,
                   c->size - c->off);
            return false;
        }
        for (uint64_t i = 0; i < n; i++) {
            kvp_gguf_str s;
            if (!rd_str(c, &s, "array string"))
                return false;
        }
        return true;
    }
    int es = scalar_size(et);
    if (!es) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: key '%s' is an array of unknown element "
               "type %u", at, key, et);
        return false;
    }
    if (n > (c->size - c->off) / (uint64_t)es) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: key '%s': array of %llu elements of %d "
               "bytes runs past the end of the file (%zu bytes remain)", at, key,
               (unsigned long long)n, es, c->size - c->off);
        return false;
    }
    c->off += (size_t)(n * (uint64_t)es);
    return true;
}

/* ------------------------------------------------------------ duplicate detection */

/* Open-addressing set of strings, so hostile files with many names stay O(n). */
typedef struct strset {
    const kvp_gguf_str **slot;
    size_t cap;
} strset;

static uint64_t str_hash(const kvp_gguf_str *s)
{
    return kvp_fnv1a(KVP_FNV1A_INIT, s->ptr, s->len);
}

static int strset_init(strset *set, uint64_t n)
{
    set->cap = 16;
    while (set->cap < 2 * n)
        set->cap *= 2;
    set->slot = calloc(set->cap, sizeof *set->slot);
    return set->slot ? 0 : -ENOMEM;
}

/* Adds s; false if an equal string is already present. */
static bool strset_add(strset *set, const kvp_gguf_str *s)
{
    size_t i = (size_t)str_hash(s) & (set->cap - 1);
    while (set->slot[i]) {
        const kvp_gguf_str *o = set->slot[i];
        if (o->len == s->len && !memcmp(o->ptr, s->ptr, (size_t)s->len))
            return false;
        i = (i + 1) & (set->cap - 1);
    }
    set->slot[i] = s;
    return true;
}

/* ------------------------------------------------------------------------ parse */

static int parse_kvs(kvp_gguf *g, cursor *c)
{
    strset seen;
    if (strset_init(&seen, g->n_kv)) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: out of memory");
        return -ENOMEM;
    }
    int rc = -EINVAL;
    char name[80];
    for (uint64_t i = 0; i < g->n_kv; i++) {
        kvp_gguf_kv *kv = &g->kv[i];
        size_t at = c->off;
        if (!rd_str(c, &kv->key, "kv key") || !rd_u32(c, &kv->type, "kv type"))
            goto out;
        printable(&kv->key, name, sizeof name);
        if (!strset_add(&seen, &kv->key)) {
            kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: duplicate key '%s'", at, name);
            goto out;
        }
        if (!read_value(c, kv, name))
            goto out;
    }
    rc = 0;
out:
    free(seen.slot);
    return rc;
}

static int read_alignment(kvp_gguf *g, char *err, size_t errlen)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kvp_gguf_find(g, "general.alignment"))
        return 0;
    uint32_t a;
    if (kvp_gguf_get_u32(g, "general.alignment", &a) || a == 0 || (a & (a - 1))) {
        kvp_errorf(err, errlen, 0, "gguf: general.alignment must be a power of two (an unsigned "
               "integer)");
        return -EINVAL;
    }
    g->alignment = a;
    return 0;
}

static int parse_tensor_info(kvp_gguf_tensor *t, cursor *c)
{
    size_t at = c->off;
    char name[80];
    if (!rd_str(c, &t->name, "tensor name") || !rd_u32(c, &t->n_dims, "tensor n_dims"))
        return -EINVAL;
    printable(&t->name, name, sizeof name);
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: tensor '%s' has %u dimensions "
               "(must be 1..%d)", at, name, t->n_dims, GGUF_MAX_DIMS);
        return -EINVAL;
    }
    t->n_elements = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims && !rd(c, 8, &t->ne[d], "tensor dimension"))
            return -EINVAL;
        /* ggml holds element counts in int64_t */
        if (t->ne[d] == 0 || t->ne[d] > INT64_MAX / t->n_elements) {
            kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: tensor '%s' dimension %u is %llu "
                   "(%s)", at, name, d, (unsigned long long)t->ne[d],
                   t->ne[d] ? "the element count overflows" : "must be positive");
            return -EINVAL;
        }
        t->n_elements *= t->ne[d];
    }
    if (!rd_u32(c, &t->type, "tensor type") || !rd(c, 8, &t->offset, "tensor offset"))
        return -EINVAL;
    if (!kvp_type_block(t->type)) {
        if (t->type < N_GGML_NAMES)
            kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: tensor '%s' has unsupported type "
                   "%s (%u); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, "
                   "Q3_K, Q4_K, Q5_K, Q6_K", at, name, ggml_names[t->type], t->type);
        else
            kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: tensor '%s' has unknown type %u",
                   at, name, t->type);
        return -ENOTSUP;
    }
    if (t->ne[0] % (uint64_t)kvp_type_block(t->type)) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: %s tensor '%s' has rows of %llu "
               "elements, not a multiple of %d", at, kvp_type_name(t->type), name,
               (unsigned long long)t->ne[0], kvp_type_block(t->type));
        return -EINVAL;
    }
    t->n_bytes = kvp_type_nbytes(t->type, t->n_elements);
    if (!t->n_bytes) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: tensor '%s' is too large (%llu "
               "elements)", at, name, (unsigned long long)t->n_elements);
        return -EINVAL;
    }
    return 0;
}

static int parse_tensors(kvp_gguf *g, cursor *c)
{
    strset seen;
    if (strset_init(&seen, g->n_tensors)) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: out of memory");
        return -ENOMEM;
    }
    int rc = 0;
    char name[80];
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        size_t at = c->off;
        rc = parse_tensor_info(&g->tensors[i], c);
        if (!rc && !strset_add(&seen, &g->tensors[i].name)) {
            kvp_errorf(c->err, c->errlen, 0, "gguf: offset %zu: duplicate tensor name '%s'", at,
                   printable(&g->tensors[i].name, name, sizeof name));
            rc = -EINVAL;
        }
    }
    free(seen.slot);
    if (rc)
        return rc;

    /* The data section starts at the next multiple of the alignment. */
    uint64_t data = ((uint64_t)c->off + g->alignment - 1) & ~(g->alignment - 1);
    if (g->n_tensors && data > c->size) {
        kvp_errorf(c->err, c->errlen, 0, "gguf: the data section (offset %llu) starts past the end "
               "of the file (size %zu)", (unsigned long long)data, c->size);
        return -EINVAL;
    }
    uint64_t avail = g->n_tensors ? c->size - data : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        kvp_gguf_tensor *t = &g->tensors[i];
        printable(&t->name, name, sizeof name);
        if (t->offset % g->alignment) {
            kvp_errorf(c->err, c->errlen, 0, "gguf: tensor '%s' data offset %llu is not a multiple "
                   "of the alignment %llu", name, (unsigned long long)t->offset,
                   (unsigned long long)g->alignment);
            return -EINVAL;
        }
        if (t->offset > avail || t->n_bytes > avail - t->offset) {
            kvp_errorf(c->err, c->errlen, 0, "gguf: tensor '%s' data (%llu bytes at data offset %llu, "
                   "file offset %llu) runs past the end of the file (size %zu)", name,
                   (unsigned long long)t->n_bytes, (unsigned long long)t->offset,
                   (unsigned long long)(data + t->offset), c->size);
            return -EINVAL;
        }
        t->data = c->p + data + t->offset;
    }
    return 0;
}

int kvp_gguf_parse(kvp_gguf *g, const void *buf, size_t size, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    if (err && errlen)
        err[0] = 0;
    cursor c = {.p = buf, .size = size, .err = err, .errlen = errlen};
    uint64_t magic, version, n_tensors, n_kv;
    if (!rd(&c, 4, &magic, "magic"))
        return -EINVAL;
    if (memcmp(buf, "GGUF", 4)) {
        kvp_errorf(err, errlen, 0, "gguf: offset 0: bad magic (expected \"GGUF\")");
        return -EINVAL;
    }
    if (!rd(&c, 4, &version, "version"))
        return -EINVAL;
    if (version != 2 && version != 3) {
        /* a big-endian file reads as a version with its low byte zero */
        kvp_errorf(err, errlen, 0, "gguf: offset 4: unsupported version %llu%s (supported: 2, 3)",
               (unsigned long long)version,
               (version && !(version & 0xffff)) ? " (big-endian file?)" : "");
        return -ENOTSUP;
    }
    if (!rd(&c, 8, &n_tensors, "tensor count") || !rd(&c, 8, &n_kv, "kv count"))
        return -EINVAL;
    size_t rest = size - c.off;
    if (n_kv > rest / KV_MIN_BYTES || n_tensors > rest / TENSOR_MIN_BYTES ||
        n_kv * KV_MIN_BYTES + n_tensors * TENSOR_MIN_BYTES > rest) {
        kvp_errorf(err, errlen, 0, "gguf: offset 8: %llu tensors and %llu kvs cannot fit in the "
               "%zu bytes after the header", (unsigned long long)n_tensors,
               (unsigned long long)n_kv, rest);
        return -EINVAL;
    }
    g->base = buf;
    g->size = size;
    g->version = (uint32_t)version;
    g->n_kv = n_kv;
    g->n_tensors = n_tensors;
    /* +1: calloc(0) may return NULL */
    g->kv = calloc((size_t)n_kv + 1, sizeof *g->kv);
    g->tensors = calloc((size_t)n_tensors + 1, sizeof *g->tensors);
    int rc = -ENOMEM;
    if (!g->kv || !g->tensors) {
        kvp_errorf(err, errlen, 0, "gguf: out of memory");
        goto fail;
    }
    if ((rc = parse_kvs(g, &c)) || (rc = read_alignment(g, err, errlen)) ||
        (rc = parse_tensors(g, &c)))
        goto fail;
    return 0;
fail:
    free(g->kv);
    free(g->tensors);
    memset(g, 0, sizeof *g);
    return rc;
}

int kvp_gguf_open(kvp_gguf *g, const char *path, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    struct stat st;
    int fd = kvp_open_input(path, &st);
    if (fd < 0) {
        kvp_errorf(err, errlen, 0, "%s: %s", path, kvp_fileio_strerror(fd));
        return fd;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 4) {
        close(fd);
        kvp_errorf(err, errlen, 0, "%s: %s", path, S_ISREG(st.st_mode) ?
               "file too small to be GGUF" : "not a regular file");
        return -EINVAL;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) {
        kvp_errorf(err, errlen, 0, "%s: mmap: %s", path, strerror(e));
        return -e;
    }
    char msg[512];
    int rc = kvp_gguf_parse(g, map, size, msg, sizeof msg);
    if (rc) {
        munmap(map, size);
        kvp_errorf(err, errlen, 0, "%s: %s", path, msg);
        return rc;
    }
    g->map = map;
    g->map_size = size;
    return 0;
}

void kvp_gguf_close(kvp_gguf *g)
{
    if (!g)
        return;
    free(g->kv);
    free(g->tensors);
    if (g->map)
        munmap(g->map, g->map_size);
    memset(g, 0, sizeof *g);
}

/* ---------------------------------------------------------------------- getters */

static bool str_eq(const kvp_gguf_str *s, const char *z)
{
    size_t n = strlen(z);
    return s->len == n && !memcmp(s->ptr, z, n);
}

const kvp_gguf_kv *kvp_gguf_find(const kvp_gguf *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (str_eq(&g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

const kvp_gguf_tensor *kvp_gguf_find_tensor(const kvp_gguf *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(&g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}

static bool is_unsigned(uint32_t t)
{
    return t == KVP_GGUF_UINT8 || t == KVP_GGUF_UINT16 || t == KVP_GGUF_UINT32 ||
           t == KVP_GGUF_UINT64;
}

static bool is_signed(uint32_t t)
{
    return t == KVP_GGUF_INT8 || t == KVP_GGUF_INT16 || t == KVP_GGUF_INT32 ||
           t == KVP_GGUF_INT64;
}

int kvp_gguf_get_u32(const kvp_gguf *g, const char *key, uint32_t *out)
{
    const kvp_gguf_kv *kv = kvp_gguf_find(g, key);
    if (!kv)
        return -ENOENT;
    if (is_unsigned(kv->type) && kv->val.u64 <= UINT32_MAX)
        *out = (uint32_t)kv->val.u64;
    else if (is_signed(kv->type) && kv->val.i64 >= 0 && kv->val.i64 <= UINT32_MAX)
        *out = (uint32_t)kv->val.i64;
    else
        return -EINVAL;
    return 0;
}

int kvp_gguf_get_f32(const kvp_gguf *g, const char *key, float *out)
{
    const kvp_gguf_kv *kv = kvp_gguf_find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type == KVP_GGUF_FLOAT32 || kv->type == KVP_GGUF_FLOAT64) {
        double d = kv->val.f64;
        /* a finite double that overflows float is out of range; inf/nan pass through */
        if (isfinite(d) && fabs(d) > FLT_MAX)
            return -EINVAL;
        *out = (float)d;
    } else if (is_unsigned(kv->type)) {
        *out = (float)kv->val.u64;
    } else if (is_signed(kv->type)) {
        *out = (float)kv->val.i64;
    } else {
        return -EINVAL;
    }
    return 0;
}

int kvp_gguf_get_str(const kvp_gguf *g, const char *key, char *buf, size_t cap)
{
    const kvp_gguf_kv *kv = kvp_gguf_find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != KVP_GGUF_STRING)
        return -EINVAL;
    if (kv->val.str.len >= cap)
        return -ERANGE;
    memcpy(buf, kv->val.str.ptr, (size_t)kv->val.str.len);
    buf[kv->val.str.len] = 0;
    return 0;
}

int kvp_gguf_str_array(const kvp_gguf_kv *kv, kvp_gguf_str *out, uint64_t n)
{
    if (kv->type != KVP_GGUF_ARRAY || kv->val.arr.type != KVP_GGUF_STRING ||
        kv->val.arr.n != n)
        return -EINVAL;
    /* The parser has walked this array inside the file already. */
    const uint8_t *p = kv->val.arr.data;
    for (uint64_t i = 0; i < n; i++) {
        out[i].len = le(p, 8);
        out[i].ptr = (const char *)p + 8;
        p += 8 + out[i].len;
    }
    return 0;
}

/* ----------------------------------------------------------------------- writer */

typedef struct wtensor {
    char *name;
    uint32_t n_dims, type;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t n_bytes, offset;
} wtensor;

struct kvp_gguf_writer {
    uint8_t *kv;          /* serialized kv section */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    char **keys;          /* for the duplicate check */
    wtensor *t;
    uint64_t n_t, t_cap;
    uint64_t data_size;   /* data section bytes so far (aligned) */
    int failed;           /* an earlier add failed: write refuses */
};

kvp_gguf_writer *kvp_gguf_writer_new(void)
{
    return calloc(1, sizeof(kvp_gguf_writer));
}

void kvp_gguf_writer_free(kvp_gguf_writer *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    for (uint64_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->kv);
    free(w);
}

static int fail(kvp_gguf_writer *w, int rc)
{
    w->failed = 1;
    return rc;
}

static int put(kvp_gguf_writer *w, const void *p, size_t n)
{
    if (!n)
        return 0;
    if (n > SIZE_MAX / 2 - w->kv_len)
        return -ENOMEM;
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 1024;
        while (cap < w->kv_len + n)
            cap *= 2;
        uint8_t *b = realloc(w->kv, cap);
        if (!b)
            return -ENOMEM;
        w->kv = b;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int put_le(kvp_gguf_writer *w, uint64_t v, int n)
{
    uint8_t b[8];
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return put(w, b, (size_t)n);
}

static int put_str(kvp_gguf_writer *w, const char *s)
{
    size_t n = strlen(s);
    int rc = put_le(w, n, 8);
    return rc ? rc : put(w, s, n);
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Starts a kv: checks the key and writes it with its type. */
static int begin_kv(kvp_gguf_writer *w, const char *key, uint32_t type)
{
    if (!key || !*key)
        return fail(w, -EINVAL);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return fail(w, -EEXIST);
    char **keys = realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *keys);
    if (!keys)
        return fail(w, -ENOMEM);
    w->keys = keys;
    if (!(keys[w->n_kv] = strdup(key)))
        return fail(w, -ENOMEM);
    if (put_str(w, key) || put_le(w, type, 4)) {
        free(keys[w->n_kv]);
        return fail(w, -ENOMEM);
    }
    w->n_kv++;
    return 0;
}

/* Any failure while serializing a kv leaves a partial entry, so the writer is marked
 * failed and refuses to write. */
static int end_kv(kvp_gguf_writer *w, int rc)
{
    return rc ? fail(w, rc) : 0;
}

int kvp_gguf_writer_add_u32(kvp_gguf_writer *w, const char *key, uint32_t v)
{
    int rc = begin_kv(w, key, KVP_GGUF_UINT32);
    return rc ? rc : end_kv(w, put_le(w, v, 4));
}

int kvp_gguf_writer_add_f32(kvp_gguf_writer *w, const char *key, float v)
{
    int rc = begin_kv(w, key, KVP_GGUF_FLOAT32);
    return rc ? rc : end_kv(w, put_le(w, f32_bits(v), 4));
}

int kvp_gguf_writer_add_str(kvp_gguf_writer *w, const char *key, const char *v)
{
    int rc = begin_kv(w, key, KVP_GGUF_STRING);
    return rc ? rc : end_kv(w, put_str(w, v));
}

int kvp_gguf_writer_add_bool(kvp_gguf_writer *w, const char *key, int v)
{
    int rc = begin_kv(w, key, KVP_GGUF_BOOL);
    return rc ? rc : end_kv(w, put_le(w, v != 0, 1));
}

static int begin_array(kvp_gguf_writer *w, const char *key, uint32_t et, uint64_t n)
{
    int rc = begin_kv(w, key, KVP_GGUF_ARRAY);
    if (!rc && (put_le(w, et, 4) || put_le(w, n, 8)))
        rc = fail(w, -ENOMEM);
    return rc;
}

int kvp_gguf_writer_add_str_array(kvp_gguf_writer *w, const char *key,
                                  const char *const *v, uint64_t n)
{
    int rc = begin_array(w, key, KVP_GGUF_STRING, n);
    for (uint64_t i = 0; i < n && !rc; i++)
        rc = put_str(w, v[i]);
    return end_kv(w, rc);
}

int kvp_gguf_writer_add_f32_array(kvp_gguf_writer *w, const char *key, const float *v,
                                  uint64_t n)
{
    int rc = begin_array(w, key, KVP_GGUF_FLOAT32, n);
    for (uint64_t i = 0; i < n && !rc; i++)
        rc = put_le(w, f32_bits(v[i]), 4);
    return end_kv(w, rc);
}

int kvp_gguf_writer_add_i32_array(kvp_gguf_writer *w, const char *key, const int32_t *v,
                                  uint64_t n)
{
    int rc = begin_array(w, key, KVP_GGUF_INT32, n);
    for (uint64_t i = 0; i < n && !rc; i++)
        rc = put_le(w, (uint32_t)v[i], 4);
    return end_kv(w, rc);
}

static int elem_size(uint32_t type)
{
    switch (type) {
    case KVP_GGUF_UINT8: case KVP_GGUF_INT8: case KVP_GGUF_BOOL: return 1;
    case KVP_GGUF_UINT16: case KVP_GGUF_INT16: return 2;
    case KVP_GGUF_UINT32: case KVP_GGUF_INT32: case KVP_GGUF_FLOAT32: return 4;
    case KVP_GGUF_UINT64: case KVP_GGUF_INT64: case KVP_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

int kvp_gguf_writer_copy_kv(kvp_gguf_writer *w, const kvp_gguf_kv *kv)
{
    char *key = strndup(kv->key.ptr, (size_t)kv->key.len);
    if (!key)
        return fail(w, -ENOMEM);
    int rc = begin_kv(w, key, kv->type);
    free(key);
    if (rc)
        return rc;
    int n = elem_size(kv->type);
    switch (kv->type) {
    case KVP_GGUF_FLOAT32:
        rc = put_le(w, f32_bits((float)kv->val.f64), 4);
        break;
    case KVP_GGUF_FLOAT64: {
        uint64_t u;
        memcpy(&u, &kv->val.f64, 8);
        rc = put_le(w, u, 8);
        break;
    }
    case KVP_GGUF_INT8: case KVP_GGUF_INT16: case KVP_GGUF_INT32: case KVP_GGUF_INT64:
        rc = put_le(w, (uint64_t)kv->val.i64, n);
        break;
    case KVP_GGUF_STRING:
        rc = put_le(w, kv->val.str.len, 8);
        rc = rc ? rc : put(w, kv->val.str.ptr, (size_t)kv->val.str.len);
        break;
    case KVP_GGUF_ARRAY: {
        /* the reader checked every element lies inside the file */
        uint32_t et = kv->val.arr.type;
        rc = put_le(w, et, 4);
        rc = rc ? rc : put_le(w, kv->val.arr.n, 8);
        const uint8_t *p = kv->val.arr.data;
        if (et == KVP_GGUF_STRING) {
            for (uint64_t i = 0; i < kv->val.arr.n && !rc; i++) {
                uint64_t len = le(p, 8);
                rc = put(w, p, (size_t)(8 + len));
                p += 8 + len;
            }
        } else {
            rc = rc ? rc : put(w, p, (size_t)(kv->val.arr.n * (uint64_t)elem_size(et)));
        }
        break;
    }
    default:
        rc = put_le(w, kv->val.u64, n);
    }
    return end_kv(w, rc);
}

int kvp_gguf_writer_add_tensor(kvp_gguf_writer *w, const char *name, uint32_t type,
                               uint32_t n_dims, const uint64_t *ne)
{
    if (!name || !*name || n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return fail(w, -EINVAL);
    for (uint64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return fail(w, -EEXIST);
    wtensor t = {.n_dims = n_dims, .type = type};
    uint64_t n = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || t.ne[d] > INT64_MAX / n)
            return fail(w, -EINVAL);
        n *= t.ne[d];
    }
    /* rows must hold whole blocks, as the reader requires */
    if (!kvp_type_block(type) || t.ne[0] % (uint64_t)kvp_type_block(type))
        return fail(w, -EINVAL);
    t.n_bytes = kvp_type_nbytes(type, n);
    uint64_t padded = (t.n_bytes + GGUF_DEFAULT_ALIGNMENT - 1) &
                      ~(uint64_t)(GGUF_DEFAULT_ALIGNMENT - 1);
    if (!t.n_bytes || padded < t.n_bytes || padded > UINT64_MAX - w->data_size)
        return fail(w, -EINVAL);
    if (w->n_t == w->t_cap) {
        uint64_t cap = w->t_cap ? 2 * w->t_cap : 64;
        wtensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt)
            return fail(w, -ENOMEM);
        w->t = nt;
        w->t_cap = cap;
    }
    if (!(t.name = strdup(name)))
        return fail(w, -ENOMEM);
    t.offset = w->data_size;
    w->data_size += padded;
    w->t[w->n_t++] = t;
    return 0;
}

static bool out_le(FILE *f, uint64_t v, int n)
{
    uint8_t b[8];
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return fwrite(b, 1, (size_t)n, f) == (size_t)n;
}

static bool out_pad(FILE *f, uint64_t n)
{
    static const uint8_t zeros[GGUF_DEFAULT_ALIGNMENT];
    return fwrite(zeros, 1, (size_t)n, f) == n;
}

/* Writes the header, kvs and tensor table; returns the bytes written, 0 on an I/O
 * error. */
static uint64_t write_head(kvp_gguf_writer *w, FILE *f)
{
    uint64_t pos = 4 + 4 + 8 + 8 + w->kv_len;
    bool ok = fwrite("GGUF", 1, 4, f) == 4 && out_le(f, 3, 4) && out_le(f, w->n_t, 8) &&
              out_le(f, w->n_kv, 8) &&
              (!w->kv_len || fwrite(w->kv, 1, w->kv_len, f) == w->kv_len);
    for (uint64_t i = 0; i < w->n_t && ok; i++) {
        const wtensor *t = &w->t[i];
        size_t len = strlen(t->name);
        ok = out_le(f, len, 8) && fwrite(t->name, 1, len, f) == len &&
             out_le(f, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims && ok; d++)
            ok = out_le(f, t->ne[d], 8);
        ok = ok && out_le(f, t->type, 4) && out_le(f, t->offset, 8);
        pos += 8 + len + 4 + 8ull * t->n_dims + 4 + 8;
    }
    return ok ? pos : 0;
}

int kvp_gguf_writer_write(kvp_gguf_writer *w, FILE *f,
                          int (*fill)(void *ctx, uint64_t i, void *buf, uint64_t n_bytes),
                          void *ctx, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (w->failed) {
        kvp_errorf(err, errlen, 0, "gguf writer: an earlier add failed (bad argument, duplicate "
               "name or out of memory)");
        return -EINVAL;
    }
    uint64_t max = 0;
    for (uint64_t i = 0; i < w->n_t; i++)
        max = w->t[i].n_bytes > max ? w->t[i].n_bytes : max;
    /* One buffer, reused for every tensor: only the largest tensor is ever in memory.
     * With fill == NULL tensors are written as zeros. */
    void *buf = max > SIZE_MAX ? NULL : calloc(1, (size_t)max + 1);
    if (!buf) {
        kvp_errorf(err, errlen, 0, "gguf writer: out of memory for a %llu-byte tensor buffer",
               (unsigned long long)max);
        return -ENOMEM;
    }
    int rc = 0;
    errno = 0;
    uint64_t pos = write_head(w, f);
    if (!pos || !out_pad(f, -pos & (GGUF_DEFAULT_ALIGNMENT - 1)))
        goto io;
    for (uint64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (fill && (rc = fill(ctx, i, buf, t->n_bytes))) {
            kvp_errorf(err, errlen, 0, "gguf writer: filling tensor '%s' failed (%d)", t->name, rc);
            rc = rc < 0 ? rc : -EIO;
            goto out;
        }
        if (fwrite(buf, 1, (size_t)t->n_bytes, f) != t->n_bytes ||
            !out_pad(f, -t->n_bytes & (GGUF_DEFAULT_ALIGNMENT - 1)))
            goto io;
    }
    if (fflush(f))
        goto io;
    goto out;
io:
    rc = -(errno ? errno : EIO);
    kvp_errorf(err, errlen, 0, "gguf writer: write failed: %s", strerror(-rc));
out:
    free(buf);
    return rc;
}
