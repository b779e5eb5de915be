/* Which type each tensor gets when a model is written quantized (`kvp quantize`,
 * `kvp synth --type`).
 *
 * A plain type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K) puts
 * every matrix in that type. The mixtures follow llama.cpp's converter
 * (llama_tensor_get_type) for Q4_K_M and Q5_K_M:
 *   - output.weight (token_embd.weight when the output is tied to it): q6_K;
 *   - attn_v.weight and ffn_down.weight: q6_K in the first eighth of the layers, the
 *     last eighth, and every third layer between (use_more_bits), else the base type;
 *   - every other matrix: the base type (q4_K, or q5_K).
 * Everywhere, a K type on rows that are not a multiple of 256 falls back as llama.cpp
 * does: q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0. Vectors (norms) stay f32. */
#ifndef KVP_QUANTMIX_H
#define KVP_QUANTMIX_H

#include <stdint.h>

typedef struct kvp_quant_mix {
    uint32_t base;      /* enum kvp_ggml_type */
    int k_m;            /* 1 for the q4_K_M / q5_K_M mixtures */
    uint32_t ftype;     /* general.file_type (llama_ftype) to record */
} kvp_quant_mix;

/* Parses "q4_K_M", "q8_0", "f16", ... (case-insensitive). 0 or -1. */
int kvp_quant_mix_parse(const char *name, kvp_quant_mix *out);
/* The type of tensor `name` (ne0 elements per row, n_dims dimensions) in a model of
 * n_layers layers; tied: the model has no output.weight. */
uint32_t kvp_quant_mix_type(const kvp_quant_mix *mix, const char *name, uint64_t ne0,
                            uint32_t n_dims, int n_layers, int tied);

#define KVP_QUANT_MIX_NAMES "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K, q4_K_M, q5_K_M"

#endif
