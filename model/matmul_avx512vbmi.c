/* Decode kernels for the 32-element formats with 4- and 5-bit codes (Q4_0, Q4_1, Q5_0,
 * Q5_1) on 512-bit vectors, for CPUs with AVX-512 VBMI and BITALG besides VNNI (chosen
 * at run time; they replace the avx512 set's entries for these types).
 *
 * The 256-bit kernels of x86_dot.h spend more instructions unpacking each block of
 * 32 codes (nibbles, fifth bits, scale, offset term) than multiplying it, so they run
 * slower than memory streams a Q5_0 row. Here a group of four consecutive blocks is
 * read as it lies in the file (two 64-byte loads) and byte permutes (vpermt2b) put
 * each field where the products need it:
 *   - codes: the four blocks' 16 bytes of nibble pairs side by side; masking gives the
 *     first 16 codes of each block, shifting then masking the last 16;
 *   - fifth bits (Q5): block k's 4 bytes of qh in qwords 2k and 2k + 1; vpshufbitqmb
 *     picks bit e (first halves) or 16 + e (last halves) for lane 16k + e, a mask that
 *     adds 16 to those codes;
 *   - scales (and Q4_1 / Q5_1's m): each f16 four times, so 32-bit lane l of the sums
 *     belongs to block l / 4.
 * The activation side comes regrouped to match once per matrix (kvp_act's qx, ox, dx;
 * see regroup_act), so two vpdpbusd give each lane its block's partial
 * sum, started at the _0 formats' offset (-16 or -8 per code), and one multiply-add per
 * lane takes it to the float total. */
#include "model/matmul_kernels.h"
#if defined(__x86_64__)
/* the target for this file's functions (clang has no GCC target pragma: an attribute on each) */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg")
#endif
#include <immintrin.h>

/* The byte permutes of one format for a group of four blocks loaded as two vectors
 * (index bit 6 picks the second): the first 64 bytes and the 64 that end with the
 * fourth block (`full`), or, for a last group of fewer blocks, the first 128 bytes
 * loaded under a mask (`tail`, nothing read past the row). */
typedef struct perm4 {
    __m512i qs;   /* lane 16k + e: block k's qs[e] */
    __m512i qh;   /* qword j: block j / 2's qh */
    __m512i d, m; /* word w < 16: the scale (min) of block w / 4 */
} perm4;

static struct { perm4 full, tail; } perm_q4_0, perm_q4_1, perm_q5_0, perm_q5_1;

/* byte j of a group of blocks of `block` bytes -> its index in the two loaded vectors */
static uint8_t at(int j, int block, int tail)
{
    return (uint8_t)(j < 64 || tail ? j : j - (4 * block - 64) + 64);
}

static void perm_init(perm4 *p, int tail, int block, int d_at, int m_at, int qh_at, int qs_at)
{
    uint8_t qs[64], qh[64], d[64] = {0}, m[64] = {0};
    for (int l = 0; l < 64; l++) {
        qs[l] = at(l / 16 * block + qs_at + l % 16, block, tail);
        qh[l] = qh_at < 0 ? 0 : at(l / 16 * block + qh_at + l % 4, block, tail);
    }
    for (int l = 0; l < 32; l++) {  /* byte l of word l / 2, of block l / 8 */
        d[l] = at(l / 8 * block + d_at + l % 2, block, tail);
        m[l] = m_at < 0 ? 0 : at(l / 8 * block + m_at + l % 2, block, tail);
    }
    p->qs = _mm512_loadu_si512(qs);
    p->qh = _mm512_loadu_si512(qh);
    p->d = _mm512_loadu_si512(d);
    p->m = _mm512_loadu_si512(m);
}

/* The activation side of one group (see regroup_act) */
typedef struct act4 {
    __m512i q0, q1, off;
    __m512 dl;
} act4;

static inline __attribute__((always_inline)) act4 act_group4(const kvp_act *a, int g)
{
    return (act4){_mm512_loadu_si512(a->qx + 128 * g), _mm512_loadu_si512(a->qx + 128 * g + 64),
                  _mm512_loadu_si512(a->ox + 16 * g), _mm512_loadu_ps(a->dx + 16 * g)};
}

/* One group of four blocks of a row, loaded in r0, r1: acc + each lane's term. QH: the
 * Q5 formats; MIN: the _1 formats (m * sum(q), no offset); else the offset is -16
 * (Q5_0) or -8 (Q4_0) per code. */
static inline __attribute__((always_inline)) __m512
group4(const perm4 *P, __m512i r0, __m512i r1, act4 x, int QH, int MIN, __m512 acc)
{
    const __m512i low4 = _mm512_set1_epi8(0xF), sixteen = _mm512_set1_epi8(0x10);
    /* lane 16k + e of the first (last) halves reads bit e (16 + e) of its qword: qword
     * 2k holds lanes 16k..16k+7, qword 2k + 1 lanes 16k+8..16k+15 */
    const __m512i bit_lo = _mm512_setr_epi64(0x0706050403020100, 0x0f0e0d0c0b0a0908,
        0x0706050403020100, 0x0f0e0d0c0b0a0908, 0x0706050403020100, 0x0f0e0d0c0b0a0908,
        0x0706050403020100, 0x0f0e0d0c0b0a0908);
    const __m512i bit_hi = _mm512_add_epi8(bit_lo, sixteen);
    __m512i v = _mm512_permutex2var_epi8(r0, P->qs, r1);
    __m512i lo = _mm512_and_si512(v, low4);
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    if (QH) {
        __m512i h = _mm512_permutex2var_epi8(r0, P->qh, r1);
        lo = _mm512_mask_add_epi8(lo, _mm512_bitshuffle_epi64_mask(h, bit_lo), lo, sixteen);
        hi = _mm512_mask_add_epi8(hi, _mm512_bitshuffle_epi64_mask(h, bit_hi), hi, sixteen);
    }
    __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(r0, P->d, r1)));
    if (MIN) {
        /* lane: dl * (dw * sum(code q) + m * sum(q)), sum(q) = -off / 16 */
        __m512 mw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi8(r0, P->m, r1)));
        __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x.q0);
        s = _mm512_dpbusd_epi32(s, hi, x.q1);
        __m512 msum = _mm512_mul_ps(_mm512_cvtepi32_ps(x.off), _mm512_set1_ps(-1.0f / 16.0f));
        __m512 t = _mm512_fmadd_ps(dw, _mm512_cvtepi32_ps(s), _mm512_mul_ps(mw, msum));
        return _mm512_fmadd_ps(t, x.dl, acc);
    }
    __m512i s = _mm512_dpbusd_epi32(QH ? x.off : _mm512_srai_epi32(x.off, 1), lo, x.q0);
    s = _mm512_dpbusd_epi32(s, hi, x.q1);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, x.dl), acc);
}

/* 64 bytes as two 256-bit loads: a 512-bit load that straddles two cache lines (the
 * groups of 88 or 72 bytes rarely start on one) is slow to wait for when the lines come
 * from memory */
static inline __m512i load512_halves(const uint8_t *p)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                              _mm256_loadu_si256((const __m256i *)(p + 32)), 1);
}

/* group g of the row at p: the full group's two loads, or a last one of 1 to 3 blocks
 * under masks (zeros past them, as in qx) */
static inline __attribute__((always_inline)) __m512
row_group(const perm4 *full, const perm4 *tail, const uint8_t *p, int g, int nb, const int BLOCK,
          act4 x, int QH, int MIN, __m512 acc)
{
    p += (size_t)4 * BLOCK * g;
    if (4 * g + 4 <= nb)
        return group4(full, load512_halves(p), load512_halves(p + 4 * BLOCK - 64), x, QH, MIN,
                      acc);
    int bytes = (nb - 4 * g) * BLOCK;
    __mmask64 m0 = bytes >= 64 ? ~0ULL : (1ULL << bytes) - 1;
    __mmask64 m1 = bytes <= 64 ? 0 : (1ULL << (bytes - 64)) - 1;
    return group4(tail, _mm512_maskz_loadu_epi8(m0, p), _mm512_maskz_loadu_epi8(m1, p + 64), x, QH,
                  MIN, acc);
}

/* y[r] (+)= row r . a for `rows` rows `stride` bytes apart, a row at a time: one
 * sequential stream, which the hardware prefetcher follows (two rows a pass, each group
 * of the activation loaded once for both, read two streams: one thread got about half
 * the bandwidth from them, see docs/benchmarks.md). */
static inline __attribute__((always_inline)) void
rows_x4(const perm4 *full, const perm4 *tail, const uint8_t *w, size_t stride, int rows,
        const kvp_act *a, float *y, int accumulate, const int BLOCK, int QH, int MIN)
{
    const int nb = a->n / KVP_QK, ng = KVP_X4_GROUPS(a->n);
    for (int r = 0; r < rows; r++) {
        const uint8_t *p = w + stride * r;
        __m512 acc = _mm512_setzero_ps();
        for (int g = 0; g < ng; g++)
            acc = row_group(full, tail, p, g, nb, BLOCK, act_group4(a, g), QH, MIN, acc);
        float v = _mm512_reduce_add_ps(acc);
        y[r] = accumulate ? y[r] + v : v;
    }
}

#define ROWS_X4(NAME, BLK, QH, MIN)                                                       \
    static void rows_##NAME(const uint8_t *w, size_t stride, int rows, const kvp_act *a,   \
                            float *y, int accumulate)                                      \
    {                                                                                      \
        rows_x4(&perm_##NAME.full, &perm_##NAME.tail, w, stride, rows, a, y, accumulate,   \
                sizeof(BLK), QH, MIN);                                                     \
    }                                                                                      \
    static float dot_##NAME(const void *row, const kvp_act *a)                             \
    {                                                                                      \
        float y;                                                                           \
        rows_##NAME(row, 0, 1, a, &y, 0);                                                  \
        return y;                                                                          \
    }
ROWS_X4(q4_0, blk_q4_0, 0, 0)
ROWS_X4(q4_1, blk_q4_1, 0, 1)
ROWS_X4(q5_0, blk_q5_0, 1, 0)
ROWS_X4(q5_1, blk_q5_1, 1, 1)

/* The activation side of the kernels above, from a's q and d (blocks of 32), per group
 * g of four blocks (zeros past the last block):
 *   qx[128 g + 16 k + e] = q of block 4g + k, element e; qx[128 g + 64 + 16 k + e] = its
 *                          element 16 + e (the order of the codes in group4)
 *   ox[16 g + l]         = -16 x the sum of the 8 codes lane l multiplies
 *   dx[16 g + l]         = the scale d of the lane's block, 4g + l / 4 */
static void regroup_act(kvp_act *a)
{
    const int nb = a->n / KVP_QK, ng = KVP_X4_GROUPS(a->n);
    memset(a->qx, 0, (size_t)128 * ng);
    for (int b = 0; b < nb; b++) {
        memcpy(a->qx + 128 * (b / 4) + 16 * (b % 4), a->q + 32 * b, 16);
        memcpy(a->qx + 128 * (b / 4) + 64 + 16 * (b % 4), a->q + 32 * b + 16, 16);
    }
    for (int l = 0; l < 16 * ng; l++) {
        const int8_t *q = a->qx + 128 * (l / 16) + 4 * (l % 16);
        a->ox[l] = -16 * (q[0] + q[1] + q[2] + q[3] + q[64] + q[65] + q[66] + q[67]);
        a->dx[l] = l / 4 < nb ? a->d[l / 4] : 0.0f;
    }
}

void kvp_kernels_avx512vbmi(kvp_kernel_set *ks)
{
    static const struct { int block, d, m, qh, qs; } at4[4] = {
        {sizeof(blk_q4_0), 0, -1, -1, 2}, {sizeof(blk_q4_1), 0, 2, -1, 4},
        {sizeof(blk_q5_0), 0, -1, 2, 6}, {sizeof(blk_q5_1), 0, 2, 4, 8},
    };
    __typeof__(perm_q4_0) *perm[4] = {&perm_q4_0, &perm_q4_1, &perm_q5_0, &perm_q5_1};
    for (int k = 0; k < 4; k++) {
        perm_init(&perm[k]->full, 0, at4[k].block, at4[k].d, at4[k].m, at4[k].qh, at4[k].qs);
        perm_init(&perm[k]->tail, 1, at4[k].block, at4[k].d, at4[k].m, at4[k].qh, at4[k].qs);
    }
    ks->dot[KVP_GGML_Q4_0] = dot_q4_0;
    ks->dot[KVP_GGML_Q4_1] = dot_q4_1;
    ks->dot[KVP_GGML_Q5_0] = dot_q5_0;
    ks->dot[KVP_GGML_Q5_1] = dot_q5_1;
    ks->rows[KVP_GGML_Q4_0] = rows_q4_0;
    ks->rows[KVP_GGML_Q4_1] = rows_q4_1;
    ks->rows[KVP_GGML_Q5_0] = rows_q5_0;
    ks->rows[KVP_GGML_Q5_1] = rows_q5_1;
    ks->regroup32 = regroup_act;
}
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
void kvp_kernels_avx512vbmi(kvp_kernel_set *ks) { (void)ks; }
#endif
