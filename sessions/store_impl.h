/* The store's two implementations behind sessions/store.h (private to sessions/). */
#ifndef KVP_STORE_IMPL_H
#define KVP_STORE_IMPL_H

#include <pthread.h>

#include "sessions/store.h"

typedef char kvp_store_id[KVP_SNAPSHOT_ID_MAX + 1];

typedef struct kvp_store_ops {
    int (*put)(kvp_store *st, const kvp_snapshot *snap, size_t *bytes, char *err, size_t errlen);
    /* NULL: no journal, every write is whole */
    int (*append)(kvp_store *st, const char *id, const kvp_journal_rec *rec,
                  size_t *journal_bytes, size_t *bytes, char *err, size_t errlen);
    int (*get)(kvp_store *st, const char *id, kvp_snapshot *out, size_t *journal_bytes,
               int *journal_clean, char *jerr, size_t jerrlen, char *err, size_t errlen);
    int (*exists)(kvp_store *st, const char *id);
    int (*remove)(kvp_store *st, const char *id, char *err, size_t errlen);
    int (*list)(kvp_store *st, void (*fn)(void *ctx, const char *id), void *ctx, char *err,
                size_t errlen);
    int (*expire)(kvp_store *st, char *err, size_t errlen);
    /* NULL: one node, leases always held */
    int (*lease_take)(kvp_store *st, const char *id, int *stored_turns, int *left_ms,
                      char *holder, size_t holder_len, char *err, size_t errlen);
    /* the store's thread: renew (release 0) or release (1) these leases */
    void (*lease_batch)(kvp_store *st, const kvp_store_id *ids, int n, int release);
    void (*close)(kvp_store *st);
} kvp_store_ops;

typedef struct kvp_id_set {
    kvp_store_id *v;
    int n, cap;
} kvp_id_set;

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
    kvp_id_set renewing, releasing;
    kvp_store_stats stats;
};

/* Redis (sessions/store_redis.c): fills st->ops, impl, where; connects once to check. */
int kvp_store_redis_open(kvp_store *st, const char *url, char *err, size_t errlen);
/* Counts a failed call (any thread). */
void kvp_store_count_error(kvp_store *st);

#endif
