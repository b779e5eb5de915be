#include "generate/generate.h"

#include <errno.h>
#include <limits.h>

static int chunk_of(const kvp_evict_cfg *e) { return e && e->chunk > 0 ? e->chunk : KVP_DEFAULT_CHUNK; }

static int evicting(const kvp_evict_cfg *e)
{
    return e && e->policy && e->budget > 0 && !kvp_policy_is_none(e->policy);
}

static int evict(kvp_cache *c, const kvp_evict_cfg *e)
{
    return e->mode == KVP_BUDGET_GLOBAL ? kvp_policy_evict_global(e->policy, c, e->budget)
                                        : kvp_policy_evict(e->policy, c, e->budget);
}

int kvp_gen_room(const kvp_model *m, const kvp_cache *c, const kvp_evict_cfg *e)
{
    if (evicting(e))
        return INT_MAX;
    return c->next_pos < m->cfg.seq_len ? m->cfg.seq_len - c->next_pos : 0;
}

int kvp_gen_compress(kvp_cache *c, const kvp_evict_cfg *e)
{
    return evicting(e) ? evict(c, e) : 0;
}

/* Whether n more tokens would pass the bound: a head past budget + chunk rows, or with
 * global budgets the session past (budget + chunk) x heads or a head past cap + chunk.
 * Heads of sliding-window layers do not count: their windows bound them. */
static int over(const kvp_cache *c, const kvp_evict_cfg *e, int n)
{
    int chunk = chunk_of(e);
    if (e->mode != KVP_BUDGET_GLOBAL)
        return kvp_cache_budget_max_rows(c) + n > e->budget + chunk;
    size_t heads = (size_t)kvp_cache_budget_heads(c);
    return kvp_cache_budget_max_rows(c) + n > kvp_policy_head_cap(e->budget) + chunk ||
           kvp_cache_budget_rows(c) + (size_t)n * heads > (size_t)(e->budget + chunk) * heads;
}

/* The bounds of one block of n tokens, before it runs: evicts first if the block would
 * pass the budget's bound, and shifts the context if it would pass seq_len. */
static int bound(const kvp_model *m, kvp_cache *c, const kvp_evict_cfg *e, int n)
{
    if (evicting(e) && over(c, e, n)) {
        int rc = evict(c, e);
        if (rc < 0)
            return rc;
    }
    if (c->next_pos + n > m->cfg.seq_len) {
        if (!evicting(e))
            return -E2BIG;
        int rc = kvp_cache_shift(c, e->policy->n_sink, m->cfg.seq_len);
        if (rc < 0)
            return rc;
        if (c->next_pos + n > m->cfg.seq_len)
            return -E2BIG;  /* budget + chunk does not fit the context */
    }
    return 0;
}

int kvp_gen_step(const kvp_model *m, kvp_runstate *s, kvp_batch_seq *seqs,
                 const kvp_evict_cfg *const *evict, int n_seqs)
{
    int ran = 0;
    for (int i = 0; i < n_seqs; i++) {
        kvp_batch_seq *q = &seqs[i];
        const kvp_evict_cfg *e = evict[i];
        q->hooks = s->hooks;
        if (e)   /* runstates belong to workers, policies to sessions */
            kvp_policy_attach(&q->hooks, e->policy);
        /* a sequence that fails its bounds is left out of the pass (rc set) */
        q->rc = q->cache ? bound(m, q->cache, e, q->n) : -EINVAL;
        ran += q->rc == 0;
    }
    if (n_seqs <= 0)
        return -EINVAL;
    return ran ? kvp_forward_batch(m, s, seqs, n_seqs) : 0;
}

/* Feeds one block of n tokens: a step with one sequence. */
static int feed(const kvp_model *m, kvp_runstate *s, kvp_cache *c, const kvp_evict_cfg *e,
                const int *tokens, int n, float *logits)
{
    kvp_batch_seq one = {.cache = c, .tokens = tokens, .n = n, .logits = s->logits,
                         .all_logits = logits};
    int rc = kvp_gen_step(m, s, &one, &e, 1);
    return rc ? rc : one.rc;
}

int kvp_gen_prefill(const kvp_model *m, kvp_runstate *s, kvp_cache *c,
                    const kvp_evict_cfg *e, const int *tokens, int n, float *all_logits)
{
    int step = evicting(e) ? chunk_of(e) : s->max_tokens;
    if (step > s->max_tokens)
        step = s->max_tokens;
    for (int off = 0; off < n; off += step) {
        int k = n - off < step ? n - off : step;
        int rc = feed(m, s, c, e, tokens + off, k,
                      all_logits ? all_logits + (size_t)off * m->cfg.vocab_size : NULL);
        if (rc)
            return rc;
    }
    return 0;
}

int kvp_gen_decode(const kvp_model *m, kvp_runstate *s, kvp_cache *c,
                   const kvp_evict_cfg *e, int token)
{
    return feed(m, s, c, e, &token, 1, NULL);
}
