/* Counters and histograms for /metrics (rendered by web/metrics.c) and /admin/stats.
 * Updated and read on the loop thread only. */
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

/* The eviction canary (observe/canary.h): per (policy, budget) the histograms of each
 * checked turn's mean KL and top-1 agreement (at most KVPD_CANARY_SLOTS pairs; more are
 * counted in `unlabelled`), the last KVPD_CANARY_RECENT turns for the recent means, and
 * what the background work (observe/background.h) did. */
#define KVPD_CANARY_SLOTS 8
#define KVPD_CANARY_RECENT 64
typedef struct kvpd_canary_slot {
    char policy[32];
    int budget;
    kvpd_hist kl, top1;
} kvpd_canary_slot;

typedef struct kvpd_canary_metrics {
    int n_slots;
    kvpd_canary_slot slot[KVPD_CANARY_SLOTS];
    uint64_t runs, unlabelled, skipped_busy, failed, dropped;
    uint64_t transcripts_written, transcript_failures;
    double recent_kl[KVPD_CANARY_RECENT], recent_top1[KVPD_CANARY_RECENT];
    int recent_n, recent_at;
} kvpd_canary_metrics;
/* A counter by two labels (a static text and an HTTP status): kvpd_http_requests_total
 * {path,status} and kvpd_api_errors_total{status,code}. The label texts are static (the
 * table keeps the pointers); past KVPD_LABELLED_MAX pairs the rest count as "other". */
#define KVPD_LABELLED_MAX 64
typedef struct kvpd_labelled {
    int n;
    struct { const char *label; int status; uint64_t count; } e[KVPD_LABELLED_MAX];
} kvpd_labelled;

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
    uint64_t errors[KVPD_ERR_KINDS];      /* websocket error frames, by protocol code */
    kvpd_labelled http_by_path;           /* HTTP answers by endpoint and status */
    kvpd_labelled api_errors;             /* API error answers by status and error code */
    uint64_t cached_tokens;               /* prompt tokens the cache already held */
    double start_time_s;                  /* the process's start, Unix seconds */
    kvpd_hist ttft, turn_duration;        /* seconds */
    /* the step loop: per batched step, the turns in it, the tokens it ran and its time;
     * per turn, the wait from its message to its first step */
    kvpd_hist step_sessions, step_tokens, step_duration, queue_wait;
    /* per snapshot write (the end of a turn): its time and its bytes */
    kvpd_hist snapshot_write, snapshot_bytes;
    kvpd_canary_metrics canary;
    /* prefix reuse (store/prefix.h): requests continued from an earlier point of a
     * session (rewinds); lookups of the prefix index that found rows / none; the
     * tokens turns found in the cache by where they came from (the session's own, a
     * copy of another session's, a shared prefix's) and the cache bytes copied */
    uint64_t prefix_rewinds, prefix_hits, prefix_misses;
    /* new requests that waited for another conversation's turn prefilling their prefix
     * (sessions/hub_wait.c) */
    uint64_t prefix_waits;
    uint64_t reused_own, reused_other, reused_shared, prefix_bytes_copied;
} kvpd_metrics;

/* Point-in-time values that are not counters. */
typedef struct kvpd_gauges {
    int sessions_active, turns_running, queue_depth;   /* active: resident */
    int sessions_parked;
    int connections_open;
    size_t cache_bytes_total, cache_bytes_max_session;
    size_t cache_bytes_accounted, cache_bytes_cap, turn_reserve_bytes;
    size_t cache_bytes_shared, cache_bytes_borrowed;   /* kvp_hub_info's */
    double uptime_s;
    int ready;
    int draining;                     /* shutting down: /healthz says so */
    /* the snapshot store's counters (store/store.h) */
    uint64_t lease_conflicts, lease_takeovers, snapshots_expired, store_errors;
    uint64_t snapshots_over_quota;
    int leases_renewing;
    size_t prefix_index_bytes;        /* the prefix index's memory (store/prefix.h) */
} kvpd_gauges;

/* Counts one (label, status); label is static text. */
void kvpd_labelled_add(kvpd_labelled *t, const char *label, int status);

/* Zeroes the counters and sets the histogram buckets. */
void kvpd_metrics_init(kvpd_metrics *m);
void kvpd_hist_observe(kvpd_hist *h, double v);
/* One checked turn's canary figures. */
void kvpd_canary_observe(kvpd_metrics *m, const char *policy, int budget, double kl, double top1);
/* The mean KL and top-1 agreement of the last KVPD_CANARY_RECENT checked turns; returns
 * how many there are (0: none yet, the means 0). */
int kvpd_canary_recent(const kvpd_metrics *m, double *kl, double *top1);

#endif
