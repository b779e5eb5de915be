#include "model/logprobs.h"

#include <math.h>

/* The logit as ordered for the selection: NaN is -inf. */
static float clean(float x)
{
    return x == x ? x : -INFINITY;
}

/* Whether a (logit, token) ranks above b: larger logit, then lower token id. */
static int above(float xa, int ia, float xb, int ib)
{
    return xa > xb || (xa == xb && ia < ib);
}

int kvp_logprobs(const float *logits, int vocab, int chosen, int k, kvp_logprob *chosen_out,
                 kvp_logprob *top)
{
    if (vocab <= 0 || chosen < 0 || chosen >= vocab)
        return -1;
    if (k < 0)
        k = 0;
    if (k > KVP_LOGPROBS_MAX_TOP)
        k = KVP_LOGPROBS_MAX_TOP;
    if (k > vocab)
        k = vocab;

    /* The normalizer: max, then sum of exp(x - max) in double. */
    float mx = -INFINITY;
    int n_inf = 0;
    for (int i = 0; i < vocab; i++) {
        float x = clean(logits[i]);
        if (x > mx)
            mx = x;
        n_inf += x == INFINITY;
    }
    double lse;   /* log of the sum of exp(x): the log-probability is x - lse */
    if (n_inf) {
        lse = log((double)n_inf);   /* each +inf logit has probability 1/n_inf */
    } else if (mx == -INFINITY) {
        lse = log((double)vocab);   /* no finite logit: uniform */
    } else {
        double sum = 0.0;
        for (int i = 0; i < vocab; i++)
            sum += (double)expf(clean(logits[i]) - mx);
        lse = (double)mx + log(sum);
    }

    /* The k best in top[0..m), kept sorted (best first): a new entry walks down from
     * the end, so a row costs O(vocab) comparisons against the k-th plus O(k) per entry
     * that gets in. */
    int m = 0;
    float worst = -INFINITY;
    int worst_i = vocab;
    for (int i = 0; i < vocab && k > 0; i++) {
        float x = clean(logits[i]);
        if (m == k && !above(x, i, worst, worst_i))
            continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && above(x, i, clean(logits[top[j - 1].token]), top[j - 1].token)) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].token = i;
        worst_i = top[m - 1].token;
        worst = clean(logits[worst_i]);
    }

    /* The values from the kept logits (a non-uniform row: x - lse). */
    for (int j = 0; j < m; j++) {
        float x = clean(logits[top[j].token]);
        top[j].logprob = n_inf ? (x == INFINITY ? (float)-lse : -INFINITY)
                         : mx == -INFINITY ? (float)-lse : (float)((double)x - lse);
    }
    float x = clean(logits[chosen]);
    chosen_out->token = chosen;
    chosen_out->logprob = n_inf ? (x == INFINITY ? (float)-lse : -INFINITY)
                          : mx == -INFINITY ? (float)-lse : (float)((double)x - lse);
    return m;
}

double kvp_log_sum_exp(const float *x, int n)
{
    float mx = x[0];
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += exp((double)x[i] - mx);
    return mx + log(s);
}

double kvp_logits_kl(const float *p, const float *q, int vocab)
{
    double lp = kvp_log_sum_exp(p, vocab), lq = kvp_log_sum_exp(q, vocab), kl = 0.0;
    for (int i = 0; i < vocab; i++) {
        double a = p[i] - lp, b = q[i] - lq;
        kl += exp(a) * (a - b);
    }
    return kl;
}
