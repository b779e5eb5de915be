/* f32 weights at small T: register tiles over up to KVP_F32_SMALL_T activation rows.
 * Part of the x86 kernel sets: included by matmul_x86.h only, in the target and with the
 * KVP_VNNI setting of the file that includes it (matmul_avx2.c, matmul_avx512.c). */

/* f32 rows at small T (kvp_f32_rows_fn): tiles of R weight rows x C activation rows,
 * each (row, token) summed in its own register in element order (AVX-512: 16 lanes, the
 * last piece under a mask; AVX2: 8 lanes, then hsum and the scalar tail), for every tile
 * shape alike (so a row's result does not depend on T). Each loaded weight register
 * serves C tokens and each activation register R rows; AVX-512 has 32 vector registers
 * (6 x 4 tiles: 24 sums, 6 weight registers and one activation), AVX2 16 (3 x 4: 12
 * sums, 3 weight registers and one activation; narrower tiles load more often than the
 * FMA units can use). */
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
