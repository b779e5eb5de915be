/* Fitting the "kvp" policy's per-layer caps by one-shot KL (offline/windowfit.h). */
#include "offline/windowfit.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/errors.h"
#include "model/forward.h"
#include "offline/pool.h"
#include "policy/policy.h"

void kvp_windowfit_defaults(kvp_windowfit_opts *o)
{
    *o = (kvp_windowfit_opts){.seqs = KVP_WINDOWFIT_SEQS, .min_gain = 0.01, .threads = 1};
}

/* One worker's model state and policy: the policy runs on a view of the set (its
 * parameters, calibration and rotation) with the worker's own caps, which the fit
 * rewrites between runs. */
typedef struct worker {
    kvp_runstate s;
    kvp_eval_ref ref;
    kvp_agent_set view;
    int *caps;          /* [n_layers] the view's caps */
    kvp_policy *p;
    int ready;
} worker;

typedef struct fit {
    const kvp_model *m;
    const kvp_trace *t;
    const kvp_agent_set *set;
    int len, n_layers, n_budgets, budgets[KVP_EVAL_MAX_BUDGETS];
    const int *seqs;    /* [n_seqs] trace sequence indices */
    int n_seqs;
    kvp_eval_opts eo;
    worker *w;
    /* the layer being fitted: current caps, candidates (cand[0] = its current cap) */
    int layer, n_cand, cand[KVP_WINDOWFIT_CANDIDATES];
    const int *cur;     /* [n_layers] */
    double *kl;         /* [n_seqs][n_cand][n_budgets] summed KL of one sequence */
} fit;

static int window_of(int budget, int cap)
{
    return kvp_agent_recent_window(budget, cap, KVP_DEFAULT_RECENT);
}

static int worker_init(fit *f, worker *w)
{
    const kvp_model_config *cfg = &f->m->cfg;
    int rc;
    if ((rc = kvp_runstate_init(&w->s, cfg, f->len)))
        return rc;
    if ((rc = kvp_eval_ref_init(&w->ref, cfg, f->len, &f->eo)))
        return rc;
    if (!(w->caps = malloc((size_t)f->n_layers * sizeof *w->caps)))
        return -ENOMEM;
    w->view = *f->set;   /* shares the set's arrays; only caps is the worker's */
    w->view.caps = w->caps;
    if (!(w->p = calloc(1, sizeof *w->p)))
        return -ENOMEM;
    w->p->cfg = *cfg;
    w->p->n_sink = KVP_DEFAULT_SINKS;
    w->p->n_recent = KVP_DEFAULT_RECENT;
    char err[256];
    if ((rc = kvp_agent_policy_create_shared(w->p, &w->view, err, sizeof err))) {
        free(w->p);
        w->p = NULL;
        return rc;
    }
    w->ready = 1;
    return 0;
}

static void worker_free(worker *w)
{
    if (w->ready)
        kvp_runstate_free(&w->s);
    kvp_eval_ref_free(&w->ref);
    kvp_policy_destroy(w->p);
    free(w->caps);
    memset(w, 0, sizeof *w);
}

/* Sequence j: the reference, the prefix, then every (candidate, budget) whose window
 * differs from the current cap's (the others are the current cap's KL). */
static int fit_job(void *ctx, int wi, int j)
{
    fit *f = ctx;
    worker *w = &f->w[wi];
    int rc;
    if (!w->ready && (rc = worker_init(f, w)))
        return rc;
    const int *tokens = kvp_trace_tokens(f->t, f->seqs[j]);
    if ((rc = kvp_eval_ref_compute(&w->ref, f->m, &w->s, tokens)))
        return rc;
    memcpy(w->caps, f->cur, (size_t)f->n_layers * sizeof *w->caps);
    kvp_cache prefix;
    if ((rc = kvp_eval_prefix(f->m, &w->s, w->p, tokens, &w->ref, &prefix)))
        return rc;
    double *kl = f->kl + (size_t)j * f->n_cand * f->n_budgets;
    for (int c = 0; c < f->n_cand && !rc; c++) {
        w->caps[f->layer] = f->cand[c];
        for (int b = 0; b < f->n_budgets && !rc; b++) {
            int budget = f->budgets[b];
            double *out = &kl[(size_t)c * f->n_budgets + b];
            *out = 0.0;
            if (c && window_of(budget, f->cand[c]) == window_of(budget, f->cand[0]))
                *out = kl[b];
            else
                rc = kvp_eval_oneshot(f->m, &w->s, w->p, tokens, &w->ref, &prefix, budget, out);
        }
    }
    kvp_cache_free(&prefix);
    return rc;
}

/* J of candidate c: mean over budgets of ln(mean KL); mean KL per budget into mean. */
static double objective(const fit *f, int c, double *mean)
{
    double j = 0.0, preds = (double)(f->len - f->eo.cut - 1) * f->n_seqs;
    for (int b = 0; b < f->n_budgets; b++) {
        double s = 0.0;
        for (int q = 0; q < f->n_seqs; q++)
            s += f->kl[((size_t)q * f->n_cand + c) * f->n_budgets + b];
        mean[b] = s / preds;
        j += log(mean[b] + 1e-12);
    }
    return j / f->n_budgets;
}

int kvp_windowfit(kvp_agent_set *set, const kvp_model *m, const kvp_trace *t,
                  const kvp_windowfit_opts *o, kvp_windowfit_result *res, FILE *log,
                  char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    int len = t->h.seq_len, L = set->n_layers, cut = len * 3 / 4;
    fit f = {.m = m, .t = t, .set = set, .len = len, .n_layers = L};
    f.n_budgets = o->n_budgets;
    memcpy(f.budgets, o->budgets, sizeof f.budgets);
    if (!f.n_budgets) {
        static const int div[] = {16, 8, 4, 2};
        for (int i = 0; i < 4; i++)
            f.budgets[f.n_budgets++] = len / div[i];
    }
    for (int b = 0; b < f.n_budgets; b++)
        if (f.budgets[b] < 1 || f.budgets[b] >= cut) {
            kvp_errorf(err, errlen, 0, "budget %d: must be 1..%d (below the %d rows the "
                       "sequences are compressed from)", f.budgets[b], cut - 1, cut);
            return -EINVAL;
        }
    if (L != m->cfg.n_layers || len > m->cfg.seq_len || o->seqs < 1 || o->threads < 1) {
        kvp_errorf(err, errlen, 0, "fit-window: the trace (%d-token sequences), policy (%d "
                   "layers) and model (%d layers, context %d) do not fit together, or "
                   "seqs / threads below 1", len, L, m->cfg.n_layers, m->cfg.seq_len);
        return -EINVAL;
    }
    /* training sequences of the full length, spread evenly */
    int n_full = 0;
    for (int i = 0; i < t->h.n_train; i++)
        n_full += kvp_trace_len(t, i) == len;
    int n = o->seqs < n_full ? o->seqs : n_full;
    if (n < 1) {
        kvp_errorf(err, errlen, 0, "fit-window: the trace has no training sequence of %d tokens", len);
        return -EINVAL;
    }
    int *seqs = malloc((size_t)n * sizeof *seqs), *cur = malloc((size_t)L * sizeof *cur);
    f.w = calloc((size_t)o->threads, sizeof *f.w);
    f.kl = malloc((size_t)n * KVP_WINDOWFIT_CANDIDATES * f.n_budgets * sizeof *f.kl);
    int rc = seqs && cur && f.w && f.kl ? 0 : -ENOMEM;
    for (int i = 0, k = 0, full = 0; !rc && i < t->h.n_train && k < n; i++) {
        if (kvp_trace_len(t, i) != len)
            continue;
        /* the k-th pick is the full sequence nearest (k + 1/2) n_full / n */
        if (full++ == (int)(((double)k + 0.5) * n_full / n))
            seqs[k++] = i;
    }
    f.seqs = seqs;
    f.n_seqs = n;
    f.eo = (kvp_eval_opts){.cut = cut, .n_budgets = 1, .budgets = {f.budgets[0]},
                           .kv_type = KVP_KV_F32, .budget_mode = KVP_BUDGET_PER_HEAD};
    for (int l = 0; l < L && !rc; l++)
        cur[l] = kvp_agent_set_cap(set, l, m->cfg.seq_len);
    f.cur = cur;
    res->n_budgets = f.n_budgets;
    memcpy(res->budgets, f.budgets, sizeof res->budgets);
    res->seqs = n;

    int D = KVP_AGENT_CAP_DEFAULT(len);
    const int grid[KVP_WINDOWFIT_CANDIDATES - 1] = {D, 3 * D / 4, D / 2, 3 * D / 8, D / 4,
                                                    3 * D / 16, D / 8};
    double t0 = kvp_now(), last = 0.0, mean[KVP_EVAL_MAX_BUDGETS];
    openblas_set_num_threads(1);   /* the parallelism is over sequences */
    for (int l = 0; l < L && !rc; l++) {
        double now = kvp_now() - t0;
        if (o->max_seconds > 0 && l > 0 && now + last > o->max_seconds) {
            if (log)
                fprintf(log, "fit-window: %.0f s of %.0f used, the next layer would pass "
                        "them: layers %d..%d keep their caps\n", now, o->max_seconds, l, L - 1);
            break;
        }
        f.layer = l;
        f.n_cand = 0;
        f.cand[f.n_cand++] = cur[l];
        for (int g = 0; g < KVP_WINDOWFIT_CANDIDATES - 1; g++) {
            int c = grid[g], differs = 0;
            for (int b = 0; b < f.n_budgets; b++)
                differs |= c >= 1 && window_of(f.budgets[b], c) != window_of(f.budgets[b], cur[l]);
            for (int k = 0; k < f.n_cand; k++)
                differs &= c != f.cand[k];
            if (differs)
                f.cand[f.n_cand++] = c;
        }
        if ((rc = kvp_pool_run(o->threads, n, fit_job, &f))) {
            kvp_errorf(err, errlen, rc, "fit-window: layer %d", l);
            break;
        }
        int best = 0;
        double j0 = objective(&f, 0, mean), jbest = j0;
        if (l == 0)
            memcpy(res->kl_before, mean, sizeof mean);
        if (log)
            fprintf(log, "fit-window: layer %d, %d sequences:", l, n);
        for (int c = 0; c < f.n_cand; c++) {
            double j = objective(&f, c, mean);
            if (log)
                fprintf(log, " cap %d %.4f%s", f.cand[c], exp(j - j0), c ? "" : " (current)");
            if (j < jbest) {
                jbest = j;
                best = c;
            }
        }
        if (best && exp(jbest - j0) > 1.0 - o->min_gain)
            best = 0;
        cur[l] = f.cand[best];
        objective(&f, best, mean);
        memcpy(res->kl_after, mean, sizeof mean);
        res->layers_fitted = l + 1;
        last = kvp_now() - t0 - now;
        if (log) {
            fprintf(log, " -> cap %d (%.0f s)\n", cur[l], last);
            fflush(log);
        }
    }
    for (int i = 0; i < o->threads && f.w; i++)
        worker_free(&f.w[i]);
    if (!rc)
        rc = kvp_agent_set_caps(set, cur, err, errlen);
    free(seqs);
    free(cur);
    free(f.w);
    free(f.kl);
    return rc;
}
