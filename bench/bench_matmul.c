/* bench_matmul: matrix-vector throughput of kvp_matmul per weight type on one thread,
 * against ggml's own kernels (../shared/anchors/ggml-quantize-perf, `vec_dot_q`,
 * "quantized throughput") run in the same process tree, at the same size.
 *
 * Each matrix holds at least --mib MiB of weights (default 128; far beyond the caches,
 * so both sides stream from memory); throughput = weight bytes / time of one y = W x
 * (activation quantization included), best of --reps.
 *
 * Usage: bench_matmul [--anchor PATH] [--mib N] [--reps N] [--rounds N] [--types q8_0,q4_K,...]
 *
 * bench_matmul --f32-small COLS [--mib N] [--reps N]: f32 weights [rows][COLS] (--mib
 * MiB) against T = 1..256 activation rows on every thread, as a decode step of T
 * sessions runs them: the pool's small-T kernel against OpenBLAS (sgemv at T = 1, else
 * sgemm), alternating, best of --reps each; the ratio gives the crossover T
 * (KVP_F32_SMALL_T in model/matmul.h). Both also as a share of the threads' f32 peak
 * (fused multiply-adds alone on the kernel set's vector width, best of the reps
 * alternating with them).
 *
 * bench_matmul --q8-small COLS [--mib N] [--reps N]: the same for q8_0 weights: the
 * small-T kernel (each block read once for T activation rows) against the int8 GEMM
 * (forced; below KVP_MATMUL_TILE_MIN_T rows both run the kernel), KVP_QUANT_SMALL_T. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

#include "model/gguf.h"
#include "model/matmul.h"
#include "model/quant.h"
#include "base/parse.h"

#define COLS 4096

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Time-stamp counter ticks per second (the anchor reports cycles from it). */
static double tsc_hz(void)
{
    double t0 = now();
    uint64_t c0 = __rdtsc();
    while (now() - t0 < 0.05)
        ;
    return (double)(__rdtsc() - c0) / (now() - t0);
}

/* ggml's vec_dot_q for `type` over n values: "quantized throughput" as printed (GB/s,
 * from the average cycles) and the minimum cycles per 32 values; 0 if the anchor cannot
 * be run. */
static double anchor_gbs(const char *anchor, const char *type, long n, double *min_cycles)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --op vec_dot_q --type %s --size %ld -i 5 2>/dev/null", anchor,
             type, n);
    FILE *p = popen(cmd, "r");
    if (!p)
        return 0;
    char line[512];
    double gbs = 0;
    *min_cycles = 0;
    while (fgets(line, sizeof line, p)) {
        const char *q = strstr(line, "quantized throughput");
        if (q && (q = strchr(q, ':')))
            gbs = strtod(q + 1, NULL);
        q = strstr(line, "min cycles/32 vals");
        if (q && (q = strchr(q, ':')))
            *min_cycles = strtod(q + 1, NULL);
    }
    pclose(p);
    return gbs;
}

/* The machine's f32 peak on every thread of the pool: a loop of independent fused
 * multiply-adds on the widest vectors the kernel set uses (12 chains, enough to cover
 * the latency on two FMA pipes), as GFLOP/s (0 for the scalar set). On a loaded machine
 * it is what the threads get of the cores, so it is measured beside each T. */
typedef struct peak_job {
    long iters;
    int wide;          /* 1: 16 lanes (AVX-512), else 8 (AVX2) */
    float sink[KVP_MATMUL_MAX_THREADS];
} peak_job;

#define PEAK_CHAINS 12
#define PEAK_LOOP(vec, set1, fma, add, lanes)                                                   \
    do {                                                                                       \
        vec acc[PEAK_CHAINS], b = set1(1.0f + 1e-7f * (float)(slot + 1)), c = set1(1e-9f);      \
        for (int i = 0; i < PEAK_CHAINS; i++)                                                  \
            acc[i] = set1((float)i);                                                           \
        for (long k = 0; k < j->iters; k++)                                                    \
            for (int i = 0; i < PEAK_CHAINS; i++)                                              \
                acc[i] = fma(acc[i], b, c);                                                    \
        vec t = acc[0];                                                                        \
        for (int i = 1; i < PEAK_CHAINS; i++)                                                  \
            t = add(t, acc[i]);                                                                \
        float out[lanes];                                                                      \
        memcpy(out, &t, sizeof out);                                                           \
        j->sink[slot] = out[0];                                                                \
    } while (0)

__attribute__((target("avx512f"))) static void peak_item512(peak_job *j, int slot)
{
    PEAK_LOOP(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, 16);
}

__attribute__((target("avx2,fma"))) static void peak_item256(peak_job *j, int slot)
{
    PEAK_LOOP(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, 8);
}

static void peak_item(void *ctx, int i, int slot)
{
    (void)i;
    peak_job *j = ctx;
    if (j->wide)
        peak_item512(j, slot);
    else
        peak_item256(j, slot);
}

static double peak_gflops(void)
{
    const char *simd = kvp_matmul_simd();
    if (!strcmp(simd, "scalar"))
        return 0;
    int threads = kvp_matmul_threads();
    peak_job j = {.iters = 1000000, .wide = !strcmp(simd, "avx512")};
    double t0 = now();
    kvp_matmul_parallel(threads, peak_item, &j, (size_t)1 << 30, threads, 0);
    return 2.0 * (j.wide ? 16 : 8) * PEAK_CHAINS * (double)j.iters * threads / (now() - t0) / 1e9;
}

/* Weights of `type` at small T, every thread: the pool's small-T kernel (f32 up to
 * KVP_F32_SMALL_T, q8_0 up to KVP_QUANT_SMALL_T) against what the type takes without it
 * (f32: OpenBLAS; q8_0: the int8 GEMM from KVP_MATMUL_TILE_MIN_T rows). */
static int bench_small(uint32_t type, int cols, long mib, long reps)
{
    static const int Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256};
    enum { MAX_T = 256 };
    int f32 = type == KVP_GGML_F32, small_t = f32 ? KVP_F32_SMALL_T : KVP_QUANT_SMALL_T;
    size_t row_bytes = kvp_type_nbytes(type, (uint64_t)cols);
    int rows = (int)(((size_t)mib << 20) / row_bytes / 64 * 64);
    float *w = malloc((size_t)rows * cols * sizeof *w), *x = malloc((size_t)MAX_T * cols * sizeof *x);
    float *y = malloc((size_t)MAX_T * rows * sizeof *y);
    void *data = f32 ? (void *)w : malloc(row_bytes * (size_t)rows);
    if (!w || !x || !y || !data || rows < 64) {
        fprintf(stderr, "bench_matmul: cannot build a %d x %d matrix\n", rows, cols);
        return 1;
    }
    uint64_t s = 7;
    for (size_t i = 0; i < (size_t)rows * cols; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float)((double)(s >> 11) * 0x1p-53 * 2 - 1);
    }
    if (!f32 && kvp_quantize(type, w, data, (uint64_t)rows * cols) != 0) {
        fprintf(stderr, "bench_matmul: cannot quantize to %s\n", kvp_type_name(type));
        return 1;
    }
    for (size_t i = 0; i < (size_t)MAX_T * cols; i++)
        x[i] = sinf(0.1f * (float)i);
    kvp_weight wt = {type, rows, cols, row_bytes, data};
    const char *other = f32 ? "OpenBLAS" : "int8 GEMM";
    kvp_matmul_enter();
    printf("## %s weights at small T: %d x %d (%.0f MiB), %d threads (kernels: %s)\n\n"
           "| T | kernel ms | kernel GB/s | kernel G(FL)OP/s | kernel / peak | %s ms | %s G(FL)OP/s "
           "| %s / peak | %s / kernel (time) | f32 peak GFLOP/s |\n"
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
           kvp_type_name(type), rows, cols, (double)rows * row_bytes / (1 << 20), kvp_matmul_threads(),
           kvp_matmul_simd(), other, other, other, other);
    for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
        int T = Ts[k];
        double best[2] = {1e30, 1e30}, peak = 0;
        for (long r = 0; r < reps; r++) {
            double p = f32 ? peak_gflops() : 0;   /* (f32 alone: the peak is of f32 FLOPs) */
            peak = p > peak ? p : peak;
            for (int side = 0; side < 2; side++) {
                /* side 0: the default (the kernel up to small_t); 1: without it */
                kvp_matmul_force_prefill(side ? (f32 ? KVP_PREFILL_SGEMM : KVP_PREFILL_INT8)
                                              : KVP_PREFILL_AUTO);
                double t0 = now();
                kvp_matmul(y, x, &wt, T, 0);
                double dt = now() - t0;
                best[side] = dt < best[side] ? dt : best[side];
            }
        }
        double flop = 2.0 * T * rows * cols, bytes = (double)rows * row_bytes;
        const char *note = T > small_t ? " (both without)"
                           : !f32 && T < KVP_MATMUL_TILE_MIN_T ? " (both the kernel)" : "";
        char share[3][16] = {"-", "-", "-"};
        for (int side = 0; side < 2 && peak > 0; side++)
            snprintf(share[side], sizeof share[side], "%.0f%%", 100 * flop / best[side] / 1e9 / peak);
        if (peak > 0)
            snprintf(share[2], sizeof share[2], "%.0f", peak);
        printf("| %d%s | %.2f | %.1f | %.1f | %s | %.2f | %.1f | %s | %.2fx | %s |\n", T, note,
               best[0] * 1e3, bytes / best[0] / 1e9, flop / best[0] / 1e9, share[0], best[1] * 1e3,
               flop / best[1] / 1e9, share[1], best[1] / best[0], share[2]);
        fflush(stdout);
    }
    kvp_matmul_leave();
    kvp_matmul_force_prefill(KVP_PREFILL_AUTO);
    if (!f32)
        free(data);
    free(w);
    free(x);
    free(y);
    return 0;
}

int main(int argc, char **argv)
{
    const char *anchor = "../shared/anchors/ggml-quantize-perf";
    const char *list = "q8_0,q4_0,q4_1,q5_0,q5_1,q2_K,q3_K,q4_K,q5_K,q6_K,f16,bf16";
    long mib = 128, reps = 5, rounds = 3, small_cols = 0, q8_cols = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--anchor"))
            anchor = argv[i + 1];
        else if (!strcmp(argv[i], "--types"))
            list = argv[i + 1];
        else if (!(!strcmp(argv[i], "--mib") ? kvp_parse_long(argv[i + 1], 8, 1 << 16, &mib)
                   : !strcmp(argv[i], "--reps") ? kvp_parse_long(argv[i + 1], 1, 1000, &reps)
                   : !strcmp(argv[i], "--rounds") ? kvp_parse_long(argv[i + 1], 1, 100, &rounds)
                   : !strcmp(argv[i], "--f32-small") ? kvp_parse_long(argv[i + 1], 8, 1 << 16, &small_cols)
                   : !strcmp(argv[i], "--q8-small") ? kvp_parse_long(argv[i + 1], 32, 1 << 16, &q8_cols) &&
                                                      q8_cols % 32 == 0
                   : 0)) {
            fprintf(stderr, "usage: bench_matmul [--anchor PATH] [--mib N] [--reps N] [--rounds N] [--types LIST] [--f32-small COLS] [--q8-small COLS]\n");
            return 2;
        }
    }
    if (argc % 2 == 0) {
        fprintf(stderr, "usage: bench_matmul [--anchor PATH] [--mib N] [--reps N] [--rounds N] [--types LIST] [--f32-small COLS] [--q8-small COLS]\n");
        return 2;
    }
    if (small_cols)
        return bench_small(KVP_GGML_F32, (int)small_cols, mib, reps);
    if (q8_cols)
        return bench_small(KVP_GGML_Q8_0, (int)q8_cols, mib, reps);
    setenv("KVP_THREADS", "1", 0);  /* one thread, as ggml's vec_dot benchmark */
    openblas_set_num_threads(1);

    /* a tile of real quantized rows (random weights), repeated to fill the matrix */
    enum { TILE = 64 };
    float *src = malloc((size_t)TILE * COLS * sizeof *src), *x = malloc(COLS * sizeof *x);
    uint64_t s = 7;
    for (size_t i = 0; i < (size_t)TILE * COLS; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = (float)((double)(s >> 11) * 0x1p-53 * 2 - 1);
    }
    for (int i = 0; i < COLS; i++)
        x[i] = sinf(0.1f * (float)i);

    printf("## matrix-vector throughput, one thread (kernels: %s)\n\n", kvp_matmul_simd());
    double hz = tsc_hz();
    printf("| type | weight MiB | kvp GB/s | ggml GB/s (printed, avg) | ggml GB/s (min cycles) "
           "| kvp / ggml (min) |\n|---|---:|---:|---:|---:|---:|\n");
    char types[256];
    snprintf(types, sizeof types, "%s", list);
    for (char *save = NULL, *t = strtok_r(types, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int type = kvp_type_parse(t);
        if (type < 0) {
            fprintf(stderr, "bench_matmul: unknown type %s\n", t);
            return 2;
        }
        size_t rb = kvp_type_nbytes((uint32_t)type, COLS);
        int rows = (int)(((size_t)mib << 20) / rb / TILE * TILE);
        uint8_t *w = malloc(rb * rows);
        float *y = malloc((size_t)rows * sizeof *y);
        if (!w || !y || kvp_quantize((uint32_t)type, src, w, (uint64_t)TILE * COLS)) {
            fprintf(stderr, "bench_matmul: %s: cannot build the matrix\n", t);
            return 1;
        }
        for (int r = TILE; r < rows; r += TILE)
            memcpy(w + rb * r, w, rb * TILE);
        kvp_weight wt = {(uint32_t)type, rows, COLS, rb, w};
        kvp_matmul(y, x, &wt, 1, 0);  /* warm-up */
        /* kvp and the anchor take turns (--rounds, best of each), so a burst of load
         * from other processes hits both sides alike */
        double best = 1e30, ref = 0, min_cyc = 0;
        for (long round = 0; round < rounds; round++) {
            for (long r = 0; r < reps; r++) {
                double t0 = now();
                kvp_matmul(y, x, &wt, 1, 0);
                double dt = now() - t0;
                best = dt < best ? dt : best;
            }
            double mc = 0;
            double a = anchor_gbs(anchor, t, (long)rows * COLS, &mc);  /* same element count */
            ref = a > ref ? a : ref;
            min_cyc = mc > 0 && (min_cyc == 0 || mc < min_cyc) ? mc : min_cyc;
        }
        double gbs = (double)rb * rows / best / 1e9;
        /* bytes of 32 values of this type */
        double b32 = (double)kvp_type_nbytes((uint32_t)type, 256) / 8;
        double ref_min = min_cyc > 0 ? b32 * hz / min_cyc / 1e9 : 0;
        printf("| %s | %.0f | %.2f | %.2f | %.2f | %.2fx |\n", kvp_type_name((uint32_t)type),
               (double)rb * rows / (1 << 20), gbs, ref, ref_min, ref_min > 0 ? gbs / ref_min : 0);
        fflush(stdout);
        free(w);
        free(y);
    }

    /* prefill: a block of PREFILL_T activation rows through both paths */
    enum { PREFILL_T = 256, PREFILL_ROWS = 1024 };
    float *xs = malloc((size_t)PREFILL_T * COLS * sizeof *xs);
    float *ys = malloc((size_t)PREFILL_T * PREFILL_ROWS * sizeof *ys);
    for (size_t i = 0; i < (size_t)PREFILL_T * COLS; i++)
        xs[i] = sinf(0.1f * (float)i) * (float)(1 + i % 3);
    printf("\n## prefill, %d tokens x %d x %d, one thread: int8 GEMM against tiles + sgemm\n\n"
           "| type | int8 GEMM GMAC/s | tiles + sgemm GMAC/s | int8 / sgemm | taken by default |\n"
           "|---|---:|---:|---:|---|\n", PREFILL_T, PREFILL_ROWS, COLS);
    snprintf(types, sizeof types, "%s", list);
    for (char *save = NULL, *t = strtok_r(types, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint32_t type = (uint32_t)kvp_type_parse(t);
        size_t rb = kvp_type_nbytes(type, COLS);
        uint8_t *w = malloc(rb * PREFILL_ROWS);
        if (!w || kvp_quantize(type, src, w, (uint64_t)TILE * COLS))
            continue;  /* types without a quantizer have no prefill row */
        for (int r = TILE; r < PREFILL_ROWS; r += TILE)
            memcpy(w + rb * r, w, rb * TILE);
        kvp_weight wt = {type, PREFILL_ROWS, COLS, rb, w};
        static const enum kvp_prefill_path paths[2] = {KVP_PREFILL_INT8, KVP_PREFILL_SGEMM};
        double best[2] = {1e30, 1e30};
        for (int round = 0; round < 2; round++)
            for (int k = 0; k < 2; k++) {
                kvp_matmul_force_prefill(paths[k]);
                for (long r = 0; r < reps; r++) {
                    double t0 = now();
                    kvp_matmul(ys, xs, &wt, PREFILL_T, 0);
                    double dt = now() - t0;
                    best[k] = dt < best[k] ? dt : best[k];
                }
            }
        kvp_matmul_force_prefill(KVP_PREFILL_AUTO);
        double macs = (double)PREFILL_T * PREFILL_ROWS * COLS;
        const char *dflt = kvp_matmul_prefill_path(type);
        printf("| %s | %.1f | %.1f | %.2fx | %s |\n", kvp_type_name(type), macs / best[0] / 1e9,
               macs / best[1] / 1e9, best[1] / best[0], dflt);
        fflush(stdout);
        free(w);
    }
    free(xs);
    free(ys);
    printf("\nggml: %s --op vec_dot_q --type T --size N -i 5 (the same number of weights); "
           "both sides one thread; %ld alternating rounds, best of each side. ggml prints its "
           "throughput from the average cycles, which other processes' load inflates; the "
           "min-cycles column converts its best pass with the TSC rate (%.2f GHz), the "
           "measure comparable with kvp's best pass.\n", anchor, rounds, hz / 1e9);
    free(src);
    free(x);
    return 0;
}
