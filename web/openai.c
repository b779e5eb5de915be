/* The OpenAI-compatible API (docs/openai.md): GET /v1/models and POST
 * /v1/chat/completions, streamed as Server-Sent Events or answered whole, and the routing
 * of the other endpoints to their codecs (web/oai.h). Transport only: a request's
 * messages go to kvp_hub_chat, which finds the conversation they extend. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/log.h"
#include "base/parse.h"
#include "model/grammar.h"
#include "web/conn.h"
#include "web/format.h"
#include "web/oai.h"
#include "web/oai_tools.h"


/* ---- answers ---- */

static const char *error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* Queues a body frame (the headers go first, on the writeable callback). */
static void queue(kvpd_conn *c, const char *text, size_t len)
{
    kvpd_oai *o = c->oai;
    if (kvpd_conn_queue(c, text, len) < 0) {
        kvpd_log("warning", "out of memory for an API answer; closing the connection");
        lws_set_timeout(c->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
        return;
    }
    o->queued_bytes += len;
}

/* The whole answer: a JSON body with a status. */
static void answer(kvpd_conn *c, int status, json_t *j)
{
    kvpd_oai *o = c->oai;
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    o->status = s ? status : 500;
    o->ended = 1;
    const char *fallback = "{\"error\":{\"message\":\"the server could not build its answer\","
                           "\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    queue(c, s ? s : fallback, strlen(s ? s : fallback));
    free(s);
}

/* OpenAI's error shape. param and code may be NULL. */
static void fail(kvpd_conn *c, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void fail(kvpd_conn *c, int status, const char *param, const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->oai->error_code = code ? code : error_type(status);
    answer(c, status, json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", msg,
                                "type", error_type(status), "param", param, "code", code));
}

static json_t *usage(const kvp_turn_stats *st)
{
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", st->context_tokens,
                     "completion_tokens", st->generated_tokens, "total_tokens",
                     st->context_tokens + st->generated_tokens, "prompt_tokens_details",
                     "cached_tokens", st->cached_tokens);
}

/* kvpd's own figures beside OpenAI's: what this turn cost the daemon. */
static json_t *kvpd_stats(const kvpd_oai *o, const kvp_turn_stats *st)
{
    /* durable: the turn is in the state store (true), its write failed and is retried
     * (false), or there is no store (null) */
    return json_pack("{s:s, s:i, s:i, s:i, s:I, s:o}", "session", o->session, "prefilled_tokens",
                     st->prefilled_tokens, "transcript_tokens", st->transcript_tokens,
                     "cache_rows", st->cache_rows, "evicted_rows", (json_int_t)st->evicted_rows,
                     "durable", o->durable < 0 ? json_null() : json_boolean(o->durable));
}

/* o NULL: an answer that carries no tool calls (completions, responses). */
static const char *finish_reason(const kvp_turn_stats *st, const kvpd_oai *o)
{
    return o && o->tool_calls > 0 ? "tool_calls" : !strcmp(st->stop, "length") ? "length"
                                                                              : "stop";
}

/* One SSE event. */
static void sse(kvpd_conn *c, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        kvpd_log("warning", "could not build a stream chunk");
        return;
    }
    size_t n = strlen(s);
    char *frame = malloc(n + 9);
    if (frame) {
        memcpy(frame, "data: ", 6);
        memcpy(frame + 6, s, n);
        memcpy(frame + 6 + n, "\n\n", 3);
        queue(c, frame, n + 8);
    }
    free(frame);
    free(s);
}

static json_t *chunk(const kvpd_oai *o, json_t *choices)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", o->id, "object",
                     "chat.completion.chunk", "created", (json_int_t)o->created, "model",
                     o->model, "choices", choices);
}

static void stream_start(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    if (o->started)
        return;
    o->started = 1;
    o->status = 200;
    sse(c, chunk(o, json_pack("[{s:i, s:{s:s, s:s}, s:n}]", "index", 0, "delta", "role",
                              "assistant", "content", "", "finish_reason")));
}

/* Tool calling: the deltas the reply's text makes (content held while it may be a call). */
static void stream_tools(kvpd_conn *c, const char *text, size_t len, int final)
{
    kvpd_oai *o = c->oai;
    json_t *deltas = kvpd_oai_tools_feed(&o->tools, text, len, final);
    size_t i;
    json_t *d;
    json_array_foreach(deltas, i, d)
        sse(c, chunk(o, json_pack("[{s:i, s:O, s:n}]", "index", 0, "delta", d, "finish_reason")));
    json_decref(deltas);
    o->tool_calls = o->tools.calls_sent;
}

static void stream_text(kvpd_conn *c, const char *text, size_t len)
{
    kvpd_oai *o = c->oai;
    if (o->tools.parse) {
        stream_tools(c, text, len, 0);
        return;
    }
    if (!len)
        return;
    json_t *delta = json_object();
    json_object_set_new(delta, "content", json_stringn(text, len));
    sse(c, chunk(o, json_pack("[{s:i, s:o, s:n}]", "index", 0, "delta", delta,
                              "finish_reason")));
}

/* ---- the hub's events ---- */

static void finish_stream(kvpd_conn *c, const kvp_turn_stats *st)
{
    kvpd_oai *o = c->oai;
    stream_start(c);
    if (o->tools.parse)
        stream_tools(c, "", 0, 1);
    sse(c, chunk(o, json_pack("[{s:i, s:{}, s:s}]", "index", 0, "delta", "finish_reason",
                              finish_reason(st, o))));
    if (o->include_usage) {
        json_t *j = chunk(o, json_array());
        json_object_set_new(j, "usage", usage(st));
        json_object_set_new(j, "kvpd", kvpd_stats(o, st));
        sse(c, j);
    }
    queue(c, "data: [DONE]\n\n", 14);
    o->ended = 1;
}

/* A turn that ended "cancel" for this API client was cut by the daemon's shutdown (the
 * API has no cancel, and a client that leaves gets no events): the reply is not whole,
 * so it is an error, never finish_reason "stop". */
static void cut(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    static const char msg[] = "the server is shutting down: the reply was cut";
    o->retry_after_s = 1;
    o->error_code = "server_shutting_down";
    if (o->started)
        kvpd_labelled_add(&c->w->metrics->api_errors, "server_shutting_down", 503);
    if (o->started && o->codec && o->codec->stream_error) {
        o->codec->stream_error(c, 503, "server_shutting_down", msg, sizeof msg - 1);
        o->ended = 1;
        return;
    }
    if (o->started) {   /* the stream's 200 is out: the error goes in the stream */
        sse(c, json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type",
                         error_type(503), "param", "code", "server_shutting_down"));
        queue(c, "data: [DONE]\n\n", 14);
        o->ended = 1;
        return;
    }
    o->close = 1;
    answer(c, 503, json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type",
                             error_type(503), "param", "code", "server_shutting_down"));
}

static void done(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    const kvp_turn_stats *st = ev->stats;
    o->durable = ev->durable;
    if (!strcmp(st->stop, "cancel")) {
        cut(c);
        return;
    }
    if (o->codec && o->codec->done) {
        o->codec->done(c, ev);
        return;
    }
    if (o->stream) {   /* the tokens carried the whole reply */
        finish_stream(c, st);
        return;
    }
    json_t *msg = kvpd_oai_tools_reply(&o->tools, ev->text, ev->len, &o->tool_calls);
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:n, s:s}], s:o, s:s, s:o}",
                          "id", o->id, "object", "chat.completion", "created",
                          (json_int_t)o->created, "model", o->model, "choices", "index", 0,
                          "message", msg, "logprobs", "finish_reason", finish_reason(st, o),
                          "usage", usage(st), "session", o->session, "kvpd", kvpd_stats(o, st));
    answer(c, 200, j);
}

static void hub_error(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    int status = 500;
    const char *code = ev->code;
    if (!strcmp(code, KVPD_E_OVERLOADED) || !strcmp(code, KVPD_E_BUSY)) {
        status = c->w->draining ? 503 : 429;
        int ms = ev->retry_after_ms > 0 ? ev->retry_after_ms : kvp_hub_retry_hint_ms(c->w->hub);
        o->retry_after_s = (ms + 999) / 1000;
    } else if (!strcmp(code, KVPD_E_ELSEWHERE)) {
        /* another node serves the session now: the balancer may retry (docs/cluster.md) */
        status = 503;
        o->retry_after_s = (ev->retry_after_ms + 999) / 1000;
    } else if (!strcmp(code, KVPD_E_TOO_LARGE)) {
        status = 400;
        code = "context_length_exceeded";
    } else if (!strcmp(code, KVPD_E_BAD_REQUEST) || !strcmp(code, KVPD_E_UNKNOWN_SESSION)) {
        status = 400;
    }
    if (o->started)
        kvpd_labelled_add(&c->w->metrics->api_errors, code, status);
    if (o->started && o->codec && o->codec->stream_error) {
        o->codec->stream_error(c, status, code, ev->text, ev->len);
        o->ended = 1;
        return;
    }
    if (o->started) {   /* the stream's 200 is out: the error goes in the stream */
        sse(c, json_pack("{s:{s:s%, s:s, s:n, s:s}}", "error", "message", ev->text, ev->len,
                         "type", error_type(status), "param", "code", code));
        queue(c, "data: [DONE]\n\n", 14);
        o->ended = 1;
        return;
    }
    char msg[512];
    snprintf(msg, sizeof msg, "%.*s", (int)ev->len, ev->text);
    fail(c, status, NULL, code, "%s", msg);
}

static void on_hub_event(void *ctx, const kvp_hub_event *ev)
{
    kvpd_conn *c = ctx;
    kvpd_oai *o = c->oai;
    if (!o || o->ended)
        return;
    switch (ev->type) {
    case KVP_HUB_SESSION:
        snprintf(o->session, sizeof o->session, "%s", ev->id);
        break;
    case KVP_HUB_TOKEN:
        if (o->codec && o->codec->token)
            o->codec->token(c, ev);
        else if (o->stream) {
            stream_start(c);
            stream_text(c, ev->text, ev->len);
        }
        break;
    case KVP_HUB_DONE:
        done(c, ev);
        break;
    case KVP_HUB_ERROR:
        hub_error(c, ev);
        break;
    }
}

/* ---- the request ---- */

/* A message's text: a string, or an array of {"type":"text","text":...} parts. */
static int content_text(json_t *content, char **out, size_t *len)
{
    if (json_is_string(content)) {
        *len = json_string_length(content);
        *out = malloc(*len + 1);
        if (!*out)
            return -ENOMEM;
        memcpy(*out, json_string_value(content), *len + 1);
        return 0;
    }
    if (!json_is_array(content))
        return -EINVAL;
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(json_object_get(part, "type")) ||
            strcmp(json_string_value(json_object_get(part, "type")), "text") ||
            !json_is_string(text))
            return -EINVAL;
        total += json_string_length(text);
    }
    *out = malloc(total + 1);
    if (!*out)
        return -ENOMEM;
    *len = 0;
    json_array_foreach(content, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(*out + *len, json_string_value(text), json_string_length(text));
        *len += json_string_length(text);
    }
    (*out)[*len] = '\0';
    return 0;
}

static void free_messages(kvp_message *m, int n)
{
    for (int i = 0; i < n; i++)
        free(m[i].text);
    free(m);
}

/* The request's messages as the hub's: a system (or developer) message first is the
 * conversation's system text (*system, malloc'd; NULL for none), as the chat template
 * renders it; later ones are folded into the user message that follows them. Returns
 * the count, or -1 after answering. */
static int messages(kvpd_conn *c, json_t *arr, kvp_message **out, char **system,
                    size_t *system_len)
{
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) || n == 0) {
        fail(c, 400, "messages", NULL, "messages must be a non-empty array");
        return -1;
    }
    kvp_message *m = calloc(n, sizeof *m);
    *system = NULL;
    *system_len = 0;
    char *pending = NULL;   /* system text waiting for its user message */
    size_t pending_len = 0;
    int k = 0;
    char param[48];
    for (size_t i = 0; m && i < n; i++) {
        json_t *msg = json_array_get(arr, i);
        json_t *jrole = json_object_get(msg, "role");
        const char *role = json_string_value(jrole);
        if (role && strlen(role) != json_string_length(jrole))
            role = NULL;   /* a NUL inside: no role */
        snprintf(param, sizeof param, "messages[%zu].role", i);
        int sys_role = role && (!strcmp(role, "system") || !strcmp(role, "developer"));
        if (!role || (!sys_role && strcmp(role, "user") && strcmp(role, "assistant") &&
                      strcmp(role, "tool"))) {
            fail(c, 400, param, NULL, "%s must be system, developer, user, assistant or tool",
                 param);
            goto bad;
        }
        char *text;
        size_t len;
        int rc = content_text(json_object_get(msg, "content"), &text, &len);
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (rc == -ENOMEM)
            goto oom;
        if (rc < 0) {
            fail(c, 400, param, NULL, "%s must be a string or an array of text parts", param);
            goto bad;
        }
        if (sys_role && i == 0) {
            *system = text;
            *system_len = len;
            continue;
        }
        if (sys_role) {
            char *p = realloc(pending, pending_len + len + 3);
            if (!p) {
                free(text);
                goto oom;
            }
            pending = p;
            memcpy(pending + pending_len, text, len);
            pending_len += len;
            memcpy(pending + pending_len, "\n\n", 3);
            pending_len += 2;
            free(text);
            continue;
        }
        int user = !strcmp(role, "user") ? 1 : !strcmp(role, "tool") ? KVP_MESSAGE_TOOL : 0;
        if (user == 1 && pending) {
            char *p = realloc(pending, pending_len + len + 1);
            if (!p) {
                free(text);
                goto oom;
            }
            memcpy(p + pending_len, text, len + 1);
            free(text);
            text = p;
            len += pending_len;
            pending = NULL;
            pending_len = 0;
        }
        m[k++] = (kvp_message){user, text, len};
    }
    if (!m)
        goto oom;
    if (k == 0 || !m[k - 1].user || pending) {
        fail(c, 400, "messages", NULL, "the last message must be the user's (or tool results)");
        goto bad;
    }
    *out = m;
    return k;
oom:
    fail(c, 500, NULL, NULL, "out of memory");
bad:
    free(pending);
    free(*system);
    *system = NULL;
    if (m)
        free_messages(m, k);
    return -1;
}

static int is_session_id(const char *s)
{
    if (strlen(s) != KVP_SESSION_ID_LEN)
        return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return 0;
    return 1;
}

/* Fields whose meaning kvpd cannot honour: the first one present, or NULL. */
static const char *unsupported(json_t *req)
{
    static const char *absent[] = {"functions", "function_call", "top_logprobs", "audio",
                                   "prediction"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        json_t *v = json_object_get(req, absent[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
            return absent[i];
    }
    if (json_is_true(json_object_get(req, "logprobs")))
        return "logprobs";
    json_t *mod = json_object_get(req, "modalities");
    if (mod && !json_is_null(mod) && (json_array_size(mod) != 1 ||
                                      !json_is_string(json_array_get(mod, 0)) ||
                                      strcmp(json_string_value(json_array_get(mod, 0)), "text")))
        return "modalities";
    return NULL;
}

/* A number field in [lo, hi] (absent or null: *has 0). -1 after answering. */
static int number(kvpd_conn *c, json_t *req, const char *name, double lo, double hi,
                  int *has, double *out)
{
    json_t *v = json_object_get(req, name);
    *has = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi) {
        fail(c, 400, name, NULL, "%s must be a number from %g to %g", name, lo, hi);
        return -1;
    }
    *has = 1;
    *out = json_number_value(v);
    return 0;
}

/* The sampler's fields beyond temperature and top_p: OpenAI's frequency_penalty,
 * presence_penalty and logit_bias, and top_k, min_p, repetition_penalty as llama.cpp's
 * and vLLM's servers take them. -1 after answering. */
static int sampling(kvpd_conn *c, json_t *req, kvp_sample_opts *so)
{
    kvpd_oai *o = c->oai;
    static const char *const name[] = {"frequency_penalty", "presence_penalty", "min_p",
                                       "repetition_penalty", "top_k"};
    static const double lo[] = {-2, -2, 0, 0, 0}, hi[] = {2, 2, 1, 10, 1e9};
    float *out[] = {&so->frequency_penalty, &so->presence_penalty, &so->min_p,
                    &so->repetition_penalty};
    for (int i = 0; i < 5; i++) {
        int has;
        double v = 0;
        if (number(c, req, name[i], lo[i], hi[i], &has, &v) < 0)
            return -1;
        if (has && ((i == 3 && v <= 0) || (i == 4 && v != (long)v))) {
            fail(c, 400, name[i], NULL, i == 3 ? "repetition_penalty must be above 0"
                                               : "top_k must be an integer");
            return -1;
        }
        if (i < 4)
            *out[i] = has ? (float)v : 0.0f;
        else
            so->top_k = has ? (int)v : 0;
    }
    json_t *lb = json_object_get(req, "logit_bias");
    if (!lb || json_is_null(lb))
        return 0;
    if (!json_is_object(lb) || json_object_size(lb) > KVP_SAMPLER_MAX_BIAS) {
        fail(c, 400, "logit_bias", NULL, "logit_bias must be an object of at most %d token "
             "ids, each mapped to a number from -100 to 100", KVP_SAMPLER_MAX_BIAS);
        return -1;
    }
    free(o->bias);
    o->bias = NULL;
    size_t n = json_object_size(lb);
    if (n && !(o->bias = malloc(n * sizeof *o->bias))) {
        fail(c, 500, NULL, NULL, "out of memory");
        return -1;
    }
    const char *key;
    json_t *v;
    int k = 0;
    json_object_foreach(lb, key, v) {
        long id;
        if (!kvp_parse_long(key, 0, 1L << 30, &id) || !json_is_number(v) ||
            json_number_value(v) < -100 || json_number_value(v) > 100) {
            fail(c, 400, "logit_bias", NULL, "logit_bias: \"%s\" must be a token id mapped "
                 "to a number from -100 to 100", key);
            return -1;
        }
        o->bias[k++] = (kvp_logit_bias){(int)id, (float)json_number_value(v)};
    }
    so->bias = o->bias;
    so->n_bias = k;
    return 0;
}

/* The turn's options and the answer's form from the request. -1 after answering. */
static int options(kvpd_conn *c, json_t *req, kvp_turn_opts *t)
{
    kvpd_oai *o = c->oai;
    memset(t, 0, sizeof *t);
    const char *field = unsupported(req);
    if (field) {
        fail(c, 400, field, "unsupported_parameter", "%s is not supported by kvpd", field);
        return -1;
    }
    kvpd_oai_tools_err te;
    if (kvpd_oai_tools_request(&o->tools, req, o->tool_format, t, &te) < 0) {
        fail(c, 400, te.param, NULL, "%s", te.msg);
        return -1;
    }
    int has;
    double v = 0;
    json_t *n = json_object_get(req, "n");
    if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1)) {
        fail(c, 400, "n", "unsupported_parameter", "n must be 1: kvpd answers with one choice");
        return -1;
    }
    const char *caps[] = {"max_completion_tokens", "max_tokens"};
    for (int i = 0; i < 2; i++) {
        if (number(c, req, caps[i], 1, 1e9, &has, &v) < 0)
            return -1;
        if (has && v != (long)v) {
            fail(c, 400, caps[i], NULL, "%s must be an integer", caps[i]);
            return -1;
        }
        if (has && !t->max_tokens)   /* the newer name wins */
            t->max_tokens = v > c->w->cfg->max_tokens ? c->w->cfg->max_tokens : (int)v;
    }
    if (number(c, req, "temperature", 0, 2, &t->has_temperature, &v) < 0)
        return -1;
    t->temperature = (float)v;
    if (number(c, req, "top_p", 0, 1, &t->has_top_p, &v) < 0)
        return -1;
    t->top_p = (float)v;
    if (sampling(c, req, &t->sampling) < 0)
        return -1;
    const char *param;
    char msg[400];
    kvp_grammar_unref(o->grammar);
    if (kvpd_response_format(json_object_get(req, "response_format"), &o->grammar, &param, msg,
                             sizeof msg) < 0) {
        fail(c, 400, param, "unsupported_parameter", "%s", msg);
        return -1;
    }
    t->grammar = o->grammar;
    json_t *seed = json_object_get(req, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) {
            fail(c, 400, "seed", NULL, "seed must be an integer");
            return -1;
        }
        t->has_seed = 1;
        t->seed = (uint64_t)json_integer_value(seed);
    }
    json_t *stop = json_object_get(req, "stop");
    json_t *one = json_is_string(stop) ? json_array() : NULL;
    if (one)
        json_array_append(one, stop);
    json_t *stops = one ? one : stop;
    if (stops && !json_is_null(stops)) {
        size_t i;
        json_t *s;
        int ok = json_is_array(stops) && json_array_size(stops) <= KVP_HUB_MAX_STOPS;
        json_array_foreach(stops, i, s)
            ok = ok && json_is_string(s) && json_string_length(s) > 0 &&
                 json_string_length(s) <= KVP_HUB_STOP_MAX;
        if (!ok) {
            json_decref(one);
            fail(c, 400, "stop", NULL, "stop must be a string or up to 4 non-empty strings");
            return -1;
        }
        json_array_foreach(stops, i, s) {
            size_t len = json_string_length(s);
            if (!(o->stops[o->n_stops] = malloc(len)))
                break;
            memcpy(o->stops[o->n_stops], json_string_value(s), len);
            t->stop[o->n_stops] = o->stops[o->n_stops];
            t->stop_len[o->n_stops] = len;
            t->n_stop = ++o->n_stops;
        }
        if (o->n_stops < (int)json_array_size(stops)) {
            json_decref(one);
            fail(c, 500, NULL, NULL, "out of memory");
            return -1;
        }
    }
    json_decref(one);
    json_t *stream = json_object_get(req, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream)) {
        fail(c, 400, "stream", NULL, "stream must be a boolean");
        return -1;
    }
    o->stream = json_is_true(stream);
    json_t *so = json_object_get(req, "stream_options");
    o->include_usage = json_is_true(json_object_get(so, "include_usage"));
    return 0;
}

static void chat_completions(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    kvpd_web *w = c->w;
    json_error_t jerr;
    /* Texts may hold NUL (\u0000): kvpd's own replies can, and they come back in the
     * history; every text is handled by its length. Duplicate keys are refused, as on
     * the websocket (docs/protocol.md). */
    json_t *req = json_loadb(o->body ? o->body : "", o->body_len,
                             JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
    if (!req) {
        fail(c, 400, NULL, "invalid_json", "the body is not valid JSON: %s (at byte %d)",
             jerr.text, jerr.position);
        return;
    }
    kvp_message *msgs = NULL;
    char *system = NULL;
    size_t system_len = 0;
    int n = -1;
    kvp_turn_opts t;
    if (!json_is_object(req)) {
        fail(c, 400, NULL, "invalid_json", "the body must be a JSON object");
        goto out;
    }
    if (kvpd_oai_model_ok(c, req) < 0 || options(c, req, &t) < 0)
        goto out;
    json_t *hist = NULL;
    kvpd_oai_tools_err te;
    if (kvpd_oai_tools_messages(&o->tools, json_object_get(req, "messages"), &hist, &te) < 0) {
        fail(c, 400, te.param, NULL, "%s", te.msg);
        goto out;
    }
    n = messages(c, hist, &msgs, &system, &system_len);
    json_decref(hist);
    if (n < 0)
        goto out;
    if (system_len > KVP_HUB_SYSTEM_MAX) {
        fail(c, 400, "messages[0].content", NULL, "the system message is limited to %d bytes",
             KVP_HUB_SYSTEM_MAX);
        goto out;
    }
    char sid[KVP_SESSION_ID_LEN + 8] = "";
    json_t *named = json_object_get(req, "session");
    if (json_is_string(named))
        snprintf(sid, sizeof sid, "%s", json_string_value(named));
    else if (named && !json_is_null(named)) {
        fail(c, 400, "session", NULL, "session must be a string");
        goto out;
    } else if (lws_hdr_custom_copy(c->wsi, sid, sizeof sid, "x-session-id:", 13) < 0)
        sid[0] = '\0';
    if (sid[0] && !is_session_id(sid)) {
        fail(c, 400, "session", NULL, "a session id is 32 lowercase hex digits");
        goto out;
    }
    if (!(o->client = kvp_hub_client_new(w->hub, on_hub_event, c))) {
        fail(c, 500, NULL, NULL, "out of memory");
        goto out;
    }
    kvp_hub_client_set_tenant(o->client, c->tenant);
    o->close = o->stream;   /* a stream's end is the connection's */
    kvp_hub_chat(o->client, sid, system, system_len, msgs, n, &t);
out:
    if (msgs)
        free_messages(msgs, n);
    free(system);
    json_decref(req);
}

/* One entry per model_alias id (the model's own name without any). */
static void models(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    json_t *data = json_array();
    char ids[sizeof c->w->cfg->model_alias];
    snprintf(ids, sizeof ids, "%s", c->w->cfg->model_alias);
    char *save = NULL;
    for (char *id = strtok_r(ids, ",", &save); data && id; id = strtok_r(NULL, ",", &save))
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object",
                                              "model", "created", (json_int_t)o->created,
                                              "owned_by", "kvpd"));
    if (data && json_array_size(data) == 0)
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s}", "id", o->model, "object",
                                              "model", "created", (json_int_t)o->created,
                                              "owned_by", "kvpd"));
    answer(c, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

/* Routes the request once the whole of it (the body, for a POST) is in. */
static void route(kvpd_conn *c, const char *uri, int post)
{
    kvpd_oai *o = c->oai;
    kvpd_web *w = c->w;
    if (!kvpd_api_tenant(w, c->wsi, c->tenant)) {
        fail(c, 401, NULL, "invalid_api_key", "a valid API key is required "
             "(Authorization: Bearer <api_key>)");
        return;
    }
    const char *rid = NULL;
    enum kvpd_oai_path path = kvpd_openai_path(uri, &rid);
    int del = lws_hdr_total_length(c->wsi, WSI_TOKEN_DELETE_URI) > 0;
    int list = path == KVPD_OAI_MODELS, one = path == KVPD_OAI_RESPONSE;
    if (path == KVPD_OAI_UNKNOWN || path == KVPD_OAI_NONE) {
        fail(c, 404, NULL, "unknown_url", "no such endpoint: %s", uri);
        return;
    }
    if (one ? post : (list ? post || del : !post || del)) {
        fail(c, 405, NULL, "method_not_allowed", "%s takes %s", uri,
             one ? "GET or DELETE" : list ? "GET" : "POST");
        return;
    }
    if (w->draining || !w->hub) {
        o->retry_after_s = 1;
        fail(c, 503, NULL, NULL, w->draining ? "the server is shutting down"
                                            : "the model is loading");
        return;
    }
    kvp_hub_info hi;
    kvp_hub_info_get(w->hub, &hi);
    snprintf(o->model, sizeof o->model, "%s", hi.model_name);
    o->tool_format = hi.tool_format;
    if (list) {
        models(c);
        return;
    }
    if (one) {
        kvpd_oai_response_get(c, rid, del);
        return;
    }
    if (o->body_too_large) {
        o->close = 1;
        fail(c, 413, NULL, "request_too_large", "request bodies are limited to %d bytes "
             "(max_body_bytes)", w->cfg->max_body_bytes);
        return;
    }
    if (path == KVPD_OAI_COMPLETIONS)
        kvpd_oai_completions(c);
    else if (path == KVPD_OAI_RESPONSES)
        kvpd_oai_responses(c);
    else
        chat_completions(c);
}

int kvpd_openai_request(kvpd_conn *c, const char *uri)
{
    kvpd_oai *o = calloc(1, sizeof *o);
    if (!o)
        return -1;
    c->oai = o;
    o->created = (long)time(NULL);
    char origin[sizeof o->origin];
    const char *cors = kvpd_guard_cors(c->w, c->wsi, origin, sizeof origin);
    snprintf(o->origin, sizeof o->origin, "%s", cors ? cors : "");
    /* A random id: nothing of the session's (its id is the key to the conversation). */
    unsigned char raw[12];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return -1;
    int k = snprintf(o->id, sizeof o->id, "chatcmpl-");
    for (size_t i = 0; i < sizeof raw; i++)
        k += snprintf(o->id + k, sizeof o->id - (size_t)k, "%02x", raw[i]);
    o->path = kvpd_openai_path(uri, NULL);
    int post = lws_hdr_total_length(c->wsi, WSI_TOKEN_POST_URI) > 0;
    if (post)   /* the body comes first; route() runs on its completion */
        return 0;
    route(c, uri, 0);
    lws_callback_on_writable(c->wsi);
    return 0;
}

int kvpd_openai_body(kvpd_conn *c, const void *in, size_t len)
{
    kvpd_oai *o = c->oai;
    size_t max = (size_t)c->w->cfg->max_body_bytes;
    if (len == 0 || o->body_done)   /* lws reports an empty body as one empty piece */
        return 0;
    if (o->body_too_large || o->body_len + len > max) {
        o->body_too_large = 1;   /* read and dropped; answered 413 at the end */
        return 0;
    }
    if (o->body_len + len > o->body_cap) {
        size_t cap = o->body_cap ? o->body_cap : 4096;
        while (cap < o->body_len + len)
            cap *= 2;
        char *b = realloc(o->body, cap);
        if (!b)
            return -1;
        o->body = b;
        o->body_cap = cap;
    }
    memcpy(o->body + o->body_len, in, len);
    o->body_len += len;
    return 0;
}

int kvpd_openai_body_done(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    if (o->body_done)   /* a request is routed once (web/wsguard.c holds what follows) */
        return 0;
    o->body_done = 1;
    char uri[128];
    if (lws_hdr_copy(c->wsi, uri, sizeof uri, WSI_TOKEN_POST_URI) <= 0)
        snprintf(uri, sizeof uri, "?");
    route(c, uri, 1);
    free(o->body);
    o->body = NULL;
    o->body_len = o->body_cap = 0;
    lws_callback_on_writable(c->wsi);
    return 0;
}

static int write_headers(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    const char *extra[11 + 2 * KVPD_CORS_HEADERS];
    int k = kvpd_cors_headers(o->origin[0] ? o->origin : NULL, extra);
    char retry[16];
    if (o->session[0]) {
        extra[k++] = "x-session-id:";
        extra[k++] = o->session;
    }
    if (o->status == 200 && !o->stream && o->durable >= 0) {   /* a whole answer's turn */
        extra[k++] = "x-kvpd-durable:";
        extra[k++] = o->durable ? "true" : "false";
    }
    if (o->retry_after_s > 0) {
        snprintf(retry, sizeof retry, "%d", o->retry_after_s);
        extra[k++] = "retry-after:";
        extra[k++] = retry;
    }
    int stream = o->stream && o->status == 200;
    if (o->close && !stream) {   /* lws says so itself for a body without a length */
        extra[k++] = "connection:";
        extra[k++] = "close";
    }
    if (o->status == 401) {
        extra[k++] = "www-authenticate:";
        extra[k++] = "Bearer realm=\"kvpd\"";
    }
    extra[k] = NULL;
    o->headers_sent = 1;
    if (o->status >= 400)
        kvpd_labelled_add(&c->w->metrics->api_errors,
                          o->error_code ? o->error_code : error_type(o->status), o->status);
    return kvpd_http_headers(c, o->status, stream ? "text/event-stream" : "application/json",
                             stream ? KVPD_HTTP_NO_LENGTH : o->queued_bytes, extra);
}

int kvpd_openai_writeable(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    if (!c->out_head)   /* nothing yet: a stream waits for its first token */
        return 0;
    if (!o->headers_sent) {
        if (write_headers(c))
            return -1;
        lws_callback_on_writable(c->wsi);
        return 0;
    }
    kvpd_frame *f = c->out_head;
    c->out_head = f->next;
    if (!c->out_head)
        c->out_tail = NULL;
    int last = !c->out_head && o->ended;
    int stream = o->stream && o->status == 200;
    int n = lws_write(c->wsi, f->buf + LWS_PRE, f->len,
                      last && !stream ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP);
    free(f);
    c->w->frames_pending--;
    if (n < 0)
        return -1;
    if (!last) {
        if (c->out_head)
            lws_callback_on_writable(c->wsi);
        return 0;
    }
    /* The answer is out: the request lets go of its session. A request pipelined
     * behind it was dropped unread (web/wsguard.c): closing tells the client to send
     * it again. */
    int close = o->close;
    if (kvpd_wsguard_release(lws_get_socket_fd(c->wsi)))
        close = 1;
    kvpd_openai_closed(c);
    if (close)
        return -1;
    return lws_http_transaction_completed(c->wsi) ? -1 : 0;
}

void kvpd_openai_closed(kvpd_conn *c)
{
    kvpd_oai *o = c ? c->oai : NULL;
    if (!o)
        return;
    if (o->client)   /* a turn still running is cancelled; its partial reply stays */
        kvp_hub_close(o->client);
    for (int i = 0; i < o->n_stops; i++)
        free(o->stops[i]);
    free(o->bias);
    kvp_grammar_unref(o->grammar);
    free(o->body);
    kvpd_oai_tools_free(&o->tools);
    if (o->codec && o->codec->free)
        o->codec->free(o->codec_state);
    free(o);
    c->oai = NULL;
}

/* ---- the path, and the helpers of the other codecs (web/oai.h) ---- */

int kvpd_openai_path(const char *uri, const char **id)
{
    int v1 = !strncmp(uri, "/v1/", 4);
    const char *p = v1 ? uri + 3 : uri;
    if (id)
        *id = NULL;
    if (!strcmp(p, "/chat/completions"))
        return KVPD_OAI_CHAT;
    if (!strcmp(p, "/models"))
        return KVPD_OAI_MODELS;
    if (!strcmp(p, "/completions"))
        return KVPD_OAI_COMPLETIONS;
    if (!strcmp(p, "/responses"))
        return KVPD_OAI_RESPONSES;
    if (!strncmp(p, "/responses/", 11) && p[11] && !strchr(p + 11, '/')) {
        if (id)
            *id = p + 11;
        return KVPD_OAI_RESPONSE;
    }
    return v1 || !strcmp(uri, "/v1") ? KVPD_OAI_UNKNOWN : KVPD_OAI_NONE;
}

const char *kvpd_openai_path_label(const char *uri)
{
    static const char *const label[] = {
        [KVPD_OAI_CHAT] = "/v1/chat/completions", [KVPD_OAI_MODELS] = "/v1/models",
        [KVPD_OAI_COMPLETIONS] = "/v1/completions", [KVPD_OAI_RESPONSES] = "/v1/responses",
        [KVPD_OAI_RESPONSE] = "/v1/responses/{id}", [KVPD_OAI_UNKNOWN] = "/v1/other"};
    enum kvpd_oai_path p = kvpd_openai_path(uri, NULL);
    return p == KVPD_OAI_NONE ? NULL : label[p];
}

void kvpd_oai_answer(kvpd_conn *c, int status, json_t *j)
{
    answer(c, status, j);
}

void kvpd_oai_fail(kvpd_conn *c, int status, const char *param, const char *code,
                   const char *msg)
{
    fail(c, status, param, code, "%s", msg);
}

void kvpd_oai_sse(kvpd_conn *c, const char *name, json_t *j)
{
    if (!name) {
        sse(c, j);
        return;
    }
    size_t n = strlen(name);
    char *line = malloc(n + 8);
    if (line) {
        memcpy(line, "event: ", 7);
        memcpy(line + 7, name, n);
        line[7 + n] = '\n';
        queue(c, line, n + 8);
    }
    free(line);
    sse(c, j);
}

void kvpd_oai_queue(kvpd_conn *c, const char *text, size_t len)
{
    queue(c, text, len);
}

json_t *kvpd_oai_parse(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    json_error_t jerr;
    json_t *req = json_loadb(o->body ? o->body : "", o->body_len,
                             JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
    if (!req) {
        fail(c, 400, NULL, "invalid_json", "the body is not valid JSON: %s (at byte %d)",
             jerr.text, jerr.position);
        return NULL;
    }
    if (!json_is_object(req)) {
        json_decref(req);
        fail(c, 400, NULL, "invalid_json", "the body must be a JSON object");
        return NULL;
    }
    return req;
}

/* 1 when name is one of the comma-separated ids in list. */
static int listed(const char *list, const char *name, size_t len)
{
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == len && !memcmp(p, name, n))
            return 1;
        p += n + (e != NULL);
    }
    return 0;
}

int kvpd_oai_model_ok(kvpd_conn *c, json_t *req)
{
    kvpd_oai *o = c->oai;
    json_t *model = json_object_get(req, "model");
    if (!model || json_is_null(model))
        return 0;
    if (!json_is_string(model)) {
        fail(c, 400, "model", NULL, "model must be a string");
        return -1;
    }
    const char *m = json_string_value(model);
    size_t len = json_string_length(model);
    /* One model is loaded: any name is served, unless strict_model_name asks for its
     * own (or an alias). The answer always names the real model. */
    if (!c->w->cfg->strict_model_name || (len == strlen(o->model) && !strcmp(m, o->model)) ||
        listed(c->w->cfg->model_alias, m, len))
        return 0;
    fail(c, 404, "model", "model_not_found", "the model '%.*s' does not exist; this server "
         "has '%s'", len > 100 ? 100 : (int)len, m, o->model);
    return -1;
}

int kvpd_oai_options(kvpd_conn *c, json_t *req, kvp_turn_opts *t)
{
    return options(c, req, t);
}

kvp_hub_client *kvpd_oai_client(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    if (!(o->client = kvp_hub_client_new(c->w->hub, on_hub_event, c))) {
        fail(c, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    kvp_hub_client_set_tenant(o->client, c->tenant);
    o->close = o->stream;   /* a stream's end is the connection's */
    return o->client;
}

json_t *kvpd_oai_usage(const kvp_turn_stats *st)
{
    return usage(st);
}

json_t *kvpd_oai_kvpd_stats(const kvpd_oai *o, const kvp_turn_stats *st)
{
    return kvpd_stats(o, st);
}

const char *kvpd_oai_finish_reason(const kvp_turn_stats *st)
{
    return finish_reason(st, NULL);
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
