/* HTTP endpoints: the chat page (web/static), /healthz, /metrics, /admin/stats,
 * DELETE /admin/learn/transcripts/TENANT, and the HTTP answer every endpoint writes
 * (web/http.h). A request under /v1 is checked here and handed back to the caller for
 * web/openai.c. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/parse.h"
#include "web/conn.h"
#include "web/http.h"
#include "web/oai_parse.h"

int kvpd_http_headers(kvpd_conn *c, int status, const char *type, uint64_t len,
                      const char *const *extra)
{
    unsigned char hdr[LWS_PRE + 1024], *start = hdr + LWS_PRE, *p = start,
                  *end = hdr + sizeof hdr - 1;
    c->w->metrics->http_requests++;
    kvpd_labelled_add(&c->w->metrics->http_by_path, c->path_label ? c->path_label : "other",
                      status);
    if (lws_add_http_common_headers(c->wsi, (unsigned)status, type,
                                    len == KVPD_HTTP_NO_LENGTH ? LWS_ILLEGAL_HTTP_CONTENT_LEN : len,
                                    &p, end))
        return 1;
    for (; extra && extra[0]; extra += 2)
        if (lws_add_http_header_by_name(c->wsi, (const unsigned char *)extra[0],
                                        (const unsigned char *)extra[1], (int)strlen(extra[1]),
                                        &p, end))
            return 1;
    if (lws_add_http_header_by_name(c->wsi, (const unsigned char *)"cache-control:",
                                    (const unsigned char *)"no-store", 8, &p, end))
        return 1;
    return lws_finalize_write_http_header(c->wsi, start, &p, end) ? 1 : 0;
}

int kvpd_http_respond(kvpd_conn *c, int status, const char *type, const char *body,
                      size_t len, const char *const *extra)
{
    if (kvpd_http_headers(c, status, type, len, extra))
        return 1;
    if (c->head)   /* the headers (with the body's length) are the whole answer */
        return lws_http_transaction_completed(c->wsi) ? -1 : 0;
    if (kvpd_conn_queue(c, body, len) < 0)
        return 1;
    return 0;
}

/* The answer's extra headers end with the CORS grant of an allowed origin (as the API's
 * answers carry it) and `Connection: close` when it closes the connection: asked before
 * (c->close_after), or a request pipelined behind this one, which the client then sends
 * again on another connection (web/wsguard.c). extra has room for END_HEADERS more. */
#define END_HEADERS (2 * KVPD_CORS_HEADERS + 3)
static void end_headers(kvpd_conn *c, const char **extra, int k)
{
    k += kvpd_cors_headers(c->cors[0] ? c->cors : NULL, extra + k);
    if (kvpd_wsguard_pipelined(lws_get_socket_fd(c->wsi)))
        c->close_after = 1;
    if (c->close_after) {
        extra[k++] = "connection:";
        extra[k++] = "close";
    }
    extra[k] = NULL;
}

static int respond(kvpd_conn *c, int status, const char *type, const char *body, size_t len,
                   const char *www_auth)
{
    const char *extra[2 + END_HEADERS];
    int k = 0;
    if (www_auth) {
        extra[k++] = "www-authenticate:";
        extra[k++] = www_auth;
    }
    end_headers(c, extra, k);
    return kvpd_http_respond(c, status, type, body, len, extra);
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

/* Every error of these endpoints: JSON in the API's error shape (docs/openai.md), with
 * an Allow header (a 405's) and a WWW-Authenticate header when given (NULL: none). */
static int http_error(kvpd_conn *c, int status, const char *code, const char *msg,
                      const char *allow, const char *www_auth)
{
    char *s = NULL;
    size_t len = strlen(msg);
    while (len && msg[len - 1] == '\n')
        len--;
    json_t *j = json_pack("{s:{s:s%, s:s, s:n, s:s}}", "error", "message", msg, len, "type",
                          status == 404 ? "not_found_error" : status == 401
                          ? "authentication_error" : status == 503 ? "service_unavailable"
                          : status >= 500 ? "server_error" : "invalid_request_error",
                          "param", "code", code);
    if (j)
        s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s)
        return respond(c, 500, "text/plain", "out of memory\n", 14, NULL);
    const char *extra[4 + END_HEADERS];
    int k = 0;
    if (allow) {
        extra[k++] = "allow:";
        extra[k++] = allow;
    }
    if (www_auth) {
        extra[k++] = "www-authenticate:";
        extra[k++] = www_auth;
    }
    end_headers(c, extra, k);
    int rc = kvpd_http_respond(c, status, "application/json", s, strlen(s), extra);
    free(s);
    return rc;
}

/* An error whose code is its status's. */
static int status_error(kvpd_conn *c, int status, const char *msg, const char *www_auth)
{
    const char *code = status == 400 ? "invalid_request" : status == 401 ? "invalid_admin_token"
                     : status == 403 ? "origin_not_allowed" : status == 411 ? "length_required"
                     : status == 413 ? "request_too_large" : status == 417 ? "expectation_failed"
                     : status == 421 ? "misdirected_request" : status == 426 ? "upgrade_required"
                     : status == 503 ? "too_many_connections" : "server_error";
    return http_error(c, status, code, msg, NULL, www_auth);
}

/* An unknown path. */
static int not_found(kvpd_conn *c)
{
    return http_error(c, 404, "unknown_url", "no such path", NULL, NULL);
}

int kvpd_http_writeable(kvpd_conn *c)
{
    kvpd_frame *f = c->out_head;
    int fd = lws_get_socket_fd(c->wsi);
    if (!f)   /* the answer is out: it closes once the body it refused is read */
        return c->drain_close && !kvpd_wsguard_draining(fd) ? -1 : 0;
    c->out_head = c->out_tail = NULL;
    int n = lws_write(c->wsi, f->buf + LWS_PRE, f->len, LWS_WRITE_HTTP_FINAL);
    free(f);
    c->w->frames_pending--;
    if (n >= 0 && c->close_after && kvpd_wsguard_draining(fd)) {
        c->drain_close = 1;   /* the guard asks for this callback again when it is read */
        lws_set_timeout(c->wsi, PENDING_TIMEOUT_HTTP_CONTENT, KVPD_DRAIN_S);
        return 0;
    }
    if (n < 0 || c->close_after)
        return -1;
    return lws_http_transaction_completed(c->wsi) ? -1 : 0;
}

int kvpd_http_bearer_ok(kvpd_conn *c, const char *want)
{
    return kvpd_bearer_is(c->wsi, want);
}

int kvpd_learn_forget(kvpd_web *w, const char *tenant, struct json_t **answer, const char **code,
                      char *msg, size_t msglen)
{
    *answer = NULL;
    if (!w->hub) {
        *code = "unavailable";
        snprintf(msg, msglen, "the model is loading");
        return 503;
    }
    int deleted = 0;
    char err[256] = "";
    int rc = kvp_hub_learn_forget(w->hub, tenant, &deleted, err, sizeof err);
    const char *name = tenant[0] ? tenant : "default";
    if (rc == -ENOENT && !kvpd_api_tenant_known(w, tenant)) {
        *code = "unknown_tenant";
        snprintf(msg, msglen, "unknown tenant '%s': no API key has this id and no transcripts "
                 "of it are kept", name);
        return 404;
    }
    if (rc == -EOPNOTSUPP) {
        *code = "not_found";
        snprintf(msg, msglen, "%s", err);
        return 404;
    }
    if (rc < 0 && rc != -ENOENT) {
        *code = rc == -EINVAL ? "invalid_tenant" : "server_error";
        snprintf(msg, msglen, "%s", err);
        return rc == -EINVAL ? 400 : 500;
    }
    *answer = json_pack("{s:s, s:s, s:i}", "object", "learn.transcripts.deleted", "tenant", name,
                        "deleted", deleted);
    return 0;
}

/* DELETE /admin/learn/transcripts/TENANT: a tenant's learn_dir transcripts, by the admin.
 * TENANT is a key's id (16 lowercase hex digits, the folder's name) or "default" (the
 * folder of a daemon without keys). */
static int admin_learn(kvpd_conn *c, const char *uri)
{
    static const char base[] = "/admin/learn/transcripts";
    const char *name = uri + sizeof base - 1;
    if (!lws_hdr_total_length(c->wsi, WSI_TOKEN_DELETE_URI))
        return http_error(c, 405, "method_not_allowed", "/admin/learn/transcripts/TENANT takes "
                           "DELETE", "DELETE", NULL);
    if (*name != '/' || !name[1])
        return http_error(c, 400, "invalid_tenant", "name the tenant: DELETE "
                           "/admin/learn/transcripts/TENANT (its 16 hex digit id, or default)", NULL, NULL);
    name++;
    size_t len = strlen(name);
    int ok = !strcmp(name, "default") || len == KVP_TENANT_LEN;
    for (size_t i = 0; ok && strcmp(name, "default") && i < len; i++)
        ok = (name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f');
    char msg[256];
    if (!ok) {
        snprintf(msg, sizeof msg, "'%.64s' is not a tenant id: 16 lowercase hex digits (the "
                 "folder's name in learn_dir), or default", name);
        return http_error(c, 400, "invalid_tenant", msg, NULL, NULL);
    }
    json_t *answer;
    const char *code = "";
    int status = kvpd_learn_forget(c->w, strcmp(name, "default") ? name : "", &answer, &code,
                                   msg, sizeof msg);
    if (status)
        return http_error(c, status, code, msg, NULL, NULL);
    return respond_json(c, 200, answer);
}

/* Closed (no token configured and nowhere to write one) when the token is empty. */
static int token_ok(kvpd_conn *c)
{
    return kvpd_http_bearer_ok(c, kvpd_admin_token(c->w));
}

/* The gauges, and the hub's view of itself (zeros while the model loads). */
static void gauges(kvpd_web *w, kvpd_gauges *g, kvp_hub_info *hi)
{
    memset(g, 0, sizeof *g);
    memset(hi, 0, sizeof *hi);
    if (w->hub) {
        kvp_hub_info_get(w->hub, hi);
        g->sessions_active = hi->sessions_resident;
        g->sessions_parked = hi->sessions_parked;
        g->turns_running = hi->turns_running;
        g->queue_depth = hi->queue_depth;
        g->cache_bytes_total = hi->cache_bytes_total;
        g->cache_bytes_max_session = hi->cache_bytes_max_session;
        g->cache_bytes_accounted = hi->cache_bytes_accounted;
        g->cache_bytes_shared = hi->cache_bytes_shared;
        g->cache_bytes_borrowed = hi->cache_bytes_borrowed;
        g->turn_reserve_bytes = hi->turn_reserve_bytes;
        g->prefix_index_bytes = hi->prefix_index_bytes;
        g->lease_conflicts = hi->lease_conflicts;
        g->lease_takeovers = hi->lease_takeovers;
        g->snapshots_expired = hi->snapshots_expired;
        g->snapshots_over_quota = hi->snapshots_over_quota;
        g->store_errors = hi->store_errors;
        g->leases_renewing = hi->leases_renewing;
    }
    g->cache_bytes_cap = w->cfg->max_cache_bytes;
    g->connections_open = w->connections_open;
    g->uptime_s = kvp_now() - w->started;
    g->ready = w->hub != NULL;
}

static void list_session(void *ctx, const kvp_hub_session_info *si)
{
    json_array_append_new(ctx, json_pack(
        "{s:s, s:i, s:i, s:I, s:I, s:b, s:b, s:b, s:s, s:f, s:f}", "id", si->id,
        "turns", si->turns, "rows", si->rows, "bytes", (json_int_t)si->bytes,
        "evicted_rows", (json_int_t)si->evicted_rows, "busy", si->busy,
        "parked", si->parked, "connected", si->connected, "policy", si->policy,
        "last_active_s_ago", si->last_active_s_ago, "age_s", si->age_s));
}

/* A non-negative integer query argument (name ends in '='), or dflt when absent; -1
 * when it is not a number in [0, max]. */
static long query_long(kvpd_conn *c, const char *name, long dflt, long max)
{
    char buf[64];
    const char *v = lws_get_urlarg_by_name(c->wsi, name, buf, (int)sizeof buf);
    if (!v)
        return dflt;
    long n;
    return kvp_parse_long(v, 0, max, &n) ? n : -1;
}

#define STATS_PAGE_DEFAULT 100
#define STATS_PAGE_MAX 1000

static double hist_mean(const kvpd_hist *h)
{
    return h->count ? h->sum / (double)h->count : 0.0;
}

/* A histogram as {"le": [bounds], "counts": [per bucket, the last past every bound]}. */
static json_t *hist_json(const kvpd_hist *h)
{
    json_t *le = json_array(), *counts = json_array();
    for (int i = 0; le && counts && i < KVPD_HIST_BUCKETS; i++) {
        if (i < KVPD_HIST_BUCKETS - 1)
            json_array_append_new(le, json_real(h->bounds[i]));
        json_array_append_new(counts, json_integer((json_int_t)h->counts[i]));
    }
    return json_pack("{s:o, s:o}", "le", le, "counts", counts);
}

/* The step loop: steps run, their mean batch size, tokens and time, the queue wait. */
static json_t *steps_json(const kvpd_metrics *m, int step_tokens)
{
    return json_pack("{s:i, s:I, s:f, s:f, s:f, s:f, s:o, s:o}", "step_tokens", step_tokens,
                     "steps", (json_int_t)m->step_sessions.count,
                     "sessions_mean", hist_mean(&m->step_sessions),
                     "tokens_mean", hist_mean(&m->step_tokens),
                     "duration_ms_mean", hist_mean(&m->step_duration) * 1e3,
                     "queue_wait_ms_mean", hist_mean(&m->queue_wait) * 1e3,
                     "sessions_per_step", hist_json(&m->step_sessions),
                     "tokens_per_step", hist_json(&m->step_tokens));
}

/* The eviction canary's recent means and counts, whether the policy is a learned one
 * (and how to get one when it is not), and learn_dir. */
static json_t *eviction_json(kvpd_web *w, const kvpd_metrics *m, const kvp_hub_info *hi)
{
    double kl, top1;
    int n = kvpd_canary_recent(m, &kl, &top1);
    const kvpd_canary_metrics *c = &m->canary;
    int learned = hi->policy && !strcmp(hi->policy, "kvp") && hi->policy_file &&
                  hi->policy_file[0];
    char hint[KVPD_PATH_MAX * 2 + 160] = "";
    if (!learned)
        snprintf(hint, sizeof hint, "no learned eviction policy for this model: run kvp learn "
                 "--model %s%s%s, then reload kvpd (SIGHUP)", w->cfg->model,
                 w->cfg->learn_dir[0] ? " --transcripts " : "", w->cfg->learn_dir);
    json_t *canary = json_pack("{s:f, s:i, s:f, s:f, s:I, s:I, s:I, s:I}", "rate",
                               (double)w->cfg->canary_rate, "recent_turns", n,
                               "recent_kl_mean", kl, "recent_top1_agreement", top1,
                               "checked", (json_int_t)c->runs,
                               "skipped_busy", (json_int_t)c->skipped_busy,
                               "failed", (json_int_t)c->failed,
                               "dropped", (json_int_t)c->dropped);
    json_t *learn = json_pack("{s:s, s:I, s:I}", "dir", hi->learn_dir ? hi->learn_dir : "",
                              "transcripts_written", (json_int_t)c->transcripts_written,
                              "failures", (json_int_t)c->transcript_failures);
    return json_pack("{s:b, s:s, s:o, s:o}", "policy_learned", learned, "policy_hint", hint,
                     "canary", canary, "learn", learn);
}

static int admin_stats(kvpd_conn *c)
{
    kvpd_web *w = c->w;
    kvpd_gauges g;
    kvp_hub_info hi;
    gauges(w, &g, &hi);
    /* session_list is paginated: ?offset=N&limit=M, oldest first. */
    long offset = query_long(c, "offset=", 0, 1L << 30);
    long limit = query_long(c, "limit=", STATS_PAGE_DEFAULT, STATS_PAGE_MAX);
    if (offset < 0 || limit < 0)
        return status_error(c, 400, "offset and limit must be integers (limit at most 1000)\n",
                           NULL);
    json_t *list = json_array();
    int total = w->hub && list ? kvp_hub_list(w->hub, (int)offset, (int)limit, list_session,
                                              list) : 0;
    const kvpd_metrics *m = w->metrics;
    /* policy_file_loads: policy files this process has read; the policy in force is read
     * once (and again at each reload), never per session: its weights are shared. */
    json_t *memory = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "cap", (json_int_t)g.cache_bytes_cap,
        "resident_bytes", (json_int_t)g.cache_bytes_total,
        "shared_bytes", (json_int_t)g.cache_bytes_shared,
        "borrowed_bytes", (json_int_t)g.cache_bytes_borrowed,
        "accounted_bytes", (json_int_t)g.cache_bytes_accounted,
        "turn_reserve_bytes", (json_int_t)g.turn_reserve_bytes,
        "parks", (json_int_t)m->parks, "unparks", (json_int_t)m->unparks,
        "reserve_overruns", (json_int_t)m->reserve_overruns,
        "policy_file_loads", (json_int_t)(w->hub ? hi.policy_file_loads : 0));
    json_t *persist = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "state_dir", w->cfg->state_dir,
        "snapshots_written", (json_int_t)m->snapshots_written,
        "snapshot_failures", (json_int_t)m->snapshot_failures,
        "rebuilds", (json_int_t)m->rebuilds, "lost", (json_int_t)m->sessions_lost,
        "reloads", (json_int_t)m->reloads, "reloads_refused", (json_int_t)m->reloads_refused);
    long next = offset + limit < total ? offset + limit : -1;
    json_t *page = json_pack("{s:I, s:I, s:i, s:I}", "offset", (json_int_t)offset,
                             "limit", (json_int_t)limit, "total", total,
                             "next_offset", (json_int_t)next);
    json_t *o = json_pack(
        "{s:f, s:b, s:{s:s, s:s, s:i, s:i, s:i, s:i, s:s, s:I}, s:s, s:s, s:i, s:i, s:i, s:s, s:s,"
        " s:{s:i, s:i, s:i, s:I, s:i}, s:{s:I, s:I}, s:o, s:o,"
        " s:{s:I, s:I, s:I}, s:I, s:I, s:i, s:o, s:o}",
        "uptime_s", g.uptime_s, "ready", g.ready,
        "model", "name", hi.model_name ? hi.model_name : "", "chat_format",
        hi.chat_format ? hi.chat_format : "plain", "layers", hi.layers,
        "kv_heads", hi.kv_heads, "head_dim", hi.head_dim, "context", hi.context,
        "weights", hi.weights, "weight_bytes", (json_int_t)hi.weight_bytes,
        "policy", hi.policy ? hi.policy : "", "policy_file", hi.policy_file ? hi.policy_file : "",
        "budget", w->cfg->budget, "chunk", w->cfg->chunk, "workers", w->cfg->workers,
        "kv_type", hi.kv_type, "budget_mode", hi.budget_mode,
        "sessions", "active", g.sessions_active, "resident", g.sessions_active,
        "parked", g.sessions_parked, "total", (json_int_t)hi.sessions_total,
        "max", w->cfg->max_sessions,
        "cache_bytes", "total", (json_int_t)g.cache_bytes_total, "max_per_session",
        (json_int_t)g.cache_bytes_max_session, "memory", memory, "persistence", persist,
        "tokens", "in", (json_int_t)m->prompt_tokens, "prefilled",
        (json_int_t)m->prefilled_tokens, "out", (json_int_t)m->generated_tokens,
        "evicted_rows", (json_int_t)m->evicted_rows, "turns", (json_int_t)m->turns,
        "queue_depth", g.queue_depth, "session_list", list, "session_page", page);
    if (o && (json_object_set_new(o, "connections", json_pack(
                  "{s:i, s:i, s:I}", "open", g.connections_open, "max", w->cfg->max_connections,
                  "refused", (json_int_t)m->connections_refused)) < 0 ||
              json_object_set_new(o, "batching", steps_json(m, hi.step_tokens)) < 0 ||
              json_object_set_new(o, "eviction", eviction_json(w, m, &hi)) < 0)) {
        json_decref(o);
        o = NULL;
    }
    return respond_json(c, 200, o);
}

static int metrics(kvpd_conn *c)
{
    kvpd_gauges g;
    kvp_hub_info hi;
    gauges(c->w, &g, &hi);
    size_t len = 0;
    char *text = kvpd_metrics_render(c->w->metrics, &g, &len);
    if (!text)
        return respond(c, 500, "text/plain", "out of memory\n", 14, NULL);
    int rc = respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
    free(text);
    return rc;
}

/* Only plain file names from static_dir: no directories, no dot files. The file's path
 * (path[KVPD_PATH_MAX + 80]) and type; NULL when there is no such file. */
static const char *static_path(kvpd_conn *c, const char *uri, char *path)
{
    const char *name = !strcmp(uri, "/") ? "index.html" : uri + 1;
    const char *dot = strrchr(name, '.');
    size_t n = strlen(name);
    if (n == 0 || n > 64 || name[0] == '.' || !dot || strchr(name, '/'))
        return NULL;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '_'))
            return NULL;
    static const struct { const char *ext, *mime; } types[] = {
        {".html", "text/html; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
        {".js", "application/javascript; charset=utf-8"}, {".svg", "image/svg+xml"},
        {".ico", "image/x-icon"}};
    const char *mime = NULL;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(dot, types[i].ext))
            mime = types[i].mime;
    snprintf(path, KVPD_PATH_MAX + 80, "%s/%s", c->w->cfg->static_dir, name);
    struct stat st;
    if (!mime || stat(path, &st) < 0 || !S_ISREG(st.st_mode))
        return NULL;
    return mime;
}

/* Returns 0 when lws streams the file, 1 when there is no such file, -1 on failure. */
static int static_file(kvpd_conn *c, const char *uri)
{
    char path[KVPD_PATH_MAX + 80];
    const char *mime = static_path(c, uri, path);
    if (!mime)
        return 1;
    c->w->metrics->http_requests++;
    kvpd_labelled_add(&c->w->metrics->http_by_path, "/static", 200);
    int rc = lws_serve_http_file(c->wsi, path, mime, NULL, 0);
    return rc < 0 ? -1 : 0;
}

/* 1 when uri is one of the GET endpoints of this file (a static file that exists too). */
static int get_endpoint(kvpd_conn *c, const char *uri)
{
    static const char *const paths[] = {"/healthz", "/health", "/metrics", "/admin/stats",
                                        "/chat"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (!strcmp(uri, paths[i]))
            return 1;
    char path[KVPD_PATH_MAX + 80];
    return static_path(c, uri, path) != NULL;
}

/* OPTIONS on an endpoint (allow: the methods it takes): a CORS preflight. 204 with
 * Allow; for an origin allowed_origins lists, the CORS grant too: those methods, the
 * request headers the preflight asks for (when they are a plain list of header names;
 * else the ones the API reads) and a max age. Another origin was refused 403 before. No
 * API key: browsers send none on a preflight. */
static int preflight(kvpd_conn *c, const char *allow)
{
    char buf[256], methods[64], asked[256];
    const char *extra[2 * (KVPD_CORS_HEADERS + 5) + 1];
    int k = kvpd_cors_headers(kvpd_guard_cors(c->w, c->wsi, buf, sizeof buf), extra);
    snprintf(methods, sizeof methods, "%s, OPTIONS", allow);
    int cors = k > 0;
    extra[k++] = "allow:";
    extra[k++] = methods;
    if (cors) {
        const char *headers = "authorization, content-type, x-session-id";
        int n = lws_hdr_custom_copy(c->wsi, asked, sizeof asked,
                                    "access-control-request-headers:", 31);
        int plain = n > 0;
        for (int i = 0; plain && i < n; i++)
            plain = (asked[i] >= 'a' && asked[i] <= 'z') || (asked[i] >= 'A' && asked[i] <= 'Z') ||
                    (asked[i] >= '0' && asked[i] <= '9') || asked[i] == '-' || asked[i] == '_' ||
                    asked[i] == ',' || asked[i] == ' ';
        if (plain)
            headers = asked;
        extra[k++] = "access-control-allow-methods:";
        extra[k++] = methods;
        extra[k++] = "access-control-allow-headers:";
        extra[k++] = headers;
        extra[k++] = "access-control-max-age:";
        extra[k++] = "600";
    }
    extra[k] = NULL;
    return kvpd_http_respond(c, 204, "text/plain", "", 0, extra);
}

/* 1 when the header (a known token, or a custom "name:") is present. */
static int has_header(struct lws *wsi, enum lws_token_indexes tok, char *buf, size_t len)
{
    buf[0] = '\0';
    if (lws_hdr_total_length(wsi, tok) <= 0)
        return 0;
    if (lws_hdr_copy(wsi, buf, (int)len, tok) < 0)
        buf[0] = '\0';
    return 1;
}

/* How the request's body is framed. kvpd reads only Content-Length bodies, only on POST:
 * anything else is answered at once (refused: the connection closes after the answer,
 * and the bytes after the header are never read, as a body or as a request). Returns
 * NULL when the request goes on (*body_len: its body's bytes); else why, and *status. */
static const char *framing(kvpd_conn *c, int post, int api, uint64_t *body_len,
                           uint64_t *sent_len, int *status)
{
    struct lws *wsi = c->wsi;
    char buf[128];
    *body_len = *sent_len = 0;
    if (has_header(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING, buf, sizeof buf)) {
        *status = post ? 411 : 400;
        return post ? "Transfer-Encoding is not supported: send the body with Content-Length\n"
                    : "Transfer-Encoding on a request without a body\n";
    }
    if (has_header(wsi, WSI_TOKEN_TE, buf, sizeof buf) && strcasestr(buf, "chunked")) {
        *status = 400;
        return "TE: chunked is not a valid request header\n";
    }
    long cl = 0;
    if (has_header(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH, buf, sizeof buf) &&
        !kvp_parse_long(buf, 0, LONG_MAX, &cl)) {
        *status = 400;
        return "Content-Length must be a non-negative integer\n";
    }
    char expectation[64];
    int expect = has_header(wsi, WSI_TOKEN_HTTP_EXPECT, expectation, sizeof expectation);
    /* the body the client sends now (one waiting for 100 Continue sends none yet) */
    *sent_len = expect ? 0 : (uint64_t)cl;
    if (!post && cl > 0) {
        *status = 400;
        return "only POST requests may carry a body\n";
    }
    if (post && api && !has_header(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH, buf, sizeof buf)) {
        *status = 411;
        return "a POST body needs Content-Length\n";
    }
    if (expect && (!post || strcasecmp(expectation, "100-continue"))) {
        *status = 417;
        return "the only expectation served is 100-continue, on POST\n";
    }
    if (post && api && cl > c->w->cfg->max_body_bytes) {
        *status = 413;
        return "the body is over max_body_bytes\n";
    }
    if (expect && api) {
        /* The client waits for this before it sends the body. Nothing else of this
         * request is written yet, and the answers before it are out. */
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (send(lws_get_socket_fd(wsi), cont, sizeof cont - 1, MSG_DONTWAIT | MSG_NOSIGNAL)
            != (ssize_t)sizeof cont - 1) {
            *status = 500;
            return "could not write 100 Continue\n";
        }
    }
    *body_len = (uint64_t)cl;
    return NULL;
}

int kvpd_http_request(kvpd_conn *c, const char *uri, int *api_request)
{
    kvpd_web *w = c->w;
    int status;
    int post = lws_hdr_total_length(c->wsi, WSI_TOKEN_POST_URI) > 0;
    int api = kvpd_openai_path(uri, NULL) != 0;   /* with or without /v1 */
    uint64_t body_len, sent_len;
    c->path_label = api ? kvpd_openai_path_label(uri)
                  : !strcmp(uri, "/healthz") ? "/healthz" : !strcmp(uri, "/health") ? "/health"
                  : !strcmp(uri, "/metrics") ? "/metrics"
                  : !strcmp(uri, "/admin/stats") ? "/admin/stats"
                  : !strncmp(uri, "/admin/learn/transcripts", 24) ? "/admin/learn/transcripts"
                  : "other";
    c->close_after = c->drain_close = 0;
    c->cors[0] = '\0';
    const char *refused = framing(c, post, api, &body_len, &sent_len, &status);
    int fd = lws_get_socket_fd(c->wsi);
    if (refused || (post && !api)) {
        /* its body is not read as one: the connection closes after the answer. A body of
         * a known length up to KVPD_DRAIN_MAX is read and dropped first, so the client,
         * which may still be sending it, gets the answer rather than a reset (a socket
         * closed with bytes unread resets the connection); a slow one is cut at
         * KVPD_DRAIN_S. */
        c->close_after = 1;
        body_len = 0;
        if (sent_len > 0 && sent_len <= KVPD_DRAIN_MAX) {
            kvpd_wsguard_drain(fd, c->wsi, sent_len);
            lws_set_timeout(c->wsi, PENDING_TIMEOUT_HTTP_CONTENT, KVPD_DRAIN_S);
        }
    }
    if (refused || post)
        kvpd_wsguard_body(fd, body_len);
    if (refused)
        return status_error(c, status, refused, NULL);
    if (kvpd_listen_reserved(c->wsi)) {
        /* past max_connections: only health checks, one per connection */
        c->close_after = 1;
        if (strcmp(uri, "/healthz") && strcmp(uri, "/health") && strcmp(uri, "/metrics"))
            return status_error(c, 503, "too many connections\n", NULL);
    }
    refused = kvpd_guard_check(w, c->wsi, &status);
    if (refused)
        return status_error(c, status, refused, NULL);
    const char *cors = kvpd_guard_cors(w, c->wsi, c->cors, sizeof c->cors);
    if (cors != c->cors)   /* "*" or none */
        snprintf(c->cors, sizeof c->cors, "%s", cors ? cors : "");
    if (lws_hdr_total_length(c->wsi, WSI_TOKEN_OPTIONS_URI) > 0) {
        enum kvpd_oai_path path = kvpd_openai_path(uri, NULL);
        if (path != KVPD_OAI_UNKNOWN && (api || get_endpoint(c, uri)))
            return preflight(c, api ? kvpd_openai_path_allow(path) : "GET, HEAD");
        return not_found(c);
    }
    if (api) {   /* admitted: web/openai.c answers it */
        *api_request = 1;
        return 0;
    }
    c->head = lws_hdr_total_length(c->wsi, WSI_TOKEN_HEAD_URI) > 0;
    if (!strncmp(uri, "/admin/learn/transcripts", 24) && (!uri[24] || uri[24] == '/')) {
        /* the one admin endpoint that takes DELETE; the token first, as for /admin/stats */
        if (!token_ok(c))
            return status_error(c, 401, "admin token required\n", "Bearer realm=\"kvpd\"");
        return admin_learn(c, uri);
    }
    if (!c->head && lws_hdr_total_length(c->wsi, WSI_TOKEN_GET_URI) <= 0) {
        /* another method: 405 naming the ones taken, or 404 for no such path */
        if (!get_endpoint(c, uri))
            return not_found(c);
        char msg[160];
        snprintf(msg, sizeof msg, "%.96s takes GET or HEAD", uri);
        return http_error(c, 405, "method_not_allowed", msg, "GET, HEAD", NULL);
    }
    if (!strcmp(uri, "/healthz") || !strcmp(uri, "/health")) {   /* /health: llama.cpp's name */
        int ok = w->hub && !w->draining, unsaved = w->hub ? kvp_hub_unsaved(w->hub) : 0;
        if (ok && unsaved)
            return respond_json(c, 503, json_pack("{s:s, s:i}", "status", "degraded",
                                                  "unsaved_sessions", unsaved));
        return respond_json(c, ok ? 200 : 503,
                            json_pack("{s:s}", "status", ok ? "ok" : w->draining ? "draining" : "loading"));
    }
    if (!strcmp(uri, "/metrics"))
        return metrics(c);
    if (!strncmp(uri, "/admin/", 7)) {
        if (!token_ok(c))
            return status_error(c, 401, "admin token required\n", "Bearer realm=\"kvpd\"");
        if (!strcmp(uri, "/admin/stats"))
            return admin_stats(c);
        return not_found(c);
    }
    if (!strcmp(uri, "/chat"))
        return status_error(c, 426, "/chat is a websocket endpoint\n", NULL);
    int rc = static_file(c, uri);
    if (rc <= 0)
        return rc;
    return not_found(c);
}
