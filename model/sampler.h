/* Next-token sampling: greedy (temperature 0), temperature, top-p; seeded xorshift so a
 * seed reproduces a run. Whatever the logits (NaN, +-inf, all equal), the token is an
 * index in [0, vocab_size). */
#ifndef KVP_SAMPLER_H
#define KVP_SAMPLER_H

#include <stdint.h>

/* Temperatures below this are greedy: dividing by them only amplifies rounding. */
#define KVP_SAMPLER_GREEDY_BELOW 1e-3f

typedef struct kvp_sampler {
    int vocab_size;
    float temperature;  /* < KVP_SAMPLER_GREEDY_BELOW: greedy */
    float top_p;        /* 1 = off */
    uint64_t rng;
    struct { float p; int i; } *scratch;
} kvp_sampler;

int kvp_sampler_init(kvp_sampler *s, int vocab_size, float temperature, float top_p, uint64_t seed);
/* Restarts the random stream: the same seed draws the same tokens again. */
void kvp_sampler_seed(kvp_sampler *s, uint64_t seed);
void kvp_sampler_free(kvp_sampler *s);
/* Samples from logits (modified in place: softmax). */
int kvp_sample(kvp_sampler *s, float *logits);
/* Uniform float in [0,1) from a xorshift64* state (shared by sampler and policies). */
float kvp_rand_f32(uint64_t *state);

#endif
