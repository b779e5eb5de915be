/* AVX-512 VNNI build of the x86 kernels (matmul_x86.h): vpdpbusd for byte products, 512-bit f32 tiles and
 * GEMM tiles. */
#include "model/matmul_kernels.h"
#if defined(__x86_64__)
/* the target for this file's functions (clang has no GCC target pragma: an attribute on each) */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif
#define KVP_VNNI 1
#define KVP_KERNELS kvp_kernels_avx512
#include "model/matmul_x86.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
void kvp_kernels_avx512(kvp_kernel_set *ks) { (void)ks; }
#endif
