/* web/oai_tools.c: a request's tools and tool_choice checked and turned into the turn's
 * options, the history's tool calls and results rewritten for the hub, and a reply's
 * calls given back whole or streamed. */
#include <criterion/criterion.h>
#include <string.h>

#include "web/oai_tools.h"

#define WEATHER                                                                             \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\","   \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"   \
    "\"required\":[\"city\"]}}}"
#define NOW                                                                                 \
    "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"parameters\":{\"type\":"        \
    "\"object\",\"properties\":{},\"additionalProperties\":false}}}"

typedef struct req {
    kvpd_oai_tools t;
    kvp_turn_opts o;
    kvpd_oai_tools_err e;
    int rc;
} req;

static void request(req *r, const char *body, int format)
{
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *j = json_loads(body, 0, &je);
    cr_assert(j, "%s: %s", body, je.text);
    r->rc = kvpd_oai_tools_request(&r->t, j, format, &r->o, &r->e);
    json_decref(j);
}

static void refused(const char *body, int format, const char *param, const char *want)
{
    req r;
    request(&r, body, format);
    cr_assert_eq(r.rc, -1, "%s was accepted", body);
    cr_assert_str_eq(r.e.param, param, "%s: %s", body, r.e.msg);
    cr_assert(strstr(r.e.msg, want), "%s: wanted \"%s\" in \"%s\"", body, want, r.e.msg);
    kvpd_oai_tools_free(&r.t);
}

Test(oai_tools, no_tools_sets_nothing)
{
    req r;
    request(&r, "{\"messages\":[]}", KVP_TOOLS_HERMES);
    cr_assert_eq(r.rc, 0, "%s", r.e.msg);
    cr_assert_null(r.o.tools);
    cr_assert_null(r.o.grammar);
    cr_assert_null(r.o.reply_prefix);
    cr_assert_null(r.o.end_after);
    kvpd_oai_tools_free(&r.t);
    /* "none" and "auto" need no tools either */
    request(&r, "{\"tool_choice\":\"none\"}", KVP_TOOLS_NONE);
    cr_assert_eq(r.rc, 0, "%s", r.e.msg);
    kvpd_oai_tools_free(&r.t);
}

Test(oai_tools, bad_tools_and_choices_are_named)
{
    refused("{\"tools\":[" WEATHER "]}", KVP_TOOLS_NONE, "tools", "no tool-call format");
    refused("{\"tools\":{}}", KVP_TOOLS_HERMES, "tools", "must be an array");
    refused("{\"tools\":[{\"type\":\"code\"}]}", KVP_TOOLS_HERMES, "tools[0]",
            "function tools only");
    refused("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}",
            KVP_TOOLS_HERMES, "tools[0].function.name", "letters, digits");
    refused("{\"tools\":[" WEATHER "," WEATHER "]}", KVP_TOOLS_HERMES,
            "tools[1].function.name", "declared twice");
    refused("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":3}}]}",
            KVP_TOOLS_HERMES, "tools[0].function.description", "description must be a string");
    refused("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}",
            KVP_TOOLS_HERMES, "tools[0].function.parameters", "parameters must be a JSON schema");
    refused("{\"tools\":[" WEATHER "],\"parallel_tool_calls\":1}", KVP_TOOLS_HERMES,
            "parallel_tool_calls", "must be a boolean");
    refused("{\"tools\":[" WEATHER "],\"tool_choice\":\"always\"}", KVP_TOOLS_HERMES,
            "tool_choice", "must be \"none\"");
    refused("{\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":"
            "{\"name\":\"other\"}}}", KVP_TOOLS_HERMES, "tool_choice", "'other'");
    refused("{\"tool_choice\":\"required\"}", KVP_TOOLS_HERMES, "tool_choice", "needs tools");
}

/* auto: the tools go to the template, the reply is parsed, nothing is forced. */
/* A key OpenAI's API does not define for a function tool or a named tool_choice: refused
 * by its whole path, flagged unknown (OpenAI's unknown_parameter). */
static void unknown(const char *body, const char *path)
{
    req r;
    request(&r, body, KVP_TOOLS_HERMES);
    cr_assert_eq(r.rc, -1, "%s was accepted", body);
    cr_assert_str_eq(r.e.param, path, "%s: %s", body, r.e.msg);
    cr_assert(r.e.unknown, "%s: %s is not flagged unknown", body, path);
    cr_assert(strstr(r.e.msg, path), "%s: %s", body, r.e.msg);
    kvpd_oai_tools_free(&r.t);
}

/* The tools and tool_choice the SDK helpers send pass (openai's zodFunction: name,
 * parameters, strict true, description; the AI SDK's and LangChain's: name, description,
 * parameters, strict only when set; a named choice {type, function: {name}}); any other
 * key, at either level of a tool or of tool_choice, is refused by its path; a wrong type
 * by the field's. */
Test(oai_tools, the_keys_of_tools_and_tool_choice_are_checked)
{
    static const char *const fine[] = {
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"],\"additionalProperties\":false},\"strict\":true,"
        "\"description\":\"d\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":"
        "{\"name\":\"get_weather\"}}}",
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":null,"
        "\"parameters\":null,\"strict\":null}}],\"tool_choice\":\"auto\"}",
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        req r;
        request(&r, fine[i], KVP_TOOLS_HERMES);
        cr_assert_eq(r.rc, 0, "%s: %s", fine[i], r.e.msg);
        kvpd_oai_tools_free(&r.t);
    }
    unknown("{\"tools\":[" WEATHER ",{\"type\":\"function\",\"function\":{\"name\":\"f\"},"
            "\"strict\":true}]}", "tools[1].strict");
    unknown("{\"tools\":[" WEATHER "," NOW ",{\"type\":\"function\",\"function\":{\"name\":\"g\"}},{\"type\":\"function\",\"function\":"
            "{\"name\":\"f\",\"bar\":1}}]}", "tools[3].function.bar");
    unknown("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
            "\"arguments\":{}}}]}", "tools[0].function.arguments");
    unknown("{\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":"
            "{\"name\":\"get_weather\"},\"name\":\"get_weather\"}}", "tool_choice.name");
    unknown("{\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":"
            "{\"name\":\"get_weather\",\"strict\":true}}}", "tool_choice.function.strict");
    /* wrong types, by the field */
    refused("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":"
            "\"yes\"}}]}", KVP_TOOLS_HERMES, "tools[0].function.strict", "must be a boolean");
    refused("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":5}}]}",
            KVP_TOOLS_HERMES, "tools[0].function.name", "letters, digits");
    refused("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
            "\"description\":[]}}]}", KVP_TOOLS_HERMES, "tools[0].function.description",
            "must be a string");
    refused("{\"tools\":[{\"type\":\"function\",\"function\":\"f\"}]}", KVP_TOOLS_HERMES,
            "tools[0].function", "must be an object");
    refused("{\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":"
            "{\"name\":5}}}", KVP_TOOLS_HERMES, "tool_choice", "tool_choice must be");
    /* a value refusal is not flagged unknown */
    req r;
    request(&r, "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
            "\"strict\":1}}]}", KVP_TOOLS_HERMES);
    cr_assert_eq(r.rc, -1);
    cr_assert_not(r.e.unknown);
    kvpd_oai_tools_free(&r.t);
}

Test(oai_tools, auto_renders_the_tools_and_forces_nothing)
{
    req r;
    request(&r, "{\"tools\":[" WEATHER "]}", KVP_TOOLS_HERMES);
    cr_assert_eq(r.rc, 0, "%s", r.e.msg);
    cr_assert(r.o.tools && r.o.tools_len == strlen(r.o.tools));
    json_t *tools = json_loads(r.o.tools, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(
                         tools, 0), "function"), "name")), "get_weather");
    json_decref(tools);
    cr_assert(r.t.parse);
    cr_assert_null(r.o.grammar);
    cr_assert_null(r.o.reply_prefix);
    cr_assert_null(r.o.end_after);
    kvpd_oai_tools_free(&r.t);
    /* "none" renders them but does not parse the reply */
    request(&r, "{\"tools\":[" WEATHER "],\"tool_choice\":\"none\"}", KVP_TOOLS_HERMES);
    cr_assert_eq(r.rc, 0, "%s", r.e.msg);
    cr_assert(r.o.tools);
    cr_assert_not(r.t.parse);
    kvpd_oai_tools_free(&r.t);
    /* one call at most: the reply ends after the format's close */
    request(&r, "{\"tools\":[" WEATHER "],\"parallel_tool_calls\":false}", KVP_TOOLS_HERMES);
    cr_assert_eq(r.rc, 0, "%s", r.e.msg);
    cr_assert_str_eq(r.o.end_after, "</tool_call>");
    cr_assert_eq(r.o.end_after_len, strlen("</tool_call>"));
    kvpd_oai_tools_free(&r.t);
}

/* A forced call with arguments: the opening is prefilled, the rest sampled under a grammar. */
Test(oai_tools, required_compiles_the_call_grammar)
{
    req r;
    request(&r, "{\"tools\":[" WEATHER "," NOW "],\"tool_choice\":\"required\"}",
            KVP_TOOLS_HERMES);
    cr_assert_eq(r.rc, 0, "%s", r.e.msg);
    cr_assert_not_null(r.o.grammar);
    cr_assert_eq(r.o.grammar, r.t.grammar);
    cr_assert_eq(r.o.reply_prefix_len, strlen("<tool_call>\n"));
    cr_assert_eq(memcmp(r.o.reply_prefix, "<tool_call>\n", r.o.reply_prefix_len), 0);
    cr_assert_str_eq(r.o.end_after, "</tool_call>");
    kvpd_oai_tools_free(&r.t);
}

/* A named function without arguments is written whole: nothing is sampled for it. */
Test(oai_tools, a_named_call_without_arguments_is_written_whole)
{
    req r;
    const char *body = "{\"tools\":[" WEATHER "," NOW "],\"tool_choice\":{\"type\":\"function\","
                       "\"function\":{\"name\":\"now\"}}}";
    request(&r, body, KVP_TOOLS_HERMES);
    cr_assert_eq(r.rc, 0, "%s", r.e.msg);
    cr_assert_null(r.o.grammar);
    cr_assert(r.o.reply_prefix);
    cr_assert(strstr(r.o.reply_prefix, "\"now\""), "%s", r.o.reply_prefix);
    cr_assert(strstr(r.o.reply_prefix, "{}"), "%s", r.o.reply_prefix);
    cr_assert_str_eq(r.o.end_after, "</tool_call>");
    kvpd_oai_tools_free(&r.t);
    /* Llama 3: the written call is the whole reply, so the reply ends right after it */
    request(&r, body, KVP_TOOLS_LLAMA3);
    cr_assert_eq(r.rc, 0, "%s", r.e.msg);
    cr_assert(r.o.end_after && r.o.reply_prefix);
    cr_assert_str_eq(r.o.end_after, r.t.prefix);
    kvpd_oai_tools_free(&r.t);
}

static json_t *rewrite(const char *msgs, int rc_want, kvpd_oai_tools_err *e)
{
    kvpd_oai_tools t = {.format = KVP_TOOLS_HERMES};
    json_t *in = json_loads(msgs, 0, NULL), *out = NULL;
    cr_assert(in, "%s", msgs);
    int rc = kvpd_oai_tools_messages(&t, in, &out, e);
    json_decref(in);
    cr_assert_eq(rc, rc_want, "%s: %s", msgs, e->msg);
    return out;
}

#define CALL_MSG                                                                            \
    "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"tool_calls\":[{\"id\":\"c1\","  \
    "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"           \
    "\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]}"

Test(oai_tools, history_calls_and_results_are_rewritten)
{
    kvpd_oai_tools_err e;
    json_t *out = rewrite("[{\"role\":\"user\",\"content\":\"Weather?\"}," CALL_MSG ","
                          "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"},"
                          "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":[{\"type\":"
                          "\"text\",\"text\":\"war\"},{\"type\":\"text\",\"text\":\"m\"}]},"
                          "{\"role\":\"user\",\"content\":\"Thanks\"}]", 0, &e);
    cr_assert_eq(json_array_size(out), 4, "a run of tool results is one message");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(out, 0), "content")),
                     "Weather?");
    const char *a = json_string_value(json_object_get(json_array_get(out, 1), "content"));
    cr_assert_str_eq(a, "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                        "{\"city\": \"Oslo\"}}\n</tool_call>");
    json_t *tool = json_array_get(out, 2);
    cr_assert_str_eq(json_string_value(json_object_get(tool, "role")), "tool");
    json_t *results = json_loads(json_string_value(json_object_get(tool, "content")), 0, NULL);
    cr_assert_eq(json_array_size(results), 2);
    json_t *r0 = json_array_get(results, 0), *r1 = json_array_get(results, 1);
    cr_assert_str_eq(json_string_value(json_object_get(r0, "tool_call_id")), "c1");
    cr_assert_str_eq(json_string_value(json_object_get(r0, "name")), "get_weather");
    cr_assert_str_eq(json_string_value(json_object_get(r0, "content")), "sunny");
    cr_assert_str_eq(json_string_value(json_object_get(r1, "content")), "warm");
    json_decref(results);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(out, 3), "role")), "user");
    json_decref(out);
}

Test(oai_tools, bad_history_is_named)
{
    kvpd_oai_tools_err e;
    cr_assert_null(rewrite("[{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"x\"}]",
                           -1, &e));
    cr_assert_str_eq(e.param, "messages[0].tool_call_id");
    cr_assert(strstr(e.msg, "names no tool call"), "%s", e.msg);
    cr_assert_null(rewrite("[" CALL_MSG ",{\"role\":\"tool\",\"content\":\"x\"}]", -1, &e));
    cr_assert_str_eq(e.param, "messages[1].tool_call_id");
    cr_assert_null(rewrite("[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"function\":"
                           "{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]", -1, &e));
    cr_assert_str_eq(e.param, "messages[0].tool_calls[0].function.arguments");
    cr_assert_null(rewrite("[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"function\":"
                           "{\"name\":\"f\",\"arguments\":\"{} x\"}}]}]", -1, &e));
    cr_assert_str_eq(e.param, "messages[0].tool_calls[0].function.arguments");
    cr_assert_null(rewrite("[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
                           "{\"name\":\"f\",\"arguments\":\"{}\"}}]}]", -1, &e));
    cr_assert_str_eq(e.param, "messages[0].tool_calls[0]");
    cr_assert_null(rewrite("[" CALL_MSG ",{\"role\":\"tool\",\"tool_call_id\":\"c1\","
                           "\"content\":[{\"type\":\"image\"}]}]", -1, &e));
    cr_assert_str_eq(e.param, "messages[1].content");
}

static const char REPLY[] = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                            "{\"city\": \"Oslo\"}}\n</tool_call>";

Test(oai_tools, a_whole_reply_with_a_call)
{
    kvpd_oai_tools t = {.format = KVP_TOOLS_HERMES, .parse = 1};
    int calls = -1;
    json_t *m = kvpd_oai_tools_reply(&t, REPLY, strlen(REPLY), &calls);
    cr_assert_eq(calls, 1);
    cr_assert_str_eq(json_string_value(json_object_get(m, "content")), "Checking.");
    json_t *c = json_array_get(json_object_get(m, "tool_calls"), 0);
    cr_assert_eq(strncmp(json_string_value(json_object_get(c, "id")), "call_", 5), 0);
    cr_assert_str_eq(json_string_value(json_object_get(c, "type")), "function");
    json_t *fn = json_object_get(c, "function");
    cr_assert_str_eq(json_string_value(json_object_get(fn, "name")), "get_weather");
    cr_assert_str_eq(json_string_value(json_object_get(fn, "arguments")), "{\"city\": \"Oslo\"}");
    json_decref(m);
    /* a reply that is only a call has null content */
    const char *only = strchr(REPLY, '<');
    m = kvpd_oai_tools_reply(&t, only, strlen(only), &calls);
    cr_assert_eq(calls, 1);
    cr_assert(json_is_null(json_object_get(m, "content")));
    json_decref(m);
    /* not parsed: the text as it is */
    t.parse = 0;
    m = kvpd_oai_tools_reply(&t, REPLY, strlen(REPLY), &calls);
    cr_assert_eq(calls, 0);
    cr_assert_str_eq(json_string_value(json_object_get(m, "content")), REPLY);
    cr_assert_null(json_object_get(m, "tool_calls"));
    json_decref(m);
    kvpd_oai_tools_free(&t);
}

/* Streamed a few bytes at a time: the content before the call goes out, the call's bytes
 * are held until it is whole, then its opening and its arguments follow as two deltas. */
Test(oai_tools, a_streamed_reply_holds_back_the_call)
{
    kvpd_oai_tools t = {.format = KVP_TOOLS_HERMES, .parse = 1};
    char content[256] = "";
    int openings = 0, args = 0;
    const char *id = NULL;
    char name[64] = "", arguments[128] = "";
    size_t n = strlen(REPLY), cut = strlen("Checking.\n<tool");
    for (size_t at = 0; at < n; at += 5) {
        size_t k = n - at < 5 ? n - at : 5;
        json_t *d = kvpd_oai_tools_feed(&t, REPLY + at, k, 0);
        if (at + k <= cut)
            cr_assert(strlen(content) <= at + k);
        size_t i;
        json_t *x;
        json_array_foreach(d, i, x) {
            kvpd_oai_delta out;
            kvpd_oai_tools_delta(x, &out);
            if (out.content) {
                cr_assert_eq(openings, 0, "content after the call's opening");
                strncat(content, out.content, out.content_len);
            }
            if (out.call_id) {
                openings++;
                cr_assert_eq(strncmp(out.call_id, "call_", 5), 0);
                snprintf(name, sizeof name, "%s", out.call_name);
                id = t.ids[0];
            }
            if (out.arguments) {
                args++;
                snprintf(arguments, sizeof arguments, "%s", out.arguments);
            }
        }
        json_decref(d);
        if (at + k < n)
            cr_assert_eq(openings, 0, "the call went out before it was whole (%zu bytes)",
                         at + k);
    }
    json_t *d = kvpd_oai_tools_feed(&t, NULL, 0, 1);
    cr_assert_eq(json_array_size(d), 0, "nothing was left to send");
    json_decref(d);
    cr_assert_str_eq(content, "Checking.");
    cr_assert_eq(openings, 1);
    cr_assert_eq(args, 1);
    cr_assert(id && !strncmp(id, "call_", 5));
    cr_assert_str_eq(name, "get_weather");
    cr_assert_str_eq(arguments, "{\"city\": \"Oslo\"}");
    kvpd_oai_tools_free(&t);
}

/* What looked like the start of a call (and the white space before it) is held; when the
 * reply ends without a call, it goes out as content, so the content is the whole text. */
Test(oai_tools, held_text_goes_out_when_the_reply_ends)
{
    kvpd_oai_tools t = {.format = KVP_TOOLS_HERMES, .parse = 1};
    json_t *d = kvpd_oai_tools_feed(&t, "Hi <tool_ca", 11, 0);
    kvpd_oai_delta out;
    cr_assert_eq(json_array_size(d), 1);
    kvpd_oai_tools_delta(json_array_get(d, 0), &out);
    cr_assert_eq(out.content_len, 2, "%.*s", (int)out.content_len, out.content);
    cr_assert_eq(memcmp(out.content, "Hi", 2), 0);
    json_decref(d);
    d = kvpd_oai_tools_feed(&t, NULL, 0, 1);
    cr_assert_eq(json_array_size(d), 1);
    kvpd_oai_tools_delta(json_array_get(d, 0), &out);
    cr_assert_eq(out.content_len, 9, "%.*s", (int)out.content_len, out.content);
    cr_assert_eq(memcmp(out.content, " <tool_ca", 9), 0);
    cr_assert_null(out.call_id);
    cr_assert_null(out.arguments);
    json_decref(d);
    kvpd_oai_tools_free(&t);
}

/* parallel_tool_calls false: a reply that holds a list of calls (Llama 3's `;`-separated
 * calls, Mistral's array) gives back only its first, whole and streamed; true (or
 * absent) gives them all. */
Test(oai_tools, parallel_tool_calls_false_keeps_one_call)
{
    static const char *replies[] = {
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; "
        "{\"name\": \"now\", \"parameters\": {}}",
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, "
        "{\"name\": \"now\", \"arguments\": {}}]"};
    static const int formats[] = {KVP_TOOLS_LLAMA3, KVP_TOOLS_MISTRAL};
    for (int f = 0; f < 2; f++) {
        for (int par = 0; par < 3; par++) {
            const char *body = par == 0 ? "{\"tools\":[" WEATHER "," NOW "],\"parallel_tool_calls\":false}"
                             : par == 1 ? "{\"tools\":[" WEATHER "," NOW "],\"parallel_tool_calls\":true}"
                                        : "{\"tools\":[" WEATHER "," NOW "]}";
            int want = par == 0 ? 1 : 2;
            req r;
            request(&r, body, formats[f]);
            cr_assert_eq(r.rc, 0, "%s", r.e.msg);
            int calls = -1;
            json_t *m = kvpd_oai_tools_reply(&r.t, replies[f], strlen(replies[f]), &calls);
            cr_assert_eq(calls, want, "format %d, %s: %d calls", formats[f], body, calls);
            json_t *tc = json_object_get(m, "tool_calls");
            cr_assert_eq(json_array_size(tc), (size_t)want);
            cr_assert_str_eq(json_string_value(json_object_get(json_object_get(
                                 json_array_get(tc, 0), "function"), "name")), "get_weather");
            json_t *content = json_object_get(m, "content");
            cr_assert(json_is_null(content) || !strstr(json_string_value(content), "now"),
                      "the dropped call is not content either: %s", json_string_value(content));
            json_decref(m);
            /* streamed: as many call openings */
            json_t *d = kvpd_oai_tools_feed(&r.t, replies[f], strlen(replies[f]), 1);
            int openings = 0;
            size_t i;
            json_t *x;
            json_array_foreach(d, i, x) {
                kvpd_oai_delta out;
                kvpd_oai_tools_delta(x, &out);
                openings += out.call_id != NULL;
                cr_assert(!out.content || !strstr(out.content, "now"), "%s", out.content);
            }
            json_decref(d);
            cr_assert_eq(openings, want, "format %d, %s: %d streamed calls", formats[f], body, openings);
            kvpd_oai_tools_free(&r.t);
        }
    }
}
