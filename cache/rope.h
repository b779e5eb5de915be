/* Rotary position embedding on consecutive pairs (x[2i], x[2i+1]), the layout of
 * llama2.c checkpoints and of GGUF llama tensors (which share the permutation). */
#ifndef KVP_ROPE_H
#define KVP_ROPE_H

/* Rotates one head vector of head_dim floats by `pos` positions (pos may be negative:
 * RoPE(a) then RoPE(-b) equals RoPE(a - b)). */
void kvp_rope(float *x, int head_dim, double pos, float base);
/* The same in two steps, so one position's cos/sin serve every head of every layer:
 * cs[head_dim] receives (cos, sin) per pair. */
void kvp_rope_table(float *cs, int head_dim, double pos, float base);
void kvp_rope_apply(float *x, int head_dim, const float *cs);

#endif
