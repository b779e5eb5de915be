/* The kvp CLI boundary: unknown commands and bad arguments get a message and a usage
 * exit status (2); runtime failures exit 1; nothing crashes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offline/trace.h"
#include "tests/model/testutil.h"

static int kvp(const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", tu_build("tools/kvp"), args);
    return tu_run(cmd, out);
}

static void expect(const char *args, int status, const char *needle)
{
    char *out;
    int st = kvp(args, &out);
    cr_expect_eq(st, status, "kvp %s: status %d, output:\n%s", args, st, out);
    cr_expect(strstr(out, needle), "kvp %s: no '%s' in:\n%s", args, needle, out);
    free(out);
}

Test(kvp_cli, top_level)
{
    expect("", 2, "usage: kvp");
    expect("frobnicate", 2, "unknown command 'frobnicate'");
    expect("--help", 0, "generate");
    expect("--version", 0, "kvp ");
}

Test(kvp_cli, generate_arguments)
{
    char a[1024];
    const char *m = tu_shared("models/stories260K.bin");
    expect("generate", 2, "--model is required");
    snprintf(a, sizeof a, "generate --model %s --temperature -1", m);
    expect(a, 2, "--temperature");
    snprintf(a, sizeof a, "generate --model %s --top-p 1.5", m);
    expect(a, 2, "--top-p");
    snprintf(a, sizeof a, "generate --model %s --policy bogus --budget 64", m);
    expect(a, 1, "unknown policy 'bogus'");
    snprintf(a, sizeof a, "generate --model %s --policy kvp --budget 64", m);
    expect(a, 1, "policy file");
    snprintf(a, sizeof a, "generate --model %s --budget 10", m);
    expect(a, 2, "smaller than --sinks + --recent");
    snprintf(a, sizeof a, "generate --model %s --budget 64 --chunk 9999999", m);
    expect(a, 2, "--chunk");
    static const char *const bad_mode[] = {"Global", "", "per-head", "1", "global,"};
    for (size_t i = 0; i < sizeof bad_mode / sizeof bad_mode[0]; i++) {
        snprintf(a, sizeof a, "generate --model %s --budget 64 --budget-mode '%s'", m, bad_mode[i]);
        expect(a, 2, "--budget-mode");
    }
    static const char *const bad_kv[] = {"q4_0", "", "Q8_0", "f32x", "8"};
    for (size_t i = 0; i < sizeof bad_kv / sizeof bad_kv[0]; i++) {
        snprintf(a, sizeof a, "generate --model %s --kv-type '%s'", m, bad_kv[i]);
        expect(a, 2, "--kv-type");
    }
    snprintf(a, sizeof a, "generate --model %s extra", m);
    expect(a, 2, "unexpected argument");
    expect("generate --model /nonexistent.gguf", 1, "/nonexistent.gguf");
    static const char *const bad_parallel[] = {"0", "-1", "two", "4097", "2x", ""};
    for (size_t i = 0; i < sizeof bad_parallel / sizeof bad_parallel[0]; i++) {
        snprintf(a, sizeof a, "generate --model %s --parallel '%s'", m, bad_parallel[i]);
        expect(a, 2, "--parallel");
    }
}

/* --parallel N, greedy: N replies in batched steps, each equal to the reply of one
 * sequence alone; with a policy and a budget the eviction runs per sequence. */
static void parallel_equals_alone(const char *extra)
{
    char a[1024], *one, *many;
    const char *m = tu_shared("models/stories260K.bin");
    snprintf(a, sizeof a, "%s generate --model %s --prompt 'Once upon a time' --temperature 0 "
             "--steps 200 --seed 4 %s 2>/dev/null", tu_build("tools/kvp"), m, extra);
    cr_assert_eq(tu_run(a, &one), 0, "%s", one);   /* the text alone, without the figures */
    snprintf(a, sizeof a, "generate --model %s --prompt 'Once upon a time' --temperature 0 "
             "--steps 200 --seed 4 --parallel 5 %s", m, extra);
    cr_assert_eq(kvp(a, &many), 0, "%s", many);
    size_t len = strlen(one);
    cr_assert_gt(len, 100, "%s", one);
    one[--len] = '\0';   /* the final newline */
    const char *p = many;
    for (int i = 0; i < 5; i++) {
        char head[64];
        snprintf(head, sizeof head, "--- sequence %d (seed %d)\n", i, 4 + i);
        cr_assert(p = strstr(p, head), "no '%s' in:\n%s", head, many);
        p += strlen(head);
        cr_expect_eq(strncmp(p, one, len), 0, "sequence %d:\n%.*s\nalone:\n%s", i, (int)len, p, one);
        cr_expect_eq(p[len], '\n');
        p += len;
    }
    cr_expect(strstr(many, "parallel: 5 sequences"), "%s", many);
    free(one);
    free(many);
}

Test(kvp_cli, generate_parallel_greedy_equals_alone)
{
    parallel_equals_alone("--ignore-eos");
    parallel_equals_alone("--policy h2o --budget 48 --chunk 8 --ignore-eos");
}

/* kvp train's streaming-episode options are checked before anything is read. */
Test(kvp_cli, train_stream_arguments)
{
    static const char *const bad[][2] = {
        {"--stream-share", "1.5"}, {"--stream-share", "-0.1"}, {"--stream-share", "half"},
        {"--stream-budgets", ""}, {"--stream-budgets", "32,,64"}, {"--stream-budgets", ",32"},
        {"--stream-budgets", "32,"}, {"--stream-budgets", "32,0"}, {"--stream-budgets", "32,x"},
        {"--stream-budgets", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"},
        {"--stream-chunk", "0"}, {"--stream-chunk", "4k"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char a[512], want[64];
        snprintf(a, sizeof a, "train --traces /nonexistent --init /nonexistent --out /tmp/x.kvp %s '%s'",
                 bad[i][0], bad[i][1]);
        snprintf(want, sizeof want, "bad value '%s' for %s", bad[i][1], bad[i][0]);
        expect(a, 2, want);
    }
}

Test(kvp_cli, trace_arguments)
{
    char a[2048], dir[] = "/tmp/kvp-cli-trace-XXXXXX";
    cr_assert(mkdtemp(dir));
    const char *m = tu_shared("models/stories260K.bin"), *t = tu_shared("datasets/tinystories/tinystories-dev.txt");
    expect("trace", 2, "--model, --text or --conversations, and --out are required");
    snprintf(a, sizeof a, "trace --model %s --text %s --out %s --seq-len 4096", m, t, dir);
    expect(a, 2, "exceeds the model's context");
    snprintf(a, sizeof a, "trace --model %s --text %s --out %s --split 1.5", m, t, dir);
    expect(a, 2, "--split");
    snprintf(a, sizeof a, "trace --model %s --text /nonexistent.txt --out %s", m, dir);
    expect(a, 1, "cannot read /nonexistent.txt");
    const char *tiny = tu_write_tmp("Once upon a time.\n", 18);
    snprintf(a, sizeof a, "trace --model %s --text %s --out %s", m, tiny, dir);
    expect(a, 1, "too short");
    remove(tiny);
    snprintf(a, sizeof a, "trace --model %s --text %s --out /proc/kvp-no-such-dir/x --max-seqs 2 --seq-len 32", m, t);
    expect(a, 1, "cannot create");
    /* a good run: the file opens and records the split */
    snprintf(a, sizeof a, "trace --model %s --text %s --out %s --max-seqs 5 --seq-len 40 --split 0.5", m, t, dir);
    expect(a, 0, "wrote");
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/trace.kvpt", dir);
    kvp_trace tr;
    cr_assert_eq(kvp_trace_open(&tr, path, NULL, err, sizeof err), 0, "%s", err);
    cr_expect_eq(tr.h.n_seqs, 5);
    cr_expect_eq(tr.h.n_train, 3, "5 x 0.5 rounds to 3 training sequences");
    cr_expect_eq(tr.h.seq_len, 40);
    cr_expect_eq(kvp_trace_tokens(&tr, 0)[0], 1, "sequences start with BOS");
    kvp_trace_close(&tr);
    remove(path);
    /* --max-seconds: after the first sequences the trace keeps to the time, training and
     * validation in the split's proportion (three copies of the text are some 1500
     * sequences of 512 tokens; a second holds only part of them) */
    size_t tlen;
    char *text = tu_slurp(t, &tlen), *big = malloc(3 * tlen);
    cr_assert(text && big);
    for (int i = 0; i < 3; i++)
        memcpy(big + i * tlen, text, tlen);
    const char *many = tu_write_tmp(big, 3 * tlen);
    free(text);
    free(big);
    snprintf(a, sizeof a, "trace --model %s --text %s --out %s --max-seqs 1000000 --max-seconds 1",
             tu_shared("models/stories260K.bin"), many, dir);
    expect(a, 0, "fit in --max-seconds 1: tracing");
    remove(many);
    cr_assert_eq(kvp_trace_open(&tr, path, NULL, err, sizeof err), 0, "%s", err);
    cr_expect_geq(tr.h.n_train, 3, "the measured sequences are kept");
    cr_expect_geq(tr.h.n_seqs - tr.h.n_train, 1, "a validation sequence");
    cr_expect_lt(tr.h.n_seqs, 1500, "%d sequences: not trimmed", tr.h.n_seqs);
    cr_expect_leq(tr.h.n_train, (int)(tr.h.n_seqs * 0.8 + 0.5));
    kvp_trace_close(&tr);
    remove(path);
    rmdir(dir);
}

/* Past the model's context with --ignore-eos: every step produces a token, the cache
 * stays at budget + chunk rows per head, and the context shift ran. */
/* Global budgets past the context, every row type: the session keeps at most
 * (budget + chunk) x heads rows, no head more than its cap (4 x budget) + chunk, the
 * heads' row counts differ (the budget is shared, not split evenly), and the bytes count
 * the stored type's rows: 2 x row + 20 per row and head (head_dim 8). */
Test(kvp_cli, generate_with_global_budgets_keeps_the_session_bound)
{
    const char *types[] = {"f32", "f16", "q8_0"};
    const size_t row_bytes[] = {32, 16, 10};
    for (int t = 0; t < 3; t++) {
        char a[1024], *out;
        snprintf(a, sizeof a, "generate --model %s --steps 1200 --ignore-eos --seed 3 --policy kvp "
                 "--policy-file %s/policy/weights/stories260K.kvp --budget 64 --budget-mode global "
                 "--kv-type %s", tu_shared("models/stories260K.bin"), getenv("KVP_SOURCE"), types[t]);
        cr_assert_eq(kvp(a, &out), 0, "%s", out);
        const char *cache = strstr(out, "cache: ");
        size_t bytes = 0, rows = 0;
        cr_assert(cache && sscanf(cache, "cache: %zu bytes, %zu rows", &bytes, &rows) == 2, "%s", out);
        cr_expect_leq(rows, (size_t)20 * (64 + 32), "%zu rows", rows);
        cr_expect_geq(rows, (size_t)20 * 64, "%zu rows", rows);
        /* per head rows/bytes: " L0[r/b r/b ...]" */
        int lo = 1 << 30, hi = 0, heads = 0;
        size_t sum = 0;
        for (const char *q = strchr(cache, '['); q; q = strchr(q, '[')) {
            q++;
            for (;;) {
                int r;
                size_t b;
                if (sscanf(q, "%d/%zu", &r, &b) != 2)
                    break;
                /* allocated rows of 2 x row + 20 bytes, room for those held */
                size_t cost = 2 * row_bytes[t] + 20;
                cr_expect_eq(b % cost, 0, "%s: %zu bytes are not whole rows", types[t], b);
                cr_expect_geq(b, (size_t)r * cost, "%s: %d rows in %zu bytes", types[t], r, b);
                sum += b;
                lo = r < lo ? r : lo;
                hi = r > hi ? r : hi;
                heads++;
                q += strcspn(q, " ]");
                if (*q != ' ')
                    break;
                q++;
            }
        }
        cr_expect_eq(heads, 20, "%s", out);
        cr_expect_eq(sum, bytes, "%s: the heads' bytes do not add up", types[t]);
        cr_expect_leq(hi, 4 * 64 + 32, "a head above its cap + chunk: %d", hi);
        cr_expect_geq(lo, 20, "a head below its sinks + recent window: %d", lo);
        cr_expect_neq(lo, hi, "every head kept the same rows: the budget was not shared");
        free(out);
    }
}

Test(kvp_cli, generate_past_the_context)
{
    /* every row type: the budget bounds the rows; q8_0 rows take under half the bytes */
    size_t f32_bytes = 0;
    const char *types[] = {"f32", "f16", "q8_0"};
    for (int t = 0; t < 3; t++) {
        char a[1024], *out;
        snprintf(a, sizeof a, "generate --model %s --steps 1200 --ignore-eos --seed 3 --policy streaming "
                 "--budget 64 --kv-type %s", tu_shared("models/stories260K.bin"), types[t]);
        cr_assert_eq(kvp(a, &out), 0, "%s", out);
        cr_expect(strstr(out, "decode: 1200 tokens"), "%s", out);
        const char *cache = strstr(out, "cache: ");
        size_t bytes = 0, rows = 0;
        char type[8] = "";
        cr_assert(cache && sscanf(cache, "cache: %zu bytes, %zu rows of %7[a-z0-9_]", &bytes, &rows, type) == 3,
                  "%s", out);
        cr_expect_str_eq(type, types[t]);
        cr_expect_leq(rows, (size_t)20 * (64 + 32), "20 heads of at most budget + chunk rows: %zu", rows);
        cr_expect_gt(rows, (size_t)20 * 64 - 1);
        cr_expect_null(strstr(out, " 0 shifts"), "%s", out);
        if (t == 0)
            f32_bytes = bytes;
        else
            cr_expect_lt(bytes * (t == 2 ? 2 : 1), f32_bytes, "%s: %zu bytes, f32 %zu", types[t], bytes, f32_bytes);
        free(out);
    }
}

Test(kvp_cli, logits_arguments)
{
    char a[2048], out[] = "/tmp/kvp-cli-logits-XXXXXX";
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    close(fd);
    char m[1024];   /* tu_shared's buffers rotate */
    snprintf(m, sizeof m, "%s", tu_shared("fixtures/arch/qwen2-bias-tied.gguf"));
    expect("logits", 2, "--model, --tokens and --out are required");
    snprintf(a, sizeof a, "logits --model %s --out %s", m, out);
    expect(a, 2, "required");
    static const char *const bad[] = {"", ",", "1,", ",1", "1,,2", "a", "1 2", "-1", "1.5",
                                      "99999999999999999999", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(a, sizeof a, "logits --model %s --tokens '%s' --out %s", m, bad[i], out);
        expect(a, 2, "expected comma-separated token ids");
    }
    snprintf(a, sizeof a, "logits --model %s --tokens 1,512 --out %s", m, out);
    expect(a, 2, "token 512 (position 1) is not below the vocabulary size 512");
    snprintf(a, sizeof a, "logits --model %s --tokens 1 --out %s extra", m, out);
    expect(a, 2, "unexpected argument");
    snprintf(a, sizeof a, "logits --model /nonexistent.gguf --tokens 1 --out %s", out);
    expect(a, 1, "/nonexistent.gguf");
    snprintf(a, sizeof a, "logits --model %s --tokens 1 --out /proc/kvp-no-such-dir/x", m);
    expect(a, 1, "cannot create");
    /* more tokens than the context: a llama2.c checkpoint of 512 positions */
    char *many = malloc(600 * 4);
    size_t at = 0;
    for (int i = 0; i < 600; i++)
        at += (size_t)sprintf(many + at, i ? ",%d" : "%d", 1);
    char *cmd = malloc(8192);
    snprintf(cmd, 8192, "logits --model %s --tokens %s --out %s", tu_shared("models/stories260K.bin"),
             many, out);
    expect(cmd, 2, "600 tokens exceed the model's context of 512");
    free(cmd);
    free(many);
    /* a good run writes n x vocab floats */
    snprintf(a, sizeof a, "logits --model %s --tokens 1,5,7 --out %s", m, out);
    expect(a, 0, "3 positions x 512 logits");
    size_t len;
    free(tu_slurp(out, &len));
    cr_expect_eq(len, 3 * 512 * 4);
    remove(out);
}

Test(kvp_cli, tokenize_arguments)
{
    char a[2048], m[1024];
    snprintf(m, sizeof m, "%s", tu_shared("models/stories260K.gguf"));
    expect("tokenize", 2, "needs --model");
    snprintf(a, sizeof a, "tokenize --model %s", m);
    expect(a, 2, "one of --text or --file");
    snprintf(a, sizeof a, "tokenize --model %s --text hi --file /nonexistent", m);
    expect(a, 2, "one of --text or --file");
    snprintf(a, sizeof a, "tokenize --model %s --file /nonexistent/x.txt", m);
    expect(a, 1, "/nonexistent/x.txt");
    snprintf(a, sizeof a, "tokenize --model %s --file /", m);
    expect(a, 1, "read error");
    expect("tokenize --model /nonexistent.gguf --text hi", 1, "/nonexistent.gguf");
    /* A file that is not a model. */
    char junk[1024];
    snprintf(junk, sizeof junk, "%s", tu_write_tmp("GGUF\x03\0\0\0garbage", 15));
    snprintf(a, sizeof a, "tokenize --model %s --text hi", junk);
    expect(a, 1, junk);
    /* The SentencePiece vocabulary: the dummy-prefix space, and the pieces. */
    char *out;
    snprintf(a, sizeof a, "tokenize --model %s --text 'Once upon'", m);
    cr_assert_eq(kvp(a, &out), 0, "%s", out);
    cr_expect(strchr(out, '\n') && out[0] >= '0' && out[0] <= '9', "ids line: %s", out);
    free(out);
    snprintf(a, sizeof a, "tokenize --model %s --text 'Once upon' --pieces", m);
    cr_assert_eq(kvp(a, &out), 0, "%s", out);
    cr_expect(strstr(out, "\t Once\n") || strstr(out, "\t O"), "pieces: %s", out);
    free(out);
}

Test(kvp_cli, synth_tokenizer_json_refused)
{
    char a[4096], outp[1024];
    snprintf(outp, sizeof outp, "%s", tu_build("tests/tools/synth-tok.gguf"));
    static const struct { const char *json, *needle; } bad[] = {
        {"{", "line 1"},
        {"[1, 2]", "not a JSON object"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "model is not BPE"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}, "
         "\"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "bad id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}",
         "pre_tokenizer is none kvpd implements"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
         "neither byte-level"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}, "
         "\"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"added_tokens\": [{\"id\": \"x\"}], \"decoder\": {\"type\": \"ByteLevel\"}, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", "added_tokens[0]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = tu_write_tmp(bad[i].json, strlen(bad[i].json));
        snprintf(a, sizeof a, "synth --out %s --dim 8 --hidden 8 --layers 1 --heads 2 "
                 "--tokenizer-json %s", outp, p);
        expect(a, 1, bad[i].needle);
        cr_expect(access(outp, F_OK) != 0, "case %zu left a model behind", i);
    }
    snprintf(a, sizeof a, "synth --out %s --tokenizer-config x.json", outp);
    expect(a, 2, "--tokenizer-config needs --tokenizer-json");
    snprintf(a, sizeof a, "synth --out %s --tokenizer-json /nonexistent.json", outp);
    expect(a, 1, "/nonexistent.json");
    const char *ok = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                     "\"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}";
    char p[1024];
    snprintf(p, sizeof p, "%s", tu_write_tmp(ok, strlen(ok)));
    const char *cfg = tu_write_tmp("{\"model_max_length\": 1000000000000000019884624838656, "
                                   "\"chat_template\": 5", 60);
    snprintf(a, sizeof a, "synth --out %s --tokenizer-json %s --tokenizer-config %s", outp, p, cfg);
    expect(a, 1, "line 1");
}

/* Every runtime policy on a qwen3-shaped model whose head size (24) is not dim / heads
 * (16), through context shifts (NeoX RoPE) and eviction: a clean run that keeps every
 * head within budget + chunk (the sanitizer build checks the memory). */
Test(kvp_cli, policies_on_a_qwen3_shape_through_context_shifts, .timeout = 240)
{
    char dir[] = "/tmp/kvp-cli-qwen3-XXXXXX", model[128], pol[128], a[1024];
    cr_assert(mkdtemp(dir));
    snprintf(model, sizeof model, "%s/q3.gguf", dir);
    snprintf(pol, sizeof pol, "%s/q3.kvp", dir);
    snprintf(a, sizeof a, "synth --out %s --arch qwen3 --head-dim 24 --dim 64 --hidden 96 "
             "--layers 2 --heads 4 --kv-heads 2 --vocab 300 --ctx 96 --tied", model);
    expect(a, 0, "wrote");
    snprintf(a, sizeof a, "policy-init --model %s --out %s", model, pol);
    expect(a, 0, "head_dim 24");
    static const char *const policies[] = {"random", "streaming", "knorm", "keydiff", "lagkv",
                                           "h2o", "tova", "snapkv", "expected_attention",
                                           "kvp"};
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) {
        snprintf(a, sizeof a, "generate --model %s --policy %s --policy-file %s --budget 32 "
                 "--chunk 8 --steps 300 --ignore-eos --temperature 0", model, policies[i], pol);
        char *out;
        int st = kvp(a, &out);
        cr_expect_eq(st, 0, "%s: %s", policies[i], out);
        const char *shifts = strstr(out, " shifts;");
        cr_expect(shifts && shifts[-1] != '0', "%s: no context shift in:\n%s", policies[i], out);
        /* per head rows/bytes: L0[r/b r/b] L1[...] */
        const char *p = strstr(out, "per head rows/bytes:");
        cr_assert(p, "%s: %s", policies[i], out);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)strcspn(p, "\n"), p);
        int heads = 0;
        for (char *q = strpbrk(line, "[ "); q; q = strpbrk(q + 1, "[ ")) {
            int rows;
            if (sscanf(q + 1, "%d/", &rows) == 1) {
                cr_expect_leq(rows, 32 + 8, "%s: a head holds %d rows", policies[i], rows);
                heads++;
            }
        }
        cr_expect_eq(heads, 4, "%s: %s", policies[i], out);
        free(out);
    }
    remove(model);
    remove(pol);
    rmdir(dir);
}

/* kvp plot: series measured at different x share one axis and each is one line. */
Test(kvp_cli, plot_draws_series_at_their_own_x_and_refuses_bad_input)
{
    char a[1024], svg[64];
    snprintf(svg, sizeof svg, "/tmp/kvp-plot-%d.svg", (int)getpid());
    const char *text = "protocol,series,budget,bytes,kl\n"
                       "oneshot,kvp f32,16,1000,0.5\noneshot,kvp f32,32,2000,0.25\n"
                       "oneshot,kvp q8_0,16,480,0.52\noneshot,kvp q8_0,32,960,0.27\n"
                       "streaming,kvp f32,16,1000,9\n";
    const char *csv = tu_write_tmp(text, strlen(text));
    snprintf(a, sizeof a, "plot --csv %s --protocol oneshot --out %s --title T", csv, svg);
    expect(a, 0, "");
    char *s = tu_slurp(svg, NULL);
    cr_expect(strstr(s, "kvp f32") && strstr(s, "kvp q8_0"), "%s", s);
    /* two lines of two points each, though no x is shared */
    int lines = 0;
    for (const char *q = s; (q = strstr(q, "<polyline points=\"")); q++) {
        const char *end = strchr(q, '"' );
        end = strchr(end + 1, '"');
        int pts = 0;
        for (const char *c = q; c < end; c++)
            pts += *c == ',';
        cr_expect_eq(pts, 2, "a line of %d points", pts);
        lines++;
    }
    cr_expect_eq(lines, 2);
    cr_expect_null(strstr(s, ">9<"), "the streaming point was plotted");
    free(s);
    unlink(svg);
    expect("plot", 2, "--csv and --out are required");
    snprintf(a, sizeof a, "plot --csv /nonexistent.csv --out %s", svg);
    expect(a, 1, "cannot read /nonexistent.csv");
    static const char *const bad[] = {
        "h\noneshot,kvp,16,1000\n",                 /* a field short */
        "h\noneshot,kvp,16,-5,0.1\n",               /* x <= 0 */
        "h\noneshot,kvp,16,abc,0.1\n",              /* not a number */
        "h\noneshot,kvp,16,1000,0.1,extra\n",       /* a field too many */
        "h\n",                                      /* no points */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = tu_write_tmp(bad[i], strlen(bad[i]));
        snprintf(a, sizeof a, "plot --csv %s --out %s", p, svg);
        expect(a, 1, i < 4 ? ":2: expected" : "no points");
    }
    cr_expect_neq(access(svg, F_OK), 0, "a refused plot wrote its file");
}
