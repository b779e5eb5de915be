/* RoPE scaling metadata of a GGUF model: ARCH.rope.scaling.type ("none", "linear", or
 * "longrope" where the architecture applies LongRoPE factors) and ARCH.rope.scaling.factor
 * (or the older ARCH.rope.scale_linear), read as llama.cpp reads them: no type means
 * linear, a factor of 0 means 1. Linear scaling turns position p into p / factor; kvpd
 * folds that into the per-pair frequency divisors of kvp_rope (each times the factor), so
 * the forward pass, the cache's context shift and snapshots follow it unchanged. Other
 * types (yarn, ...) are refused naming the key. */
#ifndef KVP_ROPE_SCALING_H
#define KVP_ROPE_SCALING_H

#include <stddef.h>

#include "model/gguf.h"

/* The linear factor of arch's metadata (1 when unscaled). longrope_ok: the architecture
 * takes "longrope" (its factors come from tensors; the type adds no linear factor).
 * 0 or -EINVAL with err naming the key. */
int kvp_rope_scaling_factor(const kvp_gguf *g, const char *arch, int longrope_ok,
                            float *factor, char *err, size_t errlen);

/* n divisors: factors[i] (1 where factors is NULL) times scale; malloc'd, NULL when out
 * of memory. */
float *kvp_rope_scaled_factors(const float *factors, int n, float scale);

#endif
