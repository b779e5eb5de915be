/* A slow snapshot store must not freeze other clients' streams: while Redis stalls
 * (DEBUG SLEEP), one-shot API conversations wait on their lease and their snapshot
 * write, and a websocket session decoding meanwhile keeps its token rhythm (the batched
 * step waits only on compute; store calls run as jobs on the workers). */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(security_slow_store, .timeout = 120);

static h_proc g_redis;
static char g_dir[64], g_model[128];

static void up(void)
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
    /* random weights, read greedily: a reply runs to max_tokens */
    snprintf(g_model, sizeof g_model, "%s/synth.gguf", g_dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s synth --out %s --dim 256 --hidden 512 --layers 8 --heads 4 "
             "--vocab 2048 --ctx 4096 --seed 7 > /dev/null", h_build("tools/kvp"), g_model);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static void down(void)
{
    h_proc_kill(&g_redis);
    if (g_dir[0])
        h_rmdir(g_dir);
}

/* Sends one command and leaves the connection open (DEBUG SLEEP answers at its end). */
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

typedef struct stream {
    ws_client *c;
    double at[MAX_FRAMES];
    int n, done;
    double done_at;
    char end[160];
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
        pthread_mutex_lock(&s->mu);
        if (end) {
            json_t *st = json_object_get(j, "stats");
            snprintf(s->end, sizeof s->end, "%s (stop %s, %s)", t ? t : "?",
                     json_string_value(json_object_get(st, "stop")) ?: "-",
                     json_string_value(json_object_get(j, "message")) ?: "");
            s->done_at = now;
        }
        if (tok && s->n < MAX_FRAMES)
            s->at[s->n++] = now;
        s->done = end;
        pthread_mutex_unlock(&s->mu);
        json_decref(j);
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

Test(security_slow_store, api_requests_waiting_on_a_stalled_store_do_not_freeze_a_stream,
     .init = up, .fini = down)
{
    char extra[512];
    snprintf(extra, sizeof extra, "--model %s --policy streaming --state-url "
             "redis://127.0.0.1:%d/0 --workers 2 --max-tokens 4096", g_model, g_redis.port);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, extra), 0, "log %s", d.log);
    ws_client a;
    cr_assert_eq(h_connect(&d, &a), 0);
    cr_assert_eq(ws_send_text(&a, "{\"type\":\"hello\"}"), 0);
    json_t *sess = h_expect(&a, "session", 5000);
    cr_assert(sess, "no session");
    json_decref(sess);
    stream sa = {.c = &a};
    pthread_mutex_init(&sa.mu, NULL);
    cr_assert_eq(ws_send_text(&a, "{\"type\":\"message\",\"text\":\"a long story\","
                                  "\"max_tokens\":4000,\"temperature\":0}"), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, read_stream, &sa), 0);
    double wait = ws_now_ms() + 10000;
    while (frames(&sa) < 32 && ws_now_ms() < wait)
        usleep(1000);
    cr_assert_geq(frames(&sa), 32, "A streams");

    /* Redis stalls; meanwhile API conversations start (a lease to take) and end (a
     * snapshot to write), each waiting on the store. */
    char sleep_cmd[64];
    snprintf(sleep_cmd, sizeof sleep_cmd, "DEBUG SLEEP %.1f\r\n", STALL_S);
    double t0 = ws_now_ms();
    int from = frames(&sa);
    int rfd = redis_send(g_redis.port, sleep_cmd);
    cr_assert_geq(rfd, 0);
    int answered = 0;
    double first = 0;
    while (ws_now_ms() - t0 < STALL_S * 1e3) {
        char *raw = NULL;
        const char *b;
        int st = h_request(d.port, "POST", "/v1/chat/completions", NULL,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"A frog.\"}],"
                           "\"max_tokens\":8}", &raw, &b);
        cr_assert(st == 200 || st == 503, "%d %s", st, raw ? raw : "(no answer)");
        if (!answered++)
            first = ws_now_ms() - t0;
        free(raw);
    }
    double t1 = ws_now_ms();
    int to = frames(&sa);
    close(rfd);
    cr_assert_geq(first, STALL_S * 1e3 * 0.8, "the first API answer came after %.0f ms: it "
                  "did not wait on the store", first);

    pthread_mutex_lock(&sa.mu);
    int ended = sa.done;
    double gap = 0;
    for (int k = from + 1; k < to; k++)
        if (sa.at[k] - sa.at[k - 1] > gap)
            gap = sa.at[k] - sa.at[k - 1];
    double head = to > from ? sa.at[from] - t0 : t1 - t0;
    gap = head > gap ? head : gap;
    pthread_mutex_unlock(&sa.mu);
    cr_log_info("%d API answers during a %.1f s stall: %d of A's tokens, longest gap %.0f ms",
                answered, STALL_S, to - from, gap);
    /* A may reach its end of text meanwhile (its done then waits for its own snapshot):
     * an end, not an error */
    cr_assert(!ended || !strncmp(sa.end, "done", 4), "A ended %.0f ms into a %.0f ms stall: %s",
              sa.done_at - t0, first, sa.end);
    cr_assert_gt(to - from, 50, "A kept decoding while the store stalled (%d tokens)",
                 to - from);
    cr_assert_lt(gap, STALL_S * 1e3 / 4, "A's longest gap %.0f ms", gap);

    cr_assert_eq(ws_send_text(&a, "{\"type\":\"cancel\"}"), 0);
    pthread_join(th, NULL);
    ws_close(&a);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
