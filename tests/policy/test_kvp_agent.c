/* KVP agents: scoring paths, backward pass, policy file format, policy glue, policy-init. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "policy/kvp_agent.h"
#include "offline/agent_train.h"
#include "policy/policy.h"
#include "tests/model/testutil.h"

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

/* The checksum written out as docs/policy-format.md specifies it: standard FNV-1a 64. */
static uint64_t fnv1a_ref(const uint8_t *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* Recomputes the trailing checksum so a test reaches the check it targets. */
static void reseal(uint8_t *buf, size_t len)
{
    wr64(buf + len - 8, fnv1a_ref(buf, len - 8));
}

static const char *tmp_path(void)
{
    static char paths[4][64];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "/tmp/kvp-agent-test-%d-%d.kvp", (int)getpid(), next);
    return p;
}

/* A 5 x 4 x head_dim 8 set (stories260K's shape) saved to a file; returns the path. */
static const char *write_policy(const kvp_agent_arch *a, int layers, int kvh, uint64_t seed)
{
    char err[256];
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_alloc(&s, layers, kvh, a, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&s, seed);
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&s);
    return path;
}

static const kvp_agent_arch tiny_arch = {.d = 8, .P = 6, .E = 4, .H = 5, .pmax = 16};

Test(kvp_agent, save_load_round_trip_is_bit_exact)
{
    char err[256];
    kvp_agent_set s, r;
    cr_assert_eq(kvp_agent_set_alloc(&s, 5, 4, &default_arch, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&s, 7);
    /* Values that a decimal round trip would not preserve. */
    s.params[0] = nextafterf(1.0f, 2.0f);
    s.params[1] = -1e-38f;
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);
    kvp_model_config cfg = {.n_layers = 5, .n_kv_heads = 4, .head_dim = 8};
    cr_assert_eq(kvp_agent_set_load(&r, path, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_layers, 5);
    cr_assert_eq(r.n_kv_heads, 4);
    cr_assert_eq(memcmp(&r.arch, &s.arch, sizeof r.arch), 0);
    cr_assert_eq(r.n_params, s.n_params);
    cr_assert_eq(memcmp(r.params, s.params, 20 * s.n_params * sizeof(float)), 0);

    /* Saving what was loaded reproduces the file byte for byte. */
    const char *again = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&r, again, err, sizeof err), 0, "%s", err);
    size_t n1, n2;
    char *b1 = tu_slurp(path, &n1), *b2 = tu_slurp(again, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(b1, b2, n1), 0);
    free(b1);
    free(b2);
    unlink(path);
    unlink(again);
    kvp_agent_set_free(&s);
    kvp_agent_set_free(&r);
}

Test(kvp_agent, file_layout_matches_the_documented_format)
{
    const char *path = write_policy(&tiny_arch, 2, 3, 1);
    size_t len;
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    size_t np = kvp_agent_n_params(&tiny_arch);
    cr_assert_eq(memcmp(b, "KVPPOL\0\1", 8), 0);
    uint32_t want[8] = {2, 2, 3, 8, 6, 4, 5, 16};   /* version, shape, P E H pmax */
    for (int i = 0; i < 8; i++)
        cr_expect_eq(rd32(b + 8 + 4 * i), want[i], "u32 at offset %d", 8 + 4 * i);
    cr_assert_eq(rd64(b + 40), np);
    /* The model: fingerprint and name (an unbound set: 0 and ""), 64 bytes NUL-padded. */
    cr_assert_eq(rd64(b + 48), 0);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(b[56 + i], 0);
    cr_assert_eq(len, 120 + 6 * np * 4 + 8);
    cr_assert_eq(rd64(b + len - 8), fnv1a_ref(b, len - 8));
    /* Documented parameter count: 2Pd + 6P + pmax*E + 2E + H(2P+E) + H*H + 7H + 1. */
    size_t P = 6, E = 4, H = 5, d = 8, pmax = 16;
    cr_assert_eq(np, 2 * P * d + 6 * P + pmax * E + 2 * E + H * (2 * P + E) + H * H + 7 * H + 1);
    free(b);
    unlink(path);
}

/* A set bound to a model's weights loads for that model and for a bare shape, and is
 * refused, naming the model it is for, by another model of the same shape. */
Test(kvp_agent, a_bound_file_loads_only_for_its_model)
{
    char err[512];
    kvp_agent_set s, r;
    cr_assert_eq(kvp_agent_set_alloc(&s, 2, 3, &tiny_arch, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&s, 7);
    s.model_fingerprint = 0x1234567890abcdefull;
    snprintf(s.model_name, sizeof s.model_name, "tiny-chat-v1");
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);
    kvp_model_config cfg = {.n_layers = 2, .n_kv_heads = 3, .head_dim = 8,
                            .fingerprint = 0x1234567890abcdefull};
    cr_assert_eq(kvp_agent_set_load(&r, path, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.model_fingerprint, s.model_fingerprint);
    cr_assert_str_eq(r.model_name, "tiny-chat-v1");
    kvp_agent_set_free(&r);
    cfg.fingerprint = 0;   /* a shape without weights: checked by shape alone */
    cr_assert_eq(kvp_agent_set_load(&r, path, &cfg, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&r);
    cfg.fingerprint = 0x1234567890abcdeeull;
    cr_assert_eq(kvp_agent_set_load(&r, path, &cfg, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "tiny-chat-v1") && strstr(err, "1234567890abcdef") &&
              strstr(err, "kvp learn"), "%s", err);
    cr_assert_null(r.params);
    unlink(path);
    kvp_agent_set_free(&s);
}

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

/* Version 1 (no model in the header) still loads, unbound, with the same parameters. */
Test(kvp_agent, a_version_1_file_still_loads)
{
    char err[512];
    kvp_agent_set s, r;
    cr_assert_eq(kvp_agent_set_alloc(&s, 2, 3, &tiny_arch, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&s, 9);
    s.model_fingerprint = 42;
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);
    size_t len;
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    /* The version-1 layout: the 48 bytes of shape, then the parameters and the checksum. */
    memmove(b + 48, b + 120, len - 120);
    len -= 72;
    wr32(b + 8, 1);
    reseal(b, len);
    const char *v1 = tu_write_tmp(b, len);
    kvp_model_config cfg = {.n_layers = 2, .n_kv_heads = 3, .head_dim = 8, .fingerprint = 99};
    cr_assert_eq(kvp_agent_set_load(&r, v1, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.model_fingerprint, 0);
    cr_assert_eq(memcmp(r.params, s.params, 6 * s.n_params * sizeof(float)), 0);
    kvp_agent_set_free(&r);
    unlink(v1);
    unlink(path);
    free(b);
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

/* Loading buf must fail with a message containing `want`. */
static void expect_bad(const void *buf, size_t len, const char *want, int code)
{
    const char *path = tu_write_tmp(buf, len);
    char err[512] = "";
    kvp_agent_set s;
    int rc = kvp_agent_set_load(&s, path, NULL, err, sizeof err);
    cr_assert_eq(rc, code, "%s: rc %d, expected %d (%s)", want, rc, code, err);
    cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
    cr_assert(strstr(err, path), "message '%s' does not name the file", err);
    cr_assert_null(s.params);
    unlink(path);
}

/* A calibrated set of 2 x 3 agents, K knots each: agent a's scores a + 0, 1, ..., its
 * values (a + 1) x 0, 1, 4, 9, ... */
static void calibrate_tiny(kvp_agent_set *s, int K)
{
    char err[512];
    cr_assert_eq(kvp_agent_set_alloc(s, 2, 3, &tiny_arch, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(s, 3);
    float knots[6 * 2 * 8];
    for (int a = 0; a < 6; a++)
        for (int i = 0; i < K; i++) {
            knots[a * 2 * K + i] = (float)(a + i);
            knots[a * 2 * K + K + i] = (float)((a + 1) * i * i);
        }
    cr_assert_eq(kvp_agent_set_calibration(s, K, knots, err, sizeof err), 0, "%s", err);
}

/* A calibration is written as version 3 (the knot count and knots after the parameters,
 * under the checksum), reads back exactly, and maps scores piecewise-linearly; cleared, the
 * set is written as version 2, byte for byte the uncalibrated file. */
Test(kvp_agent, a_calibrated_file_is_version_3_and_round_trips)
{
    char err[512];
    kvp_agent_set s, r;
    calibrate_tiny(&s, 4);
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);
    size_t len, np = kvp_agent_n_params(&tiny_arch);
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    cr_assert_eq(rd32(b + 8), 3);
    cr_assert_eq(len, 120 + 6 * np * 4 + 4 + 6 * 2 * 4 * 4 + 8);
    cr_assert_eq(rd32(b + 120 + 6 * np * 4), 4);
    cr_assert_eq(rd64(b + len - 8), fnv1a_ref(b, len - 8));
    cr_assert_eq(kvp_agent_set_load(&r, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_knots, 4);
    cr_assert_eq(memcmp(r.knots, s.knots, 6 * 2 * 4 * sizeof(float)), 0);
    cr_assert_eq(memcmp(r.params, s.params, 6 * np * sizeof(float)), 0);
    /* agent (1, 2) = index 5: scores 5..8, values 0, 6, 24, 54 */
    float in[8] = {-3.0f, 5.0f, 5.5f, 7.0f, 7.25f, 100.0f, NAN, -INFINITY}, out[8];
    kvp_agent_calibrate(&r, 1, 2, in, 8, out);
    float want[6] = {0.0f, 0.0f, 3.0f, 24.0f, 24.0f + 0.25f * 30.0f, 54.0f};
    for (int i = 0; i < 6; i++)
        cr_expect_float_eq(out[i], want[i], 1e-5f, "score %g: %g, want %g", in[i], out[i], want[i]);
    cr_expect(isnan(out[6]));
    cr_expect(isinf(out[7]) && out[7] < 0, "a row dropped first stays below every calibrated score");
    kvp_agent_set_free(&r);
    /* cleared: version 2, the same bytes as a set never calibrated */
    cr_assert_eq(kvp_agent_set_calibration(&s, 0, NULL, err, sizeof err), 0, "%s", err);
    kvp_agent_calibrate(&s, 1, 2, in, 6, out);
    for (int i = 0; i < 6; i++)
        cr_expect_eq(out[i], in[i], "without a calibration the raw score");
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);
    size_t len2;
    uint8_t *b2 = (uint8_t *)tu_slurp(path, &len2);
    cr_assert_eq(rd32(b2 + 8), 2);
    cr_assert_eq(len2, 120 + 6 * np * 4 + 8);
    kvp_agent_set u;
    cr_assert_eq(kvp_agent_set_alloc(&u, 2, 3, &tiny_arch, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&u, 3);
    const char *plain = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&u, plain, err, sizeof err), 0, "%s", err);
    size_t len3;
    uint8_t *b3 = (uint8_t *)tu_slurp(plain, &len3);
    cr_assert_eq(len3, len2);
    cr_assert_eq(memcmp(b2, b3, len2), 0);
    free(b), free(b2), free(b3);
    unlink(path), unlink(plain);
    kvp_agent_set_free(&s);
    kvp_agent_set_free(&u);
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

Test(kvp_agent, bad_files_are_rejected_with_a_message)
{
    const char *good = write_policy(&tiny_arch, 2, 2, 1);
    size_t len;
    uint8_t *b = (uint8_t *)tu_slurp(good, &len);
    uint8_t *m = malloc(len + 16);
    unlink(good);

    expect_bad(b, 0, "truncated", -EINVAL);
    expect_bad(b, 20, "truncated", -EINVAL);
    expect_bad(b, 48, "truncated", -EINVAL);
    expect_bad(b, 100, "truncated", -EINVAL);   /* inside the model's name */
    expect_bad(b, len - 1, "truncated", -EINVAL);

    memcpy(m, b, len);
    m[0] = 'G';
    expect_bad(m, len, "bad magic", -EINVAL);

    memcpy(m, b, len);
    wr32(m + 8, 4);
    expect_bad(m, len, "unsupported policy file version 4", -EINVAL);

    memcpy(m, b, len);
    m[100] ^= 0x10;
    expect_bad(m, len, "checksum mismatch", -EBADMSG);
    memcpy(m, b, len);
    m[len - 1] ^= 0x01;
    expect_bad(m, len, "checksum mismatch", -EBADMSG);

    memcpy(m, b, len);
    wr64(m + 40, rd64(b + 40) + 1);
    reseal(m, len);
    expect_bad(m, len, "does not match the sizes", -EINVAL);
    memcpy(m, b, len);
    wr32(m + 44, 1);   /* high half of the u64 count */
    reseal(m, len);
    expect_bad(m, len, "does not match the sizes", -EINVAL);

    /* Sizes out of range, zero, or that would overflow. */
    struct { int off; uint32_t val; const char *want; } absurd[] = {
        {12, 0, "n_layers = 0"},
        {16, 100000, "n_kv_heads = 100000"},
        {20, 0xFFFFFFFFu, "head_dim = 4294967295"},
        {24, 0x80000000u, "width P = 2147483648"},
        {28, 0, "position dim E = 0"},
        {32, 70000, "hidden H = 70000"},
        {36, 1u << 30, "pmax = 1073741824"},
    };
    for (size_t i = 0; i < sizeof absurd / sizeof absurd[0]; i++) {
        memcpy(m, b, len);
        wr32(m + absurd[i].off, absurd[i].val);
        reseal(m, len);
        expect_bad(m, len, absurd[i].want, -EINVAL);
    }
    /* Huge but in range, with a consistent count: rejected by size, before allocating. */
    kvp_agent_arch huge = {.d = 4096, .P = 65536, .E = 65536, .H = 65536, .pmax = 1 << 24};
    memcpy(m, b, len);
    wr32(m + 12, 4096);
    wr32(m + 16, 4096);
    wr32(m + 20, 4096);
    wr32(m + 24, 65536);
    wr32(m + 28, 65536);
    wr32(m + 32, 65536);
    wr32(m + 36, 1u << 24);
    wr64(m + 40, kvp_agent_n_params(&huge));
    reseal(m, len);
    expect_bad(m, len, "truncated", -EINVAL);

    memcpy(m, b, len);
    memset(m + len, 0, 16);
    expect_bad(m, len + 16, "16 trailing bytes", -EINVAL);

    memcpy(m, b, len);
    float nan = NAN;
    memcpy(m + 120 + 4 * 7, &nan, 4);
    reseal(m, len);
    expect_bad(m, len, "not finite", -EINVAL);

    char err[256] = "";
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_load(&s, "/tmp", NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "not a regular file"), "%s", err);
    cr_assert_eq(kvp_agent_set_load(&s, "/nonexistent/policy.kvp", NULL, err, sizeof err),
                 -ENOENT);
    cr_assert(strstr(err, "/nonexistent/policy.kvp"), "%s", err);
    free(b);
    free(m);
}

Test(kvp_agent, shape_mismatch_names_both_shapes)
{
    const char *path = write_policy(&tiny_arch, 5, 4, 1);
    char err[512] = "";
    kvp_agent_set s;
    kvp_model_config cfg = {.n_layers = 6, .n_kv_heads = 2, .head_dim = 16};
    cr_assert_eq(kvp_agent_set_load(&s, path, &cfg, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "policy file is for 5 layers x 4 KV heads x head_dim 8, "
                          "model has 6 layers x 2 KV heads x head_dim 16"), "%s", err);
    /* head_dim alone differing is a mismatch too. */
    cfg = (kvp_model_config){.n_layers = 5, .n_kv_heads = 4, .head_dim = 16};
    cr_assert_eq(kvp_agent_set_load(&s, path, &cfg, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "head_dim 16"), "%s", err);
    unlink(path);
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

Test(kvp_agent, policy_scores_inserted_rows)
{
    const char *path = write_policy(&default_arch, 5, 4, 11);
    kvp_policy p = {.cfg = {.n_layers = 5, .n_kv_heads = 4, .head_dim = 8, .n_heads = 8}};
    char err[256];
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_load(&s, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_policy_create(&p, path, err, sizeof err), 0, "%s", err);
    unlink(path);
    cr_assert_str_eq(p.ops->name, "kvp");
    cr_assert_eq(p.ops->wants_attention, 0);
    cr_assert_not_null(p.ops->before_evict);
    /* the newest half of the budget is protected, never less than the default window;
     * with a known context the agents choose at most an eighth of it (the rest of a
     * large budget is the newest rows) */
    p.n_recent = KVP_DEFAULT_RECENT;
    cr_assert_eq(p.ops->recent_window(&p, 256), 128);
    cr_assert_eq(p.ops->recent_window(&p, 33), KVP_DEFAULT_RECENT);
    cr_assert_eq(p.ops->recent_window(&p, 40), 20);
    p.cfg.seq_len = 512;
    cr_assert_eq(p.ops->recent_window(&p, 32), KVP_DEFAULT_RECENT);
    cr_assert_eq(p.ops->recent_window(&p, 128), 64);
    cr_assert_eq(p.ops->recent_window(&p, 200), 136);
    cr_assert_eq(p.ops->recent_window(&p, 256), 192);
    cr_assert_eq(p.ops->recent_window(&p, 448), 384);
    p.cfg.seq_len = 0;

    /* A head with more rows than one scoring block, inserted as 1 row, then 599. */
    enum { N = 600, D = 8 };
    float *k = malloc(N * D * sizeof(float)), *v = malloc(N * D * sizeof(float));
    float *score = calloc(N, sizeof(float)), *stat = calloc(N, sizeof(float)), want[N];
    int32_t *pos = malloc(N * sizeof(int32_t));
    int64_t *seq = malloc(N * sizeof(int64_t));
    fill(k, N * D, 2.0f);
    fill(v, N * D, 1.0f);
    for (int i = 0; i < N; i++)
        pos[i] = i, seq[i] = i;
    kvp_head h = {.n = N, .cap = N, .k = k, .v = v, .pos = pos, .seq = seq, .score = score,
                  .stat = stat};
    /* scoring is deferred to the eviction, batched over the rows not yet scored */
    p.ops->on_insert(&p, 3, 2, &h, 0, 1);
    cr_assert(isnan(score[0]), "row 0 scored at insertion");
    h.n = 1;
    p.ops->before_evict(&p, 3, 2, &h);
    float first = score[0];
    cr_assert(!isnan(first));
    h.n = N;
    p.ops->on_insert(&p, 3, 2, &h, 1, N - 1);
    p.ops->before_evict(&p, 3, 2, &h);
    cr_assert_eq(score[0], first, "a scored row is never rescored");

    float *work = malloc(kvp_agent_score_work(&s.arch, N) * sizeof(float));
    kvp_agent_score(&s.arch, kvp_agent_set_params(&s, 3, 2), k, v, pos, N, want, work);
    for (int i = 0; i < N; i++)
        cr_assert_float_eq(score[i], want[i], 1e-5f * (1.0f + fabsf(want[i])), "row %d", i);
    /* Another agent gives other scores. */
    kvp_agent_score(&s.arch, kvp_agent_set_params(&s, 0, 0), k, v, pos, N, want, work);
    cr_assert_neq(memcmp(score, want, sizeof want), 0);

    /* A context shift moves the positions of rows 4.. (keys re-rotated with them): their
     * scores went stale and are recomputed on the new positions; the sinks' stay. */
    float before[N];
    memcpy(before, score, sizeof before);
    for (int i = 4; i < N; i++)
        pos[i] = 4 + (i - 4) / 2;
    p.ops->before_evict(&p, 3, 2, &h);
    kvp_agent_score(&s.arch, kvp_agent_set_params(&s, 3, 2), k, v, pos, N, want, work);
    for (int i = 0; i < N; i++)
        cr_assert_float_eq(score[i], want[i], 1e-5f * (1.0f + fabsf(want[i])), "row %d", i);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(score[i], before[i], "sink %d rescored", i);
    int moved = 0;
    for (int i = 4; i < N; i++)
        moved += score[i] != before[i];
    cr_assert_gt(moved, N / 2, "only %d rows got new scores after the shift", moved);

    /* Rows that would leave the model's window (seq_len - 1 tokens) within the next
     * eviction chunk (32 tokens) rank last; the rest keep their scores. */
    p.cfg.seq_len = 400;
    memcpy(before, score, sizeof before);
    p.ops->before_evict(&p, 3, 2, &h);
    for (int i = 0; i < N; i++) {
        if (N - 1 - i >= 400 - 1 - 32)
            cr_assert(isinf(score[i]) && score[i] < 0, "row %d (age %d): %g", i, N - 1 - i,
                      score[i]);
        else
            cr_assert_eq(score[i], before[i], "row %d (age %d)", i, N - 1 - i);
    }

    p.ops->destroy(&p);
    cr_assert_null(p.impl);
    kvp_agent_set_free(&s);
    free(work);
    free(k);
    free(v);
    free(score);
    free(stat);
    free(pos);
    free(seq);
}

/* Through the shared rank-and-keep, as the daemon and kvp eval evict: a 384-row head of
 * a 512-token model compressed to 256 keeps the 4 sinks, the newest 192 rows whatever
 * their scores, and the agents' 60 best of the rows in between. */
Test(kvp_agent, a_large_budget_keeps_the_newest_rows_and_the_agents_best_older_ones)
{
    enum { N = 384, B = 256, D = 8, WINDOW = 192, SINKS = 4 };
    const char *path = write_policy(&default_arch, 1, 1, 5);
    kvp_policy *p;
    kvp_model_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = D, .n_heads = 1,
                            .seq_len = 512};
    char err[256];
    cr_assert_eq(kvp_policy_create(&p, "kvp", path, &cfg, 1, err, sizeof err), 0, "%s", err);
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_load(&s, path, NULL, err, sizeof err), 0, "%s", err);
    unlink(path);
    kvp_cache c;
    kvp_rope rope = {.n_rot = D, .base = 10000.0f};
    cr_assert_eq(kvp_cache_init(&c, 1, 1, D, &rope), 0);
    kvp_head *h = kvp_cache_head(&c, 0, 0);
    cr_assert_eq(kvp_head_reserve(h, D, N), 0);
    fill(h->k, N * D, 2.0f);
    fill(h->v, N * D, 1.0f);
    for (int i = 0; i < N; i++)
        h->pos[i] = i, h->seq[i] = i;
    h->n = N;
    p->ops->on_insert(p, 0, 0, h, 0, N);
    /* the agents' scores of the rows between the sinks and the window */
    float want[N], *work = malloc(kvp_agent_score_work(&s.arch, N) * sizeof(float));
    kvp_agent_score(&s.arch, kvp_agent_set_params(&s, 0, 0), h->k, h->v, h->pos, N, want, work);
    float mid[N - SINKS - WINDOW];
    memcpy(mid, want + SINKS, sizeof mid);
    int n_mid = N - SINKS - WINDOW, slots = B - SINKS - WINDOW;
    /* the slots-th best score of the middle: the agents keep the rows at or above it */
    for (int i = 0; i < slots; i++)
        for (int j = i + 1; j < n_mid; j++)
            if (mid[j] > mid[i]) {
                float t = mid[i];
                mid[i] = mid[j], mid[j] = t;
            }
    float cut = mid[slots - 1];

    cr_assert_eq(kvp_policy_evict_head(p, &c, 0, 0, B), N - B);
    cr_assert_eq(h->n, B);
    char kept[N] = {0};
    for (int i = 0; i < h->n; i++)
        kept[h->seq[i]] = 1;
    for (int r = 0; r < N; r++) {
        if (r < SINKS || r >= N - WINDOW)
            cr_assert(kept[r], "protected row %d dropped", r);
        else if (want[r] > cut)
            cr_assert(kept[r], "row %d (score %g above the %d-th best %g) dropped", r,
                      want[r], slots, cut);
        else if (want[r] < cut)
            cr_assert(!kept[r], "row %d (score %g below the %d-th best %g) kept", r, want[r],
                      slots, cut);
    }
    free(work);
    kvp_cache_free(&c);
    kvp_agent_set_free(&s);
    kvp_policy_destroy(p);
}

Test(kvp_agent, policy_create_reports_mismatch_and_missing_file)
{
    const char *path = write_policy(&tiny_arch, 5, 4, 1);
    kvp_policy p = {.cfg = {.n_layers = 8, .n_kv_heads = 4, .head_dim = 8}};
    char err[512] = "";
    cr_assert_eq(kvp_agent_policy_create(&p, path, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "model has 8 layers x 4 KV heads x head_dim 8"), "%s", err);
    cr_assert_null(p.ops);
    cr_assert_null(p.impl);
    unlink(path);
    cr_assert_lt(kvp_agent_policy_create(&p, NULL, err, sizeof err), 0);
    cr_assert(strstr(err, "policy file"), "%s", err);
    cr_assert_eq(kvp_agent_policy_create(&p, "/nonexistent.kvp", err, sizeof err), -ENOENT);
}

/* One head of n rows from a fixed stream, for scoring. */
enum { SH_N = 700, SH_D = 8 };
typedef struct shared_head {
    float k[SH_N * SH_D], v[SH_N * SH_D], score[SH_N], stat[SH_N];
    int32_t pos[SH_N];
    int64_t seq[SH_N];
    kvp_head h;
} shared_head;

static void shared_head_init(shared_head *x)
{
    rng_state = 777;
    fill(x->k, SH_N * SH_D, 2.0f);
    fill(x->v, SH_N * SH_D, 1.0f);
    for (int i = 0; i < SH_N; i++)
        x->pos[i] = i, x->seq[i] = i;
    x->h = (kvp_head){.n = SH_N, .cap = SH_N, .k = x->k, .v = x->v, .pos = x->pos,
                      .seq = x->seq, .score = x->score, .stat = x->stat};
}

static void score_all(kvp_policy *p, shared_head *x, int layer, int kvh)
{
    p->ops->on_insert(p, layer, kvh, &x->h, 0, SH_N);
    p->ops->before_evict(p, layer, kvh, &x->h);
}

typedef struct scorer {
    kvp_policy *p;
    shared_head x;
} scorer;

static void *score_thread(void *arg)
{
    scorer *sc = arg;
    shared_head_init(&sc->x);
    for (int r = 0; r < 20; r++)
        score_all(sc->p, &sc->x, 3, 1);
    return NULL;
}

/* Weights loaded once (kvp_policy_weights_load: the file is read once, whatever the
 * number of instances) give every instance made on them the scores of an instance that
 * loaded the file itself, also with instances scoring on several threads at once (each
 * thread has its own scratch); a model of another shape is refused naming both. */
Test(kvp_agent, instances_on_shared_weights_score_as_one_that_loaded_the_file)
{
    const char *path = write_policy(&default_arch, 5, 4, 23);
    kvp_model_config cfg = {.n_layers = 5, .n_kv_heads = 4, .head_dim = 8, .n_heads = 8};
    char err[512];
    kvp_policy *own, *shared[4];
    cr_assert_eq(kvp_policy_create(&own, "kvp", path, &cfg, 1, err, sizeof err), 0, "%s", err);
    unsigned long long loads = kvp_agent_set_loads();
    kvp_policy_weights *w;
    cr_assert_eq(kvp_policy_weights_load(&w, "kvp", path, &cfg, err, sizeof err), 0, "%s", err);
    unlink(path);   /* the instances below never read it */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(kvp_policy_create_shared(&shared[i], w, &cfg, (uint64_t)i, err, sizeof err),
                     0, "%s", err);
    cr_assert_eq(kvp_agent_set_loads(), loads + 1, "one read for four instances");
    cr_assert_str_eq(shared[0]->ops->name, "kvp");

    static shared_head want;
    shared_head_init(&want);
    score_all(own, &want, 3, 1);
    static scorer sc[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        sc[i].p = shared[i];
        cr_assert_eq(pthread_create(&th[i], NULL, score_thread, &sc[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        for (int j = 0; j < SH_N; j++)
            cr_assert_eq(memcmp(&sc[i].x.score[j], &want.score[j], sizeof(float)), 0,
                         "instance %d row %d: %g, want %g", i, j, sc[i].x.score[j], want.score[j]);
    }
    for (int j = 0; j < SH_N; j++)
        cr_assert(isfinite(want.score[j]), "row %d scored", j);

    kvp_model_config other = cfg;
    other.n_layers = 6;
    kvp_policy *bad = NULL;
    cr_assert_eq(kvp_policy_create_shared(&bad, w, &other, 0, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "model has 6 layers"), "%s", err);
    cr_assert_null(bad);
    for (int i = 0; i < 4; i++)
        kvp_policy_destroy(shared[i]);
    kvp_policy_destroy(own);
    kvp_policy_weights_free(w);

    /* a policy without a file keeps only its name; a bad name fails at the load */
    cr_assert_eq(kvp_policy_weights_load(&w, "streaming", NULL, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_policy_create_shared(&bad, w, &cfg, 0, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(bad->ops->name, "streaming");
    kvp_policy_destroy(bad);
    kvp_policy_weights_free(w);
    cr_assert_eq(kvp_policy_weights_load(&w, "no-such", NULL, &cfg, err, sizeof err), -EINVAL);
    cr_assert_null(w);
    cr_assert(strstr(err, "unknown policy"), "%s", err);
}

/* ---- kvp policy-init (needs the kvp executable from the full build) */

static int run_init(const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s policy-init %s 2>&1", tu_build("tools/kvp"), args);
    return tu_run(cmd, out);
}

Test(kvp_agent, policy_init_writes_a_loadable_deterministic_file)
{
    const char *p1 = tmp_path(), *p2 = tmp_path(), *p3 = tmp_path();
    char args[2048], *out;
    char model[1024];   /* tu_shared's buffers rotate: keep a copy */
    snprintf(model, sizeof model, "%s", tu_shared("models/stories260K.gguf"));
    snprintf(args, sizeof args, "--model %s --out %s --seed 9", model, p1);
    cr_assert_eq(run_init(args, &out), 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "--model %s --out %s --seed 9", model, p2);
    cr_assert_eq(run_init(args, &out), 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "--model %s --out %s --seed 10 --width 16 --hidden 24 "
             "--pos-dim 8 --pos-max 128", model, p3);
    cr_assert_eq(run_init(args, &out), 0, "%s", out);
    free(out);

    size_t n1, n2;
    char *b1 = tu_slurp(p1, &n1), *b2 = tu_slurp(p2, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(b1, b2, n1), 0);
    free(b1);
    free(b2);

    kvp_model_config cfg = {.n_layers = 5, .n_kv_heads = 4, .head_dim = 8};
    kvp_agent_set s;
    char err[512];
    cr_assert_eq(kvp_agent_set_load(&s, p1, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(&s.arch, &default_arch, sizeof s.arch), 0);
    kvp_agent_set_free(&s);
    cr_assert_eq(kvp_agent_set_load(&s, p3, &cfg, err, sizeof err), 0, "%s", err);
    kvp_agent_arch want = {.d = 8, .P = 16, .E = 8, .H = 24, .pmax = 128};
    cr_assert_eq(memcmp(&s.arch, &want, sizeof want), 0);
    kvp_agent_set_free(&s);
    unlink(p1);
    unlink(p2);
    unlink(p3);
}

Test(kvp_agent, policy_init_usage_and_runtime_errors)
{
    char args[2048], *out;
    char model[1024];   /* tu_shared's buffers rotate: keep a copy */
    snprintf(model, sizeof model, "%s", tu_shared("models/stories260K.gguf"));
    const char *usage[] = {
        "",
        "--out /tmp/x.kvp",
        "--model m.gguf",
        "--model m.gguf --out /tmp/x.kvp --width 0",
        "--model m.gguf --out /tmp/x.kvp --hidden 12abc",
        "--model m.gguf --out /tmp/x.kvp --pos-max 99999999999",
        "--model m.gguf --out /tmp/x.kvp --seed -1",
        "--model m.gguf --out /tmp/x.kvp --bogus",
        "--model m.gguf --out",
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        cr_assert_eq(run_init(usage[i], &out), 2, "'%s': %s", usage[i], out);
        cr_assert_neq(strlen(out), 0, "'%s' printed nothing", usage[i]);
        free(out);
    }
    cr_assert_eq(run_init("--help", &out), 0);
    cr_assert(strstr(out, "--pos-max"), "%s", out);
    free(out);

    cr_assert_eq(run_init("--model /nonexistent.gguf --out /tmp/never.kvp", &out), 1);
    cr_assert(strstr(out, "/nonexistent.gguf"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "--model %s --out /nonexistent-dir/x.kvp", model);
    cr_assert_eq(run_init(args, &out), 1);
    cr_assert(strstr(out, "/nonexistent-dir/x.kvp"), "%s", out);
    free(out);
}
