/* x86 kernels (dot products and the int8 GEMM), compiled twice (see matmul_kernels.h): by matmul_avx2.c for
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

/* ---- int8 GEMM (matmul_kernels.h): packing and register-blocked tiles ------------- */

static inline void store256(uint8_t *p, __m256i v)
{
    _mm256_storeu_si256((__m256i *)p, v);
}

/* The _0/_1 formats: scale and offset term per block as matmul_scalar.c packs them. */
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
PACK_BLOCK32(pack_q8_0, blk_q8_0, _mm256_xor_si256(load256(b->qs), _mm256_set1_epi8(-128)), -128.0f * d)
#else
/* maddubs would saturate on 255 x 127 pairs: the codes stay signed (gemm_q8_0_signed) */
PACK_BLOCK32(pack_q8_0, blk_q8_0, load256(b->qs), 0.0f)
#endif
PACK_BLOCK32(pack_q4_0, blk_q4_0, nibbles(b->qs), -8.0f * d)
PACK_BLOCK32(pack_q4_1, blk_q4_1, nibbles(b->qs), h2f(b->m))
PACK_BLOCK32(pack_q5_0, blk_q5_0, _mm256_or_si256(nibbles(b->qs), fifth_bits(b->qh)), -16.0f * d)
PACK_BLOCK32(pack_q5_1, blk_q5_1, _mm256_or_si256(nibbles(b->qs), fifth_bits(b->qh)), h2f(b->m))

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

static void pack_q4_K(const void *row, int n, uint8_t *p)
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

static void pack_q5_K(const void *row, int n, uint8_t *p)
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

static void pack_q6_K(const void *row, int n, uint8_t *p)
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

static inline void put(float *y, float v, int accumulate)
{
    *y = accumulate ? *y + v : v;
}

/* Tiles of R packed rows x C activation rows: each loaded code register serves C
 * tokens and each activation register R rows. R and C are constants where the tile is
 * full (the loops unroll into registers) and the remainder where it is not. AVX-512
 * has 32 vector registers, AVX2 16. */
#if KVP_VNNI
enum { RA = 4, CA = 4, RB = 2, CB = 4 };
#else
enum { RA = 2, CA = 4, RB = 2, CB = 4 };
#endif

/* Family A: y = sum_b scale_b d_b (codes . q)_b + sum_b kx_b s_b; SIGNED (AVX2 Q8_0):
 * signed codes, no offset term. */
static inline __attribute__((always_inline)) void
tile_block32(const uint8_t *packed, size_t stride, int R, const kvp_act *act, int C, float *y,
             int ldy, int accumulate, int SIGNED)
{
    const int n = act[0].n;
    const uint8_t *codes[RA] = {0};
    const float *scale[RA] = {0};
    __m256 acc[RA][CA] = {{{0}}};
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        codes[r] = packed + (size_t)r * stride;
        scale[r] = kvp_pack_scale((uint8_t *)codes[r], n);
    }
    for (int b = 0; b < n / KVP_QK; b++) {
        __m256i w[RA] = {{0}}, aw[RA] = {{0}};
        __m256 dw[RA] = {{0}};
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            w[r] = load256(codes[r] + b * KVP_QK);
            aw[r] = SIGNED ? _mm256_sign_epi8(w[r], w[r]) : w[r];
            dw[r] = _mm256_broadcast_ss(scale[r] + b);
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m256i q = load256(act[c].q + b * KVP_QK);
            __m256 da = _mm256_broadcast_ss(act[c].d + b);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i p = mulsum_i32(aw[r], SIGNED ? _mm256_sign_epi8(q, w[r]) : q);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[r], da), acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const float *kx = kvp_pack_kx((uint8_t *)codes[r], n);
        for (int c = 0; c < C; c++) {
            float v = hsum(acc[r][c]) + (SIGNED ? 0.0f : dotf(kx, act[c].s, n / KVP_QK));
            put(&y[(size_t)c * ldy + r], v, accumulate);
        }
    }
}

/* Family B: y = sum_B scale_B d_B sum_j sc16_j (codes . q)_j + sum_j kx_j s16_j */
static inline __attribute__((always_inline)) void
tile_k(const uint8_t *packed, size_t stride, int R, const kvp_act *act, int C, float *y, int ldy,
       int accumulate)
{
    const int n = act[0].n;
    const uint8_t *codes[RB] = {0};
    const int16_t *sc[RB] = {0};
    const float *scale[RB] = {0};
    __m256 acc[RB][CB] = {{{0}}};
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        codes[r] = packed + (size_t)r * stride;
        sc[r] = kvp_pack_sc16((uint8_t *)codes[r], n);
        scale[r] = kvp_pack_scale((uint8_t *)codes[r], n);
    }
    for (int B = 0; B < n / KVP_QK_K; B++) {
        __m256i isum[RB][CB] = {{{0}}};
        for (int k = 0; k < KVP_QK_K / 32; k++) {
            __m256i w[RB] = {{0}}, s[RB] = {{0}};
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                w[r] = load256(codes[r] + B * KVP_QK_K + 32 * k);
                const int16_t *s2 = sc[r] + 16 * B + 2 * k;
                s[r] = _mm256_set_m128i(_mm_set1_epi16(s2[1]), _mm_set1_epi16(s2[0]));
            }
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256i q = load256(act[c].q + B * KVP_QK_K + 32 * k);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    __m256i m = _mm256_maddubs_epi16(w[r], q);
#if KVP_VNNI
                    isum[r][c] = _mm256_dpwssd_epi32(isum[r][c], m, s[r]);
#else
                    isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(m, s[r]));
#endif
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][c]),
                                            _mm256_set1_ps(scale[r][B] * act[c].d[B]), acc[r][c]);
    }
    for (int r = 0; r < R; r++) {
        const float *kx = kvp_pack_kx((uint8_t *)codes[r], n);
        for (int c = 0; c < C; c++)
            put(&y[(size_t)c * ldy + r], hsum(acc[r][c]) + dotf(kx, act[c].s16, n / 16), accumulate);
    }
}

/* Remainder tiles (fewer rows or tokens than a full tile): the same code, not unrolled */
static __attribute__((noinline)) void tail_block32(const uint8_t *p, size_t stride, int R,
                                                   const kvp_act *act, int C, float *y, int ldy,
                                                   int accumulate, int SIGNED)
{
    tile_block32(p, stride, R, act, C, y, ldy, accumulate, SIGNED);
}

static __attribute__((noinline)) void tail_k(const uint8_t *p, size_t stride, int R,
                                             const kvp_act *act, int C, float *y, int ldy,
                                             int accumulate)
{
    tile_k(p, stride, R, act, C, y, ldy, accumulate);
}

/* Token tiles outside, row tiles inside: the chunk's packed rows stay in L2 while a
 * tile of activations stays in L1. */
#define GEMM(NAME, TILE, TAIL, R, C, ...)                                                 \
    static void NAME(const uint8_t *packed, size_t stride, int rows, const kvp_act *act,   \
                     int T, float *y, int ldy, int accumulate)                            \
    {                                                                                     \
        for (int t = 0; t < T; t += C)                                                    \
            for (int r = 0; r < rows; r += R) {                                           \
                const uint8_t *p = packed + (size_t)r * stride;                           \
                float *yt = y + (size_t)t * ldy + r;                                      \
                if (r + R <= rows && t + C <= T)                                          \
                    TILE(p, stride, R, act + t, C, yt, ldy, accumulate __VA_ARGS__);      \
                else                                                                      \
                    TAIL(p, stride, rows - r < R ? rows - r : R, act + t,                 \
                         T - t < C ? T - t : C, yt, ldy, accumulate __VA_ARGS__);         \
            }                                                                             \
    }
GEMM(gemm_block32, tile_block32, tail_block32, RA, CA, , 0)
GEMM(gemm_k, tile_k, tail_k, RB, CB, )
#if !KVP_VNNI
GEMM(gemm_q8_0_signed, tile_block32, tail_block32, RA, CA, , 1)
#endif

void KVP_KERNELS(kvp_kernel_set *ks)
{
    kvp_dot_fn *tab = ks->dot;
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
    ks->pack[KVP_GGML_Q8_0] = pack_q8_0;
    ks->pack[KVP_GGML_Q4_0] = pack_q4_0;
    ks->pack[KVP_GGML_Q4_1] = pack_q4_1;
    ks->pack[KVP_GGML_Q5_0] = pack_q5_0;
    ks->pack[KVP_GGML_Q5_1] = pack_q5_1;
    ks->pack[KVP_GGML_Q4_K] = pack_q4_K;
    ks->pack[KVP_GGML_Q5_K] = pack_q5_K;
    ks->pack[KVP_GGML_Q6_K] = pack_q6_K;
    /* Q2_K and Q3_K keep the scalar pack; the packed layout is shared */
    static const uint32_t block32[] = {KVP_GGML_Q8_0, KVP_GGML_Q4_0, KVP_GGML_Q4_1,
                                       KVP_GGML_Q5_0, KVP_GGML_Q5_1};
    static const uint32_t k[] = {KVP_GGML_Q2_K, KVP_GGML_Q3_K, KVP_GGML_Q4_K, KVP_GGML_Q5_K,
                                 KVP_GGML_Q6_K};
    for (size_t i = 0; i < sizeof block32 / sizeof block32[0]; i++)
        ks->gemm[block32[i]] = gemm_block32;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        ks->gemm[k[i]] = gemm_k;
#if !KVP_VNNI
    ks->gemm[KVP_GGML_Q8_0] = gemm_q8_0_signed;
#endif
}
