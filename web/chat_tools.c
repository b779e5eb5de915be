/* Tool calling over the /chat websocket (web/chat_tools.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/textbuf.h"
#include "web/chat_tools.h"
#include "web/oai_tools.h"

struct kvpd_ws_tools {
    json_t *hello_tools;          /* the connection's (NULL: none) */
    kvpd_oai_tools *turn;         /* the running turn's parse state (NULL: none) */
    int submitting;
    char pending_id[32];          /* a call whose arguments come next */
    char pending_name[128];
    char *content;                /* the reply's text outside calls, as sent */
    size_t content_len, content_cap;
    json_t *calls;                /* this turn's calls: [{id, name, arguments}] */
    json_t *last_calls;           /* the last finished reply's: id -> name */
};

static struct kvpd_ws_tools *state(kvpd_conn *c)
{
    if (!c->tools)
        c->tools = calloc(1, sizeof *c->tools);
    return c->tools;
}

static void end_turn(struct kvpd_ws_tools *t)
{
    if (t->turn) {
        kvpd_oai_tools_free(t->turn);
        free(t->turn);
        t->turn = NULL;
    }
    json_decref(t->calls);
    t->calls = NULL;
    t->content_len = 0;
    t->pending_id[0] = '\0';
}

void kvpd_ws_tools_hello(kvpd_conn *c, json_t *tools)
{
    struct kvpd_ws_tools *t = state(c);
    if (!t || !tools)
        return;
    json_decref(t->hello_tools);
    t->hello_tools = json_incref(tools);
}

/* The tool message of a tool_result (malloc'd JSON text), or NULL with msg set. */
static char *results_text(struct kvpd_ws_tools *t, json_t *results, size_t *len, char *msg,
                          size_t msglen)
{
    json_t *out = json_array();
    size_t i;
    json_t *r;
    json_array_foreach(results, i, r) {
        const char *id = json_string_value(json_object_get(r, "id"));
        json_t *name = json_object_get(r, "name");
        if (!json_is_string(name))
            name = json_object_get(t->last_calls, id);
        if (!json_is_string(name)) {
            snprintf(msg, msglen, "results[%zu]: the call '%.64s' is not one of this "
                     "connection's last reply: give its name", i, id);
            json_decref(out);
            return NULL;
        }
        json_array_append_new(out, json_pack("{s:s, s:O, s:O}", "tool_call_id", id, "name",
                                             name, "content", json_object_get(r, "content")));
    }
    char *s = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    if (!s)
        snprintf(msg, msglen, "out of memory");
    else
        *len = strlen(s);
    return s;
}

int kvpd_ws_tools_turn(kvpd_conn *c, kvpd_client_msg *m, int format, char **text, size_t *len,
                       char *msg, size_t msglen)
{
    struct kvpd_ws_tools *t = state(c);
    *text = NULL;
    if (!t) {
        snprintf(msg, msglen, "out of memory");
        return -1;
    }
    if (t->turn) {
        snprintf(msg, msglen, "a turn is running on this connection");
        return -2;
    }
    if (m->type == KVPD_MSG_TOOL_RESULT) {
        if (!(*text = results_text(t, m->results, len, msg, msglen)))
            return -1;
        m->opts.role = KVP_MESSAGE_TOOL;
    }
    json_t *tools = m->tools ? m->tools : t->hello_tools;
    if (!json_array_size(tools)) {
        if (m->tool_choice || m->parallel_tool_calls) {
            snprintf(msg, msglen, "%s needs tools (in the message or the hello)",
                     m->tool_choice ? "tool_choice" : "parallel_tool_calls");
            goto bad;
        }
        return 0;
    }
    json_t *req = json_pack("{s:O, s:O?, s:O?}", "tools", tools, "tool_choice", m->tool_choice,
                            "parallel_tool_calls", m->parallel_tool_calls);
    kvpd_oai_tools *turn = calloc(1, sizeof *turn);
    kvpd_oai_tools_err e;
    if (!req || !turn || kvpd_oai_tools_request(turn, req, format, &m->opts, &e) < 0) {
        if (!req || !turn)
            snprintf(msg, msglen, "out of memory");
        else
            snprintf(msg, msglen, "%s", e.msg);
        json_decref(req);
        if (turn) {
            kvpd_oai_tools_free(turn);
            free(turn);
        }
        goto bad;
    }
    json_decref(req);
    if (turn->grammar)   /* a forced call: the reply is the call */
        m->opts.grammar = turn->grammar;
    end_turn(t);
    if (turn->parse) {
        t->turn = turn;
        t->calls = json_array();
    } else {   /* tool_choice none: rendered, never parsed; the options borrow nothing else */
        t->turn = turn;
    }
    return 0;
bad:
    free(*text);
    *text = NULL;
    return -1;
}

void kvpd_ws_tools_submitting(kvpd_conn *c, int on)
{
    if (c->tools)
        c->tools->submitting = on;
}

static void add_content(struct kvpd_ws_tools *t, const char *s, size_t n)
{
    kvp_text_append(&t->content, &t->content_len, &t->content_cap, s, n);
}

/* The frames the reply's next text makes. */
static void feed(kvpd_conn *c, const char *text, size_t len, int final)
{
    struct kvpd_ws_tools *t = c->tools;
    json_t *deltas = kvpd_oai_tools_feed(t->turn, text, len, final);
    size_t i;
    json_t *d;
    json_array_foreach(deltas, i, d) {
        kvpd_oai_delta dl;
        kvpd_oai_tools_delta(d, &dl);
        if (dl.content) {
            add_content(t, dl.content, dl.content_len);
            kvpd_conn_send(c, kvpd_proto_token(dl.content, dl.content_len));
        }
        if (dl.call_id) {
            snprintf(t->pending_id, sizeof t->pending_id, "%s", dl.call_id);
            snprintf(t->pending_name, sizeof t->pending_name, "%s", dl.call_name);
        } else if (dl.arguments && t->pending_id[0]) {
            json_array_append_new(t->calls, json_pack("{s:s, s:s, s:s}", "id", t->pending_id,
                                                      "name", t->pending_name, "arguments",
                                                      dl.arguments));
            kvpd_conn_send(c, kvpd_proto_tool_call(t->pending_id, t->pending_name,
                                                   dl.arguments));
            t->pending_id[0] = '\0';
        }
    }
    json_decref(deltas);
}

int kvpd_ws_tools_token(kvpd_conn *c, const kvp_hub_event *ev)
{
    struct kvpd_ws_tools *t = c->tools;
    if (!t || !t->turn || !t->turn->parse)
        return 0;
    feed(c, ev->text, ev->len, 0);
    return 1;
}

int kvpd_ws_tools_done(kvpd_conn *c, const kvp_hub_event *ev)
{
    struct kvpd_ws_tools *t = c->tools;
    if (!t || !t->turn)
        return 0;
    if (!t->turn->parse) {
        end_turn(t);
        return 0;
    }
    feed(c, "", 0, 1);
    json_decref(t->last_calls);
    t->last_calls = json_object();
    size_t i;
    json_t *call;
    json_array_foreach(t->calls, i, call)
        json_object_set(t->last_calls, json_string_value(json_object_get(call, "id")),
                        json_object_get(call, "name"));
    kvpd_conn_send(c, kvpd_proto_done_calls(t->content ? t->content : "", t->content_len,
                                            ev->stats, ev->durable, ev->durable_error, t->calls));
    end_turn(t);
    return 1;
}

void kvpd_ws_tools_error(kvpd_conn *c, const kvp_hub_event *ev)
{
    struct kvpd_ws_tools *t = c->tools;
    if (!t || !t->turn)
        return;
    /* busy answers a request that came while the turn runs (a hello): the turn goes on */
    if (t->submitting || !ev->code || strcmp(ev->code, KVPD_E_BUSY))
        end_turn(t);
}

void kvpd_ws_tools_free(kvpd_conn *c)
{
    struct kvpd_ws_tools *t = c->tools;
    if (!t)
        return;
    end_turn(t);
    json_decref(t->hello_tools);
    json_decref(t->last_calls);
    free(t->content);
    free(t);
    c->tools = NULL;
}
