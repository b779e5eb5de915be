/* Per-tensor type choice for quantized files (see quantmix.h). */
#include "tools/quantmix.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "model/gguf.h"
#include "model/quant.h"

/* llama_ftype values, for general.file_type */
static const struct { uint32_t type; uint32_t ftype; } plain_ftype[] = {
    {KVP_GGML_F32, 0}, {KVP_GGML_F16, 1}, {KVP_GGML_Q4_0, 2}, {KVP_GGML_Q4_1, 3},
    {KVP_GGML_Q8_0, 7}, {KVP_GGML_Q5_0, 8}, {KVP_GGML_Q5_1, 9}, {KVP_GGML_Q4_K, 14},
    {KVP_GGML_Q5_K, 16}, {KVP_GGML_Q6_K, 18}, {KVP_GGML_BF16, 32},
};
enum { FTYPE_Q4_K_M = 15, FTYPE_Q5_K_M = 17 };

int kvp_quant_mix_parse(const char *name, kvp_quant_mix *out)
{
    if (!strcasecmp(name, "q4_K_M") || !strcasecmp(name, "q5_K_M")) {
        int five = name[1] == '5';
        *out = (kvp_quant_mix){five ? KVP_GGML_Q5_K : KVP_GGML_Q4_K, 1,
                               five ? FTYPE_Q5_K_M : FTYPE_Q4_K_M};
        return 0;
    }
    int t = kvp_type_parse(name);
    for (size_t i = 0; t >= 0 && i < sizeof plain_ftype / sizeof plain_ftype[0]; i++)
        if (plain_ftype[i].type == (uint32_t)t) {
            *out = (kvp_quant_mix){(uint32_t)t, 0, plain_ftype[i].ftype};
            return 0;
        }
    return -1;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third
 * one between */
static int more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static uint32_t fit_rows(uint32_t type, uint64_t ne0)
{
    if (kvp_type_block(type) != KVP_QK_K || ne0 % KVP_QK_K == 0)
        return type;
    return type == KVP_GGML_Q4_K ? KVP_GGML_Q5_0 : type == KVP_GGML_Q5_K ? KVP_GGML_Q5_1
                                                                         : KVP_GGML_Q8_0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

uint32_t kvp_quant_mix_type(const kvp_quant_mix *mix, const char *name, uint64_t ne0,
                            uint32_t n_dims, int n_layers, int tied)
{
    if (n_dims < 2)
        return KVP_GGML_F32;
    uint32_t type = mix->base;
    if (mix->k_m) {
        int layer = -1;
        sscanf(name, "blk.%d.", &layer);
        if (!strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight")))
            type = KVP_GGML_Q6_K;
        else if ((ends_with(name, ".attn_v.weight") || ends_with(name, ".ffn_down.weight")) &&
                 layer >= 0 && more_bits(layer, n_layers))
            type = KVP_GGML_Q6_K;
    }
    /* the row length must hold whole blocks */
    type = fit_rows(type, ne0);
    if (ne0 % (uint64_t)kvp_type_block(type))
        type = ne0 % KVP_QK == 0 ? KVP_GGML_Q8_0 : KVP_GGML_F16;
    return type;
}
