/* Tensor element types: sizes, names, decoding and quantizing (see quant.h). */
#include "model/quant.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "model/ggml_type.h"
#include "model/quant_blocks.h"

static const struct type_info {
    uint32_t type;
    const char *name;
    int block;          /* elements per block */
    size_t bytes;       /* bytes per block */
} types[] = {
    {KVP_GGML_F32, "F32", 1, 4},
    {KVP_GGML_F16, "F16", 1, 2},
    {KVP_GGML_BF16, "BF16", 1, 2},
    {KVP_GGML_Q8_0, "Q8_0", KVP_QK, sizeof(blk_q8_0)},
    {KVP_GGML_Q4_0, "Q4_0", KVP_QK, sizeof(blk_q4_0)},
    {KVP_GGML_Q4_1, "Q4_1", KVP_QK, sizeof(blk_q4_1)},
    {KVP_GGML_Q5_0, "Q5_0", KVP_QK, sizeof(blk_q5_0)},
    {KVP_GGML_Q5_1, "Q5_1", KVP_QK, sizeof(blk_q5_1)},
    {KVP_GGML_Q2_K, "Q2_K", KVP_QK_K, sizeof(blk_q2_K)},
    {KVP_GGML_Q3_K, "Q3_K", KVP_QK_K, sizeof(blk_q3_K)},
    {KVP_GGML_Q4_K, "Q4_K", KVP_QK_K, sizeof(blk_q4_K)},
    {KVP_GGML_Q5_K, "Q5_K", KVP_QK_K, sizeof(blk_q5_K)},
    {KVP_GGML_Q6_K, "Q6_K", KVP_QK_K, sizeof(blk_q6_K)},
};
#define N_TYPES (sizeof types / sizeof types[0])

static const struct type_info *info(uint32_t type)
{
    for (size_t i = 0; i < N_TYPES; i++)
        if (types[i].type == type)
            return &types[i];
    return NULL;
}

int kvp_type_block(uint32_t type)
{
    const struct type_info *t = info(type);
    return t ? t->block : 0;
}

size_t kvp_type_block_bytes(uint32_t type)
{
    const struct type_info *t = info(type);
    return t ? t->bytes : 0;
}

uint64_t kvp_type_nbytes(uint32_t type, uint64_t n)
{
    const struct type_info *t = info(type);
    if (!t || n % (uint64_t)t->block)
        return 0;
    uint64_t blocks = n / (uint64_t)t->block;
    return blocks > UINT64_MAX / t->bytes ? 0 : blocks * t->bytes;
}

const char *kvp_type_name(uint32_t type)
{
    /* Per thread so concurrent callers (daemon workers) do not share one buffer. */
    static _Thread_local char other[24];
    const struct type_info *t = info(type);
    if (t)
        return t->name;
    snprintf(other, sizeof other, "type %u", (unsigned)type);
    return other;
}

int kvp_type_parse(const char *name)
{
    for (size_t i = 0; i < N_TYPES; i++)
        if (!strcasecmp(name, types[i].name))
            return (int)types[i].type;
    return -1;
}

/* ---- decoding: one function per format, n whole blocks ------------------------- */

static float f16(uint16_t h) { return kvp_f16_to_f32(h); }

static void dequant_q8_0(const blk_q8_0 *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b++, y += KVP_QK) {
        float d = f16(b->d);
        for (int j = 0; j < KVP_QK; j++)
            y[j] = (float)b->qs[j] * d;
    }
}

static void dequant_q4_0(const blk_q4_0 *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b++, y += KVP_QK) {
        float d = f16(b->d);
        for (int j = 0; j < KVP_QK / 2; j++) {
            y[j] = (float)((b->qs[j] & 0xF) - 8) * d;
            y[j + KVP_QK / 2] = (float)((b->qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const blk_q4_1 *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b++, y += KVP_QK) {
        float d = f16(b->d), m = f16(b->m);
        for (int j = 0; j < KVP_QK / 2; j++) {
            y[j] = (float)(b->qs[j] & 0xF) * d + m;
            y[j + KVP_QK / 2] = (float)(b->qs[j] >> 4) * d + m;
        }
    }
}

/* bit j of qh is the fifth bit of element j */
static void dequant_q5(const uint8_t *qs, const uint8_t *qh4, float d, float m, int offset,
                       float *y)
{
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int j = 0; j < KVP_QK / 2; j++) {
        int lo = (qs[j] & 0xF) | (int)(((qh >> j) << 4) & 0x10);
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
        if (offset) {
            y[j] = (float)(lo - 16) * d;
            y[j + KVP_QK / 2] = (float)(hi - 16) * d;
        } else {
            y[j] = (float)lo * d + m;
            y[j + KVP_QK / 2] = (float)hi * d + m;
        }
    }
}

static void dequant_q2_K(const blk_q2_K *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b++) {
        float d = f16(b->d), dmin = f16(b->dmin);
        const uint8_t *q = b->qs;
        int is = 0;
        for (int n = 0; n < KVP_QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    uint8_t sc = b->scales[is++];
                    float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
                }
            }
        }
    }
}

static void dequant_q3_K(const blk_q3_K *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b++) {
        float d_all = f16(b->d);
        int8_t sc[16];
        kvp_q3_scales(b->scales, sc);
        const uint8_t *q = b->qs;
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < KVP_QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int half = 0; half < 2; half++) {
                    float dl = d_all * (float)sc[is++];
                    for (int l = 16 * half; l < 16 * half + 16; l++)
                        *y++ = dl * (float)(((q[l] >> shift) & 3) - ((b->hmask[l] & m) ? 0 : 4));
                }
            }
        }
    }
}

/* Q4_K and Q5_K: eight 32-weight groups with 6-bit scales and mins, taken in pairs of
 * the low and high nibbles of 32 bytes; Q5_K adds a fifth bit from qh (NULL for Q4_K). */
static void dequant_k_nibbles(float d, float dmin, const uint8_t *scales, const uint8_t *qs,
                              const uint8_t *qh, float *y)
{
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, qs += 32, u1 <<= 2, u2 <<= 2) {
        uint8_t sc, m;
        kvp_k4_scale_min(is, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        kvp_k4_scale_min(is + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)((qs[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)((qs[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - m2;
    }
}

static void dequant_q4_K(const blk_q4_K *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b++, y += KVP_QK_K)
        dequant_k_nibbles(f16(b->d), f16(b->dmin), b->scales, b->qs, NULL, y);
}

static void dequant_q5_K(const blk_q5_K *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b++, y += KVP_QK_K)
        dequant_k_nibbles(f16(b->d), f16(b->dmin), b->scales, b->qs, b->qh, y);
}

static void dequant_q6_K(const blk_q6_K *b, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b++) {
        float d = f16(b->d);
        const uint8_t *ql = b->ql, *qh = b->qh;
        const int8_t *sc = b->scales;
        for (int n = 0; n < KVP_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

int kvp_dequantize(uint32_t type, const void *src, float *dst, uint64_t n)
{
    const struct type_info *t = info(type);
    if (!t || n % (uint64_t)t->block)
        return -EINVAL;
    uint64_t nb = n / (uint64_t)t->block;
    const uint8_t *s = src;
    switch (type) {
    case KVP_GGML_F32:
        memcpy(dst, src, n * sizeof(float));
        return 0;
    case KVP_GGML_F16:
    case KVP_GGML_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = type == KVP_GGML_F16 ? kvp_f16_to_f32(h) : kvp_bf16_to_f32(h);
        }
        return 0;
    case KVP_GGML_Q8_0: dequant_q8_0(src, dst, nb); return 0;
    case KVP_GGML_Q4_0: dequant_q4_0(src, dst, nb); return 0;
    case KVP_GGML_Q4_1: dequant_q4_1(src, dst, nb); return 0;
    case KVP_GGML_Q5_0:
        for (const blk_q5_0 *b = src; nb--; b++, dst += KVP_QK)
            dequant_q5(b->qs, b->qh, f16(b->d), 0.0f, 1, dst);
        return 0;
    case KVP_GGML_Q5_1:
        for (const blk_q5_1 *b = src; nb--; b++, dst += KVP_QK)
            dequant_q5(b->qs, b->qh, f16(b->d), f16(b->m), 0, dst);
        return 0;
    case KVP_GGML_Q2_K: dequant_q2_K(src, dst, nb); return 0;
    case KVP_GGML_Q3_K: dequant_q3_K(src, dst, nb); return 0;
    case KVP_GGML_Q4_K: dequant_q4_K(src, dst, nb); return 0;
    case KVP_GGML_Q5_K: dequant_q5_K(src, dst, nb); return 0;
    case KVP_GGML_Q6_K: dequant_q6_K(src, dst, nb); return 0;
    }
    return -EINVAL;
}

/* ---- quantizing ----------------------------------------------------------------- */

#define TINY 1e-15f   /* a group whose largest magnitude is below this encodes as zeros */

static int nearest(float x) { return (int)lrintf(x); }
static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The element of largest magnitude, with its sign. */
static float signed_absmax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void quant_q8_0(const float *x, blk_q8_0 *b, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, b++, x += KVP_QK) {
        float amax = 0.0f;
        for (int j = 0; j < KVP_QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        b->d = kvp_f32_to_f16(d);
        for (int j = 0; j < KVP_QK; j++)
            b->qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* Q4_0 / Q5_0: d maps the signed extreme to -2^(bits-1), so it uses the full range on
 * its side. */
static float quant_sym(const float *x, int bits, uint8_t *q)
{
    int half = 1 << (bits - 1), top = 2 * half - 1;
    float d = signed_absmax(x, KVP_QK) / (float)-half, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < KVP_QK; j++) {
        int v = (int)(x[j] * id + (float)half + 0.5f);
        q[j] = (uint8_t)(v > top ? top : v);
    }
    return d;
}

/* Q4_1 / Q5_1: the block's range [min, max] in 2^bits - 1 steps. */
static void quant_affine(const float *x, int bits, uint8_t *q, float *d_out, float *m_out)
{
    float mn = x[0], mx = x[0];
    for (int j = 1; j < KVP_QK; j++) {
        mn = fminf(mn, x[j]);
        mx = fmaxf(mx, x[j]);
    }
    int top = (1 << bits) - 1;
    float d = (mx - mn) / (float)top, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < KVP_QK; j++) {
        int v = (int)((x[j] - mn) * id + 0.5f);
        q[j] = (uint8_t)(v > top ? top : v);
    }
    *d_out = d;
    *m_out = mn;
}

static void pack_nibbles(const uint8_t *q, uint8_t *qs)
{
    for (int j = 0; j < KVP_QK / 2; j++)
        qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + KVP_QK / 2] & 0xF) << 4);
}

static void pack_fifth_bits(const uint8_t *q, uint8_t qh4[4])
{
    uint32_t qh = 0;
    for (int j = 0; j < KVP_QK; j++)
        qh |= (uint32_t)(q[j] >> 4 & 1) << j;
    memcpy(qh4, &qh, 4);
}

/* Weighted least squares fit of x ~ scale * L - min with L in 0..nmax, min >= 0: tries
 * the plain range split and nstep+1 nudged inverse scales (rmin + rdelta*k steps added to
 * nmax), refits scale and min in closed form for each rounding and keeps the one with
 * the smallest weighted squared error. Returns the scale; *min_out = min. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *min_out, float rmin, float rdelta, int nstep)
{
    float lo = x[0], hi = x[0], sw = 0.0f, swx = 0.0f;
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
        sw += w[i];
        swx += w[i] * x[i];
    }
    if (lo > 0.0f)
        lo = 0.0f;
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *min_out = -lo;
        return 0.0f;
    }
    float iscale = (float)nmax / (hi - lo), scale = 1.0f / iscale, offset = lo;
    float best = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest(iscale * (x[i] - lo)), 0, nmax);
        float e = scale * L[i] + lo - x[i];
        best += w[i] * e * e;
    }
    uint8_t trial[32];
    for (int k = 0; k <= nstep; k++) {
        iscale = (rmin + rdelta * (float)k + (float)nmax) / (hi - lo);
        float sl = 0.0f, sl2 = 0.0f, sxl = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest(iscale * (x[i] - lo)), 0, nmax);
            trial[i] = (uint8_t)l;
            sl += w[i] * l;
            sl2 += w[i] * l * l;
            sxl += w[i] * l * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0.0f))
            continue;
        float s = (sw * sxl - swx * sl) / det, m = (sl2 * swx - sl * sxl) / det;
        if (m > 0.0f) {  /* the offset may only lower values: refit the scale alone */
            m = 0.0f;
            s = sxl / sl2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float e = s * trial[i] + m - x[i];
            err += w[i] * e * e;
        }
        if (err < best) {
            memcpy(L, trial, (size_t)n);
            best = err;
            scale = s;
            offset = m;
        }
    }
    *min_out = -offset;
    return scale;
}

/* Q4_K / Q5_K: per 32-element sub-block a (scale, min) fit, weighted toward large
 * magnitudes; both quantized to 6 bits against the super-block's largest, then the
 * elements are requantized with the scales as stored. */
static void quant_k_affine(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out,
                           uint16_t *dmin_out, uint8_t packed[12], uint8_t L[KVP_QK_K])
{
    float scales[8], mins[8], w[32], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sx2 = 0.0f;
        for (int l = 0; l < 32; l++)
            sx2 += xs[l] * xs[l];
        float av = sqrtf(sx2 / 32.0f);
        for (int l = 0; l < 32; l++)
            w[l] = av + fabsf(xs[l]);
        scales[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
        max_scale = fmaxf(max_scale, scales[j]);
        max_min = fmaxf(max_min, mins[j]);
    }
    float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    memset(packed, 0, 12);
    for (int j = 0; j < 8; j++) {
        int ls = clampi(nearest(inv_scale * scales[j]), 0, 63);
        int lm = clampi(nearest(inv_min * mins[j]), 0, 63);
        if (j < 4) {
            packed[j] |= (uint8_t)ls;
            packed[j + 4] |= (uint8_t)lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
            packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
            packed[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = kvp_f32_to_f16(max_scale / 63.0f);
    *dmin_out = kvp_f32_to_f16(max_min / 63.0f);
    float d = kvp_f16_to_f32(*d_out), dmin = kvp_f16_to_f32(*dmin_out);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kvp_k4_scale_min(j, packed, &sc, &m);
        float ds = d * sc, dm = dmin * m;
        if (ds == 0.0f)
            continue;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clampi(nearest((x[32 * j + l] + dm) / ds), 0, nmax);
    }
}

static void quant_q4_K(const float *x, blk_q4_K *b, uint64_t nb)
{
    uint8_t L[KVP_QK_K];
    for (uint64_t i = 0; i < nb; i++, b++, x += KVP_QK_K) {
        quant_k_affine(x, 15, -1.0f, 20, &b->d, &b->dmin, b->scales, L);
        for (int n = 0; n < KVP_QK_K; n += 64)
            for (int l = 0; l < 32; l++)
                b->qs[n / 2 + l] = (uint8_t)(L[n + l] | L[n + l + 32] << 4);
    }
}

static void quant_q5_K(const float *x, blk_q5_K *b, uint64_t nb)
{
    uint8_t L[KVP_QK_K];
    for (uint64_t i = 0; i < nb; i++, b++, x += KVP_QK_K) {
        quant_k_affine(x, 31, -0.5f, 15, &b->d, &b->dmin, b->scales, L);
        memset(b->qh, 0, sizeof b->qh);
        for (int n = 0, bit = 0; n < KVP_QK_K; n += 64, bit += 2)
            for (int l = 0; l < 32; l++) {
                int a = L[n + l], c = L[n + l + 32];
                b->qh[l] |= (uint8_t)((a >> 4) << bit | (c >> 4) << (bit + 1));
                b->qs[n / 2 + l] = (uint8_t)((a & 0xF) | (c & 0xF) << 4);
            }
    }
}

/* Symmetric fit of x ~ scale * L, L in -nmax..nmax-1, weighted by x^2: tries 19 inverse
 * scales around nmax / max and keeps the one maximizing (sum w x l)^2 / sum w l^2
 * (the least-squares error reduction). L gets the codes + nmax. */
static float fit_scale_sym(int n, int nmax, const float *x, uint8_t *L)
{
    float max = signed_absmax(x, n);
    if (fabsf(max) < TINY) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float scale = 0.0f, best = 0.0f;
    for (int k = 0; k <= 18; k++) {
        int step = k == 0 ? 0 : k <= 9 ? k - 10 : k - 9;  /* 0 first, then -9..-1, 1..9 */
        float iscale = -((float)nmax + 0.1f * (float)step) / max;
        float sxl = 0.0f, sl2 = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sxl += w * x[i] * l;
            sl2 += w * l * l;
        }
        if (k == 0 ? 1 : (sl2 > 0.0f && sxl * sxl > best * sl2)) {
            scale = sl2 > 0.0f ? sxl / sl2 : 0.0f;
            best = scale * sxl;
            for (int i = 0; i < n; i++)
                L[i] = (uint8_t)(nmax + clampi(nearest(iscale * x[i]), -nmax, nmax - 1));
        }
    }
    return scale;
}

static void quant_q6_K(const float *x, blk_q6_K *b, uint64_t nb)
{
    uint8_t L[KVP_QK_K];
    for (uint64_t i = 0; i < nb; i++, b++, x += KVP_QK_K) {
        float scales[16], max_scale = 0.0f;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_scale_sym(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > fabsf(max_scale))
                max_scale = scales[j];
        }
        memset(b, 0, sizeof *b);
        if (fabsf(max_scale) < TINY)
            continue;
        float iscale = -128.0f / max_scale;
        b->d = kvp_f32_to_f16(1.0f / iscale);
        for (int j = 0; j < 16; j++)
            b->scales[j] = (int8_t)clampi(nearest(iscale * scales[j]), -128, 127);
        float d = kvp_f16_to_f32(b->d);
        for (int j = 0; j < 16; j++) {
            float ds = d * b->scales[j];
            if (ds == 0.0f)
                continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)(clampi(nearest(x[16 * j + l] / ds), -32, 31) + 32);
        }
        for (int n = 0; n < KVP_QK_K; n += 128)
            for (int l = 0; l < 32; l++) {
                const uint8_t *q = L + n + l;
                b->ql[n / 2 + l] = (uint8_t)((q[0] & 0xF) | (q[64] & 0xF) << 4);
                b->ql[n / 2 + l + 32] = (uint8_t)((q[32] & 0xF) | (q[96] & 0xF) << 4);
                b->qh[n / 4 + l] = (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 |
                                             (q[96] >> 4) << 6);
            }
    }
}

int kvp_quantize(uint32_t type, const float *x, void *dst, uint64_t n)
{
    const struct type_info *t = info(type);
    if (!t || n % (uint64_t)t->block)
        return -EINVAL;
    uint64_t nb = n / (uint64_t)t->block;
    uint8_t q[KVP_QK];
    switch (type) {
    case KVP_GGML_F32:
        memcpy(dst, x, n * sizeof(float));
        return 0;
    case KVP_GGML_F16:
    case KVP_GGML_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = type == KVP_GGML_F16 ? kvp_f32_to_f16(x[i]) : kvp_f32_to_bf16(x[i]);
            memcpy((uint8_t *)dst + 2 * i, &h, 2);
        }
        return 0;
    case KVP_GGML_Q8_0: quant_q8_0(x, dst, nb); return 0;
    case KVP_GGML_Q4_0:
        for (blk_q4_0 *b = dst; nb--; b++, x += KVP_QK) {
            b->d = kvp_f32_to_f16(quant_sym(x, 4, q));
            pack_nibbles(q, b->qs);
        }
        return 0;
    case KVP_GGML_Q5_0:
        for (blk_q5_0 *b = dst; nb--; b++, x += KVP_QK) {
            b->d = kvp_f32_to_f16(quant_sym(x, 5, q));
            pack_nibbles(q, b->qs);
            pack_fifth_bits(q, b->qh);
        }
        return 0;
    case KVP_GGML_Q4_1:
    case KVP_GGML_Q5_1: {
        int bits = type == KVP_GGML_Q4_1 ? 4 : 5;
        size_t bytes = t->bytes;
        for (uint8_t *p = dst; nb--; p += bytes, x += KVP_QK) {
            float d, m;
            quant_affine(x, bits, q, &d, &m);
            uint16_t dm[2] = {kvp_f32_to_f16(d), kvp_f32_to_f16(m)};
            memcpy(p, dm, 4);
            if (bits == 4) {
                pack_nibbles(q, ((blk_q4_1 *)p)->qs);
            } else {
                pack_nibbles(q, ((blk_q5_1 *)p)->qs);
                pack_fifth_bits(q, ((blk_q5_1 *)p)->qh);
            }
        }
        return 0;
    }
    case KVP_GGML_Q4_K: quant_q4_K(x, dst, nb); return 0;
    case KVP_GGML_Q5_K: quant_q5_K(x, dst, nb); return 0;
    case KVP_GGML_Q6_K: quant_q6_K(x, dst, nb); return 0;
    }
    return -EINVAL;
}
