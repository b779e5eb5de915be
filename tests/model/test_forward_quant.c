/* The forward pass on quantized weights against ggml's fixtures
 * (../shared/fixtures/arch/NAME.gguf and NAME.expected.gguf): the exact path (weights
 * decoded to f32, f32 activations: a prefill block on the tiles + sgemm path) within
 * 1e-4 of `logits`; the decode path and the int8 GEMM prefill (8-bit activations) about
 * as far from `logits` as ggml's own quantized path (`logits_ggml_quantized`). meson
 * runs it with the CPU's kernels and KVP_SIMD=scalar. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/matmul.h"
#include "model/model.h"
#include "testutil.h"

enum { N_TOK = 24 };

typedef struct fixture {
    kvp_model m;
    kvp_gguf want;
    int tokens[N_TOK];
    const float *logits, *ggml_quantized;  /* [N_TOK][vocab] */
} fixture;

static void load(fixture *f, const char *name)
{
    char path[256], err[512];
    snprintf(path, sizeof path, "fixtures/arch/%s.gguf", name);
    cr_assert_eq(kvp_model_load(&f->m, tu_shared(path), NULL, err, sizeof err), 0, "%s", err);
    snprintf(path, sizeof path, "fixtures/arch/%s.expected.gguf", name);
    cr_assert_eq(kvp_gguf_open(&f->want, tu_shared(path), err, sizeof err), 0, "%s", err);
    const kvp_gguf_kv *kv = kvp_gguf_find(&f->want, "fixture.tokens");
    cr_assert(kv && kv->type == KVP_GGUF_ARRAY && kv->val.arr.n == N_TOK &&
              (kv->val.arr.type == KVP_GGUF_INT32 || kv->val.arr.type == KVP_GGUF_UINT32));
    memcpy(f->tokens, kv->val.arr.data, sizeof f->tokens);
    const kvp_gguf_tensor *l = kvp_gguf_find_tensor(&f->want, "logits");
    const kvp_gguf_tensor *q = kvp_gguf_find_tensor(&f->want, "logits_ggml_quantized");
    cr_assert(l && q && l->ne[0] == (uint64_t)f->m.cfg.vocab_size && l->ne[1] == N_TOK);
    f->logits = l->data;
    f->ggml_quantized = q->data;
}

static void unload(fixture *f)
{
    kvp_gguf_close(&f->want);
    kvp_model_free(&f->m);
}

/* Runs the tokens as one block (block = 1: one at a time) and returns all logits. */
static float *run(const fixture *f, int block)
{
    int V = f->m.cfg.vocab_size;
    float *out = malloc((size_t)N_TOK * V * sizeof *out);
    kvp_runstate s;
    kvp_cache c;
    cr_assert_eq(kvp_runstate_init(&s, &f->m.cfg, N_TOK), 0);
    cr_assert_eq(kvp_cache_init(&c, f->m.cfg.n_layers, f->m.cfg.n_kv_heads, f->m.cfg.head_dim,
                                &f->m.cfg.rope), 0);
    for (int t = 0; t < N_TOK; t += block)
        cr_assert_eq(kvp_forward(&f->m, &s, &c, f->tokens + t, block, out + (size_t)t * V), 0);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    return out;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void check(const char *name, uint32_t matrix_type)
{
    fixture f;
    load(&f, name);
    cr_assert_eq(f.m.layers[0].wq.type, matrix_type, "%s keeps its matrices in their type", name);
    size_t n = (size_t)N_TOK * f.m.cfg.vocab_size;
    double top = max_diff(f.logits, (float[1]){0}, 1);
    for (size_t i = 0; i < n; i++)
        top = fmax(top, fabs(f.logits[i]));

    kvp_matmul_force_prefill(KVP_PREFILL_SGEMM);
    float *exact = run(&f, N_TOK);
    kvp_matmul_force_prefill(KVP_PREFILL_AUTO);
    double e = max_diff(exact, f.logits, n);
    cr_expect(e <= 1e-4, "%s exact path: max |logit error| %.3g > 1e-4", name, e);

    float *fast = run(&f, 1);
    double ggml = max_diff(f.ggml_quantized, f.logits, n), got = max_diff(fast, f.logits, n);
    cr_expect(got <= 1.25 * ggml, "%s decode path (%s): max |logit error| %.4g, ggml's quantized "
              "path %.4g (largest logit %.3g)", name, kvp_matmul_simd(), got, ggml, top);
    cr_expect(got > 1e-4, "%s decode path: suspiciously exact (%.3g): are activations quantized?",
              name, got);

    cr_assert_str_eq(kvp_matmul_prefill_path(matrix_type), "int8");
    float *gemm = run(&f, N_TOK);
    double prefill = max_diff(gemm, f.logits, n);
    cr_expect(prefill <= 1.25 * ggml, "%s int8 prefill (%s): max |logit error| %.4g, ggml's "
              "quantized path %.4g", name, kvp_matmul_simd(), prefill, ggml);
    cr_expect(prefill > 1e-4, "%s int8 prefill: suspiciously exact (%.3g)", name, prefill);
    free(gemm);
    free(exact);
    free(fast);
    unload(&f);
}

Test(forward_quant, llama_q8_0) { check("llama-q8_0", KVP_GGML_Q8_0); }
Test(forward_quant, llama_q6_K) { check("llama-q6_K", KVP_GGML_Q6_K); }
Test(forward_quant, qwen2_q4_K) { check("qwen2-q4_K", KVP_GGML_Q4_K); }
