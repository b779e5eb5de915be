/* Integration: the batched step waits only on compute. A session whose turn ends while
 * its snapshot store stalls (Redis inside DEBUG SLEEP) does not hold back the token
 * stream of another session decoding meanwhile; and the policy's weights are read once
 * for the daemon, not once per session (memory.policy_file_loads in /admin/stats). */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(stepio, .timeout = 120);

static json_int_t stat_at(const kvpd_proc *d, const char *obj, const char *key)
{
    json_t *st = h_stats(d);
    cr_assert(st, "GET /admin/stats");
    json_int_t v = json_integer_value(json_object_get(json_object_get(st, obj), key));
    json_decref(st);
    return v;
}

static char *hello(ws_client *c)
{
    cr_assert_eq(ws_send_text(c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(c, "session", 5000);
    cr_assert(s);
    char *id = strdup(json_string_value(json_object_get(s, "id")));
    json_decref(s);
    return id;
}

static void turn_ok(ws_client *c, const char *text, int max_tokens)
{
    json_t *done = h_turn(c, text, max_tokens, NULL);
    cr_assert(done, "no answer to the turn");
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);
}

#define N_SESS 8

/* Eight sessions under the kvp policy (stories260K's default, policy/weights/) read the
 * policy file once, when the daemon starts; a SIGHUP reads it once more, for the sessions
 * made after it. Each session reading its own copy made it 1 + 8. */
Test(stepio, the_policy_weights_are_loaded_once_for_n_sessions)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-sessions 32"), 0, "log %s", d.log);
    json_t *st = h_stats(&d);
    cr_assert(st);
    cr_assert_str_eq(json_string_value(json_object_get(st, "policy")), "kvp");
    json_decref(st);
    cr_assert_eq(stat_at(&d, "memory", "policy_file_loads"), 1, "read once at start");
    ws_client c[N_SESS];
    for (int i = 0; i < N_SESS; i++) {
        cr_assert_eq(h_connect(&d, &c[i]), 0);
        free(hello(&c[i]));
        turn_ok(&c[i], "Once upon a time", 24);
    }
    for (int i = 0; i < N_SESS; i++)   /* a second turn each: evictions ran on the weights */
        turn_ok(&c[i], "The little dog", 24);
    cr_assert_eq(stat_at(&d, "memory", "policy_file_loads"), 1,
                 "%d sessions share the one copy", N_SESS);
    /* a reload reads the file again, once, and new sessions get the new copy */
    cr_assert_eq(kill(d.pid, SIGHUP), 0);
    double deadline = ws_now_ms() + 10000;
    while (stat_at(&d, "persistence", "reloads") < 1 && ws_now_ms() < deadline)
        usleep(20000);
    cr_assert_eq(stat_at(&d, "persistence", "reloads"), 1);
    cr_assert_eq(stat_at(&d, "memory", "policy_file_loads"), 2);
    ws_client n;
    cr_assert_eq(h_connect(&d, &n), 0);
    free(hello(&n));
    turn_ok(&n, "A new session", 24);
    for (int i = 0; i < N_SESS; i++)   /* the old sessions keep theirs */
        turn_ok(&c[i], "and then", 8);
    cr_assert_eq(stat_at(&d, "memory", "policy_file_loads"), 2);
    ws_close(&n);
    for (int i = 0; i < N_SESS; i++)
        ws_close(&c[i]);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* ---- a stalled store ---- */

static h_proc g_redis;
static char g_dir[64], g_model[128];

static void stall_up(void)
{
    if (!h_have("redis-server"))
        cr_skip_test("redis-server is not installed (scripts/setup.sh installs it)");
    cr_assert_eq(h_mkdtemp(g_dir, sizeof g_dir), 0);
    int port = h_free_port();
    char portbuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", port);
    char *argv[] = {"redis-server", "--port", portbuf, "--bind", "127.0.0.1", "--dir", g_dir,
                    "--save", "", "--appendonly", "no", "--enable-debug-command", "local",
                    "--daemonize", "no", "--logfile", "", NULL};
    cr_assert_eq(h_proc_start(&g_redis, argv, port, 10000), 0, "redis-server did not start");
    /* random weights: a reply runs to max_tokens (an end-of-text token is as rare as any) */
    snprintf(g_model, sizeof g_model, "%s/synth.gguf", g_dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s synth --out %s --dim 256 --hidden 512 --layers 8 --heads 4 "
             "--vocab 2048 --ctx 4096 --seed 7 > /dev/null", h_build("tools/kvp"), g_model);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static void stall_down(void)
{
    h_proc_kill(&g_redis);
    if (g_dir[0])
        h_rmdir(g_dir);
}

/* Sends one command to Redis and leaves the connection open (DEBUG SLEEP answers when
 * the sleep ends; the test does not wait for it). The socket, or -1. */
static int redis_send(int port, const char *cmd)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        write(fd, cmd, strlen(cmd)) != (ssize_t)strlen(cmd)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

#define MAX_FRAMES 8192

/* A's stream, read on a thread of its own: when each token frame came. */
typedef struct stream {
    ws_client *c;
    double at[MAX_FRAMES];
    int n;
    int done;
    pthread_mutex_t mu;
} stream;

static void *read_stream(void *arg)
{
    stream *s = arg;
    for (;;) {
        json_t *j = h_read_json(s->c, 30000);
        if (!j)
            break;
        const char *t = json_string_value(json_object_get(j, "type"));
        double now = ws_now_ms();
        int tok = t && !strcmp(t, "token"), end = !t || strcmp(t, "token");
        json_decref(j);
        pthread_mutex_lock(&s->mu);
        if (tok && s->n < MAX_FRAMES)
            s->at[s->n++] = now;
        s->done = end;
        pthread_mutex_unlock(&s->mu);
        if (end)
            break;
    }
    return NULL;
}

static int frames(stream *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

#define STALL_S 2.0
#define B_TOKENS 128

/* Session B's turn ends while Redis sleeps STALL_S seconds: its snapshot write waits
 * for Redis, and its done frame with it. Session A decodes all along: its tokens keep
 * coming (the longest gap between two of A's token frames while B waits stays far below
 * the stall); a step that wrote B's snapshot itself stopped A for the whole stall. */
Test(stepio, a_stalled_snapshot_write_does_not_stop_another_stream, .init = stall_up,
     .fini = stall_down)
{
    char extra[512];
    snprintf(extra, sizeof extra, "--model %s --policy streaming --state-url "
             "redis://127.0.0.1:%d/0 --workers 2 --max-tokens 4096", g_model, g_redis.port);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, extra), 0, "log %s", d.log);
    ws_client a, b;
    cr_assert_eq(h_connect(&d, &a), 0);
    cr_assert_eq(h_connect(&d, &b), 0);
    free(hello(&a));
    free(hello(&b));
    turn_ok(&b, "one", 4);   /* B's lease and first snapshot, before the stall */

    stream sa = {.c = &a};
    pthread_mutex_init(&sa.mu, NULL);
    json_t *m = json_pack("{s:s, s:s, s:i}", "type", "message", "text", "a long story",
                          "max_tokens", 4000);
    char *ms = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    cr_assert_eq(ws_send_text(&a, ms), 0);
    free(ms);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, read_stream, &sa), 0);
    double wait = ws_now_ms() + 10000;
    while (frames(&sa) < 32 && ws_now_ms() < wait)
        usleep(1000);
    cr_assert_geq(frames(&sa), 32, "A streams");

    /* B's turn starts (lease taken: its first token came), then Redis stalls, then B
     * ends (B_TOKENS tokens, well within the stall) and writes its snapshot into it */
    m = json_pack("{s:s, s:s, s:i}", "type", "message", "text", "two", "max_tokens", B_TOKENS);
    ms = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    cr_assert_eq(ws_send_text(&b, ms), 0);
    free(ms);
    json_t *first = h_expect(&b, "token", 10000);
    cr_assert(first, "B's first token");
    json_decref(first);
    char sleep_cmd[64];
    snprintf(sleep_cmd, sizeof sleep_cmd, "DEBUG SLEEP %.1f\r\n", STALL_S);
    double t0 = ws_now_ms();
    int rfd = redis_send(g_redis.port, sleep_cmd);
    cr_assert_geq(rfd, 0);
    int from = frames(&sa);
    json_t *done = h_expect(&b, "done", 30000);
    double t1 = ws_now_ms();
    int to = frames(&sa);
    cr_assert(done, "B's done frame");
    json_decref(done);
    close(rfd);
    cr_assert_geq(t1 - t0, STALL_S * 1e3 * 0.8,
                  "B's done waited for its snapshot (%.0f ms): the store did stall", t1 - t0);

    pthread_mutex_lock(&sa.mu);
    int ended = sa.done;
    double gap = 0;
    for (int k = from + 1; k < to; k++)
        if (sa.at[k] - sa.at[k - 1] > gap)
            gap = sa.at[k] - sa.at[k - 1];
    /* and the edges: the stall's start to A's first frame in it, its last frame to B's done */
    double head = to > from ? sa.at[from] - t0 : t1 - t0, tail = to > 0 ? t1 - sa.at[to - 1] : t1 - t0;
    gap = head > gap ? head : gap;
    gap = tail > gap ? tail : gap;
    pthread_mutex_unlock(&sa.mu);
    cr_assert_not(ended, "A was still decoding when B's done came");
    cr_log_info("during a %.1f s stall: %d of A's tokens, longest gap %.0f ms (head %.0f, "
                "tail %.0f)", STALL_S, to - from, gap, head, tail);
    cr_assert_gt(to - from, 50, "A kept decoding while B's snapshot waited (%d tokens)",
                 to - from);
    cr_assert_lt(gap, STALL_S * 1e3 / 4, "A's longest gap %.0f ms", gap);

    cr_assert_eq(ws_send_text(&a, "{\"type\":\"cancel\"}"), 0);
    pthread_join(th, NULL);
    ws_close(&a);
    ws_close(&b);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
