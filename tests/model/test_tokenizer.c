#include "model/tokenizer.h"
#include "tests/model/testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOK512 "models/tok512.bin"
#define TOK32K "models/tokenizer_llama2_32k.bin"
#define TINY_GGUF "models/llama-2-tiny-random.gguf"
#define STORIES_GGUF "models/stories260K.gguf"
#define TINYSTORIES "datasets/tinystories/tinystories-dev.txt"

static void load_bin(kvp_tokenizer *t, const char *rel, int vocab)
{
    char err[256];
    int rc = kvp_tokenizer_load_file(t, tu_shared(rel), vocab, err, sizeof err);
    cr_assert_eq(rc, 0, "load %s: %s", rel, err);
}

static void load_gguf_file(kvp_tokenizer *t, kvp_gguf *g, const char *rel)
{
    char err[256];
    cr_assert_eq(kvp_gguf_open(g, tu_shared(rel), err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_tokenizer_load_gguf(t, g, err, sizeof err), 0, "%s", err);
}

/* Encodes with BOS into a malloc'd array sized for the worst case. */
static int *encode(const kvp_tokenizer *t, const char *text, size_t len, int *n)
{
    int max = (int)len + 3;
    int *ids = malloc((size_t)max * sizeof *ids);
    cr_assert(ids);
    *n = kvp_tokenizer_encode(t, text, len, KVP_ENCODE_BOS, ids, max);
    cr_assert_geq(*n, 1, "encode failed: %d", *n);
    cr_assert_eq(ids[0], t->bos_id);
    return ids;
}

/* Concatenates the pieces after the leading BOS the way generation prints them. */
static char *decode(const kvp_tokenizer *t, const int *ids, int n, size_t *len)
{
    size_t cap = 16, used = 0;
    char *out = malloc(cap);
    cr_assert(out);
    for (int i = 1; i < n; i++) {
        size_t pl;
        const char *p = kvp_tokenizer_piece(t, ids[i - 1], ids[i], &pl);
        cr_assert(p, "token %d at %d has no piece", ids[i], i);
        while (used + pl + 1 > cap)
            out = realloc(out, cap *= 2);
        memcpy(out + used, p, pl);
        used += pl;
    }
    out[used] = 0;
    *len = used;
    return out;
}

static void assert_roundtrip(const kvp_tokenizer *t, const char *text, size_t len, int *n_out)
{
    int n;
    int *ids = encode(t, text, len, &n);
    size_t dlen;
    char *back = decode(t, ids, n, &dlen);
    cr_assert_eq(dlen, len, "round trip length %zu != %zu", dlen, len);
    for (size_t i = 0; i < len; i++)
        cr_assert_eq(back[i], text[i], "round trip differs at byte %zu", i);
    if (n_out)
        *n_out = n;
    free(back);
    free(ids);
}

static void assert_ids_len(const kvp_tokenizer *t, const char *text, size_t len, int add_bos,
                           int add_eos, const int *want, int n_want)
{
    int got[64];
    int n = kvp_tokenizer_encode(t, text, len, (add_bos ? KVP_ENCODE_BOS : 0) | (add_eos ? KVP_ENCODE_EOS : 0), got, 64);
    cr_assert_eq(n, n_want, "\"%s\": %d tokens, want %d", text, n, n_want);
    for (int i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "\"%s\": token %d is %d, want %d", text, i, got[i],
                     want[i]);
}

static void assert_ids(const kvp_tokenizer *t, const char *text, int add_bos, int add_eos,
                       const int *want, int n_want)
{
    assert_ids_len(t, text, strlen(text), add_bos, add_eos, want, n_want);
}

/* ------------------------------------------------------------- llama2.c format */

Test(tokenizer, tok512_loads)
{
    kvp_tokenizer t;
    load_bin(&t, TOK512, 512);
    cr_assert_eq(t.vocab_size, 512);
    cr_assert_eq(t.bos_id, 1);
    cr_assert_eq(t.eos_id, 2);
    cr_assert_eq(t.unk_id, 0);
    cr_assert_eq(t.add_space_prefix, 1);
    cr_assert_eq(t.max_piece_len, 7);
    for (int b = 0; b < 256; b++)
        cr_assert_eq(t.byte_token[b], b + 3, "byte %d", b);
    cr_assert_eq(kvp_tokenizer_lookup(&t, " ", 1), 410);
    cr_assert_eq(kvp_tokenizer_lookup(&t, "he", 2), 260);
    cr_assert_eq(kvp_tokenizer_lookup(&t, "<0x41>", 6), 0x41 + 3);
    cr_assert_eq(kvp_tokenizer_lookup(&t, "<unk>", 5), 0);
    cr_assert_eq(kvp_tokenizer_lookup(&t, "no such piece", 13), -1);
    kvp_tokenizer_free(&t);
    kvp_tokenizer_free(&t); /* idempotent */
}

Test(tokenizer, tok512_roundtrip_tinystories)
{
    kvp_tokenizer t;
    load_bin(&t, TOK512, 512);
    size_t len;
    char *text = tu_slurp(tu_shared(TINYSTORIES), &len);
    /* The whole file: newlines, and mojibake (non-ASCII) bytes past offset 362000. */
    int n;
    assert_roundtrip(&t, text, len, &n);
    cr_assert_lt(n, (int)(len / 2), "only %d tokens for %zu bytes: merges missing", n, len);
    /* A few KB alone, starting mid-file where non-ASCII bytes are. */
    assert_roundtrip(&t, text + 362400, 6000, NULL);
    assert_roundtrip(&t, text, 4096, NULL);
    free(text);
    kvp_tokenizer_free(&t);
}

Test(tokenizer, tok512_roundtrip_byte_fallback)
{
    kvp_tokenizer t;
    load_bin(&t, TOK512, 512);
    static const char text[] = "Hi \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87 caf\xC3\xA9 "
                               "\xFF\xFE \xC3( \x80\x80 \xE2\x82 \xF4\x90\x80\x80 x\0y\n"
                               "<0x41> <unk>";
    size_t len = sizeof text - 1;
    int n;
    int *ids = encode(&t, text, len, &n);
    int saw_ff = 0, saw_nul = 0;
    for (int i = 0; i < n; i++) {
        saw_ff |= ids[i] == t.byte_token[0xFF];
        saw_nul |= ids[i] == t.byte_token[0];
    }
    cr_assert(saw_ff && saw_nul, "invalid byte and NUL must use byte tokens");
    free(ids);
    assert_roundtrip(&t, text, len, NULL);
    /* A leading space survives the BOS rule: the dummy prefix is the one dropped. */
    assert_roundtrip(&t, "  two spaces", 12, NULL);
    assert_roundtrip(&t, "\nnewline first", 14, NULL);
    kvp_tokenizer_free(&t);
}

Test(tokenizer, encode_edges)
{
    kvp_tokenizer t;
    load_bin(&t, TOK512, 512);
    int out[8];
    cr_assert_eq(kvp_tokenizer_encode(&t, "", 0, 0, out, 8), 0);
    cr_assert_eq(kvp_tokenizer_encode(&t, NULL, 0, 0, NULL, 0), 0);
    assert_ids(&t, "", 1, 1, (int[]){ 1, 2 }, 2);
    int full = kvp_tokenizer_encode(&t, "Once upon a time", 16, KVP_ENCODE_BOS | KVP_ENCODE_EOS, out, 8);
    cr_assert_gt(full, 2);
    cr_assert_eq(out[full - 1], 2);
    cr_assert_eq(kvp_tokenizer_encode(&t, "Once upon a time", 16, KVP_ENCODE_BOS | KVP_ENCODE_EOS, out, full - 1), -ENOSPC);
    cr_assert_eq(kvp_tokenizer_encode(&t, "x", 1, 0, NULL, 0), -ENOSPC);
    cr_assert_eq(kvp_tokenizer_encode(&t, "x", SIZE_MAX, 0, out, 8), -E2BIG);
    /* Embedded NUL is a byte like any other: " a", <0x00>, "b". */
    int b = kvp_tokenizer_lookup(&t, "b", 1);
    assert_ids_len(&t, "a\0b", 3, 0, 0, (int[]){ 261, t.byte_token[0], b }, 3);
    kvp_tokenizer_free(&t);
}

Test(tokenizer, piece_rules)
{
    kvp_tokenizer t;
    load_bin(&t, TOK512, 512);
    size_t len = 99;
    cr_assert_null(kvp_tokenizer_piece(&t, 1, -1, &len));
    cr_assert_eq(len, 0);
    cr_assert_null(kvp_tokenizer_piece(&t, 1, 512, &len));
    int sp = kvp_tokenizer_lookup(&t, " a", 2);
    cr_assert_geq(sp, 0);
    const char *p = kvp_tokenizer_piece(&t, t.bos_id, sp, &len);
    cr_assert(len == 1 && p[0] == 'a');
    p = kvp_tokenizer_piece(&t, sp, sp, &len);
    cr_assert(len == 2 && memcmp(p, " a", 2) == 0);
    p = kvp_tokenizer_piece(&t, sp, t.byte_token['\n'], &len);
    cr_assert(len == 1 && p[0] == '\n');
    p = kvp_tokenizer_piece(&t, t.bos_id, t.byte_token[0xE2], &len);
    cr_assert(len == 1 && (unsigned char)p[0] == 0xE2);
    kvp_tokenizer_free(&t);
}

Test(tokenizer, llama2_32k_hello_world)
{
    kvp_tokenizer t;
    load_bin(&t, TOK32K, 32000);
    assert_ids(&t, "Hello world", 1, 0, (int[]){ 1, 15043, 3186 }, 3);
    assert_ids(&t, "Hello world", 1, 1, (int[]){ 1, 15043, 3186, 2 }, 4);
    assert_ids(&t, "Hello world", 0, 0, (int[]){ 15043, 3186 }, 2);
    kvp_tokenizer_free(&t);
}

/* ------------------------------------------------------------------------ GGUF */

Test(tokenizer, gguf_llama2_hello_world)
{
    kvp_gguf g;
    kvp_tokenizer t;
    load_gguf_file(&t, &g, TINY_GGUF);
    cr_assert_eq(t.vocab_size, 32000);
    cr_assert(t.bos_id == 1 && t.eos_id == 2 && t.unk_id == 0 && t.add_space_prefix == 1);
    assert_ids(&t, "Hello world", 1, 0, (int[]){ 1, 15043, 3186 }, 3);
    /* U+2581 became ' ', byte tokens are mapped, specials can be looked up. */
    cr_assert_eq(kvp_tokenizer_lookup(&t, " world", 6), 3186);
    cr_assert_eq(t.byte_token['\n'], 13);
    cr_assert_eq(kvp_tokenizer_lookup(&t, "<s>", 3), 1);
    cr_assert_eq(t.n_text, 32000 - 3 - 256);
    size_t len;
    const char *p = kvp_tokenizer_piece(&t, t.bos_id, 15043, &len);
    cr_assert(len == 5 && memcmp(p, "Hello", 5) == 0);
    kvp_tokenizer_free(&t);
    kvp_gguf_close(&g);
}

static void assert_same_ids(const kvp_tokenizer *a, const kvp_tokenizer *b, const char *text,
                            size_t len)
{
    int na, nb;
    int *ia = encode(a, text, len, &na), *ib = encode(b, text, len, &nb);
    cr_assert_eq(na, nb, "token counts differ: %d vs %d", na, nb);
    for (int i = 0; i < na; i++)
        cr_assert_eq(ia[i], ib[i], "token %d differs: %d vs %d", i, ia[i], ib[i]);
    free(ia);
    free(ib);
}

Test(tokenizer, gguf_and_bin_vocabularies_agree)
{
    kvp_tokenizer bin, gg, bin512, gg512;
    kvp_gguf g, g512;
    load_bin(&bin, TOK32K, 32000);
    load_gguf_file(&gg, &g, TINY_GGUF);
    load_bin(&bin512, TOK512, 512);
    load_gguf_file(&gg512, &g512, STORIES_GGUF);
    size_t len;
    char *text = tu_slurp(tu_shared(TINYSTORIES), &len);
    const char *para = text;
    const char *end = strstr(para, "\n\n");
    cr_assert(end);
    assert_same_ids(&bin, &gg, para, (size_t)(end - para));
    assert_same_ids(&bin, &gg, text, 20000);
    assert_same_ids(&bin, &gg, text + 362400, 6000);
    assert_same_ids(&bin512, &gg512, text, 20000);
    free(text);
    kvp_tokenizer_free(&bin);
    kvp_tokenizer_free(&gg);
    kvp_tokenizer_free(&bin512);
    kvp_tokenizer_free(&gg512);
    kvp_gguf_close(&g);
    kvp_gguf_close(&g512);
}

/* ----------------------------------------------------------- merge priority */

typedef struct vtok { const char *piece; float score; } vtok;

/* Writes a llama2.c tokenizer file for the vocabulary; returns its path. */
static const char *write_vocab(const vtok *v, int n)
{
    int32_t max_len = 1;
    size_t size = 4;
    for (int i = 0; i < n; i++) {
        int32_t l = (int32_t)strlen(v[i].piece);
        max_len = l > max_len ? l : max_len;
        size += 8 + (size_t)l;
    }
    unsigned char *buf = malloc(size), *p = buf;
    memcpy(p, &max_len, 4);
    p += 4;
    for (int i = 0; i < n; i++) {
        int32_t l = (int32_t)strlen(v[i].piece);
        memcpy(p, &v[i].score, 4);
        memcpy(p + 4, &l, 4);
        memcpy(p + 8, v[i].piece, (size_t)l);
        p += 8 + l;
    }
    const char *path = tu_write_tmp(buf, size);
    free(buf);
    return path;
}

static void load_vocab(kvp_tokenizer *t, const vtok *v, int n)
{
    char err[256];
    const char *path = write_vocab(v, n);
    int rc = kvp_tokenizer_load_file(t, path, n, err, sizeof err);
    unlink(path);
    cr_assert_eq(rc, 0, "%s", err);
}

Test(tokenizer, merge_highest_score_beats_leftmost)
{
    /* ids: 0..2 specials, 3 " ", 4 "a", 5 "b", 6 "c", 7 "ab", 8 "bc", 9 "abc", 10 "cc" */
    vtok v[] = { { "<unk>", 0 }, { "\n<s>\n", 0 }, { "\n</s>\n", 0 }, { " ", -100 },
                 { "a", -100 },  { "b", -100 },    { "c", -100 },     { "ab", -5 },
                 { "bc", -1 },   { "abc", -50 },   { "cc", -1 } };
    kvp_tokenizer t;
    load_vocab(&t, v, 11);
    /* "bc" (-1) beats the leftmost "ab" (-5); then a+bc forms "abc". */
    assert_ids(&t, "abc", 1, 0, (int[]){ 1, 3, 9 }, 3);
    /* Equal scores: "bc" at position 1 and "cc" at position 2 tie; leftmost wins. */
    assert_ids(&t, "bcc", 0, 0, (int[]){ 3, 8, 6 }, 3);
    /* Only "ab" is possible on "abab": both pairs merge. */
    assert_ids(&t, "abab", 0, 0, (int[]){ 3, 7, 7 }, 3);
    kvp_tokenizer_free(&t);

    /* "bc" below "ab", and without "abc": now "ab" merges first and c stays. */
    v[8].score = -10;
    load_vocab(&t, v, 9);
    assert_ids(&t, "abc", 0, 0, (int[]){ 3, 7, 6 }, 3);
    kvp_tokenizer_free(&t);
}

Test(tokenizer, merge_threshold_and_fallbacks)
{
    /* No " " piece and no byte tokens: the dummy-prefix space and unknown characters
     * fall back to unk; llama2.c never takes a merge scored at or below -1e10. */
    vtok v[] = { { "<unk>", 0 }, { "\n<s>\n", 0 }, { "\n</s>\n", 0 },
                 { "a", 0 },     { "b", 0 },       { "ab", -1e10f } };
    kvp_tokenizer t;
    load_vocab(&t, v, 6);
    for (int b = 0; b < 256; b++)
        cr_assert_eq(t.byte_token[b], -1);
    assert_ids(&t, "ab?", 0, 0, (int[]){ 0, 3, 4, 0 }, 4);
    kvp_tokenizer_free(&t);

    /* With a <0x20> byte token the space goes there instead. */
    vtok w[] = { { "<unk>", 0 }, { "\n<s>\n", 0 }, { "\n</s>\n", 0 }, { "<0x20>", 0 },
                 { "a", 0 } };
    load_vocab(&t, w, 5);
    cr_assert_eq(t.byte_token[' '], 3);
    assert_ids(&t, "a", 0, 0, (int[]){ 3, 4 }, 2);
    kvp_tokenizer_free(&t);

    /* Merges spell out "<0x41>", but a byte token is never a merge result: the text
     * must stay text instead of decoding to 'A'. */
    vtok x[] = { { "<unk>", 0 }, { "\n<s>\n", 0 }, { "\n</s>\n", 0 }, { "<0x41>", 0 },
                 { " ", -9 },    { "<", -9 },      { "0", -9 },        { "x", -9 },
                 { "4", -9 },    { "1", -9 },      { ">", -9 },        { "<0", -1 },
                 { "<0x", -1 },  { "41", -1 },     { "41>", -1 } };
    load_vocab(&t, x, 15);
    assert_ids(&t, "<0x41>", 1, 0, (int[]){ 1, 4, 12, 14 }, 4);
    assert_roundtrip(&t, "<0x41>", 6, NULL);
    kvp_tokenizer_free(&t);
}

/* ---------------------------------------------------------------- bad input */

static void assert_load_fails(const char *path, int vocab, const char *what)
{
    kvp_tokenizer t;
    char err[256];
    memset(err, 'X', sizeof err);
    int rc = kvp_tokenizer_load_file(&t, path, vocab, err, sizeof err);
    cr_assert_lt(rc, 0, "%s: loaded", what);
    cr_assert_lt(strlen(err), sizeof err, "%s: message not terminated", what);
    cr_assert_gt(strlen(err), 0, "%s: empty message", what);
    cr_assert_null(t.pieces, "%s: left allocations behind", what);
    kvp_tokenizer_free(&t);
}

Test(tokenizer, bin_truncated_everywhere)
{
    size_t size;
    char *full = tu_slurp(tu_shared(TOK512), &size);
    const char *path = tu_write_tmp(full, size);
    /* Cut the one file shorter and shorter: every offset below 2 KB, a stride above. */
    for (size_t off = size - 1;; off -= off > 2048 ? 61 : 1) {
        cr_assert_eq(truncate(path, (off_t)off), 0);
        char what[64];
        snprintf(what, sizeof what, "truncated at %zu", off);
        assert_load_fails(path, 512, what);
        if (off == 0)
            break;
    }
    unlink(path);
    free(full);
}

static void assert_patched_fails(const char *full, size_t size, size_t at, int32_t v,
                                 int vocab, const char *what)
{
    char *buf = malloc(size);
    memcpy(buf, full, size);
    memcpy(buf + at, &v, 4);
    const char *path = tu_write_tmp(buf, size);
    assert_load_fails(path, vocab, what);
    unlink(path);
    free(buf);
}

Test(tokenizer, bin_bad_fields)
{
    size_t size;
    char *full = tu_slurp(tu_shared(TOK512), &size);
    /* token 0 is {score, len=5, "<unk>"} at offset 4; token 1's len is at 4+8+5+4 */
    assert_patched_fails(full, size, 0, 0, 512, "max_token_length 0");
    assert_patched_fails(full, size, 0, -7, 512, "negative max_token_length");
    assert_patched_fails(full, size, 8, -1, 512, "negative length");
    assert_patched_fails(full, size, 21, -2147483647 - 1, 512, "INT_MIN length");
    assert_patched_fails(full, size, 21, 0x7fffffff, 512, "huge length");
    assert_patched_fails(full, size, 21, 8, 512, "length above max_token_length");
    const char *path = tu_shared(TOK512);
    assert_load_fails(path, 513, "vocab_size larger than the file");
    assert_load_fails(path, 100000, "vocab_size far larger than the file");
    assert_load_fails(path, 511, "vocab_size smaller than the file");
    assert_load_fails(path, 2, "vocab_size without bos/eos");
    assert_load_fails(tu_shared("models/no-such-tokenizer.bin"), 512, "missing file");
    /* A sparse 16 GiB file is refused from its size, before anything is read. */
    const char *big = tu_write_tmp("", 0);
    cr_assert_eq(truncate(big, (off_t)16 << 30), 0);
    assert_load_fails(big, 3, "16 GiB file");
    unlink(big);

    kvp_tokenizer t;
    char small[12];
    cr_assert_eq(kvp_tokenizer_load_file(&t, path, 511, small, sizeof small), -EINVAL);
    cr_assert_eq(strlen(small), sizeof small - 1);
    cr_assert_lt(kvp_tokenizer_load_file(&t, path, 511, NULL, 0), 0);
    free(full);
}

/* A tokenizer-only GGUF from the writer, parsed from memory. The caller frees *mem
 * after closing g. */
typedef struct gguf_spec {
    const char *model;           /* NULL: no tokenizer.ggml.model */
    int n_tokens;                /* 0: no tokens */
    int n_scores;                /* -1: none */
    int n_types;                 /* -1: none */
    int scores_as_i32;
    int bos;                     /* -1: none */
} gguf_spec;

static int build_gguf(const gguf_spec *s, kvp_gguf *g, char **mem, char *err, size_t errlen)
{
    static const char *const toks[] = { "<unk>", "<s>", "</s>", "<0x20>", "\xE2\x96\x81",
                                        "a", "b", "ab", "\xE2\x96\x81" "ab", "ba" };
    float scores[10] = { 0, 0, 0, 0, -1, -2, -3, -4, -5, 0 };
    int32_t types[10] = { 2, 3, 3, 6, 1, 1, 1, 1, 1, 3 };
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert(w);
    if (s->model)
        cr_assert_eq(kvp_gguf_writer_add_str(w, "tokenizer.ggml.model", s->model), 0);
    if (s->n_tokens)
        cr_assert_eq(kvp_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", toks,
                                                   (uint64_t)s->n_tokens), 0);
    if (s->n_scores >= 0 && s->scores_as_i32)
        cr_assert_eq(kvp_gguf_writer_add_i32_array(w, "tokenizer.ggml.scores", types,
                                                   (uint64_t)s->n_scores), 0);
    else if (s->n_scores >= 0)
        cr_assert_eq(kvp_gguf_writer_add_f32_array(w, "tokenizer.ggml.scores", scores,
                                                   (uint64_t)s->n_scores), 0);
    if (s->n_types >= 0)
        cr_assert_eq(kvp_gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", types,
                                                   (uint64_t)s->n_types), 0);
    if (s->bos >= 0)
        cr_assert_eq(kvp_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id",
                                             (uint32_t)s->bos), 0);
    size_t size;
    FILE *f = open_memstream(mem, &size);
    cr_assert(f);
    char werr[256];
    cr_assert_eq(kvp_gguf_writer_write(w, f, NULL, NULL, werr, sizeof werr), 0, "%s", werr);
    fclose(f);
    kvp_gguf_writer_free(w);
    cr_assert_eq(kvp_gguf_parse(g, *mem, size, werr, sizeof werr), 0, "%s", werr);
    kvp_tokenizer t;
    int rc = kvp_tokenizer_load_gguf(&t, g, err, errlen);
    if (rc == 0) {
        /* The good spec: markers replaced, types honoured, merges by score. */
        cr_assert_eq(kvp_tokenizer_lookup(&t, " ab", 3), 8);
        cr_assert_eq(t.byte_token[' '], 3);
        cr_assert_eq(kvp_tokenizer_lookup(&t, "<s>", 3), 1);
        assert_ids(&t, "ab", 1, 1, (int[]){ 1, 8, 2 }, 3);
        /* "ba" is a control token: looked up by name, never merged into from text. */
        cr_assert_eq(kvp_tokenizer_lookup(&t, "ba", 2), 9);
        assert_ids(&t, "ba", 0, 0, (int[]){ 4, 6, 5 }, 3);
    }
    kvp_tokenizer_free(&t);
    kvp_gguf_close(g);
    return rc;
}

static void assert_gguf_fails(gguf_spec s, const char *what, const char *needle)
{
    kvp_gguf g;
    char *mem = NULL;
    char err[256] = "";
    int rc = build_gguf(&s, &g, &mem, err, sizeof err);
    free(mem);
    cr_assert_lt(rc, 0, "%s: loaded", what);
    cr_assert_gt(strlen(err), 0, "%s: empty message", what);
    cr_assert(strstr(err, needle), "%s: message \"%s\" lacks \"%s\"", what, err, needle);
}

Test(tokenizer, gguf_built_and_rejected)
{
    const gguf_spec good = { "llama", 10, 10, 10, 0, 1 };
    kvp_gguf g;
    char *mem = NULL;
    char err[256] = "";
    cr_assert_eq(build_gguf(&good, &g, &mem, err, sizeof err), 0, "%s", err);
    free(mem);

    gguf_spec s = good;
    s.model = "bert";
    assert_gguf_fails(s, "bert model", "\"bert\" is not supported");
    s.model = "gpt2";
    assert_gguf_fails(s, "gpt2 without merges", "tokenizer.ggml.merges");
    s = good;
    s.model = NULL;
    assert_gguf_fails(s, "no model", "tokenizer.ggml.model");
    s = good;
    s.n_tokens = 0;
    assert_gguf_fails(s, "no tokens", "tokenizer.ggml.tokens");
    s = good;
    s.n_scores = 9;
    assert_gguf_fails(s, "short scores", "tokenizer.ggml.scores");
    s = good;
    s.scores_as_i32 = 1;
    assert_gguf_fails(s, "int scores", "tokenizer.ggml.scores");
    s = good;
    s.n_types = 3;
    assert_gguf_fails(s, "short token_type", "tokenizer.ggml.token_type");
    s = good;
    s.bos = 10;
    assert_gguf_fails(s, "bos out of range", "bos_token_id");
}

/* ---------------------------------------------- add_space_prefix from raw GGUF */

typedef struct rawbuf { unsigned char b[512]; size_t n; } rawbuf;

static void raw_put(rawbuf *r, const void *p, size_t n)
{
    cr_assert_leq(r->n + n, sizeof r->b);
    memcpy(r->b + r->n, p, n);
    r->n += n;
}

static void raw_u32(rawbuf *r, uint32_t v) { raw_put(r, &v, 4); }
static void raw_u64(rawbuf *r, uint64_t v) { raw_put(r, &v, 8); }

static void raw_str(rawbuf *r, const char *s)
{
    raw_u64(r, strlen(s));
    raw_put(r, s, strlen(s));
}

/* The writer has no bool, so this GGUF is assembled byte by byte (little-endian host). */
static int load_raw_prefix_gguf(uint32_t prefix_type, kvp_tokenizer *t, kvp_gguf *g,
                                rawbuf *r, char *err, size_t errlen)
{
    static const char *const toks[] = { "<unk>", "<s>", "</s>", "\xE2\x96\x81", "a" };
    r->n = 0;
    raw_put(r, "GGUF", 4);
    raw_u32(r, 3);
    raw_u64(r, 0); /* tensors */
    raw_u64(r, 3); /* kvs */
    raw_str(r, "tokenizer.ggml.model");
    raw_u32(r, KVP_GGUF_STRING);
    raw_str(r, "llama");
    raw_str(r, "tokenizer.ggml.tokens");
    raw_u32(r, KVP_GGUF_ARRAY);
    raw_u32(r, KVP_GGUF_STRING);
    raw_u64(r, 5);
    for (int i = 0; i < 5; i++)
        raw_str(r, toks[i]);
    raw_str(r, "tokenizer.ggml.add_space_prefix");
    raw_u32(r, prefix_type);
    if (prefix_type == KVP_GGUF_BOOL)
        raw_put(r, "\0", 1);
    else
        raw_u32(r, 0);
    while (r->n % 32)
        raw_put(r, "\0", 1);
    char perr[256];
    cr_assert_eq(kvp_gguf_parse(g, r->b, r->n, perr, sizeof perr), 0, "%s", perr);
    int rc = kvp_tokenizer_load_gguf(t, g, err, errlen);
    kvp_gguf_close(g);
    return rc;
}

Test(tokenizer, gguf_add_space_prefix)
{
    kvp_tokenizer t;
    kvp_gguf g;
    rawbuf r;
    char err[256];
    cr_assert_eq(load_raw_prefix_gguf(KVP_GGUF_BOOL, &t, &g, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.add_space_prefix, 0);
    /* No scores: all 0. No dummy prefix: "a" alone. */
    cr_assert_eq(t.scores[4], 0.0f);
    assert_ids(&t, "a", 1, 0, (int[]){ 1, 4 }, 2);
    assert_ids(&t, " a", 1, 0, (int[]){ 1, 3, 4 }, 3);
    kvp_tokenizer_free(&t);

    cr_assert_lt(load_raw_prefix_gguf(KVP_GGUF_UINT32, &t, &g, &r, err, sizeof err), 0);
    cr_assert(strstr(err, "add_space_prefix"), "%s", err);
}

/* KVP_ENCODE_NO_PREFIX drops the dummy leading space, so text that continues earlier
 * text encodes as it would inside one call. */
Test(tokenizer, no_prefix_flag)
{
    kvp_tokenizer t;
    load_bin(&t, TOK512, 512);
    int with[16], without[16], whole[32], parts[32];
    int a = kvp_tokenizer_encode(&t, "upon", 4, 0, with, 16);
    int b = kvp_tokenizer_encode(&t, "upon", 4, KVP_ENCODE_NO_PREFIX, without, 16);
    cr_assert(a > 0 && b > 0);
    size_t len;
    const char *p = kvp_tokenizer_piece(&t, 0, with[0], &len);
    cr_expect(len > 0 && p[0] == ' ', "the default encoding starts with the dummy space");
    p = kvp_tokenizer_piece(&t, 0, without[0], &len);
    cr_expect(len > 0 && p[0] == 'u', "no dummy space with the flag");
    /* two lines encoded apart, the second without prefix, equal the whole text */
    const char *text = "Once upon a time.\nThe end.\n";
    int n = kvp_tokenizer_encode(&t, text, 27, 0, whole, 32);
    int n1 = kvp_tokenizer_encode(&t, text, 18, 0, parts, 32);
    int n2 = kvp_tokenizer_encode(&t, text + 18, 9, KVP_ENCODE_NO_PREFIX, parts + n1, 32 - n1);
    cr_assert_eq(n1 + n2, n);
    cr_expect_eq(memcmp(whole, parts, (size_t)n * sizeof *whole), 0);
    kvp_tokenizer_free(&t);
}

/* A Gemma-style SentencePiece vocabulary: no dummy prefix, user-defined tokens (newline
 * runs, an HTML tag, a run of U+2581) and a control turn marker. */
Test(tokenizer, gemma_user_defined_tokens)
{
    static const char *const toks[] = {
        "<pad>", "<eos>", "<bos>", "<unk>", "\n", "\n\n", "\xE2\x96\x81\xE2\x96\x81", "<td>",
        "<start_of_turn>", "\xE2\x96\x81", "a", "b", "ab", "<", "t", "d", ">" };
    enum { N = 17 };
    /* "\n\n" and "<td>" score at llama2.c's floor: merging never reaches them, only the
     * user-defined match does. */
    float scores[N] = { 0, 0, 0, 0, 0, -1e10f, -1, -1e10f, 0, -2, -3, -3, -1.5f, -3, -3, -3, -3 };
    int32_t types[N] = { 3, 3, 3, 2, 4, 4, 4, 4, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert(w);
    cr_assert_eq(kvp_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama"), 0);
    cr_assert_eq(kvp_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", toks, N), 0);
    cr_assert_eq(kvp_gguf_writer_add_f32_array(w, "tokenizer.ggml.scores", scores, N), 0);
    cr_assert_eq(kvp_gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", types, N), 0);
    cr_assert_eq(kvp_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 2), 0);
    cr_assert_eq(kvp_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 1), 0);
    cr_assert_eq(kvp_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 3), 0);
    cr_assert_eq(kvp_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", 0), 0);
    char *mem = NULL;
    size_t size;
    FILE *f = open_memstream(&mem, &size);
    cr_assert(f);
    char err[256];
    cr_assert_eq(kvp_gguf_writer_write(w, f, NULL, NULL, err, sizeof err), 0, "%s", err);
    fclose(f);
    kvp_gguf_writer_free(w);
    kvp_gguf g;
    cr_assert_eq(kvp_gguf_parse(&g, mem, size, err, sizeof err), 0, "%s", err);
    kvp_tokenizer t;
    cr_assert_eq(kvp_tokenizer_load_gguf(&t, &g, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.add_space_prefix, 0);

    /* Longest user-defined piece first: "\n\n" then "\n". */
    assert_ids(&t, "a\n\n\nb", 0, 0, (int[]){ 10, 5, 4, 11 }, 4);
    /* The tag is one token; the text after it merges on its own ("ab"). */
    assert_ids(&t, "<td>ab", 1, 0, (int[]){ 2, 7, 12 }, 3);
    /* Two spaces merge into the U+2581 run by score (that user-defined piece matches
     * only a literal U+2581 run in the references, never spaces). */
    assert_ids(&t, "a  b", 0, 0, (int[]){ 10, 6, 11 }, 3);
    /* A literal U+2581 is a space. */
    assert_ids(&t, "a\xE2\x96\x81" "b", 0, 0, (int[]){ 10, 9, 11 }, 3);
    assert_ids(&t, "a b", 0, 0, (int[]){ 10, 9, 11 }, 3);
    /* The control marker is found by name and never produced from text. */
    cr_assert_eq(kvp_tokenizer_special(&t, "<start_of_turn>", 15), 8);
    int out[32];
    int n = kvp_tokenizer_encode(&t, "a<start_of_turn>", 16, 0, out, 32);
    cr_assert_gt(n, 2);
    for (int i = 0; i < n; i++)
        cr_assert_neq(out[i], 8, "control token from text");
    /* Too small an output is -ENOSPC, with user-defined tokens too. */
    cr_assert_eq(kvp_tokenizer_encode(&t, "a\n\n\nb", 5, 0, out, 3), -ENOSPC);
    size_t len;
    const char *p = kvp_tokenizer_piece(&t, 10, 5, &len);
    cr_assert(len == 2 && !memcmp(p, "\n\n", 2));
    kvp_tokenizer_free(&t);
    kvp_gguf_close(&g);
    free(mem);
}
