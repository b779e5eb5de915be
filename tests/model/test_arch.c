/* Architectures against ggml: every model in ../shared/fixtures/arch reproduces the
 * logits ggml computed at every position (in-process and through `kvp logits`), batched
 * prefill equals decode for each, and a context-shifted key equals the key computed
 * directly at its new position in each RoPE variant. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/forward.h"
#include "model/gguf.h"
#include "model/matmul.h"
#include "model/quant.h"
#include "tests/model/testutil.h"

/* Logits within this fraction of the row's largest |logit| (the bar). */
#define TOL 1e-4f

typedef struct {
    kvp_gguf g;
    int n;              /* positions */
    int tokens[64];
    int vocab;
    const float *logits;   /* [n][vocab] */
} expected;

static void expected_open(expected *e, const char *name)
{
    char rel[128], err[256];
    snprintf(rel, sizeof rel, "fixtures/arch/%s.expected.gguf", name);
    cr_assert_eq(kvp_gguf_open(&e->g, tu_shared(rel), err, sizeof err), 0, "%s", err);
    const kvp_gguf_kv *kv = kvp_gguf_find(&e->g, "fixture.tokens");
    cr_assert(kv && kv->type == KVP_GGUF_ARRAY && kv->val.arr.type == KVP_GGUF_INT32 &&
              kv->val.arr.n > 0 && kv->val.arr.n <= 64, "%s: fixture.tokens", name);
    e->n = (int)kv->val.arr.n;
    memcpy(e->tokens, kv->val.arr.data, (size_t)e->n * sizeof(int32_t));
    const kvp_gguf_tensor *t = kvp_gguf_find_tensor(&e->g, "logits");
    cr_assert(t && t->type == KVP_GGML_F32 && t->n_dims == 2 && t->ne[1] == (uint64_t)e->n,
              "%s: logits", name);
    e->vocab = (int)t->ne[0];
    e->logits = t->data;
}

/* Worst |got - want| over a row, relative to the row's largest |want|. */
static float row_error(const float *got, const float *want, int n)
{
    float diff = 0.0f, top = 0.0f;
    for (int i = 0; i < n; i++) {
        diff = fmaxf(diff, fabsf(got[i] - want[i]));
        top = fmaxf(top, fabsf(want[i]));
    }
    return diff / top;
}

static void check_rows(const char *name, const char *how, const float *got, const expected *e)
{
    for (int p = 0; p < e->n; p++) {
        float r = row_error(got + (size_t)p * e->vocab, e->logits + (size_t)p * e->vocab, e->vocab);
        cr_expect_leq(r, TOL, "%s (%s): position %d off by %g of the largest logit", name, how, p, r);
    }
}

static const char *model_path(const char *name)
{
    static char rel[128];
    snprintf(rel, sizeof rel, "fixtures/arch/%s.gguf", name);
    return tu_shared(rel);
}

/* In-process: one causal block, and token by token (decode) through the same cache.
 * Block-quantized weights are held to 1e-4 on the exact path (tiles + sgemm prefill:
 * f32 activations); test_forward_quant.c holds the int8 prefill and decode, which
 * quantize activations as ggml does, to ggml's own quantized deviation. */
static void check_in_process(const char *name)
{
    kvp_matmul_force_prefill(KVP_PREFILL_SGEMM);
    expected e;
    expected_open(&e, name);
    kvp_model m;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, model_path(name), NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.cfg.vocab_size, e.vocab);
    kvp_runstate s;
    kvp_cache c;
    float *all = malloc((size_t)e.n * e.vocab * sizeof *all);
    cr_assert(all);
    cr_assert_eq(kvp_runstate_init(&s, &m.cfg, e.n), 0);
    cr_assert_eq(kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim, &m.cfg.rope), 0);
    cr_assert_eq(kvp_forward(&m, &s, &c, e.tokens, e.n, all), 0);
    check_rows(name, "prefill", all, &e);
    kvp_cache_reset(&c);
    /* decode of block-quantized matrices runs on 8-bit activations, which ggml's own
     * quantized path shares: test_forward_quant.c holds it to that deviation */
    int exact_decode = kvp_type_block(m.layers[0].wq.type) == 1;
    for (int p = 0; exact_decode && p < e.n; p++) {
        cr_assert_eq(kvp_forward(&m, &s, &c, &e.tokens[p], 1, NULL), 0);
        memcpy(all + (size_t)p * e.vocab, s.logits, (size_t)e.vocab * sizeof *all);
    }
    if (exact_decode)
        check_rows(name, "decode", all, &e);
    free(all);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    kvp_model_free(&m);
    kvp_gguf_close(&e.g);
    kvp_matmul_force_prefill(KVP_PREFILL_AUTO);
}

/* Through the CLI: `kvp logits` writes little-endian f32 [n][vocab] (the exact path, as
 * above: KVP_PREFILL=sgemm). */
static void check_cli(const char *name)
{
    expected e;
    expected_open(&e, name);
    char out[] = "/tmp/kvp-logits-XXXXXX", cmd[4096], list[1024];
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    close(fd);
    size_t at = 0;
    for (int p = 0; p < e.n; p++)
        at += (size_t)snprintf(list + at, sizeof list - at, p ? ",%d" : "%d", e.tokens[p]);
    snprintf(cmd, sizeof cmd, "KVP_PREFILL=sgemm %s logits --model %s --tokens %s --out %s 2>&1",
             tu_build("tools/kvp"), model_path(name), list, out);
    char *text;
    int st = tu_run(cmd, &text);
    cr_assert_eq(st, 0, "%s: %s", cmd, text);
    free(text);
    size_t len;
    unsigned char *raw = (unsigned char *)tu_slurp(out, &len);
    cr_assert_eq(len, (size_t)e.n * e.vocab * 4);
    float *got = malloc(len);
    for (size_t i = 0; i < len / 4; i++) {
        uint32_t u = raw[4 * i] | raw[4 * i + 1] << 8 | raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
        memcpy(&got[i], &u, 4);
    }
    check_rows(name, "kvp logits", got, &e);
    free(got);
    free(raw);
    remove(out);
    kvp_gguf_close(&e.g);
}

Test(arch, llama_plain) { check_in_process("llama-plain"); check_cli("llama-plain"); }
Test(arch, llama_rope_freqs) { check_in_process("llama-rope-freqs"); check_cli("llama-rope-freqs"); }
Test(arch, qwen2_bias_tied) { check_in_process("qwen2-bias-tied"); check_cli("qwen2-bias-tied"); }
Test(arch, qwen3_qknorm) { check_in_process("qwen3-qknorm"); check_cli("qwen3-qknorm"); }
Test(arch, llama_q8_0) { check_in_process("llama-q8_0"); check_cli("llama-q8_0"); }

Test(arch, loaded_shapes_follow_the_metadata)
{
    kvp_model m;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, model_path("qwen3-qknorm"), NULL, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(m.arch, "qwen3");
    cr_expect_eq(m.cfg.dim, 96);
    cr_expect_eq(m.cfg.head_dim, 32, "attention.key_length, not dim / heads = 24");
    cr_expect(m.cfg.rope.neox && m.cfg.rope.n_rot == 32 && m.cfg.rope.base == 1000000.0f);
    cr_expect(m.tied_output);
    cr_expect(m.layers[0].q_norm && m.layers[0].k_norm && !m.layers[0].bq);
    kvp_model_free(&m);
    cr_assert_eq(kvp_model_load(&m, model_path("llama-rope-freqs"), NULL, err, sizeof err), 0, "%s", err);
    cr_expect(!m.cfg.rope.neox && m.cfg.rope.factors && m.cfg.rope.base == 500000.0f);
    cr_expect(!m.tied_output);
    kvp_model_free(&m);
    cr_assert_eq(kvp_model_load(&m, model_path("qwen2-bias-tied"), NULL, err, sizeof err), 0, "%s", err);
    cr_expect(m.cfg.rope.neox && m.layers[2].bq && m.layers[2].bk && m.layers[2].bv && m.tied_output);
    cr_expect_eq(m.tok.eos_id, 2);
    kvp_model_free(&m);
}

/* Layer 0's keys depend only on the token and its position, so after a context shift
 * every kept layer-0 key must equal the key the forward pass computes for the same
 * token placed directly at the row's new position. */
static void check_shift(const char *name)
{
    kvp_model m;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, model_path(name), NULL, err, sizeof err), 0, "%s", err);
    const kvp_model_config *p = &m.cfg;
    enum { N = 40, CTX = 48, SINKS = 4 };
    int toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = (i * 37 + 11) % p->vocab_size;
    kvp_runstate s;
    kvp_cache c, one;
    cr_assert_eq(kvp_runstate_init(&s, p, N), 0);
    cr_assert_eq(kvp_cache_init(&c, p->n_layers, p->n_kv_heads, p->head_dim, &p->rope), 0);
    cr_assert_eq(kvp_cache_init(&one, p->n_layers, p->n_kv_heads, p->head_dim, &p->rope), 0);
    cr_assert_eq(kvp_forward(&m, &s, &c, toks, N, NULL), 0);
    kvp_cache_shift(&c, SINKS, CTX);
    cr_assert_eq(c.shifts, 1);
    int moved = 0, hd = p->head_dim;
    for (int kvh = 0; kvh < p->n_kv_heads; kvh++) {
        const kvp_head *h = kvp_cache_head(&c, 0, kvh);
        for (int r = 0; r < h->n; r++) {
            moved += h->pos[r] != (int)h->seq[r];
            kvp_cache_reset(&one);
            one.next_pos = h->pos[r];
            cr_assert_eq(kvp_forward(&m, &s, &one, &toks[h->seq[r]], 1, NULL), 0);
            const float *want = kvp_cache_head(&one, 0, kvh)->k, *got = (float *)h->k + (size_t)r * hd;
            float top = 0.0f, diff = 0.0f;
            for (int j = 0; j < hd; j++) {
                top = fmaxf(top, fabsf(want[j]));
                diff = fmaxf(diff, fabsf(got[j] - want[j]));
            }
            cr_assert_leq(diff, 1e-5f * fmaxf(top, 1.0f), "%s: head %d row %d (seq %lld, now at "
                          "%d): off by %g", name, kvh, r, (long long)h->seq[r], h->pos[r], diff);
        }
    }
    cr_expect_gt(moved, 0);
    kvp_cache_free(&one);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    kvp_model_free(&m);
}

Test(arch, shifted_keys_equal_direct_keys_consecutive_pairs) { check_shift("llama-plain"); }
Test(arch, shifted_keys_equal_direct_keys_frequency_factors) { check_shift("llama-rope-freqs"); }
Test(arch, shifted_keys_equal_direct_keys_neox) { check_shift("qwen2-bias-tied"); }
Test(arch, shifted_keys_equal_direct_keys_neox_qknorm) { check_shift("qwen3-qknorm"); }

/* The quantized fixtures: where the file's types load, the logits match ggml's from the
 * dequantized weights like the float files; where a type is not supported yet, the
 * load is refused with a message naming the tensor and its type. */
Test(arch, quantized_fixtures_load_or_name_the_type)
{
    static const char *const names[] = {"llama-q8_0", "llama-q6_K", "qwen2-q4_K"};
    int loaded = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        kvp_model m;
        char err[512];
        if (kvp_model_load(&m, model_path(names[i]), NULL, err, sizeof err) == 0) {
            kvp_model_free(&m);
            check_in_process(names[i]);
            loaded++;
            continue;
        }
        cr_expect(strstr(err, "tensor ") && strstr(err, "_K"), "%s: %s", names[i], err);
    }
    cr_expect_geq(loaded, 1, "Q8_0 is supported: llama-q8_0 must load");
}
