/* The Redis store (docs/cluster.md). Keys, in the database the URL names:
 *   snap:<id>              the snapshot's bytes (kvp_snapshot_encode), PX snapshot_ttl
 *   turns:<id>             its turn count
 *   ver:<id>               its version: the fencing token of the lease it was written under
 *   lease:<id>             the node serving the session, PX lease_ms
 *   fence:<id>             the session's fencing token counter (INCR at every take), kept
 *                          at least as long as the snapshot
 *   damaged:<id>:<time>    a snapshot that failed validation, moved aside, never loaded
 *   tenant:<id>            the tenant (API key) the session belongs to, with the snapshot
 *   tsnaps:<tenant>        the tenant's stored session ids, scored by last write (ms)
 *   tbytes:<tenant>        their bytes, and the total under "*" (store/store_redis_quota.c)
 *   hint:<id>              a hint beside the snapshot (store/store_redis_hint.c), deleted
 *                          and renewed with it, written after it
 * Blocking hiredis calls on the calling thread (a worker, or the store's thread), one
 * connection per thread at a time from a small pool: the loop never waits on Redis.
 * A snapshot is written whole at every turn (no journal), by a script that writes only
 * under this node's lease with its newest token (or a free lease) and only over the
 * version the copy descends from, so a stale copy can never overwrite a newer one
 * (docs/cluster.md, "The write protocol"). */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "store/store_impl.h"

#define POOL_MAX 16

typedef struct redis_impl {
    kvp_redis_url url;
    pthread_mutex_t mu;
    redisContext *idle[POOL_MAX];
    int n_idle;
} redis_impl;

/* KEYS: snap, turns, lease, fence, ver, tenant, tsnaps, tbytes. ARGV: bytes, turns, ttl
 * ms (0: none), node, lease ms, token held (0: none), base version (0: none), tenant, id,
 * wall clock ms, the tenant's bytes bound, its snapshots bound (0: none), '1' when the
 * lease must still be live (a turn's own write). Writes only when the token held is still
 * the session's newest (nobody took the lease since; with no token, the lease is free)
 * and the lease is this node's under it, or free when it need not be live; and the stored
 * version is the base (or there is none). A free lease is taken (a new token when none
 * was held). The tenant's totals change in the same script as the snapshot.
 * {1, token, over} written (the version is the token; over: 1 when the tenant is now past
 * a bound); {0, holder} the lease is another's (or an older one of this node's name);
 * {-3, newest} the lease was taken since this node's (the counter is at newest), or ran
 * out when it had to be live ('' then); {-1, version} the stored copy moved on;
 * {-2, tenant} it belongs to another tenant. */
static const char PUT_SCRIPT[] =
    "local h = redis.call('GET', KEYS[3])\n"
    "local f = redis.call('GET', KEYS[4])\n"
    "if h and h ~= ARGV[4] then return {0, h} end\n"
    "if ARGV[6] ~= '0' and f ~= ARGV[6] then return {-3, f or ''} end\n"
    "if h and ARGV[6] == '0' then return {0, h} end\n"
    "if not h and ARGV[13] == '1' then return {-3, ''} end\n"
    "local v = redis.call('GET', KEYS[5])\n"
    "if v and v ~= ARGV[7] then return {-1, v} end\n"
    "local o = redis.call('GET', KEYS[6])\n"
    "if o and o ~= ARGV[8] then return {-2, o} end\n"
    "local t = ARGV[6]\n"
    "if t == '0' then t = tostring(redis.call('INCR', KEYS[4])) end\n"
    "local ttl, lease = tonumber(ARGV[3]), tonumber(ARGV[5])\n"
    "if ttl > 0 then\n"
    "  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)\n"
    "  redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)\n"
    "  redis.call('SET', KEYS[5], t, 'PX', ttl)\n"
    "  redis.call('SET', KEYS[6], ARGV[8], 'PX', ttl)\n"
    "  redis.call('PEXPIRE', KEYS[4], math.max(ttl, lease))\n"
    "else\n"
    "  redis.call('SET', KEYS[1], ARGV[1])\n"
    "  redis.call('SET', KEYS[2], ARGV[2])\n"
    "  redis.call('SET', KEYS[5], t)\n"
    "  redis.call('SET', KEYS[6], ARGV[8])\n"
    "  redis.call('PERSIST', KEYS[4])\n"
    "end\n"
    "redis.call('SET', KEYS[3], ARGV[4], 'PX', lease)\n"
    "local was = tonumber(redis.call('HGET', KEYS[8], ARGV[9]) or '0')\n"
    "redis.call('HSET', KEYS[8], ARGV[9], #ARGV[1])\n"
    "local total = redis.call('HINCRBY', KEYS[8], '*', #ARGV[1] - was)\n"
    "redis.call('ZADD', KEYS[7], ARGV[10], ARGV[9])\n"
    "local bm, sm = tonumber(ARGV[11]), tonumber(ARGV[12])\n"
    "local over = 0\n"
    "if (bm > 0 and total > bm) or (sm > 0 and redis.call('ZCARD', KEYS[7]) > sm) then\n"
    "  over = 1\n"
    "end\n"
    "return {1, t, over}\n";

/* KEYS: lease, fence, turns, ver. ARGV: node, lease ms, token held (0: none), counter ttl
 * ms (0: none). Another node's lease: {0, holder, ms left}. Else a new token (INCR) and
 * the lease for this node: {1, token} when it was this node's under the token held,
 * {2, token} when it was free or an older one of this node's name; with the stored
 * version and turn count ('' none). */
static const char TAKE_SCRIPT[] =
    "local h = redis.call('GET', KEYS[1])\n"
    "if h and h ~= ARGV[1] then return {0, h, redis.call('PTTL', KEYS[1]), '', ''} end\n"
    "local rc = 2\n"
    "if h and redis.call('GET', KEYS[2]) == ARGV[3] then rc = 1 end\n"
    "local t = redis.call('INCR', KEYS[2])\n"
    "if tonumber(ARGV[4]) > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[4])\n"
    "else redis.call('PERSIST', KEYS[2]) end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "return {rc, tostring(t), 0, redis.call('GET', KEYS[4]) or '',\n"
    "        redis.call('GET', KEYS[3]) or ''}\n";

/* KEYS: lease, fence. ARGV: node, lease ms (renew) or '' (release), token. Acts only
 * while the token is the session's newest: a release deletes the lease (compare-and-
 * delete), a renewal extends it, or sets it again when it ran out and nobody took it
 * since. 1 done, 0 not this lease any more. */
static const char OWN_SCRIPT[] =
    "if redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end\n"
    "local h = redis.call('GET', KEYS[1])\n"
    "if ARGV[2] == '' then\n"
    "  if h == ARGV[1] then redis.call('DEL', KEYS[1]) end\n"
    "  return 1\n"
    "end\n"
    "if h and h ~= ARGV[1] then return 0 end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "return 1\n";

static redis_impl *impl(kvp_store *st) { return st->impl; }

static redisContext *connect_one(redis_impl *r, char *err, size_t errlen)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(r->url.host, r->url.port, tv);
    if (!c || c->err) {
        snprintf(err, errlen, "redis %s:%d: %s", r->url.host, r->url.port,
                 c ? c->errstr : "out of memory");
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (r->url.db) {
        redisReply *rep = redisCommand(c, "SELECT %d", r->url.db);
        int ok = rep && rep->type == REDIS_REPLY_STATUS;
        if (!ok)
            snprintf(err, errlen, "redis %s:%d: SELECT %d: %s", r->url.host, r->url.port,
                     r->url.db, rep && rep->type == REDIS_REPLY_ERROR ? rep->str : c->errstr);
        freeReplyObject(rep);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    return c;
}

static redisContext *conn_get(redis_impl *r, char *err, size_t errlen)
{
    pthread_mutex_lock(&r->mu);
    redisContext *c = r->n_idle ? r->idle[--r->n_idle] : NULL;
    pthread_mutex_unlock(&r->mu);
    return c ? c : connect_one(r, err, errlen);
}

/* Back to the pool, unless it failed (a broken connection is dropped: the next call
 * reconnects, e.g. after a Redis restart). */
static void conn_put(redis_impl *r, redisContext *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&r->mu);
    if (!c->err && r->n_idle < POOL_MAX) {
        r->idle[r->n_idle++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    redisFree(c);
}

static void drop_idle(redis_impl *r)
{
    pthread_mutex_lock(&r->mu);
    while (r->n_idle)
        redisFree(r->idle[--r->n_idle]);
    pthread_mutex_unlock(&r->mu);
}

/* One command (argv form, binary-safe), retried once on a fresh connection when the
 * pooled one had gone stale. NULL with a message on failure; an error reply is returned
 * as it is. */
redisReply *kvp_redis_command(kvp_store *st, int argc, const char **argv, const size_t *lens,
                              char *err, size_t errlen)
{
    redis_impl *r = impl(st);
    for (int attempt = 0; attempt < 2; attempt++) {
        redisContext *c = conn_get(r, err, errlen);
        if (!c)
            return NULL;
        redisReply *rep = redisCommandArgv(c, argc, argv, lens);
        if (rep) {
            conn_put(r, c);
            return rep;
        }
        snprintf(err, errlen, "redis %s:%d: %s", r->url.host, r->url.port, c->errstr);
        redisFree(c);
        drop_idle(r);   /* they went stale with it (a restarted server): reconnect */
    }
    return NULL;
}

static void key(char *buf, size_t n, const char *prefix, const char *id)
{
    snprintf(buf, n, "%s:%s", prefix, id);
}

void kvp_redis_key(char *buf, size_t n, const char *prefix, const char *id)
{
    key(buf, n, prefix, id);
}

static int reply_error(redisReply *rep, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "redis %s: %s", what,
             rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    freeReplyObject(rep);
    return -EIO;
}

/* The fencing counter lives at least as long as the snapshot (0: forever). */
static long long fence_ttl_ms(const kvp_store *st)
{
    long long ttl = (long long)(st->ttl_s * 1000);
    return ttl <= 0 ? 0 : ttl > st->lease_ms ? ttl : st->lease_ms;
}

static int redis_put(kvp_store *st, const kvp_snapshot *snap, kvp_store_fence *f,
                     size_t *bytes, char *err, size_t errlen)
{
    unsigned char *buf;
    size_t len;
    int rc = kvp_snapshot_encode(snap, &buf, &len, err, errlen);
    if (rc < 0)
        return rc;
    char ks[96], kt[96], kl[96], kf[96], kv[96], ko[96], kz[96], kb[96], turns[16], ttl[24],
        lease[16], tok[24], base[24], now[24], bmax[24], smax[16];
    key(ks, sizeof ks, "snap", snap->id);
    key(kt, sizeof kt, "turns", snap->id);
    key(kl, sizeof kl, "lease", snap->id);
    key(kf, sizeof kf, "fence", snap->id);
    key(kv, sizeof kv, "ver", snap->id);
    key(ko, sizeof ko, "tenant", snap->id);
    key(kz, sizeof kz, "tsnaps", snap->tenant);
    key(kb, sizeof kb, "tbytes", snap->tenant);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    snprintf(turns, sizeof turns, "%d", snap->turns);
    snprintf(ttl, sizeof ttl, "%lld", (long long)(st->ttl_s * 1000));
    snprintf(lease, sizeof lease, "%d", st->lease_ms);
    snprintf(tok, sizeof tok, "%llu", (unsigned long long)f->token);
    snprintf(base, sizeof base, "%llu", (unsigned long long)f->version);
    snprintf(now, sizeof now, "%lld", (long long)wall.tv_sec * 1000 + wall.tv_nsec / 1000000);
    snprintf(bmax, sizeof bmax, "%llu", (unsigned long long)st->tenant_bytes_max);
    snprintf(smax, sizeof smax, "%d", st->tenant_snaps_max);
    const char *argv[] = {"EVAL", PUT_SCRIPT, "8", ks, kt, kl, kf, kv, ko, kz, kb,
                          (const char *)buf, turns, ttl, st->node, lease, tok, base,
                          snap->tenant, snap->id, now, bmax, smax, f->live ? "1" : "0"};
    enum { ARGC = sizeof argv / sizeof argv[0] };
    size_t lens[ARGC];
    for (int i = 0; i < ARGC; i++)
        lens[i] = strlen(argv[i]);
    lens[11] = len;
    redisReply *rep = kvp_redis_command(st, ARGC, argv, lens, err, errlen);
    free(buf);
    if (!rep)
        return -EIO;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 2 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER ||
        rep->element[1]->type != REDIS_REPLY_STRING)
        return reply_error(rep, "snapshot write", err, errlen);
    long long what = rep->element[0]->integer;
    const char *s = rep->element[1]->str;
    int over = 0;
    if (what == 1) {
        f->token = f->version = strtoull(s, NULL, 10);
        *bytes = len;
        over = rep->elements > 2 && rep->element[2]->type == REDIS_REPLY_INTEGER &&
               rep->element[2]->integer == 1;
        rc = 0;
    } else if (what == 0) {
        snprintf(err, errlen, "snapshot %s: not written: the session's lease is held by %s%s",
                 snap->id, s, strcmp(s, st->node) ? "" : " under a newer token");
        rc = -ESTALE;
    } else if (what == -3) {
        if (s[0])
            snprintf(err, errlen, "snapshot %s: not written: the session's lease was taken "
                     "since this node's (token %s; this node's is %llu)", snap->id, s,
                     (unsigned long long)f->token);
        else
            snprintf(err, errlen, "snapshot %s: not written: this node's lease ran out "
                     "before the write reached the store", snap->id);
        rc = -ESTALE;
    } else if (what == -2) {
        snprintf(err, errlen, "snapshot %s: not written: the stored session belongs to another "
                 "tenant", snap->id);
        rc = -EPERM;
    } else {
        snprintf(err, errlen, "snapshot %s: not written: the stored session moved on "
                 "(version %s; this copy descends from %llu): this copy is stale",
                 snap->id, s, (unsigned long long)f->version);
        rc = -ESTALE;
    }
    freeReplyObject(rep);
    if (over)
        kvp_store_count_over_quota(st, kvp_store_redis_quota_enforce(st, snap->tenant, snap->id));
    return rc;
}

/* KEYS: snap, turns, ver, tenant, tsnaps, tbytes, hint. ARGV: id, the tenant its totals
 * are kept under. Deletes the stored session and takes it out of its tenant's totals:
 * {1, ''}; {0, tenant} when it belongs to another tenant than the one named (nothing
 * deleted). */
static const char REMOVE_SCRIPT[] =
    KVP_REDIS_UNCOUNT_LUA
    "local o = redis.call('GET', KEYS[4])\n"
    "if o and o ~= ARGV[2] then return {0, o} end\n"
    "redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[7])\n"
    "uncount(KEYS[5], KEYS[6], ARGV[1])\n"
    "return {1, ''}\n";

/* Deletes snap, turns, ver, tenant and hint of id and takes it out of its tenant's
 * totals (the tenant read first, checked again by the script). */
static int remove_keys(kvp_store *st, const char *id, char *err, size_t errlen)
{
    char ks[96], kt[96], kv[96], ko[96], kz[96], kb[96], kh[96];
    char tenant[KVP_SNAPSHOT_TENANT_MAX + 1] = "";
    key(kh, sizeof kh, "hint", id);
    key(ks, sizeof ks, "snap", id);
    key(kt, sizeof kt, "turns", id);
    key(kv, sizeof kv, "ver", id);
    key(ko, sizeof ko, "tenant", id);
    const char *get[] = {"GET", ko};
    size_t glens[] = {3, strlen(ko)};
    redisReply *rep = kvp_redis_command(st, 2, get, glens, err, errlen);
    if (!rep)
        return -EIO;
    if (rep->type == REDIS_REPLY_STRING)
        snprintf(tenant, sizeof tenant, "%s", rep->str);
    freeReplyObject(rep);
    for (int attempt = 0; attempt < 2; attempt++) {
        key(kz, sizeof kz, "tsnaps", tenant);
        key(kb, sizeof kb, "tbytes", tenant);
        const char *argv[] = {"EVAL", REMOVE_SCRIPT, "7", ks, kt, kv, ko, kz, kb, kh, id,
                              tenant};
        enum { ARGC = sizeof argv / sizeof argv[0] };
        size_t lens[ARGC];
        for (int i = 0; i < ARGC; i++)
            lens[i] = strlen(argv[i]);
        rep = kvp_redis_command(st, ARGC, argv, lens, err, errlen);
        if (!rep)
            return -EIO;
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_INTEGER ||
            rep->element[1]->type != REDIS_REPLY_STRING)
            return reply_error(rep, "remove", err, errlen);
        int done = rep->element[0]->integer == 1;
        snprintf(tenant, sizeof tenant, "%s", rep->element[1]->str);
        freeReplyObject(rep);
        if (done)
            return 0;
    }
    snprintf(err, errlen, "remove %s: its tenant kept changing", id);
    return -EAGAIN;
}

/* RENAME snap:<id> to damaged:<id>:<unix time> (it keeps its time to live); the rest of
 * the session's keys go, and it leaves its tenant's totals. */
static void move_aside(kvp_store *st, const char *id, char *err, size_t errlen)
{
    char ks[96], kd[128], derr[128];
    key(ks, sizeof ks, "snap", id);
    snprintf(kd, sizeof kd, "damaged:%s:%lld", id, (long long)time(NULL));
    const char *argv[] = {"RENAME", ks, kd};
    size_t lens[] = {6, strlen(ks), strlen(kd)};
    redisReply *rep = kvp_redis_command(st, 3, argv, lens, derr, sizeof derr);
    size_t used = strlen(err);
    if (rep && rep->type == REDIS_REPLY_STATUS)
        snprintf(err + used, errlen - used, "; moved aside to %s", kd);
    else
        snprintf(err + used, errlen - used, "; could not move it aside: %s",
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : derr);
    freeReplyObject(rep);
    (void)remove_keys(st, id, derr, sizeof derr);
}

/* A read counts as a use for the tenant's bounds: its entry's score becomes now (only
 * when it has one; a failure costs only the order). */
static void touch(kvp_store *st, const char *tenant, const char *id)
{
    if (!st->tenant_bytes_max && !st->tenant_snaps_max)
        return;
    char kz[96], now[24], err[128];
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    key(kz, sizeof kz, "tsnaps", tenant);
    snprintf(now, sizeof now, "%lld", (long long)wall.tv_sec * 1000 + wall.tv_nsec / 1000000);
    const char *argv[] = {"ZADD", kz, "XX", now, id};
    size_t lens[5];
    for (int i = 0; i < 5; i++)
        lens[i] = strlen(argv[i]);
    freeReplyObject(kvp_redis_command(st, 5, argv, lens, err, sizeof err));
}

static int redis_get(kvp_store *st, const char *id, kvp_snapshot *out, uint64_t *version,
                     size_t *journal_bytes, int *journal_clean, char *jerr, size_t jerrlen,
                     char *err, size_t errlen)
{
    (void)journal_bytes;
    (void)journal_clean;
    (void)jerr;
    (void)jerrlen;
    memset(out, 0, sizeof *out);
    if (!kvp_snapshot_id_valid(id)) {
        snprintf(err, errlen, "invalid session id");
        return -EINVAL;
    }
    /* the bytes and their version together (MGET is atomic) */
    char ks[96], kv[96];
    key(ks, sizeof ks, "snap", id);
    key(kv, sizeof kv, "ver", id);
    const char *argv[] = {"MGET", ks, kv};
    size_t lens[] = {4, strlen(ks), strlen(kv)};
    redisReply *all = kvp_redis_command(st, 3, argv, lens, err, errlen);
    if (!all)
        return -EIO;
    if (all->type != REDIS_REPLY_ARRAY || all->elements != 2)
        return reply_error(all, "snapshot read", err, errlen);
    redisReply *rep = all->element[0], *ver = all->element[1];
    if (rep->type == REDIS_REPLY_NIL) {
        freeReplyObject(all);
        snprintf(err, errlen, "no snapshot for session %s in redis %s", id, st->where);
        return -ENOENT;
    }
    if (rep->type != REDIS_REPLY_STRING) {
        freeReplyObject(all);
        snprintf(err, errlen, "redis snapshot read: unexpected reply");
        return -EIO;
    }
    unsigned char *buf = malloc(rep->len ? rep->len : 1);
    if (!buf) {
        freeReplyObject(all);
        snprintf(err, errlen, "snapshot %s: out of memory", id);
        return -ENOMEM;
    }
    memcpy(buf, rep->str, rep->len);
    size_t len = rep->len;
    if (ver->type == REDIS_REPLY_STRING)
        *version = strtoull(ver->str, NULL, 10);
    freeReplyObject(all);
    int rc = kvp_snapshot_decode(buf, len, id, out, err, errlen);
    if (rc == -EBADMSG)
        move_aside(st, id, err, errlen);
    if (rc == 0)
        touch(st, out->tenant, id);
    return rc;
}

static int redis_exists(kvp_store *st, const char *id)
{
    char ks[96], err[128];
    if (!kvp_snapshot_id_valid(id))
        return 0;
    key(ks, sizeof ks, "snap", id);
    const char *argv[] = {"EXISTS", ks};
    size_t lens[] = {6, strlen(ks)};
    redisReply *rep = kvp_redis_command(st, 2, argv, lens, err, sizeof err);
    int yes = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
    freeReplyObject(rep);
    return yes;
}

static int redis_remove(kvp_store *st, const char *id, char *err, size_t errlen)
{
    if (!kvp_snapshot_id_valid(id)) {
        snprintf(err, errlen, "invalid session id");
        return -EINVAL;
    }
    return remove_keys(st, id, err, errlen);
}

int kvp_redis_scan(kvp_store *st, const char *prefix, int (*fn)(void *ctx, const char *id),
                   void *ctx, char *err, size_t errlen)
{
    char cursor[32] = "0", match[64];
    size_t skip = strlen(prefix) + 1;
    snprintf(match, sizeof match, "%s:*", prefix);
    int count = 0, rc = 0;
    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", match, "COUNT", "256"};
        size_t lens[6];
        for (int i = 0; i < 6; i++)
            lens[i] = strlen(argv[i]);
        redisReply *rep = kvp_redis_command(st, 6, argv, lens, err, errlen);
        if (!rep)
            return -EIO;
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_STRING ||
            rep->element[1]->type != REDIS_REPLY_ARRAY)
            return reply_error(rep, "SCAN", err, errlen);
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        redisReply *keys = rep->element[1];
        for (size_t i = 0; i < keys->elements && rc == 0; i++) {
            const redisReply *k = keys->element[i];
            if (k->type == REDIS_REPLY_STRING && k->len > skip && strlen(k->str) == k->len &&
                kvp_snapshot_id_valid(k->str + skip)) {
                rc = fn(ctx, k->str + skip);
                count++;
            }
        }
        freeReplyObject(rep);
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    return rc < 0 ? rc : count;
}

typedef struct list_ctx {
    void (*fn)(void *ctx, const char *id);
    void *ctx;
} list_ctx;

static int list_one(void *ctx, const char *id)
{
    const list_ctx *l = ctx;
    l->fn(l->ctx, id);
    return 0;
}

static int redis_list(kvp_store *st, void (*fn)(void *ctx, const char *id), void *ctx,
                      char *err, size_t errlen)
{
    list_ctx l = {fn, ctx};
    return kvp_redis_scan(st, "snap", list_one, &l, err, errlen);
}

/* KEYS: snap, turns, ver, fence, tenant, hint. ARGV: ttl ms, the counter's ttl ms. The
 * time to live of a stored session starts again (keys that have expired stay gone). */
static const char LIVE_SCRIPT[] =
    "if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 1 then\n"
    "  redis.call('PEXPIRE', KEYS[2], ARGV[1])\n"
    "  redis.call('PEXPIRE', KEYS[3], ARGV[1])\n"
    "  redis.call('PEXPIRE', KEYS[4], ARGV[2])\n"
    "  redis.call('PEXPIRE', KEYS[5], ARGV[1])\n"
    "  redis.call('PEXPIRE', KEYS[6], ARGV[1])\n"
    "end\n"
    "return 1\n";

/* The keys carry their own time to live; a session this node holds live has it renewed
 * here at every sweep (a quarter of the time to live apart, at most an hour), so it
 * never expires while in memory or attached however long it stays idle. Pipelined, one
 * script per session. Returns 0 (nothing deleted) or -EIO. */
static int redis_expire(kvp_store *st, char *err, size_t errlen)
{
    if (st->ttl_s <= 0)
        return 0;
    kvp_store_id *ids;
    int n = kvp_store_live_copy(st, &ids);
    if (n == 0)
        return 0;
    redis_impl *r = impl(st);
    redisContext *c = conn_get(r, err, errlen);
    if (!c) {
        free(ids);
        return -EIO;
    }
    char ttl[24], fttl[24];
    snprintf(ttl, sizeof ttl, "%lld", (long long)(st->ttl_s * 1000));
    snprintf(fttl, sizeof fttl, "%lld", fence_ttl_ms(st));
    for (int i = 0; i < n; i++) {
        char ks[96], kt[96], kv[96], kf[96], ko[96], kh[96];
        key(kh, sizeof kh, "hint", ids[i]);
        key(ks, sizeof ks, "snap", ids[i]);
        key(kt, sizeof kt, "turns", ids[i]);
        key(kv, sizeof kv, "ver", ids[i]);
        key(kf, sizeof kf, "fence", ids[i]);
        key(ko, sizeof ko, "tenant", ids[i]);
        const char *argv[] = {"EVAL", LIVE_SCRIPT, "6", ks, kt, kv, kf, ko, kh, ttl, fttl};
        size_t lens[11];
        for (int j = 0; j < 11; j++)
            lens[j] = strlen(argv[j]);
        redisAppendCommandArgv(c, 11, argv, lens);
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        void *rep = NULL;
        if (redisGetReply(c, &rep) != REDIS_OK) {
            snprintf(err, errlen, "renewing the time to live of %d live session(s): %s", n,
                     c->errstr);
            rc = -EIO;
        } else if (((redisReply *)rep)->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "renewing the time to live of session %.8s: %s", ids[i],
                     ((redisReply *)rep)->str);
            rc = -EIO;
            /* the rest of the pipeline is read so the connection stays usable */
            for (int k = i + 1; k < n; k++) {
                void *more = NULL;
                if (redisGetReply(c, &more) != REDIS_OK)
                    break;
                freeReplyObject(more);
            }
        }
        freeReplyObject(rep);
    }
    conn_put(r, c);
    free(ids);
    if (rc < 0)
        kvp_store_count_error(st);
    return rc;
}

static int redis_lease_take(kvp_store *st, const char *id, uint64_t *token, int *stored_turns,
                            uint64_t *stored_version, int *left_ms, char *holder,
                            size_t holder_len, char *err, size_t errlen)
{
    if (!kvp_snapshot_id_valid(id)) {
        snprintf(err, errlen, "invalid session id");
        return -EINVAL;
    }
    char kl[96], kf[96], kt[96], kv[96], lease[16], tok[24], fttl[24];
    key(kl, sizeof kl, "lease", id);
    key(kf, sizeof kf, "fence", id);
    key(kt, sizeof kt, "turns", id);
    key(kv, sizeof kv, "ver", id);
    snprintf(lease, sizeof lease, "%d", st->lease_ms);
    snprintf(tok, sizeof tok, "%llu", (unsigned long long)*token);
    snprintf(fttl, sizeof fttl, "%lld", fence_ttl_ms(st));
    const char *argv[] = {"EVAL", TAKE_SCRIPT, "4", kl, kf, kt, kv, st->node, lease, tok, fttl};
    enum { ARGC = sizeof argv / sizeof argv[0] };
    size_t lens[ARGC];
    for (int i = 0; i < ARGC; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = kvp_redis_command(st, ARGC, argv, lens, err, errlen);
    if (!rep)
        return -EIO;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 5)
        return reply_error(rep, "lease", err, errlen);
    for (int i = 0; i < 5; i++)
        if (rep->element[i]->type != (i == 0 || i == 2 ? REDIS_REPLY_INTEGER : REDIS_REPLY_STRING))
            return reply_error(rep, "lease", err, errlen);
    int rc = (int)rep->element[0]->integer;
    const char *s = rep->element[1]->str;
    if (rc == KVP_LEASE_OTHER) {
        snprintf(holder, holder_len, "%s", s);
        *left_ms = rep->element[2]->integer > 0 ? (int)rep->element[2]->integer : 0;
    } else {
        *token = strtoull(s, NULL, 10);
        if (rep->element[3]->str[0])
            *stored_version = strtoull(rep->element[3]->str, NULL, 10);
        if (rep->element[4]->str[0])
            *stored_turns = atoi(rep->element[4]->str);
    }
    freeReplyObject(rep);
    return rc;
}

/* Pipelined: one round trip for all of them. */
static void redis_lease_batch(kvp_store *st, const kvp_lease_ent *ents, int n, int release,
                              signed char *res)
{
    redis_impl *r = impl(st);
    char err[160], lease[16];
    snprintf(lease, sizeof lease, "%d", st->lease_ms);
    memset(res, -1, (size_t)n);
    redisContext *c = conn_get(r, err, sizeof err);
    if (!c) {
        kvp_store_count_error(st);
        kvpd_log("warning", "leases: %s", err);
        return;
    }
    for (int i = 0; i < n; i++) {
        char kl[96], kf[96], tok[24];
        key(kl, sizeof kl, "lease", ents[i].id);
        key(kf, sizeof kf, "fence", ents[i].id);
        snprintf(tok, sizeof tok, "%llu", (unsigned long long)ents[i].token);
        const char *argv[] = {"EVAL", OWN_SCRIPT, "2", kl, kf, st->node, release ? "" : lease,
                              tok};
        size_t lens[8];
        for (int j = 0; j < 8; j++)
            lens[j] = strlen(argv[j]);
        redisAppendCommandArgv(c, 8, argv, lens);
    }
    int failed = 0;
    for (int i = 0; i < n; i++) {
        void *rep = NULL;
        if (redisGetReply(c, &rep) != REDIS_OK) {
            failed = 1;
            break;
        }
        const redisReply *rr = rep;
        if (rr->type == REDIS_REPLY_INTEGER)
            res[i] = rr->integer == 1;
        freeReplyObject(rep);
    }
    if (failed) {
        kvp_store_count_error(st);
        kvpd_log("warning", "leases: %s %d lease(s): %s", release ? "releasing" : "renewing", n,
                 c->errstr);
    }
    conn_put(r, c);
}

static void redis_close(kvp_store *st)
{
    redis_impl *r = impl(st);
    if (!r)
        return;
    for (int i = 0; i < r->n_idle; i++)
        redisFree(r->idle[i]);
    pthread_mutex_destroy(&r->mu);
    free(r);
    st->impl = NULL;
}

static const kvp_store_ops redis_ops = {
    .put = redis_put, .get = redis_get, .exists = redis_exists, .remove = redis_remove,
    .list = redis_list, .expire = redis_expire, .lease_take = redis_lease_take,
    .lease_batch = redis_lease_batch, .close = redis_close,
};

int kvp_store_redis_open(kvp_store *st, const char *url, char *err, size_t errlen)
{
    redis_impl *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    st->ops = &redis_ops;
    st->impl = r;
    pthread_mutex_init(&r->mu, NULL);
    int rc = kvp_redis_url_parse(url, &r->url, err, errlen);
    if (rc < 0)
        return rc;
    snprintf(st->where, sizeof st->where, "redis://%s:%d/%d", r->url.host, r->url.port,
             r->url.db);
    /* The server must answer now: a node that cannot store turns should not start. */
    const char *argv[] = {"PING"};
    size_t lens[] = {4};
    char cerr[200];
    redisReply *rep = kvp_redis_command(st, 1, argv, lens, cerr, sizeof cerr);
    if (!rep || rep->type != REDIS_REPLY_STATUS) {
        snprintf(err, errlen, "state_url %s: %s", st->where,
                 !rep ? cerr : rep->type == REDIS_REPLY_ERROR ? rep->str : "no PONG");
        freeReplyObject(rep);
        return -ECONNREFUSED;
    }
    freeReplyObject(rep);
    return 0;
}
