/* ggml's block layouts (private to model/: quant.c decodes and encodes them, the
 * matmul kernels read them). Half-precision fields are raw f16 bits. */
#ifndef KVP_QUANT_BLOCKS_H
#define KVP_QUANT_BLOCKS_H

#include <stdint.h>

#include "model/ggml_type.h"

typedef struct { uint16_t d; int8_t qs[KVP_QK]; } blk_q8_0;
typedef struct { uint16_t d; uint8_t qs[KVP_QK / 2]; } blk_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[KVP_QK / 2]; } blk_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[KVP_QK / 2]; } blk_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[KVP_QK / 2]; } blk_q5_1;
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } blk_q2_K;
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } blk_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_K;

_Static_assert(sizeof(blk_q8_0) == 34, "q8_0");
_Static_assert(sizeof(blk_q4_0) == 18, "q4_0");
_Static_assert(sizeof(blk_q4_1) == 20, "q4_1");
_Static_assert(sizeof(blk_q5_0) == 22, "q5_0");
_Static_assert(sizeof(blk_q5_1) == 24, "q5_1");
_Static_assert(sizeof(blk_q2_K) == 84, "q2_K");
_Static_assert(sizeof(blk_q3_K) == 110, "q3_K");
_Static_assert(sizeof(blk_q4_K) == 144, "q4_K");
_Static_assert(sizeof(blk_q5_K) == 176, "q5_K");
_Static_assert(sizeof(blk_q6_K) == 210, "q6_K");

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block: the
 * first four sit in the low 6 bits of bytes 0..7, the last four are split between the
 * nibbles of bytes 8..11 and the top 2 bits of bytes 0..7. */
static inline void kvp_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The 16 signed 6-bit scales of a Q3_K super-block (stored with +32 offset). */
static inline void kvp_q3_scales(const uint8_t *packed, int8_t out[16])
{
    for (int j = 0; j < 16; j++) {
        int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
        int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((low | high << 4) - 32);
    }
}

#endif
