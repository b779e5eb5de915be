/* The int8 GEMM (prefill): weight packing and register-blocked tiles (matmul_kernels.h).
 * Part of the x86 kernel sets: included by matmul_x86.h only, in the target and with the
 * KVP_VNNI setting of the file that includes it (matmul_avx2.c, matmul_avx512.c). */

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

static inline __attribute__((always_inline)) void
natural_k4(const uint8_t *qs, const uint8_t *qh, uint8_t *codes)
{
    __m256i v[8];
    k4_codes(qs, qh, v);
    for (int k = 0; k < 8; k++)
        store256(codes + 32 * k, v[k]);
}

static void natural_q4_K(const void *row, int n, uint8_t *p)
{
    const blk_q4_K *b = row;
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        natural_k4(b->qs, NULL, p + i * KVP_QK_K);
        pack_k_scales(p, n, i, b->scales, b->d, b->dmin);
    }
}

static void natural_q5_K(const void *row, int n, uint8_t *p)
{
    const blk_q5_K *b = row;
    for (int i = 0; i < n / KVP_QK_K; i++, b++) {
        natural_k4(b->qs, b->qh, p + i * KVP_QK_K);
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
 * and the group's scales are broadcast to both halves. The packed rows and the
 * activation's qg start on cache lines (matmul.c), so no 512-bit load straddles two.
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
