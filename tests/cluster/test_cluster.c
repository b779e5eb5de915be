/* Several nodes (docs/cluster.md): a Redis (AOF, fsync always), three kvpd nodes sharing
 * it and HAProxy in front (deploy/haproxy.cfg's routing: consistent hashing on the
 * session id), all on loopback with ephemeral ports. 24 conversations of 5 turns over
 * the balancer; a node is killed (-9) while turns run; Redis restarts; every node
 * restarts in turn. Every conversation keeps every completed turn, after its first turn
 * prefills only its new tokens wherever it lands, and is served by one node at a time. */
#include <criterion/criterion.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

#define NODES 3
#define CONVS 24
#define LEASE_MS 1500

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
    cr_assert_eq(h_redis_start(&g_redis, g_dir, g_rport, 1), 0, "redis-server did not start");
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

static void all_turn(int turn)
{
    for (int i = 0; i < CONVS; i++) {
        char text[128];
        text_of(text, sizeof text, i, turn);
        conv_turn(&g_conv[i], text);
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

/* Every session busy on a node is busy on that node only, and its lease names it. */
static int check_single_owner(redisContext *r)
{
    int busy_on[CONVS], busy_total = 0;
    for (int i = 0; i < CONVS; i++)
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
            for (int i = 0; i < CONVS; i++)
                if (!strcmp(str_of(si, "id"), g_conv[i].id)) {
                    cr_assert_eq(busy_on[i], -1, "conversation %s busy on nodes %d and %d",
                                 g_conv[i].id, busy_on[i], k);
                    busy_on[i] = k;
                    busy_total++;
                    int holder = node_of_lease(r, g_conv[i].id);
                    cr_assert_eq(holder, k, "conversation %s runs on node %d, its lease says %d",
                                 g_conv[i].id, k, holder);
                }
        }
        json_decref(st);
    }
    return busy_total;
}

/* Starts a long turn on every conversation at once, kills -9 a node that is running one,
 * and reads every turn to its end (done, or cut by the kill). Returns turns cut. */
static int kill_mid_turn(int turn, int *victim)
{
    ws_client c[CONVS];
    char text[CONVS][128];
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
    return cut;
}

Test(cluster, conversations_survive_a_killed_node_a_redis_restart_and_a_rolling_restart)
{
    double t0 = ws_now_ms();
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
    node_start(victim);
    /* Redis restarts (AOF, fsync always): no completed turn is lost */
    h_proc_kill(&g_redis);
    cr_assert_eq(h_redis_start(&g_redis, g_dir, g_rport, 1), 0);
    all_turn(4);
    /* every node restarts in turn (SIGTERM: drain, release leases); turn 5 meanwhile */
    for (int k = 0; k < NODES; k++) {
        cr_assert_eq(kvpd_stop(&g_node[k], 10000), 0, "node %d did not stop cleanly", k);
        for (int i = k; i < CONVS; i += NODES) {
            char text[128];
            text_of(text, sizeof text, i, 5);
            conv_turn(&g_conv[i], text);
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
             "grep -q '^ *hash-type consistent' '%s/deploy/haproxy.cfg' && "
             "grep -q 'uri /healthz' '%s/deploy/haproxy.cfg'", src, src, src);
    cr_assert_eq(system(cmd), 0, "deploy/haproxy.cfg does not hash on the session id");
}
