/* Transformer forward pass over a batch of sequences, each with its own KV cache and its
 * own block of tokens (decode: 1; prefill: a chunk): the weight matrices run once over
 * all rows of the batch; K/V of each block are appended to every (layer, KV head) store
 * of its cache, and attention of each head runs over that head's own rows. */
#ifndef KVP_FORWARD_H
#define KVP_FORWARD_H

#include "model/model.h"
#include "cache/kvcache.h"

/* What the forward pass reports to the layers above it; every member is optional. The
 * generation layer fills score/attention from the session's eviction policy
 * (kvp_policy_attach, per sequence), trace recording sets tap. */
typedef struct kvp_forward_hooks {
    /* Rows [first, first+n) were just appended to h: set h->score (and h->stat). */
    void (*score)(void *ctx, int layer, int kvh, kvp_head *h, int first, int n);
    /* Attention of the KV group's n_q newest queries over h's rows (h->n, the block's
     * own rows included). Query head g of query t: q at q + t*q_stride + g*head_dim,
     * probabilities at att + (g*n_q + t)*att_stride, zeros where the causal mask hides a
     * row. NULL: nobody observes attention. The pass may call it for different KV heads
     * of one sequence at once, from different threads (after every score call of the
     * layer): it may touch only that head's rows and state. */
    void (*attention)(void *ctx, int layer, int kvh, kvp_head *h, const float *q,
                      int q_stride, const float *att, int att_stride, int n_q);
    void *ctx;
    /* Per layer after Q/K/V are computed and rotated. q: [n][n_heads*head_dim],
     * k, v: [n][n_kv_heads*head_dim]. */
    void (*tap)(void *tap_ctx, int layer, const float *q, const float *k, const float *v,
                int n);
    void *tap_ctx;
} kvp_forward_hooks;

typedef struct kvp_runstate {
    int max_tokens;     /* largest block */
    float *x;           /* [T][dim] residual stream */
    float *xb, *xb2;    /* [T][dim] */
    float *q;           /* [T][n_heads*head_dim] */
    float *k, *v;       /* [T][n_kv_heads*head_dim] */
    float *att_out;     /* [T][n_heads*head_dim] */
    float *hb, *hb2;    /* [T][hidden] */
    /* [group*T][rows] attention probabilities of one KV group, one buffer for each
     * thread of the pass (kvp_matmul_parallel's slot) */
    float *att[KVP_MATMUL_MAX_THREADS];
    size_t att_cap[KVP_MATMUL_MAX_THREADS];
    float *logits;      /* [vocab] logits of the last token of kvp_forward's block */
    float *batch_logits; /* [seqs][vocab] the last rows' logits of a batched step */
    int batch_logits_cap;
    float *rope;        /* [T][n_rot] cos/sin of each block position */
    float *rope_swa;    /* the same with the sliding-window layers' base (gemma3), or NULL
                           when they rotate as the others */
    kvp_forward_hooks hooks;
} kvp_runstate;

int kvp_runstate_init(kvp_runstate *s, const kvp_model_config *cfg, int max_tokens);
void kvp_runstate_free(kvp_runstate *s);

/* One sequence of a batched step: its own cache, its own block of tokens (1 to decode,
 * a chunk to prefill), where its logits go and what the pass reports to it. */
typedef struct kvp_batch_seq {
    kvp_cache *cache;          /* distinct for every sequence of the batch */
    const int *tokens;         /* [n] at positions cache->next_pos.. */
    int n;
    float *logits;             /* [vocab]: the logits of the block's last token; NULL: the
                                  pass points it at them in the runstate (valid until its
                                  next pass) */
    float *all_logits;         /* NULL or [n][vocab] */
    float *hidden;             /* NULL or [dim]: the block's last row after the final norm,
                                  the input of the output projection (kvp_forward_logits
                                  turns it into its logits) */
    kvp_forward_hooks hooks;   /* this sequence's policy and tap */
    int rc;                    /* in: nonzero leaves the sequence out (rc kept);
                                  out: 0, or why it did not run (its cache is unchanged) */
    int row0;                  /* the pass's own: the block's first row in the batch */
} kvp_batch_seq;

/* One forward step over a batch: embedding, norms, the Q/K/V and output projections,
 * the FFN and the logits run once over all rows of the batch (T = sum of n <=
 * s->max_tokens); RoPE, attention and the hooks run per sequence over its own cache.
 * A sequence whose tokens are out of range, or whose cache cannot grow, gets rc < 0
 * and is left out; the others run. Returns 0, or negative when the batch itself is
 * malformed (no sequence then runs). s->hooks are not used: each sequence has its own. */
int kvp_forward_batch(const kvp_model *m, kvp_runstate *s, kvp_batch_seq *seqs, int n_seqs);

/* logits[n][vocab] from n final-normed hidden rows x[n][dim] (kvp_batch_seq.hidden): the
 * output projection and the model's logit soft cap, as the forward pass computes them. */
void kvp_forward_logits(const kvp_model *m, const float *x, int n, float *logits);

/* A batch of one: tokens[0..n) at positions cache->next_pos.. with s->hooks (n <=
 * s->max_tokens; the caller keeps next_pos + n <= seq_len, see generate/generate.h).
 * all_logits: NULL or [n][vocab]. The last token's logits are always left in s->logits.
 * Returns 0 or negative. */
int kvp_forward(const kvp_model *m, kvp_runstate *s, kvp_cache *c,
                const int *tokens, int n, float *all_logits);

#endif
