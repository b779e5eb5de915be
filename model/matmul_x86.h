/* x86 kernels (dot products and the int8 GEMM), compiled twice (see matmul_kernels.h): by matmul_avx2.c for
 * AVX2 + FMA + F16C, and by matmul_avx512.c with AVX-512 VNNI, where one vpdpbusd
 * replaces the maddubs + madd pair of byte products. The including file sets the target
 * pragma, KVP_VNNI and KVP_KERNELS (the name of the table filler). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "model/matmul_kernels.h"

/* 32 unsigned bytes times 32 signed bytes, summed in fours: 8 int32 */
static inline __m256i mulsum_i32(__m256i u, __m256i s)
{
#if KVP_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

static inline __m256 mulsum_f32(__m256i u, __m256i s)
{
    return _mm256_cvtepi32_ps(mulsum_i32(u, s));
}

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float h2f(uint16_t h)
{
    return _cvtsh_ss(h);
}

static inline __m256i load256(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* 16 bytes of nibble pairs -> 32 codes: low nibbles (elements 0..15), then high */
static inline __m256i nibbles(const uint8_t *qs)
{
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0xF));
}

/* bit j of the 32-bit word -> 0x10 in byte j (the fifth bit of the Q5 codes) */
static inline __m256i fifth_bits(const uint8_t *qh4)
{
    uint32_t x;
    memcpy(&x, qh4, 4);
#if KVP_VNNI
    /* AVX-512BW: the word is a byte mask */
    return _mm256_maskz_mov_epi8((__mmask32)x, _mm256_set1_epi8(0x10));
#else
    const __m256i spread = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                              0x0202020202020202, 0x0303030303030303);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread);
    /* each byte j of a group of 8 keeps only bit j (all others forced to 1) */
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    v = _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
#endif
}

/* ---- activation quantizers: the scalar set's rules, 8 lanes at a time (cvtps rounds to
 * nearest even as lrintf does) ---- */

static inline __m256 abs8(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

static inline float hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 32 values times `scale`, rounded, to int8 (the caller keeps them within +-127.x) */
static inline __m256i round32(const float *x, __m256 scale, __m256i *sum)
{
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), scale));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), scale));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), scale));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), scale));
    *sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    /* the packs work per 128-bit lane: restore element order */
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline int hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static void quantize32(const float *x, int n, kvp_act *a)
{
    for (int b = 0; b < n / KVP_QK; b++) {
        const float *xb = x + b * KVP_QK;
        __m256 m = _mm256_max_ps(_mm256_max_ps(abs8(_mm256_loadu_ps(xb)), abs8(_mm256_loadu_ps(xb + 8))),
                                 _mm256_max_ps(abs8(_mm256_loadu_ps(xb + 16)), abs8(_mm256_loadu_ps(xb + 24))));
        float d = hmax(m) / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        __m256i sum;
        _mm256_storeu_si256((__m256i *)(a->q + b * KVP_QK), round32(xb, _mm256_set1_ps(id), &sum));
        a->d[b] = d;
        a->s[b] = d * (float)hsum_i32(sum);
    }
}

static void quantize256(const float *x, int n, kvp_act *a)
{
    for (int b = 0; b < n / KVP_QK_K; b++) {
        const float *xb = x + b * KVP_QK_K;
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < KVP_QK_K; j += 8)
            m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(xb + j)));
        float amax = hmax(m), max = 0.0f;
        int8_t *q = a->q + b * KVP_QK_K;
        int16_t *bs = a->bsums + b * 16;
        if (!(amax > 0.0f)) {
            a->d[b] = 0.0f;
            memset(q, 0, KVP_QK_K);
            memset(bs, 0, 16 * sizeof *bs);
            continue;
        }
        for (int j = 0; j < KVP_QK_K; j++)  /* the first element of that magnitude */
            if (fabsf(xb[j]) == amax) {
                max = xb[j];
                break;
            }
        float iscale = -127.0f / max;
        for (int j = 0; j < KVP_QK_K; j += 32) {
            __m256i sum;
            /* a rounded 128 saturates to 127 in the packs, as the scalar rule clamps it */
            __m256i v = round32(xb + j, _mm256_set1_ps(iscale), &sum);
            _mm256_storeu_si256((__m256i *)(q + j), v);
            __m256i s16 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v),
                                            _mm256_set1_epi16(1));  /* 8 sums of 4 */
            int32_t s4[8];
            _mm256_storeu_si256((__m256i *)s4, s16);
            bs[j / 16] = (int16_t)(s4[0] + s4[1] + s4[2] + s4[3]);
            bs[j / 16 + 1] = (int16_t)(s4[4] + s4[5] + s4[6] + s4[7]);
        }
        a->d[b] = 1.0f / iscale;
    }
}

static float dot_f16(const void *row, const kvp_act *a)
{
    const uint16_t *w = row;
    const float *x = a->x;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 32 <= a->n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))),
                             _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8))),
                             _mm256_loadu_ps(x + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 16))),
                             _mm256_loadu_ps(x + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 24))),
                             _mm256_loadu_ps(x + i + 24), s3);
    }
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < a->n; i++)
        sum += h2f(w[i]) * x[i];
    return sum;
}

static inline __m256 bf16x8(const uint16_t *w)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static float dot_bf16(const void *row, const kvp_act *a)
{
    const uint16_t *w = row;
    const float *x = a->x;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 32 <= a->n; i += 32) {
        s0 = _mm256_fmadd_ps(bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(bf16x8(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
        s2 = _mm256_fmadd_ps(bf16x8(w + i + 16), _mm256_loadu_ps(x + i + 16), s2);
        s3 = _mm256_fmadd_ps(bf16x8(w + i + 24), _mm256_loadu_ps(x + i + 24), s3);
    }
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < a->n; i++)
        sum += kvp_bf16_to_f32(w[i]) * x[i];
    return sum;
}

/* The 32-element formats with unsigned codes: sum over blocks of
 * d_w * (d_a * sum(code * q)) + extra_w * s_a, where extra_w is -8 d / -16 d for the _0
 * formats and m for the _1 formats. */
#define BLOCK32_STEP(ACC, EXTRA_SUM, I, CODES, EXTRA)                                            \
    do {                                                                              \
        const __typeof__(*blocks) *b = &blocks[I];                                    \
        float d = h2f(b->d);                                                          \
        __m256 p = mulsum_f32(CODES, load256(a->q + (I) * KVP_QK));                   \
        ACC = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d[I]), p, ACC);                   \
        EXTRA_SUM += (EXTRA) * a->s[I];                                               \
    } while (0)

/* two independent accumulators, so consecutive blocks do not wait on one fma chain */
#define BLOCK32_DOT(NAME, BLK, CODES, EXTRA)                                          \
    static float NAME(const void *row, const kvp_act *a)                              \
    {                                                                                 \
        const BLK *blocks = row;                                                      \
        const int nb = a->n / KVP_QK;                                                 \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;                               \
        float extra0 = 0.0f, extra1 = 0.0f;                                           \
        int i = 0;                                                                    \
        for (; i + 2 <= nb; i += 2) {                                                 \
            BLOCK32_STEP(acc0, extra0, i, CODES, EXTRA);                              \
            BLOCK32_STEP(acc1, extra1, i + 1, CODES, EXTRA);                          \
        }                                                                             \
        if (i < nb)                                                                   \
            BLOCK32_STEP(acc0, extra0, i, CODES, EXTRA);                              \
        return hsum(_mm256_add_ps(acc0, acc1)) + extra0 + extra1;                     \
    }
BLOCK32_DOT(dot_q4_0, blk_q4_0, nibbles(b->qs), -8.0f * d)
BLOCK32_DOT(dot_q4_1, blk_q4_1, nibbles(b->qs), h2f(b->m))
BLOCK32_DOT(dot_q5_0, blk_q5_0, _mm256_or_si256(nibbles(b->qs), fifth_bits(b->qh)), -16.0f * d)
BLOCK32_DOT(dot_q5_1, blk_q5_1, _mm256_or_si256(nibbles(b->qs), fifth_bits(b->qh)), h2f(b->m))

/* Q4_K / Q5_K: the 8 scales multiply int16 pair sums (maddubs) with one madd each */
static inline void k4_scales(const uint8_t *packed, uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 8; j++)
        kvp_k4_scale_min(j, packed, &sc[j], &m[j]);
}

static inline int k_mins(const uint8_t m[8], const int16_t *bs)
{
    int s = 0;
    for (int j = 0; j < 8; j++)
        s += m[j] * (bs[2 * j] + bs[2 * j + 1]);
    return s;
}

static inline __m256i scaled(__m256i codes, const int8_t *q, int scale)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, load256(q)), _mm256_set1_epi16((short)scale));
}

static float dot_q4_K(const void *row, const kvp_act *a)
{
    const blk_q4_K *b = row;
    const __m256i low4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        uint8_t sc[8], m[8];
        k4_scales(b->scales, sc, m);
        const int8_t *q = a->q + i * KVP_QK_K;
        __m256i sumi = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256i c = load256(b->qs + 32 * k);
            __m256i lo = _mm256_and_si256(c, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), low4);
            sumi = _mm256_add_epi32(sumi, scaled(lo, q + 64 * k, sc[2 * k]));
            sumi = _mm256_add_epi32(sumi, scaled(hi, q + 64 * k + 32, sc[2 * k + 1]));
        }
        float da = a->d[i];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b->d) * da), _mm256_cvtepi32_ps(sumi), acc);
        mins += h2f(b->dmin) * da * (float)k_mins(m, a->bsums + i * 16);
    }
    return hsum(acc) - mins;
}

static float dot_q5_K(const void *row, const kvp_act *a)
{
    const blk_q5_K *b = row;
    const __m256i low4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        uint8_t sc[8], m[8];
        k4_scales(b->scales, sc, m);
        const int8_t *q = a->q + i * KVP_QK_K;
        __m256i qh = load256(b->qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256i c = load256(b->qs + 32 * k);
            __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(qh, one), 4);
            __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4);
            qh = _mm256_srli_epi16(qh, 2);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(c, low4), hlo);
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low4), hhi);
            sumi = _mm256_add_epi32(sumi, scaled(lo, q + 64 * k, sc[2 * k]));
            sumi = _mm256_add_epi32(sumi, scaled(hi, q + 64 * k + 32, sc[2 * k + 1]));
        }
        float da = a->d[i];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b->d) * da), _mm256_cvtepi32_ps(sumi), acc);
        mins += h2f(b->dmin) * da * (float)k_mins(m, a->bsums + i * 16);
    }
    return hsum(acc) - mins;
}

/* Q6_K: codes 0..63 (the stored value + 32), so sum((code - 32) q) =
 * sum(code q) - 32 sum(q), the second from the activation's sums of 16. */
static float dot_q6_K(const void *row, const kvp_act *a)
{
    const blk_q6_K *b = row;
    const __m256i low4 = _mm256_set1_epi8(0xF), low2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    float offsets = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        const int8_t *q = a->q + i * KVP_QK_K;
        const int16_t *bs = a->bsums + i * 16;
        int offset = 0;
        for (int j = 0; j < 16; j++)
            offset += b->scales[j] * bs[j];
        __m256i sumi = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            const int8_t *sc = b->scales + 8 * n;
            const int8_t *qq = q + 128 * n;
            __m256i l0 = load256(b->ql + 64 * n), l1 = load256(b->ql + 64 * n + 32);
            __m256i h = load256(b->qh + 32 * n);
            __m256i c[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, low4),
                                _mm256_slli_epi16(_mm256_and_si256(h, low2), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), low2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), low2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), low2), 4)),
            };
            for (int k = 0; k < 4; k++) {
                __m256i p = _mm256_maddubs_epi16(c[k], load256(qq + 32 * k));
                __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        __m256 v = _mm256_cvtepi32_ps(sumi);
        float d = h2f(b->d) * a->d[i];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), v, acc);
        offsets += d * (float)offset;
    }
    return hsum(acc) - 32.0f * offsets;
}

/* Q2_K / Q3_K: for each half (128 elements) and each 2-bit plane (shift), the 32 bytes
 * of qs give 32 consecutive elements: 16 with scale j, 16 with scale j + 1 */
static inline __m256i pair_scales(int lo, int hi)
{
    return _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo));
}

static float dot_q2_K(const void *row, const kvp_act *a)
{
    const blk_q2_K *b = row;
    const __m256i low2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        const int8_t *q = a->q + i * KVP_QK_K;
        const int16_t *bs = a->bsums + i * 16;
        int sm = 0;
        for (int j = 0; j < 16; j++)
            sm += (b->scales[j] >> 4) * bs[j];
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i c = load256(b->qs + 32 * h);
            for (int k = 0; k < 4; k++) {
                __m256i codes = _mm256_and_si256(_mm256_srli_epi16(c, 2 * k), low2);
                __m256i p = _mm256_maddubs_epi16(codes, load256(q + 128 * h + 32 * k));
                int is = 8 * h + 2 * k;
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, pair_scales(b->scales[is] & 0xF,
                                                                                b->scales[is + 1] & 0xF)));
            }
        }
        float da = a->d[i];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b->d) * da), _mm256_cvtepi32_ps(sumi), acc);
        mins += h2f(b->dmin) * da * (float)sm;
    }
    return hsum(acc) - mins;
}

/* Q3_K: code + 4 (0..7) from two bits of qs and the hmask bit, minus 4 sum(q) per 16 */
static float dot_q3_K(const void *row, const kvp_act *a)
{
    const blk_q3_K *b = row;
    const __m256i low2 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    float offsets = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++) {
        const int8_t *q = a->q + i * KVP_QK_K;
        const int16_t *bs = a->bsums + i * 16;
        int8_t sc[16];
        kvp_q3_scales(b->scales, sc);
        int offset = 0;
        for (int j = 0; j < 16; j++)
            offset += sc[j] * bs[j];
        __m256i hm = load256(b->hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i c = load256(b->qs + 32 * h);
            for (int k = 0; k < 4; k++) {
                __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + k)));
                __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
                __m256i codes = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 2 * k), low2), high);
                __m256i p = _mm256_maddubs_epi16(codes, load256(q + 128 * h + 32 * k));
                int is = 8 * h + 2 * k;
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, pair_scales(sc[is], sc[is + 1])));
            }
        }
        float d = h2f(b->d) * a->d[i];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        offsets += d * (float)offset;
    }
    return hsum(acc) - 4.0f * offsets;
}

/* ---- int8 GEMM (matmul_kernels.h): packing and register-blocked tiles ------------- */

static inline void store256(uint8_t *p, __m256i v)
{
    _mm256_storeu_si256((__m256i *)p, v);
}

/* Packing runs in two steps: the row in the scalar set's element-order layout (SIMD
 * decoders below for the common formats, the scalar ones for the rest), then regrouped
 * (regroup) into this set's layout:
 *   codes  u8 [pad]      the grouped layout of kvp_gemm_group(type) (pad = kvp_group_pad)
 *   scale  f32 [pad/g]   each sub-block's weight scale (K formats: d * its integer scale)
 *   kx     f32 [pad/g]   each sub-block's offset term, against the activation's sg */
#define PACK_BLOCK32(NAME, BLK, CODES, KX)                                                \
    static void NAME(const void *row, int n, uint8_t *p)                                  \
    {                                                                                     \
        const BLK *b = row;                                                               \
        float *scale = kvp_pack_scale(p, n), *kx = kvp_pack_kx(p, n);                     \
        for (int i = 0; i < n / KVP_QK; i++, b++) {                                       \
            float d = h2f(b->d);                                                          \
            store256(p + i * KVP_QK, CODES);                                              \
            scale[i] = d;                                                                 \
            kx[i] = KX;                                                                   \
        }                                                                                 \
    }
#if KVP_VNNI
/* vpdpbusd sums its byte products in 32 bits: q + 128 fits as unsigned codes */
PACK_BLOCK32(natural_q8_0, blk_q8_0, _mm256_xor_si256(load256(b->qs), _mm256_set1_epi8(-128)), -128.0f * d)
#else
/* maddubs would saturate on 255 x 127 pairs: the codes stay signed (gemm_signed) */
PACK_BLOCK32(natural_q8_0, blk_q8_0, load256(b->qs), 0.0f)
#endif
PACK_BLOCK32(natural_q4_0, blk_q4_0, nibbles(b->qs), -8.0f * d)
PACK_BLOCK32(natural_q4_1, blk_q4_1, nibbles(b->qs), h2f(b->m))
PACK_BLOCK32(natural_q5_0, blk_q5_0, _mm256_or_si256(nibbles(b->qs), fifth_bits(b->qh)), -16.0f * d)
PACK_BLOCK32(natural_q5_1, blk_q5_1, _mm256_or_si256(nibbles(b->qs), fifth_bits(b->qh)), h2f(b->m))

/* Q4_K / Q5_K: the scale and min of each 32 go to both of its halves of 16 */
static inline void pack_k_scales(uint8_t *p, int n, int i, const uint8_t *scales, uint16_t d,
                                 uint16_t dmin)
{
    uint8_t sc[8], m[8];
    k4_scales(scales, sc, m);
    float dm = h2f(dmin);
    int16_t *sc16 = kvp_pack_sc16(p, n) + 16 * i;
    float *kx = kvp_pack_kx(p, n) + 16 * i;
    kvp_pack_scale(p, n)[i] = h2f(d);
    for (int j = 0; j < 8; j++) {
        sc16[2 * j] = sc16[2 * j + 1] = sc[j];
        kx[2 * j] = kx[2 * j + 1] = -dm * (float)m[j];
    }
}

static void natural_q4_K(const void *row, int n, uint8_t *p)
{
    const blk_q4_K *b = row;
    const __m256i low4 = _mm256_set1_epi8(0xF);
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        uint8_t *codes = p + i * KVP_QK_K;
        for (int k = 0; k < 4; k++) {
            __m256i c = load256(b->qs + 32 * k);
            store256(codes + 64 * k, _mm256_and_si256(c, low4));
            store256(codes + 64 * k + 32, _mm256_and_si256(_mm256_srli_epi16(c, 4), low4));
        }
        pack_k_scales(p, n, i, b->scales, b->d, b->dmin);
    }
}

static void natural_q5_K(const void *row, int n, uint8_t *p)
{
    const blk_q5_K *b = row;
    const __m256i low4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        uint8_t *codes = p + i * KVP_QK_K;
        __m256i qh = load256(b->qh);
        for (int k = 0; k < 4; k++) {
            __m256i c = load256(b->qs + 32 * k);
            __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(qh, one), 4);
            __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4);
            qh = _mm256_srli_epi16(qh, 2);
            store256(codes + 64 * k, _mm256_or_si256(_mm256_and_si256(c, low4), hlo));
            store256(codes + 64 * k + 32,
                     _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low4), hhi));
        }
        pack_k_scales(p, n, i, b->scales, b->d, b->dmin);
    }
}

static void natural_q6_K(const void *row, int n, uint8_t *p)
{
    const blk_q6_K *b = row;
    const __m256i low4 = _mm256_set1_epi8(0xF), low2 = _mm256_set1_epi8(3);
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        uint8_t *codes = p + i * KVP_QK_K;
        float d = h2f(b->d);
        kvp_pack_scale(p, n)[i] = d;
        for (int h = 0; h < 2; h++) {
            __m256i l0 = load256(b->ql + 64 * h), l1 = load256(b->ql + 64 * h + 32);
            __m256i hb = load256(b->qh + 32 * h);
            uint8_t *c = codes + 128 * h;
            store256(c, _mm256_or_si256(_mm256_and_si256(l0, low4),
                                        _mm256_slli_epi16(_mm256_and_si256(hb, low2), 4)));
            store256(c + 32, _mm256_or_si256(_mm256_and_si256(l1, low4),
                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), low2), 4)));
            store256(c + 64, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), low2), 4)));
            store256(c + 96, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), low2), 4)));
        }
        for (int j = 0; j < 16; j++) {
            kvp_pack_sc16(p, n)[16 * i + j] = b->scales[j];
            kvp_pack_kx(p, n)[16 * i + j] = -32.0f * d * (float)b->scales[j];
        }
    }
}

/* Where a SIMD set's packed row keeps its sub-block scales and offset terms. */
static inline float *grouped_scale(const uint8_t *p, int n, int g)
{
    return (float *)(p + kvp_group_pad(n, g));
}

static inline float *grouped_kx(const uint8_t *p, int n, int g)
{
    int pad = kvp_group_pad(n, g);
    return (float *)(p + pad) + pad / g;
}

/* kvp_group_bytes for g = 32 and whole groups: each group is an 8 x 8 transpose of
 * 32-bit words (sub-block j's word s goes to step s, lane j) */
static void group32(const uint8_t *src, int n, uint8_t *dst)
{
    for (int k = 0; k < n; k += 256) {
        __m256i r[8], t[8], u[8];
        for (int j = 0; j < 8; j++)
            r[j] = load256(src + k + 32 * j);
        for (int j = 0; j < 8; j += 2) {
            t[j] = _mm256_unpacklo_epi32(r[j], r[j + 1]);
            t[j + 1] = _mm256_unpackhi_epi32(r[j], r[j + 1]);
        }
        for (int j = 0; j < 8; j += 4) {
            u[j] = _mm256_unpacklo_epi64(t[j], t[j + 2]);
            u[j + 1] = _mm256_unpackhi_epi64(t[j], t[j + 2]);
            u[j + 2] = _mm256_unpacklo_epi64(t[j + 1], t[j + 3]);
            u[j + 3] = _mm256_unpackhi_epi64(t[j + 1], t[j + 3]);
        }
        for (int s = 0; s < 4; s++) {
            store256(dst + k + 32 * s, _mm256_permute2x128_si256(u[s], u[s + 4], 0x20));
            store256(dst + k + 32 * (s + 4), _mm256_permute2x128_si256(u[s], u[s + 4], 0x31));
        }
    }
}

/* The scalar set's layout (nat) -> this set's (p), for a type of sub-block size g. */
static void regroup(uint32_t type, const uint8_t *nat, int n, uint8_t *p)
{
    int g = kvp_gemm_group(type), pad = kvp_group_pad(n, g);
    float *scale = grouped_scale(p, n, g), *kx = grouped_kx(p, n, g);
    const float *nscale = kvp_pack_scale((uint8_t *)nat, n), *nkx = kvp_pack_kx((uint8_t *)nat, n);
    const int16_t *sc16 = kvp_pack_sc16((uint8_t *)nat, n);
    int k_format = kvp_type_block(type) == KVP_QK_K, per16 = g / 16;
    if (g == 32 && n % 256 == 0)
        group32(nat, n, p);
    else
        kvp_group_bytes(nat, n, g, p);
    for (int j = 0; j < pad / g; j++) {
        if (j * g >= n)
            scale[j] = kx[j] = 0.0f;
        else if (!k_format)
            scale[j] = nscale[j], kx[j] = nkx[j];
        else
            scale[j] = nscale[j * g / KVP_QK_K] * (float)sc16[j * per16],
            kx[j] = nkx[j * per16];
    }
}

/* pack = the element-order packer (SIMD where written, else the scalar set's) + regroup */
static kvp_pack_fn natural[KVP_N_WEIGHT_TYPES];
#define PACK_GROUPED(TYPE)                                                                \
    static void pack_##TYPE(const void *row, int n, uint8_t *p)                          \
    {                                                                                     \
        uint8_t nat[KVP_PACK_BYTES(n)];                                                   \
        natural[TYPE](row, n, nat);                                                       \
        regroup(TYPE, nat, n, p);                                                         \
    }
PACK_GROUPED(KVP_GGML_Q8_0)
PACK_GROUPED(KVP_GGML_Q4_0)
PACK_GROUPED(KVP_GGML_Q4_1)
PACK_GROUPED(KVP_GGML_Q5_0)
PACK_GROUPED(KVP_GGML_Q5_1)
PACK_GROUPED(KVP_GGML_Q2_K)
PACK_GROUPED(KVP_GGML_Q3_K)
PACK_GROUPED(KVP_GGML_Q4_K)
PACK_GROUPED(KVP_GGML_Q5_K)
PACK_GROUPED(KVP_GGML_Q6_K)

/* sum of a[i] * b[i], i < len */
static inline float dotf(const float *a, const float *b, int len)
{
    __m256 s = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= len; i += 8)
        s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
    float sum = hsum(s);
    for (; i < len; i++)
        sum += a[i] * b[i];
    return sum;
}

/* Tiles of R packed rows x C activation rows: each loaded code register serves C
 * tokens and each activation register R rows. R and C are constants where the tile is
 * full (the loops unroll into registers) and the remainder where it is not. AVX-512
 * has 32 vector registers, AVX2 16. */
#if KVP_VNNI
enum { RT = 4, CT = 3 };

/* 8 floats in both halves (AVX-512F: no DQ needed) */
static inline __m512 twice8(const float *p)
{
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}

/* y[c][r] = sum over groups of (scale_r * dg_c) . (int32 lanes: one sub-block each)
 * + kx_r . sg_c, on 512-bit vectors: a vector holds two steps of a group (lanes 8-15:
 * the next 4 bytes of the same eight sub-blocks), so each vpdpbusd does 64 products
 * (this CPU issues as many 512-bit ones a cycle as 256-bit ones), and the group's
 * scales are broadcast to both halves. The packed rows and the activation's qg start on
 * cache lines (matmul.c): unaligned, the 512-bit loads straddle two lines and this
 * kernel ran 80 GMAC/s against 115 aligned (Q8_0, 4864 x 896, T = 256, one thread).
 * 4 x 3 tiles: 12 sums and 12 accumulators, 4 rows of codes, one activation. */
static inline __attribute__((always_inline)) void
tile(const uint8_t *packed, size_t stride, int R, const kvp_act *act, int C, float *y, int ldy,
     int accumulate, int SIGNED, int g)
{
    (void)SIGNED;   /* VNNI takes unsigned codes */
    const int n = act[0].n, pad = kvp_group_pad(n, g), pairs = g / 8;
    const uint8_t *codes[RT] = {0};
    const float *scale[RT] = {0};
    __m512 acc[RT][CT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        codes[r] = packed + (size_t)r * stride;
        scale[r] = grouped_scale(codes[r], n, g);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    }
    for (int k = 0; k < pad / (8 * g); k++) {
        __m512i isum[RT][CT];
#pragma GCC unroll 4
        for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
            for (int c = 0; c < CT; c++)
                isum[r][c] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int s = 0; s < pairs; s++) {
            __m512i w[RT];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                w[r] = _mm512_loadu_si512(codes[r] + k * 8 * g + 64 * s);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m512i q = _mm512_loadu_si512(act[c].qg + k * 8 * g + 64 * s);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++)
                    isum[r][c] = _mm512_dpbusd_epi32(isum[r][c], w[r], q);
            }
        }
        __m512 dg[CT];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            dg[c] = twice8(act[c].dg + 8 * k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 sw = twice8(scale[r] + 8 * k);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), _mm512_mul_ps(sw, dg[c]),
                                            acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const float *kx = grouped_kx(codes[r], n, g);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            float v = _mm512_reduce_add_ps(acc[r][c]) + dotf(kx, act[c].sg, pad / g);
            float *o = &y[(size_t)c * ldy + r];
            *o = accumulate ? *o + v : v;
        }
    }
}
#else
enum { RT = 4, CT = 3 };

/* y[c][r] = sum over groups of (scale_r * dg_c) . (int32 lanes: one sub-block each)
 *         + kx_r . sg_c; SIGNED (AVX2's Q8_0): signed codes, no offset term. */
static inline __attribute__((always_inline)) void
tile(const uint8_t *packed, size_t stride, int R, const kvp_act *act, int C, float *y, int ldy,
     int accumulate, int SIGNED, int g)
{
    const int n = act[0].n, pad = kvp_group_pad(n, g), steps = g / 4;
    const uint8_t *codes[RT] = {0};
    const float *scale[RT] = {0};
    __m256 acc[RT][CT] = {{{0}}};
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        codes[r] = packed + (size_t)r * stride;
        scale[r] = grouped_scale(codes[r], n, g);
    }
    for (int k = 0; k < pad / (8 * g); k++) {
        __m256i isum[RT][CT] = {{{0}}};
#pragma GCC unroll 8
        for (int s = 0; s < steps; s++) {
            __m256i w[RT] = {{0}}, aw[RT] = {{0}};
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                w[r] = load256(codes[r] + k * 8 * g + 32 * s);
                aw[r] = SIGNED ? _mm256_sign_epi8(w[r], w[r]) : w[r];
            }
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256i q = load256(act[c].qg + k * 8 * g + 32 * s);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    __m256i qs = SIGNED ? _mm256_sign_epi8(q, w[r]) : q;
                    isum[r][c] = _mm256_add_epi32(isum[r][c], mulsum_i32(aw[r], qs));
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 sw = _mm256_loadu_ps(scale[r] + 8 * k);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]),
                                            _mm256_mul_ps(sw, _mm256_loadu_ps(act[c].dg + 8 * k)),
                                            acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const float *kx = grouped_kx(codes[r], n, g);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            float v = hsum(acc[r][c]) + (SIGNED ? 0.0f : dotf(kx, act[c].sg, pad / g));
            float *o = &y[(size_t)c * ldy + r];
            *o = accumulate ? *o + v : v;
        }
    }
}
#endif

/* Remainder tiles (fewer rows or tokens than a full tile): the same code, not unrolled */
static __attribute__((noinline)) void tail(const uint8_t *p, size_t stride, int R,
                                           const kvp_act *act, int C, float *y, int ldy,
                                           int accumulate, int SIGNED)
{
    tile(p, stride, R, act, C, y, ldy, accumulate, SIGNED, act[0].g);
}

/* Token tiles outside, row tiles inside: the chunk's packed rows stay in L2 while a
 * tile of activations stays in L1. */
static inline __attribute__((always_inline)) void
gemm_tiles(const uint8_t *packed, size_t stride, int rows, const kvp_act *act, int T, float *y,
           int ldy, int accumulate, int SIGNED, int g)
{
    for (int t = 0; t < T; t += CT)
        for (int r = 0; r < rows; r += RT) {
            const uint8_t *p = packed + (size_t)r * stride;
            float *yt = y + (size_t)t * ldy + r;
            if (r + RT <= rows && t + CT <= T)
                tile(p, stride, RT, act + t, CT, yt, ldy, accumulate, SIGNED, g);
            else
                tail(p, stride, rows - r < RT ? rows - r : RT, act + t, T - t < CT ? T - t : CT,
                     yt, ldy, accumulate, SIGNED);
        }
}

/* one instance per sub-block size, so the steps of a group unroll too */
static void gemm_unsigned(const uint8_t *packed, size_t stride, int rows, const kvp_act *act,
                          int T, float *y, int ldy, int accumulate)
{
    if (act[0].g == 16)
        gemm_tiles(packed, stride, rows, act, T, y, ldy, accumulate, 0, 16);
    else
        gemm_tiles(packed, stride, rows, act, T, y, ldy, accumulate, 0, 32);
}

#if !KVP_VNNI
static void gemm_signed(const uint8_t *packed, size_t stride, int rows, const kvp_act *act,
                        int T, float *y, int ldy, int accumulate)
{
    gemm_tiles(packed, stride, rows, act, T, y, ldy, accumulate, 1, 32);
}
#endif

/* f32 rows at small T (kvp_f32_rows_fn): tiles of R weight rows x C activation rows,
 * each (row, token) summed in its own register in element order (AVX-512: 16 lanes, the
 * last piece under a mask; AVX2: 8 lanes, then hsum and the scalar tail), for every tile
 * shape alike (so a row's result does not depend on T). Each loaded weight register
 * serves C tokens and each activation register R rows; AVX-512 has 32 vector registers
 * (6 x 4 tiles: 24 sums, 6 weight registers and one activation; measured 1.1-1.3x the
 * 4 x 4 tiles at T = 4..256 on 768 columns), AVX2 16 (3 x 4: 12 sums, 3 weight registers
 * and one activation; on a Zen 3, `bench_matmul --f32-small 768`, two threads, 66-86
 * GFLOP/s at T = 32..256 against 50-66 for 2 x 4 tiles, whose 6 loads per 8 FMAs left
 * the FMA units waiting). */
#if KVP_VNNI
#define F32_R 6
#else
#define F32_R 3
#endif
#define F32_C 4

#if KVP_VNNI
/* The sums of a, b, c, d in lanes 0..3, each in _mm512_reduce_add_ps's order (halves,
 * then quarters, then lanes two apart, then neighbours), so the sums equal those of
 * reducing each register alone, for 14 instructions instead of 4 x 8. */
static inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    __m512 y = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
    z = _mm512_add_ps(z, _mm512_permute_ps(z, 0x4E));
    z = _mm512_add_ps(z, _mm512_permute_ps(z, 0xB1));
    return _mm512_castps512_ps128(
        _mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), z));
}

static inline __attribute__((always_inline)) void
f32_tile(const float *w, int n, const float *x, float *y, int ldy, int accumulate, int R, int C)
{
    __m512 s[F32_R][F32_C];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++)
            s[i][j] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 wv[F32_R];
        for (int i = 0; i < R; i++)
            wv[i] = _mm512_loadu_ps(w + (size_t)i * n + k);
        for (int j = 0; j < C; j++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)j * n + k);
            for (int i = 0; i < R; i++)
                s[i][j] = _mm512_fmadd_ps(wv[i], xv, s[i][j]);
        }
    }
    if (k < n) {
        __mmask16 m = (__mmask16)((1u << (n - k)) - 1);
        __m512 wv[F32_R];
        for (int i = 0; i < R; i++)
            wv[i] = _mm512_maskz_loadu_ps(m, w + (size_t)i * n + k);
        for (int j = 0; j < C; j++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)j * n + k);
            for (int i = 0; i < R; i++)
                s[i][j] = _mm512_fmadd_ps(wv[i], xv, s[i][j]);
        }
    }
    /* four rows' sums of a token at a time, into consecutive outputs */
    for (int j = 0; j < C; j++)
        for (int i = 0; i < R; i += 4) {
            __m512 z = _mm512_setzero_ps();
            __m128 v = reduce4(s[i][j], i + 1 < R ? s[i + 1][j] : z, i + 2 < R ? s[i + 2][j] : z,
                               i + 3 < R ? s[i + 3][j] : z);
            __mmask8 m = (__mmask8)((1u << (R - i < 4 ? R - i : 4)) - 1);
            float *o = y + (size_t)j * ldy + i;
            _mm_mask_storeu_ps(o, m, accumulate ? _mm_add_ps(_mm_maskz_loadu_ps(m, o), v) : v);
        }
}
#else
static inline __attribute__((always_inline)) void
f32_tile(const float *w, int n, const float *x, float *y, int ldy, int accumulate, int R, int C)
{
    __m256 s[F32_R][F32_C];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++)
            s[i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 wv[F32_R];
        for (int i = 0; i < R; i++)
            wv[i] = _mm256_loadu_ps(w + (size_t)i * n + k);
        for (int j = 0; j < C; j++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)j * n + k);
            for (int i = 0; i < R; i++)
                s[i][j] = _mm256_fmadd_ps(wv[i], xv, s[i][j]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            float v = hsum(s[i][j]);
            for (int e = k; e < n; e++)
                v += w[(size_t)i * n + e] * x[(size_t)j * n + e];
            float *o = y + (size_t)j * ldy + i;
            *o = accumulate ? *o + v : v;
        }
}
#endif

/* The tiles of R rows against every token: full tiles of F32_C, then the rest. Each
 * tile first prefetches its share of `next` (`lines` cache lines: the strip after next),
 * so the prefetches spread over the strip's work rather than queueing at its start. */
static inline __attribute__((always_inline)) void
f32_strip(const float *w, int n, const float *x, int T, float *y, int ldy, int accumulate, int R,
          const char *next, size_t lines)
{
    size_t tiles = (size_t)(T + F32_C - 1) / F32_C;
    for (int i = 0, t = 0; t < T; i++, t += F32_C) {
        for (size_t l = lines * i / tiles; next && l < lines * (i + 1) / tiles; l++)
            _mm_prefetch(next + 64 * l, _MM_HINT_T0);
        const float *xt = x + (size_t)t * n;
        float *yt = y + (size_t)t * ldy;
        switch (T - t < F32_C ? T - t : F32_C) {
        case 4: f32_tile(w, n, xt, yt, ldy, accumulate, R, 4); break;
        case 3: f32_tile(w, n, xt, yt, ldy, accumulate, R, 3); break;
        case 2: f32_tile(w, n, xt, yt, ldy, accumulate, R, 2); break;
        default: f32_tile(w, n, xt, yt, ldy, accumulate, R, 1); break;
        }
    }
}

static void f32_rows(const float *w, int rows, int n, const float *x, int T, float *y, int ldy,
                     int accumulate)
{
    size_t lines = F32_R * (size_t)n * sizeof *w / 64;
    int r = 0;
    for (; r + F32_R <= rows; r += F32_R) {
        /* the strip after next (see small_q8_0) */
        const char *next =
            r + 3 * F32_R <= rows ? (const char *)(w + (size_t)(r + 2 * F32_R) * n) : NULL;
        f32_strip(w + (size_t)r * n, n, x, T, y + r, ldy, accumulate, F32_R, next, lines);
    }
    /* the last rows as one narrower strip */
    w += (size_t)r * n;
    y += r;
    switch (rows - r) {
#if F32_R > 5
    case 5: f32_strip(w, n, x, T, y, ldy, accumulate, 5, NULL, 0); break;
#endif
#if F32_R > 4
    case 4: f32_strip(w, n, x, T, y, ldy, accumulate, 4, NULL, 0); break;
#endif
#if F32_R > 3
    case 3: f32_strip(w, n, x, T, y, ldy, accumulate, 3, NULL, 0); break;
#endif
#if F32_R > 2
    case 2: f32_strip(w, n, x, T, y, ldy, accumulate, 2, NULL, 0); break;
#endif
    case 1: f32_strip(w, n, x, T, y, ldy, accumulate, 1, NULL, 0); break;
    default: break;
    }
}

/* ---- Q8_0 at small T (kvp_small_fn): each block read once for T activation rows ---- */

#if KVP_VNNI
/* Tiles of Q8_R weight rows x Q8_C activation rows, two blocks to a 512-bit vector. The
 * weight codes are read unsigned (code + 128, as vpdpbusd wants its first operand) and
 * each lane starts at the activation's o4 (-128 x the sum of the 4 codes it multiplies),
 * so every lane sums 4 exact products; then one multiply-add per lane by d_w x d_a (the
 * activation's d4). Each (row, token) has its own accumulator and runs the same steps
 * whatever the tile, so a row's result does not depend on T. 32 vector registers: 12
 * accumulators, 4 rows of codes and 4 of scales (4 x 4 tiles spill). */
#define Q8_R 4
#define Q8_C 3

/* [d of block 0] x 8, [d of block 1] x 8 (one: the upper half 0) */
static inline __m512 q8_scales(const blk_q8_0 *b, int two)
{
    __m128i lo = _mm_set1_epi16((short)b[0].d), hi = two ? _mm_set1_epi16((short)b[1].d) : _mm_setzero_si128();
    return _mm512_cvtph_ps(_mm256_set_m128i(hi, lo));
}

static inline __attribute__((always_inline)) void
q8_tile(const uint8_t *w, size_t stride, const kvp_act *act, float *y, int ldy, int accumulate,
        int R, int C)
{
    const int nb = act[0].n / KVP_QK;
    const __m512i flip = _mm512_set1_epi8(-128);
    __m512 acc[Q8_R][Q8_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;   /* else the last block alone, the upper half 0 */
        __m512i wu[Q8_R];
        __m512 dw[Q8_R];
        for (int r = 0; r < R; r++) {
            const blk_q8_0 *k = (const blk_q8_0 *)(w + (size_t)r * stride) + b;
            __m512i v = _mm512_zextsi256_si512(load256(k[0].qs));
            if (two)
                v = _mm512_inserti64x4(v, load256(k[1].qs), 1);
            wu[r] = _mm512_xor_si512(v, flip);   /* (a lone block's upper half meets q = 0) */
            dw[r] = q8_scales(k, two);
        }
        for (int c = 0; c < C; c++) {
            __m512i q, o;
            __m512 da;
            if (two) {
                q = _mm512_loadu_si512(act[c].q + b * KVP_QK);
                o = _mm512_loadu_si512(act[c].o4 + b * 8);
                da = _mm512_loadu_ps(act[c].d4 + b * 8);
            } else {
                q = _mm512_zextsi256_si512(load256(act[c].q + b * KVP_QK));
                o = _mm512_zextsi256_si512(load256(act[c].o4 + b * 8));
                da = _mm512_zextps256_ps512(_mm256_loadu_ps(act[c].d4 + b * 8));
            }
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(o, wu[r], q)),
                                            _mm512_mul_ps(dw[r], da), acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float v = _mm512_reduce_add_ps(acc[r][c]), *o = y + (size_t)c * ldy + r;
            *o = accumulate ? *o + v : v;
        }
}

/* the activation side of q8_tile: o4 and d4 from q and d */
static void small_prep(kvp_act *a)
{
    const __m256i ones = _mm256_set1_epi8(1);
    for (int b = 0; b < a->n / KVP_QK; b++) {
        __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, load256(a->q + b * KVP_QK));
        _mm256_storeu_si256((__m256i *)(a->o4 + 8 * b), _mm256_mullo_epi32(sums, _mm256_set1_epi32(-128)));
        _mm256_storeu_ps(a->d4 + 8 * b, _mm256_set1_ps(a->d[b]));
    }
}
#else
/* AVX2: tiles of Q8_R rows x Q8_C tokens, a block to a 256-bit vector, signed codes
 * (maddubs would saturate on unsigned ones: |code| . sign(q, code) as dot_q8_0 did),
 * one multiply-add per block by d_w x d_a. 16 vector registers. */
#define Q8_R 2
#define Q8_C 3

static inline __attribute__((always_inline)) void
q8_tile(const uint8_t *w, size_t stride, const kvp_act *act, float *y, int ldy, int accumulate,
        int R, int C)
{
    const int nb = act[0].n / KVP_QK;
    __m256 acc[Q8_R][Q8_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i wv[Q8_R], wa[Q8_R];
        __m256 dw[Q8_R];
        for (int r = 0; r < R; r++) {
            const blk_q8_0 *k = (const blk_q8_0 *)(w + (size_t)r * stride) + b;
            wv[r] = load256(k->qs);
            wa[r] = _mm256_sign_epi8(wv[r], wv[r]);
            dw[r] = _mm256_set1_ps(h2f(k->d));
        }
        for (int c = 0; c < C; c++) {
            __m256i q = load256(act[c].q + b * KVP_QK);
            __m256 da = _mm256_set1_ps(act[c].d[b]);
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm256_fmadd_ps(mulsum_f32(wa[r], _mm256_sign_epi8(q, wv[r])),
                                            _mm256_mul_ps(dw[r], da), acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float v = hsum(acc[r][c]), *o = y + (size_t)c * ldy + r;
            *o = accumulate ? *o + v : v;
        }
}
#endif

/* the tiles of R rows against every token: full tiles of Q8_C (3), then the rest */
static inline __attribute__((always_inline)) void
q8_strip(const uint8_t *w, size_t stride, const kvp_act *act, int T, float *y, int ldy,
         int accumulate, int R)
{
    int t = 0;
    for (; t + Q8_C <= T; t += Q8_C)
        q8_tile(w, stride, act + t, y + (size_t)t * ldy, ldy, accumulate, R, Q8_C);
    switch (T - t) {
    case 2: q8_tile(w, stride, act + t, y + (size_t)t * ldy, ldy, accumulate, R, 2); break;
    case 1: q8_tile(w, stride, act + t, y + (size_t)t * ldy, ldy, accumulate, R, 1); break;
    default: break;
    }
}

static void small_q8_0(const uint8_t *w, size_t stride, int rows, const kvp_act *act, int T,
                       float *y, int ldy, int accumulate)
{
    int r = 0;
    if (T == 1) {
        /* one token: a row at a time, one sequential stream that the hardware prefetcher
         * follows (one thread here reads 64 MiB at ~42 GB/s as one stream and ~17 GB/s
         * as two rows interleaved; q8_0 at T = 1 streamed 29 GB/s this way against 14-16
         * in 4-row tiles with the strip prefetch). Each (row, token) runs the same steps
         * as in the larger tiles, so the sums do not change. */
        for (; r < rows; r++)
            q8_tile(w + (size_t)r * stride, stride, act, y + r, ldy, accumulate, 1, 1);
        return;
    }
    for (; r + Q8_R <= rows; r += Q8_R) {
        /* the strip after next: the hardware prefetcher loses the stream once a strip
         * is read more than once (T > Q8_C) */
        if (r + 3 * Q8_R <= rows)
            for (size_t off = 0; off < Q8_R * stride; off += 64)
                _mm_prefetch((const char *)w + (size_t)(r + 2 * Q8_R) * stride + off, _MM_HINT_T0);
        q8_strip(w + (size_t)r * stride, stride, act, T, y + r, ldy, accumulate, Q8_R);
    }
    for (; r < rows; r++)
        q8_strip(w + (size_t)r * stride, stride, act, T, y + r, ldy, accumulate, 1);
}

/* ---- attention over stored KV cache rows (cache/kvrow.h) -------------------------- */

/* 8 stored numbers from i as f32: f16 through F16C, q8_0 codes sign-extended (unscaled) */
static inline __m256 kv_load8(kvp_kv_type t, const void *row, int n, int i)
{
    if (t == KVP_KV_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    const int8_t *codes = kvp_kv_q8_codes(row, n) + i;
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)codes)));
}

static float kv_dot(kvp_kv_type t, const void *row, const float *q, int n)
{
    if (t == KVP_KV_F32 || n % 8)
        return kvp_kv_row_dot(t, row, q, n);
    __m256 acc = _mm256_setzero_ps();
    if (t == KVP_KV_F16) {
        for (int i = 0; i < n; i += 8)
            acc = _mm256_fmadd_ps(kv_load8(t, row, n, i), _mm256_loadu_ps(q + i), acc);
        return hsum(acc);
    }
    for (int b = 0; b * KVP_KV_BLOCK < n; b++) {
        int lo = b * KVP_KV_BLOCK, hi = lo + KVP_KV_BLOCK < n ? lo + KVP_KV_BLOCK : n;
        __m256 s = _mm256_setzero_ps();
        for (int i = lo; i < hi; i += 8)
            s = _mm256_fmadd_ps(kv_load8(t, row, n, i), _mm256_loadu_ps(q + i), s);
        uint16_t d;
        memcpy(&d, (const uint8_t *)row + 2 * b, 2);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(d)), s, acc);
    }
    return hsum(acc);
}

static void kv_axpy(kvp_kv_type t, float *y, float a, const void *row, int n)
{
    if (t == KVP_KV_F32 || n % 8) {
        kvp_kv_row_axpy(t, y, a, row, n);
        return;
    }
    for (int b = 0; b * KVP_KV_BLOCK < n; b++) {
        int lo = b * KVP_KV_BLOCK, hi = lo + KVP_KV_BLOCK < n ? lo + KVP_KV_BLOCK : n;
        float ad = a;
        if (t == KVP_KV_Q8_0) {
            uint16_t d;
            memcpy(&d, (const uint8_t *)row + 2 * b, 2);
            ad *= _cvtsh_ss(d);
        }
        __m256 va = _mm256_set1_ps(ad);
        for (int i = lo; i < hi; i += 8)
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, kv_load8(t, row, n, i), _mm256_loadu_ps(y + i)));
    }
}

/* kv_dot over n_rows consecutive rows, four at a time (four independent chains of
 * multiply-adds instead of one), each row's sum in kv_dot's order: out[j] = scale * dot. */
static void kv_dots(kvp_kv_type t, const void *rows, int n_rows, const float *q, int n,
                    float scale, float *out)
{
    size_t rb = kvp_kv_row_bytes(t, n);
    const uint8_t *r0 = rows;
    int j = 0;
    for (; t != KVP_KV_F32 && n % 8 == 0 && j + 4 <= n_rows; j += 4) {
        const uint8_t *r = r0 + (size_t)j * rb;
        __m256 acc[4];
        for (int u = 0; u < 4; u++)
            acc[u] = _mm256_setzero_ps();
        for (int b = 0; b * KVP_KV_BLOCK < n; b++) {
            int lo = b * KVP_KV_BLOCK, hi = lo + KVP_KV_BLOCK < n ? lo + KVP_KV_BLOCK : n;
            if (t == KVP_KV_F16) {
                for (int i = lo; i < hi; i += 8) {
                    __m256 qv = _mm256_loadu_ps(q + i);
                    for (int u = 0; u < 4; u++)
                        acc[u] = _mm256_fmadd_ps(kv_load8(t, r + u * rb, n, i), qv, acc[u]);
                }
                continue;
            }
            __m256 s[4];
            for (int u = 0; u < 4; u++)
                s[u] = _mm256_setzero_ps();
            for (int i = lo; i < hi; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + i);
                for (int u = 0; u < 4; u++)
                    s[u] = _mm256_fmadd_ps(kv_load8(t, r + u * rb, n, i), qv, s[u]);
            }
            for (int u = 0; u < 4; u++) {
                uint16_t d;
                memcpy(&d, r + u * rb + 2 * b, 2);
                acc[u] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(d)), s[u], acc[u]);
            }
        }
        for (int u = 0; u < 4; u++)
            out[j + u] = scale * hsum(acc[u]);
    }
    for (; j < n_rows; j++)
        out[j] = scale * kv_dot(t, r0 + (size_t)j * rb, q, n);
}

/* y[n] = sum over the rows of a[j] * row j: kv_axpy's multiply-adds from y = 0 in row
 * order, the same sums, with 64 of y's numbers held in registers across the rows. */
static void kv_mix(kvp_kv_type t, const void *rows, int n_rows, const float *a, int n, float *y)
{
    size_t rb = kvp_kv_row_bytes(t, n);
    const uint8_t *r0 = rows;
    if (t == KVP_KV_F32 || n % 8) {
        memset(y, 0, (size_t)n * sizeof *y);
        for (int j = 0; j < n_rows; j++)
            kv_axpy(t, y, a[j], r0 + (size_t)j * rb, n);
        return;
    }
    for (int c = 0; c < n; c += 64) {   /* 64 numbers: a block of 32 twice */
        int w = n - c < 64 ? (n - c) / 8 : 8;
        __m256 acc[8];
        for (int k = 0; k < 8; k++)
            acc[k] = _mm256_setzero_ps();
        for (int j = 0; j < n_rows; j++) {
            const uint8_t *r = r0 + (size_t)j * rb;
            float ad[2] = {a[j], a[j]};
            if (t == KVP_KV_Q8_0)
                for (int h = 0; h < 2 && c + 32 * h < n; h++) {
                    uint16_t d;
                    memcpy(&d, r + 2 * ((c + 32 * h) / KVP_KV_BLOCK), 2);
                    ad[h] *= _cvtsh_ss(d);
                }
            __m256 va[2] = {_mm256_set1_ps(ad[0]), _mm256_set1_ps(ad[1])};
            for (int k = 0; k < w; k++)
                acc[k] = _mm256_fmadd_ps(va[k / 4], kv_load8(t, r, n, c + 8 * k), acc[k]);
        }
        for (int k = 0; k < w; k++)
            _mm256_storeu_ps(y + c + 8 * k, acc[k]);
    }
}

/* q8_0 codes of 8 numbers against the inverse scale id: rounded to nearest even, a NaN
 * to 0, clamped to +-127 (as q8_code in cache/kvrow.c) */
static inline __m256 q8_code8(__m256 v, __m256 id)
{
    __m256 c = _mm256_round_ps(_mm256_mul_ps(v, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    c = _mm256_and_ps(c, _mm256_cmp_ps(c, c, _CMP_ORD_Q));
    return _mm256_min_ps(_mm256_max_ps(c, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
}

/* kvp_kv_row_store's bytes: f16 rows converted 8 at a time by F16C (round to nearest
 * even, as kvp_f32_to_f16; NaNs quieted with their payload's top bits alike); q8_0 rows
 * of whole vectors with the scale search 8 numbers at a time, in the portable loop's
 * order of operations and of its eight partial sums (hsum's), so the same scale wins;
 * the tails and f32 rows by the portable code. */
static void kv_store(kvp_kv_type t, void *row, const float *x, int n)
{
    if (t == KVP_KV_F16) {
        uint16_t *h = row;
        int i = 0;
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(h + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
        if (i < n)
            kvp_kv_row_store(t, h + i, x + i, n - i);
        return;
    }
    if (t != KVP_KV_Q8_0 || n % 8) {
        kvp_kv_row_store(t, row, x, n);
        return;
    }
    int8_t *codes = (int8_t *)row + 2 * kvp_kv_blocks(n);
    for (int b = 0; b * KVP_KV_BLOCK < n; b++) {
        int lo = b * KVP_KV_BLOCK, nv = (lo + KVP_KV_BLOCK < n ? KVP_KV_BLOCK : n - lo) / 8;
        __m256 v[KVP_KV_BLOCK / 8], a[KVP_KV_BLOCK / 8], mx = _mm256_setzero_ps();
        for (int j = 0; j < nv; j++) {
            v[j] = _mm256_loadu_ps(x + lo + 8 * j);
            a[j] = abs8(v[j]);
            mx = _mm256_max_ps(a[j], mx);   /* a NaN is skipped, as in the portable loop */
        }
        float amax = hmax(mx), best_err = INFINITY;
        uint16_t best = 0;
        for (int k = 0; k <= KVP_KV_Q8_SEARCH; k++) {
            uint16_t dh = _cvtss_sh(amax / (float)(127 - k), _MM_FROUND_TO_NEAREST_INT);
            float d = h2f(dh), id = d > 0.0f ? 1.0f / d : 0.0f;
            __m256 vd = _mm256_set1_ps(d), vid = _mm256_set1_ps(id), acc = _mm256_setzero_ps();
            for (int j = 0; j < nv; j++) {
                __m256 e = _mm256_sub_ps(v[j], _mm256_mul_ps(q8_code8(v[j], vid), vd));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(a[j], e), e));
            }
            float err = hsum(acc);
            if (err < best_err) {
                best_err = err;
                best = dh;
            }
            if (err == 0.0f)
                break;
        }
        memcpy((uint8_t *)row + 2 * b, &best, 2);
        float d = h2f(best);
        __m256 vid = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
        for (int j = 0; j < nv; j++) {
            __m256i i32 = _mm256_cvtps_epi32(q8_code8(v[j], vid));
            __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
            _mm_storel_epi64((__m128i *)(codes + lo + 8 * j), _mm_packs_epi16(i16, i16));
        }
    }
}

void KVP_KERNELS(kvp_kernel_set *ks)
{
    ks->f32_rows = f32_rows;
    ks->small[KVP_GGML_Q8_0] = small_q8_0;
#if KVP_VNNI
    ks->small_prep = small_prep;
#endif
    ks->kv_dot = kv_dot;
    ks->kv_axpy = kv_axpy;
    ks->kv_store = kv_store;
    ks->kv_dots = kv_dots;
    ks->kv_mix = kv_mix;
    ks->quantize[0] = quantize32;
    ks->quantize[1] = quantize256;
    kvp_dot_fn *tab = ks->dot;
    tab[KVP_GGML_F16] = dot_f16;
    tab[KVP_GGML_BF16] = dot_bf16;
    tab[KVP_GGML_Q4_0] = dot_q4_0;
    tab[KVP_GGML_Q4_1] = dot_q4_1;
    tab[KVP_GGML_Q5_0] = dot_q5_0;
    tab[KVP_GGML_Q5_1] = dot_q5_1;
    tab[KVP_GGML_Q4_K] = dot_q4_K;
    tab[KVP_GGML_Q5_K] = dot_q5_K;
    tab[KVP_GGML_Q6_K] = dot_q6_K;
    tab[KVP_GGML_Q2_K] = dot_q2_K;
    tab[KVP_GGML_Q3_K] = dot_q3_K;
    /* the element-order packers: the scalar set's, replaced where written here */
    memcpy(natural, ks->scalar_pack, sizeof natural);
    natural[KVP_GGML_Q8_0] = natural_q8_0;
    natural[KVP_GGML_Q4_0] = natural_q4_0;
    natural[KVP_GGML_Q4_1] = natural_q4_1;
    natural[KVP_GGML_Q5_0] = natural_q5_0;
    natural[KVP_GGML_Q5_1] = natural_q5_1;
    natural[KVP_GGML_Q4_K] = natural_q4_K;
    natural[KVP_GGML_Q5_K] = natural_q5_K;
    natural[KVP_GGML_Q6_K] = natural_q6_K;
    static const struct { uint32_t type; kvp_pack_fn pack; } packs[] = {
        {KVP_GGML_Q8_0, pack_KVP_GGML_Q8_0}, {KVP_GGML_Q4_0, pack_KVP_GGML_Q4_0},
        {KVP_GGML_Q4_1, pack_KVP_GGML_Q4_1}, {KVP_GGML_Q5_0, pack_KVP_GGML_Q5_0},
        {KVP_GGML_Q5_1, pack_KVP_GGML_Q5_1}, {KVP_GGML_Q2_K, pack_KVP_GGML_Q2_K},
        {KVP_GGML_Q3_K, pack_KVP_GGML_Q3_K}, {KVP_GGML_Q4_K, pack_KVP_GGML_Q4_K},
        {KVP_GGML_Q5_K, pack_KVP_GGML_Q5_K}, {KVP_GGML_Q6_K, pack_KVP_GGML_Q6_K},
    };
    for (size_t i = 0; i < sizeof packs / sizeof packs[0]; i++) {
        ks->pack[packs[i].type] = packs[i].pack;
        ks->gemm[packs[i].type] = gemm_unsigned;
    }
#if !KVP_VNNI
    ks->gemm[KVP_GGML_Q8_0] = gemm_signed;
#endif
}
