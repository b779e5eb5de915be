/* splitmix64: the one seed mixer. Nearby seeds give unrelated outputs; a xorshift state
 * seeded from it is never the stuck state 0 (kvp_rng_seed). */
#ifndef KVP_RNG_H
#define KVP_RNG_H

#include <stdint.h>

#define KVP_GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

/* Advances *state and returns the next output. */
static inline uint64_t kvp_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += KVP_GOLDEN_GAMMA);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A non-zero xorshift state from any seed. */
static inline uint64_t kvp_rng_seed(uint64_t seed)
{
    uint64_t z = kvp_splitmix64(&seed);
    return z ? z : KVP_GOLDEN_GAMMA;
}

#endif
