/* The Redis store's bounds per tenant (max_state_bytes_per_tenant and
 * max_state_snapshots_per_tenant), against a redis-server this test starts and two
 * nodes sharing it: a tenant flooding sessions through both nodes stays within its
 * bounds (its least recently written snapshots go, counted in over_quota), another
 * tenant's snapshots all survive and load, and a snapshot that a node leases or holds
 * live is never deleted. */
#include <criterion/criterion.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/store.h"
#include "tests/daemon/harness.h"

static char cache[2048];
static kvp_snapshot_msg msgs[2] = {{1, "hello", 5, 0}, {0, "hi there", 8, 3}};
static int tokens[6] = {1, 2, 3, 4, 5, 6};

H_REDIS_DB_FIXTURE(3)

static kvp_store *open_node(const char *node, uint64_t bytes_max, int snaps_max)
{
    char url[64], err[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/3", g_redis.port);
    kvp_store_params p = {.state_url = url, .ttl_s = 3600, .lease_ms = 5000, .node_id = node,
                          .tenant_bytes_max = bytes_max, .tenant_snaps_max = snaps_max};
    kvp_store *st = NULL;
    cr_assert_eq(kvp_store_open(&st, &p, err, sizeof err), 0, "%s", err);
    return st;
}

static void fake(kvp_snapshot *s, const char *id, const char *tenant)
{
    memset(s, 0, sizeof *s);
    snprintf(s->id, sizeof s->id, "%s", id);
    snprintf(s->tenant, sizeof s->tenant, "%s", tenant);
    snprintf(s->ident.model_name, sizeof s->ident.model_name, "test-model");
    snprintf(s->ident.policy_name, sizeof s->ident.policy_name, "streaming");
    s->turns = 1;
    s->msgs = msgs;
    s->n_msgs = 2;
    s->tokens = tokens;
    s->n_tokens = 6;
    s->n_cached = 6;
    s->cache = cache;
    s->cache_len = sizeof cache;
}

static long long rint_cmd(const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(g_rc, fmt, arg);
    cr_assert(r && r->type == REDIS_REPLY_INTEGER, "redis: %s", r && r->str ? r->str : "no reply");
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

static int stored(const char *id)
{
    return rint_cmd("EXISTS snap:%s", id) == 1;
}

/* A session of the tenant written by st, then let go as a parked one-shot session is:
 * its lease gone (as when it runs out) and no longer live on the node. */
static size_t put_parked(kvp_store *st, const char *id, const char *tenant)
{
    kvp_snapshot s;
    fake(&s, id, tenant);
    uint64_t ver = 0;
    size_t bytes = 0;
    char err[256];
    cr_assert_eq(kvp_store_put(st, &s, &ver, &bytes, err, sizeof err), 0, "%s", err);
    kvp_store_lease_drop(st, id);
    freeReplyObject(redisCommand(g_rc, "DEL lease:%s", id));
    cr_assert_eq(kvp_store_set_live(st, NULL, 0), 0);
    nanosleep(&(struct timespec){0, 2000000L}, NULL);   /* distinct write times */
    return bytes;
}

/* How many of the tenant's snapshots Redis holds, counted from the keys themselves. */
static int stored_of(const char *tenant, char ids[][40], int n)
{
    int count = 0;
    for (int i = 0; i < n; i++) {
        redisReply *r = redisCommand(g_rc, "GET tenant:%s", ids[i]);
        int mine = r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, tenant);
        freeReplyObject(r);
        count += mine && stored(ids[i]);
    }
    return count;
}

static uint64_t over_quota(kvp_store *st)
{
    kvp_store_stats ss;
    kvp_store_stats_get(st, &ss);
    return ss.over_quota;
}

static void loads(kvp_store *st, const char *id, const char *tenant)
{
    kvp_snapshot back;
    uint64_t ver;
    size_t jb;
    int clean;
    char err[256], jerr[64];
    cr_assert_eq(kvp_store_get(st, id, &back, &ver, &jb, &clean, jerr, sizeof jerr, err,
                               sizeof err), 0, "%s: %s", id, err);
    cr_assert_str_eq(back.tenant, tenant);
    kvp_snapshot_free(&back);
}

Test(store_redis_quota, a_flooding_tenant_stays_within_its_snapshot_count_across_two_nodes,
     .init = redis_up, .fini = redis_down)
{
    kvp_store *n1 = open_node("node-1", 0, 5), *n2 = open_node("node-2", 0, 5);
    char b[3][40], a[24][40];
    for (int i = 0; i < 3; i++) {
        snprintf(b[i], sizeof b[i], "bbbb%028d", i);
        put_parked(n2, b[i], "b");
    }
    for (int i = 0; i < 24; i++) {
        snprintf(a[i], sizeof a[i], "aaaa%028d", i);
        put_parked(i % 2 ? n2 : n1, a[i], "a");
        int n = stored_of("a", a, i + 1);
        cr_assert_leq(n, 5, "after %d writes tenant a holds %d snapshots (bound 5)", i + 1, n);
        int counted;
        kvp_store_quota_tenant_bytes(n1, "a", &counted);
        cr_assert_eq(counted, n, "Redis counts %d of a's snapshots, %d are stored", counted, n);
    }
    /* least recently used first: the five newest are the ones left */
    for (int i = 19; i < 24; i++)
        cr_assert(stored(a[i]), "a's newest snapshot %d was deleted", i);
    /* a read is a use: the oldest of them, read, outlives the next four */
    loads(n2, a[19], "a");
    char more[4][40];
    for (int i = 0; i < 4; i++) {
        snprintf(more[i], sizeof more[i], "aaaz%028d", i);
        put_parked(n1, more[i], "a");
    }
    cr_assert(stored(a[19]), "the snapshot just read was deleted before older ones");
    cr_assert(!stored(a[20]), "the least recently used one stayed");
    cr_assert_eq(kvp_store_set_live(n2, NULL, 0), 0);
    cr_assert_eq(over_quota(n1) + over_quota(n2), 23, "deleted: %llu + %llu",
                 (unsigned long long)over_quota(n1), (unsigned long long)over_quota(n2));
    for (int i = 0; i < 3; i++)
        loads(n1, b[i], "b");
    int nb;
    kvp_store_quota_tenant_bytes(n2, "b", &nb);
    cr_assert_eq(nb, 3);
    kvp_store_close(n1);
    kvp_store_close(n2);
}

Test(store_redis_quota, a_flooding_tenant_stays_within_its_bytes_and_removal_uncounts,
     .init = redis_up, .fini = redis_down)
{
    kvp_store *probe = open_node("probe", 0, 0);
    size_t one = put_parked(probe, "cccc0000", "c");
    char err[256];
    cr_assert_eq(kvp_store_remove(probe, "cccc0000", err, sizeof err), 0, "%s", err);
    int nc;
    cr_assert_eq(kvp_store_quota_tenant_bytes(probe, "c", &nc), 0, "a removal is uncounted");
    cr_assert_eq(nc, 0);
    kvp_store_close(probe);

    uint64_t bound = 3 * (uint64_t)one + one / 2;
    kvp_store *n1 = open_node("node-1", bound, 0), *n2 = open_node("node-2", bound, 0);
    put_parked(n1, "bbbb0000", "b");
    char a[16][40];
    for (int i = 0; i < 16; i++) {
        snprintf(a[i], sizeof a[i], "aaaa%028d", i);
        put_parked(i % 2 ? n2 : n1, a[i], "a");
        uint64_t used = kvp_store_quota_tenant_bytes(n2, "a", NULL);
        cr_assert_leq(used, bound, "tenant a holds %llu bytes (bound %llu)",
                      (unsigned long long)used, (unsigned long long)bound);
        cr_assert_leq(stored_of("a", a, i + 1), 3);
    }
    cr_assert_eq(stored_of("a", a, 16), 3);
    loads(n2, "bbbb0000", "b");
    kvp_store_close(n1);
    kvp_store_close(n2);
}

Test(store_redis_quota, a_leased_or_live_snapshot_is_never_deleted_for_the_bound,
     .init = redis_up, .fini = redis_down)
{
    kvp_store *n1 = open_node("node-1", 0, 2), *n2 = open_node("node-2", 0, 2);
    kvp_snapshot s;
    uint64_t ver = 0;
    size_t bytes;
    char err[256];
    /* node 2 serves this one: it keeps the lease */
    fake(&s, "aaaaheld", "a");
    cr_assert_eq(kvp_store_put(n2, &s, &ver, &bytes, err, sizeof err), 0, "%s", err);
    /* node 1 holds this one in memory, its lease run out */
    fake(&s, "aaaalive", "a");
    ver = 0;
    cr_assert_eq(kvp_store_put(n1, &s, &ver, &bytes, err, sizeof err), 0, "%s", err);
    freeReplyObject(redisCommand(g_rc, "DEL lease:%s", "aaaalive"));
    const char *live[] = {"aaaalive"};
    for (int i = 0; i < 8; i++) {
        char id[40];
        snprintf(id, sizeof id, "aaaa%028d", i);
        fake(&s, id, "a");
        ver = 0;
        cr_assert_eq(kvp_store_set_live(n1, live, 1), 0);
        cr_assert_eq(kvp_store_put(n1, &s, &ver, &bytes, err, sizeof err), 0, "%s", err);
        freeReplyObject(redisCommand(g_rc, "DEL lease:%s", id));
        cr_assert(stored("aaaaheld"), "a snapshot leased by node 2 was deleted");
        cr_assert(stored("aaaalive"), "a snapshot node 1 holds live was deleted");
        cr_assert(stored(id), "the snapshot just written was deleted");
    }
    cr_assert_geq(over_quota(n1), 6, "the unprotected ones went: %llu",
                  (unsigned long long)over_quota(n1));
    int n;
    kvp_store_quota_tenant_bytes(n1, "a", &n);
    cr_assert_leq(n, 3, "only the protected ones and the last written may pass the bound: %d", n);
    kvp_store_close(n1);
    kvp_store_close(n2);
}
