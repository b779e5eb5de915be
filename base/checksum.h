/* FNV-1a 64: the checksum of every file and buffer kvpd writes (cache snapshots, traces).
 * Detects truncation and corruption, not tampering. */
#ifndef KVP_CHECKSUM_H
#define KVP_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define KVP_FNV1A_INIT 14695981039346656037ull

/* Continues hash h over n bytes (start with KVP_FNV1A_INIT). */
static inline uint64_t kvp_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

#endif
