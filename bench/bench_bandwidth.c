/* bench_bandwidth: the machine's streaming memory bandwidth, STREAM-like, on 1 and on
 * N threads, and what one decode token of a model reads.
 *
 *   bench_bandwidth [--mib M] [--reps R] [--threads N] [--model FILE.gguf]
 *
 * Kernels over buffers of M MiB each (default 512, far past any cache), best of R passes:
 *   read   sum of 64-bit words (8 accumulators, 32-byte vector loads where the CPU has
 *          AVX2): bytes read / s, what a decode matvec does with its weights
 *   triad  a[i] = b[i] + s * c[i] over doubles: (2 reads + 1 write) x 8 bytes / s, as
 *          STREAM counts it (the write-allocate read not counted)
 * Each thread takes a contiguous share and the pass is timed from the first thread's
 * start to the last one's end. With --model, also prints the bytes one decode token
 * reads: the weights (the model's weight_bytes: every matrix in its file type, the
 * output matrix, the norms) and per cached token of context the q8_0 K and V rows of
 * every (layer, KV head), so a caller can turn tok/s into GB/s (bench/roofline.py).
 * Output is one "key value" line per figure, for scripts to read. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/parse.h"
#include "cache/kvrow.h"
#include "model/model.h"

#define MAX_THREADS 64

typedef struct bw_job {
    int kind; /* 0 read, 1 triad */
    const uint64_t *p;
    double *a;
    const double *b, *c;
    size_t n;
    uint64_t sum;
    pthread_barrier_t *start;
} bw_job;

#define READ_BODY                                                                          \
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;               \
    size_t i = 0;                                                                          \
    for (; i + 8 <= n; i += 8) {                                                           \
        s0 += p[i];                                                                        \
        s1 += p[i + 1];                                                                    \
        s2 += p[i + 2];                                                                    \
        s3 += p[i + 3];                                                                    \
        s4 += p[i + 4];                                                                    \
        s5 += p[i + 5];                                                                    \
        s6 += p[i + 6];                                                                    \
        s7 += p[i + 7];                                                                    \
    }                                                                                      \
    for (; i < n; i++)                                                                     \
        s0 += p[i];                                                                        \
    return s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;

/* Integer sums, so the compiler may vectorize without reassociating floats. */
static uint64_t read_portable(const uint64_t *p, size_t n)
{
    READ_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint64_t *p, size_t n)
{
    READ_BODY
}
#endif

static uint64_t read_words(const uint64_t *p, size_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2"))
        return read_avx2(p, n);
#endif
    return read_portable(p, n);
}

static void triad(double *a, const double *b, const double *c, size_t n)
{
    const double s = 3.0;
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] + s * c[i];
}

static void *run(void *arg)
{
    bw_job *j = arg;
    if (j->start)
        pthread_barrier_wait(j->start);
    if (j->kind == 0)
        j->sum = read_words(j->p, j->n);
    else
        triad(j->a, j->b, j->c, j->n);
    return NULL;
}

static volatile uint64_t sink;

/* Best bytes/s over reps passes of kind on threads threads. */
static double measure(int kind, const uint64_t *w, double *a, const double *b,
                      const double *c, size_t n, int threads, int reps)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        bw_job job[MAX_THREADS];
        pthread_t tid[MAX_THREADS];
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)threads);
        size_t per = n / (size_t)threads;
        int started = 1;
        for (int t = 0; t < threads; t++) {
            size_t off = per * (size_t)t, len = t == threads - 1 ? n - off : per;
            job[t] = (bw_job){kind, w ? w + off : NULL, a ? a + off : NULL,
                              b ? b + off : NULL, c ? c + off : NULL, len, 0, &bar};
        }
        for (int t = 1; t < threads; t++)
            if (pthread_create(&tid[t], NULL, run, &job[t])) {
                fprintf(stderr, "bench_bandwidth: cannot start thread %d\n", t);
                exit(1);
            } else
                started++;
        pthread_barrier_wait(&bar);
        double t0 = kvp_now();
        job[0].start = NULL;
        run(&job[0]);
        for (int t = 1; t < started; t++)
            pthread_join(tid[t], NULL);
        double dt = kvp_now() - t0;
        pthread_barrier_destroy(&bar);
        for (int t = 0; t < threads; t++)
            sink += job[t].sum;
        double bytes = (double)n * 8 * (kind == 0 ? 1 : 3);
        if (bytes / dt > best)
            best = bytes / dt;
    }
    return best;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_bandwidth [--mib M (64..65536)] [--reps R] [--threads N] "
                    "[--model FILE]\n");
    return 2;
}

int main(int argc, char **argv)
{
    long mib = 512, reps = 5, threads = sysconf(_SC_NPROCESSORS_ONLN);
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--mib") ? !kvp_parse_long(v, 64, 65536, &mib)
                 : !strcmp(a, "--reps") ? !kvp_parse_long(v, 1, 1000, &reps)
                 : !strcmp(a, "--threads") ? !kvp_parse_long(v, 1, MAX_THREADS, &threads)
                 : 1)
            return usage();
    }
    if (threads < 1)
        threads = 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;

    size_t n = (size_t)mib << 20 >> 3;
    uint64_t *w = malloc(n * 8);
    double *a = malloc(n * 8), *b = malloc(n * 8), *c = malloc(n * 8);
    if (!w || !a || !b || !c) {
        fprintf(stderr, "bench_bandwidth: cannot allocate 4 x %ld MiB\n", mib);
        return 1;
    }
    /* fault every page in before timing */
    memset(w, 1, n * 8);
    for (size_t i = 0; i < n; i++) {
        a[i] = 0;
        b[i] = 1;
        c[i] = 2;
    }
    printf("buffer_mib %ld\nreps %ld\n", mib, reps);
    int counts[2] = {1, (int)threads};
    for (int k = 0; k < (threads > 1 ? 2 : 1); k++) {
        int t = counts[k];
        printf("read_gbs_%d %.2f\n", t, measure(0, w, NULL, NULL, NULL, n, t, (int)reps) / 1e9);
        printf("triad_gbs_%d %.2f\n", t, measure(1, NULL, a, b, c, n, t, (int)reps) / 1e9);
    }
    free(w);
    free(a);
    free(b);
    free(c);

    if (model) {
        kvp_model m;
        char err[256];
        if (kvp_model_load(&m, model, NULL, err, sizeof err)) {
            fprintf(stderr, "bench_bandwidth: %s: %s\n", model, err);
            return 1;
        }
        const kvp_model_config *cfg = &m.cfg;
        size_t row = kvp_kv_row_bytes(KVP_KV_Q8_0, cfg->head_dim);
        printf("weight_bytes %zu\n", m.weight_bytes);
        /* K and V of every (layer, KV head), q8_0 rows (kvpd's default kv_type) */
        printf("kv_bytes_per_token %zu\n", 2 * row * (size_t)cfg->n_layers * (size_t)cfg->n_kv_heads);
        kvp_model_free(&m);
    }
    return 0;
}
