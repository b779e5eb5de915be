#include "offline/forkeval.h"

#include "model/logprobs.h"
#include "offline/eval.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int empty_cache(kvp_cache *c, const kvp_model_config *cfg)
{
    return kvp_cache_init(c, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &cfg->rope);
}

/* c (already holding P, or empty) continues with n tokens under e; the last next-token
 * logits are copied to out */
static int feed(const kvp_model *m, kvp_runstate *s, kvp_cache *c, const kvp_evict_cfg *e,
                const int *tokens, int n, float *out)
{
    int rc = kvp_gen_prefill(m, s, c, e, tokens, n, NULL);
    if (!rc && out)
        memcpy(out, s->logits, (size_t)m->cfg.vocab_size * sizeof *out);
    return rc;
}

static int check_case(const kvp_forkeval_case *fc)
{
    if (!fc->prefix || !fc->source || !fc->branch || fc->n_prefix < 1 || fc->n_source < 1 ||
        fc->n_branch < 1 || fc->budget < 0 || fc->chunk < 0)
        return -EINVAL;
    return 0;
}

int kvp_forkeval_full(const kvp_model *m, kvp_runstate *s, const kvp_forkeval_case *fc,
                      float *out)
{
    int rc = check_case(fc);
    if (rc)
        return rc;
    if (fc->n_prefix + fc->n_branch > m->cfg.seq_len)
        return -E2BIG;
    kvp_cache c;
    if ((rc = empty_cache(&c, &m->cfg)))
        return rc;
    kvp_policy_attach(&s->hooks, NULL);
    if (!(rc = feed(m, s, &c, NULL, fc->prefix, fc->n_prefix, NULL)))
        rc = feed(m, s, &c, NULL, fc->branch, fc->n_branch, out);
    kvp_cache_free(&c);
    return rc;
}

int kvp_forkeval_run(const kvp_model *m, kvp_runstate *s, const kvp_forkeval_case *fc,
                     kvp_policy *src, kvp_policy *fork, kvp_policy *scratch,
                     const float *full_logits, double *kl_fork, double *kl_scratch,
                     kvp_cache *fork_cache, kvp_cache *scratch_cache)
{
    int rc = check_case(fc), V = m->cfg.vocab_size;
    if (rc)
        return rc;
    kvp_cache a = {0}, f = {0}, b = {0};
    int have_a = 0, have_f = 0, have_b = 0;
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!logits)
        return -ENOMEM;
    kvp_evict_cfg es = {src, fc->budget, fc->chunk, 0};
    kvp_evict_cfg ef = {fork, fc->budget, fc->chunk, 0};
    kvp_evict_cfg eb = {scratch, fc->budget, fc->chunk, 0};

    /* the source: P then its own continuation A, evicting as it goes */
    if ((rc = empty_cache(&a, &m->cfg)))
        goto out;
    have_a = 1;
    if ((rc = feed(m, s, &a, &es, fc->prefix, fc->n_prefix, NULL)) ||
        (rc = feed(m, s, &a, &es, fc->source, fc->n_source, NULL)))
        goto out;

    /* the fork: the source's compressed cache cut at |P|, its policy state with it */
    if ((rc = kvp_cache_fork(&f, &a, fc->n_prefix)))
        goto out;
    have_f = 1;
    if ((rc = kvp_policy_fork(fork, src, &f, fc->n_prefix)) ||
        (rc = feed(m, s, &f, &ef, fc->branch, fc->n_branch, logits)))
        goto out;
    *kl_fork = kvp_logits_kl(full_logits, logits, V);

    /* from scratch: P + B from an empty cache */
    if ((rc = empty_cache(&b, &m->cfg)))
        goto out;
    have_b = 1;
    if ((rc = feed(m, s, &b, &eb, fc->prefix, fc->n_prefix, NULL)) ||
        (rc = feed(m, s, &b, &eb, fc->branch, fc->n_branch, logits)))
        goto out;
    *kl_scratch = kvp_logits_kl(full_logits, logits, V);

    if (fork_cache) {
        *fork_cache = f;
        have_f = 0;
    }
    if (scratch_cache) {
        *scratch_cache = b;
        have_b = 0;
    }
out:
    kvp_policy_attach(&s->hooks, NULL);
    if (have_a)
        kvp_cache_free(&a);
    if (have_f)
        kvp_cache_free(&f);
    if (have_b)
        kvp_cache_free(&b);
    free(logits);
    return rc;
}
