/* Tests for model/gguf.c: the real model files and hostile input (the writer, which
 * builds the inputs, has tests/model/test_gguf_write.c).
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
    uint8_t *buf = tu_gguf_to_mem(w, tu_gguf_fill_pattern, len);
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
    uint8_t *buf = tu_gguf_to_mem(w, tu_gguf_fill_pattern, &len);
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
