/* The OpenAI-compatible API's transport (docs/openai.md): the request read and routed,
 * GET /v1/models and POST /v1/chat/completions answered whole or streamed as Server-Sent
 * Events, the hub's events turned into the answer, and the other endpoints handed to
 * their codecs (web/oai.h). The bodies are parsed by web/oai_parse.c and the answers'
 * JSON built by web/oai_reply.c; a request's messages go to kvp_hub_chat, which finds
 * the conversation they extend. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "base/log.h"
#include "base/thread.h"
#include "web/conn.h"
#include "web/http.h"
#include "web/oai_items.h"
#include "web/openai_impl.h"
#include "web/openai.h"

/* ---- answers ---- */

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
/* The whole answer: s (compact JSON; NULL: it could not be built, a 500). */
static void answer_text(kvpd_conn *c, int status, const char *s)
{
    kvpd_oai *o = c->oai;
    o->status = s ? status : 500;
    o->ended = 1;
    const char *fallback = "{\"error\":{\"message\":\"the server could not build its answer\","
                           "\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    queue(c, s ? s : fallback, strlen(s ? s : fallback));
}

static void answer(kvpd_conn *c, int status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    answer_text(c, status, s);
    free(s);
}

/* OpenAI's error shape, with the code's status. param may be NULL. */
static void fail(kvpd_conn *c, enum kvpd_oai_code code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(kvpd_conn *c, enum kvpd_oai_code code, const char *param, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->oai->error = code;
    answer(c, kvpd_oai_code_status(code), kvpd_oai_error_json(code, param, msg, strlen(msg)));
}

/* A request the codec refused. */
static void fail_err(kvpd_conn *c, const kvpd_oai_err *e)
{
    fail(c, e->code, e->param[0] ? e->param : NULL, "%s", e->message);
}

static kvpd_oai_meta meta(const kvpd_oai *o)
{
    return (kvpd_oai_meta){o->id, o->created, o->model};
}

/* One SSE event. */
static void sse(kvpd_conn *c, const char *name, json_t *j)
{
    size_t len = 0;
    char *frame = kvpd_oai_sse_frame(name, j, &len);
    if (!frame) {
        kvpd_log("warning", "could not build a stream chunk");
        return;
    }
    queue(c, frame, len);
    free(frame);
}

static void stream_start(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    if (o->started)
        return;
    o->started = 1;
    o->status = 200;
    kvpd_oai_meta m = meta(o);
    sse(c, NULL, kvpd_oai_chunk(&m, kvpd_oai_chunk_role()));
}

/* Tool calling: the deltas the reply's text makes (content held while it may be a call). */
static void stream_tools(kvpd_conn *c, const char *text, size_t len, int final)
{
    kvpd_oai *o = c->oai;
    kvpd_oai_meta m = meta(o);
    json_t *deltas = kvpd_oai_tools_feed(&o->req.tools, text, len, final);
    size_t i;
    json_t *d;
    json_array_foreach(deltas, i, d)
        sse(c, NULL, kvpd_oai_chunk(&m, kvpd_oai_chunk_delta(json_incref(d))));
    json_decref(deltas);
    o->tool_calls = o->req.tools.calls_sent;
}

/* Choice index's content delta; with logprobs, those of the n tokens its text completes
 * (counted in *lp_sent). */
static void stream_choice_text(kvpd_conn *c, int index, const char *text, size_t len,
                               const kvp_hub_logprob *lp, int n, int top, int *lp_sent)
{
    kvpd_oai *o = c->oai;
    if (!len && !n)
        return;
    json_t *delta = json_object();
    json_object_set_new(delta, "content", json_stringn(text, len));
    kvpd_oai_meta m = meta(o);
    json_t *j = kvpd_oai_chunk(&m, kvpd_oai_chunk_at(kvpd_oai_chunk_delta(delta), index));
    if (o->req.turn.logprobs) {
        kvpd_oai_with_logprobs(j, lp, n, top);
        *lp_sent += n;
    }
    sse(c, NULL, j);
}

/* With reasoning blocks: what text settles of the reply's reasoning goes out as a
 * delta.reasoning_content chunk; *text and *len become what it settles of the answer
 * (valid until rs is fed again). Out of memory, the text goes on unsplit. */
static void split_reasoning(kvpd_conn *c, int index, kvp_reasoning_stream *rs,
                            const char **text, size_t *len, int final)
{
    kvp_reasoning_delta d;
    if (kvp_reasoning_feed(rs, *text, *len, final, &d) < 0)
        return;
    if (d.reasoning_len) {
        kvpd_oai_meta m = meta(c->oai);
        json_t *delta = json_pack("{s:s%}", "reasoning_content", d.reasoning, d.reasoning_len);
        sse(c, NULL, kvpd_oai_chunk(&m, kvpd_oai_chunk_at(kvpd_oai_chunk_delta(delta), index)));
    }
    *text = d.content_len ? d.content : "";
    *len = d.content_len;
}

/* The first choice's delta (its reasoning split off with the model's blocks, the rest
 * through the tool-call parser when it looks for calls). */
static void stream_text(kvpd_conn *c, const char *text, size_t len, int final,
                        const kvp_hub_logprob *lp, int n, int top)
{
    kvpd_oai *o = c->oai;
    if (o->reasoning)
        split_reasoning(c, 0, &o->rs, &text, &len, final);
    if (o->req.tools.parse) {
        stream_tools(c, text, len, final);
        return;
    }
    stream_choice_text(c, 0, text, len, lp, n, top, &o->req.lp_sent);
}

json_t *kvpd_oai_message(const kvpd_oai *o, kvpd_oai_tools *tools, const char *text, size_t len,
                         int *calls)
{
    kvp_reasoning_parts p = {0, 0, 0, 0, len};
    if (o->reasoning)
        p = kvp_reasoning_split_in(text, len, o->rs.opened);
    json_t *msg;
    if (tools) {
        msg = kvpd_oai_tools_reply(tools, text + p.c_from, p.c_to - p.c_from, calls);
    } else {
        *calls = 0;
        msg = json_pack("{s:s, s:s%}", "role", "assistant", "content", text + p.c_from,
                        p.c_to - p.c_from);
    }
    if (msg && p.found)
        json_object_set_new(msg, "reasoning_content",
                            json_stringn(text + p.r_from, p.r_to - p.r_from));
    return msg;
}

/* ---- the hub's events ---- */

static void finish_stream(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    const kvp_turn_stats *st = ev->stats;
    stream_start(c);
    /* what was held back (a marker's start, the tool parser's undecided text), with the
     * last tokens' logprobs */
    if (o->req.turn.logprobs && ev->n_logprobs > o->req.lp_sent)
        stream_text(c, "", 0, 1, ev->logprobs + (size_t)o->req.lp_sent * (size_t)(1 + ev->logprobs_top),
                    ev->n_logprobs - o->req.lp_sent, ev->logprobs_top);
    else if (o->reasoning || o->req.tools.parse)
        stream_text(c, "", 0, 1, NULL, 0, 0);
    kvpd_oai_meta m = meta(o);
    const char *finish = kvpd_oai_finish_reason(st, o->tool_calls);
    sse(c, NULL, kvpd_oai_chunk(&m, kvpd_oai_chunk_finish(finish, st)));
    if (o->n_choices > 1) {   /* the usage and the end follow the last choice */
        kvpd_oai_choices_first_done(c, NULL, st);
        return;
    }
    if (o->req.include_usage) {
        json_t *j = kvpd_oai_chunk(&m, json_array());
        json_object_set_new(j, "usage", kvpd_oai_usage(st));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(kvpd_oai_shown_session(o), o->durable, st));
        sse(c, NULL, j);
    }
    queue(c, KVPD_OAI_SSE_DONE, strlen(KVPD_OAI_SSE_DONE));
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
    enum kvpd_oai_code code = KVPD_OAI_E_SHUTTING_DOWN;
    o->error = code;
    if (o->started)
        kvpd_labelled_add(&c->w->metrics->api_errors, kvpd_oai_code_label(code),
                          kvpd_oai_code_status(code));
    if (o->started && o->codec && o->codec->stream_error) {
        o->codec->stream_error(c, code, msg, sizeof msg - 1);
        o->ended = 1;
        return;
    }
    if (o->started) {   /* the stream's 200 is out: the error goes in the stream */
        sse(c, NULL, kvpd_oai_error_json(code, NULL, msg, sizeof msg - 1));
        queue(c, KVPD_OAI_SSE_DONE, strlen(KVPD_OAI_SSE_DONE));
        o->ended = 1;
        return;
    }
    o->close = 1;
    answer(c, kvpd_oai_code_status(code), kvpd_oai_error_json(code, NULL, msg, sizeof msg - 1));
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
    if (o->req.stream) {   /* the tokens carried the whole reply */
        finish_stream(c, ev);
        return;
    }
    json_t *msg = kvpd_oai_message(o, &o->req.tools, ev->text, ev->len, &o->tool_calls);
    kvpd_oai_meta m = meta(o);
    json_t *j = kvpd_oai_completion(&m, msg, kvpd_oai_finish_reason(st, o->tool_calls), st,
                                    kvpd_oai_shown_session(o), o->durable);
    if (o->req.turn.logprobs)
        kvpd_oai_with_logprobs(j, ev->logprobs, ev->n_logprobs, ev->logprobs_top);
    if (o->n_choices > 1) {   /* answered with the last choice */
        kvpd_oai_choices_first_done(c, j, st);
        return;
    }
    answer(c, 200, j);
}

static void hub_error(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    enum kvpd_oai_code code = kvpd_oai_code_of_hub(ev->code, c->w->draining);
    int ms = 0;
    switch (code) {
    case KVPD_OAI_E_OVERLOADED: case KVPD_OAI_E_BUSY:
    case KVPD_OAI_E_OVERLOADED_DRAINING: case KVPD_OAI_E_BUSY_DRAINING:
        ms = ev->retry_after_ms > 0 ? ev->retry_after_ms : kvp_hub_retry_hint_ms(c->w->hub);
        break;
    case KVPD_OAI_E_ELSEWHERE:
        /* another node serves the session now: the balancer may retry (docs/cluster.md) */
        ms = ev->retry_after_ms;
        break;
    default:
        break;
    }
    if (ms > 0)
        o->retry_after_s = (ms + 999) / 1000;
    if (o->started)
        kvpd_labelled_add(&c->w->metrics->api_errors, kvpd_oai_code_label(code),
                          kvpd_oai_code_status(code));
    if (o->started && o->codec && o->codec->stream_error) {
        o->codec->stream_error(c, code, ev->text, ev->len);
        o->ended = 1;
        return;
    }
    if (o->started) {   /* the stream's 200 is out: the error goes in the stream */
        sse(c, NULL, kvpd_oai_error_json(code, NULL, ev->text, ev->len));
        queue(c, KVPD_OAI_SSE_DONE, strlen(KVPD_OAI_SSE_DONE));
        o->ended = 1;
        return;
    }
    char msg[512];
    snprintf(msg, sizeof msg, "%.*s", (int)ev->len, ev->text);
    fail(c, code, NULL, "%s", msg);
}

const char *kvpd_oai_shown_session(const kvpd_oai *o)
{
    return o->session[0] && !o->session_hidden ? o->session : NULL;
}

void kvpd_oai_took_session(kvpd_oai *o, const kvp_hub_event *ev)
{
    snprintf(o->session, sizeof o->session, "%s", ev->id);
    o->session_hidden = ev->resumed && strcmp(o->named, ev->id) != 0;
}

static void on_hub_event(void *ctx, const kvp_hub_event *ev)
{
    kvpd_conn *c = ctx;
    kvpd_oai *o = c->oai;
    if (!o || o->ended)
        return;
    switch (ev->type) {
    case KVP_HUB_SESSION:
        kvpd_oai_took_session(o, ev);
        break;
    case KVP_HUB_TOKEN:
        if (o->codec && o->codec->token)
            o->codec->token(c, ev);
        else if (o->req.stream) {
            stream_start(c);
            stream_text(c, ev->text, ev->len, 0, ev->logprobs, ev->n_logprobs, ev->logprobs_top);
        }
        break;
    case KVP_HUB_DONE:
        done(c, ev);
        break;
    case KVP_HUB_ERROR:
        hub_error(c, ev);
        break;
    case KVP_HUB_RESPONSE:
        if (o->codec && o->codec->stored)
            o->codec->stored(c, ev);
        break;
    }
}

/* ---- the request ---- */

/* What the server serves, for the parse. */
static kvpd_oai_limits limits(const kvpd_conn *c)
{
    return (kvpd_oai_limits){.max_tokens = c->w->hub ? kvp_hub_reply_cap(c->w->hub) : INT_MAX,
                             .strict_model_name = c->w->cfg->strict_model_name,
                             .model_alias = c->w->cfg->model_alias,
                             .model = c->oai->model,
                             .tool_format = c->oai->tool_format,
                             .reasoning = c->oai->reasoning,
                             .fixed_seed = c->w->cfg->fixed_seed,
                             .seed = c->w->cfg->seed};
}

/* ---- work off the loop (web/openai_impl.h, kvpd_oai_offload) ---- */

typedef struct kvpd_oai_offload {
    uv_work_t work;
    kvpd_conn *c;                 /* NULL once the connection closed */
    kvpd_oai *o;
    void (*run)(void *arg);
    void (*done)(kvpd_conn *c, void *arg);
    void (*drop)(void *arg);
    void *arg;
} kvpd_oai_offload;

static void oai_free(kvpd_oai *o);

static void offload_work(uv_work_t *w)
{
    kvpd_oai_offload *f = w->data;
    pthread_setname_np(pthread_self(), "kvpd-pool");   /* libuv's pool, as top -H shows it */
    f->run(f->arg);
}

static void offload_done(uv_work_t *w, int status)
{
    kvpd_oai_offload *f = w->data;
    kvpd_oai *o = f->o;
    kvpd_conn *c = f->c;
    o->offload = NULL;
    if (!c) {   /* the connection closed meanwhile: nobody is answered */
        f->drop(f->arg);
        oai_free(o);
    } else if (status < 0) {   /* cancelled: never ran */
        f->drop(f->arg);
        fail(c, KVPD_OAI_E_SERVER, NULL, "the request could not be served: %s",
             uv_strerror(status));
    } else {
        f->done(c, f->arg);
    }
    if (c)
        lws_callback_on_writable(c->wsi);
    free(f);
}

int kvpd_oai_offload_run(kvpd_conn *c, void (*run)(void *arg),
                         void (*done)(kvpd_conn *c, void *arg), void (*drop)(void *arg),
                         void *arg)
{
    kvpd_oai_offload *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    *f = (kvpd_oai_offload){.c = c, .o = c->oai, .run = run, .done = done, .drop = drop,
                            .arg = arg};
    f->work.data = f;
    if (uv_queue_work(c->w->loop, &f->work, offload_work, offload_done) < 0) {
        free(f);
        return -1;
    }
    c->oai->offload = f;
    return 0;
}

/* A chat completion's body is parsed off the loop: the JSON, every field's checks, the
 * response format's and the forced tools' grammars compiled from their schemas
 * (kvpd_oai_parse_chat: no transport, no hub) and an assistant prefill's rendering
 * checked (kvp_hub_prefill_check: the chat template only), so a large body or a hostile
 * schema costs the loop only the hand-over; the request goes on back on the loop
 * (chat_parsed). */
typedef struct parse_job {
    kvpd_oai_req *r;              /* the request's, the pool's until it is back */
    kvpd_oai_limits l;
    const kvp_hub *hub;           /* its chat template renders an assistant prefill */
    char *body;
    size_t len;
    int rc;
    kvpd_oai_err e;
    int prefill_rc;               /* the prefill's check */
    char prefill_why[256];
} parse_job;

static void parse_run(void *arg)
{
    parse_job *op = arg;
    kvpd_oai_req *r = op->r;
    op->rc = kvpd_oai_parse_chat(op->body, op->len, &op->l, r, &op->e);
    if (op->rc == 0 && r->prefill && op->hub)   /* the template's rendering of the request */
        op->prefill_rc = kvp_hub_prefill_check(op->hub, r->system, r->system_len, r->msgs,
                                               r->n_msgs, r->turn.tools, r->turn.tools_len,
                                               r->prefill, r->prefill_len, op->prefill_why,
                                               sizeof op->prefill_why);
}

static void parse_drop(void *arg)
{
    parse_job *op = arg;
    free(op->body);
    free(op);
}

static void chat_parsed(kvpd_conn *c, const parse_job *op);

static void parse_done(kvpd_conn *c, void *arg)
{
    chat_parsed(c, arg);
    parse_drop(arg);
}

static void chat_completions(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    parse_job *op = calloc(1, sizeof *op);
    if (!op) {
        fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
        return;
    }
    op->r = &o->req;
    op->l = limits(c);
    op->hub = c->w->hub;
    op->body = o->body;   /* the pool's now (kvpd_openai_body_done frees none) */
    op->len = o->body_len;
    o->body = NULL;
    o->body_len = o->body_cap = 0;
    if (kvpd_oai_offload_run(c, parse_run, parse_done, parse_drop, op) < 0) {
        parse_drop(op);
        fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
    }
}

static void chat_parsed(kvpd_conn *c, const parse_job *op)
{
    kvpd_oai *o = c->oai;
    kvpd_oai_req *r = &o->req;
    if (op->rc < 0) {
        fail_err(c, &op->e);
        return;
    }
    char sid[KVP_SESSION_ID_LEN + 8] = "";
    if (r->has_session)
        memcpy(sid, r->session, sizeof r->session);
    else if (lws_hdr_custom_copy(c->wsi, sid, sizeof sid, "x-session-id:", 13) < 0)
        sid[0] = '\0';
    if (sid[0] && !kvp_session_id_ok(sid)) {
        fail(c, KVPD_OAI_E_INVALID_REQUEST, "session", "a session id is 32 lowercase hex digits");
        goto out;
    }
    snprintf(o->named, sizeof o->named, "%s", sid);
    if (r->prefill && op->prefill_rc < 0) {
        fail(c, op->prefill_rc == -ENOMEM ? KVPD_OAI_E_SERVER : KVPD_OAI_E_INVALID_REQUEST,
             "messages", "messages: %s", op->prefill_why);
        goto out;
    }
    if (!kvpd_oai_client(c))
        goto out;
    if (r->n_choices > 1) {
        kvp_hub_client *more[KVP_HUB_MAX_CHOICES - 1];
        if (kvpd_oai_choices_open(c, r->n_choices, more) < 0)
            goto out;
        kvp_hub_chat_choices(o->client, more, r->n_choices - 1, sid, r->system, r->system_len,
                             r->msgs, r->n_msgs, &r->turn);
    } else {
        kvp_hub_chat(o->client, sid, r->system, r->system_len, r->msgs, r->n_msgs, &r->turn);
    }
out:
    kvpd_oai_release_messages(r);
}

/* One entry per model_alias id (the model's own name without any). */
static void models(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    answer(c, 200, kvpd_oai_models(c->w->cfg->model_alias, o->model, o->created));
}

/* DELETE /v1/learn/transcripts: the caller's tenant's learn_dir transcripts (the route
 * checked the method). */
static void learn_transcripts(kvpd_conn *c)
{
    json_t *done;
    const char *code = "";
    char msg[256];
    int status = kvpd_learn_forget(c->w, c->tenant, &done, &code, msg, sizeof msg);
    if (!status)
        answer(c, 200, done);
    else
        fail(c, status == 404 ? KVPD_OAI_E_NOT_FOUND : status == 503 ? KVPD_OAI_E_UNAVAILABLE
                                                     : KVPD_OAI_E_SERVER, NULL, "%s", msg);
}

/* Routes the request once the whole of it (the body, for a POST) is in. */
static void route(kvpd_conn *c, const char *uri, int post)
{
    kvpd_oai *o = c->oai;
    kvpd_web *w = c->w;
    if (!kvpd_api_tenant(w, c->wsi, c->tenant)) {
        fail(c, KVPD_OAI_E_INVALID_API_KEY, NULL, "a valid API key is required "
             "(Authorization: Bearer <api_key>)");
        return;
    }
    const char *rid = NULL;
    enum kvpd_oai_path path = kvpd_openai_path(uri, &rid);
    int del = lws_hdr_total_length(c->wsi, WSI_TOKEN_DELETE_URI) > 0;
    int get = !post && !del && (lws_hdr_total_length(c->wsi, WSI_TOKEN_GET_URI) > 0 ||
                                lws_hdr_total_length(c->wsi, WSI_TOKEN_HEAD_URI) > 0);
    int one = path == KVPD_OAI_RESPONSE;
    if (path == KVPD_OAI_UNKNOWN || path == KVPD_OAI_NONE) {
        fail(c, KVPD_OAI_E_UNKNOWN_URL, NULL, "no such endpoint: %s", uri);
        return;
    }
    /* the method against the endpoint's: a 405 says which it takes */
    const char *allow = kvpd_openai_path_allow(path);
    if (!(post ? strstr(allow, "POST") != NULL : del ? strstr(allow, "DELETE") != NULL
                                              : get && strstr(allow, "GET") != NULL)) {
        o->allow = allow;
        fail(c, KVPD_OAI_E_METHOD_NOT_ALLOWED, NULL, "%s takes %s", uri, allow);
        return;
    }
    if (path == KVPD_OAI_LEARN) {
        learn_transcripts(c);
        return;
    }
    if (w->draining || !w->hub) {
        o->retry_after_s = 1;
        fail(c, KVPD_OAI_E_UNAVAILABLE, NULL, w->draining ? "the server is shutting down"
                                            : "the model is loading");
        return;
    }
    kvp_hub_info hi;
    kvp_hub_info_get(w->hub, &hi);
    snprintf(o->model, sizeof o->model, "%s", hi.model_name);
    o->tool_format = hi.tool_format;
    o->reasoning = hi.reasoning;
    o->reasoning_open = hi.reasoning_open;
    if (path == KVPD_OAI_MODELS) {
        models(c);
        return;
    }
    if (path == KVPD_OAI_PROPS || path == KVPD_OAI_SLOTS) {
        (path == KVPD_OAI_PROPS ? kvpd_oai_props : kvpd_oai_slots)(c);
        return;
    }
    if (one) {
        kvpd_oai_response_get(c, rid, del);
        return;
    }
    if (o->body_too_large) {
        o->close = 1;
        fail(c, KVPD_OAI_E_REQUEST_TOO_LARGE, NULL, "request bodies are limited to %d bytes "
             "(max_body_bytes)", w->cfg->max_body_bytes);
        return;
    }
    if (path == KVPD_OAI_COMPLETIONS)
        kvpd_oai_completions(c);
    else if (path == KVPD_OAI_LLAMA_COMPLETION)
        kvpd_oai_llama_completion(c);
    else if (path == KVPD_OAI_TOKENIZE)
        kvpd_oai_tokenize(c);
    else if (path == KVPD_OAI_DETOKENIZE)
        kvpd_oai_detokenize(c);
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
    o->error = KVPD_OAI_E_SERVER;   /* an answer that could not be built */
    o->created = (long)time(NULL);
    char origin[sizeof o->origin];
    const char *cors = kvpd_guard_cors(c->w, c->wsi, origin, sizeof origin);
    snprintf(o->origin, sizeof o->origin, "%s", cors ? cors : "");
    /* A random id: nothing of the session's (its id is the key to the conversation). */
    if (kvpd_oai_new_id(o->id, sizeof o->id, "chatcmpl-") < 0)
        return -1;
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
    const char *extra[13 + 2 * KVPD_CORS_HEADERS];
    int k = kvpd_cors_headers(o->origin[0] ? o->origin : NULL, extra);
    char retry[16];
    if (kvpd_oai_shown_session(o)) {
        extra[k++] = "x-session-id:";
        extra[k++] = o->session;
    }
    if (o->status == 200 && !o->req.stream && o->durable >= 0) {   /* a whole answer's turn */
        extra[k++] = "x-kvpd-durable:";
        extra[k++] = o->durable ? "true" : "false";
    }
    if (o->retry_after_s > 0) {
        snprintf(retry, sizeof retry, "%d", o->retry_after_s);
        extra[k++] = "retry-after:";
        extra[k++] = retry;
    }
    int stream = o->req.stream && o->status == 200;
    /* A request pipelined behind this one is not served on this connection: the answer
     * says so, so the client sends it again on another (web/wsguard.c). */
    if (kvpd_wsguard_pipelined(lws_get_socket_fd(c->wsi)))
        o->close = 1;
    if (o->close && !stream) {   /* lws says so itself for a body without a length */
        extra[k++] = "connection:";
        extra[k++] = "close";
    }
    if (o->allow) {
        extra[k++] = "allow:";
        extra[k++] = o->allow;
    }
    if (o->status == 401) {
        extra[k++] = "www-authenticate:";
        extra[k++] = "Bearer realm=\"kvpd\"";
    }
    extra[k] = NULL;
    o->headers_sent = 1;
    if (o->status >= 400)
        kvpd_labelled_add(&c->w->metrics->api_errors,
                          kvpd_oai_code_label(o->error), o->status);
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
    int stream = o->req.stream && o->status == 200;
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
    c->oai = NULL;
    if (o->offload) {   /* its work is on the thread pool: freed when it is back */
        o->offload->c = NULL;
        return;
    }
    oai_free(o);
}

static void oai_free(kvpd_oai *o)
{
    if (o->client)   /* a turn still running is cancelled; its partial reply stays */
        kvp_hub_close(o->client);
    kvpd_oai_choices_close(o);   /* after the first: its choices not started are forgotten */
    kvpd_oai_release(&o->req);
    kvp_reasoning_free(&o->rs);
    free(o->body);
    if (o->codec && o->codec->free)
        o->codec->free(o->codec_state);
    free(o);
}

/* ---- the helpers of the other codecs (web/openai_impl.h) ---- */

void kvpd_oai_answer(kvpd_conn *c, int status, json_t *j)
{
    answer(c, status, j);
}

void kvpd_oai_answer_text(kvpd_conn *c, int status, const char *s)
{
    answer_text(c, status, s);
}

void kvpd_oai_fail(kvpd_conn *c, enum kvpd_oai_code code, const char *param, const char *msg)
{
    fail(c, code, param, "%s", msg);
}

void kvpd_oai_sse(kvpd_conn *c, const char *name, json_t *j)
{
    sse(c, name, j);
}

void kvpd_oai_queue(kvpd_conn *c, const char *text, size_t len)
{
    queue(c, text, len);
}

void kvpd_oai_stream_start(kvpd_conn *c)
{
    stream_start(c);
}

void kvpd_oai_stream_text(kvpd_conn *c, int index, kvp_reasoning_stream *rs, const char *text,
                          size_t len, int final, const kvp_hub_logprob *lp, int n, int top,
                          int *lp_sent)
{
    if (rs)
        split_reasoning(c, index, rs, &text, &len, final);
    stream_choice_text(c, index, text, len, lp, n, top, lp_sent);
}

void kvpd_oai_cut(kvpd_conn *c)
{
    cut(c);
}

void kvpd_oai_hub_error(kvpd_conn *c, const kvp_hub_event *ev)
{
    hub_error(c, ev);
}

json_t *kvpd_oai_parse(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    kvpd_oai_err e;
    json_t *req = kvpd_oai_parse_json(o->body, o->body_len, &e);
    if (!req)
        fail_err(c, &e);
    return req;
}

int kvpd_oai_model_ok(kvpd_conn *c, json_t *req)
{
    kvpd_oai_limits l = limits(c);
    kvpd_oai_err e;
    if (kvpd_oai_parse_model(req, &l, &e) < 0) {
        fail_err(c, &e);
        return -1;
    }
    return 0;
}

int kvpd_oai_options(kvpd_conn *c, json_t *req, kvp_turn_opts *t)
{
    kvpd_oai_limits l = limits(c);
    kvpd_oai_err e;
    if (kvpd_oai_parse_options(req, &l, &c->oai->req, &e) < 0) {
        if (c->oai->path == KVPD_OAI_RESPONSES)
            kvpd_items_error_names(&e, c->oai->items_tools);
        fail_err(c, &e);
        return -1;
    }
    if (c->oai->req.n_choices > 1) {   /* one completion per request on these endpoints */
        fail(c, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "n", "n above 1 is served by "
             "/v1/chat/completions only");
        return -1;
    }
    *t = c->oai->req.turn;
    return 0;
}

kvp_hub_client *kvpd_oai_client(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    if (!(o->client = kvp_hub_client_new(c->w->hub, on_hub_event, c))) {
        fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
        return NULL;
    }
    kvp_hub_client_set_tenant(o->client, c->tenant);
    /* A reply the template's generation prompt left inside a reasoning block starts with
     * its reasoning; one whose start kvpd writes or constrains (a forced call's opening,
     * an assistant prefill, a grammar's document) does not. */
    o->rs.opened = o->reasoning && o->reasoning_open && !o->req.turn.grammar &&
                   !o->req.turn.reply_prefix;
    o->close = o->req.stream;   /* a stream's end is the connection's */
    return o->client;
}
