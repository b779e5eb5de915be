/* The Responses API (docs/openai.md): POST /v1/responses, GET and DELETE
 * /v1/responses/{id}. A response's conversation is its `instructions` (the system text),
 * the conversation of its `previous_response_id` and its `input` items, then its reply;
 * a stored response keeps that conversation and the kvpd session that holds it, so a
 * request continuing it goes to kvp_hub_chat naming that session and prefills only its
 * new input. Stored responses are kept by the session hub (kvp_hub_response_*, in the
 * store that keeps the sessions: the state directory, Redis, or memory) as one record
 * each: {"session", "items", "object"} as JSON, the conversation's items, then the
 * response as answered. The answer goes out once its record is written; a continuation
 * reads its previous response's record first. This file keeps only the request's own
 * state. Streamed answers are Server-Sent Events (`event:` and `data:` lines) in OpenAI's
 * sequence: response.created, response.in_progress, response.output_item.added,
 * response.content_part.added, response.output_text.delta..., response.output_text.done,
 * response.content_part.done, response.output_item.done, then response.completed (or
 * response.incomplete for a reply cut by max_output_tokens). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/textbuf.h"
#include "web/oai_items.h"
#include "web/openai_impl.h"

/* One request's conversation, what its answer echoes, and a stream's state. */
/* What a request waits for from the hub (KVP_HUB_RESPONSE). */
enum { WAIT_NONE, WAIT_PREV, WAIT_PUT, WAIT_GET, WAIT_DELETE };

typedef struct resp_req {
    json_t *items;                /* the previous response's items, then this input */
    int store;
    int wait;                     /* WAIT_* */
    json_t *input;                /* WAIT_PREV: this request's input items */
    json_t *ins;                  /* WAIT_PREV: its instructions (or NULL) */
    kvp_turn_opts t;              /* WAIT_PREV: its turn's options */
    json_t *object;               /* WAIT_PUT: the response to answer once stored */
    int cut;                      /* WAIT_PUT, streaming: response.incomplete */
    char own_id[64];              /* WAIT_PREV: the answer's id (o->id names the previous) */
    int seq;                      /* the stream's sequence_number */
    int begun;                    /* the stream's first events are out */
    json_t *prev;                 /* previous_response_id (string) or null */
    json_t *echo;                 /* request fields the response object repeats */
    json_t *skipped;              /* the types of the tools left out (an array) */
    json_t *output;               /* streaming: the output items done, in order */
    int msg_open;                 /* streaming: a message item is being written ... */
    char msg_id[64];              /* ... with this id ... */
    char *msg_text;               /* ... and this text so far */
    size_t msg_len, msg_cap;
    char call_id[32], call_name[128];   /* streaming: a call whose arguments are next */
    int rs_open;                  /* streaming: a reasoning item is being written ... */
    char rs_id[64];               /* ... with this id ... */
    char *rs_text;                /* ... and this text so far */
    size_t rs_len, rs_cap;
} resp_req;

static void req_free(void *p)
{
    resp_req *r = p;
    if (!r)
        return;
    json_decref(r->items);
    json_decref(r->prev);
    json_decref(r->echo);
    json_decref(r->skipped);
    json_decref(r->output);
    json_decref(r->input);
    json_decref(r->ins);
    json_decref(r->object);
    free(r->msg_text);
    free(r->rs_text);
    free(r);
}

/* Fields of the Responses API kvpd cannot honour: the first one present, or NULL. */
static const char *refused(json_t *req)
{
    static const char *absent[] = {"reasoning", "conversation", "prompt", "background",
                                   "logprobs"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        json_t *v = json_object_get(req, absent[i]);
        if (v && !json_is_null(v) && !json_is_false(v) &&
            !(json_is_array(v) && json_array_size(v) == 0))
            return absent[i];
    }
    return NULL;
}

/* ---- the answer ---- */

/* The response object with its output items (taken; NULL or ev NULL: in progress, no
 * output and no usage yet). */
static json_t *response_object(kvpd_conn *c, const kvp_hub_event *ev, json_t *output)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    const kvp_turn_stats *st = ev ? ev->stats : NULL;
    int cut = st && !strcmp(st->stop, "length");
    const char *status = !st ? "in_progress" : cut ? "incomplete" : "completed";
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:s, s:O, s:o, s:n, s:b}", "id", o->id,
                          "object", "response", "created_at", (json_int_t)o->created,
                          "status", status, "model", o->model, "previous_response_id",
                          r->prev, "output", st && output ? output : json_array(),
                          "error", "store", r->store);
    if (!st)
        json_decref(output);
    json_object_update(j, r->echo);
    json_object_set_new(j, "incomplete_details", cut ? json_pack("{s:s}", "reason",
                                                                 "max_output_tokens")
                                                     : json_null());
    json_object_set_new(j, "truncation", json_string("disabled"));
    if (st) {
        json_object_set_new(j, "output_text", kvpd_items_output_text(output));
        json_object_set_new(j, "usage", json_pack(
            "{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", st->context_tokens,
            "input_tokens_details", "cached_tokens", st->cached_tokens, "output_tokens",
            st->generated_tokens, "output_tokens_details", "reasoning_tokens", 0,
            "total_tokens", st->context_tokens + st->generated_tokens));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(kvpd_oai_shown_session(o), o->durable, st));
        if (json_array_size(r->skipped))
            json_object_set(json_object_get(j, "kvpd"), "skipped_tools", r->skipped);
        kvpd_oai_with_shaped(j, st, "max_output_tokens");
    } else {
        json_object_set_new(j, "usage", json_null());
    }
    return j;
}

/* One streamed event: its type is both the SSE event name and the data's "type". */
static void event(kvpd_conn *c, const char *type, json_t *j)
{
    resp_req *r = c->oai->codec_state;
    json_object_set_new(j, "type", json_string(type));
    json_object_set_new(j, "sequence_number", json_integer(r->seq++));
    kvpd_oai_sse(c, type, j);
}

static void begin(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    if (r->begun)
        return;
    r->begun = 1;
    o->started = 1;
    o->status = 200;
    r->output = json_array();
    event(c, "response.created",
          json_pack("{s:o}", "response", response_object(c, NULL, NULL)));
    event(c, "response.in_progress",
          json_pack("{s:o}", "response", response_object(c, NULL, NULL)));
}

/* Streaming: the index the next output item gets. */
static int next_index(const resp_req *r)
{
    return (int)json_array_size(r->output) + r->msg_open + r->rs_open;
}

/* Streaming: the reply's reasoning as a reasoning item before its message. */
static void reasoning_delta(kvpd_conn *c, const char *text, size_t len)
{
    resp_req *r = c->oai->codec_state;
    if (!r->rs_open) {
        kvpd_oai_new_id(r->rs_id, sizeof r->rs_id, "rs_");
        int at = next_index(r);
        r->rs_open = 1;
        r->rs_len = 0;
        event(c, "response.output_item.added", json_pack(
            "{s:i, s:o}", "output_index", at, "item",
            kvpd_items_reasoning(r->rs_id, NULL, 0, "in_progress")));
    }
    if (!len || kvp_text_append(&r->rs_text, &r->rs_len, &r->rs_cap, text, len))
        return;
    event(c, "response.reasoning_text.delta", json_pack(
        "{s:s, s:i, s:i, s:s%}", "item_id", r->rs_id, "output_index", next_index(r) - 1,
        "content_index", 0, "delta", text, len));
}

static void close_reasoning(kvpd_conn *c)
{
    resp_req *r = c->oai->codec_state;
    if (!r->rs_open)
        return;
    int at = next_index(r) - 1;
    const char *text = r->rs_text ? r->rs_text : "";
    event(c, "response.reasoning_text.done", json_pack(
        "{s:s, s:i, s:i, s:s%}", "item_id", r->rs_id, "output_index", at, "content_index", 0,
        "text", text, r->rs_len));
    json_t *item = kvpd_items_reasoning(r->rs_id, text, r->rs_len, "completed");
    event(c, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", at,
                                                    "item", item));
    json_array_append_new(r->output, item);
    r->rs_open = 0;
}

/* With reasoning blocks: what text settles of the reasoning goes out as the reasoning
 * item's deltas; *text and *len become what it settles of the answer (the reasoning item
 * is closed before it). */
static void split_reasoning(kvpd_conn *c, const char **text, size_t *len, int final)
{
    kvpd_oai *o = c->oai;
    kvp_reasoning_delta d;
    if (!o->reasoning || kvp_reasoning_feed(&o->rs, *text, *len, final, &d) < 0)
        return;
    if (d.reasoning_len || (o->rs.found && !o->rs.c_sent && !final))
        reasoning_delta(c, d.reasoning, d.reasoning_len);
    if (d.content_len || final)
        close_reasoning(c);
    *text = d.content_len ? d.content : "";
    *len = d.content_len;
}

static void open_message(kvpd_conn *c)
{
    resp_req *r = c->oai->codec_state;
    if (r->msg_open)
        return;
    kvpd_oai_new_id(r->msg_id, sizeof r->msg_id, "msg_");
    int at = next_index(r);
    r->msg_open = 1;
    r->msg_len = 0;
    event(c, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", at, "item",
                                                     kvpd_items_message(r->msg_id, NULL, 0,
                                                                        "in_progress", NULL)));
    event(c, "response.content_part.added", json_pack(
        "{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", r->msg_id, "output_index", at,
        "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
}

/* lp: the logprobs of the message's whole text (taken; NULL: none). */
static void close_message(kvpd_conn *c, const char *status, json_t *lp)
{
    resp_req *r = c->oai->codec_state;
    if (!r->msg_open) {
        json_decref(lp);
        return;
    }
    int at = next_index(r) - 1;
    const char *text = r->msg_text ? r->msg_text : "";
    if (!lp)
        lp = json_array();
    event(c, "response.output_text.done", json_pack(
        "{s:s, s:i, s:i, s:s%, s:O}", "item_id", r->msg_id, "output_index", at,
        "content_index", 0, "text", text, r->msg_len, "logprobs", lp));
    event(c, "response.content_part.done", json_pack(
        "{s:s, s:i, s:i, s:{s:s, s:s%, s:[], s:O}}", "item_id", r->msg_id, "output_index", at,
        "content_index", 0, "part", "type", "output_text", "text", text, r->msg_len,
        "annotations", "logprobs", lp));
    json_t *item = kvpd_items_message(r->msg_id, text, r->msg_len, status, lp);
    event(c, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", at,
                                                    "item", item));
    json_array_append_new(r->output, item);
    r->msg_open = 0;
}

/* lp: the logprobs of the tokens this text completes (taken; NULL: none). */
static void text_delta(kvpd_conn *c, const char *text, size_t len, json_t *lp)
{
    resp_req *r = c->oai->codec_state;
    if (!len && !json_array_size(lp)) {
        json_decref(lp);
        return;
    }
    open_message(c);
    if (kvp_text_append(&r->msg_text, &r->msg_len, &r->msg_cap, text, len)) {
        json_decref(lp);
        return;
    }
    event(c, "response.output_text.delta", json_pack(
        "{s:s, s:i, s:i, s:s%, s:o}", "item_id", r->msg_id, "output_index", next_index(r) - 1,
        "content_index", 0, "delta", text, len, "logprobs", lp ? lp : json_array()));
}

/* A whole function call: added, its arguments, done. */
static void call_item(kvpd_conn *c, const char *arguments)
{
    resp_req *r = c->oai->codec_state;
    close_message(c, "completed", NULL);
    char id[64];
    kvpd_oai_new_id(id, sizeof id, "fc_");
    int at = next_index(r);
    event(c, "response.output_item.added", json_pack(
        "{s:i, s:o}", "output_index", at, "item",
        kvpd_items_call(id, r->call_id, r->call_name, "", "in_progress")));
    event(c, "response.function_call_arguments.delta", json_pack(
        "{s:s, s:i, s:s}", "item_id", id, "output_index", at, "delta", arguments));
    event(c, "response.function_call_arguments.done", json_pack(
        "{s:s, s:i, s:s}", "item_id", id, "output_index", at, "arguments", arguments));
    json_t *item = kvpd_items_call(id, r->call_id, r->call_name, arguments, "completed");
    event(c, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", at,
                                                    "item", item));
    json_array_append_new(r->output, item);
}

/* Streaming with tools: the chat deltas of kvpd_oai_tools_feed as items' events. */
static void tool_deltas(kvpd_conn *c, const char *text, size_t len, int final)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    json_t *deltas = kvpd_oai_tools_feed(&o->req.tools, text, len, final);
    size_t i;
    json_t *d;
    json_array_foreach(deltas, i, d) {
        kvpd_oai_delta dl;
        kvpd_oai_tools_delta(d, &dl);
        if (dl.content)
            text_delta(c, dl.content, dl.content_len, NULL);
        if (dl.call_id) {
            snprintf(r->call_id, sizeof r->call_id, "%s", dl.call_id);
            snprintf(r->call_name, sizeof r->call_name, "%s", dl.call_name);
        } else if (dl.arguments) {
            call_item(c, dl.arguments);
        }
    }
    json_decref(deltas);
    o->tool_calls = o->req.tools.calls_sent;
}

static void token(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    if (!o->req.stream || (!ev->len && !ev->n_logprobs))
        return;
    begin(c);
    const char *text = ev->text;
    size_t len = ev->len;
    split_reasoning(c, &text, &len, 0);
    if (o->req.tools.parse) {
        tool_deltas(c, text, len, 0);
        return;
    }
    json_t *lp = NULL;
    if (o->req.turn.logprobs) {
        lp = kvpd_oai_logprobs_content(ev->logprobs, ev->n_logprobs, ev->logprobs_top);
        o->req.lp_sent += ev->n_logprobs;
    }
    text_delta(c, text, len, lp);
}

/* 1 when the streamed output has a message or a call (not only reasoning). */
static int answered(const resp_req *r)
{
    size_t i;
    json_t *item;
    json_array_foreach(r->output, i, item)
        if (strcmp(json_string_value(json_object_get(item, "type")), "reasoning"))
            return 1;
    return 0;
}

/* The answer of a turn whose response is stored (or not): the whole object, or the
 * stream's last event, then the request is over. */
static void finish(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    json_t *object = r->object;
    r->object = NULL;
    r->wait = WAIT_NONE;
    if (!o->req.stream) {
        kvpd_oai_answer(c, 200, object);
        return;
    }
    event(c, r->cut ? "response.incomplete" : "response.completed",
          json_pack("{s:o}", "response", object));
    o->ended = 1;
}

/* Stores the response (store) with its conversation, the items then the output, and
 * answers once the hub has written it; without store, answers now. */
static void keep(kvpd_conn *c, json_t *object, int cut)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    r->object = object;
    r->cut = cut;
    if (!r->store) {
        finish(c);
        return;
    }
    json_array_extend(r->items, json_object_get(object, "output"));
    json_t *rec = json_pack("{s:s, s:O, s:O}", "session", o->session, "items", r->items,
                            "object", object);
    char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    if (!text) {
        json_object_set_new(json_object_get(object, "kvpd"), "stored", json_false());
        finish(c);
        return;
    }
    r->wait = WAIT_PUT;
    kvp_hub_response_put(o->client, o->id, text, strlen(text));
    free(text);
}

/* The logprobs of the whole reply (NULL: the turn has none). */
static json_t *reply_logprobs(kvpd_conn *c, const kvp_hub_event *ev)
{
    return c->oai->req.turn.logprobs
               ? kvpd_oai_logprobs_content(ev->logprobs, ev->n_logprobs, ev->logprobs_top)
               : NULL;
}

static void done(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    int cut = !strcmp(ev->stats->stop, "length");
    const char *status = cut ? "incomplete" : "completed";
    if (!o->req.stream) {
        char msg_id[64];
        kvpd_oai_new_id(msg_id, sizeof msg_id, "msg_");
        json_t *msg = kvpd_oai_message(o, &o->req.tools, ev->text, ev->len, &o->tool_calls);
        json_t *output = kvpd_items_output(msg, msg_id, status);
        json_decref(msg);
        json_t *lp = reply_logprobs(c, ev);
        /* logprobs come without tools: the last item is the message (after any reasoning) */
        json_t *mi = json_array_get(output, json_array_size(output) - 1);
        if (lp)
            json_object_set_new(json_array_get(json_object_get(mi, "content"), 0), "logprobs", lp);
        keep(c, response_object(c, ev, output), cut);
        return;
    }
    begin(c);
    const char *text = "";
    size_t len = 0;
    split_reasoning(c, &text, &len, 1);   /* what the split held back */
    if (o->req.tools.parse)
        tool_deltas(c, text, len, 1);
    else if (len)
        text_delta(c, text, len, NULL);
    if (o->req.turn.logprobs && ev->n_logprobs > o->req.lp_sent)   /* the last tokens' */
        text_delta(c, "", 0, kvpd_oai_logprobs_content(
            ev->logprobs + (size_t)o->req.lp_sent * (size_t)(1 + ev->logprobs_top),
            ev->n_logprobs - o->req.lp_sent, ev->logprobs_top));
    if (!answered(r) && !r->msg_open)
        open_message(c);   /* an empty answer is one empty message */
    close_message(c, status, reply_logprobs(c, ev));
    keep(c, response_object(c, ev, json_incref(r->output)), cut);
}

static void stream_error(kvpd_conn *c, enum kvpd_oai_code code, const char *msg, size_t len)
{
    event(c, "error", json_pack("{s:s, s:s%, s:n}", "code", kvpd_oai_code_label(code), "message",
                                msg, len, "param"));
}

static void stored(kvpd_conn *c, const kvp_hub_event *ev);

static const kvpd_oai_codec codec = {.token = token, .done = done, .stored = stored,
                                     .stream_error = stream_error, .free = req_free};

/* The fields the response object repeats, as the request gave them or their defaults. */
static json_t *echo(json_t *req, json_t *ins, json_t *mot, json_t *meta)
{
    json_t *j = json_pack("{s:O?, s:O?, s:O?, s:O?}", "instructions", ins, "max_output_tokens",
                          mot, "temperature", json_object_get(req, "temperature"), "top_p",
                          json_object_get(req, "top_p"));
    json_object_set_new(j, "metadata", json_is_object(meta) ? json_deep_copy(meta)
                                                          : json_object());
    json_t *v = json_object_get(req, "tools");
    json_object_set_new(j, "tools", json_is_array(v) ? json_deep_copy(v) : json_array());
    v = json_object_get(req, "tool_choice");
    json_object_set_new(j, "tool_choice", v && !json_is_null(v) ? json_deep_copy(v)
                                                                : json_string("auto"));
    v = json_object_get(req, "parallel_tool_calls");
    json_object_set_new(j, "parallel_tool_calls", json_boolean(!json_is_false(v)));
    v = json_object_get(json_object_get(req, "text"), "format");
    json_object_set_new(j, "text", json_pack("{s:o}", "format", json_is_object(v)
                                             ? json_deep_copy(v)
                                             : json_pack("{s:s}", "type", "text")));
    return j;
}


/* A stored record's JSON, checked: {"session": a session id or "", "items": [...],
 * "object": {"id": id, ...}}. NULL (logged) when it is not one: refused as damaged. */
static json_t *record(const kvp_hub_event *ev)
{
    json_error_t je;
    json_t *j = json_loadb(ev->text, ev->len, 0, &je);
    const char *why = !j ? je.text : NULL;
    json_t *s = json_object_get(j, "session");
    if (!why && (!json_is_string(s) || (json_string_length(s) &&
                                        !kvp_session_id_ok(json_string_value(s)))))
        why = "no session";
    if (!why && !json_is_array(json_object_get(j, "items")))
        why = "no items";
    json_t *obj = json_object_get(j, "object");
    if (!why && (!json_is_object(obj) ||
                 strcmp(json_string_value(json_object_get(obj, "id")) ?: "", ev->id)))
        why = "no response object of its id";
    if (!why)
        return j;
    kvpd_log("warning", "stored response %s: damaged record refused (%s)", ev->id, why);
    json_decref(j);
    return NULL;
}

/* The turn, once the previous response's record is in (prev; NULL: none). */
static void start_turn(kvpd_conn *c, json_t *prev)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    const char *session = json_string_value(json_object_get(prev, "session"));
    if (session && !session[0])
        session = NULL;
    r->wait = WAIT_NONE;
    r->items = prev ? json_deep_copy(json_object_get(prev, "items")) : json_array();
    size_t first_input = json_array_size(r->items);
    json_array_extend(r->items, r->input);
    kvpd_oai_err e;
    json_t *chat = kvpd_items_chat(r->items, first_input, json_string_value(r->ins),
                                   json_string_length(r->ins), &e);
    if (!chat || kvpd_oai_parse_messages(chat, "input", 0, &o->req, &e) < 0) {
        /* the chat shape's messages are not the items one for one: name the input */
        if (!strncmp(e.param, "messages", 8))
            snprintf(e.param, sizeof e.param, "input");
        kvpd_oai_fail(c, e.code, e.param[0] ? e.param : NULL, e.message);
        json_decref(chat);
        return;
    }
    if (session)
        snprintf(o->named, sizeof o->named, "%s", session);
    kvp_hub_chat(o->client, session, o->req.system, o->req.system_len, o->req.msgs,
                 o->req.n_msgs, &r->t);
    kvpd_oai_release_messages(&o->req);
    json_decref(chat);
}

/* What an id the hub could not give back is answered with (404 for GET and DELETE, 400
 * naming previous_response_id for a continuation). */
static void not_stored(kvpd_conn *c, const kvp_hub_event *ev, int prev)
{
    char msg[256];
    const char *id = c->oai->id;   /* the id asked for, kept there (below) */
    if (ev->resp_rc == -EINVAL)
        snprintf(msg, sizeof msg, "'%.64s' is %.*s", id, (int)ev->len, ev->text);
    else if (ev->resp_rc == -ENOENT)
        snprintf(msg, sizeof msg, "no stored response '%.64s'", id);
    if (ev->resp_rc != -EINVAL && ev->resp_rc != -ENOENT) {
        snprintf(msg, sizeof msg, "the stored response could not be read: %.*s",
                 (int)ev->len, ev->text);
        kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, msg);
    } else if (prev) {
        kvpd_oai_fail(c, KVPD_OAI_E_PREVIOUS_RESPONSE, "previous_response_id", msg);
    } else {
        kvpd_oai_fail(c, KVPD_OAI_E_NOT_FOUND, NULL, msg);
    }
}

/* The hub's answer to the stored response asked for. */
static void stored(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    json_t *j = NULL;
    switch (r->wait) {
    case WAIT_PUT:
        if (ev->resp_rc < 0) {   /* answered, but not kept: say so */
            json_t *k = json_object_get(r->object, "kvpd");
            json_object_set_new(k, "stored", json_false());
            json_object_set_new(k, "store_error", json_stringn(ev->text, ev->len));
        }
        finish(c);
        break;
    case WAIT_PREV:
        if (ev->resp_rc == 0 && !(j = record(ev)))
            ((kvp_hub_event *)ev)->resp_rc = -ENOENT;
        if (ev->resp_rc < 0) {
            not_stored(c, ev, 1);
            break;
        }
        /* the answer's own id again (o->id held the previous one meanwhile) */
        snprintf(o->id, sizeof o->id, "%s", r->own_id);
        start_turn(c, j);
        break;
    case WAIT_GET:
        if (ev->resp_rc == 0 && !(j = record(ev)))
            ((kvp_hub_event *)ev)->resp_rc = -ENOENT;
        if (ev->resp_rc < 0) {
            not_stored(c, ev, 0);
            break;
        }
        kvpd_oai_answer(c, 200, json_incref(json_object_get(j, "object")));
        break;
    case WAIT_DELETE:
        if (ev->resp_rc < 0) {
            not_stored(c, ev, 0);
            break;
        }
        kvpd_oai_answer(c, 200, json_pack("{s:s, s:s, s:b}", "id", ev->id, "object",
                                          "response", "deleted", 1));
        break;
    default:
        break;
    }
    json_decref(j);
}

/* generate: false (Codex's warm-up before a turn): the request is checked as any other,
 * and answered at once with a completed response that has no output, generating and
 * keeping nothing (store: false in the answer). Warming the cache is an optimization,
 * so answering without it is honest: the next request prefills what it needs. */
static void warm_up(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    kvp_turn_stats st = {.stop = "eos", .stop_word = -1};
    kvp_hub_event ev = {.type = KVP_HUB_DONE, .stats = &st, .durable = -1};
    r->store = 0;
    o->durable = -1;
    if (o->req.stream)
        begin(c);
    r->object = response_object(c, &ev, json_array());
    r->cut = 0;
    finish(c);
}

void kvpd_oai_responses(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    json_t *req = kvpd_oai_parse(c), *chat_req = NULL;
    if (!req)
        return;
    resp_req *r = calloc(1, sizeof *r);
    if (!r) {
        kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
        json_decref(req);
        return;
    }
    o->codec = &codec;
    o->codec_state = r;
    r->prev = json_null();
    kvpd_oai_new_id(o->id, sizeof o->id, "resp_");
    char msg[256];
    kvp_turn_opts *t = &r->t;
    kvpd_oai_err e;
    const char *field = refused(req);
    if (field) {
        snprintf(msg, sizeof msg, "%s is not supported by kvpd", field);
        kvpd_oai_fail(c, KVPD_OAI_E_UNSUPPORTED_PARAMETER, field, msg);
        goto out;
    }
    if (kvpd_oai_check_fields(req, KVPD_OAI_API_RESPONSES, &e) < 0) {
        kvpd_oai_fail(c, e.code, e.param, e.message);
        goto out;
    }
    /* Chat completions' names for the reply's length are not the Responses API's. */
    if (json_object_get(req, "max_tokens") || json_object_get(req, "max_completion_tokens")) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, json_object_get(req, "max_tokens")
                      ? "max_tokens" : "max_completion_tokens", "the Responses API takes "
                      "max_output_tokens");
        goto out;
    }
    /* Tools, tool_choice and text.format in chat's shapes: served as chat completions
     * serve them (web/oai_tools.h, web/format.h). */
    if (!(chat_req = kvpd_items_request(req, &e))) {
        kvpd_oai_fail(c, e.code, e.param[0] ? e.param : NULL, e.message);
        goto out;
    }
    r->skipped = kvpd_items_skipped_tools(req);
    if (json_array_size(r->skipped)) {   /* said in the log and in the answer's kvpd */
        size_t n = json_array_size(r->skipped);
        kvpd_log("info", "responses %s: %zu tool%s of a type kvpd does not serve left out "
                 "(the first: %.40s)", o->id, n, n > 1 ? "s" : "",
                 json_string_value(json_array_get(r->skipped, 0)));
    }
    o->items_tools = json_object_get(req, "tools");
    int rc = kvpd_oai_model_ok(c, req) < 0 || kvpd_oai_options(c, chat_req, t) < 0;
    o->items_tools = NULL;
    if (rc)
        goto out;
    if (kvpd_oai_parse_logprobs(chat_req, &o->req, &e) < 0) {
        kvpd_items_error_names(&e, json_object_get(req, "tools"));
        kvpd_oai_fail(c, e.code, e.param[0] ? e.param : NULL, e.message);
        goto out;
    }
    t->logprobs = o->req.turn.logprobs;
    t->top_logprobs = o->req.turn.top_logprobs;
    json_t *mot = json_object_get(req, "max_output_tokens");
    if (mot && !json_is_null(mot)) {
        if (!json_is_integer(mot) || json_integer_value(mot) < 1) {
            kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "max_output_tokens",
                          "max_output_tokens must be a positive integer");
            goto out;
        }
        json_int_t cap = kvp_hub_reply_cap(c->w->hub);
        t->max_tokens = (int)(json_integer_value(mot) > cap ? cap : json_integer_value(mot));
    }
    json_t *store = json_object_get(req, "store");
    if (store && !json_is_null(store) && !json_is_boolean(store)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "store", "store must be a boolean");
        goto out;
    }
    r->store = !json_is_false(store);
    t->ephemeral = !r->store;   /* keeps nothing: no record, no session kept (hub_types.h) */
    json_t *ins = json_object_get(req, "instructions");
    if (ins && !json_is_null(ins) && !json_is_string(ins)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "instructions",
                      "instructions must be a string");
        goto out;
    }
    if (json_is_string(ins) && json_string_length(ins) > KVP_HUB_SYSTEM_MAX) {
        snprintf(msg, sizeof msg, "instructions are limited to %d bytes", KVP_HUB_SYSTEM_MAX);
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "instructions", msg);
        goto out;
    }
    json_t *meta = json_object_get(req, "metadata");
    if (meta && !json_is_null(meta) && !json_is_object(meta)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "metadata", "metadata must be an object");
        goto out;
    }
    r->echo = echo(req, ins, mot, meta);
    json_t *prev = json_object_get(req, "previous_response_id");
    if (prev && !json_is_null(prev) && !json_is_string(prev)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "previous_response_id",
                      "previous_response_id must be a string");
        goto out;
    }
    json_t *gen = json_object_get(req, "generate");
    if (gen && !json_is_null(gen) && !json_is_boolean(gen)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "generate", "generate must be a boolean");
        goto out;
    }
    if (json_is_false(gen)) {   /* a warm-up: its input may be empty, else it is checked */
        json_t *in = json_object_get(req, "input");
        if (in && !(json_is_array(in) && json_array_size(in) == 0)) {
            json_t *items = kvpd_items_input(in, &e);
            json_t *msgs = items ? kvpd_items_chat(items, 0, NULL, 0, &e) : NULL;
            json_decref(items);
            if (!msgs) {
                kvpd_oai_fail(c, e.code, e.param, e.message);
                goto out;
            }
            json_decref(msgs);
        }
        warm_up(c);
        goto out;
    }
    if (!(r->input = kvpd_items_input(json_object_get(req, "input"), &e))) {
        kvpd_oai_fail(c, e.code, e.param, e.message);
        goto out;
    }
    r->ins = json_is_string(ins) ? json_incref(ins) : NULL;
    kvp_hub_client *hc = kvpd_oai_client(c);
    if (!hc)
        goto out;
    if (json_is_string(prev)) {
        /* its conversation comes first, and its session serves it: read it first (the
         * hub answers with stored(); o->id names it for the errors until then) */
        json_decref(r->prev);
        r->prev = json_incref(prev);
        r->wait = WAIT_PREV;
        snprintf(r->own_id, sizeof r->own_id, "%s", o->id);
        snprintf(o->id, sizeof o->id, "%s", json_string_value(prev));
        kvp_hub_response_get(hc, json_string_value(prev));
        goto out;
    }
    start_turn(c, NULL);
out:
    json_decref(chat_req);
    json_decref(req);
}

void kvpd_oai_response_get(kvpd_conn *c, const char *id, int delete)
{
    kvpd_oai *o = c->oai;
    resp_req *r = calloc(1, sizeof *r);
    if (!r) {
        kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
        return;
    }
    o->codec = &codec;
    o->codec_state = r;
    r->prev = json_null();
    r->wait = delete ? WAIT_DELETE : WAIT_GET;
    /* o->id names the id asked for in the errors */
    snprintf(o->id, sizeof o->id, "%s", id);
    kvp_hub_client *hc = kvpd_oai_client(c);
    if (!hc)
        return;
    if (delete)
        kvp_hub_response_delete(hc, id);
    else
        kvp_hub_response_get(hc, id);
}
