/* HTTP endpoints: the chat page (web/static), /healthz, /metrics, /admin/stats. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/residency.h"
#include "sessions/template.h"
#include "web/conn.h"
#include "web/server.h"

/* Headers now, the body (queued as one frame) on the writeable callback. */
static int respond(kvpd_conn *c, int status, const char *type, const char *body, size_t len,
                   const char *www_auth)
{
    unsigned char hdr[LWS_PRE + 1024], *start = hdr + LWS_PRE, *p = start,
                  *end = hdr + sizeof hdr - 1;
    c->d->metrics.http_requests++;
    if (lws_add_http_common_headers(c->wsi, (unsigned)status, type, len, &p, end))
        return 1;
    if (www_auth && lws_add_http_header_by_token(c->wsi, WSI_TOKEN_HTTP_WWW_AUTHENTICATE,
                                                 (const unsigned char *)www_auth,
                                                 (int)strlen(www_auth), &p, end))
        return 1;
    if (lws_add_http_header_by_name(c->wsi, (const unsigned char *)"cache-control:",
                                    (const unsigned char *)"no-store", 8, &p, end))
        return 1;
    if (lws_finalize_write_http_header(c->wsi, start, &p, end))
        return 1;
    if (c->head)   /* the headers (with the body's length) are the whole answer */
        return lws_http_transaction_completed(c->wsi) ? -1 : 0;
    if (kvpd_conn_queue(c, body, len) < 0)
        return 1;
    return 0;
}

static int respond_json(kvpd_conn *c, int status, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return respond(c, 500, "text/plain", "out of memory\n", 14, NULL);
    int rc = respond(c, status, "application/json", s, strlen(s), NULL);
    free(s);
    return rc;
}

int kvpd_http_writeable(kvpd_conn *c)
{
    kvpd_frame *f = c->out_head;
    if (!f)
        return 0;
    c->out_head = c->out_tail = NULL;
    int n = lws_write(c->wsi, f->buf + LWS_PRE, f->len, LWS_WRITE_HTTP_FINAL);
    free(f);
    c->d->frames_pending--;
    if (n < 0)
        return -1;
    return lws_http_transaction_completed(c->wsi) ? -1 : 0;
}

/* Constant-time compare, so the token cannot be guessed byte by byte from timings. */
static int token_ok(kvpd_conn *c)
{
    const char *want = kvpd_admin_token(c->d);
    if (!want[0])
        return 0;   /* closed: no token configured and nowhere to write one */
    char got[256];
    int n = lws_hdr_copy(c->wsi, got, sizeof got, WSI_TOKEN_HTTP_AUTHORIZATION);
    if (n <= 7 || strncmp(got, "Bearer ", 7))
        return 0;
    const char *tok = got + 7;
    size_t wl = strlen(want), tl = strlen(tok);
    unsigned diff = (unsigned)(wl ^ tl);
    for (size_t i = 0; i < wl; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < tl ? tok[i] : 0);
    return diff == 0;
}

static void gauges(kvpd *d, kvpd_gauges *g)
{
    memset(g, 0, sizeof *g);
    for (kvp_session *s = d->sessions.head; s; s = s->next) {
        g->sessions_active += !s->parked;
        g->sessions_parked += s->parked;
        g->turns_running += s->busy;
        if (s->bytes > g->cache_bytes_max_session)
            g->cache_bytes_max_session = s->bytes;
    }
    g->cache_bytes_accounted = kvpd_accounted_bytes(d, &g->cache_bytes_total);
    g->cache_bytes_cap = d->cfg.max_cache_bytes;
    g->turn_reserve_bytes = d->ready ? kvpd_turn_bytes(d) : 0;
    g->queue_depth = d->sched ? kvpd_sched_depth(d->sched) : 0;
    g->connections_open = d->connections_open;
    g->uptime_s = kvp_now() - d->started;
    g->ready = d->ready;
}

static int admin_stats(kvpd_conn *c)
{
    kvpd *d = c->d;
    kvpd_gauges g;
    gauges(d, &g);
    double now = kvp_now();
    json_t *list = json_array();
    for (kvp_session *s = d->sessions.head; s && list; s = s->next)
        json_array_append_new(list, json_pack(
            "{s:s, s:i, s:i, s:I, s:I, s:b, s:b, s:b, s:s, s:f, s:f}", "id", s->id,
            "turns", s->turns, "rows", s->rows_max, "bytes", (json_int_t)s->bytes,
            "evicted_rows", (json_int_t)s->evicted_rows, "busy", s->busy,
            "parked", s->parked, "connected", s->conn != NULL, "policy", s->pconf->name,
            "last_active_s_ago", now - s->last_active, "age_s", now - s->created));
    const kvpd_metrics *m = &d->metrics;
    json_t *memory = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "cap", (json_int_t)g.cache_bytes_cap,
        "resident_bytes", (json_int_t)g.cache_bytes_total,
        "accounted_bytes", (json_int_t)g.cache_bytes_accounted,
        "turn_reserve_bytes", (json_int_t)g.turn_reserve_bytes,
        "parks", (json_int_t)m->parks, "unparks", (json_int_t)m->unparks,
        "reserve_overruns", (json_int_t)m->reserve_overruns);
    json_t *persist = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "state_dir", d->cfg.state_dir,
        "snapshots_written", (json_int_t)m->snapshots_written,
        "snapshot_failures", (json_int_t)m->snapshot_failures,
        "rebuilds", (json_int_t)m->rebuilds, "lost", (json_int_t)m->sessions_lost,
        "reloads", (json_int_t)m->reloads, "reloads_refused", (json_int_t)m->reloads_refused);
    json_t *o = json_pack(
        "{s:f, s:b, s:{s:s, s:s, s:i, s:i, s:i, s:i}, s:s, s:s, s:i, s:i, s:i,"
        " s:{s:i, s:i, s:i, s:I, s:i}, s:{s:I, s:I}, s:o, s:o,"
        " s:{s:I, s:I, s:I}, s:I, s:I, s:i, s:o}",
        "uptime_s", g.uptime_s, "ready", d->ready,
        "model", "name", d->ready ? d->model.name : "", "chat_format",
        kvp_template_name(d->env.tpl.format), "layers", d->model.cfg.n_layers,
        "kv_heads", d->model.cfg.n_kv_heads, "head_dim", d->model.cfg.head_dim,
        "context", d->model.cfg.seq_len,
        "policy", d->pconf ? d->pconf->name : "", "policy_file", d->pconf ? d->pconf->file : "",
        "budget", d->cfg.budget, "chunk", d->cfg.chunk, "workers", d->cfg.workers,
        "sessions", "active", g.sessions_active, "resident", g.sessions_active,
        "parked", g.sessions_parked, "total", (json_int_t)d->sessions.created_total,
        "max", d->cfg.max_sessions,
        "cache_bytes", "total", (json_int_t)g.cache_bytes_total, "max_per_session",
        (json_int_t)g.cache_bytes_max_session, "memory", memory, "persistence", persist,
        "tokens", "in", (json_int_t)m->prompt_tokens, "prefilled",
        (json_int_t)m->prefilled_tokens, "out", (json_int_t)m->generated_tokens,
        "evicted_rows", (json_int_t)m->evicted_rows, "turns", (json_int_t)m->turns,
        "queue_depth", g.queue_depth, "session_list", list);
    if (o && json_object_set_new(o, "connections", json_pack(
                 "{s:i, s:i, s:I}", "open", g.connections_open, "max", d->cfg.max_connections,
                 "refused", (json_int_t)m->connections_refused)) < 0) {
        json_decref(o);
        o = NULL;
    }
    return respond_json(c, 200, o);
}

static int metrics(kvpd_conn *c)
{
    kvpd_gauges g;
    gauges(c->d, &g);
    size_t len = 0;
    char *text = kvpd_metrics_render(&c->d->metrics, &g, &len);
    if (!text)
        return respond(c, 500, "text/plain", "out of memory\n", 14, NULL);
    int rc = respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
    free(text);
    return rc;
}

/* Only plain file names from static_dir: no directories, no dot files.
 * Returns 0 when lws streams the file, 1 when there is no such file, -1 on failure. */
static int static_file(kvpd_conn *c, const char *uri)
{
    const char *name = !strcmp(uri, "/") ? "index.html" : uri + 1;
    const char *dot = strrchr(name, '.');
    size_t n = strlen(name);
    if (n == 0 || n > 64 || name[0] == '.' || !dot || strchr(name, '/'))
        return 1;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '_'))
            return 1;
    static const struct { const char *ext, *mime; } types[] = {
        {".html", "text/html; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
        {".js", "application/javascript; charset=utf-8"}, {".svg", "image/svg+xml"},
        {".ico", "image/x-icon"}};
    const char *mime = NULL;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(dot, types[i].ext))
            mime = types[i].mime;
    char path[KVPD_PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", c->d->cfg.static_dir, name);
    struct stat st;
    if (!mime || stat(path, &st) < 0 || !S_ISREG(st.st_mode))
        return 1;
    c->d->metrics.http_requests++;
    int rc = lws_serve_http_file(c->wsi, path, mime, NULL, 0);
    return rc < 0 ? -1 : 0;
}

static int text_status(kvpd_conn *c, int status, const char *msg, const char *www_auth)
{
    return respond(c, status, "text/plain; charset=utf-8", msg, strlen(msg), www_auth);
}

int kvpd_http_request(kvpd_conn *c, const char *uri)
{
    kvpd *d = c->d;
    int status;
    const char *refused = kvpd_guard_check(d, c->wsi, &status);
    if (refused)
        return text_status(c, status, refused, NULL);
    c->head = lws_hdr_total_length(c->wsi, WSI_TOKEN_HEAD_URI) > 0;
    if (!c->head && lws_hdr_total_length(c->wsi, WSI_TOKEN_GET_URI) <= 0)
        return text_status(c, 405, "only GET and HEAD are served\n", NULL);
    if (!strcmp(uri, "/healthz")) {
        int ok = d->ready && !d->draining, unsaved = kvpd_web_unsaved(d);
        if (ok && unsaved)
            return respond_json(c, 503, json_pack("{s:s, s:i}", "status", "degraded",
                                                  "unsaved_sessions", unsaved));
        return respond_json(c, ok ? 200 : 503,
                            json_pack("{s:s}", "status", ok ? "ok" : d->draining ? "stopping" : "loading"));
    }
    if (!strcmp(uri, "/metrics"))
        return metrics(c);
    if (!strncmp(uri, "/admin/", 7)) {
        if (!token_ok(c))
            return text_status(c, 401, "admin token required\n", "Bearer realm=\"kvpd\"");
        if (!strcmp(uri, "/admin/stats"))
            return admin_stats(c);
        return text_status(c, 404, "not found\n", NULL);
    }
    if (!strcmp(uri, "/chat"))
        return text_status(c, 426, "/chat is a websocket endpoint\n", NULL);
    int rc = static_file(c, uri);
    if (rc <= 0)
        return rc;
    return text_status(c, 404, "not found\n", NULL);
}
