/* Redis's bytes and snapshots per tenant (store/store_impl.h; docs/cluster.md): the
 * bounds max_state_bytes_per_tenant and max_state_snapshots_per_tenant, enforced as the
 * state directory enforces them, with the totals kept in Redis so that every node
 * sharing it counts the same ones. The write script (store/store_redis.c) updates them
 * and says when its tenant went past a bound; then, from the tenant's least recently
 * written sessions, each one that may go is deleted by a script that checks again, in
 * Redis, that the tenant is still over, that no node holds the session's lease (a node
 * serving it) and that it was not written since it was picked. Sessions this node holds
 * live (in memory or attached) and the one just written are never picked. */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "store/store_impl.h"

/* Candidates read per round, and rounds at most per write (a write usually frees one). */
#define BATCH 64
#define ROUNDS 32

/* KEYS: snap, turns, ver, tenant, lease, tsnaps, tbytes, hint (of the candidate and the
 * tenant). ARGV: id, bytes bound, snapshots bound (0: none), the score it was picked
 * at, '1' to only drop an entry whose snapshot has expired, the tenant. 2: the snapshot had expired,
 * its entry dropped; 1: deleted; 0: it may not go (served by a node, written since,
 * another tenant's, or only expired ones asked for); -1: the tenant fits. */
static const char EVICT_SCRIPT[] =
    KVP_REDIS_UNCOUNT_LUA
    "if redis.call('EXISTS', KEYS[1]) == 0 then\n"
    "  uncount(KEYS[6], KEYS[7], ARGV[1])\n"
    "  return 2\n"
    "end\n"
    "if ARGV[5] == '1' then return 0 end\n"
    "local total = tonumber(redis.call('HGET', KEYS[7], '*') or '0')\n"
    "local bm, sm = tonumber(ARGV[2]), tonumber(ARGV[3])\n"
    "if not ((bm > 0 and total > bm) or (sm > 0 and redis.call('ZCARD', KEYS[6]) > sm)) then\n"
    "  return -1\n"
    "end\n"
    "if redis.call('EXISTS', KEYS[5]) == 1 then return 0 end\n"
    "if redis.call('ZSCORE', KEYS[6], ARGV[1]) ~= ARGV[4] then return 0 end\n"
    "local o = redis.call('GET', KEYS[4])\n"
    "if o and o ~= ARGV[6] then return 0 end\n"
    "redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[8])\n"
    "uncount(KEYS[6], KEYS[7], ARGV[1])\n"
    "return 1\n";

typedef struct cand {
    kvp_store_id id;
    char score[32];
} cand;

/* The tenant's oldest sessions from offset on (at most BATCH); how many, or -1. */
static int oldest(kvp_store *st, const char *kz, int offset, cand *out)
{
    char from[16], to[16], err[200];
    snprintf(from, sizeof from, "%d", offset);
    snprintf(to, sizeof to, "%d", offset + BATCH - 1);
    const char *argv[] = {"ZRANGE", kz, from, to, "WITHSCORES"};
    size_t lens[5];
    for (int i = 0; i < 5; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = kvp_redis_command(st, 5, argv, lens, err, sizeof err);
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        kvpd_log("warning", "max_state_bytes_per_tenant: %s",
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : rep ? "unexpected reply" : err);
        freeReplyObject(rep);
        kvp_store_count_error(st);
        return -1;
    }
    int n = 0;
    for (size_t i = 0; i + 1 < rep->elements && n < BATCH; i += 2) {
        const redisReply *id = rep->element[i], *sc = rep->element[i + 1];
        if (id->type != REDIS_REPLY_STRING || sc->type != REDIS_REPLY_STRING ||
            !kvp_snapshot_id_valid(id->str) || sc->len >= sizeof out[n].score)
            continue;
        snprintf(out[n].id, sizeof out[n].id, "%s", id->str);
        snprintf(out[n].score, sizeof out[n].score, "%s", sc->str);
        n++;
    }
    freeReplyObject(rep);
    return n;
}

/* One EVICT_SCRIPT call; its answer, or -2 when Redis did not give one. */
static int evict(kvp_store *st, const char *tenant, const char *kz, const char *kb,
                 const cand *c, int stale_only)
{
    char ks[96], kt[96], kv[96], ko[96], kl[96], kh[96], bmax[24], smax[16], err[200];
    kvp_redis_key(ks, sizeof ks, "snap", c->id);
    kvp_redis_key(kt, sizeof kt, "turns", c->id);
    kvp_redis_key(kv, sizeof kv, "ver", c->id);
    kvp_redis_key(ko, sizeof ko, "tenant", c->id);
    kvp_redis_key(kl, sizeof kl, "lease", c->id);
    kvp_redis_key(kh, sizeof kh, "hint", c->id);
    snprintf(bmax, sizeof bmax, "%llu", (unsigned long long)st->tenant_bytes_max);
    snprintf(smax, sizeof smax, "%d", st->tenant_snaps_max);
    const char *argv[] = {"EVAL", EVICT_SCRIPT, "8", ks, kt, kv, ko, kl, kz, kb, kh,
                          c->id, bmax, smax, c->score, stale_only ? "1" : "0", tenant};
    enum { ARGC = sizeof argv / sizeof argv[0] };
    size_t lens[ARGC];
    for (int i = 0; i < ARGC; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = kvp_redis_command(st, ARGC, argv, lens, err, sizeof err);
    if (!rep || rep->type != REDIS_REPLY_INTEGER) {
        kvpd_log("warning", "max_state_bytes_per_tenant: %s",
                 rep && rep->type == REDIS_REPLY_ERROR ? rep->str : rep ? "unexpected reply" : err);
        freeReplyObject(rep);
        kvp_store_count_error(st);
        return -2;
    }
    int rc = (int)rep->integer;
    freeReplyObject(rep);
    return rc;
}

static int is_live(kvp_store *st, const char *id)
{
    pthread_mutex_lock(&st->live_mu);
    int live = kvp_store_live_has_locked(st, id);
    pthread_mutex_unlock(&st->live_mu);
    return live;
}

int kvp_store_redis_quota_enforce(kvp_store *st, const char *tenant, const char *keep)
{
    if (!st->tenant_bytes_max && !st->tenant_snaps_max)
        return 0;
    char kz[96], kb[96];
    kvp_redis_key(kz, sizeof kz, "tsnaps", tenant);
    kvp_redis_key(kb, sizeof kb, "tbytes", tenant);
    cand *c = malloc(BATCH * sizeof *c);
    if (!c)
        return 0;
    int removed = 0, kept = 0, fits = 0;
    for (int round = 0; round < ROUNDS && !fits; round++) {
        int n = oldest(st, kz, kept, c);
        if (n <= 0)
            break;
        /* Expired snapshots' entries first: dropping them may be all it takes. */
        for (int i = 0; i < n; i++) {
            int rc = evict(st, tenant, kz, kb, &c[i], 1);
            if (rc == -2)
                goto out;
            if (rc == 2)
                c[i].id[0] = '\0';
        }
        for (int i = 0; i < n && !fits; i++) {
            if (!c[i].id[0])
                continue;
            if (!strcmp(c[i].id, keep) || is_live(st, c[i].id)) {
                kept++;
                continue;
            }
            int rc = evict(st, tenant, kz, kb, &c[i], 0);
            if (rc == -2)
                goto out;
            if (rc == -1) {
                fits = 1;
            } else if (rc == 1) {
                removed++;
                kvpd_log("info", "session %.8s: snapshot deleted, its tenant's snapshots were "
                         "over max_state_bytes_per_tenant (%llu bytes) or "
                         "max_state_snapshots_per_tenant (%d), least recently written first",
                         c[i].id, (unsigned long long)st->tenant_bytes_max, st->tenant_snaps_max);
            } else if (rc == 0) {
                kept++;
            }
        }
        if (n < BATCH)
            break;   /* the last of them read: those left may not go */
    }
out:
    free(c);
    return removed;
}

uint64_t kvp_store_redis_quota_usage(kvp_store *st, const char *tenant, int *snapshots)
{
    char kz[96], kb[96], err[200];
    kvp_redis_key(kz, sizeof kz, "tsnaps", tenant);
    kvp_redis_key(kb, sizeof kb, "tbytes", tenant);
    uint64_t bytes = 0;
    const char *hget[] = {"HGET", kb, "*"};
    size_t hlens[] = {4, strlen(kb), 1};
    redisReply *rep = kvp_redis_command(st, 3, hget, hlens, err, sizeof err);
    if (rep && rep->type == REDIS_REPLY_STRING)
        bytes = strtoull(rep->str, NULL, 10);
    freeReplyObject(rep);
    if (snapshots) {
        const char *zcard[] = {"ZCARD", kz};
        size_t zlens[] = {5, strlen(kz)};
        rep = kvp_redis_command(st, 2, zcard, zlens, err, sizeof err);
        if (rep && rep->type == REDIS_REPLY_INTEGER)
            *snapshots = (int)rep->integer;
        freeReplyObject(rep);
    }
    return bytes;
}
