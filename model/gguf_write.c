/* GGUF v3 writer (see gguf.h): kvs are serialized into one growing buffer as they are
 * added, tensor infos are kept until the write, and the data section is written tensor by
 * tensor through the caller's fill callback. Any failed add marks the writer failed, so
 * a half-described file is never written. */
#include "model/gguf.h"
#include "model/gguf_impl.h"

#include "base/errors.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"

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

int kvp_gguf_writer_copy_kv(kvp_gguf_writer *w, const kvp_gguf_kv *kv)
{
    char *key = strndup(kv->key.ptr, (size_t)kv->key.len);
    if (!key)
        return fail(w, -ENOMEM);
    int rc = begin_kv(w, key, kv->type);
    free(key);
    if (rc)
        return rc;
    int n = gguf_scalar_size(kv->type);
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
                uint64_t len = gguf_le(p, 8);
                rc = put(w, p, (size_t)(8 + len));
                p += 8 + len;
            }
        } else {
            rc = rc ? rc : put(w, p, (size_t)(kv->val.arr.n * (uint64_t)gguf_scalar_size(et)));
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
