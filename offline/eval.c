#include "offline/eval.h"

#include "model/logprobs.h"
#include "base/errors.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate/generate.h"
#include "model/sampler.h"
#include "offline/oracle.h"
#include "offline/svgplot.h"


/* ---- helpers ------------------------------------------------------------------------ */

/* dst (initialised with src's shape) becomes a copy of src's rows and counters */
static int cache_copy(kvp_cache *dst, const kvp_cache *src)
{
    size_t rb = kvp_kv_row_bytes(src->kv_type, src->head_dim);
    int rc = kvp_cache_convert(dst, src->kv_type);
    if (rc)
        return rc;
    for (int i = 0; i < src->n_layers * src->n_kv_heads; i++) {
        const kvp_head *s = &src->heads[i];
        kvp_head *d = &dst->heads[i];
        if ((rc = kvp_head_reserve(d, src->head_dim, s->n)))
            return rc;
        d->n = s->n;
        if (!s->n)
            continue;
        memcpy(d->k, s->k, (size_t)s->n * rb);
        memcpy(d->v, s->v, (size_t)s->n * rb);
        memcpy(d->pos, s->pos, (size_t)s->n * sizeof *d->pos);
        memcpy(d->seq, s->seq, (size_t)s->n * sizeof *d->seq);
        memcpy(d->score, s->score, (size_t)s->n * sizeof *d->score);
        memcpy(d->stat, s->stat, (size_t)s->n * sizeof *d->stat);
    }
    dst->next_pos = src->next_pos;
    dst->n_seen = src->n_seen;
    return 0;
}

/* An empty cache for cfg's model storing rows as `type` */
static int cache_like(kvp_cache *c, const kvp_model_config *cfg, kvp_kv_type type)
{
    int rc = kvp_cache_init(c, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &cfg->rope);
    if (!rc && (rc = kvp_cache_convert(c, type)))
        kvp_cache_free(c);
    return rc;
}

static double nll_of(const float *logits, int vocab, int target)
{
    return kvp_log_sum_exp(logits, vocab) - logits[target];
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        best = x[i] > x[best] ? i : best;
    return best;
}

/* KL(softmax(p) || softmax(q)) in nats; exactly 0 when the logits are equal */
/* Importance of the rows a head holds after an eviction: rows are identified by seq,
 * which is the token index in a sequence that started from an empty cache. */
static double kept_importance(const kvp_head *h, const float *imp, int cut)
{
    double s = 0.0;
    for (int i = 0; i < h->n; i++)
        if (h->seq[i] < cut)
            s += imp[h->seq[i]];
    return s;
}

static double total_importance(const float *imp, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += imp[i];
    return s;
}

/* ---- future importance observer -------------------------------------------------------- */

/* A pseudo-policy the forward pass reports attention to: adds (or, with max, keeps the
 * largest), for every query of the block past its first `skip`, the max over the KV
 * group of its attention to each of the first limit[head] rows (rows that predate the
 * block). */
typedef struct importance_obs {
    float *imp;          /* [heads][stride] */
    int stride;
    const int *limit;    /* [heads] */
    int max;             /* keep the largest attention of any query instead of the sum */
    int skip;            /* the block's first `skip` queries do not count */
} importance_obs;

static void obs_attention(kvp_policy *p, int layer, int kvh, kvp_head *h, const float *q,
                          int q_stride, const float *att, int att_stride, int n_q)
{
    (void)h;
    (void)q;
    (void)q_stride;
    importance_obs *o = p->impl;
    int head = layer * p->cfg.n_kv_heads + kvh, group = p->cfg.n_heads / p->cfg.n_kv_heads;
    float *imp = o->imp + (size_t)head * o->stride;
    for (int t = o->skip; t < n_q; t++)
        for (int i = 0; i < o->limit[head]; i++) {
            float mx = att[(size_t)t * att_stride + i];
            for (int g = 1; g < group; g++) {
                float a = att[(size_t)(g * n_q + t) * att_stride + i];
                mx = a > mx ? a : mx;
            }
            if (!o->max)
                imp[i] += mx;
            else if (mx > imp[i])
                imp[i] = mx;
        }
}

static const kvp_policy_ops obs_ops = {
    .name = "importance", .wants_attention = 1, .on_attention = obs_attention,
};

/* ---- KVzip ------------------------------------------------------------------------------ */

int kvp_eval_kvzip_scores(const kvp_model *m, kvp_runstate *s, kvp_cache *c, const int *tokens)
{
    int nh = c->n_layers * c->n_kv_heads, ctx = m->cfg.seq_len, bos = m->tok.bos_id;
    int64_t seen = c->n_seen;
    int max_prompt = 64, n_prompt, n_rec = 0, stride = 0, rc = -ENOMEM;
    kvp_cache d = {0};
    int *prompt = malloc((size_t)max_prompt * sizeof *prompt);
    unsigned char *held = calloc((size_t)seen + 1, 1);
    int *rec = malloc(((size_t)seen + 1) * sizeof *rec);
    int *limit = malloc((size_t)nh * sizeof *limit);
    int *block = malloc((size_t)s->max_tokens * sizeof *block);
    float *imp = NULL;
    if (!prompt || !held || !rec || !limit || !block)
        goto out;
    const char *text = KVP_KVZIP_PROMPT;
    if ((n_prompt = kvp_tokenizer_encode(&m->tok, text, strlen(text), 0, prompt, max_prompt)) < 0) {
        rc = n_prompt;
        goto out;
    }
    /* the text the cache holds: every token some head has a row of, in order */
    for (int hi = 0; hi < nh; hi++) {
        const kvp_head *h = &c->heads[hi];
        stride = h->n > stride ? h->n : stride;
        for (int i = 0; i < h->n; i++)
            if (h->seq[i] >= 0 && h->seq[i] < seen)
                held[h->seq[i]] = 1;
    }
    for (int64_t q = 0; q < seen; q++)
        if (held[q] && !(q == 0 && tokens[0] == bos))
            rec[n_rec++] = tokens[q];
    if (!stride || !n_rec) {
        rc = 0;
        goto out;
    }
    if (!(imp = calloc((size_t)nh * stride, sizeof *imp)) ||
        (rc = cache_like(&d, &m->cfg, c->kv_type)))
        goto out;
    kvp_policy_attach(&s->hooks, NULL);
    for (int hi = 0; hi < nh; hi++)
        limit[hi] = c->heads[hi].n;
    /* the queries of the repeated tokens score the rows, not the instruction's */
    importance_obs st = {imp, stride, limit, 1, n_prompt};
    kvp_policy obs = {.ops = &obs_ops, .cfg = m->cfg, .impl = &st};
    for (int at = 0; at < n_rec;) {
        if ((rc = cache_copy(&d, c)))
            goto out;
        if (ctx - d.next_pos < n_prompt + KVP_KVZIP_MIN_CHUNK)
            kvp_cache_shift(&d, KVP_DEFAULT_SINKS, ctx);
        int room = ctx - (int)d.next_pos;
        room = room < s->max_tokens ? room : s->max_tokens;
        int n = room - n_prompt;
        if (n < 1) {
            rc = -ERANGE;
            goto out;
        }
        n = n < n_rec - at ? n : n_rec - at;
        memcpy(block, prompt, (size_t)n_prompt * sizeof *block);
        memcpy(block + n_prompt, rec + at, (size_t)n * sizeof *block);
        kvp_policy_attach(&s->hooks, &obs);
        rc = kvp_forward(m, s, &d, block, n_prompt + n, NULL);
        kvp_policy_attach(&s->hooks, NULL);
        if (rc)
            goto out;
        at += n;
    }
    for (int hi = 0; hi < nh; hi++)
        if (limit[hi])
            memcpy(c->heads[hi].score, imp + (size_t)hi * stride, (size_t)limit[hi] * sizeof *imp);
    rc = 0;
out:
    kvp_cache_free(&d);
    free(prompt);
    free(held);
    free(rec);
    free(limit);
    free(block);
    free(imp);
    return rc;
}

/* ---- reference ------------------------------------------------------------------------ */

int kvp_eval_ref_init(kvp_eval_ref *r, const kvp_model_config *cfg, int len,
                      const kvp_eval_opts *o)
{
    memset(r, 0, sizeof *r);
    if (o->cut < 1 || len <= o->cut || len > cfg->seq_len || o->n_budgets < 1 ||
        o->n_budgets > KVP_EVAL_MAX_BUDGETS)
        return -EINVAL;
    r->len = len;
    r->cut = o->cut;
    r->n_heads = cfg->n_layers * cfg->n_kv_heads;
    r->vocab = cfg->vocab_size;
    r->n_budgets = o->n_budgets;
    memcpy(r->budgets, o->budgets, sizeof r->budgets);
    r->kv_type = o->kv_type;
    r->budget_mode = o->budget_mode;
    r->imp = malloc((size_t)r->n_heads * r->cut * sizeof *r->imp);
    r->logits = malloc((size_t)(len - r->cut) * r->vocab * sizeof *r->logits);
    r->min_evicted = malloc((size_t)r->n_budgets * r->n_heads * sizeof *r->min_evicted);
    if (o->kvzip)
        r->zip = malloc((size_t)r->n_heads * r->cut * sizeof *r->zip);
    if (!r->imp || !r->logits || !r->min_evicted || (o->kvzip && !r->zip)) {
        kvp_eval_ref_free(r);
        return -ENOMEM;
    }
    return 0;
}

void kvp_eval_ref_free(kvp_eval_ref *r)
{
    free(r->imp);
    free(r->logits);
    free(r->min_evicted);
    free(r->zip);
    memset(r, 0, sizeof *r);
}

/* The oracle's eviction at every budget, from the prefix cache: the least importance any
 * eviction that keeps the sinks and the recent window can drop. */
static int oracle_minimum(kvp_eval_ref *r, const kvp_model_config *cfg, const kvp_cache *prefix)
{
    char err[256];
    kvp_policy *oracle;
    int rc = kvp_offline_policy_create(&oracle, "oracle", NULL, cfg, 0, err, sizeof err);
    if (rc)
        return rc;
    kvp_cache b;
    if ((rc = cache_like(&b, cfg, KVP_KV_F32))) {
        kvp_policy_destroy(oracle);
        return rc;
    }
    for (int bi = 0; bi < r->n_budgets && !rc; bi++) {
        if ((rc = cache_copy(&b, prefix)))
            break;
        for (int hi = 0; hi < r->n_heads; hi++)
            memcpy(b.heads[hi].score, r->imp + (size_t)hi * r->cut, r->cut * sizeof(float));
        kvp_evict_cfg e = {.policy = oracle, .budget = r->budgets[bi]};
        if ((rc = kvp_gen_compress(&b, &e)) >= 0) {
            rc = 0;
            for (int hi = 0; hi < r->n_heads; hi++) {
                const float *imp = r->imp + (size_t)hi * r->cut;
                r->min_evicted[(size_t)bi * r->n_heads + hi] =
                    total_importance(imp, r->cut) - kept_importance(&b.heads[hi], imp, r->cut);
            }
        }
    }
    kvp_cache_free(&b);
    kvp_policy_destroy(oracle);
    return rc;
}

int kvp_eval_ref_compute(kvp_eval_ref *r, const kvp_model *m, kvp_runstate *s,
                         const int *tokens)
{
    int cut = r->cut, cont = r->len - cut, V = r->vocab;
    kvp_cache c = {0}, prefix = {0};
    float *logits = malloc((size_t)cut * V * sizeof *logits);
    int *limit = malloc((size_t)r->n_heads * sizeof *limit);
    int rc = -ENOMEM;
    if (!logits || !limit || (rc = cache_like(&c, &m->cfg, KVP_KV_F32)) ||
        (rc = cache_like(&prefix, &m->cfg, KVP_KV_F32)))
        goto out;
    kvp_policy_attach(&s->hooks, NULL);
    if ((rc = kvp_gen_prefill(m, s, &c, NULL, tokens, cut, logits)))
        goto out;
    r->nll = 0.0;
    for (int t = 0; t < cut; t++)
        r->nll += nll_of(logits + (size_t)t * V, V, tokens[t + 1]);
    if ((rc = cache_copy(&prefix, &c)))
        goto out;
    if (r->zip) {   /* scored on a copy: c goes on to the continuation */
        if ((rc = kvp_eval_kvzip_scores(m, s, &prefix, tokens)))
            goto out;
        for (int hi = 0; hi < r->n_heads; hi++)
            memcpy(r->zip + (size_t)hi * cut, prefix.heads[hi].score, (size_t)cut * sizeof *r->zip);
    }
    memset(r->imp, 0, (size_t)r->n_heads * cut * sizeof *r->imp);
    for (int hi = 0; hi < r->n_heads; hi++)
        limit[hi] = cut;
    importance_obs st = {r->imp, cut, limit, 0, 0};
    kvp_policy obs = {.ops = &obs_ops, .cfg = m->cfg, .impl = &st};
    kvp_policy_attach(&s->hooks, &obs);
    rc = kvp_gen_prefill(m, s, &c, NULL, tokens + cut, cont, r->logits);
    kvp_policy_attach(&s->hooks, NULL);
    if (rc)
        goto out;
    for (int t = 0; t + 1 < cont; t++)
        r->nll += nll_of(r->logits + (size_t)t * V, V, tokens[cut + t + 1]);
    rc = oracle_minimum(r, &m->cfg, &prefix);
out:
    kvp_cache_free(&c);
    kvp_cache_free(&prefix);
    free(logits);
    free(limit);
    return rc;
}

/* ---- ranking and oneshot ----------------------------------------------------------------- */

typedef struct ranked {
    int window;    /* in the policy's own always-kept window */
    float score;
    int row;
} ranked;

/* the policy's order: its window first, then higher score (NaN last), then older row */
static int by_rank(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->window != y->window)
        return y->window - x->window;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

static int by_value_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* C/C* of the policy's ranking of the rows that are not always kept (kvp-method.md:
 * C = sum over r of r * I_sigma_r, C* the same for I sorted descending). Rows a policy
 * protects beyond the n_recent newest at the smallest budget where it chooses anything
 * (SnapKV's observation window, LagKV's last partition) rank first. */
static double ranking_ratio(const kvp_policy *p, int layer, const kvp_head *h,
                            const float *imp, ranked *rk, float *sorted)
{
    int n = h->n;
    int ns = p->n_sink < 0 ? 0 : p->n_sink < n ? p->n_sink : n;
    int nr = p->n_recent < 0 ? 0 : p->n_recent < n - ns ? p->n_recent : n - ns;
    int win = p->ops->recent_window ? p->ops->recent_window(p, layer, ns + nr + 1) : nr;
    int m = 0;
    for (int i = ns; i < n - nr; i++, m++) {
        float sc = h->score[i];
        rk[m] = (ranked){i >= n - win, isnan(sc) ? -INFINITY : sc, i};
        sorted[m] = imp[h->seq[i]];
    }
    qsort(rk, (size_t)m, sizeof *rk, by_rank);
    qsort(sorted, (size_t)m, sizeof *sorted, by_value_desc);
    double c = 0.0, cstar = 0.0;
    for (int r = 0; r < m; r++) {
        c += (r + 1.0) * imp[h->seq[rk[r].row]];
        cstar += (r + 1.0) * sorted[r];
    }
    return c / fmax(cstar, 1e-8);
}

int kvp_eval_prefix(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *tokens,
                    const kvp_eval_ref *r, kvp_cache *prefix)
{
    int rc = cache_like(prefix, &m->cfg, r->kv_type);
    if (rc)
        return rc;
    /* the policy watches the prefix run, as it would in the daemon */
    kvp_policy_attach(&s->hooks, p);
    rc = kvp_gen_prefill(m, s, prefix, NULL, tokens, r->cut, NULL);
    kvp_policy_attach(&s->hooks, NULL);
    if (rc) {
        kvp_cache_free(prefix);
        return rc;
    }
    /* the evaluation-only policies' scores: the reference's */
    const float *given = kvp_policy_is_oracle(p) ? r->imp : kvp_policy_is_kvzip(p) ? r->zip : NULL;
    if (kvp_policy_is_kvzip(p) && !r->zip) {   /* a reference made without opts->kvzip */
        kvp_cache_free(prefix);
        return -EINVAL;
    }
    if (given)
        for (int hi = 0; hi < r->n_heads; hi++)
            memcpy(prefix->heads[hi].score, given + (size_t)hi * r->cut,
                   (size_t)r->cut * sizeof(float));
    return 0;
}

/* b (shaped like prefix) := prefix compressed once to `budget` rows by p. */
static int compress_copy(kvp_cache *b, const kvp_cache *prefix, kvp_policy *p, int budget,
                         int budget_mode)
{
    kvp_evict_cfg e = {p, budget, 0, budget_mode};
    int rc = cache_copy(b, prefix);
    if (!rc && (rc = kvp_gen_compress(b, &e)) > 0)   /* rows dropped */
        rc = 0;
    return rc;
}

/* The rest of the sequence teacher-forced on the compressed cache b (no more eviction:
 * no policy is attached); adds the NLL and KL(full || evicted) of its cont - 1
 * predictions. logits holds [cont][vocab]. */
static int continue_on(const kvp_model *m, kvp_runstate *s, kvp_cache *b, const int *tokens,
                       const kvp_eval_ref *r, float *logits, double *nll, double *kl)
{
    int cut = r->cut, cont = r->len - cut, V = r->vocab;
    int rc = kvp_gen_prefill(m, s, b, NULL, tokens + cut, cont, logits);
    if (rc)
        return rc;
    for (int t = 0; t + 1 < cont; t++) {
        *nll += nll_of(logits + (size_t)t * V, V, tokens[cut + t + 1]);
        *kl += kvp_logits_kl(r->logits + (size_t)t * V, logits + (size_t)t * V, V);
    }
    return 0;
}

int kvp_eval_oneshot(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *tokens,
                     const kvp_eval_ref *r, const kvp_cache *prefix, int budget, double *kl)
{
    kvp_cache b = {0};
    float *logits = malloc((size_t)(r->len - r->cut) * r->vocab * sizeof *logits);
    double nll = 0.0;
    int rc = logits ? cache_like(&b, &m->cfg, r->kv_type) : -ENOMEM;
    if (!rc && !(rc = compress_copy(&b, prefix, p, budget, r->budget_mode)))
        rc = continue_on(m, s, &b, tokens, r, logits, &nll, kl);
    kvp_cache_free(&b);
    free(logits);
    return rc;
}

int kvp_eval_sequence(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *tokens,
                      const kvp_eval_ref *r, kvp_eval_acc *acc)
{
    int cut = r->cut, cont = r->len - cut, V = r->vocab, nh = r->n_heads;
    int n_kv = m->cfg.n_kv_heads;
    kvp_cache a = {0}, b = {0};
    float *logits = malloc((size_t)cont * V * sizeof *logits);
    ranked *rk = malloc((size_t)cut * sizeof *rk);
    float *sorted = malloc((size_t)cut * sizeof *sorted);
    int rc = -ENOMEM;
    if (!logits || !rk || !sorted || (rc = cache_like(&b, &m->cfg, r->kv_type)) ||
        (rc = kvp_eval_prefix(m, s, p, tokens, r, &a)))
        goto out;
    /* "none" keeps every row: it has no ranking */
    for (int hi = 0; hi < nh && !kvp_policy_is_none(p); hi++) {
        kvp_head *h = &a.heads[hi];
        if (p->ops->before_evict)
            p->ops->before_evict(p, hi / n_kv, hi % n_kv, h);
        acc->cc_ratio += ranking_ratio(p, hi / n_kv, h, r->imp + (size_t)hi * cut, rk, sorted);
        acc->cases++;
    }

    for (int bi = 0; bi < r->n_budgets; bi++) {
        if ((rc = compress_copy(&b, &a, p, r->budgets[bi], r->budget_mode)))
            goto out;
        for (int hi = 0; hi < nh && !kvp_policy_is_none(p); hi++) {
            const float *imp = r->imp + (size_t)hi * cut;
            double total = total_importance(imp, cut), kept = kept_importance(&b.heads[hi], imp, cut);
            acc->evicted[bi] += total - kept;
            acc->min_evicted[bi] += r->min_evicted[(size_t)bi * nh + hi];
            acc->recall[bi] += total > 0.0 ? kept / total : 1.0;
        }
        if ((rc = continue_on(m, s, &b, tokens, r, logits, &acc->nll[bi], &acc->kl[bi])))
            goto out;
    }
    acc->tokens += cont - 1;
    rc = 0;
out:
    kvp_cache_free(&a);
    kvp_cache_free(&b);
    free(logits);
    free(rk);
    free(sorted);
    return rc;
}

/* ---- streaming --------------------------------------------------------------------------- */

/* The streaming oracle's scores: the attention the next n tokens pay each row of c (max
 * over the group, summed), measured on the copy d; imp has seq_len floats per head. */
static int lookahead_scores(const kvp_model *m, kvp_runstate *s, kvp_cache *c, kvp_cache *d,
                            const int *tokens, int n, int n_sink, float *imp, int *limit)
{
    int rc = cache_copy(d, c), nh = c->n_layers * c->n_kv_heads, stride = m->cfg.seq_len;
    if (rc)
        return rc;
    if (d->next_pos + n > m->cfg.seq_len && (rc = kvp_cache_shift(d, n_sink, m->cfg.seq_len)))
        return rc;
    if (n > m->cfg.seq_len - d->next_pos)
        n = m->cfg.seq_len - d->next_pos;
    if (n > s->max_tokens)
        n = s->max_tokens;
    if (n < 1)
        return 0;
    for (int hi = 0; hi < nh; hi++)
        limit[hi] = d->heads[hi].n;
    memset(imp, 0, (size_t)nh * stride * sizeof *imp);
    importance_obs st = {imp, stride, limit, 0, 0};
    kvp_policy obs = {.ops = &obs_ops, .cfg = m->cfg, .impl = &st};
    kvp_policy_attach(&s->hooks, &obs);
    rc = kvp_forward(m, s, d, tokens, n, NULL);
    kvp_policy_attach(&s->hooks, NULL);
    if (rc)
        return rc;
    for (int hi = 0; hi < nh; hi++)
        if (limit[hi])  /* an empty head may have no arrays yet */
            memcpy(c->heads[hi].score, imp + (size_t)hi * stride, (size_t)limit[hi] * sizeof *imp);
    return 0;
}

int kvp_eval_stream_ref_init(kvp_eval_stream_ref *r, const kvp_model_config *cfg, int len,
                             int every)
{
    memset(r, 0, sizeof *r);
    if (len < 2 || every < 1)
        return -EINVAL;
    r->len = len;
    r->every = every;
    r->vocab = cfg->vocab_size;
    r->n_pos = (len - 1) / every;   /* t = every - 1, ... <= len - 2 */
    r->pos = malloc(((size_t)r->n_pos + 1) * sizeof *r->pos);
    r->logits = malloc(((size_t)r->n_pos * r->vocab + 1) * sizeof *r->logits);
    if (!r->pos || !r->logits) {
        kvp_eval_stream_ref_free(r);
        return -ENOMEM;
    }
    for (int i = 0; i < r->n_pos; i++)
        r->pos[i] = (i + 1) * every - 1;
    return 0;
}

void kvp_eval_stream_ref_free(kvp_eval_stream_ref *r)
{
    free(r->pos);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

int kvp_eval_stream_ref_compute(kvp_eval_stream_ref *r, const kvp_model *m, kvp_runstate *s,
                                const int *tokens, int bos)
{
    int ctx = m->cfg.seq_len, V = r->vocab, every = r->every, i = 0, rc = -ENOMEM;
    int *window = malloc((size_t)ctx * sizeof *window);
    float *block = malloc((size_t)every * V * sizeof *block);
    kvp_cache c = {0};
    if (!window || !block || (rc = cache_like(&c, &m->cfg, KVP_KV_F32)))
        goto out;
    kvp_policy_attach(&s->hooks, NULL);
    /* Within the context: one cache, fed in blocks that end at the sampled positions. */
    for (int off = 0; i < r->n_pos && r->pos[i] < ctx; off += every, i++) {
        if ((rc = kvp_gen_prefill(m, s, &c, NULL, tokens + off, every, block)))
            goto out;
        memcpy(r->logits + (size_t)i * V, block + (size_t)(every - 1) * V, (size_t)V * sizeof *block);
    }
    /* Past it: a fresh cache on the last context - 1 tokens. */
    for (; i < r->n_pos; i++) {
        int t = r->pos[i], n = 0;
        if (bos >= 0)
            window[n++] = bos;
        memcpy(window + n, tokens + t - ctx + 2, (size_t)(ctx - 1) * sizeof *window);
        n += ctx - 1;
        kvp_cache_free(&c);
        if ((rc = cache_like(&c, &m->cfg, KVP_KV_F32)) || (rc = kvp_gen_prefill(m, s, &c, NULL, window, n, NULL)))
            goto out;
        memcpy(r->logits + (size_t)i * V, s->logits, (size_t)V * sizeof *block);
    }
    rc = 0;
out:
    kvp_cache_free(&c);
    free(window);
    free(block);
    return rc;
}

int kvp_eval_stream(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *tokens,
                    int len, int bi, const kvp_eval_opts *o, const kvp_eval_stream_ref *ref,
                    kvp_eval_acc *acc)
{
    int V = m->cfg.vocab_size, nh = m->cfg.n_layers * m->cfg.n_kv_heads, oracle = kvp_policy_is_oracle(p);
    int chunk = o->chunk;
    kvp_cache c = {0}, d = {0};
    float *logits = malloc((size_t)chunk * V * sizeof *logits);
    float *imp = oracle ? malloc((size_t)nh * m->cfg.seq_len * sizeof *imp) : NULL;
    int *limit = oracle ? malloc((size_t)nh * sizeof *limit) : NULL;
    int rc = -ENOMEM;
    if (!logits || (oracle && (!imp || !limit)) || (rc = cache_like(&c, &m->cfg, o->kv_type)) ||
        (rc = cache_like(&d, &m->cfg, o->kv_type)))
        goto out;
    kvp_evict_cfg e = {p, o->budgets[bi], chunk, o->budget_mode};
    double nll = 0.0;
    for (int off = 0; off < len; off += chunk) {
        int n = len - off < chunk ? len - off : chunk;
        /* kvzip: fresh scores of every row before a chunk that may evict (a per-head
         * budget evicts only past budget + chunk rows; a global one may at any chunk) */
        if (kvp_policy_is_kvzip(p) && (o->budget_mode == KVP_BUDGET_GLOBAL ||
                                       kvp_cache_budget_max_rows(&c) + n > e.budget + chunk) &&
            (rc = kvp_eval_kvzip_scores(m, s, &c, tokens)))
            goto out;
        if (oracle) {
            int look = len - off < o->lookahead ? len - off : o->lookahead;
            if ((rc = lookahead_scores(m, s, &c, &d, tokens + off, look, p->n_sink, imp, limit)))
                goto out;
        }
        kvp_policy_attach(&s->hooks, p);
        rc = kvp_gen_prefill(m, s, &c, &e, tokens + off, n, logits);
        kvp_policy_attach(&s->hooks, NULL);
        if (rc)
            goto out;
        for (int t = 0; t < n && off + t + 1 < len; t++)
            nll += nll_of(logits + (size_t)t * V, V, tokens[off + t + 1]);
        /* the sampled positions in this chunk: pos = (i + 1) every - 1 */
        for (int i = ref ? off / ref->every : 0; ref && i < ref->n_pos && ref->pos[i] < off + n; i++) {
            const float *want = ref->logits + (size_t)i * V, *got = logits + (size_t)(ref->pos[i] - off) * V;
            acc->stream_kl[bi] += kvp_logits_kl(want, got, V);
            acc->stream_top1[bi] += argmax(want, V) == argmax(got, V);
            acc->stream_samples[bi]++;
        }
    }
    acc->stream_nll[bi] += nll;
    acc->stream_tokens[bi] += len - 1;
out:
    kvp_cache_free(&c);
    kvp_cache_free(&d);
    free(logits);
    free(imp);
    free(limit);
    return rc;
}

/* ---- replies ----------------------------------------------------------------------------- */

int kvp_eval_replies(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const kvp_template *t,
                     const int *prompt, int n_prompt, int bi, const kvp_eval_opts *o,
                     kvp_eval_reply *out, kvp_eval_acc *acc)
{
    int V = m->cfg.vocab_size, ctx = m->cfg.seq_len;
    kvp_eval_reply r = {.tokens = out ? out->tokens : NULL, .kl = out ? out->kl : NULL};
    if (!p || kvp_policy_is_oracle(p) || kvp_policy_is_kvzip(p) || n_prompt < 1 || o->reply_len < 1 || bi < 0 ||
        bi >= o->n_budgets)
        return -EINVAL;
    if (n_prompt > ctx) {   /* not even the prompt fits */
        r.skipped = 1;
        acc->reply_skipped[bi]++;
        if (out)
            *out = r;
        return 0;
    }
    kvp_evict_cfg e = {p, o->budgets[bi], o->chunk, o->budget_mode};
    /* the blocks the policy's prefill runs in (generate.c): chunks while it evicts */
    int evicts = e.budget > 0 && !kvp_policy_is_none(p);
    int step = evicts ? (o->chunk > 0 ? o->chunk : KVP_DEFAULT_CHUNK) : s->max_tokens;
    if (step > s->max_tokens)
        step = s->max_tokens;
    kvp_cache ev = {0}, full = {0};
    kvp_sampler smp = {0};
    float *q = malloc((size_t)V * sizeof *q);
    int rc = -ENOMEM, have_smp = 0;
    if (!q || (rc = cache_like(&ev, &m->cfg, o->kv_type)) ||
        (rc = cache_like(&full, &m->cfg, KVP_KV_F32)) ||
        (rc = kvp_sampler_init(&smp, V, 0.0f, 1.0f, 0)))
        goto out;
    have_smp = 1;
    kvp_policy_attach(&s->hooks, NULL);   /* the drivers attach e.policy to its own run */
    if ((rc = kvp_gen_prefill(m, s, &ev, &e, prompt, n_prompt, NULL)))
        goto out;
    memcpy(q, s->logits, (size_t)V * sizeof *q);
    for (int off = 0; off < n_prompt; off += step) {
        int n = n_prompt - off < step ? n_prompt - off : step;
        if ((rc = kvp_gen_prefill(m, s, &full, NULL, prompt + off, n, NULL)))
            goto out;
    }
    double kl_sum = 0.0;
    for (;;) {
        const float *pl = s->logits;   /* the full run's, at the position q is for */
        double kl = kvp_logits_kl(pl, q, V);
        kl_sum += kl;
        r.agree += argmax(pl, V) == argmax(q, V);
        if (r.kl)
            r.kl[r.draws] = kl;
        int tok = kvp_sample(&smp, q);   /* greedy: the daemon's tie rule */
        if (r.tokens)
            r.tokens[r.draws] = tok;
        r.draws++;
        if (kvp_template_is_stop(t, tok) || r.draws >= o->reply_len)
            break;
        /* another draw makes the record prompt + draws tokens: past the context, the
         * canary refuses it */
        if (n_prompt + r.draws > ctx) {
            r.skipped = 1;
            break;
        }
        if ((rc = kvp_gen_decode(m, s, &ev, &e, tok)))
            goto out;
        memcpy(q, s->logits, (size_t)V * sizeof *q);
        if ((rc = kvp_gen_decode(m, s, &full, NULL, tok)))
            goto out;
    }
    if (r.skipped) {
        acc->reply_skipped[bi]++;
    } else {
        r.kl_mean = kl_sum / r.draws;
        r.top1 = (double)r.agree / r.draws;
        acc->reply_convs[bi]++;
        acc->reply_draws[bi] += r.draws;
        acc->reply_kl[bi] += r.kl_mean;
        acc->reply_top1[bi] += r.top1;
    }
    if (out)
        *out = r;
out:
    kvp_cache_free(&ev);
    kvp_cache_free(&full);
    if (have_smp)
        kvp_sampler_free(&smp);
    free(q);
    return rc;
}

void kvp_eval_acc_add(kvp_eval_acc *dst, const kvp_eval_acc *src)
{
    dst->cases += src->cases;
    dst->cc_ratio += src->cc_ratio;
    dst->tokens += src->tokens;
    for (int bi = 0; bi < KVP_EVAL_MAX_BUDGETS; bi++) {
        dst->evicted[bi] += src->evicted[bi];
        dst->min_evicted[bi] += src->min_evicted[bi];
        dst->recall[bi] += src->recall[bi];
        dst->nll[bi] += src->nll[bi];
        dst->kl[bi] += src->kl[bi];
        dst->stream_tokens[bi] += src->stream_tokens[bi];
        dst->stream_nll[bi] += src->stream_nll[bi];
        dst->stream_samples[bi] += src->stream_samples[bi];
        dst->stream_kl[bi] += src->stream_kl[bi];
        dst->stream_top1[bi] += src->stream_top1[bi];
        dst->reply_convs[bi] += src->reply_convs[bi];
        dst->reply_skipped[bi] += src->reply_skipped[bi];
        dst->reply_draws[bi] += src->reply_draws[bi];
        dst->reply_kl[bi] += src->reply_kl[bi];
        dst->reply_top1[bi] += src->reply_top1[bi];
    }
}

/* ---- results ------------------------------------------------------------------------------ */

int kvp_eval_rows(const char *policy, const kvp_eval_acc *a, const kvp_eval_opts *o,
                  kvp_eval_row *rows)
{
    int n = 0;
    if (a->cases) {
        rows[n++] = (kvp_eval_row){"ranking", policy, "cc_ratio", 0, a->cc_ratio / a->cases};
        for (int bi = 0; bi < o->n_budgets; bi++) {
            double ev = a->evicted[bi], mn = a->min_evicted[bi];
            /* nothing to drop (a budget above the sequence) costs what the oracle's does */
            double cost = mn > 0.0 ? ev / mn : ev > 0.0 ? INFINITY : 1.0;
            rows[n++] = (kvp_eval_row){"ranking", policy, "cost", o->budgets[bi], cost};
        }
        for (int bi = 0; bi < o->n_budgets; bi++)
            rows[n++] = (kvp_eval_row){"ranking", policy, "recall", o->budgets[bi],
                                       a->recall[bi] / a->cases};
    }
    if (a->tokens) {
        for (int bi = 0; bi < o->n_budgets; bi++)
            rows[n++] = (kvp_eval_row){"oneshot", policy, "ppl", o->budgets[bi],
                                       exp(a->nll[bi] / a->tokens)};
        for (int bi = 0; bi < o->n_budgets; bi++)
            rows[n++] = (kvp_eval_row){"oneshot", policy, "kl", o->budgets[bi],
                                       a->kl[bi] / a->tokens};
    }
    for (int bi = 0; bi < o->n_budgets; bi++)
        if (a->stream_tokens[bi])
            rows[n++] = (kvp_eval_row){"streaming", policy, "ppl", o->budgets[bi],
                                       exp(a->stream_nll[bi] / a->stream_tokens[bi])};
    for (int bi = 0; bi < o->n_budgets; bi++)
        if (a->stream_samples[bi])
            rows[n++] = (kvp_eval_row){"streaming", policy, "kl", o->budgets[bi],
                                       a->stream_kl[bi] / a->stream_samples[bi]};
    for (int bi = 0; bi < o->n_budgets; bi++)
        if (a->stream_samples[bi])
            rows[n++] = (kvp_eval_row){"streaming", policy, "top1", o->budgets[bi],
                                       (double)a->stream_top1[bi] / a->stream_samples[bi]};
    for (int bi = 0; bi < o->n_budgets; bi++)
        if (a->reply_convs[bi])
            rows[n++] = (kvp_eval_row){"replies", policy, "kl", o->budgets[bi],
                                       a->reply_kl[bi] / a->reply_convs[bi]};
    for (int bi = 0; bi < o->n_budgets; bi++)
        if (a->reply_convs[bi])
            rows[n++] = (kvp_eval_row){"replies", policy, "top1", o->budgets[bi],
                                       a->reply_top1[bi] / a->reply_convs[bi]};
    for (int bi = 0; bi < o->n_budgets; bi++)
        if (a->reply_convs[bi])
            rows[n++] = (kvp_eval_row){"replies", policy, "reply_len", o->budgets[bi],
                                       (double)a->reply_draws[bi] / a->reply_convs[bi]};
    return n;
}

static const struct metric_info {
    const char *protocol, *metric, *title, *ylabel, *fmt;
    int log_y;
} metric_info[] = {
    {"ranking", "cc_ratio", "Ranking: all-budget cost C/C* (oracle = 1, lower is better)",
     "C/C*", "%.3f", 0},
    {"ranking", "cost", "Ranking: future importance evicted / the oracle's (lower is better)",
     "evicted importance / oracle's", "%.3f", 1},
    {"ranking", "recall", "Ranking: r@b, share of the future importance kept (higher is better)",
     "r@b", "%.3f", 0},
    {"oneshot", "ppl", "One-shot: perplexity of the continuation after one compression",
     "perplexity", "%.3f", 0},
    {"oneshot", "kl", "One-shot: mean KL(full || evicted) of next-token distributions (nats)",
     "KL (nats)", "%.4f", 1},
    {"streaming", "ppl", "Streaming: perplexity with chunked eviction and context shift",
     "perplexity", "%.3f", 0},
    {"streaming", "kl", "Streaming: mean KL(full window || policy) of next-token distributions "
     "(nats; fidelity to the model itself)", "KL (nats)", "%.4f", 1},
    {"streaming", "top1", "Streaming: top-1 agreement with the full window (higher is better)",
     "top-1 agreement", "%.3f", 0},
    {"replies", "kl", "Replies: mean KL(full || evicted) at the model's own greedy replies "
     "(nats; what the live canary estimates)", "KL (nats)", "%.4f", 1},
    {"replies", "top1", "Replies: top-1 agreement with the full cache at the reply positions "
     "(higher is better)", "top-1 agreement", "%.3f", 0},
    {"replies", "reply_len", "Replies: mean reply length (tokens drawn, the stop token "
     "included)", "tokens", "%.1f", 0},
    {"conversation", "kl", "Conversation: mean KL(full || evicted) over every reply "
     "(nats)", "KL (nats)", "%.4f", 1},
#define TURN_KL(k) {"conversation", "kl_t" #k, "Conversation: KL(full || evicted) at the "   \
                    "reply of turn " #k " (nats)", "KL (nats)", "%.4f", 1}
    TURN_KL(1), TURN_KL(2), TURN_KL(3), TURN_KL(4), TURN_KL(5), TURN_KL(6), TURN_KL(7),
    TURN_KL(8),
#undef TURN_KL
#define RECALL(n) {"conversation", "recall_" #n, "Conversation: recall at turn " #n ", mean "  \
                   "log-likelihood of turn 1's text asked for again (nats/token, higher is "  \
                   "better)", "log-likelihood (nats/token)", "%.3f", 0},                      \
                  {"conversation", "recall_gap_" #n, "Conversation: recall lost at turn " #n   \
                   ", full cache's log-likelihood of turn 1's text minus the policy's "        \
                   "(nats/token, lower is better)", "nats/token", "%.3f", 0},                \
                  {"conversation", "kept_t1_" #n, "Conversation: share of turn 1's rows "    \
                   "the cache still holds at turn " #n, "share of rows", "%.3f", 0}
    RECALL(4), RECALL(8),
#undef RECALL
};

static const kvp_eval_row *find_row(const kvp_eval_row *rows, int n, const struct metric_info *mi,
                                    const char *policy, int budget)
{
    for (int i = 0; i < n; i++)
        if (rows[i].budget == budget && !strcmp(rows[i].protocol, mi->protocol) &&
            !strcmp(rows[i].metric, mi->metric) && !strcmp(rows[i].policy, policy))
            return &rows[i];
    return NULL;
}

int kvp_eval_policy_index(const char *name)
{
    const char *all = kvp_offline_policy_names();
    size_t len = strlen(name);
    int idx = 0;
    for (const char *t = all; *t; idx++) {
        size_t w = strcspn(t, " ");
        if (w == len && !strncmp(t, name, len))
            return idx;
        t += w;
        t += *t == ' ';
    }
    return -1;
}

/* The policies (in order of appearance) and ascending budgets a metric has rows for. */
static void metric_axes(const kvp_eval_row *rows, int n, const struct metric_info *mi,
                        const char **pol, int *n_pol, int *bud, int *n_bud)
{
    *n_pol = *n_bud = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(rows[i].protocol, mi->protocol) || strcmp(rows[i].metric, mi->metric))
            continue;
        int j = 0;
        while (j < *n_pol && strcmp(pol[j], rows[i].policy))
            j++;
        if (j == *n_pol)
            pol[(*n_pol)++] = rows[i].policy;
        for (j = 0; j < *n_bud && bud[j] != rows[i].budget; j++)
            ;
        if (j < *n_bud)
            continue;
        /* insertion keeps the budgets ascending */
        for (j = (*n_bud)++; j > 0 && bud[j - 1] > rows[i].budget; j--)
            bud[j] = bud[j - 1];
        bud[j] = rows[i].budget;
    }
}

static int write_csv(const char *path, const kvp_eval_row *rows, int n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return KVP_ERR(-errno, "cannot create %s: %s", path, strerror(errno));
    fputs("protocol,policy,budget,metric,value\n", f);
    for (int i = 0; i < n; i++) {
        char b[16];
        snprintf(b, sizeof b, rows[i].budget ? "%d" : "all", rows[i].budget);
        fprintf(f, "%s,%s,%s,%s,%.6g\n", rows[i].protocol, rows[i].policy, b, rows[i].metric,
                rows[i].value);
    }
    if (ferror(f) | fclose(f))
        return KVP_ERR(-EIO, "cannot write %s", path);
    return 0;
}

static int write_md_and_plots(const char *dir, const kvp_eval_row *rows, int n,
                              const char *intro, const char **pol, int *bud, double *y,
                              char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/results.md", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return KVP_ERR(-errno, "cannot create %s: %s", path, strerror(errno));
    fputs(intro, f);
    int rc = 0;
    for (size_t mi_i = 0; mi_i < sizeof metric_info / sizeof metric_info[0] && !rc; mi_i++) {
        const struct metric_info *mi = &metric_info[mi_i];
        int n_pol, n_bud;
        metric_axes(rows, n, mi, pol, &n_pol, bud, &n_bud);
        if (!n_pol)
            continue;
        int per_budget = bud[0] > 0;
        fprintf(f, "\n## %s\n\n", mi->title);
        if (per_budget)
            fprintf(f, "![%s](%s-%s.svg)\n\n", mi->title, mi->protocol, mi->metric);
        fputs("| policy |", f);
        for (int j = 0; j < n_bud; j++)
            fprintf(f, per_budget ? " b=%d |" : " all budgets |", bud[j]);
        fputs("\n|---|", f);
        for (int j = 0; j < n_bud; j++)
            fputs("---|", f);
        fputs("\n", f);
        for (int i = 0; i < n_pol; i++) {
            fprintf(f, "| %s |", pol[i]);
            for (int j = 0; j < n_bud; j++) {
                const kvp_eval_row *r = find_row(rows, n, mi, pol[i], bud[j]);
                fputs(" ", f);
                if (r)
                    fprintf(f, mi->fmt, r->value);
                else
                    fputs("-", f);
                fputs(" |", f);
            }
            fputs("\n", f);
        }
        if (!per_budget)
            continue;
        /* the plot: budgets on a log2 axis, one line per policy */
        double x[KVP_EVAL_MAX_BUDGETS];
        kvp_svg_series series[64];
        int ns = n_pol < 64 ? n_pol : 64;
        for (int j = 0; j < n_bud && j < KVP_EVAL_MAX_BUDGETS; j++)
            x[j] = bud[j];
        for (int i = 0; i < ns; i++) {
            double *yi = y + (size_t)i * KVP_EVAL_MAX_BUDGETS;
            for (int j = 0; j < n_bud && j < KVP_EVAL_MAX_BUDGETS; j++) {
                const kvp_eval_row *r = find_row(rows, n, mi, pol[i], bud[j]);
                yi[j] = r ? r->value : NAN;
            }
            /* a policy has the same color in every plot */
            int color = kvp_eval_policy_index(pol[i]);
            series[i] = (kvp_svg_series){pol[i], yi, color < 0 ? 0 : color,
                                         !strcmp(pol[i], "oracle") || !strcmp(pol[i], "none"),
                                         !strcmp(pol[i], "kvp")};
        }
        kvp_svg_plot plot = {mi->title, "budget (rows per KV head, log2 scale)", mi->ylabel, x,
                             n_bud < KVP_EVAL_MAX_BUDGETS ? n_bud : KVP_EVAL_MAX_BUDGETS,
                             mi->log_y, series, ns, 0};
        char svg[1200];
        snprintf(svg, sizeof svg, "%s/%s-%s.svg", dir, mi->protocol, mi->metric);
        rc = kvp_svg_write(svg, &plot, err, errlen);
    }
    if ((ferror(f) | fclose(f)) && !rc)
        rc = KVP_ERR(-EIO, "cannot write %s", path);
    return rc;
}

int kvp_eval_write(const char *dir, const kvp_eval_row *rows, int n, const char *intro,
                   char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/results.csv", dir);
    int rc = write_csv(path, rows, n, err, errlen);
    if (rc)
        return rc;
    const char **pol = malloc((size_t)(n + 1) * sizeof *pol);
    int *bud = malloc((size_t)(n + 1) * sizeof *bud);
    double *y = malloc(64 * KVP_EVAL_MAX_BUDGETS * sizeof *y);
    if (!pol || !bud || !y)
        rc = KVP_ERR(-ENOMEM, "out of memory");
    else
        rc = write_md_and_plots(dir, rows, n, intro, pol, bud, y, err, errlen);
    free(pol);
    free(bud);
    free(y);
    return rc;
}
