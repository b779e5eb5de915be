/* The ggml tensor type ids and block sizes that the GGUF reader, the quantizers
 * (model/quant.h) and the matmul kernels share. */
#ifndef KVP_GGML_TYPE_H
#define KVP_GGML_TYPE_H

/* ggml tensor types this project reads (others are rejected by name; model/quant.h
 * gives block sizes, decoders and quantizers). */
enum kvp_ggml_type {
    KVP_GGML_F32 = 0, KVP_GGML_F16 = 1, KVP_GGML_Q4_0 = 2, KVP_GGML_Q4_1 = 3,
    KVP_GGML_Q5_0 = 6, KVP_GGML_Q5_1 = 7, KVP_GGML_Q8_0 = 8, KVP_GGML_Q2_K = 10,
    KVP_GGML_Q3_K = 11, KVP_GGML_Q4_K = 12, KVP_GGML_Q5_K = 13, KVP_GGML_Q6_K = 14,
    KVP_GGML_BF16 = 30,
};

#define KVP_N_WEIGHT_TYPES 31  /* ggml type ids are below this */

#define KVP_QK 32     /* elements per block of the _0 / _1 formats */
#define KVP_QK_K 256  /* elements per super-block of the K formats */

#endif
