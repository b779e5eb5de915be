/* base/half.c: f16 and bf16 to f32 and back, with round to nearest even, subnormals,
 * overflow to infinity and nan kept nan. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/half.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

Test(half, f16_known_encodings)
{
    cr_assert_eq(kvp_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(kvp_f32_to_f16(-2.0f), 0xc000);
    cr_assert_eq(kvp_f32_to_f16(0.5f), 0x3800);
    cr_assert_eq(kvp_f32_to_f16(65504.0f), 0x7bff);          /* the largest finite */
    cr_assert_eq(kvp_f32_to_f16(0x1p-14f), 0x0400);          /* the smallest normal */
    cr_assert_eq(kvp_f32_to_f16(0x1p-24f), 0x0001);          /* the smallest subnormal */
    cr_assert_eq(kvp_f32_to_f16(0.0f), 0x0000);
    cr_assert_eq(kvp_f32_to_f16(-0.0f), 0x8000);
    cr_assert_eq(kvp_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(kvp_f16_to_f32(0x7bff), 65504.0f);
    cr_assert_eq(kvp_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(kvp_f16_to_f32(0x03ff), 1023 * 0x1p-24f);   /* the largest subnormal */
    cr_assert_eq(bits(kvp_f16_to_f32(0x8000)), 0x80000000u);
    cr_assert_eq(kvp_f16_to_f32(0xc000), -2.0f);
}

/* Every f16 value that is not a nan converts to f32 and back to itself. */
Test(half, f16_round_trips_every_value)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue;
        cr_assert_eq(kvp_f32_to_f16(kvp_f16_to_f32((uint16_t)h)), h, "f16 0x%04x", h);
    }
}

/* Halfway between two f16 values rounds to the even one; just past halfway rounds up. */
Test(half, f16_rounds_to_nearest_even)
{
    float ulp = 0x1p-10f;                                    /* f16's step in [1, 2) */
    cr_assert_eq(kvp_f32_to_f16(1.0f + ulp / 2), 0x3c00);    /* tie, 0x3c00 is even */
    cr_assert_eq(kvp_f32_to_f16(1.0f + 3 * ulp / 2), 0x3c02); /* tie, 0x3c02 is even */
    cr_assert_eq(kvp_f32_to_f16(1.0f + ulp / 2 + 0x1p-20f), 0x3c01);
    cr_assert_eq(kvp_f32_to_f16(1.0f + ulp / 2 - 0x1p-20f), 0x3c00);
    /* subnormals: half the smallest one is a tie with zero (even), a bit more rounds up */
    cr_assert_eq(kvp_f32_to_f16(0x1p-25f), 0x0000);
    cr_assert_eq(kvp_f32_to_f16(0x1.1p-25f), 0x0001);
    cr_assert_eq(kvp_f32_to_f16(3 * 0x1p-25f), 0x0002);      /* 1.5 ulp: tie to even 2 */
    cr_assert_eq(kvp_f32_to_f16(0x1p-40f), 0x0000);
    /* the largest subnormal rounds up into the smallest normal */
    cr_assert_eq(kvp_f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400);
}

Test(half, f16_overflow_inf_and_nan)
{
    cr_assert_eq(kvp_f32_to_f16(65520.0f), 0x7c00);          /* rounds past the largest */
    cr_assert_eq(kvp_f32_to_f16(1e10f), 0x7c00);
    cr_assert_eq(kvp_f32_to_f16(-1e10f), 0xfc00);
    cr_assert_eq(kvp_f32_to_f16(INFINITY), 0x7c00);
    cr_assert_eq(kvp_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t n = kvp_f32_to_f16(NAN);
    cr_assert_eq(n & 0x7c00, 0x7c00);
    cr_assert_neq(n & 0x3ff, 0, "a nan must not become infinity");
    cr_assert(isinf(kvp_f16_to_f32(0x7c00)) && kvp_f16_to_f32(0x7c00) > 0);
    cr_assert(isinf(kvp_f16_to_f32(0xfc00)) && kvp_f16_to_f32(0xfc00) < 0);
    cr_assert(isnan(kvp_f16_to_f32(0x7e00)));
}

Test(half, bf16_encodings_and_rounding)
{
    cr_assert_eq(kvp_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(kvp_f32_to_bf16(-2.0f), 0xc000);
    cr_assert_eq(kvp_bf16_to_f32(0x3f80), 1.0f);
    cr_assert_eq(kvp_bf16_to_f32(0x4049), 3.140625f);
    float ulp = 0x1p-7f;                                     /* bf16's step in [1, 2) */
    cr_assert_eq(kvp_f32_to_bf16(1.0f + ulp / 2), 0x3f80);   /* tie to even */
    cr_assert_eq(kvp_f32_to_bf16(1.0f + 3 * ulp / 2), 0x3f82);
    cr_assert_eq(kvp_f32_to_bf16(1.0f + ulp / 2 + 0x1p-16f), 0x3f81);
    cr_assert_eq(kvp_f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(kvp_f32_to_bf16(3.4e38f), 0x7f80);           /* rounds up to infinity */
    uint16_t n = kvp_f32_to_bf16(NAN);
    cr_assert(isnan(kvp_bf16_to_f32(n)));
    /* a nan whose payload sits in the low bits only stays a nan */
    uint32_t u = 0x7f800001u;
    float low;
    memcpy(&low, &u, sizeof low);
    cr_assert(isnan(kvp_bf16_to_f32(kvp_f32_to_bf16(low))));
    for (uint32_t h = 0; h <= 0xffff; h++) {
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f))
            continue;
        cr_assert_eq(kvp_f32_to_bf16(kvp_bf16_to_f32((uint16_t)h)), h, "bf16 0x%04x", h);
    }
}
