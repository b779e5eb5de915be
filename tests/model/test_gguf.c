/* Tests for model/gguf.c: the real model files, the writer, and hostile input.
 * Malformed files are built by patching bytes of valid buffers; every parse of bad
 * input runs on an exact-size heap copy so a read past the end is caught by ASan. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
#include "tests/model/testutil.h"

/* ------------------------------------------------------------------- helpers */

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Offset just past the GGUF string `s` (its u64 length prefix and bytes) in buf. */
static size_t after_str(const uint8_t *buf, size_t len, const char *s)
{
    size_t n = strlen(s);
    uint8_t pat[256];
    cr_assert(n + 8 <= sizeof pat);
    wr64(pat, n);
    memcpy(pat + 8, s, n);
    const uint8_t *hit = memmem(buf, len, pat, n + 8);
    cr_assert(hit, "string '%s' not found", s);
    return (size_t)(hit - buf) + 8 + n;
}

/* Tensor info fields, located from the tensor's name. */
typedef struct tinfo { size_t n_dims, ne, type, offset; } tinfo;

static tinfo find_tinfo(const uint8_t *buf, size_t len, const char *name)
{
    tinfo t;
    t.n_dims = after_str(buf, len, name);
    uint32_t nd = buf[t.n_dims];
    t.ne = t.n_dims + 4;
    t.type = t.ne + 8 * nd;
    t.offset = t.type + 4;
    return t;
}

/* Parses an exact-size copy of buf[0..len) and expects an error with a message that
 * contains `want` (if not NULL). Returns the code. */
static int expect_bad(const uint8_t *buf, size_t len, const char *want)
{
    uint8_t *copy = malloc(len ? len : 1);
    cr_assert(copy);
    memcpy(copy, buf, len);
    kvp_gguf g;
    char err[512];
    memset(err, 'x', sizeof err);
    int rc = kvp_gguf_parse(&g, copy, len, err, sizeof err);
    free(copy);
    if (rc >= 0)
        cr_assert_fail("parse of %zu bytes succeeded, wanted an error with '%s'", len,
                       want ? want : "");
    if (!memchr(err, 0, sizeof err) || !err[0])
        cr_assert_fail("parse of %zu bytes failed (%d) without a message", len, rc);
    if (want && !strstr(err, want))
        cr_assert_fail("message '%s' lacks '%s'", err, want);
    if (g.kv || g.tensors || g.n_kv || g.n_tensors)
        cr_assert_fail("failed parse left state behind");
    return rc;
}

static uint8_t *load(const char *rel, size_t *len)
{
    return (uint8_t *)tu_slurp(tu_shared(rel), len);
}

static int fill_pattern(void *ctx, uint64_t i, void *buf, uint64_t n)
{
    (void)ctx;
    uint8_t *b = buf;
    for (uint64_t j = 0; j < n; j++)
        b[j] = (uint8_t)(j * 7 + i * 31 + 1);
    return 0;
}

/* Writes w into a heap buffer with the given fill callback. */
static uint8_t *write_mem(kvp_gguf_writer *w, int (*fill)(void *, uint64_t, void *, uint64_t),
                          size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    cr_assert(f);
    char err[256];
    int rc = kvp_gguf_writer_write(w, f, fill, NULL, err, sizeof err);
    fclose(f);
    cr_assert_eq(rc, 0, "write: %s", err);
    return (uint8_t *)buf;
}

/* A small valid file: a few kvs and three tensors (F32, F16, Q8_0). */
static uint8_t *small_file(size_t *len)
{
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert(w);
    const int32_t iv[3] = {-1, 0, 7};
    const char *sv[2] = {"a", "bc"};
    cr_assert_eq(kvp_gguf_writer_add_str(w, "general.architecture", "llama"), 0);
    cr_assert_eq(kvp_gguf_writer_add_u32(w, "t.aaa", 1), 0);
    cr_assert_eq(kvp_gguf_writer_add_u32(w, "t.bbb", 2), 0);
    cr_assert_eq(kvp_gguf_writer_add_i32_array(w, "t.ints", iv, 3), 0);
    cr_assert_eq(kvp_gguf_writer_add_str_array(w, "t.strs", sv, 2), 0);
    const uint64_t a[2] = {5, 3}, b[1] = {7}, c[2] = {64, 2};
    cr_assert_eq(kvp_gguf_writer_add_tensor(w, "t.f32", KVP_GGML_F32, 2, a), 0);
    cr_assert_eq(kvp_gguf_writer_add_tensor(w, "t.f16", KVP_GGML_F16, 1, b), 0);
    cr_assert_eq(kvp_gguf_writer_add_tensor(w, "t.q80", KVP_GGML_Q8_0, 2, c), 0);
    uint8_t *buf = write_mem(w, fill_pattern, len);
    kvp_gguf_writer_free(w);
    return buf;
}

/* ---------------------------------------------------------------- real files */

Test(gguf, stories260K)
{
    kvp_gguf g;
    char err[256];
    int rc = kvp_gguf_open(&g, tu_shared("models/stories260K.gguf"), err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(g.version, 3);
    cr_expect_eq(g.n_tensors, 48);
    cr_expect_eq(g.n_kv, 19);
    cr_expect_eq(g.alignment, 32);
    cr_expect(g.map != NULL);

    char s[64];
    cr_assert_eq(kvp_gguf_get_str(&g, "general.architecture", s, sizeof s), 0);
    cr_expect_str_eq(s, "llama");
    cr_assert_eq(kvp_gguf_get_str(&g, "tokenizer.ggml.model", s, sizeof s), 0);
    cr_expect_str_eq(s, "llama");
    static const struct { const char *key; uint32_t v; } u[] = {
        {"llama.embedding_length", 64}, {"llama.block_count", 5},
        {"llama.feed_forward_length", 172}, {"llama.attention.head_count", 8},
        {"llama.attention.head_count_kv", 4}, {"llama.context_length", 2048},
        {"llama.rope.dimension_count", 8}, {"tokenizer.ggml.bos_token_id", 1},
        {"tokenizer.ggml.eos_token_id", 2}, {"tokenizer.ggml.padding_token_id", UINT32_MAX},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        uint32_t v = 0;
        cr_expect_eq(kvp_gguf_get_u32(&g, u[i].key, &v), 0, "%s", u[i].key);
        cr_expect_eq(v, u[i].v, "%s = %u", u[i].key, v);
    }
    float eps = 0;
    cr_assert_eq(kvp_gguf_get_f32(&g, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    cr_expect_float_eq(eps, 1e-5f, 1e-9f);

    const kvp_gguf_kv *toks = kvp_gguf_find(&g, "tokenizer.ggml.tokens");
    cr_assert(toks);
    cr_assert_eq(toks->type, KVP_GGUF_ARRAY);
    cr_assert_eq(toks->val.arr.type, KVP_GGUF_STRING);
    cr_assert_eq(toks->val.arr.n, 512);
    kvp_gguf_str strs[512];
    cr_assert_eq(kvp_gguf_str_array(toks, strs, 512), 0);
    cr_expect(strs[0].len == 5 && !memcmp(strs[0].ptr, "<unk>", 5));
    cr_expect(strs[1].len == 3 && !memcmp(strs[1].ptr, "<s>", 3));
    cr_expect(strs[2].len == 4 && !memcmp(strs[2].ptr, "</s>", 4));
    cr_expect_eq(kvp_gguf_str_array(toks, strs, 511), -EINVAL);
    const kvp_gguf_kv *scores = kvp_gguf_find(&g, "tokenizer.ggml.scores");
    cr_assert(scores && scores->val.arr.type == KVP_GGUF_FLOAT32 && scores->val.arr.n == 512);
    const kvp_gguf_kv *tt = kvp_gguf_find(&g, "tokenizer.ggml.token_type");
    cr_assert(tt && tt->val.arr.type == KVP_GGUF_INT32 && tt->val.arr.n == 512);
    cr_expect_eq(kvp_gguf_str_array(tt, strs, 512), -EINVAL);

    const kvp_gguf_tensor *e = kvp_gguf_find_tensor(&g, "token_embd.weight");
    cr_assert(e);
    cr_expect_eq(e->n_dims, 2);
    cr_expect(e->ne[0] == 64 && e->ne[1] == 512 && e->ne[2] == 1 && e->ne[3] == 1);
    cr_expect_eq(e->type, KVP_GGML_F32);
    cr_expect_eq(e->n_elements, 64 * 512);
    cr_expect_eq(e->n_bytes, 64 * 512 * 4);
    const kvp_gguf_tensor *last = kvp_gguf_find_tensor(&g, "blk.4.ffn_norm.weight");
    cr_assert(last);
    cr_expect_eq((const uint8_t *)last->data + last->n_bytes, g.base + g.size);
    for (uint64_t i = 0; i < g.n_tensors; i++)
        cr_expect_eq(g.tensors[i].offset % 32, 0);
    cr_expect_null(kvp_gguf_find_tensor(&g, "blk.5.ffn_norm.weight"));
    cr_expect_null(kvp_gguf_find(&g, "llama.embedding"));

    /* The tensors are bit-identical to the llama2.c checkpoint, whose 7-int header is
     * followed by the token embedding table. */
    size_t blen;
    uint8_t *bin = load("models/stories260K.bin", &blen);
    cr_assert(blen >= 28 + e->n_bytes);
    cr_expect(memcmp(bin + 28, e->data, (size_t)e->n_bytes) == 0);
    free(bin);

    /* getter errors */
    uint32_t v;
    cr_expect_eq(kvp_gguf_get_u32(&g, "no.such.key", &v), -ENOENT);
    cr_expect_eq(kvp_gguf_get_u32(&g, "general.architecture", &v), -EINVAL);
    cr_expect_eq(kvp_gguf_get_u32(&g, "tokenizer.ggml.tokens", &v), -EINVAL);
    cr_expect_eq(kvp_gguf_get_f32(&g, "general.architecture", &eps), -EINVAL);
    cr_expect_eq(kvp_gguf_get_str(&g, "llama.block_count", s, sizeof s), -EINVAL);
    cr_expect_eq(kvp_gguf_get_str(&g, "general.architecture", s, 5), -ERANGE);
    cr_expect_eq(kvp_gguf_get_str(&g, "general.architecture", s, 6), 0);
    cr_expect_eq(kvp_gguf_get_str(&g, "no.such.key", s, sizeof s), -ENOENT);
    float f;
    cr_expect_eq(kvp_gguf_get_f32(&g, "llama.block_count", &f), 0);
    cr_expect_eq(f, 5.0f);
    kvp_gguf_close(&g);
    cr_expect_null(g.kv);
}

Test(gguf, llama2_tiny_random_f16)
{
    size_t len;
    uint8_t *buf = load("models/llama-2-tiny-random.gguf", &len);
    kvp_gguf g;
    char err[256];
    int rc = kvp_gguf_parse(&g, buf, len, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_null(g.map);
    cr_expect_eq(g.n_tensors, 12);
    cr_expect_eq(g.n_kv, 18);
    char name[64];
    cr_assert_eq(kvp_gguf_get_str(&g, "general.name", name, sizeof name), 0);
    cr_expect_str_eq(name, "LLaMA v2");
    uint32_t v;
    cr_assert_eq(kvp_gguf_get_u32(&g, "llama.embedding_length", &v), 0);
    cr_expect_eq(v, 8);
    cr_assert_eq(kvp_gguf_get_u32(&g, "general.file_type", &v), 0);
    cr_expect_eq(v, 1);

    const kvp_gguf_kv *toks = kvp_gguf_find(&g, "tokenizer.ggml.tokens");
    cr_assert(toks && toks->val.arr.n == 32000);
    kvp_gguf_str *s = malloc(32000 * sizeof *s);
    cr_assert_eq(kvp_gguf_str_array(toks, s, 32000), 0);
    cr_expect(s[0].len == 5 && !memcmp(s[0].ptr, "<unk>", 5));
    cr_expect(s[3].len == 6 && !memcmp(s[3].ptr, "<0x00>", 6));
    cr_expect(s[258].len == 6 && !memcmp(s[258].ptr, "<0xFF>", 6));
    for (int i = 0; i < 32000; i++)
        if ((const uint8_t *)s[i].ptr < buf || (const uint8_t *)s[i].ptr + s[i].len > buf + len)
            cr_assert_fail("token %d outside the buffer", i);
    free(s);

    const kvp_gguf_tensor *e = kvp_gguf_find_tensor(&g, "token_embd.weight");
    cr_assert(e);
    cr_expect_eq(e->type, KVP_GGML_F16);
    cr_expect(e->ne[0] == 8 && e->ne[1] == 32000);
    cr_expect_eq(e->n_bytes, 8 * 32000 * 2);
    const kvp_gguf_tensor *n = kvp_gguf_find_tensor(&g, "blk.0.attn_norm.weight");
    cr_assert(n);
    cr_expect_eq(n->type, KVP_GGML_F32);
    const kvp_gguf_tensor *q = kvp_gguf_find_tensor(&g, "blk.0.attn_q.weight");
    cr_assert(q && q->type == KVP_GGML_F16 && q->n_elements == 64);
    float w[64];
    cr_assert_eq(kvp_dequantize(q->type, q->data, w, 64), 0);
    int nonzero = 0;
    for (int i = 0; i < 64; i++) {
        cr_expect(isfinite(w[i]) && fabsf(w[i]) < 100.0f);
        nonzero += w[i] != 0.0f;
    }
    cr_expect_gt(nonzero, 32);
    kvp_gguf_close(&g);
    free(buf);
}

Test(gguf, open_errors)
{
    kvp_gguf g;
    char err[256];
    int rc = kvp_gguf_open(&g, "/nonexistent/x.gguf", err, sizeof err);
    cr_expect_eq(rc, -ENOENT);
    cr_expect(strstr(err, "/nonexistent/x.gguf"), "%s", err);
    rc = kvp_gguf_open(&g, "/tmp", err, sizeof err);
    cr_expect_lt(rc, 0);
    cr_expect(strstr(err, "not a regular file"), "%s", err);
    /* a tiny errlen still yields a terminated (truncated) message */
    char small[8];
    rc = kvp_gguf_open(&g, "/nonexistent/x.gguf", small, sizeof small);
    cr_expect_lt(rc, 0);
    cr_expect_eq(strlen(small), 7);
    /* a bad file: the message names it */
    const char *p = tu_write_tmp("GGUF\x01\0\0\0", 8);
    rc = kvp_gguf_open(&g, p, err, sizeof err);
    cr_expect_lt(rc, 0);
    cr_expect(strstr(err, p) && strstr(err, "version 1"), "%s", err);
    remove(p);
}

/* ------------------------------------------------------------------- writer */

static int fill_fail(void *ctx, uint64_t i, void *buf, uint64_t n)
{
    (void)ctx, (void)buf, (void)n;
    return i == 1 ? -EIO : 0;
}

Test(gguf, writer_round_trip)
{
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert(w);
    const char *strs[] = {"<unk>", "", "\xe2\x96\x81hello", "x"};
    const float fv[] = {0.0f, -1.5f, 1e30f};
    const int32_t iv[] = {INT32_MIN, -1, 0, 6, INT32_MAX};
    cr_assert_eq(kvp_gguf_writer_add_str(w, "general.architecture", "llama"), 0);
    cr_assert_eq(kvp_gguf_writer_add_u32(w, "a.u32", 4000000000u), 0);
    cr_assert_eq(kvp_gguf_writer_add_f32(w, "a.f32", 0.125f), 0);
    cr_assert_eq(kvp_gguf_writer_add_str(w, "a.empty", ""), 0);
    cr_assert_eq(kvp_gguf_writer_add_str_array(w, "a.strs", strs, 4), 0);
    cr_assert_eq(kvp_gguf_writer_add_f32_array(w, "a.floats", fv, 3), 0);
    cr_assert_eq(kvp_gguf_writer_add_i32_array(w, "a.ints", iv, 5), 0);
    cr_assert_eq(kvp_gguf_writer_add_i32_array(w, "a.none", NULL, 0), 0);
    const uint64_t ne1[1] = {3}, ne2[2] = {5, 7}, ne3[3] = {64, 3, 2}, ne4[4] = {2, 3, 4, 5};
    cr_assert_eq(kvp_gguf_writer_add_tensor(w, "t.a", KVP_GGML_F32, 1, ne1), 0);
    cr_assert_eq(kvp_gguf_writer_add_tensor(w, "t.b", KVP_GGML_F16, 2, ne2), 0);
    cr_assert_eq(kvp_gguf_writer_add_tensor(w, "t.c", KVP_GGML_Q8_0, 3, ne3), 0);
    cr_assert_eq(kvp_gguf_writer_add_tensor(w, "t.d", KVP_GGML_F32, 4, ne4), 0);
    size_t len;
    uint8_t *buf = write_mem(w, fill_pattern, &len);

    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_parse(&g, buf, len, err, sizeof err), 0, "%s", err);
    cr_expect_eq(g.version, 3);
    cr_expect_eq(g.n_kv, 8);
    cr_expect_eq(g.n_tensors, 4);
    char s[32];
    uint32_t u;
    float f;
    cr_expect(!kvp_gguf_get_str(&g, "general.architecture", s, sizeof s) && !strcmp(s, "llama"));
    cr_expect(!kvp_gguf_get_u32(&g, "a.u32", &u) && u == 4000000000u);
    cr_expect(!kvp_gguf_get_f32(&g, "a.f32", &f) && f == 0.125f);
    cr_expect(!kvp_gguf_get_str(&g, "a.empty", s, 1) && s[0] == 0);

    const kvp_gguf_kv *kv = kvp_gguf_find(&g, "a.strs");
    kvp_gguf_str out[4];
    cr_assert(kv && kvp_gguf_str_array(kv, out, 4) == 0);
    for (int i = 0; i < 4; i++)
        cr_expect(out[i].len == strlen(strs[i]) && !memcmp(out[i].ptr, strs[i], out[i].len),
                  "string %d", i);
    kv = kvp_gguf_find(&g, "a.floats");
    cr_assert(kv && kv->val.arr.type == KVP_GGUF_FLOAT32 && kv->val.arr.n == 3);
    cr_expect(memcmp(kv->val.arr.data, fv, sizeof fv) == 0);
    kv = kvp_gguf_find(&g, "a.ints");
    cr_assert(kv && kv->val.arr.type == KVP_GGUF_INT32 && kv->val.arr.n == 5);
    cr_expect(memcmp(kv->val.arr.data, iv, sizeof iv) == 0);
    kv = kvp_gguf_find(&g, "a.none");
    cr_assert(kv && kv->val.arr.n == 0);

    static const char *names[] = {"t.a", "t.b", "t.c", "t.d"};
    static const uint64_t bytes[] = {12, 70, 12 * 34, 480};
    for (int i = 0; i < 4; i++) {
        const kvp_gguf_tensor *t = kvp_gguf_find_tensor(&g, names[i]);
        cr_assert(t, "%s", names[i]);
        cr_expect_eq(t->n_dims, (uint32_t)i + 1);
        cr_expect_eq(t->n_bytes, bytes[i]);
        cr_expect_eq(t->offset % 32, 0);
        cr_expect_eq(((const uint8_t *)t->data - buf) % 32, 0);
        uint8_t *want = malloc(bytes[i]);
        fill_pattern(NULL, (uint64_t)i, want, bytes[i]);
        cr_expect(memcmp(t->data, want, bytes[i]) == 0, "%s data", names[i]);
        free(want);
    }
    const kvp_gguf_tensor *d = kvp_gguf_find_tensor(&g, "t.d");
    cr_expect(d->ne[0] == 2 && d->ne[1] == 3 && d->ne[2] == 4 && d->ne[3] == 5);
    cr_expect_eq(d->n_elements, 120);
    /* the file ends after the last tensor's padding, which is zeros */
    cr_expect_eq(len % 32, 0);
    for (size_t i = (size_t)((const uint8_t *)d->data - buf + 480); i < len; i++)
        cr_expect_eq(buf[i], 0);
    kvp_gguf_close(&g);
    free(buf);

    /* the same writer can write again, here with zeros for the data */
    buf = write_mem(w, NULL, &len);
    cr_assert_eq(kvp_gguf_parse(&g, buf, len, err, sizeof err), 0, "%s", err);
    const kvp_gguf_tensor *a = kvp_gguf_find_tensor(&g, "t.a");
    cr_expect(a && !memcmp(a->data, "\0\0\0\0\0\0\0\0\0\0\0\0", 12));
    kvp_gguf_close(&g);
    free(buf);

    /* a failing fill callback stops the write with a message */
    FILE *nul = fopen("/dev/null", "wb");
    cr_assert(nul);
    int rc = kvp_gguf_writer_write(w, nul, fill_fail, NULL, err, sizeof err);
    cr_expect_eq(rc, -EIO);
    cr_expect(strstr(err, "t.b"), "%s", err);
    fclose(nul);
    kvp_gguf_writer_free(w);
}

Test(gguf, writer_rejects_bad_input)
{
    const uint64_t ok[2] = {32, 2}, zero[2] = {4, 0}, partial[1] = {33};
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert(w);
    cr_expect_eq(kvp_gguf_writer_add_tensor(w, "t", KVP_GGML_F32, 0, ok), -EINVAL);
    cr_expect_eq(kvp_gguf_writer_add_tensor(w, "t", KVP_GGML_F32, 5, ok), -EINVAL);
    cr_expect_eq(kvp_gguf_writer_add_tensor(w, "t", KVP_GGML_F32, 2, zero), -EINVAL);
    cr_expect_eq(kvp_gguf_writer_add_tensor(w, "t", KVP_GGML_Q8_0, 1, partial), -EINVAL);
    cr_expect_eq(kvp_gguf_writer_add_tensor(w, "t", 20, 2, ok), -EINVAL);             /* IQ4_NL */
    cr_expect_eq(kvp_gguf_writer_add_tensor(w, "t", KVP_GGML_Q4_K, 2, ok), -EINVAL);  /* 32 < 256 */
    cr_expect_eq(kvp_gguf_writer_add_tensor(w, "t", KVP_GGML_F32, 2, ok), 0);
    cr_expect_eq(kvp_gguf_writer_add_tensor(w, "t", KVP_GGML_F32, 2, ok), -EEXIST);
    cr_expect_eq(kvp_gguf_writer_add_u32(w, "k", 1), 0);
    cr_expect_eq(kvp_gguf_writer_add_str(w, "k", "v"), -EEXIST);
    cr_expect_eq(kvp_gguf_writer_add_u32(w, "", 1), -EINVAL);
    /* any failed add makes write refuse, so a half-described file is never written */
    char err[256];
    FILE *nul = fopen("/dev/null", "wb");
    cr_assert(nul);
    cr_expect_eq(kvp_gguf_writer_write(w, nul, NULL, NULL, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "earlier add failed"), "%s", err);
    fclose(nul);
    kvp_gguf_writer_free(w);
}

Test(gguf, empty_file_round_trip)
{
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    size_t len;
    uint8_t *buf = write_mem(w, NULL, &len);
    kvp_gguf_writer_free(w);
    cr_expect_eq(len, 32); /* 24-byte header padded to the alignment */
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_parse(&g, buf, 24, err, sizeof err), 0, "%s", err);
    cr_expect(g.n_kv == 0 && g.n_tensors == 0);
    cr_expect_null(kvp_gguf_find(&g, "x"));
    kvp_gguf_close(&g);
    free(buf);
}

/* ---------------------------------------------------------------- bad input */

/* Truncations at every offset of [from, to) with the given stride. */
static void truncations(const uint8_t *buf, size_t from, size_t to, size_t stride)
{
    for (size_t n = from; n < to; n += stride)
        expect_bad(buf, n, NULL);
}

Test(gguf, truncated_stories260K, .timeout = 300)
{
    size_t len;
    uint8_t *buf = load("models/stories260K.gguf", &len);
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_parse(&g, buf, len, err, sizeof err), 0, "%s", err);
    size_t data = (size_t)((const uint8_t *)g.tensors[0].data - buf);
    kvp_gguf_close(&g);
    truncations(buf, 0, data + 1, 1);           /* header, kvs, tensor table, padding */
    truncations(buf, data + 1, len, 4099);      /* through the data */
    truncations(buf, len - 64, len, 1);         /* the end of the last tensor */
    free(buf);
}

Test(gguf, truncated_llama2_tiny, .timeout = 300)
{
    size_t len;
    uint8_t *buf = load("models/llama-2-tiny-random.gguf", &len);
    size_t table = after_str(buf, len, "token_embd.weight") - strlen("token_embd.weight") - 8;
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_parse(&g, buf, len, err, sizeof err), 0, "%s", err);
    size_t data = (size_t)((const uint8_t *)g.tensors[0].data - buf);
    kvp_gguf_close(&g);
    truncations(buf, 0, 8192, 1);               /* header and the first vocab strings */
    truncations(buf, 8192, table - 2048, 97);   /* through the 32000-entry arrays */
    truncations(buf, table - 2048, data + 1, 1);/* last kvs, tensor table, padding */
    truncations(buf, data + 1, len, 4099);
    free(buf);
}

Test(gguf, bad_magic_and_version)
{
    size_t len;
    uint8_t *buf = load("models/stories260K.gguf", &len);
    expect_bad((const uint8_t *)"", 0, "magic");
    buf[0] = 'g';
    expect_bad(buf, len, "magic");
    buf[0] = 'G';
    wr32(buf + 4, 1);
    cr_expect_eq(expect_bad(buf, len, "version 1"), -ENOTSUP);
    wr32(buf + 4, 4);
    cr_expect_eq(expect_bad(buf, len, "version 4"), -ENOTSUP);
    wr32(buf + 4, 0x03000000);
    expect_bad(buf, len, "big-endian");
    /* version 2 has the same layout: still parses */
    wr32(buf + 4, 2);
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_parse(&g, buf, len, err, sizeof err), 0, "%s", err);
    cr_expect_eq(g.version, 2);
    kvp_gguf_close(&g);
    free(buf);
}

Test(gguf, absurd_counts)
{
    size_t len;
    uint8_t *buf = load("models/stories260K.gguf", &len);
    uint8_t save[16];
    memcpy(save, buf + 8, 16);
    static const uint64_t counts[] = {UINT64_MAX, 1ull << 60, 1ull << 32, 100000};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        wr64(buf + 8, counts[i]); /* tensors */
        cr_expect_eq(expect_bad(buf, len, "cannot fit"), -EINVAL);
        memcpy(buf + 8, save, 16);
        wr64(buf + 16, counts[i]); /* kvs */
        cr_expect_eq(expect_bad(buf, len, "cannot fit"), -EINVAL);
        memcpy(buf + 8, save, 16);
    }
    /* plausible by size, but more entries than are really there */
    wr64(buf + 16, 20);
    expect_bad(buf, len, NULL);
    memcpy(buf + 8, save, 16);
    wr64(buf + 8, 49);
    expect_bad(buf, len, NULL);
    /* a huge string-array count */
    size_t arr = after_str(buf, len, "tokenizer.ggml.tokens");
    wr64(buf + arr + 8, 1ull << 62);
    expect_bad(buf, len, "cannot fit");
    free(buf);
}

Test(gguf, string_past_end)
{
    size_t len;
    uint8_t *buf = load("models/stories260K.gguf", &len);
    uint8_t save[8];
    /* the first key's length */
    memcpy(save, buf + 24, 8);
    wr64(buf + 24, len);
    expect_bad(buf, len, "past the end");
    wr64(buf + 24, UINT64_MAX);
    expect_bad(buf, len, "past the end");
    memcpy(buf + 24, save, 8);
    /* a string inside the tokens array */
    size_t arr = after_str(buf, len, "tokenizer.ggml.tokens") + 4 + 4 + 8;
    wr64(buf + arr, UINT64_MAX - 4);
    expect_bad(buf, len, "past the end");
    free(buf);
    /* a string value: general.architecture = "llama" */
    buf = small_file(&len);
    size_t v = after_str(buf, len, "general.architecture") + 4;
    wr64(buf + v, 1ull << 40);
    expect_bad(buf, len, "string value");
    free(buf);
}

Test(gguf, bad_dimensions)
{
    size_t len;
    uint8_t *buf = load("models/stories260K.gguf", &len);
    tinfo t = find_tinfo(buf, len, "output_norm.weight");
    wr32(buf + t.n_dims, 5);
    expect_bad(buf, len, "5 dimensions");
    wr32(buf + t.n_dims, 0);
    expect_bad(buf, len, "0 dimensions");
    wr32(buf + t.n_dims, UINT32_MAX);
    expect_bad(buf, len, "dimensions");
    wr32(buf + t.n_dims, 1);
    wr64(buf + t.ne, 0);
    expect_bad(buf, len, "must be positive");
    free(buf);

    buf = small_file(&len);
    t = find_tinfo(buf, len, "t.f32");
    wr64(buf + t.ne, 1ull << 32);
    wr64(buf + t.ne + 8, 1ull << 32);
    expect_bad(buf, len, "overflows");
    wr64(buf + t.ne, UINT64_MAX);
    wr64(buf + t.ne + 8, 1);
    expect_bad(buf, len, "overflows");
    /* fits ggml's int64 but not 4 bytes per element */
    wr64(buf + t.ne, 1ull << 62);
    expect_bad(buf, len, "too large");
    /* a large but representable tensor: its data is past the end */
    wr64(buf + t.ne, 1ull << 40);
    expect_bad(buf, len, "past the end");
    free(buf);

    buf = small_file(&len);
    t = find_tinfo(buf, len, "t.q80");
    wr64(buf + t.ne, 48);
    expect_bad(buf, len, "multiple of 32");
    free(buf);
}

Test(gguf, bad_offsets)
{
    size_t len;
    uint8_t *buf = load("models/stories260K.gguf", &len);
    tinfo t = find_tinfo(buf, len, "blk.4.ffn_norm.weight");
    uint64_t off = rd64(buf + t.offset);
    wr64(buf + t.offset, off + 4);
    expect_bad(buf, len, "not a multiple of the alignment 32");
    wr64(buf + t.offset, off + 32); /* the last tensor: 32 bytes too far */
    expect_bad(buf, len, "past the end");
    wr64(buf + t.offset, (uint64_t)len);
    expect_bad(buf, len, "past the end");
    wr64(buf + t.offset, UINT64_MAX & ~31ull); /* offset + size overflows */
    expect_bad(buf, len, "past the end");
    wr64(buf + t.offset, off);
    /* overlapping an earlier tensor is fine for reading: it stays inside the file */
    wr64(buf + t.offset, 0);
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_parse(&g, buf, len, err, sizeof err), 0, "%s", err);
    kvp_gguf_close(&g);
    free(buf);
}

Test(gguf, unsupported_tensor_type)
{
    size_t len;
    uint8_t *buf = load("models/stories260K.gguf", &len);
    tinfo t = find_tinfo(buf, len, "blk.0.attn_q.weight");
    wr32(buf + t.type, 20);
    cr_expect_eq(expect_bad(buf, len,
                            "tensor 'blk.0.attn_q.weight' has unsupported type IQ4_NL (20)"),
                 -ENOTSUP);
    wr32(buf + t.type, 9);
    expect_bad(buf, len, "Q8_1 (9)");
    wr32(buf + t.type, 15);
    expect_bad(buf, len, "Q8_K (15)");
    /* a supported type whose rows do not hold whole blocks (stories260K: rows of 64) */
    wr32(buf + t.type, KVP_GGML_Q4_K);
    cr_expect_eq(expect_bad(buf, len, "Q4_K tensor 'blk.0.attn_q.weight' has rows of 64 "
                            "elements, not a multiple of 256"), -EINVAL);
    wr32(buf + t.type, 999);
    expect_bad(buf, len, "unknown type 999");
    free(buf);
}

Test(gguf, bad_kv_types)
{
    size_t len;
    uint8_t *buf = small_file(&len);
    size_t k = after_str(buf, len, "t.ints");
    wr32(buf + k + 4, KVP_GGUF_ARRAY); /* element type: array of arrays */
    expect_bad(buf, len, "nested array");
    wr32(buf + k + 4, 77);
    expect_bad(buf, len, "unknown element type 77");
    wr32(buf + k + 4, KVP_GGUF_INT32);
    wr64(buf + k + 8, 1ull << 61);
    expect_bad(buf, len, "past the end");
    wr64(buf + k + 8, 3);
    wr32(buf + k, 13); /* kv type */
    expect_bad(buf, len, "unknown value type 13");
    wr32(buf + k, UINT32_MAX);
    expect_bad(buf, len, "unknown value type");
    free(buf);
}

Test(gguf, duplicates)
{
    size_t len;
    uint8_t *buf = load("models/stories260K.gguf", &len);
    size_t k = after_str(buf, len, "blk.3.attn_k.weight");
    buf[k - 8] = 'q'; /* blk.3.attn_q.weight twice */
    expect_bad(buf, len, "duplicate tensor name 'blk.3.attn_q.weight'");
    free(buf);
    buf = small_file(&len);
    k = after_str(buf, len, "t.bbb");
    memcpy(buf + k - 3, "aaa", 3);
    expect_bad(buf, len, "duplicate key 't.aaa'");
    free(buf);
}

Test(gguf, alignment_key)
{
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert_eq(kvp_gguf_writer_add_u32(w, "general.alignment", 32), 0);
    const uint64_t ne[1] = {3};
    cr_assert_eq(kvp_gguf_writer_add_tensor(w, "t", KVP_GGML_F32, 1, ne), 0);
    size_t len;
    uint8_t *buf = write_mem(w, fill_pattern, &len);
    kvp_gguf_writer_free(w);
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_parse(&g, buf, len, err, sizeof err), 0, "%s", err);
    cr_expect_eq(g.alignment, 32);
    kvp_gguf_close(&g);
    size_t v = after_str(buf, len, "general.alignment") + 4;
    static const uint32_t bad[] = {0, 3, 48, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        wr32(buf + v, bad[i]);
        expect_bad(buf, len, "power of two");
    }
    /* a large alignment puts the data section past the end */
    wr32(buf + v, 1u << 31);
    expect_bad(buf, len, "past the end");
    wr32(buf + v, 32);
    wr32(buf + v - 4, KVP_GGUF_FLOAT32);
    expect_bad(buf, len, "power of two");
    free(buf);
}

Test(gguf, names_in_messages_are_sanitized)
{
    size_t len;
    uint8_t *buf = small_file(&len);
    tinfo t = find_tinfo(buf, len, "t.f16");
    buf[t.n_dims - 4] = '\n';
    wr32(buf + t.type, 20);
    expect_bad(buf, len, "tensor 't?f16' has unsupported type IQ4_NL (20)");
    free(buf);
}

/* Random byte corruption of the header, kv and tensor-table region of a real file:
 * every result is either a clean parse or an error with a message, never a crash. */
Test(gguf, random_corruption, .timeout = 300)
{
    size_t len;
    uint8_t *orig = load("models/stories260K.gguf", &len);
    uint8_t *buf = malloc(len);
    size_t table_end = after_str(orig, len, "blk.4.ffn_norm.weight") + 4 + 8 + 4 + 8;
    uint64_t s = 42;
    int ok = 0, bad = 0;
    for (int it = 0; it < 4000; it++) {
        memcpy(buf, orig, table_end);
        if (it == 0)
            memcpy(buf + table_end, orig + table_end, len - table_end);
        int flips = 1 + it % 4;
        for (int f = 0; f < flips; f++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            size_t at = (size_t)(s % table_end);
            /* high bytes of lengths and counts are the interesting ones */
            buf[at] = (uint8_t)((s >> 32) & 1 ? s >> 40 : 0xff);
        }
        kvp_gguf g;
        char err[256] = "";
        if (kvp_gguf_parse(&g, buf, len, err, sizeof err) == 0) {
            ok++;
            for (uint64_t i = 0; i < g.n_tensors; i++) {
                const uint8_t *d = g.tensors[i].data;
                if (d < buf || d + g.tensors[i].n_bytes > buf + len)
                    cr_assert_fail("tensor %llu outside the buffer", (unsigned long long)i);
            }
            kvp_gguf_close(&g);
        } else {
            bad++;
            if (!err[0])
                cr_assert_fail("iteration %d: error without a message", it);
        }
    }
    cr_expect_gt(bad, 0);
    cr_log_info("random corruption: %d parsed, %d rejected", ok, bad);
    free(buf);
    free(orig);
}

/* ------------------------------------------------------------- kvp synth */

static char *synth(const char *args, int *status)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvp-synth-test-%d.gguf", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s synth --out %s %s 2>&1", tu_build("tools/kvp"), path, args);
    char *out;
    *status = tu_run(cmd, &out);
    free(out);
    return path;
}

Test(gguf, synth_tiny_model)
{
    int st;
    const char *p = synth("--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 "
                          "--vocab 300 --ctx 128 --type f16 --seed 7", &st);
    cr_assert_eq(st, 0);
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_open(&g, p, err, sizeof err), 0, "%s", err);
    cr_expect_eq(g.n_tensors, 3 + 9 * 2);
    char s[64];
    cr_expect(!kvp_gguf_get_str(&g, "general.architecture", s, sizeof s) && !strcmp(s, "llama"));
    cr_expect(!kvp_gguf_get_str(&g, "tokenizer.ggml.model", s, sizeof s) && !strcmp(s, "llama"));
    cr_expect_eq(kvp_gguf_get_str(&g, "general.name", s, sizeof s), 0);
    static const struct { const char *key; uint32_t v; } u[] = {
        {"llama.context_length", 128}, {"llama.embedding_length", 64},
        {"llama.block_count", 2}, {"llama.feed_forward_length", 96},
        {"llama.attention.head_count", 4}, {"llama.attention.head_count_kv", 2},
        {"llama.rope.dimension_count", 16}, {"tokenizer.ggml.bos_token_id", 1},
        {"tokenizer.ggml.eos_token_id", 2}, {"general.file_type", 1},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        uint32_t v = 0;
        cr_expect_eq(kvp_gguf_get_u32(&g, u[i].key, &v), 0, "%s", u[i].key);
        cr_expect_eq(v, u[i].v, "%s = %u", u[i].key, v);
    }
    float f;
    cr_expect(!kvp_gguf_get_f32(&g, "llama.rope.freq_base", &f) && f == 10000.0f);
    cr_expect(!kvp_gguf_get_f32(&g, "llama.attention.layer_norm_rms_epsilon", &f) &&
              f == 1e-5f);

    const kvp_gguf_kv *toks = kvp_gguf_find(&g, "tokenizer.ggml.tokens");
    cr_assert(toks && toks->val.arr.n == 300);
    kvp_gguf_str t[300];
    cr_assert_eq(kvp_gguf_str_array(toks, t, 300), 0);
    cr_expect(t[0].len == 5 && !memcmp(t[0].ptr, "<unk>", 5));
    cr_expect(t[1].len == 3 && !memcmp(t[1].ptr, "<s>", 3));
    cr_expect(t[2].len == 4 && !memcmp(t[2].ptr, "</s>", 4));
    cr_expect(t[3].len == 6 && !memcmp(t[3].ptr, "<0x00>", 6));
    cr_expect(t[258].len == 6 && !memcmp(t[258].ptr, "<0xFF>", 6));
    const kvp_gguf_kv *tt = kvp_gguf_find(&g, "tokenizer.ggml.token_type");
    cr_assert(tt && tt->val.arr.type == KVP_GGUF_INT32 && tt->val.arr.n == 300);
    int32_t types[300];
    memcpy(types, tt->val.arr.data, sizeof types);
    cr_expect(types[0] == 2 && types[1] == 3 && types[2] == 3 && types[3] == 6 &&
              types[258] == 6 && types[259] == 1 && types[299] == 1);
    const kvp_gguf_kv *sc = kvp_gguf_find(&g, "tokenizer.ggml.scores");
    cr_assert(sc && sc->val.arr.type == KVP_GGUF_FLOAT32 && sc->val.arr.n == 300);

    static const struct { const char *name; uint64_t ne0, ne1; uint32_t type; } want[] = {
        {"token_embd.weight", 64, 300, KVP_GGML_F16}, {"output_norm.weight", 64, 1, KVP_GGML_F32},
        {"output.weight", 64, 300, KVP_GGML_F16}, {"blk.1.attn_norm.weight", 64, 1, KVP_GGML_F32},
        {"blk.1.attn_q.weight", 64, 64, KVP_GGML_F16},
        {"blk.1.attn_k.weight", 64, 32, KVP_GGML_F16},
        {"blk.1.attn_v.weight", 64, 32, KVP_GGML_F16},
        {"blk.1.attn_output.weight", 64, 64, KVP_GGML_F16},
        {"blk.0.ffn_norm.weight", 64, 1, KVP_GGML_F32},
        {"blk.0.ffn_gate.weight", 64, 96, KVP_GGML_F16},
        {"blk.0.ffn_down.weight", 96, 64, KVP_GGML_F16},
        {"blk.0.ffn_up.weight", 64, 96, KVP_GGML_F16},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kvp_gguf_tensor *x = kvp_gguf_find_tensor(&g, want[i].name);
        cr_assert(x, "%s", want[i].name);
        cr_expect(x->ne[0] == want[i].ne0 && x->ne[1] == want[i].ne1 && x->type == want[i].type,
                  "%s: [%llu, %llu] %s", want[i].name, (unsigned long long)x->ne[0],
                  (unsigned long long)x->ne[1], kvp_type_name(x->type));
        float *v = malloc(x->n_elements * sizeof *v);
        cr_assert_eq(kvp_dequantize(x->type, x->data, v, x->n_elements), 0);
        float bound = 1.0f / sqrtf((float)x->ne[0]) * 1.001f;
        double sum = 0;
        for (uint64_t j = 0; j < x->n_elements; j++) {
            if (x->ne[1] == 1 ? v[j] != 1.0f : !(fabsf(v[j]) <= bound))
                cr_assert_fail("%s[%llu] = %g", want[i].name, (unsigned long long)j,
                               (double)v[j]);
            sum += fabs(v[j]);
        }
        if (x->ne[1] > 1) /* uniform: mean |w| is about half the bound */
            cr_expect(sum / x->n_elements > 0.4 * bound, "%s mean |w| %g", want[i].name,
                      sum / x->n_elements);
        free(v);
    }
    kvp_gguf_close(&g);

    /* deterministic for a seed, different for another seed */
    size_t l1, l2, l3;
    char *a = tu_slurp(p, &l1);
    synth("--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --ctx 128 "
          "--type f16 --seed 7", &st);
    cr_assert_eq(st, 0);
    char *b = tu_slurp(p, &l2);
    synth("--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --ctx 128 "
          "--type f16 --seed 8", &st);
    cr_assert_eq(st, 0);
    char *c = tu_slurp(p, &l3);
    cr_expect(l1 == l2 && !memcmp(a, b, l1));
    cr_expect(l1 == l3 && memcmp(a, c, l1));
    free(a);
    free(b);
    free(c);
    remove(p);
}

Test(gguf, synth_types)
{
    static const struct { const char *type; uint32_t t, file_type; } types[] = {
        {"f32", KVP_GGML_F32, 0}, {"q8_0", KVP_GGML_Q8_0, 7},
    };
    for (size_t i = 0; i < 2; i++) {
        char args[256];
        snprintf(args, sizeof args, "--dim 64 --hidden 128 --layers 1 --heads 2 --vocab 260 "
                 "--type %s", types[i].type);
        int st;
        const char *p = synth(args, &st);
        cr_assert_eq(st, 0, "%s", types[i].type);
        kvp_gguf g;
        char err[256];
        cr_assert_eq(kvp_gguf_open(&g, p, err, sizeof err), 0, "%s", err);
        const kvp_gguf_tensor *x = kvp_gguf_find_tensor(&g, "blk.0.ffn_down.weight");
        cr_assert(x && x->type == types[i].t && x->ne[0] == 128 && x->ne[1] == 64);
        uint32_t v;
        cr_expect(!kvp_gguf_get_u32(&g, "general.file_type", &v) && v == types[i].file_type);
        cr_expect(!kvp_gguf_get_u32(&g, "llama.attention.head_count_kv", &v) && v == 2);
        cr_expect(!kvp_gguf_get_u32(&g, "llama.context_length", &v) && v == 2048);
        kvp_gguf_close(&g);
        remove(p);
    }
}

Test(gguf, synth_bad_arguments)
{
    static const char *bad[] = {
        "--dim", "--dim abc", "--dim 0", "--dim -64", "--dim 64x", "--dim 99999999999",
        "--dim 66 --heads 4", "--heads 5 --kv-heads 2", "--kv-heads 13", "--vocab 10",
        "--type q4_k_s", "--type q3_K", "--type iq4_nl", "--layers 0", "--ctx 0", "--hidden 0", "--bogus 1",
        "--dim 48 --heads 2 --type q8_0", "--dim 6 --heads 2",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st;
        char args[256];
        snprintf(args, sizeof args, "--layers 1 --vocab 300 --dim 64 --hidden 64 --heads 4 %s",
                 bad[i]);
        synth(args, &st);
        cr_expect_eq(st, 2, "'%s' exited %d", bad[i], st);
    }
    char *out;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s synth --dim 64 2>&1", tu_build("tools/kvp"));
    cr_expect_eq(tu_run(cmd, &out), 2);
    cr_expect(strstr(out, "--out"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s synth --dim 6x4 --out /tmp/x.gguf 2>&1", tu_build("tools/kvp"));
    cr_expect_eq(tu_run(cmd, &out), 2);
    cr_expect(strstr(out, "6x4"), "%s", out);
    free(out);
}

/* ------------------------------------------------- model metadata and tensors */

/* A tiny model of any architecture, valid by default; each corruption test changes one
 * field. Integer fields < 0 and NULL strings mean "absent". */
typedef struct mspec {
    const char *arch;
    long dim, hidden, layers, heads, kv_heads, key_length, value_length, rope_dims;
    long vocab_meta, q_rows;       /* ARCH.vocab_size; rows of attn_q (default heads x hd) */
    const char *eps_str;           /* the epsilon written as a string: a wrong type */
    float eps, base;
    long rope_freqs;               /* length of rope_freqs.weight (0: none) */
    float rope_freq_value;
    long bias;                     /* 1: attn_{q,k,v}.bias */
    long bias_k_len;               /* length of attn_k.bias (default kv dim) */
    long qk_norm;                  /* length of attn_{q,k}_norm.weight (0: none) */
    long k_norm_len;
    long output_rows;              /* rows of output.weight (0: tied) */
    const char *skip;              /* a tensor left out */
    long eos, eot;                 /* tokenizer.ggml.{eos,eot}_token_id */
} mspec;

#define MS_VOCAB 8

static mspec mspec_of(const char *arch)
{
    mspec s = {.arch = arch, .dim = 32, .hidden = 48, .layers = 2, .heads = 4, .kv_heads = 2,
               .key_length = -1, .value_length = -1, .rope_dims = -1, .vocab_meta = MS_VOCAB,
               .q_rows = -1, .eps = 1e-6f, .base = 10000.0f, .rope_freq_value = 1.0f,
               .bias_k_len = -1, .k_norm_len = -1, .output_rows = MS_VOCAB, .eos = 2, .eot = 7};
    if (!strcmp(arch, "qwen2")) {
        s.bias = 1;
        s.output_rows = 0;
    } else if (!strcmp(arch, "qwen3")) {
        s.key_length = 16;   /* 4 heads x 16 != dim 32 */
        s.qk_norm = 16;
        s.output_rows = 0;
    } else {
        s.rope_freqs = 4;    /* llama 3.1 style: head 8 -> 4 pairs */
    }
    return s;
}

typedef struct { float freq; uint64_t n_freq_tensor; } mfill_ctx;
static mfill_ctx g_mfill;

static int mfill(void *ctx, uint64_t i, void *buf, uint64_t n)
{
    (void)ctx;
    float *f = buf;
    for (uint64_t j = 0; j < n / 4; j++)
        f[j] = i == g_mfill.n_freq_tensor ? g_mfill.freq : 0.01f * (float)((j * 7 + i) % 13);
    return 0;
}

/* Writes the model to a temp file and loads it; returns the load code, message in err. */
static int load_spec(const mspec *s, char *err, size_t errlen)
{
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert(w);
    char k[96];
    const char *a = s->arch;
    kvp_gguf_writer_add_str(w, "general.architecture", a);
#define U(suffix, v) if ((v) >= 0) { snprintf(k, sizeof k, "%s." suffix, a); \
                                     kvp_gguf_writer_add_u32(w, k, (uint32_t)(v)); }
    U("embedding_length", s->dim)
    U("feed_forward_length", s->hidden)
    U("block_count", s->layers)
    U("attention.head_count", s->heads)
    U("attention.head_count_kv", s->kv_heads)
    U("attention.key_length", s->key_length)
    U("attention.value_length", s->value_length)
    U("rope.dimension_count", s->rope_dims)
    U("vocab_size", s->vocab_meta)
#undef U
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", a);
    if (s->eps_str)
        kvp_gguf_writer_add_str(w, k, s->eps_str);
    else
        kvp_gguf_writer_add_f32(w, k, s->eps);
    snprintf(k, sizeof k, "%s.rope.freq_base", a);
    kvp_gguf_writer_add_f32(w, k, s->base);
    static const char *const toks[MS_VOCAB] = {"<unk>", "<s>", "</s>", "a", "b", "c", "d", "e"};
    kvp_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
    kvp_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", toks, MS_VOCAB);
    if (s->eos >= 0)
        kvp_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)s->eos);
    if (s->eot >= 0)
        kvp_gguf_writer_add_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)s->eot);

    uint64_t d = (uint64_t)s->dim, hid = s->hidden > 0 ? (uint64_t)s->hidden : 48;
    /* tensors for hostile metadata stay small: the loader must refuse before reading them */
    uint64_t heads = s->heads > 0 ? (uint64_t)s->heads : 1;
    uint64_t hd = s->key_length > 0 && s->key_length <= 64 ? (uint64_t)s->key_length : d / heads;
    uint64_t qd = s->q_rows > 0 ? (uint64_t)s->q_rows : hd * heads;
    uint64_t kvd = hd * (uint64_t)(s->kv_heads > 0 ? s->kv_heads : 1);
    g_mfill = (mfill_ctx){s->rope_freq_value, UINT64_MAX};
    uint64_t n_t = 0;
#define T(name, e0, e1) do { if (!s->skip || strcmp(s->skip, name)) { \
        uint64_t ne[2] = {(e0), (e1)};                                    \
        cr_assert_eq(kvp_gguf_writer_add_tensor(w, name, KVP_GGML_F32, ne[1] > 1 ? 2 : 1, ne), 0); \
        n_t++; } } while (0)
    T("token_embd.weight", d, MS_VOCAB);
    T("output_norm.weight", d, 1);
    if (s->output_rows)
        T("output.weight", d, (uint64_t)s->output_rows);
    if (s->rope_freqs) {
        g_mfill.n_freq_tensor = n_t;
        T("rope_freqs.weight", (uint64_t)s->rope_freqs, 1);
    }
    for (long l = 0; l < s->layers; l++) {
        char n[64];
#define B(suffix, e0, e1) do { snprintf(n, sizeof n, "blk.%ld." suffix, l); T(n, e0, e1); } while (0)
        B("attn_norm.weight", d, 1);
        B("attn_q.weight", d, qd);
        B("attn_k.weight", d, kvd);
        B("attn_v.weight", d, kvd);
        B("attn_output.weight", qd, d);
        B("ffn_norm.weight", d, 1);
        B("ffn_gate.weight", d, hid);
        B("ffn_down.weight", hid, d);
        B("ffn_up.weight", d, hid);
        if (s->bias) {
            B("attn_q.bias", qd, 1);
            B("attn_k.bias", s->bias_k_len > 0 ? (uint64_t)s->bias_k_len : kvd, 1);
            B("attn_v.bias", kvd, 1);
        }
        if (s->qk_norm) {
            B("attn_q_norm.weight", (uint64_t)s->qk_norm, 1);
            B("attn_k_norm.weight", s->k_norm_len > 0 ? (uint64_t)s->k_norm_len : (uint64_t)s->qk_norm, 1);
        }
#undef B
    }
#undef T
    size_t len;
    uint8_t *buf = write_mem(w, mfill, &len);
    kvp_gguf_writer_free(w);
    const char *p = tu_write_tmp(buf, len);
    free(buf);
    kvp_model m;
    err[0] = 0;
    int rc = kvp_model_load(&m, p, NULL, err, errlen);
    if (!rc) {
        /* a loaded model runs */
        kvp_runstate st;
        kvp_cache c;
        int toks2[3] = {1, 5, 6};
        cr_assert_eq(kvp_runstate_init(&st, &m.cfg, 3), 0);
        cr_assert_eq(kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim, &m.cfg.rope), 0);
        cr_assert_eq(kvp_forward(&m, &st, &c, toks2, 3, NULL), 0);
        for (int i = 0; i < MS_VOCAB; i++)
            cr_assert(isfinite(st.logits[i]), "%s: logit %d = %g", a, i, st.logits[i]);
        cr_expect_eq(m.tok.eos_id, s->eos >= 0 ? s->eos : 2, "EOS from the metadata");
        cr_expect_eq(m.tok.eot_id, s->eot, "end of turn from the metadata");
        kvp_cache_free(&c);
        kvp_runstate_free(&st);
        kvp_model_free(&m);
    }
    remove(p);
    return rc;
}

static void expect_refused(const mspec *s, const char *want, const char *what)
{
    char err[512];
    int rc = load_spec(s, err, sizeof err);
    cr_expect_lt(rc, 0, "%s (%s) loaded", what, s->arch);
    cr_expect(strstr(err, want), "%s (%s): message '%s' lacks '%s'", what, s->arch, err, want);
}

Test(gguf, model_architectures_load)
{
    static const char *const archs[] = {"llama", "mistral", "qwen2", "qwen3"};
    for (size_t i = 0; i < 4; i++) {
        mspec s = mspec_of(archs[i]);
        char err[512];
        cr_expect_eq(load_spec(&s, err, sizeof err), 0, "%s: %s", archs[i], err);
    }
    /* partial rotary and absent optional keys load too */
    mspec s = mspec_of("qwen3");
    s.rope_dims = 8;
    s.vocab_meta = -1;
    s.value_length = 16;
    s.eot = -1;
    s.eos = 5;
    char err[512];
    cr_expect_eq(load_spec(&s, err, sizeof err), 0, "%s", err);
    s = mspec_of("qwen2");
    s.eot = MS_VOCAB;
    expect_refused(&s, "tokenizer.ggml.eot_token_id 8 is outside the vocabulary", "EOT beyond the vocabulary");
    s = mspec_of("qwen2");
    s.eos = 1000;
    expect_refused(&s, "tokenizer.ggml.eos_token_id", "EOS beyond the vocabulary");
}

Test(gguf, model_bad_architecture_and_shapes)
{
    mspec s = mspec_of("gpt2");
    expect_refused(&s, "general.architecture 'gpt2'", "unknown architecture");
    static const char *const archs[] = {"llama", "qwen2", "qwen3"};
    for (size_t i = 0; i < 3; i++) {
        const char *a = archs[i];
        char key[96];
        s = mspec_of(a);
        s.kv_heads = 3;
        snprintf(key, sizeof key, "%s.attention.head_count_kv", a);
        expect_refused(&s, key, "KV heads that do not divide the heads");
        s = mspec_of(a);
        s.kv_heads = 0;
        expect_refused(&s, key, "no KV heads");
        s = mspec_of(a);
        s.heads = 0;
        snprintf(key, sizeof key, "%s.attention.head_count", a);
        expect_refused(&s, key, "no heads");
        s = mspec_of(a);
        s.dim = 34;     /* 4 heads do not divide it and there is no key_length */
        s.key_length = -1;
        s.qk_norm = s.qk_norm ? 8 : 0;
        s.rope_freqs = 0;
        expect_refused(&s, key, "heads that do not divide the width");
        s = mspec_of(a);
        s.key_length = 1 << 20;
        snprintf(key, sizeof key, "%s.attention.key_length", a);
        expect_refused(&s, key, "huge key_length");
        s = mspec_of(a);
        s.key_length = 0xFFFFFFF0l;
        expect_refused(&s, key, "key_length beyond int");
        s = mspec_of(a);
        s.value_length = 24;
        snprintf(key, sizeof key, "%s.attention.value_length", a);
        expect_refused(&s, key, "value_length != key_length");
        s = mspec_of(a);
        s.rope_dims = s.key_length > 0 ? s.key_length + 2 : 10;
        s.rope_freqs = 0;
        snprintf(key, sizeof key, "%s.rope.dimension_count", a);
        expect_refused(&s, key, "rope dims beyond the head");
        s.rope_dims = 5;
        expect_refused(&s, key, "odd rope dims");
        s = mspec_of(a);
        s.vocab_meta = MS_VOCAB + 1;
        snprintf(key, sizeof key, "%s.vocab_size", a);
        expect_refused(&s, key, "vocab_size that disagrees with token_embd");
        s = mspec_of(a);
        s.layers = 0;
        snprintf(key, sizeof key, "%s.block_count", a);
        expect_refused(&s, key, "no layers");
        s = mspec_of(a);
        s.hidden = -1;
        snprintf(key, sizeof key, "missing metadata %s.feed_forward_length", a);
        expect_refused(&s, key, "missing key");
    }
}

Test(gguf, model_hostile_floats)
{
    static const char *const archs[] = {"llama", "qwen2", "qwen3"};
    const float bad[] = {-1e-6f, 0.0f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 3; i++) {
        char key[96];
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
            mspec s = mspec_of(archs[i]);
            s.eps = bad[j];
            snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", archs[i]);
            expect_refused(&s, key, "bad epsilon");
            s = mspec_of(archs[i]);
            s.base = bad[j];
            snprintf(key, sizeof key, "%s.rope.freq_base", archs[i]);
            expect_refused(&s, key, "bad freq_base");
        }
        mspec s = mspec_of(archs[i]);
        s.eps_str = "1e-6";
        snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon has a wrong type", archs[i]);
        expect_refused(&s, key, "epsilon as a string");
    }
}

Test(gguf, model_bad_tensors)
{
    mspec s = mspec_of("llama");
    s.rope_freqs = 3;
    expect_refused(&s, "rope_freqs.weight has shape [3, 1], expected [4, 1]", "short rope_freqs");
    s.rope_freqs = 8;
    expect_refused(&s, "rope_freqs.weight", "long rope_freqs");
    const float bad[] = {0.0f, -2.0f, NAN, INFINITY};
    for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
        s = mspec_of("llama");
        s.rope_freq_value = bad[j];
        expect_refused(&s, "rope_freqs.weight[0]", "non-positive rope_freqs");
    }
    s = mspec_of("llama");
    s.output_rows = MS_VOCAB - 1;
    expect_refused(&s, "output.weight", "output rows != vocab");
    s = mspec_of("qwen2");
    s.skip = "blk.1.attn_v.bias";
    expect_refused(&s, "missing tensor blk.1.attn_v.bias", "qwen2 without a V bias");
    s = mspec_of("qwen2");
    s.bias_k_len = 24;
    expect_refused(&s, "blk.0.attn_k.bias", "K bias of the wrong length");
    s = mspec_of("llama");
    s.bias = 1;
    s.bias_k_len = 24;
    expect_refused(&s, "blk.0.attn_k.bias", "llama's optional K bias of the wrong length");
    s = mspec_of("qwen3");
    s.skip = "blk.0.attn_q_norm.weight";
    expect_refused(&s, "missing tensor blk.0.attn_q_norm.weight", "qwen3 without q norm");
    s = mspec_of("qwen3");
    s.k_norm_len = 8;
    expect_refused(&s, "blk.0.attn_k_norm.weight", "k norm of the wrong length");
    s = mspec_of("qwen3");
    s.q_rows = 32;   /* dim / heads x heads instead of key_length x heads */
    expect_refused(&s, "blk.0.attn_q.weight", "Q sized for dim / heads");
    s = mspec_of("qwen3");
    s.key_length = -1;    /* dim / heads = 8, but the tensors are sized for 16 */
    s.qk_norm = 8;
    s.q_rows = 64;
    expect_refused(&s, "blk.0.attn_q.weight", "missing key_length");
    s = mspec_of("qwen2");
    s.skip = "token_embd.weight";
    expect_refused(&s, "token_embd.weight", "no embeddings");
}

/* A synthetic model (vocabulary 300) runs 21 tokens as one block and token by token
 * through one cache: the logits agree at every position. Returns the rows layer 0's
 * first head holds at the end. */
static int expect_prefill_equals_decode(const kvp_model *m, const char *args)
{
    enum { N = 21 };
    int toks[N];
    for (int t = 0; t < N; t++)
        toks[t] = (t * 53 + 7) % 300;
    kvp_runstate s;
    kvp_cache c;
    float *all = malloc((size_t)N * 300 * sizeof *all);
    cr_assert_eq(kvp_runstate_init(&s, &m->cfg, N), 0);
    cr_assert_eq(kvp_cache_init(&c, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim,
                                &m->cfg.rope), 0);
    cr_assert_eq(kvp_forward(m, &s, &c, toks, N, all), 0);
    kvp_cache_reset(&c);
    float worst = 0.0f;
    for (int t = 0; t < N; t++) {
        cr_assert_eq(kvp_forward(m, &s, &c, &toks[t], 1, NULL), 0);
        for (int j = 0; j < 300; j++)
            worst = fmaxf(worst, fabsf(s.logits[j] - all[(size_t)t * 300 + j]));
    }
    cr_expect_leq(worst, 1e-4f, "%s: prefill and decode differ by %g", args, worst);
    int rows = kvp_cache_head(&c, 0, 0)->n;
    free(all);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    return rows;
}

/* kvp synth --arch: each family's tensors and keys, loaded as that family, and its
 * batched prefill equals token-by-token decode. */
Test(gguf, synth_architectures)
{
    static const struct { const char *args, *arch; int head_dim, neox, bias, qk_norm, tied; } a[] = {
        {"--arch llama", "llama", 16, 0, 0, 0, 0},
        {"--arch qwen2 --tied", "qwen2", 16, 1, 1, 0, 1},
        {"--arch qwen3 --head-dim 24 --rope-base 5e5", "qwen3", 24, 1, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 "
                 "--vocab 300 --ctx 128 --seed 3 %s", a[i].args);
        int st;
        const char *p = synth(args, &st);
        cr_assert_eq(st, 0, "%s", args);
        kvp_model m;
        char err[512];
        cr_assert_eq(kvp_model_load(&m, p, NULL, err, sizeof err), 0, "%s: %s", args, err);
        cr_expect_str_eq(m.arch, a[i].arch);
        cr_expect_eq(m.cfg.head_dim, a[i].head_dim, "%s", args);
        cr_expect_eq(m.cfg.rope.n_rot, a[i].head_dim);
        cr_expect_eq(m.cfg.rope.neox, a[i].neox, "%s", args);
        cr_expect_eq(m.cfg.rope.base, i == 2 ? 5e5f : a[i].neox ? 1e6f : 1e4f, "%s", args);
        cr_expect_eq(!!m.layers[1].bq, a[i].bias, "%s", args);
        cr_expect_eq(!!m.layers[1].bv, a[i].bias, "%s", args);
        cr_expect_eq(!!m.layers[1].k_norm, a[i].qk_norm, "%s", args);
        cr_expect_eq(m.tied_output, a[i].tied, "%s", args);
        cr_expect_eq(m.cfg.vocab_size, 300);
        expect_prefill_equals_decode(&m, args);
        kvp_model_free(&m);
        remove(p);
    }
    int st;
    static const char *bad[] = {"--arch gpt2", "--arch", "--head-dim 7", "--head-dim 0",
                                "--rope-base 0", "--rope-base nan", "--rope-base -5",
                                "--head-dim 20 --type q8_0 --dim 64 --hidden 64"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "--layers 1 --vocab 300 --dim 64 --hidden 64 --heads 4 %s",
                 bad[i]);
        synth(args, &st);
        cr_expect_eq(st, 2, "'%s' exited %d", bad[i], st);
    }
}

/* kvp synth --arch gemma2|gemma3|phi3: Gemma's post-norms and softcaps, gemma3's q/k
 * norms, phi3's fused tensors, each family's windowed layers; a window shorter than the
 * sequence and batched prefill still equal token-by-token decode. */
Test(gguf, synth_windowed_architectures)
{
    static const struct { const char *arch; int windowed[6], qk_norm, post, gelu; } a[] = {
        {"gemma2", {1, 0, 1, 0, 1, 0}, 0, 1, 1},
        {"gemma3", {1, 1, 1, 1, 1, 0}, 1, 1, 1},
        {"phi3", {1, 1, 1, 1, 1, 1}, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "--dim 64 --hidden 96 --layers 6 --heads 4 --kv-heads 2 "
                 "--vocab 300 --ctx 128 --seed 5 --window 6 --arch %s", a[i].arch);
        int st;
        const char *p = synth(args, &st);
        cr_assert_eq(st, 0, "%s", args);
        kvp_model m;
        char err[512];
        cr_assert_eq(kvp_model_load(&m, p, NULL, err, sizeof err), 0, "%s: %s", args, err);
        cr_expect_str_eq(m.arch, a[i].arch);
        for (int l = 0; l < 6; l++)
            cr_expect_eq(m.layers[l].window, a[i].windowed[l] ? 6 : 0, "%s layer %d", a[i].arch, l);
        cr_expect_eq(!!m.layers[0].k_norm, a[i].qk_norm, "%s", args);
        cr_expect_eq(!!m.layers[0].post_ffn_norm, a[i].post, "%s", args);
        cr_expect_eq(m.cfg.gelu, a[i].gelu, "%s", args);
        cr_expect_eq(m.cfg.attn_softcap, !strcmp(a[i].arch, "gemma2") ? 50.0f : 0.0f);
        cr_expect_eq(expect_prefill_equals_decode(&m, args), 5,
                     "%s: a windowed layer holds its window", args);
        kvp_model_free(&m);
        remove(p);
    }
    int st;
    synth("--layers 1 --vocab 300 --dim 64 --hidden 64 --heads 4 --arch qwen2 --window 8", &st);
    cr_expect_eq(st, 2, "a window for an architecture without one");
}
