/* Matrix products with weights kept in their file's type (f32, f16, bf16, or one of
 * ggml's block formats, see quant.h).
 *
 * One entry point, kvp_matmul, for every weight matrix of the forward pass:
 *   - f32 weights: blocks of up to KVP_F32_SMALL_T activation rows (decode steps, batched
 *     or not) on the thread pool, each weight row streamed once and dotted with every
 *     activation row (AVX-512 / AVX2 / scalar); longer blocks through OpenBLAS sgemm;
 *   - decode (a few rows of activations) quantizes each activation row once to 8-bit
 *     blocks (32 elements for the _0/_1 formats, 256 for the K formats, as ggml does)
 *     and runs integer dot products (Q8_0: up to KVP_QUANT_SMALL_T rows, each weight
 *     block read once for all of them), AVX-512 VNNI / AVX2 / portable scalar chosen at run
 *     time (KVP_SIMD=scalar|avx2|avx512 forces one); f16 / bf16 rows take f32 dot
 *     products; rows are split over a small thread pool when only one forward pass is
 *     running in the process (KVP_THREADS caps its size; default: online CPUs);
 *   - prefill (longer blocks) takes one of two paths, both reusing each weight row
 *     across the block's tokens:
 *       int8 GEMM: the activation rows are quantized once as decode does, each chunk of
 *         weight rows is unpacked once to 8-bit codes and multiplied with every token
 *         by register-blocked integer kernels (the default for the block formats);
 *       tiles + sgemm: tiles of rows decoded to f32 and multiplied with sgemm
 *         (f32 activations: the "exact" path; f16 / bf16 always take it).
 *     KVP_PREFILL=sgemm|int8 (or kvp_matmul_force_prefill) forces one (sgemm: f32
 *     weights take OpenBLAS at every block size). */
#ifndef KVP_MATMUL_H
#define KVP_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "cache/kvrow.h"

typedef struct kvp_weight {
    uint32_t type;        /* enum kvp_ggml_type */
    int rows, cols;       /* [rows][cols], a row is contiguous (cols = ggml's ne[0]) */
    size_t row_bytes;
    const void *data;     /* rows * row_bytes bytes */
} kvp_weight;

/* Blocks of at least this many activation rows take the tile + sgemm path. */
#define KVP_MATMUL_TILE_MIN_T 4
/* f32 weights: blocks of at most this many rows take the pool's kernel, longer ones
 * sgemm (the crossover measured by `bench_matmul --f32-small`, see docs/benchmarks.md). */
#define KVP_F32_SMALL_T 256
/* Block formats with a small-T kernel (Q8_0): blocks of at most this many rows take it,
 * longer ones the int8 GEMM (the crossover measured by `bench_matmul --q8-small`). */
#define KVP_QUANT_SMALL_T 32

/* y[T][rows] = x[T][cols] . W^T, or y += when accumulate. */
void kvp_matmul(float *y, const float *x, const kvp_weight *w, int T, int accumulate);
/* y[i] = x . w[i]^T for n matrices that read the same x[T][cols] (q/k/v, gate/up): at
 * decode one pass over all their rows (the pool meets once); else n kvp_matmul calls. */
void kvp_matmul_shared(int n, float *const y[], const float *x, const kvp_weight *const w[], int T);
enum kvp_prefill_path { KVP_PREFILL_AUTO, KVP_PREFILL_SGEMM, KVP_PREFILL_INT8 };
/* Forces the prefill path of every later call in the process (tests and benchmarks;
 * KVP_PREFILL sets it at start). INT8 applies to the types that have an int8 GEMM. */
void kvp_matmul_force_prefill(enum kvp_prefill_path path);
/* The prefill path blocks of `type` take now: "int8", "sgemm" (or "f32 sgemm"). */
const char *kvp_matmul_prefill_path(uint32_t type);

/* Decodes row r of W into out[cols] (embedding lookup). */
void kvp_weight_row(const kvp_weight *w, int r, float *out);

/* A forward pass brackets its matmuls with these so that the thread pool serves one
 * pass at a time: with two passes running (two daemon workers) each keeps to its own
 * thread. */
void kvp_matmul_enter(void);
void kvp_matmul_leave(void);
/* Starts the pool's helper threads now, from the calling thread, whose nice value they
 * take (base/thread.h); without it the first split job starts them, from whichever
 * thread runs it, background ones included. Once per process; later calls do nothing. */
void kvp_matmul_start(void);

/* Attention over stored KV cache rows of n numbers (cache/kvrow.h), with the kernel set
 * in use: returns row . q; adds a * row to y; stores x[n] as a row (the same bytes as
 * kvp_kv_row_store). */
float kvp_kv_dot(kvp_kv_type t, const void *row, const float *q, int n);
void kvp_kv_axpy(kvp_kv_type t, float *y, float a, const void *row, int n);
void kvp_kv_store(kvp_kv_type t, void *row, const float *x, int n);
/* The same over n_rows consecutive rows (a head's store): out[j] = scale * (row j . q),
 * each as kvp_kv_dot computes it; y[n] = sum_j a[j] * row j, as kvp_kv_axpy adds them
 * in row order from y = 0. */
void kvp_kv_dots(kvp_kv_type t, const void *rows, int n_rows, const float *q, int n, float scale,
                 float *out);
void kvp_kv_mix(kvp_kv_type t, const void *rows, int n_rows, const float *a, int n, float *y);

/* The most threads the pool runs (the caller included). */
#define KVP_MATMUL_MAX_THREADS 16

/* Other work of a forward pass on the same threads: fn(ctx, i, slot) for every i in
 * [0, n), in any order, on the calling thread and, when this is the only forward pass,
 * the pool is free and the work is worth a second thread (bytes: what the items read in
 * all), on the pool's threads too. slot names the thread running the item (0: the
 * caller; always below `slots` and KVP_MATMUL_MAX_THREADS), so each can have its own
 * scratch; one thread runs one item at a time. linger: the pool's threads keep polling
 * for a next job afterwards (set when the pool's own matmuls follow soon; clear when
 * OpenBLAS needs the cores next). Returns when every item has run. */
void kvp_matmul_parallel(int n, void (*fn)(void *ctx, int i, int slot), void *ctx, size_t bytes,
                         int slots, int linger);
/* Whether kvp_matmul(w, T) runs on the pool's threads (else OpenBLAS's): the linger
 * of a kvp_matmul_parallel just before it. */
int kvp_matmul_pooled(const kvp_weight *w, int T);
/* Threads kvp_matmul_parallel may use: the pool's helpers plus the caller. */
int kvp_matmul_threads(void);
/* Caps the threads of every later job, matmuls and items (0: no cap; 1: the calling
 * thread alone), so tests can compare the split work with the serial path. */
void kvp_matmul_force_threads(int n);

/* The kernel set in use: "avx512", "avx2" or "scalar". */
const char *kvp_matmul_simd(void);

#endif
