/* Generation under a budget: the eviction triggers, the context shift, and the promise
 * that a budget above the sequence length changes nothing. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offline/oracle.h"
#include "generate/generate.h"
#include "model/sampler.h"
#include "policy/kvp_agent.h"
#include "offline/agent_train.h"
#include "tests/model/testutil.h"

static kvp_model model;
static char policy_path[256];

static void setup(void)
{
    char err[256];
    cr_assert_eq(kvp_model_load(&model, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    /* a randomly initialised KVP file: the engine must not care whether it is trained */
    kvp_agent_set set;
    kvp_agent_arch arch = {model.cfg.head_dim, 16, 8, 16, 512, 1, 1};
    cr_assert_eq(kvp_agent_set_alloc(&set, model.cfg.n_layers, model.cfg.n_kv_heads, &arch,
                                     err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_rope(&set, &model.cfg.rope, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&set, 7);
    snprintf(policy_path, sizeof policy_path, "/tmp/kvp-test-gen-%d.kvp", (int)getpid());
    cr_assert_eq(kvp_agent_set_save(&set, policy_path, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&set);
}

static void teardown(void)
{
    remove(policy_path);
    kvp_model_free(&model);
}

TestSuite(generate, .init = setup, .fini = teardown);

static const char *policies[] = {"none", "random", "streaming", "knorm", "keydiff", "lagkv",
                                 "h2o", "tova", "snapkv", "expected_attention", "kvp",
                                 "oracle"};
#define N_POLICIES (sizeof policies / sizeof policies[0])

typedef struct {
    kvp_policy *policy;
    kvp_runstate s;
    kvp_cache c;
    kvp_evict_cfg e;
} run;

static void run_open(run *r, const char *policy, int budget, int chunk)
{
    char err[256];
    cr_assert_eq(kvp_offline_policy_create(&r->policy, policy, policy_path, &model.cfg, 1, err, sizeof err),
                 0, "%s: %s", policy, err);
    cr_assert_eq(kvp_runstate_init(&r->s, &model.cfg, 64), 0);
    cr_assert_eq(kvp_cache_init(&r->c, model.cfg.n_layers, model.cfg.n_kv_heads,
                                model.cfg.head_dim, &model.cfg.rope), 0);
    r->e = (kvp_evict_cfg){.policy = r->policy, .budget = budget, .chunk = chunk};
}

static void run_close(run *r)
{
    kvp_cache_free(&r->c);
    kvp_runstate_free(&r->s);
    kvp_policy_destroy(r->policy);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Greedy: prompt through kvp_gen_prefill, then n decode steps; tokens into out. */
static void greedy(run *r, const int *prompt, int n_prompt, int n, int *out)
{
    cr_assert_eq(kvp_gen_prefill(&model, &r->s, &r->c, &r->e, prompt, n_prompt, NULL), 0);
    for (int i = 0; i < n; i++) {
        out[i] = argmax(r->s.logits, model.cfg.vocab_size);
        cr_assert_eq(kvp_gen_decode(&model, &r->s, &r->c, &r->e, out[i]), 0);
    }
}

Test(generate, budget_above_sequence_changes_nothing)
{
    int prompt[128];
    int np = kvp_tokenizer_encode(&model.tok, "Once upon a time, a little dog found a red ball "
                                  "in the park. He wanted to play with it.", 84, KVP_ENCODE_BOS, prompt, 128);
    int want[150], got[150];
    run r;
    run_open(&r, "none", 0, 32);
    greedy(&r, prompt, np, 150, want);
    run_close(&r);
    for (size_t p = 0; p < N_POLICIES; p++) {
        run_open(&r, policies[p], 400, 32);
        greedy(&r, prompt, np, 150, got);
        cr_expect_eq(memcmp(want, got, sizeof want), 0, "policy %s changed the output", policies[p]);
        cr_expect_eq(r.c.evicted_rows, 0, "policy %s evicted", policies[p]);
        run_close(&r);
    }
}

/* After every trigger, no head holds more than budget + chunk rows; long prefills
 * and long generations both evict, and positions wrap through the context shift. */
Test(generate, triggers_bound_every_head)
{
    size_t len;
    char *text = tu_slurp(tu_shared("datasets/tinystories/tinystories-dev.txt"), &len);
    int *toks = malloc(2000 * sizeof *toks);
    int n = kvp_tokenizer_encode(&model.tok, text, 3000, KVP_ENCODE_BOS, toks, 2000);
    cr_assert_gt(n, 900);
    const int budget = 64, chunk = 32;
    for (size_t p = 1; p < N_POLICIES; p++) {
        run r;
        run_open(&r, policies[p], budget, chunk);
        cr_assert_eq(kvp_gen_prefill(&model, &r.s, &r.c, &r.e, toks, 700, NULL), 0);
        cr_expect_leq(kvp_cache_max_rows(&r.c), budget + chunk, "%s after prefill", policies[p]);
        for (int i = 700; i < 900; i++) {
            cr_assert_eq(kvp_gen_decode(&model, &r.s, &r.c, &r.e, toks[i]), 0);
            cr_assert_leq(kvp_cache_max_rows(&r.c), budget + chunk, "%s at token %d", policies[p], i);
            cr_assert_lt(r.c.next_pos, model.cfg.seq_len + 1);
        }
        cr_expect_gt(r.c.evicted_rows, 0, "%s never evicted", policies[p]);
        cr_expect_gt(r.c.shifts, 0, "%s never shifted the context", policies[p]);
        cr_expect_eq(kvp_gen_compress(&r.c, &r.e) >= 0, 1);
        cr_expect_leq(kvp_cache_max_rows(&r.c), budget, "%s compress", policies[p]);
        run_close(&r);
    }
    free(toks);
    free(text);
}

/* Six times the trained context with budget 64: finite logits, bounded memory, and
 * text that keeps coming (not one token repeated). */
Test(generate, three_thousand_tokens_with_budget_64)
{
    const char *ps[] = {"kvp", "streaming", "h2o"};
    for (size_t p = 0; p < 3; p++) {
        run r;
        run_open(&r, ps[p], 64, 32);
        kvp_sampler smp;
        kvp_sampler_init(&smp, model.cfg.vocab_size, 0.8f, 0.95f, 11);
        int tok = 1, prev = 1, distinct_tail[512] = {0}, n_distinct = 0;
        size_t text_bytes = 0;
        cr_assert_eq(kvp_gen_prefill(&model, &r.s, &r.c, &r.e, &tok, 1, NULL), 0);
        for (int i = 0; i < 3000; i++) {
            for (int v = 0; v < model.cfg.vocab_size; v++)
                cr_assert(isfinite(r.s.logits[v]), "%s: NaN at step %d", ps[p], i);
            tok = kvp_sample(&smp, r.s.logits);
            size_t len;
            if (kvp_tokenizer_piece(&model.tok, prev, tok, &len))
                text_bytes += len;
            if (i >= 2500 && !distinct_tail[tok]++)
                n_distinct++;
            prev = tok;
            cr_assert_eq(kvp_gen_decode(&model, &r.s, &r.c, &r.e, tok), 0);
            cr_assert_leq(kvp_cache_max_rows(&r.c), 64 + 32);
        }
        cr_expect_gt(r.c.shifts, 5, "%s: %llu shifts", ps[p], (unsigned long long)r.c.shifts);
        cr_expect_gt(text_bytes, 6000, "%s produced %zu bytes", ps[p], text_bytes);
        cr_expect_gt(n_distinct, 40, "%s: only %d distinct tokens at the end", ps[p], n_distinct);
        kvp_sampler_free(&smp);
        run_close(&r);
    }
}

Test(generate, no_eviction_stops_at_the_context_length)
{
    run r;
    run_open(&r, "none", 0, 32);
    int toks[64];
    for (int i = 0; i < 64; i++)
        toks[i] = 100 + i;
    int rc = 0;
    for (int i = 0; i < 9 && !rc; i++)
        rc = kvp_gen_prefill(&model, &r.s, &r.c, &r.e, toks, 64, NULL);
    cr_expect_eq(rc, -E2BIG);
    cr_expect_leq(r.c.next_pos, model.cfg.seq_len);
    run_close(&r);
}

/* Continuous batching (kvp_gen_step): sequences with different policies, budgets, prompt
 * lengths and join times, batched with prefill chunks beside decodes, give the greedy
 * tokens and keep the cache rows of each sequence run alone. */
#define N_BATCH 6
Test(generate, batched_steps_keep_each_sequence_and_policy)
{
    static const struct {
        const char *policy;
        int budget, chunk, prompt, join;
    } seqs[N_BATCH] = {
        {"none", 0, 8, 3, 0},       {"h2o", 40, 8, 30, 0},   {"streaming", 36, 4, 9, 2},
        {"snapkv", 44, 8, 50, 5},   {"kvp", 40, 16, 20, 7},  {"random", 48, 8, 12, 11},
    };
    const int n_gen = 90, V = model.cfg.vocab_size;
    int prompt[N_BATCH][64], want[N_BATCH][128], got[N_BATCH][128];
    size_t rows[N_BATCH];
    uint64_t evicted[N_BATCH];
    for (int i = 0; i < N_BATCH; i++) {
        prompt[i][0] = 1;
        for (int t = 1; t < seqs[i].prompt; t++)
            prompt[i][t] = 3 + (i * 37 + t * 11) % (V - 3);
        run r;
        run_open(&r, seqs[i].policy, seqs[i].budget, seqs[i].chunk);
        greedy(&r, prompt[i], seqs[i].prompt, n_gen, want[i]);
        rows[i] = kvp_cache_rows(&r.c);
        evicted[i] = r.c.evicted_rows;
        run_close(&r);
    }

    run r[N_BATCH];
    for (int i = 0; i < N_BATCH; i++)
        run_open(&r[i], seqs[i].policy, seqs[i].budget, seqs[i].chunk);
    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, &model.cfg, 64 * N_BATCH), 0);
    float *logits = malloc((size_t)N_BATCH * V * sizeof *logits);
    int fed[N_BATCH] = {0}, n_got[N_BATCH] = {0}, max_batch = 0;
    for (int step = 0;; step++) {
        kvp_batch_seq b[N_BATCH];
        const kvp_evict_cfg *e[N_BATCH];
        int who[N_BATCH], nb = 0;
        for (int i = 0; i < N_BATCH; i++) {
            if (step < seqs[i].join || n_got[i] > n_gen)
                continue;
            int left = seqs[i].prompt - fed[i];
            /* kvp_gen_prefill's blocks: a chunk when evicting, else the whole prompt */
            int blk = seqs[i].budget ? seqs[i].chunk : left;
            b[nb] = (kvp_batch_seq){.cache = &r[i].c, .logits = logits + (size_t)nb * V,
                                    .tokens = left > 0 ? prompt[i] + fed[i] : &got[i][n_got[i] - 1],
                                    .n = left > 0 ? (left < blk ? left : blk) : 1};
            e[nb] = &r[i].e;
            who[nb++] = i;
        }
        if (!nb)
            break;
        max_batch = nb > max_batch ? nb : max_batch;
        cr_assert_eq(kvp_gen_step(&model, &s, b, e, nb), 0);
        for (int j = 0; j < nb; j++) {
            int i = who[j];
            cr_assert_eq(b[j].rc, 0, "sequence %d: %d", i, b[j].rc);
            if (fed[i] < seqs[i].prompt && (fed[i] += b[j].n) < seqs[i].prompt)
                continue;
            if (n_got[i] < n_gen)
                got[i][n_got[i]] = argmax(b[j].logits, V);
            n_got[i]++;
        }
    }
    cr_assert_eq(max_batch, N_BATCH);
    for (int i = 0; i < N_BATCH; i++) {
        cr_expect_arr_eq(got[i], want[i], n_gen * sizeof(int), "%s: tokens differ from its run alone",
                         seqs[i].policy);
        cr_expect_eq(kvp_cache_rows(&r[i].c), rows[i], "%s: rows", seqs[i].policy);
        cr_expect_eq(r[i].c.evicted_rows, evicted[i], "%s: evicted rows", seqs[i].policy);
        if (seqs[i].budget)
            cr_expect_gt(evicted[i], 0, "%s evicted", seqs[i].policy);
        run_close(&r[i]);
    }
    free(logits);
    kvp_runstate_free(&s);
}

/* One sequence that cannot run (no eviction, past the context) gets its own -E2BIG in a
 * step; the other runs and its cache advances. */
Test(generate, a_failing_sequence_leaves_the_batch_running)
{
    run a, full;
    run_open(&a, "h2o", 40, 8);
    run_open(&full, "none", 0, 8);
    full.c.next_pos = model.cfg.seq_len;   /* as if the context were used up */
    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, &model.cfg, 16), 0);
    int tok[2] = {1, 5};
    float la[512], lf[512];
    kvp_batch_seq b[2] = {{.cache = &full.c, .tokens = tok, .n = 2, .logits = lf},
                          {.cache = &a.c, .tokens = tok, .n = 2, .logits = la}};
    const kvp_evict_cfg *e[2] = {&full.e, &a.e};
    cr_assert_eq(kvp_gen_step(&model, &s, b, e, 2), 0);
    cr_expect_eq(b[0].rc, -E2BIG);
    cr_expect_eq(b[1].rc, 0);
    cr_expect_eq(a.c.next_pos, 2);
    cr_expect_eq(kvp_cache_rows(&full.c), 0);
    kvp_runstate_free(&s);
    run_close(&a);
    run_close(&full);
}
