/* model/grammar.c, grammar_trie.c: the matcher follows a hand-built recursive grammar,
 * refuses without changing state, and the trie walk's mask equals testing every token of
 * a real vocabulary one by one. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
