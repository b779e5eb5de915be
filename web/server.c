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

#include "web/conn.h"
#include "web/protocol.h"

int kvpd_conn_queue(kvpd_conn *c, const char *payload, size_t len)
{
    kvpd_frame *f = malloc(sizeof *f + LWS_PRE + len);
    if (!f)
        return -ENOMEM;
    f->next = NULL;
    f->len = len;
    memcpy(f->buf + LWS_PRE, payload, len);
    if (c->out_tail)
        c->out_tail->next = f;
    else
        c->out_head = f;
    c->out_tail = f;
    c->d->frames_pending++;
    lws_callback_on_writable(c->wsi);
    return 0;
}

void kvpd_conn_free_frames(kvpd_conn *c)
{
    while (c->out_head) {
        kvpd_frame *f = c->out_head;
        c->out_head = f->next;
        free(f);
        c->d->frames_pending--;
    }
    c->out_tail = NULL;
}

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
    c->d->frames_pending--;
    if (n < 0)
        return -1;
    if (c->out_head)
        lws_callback_on_writable(c->wsi);
    return 0;
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
    kvpd *d = lws_context_user(lws_get_context(wsi));

    switch (reason) {
    case LWS_CALLBACK_FILTER_NETWORK_CONNECTION:
        return d->draining;   /* non-zero refuses the connection */
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
        return !uri_is(wsi, "/chat");
    case LWS_CALLBACK_ESTABLISHED:
        memset(c, 0, sizeof *c);
        c->wsi = wsi;
        c->d = d;
        c->is_ws = 1;
        d->metrics.connections++;
        return 0;
    case LWS_CALLBACK_RECEIVE:
        return kvpd_chat_receive(c, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return ws_writeable(c);
    case LWS_CALLBACK_CLOSED:
        kvpd_chat_closed(c);
        return 0;
    case LWS_CALLBACK_HTTP:
        kvpd_conn_free_frames(c);
        c->wsi = wsi;
        c->d = d;
        return kvpd_http_request(c, in);
    case LWS_CALLBACK_HTTP_WRITEABLE:
        return kvpd_http_writeable(c);
    case LWS_CALLBACK_CLOSED_HTTP:
        if (c && !c->is_ws)
            kvpd_conn_free_frames(c);
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

/* lws 4.1 cannot tear down a foreign-loop context whose listening vhost failed (its
 * evlib plugin crashes), so a busy or foreign address is found before lws tries. */
/* NULL (all addresses) for the wildcard spellings. */
static const char *info_host(const char *host)
{
    return (!strcmp(host, "0.0.0.0") || !strcmp(host, "*")) ? NULL : host;
}

static int probe_bind(const char *host, int port, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICHOST,
                             .ai_socktype = SOCK_STREAM}, *ai;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &ai);
    if (rc) {
        snprintf(err, errlen, "listen: '%s' is not an IP address: %s", host, gai_strerror(rc));
        return -EINVAL;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol), one = 1;
    rc = fd < 0 ? -errno : 0;
    if (!rc && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
        rc = -errno;
    if (!rc && bind(fd, ai->ai_addr, ai->ai_addrlen) < 0)
        rc = -errno;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    if (rc)
        snprintf(err, errlen, "could not listen on %s:%d: %s", host, port, strerror(-rc));
    return rc;
}

int kvpd_web_start(kvpd *d, char *err, size_t errlen)
{
    lws_set_log_level(LLL_ERR | LLL_WARN, lws_log);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    void *loops[1] = {&d->loop};
    const char *host = d->cfg.listen_host;
    if (!strcmp(host, "localhost"))
        host = "127.0.0.1";
    int rc = probe_bind(info_host(host), d->cfg.listen_port, err, errlen);
    if (rc < 0)
        return rc;
    info.port = d->cfg.listen_port;
    info.iface = info_host(host);
    info.protocols = protocols;
    info.foreign_loops = loops;
    info.pcontext = &d->lws;
    info.user = d;
    info.vhost_name = "default";
    info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_UV_NO_SIGSEGV_SIGFPE_SPIN |
                   LWS_SERVER_OPTION_FAIL_UPON_UNABLE_TO_BIND;
    if (!strchr(host, ':'))
        info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
    d->lws = lws_create_context(&info);
    if (!d->lws) {
        snprintf(err, errlen, "could not listen on %s:%d", d->cfg.listen_host,
                 d->cfg.listen_port);
        return -EADDRNOTAVAIL;
    }
    /* lws 4.1 returns a context even when the listening vhost failed to bind. */
    struct lws_vhost *vh = lws_get_vhost_by_name(d->lws, "default");
    d->port = vh ? lws_get_vhost_listen_port(vh) : 0;
    if (d->port <= 0) {
        snprintf(err, errlen, "could not listen on %s:%d", d->cfg.listen_host,
                 d->cfg.listen_port);
        return -EADDRNOTAVAIL;
    }
    return 0;
}

void kvpd_web_stop(kvpd *d)
{
    if (d->lws)
        lws_context_destroy(d->lws);
}

static void send_frame(kvpd_conn *c, char *json)
{
    if (!json || kvpd_conn_queue(c, json, strlen(json)) < 0)
        kvpd_log("warning", "dropped a frame for lack of memory");
    free(json);
}

static const char *error_code(int rc)
{
    return rc == -E2BIG ? KVPD_E_TOO_LARGE : KVPD_E_INTERNAL;
}

void kvpd_web_on_event(void *ctx, const kvpd_event *ev)
{
    kvpd *d = ctx;
    kvp_session *s = ev->session;
    kvpd_conn *c = s->conn;
    kvpd_metrics *m = &d->metrics;
    double now = kvp_now();
    switch (ev->type) {
    case KVPD_EV_TOKEN:
        if (c)
            send_frame(c, kvpd_proto_token(ev->text, ev->len));
        return;
    case KVPD_EV_DONE: {
        const kvp_turn_stats *st = &ev->stats;
        s->busy = 0;
        s->turns++;
        s->last_active = now;
        s->rows_max = st->cache_rows;
        s->bytes = st->cache_bytes;
        s->evicted_rows = st->evicted_total;
        m->turns++;
        if (!strcmp(st->stop, "cancel"))
            m->turns_cancelled++;
        m->prompt_tokens += (uint64_t)st->prompt_tokens;
        m->prefilled_tokens += (uint64_t)st->prefilled_tokens;
        m->generated_tokens += (uint64_t)st->generated_tokens;
        m->evicted_rows += st->evicted_rows;
        kvpd_hist_observe(&m->ttft, st->ttft_ms / 1e3);
        kvpd_hist_observe(&m->turn_duration, st->duration_ms / 1e3);
        if (c)
            send_frame(c, kvpd_proto_done(ev->text, ev->len, st));
        return;
    }
    case KVPD_EV_ERROR:
        s->busy = 0;
        s->last_active = now;
        m->turns_failed++;
        kvpd_log("warning", "session %.8s: %s", s->id, ev->text);
        if (c)
            kvpd_chat_error(c, error_code(ev->code), ev->text);
        return;
    }
}

void kvpd_web_expire(kvpd *d, double now)
{
    kvp_session *s = d->sessions.head;
    while (s) {
        kvp_session *next = s->next;
        if (!s->busy && now - s->last_active > d->cfg.idle_timeout_s) {
            kvpd_conn *c = s->conn;
            if (c) {
                kvpd_chat_error(c, KVPD_E_UNKNOWN_SESSION, "session expired after the idle timeout");
                c->session = NULL;
            }
            d->metrics.sessions_expired++;
            kvp_session_remove(&d->sessions, s);
        }
        s = next;
    }
}

int kvpd_web_cancel_all(kvpd *d)
{
    int running = 0;
    for (kvp_session *s = d->sessions.head; s; s = s->next)
        if (s->busy) {
            atomic_store(&s->turn.cancel, 1);
            running++;
        }
    return running;
}
