/* AVX2 + FMA + F16C build of the x86 kernels (matmul_x86.h). */
#include "model/matmul_kernels.h"
#if defined(__x86_64__)
/* the target for this file's functions (clang has no GCC target pragma: an attribute on each) */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#define KVP_VNNI 0
#define KVP_KERNELS kvp_kernels_avx2
#include "model/matmul_x86.h"
#if defined(__clang__)
#pragma clang attribute pop
#endif
#else
void kvp_kernels_avx2(kvp_kernel_set *ks) { (void)ks; }
#endif
