/* Prometheus text exposition format 0.0.4: HELP and TYPE before each family, counters
 * end in _total, histograms have cumulative _bucket{le} series plus _sum and _count. */
#include "web/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sessions/hub.h"

static const char *err_codes[KVPD_ERR_KINDS] = {
    KVPD_E_BAD_JSON, KVPD_E_BAD_REQUEST, KVPD_E_BUSY, KVPD_E_TOO_LARGE,
    KVPD_E_UNKNOWN_SESSION, KVPD_E_OVERLOADED, KVPD_E_INTERNAL, KVPD_E_ELSEWHERE};

enum kvpd_err_kind kvpd_err_kind_of(const char *code)
{
    for (int i = 0; i < KVPD_ERR_KINDS; i++)
        if (!strcmp(code, err_codes[i]))
            return (enum kvpd_err_kind)i;
    return KVPD_ERR_INTERNAL;
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(FILE *f, const char *name, const char *help, uint64_t v)
{
    family(f, name, "counter", help);
    fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

static void gauge(FILE *f, const char *name, const char *help, double v)
{
    family(f, name, "gauge", help);
    fprintf(f, "%s %.17g\n", name, v);
}

/* The series of one histogram; labels: "" or `k="v",...` put before le. */
static void hist_series(FILE *f, const char *name, const char *labels, const kvpd_hist *h)
{
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";
    for (int i = 0; i < KVPD_HIST_BUCKETS - 1; i++) {
        cum += h->counts[i];
        fprintf(f, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, h->bounds[i],
                (unsigned long long)cum);
    }
    fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
            (unsigned long long)h->count);
    fprintf(f, "%s_sum%s%s%s %.17g\n%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
            labels[0] ? "}" : "", h->sum, name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
            (unsigned long long)h->count);
}

static void histogram(FILE *f, const char *name, const char *help, const kvpd_hist *h)
{
    family(f, name, "histogram", help);
    hist_series(f, name, "", h);
}

/* The canary's histograms, one series per (policy, budget). */
static void canary_render(FILE *f, const kvpd_canary_metrics *c)
{
    family(f, "kvpd_eviction_kl", "histogram",
           "Eviction canary: a checked turn's mean KL(full cache || evicted) over its reply "
           "positions, nats (top-k estimate, docs/evaluation.md)");
    char labels[96];
    for (int i = 0; i < c->n_slots; i++) {
        snprintf(labels, sizeof labels, "policy=\"%s\",budget=\"%d\"", c->slot[i].policy,
                 c->slot[i].budget);
        hist_series(f, "kvpd_eviction_kl", labels, &c->slot[i].kl);
    }
    family(f, "kvpd_eviction_top1_agreement", "histogram",
           "Eviction canary: a checked turn's share of reply positions whose most likely "
           "token is the full cache's");
    for (int i = 0; i < c->n_slots; i++) {
        snprintf(labels, sizeof labels, "policy=\"%s\",budget=\"%d\"", c->slot[i].policy,
                 c->slot[i].budget);
        hist_series(f, "kvpd_eviction_top1_agreement", labels, &c->slot[i].top1);
    }
    counter(f, "kvpd_eviction_canary_runs_total", "Turns the eviction canary checked", c->runs);
    counter(f, "kvpd_eviction_canary_skipped_total",
            "Canary checks dropped because a turn was queued or a step or job running",
            c->skipped_busy);
    counter(f, "kvpd_eviction_canary_failed_total",
            "Canary checks that could not run (longer than the context, out of memory)", c->failed);
    counter(f, "kvpd_background_dropped_total",
            "Canary checks and transcript writes dropped because the background queue was full",
            c->dropped);
    counter(f, "kvpd_learn_transcripts_written_total", "Transcript files written to learn_dir",
            c->transcripts_written);
    counter(f, "kvpd_learn_transcript_failures_total",
            "Transcript files that could not be written to learn_dir", c->transcript_failures);
}

/* A labelled family; label values are kvpd's own texts (paths, codes): no escaping. */
static void labelled(FILE *f, const char *name, const char *help, const char *label_name,
                     const kvpd_labelled *t, int status_first)
{
    family(f, name, "counter", help);
    for (int i = 0; i < t->n; i++) {
        if (status_first)
            fprintf(f, "%s{status=\"%d\",%s=\"%s\"} %llu\n", name, t->e[i].status,
                    label_name, t->e[i].label, (unsigned long long)t->e[i].count);
        else
            fprintf(f, "%s{%s=\"%s\",status=\"%d\"} %llu\n", name, label_name,
                    t->e[i].label, t->e[i].status, (unsigned long long)t->e[i].count);
    }
}

char *kvpd_metrics_render(const kvpd_metrics *m, const kvpd_gauges *g, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    gauge(f, "kvpd_up", "1 once the model is loaded and turns are served", g->ready);
    gauge(f, "kvpd_uptime_seconds", "Seconds since the daemon started", g->uptime_s);
    family(f, "kvpd_build_info", "gauge", "The daemon's version (the value is always 1)");
    fprintf(f, "kvpd_build_info{version=\"%s\"} 1\n", KVP_VERSION);
    gauge(f, "process_start_time_seconds", "Start time of the process since the Unix epoch",
          m->start_time_s);
    gauge(f, "kvpd_sessions_resident", "Sessions resident in memory (cache and transcript)",
          g->sessions_active);
    gauge(f, "kvpd_sessions_parked", "Sessions parked to the state directory, known in memory",
          g->sessions_parked);
    gauge(f, "kvpd_turns_running", "Turns queued or on a worker", g->turns_running);
    gauge(f, "kvpd_queue_depth", "Turns waiting for a worker", g->queue_depth);
    gauge(f, "kvpd_cache_bytes", "KV cache bytes held by all sessions (at turn ends)",
          (double)g->cache_bytes_total);
    gauge(f, "kvpd_session_cache_bytes_max", "KV cache bytes of the largest resident session",
          (double)g->cache_bytes_max_session);
    gauge(f, "kvpd_cache_bytes_accounted",
          "KV cache bytes the memory cap counts (idle caches plus running turns' reservations)",
          (double)g->cache_bytes_accounted);
    gauge(f, "kvpd_cache_bytes_shared",
          "Of kvpd_cache_bytes, the rows shared between sessions (forks, shared prefixes, n "
          "choices), each counted once", (double)g->cache_bytes_shared);
    gauge(f, "kvpd_cache_bytes_borrowed",
          "KV cache bytes sessions read from shared rows, once per reader (what copies would hold)",
          (double)g->cache_bytes_borrowed);
    gauge(f, "kvpd_cache_bytes_cap", "max_cache_bytes (0: no cap)", (double)g->cache_bytes_cap);
    gauge(f, "kvpd_turn_reserve_bytes", "KV cache bytes reserved for one turn",
          (double)g->turn_reserve_bytes);
    counter(f, "kvpd_sessions_created_total", "Sessions created", m->sessions_created);
    counter(f, "kvpd_sessions_expired_total", "Sessions dropped after the idle timeout",
            m->sessions_expired);
    counter(f, "kvpd_sessions_forgotten_total",
            "Parked sessions let go from memory after another idle timeout (snapshot kept)",
            m->sessions_forgotten);
    counter(f, "kvpd_sessions_dropped_total",
            "Idle sessions no client was attached to, dropped to make room (no state directory)",
            m->sessions_dropped);
    counter(f, "kvpd_sessions_lost_total", "Sessions whose snapshot was missing or bad",
            m->sessions_lost);
    counter(f, "kvpd_parks_total", "Sessions parked to disk (memory freed)", m->parks);
    counter(f, "kvpd_unparks_total", "Sessions loaded back from their snapshot", m->unparks);
    counter(f, "kvpd_rebuilds_total",
            "Sessions restored from their transcript (model or policy changed)", m->rebuilds);
    counter(f, "kvpd_snapshots_written_total", "Session snapshots written", m->snapshots_written);
    counter(f, "kvpd_snapshot_failures_total", "Session snapshots that could not be written",
            m->snapshot_failures);
    counter(f, "kvpd_reloads_total", "SIGHUP reloads applied", m->reloads);
    counter(f, "kvpd_reloads_refused_total", "SIGHUP reloads refused (bad file)",
            m->reloads_refused);
    counter(f, "kvpd_reserve_overruns_total",
            "Turns whose cache outgrew their memory reservation (should stay 0)",
            m->reserve_overruns);
    counter(f, "kvpd_turns_total", "Turns completed (cancelled ones included)", m->turns);
    counter(f, "kvpd_turns_cancelled_total", "Turns stopped by cancel or disconnect",
            m->turns_cancelled);
    counter(f, "kvpd_turns_failed_total", "Turns that ended in an error", m->turns_failed);
    counter(f, "kvpd_prompt_tokens_total", "New tokens of user turns", m->prompt_tokens);
    counter(f, "kvpd_cached_tokens_total",
            "Prompt tokens the cache already held (reused, not recomputed)", m->cached_tokens);
    counter(f, "kvpd_prefilled_tokens_total", "Tokens run through the model in prefill",
            m->prefilled_tokens);
    counter(f, "kvpd_generated_tokens_total", "Tokens generated", m->generated_tokens);
    counter(f, "kvpd_evicted_rows_total", "KV rows evicted, all heads", m->evicted_rows);
    counter(f, "kvpd_connections_total", "Websocket connections accepted", m->connections);
    labelled(f, "kvpd_http_requests_total", "HTTP answers, by endpoint and status", "path",
             &m->http_by_path, 0);
    labelled(f, "kvpd_api_errors_total", "Error answers of the HTTP API, by status and error code",
             "code", &m->api_errors, 1);
    counter(f, "kvpd_connections_refused_total",
            "Connections closed unserved (max_connections, or out of file descriptors)",
            m->connections_refused);
    gauge(f, "kvpd_connections_open", "HTTP and websocket connections open",
          (double)g->connections_open);
    family(f, "kvpd_errors_total", "counter", "Websocket error frames sent, by protocol code");
    for (int i = 0; i < KVPD_ERR_KINDS; i++)
        fprintf(f, "kvpd_errors_total{code=\"%s\"} %llu\n", err_codes[i],
                (unsigned long long)m->errors[i]);
    histogram(f, "kvpd_ttft_seconds", "Time from a message to its first token", &m->ttft);
    histogram(f, "kvpd_turn_duration_seconds", "Time from a message to its done frame",
              &m->turn_duration);
    histogram(f, "kvpd_step_sessions", "Turns in each batched step (batch size)",
              &m->step_sessions);
    histogram(f, "kvpd_step_tokens", "Tokens each batched step ran (decodes plus prefill chunks)",
              &m->step_tokens);
    histogram(f, "kvpd_step_duration_seconds", "Time of each batched step", &m->step_duration);
    histogram(f, "kvpd_queue_wait_seconds", "Time from a message to its turn's first step",
              &m->queue_wait);
    histogram(f, "kvpd_snapshot_write_seconds",
              "Time of each snapshot write at the end of a turn (directory or Redis)",
              &m->snapshot_write);
    histogram(f, "kvpd_snapshot_bytes",
              "Bytes of each snapshot write (a journal record, or a whole snapshot)",
              &m->snapshot_bytes);
    canary_render(f, &m->canary);
    counter(f, "kvpd_lease_conflicts_total",
            "Loads and turns refused because another node held the session's lease",
            g->lease_conflicts);
    counter(f, "kvpd_lease_takeovers_total",
            "Sessions in memory reloaded because another node had served them meanwhile",
            g->lease_takeovers);
    gauge(f, "kvpd_leases_renewing", "Session leases this node renews (jobs in flight)",
          g->leases_renewing);
    counter(f, "kvpd_snapshots_expired_total", "Snapshots deleted by snapshot_ttl (directory)",
            g->snapshots_expired);
    counter(f, "kvpd_snapshots_over_quota_total",
            "Snapshots deleted to keep their API key within max_state_bytes_per_tenant "
            "or max_state_snapshots_per_tenant", g->snapshots_over_quota);
    counter(f, "kvpd_store_errors_total",
            "Snapshot store calls that failed (disk, or the Redis server unreachable)",
            g->store_errors);
    counter(f, "kvpd_prefix_rewinds_total",
            "Requests that continued a session from an earlier point (its cache cut back)",
            m->prefix_rewinds);
    counter(f, "kvpd_prefix_hits_total", "Prefix index lookups that found cached rows",
            m->prefix_hits);
    counter(f, "kvpd_prefix_misses_total", "Prefix index lookups that found none",
            m->prefix_misses);
    counter(f, "kvpd_prefix_waits_total",
            "New requests that waited for another conversation's turn prefilling the prefix "
            "they share (to fork it once that turn ended)",
            m->prefix_waits);
    family(f, "kvpd_reused_tokens_total", "counter",
           "Prompt tokens found in the cache, by where the rows came from");
    fprintf(f, "kvpd_reused_tokens_total{source=\"own\"} %llu\n",
            (unsigned long long)m->reused_own);
    fprintf(f, "kvpd_reused_tokens_total{source=\"other\"} %llu\n",
            (unsigned long long)m->reused_other);
    fprintf(f, "kvpd_reused_tokens_total{source=\"shared\"} %llu\n",
            (unsigned long long)m->reused_shared);
    counter(f, "kvpd_prefix_bytes_copied_total",
            "Cache bytes copied from one conversation into another (forks)",
            m->prefix_bytes_copied);
    gauge(f, "kvpd_prefix_index_bytes", "Memory of the prefix index",
          (double)g->prefix_index_bytes);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}
