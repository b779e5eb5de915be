/* The eviction-quality canary: the hidden rows a turn's tokens were drawn from, and the
 * full-cache reference they are compared with (canary.h). */
#include "observe/canary.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/logprobs.h"

kvp_canary_rec *kvp_canary_rec_new(const char *policy, int budget, int dim)
{
    if (dim <= 0)
        return NULL;
    kvp_canary_rec *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    snprintf(r->policy, sizeof r->policy, "%s", policy);
    r->budget = budget;
    r->dim = dim;
    return r;
}

void kvp_canary_rec_free(kvp_canary_rec *r)
{
    if (!r)
        return;
    free(r->tokens);
    free(r->hidden);
    free(r);
}

static int push(kvp_canary_rec *r, int id)
{
    if (r->n_tokens == r->cap_tokens) {
        int cap = r->cap_tokens ? 2 * r->cap_tokens : 256;
        int *v = realloc(r->tokens, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        r->tokens = v;
        r->cap_tokens = cap;
    }
    r->tokens[r->n_tokens++] = id;
    return 0;
}

float *kvp_canary_row(kvp_canary_rec *r)
{
    if (r->unusable || r->n_pos >= KVP_CANARY_MAX_POS)
        return NULL;
    if (r->n_pos == r->cap_pos) {   /* grown with the reply: short replies stay small */
        int cap = r->cap_pos ? 2 * r->cap_pos : 16;
        if (cap > KVP_CANARY_MAX_POS)
            cap = KVP_CANARY_MAX_POS;
        float *h = realloc(r->hidden, (size_t)cap * (size_t)r->dim * sizeof *h);
        if (!h)
            return NULL;
        r->hidden = h;
        r->cap_pos = cap;
    }
    return r->hidden + (size_t)r->n_pos * (size_t)r->dim;
}

int kvp_canary_note(kvp_canary_rec *r, const int *stream, int n, int64_t hist, int tok)
{
    if (r->unusable || r->n_pos >= KVP_CANARY_MAX_POS)
        return 0;
    if (r->n_pos >= r->cap_pos)   /* kvp_canary_row had no room for this position */
        return -ENOMEM;
    if (r->n_pos == 0) {   /* the prompt the reply follows, as the cache saw it */
        if (hist != 0 || n <= 0) {
            r->unusable = 1;
            return 0;
        }
        r->n_tokens = 0;
        for (int i = 0; i < n; i++)
            if (push(r, stream[i]) < 0)
                return -ENOMEM;
        r->reply_from = n;
    }
    if (push(r, tok) < 0)
        return -ENOMEM;
    r->n_pos++;
    return 0;
}

/* The index of the largest of x[n], the first on ties. */
static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

int kvp_canary_run(const kvp_model *m, kvp_runstate *rs, kvp_kv_type kv_type, int chunk,
                   const kvp_canary_rec *r, int (*busy)(void *), void *ctx,
                   kvp_canary_result *out, char *err, size_t errlen)
{
    const kvp_model_config *cfg = &m->cfg;
    memset(out, 0, sizeof *out);
    if (r->n_pos <= 0 || r->reply_from < 1) {
        snprintf(err, errlen, "nothing recorded");
        return -EINVAL;
    }
    if (r->dim != cfg->dim) {
        snprintf(err, errlen, "a record of rows %d wide for a model %d wide", r->dim, cfg->dim);
        return -EINVAL;
    }
    /* Logits at index i predict token i + 1: the last drawn token is never fed. */
    int n = r->reply_from + r->n_pos - 1;
    if (n > cfg->seq_len) {
        snprintf(err, errlen, "%d tokens: longer than the model's context %d", n, cfg->seq_len);
        return -E2BIG;
    }
    if (chunk > rs->max_tokens)
        chunk = rs->max_tokens;
    kvp_cache c;
    int rc = kvp_cache_init(&c, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &cfg->rope);
    if (rc == 0 && (rc = kvp_cache_convert(&c, kv_type)) < 0)
        kvp_cache_free(&c);
    size_t rows = (size_t)chunk * (size_t)cfg->vocab_size;
    float *lg = rc == 0 ? malloc(2 * rows * sizeof *lg) : NULL;
    if (rc < 0 || !lg) {
        if (rc == 0)
            kvp_cache_free(&c);
        free(lg);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    double kl = 0.0;
    int agree = 0, done = 0;
    for (int at = 0; at < n && rc == 0; at += chunk) {
        if (busy && busy(ctx)) {
            rc = KVP_CANARY_YIELDED;
            break;
        }
        int len = n - at < chunk ? n - at : chunk;
        int want = at + len > r->reply_from - 1;   /* this chunk holds reply positions */
        if ((rc = kvp_forward(m, rs, &c, r->tokens + at, len, want ? lg : NULL)) < 0) {
            snprintf(err, errlen, "forward: %s", strerror(-rc));
            break;
        }
        if (!want)
            continue;
        /* the evicted run's logits of this chunk's reply positions, from their rows */
        int i0 = r->reply_from - 1 - at > 0 ? r->reply_from - 1 - at : 0;
        int k0 = at + i0 - (r->reply_from - 1);   /* the reply position row i0 predicts */
        float *ev = lg + rows;
        kvp_forward_logits(m, r->hidden + (size_t)k0 * (size_t)r->dim, len - i0, ev);
        for (int i = i0; i < len; i++) {
            float *lp = lg + (size_t)i * cfg->vocab_size;
            float *lq = ev + (size_t)(i - i0) * cfg->vocab_size;
            double d = kvp_logits_kl(lp, lq, cfg->vocab_size);
            kl += d > 0.0 ? d : 0.0;   /* rounding may leave -1e-9 where they agree */
            agree += argmax(lp, cfg->vocab_size) == argmax(lq, cfg->vocab_size);
            done++;
        }
    }
    kvp_cache_free(&c);
    free(lg);
    if (rc != 0)
        return rc;
    out->positions = done;
    out->kl = done ? kl / done : 0.0;
    out->top1 = done ? (double)agree / done : 0.0;
    return 0;
}
