/* GGUF v2/v3 reader (bounds-checked, mmap; model/gguf.c) and v3 writer
 * (model/gguf_write.c). Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
 * Every string and array the reader returns points into the mapping and has been
 * checked to lie inside it; strings are NOT NUL-terminated. */
#ifndef KVP_GGUF_H
#define KVP_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/ggml_type.h"

enum kvp_gguf_type {
    KVP_GGUF_UINT8 = 0, KVP_GGUF_INT8 = 1, KVP_GGUF_UINT16 = 2, KVP_GGUF_INT16 = 3,
    KVP_GGUF_UINT32 = 4, KVP_GGUF_INT32 = 5, KVP_GGUF_FLOAT32 = 6, KVP_GGUF_BOOL = 7,
    KVP_GGUF_STRING = 8, KVP_GGUF_ARRAY = 9, KVP_GGUF_UINT64 = 10, KVP_GGUF_INT64 = 11,
    KVP_GGUF_FLOAT64 = 12,
};

typedef struct kvp_gguf_str { const char *ptr; uint64_t len; } kvp_gguf_str;

typedef struct kvp_gguf_kv {
    kvp_gguf_str key;
    uint32_t type;                 /* enum kvp_gguf_type */
    union {
        uint64_t u64;              /* all unsigned ints and bool */
        int64_t i64;               /* all signed ints */
        double f64;                /* FLOAT32 and FLOAT64 */
        kvp_gguf_str str;
        struct {
            uint32_t type;         /* element type (never ARRAY: nested arrays are rejected) */
            uint64_t n;            /* element count */
            const uint8_t *data;   /* first element; for STRING arrays, the first length prefix */
        } arr;
    } val;
} kvp_gguf_kv;

typedef struct kvp_gguf_tensor {
    kvp_gguf_str name;
    uint32_t n_dims;               /* 1..4 */
    uint64_t ne[4];                /* ne[0] is the contiguous (innermost) dimension; unused = 1 */
    uint32_t type;                 /* enum kvp_ggml_type (validated: known, supported) */
    uint64_t offset;               /* relative to the data section, aligned */
    uint64_t n_elements;
    uint64_t n_bytes;
    const void *data;              /* inside the mapping, checked */
} kvp_gguf_tensor;

typedef struct kvp_gguf {
    void *map;                     /* mmap'd file (NULL when parsed from a caller buffer) */
    size_t map_size;
    const uint8_t *base;           /* start of the file bytes */
    size_t size;
    uint32_t version;              /* 2 or 3 */
    uint64_t n_kv, n_tensors;
    kvp_gguf_kv *kv;               /* [n_kv] */
    kvp_gguf_tensor *tensors;      /* [n_tensors] */
    uint64_t alignment;            /* general.alignment, default 32 */
} kvp_gguf;

/* ------------------------------------------------------------ reader (gguf.c) */

/* mmap the file and parse it. Returns 0, or a negative errno-style code with a
 * message in err (always NUL-terminated). On error *g needs no close. */
int kvp_gguf_open(kvp_gguf *g, const char *path, char *err, size_t errlen);
/* Parse a caller-owned buffer (kept alive by the caller until close). */
int kvp_gguf_parse(kvp_gguf *g, const void *buf, size_t size, char *err, size_t errlen);
void kvp_gguf_close(kvp_gguf *g);

const kvp_gguf_kv *kvp_gguf_find(const kvp_gguf *g, const char *key);
const kvp_gguf_tensor *kvp_gguf_find_tensor(const kvp_gguf *g, const char *name);
/* Typed getters: 0 on success, -ENOENT if absent, -EINVAL on a wrong type or a value
 * out of range (any integer type is accepted where it fits). */
int kvp_gguf_get_u32(const kvp_gguf *g, const char *key, uint32_t *out);
int kvp_gguf_get_f32(const kvp_gguf *g, const char *key, float *out);
/* Copies a STRING value into buf as a NUL-terminated string (-ERANGE if it does not fit). */
int kvp_gguf_get_str(const kvp_gguf *g, const char *key, char *buf, size_t cap);
/* Fills out[0..n) with the elements of a STRING array (n must equal kv->val.arr.n). */
int kvp_gguf_str_array(const kvp_gguf_kv *kv, kvp_gguf_str *out, uint64_t n);

/* ------------------------------------------------------ writer (gguf_write.c) */

/* A small streaming GGUF v3 writer (used by `kvp synth` and by tests that
 * build malformed files). Add all kvs and tensor infos, then write the data of each
 * tensor in the order added. */
typedef struct kvp_gguf_writer kvp_gguf_writer;
kvp_gguf_writer *kvp_gguf_writer_new(void);
void kvp_gguf_writer_free(kvp_gguf_writer *w);
int kvp_gguf_writer_add_u32(kvp_gguf_writer *w, const char *key, uint32_t v);
int kvp_gguf_writer_add_f32(kvp_gguf_writer *w, const char *key, float v);
int kvp_gguf_writer_add_str(kvp_gguf_writer *w, const char *key, const char *v);
int kvp_gguf_writer_add_bool(kvp_gguf_writer *w, const char *key, int v);
int kvp_gguf_writer_add_str_array(kvp_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int kvp_gguf_writer_add_f32_array(kvp_gguf_writer *w, const char *key, const float *v, uint64_t n);
int kvp_gguf_writer_add_i32_array(kvp_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Copies a kv of a parsed file (any type) under its own key. */
int kvp_gguf_writer_copy_kv(kvp_gguf_writer *w, const kvp_gguf_kv *kv);
/* Declares a tensor; ne[0] innermost. */
int kvp_gguf_writer_add_tensor(kvp_gguf_writer *w, const char *name, uint32_t type,
                               uint32_t n_dims, const uint64_t *ne);
/* Writes header, kvs and tensor table, then calls fill(ctx, i, buf, n_bytes) for each
 * tensor in order so large tensors need not all be in memory at once. */
int kvp_gguf_writer_write(kvp_gguf_writer *w, FILE *f,
                          int (*fill)(void *ctx, uint64_t i, void *buf, uint64_t n_bytes),
                          void *ctx, char *err, size_t errlen);

#endif
