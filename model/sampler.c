#include "model/sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64*, the generator of llama2.c's run.c */
static uint32_t rand_u32(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545F4914F6CDD1Dull) >> 32);
}

float kvp_rand_f32(uint64_t *state) { return (float)(rand_u32(state) >> 8) / 16777216.0f; }

void kvp_sampler_seed(kvp_sampler *s, uint64_t seed)
{
    s->rng = seed ? seed : 0x9E3779B97F4A7C15ull;  /* xorshift must not start at 0 */
}

int kvp_sampler_init(kvp_sampler *s, int vocab_size, float temperature, float top_p, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    if (vocab_size <= 0 || !(temperature >= 0.0f && isfinite(temperature)) || !(top_p > 0.0f && top_p <= 1.0f))
        return -EINVAL;
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->top_p = top_p;
    kvp_sampler_seed(s, seed);
    s->scratch = malloc((size_t)vocab_size * sizeof *s->scratch);
    return s->scratch ? 0 : -ENOMEM;
}

void kvp_sampler_free(kvp_sampler *s)
{
    free(s->scratch);
    memset(s, 0, sizeof *s);
}

/* The largest logit's index; NaN never wins (all NaN: 0). */
static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i]))
            best = i;
    return best;
}

/* p_i = exp((x_i - max) / T) / sum, with x[best] the max: it is subtracted before the
 * division, so a small T sends the others to 0 instead of overflowing. NaN logits get
 * p = 0, a +inf max shares the mass with the other +inf logits, and x[best] counts
 * exp(0) = 1 so the sum is never 0. */
static void softmax(float *x, int n, int best, float temperature)
{
    float mx = x[best], sum = 0.0f;
    for (int i = 0; i < n; i++) {
        float d = i == best ? 0.0f
                  : isinf(mx) ? (x[i] == mx ? 0.0f : -INFINITY)
                              : x[i] - mx;
        x[i] = d == d ? expf(d / temperature) : 0.0f;
        sum += x[i];
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

static int by_prob_desc(const void *a, const void *b)
{
    float pa = ((const float *)a)[0], pb = ((const float *)b)[0];
    return (pa < pb) - (pa > pb);
}

int kvp_sample(kvp_sampler *s, float *logits)
{
    int n = s->vocab_size;
    if (s->temperature < KVP_SAMPLER_GREEDY_BELOW)
        return argmax(logits, n);
    int best = argmax(logits, n);
    softmax(logits, n, best, s->temperature);
    float coin = kvp_rand_f32(&s->rng);
    if (s->top_p >= 1.0f) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += logits[i];
            if (coin < cdf)
                return i;
        }
        return best;   /* rounding left the cdf short of the coin */
    }
    /* top-p: candidates with p >= (1 - top_p)/(n - 1) cannot all be cut, the rest can;
     * the most likely token is always a candidate, so there is at least one. */
    float cutoff = (1.0f - s->top_p) / (float)(n - 1 > 0 ? n - 1 : 1);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (i == best || logits[i] >= cutoff) {
            s->scratch[m].p = logits[i];
            s->scratch[m].i = i;
            m++;
        }
    qsort(s->scratch, (size_t)m, sizeof *s->scratch, by_prob_desc);
    float cum = 0.0f;
    int last = m - 1;
    for (int i = 0; i < m; i++) {
        cum += s->scratch[i].p;
        if (cum > s->top_p) {
            last = i;
            break;
        }
    }
    float r = coin * cum, cdf = 0.0f;
    for (int i = 0; i <= last; i++) {
        cdf += s->scratch[i].p;
        if (r < cdf)
            return s->scratch[i].i;
    }
    return s->scratch[0].i;
}
