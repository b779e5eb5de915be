#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "model/sampler.h"

static void fill(float *l, int n)
{
    for (int i = 0; i < n; i++)
        l[i] = logf((float)(i + 1));  /* p_i proportional to i + 1 */
}

Test(sampler, greedy_is_argmax)
{
    kvp_sampler s;
    cr_assert_eq(kvp_sampler_init(&s, 5, 0.0f, 0.9f, 1), 0);
    float l[5] = {0.1f, 3.0f, -2.0f, 2.9f, 0.0f};
    cr_expect_eq(kvp_sample(&s, l), 1);
    kvp_sampler_free(&s);
}

Test(sampler, seed_reproduces)
{
    kvp_sampler a, b, c;
    kvp_sampler_init(&a, 10, 1.0f, 1.0f, 42);
    kvp_sampler_init(&b, 10, 1.0f, 1.0f, 42);
    kvp_sampler_init(&c, 10, 1.0f, 1.0f, 43);
    int same = 1, differs = 0;
    for (int i = 0; i < 200; i++) {
        float l1[10], l2[10], l3[10];
        fill(l1, 10), fill(l2, 10), fill(l3, 10);
        int x = kvp_sample(&a, l1), y = kvp_sample(&b, l2), z = kvp_sample(&c, l3);
        same &= x == y;
        differs |= x != z;
    }
    cr_expect(same);
    cr_expect(differs);
    kvp_sampler_free(&a);
    kvp_sampler_free(&b);
    kvp_sampler_free(&c);
}

Test(sampler, temperature_follows_softmax)
{
    enum { N = 4, DRAWS = 40000 };
    kvp_sampler s;
    kvp_sampler_init(&s, N, 1.0f, 1.0f, 7);
    int count[N] = {0};
    for (int i = 0; i < DRAWS; i++) {
        float l[N];
        fill(l, N);
        count[kvp_sample(&s, l)]++;
    }
    for (int i = 0; i < N; i++) {
        double p = (i + 1) / 10.0, f = (double)count[i] / DRAWS;
        cr_expect(fabs(f - p) < 0.01, "token %d: frequency %f, probability %f", i, f, p);
    }
    kvp_sampler_free(&s);
}

Test(sampler, top_p_never_leaves_the_nucleus)
{
    enum { N = 10 };
    kvp_sampler s;
    /* p = (i+1)/55: the top three (10+9+8)/55 = 0.49 < 0.5 <= top four 0.62 */
    kvp_sampler_init(&s, N, 1.0f, 0.5f, 3);
    int seen[N] = {0};
    for (int i = 0; i < 5000; i++) {
        float l[N];
        fill(l, N);
        seen[kvp_sample(&s, l)]++;
    }
    for (int i = 0; i < 6; i++)
        cr_expect_eq(seen[i], 0, "token %d outside the nucleus was sampled", i);
    for (int i = 6; i < N; i++)
        cr_expect_gt(seen[i], 0, "token %d in the nucleus never sampled", i);
    kvp_sampler_free(&s);
}

Test(sampler, rejects_bad_parameters)
{
    kvp_sampler s;
    cr_expect_lt(kvp_sampler_init(&s, 0, 1.0f, 0.9f, 1), 0);
    cr_expect_lt(kvp_sampler_init(&s, 10, -1.0f, 0.9f, 1), 0);
    cr_expect_lt(kvp_sampler_init(&s, 10, NAN, 0.9f, 1), 0);
    cr_expect_lt(kvp_sampler_init(&s, 10, 1.0f, 0.0f, 1), 0);
    cr_expect_lt(kvp_sampler_init(&s, 10, 1.0f, 1.5f, 1), 0);
}
