/* The sampler's vector passes (private to model/): a portable build in sampler.c and an
 * AVX2 build in sampler_avx2.c, chosen once as matmul.c chooses its kernels. */
#ifndef KVP_SAMPLER_KERNELS_H
#define KVP_SAMPLER_KERNELS_H

/* The largest non-NaN value of x[0..n) (-inf when there is none). */
float kvp_smp_max_avx2(const float *x, int n);
/* x[i] = exp((x[i] - mx) / temperature), NaN -> 0, for a finite mx; returns the sum. */
float kvp_smp_exp_avx2(float *x, int n, float mx, float temperature);
/* x[i] /= sum. */
void kvp_smp_div_avx2(float *x, int n, float sum);

#endif
