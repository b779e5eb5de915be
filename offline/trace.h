/* Traces for training and evaluating eviction policies: the unmodified model run with
 * teacher forcing over real text, keeping per layer the post-RoPE queries, keys and
 * values of every position. Attention (and so future importance) is recomputed from
 * them, which is far smaller than storing attention matrices.
 *
 * File layout (little-endian; docs/trace-format.md):
 *   header (struct kvp_trace_header, 128 bytes, magic "KVPTRACE", version 1)
 *   per sequence: i32 len, i32 tokens[len], then per layer:
 *       f32 q[len][n_heads*head_dim], f32 k[len][n_kv_heads*head_dim], f32 v[same]
 *   u64 FNV-1a of everything before it. */
#ifndef KVP_TRACE_H
#define KVP_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"

typedef struct kvp_trace_header {
    char magic[8];          /* "KVPTRACE" */
    uint32_t version;       /* 1 */
    int32_t n_layers, n_heads, n_kv_heads, head_dim, seq_len;
    int32_t n_seqs;         /* sequences in the file */
    int32_t n_train;        /* the first n_train are training data, the rest validation */
    double split;           /* fraction of the text (by bytes) the training part covers */
    uint64_t text_bytes;    /* size of the source text */
    uint64_t text_hash;     /* FNV-1a of the source text */
    char model[64];         /* model name, NUL-terminated */
} kvp_trace_header;

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
/* Per layer: q [len][n_heads*head_dim], k and v [len][n_kv_heads*head_dim]. */
const float *kvp_trace_q(const kvp_trace *t, int seq, int layer);
const float *kvp_trace_k(const kvp_trace *t, int seq, int layer);
const float *kvp_trace_v(const kvp_trace *t, int seq, int layer);

/* Future importance of the first n rows of (layer, kvh) when the sequence continues to
 * its end: I_i(n) = sum over t = n..len-1 of max over the group's query heads of the
 * causal softmax attention of query t on row i. imp[n]; work holds 3 * len floats. */
void kvp_trace_importance(const kvp_trace *t, int seq, int layer, int kvh, int n,
                          float *imp, float *work);
/* The same at every cut n_g = first + g * stride, g = 0..n_cuts-1, from one pass over the
 * attention rows (from the last query back, so I(n) of each cut is the running sum when
 * the pass reaches row n): n_cuts times cheaper than one call per cut. out[g] receives
 * n_g floats; work holds 3 * len floats. */
void kvp_trace_importance_cuts(const kvp_trace *t, int seq, int layer, int kvh, int first,
                               int stride, int n_cuts, float *const *out, float *work);

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
    char path[1024], tmp[1040];
} kvp_trace_writer;

int kvp_trace_writer_open(kvp_trace_writer *w, const char *path, const kvp_trace_header *h,
                          char *err, size_t errlen);
/* q, k, v: per layer arrays as in the file layout, [n_layers] pointers each. */
int kvp_trace_writer_add(kvp_trace_writer *w, const int32_t *tokens, int len,
                         const float *const *q, const float *const *k, const float *const *v);
/* Writes the checksum, fsyncs and renames into place. n_train as given. */
int kvp_trace_writer_close(kvp_trace_writer *w, int n_train, char *err, size_t errlen);
void kvp_trace_writer_abort(kvp_trace_writer *w);

#endif
