/* A node on Redis whose snapshot write fails for a while (Redis refuses the write: an ACL
 * denies this node's user the snap:* keys, while the lease keys stay writable, so the
 * turn itself runs) retries the write with backoff once Redis takes writes again: the
 * API answer said `durable: false`, /healthz leaves 503 by itself, the snapshot lands in
 * Redis, and the conversation's next turn is durable. And the time to live of a session
 * this node holds attached is renewed: its keys outlive snapshot_ttl. */
#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/daemon/harness.h"

static h_proc g_redis;
static char g_dir[64];

static void redis_up(void)
{
    h_redis_up(&g_redis, g_dir, sizeof g_dir, 0);
}

static void redis_down(void)
{
    h_redis_down(&g_redis, g_dir);
}

TestSuite(cluster_save_retry, .init = redis_up, .fini = redis_down, .timeout = 120);

/* One command on a connection as `user` (NULL: the default user); asserts it worked. */
static void redis_do(const char *user, const char *cmd)
{
    redisContext *r = redisConnect("127.0.0.1", g_redis.port);
    cr_assert(r && !r->err);
    if (user) {
        redisReply *a = redisCommand(r, "AUTH %s pw", user);
        cr_assert(a && a->type == REDIS_REPLY_STATUS, "AUTH %s", user);
        freeReplyObject(a);
    }
    redisReply *rep = redisCommand(r, cmd);
    cr_assert(rep && rep->type != REDIS_REPLY_ERROR, "%s: %s", cmd, rep ? rep->str : r->errstr);
    freeReplyObject(rep);
    redisFree(r);
}

static int redis_exists(const char *key)
{
    redisContext *r = redisConnect("127.0.0.1", g_redis.port);
    cr_assert(r && !r->err);
    redisReply *rep = redisCommand(r, "AUTH admin pw");
    freeReplyObject(rep);
    rep = redisCommand(r, "EXISTS %s", key);
    cr_assert(rep && rep->type == REDIS_REPLY_INTEGER);
    int n = (int)rep->integer;
    freeReplyObject(rep);
    redisFree(r);
    return n;
}

static int health(const kvpd_proc *p)
{
    char *b = NULL;
    int st = h_get(p, "/healthz", NULL, &b);
    free(b);
    return st;
}

Test(cluster_save_retry, a_redis_write_that_failed_is_retried_and_health_recovers)
{
    redis_do(NULL, "ACL SETUSER admin on >pw ~* &* +@all");
    char extra[128];
    snprintf(extra, sizeof extra, "--state-url redis://127.0.0.1:%d/0", g_redis.port);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, extra), 0, "log %s", p.log);
    /* Redis refuses the snapshot keys (the lease keys stay writable: the turn runs). */
    redis_do("admin", "ACL SETUSER default resetkeys ~lease:* ~fence:* ~turns:* ~ver:*");
    char *raw = NULL;
    const char *first = "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
                        "\"max_tokens\":4}";
    json_t *a = h_complete(&p, first, &raw);
    cr_assert(json_is_false(json_object_get(json_object_get(a, "kvpd"), "durable")), "%s", raw);
    cr_assert_str_eq(h_header(raw, "x-kvpd-durable:"), "false", "%s", raw);
    char id[64], key[96];
    snprintf(id, sizeof id, "%s", h_header(raw, "x-session-id:"));
    cr_assert(id[0], "%s", raw);
    free(raw);
    snprintf(key, sizeof key, "snap:%s", id);
    cr_assert_eq(redis_exists(key), 0);
    cr_assert_eq(health(&p), 503, "a turn is unsaved: degraded");
    /* Redis takes writes again; no client does anything: a retry writes the session. */
    redis_do("admin", "ACL SETUSER default allkeys");
    int st = 0;
    for (int i = 0; i < 150 && (st = health(&p)) != 200; i++)
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    cr_assert_eq(st, 200, "/healthz stayed degraded after Redis took writes again (log %s)",
                 p.log);
    cr_assert(kvpd_log_has(&p, "written on retry"), "log %s", p.log);
    cr_assert_eq(redis_exists(key), 1, "the retry did not write the snapshot");
    /* The conversation goes on from that copy, durable again (named: the answer names it). */
    char *body = h_second_turn("Once upon a time", h_reply_of(a), "The dog ran.", 4, id);
    json_decref(a);
    json_t *b = h_complete(&p, body, &raw);
    free(body);
    cr_assert_str_eq(h_header(raw, "x-session-id:"), id, "the conversation was not continued");
    cr_assert(json_is_true(json_object_get(json_object_get(b, "kvpd"), "durable")), "%s", raw);
    json_decref(b);
    free(raw);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}

/* The keys of a session this node holds attached keep living past snapshot_ttl (the
 * store's thread renews their time to live); a released session's keys expire. */
Test(cluster_save_retry, the_keys_of_an_attached_session_outlive_snapshot_ttl)
{
    redis_do(NULL, "ACL SETUSER admin on >pw ~* &* +@all");
    char extra[160];
    snprintf(extra, sizeof extra, "--state-url redis://127.0.0.1:%d/0 --idle-timeout 2 "
             "--snapshot-ttl 2", g_redis.port);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, extra), 0, "log %s", p.log);
    ws_client c, d;
    char id[80], gone[80], key[128];
    ws_client *cs[] = {&c, &d};
    char *ids[] = {id, gone};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(h_connect(&p, cs[i]), 0);
        cr_assert_eq(ws_send_text(cs[i], "{\"type\":\"hello\"}"), 0);
        json_t *s = h_expect(cs[i], "session", 5000);
        cr_assert(s);
        snprintf(ids[i], 80, "%s", json_string_value(json_object_get(s, "id")));
        json_decref(s);
        json_t *done = h_turn(cs[i], "Once upon a time", 4, NULL);
        cr_assert(done && json_is_true(json_object_get(done, "durable")));
        json_decref(done);
    }
    ws_close(&d);
    double closed = ws_now_ms();
    /* The released session is parked after the idle timeout; from then on its keys are not
     * renewed and expire a time to live later (how much later depends on the sweeps: up
     * to 15 s under load). The attached one is looked at no sooner than 4.5 s after the
     * close, more than twice the time to live after its last write. */
    snprintf(key, sizeof key, "snap:%s", gone);
    while (redis_exists(key) && ws_now_ms() - closed < 15000)
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    cr_assert_eq(redis_exists(key), 0, "the released session's snapshot did not expire");
    while (ws_now_ms() - closed < 4500)
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    snprintf(key, sizeof key, "snap:%s", id);
    cr_assert_eq(redis_exists(key), 1, "the attached session's snapshot expired (log %s)",
                 p.log);
    h_turn_ok(&c, "and then", 4);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}
