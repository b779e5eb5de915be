/* Forward pass: .bin and .gguf agree, batched prefill equals token-by-token decode,
 * F16 weights run, heads may hold different rows. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/forward.h"
#include "model/sampler.h"
#include "tests/model/testutil.h"

typedef struct {
    kvp_model m;
    kvp_runstate s;
    kvp_cache c;
} engine;

static void engine_open(engine *e, const char *model, const char *tok, int max_tokens)
{
    char err[256];
    cr_assert_eq(kvp_model_load(&e->m, model, tok, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_runstate_init(&e->s, &e->m.cfg, max_tokens), 0);
    cr_assert_eq(kvp_cache_init(&e->c, e->m.cfg.n_layers, e->m.cfg.n_kv_heads, e->m.cfg.head_dim,
                                &e->m.cfg.rope), 0);
}

static void engine_close(engine *e)
{
    kvp_cache_free(&e->c);
    kvp_runstate_free(&e->s);
    kvp_model_free(&e->m);
}

Test(forward, bin_and_gguf_logits_agree_every_step)
{
    engine a, b;
    engine_open(&a, tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), 1);
    engine_open(&b, tu_shared("models/stories260K.gguf"), NULL, 1);
    int V = a.m.cfg.vocab_size, tok = 1;
    float worst = 0.0f;
    for (int pos = 0; pos < 256; pos++) {
        cr_assert_eq(kvp_forward(&a.m, &a.s, &a.c, &tok, 1, NULL), 0);
        cr_assert_eq(kvp_forward(&b.m, &b.s, &b.c, &tok, 1, NULL), 0);
        int best = 0;
        for (int i = 0; i < V; i++) {
            float d = fabsf(a.s.logits[i] - b.s.logits[i]);
            worst = d > worst ? d : worst;
            if (a.s.logits[i] > a.s.logits[best])
                best = i;
        }
        tok = best == 1 ? 2 : best;
    }
    cr_expect_leq(worst, 1e-5f, "max abs logit difference %g", worst);
    engine_close(&a);
    engine_close(&b);
}

static float rel_diff(const float *a, const float *b, int n)
{
    float num = 0.0f, den = 0.0f;
    for (int i = 0; i < n; i++) {
        num = fmaxf(num, fabsf(a[i] - b[i]));
        den = fmaxf(den, fabsf(b[i]));
    }
    return num / fmaxf(den, 1e-12f);
}

Test(forward, batched_prefill_equals_decode)
{
    engine a, b;
    const int N = 300;
    engine_open(&a, tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), 128);
    engine_open(&b, tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), 1);
    size_t len;
    char *text = tu_slurp(tu_shared("datasets/tinystories/tinystories-dev.txt"), &len);
    int *toks = malloc(4096 * sizeof *toks);
    int n = kvp_tokenizer_encode(&a.m.tok, text, 4000, KVP_ENCODE_BOS, toks, 4096);
    cr_assert_geq(n, N);
    int V = a.m.cfg.vocab_size;
    float *batched = malloc((size_t)N * V * sizeof *batched);
    /* uneven blocks exercise blocks that start mid-cache */
    int blocks[] = {128, 1, 57, 114};
    for (int off = 0, i = 0; off < N; off += blocks[i++])
        cr_assert_eq(kvp_forward(&a.m, &a.s, &a.c, toks + off, blocks[i],
                                 batched + (size_t)off * V), 0);
    float worst = 0.0f;
    for (int t = 0; t < N; t++) {
        cr_assert_eq(kvp_forward(&b.m, &b.s, &b.c, toks + t, 1, NULL), 0);
        float r = rel_diff(batched + (size_t)t * V, b.s.logits, V);
        worst = r > worst ? r : worst;
    }
    cr_expect_leq(worst, 1e-4f, "worst relative difference %g", worst);
    cr_expect_eq(a.c.next_pos, N);
    cr_expect_eq(kvp_cache_max_rows(&a.c), N);
    free(batched);
    free(toks);
    free(text);
    engine_close(&a);
    engine_close(&b);
}

Test(forward, f16_random_model_runs_without_nan)
{
    engine e;
    engine_open(&e, tu_shared("models/llama-2-tiny-random.gguf"), NULL, 16);
    cr_assert_eq(e.m.cfg.vocab_size, 32000);
    int toks[16];
    int n = kvp_tokenizer_encode(&e.m.tok, "Hello world, this is a test.", 28, KVP_ENCODE_BOS, toks, 16);
    cr_assert_gt(n, 3);
    float *logits = malloc((size_t)n * 32000 * sizeof *logits);
    cr_assert_eq(kvp_forward(&e.m, &e.s, &e.c, toks, n, logits), 0);
    for (size_t i = 0; i < (size_t)n * 32000; i++)
        cr_assert(isfinite(logits[i]), "logit %zu = %f", i, logits[i]);
    cr_assert_eq(kvp_forward(&e.m, &e.s, &e.c, toks, 1, NULL), 0);
    for (int i = 0; i < 32000; i++)
        cr_assert(isfinite(e.s.logits[i]));
    free(logits);
    engine_close(&e);
}

/* Heads keep different rows: dropping rows from one KV head changes only what that
 * head attends to, and the pass still runs over uneven heads. */
Test(forward, heads_hold_different_rows)
{
    engine a;
    engine_open(&a, tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), 64);
    int toks[40];
    int n = kvp_tokenizer_encode(&a.m.tok, "Once upon a time there was a cat who liked milk.",
                                 48, KVP_ENCODE_BOS, toks, 40);
    cr_assert_eq(kvp_forward(&a.m, &a.s, &a.c, toks, n - 1, NULL), 0);
    void *buf;
    size_t len;
    char err[128];
    cr_assert_eq(kvp_cache_serialize(&a.c, &buf, &len), 0);
    cr_assert_eq(kvp_forward(&a.m, &a.s, &a.c, toks + n - 1, 1, NULL), 0);
    float *full = malloc(512 * sizeof *full);
    memcpy(full, a.s.logits, 512 * sizeof *full);
    kvp_cache_free(&a.c);
    cr_assert_eq(kvp_cache_deserialize(&a.c, buf, len, err, sizeof err), 0, "%s", err);
    /* keep every other row of layer 2, KV head 1 only */
    kvp_head *h = kvp_cache_head(&a.c, 2, 1);
    int keep[64], k = 0;
    for (int r = 0; r < h->n; r += 2)
        keep[k++] = r;
    kvp_cache_keep(&a.c, h, keep, k);
    cr_assert_eq(kvp_forward(&a.m, &a.s, &a.c, toks + n - 1, 1, NULL), 0);
    cr_expect_eq(kvp_cache_head(&a.c, 2, 1)->n, k + 1);
    cr_expect_eq(kvp_cache_head(&a.c, 2, 0)->n, n);
    cr_expect_gt(rel_diff(a.s.logits, full, 512), 1e-6f, "eviction had no effect");
    for (int i = 0; i < 512; i++)
        cr_assert(isfinite(a.s.logits[i]));
    free(full);
    free(buf);
    engine_close(&a);
}

Test(forward, rejects_bad_tokens_and_block_sizes)
{
    engine a;
    engine_open(&a, tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), 4);
    int bad[2] = {1, 512};
    cr_expect_lt(kvp_forward(&a.m, &a.s, &a.c, bad, 2, NULL), 0);
    bad[1] = -1;
    cr_expect_lt(kvp_forward(&a.m, &a.s, &a.c, bad, 2, NULL), 0);
    int five[5] = {1, 2, 3, 4, 5};
    cr_expect_lt(kvp_forward(&a.m, &a.s, &a.c, five, 5, NULL), 0);
    cr_expect_eq(a.c.next_pos, 0, "a rejected block must not touch the cache");
    cr_expect_eq(kvp_cache_max_rows(&a.c), 0);
    engine_close(&a);
}

/* The same random model stored as F32, F16 and Q8_0 (kvp synth, one seed): the
 * quantized files load and give logits close to the F32 ones. */
Test(forward, f16_and_q8_0_close_to_f32)
{
    const char *types[3] = {"f32", "f16", "q8_0"};
    float tol[3] = {0.0f, 1e-2f, 6e-2f};
    float *ref = NULL;
    for (int i = 0; i < 3; i++) {
        char path[64], cmd[512];
        snprintf(path, sizeof path, "/tmp/kvp-test-synth-%d-%s.gguf", (int)getpid(), types[i]);
        snprintf(cmd, sizeof cmd, "%s synth --out %s --dim 64 --hidden 160 --layers 2 --heads 4 "
                 "--kv-heads 2 --vocab 300 --type %s --seed 9 2>&1", tu_build("tools/kvp"), path, types[i]);
        cr_assert_eq(tu_run(cmd, NULL), 0, "%s", cmd);
        engine e;
        engine_open(&e, path, NULL, 8);
        int toks[8] = {1, 40, 41, 42, 43, 44, 45, 46};
        float *logits = malloc(8 * 300 * sizeof *logits);
        cr_assert_eq(kvp_forward(&e.m, &e.s, &e.c, toks, 8, logits), 0);
        if (!ref)
            ref = logits;
        else {
            float r = rel_diff(logits, ref, 8 * 300);
            cr_expect_leq(r, tol[i], "%s: relative difference %g", types[i], r);
            cr_expect_gt(r, 0.0f, "%s: identical to f32, so not quantized", types[i]);
            free(logits);
        }
        engine_close(&e);
        remove(path);
    }
    free(ref);
}

/* Attention over a head whose leading rows are a shared block (kvp_cache_fork_shared)
 * reads the two runs as one: the logits of a prefill chunk and of decode steps on a
 * shared fork are those of a copied fork, bit for bit with f16 and q8_0 rows (the value
 * sums continue the block's run row by row) and within rounding with f32 rows (two BLAS
 * calls); the source's logits after the forks are its own. */
Test(forward, shared_rows_give_the_logits_of_copied_rows)
{
    const kvp_kv_type types[] = {KVP_KV_F32, KVP_KV_F16, KVP_KV_Q8_0};
    for (int ti = 0; ti < 3; ti++) {
        engine e;
        engine_open(&e, tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), 8);
        cr_assert_eq(kvp_cache_convert(&e.c, types[ti]), 0);
        int V = e.m.cfg.vocab_size, prompt[24];
        for (int i = 0; i < 24; i++)
            prompt[i] = 1 + (i * 37) % (V - 1);
        for (int i = 0; i < 24; i += 8)
            cr_assert_eq(kvp_forward(&e.m, &e.s, &e.c, prompt + i, 8, NULL), 0);
        kvp_cache sh, cp;
        cr_assert_eq(kvp_cache_fork(&cp, &e.c, 24), 0);
        cr_assert_eq(kvp_cache_fork_shared(&sh, &e.c, 24), 0);
        cr_assert_eq(sh.heads[0].n_shared, 24);
        float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
        int chunk[5] = {3, 9, 27, 81, 243 % V};
        for (int step = 0; step < 6; step++) {
            const int *t = step ? &chunk[step - 1] : chunk;
            int n = step ? 1 : 5;   /* a chunk first (T > 1), then decode steps */
            cr_assert_eq(kvp_forward(&e.m, &e.s, &sh, t, n, NULL), 0);
            memcpy(a, e.s.logits, (size_t)V * sizeof *a);
            cr_assert_eq(kvp_forward(&e.m, &e.s, &cp, t, n, NULL), 0);
            memcpy(b, e.s.logits, (size_t)V * sizeof *b);
            if (types[ti] != KVP_KV_F32) {
                cr_expect_eq(memcmp(a, b, (size_t)V * sizeof *a), 0,
                             "type %d step %d: the logits differ", ti, step);
            } else {
                for (int i = 0; i < V; i++)
                    cr_expect(fabsf(a[i] - b[i]) <= 1e-4f * (1.0f + fabsf(b[i])),
                              "f32 step %d logit %d: %g vs %g", step, i, a[i], b[i]);
            }
        }
        /* the source goes on as if never forked */
        kvp_cache own;
        cr_assert_eq(kvp_cache_fork(&own, &e.c, 24), 0);
        int next = 5;
        cr_assert_eq(kvp_forward(&e.m, &e.s, &e.c, &next, 1, NULL), 0);
        memcpy(a, e.s.logits, (size_t)V * sizeof *a);
        cr_assert_eq(kvp_forward(&e.m, &e.s, &own, &next, 1, NULL), 0);
        for (int i = 0; i < V; i++)
            cr_expect(types[ti] == KVP_KV_F32 ? fabsf(a[i] - e.s.logits[i]) <=
                                                    1e-4f * (1.0f + fabsf(e.s.logits[i]))
                                              : a[i] == e.s.logits[i],
                      "type %d: the source's logit %d: %g vs %g", ti, i, a[i], e.s.logits[i]);
        free(a);
        free(b);
        kvp_cache_free(&own);
        kvp_cache_free(&sh);
        kvp_cache_free(&cp);
        engine_close(&e);
    }
}
