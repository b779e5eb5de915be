/* Tests for model/gguf_write.c: what the writer writes is what the reader reads back,
 * every kv type copies byte for byte, and bad arguments are refused before anything is
 * written. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "tests/model/testutil.h"

static int fill_fail(void *ctx, uint64_t i, void *buf, uint64_t n)
{
    (void)ctx, (void)buf, (void)n;
    return i == 1 ? -EIO : 0;
}

Test(gguf_write, writer_round_trip)
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
    uint8_t *buf = tu_gguf_to_mem(w, tu_gguf_fill_pattern, &len);

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
        tu_gguf_fill_pattern(NULL, (uint64_t)i, want, bytes[i]);
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
    buf = tu_gguf_to_mem(w, NULL, &len);
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

Test(gguf_write, writer_rejects_bad_input)
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

Test(gguf_write, empty_file_round_trip)
{
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    size_t len;
    uint8_t *buf = tu_gguf_to_mem(w, NULL, &len);
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

/* ------------------------------------------------------------------ copy_kv */

/* A hand-encoded GGUF v3 file, independent of the writer. */
typedef struct raw { uint8_t b[1024]; size_t n; } raw;

static void raw_le(raw *r, uint64_t v, int n)
{
    cr_assert(r->n + (size_t)n <= sizeof r->b);
    for (int i = 0; i < n; i++)
        r->b[r->n++] = (uint8_t)(v >> (8 * i));
}

static void raw_str(raw *r, const char *s)
{
    size_t n = strlen(s);
    raw_le(r, n, 8);
    cr_assert(r->n + n <= sizeof r->b);
    memcpy(r->b + r->n, s, n);
    r->n += n;
}

static void raw_key(raw *r, const char *key, uint32_t type)
{
    raw_str(r, key);
    raw_le(r, type, 4);
}

static uint64_t bits64(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static uint64_t bits32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Every kv type, as scalars and as arrays, in a file with no tensors. */
static void every_type(raw *r, uint64_t *n_kv)
{
    r->n = 0;
    memcpy(r->b, "GGUF", 4);
    r->n = 4;
    raw_le(r, 3, 4);
    raw_le(r, 0, 8);                   /* tensors */
    size_t count_at = r->n;
    raw_le(r, 0, 8);                   /* kvs, patched below */
    uint64_t n = 0;
    raw_key(r, "k.u8", KVP_GGUF_UINT8), raw_le(r, 0xab, 1), n++;
    raw_key(r, "k.i8", KVP_GGUF_INT8), raw_le(r, (uint64_t)-5, 1), n++;
    raw_key(r, "k.u16", KVP_GGUF_UINT16), raw_le(r, 0xbeef, 2), n++;
    raw_key(r, "k.i16", KVP_GGUF_INT16), raw_le(r, (uint64_t)-300, 2), n++;
    raw_key(r, "k.u32", KVP_GGUF_UINT32), raw_le(r, 4000000000u, 4), n++;
    raw_key(r, "k.i32", KVP_GGUF_INT32), raw_le(r, (uint64_t)-70000, 4), n++;
    raw_key(r, "k.u64", KVP_GGUF_UINT64), raw_le(r, (1ull << 40) + 3, 8), n++;
    raw_key(r, "k.i64", KVP_GGUF_INT64), raw_le(r, (uint64_t)-(1ll << 40), 8), n++;
    raw_key(r, "k.f32", KVP_GGUF_FLOAT32), raw_le(r, bits32(0.1f), 4), n++;
    raw_key(r, "k.f64", KVP_GGUF_FLOAT64), raw_le(r, bits64(-2.5e300), 8), n++;
    raw_key(r, "k.bool", KVP_GGUF_BOOL), raw_le(r, 1, 1), n++;
    raw_key(r, "k.str", KVP_GGUF_STRING), raw_str(r, "h\xc3\xa9llo"), n++;
    raw_key(r, "k.au8", KVP_GGUF_ARRAY), raw_le(r, KVP_GGUF_UINT8, 4), raw_le(r, 3, 8);
    raw_le(r, 1, 1), raw_le(r, 2, 1), raw_le(r, 0xff, 1), n++;
    raw_key(r, "k.ai64", KVP_GGUF_ARRAY), raw_le(r, KVP_GGUF_INT64, 4), raw_le(r, 2, 8);
    raw_le(r, (uint64_t)-1, 8), raw_le(r, 1ull << 62, 8), n++;
    raw_key(r, "k.af64", KVP_GGUF_ARRAY), raw_le(r, KVP_GGUF_FLOAT64, 4), raw_le(r, 1, 8);
    raw_le(r, bits64(3.25), 8), n++;
    raw_key(r, "k.astr", KVP_GGUF_ARRAY), raw_le(r, KVP_GGUF_STRING, 4), raw_le(r, 3, 8);
    raw_str(r, ""), raw_str(r, "ab"), raw_str(r, "<s>"), n++;
    raw_key(r, "k.anone", KVP_GGUF_ARRAY), raw_le(r, KVP_GGUF_BOOL, 4), raw_le(r, 0, 8), n++;
    for (int i = 0; i < 8; i++)
        r->b[count_at + (size_t)i] = (uint8_t)(n >> (8 * i));
    while (r->n % 32)                  /* the writer pads the file to the alignment */
        raw_le(r, 0, 1);
    *n_kv = n;
}

Test(gguf_write, copy_kv_keeps_every_type_byte_for_byte)
{
    raw r;
    uint64_t n_kv;
    every_type(&r, &n_kv);
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_parse(&g, r.b, r.n, err, sizeof err), 0, "%s", err);
    cr_assert_eq(g.n_kv, n_kv);
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert(w);
    for (uint64_t i = 0; i < g.n_kv; i++)
        cr_assert_eq(kvp_gguf_writer_copy_kv(w, &g.kv[i]), 0, "kv %llu", (unsigned long long)i);
    size_t len;
    uint8_t *buf = tu_gguf_to_mem(w, NULL, &len);
    /* a key copied twice is a duplicate */
    cr_expect_eq(kvp_gguf_writer_copy_kv(w, &g.kv[0]), -EEXIST);
    kvp_gguf_writer_free(w);
    cr_assert_eq(len, r.n);
    for (size_t i = 0; i < len; i++)
        cr_assert_eq(buf[i], r.b[i], "byte %zu differs", i);
    kvp_gguf_close(&g);
    free(buf);
}

Test(gguf_write, copy_kv_of_a_real_file)
{
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_open(&g, tu_shared("models/stories260K.gguf"), err, sizeof err), 0,
                 "%s", err);
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert(w);
    for (uint64_t i = 0; i < g.n_kv; i++)
        cr_assert_eq(kvp_gguf_writer_copy_kv(w, &g.kv[i]), 0);
    size_t len;
    uint8_t *buf = tu_gguf_to_mem(w, NULL, &len);
    kvp_gguf_writer_free(w);
    /* the kv section is the bytes from the header to the first tensor info */
    cr_assert(g.n_tensors > 0);
    size_t kv_end = (size_t)((const uint8_t *)g.tensors[0].name.ptr - g.base) - 8;
    cr_assert(len >= kv_end);
    cr_expect(memcmp(buf + 24, g.base + 24, kv_end - 24) == 0);
    kvp_gguf c;
    cr_assert_eq(kvp_gguf_parse(&c, buf, len, err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.n_kv, g.n_kv);
    cr_expect_eq(c.n_tensors, 0);
    kvp_gguf_close(&c);
    kvp_gguf_close(&g);
    free(buf);
}
