/* Traces for training eviction policies: the unmodified model run with teacher forcing
 * over real text, keeping only what training reads. Per agent (layer, KV head) that is
 * the post-RoPE keys and the values of every position, in f16, and the future importance
 * of the rows at each cut of a grid, computed while tracing from the queries that follow
 * the cut (the queries themselves are not stored). A token costs
 * 4 * n_layers * n_kv_heads * head_dim bytes of keys and values plus the importance
 * targets, whatever the number of query heads: about 12 KB a token on Qwen2.5-0.5B's
 * shape, against 110 KB for f32 q, k and v.
 *
 * File layout (little-endian; docs/trace-format.md):
 *   header (struct kvp_trace_header, 144 bytes, magic "KVPTRACE", version 2; its last
 *   field says whether the per-cut scores are future importance or KVzip's scores)
 *   per sequence: i32 len, i32 tokens[len], then per agent a = layer * n_kv_heads + kvh:
 *       f16 k[len][head_dim], f16 v[len][head_dim],
 *       f32 I(n_g)[n_g] for each cut n_g = cut_min + g * cut_stride <= len - cut_tail
 *   u64 FNV-1a of everything before it. */
#ifndef KVP_TRACE_H
#define KVP_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"

/* The default grid of cuts (what `kvp trace` records and `kvp train` samples from). */
#define KVP_TRACE_CUT_MIN 64
#define KVP_TRACE_CUT_STRIDE 8
#define KVP_TRACE_CUT_TAIL 32

typedef struct kvp_trace_header {
    char magic[8];          /* "KVPTRACE" */
    uint32_t version;       /* 2 */
    int32_t n_layers, n_heads, n_kv_heads, head_dim, seq_len;
    int32_t n_seqs;         /* sequences in the file */
    int32_t n_train;        /* the first n_train are training data, the rest validation */
    double split;           /* fraction of the text (by bytes) the training part covers */
    uint64_t text_bytes;    /* size of the source text */
    uint64_t text_hash;     /* FNV-1a of the source text */
    char model[64];         /* model name, NUL-terminated */
    int32_t cut_min;        /* the grid of cuts with stored importance: cut_min, */
    int32_t cut_stride;     /* cut_min + cut_stride, ... */
    int32_t cut_tail;       /* ... while at least cut_tail future tokens follow */
    int32_t targets;        /* what the per-cut scores are: enum kvp_trace_targets */
} kvp_trace_header;

/* The per-cut row scores a trace stores (its training targets): the future importance
 * (kvp_importance_cuts, the default) or KVzip's context-reconstruction scores of the
 * prefix at each cut (offline/eval.h, kvp_eval_kvzip_scores: what a KVzap surrogate
 * learns to predict). */
enum kvp_trace_targets { KVP_TRACE_TARGETS_FUTURE = 0, KVP_TRACE_TARGETS_KVZIP = 1 };
/* "future" / "kvzip" -> the kind, -1 for anything else; and back. */
int kvp_trace_targets_parse(const char *name);
const char *kvp_trace_targets_name(int targets);

typedef struct kvp_trace {
    kvp_trace_header h;
    void *map;
    size_t size;
    size_t *offsets;        /* [n_seqs] byte offset of each sequence's len field */
} kvp_trace;

/* Maps and validates a trace (sizes, checksum). When cfg is given its shape must match. */
int kvp_trace_open(kvp_trace *t, const char *path, const kvp_model_config *cfg,
                   char *err, size_t errlen);
void kvp_trace_close(kvp_trace *t);

int kvp_trace_len(const kvp_trace *t, int seq);
const int32_t *kvp_trace_tokens(const kvp_trace *t, int seq);
/* Cuts of the grid a sequence of len tokens has (0 when it is too short). */
int kvp_trace_n_cuts(const kvp_trace_header *h, int len);
/* Index of cut n on the grid, or -1 when n is not on it. */
int kvp_trace_cut_index(const kvp_trace_header *h, int n);
/* Agent (layer, kvh) of a sequence: k and v [len][head_dim] in f16. */
const uint16_t *kvp_trace_k(const kvp_trace *t, int seq, int layer, int kvh);
const uint16_t *kvp_trace_v(const kvp_trace *t, int seq, int layer, int kvh);
/* Future importance of the first n_g rows at cut g (g < kvp_trace_n_cuts): I(n_g)[n_g]
 * (in a trace of KVzip targets, the KVzip scores of those rows at that cut). */
const float *kvp_trace_importance(const kvp_trace *t, int seq, int layer, int kvh, int g);

/* Future importance of the first rows of one KV head when the sequence continues to its
 * end, at every cut n_g = first + g * stride, g = 0..n_cuts-1:
 * I_i(n) = sum over t = n..len-1 of max over the group's query heads of the causal
 * softmax attention of query t on row i. q [len][n_heads * head_dim], k [len][n_kv_heads *
 * head_dim] (post-RoPE, as the forward pass taps them). One pass over the attention rows
 * from the last query back, so I(n) of each cut is the running sum when the pass reaches
 * row n. out[g] receives n_g floats; work holds kvp_importance_work(len) floats. The
 * scores of KVP_IMPORTANCE_BLOCK queries at a time are one sgemm per query head. */
#define KVP_IMPORTANCE_BLOCK 64
size_t kvp_importance_work(int len);
void kvp_importance_cuts(const float *q, const float *k, int len, int n_heads,
                         int n_kv_heads, int head_dim, int kvh, int first, int stride,
                         int n_cuts, float *const *out, float *work);

/* Text shared by `kvp trace` and `kvp eval`: the first `split` of the bytes, moved forward
 * to the next line start, is the training part, the rest the validation part. Returns
 * the offset of the validation part. */
size_t kvp_trace_split_at(const char *text, size_t len, double split);
/* Tokenizes text line by line (BPE merges never cross a newline, and encoding a whole
 * book at once is quadratic), without BOS. *out is malloc'd. Returns the count, or -1
 * on failure. */
long kvp_trace_tokenize(const kvp_tokenizer *tok, const char *text, size_t len, int **out);

/* Writer, used by `kvp trace`. */
typedef struct kvp_trace_writer {
    FILE *f;
    kvp_trace_header h;
    float *imp, **cuts;          /* every agent's importance at every cut */
    float *work;                 /* scratch of kvp_importance_cuts, one per thread */
    int slots;                   /* threads the importance runs on */
    uint16_t *half;              /* one agent's k or v in f16 */
    char path[1024], tmp[1040];
} kvp_trace_writer;

int kvp_trace_writer_open(kvp_trace_writer *w, const char *path, const kvp_trace_header *h,
                          char *err, size_t errlen);
/* q [len][n_heads*head_dim], k and v [len][n_kv_heads*head_dim] per layer ([n_layers]
 * pointers each, f32, post-RoPE): the writer computes the importance at the header's cuts
 * (the agents on the matmul pool's threads) and stores each agent's keys, values and
 * importance. */
int kvp_trace_writer_add(kvp_trace_writer *w, const int32_t *tokens, int len,
                         const float *const *q, const float *const *k, const float *const *v);
/* The same with the targets the caller computed (a trace of KVzip targets): scores[a * G +
 * g] (G = kvp_trace_n_cuts(&w->h, len)) holds agent a's n_g scores at cut g of the grid;
 * no queries are needed. */
int kvp_trace_writer_add_scores(kvp_trace_writer *w, const int32_t *tokens, int len,
                                const float *const *k, const float *const *v,
                                const float *const *scores);
/* Writes the checksum, fsyncs and renames into place. n_train as given. */
int kvp_trace_writer_close(kvp_trace_writer *w, int n_train, char *err, size_t errlen);
void kvp_trace_writer_abort(kvp_trace_writer *w);

#endif
