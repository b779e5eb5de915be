/* Integration: logprobs through the OpenAI API. Chat completions' `logprobs` and
 * `top_logprobs` (OpenAI's choices[].logprobs.content shape, streamed and not) and the
 * legacy completions' `logprobs: N` (tokens, token_logprobs, top_logprobs, text_offset):
 * the values are the engine's log-softmax at temperature 1 for the same tokens (checked
 * against the model run in-process), the top alternative is the greedy token, the
 * alternatives' mass is at most 1, a stop string's cut trims them, and every malformed
 * or out-of-range field is refused naming it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/model.h"
#include "model/template.h"
#include "tests/daemon/harness.h"

TestSuite(logprobs, .timeout = 120);

static int call(const kvpd_proc *d, const char *path, const char *body, json_t **out,
                char **raw_out)
{
    char *mine = NULL, **raw = raw_out ? raw_out : &mine;
    const char *rb = NULL;
    int status = h_request(d->port, "POST", path, NULL, body, raw, &rb);
    if (out)
        *out = rb ? json_loads(rb, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    free(mine);
    return status;
}

static void expect_error(const kvpd_proc *d, const char *path, const char *body,
                         const char *param)
{
    json_t *j;
    int got = call(d, path, body, &j, NULL);
    cr_expect_eq(got, 400, "%s %s: %d", path, body, got);
    json_t *e = json_object_get(j, "error");
    const char *p = json_string_value(json_object_get(e, "param"));
    cr_expect(p && !strcmp(p, param), "%s %s: param %s", path, body, p ? p : "null");
    json_decref(j);
}

static json_t *choice0(json_t *j)
{
    return json_array_get(json_object_get(j, "choices"), 0);
}

/* The bytes of a content entry appended to buf. */
static size_t add_bytes(json_t *entry, char *buf, size_t n, size_t cap)
{
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(entry, "bytes"), i, b) {
        cr_assert_lt(n, cap);
        buf[n++] = (char)json_integer_value(b);
    }
    return n;
}

/* Each content entry: top_logprobs holds `top` alternatives, most likely first, the
 * greedy token first among them, mass at most 1, logprob <= 0. */
static void check_entries(json_t *content, int top, int greedy)
{
    size_t i;
    json_t *e;
    json_array_foreach(content, i, e) {
        double lp = json_number_value(json_object_get(e, "logprob"));
        cr_assert_leq(lp, 0.0);
        cr_assert(json_is_string(json_object_get(e, "token")));
        json_t *alts = json_object_get(e, "top_logprobs");
        cr_assert_eq(json_array_size(alts), (size_t)top, "entry %zu", i);
        double mass = 0, prev = 0;
        size_t k;
        json_t *a;
        json_array_foreach(alts, k, a) {
            double v = json_number_value(json_object_get(a, "logprob"));
            if (k)
                cr_assert_leq(v, prev);
            prev = v;
            mass += exp(v);
            cr_assert(json_is_array(json_object_get(a, "bytes")));
        }
        cr_assert_leq(mass, 1.0 + 1e-5, "entry %zu: mass %g", i, mass);
        if (greedy && top > 0) {
            json_t *a0 = json_array_get(alts, 0);
            cr_assert(json_equal(json_object_get(a0, "bytes"), json_object_get(e, "bytes")),
                      "greedy: the most likely alternative is the token drawn (%zu)", i);
            cr_assert_float_eq(json_number_value(json_object_get(a0, "logprob")), lp, 1e-9);
        }
        if (top > 0)
            cr_assert_leq(lp, json_number_value(json_object_get(json_array_get(alts, 0),
                                                                "logprob")) + 1e-9);
    }
}

/* Two content entries (or arrays of them) alike: the same tokens and bytes, logprobs
 * equal up to float rounding (a cached prefix may split a later prefill differently). */
static int same_entries(json_t *a, json_t *b)
{
    if (json_is_array(a)) {
        if (!json_is_array(b) || json_array_size(a) != json_array_size(b))
            return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same_entries(json_array_get(a, i), json_array_get(b, i)))
                return 0;
        return 1;
    }
    json_t *ta = json_object_get(a, "top_logprobs"), *tb = json_object_get(b, "top_logprobs");
    return json_equal(json_object_get(a, "token"), json_object_get(b, "token")) &&
           json_equal(json_object_get(a, "bytes"), json_object_get(b, "bytes")) &&
           fabs(json_number_value(json_object_get(a, "logprob")) -
                json_number_value(json_object_get(b, "logprob"))) < 1e-4 &&
           (!ta == !tb) && (!ta || same_entries(ta, tb));
}

#define CHAT_BODY(extra) "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}]," \
                         "\"max_tokens\":16,\"temperature\":0" extra "}"

Test(logprobs, chat_completions_whole_and_streamed)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    json_t *j;
    cr_assert_eq(call(&d, "/v1/chat/completions",
                      CHAT_BODY(",\"logprobs\":true,\"top_logprobs\":3"), &j, NULL), 200);
    json_t *content = json_object_get(json_object_get(choice0(j), "logprobs"), "content");
    cr_assert(json_is_array(content));
    long n = (long)json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                      "completion_tokens"));
    const char *text = json_string_value(json_object_get(json_object_get(choice0(j), "message"),
                                                         "content"));
    cr_assert(text);
    const char *finish = json_string_value(json_object_get(choice0(j), "finish_reason"));
    if (!strcmp(finish, "length"))
        cr_assert_eq((long)json_array_size(content), n, "one entry per generated token");
    check_entries(content, 3, 1);
    char bytes[4096];
    size_t nb = 0, i;
    json_t *e;
    json_array_foreach(content, i, e)
        nb = add_bytes(e, bytes, nb, sizeof bytes);
    cr_assert_eq(nb, strlen(text), "the tokens' bytes spell the content");
    cr_assert(!memcmp(bytes, text, nb));

    /* streamed: the chunks' entries, in order, are the same */
    char *raw;
    cr_assert_eq(call(&d, "/v1/chat/completions",
                      CHAT_BODY(",\"logprobs\":true,\"top_logprobs\":3,\"stream\":true"), NULL,
                      &raw), 200);
    json_t *all = json_array();
    for (const char *p = strstr(raw, "data: {"); p; p = strstr(p + 1, "data: {")) {
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        cr_assert(c, "%s", p);
        json_t *lp = json_object_get(choice0(c), "logprobs");
        json_t *delta = json_object_get(choice0(c), "delta");
        if (json_is_string(json_object_get(delta, "content")) &&
            json_string_length(json_object_get(delta, "content")) > 0)
            cr_assert(json_is_array(json_object_get(lp, "content")),
                      "a content chunk carries logprobs: %s", p);
        json_array_extend(all, json_object_get(lp, "content"));
        json_decref(c);
    }
    cr_assert(same_entries(all, content), "streamed %zu entries, whole %zu",
              json_array_size(all), json_array_size(content));
    json_decref(all);
    free(raw);

    /* top_logprobs 0 (or absent): entries with no alternatives; no logprobs: null */
    json_decref(j);
    cr_assert_eq(call(&d, "/v1/chat/completions", CHAT_BODY(",\"logprobs\":true"), &j, NULL),
                 200);
    content = json_object_get(json_object_get(choice0(j), "logprobs"), "content");
    cr_assert_gt(json_array_size(content), 0);
    check_entries(content, 0, 1);
    json_decref(j);
    cr_assert_eq(call(&d, "/v1/chat/completions", CHAT_BODY(""), &j, NULL), 200);
    cr_assert(json_is_null(json_object_get(choice0(j), "logprobs")));
    json_decref(j);

    /* sampled at temperature 1: still the model's values, the drawn token at most as
     * likely as the most likely one */
    cr_assert_eq(call(&d, "/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
                      "\"max_tokens\":16,\"temperature\":1,\"seed\":3,\"logprobs\":true,"
                      "\"top_logprobs\":20}", &j, NULL), 200);
    check_entries(json_object_get(json_object_get(choice0(j), "logprobs"), "content"), 20, 0);
    json_decref(j);
    kvpd_stop(&d, 5000);
}

/* A stop string cuts the reply: the entries are those of the tokens whose text is
 * returned, and their bytes are the content's beginning. */
Test(logprobs, trimmed_at_a_stop_string)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    json_t *j;
    cr_assert_eq(call(&d, "/v1/chat/completions", CHAT_BODY(",\"logprobs\":true"), &j, NULL),
                 200);
    json_t *full = json_object_get(json_object_get(choice0(j), "logprobs"), "content");
    cr_assert_geq(json_array_size(full), 6);
    const char *text = json_string_value(json_object_get(json_object_get(choice0(j), "message"),
                                                         "content"));
    char bytes[4096];
    size_t at = 0;
    for (size_t i = 0; i < 4; i++)
        at = add_bytes(json_array_get(full, i), bytes, at, sizeof bytes);
    /* two bytes starting one byte into the 5th token: the cut falls inside it */
    char stop[3] = {text[at + 1], text[at + 2], 0};
    cr_assert(strstr(text, stop) == text + at + 1, "the stop string first appears there");
    char body[512];
    snprintf(body, sizeof body, CHAT_BODY(",\"logprobs\":true,\"stop\":\"%s\""), stop);
    for (int stream = 0; stream < 2; stream++) {
        json_t *k;
        char *raw = NULL;
        char sbody[600];
        snprintf(sbody, sizeof sbody, "%.*s%s}", (int)strlen(body) - 1, body,
                 stream ? ",\"stream\":true" : "");
        cr_assert_eq(call(&d, "/v1/chat/completions", sbody, &k, &raw), 200);
        json_t *got = json_array();
        char content[4096] = "";
        if (!stream) {
            json_array_extend(got, json_object_get(json_object_get(choice0(k), "logprobs"),
                                                   "content"));
            snprintf(content, sizeof content, "%s", json_string_value(json_object_get(
                         json_object_get(choice0(k), "message"), "content")));
        } else {
            for (const char *p = strstr(raw, "data: {"); p; p = strstr(p + 1, "data: {")) {
                json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
                json_array_extend(got, json_object_get(json_object_get(choice0(c), "logprobs"),
                                                       "content"));
                const char *dc = json_string_value(json_object_get(
                    json_object_get(choice0(c), "delta"), "content"));
                if (dc)
                    strncat(content, dc, sizeof content - strlen(content) - 1);
                json_decref(c);
            }
        }
        cr_assert_eq(strlen(content), at + 1, "%s: the reply ends before the stop string",
                     stream ? "stream" : "whole");
        cr_assert_eq(json_array_size(got), 4, "%s: the 4 tokens wholly returned, not %zu",
                     stream ? "stream" : "whole", json_array_size(got));
        for (size_t i = 0; i < 4; i++)
            cr_assert(same_entries(json_array_get(got, i), json_array_get(full, i)));
        json_decref(got);
        json_decref(k);
        free(raw);
    }
    json_decref(j);
    kvpd_stop(&d, 5000);
}

/* The legacy completions' shape, and its values against the model run in-process:
 * greedy from the prompt's tokens, log-softmax in double at each step. */
Test(logprobs, completions_legacy_shape_matches_the_engine)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--kv-type f32"), 0);
    const char *prompt = "Once upon a time";
    json_t *j;
    /* the daemon's default q8_0 cache rounds its rows: f32 ones, as the reference keeps */
    cr_assert_eq(call(&d, "/v1/completions",
                      "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,"
                      "\"logprobs\":5}", &j, NULL), 200);
    json_t *lp = json_object_get(choice0(j), "logprobs");
    json_t *tokens = json_object_get(lp, "tokens"), *values = json_object_get(lp, "token_logprobs"),
           *tops = json_object_get(lp, "top_logprobs"), *offs = json_object_get(lp, "text_offset");
    size_t n = json_array_size(tokens);
    cr_assert_gt(n, 0);
    cr_assert_eq(json_array_size(values), n);
    cr_assert_eq(json_array_size(tops), n);
    cr_assert_eq(json_array_size(offs), n);
    cr_assert_eq(json_integer_value(json_array_get(offs, 0)), (json_int_t)strlen(prompt),
                 "text_offset counts from the prompt's start");
    const char *text = json_string_value(json_object_get(choice0(j), "text"));
    size_t off = strlen(prompt);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(json_integer_value(json_array_get(offs, i)), (json_int_t)off);
        const char *t = json_string_value(json_array_get(tokens, i));
        cr_assert(!strncmp(text + off - strlen(prompt), t, strlen(t)), "token %zu", i);
        off += strlen(t);
        cr_assert_leq(json_object_size(json_array_get(tops, i)), 5);
        json_t *mine = json_object_get(json_array_get(tops, i), t);
        cr_assert(mine, "greedy: token %zu is among its top alternatives", i);
    }
    cr_assert_eq(off - strlen(prompt), strlen(text));

    /* the engine, in-process, on the same tokens */
    kvp_model m;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, h_shared("models/stories260K.bin"),
                                h_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    kvp_template tpl;
    char note[256];
    cr_assert_geq(kvp_template_init(&tpl, &m, NULL, note, sizeof note), 0);
    int *ids = NULL;
    int np = kvp_template_turn(&tpl, NULL, 0, 1, 0, prompt, strlen(prompt), &ids);
    cr_assert_gt(np, 0);
    kvp_runstate rs;
    kvp_cache cache;
    const kvp_model_config *cfg = &m.cfg;
    cr_assert_eq(kvp_runstate_init(&rs, cfg, np), 0);
    cr_assert_eq(kvp_cache_init(&cache, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &cfg->rope), 0);
    cr_assert_eq(kvp_forward(&m, &rs, &cache, ids, np, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        const float *l = rs.logits;
        int best = 0;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < cfg->vocab_size; v++) {
            if (l[v] > l[best])
                best = v;
            mx = l[v] > mx ? l[v] : mx;
        }
        for (int v = 0; v < cfg->vocab_size; v++)
            sum += exp((double)l[v] - mx);
        double want = (double)l[best] - mx - log(sum);
        double got = json_number_value(json_array_get(values, i));
        cr_expect(fabs(got - want) < 1e-3, "token %zu: %g, the engine's %g", i, got, want);
        cr_assert_eq(kvp_forward(&m, &rs, &cache, &best, 1, NULL), 0);
    }
    kvp_cache_free(&cache);
    kvp_runstate_free(&rs);
    free(ids);
    kvp_template_free(&tpl);
    kvp_model_free(&m);

    /* streamed: the chunks' logprobs put together are the whole answer's */
    char *raw;
    cr_assert_eq(call(&d, "/v1/completions",
                      "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,"
                      "\"logprobs\":5,\"stream\":true}", NULL, &raw), 200);
    json_t *st = json_array(), *so = json_array();
    for (const char *p = strstr(raw, "data: {"); p; p = strstr(p + 1, "data: {")) {
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        json_t *l = json_object_get(choice0(c), "logprobs");
        json_array_extend(st, json_object_get(l, "tokens"));
        json_array_extend(so, json_object_get(l, "text_offset"));
        json_decref(c);
    }
    cr_assert(json_equal(st, tokens), "streamed tokens");
    cr_assert(json_equal(so, offs), "streamed offsets");
    json_decref(st);
    json_decref(so);
    json_decref(j);
    free(raw);
    kvpd_stop(&d, 5000);
}

Test(logprobs, bad_fields_are_refused_naming_them)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    const char *chat = "/v1/chat/completions", *cmpl = "/v1/completions";
    expect_error(&d, chat, CHAT_BODY(",\"logprobs\":true,\"top_logprobs\":21"), "top_logprobs");
    expect_error(&d, chat, CHAT_BODY(",\"logprobs\":true,\"top_logprobs\":-1"), "top_logprobs");
    expect_error(&d, chat, CHAT_BODY(",\"logprobs\":true,\"top_logprobs\":2.5"), "top_logprobs");
    expect_error(&d, chat, CHAT_BODY(",\"logprobs\":true,\"top_logprobs\":\"3\""), "top_logprobs");
    expect_error(&d, chat, CHAT_BODY(",\"top_logprobs\":3"), "top_logprobs");
    expect_error(&d, chat, CHAT_BODY(",\"logprobs\":false,\"top_logprobs\":3"), "top_logprobs");
    expect_error(&d, chat, CHAT_BODY(",\"logprobs\":\"yes\""), "logprobs");
    expect_error(&d, chat, CHAT_BODY(",\"logprobs\":1"), "logprobs");
    expect_error(&d, chat, CHAT_BODY(",\"logprobs\":[true]"), "logprobs");
    expect_error(&d, cmpl, "{\"prompt\":\"a\",\"logprobs\":21}", "logprobs");
    expect_error(&d, cmpl, "{\"prompt\":\"a\",\"logprobs\":-1}", "logprobs");
    expect_error(&d, cmpl, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs");
    expect_error(&d, cmpl, "{\"prompt\":\"a\",\"logprobs\":\"5\"}", "logprobs");
    expect_error(&d, cmpl, "{\"prompt\":\"a\",\"logprobs\":1.5}", "logprobs");
    expect_error(&d, cmpl, "{\"prompt\":\"a\",\"logprobs\":2,\"top_logprobs\":2}", "top_logprobs");
    expect_error(&d, "/v1/responses", "{\"input\":\"a\",\"top_logprobs\":2}", "top_logprobs");
    /* it keeps serving */
    json_t *j;
    cr_assert_eq(call(&d, chat, CHAT_BODY(",\"logprobs\":false"), &j, NULL), 200);
    cr_assert(json_is_null(json_object_get(choice0(j), "logprobs")));
    json_decref(j);
    kvpd_stop(&d, 5000);
}
