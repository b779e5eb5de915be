/* `kvp synth`: writes a GGUF with random weights of a given shape and architecture
 * (llama, qwen2, qwen3, gemma2, gemma3, phi3), for benchmarks and tests at sizes no real model in ../shared
 * has. Weights are uniform in +-1/sqrt(ne[0]) (ne[0] = the fan-in of the matmul),
 * biases in +-0.1, norms are 1.0, so activations stay in a sane range. Tensor data is generated per tensor inside the writer's fill
 * callback from a per-tensor seed: deterministic for a seed, and only the largest
 * tensor is ever in memory. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rng.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "tools/cli.h"
#include "base/parse.h"
#include "tools/quantmix.h"
#include "tools/hf_vocab.h"

#define N_BYTE_TOKENS 256
#define N_SPECIAL 3                                /* <unk>, <s>, </s> */
#define MIN_VOCAB (N_SPECIAL + N_BYTE_TOKENS)
#define MAX_FILE_BYTES (256ull << 30)              /* refuse absurd shapes up front */

/* sentencepiece token types as llama.cpp stores them */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_BYTE = 6 };

typedef struct synth_opts {
    const char *out;
    const char *tokenizer_json, *tokenizer_config;   /* a real HF tokenizer */
    long dim, hidden, layers, heads, kv_heads, vocab, ctx, seed;
    const char *type_name;
    kvp_quant_mix mix;      /* the type of every tensor (tools/quantmix.h) */
    /* architecture */
    const char *arch;       /* llama, qwen2 (QKV biases, NeoX RoPE), qwen3 (q/k norms),
                               gemma2, gemma3 (post-norms, windows), phi3 (fused tensors) */
    long window;            /* attention.sliding_window; -1: the family's usual */
    long head_dim;          /* attention.key_length; 0: dim / heads */
    double rope_base;       /* 0: the family's usual (llama 10000, qwen 1000000) */
    int tied;               /* no output.weight: the output reuses token_embd */
    /* --chain: token ids, each all but certain to follow the one before it (a test's
     * known reply): the blocks add nothing, so the logits are the current token's */
    long chain[64];
    int n_chain;
} synth_opts;

typedef struct synth_tensor {
    char name[48];
    uint32_t n_dims, type;
    uint64_t ne[2];
    int bias;               /* a vector of random values rather than a norm of ones */
    int chain;              /* with --chain: 1 zero (a block's output), 2 the token
                             * embedding, 3 the output */
} synth_tensor;

typedef struct synth_ctx {
    synth_tensor *t;
    uint64_t n;
    uint64_t seed;
    float *row;         /* one row of f32 values before conversion */
    const long *chain;  /* --chain's ids (n_chain of them) */
    int n_chain;
} synth_ctx;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvp synth --out FILE [--dim 768] [--hidden 2048] [--layers 12] [--heads 12]\n"
            "                 [--kv-heads HEADS] [--vocab 32000] [--ctx 2048]\n"
            "                 [--type TYPE] [--seed 0]\n"
            "                 [--arch llama|qwen2|qwen3|gemma2|gemma3|phi3] [--head-dim N]\n"
            "                 [--rope-base F] [--window N] [--tied] [--chain ID,ID,...]\n"
            "Writes a GGUF with random weights (deterministic per seed). --arch qwen2 adds\n"
            "Q/K/V biases, qwen3 per-head q/k norms (both NeoX RoPE); gemma2 Gemma's block\n"
            "with softcaps (50, 30) and a window on even layers, gemma3 q/k norms and a\n"
            "window on 5 of every 6 layers, phi3 fused attn_qkv and gate+up tensors with a\n"
            "window on every layer; --window sets attention.sliding_window (gemma2 4096,\n"
            "gemma3 512, phi3 0 = none by default); --head-dim sets attention.key_length\n"
            "(default dim / heads); --tied leaves out output.weight.\n"
            "--chain makes each listed token id (distinct, at most --dim and 64 of them) all\n"
            "but certain to follow the one before it, for tests that need a known reply: the\n"
            "blocks' outputs are zero, so a token's logits are its own embedding's.\n"
            "                 [--tokenizer-json tokenizer.json [--tokenizer-config tokenizer_config.json]]\n"
            "With --tokenizer-json it carries that Hugging Face tokenizer (tokens, types,\n"
            "merges, pre-tokenizer; from the config BOS/EOS/EOT and chat_template) and its\n"
            "vocabulary size, instead of a synthetic SentencePiece vocabulary.\n"
            "TYPE: " KVP_QUANT_MIX_NAMES " (as `kvp quantize`, default f32).\n");
}

static int bad(const char *fmt, const char *arg)
{
    fprintf(stderr, "kvp synth: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    usage(stderr);
    return 2;
}

static int fill(void *vctx, uint64_t i, void *buf, uint64_t n_bytes)
{
    synth_ctx *c = vctx;
    const synth_tensor *t = &c->t[i];
    uint64_t ne0 = t->ne[0], rows = t->n_dims > 1 ? t->ne[1] : 1;
    uint64_t row_bytes = n_bytes / rows;
    /* per-tensor stream: the data of a tensor does not depend on the others */
    uint64_t s = c->seed ^ (0xd1b54a32d192ed03ull * (i + 1));
    float scale = t->bias ? 0.1f : t->n_dims == 1 ? 0.0f : 1.0f / sqrtf((float)ne0);
    uint8_t *out = buf;
    for (uint64_t r = 0; r < rows; r++, out += row_bytes) {
        for (uint64_t j = 0; j < ne0; j++) {
            /* 24 random bits -> uniform in [-scale, scale) */
            float u = (float)(kvp_splitmix64(&s) >> 40) * 0x1p-23f - 1.0f;
            c->row[j] = t->n_dims == 1 && !t->bias ? 1.0f : u * scale;
        }
        /* --chain: the k-th token's embedding is the k-th unit vector, which the output row
         * of the token after it reads with a weight that outweighs every other logit */
        if (t->chain == 1)
            memset(c->row, 0, sizeof *c->row * ne0);
        for (int k = 0; t->chain > 1 && k < c->n_chain; k++) {
            int at = t->chain == 2 ? k : k - 1;
            if ((uint64_t)c->chain[k] != r || at < 0)
                continue;
            memset(c->row, 0, sizeof *c->row * ne0);
            c->row[at] = t->chain == 2 ? 1.0f : 8.0f;
        }
        kvp_quantize(t->type, c->row, out, ne0);
    }
    return 0;
}

static synth_tensor *add_tensor(synth_ctx *c, kvp_gguf_writer *w, const char *name,
                                const synth_opts *o, uint64_t ne0, uint64_t ne1)
{
    synth_tensor *t = &c->t[c->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = ne1 ? 2 : 1;
    /* norms and biases stay f32, as llama.cpp stores them */
    t->type = kvp_quant_mix_type(&o->mix, name, ne0, t->n_dims, (int)o->layers, o->tied);
    t->ne[0] = ne0;
    t->ne[1] = ne1 ? ne1 : 1;
    /* a failed add makes the final write fail with a message */
    kvp_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
    return t;
}

/* The synthetic vocabulary: specials, the 256 byte tokens, then filler pieces. */
static int add_vocab(kvp_gguf_writer *w, long vocab)
{
    char **tok = calloc((size_t)vocab, sizeof *tok);
    float *score = calloc((size_t)vocab, sizeof *score);
    int32_t *type = calloc((size_t)vocab, sizeof *type);
    int rc = -ENOMEM;
    if (!tok || !score || !type)
        goto out;
    static const char *const special[N_SPECIAL] = {"<unk>", "<s>", "</s>"};
    for (long i = 0; i < vocab; i++) {
        char s[32];
        if (i < N_SPECIAL)
            snprintf(s, sizeof s, "%s", special[i]);
        else if (i < MIN_VOCAB)
            snprintf(s, sizeof s, "<0x%02X>", (unsigned)(i - N_SPECIAL));
        else
            snprintf(s, sizeof s, "\xe2\x96\x81t%ld", i - MIN_VOCAB); /* "▁t123" */
        if (!(tok[i] = strdup(s)))
            goto out;
        type[i] = i == 0 ? TOK_UNKNOWN : i < N_SPECIAL ? TOK_CONTROL
                : i < MIN_VOCAB ? TOK_BYTE : TOK_NORMAL;
        score[i] = i < MIN_VOCAB ? 0.0f : -(float)(i - MIN_VOCAB);
    }
    rc = 0;
    kvp_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens", (const char *const *)tok,
                                  (uint64_t)vocab);
    kvp_gguf_writer_add_f32_array(w, "tokenizer.ggml.scores", score, (uint64_t)vocab);
    kvp_gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", type, (uint64_t)vocab);
out:
    for (long i = 0; tok && i < vocab; i++)
        free(tok[i]);
    free(tok);
    free(score);
    free(type);
    return rc;
}

static int parse_args(synth_opts *o, int argc, char **argv)
{
    *o = (synth_opts){.dim = 768, .hidden = 2048, .layers = 12, .heads = 12, .kv_heads = 0,
                      .vocab = 32000, .ctx = 2048, .seed = 0, .type_name = "f32",
                      .arch = "llama", .window = -1};
    kvp_quant_mix_parse(o->type_name, &o->mix);
    static const struct { const char *name; size_t off; long lo, hi; } num[] = {
        {"--dim", offsetof(synth_opts, dim), 1, 65536},
        {"--hidden", offsetof(synth_opts, hidden), 1, 262144},
        {"--layers", offsetof(synth_opts, layers), 1, 1024},
        {"--heads", offsetof(synth_opts, heads), 1, 1024},
        {"--kv-heads", offsetof(synth_opts, kv_heads), 1, 1024},
        {"--vocab", offsetof(synth_opts, vocab), MIN_VOCAB, 1 << 22},
        {"--ctx", offsetof(synth_opts, ctx), 1, 1 << 24},
        {"--seed", offsetof(synth_opts, seed), 0, LONG_MAX},
        {"--head-dim", offsetof(synth_opts, head_dim), 2, 4096},
        {"--window", offsetof(synth_opts, window), 0, 1 << 24},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--tied")) {
            o->tied = 1;
            continue;
        }
        if (i + 1 >= argc)
            return bad("%s needs a value", a);
        const char *v = argv[++i];
        size_t k;
        for (k = 0; k < sizeof num / sizeof num[0]; k++)
            if (!strcmp(a, num[k].name))
                break;
        if (k < sizeof num / sizeof num[0]) {
            if (!kvp_parse_long(v, num[k].lo, num[k].hi, (long *)((char *)o + num[k].off))) {
                fprintf(stderr, "kvp synth: %s '%s' is not a number in [%ld, %ld]\n", a, v,
                        num[k].lo, num[k].hi);
                return 2;
            }
        } else if (!strcmp(a, "--out")) {
            o->out = v;
        /* the real-tokenizer options */
        } else if (!strcmp(a, "--tokenizer-json")) {
            o->tokenizer_json = v;
        } else if (!strcmp(a, "--tokenizer-config")) {
            o->tokenizer_config = v;
        } else if (!strcmp(a, "--arch")) {
            static const char *const known[] = {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"};
            size_t j = 0;
            while (j < sizeof known / sizeof known[0] && strcmp(v, known[j]))
                j++;
            if (j == sizeof known / sizeof known[0])
                return bad("unknown --arch '%s' (llama, qwen2, qwen3, gemma2, gemma3 or phi3)", v);
            o->arch = v;
        } else if (!strcmp(a, "--rope-base")) {
            if (!kvp_parse_double(v, 1.0, 1e12, &o->rope_base))
                return bad("--rope-base '%s' is not a number in [1, 1e12]", v);
        } else if (!strcmp(a, "--chain")) {
            o->n_chain = 0;
            for (const char *p = v; *p;) {
                char num[24];
                size_t n = strcspn(p, ",");
                long id;
                if (n == 0 || n >= sizeof num)
                    return bad("--chain '%s' is not a list of token ids", v);
                memcpy(num, p, n);
                num[n] = '\0';
                if (o->n_chain == 64 || !kvp_parse_long(num, 0, (1L << 22) - 1, &id))
                    return bad("--chain '%s' is not a list of at most 64 token ids", v);
                for (int k = 0; k < o->n_chain; k++)
                    if (o->chain[k] == id)
                        return bad("--chain '%s' repeats a token", v);
                o->chain[o->n_chain++] = id;
                p += n + (p[n] == ',');
                if (p[-1] == ',' && !*p)
                    return bad("--chain '%s' is not a list of token ids", v);
            }
            if (o->n_chain < 2)
                return bad("--chain '%s' needs two token ids or more", v);
        } else if (!strcmp(a, "--type")) {
            if (kvp_quant_mix_parse(v, &o->mix))
                return bad("unknown --type '%s' (" KVP_QUANT_MIX_NAMES ")", v);
            o->type_name = v;
        } else {
            return bad("unknown option '%s'", a);
        }
    }
    if (!o->out)
        return bad("%s", "missing --out FILE");
    if (o->tokenizer_config && !o->tokenizer_json)
        return bad("%s", "--tokenizer-config needs --tokenizer-json");
    if (!o->kv_heads)
        o->kv_heads = o->heads;
    if (!o->head_dim && (o->dim % o->heads || (o->dim / o->heads) % 2))
        return bad("%s", "--dim must be a multiple of --heads with an even head size "
                   "(RoPE rotates pairs), or give --head-dim");
    if (o->head_dim % 2)
        return bad("%s", "--head-dim must be even (RoPE rotates pairs)");
    if (!o->head_dim)
        o->head_dim = o->dim / o->heads;
    if (!o->rope_base)
        o->rope_base = !strcmp(o->arch, "llama") || !strcmp(o->arch, "gemma2") ||
                       !strcmp(o->arch, "phi3") ? 10000.0 : 1000000.0;
    if (o->window < 0)
        o->window = !strcmp(o->arch, "gemma2") ? 4096 : !strcmp(o->arch, "gemma3") ? 512 : 0;
    if (o->window && strncmp(o->arch, "gemma", 5) && strcmp(o->arch, "phi3"))
        return bad("--window is for gemma2, gemma3 and phi3, not %s", o->arch);
    if (o->kv_heads > o->heads || o->heads % o->kv_heads)
        return bad("%s", "--kv-heads must divide --heads");
    if (kvp_type_block(o->mix.base) > 1 && (o->dim % KVP_QK || o->hidden % KVP_QK ||
                                            (o->head_dim * o->heads) % KVP_QK))
        return bad("%s", "quantized types need --dim, --hidden and --head-dim x --heads to be "
                   "multiples of 32");
    return -1;
}

int kvp_cmd_synth(int argc, char **argv)
{
    synth_opts o;
    int rc = parse_args(&o, argc, argv);
    if (rc >= 0)
        return rc;

    kvp_gguf_writer *w = kvp_gguf_writer_new();
    if (!w) {
        fprintf(stderr, "kvp synth: out of memory\n");
        return 1;
    }
    /* A real tokenizer's vocabulary sets the embedding rows. */
    if (o.tokenizer_json) {
        char terr[512];
        if (kvp_hf_vocab_add(w, o.tokenizer_json, o.tokenizer_config, &o.vocab, terr,
                             sizeof terr) < 0) {
            fprintf(stderr, "kvp synth: %s\n", terr);
            kvp_gguf_writer_free(w);
            return 1;
        }
    }

    for (int k = 0; k < o.n_chain; k++)
        if (o.chain[k] >= o.vocab || o.n_chain > o.dim || o.tied) {
            fprintf(stderr, "kvp synth: --chain needs ids below the vocabulary's %ld, at most "
                    "--dim of them, and an output.weight (no --tied)\n", o.vocab);
            kvp_gguf_writer_free(w);
            return 2;
        }
    uint64_t d = (uint64_t)o.dim, hid = (uint64_t)o.hidden, v = (uint64_t)o.vocab;
    uint64_t hd = (uint64_t)o.head_dim;
    uint64_t qd = hd * (uint64_t)o.heads, kvd = hd * (uint64_t)o.kv_heads;
    int qwen2 = !strcmp(o.arch, "qwen2"), qwen3 = !strcmp(o.arch, "qwen3");
    int gemma = !strncmp(o.arch, "gemma", 5), gemma3 = !strcmp(o.arch, "gemma3");
    int phi3 = !strcmp(o.arch, "phi3");
    /* the limits above keep these products far from overflow */
    uint64_t per_layer = 2 * d * qd + 2 * d * kvd + 3 * d * hid;
    uint64_t params = (o.tied ? 1 : 2) * d * v + (uint64_t)o.layers * per_layer;
    uint64_t file_bytes = kvp_type_nbytes(KVP_GGML_F32, params);
    if (file_bytes > MAX_FILE_BYTES) {
        fprintf(stderr, "kvp synth: %llu parameters is too large (at most %llu GiB of "
                "weights)\n", (unsigned long long)params, MAX_FILE_BYTES >> 30);
        kvp_gguf_writer_free(w);
        return 2;
    }

    synth_ctx c = {.seed = (uint64_t)o.seed, .chain = o.chain, .n_chain = o.n_chain};
    uint64_t n_tensors = (o.tied ? 2 : 3) +
                         (9 + 3 * qwen2 + 2 * (qwen3 || gemma3) + 2 * gemma - 3 * phi3) *
                         (uint64_t)o.layers;
    c.t = calloc(n_tensors, sizeof *c.t);
    uint64_t widest = d > hid ? d : hid;
    c.row = malloc((widest > qd ? widest : qd) * sizeof *c.row);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", o.out, (long)getpid());
    FILE *f = NULL;
    rc = 1;
    if (!c.t || !c.row) {
        fprintf(stderr, "kvp synth: out of memory\n");
        goto out;
    }

    /* kvs: a failed add makes kvp_gguf_writer_write fail, which is checked below */
    char name[64];
    snprintf(name, sizeof name, "kvp-synth %s d%ld l%ld h%ld", o.arch, o.dim, o.layers, o.heads);
    kvp_gguf_writer_add_str(w, "general.architecture", o.arch);
    kvp_gguf_writer_add_str(w, "general.name", name);
    kvp_gguf_writer_add_u32(w, "general.file_type", o.mix.ftype);
    /* the architecture's hyperparameters, under its own prefix */
    static const char *const keys[] = {
        "context_length", "embedding_length", "block_count", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.key_length",
        "attention.value_length", "rope.dimension_count", "vocab_size",
    };
    const long vals[] = {o.ctx, o.dim, o.layers, o.hidden, o.heads, o.kv_heads, o.head_dim,
                         o.head_dim, o.head_dim, o.vocab};
    char key[96];
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", o.arch, keys[i]);
        kvp_gguf_writer_add_u32(w, key, (uint32_t)vals[i]);
    }
    snprintf(key, sizeof key, "%s.rope.freq_base", o.arch);
    kvp_gguf_writer_add_f32(w, key, (float)o.rope_base);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", o.arch);
    kvp_gguf_writer_add_f32(w, key, qwen2 || qwen3 || gemma ? 1e-6f : 1e-5f);
    if (o.window) {
        snprintf(key, sizeof key, "%s.attention.sliding_window", o.arch);
        kvp_gguf_writer_add_u32(w, key, (uint32_t)o.window);
    }
    if (!strcmp(o.arch, "gemma2")) {   /* Gemma 2's own caps */
        kvp_gguf_writer_add_f32(w, "gemma2.attn_logit_softcapping", 50.0f);
        kvp_gguf_writer_add_f32(w, "gemma2.final_logit_softcapping", 30.0f);
    }
    if (!o.tokenizer_json) {
        kvp_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
        if (add_vocab(w, o.vocab)) {
            fprintf(stderr, "kvp synth: out of memory\n");
            goto out;
        }
        kvp_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        kvp_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
        kvp_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    }

    int chain = o.n_chain > 0;
    add_tensor(&c, w, "token_embd.weight", &o, d, v)->chain = 2 * chain;
    add_tensor(&c, w, "output_norm.weight", &o, d, 0);
    if (!o.tied)
        add_tensor(&c, w, "output.weight", &o, d, v)->chain = 3 * chain;
    for (long l = 0; l < o.layers; l++) {
        static const struct { const char *name; int in, out, bias, only; } blk[] = {
            /* in/out: 0 = none (a vector), 1 = dim, 2 = kv dim, 3 = hidden, 4 = q dim,
             * 5 = head dim, 6 = fused q+k+v rows, 7 = fused gate+up rows; bias: 1 =
             * qwen2's biases (random values); only: 1 = not phi3 (unfused), 2 = phi3
             * (fused), 3 = q/k norms (qwen3, gemma3), 4 = gemma's post-norms, 5 = qwen2 */
            {"attn_norm.weight", 1, 0, 0, 0}, {"attn_q.weight", 1, 4, 0, 1},
            {"attn_k.weight", 1, 2, 0, 1}, {"attn_v.weight", 1, 2, 0, 1},
            {"attn_qkv.weight", 1, 6, 0, 2},
            {"attn_output.weight", 4, 1, 0, 0}, {"ffn_norm.weight", 1, 0, 0, 0},
            {"ffn_gate.weight", 1, 3, 0, 1}, {"ffn_down.weight", 3, 1, 0, 0},
            {"ffn_up.weight", 1, 3, 0, 1}, {"ffn_up.weight", 1, 7, 0, 2},
            {"attn_q.bias", 4, 0, 1, 5}, {"attn_k.bias", 2, 0, 1, 5}, {"attn_v.bias", 2, 0, 1, 5},
            {"attn_q_norm.weight", 5, 0, 0, 3}, {"attn_k_norm.weight", 5, 0, 0, 3},
            {"post_attention_norm.weight", 1, 0, 0, 4}, {"post_ffw_norm.weight", 1, 0, 0, 4},
        };
        const uint64_t size[8] = {0, d, kvd, hid, qd, hd, qd + 2 * kvd, 2 * hid};
        const int wanted[6] = {1, !phi3, phi3, qwen3 || gemma3, gemma, qwen2};
        for (size_t k = 0; k < sizeof blk / sizeof blk[0]; k++) {
            if (!wanted[blk[k].only])
                continue;
            char tn[48];
            snprintf(tn, sizeof tn, "blk.%ld.%s", l, blk[k].name);
            synth_tensor *t = add_tensor(&c, w, tn, &o, size[blk[k].in], size[blk[k].out]);
            t->bias = blk[k].bias == 1;
            t->chain = chain && (!strcmp(blk[k].name, "attn_output.weight") ||
                                 !strcmp(blk[k].name, "ffn_down.weight"));
        }
    }

    /* write beside the target and rename, so a failed run leaves no partial model */
    if (!(f = fopen(tmp, "wb"))) {
        fprintf(stderr, "kvp synth: %s: %s\n", tmp, strerror(errno));
        goto out;
    }
    char err[256];
    int wrc = kvp_gguf_writer_write(w, f, fill, &c, err, sizeof err);
    int crc = fclose(f);
    f = NULL;
    if (wrc || crc) {
        fprintf(stderr, "kvp synth: %s: %s\n", o.out, wrc ? err : strerror(errno));
        remove(tmp);
        goto out;
    }
    if (rename(tmp, o.out)) {
        fprintf(stderr, "kvp synth: %s: %s\n", o.out, strerror(errno));
        remove(tmp);
        goto out;
    }
    printf("wrote %s: %llu parameters, %llu tensors, %s\n", o.out, (unsigned long long)params,
           (unsigned long long)n_tensors, o.type_name);
    rc = 0;
out:
    kvp_gguf_writer_free(w);
    free(c.t);
    free(c.row);
    return rc;
}
