/* Tensor element types (ggml's block formats): sizes, names, decoding to f32 and
 * quantizing from f32. Every format packs a row of ne[0] elements into whole blocks:
 *   F32 / F16 / BF16   1 element per "block"
 *   Q8_0  32: f16 d, int8 q[32]                         x = d*q
 *   Q4_0  32: f16 d, 4-bit q[32]                        x = d*(q-8)
 *   Q4_1  32: f16 d, f16 m, 4-bit q[32]                 x = d*q + m
 *   Q5_0  32: f16 d, 5-bit q[32] (high bits apart)      x = d*(q-16)
 *   Q5_1  32: f16 d, f16 m, 5-bit q[32]                 x = d*q + m
 *   Q2_K 256: 16 sub-blocks of 16, 4-bit scale and min each, 2-bit q
 *   Q3_K 256: 16 sub-blocks of 16, 6-bit signed scales, 3-bit q
 *   Q4_K 256: 8 sub-blocks of 32, 6-bit scale and min, f16 d and dmin, 4-bit q
 *   Q5_K 256: as Q4_K with 5-bit q
 *   Q6_K 256: 16 sub-blocks of 16, int8 scales, f16 d, 6-bit q
 * Decoding reproduces ggml's dequantize_row_* bit for bit (tests/model/test_quant.c
 * checks it against ../shared/fixtures/quant). */
#ifndef KVP_QUANT_H
#define KVP_QUANT_H

#include "base/half.h"
#include "model/ggml_type.h"
#include <stddef.h>
#include <stdint.h>

/* Elements per block of `type`; 0 when the type is not supported. */
int kvp_type_block(uint32_t type);
/* Bytes per block of `type`; 0 when not supported. */
size_t kvp_type_block_bytes(uint32_t type);
/* Bytes for n elements of `type`; 0 for an unsupported type, an n that does not fill
 * whole blocks, or an overflow. */
uint64_t kvp_type_nbytes(uint32_t type, uint64_t n);
/* "F32", "Q4_K", ... as ggml spells them, or "type 17" for others. */
const char *kvp_type_name(uint32_t type);
/* Parses "q4_K", "Q8_0", "f16", ... (case-insensitive) into a supported type; -1 if
 * not one. */
int kvp_type_parse(const char *name);


/* Decodes n elements (whole blocks) of `type` at src into dst. 0 or -EINVAL. */
int kvp_dequantize(uint32_t type, const void *src, float *dst, uint64_t n);
/* Encodes n f32 values (whole blocks) as `type` (every supported type except Q2_K and
 * Q3_K), with the same search for scales and minimums as ggml's reference quantizers.
 * 0 or -EINVAL. */
int kvp_quantize(uint32_t type, const float *src, void *dst, uint64_t n);

#endif
