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

/* The grid of candidate caps (D, 3D/4, ... D/8 below) and the most candidates a layer
 * can have: a current cap per budget, the context's default and the grid. */
#define GRID 7
#define MAX_CAND (KVP_EVAL_MAX_BUDGETS + 1 + GRID)

void kvp_windowfit_defaults(kvp_windowfit_opts *o)
{
    *o = (kvp_windowfit_opts){.seqs = KVP_WINDOWFIT_SEQS, .min_gain = 0.01, .threads = 1};
}

/* One worker's model state and policy: the policy runs on a view of the set (its
 * parameters, calibration and rotation) with the worker's own caps table, which the fit
 * rewrites between runs. */
typedef struct worker {
    kvp_runstate s;
    kvp_eval_ref ref;
    kvp_agent_set view;
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
    /* the layer being fitted and its candidate caps */
    int layer, n_cand, cand[MAX_CAND];
    const int *cur;     /* [n_layers][n_budgets] the caps chosen so far */
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
    w->ready = 1;
    if ((rc = kvp_eval_ref_init(&w->ref, cfg, f->len, &f->eo)))
        return rc;
    w->view = *f->set;   /* shares the set's arrays; only the caps table is the worker's */
    w->view.caps = NULL;
    char err[256];
    if ((rc = kvp_agent_set_caps(&w->view, f->n_budgets, f->budgets, f->cur, err, sizeof err)))
        return rc;
    if (!(w->p = calloc(1, sizeof *w->p)))
        return -ENOMEM;
    w->p->cfg = *cfg;
    w->p->n_sink = KVP_DEFAULT_SINKS;
    w->p->n_recent = KVP_DEFAULT_RECENT;
    if ((rc = kvp_agent_policy_create_shared(w->p, &w->view, err, sizeof err))) {
        free(w->p);
        w->p = NULL;
    }
    return rc;
}

static void worker_free(worker *w)
{
    if (w->ready)
        kvp_runstate_free(&w->s);
    kvp_eval_ref_free(&w->ref);
    kvp_policy_destroy(w->p);
    free(w->view.caps);
    memset(w, 0, sizeof *w);
}

/* Sequence j: the reference, the prefix, then each (candidate, budget) whose window is
 * not an earlier candidate's at that budget (those share its KL). */
static int fit_job(void *ctx, int wi, int j)
{
    fit *f = ctx;
    worker *w = &f->w[wi];
    int rc;
    if (!w->p && (rc = worker_init(f, w)))
        return rc;
    const int *tokens = kvp_trace_tokens(f->t, f->seqs[j]);
    if ((rc = kvp_eval_ref_compute(&w->ref, f->m, &w->s, tokens)))
        return rc;
    int nb = f->n_budgets, *row = w->view.caps + (size_t)f->layer * nb;
    memcpy(w->view.caps, f->cur, (size_t)f->n_layers * nb * sizeof *f->cur);
    kvp_cache prefix;
    if ((rc = kvp_eval_prefix(f->m, &w->s, w->p, tokens, &w->ref, &prefix)))
        return rc;
    double *kl = f->kl + (size_t)j * f->n_cand * nb;
    for (int c = 0; c < f->n_cand && !rc; c++)
        for (int b = 0; b < nb && !rc; b++) {
            int budget = f->budgets[b], same = -1;
            for (int e = 0; e < c && same < 0; e++)
                if (window_of(budget, f->cand[e]) == window_of(budget, f->cand[c]))
                    same = e;
            double *out = &kl[(size_t)c * nb + b];
            *out = 0.0;
            if (same >= 0) {
                *out = kl[(size_t)same * nb + b];
                continue;
            }
            row[b] = f->cand[c];
            rc = kvp_eval_oneshot(f->m, &w->s, w->p, tokens, &w->ref, &prefix, budget, out);
            row[b] = f->cur[(size_t)f->layer * nb + b];
        }
    kvp_cache_free(&prefix);
    return rc;
}

/* Mean KL of candidate c at budget b over the sequences. */
static double mean_kl(const fit *f, int c, int b)
{
    double s = 0.0;
    for (int q = 0; q < f->n_seqs; q++)
        s += f->kl[((size_t)q * f->n_cand + c) * f->n_budgets + b];
    return s / ((double)(f->len - f->eo.cut - 1) * f->n_seqs);
}

static void add_cand(fit *f, int c)
{
    for (int k = 0; k < f->n_cand; k++)
        if (f->cand[k] == c)
            return;
    if (c >= 1)
        f->cand[f->n_cand++] = c;
}

int kvp_windowfit(kvp_agent_set *set, const kvp_model *m, const kvp_trace *t,
                  const kvp_windowfit_opts *o, kvp_windowfit_result *res, FILE *progress,
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
    int nb = f.n_budgets;
    for (int b = 0; b < nb; b++)
        if (f.budgets[b] < 1 || f.budgets[b] >= cut || (b && f.budgets[b] <= f.budgets[b - 1])) {
            kvp_errorf(err, errlen, 0, "budget %d: the budgets must ascend within 1..%d (below "
                       "the %d rows the sequences are compressed from)", f.budgets[b], cut - 1, cut);
            return -EINVAL;
        }
    if (nb > KVP_AGENT_MAX_CAP_BUDGETS || L != m->cfg.n_layers || len > m->cfg.seq_len ||
        o->seqs < 1 || o->threads < 1) {
        kvp_errorf(err, errlen, 0, "fit-window: the trace (%d-token sequences), policy (%d "
                   "layers) and model (%d layers, context %d) do not fit together, or "
                   "seqs / threads below 1, or more than %d budgets", len, L, m->cfg.n_layers,
                   m->cfg.seq_len, KVP_AGENT_MAX_CAP_BUDGETS);
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
    int *seqs = malloc((size_t)n * sizeof *seqs), *cur = malloc((size_t)L * nb * sizeof *cur);
    f.w = calloc((size_t)o->threads, sizeof *f.w);
    f.kl = malloc((size_t)n * MAX_CAND * nb * sizeof *f.kl);
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
    int ctx_cap = KVP_AGENT_CAP_DEFAULT(m->cfg.seq_len);
    for (int l = 0; l < L && !rc; l++)
        for (int b = 0; b < nb; b++)
            cur[(size_t)l * nb + b] = kvp_agent_set_cap(set, l, f.budgets[b], m->cfg.seq_len);
    f.cur = cur;
    res->n_budgets = nb;
    memcpy(res->budgets, f.budgets, sizeof res->budgets);
    res->seqs = n;

    int D = KVP_AGENT_CAP_DEFAULT(len);
    const int grid[GRID] = {D, 3 * D / 4, D / 2, 3 * D / 8, D / 4,
                                                    3 * D / 16, D / 8};
    double t0 = kvp_now(), last = 0.0;
    openblas_set_num_threads(1);   /* the parallelism is over sequences */
    for (int l = 0; l < L && !rc; l++) {
        double now = kvp_now() - t0;
        if (o->max_seconds > 0 && l > 0 && now + last > o->max_seconds) {
            if (progress)
                fprintf(progress, "fit-window: %.0f s of %.0f used, the next layer would pass "
                        "them: layers %d..%d keep their caps\n", now, o->max_seconds, l, L - 1);
            break;
        }
        int *row = cur + (size_t)l * nb;
        f.layer = l;
        f.n_cand = 0;
        for (int b = 0; b < nb; b++)
            add_cand(&f, row[b]);
        add_cand(&f, ctx_cap);
        for (int g = 0; g < GRID; g++)
            add_cand(&f, grid[g]);
        if ((rc = kvp_pool_run(o->threads, n, fit_job, &f))) {
            kvp_errorf(err, errlen, rc, "fit-window: layer %d", l);
            break;
        }
        if (progress)
            fprintf(progress, "fit-window: layer %d, %d sequences:", l, n);
        /* One cap per layer, applied where it helps: candidate c lowers the KL at the
         * budgets S(c) where its mean KL is below (1 - min_gain) times the current
         * cap's; the layer takes the candidate with the largest summed log gain over its
         * S(c), at those budgets only, and keeps its caps elsewhere. */
        double base[KVP_EVAL_MAX_BUDGETS], best_gain = 0.0;
        int best = -1;
        for (int b = 0; b < nb; b++) {
            int k = 0;
            while (f.cand[k] != row[b])
                k++;
            base[b] = mean_kl(&f, k, b);
            if (l == 0)
                res->kl_before[b] = base[b];
        }
        for (int c = 0; c < f.n_cand; c++) {
            double gain = 0.0;
            for (int b = 0; b < nb; b++) {
                double r = mean_kl(&f, c, b) / fmax(base[b], 1e-300);
                if (r < 1.0 - o->min_gain)
                    gain += log(r);
            }
            if (gain < best_gain) {
                best_gain = gain;
                best = c;
            }
        }
        for (int b = 0; b < nb; b++) {
            double k = best >= 0 ? mean_kl(&f, best, b) : base[b];
            if (best >= 0 && k < base[b] * (1.0 - o->min_gain)) {
                row[b] = f.cand[best];
                res->kl_after[b] = k;
            } else {
                res->kl_after[b] = base[b];
            }
            if (progress)
                fprintf(progress, " budget %d cap %d (KL x%.3f)", f.budgets[b], row[b],
                        res->kl_after[b] / fmax(base[b], 1e-300));
        }
        res->layers_fitted = l + 1;
        last = kvp_now() - t0 - now;
        if (progress) {
            fprintf(progress, " (%.0f s)\n", last);
            fflush(progress);
        }
    }
    for (int i = 0; i < o->threads && f.w; i++)
        worker_free(&f.w[i]);
    /* a cap equal to the context's default is stored as 0: the default wherever it runs */
    for (int i = 0; !rc && i < L * nb; i++)
        if (cur[i] == ctx_cap)
            cur[i] = 0;
    if (!rc)
        rc = kvp_agent_set_caps(set, nb, f.budgets, cur, err, errlen);
    free(seqs);
    free(cur);
    free(f.w);
    free(f.kl);
    return rc;
}
