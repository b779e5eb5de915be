/* x86 dot-product kernels, compiled twice (see matmul_kernels.h): by matmul_avx2.c for
 * AVX2 + FMA + F16C, and by matmul_avx512.c with AVX-512 VNNI, where one vpdpbusd
 * replaces the maddubs + madd pair of byte products. The including file sets the target
 * pragma, KVP_VNNI and KVP_KERNELS (the name of the table filler). */
#include <immintrin.h>
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
    const __m256i spread = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                              0x0202020202020202, 0x0303030303030303);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread);
    /* each byte j of a group of 8 keeps only bit j (all others forced to 1) */
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    v = _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
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

static float dot_q8_0(const void *row, const kvp_act *a)
{
    const blk_q8_0 *b = row;
    const int nb = a->n / KVP_QK;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m256i x0 = load256(b[i].qs), y0 = load256(a->q + i * KVP_QK);
        __m256i x1 = load256(b[i + 1].qs), y1 = load256(a->q + (i + 1) * KVP_QK);
        __m256 p0 = mulsum_f32(_mm256_sign_epi8(x0, x0), _mm256_sign_epi8(y0, x0));
        __m256 p1 = mulsum_f32(_mm256_sign_epi8(x1, x1), _mm256_sign_epi8(y1, x1));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i].d) * a->d[i]), p0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i + 1].d) * a->d[i + 1]), p1, acc1);
    }
    for (; i < nb; i++) {
        __m256i x0 = load256(b[i].qs), y0 = load256(a->q + i * KVP_QK);
        __m256 p0 = mulsum_f32(_mm256_sign_epi8(x0, x0), _mm256_sign_epi8(y0, x0));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i].d) * a->d[i]), p0, acc0);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
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

void KVP_KERNELS(kvp_dot_fn *tab)
{
    tab[KVP_GGML_F16] = dot_f16;
    tab[KVP_GGML_BF16] = dot_bf16;
    tab[KVP_GGML_Q8_0] = dot_q8_0;
    tab[KVP_GGML_Q4_0] = dot_q4_0;
    tab[KVP_GGML_Q4_1] = dot_q4_1;
    tab[KVP_GGML_Q5_0] = dot_q5_0;
    tab[KVP_GGML_Q5_1] = dot_q5_1;
    tab[KVP_GGML_Q4_K] = dot_q4_K;
    tab[KVP_GGML_Q5_K] = dot_q5_K;
    tab[KVP_GGML_Q6_K] = dot_q6_K;
}
