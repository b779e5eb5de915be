/* Model loading (llama2.c and GGUF: every architecture, hostile shapes, floats and
 * tensors) and the reference greedy output. */
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

/* ---- GGUF models written in memory ---- */

/* ------------------------------------------------- model metadata and tensors */

/* A tiny model of any architecture, valid by default; each corruption test changes one
 * field. Integer fields < 0 and NULL strings mean "absent". */
typedef struct mspec {
    const char *arch;
    long dim, hidden, layers, heads, kv_heads, key_length, value_length, rope_dims;
    long vocab_meta, q_rows;       /* ARCH.vocab_size; rows of attn_q (default heads x hd) */
    const char *eps_str;           /* the epsilon written as a string: a wrong type */
    float eps, base;
    long rope_freqs;               /* length of rope_freqs.weight (0: none) */
    float rope_freq_value;
    long bias;                     /* 1: attn_{q,k,v}.bias */
    long bias_k_len;               /* length of attn_k.bias (default kv dim) */
    long qk_norm;                  /* length of attn_{q,k}_norm.weight (0: none) */
    long k_norm_len;
    long output_rows;              /* rows of output.weight (0: tied) */
    const char *skip;              /* a tensor left out */
    long eos, eot;                 /* tokenizer.ggml.{eos,eot}_token_id */
} mspec;

#define MS_VOCAB 8

static mspec mspec_of(const char *arch)
{
    mspec s = {.arch = arch, .dim = 32, .hidden = 48, .layers = 2, .heads = 4, .kv_heads = 2,
               .key_length = -1, .value_length = -1, .rope_dims = -1, .vocab_meta = MS_VOCAB,
               .q_rows = -1, .eps = 1e-6f, .base = 10000.0f, .rope_freq_value = 1.0f,
               .bias_k_len = -1, .k_norm_len = -1, .output_rows = MS_VOCAB, .eos = 2, .eot = 7};
    if (!strcmp(arch, "qwen2")) {
        s.bias = 1;
        s.output_rows = 0;
    } else if (!strcmp(arch, "qwen3")) {
        s.key_length = 16;   /* 4 heads x 16 != dim 32 */
        s.qk_norm = 16;
        s.output_rows = 0;
    } else {
        s.rope_freqs = 4;    /* llama 3.1 style: head 8 -> 4 pairs */
    }
    return s;
}

typedef struct { float freq; uint64_t n_freq_tensor; } mfill_ctx;
static mfill_ctx g_mfill;

static int mfill(void *ctx, uint64_t i, void *buf, uint64_t n)
{
    (void)ctx;
    float *f = buf;
    for (uint64_t j = 0; j < n / 4; j++)
        f[j] = i == g_mfill.n_freq_tensor ? g_mfill.freq : 0.01f * (float)((j * 7 + i) % 13);
    return 0;
}

/* Writes the model to a temp file and loads it; returns the load code, message in err. */
static int load_spec(const mspec *s, char *err, size_t errlen)
{
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert(w);
    char k[96];
    const char *a = s->arch;
    kvp_gguf_writer_add_str(w, "general.architecture", a);
#define U(suffix, v) if ((v) >= 0) { snprintf(k, sizeof k, "%s." suffix, a); \
                                     kvp_gguf_writer_add_u32(w, k, (uint32_t)(v)); }
    U("embedding_length", s->dim)
    U("feed_forward_length", s->hidden)
    U("block_count", s->layers)
    U("attention.head_count", s->heads)
    U("attention.head_count_kv", s->kv_heads)
    U("attention.key_length", s->key_length)
    U("attention.value_length", s->value_length)
    U("rope.dimension_count", s->rope_dims)
    U("vocab_size", s->vocab_meta)
#undef U
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", a);
    if (s->eps_str)
        kvp_gguf_writer_add_str(w, k, s->eps_str);
    else
        kvp_gguf_writer_add_f32(w, k, s->eps);
    snprintf(k, sizeof k, "%s.rope.freq_base", a);
    kvp_gguf_writer_add_f32(w, k, s->base);
    static const char *const toks[MS_VOCAB] = {"<unk>", "<s>", "</s>", "a", "b", "c", "d", "e"};
    kvp_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
    kvp_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", toks, MS_VOCAB);
    if (s->eos >= 0)
        kvp_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)s->eos);
    if (s->eot >= 0)
        kvp_gguf_writer_add_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)s->eot);

    uint64_t d = (uint64_t)s->dim, hid = s->hidden > 0 ? (uint64_t)s->hidden : 48;
    /* tensors for hostile metadata stay small: the loader must refuse before reading them */
    uint64_t heads = s->heads > 0 ? (uint64_t)s->heads : 1;
    uint64_t hd = s->key_length > 0 && s->key_length <= 64 ? (uint64_t)s->key_length : d / heads;
    uint64_t qd = s->q_rows > 0 ? (uint64_t)s->q_rows : hd * heads;
    uint64_t kvd = hd * (uint64_t)(s->kv_heads > 0 ? s->kv_heads : 1);
    g_mfill = (mfill_ctx){s->rope_freq_value, UINT64_MAX};
    uint64_t n_t = 0;
#define T(name, e0, e1) do { if (!s->skip || strcmp(s->skip, name)) { \
        uint64_t ne[2] = {(e0), (e1)};                                    \
        cr_assert_eq(kvp_gguf_writer_add_tensor(w, name, KVP_GGML_F32, ne[1] > 1 ? 2 : 1, ne), 0); \
        n_t++; } } while (0)
    T("token_embd.weight", d, MS_VOCAB);
    T("output_norm.weight", d, 1);
    if (s->output_rows)
        T("output.weight", d, (uint64_t)s->output_rows);
    if (s->rope_freqs) {
        g_mfill.n_freq_tensor = n_t;
        T("rope_freqs.weight", (uint64_t)s->rope_freqs, 1);
    }
    for (long l = 0; l < s->layers; l++) {
        char n[64];
#define B(suffix, e0, e1) do { snprintf(n, sizeof n, "blk.%ld." suffix, l); T(n, e0, e1); } while (0)
        B("attn_norm.weight", d, 1);
        B("attn_q.weight", d, qd);
        B("attn_k.weight", d, kvd);
        B("attn_v.weight", d, kvd);
        B("attn_output.weight", qd, d);
        B("ffn_norm.weight", d, 1);
        B("ffn_gate.weight", d, hid);
        B("ffn_down.weight", hid, d);
        B("ffn_up.weight", d, hid);
        if (s->bias) {
            B("attn_q.bias", qd, 1);
            B("attn_k.bias", s->bias_k_len > 0 ? (uint64_t)s->bias_k_len : kvd, 1);
            B("attn_v.bias", kvd, 1);
        }
        if (s->qk_norm) {
            B("attn_q_norm.weight", (uint64_t)s->qk_norm, 1);
            B("attn_k_norm.weight", s->k_norm_len > 0 ? (uint64_t)s->k_norm_len : (uint64_t)s->qk_norm, 1);
        }
#undef B
    }
#undef T
    size_t len;
    uint8_t *buf = tu_gguf_to_mem(w, mfill, &len);
    kvp_gguf_writer_free(w);
    const char *p = tu_write_tmp(buf, len);
    free(buf);
    kvp_model m;
    err[0] = 0;
    int rc = kvp_model_load(&m, p, NULL, err, errlen);
    if (!rc) {
        /* a loaded model runs */
        kvp_runstate st;
        kvp_cache c;
        int toks2[3] = {1, 5, 6};
        cr_assert_eq(kvp_runstate_init(&st, &m.cfg, 3), 0);
        cr_assert_eq(kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim, &m.cfg.rope), 0);
        cr_assert_eq(kvp_forward(&m, &st, &c, toks2, 3, NULL), 0);
        for (int i = 0; i < MS_VOCAB; i++)
            cr_assert(isfinite(st.logits[i]), "%s: logit %d = %g", a, i, st.logits[i]);
        cr_expect_eq(m.tok.eos_id, s->eos >= 0 ? s->eos : 2, "EOS from the metadata");
        cr_expect_eq(m.tok.eot_id, s->eot, "end of turn from the metadata");
        kvp_cache_free(&c);
        kvp_runstate_free(&st);
        kvp_model_free(&m);
    }
    remove(p);
    return rc;
}

static void expect_refused(const mspec *s, const char *want, const char *what)
{
    char err[512];
    int rc = load_spec(s, err, sizeof err);
    cr_expect_lt(rc, 0, "%s (%s) loaded", what, s->arch);
    cr_expect(strstr(err, want), "%s (%s): message '%s' lacks '%s'", what, s->arch, err, want);
}

Test(model, model_architectures_load)
{
    static const char *const archs[] = {"llama", "mistral", "qwen2", "qwen3"};
    for (size_t i = 0; i < 4; i++) {
        mspec s = mspec_of(archs[i]);
        char err[512];
        cr_expect_eq(load_spec(&s, err, sizeof err), 0, "%s: %s", archs[i], err);
    }
    /* partial rotary and absent optional keys load too */
    mspec s = mspec_of("qwen3");
    s.rope_dims = 8;
    s.vocab_meta = -1;
    s.value_length = 16;
    s.eot = -1;
    s.eos = 5;
    char err[512];
    cr_expect_eq(load_spec(&s, err, sizeof err), 0, "%s", err);
    s = mspec_of("qwen2");
    s.eot = MS_VOCAB;
    expect_refused(&s, "tokenizer.ggml.eot_token_id 8 is outside the vocabulary", "EOT beyond the vocabulary");
    s = mspec_of("qwen2");
    s.eos = 1000;
    expect_refused(&s, "tokenizer.ggml.eos_token_id", "EOS beyond the vocabulary");
}

Test(model, model_bad_architecture_and_shapes)
{
    mspec s = mspec_of("gpt2");
    expect_refused(&s, "general.architecture 'gpt2'", "unknown architecture");
    static const char *const archs[] = {"llama", "qwen2", "qwen3"};
    for (size_t i = 0; i < 3; i++) {
        const char *a = archs[i];
        char key[96];
        s = mspec_of(a);
        s.kv_heads = 3;
        snprintf(key, sizeof key, "%s.attention.head_count_kv", a);
        expect_refused(&s, key, "KV heads that do not divide the heads");
        s = mspec_of(a);
        s.kv_heads = 0;
        expect_refused(&s, key, "no KV heads");
        s = mspec_of(a);
        s.heads = 0;
        snprintf(key, sizeof key, "%s.attention.head_count", a);
        expect_refused(&s, key, "no heads");
        s = mspec_of(a);
        s.dim = 34;     /* 4 heads do not divide it and there is no key_length */
        s.key_length = -1;
        s.qk_norm = s.qk_norm ? 8 : 0;
        s.rope_freqs = 0;
        expect_refused(&s, key, "heads that do not divide the width");
        s = mspec_of(a);
        s.key_length = 1 << 20;
        snprintf(key, sizeof key, "%s.attention.key_length", a);
        expect_refused(&s, key, "huge key_length");
        s = mspec_of(a);
        s.key_length = 0xFFFFFFF0l;
        expect_refused(&s, key, "key_length beyond int");
        s = mspec_of(a);
        s.value_length = 24;
        snprintf(key, sizeof key, "%s.attention.value_length", a);
        expect_refused(&s, key, "value_length != key_length");
        s = mspec_of(a);
        s.rope_dims = s.key_length > 0 ? s.key_length + 2 : 10;
        s.rope_freqs = 0;
        snprintf(key, sizeof key, "%s.rope.dimension_count", a);
        expect_refused(&s, key, "rope dims beyond the head");
        s.rope_dims = 5;
        expect_refused(&s, key, "odd rope dims");
        s = mspec_of(a);
        s.vocab_meta = MS_VOCAB + 1;
        snprintf(key, sizeof key, "%s.vocab_size", a);
        expect_refused(&s, key, "vocab_size that disagrees with token_embd");
        s = mspec_of(a);
        s.layers = 0;
        snprintf(key, sizeof key, "%s.block_count", a);
        expect_refused(&s, key, "no layers");
        s = mspec_of(a);
        s.hidden = -1;
        snprintf(key, sizeof key, "missing metadata %s.feed_forward_length", a);
        expect_refused(&s, key, "missing key");
    }
}

Test(model, model_hostile_floats)
{
    static const char *const archs[] = {"llama", "qwen2", "qwen3"};
    const float bad[] = {-1e-6f, 0.0f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 3; i++) {
        char key[96];
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
            mspec s = mspec_of(archs[i]);
            s.eps = bad[j];
            snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", archs[i]);
            expect_refused(&s, key, "bad epsilon");
            s = mspec_of(archs[i]);
            s.base = bad[j];
            snprintf(key, sizeof key, "%s.rope.freq_base", archs[i]);
            expect_refused(&s, key, "bad freq_base");
        }
        mspec s = mspec_of(archs[i]);
        s.eps_str = "1e-6";
        snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon has a wrong type", archs[i]);
        expect_refused(&s, key, "epsilon as a string");
    }
}

Test(model, model_bad_tensors)
{
    mspec s = mspec_of("llama");
    s.rope_freqs = 3;
    expect_refused(&s, "rope_freqs.weight has shape [3, 1], expected [4, 1]", "short rope_freqs");
    s.rope_freqs = 8;
    expect_refused(&s, "rope_freqs.weight", "long rope_freqs");
    const float bad[] = {0.0f, -2.0f, NAN, INFINITY};
    for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
        s = mspec_of("llama");
        s.rope_freq_value = bad[j];
        expect_refused(&s, "rope_freqs.weight[0]", "non-positive rope_freqs");
    }
    s = mspec_of("llama");
    s.output_rows = MS_VOCAB - 1;
    expect_refused(&s, "output.weight", "output rows != vocab");
    s = mspec_of("qwen2");
    s.skip = "blk.1.attn_v.bias";
    expect_refused(&s, "missing tensor blk.1.attn_v.bias", "qwen2 without a V bias");
    s = mspec_of("qwen2");
    s.bias_k_len = 24;
    expect_refused(&s, "blk.0.attn_k.bias", "K bias of the wrong length");
    s = mspec_of("llama");
    s.bias = 1;
    s.bias_k_len = 24;
    expect_refused(&s, "blk.0.attn_k.bias", "llama's optional K bias of the wrong length");
    s = mspec_of("qwen3");
    s.skip = "blk.0.attn_q_norm.weight";
    expect_refused(&s, "missing tensor blk.0.attn_q_norm.weight", "qwen3 without q norm");
    s = mspec_of("qwen3");
    s.k_norm_len = 8;
    expect_refused(&s, "blk.0.attn_k_norm.weight", "k norm of the wrong length");
    s = mspec_of("qwen3");
    s.q_rows = 32;   /* dim / heads x heads instead of key_length x heads */
    expect_refused(&s, "blk.0.attn_q.weight", "Q sized for dim / heads");
    s = mspec_of("qwen3");
    s.key_length = -1;    /* dim / heads = 8, but the tensors are sized for 16 */
    s.qk_norm = 8;
    s.q_rows = 64;
    expect_refused(&s, "blk.0.attn_q.weight", "missing key_length");
    s = mspec_of("qwen2");
    s.skip = "token_embd.weight";
    expect_refused(&s, "token_embd.weight", "no embeddings");
}
