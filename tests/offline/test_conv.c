/* conv.c on stories260K with short conversations: the per-turn structure, KL exactly 0
 * and recall equal to the full cache's when the budget holds the whole conversation,
 * recall lost when turn 1's rows are evicted (and kept by per-turn protection), and
 * `kvp eval --dialogs`: its rows, its determinism across threads, its errors. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offline/conv.h"
#include "offline/oracle.h"
#include "offline/trace.h"
#include "tests/model/testutil.h"
#include "tests/offline/traceutil.h"

static kvp_model model;
static int *ids;   /* held-out tokens of TinyStories */
static long n_ids;
static kvp_runstate rs;
static int cue[64], NCUE;   /* KVP_CONV_CUE, as kvp eval encodes it */

static void setup(void)
{
    char err[256];
    cr_assert_eq(kvp_model_load(&model, tu_shared("models/stories260K.bin"), NULL, err, sizeof err),
                 0, "%s", err);
    n_ids = heldout_story_ids(&model, 20000, &ids);
    cr_assert_gt(n_ids, 2000);
    NCUE = kvp_tokenizer_encode(&model.tok, KVP_CONV_CUE, strlen(KVP_CONV_CUE),
                                KVP_ENCODE_NO_PREFIX, cue, 64);
    cr_assert_gt(NCUE, 0);
    cr_assert_eq(kvp_runstate_init(&rs, &model.cfg, 128), 0);
}

static void teardown(void)
{
    kvp_runstate_free(&rs);
    free(ids);
    kvp_model_free(&model);
}

TestSuite(conv, .init = setup, .fini = teardown, .timeout = 300);

static const char *policy_file(void)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/policy/weights/stories260K.kvp",
             getenv("KVP_SOURCE") ? getenv("KVP_SOURCE") : ".");
    return path;
}

static kvp_conv_opts small_opts(void)
{
    kvp_conv_opts o;
    kvp_conv_defaults(&o);
    o.turns = 4;
    o.turn_len = 24;
    o.reply_len = 8;
    o.recall_at[0] = 3;
    o.recall_at[1] = 5;
    return o;
}

static void story_of(const kvp_conv_opts *o, int i, int *story)
{
    story[0] = model.tok.bos_id;
    int n = kvp_conv_story_len(o);
    memcpy(story + 1, ids + (size_t)i * (n - 1), (size_t)(n - 1) * sizeof *story);
}

static int run(const char *name, int budget, const kvp_conv_opts *o, const int *story,
               kvp_conv_result *res)
{
    kvp_eval_opts eo = {.chunk = 8, .n_budgets = 1, .budgets = {budget}};
    kvp_policy *p;
    char err[256];
    cr_assert_eq(kvp_offline_policy_create(&p, name, policy_file(), &model.cfg, 1, err,
                                           sizeof err), 0, "%s", err);
    kvp_conv_acc acc = {0};
    int rc = kvp_conv_run(&model, &rs, p, story, cue, NCUE, 0, &eo, o, res, &acc);
    if (!rc)
        cr_assert_eq(acc.convs[0], 1);
    kvp_policy_destroy(p);
    return rc;
}

Test(conv, turns_follow_the_documented_structure)
{
    kvp_conv_opts o = small_opts();
    int story[256], per = o.turn_len + o.reply_len;
    story_of(&o, 0, story);
    kvp_conv_result r;
    cr_assert_eq(run("none", 0, &o, story, &r), 0);
    cr_assert_eq(r.n_tokens, o.turns * per);
    for (int k = 0; k < o.turns; k++) {
        cr_expect_eq(r.user_at[k], k * per);
        cr_expect_eq(r.reply_at[k], k * per + o.turn_len);
        cr_expect_eq(r.rows_after[k], (k + 1) * per, "turn %d: %d rows", k, r.rows_after[k]);
    }
    /* an evicting policy: every turn ends compressed to the budget */
    cr_assert_eq(run("streaming", 32, &o, story, &r), 0);
    for (int k = 0; k < o.turns; k++)
        cr_expect_eq(r.rows_after[k], 32, "turn %d: %d rows", k, r.rows_after[k]);
    cr_expect_gt(r.turn_kl[o.turns - 1], 0.0);
    /* positions: the last recall takes (5 - 1) turns + the cue + turn 1 without BOS */
    cr_expect_eq(kvp_conv_positions(&o, NCUE), 4 * per + NCUE + o.turn_len - 1);
}

Test(conv, kl_is_zero_when_the_budget_holds_the_conversation)
{
    kvp_conv_opts o = small_opts();
    int story[256];
    story_of(&o, 1, story);
    const char *names = kvp_offline_policy_names();
    char buf[512];
    snprintf(buf, sizeof buf, "%s", names);
    for (char *name = strtok(buf, " "); name; name = strtok(NULL, " ")) {
        if (!strcmp(name, "oracle") || !strcmp(name, "kvzap"))   /* kvzap: kvp, another file */
            continue;
        for (int protect = 0; protect <= 1; protect++) {
            o.protect = protect;
            kvp_conv_result r;
            cr_assert_eq(run(name, model.cfg.seq_len, &o, story, &r), 0, "%s", name);
            for (int k = 0; k < o.turns; k++)
                cr_expect_eq(r.turn_kl[k], 0.0, "%s%s turn %d: KL %g", name,
                             protect ? "+protect" : "", k + 1, r.turn_kl[k]);
            for (int i = 0; i < o.n_recall; i++)
                cr_expect_eq(r.recall[i], r.recall_full[i], "%s recall %d", name, i);
        }
    }
    kvp_conv_result r;
    kvp_policy *p;
    char err[256];
    kvp_eval_opts eo = {.chunk = 8, .n_budgets = 1, .budgets = {32}};
    kvp_conv_acc acc = {0};
    cr_assert_eq(kvp_offline_policy_create(&p, "oracle", NULL, &model.cfg, 1, err, sizeof err), 0);
    cr_expect_eq(kvp_conv_run(&model, &rs, p, story, cue, NCUE, 0, &eo, &o, &r, &acc), -EINVAL);
    kvp_policy_destroy(p);
    /* protection with a global budget; a budget index out of range */
    cr_assert_eq(kvp_offline_policy_create(&p, "knorm", NULL, &model.cfg, 1, err, sizeof err), 0);
    eo.budget_mode = KVP_BUDGET_GLOBAL;
    o.protect = 1;
    cr_expect_eq(kvp_conv_run(&model, &rs, p, story, cue, NCUE, 0, &eo, &o, &r, &acc), -EINVAL);
    eo.budget_mode = KVP_BUDGET_PER_HEAD;
    cr_expect_eq(kvp_conv_run(&model, &rs, p, story, cue, NCUE, 1, &eo, &o, &r, &acc), -EINVAL);
    cr_expect_eq(acc.convs[0], 0);
    kvp_policy_destroy(p);
}

/* A story whose user turns all repeat turn 1's text: with the full cache the model can
 * copy it; a cache that lost turn 1's rows (and every repeat) cannot. */
static void repeated_story(const kvp_conv_opts *o, int *story)
{
    story_of(o, 2, story);
    for (int k = 1; k < o->turns; k++) {
        memcpy(story + k * o->turn_len, story, (size_t)o->turn_len * sizeof *story);
        story[k * o->turn_len] = story[1];   /* BOS only once */
    }
}

Test(conv, recall_drops_when_turn_1_rows_are_evicted)
{
    kvp_conv_opts o = small_opts();
    int story[256];
    repeated_story(&o, story);
    kvp_conv_result full, ev, prot;
    cr_assert_eq(run("none", 0, &o, story, &full), 0);
    cr_assert_eq(run("streaming", 16, &o, story, &ev), 0);
    o.protect = 1;
    cr_assert_eq(run("streaming", 16, &o, story, &prot), 0);
    for (int i = 0; i < o.n_recall; i++) {
        cr_log_info("recall at %d: full %.3f streaming %.3f protected %.3f", o.recall_at[i],
                    full.recall[i], ev.recall[i], prot.recall[i]);
        cr_expect_eq(full.recall[i], full.recall_full[i]);
        cr_expect_lt(ev.recall[i], ev.recall_full[i] - 0.1, "recall %d: %g against %g", i,
                     ev.recall[i], ev.recall_full[i]);
        cr_expect_eq(full.kept_t1[i], 1.0);
        cr_expect_lt(ev.kept_t1[i], 0.2, "%g", ev.kept_t1[i]);
    }
}

/* Per-turn protection keeps the rows a turn's compression kept: knorm ranks by key norm,
 * so unprotected it drops turn 1's rows for newer ones; protected it keeps them (only the
 * sinks and recent window go first), and its scores are restored after every eviction:
 * the same run twice gives the same numbers. */
Test(conv, protection_keeps_the_rows_of_compressed_turns)
{
    kvp_conv_opts o = small_opts();
    int story[256];
    story_of(&o, 3, story);
    const char *names[] = {"knorm", "h2o", "kvp", "tova"};
    for (int i = 0; i < 4; i++) {
        kvp_conv_result plain, prot, again;
        o.protect = 0;
        cr_assert_eq(run(names[i], 48, &o, story, &plain), 0);
        o.protect = 1;
        cr_assert_eq(run(names[i], 48, &o, story, &prot), 0);
        cr_assert_eq(run(names[i], 48, &o, story, &again), 0);
        cr_log_info("%s: turn 1 rows kept at turn 5 %.3f, protected %.3f", names[i],
                    plain.kept_t1[1], prot.kept_t1[1]);
        cr_expect_gt(prot.kept_t1[1], plain.kept_t1[1], "%s", names[i]);
        /* at turn 3 turn 1's rows after its compression are all still there */
        cr_expect_geq(prot.kept_t1[0], prot.kept_t1[1], "%s", names[i]);
        cr_expect_eq(prot.recall[1], again.recall[1], "%s", names[i]);
        for (int k = 0; k < o.turns; k++)
            cr_expect_eq(prot.turn_kl[k], again.turn_kl[k], "%s turn %d", names[i], k);
    }
}

Test(conv, check_refuses_what_cannot_run)
{
    char err[256];
    kvp_conv_opts o;
    kvp_conv_defaults(&o);
    cr_expect_eq(kvp_conv_check(&o, 512, 9, err, sizeof err), 0, "%s", err);
    cr_expect_eq(kvp_conv_check(&o, 400, 9, err, sizeof err), -E2BIG);
    cr_expect(strstr(err, "context 400"), "%s", err);
    o.recall_at[1] = 9;
    cr_expect_eq(kvp_conv_check(&o, 512, 9, err, sizeof err), -EINVAL);
    o.recall_at[1] = 3;   /* below the one before */
    cr_expect_eq(kvp_conv_check(&o, 512, 9, err, sizeof err), -EINVAL);
    kvp_conv_defaults(&o);
    o.turns = 0;
    cr_expect_eq(kvp_conv_check(&o, 512, 9, err, sizeof err), -EINVAL);
    o.turns = KVP_CONV_MAX_TURNS + 1;
    cr_expect_eq(kvp_conv_check(&o, 512, 9, err, sizeof err), -EINVAL);
    kvp_conv_defaults(&o);
    o.turn_len = 1;
    cr_expect_eq(kvp_conv_check(&o, 512, 9, err, sizeof err), -EINVAL);
    kvp_conv_defaults(&o);
    cr_expect_eq(kvp_conv_check(&o, 512, 0, err, sizeof err), -EINVAL);
}

/* ---- the command ------------------------------------------------------------------------ */

static int run_eval(const char *args, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s eval --model %s --text %s %s 2>&1", tu_build("tools/kvp"),
             tu_shared("models/stories260K.bin"),
             tu_shared("datasets/tinystories/tinystories-dev.txt"), args);
    return tu_run(cmd, out);
}

static char *slurp_or_fail(const char *path)
{
    size_t len;
    char *s = tu_slurp(path, &len);
    cr_assert(s, "%s", path);
    return s;
}

Test(conv, cli_writes_the_conversation_rows_the_same_with_any_thread_count)
{
    char args[512], *out;
    const char *dir1 = "/tmp/kvp-test-conv-1", *dir2 = "/tmp/kvp-test-conv-2";
    for (int t = 1; t <= 2; t++) {
        snprintf(args, sizeof args, "--out %s --dialogs 2 --turn-len 20 --turn-reply 6 "
                 "--policies none,streaming,h2o --budgets 32,64 --protect-turns --threads %d",
                 t == 1 ? dir1 : dir2, t);
        cr_assert_eq(run_eval(args, &out), 0, "%s", out);
        free(out);
    }
    char p1[256], p2[256];
    snprintf(p1, sizeof p1, "%s/results.csv", dir1);
    snprintf(p2, sizeof p2, "%s/results.csv", dir2);
    char *a = slurp_or_fail(p1), *b = slurp_or_fail(p2);
    cr_expect_str_eq(a, b);
    /* 5 variants (none has no protected one) x 2 budgets x (kl + 7 turns + 2 x 3 recall) */
    int rows = 0;
    for (char *c = a; (c = strstr(c, "\nconversation,")); c++)
        rows++;
    cr_expect_eq(rows, 5 * 2 * (1 + 7 + 6), "%d rows\n%s", rows, a);
    cr_expect(strstr(a, "conversation,h2o+protect,64,recall_gap_8,"), "%s", a);
    cr_expect(strstr(a, "conversation,none,32,kl,0\n"), "%s", a);
    cr_expect(!strstr(a, "ranking,") && !strstr(a, "streaming,streaming"), "%s", a);
    free(a);
    free(b);
    snprintf(p1, sizeof p1, "%s/results.md", dir1);
    char *md = slurp_or_fail(p1);
    cr_expect(strstr(md, "Conversation: recall at turn 8"), "%s", md);
    cr_expect(strstr(md, "--dialogs 2 --turn-len 20 --turn-reply 6 --protect-turns"), "%s", md);
    free(md);
}

Test(conv, cli_rejects_bad_input_with_a_message)
{
    static const struct {
        const char *args;
        int status;
        const char *msg;
    } cases[] = {
        {"--out /tmp/x --dialogs 0", 2, "bad value '0' for --dialogs"},
        {"--out /tmp/x --dialogs -3", 2, "bad value '-3' for --dialogs"},
        {"--out /tmp/x --dialogs many", 2, "bad value 'many' for --dialogs"},
        {"--out /tmp/x --dialogs ''", 2, "bad value '' for --dialogs"},
        {"--out /tmp/x --dialogs 2 --turn-len 1", 2, "bad value '1' for --turn-len"},
        {"--out /tmp/x --dialogs 2 --turn-len 40x", 2, "bad value '40x' for --turn-len"},
        {"--out /tmp/x --dialogs 2 --turn-reply 0", 2, "bad value '0' for --turn-reply"},
        {"--out /tmp/x --dialogs 2 --turn-reply 99999999999", 2, "for --turn-reply"},
        {"--out /tmp/x --turn-len 20", 2, "go with --dialogs"},
        {"--out /tmp/x --turn-reply 20", 2, "go with --dialogs"},
        {"--out /tmp/x --protect-turns", 2, "go with --dialogs"},
        {"--out /tmp/x --dialogs 2 --protect-turns --budget-mode global", 2, "per_head only"},
        {"--out /tmp/x --dialogs 2 --turn-len 60", 2, "more than the model's context 512"},
        {"--out /tmp/x --dialogs 2 --turn-reply 100", 2, "more than the model's context"},
        {"--out /tmp/x --dialogs 2 --policies oracle", 2, "no policy to run"},
        {"--out /tmp/x --dialogs 2 --policies kvp", 2, "needs --policy-file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int st = run_eval(cases[i].args, &out);
        cr_assert_eq(st, cases[i].status, "'%s': exit %d\n%s", cases[i].args, st, out);
        cr_assert(strstr(out, cases[i].msg), "'%s': no '%s' in\n%s", cases[i].args,
                  cases[i].msg, out);
        free(out);
    }
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s eval --model %s --prompts /dev/null --dialogs 2 --out /tmp/x "
             "2>&1", tu_build("tools/kvp"), tu_shared("models/stories260K.bin"));
    cr_assert_eq(tu_run(cmd, &out), 2, "%s", out);
    cr_assert(strstr(out, "not --prompts"), "%s", out);
    free(out);
}
