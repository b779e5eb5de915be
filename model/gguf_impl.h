/* What the GGUF reader (gguf.c) and writer (gguf_write.c) share: the format's constants
 * and its little-endian integers and fixed-size value types. Private to model/. */
#ifndef KVP_GGUF_IMPL_H
#define KVP_GGUF_IMPL_H

#include <stdint.h>

#include "model/gguf.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

/* The n-byte little-endian unsigned integer at p (n <= 8). */
static inline uint64_t gguf_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Size of a fixed-size kv type; 0 for STRING, ARRAY and unknown types. */
static inline int gguf_scalar_size(uint32_t t)
{
    switch (t) {
    case KVP_GGUF_UINT8: case KVP_GGUF_INT8: case KVP_GGUF_BOOL:
        return 1;
    case KVP_GGUF_UINT16: case KVP_GGUF_INT16:
        return 2;
    case KVP_GGUF_UINT32: case KVP_GGUF_INT32: case KVP_GGUF_FLOAT32:
        return 4;
    case KVP_GGUF_UINT64: case KVP_GGUF_INT64: case KVP_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

#endif
