/* Several nodes (docs/cluster.md): a Redis (AOF, fsync always), three kvpd nodes sharing
 * it and HAProxy in front (deploy/haproxy.cfg's routing: consistent hashing on the
 * session id), all on loopback with ephemeral ports. 24 websocket conversations and 8
 * OpenAI-API ones (/v1/chat/completions, each request the whole history plus the
 * X-Session-Id it was given), 5 turns each, over the balancer; a node is killed (-9)
 * while turns of both kinds run (a cut request is sent again, a 503 "elsewhere" too);
 * Redis restarts; every node restarts in turn. Every conversation keeps every completed
 * turn (an OpenAI one's stored history is the client's, reply texts included), after its
 * first turn prefills only its new tokens wherever it lands (an OpenAI turn: the previous
 * transcript cached, at most its last sampled token computed again), and is served by
 * one node at a time (while the kill's turns run, each busy session is busy on one node
 * and its lease in Redis names that node). */
#include <criterion/criterion.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

#define NODES 3
#define CONVS 24
#define LEASE_MS 1500
#define API_CONVS 8

typedef struct conv {
    char id[33];
    int turns;              /* completed, as this client knows them */
    char pending[128];      /* a message whose turn was cut (its done never came) */
    char last_user[128];    /* the last user message of a completed turn */
} conv;

static h_proc g_redis, g_haproxy;
static kvpd_proc g_node[NODES];
static int g_port[NODES], g_hport, g_rport;
static char g_dir[64], g_cfg[128];
static conv g_conv[CONVS];

/* An OpenAI-API conversation: the client keeps the whole history and sends it back with
 * every request, with the X-Session-Id it was given. */
typedef struct api_conv {
    char id[33];
    json_t *messages;       /* user and assistant messages of the completed turns */
    int turns;              /* completed, as this client knows them */
    char pending[128];      /* a message whose request was cut (no answer came) */
    json_int_t transcript;  /* kvpd.transcript_tokens after the last completed turn */
} api_conv;

static api_conv g_api[API_CONVS];

static void nap_ms(int ms)
{
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

static void node_start(int k)
{
    char extra[512];
    snprintf(extra, sizeof extra,
             "--listen 127.0.0.1:%d --state-url redis://127.0.0.1:%d/0 --lease-ms %d "
             "--node-id n%d --workers 1 --max-tokens 256 --idle-timeout 600",
             g_port[k], g_rport, LEASE_MS, k);
    cr_assert_eq(kvpd_start(&g_node[k], extra), 0, "node %d did not start (log %s)", k,
                 g_node[k].log);
}

static void write_haproxy_cfg(void)
{
    snprintf(g_cfg, sizeof g_cfg, "%s/haproxy.cfg", g_dir);
    FILE *f = fopen(g_cfg, "w");
    cr_assert(f);
    /* deploy/haproxy.cfg's routing, with test ports and quick health checks */
    fprintf(f,
            "global\n  maxconn 512\n"
            "defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n"
            "  timeout server 30s\n  timeout tunnel 60s\n  retries 3\n  option redispatch 1\n"
            "frontend kvpd\n  bind 127.0.0.1:%d\n"
            "  use_backend kvpd_api if { path_beg /v1/ }\n  default_backend kvpd_chat\n"
            "backend kvpd_chat\n  balance url_param session\n  hash-type consistent\n"
            "  option httpchk\n"
            "  http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host localhost\n"
            "  http-check expect status 200\n"
            "  default-server inter 200ms fall 1 rise 1\n",
            g_hport);
    for (int k = 0; k < NODES; k++)
        fprintf(f, "  server n%d 127.0.0.1:%d check\n", k, g_port[k]);
    fprintf(f, "backend kvpd_api\n  balance hdr(X-Session-Id)\n  hash-type consistent\n"
               "  option httpchk\n"
               "  http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host localhost\n"
               "  http-check expect status 200\n"
               "  default-server inter 200ms fall 1 rise 1\n");
    for (int k = 0; k < NODES; k++)
        fprintf(f, "  server n%d 127.0.0.1:%d check\n", k, g_port[k]);
    fclose(f);
}

static void setup(void)
{
    if (!h_have("redis-server") || !h_have("haproxy"))
        cr_skip_test("redis-server or haproxy is not installed (scripts/setup.sh installs both)");
    cr_assert_eq(h_mkdtemp(g_dir, sizeof g_dir), 0);
    g_rport = h_free_port();
    cr_assert_eq(h_redis_start(&g_redis, g_dir, g_rport, H_REDIS_AOF), 0, "redis-server did not start");
    for (int k = 0; k < NODES; k++)
        g_port[k] = h_free_port();
    for (int k = 0; k < NODES; k++)
        node_start(k);
    g_hport = h_free_port();
    write_haproxy_cfg();
    char *argv[] = {"haproxy", "-db", "-f", g_cfg, NULL};
    cr_assert_eq(h_proc_start(&g_haproxy, argv, g_hport, 10000), 0, "haproxy did not start");
    nap_ms(500);   /* the first health checks */
}

static void teardown(void)
{
    h_proc_kill(&g_haproxy);
    for (int k = 0; k < NODES; k++)
        if (g_node[k].pid > 0)
            kvpd_stop(&g_node[k], 5000);
    h_proc_kill(&g_redis);
    for (int i = 0; i < API_CONVS; i++)
        json_decref(g_api[i].messages);
    if (g_dir[0]) {   /* Redis keeps its AOF in a subdirectory */
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        cr_assert_eq(system(cmd), 0);
    }
}

TestSuite(cluster, .init = setup, .fini = teardown, .timeout = 150);

static const char *str_of(json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));
    return s ? s : "";
}

static json_int_t stat_of(json_t *done, const char *key)
{
    json_t *v = json_object_get(json_object_get(done, "stats"), key);
    cr_assert(json_is_integer(v), "stats.%s missing", key);
    return json_integer_value(v);
}

/* Connects through the balancer; the session frame of the hello into *session. */
static int open_conv(ws_client *c, const conv *cv, json_t **session)
{
    char path[64];
    snprintf(path, sizeof path, cv->id[0] ? "/chat?session=%s" : "/chat", cv->id);
    *session = NULL;
    if (ws_connect(c, "127.0.0.1", g_hport, path, 5000) < 0)
        return -1;
    if (!cv->id[0])
        return 0;
    /* a hello without an id resumes the one in the URL */
    if (ws_send_text(c, "{\"type\":\"hello\"}") < 0) {
        ws_close(c);
        return -1;
    }
    json_t *j = h_read_json(c, 10000);
    if (!j || strcmp(str_of(j, "type"), "session")) {
        /* retried: served elsewhere, overloaded, or Redis away for a moment ("try again") */
        if (j && strcmp(str_of(j, "code"), "elsewhere") && strcmp(str_of(j, "code"), "overloaded") &&
            !strstr(str_of(j, "message"), "try again"))
            cr_assert_fail("conversation %s: hello answered %s %s", cv->id, str_of(j, "code"),
                           str_of(j, "message"));
        json_decref(j);
        ws_close(c);
        return -1;
    }
    *session = j;
    return 0;
}

/* The session frame against what the client knows: every completed turn is there, with
 * its user message last (a cut turn may have completed on the server: then it counts). */
static void check_session(conv *cv, json_t *s)
{
    int turns = (int)json_integer_value(json_object_get(s, "turns"));
    json_t *hist = json_object_get(s, "history");
    size_t n = json_array_size(hist);
    if (cv->pending[0] && turns == cv->turns + 1) {
        cr_assert_geq(n, 2);
        cr_assert_str_eq(str_of(json_array_get(hist, n - 2), "text"), cv->pending,
                         "conversation %s: the cut turn's message", cv->id);
        cv->turns++;
        snprintf(cv->last_user, sizeof cv->last_user, "%s", cv->pending);
        cv->pending[0] = '\0';
    }
    cr_assert_eq(turns, cv->turns, "conversation %s: %d turns stored, %d completed", cv->id,
                 turns, cv->turns);
    cr_assert_eq(n, (size_t)(2 * cv->turns), "conversation %s: history of %zu messages", cv->id, n);
    if (n)
        cr_assert_str_eq(str_of(json_array_get(hist, n - 2), "text"), cv->last_user,
                         "conversation %s: its last message", cv->id);
}

/* Reads a turn's frames to its end: done (returned), or NULL (error: *code; or the
 * connection went away). */
static json_t *read_done(ws_client *c, conv *cv, char *code, size_t code_len)
{
    code[0] = '\0';
    for (;;) {
        json_t *j = h_read_json(c, 30000);
        if (!j)
            return NULL;
        const char *t = str_of(j, "type");
        if (!strcmp(t, "session") && !cv->id[0])
            snprintf(cv->id, sizeof cv->id, "%s", str_of(j, "id"));
        if (!strcmp(t, "done"))
            return j;
        if (!strcmp(t, "error")) {
            snprintf(code, code_len, "%s", str_of(j, "code"));
            if (strcmp(code, "elsewhere") && strcmp(code, "overloaded"))
                fprintf(stderr, "conversation %s: %s: %s\n", cv->id, code, str_of(j, "message"));
            json_decref(j);
            return NULL;
        }
        json_decref(j);
    }
}

static int send_message(ws_client *c, const char *text, int max_tokens)
{
    json_t *m = json_pack("{s:s, s:s, s:i}", "type", "message", "text", text, "max_tokens",
                          max_tokens);
    char *s = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    int rc = ws_send_text(c, s);
    free(s);
    return rc;
}

/* A completed turn's checks: after the first, only the turn's new tokens were prefilled
 * (the cache came along, from memory or from Redis). */
static void turn_completed(conv *cv, const char *text, json_t *done)
{
    json_int_t prompt = stat_of(done, "prompt_tokens"), pre = stat_of(done, "prefilled_tokens"),
               gen = stat_of(done, "generated_tokens"), all = stat_of(done, "transcript_tokens");
    if (cv->turns > 0) {
        cr_assert_eq(pre, prompt, "conversation %s turn %d: prefilled %lld, new %lld", cv->id,
                     cv->turns + 1, (long long)pre, (long long)prompt);
        cr_assert_lt(prompt + gen, all, "conversation %s turn %d: the whole transcript was "
                     "prefilled again", cv->id, cv->turns + 1);
    }
    cv->turns++;
    snprintf(cv->last_user, sizeof cv->last_user, "%s", text);
    cv->pending[0] = '\0';
}

/* One turn through the balancer, retried (bounded) while the session is elsewhere, a
 * node is down or Redis is away. A cut turn's retry (text == cv->pending) is not sent
 * again when it turns out to have completed on its node. */
static void conv_turn(conv *cv, const char *message)
{
    char text[128];
    int retry = message == cv->pending;
    snprintf(text, sizeof text, "%s", message);
    for (int attempt = 0; attempt < 60; attempt++) {
        ws_client c;
        json_t *s;
        if (open_conv(&c, cv, &s) < 0) {
            nap_ms(100);
            continue;
        }
        if (s) {
            check_session(cv, s);
            json_decref(s);
        }
        if (retry && !cv->pending[0]) {
            ws_close(&c);
            return;
        }
        char code[32];
        json_t *done = send_message(&c, text, 24) == 0 ? read_done(&c, cv, code, sizeof code)
                                                       : NULL;
        ws_close(&c);
        if (done) {
            turn_completed(cv, text, done);
            json_decref(done);
            return;
        }
        snprintf(cv->pending, sizeof cv->pending, "%s", text);
        cr_assert(!code[0] || !strcmp(code, "elsewhere") || !strcmp(code, "overloaded") ||
                      !strcmp(code, "internal"),
                  "conversation %s: error %s", cv->id, code);
        nap_ms(100);
    }
    cr_assert_fail("conversation %s: no turn after 60 attempts", cv->id);
}

static void text_of(char *buf, size_t n, int conv, int turn)
{
    snprintf(buf, n, "Conversation %d, turn %d: tell me about the little dog and the ball.",
             conv, turn);
}

/* An OpenAI request's answer, as h_request gives it. */
typedef struct api_answer {
    int status;             /* -1: no answer (the connection was cut) */
    char *raw;
    const char *body;
} api_answer;

/* POST /v1/chat/completions through the balancer: the client's whole history, the new
 * user message last, and the session id it was given. */
static void api_send(const api_conv *ac, const char *text, int max_tokens, api_answer *a)
{
    json_t *msgs = json_deep_copy(ac->messages);
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", text));
    json_t *req = json_pack("{s:o, s:i}", "messages", msgs, "max_tokens", max_tokens);
    char *body = json_dumps(req, JSON_COMPACT), hdr[64] = "";
    json_decref(req);
    if (ac->id[0])
        snprintf(hdr, sizeof hdr, "X-Session-Id: %s\r\n", ac->id);
    a->status = h_request(g_hport, "POST", "/v1/chat/completions", hdr, body, &a->raw, &a->body);
    free(body);
}

/* The session as a websocket hello through the balancer shows it (NULL while it is
 * elsewhere or a node is down: retried). */
static json_t *api_stored(const char *id)
{
    conv probe = {0};
    snprintf(probe.id, sizeof probe.id, "%s", id);
    for (int a = 0; a < 40; a++) {
        ws_client c;
        json_t *s;
        if (open_conv(&c, &probe, &s) == 0) {
            ws_close(&c);
            return s;
        }
        nap_ms(100);
    }
    cr_assert_fail("session %s could not be read", id);
    return NULL;
}

static json_int_t int_at(json_t *j, const char *path)
{
    char key[64];
    snprintf(key, sizeof key, "%s", path);
    for (char *k = key, *dot; k; k = dot ? dot + 1 : NULL) {
        dot = strchr(k, '.');
        if (dot)
            *dot = '\0';
        j = json_object_get(j, k);
    }
    cr_assert(json_is_integer(j), "%s missing", path);
    return json_integer_value(j);
}

/* An answer to a turn's request: 1 when the turn completed (then checked), 0 when it is
 * to be sent again (a node died under it, the session was elsewhere, a node was
 * stopping). */
static int api_answered(api_conv *ac, const char *text, api_answer *a)
{
    int status = a->status;
    if (status != 200) {
        cr_assert(status == -1 || status == 502 || status == 503 || status == 504 || status == 429,
                  "api conversation %s: status %d: %.300s", ac->id, status,
                  a->raw ? a->raw : "");
        if (status == 503 && strstr(a->body, "\"code\""))
            cr_assert(strstr(a->body, "\"elsewhere\"") || strstr(a->body, "service_unavailable"),
                      "api conversation %s: 503 %s", ac->id, a->body);
        free(a->raw);
        snprintf(ac->pending, sizeof ac->pending, "%s", text);
        return 0;
    }
    json_t *j = json_loads(a->body, 0, NULL);
    cr_assert(j, "api conversation %s: not JSON: %.300s", ac->id, a->body);
    char sid[33];
    snprintf(sid, sizeof sid, "%s", h_header(a->raw, "x-session-id:"));
    free(a->raw);
    json_t *usage = json_object_get(j, "usage");
    json_int_t prompt = int_at(usage, "prompt_tokens"),
               cached = int_at(usage, "prompt_tokens_details.cached_tokens"),
               pre = int_at(j, "kvpd.prefilled_tokens"), all = int_at(j, "kvpd.transcript_tokens");
    cr_assert_eq(strlen(sid), 32, "api conversation %s: no X-Session-Id", ac->id);
    cr_assert_str_eq(str_of(json_object_get(j, "kvpd"), "session"), sid);
    /* the tokens of the prompt not in the cache, and only those, were computed */
    cr_assert_eq(pre, prompt - cached, "api conversation %s: prefilled %lld of %lld, %lld cached",
                 sid, (long long)pre, (long long)prompt, (long long)cached);
    if (ac->turns > 0 && strcmp(sid, ac->id)) {
        /* another session: only when the cut request's turn had completed on its node
         * (the client never saw that reply, so its history is not that session's) */
        json_t *old = api_stored(ac->id);
        json_t *hist = json_object_get(old, "history");
        size_t n = json_array_size(hist);
        cr_assert(ac->pending[0] && n == (size_t)(2 * ac->turns + 2) &&
                      !strcmp(str_of(json_array_get(hist, n - 2), "text"), ac->pending),
                  "api conversation %s continued as %s, with its history", ac->id, sid);
        json_decref(old);
        ac->transcript = 0;
    }
    if (ac->transcript > 0) {
        /* continued: the previous transcript is cached, all of it or all but the last
         * sampled token (which the next turn feeds when its node sampled it); only the
         * new message's tokens are computed */
        cr_assert(cached == ac->transcript || cached == ac->transcript - 1,
                  "api conversation %s turn %d: %lld cached of a transcript of %lld", sid,
                  ac->turns + 1, (long long)cached, (long long)ac->transcript);
        cr_assert_lt(pre, prompt - 8, "api conversation %s turn %d: the whole history was "
                     "prefilled again", sid, ac->turns + 1);
    } else {
        cr_assert_eq(pre, prompt, "api conversation %s: a new session prefills its history", sid);
    }
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    const char *reply = str_of(msg, "content");
    cr_assert_str_eq(str_of(msg, "role"), "assistant");
    cr_assert(reply[0], "api conversation %s: an empty reply", sid);
    json_array_append_new(ac->messages, json_pack("{s:s, s:s}", "role", "user", "content", text));
    json_array_append_new(ac->messages,
                          json_pack("{s:s, s:s}", "role", "assistant", "content", reply));
    snprintf(ac->id, sizeof ac->id, "%s", sid);
    ac->turns++;
    ac->transcript = all;
    ac->pending[0] = '\0';
    json_decref(j);
    return 1;
}

/* One OpenAI turn through the balancer, sent again (bounded) until it completes. */
static void api_turn(api_conv *ac, const char *message)
{
    char text[128];
    snprintf(text, sizeof text, "%s", message);
    for (int attempt = 0; attempt < 60; attempt++) {
        api_answer a;
        api_send(ac, text, 24, &a);
        if (api_answered(ac, text, &a))
            return;
        nap_ms(100);
    }
    cr_assert_fail("api conversation %s: no turn after 60 attempts", ac->id);
}

static void api_text_of(char *buf, size_t n, int conv, int turn)
{
    snprintf(buf, n, "API conversation %d, turn %d: what did the cat find in the garden?", conv,
             turn);
}

/* The session as stored holds this client's history, reply texts included. */
static void api_check_stored(const api_conv *ac)
{
    json_t *s = api_stored(ac->id), *hist = json_object_get(s, "history");
    cr_assert_eq(json_array_size(hist), json_array_size(ac->messages),
                 "api conversation %s: %zu messages stored, %zu known", ac->id,
                 json_array_size(hist), json_array_size(ac->messages));
    for (size_t m = 0; m < json_array_size(hist); m++) {
        json_t *h = json_array_get(hist, m), *c = json_array_get(ac->messages, m);
        cr_assert_str_eq(str_of(h, "role"), str_of(c, "role"));
        cr_assert_str_eq(str_of(h, "text"), str_of(c, "content"),
                         "api conversation %s: message %zu differs", ac->id, m);
    }
    json_decref(s);
}

/* A long OpenAI turn running on its own thread while the main one kills a node. */
typedef struct api_job {
    pthread_t thread;
    api_conv *ac;
    char text[128];
    api_answer answer;
} api_job;

static void *api_job_run(void *arg)
{
    api_job *job = arg;
    api_send(job->ac, job->text, 200, &job->answer);
    return NULL;
}

static void all_turn(int turn)
{
    for (int i = 0; i < CONVS; i++) {
        char text[128];
        text_of(text, sizeof text, i, turn);
        conv_turn(&g_conv[i], text);
    }
    for (int i = 0; i < API_CONVS; i++) {
        char text[128];
        api_text_of(text, sizeof text, i, turn);
        api_turn(&g_api[i], text);
    }
}

static redisContext *redis(void)
{
    redisContext *r = redisConnect("127.0.0.1", g_rport);
    cr_assert(r && !r->err, "redis");
    return r;
}

static int node_of_lease(redisContext *r, const char *id)
{
    redisReply *rep = redisCommand(r, "GET lease:%s", id);
    int k = -1;
    if (rep && rep->type == REDIS_REPLY_STRING && rep->str[0] == 'n')
        k = atoi(rep->str + 1);
    freeReplyObject(rep);
    return k;
}

/* The id of conversation i of both kinds: websocket ones first, then OpenAI ones. */
static const char *conv_id(int i)
{
    return i < CONVS ? g_conv[i].id : g_api[i - CONVS].id;
}

/* Every session busy on a node is busy on that node only, and its lease names no other
 * node. A busy session may hold no lease yet: a queued turn's worker takes the lease when
 * the job starts, and an OpenAI conversation (no client attached) lets it go after each
 * turn, so between turns nothing names it. */
static int check_single_owner(redisContext *r)
{
    int busy_on[CONVS + API_CONVS], busy_total = 0;
    for (int i = 0; i < CONVS + API_CONVS; i++)
        busy_on[i] = -1;
    for (int k = 0; k < NODES; k++) {
        if (g_node[k].pid <= 0)
            continue;
        json_t *st = h_stats(&g_node[k]);
        cr_assert(st, "node %d stats", k);
        json_t *list = json_object_get(st, "session_list"), *si;
        size_t idx;
        json_array_foreach(list, idx, si) {
            if (!json_is_true(json_object_get(si, "busy")))
                continue;
            for (int i = 0; i < CONVS + API_CONVS; i++)
                if (!strcmp(str_of(si, "id"), conv_id(i))) {
                    cr_assert_eq(busy_on[i], -1, "conversation %s busy on nodes %d and %d",
                                 conv_id(i), busy_on[i], k);
                    busy_on[i] = k;
                    busy_total++;
                    int holder = node_of_lease(r, conv_id(i));
                    cr_assert(holder == k || holder == -1,
                              "conversation %s runs on node %d, its lease names node %d",
                              conv_id(i), k, holder);
                }
        }
        json_decref(st);
    }
    return busy_total;
}

/* Starts a long turn on every conversation at once (websocket and OpenAI), kills -9 a
 * node that is running one, and reads every turn to its end (done, or cut by the kill).
 * Returns the websocket turns cut; the OpenAI ones cut are left pending. */
static int kill_mid_turn(int turn, int *victim)
{
    ws_client c[CONVS];
    char text[CONVS][128];
    api_job jobs[API_CONVS];
    for (int i = 0; i < API_CONVS; i++) {
        jobs[i].ac = &g_api[i];
        api_text_of(jobs[i].text, sizeof jobs[i].text, i, turn);
        cr_assert_eq(pthread_create(&jobs[i].thread, NULL, api_job_run, &jobs[i]), 0);
    }
    for (int i = 0; i < CONVS; i++) {
        json_t *s;
        text_of(text[i], sizeof text[i], i, turn);
        int a = 0;
        while (open_conv(&c[i], &g_conv[i], &s) < 0) {
            cr_assert_lt(++a, 40, "conversation %d could not be resumed", i);
            nap_ms(100);
        }
        check_session(&g_conv[i], s);
        json_decref(s);
    }
    /* every node has a queue of turns now; the last one sent is still to run */
    for (int i = 0; i < CONVS; i++)
        cr_assert_eq(send_message(&c[i], text[i], 200), 0);
    redisContext *r = redis();
    *victim = node_of_lease(r, g_conv[CONVS - 1].id);
    cr_assert_geq(*victim, 0, "conversation %s has no lease while its turn runs",
                  g_conv[CONVS - 1].id);
    check_single_owner(r);
    kvpd_kill(&g_node[*victim]);
    redisFree(r);
    int cut = 0;
    for (int i = 0; i < CONVS; i++) {
        char code[32];
        json_t *done = read_done(&c[i], &g_conv[i], code, sizeof code);
        ws_close(&c[i]);
        if (done) {
            turn_completed(&g_conv[i], text[i], done);
            json_decref(done);
        } else {
            snprintf(g_conv[i].pending, sizeof g_conv[i].pending, "%.127s", text[i]);
            cut++;
        }
    }
    for (int i = 0; i < API_CONVS; i++) {
        pthread_join(jobs[i].thread, NULL);
        api_answered(&g_api[i], jobs[i].text, &jobs[i].answer);
    }
    return cut;
}

Test(cluster, conversations_survive_a_killed_node_a_redis_restart_and_a_rolling_restart)
{
    double t0 = ws_now_ms();
    for (int i = 0; i < API_CONVS; i++)
        g_api[i].messages = json_array();
    /* turns 1 and 2: new conversations land anywhere, then on their hashed node */
    all_turn(1);
    all_turn(2);
    for (int i = 0; i < CONVS; i++)
        cr_assert_eq(strlen(g_conv[i].id), 32);
    /* the logs: conversations moved to their hashed node by loading their snapshot */
    int loads = 0;
    for (int k = 0; k < NODES; k++)
        loads += kvpd_log_has(&g_node[k], "loaded from its snapshot");
    cr_assert_gt(loads, 0, "no conversation moved between nodes (is the balancer hashing?)");
    /* turn 3: kill -9 a node while turns run; the cut ones complete elsewhere */
    int victim, cut = kill_mid_turn(3, &victim);
    cr_assert_gt(cut, 0, "the kill cut no turn");
    for (int i = 0; i < CONVS; i++)
        if (g_conv[i].pending[0])
            conv_turn(&g_conv[i], g_conv[i].pending);
    for (int i = 0; i < API_CONVS; i++)
        if (g_api[i].pending[0])
            api_turn(&g_api[i], g_api[i].pending);
    node_start(victim);
    /* Redis restarts (AOF, fsync always): no completed turn is lost */
    h_proc_kill(&g_redis);
    cr_assert_eq(h_redis_start(&g_redis, g_dir, g_rport, H_REDIS_AOF), 0);
    all_turn(4);
    /* every node restarts in turn (SIGTERM: drain, release leases); turn 5 meanwhile */
    for (int k = 0; k < NODES; k++) {
        cr_assert_eq(kvpd_stop(&g_node[k], 10000), 0, "node %d did not stop cleanly", k);
        for (int i = k; i < CONVS; i += NODES) {
            char text[128];
            text_of(text, sizeof text, i, 5);
            conv_turn(&g_conv[i], text);
        }
        for (int i = k; i < API_CONVS; i += NODES) {
            char text[128];
            api_text_of(text, sizeof text, i, 5);
            api_turn(&g_api[i], text);
        }
        node_start(k);
    }
    /* all five turns of every conversation are there, wherever it is read */
    for (int i = 0; i < CONVS; i++) {
        cr_assert_eq(g_conv[i].turns, 5, "conversation %d: %d turns", i, g_conv[i].turns);
        for (int a = 0;; a++) {
            ws_client c;
            json_t *s;
            if (open_conv(&c, &g_conv[i], &s) == 0) {
                check_session(&g_conv[i], s);
                json_decref(s);
                ws_close(&c);
                break;
            }
            cr_assert_lt(a, 40, "conversation %d could not be resumed", i);
            nap_ms(100);
        }
    }
    for (int i = 0; i < API_CONVS; i++) {
        cr_assert_eq(g_api[i].turns, 5, "api conversation %d: %d turns", i, g_api[i].turns);
        api_check_stored(&g_api[i]);
    }
    cr_assert_lt(ws_now_ms() - t0, 120000, "the cluster test took over 2 minutes");
}

/* deploy/haproxy.cfg is valid to HAProxy itself, and routes as this test does. */
Test(deploy, haproxy_accepts_the_shipped_configuration)
{
    if (!h_have("haproxy"))
        cr_skip_test("haproxy is not installed (scripts/setup.sh installs it)");
    const char *src = getenv("KVP_SOURCE");
    cr_assert(src);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "haproxy -c -q -f '%s/deploy/haproxy.cfg'", src);
    cr_assert_eq(system(cmd), 0, "haproxy -c refused deploy/haproxy.cfg");
    snprintf(cmd, sizeof cmd, "grep -q '^ *balance url_param session' '%s/deploy/haproxy.cfg' && "
             "grep -q '^ *balance hdr(X-Session-Id)' '%s/deploy/haproxy.cfg' && "
             "grep -q '^ *hash-type consistent' '%s/deploy/haproxy.cfg' && "
             "grep -q 'uri /healthz' '%s/deploy/haproxy.cfg'", src, src, src, src);
    cr_assert_eq(system(cmd), 0, "deploy/haproxy.cfg does not hash on the session id");
}
