/* Snapshot store benchmark: the time to write (put) and read (get) one session snapshot
 * in the state directory and in Redis, for caches of several sizes; Redis's figures as a
 * ratio to the directory's, measured in the same run. scripts/bench.sh --store starts
 * the redis-server it needs.
 *   bench_store --url redis://127.0.0.1:PORT/0 [--dir D] [--reps N] [--sizes KiB,KiB,...] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct result {
    double put_ms, get_ms;
} result;

/* Mean put and get over reps writes of a snapshot with a cache of `bytes`. */
static int measure(kvp_store *st, size_t bytes, int reps, result *out)
{
    char *cache = malloc(bytes);
    if (!cache)
        return -ENOMEM;
    for (size_t i = 0; i < bytes; i++)
        cache[i] = (char)(i * 2654435761u >> 13);
    static int tokens[512];
    static kvp_snapshot_msg msgs[2] = {{1, "Once upon a time", 16, 0}, {0, "there was a dog", 15, 8}};
    kvp_snapshot s;
    memset(&s, 0, sizeof s);
    snprintf(s.id, sizeof s.id, "%032x", (unsigned)bytes);
    snprintf(s.ident.model_name, sizeof s.ident.model_name, "bench");
    snprintf(s.ident.policy_name, sizeof s.ident.policy_name, "streaming");
    s.msgs = msgs;
    s.n_msgs = 2;
    s.tokens = tokens;
    s.n_tokens = 512;
    s.n_cached = 512;
    s.cache = cache;
    s.cache_len = bytes;
    char err[256], jerr[64];
    double put = 0, get = 0;
    uint64_t version = 0, got;   /* each write descends from the one before */
    for (int r = 0; r < reps; r++) {
        s.turns = r + 1;
        size_t written, jb;
        int clean;
        double t0 = now_ms();
        int rc = kvp_store_put(st, &s, &version, &written, err, sizeof err);
        double t1 = now_ms();
        kvp_snapshot back;
        if (rc == 0)
            rc = kvp_store_get(st, s.id, &back, &got, &jb, &clean, jerr, sizeof jerr, err, sizeof err);
        double t2 = now_ms();
        if (rc < 0) {
            fprintf(stderr, "bench_store: %s\n", err);
            free(cache);
            return rc;
        }
        kvp_snapshot_free(&back);
        put += t1 - t0;
        get += t2 - t1;
    }
    kvp_store_remove(st, s.id, err, sizeof err);
    free(cache);
    out->put_ms = put / reps;
    out->get_ms = get / reps;
    return 0;
}

int main(int argc, char **argv)
{
    const char *url = NULL, *sizes = "64,1024,8192";
    char dir[64] = "";
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--url") && i + 1 < argc)
            url = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            snprintf(dir, sizeof dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            sizes = argv[++i];
        else {
            fprintf(stderr, "usage: bench_store --url redis://HOST:PORT/DB [--dir D] "
                            "[--reps N] [--sizes KiB,...]\n");
            return 2;
        }
    }
    if (!url || reps < 1) {
        fprintf(stderr, "bench_store: --url is required (scripts/bench.sh --store starts a "
                        "redis-server)\n");
        return 2;
    }
    int own_dir = !dir[0];
    if (own_dir && !mkdtemp(strcpy(dir, "/tmp/kvp-bench-store-XXXXXX"))) {
        perror("mkdtemp");
        return 1;
    }
    char err[256];
    kvp_store *fs, *rs;
    kvp_store_params dp = {.state_dir = dir}, rp = {.state_url = url, .node_id = "bench"};
    if (kvp_store_open(&fs, &dp, err, sizeof err) < 0 ||
        kvp_store_open(&rs, &rp, err, sizeof err) < 0) {
        fprintf(stderr, "bench_store: %s\n", err);
        return 1;
    }
    printf("snapshot write (put, fsync'd) and read (get, validated), mean of %d; directory %s, "
           "%s\n", reps, dir, url);
    printf("%10s %12s %12s %12s %12s %10s %10s\n", "cache KiB", "dir put ms", "dir get ms",
           "redis put ms", "redis get ms", "put ratio", "get ratio");
    int rc = 0;
    for (const char *p = sizes; *p && !rc;) {
        size_t kib = strtoul(p, NULL, 10);
        result d, r;
        if (!kib || (rc = measure(fs, kib << 10, reps, &d)) < 0 ||
            (rc = measure(rs, kib << 10, reps, &r)) < 0)
            break;
        printf("%10zu %12.3f %12.3f %12.3f %12.3f %9.2fx %9.2fx\n", kib, d.put_ms, d.get_ms,
               r.put_ms, r.get_ms, r.put_ms / d.put_ms, r.get_ms / d.get_ms);
        p += strcspn(p, ",");
        p += *p == ',';
    }
    kvp_store_close(fs);
    kvp_store_close(rs);
    if (own_dir)
        rmdir(dir);
    return rc < 0 ? 1 : 0;
}
