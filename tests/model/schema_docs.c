/* Random schemas and the documents decoded under them, for tests/model/schema_ref.py:
 * a seeded generator draws schemas from the subset model/schema.c supports (bounds past
 * 2^53, exclusive and float bounds, negative zero, enums, patterns, lengths, counts,
 * objects with optional properties, anyOf, $ref, type lists), each is compiled, and
 * documents are decoded under it as a session does (the mask of the llama2 tokenizer's
 * trie, a random allowed token, its bytes accepted, the stop token once allowed now and
 * then). Prints one JSON line per document: {"schema": S, "doc": TEXT}; a schema the
 * compiler refuses is skipped (counted on stderr).
 *
 * --budget: every reply has a length limit between the schema's shortest document and
 * 20 tokens more, kept by the length budget (kvp_gmatch_mask_left); every other schema
 * is a hostile one (objects nested deep, long required keys, required arrays with a
 * minimum of long strings), and every reply is printed however it ended, so one the
 * budget failed to finish fails the checker.
 *
 *   schema_docs TOKENIZER.bin [--seed N] [--schemas N] [--docs N] [--budget] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/grammar.h"
#include "model/schema.h"
#include "model/tokenizer.h"

static uint64_t rng;

static unsigned rnd(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

static json_t *big(void)
{
    static const long long v[] = {0, 1, -1, 7, 9007199254740992LL, 9007199254740993LL,
                                  -9007199254740993LL, 1152921504606846977LL,
                                  -1152921504606846977LL, 999999999999999LL, 100, -100};
    long long x = v[rnd(sizeof v / sizeof v[0])];
    return json_integer(x + (long long)rnd(3) - 1);
}

/* A bound: an integer (often a large one), a whole or fractional real, or negative zero. */
static json_t *bound_value(int integer_only)
{
    switch (rnd(integer_only ? 2 : 5)) {
    case 0: return json_integer((long long)rnd(200) - 100);
    case 1: return big();
    case 2: return json_real((double)((int)rnd(40) - 20));
    case 3: return json_real(-0.0);
    default: return json_real(((int)rnd(400) - 200) / 8.0);
    }
}

static void add_bounds(json_t *s, int integer)
{
    if (rnd(4) == 0) {   /* a narrow range past 2^53 */
        json_t *lo = big();
        long long v = json_integer_value(lo);
        json_object_set_new(s, rnd(2) ? "minimum" : "exclusiveMinimum", lo);
        json_object_set_new(s, rnd(2) ? "maximum" : "exclusiveMaximum",
                            json_integer(v + (long long)rnd(4)));
        return;
    }
    static const char *const k[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++)
        if (rnd(3) == 0)
            json_object_set_new(s, k[i], bound_value(!integer));
}

static json_t *schema(int depth, json_t *defs);

static json_t *object_schema(int depth, json_t *defs)
{
    json_t *p = json_object(), *req = json_array();
    int n = (int)rnd(4);
    for (int i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, rnd(4) ? "k%d" : "k\\u00e9\"%d", i);
        json_object_set_new(p, key, schema(depth + 1, defs));
        if (rnd(2))
            json_array_append_new(req, json_string(key));
    }
    json_t *o = json_pack("{s:s, s:o, s:o}", "type", "object", "properties", p, "required", req);
    if (rnd(2))
        json_object_set_new(o, "additionalProperties", json_false());
    return o;
}

static json_t *schema(int depth, json_t *defs)
{
    static const char *const pats[] = {"^[a-c]+x?$", "d|e", "^\\d{2,4}-[A-Z]$", "^(ab|c)*$",
                                       "^[^\"\\\\]{0,3}$", "^\\w+\\s?$", "q.r", "^$"};
    static const char *const types[] = {"string", "integer", "number", "boolean", "null",
                                        "object", "array"};
    switch (rnd(depth > 3 ? 8 : 13)) {
    case 0: {
        json_t *s = json_pack("{s:s}", "type", "integer");
        add_bounds(s, 1);
        return s;
    }
    case 1: {
        json_t *s = json_pack("{s:s}", "type", "number");
        add_bounds(s, 0);
        return s;
    }
    case 2: {
        json_t *s = json_pack("{s:s}", "type", "string");
        if (rnd(2))
            json_object_set_new(s, "minLength", json_integer(rnd(3)));
        if (rnd(2))
            json_object_set_new(s, "maxLength", json_integer(rnd(8)));
        return s;
    }
    case 3: return json_pack("{s:s, s:s}", "type", "string", "pattern", pats[rnd(8)]);
    case 4: return json_pack("{s:[s, i, n, b, f, o]}", "enum", "a\"b\\u00e9", (int)rnd(9) - 4, 1,
                             1.5, json_pack("{s:[i]}", "x", 1));
    case 5: return json_pack("{s:o}", "const", big());
    case 6: return json_pack("{s:s}", "type", types[rnd(7)]);
    case 7: {
        json_t *s = json_pack("{s:[s, s]}", "type", "integer", "null");
        add_bounds(s, 1);
        return s;
    }
    case 8: return object_schema(depth, defs);
    case 9: {
        json_t *a = json_pack("{s:s, s:o}", "type", "array", "items", schema(depth + 1, defs));
        unsigned lo = rnd(3);
        if (rnd(2))
            json_object_set_new(a, "minItems", json_integer(lo));
        json_object_set_new(a, "maxItems", json_integer(lo + rnd(3)));
        return a;
    }
    case 10: return json_pack("{s:[o, o]}", rnd(2) ? "anyOf" : "oneOf", schema(depth + 1, defs),
                              schema(depth + 1, defs));
    case 11: {
        char name[16];
        snprintf(name, sizeof name, "d%zu", json_object_size(defs));
        json_object_set_new(defs, name, schema(depth + 1, defs));
        char ref[32];
        snprintf(ref, sizeof ref, "#/$defs/%s", name);
        return json_pack("{s:s}", "$ref", ref);
    }
    default: return json_pack("{s:o}", "allOf", json_pack("[o]", schema(depth + 1, defs)));
    }
}

/* Objects nested 1 to 6 deep, each with a required key of up to 40 bytes holding the
 * next, a required array of at least 1 to 3 strings of at least 1 to 6 characters, and
 * an optional number. */
static json_t *hostile(void)
{
    json_t *s = json_pack("{s:s, s:i}", "type", "string", "minLength", 1 + (int)rnd(4));
    for (int d = 0, depth = 1 + (int)rnd(6); d < depth; d++) {
        char key[48], list[16];
        int n = 1 + (int)rnd(40);
        for (int i = 0; i < n; i++)
            key[i] = (char)('a' + rnd(26));
        key[n] = 0;
        snprintf(list, sizeof list, "l%d", d);
        json_t *arr = json_pack("{s:s, s:{s:s, s:i}, s:i}", "type", "array", "items", "type",
                                "string", "minLength", 1 + (int)rnd(6), "minItems",
                                1 + (int)rnd(3));
        json_t *props = json_pack("{s:o, s:o, s:{s:s}}", key, s, list, arr, "opt", "type",
                                  "number");
        s = json_pack("{s:s, s:o, s:[s,s]}", "type", "object", "properties", props, "required",
                      key, list);
    }
    return s;
}

int main(int argc, char **argv)
{
    const char *tok_path = NULL;
    int n_schemas = 120, n_docs = 2, budget = 0;
    rng = 0x9E3779B97F4A7C15ull;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            rng ^= strtoull(argv[++i], NULL, 10) * 0xD1B54A32D192ED03ull;
        else if (!strcmp(argv[i], "--schemas") && i + 1 < argc)
            n_schemas = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--docs") && i + 1 < argc)
            n_docs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--budget"))
            budget = 1;
        else
            tok_path = argv[i];
    }
    if (!tok_path || !rng) {
        fprintf(stderr, "usage: schema_docs TOKENIZER.bin [--seed N] [--schemas N] [--docs N]\n");
        return 2;
    }
    kvp_tokenizer tok;
    kvp_vocab_trie tr;
    char err[512];
    if (kvp_tokenizer_load_file(&tok, tok_path, 32000, err, sizeof err) < 0 ||
        kvp_vocab_trie_build(&tr, &tok) < 0) {
        fprintf(stderr, "schema_docs: %s: %s\n", tok_path, err);
        return 1;
    }
    tr.n_end = 1;
    tr.end_tok[0] = 2;   /* </s> */
    uint32_t *mask = calloc(((size_t)tr.vocab_size + 31) / 32, sizeof *mask);
    char *doc = malloc(1 << 16);
    int refused = 0, written = 0, unfinished = 0;
    for (int k = 0; k < n_schemas; k++) {
        json_t *defs = json_object();
        json_t *s = budget && k % 2 ? hostile() : schema(0, defs);
        if (json_object_size(defs))
            json_object_set(s, "$defs", defs);
        json_decref(defs);
        kvp_grammar *g = kvp_schema_compile(s, err, sizeof err);
        if (!g) {
            refused++;
            json_decref(s);
            continue;
        }
        for (int d = 0; d < n_docs; d++) {
            kvp_gmatch m;
            if (kvp_gmatch_init(&m, g) < 0)
                return 1;
            size_t len = 0;
            int done = 0, limit = 60;
            if (budget) {
                limit = kvp_gmatch_distance(&m) + (int)rnd(21);
                done = 1;   /* printed however it ends */
                if (kvp_gmatch_bind(&m, &tr) < 0)
                    return 1;
            }
            for (int t = 0; t < limit; t++) {
                int n = budget ? kvp_gmatch_mask_left(&m, &tr, mask, limit - t)
                               : kvp_gmatch_mask(&m, &tr, mask);
                if (n <= 0)
                    break;
                int end_ok = (mask[0] >> 2) & 1;
                if (end_ok && (n == 1 || rnd(3) == 0)) {
                    done = 1;
                    break;
                }
                int pick = (int)rnd((unsigned)(n - end_ok)), id = -1;
                for (int i = 0; i < tr.vocab_size && id < 0; i++)
                    if (i != 2 && ((mask[i >> 5] >> (i & 31)) & 1) && pick-- == 0)
                        id = i;
                size_t pl = 0;
                const char *p = kvp_tokenizer_piece(&tok, -1, id, &pl);
                if (len + pl >= (1 << 16) || kvp_gmatch_accept(&m, p, pl) < 0) {
                    fprintf(stderr, "schema_docs: an allowed token was refused\n");
                    return 1;
                }
                memcpy(doc + len, p, pl);
                len += pl;
            }
            kvp_gmatch_free(&m);
            if (!done) {
                unfinished++;
                continue;
            }
            json_t *line = json_pack("{s:O, s:s%}", "schema", s, "doc", doc, len);
            if (!line) {   /* not UTF-8: say so, the checker fails on it */
                printf("{\"schema\": null, \"doc\": null}\n");
                continue;
            }
            char *txt = json_dumps(line, JSON_COMPACT);
            printf("%s\n", txt);
            free(txt);
            json_decref(line);
            written++;
        }
        kvp_grammar_unref(g);
        json_decref(s);
    }
    fprintf(stderr, "schema_docs: %d documents, %d unfinished in 60 tokens, %d schemas refused\n",
            written, unfinished, refused);
    free(mask);
    free(doc);
    kvp_vocab_trie_free(&tr);
    kvp_tokenizer_free(&tok);
    return 0;
}
