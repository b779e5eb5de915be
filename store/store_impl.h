/* The store's two implementations behind store/store.h (private to sessions/). */
#ifndef KVP_STORE_IMPL_H
#define KVP_STORE_IMPL_H

#include <dirent.h>
#include <pthread.h>

#include "store/store.h"

typedef char kvp_store_id[KVP_SNAPSHOT_ID_MAX + 1];

/* What a Redis write is conditional on (docs/cluster.md, "The write protocol"). token:
 * in, the fencing token of the lease this node holds (0: none known); out, the lease's
 * after the write. version: in, the stored version this copy descends from; out, the
 * version written. The directory ignores them. */
typedef struct kvp_store_fence {
    uint64_t token, version;
    int live;                      /* the lease must still be live in the store (not run
                                    * out, even with nobody having taken it since) */
} kvp_store_fence;

/* A lease this node holds (or releases): its fencing token; until: the monotonic time
 * (seconds) it surely lasts to, counted from before the call that took or renewed it;
 * renew: a job runs, the store's thread renews it. */
typedef struct kvp_lease_ent {
    kvp_store_id id;
    uint64_t token;
    double until;
    int renew;
} kvp_lease_ent;

typedef struct kvp_store_ops {
    int (*put)(kvp_store *st, const kvp_snapshot *snap, kvp_store_fence *f, size_t *bytes,
               char *err, size_t errlen);
    /* NULL: no journal, every write is whole */
    int (*append)(kvp_store *st, const char *id, const kvp_journal_rec *rec,
                  size_t *journal_bytes, size_t *bytes, char *err, size_t errlen);
    /* *version: the stored version read (left 0 by the directory) */
    int (*get)(kvp_store *st, const char *id, kvp_snapshot *out, uint64_t *version,
               size_t *journal_bytes, int *journal_clean, char *jerr, size_t jerrlen,
               char *err, size_t errlen);
    int (*exists)(kvp_store *st, const char *id);
    int (*remove)(kvp_store *st, const char *id, char *err, size_t errlen);
    int (*list)(kvp_store *st, void (*fn)(void *ctx, const char *id), void *ctx, char *err,
                size_t errlen);
    int (*expire)(kvp_store *st, char *err, size_t errlen);
    /* NULL: one node, leases always held */
    /* *token: in, the one held (0: none); out, the new one (HELD and NEW) */
    int (*lease_take)(kvp_store *st, const char *id, uint64_t *token, int *stored_turns,
                      uint64_t *stored_version, int *left_ms, char *holder, size_t holder_len,
                      char *err, size_t errlen);
    /* The store's thread: renew (release 0) or release (1) these leases, each only while
     * its token is the session's newest. res[i]: 1 done, 0 not this node's lease (any
     * more), -1 no answer. */
    void (*lease_batch)(kvp_store *st, const kvp_lease_ent *ents, int n, int release,
                        signed char *res);
    void (*close)(kvp_store *st);
} kvp_store_ops;

typedef struct kvp_lease_set {
    kvp_lease_ent *v;
    int n, cap;
} kvp_lease_set;

struct kvp_store {
    const kvp_store_ops *ops;
    const char *kind;
    char where[320];
    char dir[512];                 /* the directory store's; "" for Redis */
    char node[KVP_STORE_NODE_MAX + 1];
    double ttl_s;
    int lease_ms;
    double expire_every_s;
    void *impl;                    /* the Redis store's connections */
    pthread_mutex_t mu;            /* the sets, the stats, stopping */
    pthread_cond_t wake;
    pthread_t thread;
    int thread_on, stopping;
    kvp_lease_set held, releasing;  /* the leases held; those to release */
    kvp_store_stats stats;
    pthread_mutex_t live_mu;       /* the live set (store/store_live.c) */
    kvp_store_id *live;            /* sorted; n_live of cap_live */
    int n_live, cap_live;
    uint64_t tenant_bytes_max;     /* a tenant's snapshot bytes (0: no bound) */
    int tenant_snaps_max;          /* a tenant's snapshots (0: no bound) */
    pthread_mutex_t quota_mu;      /* the usage table (store/store_quota.c) */
    struct kvp_store_quota *quota;
};

/* Redis (store/store_redis.c): fills st->ops, impl, where; connects once to check. */
int kvp_store_redis_open(kvp_store *st, const char *url, char *err, size_t errlen);
/* Counts a failed call (any thread). */
void kvp_store_count_error(kvp_store *st);
/* Counts snapshots deleted to keep their tenant within its bounds (any thread). */
void kvp_store_count_over_quota(kvp_store *st, int n);

/* The Redis store's calls shared with store/store_redis_quota.c (store/store_redis.c).
 * command: one command in argv form (binary-safe), retried once on a fresh connection;
 * NULL with a message when Redis did not answer (an error reply is returned as it is).
 * key: "<prefix>:<id>" into buf. */
struct redisReply;
struct redisReply *kvp_redis_command(kvp_store *st, int argc, const char **argv,
                                     const size_t *lens, char *err, size_t errlen);
void kvp_redis_key(char *buf, size_t n, const char *prefix, const char *id);
/* scan: fn(ctx, id) for each key "<prefix>:<id>" with a valid id (SCAN MATCH, any order,
 * a key may come twice); fn's nonzero stops it and is returned when negative. The count
 * of keys seen, or a negative code with a message. */
int kvp_redis_scan(kvp_store *st, const char *prefix, int (*fn)(void *ctx, const char *id),
                   void *ctx, char *err, size_t errlen);

/* Redis's bytes and snapshots per tenant (store/store_redis_quota.c; docs/cluster.md,
 * "Tenants' bounds"). Kept in Redis itself, so every node sharing it sees the same
 * totals: tsnaps:<tenant>, a sorted set of the tenant's session ids scored by the wall
 * clock (ms) of their last write, and tbytes:<tenant>, a hash of their bytes with the
 * total under "*"; each write and removal updates them in the script that writes or
 * removes the snapshot. The tenant of a stored session is tenant:<id>.
 * enforce: after a write of keep took its tenant past a bound, the tenant's least
 * recently written snapshots go until it fits, each in one script that deletes it only
 * while the tenant is still over, no node holds the session's lease and it was not
 * written since; never keep nor one this node holds live. Entries whose snapshot has
 * expired are dropped first (not counted). Returns how many were deleted.
 * usage: the tenant's bytes and (snapshots) count; 0 when Redis does not answer. */
#define KVP_REDIS_UNCOUNT_LUA                                                    \
    "local function uncount(z, b, id)\n"                                        \
    "  local was = tonumber(redis.call('HGET', b, id) or '0')\n"                \
    "  redis.call('ZREM', z, id)\n"                                             \
    "  if redis.call('HDEL', b, id) == 1 then redis.call('HINCRBY', b, '*', -was) end\n" \
    "end\n"
int kvp_store_redis_quota_enforce(kvp_store *st, const char *tenant, const char *keep);
uint64_t kvp_store_redis_quota_usage(kvp_store *st, const char *tenant, int *snapshots);

/* The directory store's files (store/store.c). opendir: st->dir opened into *d, or a
 * negative errno with a message; snap_id: whether a directory entry's name is
 * <id>.snap with a valid id, the id copied into id when it is. */
int kvp_store_opendir(const kvp_store *st, DIR **d, char *err, size_t errlen);
int kvp_store_snap_id(const char *name, kvp_store_id id);
/* Binary search of n records sorted by an id (strcmp), each stride bytes from the last,
 * whose kvp_store_id lies at byte offset `off` of its record (store/store.c). Returns 1
 * with *at the record's index when id is there, else 0 with *at where it would go. */
int kvp_store_id_search(const void *base, int n, size_t stride, size_t off, const char *id,
                        int *at);

/* The live set (store/store_live.c). add: the id is live from now on (until the next
 * kvp_store_set_live); has_locked: with live_mu held; copy: the ids (malloc'd, *out),
 * their count. Any thread. */
void kvp_store_live_add(kvp_store *st, const char *id);
int kvp_store_live_has_locked(const kvp_store *st, const char *id);
int kvp_store_live_copy(kvp_store *st, kvp_store_id **out);

/* The directory's bytes per tenant (store/store_quota.c). open: the table, read from the
 * files' headers when tenant_bytes_max is set; put: a whole snapshot of the tenant's
 * was written (bytes: all it takes now); grow: a journal record of bytes appended;
 * touch: read; forget: removed; enforce: after a write of id, its tenant's least
 * recently used snapshots that are neither live nor id are deleted while the tenant is
 * over the bound (returns how many). Workers and the store's thread; all but open and
 * close take the table's mutex (enforce the live set's first). */
int kvp_store_quota_open(kvp_store *st, char *err, size_t errlen);
void kvp_store_quota_close(kvp_store *st);
void kvp_store_quota_put(kvp_store *st, const char *id, const char *tenant, uint64_t bytes);
void kvp_store_quota_grow(kvp_store *st, const char *id, uint64_t bytes);
void kvp_store_quota_touch(kvp_store *st, const char *id);
void kvp_store_quota_forget(kvp_store *st, const char *id);
int kvp_store_quota_enforce(kvp_store *st, const char *id);

#endif
