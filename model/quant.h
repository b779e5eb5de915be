/* Tensor element types: sizes and conversion to f32. */
#ifndef KVP_QUANT_H
#define KVP_QUANT_H

#include <stddef.h>
#include <stdint.h>

#define KVP_Q8_0_BLOCK 32   /* one f16 scale + 32 int8 per block (34 bytes) */

/* Bytes for n elements of ggml type `type`; 0 for an unsupported type or an n that
 * does not fill whole blocks. */
uint64_t kvp_type_nbytes(uint32_t type, uint64_t n);
const char *kvp_type_name(uint32_t type);      /* "F32", "F16", "Q8_0", or "type 17" style */
float kvp_f16_to_f32(uint16_t h);
uint16_t kvp_f32_to_f16(float f);
/* Converts n elements of `type` at src into dst (f32). Returns 0 or -EINVAL. */
int kvp_dequantize(uint32_t type, const void *src, float *dst, uint64_t n);
/* Quantizes n f32 values (n a multiple of 32) to Q8_0. */
void kvp_quantize_q8_0(const float *src, void *dst, uint64_t n);

#endif
