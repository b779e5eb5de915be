/* model/toolcall.c: each format's calls and content, several calls, streaming (what is
 * held while a call may be opening), broken and hostile input (unclosed, invalid JSON,
 * bad names, deep nesting), the format detection rule, and that a call written back
 * (kvp_toolcall_write) parses to the same name and arguments. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/toolcall.h"

static kvp_toolcalls tc;

static int parse(enum kvp_tool_format f, const char *s, int final)
{
    return kvp_toolcall_parse(f, s, strlen(s), final, &tc);
}

static void expect_call(const char *s, int i, const char *name, const char *args)
{
    cr_assert_lt(i, tc.n);
    kvp_range n = tc.call[i].name, a = tc.call[i].args;
    cr_assert_eq(n.to - n.from, strlen(name), "name length of call %d", i);
    cr_assert_eq(memcmp(s + n.from, name, strlen(name)), 0, "name of call %d", i);
    cr_assert_eq(a.to - a.from, strlen(args), "args of call %d: %.*s", i,
                 (int)(a.to - a.from), s + a.from);
    cr_assert_eq(memcmp(s + a.from, args, strlen(args)), 0);
}

/* The content ranges joined with '|'. */
static const char *content(const char *s)
{
    static char buf[1024];
    size_t k = 0;
    for (int i = 0; i < tc.n_content; i++) {
        if (i)
            buf[k++] = '|';
        size_t l = tc.content[i].to - tc.content[i].from;
        memcpy(buf + k, s + tc.content[i].from, l);
        k += l;
    }
    buf[k] = '\0';
    return buf;
}

Test(toolcall, hermes_one_call_and_content)
{
    const char *s = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                    "{\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>";
    cr_assert_eq(parse(KVP_TOOLS_HERMES, s, 1), 1);
    expect_call(s, 0, "get_weather", "{\"city\": \"Paris\", \"days\": [1, 2]}");
    cr_assert_str_eq(content(s), "Let me check.");
    cr_assert_eq(tc.broken, 0);
}

Test(toolcall, hermes_several_calls)
{
    const char *s = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
                    "<tool_call>\n{\"arguments\": {\"x\": \"}\"}, \"name\": \"b-2\"}\n</tool_call>";
    cr_assert_eq(parse(KVP_TOOLS_HERMES, s, 1), 2);
    expect_call(s, 0, "a", "{}");
    expect_call(s, 1, "b-2", "{\"x\": \"}\"}");
    cr_assert_str_eq(content(s), "");
}

Test(toolcall, hermes_plain_text_is_content)
{
    const char *s = "No tools needed: 1 < 2 and {\"name\": 1}.";
    cr_assert_eq(parse(KVP_TOOLS_HERMES, s, 1), 0);
    cr_assert_str_eq(content(s), s);
    cr_assert_eq(tc.held, strlen(s));
}

Test(toolcall, hermes_streaming_holds_a_possible_opening)
{
    /* a prefix of the marker is held, the text before it is content */
    cr_assert_eq(parse(KVP_TOOLS_HERMES, "Sure <tool_c", 0), 0);
    cr_assert_eq(tc.held, 4);   /* "Sure" (the space before a call is the format's) */
    cr_assert_str_eq(content("Sure <tool_c"), "Sure");
    /* an open call is held whole until it closes */
    const char *open = "Hi\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"x";
    cr_assert_eq(parse(KVP_TOOLS_HERMES, open, 0), 0);
    cr_assert_eq(tc.held, 2);
    const char *closing = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_";
    cr_assert_eq(parse(KVP_TOOLS_HERMES, closing, 0), 0);
    cr_assert_eq(tc.held, 0);
    /* once closed, the call is out and nothing is held */
    const char *done = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    cr_assert_eq(parse(KVP_TOOLS_HERMES, done, 0), 1);
    cr_assert_eq(tc.held, strlen(done));
    /* a '<' that cannot open a call is not held */
    cr_assert_eq(parse(KVP_TOOLS_HERMES, "a <b", 0), 0);
    cr_assert_eq(tc.held, 4);
}

Test(toolcall, hermes_unclosed_at_the_end)
{
    /* whole JSON, the closing tag never came (the reply ended): still a call */
    const char *s = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}";
    cr_assert_eq(parse(KVP_TOOLS_HERMES, s, 1), 1);
    expect_call(s, 0, "f", "{\"a\": 1}");
    /* cut inside the arguments: no call, the text is content and broken is set */
    const char *cut = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": tr";
    cr_assert_eq(parse(KVP_TOOLS_HERMES, cut, 1), 0);
    cr_assert_eq(tc.broken, 1);
    cr_assert_str_eq(content(cut), cut);
}

Test(toolcall, hermes_malformed_calls_are_content)
{
    static const char *bad[] = {
        "<tool_call>\n{\"name\": \"bad name\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\\u0041\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} trailing\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\" \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 01}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"\x01\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}\n</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(parse(KVP_TOOLS_HERMES, bad[i], 1), 0, "case %zu", i);
        cr_assert_eq(tc.broken, 1, "case %zu", i);
        cr_assert_str_eq(content(bad[i]), bad[i], "case %zu", i);
    }
}

Test(toolcall, deep_nesting_is_refused_not_overflowed)
{
    size_t n = 100000;
    char *s = malloc(n + 64);
    cr_assert_not_null(s);
    int k = sprintf(s, "<tool_call>\n{\"name\": \"f\", \"arguments\": ");
    memset(s + k, '[', n);
    s[k + n] = '\0';
    cr_assert_eq(kvp_toolcall_parse(KVP_TOOLS_HERMES, s, strlen(s), 1, &tc), 0);
    cr_assert_eq(tc.broken, 1);
    free(s);
    /* 64 levels are whole JSON */
    char deep[200];
    memset(deep, '[', 60);
    memset(deep + 60, ']', 60);
    deep[120] = ' ';
    cr_assert_eq(kvp_json_value_end(deep, 121), 120);
}

Test(toolcall, json_value_end)
{
    cr_assert_eq(kvp_json_value_end("{\"a\": [1, -2.5e3, true, null, \"x\\\"y\"]} tail", 43), 38);
    cr_assert_eq(kvp_json_value_end("  {}", 4), 4);
    cr_assert_eq(kvp_json_value_end("{\"a\": }", 7), 0);
    cr_assert_eq(kvp_json_value_end("{\"a\" 1}", 7), 0);
    cr_assert_eq(kvp_json_value_end("{", 1), 0);
    cr_assert_eq(kvp_json_value_end("\"\\q\"", 4), 0);
    cr_assert_eq(kvp_json_value_end("\"\\u12g4\"", 8), 0);
    cr_assert_eq(kvp_json_value_end("", 0), 0);
}

Test(toolcall, llama3_json_calls)
{
    const char *s = "{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}";
    cr_assert_eq(parse(KVP_TOOLS_LLAMA3, s, 1), 1);
    expect_call(s, 0, "get_time", "{\"tz\": \"UTC\"}");
    cr_assert_str_eq(content(s), "");
    const char *tag = "<|python_tag|>{\"name\": \"a\", \"arguments\": {}}; {\"name\": \"b\", "
                      "\"parameters\": {\"k\": 1}}";
    cr_assert_eq(parse(KVP_TOOLS_LLAMA3, tag, 1), 2);
    expect_call(tag, 0, "a", "{}");
    expect_call(tag, 1, "b", "{\"k\": 1}");
    /* a reply that does not open with a call is content, braces and all */
    const char *text = "The answer is {\"name\": \"x\", \"parameters\": {}}";
    cr_assert_eq(parse(KVP_TOOLS_LLAMA3, text, 1), 0);
    cr_assert_str_eq(content(text), text);
    /* JSON that is not a call is content */
    const char *json = "{\"city\": \"Paris\"}";
    cr_assert_eq(parse(KVP_TOOLS_LLAMA3, json, 1), 0);
    cr_assert_str_eq(content(json), json);
}

Test(toolcall, llama3_streaming_holds_a_reply_that_opens_with_json)
{
    cr_assert_eq(parse(KVP_TOOLS_LLAMA3, "  ", 0), 0);
    cr_assert_eq(tc.held, 0);
    cr_assert_eq(parse(KVP_TOOLS_LLAMA3, "<|pyth", 0), 0);
    cr_assert_eq(tc.held, 0);
    cr_assert_eq(parse(KVP_TOOLS_LLAMA3, "{\"name\": \"f\", \"param", 0), 0);
    cr_assert_eq(tc.held, 0);
    cr_assert_eq(parse(KVP_TOOLS_LLAMA3, "Hello {", 0), 0);
    cr_assert_eq(tc.held, 7);
}

Test(toolcall, mistral_calls)
{
    const char *s = "Calling.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": [1]}}, "
                    "{\"name\": \"b\", \"arguments\": {}, \"id\": \"abc123def\"}]";
    cr_assert_eq(parse(KVP_TOOLS_MISTRAL, s, 1), 2);
    expect_call(s, 0, "a", "{\"x\": [1]}");
    expect_call(s, 1, "b", "{}");
    cr_assert_str_eq(content(s), "Calling.");
    cr_assert_eq(parse(KVP_TOOLS_MISTRAL, "Hi [TOOL_CA", 0), 0);
    cr_assert_eq(tc.held, 3);
    cr_assert_eq(parse(KVP_TOOLS_MISTRAL, "[TOOL_CALLS][{\"name\"", 0), 0);
    cr_assert_eq(tc.held, 0);
    const char *bad = "[TOOL_CALLS][{\"nome\": \"a\"}]";
    cr_assert_eq(parse(KVP_TOOLS_MISTRAL, bad, 1), 0);
    cr_assert_eq(tc.broken, 1);
    cr_assert_str_eq(content(bad), bad);
}

Test(toolcall, too_many_calls_stop_at_the_cap)
{
    char *s = malloc(64 * (KVP_TOOLCALL_MAX + 2));
    size_t k = 0;
    for (int i = 0; i < KVP_TOOLCALL_MAX + 1; i++)
        k += (size_t)sprintf(s + k, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
    cr_assert_eq(kvp_toolcall_parse(KVP_TOOLS_HERMES, s, k, 1, &tc), KVP_TOOLCALL_MAX);
    cr_assert_eq(tc.broken, 1);
    free(s);
}

Test(toolcall, detect_by_template_then_family)
{
    const char *qwen = "{%- if tools %}<tools>{% endif %}<tool_call>\\n";
    cr_assert_eq(kvp_toolcall_detect(qwen, strlen(qwen), "chatml"), KVP_TOOLS_HERMES);
    const char *llama = "{{- '<|start_header_id|>ipython<|end_header_id|>' }}";
    cr_assert_eq(kvp_toolcall_detect(llama, strlen(llama), "llama3"), KVP_TOOLS_LLAMA3);
    const char *mis = "{{- '[TOOL_CALLS][' }}";
    cr_assert_eq(kvp_toolcall_detect(mis, strlen(mis), "mistral"), KVP_TOOLS_MISTRAL);
    cr_assert_eq(kvp_toolcall_detect(NULL, 0, "chatml"), KVP_TOOLS_HERMES);
    cr_assert_eq(kvp_toolcall_detect(NULL, 0, "llama3"), KVP_TOOLS_LLAMA3);
    cr_assert_eq(kvp_toolcall_detect("x", 1, "gemma"), KVP_TOOLS_NONE);
    cr_assert_eq(kvp_toolcall_detect(NULL, 0, "plain"), KVP_TOOLS_NONE);
}

Test(toolcall, opening_then_arguments_parse)
{
    char buf[256];
    int n = kvp_toolcall_opening(KVP_TOOLS_HERMES, "get_weather", 0, buf, sizeof buf);
    cr_assert_str_eq(buf, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
    cr_assert_eq(n, (int)strlen(buf));
    strcat(buf, "{\"city\": \"Oslo\"}}\n</tool_call>");
    cr_assert_eq(parse(KVP_TOOLS_HERMES, buf, 1), 1);
    expect_call(buf, 0, "get_weather", "{\"city\": \"Oslo\"}");
    enum kvp_tool_format fs[] = {KVP_TOOLS_HERMES, KVP_TOOLS_LLAMA3, KVP_TOOLS_MISTRAL};
    for (int i = 0; i < 3; i++) {
        cr_assert_gt(kvp_toolcall_opening(fs[i], "now", 1, buf, sizeof buf), 0);
        cr_assert_eq(parse(fs[i], buf, 1), 1, "format %d: %s", i, buf);
        expect_call(buf, 0, "now", "{}");
    }
    cr_assert_eq(kvp_toolcall_opening(KVP_TOOLS_HERMES, "a\"b", 0, buf, sizeof buf), -1);
    cr_assert_eq(kvp_toolcall_opening(KVP_TOOLS_NONE, "a", 0, buf, sizeof buf), -1);
    cr_assert_eq(kvp_toolcall_opening(KVP_TOOLS_HERMES, "abc", 0, buf, 10), -1);
}

Test(toolcall, written_calls_parse_back)
{
    enum kvp_tool_format fs[] = {KVP_TOOLS_HERMES, KVP_TOOLS_LLAMA3, KVP_TOOLS_MISTRAL};
    for (int i = 0; i < 3; i++) {
        char *buf = NULL;
        size_t len = 0;
        cr_assert_eq(kvp_toolcall_write(fs[i], "one", 3, "{\"a\": 1}", 8, 0, &buf, &len), 0);
        cr_assert_eq(kvp_toolcall_write(fs[i], "two", 3, "", 0, 1, &buf, &len), 0);
        cr_assert_eq(strlen(buf), len);
        cr_assert_eq(parse(fs[i], buf, 1), 2, "format %d: %s", i, buf);
        expect_call(buf, 0, "one", "{\"a\": 1}");
        expect_call(buf, 1, "two", "{}");
        free(buf);
    }
    /* Hermes writes what Qwen's template renders for assistant tool_calls */
    char *buf = NULL;
    size_t len = 0;
    cr_assert_eq(kvp_toolcall_write(KVP_TOOLS_HERMES, "f", 1, "{}", 2, 0, &buf, &len), 0);
    cr_assert_str_eq(buf, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
    free(buf);
}
