/* observe/metrics.c: histogram buckets, the labelled counters and their overflow, the
 * canary's slots and recent means. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "observe/metrics.h"

Test(metrics, an_observation_goes_to_the_first_bucket_at_or_above_it)
{
    static const double b[KVPD_HIST_BUCKETS - 1] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    kvpd_hist h = {.bounds = b};
    kvpd_hist_observe(&h, 0.5);
    kvpd_hist_observe(&h, 1);      /* le="1" holds 1 itself */
    kvpd_hist_observe(&h, 1.01);
    kvpd_hist_observe(&h, 11);
    kvpd_hist_observe(&h, 12);     /* +Inf */
    cr_assert_eq(h.counts[0], 2);
    cr_assert_eq(h.counts[1], 1);
    cr_assert_eq(h.counts[10], 1);
    cr_assert_eq(h.counts[KVPD_HIST_BUCKETS - 1], 1);
    cr_assert_eq(h.count, 5);
    cr_assert_float_eq(h.sum, 25.51, 1e-9);
}

Test(metrics, labelled_counters_overflow_into_other)
{
    static kvpd_labelled t;
    memset(&t, 0, sizeof t);
    kvpd_labelled_add(&t, "/v1/models", 200);
    kvpd_labelled_add(&t, "/v1/models", 200);
    kvpd_labelled_add(&t, "/v1/models", 404);
    cr_assert_eq(t.n, 2, "one entry per (label, status)");
    cr_assert_eq(t.e[0].count, 2);
    cr_assert_eq(t.e[1].count, 1);
    static char names[KVPD_LABELLED_MAX + 10][16];
    for (int i = 0; i < KVPD_LABELLED_MAX + 10; i++) {
        snprintf(names[i], sizeof names[i], "/p%d", i);
        kvpd_labelled_add(&t, names[i], 200);
    }
    cr_assert_eq(t.n, KVPD_LABELLED_MAX, "the table never grows past its size");
    cr_assert_str_eq(t.e[KVPD_LABELLED_MAX - 1].label, "other");
    /* 2 entries, then 61 named ones, then the rest counted as other */
    cr_assert_eq(t.e[KVPD_LABELLED_MAX - 1].count, (KVPD_LABELLED_MAX + 10) - (KVPD_LABELLED_MAX - 3));
    uint64_t total = 0;
    for (int i = 0; i < t.n; i++)
        total += t.e[i].count;
    cr_assert_eq(total, 3 + KVPD_LABELLED_MAX + 10, "nothing is lost");
    kvpd_labelled_add(&t, "/v1/models", 200);   /* an existing entry still counts */
    cr_assert_eq(t.e[0].count, 3);
}

Test(metrics, canary_slots_and_recent_means)
{
    static kvpd_metrics m;
    kvpd_metrics_init(&m);
    double kl, top1;
    cr_assert_eq(kvpd_canary_recent(&m, &kl, &top1), 0);
    cr_assert_eq(kl, 0.0);
    kvpd_canary_observe(&m, "kvp", 64, 0.01, 0.9);
    kvpd_canary_observe(&m, "kvp", 64, 0.03, 0.7);
    kvpd_canary_observe(&m, "kvp", 128, 0.02, 1.0);
    cr_assert_eq(m.canary.n_slots, 2, "one slot per (policy, budget)");
    cr_assert_eq(m.canary.slot[0].kl.count, 2);
    cr_assert_eq(m.canary.slot[1].top1.count, 1);
    cr_assert_eq(kvpd_canary_recent(&m, &kl, &top1), 3);
    cr_assert_float_eq(kl, 0.02, 1e-12);
    cr_assert_float_eq(top1, 2.6 / 3, 1e-12);
    for (int i = 0; i < KVPD_CANARY_SLOTS + 2; i++)
        kvpd_canary_observe(&m, "h2o", i, 0.5, 0.5);
    cr_assert_eq(m.canary.n_slots, KVPD_CANARY_SLOTS);
    cr_assert_eq(m.canary.unlabelled, 4, "pairs past the slots count as unlabelled");
    cr_assert_eq(m.canary.runs, 3 + KVPD_CANARY_SLOTS + 2);
    /* the recent means cover the last KVPD_CANARY_RECENT turns only */
    for (int i = 0; i < KVPD_CANARY_RECENT; i++)
        kvpd_canary_observe(&m, "kvp", 64, 0.25, 0.75);
    cr_assert_eq(kvpd_canary_recent(&m, &kl, &top1), KVPD_CANARY_RECENT);
    cr_assert_float_eq(kl, 0.25, 1e-12);
    cr_assert_float_eq(top1, 0.75, 1e-12);
}
