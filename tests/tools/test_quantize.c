/* `kvp quantize` and `kvp synth --type`: argument errors, the per-tensor type choice of
 * the mixtures (tools/quantmix.h), and quantized files that load and compute close to
 * the f32 model (ggml's llama-plain fixture). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
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

static const char *tmp_path(const char *tag)
{
    static char buf[4][256];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "/tmp/kvp-test-quantize-%ld-%s.gguf", (long)getpid(), tag);
    return b;
}

static uint32_t type_of(const kvp_gguf *g, const char *name)
{
    const kvp_gguf_tensor *t = kvp_gguf_find_tensor(g, name);
    cr_assert(t, "no tensor %s", name);
    return t->type;
}

Test(quantize, bad_arguments)
{
    char in[512], a[1024];
    snprintf(in, sizeof in, "%s", tu_shared("fixtures/arch/llama-plain.gguf"));
    expect("quantize", 2, "--in, --out and --type are required");
    expect("quantize --help", 0, "q4_K_M");
    snprintf(a, sizeof a, "quantize --in %s --out /tmp/x.gguf --type q3_K_M", in);
    expect(a, 2, "unknown --type 'q3_K_M'");
    snprintf(a, sizeof a, "quantize --in %s --out /tmp/x.gguf --type iq4_nl", in);
    expect(a, 2, "unknown --type");
    expect("quantize --in /nonexistent.gguf --out /tmp/x.gguf --type q8_0", 1, "nonexistent");
    snprintf(a, sizeof a, "quantize --in %s --out /tmp/x.gguf --type q8_0",
             tu_shared("models/stories260K.bin"));
    expect(a, 1, "kvp quantize");
    expect("quantize --in a --bogus b", 2, "unknown option '--bogus'");
    expect("quantize --in", 2, "--in needs a value");
    /* an unwritable destination: no partial file, status 1 */
    snprintf(a, sizeof a, "quantize --in %s --out /nonexistent/dir/x.gguf --type q8_0", in);
    expect(a, 1, "/nonexistent/dir/x.gguf");
    expect("synth --out /tmp/x.gguf --type q7_0", 2, "unknown --type 'q7_0'");
    expect("synth --out /tmp/x.gguf --type q8_0 --dim 48 --heads 4", 2, "multiples of 32");
}

/* Logits of the fixture's tokens as one prefill block. */
static float *logits_of(const char *path, int *vocab, int tokens[24])
{
    kvp_model m;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, path, NULL, err, sizeof err), 0, "%s", err);
    kvp_runstate s;
    kvp_cache c;
    cr_assert_eq(kvp_runstate_init(&s, &m.cfg, 24), 0);
    cr_assert_eq(kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim,
                                &m.cfg.rope), 0);
    *vocab = m.cfg.vocab_size;
    float *out = malloc((size_t)24 * m.cfg.vocab_size * sizeof *out);
    cr_assert_eq(kvp_forward(&m, &s, &c, tokens, 24, out), 0);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    kvp_model_free(&m);
    return out;
}

/* max |a - b| relative to max |b| */
static double rel_err(const float *a, const float *b, size_t n)
{
    double e = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        top = fmax(top, fabs((double)b[i]));
    }
    return e / top;
}

Test(quantize, llama_plain_to_q8_0_and_q4_K_M)
{
    char in[512], err[512], a[1024];
    snprintf(in, sizeof in, "%s", tu_shared("fixtures/arch/llama-plain.gguf"));
    kvp_gguf want;
    cr_assert_eq(kvp_gguf_open(&want, tu_shared("fixtures/arch/llama-plain.expected.gguf"), err,
                               sizeof err), 0, "%s", err);
    int tokens[24];
    memcpy(tokens, kvp_gguf_find(&want, "fixture.tokens")->val.arr.data, sizeof tokens);
    const float *ref = kvp_gguf_find_tensor(&want, "logits")->data;

    static const struct { const char *type; double max_rel; uint32_t q, down0, output; } cases[] = {
        /* rows of 128 and 320: the K types fall back (q4_K -> q5_0, q6_K -> q8_0); with
         * 3 layers, layer 0 gets no extra bits */
        {"q8_0", 0.02, KVP_GGML_Q8_0, KVP_GGML_Q8_0, KVP_GGML_Q8_0},
        {"q4_K_M", 0.15, KVP_GGML_Q5_0, KVP_GGML_Q5_0, KVP_GGML_Q8_0},
        {"q4_0", 0.35, KVP_GGML_Q4_0, KVP_GGML_Q4_0, KVP_GGML_Q4_0},
        {"f16", 0.002, KVP_GGML_F16, KVP_GGML_F16, KVP_GGML_F16},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *out = tmp_path(cases[k].type);
        snprintf(a, sizeof a, "quantize --in %s --out %s --type %s", in, out, cases[k].type);
        expect(a, 0, "wrote");
        kvp_gguf g;
        cr_assert_eq(kvp_gguf_open(&g, out, err, sizeof err), 0, "%s", err);
        cr_expect_eq(type_of(&g, "blk.0.attn_q.weight"), cases[k].q, "%s", cases[k].type);
        cr_expect_eq(type_of(&g, "blk.0.ffn_down.weight"), cases[k].down0, "%s", cases[k].type);
        cr_expect_eq(type_of(&g, "output.weight"), cases[k].output, "%s", cases[k].type);
        cr_expect_eq(type_of(&g, "blk.0.attn_norm.weight"), KVP_GGML_F32);
        kvp_gguf_close(&g);
        int vocab;
        float *got = logits_of(out, &vocab, tokens);
        double e = rel_err(got, ref, (size_t)24 * vocab);
        cr_expect(e < cases[k].max_rel, "%s: logits off by %.3g of the largest", cases[k].type, e);
        cr_expect(e > 0, "%s: identical logits: were the weights converted?", cases[k].type);
        free(got);
        unlink(out);
    }
    kvp_gguf_close(&want);
}

/* rows of 256: the K types proper, and llama.cpp's use_more_bits layers */
Test(quantize, synth_q4_K_M_mixture)
{
    const char *out = tmp_path("synth");
    char a[1024], err[512];
    snprintf(a, sizeof a, "synth --out %s --dim 256 --hidden 512 --layers 8 --heads 4 "
             "--kv-heads 2 --vocab 300 --type q4_K_M --tied", out);
    expect(a, 0, "wrote");
    kvp_gguf g;
    cr_assert_eq(kvp_gguf_open(&g, out, err, sizeof err), 0, "%s", err);
    cr_expect_null(kvp_gguf_find_tensor(&g, "output.weight"));
    cr_expect_eq(type_of(&g, "token_embd.weight"), KVP_GGML_Q6_K, "tied: the embedding is the output");
    /* 8 layers: more bits for layer 0 (first eighth), 7 (last eighth), 3 and 6 */
    static const int more[8] = {1, 0, 0, 1, 0, 0, 1, 1};
    for (int l = 0; l < 8; l++) {
        char n[64];
        snprintf(n, sizeof n, "blk.%d.ffn_down.weight", l);
        uint32_t down = type_of(&g, n);
        snprintf(n, sizeof n, "blk.%d.attn_v.weight", l);
        uint32_t v = type_of(&g, n);
        snprintf(n, sizeof n, "blk.%d.ffn_up.weight", l);
        cr_expect_eq(type_of(&g, n), KVP_GGML_Q4_K);
        /* ffn_down rows are 512 long, attn_v rows 256 */
        cr_expect_eq(down, more[l] ? KVP_GGML_Q6_K : KVP_GGML_Q4_K, "layer %d ffn_down %s", l,
                     kvp_type_name(down));
        cr_expect_eq(v, more[l] ? KVP_GGML_Q6_K : KVP_GGML_Q4_K, "layer %d attn_v %s", l,
                     kvp_type_name(v));
    }
    uint32_t ft;
    cr_expect(kvp_gguf_get_u32(&g, "general.file_type", &ft) == 0 && ft == 15, "LLAMA_FTYPE_MOSTLY_Q4_K_M");
    kvp_gguf_close(&g);
    kvp_model m;
    cr_assert_eq(kvp_model_load(&m, out, NULL, err, sizeof err), 0, "%s", err);
    cr_expect(m.tied_output);
    char mix[256];
    kvp_model_weight_mix(&m, mix, sizeof mix);
    cr_expect(strstr(mix, "Q4_K") && strstr(mix, "Q6_K") && strstr(mix, "F32"), "%s", mix);
    kvp_model_free(&m);
    unlink(out);
}
