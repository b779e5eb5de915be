/* A llama-family model (GGUF architectures llama, mistral, qwen2, qwen3, gemma2, gemma3,
 * phi3, or a llama2.c checkpoint): hyperparameters, weights (matrices in the file's own type, read into
 * memory as they are; see matmul.h), and its tokenizer. */
#ifndef KVP_MODEL_H
#define KVP_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "cache/rope.h"
#include "model/matmul.h"
#include "model/tokenizer.h"

typedef struct kvp_model_config {
    int dim;            /* residual width */
    int hidden_dim;     /* FFN width */
    int n_layers;
    int n_heads;        /* query heads */
    int n_kv_heads;     /* KV heads (GQA: n_heads % n_kv_heads == 0) */
    int head_dim;       /* per head, for Q, K and V (may differ from dim / n_heads) */
    int vocab_size;
    int seq_len;        /* trained context length */
    kvp_rope rope;      /* RoPE layout, rotated dims, base, frequency factors (the model's) */
    float rms_eps;
    /* What gemma2, gemma3 and phi3 add to llama's block. 0 everywhere means "as llama",
     * so a configuration built without them runs the llama block. */
    float embd_scale;       /* token embeddings times this (gemma: sqrt(dim)); 0: 1 */
    float query_scale;      /* attention scores times this; 0: 1/sqrt(head_dim) */
    float attn_softcap;     /* scores capped to c tanh(s/c) before mask and softmax; 0: none */
    float final_softcap;    /* logits capped the same way; 0: none */
    float rope_attn_factor; /* the rotated dims of q and k times this (phi3's LongRoPE
                               attn_factor: ggml scales cos and sin); 0: 1 */
    float rope_base_swa;    /* RoPE base of the sliding-window layers (gemma3: 10000 while
                               the global layers use rope.base); 0: rope.base */
    const float *rope_factors_swa; /* [rope.n_rot/2] the sliding-window layers' frequency
                               factors where they differ from rope.factors (gemma3's local
                               layers do not take its linear RoPE scaling); NULL: the same */
    int swa_window;         /* ARCH.attention.sliding_window when some layer has a window
                               (kvp_layer.window); 0: every layer sees the whole context */
    int gelu;               /* FFN: GeGLU with tanh GELU (gemma) instead of SwiGLU */
    uint64_t fingerprint; /* the weights' identity (kvp_model_load; policy files are bound
                             to it); 0 when unknown */
} kvp_model_config;

typedef struct kvp_layer {
    const float *attn_norm;   /* [dim] */
    kvp_weight wq;            /* [n_heads*head_dim][dim] */
    kvp_weight wk;            /* [n_kv_heads*head_dim][dim] */
    kvp_weight wv;            /* [n_kv_heads*head_dim][dim] */
    kvp_weight wo;            /* [dim][n_heads*head_dim] */
    const float *ffn_norm;    /* [dim] */
    kvp_weight w_gate;        /* [hidden][dim]  (llama2.c w1) */
    kvp_weight w_down;        /* [dim][hidden]  (w2) */
    kvp_weight w_up;          /* [hidden][dim]  (w3) */
    /* optional, NULL when the architecture has none */
    const float *bq;          /* [n_heads*head_dim]     Q bias (qwen2) */
    const float *bk;          /* [n_kv_heads*head_dim]  K bias (qwen2) */
    const float *bv;          /* [n_kv_heads*head_dim]  V bias (qwen2) */
    const float *q_norm;      /* [head_dim] per-head RMSNorm of q before RoPE (qwen3) */
    const float *k_norm;      /* [head_dim] the same for k (qwen3, gemma3) */
    const float *post_attn_norm; /* [dim] RMSNorm of the attention output before the
                                    residual add (gemma) */
    const float *post_ffn_norm;  /* [dim] the same for the FFN output (gemma) */
    int window;               /* sliding window: a query sees its own and the window - 1
                                 tokens before it; 0: the whole context */
} kvp_layer;

typedef struct kvp_model {
    kvp_model_config cfg;
    kvp_weight tok_embd;      /* [vocab][dim] */
    kvp_layer *layers;        /* [n_layers] */
    const float *out_norm;    /* [dim] */
    kvp_weight output;        /* [vocab][dim]; == tok_embd when tied */
    int tied_output;
    kvp_tokenizer tok;
    char *chat_template;      /* tokenizer.chat_template (NUL-terminated), NULL if absent;
                                 model/template.c renders its family */
    char arch[32];            /* general.architecture ("llama" for llama2.c checkpoints) */
    char name[128];           /* general.name or file basename */
    char path[512];
    /* ownership */
    void *map;
    size_t map_size;
    float **owned;            /* vectors (norms) a file stores in another type, as f32 */
    int n_owned;
    size_t weight_bytes;      /* bytes of weights one token reads (matrices in their file
                                 types, the output matrix, norms) */
    uint64_t type_bytes[KVP_N_WEIGHT_TYPES];  /* resident weight bytes by ggml type */
} kvp_model;

/* Loads a GGUF (by magic) or a llama2.c checkpoint. tokenizer_path is required for
 * llama2.c checkpoints (NULL: tokenizer.bin / tok<vocab>.bin beside the model) and
 * ignored for GGUF. Returns 0 or a negative code with a message in err. */
int kvp_model_load(kvp_model *m, const char *path, const char *tokenizer_path,
                   char *err, size_t errlen);
void kvp_model_free(kvp_model *m);
/* "Q4_K 120.5 MB, Q6_K 31.0 MB, F32 0.1 MB": the weight bytes by type, largest first. */
void kvp_model_weight_mix(const kvp_model *m, char *buf, size_t len);
/* Gives m's matrix work every core, for a process that runs one forward pass at a time:
 * OpenBLAS's threads when the matrices are mostly f32 (they go through sgemm/sgemv),
 * else the matmul pool's, with OpenBLAS (attention) on the calling thread so that its
 * idle threads do not spin against the pool. "All" is OpenBLAS's count at the first
 * call (OPENBLAS_NUM_THREADS or the CPUs). */
void kvp_model_use_cores(const kvp_model *m);

#endif
