/* The eviction-quality canary: top-k records of a turn's distributions, and the
 * full-cache reference they are compared with (the estimator is in canary.h). */
#include "sessions/canary.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kvcache.h"
#include "model/forward.h"

kvp_canary_rec *kvp_canary_rec_new(const char *policy, int budget)
{
    kvp_canary_rec *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    snprintf(r->policy, sizeof r->policy, "%s", policy);
    r->budget = budget;
    return r;
}

void kvp_canary_rec_free(kvp_canary_rec *r)
{
    if (!r)
        return;
    free(r->tokens);
    free(r->pos);
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

int kvp_canary_note(kvp_canary_rec *r, const int *stream, int n, int64_t hist,
                    const float *logits, int vocab, int tok)
{
    if (r->unusable || r->n_pos >= KVP_CANARY_MAX_POS)
        return 0;
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
        if (!(r->pos = malloc(KVP_CANARY_MAX_POS * sizeof *r->pos)))
            return -ENOMEM;
    }
    if (push(r, tok) < 0)
        return -ENOMEM;
    /* log-softmax at the top K: the largest K kept sorted by insertion (K is small) */
    kvp_canary_pos *p = &r->pos[r->n_pos];
    int k = 0;
    float mx = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        sum += exp((double)(v - mx));
        if (k == KVP_CANARY_TOPK && v <= p->lp[k - 1])
            continue;
        int j = k < KVP_CANARY_TOPK ? k++ : k - 1;
        while (j > 0 && p->lp[j - 1] < v) {
            p->lp[j] = p->lp[j - 1];
            p->id[j] = p->id[j - 1];
            j--;
        }
        p->lp[j] = v;
        p->id[j] = i;
    }
    float lse = mx + (float)log(sum);
    for (int j = 0; j < k; j++)
        p->lp[j] -= lse;
    for (int j = k; j < KVP_CANARY_TOPK; j++) {   /* a vocabulary smaller than K */
        p->id[j] = -1;
        p->lp[j] = -INFINITY;
    }
    p->tok = tok;
    p->tok_lp = tok >= 0 && tok < vocab ? logits[tok] - lse : -INFINITY;
    r->n_pos++;
    return 0;
}

int kvp_canary_log_softmax(float *x, int vocab)
{
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (x[i] > x[best])
            best = i;
    float mx = x[best];
    double sum = 0.0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)(x[i] - mx));
    float lse = mx + (float)log(sum);
    for (int i = 0; i < vocab; i++)
        x[i] -= lse;
    return best;
}

static double plogpq(double p, double q)
{
    if (p <= 0.0)
        return 0.0;
    return p * (log(p) - log(q < 1e-12 ? 1e-12 : q));
}

double kvp_canary_kl_pos(const kvp_canary_pos *q, const float *full_lp, int vocab, int *agree)
{
    double kl = 0.0, ps = 0.0, qs = 0.0;
    int tok_in = 0;
    for (int j = 0; j < KVP_CANARY_TOPK && q->id[j] >= 0; j++) {
        double p = exp((double)full_lp[q->id[j]]), qq = exp((double)q->lp[j]);
        kl += plogpq(p, qq);
        ps += p;
        qs += qq;
        tok_in |= q->id[j] == q->tok;
    }
    if (!tok_in && q->tok >= 0 && q->tok < vocab) {   /* the drawn token joins the set */
        double p = exp((double)full_lp[q->tok]), qq = exp((double)q->tok_lp);
        kl += plogpq(p, qq);
        ps += p;
        qs += qq;
    }
    double pr = 1.0 - ps, qr = 1.0 - qs;
    kl += plogpq(pr > 0.0 ? pr : 0.0, qr);
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (full_lp[i] > full_lp[best])
            best = i;
    *agree = best == q->id[0];
    return kl > 0.0 ? kl : 0.0;
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
    float *lg = rc == 0 ? malloc((size_t)chunk * (size_t)cfg->vocab_size * sizeof *lg) : NULL;
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
        for (int i = 0; want && i < len; i++) {
            int k = at + i - (r->reply_from - 1);   /* the reply position it predicts */
            if (k < 0)
                continue;
            float *lp = lg + (size_t)i * cfg->vocab_size;
            kvp_canary_log_softmax(lp, cfg->vocab_size);
            int a;
            kl += kvp_canary_kl_pos(&r->pos[k], lp, cfg->vocab_size, &a);
            agree += a;
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
