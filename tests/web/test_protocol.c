/* web/protocol.c and web/metrics.c: parsing client messages, building frames. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "web/metrics.h"
#include "web/protocol.h"

static int parse(const char *s, kvpd_client_msg *m, const char **code)
{
    char msg[256];
    return kvpd_proto_parse(s, strlen(s), 100, m, code, msg, sizeof msg);
}

Test(protocol, valid_messages)
{
    kvpd_client_msg m;
    const char *code;
    cr_assert_eq(parse("{\"type\":\"hello\"}", &m, &code), 0);
    cr_assert_eq(m.type, KVPD_MSG_HELLO);
    cr_assert_eq(m.session[0], '\0');
    cr_assert_eq(parse("{\"type\":\"hello\",\"session\":\"00112233445566778899aabbccddeeff\"}", &m, &code), 0);
    cr_assert_str_eq(m.session, "00112233445566778899aabbccddeeff");
    cr_assert_eq(parse("{\"type\":\"message\",\"text\":\"h\\u00e9\",\"max_tokens\":5,\"temperature\":0.5}", &m, &code), 0);
    cr_assert_eq(m.type, KVPD_MSG_MESSAGE);
    cr_assert_str_eq(m.text, "h\xc3\xa9");
    cr_assert_eq(m.text_len, 3);
    cr_assert_eq(m.max_tokens, 5);
    cr_assert(m.opts.has_temperature);
    cr_assert_float_eq(m.opts.temperature, 0.5f, 1e-6);
    cr_assert_eq(m.opts.max_tokens, 5);
    cr_assert(!m.opts.has_top_p && !m.opts.has_seed && m.opts.n_stop == 0);
    kvpd_proto_msg_free(&m);
    cr_assert_eq(parse("{\"type\":\"cancel\"}", &m, &code), 0);
    cr_assert_eq(m.type, KVPD_MSG_CANCEL);
}

Test(protocol, errors_carry_their_code)
{
    kvpd_client_msg m;
    const char *code;
    cr_assert_lt(parse("{", &m, &code), 0);
    cr_assert_str_eq(code, "bad_json");
    cr_assert_lt(parse("{\"type\":\"hello\",\"type\":\"cancel\"}", &m, &code), 0);
    cr_assert_str_eq(code, "bad_json");   /* duplicate keys are ambiguous */
    cr_assert_lt(parse("{\"type\":1}", &m, &code), 0);
    cr_assert_str_eq(code, "bad_request");
    cr_assert_lt(parse("{\"type\":\"message\",\"text\":\"x\",\"max_tokens\":101}", &m, &code), 0);
    cr_assert_str_eq(code, "too_large");
    cr_assert_lt(parse("{\"type\":\"message\",\"text\":\"x\",\"max_tokens\":1.5}", &m, &code), 0);
    cr_assert_str_eq(code, "bad_request");
    cr_assert_lt(parse("{\"type\":\"hello\",\"session\":\"ABC\"}", &m, &code), 0);
    cr_assert_str_eq(code, "unknown_session");
}

Test(protocol, hello_fork)
{
    kvpd_client_msg m;
    const char *code;
    cr_assert_eq(parse("{\"type\":\"hello\"}", &m, &code), 0);
    cr_assert(!m.has_fork);
    cr_assert_eq(parse("{\"type\":\"hello\",\"fork\":{\"session\":"
                       "\"00112233445566778899aabbccddeeff\",\"turn\":3},\"session\":null,"
                       "\"tools\":[]}", &m, &code), 0);
    cr_assert(m.has_fork);
    cr_assert_eq(m.fork_turn, 3);
    cr_assert_str_eq(m.fork_session, "00112233445566778899aabbccddeeff");
    cr_assert_eq(m.session[0], '\0');
    cr_assert_null(m.system);
    kvpd_proto_msg_free(&m);
    cr_assert_eq(parse("{\"type\":\"hello\",\"fork\":{\"turn\":0,\"session\":"
                       "\"00112233445566778899aabbccddeeff\"}}", &m, &code), 0);
    cr_assert(m.has_fork);
    cr_assert_eq(m.fork_turn, 0);
    cr_assert_eq(parse("{\"type\":\"hello\",\"fork\":{\"turn\":1000000,\"session\":"
                       "\"00112233445566778899aabbccddeeff\"}}", &m, &code), 0);
    cr_assert_eq(m.fork_turn, 1000000);
    cr_assert_eq(parse("{\"type\":\"hello\",\"fork\":null}", &m, &code), 0);
    cr_assert(!m.has_fork);
    /* hostile values: each refused with its code, nothing kept */
    static const struct {
        const char *frame, *code;
    } bad[] = {
#define ID "\"00112233445566778899aabbccddeeff\""
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":-1}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":1000001}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":4294967297}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":-9223372036854775808}}",
         "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":1.0}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":1e400}}", "bad_json"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":\"1\"}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":true}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":[1]}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID "}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"turn\":1}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":7,\"turn\":1}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":\"00112233445566778899aabbccddee\\u0000f\","
         "\"turn\":1}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":\"ABC\",\"turn\":1}}", "unknown_session"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":1,\"x\":1}}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":1,\"turn\":2}}", "bad_json"},
        {"{\"type\":\"hello\",\"fork\":[" ID ",1]}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":" ID "}", "bad_request"},
        {"{\"type\":\"hello\",\"fork\":1}", "bad_request"},
        {"{\"type\":\"hello\",\"session\":" ID ",\"fork\":{\"session\":" ID ",\"turn\":1}}",
         "bad_request"},
        {"{\"type\":\"hello\",\"system\":\"\",\"fork\":{\"session\":" ID ",\"turn\":1}}",
         "bad_request"},
        {"{\"type\":\"message\",\"text\":\"x\",\"fork\":{\"session\":" ID ",\"turn\":1}}",
         "bad_request"},
        {"{\"type\":\"hello\",\"fork\":{\"session\":" ID ",\"turn\":1},\"tools\":{}}",
         "bad_request"},
#undef ID
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_lt(parse(bad[i].frame, &m, &code), 0, "%s was accepted", bad[i].frame);
        cr_assert_str_eq(code, bad[i].code, "%s: %s", bad[i].frame, code);
        cr_assert(!m.has_fork && !m.system && !m.tools, "%s kept a field", bad[i].frame);
    }
}

Test(protocol, frames_are_valid_json)
{
    kvp_turn_stats st = {.prompt_tokens = 3, .prefilled_tokens = 3, .generated_tokens = 2,
                         .cache_rows_max = 40, .cache_bytes = 1234, .evicted_rows = 9,
                         .ttft_ms = 1.5, .tokens_per_s = 100, .stop = "length"};
    char *s = kvpd_proto_done("a \"quote\"", 9, &st, -1, NULL);
    json_t *j = json_loads(s, 0, NULL);
    cr_assert(j);
    cr_assert_str_eq(json_string_value(json_object_get(j, "reply")), "a \"quote\"");
    json_t *stats = json_object_get(j, "stats");
    cr_assert_eq(json_integer_value(json_object_get(stats, "cache_bytes")), 1234);
    cr_assert_eq(json_integer_value(json_object_get(stats, "evicted_rows")), 9);
    json_decref(j);
    free(s);
    s = kvpd_proto_token("\xe2\x82\xac", 3);
    cr_assert_str_eq(s, "{\"type\":\"token\",\"text\":\"\xe2\x82\xac\"}");
    free(s);
    cr_assert_null(kvpd_proto_token("\xe2\x82", 2));   /* jansson refuses broken UTF-8 */
    kvp_message hist[] = {{.user = 1, .text = "Hi", .len = 2}, {.text = " Yo", .len = 3}};
    s = kvpd_proto_session("00112233445566778899aabbccddeeff", 1, 1, hist, 2, 0, NULL, 0, 77);
    j = json_loads(s, 0, NULL);
    cr_assert(j, "%s", s);
    cr_assert_eq(json_integer_value(json_object_get(j, "max_tokens")), 77);
    cr_assert_eq(json_integer_value(json_object_get(j, "turns")), 1);
    cr_assert_eq(json_array_size(json_object_get(j, "history")), 2);
    cr_assert_null(json_object_get(j, "system"));
    json_decref(j);
    free(s);
    s = kvpd_proto_error("busy", "wait");
    cr_assert_str_eq(s, "{\"type\":\"error\",\"code\":\"busy\",\"message\":\"wait\"}");
    free(s);
}

Test(metrics, histogram_buckets_are_cumulative)
{
    kvpd_metrics m;
    kvpd_metrics_init(&m);
    kvpd_hist_observe(&m.ttft, 0.002);
    kvpd_hist_observe(&m.ttft, 0.2);
    kvpd_hist_observe(&m.ttft, 100);
    m.errors[kvpd_err_kind_of("busy")] = 2;
    kvpd_gauges g = {.sessions_active = 1, .ready = 1};
    size_t len;
    char *t = kvpd_metrics_render(&m, &g, &len);
    cr_assert(t);
    cr_assert(strstr(t, "kvpd_ttft_seconds_bucket{le=\"0.001\"} 0\n"));
    cr_assert(strstr(t, "kvpd_ttft_seconds_bucket{le=\"0.0025\"} 1\n"));
    cr_assert(strstr(t, "kvpd_ttft_seconds_bucket{le=\"0.25\"} 2\n"));
    cr_assert(strstr(t, "kvpd_ttft_seconds_bucket{le=\"+Inf\"} 3\n"));
    cr_assert(strstr(t, "kvpd_ttft_seconds_count 3\n"));
    cr_assert(strstr(t, "kvpd_errors_total{code=\"busy\"} 2\n"));
    cr_assert_eq(kvpd_err_kind_of("whatever"), KVPD_ERR_INTERNAL);
    free(t);
}

Test(protocol, message_response_format)
{
    kvpd_client_msg m;
    const char *code;
    char msg[256];
    const char *ok = "{\"type\":\"message\",\"text\":\"x\",\"response_format\":{\"type\":\"json_schema\","
                     "\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"integer\"}}}}";
    cr_assert_eq(kvpd_proto_parse(ok, strlen(ok), 100, &m, &code, msg, sizeof msg), 0, "%s", msg);
    cr_expect(m.grammar);
    kvpd_proto_msg_free(&m);
    cr_expect_null(m.grammar);
    cr_assert_eq(parse("{\"type\":\"message\",\"text\":\"x\",\"response_format\":{\"type\":\"text\"}}",
                       &m, &code), 0);
    cr_expect_null(m.grammar);
    kvpd_proto_msg_free(&m);
    const char *bad = "{\"type\":\"message\",\"text\":\"x\",\"response_format\":{\"type\":\"json_schema\","
                      "\"json_schema\":{\"name\":\"n\",\"schema\":{\"not\":{}}}}}";
    cr_assert_lt(kvpd_proto_parse(bad, strlen(bad), 100, &m, &code, msg, sizeof msg), 0);
    cr_expect_str_eq(code, "bad_request");
    cr_expect(strstr(msg, "not is not supported"), "%s", msg);
    cr_expect_null(m.text);   /* a refused message keeps nothing */
    cr_assert_lt(parse("{\"type\":\"message\",\"text\":\"x\",\"response_format\":7}", &m, &code), 0);
    cr_expect_str_eq(code, "bad_request");
    /* a key the format has not is refused naming its path */
    const char *extra = "{\"type\":\"message\",\"text\":\"x\",\"response_format\":{\"type\":"
                        "\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{},\"foo\":1}}}";
    cr_assert_lt(kvpd_proto_parse(extra, strlen(extra), 100, &m, &code, msg, sizeof msg), 0);
    cr_expect_str_eq(code, "bad_request");
    cr_expect(strstr(msg, "'response_format.json_schema.foo'"), "%s", msg);
    cr_expect_null(m.text);
}

/* The sampling fields of a message: taken as the OpenAI API takes them. */
Test(protocol, message_sampling_fields)
{
    kvpd_client_msg m;
    const char *code;
    cr_assert_eq(parse("{\"type\":\"message\",\"text\":\"x\",\"top_p\":0.25,\"top_k\":7,"
                       "\"min_p\":0.1,\"frequency_penalty\":-1.5,\"presence_penalty\":2,"
                       "\"repetition_penalty\":1.3,\"seed\":42,\"stop\":[\"ab\",\"\\n\"],"
                       "\"logit_bias\":{\"3\":-100,\"17\":5.5}}", &m, &code), 0);
    const kvp_turn_opts *o = &m.opts;
    cr_assert(o->has_top_p);
    cr_assert_float_eq(o->top_p, 0.25f, 1e-6);
    cr_assert_eq(o->sampling.top_k, 7);
    cr_assert_float_eq(o->sampling.min_p, 0.1f, 1e-6);
    cr_assert_float_eq(o->sampling.frequency_penalty, -1.5f, 1e-6);
    cr_assert_float_eq(o->sampling.presence_penalty, 2.0f, 1e-6);
    cr_assert_float_eq(o->sampling.repetition_penalty, 1.3f, 1e-6);
    cr_assert(o->has_seed);
    cr_assert_eq(o->seed, 42);
    cr_assert_eq(o->n_stop, 2);
    cr_assert_eq(o->stop_len[0], 2);
    cr_assert_eq(memcmp(o->stop[0], "ab", 2), 0);
    cr_assert_eq(o->stop_len[1], 1);
    cr_assert_eq(o->stop[1][0], '\n');
    cr_assert_eq(o->sampling.n_bias, 2);
    cr_assert_eq(o->sampling.bias[0].token, 3);
    cr_assert_float_eq(o->sampling.bias[0].bias, -100.0f, 1e-6);
    cr_assert_eq(o->sampling.bias[1].token, 17);
    kvpd_proto_msg_free(&m);
    cr_assert_eq(parse("{\"type\":\"message\",\"text\":\"x\",\"stop\":\"end\",\"top_k\":3.0}",
                       &m, &code), 0);
    cr_assert_eq(m.opts.n_stop, 1);
    cr_assert_eq(m.opts.sampling.top_k, 3);
    kvpd_proto_msg_free(&m);
}

/* Each bad value is refused naming its field; so is a field the message does not have. */
Test(protocol, bad_sampling_fields_and_unknown_fields_are_refused_by_name)
{
    static const struct { const char *json, *field; } bad[] = {
        {"\"top_p\":1.5", "top_p"},
        {"\"top_p\":\"0.5\"", "top_p"},
        {"\"top_k\":-1", "top_k"},
        {"\"top_k\":2.5", "top_k"},
        {"\"min_p\":2", "min_p"},
        {"\"frequency_penalty\":3", "frequency_penalty"},
        {"\"presence_penalty\":[1]", "presence_penalty"},
        {"\"repetition_penalty\":0", "repetition_penalty"},
        {"\"seed\":1.5", "seed"},
        {"\"seed\":\"7\"", "seed"},
        {"\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", "stop"},
        {"\"stop\":[\"\"]", "stop"},
        {"\"stop\":[3]", "stop"},
        {"\"stop\":{}", "stop"},
        {"\"logit_bias\":{\"x\":1}", "logit_bias"},
        {"\"logit_bias\":{\"5\":101}", "logit_bias"},
        {"\"logit_bias\":[1]", "logit_bias"},
        {"\"temperature\":11", "temperature"},
        {"\"top_logprobs\":3", "top_logprobs"},
        {"\"n\":2", "\"n\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[256], msg[256];
        snprintf(buf, sizeof buf, "{\"type\":\"message\",\"text\":\"x\",%s}", bad[i].json);
        kvpd_client_msg m;
        const char *code = NULL;
        cr_assert_lt(kvpd_proto_parse(buf, strlen(buf), 100, &m, &code, msg, sizeof msg), 0,
                     "%s", buf);
        cr_assert_str_eq(code, "bad_request", "%s", buf);
        cr_assert_not_null(strstr(msg, bad[i].field), "%s: %s", buf, msg);
        cr_assert_null(m.text, "nothing of a refused message is kept");
    }
    /* a stop string past the bound */
    char big[600], msg[256];
    memset(big, 'a', sizeof big);
    int n = snprintf(big, sizeof big, "{\"type\":\"message\",\"text\":\"x\",\"stop\":\"");
    memset(big + n, 'a', 300);
    snprintf(big + n + 300, sizeof big - n - 300, "\"}");
    kvpd_client_msg m;
    const char *code;
    cr_assert_lt(kvpd_proto_parse(big, strlen(big), 100, &m, &code, msg, sizeof msg), 0);
    cr_assert_not_null(strstr(msg, "stop"));
    cr_assert_lt(parse("{\"type\":\"hello\",\"temperature\":1}", &m, &code), 0);
    cr_assert_str_eq(code, "bad_request");
    cr_assert_lt(parse("{\"type\":\"cancel\",\"session\":\"x\"}", &m, &code), 0);
    cr_assert_str_eq(code, "bad_request");
}

Test(protocol, the_auth_frame)
{
    kvpd_client_msg m;
    const char *code;
    cr_assert_eq(parse("{\"type\":\"auth\",\"token\":\"k\\u0000ey\"}", &m, &code), 0);
    cr_assert_eq(m.type, KVPD_MSG_AUTH);
    cr_assert_eq(m.text_len, 4, "the token goes by its length, a NUL included");
    cr_assert_eq(memcmp(m.text, "k\0ey", 4), 0);
    kvpd_proto_msg_free(&m);
    static const char *const bad[] = {"{\"type\":\"auth\"}", "{\"type\":\"auth\",\"token\":1}",
                                      "{\"type\":\"auth\",\"token\":null}",
                                      "{\"type\":\"auth\",\"token\":[\"k\"]}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_lt(parse(bad[i], &m, &code), 0, "%s", bad[i]);
        cr_assert_str_eq(code, "bad_request");
        cr_assert_null(m.text);
    }
    char *ok = kvpd_proto_auth_ok();
    cr_assert_str_eq(ok, "{\"type\":\"auth\",\"ok\":true}");
    free(ok);
}

Test(protocol, tools_and_tool_results)
{
    kvpd_client_msg m;
    const char *code;
    cr_assert_eq(parse("{\"type\":\"hello\",\"tools\":[{\"type\":\"function\",\"function\":"
                       "{\"name\":\"f\"}}]}", &m, &code), 0);
    cr_assert_eq(json_array_size(m.tools), 1);
    kvpd_proto_msg_free(&m);
    cr_assert_null(m.tools);
    cr_assert_eq(parse("{\"type\":\"message\",\"text\":\"x\",\"tools\":[],\"tool_choice\":"
                       "\"required\",\"parallel_tool_calls\":false}", &m, &code), 0);
    cr_assert_str_eq(json_string_value(m.tool_choice), "required");
    cr_assert(json_is_false(m.parallel_tool_calls));
    kvpd_proto_msg_free(&m);
    cr_assert_eq(parse("{\"type\":\"tool_result\",\"results\":[{\"id\":\"call_1\",\"content\":"
                       "\"sunny\"},{\"id\":\"call_2\",\"content\":\"\",\"name\":\"g\"}],"
                       "\"max_tokens\":7,\"temperature\":0}", &m, &code), 0);
    cr_assert_eq(m.type, KVPD_MSG_TOOL_RESULT);
    cr_assert_eq(json_array_size(m.results), 2);
    cr_assert_eq(m.opts.max_tokens, 7);
    cr_assert(m.opts.has_temperature);
    cr_assert_null(m.text);
    kvpd_proto_msg_free(&m);

    const char *bad[] = {
        "{\"type\":\"hello\",\"tools\":{}}",
        "{\"type\":\"hello\",\"tool_choice\":\"auto\"}",
        "{\"type\":\"message\",\"text\":\"x\",\"tools\":\"f\"}",
        "{\"type\":\"tool_result\"}",
        "{\"type\":\"tool_result\",\"results\":[]}",
        "{\"type\":\"tool_result\",\"results\":{\"id\":\"a\",\"content\":\"b\"}}",
        "{\"type\":\"tool_result\",\"results\":[7]}",
        "{\"type\":\"tool_result\",\"results\":[{\"content\":\"b\"}]}",
        "{\"type\":\"tool_result\",\"results\":[{\"id\":\"\",\"content\":\"b\"}]}",
        "{\"type\":\"tool_result\",\"results\":[{\"id\":\"a\\u0000b\",\"content\":\"b\"}]}",
        "{\"type\":\"tool_result\",\"results\":[{\"id\":\"a\",\"content\":1}]}",
        "{\"type\":\"tool_result\",\"results\":[{\"id\":\"a\",\"content\":\"b\",\"name\":3}]}",
        "{\"type\":\"tool_result\",\"results\":[{\"id\":\"a\",\"content\":\"b\",\"x\":1}]}",
        "{\"type\":\"tool_result\",\"results\":[{\"id\":\"a\",\"content\":\"b\"}],\"text\":\"t\"}",
        "{\"type\":\"tool_result\",\"results\":[{\"id\":\"a\",\"content\":\"b\"}],\"max_tokens\":0}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_lt(parse(bad[i], &m, &code), 0, "accepted: %s", bad[i]);
        cr_assert_str_eq(code, KVPD_E_BAD_REQUEST, "%s: %s", bad[i], code);
        cr_assert_null(m.tools);
        cr_assert_null(m.results);
    }
    /* a long id, and more results than a reply can hold calls */
    char buf[4096];
    snprintf(buf, sizeof buf, "{\"type\":\"tool_result\",\"results\":[{\"id\":\"%0*d\","
             "\"content\":\"b\"}]}", KVPD_PROTO_CALL_ID_MAX + 1, 1);
    cr_assert_lt(parse(buf, &m, &code), 0);
    size_t n = (size_t)snprintf(buf, sizeof buf, "{\"type\":\"tool_result\",\"results\":[");
    for (int i = 0; i <= KVPD_PROTO_MAX_RESULTS; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s{\"id\":\"c%d\",\"content\":\"\"}",
                              i ? "," : "", i);
    snprintf(buf + n, sizeof buf - n, "]}");
    cr_assert_lt(parse(buf, &m, &code), 0, "%d results accepted", KVPD_PROTO_MAX_RESULTS + 1);
}

Test(protocol, tool_frames)
{
    char *s = kvpd_proto_tool_call("call_1", "f", "{\"a\":1}");
    json_t *j = json_loads(s, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "tool_call");
    cr_assert_str_eq(json_string_value(json_object_get(j, "arguments")), "{\"a\":1}");
    json_decref(j);
    free(s);
    kvp_turn_stats st = {.stop = "eos"};
    json_t *calls = json_pack("[{s:s, s:s, s:s}]", "id", "call_1", "name", "f", "arguments", "{}");
    s = kvpd_proto_done_calls("hi", 2, &st, -1, NULL, calls);
    j = json_loads(s, 0, NULL);
    cr_assert(json_equal(json_object_get(j, "tool_calls"), calls));
    json_decref(j);
    free(s);
    s = kvpd_proto_done("hi", 2, &st, -1, NULL);
    j = json_loads(s, 0, NULL);
    cr_assert_null(json_object_get(j, "tool_calls"));
    json_decref(j);
    free(s);
    json_decref(calls);
    /* a tool message in the history is shown as such */
    kvp_message h[] = {{1, "q", 1}, {0, "a", 1}, {KVP_MESSAGE_TOOL, "[]", 2}};
    s = kvpd_proto_session("00112233445566778899aabbccddeeff", 1, 1, h, 3, 0, NULL, 0, 9);
    j = json_loads(s, 0, NULL);
    json_t *hist = json_object_get(j, "history");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(hist, 2), "role")), "tool");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(hist, 1), "role")), "assistant");
    json_decref(j);
    free(s);
}
