#include <criterion/criterion.h>
#include <math.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sampler_ref.h"
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

/* ---- the O(V) sampler against the sort-based one it replaced ------------------------ */

static double gauss(uint64_t *rng)
{
    double u = (kvp_rand_f32(rng) + 1e-7) , v = kvp_rand_f32(rng);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Logits of one of several shapes: Gaussian at a scale (0.3: nearly flat, like random
 * weights; 8: peaked), a few spikes over a flat floor, and ties. */
static void shape(float *l, int n, int kind, double scale, uint64_t *rng)
{
    for (int i = 0; i < n; i++)
        l[i] = (float)(scale * gauss(rng));
    if (kind == 1)
        for (int k = 0; k < 5; k++)
            l[(int)(kvp_rand_f32(rng) * (float)n)] += 12.0f;
}

static int sizes[] = {50, 3000, 151936};
static const float temps[] = {0.5f, 0.8f, 1.0f, 1.5f};
static const float top_ps[] = {0.5f, 0.9f, 0.95f, 1.0f};

/* The same distribution as the old sampler's for every shape, size, temperature and
 * top-p: the same tokens, probabilities within rounding (total variation < 1e-4; the
 * vector exp differs from expf by about an ulp). Per seed, when the nucleus is small
 * enough to be sorted (as the old one sorted it) or top-p is off, the same token for the
 * same seed: always on the portable path (bit-identical softmax), almost always on AVX2
 * up to 3000 tokens (rounding may move a token across the coin; at 151936 tokens the
 * old float running sum drifts by many tokens' worth, so only the distribution is
 * compared there). */
Test(sampler, same_distribution_as_the_sort_based_sampler, .timeout = 300)
{
    int scalar = !strcmp(kvp_sampler_simd(), "scalar");
    uint64_t rng = 12345;
    long draws = 0, agree = 0;
    for (size_t zi = 0; zi < sizeof sizes / sizeof *sizes; zi++) {
        int n = sizes[zi];
        float *base = malloc((size_t)n * sizeof *base), *a = malloc((size_t)n * sizeof *a),
              *b = malloc((size_t)n * sizeof *b), *np = malloc((size_t)n * sizeof *np);
        double *want = calloc((size_t)n, sizeof *want);
        int *ids = malloc((size_t)n * sizeof *ids);
        ref_cand *scratch = malloc((size_t)n * sizeof *scratch), *rd = malloc((size_t)n * sizeof *rd);
        cr_assert(base && a && b && np && want && ids && scratch && rd);
        const double scales[] = {0.3, 1.0, 3.0, 8.0};
        for (int kind = 0; kind < 2; kind++)
            for (size_t si = 0; si < 4; si++)
                for (size_t ti = 0; ti < 4; ti++)
                    for (size_t pi = 0; pi < 4; pi++) {
                        if (n > 10000 && (ti + pi + si) % 3)   /* a third of them: time */
                            continue;
                        shape(base, n, kind, scales[si], &rng);
                        float T = temps[ti], P = top_ps[pi];
                        kvp_sampler s;
                        cr_assert_eq(kvp_sampler_init(&s, n, T, P, 1), 0);
                        memcpy(a, base, (size_t)n * sizeof *a);
                        int rn = ref_sample(a, n, T, P, NULL, scratch, rd);
                        memcpy(b, base, (size_t)n * sizeof *b);
                        int m = kvp_sampler_dist(&s, b, ids, np);
                        for (int j = 0; j < rn; j++)
                            want[rd[j].i] = rd[j].p;
                        double tv = 0.0, least = 1.0;
                        int outside = 0;
                        for (int j = 0; j < rn; j++)
                            least = rd[j].p < least ? rd[j].p : least;
                        for (int j = 0; j < m; j++) {
                            /* a token the old left out while keeping a less likely one */
                            outside += want[ids[j]] == 0.0 && np[j] > least * 1.001;
                            tv += fabs((double)np[j] - want[ids[j]]);
                            want[ids[j]] = -want[ids[j]];   /* seen */
                        }
                        for (int j = 0; j < rn; j++) {
                            if (want[rd[j].i] > 0)
                                tv += want[rd[j].i];   /* the old kept it, the new not */
                            want[rd[j].i] = 0.0;
                        }
                        for (int j = 0; j < m; j++)
                            want[ids[j]] = 0.0;
                        /* Over 151936 tokens the old float running sums are off by
                         * about 1e-4 (the new path's 16 lanes are closer): the cut may
                         * move by a few tokens of equal probability, and the mass by
                         * that much. */
                        double tol = scalar || n <= 3000 ? 1e-4 : 5e-4;
                        cr_expect(tv / 2 < tol && !outside,
                                  "n %d kind %d scale %g T %g top_p %g: total variation %g, "
                                  "%d tokens the old never drew (old %d, new %d tokens)",
                                  n, kind, scales[si], (double)T, (double)P, tv / 2, outside, rn, m);
                        int sorted = (P >= 1.0f || rn <= 512) && (scalar || n <= 3000);
                        for (uint64_t seed = 1; sorted && seed <= 32; seed++) {
                            uint64_t r1 = seed;
                            memcpy(a, base, (size_t)n * sizeof *a);
                            int t_old = ref_sample(a, n, T, P, &r1, scratch, NULL);
                            kvp_sampler_seed(&s, seed);
                            memcpy(b, base, (size_t)n * sizeof *b);
                            int t_new = kvp_sample(&s, b);
                            draws++;
                            agree += t_old == t_new;
                            if (scalar)
                                cr_expect_eq(t_old, t_new, "n %d T %g top_p %g seed %d", n,
                                             (double)T, (double)P, (int)seed);
                        }
                        kvp_sampler_free(&s);
                    }
        free(base), free(a), free(b), free(np), free(want), free(ids), free(scratch), free(rd);
    }
    cr_expect(draws > 1000);
    cr_expect(agree >= draws - draws / 200, "%ld of %ld draws agree", agree, draws);
}

/* Chi-square of n_draws tokens drawn by s from logits against the exact distribution
 * want[] (double precision, computed here): bins with expected count >= 5, the rest
 * merged; a token with want 0 drawn counts as infinity. Returns chi2 / its threshold
 * (df + 6 sqrt(2 df): a correct sampler stays below 1 all but never). */
static double chi2_ratio(kvp_sampler *s, const float *logits, int n, const double *want, long n_draws)
{
    long *count = calloc((size_t)n, sizeof *count);
    float *l = malloc((size_t)n * sizeof *l);
    cr_assert(count && l);
    for (long d = 0; d < n_draws; d++) {
        memcpy(l, logits, (size_t)n * sizeof *l);
        count[kvp_sample(s, l)]++;
    }
    double chi2 = 0.0, rest_e = 0.0, rest_o = 0.0;
    int df = -1;
    for (int i = 0; i < n; i++) {
        double e = want[i] * (double)n_draws;
        if (want[i] == 0.0 && count[i]) {
            chi2 = INFINITY;
        } else if (e >= 5.0) {
            chi2 += (count[i] - e) * (count[i] - e) / e;
            df++;
        } else {
            rest_e += e;
            rest_o += (double)count[i];
        }
    }
    if (rest_e >= 5.0) {
        chi2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
        df++;
    }
    free(count);
    free(l);
    return chi2 / (df + 6.0 * sqrt(2.0 * df));
}

/* The exact distribution of temperature T, then min-p, top-k, top-p, in double. */
static void exact(const float *logits, int n, double T, int top_k, double min_p, double top_p,
                  double *want)
{
    ref_cand *c = malloc((size_t)n * sizeof *c);
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n; i++)
        sum += exp((logits[i] - mx) / T);
    int m = 0;
    for (int i = 0; i < n; i++) {
        double p = exp((logits[i] - mx) / T) / sum;
        want[i] = 0.0;
        if (p >= min_p / sum)
            c[m++] = (ref_cand){(float)p, i};
    }
    qsort(c, (size_t)m, sizeof *c, ref_by_prob_desc);
    if (top_k && top_k < m)
        m = top_k;
    double total = 0.0, cum = 0.0;
    for (int j = 0; j < m; j++)
        total += c[j].p;
    int keep = m;
    for (int j = 0; j < m; j++) {
        cum += c[j].p;
        if (cum > top_p * total) {
            keep = j + 1;
            break;
        }
    }
    cum = 0.0;
    for (int j = 0; j < keep; j++)
        cum += c[j].p;
    for (int j = 0; j < keep; j++)
        want[c[j].i] = c[j].p / cum;
    free(c);
}

/* The new sampler's draws follow the exact distribution, on a flat vocabulary (the
 * radix path: thousands of candidates) and a peaked one (the sorted path), with top-p,
 * top-k and min-p; and the same draws tested against a slightly different distribution
 * (top-p 0.85 for 0.9, top-k 40 for 50) fail: the test would catch a wrong sampler. */
Test(sampler, chi_square_against_the_exact_distribution, .timeout = 300)
{
    enum { N = 2000 };
    static float l[N];
    static double want[N], wrong[N];
    uint64_t rng = 99;
    struct { double scale; float T, top_p, min_p; int top_k; float wrong_top_p; int wrong_k; } cases[] = {
        {0.3, 0.8f, 0.9f, 0.0f, 0, 0.85f, 0},     /* flat: ~1700 candidates */
        {3.0, 0.8f, 0.9f, 0.0f, 0, 0.85f, 0},     /* peaked: tens */
        {0.3, 1.0f, 1.0f, 0.0f, 50, 1.0f, 40},    /* top-k */
        {0.3, 1.0f, 0.95f, 0.0f, 1000, 0.95f, 900},  /* top-k above the sort limit */
        {1.0, 1.0f, 1.0f, 0.05f, 0, 1.0f, 0},     /* min-p */
        {0.3, 0.7f, 0.9f, 0.4f, 0, 0.85f, 0},     /* min-p + top-p on the renormalized rest */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        for (int i = 0; i < N; i++)
            l[i] = (float)(cases[k].scale * gauss(&rng));
        kvp_sampler s;
        cr_assert_eq(kvp_sampler_init(&s, N, cases[k].T, cases[k].top_p, 5 + k), 0);
        kvp_sample_opts o = {.top_k = cases[k].top_k, .min_p = cases[k].min_p};
        cr_assert_eq(kvp_sampler_set_opts(&s, &o), 0);
        exact(l, N, cases[k].T, cases[k].top_k, cases[k].min_p, cases[k].top_p, want);
        double r = chi2_ratio(&s, l, N, want, 60000);
        cr_expect(r < 1.0, "case %zu: chi2 / threshold %g", k, r);
        if (cases[k].wrong_top_p != cases[k].top_p || cases[k].wrong_k != cases[k].top_k ||
            cases[k].min_p > 0) {
            exact(l, N, cases[k].T, cases[k].wrong_k, cases[k].min_p > 0 ? cases[k].min_p * 0.7 : 0,
                  cases[k].wrong_top_p, wrong);
            kvp_sampler_seed(&s, 5 + k);
            double w = chi2_ratio(&s, l, N, wrong, 60000);
            cr_expect(w > 1.0, "case %zu: a wrong distribution passes (%g)", k, w);
        }
        kvp_sampler_free(&s);
    }
}

Test(sampler, top_k_and_min_p_keep_only_their_tokens)
{
    enum { N = 10 };
    kvp_sampler s;
    kvp_sampler_init(&s, N, 1.0f, 1.0f, 3);
    kvp_sample_opts o = {.top_k = 3};
    cr_assert_eq(kvp_sampler_set_opts(&s, &o), 0);
    int seen[N] = {0};
    for (int i = 0; i < 5000; i++) {
        float l[N];
        fill(l, N);
        seen[kvp_sample(&s, l)]++;
    }
    for (int i = 0; i < N; i++)
        cr_expect(i >= 7 ? seen[i] > 0 : seen[i] == 0, "top_k 3: token %d seen %d times", i, seen[i]);
    /* min_p 0.5: p_i = (i+1)/55 >= 0.5 * 10/55 keeps tokens 4..9 */
    o = (kvp_sample_opts){.min_p = 0.5f};
    cr_assert_eq(kvp_sampler_set_opts(&s, &o), 0);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 5000; i++) {
        float l[N];
        fill(l, N);
        seen[kvp_sample(&s, l)]++;
    }
    for (int i = 0; i < N; i++)
        cr_expect(i >= 4 ? seen[i] > 0 : seen[i] == 0, "min_p 0.5: token %d seen %d times", i, seen[i]);
    kvp_sampler_free(&s);
}

/* Greedy over logits where token 0 leads by 1: penalties change the next choice once it
 * has been drawn; a new reply (set_opts / reset) forgets it. */
Test(sampler, penalties_follow_their_definitions)
{
    enum { N = 4 };
    const float base[N] = {3.0f, 2.0f, -1.0f, 1.5f};
    kvp_sampler s;
    kvp_sampler_init(&s, N, 0.0f, 1.0f, 1);
    float l[N];
    /* frequency 0.6: after two 0s, 3 - 1.2 = 1.8 < 2 */
    kvp_sample_opts o = {.frequency_penalty = 0.6f};
    cr_assert_eq(kvp_sampler_set_opts(&s, &o), 0);
    memcpy(l, base, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 0);
    memcpy(l, base, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 0);   /* 3 - 0.6 = 2.4 still leads */
    memcpy(l, base, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 1);
    cr_expect_float_eq(l[0], 1.8f, 1e-6);
    kvp_sampler_reset(&s);
    memcpy(l, base, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 0, "reset forgets the drawn tokens");
    /* presence 1.6 once: 3 - 1.6 = 1.4 < 2, then token 1 pays it too: 3's 1.5 leads */
    o = (kvp_sample_opts){.presence_penalty = 1.6f};
    cr_assert_eq(kvp_sampler_set_opts(&s, &o), 0);
    memcpy(l, base, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 0);
    memcpy(l, base, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 1);
    memcpy(l, base, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 3);
    /* repetition 2 (CTRL): positive logits divided, negative multiplied */
    o = (kvp_sample_opts){.repetition_penalty = 2.0f};
    cr_assert_eq(kvp_sampler_set_opts(&s, &o), 0);
    memcpy(l, base, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 0);
    memcpy(l, base, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 1);   /* 3 / 2 = 1.5 < 2 */
    cr_expect_float_eq(l[0], 1.5f, 1e-6);
    kvp_sampler_free(&s);
    float neg[N] = {-1.0f, -1.5f, -3.0f, -4.0f};
    kvp_sampler_init(&s, N, 0.0f, 1.0f, 1);
    kvp_sampler_set_opts(&s, &o);
    memcpy(l, neg, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 0);
    memcpy(l, neg, sizeof l);
    cr_expect_eq(kvp_sample(&s, l), 1);   /* -1 * 2 = -2 < -1.5 */
    cr_expect_float_eq(l[0], -2.0f, 1e-6);
    kvp_sampler_free(&s);
}

Test(sampler, logit_bias_bans_and_promotes)
{
    enum { N = 10 };
    kvp_sampler s;
    kvp_sampler_init(&s, N, 1.0f, 1.0f, 9);
    kvp_logit_bias b[] = {{9, -100.0f}, {0, 5.0f}};
    kvp_sample_opts o = {.bias = b, .n_bias = 1};
    cr_assert_eq(kvp_sampler_set_opts(&s, &o), 0);
    for (int i = 0; i < 3000; i++) {
        float l[N];
        fill(l, N);
        l[9] = 50.0f;   /* the most likely by far, banned */
        cr_expect_neq(kvp_sample(&s, l), 9);
    }
    o.n_bias = 2;   /* token 0's logit 0 + 5 leads log(9) + ... : p ~ e^5 / (e^5 + 45) = 0.77 */
    cr_assert_eq(kvp_sampler_set_opts(&s, &o), 0);
    int zero = 0;
    for (int i = 0; i < 3000; i++) {
        float l[N];
        fill(l, N);
        zero += kvp_sample(&s, l) == 0;
    }
    cr_expect(zero > 2100 && zero < 2500, "token 0 drawn %d times of 3000", zero);
    kvp_sampler_free(&s);
}

Test(sampler, refuses_bad_options_naming_them)
{
    kvp_sampler s;
    kvp_sampler_init(&s, 10, 1.0f, 1.0f, 1);
    const char *field;
    kvp_logit_bias out_of_vocab = {10, 1.0f}, too_big = {3, 101.0f};
    struct { kvp_sample_opts o; const char *field; } bad[] = {
        {{.top_k = -1}, "top_k"},
        {{.min_p = 1.5f}, "min_p"},
        {{.min_p = NAN}, "min_p"},
        {{.frequency_penalty = 2.5f}, "frequency_penalty"},
        {{.presence_penalty = -3.0f}, "presence_penalty"},
        {{.repetition_penalty = -1.0f}, "repetition_penalty"},
        {{.bias = &out_of_vocab, .n_bias = 1}, "logit_bias"},
        {{.bias = &too_big, .n_bias = 1}, "logit_bias"},
        {{.n_bias = KVP_SAMPLER_MAX_BIAS + 1, .bias = &too_big}, "logit_bias"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(kvp_sample_opts_check(&bad[i].o, 10, &field), -EINVAL);
        cr_expect_str_eq(field ? field : "", bad[i].field);
        cr_expect_eq(kvp_sampler_set_opts(&s, &bad[i].o), -EINVAL);
    }
    kvp_sample_opts ok = {.top_k = 5, .min_p = 0.1f, .frequency_penalty = -2.0f,
                          .presence_penalty = 2.0f, .repetition_penalty = 1.3f};
    cr_expect_eq(kvp_sample_opts_check(&ok, 10, &field), 0);
    kvp_sampler_free(&s);
}
