/* Q8_0 weights at small T: each block read once for up to KVP_QUANT_SMALL_T activation rows.
 * Part of the x86 kernel sets: included by matmul_x86.h only, in the target and with the
 * KVP_VNNI setting of the file that includes it (matmul_avx2.c, matmul_avx512.c). */

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
         * follows (interleaved rows halve what one thread streams). Each (row, token)
         * runs the same steps as in the larger tiles, so the sums do not change. */
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
