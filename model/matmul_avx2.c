/* AVX2 + FMA + F16C build of the x86 kernels (matmul_x86.h). */
#include "model/matmul_kernels.h"
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#define KVP_VNNI 0
#define KVP_KERNELS kvp_kernels_avx2
#include "model/matmul_x86.h"
#else
void kvp_kernels_avx2(kvp_kernel_set *ks) { (void)ks; }
#endif
