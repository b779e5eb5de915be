/* train.c: Plackett-Luce log-likelihood and its gradient, Gumbel-sort sampling, the
 * ranking cost, RLOO, AdamW, the schedule, importance at many cuts, the agent gradient
 * through the training loss, and whole training runs on a small synthetic trace
 * (tests/offline/traceutil.c: determinism, learning) and through `kvp train`. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/sampler.h"
#include "base/half.h"
#include "offline/calibrate.h"
#include "offline/train.h"
#include "cache/rope.h"
#include "offline/agent_train.h"
#include "tests/model/testutil.h"
#include "tests/offline/traceutil.h"

static uint64_t rng_state = 99;

static float frand(void)   /* uniform [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) / 8388608.0f - 1.0f;
}

/* log pi(sigma) straight from the definition, O(n^2), in double. */
static double pl_naive(const float *s, const int32_t *sigma, int n)
{
    double lp = 0.0;
    for (int r = 0; r < n; r++) {
        double mx = -INFINITY, sum = 0.0;
        for (int j = r; j < n; j++)
            mx = fmax(mx, s[sigma[j]]);
        for (int j = r; j < n; j++)
            sum += exp(s[sigma[j]] - mx);
        lp += s[sigma[r]] - (mx + log(sum));
    }
    return lp;
}

static void shuffle(int32_t *p, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)((frand() + 1.0f) * 0.5f * (float)(i + 1));
        j = j > i ? i : j;
        int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* d f / d s[i] by the five-point central difference; s is restored. The step is a
 * power of two, so s + h is exact in float. */
static double slope(double (*f)(const float *s, const void *ctx, int n), const void *ctx,
                    float *s, int n, int i)
{
    const float h = 1.0f / 64, steps[4] = {-2 * h, -h, h, 2 * h};
    float s0 = s[i];
    double v[4];
    for (int j = 0; j < 4; j++) {
        s[i] = s0 + steps[j];
        v[j] = f(s, ctx, n);
    }
    s[i] = s0;
    return (v[0] - 8 * v[1] + 8 * v[2] - v[3]) / (12.0 * h);
}

static double pl_of(const float *s, const void *sigma, int n)
{
    return pl_naive(s, sigma, n);
}

Test(train, pl_logprob_and_gradient_match_definition_and_finite_differences)
{
    enum { N = 9 };
    float s[N], grad[N];
    int32_t sigma[N];
    double work[N];
    for (int trial = 0; trial < 20; trial++) {
        /* wide score ranges too: the O(n) recursions must stay finite */
        float spread = trial < 10 ? 2.0f : 40.0f;
        for (int i = 0; i < N; i++)
            s[i] = spread * frand();
        shuffle(sigma, N);
        double lp = kvp_pl_logprob(s, sigma, N, grad, work);
        cr_assert_float_eq(lp, pl_naive(s, sigma, N), 1e-9 * (1.0 + fabs(lp)));
        cr_assert_float_eq(kvp_pl_logprob(s, sigma, N, NULL, work), lp, 0.0);
        double gsum = 0.0;
        for (int i = 0; i < N; i++) {
            double num = slope(pl_of, sigma, s, N, i);
            cr_assert_float_eq(grad[i], num, 1e-4 + 1e-4 * fabs(num),
                               "trial %d item %d: analytic %.7g, finite differences %.7g",
                               trial, i, grad[i], num);
            gsum += grad[i];
        }
        /* each choice is a softmax: the gradient sums to zero */
        cr_assert_float_eq(gsum, 0.0, 1e-4);
    }
}

/* -sum p_i log softmax(s)_i with p the importance shares, summed naively in double */
static double listwise_naive(const float *s, const float *imp, int n)
{
    double z = 0.0, total = 0.0, loss = 0.0;
    for (int i = 0; i < n; i++) {
        z += exp((double)s[i]);
        total += imp[i];
    }
    for (int i = 0; i < n; i++)
        loss -= imp[i] / total * ((double)s[i] - log(z));
    return loss;
}

static double listwise_of(const float *s, const void *imp, int n)
{
    return listwise_naive(s, imp, n);
}

/* The listwise term: its value is the cross-entropy of the importance shares against the
 * scores' softmax, its gradient (added, times the weight) matches finite differences and
 * sums to zero, a shift of every score changes nothing, and an episode without
 * importance adds nothing. */
Test(train, listwise_loss_and_gradient_match_definition_and_finite_differences)
{
    enum { N = 9 };
    float s[N], imp[N], grad[N];
    for (int trial = 0; trial < 20; trial++) {
        float spread = trial < 10 ? 2.0f : 20.0f;
        for (int i = 0; i < N; i++) {
            s[i] = spread * frand();
            imp[i] = trial % 3 == 0 && i % 2 ? 0.0f : 3.0f * fabsf(frand());
            grad[i] = 0.5f;   /* the term adds to what is there */
        }
        const float w = 2.5f;
        double loss = kvp_listwise_loss(s, imp, N, w, grad);
        cr_assert_float_eq(loss, listwise_naive(s, imp, N), 1e-9 * (1.0 + fabs(loss)));
        double gsum = 0.0;
        for (int i = 0; i < N; i++) {
            double num = w * slope(listwise_of, imp, s, N, i);
            cr_assert_float_eq(grad[i] - 0.5f, num, 1e-4 + 1e-4 * fabs(num),
                               "trial %d item %d: analytic %.7g, finite differences %.7g",
                               trial, i, grad[i] - 0.5f, num);
            gsum += grad[i] - 0.5f;
        }
        cr_assert_float_eq(gsum, 0.0, 1e-4);
        float shifted[N];
        for (int i = 0; i < N; i++)
            shifted[i] = s[i] + 7.0f;
        cr_assert_float_eq(kvp_listwise_loss(shifted, imp, N, w, NULL), loss, 1e-5 * (1.0 + fabs(loss)));
    }
    float zero[N] = {0};
    for (int i = 0; i < N; i++)
        grad[i] = 1.0f;
    cr_assert_eq(kvp_listwise_loss(s, zero, N, 1.0f, grad), 0.0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(grad[i], 1.0f, "an episode without importance moved score %d", i);
}

Test(train, gumbel_sort_samples_plackett_luce)
{
    const float s[3] = {1.0f, 0.0f, -0.5f};
    static const int32_t perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                        {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    long counts[6] = {0};
    const long trials = 200000;
    uint64_t rng = 12345;
    int32_t sigma[3];
    kvp_rank_key work[3];
    for (long t = 0; t < trials; t++) {
        kvp_gumbel_rank(s, 3, &rng, sigma, work);
        for (int p = 0; p < 6; p++)
            if (!memcmp(sigma, perms[p], sizeof sigma))
                counts[p]++;
    }
    double total = exp(1.0) + exp(0.0) + exp(-0.5), wk[3];
    for (int i = 0; i < 3; i++)
        wk[i] = exp((double)s[i]);
    for (int p = 0; p < 6; p++) {
        int a = perms[p][0], b = perms[p][1], c = perms[p][2];
        double prob = wk[a] / total * wk[b] / (wk[b] + wk[c]);
        double freq = (double)counts[p] / trials, sd = sqrt(prob * (1 - prob) / trials);
        cr_assert_float_eq(freq, prob, 5 * sd, "permutation %d: frequency %.4f, PL %.4f", p,
                           freq, prob);
        double lp = kvp_pl_logprob(s, perms[p], 3, NULL, (double[3]){0});
        cr_assert_float_eq(exp(lp), prob, 1e-6);
    }
}

Test(train, argsort_is_descending_with_older_rows_first_on_ties)
{
    const float key[6] = {0.5f, 2.0f, 0.5f, -1.0f, 2.0f, 0.0f};
    const int32_t want[6] = {1, 4, 0, 2, 5, 3};
    int32_t order[6];
    kvp_rank_key work[6];
    kvp_argsort_desc(key, 6, order, work);
    cr_assert_arr_eq(order, want, sizeof want);
}

static int next_perm(int32_t *p, int n)   /* lexicographic; 0 after the last */
{
    int i = n - 2;
    while (i >= 0 && p[i] >= p[i + 1])
        i--;
    if (i < 0)
        return 0;
    int j = n - 1;
    while (p[j] <= p[i])
        j--;
    int32_t t = p[i];
    p[i] = p[j];
    p[j] = t;
    for (int a = i + 1, b = n - 1; a < b; a++, b--) {
        t = p[a];
        p[a] = p[b];
        p[b] = t;
    }
    return 1;
}

Test(train, oracle_cost_is_the_minimum_and_earns_reward_minus_one)
{
    enum { N = 6 };
    float imp[N] = {0.3f, 2.5f, 0.0f, 1.25f, 0.7f, 0.05f};
    int32_t order[N], p[N];
    kvp_rank_key work[N];
    double best = kvp_oracle_cost(imp, N, order, work);
    /* by hand: 2.5*1 + 1.25*2 + 0.7*3 + 0.3*4 + 0.05*5 + 0*6 */
    cr_assert_float_eq(best, 2.5 + 2.5 + 2.1 + 1.2 + 0.25, 1e-6);
    cr_assert_float_eq(kvp_rank_reward(best, best), -1.0, 0.0);
    int worse = 0;
    for (int i = 0; i < N; i++)
        p[i] = i;
    do {
        double c = kvp_rank_cost(imp, p, N);
        cr_assert_geq(c, best - 1e-9);
        cr_assert_leq(kvp_rank_reward(c, best), -1.0 + 1e-12);
        worse += c > best;
    } while (next_perm(p, N));
    cr_assert_eq(worse, 719);   /* the importances are distinct: one optimum */
    /* C* = 0 (nothing matters later) is guarded */
    cr_assert_float_eq(kvp_rank_reward(0.0, 0.0), 0.0, 0.0);
}

Test(train, rloo_advantages_by_hand)
{
    /* two episodes of three samples */
    const double r[6] = {-1.0, -2.0, -3.0, -5.0, -5.0, -5.0};
    float adv[6];
    kvp_rloo_advantages(r, 2, 3, 2.0f, adv);
    /* leave-one-out: -1 - (-2.5) = 1.5, 0, -1.5, then 0, 0, 0; mean 0,
     * sd = sqrt((1.5^2 * 2) / 6) = sqrt(0.75) */
    double sd = sqrt(0.75);
    const double want[6] = {1.5 / sd, 0.0, -1.5 / sd, 0.0, 0.0, 0.0};
    for (int i = 0; i < 6; i++)
        cr_assert_float_eq(adv[i], fmin(2.0, fmax(-2.0, want[i])), 1e-6, "%d: %g", i, adv[i]);
    /* 1.5 / sd = 1.73 is below the clamp; a tighter clamp cuts it */
    kvp_rloo_advantages(r, 2, 3, 1.0f, adv);
    cr_assert_float_eq(adv[0], 1.0, 0.0);
    cr_assert_float_eq(adv[2], -1.0, 0.0);
    /* equal rewards: no signal, no NaN */
    const double flat[4] = {-2.0, -2.0, -2.0, -2.0};
    kvp_rloo_advantages(flat, 1, 4, 2.0f, adv);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(adv[i], 0.0f);
}

Test(train, adamw_on_a_quadratic_matches_a_hand_computation)
{
    /* f(w) = 0.5 * sum a_i w_i^2, g = a * w; two steps with decoupled weight decay */
    enum { N = 3 };
    const double a[N] = {1.0, 4.0, 0.25};
    float w[N] = {1.0f, -0.5f, 2.0f}, m[N] = {0}, v[N] = {0}, g[N];
    double wr[N] = {1.0, -0.5, 2.0}, mr[N] = {0}, vr[N] = {0};
    const kvp_adamw o = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
    const float lr = 0.01f;
    for (long t = 1; t <= 3; t++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)(a[i] * w[i]);
        kvp_adamw_step(&o, lr, t, w, g, m, v, N);
        for (int i = 0; i < N; i++) {
            double gi = a[i] * wr[i], w0 = wr[i];
            mr[i] = 0.9 * mr[i] + 0.1 * gi;
            vr[i] = 0.999 * vr[i] + 0.001 * gi * gi;
            double mh = mr[i] / (1 - pow(0.9, (double)t)), vh = vr[i] / (1 - pow(0.999, (double)t));
            wr[i] -= lr * (mh / (sqrt(vh) + 1e-8) + 0.1 * wr[i]);
            /* the first step moves every weight by lr * (sign(g) + wd * w) */
            if (t == 1)
                cr_assert_float_eq(wr[i], w0 - lr * ((gi > 0 ? 1 : -1) + 0.1 * w0), 1e-7);
        }
        for (int i = 0; i < N; i++)
            cr_assert_float_eq(w[i], wr[i], 1e-6, "step %ld, %d: %.8f vs %.8f", t, i, w[i], wr[i]);
    }
}

Test(train, clip_and_ema)
{
    float g[2] = {3.0f, 4.0f};
    cr_assert_float_eq(kvp_clip_grad_norm(g, 2, 10.0f), 5.0f, 1e-6);
    cr_assert(g[0] == 3.0f && g[1] == 4.0f);
    cr_assert_float_eq(kvp_clip_grad_norm(g, 2, 1.0f), 5.0f, 1e-6);
    cr_assert_float_eq(g[0], 0.6f, 1e-6);
    cr_assert_float_eq(g[1], 0.8f, 1e-6);
    float e[2] = {1.0f, 0.0f};
    const float w[2] = {0.0f, 2.0f};
    kvp_ema_update(e, w, 2, 0.75f);
    cr_assert_float_eq(e[0], 0.75f, 1e-7);
    cr_assert_float_eq(e[1], 0.5f, 1e-7);
}

Test(train, schedule_warms_up_then_decays_to_the_floor)
{
    kvp_train_cfg c;
    kvp_train_defaults(&c);
    c.steps = 1000;
    c.warmup = 100;
    c.lr = 1e-3f;
    c.lr_min = 1e-6f;
    c.warmup_start = 0.01f;
    cr_assert_float_eq(kvp_train_lr(&c, 0), 1e-5f, 1e-12);
    cr_assert_float_eq(kvp_train_lr(&c, 50), 1e-3f * (0.01f + 0.99f * 0.5f), 1e-9);
    cr_assert_float_eq(kvp_train_lr(&c, 100), 1e-3f, 1e-9);
    cr_assert_float_eq(kvp_train_lr(&c, 999), 1e-6f, 1e-12);
    float mid = kvp_train_lr(&c, 100 + 899 / 2);
    cr_assert_float_eq(mid, 1e-6f + (1e-3f - 1e-6f) * 0.5f * (1.0f + cosf((float)M_PI * 449.0f / 899.0f)), 1e-8);
    for (long t = 101; t < 1000; t++)
        cr_assert_leq(kvp_train_lr(&c, t), kvp_train_lr(&c, t - 1));
}

static kvp_train_cfg tiny_cfg(long steps, int threads)
{
    kvp_train_cfg c;
    kvp_train_defaults(&c);
    c.steps = steps;
    c.threads = threads;
    c.episodes = 4;
    c.samples = 4;
    c.lr = 1e-2f;
    c.warmup = 5;
    c.val_cut = 72;
    c.eval_every = 10;
    c.ema = 0.9f;
    return c;
}

Test(train, importance_at_many_cuts_matches_one_cut_at_a_time)
{
    enum { FIRST = 24, STRIDE = 10, CUTS = 6 };
    static float q[T_LEN * T_HEADS * T_D], k[T_LEN * T_KVH * T_D];
    for (size_t i = 0; i < sizeof q / sizeof *q; i++)
        q[i] = 3.0f * frand();
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        k[i] = frand();
    float *out[CUTS], ref[T_LEN];
    float *work = malloc(kvp_importance_work(T_LEN) * sizeof(float)),
          *rwork = malloc(kvp_importance_work(T_LEN) * sizeof(float));
    for (int g = 0; g < CUTS; g++)
        out[g] = malloc((FIRST + g * STRIDE) * sizeof(float));
    for (int h = 0; h < T_KVH; h++) {
        kvp_importance_cuts(q, k, T_LEN, T_HEADS, T_KVH, T_D, h, FIRST, STRIDE, CUTS, out, work);
        for (int g = 0; g < CUTS; g++) {
            int n = FIRST + g * STRIDE;
            float *one = ref;
            kvp_importance_cuts(q, k, T_LEN, T_HEADS, T_KVH, T_D, h, n, 1, 1, &one, rwork);
            double total = 0.0;
            for (int i = 0; i < n; i++) {
                cr_assert_float_eq(out[g][i], ref[i], 1e-5f * (1.0f + ref[i]),
                                   "head %d cut %d row %d", h, n, i);
                total += ref[i];
            }
            cr_assert_gt(total, 0.0, "head %d cut %d: no importance", h, n);
        }
    }
    for (int g = 0; g < CUTS; g++)
        free(out[g]);
    free(work);
    free(rwork);
}

/* The training loss of one episode, -sum_k adv_k log pi(sigma_k | s(w)) / K. */
static double episode_loss(kvp_agent_acts *acts, const float *w, const float *k,
                           const float *v, const int32_t *pos, int n, int32_t (*sig)[8],
                           const float *adv, int K)
{
    float s[8];
    double work[8], L = 0.0;
    kvp_agent_forward(acts, w, k, v, pos, n, s);
    for (int j = 0; j < K; j++)
        L -= adv[j] * kvp_pl_logprob(s, sig[j], n, NULL, work) / K;
    return L;
}

Test(train, agent_gradient_through_the_training_loss_matches_finite_differences)
{
    const kvp_agent_arch a = {.d = 3, .P = 4, .E = 3, .H = 5, .pmax = 8};
    size_t np = kvp_agent_n_params(&a);
    float *w = malloc(np * sizeof(float)), *g = calloc(np, sizeof(float));
    kvp_agent_init(&a, w, 3);
    for (size_t i = 0; i < np; i++)
        w[i] += 0.3f * frand();   /* move biases and gains off their init */
    enum { N = 7, K = 4 };
    float k[N * 3], v[N * 3], s[N], ds[N] = {0}, pg[N];
    int32_t pos[N] = {0, 1, 2, 3, 5, 6, 7}, sig[K][8];
    double work[N];
    const float adv[K] = {1.2f, -0.4f, -2.0f, 0.7f};
    for (int i = 0; i < N * 3; i++) {
        k[i] = 1.5f * frand();
        v[i] = 1.5f * frand();
    }
    for (int j = 0; j < K; j++)
        shuffle(sig[j], N);
    kvp_agent_acts *acts = kvp_agent_acts_new(&a, N);
    cr_assert(acts);
    /* what train_step does: dL/ds from the PL gradients, then the agent's backward */
    kvp_agent_forward(acts, w, k, v, pos, N, s);
    for (int j = 0; j < K; j++) {
        kvp_pl_logprob(s, sig[j], N, pg, work);
        for (int i = 0; i < N; i++)
            ds[i] -= adv[j] * pg[i] / K;
    }
    kvp_agent_backward(acts, w, ds, g);
    double gmax = 0.0, worst = 0.0;
    for (size_t i = 0; i < np; i++)
        gmax = fmax(gmax, fabs(g[i]));
    int checked = 0;
    for (size_t i = 0; i < np; i++) {
        const float h = 2e-2f;
        float w0 = w[i];
        double f[4];
        const float steps[4] = {-2 * h, -h, h, 2 * h};
        for (int j = 0; j < 4; j++) {
            w[i] = w0 + steps[j];
            f[j] = episode_loss(acts, w, k, v, pos, N, sig, adv, K);
        }
        w[i] = w0;
        double num = (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12.0 * h);
        double err = fabs(num - g[i]), tol = 1e-2 * fabs(g[i]) + 2e-3 * gmax;
        worst = fmax(worst, err / tol);
        cr_assert_leq(err, tol, "param %zu: backward %.7g, finite differences %.7g", i, g[i], num);
        checked += g[i] != 0.0f;
    }
    cr_assert_gt(checked, (int)np / 2);
    cr_log_info("training-loss gradient: %zu parameters, worst error %.3g of the tolerance", np,
                worst);
    kvp_agent_acts_free(acts);
    free(w);
    free(g);
}

static void train_tiny(const kvp_trace *t, long steps, int threads, uint64_t seed,
                       const char *out, double *val0, double *val1)
{
    kvp_agent_set s;
    char err[256];
    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &tiny_arch, err, sizeof err), 0);
    kvp_agent_set_init(&s, 5);
    kvp_train_cfg c = tiny_cfg(steps, threads);
    c.seed = seed;
    if (val0)
        cr_assert_eq(kvp_train_validate(t, &s, c.val_cut, c.n_sink, c.n_recent, 1, val0, NULL,
                                        err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_train(t, &s, &c, val1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_save(&s, out, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&s);
}

static int same_file(const char *a, const char *b)
{
    size_t la, lb;
    char *x = tu_slurp(a, &la), *y = tu_slurp(b, &lb);
    int same = la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return same;
}

Test(train, same_seed_same_file_for_any_thread_count)
{
    kvp_trace t;
    open_trace(&t);
    char p[4][128];
    for (int i = 0; i < 4; i++)
        snprintf(p[i], sizeof p[i], "%s/p%d.kvp", trace_dir(), i);
    train_tiny(&t, 12, 1, 7, p[0], NULL, NULL);
    train_tiny(&t, 12, 1, 7, p[1], NULL, NULL);
    train_tiny(&t, 12, 3, 7, p[2], NULL, NULL);
    train_tiny(&t, 12, 1, 8, p[3], NULL, NULL);
    cr_assert(same_file(p[0], p[1]), "two runs with seed 7 differ");
    cr_assert(same_file(p[0], p[2]), "1 and 3 threads differ");
    cr_assert(!same_file(p[0], p[3]), "seeds 7 and 8 gave the same policy");
    kvp_trace_close(&t);
    remove_trace();
}

/* Chunked eviction with fixed scores, row by row as kvp_gen_prefill runs it (every head
 * back to b before it would pass b + chunk rows; sinks and the kvp policy's window kept,
 * the rest by score, ties to the older row): at every eviction the rows it ranks are the
 * ones kvp_train_stream_rows names from the scores alone. */
Test(train, stream_rows_are_the_rows_chunked_eviction_ranks)
{
    enum { N = 512, SINK = 4, RECENT = 16, CHUNK = 32 };
    static float score[N];
    uint64_t rng = 5;
    for (int i = 0; i < N; i++)
        score[i] = kvp_rand_f32(&rng);
    score[100] = score[101] = score[102];   /* ties go to the older row */
    static const int budgets[] = {32, 64, 128, 256};
    for (size_t bi = 0; bi < sizeof budgets / sizeof budgets[0]; bi++) {
        int b = budgets[bi], win = kvp_agent_recent_window(b, KVP_AGENT_CAP_DEFAULT(N), RECENT), keep = b - SINK - win;
        int32_t cache[N + 1], rows[N], order[N], want[N];
        kvp_rank_key work[N];
        int size = 0, decisions = 0;
        for (int n = 1; n <= N; n++) {
            cache[size++] = n - 1;
            if (size < b + CHUNK)
                continue;
            /* the rows this eviction ranks: neither sinks nor in the window */
            int m = 0;
            for (int i = SINK; i < size - win; i++)
                want[m++] = cache[i];
            int got = kvp_train_stream_rows(score, n, b, KVP_AGENT_CAP_DEFAULT(N), SINK, RECENT, CHUNK, rows, order, work);
            cr_assert_eq(got, m, "budget %d, cut %d: %d rows, eviction ranks %d", b, n, got, m);
            for (int i = 0; i < m; i++)
                cr_assert_eq(rows[i], want[i], "budget %d, cut %d, row %d", b, n, i);
            /* evict: keep the top `keep` of them by score, in cache order */
            int32_t kept[N];
            for (int i = 0; i < m; i++)
                kept[i] = 0;
            for (int r = 0; r < keep; r++) {
                int best = -1;
                for (int i = 0; i < m; i++)
                    if (!kept[i] && (best < 0 || score[want[i]] > score[want[best]]))
                        best = i;
                kept[best] = 1;
            }
            int out = SINK;
            for (int i = 0; i < m; i++)
                if (kept[i])
                    cache[out++] = want[i];
            for (int i = size - win; i < size; i++)
                cache[out++] = cache[i];
            cr_assert_eq(out, b);
            size = out;
            decisions++;
        }
        cr_assert_gt(decisions, 5, "budget %d: %d evictions", b, decisions);
        /* a budget that evicts nothing yet */
        cr_assert_eq(kvp_train_stream_rows(score, b, b, KVP_AGENT_CAP_DEFAULT(N), SINK, RECENT, CHUNK, rows, order, work), 0);
    }
}

static void train_stream(const kvp_trace *t, int threads, float share, const char *out)
{
    kvp_agent_set s;
    char err[256];
    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &tiny_arch, err, sizeof err), 0);
    kvp_agent_set_init(&s, 5);
    kvp_train_cfg c = tiny_cfg(12, threads);
    c.seed = 7;
    c.stream_share = share;
    c.n_stream_budgets = 2;
    c.stream_budgets[0] = 24;   /* window 16: 4 rows chosen */
    c.stream_budgets[1] = 40;   /* window 28 (40 - 96 / 8): 8 rows chosen */
    c.stream_chunk = 8;
    cr_assert_eq(kvp_train(t, &s, &c, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_save(&s, out, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&s);
}

Test(train, streaming_episodes_are_reproducible_and_change_what_is_learnt)
{
    kvp_trace t;
    open_trace(&t);
    char p[4][128];
    for (int i = 0; i < 4; i++)
        snprintf(p[i], sizeof p[i], "%s/s%d.kvp", trace_dir(), i);
    train_stream(&t, 1, 0.5f, p[0]);
    train_stream(&t, 3, 0.5f, p[1]);
    train_stream(&t, 1, 0.0f, p[2]);
    train_tiny(&t, 12, 1, 7, p[3], NULL, NULL);
    cr_assert(same_file(p[0], p[1]), "1 and 3 threads differ with streaming episodes");
    cr_assert(!same_file(p[0], p[2]), "streaming episodes changed nothing");
    cr_assert(same_file(p[2], p[3]), "share 0 is not plain training");
    kvp_trace_close(&t);
    remove_trace();
}

Test(train, training_learns_a_ranking_the_keys_predict)
{
    kvp_trace t;
    open_trace(&t);
    char p[2][128];
    /* with the default listwise term, and with the policy gradient alone */
    for (int lw = 0; lw < 2; lw++) {
        snprintf(p[lw], sizeof p[lw], "%s/learn%d.kvp", trace_dir(), lw);
        kvp_agent_set s;
        char err[256];
        cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &tiny_arch, err, sizeof err), 0);
        kvp_agent_set_init(&s, 5);
        kvp_train_cfg c = tiny_cfg(150, 2);
        c.seed = 1;
        if (lw)
            c.listwise = 0.0f;
        double before, after;
        cr_assert_eq(kvp_train_validate(&t, &s, c.val_cut, c.n_sink, c.n_recent, 1, &before,
                                        NULL, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kvp_train(&t, &s, &c, &after, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kvp_agent_set_save(&s, p[lw], err, sizeof err), 0, "%s", err);
        kvp_agent_set_free(&s);
        cr_log_info("synthetic trace, listwise %g: validation C/C* %.3f before, %.3f after",
                    (double)c.listwise, before, after);
        cr_assert_lt(after, 1.0 + 0.5 * (before - 1.0), "listwise %g: C/C* %.3f before, %.3f after",
                     (double)c.listwise, before, after);
    }
    cr_assert(!same_file(p[0], p[1]), "the listwise term changed nothing");
    kvp_trace_close(&t);
    remove_trace();
}

/* KVzap: agents trained on a trace of KVzip targets (`kvp trace --targets kvzip` on
 * stories260K) learn to predict them from the rows' keys, values and positions: on the
 * held-out sequences their ranking's C/C* against KVzip's scores falls with training and
 * ends below a random ranking's. */
Test(train, kvzap_surrogate_learns_kvzip_scores_better_than_random)
{
    char dir[96], text_path[128], args[1024], path[160], *out;
    snprintf(dir, sizeof dir, "/tmp/kvp-kvzap-%d", (int)getpid());
    snprintf(text_path, sizeof text_path, "%s.txt", dir);
    size_t len;
    char *text = tu_slurp(tu_shared("datasets/tinystories/tinystories-dev.txt"), &len);
    FILE *f = fopen(text_path, "wb");
    cr_assert(f && len > 40000);
    cr_assert_eq(fwrite(text, 1, 40000, f), 40000);
    fclose(f);
    free(text);
    snprintf(args, sizeof args, "--model %s --text %s --out %s --seq-len 128 --max-seqs 24 "
             "--split 0.75 --cut-min 48 --cut-stride 16 --cut-tail 16 --targets kvzip",
             tu_shared("models/stories260K.bin"), text_path, dir);
    cr_assert_eq(run_kvp("trace", args, &out), 0, "%s", out);
    cr_assert(strstr(out, "targets: KVzip"), "%s", out);
    free(out);

    kvp_trace t;
    char err[256];
    snprintf(path, sizeof path, "%s/trace.kvpt", dir);
    cr_assert_eq(kvp_trace_open(&t, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.h.targets, KVP_TRACE_TARGETS_KVZIP);
    cr_assert_lt(t.h.n_train, t.h.n_seqs);
    kvp_agent_arch arch = {.d = t.h.head_dim, .P = 8, .E = 4, .H = 8, .pmax = 128};
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_alloc(&s, t.h.n_layers, t.h.n_kv_heads, &arch, err, sizeof err), 0,
                 "%s", err);
    kvp_agent_set_init(&s, 3);
    kvp_train_cfg c = tiny_cfg(200, 2);
    c.seed = 1;
    c.val_cut = 96;
    double before, after;
    cr_assert_eq(kvp_train_validate(&t, &s, c.val_cut, c.n_sink, c.n_recent, 1, &before, NULL,
                                    err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_train(&t, &s, &c, &after, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&s);

    /* a random ranking of the same held-out rows, the same rows validation ranks */
    int m = c.val_cut - c.n_sink - c.n_recent, g = kvp_trace_cut_index(&t.h, c.val_cut);
    int32_t sigma[128], order[128];
    kvp_rank_key rk[128];
    float zero[128] = {0};
    uint64_t rng = 11;
    double rnd = 0.0;
    long cases = 0;
    for (int q = t.h.n_train; q < t.h.n_seqs; q++)
        for (int l = 0; l < t.h.n_layers; l++)
            for (int kvh = 0; kvh < t.h.n_kv_heads; kvh++) {
                const float *imp = kvp_trace_importance(&t, q, l, kvh, g) + c.n_sink;
                double best = kvp_oracle_cost(imp, m, order, rk);
                for (int draw = 0; draw < 16; draw++, cases++) {
                    kvp_gumbel_rank(zero, m, &rng, sigma, rk);
                    rnd += kvp_rank_cost(imp, sigma, m) / fmax(best, 1e-8);
                }
            }
    rnd /= (double)cases;
    cr_log_info("kvzap on KVzip targets: validation C/C* %.3f before, %.3f after, random %.3f",
                before, after, rnd);
    cr_assert_lt(after, before, "C/C* %.3f before, %.3f after", before, after);
    cr_assert_lt(after, rnd, "C/C* %.3f after training, %.3f random", after, rnd);
    kvp_trace_close(&t);
    unlink(path);
    rmdir(dir);
    unlink(text_path);
}

Test(train, bad_settings_and_shapes_are_errors)
{
    kvp_trace t;
    open_trace(&t);
    kvp_agent_set s;
    char err[256];
    kvp_agent_arch other = tiny_arch;
    other.d = 8;
    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &other, err, sizeof err), 0);
    kvp_agent_set_init(&s, 1);
    kvp_train_cfg c = tiny_cfg(2, 1);
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "head_dim 8"), "%s", err);
    kvp_agent_set_free(&s);

    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &tiny_arch, err, sizeof err), 0);
    kvp_agent_set_init(&s, 1);
    c = tiny_cfg(2, 1);
    c.samples = 1;
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    c = tiny_cfg(2, 1);
    c.n_recent = 27;   /* the smallest cut, 32, leaves one row to rank */
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "fewer than 2 rows"), "%s", err);
    c = tiny_cfg(2, 1);
    c.val_cut = T_LEN;
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "no validation sequence"), "%s", err);
    c = tiny_cfg(2, 1);
    c.stream_share = 1.5f;
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "streaming-episode"), "%s", err);
    c = tiny_cfg(2, 1);
    c.stream_chunk = 0;
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "streaming-episode"), "%s", err);
    c = tiny_cfg(2, 1);
    c.n_stream_budgets = 0;
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    c = tiny_cfg(2, 1);
    c.stream_share = 0.5f;
    c.stream_budgets[1] = 20;   /* 4 sinks + 16 recent: nothing to choose */
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "streaming budget 20 leaves no row"), "%s", err);
    c = tiny_cfg(2, 1);
    c.listwise = -1.0f;
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "listwise"), "%s", err);
    c.listwise = NAN;
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    c = tiny_cfg(2, 1);
    c.val_cut = 75;   /* between cuts 72 and 80 */
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "not on the trace's grid"), "%s", err);
    kvp_trace_close(&t);
    remove_trace();
    /* a grid that starts at 90: 90 + 8 future tokens do not fit in 96 */
    make_trace_grid(trace_dir(), 90);
    open_trace(&t);
    c = tiny_cfg(2, 1);
    cr_assert_eq(kvp_train(&t, &s, &c, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "no training sequence"), "%s", err);
    kvp_agent_set_free(&s);
    kvp_trace_close(&t);
    remove_trace();
}

/* ---- kvp train ----------------------------------------------------------------------- */

Test(train, cli_trains_writes_policy_and_curve)
{
    const char *dir = trace_dir();
    char args[1024], pol[256], csv[300], *out;
    snprintf(pol, sizeof pol, "%s/cli.kvp", dir);
    snprintf(args, sizeof args, "--traces %s --out %s --init %s --steps 20 --eval-every 10 "
             "--threads 2 --episodes 4 --samples 4 --val-cut 72",
             dir, pol, pol);
    /* --init needs a policy of the trace's shape: write one first */
    kvp_agent_set s;
    char err[256];
    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &tiny_arch, err, sizeof err), 0);
    kvp_agent_set_init(&s, 2);
    cr_assert_eq(kvp_agent_set_save(&s, pol, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&s);
    cr_assert_eq(run_kvp("train", args, &out), 0, "%s", out);
    cr_assert(strstr(out, "step 20/20"), "%s", out);
    cr_assert(strstr(out, "val C/C*"), "%s", out);
    free(out);
    kvp_model_config cfg = {.n_layers = T_LAYERS, .n_heads = T_HEADS, .n_kv_heads = T_KVH,
                            .head_dim = T_D};
    cr_assert_eq(kvp_agent_set_load(&s, pol, &cfg, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&s);
    snprintf(csv, sizeof csv, "%s.csv", pol);
    char *text = tu_slurp(csv, NULL);
    cr_assert(!strncmp(text, "step,train_cost,val_cost,lr,elapsed_s\n10,", 41), "%s", text);
    cr_assert(strstr(text, "\n20,"), "%s", text);
    free(text);
    remove_trace();
}

Test(train, cli_rejects_bad_input)
{
    const char *dir = trace_dir();
    char *out, args[1024];
    const char *usage[] = {
        "--out /tmp/x.kvp",
        "--traces /tmp",
        "--traces /tmp --out /tmp/x.kvp --steps abc",
        "--traces /tmp --out /tmp/x.kvp --steps 0",
        "--traces /tmp --out /tmp/x.kvp --threads 0",
        "--traces /tmp --out /tmp/x.kvp --lr -1",
        "--traces /tmp --out /tmp/x.kvp --samples 1",
        "--traces /tmp --out /tmp/x.kvp --lr 1e-3 --lr-min 1e-2",
        "--traces /tmp --out /tmp/x.kvp --bogus",
        "--traces /tmp --out /tmp/x.kvp --stream-share 1.5",
        "--traces /tmp --out /tmp/x.kvp --stream-share half",
        "--traces /tmp --out /tmp/x.kvp --stream-budgets 32,,64",
        "--traces /tmp --out /tmp/x.kvp --stream-budgets ,32",
        "--traces /tmp --out /tmp/x.kvp --stream-budgets 32,",
        "--traces /tmp --out /tmp/x.kvp --stream-budgets 0",
        "--traces /tmp --out /tmp/x.kvp --stream-budgets 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17",
        "--traces /tmp --out /tmp/x.kvp --stream-chunk 0",
        "--traces /tmp --out /tmp/x.kvp --listwise -1",
        "--traces /tmp --out /tmp/x.kvp --listwise lots",
        "--traces /tmp --out /tmp/x.kvp extra",
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        cr_assert_eq(run_kvp("train", usage[i], &out), 2, "'%s': %s", usage[i], out);
        cr_assert(strstr(out, "kvp train"), "'%s': %s", usage[i], out);
        free(out);
    }
    cr_assert_eq(run_kvp("train", "--help", &out), 0);
    cr_assert(strstr(out, "--traces"));
    free(out);
    /* no trace there */
    cr_assert_eq(run_kvp("train", "--traces /nonexistent --out /tmp/never.kvp", &out), 1);
    cr_assert(strstr(out, "/nonexistent/trace.kvpt"), "%s", out);
    free(out);
    /* a trace for another shape than the --init policy */
    char pol[256];
    snprintf(pol, sizeof pol, "%s/other.kvp", dir);
    kvp_agent_set s;
    char err[256];
    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS + 1, T_KVH, &tiny_arch, err, sizeof err), 0);
    kvp_agent_set_init(&s, 2);
    cr_assert_eq(kvp_agent_set_save(&s, pol, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&s);
    snprintf(args, sizeof args, "--traces %s --out %s/never.kvp --init %s", dir, dir, pol);
    cr_assert_eq(run_kvp("train", args, &out), 1, "%s", out);
    cr_assert(strstr(out, "3 layers"), "%s", out);
    free(out);
    char never[256];
    snprintf(never, sizeof never, "%s/never.kvp", dir);
    cr_assert_neq(access(never, F_OK), 0);
    remove_trace();
}

/* The validation figure of agent (layer, kvh) of s computed here from the trace's rows:
 * keys centred on the rows before the cut, and for relative keys turned back by the cut. */
static double validate_by_hand(const kvp_trace *t, const kvp_agent_set *s, const kvp_train_cfg *c,
                               int layer, int kvh)
{
    int cut = c->val_cut, g = kvp_trace_cut_index(&t->h, cut);
    int m = cut - c->n_sink - c->n_recent, d = T_D;
    float k[T_LEN * T_D], v[T_LEN * T_D], score[T_LEN];
    int32_t pos[T_LEN], order[T_LEN];
    kvp_rank_key rk[T_LEN];
    float *work = malloc(kvp_agent_score_work(&s->arch, T_LEN) * sizeof *work);
    double sum = 0.0;
    int count = 0;
    for (int seq = t->h.n_train; seq < t->h.n_seqs; seq++) {
        if (g >= kvp_trace_n_cuts(&t->h, kvp_trace_len(t, seq)))
            continue;
        framed_rows(t, seq, layer, kvh, cut, s->arch.relative ? &s->rope : NULL, k, v);
        for (int i = 0; i < cut; i++)
            pos[i] = i;
        kvp_agent_score(&s->arch, kvp_agent_set_params(s, layer, kvh), k + c->n_sink * d,
                        v + c->n_sink * d, pos + c->n_sink, m, score, work);
        kvp_argsort_desc(score, m, order, rk);
        const float *imp = kvp_trace_importance(t, seq, layer, kvh, g) + c->n_sink;
        double cost = kvp_rank_cost(imp, order, m), best = kvp_oracle_cost(imp, m, order, rk);
        sum -= kvp_rank_reward(cost, best);
        count++;
    }
    cr_assert_gt(count, 0);
    free(work);
    return sum / count;
}

/* Agents with centred keys are validated on each key minus the mean key of the sequence's
 * rows before the cut, and agents with relative keys on that key turned back by the cut:
 * each figure equals one computed here from the trace's rows, and the three kinds of keys
 * validate differently with the same weights. */
Test(train, centred_and_relative_agents_rank_keys_framed_at_the_cut)
{
    kvp_trace t;
    open_trace(&t);
    kvp_agent_arch ca = tiny_arch, ra = tiny_arch;
    ca.centered = 1;
    ra.centered = 1;
    ra.relative = 1;
    kvp_agent_set s, rel, raw;
    char err[256];
    kvp_rope rope = {.n_rot = T_D, .neox = 1, .base = 10000.0f};
    cr_assert_eq(kvp_agent_set_alloc(&s, T_LAYERS, T_KVH, &ca, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_alloc(&rel, T_LAYERS, T_KVH, &ra, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_rope(&rel, &rope, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_alloc(&raw, T_LAYERS, T_KVH, &tiny_arch, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&s, 5);
    kvp_agent_set_init(&rel, 5);
    kvp_agent_set_init(&raw, 5);
    kvp_train_cfg c = tiny_cfg(1, 1);
    double mc, mr, ml, pc[T_LAYERS * T_KVH], pr[T_LAYERS * T_KVH], pl[T_LAYERS * T_KVH];
    cr_assert_eq(kvp_train_validate(&t, &s, c.val_cut, c.n_sink, c.n_recent, 1, &mc, pc, err,
                                    sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_train_validate(&t, &raw, c.val_cut, c.n_sink, c.n_recent, 1, &mr, pr, err,
                                    sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_train_validate(&t, &rel, c.val_cut, c.n_sink, c.n_recent, 1, &ml, pl, err,
                                    sizeof err), 0, "%s", err);
    cr_assert(fabs(mc - mr) > 1e-6, "centred and raw keys validate alike (%g)", mc);
    cr_assert(fabs(ml - mc) > 1e-6, "relative and centred keys validate alike (%g)", ml);

    /* agent (1, 1) by hand */
    cr_assert_float_eq(pc[1 * T_KVH + 1], validate_by_hand(&t, &s, &c, 1, 1), 1e-9);
    cr_assert_float_eq(pl[1 * T_KVH + 1], validate_by_hand(&t, &rel, &c, 1, 1), 1e-9);
    kvp_agent_set_free(&s);
    kvp_agent_set_free(&rel);
    kvp_agent_set_free(&raw);
    kvp_trace_close(&t);
    remove_trace();
}
