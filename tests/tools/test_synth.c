/* kvp synth (tools/cmd_synth.c): the files it writes load and run, in every type and
 * architecture, and bad arguments are refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/quant.h"
#include "tests/model/testutil.h"

/* ------------------------------------------------------------- kvp synth */

static char *synth(const char *args, int *status)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvp-synth-test-%d.gguf", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s synth --out %s %s 2>&1", tu_build("tools/kvp"), path, args);
    char *out;
    *status = tu_run(cmd, &out);
    free(out);
    return path;
}

Test(synth, synth_tiny_model)
{
    int st;
    const char *p = synth("--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 "
                          "--vocab 300 --ctx 128 --type f16 --seed 7", &st);
    cr_assert_eq(st, 0);
    kvp_gguf g;
    char err[256];
    cr_assert_eq(kvp_gguf_open(&g, p, err, sizeof err), 0, "%s", err);
    cr_expect_eq(g.n_tensors, 3 + 9 * 2);
    char s[64];
    cr_expect(!kvp_gguf_get_str(&g, "general.architecture", s, sizeof s) && !strcmp(s, "llama"));
    cr_expect(!kvp_gguf_get_str(&g, "tokenizer.ggml.model", s, sizeof s) && !strcmp(s, "llama"));
    cr_expect_eq(kvp_gguf_get_str(&g, "general.name", s, sizeof s), 0);
    static const struct { const char *key; uint32_t v; } u[] = {
        {"llama.context_length", 128}, {"llama.embedding_length", 64},
        {"llama.block_count", 2}, {"llama.feed_forward_length", 96},
        {"llama.attention.head_count", 4}, {"llama.attention.head_count_kv", 2},
        {"llama.rope.dimension_count", 16}, {"tokenizer.ggml.bos_token_id", 1},
        {"tokenizer.ggml.eos_token_id", 2}, {"general.file_type", 1},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        uint32_t v = 0;
        cr_expect_eq(kvp_gguf_get_u32(&g, u[i].key, &v), 0, "%s", u[i].key);
        cr_expect_eq(v, u[i].v, "%s = %u", u[i].key, v);
    }
    float f;
    cr_expect(!kvp_gguf_get_f32(&g, "llama.rope.freq_base", &f) && f == 10000.0f);
    cr_expect(!kvp_gguf_get_f32(&g, "llama.attention.layer_norm_rms_epsilon", &f) &&
              f == 1e-5f);

    const kvp_gguf_kv *toks = kvp_gguf_find(&g, "tokenizer.ggml.tokens");
    cr_assert(toks && toks->val.arr.n == 300);
    kvp_gguf_str t[300];
    cr_assert_eq(kvp_gguf_str_array(toks, t, 300), 0);
    cr_expect(t[0].len == 5 && !memcmp(t[0].ptr, "<unk>", 5));
    cr_expect(t[1].len == 3 && !memcmp(t[1].ptr, "<s>", 3));
    cr_expect(t[2].len == 4 && !memcmp(t[2].ptr, "</s>", 4));
    cr_expect(t[3].len == 6 && !memcmp(t[3].ptr, "<0x00>", 6));
    cr_expect(t[258].len == 6 && !memcmp(t[258].ptr, "<0xFF>", 6));
    const kvp_gguf_kv *tt = kvp_gguf_find(&g, "tokenizer.ggml.token_type");
    cr_assert(tt && tt->val.arr.type == KVP_GGUF_INT32 && tt->val.arr.n == 300);
    int32_t types[300];
    memcpy(types, tt->val.arr.data, sizeof types);
    cr_expect(types[0] == 2 && types[1] == 3 && types[2] == 3 && types[3] == 6 &&
              types[258] == 6 && types[259] == 1 && types[299] == 1);
    const kvp_gguf_kv *sc = kvp_gguf_find(&g, "tokenizer.ggml.scores");
    cr_assert(sc && sc->val.arr.type == KVP_GGUF_FLOAT32 && sc->val.arr.n == 300);

    static const struct { const char *name; uint64_t ne0, ne1; uint32_t type; } want[] = {
        {"token_embd.weight", 64, 300, KVP_GGML_F16}, {"output_norm.weight", 64, 1, KVP_GGML_F32},
        {"output.weight", 64, 300, KVP_GGML_F16}, {"blk.1.attn_norm.weight", 64, 1, KVP_GGML_F32},
        {"blk.1.attn_q.weight", 64, 64, KVP_GGML_F16},
        {"blk.1.attn_k.weight", 64, 32, KVP_GGML_F16},
        {"blk.1.attn_v.weight", 64, 32, KVP_GGML_F16},
        {"blk.1.attn_output.weight", 64, 64, KVP_GGML_F16},
        {"blk.0.ffn_norm.weight", 64, 1, KVP_GGML_F32},
        {"blk.0.ffn_gate.weight", 64, 96, KVP_GGML_F16},
        {"blk.0.ffn_down.weight", 96, 64, KVP_GGML_F16},
        {"blk.0.ffn_up.weight", 64, 96, KVP_GGML_F16},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kvp_gguf_tensor *x = kvp_gguf_find_tensor(&g, want[i].name);
        cr_assert(x, "%s", want[i].name);
        cr_expect(x->ne[0] == want[i].ne0 && x->ne[1] == want[i].ne1 && x->type == want[i].type,
                  "%s: [%llu, %llu] %s", want[i].name, (unsigned long long)x->ne[0],
                  (unsigned long long)x->ne[1], kvp_type_name(x->type));
        float *v = malloc(x->n_elements * sizeof *v);
        cr_assert_eq(kvp_dequantize(x->type, x->data, v, x->n_elements), 0);
        float bound = 1.0f / sqrtf((float)x->ne[0]) * 1.001f;
        double sum = 0;
        for (uint64_t j = 0; j < x->n_elements; j++) {
            if (x->ne[1] == 1 ? v[j] != 1.0f : !(fabsf(v[j]) <= bound))
                cr_assert_fail("%s[%llu] = %g", want[i].name, (unsigned long long)j,
                               (double)v[j]);
            sum += fabs(v[j]);
        }
        if (x->ne[1] > 1) /* uniform: mean |w| is about half the bound */
            cr_expect(sum / x->n_elements > 0.4 * bound, "%s mean |w| %g", want[i].name,
                      sum / x->n_elements);
        free(v);
    }
    kvp_gguf_close(&g);

    /* deterministic for a seed, different for another seed */
    size_t l1, l2, l3;
    char *a = tu_slurp(p, &l1);
    synth("--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --ctx 128 "
          "--type f16 --seed 7", &st);
    cr_assert_eq(st, 0);
    char *b = tu_slurp(p, &l2);
    synth("--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --ctx 128 "
          "--type f16 --seed 8", &st);
    cr_assert_eq(st, 0);
    char *c = tu_slurp(p, &l3);
    cr_expect(l1 == l2 && !memcmp(a, b, l1));
    cr_expect(l1 == l3 && memcmp(a, c, l1));
    free(a);
    free(b);
    free(c);
    remove(p);
}

Test(synth, synth_types)
{
    static const struct { const char *type; uint32_t t, file_type; } types[] = {
        {"f32", KVP_GGML_F32, 0}, {"q8_0", KVP_GGML_Q8_0, 7},
    };
    for (size_t i = 0; i < 2; i++) {
        char args[256];
        snprintf(args, sizeof args, "--dim 64 --hidden 128 --layers 1 --heads 2 --vocab 260 "
                 "--type %s", types[i].type);
        int st;
        const char *p = synth(args, &st);
        cr_assert_eq(st, 0, "%s", types[i].type);
        kvp_gguf g;
        char err[256];
        cr_assert_eq(kvp_gguf_open(&g, p, err, sizeof err), 0, "%s", err);
        const kvp_gguf_tensor *x = kvp_gguf_find_tensor(&g, "blk.0.ffn_down.weight");
        cr_assert(x && x->type == types[i].t && x->ne[0] == 128 && x->ne[1] == 64);
        uint32_t v;
        cr_expect(!kvp_gguf_get_u32(&g, "general.file_type", &v) && v == types[i].file_type);
        cr_expect(!kvp_gguf_get_u32(&g, "llama.attention.head_count_kv", &v) && v == 2);
        cr_expect(!kvp_gguf_get_u32(&g, "llama.context_length", &v) && v == 2048);
        kvp_gguf_close(&g);
        remove(p);
    }
}

Test(synth, synth_bad_arguments)
{
    static const char *bad[] = {
        "--dim", "--dim abc", "--dim 0", "--dim -64", "--dim 64x", "--dim 99999999999",
        "--dim 66 --heads 4", "--heads 5 --kv-heads 2", "--kv-heads 13", "--vocab 10",
        "--type q4_k_s", "--type q3_K", "--type iq4_nl", "--layers 0", "--ctx 0", "--hidden 0", "--bogus 1",
        "--dim 48 --heads 2 --type q8_0", "--dim 6 --heads 2",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st;
        char args[256];
        snprintf(args, sizeof args, "--layers 1 --vocab 300 --dim 64 --hidden 64 --heads 4 %s",
                 bad[i]);
        synth(args, &st);
        cr_expect_eq(st, 2, "'%s' exited %d", bad[i], st);
    }
    char *out;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s synth --dim 64 2>&1", tu_build("tools/kvp"));
    cr_expect_eq(tu_run(cmd, &out), 2);
    cr_expect(strstr(out, "--out"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s synth --dim 6x4 --out /tmp/x.gguf 2>&1", tu_build("tools/kvp"));
    cr_expect_eq(tu_run(cmd, &out), 2);
    cr_expect(strstr(out, "6x4"), "%s", out);
    free(out);
}

/* A synthetic model (vocabulary 300) runs 21 tokens as one block and token by token
 * through one cache: the logits agree at every position. Returns the rows layer 0's
 * first head holds at the end. */
static int expect_prefill_equals_decode(const kvp_model *m, const char *args)
{
    enum { N = 21 };
    int toks[N];
    for (int t = 0; t < N; t++)
        toks[t] = (t * 53 + 7) % 300;
    kvp_runstate s;
    kvp_cache c;
    float *all = malloc((size_t)N * 300 * sizeof *all);
    cr_assert_eq(kvp_runstate_init(&s, &m->cfg, N), 0);
    cr_assert_eq(kvp_cache_init(&c, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim,
                                &m->cfg.rope), 0);
    cr_assert_eq(kvp_forward(m, &s, &c, toks, N, all), 0);
    kvp_cache_reset(&c);
    float worst = 0.0f;
    for (int t = 0; t < N; t++) {
        cr_assert_eq(kvp_forward(m, &s, &c, &toks[t], 1, NULL), 0);
        for (int j = 0; j < 300; j++)
            worst = fmaxf(worst, fabsf(s.logits[j] - all[(size_t)t * 300 + j]));
    }
    cr_expect_leq(worst, 1e-4f, "%s: prefill and decode differ by %g", args, worst);
    int rows = kvp_cache_head(&c, 0, 0)->n;
    free(all);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    return rows;
}

/* kvp synth --arch: each family's tensors and keys, loaded as that family, and its
 * batched prefill equals token-by-token decode. */
Test(synth, synth_architectures)
{
    static const struct { const char *args, *arch; int head_dim, neox, bias, qk_norm, tied; } a[] = {
        {"--arch llama", "llama", 16, 0, 0, 0, 0},
        {"--arch qwen2 --tied", "qwen2", 16, 1, 1, 0, 1},
        {"--arch qwen3 --head-dim 24 --rope-base 5e5", "qwen3", 24, 1, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 "
                 "--vocab 300 --ctx 128 --seed 3 %s", a[i].args);
        int st;
        const char *p = synth(args, &st);
        cr_assert_eq(st, 0, "%s", args);
        kvp_model m;
        char err[512];
        cr_assert_eq(kvp_model_load(&m, p, NULL, err, sizeof err), 0, "%s: %s", args, err);
        cr_expect_str_eq(m.arch, a[i].arch);
        cr_expect_eq(m.cfg.head_dim, a[i].head_dim, "%s", args);
        cr_expect_eq(m.cfg.rope.n_rot, a[i].head_dim);
        cr_expect_eq(m.cfg.rope.neox, a[i].neox, "%s", args);
        cr_expect_eq(m.cfg.rope.base, i == 2 ? 5e5f : a[i].neox ? 1e6f : 1e4f, "%s", args);
        cr_expect_eq(!!m.layers[1].bq, a[i].bias, "%s", args);
        cr_expect_eq(!!m.layers[1].bv, a[i].bias, "%s", args);
        cr_expect_eq(!!m.layers[1].k_norm, a[i].qk_norm, "%s", args);
        cr_expect_eq(m.tied_output, a[i].tied, "%s", args);
        cr_expect_eq(m.cfg.vocab_size, 300);
        expect_prefill_equals_decode(&m, args);
        kvp_model_free(&m);
        remove(p);
    }
    int st;
    static const char *bad[] = {"--arch gpt2", "--arch", "--head-dim 7", "--head-dim 0",
                                "--rope-base 0", "--rope-base nan", "--rope-base -5",
                                "--head-dim 20 --type q8_0 --dim 64 --hidden 64"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "--layers 1 --vocab 300 --dim 64 --hidden 64 --heads 4 %s",
                 bad[i]);
        synth(args, &st);
        cr_expect_eq(st, 2, "'%s' exited %d", bad[i], st);
    }
}

/* kvp synth --arch gemma2|gemma3|phi3: Gemma's post-norms and softcaps, gemma3's q/k
 * norms, phi3's fused tensors, each family's windowed layers; a window shorter than the
 * sequence and batched prefill still equal token-by-token decode. */
Test(synth, synth_windowed_architectures)
{
    static const struct { const char *arch; int windowed[6], qk_norm, post, gelu; } a[] = {
        {"gemma2", {1, 0, 1, 0, 1, 0}, 0, 1, 1},
        {"gemma3", {1, 1, 1, 1, 1, 0}, 1, 1, 1},
        {"phi3", {1, 1, 1, 1, 1, 1}, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "--dim 64 --hidden 96 --layers 6 --heads 4 --kv-heads 2 "
                 "--vocab 300 --ctx 128 --seed 5 --window 6 --arch %s", a[i].arch);
        int st;
        const char *p = synth(args, &st);
        cr_assert_eq(st, 0, "%s", args);
        kvp_model m;
        char err[512];
        cr_assert_eq(kvp_model_load(&m, p, NULL, err, sizeof err), 0, "%s: %s", args, err);
        cr_expect_str_eq(m.arch, a[i].arch);
        for (int l = 0; l < 6; l++)
            cr_expect_eq(m.layers[l].window, a[i].windowed[l] ? 6 : 0, "%s layer %d", a[i].arch, l);
        cr_expect_eq(!!m.layers[0].k_norm, a[i].qk_norm, "%s", args);
        cr_expect_eq(!!m.layers[0].post_ffn_norm, a[i].post, "%s", args);
        cr_expect_eq(m.cfg.gelu, a[i].gelu, "%s", args);
        cr_expect_eq(m.cfg.attn_softcap, !strcmp(a[i].arch, "gemma2") ? 50.0f : 0.0f);
        cr_expect_eq(expect_prefill_equals_decode(&m, args), 5,
                     "%s: a windowed layer holds its window", args);
        kvp_model_free(&m);
        remove(p);
    }
    int st;
    synth("--layers 1 --vocab 300 --dim 64 --hidden 64 --heads 4 --arch qwen2 --window 8", &st);
    cr_expect_eq(st, 2, "a window for an architecture without one");
}

/* kvp synth --chain: after each listed token the next one is the most likely by far,
 * whatever came before it (llama and qwen2, with a prompt of other tokens first); bad
 * lists are refused. */
Test(synth, synth_chain_makes_a_known_reply)
{
    static const int chain[] = {17, 250, 3, 99, 42, 299};
    enum { N = sizeof chain / sizeof chain[0] };
    static const char *const arch[] = {"llama", "qwen2"};
    for (size_t a = 0; a < 2; a++) {
        char args[256];
        snprintf(args, sizeof args, "--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 "
                 "--vocab 300 --ctx 128 --arch %s --chain 17,250,3,99,42,299", arch[a]);
        int st;
        const char *p = synth(args, &st);
        cr_assert_eq(st, 0, "%s", args);
        kvp_model m;
        char err[512];
        cr_assert_eq(kvp_model_load(&m, p, NULL, err, sizeof err), 0, "%s: %s", args, err);
        kvp_runstate s;
        kvp_cache c;
        cr_assert_eq(kvp_runstate_init(&s, &m.cfg, 8), 0);
        cr_assert_eq(kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim,
                                    &m.cfg.rope), 0);
        int prompt[4] = {5, 77, 123, chain[0]};
        cr_assert_eq(kvp_forward(&m, &s, &c, prompt, 4, NULL), 0);
        for (int k = 1; k < N; k++) {
            int best = 0;
            for (int j = 1; j < 300; j++)
                if (s.logits[j] > s.logits[best])
                    best = j;
            float second = -1e30f;
            for (int j = 0; j < 300; j++)
                if (j != best && s.logits[j] > second)
                    second = s.logits[j];
            cr_expect_eq(best, chain[k], "%s: after %d comes %d, not %d", arch[a], chain[k - 1],
                         best, chain[k]);
            cr_expect_gt(s.logits[best] - second, 20.0f, "%s: a margin of %g", arch[a],
                         s.logits[best] - second);
            cr_assert_eq(kvp_forward(&m, &s, &c, &chain[k], 1, NULL), 0);
        }
        kvp_cache_free(&c);
        kvp_runstate_free(&s);
        kvp_model_free(&m);
        remove(p);
    }
    static const char *bad[] = {"--chain", "--chain 5", "--chain 5,5", "--chain 5,,6",
                                "--chain 5,x", "--chain 5,", "--chain ,5", "--chain 5,300",
                                "--chain 5,-1", "--chain 1,2 --tied",
                                "--chain 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,"
                                "21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,"
                                "42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,"
                                "63,64"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[512];
        snprintf(args, sizeof args, "--layers 1 --vocab 300 --dim 64 --hidden 64 --heads 4 %s",
                 bad[i]);
        int st;
        synth(args, &st);
        cr_expect_eq(st, 2, "'%s' exited %d", bad[i], st);
    }
}
