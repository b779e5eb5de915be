/* The snapshot store (store/store.h): redis:// URLs, the directory's time to live,
 * and the Redis store against a redis-server this test starts (same bytes as a file,
 * damaged values moved aside, leases that only their node can renew or release). */
#include <criterion/criterion.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "tests/daemon/harness.h"

static void nap_ms(int ms)
{
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

/* A snapshot with a small fake cache blob (the store never decodes the cache). */
static void fake_snapshot(kvp_snapshot *s, const char *id, int turns)
{
    static char cache[] = "not a real cache, but covered by the checksum";
    static kvp_snapshot_msg msgs[2] = {{1, "hello", 5, 0}, {0, "hi there", 8, 3}};
    static int tokens[6] = {1, 2, 3, 4, 5, 6};
    memset(s, 0, sizeof *s);
    snprintf(s->id, sizeof s->id, "%s", id);
    snprintf(s->ident.model_name, sizeof s->ident.model_name, "test-model");
    s->ident.model_hash = 42;
    snprintf(s->ident.policy_name, sizeof s->ident.policy_name, "streaming");
    s->turns = turns;
    s->msgs = msgs;
    s->n_msgs = 2;
    s->tokens = tokens;
    s->n_tokens = 6;
    s->n_cached = 6;
    s->cache = cache;
    s->cache_len = sizeof cache;
}

Test(store, redis_urls_parse_and_bad_ones_are_refused_with_a_reason)
{
    kvp_redis_url u;
    char err[256];
    cr_assert_eq(kvp_redis_url_parse("redis://127.0.0.1:6380/3", &u, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(u.host, "127.0.0.1");
    cr_assert_eq(u.port, 6380);
    cr_assert_eq(u.db, 3);
    cr_assert_eq(kvp_redis_url_parse("redis://cache.local", &u, err, sizeof err), 0);
    cr_assert_eq(u.port, 6379);
    cr_assert_eq(u.db, 0);
    cr_assert_eq(kvp_redis_url_parse("redis://[::1]:7000/", &u, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(u.host, "::1");
    cr_assert_eq(u.port, 7000);
    const char *bad[] = {"", "http://h:1/0", "redis://", "redis://:6379", "redis://h:0",
                         "redis://h:65536", "redis://h:12ab", "redis://h:-1", "redis://h/x",
                         "redis://h/1/2", "redis://h h", "redis://h/99999999999", "redis://[::1",
                         "redis://h:6379x", "redis://h\n:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        cr_assert_eq(kvp_redis_url_parse(bad[i], &u, err, sizeof err), -EINVAL, "'%s' accepted",
                     bad[i]);
        cr_assert(strstr(err, "state_url"), "no reason for '%s': %s", bad[i], err);
    }
    char longhost[400] = "redis://";
    memset(longhost + 8, 'a', 300);
    cr_assert_eq(kvp_redis_url_parse(longhost, &u, err, sizeof err), -EINVAL);
}

/* The stored version each put descends from, and the one the last get read (each test
 * runs in its own process). */
static uint64_t g_ver, g_got;

static void count_id(void *ctx, const char *id)
{
    (void)id;
    (*(int *)ctx)++;
}

static void age_file(const char *dir, const char *name, int seconds)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct timeval tv[2];
    gettimeofday(&tv[0], NULL);
    tv[0].tv_sec -= seconds;
    tv[1] = tv[0];
    cr_assert_eq(utimes(path, tv), 0, "utimes %s", path);
}

static int file_exists(const char *dir, const char *name)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

Test(store, the_directory_deletes_snapshots_older_than_the_ttl_at_start_and_on_demand)
{
    char dir[64], err[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    kvp_store_params p = {.state_dir = dir, .ttl_s = 1000};
    kvp_store *st;
    cr_assert_eq(kvp_store_open(&st, &p, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(kvp_store_kind(st), "dir");
    const char *ids[] = {"old1", "old2", "fresh"};
    for (int i = 0; i < 3; i++) {
        kvp_snapshot s;
        fake_snapshot(&s, ids[i], 1);
        size_t bytes;
        cr_assert_eq(kvp_store_put(st, &s, &g_ver, &bytes, err, sizeof err), 0, "%s", err);
        cr_assert_gt(bytes, s.cache_len, "a put reports the bytes it wrote");
    }
    int listed = 0;
    cr_assert_eq(kvp_store_list(st, count_id, &listed, err, sizeof err), 3);
    cr_assert_eq(listed, 3);
    kvp_store_close(st);
    age_file(dir, "old1.snap", 2000);
    age_file(dir, "old2.snap", 2000);
    cr_assert_eq(kvp_store_open(&st, &p, err, sizeof err), 0, "%s", err);   /* expires at start */
    cr_assert(!file_exists(dir, "old1.snap") && !file_exists(dir, "old2.snap"));
    cr_assert(file_exists(dir, "fresh.snap"));
    kvp_store_stats ss;
    kvp_store_stats_get(st, &ss);
    cr_assert_eq(ss.expired, 2);
    age_file(dir, "fresh.snap", 999);   /* just inside */
    cr_assert_eq(kvp_store_expire(st, err, sizeof err), 0);
    age_file(dir, "fresh.snap", 1001);
    cr_assert_eq(kvp_store_expire(st, err, sizeof err), 1);
    cr_assert(!file_exists(dir, "fresh.snap"));
    kvp_store_close(st);
    /* ttl 0: kept forever */
    kvp_snapshot s;
    fake_snapshot(&s, "forever", 1);
    p.ttl_s = 0;
    cr_assert_eq(kvp_store_open(&st, &p, err, sizeof err), 0);
    size_t bytes;
    cr_assert_eq(kvp_store_put(st, &s, &g_ver, &bytes, err, sizeof err), 0);
    age_file(dir, "forever.snap", 100000000);
    cr_assert_eq(kvp_store_expire(st, err, sizeof err), 0);
    cr_assert(file_exists(dir, "forever.snap"));
    kvp_store_close(st);
    h_rmdir(dir);
}

/* ---- Redis ---- */

static h_proc g_redis;
static char g_rdir[64];
static redisContext *g_rc;

static void redis_up(void)
{
    h_redis_up(&g_redis, g_rdir, sizeof g_rdir, 0);
    g_rc = redisConnect("127.0.0.1", g_redis.port);
    cr_assert(g_rc && !g_rc->err);
}

static void redis_down(void)
{
    if (g_rc)
        redisFree(g_rc);
    g_rc = NULL;
    h_redis_down(&g_redis, g_rdir);
}

static kvp_store *open_node(const char *node, int lease_ms)
{
    char url[64], err[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/2", g_redis.port);
    kvp_store_params p = {.state_url = url, .ttl_s = 3600, .lease_ms = lease_ms, .node_id = node};
    kvp_store *st = NULL;
    cr_assert_eq(kvp_store_open(&st, &p, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(kvp_store_kind(st), "redis");
    return st;
}

static redisReply *cmd(const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(g_rc, "SELECT 2");
    freeReplyObject(r);
    r = redisCommand(g_rc, fmt, arg);
    cr_assert(r, "redis command failed");
    return r;
}

/* Waits (bounded) for a released lease to leave Redis. */
static void lease_gone(const char *id)
{
    for (int i = 0; i < 50; i++) {
        redisReply *r = cmd("EXISTS lease:%s", id);
        long long n = r->integer;
        freeReplyObject(r);
        if (!n)
            break;
        nap_ms(20);
    }
}

static int take(kvp_store *st, const char *id, int *turns, char *holder)
{
    char err[256];
    int left;
    char h[KVP_STORE_NODE_MAX + 1];
    int rc = kvp_store_lease_take(st, id, turns, &g_got, &left, holder ? holder : h, sizeof h,
                                  err, sizeof err);
    cr_assert_geq(rc, 0, "%s", err);
    if (rc == KVP_LEASE_OTHER)
        cr_assert_gt(left, 0, "the holder's time left is reported");
    return rc;
}

Test(store, redis_keeps_the_same_checksummed_bytes_with_a_ttl, .init = redis_up, .fini = redis_down)
{
    kvp_store *a = open_node("node-a", 5000);
    kvp_snapshot s, back;
    fake_snapshot(&s, "0123456789abcdef0123456789abcdef", 3);
    char err[256], jerr[64];
    size_t bytes, jb;
    int clean;
    cr_assert_eq(kvp_store_put(a, &s, &g_ver, &bytes, err, sizeof err), 0, "%s", err);
    unsigned char *enc;
    size_t len;
    cr_assert_eq(kvp_snapshot_encode(&s, &enc, &len, err, sizeof err), 0);
    cr_assert_eq(bytes, len);
    redisReply *r = cmd("GET snap:%s", s.id);
    cr_assert_eq(r->type, REDIS_REPLY_STRING);
    cr_assert_eq((size_t)r->len, len);
    cr_assert_eq(memcmp(r->str, enc, len), 0, "the value is the snapshot file's bytes");
    freeReplyObject(r);
    free(enc);
    r = cmd("PTTL snap:%s", s.id);
    cr_assert(r->integer > 3000000 && r->integer <= 3600000, "snapshot_ttl is the key's: %lld",
              r->integer);
    freeReplyObject(r);
    cr_assert_eq(kvp_store_get(a, s.id, &back, &g_got, &jb, &clean, jerr, sizeof jerr, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(back.turns, 3);
    cr_assert_eq(back.n_msgs, 2);
    cr_assert_str_eq(back.msgs[1].text, "hi there");
    cr_assert_eq(back.cache_len, s.cache_len);
    cr_assert_eq(memcmp(back.cache, s.cache, s.cache_len), 0);
    kvp_snapshot_free(&back);
    cr_assert(kvp_store_exists(a, s.id));
    cr_assert(!kvp_store_exists(a, "ffffffffffffffffffffffffffffffff"));
    int listed = 0;
    cr_assert_eq(kvp_store_list(a, count_id, &listed, err, sizeof err), 1);
    cr_assert_eq(listed, 1);
    cr_assert_eq(kvp_store_get(a, "ffffffffffffffffffffffffffffffff", &back, &g_got, &jb, &clean, jerr,
                               sizeof jerr, err, sizeof err), -ENOENT);
    /* hostile ids never reach Redis */
    cr_assert_eq(kvp_store_get(a, "../../etc", &back, &g_got, &jb, &clean, jerr, sizeof jerr, err,
                               sizeof err), -EINVAL);
    cr_assert_eq(kvp_store_get(a, "a b*", &back, &g_got, &jb, &clean, jerr, sizeof jerr, err, sizeof err),
                 -EINVAL);
    cr_assert_eq(kvp_store_remove(a, s.id, err, sizeof err), 0);
    cr_assert(!kvp_store_exists(a, s.id));
    kvp_store_close(a);
}

Test(store, a_damaged_redis_value_is_moved_aside_and_never_loaded, .init = redis_up,
     .fini = redis_down)
{
    kvp_store *a = open_node("node-a", 5000);
    kvp_snapshot s, back;
    const char *id = "00000000000000000000000000000001";
    fake_snapshot(&s, id, 1);
    char err[512], jerr[64];
    size_t bytes, jb;
    int clean;
    cr_assert_eq(kvp_store_put(a, &s, &g_ver, &bytes, err, sizeof err), 0, "%s", err);
    /* flip one byte in the middle: the checksum no longer matches */
    redisReply *r = cmd("SETRANGE snap:%s 40 X", id);
    freeReplyObject(r);
    cr_assert_eq(kvp_store_get(a, id, &back, &g_got, &jb, &clean, jerr, sizeof jerr, err, sizeof err),
                 -EBADMSG);
    cr_assert(strstr(err, "checksum") && strstr(err, "moved aside to damaged:"), "%s", err);
    r = cmd("KEYS damaged:%s:*", id);
    cr_assert_eq(r->elements, 1, "one damaged: key");
    freeReplyObject(r);
    cr_assert_eq(kvp_store_get(a, id, &back, &g_got, &jb, &clean, jerr, sizeof jerr, err, sizeof err),
                 -ENOENT, "never loaded again");
    /* truncated and foreign values too */
    r = cmd("SET snap:%s KVPSNAP", id);
    freeReplyObject(r);
    cr_assert_eq(kvp_store_get(a, id, &back, &g_got, &jb, &clean, jerr, sizeof jerr, err, sizeof err),
                 -EBADMSG);
    r = cmd("SET snap:%s hello", id);
    freeReplyObject(r);
    cr_assert_eq(kvp_store_get(a, id, &back, &g_got, &jb, &clean, jerr, sizeof jerr, err, sizeof err),
                 -EBADMSG);
    kvp_store_stats ss;
    kvp_store_stats_get(a, &ss);
    cr_assert_eq(ss.errors, 0, "a damaged value is no store error");
    kvp_store_close(a);
}

Test(store, a_lease_belongs_to_one_node_which_alone_renews_and_releases_it, .init = redis_up,
     .fini = redis_down)
{
    kvp_store *a = open_node("node-a", 600), *b = open_node("node-b", 600);
    const char *id = "00000000000000000000000000000002";
    int turns;
    char holder[KVP_STORE_NODE_MAX + 1];
    cr_assert_eq(take(a, id, &turns, NULL), KVP_LEASE_NEW);
    cr_assert_eq(turns, -1, "nothing stored yet");
    cr_assert_eq(take(a, id, &turns, NULL), KVP_LEASE_HELD);
    cr_assert_eq(take(b, id, &turns, holder), KVP_LEASE_OTHER);
    cr_assert_str_eq(holder, "node-a");
    /* a put by a node without the lease writes nothing */
    kvp_snapshot s;
    fake_snapshot(&s, id, 7);
    char err[256];
    size_t bytes;
    cr_assert_eq(kvp_store_put(b, &s, &g_ver, &bytes, err, sizeof err), -ESTALE);
    cr_assert(!kvp_store_exists(b, id));
    cr_assert_eq(kvp_store_put(a, &s, &g_ver, &bytes, err, sizeof err), 0, "%s", err);
    /* renewed by a's thread while held: still a's after three lease times */
    nap_ms(1800);
    cr_assert_eq(take(b, id, &turns, holder), KVP_LEASE_OTHER);
    /* b cannot release a's lease */
    kvp_store_lease_drop(b, id);
    nap_ms(200);
    redisReply *r = cmd("GET lease:%s", id);
    cr_assert_eq(r->type, REDIS_REPLY_STRING);
    cr_assert_str_eq(r->str, "node-a");
    freeReplyObject(r);
    /* idle: no more renewals, it runs out by itself */
    kvp_store_lease_idle(a, id);
    nap_ms(900);
    cr_assert_eq(take(b, id, &turns, NULL), KVP_LEASE_NEW);
    cr_assert_eq(turns, 7, "the new holder learns the stored turn count");
    cr_assert_eq(take(a, id, &turns, holder), KVP_LEASE_OTHER);
    cr_assert_str_eq(holder, "node-b");
    /* released by its holder: free at once */
    kvp_store_lease_drop(b, id);
    for (int i = 0; i < 50; i++) {
        r = cmd("EXISTS lease:%s", id);
        long long n = r->integer;
        freeReplyObject(r);
        if (!n)
            break;
        nap_ms(20);
    }
    cr_assert_eq(take(a, id, &turns, NULL), KVP_LEASE_NEW);
    /* closing releases what is still held */
    kvp_store_close(a);
    r = cmd("EXISTS lease:%s", id);
    cr_assert_eq(r->integer, 0);
    freeReplyObject(r);
    kvp_store_stats ss;
    kvp_store_stats_get(b, &ss);
    cr_assert_eq(ss.lease_conflicts, 2);
    kvp_store_close(b);
}

Test(store, an_unreachable_redis_is_a_clear_error_at_open_and_a_counted_one_later,
     .init = redis_up, .fini = redis_down)
{
    char url[64], err[256];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", h_free_port());
    kvp_store_params p = {.state_url = url, .ttl_s = 10};
    kvp_store *st = NULL;
    cr_assert_lt(kvp_store_open(&st, &p, err, sizeof err), 0);
    cr_assert_null(st);
    cr_assert(strstr(err, "state_url") && strstr(err, url + 8), "%s", err);
    /* mid-run: the server goes away, calls fail with a message and are counted; it comes
     * back on the same port and the store reconnects */
    kvp_store *a = open_node("node-a", 5000);
    kvp_snapshot s;
    fake_snapshot(&s, "00000000000000000000000000000003", 1);
    size_t bytes;
    int port = g_redis.port;
    h_proc_kill(&g_redis);
    cr_assert_lt(kvp_store_put(a, &s, &g_ver, &bytes, err, sizeof err), 0);
    cr_assert(strstr(err, "redis"), "%s", err);
    kvp_store_stats ss;
    kvp_store_stats_get(a, &ss);
    cr_assert_geq(ss.errors, 1);
    cr_assert_eq(h_redis_start(&g_redis, g_rdir, port, 0), 0);
    cr_assert_eq(kvp_store_put(a, &s, &g_ver, &bytes, err, sizeof err), 0, "%s", err);
    kvp_store_close(a);
}

Test(store, every_redis_write_is_fenced_by_the_lease_token_and_the_stored_version,
     .init = redis_up, .fini = redis_down)
{
    kvp_store *a = open_node("node-a", 600), *b = open_node("node-b", 600);
    const char *id = "00000000000000000000000000000004";
    kvp_snapshot s, back;
    char err[256], jerr[64];
    size_t bytes, jb;
    int clean, turns;
    /* a takes the lease and writes: the version is its token */
    cr_assert_eq(take(a, id, &turns, NULL), KVP_LEASE_NEW);
    uint64_t va = 0, vb = 0;
    fake_snapshot(&s, id, 1);
    cr_assert_eq(kvp_store_put(a, &s, &va, &bytes, err, sizeof err), 0, "%s", err);
    cr_assert_gt(va, 0);
    cr_assert_gt(kvp_store_lease_left_ms(a, id), 0, "a knows its lease lasts");
    cr_assert_eq(kvp_store_lease_left_ms(b, id), 0);
    /* a lets go; b takes it, learns a's version, reads it and writes on */
    kvp_store_lease_drop(a, id);
    lease_gone(id);
    cr_assert_eq(take(b, id, &turns, NULL), KVP_LEASE_NEW);
    cr_assert_eq(g_got, va, "the take reports the stored version");
    cr_assert_eq(kvp_store_get(b, id, &back, &vb, &jb, &clean, jerr, sizeof jerr, err,
                               sizeof err), 0, "%s", err);
    kvp_snapshot_free(&back);
    cr_assert_eq(vb, va);
    fake_snapshot(&s, id, 2);
    cr_assert_eq(kvp_store_put(b, &s, &vb, &bytes, err, sizeof err), 0, "%s", err);
    cr_assert_gt(vb, va, "a later owner's version exceeds the earlier one's");
    /* a's stale copy: refused while b holds the lease, and after it is free too */
    uint64_t stale = va;
    fake_snapshot(&s, id, 2);
    cr_assert_eq(kvp_store_put(a, &s, &stale, &bytes, err, sizeof err), -ESTALE);
    cr_assert(strstr(err, "node-b"), "%s", err);
    kvp_store_lease_drop(b, id);
    lease_gone(id);
    cr_assert_eq(kvp_store_put(a, &s, &stale, &bytes, err, sizeof err), -ESTALE);
    cr_assert(strstr(err, "moved on"), "%s", err);
    redisReply *r = cmd("GET ver:%s", id);
    cr_assert_eq(r->type, REDIS_REPLY_STRING);
    cr_assert_eq(strtoull(r->str, NULL, 10), vb, "b's version stands");
    freeReplyObject(r);
    /* a free lease and the current version: the write takes the lease with a new token */
    uint64_t cur = vb;
    cr_assert_eq(kvp_store_put(a, &s, &cur, &bytes, err, sizeof err), 0, "%s", err);
    cr_assert_gt(cur, vb);
    r = cmd("GET lease:%s", id);
    cr_assert_str_eq(r->str, "node-a");
    freeReplyObject(r);
    /* a release with an older token than the session's newest deletes nothing (here the
     * counter moves on as another take of this node's name would move it) */
    r = cmd("SET fence:%s 999", id);
    freeReplyObject(r);
    kvp_store_lease_drop(a, id);
    nap_ms(200);
    r = cmd("EXISTS lease:%s", id);
    cr_assert_eq(r->integer, 1, "a release under an older token removed the lease");
    freeReplyObject(r);
    kvp_store_close(a);
    kvp_store_close(b);
}

/* a's lease runs out in Redis while a still knows its token (no renewals: idle). */
static void lease_runs_out(kvp_store *a, const char *id, int lease_ms)
{
    kvp_store_lease_idle(a, id);
    nap_ms(lease_ms + 200);
    redisReply *r = cmd("EXISTS lease:%s", id);
    cr_assert_eq(r->integer, 0, "the lease ran out");
    freeReplyObject(r);
}

Test(store, a_write_under_a_token_another_node_took_since_is_refused_on_a_free_lease_too,
     .init = redis_up, .fini = redis_down)
{
    kvp_store *a = open_node("node-a", 500), *b = open_node("node-b", 500);
    const char *id = "00000000000000000000000000000005";
    kvp_snapshot s;
    char err[256];
    size_t bytes;
    int turns;
    cr_assert_eq(take(a, id, &turns, NULL), KVP_LEASE_NEW);
    uint64_t va = 0;
    fake_snapshot(&s, id, 1);
    cr_assert_eq(kvp_store_put(a, &s, &va, &bytes, err, sizeof err), 0, "%s", err);
    /* a's lease runs out; b takes the session (a newer token), writes nothing, lets go */
    lease_runs_out(a, id, 500);
    cr_assert_eq(take(b, id, &turns, NULL), KVP_LEASE_NEW);
    kvp_store_lease_drop(b, id);
    lease_gone(id);
    /* the lease is free and the stored version is still a's, but a's token is not the
     * newest: b held the session in between, so a's write must not land */
    fake_snapshot(&s, id, 2);
    uint64_t v = va;
    cr_assert_eq(kvp_store_put(a, &s, &v, &bytes, err, sizeof err), -ESTALE,
                 "a wrote under a lease b had taken since");
    cr_assert(strstr(err, "taken since"), "%s", err);
    redisReply *r = cmd("GET turns:%s", id);
    cr_assert_str_eq(r->str, "1");
    freeReplyObject(r);
    r = cmd("EXISTS lease:%s", id);
    cr_assert_eq(r->integer, 0, "a refused write takes no lease");
    freeReplyObject(r);
    kvp_store_close(a);
    kvp_store_close(b);
}

Test(store, a_turn_s_own_write_needs_its_lease_still_live, .init = redis_up, .fini = redis_down)
{
    kvp_store *a = open_node("node-a", 500);
    const char *id = "00000000000000000000000000000006";
    kvp_snapshot s;
    char err[256];
    size_t bytes;
    int turns;
    cr_assert_eq(take(a, id, &turns, NULL), KVP_LEASE_NEW);
    uint64_t v = 0;
    fake_snapshot(&s, id, 1);
    cr_assert_eq(kvp_store_put_leased(a, &s, &v, &bytes, err, sizeof err), 0, "%s", err);
    cr_assert_gt(kvp_store_lease_margin_ms(a), 0);
    cr_assert_lt(kvp_store_lease_margin_ms(a), 500);
    /* run out with nobody taking it since: a turn's write is refused ... */
    lease_runs_out(a, id, 500);
    fake_snapshot(&s, id, 2);
    uint64_t w = v;
    cr_assert_eq(kvp_store_put_leased(a, &s, &w, &bytes, err, sizeof err), -ESTALE);
    cr_assert(strstr(err, "ran out"), "%s", err);
    redisReply *r = cmd("GET turns:%s", id);
    cr_assert_str_eq(r->str, "1");
    freeReplyObject(r);
    /* ... where a write of a copy already answered (a retry) takes the free lease again */
    cr_assert_eq(kvp_store_put(a, &s, &w, &bytes, err, sizeof err), 0, "%s", err);
    r = cmd("GET turns:%s", id);
    cr_assert_str_eq(r->str, "2");
    freeReplyObject(r);
    kvp_store_close(a);
}
