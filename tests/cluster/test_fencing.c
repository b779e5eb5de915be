/* The cluster's write protocol (docs/cluster.md, "The write protocol") against the
 * failures that used to lose acknowledged turns or let two nodes serve one session: a
 * Redis restart while node A serves a turn, then a SIGTERM of A after node B moved the
 * session on; a partition between A and Redis (a TCP proxy in this test cuts and heals
 * it) long enough for A's lease to run out while B serves the session; and a lease
 * release of A's delayed (the proxy stalls it) past A's next take of the same session.
 * Every durable:true turn must survive, and a node whose lease ran out must not serve the
 * session until it has the lease again and its copy is current. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

/* ---- a TCP proxy between a node and Redis: pass, cut, stall, heal ---- */

#define PX_PAIRS 64

typedef struct px_chunk {
    struct px_chunk *next;
    double at;             /* delivered no sooner (monotonic seconds) */
    size_t len;
    char data[];
} px_chunk;

typedef struct px_pair {
    int c, s;              /* the node's side, Redis's side (-1: closed) */
    int stalled;           /* the node's bytes wait in q until the heal */
    px_chunk *q, *tail;
} px_pair;

typedef struct proxy {
    int lfd, port, up_port;
    pthread_t thread;
    pthread_mutex_t mu;
    int stop, cut;
    int delay_ms;          /* the node's bytes reach Redis this much later */
    px_pair p[PX_PAIRS];
    int n;
    size_t queued;         /* bytes waiting (stalled or delayed) */
    size_t delivered;      /* waiting bytes delivered since */
} proxy;

static double px_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int px_connect_up(int port)
{
    /* close-on-exec: a node started later must not hold the proxy's sockets open */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return -1;
}

static int px_write_all(int fd, const char *b, size_t n)
{
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static void px_close_pair(proxy *x, int i)
{
    px_pair *p = &x->p[i];
    if (p->c >= 0)
        close(p->c);
    if (p->s >= 0)
        close(p->s);
    for (px_chunk *k = p->q, *nx; k; k = nx) {
        nx = k->next;
        x->queued -= k->len;
        free(k);
    }
    x->p[i] = x->p[--x->n];
}

/* Bytes of a stalled pair go to Redis once healed, even when the node has closed its
 * side meanwhile (a late packet): the pair ends when its queue is empty. */
static void px_flush(proxy *x, px_pair *p)
{
    while (!p->stalled && p->q && p->q->at <= px_now()) {
        px_chunk *k = p->q;
        if (p->s >= 0)
            px_write_all(p->s, k->data, k->len);
        x->queued -= k->len;
        x->delivered += k->len;
        p->q = k->next;
        if (!p->q)
            p->tail = NULL;
        free(k);
    }
}

static void *px_thread(void *arg)
{
    proxy *x = arg;
    char buf[65536];
    pthread_mutex_lock(&x->mu);
    while (!x->stop) {
        struct pollfd pf[1 + 2 * PX_PAIRS];
        int n = 0;
        pf[n++] = (struct pollfd){x->lfd, POLLIN, 0};
        for (int i = 0; i < x->n; i++) {
            pf[n++] = (struct pollfd){x->p[i].c, POLLIN, 0};
            pf[n++] = (struct pollfd){x->p[i].s, POLLIN, 0};
        }
        pthread_mutex_unlock(&x->mu);
        poll(pf, (nfds_t)n, 10);
        pthread_mutex_lock(&x->mu);
        if (pf[0].revents & POLLIN) {
            int c = accept4(x->lfd, NULL, NULL, SOCK_CLOEXEC);
            int s = c >= 0 && !x->cut && x->n < PX_PAIRS ? px_connect_up(x->up_port) : -1;
            if (s < 0) {   /* cut: the connection is refused at once */
                if (c >= 0)
                    close(c);
            } else {
                x->p[x->n++] = (px_pair){.c = c, .s = s};
            }
        }
        /* the pairs polled are the first n of the list as it was */
        int polled = (n - 1) / 2;
        for (int i = polled - 1; i >= 0; i--) {
            px_pair *p = &x->p[i];
            if (x->cut) {
                px_close_pair(x, i);
                continue;
            }
            int dead = 0;
            if (p->c >= 0 && (pf[1 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t r = recv(p->c, buf, sizeof buf, 0);
                if (r <= 0) {
                    close(p->c);
                    p->c = -1;
                } else if (p->stalled || p->q || x->delay_ms) {
                    px_chunk *k = malloc(sizeof *k + (size_t)r);
                    k->next = NULL;
                    k->at = px_now() + x->delay_ms / 1000.0;
                    k->len = (size_t)r;
                    memcpy(k->data, buf, (size_t)r);
                    if (p->tail)
                        p->tail->next = k;
                    else
                        p->q = k;
                    p->tail = k;
                    x->queued += (size_t)r;
                } else if (px_write_all(p->s, buf, (size_t)r) < 0) {
                    dead = 1;
                }
            }
            if (p->s >= 0 && (pf[2 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t r = recv(p->s, buf, sizeof buf, 0);
                if (r <= 0 || (p->c >= 0 && px_write_all(p->c, buf, (size_t)r) < 0))
                    dead = 1;
            }
            px_flush(x, p);
            if (dead || (p->c < 0 && !p->q))
                px_close_pair(x, i);
        }
    }
    while (x->n)
        px_close_pair(x, x->n - 1);
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

static void px_start(proxy *x, int up_port)
{
    memset(x, 0, sizeof *x);
    x->up_port = up_port;
    pthread_mutex_init(&x->mu, NULL);
    x->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(x->lfd, 0);
    int one = 1;
    setsockopt(x->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(x->lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(x->lfd, 64), 0);
    cr_assert_eq(getsockname(x->lfd, (struct sockaddr *)&a, &len), 0);
    x->port = ntohs(a.sin_port);
    cr_assert_eq(pthread_create(&x->thread, NULL, px_thread, x), 0);
}

static void px_stop(proxy *x)
{
    if (!x->lfd)
        return;
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->thread, NULL);
    close(x->lfd);
    pthread_mutex_destroy(&x->mu);
    x->lfd = 0;
}

/* Every connection is closed and new ones are refused (a partition). */
static void px_cut(proxy *x)
{
    pthread_mutex_lock(&x->mu);
    x->cut = 1;
    pthread_mutex_unlock(&x->mu);
}

/* The connections open now stop delivering the node's bytes (held in order); new
 * connections pass. */
static void px_stall_open(proxy *x)
{
    pthread_mutex_lock(&x->mu);
    for (int i = 0; i < x->n; i++)
        x->p[i].stalled = 1;
    pthread_mutex_unlock(&x->mu);
}

/* From now on the node's bytes reach Redis ms later (Redis's answers are not held). */
static void px_delay(proxy *x, int ms)
{
    pthread_mutex_lock(&x->mu);
    x->delay_ms = ms;
    pthread_mutex_unlock(&x->mu);
}

static void px_heal(proxy *x)
{
    pthread_mutex_lock(&x->mu);
    x->cut = 0;
    x->delay_ms = 0;
    for (int i = 0; i < x->n; i++)
        x->p[i].stalled = 0;
    pthread_mutex_unlock(&x->mu);
}

static size_t px_queued(proxy *x)
{
    pthread_mutex_lock(&x->mu);
    size_t n = x->queued;
    pthread_mutex_unlock(&x->mu);
    return n;
}

static size_t px_delivered(proxy *x)
{
    pthread_mutex_lock(&x->mu);
    size_t n = x->delivered;
    pthread_mutex_unlock(&x->mu);
    return n;
}

/* ---- Redis, two nodes ---- */

static h_proc g_redis;
static char g_dir[64];
static proxy g_px;
static kvpd_proc g_a, g_b;

static void nap_ms(int ms)
{
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

static void setup(void)
{
    h_redis_up(&g_redis, g_dir, sizeof g_dir, H_REDIS_AOF);
    px_start(&g_px, g_redis.port);
}

static void teardown(void)
{
    if (g_a.pid > 0)
        kvpd_stop(&g_a, 5000);
    if (g_b.pid > 0)
        kvpd_stop(&g_b, 5000);
    px_stop(&g_px);
    h_proc_kill(&g_redis);
    if (g_dir[0]) {   /* Redis keeps its AOF in a subdirectory */
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        cr_assert_eq(system(cmd), 0);
    }
}

TestSuite(fencing, .init = setup, .fini = teardown, .timeout = 120);

/* Node A reaches Redis through the proxy when `proxied`; B always directly. more: other
 * flags for both ("" none). */
static const char *g_more = "";

static void node_start(kvpd_proc *p, const char *name, int proxied, int lease_ms)
{
    char extra[640];
    snprintf(extra, sizeof extra,
             "--state-url redis://127.0.0.1:%d/0 --lease-ms %d --node-id %s --workers 1 "
             "--idle-timeout 600 %s", proxied ? g_px.port : g_redis.port, lease_ms, name,
             g_more);
    cr_assert_eq(kvpd_start(p, extra), 0, "node %s did not start (log %s)", name, p->log);
}

static const char *str_of(json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));
    return s ? s : "";
}

/* A new session on the node: its id into id. */
static void open_new(const kvpd_proc *p, ws_client *c, char *id)
{
    cr_assert_eq(h_connect(p, c), 0);
    cr_assert_eq(ws_send_text(c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(c, "session", 10000);
    cr_assert(s);
    snprintf(id, 33, "%s", str_of(s, "id"));
    json_decref(s);
}

/* Resumes id on the node, retrying (bounded) while another node holds its lease or the
 * node says to try again; the session frame. */
static json_t *resume(const kvpd_proc *p, ws_client *c, const char *id)
{
    char hello[128];
    snprintf(hello, sizeof hello, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(h_connect(p, c), 0);
    for (int tries = 0; tries < 60; tries++) {
        cr_assert_eq(ws_send_text(c, hello), 0);
        json_t *j = h_read_json(c, 10000);
        cr_assert(j, "no answer to the hello");
        if (!strcmp(str_of(j, "type"), "session"))
            return j;
        cr_assert(!strcmp(str_of(j, "code"), "elsewhere") || strstr(str_of(j, "message"), "try again"),
                  "hello answered %s: %s", str_of(j, "code"), str_of(j, "message"));
        json_int_t wait = json_integer_value(json_object_get(j, "retry_after_ms"));
        json_decref(j);
        nap_ms(wait > 0 && wait < 2000 ? (int)wait : 200);
    }
    cr_assert_fail("session %s never resumed", id);
    return NULL;
}

/* A turn that must complete; durable: 1 must be, 0 must not be. */
static void turn_ok(ws_client *c, const char *text, int durable)
{
    json_t *done = h_turn(c, text, 8, NULL);
    cr_assert(done, "no answer to '%s'", text);
    cr_assert_str_eq(str_of(done, "type"), "done", "'%s': %s %s", text, str_of(done, "code"),
                     str_of(done, "message"));
    cr_assert_eq(json_is_true(json_object_get(done, "durable")), durable,
                 "'%s': durable %s (%s)", text, durable ? "false" : "true",
                 str_of(done, "durable_error"));
    json_decref(done);
}

/* The user messages of a session frame's history, in order, one per line. */
static void user_messages(json_t *session, char *out, size_t len)
{
    json_t *hist = json_object_get(session, "history");
    out[0] = '\0';
    for (size_t i = 0; i < json_array_size(hist); i++) {
        json_t *m = json_array_get(hist, i);
        if (!strcmp(str_of(m, "role"), "user") || json_is_true(json_object_get(m, "user"))) {
            size_t used = strlen(out);
            snprintf(out + used, len - used, "%s\n", str_of(m, "text"));
        }
    }
}

static redisReply *redis_cmd(const char *fmt, const char *arg)
{
    redisContext *r = redisConnect("127.0.0.1", g_redis.port);
    cr_assert(r && !r->err);
    redisReply *rep = redisCommand(r, fmt, arg);
    cr_assert(rep);
    redisFree(r);
    return rep;
}

/* The session as B resumes it now: its turn count and its user messages. */
static int stored_on_b(const char *id, char *users, size_t len)
{
    ws_client c;
    json_t *s = resume(&g_b, &c, id);
    int turns = (int)json_integer_value(json_object_get(s, "turns"));
    user_messages(s, users, len);
    json_decref(s);
    ws_close(&c);
    return turns;
}

Test(fencing, a_stale_node_s_shutdown_save_never_rolls_back_another_node_s_durable_turns)
{
    node_start(&g_a, "nA", 0, 1500);
    node_start(&g_b, "nB", 0, 1500);
    ws_client a;
    char id[33];
    open_new(&g_a, &a, id);
    turn_ok(&a, "Once upon a time", 1);
    /* Redis restarts while A serves a turn: answered from memory, not durable */
    int port = g_redis.port;
    h_proc_kill(&g_redis);
    turn_ok(&a, "The cat sat", 0);
    cr_assert_eq(h_redis_start(&g_redis, g_dir, port, H_REDIS_AOF), 0);
    ws_close(&a);
    /* the client moves to B: four durable turns on the stored copy */
    ws_client b;
    json_t *s = resume(&g_b, &b, id);
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 1);
    json_decref(s);
    const char *msgs[] = {"B one", "B two", "B three", "B four"};
    for (int i = 0; i < 4; i++)
        turn_ok(&b, msgs[i], 1);
    ws_close(&b);
    nap_ms(300);   /* B's release */
    /* A stops: its unsaved copy is older than the store's and must not be written */
    kill(g_a.pid, SIGTERM);
    for (int i = 0; i < 1000 && !kvpd_log_has(&g_a, "kvpd: info: stopped"); i++)
        nap_ms(10);   /* (its log goes with a clean exit) */
    redisReply *t = redis_cmd("GET turns:%s", id);
    cr_assert_eq(t->type, REDIS_REPLY_STRING);
    cr_assert_str_eq(t->str, "5", "B's four durable turns are in Redis");
    freeReplyObject(t);
    char users[512];
    cr_assert_eq(stored_on_b(id, users, sizeof users), 5);
    cr_assert_str_eq(users, "Once upon a time\nB one\nB two\nB three\nB four\n");
    cr_assert(kvpd_log_has(&g_a, "not written: the stored session moved on"),
              "A's log says why it did not save (%s)", g_a.log);
    cr_assert_eq(kvpd_wait(&g_a, 10000), 0, "a stale copy not written is no failed save");
}

/* A (behind the proxy) and B with this lease; a new session's first turn on A (its id
 * into id, its client a). */
static void first_turn_on_a(int lease, ws_client *a, char *id)
{
    node_start(&g_a, "nA", 1, lease);
    node_start(&g_b, "nB", 0, lease);
    open_new(&g_a, a, id);
    turn_ok(a, "Once upon a time", 1);
}

/* A (behind the proxy) and B; a session's first turn on A, then a partition between A
 * and Redis: A serves its client from memory while its lease surely lasts, the lease
 * runs out, and B serves a durable turn of the session. A's client stays connected (a). */
static void partition_past_the_lease(ws_client *a, char *id)
{
    const int lease = 2000;
    first_turn_on_a(lease, a, id);
    px_cut(&g_px);
    turn_ok(a, "A alone", 0);
    nap_ms(lease + 500);   /* A's lease has run out in Redis */
    ws_client b;
    json_t *s = resume(&g_b, &b, id);
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 1);
    json_decref(s);
    turn_ok(&b, "B meanwhile", 1);
    ws_close(&b);
}

/* Healed: A and the store both count two turns, but A's copy is not the store's. A's
 * next turn takes the lease, finds B's newer version, reloads it and goes on: B's
 * durable turn survives, A's undurable one is gone. */
static void heal_then_a_goes_on(ws_client *a, const char *id)
{
    px_heal(&g_px);
    nap_ms(300);   /* B's release */
    turn_ok(a, "A after", 1);
    ws_close(a);
    nap_ms(300);
    char users[512];
    cr_assert_eq(stored_on_b(id, users, sizeof users), 3);
    cr_assert_str_eq(users, "Once upon a time\nB meanwhile\nA after\n",
                     "B's durable turn did not survive A's next write");
}

Test(fencing, a_partitioned_node_stops_serving_when_its_lease_runs_out_and_reloads_after)
{
    ws_client a;
    char id[33];
    partition_past_the_lease(&a, id);
    /* still cut off: A must not serve a session another node may hold now */
    json_t *j = h_turn(&a, "A again", 8, NULL);
    cr_assert(j);
    cr_assert_str_eq(str_of(j, "type"), "error", "A served the session without its lease");
    cr_assert(strstr(str_of(j, "message"), "lease"), "%s", str_of(j, "message"));
    json_decref(j);
    heal_then_a_goes_on(&a, id);
}

Test(fencing, a_delayed_lease_release_never_removes_a_later_take_of_the_same_node)
{
    const int lease = 4000;
    ws_client a;
    char id[33];
    first_turn_on_a(lease, &a, id);
    /* the client leaves: A's release is sent on a connection the proxy now stalls */
    px_stall_open(&g_px);
    ws_close(&a);
    for (int i = 0; i < 200 && px_queued(&g_px) == 0; i++)
        nap_ms(10);
    cr_assert_gt(px_queued(&g_px), 0, "A sent its lease release");
    /* a new client of A resumes it at once: A takes the lease again */
    ws_client a2;
    json_t *s = resume(&g_a, &a2, id);
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 1);
    json_decref(s);
    /* the stalled release reaches Redis now */
    size_t before = px_delivered(&g_px);
    px_heal(&g_px);
    for (int i = 0; i < 200 && px_delivered(&g_px) == before; i++)
        nap_ms(10);
    cr_assert_gt(px_delivered(&g_px), before);
    nap_ms(200);
    redisReply *l = redis_cmd("GET lease:%s", id);
    cr_assert_eq(l->type, REDIS_REPLY_STRING, "A's live lease was deleted by its own old release");
    cr_assert_str_eq(l->str, "nA");
    freeReplyObject(l);
    /* B cannot take the session while A has it */
    ws_client b;
    char hello[128];
    snprintf(hello, sizeof hello, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(h_connect(&g_b, &b), 0);
    cr_assert_eq(ws_send_text(&b, hello), 0);
    json_t *j = h_read_json(&b, 10000);
    cr_assert(j);
    cr_assert_str_eq(str_of(j, "code"), "elsewhere", "B was given the session A holds");
    json_decref(j);
    ws_close(&b);
    turn_ok(&a2, "A goes on", 1);
    ws_close(&a2);
}

/* A partition longer than the lease with equal turn counts on both sides after the heal. */
Test(fencing, after_a_partition_longer_than_the_lease_the_cut_off_copy_never_overwrites)
{
    ws_client a;
    char id[33];
    partition_past_the_lease(&a, id);
    heal_then_a_goes_on(&a, id);
}

/* A's lease runs out while its turn's write is on the way (Redis gets A's commands
 * late): B serves the session meanwhile, and A's late write must not land on B's. */
Test(fencing, a_lease_running_out_mid_turn_costs_that_turn_s_durability_only)
{
    const int lease = 600, delay = 1700;
    ws_client a;
    char id[33];
    first_turn_on_a(lease, &a, id);
    nap_ms(lease + 300);   /* A's lease from that turn has run out */
    px_delay(&g_px, delay);
    /* A's turn: its take reaches Redis late, its write later still */
    json_t *m = json_pack("{s:s, s:s, s:i}", "type", "message", "text", "A slow", "max_tokens", 8);
    char *txt = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    cr_assert_eq(ws_send_text(&a, txt), 0);
    free(txt);
    /* once A's take has landed and its lease has run out again, B serves the session */
    nap_ms(delay + lease + 100);
    ws_client b;
    json_t *s = resume(&g_b, &b, id);
    json_decref(s);
    turn_ok(&b, "B meanwhile", 1);
    ws_close(&b);
    /* A's turn ends without being kept: cut when its lease ran out (an error), or
     * answered not durable when its write was refused */
    json_t *done = NULL;
    for (int i = 0; i < 50 && !done; i++) {
        json_t *j = h_read_json(&a, 10000);
        cr_assert(j, "A's turn never ended");
        if (!strcmp(str_of(j, "type"), "done") || !strcmp(str_of(j, "type"), "error"))
            done = j;
        else
            json_decref(j);
    }
    cr_assert(done);
    cr_assert(!json_is_true(json_object_get(done, "durable")),
              "A's late write was acknowledged durable over B's turn");
    if (!strcmp(str_of(done, "type"), "error"))
        cr_assert(strstr(str_of(done, "message"), "lease ran out"), "%s", str_of(done, "message"));
    else
        cr_assert(strstr(str_of(done, "durable_error"), "not written"), "%s",
                  str_of(done, "durable_error"));
    json_decref(done);
    px_heal(&g_px);
    /* a stale copy is no store failure: A stays healthy */
    char *body = NULL;
    cr_assert_eq(h_get(&g_a, "/healthz", NULL, &body), 200, "%s", body ? body : "");
    free(body);
    ws_close(&a);
    nap_ms(300);
    char users[512];
    cr_assert_eq(stored_on_b(id, users, sizeof users), 2);
    cr_assert_str_eq(users, "Once upon a time\nB meanwhile\n", "B's durable turn survives");
}

/* A long conversation on A whose next turn runs past A's lease (Redis gets A's commands
 * late, longer than the lease): the turn is cut with a lease error and leaves nothing
 * behind, neither on A nor in the store. The next message prefills only its own tokens
 * (a whole re-prefill is over max_prompt_tokens), and every node sees the conversation
 * as it was after its last completed turn, then with the new one. */
Test(fencing, a_turn_cut_by_its_lease_leaves_the_session_at_its_last_completed_turn)
{
    const int lease = 1000, delay = 1500;
    g_more = "--max-prompt-tokens 48";
    ws_client a;
    char id[33];
    first_turn_on_a(lease, &a, id);
    const char *more[] = {"The dog ran", "A bird sang", "The sun rose", "Tom was happy",
                          "She went home"};
    char want[512];
    snprintf(want, sizeof want, "Once upon a time\n");
    for (int i = 0; i < 5; i++) {
        turn_ok(&a, more[i], 1);
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s\n", more[i]);
    }
    px_delay(&g_px, delay);
    json_t *j = h_turn(&a, "The cut turn", 8, NULL);
    cr_assert(j, "no answer to the turn past the lease");
    cr_assert_str_eq(str_of(j, "type"), "error", "a turn ran past its lease: %s",
                     str_of(j, "durable_error"));
    cr_assert(strstr(str_of(j, "message"), "lease ran out") &&
              strstr(str_of(j, "message"), "send it again"), "%s", str_of(j, "message"));
    json_decref(j);
    px_heal(&g_px);
    /* A late write of the cut turn would land by now */
    nap_ms(delay + 300);
    redisReply *t = redis_cmd("GET turns:%s", id);
    cr_assert_eq(t->type, REDIS_REPLY_STRING);
    cr_assert_str_eq(t->str, "6", "the cut turn was written");
    freeReplyObject(t);
    /* A shows the session at its last completed turn */
    char hello[128], users[512];
    snprintf(hello, sizeof hello, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(ws_send_text(&a, hello), 0);
    json_t *sf = h_expect(&a, "session", 10000);
    cr_assert(sf, "A did not resume the session");
    cr_assert_eq(json_integer_value(json_object_get(sf, "turns")), 6);
    user_messages(sf, users, sizeof users);
    cr_assert_str_eq(users, want, "A kept some of the cut turn");
    json_decref(sf);
    /* the next message succeeds: its prefill is its own tokens, not the whole transcript */
    json_t *done = h_turn(&a, "Then it rained", 8, NULL);
    cr_assert(done);
    cr_assert_str_eq(str_of(done, "type"), "done", "the turn after the cut: %s %s",
                     str_of(done, "code"), str_of(done, "message"));
    cr_assert(json_is_true(json_object_get(done, "durable")), "%s", str_of(done, "durable_error"));
    json_decref(done);
    ws_close(&a);
    nap_ms(300);   /* A's release */
    snprintf(want + strlen(want), sizeof want - strlen(want), "Then it rained\n");
    cr_assert_eq(stored_on_b(id, users, sizeof users), 7);
    cr_assert_str_eq(users, want, "B sees the cut turn");
}
