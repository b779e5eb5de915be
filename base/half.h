/* Half-precision conversions: IEEE binary16 (f16) and bfloat16, both ways. */
#ifndef KVP_HALF_H
#define KVP_HALF_H

#include <stdint.h>

float kvp_f16_to_f32(uint16_t h);
uint16_t kvp_f32_to_f16(float f);    /* round to nearest even; overflow -> inf */
float kvp_bf16_to_f32(uint16_t h);
uint16_t kvp_f32_to_bf16(float f);   /* round to nearest even; nan stays nan */

#endif
