/* The state directory's bytes per tenant (kvp_store_params.tenant_bytes_max): after a
 * write takes a tenant past the bound, its least recently used snapshots go (a read
 * counts as a use), never another tenant's, a live one or the one just written; journals
 * count; the files already there are counted at open. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

static char cache[2048];
static kvp_snapshot_msg msgs[2] = {{1, "hello", 5, 0}, {0, "hi there", 8, 3}};
static int tokens[6] = {1, 2, 3, 4, 5, 6};

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

static char g_dir[64];

static int has(const char *id)
{
    char path[256];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s.snap", g_dir, id);
    return stat(path, &sb) == 0;
}

static long long file_size(const char *name)
{
    char path[256];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    return stat(path, &sb) == 0 ? (long long)sb.st_size : 0;
}

static size_t put(kvp_store *st, const char *id, const char *tenant)
{
    kvp_snapshot s;
    fake(&s, id, tenant);
    uint64_t ver = 0;
    size_t bytes = 0;
    char err[256];
    cr_assert_eq(kvp_store_put(st, &s, &ver, &bytes, err, sizeof err), 0, "%s", err);
    return bytes;
}

/* The hub's list of live sessions: only these ids (a put or get adds its own). */
static void live(kvp_store *st, const char *id)
{
    const char *ids[1] = {id};
    cr_assert_eq(kvp_store_set_live(st, ids, id ? 1 : 0), 0);
}

static void nap(void)
{
    nanosleep(&(struct timespec){0, 2000000L}, NULL);
}

Test(store_quota, a_tenant_over_its_bytes_loses_its_own_least_recently_used_snapshots)
{
    char err[256];
    snprintf(g_dir, sizeof g_dir, "/tmp/kvp_quota_XXXXXX");
    cr_assert(mkdtemp(g_dir));
    /* the bound from one snapshot's size: three and a half of them */
    kvp_store_params p0 = {.state_dir = g_dir};
    kvp_store *st;
    cr_assert_eq(kvp_store_open(&st, &p0, err, sizeof err), 0, "%s", err);
    size_t one = put(st, "p0", "a");
    char e2[256];
    cr_assert_eq(kvp_store_remove(st, "p0", e2, sizeof e2), 0);
    kvp_store_close(st);
    cr_assert_gt(one, sizeof cache);
    kvp_store_params p = {.state_dir = g_dir, .tenant_bytes_max = 3 * one + one / 2};
    cr_assert_eq(kvp_store_open(&st, &p, err, sizeof err), 0, "%s", err);

    put(st, "a1", "a");
    nap();
    put(st, "a2", "a");
    nap();
    put(st, "a3", "a");
    nap();
    put(st, "b1", "b");
    nap();
    live(st, "a2");           /* a2 is attached */
    put(st, "a4", "a");       /* a: four snapshots, over: a1 (the oldest) goes */
    cr_assert(!has("a1") && has("a2") && has("a3") && has("a4") && has("b1"));
    cr_assert_eq(kvp_store_quota_tenant_bytes(st, "a", NULL), 3 * one);

    /* a read is a use: a3 read now, a4 is the oldest that may go */
    kvp_snapshot got;
    uint64_t ver;
    size_t jb;
    int clean;
    char jerr[128];
    nap();
    cr_assert_eq(kvp_store_get(st, "a3", &got, &ver, &jb, &clean, jerr, sizeof jerr, err,
                               sizeof err), 0, "%s", err);
    kvp_snapshot_free(&got);
    live(st, "a2");
    nap();
    put(st, "a5", "a");
    cr_assert(!has("a4") && has("a3") && has("a2") && has("a5") && has("b1"));

    /* a journal record counts: a5 grows by more than a snapshot, a3 goes (a2 is live,
     * a5 just written) */
    live(st, "a2");
    static char big[3000];
    kvp_journal_rec rec = {.turns = 2, .msgs_before = 2, .tokens_before = 6, .n_cached = 6,
                           .cache = big, .cache_len = sizeof big};
    size_t journal_bytes = 0, bytes = 0;
    cr_assert_eq(kvp_store_append(st, "a5", &rec, &journal_bytes, &bytes, err, sizeof err), 0,
                 "%s", err);
    cr_assert_gt(bytes, sizeof big);
    cr_assert(!has("a3") && has("a2") && has("a5") && has("b1"));
    long long a_bytes = file_size("a2.snap") + file_size("a5.snap") + file_size("a5.journal");
    cr_assert_eq((long long)kvp_store_quota_tenant_bytes(st, "a", NULL), a_bytes);
    kvp_store_stats ss;
    kvp_store_stats_get(st, &ss);
    cr_assert_eq(ss.over_quota, 3);
    cr_assert_eq(kvp_store_quota_tenant_bytes(st, "b", NULL), one);
    kvp_store_close(st);

    /* counted from the files at open; a's writes past the bound take a2, no longer
     * live, first */
    cr_assert_eq(kvp_store_open(&st, &p, err, sizeof err), 0, "%s", err);
    int n_a;
    cr_assert_eq((long long)kvp_store_quota_tenant_bytes(st, "a", &n_a), a_bytes);
    cr_assert_eq(n_a, 2);
    cr_assert_eq(kvp_store_quota_tenant_bytes(st, "b", NULL), one);
    live(st, NULL);
    put(st, "b2", "b");
    cr_assert(has("a2") && has("b1") && has("b2"), "b's write touched a's snapshots");
    put(st, "a5", "a");       /* whole again: its journal goes, a holds two */
    put(st, "a6", "a");
    nap();
    put(st, "a7", "a");       /* four: a2, the oldest file, goes */
    cr_assert(!has("a2") && has("a5") && has("a6") && has("a7") && has("b1") && has("b2"));
    kvp_store_close(st);

    /* a bound on the count: the oldest go past three, whatever their bytes */
    kvp_store_params pn = {.state_dir = g_dir, .tenant_snaps_max = 3};
    cr_assert_eq(kvp_store_open(&st, &pn, err, sizeof err), 0, "%s", err);
    live(st, NULL);
    for (int i = 0; i < 5; i++) {
        char id[16];
        snprintf(id, sizeof id, "n%d", i);
        put(st, id, "n");
        nap();
        live(st, NULL);
    }
    int n_n;
    kvp_store_quota_tenant_bytes(st, "n", &n_n);
    cr_assert_eq(n_n, 3);
    cr_assert(!has("n0") && !has("n1") && has("n2") && has("n3") && has("n4"));
    cr_assert(has("a5") && has("b1"), "another tenant's snapshots went");
    kvp_store_close(st);

    /* no bound: nothing is deleted */
    cr_assert_eq(kvp_store_open(&st, &p0, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 6; i++) {
        char id[16];
        snprintf(id, sizeof id, "c%d", i);
        put(st, id, "a");
    }
    cr_assert(has("c0") && has("c5") && has("a5"));
    kvp_store_close(st);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    cr_assert_eq(system(cmd), 0);
}
