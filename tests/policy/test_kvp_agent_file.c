/* policy/kvp_agent_file.c: the policy file format, written and read, and every damaged
 * or mismatched file refused with a message. */
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

Test(kvp_agent_file, save_load_round_trip_is_bit_exact)
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

Test(kvp_agent_file, file_layout_matches_the_documented_format)
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
Test(kvp_agent_file, a_bound_file_loads_only_for_its_model)
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

/* Version 1 (no model in the header) still loads, unbound, with the same parameters. */
Test(kvp_agent_file, a_version_1_file_still_loads)
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

/* A calibration is written as version 3 (the knot count and knots after the parameters,
 * under the checksum), reads back exactly, and maps scores piecewise-linearly; cleared, the
 * set is written as version 2, byte for byte the uncalibrated file. */
Test(kvp_agent_file, a_calibrated_file_is_version_3_and_round_trips)
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

/* Centred keys: version 4, with the input flags after the version-2 header and the
 * calibration section always there (0 knots when none); both round trip, and damaged
 * version-4 files are refused. */
Test(kvp_agent_file, a_centred_file_is_version_4_and_round_trips)
{
    char err[512];
    kvp_agent_arch ca = tiny_arch;
    ca.centered = 1;
    size_t np = kvp_agent_n_params(&ca);
    kvp_agent_set u, r;
    cr_assert_eq(kvp_agent_set_alloc(&u, 2, 3, &ca, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&u, 3);
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&u, path, err, sizeof err), 0, "%s", err);
    size_t len;
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    cr_assert_eq(rd32(b + 8), 4);
    cr_assert_eq(rd32(b + 120), 1, "input flags: centred keys");
    cr_assert_eq(len, 124 + 6 * np * 4 + 4 + 8);
    cr_assert_eq(rd32(b + 124 + 6 * np * 4), 0, "no calibration: 0 knots");
    cr_assert_eq(rd64(b + len - 8), fnv1a_ref(b, len - 8));
    cr_assert_eq(kvp_agent_set_load(&r, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.arch.centered, 1);
    cr_assert_eq(r.n_knots, 0);
    cr_assert_eq(memcmp(r.params, u.params, 6 * np * sizeof(float)), 0);
    kvp_agent_set_free(&r);

    uint8_t *m = malloc(len + 16);
    memcpy(m, b, len);
    wr32(m + 120, 9);   /* bit 3: no such input */
    reseal(m, len);
    expect_bad(m, len, "unknown input flags", -EINVAL);
    memcpy(m, b, len);
    wr32(m + 124 + 6 * np * 4, 2);   /* 2 knots the file does not hold */
    reseal(m, len);
    expect_bad(m, len, "calibration of 2 knots", -EINVAL);
    expect_bad(b, len - 12, "truncated", -EINVAL);   /* no room for the knot count */
    free(m);
    free(b);

    /* calibrated and centred: the knots after the count, and both kept */
    kvp_agent_set s;
    calibrate_tiny(&s, 4);
    s.arch.centered = 1;
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);
    b = (uint8_t *)tu_slurp(path, &len);
    cr_assert_eq(rd32(b + 8), 4);
    cr_assert_eq(len, 124 + 6 * np * 4 + 4 + 6 * 2 * 4 * 4 + 8);
    cr_assert_eq(kvp_agent_set_load(&r, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.arch.centered, 1);
    cr_assert_eq(r.n_knots, 4);
    cr_assert_eq(memcmp(r.knots, s.knots, 6 * 2 * 4 * sizeof(float)), 0);
    free(b);
    unlink(path);
    kvp_agent_set_free(&r);
    kvp_agent_set_free(&s);
    kvp_agent_set_free(&u);
}

/* Fitted caps: flag bit 2 and the caps block after the flags (and after the rotation
 * block when there is one): u32 n_budgets, u32 budgets[n], u32 caps[n_layers][n], under
 * the checksum; a set with caps is version 4 whatever its keys. A layer's cap at a budget
 * is the table's entry of the largest fitted budget at or below it (0 and budgets below
 * the table: an eighth of the context). Bad tables and files cut in the block are refused. */
Test(kvp_agent_file, fitted_caps_round_trip_and_are_checked)
{
    char err[512];
    size_t np = kvp_agent_n_params(&tiny_arch);
    kvp_agent_set u, r;
    cr_assert_eq(kvp_agent_set_alloc(&u, 2, 3, &tiny_arch, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&u, 9);
    cr_assert_eq(kvp_agent_set_cap(&u, 1, 256, 512), 64, "no caps: an eighth of the context");
    int budgets[2] = {64, 256};
    int bad[4] = {12, 0, 5, -1};
    cr_assert_eq(kvp_agent_set_caps(&u, 2, budgets, bad, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "layer 1") && strstr(err, "budget 256"), "%s", err);
    int desc[2] = {256, 64}, caps[4] = {12, 0, 0, 48};
    cr_assert_eq(kvp_agent_set_caps(&u, 2, desc, caps, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "not above"), "%s", err);
    cr_assert_eq(kvp_agent_set_caps(&u, 0, budgets, caps, err, sizeof err), -EINVAL);
    cr_assert_null(u.caps, "a refused table leaves none");
    cr_assert_eq(kvp_agent_set_caps(&u, 2, budgets, caps, err, sizeof err), 0, "%s", err);
    caps[0] = 99;   /* the set holds its own copy */
    budgets[0] = 65;
    /* layer 0: 12 from budget 64 up, the default from 256; layer 1: the default up to 255,
     * 48 from 256 */
    cr_assert_eq(kvp_agent_set_cap(&u, 0, 32, 512), 64, "below the table: the default");
    cr_assert_eq(kvp_agent_set_cap(&u, 0, 64, 512), 12);
    cr_assert_eq(kvp_agent_set_cap(&u, 0, 200, 512), 12);
    cr_assert_eq(kvp_agent_set_cap(&u, 0, 256, 4096), 512, "0: the default of the context");
    cr_assert_eq(kvp_agent_set_cap(&u, 1, 128, 512), 64);
    cr_assert_eq(kvp_agent_set_cap(&u, 1, 1000, 512), 48, "past the table: its last budget's");
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&u, path, err, sizeof err), 0, "%s", err);
    size_t len;
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    cr_assert_eq(rd32(b + 8), 4, "caps need version 4");
    cr_assert_eq(rd32(b + 120), 4, "flags: caps only");
    cr_assert_eq(rd32(b + 124), 2);
    cr_assert_eq(rd32(b + 128), 64);
    cr_assert_eq(rd32(b + 132), 256);
    cr_assert_eq(rd32(b + 136), 12);
    cr_assert_eq(rd32(b + 140), 0);
    cr_assert_eq(rd32(b + 144), 0);
    cr_assert_eq(rd32(b + 148), 48);
    cr_assert_eq(len, 152 + 6 * np * 4 + 4 + 8);
    cr_assert_eq(rd64(b + len - 8), fnv1a_ref(b, len - 8));
    cr_assert_eq(kvp_agent_set_load(&r, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n_cap_budgets, 2);
    cr_assert_eq(r.cap_budgets[1], 256);
    cr_assert_eq(memcmp(r.caps, (int[]){12, 0, 0, 48}, sizeof caps), 0);
    cr_assert_eq(r.arch.centered, 0);
    cr_assert_eq(memcmp(r.params, u.params, 6 * np * sizeof(float)), 0);
    /* the "kvp" policy's window follows the layer's cap at the budget */
    kvp_policy p = {.cfg = {.n_layers = 2, .n_kv_heads = 3, .head_dim = 8, .n_heads = 3,
                            .seq_len = 512},
                    .n_recent = KVP_DEFAULT_RECENT};
    cr_assert_eq(kvp_agent_policy_create_shared(&p, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(p.ops->recent_window(&p, 0, 128), 116);
    cr_assert_eq(p.ops->recent_window(&p, 0, 256), 192, "the default again at 256");
    cr_assert_eq(p.ops->recent_window(&p, 1, 128), 64);
    cr_assert_eq(p.ops->recent_window(&p, 1, 256), 208);
    cr_assert_eq(p.ops->recent_window(&p, 0, 32), 16, "below the table");
    p.ops->destroy(&p);
    kvp_agent_set_free(&r);

    uint8_t *m = malloc(len);
    memcpy(m, b, len);
    wr32(m + 148, 1u << 25);   /* a cap past the limit */
    reseal(m, len);
    expect_bad(m, len, "layer 1's cap", -EINVAL);
    memcpy(m, b, len);
    wr32(m + 132, 64);   /* budgets not ascending */
    reseal(m, len);
    expect_bad(m, len, "not above", -EINVAL);
    memcpy(m, b, len);
    wr32(m + 124, 17);   /* more budgets than a table holds */
    reseal(m, len);
    expect_bad(m, len, "17 budgets", -EINVAL);
    memcpy(m, b, len);
    wr32(m + 124, 0x40000000u);   /* a count whose block would pass the file */
    reseal(m, len);
    expect_bad(m, len, "budgets", -EINVAL);
    memcpy(m, b, len);
    m[137] ^= 1;   /* the caps are under the checksum */
    expect_bad(m, len, "checksum", -EBADMSG);
    expect_bad(b, 126, "truncated", -EINVAL);
    expect_bad(b, 140, "truncated", -EINVAL);
    free(m);
    free(b);
    unlink(path);

    /* with relative keys the block follows the rotation block */
    kvp_agent_arch ra = tiny_arch;
    ra.relative = 1;
    kvp_agent_set w;
    cr_assert_eq(kvp_agent_set_alloc(&w, 2, 3, &ra, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&w, 4);
    kvp_rope plain = {.n_rot = 8, .neox = 0, .base = 10000.0f};
    cr_assert_eq(kvp_agent_set_rope(&w, &plain, err, sizeof err), 0, "%s", err);
    int one[2] = {7, 9};
    cr_assert_eq(kvp_agent_set_caps(&w, 1, (int[]){128}, one, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_save(&w, path, err, sizeof err), 0, "%s", err);
    b = (uint8_t *)tu_slurp(path, &len);
    cr_assert_eq(rd32(b + 120), 6, "flags: relative keys and caps");
    cr_assert_eq(rd32(b + 140), 1);
    cr_assert_eq(rd32(b + 144), 128);
    cr_assert_eq(rd32(b + 148), 7);
    cr_assert_eq(rd32(b + 152), 9);
    cr_assert_eq(kvp_agent_set_load(&r, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_cap(&r, 1, 128, 512), 9);
    cr_assert(kvp_rope_same(&r.rope, &plain));
    /* clearing them writes the file without the block */
    cr_assert_eq(kvp_agent_set_caps(&r, 0, NULL, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_save(&r, path, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&r);
    cr_assert_eq(kvp_agent_set_load(&r, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_null(r.caps);
    cr_assert_eq(r.n_cap_budgets, 0);
    free(b);
    unlink(path);
    kvp_agent_set_free(&r);
    kvp_agent_set_free(&w);
    kvp_agent_set_free(&u);
}

/* Relative keys: flag bit 1 and the rotation block after the flags, the factors a copy of
 * the set's; a damaged block is refused, and a loaded model must rotate the same way. */
Test(kvp_agent_file, a_relative_file_carries_its_rotation)
{
    char err[512];
    kvp_agent_arch ra = tiny_arch;
    ra.centered = 1;
    ra.relative = 1;
    size_t np = kvp_agent_n_params(&ra);
    kvp_agent_set u, r;
    cr_assert_eq(kvp_agent_set_alloc(&u, 2, 3, &ra, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&u, 5);
    float factors[4] = {1.0f, 2.0f, 4.0f, 8.0f}, ff[4];
    memcpy(ff, factors, sizeof ff);
    kvp_rope rope = {.n_rot = 8, .neox = 1, .base = 500000.0f, .factors = ff};
    cr_assert_eq(kvp_agent_set_rope(&u, &rope, err, sizeof err), 0, "%s", err);
    ff[0] = 99.0f;   /* the set holds its own copy */
    u.model_fingerprint = 0x77;
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&u, path, err, sizeof err), 0, "%s", err);
    size_t len;
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    cr_assert_eq(rd32(b + 8), 4);
    cr_assert_eq(rd32(b + 120), 3, "input flags: centred and relative keys");
    cr_assert_eq(rd32(b + 124), 8);
    cr_assert_eq(rd32(b + 128), 1);
    float base;
    memcpy(&base, b + 132, 4);
    cr_assert_eq(base, 500000.0f);
    cr_assert_eq(rd32(b + 136), 4);
    cr_assert_eq(memcmp(b + 140, factors, sizeof factors), 0);
    size_t params_at = 140 + sizeof factors;
    cr_assert_eq(len, params_at + 6 * np * 4 + 4 + 8);
    cr_assert_eq(rd64(b + len - 8), fnv1a_ref(b, len - 8));

    kvp_model_config cfg = {.n_layers = 2, .n_kv_heads = 3, .head_dim = 8, .fingerprint = 0x77,
                            .rope = {.n_rot = 8, .neox = 1, .base = 500000.0f, .factors = factors}};
    cr_assert_eq(kvp_agent_set_load(&r, path, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.arch.relative, 1);
    cr_assert_eq(r.arch.centered, 1);
    cr_assert(kvp_rope_same(&r.rope, &cfg.rope));
    cr_assert_eq(memcmp(r.params, u.params, 6 * np * sizeof(float)), 0);
    kvp_agent_set_free(&r);
    /* another rotation in the model's metadata: refused, both named */
    cfg.rope.base = 10000.0f;
    cr_assert_eq(kvp_agent_set_load(&r, path, &cfg, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "500000") && strstr(err, "10000") && strstr(err, "kvp learn"), "%s", err);
    cfg.rope.base = 500000.0f;
    cfg.rope.factors = NULL;
    cr_assert_eq(kvp_agent_set_load(&r, path, &cfg, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "with factors"), "%s", err);
    cfg.fingerprint = 0;   /* a shape without a model (a trace's): no rotation to compare */
    cr_assert_eq(kvp_agent_set_load(&r, path, &cfg, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&r);

    uint8_t *m = malloc(len);
    memcpy(m, b, len);
    wr32(m + 124, 7);   /* odd rotated dims */
    reseal(m, len);
    expect_bad(m, len, "RoPE", -EINVAL);
    memcpy(m, b, len);
    wr32(m + 124, 16);   /* more than head_dim */
    reseal(m, len);
    expect_bad(m, len, "does not fit head_dim", -EINVAL);
    memcpy(m, b, len);
    wr32(m + 136, 3);   /* neither 0 nor n_rot / 2 factors */
    reseal(m, len);
    expect_bad(m, len, "does not fit head_dim", -EINVAL);
    memcpy(m, b, len);
    float bad = -1.0f;
    memcpy(m + 132, &bad, 4);   /* a negative base */
    reseal(m, len);
    expect_bad(m, len, "base", -EINVAL);
    memcpy(m, b, len);
    bad = NAN;
    memcpy(m + 144, &bad, 4);   /* a factor that is not a number */
    reseal(m, len);
    expect_bad(m, len, "factor 1", -EINVAL);
    memcpy(m, b, len);
    m[133] ^= 0x40;   /* the block is under the checksum */
    expect_bad(m, len, "checksum", -EBADMSG);
    expect_bad(b, 130, "truncated", -EINVAL);
    expect_bad(b, 142, "truncated", -EINVAL);
    expect_bad(b, params_at + 4, "truncated", -EINVAL);
    free(m);
    free(b);
    unlink(path);

    /* without factors: an empty factor list, and the round trip keeps it empty */
    kvp_rope plain = {.n_rot = 4, .neox = 0, .base = 10000.0f, .factors = NULL};
    cr_assert_eq(kvp_agent_set_rope(&u, &plain, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_save(&u, path, err, sizeof err), 0, "%s", err);
    b = (uint8_t *)tu_slurp(path, &len);
    cr_assert_eq(rd32(b + 136), 0);
    cr_assert_eq(len, 140 + 6 * np * 4 + 4 + 8);
    cr_assert_eq(kvp_agent_set_load(&r, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert(kvp_rope_same(&r.rope, &plain));
    kvp_agent_set_free(&r);
    free(b);
    unlink(path);
    /* a rotation that is not one of the set's head_dim is refused before it is stored */
    kvp_rope wide = {.n_rot = 10, .neox = 0, .base = 10000.0f};
    cr_assert_eq(kvp_agent_set_rope(&u, &wide, err, sizeof err), -EINVAL);
    cr_assert(kvp_rope_same(&u.rope, &plain), "a refused rotation leaves the set's");
    kvp_agent_set_free(&u);
}

Test(kvp_agent_file, bad_files_are_rejected_with_a_message)
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
    wr32(m + 8, 5);
    expect_bad(m, len, "unsupported policy file version 5", -EINVAL);

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

Test(kvp_agent_file, shape_mismatch_names_both_shapes)
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
