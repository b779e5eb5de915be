/* offline/calibrate.c: the fitted score maps and `kvp calibrate`. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/half.h"
#include "offline/agent_train.h"
#include "offline/calibrate.h"
#include "offline/trace.h"
#include "tests/model/testutil.h"
#include "tests/offline/traceutil.h"

/* The fitted map of every agent is monotone (scores strictly ascending, values
 * non-decreasing) within the scores the agent gave, and pooling adjacent violators keeps
 * the mean: the K equal-count bins' values average to the mean target of every (row, cut)
 * pair, computed here from the trace (rows past the sinks and before the recent window,
 * importance per future query). One thread and two give the same knots. */
Test(calibrate, the_fit_is_monotone_and_keeps_the_mean_importance)
{
    kvp_trace t;
    open_trace(&t);
    char err[256];
    kvp_agent_set s, s2;
    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &tiny_arch, err, sizeof err), 0);
    kvp_agent_set_init(&s, 5);
    cr_assert_eq(kvp_agent_set_alloc(&s2, T_LAYERS, T_KVH, &tiny_arch, err, sizeof err), 0);
    kvp_agent_set_init(&s2, 5);
    /* 1920 pairs per agent (6 sequences, cuts 32..88): 8 bins of 240 */
    const int K = 8;
    cr_assert_eq(kvp_calibrate_fit(&s, &t, K, 1, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_calibrate_fit(&s2, &t, K, 2, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(s.n_knots, K);
    cr_assert_eq(memcmp(s.knots, s2.knots, (size_t)T_LAYERS * T_KVH * 2 * K * sizeof(float)), 0);
    float k[T_LEN * T_D], v[T_LEN * T_D], score[T_LEN];
    int32_t pos[T_LEN];
    float *work = malloc(kvp_agent_score_work(&tiny_arch, T_LEN) * sizeof *work);
    for (int i = 0; i < T_LEN; i++)
        pos[i] = i;
    for (int l = 0; l < T_LAYERS; l++)
        for (int h = 0; h < T_KVH; h++) {
            const float *x = kvp_agent_set_knots(&s, l, h), *y = x + K;
            double sum = 0.0, lo = INFINITY, hi = -INFINITY;
            long pairs = 0;
            for (int q = 0; q < T_TRAIN; q++) {
                int len = kvp_trace_len(&t, q);
                const uint16_t *tk = kvp_trace_k(&t, q, l, h), *tv = kvp_trace_v(&t, q, l, h);
                for (int i = 0; i < len * T_D; i++) {
                    k[i] = kvp_f16_to_f32(tk[i]);
                    v[i] = kvp_f16_to_f32(tv[i]);
                }
                kvp_agent_score(&tiny_arch, kvp_agent_set_params(&s, l, h), k, v, pos, len, score, work);
                for (int g = 0; g < kvp_trace_n_cuts(&t.h, len); g++) {
                    int n = t.h.cut_min + g * t.h.cut_stride;
                    const float *imp = kvp_trace_importance(&t, q, l, h, g);
                    for (int i = 4; i < n - 16; i++, pairs++) {
                        sum += imp[i] / (double)(len - n);
                        lo = score[i] < lo ? score[i] : lo;
                        hi = score[i] > hi ? score[i] : hi;
                    }
                }
            }
            cr_assert_eq(pairs % K, 0, "equal bins need %ld pairs divisible by %d", pairs, K);
            double mean_y = 0.0;
            for (int i = 0; i < K; i++) {
                mean_y += y[i] / K;
                if (i) {
                    cr_assert_gt(x[i], x[i - 1], "agent %d,%d knot %d", l, h, i);
                    cr_assert_geq(y[i], y[i - 1], "agent %d,%d knot %d", l, h, i);
                }
            }
            cr_assert(x[0] >= lo && x[K - 1] <= hi, "knots %g..%g outside the scores %g..%g",
                      x[0], x[K - 1], lo, hi);
            cr_assert_float_eq(mean_y, sum / (double)pairs, 1e-4 * sum / (double)pairs + 1e-7,
                               "agent %d,%d: mean %g, pairs' mean %g", l, h, mean_y, sum / pairs);
        }
    free(work);
    kvp_agent_set_free(&s);
    kvp_agent_set_free(&s2);
    kvp_trace_close(&t);
    remove_trace();
}

/* `kvp calibrate` writes the policy with its calibration (version 3) and the same agents;
 * bad values and missing arguments are usage errors, a policy of another shape a runtime
 * error that writes nothing; `kvp train --init` of a calibrated file drops the map. */
Test(calibrate, cli_writes_a_calibrated_policy_and_refuses_bad_input)
{
    const char *dir = trace_dir();
    char pol[256], cal[300], args[1024], err[256], *out;
    snprintf(pol, sizeof pol, "%s/plain.kvp", dir);
    snprintf(cal, sizeof cal, "%s/cal.kvp", dir);
    kvp_agent_set s, r;
    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &tiny_arch, err, sizeof err), 0);
    kvp_agent_set_init(&s, 2);
    cr_assert_eq(kvp_agent_set_save(&s, pol, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--traces %s --policy-file %s --out %s --knots 16 --threads 2",
             dir, pol, cal);
    cr_assert_eq(run_kvp("calibrate", args, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kvp_agent_set_load(&r, cal, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_knots, 16);
    cr_assert_eq(memcmp(r.params, s.params, (size_t)T_LAYERS * T_KVH * s.n_params * sizeof(float)), 0);
    kvp_agent_set_free(&r);
    const char *usage[] = {"", "--traces /tmp", "--knots 1 --traces a --policy-file b --out c",
                           "--knots 257 --traces a --policy-file b --out c",
                           "--knots x --traces a --policy-file b --out c",
                           "--threads 0 --traces a --policy-file b --out c", "--bogus"};
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        cr_assert_eq(run_kvp("calibrate", usage[i], &out), 2, "'%s': %s", usage[i], out);
        cr_assert(strstr(out, "kvp calibrate"), "'%s': %s", usage[i], out);
        free(out);
    }
    char never[300];
    snprintf(never, sizeof never, "%s/never.kvp", dir);
    cr_assert_eq(kvp_agent_set_alloc(&r, T_LAYERS + 1, T_KVH, &tiny_arch, err, sizeof err), 0);
    kvp_agent_set_init(&r, 2);
    char other[300];
    snprintf(other, sizeof other, "%s/other3.kvp", dir);
    cr_assert_eq(kvp_agent_set_save(&r, other, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&r);
    snprintf(args, sizeof args, "--traces %s --policy-file %s --out %s", dir, other, never);
    cr_assert_eq(run_kvp("calibrate", args, &out), 1, "%s", out);
    cr_assert(strstr(out, "3 layers"), "%s", out);
    free(out);
    cr_assert_neq(access(never, F_OK), 0);
    /* trained from a calibrated file: the map is for the old agents, so it is dropped */
    snprintf(args, sizeof args, "%s train --traces %s --out %s --init %s --steps 2 --eval-every 1 "
             "--threads 1 --episodes 2 --samples 2 --val-cut 72 2>&1", tu_build("tools/kvp"), dir,
             never, cal);
    cr_assert_eq(tu_run(args, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kvp_agent_set_load(&r, never, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_knots, 0);
    kvp_agent_set_free(&r);
    kvp_agent_set_free(&s);
    remove_trace();
}

static int float_cmp(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Agents with relative keys are calibrated on their scores of each cut's keys centred on
 * the rows before the cut and turned back by it, at every 8th cut of the grid (here the
 * first): each knot's score is the mean score of its equal-count bin of those scores,
 * computed here by hand. */
Test(calibrate, relative_agents_are_calibrated_on_keys_framed_at_the_cut)
{
    kvp_trace t;
    open_trace(&t);
    char err[256];
    kvp_agent_arch ra = tiny_arch;
    ra.centered = 1;
    ra.relative = 1;
    kvp_agent_set s;
    kvp_rope rope = {.n_rot = T_D, .neox = 0, .base = 100.0f};
    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &ra, err, sizeof err), 0);
    cr_assert_eq(kvp_agent_set_rope(&s, &rope, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&s, 5);
    const int K = 8;
    cr_assert_eq(kvp_calibrate_fit(&s, &t, K, 1, NULL, err, sizeof err), 0, "%s", err);
    float k[T_LEN * T_D], v[T_LEN * T_D], score[T_LEN];
    float pairs[T_TRAIN * T_LEN];
    int32_t pos[T_LEN];
    float *work = malloc(kvp_agent_score_work(&ra, T_LEN) * sizeof *work);
    for (int i = 0; i < T_LEN; i++)
        pos[i] = i;
    int l = 1, h = 0, n = t.h.cut_min, m = 0;
    for (int q = 0; q < T_TRAIN; q++) {
        framed_rows(&t, q, l, h, n, &rope, k, v);
        kvp_agent_score(&ra, kvp_agent_set_params(&s, l, h), k, v, pos, n, score, work);
        for (int i = 4; i < n - 16; i++)
            pairs[m++] = score[i];
    }
    cr_assert_eq(m % K, 0, "%d pairs", m);
    qsort(pairs, (size_t)m, sizeof *pairs, float_cmp);
    const float *x = kvp_agent_set_knots(&s, l, h);
    for (int b = 0; b < K; b++) {
        double a = 0.0;
        for (int i = b * (m / K); i < (b + 1) * (m / K); i++)
            a += pairs[i];
        cr_assert_float_eq(x[b], a / (m / K), 1e-5 * (1.0 + fabs(a / (m / K))), "knot %d", b);
    }
    free(work);
    kvp_agent_set_free(&s);
    kvp_trace_close(&t);
    remove_trace();
}
