/* The Redis store's hints (store/store_redis_hint.c): a hint is read back by the scan of
 * every hint (one longer than the bound skipped unread, keys that are no hint of a
 * session ignored), deleted with its snapshot (a removal, a tenant's bound), and its time
 * to live renewed with the snapshot's while the session is live; the directory store has
 * none. Against a redis-server this test starts. */
#include <criterion/criterion.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/store.h"
#include "tests/daemon/harness.h"

static char cache[512];
static kvp_snapshot_msg msgs[1] = {{1, "hello", 5, 0}};
static int tokens[4] = {1, 2, 3, 4};

H_REDIS_DB_FIXTURE(2)

TestSuite(store_redis_hint, .init = redis_up, .fini = redis_down, .timeout = 60);

static kvp_store *open_node(int snaps_max)
{
    char url[64], err[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/2", g_redis.port);
    kvp_store_params p = {.state_url = url, .ttl_s = 3600, .lease_ms = 5000,
                          .node_id = "node-a", .tenant_snaps_max = snaps_max};
    kvp_store *st = NULL;
    cr_assert_eq(kvp_store_open(&st, &p, err, sizeof err), 0, "%s", err);
    return st;
}

/* A snapshot of the tenant, then let go (no lease, not live), with a hint. */
static void put(kvp_store *st, const char *id, const char *tenant, const char *hint)
{
    kvp_snapshot s;
    memset(&s, 0, sizeof s);
    snprintf(s.id, sizeof s.id, "%s", id);
    snprintf(s.tenant, sizeof s.tenant, "%s", tenant);
    snprintf(s.ident.model_name, sizeof s.ident.model_name, "test-model");
    snprintf(s.ident.policy_name, sizeof s.ident.policy_name, "streaming");
    s.turns = 1;
    s.msgs = msgs;
    s.n_msgs = 1;
    s.tokens = tokens;
    s.n_tokens = 4;
    s.n_cached = 4;
    s.cache = cache;
    s.cache_len = sizeof cache;
    uint64_t ver = 0;
    size_t bytes = 0;
    char err[256];
    cr_assert_eq(kvp_store_put(st, &s, &ver, &bytes, err, sizeof err), 0, "%s", err);
    kvp_store_lease_drop(st, id);
    freeReplyObject(redisCommand(g_rc, "DEL lease:%s", id));
    cr_assert_eq(kvp_store_set_live(st, NULL, 0), 0);
    cr_assert_eq(kvp_store_hint_put(st, id, hint, strlen(hint), err, sizeof err), 0, "%s", err);
    nanosleep(&(struct timespec){0, 2000000L}, NULL);   /* distinct write times */
}

static long long int_cmd(const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(g_rc, fmt, arg);
    cr_assert(r && r->type == REDIS_REPLY_INTEGER, "redis: %s", r && r->str ? r->str : "no reply");
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

typedef struct seen {
    char ids[8][80];
    char vals[8][64];
    int n;
} seen;

static void collect(void *ctx, const char *id, const void *val, size_t len)
{
    seen *s = ctx;
    cr_assert_lt(s->n, 8);
    snprintf(s->ids[s->n], sizeof s->ids[s->n], "%s", id);
    snprintf(s->vals[s->n], sizeof s->vals[s->n], "%.*s", (int)len, (const char *)val);
    s->n++;
}

Test(store_redis_hint, hints_are_read_back_bounded_and_deleted_with_their_snapshot)
{
    kvp_store *st = open_node(0);
    put(st, "s1", "", "line one\n");
    put(st, "s2", "", "line two\n");
    /* one far over the bound, and keys that are no session's hint */
    char big[4096];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char err[256];
    cr_assert_eq(kvp_store_hint_put(st, "s3", big, strlen(big), err, sizeof err), 0);
    freeReplyObject(redisCommand(g_rc, "SET hint:bad/id x"));
    freeReplyObject(redisCommand(g_rc, "HSET hint:s4 a b"));   /* not a string */
    seen s = {0};
    int skipped = -1;
    cr_assert_eq(kvp_store_hint_each(st, 100, collect, &s, &skipped, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(skipped, 2, "the oversized and the hash: %d", skipped);
    int one = !strcmp(s.ids[0], "s1") ? 0 : 1;
    cr_assert_str_eq(s.ids[one], "s1");
    cr_assert_str_eq(s.vals[one], "line one\n");
    cr_assert_str_eq(s.vals[1 - one], "line two\n");
    /* removed with its snapshot */
    cr_assert_eq(kvp_store_remove(st, "s1", err, sizeof err), 0, "%s", err);
    cr_assert_eq(int_cmd("EXISTS hint:%s", "s1"), 0);
    cr_assert_eq(int_cmd("EXISTS hint:%s", "s2"), 1);
    kvp_store_close(st);
}

Test(store_redis_hint, a_tenants_bound_deletes_the_hint_with_the_snapshot)
{
    kvp_store *st = open_node(1);
    put(st, "old", "00000000000000aa", "old line\n");
    put(st, "new", "00000000000000aa", "new line\n");   /* over the bound of one: old goes */
    cr_assert_eq(int_cmd("EXISTS snap:%s", "old"), 0);
    cr_assert_eq(int_cmd("EXISTS hint:%s", "old"), 0);
    cr_assert_eq(int_cmd("EXISTS hint:%s", "new"), 1);
    kvp_store_close(st);
}

Test(store_redis_hint, a_live_sessions_hint_lives_as_long_as_its_snapshot)
{
    kvp_store *st = open_node(0);
    put(st, "live", "", "a line\n");
    freeReplyObject(redisCommand(g_rc, "PEXPIRE hint:live 100000"));
    const char *ids[] = {"live"};
    cr_assert_eq(kvp_store_set_live(st, ids, 1), 0);
    char err[256];
    cr_assert_eq(kvp_store_expire(st, err, sizeof err), 0, "%s", err);
    cr_assert_gt(int_cmd("PTTL hint:%s", "live"), 3000000, "not renewed with the snapshot");
    kvp_store_close(st);
}

Test(store_redis_hint, a_directory_store_has_no_hints)
{
    char dir[128], err[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    kvp_store_params p = {.state_dir = dir};
    kvp_store *st = NULL;
    cr_assert_eq(kvp_store_open(&st, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_store_hint_put(st, "s1", "x", 1, err, sizeof err), -ENOTSUP);
    int skipped;
    cr_assert_eq(kvp_store_hint_each(st, 10, collect, NULL, &skipped, err, sizeof err), -ENOTSUP);
    kvp_store_close(st);
    h_rmdir(dir);
}
