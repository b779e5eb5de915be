/* tools/quantmix.c: a type name read into a mixture, and the type each tensor gets: f32
 * vectors, the K_M mixtures' q6_K tensors (llama.cpp's choice), and the fallbacks for
 * rows that do not hold whole blocks. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "model/ggml_type.h"
#include "tools/quantmix.h"

Test(quantmix, names_parse_to_their_type_and_file_type)
{
    static const struct {
        const char *name;
        uint32_t base, ftype;
        int k_m;
    } ok[] = {
        {"f32", KVP_GGML_F32, 0, 0},      {"F16", KVP_GGML_F16, 1, 0},
        {"bf16", KVP_GGML_BF16, 32, 0},   {"q8_0", KVP_GGML_Q8_0, 7, 0},
        {"Q4_0", KVP_GGML_Q4_0, 2, 0},    {"q4_1", KVP_GGML_Q4_1, 3, 0},
        {"q5_0", KVP_GGML_Q5_0, 8, 0},    {"q5_1", KVP_GGML_Q5_1, 9, 0},
        {"q4_K", KVP_GGML_Q4_K, 14, 0},   {"q5_K", KVP_GGML_Q5_K, 16, 0},
        {"q6_K", KVP_GGML_Q6_K, 18, 0},   {"q4_K_M", KVP_GGML_Q4_K, 15, 1},
        {"Q5_K_M", KVP_GGML_Q5_K, 17, 1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        kvp_quant_mix m = {99, 99, 99};
        cr_assert_eq(kvp_quant_mix_parse(ok[i].name, &m), 0, "%s", ok[i].name);
        cr_assert_eq(m.base, ok[i].base, "%s", ok[i].name);
        cr_assert_eq(m.ftype, ok[i].ftype, "%s", ok[i].name);
        cr_assert_eq(m.k_m, ok[i].k_m, "%s", ok[i].name);
    }
    static const char *const bad[] = {"q3_K", "q4_K_S", "int8", "", "q4_K_MM"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvp_quant_mix m;
        cr_assert_eq(kvp_quant_mix_parse(bad[i], &m), -1, "'%s' was accepted", bad[i]);
    }
}

static uint32_t type_of(const char *mix, const char *name, uint64_t ne0, uint32_t dims,
                        int layers, int tied)
{
    kvp_quant_mix m;
    cr_assert_eq(kvp_quant_mix_parse(mix, &m), 0);
    return kvp_quant_mix_type(&m, name, ne0, dims, layers, tied);
}

Test(quantmix, vectors_stay_f32)
{
    cr_assert_eq(type_of("q8_0", "blk.0.attn_norm.weight", 4096, 1, 32, 0), KVP_GGML_F32);
    cr_assert_eq(type_of("q4_K_M", "output_norm.weight", 4096, 1, 32, 0), KVP_GGML_F32);
    cr_assert_eq(type_of("f16", "blk.3.attn_q.weight", 4096, 2, 32, 0), KVP_GGML_F16);
}

/* 32 layers: q6_K for attn_v and ffn_down in layers 0-3 and 28-31 and every third one
 * from 6 on between; the output (or the tied embedding) always. */
Test(quantmix, k_m_mixtures_give_some_tensors_q6_k)
{
    static const int more[] = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
    for (int layer = 0; layer < 32; layer++) {
        int want = 0;
        for (size_t k = 0; k < sizeof more / sizeof *more; k++)
            want |= more[k] == layer;
        char v[64], d[64], q[64];
        snprintf(v, sizeof v, "blk.%d.attn_v.weight", layer);
        snprintf(d, sizeof d, "blk.%d.ffn_down.weight", layer);
        snprintf(q, sizeof q, "blk.%d.attn_q.weight", layer);
        uint32_t base = KVP_GGML_Q4_K;
        cr_assert_eq(type_of("q4_K_M", v, 4096, 2, 32, 0), want ? KVP_GGML_Q6_K : base, "%s", v);
        cr_assert_eq(type_of("q4_K_M", d, 4096, 2, 32, 0), want ? KVP_GGML_Q6_K : base, "%s", d);
        cr_assert_eq(type_of("q4_K_M", q, 4096, 2, 32, 0), base, "%s", q);
        cr_assert_eq(type_of("q4_K", v, 4096, 2, 32, 0), base, "plain q4_K: %s", v);
    }
    cr_assert_eq(type_of("q5_K_M", "output.weight", 4096, 2, 32, 0), KVP_GGML_Q6_K);
    cr_assert_eq(type_of("q5_K_M", "token_embd.weight", 4096, 2, 32, 1), KVP_GGML_Q6_K);
    cr_assert_eq(type_of("q5_K_M", "token_embd.weight", 4096, 2, 32, 0), KVP_GGML_Q5_K);
    cr_assert_eq(type_of("q5_K_M", "blk.10.ffn_up.weight", 4096, 2, 32, 0), KVP_GGML_Q5_K);
}

/* Rows that do not hold whole 256-blocks fall back as llama.cpp does; rows that do not
 * hold whole 32-blocks either go to f16. */
Test(quantmix, rows_without_whole_blocks_fall_back)
{
    cr_assert_eq(type_of("q4_K", "blk.0.attn_q.weight", 288, 2, 6, 0), KVP_GGML_Q5_0);
    cr_assert_eq(type_of("q5_K", "blk.0.attn_q.weight", 288, 2, 6, 0), KVP_GGML_Q5_1);
    cr_assert_eq(type_of("q6_K", "blk.0.attn_q.weight", 288, 2, 6, 0), KVP_GGML_Q8_0);
    cr_assert_eq(type_of("q4_K_M", "output.weight", 288, 2, 6, 0), KVP_GGML_Q8_0);
    cr_assert_eq(type_of("q4_K", "blk.0.attn_q.weight", 100, 2, 6, 0), KVP_GGML_F16);
    cr_assert_eq(type_of("q8_0", "blk.0.attn_q.weight", 100, 2, 6, 0), KVP_GGML_F16);
    cr_assert_eq(type_of("q8_0", "blk.0.attn_q.weight", 96, 2, 6, 0), KVP_GGML_Q8_0);
    cr_assert_eq(type_of("q4_K", "blk.0.attn_q.weight", 512, 2, 6, 0), KVP_GGML_Q4_K);
}
