/* The Responses API (docs/openai.md): POST /v1/responses, GET and DELETE
 * /v1/responses/{id}. A response's conversation is its `instructions` (the system text),
 * the conversation of its `previous_response_id` and its `input` items, then its reply;
 * a stored response keeps that conversation and the kvpd session that holds it, so a
 * request continuing it goes to kvp_hub_chat naming that session and prefills only its
 * new input. Stored responses live in memory (at most KVPD_RESPONSES_MAX of them and
 * KVPD_RESPONSES_BYTES of texts, the oldest dropped first), each visible to its tenant
 * only. Streamed answers are Server-Sent Events (`event:` and `data:` lines) in OpenAI's
 * sequence: response.created, response.in_progress, response.output_item.added,
 * response.content_part.added, response.output_text.delta..., response.output_text.done,
 * response.content_part.done, response.output_item.done, then response.completed (or
 * response.incomplete for a reply cut by max_output_tokens). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "web/openai_impl.h"

#define KVPD_RESPONSES_MAX 1024
#define KVPD_RESPONSES_BYTES (64u << 20)

typedef struct stored {
    struct stored *next;          /* oldest first */
    char id[64];                  /* resp_ + 24 hex digits */
    char tenant[KVP_TENANT_LEN + 1];
    char session[KVP_SESSION_ID_LEN + 1];
    char *system;                 /* the instructions (NULL: none) */
    size_t system_len;
    kvp_message *msgs;            /* the whole conversation, the reply last */
    int n;
    size_t bytes;                 /* of the texts */
    json_t *object;               /* the response as answered */
} stored;

struct kvpd_oai_store {
    stored *head, *tail;
    int count;
    size_t bytes;
};

/* One request's conversation and what its answer echoes. */
typedef struct resp_req {
    char *system;
    size_t system_len;
    kvp_message *msgs;
    int n;
    int store;
    int seq;                      /* the stream's sequence_number */
    int begun;                    /* the stream's first events are out */
    char msg_id[64];
    json_t *prev;                 /* previous_response_id (string) or null */
    json_t *echo;                 /* request fields the response object repeats */
} resp_req;

static void free_msgs(kvp_message *m, int n)
{
    for (int i = 0; i < n; i++)
        free(m[i].text);
    free(m);
}

static void req_free(void *p)
{
    resp_req *r = p;
    if (!r)
        return;
    free(r->system);
    free_msgs(r->msgs, r->n);
    json_decref(r->prev);
    json_decref(r->echo);
    free(r);
}

static void stored_free(stored *s)
{
    free(s->system);
    free_msgs(s->msgs, s->n);
    json_decref(s->object);
    free(s);
}

void kvpd_oai_responses_free(kvpd_web *w)
{
    struct kvpd_oai_store *st = w->responses;
    if (!st)
        return;
    for (stored *s = st->head, *next; s; s = next) {
        next = s->next;
        stored_free(s);
    }
    free(st);
    w->responses = NULL;
}

static stored *find(kvpd_conn *c, const char *id, stored **before)
{
    struct kvpd_oai_store *st = c->w->responses;
    stored *prev = NULL;
    for (stored *s = st ? st->head : NULL; s; prev = s, s = s->next)
        if (!strcmp(s->id, id) && !strcmp(s->tenant, c->tenant)) {
            if (before)
                *before = prev;
            return s;
        }
    return NULL;
}

static void unlink_stored(struct kvpd_oai_store *st, stored *s, stored *before)
{
    if (before)
        before->next = s->next;
    else
        st->head = s->next;
    if (st->tail == s)
        st->tail = before;
    st->count--;
    st->bytes -= s->bytes;
}

/* ---- the request's conversation ---- */

static int add_msg(resp_req *r, int user, const char *text, size_t len)
{
    kvp_message *m = realloc(r->msgs, ((size_t)r->n + 1) * sizeof *m);
    if (!m)
        return -1;
    r->msgs = m;
    char *t = malloc(len + 1);
    if (!t)
        return -1;
    memcpy(t, text, len);
    t[len] = '\0';
    m[r->n++] = (kvp_message){user, t, len};
    return 0;
}

/* An item's text: a string, or parts of type input_text, output_text or text. malloc'd;
 * NULL when it is neither (or out of memory: *oom). */
static char *item_text(json_t *content, size_t *len, int *oom)
{
    *oom = 0;
    if (json_is_string(content)) {
        *len = json_string_length(content);
        char *t = malloc(*len + 1);
        if (!t)
            *oom = 1;
        else
            memcpy(t, json_string_value(content), *len + 1);
        return t;
    }
    if (!json_is_array(content))
        return NULL;
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text") &&
                      strcmp(type, "text")) || !json_is_string(json_object_get(part, "text")))
            return NULL;
        total += json_string_length(json_object_get(part, "text"));
    }
    char *t = malloc(total + 1);
    if (!t) {
        *oom = 1;
        return NULL;
    }
    *len = 0;
    json_array_foreach(content, i, part) {
        json_t *x = json_object_get(part, "text");
        memcpy(t + *len, json_string_value(x), json_string_length(x));
        *len += json_string_length(x);
    }
    t[*len] = '\0';
    return t;
}

/* input: a string (one user message) or message items. System and developer items
 * before any other message of a new conversation (without instructions) are its system
 * text; later ones are folded into the user message that follows, as chat completions
 * do. 0, or -1 after answering. */
static int input(kvpd_conn *c, resp_req *r, json_t *in, int fresh)
{
    char param[48];
    char *pending = NULL;   /* system text waiting for its user message */
    size_t pending_len = 0, i;
    if (json_is_string(in)) {
        if (add_msg(r, 1, json_string_value(in), json_string_length(in)) < 0)
            goto oom;
        return 0;
    }
    if (!json_is_array(in) || json_array_size(in) == 0) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "input",
                      "input must be a string or a non-empty array of message items");
        return -1;
    }
    json_t *item;
    json_array_foreach(in, i, item) {
        const char *type = json_string_value(json_object_get(item, "type"));
        const char *role = json_string_value(json_object_get(item, "role"));
        if (type && strcmp(type, "message")) {
            snprintf(param, sizeof param, "input[%zu].type", i);
            char msg[160];
            snprintf(msg, sizeof msg, "%s: only message items are supported by kvpd", param);
            kvpd_oai_fail(c, KVPD_OAI_E_UNSUPPORTED_PARAMETER, param, msg);
            goto bad;
        }
        int sys = role && (!strcmp(role, "system") || !strcmp(role, "developer"));
        if (!role || (!sys && strcmp(role, "user") && strcmp(role, "assistant"))) {
            snprintf(param, sizeof param, "input[%zu].role", i);
            kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, param,
                          "a message's role must be user, assistant, system or developer");
            goto bad;
        }
        size_t len;
        int oom;
        char *text = item_text(json_object_get(item, "content"), &len, &oom);
        if (!text) {
            if (oom)
                goto oom;
            snprintf(param, sizeof param, "input[%zu].content", i);
            kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, param,
                          "a message's content must be a string or an "
                          "array of input_text / output_text parts");
            goto bad;
        }
        if (sys && fresh && r->n == 0 && !pending && !r->system) {
            r->system = text;
            r->system_len = len;
            continue;
        }
        if (sys || (pending && strcmp(role, "user"))) {
            if (!sys) {   /* an assistant message after a system one: keep the order */
                free(text);
                kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "input",
                              "a system or developer message must be "
                              "followed by a user message");
                goto bad;
            }
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
        int rc;
        if (pending) {
            char *p = realloc(pending, pending_len + len + 1);
            if (!p) {
                free(text);
                goto oom;
            }
            memcpy(p + pending_len, text, len + 1);
            rc = add_msg(r, 1, p, pending_len + len);
            free(p);
            pending = NULL;
            pending_len = 0;
        } else {
            rc = add_msg(r, !strcmp(role, "user"), text, len);
        }
        free(text);
        if (rc < 0)
            goto oom;
    }
    if (pending || r->n == 0 || !r->msgs[r->n - 1].user) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "input",
                      "the last input message must be the user's");
        goto bad;
    }
    return 0;
oom:
    kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
bad:
    free(pending);
    return -1;
}

/* Fields of the Responses API kvpd cannot honour: the first one present, or NULL. */
static const char *refused(json_t *req)
{
    json_t *v = json_object_get(req, "text");
    json_t *format = json_object_get(v, "format");
    if (format && !json_is_null(format)) {
        const char *type = json_string_value(json_object_get(format, "type"));
        if (!type || strcmp(type, "text"))
            return "text.format";
    }
    /* function tools here have the Responses API's flat shape, not chat's: not yet */
    static const char *absent[] = {"reasoning", "include", "conversation", "prompt",
                                   "background", "tools", "tool_choice",
                                   "parallel_tool_calls", "top_logprobs", "logprobs"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        v = json_object_get(req, absent[i]);
        if (v && !json_is_null(v) && !json_is_false(v) &&
            !(json_is_array(v) && json_array_size(v) == 0))
            return absent[i];
    }
    return NULL;
}

/* ---- the answer ---- */

static json_t *message_item(const resp_req *r, const char *text, size_t len, const char *status)
{
    json_t *content = text ? json_pack("[{s:s, s:s%, s:[], s:[]}]", "type", "output_text",
                                       "text", text, len, "annotations", "logprobs")
                           : json_array();
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", r->msg_id,
                     "status", status, "role", "assistant", "content", content);
}

/* The response object; st NULL: in progress (no output, no usage yet). */
static json_t *response_object(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    const kvp_turn_stats *st = ev ? ev->stats : NULL;
    int cut = st && !strcmp(st->stop, "length");
    const char *status = !st ? "in_progress" : cut ? "incomplete" : "completed";
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:s, s:O, s:o, s:n, s:b}", "id", o->id,
                          "object", "response", "created_at", (json_int_t)o->created,
                          "status", status, "model", o->model, "previous_response_id",
                          r->prev, "output", st ? json_pack("[o]", message_item(
                              r, ev->text, ev->len, cut ? "incomplete" : "completed"))
                                                 : json_array(),
                          "error", "store", r->store);
    json_object_update(j, r->echo);
    json_object_set_new(j, "incomplete_details", cut ? json_pack("{s:s}", "reason",
                                                                 "max_output_tokens")
                                                     : json_null());
    json_object_set_new(j, "tools", json_array());
    json_object_set_new(j, "tool_choice", json_string("auto"));
    json_object_set_new(j, "parallel_tool_calls", json_false());
    json_object_set_new(j, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(j, "truncation", json_string("disabled"));
    if (st) {
        json_object_set_new(j, "output_text", json_stringn(ev->text, ev->len));
        json_object_set_new(j, "usage", json_pack(
            "{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", st->context_tokens,
            "input_tokens_details", "cached_tokens", st->cached_tokens, "output_tokens",
            st->generated_tokens, "output_tokens_details", "reasoning_tokens", 0,
            "total_tokens", st->context_tokens + st->generated_tokens));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(o->session, o->durable, st));
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
    event(c, "response.created", json_pack("{s:o}", "response", response_object(c, NULL)));
    event(c, "response.in_progress", json_pack("{s:o}", "response", response_object(c, NULL)));
    event(c, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", 0, "item",
                                                     message_item(r, NULL, 0, "in_progress")));
    event(c, "response.content_part.added", json_pack(
        "{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", r->msg_id, "output_index", 0,
        "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
}

static void token(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    if (!o->req.stream || !ev->len)
        return;
    begin(c);
    event(c, "response.output_text.delta", json_pack(
        "{s:s, s:i, s:i, s:s%, s:[]}", "item_id", r->msg_id, "output_index", 0,
        "content_index", 0, "delta", ev->text, ev->len, "logprobs"));
}

/* Keeps the response (store) with its conversation and the reply. */
static void keep(kvpd_conn *c, const kvp_hub_event *ev, json_t *object)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    if (!r->store)
        return;
    if (!c->w->responses && !(c->w->responses = calloc(1, sizeof *c->w->responses)))
        return;
    struct kvpd_oai_store *st = c->w->responses;
    stored *s = calloc(1, sizeof *s);
    if (!s || add_msg(r, 0, ev->text, ev->len) < 0) {
        free(s);
        return;
    }
    snprintf(s->id, sizeof s->id, "%s", o->id);
    snprintf(s->tenant, sizeof s->tenant, "%s", c->tenant);
    snprintf(s->session, sizeof s->session, "%s", o->session);
    s->system = r->system;
    s->system_len = r->system_len;
    s->msgs = r->msgs;
    s->n = r->n;
    r->system = NULL;
    r->msgs = NULL;
    r->n = 0;
    s->bytes = s->system_len;
    for (int i = 0; i < s->n; i++)
        s->bytes += s->msgs[i].len + sizeof *s->msgs;
    s->object = json_incref(object);
    if (st->tail)
        st->tail->next = s;
    else
        st->head = s;
    st->tail = s;
    st->count++;
    st->bytes += s->bytes;
    while (st->head != s && (st->count > KVPD_RESPONSES_MAX || st->bytes > KVPD_RESPONSES_BYTES)) {
        stored *old = st->head;
        unlink_stored(st, old, NULL);
        stored_free(old);
    }
}

static void done(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    resp_req *r = o->codec_state;
    json_t *object = response_object(c, ev);
    keep(c, ev, object);
    if (!o->req.stream) {
        kvpd_oai_answer(c, 200, object);
        return;
    }
    begin(c);
    int cut = !strcmp(ev->stats->stop, "length");
    event(c, "response.output_text.done", json_pack(
        "{s:s, s:i, s:i, s:s%, s:[]}", "item_id", r->msg_id, "output_index", 0,
        "content_index", 0, "text", ev->text, ev->len, "logprobs"));
    event(c, "response.content_part.done", json_pack(
        "{s:s, s:i, s:i, s:{s:s, s:s%, s:[]}}", "item_id", r->msg_id, "output_index", 0,
        "content_index", 0, "part", "type", "output_text", "text", ev->text, ev->len,
        "annotations"));
    event(c, "response.output_item.done", json_pack(
        "{s:i, s:o}", "output_index", 0, "item",
        message_item(r, ev->text, ev->len, cut ? "incomplete" : "completed")));
    event(c, cut ? "response.incomplete" : "response.completed",
          json_pack("{s:o}", "response", object));
    o->ended = 1;
}

static void stream_error(kvpd_conn *c, enum kvpd_oai_code code, const char *msg, size_t len)
{
    event(c, "error", json_pack("{s:s, s:s%, s:n}", "code", kvpd_oai_code_label(code), "message",
                                msg, len, "param"));
}

static const kvpd_oai_codec codec = {.token = token, .done = done,
                                     .stream_error = stream_error, .free = req_free};

void kvpd_oai_responses(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    json_t *req = kvpd_oai_parse(c);
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
    kvpd_oai_new_id(o->id, sizeof o->id, "resp_");
    kvpd_oai_new_id(r->msg_id, sizeof r->msg_id, "msg_");
    char msg[256];
    kvp_turn_opts t;
    const char *field = refused(req);
    if (field) {
        snprintf(msg, sizeof msg, "%s is not supported by kvpd", field);
        kvpd_oai_fail(c, KVPD_OAI_E_UNSUPPORTED_PARAMETER, field, msg);
        goto out;
    }
    /* Chat completions' names for the reply's length are not the Responses API's. */
    if (json_object_get(req, "max_tokens") || json_object_get(req, "max_completion_tokens")) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, json_object_get(req, "max_tokens")
                      ? "max_tokens" : "max_completion_tokens", "the Responses API takes "
                      "max_output_tokens");
        goto out;
    }
    if (kvpd_oai_model_ok(c, req) < 0 || kvpd_oai_options(c, req, &t) < 0)
        goto out;
    json_t *mot = json_object_get(req, "max_output_tokens");
    if (mot && !json_is_null(mot)) {
        if (!json_is_integer(mot) || json_integer_value(mot) < 1) {
            kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "max_output_tokens",
                          "max_output_tokens must be a positive integer");
            goto out;
        }
        json_int_t cap = c->w->cfg->max_tokens;
        t.max_tokens = (int)(json_integer_value(mot) > cap ? cap : json_integer_value(mot));
    }
    json_t *store = json_object_get(req, "store");
    if (store && !json_is_null(store) && !json_is_boolean(store)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "store", "store must be a boolean");
        goto out;
    }
    r->store = !json_is_false(store);
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
    r->echo = json_pack("{s:O?, s:O?, s:O?, s:O?}", "instructions", ins, "max_output_tokens",
                        mot, "temperature", json_object_get(req, "temperature"), "top_p",
                        json_object_get(req, "top_p"));
    json_object_set_new(r->echo, "metadata", json_is_object(meta) ? json_deep_copy(meta)
                                                                : json_object());
    /* previous_response_id: its conversation comes first, and its session serves it. */
    json_t *prev = json_object_get(req, "previous_response_id");
    const stored *p = NULL;
    r->prev = json_null();
    if (prev && !json_is_null(prev)) {
        if (!json_is_string(prev) || !(p = find(c, json_string_value(prev), NULL))) {
            snprintf(msg, sizeof msg, "no stored response '%.64s'",
                     json_is_string(prev) ? json_string_value(prev) : "?");
            kvpd_oai_fail(c, KVPD_OAI_E_PREVIOUS_RESPONSE, "previous_response_id", msg);
            goto out;
        }
        json_decref(r->prev);
        r->prev = json_incref(prev);
        for (int i = 0; i < p->n; i++)
            if (add_msg(r, p->msgs[i].user, p->msgs[i].text, p->msgs[i].len) < 0) {
                kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
                goto out;
            }
    }
    if (json_is_string(ins)) {
        r->system_len = json_string_length(ins);
        if (!(r->system = malloc(r->system_len + 1))) {
            kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
            goto out;
        }
        memcpy(r->system, json_string_value(ins), r->system_len + 1);
    }
    if (input(c, r, json_object_get(req, "input"), p == NULL) < 0)
        goto out;
    if (r->system_len > KVP_HUB_SYSTEM_MAX) {
        snprintf(msg, sizeof msg, "the system text is limited to %d bytes", KVP_HUB_SYSTEM_MAX);
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "input", msg);
        goto out;
    }
    kvp_hub_client *hc = kvpd_oai_client(c);
    if (hc)
        kvp_hub_chat(hc, p ? p->session : NULL, r->system, r->system_len, r->msgs, r->n, &t);
out:
    json_decref(req);
}

void kvpd_oai_response_get(kvpd_conn *c, const char *id, int delete)
{
    stored *before = NULL;
    stored *s = find(c, id, &before);
    if (!s) {
        char msg[128];
        snprintf(msg, sizeof msg, "no stored response '%.64s'", id);
        kvpd_oai_fail(c, KVPD_OAI_E_NOT_FOUND, NULL, msg);
        return;
    }
    if (!delete) {
        kvpd_oai_answer(c, 200, json_incref(s->object));
        return;
    }
    kvpd_oai_answer(c, 200, json_pack("{s:s, s:s, s:b}", "id", s->id, "object", "response",
                                      "deleted", 1));
    unlink_stored(c->w->responses, s, before);
    stored_free(s);
}
