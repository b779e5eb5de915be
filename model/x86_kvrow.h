/* Attention over stored KV-cache rows (cache/kvrow.h): dots, mixes and the q8_0 row store.
 * Part of the x86 kernel sets: included by matmul_x86.h only, in the target and with the
 * KVP_VNNI setting of the file that includes it (matmul_avx2.c, matmul_avx512.c). */

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
