/* Model loading (llama2.c and GGUF) and the reference greedy output. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "tests/model/testutil.h"

static void expect_greedy(const char *model_args)
{
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "%s generate %s --temperature 0 --steps 256 2>/dev/null",
             tu_build("tools/kvp"), model_args);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s failed", cmd);
    size_t n;
    char *want = tu_slurp(tu_shared("models/stories260K_greedy_expected.txt"), &n);
    cr_assert_eq(strlen(out), n, "length %zu, expected %zu:\n%s", strlen(out), n, out);
    cr_assert_str_eq(out, want);
    free(out);
    free(want);
}

Test(model, greedy_bin_matches_reference)
{
    char args[1024];
    snprintf(args, sizeof args, "--model %s --tokenizer %s",
             tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"));
    expect_greedy(args);
}

Test(model, greedy_gguf_matches_reference)
{
    char args[1024];
    snprintf(args, sizeof args, "--model %s", tu_shared("models/stories260K.gguf"));
    expect_greedy(args);
}

Test(model, hyperparameters_from_files)
{
    char err[256];
    kvp_model a, b;
    cr_assert_eq(kvp_model_load(&a, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_model_load(&b, tu_shared("models/stories260K.gguf"), NULL, err, sizeof err),
                 0, "%s", err);
    kvp_model_config want = {.dim = 64, .hidden_dim = 172, .n_layers = 5, .n_heads = 8,
                             .n_kv_heads = 4, .head_dim = 8, .vocab_size = 512};
    const kvp_model *ms[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        const kvp_model_config *c = &ms[i]->cfg;
        cr_expect_eq(c->dim, want.dim);
        cr_expect_eq(c->hidden_dim, want.hidden_dim);
        cr_expect_eq(c->n_layers, want.n_layers);
        cr_expect_eq(c->n_heads, want.n_heads);
        cr_expect_eq(c->n_kv_heads, want.n_kv_heads);
        cr_expect_eq(c->head_dim, want.head_dim);
        cr_expect_eq(c->vocab_size, want.vocab_size);
    }
    cr_expect(a.tied_output, "llama2.c header with positive vocab: shared classifier");
    cr_expect_not(b.tied_output, "this GGUF stores output.weight");
    cr_assert(a.output.type == KVP_GGML_F32 && b.output.type == KVP_GGML_F32);
    cr_expect_eq(memcmp(a.output.data, b.output.data, 512 * 64 * sizeof(float)), 0);
    cr_expect_eq(a.cfg.seq_len, 512);
    cr_expect_eq(b.cfg.seq_len, 2048, "GGUF metadata says 2048");
    cr_expect_eq(a.tok.vocab_size, 512);
    cr_expect_eq(b.tok.vocab_size, 512);
    kvp_model_free(&a);
    kvp_model_free(&b);
}

/* A llama2.c checkpoint cut at many lengths, or with a corrupt header: an error with a
 * message, never a crash (the sanitizer build checks reads). */
Test(model, bin_truncated_and_corrupt_headers)
{
    size_t n;
    char *buf = tu_slurp(tu_shared("models/stories260K.bin"), &n);
    char err[256];
    kvp_model m;
    size_t cuts[] = {0, 1, 4, 27, 28, 29, 100, 4096, n / 3, n / 2, n - 4, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        const char *p = tu_write_tmp(buf, cuts[i]);
        err[0] = 0;
        int rc = kvp_model_load(&m, p, tu_shared("models/tok512.bin"), err, sizeof err);
        cr_expect_lt(rc, 0, "cut at %zu loaded", cuts[i]);
        cr_expect_neq(err[0], 0, "cut at %zu: no message", cuts[i]);
        remove(p);
    }
    /* header fields: dim, hidden, layers, heads, kv_heads, vocab, seq_len */
    struct { int field; int32_t value; } bad[] = {
        {0, 0}, {0, -64}, {0, 63}, {1, 0}, {2, 0}, {2, 100000}, {3, 0}, {3, 7}, {4, 3},
        {4, 0}, {5, 0}, {5, INT32_MIN}, {5, 1 << 30}, {6, 0}, {6, -1}, {6, 1 << 30},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *copy = malloc(n);
        memcpy(copy, buf, n);
        memcpy(copy + 4 * bad[i].field, &bad[i].value, 4);
        const char *p = tu_write_tmp(copy, n);
        err[0] = 0;
        cr_expect_lt(kvp_model_load(&m, p, tu_shared("models/tok512.bin"), err, sizeof err), 0,
                     "header field %d = %d loaded", bad[i].field, bad[i].value);
        cr_expect_neq(err[0], 0);
        remove(p);
        free(copy);
    }
    free(buf);
}

Test(model, missing_files_are_errors)
{
    char err[256] = "";
    kvp_model m;
    cr_expect_lt(kvp_model_load(&m, "/nonexistent/model.bin", NULL, err, sizeof err), 0);
    cr_expect(strstr(err, "/nonexistent/model.bin"), "%s", err);
    err[0] = 0;
    cr_expect_lt(kvp_model_load(&m, tu_shared("models/stories260K.bin"), "/nonexistent/tok.bin",
                                err, sizeof err), 0);
    cr_expect_neq(err[0], 0);
}

/* The CLI answers bad model files with a message and a non-zero exit status. */
Test(model, cli_rejects_bad_files)
{
    size_t n;
    char *buf = tu_slurp(tu_shared("models/stories260K.gguf"), &n);
    const char *cut = tu_write_tmp(buf, n / 2);
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s generate --model %s --steps 4 2>&1", tu_build("tools/kvp"), cut);
    int st = tu_run(cmd, &out);
    cr_expect(st > 0, "status %d", st);
    cr_expect(strstr(out, "kvp generate:"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --steps x 2>&1", tu_build("tools/kvp"),
             tu_shared("models/stories260K.gguf"));
    cr_expect_eq(tu_run(cmd, &out), 2);
    cr_expect(strstr(out, "--steps"), "%s", out);
    free(out);
    remove(cut);
    free(buf);
}
