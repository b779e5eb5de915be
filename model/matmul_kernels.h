/* Kernels behind kvp_matmul (private to model/). A weight row of `n` elements is
 * dotted with an activation row prepared once per matrix:
 *   f32 / f16 / bf16 rows:   the f32 activations as they are;
 *   Q8_0 Q4_0 Q4_1 Q5_0 Q5_1: int8 blocks of 32, scale d and s = d * sum(q) per block;
 *   K formats:                int8 blocks of 256, scale d and the sums of every 16.
 *
 * Three kinds of kernel: a dot product of one row with one activation row (decode); for
 * Q8_0, a small-T kernel that reads each block of a row once for a few activation rows
 * (decode steps of several sessions); and an int8 GEMM of a chunk of rows with a block
 * of activation rows (prefill). The GEMM
 * first packs each weight row once into plain unsigned 8-bit codes in element order
 * plus scales (see kvp_pack below), so one register-blocked kernel per family serves
 * every block format, and each packed row is reused by all the block's tokens. */
#ifndef KVP_MATMUL_KERNELS_H
#define KVP_MATMUL_KERNELS_H

#include <stdint.h>
#include <string.h>

#include "cache/kvrow.h"
#include "model/ggml_type.h"
#include "model/quant.h"
#include "model/quant_blocks.h"

#define KVP_X4_GROUPS(n) (((n) / 32 + 3) / 4)   /* groups of four blocks of 32 */

typedef struct kvp_act {
    int n;              /* elements */
    const float *x;     /* [n] f32 activations */
    float *d;           /* [n/32] or [n/256] block scales */
    float *s;           /* [n/32]: d * sum(q) of each block */
    int16_t *bsums;     /* [n/16]: sums of q over each 16 (K formats) */
    float *s16;         /* [n/16]: d * bsums (K formats) */
    int8_t *q;          /* [n] */
    /* blocks of 32, for a set's small_prep (the small-T kernels, x86_f32.h and x86_q8small.h) */
    int32_t *o4;        /* [n/4]: -128 x the sum of each 4 codes */
    float *d4;          /* [n/4]: the scale d of each 4 codes' block */
    /* blocks of 32 regrouped by fours for a set's regroup32 (matmul_avx512vbmi.c) */
    int8_t *qx;         /* [128 * KVP_X4_GROUPS(n)] */
    int32_t *ox;        /* [16 * KVP_X4_GROUPS(n)] */
    float *dx;          /* [16 * KVP_X4_GROUPS(n)] */
    /* for the SIMD GEMM (prefill only), the same codes in the grouped layout below */
    int g;              /* sub-block size: kvp_gemm_group(weight type) */
    int8_t *qg;         /* [kvp_group_pad(n, g)] */
    float *dg, *sg;     /* [pad / g]: scale and d * sum(q) of each sub-block */
} kvp_act;

/* The grouped layout of the SIMD GEMM: sub-blocks of g elements (the finest unit with
 * one scale: 32 for the _0/_1 formats, Q4_K and Q5_K; 16 for Q2_K, Q3_K and Q6_K), eight
 * at a time. Step s of a group holds bytes 4s..4s+3 of each of its eight sub-blocks, so
 * each 32-bit lane of a byte dot-product instruction sums one sub-block and a group
 * needs one conversion to float, not eight. Rows are zero-padded to whole groups. */
static inline int kvp_gemm_group(uint32_t type)
{
    return type == KVP_GGML_Q2_K || type == KVP_GGML_Q3_K || type == KVP_GGML_Q6_K ? 16 : 32;
}

static inline int kvp_group_pad(int n, int g)
{
    return (n + 8 * g - 1) / (8 * g) * (8 * g);
}

/* src[n] in element order -> dst[kvp_group_pad(n, g)] in the grouped layout */
static inline void kvp_group_bytes(const uint8_t *src, int n, int g, uint8_t *dst)
{
    int pad = kvp_group_pad(n, g);
    for (int j = 0; j < pad / g; j++)        /* sub-block j: group j / 8, lane j % 8 */
        for (int s = 0; s < g / 4; s++) {
            uint8_t *o = dst + (j / 8) * 8 * g + 32 * s + 4 * (j % 8);
            if (j * g < n)
                memcpy(o, src + j * g + 4 * s, 4);
            else
                memset(o, 0, 4);
        }
}

typedef float (*kvp_dot_fn)(const void *row, const kvp_act *a);
/* y[r] (+)= row r . a for r < rows, the rows `stride` bytes apart (a run of a matrix) */
typedef void (*kvp_rows_fn)(const uint8_t *w, size_t stride, int rows, const kvp_act *a, float *y,
                            int accumulate);

/* A packed weight row of n elements (n a multiple of 32), at most KVP_PACK_BYTES(n)
 * bytes. Each kernel set packs in its own layout and its gemm reads that layout. The
 * scalar set's (the reference, element order), which the SIMD sets start from:
 *   codes  u8 [n]     element e's code, unsigned (0..255)
 *   scale  f32 [n/32] family A (_0/_1 formats): the weight scale of each block of 32;
 *                     family B (K formats): the super-block scale d in [n/256]
 *   sc16   i16 [n/16] family B: the integer scale of each 16 elements
 *   kx     f32 [n/16] the offset term: the row's value is
 *                       A: sum_b scale[b] d_a[b] (codes . q)_b + sum_b kx[b] s[b]
 *                       B: sum_B scale[B] d_a[B] sum_j sc16[j] (codes . q)_j
 *                          + sum_j kx[j] s16[j]
 * (with the activation's d, s, s16 of kvp_act). The SIMD sets regroup it: codes in the
 * grouped layout, one f32 scale and one kx per sub-block of g (AVX2 keeps Q8_0's codes
 * signed: its maddubs would saturate on 255 x 127 pairs). */
#define KVP_PACK_BYTES(n) ((size_t)((n) + 255) / 256 * 256 * 2)
static inline float *kvp_pack_scale(uint8_t *p, int n) { return (float *)(p + n); }
static inline int16_t *kvp_pack_sc16(uint8_t *p, int n) { return (int16_t *)(p + n + n / 8); }
static inline float *kvp_pack_kx(uint8_t *p, int n) { return (float *)(p + n + n / 4); }

/* Packs one weight row of n elements into the layout above. */
typedef void (*kvp_pack_fn)(const void *row, int n, uint8_t *packed);
/* y[t * ldy + r] (+)= row r . activation t for r < rows, t < T; the rows are packed
 * `stride` bytes apart. */
typedef void (*kvp_gemm_fn)(const uint8_t *packed, size_t stride, int rows, const kvp_act *act,
                            int T, float *y, int ldy, int accumulate);

/* A block format against a few activation rows (a decode step of up to
 * KVP_QUANT_SMALL_T rows, batched or not): y[t * ldy + r] (+)= row r . act[t] for
 * r < rows, t < T, the rows `stride` bytes apart. Each block is read as it lies in the
 * file once for all T activation rows (no packing). Every (r, t) sum runs in the same
 * order whatever T and rows are, so a row's result does not depend on its batch. */
typedef void (*kvp_small_fn)(const uint8_t *w, size_t stride, int rows, const kvp_act *act, int T,
                             float *y, int ldy, int accumulate);

/* Quantizes n activations into a->q and a->d, and a->s (blocks of 32: q8_0's rule,
 * d = amax / 127) or a->bsums (blocks of 256: q8_K's, the signed extreme -> -127). */
typedef void (*kvp_quant_fn)(const float *x, int n, kvp_act *a);

/* f32 weights against a few activation rows (a decode step of up to KVP_F32_SMALL_T
 * rows): y[t * ldy + r] (+)= w[r] . x[t] for r < rows, t < T; w [rows][n], x [T][n].
 * Each weight row is read once for all T rows of x. Every (r, t) sum runs in the same
 * order whatever T and rows are, so a row's result does not depend on its batch. */
typedef void (*kvp_f32_rows_fn)(const float *w, int rows, int n, const float *x, int T,
                                float *y, int ldy, int accumulate);

/* The kernels over stored KV cache rows (cache/kvrow.h): row . q, y += a * row, and the
 * encoding of a row (kvp_kv_row_store's bytes). */
typedef float (*kvp_kv_dot_fn)(kvp_kv_type t, const void *row, const float *q, int n);
typedef void (*kvp_kv_axpy_fn)(kvp_kv_type t, float *y, float a, const void *row, int n);
typedef void (*kvp_kv_store_fn)(kvp_kv_type t, void *row, const float *x, int n);
/* Over n_rows consecutive rows: out[j] = scale * (row j . q); y[n] = sum_j a[j] * row j. */
typedef void (*kvp_kv_dots_fn)(kvp_kv_type t, const void *rows, int n_rows, const float *q, int n,
                               float scale, float *out);
typedef void (*kvp_kv_mix_fn)(kvp_kv_type t, const void *rows, int n_rows, const float *a, int n,
                              float *y);

typedef struct kvp_kernel_set {
    kvp_quant_fn quantize[2];               /* blocks of 32, blocks of 256 */
    void (*regroup32)(kvp_act *a);          /* after quantize[0]: qx, ox, dx (NULL: none) */
    void (*small_prep)(kvp_act *a);         /* after quantize[0]: o4, d4 (NULL: none) */
    kvp_f32_rows_fn f32_rows;
    kvp_dot_fn dot[KVP_N_WEIGHT_TYPES];
    kvp_rows_fn rows[KVP_N_WEIGHT_TYPES];   /* NULL: dot row by row */
    kvp_small_fn small[KVP_N_WEIGHT_TYPES]; /* set: every decode block of the type (not dot) */
    kvp_pack_fn pack[KVP_N_WEIGHT_TYPES];   /* NULL: no int8 GEMM for the type */
    kvp_pack_fn scalar_pack[KVP_N_WEIGHT_TYPES];  /* the scalar set's (element order) */
    kvp_gemm_fn gemm[KVP_N_WEIGHT_TYPES];
    kvp_kv_dot_fn kv_dot;
    kvp_kv_axpy_fn kv_axpy;
    kvp_kv_store_fn kv_store;
    kvp_kv_dots_fn kv_dots;
    kvp_kv_mix_fn kv_mix;
} kvp_kernel_set;

/* Fill the set with each instruction set's kernels (the later ones replace entries of
 * the earlier ones; a missing entry keeps the scalar kernel). A set replaces a type's
 * pack and gemm together (they share a layout). */
void kvp_kernels_scalar(kvp_kernel_set *k);
void kvp_kernels_avx2(kvp_kernel_set *k);
void kvp_kernels_avx512(kvp_kernel_set *k);
void kvp_kernels_avx512vbmi(kvp_kernel_set *k);   /* Q4_0 Q4_1 Q5_0 Q5_1 decode */

#endif
