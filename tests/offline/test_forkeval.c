/* forkeval.c on stories260K: a fork is the source's cache cut at the divergence, not a
 * fresh prefill. Without eviction the cut source holds exactly P's rows, so the fork and
 * the cache prefilled from scratch agree row for row and in KL; with streaming at a budget
 * below |P| and a source continuation A longer than the fork's B, A evicted rows of P
 * that a fresh prefill keeps, so the fork's rows differ from scratch's and are a subset
 * of the source's. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate/generate.h"
#include "offline/forkeval.h"
#include "offline/oracle.h"
#include "offline/trace.h"
#include "tests/model/testutil.h"
#include "tests/offline/traceutil.h"

#define NP 256
#define NB 64
#define LEN (NP + 2 * NB)

static kvp_model model;
static int tok[LEN];
static kvp_runstate rs;
static kvp_forkeval_case fc;
static float *full;

static void setup(void)
{
    char err[256];
    cr_assert_eq(kvp_model_load(&model, tu_shared("models/stories260K.bin"), NULL, err, sizeof err),
                 0, "%s", err);
    int *ids;
    long n_ids = heldout_story_ids(&model, 20000, &ids);
    cr_assert_gt(n_ids, LEN);
    tok[0] = model.tok.bos_id;
    memcpy(tok + 1, ids, (LEN - 1) * sizeof *tok);
    free(ids);
    cr_assert_eq(kvp_runstate_init(&rs, &model.cfg, 512), 0);
    fc = (kvp_forkeval_case){tok, NP, tok + NP, NB, tok + NP + NB, NB, 64, 32};
    full = malloc((size_t)model.cfg.vocab_size * sizeof *full);
    cr_assert_eq(kvp_forkeval_full(&model, &rs, &fc, full), 0);
}

static void teardown(void)
{
    free(full);
    kvp_runstate_free(&rs);
    kvp_model_free(&model);
}

static kvp_policy *make(const char *name)
{
    kvp_policy *p;
    char err[256];
    cr_assert_eq(kvp_offline_policy_create(&p, name, NULL, &model.cfg, 1, err, sizeof err), 0,
                 "%s", err);
    return p;
}

/* runs one case of policy `name`; the fork's and scratch's caches are the caller's */
static void run(const char *name, int budget, double *kf, double *ks, kvp_cache *f, kvp_cache *b)
{
    kvp_policy *p[3] = {make(name), make(name), make(name)};
    fc.budget = budget;
    cr_assert_eq(kvp_forkeval_run(&model, &rs, &fc, p[0], p[1], p[2], full, kf, ks, f, b), 0);
    for (int k = 0; k < 3; k++)
        kvp_policy_destroy(p[k]);
}

static int has_seq(const kvp_head *h, int64_t seq)
{
    for (int i = 0; i < h->n; i++)
        if (h->seq[i] == seq)
            return 1;
    return 0;
}

TestSuite(forkeval, .init = setup, .fini = teardown, .timeout = 300);

Test(forkeval, no_eviction_fork_equals_scratch)
{
    double kf = -1, ks = -1;
    kvp_cache f, b;
    run("none", 64, &kf, &ks, &f, &b);
    cr_assert(fabs(kf - ks) <= 1e-6, "KL fork %g, scratch %g", kf, ks);
    cr_assert(kf >= 0 && kf <= 1e-6, "no eviction: KL(full || fork) = %g", kf);
    cr_assert_eq(f.n_seen, NP + NB);
    for (int hi = 0; hi < f.n_layers * f.n_kv_heads; hi++) {
        const kvp_head *hf = &f.heads[hi], *hb = &b.heads[hi];
        /* P and B: the source's continuation A did not come with the fork */
        cr_assert_eq(hf->n, NP + NB, "head %d: %d rows", hi, hf->n);
        cr_assert_eq(hf->n, hb->n);
        for (int i = 0; i < hf->n; i++) {
            cr_assert_eq(hf->seq[i], hb->seq[i]);
            cr_assert_eq(hf->pos[i], hb->pos[i]);
        }
    }
    kvp_cache_free(&f);
    kvp_cache_free(&b);
}

Test(forkeval, streaming_fork_is_the_cut_source)
{
    /* the source alone, to know which rows of P it kept */
    kvp_policy *sp = make("streaming");
    kvp_cache a;
    cr_assert_eq(kvp_cache_init(&a, model.cfg.n_layers, model.cfg.n_kv_heads, model.cfg.head_dim,
                                &model.cfg.rope), 0);
    kvp_evict_cfg e = {sp, 64, 32, 0};
    cr_assert_eq(kvp_gen_prefill(&model, &rs, &a, &e, tok, NP + NB, NULL), 0);
    kvp_policy_destroy(sp);

    /* B shorter than A: streaming keeps the newest rows, so with |B| >= |A| the fork and
     * scratch would end with the same rows; here A evicted rows of P that scratch keeps */
    fc.n_branch = NB / 4;
    cr_assert_eq(kvp_forkeval_full(&model, &rs, &fc, full), 0);
    double kf = -1, ks = -1;
    kvp_cache f, b;
    run("streaming", 64, &kf, &ks, &f, &b);
    cr_assert(isfinite(kf) && isfinite(ks) && kf >= 0 && ks >= 0);
    int differ = 0;
    for (int hi = 0; hi < f.n_layers * f.n_kv_heads; hi++) {
        const kvp_head *hf = &f.heads[hi], *hb = &b.heads[hi];
        for (int i = 0; i < hf->n; i++) {
            cr_assert(hf->seq[i] < NP + NB, "head %d holds token %lld", hi,
                      (long long)hf->seq[i]);
            if (hf->seq[i] < NP)
                cr_assert(has_seq(&a.heads[hi], hf->seq[i]),
                          "head %d: the fork holds row %lld of P that the source had evicted",
                          hi, (long long)hf->seq[i]);
        }
        if (hf->n != hb->n)
            differ = 1;
        for (int i = 0; i < hf->n && !differ; i++)
            differ = hf->seq[i] != hb->seq[i];
    }
    cr_assert(differ, "the fork's rows equal a fresh prefill's: the source's cut was not used");
    kvp_cache_free(&a);
    kvp_cache_free(&f);
    kvp_cache_free(&b);
}

Test(forkeval, stateful_policies_fork)
{
    static const char *const names[] = {"h2o", "tova", "snapkv"};
    for (int i = 0; i < 3; i++) {
        double kf = -1, ks = -1;
        run(names[i], 128, &kf, &ks, NULL, NULL);
        cr_assert(isfinite(kf) && isfinite(ks) && kf >= 0 && ks >= 0, "%s: %g %g", names[i],
                  kf, ks);
    }
}

Test(forkeval, bad_case)
{
    double kf, ks;
    kvp_policy *p[3] = {make("none"), make("none"), make("none")};
    kvp_forkeval_case bad = fc;
    bad.n_branch = 0;
    cr_assert_eq(kvp_forkeval_run(&model, &rs, &bad, p[0], p[1], p[2], full, &kf, &ks, NULL,
                                  NULL), -EINVAL);
    for (int k = 0; k < 3; k++)
        kvp_policy_destroy(p[k]);
}

static int run_cli(const char *args, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s forkeval --model %s --text %s %s 2>&1", tu_build("tools/kvp"),
             tu_shared("models/stories260K.bin"),
             tu_shared("datasets/tinystories/tinystories-dev.txt"), args);
    return tu_run(cmd, out);
}

Test(forkeval, cli_table_and_errors)
{
    char *out = NULL;
    cr_assert_eq(run_cli("--seqs 2 --policies none,streaming --budgets 64", &out), 0, "%s", out);
    cr_assert(strstr(out, "| none | 64 | 0.00000 | 0.00000 | - |"), "%s", out);
    cr_assert(strstr(out, "| streaming | 64 | "), "%s", out);
    free(out);
    static const struct { const char *args, *msg; } bad[] = {
        {"--policies oracle", "the oracle cannot fork"},
        {"--policies kvzip", "nor can kvzip"},
        {"--policies kvp", "policy kvp needs --policy-file"},
        {"--prefix 500", "exceeds the model's context"},
        {"--budgets 0", "bad budget"},
        {"--seqs x", "bad value 'x' for --seqs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(run_cli(bad[i].args, &out), 2, "%s: %s", bad[i].args, out);
        cr_assert(strstr(out, bad[i].msg), "%s: %s", bad[i].args, out);
        free(out);
    }
}
