/* GGUF v2/v3 reader (see gguf.h; the writer is model/gguf_write.c).
 * The reader treats the file as hostile: every read goes through a cursor that checks
 * the remaining bytes first, every size is computed with overflow checks, and counts
 * are compared with what the remaining bytes could possibly hold before anything is
 * allocated. Integers are decoded byte by byte, so the host byte order does not matter
 * for the metadata. */
#include "base/fileio.h"
#include "model/gguf.h"
#include "model/gguf_impl.h"

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

static bool rd(cursor *c, int n, uint64_t *v, const char *what)
{
    if (!need(c, (uint64_t)n, what))
        return false;
    *v = gguf_le(c->p + c->off, n);
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

static bool read_scalar(cursor *c, uint32_t t, kvp_gguf_kv *kv, const char *what)
{
    int n = gguf_scalar_size(t);
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
        if (!gguf_scalar_size(kv->type)) {
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
    int es = gguf_scalar_size(et);
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
        out[i].len = gguf_le(p, 8);
        out[i].ptr = (const char *)p + 8;
        p += 8 + out[i].len;
    }
    return 0;
}
