/* Tests for model/quant.c: f16 conversion, Q8_0, type sizes and names. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/quant.h"
#include "testutil.h"

Test(quant, f16_known_values)
{
    static const struct { float f; uint16_t h; } known[] = {
        {1.0f, 0x3c00}, {-2.0f, 0xc000}, {0.5f, 0x3800}, {65504.0f, 0x7bff},
        {0x1p-24f, 0x0001},                /* smallest subnormal */
        {1023 * 0x1p-24f, 0x03ff},         /* largest subnormal */
        {0x1p-14f, 0x0400},                /* smallest normal */
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        cr_expect_eq(kvp_f32_to_f16(known[i].f), known[i].h, "f32 %g -> %#x, want %#x",
                     (double)known[i].f, kvp_f32_to_f16(known[i].f), known[i].h);
        float back = kvp_f16_to_f32(known[i].h);
        cr_expect(memcmp(&back, &known[i].f, sizeof back) == 0, "f16 %#x -> %g, want %g",
                  known[i].h, (double)back, (double)known[i].f);
    }
}

Test(quant, f16_nan)
{
    cr_expect(isnan(kvp_f16_to_f32(0x7e00)));
    cr_expect(isnan(kvp_f16_to_f32(0xfc01)));
    uint16_t h = kvp_f32_to_f16(NAN);
    cr_expect((h & 0x7c00) == 0x7c00 && (h & 0x3ff), "nan -> %#x", h);
    /* a nan whose payload sits only in the low bits must not become inf */
    uint32_t bits = 0x7f800001u;
    float f;
    memcpy(&f, &bits, sizeof f);
    h = kvp_f32_to_f16(f);
    cr_expect((h & 0x7c00) == 0x7c00 && (h & 0x3ff), "low-payload nan -> %#x", h);
}

Test(quant, f16_rounding)
{
    cr_expect_eq(kvp_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      /* tie -> even */
    cr_expect_eq(kvp_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  /* tie -> even (up) */
    cr_expect_eq(kvp_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    cr_expect_eq(kvp_f32_to_f16(65519.0f), 0x7bff);
    cr_expect_eq(kvp_f32_to_f16(65520.0f), 0x7c00);             /* rounds to inf */
    cr_expect_eq(kvp_f32_to_f16(1e10f), 0x7c00);
    cr_expect_eq(kvp_f32_to_f16(-1e10f), 0xfc00);
    cr_expect_eq(kvp_f32_to_f16(0x1p-25f), 0x0000);             /* tie -> even (zero) */
    cr_expect_eq(kvp_f32_to_f16(1.5f * 0x1p-25f), 0x0001);
    cr_expect_eq(kvp_f32_to_f16(3 * 0x1p-25f), 0x0002);         /* tie -> even (up) */
    cr_expect_eq(kvp_f32_to_f16(1e-30f), 0x0000);
    cr_expect_eq(kvp_f32_to_f16(-1e-30f), 0x8000);
    /* the largest subnormal plus a bit more than half a step carries into the normals */
    cr_expect_eq(kvp_f32_to_f16(1023.6f * 0x1p-24f), 0x0400);
}

Test(quant, f16_every_value_round_trips)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = kvp_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        if (kvp_f32_to_f16(f) != h)
            cr_assert_fail("f16 %#x -> %g -> %#x", h, (double)f, kvp_f32_to_f16(f));
    }
}

Test(quant, nbytes)
{
    cr_expect_eq(kvp_type_nbytes(KVP_GGML_F32, 10), 40);
    cr_expect_eq(kvp_type_nbytes(KVP_GGML_F16, 10), 20);
    cr_expect_eq(kvp_type_nbytes(KVP_GGML_Q8_0, 64), 68);
    cr_expect_eq(kvp_type_nbytes(KVP_GGML_Q8_0, 0), 0);
    /* partial blocks */
    cr_expect_eq(kvp_type_nbytes(KVP_GGML_Q8_0, 33), 0);
    cr_expect_eq(kvp_type_nbytes(KVP_GGML_Q8_0, 31), 0);
    /* unsupported types and overflow */
    cr_expect_eq(kvp_type_nbytes(20, 256), 0);
    cr_expect_eq(kvp_type_nbytes(999, 1), 0);
    cr_expect_eq(kvp_type_nbytes(KVP_GGML_F32, UINT64_MAX / 2), 0);
}

Test(quant, type_names)
{
    cr_expect_str_eq(kvp_type_name(KVP_GGML_F32), "F32");
    cr_expect_str_eq(kvp_type_name(KVP_GGML_F16), "F16");
    cr_expect_str_eq(kvp_type_name(KVP_GGML_Q8_0), "Q8_0");
    cr_expect_str_eq(kvp_type_name(17), "type 17");
}

Test(quant, dequantize_f32_f16)
{
    const float f[3] = {1.5f, -0.25f, 3e38f};
    float out[3];
    cr_assert_eq(kvp_dequantize(KVP_GGML_F32, f, out, 3), 0);
    cr_expect(memcmp(f, out, sizeof f) == 0);
    const uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7c00};
    float hf[4];
    cr_assert_eq(kvp_dequantize(KVP_GGML_F16, h, hf, 4), 0);
    cr_expect_eq(hf[0], 1.0f);
    cr_expect_eq(hf[1], -2.0f);
    cr_expect_eq(hf[2], 0x1p-24f);
    cr_expect(isinf(hf[3]));
    cr_expect_eq(kvp_dequantize(20, h, hf, 4), -EINVAL);
}

Test(quant, dequantize_q8_0_layout)
{
    /* one block: f16 scale 0.5 (0x3800), then q = -16..15 */
    uint8_t blk[34];
    blk[0] = 0x00;
    blk[1] = 0x38;
    for (int j = 0; j < 32; j++)
        blk[2 + j] = (uint8_t)(int8_t)(j - 16);
    float out[32];
    cr_assert_eq(kvp_dequantize(KVP_GGML_Q8_0, blk, out, 32), 0);
    for (int j = 0; j < 32; j++)
        cr_expect_eq(out[j], 0.5f * (float)(j - 16));
    cr_expect_eq(kvp_dequantize(KVP_GGML_Q8_0, blk, out, 31), -EINVAL);
}

Test(quant, q8_0_round_trip_error_bound)
{
    enum { NB = 64, N = NB * KVP_QK };
    static float x[N], y[N];
    static uint8_t q[NB * 34];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float u = (float)(s >> 40) * 0x1p-24f * 2.0f - 1.0f;
        int b = i / KVP_QK;
        /* blocks of magnitudes 2^-6..2^5 (scales stay normal f16); block 3 is zeros */
        x[i] = b == 3 ? 0.0f : u * ldexpf(1.0f, b % 12 - 6);
    }
    cr_assert_eq(kvp_quantize(KVP_GGML_Q8_0, x, q, N), 0);
    cr_assert_eq(kvp_dequantize(KVP_GGML_Q8_0, q, y, N), 0);
    for (int b = 0; b < NB; b++) {
        float amax = 0;
        int qmax = 0;
        for (int j = 0; j < KVP_QK; j++) {
            amax = fmaxf(amax, fabsf(x[b * 32 + j]));
            int qj = abs((int8_t)q[b * 34 + 2 + j]);
            qmax = qj > qmax ? qj : qmax;
        }
        /* half a step, plus the f16 rounding of the scale (relative 2^-11 of 127 steps) */
        float bound = amax / 254.0f + amax * 0x1p-11f + 1e-30f;
        for (int j = 0; j < KVP_QK; j++) {
            float e = fabsf(x[b * 32 + j] - y[b * 32 + j]);
            if (e > bound)
                cr_assert_fail("block %d elem %d: |%g - %g| = %g > %g", b, j,
                               (double)x[b * 32 + j], (double)y[b * 32 + j], (double)e,
                               (double)bound);
        }
        cr_expect_eq(qmax, b == 3 ? 0 : 127, "block %d: max |q| = %d", b, qmax);
    }
}

/* ---- against ggml: ../shared/fixtures/quant/quant-fixtures.gguf ------------------ */

static const char *const fixture_types[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_K",
                                            "q3_K", "q4_K", "q5_K", "q6_K", "f16", "bf16"};
#define N_FIXTURE_TYPES (sizeof fixture_types / sizeof fixture_types[0])

static const kvp_gguf_tensor *fixture_tensor(const kvp_gguf *g, const char *type,
                                             const char *what)
{
    char name[64];
    snprintf(name, sizeof name, "%s.%s", type, what);
    const kvp_gguf_tensor *t = kvp_gguf_find_tensor(g, name);
    cr_assert(t, "fixture has no tensor %s", name);
    return t;
}

static void open_fixtures(kvp_gguf *g)
{
    char err[256];
    cr_assert_eq(kvp_gguf_open(g, tu_shared("fixtures/quant/quant-fixtures.gguf"), err, sizeof err),
                 0, "%s", err);
}

Test(quant, decoders_match_ggml_bit_for_bit)
{
    kvp_gguf g;
    open_fixtures(&g);
    for (size_t k = 0; k < N_FIXTURE_TYPES; k++) {
        const kvp_gguf_tensor *w = fixture_tensor(&g, fixture_types[k], "weight");
        const kvp_gguf_tensor *want = fixture_tensor(&g, fixture_types[k], "dequant");
        cr_assert_eq(w->type, (uint32_t)kvp_type_parse(fixture_types[k]));
        cr_assert_eq(want->type, KVP_GGML_F32);
        cr_assert_eq(w->n_elements, want->n_elements);
        float *got = malloc(w->n_elements * sizeof *got);
        cr_assert_eq(kvp_dequantize(w->type, w->data, got, w->n_elements), 0);
        const float *ref = want->data;
        uint64_t bad = 0, first = 0;
        for (uint64_t i = 0; i < w->n_elements; i++)
            if (memcmp(&got[i], &ref[i], sizeof(float)) && !bad++)
                first = i;
        cr_expect_eq(bad, 0, "%s: %llu of %llu values differ, first at %llu: %.9g vs ggml %.9g",
                     fixture_types[k], (unsigned long long)bad,
                     (unsigned long long)w->n_elements, (unsigned long long)first,
                     (double)got[first], (double)ref[first]);
        free(got);
    }
    kvp_gguf_close(&g);
}

/* Relative RMS error of quantizing `source.f32` as `type` and decoding it back. */
static double quantizer_rel_rmse(const kvp_gguf *g, uint32_t type)
{
    const kvp_gguf_tensor *src = kvp_gguf_find_tensor(g, "source.f32");
    cr_assert(src && src->type == KVP_GGML_F32);
    uint64_t n = src->n_elements;
    void *q = malloc(kvp_type_nbytes(type, n));
    float *back = malloc(n * sizeof *back);
    cr_assert_eq(kvp_quantize(type, src->data, q, n), 0);
    cr_assert_eq(kvp_dequantize(type, q, back, n), 0);
    const float *x = src->data;
    double se = 0, ss = 0;
    for (uint64_t i = 0; i < n; i++) {
        se += ((double)back[i] - x[i]) * ((double)back[i] - x[i]);
        ss += (double)x[i] * x[i];
    }
    free(q);
    free(back);
    return sqrt(se / ss);
}

Test(quant, quantizers_match_ggml_error)
{
    kvp_gguf g;
    open_fixtures(&g);
    for (size_t k = 0; k < N_FIXTURE_TYPES; k++) {
        uint32_t type = (uint32_t)kvp_type_parse(fixture_types[k]);
        if (type == KVP_GGML_Q2_K || type == KVP_GGML_Q3_K)
            continue;  /* decoded, not written */
        char key[64];
        snprintf(key, sizeof key, "fixture.%s.rel_rmse", fixture_types[k]);
        float want;
        cr_assert_eq(kvp_gguf_get_f32(&g, key, &want), 0, "%s", key);
        double got = quantizer_rel_rmse(&g, type);
        cr_expect(got <= want * 1.05 + 1e-9, "%s: relative RMSE %.6g, ggml %.6g",
                  fixture_types[k], got, (double)want);
        cr_expect(got > 0 || want == 0, "%s: a lossless quantizer is suspicious", fixture_types[k]);
    }
    kvp_gguf_close(&g);
}

Test(quant, refuses_q2_K_q3_K_encoding_and_partial_blocks)
{
    float x[256] = {0};
    uint8_t buf[256 * 4];
    cr_expect_eq(kvp_quantize(KVP_GGML_Q2_K, x, buf, 256), -EINVAL);
    cr_expect_eq(kvp_quantize(KVP_GGML_Q3_K, x, buf, 256), -EINVAL);
    cr_expect_eq(kvp_quantize(KVP_GGML_Q4_K, x, buf, 128), -EINVAL);
    cr_expect_eq(kvp_quantize(20, x, buf, 32), -EINVAL);
    cr_expect_eq(kvp_type_parse("Q4_k"), KVP_GGML_Q4_K);
    cr_expect_eq(kvp_type_parse("iq4_nl"), -1);
    cr_expect_eq(kvp_type_parse(""), -1);
}
