/* bench_rows: what shared rows (kvp_cache_fork_shared) save against copied ones
 * (kvp_cache_fork), the way the hub forks (turns/rewind.c: the source's whole cache,
 * then cut back to the common prefix), on a model's real rows:
 *
 *  1. `convs` conversations on one system prompt of `prefix` tokens: the first is
 *     prefilled with it, its own message (`msg` tokens) and a reply (`reply` tokens,
 *     greedy); each other one forks it, is cut back to the system prompt, then prefills
 *     its own message and decodes its reply (all of them in batched steps). Prints their
 *     cache bytes (each shared block once, as the hub counts them) against one
 *     conversation's plus their private rows (the rows of their messages and replies).
 *  2. A request's n choices: a prompt of `prompt` tokens and a reply, then n - 1 forks
 *     cut back to the prompt's last token (as sessions/hub_choices.c does) that run it
 *     again and decode their own replies. Prints the bytes of n choices against one.
 *  3. Decode speed: `speed` forks of the first conversation of 1 decode `reply` tokens in
 *     batched steps on shared rows and on copied ones (the copy is the code path of a
 *     cache that never shared), alternating, `reps` times each; prints the median tok/s
 *     of both and their ratio.
 *
 * Both rows types' bytes are what kvp_cache_bytes counts (the allocation, which grows by
 * doubling) and, in brackets, the rows held (rows x kvp_cache_row_cost). Token ids are
 * drawn from the vocabulary with a fixed seed: the model need not be trained.
 *
 * Usage: bench_rows --model PATH [--kv-type q8_0] [--convs 64] [--prefix 2000] [--msg 16]
 *                   [--reply 32] [--prompt 512] [--choices 4] [--speed 8] [--reps 3] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/parse.h"
#include "base/rng.h"
#include "cache/kvcache.h"
#include "generate/generate.h"
#include "model/forward.h"
#include "model/model.h"
#include "policy/policy.h"

#define MAX_SEQS 256

static kvp_model M;
static kvp_runstate S;
static kvp_evict_cfg E;   /* streaming, budget 0: no eviction, as with --budget 0 */
static kvp_kv_type KV = KVP_KV_Q8_0;

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_rows: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
    exit(1);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static void tokens(int *t, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++)
        t[i] = (int)(kvp_splitmix64(rng) % (uint64_t)M.cfg.vocab_size);
}

static void new_cache(kvp_cache *c)
{
    int rc = kvp_cache_init(c, M.cfg.n_layers, M.cfg.n_kv_heads, M.cfg.head_dim, &M.cfg.rope);
    if (rc || (rc = kvp_cache_convert(c, KV)))
        die("cache", rc);
}

/* One batched step over caches cs[0..n), each fed its own block of len tokens; the next
 * token of each (greedy) goes to next[i]. */
static void step(kvp_cache **cs, int n, const int *const *blocks, int len, int *next)
{
    kvp_batch_seq seqs[MAX_SEQS];
    const kvp_evict_cfg *ev[MAX_SEQS] = {0};
    for (int i = 0; i < n; i++) {
        seqs[i] = (kvp_batch_seq){.cache = cs[i], .tokens = blocks[i], .n = len};
        ev[i] = &E;
    }
    int rc = kvp_gen_step(&M, &S, seqs, ev, n);
    if (rc)
        die("step", rc);
    for (int i = 0; i < n; i++) {
        if (seqs[i].rc)
            die("step (a sequence)", seqs[i].rc);
        next[i] = argmax(seqs[i].logits, M.cfg.vocab_size);
    }
}

/* Prefills each cache with its own len tokens (in blocks the runstate holds), then
 * decodes `reply` tokens greedily; returns the decode's seconds. */
static double run(kvp_cache **cs, int n, int *const *msg, int len, int reply)
{
    int next[MAX_SEQS], cur[MAX_SEQS];
    const int *blk[MAX_SEQS];
    int per = S.max_tokens / n;
    for (int off = 0; off < len;) {
        int k = len - off < per ? len - off : per;
        for (int i = 0; i < n; i++)
            blk[i] = msg[i] + off;
        step(cs, n, blk, k, next);
        off += k;
    }
    double t0 = kvp_now();
    for (int t = 0; t < reply; t++) {
        for (int i = 0; i < n; i++) {
            cur[i] = next[i];
            blk[i] = &cur[i];
        }
        step(cs, n, blk, 1, next);
    }
    return kvp_now() - t0;
}

/* Rows held by the caches, each shared block's once (the private rows of every head,
 * plus the blocks charged to one of them). */
static size_t held_bytes(kvp_cache **cs, int n)
{
    size_t b = 0, cost = kvp_cache_row_cost(KV, M.cfg.head_dim);
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < cs[i]->n_layers * cs[i]->n_kv_heads; h++)
            b += (size_t)(cs[i]->heads[h].n - cs[i]->heads[h].n_shared) * cost;
        b += kvp_cache_shared_bytes(cs[i]);
    }
    return b;
}

static size_t total_bytes(kvp_cache **cs, int n)
{
    size_t b = 0;
    for (int i = 0; i < n; i++)
        b += kvp_cache_bytes(cs[i]);
    return b;
}

/* dst: a fork of src (shared or copied) cut back to token `to`, as the hub forks. */
static void fork_at(kvp_cache *dst, kvp_cache *src, int64_t to, int shared)
{
    int rc = shared ? kvp_cache_fork_shared(dst, src, src->n_seen)
                    : kvp_cache_fork(dst, src, src->n_seen);
    if (rc)
        die("fork", rc);
    kvp_cache_drop_newest(dst, (int)(src->n_seen - to));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *kv = "q8_0";
    long convs = 64, prefix = 2000, msg = 16, reply = 32, prompt = 512, choices = 4,
         speed = 8, reps = 3;
    for (int i = 1; i < argc; i++) {
        int ok = i + 1 < argc;
        const char *a = argv[i];
        if (ok && !strcmp(a, "--model"))
            model = argv[++i];
        else if (ok && !strcmp(a, "--kv-type"))
            kv = argv[++i];
        else if (ok && !strcmp(a, "--convs"))
            ok = kvp_parse_long(argv[++i], 2, MAX_SEQS, &convs);
        else if (ok && !strcmp(a, "--prefix"))
            ok = kvp_parse_long(argv[++i], 1, 1 << 20, &prefix);
        else if (ok && !strcmp(a, "--msg"))
            ok = kvp_parse_long(argv[++i], 1, 4096, &msg);
        else if (ok && !strcmp(a, "--reply"))
            ok = kvp_parse_long(argv[++i], 1, 4096, &reply);
        else if (ok && !strcmp(a, "--prompt"))
            ok = kvp_parse_long(argv[++i], 2, 1 << 20, &prompt);
        else if (ok && !strcmp(a, "--choices"))
            ok = kvp_parse_long(argv[++i], 2, MAX_SEQS, &choices);
        else if (ok && !strcmp(a, "--speed"))
            ok = kvp_parse_long(argv[++i], 1, MAX_SEQS, &speed);
        else if (ok && !strcmp(a, "--reps"))
            ok = kvp_parse_long(argv[++i], 1, 100, &reps);
        else
            ok = 0;
        if (!ok) {
            fprintf(stderr, "usage: bench_rows --model PATH [--kv-type f32|f16|q8_0] [--convs N] "
                            "[--prefix N] [--msg N] [--reply N] [--prompt N] [--choices N] "
                            "[--speed N] [--reps N]\n");
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "bench_rows: --model is required\n");
        return 2;
    }
    if (!strcmp(kv, "f32"))
        KV = KVP_KV_F32;
    else if (!strcmp(kv, "f16"))
        KV = KVP_KV_F16;
    else if (strcmp(kv, "q8_0")) {
        fprintf(stderr, "bench_rows: --kv-type: f32, f16 or q8_0, not %s\n", kv);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);   /* each result as it comes: the runs are long */
    char err[256];
    int rc = kvp_model_load(&M, model, NULL, err, sizeof err);
    if (rc) {
        fprintf(stderr, "bench_rows: %s\n", err);
        return 1;
    }
    if (prefix + msg + reply > M.cfg.seq_len || prompt + reply > M.cfg.seq_len) {
        fprintf(stderr, "bench_rows: %ld + %ld + %ld tokens do not fit the context (%d)\n",
                prefix, msg, reply, M.cfg.seq_len);
        return 2;
    }
    kvp_model_use_cores(&M);
    if ((rc = kvp_runstate_init(&S, &M.cfg, 1024)))
        die("runstate", rc);
    kvp_policy *pol;
    if ((rc = kvp_policy_create(&pol, "streaming", NULL, &M.cfg, 1, err, sizeof err))) {
        fprintf(stderr, "bench_rows: %s\n", err);
        return 1;
    }
    E = (kvp_evict_cfg){.policy = pol, .budget = 0, .chunk = 256};
    size_t cost = kvp_cache_row_cost(KV, M.cfg.head_dim);
    size_t heads = (size_t)M.cfg.n_layers * M.cfg.n_kv_heads;
    uint64_t rng = 7;
    printf("model %s: %d layers x %d KV heads, head_dim %d, %s rows of %zu bytes (K, V, "
           "position, token, score, accumulator)\n", model, M.cfg.n_layers, M.cfg.n_kv_heads,
           M.cfg.head_dim, kv, cost);

    /* ---- 1. conversations on one system prompt ---- */
    int n = (int)convs;
    kvp_cache *cs = calloc((size_t)n, sizeof *cs);
    kvp_cache *cp[MAX_SEQS];
    int **msgs = calloc((size_t)n, sizeof *msgs);
    int *sys = malloc((size_t)(prefix + msg) * sizeof *sys);
    if (!cs || !msgs || !sys)
        die("memory", ENOMEM);
    for (int i = 0; i < n; i++) {
        cp[i] = &cs[i];
        if (!(msgs[i] = malloc((size_t)msg * sizeof **msgs)))
            die("memory", ENOMEM);
        tokens(msgs[i], (int)msg, &rng);
    }
    tokens(sys, (int)prefix, &rng);
    memcpy(sys + prefix, msgs[0], (size_t)msg * sizeof *sys);
    new_cache(&cs[0]);
    (void)run(cp, 1, &sys, (int)(prefix + msg), (int)reply);
    size_t one = kvp_cache_bytes(&cs[0]), one_held = held_bytes(cp, 1);
    for (int i = 1; i < n; i++)
        fork_at(&cs[i], &cs[0], prefix, 1);
    (void)run(cp + 1, n - 1, msgs + 1, (int)msg, (int)reply);
    size_t all = total_bytes(cp, n), all_held = held_bytes(cp, n);
    size_t priv = (size_t)(n - 1) * (size_t)(msg + reply) * heads * cost;
    printf("\n%d conversations on one %ld-token system prompt (+%ld-token messages, %ld-token "
           "replies):\n", n, prefix, msg, reply);
    printf("  one conversation alone: %zu bytes [%zu held]\n", one, one_held);
    printf("  their private rows (the other %d's messages and replies): %zu bytes\n", n - 1, priv);
    printf("  all %d, shared rows: %zu bytes [%zu held]\n", n, all, all_held);
    printf("  ratio to one conversation's plus their private rows: %.3f [%.3f held] "
           "(target <= 1.5)\n", (double)all / (double)(one + priv),
           (double)all_held / (double)(one_held + priv));
    printf("  copied rows would hold (one conversation's rows per fork): %.1fx\n",
           (double)(one_held * (size_t)n) / (double)(one_held + priv));

    /* ---- 3. decode speed on shared rows against copied ones ---- */
    int ns = (int)speed;
    kvp_cache sp[MAX_SEQS];
    kvp_cache *spp[MAX_SEQS];
    double *t[2];
    t[0] = malloc((size_t)reps * sizeof **t);
    t[1] = malloc((size_t)reps * sizeof **t);
    for (int r = 0; r < reps; r++)
        for (int shared = 1; shared >= 0; shared--) {
            for (int i = 0; i < ns; i++) {
                fork_at(&sp[i], &cs[0], prefix, shared);
                spp[i] = &sp[i];
            }
            t[shared][r] = run(spp, ns, msgs + 1, (int)msg, (int)reply);
            for (int i = 0; i < ns; i++)
                kvp_cache_free(&sp[i]);
        }
    qsort(t[0], (size_t)reps, sizeof **t, cmp_double);
    qsort(t[1], (size_t)reps, sizeof **t, cmp_double);
    double tok = (double)ns * (double)reply;
    double sh = tok / t[1][reps / 2], co = tok / t[0][reps / 2];
    printf("\ndecode, %d forks of the %ld-token prompt in batched steps, median of %ld "
           "alternating runs:\n  shared rows %.1f tok/s, copied rows %.1f tok/s: shared / "
           "copied %.3f\n", ns, prefix, reps, sh, co, sh / co);
    for (int i = 0; i < n; i++) {
        kvp_cache_free(&cs[i]);
        free(msgs[i]);
    }

    /* ---- 2. a request's n choices ---- */
    int nc = (int)choices;
    int *pr = malloc((size_t)prompt * sizeof *pr);
    if (!pr)
        die("memory", ENOMEM);
    tokens(pr, (int)prompt, &rng);
    size_t bytes[2] = {0, 0}, held[2] = {0, 0}, first = 0, first_held = 0;
    for (int shared = 1; shared >= 0; shared--) {
        kvp_cache ch[MAX_SEQS];
        kvp_cache *chp[MAX_SEQS];
        int *last[MAX_SEQS];
        for (int i = 0; i < nc; i++)
            chp[i] = &ch[i];
        new_cache(&ch[0]);
        (void)run(chp, 1, &pr, (int)prompt, (int)reply);
        first = kvp_cache_bytes(&ch[0]);
        first_held = held_bytes(chp, 1);
        for (int i = 1; i < nc; i++) {
            fork_at(&ch[i], &ch[0], prompt - 1, shared);
            last[i] = pr + prompt - 1;
        }
        (void)run(chp + 1, nc - 1, last + 1, 1, (int)reply);
        bytes[shared] = total_bytes(chp, nc);
        held[shared] = held_bytes(chp, nc);
        for (int i = 0; i < nc; i++)
            kvp_cache_free(&ch[i]);
    }
    printf("\nn: %d choices of a %ld-token prompt, %ld-token replies:\n", nc, prompt, reply);
    printf("  n: 1: %zu bytes [%zu held]\n", first, first_held);
    printf("  n: %d, shared rows: %zu bytes [%zu held]: %.3f [%.3f held] x n: 1 (target <= 1.3)\n",
           nc, bytes[1], held[1], (double)bytes[1] / (double)first,
           (double)held[1] / (double)first_held);
    printf("  n: %d, copied rows: %zu bytes [%zu held]: %.3f [%.3f held] x n: 1\n", nc, bytes[0],
           held[0], (double)bytes[0] / (double)first, (double)held[0] / (double)first_held);
    free(pr);
    free(sys);
    free(msgs);
    free(cs);
    free(t[0]);
    free(t[1]);
    kvp_policy_destroy(pol);
    kvp_runstate_free(&S);
    kvp_model_free(&M);
    return 0;
}
