/* How a KV cache row (one key or one value of one head, head_dim numbers) is stored:
 *   f32   head_dim floats;
 *   f16   head_dim IEEE halves;
 *   q8_0  blocks of 32 (the last one shorter when head_dim is not a multiple of 32):
 *         the f16 scale d of every block first, then head_dim int8 codes; x = d * code.
 *         d codes the block's largest |x| as 127 - k, k in 0..KVP_KV_Q8_SEARCH (ggml's
 *         Q8_0 rule, max|x| / 127, is k = 0), the k whose codes leave the least
 *         sum |x| (x - d code)^2: a step up to 10% coarser often lands the block's other
 *         numbers nearer their codes. The largest coordinates carry the dot products, so
 *         their errors weigh more: scales below max / 127, which clip the largest number,
 *         and the unweighted squared error both gave worse KL (docs/quality-per-byte.md).
 * Keys and values are stored alike and separately. The portable kernels are here;
 * model/matmul.h runs the SIMD ones chosen at start (kvp_kv_dot / kvp_kv_axpy). */
#ifndef KVP_KVROW_H
#define KVP_KVROW_H

#include <stddef.h>
#include <stdint.h>

typedef enum kvp_kv_type { KVP_KV_F32 = 0, KVP_KV_F16 = 1, KVP_KV_Q8_0 = 2 } kvp_kv_type;
#define KVP_KV_N_TYPES 3
#define KVP_KV_BLOCK 32
#define KVP_KV_Q8_SEARCH 12

/* "f32", "f16", "q8_0" */
const char *kvp_kv_type_name(kvp_kv_type t);
/* The type named `name` (exact, lower case), or -1. */
int kvp_kv_type_parse(const char *name);
/* "f32 f16 q8_0" (for --help and errors) */
const char *kvp_kv_type_names(void);

/* Bytes of one stored row of n numbers. */
size_t kvp_kv_row_bytes(kvp_kv_type t, int n);
/* Encodes x[n] into row (rounding for f16 and q8_0). */
void kvp_kv_row_store(kvp_kv_type t, void *row, const float *x, int n);
/* Decodes a stored row into x[n]. */
void kvp_kv_row_load(kvp_kv_type t, float *x, const void *row, int n);
/* The portable attention kernels: row . q, and y[n] += a * row. */
float kvp_kv_row_dot(kvp_kv_type t, const void *row, const float *q, int n);
void kvp_kv_row_axpy(kvp_kv_type t, float *y, float a, const void *row, int n);

/* q8_0 row parts: the scales (unaligned u16: read with memcpy) and the codes */
static inline int kvp_kv_blocks(int n) { return (n + KVP_KV_BLOCK - 1) / KVP_KV_BLOCK; }
static inline const int8_t *kvp_kv_q8_codes(const void *row, int n)
{
    return (const int8_t *)row + 2 * kvp_kv_blocks(n);
}

#endif
