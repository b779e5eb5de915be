/* Activation quantizers and the per-row dot products of every weight type (decode).
 * Part of the x86 kernel sets: included by matmul_x86.h only, in the target and with the
 * KVP_VNNI setting of the file that includes it (matmul_avx2.c, matmul_avx512.c). */

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

/* One Q4_K or Q5_K super-block i: adds d_w d_a sum(scale code q) to *acc and returns the
 * mins' part, dmin_w d_a sum(m q). qh is Q5_K's fifth bits, NULL for Q4_K (inlined with a
 * constant, so each format gets its own loop). */
static inline __attribute__((always_inline)) float
k4_block(uint16_t d, uint16_t dmin, const uint8_t *scales, const uint8_t *qs,
         const uint8_t *qh, const kvp_act *a, int i, __m256 *acc)
{
    const __m256i low4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    uint8_t sc[8], m[8];
    k4_scales(scales, sc, m);
    const int8_t *q = a->q + i * KVP_QK_K;
    __m256i hbits = qh ? load256(qh) : _mm256_setzero_si256();
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        __m256i c = load256(qs + 32 * k);
        __m256i lo = _mm256_and_si256(c, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), low4);
        if (qh) {
            __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4);
            __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4);
            hbits = _mm256_srli_epi16(hbits, 2);
            lo = _mm256_or_si256(lo, hlo);
            hi = _mm256_or_si256(hi, hhi);
        }
        sumi = _mm256_add_epi32(sumi, scaled(lo, q + 64 * k, sc[2 * k]));
        sumi = _mm256_add_epi32(sumi, scaled(hi, q + 64 * k + 32, sc[2 * k + 1]));
    }
    float da = a->d[i];
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(d) * da), _mm256_cvtepi32_ps(sumi), *acc);
    return h2f(dmin) * da * (float)k_mins(m, a->bsums + i * 16);
}

static float dot_q4_K(const void *row, const kvp_act *a)
{
    const blk_q4_K *b = row;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++)
        mins += k4_block(b->d, b->dmin, b->scales, b->qs, NULL, a, i, &acc);
    return hsum(acc) - mins;
}

static float dot_q5_K(const void *row, const kvp_act *a)
{
    const blk_q5_K *b = row;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int i = 0; i < a->n / KVP_QK_K; i++, b++)
        mins += k4_block(b->d, b->dmin, b->scales, b->qs, b->qh, a, i, &acc);
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
