/* The sampler kvpd had before its bounded selection, kept as the reference the tests
 * (tests/model/test_sampler.c) compare the new one with and bench_sampler times it
 * against: softmax over the whole vocabulary, then every candidate above
 * (1 - top_p)/(n - 1) sorted with qsort. */
#ifndef KVP_BENCH_SAMPLER_REF_H
#define KVP_BENCH_SAMPLER_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/sampler.h"

typedef struct { float p; int i; } ref_cand;

static inline int ref_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i]))
            best = i;
    return best;
}

static inline void ref_softmax(float *x, int n, int best, float temperature)
{
    float mx = x[best], sum = 0.0f;
    for (int i = 0; i < n; i++) {
        float d = i == best ? 0.0f : isinf(mx) ? (x[i] == mx ? 0.0f : -INFINITY) : x[i] - mx;
        x[i] = d == d ? expf(d / temperature) : 0.0f;
        sum += x[i];
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

static inline int ref_by_prob_desc(const void *a, const void *b)
{
    float pa = ((const float *)a)[0], pb = ((const float *)b)[0];
    return (pa < pb) - (pa > pb);
}

/* The old kvp_sample, or (dist != NULL) the distribution it draws from: the sorted
 * nucleus's tokens and probabilities, returning its size. */
static inline int ref_sample(float *logits, int n, float temperature, float top_p, uint64_t *rng,
                      ref_cand *scratch, ref_cand *dist)
{
    if (temperature < KVP_SAMPLER_GREEDY_BELOW)
        return ref_argmax(logits, n);
    int best = ref_argmax(logits, n);
    ref_softmax(logits, n, best, temperature);
    float coin = dist ? 0.0f : kvp_rand_f32(rng);
    if (top_p >= 1.0f) {
        if (dist) {
            for (int i = 0; i < n; i++)
                dist[i] = (ref_cand){logits[i], i};
            return n;
        }
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += logits[i];
            if (coin < cdf)
                return i;
        }
        return best;
    }
    float cutoff = (1.0f - top_p) / (float)(n - 1 > 0 ? n - 1 : 1);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (i == best || logits[i] >= cutoff)
            scratch[m++] = (ref_cand){logits[i], i};
    qsort(scratch, (size_t)m, sizeof *scratch, ref_by_prob_desc);
    float cum = 0.0f;
    int last = m - 1;
    for (int i = 0; i < m; i++) {
        cum += scratch[i].p;
        if (cum > top_p) {
            last = i;
            break;
        }
    }
    if (dist) {
        for (int i = 0; i <= last; i++)
            dist[i] = (ref_cand){scratch[i].p / cum, scratch[i].i};
        return last + 1;
    }
    float r = coin * cum, cdf = 0.0f;
    for (int i = 0; i <= last; i++) {
        cdf += scratch[i].p;
        if (r < cdf)
            return scratch[i].i;
    }
    return scratch[0].i;
}

#endif
