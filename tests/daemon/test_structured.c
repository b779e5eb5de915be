/* Integration: a websocket message with response_format on stories260K (a SentencePiece
 * vocabulary with byte tokens): every reply is a document of the schema and ends with
 * the stop token; a refused schema is a bad_request naming the keyword and the session
 * goes on. */
#include <criterion/criterion.h>
#include <string.h>

#include "tests/daemon/harness.h"

static kvpd_proc d;

static void start(void)
{
    cr_assert_eq(kvpd_start(&d, "--max-tokens 512 --temperature 1"), 0,
                 "kvpd did not start (log %s)", d.log);
}

static void stop(void)
{
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
}

TestSuite(structured, .init = start, .fini = stop, .timeout = 120);

static const char *schema =
    "{\"type\":\"object\",\"properties\":{"
    "\"n\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":50},"
    "\"word\":{\"type\":\"string\",\"maxLength\":5},"
    "\"kind\":{\"enum\":[\"cat\",\"dog\"]},"
    "\"list\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":3},"
    "\"inner\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"null\"}},\"required\":[\"x\"]}},"
    "\"required\":[\"n\",\"word\",\"kind\",\"list\",\"inner\"],\"additionalProperties\":false}";

/* The reply's frame (done or error) for a message with this response_format. */
static json_t *turn(ws_client *c, const char *text, const char *rf, char **tokens)
{
    char *msg = NULL;
    cr_assert(asprintf(&msg, "{\"type\":\"message\",\"text\":\"%s\",\"max_tokens\":512,"
                       "\"response_format\":%s}", text, rf) > 0);
    cr_assert_eq(ws_send_text(c, msg), 0);
    free(msg);
    size_t tl = 0;
    *tokens = calloc(1, 1);
    for (;;) {
        json_t *j = h_read_json(c, 60000);
        cr_assert(j, "no answer");
        const char *t = json_string_value(json_object_get(j, "type"));
        if (t && !strcmp(t, "token")) {
            const char *p = json_string_value(json_object_get(j, "text"));
            size_t n = strlen(p);
            *tokens = realloc(*tokens, tl + n + 1);
            memcpy(*tokens + tl, p, n + 1);
            tl += n;
        } else if (t && (!strcmp(t, "done") || !strcmp(t, "error")))
            return j;
        json_decref(j);
    }
}

static size_t chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

Test(structured, replies_are_documents_of_the_schema)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    char rf[1024];
    snprintf(rf, sizeof rf, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\","
             "\"schema\":%s}}", schema);
    for (int i = 0; i < 8; i++) {
        char *tokens;
        json_t *done = turn(&c, i % 2 ? "Tell me a story." : "Once upon a time", rf, &tokens);
        const char *type = json_string_value(json_object_get(done, "type"));
        cr_assert_str_eq(type, "done", "turn %d: %s", i,
                         json_string_value(json_object_get(done, "message")));
        cr_expect_str_eq(json_string_value(json_object_get(json_object_get(done, "stats"), "stop")),
                         "eos", "turn %d ended by the stop token", i);
        const char *reply = json_string_value(json_object_get(done, "reply"));
        cr_expect_str_eq(reply, tokens);
        json_error_t je;
        json_t *v = json_loads(reply, JSON_REJECT_DUPLICATES, &je);
        cr_assert(v, "turn %d: not JSON (%s): %s", i, je.text, reply);
        cr_expect_eq(json_object_size(v), 5, "%s", reply);
        json_t *n = json_object_get(v, "n"), *w = json_object_get(v, "word"),
               *k = json_object_get(v, "kind"), *l = json_object_get(v, "list"),
               *in = json_object_get(v, "inner");
        cr_expect(json_is_integer(n) && json_integer_value(n) >= 1 && json_integer_value(n) <= 50,
                  "%s", reply);
        cr_expect(json_is_string(w) && chars(json_string_value(w)) <= 5, "%s", reply);
        cr_expect(json_is_string(k) && (!strcmp(json_string_value(k), "cat") ||
                                        !strcmp(json_string_value(k), "dog")), "%s", reply);
        cr_expect(json_is_array(l) && json_array_size(l) <= 3, "%s", reply);
        for (size_t j = 0; j < json_array_size(l); j++)
            cr_expect(json_is_boolean(json_array_get(l, j)), "%s", reply);
        cr_expect(json_is_object(in) && json_object_size(in) == 1 &&
                  json_is_null(json_object_get(in, "x")), "%s", reply);
        json_decref(v);
        json_decref(done);
        free(tokens);
    }
    /* json_object: any object, which this model would write past max_tokens (an object's
     * size is unbounded); the length budget closes it in time, so the reply is one whole
     * object, which ends as the model ends a reply ("eos"), never cut ("length") */
    char *tokens;
    json_t *done = turn(&c, "More.", "{\"type\":\"json_object\"}", &tokens);
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    const char *why = json_string_value(json_object_get(json_object_get(done, "stats"), "stop"));
    json_t *v = json_loads(json_string_value(json_object_get(done, "reply")), 0, NULL);
    cr_expect_str_eq(why, "eos", "%s", tokens);
    cr_expect(json_is_object(v), "%s: %s", why, tokens);
    json_decref(v);
    json_decref(done);
    free(tokens);
    ws_close(&c);
}

Test(structured, refused_schemas_name_the_keyword)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    static const char *const bad[][2] = {
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"schema\":{\"type\":\"string\","
         "\"format\":\"email\"}}}", "format is not supported"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\"}}", "schema is required"},
        {"{\"type\":\"grammar\"}", "response_format.type"},
        {"[1]", "must be an object"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"t\",\"schema\":{\"$ref\":\"#/x\"}}}",
         "$ref"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *tokens;
        json_t *e = turn(&c, "Hi", bad[i][0], &tokens);
        cr_expect_str_eq(json_string_value(json_object_get(e, "type")), "error");
        cr_expect_str_eq(json_string_value(json_object_get(e, "code")), "bad_request");
        const char *m = json_string_value(json_object_get(e, "message"));
        cr_expect(m && strstr(m, bad[i][1]), "%s: %s", bad[i][0], m);
        json_decref(e);
        free(tokens);
    }
    /* the connection goes on: a plain turn */
    char *tokens = NULL;
    json_t *done = h_turn(&c, "Once upon a time", 8, &tokens);
    cr_assert(done);
    cr_expect_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);
    free(tokens);
    ws_close(&c);
}

/* The reply's matcher is made at the turn's start on a worker: a response format whose
 * shortest document cannot fit the message's max_tokens is refused from there, as a
 * bad_request naming max_tokens and the count it needs, and the connection goes on. */
Test(structured, a_max_tokens_too_small_for_the_schema_is_refused_naming_it)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"Hi\",\"max_tokens\":2,"
                                  "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                                  "{\"name\":\"t\",\"schema\":{\"type\":\"object\",\"properties\":"
                                  "{\"word\":{\"type\":\"string\"}},\"required\":[\"word\"]}}}}"),
                 0);
    json_t *e = h_expect(&c, "error", 30000);
    cr_assert(e, "no error frame");
    cr_expect_str_eq(json_string_value(json_object_get(e, "code")), "bad_request");
    const char *m = json_string_value(json_object_get(e, "message"));
    cr_expect(m && strstr(m, "max_tokens (2) is too small for the response format"), "%s", m);
    json_decref(e);
    char *tokens = NULL;
    json_t *done = h_turn(&c, "Once upon a time", 8, &tokens);
    cr_assert(done);
    cr_expect_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);
    free(tokens);
    ws_close(&c);
}
