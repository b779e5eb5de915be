/* A flood of one-shot API conversations under one key must not grow its snapshots in
 * Redis past max_state_snapshots_per_tenant: that key's own least recently written
 * parked snapshots are deleted (kvpd_snapshots_over_quota_total), never another key's,
 * so the other key's conversations all resume, after a restart too. */
#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"
#include "tests/security/seclib.h"

TestSuite(security_redis_flood, .timeout = 300);

#define KA "Authorization: Bearer key-a\r\n"
#define KB "Authorization: Bearer key-b\r\n"
#define FLOOD 60
#define BOUND 10
#define MAX_SESSIONS 8
#define NB 3

/* The snap:* keys in database 0. */
static int stored_snaps(redisContext *rc)
{
    redisReply *r = redisCommand(rc, "KEYS snap:*");
    cr_assert(r && r->type == REDIS_REPLY_ARRAY);
    int n = (int)r->elements;
    freeReplyObject(r);
    return n;
}

static int stored(redisContext *rc, const char *id)
{
    redisReply *r = redisCommand(rc, "EXISTS snap:%s", id);
    int yes = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    return yes;
}

Test(security_redis_flood, a_flood_of_one_key_stays_within_its_bound_and_the_other_key_resumes)
{
    char dir[64], args[320];
    h_proc redis;
    h_redis_up(&redis, dir, sizeof dir, 0);
    redisContext *rc = redisConnect("127.0.0.1", redis.port);
    cr_assert(rc && !rc->err);
    snprintf(args, sizeof args, "--api-key key-a,key-b --max-sessions %d "
             "--max-state-snapshots-per-tenant %d --state-url redis://127.0.0.1:%d/0",
             MAX_SESSIONS, BOUND, redis.port);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);

    sec_answer b[NB];
    for (int i = 0; i < NB; i++) {
        char body[160];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"B tale %d: "
                 "a dog.\"}],\"max_tokens\":3}", i);
        b[i] = sec_post(&d, KB, body);
        cr_assert_eq(b[i].status, 200, "%s", b[i].raw);
    }
    sec_flood(&d, KA, 0, FLOOD);
    /* A snapshot just written counts as live until the hub's next list of its sessions
     * (once a second): the next write after it brings the key within its bound. */
    usleep(1500 * 1000);
    sec_answer last = sec_post(&d, KA, "{\"messages\":[{\"role\":\"user\",\"content\":\"Last.\"}],"
                                "\"max_tokens\":2}");
    cr_assert_eq(last.status, 200, "%s", last.raw);
    sec_answer_free(&last);
    /* A's within the bound, plus its sessions still in memory, which may not go. */
    int n = stored_snaps(rc);
    cr_assert_leq(n, NB + BOUND + MAX_SESSIONS, "%d snapshots in Redis after %d one-shot "
                  "conversations of one key (bound %d)", n, FLOOD, BOUND);
    for (int i = 0; i < NB; i++)
        cr_assert(stored(rc, b[i].session), "the other key's conversation %d was deleted", i);
    char *metrics = NULL;
    cr_assert_eq(h_get(&d, "/metrics", NULL, &metrics), 200);
    double deleted = h_metric(metrics, "kvpd_snapshots_over_quota_total");
    free(metrics);
    cr_assert_geq(deleted, FLOOD + 1 - (n - NB), "kvpd_snapshots_over_quota_total %.0f", deleted);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);

    /* After a restart each of B's conversations resumes from its snapshot. */
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    for (int i = 0; i < NB; i++) {
        char user[64];
        snprintf(user, sizeof user, "B tale %d: a dog.", i);
        json_t *req = json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}], s:i, s:s}", "messages",
                                "role", "user", "content", user, "role", "assistant",
                                "content", b[i].reply, "role", "user", "content", "Then?",
                                "max_tokens", 2, "session", b[i].session);
        char *body = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        sec_answer b2 = sec_post(&d, KB, body);
        free(body);
        cr_assert_eq(b2.status, 200, "%s", b2.raw);
        cr_assert_str_eq(b2.session, b[i].session, "B's conversation %d did not resume", i);
        json_t *cached = json_object_get(json_object_get(json_object_get(b2.j, "usage"),
                                                         "prompt_tokens_details"), "cached_tokens");
        cr_assert_gt(json_integer_value(cached), 0, "%s", b2.raw);
        sec_answer_free(&b2);
        sec_answer_free(&b[i]);
    }
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    redisFree(rc);
    h_redis_down(&redis, dir);
}
