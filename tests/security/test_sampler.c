/* The sampler never indexes outside its candidates, whatever the logits
 * and however small the temperature (at 1e-40 unguarded logits become +-inf, softmax
 * NaN, top-p is left with no candidate and reads scratch[-1]). */
#include <criterion/criterion.h>
#include <math.h>

#include "model/sampler.h"

#define N 8

static int sample(float temperature, float top_p, const float *in, uint64_t seed)
{
    kvp_sampler s;
    cr_assert_eq(kvp_sampler_init(&s, N, temperature, top_p, seed), 0);
    float l[N];
    for (int i = 0; i < N; i++)
        l[i] = in[i];
    int t = kvp_sample(&s, l);
    kvp_sampler_free(&s);
    cr_assert(t >= 0 && t < N, "token %d outside [0, %d)", t, N);
    return t;
}

static const float peaked[N] = {0.5f, 1.0f, 3.0f, 2.99f, -1.0f, 0.0f, 2.0f, 1.5f};

Test(security_sampler, tiny_temperature_is_greedy)
{
    const float temps[] = {1e-40f, 1e-30f, 1e-10f, 1e-6f};
    const float top_ps[] = {0.9f, 0.5f, 0.01f, 1.0f};
    for (size_t t = 0; t < sizeof temps / sizeof *temps; t++)
        for (size_t p = 0; p < sizeof top_ps / sizeof *top_ps; p++)
            for (uint64_t seed = 1; seed <= 20; seed++)
                cr_expect_eq(sample(temps[t], top_ps[p], peaked, seed), 2,
                             "temperature %g top_p %g seed %llu", (double)temps[t],
                             (double)top_ps[p], (unsigned long long)seed);
}

Test(security_sampler, nan_logits_are_never_chosen)
{
    float l[N];
    for (int i = 0; i < N; i++)
        l[i] = NAN;
    l[5] = 1.0f;
    l[6] = 0.5f;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        int t = sample(1.0f, 0.9f, l, seed);
        cr_expect(t == 5 || t == 6, "seed %llu chose %d", (unsigned long long)seed, t);
        t = sample(0.0f, 1.0f, l, seed);
        cr_expect_eq(t, 5);
    }
    for (int i = 0; i < N; i++)   /* nothing but NaN: still a token in range */
        l[i] = NAN;
    for (uint64_t seed = 1; seed <= 10; seed++) {
        sample(1.0f, 0.9f, l, seed);
        sample(0.7f, 1.0f, l, seed);
    }
}

Test(security_sampler, infinite_logits)
{
    float l[N] = {0, 1, 2, 3, 4, 5, 6, 7};
    l[3] = INFINITY;
    l[6] = INFINITY;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        int t = sample(1.0f, 0.9f, l, seed);
        cr_expect(t == 3 || t == 6, "seed %llu chose %d", (unsigned long long)seed, t);
        t = sample(1.0f, 1.0f, l, seed);
        cr_expect(t == 3 || t == 6, "seed %llu chose %d", (unsigned long long)seed, t);
    }
    for (int i = 0; i < N; i++)
        l[i] = -INFINITY;
    for (uint64_t seed = 1; seed <= 10; seed++) {
        sample(1.0f, 0.9f, l, seed);
        sample(1.0f, 1.0f, l, seed);
    }
}

/* Equal logits and a small top_p: the cutoff (1 - top_p)/(n - 1) is above every
 * probability, which left no candidate at all (ASan: heap read of scratch[-1]). */
Test(security_sampler, equal_logits_small_top_p)
{
    float l[N] = {0};
    for (uint64_t seed = 1; seed <= 200; seed++) {
        sample(1.0f, 0.01f, l, seed);
        sample(1.0f, 0.5f, l, seed);
    }
}

Test(security_sampler, refuses_non_finite_temperature)
{
    kvp_sampler s;
    cr_expect_lt(kvp_sampler_init(&s, N, INFINITY, 0.9f, 1), 0);
    cr_expect_lt(kvp_sampler_init(&s, N, NAN, 0.9f, 1), 0);
    cr_expect_lt(kvp_sampler_init(&s, N, -1e-40f, 0.9f, 1), 0);
}
