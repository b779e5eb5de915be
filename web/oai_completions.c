/* POST /v1/completions (docs/openai.md): OpenAI's legacy text completion. `prompt` (one
 * string) in, `text` out, whole (`text_completion`) or streamed as Server-Sent Events
 * (`text_completion` chunks, then `data: [DONE]`). `logprobs: N` (0..20) gives each
 * token's log-probability and its N most likely alternatives in the legacy shape
 * (tokens, token_logprobs, top_logprobs, text_offset in bytes from the prompt's start).
 * The sampling fields, `max_tokens`,
 * `stop`, `seed` and `stream_options` are the chat completion's (kvpd_oai_options). The
 * prompt goes to kvp_hub_complete, which continues the session whose texts it extends,
 * so a prompt that repeats an earlier prompt and its completion reuses that cache (on a
 * model without a chat template; with one, the prompt runs in a session of its own,
 * tokenized without the template, and is prefilled whole). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "web/openai_impl.h"

static json_t *chunk(const kvpd_oai *o, const char *text, size_t len, const char *finish)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:[{s:s%, s:i, s:n, s:s?}]}", "id", o->id,
                     "object", "text_completion", "created", (json_int_t)o->created, "model",
                     o->model, "choices", "text", text, len, "index", 0, "logprobs",
                     "finish_reason", finish);
}

static void start(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    o->started = 1;
    o->status = 200;
}

/* With logprobs: the choice's logprobs in the legacy shape, of n tokens from lp. */
static json_t *with_logprobs(kvpd_oai *o, json_t *j, const kvp_hub_event *ev, int from, int n)
{
    if (!o->req.turn.logprobs)
        return j;
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    const kvp_hub_logprob *lp = ev->logprobs ? ev->logprobs + (size_t)from * (size_t)(1 + ev->logprobs_top)
                                             : NULL;
    if (choice)
        json_object_set_new(choice, "logprobs",
                            kvpd_oai_logprobs_legacy(lp, lp ? n : 0, ev->logprobs_top,
                                                     &o->req.lp_offset));
    return j;
}

static void token(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    if (!o->req.stream || !ev->len)
        return;
    start(c);
    json_t *j = with_logprobs(o, chunk(o, ev->text, ev->len, NULL), ev, 0, ev->n_logprobs);
    o->req.lp_sent += ev->n_logprobs;
    kvpd_oai_sse(c, NULL, j);
}

static void done(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    const kvp_turn_stats *st = ev->stats;
    const char *finish = kvpd_oai_finish_reason(st, 0);
    if (!o->req.stream) {
        json_t *j = with_logprobs(o, chunk(o, ev->text, ev->len, finish), ev, 0, ev->n_logprobs);
        json_object_set_new(j, "usage", kvpd_oai_usage(st));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(kvpd_oai_shown_session(o), o->durable, st));
        kvpd_oai_answer(c, 200, j);
        return;
    }
    start(c);
    int rest = ev->n_logprobs - o->req.lp_sent;   /* tokens whose text came before */
    kvpd_oai_sse(c, NULL, with_logprobs(o, chunk(o, "", 0, finish), ev, o->req.lp_sent,
                                        rest > 0 ? rest : 0));
    if (o->req.include_usage) {
        json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", o->id, "object",
                              "text_completion", "created", (json_int_t)o->created, "model",
                              o->model, "choices");
        json_object_set_new(j, "usage", kvpd_oai_usage(st));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(kvpd_oai_shown_session(o), o->durable, st));
        kvpd_oai_sse(c, NULL, j);
    }
    kvpd_oai_queue(c, "data: [DONE]\n\n", 14);
    o->ended = 1;
}

static const kvpd_oai_codec codec = {.token = token, .done = done};

/* Fields of the completions API kvpd cannot honour: the first one present, or NULL. */
static const char *refused(json_t *req)
{
    json_t *v = json_object_get(req, "echo");
    if (v && !json_is_null(v) && !json_is_false(v))
        return "echo";
    v = json_object_get(req, "suffix");
    if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
        return "suffix";
    v = json_object_get(req, "best_of");
    if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return "best_of";
    v = json_object_get(req, "top_logprobs");   /* chat's: here logprobs is the count */
    if (v && !json_is_null(v))
        return "top_logprobs";
    /* chat completions' fields, which a text completion has no place for */
    static const char *chat_only[] = {"tools", "tool_choice", "parallel_tool_calls",
                                      "response_format"};
    for (size_t i = 0; i < sizeof chat_only / sizeof chat_only[0]; i++)
        if ((v = json_object_get(req, chat_only[i])) && !json_is_null(v))
            return chat_only[i];
    return NULL;
}

void kvpd_oai_completions(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    json_t *req = kvpd_oai_parse(c);
    if (!req)
        return;
    kvpd_oai_new_id(o->id, sizeof o->id, "cmpl-");
    o->codec = &codec;
    kvp_turn_opts t;
    char msg[256];
    const char *field = refused(req);
    if (field) {
        snprintf(msg, sizeof msg, "%s is not supported by kvpd%s", field,
                 !strcmp(field, "echo") ? " (only echo: false)" : "");
        kvpd_oai_fail(c, KVPD_OAI_E_UNSUPPORTED_PARAMETER, field, msg);
        goto out;
    }
    if (kvpd_oai_model_ok(c, req) < 0 || kvpd_oai_options(c, req, &t) < 0)
        goto out;
    /* logprobs: N, the legacy form: each token's logprob and its N most likely */
    json_t *lp = json_object_get(req, "logprobs");
    if (lp && !json_is_null(lp)) {
        if (!json_is_integer(lp) || json_integer_value(lp) < 0 ||
            json_integer_value(lp) > KVP_LOGPROBS_MAX_TOP) {
            snprintf(msg, sizeof msg, "logprobs must be an integer from 0 to %d",
                     KVP_LOGPROBS_MAX_TOP);
            kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "logprobs", msg);
            goto out;
        }
        t.logprobs = o->req.turn.logprobs = 1;
        t.top_logprobs = o->req.turn.top_logprobs = (int)json_integer_value(lp);
    }
    /* One prompt: a string, or an array holding one string. Token ids and several
     * prompts (one choice each) are not served. */
    json_t *p = json_object_get(req, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (!json_is_string(p)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "prompt", json_is_array(p)
                      ? "prompt must be one string: arrays of token ids and several prompts "
                        "are not supported by kvpd"
                      : "prompt must be a string");
        goto out;
    }
    if (json_string_length(p) == 0) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "prompt", "prompt must not be empty");
        goto out;
    }
    o->req.lp_offset = json_string_length(p);   /* text_offset counts from the prompt's start */
    kvp_hub_client *hc = kvpd_oai_client(c);
    if (hc)
        kvp_hub_complete(hc, json_string_value(p), json_string_length(p), &t);
out:
    json_decref(req);
}
