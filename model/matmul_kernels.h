/* Dot-product kernels behind kvp_matmul (private to model/). A weight row of `n`
 * elements is dotted with an activation row prepared once per matrix:
 *   f32 / f16 / bf16 rows:   the f32 activations as they are;
 *   Q8_0 Q4_0 Q4_1 Q5_0 Q5_1: int8 blocks of 32, scale d and s = d * sum(q) per block;
 *   K formats:                int8 blocks of 256, scale d and the sums of every 16. */
#ifndef KVP_MATMUL_KERNELS_H
#define KVP_MATMUL_KERNELS_H

#include <stdint.h>

#include "model/gguf.h"
#include "model/matmul.h"
#include "model/quant_blocks.h"

typedef struct kvp_act {
    int n;              /* elements */
    const float *x;     /* [n] f32 activations */
    float *d;           /* [n/32] or [n/256] block scales */
    float *s;           /* [n/32]: d * sum(q) of each block */
    int16_t *bsums;     /* [n/16]: sums of q over each 16 (K formats) */
    int8_t *q;          /* [n] */
} kvp_act;

typedef float (*kvp_dot_fn)(const void *row, const kvp_act *a);

/* Fill tab[type] with each instruction set's kernels (the later ones replace entries
 * of the earlier ones; a missing entry keeps the scalar kernel). */
void kvp_kernels_scalar(kvp_dot_fn *tab);
void kvp_kernels_avx2(kvp_dot_fn *tab);
void kvp_kernels_avx512(kvp_dot_fn *tab);

#endif
