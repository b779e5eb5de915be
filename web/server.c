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

#include "daemon/residency.h"
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

void kvpd_conn_send(kvpd_conn *c, char *json)
{
    /* A frame jansson could not build (memory, or text it refused) still gets an answer. */
    static const char fallback[] = "{\"type\":\"error\",\"code\":\"" KVPD_E_INTERNAL
                                   "\",\"message\":\"the server could not build its answer\"}";
    const char *payload = json ? json : fallback;
    if (!json)
        kvpd_log("warning", "could not build a frame; sent an internal error instead");
    if (kvpd_conn_queue(c, payload, strlen(payload)) < 0) {
        /* Not even that fits in memory: close, so the client is not left waiting. */
        kvpd_log("warning", "out of memory for a frame; closing the connection");
        lws_set_timeout(c->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
    }
    free(json);
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

/* A websocket with no frame either way for connection_idle_timeout seconds is closed
 * (lws's timeout, re-armed on every frame). */
static void keep_alive(kvpd_conn *c)
{
    int secs = c->d->cfg.connection_idle_timeout_s;
    lws_set_timeout(c->wsi, secs ? PENDING_TIMEOUT_USER_OK : NO_PENDING_TIMEOUT, secs);
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
    case LWS_CALLBACK_WSI_CREATE:   /* every adopted connection, HTTP or websocket */
        d->connections_open++;
        return 0;
    case LWS_CALLBACK_WSI_DESTROY:
        d->connections_open--;
        return 0;
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: {   /* non-zero refuses the upgrade */
        const char *why = uri_is(wsi, "/chat") ? kvpd_guard_upgrade(d, wsi) : "not /chat";
        if (why)
            kvpd_log("info", "websocket upgrade refused: %s", why);
        return why != NULL;
    }
    case LWS_CALLBACK_ESTABLISHED:
        memset(c, 0, sizeof *c);
        c->wsi = wsi;
        c->d = d;
        c->is_ws = 1;
        d->metrics.connections++;
        keep_alive(c);
        return 0;
    case LWS_CALLBACK_RECEIVE:
        keep_alive(c);
        return kvpd_chat_receive(c, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        keep_alive(c);
        return ws_writeable(c);
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

/* NULL (all addresses) for the wildcard spellings. */
static const char *info_host(const char *host)
{
    return (!strcmp(host, "0.0.0.0") || !strcmp(host, "*")) ? NULL : host;
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
    int rc = kvpd_admin_token_init(d, err, errlen);
    if (rc < 0)
        return rc;
    /* The socket is bound before lws exists, so a busy address needs no lws teardown. */
    rc = kvpd_listen_start(d, info_host(host), err, errlen);
    if (rc < 0)
        return rc;
    info.port = CONTEXT_PORT_NO_LISTEN_SERVER;   /* web/listen.c accepts, lws adopts */
    info.protocols = protocols;
    info.foreign_loops = loops;
    info.pcontext = &d->lws;
    info.user = d;
    info.vhost_name = "default";
    info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_UV_NO_SIGSEGV_SIGFPE_SPIN;
    if (!strchr(host, ':'))
        info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
    d->lws = lws_create_context(&info);
    if (!d->lws || !lws_get_vhost_by_name(d->lws, "default")) {
        snprintf(err, errlen, "could not start libwebsockets on %s:%d", d->cfg.listen_host,
                 d->port);
        return -ENOMEM;
    }
    return 0;
}

void kvpd_web_stop(kvpd *d)
{
    kvpd_listen_stop(d);
    if (d->lws)
        lws_context_destroy(d->lws);
}

static const char *error_code(int rc)
{
    return rc == -E2BIG ? KVPD_E_TOO_LARGE : KVPD_E_INTERNAL;
}

/* A job's final event: the loop owns the whole session again and takes in what the
 * worker left (restored counters, the snapshot's fate, the cache's size). */
static void job_ended(kvpd *d, kvp_session *s)
{
    kvpd_metrics *m = &d->metrics;
    s->busy = 0;
    s->loading = 0;
    s->reserve = 0;
    if (s->restored.pending) {
        s->restored.pending = 0;
        s->placeholder = 0;
        m->unparks++;
        if (s->restored.rebuilt) {
            m->rebuilds++;
            kvpd_log("info", "session %.8s: rebuilt from its transcript: %s", s->id,
                     s->restored.note);
        }
    }
    if (s->save_rc < 0) {
        m->snapshot_failures++;
        s->save_failed = 1;
        kvpd_log("warning", "session %.8s: %s", s->id, s->save_err);
    } else if (s->save_rc > 0) {
        m->snapshots_written++;
        s->save_failed = 0;
    }
    s->save_rc = 0;
    s->turns = s->turns_done;
    s->evicted_rows = s->cache.evicted_rows;
    s->rows_max = kvp_cache_max_rows(&s->cache);
    s->bytes = kvp_cache_bytes(&s->cache);
}

/* The session's snapshot was missing or bad when it was needed: it is gone (or, for a
 * hello naming an id with no snapshot, it never was). */
static void lose(kvpd *d, kvp_session *s, int code, const char *why)
{
    kvpd_conn *c = s->conn;
    if (!s->placeholder || code == -EBADMSG) {
        d->metrics.sessions_lost++;
        kvpd_log("warning", "session %.8s lost: %s", s->id, why);
    }
    if (c) {
        kvpd_chat_error(c, KVPD_E_UNKNOWN_SESSION, code == -EBADMSG
                        ? "the session's snapshot was damaged; it was moved aside"
                        : "no such session (expired or never existed)");
        c->session = NULL;
    }
    kvp_session_remove(&d->sessions, s);
}

/* A restore that failed for a reason that may pass (I/O, memory): parked again. */
static void restore_failed(kvpd *d, kvp_session *s, const char *why)
{
    kvpd_log("warning", "session %.8s: %s", s->id, why);
    if (s->conn)
        kvpd_chat_error(s->conn, KVPD_E_INTERNAL, "the session could not be loaded; try again");
    if (s->placeholder) {
        if (s->conn)
            ((kvpd_conn *)s->conn)->session = NULL;
        kvp_session_remove(&d->sessions, s);
    } else {
        kvp_session_park(&d->sessions, s);
    }
}

static void on_job(kvpd *d, kvp_session *s, const kvpd_event *ev)
{
    int was_load = s->job == KVP_JOB_LOAD;
    int failed_restore = was_load && ev->code < 0;
    job_ended(d, s);
    if (failed_restore && s->lost) {
        lose(d, s, ev->code, ev->text);
    } else if (failed_restore) {
        restore_failed(d, s, ev->text);
    } else if (was_load) {
        kvpd_log("info", "session %.8s: loaded from its snapshot (%d turns)", s->id, s->turns);
        if (s->conn)
            kvpd_chat_send_session(s->conn, 1);
    } else {   /* a save job (shutdown): its outcome decides the session's durability */
        s->save_failed = ev->code < 0;
        if (ev->code < 0)
            kvpd_log("warning", "session %.8s: %s", s->id, ev->text);
    }
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
            kvpd_conn_send(c, kvpd_proto_token(ev->text, ev->len));
        return;
    case KVPD_EV_JOB:
        s->last_active = now;
        on_job(d, s, ev);
        return;
    case KVPD_EV_DONE: {
        const kvp_turn_stats *st = &ev->stats;
        if (st->cache_bytes_max > s->reserve) {
            m->reserve_overruns++;
            kvpd_log("error", "session %.8s: its cache reached %zu bytes, over the %zu reserved",
                     s->id, st->cache_bytes_max, s->reserve);
        }
        job_ended(d, s);
        s->last_active = now;
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
            kvpd_conn_send(c, kvpd_proto_done(ev->text, ev->len, st,
                                              d->env.state_dir[0] ? !s->save_failed : -1,
                                              s->save_err));
        return;
    }
    case KVPD_EV_ERROR:
        job_ended(d, s);
        s->last_active = now;
        if (s->need_restore) {   /* the turn could not get the session back from disk */
            if (s->lost) {
                lose(d, s, ev->code, ev->text);
            } else {
                restore_failed(d, s, ev->text);
            }
            return;
        }
        m->turns_failed++;
        kvpd_log("warning", "session %.8s: %s", s->id, ev->text);
        if (c)
            kvpd_chat_error(c, error_code(ev->code), ev->text);
        return;
    }
}

void kvpd_web_expire(kvpd *d, double now)
{
    double timeout = d->cfg.idle_timeout_s;
    kvp_session *s = d->sessions.head;
    while (s) {
        kvp_session *next = s->next;
        double idle = now - s->last_active;
        if (d->env.state_dir[0]) {
            /* With a state directory nothing is dropped: idle sessions are parked (if
             * their snapshot is up to date), and parked ones nobody is attached to are
             * let go from memory after another timeout (hello loads them again). */
            if (!s->parked && idle > timeout && kvp_session_parkable(s)) {
                kvpd_park(d, s);
            } else if (s->parked && !s->conn && idle > 2 * timeout) {
                d->metrics.sessions_forgotten++;
                kvp_session_remove(&d->sessions, s);
            }
        } else if (!s->busy && idle > timeout) {
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

int kvpd_web_unsaved(const kvpd *d)
{
    int n = 0;
    for (const kvp_session *s = d->sessions.head; s; s = s->next)
        n += s->save_failed;
    return n;
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
