/* Tensor element types: sizes and conversion to f32 (see quant.h). */
#include "model/quant.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/gguf.h"

#define Q8_0_BYTES (2 + KVP_Q8_0_BLOCK)

uint64_t kvp_type_nbytes(uint32_t type, uint64_t n)
{
    switch (type) {
    case KVP_GGML_F32:
        return n > UINT64_MAX / 4 ? 0 : n * 4;
    case KVP_GGML_F16:
        return n > UINT64_MAX / 2 ? 0 : n * 2;
    case KVP_GGML_Q8_0:
        return n % KVP_Q8_0_BLOCK ? 0 : n / KVP_Q8_0_BLOCK * Q8_0_BYTES;
    default:
        return 0;
    }
}

const char *kvp_type_name(uint32_t type)
{
    /* Per thread so concurrent callers (daemon workers) do not share one buffer. */
    static _Thread_local char other[24];
    switch (type) {
    case KVP_GGML_F32:
        return "F32";
    case KVP_GGML_F16:
        return "F16";
    case KVP_GGML_Q8_0:
        return "Q8_0";
    default:
        snprintf(other, sizeof other, "type %u", (unsigned)type);
        return other;
    }
}

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

int kvp_dequantize(uint32_t type, const void *src, float *dst, uint64_t n)
{
    const uint8_t *s = src;
    switch (type) {
    case KVP_GGML_F32:
        memcpy(dst, src, n * sizeof(float));
        return 0;
    case KVP_GGML_F16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = kvp_f16_to_f32(h);
        }
        return 0;
    case KVP_GGML_Q8_0:
        if (n % KVP_Q8_0_BLOCK)
            return -EINVAL;
        for (uint64_t b = 0; b < n / KVP_Q8_0_BLOCK; b++, s += Q8_0_BYTES) {
            uint16_t dh;
            memcpy(&dh, s, 2);
            float d = kvp_f16_to_f32(dh);
            const int8_t *q = (const int8_t *)(s + 2);
            for (int j = 0; j < KVP_Q8_0_BLOCK; j++)
                *dst++ = d * (float)q[j];
        }
        return 0;
    default:
        return -EINVAL;
    }
}

void kvp_quantize_q8_0(const float *src, void *dst, uint64_t n)
{
    uint8_t *out = dst;
    for (uint64_t b = 0; b < n / KVP_Q8_0_BLOCK; b++, src += KVP_Q8_0_BLOCK, out += Q8_0_BYTES) {
        float amax = 0.0f;
        for (int j = 0; j < KVP_Q8_0_BLOCK; j++)
            amax = fmaxf(amax, fabsf(src[j]));
        float d = amax / 127.0f;
        float id = d > 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = kvp_f32_to_f16(d);
        memcpy(out, &dh, 2);
        int8_t *q = (int8_t *)(out + 2);
        for (int j = 0; j < KVP_Q8_0_BLOCK; j++)
            q[j] = (int8_t)lroundf(src[j] * id);
    }
}
