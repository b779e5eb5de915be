/* Rotary position embedding (RoPE) in the two layouts GGUF models use:
 *  - consecutive pairs (x[2i], x[2i+1]): llama and mistral GGUFs (llama.cpp's converter
 *    permutes the Q and K weights into this order) and llama2.c checkpoints;
 *  - NeoX halves (x[i], x[i + n_rot/2]): qwen2, qwen3.
 * Only the first n_rot floats of a head vector rotate (partial rotary); the rest pass
 * through. Pair i turns by pos * base^(-2i/n_rot) / factors[i] radians (factors: the
 * per-pair frequency divisors of Llama 3.1+ files, `rope_freqs.weight`). */
#ifndef KVP_ROPE_H
#define KVP_ROPE_H

typedef struct kvp_rope {
    int n_rot;              /* rotated floats per head vector: even, <= head_dim */
    int neox;               /* 1: NeoX halves; 0: consecutive pairs */
    float base;             /* rope.freq_base */
    const float *factors;   /* NULL, or [n_rot/2] positive divisors; not owned */
} kvp_rope;

/* Rotates one head vector by `pos` positions (pos may be negative: rotating by a and
 * then by -b equals rotating by a - b). */
void kvp_rope_rotate(const kvp_rope *r, float *x, double pos);
/* The same in two steps, so one position's cos/sin serve every head of every layer:
 * cs[n_rot] receives (cos, sin) per pair. */
void kvp_rope_table(const kvp_rope *r, float *cs, double pos);
void kvp_rope_apply(const kvp_rope *r, float *x, const float *cs);
/* 1 when a and b rotate every vector the same way (same layout, dims, base, factors). */
int kvp_rope_same(const kvp_rope *a, const kvp_rope *b);

#endif
