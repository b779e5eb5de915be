/* The /chat websocket: message assembly from fragments, limits, and the protocol's
 * hello / message / cancel on the loop thread. Model work goes to the scheduler. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/residency.h"
#include "web/conn.h"
#include "web/protocol.h"

void kvpd_chat_error(kvpd_conn *c, const char *code, const char *msg)
{
    c->d->metrics.errors[kvpd_err_kind_of(code)]++;
    kvpd_conn_send(c, kvpd_proto_error(code, msg));
}

/* overloaded, with a hint of when to try again. */
static void overloaded(kvpd_conn *c, const char *msg)
{
    c->d->metrics.errors[KVPD_ERR_OVERLOADED]++;
    kvpd_conn_send(c, kvpd_proto_error_retry(KVPD_E_OVERLOADED, msg, kvpd_retry_hint_ms(c->d)));
}

void kvpd_chat_send_session(kvpd_conn *c, int resumed)
{
    kvp_session *s = c->session;
    /* The transcript belongs to the worker while a turn runs: no history then. */
    int n = s->busy ? 0 : s->n_msgs;
    kvpd_conn_send(c, kvpd_proto_session(s->id, resumed, s->turns, s->msgs, n));
}

/* A session follows the newest connection that names it. */
static void attach(kvpd_conn *c, kvp_session *s)
{
    if (c->session && c->session->conn == c)
        c->session->conn = NULL;
    kvpd_conn *old = s->conn;
    if (old && old != c)
        old->session = NULL;
    s->conn = c;
    c->session = s;
}

static int new_session(kvpd_conn *c)
{
    kvpd *d = c->d;
    char err[256];
    kvp_session *s;
    size_t reserve;
    int rc = kvpd_admit(d, NULL, 0, &reserve, err, sizeof err);
    if (rc < 0) {
        overloaded(c, err);
        return rc;
    }
    rc = kvp_session_create(&d->sessions, &d->env, d->pconf, NULL, kvp_now(), &s, err, sizeof err);
    if (rc < 0) {
        kvpd_log("error", "session: %s", err);
        kvpd_chat_error(c, KVPD_E_INTERNAL, err);
        return rc;
    }
    d->metrics.sessions_created++;
    attach(c, s);
    kvpd_chat_send_session(c, 0);
    return 0;
}

/* A parked session comes back under the policy in force (rebuilt from its transcript if
 * its snapshot was made under another). */
static int unpark(kvpd *d, kvp_session *s)
{
    if (s->pconf != d->pconf) {
        kvp_policy_conf_unref(s->pconf);
        s->pconf = kvp_policy_conf_ref(d->pconf);
    }
    return kvp_session_unpark(&d->sessions, s, &d->env);
}

static void submit(kvpd *d, kvp_session *s, size_t reserve)
{
    s->reserve = reserve;
    s->busy = 1;
    kvpd_sched_submit(d->sched, s);
}

/* hello naming a session whose state is on disk: parked here, or from before a restart
 * (s NULL). The snapshot is read on a worker; the session frame follows the job. */
static void hello_load(kvpd_conn *c, kvp_session *s, const char *id)
{
    kvpd *d = c->d;
    char err[256];
    size_t reserve;
    if (kvpd_admit(d, s, 1, &reserve, err, sizeof err) < 0) {
        overloaded(c, err);
        return;
    }
    if (!s) {
        if (kvp_session_create(&d->sessions, &d->env, d->pconf, id, kvp_now(), &s, err,
                               sizeof err) < 0) {
            kvpd_log("error", "session: %s", err);
            kvpd_chat_error(c, KVPD_E_INTERNAL, err);
            return;
        }
        s->placeholder = 1;
        s->need_restore = 1;
    } else if (unpark(d, s) < 0) {
        kvpd_chat_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    attach(c, s);
    s->last_active = kvp_now();
    if (!s->need_restore) {   /* parked with nothing to keep: nothing to read */
        kvpd_chat_send_session(c, 1);
        return;
    }
    kvp_session_begin_job(s, KVP_JOB_LOAD);
    s->loading = 1;
    submit(d, s, reserve);
}

static void hello(kvpd_conn *c, const kvpd_client_msg *m)
{
    if (c->session && c->session->busy) {
        kvpd_chat_error(c, KVPD_E_BUSY, c->session->loading
                        ? "this connection's session is being loaded from disk; its session frame follows"
                        : "a turn is running on this connection's session");
        return;
    }
    if (!m->session[0]) {
        new_session(c);
        return;
    }
    kvp_session *s = kvp_session_find(&c->d->sessions, m->session);
    if (s && s->loading) {   /* its session frame comes when the load ends */
        attach(c, s);
        return;
    }
    if ((s && s->parked) || (!s && c->d->env.state_dir[0])) {
        hello_load(c, s, m->session);
        return;
    }
    if (!s) {
        kvpd_chat_error(c, KVPD_E_UNKNOWN_SESSION, "no such session (expired or never existed)");
        return;
    }
    s->last_active = kvp_now();
    attach(c, s);
    kvpd_chat_send_session(c, 1);
}

static void message(kvpd_conn *c, kvpd_client_msg *m)
{
    kvpd *d = c->d;
    if (!c->session && new_session(c) < 0)
        return;
    kvp_session *s = c->session;
    if (s->busy) {
        kvpd_chat_error(c, KVPD_E_BUSY, "a turn is already running; wait for done or cancel it");
        return;
    }
    char err[256];
    size_t reserve;
    if (kvpd_admit(d, s, 1, &reserve, err, sizeof err) < 0) {
        overloaded(c, err);
        return;
    }
    /* Parked: it comes back transparently, its snapshot read by the turn's worker. */
    if (s->parked && unpark(d, s) < 0) {
        kvpd_chat_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    int max_tokens = m->max_tokens ? m->max_tokens : d->cfg.max_tokens;
    float temp = m->has_temperature ? m->temperature : d->cfg.temperature;
    double now = kvp_now();
    if (kvp_session_begin_turn(s, m->text, m->text_len, max_tokens, temp, d->cfg.budget,
                               now) < 0) {
        kvpd_chat_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    s->last_active = now;
    submit(d, s, reserve);
}

static void handle(kvpd_conn *c, const char *buf, size_t len)
{
    kvpd *d = c->d;
    kvpd_client_msg m;
    const char *code;
    char msg[256];
    if (kvpd_proto_parse(buf, len, d->cfg.max_tokens, &m, &code, msg, sizeof msg) < 0) {
        kvpd_chat_error(c, code, msg);
        return;
    }
    if (m.type == KVPD_MSG_CANCEL) {
        /* Answered by the turn's done frame (stop "cancel"); a no-op when idle. */
        if (c->session && c->session->busy)
            atomic_store(&c->session->turn.cancel, 1);
    } else if (d->draining || !d->ready) {
        kvpd_chat_error(c, KVPD_E_OVERLOADED,
                        d->draining ? "the daemon is shutting down" : "the model is loading");
    } else if (m.type == KVPD_MSG_HELLO) {
        hello(c, &m);
    } else {
        message(c, &m);
    }
    kvpd_proto_msg_free(&m);
}

int kvpd_chat_receive(kvpd_conn *c, const void *in, size_t len)
{
    struct lws *wsi = c->wsi;
    size_t max = (size_t)c->d->cfg.max_message_bytes;
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
            memcpy(c->rx + c->rx_len, in, len);
            c->rx_len += len;
        }
    }
    if (!lws_is_final_fragment(wsi) || lws_remaining_packet_payload(wsi))
        return 0;
    char msg[96];
    switch (c->rx_skip) {
    case KVPD_RX_BINARY:
        kvpd_chat_error(c, KVPD_E_BAD_REQUEST, "binary frames are not part of the protocol");
        break;
    case KVPD_RX_TOO_LARGE:
        snprintf(msg, sizeof msg, "messages are limited to %zu bytes", max);
        kvpd_chat_error(c, KVPD_E_TOO_LARGE, msg);
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
    kvp_session *s = c->session;
    if (s && s->conn == c) {
        s->conn = NULL;
        /* Nobody is listening: stop generating; the partial reply stays. */
        if (s->busy)
            atomic_store(&s->turn.cancel, 1);
        s->last_active = kvp_now();
    }
    c->session = NULL;
    kvpd_conn_free_frames(c);
    free(c->rx);
    c->rx = NULL;
}
