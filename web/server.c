/* The lws context on the foreign libuv loop, the one callback that dispatches HTTP and
 * websocket reasons, and the delivery of worker events to connections. */
#include "web/server.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "web/chat.h"
#include "web/conn.h"
#include "web/http.h"
#include "web/openai.h"

/* One frame per writeable callback, as lws requires. */
static int ws_writeable(kvpd_conn *c)
{
    kvpd_frame *f = c->out_head;
    if (!f)
        return 0;
    int n = lws_write(c->wsi, f->buf + LWS_PRE, f->len, LWS_WRITE_TEXT);
    c->out_head = f->next;
    if (!c->out_head)
        c->out_tail = NULL;
    free(f);
    c->w->frames_pending--;
    if (n < 0)
        return -1;
    if (c->out_head)
        lws_callback_on_writable(c->wsi);
    return 0;
}

/* A websocket with no frame either way for connection_idle_timeout seconds is closed
 * (lws's timeout, re-armed on every frame). */
static void keep_alive(kvpd_conn *c)
{
    int secs = c->w->cfg->connection_idle_timeout_s;
    lws_set_timeout(c->wsi, secs ? PENDING_TIMEOUT_USER_OK : NO_PENDING_TIMEOUT, secs);
}

/* Writes a close frame with code and why (cut to 100 bytes) itself: lws 4.1 has no write
 * of a close, and closes without the reason set from a writeable callback. */
static void close_frame(struct lws *wsi, int code, const char *why)
{
    size_t n = strlen(why);
    if (n > 100)
        n = 100;
    unsigned char buf[LWS_PRE + 4 + 100], *f = buf + LWS_PRE;
    f[0] = 0x88;   /* FIN, close */
    f[1] = (unsigned char)(2 + n);
    f[2] = (unsigned char)(code >> 8);
    f[3] = (unsigned char)(code & 0xff);
    memcpy(f + 4, why, n);
    lws_write(wsi, f, 4 + n, LWS_WRITE_RAW);
}

static void close_1002(struct lws *wsi, const char *why)
{
    close_frame(wsi, LWS_CLOSE_STATUS_PROTOCOL_ERR, why);
}

/* How long a websocket without a key on its upgrade has for its auth frame. */
#define AUTH_FRAME_TIMEOUT_US (10 * 1000 * 1000)

/* A client frame was unmasked (web/wsguard.c): fail the connection, code 1002. */
static int unmasked(struct lws *wsi, int writeable)
{
    if (!kvpd_wsguard_failed(lws_get_socket_fd(wsi)))
        return 0;
    static const char why[] = "unmasked client frame";
    if (writeable)
        close_1002(wsi, why);
    else
        lws_close_reason(wsi, LWS_CLOSE_STATUS_PROTOCOL_ERR, (unsigned char *)why,
                         sizeof why - 1);
    return 1;
}

/* A client's close frame payload: empty, or a code a peer may send (RFC 6455 7.4)
 * and a reason. */
static int close_code_valid(const unsigned char *p, size_t len)
{
    if (len == 0)
        return 1;
    if (len < 2)
        return 0;
    int code = p[0] << 8 | p[1];
    return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
           (code >= 3000 && code <= 4999);
}

static int uri_is(struct lws *wsi, const char *want)
{
    char uri[64];
    int n = lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI);
    return n > 0 && !strcmp(uri, want);
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user,
                    void *in, size_t len)
{
    kvpd_conn *c = user;
    kvpd_web *w = lws_context_user(lws_get_context(wsi));

    switch (reason) {
    case LWS_CALLBACK_WSI_CREATE:   /* every adopted connection, HTTP or websocket */
        w->connections_open++;
        return 0;
    case LWS_CALLBACK_WSI_DESTROY:
        w->connections_open--;
        kvpd_listen_closed(wsi);
        return 0;
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: {   /* non-zero refuses the upgrade */
        /* A refused upgrade is answered with its HTTP status (403 for a foreign Origin,
         * docs/protocol.md), then closed; lws alone would close without an answer. */
        char sid[KVP_SESSION_ID_LEN + 1];
        int status = 404;
        const char *why = uri_is(wsi, "/chat") ? kvpd_guard_upgrade(w, wsi, &status)
                                               : "websockets are served on /chat only\n";
        if (!why && (why = kvpd_chat_session_arg(wsi, sid)))
            status = 400;
        if (!why && kvpd_listen_reserved(wsi)) {
            why = "too many connections\n";
            status = 503;
        }
        if (why) {
            kvpd_log("info", "websocket upgrade refused: %.*s", (int)strcspn(why, "\n"), why);
            lws_return_http_status(wsi, (unsigned)status, why);
        }
        return why != NULL;
    }
    case LWS_CALLBACK_ESTABLISHED:
        if (kvpd_wsguard_upgraded(lws_get_socket_fd(wsi), wsi) < 0) {
            static const char why[] = "data before the handshake completed";
            kvpd_log("info", "websocket closed: %s", why);
            lws_close_reason(wsi, LWS_CLOSE_STATUS_PROTOCOL_ERR, (unsigned char *)why,
                             sizeof why - 1);
            return -1;
        }
        memset(c, 0, sizeof *c);
        c->wsi = wsi;
        c->w = w;
        c->is_ws = 1;
        kvpd_chat_session_arg(wsi, c->session_arg);   /* checked at the upgrade */
        /* A valid key on the upgrade, or none configured; else the first frame must be
         * the auth frame (web/chat.c), within AUTH_FRAME_TIMEOUT_US. */
        c->authed = kvpd_api_tenant(w, wsi, c->tenant);
        if (!c->authed)
            lws_set_timer_usecs(wsi, AUTH_FRAME_TIMEOUT_US);
        w->metrics->connections++;
        keep_alive(c);
        return 0;
    case LWS_CALLBACK_TIMER:
        if (c && c->is_ws && !c->authed && !c->close_code) {
            static const char why[] = "no auth frame within 10 s";
            kvpd_log("info", "websocket closed: %s", why);
            c->close_code = LWS_CLOSE_STATUS_POLICY_VIOLATION;
            c->close_why = why;
            lws_callback_on_writable(wsi);
        }
        return 0;
    case LWS_CALLBACK_RECEIVE:
        if (unmasked(wsi, 0))
            return -1;
        keep_alive(c);
        return kvpd_chat_receive(c, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        if (unmasked(wsi, 1))
            return -1;
        if (c->close_code) {
            close_frame(wsi, c->close_code, c->close_why);
            return -1;
        }
        keep_alive(c);
        return ws_writeable(c);
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
        /* lws echoes the client's close; an invalid code is answered 1002 instead */
        if (close_code_valid(in, len))
            return 0;
        close_1002(wsi, "invalid close code");
        return 1;
    case LWS_CALLBACK_CLOSED:
        kvpd_chat_closed(c);
        return 0;
    case LWS_CALLBACK_RAW_ADOPT:   /* lws turns a CONNECT into a raw tunnel: refuse it */
        lws_callback_on_writable(wsi);
        return 0;
    case LWS_CALLBACK_RAW_WRITEABLE: {
        static const char no[] = "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\n"
                                 "Connection: close\r\nContent-Type: text/plain\r\n"
                                 "Content-Length: 27\r\n\r\nCONNECT is not served here\n";
        unsigned char buf[LWS_PRE + sizeof no];
        memcpy(buf + LWS_PRE, no, sizeof no - 1);
        lws_write(wsi, buf + LWS_PRE, sizeof no - 1, LWS_WRITE_RAW);
        return -1;
    }
    case LWS_CALLBACK_RAW_RX:   /* bytes after the CONNECT: nothing to tunnel to */
        return 0;
    case LWS_CALLBACK_HTTP: {
        kvpd_openai_closed(c);   /* a keep-alive connection's earlier request, if any */
        kvpd_conn_free_frames(c);
        c->wsi = wsi;
        c->w = w;
        int api = 0;   /* the API's requests are admitted by web/http.c, then served */
        int rc = kvpd_http_request(c, in, &api);
        return api ? kvpd_openai_request(c, in) : rc;
    }
    case LWS_CALLBACK_HTTP_BODY:   /* only the API reads bodies; others were answered 405 */
        return c->oai ? kvpd_openai_body(c, in, len) : 0;
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        return c->oai ? kvpd_openai_body_done(c) : 0;
    case LWS_CALLBACK_HTTP_WRITEABLE:
        return c->oai ? kvpd_openai_writeable(c) : kvpd_http_writeable(c);
    case LWS_CALLBACK_CLOSED_HTTP:
        if (c && !c->is_ws) {
            kvpd_openai_closed(c);
            kvpd_conn_free_frames(c);
        }
        break;
    default:
        break;
    }
    return lws_callback_http_dummy(wsi, reason, user, in, len);
}

static const struct lws_protocols protocols[] = {
    {"kvpd", callback, sizeof(kvpd_conn), 0, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0}
};

static void lws_log(int level, const char *line)
{
    /* lws lines end in '\n' already. */
    fprintf(stderr, "kvpd: lws %s: %s", level == LLL_ERR ? "error" : "warning", line);
}

/* NULL (all addresses) for the wildcard spellings. */
static const char *info_host(const char *host)
{
    return (!strcmp(host, "0.0.0.0") || !strcmp(host, "*")) ? NULL : host;
}

int kvpd_web_start(kvpd_web *w, char *err, size_t errlen)
{
    lws_set_log_level(LLL_ERR | LLL_WARN, lws_log);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    void *loops[1] = {w->loop};
    const char *host = w->cfg->listen_host;
    if (!strcmp(host, "localhost"))
        host = "127.0.0.1";
    int rc = kvpd_admin_token_init(w, err, errlen);
    if (rc < 0)
        return rc;
    /* The socket is bound before lws exists, so a busy address needs no lws teardown. */
    rc = kvpd_listen_start(w, info_host(host), err, errlen);
    if (rc < 0)
        return rc;
    if (!info_host(host) && !w->cfg->allowed_hosts[0])
        kvpd_log("warning", "listening on every address, but allowed_hosts is empty: only "
                 "requests naming localhost, 127.0.0.1 or ::1 in Host are served");
    info.port = CONTEXT_PORT_NO_LISTEN_SERVER;   /* web/listen.c accepts, lws adopts */
    info.protocols = protocols;
    info.foreign_loops = loops;
    info.pcontext = &w->lws;
    info.user = w;
    info.vhost_name = "default";
    info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_UV_NO_SIGSEGV_SIGFPE_SPIN;
    if (!strchr(host, ':'))
        info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
    w->lws = lws_create_context(&info);
    if (!w->lws || !lws_get_vhost_by_name(w->lws, "default")) {
        snprintf(err, errlen, "could not start libwebsockets on %s:%d", w->cfg->listen_host,
                 w->port);
        return -ENOMEM;
    }
    return 0;
}

void kvpd_web_stop(kvpd_web *w)
{
    kvpd_listen_stop(w);
    if (w->lws)
        lws_context_destroy(w->lws);
}
