#include "offline/conv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate/generate.h"
#include "model/logprobs.h"
#include "model/sampler.h"
#include "offline/oracle.h"

void kvp_conv_defaults(kvp_conv_opts *o)
{
    *o = (kvp_conv_opts){.turns = 7, .turn_len = 40, .reply_len = 24, .n_recall = 2,
                         .recall_at = {4, 8}};
}

int kvp_conv_story_len(const kvp_conv_opts *o)
{
    return o->turns * o->turn_len;
}

int kvp_conv_positions(const kvp_conv_opts *o, int n_cue)
{
    int per_turn = o->turn_len + o->reply_len, most = o->turns * per_turn;
    for (int i = 0; i < o->n_recall; i++) {
        /* the turns before it, the cue, turn 1's text without BOS */
        int at = (o->recall_at[i] - 1) * per_turn + n_cue + o->turn_len - 1;
        most = at > most ? at : most;
    }
    return most;
}

int kvp_conv_check(const kvp_conv_opts *o, int ctx, int n_cue, char *err, size_t errlen)
{
    if (o->turns < 1 || o->turns > KVP_CONV_MAX_TURNS) {
        snprintf(err, errlen, "turns %d: 1 to %d", o->turns, KVP_CONV_MAX_TURNS);
        return -EINVAL;
    }
    if (o->turn_len < 2 || o->reply_len < 1 || n_cue < 1) {
        snprintf(err, errlen, "a turn needs at least 2 story tokens, a reply 1 and the cue 1");
        return -EINVAL;
    }
    if (o->n_recall < 0 || o->n_recall > KVP_CONV_MAX_RECALL) {
        snprintf(err, errlen, "at most %d recall turns", KVP_CONV_MAX_RECALL);
        return -EINVAL;
    }
    for (int i = 0; i < o->n_recall; i++)
        if (o->recall_at[i] < 2 || o->recall_at[i] > o->turns + 1 ||
            (i && o->recall_at[i] <= o->recall_at[i - 1])) {
            snprintf(err, errlen, "recall turn %d: ascending, 2 to %d (turns + 1)",
                     o->recall_at[i], o->turns + 1);
            return -EINVAL;
        }
    int need = kvp_conv_positions(o, n_cue);
    if (need > ctx) {
        snprintf(err, errlen, "a conversation of %d turns of %d + %d tokens takes %d "
                 "positions: more than the model's context %d (the full cache must hold it)",
                 o->turns, o->turn_len, o->reply_len, need, ctx);
        return -E2BIG;
    }
    return 0;
}

/* ---- per-turn protection: a wrapper around any policy --------------------------------- */

/* The scores a boost replaced, per head, restored by token index once the eviction that
 * read them is over (the policies that accumulate into h->score, H2O, must never see
 * a boosted score). */
typedef struct saved {
    int n, cap;
    int64_t *seq;
    float *score;
} saved;

typedef struct protect {
    kvp_policy *inner;
    kvp_policy_ops ops;
    int64_t frozen_to;   /* rows of tokens seq < frozen_to were kept at a turn boundary */
    saved *heads;        /* [n_layers * n_kv_heads] */
    int n_kv;
} protect;

static protect *pr_of(kvp_policy *p)
{
    return p->impl;
}

/* Puts back the scores saved for head (layer, kvh); the rows still held are a
 * subsequence of the saved ones, in the same order. */
static void pr_restore(protect *w, int layer, int kvh, kvp_head *h)
{
    saved *sv = &w->heads[layer * w->n_kv + kvh];
    for (int i = 0, j = 0; i < h->n && j < sv->n; i++) {
        while (j < sv->n && sv->seq[j] < h->seq[i])
            j++;
        if (j < sv->n && sv->seq[j] == h->seq[i])
            h->score[i] = sv->score[j++];
    }
    sv->n = 0;
}

static void pr_restore_all(kvp_policy *p, kvp_cache *c)
{
    protect *w = pr_of(p);
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < c->n_kv_heads; k++)
            pr_restore(w, l, k, kvp_cache_head(c, l, k));
}

static void pr_on_insert(kvp_policy *p, int layer, int kvh, kvp_head *h, int first, int n)
{
    protect *w = pr_of(p);
    pr_restore(w, layer, kvh, h);
    w->inner->ops->on_insert(w->inner, layer, kvh, h, first, n);
}

static void pr_on_attention(kvp_policy *p, int layer, int kvh, kvp_head *h, const float *q,
                            int q_stride, const float *att, int att_stride, int n_q)
{
    protect *w = pr_of(p);
    pr_restore(w, layer, kvh, h);
    w->inner->ops->on_attention(w->inner, layer, kvh, h, q, q_stride, att, att_stride, n_q);
}

/* The inner policy's final scores, then every frozen row lifted above every other row by
 * the same offset (so their own order stays); NaN stays NaN (ranks last). The scores are
 * saved first and restored at the next hook or by the driver. */
static void pr_before_evict(kvp_policy *p, int layer, int kvh, kvp_head *h)
{
    protect *w = pr_of(p);
    pr_restore(w, layer, kvh, h);
    if (w->inner->ops->before_evict)
        w->inner->ops->before_evict(w->inner, layer, kvh, h);
    saved *sv = &w->heads[layer * w->n_kv + kvh];
    if (h->n > sv->cap) {
        int64_t *sq = realloc(sv->seq, (size_t)h->n * sizeof *sq);
        if (sq)
            sv->seq = sq;
        float *sc = sq ? realloc(sv->score, (size_t)h->n * sizeof *sc) : NULL;
        if (!sq || !sc)
            return;   /* out of memory: this eviction ranks by the plain scores */
        sv->score = sc;
        sv->cap = h->n;
    }
    float lo = INFINITY, hi = -INFINITY;
    int frozen = 0;
    for (int i = 0; i < h->n; i++) {
        float s = h->score[i];
        frozen += h->seq[i] < w->frozen_to;
        if (isfinite(s)) {
            lo = s < lo ? s : lo;
            hi = s > hi ? s : hi;
        }
    }
    if (!frozen || lo > hi)
        return;
    float lift = 2.0f * (hi - lo) + 1.0f + fabsf(hi);
    for (int i = 0; i < h->n; i++) {
        sv->seq[i] = h->seq[i];
        sv->score[i] = h->score[i];
        if (h->seq[i] < w->frozen_to && !isnan(h->score[i]))
            h->score[i] = isfinite(h->score[i]) ? h->score[i] + lift : h->score[i];
    }
    sv->n = h->n;
}

static int pr_recent_window(const kvp_policy *p, int layer, int budget)
{
    const protect *w = p->impl;
    return w->inner->ops->recent_window(w->inner, layer, budget);
}

static void pr_calibrate(const kvp_policy *p, int layer, int kvh, const float *in, int n,
                         float *out)
{
    const protect *w = p->impl;
    w->inner->ops->calibrate(w->inner, layer, kvh, in, n, out);
}

static void pr_truncate(kvp_policy *p, kvp_cache *c, int64_t from)
{
    protect *w = pr_of(p);
    pr_restore_all(p, c);
    if (w->frozen_to > from)
        w->frozen_to = from;
    w->inner->ops->truncate(w->inner, c, from);
}

static void pr_mark(kvp_policy *p, const kvp_cache *c)
{
    protect *w = pr_of(p);
    w->inner->ops->mark(w->inner, c);
}

static void pr_destroy(kvp_policy *p)
{
    protect *w = pr_of(p);
    for (int i = 0; i < w->inner->cfg.n_layers * w->n_kv; i++) {
        free(w->heads[i].seq);
        free(w->heads[i].score);
    }
    free(w->heads);
    free(w);   /* the inner policy is the caller's */
}

/* A wrapper of inner (which stays the caller's) with the same hooks. */
static int protect_wrap(kvp_policy **out, kvp_policy *inner)
{
    kvp_policy *p = calloc(1, sizeof *p);
    protect *w = calloc(1, sizeof *w);
    int nh = inner->cfg.n_layers * inner->cfg.n_kv_heads;
    saved *heads = calloc((size_t)nh, sizeof *heads);
    if (!p || !w || !heads) {
        free(p);
        free(w);
        free(heads);
        return -ENOMEM;
    }
    const kvp_policy_ops *io = inner->ops;
    w->inner = inner;
    w->heads = heads;
    w->n_kv = inner->cfg.n_kv_heads;
    w->ops = (kvp_policy_ops){
        .name = io->name, .wants_attention = io->wants_attention,
        .on_insert = io->on_insert ? pr_on_insert : NULL,
        .on_attention = io->on_attention ? pr_on_attention : NULL,
        .before_evict = pr_before_evict,
        .recent_window = io->recent_window ? pr_recent_window : NULL,
        .calibrate = io->calibrate ? pr_calibrate : NULL,
        .destroy = pr_destroy,
        .truncate = io->truncate ? pr_truncate : NULL,
        .mark = io->mark ? pr_mark : NULL,
    };
    *p = *inner;   /* cfg, sinks, recent window, rng */
    p->ops = &w->ops;
    p->impl = w;
    *out = p;
    return 0;
}

/* ---- the protocol ------------------------------------------------------------------- */

typedef struct run {
    const kvp_model *m;
    kvp_runstate *s;
    kvp_policy *p;        /* what evicts: the policy or its wrapper */
    kvp_policy *scored;   /* the policy itself (kvzip's scores) */
    kvp_evict_cfg e;
    kvp_cache ev, full;
    int *toks, n;         /* every token fed, by seq */
    int step;             /* the blocks both caches are fed in */
} run;

/* kvzip: fresh scores of every row before a feed of n tokens that may evict (a per-head
 * budget evicts only past budget + chunk rows; a global one may at any time), or before
 * a turn-boundary compression (n 0: when a head is over the budget). */
static int kvzip_before(run *r, int n)
{
    if (!kvp_policy_is_kvzip(r->scored))
        return 0;
    int rows = kvp_cache_budget_max_rows(&r->ev);
    int may = n ? r->e.mode == KVP_BUDGET_GLOBAL || rows + n > r->e.budget + r->e.chunk
                : rows > r->e.budget || r->e.mode == KVP_BUDGET_GLOBAL;
    if (!may)
        return 0;
    if (r->p != r->scored)
        pr_restore_all(r->p, &r->ev);
    return kvp_eval_kvzip_scores(r->m, r->s, &r->ev, r->toks);
}

static void after_feed(run *r)
{
    if (r->p != r->scored)
        pr_restore_all(r->p, &r->ev);
}

/* Feeds tok[0..n) to both caches in the same blocks; the last full-cache logits stay in
 * s->logits, the evicted run's last logits go to q. */
static int feed(run *r, const int *tok, int n, float *q)
{
    int V = r->m->cfg.vocab_size, rc = 0;
    for (int off = 0; off < n && !rc; off += r->step) {
        int k = n - off < r->step ? n - off : r->step;
        memcpy(r->toks + r->n, tok + off, (size_t)k * sizeof *tok);
        if ((rc = kvzip_before(r, k)))
            break;
        rc = k == 1 ? kvp_gen_decode(r->m, r->s, &r->ev, &r->e, tok[off])
                    : kvp_gen_prefill(r->m, r->s, &r->ev, &r->e, tok + off, k, NULL);
        after_feed(r);
        if (rc)
            break;
        memcpy(q, r->s->logits, (size_t)V * sizeof *q);
        rc = k == 1 ? kvp_gen_decode(r->m, r->s, &r->full, NULL, tok[off])
                    : kvp_gen_prefill(r->m, r->s, &r->full, NULL, tok + off, k, NULL);
        r->n += k;
    }
    return rc;
}

static int cache_like(kvp_cache *c, const kvp_model_config *cfg, kvp_kv_type type)
{
    int rc = kvp_cache_init(c, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &cfg->rope);
    if (!rc && (rc = kvp_cache_convert(c, type)))
        kvp_cache_free(c);
    return rc;
}

/* Mean log-likelihood of want[0..n) after cue[0..n_cue), teacher-forced without eviction
 * on a copy of c (no policy attached). logits: room for (n_cue + n) x vocab. */
static int recall_on(const kvp_model *m, kvp_runstate *s, const kvp_cache *c, const int *cue,
                     int n_cue, const int *want, int n, int *buf, float *logits, double *ll)
{
    int V = m->cfg.vocab_size, len = n_cue + n - 1;
    kvp_cache d;
    int rc = kvp_cache_fork(&d, c, c->n_seen);   /* a copy: every row, the positions */
    memcpy(buf, cue, (size_t)n_cue * sizeof *buf);
    memcpy(buf + n_cue, want, (size_t)(n - 1) * sizeof *buf);
    kvp_policy_attach(&s->hooks, NULL);
    if (!rc)
        rc = kvp_gen_prefill(m, s, &d, NULL, buf, len, logits);
    kvp_cache_free(&d);
    if (rc)
        return rc;
    double sum = 0.0;
    for (int j = 0; j < n; j++) {
        const float *lg = logits + (size_t)(n_cue - 1 + j) * V;
        sum += lg[want[j]] - kvp_log_sum_exp(lg, V);
    }
    *ll = sum / n;
    return 0;
}

int kvp_conv_run(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *story,
                 const int *cue, int n_cue, int bi, const kvp_eval_opts *eo,
                 const kvp_conv_opts *o, kvp_conv_result *out, kvp_conv_acc *acc)
{
    char err[160];
    int V = m->cfg.vocab_size, U = o->turn_len, R = o->reply_len;
    if (!p || kvp_policy_is_oracle(p) || bi < 0 || bi >= eo->n_budgets ||
        kvp_conv_check(o, m->cfg.seq_len, n_cue, err, sizeof err) ||
        n_cue + U > s->max_tokens || (o->protect && eo->budget_mode == KVP_BUDGET_GLOBAL))
        return -EINVAL;   /* protection lifts per-head scores: per-head budgets only */
    kvp_conv_result res = {0};
    run r = {.m = m, .s = s, .p = p, .scored = p,
             .e = {p, eo->budgets[bi], eo->chunk > 0 ? eo->chunk : KVP_DEFAULT_CHUNK,
                   eo->budget_mode}};
    int evicts = r.e.budget > 0 && !kvp_policy_is_none(p);
    r.step = evicts ? r.e.chunk : s->max_tokens;
    r.step = r.step > s->max_tokens ? s->max_tokens : r.step;
    int positions = kvp_conv_positions(o, n_cue);
    kvp_sampler smp = {0};
    float *q = malloc((size_t)V * sizeof *q);
    float *logits = malloc((size_t)(n_cue + U) * V * sizeof *logits);
    int *buf = malloc((size_t)(n_cue + U) * sizeof *buf);
    r.toks = malloc((size_t)positions * sizeof *r.toks);
    int rc = -ENOMEM, have_smp = 0;
    if (!q || !logits || !buf || !r.toks || (rc = cache_like(&r.ev, &m->cfg, eo->kv_type)) ||
        (rc = cache_like(&r.full, &m->cfg, KVP_KV_F32)) ||
        (rc = kvp_sampler_init(&smp, V, 0.0f, 1.0f, 0)))
        goto out;
    have_smp = 1;
    if (o->protect && evicts && (rc = protect_wrap(&r.p, p)))
        goto out;
    r.e.policy = r.p;
    kvp_policy_attach(&s->hooks, NULL);   /* the drivers attach e.policy to its own run */
    double kl_all = 0.0;
    int ri = 0;
    for (int k = 0; k < o->turns + 1; k++) {
        if (ri < o->n_recall && o->recall_at[ri] == k + 1) {
            /* user turn k + 1 asks for turn 1: both caches as the turn finds them */
            if ((rc = recall_on(m, s, &r.ev, cue, n_cue, story + 1, U - 1, buf, logits,
                                &res.recall[ri])) ||
                (rc = recall_on(m, s, &r.full, cue, n_cue, story + 1, U - 1, buf, logits,
                                &res.recall_full[ri])))
                goto out;
            long held = 0;
            for (int h = 0; h < r.ev.n_layers * r.ev.n_kv_heads; h++)
                for (int i = 0; i < r.ev.heads[h].n; i++)
                    held += r.ev.heads[h].seq[i] < U;
            res.kept_t1[ri] = (double)held / ((double)U * r.ev.n_layers * r.ev.n_kv_heads);
            ri++;
        }
        if (k == o->turns)
            break;
        res.user_at[k] = r.n;
        if ((rc = feed(&r, story + (size_t)k * U, U, q)))
            goto out;
        res.reply_at[k] = r.n;
        kvp_policy_mark(r.p, &r.ev);   /* the reply begins (the daemon's rollback point) */
        double kl = 0.0;
        for (int d = 0; d < R; d++) {
            kl += kvp_logits_kl(s->logits, q, V);
            int tok = kvp_sample(&smp, q);   /* greedy: the daemon's tie rule */
            if ((rc = feed(&r, &tok, 1, q)))
                goto out;
        }
        res.turn_kl[k] = kl / R;
        kl_all += res.turn_kl[k];
        /* the turn boundary: compressed to the budget, then (protect) frozen */
        if ((rc = kvzip_before(&r, 0)))
            goto out;
        rc = kvp_gen_compress(&r.ev, &r.e);
        after_feed(&r);
        if (rc < 0)
            goto out;
        rc = 0;
        if (r.p != p)
            pr_of(r.p)->frozen_to = r.ev.n_seen;
        res.rows_after[k] = kvp_cache_max_rows(&r.ev);
    }
    res.n_tokens = r.n;
    acc->convs[bi]++;
    acc->kl[bi] += kl_all / o->turns;
    for (int k = 0; k < o->turns; k++)
        acc->turn_kl[bi][k] += res.turn_kl[k];
    for (int i = 0; i < o->n_recall; i++) {
        acc->recall[bi][i] += res.recall[i];
        acc->recall_full[bi][i] += res.recall_full[i];
        acc->kept_t1[bi][i] += res.kept_t1[i];
    }
    if (out)
        *out = res;
out:
    kvp_policy_attach(&s->hooks, NULL);
    if (r.p && r.p != p)
        kvp_policy_destroy(r.p);
    kvp_cache_free(&r.ev);
    kvp_cache_free(&r.full);
    if (have_smp)
        kvp_sampler_free(&smp);
    free(q);
    free(logits);
    free(buf);
    free(r.toks);
    return rc;
}

void kvp_conv_acc_add(kvp_conv_acc *dst, const kvp_conv_acc *src)
{
    for (int b = 0; b < KVP_EVAL_MAX_BUDGETS; b++) {
        dst->convs[b] += src->convs[b];
        dst->kl[b] += src->kl[b];
        for (int k = 0; k < KVP_CONV_MAX_TURNS; k++)
            dst->turn_kl[b][k] += src->turn_kl[b][k];
        for (int i = 0; i < KVP_CONV_MAX_RECALL; i++) {
            dst->recall[b][i] += src->recall[b][i];
            dst->recall_full[b][i] += src->recall_full[b][i];
            dst->kept_t1[b][i] += src->kept_t1[b][i];
        }
    }
}

static const char *const turn_metric[KVP_CONV_MAX_TURNS] = {
    "kl_t1", "kl_t2", "kl_t3", "kl_t4", "kl_t5", "kl_t6", "kl_t7", "kl_t8", "kl_t9",
    "kl_t10", "kl_t11", "kl_t12", "kl_t13", "kl_t14", "kl_t15", "kl_t16"};
/* recall turns are 2..KVP_CONV_MAX_TURNS + 1 */
static const char *const recall_metric[KVP_CONV_MAX_TURNS + 2] = {
    "", "", "recall_2", "recall_3", "recall_4", "recall_5", "recall_6", "recall_7",
    "recall_8", "recall_9", "recall_10", "recall_11", "recall_12", "recall_13", "recall_14",
    "recall_15", "recall_16", "recall_17"};
static const char *const kept_metric[KVP_CONV_MAX_TURNS + 2] = {
    "", "", "kept_t1_2", "kept_t1_3", "kept_t1_4", "kept_t1_5", "kept_t1_6", "kept_t1_7",
    "kept_t1_8", "kept_t1_9", "kept_t1_10", "kept_t1_11", "kept_t1_12", "kept_t1_13",
    "kept_t1_14", "kept_t1_15", "kept_t1_16", "kept_t1_17"};
static const char *const gap_metric[KVP_CONV_MAX_TURNS + 2] = {
    "", "", "recall_gap_2", "recall_gap_3", "recall_gap_4", "recall_gap_5", "recall_gap_6",
    "recall_gap_7", "recall_gap_8", "recall_gap_9", "recall_gap_10", "recall_gap_11",
    "recall_gap_12", "recall_gap_13", "recall_gap_14", "recall_gap_15", "recall_gap_16",
    "recall_gap_17"};

int kvp_conv_rows(const char *policy, const kvp_conv_acc *a, const kvp_eval_opts *eo,
                  const kvp_conv_opts *o, kvp_eval_row *rows)
{
    int n = 0;
    for (int b = 0; b < eo->n_budgets; b++) {
        double c = (double)a->convs[b];
        if (!a->convs[b])
            continue;
        rows[n++] = (kvp_eval_row){"conversation", policy, "kl", eo->budgets[b], a->kl[b] / c};
        for (int k = 0; k < o->turns; k++)
            rows[n++] = (kvp_eval_row){"conversation", policy, turn_metric[k], eo->budgets[b],
                                       a->turn_kl[b][k] / c};
        for (int i = 0; i < o->n_recall; i++) {
            int at = o->recall_at[i];
            rows[n++] = (kvp_eval_row){"conversation", policy, recall_metric[at],
                                       eo->budgets[b], a->recall[b][i] / c};
            rows[n++] = (kvp_eval_row){"conversation", policy, gap_metric[at], eo->budgets[b],
                                       (a->recall_full[b][i] - a->recall[b][i]) / c};
            rows[n++] = (kvp_eval_row){"conversation", policy, kept_metric[at], eo->budgets[b],
                                       a->kept_t1[b][i] / c};
        }
    }
    return n;
}
