/* bench_sampler: nanoseconds per sample of kvp_sample on a vocabulary of --vocab tokens
 * (default 151936, Qwen2.5's), against the sort-based sampler it replaced
 * (bench/sampler_ref.h) in the same run: A/B alternating rounds, median of the rounds.
 * Two distributions: "random" (Gaussian logits, sd 1: flat like random weights, the
 * sort's worst case) and "peaked" (sd 3 with five logits 10 above). Settings:
 * temperature 0.8 / top-p 0.9 (kvpd's defaults), top-p 1 (plain temperature), and
 * greedy. Each sample copies the logits first (the sampler overwrites them); the copy
 * is timed alone and subtracted.
 *
 * Usage: bench_sampler [--vocab N] [--rounds N] [--samples N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/parse.h"
#include "bench/sampler_ref.h"
#include "model/sampler.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static volatile int sink;

/* ns per sample of one round: which 0 = copy only, 1 = new, 2 = old. */
static double round_ns(int which, const float *logits, float *work, int n, float T, float P,
                       kvp_sampler *s, ref_cand *scratch, uint64_t *rng, int samples)
{
    double t0 = now();
    for (int k = 0; k < samples; k++) {
        memcpy(work, logits, (size_t)n * sizeof *work);
        sink += which == 1 ? kvp_sample(s, work)
                : which == 2 ? ref_sample(work, n, T, P, rng, scratch, NULL) : (int)work[k];
    }
    return (now() - t0) * 1e9 / samples;
}

int main(int argc, char **argv)
{
    long n = 151936, rounds = 15, samples = 20;
    for (int i = 1; i < argc; i++) {
        int ok = i + 1 < argc;
        if (ok && !strcmp(argv[i], "--vocab"))
            ok = kvp_parse_long(argv[++i], 2, 1L << 24, &n);
        else if (ok && !strcmp(argv[i], "--rounds"))
            ok = kvp_parse_long(argv[++i], 1, 10000, &rounds);
        else if (ok && !strcmp(argv[i], "--samples"))
            ok = kvp_parse_long(argv[++i], 1, 1000000, &samples);
        else
            ok = 0;
        if (!ok) {
            fprintf(stderr, "usage: bench_sampler [--vocab N] [--rounds N] [--samples N]\n");
            return 2;
        }
    }
    float *logits = malloc((size_t)n * sizeof *logits), *work = malloc((size_t)n * sizeof *work);
    ref_cand *scratch = malloc((size_t)n * sizeof *scratch);
    double *t_new = malloc((size_t)rounds * sizeof *t_new), *t_old = malloc((size_t)rounds * sizeof *t_old),
           *t_copy = malloc((size_t)rounds * sizeof *t_copy);
    if (!logits || !work || !scratch || !t_new || !t_old || !t_copy)
        return 1;
    kvp_sampler s;
    if (kvp_sampler_init(&s, (int)n, 0.8f, 0.9f, 1))
        return 1;
    printf("bench_sampler: vocabulary %ld, softmax path %s, %ld rounds of %ld samples, "
           "A/B alternating, medians (ns per sample, the logits' copy subtracted)\n",
           n, kvp_sampler_simd(), rounds, samples);
    printf("%-8s %-22s %12s %12s %8s\n", "logits", "setting", "new ns", "old ns", "old/new");
    static const struct { const char *name; float T, P; } set[] = {
        {"T 0.8, top-p 0.9", 0.8f, 0.9f}, {"T 0.8, top-p 1", 0.8f, 1.0f}, {"greedy", 0.0f, 0.9f}};
    for (int dist = 0; dist < 2; dist++) {
        uint64_t g = 7;
        for (long i = 0; i < n; i++) {   /* Box-Muller from the project's generator */
            double u = kvp_rand_f32(&g) + 1e-7, v = kvp_rand_f32(&g);
            logits[i] = (float)((dist ? 3.0 : 1.0) * sqrt(-2.0 * log(u)) * cos(6.283185307 * v));
        }
        if (dist)
            for (int k = 0; k < 5; k++)
                logits[(long)(kvp_rand_f32(&g) * (float)n)] += 10.0f;
        for (size_t c = 0; c < sizeof set / sizeof *set; c++) {
            s.temperature = set[c].T;
            s.top_p = set[c].P;
            uint64_t rng = 1;
            for (long r = 0; r < rounds; r++) {
                int first = r % 2 ? 1 : 2;   /* alternate which one runs first */
                t_copy[r] = round_ns(0, logits, work, (int)n, set[c].T, set[c].P, &s, scratch, &rng, (int)samples);
                double a = round_ns(first, logits, work, (int)n, set[c].T, set[c].P, &s, scratch, &rng, (int)samples);
                double b = round_ns(3 - first, logits, work, (int)n, set[c].T, set[c].P, &s, scratch, &rng, (int)samples);
                t_new[r] = (first == 1 ? a : b) - t_copy[r];
                t_old[r] = (first == 1 ? b : a) - t_copy[r];
            }
            double mn = median(t_new, (int)rounds), mo = median(t_old, (int)rounds);
            printf("%-8s %-22s %12.0f %12.0f %7.1fx\n", dist ? "peaked" : "random", set[c].name,
                   mn, mo, mo / mn);
        }
    }
    kvp_sampler_free(&s);
    free(logits), free(work), free(scratch), free(t_new), free(t_old), free(t_copy);
    return 0;
}
