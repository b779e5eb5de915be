/* model/grammar.c, grammar_trie.c: the matcher follows a hand-built recursive grammar,
 * refuses without changing state, and the trie walk's mask equals testing every token of
 * a real vocabulary one by one. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"
#include "model/schema.h"
#include "testutil.h"

/* S = "(" S* ")" | "x": balanced parentheses around x's, through calls. */
static kvp_grammar *parens(void)
{
    kvp_gbuild *b = kvp_gbuild_new();
    int s = kvp_gbuild_state(b), end = kvp_gbuild_state(b), open = kvp_gbuild_state(b);
    kvp_gbuild_end(b, end);
    kvp_gbuild_range(b, s, 'x', 'x', end);
    kvp_gbuild_range(b, s, '(', '(', open);
    kvp_gbuild_call(b, open, s, open);
    kvp_gbuild_range(b, open, ')', ')', end);
    int rc;
    kvp_grammar *g = kvp_grammar_finish(b, s, &rc);
    cr_assert(g);
    return g;
}

Test(grammar, paths_that_never_end_are_dropped)
{
    /* S = "a" S | "b" | "c" T, T = "d" T (T never ends) */
    kvp_gbuild *b = kvp_gbuild_new();
    int s = kvp_gbuild_state(b), end = kvp_gbuild_state(b), a = kvp_gbuild_state(b),
        t = kvp_gbuild_state(b);
    kvp_gbuild_end(b, end);
    kvp_gbuild_range(b, s, 'a', 'a', a);
    kvp_gbuild_call(b, a, s, end);
    kvp_gbuild_range(b, s, 'b', 'b', end);
    kvp_gbuild_range(b, s, 'c', 'c', t);
    kvp_gbuild_range(b, t, 'd', 'd', t);
    int rc;
    kvp_grammar *g = kvp_grammar_finish(b, s, &rc);
    cr_assert(g);
    cr_expect(tu_grammar_whole(g, "aab"));
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_expect_eq(kvp_gmatch_accept(&m, "c", 1), -EINVAL);
    kvp_gmatch_free(&m);
    kvp_grammar_unref(g);
    /* only the endless path: no document */
    b = kvp_gbuild_new();
    s = kvp_gbuild_state(b);
    kvp_gbuild_range(b, s, 'd', 'd', s);
    cr_expect_null(kvp_grammar_finish(b, s, &rc));
    cr_expect_eq(rc, -ENOENT);
}

Test(grammar, a_state_with_too_many_arcs_is_refused)
{
    kvp_gbuild *b = kvp_gbuild_new();
    int s = kvp_gbuild_state(b), end = kvp_gbuild_state(b);
    kvp_gbuild_end(b, end);
    for (int i = 0; i <= KVP_GRAMMAR_MAX_FANOUT; i++)
        kvp_gbuild_eps(b, s, end);
    cr_expect_eq(kvp_gbuild_failed(b), -EMLINK);
    int rc;
    cr_expect_null(kvp_grammar_finish(b, s, &rc));
    cr_expect_eq(rc, -EMLINK);
}

Test(grammar, recursion_through_calls)
{
    kvp_grammar *g = parens();
    cr_expect(tu_grammar_whole(g, "x"));
    cr_expect(tu_grammar_whole(g, "()"));
    cr_expect(tu_grammar_whole(g, "(x(xx)())"));
    cr_expect(!tu_grammar_whole(g, "(x"));
    cr_expect(!tu_grammar_whole(g, "x)"));
    cr_expect(!tu_grammar_whole(g, "(y)"));
    cr_expect(!tu_grammar_whole(g, ""));
    kvp_grammar_unref(g);
}

Test(grammar, depth_is_bounded)
{
    kvp_grammar *g = parens();
    char doc[2 * KVP_GRAMMAR_MAX_DEPTH + 8];
    int d = KVP_GRAMMAR_MAX_DEPTH;   /* d - 1 opens inside the first: d frames */
    memset(doc, '(', (size_t)d);
    memset(doc + d, ')', (size_t)d);
    doc[2 * d] = '\0';
    cr_expect(tu_grammar_whole(g, doc));
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    memset(doc, '(', (size_t)d + 2);
    cr_expect_neq(kvp_gmatch_accept(&m, doc, (size_t)d + 2), 0);
    kvp_gmatch_free(&m);
    kvp_grammar_unref(g);
}

Test(grammar, refusal_keeps_state_and_completion)
{
    kvp_grammar *g = parens();
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_expect_eq(kvp_gmatch_accept(&m, "((x", 3), 0);
    cr_expect(!kvp_gmatch_complete(&m));
    cr_expect_eq(kvp_gmatch_accept(&m, ")y", 2), -EINVAL);
    cr_expect_eq(kvp_gmatch_accept(&m, "))", 2), 0);
    cr_expect(kvp_gmatch_complete(&m));
    cr_expect(kvp_gmatch_closed(&m));
    cr_expect_eq(kvp_gmatch_accept(&m, "x", 1), -EINVAL);
    kvp_gmatch_free(&m);
    kvp_grammar_unref(g);
}

Test(grammar, long_generation_stays_small)
{
    /* many calls accepted one byte at a time: the frame arena is compacted */
    kvp_grammar *g = parens();
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_assert_eq(kvp_gmatch_accept(&m, "(", 1), 0);
    for (int i = 0; i < 200000; i++)
        cr_assert_eq(kvp_gmatch_accept(&m, i % 2 ? ")" : "(", 1), 0);
    cr_expect_lt(m.n_frames, 70000);
    cr_assert_eq(kvp_gmatch_accept(&m, ")", 1), 0);
    cr_expect(kvp_gmatch_complete(&m));
    kvp_gmatch_free(&m);
    kvp_grammar_unref(g);
}

static kvp_tokenizer tok;
static kvp_vocab_trie trie;

static void load(void)
{
    char err[256];
    cr_assert_eq(kvp_tokenizer_load_file(&tok, tu_shared("models/tokenizer_llama2_32k.bin"),
                                         32000, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_vocab_trie_build(&trie, &tok), 0);
    trie.n_end = 1;
    trie.end_tok[0] = 2;   /* </s> */
}

static void unload(void)
{
    kvp_vocab_trie_free(&trie);
    kvp_tokenizer_free(&tok);
}

/* Whether token id may follow prefix, by accepting it on a fresh matcher. */
static int brute(kvp_grammar *g, const char *prefix, int id)
{
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_assert_eq(kvp_gmatch_accept(&m, prefix, strlen(prefix)), 0);
    int ok;
    if (id == 2)
        ok = kvp_gmatch_complete(&m);
    else {
        size_t n;
        const char *p = kvp_tokenizer_piece(&tok, -1, id, &n);
        int special = 1;
        for (int i = 0; i < tok.n_text; i++)
            if (tok.sorted[i] == id)
                special = 0;
        for (int b = 0; b < 256; b++)
            special &= tok.byte_token[b] != id;
        ok = !special && n > 0 && kvp_gmatch_accept(&m, p, n) == 0;
    }
    kvp_gmatch_free(&m);
    return ok;
}

Test(grammar, trie_mask_equals_every_token_tested, .init = load, .fini = unload)
{
    json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
                           "\"maxLength\":4},\"n\":{\"type\":\"integer\",\"minimum\":-5,"
                           "\"maximum\":120},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":"
                           "[\"ab\",\"cd\"]},\"maxItems\":2}},\"required\":[\"name\",\"n\"]}",
                           0, NULL);
    char err[256];
    kvp_grammar *g = kvp_schema_compile(s, err, sizeof err);
    cr_assert(g, "%s", err);
    json_decref(s);
    static const char *const prefixes[] = {"", "{", "{\"name\": \"", "{\"name\": \"ab",
                                           "{\"name\": \"abcd", "{\"name\":\"\",\"n\":1",
                                           "{\"name\":\"\",\"n\":12",
                                           "{\"name\":\"\",\"n\":-5,\"tags\":[\"ab\"",
                                           "{\"name\":\"\",\"n\":0}"};
    uint32_t *mask = calloc((32000 + 31) / 32, sizeof *mask);
    /* the ids where things happen, and a stride over the rest (all of them is slow) */
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++) {
        kvp_gmatch m;
        cr_assert_eq(kvp_gmatch_init(&m, g), 0);
        cr_assert_eq(kvp_gmatch_accept(&m, prefixes[p], strlen(prefixes[p])), 0);
        int n = kvp_gmatch_mask(&m, &trie, mask), count = 0, checked = 0;
        cr_assert_gt(n, 0, "%s", prefixes[p]);
        for (int id = 0; id < 32000; id++) {
            int bit = (mask[id >> 5] >> (id & 31)) & 1;
            count += bit;
            if (bit || id % 7 == 0 || id < 300) {
                cr_expect_eq(bit, brute(g, prefixes[p], id), "prefix '%s' token %d '%s'",
                             prefixes[p], id, tok.pieces[id]);
                checked++;
            }
        }
        cr_expect_eq(count, n);
        /* the document is whole only after the last prefix: then only </s> */
        cr_expect_eq((mask[0] >> 2) & 1, p + 1 == sizeof prefixes / sizeof prefixes[0]);
        if (p + 1 == sizeof prefixes / sizeof prefixes[0])
            cr_expect_eq(n, 1);
        kvp_gmatch_free(&m);
    }
    float *logits = malloc(32000 * sizeof *logits);
    for (int i = 0; i < 32000; i++)
        logits[i] = 1.0f;
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    kvp_gmatch_mask(&m, &trie, mask);
    kvp_grammar_apply_mask(logits, mask, 32000);
    for (int i = 0; i < 32000; i++)
        cr_expect_eq(isinf(logits[i]) != 0, !((mask[i >> 5] >> (i & 31)) & 1));
    kvp_gmatch_free(&m);
    free(logits);
    free(mask);
    kvp_grammar_unref(g);
}

Test(grammar, trie_holds_every_text_token_once, .init = load, .fini = unload)
{
    int *seen = calloc(32000, sizeof *seen);
    for (int i = 0; i < trie.n_nodes; i++) {
        cr_assert(trie.skip[i] > i && trie.skip[i] <= trie.n_nodes);
        if (i + 1 < trie.n_nodes)
            cr_assert(trie.depth[i + 1] <= trie.depth[i] + 1);
        for (int k = trie.off[i]; k < trie.off[i + 1]; k++) {
            int id = trie.tok[k];
            size_t n;
            const char *p = kvp_tokenizer_piece(&tok, -1, id, &n);
            cr_assert_eq((int)n, trie.depth[i]);
            cr_assert_eq((uint8_t)p[n - 1], trie.byte[i]);
            seen[id]++;
        }
    }
    cr_expect_eq(seen[tok.byte_token['A']], 1);   /* <0x41> is the byte A */
    for (int id = 0; id < 32000; id++)
        cr_expect_leq(seen[id], 1);
    free(seen);
}

Test(grammar, an_ambiguous_grammar_has_its_walk_cut_with_valid_tokens, .init = load, .fini = unload)
{
    /* 60 string schemas alive at once inside a string: the walk passes the budget */
    char s[8192];
    size_t n = (size_t)snprintf(s, sizeof s, "{\"anyOf\":[");
    for (int i = 1; i <= 60; i++)
        n += (size_t)snprintf(s + n, sizeof s - n, "%s{\"type\":\"string\",\"maxLength\":%d}",
                              i > 1 ? "," : "", 40 + i);
    snprintf(s + n, sizeof s - n, "]}");
    json_t *js = json_loads(s, 0, NULL);
    char err[256];
    kvp_grammar *g = kvp_schema_compile(js, err, sizeof err);
    json_decref(js);
    cr_assert(g, "%s", err);
    uint32_t *mask = calloc((32000 + 31) / 32, sizeof *mask);
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_assert_eq(kvp_gmatch_accept(&m, "\"a", 2), 0);
    int allowed = kvp_gmatch_mask(&m, &trie, mask);
    cr_expect_eq(m.cut_walks, 1);
    cr_expect_gt(allowed, 100);
    for (int id = 0; id < 32000; id++)
        if ((mask[id >> 5] >> (id & 31)) & 1)
            cr_expect(brute(g, "\"a", id), "token %d '%s' is not valid", id, tok.pieces[id]);
    /* every one-byte token that may follow is there, the closing quote first of all */
    int q = kvp_tokenizer_lookup(&tok, "\"", 1);
    cr_assert_geq(q, 0);
    cr_expect((mask[q >> 5] >> (q & 31)) & 1);
    for (int b = 0x20; b < 0x7F; b++) {
        int id = tok.byte_token[b];
        if (id >= 0)
            cr_expect_eq((mask[id >> 5] >> (id & 31)) & 1, brute(g, "\"a", id), "byte %02x", b);
    }
    kvp_gmatch_free(&m);
    free(mask);
    kvp_grammar_unref(g);
}

/* ---- hostile schemas: the mask's work is bounded by the budget ---- */

typedef struct hostile {
    char *schema;     /* malloc'd */
    char prefix[512]; /* accepted first, to reach the costly place */
} hostile;

/* Appends to a growing buffer. */
static void cat(char **s, size_t *n, size_t *cap, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(*s + *n, *cap - *n, fmt, ap);
        va_end(ap);
        if ((size_t)k < *cap - *n) {
            *n += (size_t)k;
            return;
        }
        *cap = *cap * 2 + (size_t)k;
        *s = realloc(*s, *cap);
        cr_assert(*s);
    }
}

/* Schemas built to make the closure and the walk do the most work per token that the
 * compiler's limits allow. */
static int hostile_schemas(hostile *h)
{
    int n = 0;
    size_t len, cap;
#define BEGIN() (len = 0, cap = 256, h[n].schema = malloc(cap), h[n].prefix[0] = '\0')
#define CAT(...) cat(&h[n].schema, &len, &cap, __VA_ARGS__)
    /* 1. many strings alive at once, each a distinct path of states */
    BEGIN();
    CAT("{\"anyOf\":[");
    for (int i = 0; i < 130; i++)
        CAT("%s{\"type\":\"string\",\"maxLength\":%d}", i ? "," : "", 20 + i);
    CAT("]}");
    snprintf(h[n++].prefix, 512, "\"ab");
    /* 2. a huge enum whose values share a long prefix */
    BEGIN();
    CAT("{\"enum\":[");
    for (int i = 0; i < 1024; i++)
        CAT("%s\"common-prefix-of-every-value-%04d\"", i ? "," : "", i);
    CAT("]}");
    snprintf(h[n++].prefix, 512, "\"common");
    /* 3. many optional properties (any of them may come next, keys sharing a prefix) */
    BEGIN();
    CAT("{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 600; i++)
        CAT("%s\"property_%03d\":{\"type\":\"integer\"}", i ? "," : "", i);
    CAT("}}");
    snprintf(h[n++].prefix, 512, "{\"property_");
    /* 4. deep recursion through several alternatives: long, different stacks */
    BEGIN();
    CAT("{\"$defs\":{\"n\":{\"anyOf\":[");
    for (int i = 0; i < 16; i++)
        CAT("%s{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":%d}",
            i ? "," : "", 2 + i);
    CAT(",{\"type\":\"string\"}]}},\"$ref\":\"#/$defs/n\"}");
    memset(h[n].prefix, '[', 80);
    h[n].prefix[80] = '\0';
    n++;
    /* 5. any value, 256 alternatives deep inside nested arrays and objects */
    BEGIN();
    CAT("{\"anyOf\":[");
    for (int i = 0; i < 256; i++)
        CAT("%s{\"type\":\"array\",\"maxItems\":%d}", i ? "," : "", 3 + i % 5);
    CAT("]}");
    snprintf(h[n++].prefix, 512, "[[{\"a\":[[\"x");
    /* 6. integers: many overlapping ranges alive at once */
    BEGIN();
    CAT("{\"anyOf\":[");
    for (int i = 0; i < 300; i++)
        CAT("%s{\"type\":\"integer\",\"minimum\":%d,\"maximum\":%d}", i ? "," : "", -i * 7,
            1000000 + i * 13);
    CAT("]}");
    snprintf(h[n++].prefix, 512, "1");
    /* 7. an ambiguous pattern, alternatives of it */
    BEGIN();
    CAT("{\"anyOf\":[");
    for (int i = 0; i < 100; i++)
        CAT("%s{\"type\":\"string\",\"pattern\":\"^(a|ab|b|ba|[ab]{1,3})+%c?$\"}", i ? "," : "",
            'c' + i % 20);
    CAT("]}");
    snprintf(h[n++].prefix, 512, "\"abab");
    /* 8. objects nested through anyOf, each level with optional properties */
    BEGIN();
    CAT("{\"$defs\":{\"o\":{\"anyOf\":[");
    for (int i = 0; i < 40; i++)
        CAT("%s{\"type\":\"object\",\"properties\":{\"k%d\":{\"$ref\":\"#/$defs/o\"},"
            "\"k\":{\"$ref\":\"#/$defs/o\"}}}", i ? "," : "", i);
    CAT("]}},\"$ref\":\"#/$defs/o\"}");
    snprintf(h[n++].prefix, 512, "{\"k\":{\"k\":{\"k\":{\"k\":{\"k\":{");
#undef BEGIN
#undef CAT
    return n;
}

Test(grammar, hostile_schemas_mask_within_the_budget, .init = load, .fini = unload)
{
    hostile h[16];
    int n = hostile_schemas(h);
    long budget = kvp_grammar_mask_budget(&trie), worst = 0;
    uint32_t *mask = calloc((32000 + 31) / 32, sizeof *mask);
    uint64_t rng = 5;
    int cut = 0;
    for (int i = 0; i < n; i++) {
        json_t *js = json_loads(h[i].schema, 0, NULL);
        cr_assert(js, "schema %d", i);
        char err[256];
        kvp_grammar *g = kvp_schema_compile(js, err, sizeof err);
        json_decref(js);
        cr_assert(g, "schema %d: %s", i, err);
        kvp_gmatch m;
        cr_assert_eq(kvp_gmatch_init(&m, g), 0);
        cr_assert_eq(kvp_gmatch_accept(&m, h[i].prefix, strlen(h[i].prefix)), 0, "schema %d", i);
        for (int t = 0; t < 6; t++) {
            int allowed = kvp_gmatch_mask(&m, &trie, mask);
            cr_expect_leq(m.mask_work, budget + KVP_GRAMMAR_MASK_OVERRUN,
                          "schema %d, step %d: %ld units, budget %ld", i, t, m.mask_work, budget);
            worst = m.mask_work > worst ? m.mask_work : worst;
            if (allowed <= 0 || ((mask[0] >> 2) & 1))
                break;
            /* a random allowed token, accepted as the session would */
            int pick = (int)(kvp_rand_f32(&rng) * (float)allowed), id = -1;
            for (int k = 0; k < 32000 && id < 0; k++)
                if (((mask[k >> 5] >> (k & 31)) & 1) && pick-- == 0)
                    id = k;
            size_t pl;
            const char *p = kvp_tokenizer_piece(&tok, -1, id, &pl);
            long before = m.work;
            cr_assert_eq(kvp_gmatch_accept(&m, p, pl), 0, "schema %d: token %d", i, id);
            cr_expect_leq(m.work - before, budget + KVP_GRAMMAR_MASK_OVERRUN);
        }
        cut += m.cut_walks > 0;
        kvp_gmatch_free(&m);
        kvp_grammar_unref(g);
        free(h[i].schema);
    }
    cr_expect_gt(cut, 0, "no hostile schema reached the budget (worst %ld of %ld)", worst, budget);
    free(mask);
}

/* ---- distances and the length budget ---- */

/* The matcher's distance after prefix (which it must accept). */
static int dist_after(kvp_grammar *g, const char *prefix)
{
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_assert_eq(kvp_gmatch_accept(&m, prefix, strlen(prefix)), 0, "%s", prefix);
    int d = kvp_gmatch_distance(&m);
    kvp_gmatch_free(&m);
    return d;
}

Test(grammar, distances_count_the_bytes_left_through_calls)
{
    kvp_grammar *g = parens();
    cr_expect_eq(kvp_grammar_min_len(g), 1);                 /* x */
    cr_expect_eq(dist_after(g, "("), 1);                     /* ) */
    cr_expect_eq(dist_after(g, "((("), 3);                   /* ))) */
    cr_expect_eq(dist_after(g, "((x)"), 1);
    cr_expect_eq(dist_after(g, "(x)"), 0);                   /* whole */
    kvp_grammar_unref(g);
    char err[256];
    json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"kk\":{\"type\":\"string\","
                           "\"minLength\":3},\"n\":{\"type\":\"array\",\"items\":{\"type\":"
                           "\"integer\"},\"minItems\":2}},\"required\":[\"kk\",\"n\"]}", 0, NULL);
    g = kvp_schema_compile(s, err, sizeof err);
    json_decref(s);
    cr_assert(g, "%s", err);
    /* {"kk":"aaa","n":[0,0]} */
    cr_expect_eq(kvp_grammar_min_len(g), (int)strlen("{\"kk\":\"aaa\",\"n\":[0,0]}"));
    cr_expect_eq(dist_after(g, "{\"kk\": \"a"), (int)strlen("aa\",\"n\":[0,0]}"));
    cr_expect_eq(dist_after(g, "{\"kk\":\"abcdef\",\"n\":[1"), (int)strlen(",0]}"));
    cr_expect_eq(dist_after(g, "{\"kk\":\"abcdef\",\"n\":[1,2]}"), 0);
    kvp_grammar_unref(g);
}

/* S = "x" "y" | "zzzz": without a one-byte token for x, the short way cannot be relied on. */
Test(grammar, distances_leave_out_bytes_without_a_token, .init = load, .fini = unload)
{
    kvp_gbuild *b = kvp_gbuild_new();
    int s = kvp_gbuild_state(b), end = kvp_gbuild_state(b), x = kvp_gbuild_state(b);
    kvp_gbuild_end(b, end);
    kvp_gbuild_range(b, s, 'x', 'x', x);
    kvp_gbuild_range(b, x, 'y', 'y', end);
    int z = kvp_gbuild_literal(b, s, "zzz", 3);
    kvp_gbuild_range(b, z, 'z', 'z', end);
    int rc;
    kvp_grammar *g = kvp_grammar_finish(b, s, &rc);
    cr_assert(g);
    cr_expect_eq(kvp_grammar_min_len(g), 2);
    kvp_vocab_trie tr = trie;   /* a shallow copy with x's one-byte token taken away */
    cr_assert((tr.lone['x' >> 5] >> ('x' & 31)) & 1, "the llama2 vocabulary has a token x");
    tr.lone['x' >> 5] &= ~(1u << ('x' & 31));
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_expect_eq(kvp_gmatch_distance(&m), 2);
    cr_assert_eq(kvp_gmatch_bind(&m, &tr), 0);
    /* the z's then: as many tokens as the fewest spelling "zzzz" (at least 2 here) */
    int d = kvp_gmatch_distance(&m);
    cr_expect(d > 1 && d <= 4, "%d", d);
    kvp_gmatch_free(&m);
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_assert_eq(kvp_gmatch_bind(&m, &trie), 0);   /* every byte has one: x then y */
    cr_expect_eq(kvp_gmatch_distance(&m), 2);
    kvp_gmatch_free(&m);
    kvp_grammar_unref(g);
}

/* A schema built to need many bytes: objects nested `depth` deep, each with a long
 * required key, a required array of at least two strings of at least 3 characters and
 * an optional number. */
static char *deep_schema(int depth, int keylen)
{
    char key[128];
    cr_assert_lt(keylen, (int)sizeof key);
    char *s = strdup("{\"type\":\"string\",\"minLength\":2}");
    for (int d = 0; d < depth; d++) {
        for (int i = 0; i < keylen; i++)
            key[i] = (char)('a' + (d + i) % 26);
        key[keylen] = 0;
        size_t n = strlen(s) + 2 * strlen(key) + 512;
        char *t = malloc(n);
        snprintf(t, n, "{\"type\":\"object\",\"properties\":{\"%s\":%s,\"list%d\":{\"type\":"
                 "\"array\",\"items\":{\"type\":\"string\",\"minLength\":3},\"minItems\":2},"
                 "\"opt\":{\"type\":\"number\"}},\"required\":[\"%s\",\"list%d\"]}",
                 key, s, d, key, d);
        free(s);
        s = t;
    }
    return s;
}

/* Draws a reply of at most `left` tokens under g after prefix with random logits, as a
 * session does; returns whether the document (prefix and reply, in doc) came out whole;
 * *shaped: the budget left a token out. */
static int budget_reply(kvp_grammar *g, const char *prefix, int left, uint64_t seed,
                        uint32_t *mask, float *logits, int *shaped, char *doc, size_t cap)
{
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_assert_eq(kvp_gmatch_bind(&m, &trie), 0);
    size_t len = strlen(prefix);
    cr_assert_eq(kvp_gmatch_accept(&m, prefix, len), 0);
    cr_assert_lt(len, cap);
    memcpy(doc, prefix, len);
    cr_assert_leq(kvp_gmatch_distance(&m), left);
    kvp_sampler sp;
    cr_assert_eq(kvp_sampler_init(&sp, 32000, 1.0f, 1.0f, seed), 0);
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    *shaped = 0;
    int whole = 0;
    for (int t = 0; t < left; t++) {
        int n = kvp_gmatch_mask_left(&m, &trie, mask, left - t);
        *shaped |= m.shaped;
        cr_assert_gt(n, 0);
        for (int i = 0; i < 32000; i++)
            logits[i] = 8.0f * kvp_rand_f32(&rng);
        kvp_grammar_apply_mask(logits, mask, 32000);
        int id = kvp_sample(&sp, logits);
        cr_assert((mask[id >> 5] >> (id & 31)) & 1);
        if (id == 2)
            break;
        size_t pl = 0;
        const char *p = kvp_tokenizer_piece(&tok, -1, id, &pl);
        cr_assert_eq(kvp_gmatch_accept(&m, p, pl), 0);
        cr_assert_lt(len + pl, cap);
        memcpy(doc + len, p, pl);
        len += pl;
        /* the invariant the rule keeps: the rest still fits */
        cr_assert_leq(kvp_gmatch_distance(&m), left - t - 1);
    }
    doc[len] = 0;
    whole = kvp_gmatch_complete(&m);
    kvp_gmatch_free(&m);
    kvp_sampler_free(&sp);
    return whole;
}

Test(grammar, the_length_budget_ends_every_reply_whole, .init = load, .fini = unload)
{
    char *text = deep_schema(5, 40);
    json_t *s = json_loads(text, 0, NULL);
    cr_assert(s);
    char err[256];
    kvp_grammar *g = kvp_schema_compile(s, err, sizeof err);
    cr_assert(g, "%s", err);
    int bytes = kvp_grammar_min_len(g);
    cr_expect_gt(bytes, 5 * 40);
    /* in tokens: the long keys count as the few tokens that spell them */
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_assert_eq(kvp_gmatch_bind(&m, &trie), 0);
    int need = kvp_gmatch_distance(&m);
    kvp_gmatch_free(&m);
    cr_expect_lt(need, bytes * 3 / 4, "%d tokens for %d bytes", need, bytes);
    cr_expect_gt(need, 5 * 4);
    uint32_t *mask = calloc((32000 + 31) / 32, sizeof *mask);
    float *logits = malloc(32000 * sizeof *logits);
    char *doc = malloc(1 << 16);
    int shaped_n = 0, runs = 0;
    for (int extra = 0; extra <= 24; extra += 6)
        for (uint64_t seed = 1; seed <= 6; seed++) {
            int shaped;
            int whole = budget_reply(g, "", need + extra, seed * 7919 + (uint64_t)extra, mask,
                                     logits, &shaped, doc, 1 << 16);
            cr_expect(whole, "budget %d seed %llu: '%s'", need + extra,
                      (unsigned long long)seed, doc);
            cr_expect(tu_grammar_whole(g, doc));
            json_t *v = json_loads(doc, JSON_DECODE_ANY, NULL);
            cr_expect(v, "not JSON: '%s'", doc);
            json_decref(v);
            shaped_n += shaped;
            runs++;
        }
    /* random logits wander: at budgets this tight the rule always has work to do */
    cr_expect_eq(shaped_n, runs);
    free(doc);
    free(logits);
    free(mask);
    json_decref(s);
    free(text);
    kvp_grammar_unref(g);
}

Test(grammar, far_from_the_limit_masks_are_the_plain_ones_and_cached, .init = load,
     .fini = unload)
{
    json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},"
                           "\"required\":[\"name\"]}", 0, NULL);
    char err[256];
    kvp_grammar *g = kvp_schema_compile(s, err, sizeof err);
    json_decref(s);
    cr_assert(g, "%s", err);
    size_t words = (32000 + 31) / 32;
    uint32_t *plain = calloc(words, sizeof *plain), *budget = calloc(words, sizeof *budget);
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    const char *pre = "{\"name\": \"ab";
    cr_assert_eq(kvp_gmatch_accept(&m, pre, strlen(pre)), 0);
    int n = kvp_gmatch_mask(&m, &trie, plain);
    int k = kvp_gmatch_mask_left(&m, &trie, budget, 1000);
    cr_expect_eq(k, n);
    cr_expect_eq(m.shaped, 0);
    cr_expect_arr_eq(plain, budget, words * sizeof *plain);
    long hits = m.cache_hits;
    k = kvp_gmatch_mask_left(&m, &trie, budget, 1000);
    cr_expect_eq(m.cache_hits, hits + 1);
    cr_expect_eq(k, n);
    cr_expect_arr_eq(plain, budget, words * sizeof *plain);
    /* near the limit, yet the string's own distance fits: the cached mask less its far
     * tokens that do not, the same as a fresh walk gives */
    for (int left = 3; left <= 12; left++) {
        long h0 = m.cache_hits;
        int kc = kvp_gmatch_mask_left(&m, &trie, budget, left), sc = m.shaped;
        cr_expect_eq(m.cache_hits, h0 + 1, "left %d: from the cache", left);
        kvp_gmatch f;
        cr_assert_eq(kvp_gmatch_init(&f, g), 0);
        cr_assert_eq(kvp_gmatch_accept(&f, pre, strlen(pre)), 0);
        int kf = kvp_gmatch_mask_left(&f, &trie, plain, left);
        cr_expect_eq(f.cache_hits, 0);
        cr_expect_eq(kc, kf, "left %d", left);
        cr_expect_eq(sc, f.shaped, "left %d", left);
        cr_expect_arr_eq(plain, budget, words * sizeof *plain, "left %d", left);
        if (left == 3)
            cr_expect(sc, "three tokens left: the tokens opening more are left out");
        kvp_gmatch_free(&f);
    }
    kvp_gmatch_mask(&m, &trie, plain);
    hits = m.cache_hits - 1;
    /* two tokens left with "}" and the quote to go: only the tokens that end the string
     * there or spell the whole rest; the cached mask is not given */
    cr_expect_eq(kvp_gmatch_distance(&m), 2);
    k = kvp_gmatch_mask_left(&m, &trie, budget, 2);
    cr_expect_eq(m.cache_hits, hits + 1);
    cr_expect(m.shaped);
    cr_expect_gt(k, 0);
    cr_expect_lt(k, n);
    for (int id = 0; id < 32000; id++) {
        if (!((budget[id >> 5] >> (id & 31)) & 1))
            continue;
        cr_expect((plain[id >> 5] >> (id & 31)) & 1);
        size_t pl = 0;
        const char *p = kvp_tokenizer_piece(&tok, -1, id, &pl);
        char buf[256];
        snprintf(buf, sizeof buf, "%s%.*s", pre, (int)pl, p);
        cr_expect_leq(dist_after(g, buf), 1, "token '%.*s'", (int)pl, p);
    }
    /* one token left: only those that finish it */
    k = kvp_gmatch_mask_left(&m, &trie, budget, 1);
    cr_expect_gt(k, 0);
    for (int id = 0; id < 32000; id++)
        if ((budget[id >> 5] >> (id & 31)) & 1) {
            size_t pl = 0;
            const char *p = kvp_tokenizer_piece(&tok, -1, id, &pl);
            cr_expect_eq(pl, 2);
            cr_expect(!memcmp(p, "\"}", 2));
        }
    kvp_gmatch_free(&m);
    free(plain);
    free(budget);
    kvp_grammar_unref(g);
}

/* The schemas built for the most work per mask, from the costly place their prefix
 * reaches, under a tight length budget: even where walks are cut short, every reply
 * ends whole. */
Test(grammar, the_length_budget_finishes_the_hostile_schemas, .init = load, .fini = unload)
{
    hostile h[16];
    int n = hostile_schemas(h);
    uint32_t *mask = calloc((32000 + 31) / 32, sizeof *mask);
    float *logits = malloc(32000 * sizeof *logits);
    char *doc = malloc(1 << 16);
    for (int i = 0; i < n; i++) {
        json_t *js = json_loads(h[i].schema, 0, NULL);
        char err[256];
        kvp_grammar *g = kvp_schema_compile(js, err, sizeof err);
        json_decref(js);
        cr_assert(g, "schema %d: %s", i, err);
        kvp_gmatch m;
        cr_assert_eq(kvp_gmatch_init(&m, g), 0);
        cr_assert_eq(kvp_gmatch_bind(&m, &trie), 0);
        cr_assert_eq(kvp_gmatch_accept(&m, h[i].prefix, strlen(h[i].prefix)), 0);
        int need = kvp_gmatch_distance(&m);
        kvp_gmatch_free(&m);
        for (uint64_t seed = 1; seed <= 2; seed++) {
            int shaped;
            int whole = budget_reply(g, h[i].prefix, need + 4 * (int)seed, seed + 31 * (uint64_t)i,
                                     mask, logits, &shaped, doc, 1 << 16);
            cr_expect(whole, "schema %d seed %llu: '%s'", i, (unsigned long long)seed, doc);
            cr_expect(tu_grammar_whole(g, doc), "schema %d: '%s'", i, doc);
        }
        kvp_grammar_unref(g);
        free(h[i].schema);
    }
    free(doc);
    free(logits);
    free(mask);
}
