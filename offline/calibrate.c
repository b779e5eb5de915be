/* Per-head calibration of KVP scores on traces (offline/calibrate.h). */
#include "offline/calibrate.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/half.h"
#include "offline/pool.h"
#include "policy/policy.h"

typedef struct pair {
    float score, target;
} pair;

static int by_pair_score(const void *a, const void *b)
{
    const pair *x = a, *y = b;
    return (x->score > y->score) - (x->score < y->score);
}

typedef struct fit_job {
    const kvp_agent_set *s;
    const kvp_trace *t;
    int n_knots;
    float *knots;              /* [agents][2][n_knots], each job writes its agents' */
    int agents;
    atomic_long rows;          /* pairs of an agent fitted (for the log) */
} fit_job;

/* Agents with centred or relative keys score a sequence's rows again at every cut (the mean
 * key and the frame are the cut's), so they are calibrated on every CENTRED_CUT_STRIDE-th cut of the grid: a
 * few hundred thousand pairs per agent still, at an eighth of the scoring. */
#define CENTRED_CUT_STRIDE 8

/* The pairs of agent a over the training sequences; *out malloc'd. -ENOMEM or the count. */
static long agent_pairs(const fit_job *j, int a, pair **out)
{
    const kvp_trace *t = j->t;
    const kvp_agent_arch *ar = &j->s->arch;
    int layer = a / t->h.n_kv_heads, kvh = a % t->h.n_kv_heads, d = ar->d, len_max = 0;
    int rescored = ar->centered || ar->relative;   /* scores that depend on the cut */
    long total = 0;
    for (int q = 0; q < t->h.n_train; q++) {
        int len = kvp_trace_len(t, q), cuts = kvp_trace_n_cuts(&t->h, len);
        len_max = len > len_max ? len : len_max;
        for (int g = 0; g < cuts; g += rescored ? CENTRED_CUT_STRIDE : 1) {
            int n = t->h.cut_min + g * t->h.cut_stride;
            total += n - KVP_DEFAULT_RECENT - KVP_DEFAULT_SINKS > 0
                         ? n - KVP_DEFAULT_RECENT - KVP_DEFAULT_SINKS : 0;
        }
    }
    pair *p = malloc(((size_t)total + 1) * sizeof *p);
    float *k = malloc(((size_t)len_max + 1) * d * sizeof *k), *v = malloc(((size_t)len_max + 1) * d * sizeof *v);
    float *score = malloc(((size_t)len_max + 1) * sizeof *score);
    float *work = malloc(kvp_agent_score_work(ar, len_max > 0 ? len_max : 1) * sizeof *work);
    int32_t *pos = malloc(((size_t)len_max + 1) * sizeof *pos);
    /* centred keys: the mean, then the cut's keys centred */
    float *kc = rescored ? malloc(((size_t)len_max + 2) * d * sizeof *kc) : NULL;
    long m = 0;
    if (p && k && v && score && work && pos && (kc || !rescored)) {
        const float *w = kvp_agent_set_params(j->s, layer, kvh);
        for (int q = 0; q < t->h.n_train; q++) {
            int len = kvp_trace_len(t, q), cuts = kvp_trace_n_cuts(&t->h, len);
            if (!cuts)
                continue;
            const uint16_t *tk = kvp_trace_k(t, q, layer, kvh), *tv = kvp_trace_v(t, q, layer, kvh);
            for (size_t i = 0; i < (size_t)len * d; i++) {
                k[i] = kvp_f16_to_f32(tk[i]);
                v[i] = kvp_f16_to_f32(tv[i]);
            }
            for (int i = 0; i < len; i++)
                pos[i] = i;
            if (!rescored)
                kvp_agent_score(ar, w, k, v, pos, len, score, work);
            for (int g = 0; g < cuts; g += rescored ? CENTRED_CUT_STRIDE : 1) {
                int n = t->h.cut_min + g * t->h.cut_stride;
                const float *imp = kvp_trace_importance(t, q, layer, kvh, g);
                float per_query = 1.0f / (float)(len - n);
                if (rescored) {   /* keys centred on the cache at this cut: rows [0, n); relative
                                     keys then turned back by n */
                    kvp_agent_key_mean(d, k, ar->centered ? n : 0, kc);
                    memcpy(kc + d, k, (size_t)n * d * sizeof *kc);
                    kvp_agent_center_keys(d, kc + d, n, kc);
                    if (ar->relative)
                        kvp_agent_relative_keys(&j->s->rope, d, kc + d, n, n);
                    kvp_agent_score(ar, w, kc + d, v, pos, n, score, work);
                }
                for (int i = KVP_DEFAULT_SINKS; i < n - KVP_DEFAULT_RECENT; i++)
                    p[m++] = (pair){score[i], imp[i] * per_query};
            }
        }
    }
    free(k);
    free(v);
    free(score);
    free(work);
    free(pos);
    free(kc);
    if (!p || m < 0 || (m == 0 && total > 0)) {
        free(p);
        return -ENOMEM;
    }
    *out = p;
    return m;
}

/* Equal-count bins of the pairs sorted by score, then pool-adjacent-violators on the
 * bins' mean targets. x[K] strictly ascending, y[K] non-decreasing. */
static void fit_knots(pair *p, long m, int K, float *x, float *y)
{
    qsort(p, (size_t)m, sizeof *p, by_pair_score);
    double *wsum = malloc((size_t)K * sizeof *wsum), *ysum = malloc((size_t)K * sizeof *ysum);
    int *start = malloc((size_t)K * sizeof *start);   /* PAV blocks: first bin of each */
    if (!wsum || !ysum || !start) {
        free(wsum), free(ysum), free(start);
        for (int b = 0; b < K; b++)
            x[b] = (float)b, y[b] = 0.0f;
        return;
    }
    for (int b = 0; b < K; b++) {
        long lo = m * b / K, hi = m * (b + 1) / K;
        double sx = 0.0, sy = 0.0;
        for (long i = lo; i < hi; i++)
            sx += p[i].score, sy += p[i].target;
        float mx = hi > lo ? (float)(sx / (double)(hi - lo)) : b ? x[b - 1] : 0.0f;
        /* ties across a bin edge: keep the scores strictly ascending */
        x[b] = b && !(mx > x[b - 1]) ? nextafterf(x[b - 1], INFINITY) : mx;
        wsum[b] = (double)(hi - lo);
        ysum[b] = sy;
    }
    /* pool adjacent violators: blocks of bins with one mean, means non-decreasing */
    int nb = 0;
    double *bw = malloc((size_t)K * sizeof *bw), *by = malloc((size_t)K * sizeof *by);
    if (bw && by) {
        for (int b = 0; b < K; b++) {
            start[nb] = b, bw[nb] = wsum[b], by[nb] = ysum[b], nb++;
            while (nb > 1 && by[nb - 2] * bw[nb - 1] > by[nb - 1] * bw[nb - 2]) {
                bw[nb - 2] += bw[nb - 1], by[nb - 2] += by[nb - 1];
                nb--;
            }
        }
        for (int i = 0; i < nb; i++) {
            int end = i + 1 < nb ? start[i + 1] : K;
            float mean = bw[i] > 0 ? (float)(by[i] / bw[i]) : 0.0f;
            for (int b = start[i]; b < end; b++)
                y[b] = mean;
        }
        for (int b = 1; b < K; b++)   /* float rounding of equal means */
            y[b] = y[b] < y[b - 1] ? y[b - 1] : y[b];
    }
    free(bw), free(by), free(wsum), free(ysum), free(start);
}

/* One agent's fit (a pool job): its pairs from the trace, then the knots. */
static int fit_job_run(void *arg, int worker, int a)
{
    (void)worker;
    fit_job *j = arg;
    pair *p = NULL;
    long m = agent_pairs(j, a, &p);
    if (m <= 0) {
        free(p);
        return m < 0 ? -ENOMEM : -EINVAL;
    }
    float *x = j->knots + (size_t)a * 2u * (size_t)j->n_knots;
    fit_knots(p, m, j->n_knots, x, x + j->n_knots);
    free(p);
    atomic_store(&j->rows, m);
    return 0;
}

int kvp_calibrate_fit(kvp_agent_set *s, const kvp_trace *t, int n_knots, int threads,
                      FILE *log, char *err, size_t errlen)
{
    if (n_knots < 2 || n_knots > KVP_CALIBRATION_MAX_KNOTS) {
        kvp_errorf(err, errlen, 0, "calibration knots %d (2..%d)", n_knots, KVP_CALIBRATION_MAX_KNOTS);
        return -EINVAL;
    }
    if (s->n_layers != t->h.n_layers || s->n_kv_heads != t->h.n_kv_heads ||
        s->arch.d != t->h.head_dim) {
        kvp_errorf(err, errlen, 0, "policy is for %d layers x %d KV heads x head_dim %d, the "
                   "trace for %d x %d x %d", s->n_layers, s->n_kv_heads, s->arch.d,
                   t->h.n_layers, t->h.n_kv_heads, t->h.head_dim);
        return -EINVAL;
    }
    fit_job j = {.s = s, .t = t, .n_knots = n_knots, .agents = s->n_layers * s->n_kv_heads};
    atomic_init(&j.rows, 0);
    j.knots = malloc((size_t)j.agents * 2u * (size_t)n_knots * sizeof *j.knots);
    if (!j.knots) {
        kvp_errorf(err, errlen, 0, "out of memory");
        return -ENOMEM;
    }
    int rc = kvp_pool_run(threads < 1 ? 1 : threads, j.agents, fit_job_run, &j);
    if (rc)
        kvp_errorf(err, errlen, 0, rc == -ENOMEM ? "out of memory"
                   : "the trace has no training rows past the sinks and recent window to fit on");
    else
        rc = kvp_agent_set_calibration(s, n_knots, j.knots, err, errlen);
    if (!rc && log)
        fprintf(log, "calibrate: %d agents, %d knots each, %ld (score, importance) pairs per agent\n",
                j.agents, n_knots, atomic_load(&j.rows));
    free(j.knots);
    return rc;
}
