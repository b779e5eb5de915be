/* Counters and histograms for /metrics (Prometheus text format 0.0.4) and
 * /admin/stats. Updated and read on the loop thread only. */
#ifndef KVPD_METRICS_H
#define KVPD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#define KVPD_HIST_BUCKETS 12

typedef struct kvpd_hist {
    const double *bounds;                 /* KVPD_HIST_BUCKETS - 1 upper bounds, then +Inf */
    uint64_t counts[KVPD_HIST_BUCKETS];   /* per bucket (not cumulative) */
    uint64_t count;
    double sum;
} kvpd_hist;

enum kvpd_err_kind {
    KVPD_ERR_BAD_JSON, KVPD_ERR_BAD_REQUEST, KVPD_ERR_BUSY, KVPD_ERR_TOO_LARGE,
    KVPD_ERR_UNKNOWN_SESSION, KVPD_ERR_OVERLOADED, KVPD_ERR_INTERNAL, KVPD_ERR_ELSEWHERE,
    KVPD_ERR_KINDS
};

typedef struct kvpd_metrics {
    uint64_t sessions_created, sessions_expired;
    uint64_t sessions_forgotten;          /* parked, idle, let go from memory (file kept) */
    uint64_t sessions_dropped;            /* idle, unattached, dropped to make room (no store) */
    uint64_t sessions_lost;               /* snapshot missing or bad when needed */
    uint64_t parks, unparks;              /* unparks: snapshots loaded back, lazy loads too */
    uint64_t rebuilds;                    /* restored from the transcript, not the cache */
    uint64_t snapshots_written, snapshot_failures;
    uint64_t reloads, reloads_refused;
    uint64_t reserve_overruns;            /* a turn's cache outgrew its reservation: a bug */
    uint64_t turns, turns_cancelled, turns_failed;
    uint64_t prompt_tokens, prefilled_tokens, generated_tokens;
    uint64_t evicted_rows;
    uint64_t connections, http_requests;
    uint64_t connections_refused;         /* max_connections, or out of descriptors */
    uint64_t errors[KVPD_ERR_KINDS];
    kvpd_hist ttft, turn_duration;        /* seconds */
    /* the step loop: per batched step, the turns in it, the tokens it ran and its time;
     * per turn, the wait from its message to its first step */
    kvpd_hist step_sessions, step_tokens, step_duration, queue_wait;
    /* per snapshot write (the end of a turn): its time and its bytes */
    kvpd_hist snapshot_write, snapshot_bytes;
    /* prefix reuse (sessions/prefix.h): requests continued from an earlier point of a
     * session (rewinds); lookups of the prefix index that found rows / none; the
     * tokens turns found in the cache by where they came from (the session's own, a
     * copy of another session's, a shared prefix's) and the cache bytes copied */
    uint64_t prefix_rewinds, prefix_hits, prefix_misses;
    uint64_t reused_own, reused_other, reused_shared, prefix_bytes_copied;
} kvpd_metrics;

/* Point-in-time values that are not counters. */
typedef struct kvpd_gauges {
    int sessions_active, turns_running, queue_depth;   /* active: resident */
    int sessions_parked;
    int connections_open;
    size_t cache_bytes_total, cache_bytes_max_session;
    size_t cache_bytes_accounted, cache_bytes_cap, turn_reserve_bytes;
    double uptime_s;
    int ready;
    int draining;                     /* shutting down: /healthz says so */
    /* the snapshot store's counters (sessions/store.h) */
    uint64_t lease_conflicts, lease_takeovers, snapshots_expired, store_errors;
    int leases_renewing;
    size_t prefix_index_bytes;        /* the prefix index's memory (sessions/prefix.h) */
} kvpd_gauges;

/* Zeroes the counters and sets the histogram buckets. */
void kvpd_metrics_init(kvpd_metrics *m);
void kvpd_hist_observe(kvpd_hist *h, double v);
/* Maps a protocol error code to its counter (unknown codes count as internal). */
enum kvpd_err_kind kvpd_err_kind_of(const char *code);
/* Renders the exposition text; malloc'd, NULL when out of memory. */
char *kvpd_metrics_render(const kvpd_metrics *m, const kvpd_gauges *g, size_t *len);

#endif
