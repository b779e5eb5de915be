/* x86 kernel sets, compiled twice (see matmul_kernels.h): by matmul_avx2.c for AVX2 + FMA
 * + F16C, and by matmul_avx512.c with AVX-512 VNNI, where one vpdpbusd replaces the
 * maddubs + madd pair of byte products and the f32 tiles use 512-bit vectors. The
 * including file sets the target pragma, KVP_VNNI and KVP_KERNELS (the name of the table
 * filler). One file per job:
 *   x86_base.h     shared helpers
 *   x86_dot.h      activation quantizers, per-row dot products (decode)
 *   x86_gemm.h     the int8 GEMM (prefill)
 *   x86_f32.h      f32 weights at small T
 *   x86_q8small.h  Q8_0 weights at small T
 *   x86_kvrow.h    attention over stored KV rows, the q8_0 row store
 * and below, the table that hands them to the dispatcher (matmul.c). */
#include "model/x86_base.h"
#include "model/x86_dot.h"
#include "model/x86_gemm.h"
#include "model/x86_f32.h"
#include "model/x86_q8small.h"
#include "model/x86_kvrow.h"

void KVP_KERNELS(kvp_kernel_set *ks)
{
    ks->f32_rows = f32_rows;
    ks->small[KVP_GGML_Q8_0] = small_q8_0;
#if KVP_VNNI
    ks->small_prep = small_prep;
#endif
    ks->kv_dot = kv_dot;
    ks->kv_axpy = kv_axpy;
    ks->kv_store = kv_store;
    ks->kv_dots = kv_dots;
    ks->kv_mix = kv_mix;
    ks->quantize[0] = quantize32;
    ks->quantize[1] = quantize256;
    kvp_dot_fn *tab = ks->dot;
    tab[KVP_GGML_F16] = dot_f16;
    tab[KVP_GGML_BF16] = dot_bf16;
    tab[KVP_GGML_Q4_0] = dot_q4_0;
    tab[KVP_GGML_Q4_1] = dot_q4_1;
    tab[KVP_GGML_Q5_0] = dot_q5_0;
    tab[KVP_GGML_Q5_1] = dot_q5_1;
    tab[KVP_GGML_Q4_K] = dot_q4_K;
    tab[KVP_GGML_Q5_K] = dot_q5_K;
    tab[KVP_GGML_Q6_K] = dot_q6_K;
    tab[KVP_GGML_Q2_K] = dot_q2_K;
    tab[KVP_GGML_Q3_K] = dot_q3_K;
    /* the element-order packers: the scalar set's, replaced where written here */
    memcpy(natural, ks->scalar_pack, sizeof natural);
    natural[KVP_GGML_Q8_0] = natural_q8_0;
    natural[KVP_GGML_Q4_0] = natural_q4_0;
    natural[KVP_GGML_Q4_1] = natural_q4_1;
    natural[KVP_GGML_Q5_0] = natural_q5_0;
    natural[KVP_GGML_Q5_1] = natural_q5_1;
    natural[KVP_GGML_Q4_K] = natural_q4_K;
    natural[KVP_GGML_Q5_K] = natural_q5_K;
    natural[KVP_GGML_Q6_K] = natural_q6_K;
    static const struct { uint32_t type; kvp_pack_fn pack; } packs[] = {
        {KVP_GGML_Q8_0, pack_KVP_GGML_Q8_0}, {KVP_GGML_Q4_0, pack_KVP_GGML_Q4_0},
        {KVP_GGML_Q4_1, pack_KVP_GGML_Q4_1}, {KVP_GGML_Q5_0, pack_KVP_GGML_Q5_0},
        {KVP_GGML_Q5_1, pack_KVP_GGML_Q5_1}, {KVP_GGML_Q2_K, pack_KVP_GGML_Q2_K},
        {KVP_GGML_Q3_K, pack_KVP_GGML_Q3_K}, {KVP_GGML_Q4_K, pack_KVP_GGML_Q4_K},
        {KVP_GGML_Q5_K, pack_KVP_GGML_Q5_K}, {KVP_GGML_Q6_K, pack_KVP_GGML_Q6_K},
    };
    for (size_t i = 0; i < sizeof packs / sizeof packs[0]; i++) {
        ks->pack[packs[i].type] = packs[i].pack;
        ks->gemm[packs[i].type] = gemm_unsigned;
    }
#if !KVP_VNNI
    ks->gemm[KVP_GGML_Q8_0] = gemm_signed;
#endif
}
