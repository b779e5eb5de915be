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

/* Logits within this fraction of the row's largest |logit| (the bar each architecture must meet). */
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
Test(arch, gemma2_softcap) { check_in_process("gemma2-softcap"); check_cli("gemma2-softcap"); }
Test(arch, gemma3_swa) { check_in_process("gemma3-swa"); check_cli("gemma3-swa"); }
Test(arch, phi3) { check_in_process("phi3"); check_cli("phi3"); }
Test(arch, phi3_swa) { check_in_process("phi3-swa"); check_cli("phi3-swa"); }

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
/* gemma3's layer 0 is a sliding-window layer with its own RoPE base; phi3-swa rotates 12
 * of 16 dims on every (windowed) layer */
Test(arch, shifted_keys_equal_direct_keys_local_rope_base) { check_shift("gemma3-swa"); }
Test(arch, shifted_keys_equal_direct_keys_partial_neox_window) { check_shift("phi3-swa"); }

/* What the loader reads from the gemma and phi3 files (README of the fixtures). */
Test(arch, gemma_phi3_metadata)
{
    kvp_model m;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, model_path("gemma2-softcap"), NULL, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(m.arch, "gemma2");
    cr_expect(m.cfg.attn_softcap == 5.0f && m.cfg.final_softcap == 30.0f && m.cfg.gelu);
    cr_expect_eq(m.cfg.embd_scale, 8.0f);
    cr_expect_eq(m.cfg.query_scale, 1.0f / sqrtf(32.0f), "1/sqrt(key_length), not dim/heads");
    cr_expect(m.layers[0].window == 8 && m.layers[1].window == 0 && m.layers[2].window == 8 &&
              m.layers[3].window == 0, "alternate layers are windowed");
    cr_expect(m.layers[3].post_attn_norm && m.layers[3].post_ffn_norm && m.tied_output);
    kvp_model_free(&m);
    cr_assert_eq(kvp_model_load(&m, model_path("gemma3-swa"), NULL, err, sizeof err), 0, "%s", err);
    for (int l = 0; l < 6; l++)
        cr_expect_eq(m.layers[l].window, l == 5 ? 0 : 8, "layer %d", l);
    cr_expect(m.cfg.rope.base == 1e6f && m.cfg.rope_base_swa == 10000.0f);
    cr_expect(m.cfg.attn_softcap == 0 && m.cfg.final_softcap == 0 && m.layers[0].k_norm);
    kvp_model_free(&m);
    cr_assert_eq(kvp_model_load(&m, model_path("phi3"), NULL, err, sizeof err), 0, "%s", err);
    cr_expect(m.cfg.rope.neox && m.cfg.rope.factors && m.cfg.swa_window == 0);
    cr_expect(fabsf(m.cfg.rope_attn_factor - 1.1902381f) < 1e-6f);
    cr_expect_eq(m.cfg.seq_len, 4096, "short rope factors: the context is held to "
                 "original_context_length");
    cr_expect(m.layers[0].wk.data == (const char *)m.layers[0].wq.data + 96 * m.layers[0].wq.row_bytes,
              "k rows follow q rows in attn_qkv");
    kvp_model_free(&m);
    cr_assert_eq(kvp_model_load(&m, model_path("phi3-swa"), NULL, err, sizeof err), 0, "%s", err);
    cr_expect(m.cfg.rope.n_rot == 12 && m.cfg.head_dim == 16 && !m.cfg.rope.factors);
    for (int l = 0; l < 3; l++)
        cr_expect_eq(m.layers[l].window, 8);
    kvp_model_free(&m);
}

/* A sliding-window layer's heads hold only their window's rows (the newest tokens, at
 * their exact positions); a global layer holds every token; decoding past the window
 * still reproduces ggml's logits (check_in_process), and the budget counts only the
 * global layers. */
Test(arch, window_bounds_the_local_layers)
{
    kvp_model m;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, model_path("gemma3-swa"), NULL, err, sizeof err), 0, "%s", err);
    const kvp_model_config *p = &m.cfg;
    enum { N = 30 };
    int toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = (i * 29 + 5) % p->vocab_size;
    kvp_runstate s;
    kvp_cache c;
    cr_assert_eq(kvp_runstate_init(&s, p, N), 0);
    cr_assert_eq(kvp_cache_init(&c, p->n_layers, p->n_kv_heads, p->head_dim, &p->rope), 0);
    cr_assert_eq(kvp_forward(&m, &s, &c, toks, 20, NULL), 0);
    for (int i = 20; i < N; i++)
        cr_assert_eq(kvp_forward(&m, &s, &c, &toks[i], 1, NULL), 0);
    for (int l = 0; l < p->n_layers; l++) {
        cr_expect_eq(kvp_cache_window(&c, l), m.layers[l].window);
        for (int kvh = 0; kvh < p->n_kv_heads; kvh++) {
            const kvp_head *h = kvp_cache_head(&c, l, kvh);
            int want = m.layers[l].window ? 7 : N;   /* the next token sees 7 + itself */
            cr_expect_eq(h->n, want, "layer %d head %d holds %d rows", l, kvh, h->n);
            for (int r = 0; r < h->n; r++)
                cr_expect(h->pos[r] == N - h->n + r && h->seq[r] == N - h->n + r);
        }
    }
    cr_expect_eq(c.evicted_rows, 0, "leaving the window is not an eviction");
    cr_expect_eq(kvp_cache_budget_heads(&c), p->n_kv_heads);
    cr_expect_eq(kvp_cache_budget_rows(&c), (size_t)N * p->n_kv_heads);
    cr_expect_eq(kvp_cache_budget_max_rows(&c), N);
    /* a snapshot keeps the windows and the local base */
    void *buf;
    size_t len;
    kvp_cache r;
    cr_assert_eq(kvp_cache_serialize(&c, &buf, &len), 0);
    cr_assert_eq(kvp_cache_deserialize(&r, buf, len, err, sizeof err), 0, "%s", err);
    cr_expect_eq(r.rope_base_swa, 10000.0f);
    for (int l = 0; l < p->n_layers; l++)
        cr_expect_eq(kvp_cache_window(&r, l), m.layers[l].window);
    /* and the restored cache decodes as the original */
    float want[512];
    cr_assert_eq(kvp_forward(&m, &s, &c, &toks[3], 1, NULL), 0);
    memcpy(want, s.logits, sizeof want);
    cr_assert_eq(kvp_forward(&m, &s, &r, &toks[3], 1, NULL), 0);
    cr_expect_eq(memcmp(want, s.logits, sizeof want), 0);
    free(buf);
    kvp_cache_free(&r);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    kvp_model_free(&m);
}

/* An architecture kvpd does not run is refused naming the key and its value. */
Test(arch, unknown_architecture_is_refused_by_name)
{
    size_t len;
    char *raw = tu_slurp(model_path("llama-plain"), &len);
    cr_assert(raw);
    /* general.architecture "llama" -> "lla_a": the same length, so the file stays valid */
    char *at = memmem(raw, len, "general.architecture", 20);
    cr_assert(at);
    char *val = memmem(at, len - (size_t)(at - raw), "llama", 5);
    cr_assert(val);
    memcpy(val, "mamba", 5);
    const char *path = tu_write_tmp(raw, len);
    kvp_model m;
    char err[512];
    cr_expect_lt(kvp_model_load(&m, path, NULL, err, sizeof err), 0);
    cr_expect(strstr(err, "general.architecture 'mamba' is not supported"), "%s", err);
    free(raw);
}

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
