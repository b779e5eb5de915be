/* The OpenAI API's answers (web/oai_reply.h): JSON and Server-Sent Event bytes. */
#include "web/oai_reply.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/utf8.h"

json_t *kvpd_oai_error_json(enum kvpd_oai_code code, const char *param, const char *msg,
                            size_t len)
{
    return json_pack("{s:{s:s%, s:s, s:s?, s:s?}}", "error", "message", msg, len, "type",
                     kvpd_oai_code_type(code), "param", param, "code", kvpd_oai_code_name(code));
}

json_t *kvpd_oai_usage(const kvp_turn_stats *st)
{
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", st->context_tokens,
                     "completion_tokens", st->generated_tokens, "total_tokens",
                     st->context_tokens + st->generated_tokens, "prompt_tokens_details",
                     "cached_tokens", st->cached_tokens);
}

json_t *kvpd_oai_kvpd_stats(const char *session, int durable, const kvp_turn_stats *st)
{
    /* durable: the turn is in the state store (true), its write failed and is retried
     * (false), or there is no store (null) */
    return json_pack("{s:s?, s:i, s:i, s:i, s:I, s:o}", "session", session, "prefilled_tokens",
                     st->prefilled_tokens, "transcript_tokens", st->transcript_tokens,
                     "cache_rows", st->cache_rows, "evicted_rows", (json_int_t)st->evicted_rows,
                     "durable", durable < 0 ? json_null() : json_boolean(durable));
}

const char *kvpd_oai_finish_reason(const kvp_turn_stats *st, int tool_calls)
{
    return tool_calls > 0 ? "tool_calls" : !strcmp(st->stop, "length") ? "length" : "stop";
}

json_t *kvpd_oai_with_shaped(json_t *obj, const kvp_turn_stats *st, const char *limit)
{
    if (obj && st && st->shaped && strcmp(st->stop, "length"))
        json_object_set_new(obj, "kvpd_shaped_by", json_string(limit));
    return obj;
}

/* A token's bytes as a JSON string: valid UTF-8, what cannot be as U+FFFD. */
static json_t *token_string(const kvp_hub_logprob *e)
{
    char buf[3 * 256 + 8];
    kvp_utf8 u = {0};
    size_t n = (size_t)e->len > 256 ? 256 : (size_t)e->len;
    size_t k = kvp_utf8_feed(&u, e->bytes, n, buf);
    k += kvp_utf8_flush(&u, buf + k);
    return json_stringn(buf, k);
}

static double lp_value(float v)
{
    return isfinite(v) ? (double)v : -9999.0;
}

static json_t *token_entry(const kvp_hub_logprob *e, int with_top, int top)
{
    json_t *bytes = json_array();
    for (int i = 0; bytes && i < e->len; i++)
        json_array_append_new(bytes, json_integer((unsigned char)e->bytes[i]));
    json_t *j = json_pack("{s:o, s:f, s:o}", "token", token_string(e), "logprob",
                          lp_value(e->logprob), "bytes", bytes);
    if (j && with_top) {
        json_t *alts = json_array();
        for (int i = 1; alts && i <= top; i++)
            if (e[i].token >= 0)
                json_array_append_new(alts, token_entry(&e[i], 0, 0));
        json_object_set_new(j, "top_logprobs", alts);
    }
    return j;
}

json_t *kvpd_oai_logprobs_content(const kvp_hub_logprob *lp, int n, int top)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, token_entry(lp + (size_t)i * (size_t)(1 + top), 1, top));
    return a;
}

json_t *kvpd_oai_logprobs_legacy(const kvp_hub_logprob *lp, int n, int top, size_t *offset)
{
    json_t *tokens = json_array(), *values = json_array(), *tops = json_array(),
           *offs = json_array();
    for (int i = 0; i < n; i++) {
        const kvp_hub_logprob *e = lp + (size_t)i * (size_t)(1 + top);
        json_array_append_new(tokens, token_string(e));
        json_array_append_new(values, json_real(lp_value(e->logprob)));
        json_t *alts = json_object();
        for (int j = 1; j <= top; j++) {
            if (e[j].token < 0)
                continue;
            json_t *s = token_string(&e[j]);
            /* two tokens with one spelling: the more likely (first) keeps the key */
            if (s && !json_object_get(alts, json_string_value(s)))
                json_object_set_new(alts, json_string_value(s), json_real(lp_value(e[j].logprob)));
            json_decref(s);
        }
        json_array_append_new(tops, alts);
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += (size_t)e->len;
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", values,
                     "top_logprobs", tops, "text_offset", offs);
}

json_t *kvpd_oai_with_logprobs(json_t *j, const kvp_hub_logprob *lp, int n, int top)
{
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    if (choice)
        json_object_set_new(choice, "logprobs",
                            json_pack("{s:o}", "content", kvpd_oai_logprobs_content(lp, n, top)));
    return j;
}

json_t *kvpd_oai_chunk(const kvpd_oai_meta *m, json_t *choices)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", m->id, "object",
                     "chat.completion.chunk", "created", (json_int_t)m->created, "model",
                     m->model, "choices", choices);
}

json_t *kvpd_oai_chunk_role(void)
{
    return json_pack("[{s:i, s:{s:s, s:s}, s:n}]", "index", 0, "delta", "role", "assistant",
                     "content", "", "finish_reason");
}

json_t *kvpd_oai_chunk_delta(json_t *delta)
{
    return json_pack("[{s:i, s:o, s:n}]", "index", 0, "delta", delta, "finish_reason");
}

json_t *kvpd_oai_chunk_finish(const char *finish_reason, const kvp_turn_stats *st)
{
    json_t *choices = json_pack("[{s:i, s:{}, s:s}]", "index", 0, "delta", "finish_reason",
                                finish_reason);
    kvpd_oai_with_shaped(json_array_get(choices, 0), st, "max_tokens");
    return choices;
}

json_t *kvpd_oai_chunk_at(json_t *choices, int index)
{
    json_t *choice = json_array_get(choices, 0);
    if (choice && index)
        json_object_set_new(choice, "index", json_integer(index));
    return choices;
}

json_t *kvpd_oai_completion(const kvpd_oai_meta *m, json_t *message, const char *finish,
                            const kvp_turn_stats *st, const char *session, int durable)
{
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:n, s:s}], s:o, s:s?, s:o}",
                          "id", m->id, "object", "chat.completion", "created",
                          (json_int_t)m->created, "model", m->model, "choices", "index", 0,
                          "message", message, "logprobs", "finish_reason", finish, "usage",
                          kvpd_oai_usage(st), "session", session, "kvpd",
                          kvpd_oai_kvpd_stats(session, durable, st));
    kvpd_oai_with_shaped(json_array_get(json_object_get(j, "choices"), 0), st, "max_tokens");
    return j;
}

json_t *kvpd_oai_models(const char *aliases, const char *model, long created)
{
    json_t *data = json_array();
    for (const char *p = aliases; data && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n)   /* empty ids between commas are no entries */
            json_array_append_new(data, json_pack("{s:s%, s:s, s:I, s:s}", "id", p, n,
                                                  "object", "model", "created",
                                                  (json_int_t)created, "owned_by", "kvpd"));
        p += n + (e != NULL);
    }
    if (data && json_array_size(data) == 0)
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s}", "id", model, "object",
                                              "model", "created", (json_int_t)created,
                                              "owned_by", "kvpd"));
    return json_pack("{s:s, s:o}", "object", "list", "data", data);
}

char *kvpd_oai_sse_frame(const char *name, json_t *j, size_t *len)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        return NULL;
    size_t head = name ? strlen(name) + 8 : 0, n = strlen(s);
    char *frame = malloc(head + n + 9);
    if (frame) {
        if (name) {
            memcpy(frame, "event: ", 7);
            memcpy(frame + 7, name, head - 8);
            frame[head - 1] = '\n';
        }
        memcpy(frame + head, "data: ", 6);
        memcpy(frame + head + 6, s, n);
        memcpy(frame + head + 6 + n, "\n\n", 3);
        *len = head + n + 8;
    }
    free(s);
    return frame;
}

int kvpd_oai_new_id(char *out, size_t len, const char *prefix)
{
    unsigned char raw[12];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return -1;
    int k = snprintf(out, len, "%s", prefix);
    for (size_t i = 0; i < sizeof raw && k > 0 && (size_t)k < len; i++)
        k += snprintf(out + k, len - (size_t)k, "%02x", raw[i]);
    return 0;
}
