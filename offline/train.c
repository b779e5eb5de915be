#include "offline/pool.h"
#include "offline/train.h"
#include "model/logprobs.h"
#include "offline/agent_train.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "generate/generate.h"
#include "model/sampler.h"
#include "base/errors.h"
#include "base/clock.h"
#include "model/quant.h"


/* ---- Plackett-Luce, sampling, cost ------------------------------------------------- */

double kvp_pl_logprob(const float *s, const int32_t *sigma, int n, float *grad,
                      double *work)
{
    double *lse = work;   /* lse[r] = logsumexp of s over sigma[r..n-1] */
    double acc = 0.0, lp = 0.0;
    for (int r = n - 1; r >= 0; r--) {
        double x = s[sigma[r]];
        if (r == n - 1)
            acc = x;
        else
            acc = x > acc ? x + log1p(exp(acc - x)) : acc + log1p(exp(x - acc));
        lse[r] = acc;
        lp += x - acc;
    }
    if (!grad)
        return lp;
    /* d log pi / d s_{sigma_m} = 1 - sum over r <= m of exp(s_{sigma_m} - lse[r]).
     * q_m = sum over r <= m of exp(lse[m] - lse[r]) grows by a factor <= 1 per step
     * (lse only shrinks along the ranking), so it never overflows. */
    double q = 0.0;
    for (int m = 0; m < n; m++) {
        q = (m ? q * exp(lse[m] - lse[m - 1]) : 0.0) + 1.0;
        grad[sigma[m]] = (float)(1.0 - exp((double)s[sigma[m]] - lse[m]) * q);
    }
    return lp;
}

double kvp_listwise_loss(const float *s, const float *imp, int n, float w, float *grad)
{
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += imp[i];
    if (n <= 0 || !(total > 0.0) || !isfinite(total))
        return 0.0;
    double lz = kvp_log_sum_exp(s, n), loss = 0.0;
    if (!isfinite(lz))
        return 0.0;
    for (int i = 0; i < n; i++) {
        double p = imp[i] / total, lq = s[i] - lz;
        loss -= p * lq;
        if (grad)
            grad[i] += (float)(w * (exp(lq) - p));
    }
    return loss;
}

static int key_cmp(const void *pa, const void *pb)
{
    const kvp_rank_key *a = pa, *b = pb;
    if (a->key != b->key)
        return a->key > b->key ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

void kvp_argsort_desc(const float *key, int n, int32_t *order, kvp_rank_key *work)
{
    for (int i = 0; i < n; i++)
        work[i] = (kvp_rank_key){key[i], i};
    qsort(work, (size_t)n, sizeof *work, key_cmp);
    for (int i = 0; i < n; i++)
        order[i] = work[i].idx;
}

void kvp_gumbel_rank(const float *s, int n, uint64_t *rng, int32_t *sigma,
                     kvp_rank_key *work)
{
    for (int i = 0; i < n; i++) {
        /* u in (0, 1): kvp_rand_f32 can return 0 */
        double u = (double)kvp_rand_f32(rng) + 0x1p-25;
        work[i] = (kvp_rank_key){s[i] + (float)-log(-log(u)), i};
    }
    qsort(work, (size_t)n, sizeof *work, key_cmp);
    for (int i = 0; i < n; i++)
        sigma[i] = work[i].idx;
}

double kvp_rank_cost(const float *imp, const int32_t *sigma, int n)
{
    double c = 0.0;
    for (int r = 0; r < n; r++)
        c += (double)(r + 1) * imp[sigma[r]];
    return c;
}

double kvp_oracle_cost(const float *imp, int n, int32_t *order, kvp_rank_key *work)
{
    kvp_argsort_desc(imp, n, order, work);
    return kvp_rank_cost(imp, order, n);
}

double kvp_rank_reward(double cost, double oracle_cost)
{
    return -cost / (oracle_cost > 1e-8 ? oracle_cost : 1e-8);
}

void kvp_rloo_advantages(const double *reward, int n_ep, int k, float clamp, float *adv)
{
    int n = n_ep * k;
    double mean = 0.0, var = 0.0;
    for (int e = 0; e < n_ep; e++) {
        double sum = 0.0;
        for (int j = 0; j < k; j++)
            sum += reward[e * k + j];
        for (int j = 0; j < k; j++) {
            double r = reward[e * k + j];
            adv[e * k + j] = (float)(r - (sum - r) / (k - 1));
        }
    }
    for (int i = 0; i < n; i++)
        mean += adv[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        var += (adv[i] - mean) * (adv[i] - mean);
    double sd = sqrt(var / n);
    for (int i = 0; i < n; i++) {
        float x = sd > 0.0 ? (float)((adv[i] - mean) / sd) : 0.0f;
        adv[i] = x > clamp ? clamp : x < -clamp ? -clamp : x;
    }
}

/* ---- optimiser -------------------------------------------------------------------- */

void kvp_adamw_step(const kvp_adamw *o, float lr, long t, float *w, const float *g,
                    float *m, float *v, size_t n)
{
    float c1 = 1.0f / (1.0f - powf(o->beta1, (float)t));
    float c2 = 1.0f / (1.0f - powf(o->beta2, (float)t));
    for (size_t i = 0; i < n; i++) {
        m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * g[i];
        v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * g[i] * g[i];
        float step = (m[i] * c1) / (sqrtf(v[i] * c2) + o->eps);
        w[i] -= lr * (step + o->weight_decay * w[i]);
    }
}

float kvp_clip_grad_norm(float *g, size_t n, float max_norm)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)g[i] * g[i];
    float norm = (float)sqrt(ss);
    if (norm > max_norm) {
        float f = max_norm / norm;
        for (size_t i = 0; i < n; i++)
            g[i] *= f;
    }
    return norm;
}

void kvp_ema_update(float *ema, const float *w, size_t n, float decay)
{
    for (size_t i = 0; i < n; i++)
        ema[i] = decay * ema[i] + (1.0f - decay) * w[i];
}

/* ---- settings --------------------------------------------------------------------- */

void kvp_train_defaults(kvp_train_cfg *c)
{
    *c = (kvp_train_cfg){
        .steps = 3000, .seed = 1, .threads = 1, .episodes = 16, .samples = 8,
        .lr = 3e-3f, .lr_min = 1e-6f, .warmup = 100, .warmup_start = 0.01f,
        .adamw = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-3f},
        .clip = 5.0f, .ema = 0.99f, .adv_clamp = 2.0f, .listwise = 100.0f, .n_sink = KVP_DEFAULT_SINKS, .n_recent = KVP_DEFAULT_RECENT,
        .val_cut = 384, .eval_every = 100,
        .stream_share = 0.0f, .stream_chunk = KVP_DEFAULT_CHUNK, .n_stream_budgets = 4,
        .stream_budgets = {32, 64, 128, 256},
    };
}

float kvp_train_lr(const kvp_train_cfg *c, long t)
{
    if (t < c->warmup)
        return c->lr * (c->warmup_start + (1.0f - c->warmup_start) * (float)t / (float)c->warmup);
    long span = c->steps - c->warmup;
    double p = span > 1 ? (double)(t - c->warmup) / (double)(span - 1) : 1.0;
    return c->lr_min + (c->lr - c->lr_min) * (float)(0.5 * (1.0 + cos(M_PI * (p > 1.0 ? 1.0 : p))));
}

/* Trace row r of (layer, kvh) as f32 key and value rows of the head's d numbers. */
static void decode_row(const kvp_trace *t, int seq, int layer, int kvh, int r, float *k, float *v)
{
    int d = t->h.head_dim;
    const uint16_t *kr = kvp_trace_k(t, seq, layer, kvh) + (size_t)r * d;
    const uint16_t *vr = kvp_trace_v(t, seq, layer, kvh) + (size_t)r * d;
    for (int j = 0; j < d; j++) {
        k[j] = kvp_f16_to_f32(kr[j]);
        v[j] = kvp_f16_to_f32(vr[j]);
    }
}

/* Rows [first, first + n) of (layer, kvh) gathered into contiguous f32 k, v [n][d] and
 * their positions. */
static void gather_rows(const kvp_trace *t, int seq, int layer, int kvh, int first, int n,
                        float *k, float *v, int32_t *pos)
{
    size_t d = (size_t)t->h.head_dim;
    for (int i = 0; i < n; i++) {
        decode_row(t, seq, layer, kvh, first + i, k + i * d, v + i * d);
        pos[i] = first + i;
    }
}

/* Rows idx[0..n) of (layer, kvh) gathered like gather_rows, with their importance. */
static void gather_list(const kvp_trace *t, int seq, int layer, int kvh, const int32_t *idx,
                        int n, const float *imp_all, float *k, float *v, int32_t *pos,
                        float *imp)
{
    size_t d = (size_t)t->h.head_dim;
    for (int i = 0; i < n; i++) {
        decode_row(t, seq, layer, kvh, idx[i], k + i * d, v + i * d);
        pos[i] = idx[i];
        imp[i] = imp_all[idx[i]];
    }
}

/* Centred keys (kvp_agent_net.h): k[m][d] minus the mean key of the sequence's rows
 * [0, n), the cache at the cut before any eviction. A streaming decision is centred on
 * that too, not on its survivors: the agents learn one frame of reference, and the
 * ranking and one-shot figures are better for it (docs/evaluation.md, "Centred keys").
 * Relative keys are then turned back by n, the position the first query after the cut
 * takes. Nothing happens for agents with raw keys. */
static void frame_episode(const kvp_trace *t, const kvp_agent_set *s, int seq, int layer,
                          int kvh, int n, float *k, int m)
{
    int d = t->h.head_dim;
    if (s->arch.centered) {
        double acc[KVP_AGENT_MAX_D] = {0};
        float kr[KVP_AGENT_MAX_D], vr[KVP_AGENT_MAX_D], mean[KVP_AGENT_MAX_D];
        for (int r = 0; r < n; r++) {
            decode_row(t, seq, layer, kvh, r, kr, vr);
            for (int j = 0; j < d; j++)
                acc[j] += kr[j];
        }
        for (int j = 0; j < d; j++)
            mean[j] = n ? (float)(acc[j] / n) : 0.0f;
        kvp_agent_center_keys(d, k, m, mean);
    }
    if (s->arch.relative)
        kvp_agent_relative_keys(&s->rope, d, k, m, n);
}

/* ---- validation --------------------------------------------------------------------- */

typedef struct val_ctx {
    const kvp_trace *t;
    const kvp_agent_set *s;
    int cut, n_sink, n_recent;
    double *per_agent;
} val_ctx;

static int val_job(void *arg, int worker, int a)
{
    (void)worker;
    val_ctx *c = arg;
    const kvp_trace *t = c->t;
    const kvp_agent_set *s = c->s;
    int layer = a / s->n_kv_heads, kvh = a % s->n_kv_heads, d = s->arch.d;
    int m = c->cut - c->n_sink - c->n_recent, g = kvp_trace_cut_index(&t->h, c->cut);
    float *k = malloc((size_t)m * d * sizeof *k), *v = malloc((size_t)m * d * sizeof *v);
    int32_t *pos = malloc((size_t)m * sizeof *pos), *order = malloc((size_t)m * sizeof *order);
    float *scores = malloc((size_t)m * sizeof *scores);
    float *swork = malloc(kvp_agent_score_work(&s->arch, m) * sizeof *swork);
    kvp_rank_key *rk = malloc((size_t)m * sizeof *rk);
    int rc = -ENOMEM;
    if (!k || !v || !pos || !order || !scores || !swork || !rk)
        goto out;
    double sum = 0.0;
    int count = 0;
    const float *w = kvp_agent_set_params(s, layer, kvh);
    for (int seq = t->h.n_train; seq < t->h.n_seqs; seq++) {
        if (g >= kvp_trace_n_cuts(&t->h, kvp_trace_len(t, seq)))
            continue;
        const float *imp = kvp_trace_importance(t, seq, layer, kvh, g);
        gather_rows(t, seq, layer, kvh, c->n_sink, m, k, v, pos);
        frame_episode(t, s, seq, layer, kvh, c->cut, k, m);
        kvp_agent_score(&s->arch, w, k, v, pos, m, scores, swork);
        kvp_argsort_desc(scores, m, order, rk);
        double cost = kvp_rank_cost(imp + c->n_sink, order, m);
        double best = kvp_oracle_cost(imp + c->n_sink, m, order, rk);
        sum -= kvp_rank_reward(cost, best);
        count++;
    }
    c->per_agent[a] = sum / count;
    rc = 0;
out:
    free(k);
    free(v);
    free(pos);
    free(order);
    free(scores);
    free(swork);
    free(rk);
    return rc;
}

int kvp_train_validate(const kvp_trace *t, const kvp_agent_set *s, int cut, int n_sink,
                       int n_recent, int threads, double *mean, double *per_agent,
                       char *err, size_t errlen)
{
    int n_agents = s->n_layers * s->n_kv_heads, usable = 0;
    if (cut < n_sink + n_recent + 2)
        return KVP_ERR(-EINVAL, "validation cut %d leaves fewer than 2 rows to rank after %d sinks "
                   "and %d recent rows", cut, n_sink, n_recent);
    int g = kvp_trace_cut_index(&t->h, cut);
    if (g < 0)
        return KVP_ERR(-EINVAL, "the validation cut %d is not on the trace's grid of cuts (%d, %d, "
                   "%d, ...)", cut, t->h.cut_min, t->h.cut_min + t->h.cut_stride,
                   t->h.cut_min + 2 * t->h.cut_stride);
    for (int seq = t->h.n_train; seq < t->h.n_seqs; seq++)
        usable += g < kvp_trace_n_cuts(&t->h, kvp_trace_len(t, seq));
    if (!usable)
        return KVP_ERR(-EINVAL, "no validation sequence has the validation cut %d and the %d "
                   "tokens after it", cut, t->h.cut_tail);
    openblas_set_num_threads(1);   /* the parallelism is over agents */
    double *pa = per_agent ? per_agent : malloc((size_t)n_agents * sizeof *pa);
    if (!pa)
        return KVP_ERR(-ENOMEM, "out of memory");
    val_ctx c = {.t = t, .s = s, .cut = cut, .n_sink = n_sink, .n_recent = n_recent,
                 .per_agent = pa};
    int rc = kvp_pool_run(threads, n_agents, val_job, &c);
    if (!rc) {
        double sum = 0.0;
        for (int a = 0; a < n_agents; a++)
            sum += pa[a];
        *mean = sum / n_agents;
    }
    if (pa != per_agent)
        free(pa);
    return rc ? KVP_ERR(rc, "out of memory") : 0;
}

/* ---- training ------------------------------------------------------------------------ */

typedef struct agent_state {
    float *w, *ema, *m, *v, *grad;
    uint64_t rng;
    double *step_cost;    /* [eval_every]: mean sampled C/C* of each step of a round */
} agent_state;

typedef struct worker {
    kvp_agent_acts *acts;
    float *k, *v, *scores, *dscores, *pl_grad;
    float *imp;                      /* streaming episodes' gathered importance */
    float *behave, *behave_work;     /* their behaviour scores and its scratch */
    int32_t *pos, *sigma, *order, *kept;
    double *pl_work, *reward;
    float *adv;
    kvp_rank_key *rank_work;
} worker;

typedef struct train_ctx {
    const kvp_trace *t;
    const kvp_agent_set *s;
    const kvp_train_cfg *c;
    agent_state *agents;
    worker *workers;
    int *usable;          /* training sequences long enough for the smallest cut */
    int n_usable;
    long step0, step1;    /* the round being run */
} train_ctx;

typedef struct episode {
    int off, m;           /* its ranked rows in the step's batch */
    const float *imp;     /* their importance */
} episode;

static void worker_free(worker *w)
{
    kvp_agent_acts_free(w->acts);
    free(w->k);
    free(w->v);
    free(w->scores);
    free(w->dscores);
    free(w->pl_grad);
    free(w->imp);
    free(w->behave);
    free(w->behave_work);
    free(w->kept);
    free(w->pos);
    free(w->sigma);
    free(w->order);
    free(w->pl_work);
    free(w->reward);
    free(w->adv);
    free(w->rank_work);
}

static int worker_init(worker *w, const kvp_agent_arch *a, int len, const kvp_train_cfg *c)
{
    size_t rows = (size_t)c->episodes * len, d = (size_t)a->d, nk = (size_t)c->episodes * c->samples;
    *w = (worker){0};
    w->acts = kvp_agent_acts_new(a, (int)rows);
    w->k = malloc(rows * d * sizeof(float));
    w->v = malloc(rows * d * sizeof(float));
    w->scores = malloc(rows * sizeof(float));
    w->dscores = malloc(rows * sizeof(float));
    w->pl_grad = malloc((size_t)len * sizeof(float));
    w->imp = malloc(rows * sizeof(float));
    w->behave = malloc((size_t)len * sizeof(float));
    w->behave_work = malloc(kvp_agent_score_work(a, len) * sizeof(float));
    w->kept = malloc((size_t)len * sizeof(int32_t));
    w->pos = malloc(rows * sizeof(int32_t));
    w->sigma = malloc(nk * len * sizeof(int32_t));
    w->order = malloc((size_t)len * sizeof(int32_t));
    w->pl_work = malloc((size_t)len * sizeof(double));
    w->reward = malloc(nk * sizeof(double));
    w->adv = malloc(nk * sizeof(float));
    w->rank_work = malloc((size_t)len * sizeof(kvp_rank_key));
    if (!w->acts || !w->k || !w->v || !w->scores || !w->dscores || !w->pl_grad ||
        !w->imp || !w->behave || !w->behave_work || !w->kept ||
        !w->pos || !w->sigma || !w->order || !w->pl_work || !w->reward ||
        !w->adv || !w->rank_work) {
        worker_free(w);
        return -ENOMEM;
    }
    return 0;
}

static int rand_below(uint64_t *rng, int n)
{
    int i = (int)(kvp_rand_f32(rng) * (float)n);
    return i < n ? i : n - 1;
}

static int int_cmp(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

int kvp_train_stream_rows(const float *score, int n, int budget, int cap, int n_sink,
                          int n_recent, int chunk, int32_t *rows, int32_t *order,
                          kvp_rank_key *work)
{
    int win = kvp_agent_recent_window(budget, cap, n_recent);
    int keep = budget - n_sink - win, older = n - win - chunk - n_sink, m = 0;
    if (keep < 1 || n - win - n_sink <= keep)
        return 0;
    if (older > keep) {
        kvp_argsort_desc(score + n_sink, older, order, work);
        for (; m < keep; m++)
            rows[m] = n_sink + order[m];
        qsort(rows, (size_t)m, sizeof *rows, int_cmp);
    } else {
        for (; m < older; m++)
            rows[m] = n_sink + m;
    }
    for (int i = n - win - chunk; i < n - win; i++)
        if (i >= n_sink)
            rows[m++] = i;
    return m;
}

/* The rows of a streaming episode at cut n and budget b into wk->kept, scored with the
 * agent's current weights w (on-policy: the survivors are the ones this agent would have
 * kept); their count, 0 when b evicts nothing at n. scratch_k/v/pos hold n rows. */
static int stream_episode_rows(const kvp_trace *t, const kvp_agent_set *set, const float *w,
                               const kvp_train_cfg *c, worker *wk, int seq, int layer, int kvh,
                               int n, int budget, float *scratch_k, float *scratch_v,
                               int32_t *scratch_pos)
{
    int cap = kvp_agent_set_cap(set, layer, budget, t->h.seq_len);
    int win = kvp_agent_recent_window(budget, cap, c->n_recent);
    int scored = n - win - c->stream_chunk;   /* rows 0..scored-1 compete for the kept places */
    if (scored > c->n_sink) {
        gather_rows(t, seq, layer, kvh, 0, scored, scratch_k, scratch_v, scratch_pos);
        /* the cache before this decision's evictions: an approximation of the one the
         * survivors were chosen from */
        frame_episode(t, set, seq, layer, kvh, n, scratch_k, scored);
        kvp_agent_score(&set->arch, w, scratch_k, scratch_v, scratch_pos, scored, wk->behave,
                        wk->behave_work);
    }
    return kvp_train_stream_rows(wk->behave, n, budget, cap, c->n_sink, c->n_recent,
                                 c->stream_chunk, wk->kept, wk->order, wk->rank_work);
}

/* One optimiser step of agent a at step `step`. */
static int train_step(train_ctx *x, worker *wk, int a, long step)
{
    const kvp_trace *t = x->t;
    const kvp_train_cfg *c = x->c;
    agent_state *st = &x->agents[a];
    int layer = a / x->s->n_kv_heads, kvh = a % x->s->n_kv_heads, d = x->s->arch.d;
    int len = t->h.seq_len, B = c->episodes, K = c->samples;
    episode ep[B];
    int rows = 0;
    for (int e = 0; e < B; e++) {
        int u = rand_below(&st->rng, x->n_usable), seq = x->usable[u];
        int grid = kvp_trace_n_cuts(&t->h, kvp_trace_len(t, seq));
        int g = rand_below(&st->rng, grid), cut = t->h.cut_min + g * t->h.cut_stride;
        const float *imp = kvp_trace_importance(t, seq, layer, kvh, g);
        float *k = wk->k + (size_t)rows * d, *v = wk->v + (size_t)rows * d;
        int m = 0;
        /* the coin is drawn only when streaming episodes are on, so plain training keeps
         * its random stream (and its file) */
        if (c->stream_share > 0.0f && kvp_rand_f32(&st->rng) < c->stream_share) {
            int budget = c->stream_budgets[rand_below(&st->rng, c->n_stream_budgets)];
            m = stream_episode_rows(t, x->s, st->w, c, wk, seq, layer, kvh, cut, budget,
                                    k, v, wk->pos + rows);
            if (m) {
                gather_list(t, seq, layer, kvh, wk->kept, m, imp, k, v, wk->pos + rows,
                            wk->imp + rows);
                frame_episode(t, x->s, seq, layer, kvh, cut, k, m);
            }
            ep[e] = (episode){rows, m, wk->imp + rows};
        }
        if (!m) {
            m = cut - c->n_sink - c->n_recent;
            ep[e] = (episode){rows, m, imp + c->n_sink};
            gather_rows(t, seq, layer, kvh, c->n_sink, m, k, v, wk->pos + rows);
            frame_episode(t, x->s, seq, layer, kvh, cut, k, m);
        }
        rows += m;
    }
    kvp_agent_forward(wk->acts, st->w, wk->k, wk->v, wk->pos, rows, wk->scores);

    double cost_sum = 0.0;
    for (int e = 0; e < B; e++) {
        double best = kvp_oracle_cost(ep[e].imp, ep[e].m, wk->order, wk->rank_work);
        for (int j = 0; j < K; j++) {
            int32_t *sg = wk->sigma + (size_t)(e * K + j) * len;
            kvp_gumbel_rank(wk->scores + ep[e].off, ep[e].m, &st->rng, sg, wk->rank_work);
            double r = kvp_rank_reward(kvp_rank_cost(ep[e].imp, sg, ep[e].m), best);
            wk->reward[e * K + j] = r;
            cost_sum -= r;
        }
    }
    kvp_rloo_advantages(wk->reward, B, K, c->adv_clamp, wk->adv);

    /* loss = -mean over samples of adv * log pi(sigma) */
    memset(wk->dscores, 0, (size_t)rows * sizeof(float));
    float scale = -1.0f / (float)(B * K);
    for (int e = 0; e < B; e++)
        for (int j = 0; j < K; j++) {
            float adv = wk->adv[e * K + j];
            if (adv == 0.0f)
                continue;
            kvp_pl_logprob(wk->scores + ep[e].off, wk->sigma + (size_t)(e * K + j) * len,
                           ep[e].m, wk->pl_grad, wk->pl_work);
            cblas_saxpy(ep[e].m, scale * adv, wk->pl_grad, 1, wk->dscores + ep[e].off, 1);
        }
    /* the listwise term, a mean over episodes (the policy-gradient loss is one over
     * samples): every row's score toward its share of the episode's importance */
    for (int e = 0; c->listwise > 0.0f && e < B; e++)
        kvp_listwise_loss(wk->scores + ep[e].off, ep[e].imp, ep[e].m, c->listwise / (float)B,
                          wk->dscores + ep[e].off);
    size_t np = x->s->n_params;
    memset(st->grad, 0, np * sizeof(float));
    kvp_agent_backward(wk->acts, st->w, wk->dscores, st->grad);
    kvp_clip_grad_norm(st->grad, np, c->clip);
    kvp_adamw_step(&c->adamw, kvp_train_lr(c, step), step + 1, st->w, st->grad, st->m, st->v, np);
    kvp_ema_update(st->ema, st->w, np, c->ema);
    st->step_cost[step - x->step0] = cost_sum / (B * K);
    return 0;
}

static int train_job(void *arg, int worker_id, int a)
{
    train_ctx *x = arg;
    for (long step = x->step0; step < x->step1; step++) {
        int rc = train_step(x, &x->workers[worker_id], a, step);
        if (rc)
            return rc;
    }
    return 0;
}

static void fmt_time(char *buf, size_t n, double s)
{
    long v = (long)(s + 0.5);
    if (v >= 3600)
        snprintf(buf, n, "%ldh%02ldm", v / 3600, v / 60 % 60);
    else
        snprintf(buf, n, "%ldm%02lds", v / 60, v % 60);
}

static int check_cfg(const kvp_train_cfg *c, char *err, size_t errlen)
{
    if (c->steps < 1 || c->threads < 1 || c->episodes < 1 || c->samples < 2 ||
        c->eval_every < 1 || c->warmup < 0 || c->n_sink < 0 || c->n_recent < 0)
        return KVP_ERR(-EINVAL, "bad training settings (steps, threads, episodes >= 1, samples >= 2, "
                   "eval interval >= 1)");
    if (!(c->stream_share >= 0.0f && c->stream_share <= 1.0f) || c->stream_chunk < 1 ||
        c->n_stream_budgets < 1 || c->n_stream_budgets > KVP_TRAIN_MAX_STREAM_BUDGETS)
        return KVP_ERR(-EINVAL, "bad streaming-episode settings (share in [0, 1], chunk >= 1, "
                   "1..%d budgets)", KVP_TRAIN_MAX_STREAM_BUDGETS);
    for (int i = 0; i < c->n_stream_budgets; i++)
        if (c->stream_budgets[i] <= c->n_sink + c->n_recent)
            return KVP_ERR(-EINVAL, "streaming budget %d leaves no row to choose after %d sinks "
                       "and %d recent rows", c->stream_budgets[i], c->n_sink, c->n_recent);
    if (!(c->lr > 0.0f) || !(c->lr_min >= 0.0f) || !(c->clip > 0.0f) ||
        !(c->ema >= 0.0f && c->ema < 1.0f) || !(c->adv_clamp > 0.0f) ||
        !(c->listwise >= 0.0f && c->listwise <= 1e6f) ||
        !(c->warmup_start >= 0.0f && c->warmup_start <= 1.0f))
        return KVP_ERR(-EINVAL, "bad optimiser settings (lr > 0, lr_min >= 0, clip > 0, "
                   "0 <= ema < 1, clamp > 0, 0 <= listwise <= 1e6, 0 <= warm-up start <= 1)");
    return 0;
}

int kvp_train(const kvp_trace *t, kvp_agent_set *s, const kvp_train_cfg *c,
              double *val_cost, char *err, size_t errlen)
{
    int rc = check_cfg(c, err, errlen);
    if (rc)
        return rc;
    const kvp_trace_header *h = &t->h;
    if (h->cut_min < c->n_sink + c->n_recent + 2)
        return KVP_ERR(-EINVAL, "the trace's smallest cut %d leaves fewer than 2 rows to rank after "
                   "%d sinks and %d recent rows", h->cut_min, c->n_sink, c->n_recent);
    if (s->n_layers != h->n_layers || s->n_kv_heads != h->n_kv_heads || s->arch.d != h->head_dim)
        return KVP_ERR(-EINVAL, "the policy is for %d layers x %d KV heads x head_dim %d, the trace "
                   "for %d x %d x %d", s->n_layers, s->n_kv_heads, s->arch.d, h->n_layers,
                   h->n_kv_heads, h->head_dim);
    int n_agents = s->n_layers * s->n_kv_heads, len = h->seq_len;
    int threads = c->threads < n_agents ? c->threads : n_agents;   /* a worker per thread */
    size_t np = s->n_params;
    train_ctx x = {.t = t, .s = s, .c = c};
    x.usable = malloc((size_t)(h->n_train > 0 ? h->n_train : 1) * sizeof *x.usable);
    if (!x.usable)
        return KVP_ERR(-ENOMEM, "out of memory");
    for (int seq = 0; seq < h->n_train; seq++)
        if (kvp_trace_n_cuts(h, kvp_trace_len(t, seq)) > 0)
            x.usable[x.n_usable++] = seq;
    if (!x.n_usable) {
        free(x.usable);
        return KVP_ERR(-EINVAL, "no training sequence has the %d tokens the smallest cut (%d) and "
                   "the future (%d) need", h->cut_min + h->cut_tail, h->cut_min, h->cut_tail);
    }
    double val = 0.0;
    kvp_agent_set view = *s;
    float *ema_all = malloc((size_t)n_agents * np * sizeof(float));
    x.agents = calloc((size_t)n_agents, sizeof *x.agents);
    x.workers = calloc((size_t)threads, sizeof *x.workers);
    int n_workers = 0;
    if (!ema_all || !x.agents || !x.workers) {
        rc = KVP_ERR(-ENOMEM, "out of memory");
        goto out;
    }
    memcpy(ema_all, s->params, (size_t)n_agents * np * sizeof(float));
    view.params = ema_all;
    /* also checks the validation settings before any training time is spent */
    if ((rc = kvp_train_validate(t, &view, c->val_cut, c->n_sink, c->n_recent, threads,
                                 &val, NULL, err, errlen)))
        goto out;
    for (int a = 0; a < n_agents; a++) {
        agent_state *st = &x.agents[a];
        st->w = s->params + (size_t)a * np;
        st->ema = ema_all + (size_t)a * np;
        st->m = calloc(np, sizeof(float));
        st->v = calloc(np, sizeof(float));
        st->grad = malloc(np * sizeof(float));
        st->step_cost = malloc((size_t)c->eval_every * sizeof(double));
        /* a per-agent stream: the agent's results do not depend on which thread runs it */
        st->rng = (c->seed + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(a + 1) * 0xD1B54A32D192ED03ull;
        st->rng = st->rng ? st->rng : 1;
        for (int i = 0; i < 8; i++)
            kvp_rand_f32(&st->rng);
        if (!st->m || !st->v || !st->grad || !st->step_cost) {
            rc = KVP_ERR(-ENOMEM, "out of memory");
            goto out;
        }
    }
    for (; n_workers < threads; n_workers++)
        if (worker_init(&x.workers[n_workers], &s->arch, len, c)) {
            rc = KVP_ERR(-ENOMEM, "out of memory");
            goto out;
        }

    double t0 = kvp_now();
    if (c->log)
        fprintf(c->log, "kvp train: %d agents x %zu parameters, %d training sequences, "
                "%ld steps of %d episodes x %d rankings, %d threads; initial val C/C* %.3f\n",
                n_agents, np, x.n_usable, c->steps, c->episodes, c->samples, threads, val);
    if (c->curve)
        fprintf(c->curve, "step,train_cost,val_cost,lr,elapsed_s\n");
    for (long step0 = 0; step0 < c->steps; step0 += c->eval_every) {
        x.step0 = step0;
        x.step1 = step0 + c->eval_every < c->steps ? step0 + c->eval_every : c->steps;
        if ((rc = kvp_pool_run(threads, n_agents, train_job, &x))) {
            rc = KVP_ERR(rc, "out of memory");
            goto out;
        }
        double train = 0.0;
        for (int a = 0; a < n_agents; a++)
            for (long i = 0; i < x.step1 - x.step0; i++)
                train += x.agents[a].step_cost[i];
        train /= (double)n_agents * (double)(x.step1 - x.step0);
        if ((rc = kvp_train_validate(t, &view, c->val_cut, c->n_sink, c->n_recent, threads,
                                     &val, NULL, err, errlen)))
            goto out;
        double el = kvp_now() - t0;
        float lr = kvp_train_lr(c, x.step1 - 1);
        if (c->curve) {
            fprintf(c->curve, "%ld,%.5f,%.5f,%.4e,%.1f\n", x.step1, train, val, lr, el);
            fflush(c->curve);
        }
        if (c->log) {
            char e1[32], e2[32];
            fmt_time(e1, sizeof e1, el);
            fmt_time(e2, sizeof e2, el / (double)x.step1 * (double)(c->steps - x.step1));
            fprintf(c->log, "kvp train: step %ld/%ld (%.0f%%)  train C/C* %.3f  val C/C* %.3f  "
                    "lr %.2e  elapsed %s  left %s\n", x.step1, c->steps,
                    100.0 * (double)x.step1 / (double)c->steps, train, val, lr, e1, e2);
        }
        if (c->max_seconds > 0 && el >= c->max_seconds && x.step1 < c->steps) {
            if (c->log)
                fprintf(c->log, "kvp train: the time budget (%.0f s) ran out: stopped at step "
                        "%ld of %ld\n", c->max_seconds, x.step1, c->steps);
            break;
        }
    }
    memcpy(s->params, ema_all, (size_t)n_agents * np * sizeof(float));
    if (val_cost)
        *val_cost = val;
out:
    for (int w = 0; w < n_workers; w++)
        worker_free(&x.workers[w]);
    for (int a = 0; x.agents && a < n_agents; a++) {
        agent_state *st = &x.agents[a];
        free(st->m);
        free(st->v);
        free(st->grad);
        free(st->step_cost);
    }
    free(x.agents);
    free(x.workers);
    free(ema_all);
    free(x.usable);
    return rc;
}
