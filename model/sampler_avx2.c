/* AVX2 + FMA build of the sampler's passes (sampler_kernels.h). */
#include "model/sampler_kernels.h"
#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif
#include <immintrin.h>
#include <math.h>

float kvp_smp_max_avx2(const float *x, int n)
{
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    int i = 0;
    /* maxps returns its second operand when either is NaN: NaN never replaces m */
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
    }
    m0 = _mm256_max_ps(m0, m1);
    float lane[8], mx = -INFINITY;
    _mm256_storeu_ps(lane, m0);
    for (int k = 0; k < 8; k++)
        mx = lane[k] > mx ? lane[k] : mx;
    for (; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* exp(d) for d <= 0: 2^k * P(r), k = round(d / ln 2), r = d - k ln 2 (ln 2 in two parts),
 * P the degree-6 polynomial of Cephes' expf (about 1 ulp); d below -87.3 gives 0. */
static inline __m256 exp_neg(__m256 d)
{
    const __m256 lo = _mm256_set1_ps(-87.33f);
    __m256 tiny = _mm256_cmp_ps(d, lo, _CMP_LT_OQ);
    d = _mm256_max_ps(d, lo);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(d, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), d);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

float kvp_smp_exp_avx2(float *x, int n, float mx, float temperature)
{
    __m256 vm = _mm256_set1_ps(mx), vt = _mm256_set1_ps(temperature);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        /* NaN logits (unordered with themselves) get 0 */
        __m256 oka = _mm256_cmp_ps(a, a, _CMP_ORD_Q), okb = _mm256_cmp_ps(b, b, _CMP_ORD_Q);
        __m256 ea = _mm256_and_ps(oka, exp_neg(_mm256_div_ps(_mm256_sub_ps(a, vm), vt)));
        __m256 eb = _mm256_and_ps(okb, exp_neg(_mm256_div_ps(_mm256_sub_ps(b, vm), vt)));
        _mm256_storeu_ps(x + i, ea);
        _mm256_storeu_ps(x + i + 8, eb);
        s0 = _mm256_add_ps(s0, ea);
        s1 = _mm256_add_ps(s1, eb);
    }
    float lane[8], sum = 0.0f;
    _mm256_storeu_ps(lane, _mm256_add_ps(s0, s1));
    for (int k = 0; k < 8; k++)
        sum += lane[k];
    for (; i < n; i++) {
        float d = x[i] - mx;
        x[i] = d == d ? expf(d / temperature) : 0.0f;
        sum += x[i];
    }
    return sum;
}

float kvp_smp_sum_ge_avx2(const float *x, int n, float thr)
{
    __m256 vt = _mm256_set1_ps(thr), s0 = _mm256_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        s0 = _mm256_add_ps(s0, _mm256_and_ps(_mm256_cmp_ps(a, vt, _CMP_GE_OQ), a));
        s1 = _mm256_add_ps(s1, _mm256_and_ps(_mm256_cmp_ps(b, vt, _CMP_GE_OQ), b));
    }
    float lane[8], sum = 0.0f;
    _mm256_storeu_ps(lane, _mm256_add_ps(s0, s1));
    for (int k = 0; k < 8; k++)
        sum += lane[k];
    for (; i < n; i++)
        sum += x[i] >= thr ? x[i] : 0.0f;
    return sum;
}

int kvp_smp_gather_avx2(const float *x, int n, float lo, float hi, kvp_smp_cand *out)
{
    __m256 vl = _mm256_set1_ps(lo), vh = _mm256_set1_ps(hi);
    int g = 0, i = 0;
    /* a mask of the 8 in range, then one store per token in it (typically a few in a
     * hundred of a flat distribution's tokens) */
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_and_ps(
            _mm256_cmp_ps(a, vl, _CMP_GE_OQ), _mm256_cmp_ps(a, vh, _CMP_LT_OQ)));
        while (m) {
            int k = __builtin_ctz(m);
            out[g].p = x[i + k];
            out[g].i = i + k;
            g++;
            m &= m - 1;
        }
    }
    for (; i < n; i++)
        if (x[i] >= lo && x[i] < hi) {
            out[g].p = x[i];
            out[g].i = i;
            g++;
        }
    return g;
}

void kvp_smp_div_avx2(float *x, int n, float sum)
{
    __m256 vs = _mm256_set1_ps(sum);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < n; i++)
        x[i] /= sum;
}
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
/* never called: kvp_sampler_simd() is "scalar" off x86-64 */
float kvp_smp_max_avx2(const float *x, int n) { (void)x; (void)n; return 0; }
float kvp_smp_exp_avx2(float *x, int n, float mx, float t) { (void)x; (void)n; (void)mx; (void)t; return 0; }
float kvp_smp_sum_ge_avx2(const float *x, int n, float thr) { (void)x; (void)n; (void)thr; return 0; }
int kvp_smp_gather_avx2(const float *x, int n, float lo, float hi, kvp_smp_cand *out) { (void)x; (void)n; (void)lo; (void)hi; (void)out; return 0; }
void kvp_smp_div_avx2(float *x, int n, float sum) { (void)x; (void)n; (void)sum; }
#endif
