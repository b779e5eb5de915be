/* The sampler's vector passes (private to model/): a portable build in sampler.c and an
 * AVX2 build in sampler_avx2.c, chosen once as matmul.c chooses its kernels. */
#ifndef KVP_SAMPLER_KERNELS_H
#define KVP_SAMPLER_KERNELS_H

/* A candidate token: its probability and id. */
typedef struct kvp_smp_cand {
    float p;
    int i;
} kvp_smp_cand;

/* The x[i] with lo <= x[i] < hi into out[] as (x[i], i), in order; returns how many. */
int kvp_smp_gather_avx2(const float *x, int n, float lo, float hi, kvp_smp_cand *out);
/* The largest non-NaN value of x[0..n) (-inf when there is none). */
float kvp_smp_max_avx2(const float *x, int n);
/* x[i] = exp((x[i] - mx) / temperature), NaN -> 0, for a finite mx; returns the sum. */
float kvp_smp_exp_avx2(float *x, int n, float mx, float temperature);
/* The sum of the x[i] >= thr (thr 0: all of them, the x being >= 0). */
float kvp_smp_sum_ge_avx2(const float *x, int n, float thr);
/* x[i] /= sum. */
void kvp_smp_div_avx2(float *x, int n, float sum);

#endif
