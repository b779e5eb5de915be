/* offline/agent_train.c: the training forward pass agrees with the scorer, and the
 * backward pass with finite differences of the scorer's output. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "offline/agent_train.h"
#include "policy/kvp_agent.h"

static const kvp_agent_arch small_arch = {.d = 3, .P = 4, .E = 3, .H = 5, .pmax = 6};
static const kvp_agent_arch default_arch = {.d = 8,
                                            .P = KVP_AGENT_DEFAULT_P,
                                            .E = KVP_AGENT_DEFAULT_E,
                                            .H = KVP_AGENT_DEFAULT_H,
                                            .pmax = KVP_AGENT_DEFAULT_PMAX};

static uint64_t rng_state = 12345;

static float frand(void)   /* uniform [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) / 8388608.0f - 1.0f;
}

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * frand();
}


Test(agent_train, training_forward_matches_inference_scores)
{
    const kvp_agent_arch *a = &default_arch;
    int n = 40;
    float *w = malloc(kvp_agent_n_params(a) * sizeof(float));
    kvp_agent_init(a, w, 3);
    float k[40 * 8], v[40 * 8], s_inf[40], s_tr[40];
    int32_t pos[40];
    fill(k, sizeof k / sizeof k[0], 2.0f);
    fill(v, sizeof v / sizeof v[0], 2.0f);
    for (int i = 0; i < n; i++)
        pos[i] = 20 * i;
    float *work = malloc(kvp_agent_score_work(a, n) * sizeof(float));
    kvp_agent_score(a, w, k, v, pos, n, s_inf, work);
    kvp_agent_acts *t = kvp_agent_acts_new(a, 64);
    cr_assert(t);
    kvp_agent_forward(t, w, k, v, pos, n, s_tr);
    for (int i = 0; i < n; i++)
        cr_assert_float_eq(s_tr[i], s_inf[i], 1e-5f * (1.0f + fabsf(s_inf[i])), "row %d", i);
    kvp_agent_acts_free(t);
    free(w);
    free(work);
}

/* L = sum_i c_i s_i on a fixed batch. */
static double loss(const kvp_agent_arch *a, const float *w, const float *k, const float *v,
                   const int32_t *pos, int n, const float *c)
{
    float s[16], work[16 * 64];
    cr_assert_leq(kvp_agent_score_work(a, n), sizeof work / sizeof work[0]);
    kvp_agent_score(a, w, k, v, pos, n, s, work);
    double L = 0;
    for (int i = 0; i < n; i++)
        L += (double)c[i] * s[i];
    return L;
}

Test(agent_train, backward_matches_finite_differences)
{
    const kvp_agent_arch *a = &small_arch;
    kvp_agent_layout l;
    kvp_agent_layout_of(a, &l);
    size_t np = l.n;
    float *w = malloc(np * sizeof(float)), *g = calloc(np, sizeof(float));
    kvp_agent_init(a, w, 5);
    /* Move every group away from its init (gains 1, biases 0) so each term matters. */
    fill(w + l.bk, 3 * (size_t)a->P + 0, 0.5f);
    fill(w + l.bv, 3 * (size_t)a->P, 0.5f);
    fill(w + l.lne_g, 2 * (size_t)a->E, 0.5f);
    fill(w + l.b1, 3 * (size_t)a->H, 0.5f);
    fill(w + l.b2, 3 * (size_t)a->H, 0.5f);
    for (size_t i = l.lnk_g; i < l.lnk_g + (size_t)a->P; i++)
        w[i] += 1.0f;
    w[l.b3] = 0.25f;

    enum { N = 6 };
    float k[N * 3], v[N * 3], c[N], s[N];
    int32_t pos[N] = {0, 2, 5, 9, 2, 1000};   /* repeats and clamping to pmax-1 = 5 */
    fill(k, sizeof k / sizeof k[0], 1.5f);
    fill(v, sizeof v / sizeof v[0], 1.5f);
    fill(c, N, 1.0f);

    kvp_agent_acts *t = kvp_agent_acts_new(a, N);
    cr_assert(t);
    kvp_agent_forward(t, w, k, v, pos, N, s);
    kvp_agent_backward(t, w, c, g);

    const char *names[] = {"wk", "bk", "lnk_g", "lnk_b", "wv", "bv", "lnv_g", "lnv_b",
                           "emb", "lne_g", "lne_b", "w1", "b1", "ln1_g", "ln1_b",
                           "w2", "b2", "ln2_g", "ln2_b", "w3", "b3"};
    size_t starts[] = {l.wk, l.bk, l.lnk_g, l.lnk_b, l.wv, l.bv, l.lnv_g, l.lnv_b,
                       l.emb, l.lne_g, l.lne_b, l.w1, l.b1, l.ln1_g, l.ln1_b,
                       l.w2, l.b2, l.ln2_g, l.ln2_b, l.w3, l.b3, l.n};
    double gmax = 0;
    for (size_t i = 0; i < np; i++)
        gmax = fmax(gmax, fabs(g[i]));
    int nonzero[21] = {0};
    double worst = 0;
    for (int gi = 0; gi < 21; gi++) {
        /* Tolerance: relative to the element, to its group's scale (groups differ by
         * orders of magnitude), and a floor for the float noise of the differences. */
        double group_max = 0;
        for (size_t i = starts[gi]; i < starts[gi + 1]; i++)
            group_max = fmax(group_max, fabs(g[i]));
        for (size_t i = starts[gi]; i < starts[gi + 1]; i++) {
            const float h = 3e-2f;
            float w0 = w[i];
            double f[4];
            const float steps[4] = {-2 * h, -h, h, 2 * h};
            for (int j = 0; j < 4; j++) {
                w[i] = w0 + steps[j];
                f[j] = loss(a, w, k, v, pos, N, c);
            }
            w[i] = w0;
            /* Five-point stencil: O(h^4) truncation error. */
            double num = (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12.0 * h);
            double err = fabs(num - g[i]), tol = 2e-3 * fabs(g[i]) + 2e-4 * group_max + 2e-6 * gmax;
            worst = fmax(worst, err / tol);
            cr_assert_leq(err, tol,
                          "%s[%zu]: backward %.7g, finite differences %.7g", names[gi],
                          i - starts[gi], g[i], num);
            nonzero[gi] += g[i] != 0.0f;
        }
    }
    cr_log_info("gradient check: %zu parameters, worst error %.3g of the tolerance", np, worst);
    for (int gi = 0; gi < 21; gi++)
        cr_assert_gt(nonzero[gi], 0, "group %s has no gradient", names[gi]);
    /* Table rows no position maps to get exactly nothing (positions use rows 0, 1, 2, 5). */
    for (int row = 3; row <= 4; row++)
        for (int j = 0; j < a->E; j++)
            cr_assert_eq(g[l.emb + (size_t)row * a->E + j], 0.0f);

    /* backward adds: a second call doubles the gradient. */
    float *g2 = malloc(np * sizeof(float));
    memcpy(g2, g, np * sizeof(float));
    kvp_agent_backward(t, w, c, g2);
    for (size_t i = 0; i < np; i++)
        cr_assert_float_eq(g2[i], 2 * g[i], 1e-6f * (1 + fabsf(g[i])));
    kvp_agent_acts_free(t);
    free(w);
    free(g);
    free(g2);
}
