/* The OpenAI codec's logprobs without a daemon: the request fields into the turn's
 * options (and their refusals, by name), and the two answer shapes built from the hub's
 * entries (partial characters, tokens without mass, duplicate spellings). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "model/toolcall.h"
#include "web/oai_parse.h"
#include "web/oai_reply.h"

static const kvpd_oai_limits limits = {.max_tokens = 64, .model = "m",
                                       .tool_format = KVP_TOOLS_HERMES, .model_alias = ""};

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static int parse(const char *body, kvpd_oai_req *r, kvpd_oai_err *e)
{
    memset(r, 0, sizeof *r);
    int rc = kvpd_oai_parse_chat(body, strlen(body), &limits, r, e);
    return rc;
}

Test(oai_logprobs, chat_fields_into_the_turn)
{
    kvpd_oai_req r;
    kvpd_oai_err e;
    cr_assert_eq(parse("{" MSG ",\"logprobs\":true,\"top_logprobs\":20}", &r, &e), 0, "%s",
                 e.message);
    cr_expect_eq(r.turn.logprobs, 1);
    cr_expect_eq(r.turn.top_logprobs, 20);
    kvpd_oai_release(&r);
    cr_assert_eq(parse("{" MSG ",\"logprobs\":true}", &r, &e), 0);
    cr_expect_eq(r.turn.logprobs, 1);
    cr_expect_eq(r.turn.top_logprobs, 0);
    kvpd_oai_release(&r);
    cr_assert_eq(parse("{" MSG ",\"logprobs\":false,\"top_logprobs\":null}", &r, &e), 0);
    cr_expect_eq(r.turn.logprobs, 0);
    kvpd_oai_release(&r);
}

Test(oai_logprobs, refusals_name_the_field)
{
    static const struct { const char *body, *param; } bad[] = {
        {"{" MSG ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs"},
        {"{" MSG ",\"logprobs\":true,\"top_logprobs\":-1}", "top_logprobs"},
        {"{" MSG ",\"logprobs\":true,\"top_logprobs\":1e30}", "top_logprobs"},
        {"{" MSG ",\"logprobs\":true,\"top_logprobs\":{}}", "top_logprobs"},
        {"{" MSG ",\"top_logprobs\":0}", "top_logprobs"},
        {"{" MSG ",\"logprobs\":0}", "logprobs"},
        {"{" MSG ",\"logprobs\":null,\"top_logprobs\":5}", "top_logprobs"},
        {"{" MSG ",\"logprobs\":\"true\"}", "logprobs"},
        /* tools: the reply is parsed for calls, which logprobs have no place in */
        {"{" MSG ",\"logprobs\":true,\"tools\":[{\"type\":\"function\",\"function\":"
         "{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]}", "logprobs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvpd_oai_req r;
        kvpd_oai_err e;
        cr_expect_eq(parse(bad[i].body, &r, &e), -1, "%s", bad[i].body);
        cr_expect_eq(e.status, 400, "%s", bad[i].body);
        cr_expect_str_eq(e.param, bad[i].param, "%s: %s", bad[i].body, e.message);
        kvpd_oai_release(&r);
    }
}

/* Two tokens with two alternatives each: " a" (certain-ish) and the first two bytes of
 * "é" (a partial character), one alternative with no mass. */
static const kvp_hub_logprob lp[] = {
    {5, -0.25f, " a", 2}, {5, -0.25f, " a", 2}, {6, -1.5f, " b", 2},
    {7, -0.5f, "\xc3", 1}, {8, -0.1f, "x", 1}, {9, -INFINITY, "x", 1},
};

Test(oai_logprobs, chat_content_shape)
{
    json_t *a = kvpd_oai_logprobs_content(lp, 2, 2);
    cr_assert_eq(json_array_size(a), 2);
    json_t *e0 = json_array_get(a, 0), *e1 = json_array_get(a, 1);
    cr_expect_str_eq(json_string_value(json_object_get(e0, "token")), " a");
    cr_expect_float_eq(json_number_value(json_object_get(e0, "logprob")), -0.25, 1e-9);
    cr_expect_eq(json_array_size(json_object_get(e0, "bytes")), 2);
    cr_expect_eq(json_integer_value(json_array_get(json_object_get(e0, "bytes"), 0)), 32);
    cr_expect_eq(json_array_size(json_object_get(e0, "top_logprobs")), 2);
    cr_expect_null(json_object_get(json_array_get(json_object_get(e0, "top_logprobs"), 0),
                                   "top_logprobs"), "alternatives have none of their own");
    /* a partial character: the string is U+FFFD, the bytes exact */
    cr_expect_str_eq(json_string_value(json_object_get(e1, "token")), "\xef\xbf\xbd");
    cr_expect_eq(json_integer_value(json_array_get(json_object_get(e1, "bytes"), 0)), 0xc3);
    json_t *none = json_array_get(json_object_get(e1, "top_logprobs"), 1);
    cr_expect_float_eq(json_number_value(json_object_get(none, "logprob")), -9999.0, 1e-9,
                       "no mass: -9999, as JSON has no -inf");
    char *s = json_dumps(a, 0);
    cr_assert(s, "the whole is valid JSON");
    free(s);
    json_decref(a);
}

Test(oai_logprobs, legacy_shape)
{
    size_t off = 10;
    json_t *j = kvpd_oai_logprobs_legacy(lp, 2, 2, &off);
    cr_expect_eq(off, 13, "moved past both tokens' bytes");
    json_t *offs = json_object_get(j, "text_offset");
    cr_expect_eq(json_integer_value(json_array_get(offs, 0)), 10);
    cr_expect_eq(json_integer_value(json_array_get(offs, 1)), 12);
    cr_expect_str_eq(json_string_value(json_array_get(json_object_get(j, "tokens"), 1)),
                     "\xef\xbf\xbd");
    cr_expect_float_eq(json_number_value(json_array_get(json_object_get(j, "token_logprobs"), 1)),
                       -0.5, 1e-9);
    json_t *t0 = json_array_get(json_object_get(j, "top_logprobs"), 0);
    cr_expect_eq(json_object_size(t0), 2);
    cr_expect_float_eq(json_number_value(json_object_get(t0, " b")), -1.5, 1e-9);
    /* two alternatives spelled "x": the more likely keeps the key */
    json_t *t1 = json_array_get(json_object_get(j, "top_logprobs"), 1);
    cr_expect_eq(json_object_size(t1), 1);
    cr_expect_float_eq(json_number_value(json_object_get(t1, "x")), -0.1, 1e-6);
    json_decref(j);
    /* no tokens: empty arrays */
    j = kvpd_oai_logprobs_legacy(NULL, 0, 0, &off);
    cr_expect_eq(json_array_size(json_object_get(j, "tokens")), 0);
    json_decref(j);
}
