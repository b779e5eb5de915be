/* Integration: llama.cpp's server's own endpoints on a real kvpd (web/oai_llama.c and
 * /completion in web/oai_completions.c): /completion with a text prompt and with token
 * ids (the same greedy reply for the same tokens), its stream (content chunks, then the
 * stop chunk with timings, no [DONE]), stop words and stop_type, cache_prompt, every
 * refused or malformed field, return_tokens, n_probs, ignore_eos, a logit_bias by text,
 * response_fields and cache_n; /tokenize (ids, pieces, BOS) and /detokenize round trips
 * and their bad input; /props, /slots and /health. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/daemon/harness.h"

TestSuite(llama, .timeout = 120);

/* A request; the body parsed as JSON into *out (NULL when not JSON; may be NULL). */
static int call(const kvpd_proc *d, const char *method, const char *path, const char *body,
                json_t **out, char **raw_out)
{
    char *mine = NULL, **raw = raw_out ? raw_out : &mine;
    const char *rb = NULL;
    int status = h_request(d->port, method, path, NULL, body, raw, &rb);
    if (out)
        *out = rb ? json_loads(rb, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    free(mine);
    return status;
}

/* A 400 (or status) naming param in the OpenAI error shape; the daemon still serves. */
static void expect_refused(const kvpd_proc *d, const char *path, const char *body, int status,
                           const char *param)
{
    json_t *j;
    int got = call(d, "POST", path, body, &j, NULL);
    cr_expect_eq(got, status, "%s %s: %d", path, body, got);
    json_t *e = json_object_get(j, "error");
    cr_expect(json_is_string(json_object_get(e, "message")), "%s %s: no message", path, body);
    const char *p = json_string_value(json_object_get(e, "param"));
    if (param)
        cr_expect(p && !strcmp(p, param), "%s %s: param %s", path, body, p ? p : "null");
    json_decref(j);
}

static json_t *tokenize(const kvpd_proc *d, const char *body)
{
    json_t *j;
    cr_assert_eq(call(d, "POST", "/tokenize", body, &j, NULL), 200, "%s", body);
    return j;
}

Test(llama, completion_of_text_and_of_its_tokens_agree)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    json_t *t = tokenize(&d, "{\"content\":\"Once upon a time\",\"add_special\":true}");
    json_t *ids = json_object_get(t, "tokens");
    cr_assert(json_array_size(ids) >= 2, "tokens");
    char *ids_s = json_dumps(ids, JSON_COMPACT);

    json_t *a;
    cr_assert_eq(call(&d, "POST", "/completion", "{\"prompt\":\"Once upon a time\","
                      "\"n_predict\":6,\"temperature\":0,\"cache_prompt\":false}", &a, NULL), 200);
    const char *text = json_string_value(json_object_get(a, "content"));
    cr_assert(text && *text, "content");
    cr_expect(json_is_true(json_object_get(a, "stop")));
    cr_expect_eq(json_integer_value(json_object_get(a, "tokens_predicted")), 6);
    cr_expect_str_eq(json_string_value(json_object_get(a, "stop_type")), "limit");
    /* the text prompt ran as exactly the tokens /tokenize gives with add_special */
    cr_expect_eq(json_integer_value(json_object_get(a, "tokens_evaluated")),
                 (json_int_t)json_array_size(ids));
    json_t *tm = json_object_get(a, "timings");
    cr_expect_eq(json_integer_value(json_object_get(tm, "predicted_n")), 6);
    cr_expect(json_is_number(json_object_get(tm, "prompt_ms")));
    json_t *gs = json_object_get(a, "generation_settings");
    cr_expect_eq(json_integer_value(json_object_get(gs, "n_predict")), 6);
    cr_expect_float_eq(json_number_value(json_object_get(gs, "temperature")), 0.0, 1e-9);
    cr_expect_str_eq(json_string_value(json_object_get(a, "prompt")), "Once upon a time");

    char body[2048];
    snprintf(body, sizeof body, "{\"prompt\":%s,\"n_predict\":6,\"temperature\":0}", ids_s);
    json_t *b;
    cr_assert_eq(call(&d, "POST", "/completion", body, &b, NULL), 200, "%s", body);
    cr_expect_str_eq(json_string_value(json_object_get(b, "content")), text);
    cr_expect_eq(json_integer_value(json_object_get(b, "tokens_evaluated")),
                 (json_int_t)json_array_size(ids));

    /* without BOS the tokens differ, and so may the reply: the ids are taken as they are */
    json_t *nobos = tokenize(&d, "{\"content\":\"Once upon a time\"}");
    cr_expect_eq(json_array_size(json_object_get(nobos, "tokens")) + 1, json_array_size(ids));
    free(ids_s);
    json_decref(nobos);
    json_decref(a);
    json_decref(b);
    json_decref(t);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

/* timings.prompt_n (the tokens prefilled) of a completion of body. */
static long prefilled(const kvpd_proc *d, const char *body, long *evaluated)
{
    json_t *j;
    cr_assert_eq(call(d, "POST", "/completion", body, &j, NULL), 200, "%s", body);
    long n = (long)json_integer_value(json_object_get(json_object_get(j, "timings"), "prompt_n"));
    *evaluated = (long)json_integer_value(json_object_get(j, "tokens_evaluated"));
    json_decref(j);
    return n;
}

Test(llama, cache_prompt_reuses_an_earlier_prompt_unless_false)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    json_t *a;
    cr_assert_eq(call(&d, "POST", "/completion", "{\"prompt\":\"Once upon a time\","
                      "\"n_predict\":8,\"temperature\":0}", &a, NULL), 200);
    json_t *req = json_pack("{s:s++, s:i, s:i, s:b}", "prompt", "Once upon a time",
                            json_string_value(json_object_get(a, "content")), " and",
                            "n_predict", 2, "temperature", 0, "cache_prompt", 0);
    char *more = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    cr_assert(more);
    long evaluated;
    /* cache_prompt false: the whole prompt is prefilled */
    cr_expect_eq(prefilled(&d, more, &evaluated), evaluated, "%s", more);
    /* the default (true): the prompt that extends the first one reuses its cache */
    char *p = strstr(more, "\"cache_prompt\":false");
    cr_assert(p);
    memcpy(p, "\"cache_prompt\":true ", 20);
    long n = prefilled(&d, more, &evaluated);
    cr_expect_lt(n, evaluated / 2, "prefilled %ld of %ld: %s", n, evaluated, more);
    free(more);
    json_decref(a);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

Test(llama, completion_stream_ends_with_the_stop_chunk)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    char *raw = NULL;
    cr_assert_eq(call(&d, "POST", "/completion", "{\"prompt\":\"Once upon\",\"n_predict\":5,"
                      "\"temperature\":0,\"stream\":true}", NULL, &raw), 200);
    cr_expect(strstr(raw, "text/event-stream"), "%s", raw);
    cr_expect(!strstr(raw, "[DONE]"), "%s", raw);
    json_t *whole;
    cr_assert_eq(call(&d, "POST", "/completion", "{\"prompt\":\"Once upon\",\"n_predict\":5,"
                      "\"temperature\":0}", &whole, NULL), 200);
    /* the chunks' content adds up to the whole answer's; the last one has stop true */
    char text[4096] = "";
    int chunks = 0, stops = 0, streamed = 0;
    json_t *last = NULL;
    for (char *p = strstr(raw, "data: "); p; p = strstr(p + 1, "data: ")) {
        json_t *j = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        cr_assert(j, "chunk %d is not JSON: %.80s", chunks, p);
        chunks++;
        strncat(text, json_string_value(json_object_get(j, "content")),
                sizeof text - strlen(text) - 1);
        if (json_is_true(json_object_get(j, "stop")))
            stops++;
        else   /* as llama.cpp's chunks: the ids of the tokens each completes */
            streamed += (int)json_array_size(json_object_get(j, "tokens"));
        cr_expect(json_is_array(json_object_get(j, "tokens")), "chunk %d has no tokens", chunks);
        json_decref(last);
        last = j;
    }
    cr_expect_geq(chunks, 2);
    cr_expect_eq(stops, 1);
    cr_expect(json_is_true(json_object_get(last, "stop")), "the stop chunk is last");
    cr_expect_eq(json_integer_value(json_object_get(last, "tokens_predicted")), 5);
    cr_expect(json_is_object(json_object_get(last, "timings")));
    cr_expect_str_eq(json_string_value(json_object_get(last, "stop_type")), "limit");
    cr_expect_str_eq(text, json_string_value(json_object_get(whole, "content")));
    cr_expect(streamed >= 1 && streamed <= 5, "%d tokens streamed", streamed);
    json_decref(last);
    json_decref(whole);
    free(raw);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

/* The ids of a JSON array of token ids, in ids[0..*n). */
static void ids_of(json_t *a, int *ids, int cap, int *n)
{
    size_t i;
    json_t *e;
    *n = 0;
    json_array_foreach(a, i, e) {
        cr_assert(json_is_integer(e), "a token id: %s", json_dumps(e, JSON_ENCODE_ANY));
        if (*n < cap)
            ids[(*n)++] = (int)json_integer_value(e);
    }
}

Test(llama, tokens_probabilities_biases_and_fields)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 400"), 0, "log %s", d.log);
    const char *P = "/completion";
    /* return_tokens: the reply's ids, which detokenize to its content */
    json_t *a;
    cr_assert_eq(call(&d, "POST", P, "{\"prompt\":\"Once upon a time\",\"n_predict\":6,"
                      "\"temperature\":0,\"return_tokens\":true,\"n_probs\":3}", &a, NULL), 200);
    int ids[64], n;
    ids_of(json_object_get(a, "tokens"), ids, 64, &n);
    cr_assert_eq(n, 6);
    json_t *tok = json_pack("{s:O}", "tokens", json_object_get(a, "tokens"));
    char *tb = json_dumps(tok, JSON_COMPACT);
    json_t *dt;
    cr_assert_eq(call(&d, "POST", "/detokenize", tb, &dt, NULL), 200);
    cr_expect_str_eq(json_string_value(json_object_get(dt, "content")),
                     json_string_value(json_object_get(a, "content")));
    free(tb);
    json_decref(tok);
    json_decref(dt);
    /* n_probs: each token's logprob and its alternatives, the greedy token the likeliest */
    json_t *cp = json_object_get(a, "completion_probabilities");
    cr_assert_eq(json_array_size(cp), 6);
    for (int i = 0; i < 6; i++) {
        json_t *e = json_array_get(cp, (size_t)i), *top = json_object_get(e, "top_logprobs");
        cr_expect_eq(json_integer_value(json_object_get(e, "id")), ids[i]);
        cr_expect_leq(json_number_value(json_object_get(e, "logprob")), 0.0);
        cr_expect(json_is_array(json_object_get(e, "bytes")));
        cr_expect(json_is_string(json_object_get(e, "token")));
        cr_assert(json_array_size(top) >= 1 && json_array_size(top) <= 3);
        cr_expect_eq(json_integer_value(json_object_get(json_array_get(top, 0), "id")), ids[i]);
    }
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(a, "generation_settings"),
                                                    "n_probs")), 3);
    cr_expect_eq(json_array_size(json_object_get(json_object_get(a, "generation_settings"),
                                                 "logit_bias")), 0);
    /* a text's tokens take its bias: banned, they are listed and none is written */
    json_t *b;
    cr_assert_eq(call(&d, "POST", P, "{\"prompt\":\"Once upon a time\",\"n_predict\":6,"
                      "\"temperature\":0,\"return_tokens\":true,"
                      "\"logit_bias\":[[\",\",false]]}", &b, NULL), 200);
    json_t *comma = tokenize(&d, "{\"content\":\",\"}");
    json_t *lb = json_object_get(json_object_get(b, "generation_settings"), "logit_bias");
    cr_assert_eq(json_array_size(lb), json_array_size(json_object_get(comma, "tokens")));
    size_t i;
    json_t *e;
    json_array_foreach(lb, i, e) {
        cr_expect(json_is_null(json_object_get(e, "bias")), "a ban is null (-inf)");
        cr_expect(json_equal(json_object_get(e, "token"),
                             json_array_get(json_object_get(comma, "tokens"), i)));
    }
    int bids[64], bn;
    ids_of(json_object_get(b, "tokens"), bids, 64, &bn);
    for (int k = 0; k < bn; k++)
        for (size_t m = 0; m < json_array_size(lb); m++)
            cr_expect_neq(bids[k], json_integer_value(json_object_get(json_array_get(lb, m), "token")));
    cr_expect(!strchr(json_string_value(json_object_get(b, "content")), ','));
    json_decref(comma);
    json_decref(b);
    /* ignore_eos: the greedy story that ends runs on to its limit */
    json_t *end, *on;
    cr_assert_eq(call(&d, "POST", P, "{\"prompt\":\"Lily was happy\",\"n_predict\":400,"
                      "\"temperature\":0}", &end, NULL), 200);
    cr_assert_str_eq(json_string_value(json_object_get(end, "stop_type")), "eos",
                     "this test needs a reply that ends before 400 tokens");
    cr_assert_eq(call(&d, "POST", P, "{\"prompt\":\"Lily was happy\",\"n_predict\":400,"
                      "\"temperature\":0,\"ignore_eos\":true}", &on, NULL), 200);
    cr_expect_str_eq(json_string_value(json_object_get(on, "stop_type")), "limit");
    cr_expect_eq(json_integer_value(json_object_get(on, "tokens_predicted")), 400);
    lb = json_object_get(json_object_get(on, "generation_settings"), "logit_bias");
    cr_expect_geq(json_array_size(lb), 1);
    json_array_foreach(lb, i, e)
        cr_expect(json_is_null(json_object_get(e, "bias")));
    /* no return_tokens: tokens is empty; the same prompt again reuses its cache */
    cr_expect_eq(json_array_size(json_object_get(on, "tokens")), 0);
    json_t *tm = json_object_get(on, "timings");
    cr_expect_gt(json_integer_value(json_object_get(tm, "cache_n")), 0);
    cr_expect_eq(json_integer_value(json_object_get(tm, "cache_n")) +
                 json_integer_value(json_object_get(tm, "prompt_n")),
                 json_integer_value(json_object_get(on, "tokens_evaluated")));
    json_decref(end);
    json_decref(on);
    /* json_schema: the reply is one of the schema's documents */
    json_t *js;
    cr_assert_eq(call(&d, "POST", P, "{\"prompt\":\"Once upon\",\"n_predict\":8,"
                      "\"json_schema\":{\"const\":\"42\"}}", &js, NULL), 200);
    cr_expect_str_eq(json_string_value(json_object_get(js, "content")), "\"42\"");
    json_decref(js);
    expect_refused(&d, P, "{\"prompt\":\"x\",\"json_schema\":{\"type\":\"hiccup\"}}", 400,
                   "json_schema");
    /* llama.cpp's object prompt {"prompt_string"} runs as that text */
    json_t *s1, *s2;
    cr_assert_eq(call(&d, "POST", P, "{\"prompt\":{\"prompt_string\":\"Once upon\"},"
                      "\"n_predict\":5,\"temperature\":0}", &s1, NULL), 200);
    cr_assert_eq(call(&d, "POST", P, "{\"prompt\":\"Once upon\",\"n_predict\":5,"
                      "\"temperature\":0}", &s2, NULL), 200);
    cr_expect_str_eq(json_string_value(json_object_get(s1, "content")),
                     json_string_value(json_object_get(s2, "content")));
    cr_expect_str_eq(json_string_value(json_object_get(s1, "prompt")), "Once upon");
    json_decref(s1);
    json_decref(s2);
    /* response_fields: only the paths asked for, each under its path */
    json_t *f;
    cr_assert_eq(call(&d, "POST", P, "{\"prompt\":\"Once upon a time\",\"n_predict\":3,"
                      "\"response_fields\":[\"content\",\"timings/predicted_n\",\"nope/x\"]}",
                      &f, NULL), 200);
    cr_expect_eq(json_object_size(f), 2);
    cr_expect(json_is_string(json_object_get(f, "content")));
    cr_expect_eq(json_integer_value(json_object_get(f, "timings/predicted_n")), 3);
    json_decref(f);
    json_decref(a);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

Test(llama, stop_words_and_the_eos_stop_type)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    json_t *a;
    cr_assert_eq(call(&d, "POST", "/completion", "{\"prompt\":\"Once upon\",\"n_predict\":12,"
                      "\"temperature\":0}", &a, NULL), 200);
    const char *text = json_string_value(json_object_get(a, "content"));
    cr_assert(strlen(text) > 4, "%s", text);
    /* a stop word from the middle of the greedy reply */
    char word[8], body[256];
    snprintf(word, sizeof word, "%.3s", text + strlen(text) / 2);
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon\",\"n_predict\":12,\"temperature\":0,"
             "\"stop\":[\"zzzq\",\"%s\"]}", word);
    json_t *b;
    cr_assert_eq(call(&d, "POST", "/completion", body, &b, NULL), 200, "%s", body);
    cr_expect_str_eq(json_string_value(json_object_get(b, "stop_type")), "word", "%s", body);
    cr_expect_str_eq(json_string_value(json_object_get(b, "stopping_word")), word);
    const char *cut = json_string_value(json_object_get(b, "content"));
    cr_expect(!strstr(cut, word), "%s holds %s", cut, word);
    cr_expect(!strncmp(text, cut, strlen(cut)), "%s is not a prefix of %s", cut, text);
    json_decref(a);
    json_decref(b);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

Test(llama, completion_refuses_bad_and_unknown_fields)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    const char *P = "/completion";
    expect_refused(&d, P, "{\"prompt\":\"x\",", 400, NULL);
    expect_refused(&d, P, "[1,2]", 400, NULL);
    expect_refused(&d, P, "{\"n_predict\":3}", 400, "prompt");
    expect_refused(&d, P, "{\"prompt\":\"\"}", 400, "prompt");
    expect_refused(&d, P, "{\"prompt\":[]}", 400, "prompt");
    expect_refused(&d, P, "{\"prompt\":7}", 400, "prompt");
    expect_refused(&d, P, "{\"prompt\":[1,\"a\"]}", 400, "prompt[1]");
    expect_refused(&d, P, "{\"prompt\":[[1,2]]}", 400, "prompt[0]");
    expect_refused(&d, P, "{\"prompt\":[1,99999]}", 400, "prompt[1]");
    expect_refused(&d, P, "{\"prompt\":[-1]}", 400, "prompt[0]");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"n_predict\":\"5\"}", 400, "n_predict");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"n_predict\":0}", 400, "n_predict");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"n_predict\":-2}", 400, "n_predict");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"top_k\":1.5}", 400, "top_k");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"top_p\":2}", 400, "top_p");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"seed\":\"a\"}", 400, "seed");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"stop\":5}", 400, "stop");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"stream\":1}", 400, "stream");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"cache_prompt\":\"yes\"}", 400, "cache_prompt");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"repeat_penalty\":0}", 400, "repeat_penalty");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"logit_bias\":[[1]]}", 400, "logit_bias");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"logit_bias\":[[99999,1]]}", 400, NULL);
    /* fields kvpd cannot honour, and unknown ones, are refused by name */
    expect_refused(&d, P, "{\"prompt\":\"x\",\"n_probs\":21}", 400, "n_probs");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"n_probs\":1.5}", 400, "n_probs");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"mirostat\":2}", 400, "mirostat");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"ignore_eos\":\"yes\"}", 400, "ignore_eos");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"return_tokens\":1}", 400, "return_tokens");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"response_fields\":[1]}", 400, "response_fields");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"response_fields\":\"content\"}", 400,
                   "response_fields");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"stream\":true,\"response_fields\":[\"content\"]}",
                   400, "response_fields");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"logit_bias\":[[\"\",false]]}", 400, "logit_bias");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"post_sampling_probs\":true}", 400,
                   "post_sampling_probs");
    expect_refused(&d, P, "{\"prompt\":{\"prompt_string\":\"x\",\"multimodal_data\":[\"AA==\"]}}",
                   400, "prompt.multimodal_data");
    expect_refused(&d, P, "{\"prompt\":{\"prompt_string\":\"x\",\"other\":1}}", 400, "prompt.other");
    expect_refused(&d, P, "{\"prompt\":{}}", 400, "prompt");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"grammar\":\"root ::= x\"}", 400, "grammar");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"id_slot\":3}", 400, "id_slot");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"repeat_penalty\":1.2,\"repeat_last_n\":64}", 400,
                   "repeat_last_n");
    expect_refused(&d, P, "{\"prompt\":\"x\",\"frobnicate\":1}", 400, "frobnicate");
    /* llama.cpp's neutral values are taken, and the daemon still serves */
    json_t *j;
    cr_expect_eq(call(&d, "POST", P, "{\"prompt\":\"x\",\"n_predict\":2,\"n_probs\":0,"
                      "\"id_slot\":-1,\"seed\":-1,\"typical_p\":1,\"cache_prompt\":true,"
                      "\"logit_bias\":[[5,false]],\"repeat_penalty\":1.1}", &j, NULL), 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "tokens_predicted")), 2);
    json_decref(j);
    /* a prompt of one token that is part of a character: run, echoed as valid text */
    json_t *t = tokenize(&d, "{\"content\":\"\u5abd\",\"with_pieces\":true}");
    json_t *first = NULL, *e;
    size_t k;
    json_array_foreach(json_object_get(t, "tokens"), k, e)
        if (!first && json_is_array(json_object_get(e, "piece")))   /* a byte token */
            first = e;
    cr_assert(first, "no byte token for a CJK character");
    {
        char body[128];
        snprintf(body, sizeof body, "{\"prompt\":[%lld],\"n_predict\":2}",
                 (long long)json_integer_value(json_object_get(first, "id")));
        cr_expect_eq(call(&d, "POST", P, body, &j, NULL), 200, "%s", body);
        cr_expect(json_is_string(json_object_get(j, "prompt")));
        json_decref(j);
    }
    json_decref(t);
    /* a body over max_body_bytes */
    size_t big = 2 << 20;
    char *body = malloc(big + 64);
    int n = snprintf(body, 64, "{\"prompt\":\"");
    memset(body + n, 'a', big);
    strcpy(body + n + big, "\"}");
    cr_expect_eq(call(&d, "POST", P, body, NULL, NULL), 413);
    free(body);
    cr_expect_eq(call(&d, "GET", "/health", "", NULL, NULL), 200);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

Test(llama, tokenize_and_detokenize)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    json_t *t = tokenize(&d, "{\"content\":\"Once upon a time\",\"with_pieces\":true}");
    json_t *toks = json_object_get(t, "tokens");
    cr_assert(json_array_size(toks) >= 2);
    /* the pieces spell the text; the ids detokenize back to it */
    char pieces[256] = "", ids[256] = "[";
    size_t i;
    json_t *e;
    json_array_foreach(toks, i, e) {
        cr_assert(json_is_integer(json_object_get(e, "id")));
        strncat(pieces, json_string_value(json_object_get(e, "piece")),
                sizeof pieces - strlen(pieces) - 1);
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%lld", i ? "," : "",
                 (long long)json_integer_value(json_object_get(e, "id")));
    }
    strcat(ids, "]");
    cr_expect(strstr(pieces, "Once upon a time"), "%s", pieces);
    char body[512];
    snprintf(body, sizeof body, "{\"tokens\":%s}", ids);
    json_t *dt;
    cr_assert_eq(call(&d, "POST", "/detokenize", body, &dt, NULL), 200);
    cr_expect(strstr(json_string_value(json_object_get(dt, "content")), "Once upon a time"),
              "%s", json_string_value(json_object_get(dt, "content")));
    json_decref(dt);
    cr_assert_eq(call(&d, "POST", "/detokenize", "{\"tokens\":[]}", &dt, NULL), 200);
    cr_expect_str_eq(json_string_value(json_object_get(dt, "content")), "");
    json_decref(dt);
    json_t *empty = tokenize(&d, "{\"content\":\"\"}");
    cr_expect_eq(json_array_size(json_object_get(empty, "tokens")), 0);
    json_decref(empty);

    expect_refused(&d, "/tokenize", "{\"content\":", 400, NULL);
    expect_refused(&d, "/tokenize", "{}", 400, "content");
    expect_refused(&d, "/tokenize", "{\"content\":5}", 400, "content");
    expect_refused(&d, "/tokenize", "{\"content\":\"a\",\"add_special\":1}", 400, "add_special");
    expect_refused(&d, "/tokenize", "{\"content\":\"a\",\"with_pieces\":\"y\"}", 400,
                   "with_pieces");
    expect_refused(&d, "/tokenize", "{\"content\":\"a\",\"parse_special\":true}", 400,
                   "parse_special");
    expect_refused(&d, "/tokenize", "{\"content\":\"a\",\"extra\":true}", 400, "extra");
    /* over the bound of a text tokenized on the loop */
    size_t big = 200 * 1024;
    char *long_body = malloc(big + 64);
    int n = snprintf(long_body, 64, "{\"content\":\"");
    memset(long_body + n, 'a', big);
    strcpy(long_body + n + big, "\"}");
    expect_refused(&d, "/tokenize", long_body, 400, "content");
    free(long_body);
    expect_refused(&d, "/detokenize", "{\"tokens\":\"1 2\"}", 400, "tokens");
    expect_refused(&d, "/detokenize", "{}", 400, "tokens");
    expect_refused(&d, "/detokenize", "{\"tokens\":[1,99999]}", 400, "tokens[1]");
    expect_refused(&d, "/detokenize", "{\"tokens\":[-3]}", 400, "tokens[0]");
    expect_refused(&d, "/detokenize", "{\"tokens\":[1.5]}", 400, "tokens[0]");
    expect_refused(&d, "/detokenize", "{\"tokens\":[1],\"x\":1}", 400, "x");
    json_decref(t);
    cr_expect_eq(call(&d, "GET", "/health", "", NULL, NULL), 200);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

Test(llama, props_slots_and_health)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-sessions 7 --temperature 0.5"), 0, "log %s", d.log);
    json_t *j;
    cr_assert_eq(call(&d, "GET", "/props", "", &j, NULL), 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "total_slots")), 7);
    json_t *dgs = json_object_get(j, "default_generation_settings");
    cr_expect_gt(json_integer_value(json_object_get(dgs, "n_ctx")), 0);
    cr_expect_float_eq(json_number_value(json_object_get(json_object_get(dgs, "params"),
                                                         "temperature")), 0.5, 1e-6);
    cr_expect(json_is_string(json_object_get(j, "chat_template")));
    cr_expect(strstr(json_string_value(json_object_get(j, "model_path")), "stories260K"));
    /* without fixed_seed a request without a seed gets a random one */
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(dgs, "params"), "seed")), -1);
    json_decref(j);
    cr_assert_eq(call(&d, "GET", "/slots", "", &j, NULL), 200);
    cr_expect(json_is_array(j));
    json_decref(j);
    cr_assert_eq(call(&d, "GET", "/health", "", &j, NULL), 200);
    cr_expect_str_eq(json_string_value(json_object_get(j, "status")), "ok");
    json_decref(j);
    /* the methods they take */
    cr_expect_eq(call(&d, "POST", "/props", "{}", NULL, NULL), 405);
    cr_expect_eq(call(&d, "GET", "/completion", "", NULL, NULL), 405);
    cr_expect_eq(call(&d, "GET", "/tokenize", "", NULL, NULL), 405);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

/* fixed_seed: a request without a seed samples with the server's, which /props and the
 * answer's generation_settings report; the same request gets the same reply */
Test(llama, fixed_seed_makes_a_request_reproducible)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--fixed-seed true --seed 1234 --temperature 1"), 0, "log %s", d.log);
    json_t *j;
    cr_assert_eq(call(&d, "GET", "/props", "", &j, NULL), 200);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(
                     json_object_get(j, "default_generation_settings"), "params"), "seed")), 1234);
    json_decref(j);
    const char *body = "{\"prompt\":\"Once upon a time\",\"n_predict\":24,\"cache_prompt\":false}";
    json_t *a, *b;
    cr_assert_eq(call(&d, "POST", "/completion", body, &a, NULL), 200);
    cr_assert_eq(call(&d, "POST", "/completion", body, &b, NULL), 200);
    cr_expect_str_eq(json_string_value(json_object_get(a, "content")),
                     json_string_value(json_object_get(b, "content")));
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(a, "generation_settings"),
                                                    "seed")), 1234);
    json_decref(b);
    /* seed -1 is still a random one: over a few tries some reply differs */
    int differs = 0;
    for (int i = 0; i < 4 && !differs; i++) {
        cr_assert_eq(call(&d, "POST", "/completion", "{\"prompt\":\"Once upon a time\","
                          "\"n_predict\":24,\"cache_prompt\":false,\"seed\":-1}", &b, NULL), 200);
        differs = strcmp(json_string_value(json_object_get(a, "content")),
                         json_string_value(json_object_get(b, "content"))) != 0;
        cr_expect_eq(json_integer_value(json_object_get(json_object_get(b, "generation_settings"),
                                                        "seed")), -1);
        json_decref(b);
    }
    cr_expect(differs, "seed -1 sampled the fixed seed's reply every time");
    json_decref(a);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

Test(llama, the_endpoints_take_the_api_key)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key s3cret,other"), 0, "log %s", d.log);
    cr_expect_eq(call(&d, "POST", "/tokenize", "{\"content\":\"a\"}", NULL, NULL), 401);
    cr_expect_eq(call(&d, "GET", "/props", "", NULL, NULL), 401);
    cr_expect_eq(call(&d, "POST", "/completion", "{\"prompt\":\"a\"}", NULL, NULL), 401);
    char *raw = NULL;
    const char *rb;
    cr_expect_eq(h_request(d.port, "POST", "/tokenize", "Authorization: Bearer s3cret\r\n",
                           "{\"content\":\"a\"}", &raw, &rb), 200, "%s", raw);
    free(raw);
    /* /slots: a key's own conversations, never another's, never their ids */
    cr_expect_eq(h_request(d.port, "POST", "/v1/chat/completions", "Authorization: Bearer s3cret\r\n",
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"Once\"}],"
                           "\"max_tokens\":2}", &raw, &rb), 200, "%s", raw);
    free(raw);
    cr_expect_eq(h_request(d.port, "GET", "/slots", "Authorization: Bearer s3cret\r\n", "",
                           &raw, &rb), 200, "%s", raw);
    json_t *mine = json_loads(rb, 0, NULL);
    cr_expect_eq(json_array_size(mine), 1, "%s", rb);
    json_t *slot = json_array_get(mine, 0);
    cr_expect(json_is_false(json_object_get(slot, "is_processing")), "%s", rb);
    cr_expect_eq(json_integer_value(json_object_get(slot, "n_turns")), 1, "%s", rb);
    cr_expect(!strstr(rb, "\"session\"") && !json_object_get(slot, "session_id"), "%s", rb);
    json_decref(mine);
    free(raw);
    cr_expect_eq(h_request(d.port, "GET", "/slots", "Authorization: Bearer other\r\n", "",
                           &raw, &rb), 200, "%s", raw);
    json_t *theirs = json_loads(rb, 0, NULL);
    cr_expect_eq(json_array_size(theirs), 0, "%s", rb);
    json_decref(theirs);
    free(raw);
    cr_expect_eq(call(&d, "GET", "/health", "", NULL, NULL), 200);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}
