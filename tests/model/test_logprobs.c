#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/logprobs.h"

/* The reference: log-softmax in double with a full sort, ties in token order. */
typedef struct ref_ent { double lp; int i; } ref_ent;

static int ref_cmp(const void *a, const void *b)
{
    const ref_ent *x = a, *y = b;
    if (x->lp != y->lp)
        return x->lp < y->lp ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}

static ref_ent *reference(const float *l, int n)
{
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        if (l[i] > mx)
            mx = l[i];
    for (int i = 0; i < n; i++)
        sum += exp((double)l[i] - mx);
    ref_ent *r = malloc((size_t)n * sizeof *r);
    cr_assert(r);
    for (int i = 0; i < n; i++) {
        r[i].lp = (double)l[i] - mx - log(sum);
        r[i].i = i;
    }
    return r;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0));
}

static void check_against_reference(const float *l, int n, int chosen, int k)
{
    ref_ent *r = reference(l, n);
    kvp_logprob c, top[KVP_LOGPROBS_MAX_TOP];
    int m = kvp_logprobs(l, n, chosen, k, &c, top);
    int want = k < n ? k : n;
    cr_assert_eq(m, want, "k %d vocab %d: %d entries", k, n, m);
    cr_expect_eq(c.token, chosen);
    cr_expect(fabs((double)c.logprob - r[chosen].lp) < 1e-5, "chosen %g vs %g", c.logprob,
              r[chosen].lp);
    qsort(r, (size_t)n, sizeof *r, ref_cmp);
    for (int j = 0; j < m; j++) {
        cr_expect_eq(top[j].token, r[j].i, "rank %d: token %d, want %d", j, top[j].token, r[j].i);
        cr_expect(fabs((double)top[j].logprob - r[j].lp) < 1e-5, "rank %d: %g vs %g", j,
                  top[j].logprob, r[j].lp);
    }
    free(r);
}

Test(logprobs, matches_double_reference_random_rows)
{
    int sizes[] = {1, 2, 7, 20, 21, 100, 32000};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int n = sizes[s];
        float *l = malloc((size_t)n * sizeof *l);
        for (int i = 0; i < n; i++)
            l[i] = 20.0f * frand() - 10.0f;
        check_against_reference(l, n, n / 2, 20);
        check_against_reference(l, n, 0, 5);
        check_against_reference(l, n, n - 1, 1);
        free(l);
    }
}

Test(logprobs, peaked_and_large_logits_do_not_overflow)
{
    int n = 1000;
    float *l = malloc((size_t)n * sizeof *l);
    for (int i = 0; i < n; i++)
        l[i] = 500.0f + 0.01f * (float)(i % 37);
    l[123] = 900.0f;   /* one token with almost all the mass */
    check_against_reference(l, n, 123, 20);
    kvp_logprob c, top[20];
    kvp_logprobs(l, n, 123, 3, &c, top);
    cr_expect(c.logprob <= 0.0f && c.logprob > -1e-6f, "%g", c.logprob);
    cr_expect_eq(top[0].token, 123);
    free(l);
}

Test(logprobs, k_zero_gives_only_the_chosen)
{
    float l[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    kvp_logprob c, top[1] = {{-7, 1.0f}};
    cr_assert_eq(kvp_logprobs(l, 4, 2, 0, &c, top), 0);
    cr_expect_eq(top[0].token, -7, "top untouched");
    double want = 3.0 - log(exp(1.0) + exp(2.0) + exp(3.0) + exp(4.0));
    cr_expect(fabs(c.logprob - want) < 1e-6, "%g vs %g", c.logprob, want);
    /* negative k is 0 */
    cr_expect_eq(kvp_logprobs(l, 4, 2, -3, &c, top), 0);
}

Test(logprobs, vocab_smaller_than_k)
{
    float l[3] = {0.5f, -1.0f, 2.0f};
    kvp_logprob c, top[20];
    cr_assert_eq(kvp_logprobs(l, 3, 1, 20, &c, top), 3);
    cr_expect_eq(top[0].token, 2);
    cr_expect_eq(top[1].token, 0);
    cr_expect_eq(top[2].token, 1);
    double s = 0;
    for (int j = 0; j < 3; j++)
        s += exp(top[j].logprob);
    cr_expect(fabs(s - 1.0) < 1e-6, "the whole row sums to 1: %g", s);
    check_against_reference(l, 3, 1, 20);
}

Test(logprobs, k_above_twenty_is_clamped)
{
    int n = 50;
    float l[50];
    for (int i = 0; i < n; i++)
        l[i] = (float)i;
    kvp_logprob c, top[KVP_LOGPROBS_MAX_TOP];
    cr_assert_eq(kvp_logprobs(l, n, 0, 99, &c, top), KVP_LOGPROBS_MAX_TOP);
    for (int j = 0; j < KVP_LOGPROBS_MAX_TOP; j++)
        cr_expect_eq(top[j].token, n - 1 - j);
}

Test(logprobs, ties_in_token_order)
{
    float l[8] = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, 2.0f, 3.0f, 2.0f};
    kvp_logprob c, top[20];
    cr_assert_eq(kvp_logprobs(l, 8, 4, 6, &c, top), 6);
    int want[6] = {1, 2, 4, 6, 5, 7};
    for (int j = 0; j < 6; j++)
        cr_expect_eq(top[j].token, want[j], "rank %d: %d", j, top[j].token);
    cr_expect_eq(top[0].logprob, top[3].logprob);
    cr_expect_eq(c.logprob, top[2].logprob);
    /* all equal: uniform, the first k tokens */
    float u[30];
    for (int i = 0; i < 30; i++)
        u[i] = -2.5f;
    cr_assert_eq(kvp_logprobs(u, 30, 29, 20, &c, top), 20);
    for (int j = 0; j < 20; j++) {
        cr_expect_eq(top[j].token, j);
        cr_expect(fabs(top[j].logprob + log(30.0)) < 1e-6);
    }
    check_against_reference(l, 8, 3, 20);
}

Test(logprobs, nan_and_infinite_logits)
{
    float l[5] = {NAN, 1.0f, -INFINITY, 2.0f, NAN};
    kvp_logprob c, top[20];
    cr_assert_eq(kvp_logprobs(l, 5, 0, 20, &c, top), 5);
    cr_expect(isinf(c.logprob) && c.logprob < 0, "NaN is no mass: %g", c.logprob);
    cr_expect_eq(top[0].token, 3);
    cr_expect_eq(top[1].token, 1);
    double want = 2.0 - log(exp(1.0) + exp(2.0));
    cr_expect(fabs(top[0].logprob - want) < 1e-6);
    float inf[4] = {INFINITY, 0.0f, INFINITY, 5.0f};
    cr_assert_eq(kvp_logprobs(inf, 4, 2, 2, &c, top), 2);
    cr_expect(fabs(c.logprob + log(2.0)) < 1e-6, "+inf logits share the mass: %g", c.logprob);
    cr_expect_eq(top[0].token, 0);
    cr_expect_eq(top[1].token, 2);
    float none[3] = {-INFINITY, NAN, -INFINITY};
    cr_assert_eq(kvp_logprobs(none, 3, 1, 1, &c, top), 1);
    cr_expect(fabs(c.logprob + log(3.0)) < 1e-6, "no finite logit: uniform");
}

Test(logprobs, bad_arguments)
{
    float l[2] = {0.0f, 1.0f};
    kvp_logprob c, top[2];
    cr_expect_eq(kvp_logprobs(l, 0, 0, 1, &c, top), -1);
    cr_expect_eq(kvp_logprobs(l, 2, 2, 1, &c, top), -1);
    cr_expect_eq(kvp_logprobs(l, 2, -1, 1, &c, top), -1);
}

/* kvp_logits_kl: KL(softmax(p) || softmax(q)) in nats, 0 exactly for equal rows, the
 * same when a constant is added to a row, and the definition's value otherwise. */
Test(logprobs, logits_kl_is_the_kl_of_the_two_softmaxes)
{
    float p[5] = {1.0f, -2.0f, 0.5f, 3.0f, 0.0f}, q[5] = {0.0f, 1.0f, -1.0f, 2.0f, 0.25f};
    float q2[5];
    cr_assert_eq(kvp_logits_kl(p, p, 5), 0.0);
    double zp = 0.0, zq = 0.0, want = 0.0;
    for (int i = 0; i < 5; i++) {
        zp += exp((double)p[i]);
        zq += exp((double)q[i]);
        q2[i] = q[i] + 7.5f;
    }
    for (int i = 0; i < 5; i++) {
        double a = exp((double)p[i]) / zp, b = exp((double)q[i]) / zq;
        want += a * log(a / b);
    }
    cr_assert_float_eq(kvp_logits_kl(p, q, 5), want, 1e-9);
    cr_assert_float_eq(kvp_logits_kl(p, q2, 5), want, 1e-6);
    cr_assert_gt(kvp_logits_kl(q, p, 5), 0.0);
}
