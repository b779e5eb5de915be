/* Portable dot-product kernels (see matmul_kernels.h): the reference for the SIMD
 * kernels, and what runs where neither AVX2 nor AVX-512 does (or KVP_SIMD=scalar). */
#include <math.h>
#include <string.h>

#include "model/matmul_kernels.h"

/* lrintf's rounding (to nearest, ties to even) for |v| < 2^22, without a libm call:
 * adding 1.5 * 2^23 leaves no fraction bits (IEEE arithmetic: not folded away) */
static inline int round_even(float v)
{
    const float big = 12582912.0f;
    return (int)((v + big) - big);
}

static void quantize32(const float *x, int n, kvp_act *a)
{
    for (int b = 0; b < n / KVP_QK; b++) {
        const float *xb = x + b * KVP_QK;
        float amax = 0.0f;
        for (int j = 0; j < KVP_QK; j++)
            amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < KVP_QK; j++) {
            int v = round_even(xb[j] * id);
            a->q[b * KVP_QK + j] = (int8_t)v;
            sum += v;
        }
        a->d[b] = d;
        a->s[b] = d * (float)sum;
    }
}

static void quantize256(const float *x, int n, kvp_act *a)
{
    for (int b = 0; b < n / KVP_QK_K; b++) {
        const float *xb = x + b * KVP_QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < KVP_QK_K; j++)
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        int8_t *q = a->q + b * KVP_QK_K;
        int16_t *bs = a->bsums + b * 16;
        if (amax == 0.0f) {
            a->d[b] = 0.0f;
            memset(q, 0, KVP_QK_K);
            memset(bs, 0, 16 * sizeof *bs);
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < KVP_QK_K; j++) {
            int v = round_even(iscale * xb[j]);
            q[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += q[16 * g + j];
            bs[g] = (int16_t)s;
        }
        a->d[b] = 1.0f / iscale;
    }
}

static void f32_rows(const float *w, int rows, int n, const float *x, int T, float *y, int ldy,
                     int accumulate)
{
    for (int r = 0; r < rows; r++)       /* row r stays in cache while every token reads it */
        for (int t = 0; t < T; t++) {
            float sum = 0.0f;
            for (int i = 0; i < n; i++)
                sum += w[(size_t)r * n + i] * x[(size_t)t * n + i];
            float *o = y + (size_t)t * ldy + r;
            *o = accumulate ? *o + sum : sum;
        }
}

static float dot_f16(const void *row, const kvp_act *a)
{
    const uint16_t *w = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n; i++)
        sum += kvp_f16_to_f32(w[i]) * a->x[i];
    return sum;
}

static float dot_bf16(const void *row, const kvp_act *a)
{
    const uint16_t *w = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n; i++)
        sum += kvp_bf16_to_f32(w[i]) * a->x[i];
    return sum;
}

/* kvp_small_fn for Q8_0 (also a single activation row's dot product) */
static void small_q8_0(const uint8_t *w, size_t stride, int rows, const kvp_act *act, int T,
                       float *y, int ldy, int accumulate)
{
    for (int r = 0; r < rows; r++)       /* row r stays in cache while every token reads it */
        for (int t = 0; t < T; t++) {
            const blk_q8_0 *b = (const blk_q8_0 *)(w + (size_t)r * stride);
            float sum = 0.0f;
            for (int i = 0; i < act[t].n / KVP_QK; i++, b++) {
                const int8_t *q = act[t].q + i * KVP_QK;
                int s = 0;
                for (int j = 0; j < KVP_QK; j++)
                    s += b->qs[j] * q[j];
                sum += kvp_f16_to_f32(b->d) * act[t].d[i] * (float)s;
            }
            float *o = y + (size_t)t * ldy + r;
            *o = accumulate ? *o + sum : sum;
        }
}

/* sum over a block of (4-bit code) * q: low nibbles are elements 0..15, high 16..31 */
static int nibble_dot(const uint8_t *qs, const int8_t *q)
{
    int s = 0;
    for (int j = 0; j < KVP_QK / 2; j++)
        s += (qs[j] & 0xF) * q[j] + (qs[j] >> 4) * q[j + KVP_QK / 2];
    return s;
}

/* the same with a fifth bit per element from qh */
static int nibble5_dot(const uint8_t *qs, const uint8_t *qh4, const int8_t *q)
{
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    int s = 0;
    for (int j = 0; j < KVP_QK / 2; j++) {
        int lo = (qs[j] & 0xF) | (int)((qh >> j & 1) << 4);
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16) & 1) << 4);
        s += lo * q[j] + hi * q[j + KVP_QK / 2];
    }
    return s;
}

/* The _0 formats store code - offset; sum(code*q) - offset*sum(q) gives it, and
 * d_a * sum(q) is the activation block's s. */
static float dot_q4_0(const void *row, const kvp_act *a)
{
    const blk_q4_0 *b = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n / KVP_QK; i++, b++) {
        float d = kvp_f16_to_f32(b->d);
        sum += d * (a->d[i] * (float)nibble_dot(b->qs, a->q + i * KVP_QK) - 8.0f * a->s[i]);
    }
    return sum;
}

static float dot_q5_0(const void *row, const kvp_act *a)
{
    const blk_q5_0 *b = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n / KVP_QK; i++, b++) {
        float d = kvp_f16_to_f32(b->d);
        int s = nibble5_dot(b->qs, b->qh, a->q + i * KVP_QK);
        sum += d * (a->d[i] * (float)s - 16.0f * a->s[i]);
    }
    return sum;
}

static float dot_q4_1(const void *row, const kvp_act *a)
{
    const blk_q4_1 *b = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n / KVP_QK; i++, b++) {
        int s = nibble_dot(b->qs, a->q + i * KVP_QK);
        sum += kvp_f16_to_f32(b->d) * a->d[i] * (float)s + kvp_f16_to_f32(b->m) * a->s[i];
    }
    return sum;
}

static float dot_q5_1(const void *row, const kvp_act *a)
{
    const blk_q5_1 *b = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n / KVP_QK; i++, b++) {
        int s = nibble5_dot(b->qs, b->qh, a->q + i * KVP_QK);
        sum += kvp_f16_to_f32(b->d) * a->d[i] * (float)s + kvp_f16_to_f32(b->m) * a->s[i];
    }
    return sum;
}

static float dot_q2_K(const void *row, const kvp_act *a)
{
    const blk_q2_K *b = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        const int8_t *q = a->q + i * KVP_QK_K;
        const int16_t *bs = a->bsums + i * 16;
        int sd = 0, sm = 0, is = 0;
        for (int n = 0; n < KVP_QK_K; n += 128)
            for (int shift = 0; shift < 8; shift += 2)
                for (int half = 0; half < 2; half++, is++, q += 16) {
                    const uint8_t *c = b->qs + n / 4 + 16 * half;
                    int s = 0;
                    for (int l = 0; l < 16; l++)
                        s += ((c[l] >> shift) & 3) * q[l];
                    sd += (b->scales[is] & 0xF) * s;
                    sm += (b->scales[is] >> 4) * bs[is];
                }
        sum += a->d[i] * (kvp_f16_to_f32(b->d) * (float)sd - kvp_f16_to_f32(b->dmin) * (float)sm);
    }
    return sum;
}

static float dot_q3_K(const void *row, const kvp_act *a)
{
    const blk_q3_K *b = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        const int8_t *q = a->q + i * KVP_QK_K;
        int8_t sc[16];
        kvp_q3_scales(b->scales, sc);
        int total = 0, is = 0;
        uint8_t m = 1;
        for (int n = 0; n < KVP_QK_K; n += 128)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int half = 0; half < 2; half++, is++, q += 16) {
                    const uint8_t *c = b->qs + n / 4 + 16 * half;
                    const uint8_t *hm = b->hmask + 16 * half;
                    int s = 0;
                    for (int l = 0; l < 16; l++)
                        s += (((c[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4)) * q[l];
                    total += sc[is] * s;
                }
        sum += a->d[i] * kvp_f16_to_f32(b->d) * (float)total;
    }
    return sum;
}

/* Q4_K / Q5_K: d * sum_j sc_j * sum(code * q) - dmin * sum_j m_j * sum(q) */
static float dot_k_affine(const uint8_t *scales, uint16_t dh, uint16_t dminh, const int *codes,
                          const int8_t *q, const int16_t *bs, float da)
{
    int sd = 0, sm = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kvp_k4_scale_min(j, scales, &sc, &m);
        int s = 0;
        for (int l = 0; l < 32; l++)
            s += codes[32 * j + l] * q[32 * j + l];
        sd += sc * s;
        sm += m * (bs[2 * j] + bs[2 * j + 1]);
    }
    return da * (kvp_f16_to_f32(dh) * (float)sd - kvp_f16_to_f32(dminh) * (float)sm);
}

static float dot_q4_K(const void *row, const kvp_act *a)
{
    const blk_q4_K *b = row;
    float sum = 0.0f;
    int codes[KVP_QK_K];
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        for (int n = 0; n < KVP_QK_K; n += 64)
            for (int l = 0; l < 32; l++) {
                codes[n + l] = b->qs[n / 2 + l] & 0xF;
                codes[n + l + 32] = b->qs[n / 2 + l] >> 4;
            }
        sum += dot_k_affine(b->scales, b->d, b->dmin, codes, a->q + i * KVP_QK_K,
                            a->bsums + i * 16, a->d[i]);
    }
    return sum;
}

static float dot_q5_K(const void *row, const kvp_act *a)
{
    const blk_q5_K *b = row;
    float sum = 0.0f;
    int codes[KVP_QK_K];
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        for (int n = 0, bit = 0; n < KVP_QK_K; n += 64, bit += 2)
            for (int l = 0; l < 32; l++) {
                codes[n + l] = (b->qs[n / 2 + l] & 0xF) | ((b->qh[l] >> bit & 1) << 4);
                codes[n + l + 32] = (b->qs[n / 2 + l] >> 4) | ((b->qh[l] >> (bit + 1) & 1) << 4);
            }
        sum += dot_k_affine(b->scales, b->d, b->dmin, codes, a->q + i * KVP_QK_K,
                            a->bsums + i * 16, a->d[i]);
    }
    return sum;
}

static float dot_q6_K(const void *row, const kvp_act *a)
{
    const blk_q6_K *b = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        const int8_t *q = a->q + i * KVP_QK_K;
        int total = 0;
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
            const int8_t *sc = b->scales + 8 * n;
            const int8_t *qq = q + 128 * n;
            int s[8] = {0};
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                s[is] += (((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32) * qq[l];
                s[is + 2] += (((ql[l + 32] & 0xF) | ((qh[l] >> 2 & 3) << 4)) - 32) * qq[l + 32];
                s[is + 4] += (((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32) * qq[l + 64];
                s[is + 6] += (((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32) * qq[l + 96];
            }
            for (int j = 0; j < 8; j++)
                total += sc[j] * s[j];
        }
        sum += a->d[i] * kvp_f16_to_f32(b->d) * (float)total;
    }
    return sum;
}

/* ---- int8 GEMM: packing every block format into unsigned codes (matmul_kernels.h) ---- */

/* The _0/_1 formats: codes, one scale per block and the offset term kx. */
static void pack_block32(uint8_t *p, int n, int b, float d, float kx)
{
    kvp_pack_scale(p, n)[b] = d;
    kvp_pack_kx(p, n)[b] = kx;
}

static void pack_q8_0(const void *row, int n, uint8_t *p)
{
    const blk_q8_0 *b = row;
    for (int i = 0; i < n / KVP_QK; i++, b++) {
        float d = kvp_f16_to_f32(b->d);
        for (int j = 0; j < KVP_QK; j++)
            p[i * KVP_QK + j] = (uint8_t)(b->qs[j] + 128);  /* stored q + 128 */
        pack_block32(p, n, i, d, -128.0f * d);
    }
}

static void nibbles_to_codes(const uint8_t *qs, const uint8_t *qh4, uint8_t *codes)
{
    uint32_t qh = 0;
    if (qh4)
        memcpy(&qh, qh4, 4);
    for (int j = 0; j < KVP_QK / 2; j++) {
        codes[j] = (uint8_t)((qs[j] & 0xF) | (qh >> j & 1) << 4);
        codes[j + KVP_QK / 2] = (uint8_t)((qs[j] >> 4) | (qh >> (j + 16) & 1) << 4);
    }
}

static void pack_q4_0(const void *row, int n, uint8_t *p)
{
    const blk_q4_0 *b = row;
    for (int i = 0; i < n / KVP_QK; i++, b++) {
        float d = kvp_f16_to_f32(b->d);
        nibbles_to_codes(b->qs, NULL, p + i * KVP_QK);
        pack_block32(p, n, i, d, -8.0f * d);
    }
}

static void pack_q4_1(const void *row, int n, uint8_t *p)
{
    const blk_q4_1 *b = row;
    for (int i = 0; i < n / KVP_QK; i++, b++) {
        nibbles_to_codes(b->qs, NULL, p + i * KVP_QK);
        pack_block32(p, n, i, kvp_f16_to_f32(b->d), kvp_f16_to_f32(b->m));
    }
}

static void pack_q5_0(const void *row, int n, uint8_t *p)
{
    const blk_q5_0 *b = row;
    for (int i = 0; i < n / KVP_QK; i++, b++) {
        float d = kvp_f16_to_f32(b->d);
        nibbles_to_codes(b->qs, b->qh, p + i * KVP_QK);
        pack_block32(p, n, i, d, -16.0f * d);
    }
}

static void pack_q5_1(const void *row, int n, uint8_t *p)
{
    const blk_q5_1 *b = row;
    for (int i = 0; i < n / KVP_QK; i++, b++) {
        nibbles_to_codes(b->qs, b->qh, p + i * KVP_QK);
        pack_block32(p, n, i, kvp_f16_to_f32(b->d), kvp_f16_to_f32(b->m));
    }
}

/* The K formats: super-block scale d, an integer scale and an offset term per 16. */
static void pack_q2_K(const void *row, int n, uint8_t *p)
{
    const blk_q2_K *b = row;
    int16_t *sc = kvp_pack_sc16(p, n);
    float *kx = kvp_pack_kx(p, n);
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        uint8_t *codes = p + i * KVP_QK_K;
        float dmin = kvp_f16_to_f32(b->dmin);
        kvp_pack_scale(p, n)[i] = kvp_f16_to_f32(b->d);
        int is = 0;
        for (int m = 0; m < KVP_QK_K; m += 128)
            for (int shift = 0; shift < 8; shift += 2)
                for (int half = 0; half < 2; half++, is++, codes += 16) {
                    const uint8_t *c = b->qs + m / 4 + 16 * half;
                    for (int l = 0; l < 16; l++)
                        codes[l] = (c[l] >> shift) & 3;
                    sc[16 * i + is] = b->scales[is] & 0xF;
                    kx[16 * i + is] = -dmin * (float)(b->scales[is] >> 4);
                }
    }
}

static void pack_q3_K(const void *row, int n, uint8_t *p)
{
    const blk_q3_K *b = row;
    int16_t *sc = kvp_pack_sc16(p, n);
    float *kx = kvp_pack_kx(p, n);
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        uint8_t *codes = p + i * KVP_QK_K;
        float d = kvp_f16_to_f32(b->d);
        kvp_pack_scale(p, n)[i] = d;
        int8_t s[16];
        kvp_q3_scales(b->scales, s);
        int is = 0;
        uint8_t m = 1;
        for (int k = 0; k < KVP_QK_K; k += 128)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int half = 0; half < 2; half++, is++, codes += 16) {
                    const uint8_t *c = b->qs + k / 4 + 16 * half;
                    const uint8_t *hm = b->hmask + 16 * half;
                    for (int l = 0; l < 16; l++)  /* code + 4, so 0..7 */
                        codes[l] = (uint8_t)(((c[l] >> shift) & 3) + ((hm[l] & m) ? 4 : 0));
                    sc[16 * i + is] = s[is];
                    kx[16 * i + is] = -4.0f * d * (float)s[is];
                }
    }
}

/* Q4_K / Q5_K: the scale and min of each 32 go to both of its halves of 16 */
static void pack_k_affine(uint8_t *p, int n, int i, const uint8_t *scales, uint16_t d, uint16_t dmin)
{
    kvp_pack_scale(p, n)[i] = kvp_f16_to_f32(d);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kvp_k4_scale_min(j, scales, &sc, &m);
        float kx = -kvp_f16_to_f32(dmin) * (float)m;
        for (int h = 0; h < 2; h++) {
            kvp_pack_sc16(p, n)[16 * i + 2 * j + h] = sc;
            kvp_pack_kx(p, n)[16 * i + 2 * j + h] = kx;
        }
    }
}

static void pack_q4_K(const void *row, int n, uint8_t *p)
{
    const blk_q4_K *b = row;
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        uint8_t *codes = p + i * KVP_QK_K;
        for (int m = 0; m < KVP_QK_K; m += 64)
            for (int l = 0; l < 32; l++) {
                codes[m + l] = b->qs[m / 2 + l] & 0xF;
                codes[m + l + 32] = b->qs[m / 2 + l] >> 4;
            }
        pack_k_affine(p, n, i, b->scales, b->d, b->dmin);
    }
}

static void pack_q5_K(const void *row, int n, uint8_t *p)
{
    const blk_q5_K *b = row;
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        uint8_t *codes = p + i * KVP_QK_K;
        for (int m = 0, bit = 0; m < KVP_QK_K; m += 64, bit += 2)
            for (int l = 0; l < 32; l++) {
                codes[m + l] = (uint8_t)((b->qs[m / 2 + l] & 0xF) | (b->qh[l] >> bit & 1) << 4);
                codes[m + l + 32] = (uint8_t)((b->qs[m / 2 + l] >> 4) | (b->qh[l] >> (bit + 1) & 1) << 4);
            }
        pack_k_affine(p, n, i, b->scales, b->d, b->dmin);
    }
}

static void pack_q6_K(const void *row, int n, uint8_t *p)
{
    const blk_q6_K *b = row;
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        uint8_t *codes = p + i * KVP_QK_K;
        float d = kvp_f16_to_f32(b->d);
        kvp_pack_scale(p, n)[i] = d;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            uint8_t *c = codes + 128 * h;
            for (int l = 0; l < 32; l++) {  /* the stored code, value + 32 */
                c[l] = (uint8_t)((ql[l] & 0xF) | (qh[l] & 3) << 4);
                c[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (qh[l] >> 2 & 3) << 4);
                c[l + 64] = (uint8_t)((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4);
                c[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4);
            }
        }
        for (int j = 0; j < 16; j++) {
            kvp_pack_sc16(p, n)[16 * i + j] = b->scales[j];
            kvp_pack_kx(p, n)[16 * i + j] = -32.0f * d * (float)b->scales[j];
        }
    }
}

static int code_dot(const uint8_t *c, const int8_t *q, int len)
{
    int s = 0;
    for (int l = 0; l < len; l++)
        s += c[l] * q[l];
    return s;
}

/* Family A (the _0/_1 formats): a float scale per block of 32. */
static void gemm_block32(const uint8_t *packed, size_t stride, int rows, const kvp_act *act,
                         int T, float *y, int ldy, int accumulate)
{
    for (int r = 0; r < rows; r++) {
        uint8_t *p = (uint8_t *)packed + (size_t)r * stride;
        const kvp_act *a = act;
        for (int t = 0; t < T; t++, a++) {
            int n = a->n;
            float sum = 0.0f, off = 0.0f;
            for (int b = 0; b < n / KVP_QK; b++) {
                sum += kvp_pack_scale(p, n)[b] * a->d[b] * (float)code_dot(p + b * KVP_QK, a->q + b * KVP_QK, KVP_QK);
                off += kvp_pack_kx(p, n)[b] * a->s[b];
            }
            float *out = &y[(size_t)t * ldy + r];
            *out = accumulate ? *out + sum + off : sum + off;
        }
    }
}

/* Family B (the K formats): an integer scale per 16, a float scale per 256. */
static void gemm_k(const uint8_t *packed, size_t stride, int rows, const kvp_act *act, int T,
                   float *y, int ldy, int accumulate)
{
    for (int r = 0; r < rows; r++) {
        uint8_t *p = (uint8_t *)packed + (size_t)r * stride;
        const kvp_act *a = act;
        for (int t = 0; t < T; t++, a++) {
            int n = a->n;
            const int16_t *sc = kvp_pack_sc16(p, n);
            float sum = 0.0f, off = 0.0f;
            for (int b = 0; b < n / KVP_QK_K; b++) {
                int total = 0;
                for (int j = 0; j < 16; j++)
                    total += sc[16 * b + j] * code_dot(p + b * KVP_QK_K + 16 * j, a->q + b * KVP_QK_K + 16 * j, 16);
                sum += kvp_pack_scale(p, n)[b] * a->d[b] * (float)total;
            }
            for (int j = 0; j < n / 16; j++)
                off += kvp_pack_kx(p, n)[j] * a->s16[j];
            float *out = &y[(size_t)t * ldy + r];
            *out = accumulate ? *out + sum + off : sum + off;
        }
    }
}

static void kv_dots(kvp_kv_type t, const void *rows, int n_rows, const float *q, int n,
                    float scale, float *out)
{
    size_t rb = kvp_kv_row_bytes(t, n);
    for (int j = 0; j < n_rows; j++)
        out[j] = scale * kvp_kv_row_dot(t, (const uint8_t *)rows + (size_t)j * rb, q, n);
}

static void kv_mix(kvp_kv_type t, const void *rows, int n_rows, const float *a, int n, float *y)
{
    size_t rb = kvp_kv_row_bytes(t, n);
    memset(y, 0, (size_t)n * sizeof *y);
    for (int j = 0; j < n_rows; j++)
        kvp_kv_row_axpy(t, y, a[j], (const uint8_t *)rows + (size_t)j * rb, n);
}

void kvp_kernels_scalar(kvp_kernel_set *k)
{
    k->kv_dot = kvp_kv_row_dot;
    k->kv_axpy = kvp_kv_row_axpy;
    k->kv_store = kvp_kv_row_store;
    k->kv_dots = kv_dots;
    k->kv_mix = kv_mix;
    k->quantize[0] = quantize32;
    k->quantize[1] = quantize256;
    k->f32_rows = f32_rows;
    k->small[KVP_GGML_Q8_0] = small_q8_0;
    kvp_dot_fn *tab = k->dot;
    tab[KVP_GGML_F16] = dot_f16;
    tab[KVP_GGML_BF16] = dot_bf16;
    tab[KVP_GGML_Q4_0] = dot_q4_0;
    tab[KVP_GGML_Q4_1] = dot_q4_1;
    tab[KVP_GGML_Q5_0] = dot_q5_0;
    tab[KVP_GGML_Q5_1] = dot_q5_1;
    tab[KVP_GGML_Q2_K] = dot_q2_K;
    tab[KVP_GGML_Q3_K] = dot_q3_K;
    tab[KVP_GGML_Q4_K] = dot_q4_K;
    tab[KVP_GGML_Q5_K] = dot_q5_K;
    tab[KVP_GGML_Q6_K] = dot_q6_K;
    static const struct { uint32_t type; kvp_pack_fn pack; } packs[] = {
        {KVP_GGML_Q8_0, pack_q8_0}, {KVP_GGML_Q4_0, pack_q4_0}, {KVP_GGML_Q4_1, pack_q4_1},
        {KVP_GGML_Q5_0, pack_q5_0}, {KVP_GGML_Q5_1, pack_q5_1}, {KVP_GGML_Q2_K, pack_q2_K},
        {KVP_GGML_Q3_K, pack_q3_K}, {KVP_GGML_Q4_K, pack_q4_K}, {KVP_GGML_Q5_K, pack_q5_K},
        {KVP_GGML_Q6_K, pack_q6_K},
    };
    for (size_t i = 0; i < sizeof packs / sizeof packs[0]; i++) {
        k->pack[packs[i].type] = k->scalar_pack[packs[i].type] = packs[i].pack;
        k->gemm[packs[i].type] = kvp_type_block(packs[i].type) == KVP_QK ? gemm_block32 : gemm_k;
    }
}
