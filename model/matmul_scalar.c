/* Portable dot-product kernels (see matmul_kernels.h): the reference for the SIMD
 * kernels, and what runs where neither AVX2 nor AVX-512 does (or KVP_SIMD=scalar). */
#include <string.h>

#include "model/matmul_kernels.h"

static float dot_f32(const void *row, const kvp_act *a)
{
    const float *w = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n; i++)
        sum += w[i] * a->x[i];
    return sum;
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

static float dot_q8_0(const void *row, const kvp_act *a)
{
    const blk_q8_0 *b = row;
    float sum = 0.0f;
    for (int i = 0; i < a->n / KVP_QK; i++, b++) {
        const int8_t *q = a->q + i * KVP_QK;
        int s = 0;
        for (int j = 0; j < KVP_QK; j++)
            s += b->qs[j] * q[j];
        sum += kvp_f16_to_f32(b->d) * a->d[i] * (float)s;
    }
    return sum;
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

void kvp_kernels_scalar(kvp_dot_fn *tab)
{
    tab[KVP_GGML_F32] = dot_f32;
    tab[KVP_GGML_F16] = dot_f16;
    tab[KVP_GGML_BF16] = dot_bf16;
    tab[KVP_GGML_Q8_0] = dot_q8_0;
    tab[KVP_GGML_Q4_0] = dot_q4_0;
    tab[KVP_GGML_Q4_1] = dot_q4_1;
    tab[KVP_GGML_Q5_0] = dot_q5_0;
    tab[KVP_GGML_Q5_1] = dot_q5_1;
    tab[KVP_GGML_Q2_K] = dot_q2_K;
    tab[KVP_GGML_Q3_K] = dot_q3_K;
    tab[KVP_GGML_Q4_K] = dot_q4_K;
    tab[KVP_GGML_Q5_K] = dot_q5_K;
    tab[KVP_GGML_Q6_K] = dot_q6_K;
}
