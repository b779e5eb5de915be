/* The /chat websocket: message assembly from fragments, limits, and the protocol's
 * hello / message / cancel handed to the session hub; the hub's events become frames. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "web/chat.h"
#include "web/chat_tools.h"
#include "web/conn.h"
#include "web/protocol.h"

static void send_error(kvpd_conn *c, const char *code, const char *msg, int retry_after_ms)
{
    c->w->metrics->errors[kvpd_err_kind_of(code)]++;
    kvpd_conn_send(c, retry_after_ms > 0 ? kvpd_proto_error_retry(code, msg, retry_after_ms)
                                         : kvpd_proto_error(code, msg));
}

/* The hub's events for this connection. */
static void on_hub_event(void *ctx, const kvp_hub_event *ev)
{
    kvpd_conn *c = ctx;
    switch (ev->type) {
    case KVP_HUB_SESSION:
        kvpd_conn_send(c, kvpd_proto_session(ev->id, ev->resumed, ev->turns, ev->history,
                                             ev->n_history, ev->history_dropped, ev->system,
                                             ev->system_len, kvp_hub_reply_cap(c->w->hub)));
        break;
    case KVP_HUB_TOKEN:
        if (!kvpd_ws_tools_token(c, ev))
            kvpd_conn_send(c, kvpd_proto_token(ev->text, ev->len));
        break;
    case KVP_HUB_DONE:
        if (!kvpd_ws_tools_done(c, ev))
            kvpd_conn_send(c, kvpd_proto_done(ev->text, ev->len, ev->stats, ev->durable,
                                              ev->durable_error));
        break;
    case KVP_HUB_ERROR:
        kvpd_ws_tools_error(c, ev);
        send_error(c, ev->code, ev->text, ev->retry_after_ms);
        break;
    case KVP_HUB_RESPONSE:   /* the websocket stores no responses */
        break;
    }
}

/* The connection's hub client, of the tenant its API key (on the upgrade or in the auth
 * frame) names. */
static kvp_hub_client *new_client(kvpd_conn *c)
{
    kvp_hub_client *hc = kvp_hub_client_new(c->w->hub, on_hub_event, c);
    if (hc)
        kvp_hub_client_set_tenant(hc, c->tenant);
    return hc;
}

/* Closes the connection with code (1008: policy violation) and why: the frame goes out on
 * the next writeable callback (web/server.c), and nothing more is read until then. */
static void close_policy(kvpd_conn *c, const char *why)
{
    kvpd_log("info", "websocket closed: %s", why);
    c->close_code = LWS_CLOSE_STATUS_POLICY_VIOLATION;
    c->close_why = why;
    lws_callback_on_writable(c->wsi);
}

/* With API keys and none on the upgrade, the first message must be the auth frame. */
static void handle_unauthed(kvpd_conn *c, const char *buf, size_t len)
{
    kvpd_client_msg m;
    const char *code;
    char msg[256];
    /* only the auth frame is taken here, which has no max_tokens */
    if (kvpd_proto_parse(buf, len, INT_MAX, &m, &code, msg, sizeof msg) < 0 ||
        m.type != KVPD_MSG_AUTH) {
        kvpd_proto_msg_free(&m);   /* a refused parse left nothing to free: harmless */
        close_policy(c, "an API key is required: the first frame must be "
                        "{\"type\":\"auth\",\"token\":KEY}");
        return;
    }
    int ok = kvpd_api_tenant_token(c->w, m.text, m.text_len, c->tenant);
    kvpd_proto_msg_free(&m);
    if (!ok) {
        close_policy(c, "invalid API key");
        return;
    }
    c->authed = 1;
    lws_set_timer_usecs(c->wsi, LWS_SET_TIMER_USEC_CANCEL);
    kvpd_conn_send(c, kvpd_proto_auth_ok());
}

/* A message or tool_result: its tools and tool_choice (web/chat_tools.h), then the hub. */
static void turn(kvpd_conn *c, kvpd_client_msg *m)
{
    kvp_hub_info hi;
    kvp_hub_info_get(c->w->hub, &hi);
    char msg[400], *text = NULL;
    size_t len = 0;
    int rc = kvpd_ws_tools_turn(c, m, hi.tool_format, &text, &len, msg, sizeof msg);
    if (rc < 0) {
        send_error(c, rc == -2 ? KVPD_E_BUSY : KVPD_E_BAD_REQUEST, msg, 0);
        return;
    }
    kvpd_ws_tools_submitting(c, 1);
    if (text)
        kvp_hub_message_opts(c->client, text, len, &m->opts);
    else
        kvp_hub_message_opts(c->client, m->text, m->text_len, &m->opts);
    kvpd_ws_tools_submitting(c, 0);
    free(text);
}

static void handle(kvpd_conn *c, const char *buf, size_t len)
{
    kvpd_web *w = c->w;
    kvpd_client_msg m;
    const char *code;
    char msg[256];
    if (!c->authed) {
        handle_unauthed(c, buf, len);
        return;
    }
    /* while the model loads (no hub) the message is refused below */
    if (kvpd_proto_parse(buf, len, w->hub ? kvp_hub_reply_cap(w->hub) : INT_MAX, &m, &code, msg,
                         sizeof msg) < 0) {
        send_error(c, code, msg, 0);
        return;
    }
    if (m.type == KVPD_MSG_AUTH) {
        /* Without keys there is nothing to check; with one, the connection has its key. */
        if (w->cfg->n_api_keys)
            send_error(c, KVPD_E_BAD_REQUEST, "the connection is already authenticated", 0);
        else
            kvpd_conn_send(c, kvpd_proto_auth_ok());
    } else if (m.type == KVPD_MSG_CANCEL) {
        if (c->client)
            kvp_hub_cancel(c->client);
    } else if (w->draining || !w->hub) {
        send_error(c, KVPD_E_OVERLOADED,
                   w->draining ? "the daemon is shutting down" : "the model is loading", 0);
    } else if (!c->client && !(c->client = new_client(c))) {
        send_error(c, KVPD_E_INTERNAL, "out of memory", 0);
    } else if (m.type == KVPD_MSG_HELLO && m.session[0] && c->session_arg[0] &&
               strcmp(m.session, c->session_arg)) {
        send_error(c, KVPD_E_BAD_REQUEST, "hello names another session than the connection's "
                   "?session=", 0);
    } else if (m.type == KVPD_MSG_HELLO && m.has_fork && c->session_arg[0] &&
               strcmp(m.fork_session, c->session_arg)) {
        send_error(c, KVPD_E_BAD_REQUEST, "hello forks another session than the connection's "
                   "?session=", 0);
    } else if (m.type == KVPD_MSG_HELLO && m.has_fork) {
        kvpd_ws_tools_hello(c, m.tools);
        kvp_hub_open_fork(c->client, m.fork_session, m.fork_turn);
    } else if (m.type == KVPD_MSG_HELLO) {
        kvpd_ws_tools_hello(c, m.tools);
        kvp_hub_open(c->client, m.session[0] ? m.session : c->session_arg, m.system,
                     m.system_len);
    } else {
        turn(c, &m);
    }
    kvpd_proto_msg_free(&m);
}

const char *kvpd_chat_session_arg(struct lws *wsi, char *out)
{
    static const char bad[] = "?session= must be 32 lowercase hex digits";
    out[0] = '\0';
    int found = 0;
    for (int i = 0;; i++) {
        int n = lws_hdr_fragment_length(wsi, WSI_TOKEN_HTTP_URI_ARGS, i);
        if (n <= 0)
            return NULL;
        char *arg = malloc((size_t)n + 1);   /* bounded by lws's header limit */
        if (!arg || lws_hdr_copy_fragment(wsi, arg, n + 1, WSI_TOKEN_HTTP_URI_ARGS, i) < 0) {
            free(arg);
            return "unreadable query";
        }
        const char *why = NULL;
        if (!strncmp(arg, "session=", 8)) {
            const char *v = arg + 8;
            if (!kvp_session_id_ok(v))
                why = bad;
            else if (found++)
                why = "?session= given twice";
            else
                memcpy(out, v, KVP_SESSION_ID_LEN + 1);
        }
        free(arg);
        if (why) {
            out[0] = '\0';
            return why;
        }
    }
}

int kvpd_chat_receive(kvpd_conn *c, const void *in, size_t len)
{
    struct lws *wsi = c->wsi;
    size_t max = (size_t)c->w->cfg->max_message_bytes;
    if (lws_is_first_fragment(wsi)) {
        c->rx_len = 0;
        c->rx_skip = lws_frame_is_binary(wsi) ? KVPD_RX_BINARY : KVPD_RX_KEEP;
    }
    if (c->rx_skip == KVPD_RX_KEEP) {
        if (c->rx_len + len > max) {
            /* Drop the rest of this message; answer when it ends. */
            c->rx_skip = KVPD_RX_TOO_LARGE;
        } else {
            if (c->rx_len + len > c->rx_cap) {
                size_t cap = c->rx_cap ? c->rx_cap : 1024;
                while (cap < c->rx_len + len)
                    cap *= 2;
                char *r = realloc(c->rx, cap);
                if (!r)
                    return -1;
                c->rx = r;
                c->rx_cap = cap;
            }
            if (len)   /* an empty frame has no buffer yet (and lws may pass in NULL) */
                memcpy(c->rx + c->rx_len, in, len);
            c->rx_len += len;
        }
    }
    if (!lws_is_final_fragment(wsi) || lws_remaining_packet_payload(wsi))
        return 0;
    char msg[96];
    if (c->close_code) {
        /* closing: nothing more is handled */
    } else if (!c->authed && c->rx_skip != KVPD_RX_KEEP) {
        close_policy(c, "an API key is required: the first frame must be "
                        "{\"type\":\"auth\",\"token\":KEY}");
    } else switch (c->rx_skip) {
    case KVPD_RX_BINARY:
        send_error(c, KVPD_E_BAD_REQUEST, "binary frames are not part of the protocol", 0);
        break;
    case KVPD_RX_TOO_LARGE:
        snprintf(msg, sizeof msg, "messages are limited to %zu bytes", max);
        send_error(c, KVPD_E_TOO_LARGE, msg, 0);
        break;
    case KVPD_RX_KEEP:
        handle(c, c->rx, c->rx_len);
        break;
    }
    c->rx_len = 0;
    c->rx_skip = KVPD_RX_KEEP;
    /* A big message's buffer is not kept for the connection's lifetime. */
    if (c->rx_cap > 65536) {
        free(c->rx);
        c->rx = NULL;
        c->rx_cap = 0;
    }
    return 0;
}

void kvpd_chat_closed(kvpd_conn *c)
{
    if (c->client)
        kvp_hub_close(c->client);
    c->client = NULL;
    kvpd_ws_tools_free(c);
    kvpd_conn_free_frames(c);
    free(c->rx);
    c->rx = NULL;
}
