#include "base/fileio.h"
#include "model/model.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"

#include "model/gguf.h"
#include "model/quant.h"
#include "model/rope_scaling.h"
#include "base/errors.h"

/* Sane upper bounds: far above any real llama, low enough that sizes cannot overflow. */
#define MAX_DIM (1 << 16)
#define MAX_HEAD_DIM 4096
#define MAX_LAYERS 1024
#define MAX_VOCAB (1 << 20)
#define MAX_CTX (1 << 22)

/* Checks a configuration; messages name the metadata key (ARCH.suffix in a GGUF, the
 * same names for the fields of a llama2.c header, whose prefix is ""). */
static int check_config(const kvp_model_config *c, const char *pfx, char *err, size_t errlen)
{
    if (c->dim <= 0 || c->dim > MAX_DIM)
        return KVP_ERR(-EINVAL, "%sembedding_length = %d: must be in [1, %d]", pfx, c->dim, MAX_DIM);
    if (c->hidden_dim <= 0 || c->hidden_dim > 4 * MAX_DIM)
        return KVP_ERR(-EINVAL, "%sfeed_forward_length = %d: must be in [1, %d]", pfx, c->hidden_dim, 4 * MAX_DIM);
    if (c->n_layers <= 0 || c->n_layers > MAX_LAYERS)
        return KVP_ERR(-EINVAL, "%sblock_count = %d: must be in [1, %d]", pfx, c->n_layers, MAX_LAYERS);
    if (c->n_heads <= 0 || c->n_heads > MAX_DIM)
        return KVP_ERR(-EINVAL, "%sattention.head_count = %d: must be in [1, %d]", pfx, c->n_heads, MAX_DIM);
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return KVP_ERR(-EINVAL, "%sattention.head_count_kv = %d: must divide %sattention.head_count = %d",
                   pfx, c->n_kv_heads, pfx, c->n_heads);
    if (c->head_dim <= 0 || c->head_dim > MAX_HEAD_DIM || c->head_dim * c->n_heads > 4 * MAX_DIM)
        return KVP_ERR(-EINVAL, "%sattention.key_length = %d: must be in [1, %d] with key_length x "
                   "head_count (%d) at most %d", pfx, c->head_dim, MAX_HEAD_DIM, c->n_heads,
                   4 * MAX_DIM);
    if (c->rope.n_rot <= 0 || c->rope.n_rot % 2 || c->rope.n_rot > c->head_dim)
        return KVP_ERR(-EINVAL, "%srope.dimension_count = %d: must be even and in [2, attention.key_length "
                   "= %d]", pfx, c->rope.n_rot, c->head_dim);
    if (!(c->rope.base > 0) || !isfinite(c->rope.base))
        return KVP_ERR(-EINVAL, "%srope.freq_base = %g: must be a finite positive number", pfx, c->rope.base);
    if (!(c->rms_eps > 0) || !isfinite(c->rms_eps))
        return KVP_ERR(-EINVAL, "%sattention.layer_norm_rms_epsilon = %g: must be a finite positive number",
                   pfx, c->rms_eps);
    if (c->vocab_size <= 0 || c->vocab_size > MAX_VOCAB)
        return KVP_ERR(-EINVAL, "%svocab_size = %d: must be in [1, %d]", pfx, c->vocab_size, MAX_VOCAB);
    if (c->seq_len <= 0 || c->seq_len > MAX_CTX)
        return KVP_ERR(-EINVAL, "%scontext_length = %d: must be in [1, %d]", pfx, c->seq_len, MAX_CTX);
    return 0;
}

/* Reads the whole file into anonymous memory, asking for transparent huge pages. Decode
 * streams every weight once per token; with 2 MiB pages it runs at the machine's
 * measured bandwidth, while a page-cache mmap (4 KiB pages, a TLB miss every page) loses
 * about a fifth of it (bench/bench_engine). *size is the file size, *map_size what to
 * munmap. */
static int load_file(const char *path, void **map, size_t *size, size_t *map_size,
                     char *err, size_t errlen)
{
    struct stat st;
    int fd = kvp_open_input(path, &st);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", path, kvp_fileio_strerror(fd));
        return fd;
    }
    if (st.st_size == 0) {
        close(fd);
        snprintf(err, errlen, "%s: not a regular non-empty file", path);
        return -EINVAL;
    }
    const size_t huge = 2u << 20;
    *size = (size_t)st.st_size;
    *map_size = (*size + huge - 1) & ~(huge - 1);
    *map = mmap(NULL, *map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*map == MAP_FAILED) {
        *map = NULL;
        close(fd);
        snprintf(err, errlen, "cannot allocate %zu bytes for %s", *size, path);
        return -ENOMEM;
    }
    (void)madvise(*map, *map_size, MADV_HUGEPAGE);  /* a hint: fine if refused */
    size_t got = 0;
    while (got < *size) {
        ssize_t r = read(fd, (char *)*map + got, *size - got);
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            snprintf(err, errlen, "cannot read %s: %s", path, strerror(e));
            return -e;
        }
        got += (size_t)r;
    }
    close(fd);
    return 0;
}

/* ---- llama2.c checkpoints ------------------------------------------------------- */

static kvp_weight f32_weight(const float *p, int rows, int cols)
{
    return (kvp_weight){.type = KVP_GGML_F32, .rows = rows, .cols = cols,
                        .row_bytes = (size_t)cols * sizeof(float), .data = p};
}

static int load_llama2c(kvp_model *m, const char *path, const char *tokenizer_path,
                        char *err, size_t errlen)
{
    size_t size;
    int rc = load_file(path, &m->map, &size, &m->map_size, err, errlen);
    if (rc)
        return rc;
    if (size < 7 * sizeof(int32_t))
        return KVP_ERR(-EINVAL, "%s: too short for a llama2.c header (%zu bytes)", path, size);
    int32_t h[7];
    memcpy(h, m->map, sizeof h);
    kvp_model_config *c = &m->cfg;
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    m->tied_output = h[5] > 0;
    c->vocab_size = h[5] > 0 ? h[5] : (h[5] == INT32_MIN ? 0 : -h[5]);
    c->seq_len = h[6];
    c->head_dim = c->n_heads > 0 && c->dim % c->n_heads == 0 ? c->dim / c->n_heads : 0;
    c->rope = (kvp_rope){.n_rot = c->head_dim, .base = 10000.0f};
    c->rms_eps = 1e-5f;
    snprintf(m->arch, sizeof m->arch, "llama");
    if ((rc = check_config(c, "", err, errlen))) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", err);
        return KVP_ERR(-EINVAL, "%s: llama2.c header: %s", path, msg);
    }

    size_t d = (size_t)c->dim, L = (size_t)c->n_layers, hid = (size_t)c->hidden_dim;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t need = (size_t)c->vocab_size * d + L * (2 * d + qd * d * 2 + kvd * d * 2 + 3 * hid * d) +
                  d + (size_t)c->seq_len * c->head_dim + (m->tied_output ? 0 : (size_t)c->vocab_size * d);
    if (need > (size - sizeof h) / sizeof(float))
        return KVP_ERR(-EINVAL, "%s: truncated llama2.c checkpoint: the header needs %zu bytes of weights, "
                   "the file has %zu", path, need * sizeof(float), size - sizeof h);

    const float *p = (const float *)((const char *)m->map + sizeof h);
    m->type_bytes[KVP_GGML_F32] = need * sizeof(float);
    m->layers = calloc(L, sizeof *m->layers);
    if (!m->layers)
        return -ENOMEM;
    m->tok_embd = f32_weight(p, c->vocab_size, c->dim);
    p += (size_t)c->vocab_size * d;
    const float *att_norm = p; p += L * d;
    const float *wq = p; p += L * qd * d;
    const float *wk = p; p += L * kvd * d;
    const float *wv = p; p += L * kvd * d;
    const float *wo = p; p += L * d * qd;
    const float *ffn_norm = p; p += L * d;
    const float *w1 = p; p += L * hid * d;
    const float *w2 = p; p += L * d * hid;
    const float *w3 = p; p += L * hid * d;
    m->out_norm = p; p += d;
    p += (size_t)c->seq_len * c->head_dim;  /* legacy freq_cis_real/imag, unused */
    m->output = m->tied_output ? m->tok_embd : f32_weight(p, c->vocab_size, c->dim);
    for (size_t l = 0; l < L; l++) {
        kvp_layer *ly = &m->layers[l];
        ly->attn_norm = att_norm + l * d;
        ly->wq = f32_weight(wq + l * qd * d, (int)qd, c->dim);
        ly->wk = f32_weight(wk + l * kvd * d, (int)kvd, c->dim);
        ly->wv = f32_weight(wv + l * kvd * d, (int)kvd, c->dim);
        ly->wo = f32_weight(wo + l * d * qd, c->dim, (int)qd);
        ly->ffn_norm = ffn_norm + l * d;
        ly->w_gate = f32_weight(w1 + l * hid * d, c->hidden_dim, c->dim);
        ly->w_down = f32_weight(w2 + l * d * hid, c->dim, c->hidden_dim);
        ly->w_up = f32_weight(w3 + l * hid * d, c->hidden_dim, c->dim);
    }

    char tokpath[1024];
    if (!tokenizer_path) {
        const char *slash = strrchr(path, '/');
        int dirlen = slash ? (int)(slash - path + 1) : 0;
        snprintf(tokpath, sizeof tokpath, "%.*stokenizer.bin", dirlen, path);
        if (access(tokpath, R_OK))
            snprintf(tokpath, sizeof tokpath, "%.*stok%d.bin", dirlen, path, c->vocab_size);
        tokenizer_path = tokpath;
    }
    rc = kvp_tokenizer_load_file(&m->tok, tokenizer_path, c->vocab_size, err, errlen);
    if (rc)
        return rc;
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    return 0;
}

/* ---- GGUF ----------------------------------------------------------------------- */

static int own_f32(kvp_model *m, const kvp_gguf_tensor *t, const float **out,
                   char *err, size_t errlen)
{
    if (t->type == KVP_GGML_F32) {
        *out = t->data;
        return 0;
    }
    float *buf = malloc(t->n_elements * sizeof *buf);
    float **owned = realloc(m->owned, (m->n_owned + 1) * sizeof *owned);
    if (!buf || !owned) {
        free(buf);
        if (owned)
            m->owned = owned;
        snprintf(err, errlen, "out of memory converting tensor %.*s", (int)t->name.len, t->name.ptr);
        return -ENOMEM;
    }
    m->owned = owned;
    m->owned[m->n_owned++] = buf;
    if (kvp_dequantize(t->type, t->data, buf, t->n_elements))
        return KVP_ERR(-EINVAL, "tensor %.*s: cannot convert type %s", (int)t->name.len, t->name.ptr,
                   kvp_type_name(t->type));
    *out = buf;
    return 0;
}

/* Finds tensor `name` with shape ne0 x ne1 (ne1 = 1 for vectors). */
static const kvp_gguf_tensor *find_shaped(const kvp_gguf *g, const char *name, uint64_t ne0,
                                          uint64_t ne1, char *err, size_t errlen)
{
    const kvp_gguf_tensor *t = kvp_gguf_find_tensor(g, name);
    if (!t) {
        KVP_ERR(-EINVAL, "missing tensor %s", name);
        return NULL;
    }
    uint64_t e1 = t->n_dims > 1 ? t->ne[1] : 1;
    if (t->ne[0] != ne0 || e1 != ne1 || t->n_elements != ne0 * ne1) {
        KVP_ERR(-EINVAL, "tensor %s has shape [%llu, %llu], expected [%llu, %llu]", name,
            (unsigned long long)t->ne[0], (unsigned long long)e1,
            (unsigned long long)ne0, (unsigned long long)ne1);
        return NULL;
    }
    return t;
}

/* A vector (norm weights): f32 in place, or converted to f32 when stored otherwise. */
static int tensor(kvp_model *m, const kvp_gguf *g, const char *name, uint64_t ne0, uint64_t ne1,
                  const float **out, char *err, size_t errlen)
{
    const kvp_gguf_tensor *t = find_shaped(g, name, ne0, ne1, err, errlen);
    if (!t)
        return -EINVAL;
    m->type_bytes[t->type] += t->n_bytes;
    return own_f32(m, t, out, err, errlen);
}

/* A weight matrix [ne1 rows][ne0 columns], left in the file's type. */
static int matrix(kvp_model *m, const kvp_gguf *g, const char *name, uint64_t ne0, uint64_t ne1,
                  kvp_weight *out, char *err, size_t errlen)
{
    const kvp_gguf_tensor *t = find_shaped(g, name, ne0, ne1, err, errlen);
    if (!t)
        return -EINVAL;
    m->type_bytes[t->type] += t->n_bytes;
    *out = (kvp_weight){.type = t->type, .rows = (int)ne1, .cols = (int)ne0,
                        .row_bytes = (size_t)(t->n_bytes / ne1), .data = t->data};
    return 0;
}

/* An optional tensor: *out stays NULL when the file has none. */
static int opt_tensor(kvp_model *m, const kvp_gguf *g, const char *name, uint64_t ne0,
                      uint64_t ne1, const float **out, char *err, size_t errlen)
{
    if (!kvp_gguf_find_tensor(g, name))
        return 0;
    return tensor(m, g, name, ne0, ne1, out, err, errlen);
}

/* Integer metadata ARCH.suffix; *out keeps its default when absent and not required. */
static int get_int(const kvp_gguf *g, const char *arch, const char *suffix, int *out,
                   int required, char *err, size_t errlen)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    int rc = kvp_gguf_get_u32(g, key, &v);
    if (rc == -ENOENT && !required)
        return 0;
    if (rc == -ENOENT)
        return KVP_ERR(-EINVAL, "missing metadata %s", key);
    if (rc || v > INT32_MAX)
        return KVP_ERR(-EINVAL, "metadata %s has a wrong type or value", key);
    *out = (int)v;
    return 0;
}

static int get_float(const kvp_gguf *g, const char *arch, const char *suffix, float *out,
                     char *err, size_t errlen)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = kvp_gguf_get_f32(g, key, out);
    if (rc && rc != -ENOENT)
        return KVP_ERR(-EINVAL, "metadata %s has a wrong type or value", key);
    return 0;
}

/* A copy of tokenizer.chat_template (the chat template family is sessions/' business). */
static int copy_chat_template(kvp_model *m, const kvp_gguf *g, char *err, size_t errlen)
{
    const kvp_gguf_kv *kv = kvp_gguf_find(g, "tokenizer.chat_template");
    if (!kv)
        return 0;
    if (kv->type != KVP_GGUF_STRING)
        return KVP_ERR(-EINVAL, "tokenizer.chat_template is not a string");
    if (!(m->chat_template = malloc((size_t)kv->val.str.len + 1)))
        return KVP_ERR(-EINVAL, "out of memory for tokenizer.chat_template");
    memcpy(m->chat_template, kv->val.str.ptr, (size_t)kv->val.str.len);
    m->chat_template[kv->val.str.len] = 0;
    return 0;
}

/* The GGUF architectures: llama's block, and what each adds to it. */
enum { NONE, OPTIONAL, REQUIRED };
static const struct arch_desc {
    const char *name;
    int neox;       /* RoPE on NeoX halves instead of consecutive pairs */
    int qkv_bias;   /* blk.N.attn_{q,k,v}.bias */
    int qk_norm;    /* blk.N.attn_{q,k}_norm.weight */
    int gemma;      /* Gemma's block: embeddings times sqrt(dim), GeGLU, post-attention and
                       post-FFN norms, softcapping where the file sets it */
    int fused;      /* blk.N.attn_qkv (q, k, v rows) and ffn_up holding gate then up (phi3) */
    int swa_every;  /* with ARCH.attention.sliding_window > 0, the windowed layers: 1 every
                       layer, 2 the even ones, 6 all but every sixth (l + 1) % 6 == 0 */
} archs[] = {
    {"llama", 0, OPTIONAL, NONE, 0, 0, 0},
    {"mistral", 0, OPTIONAL, NONE, 0, 0, 0},
    {"qwen2", 1, REQUIRED, NONE, 0, 0, 0},
    {"qwen3", 1, NONE, REQUIRED, 0, 0, 0},
    {"gemma2", 1, NONE, NONE, 1, 0, 2},
    {"gemma3", 1, NONE, REQUIRED, 1, 0, 6},
    {"phi3", 1, NONE, NONE, 0, 1, 1},
};

/* Layer l of a model with a sliding window: whether it is one of the windowed layers. */
static int swa_layer(const struct arch_desc *a, int l)
{
    return a->swa_every == 1 || (a->swa_every == 2 && l % 2 == 0) ||
           (a->swa_every == 6 && (l + 1) % 6 != 0);
}

/* A float metadata value that must be finite and >= 0 when present (0: off). */
static int get_nonneg(const kvp_gguf *g, const char *arch, const char *suffix, float *out,
                      char *err, size_t errlen)
{
    int rc = get_float(g, arch, suffix, out, err, errlen);
    if (!rc && (!(*out >= 0) || !isfinite(*out)))
        rc = KVP_ERR(-EINVAL, "%s.%s = %g: must be a finite number >= 0", arch, suffix, *out);
    return rc;
}

/* What gemma2, gemma3 and phi3 add to the llama hyperparameters (semantics as llama.cpp's
 * graphs of these architectures). */
static int read_arch_extras(kvp_model *m, const kvp_gguf *g, const struct arch_desc *a,
                            char *err, size_t errlen)
{
    kvp_model_config *c = &m->cfg;
    const char *n = a->name;
    int rc;
    if (a->gemma) {
        c->embd_scale = sqrtf((float)c->dim);
        c->gelu = 1;
        /* there is no key for query_pre_attn_scalar: llama.cpp takes key_length except
         * for the 27B models (46 and 62 layers), whose scalar is dim / heads */
        int scalar = c->head_dim;
        if ((!strcmp(n, "gemma2") && c->n_layers == 46) ||
            (!strcmp(n, "gemma3") && c->n_layers == 62))
            scalar = c->dim / c->n_heads;
        c->query_scale = 1.0f / sqrtf((float)scalar);
        if ((rc = get_nonneg(g, n, "attn_logit_softcapping", &c->attn_softcap, err, errlen)) ||
            (rc = get_nonneg(g, n, "final_logit_softcapping", &c->final_softcap, err, errlen)))
            return rc;
    }
    /* gemma3's local layers rotate with a fixed base (llama.cpp has no key for it) */
    c->rope_base_swa = !strcmp(n, "gemma3") ? 10000.0f : c->rope.base;
    if (a->swa_every && (rc = get_int(g, n, "attention.sliding_window", &c->swa_window, 0,
                                      err, errlen)))
        return rc;
    if (a->fused) {
        float f = 0.0f;
        if ((rc = get_nonneg(g, n, "rope.scaling.attn_factor", &f, err, errlen)))
            return rc;
        c->rope_attn_factor = f;
        /* LongRoPE files carry short and long factors; kvpd applies the short ones (as
         * llama.cpp does while the context is at most original_context_length), so the
         * context is held to that length */
        int orig = 0;
        if ((rc = get_int(g, n, "rope.scaling.original_context_length", &orig, 0, err, errlen)))
            return rc;
        if (orig > 0 && orig < c->seq_len && kvp_gguf_find_tensor(g, "rope_factors_long.weight"))
            c->seq_len = orig;
    }
    return 0;
}

/* Hyperparameters from ARCH.* metadata, defaults as llama.cpp's, then checked. */
static int read_config(kvp_model *m, const kvp_gguf *g, const struct arch_desc *a,
                       char *err, size_t errlen)
{
    kvp_model_config *c = &m->cfg;
    const char *n = a->name;
    int rc;
    c->rope.base = 10000.0f;
    c->rope.neox = a->neox;
    c->rms_eps = 1e-5f;
    c->seq_len = 2048;
    if ((rc = get_int(g, n, "embedding_length", &c->dim, 1, err, errlen)) ||
        (rc = get_int(g, n, "feed_forward_length", &c->hidden_dim, 1, err, errlen)) ||
        (rc = get_int(g, n, "block_count", &c->n_layers, 1, err, errlen)) ||
        (rc = get_int(g, n, "attention.head_count", &c->n_heads, 1, err, errlen)) ||
        (rc = get_int(g, n, "context_length", &c->seq_len, 0, err, errlen)) ||
        (rc = get_float(g, n, "rope.freq_base", &c->rope.base, err, errlen)) ||
        (rc = get_float(g, n, "attention.layer_norm_rms_epsilon", &c->rms_eps, err, errlen)))
        return rc;
    c->n_kv_heads = c->n_heads;
    if ((rc = get_int(g, n, "attention.head_count_kv", &c->n_kv_heads, 0, err, errlen)))
        return rc;
    /* head size: key_length when given (qwen3: not dim / heads), else dim / heads */
    char key[96];
    snprintf(key, sizeof key, "%s.attention.key_length", n);
    if (!kvp_gguf_find(g, key) && c->n_heads > 0 && c->dim % c->n_heads)
        return KVP_ERR(-EINVAL, "%s.attention.head_count = %d does not divide %s.embedding_length = %d "
                   "and %s is absent", n, c->n_heads, n, c->dim, key);
    c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    if ((rc = get_int(g, n, "attention.key_length", &c->head_dim, 0, err, errlen)))
        return rc;
    int v_dim = c->head_dim;
    if ((rc = get_int(g, n, "attention.value_length", &v_dim, 0, err, errlen)))
        return rc;
    if (v_dim != c->head_dim)
        return KVP_ERR(-EINVAL, "%s.attention.value_length = %d differs from attention.key_length = %d "
                   "(unsupported)", n, v_dim, c->head_dim);
    c->rope.n_rot = c->head_dim;
    if ((rc = get_int(g, n, "rope.dimension_count", &c->rope.n_rot, 0, err, errlen)))
        return rc;
    const kvp_gguf_tensor *emb = kvp_gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2 || emb->ne[1] > MAX_VOCAB)
        return KVP_ERR(-EINVAL, "missing or bad token_embd.weight");
    c->vocab_size = (int)emb->ne[1];
    int meta_vocab = c->vocab_size;
    if ((rc = get_int(g, n, "vocab_size", &meta_vocab, 0, err, errlen)))
        return rc;
    if (meta_vocab != c->vocab_size)
        return KVP_ERR(-EINVAL, "%s.vocab_size = %d but token_embd.weight has %d rows", n, meta_vocab,
                   c->vocab_size);
    char pfx[48];
    snprintf(pfx, sizeof pfx, "%s.", n);
    if ((rc = check_config(c, pfx, err, errlen)) || (rc = read_arch_extras(m, g, a, err, errlen)))
        return rc;
    return 0;
}

/* rope_freqs.weight (Llama 3.1+), or phi3's rope_factors_short.weight (LongRoPE within
 * the original context): one frequency divisor per rotated pair. */
static int read_rope_factors(kvp_model *m, const kvp_gguf *g, char *err, size_t errlen)
{
    kvp_rope *r = &m->cfg.rope;
    const char *name = kvp_gguf_find_tensor(g, "rope_factors_short.weight")
                           ? "rope_factors_short.weight" : "rope_freqs.weight";
    int rc = opt_tensor(m, g, name, (uint64_t)r->n_rot / 2, 1, &r->factors, err, errlen);
    for (int i = 0; !rc && r->factors && i < r->n_rot / 2; i++)
        if (!(r->factors[i] > 0) || !isfinite(r->factors[i]))
            rc = KVP_ERR(-EINVAL, "%s[%d] = %g: frequency factors must be finite and positive",
                         name, i, r->factors[i]);
    return rc;
}

/* Linear RoPE scaling (model/rope_scaling.h) folded into the frequency factors: every
 * layer's, except gemma3's sliding-window layers, which llama.cpp rotates unscaled. */
static int read_rope_scaling(kvp_model *m, const kvp_gguf *g, const struct arch_desc *a,
                             char *err, size_t errlen)
{
    kvp_rope *r = &m->cfg.rope;
    float f;
    int rc = kvp_rope_scaling_factor(g, a->name, a->fused, &f, err, errlen);
    if (rc || f == 1.0f)
        return rc;
    float *scaled = kvp_rope_scaled_factors(r->factors, r->n_rot / 2, f);
    float *local = !strcmp(a->name, "gemma3") ? kvp_rope_scaled_factors(r->factors, r->n_rot / 2, 1.0f)
                                              : NULL;
    float **owned = realloc(m->owned, (m->n_owned + 2) * sizeof *owned);
    if (owned)
        m->owned = owned;
    if (!scaled || (!local && !strcmp(a->name, "gemma3")) || !owned) {
        free(scaled);
        free(local);
        return KVP_ERR(-ENOMEM, "out of memory for the RoPE factors");
    }
    m->owned[m->n_owned++] = scaled;
    if (local) {
        m->owned[m->n_owned++] = local;
        m->cfg.rope_factors_swa = local;
    }
    r->factors = scaled;
    return 0;
}

/* A fused matrix of parts[0] + parts[1] + ... rows: each part a view of its rows. */
static int fused_matrix(kvp_model *m, const kvp_gguf *g, const char *name, uint64_t ne0,
                        const uint64_t *rows, kvp_weight *const *parts, int n_parts,
                        char *err, size_t errlen)
{
    uint64_t total = 0;
    for (int i = 0; i < n_parts; i++)
        total += rows[i];
    kvp_weight all;
    int rc = matrix(m, g, name, ne0, total, &all, err, errlen);
    if (rc)
        return rc;
    const char *at = all.data;
    for (int i = 0; i < n_parts; i++) {
        *parts[i] = all;
        parts[i]->rows = (int)rows[i];
        parts[i]->data = at;
        at += rows[i] * all.row_bytes;
    }
    return 0;
}

static int read_layer(kvp_model *m, const kvp_gguf *g, const struct arch_desc *a, int l,
                      char *err, size_t errlen)
{
    const kvp_model_config *c = &m->cfg;
    uint64_t d = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, hd = (uint64_t)c->head_dim;
    uint64_t qd = (uint64_t)c->n_heads * hd, kvd = (uint64_t)c->n_kv_heads * hd;
    kvp_layer *ly = &m->layers[l];
    static const char *const bias_name[3] = {"attn_q", "attn_k", "attn_v"};
    const float **bias[3] = {&ly->bq, &ly->bk, &ly->bv};
    const uint64_t bias_len[3] = {qd, kvd, kvd};
    char n[96];
    int rc;
#define T(get, field, suffix, e0, e1)                                         \
    snprintf(n, sizeof n, "blk.%d." suffix ".weight", l);                     \
    if ((rc = get(m, g, n, e0, e1, &ly->field, err, errlen)))                 \
        return rc;
    T(tensor, attn_norm, "attn_norm", d, 1)
    if (a->fused) {
        snprintf(n, sizeof n, "blk.%d.attn_qkv.weight", l);
        if ((rc = fused_matrix(m, g, n, d, (const uint64_t[]){qd, kvd, kvd},
                               (kvp_weight *const[]){&ly->wq, &ly->wk, &ly->wv}, 3, err, errlen)))
            return rc;
        snprintf(n, sizeof n, "blk.%d.ffn_up.weight", l);
        if ((rc = fused_matrix(m, g, n, d, (const uint64_t[]){hid, hid},
                               (kvp_weight *const[]){&ly->w_gate, &ly->w_up}, 2, err, errlen)))
            return rc;
    } else {
        T(matrix, wq, "attn_q", d, qd)
        T(matrix, wk, "attn_k", d, kvd)
        T(matrix, wv, "attn_v", d, kvd)
        T(matrix, w_gate, "ffn_gate", d, hid)
        T(matrix, w_up, "ffn_up", d, hid)
    }
    T(matrix, wo, "attn_output", qd, d)
    T(tensor, ffn_norm, "ffn_norm", d, 1)
    T(matrix, w_down, "ffn_down", hid, d)
    if (a->qk_norm) {
        T(tensor, q_norm, "attn_q_norm", hd, 1)
        T(tensor, k_norm, "attn_k_norm", hd, 1)
    }
    if (a->gemma) {
        T(tensor, post_attn_norm, "post_attention_norm", d, 1)
        T(tensor, post_ffn_norm, "post_ffw_norm", d, 1)
    }
#undef T
    for (int i = 0; i < 3 && a->qkv_bias; i++) {
        snprintf(n, sizeof n, "blk.%d.%s.bias", l, bias_name[i]);
        rc = a->qkv_bias == REQUIRED ? tensor(m, g, n, bias_len[i], 1, bias[i], err, errlen)
                                     : opt_tensor(m, g, n, bias_len[i], 1, bias[i], err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

static int load_gguf(kvp_model *m, const char *path, char *err, size_t errlen)
{
    size_t size;
    int rc = load_file(path, &m->map, &size, &m->map_size, err, errlen);
    if (rc)
        return rc;
    kvp_gguf g;
    if ((rc = kvp_gguf_parse(&g, m->map, size, err, errlen)))
        goto prefix;
    /* tensors point into m->map; g's tables are freed below */
    rc = kvp_gguf_get_str(&g, "general.architecture", m->arch, sizeof m->arch);
    if (rc) {
        rc = KVP_ERR(-EINVAL, "missing or bad general.architecture");
        goto out;
    }
    const struct arch_desc *a = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(m->arch, archs[i].name))
            a = &archs[i];
    if (!a) {
        rc = KVP_ERR(-EINVAL, "general.architecture '%s' is not supported (llama, mistral, qwen2, "
                     "qwen3, gemma2, gemma3, phi3)", m->arch);
        goto out;
    }
    kvp_model_config *c = &m->cfg;
    if ((rc = read_config(m, &g, a, err, errlen)))
        goto out;
    uint64_t d = (uint64_t)c->dim;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        rc = -ENOMEM;
        goto out;
    }
    for (int l = 0; l < c->n_layers; l++)
        m->layers[l].window = c->swa_window > 0 && swa_layer(a, l) ? c->swa_window : 0;
    if ((rc = matrix(m, &g, "token_embd.weight", d, (uint64_t)c->vocab_size, &m->tok_embd, err, errlen)) ||
        (rc = tensor(m, &g, "output_norm.weight", d, 1, &m->out_norm, err, errlen)) ||
        (rc = read_rope_factors(m, &g, err, errlen)) ||
        (rc = read_rope_scaling(m, &g, a, err, errlen)))
        goto out;
    /* no output.weight: the output projection is tied to the embeddings */
    m->tied_output = !kvp_gguf_find_tensor(&g, "output.weight");
    if (m->tied_output)
        m->output = m->tok_embd;
    else if ((rc = matrix(m, &g, "output.weight", d, (uint64_t)c->vocab_size, &m->output, err, errlen)))
        goto out;
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = read_layer(m, &g, a, l, err, errlen)))
            goto out;
    if ((rc = kvp_tokenizer_load_gguf(&m->tok, &g, err, errlen)))
        goto out;
    if (m->tok.vocab_size != c->vocab_size) {
        rc = KVP_ERR(-EINVAL, "tokenizer has %d tokens, token_embd.weight %d", m->tok.vocab_size, c->vocab_size);
        goto out;
    }
    if ((rc = copy_chat_template(m, &g, err, errlen)))
        goto out;
    if (kvp_gguf_get_str(&g, "general.name", m->name, sizeof m->name)) {
        const char *base = strrchr(path, '/');
        snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    }
out:
    kvp_gguf_close(&g);
prefix:
    if (rc) {
        /* every message names the file */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", err);
        kvp_errorf(err, errlen, rc, "%s: %s", path, msg);
    }
    return rc;
}

static size_t matrix_bytes(const kvp_weight *w)
{
    return (size_t)w->rows * w->row_bytes;
}

/* Bytes one decoded token reads: every layer matrix, the output matrix, the norms (the
 * embedding contributes one row). */
static size_t weight_bytes(const kvp_model *m)
{
    const kvp_model_config *c = &m->cfg;
    size_t sum = matrix_bytes(&m->output) + (size_t)(2 * c->n_layers + 1) * c->dim * sizeof(float);
    for (int l = 0; l < c->n_layers; l++) {
        const kvp_layer *w = &m->layers[l];
        sum += matrix_bytes(&w->wq) + matrix_bytes(&w->wk) + matrix_bytes(&w->wv) +
               matrix_bytes(&w->wo) + matrix_bytes(&w->w_gate) + matrix_bytes(&w->w_down) +
               matrix_bytes(&w->w_up);
        if (w->post_attn_norm)   /* gemma's post-norms */
            sum += (size_t)2 * c->dim * sizeof(float);
    }
    return sum;
}

/* The shape, then each matrix's type and the first and last KiB of its bytes: cheap at
 * load for any size, and different for any two trainings or quantizations of a shape. */
static uint64_t mix_matrix(uint64_t h, const kvp_weight *w)
{
    size_t bytes = matrix_bytes(w), take = bytes < 1024 ? bytes : 1024;
    const unsigned char *d = w->data;
    h = kvp_fnv1a(h, &w->type, sizeof w->type);
    h = kvp_fnv1a(h, d, take);
    return kvp_fnv1a(h, d + bytes - take, take);
}

static uint64_t fingerprint(const kvp_model *m)
{
    const kvp_model_config *c = &m->cfg;
    int32_t shape[] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                       c->head_dim, c->vocab_size};
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, shape, sizeof shape);
    h = mix_matrix(h, &m->tok_embd);
    h = mix_matrix(h, &m->output);
    for (int l = 0; l < c->n_layers; l++) {
        const kvp_layer *y = &m->layers[l];
        const kvp_weight *each[] = {&y->wq, &y->wk, &y->wv, &y->wo, &y->w_gate, &y->w_down, &y->w_up};
        for (int i = 0; i < 7; i++)
            h = mix_matrix(h, each[i]);
    }
    return h ? h : 1;   /* 0 means unknown */
}

void kvp_model_use_cores(const kvp_model *m)
{
    static int all;
    if (!all)
        all = openblas_get_num_threads();
    uint64_t total = 0;
    for (int t = 0; t < KVP_N_WEIGHT_TYPES; t++)
        total += m->type_bytes[t];
    openblas_set_num_threads(m->type_bytes[KVP_GGML_F32] * 2 < total ? 1 : all);
}

void kvp_model_weight_mix(const kvp_model *m, char *buf, size_t len)
{
    int done[KVP_N_WEIGHT_TYPES] = {0};
    size_t at = 0;
    buf[0] = 0;
    for (;;) {
        int best = -1;
        for (int t = 0; t < KVP_N_WEIGHT_TYPES; t++)
            if (!done[t] && m->type_bytes[t] && (best < 0 || m->type_bytes[t] > m->type_bytes[best]))
                best = t;
        if (best < 0 || at >= len)
            return;
        done[best] = 1;
        int n = snprintf(buf + at, len - at, "%s%s %.1f MB", at ? ", " : "",
                         kvp_type_name((uint32_t)best), (double)m->type_bytes[best] / 1e6);
        at += n > 0 ? (size_t)n : 0;
    }
}

int kvp_model_load(kvp_model *m, const char *path, const char *tokenizer_path,
                   char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", path);
    char magic[4] = {0};
    FILE *f = kvp_fopen_input(path);
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, kvp_fileio_strerror(-errno));
        return -ENOENT;
    }
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    int rc = got == 4 && !memcmp(magic, "GGUF", 4)
                 ? load_gguf(m, path, err, errlen)
                 : load_llama2c(m, path, tokenizer_path, err, errlen);
    if (rc) {
        kvp_model_free(m);
        return rc < 0 ? rc : -EINVAL;
    }
    m->weight_bytes = weight_bytes(m);
    m->cfg.fingerprint = fingerprint(m);
    return 0;
}

void kvp_model_free(kvp_model *m)
{
    kvp_tokenizer_free(&m->tok);
    free(m->chat_template);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    if (m->map)
        munmap(m->map, m->map_size);
    memset(m, 0, sizeof *m);
}
