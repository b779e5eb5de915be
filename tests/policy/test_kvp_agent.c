/* policy/kvp_agent.c: the layout, the scoring paths, calibrations, set allocation. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offline/agent_train.h"
#include "policy/kvp_agent.h"
#include "policy/policy.h"
#include "tests/model/testutil.h"
#include "tests/policy/agentutil.h"

/* The default agent sizes (kvp policy-init and kvp train without --init, kvp learn) are
 * those of the shipped policy, so every way of starting an agent builds the same one. */
Test(kvp_agent, the_default_sizes_are_the_shipped_agents)
{
    const char *src = getenv("KVP_SOURCE");
    cr_assert_not_null(src, "KVP_SOURCE is not set");
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/policy/weights/stories260K.kvp", src);
    kvp_model_config cfg = {.n_layers = 5, .n_kv_heads = 4, .head_dim = 8};
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_load(&s, path, &cfg, err, sizeof err), 0, "%s", err);
    cr_expect_eq(s.arch.P, KVP_AGENT_DEFAULT_P);
    cr_expect_eq(s.arch.E, KVP_AGENT_DEFAULT_E);
    cr_expect_eq(s.arch.H, KVP_AGENT_DEFAULT_H);
    cr_expect_eq(s.arch.pmax, KVP_AGENT_DEFAULT_PMAX);
    kvp_agent_set_free(&s);
}

Test(kvp_agent, layout_groups_tile_the_vector_in_order)
{
    kvp_agent_layout l;
    kvp_agent_layout_of(&small_arch, &l);
    size_t P = 4, E = 3, H = 5, d = 3, C = 2 * P + E;
    size_t want[][2] = {
        {l.wk, P * d}, {l.bk, P},  {l.lnk_g, P}, {l.lnk_b, P}, {l.wv, P * d},  {l.bv, P},
        {l.lnv_g, P},  {l.lnv_b, P}, {l.emb, 6 * E}, {l.lne_g, E}, {l.lne_b, E}, {l.w1, H * C},
        {l.b1, H},     {l.ln1_g, H}, {l.ln1_b, H}, {l.w2, H * H}, {l.b2, H},    {l.ln2_g, H},
        {l.ln2_b, H},  {l.w3, H},    {l.b3, 1},
    };
    size_t o = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_assert_eq(want[i][0], o, "group %zu", i);
        o += want[i][1];
    }
    cr_assert_eq(l.n, o);
    cr_assert_eq(kvp_agent_n_params(&small_arch), o);
}

/* Scores of n random rows through the batched path and one row at a time. */
static void check_batched_vs_single(const kvp_agent_arch *a, int n)
{
    size_t np = kvp_agent_n_params(a);
    float *w = malloc(np * sizeof(float));
    kvp_agent_init(a, w, 99);
    /* Non-trivial biases and LayerNorm parameters too. */
    kvp_agent_layout l;
    kvp_agent_layout_of(a, &l);
    fill(w + l.bk, (size_t)a->P, 0.3f);
    fill(w + l.ln1_g, (size_t)a->H, 1.0f);
    fill(w + l.b3, 1, 1.0f);
    size_t kv_bytes = (size_t)n * a->d * sizeof(float);
    float *k = malloc(kv_bytes), *v = malloc(kv_bytes);
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    fill(k, (size_t)n * a->d, 3.0f);
    fill(v, (size_t)n * a->d, 1.0f);
    for (int i = 0; i < n; i++)
        pos[i] = i * 3;   /* runs past pmax */
    float *sb = malloc((size_t)n * sizeof(float)), *s1 = malloc((size_t)n * sizeof(float));
    float *work = malloc(kvp_agent_score_work(a, n) * sizeof(float));
    kvp_agent_score(a, w, k, v, pos, n, sb, work);
    for (int i = 0; i < n; i++)
        kvp_agent_score(a, w, k + (size_t)i * a->d, v + (size_t)i * a->d, pos + i, 1, s1 + i,
                        work);
    /* Relative to the score's scale: a score near 0 is a cancellation of O(rms) terms,
     * where only absolute rounding of that size is meaningful. */
    double ms = 0;
    for (int i = 0; i < n; i++)
        ms += (double)s1[i] * s1[i] / n;
    float rms = (float)sqrt(ms), worst = 0.0f;
    cr_assert_gt(rms, 0.0f);
    for (int i = 0; i < n; i++) {
        float rel = fabsf(sb[i] - s1[i]) / fmaxf(fabsf(s1[i]), rms);
        worst = fmaxf(worst, rel);
        cr_assert_leq(rel, 1e-5f, "row %d: batched %.9g, single %.9g", i, sb[i], s1[i]);
    }
    cr_log_info("batched vs one-row: worst relative difference %.3g (n %d)", worst, n);
    free(w);
    free(k);
    free(v);
    free(pos);
    free(sb);
    free(s1);
    free(work);
}

Test(kvp_agent, batched_scores_match_one_row_scores)
{
    check_batched_vs_single(&default_arch, 700);
    check_batched_vs_single(&small_arch, 9);
}

Test(kvp_agent, same_seed_same_bytes_different_seed_differs)
{
    const char *p1 = write_policy(&tiny_arch, 5, 4, 42);
    const char *p2 = write_policy(&tiny_arch, 5, 4, 42);
    const char *p3 = write_policy(&tiny_arch, 5, 4, 43);
    size_t n1, n2, n3;
    char *b1 = tu_slurp(p1, &n1), *b2 = tu_slurp(p2, &n2), *b3 = tu_slurp(p3, &n3);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(b1, b2, n1), 0);
    cr_assert_eq(n1, n3);
    /* Every agent differs between seeds, and agents differ from each other. */
    size_t np = kvp_agent_n_params(&tiny_arch), bytes = np * 4;
    for (int ag = 0; ag < 20; ag++)
        cr_assert_neq(memcmp(b1 + 120 + ag * bytes, b3 + 120 + ag * bytes, bytes), 0, "agent %d", ag);
    cr_assert_neq(memcmp(b1 + 120, b1 + 120 + bytes, bytes), 0);
    free(b1);
    free(b2);
    free(b3);
    unlink(p1);
    unlink(p2);
    unlink(p3);
}

/* Bad calibrations are refused: when set (knot counts, order, finiteness) and in a file
 * (a count that does not match the bytes, knots out of order, truncated knots). */
Test(kvp_agent, bad_calibrations_are_refused_with_a_message)
{
    char err[512];
    kvp_agent_set s;
    calibrate_tiny(&s, 3);
    float k[6 * 2 * 3];
    memcpy(k, s.knots, sizeof k);
    const int counts[] = {1, -1, KVP_CALIBRATION_MAX_KNOTS + 1};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kvp_agent_set_calibration(&s, counts[i], k, err, sizeof err), -EINVAL);
        cr_assert(strstr(err, "knots"), "%s", err);
    }
    struct { int at; float v; const char *want; } bad[] = {
        {6 * 3 + 1, 3.0f, "not above"},                               /* agent 3: x1 = x0 */
        {2 * 6 + 3 + 2, -1.0f, "below the previous"},                 /* agent 2: y2 < y1 */
        {0, NAN, "not finite"}, {4 * 6 + 3, INFINITY, "not finite"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float m[sizeof k / sizeof k[0]];
        memcpy(m, k, sizeof m);
        m[bad[i].at] = bad[i].v;
        cr_assert_eq(kvp_agent_set_calibration(&s, 3, m, err, sizeof err), -EINVAL, "case %zu", i);
        cr_assert(strstr(err, bad[i].want), "case %zu: %s", i, err);
        cr_assert_eq(memcmp(s.knots, k, sizeof k), 0, "a refused calibration left the old one");
    }
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);
    size_t len, np = kvp_agent_n_params(&tiny_arch), at = 120 + 6 * np * 4;
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    unlink(path);
    uint8_t *m = malloc(len);
    memcpy(m, b, len);
    wr32(m + at, 4);   /* 4 knots said, 3 stored */
    reseal(m, len);
    expect_bad(m, len, "calibration of 4 knots does not match", -EINVAL);
    memcpy(m, b, len);
    wr32(m + at, 1);
    reseal(m, len);
    expect_bad(m, len, "calibration of 1 knots", -EINVAL);
    memcpy(m, b, len);
    float y = -5.0f;   /* agent 0's last value below its previous */
    memcpy(m + at + 4 + 5 * 4, &y, 4);
    reseal(m, len);
    expect_bad(m, len, "below the previous", -EINVAL);
    /* knots cut short: the count no longer matches what is left */
    memcpy(m, b, len);
    memmove(m + len - 16, m + len - 8, 8);
    reseal(m, len - 8);
    expect_bad(m, len - 8, "does not match", -EINVAL);
    expect_bad(b, at + 2, "truncated", -EINVAL);
    /* a knot changed without resealing */
    memcpy(m, b, len);
    m[at + 9] ^= 0x01;
    expect_bad(m, len, "checksum mismatch", -EBADMSG);
    free(m);
    free(b);
    kvp_agent_set_free(&s);
}

Test(kvp_agent, bad_sizes_are_rejected_when_allocating)
{
    char err[256] = "";
    kvp_agent_set s;
    kvp_agent_arch a = default_arch;
    a.H = 0;
    cr_assert_eq(kvp_agent_set_alloc(&s, 5, 4, &a, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "hidden H = 0"), "%s", err);
    cr_assert_eq(kvp_agent_set_alloc(&s, 0, 4, &default_arch, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "n_layers"), "%s", err);
    a = default_arch;
    a.pmax = -1;
    cr_assert_eq(kvp_agent_arch_check(&a, err, sizeof err), -EINVAL);
    cr_assert_eq(kvp_agent_arch_check(&default_arch, err, sizeof err), 0);
}
