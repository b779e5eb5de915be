/* The daemon's counters and histograms (observe/metrics.h): their buckets, the canary's
 * figures per (policy, budget), the labelled counters. Rendering them for /metrics is
 * web/metrics.c's. */
#include "observe/metrics.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* Seconds. Time to first token is milliseconds on a small model and seconds on a big
 * one under load; a whole turn is longer. */
static const double ttft_bounds[KVPD_HIST_BUCKETS - 1] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5};
static const double turn_bounds[KVPD_HIST_BUCKETS - 1] = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60};

/* The step loop: sessions per step, tokens per step (counts), a step's time (seconds). */
static const double step_sessions_bounds[KVPD_HIST_BUCKETS - 1] = {
    1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64};
static const double step_tokens_bounds[KVPD_HIST_BUCKETS - 1] = {
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
/* A snapshot write: seconds; its size: bytes. */
static const double snapshot_write_bounds[KVPD_HIST_BUCKETS - 1] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
static const double snapshot_bytes_bounds[KVPD_HIST_BUCKETS - 1] = {
    1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456,
    1073741824};
static const double step_bounds[KVPD_HIST_BUCKETS - 1] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};

/* The canary: a turn's mean KL (nats) and top-1 agreement (a share). */
static const double canary_kl_bounds[KVPD_HIST_BUCKETS - 1] = {
    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1};
static const double canary_top1_bounds[KVPD_HIST_BUCKETS - 1] = {
    0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.98, 0.99, 0.999};

void kvpd_canary_observe(kvpd_metrics *m, const char *policy, int budget, double kl, double top1)
{
    kvpd_canary_metrics *c = &m->canary;
    c->runs++;
    c->recent_kl[c->recent_at] = kl;
    c->recent_top1[c->recent_at] = top1;
    c->recent_at = (c->recent_at + 1) % KVPD_CANARY_RECENT;
    if (c->recent_n < KVPD_CANARY_RECENT)
        c->recent_n++;
    kvpd_canary_slot *sl = NULL;
    for (int i = 0; i < c->n_slots && !sl; i++)
        if (c->slot[i].budget == budget && !strcmp(c->slot[i].policy, policy))
            sl = &c->slot[i];
    if (!sl && c->n_slots < KVPD_CANARY_SLOTS) {
        sl = &c->slot[c->n_slots++];
        snprintf(sl->policy, sizeof sl->policy, "%s", policy);
        sl->budget = budget;
        sl->kl.bounds = canary_kl_bounds;
        sl->top1.bounds = canary_top1_bounds;
    }
    if (!sl) {
        c->unlabelled++;
        return;
    }
    kvpd_hist_observe(&sl->kl, kl);
    kvpd_hist_observe(&sl->top1, top1);
}

int kvpd_canary_recent(const kvpd_metrics *m, double *kl, double *top1)
{
    const kvpd_canary_metrics *c = &m->canary;
    double a = 0.0, b = 0.0;
    for (int i = 0; i < c->recent_n; i++) {
        a += c->recent_kl[i];
        b += c->recent_top1[i];
    }
    *kl = c->recent_n ? a / c->recent_n : 0.0;
    *top1 = c->recent_n ? b / c->recent_n : 0.0;
    return c->recent_n;
}

void kvpd_metrics_init(kvpd_metrics *m)
{
    memset(m, 0, sizeof *m);
    m->ttft.bounds = ttft_bounds;
    m->turn_duration.bounds = turn_bounds;
    m->step_sessions.bounds = step_sessions_bounds;
    m->step_tokens.bounds = step_tokens_bounds;
    m->step_duration.bounds = step_bounds;
    m->queue_wait.bounds = ttft_bounds;
    m->snapshot_write.bounds = snapshot_write_bounds;
    m->snapshot_bytes.bounds = snapshot_bytes_bounds;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m->start_time_s = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kvpd_labelled_add(kvpd_labelled *t, const char *label, int status)
{
    for (int i = 0; i < t->n; i++)
        if (t->e[i].status == status && !strcmp(t->e[i].label, label)) {
            t->e[i].count++;
            return;
        }
    if (t->n == KVPD_LABELLED_MAX - 1 && strcmp(label, "other"))
        label = "other";   /* the last entry is the overflow's */
    if (t->n < KVPD_LABELLED_MAX) {
        t->e[t->n].label = label;
        t->e[t->n].status = status;
        t->e[t->n++].count = 1;
        return;
    }
    for (int i = 0; i < t->n; i++)   /* full: the overflow entry of that status, if any */
        if (!strcmp(t->e[i].label, "other")) {
            t->e[i].count++;
            return;
        }
}


void kvpd_hist_observe(kvpd_hist *h, double v)
{
    int i = 0;
    while (i < KVPD_HIST_BUCKETS - 1 && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}
