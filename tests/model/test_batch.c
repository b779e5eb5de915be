/* The batched step (kvp_forward_batch): each sequence's logits in a batch equal its
 * logits when it runs alone, with sequences at different lengths joining at different
 * steps and prefill chunks mixed with decodes; per-sequence failures and hooks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/forward.h"
#include "tests/model/testutil.h"

#define N_SEQ 5
#define MAX_STEPS 64

/* A sequence's script: it joins at step `join`, prefills `prompt` tokens in chunks of
 * `chunk`, then decodes greedily until it has run `total` tokens. */
typedef struct {
    int join, prompt, chunk, total;
} script;

static const script scripts[N_SEQ] = {
    {0, 1, 1, 20},     /* decodes from the first step */
    {0, 23, 8, 40},    /* a prompt in chunks of 8 */
    {3, 5, 5, 18},     /* joins late, one chunk */
    {6, 17, 4, 30},    /* joins later, small chunks beside decodes */
    {9, 2, 1, 12},     /* leaves first */
};

/* Logits relative to the reference: the largest difference over the largest magnitude. */
static float rel_diff(const float *a, const float *ref, int n)
{
    float d = 0.0f, mag = 0.0f;
    for (int i = 0; i < n; i++) {
        d = fmaxf(d, fabsf(a[i] - ref[i]));
        mag = fmaxf(mag, fabsf(ref[i]));
    }
    return d / mag;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* The block a sequence runs at its k-th step: a prompt chunk, or the last token. */
static int block_of(const script *sc, const int *toks, int done, const int **block)
{
    if (done < sc->prompt) {
        int n = sc->prompt - done < sc->chunk ? sc->prompt - done : sc->chunk;
        *block = toks + done;
        return n;
    }
    *block = toks + done;
    return 1;
}

typedef struct {
    int toks[128];       /* prompt, then the greedy tokens */
    int done;            /* tokens run */
    float *logits;       /* [MAX_STEPS][vocab] after each of its steps */
    int steps;
} seq_run;

static kvp_cache new_cache(const kvp_model *m)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim,
                                &m->cfg.rope), 0);
    return c;
}

static void prompt_of(seq_run *r, int i, const script *sc, int vocab)
{
    memset(r, 0, sizeof *r);
    r->toks[0] = 1;
    for (int t = 1; t < sc->prompt; t++)
        r->toks[t] = 3 + (int)((i * 131u + t * 71u) % (unsigned)(vocab - 3));
}

/* Each sequence alone, block by block with kvp_forward. */
static void run_alone(const kvp_model *m, seq_run *runs)
{
    int V = m->cfg.vocab_size;
    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, &m->cfg, 64), 0);
    for (int i = 0; i < N_SEQ; i++) {
        const script *sc = &scripts[i];
        seq_run *r = &runs[i];
        prompt_of(r, i, sc, V);
        r->logits = malloc((size_t)MAX_STEPS * V * sizeof(float));
        kvp_cache c = new_cache(m);
        while (r->done < sc->total) {
            const int *block;
            int n = block_of(sc, r->toks, r->done, &block);
            cr_assert_eq(kvp_forward(m, &s, &c, block, n, NULL), 0);
            r->done += n;
            memcpy(r->logits + (size_t)r->steps++ * V, s.logits, V * sizeof(float));
            if (r->done >= sc->prompt)
                r->toks[r->done] = argmax(s.logits, V);
        }
        kvp_cache_free(&c);
    }
    kvp_runstate_free(&s);
}

/* All of them in one batch per step; each step's logits against the run alone. */
static void run_batched(const kvp_model *m, const seq_run *alone, const char *what)
{
    int V = m->cfg.vocab_size;
    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, &m->cfg, 64), 0);
    seq_run runs[N_SEQ];
    kvp_cache caches[N_SEQ];
    float *logits = malloc((size_t)N_SEQ * V * sizeof(float));
    for (int i = 0; i < N_SEQ; i++) {
        prompt_of(&runs[i], i, &scripts[i], V);
        caches[i] = new_cache(m);
    }
    float worst = 0.0f;
    int max_batch = 0, mixed = 0;
    for (int step = 0;; step++) {
        kvp_batch_seq b[N_SEQ];
        int who[N_SEQ], nb = 0, prefill = 0, decode = 0;
        for (int i = 0; i < N_SEQ; i++) {
            const script *sc = &scripts[i];
            seq_run *r = &runs[i];
            if (step < sc->join || r->done >= sc->total)
                continue;
            const int *block;
            int n = block_of(sc, r->toks, r->done, &block);
            b[nb] = (kvp_batch_seq){.cache = &caches[i], .tokens = block, .n = n,
                                    .logits = logits + (size_t)nb * V};
            prefill += n > 1;
            decode += n == 1;
            who[nb++] = i;
        }
        if (nb == 0)
            break;
        max_batch = nb > max_batch ? nb : max_batch;
        mixed |= prefill && decode;
        cr_assert_eq(kvp_forward_batch(m, &s, b, nb), 0);
        for (int j = 0; j < nb; j++) {
            int i = who[j];
            seq_run *r = &runs[i];
            cr_assert_eq(b[j].rc, 0);
            r->done += b[j].n;
            const float *ref = alone[i].logits + (size_t)r->steps++ * V;
            float d = rel_diff(b[j].logits, ref, V);
            worst = fmaxf(worst, d);
            cr_expect_leq(d, 1e-4f, "%s: sequence %d, step %d: relative difference %g", what, i,
                          r->steps - 1, d);
            if (r->done >= scripts[i].prompt) {
                r->toks[r->done] = argmax(b[j].logits, V);
                cr_assert_eq(r->toks[r->done], alone[i].toks[r->done],
                             "%s: sequence %d, token %d differs from its run alone", what, i,
                             r->done);
            }
        }
    }
    for (int i = 0; i < N_SEQ; i++) {
        cr_assert_eq(runs[i].steps, alone[i].steps);
        cr_assert_eq(caches[i].next_pos, scripts[i].total);
        kvp_cache_free(&caches[i]);
    }
    cr_assert_geq(max_batch, 4, "the scripts overlap");
    cr_assert(mixed, "some step mixes prefill chunks with decodes");
    cr_log_info("%s: worst relative difference %g", what, worst);
    free(logits);
    kvp_runstate_free(&s);
}

static void check_model(const char *path, const char *tok, const char *what)
{
    kvp_model m;
    char err[256];
    cr_assert_eq(kvp_model_load(&m, path, tok, err, sizeof err), 0, "%s", err);
    seq_run alone[N_SEQ];
    run_alone(&m, alone);
    run_batched(&m, alone, what);
    for (int i = 0; i < N_SEQ; i++)
        free(alone[i].logits);
    kvp_model_free(&m);
}

Test(batch, stories260K_batch_equals_alone)
{
    check_model(tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), "stories260K");
}

/* A GQA synthetic (8 query heads over 2 KV heads, untied output) with a qwen3 shape
 * (q/k norms) so every per-row step of the pass runs over a batch. */
static const char *synth(const char *extra, const char *tag)
{
    static char path[128];
    char cmd[768];
    snprintf(path, sizeof path, "/tmp/kvp-test-batch-%d-%s.gguf", (int)getpid(), tag);
    snprintf(cmd, sizeof cmd, "%s synth --out %s --dim 64 --hidden 160 --layers 2 --heads 8 "
             "--kv-heads 2 --vocab 300 --ctx 256 --seed 5 %s 2>&1", tu_build("tools/kvp"), path,
             extra);
    cr_assert_eq(tu_run(cmd, NULL), 0, "%s", cmd);
    return path;
}

Test(batch, gqa_synthetic_batch_equals_alone)
{
    const char *path = synth("", "gqa");
    check_model(path, NULL, "gqa synthetic");
    remove(path);
}

Test(batch, qwen3_synthetic_batch_equals_alone)
{
    const char *path = synth("--arch qwen3", "qwen3");
    check_model(path, NULL, "qwen3 synthetic");
    remove(path);
}

/* Per-sequence hooks: each sequence's score hook sees only its own cache's rows. */
typedef struct {
    kvp_cache *cache;
    int rows;
    int wrong;
} hook_seen;

static void count_score(void *ctx, int layer, int kvh, kvp_head *h, int first, int n)
{
    hook_seen *hs = ctx;
    if (kvp_cache_head(hs->cache, layer, kvh) != h || first + n != h->n)
        hs->wrong++;
    hs->rows += n;
}

/* A sequence with a bad token is left out with its own error and an unchanged cache;
 * the others run and match their runs alone. A malformed batch runs nothing. */
Test(batch, bad_sequence_is_left_out_and_bad_batches_refused)
{
    kvp_model m;
    char err[256];
    cr_assert_eq(kvp_model_load(&m, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    int V = m.cfg.vocab_size;
    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, &m.cfg, 8), 0);
    kvp_cache a = new_cache(&m), bad = new_cache(&m), ref = new_cache(&m);
    int good[3] = {1, 50, 60}, evil[2] = {1, V};
    float la[512], lb[512];
    hook_seen ha = {&a, 0, 0}, hb = {&bad, 0, 0};
    kvp_batch_seq b[2] = {
        {.cache = &bad, .tokens = evil, .n = 2, .logits = lb,
         .hooks = {.score = count_score, .ctx = &hb}},
        {.cache = &a, .tokens = good, .n = 3, .logits = la,
         .hooks = {.score = count_score, .ctx = &ha}},
    };
    cr_assert_eq(kvp_forward_batch(&m, &s, b, 2), 0);
    cr_assert_eq(b[0].rc, -EINVAL);
    cr_assert_eq(b[1].rc, 0);
    cr_assert_eq(bad.next_pos, 0);
    cr_assert_eq(kvp_cache_rows(&bad), 0);
    cr_assert_eq(hb.rows, 0);
    cr_assert_eq(ha.wrong, 0);
    cr_assert_eq(ha.rows, 3 * m.cfg.n_layers * m.cfg.n_kv_heads);
    cr_assert_eq(kvp_forward(&m, &s, &ref, good, 3, NULL), 0);
    cr_assert_leq(rel_diff(la, s.logits, V), 1e-4f);

    /* the same cache twice, more rows than the runstate holds, an empty batch */
    kvp_batch_seq twice[2] = {{.cache = &a, .tokens = good, .n = 1, .logits = la},
                              {.cache = &a, .tokens = good, .n = 1, .logits = lb}};
    cr_assert_eq(kvp_forward_batch(&m, &s, twice, 2), -EINVAL);
    int many[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvp_batch_seq big[2] = {{.cache = &a, .tokens = many, .n = 5, .logits = la},
                            {.cache = &bad, .tokens = many, .n = 4, .logits = lb}};
    cr_assert_eq(kvp_forward_batch(&m, &s, big, 2), -EINVAL);
    cr_assert_eq(kvp_forward_batch(&m, &s, big, 0), -EINVAL);
    cr_assert_eq(a.next_pos, 3);
    cr_assert_eq(bad.next_pos, 0);
    kvp_cache_free(&a);
    kvp_cache_free(&bad);
    kvp_cache_free(&ref);
    kvp_runstate_free(&s);
    kvp_model_free(&m);
}

/* The attention items (sequence, KV head) of a layer run on every thread of the pass:
 * the result is bit for bit the serial path's. Each sequence's score hook draws from its
 * own random stream (so the order of its calls matters) and its attention hook sums the
 * probabilities into the rows' stat (as H2O does), noting the threads it ran on. */
#define SPLIT_SEQ 8
#define SPLIT_DECODES 12

typedef struct {
    uint64_t rng;
    pthread_mutex_t *mu;
    pthread_t *threads;
    int *n_threads;
} split_hooks;

static void split_score(void *ctx, int layer, int kvh, kvp_head *h, int first, int n)
{
    split_hooks *sh = ctx;
    (void)layer, (void)kvh;
    for (int r = first; r < first + n; r++) {
        sh->rng = sh->rng * 6364136223846793005ull + 1442695040888963407ull;
        h->score[r] = (float)(sh->rng >> 40) / (float)(1 << 24);
    }
}

static void split_attention(void *ctx, int layer, int kvh, kvp_head *h, const float *q,
                            int q_stride, const float *att, int att_stride, int n_q)
{
    split_hooks *sh = ctx;
    (void)layer, (void)kvh, (void)q, (void)q_stride;
    /* long enough that the other threads wake and take items too (and that another
     * item's probabilities would overwrite these if threads shared a buffer) */
    nanosleep(&(struct timespec){0, 100 * 1000}, NULL);
    for (int t = 0; t < n_q; t++)
        for (int j = 0; j < h->n; j++)
            h->stat[j] += att[(size_t)t * att_stride + j];
    pthread_mutex_lock(sh->mu);
    int seen = 0;
    for (int i = 0; i < *sh->n_threads; i++)
        seen |= pthread_equal(sh->threads[i], pthread_self());
    if (!seen && *sh->n_threads < KVP_MATMUL_MAX_THREADS)
        sh->threads[(*sh->n_threads)++] = pthread_self();
    pthread_mutex_unlock(sh->mu);
}

typedef struct {
    float *logits;     /* every step's logits of every sequence */
    size_t n_logits;
    kvp_cache caches[SPLIT_SEQ];
    int n_threads;
} split_run;

/* Prompts of different lengths in chunks of 32, then greedy decodes, all batched. */
static void run_split(const kvp_model *m, int threads, split_run *out)
{
    int V = m->cfg.vocab_size;
    kvp_matmul_force_threads(threads);
    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, &m->cfg, SPLIT_SEQ * 32), 0);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_t seen[KVP_MATMUL_MAX_THREADS];
    split_hooks hooks[SPLIT_SEQ];
    int toks[SPLIT_SEQ][256], done[SPLIT_SEQ] = {0}, prompt[SPLIT_SEQ];
    size_t cap = (size_t)SPLIT_SEQ * (8 + SPLIT_DECODES) * V;
    memset(out, 0, sizeof *out);
    out->logits = malloc(cap * sizeof(float));
    for (int i = 0; i < SPLIT_SEQ; i++) {
        out->caches[i] = new_cache(m);
        hooks[i] = (split_hooks){1000u + (uint64_t)i, &mu, seen, &out->n_threads};
        prompt[i] = 60 + 17 * i;
        toks[i][0] = 1;
        for (int t = 1; t < prompt[i]; t++)
            toks[i][t] = 3 + (int)((i * 131u + t * 71u) % (unsigned)(V - 3));
    }
    for (int step = 0;; step++) {
        kvp_batch_seq b[SPLIT_SEQ];
        int nb = 0;
        for (int i = 0; i < SPLIT_SEQ; i++) {
            if (done[i] >= prompt[i] + SPLIT_DECODES)
                continue;
            int n = done[i] < prompt[i] ? (prompt[i] - done[i] < 32 ? prompt[i] - done[i] : 32) : 1;
            b[nb++] = (kvp_batch_seq){.cache = &out->caches[i], .tokens = toks[i] + done[i],
                                      .n = n, .hooks = {.score = split_score,
                                      .attention = split_attention, .ctx = &hooks[i]}};
        }
        if (!nb)
            break;
        cr_assert_eq(kvp_forward_batch(m, &s, b, nb), 0);
        for (int j = 0; j < nb; j++) {
            cr_assert_eq(b[j].rc, 0);
            int i = (int)(b[j].cache - out->caches);
            cr_assert_leq(out->n_logits + V, cap);
            memcpy(out->logits + out->n_logits, b[j].logits, V * sizeof(float));
            out->n_logits += V;
            done[i] += b[j].n;
            if (done[i] >= prompt[i])
                toks[i][done[i]] = argmax(b[j].logits, V);
        }
    }
    kvp_runstate_free(&s);
    kvp_matmul_force_threads(0);
}

static void expect_same_head(const kvp_head *a, const kvp_head *b, int hd, int i, int l, int kvh)
{
    cr_assert_eq(a->n, b->n);
    size_t n = (size_t)a->n;
    cr_expect(!memcmp(a->k, b->k, n * hd * sizeof(float)) &&
              !memcmp(a->v, b->v, n * hd * sizeof(float)) &&
              !memcmp(a->score, b->score, n * sizeof(float)) &&
              !memcmp(a->stat, b->stat, n * sizeof(float)) &&
              !memcmp(a->pos, b->pos, n * sizeof *a->pos),
              "sequence %d, layer %d, head %d differs from the serial run", i, l, kvh);
}

Test(batch, attention_split_across_threads_equals_serial)
{
    char path[128], cmd[768], err[256];
    snprintf(path, sizeof path, "/tmp/kvp-test-batch-%d-split.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s synth --out %s --dim 128 --hidden 256 --layers 2 --heads 8 "
             "--kv-heads 4 --vocab 300 --ctx 512 --seed 7 2>&1", tu_build("tools/kvp"), path);
    cr_assert_eq(tu_run(cmd, NULL), 0, "%s", cmd);
    kvp_model m;
    cr_assert_eq(kvp_model_load(&m, path, NULL, err, sizeof err), 0, "%s", err);
    remove(path);
    if (kvp_matmul_threads() < 2)
        cr_skip_test("one thread: nothing to split");
    split_run serial, split;
    run_split(&m, 1, &serial);
    run_split(&m, 0, &split);
    cr_assert_eq(serial.n_threads, 1, "the serial run stays on one thread");
    cr_assert_geq(split.n_threads, 2, "the items ran on more than one thread");
    cr_assert_eq(split.n_logits, serial.n_logits);
    cr_assert(!memcmp(split.logits, serial.logits, serial.n_logits * sizeof(float)),
              "the logits are bit for bit the serial run's");
    for (int i = 0; i < SPLIT_SEQ; i++) {
        for (int l = 0; l < m.cfg.n_layers; l++)
            for (int kvh = 0; kvh < m.cfg.n_kv_heads; kvh++)
                expect_same_head(kvp_cache_head(&serial.caches[i], l, kvh),
                                 kvp_cache_head(&split.caches[i], l, kvh), m.cfg.head_dim, i, l,
                                 kvh);
        kvp_cache_free(&serial.caches[i]);
        kvp_cache_free(&split.caches[i]);
    }
    free(serial.logits);
    free(split.logits);
    kvp_model_free(&m);
}

/* kvp_batch_seq.hidden: the block's last row after the final norm, which
 * kvp_forward_logits turns back into the block's logits; in a batch where one sequence
 * asks for every row's logits and one for its last only, each row is its own. */
Test(batch, hidden_rows_give_back_the_logits)
{
    kvp_model m;
    char err[256];
    cr_assert_eq(kvp_model_load(&m, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    int V = m.cfg.vocab_size, D = m.cfg.dim;
    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, &m.cfg, 8), 0);
    kvp_cache a = new_cache(&m), b = new_cache(&m);
    int ta[3] = {1, 50, 60}, tb[2] = {1, 70};
    float la[512], all[2 * 512], ha[512], hb[512], back[2 * 512];
    kvp_batch_seq q[2] = {
        {.cache = &a, .tokens = ta, .n = 3, .logits = la, .hidden = ha},
        {.cache = &b, .tokens = tb, .n = 2, .all_logits = all, .hidden = hb},
    };
    cr_assert_eq(kvp_forward_batch(&m, &s, q, 2), 0);
    cr_assert(D <= 512 && V <= 512);
    kvp_forward_logits(&m, ha, 1, back);
    kvp_forward_logits(&m, hb, 1, back + V);
    cr_assert_leq(rel_diff(back, la, V), 1e-5f);
    cr_assert_leq(rel_diff(back + V, all + V, V), 1e-5f);
    cr_assert_gt(rel_diff(back, back + V, V), 1e-2f, "the two rows are the same");
    kvp_cache_free(&a);
    kvp_cache_free(&b);
    kvp_runstate_free(&s);
    kvp_model_free(&m);
}
