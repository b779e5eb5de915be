/* windowfit.c on stories260K with a short trace: the KL it reports before and after the
 * fit is the one-shot KL `kvp eval`'s protocol measures with those caps on the same
 * sequences; the fit never makes its objective worse; min_gain and the time limit hold
 * layers back; bad settings and `kvp fit-window` misuse are refused with a message. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offline/agent_train.h"
#include "offline/eval.h"
#include "offline/trace.h"
#include "offline/windowfit.h"
#include "policy/kvp_agent.h"
#include "policy/policy.h"
#include "tests/model/testutil.h"

enum { LEN = 128, SEQS = 12 };

static kvp_model model;
static kvp_trace trace;
static char dir[64], tpath[128], pol[128];

static void setup(void)
{
    char err[512], cmd[2048], *out;
    snprintf(dir, sizeof dir, "/tmp/kvp-windowfit-test-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s trace --model %s --tokenizer %s --text %s --out %s "
             "--seq-len %d --max-seqs %d --split 0.5 2>&1", tu_build("tools/kvp"),
             tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"),
             tu_shared("datasets/tinystories/tinystories-dev.txt"), dir, LEN, SEQS);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    free(out);
    cr_assert_eq(kvp_model_load(&model, tu_shared("models/stories260K.bin"), NULL, err, sizeof err),
                 0, "%s", err);
    snprintf(tpath, sizeof tpath, "%s/trace.kvpt", dir);
    cr_assert_eq(kvp_trace_open(&trace, tpath, &model.cfg, err, sizeof err), 0, "%s", err);
    /* agents with relative keys bound to the model, as kvp learn makes them */
    snprintf(pol, sizeof pol, "%s/init.kvp", dir);
    snprintf(cmd, sizeof cmd, "%s policy-init --model %s --tokenizer %s --out %s --seed 3 2>&1",
             tu_build("tools/kvp"), tu_shared("models/stories260K.bin"),
             tu_shared("models/tok512.bin"), pol);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    free(out);
}

static void teardown(void)
{
    kvp_trace_close(&trace);
    kvp_model_free(&model);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* Mean one-shot KL per budget of the set's "kvp" policy on every training sequence of
 * the trace, through kvp_eval_sequence (kvp eval's own path). */
static void eval_kl(const kvp_agent_set *set, const int *budgets, int n_budgets, double *kl)
{
    char err[256];
    kvp_eval_opts eo = {.cut = LEN * 3 / 4, .n_budgets = n_budgets, .kv_type = KVP_KV_F32,
                        .budget_mode = KVP_BUDGET_PER_HEAD};
    memcpy(eo.budgets, budgets, (size_t)n_budgets * sizeof *budgets);
    kvp_eval_ref r;
    kvp_runstate s;
    cr_assert_eq(kvp_eval_ref_init(&r, &model.cfg, LEN, &eo), 0);
    cr_assert_eq(kvp_runstate_init(&s, &model.cfg, LEN), 0);
    kvp_eval_acc acc = {0};
    for (int q = 0; q < trace.h.n_train; q++) {
        const int *tokens = kvp_trace_tokens(&trace, q);
        cr_assert_eq(kvp_eval_ref_compute(&r, &model, &s, tokens), 0);
        kvp_policy *p = calloc(1, sizeof *p);
        p->cfg = model.cfg;
        p->n_sink = KVP_DEFAULT_SINKS;
        p->n_recent = KVP_DEFAULT_RECENT;
        cr_assert_eq(kvp_agent_policy_create_shared(p, set, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kvp_eval_sequence(&model, &s, p, tokens, &r, &acc), 0);
        kvp_policy_destroy(p);
    }
    for (int b = 0; b < n_budgets; b++)
        kl[b] = acc.kl[b] / (double)acc.tokens;
    kvp_runstate_free(&s);
    kvp_eval_ref_free(&r);
}

static double geo(const double *kl, int n)
{
    double j = 0.0;
    for (int b = 0; b < n; b++)
        j += log(kl[b] + 1e-12);
    return j / n;
}

Test(windowfit, reported_kl_is_the_eval_protocols_and_the_fit_never_hurts, .init = setup,
     .fini = teardown, .timeout = 600)
{
    char err[512];
    kvp_agent_set set;
    cr_assert_eq(kvp_agent_set_load(&set, pol, &model.cfg, err, sizeof err), 0, "%s", err);
    cr_assert_null(set.caps);
    kvp_windowfit_opts o;
    kvp_windowfit_defaults(&o);
    o.threads = 2;
    kvp_windowfit_result res;
    cr_assert_eq(kvp_windowfit(&set, &model, &trace, &o, &res, stderr, err, sizeof err), 0, "%s", err);
    /* every training sequence (fewer than asked for), every layer, the default budgets */
    cr_assert_eq(res.seqs, trace.h.n_train);
    cr_assert_eq(res.layers_fitted, model.cfg.n_layers);
    cr_assert_eq(res.n_budgets, 4);
    cr_assert_eq(res.budgets[0], LEN / 16);
    cr_assert_eq(res.budgets[3], LEN / 2);
    cr_assert_not_null(set.caps);
    cr_assert_eq(set.n_cap_budgets, 4);
    cr_assert_eq(memcmp(set.cap_budgets, res.budgets, 4 * sizeof(int)), 0);
    int changed[4] = {0};
    for (int l = 0; l < set.n_layers; l++) {
        /* one cap per layer, where it helps */
        int one = 0;
        for (int b = 0; b < 4; b++)
            if (set.caps[l * 4 + b]) {
                cr_expect(!one || set.caps[l * 4 + b] == one, "layer %d: caps %d and %d", l, one,
                          set.caps[l * 4 + b]);
                one = set.caps[l * 4 + b];
            }
        for (int b = 0; b < 4; b++) {
            int c = set.caps[l * 4 + b], D = LEN / 8;
            cr_assert(c == 0 || c == D || c == 3 * D / 4 || c == D / 2 || c == 3 * D / 8 ||
                      c == D / 4 || c == 3 * D / 16 || c == D / 8,
                      "layer %d budget %d: cap %d is no candidate", l, res.budgets[b], c);
            changed[b] += c != 0;
        }
    }
    double before[4], after[4];
    kvp_agent_set plain = set;   /* the same agents without caps */
    plain.caps = NULL;
    plain.n_cap_budgets = 0;
    eval_kl(&plain, res.budgets, 4, before);
    eval_kl(&set, res.budgets, 4, after);
    for (int b = 0; b < 4; b++) {
        cr_expect(fabs(before[b] - res.kl_before[b]) <= 1e-9 + 1e-6 * before[b],
                  "budget %d: fit says %.9f before, eval %.9f", res.budgets[b], res.kl_before[b], before[b]);
        cr_expect(fabs(after[b] - res.kl_after[b]) <= 1e-9 + 1e-6 * after[b],
                  "budget %d: fit says %.9f after, eval %.9f", res.budgets[b], res.kl_after[b], after[b]);
        /* a budget whose caps changed gained at least min_gain; the others are as before */
        if (changed[b])
            cr_expect_lt(after[b], before[b] * (1.0 - o.min_gain) + 1e-12, "budget %d", res.budgets[b]);
        else
            cr_expect_eq(res.kl_after[b], res.kl_before[b], "budget %d", res.budgets[b]);
    }
    cr_expect_leq(geo(after, 4), geo(before, 4) + 1e-12);

    /* no change can bring a 99% drop: the caps stay what they were */
    int *fitted = malloc((size_t)set.n_layers * 4 * sizeof *fitted);
    memcpy(fitted, set.caps, (size_t)set.n_layers * 4 * sizeof *fitted);
    o.min_gain = 0.99;
    o.seqs = 3;
    cr_assert_eq(kvp_windowfit(&set, &model, &trace, &o, &res, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res.seqs, 3);
    cr_expect_eq(memcmp(set.caps, fitted, (size_t)set.n_layers * 4 * sizeof *fitted), 0);
    for (int b = 0; b < 4; b++)
        cr_expect_eq(res.kl_after[b], res.kl_before[b]);
    /* a time limit already passed: layer 0 is fitted, no other starts */
    o.min_gain = 0.0;
    o.max_seconds = 1e-9;
    cr_assert_eq(kvp_windowfit(&set, &model, &trace, &o, &res, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(res.layers_fitted, 1);
    cr_expect_eq(memcmp(set.caps + 4, fitted + 4, (size_t)(set.n_layers - 1) * 4 * sizeof *fitted), 0,
                 "layers past the first keep their caps");
    free(fitted);

    /* budgets the compressed prefix cannot hold: refused, the caps unchanged */
    int *keep = malloc((size_t)set.n_layers * 4 * sizeof *keep);
    memcpy(keep, set.caps, (size_t)set.n_layers * 4 * sizeof *keep);
    o.max_seconds = 0.0;
    o.n_budgets = 2;
    o.budgets[0] = 16;
    o.budgets[1] = LEN * 3 / 4;
    cr_assert_eq(kvp_windowfit(&set, &model, &trace, &o, &res, NULL, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "budget 96"), "%s", err);
    cr_assert_eq(set.n_cap_budgets, 4);
    cr_assert_eq(memcmp(keep, set.caps, (size_t)set.n_layers * 4 * sizeof *keep), 0);
    free(keep);
    kvp_agent_set_free(&set);
}

/* `kvp fit-window`: writes the fitted file; usage errors exit 2 naming the command, a
 * policy of another shape exits 1 and writes nothing. */
Test(windowfit, cli_writes_the_caps_and_refuses_bad_input, .init = setup, .fini = teardown,
     .timeout = 600)
{
    char args[4096], out_path[160], *out, err[512];
    snprintf(out_path, sizeof out_path, "%s/fitted.kvp", dir);
    const char *common = "--threads 2 --seqs 4";
    snprintf(args, sizeof args, "%s fit-window --model %s --tokenizer %s --traces %s "
             "--policy-file %s --out %s %s 2>&1", tu_build("tools/kvp"),
             tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), dir, pol,
             out_path, common);
    cr_assert_eq(tu_run(args, &out), 0, "%s", out);
    cr_assert(strstr(out, "5 of 5 layers fitted on 4 sequences"), "%s", out);
    free(out);
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_load(&s, out_path, &model.cfg, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(s.caps);
    kvp_agent_set_free(&s);

    const char *bad[] = {"", "--seqs 0", "--threads 0", "--min-gain 1.5", "--budgets 8,,16",
                         "--budgets x", "--max-seconds -1", "--bogus 1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "%s fit-window %s --model %s --traces %s --policy-file %s "
                 "--out %s/never.kvp 2>&1", tu_build("tools/kvp"), bad[i],
                 tu_shared("models/stories260K.bin"), dir, pol, dir);
        if (!*bad[i])   /* nothing at all */
            snprintf(args, sizeof args, "%s fit-window 2>&1", tu_build("tools/kvp"));
        cr_assert_eq(tu_run(args, &out), 2, "'%s': %s", bad[i], out);
        cr_assert(strstr(out, "kvp fit-window"), "'%s': %s", bad[i], out);
        free(out);
    }
    /* budgets past the cut: a setting the trace cannot take */
    snprintf(args, sizeof args, "%s fit-window --model %s --traces %s --policy-file %s "
             "--out %s/never.kvp --budgets 16,100 2>&1", tu_build("tools/kvp"),
             tu_shared("models/stories260K.bin"), dir, pol, dir);
    cr_assert_eq(tu_run(args, &out), 2, "%s", out);
    cr_assert(strstr(out, "budget 100"), "%s", out);
    free(out);
    /* a policy of another shape: a runtime error, nothing written */
    cr_assert_eq(kvp_agent_set_load(&s, pol, NULL, err, sizeof err), 0, "%s", err);
    kvp_agent_arch a = s.arch;
    kvp_agent_set_free(&s);
    a.relative = 0;
    cr_assert_eq(kvp_agent_set_alloc(&s, model.cfg.n_layers + 1, model.cfg.n_kv_heads, &a, err,
                                     sizeof err), 0, "%s", err);
    kvp_agent_set_init(&s, 1);
    char other[160];
    snprintf(other, sizeof other, "%s/other.kvp", dir);
    cr_assert_eq(kvp_agent_set_save(&s, other, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&s);
    snprintf(args, sizeof args, "%s fit-window --model %s --traces %s --policy-file %s "
             "--out %s/never.kvp 2>&1", tu_build("tools/kvp"), tu_shared("models/stories260K.bin"),
             dir, other, dir);
    cr_assert_eq(tu_run(args, &out), 1, "%s", out);
    cr_assert(strstr(out, "layers"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "%s/never.kvp", dir);
    cr_assert_neq(access(args, F_OK), 0, "a refused run wrote its output");
}
