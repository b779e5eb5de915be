/* bench_engine: decode and prefill throughput of the forward pass, set against the
 * machine's memory read bandwidth measured in the same run.
 *
 * Decode reads every weight once per token, so on a CPU it is bandwidth bound: the
 * "BW fraction" column (weight bytes x tok/s / measured bandwidth) says how close the
 * engine gets to that ceiling. Prefill runs blocks of tokens through sgemm and reuses
 * each weight across the block, so prefill/decode shows what batching buys.
 *
 * Usage: bench_engine [--model PATH] [--tokenizer PATH] [--synth PATH] [--kvp PATH]
 *                     [--no-synth] [--decode N] [--bw-mib N] [--reps N]
 * Defaults: models/stories260K.bin + models/tok512.bin, and a 110M llama (dim 768,
 * hidden 2048, 12 layers, 12 heads, vocab 32000) at /tmp/kvp-synth-110M.gguf, written
 * with `kvp synth` (found beside this binary as ../tools/kvp) when absent. */
#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/matmul.h"
#include "model/model.h"
#include "base/parse.h"
#include "base/clock.h"

#define MAX_THREADS 64

/* ------------------------------------------------------------ memory bandwidth */

typedef struct bw_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_job;

/* Integer sums so the compiler may vectorize (no float reassociation needed); four
 * accumulators keep several loads in flight. */
static void *stream_sum(void *arg)
{
    bw_job *j = arg;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= j->n; i += 4) {
        a += j->p[i];
        b += j->p[i + 1];
        c += j->p[i + 2];
        d += j->p[i + 3];
    }
    for (; i < j->n; i++)
        a += j->p[i];
    j->sum = a + b + c + d;
    return NULL;
}

/* Keeps the sums alive so the reads cannot be optimized away. */
static volatile uint64_t bw_sink;

/* Best read bandwidth (bytes/s) over `reps` passes of `threads` threads. */
static double bandwidth(const uint64_t *buf, size_t n, int threads, int reps)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        bw_job job[MAX_THREADS];
        pthread_t tid[MAX_THREADS];
        int started[MAX_THREADS] = {0};
        size_t per = n / (size_t)threads;
        double t0 = kvp_now();
        for (int t = 1; t < threads; t++) {
            size_t len = t == threads - 1 ? n - per * (size_t)t : per;
            job[t] = (bw_job){buf + per * (size_t)t, len, 0};
            started[t] = !pthread_create(&tid[t], NULL, stream_sum, &job[t]);
        }
        job[0] = (bw_job){buf, per, 0};
        stream_sum(&job[0]);
        for (int t = 1; t < threads; t++) {
            if (started[t])
                pthread_join(tid[t], NULL);
            else
                stream_sum(&job[t]); /* no thread: the number is lower, not wrong */
        }
        double dt = kvp_now() - t0;
        for (int t = 0; t < threads; t++)
            bw_sink += job[t].sum;
        double bw = (double)(n * sizeof *buf) / dt;
        best = bw > best ? bw : best;
    }
    return best;
}

/* ----------------------------------------------------------------- the engine */

/* VmRSS of this process in MB (0 if unreadable). */
static double rss_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = strtod(line + 6, NULL);
    if (f)
        fclose(f);
    return kb * 1024 / 1e6;
}

typedef struct result {
    char name[64];
    int ok;
    char mix[96];         /* weight bytes by type (kvp_model_weight_mix) */
    double rss_mb;        /* resident memory the loaded model and its run added */
    double weight_bytes;
    int decode_n;
    double decode_tps;
    int blocks[2];
    double prefill_tps[2];
    double prefill_sgemm_tps;  /* the largest block on tiles + sgemm, when int8 is the default */
} result;

static int token(int i, int vocab)
{
    /* deterministic, spread over the vocabulary, never BOS/EOS */
    return 3 + (int)(((unsigned)i * 7919u) % (unsigned)(vocab - 3));
}

/* Decode: tokens one at a time from position 0; best of reps. */
static double run_decode(const kvp_model *m, kvp_runstate *s, kvp_cache *c, int n, int reps)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        kvp_cache_reset(c);
        double t0 = kvp_now();
        for (int i = 0; i < n; i++) {
            int tok = token(i, m->cfg.vocab_size);
            if (kvp_forward(m, s, c, &tok, 1, NULL))
                return -1;
        }
        double tps = n / (kvp_now() - t0);
        best = tps > best ? tps : best;
    }
    return best;
}

/* Prefill: `total` tokens in blocks of `block` from position 0; best of reps. */
static double run_prefill(const kvp_model *m, kvp_runstate *s, kvp_cache *c, int block,
                          int total, int reps)
{
    int *toks = malloc((size_t)total * sizeof *toks);
    if (!toks)
        return -1;
    for (int i = 0; i < total; i++)
        toks[i] = token(i, m->cfg.vocab_size);
    double best = 0;
    for (int r = 0; r < reps && best >= 0; r++) {
        kvp_cache_reset(c);
        double t0 = kvp_now();
        for (int i = 0; i < total; i += block) {
            int n = total - i < block ? total - i : block;
            if (kvp_forward(m, s, c, toks + i, n, NULL)) {
                best = -1;
                break;
            }
        }
        double tps = total / (kvp_now() - t0);
        best = best >= 0 && tps > best ? tps : best;
    }
    free(toks);
    return best;
}

static void bench_model(result *res, const char *label, const char *path, const char *tok,
                        int decode_n, int reps)
{
    memset(res, 0, sizeof *res);
    snprintf(res->name, sizeof res->name, "%s", label);
    kvp_model m;
    char err[512];
    double rss0 = rss_mb();
    fprintf(stderr, "bench: loading %s\n", path);
    if (kvp_model_load(&m, path, tok, err, sizeof err)) {
        fprintf(stderr, "bench: %s\n", err);
        return;
    }
    const kvp_model_config *cfg = &m.cfg;
    kvp_model_weight_mix(&m, res->mix, sizeof res->mix);
    res->weight_bytes = (double)m.weight_bytes;
    kvp_model_use_cores(&m);  /* the daemon's rule, so the figures are the daemon's */
    /* two prefill block sizes, both within the context */
    int big = cfg->seq_len >= 512 ? 256 : cfg->seq_len / 2;
    res->blocks[0] = big / 2 > 0 ? big / 2 : 1;
    res->blocks[1] = big > 0 ? big : 1;
    int total = 2 * res->blocks[1] <= cfg->seq_len ? 2 * res->blocks[1] : res->blocks[1];
    res->decode_n = decode_n < cfg->seq_len ? decode_n : cfg->seq_len;

    kvp_runstate s;
    kvp_cache c;
    if (kvp_runstate_init(&s, cfg, res->blocks[1]) ||
        kvp_cache_init(&c, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &cfg->rope)) {
        fprintf(stderr, "bench: out of memory\n");
        kvp_model_free(&m);
        return;
    }
    /* warm-up: faults the weights in and grows the cache once */
    run_decode(&m, &s, &c, res->decode_n < 8 ? res->decode_n : 8, 1);
    res->decode_tps = run_decode(&m, &s, &c, res->decode_n, reps);
    for (int b = 0; b < 2; b++)
        res->prefill_tps[b] = run_prefill(&m, &s, &c, res->blocks[b], total, reps);
    if (!strcmp(kvp_matmul_prefill_path(m.layers[0].w_up.type), "int8")) {
        kvp_matmul_force_prefill(KVP_PREFILL_SGEMM);  /* the other prefill path, same blocks */
        res->prefill_sgemm_tps = run_prefill(&m, &s, &c, res->blocks[1], total, reps);
        kvp_matmul_force_prefill(KVP_PREFILL_AUTO);
    }
    res->rss_mb = rss_mb() - rss0;
    res->ok = res->decode_tps > 0 && res->prefill_tps[0] > 0 && res->prefill_tps[1] > 0;
    if (!res->ok)
        fprintf(stderr, "bench: %s: forward pass failed\n", label);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    kvp_model_free(&m);
}

/* ---------------------------------------------------------------- synth model */

/* Path of ../tools/kvp next to this binary (build/bench/bench_engine). */
static void default_kvp(char *buf, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(buf, cap, "%s/../tools/kvp", n > 0 ? self : ".");
}

/* Runs `kvp synth --out path ARGS...` unless path exists. */
static int ensure_synth(const char *path, const char *kvp, const char *const *args)
{
    if (!access(path, R_OK))
        return 0;
    fprintf(stderr, "bench: writing a synthetic model to %s with %s\n", path, kvp);
    const char *argv[32] = {kvp, "synth", "--out", path};
    int n = 4;
    while (*args && n < 31)
        argv[n++] = *args++;
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        execv(kvp, (char *const *)argv);
        fprintf(stderr, "bench: cannot run %s: %s\n", kvp, strerror(errno));
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
        return -1;
    return 0;
}

/* ----------------------------------------------------------------------- main */

static int usage(void)
{
    fprintf(stderr, "usage: bench_engine [--model PATH] [--tokenizer PATH] [--synth PATH] "
            "[--kvp PATH] [--no-synth] [--qwen] [--decode N] [--bw-mib N] [--reps N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *model = "models/stories260K.bin", *tok = "models/tok512.bin";
    const char *synth = "/tmp/kvp-synth-110M.gguf";
    char kvp[PATH_MAX + 32];
    default_kvp(kvp, sizeof kvp);
    int use_synth = 1, use_qwen = 0;
    long decode_n = 128, bw_mib = 1024, reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-synth")) {
            use_synth = 0;
            continue;
        }
        if (!strcmp(a, "--qwen")) {
            use_qwen = 1;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--tokenizer"))
            tok = v;
        else if (!strcmp(a, "--synth"))
            synth = v;
        else if (!strcmp(a, "--kvp"))
            snprintf(kvp, sizeof kvp, "%s", v);
        else if (!strcmp(a, "--decode") ? !kvp_parse_long(v, 1, 1 << 20, &decode_n)
                 : !strcmp(a, "--bw-mib") ? !kvp_parse_long(v, 64, 1 << 20, &bw_mib)
                 : !strcmp(a, "--reps") ? !kvp_parse_long(v, 1, 1000, &reps)
                 : 1)
            return usage();
    }

    /* Memory bandwidth first, while nothing else is resident. */
    size_t n = (size_t)bw_mib << 20 >> 3;
    uint64_t *buf = malloc(n * sizeof *buf);
    if (!buf) {
        fprintf(stderr, "bench: cannot allocate %ld MiB for the bandwidth test\n", bw_mib);
        return 1;
    }
    memset(buf, 1, n * sizeof *buf); /* fault every page in before timing */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = ncpu < 1 ? 1 : ncpu > MAX_THREADS ? MAX_THREADS : (int)ncpu;
    double bw1 = bandwidth(buf, n, 1, 5);
    double bwn = threads > 1 ? bandwidth(buf, n, threads, 5) : bw1;
    double bw = bwn > bw1 ? bwn : bw1;
    free(buf);

    int blas_all = openblas_get_num_threads();
    result res[8];
    int n_res = 0;
    bench_model(&res[n_res++], "stories260K", model, tok, (int)decode_n * 2, (int)reps);
    if (use_synth) {
        static const char *const args_110m[] = {"--dim", "768", "--hidden", "2048", "--layers",
            "12", "--heads", "12", "--vocab", "32000", "--ctx", "2048", "--type", "f32", "--seed",
            "1", NULL};
        if (ensure_synth(synth, kvp, args_110m))
            fprintf(stderr, "bench: could not write %s; skipping the 110M model\n", synth);
        else
            bench_model(&res[n_res++], "synth-110M (f32)", synth, NULL, (int)decode_n,
                        (int)reps);
    }
    /* Qwen2.5-0.5B's shape in f32 and three quantized forms, in the same run */
    static const char *const qwen_types[] = {"f32", "f16", "q8_0", "q4_K_M"};
    int qwen_first = n_res;
    for (int q = 0; use_qwen && q < 4; q++) {
        char path[256], label[64];
        snprintf(path, sizeof path, "/tmp/kvp-synth-qwen05-%s.gguf", qwen_types[q]);
        snprintf(label, sizeof label, "qwen2.5-0.5B shape, %s", qwen_types[q]);
        const char *const args[] = {"--dim", "896", "--hidden", "4864", "--layers", "24",
            "--heads", "14", "--kv-heads", "2", "--vocab", "151936", "--ctx", "4096", "--tied",
            "--type", qwen_types[q], "--seed", "1", NULL};
        if (ensure_synth(path, kvp, args))
            fprintf(stderr, "bench: could not write %s; skipping it\n", path);
        else
            bench_model(&res[n_res++], label, path, NULL, (int)decode_n / 2, (int)reps);
    }

    printf("## kvpd engine benchmark\n\n");
    printf("memory read bandwidth (best of 5 passes over %ld MiB): 1 thread %.2f GB/s, "
           "%d threads %.2f GB/s\n", bw_mib, bw1 / 1e9, threads, bwn / 1e9);
    printf("OpenBLAS threads: %d for mostly-f32 models, 1 beside the matmul pool for the others "
           "(kvp_model_use_cores, as kvpd); best of %ld runs each\n\n", blas_all, reps);
    printf("matmul kernels: %s; matmul threads: %s\n\n", kvp_matmul_simd(),
           getenv("KVP_THREADS") ? getenv("KVP_THREADS") : "all CPUs");
    printf("| model | weights | weight MB/token | RSS MB | decode tok/s | decode GB/s "
           "| BW fraction | prefill tok/s (block) | prefill tok/s (block) | prefill/decode "
           "| prefill tok/s, tiles + sgemm | int8 / sgemm prefill | decode vs f32 |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int failed = 0;
    for (int i = 0; i < n_res; i++) {
        const result *r = &res[i];
        if (!r->ok) {
            printf("| %s | failed | | | | | | | | | | | |\n", r->name);
            failed = 1;
            continue;
        }
        double gbs = r->weight_bytes * r->decode_tps;
        double best_prefill = r->prefill_tps[1] > r->prefill_tps[0] ? r->prefill_tps[1]
                                                                     : r->prefill_tps[0];
        char vs[32] = "", sg[32] = "-", ratio[32] = "-";
        if (i > qwen_first && res[qwen_first].ok)
            snprintf(vs, sizeof vs, "%.2fx", r->decode_tps / res[qwen_first].decode_tps);
        if (r->prefill_sgemm_tps > 0) {
            snprintf(sg, sizeof sg, "%.0f (%d)", r->prefill_sgemm_tps, r->blocks[1]);
            snprintf(ratio, sizeof ratio, "%.2fx", r->prefill_tps[1] / r->prefill_sgemm_tps);
        }
        printf("| %s | %s | %.2f | %.0f | %.1f | %.2f | %.2f | %.0f (%d) | %.0f (%d) | %.1fx | %s | %s | %s |\n",
               r->name, r->mix, r->weight_bytes / 1e6, r->rss_mb, r->decode_tps, gbs / 1e9,
               gbs / bw, r->prefill_tps[0], r->blocks[0], r->prefill_tps[1], r->blocks[1],
               best_prefill / r->decode_tps, sg, ratio, vs);
    }
    printf("\ndecode: single-token steps from position 0 (");
    for (int i = 0; i < n_res; i++)
        printf("%s%s: %d", i ? ", " : "", res[i].name, res[i].decode_n);
    printf("); weights = resident weight bytes by type; weight MB/token = bytes of all "
           "matrices and norms one token reads, in their file types (model->weight_bytes); RSS = "
           "resident memory the model and its run added; BW fraction = weight bytes x decode tok/s / the best "
           "measured bandwidth (meaningful only when the weights do not fit in cache).\n");
    return failed;
}
