/* IEEE half and bfloat16 <-> f32, round to nearest even. */
#include "base/half.h"

#include <string.h>

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float kvp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;

    if (exp == 0x1f) /* inf / nan: keep the payload */
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t kvp_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t exp = (u >> 23) & 0xff;
    uint32_t man = u & 0x7fffff;

    if (exp == 0xff) /* inf stays inf; nan stays a (quiet) nan */
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));

    int e = (int)exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00); /* overflow -> inf */
    if (e <= 0) {
        /* f16 subnormal (or zero): value = m * 2^-24 with round to nearest even */
        if (e < -10)
            return sign; /* below half the smallest subnormal */
        uint32_t m = man | 0x800000;  /* implicit bit */
        int shift = 14 - e;           /* 24-bit mantissa down to the subnormal grid */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++; /* may carry into the smallest normal, which is the right encoding */
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* a carry into the exponent rounds up correctly, up to inf */
    return (uint16_t)(sign | h);
}

float kvp_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t kvp_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 64);  /* quiet nan */
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}
