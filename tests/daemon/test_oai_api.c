/* Integration: the OpenAI API's breadth over raw HTTP (web/oai_completions.c,
 * web/oai_responses.c, the routing of web/openai.c): model names (any name served,
 * model_alias, strict_model_name), the paths without /v1, /v1/completions (text, the
 * stream, a prompt extending an earlier one reuses its cache, every refused field),
 * /v1/responses (a chain through previous_response_id whose cached tokens grow, the
 * stream's event sequence, GET and DELETE, store false, tenants, bad input), and the
 * metrics by path, status and API error code, checked by promtool. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(oai_api, .timeout = 120);

/* A request; the body parsed as JSON into *out (NULL when not JSON; may be NULL). */
static int call(const kvpd_proc *d, const char *method, const char *path, const char *headers,
                const char *body, json_t **out, char **raw_out)
{
    char *mine = NULL, **raw = raw_out ? raw_out : &mine;
    const char *rb = NULL;
    int status = h_request(d->port, method, path, headers, body, raw, &rb);
    if (out)
        *out = rb ? json_loads(rb, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    free(mine);
    return status;
}

static const char *str(json_t *j, const char *path)
{
    /* a dotted path of object keys and array indexes */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *v = j;
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); v && k; k = strtok_r(NULL, ".", &save))
        v = (k[0] >= '0' && k[0] <= '9') ? json_array_get(v, (size_t)atoi(k))
                                          : json_object_get(v, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static long num(json_t *j, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *v = j;
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); v && k; k = strtok_r(NULL, ".", &save))
        v = (k[0] >= '0' && k[0] <= '9') ? json_array_get(v, (size_t)atoi(k))
                                          : json_object_get(v, k);
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

/* An error answer of this status whose param is `param` (NULL: any). */
static void expect_error(const kvpd_proc *d, const char *path, const char *body, int status,
                         const char *param)
{
    json_t *j;
    int got = call(d, "POST", path, NULL, body, &j, NULL);
    cr_expect_eq(got, status, "%s %s: %d", path, body, got);
    json_t *e = json_object_get(j, "error");
    cr_expect(json_is_string(json_object_get(e, "message")), "%s %s: no error", path, body);
    if (param)
        cr_expect(str(e, "param") && !strcmp(str(e, "param"), param), "%s %s: param %s",
                  path, body, str(e, "param") ? str(e, "param") : "null");
    json_decref(j);
}

#define CHAT(model) "{\"model\":\"" model "\",\"messages\":[{\"role\":\"user\",\"content\":\"Once\"}]," \
                    "\"max_tokens\":3}"

Test(oai_api, any_model_name_is_served_unless_strict_and_aliases_are_listed)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 8"), 0);
    json_t *j;
    cr_assert_eq(call(&d, "GET", "/v1/models", NULL, "", &j, NULL), 200);
    char real[128];
    snprintf(real, sizeof real, "%s", str(j, "data.0.id"));
    cr_assert_eq(json_array_size(json_object_get(j, "data")), 1);
    json_decref(j);
    const char *names[] = {"gpt-4o-mini", "gpt-3.5-turbo", "", real};
    for (int i = 0; i < 4; i++) {
        char body[256];
        snprintf(body, sizeof body, CHAT("%s"), names[i]);
        cr_assert_eq(call(&d, "POST", "/v1/chat/completions", NULL, body, &j, NULL), 200,
                     "%s", names[i]);
        cr_expect_str_eq(str(j, "model"), real, "the answer names the real model");
        json_decref(j);
    }
    expect_error(&d, "/v1/chat/completions", "{\"model\":7,\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}]}", 400, "model");
    cr_assert_eq(kvpd_stop(&d, 10000), 0);

    cr_assert_eq(kvpd_start(&d, "--max-tokens 8 --model-alias gpt-4o-mini,gpt-3.5-turbo "
                                "--strict-model-name true"), 0);
    cr_assert_eq(call(&d, "GET", "/models", NULL, "", &j, NULL), 200);
    cr_expect_eq(json_array_size(json_object_get(j, "data")), 2);
    cr_expect_str_eq(str(j, "data.0.id"), "gpt-4o-mini");
    cr_expect_str_eq(str(j, "data.1.id"), "gpt-3.5-turbo");
    json_decref(j);
    cr_expect_eq(call(&d, "POST", "/v1/chat/completions", NULL, CHAT("gpt-3.5-turbo"), &j,
                      NULL), 200);
    cr_expect_str_eq(str(j, "model"), real);
    json_decref(j);
    char body[256];
    snprintf(body, sizeof body, CHAT("%s"), real);
    cr_expect_eq(call(&d, "POST", "/v1/chat/completions", NULL, body, NULL, NULL), 200);
    expect_error(&d, "/v1/chat/completions", CHAT("gpt-4o"), 404, "model");
    expect_error(&d, "/v1/chat/completions", CHAT("gpt-4o-mini,gpt-3.5-turbo"), 404, "model");
    expect_error(&d, "/v1/completions", "{\"model\":\"gpt\",\"prompt\":\"x\"}", 404, "model");
    expect_error(&d, "/v1/responses", "{\"model\":\"gpt\",\"input\":\"x\"}", 404, "model");
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(oai_api, the_paths_without_v1_are_served_and_unknown_ones_are_json_404s)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 4"), 0);
    json_t *j;
    cr_expect_eq(call(&d, "POST", "/chat/completions", NULL, CHAT("x"), &j, NULL), 200);
    cr_expect_str_eq(str(j, "object"), "chat.completion");
    json_decref(j);
    cr_expect_eq(call(&d, "POST", "/completions", NULL, "{\"prompt\":\"Once\"}", &j, NULL), 200);
    cr_expect_str_eq(str(j, "object"), "text_completion");
    json_decref(j);
    cr_expect_eq(call(&d, "POST", "/responses", NULL, "{\"input\":\"Once\"}", &j, NULL), 200);
    cr_expect_str_eq(str(j, "object"), "response");
    json_decref(j);
    cr_expect_eq(call(&d, "GET", "/models", NULL, "", &j, NULL), 200);
    cr_expect_str_eq(str(j, "object"), "list");
    json_decref(j);
    const char *paths[] = {"/v1/nope", "/nope", "/v1/responses/a/b", "/completionsx"};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(call(&d, "GET", paths[i], NULL, "", &j, NULL), 404, "%s", paths[i]);
        cr_expect(json_is_string(json_object_get(json_object_get(j, "error"), "message")),
                  "%s", paths[i]);
        json_decref(j);
    }
    cr_expect_eq(call(&d, "GET", "/v1/completions", NULL, "", NULL, NULL), 405);
    cr_expect_eq(call(&d, "GET", "/responses", NULL, "", NULL, NULL), 405);
    cr_expect_eq(call(&d, "POST", "/v1/responses/resp_x", NULL, "{}", NULL, NULL), 405);
    cr_expect_eq(call(&d, "DELETE", "/v1/models", NULL, "", NULL, NULL), 405);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(oai_api, completions_answer_text_stream_and_reuse_the_cache_of_a_prompt_they_extend)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 64"), 0);
    json_t *j;
    cr_assert_eq(call(&d, "POST", "/v1/completions", NULL,
                      "{\"model\":\"gpt-3.5-turbo-instruct\",\"prompt\":\"Once upon a time\","
                      "\"max_tokens\":12}", &j, NULL), 200);
    cr_expect_str_eq(str(j, "object"), "text_completion");
    cr_expect(!strncmp(str(j, "id"), "cmpl-", 5));
    cr_expect_str_eq(str(j, "choices.0.finish_reason"), "length");
    cr_expect(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                           "logprobs")));
    cr_expect_eq(num(j, "usage.completion_tokens"), 12);
    cr_expect_eq(num(j, "usage.prompt_tokens_details.cached_tokens"), 0);
    const char *text = str(j, "choices.0.text");
    cr_assert(text && strlen(text) > 0);
    /* The next prompt is the first, its completion and more: only "more" is new. */
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time%s and then\",\"max_tokens\":4}",
             text);
    long first_total = num(j, "usage.total_tokens");
    json_decref(j);
    cr_assert_eq(call(&d, "POST", "/v1/completions", NULL, body, &j, NULL), 200);
    long cached = num(j, "usage.prompt_tokens_details.cached_tokens");
    cr_expect_geq(cached, first_total - 1, "cached %ld of the %ld tokens before", cached,
                  first_total);
    cr_expect_lt(num(j, "kvpd.prefilled_tokens"), num(j, "usage.prompt_tokens") - cached + 2);
    cr_expect_lt(num(j, "kvpd.prefilled_tokens"), 8, "only the new text is prefilled");
    json_decref(j);
    /* A prompt that shares nothing starts fresh. */
    cr_assert_eq(call(&d, "POST", "/v1/completions", NULL, "{\"prompt\":\"Tom had a dog\","
                      "\"max_tokens\":2}", &j, NULL), 200);
    cr_expect_eq(num(j, "usage.prompt_tokens_details.cached_tokens"), 0);
    json_decref(j);

    /* Streamed: text_completion chunks, the finish, the usage, [DONE]. */
    char *raw;
    cr_assert_eq(call(&d, "POST", "/v1/completions", NULL,
                      "{\"prompt\":\"Once upon a time\",\"max_tokens\":5,\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true}}", NULL, &raw), 200);
    cr_expect(strstr(raw, "text/event-stream"));
    int chunks = 0, finish = 0, usage = 0;
    for (const char *p = strstr(raw, "data: {"); p; p = strstr(p + 1, "data: {")) {
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        cr_assert(c, "%s", p);
        cr_expect_str_eq(str(c, "object"), "text_completion");
        if (str(c, "choices.0.finish_reason"))
            finish++;
        else if (json_array_size(json_object_get(c, "choices")))
            chunks++;
        if (json_object_get(c, "usage")) {
            usage++;
            cr_expect_eq(num(c, "usage.completion_tokens"), 5);
        }
        json_decref(c);
    }
    cr_expect_geq(chunks, 1);
    cr_expect_eq(finish, 1);
    cr_expect_eq(usage, 1);
    cr_expect(strstr(raw, "data: [DONE]\n\n"));
    free(raw);

    /* What it refuses, naming the field; it keeps serving. */
    expect_error(&d, "/v1/completions", "{}", 400, "prompt");
    expect_error(&d, "/v1/completions", "{\"prompt\":\"\"}", 400, "prompt");
    expect_error(&d, "/v1/completions", "{\"prompt\":7}", 400, "prompt");
    expect_error(&d, "/v1/completions", "{\"prompt\":[1,2,3]}", 400, "prompt");
    expect_error(&d, "/v1/completions", "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt");
    expect_error(&d, "/v1/completions", "{\"prompt\":\"a\",\"echo\":true}", 400, "echo");
    expect_error(&d, "/v1/completions", "{\"prompt\":\"a\",\"suffix\":\"z\"}", 400, "suffix");
    expect_error(&d, "/v1/completions", "{\"prompt\":\"a\",\"best_of\":2}", 400, "best_of");
    expect_error(&d, "/v1/completions", "{\"prompt\":\"a\",\"n\":2}", 400, "n");
    expect_error(&d, "/v1/completions", "{\"prompt\":\"a\",\"temperature\":9}", 400,
                 "temperature");
    expect_error(&d, "/v1/completions", "{\"prompt\":\"a\",\"stop\":[\"\"]}", 400, "stop");
    expect_error(&d, "/v1/completions", "{\"prompt\":\"a\"", 400, NULL);
    expect_error(&d, "/v1/completions", "[\"a\"]", 400, NULL);
    /* one prompt in an array is a prompt; a stop string ends the text before it */
    cr_assert_eq(call(&d, "POST", "/v1/completions", NULL, "{\"prompt\":[\"Once upon a time\"],"
                      "\"stop\":\" a\",\"max_tokens\":30}", &j, NULL), 200);
    cr_expect(!strstr(str(j, "choices.0.text"), " a"), "%s", str(j, "choices.0.text"));
    cr_expect_str_eq(str(j, "choices.0.finish_reason"), "stop");
    json_decref(j);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* A synthetic model of a 320-token context (random weights, greedy: its replies do not
 * end by themselves), written into a new directory dir. */
static void synth_ctx320(char *dir, size_t dir_len, char *model, size_t model_len)
{
    char cmd[1024];
    cr_assert_eq(h_mkdtemp(dir, dir_len), 0);
    snprintf(model, model_len, "%s/ctx320.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s synth --out %s --dim 64 --hidden 128 --layers 2 --heads 4 "
             "--kv-heads 2 --vocab 512 --ctx 320 --seed 7 >/dev/null 2>&1",
             h_build("tools/kvp"), model);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* The /chat websocket: the session frame's max_tokens, and one message's done frame. */
static json_t *ws_reply(const kvpd_proc *d, int max_tokens, json_int_t *cap)
{
    ws_client c;
    cr_assert_eq(h_connect(d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(&c, "session", 5000);
    cr_assert(s);
    *cap = json_integer_value(json_object_get(s, "max_tokens"));
    json_decref(s);
    json_t *done = h_turn(&c, "Once upon a time", max_tokens, NULL);
    cr_assert(done);
    ws_close(&c);
    return done;
}

static long stat_of(json_t *done, const char *key)
{
    return num(json_object_get(done, "stats"), key);
}

/* A request without a limit (max_tokens, max_completion_tokens, max_output_tokens, a /chat
 * message's max_tokens) runs to the end of its turn or the context; the max_tokens setting
 * is only a ceiling (0, the default: none but the context), which a larger request's
 * limit is cut to on the API and refused over on /chat. */
Test(oai_api, without_a_limit_a_reply_runs_to_the_context_and_the_setting_is_a_ceiling)
{
    char dir[64], model[128], extra[256];
    synth_ctx320(dir, sizeof dir, model, sizeof model);
    /* no eviction: the reply stops when the prompt and it fill the context */
    snprintf(extra, sizeof extra, "--model %s --max-tokens 0 --budget 0", model);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, extra), 0, "kvpd did not start (log %s)", d.log);
    json_t *j;
    cr_assert_eq(call(&d, "POST", "/v1/chat/completions", NULL, "{\"messages\":[{\"role\":"
                      "\"user\",\"content\":\"Once upon a time\"}]}", &j, NULL), 200);
    cr_expect_str_eq(str(j, "choices.0.finish_reason"), "length");
    cr_expect_gt(num(j, "usage.completion_tokens"), 256);
    cr_expect_eq(num(j, "usage.prompt_tokens") + num(j, "usage.completion_tokens"), 320,
                 "prompt %ld + reply %ld", num(j, "usage.prompt_tokens"),
                 num(j, "usage.completion_tokens"));
    json_decref(j);
    cr_assert_eq(call(&d, "POST", "/v1/responses", NULL, "{\"input\":\"Once upon a time\"}", &j,
                      NULL), 200);
    cr_expect_gt(num(j, "usage.output_tokens"), 256);
    cr_expect_eq(num(j, "usage.input_tokens") + num(j, "usage.output_tokens"), 320);
    cr_expect_str_eq(str(j, "status"), "incomplete");
    json_decref(j);
    /* a limit in the request still holds */
    cr_assert_eq(call(&d, "POST", "/v1/chat/completions", NULL, "{\"messages\":[{\"role\":"
                      "\"user\",\"content\":\"Once\"}],\"max_completion_tokens\":5}", &j, NULL),
                 200);
    cr_expect_eq(num(j, "usage.completion_tokens"), 5);
    json_decref(j);
    json_int_t cap;
    json_t *done = ws_reply(&d, 0, &cap);
    cr_expect_eq(cap, 320, "the session frame names the context as the ceiling");
    cr_expect_str_eq(str(done, "type"), "done", "%s", str(done, "message"));
    cr_expect_str_eq(str(done, "stats.stop"), "length");
    cr_expect_gt(stat_of(done, "generated_tokens"), 256);
    json_decref(done);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);

    /* With eviction the context shifts: a reply without a limit is at most the context's
     * length in tokens. */
    snprintf(extra, sizeof extra, "--model %s --max-tokens 0", model);
    cr_assert_eq(kvpd_start(&d, extra), 0, "kvpd did not start (log %s)", d.log);
    cr_assert_eq(call(&d, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once\"}", &j, NULL),
                 200);
    cr_expect_eq(num(j, "usage.completion_tokens"), 320);
    cr_expect_str_eq(str(j, "choices.0.finish_reason"), "length");
    json_decref(j);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);

    /* The operator's ceiling: a request without a limit, or over it, stops there. */
    snprintf(extra, sizeof extra, "--model %s --max-tokens 100 --budget 0", model);
    cr_assert_eq(kvpd_start(&d, extra), 0, "kvpd did not start (log %s)", d.log);
    static const char *const over[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Once\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Twice\"}],\"max_tokens\":200}",
    };
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(call(&d, "POST", "/v1/chat/completions", NULL, over[i], &j, NULL), 200);
        cr_expect_eq(num(j, "usage.completion_tokens"), 100, "%s", over[i]);
        cr_expect_str_eq(str(j, "choices.0.finish_reason"), "length");
        json_decref(j);
    }
    cr_assert_eq(call(&d, "POST", "/v1/responses", NULL, "{\"input\":\"Thrice\","
                      "\"max_output_tokens\":200}", &j, NULL), 200);
    cr_expect_eq(num(j, "usage.output_tokens"), 100);
    cr_expect_str_eq(str(j, "incomplete_details.reason"), "max_output_tokens");
    json_decref(j);
    done = ws_reply(&d, 0, &cap);
    cr_expect_eq(cap, 100);
    cr_expect_eq(stat_of(done, "generated_tokens"), 100);
    json_decref(done);
    /* on /chat a message over the ceiling is refused, naming it */
    done = ws_reply(&d, 101, &cap);
    cr_expect_str_eq(str(done, "type"), "error");
    cr_expect(str(done, "message") && strstr(str(done, "message"), "max_tokens is limited to 100"),
              "%s", str(done, "message"));
    json_decref(done);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(dir);
}

/* POST /v1/responses; the answer's id into id (when not NULL). */
static json_t *respond(const kvpd_proc *d, const char *headers, const char *body, char *id)
{
    json_t *j;
    int status = call(d, "POST", "/v1/responses", headers, body, &j, NULL);
    cr_assert_eq(status, 200, "%s: %d", body, status);
    cr_assert_str_eq(str(j, "object"), "response");
    if (id)
        snprintf(id, 64, "%s", str(j, "id"));
    return j;
}

Test(oai_api, responses_chain_through_previous_response_id_with_growing_cached_tokens)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 64"), 0);
    char id[3][64], body[512];
    long cached[3];
    for (int i = 0; i < 3; i++) {
        if (i == 0)
            snprintf(body, sizeof body, "{\"model\":\"gpt-4o\",\"instructions\":\"A story.\","
                     "\"input\":\"Once upon a time\",\"max_output_tokens\":6}");
        else
            snprintf(body, sizeof body, "{\"instructions\":\"A story.\",\"input\":[{\"role\":"
                     "\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\" Then %d\"}]}],"
                     "\"previous_response_id\":\"%s\",\"max_output_tokens\":6}", i, id[i - 1]);
        json_t *j = respond(&d, NULL, body, id[i]);
        cr_expect(!strncmp(id[i], "resp_", 5));
        cached[i] = num(j, "usage.input_tokens_details.cached_tokens");
        cr_expect_eq(num(j, "usage.output_tokens"), 6);
        cr_expect_str_eq(str(j, "status"), "incomplete");
        cr_expect_str_eq(str(j, "incomplete_details.reason"), "max_output_tokens");
        cr_expect_str_eq(str(j, "output.0.type"), "message");
        cr_expect_str_eq(str(j, "output.0.content.0.type"), "output_text");
        cr_expect_str_eq(str(j, "output.0.content.0.text"), str(j, "output_text"));
        if (i > 0) {
            cr_expect_str_eq(str(j, "previous_response_id"), id[i - 1]);
            cr_expect_gt(cached[i], cached[i - 1], "turn %d: cached %ld after %ld", i,
                         cached[i], cached[i - 1]);
            /* only the new input (and the template's tokens) is prefilled */
            cr_expect_lt(num(j, "kvpd.prefilled_tokens"), 8);
        }
        json_decref(j);
    }
    cr_expect_eq(cached[0], 0);
    /* Different instructions: the conversation (the chain's history, then "x") is not that
     * session's, so it does not continue it; a new session forks the token prefix the two
     * renderings share (stories260K's template does not render the instructions), never
     * the whole prompt, and prefills the rest. */
    snprintf(body, sizeof body, "{\"instructions\":\"Other.\",\"input\":\"x\","
             "\"previous_response_id\":\"%s\",\"max_output_tokens\":2}", id[2]);
    json_t *j = respond(&d, NULL, body, NULL);
    long other_cached = num(j, "usage.input_tokens_details.cached_tokens");
    cr_expect_lt(other_cached, num(j, "usage.input_tokens"));
    cr_expect_eq(num(j, "kvpd.prefilled_tokens"), num(j, "usage.input_tokens") - other_cached);
    json_decref(j);

    /* GET gives the stored object; DELETE removes it; then 404 and continuing it is 400. */
    char path[128];
    snprintf(path, sizeof path, "/v1/responses/%s", id[1]);
    cr_assert_eq(call(&d, "GET", path, NULL, "", &j, NULL), 200);
    cr_expect_str_eq(str(j, "id"), id[1]);
    cr_expect_str_eq(str(j, "previous_response_id"), id[0]);
    json_decref(j);
    cr_assert_eq(call(&d, "DELETE", path, NULL, "", &j, NULL), 200);
    cr_expect(json_is_true(json_object_get(j, "deleted")));
    json_decref(j);
    cr_expect_eq(call(&d, "GET", path, NULL, "", NULL, NULL), 404);
    cr_expect_eq(call(&d, "DELETE", path, NULL, "", NULL, NULL), 404);
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", id[1]);
    expect_error(&d, "/v1/responses", body, 400, "previous_response_id");
    /* the chain's other responses are still there */
    snprintf(path, sizeof path, "/v1/responses/%s", id[2]);
    cr_expect_eq(call(&d, "GET", path, NULL, "", NULL, NULL), 200);

    /* store: false is answered and not kept. */
    char nostore[64];
    json_decref(respond(&d, NULL, "{\"input\":\"Hi\",\"store\":false,\"max_output_tokens\":2}",
                        nostore));
    snprintf(path, sizeof path, "/v1/responses/%s", nostore);
    cr_expect_eq(call(&d, "GET", path, NULL, "", NULL, NULL), 404);
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", nostore);
    expect_error(&d, "/v1/responses", body, 400, "previous_response_id");
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(oai_api, a_streamed_response_sends_openais_event_sequence)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 64"), 0);
    char *raw;
    /* a stop string (kvpd's extension) ends the reply before max_output_tokens */
    cr_assert_eq(call(&d, "POST", "/v1/responses", NULL, "{\"input\":\"Once upon a time\","
                      "\"stream\":true,\"stop\":\".\",\"max_output_tokens\":64}", NULL, &raw),
                 200);
    static const char *const want[] = {
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"};
    size_t w = 0;
    int seq = 0, deltas = 0;
    char text[4096] = "", done_text[4096] = "";
    for (const char *p = strstr(raw, "event: "); p; p = strstr(p + 1, "\nevent: ")) {
        if (*p == '\n')
            p++;
        const char *name = p + 7, *nl = strchr(name, '\n');
        cr_assert(nl && !strncmp(nl + 1, "data: ", 6), "%s", p);
        json_t *e = json_loads(nl + 7, JSON_DISABLE_EOF_CHECK, NULL);
        cr_assert(e, "%s", nl + 7);
        cr_expect(!strncmp(str(e, "type"), name, (size_t)(nl - name)), "event %.*s type %s",
                  (int)(nl - name), name, str(e, "type"));
        cr_expect_eq(num(e, "sequence_number"), seq++);
        const char *type = str(e, "type");
        if (!strcmp(type, "response.output_text.delta")) {
            deltas++;
            strncat(text, str(e, "delta"), sizeof text - strlen(text) - 1);
            if (w < 5 || strcmp(want[w - 1], type))
                cr_expect_str_eq(want[w++], type);
        } else {
            cr_assert_lt(w, sizeof want / sizeof want[0], "extra event %s", type);
            cr_expect_str_eq(type, want[w], "event %zu", w);
            w++;
        }
        if (!strcmp(type, "response.output_text.done"))
            snprintf(done_text, sizeof done_text, "%s", str(e, "text"));
        if (!strcmp(type, "response.completed")) {
            cr_expect_str_eq(str(e, "response.status"), "completed");
            cr_expect_str_eq(str(e, "response.output.0.content.0.text"), done_text);
            cr_expect_gt(num(e, "response.usage.output_tokens"), 0);
        }
        json_decref(e);
    }
    cr_expect_eq(w, sizeof want / sizeof want[0], "%s", raw);
    cr_expect_geq(deltas, 1);
    cr_expect_str_eq(text, done_text, "the deltas add up to the text");
    free(raw);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(oai_api, responses_refuse_what_they_cannot_honour_and_keep_tenants_apart)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 8 --api-key keyA,keyB"), 0);
    const char *A = "Authorization: Bearer keyA\r\n", *B = "Authorization: Bearer keyB\r\n";
    char id[64], path[128], body[256];
    json_decref(respond(&d, A, "{\"input\":\"Hi\",\"max_output_tokens\":2}", id));
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    cr_expect_eq(call(&d, "GET", path, A, "", NULL, NULL), 200);
    cr_expect_eq(call(&d, "GET", path, B, "", NULL, NULL), 404, "another tenant's response");
    cr_expect_eq(call(&d, "DELETE", path, B, "", NULL, NULL), 404);
    cr_expect_eq(call(&d, "GET", path, NULL, "", NULL, NULL), 401);
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", id);
    json_t *j;
    cr_expect_eq(call(&d, "POST", "/v1/responses", B, body, &j, NULL), 400);
    cr_expect_str_eq(str(j, "error.param"), "previous_response_id");
    json_decref(j);
    cr_expect_eq(call(&d, "GET", path, A, "", NULL, NULL), 200, "still A's");
    cr_assert_eq(kvpd_stop(&d, 10000), 0);

    cr_assert_eq(kvpd_start(&d, "--max-tokens 8"), 0);
    static const struct { const char *body, *param; } bad[] = {
        {"{}", "input"},
        {"{\"input\":7}", "input"},
        {"{\"input\":[]}", "input"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}", "input[0].call_id"},
        {"{\"input\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "input[0].role"},
        {"{\"input\":[{\"role\":\"user\",\"content\":7}]}", "input[0].content"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}",
         "input[0].content"},
        {"{\"input\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
         "\"content\":\"b\"}]}", "input"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}", "text.format.name"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
         "\"schema\":{},\"foo\":1}}}", "text.format.foo"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"},{\"type\":\"function\","
         "\"name\":\"f\",\"bar\":1}]}", "tools[1].bar"},
        {"{\"input\":\"x\",\"tool_choice\":{\"type\":\"function\",\"name\":\"f\",\"x\":1}}",
         "tool_choice.x"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}", "tools"},
        {"{\"input\":\"x\",\"reasoning\":{\"effort\":\"high\"}}", "reasoning"},
        {"{\"input\":\"x\",\"include\":[\"reasoning.encrypted_content\"]}", "include"},
        {"{\"input\":\"x\",\"background\":true}", "background"},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
        {"{\"input\":\"x\",\"max_output_tokens\":\"9\"}", "max_output_tokens"},
        {"{\"input\":\"x\",\"max_tokens\":9}", "max_tokens"},
        {"{\"input\":\"x\",\"temperature\":3}", "temperature"},
        {"{\"input\":\"x\",\"top_p\":-1}", "top_p"},
        {"{\"input\":\"x\",\"store\":\"no\"}", "store"},
        {"{\"input\":\"x\",\"instructions\":5}", "instructions"},
        {"{\"input\":\"x\",\"metadata\":[1]}", "metadata"},
        {"{\"input\":\"x\",\"previous_response_id\":7}", "previous_response_id"},
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_nope\"}", "previous_response_id"},
        {"{\"input\":\"x\",\"n\":2}", "n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_error(&d, "/v1/responses", bad[i].body, 400, bad[i].param);
    expect_error(&d, "/v1/responses", "{\"input\":", 400, NULL);
    /* a developer item first is the system text; text.format text is accepted */
    j = respond(&d, NULL, "{\"input\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                "{\"type\":\"message\",\"role\":\"user\",\"content\":\"Hi\"}],"
                "\"text\":{\"format\":{\"type\":\"text\"}},\"metadata\":{\"k\":\"v\"},"
                "\"temperature\":0.5,\"max_output_tokens\":2}", NULL);
    cr_expect_str_eq(str(j, "metadata.k"), "v");
    cr_expect(json_real_value(json_object_get(j, "temperature")) == 0.5);
    json_decref(j);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(oai_api, metrics_count_by_path_status_and_api_error_code_and_pass_promtool)
{
    cr_assert(h_have("promtool"), "promtool is missing (scripts/setup.sh installs prometheus)");
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 8"), 0);
    time_t before = time(NULL);
    json_t *j;
    cr_assert_eq(call(&d, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once upon a time\"}",
                      &j, NULL), 200);
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time%s then\"}",
             str(j, "choices.0.text"));
    json_decref(j);
    cr_assert_eq(call(&d, "POST", "/v1/completions", NULL, body, NULL, NULL), 200);
    cr_assert_eq(call(&d, "POST", "/chat/completions", NULL, CHAT("m"), NULL, NULL), 200);
    expect_error(&d, "/v1/completions", "{\"prompt\":\"a\",\"echo\":true}", 400, "echo");
    expect_error(&d, "/v1/completions", "{\"prompt\":\"a\",\"echo\":true}", 400, "echo");
    expect_error(&d, "/v1/chat/completions", "{", 400, NULL);
    cr_assert_eq(call(&d, "GET", "/v1/nope", NULL, "", NULL, NULL), 404);
    char *m = NULL;
    cr_assert_eq(h_get(&d, "/metrics", NULL, &m), 200);
    cr_expect_eq(h_metric(m, "kvpd_http_requests_total{path=\"/v1/completions\",status=\"200\"}"), 2);
    cr_expect_eq(h_metric(m, "kvpd_http_requests_total{path=\"/v1/completions\",status=\"400\"}"), 2);
    cr_expect_eq(h_metric(m, "kvpd_http_requests_total{path=\"/v1/chat/completions\",status=\"200\"}"), 1);
    cr_expect_eq(h_metric(m, "kvpd_http_requests_total{path=\"/v1/other\",status=\"404\"}"), 1);
    cr_expect_eq(h_metric(m, "kvpd_api_errors_total{status=\"400\",code=\"unsupported_parameter\"}"), 2);
    cr_expect_eq(h_metric(m, "kvpd_api_errors_total{status=\"400\",code=\"invalid_json\"}"), 1);
    cr_expect_eq(h_metric(m, "kvpd_api_errors_total{status=\"404\",code=\"unknown_url\"}"), 1);
    /* API errors are not the websocket's error frames */
    cr_expect_eq(h_metric(m, "kvpd_errors_total{code=\"bad_request\"}"), 0);
    cr_expect_eq(h_metric(m, "kvpd_errors_total{code=\"bad_json\"}"), 0);
    cr_expect_gt(h_metric(m, "kvpd_cached_tokens_total"), 0);
    cr_expect_eq(h_metric(m, "kvpd_build_info{version=\"" KVP_VERSION "\"}"), 1);
    double start = h_metric(m, "process_start_time_seconds");
    cr_expect(start > (double)before - 120 && start <= (double)before + 1, "start %f", start);
    cr_expect_eq(h_metric(m, "kvpd_sessions"), -1, "one name for resident sessions");
    cr_expect_eq(h_metric(m, "kvpd_cache_bytes_max_session"), -1);
    cr_expect_geq(h_metric(m, "kvpd_session_cache_bytes_max"), 1);
    char file[] = "/tmp/kvpd-metrics-XXXXXX";
    int fd = mkstemp(file);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs(m, f);
    fclose(f);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", file);
    FILE *p = popen(cmd, "r");
    char out[4096];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int rc = pclose(p);
    unlink(file);
    cr_expect_eq(rc, 0, "promtool: %s", out);
    cr_expect_eq(n, 0, "promtool has something to say: %s", out);
    free(m);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
