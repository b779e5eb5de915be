/* Training KVP agents with reinforcement learning on traces (the method:
 * ../shared/docs/kvp-method.md; settings and results: docs/training.md).
 *
 * An episode is (a training sequence, an agent (layer, KV head), a cut point n): the
 * cache holds rows 0..n-1 and the agent ranks the rows the shared rank-and-keep ranks,
 * n_sink..n-n_recent-1 (the sinks and the newest rows are always kept). A ranking sigma
 * is sampled from the Plackett-Luce distribution of the agent's scores by Gumbel-sort,
 * costs C(sigma) = sum over r of r * I_{sigma_r} against the future importance I(n),
 * and earns reward -C(sigma)/C*. K rankings per episode give a leave-one-out baseline;
 * advantages are normalised over the batch and clamped. A listwise term, the cross-entropy
 * between the rows' importance shares and the softmax of their scores, is added to the
 * loss with weight listwise (kvp_listwise_loss): it moves every row's score toward its
 * share of the future attention, including rows the sampled rankings almost never put
 * near the top (the policy gradient only learns from what the samples try). AdamW with
 * warm-up and cosine
 * decay, gradient-norm clipping and an EMA of the weights, which is what is saved.
 * Agents are independent: each has its own RNG stream and optimiser state, and a pool
 * of threads trains them side by side, so results do not depend on the thread count. */
#ifndef KVP_TRAIN_H
#define KVP_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "policy/kvp_agent.h"
#include "offline/trace.h"

/* ---- building blocks (exposed for the tests) ---------------------------------------- */

/* log pi(sigma) of a full ranking sigma (sigma[0] kept longest) of n items with scores s
 * under Plackett-Luce, in O(n) through a reverse cumulative logsumexp. When grad is not
 * NULL it receives d log pi / d s_i for every item i. work holds n doubles. */
double kvp_pl_logprob(const float *s, const int32_t *sigma, int n, float *grad,
                      double *work);

/* Sort keys for kvp_argsort_desc. */
typedef struct kvp_rank_key {
    float key;
    int32_t idx;
} kvp_rank_key;

/* order = indices of key sorted descending; ties (and NaN-free equal keys) keep the lower
 * index first, as rank-and-keep does. work holds n entries. */
void kvp_argsort_desc(const float *key, int n, int32_t *order, kvp_rank_key *work);

/* A Plackett-Luce sample: argsort of s_i + g_i with g_i ~ Gumbel(0, 1) from rng
 * (kvp_rand_f32). work holds n entries. */
void kvp_gumbel_rank(const float *s, int n, uint64_t *rng, int32_t *sigma,
                     kvp_rank_key *work);

/* C(sigma) = sum over r = 1..n of r * imp[sigma_r]. */
double kvp_rank_cost(const float *imp, const int32_t *sigma, int n);
/* C* = C of imp sorted descending (the minimum over rankings). work as kvp_argsort_desc,
 * order holds n. */
double kvp_oracle_cost(const float *imp, int n, int32_t *order, kvp_rank_key *work);
/* -C / max(C*, 1e-8) */
double kvp_rank_reward(double cost, double oracle_cost);

/* The listwise term: the cross-entropy between the importance shares p_i = imp_i / sum imp
 * and the scores' softmax q = softmax(s) over an episode's n rows,
 *   L = -sum_i p_i log q_i,   dL/ds_i = q_i - p_i.
 * Returns L and adds w * dL/ds_i to grad[i] (grad may be NULL). An episode whose
 * importance sums to 0 (or is not finite) has no target: 0, nothing added. */
double kvp_listwise_loss(const float *s, const float *imp, int n, float w, float *grad);

/* Leave-one-out advantages of n_ep episodes x k samples (reward[e*k + j]): each reward
 * minus the mean of its episode's other samples, then normalised by the mean and
 * standard deviation over the whole batch and clamped to [-clamp, clamp]. k >= 2. */
void kvp_rloo_advantages(const double *reward, int n_ep, int k, float clamp, float *adv);

typedef struct kvp_adamw {
    float beta1, beta2, eps, weight_decay;
} kvp_adamw;

/* One AdamW step at step t (1-based, for the bias corrections) with learning rate lr:
 * m, v are the moment estimates; weight decay is decoupled (w -= lr * wd * w). */
void kvp_adamw_step(const kvp_adamw *o, float lr, long t, float *w, const float *g,
                    float *m, float *v, size_t n);

/* Scales g to norm max_norm when it is longer; returns the norm before clipping. */
float kvp_clip_grad_norm(float *g, size_t n, float max_norm);

/* ema = decay * ema + (1 - decay) * w */
void kvp_ema_update(float *ema, const float *w, size_t n, float decay);

/* The rows chunked eviction ranks at cut n (the cache holds rows 0..n-1) at budget b
 * under the "kvp" policy's recent window w = kvp_agent_recent_window(b, cap, n_recent)
 * (cap: the layer's, kvp_agent_set_cap), when every row keeps a fixed score: the chunk
 * of rows n-w-chunk..n-w-1 that has just left the window, and the k = b - n_sink - w older rows still cached, which are
 * the top k by score of rows n_sink..n-w-chunk-1 (a row once outranked by k others stays
 * outranked; ties to the older row). score[i] is row i's score for i < n - w - chunk.
 * Writes the rows ascending into rows and returns their count; 0 when b evicts nothing
 * at n. order and work hold n entries. */
int kvp_train_stream_rows(const float *score, int n, int budget, int cap, int n_sink,
                          int n_recent, int chunk, int32_t *rows, int32_t *order,
                          kvp_rank_key *work);

/* ---- the trainer ---------------------------------------------------------------------- */

#define KVP_TRAIN_MAX_STREAM_BUDGETS 16

typedef struct kvp_train_cfg {
    long steps;          /* optimiser steps, every agent */
    uint64_t seed;       /* episodes and Gumbel noise (each agent its own stream) */
    int threads;         /* agents trained at once */
    int episodes;        /* episodes per step and agent */
    int samples;         /* rankings per episode (RLOO group), >= 2 */
    float lr;            /* peak learning rate */
    float lr_min;        /* end of the cosine decay */
    long warmup;         /* linear warm-up steps, from warmup_start * lr */
    float warmup_start;
    kvp_adamw adamw;
    float clip;          /* gradient-norm clip, per agent */
    float ema;           /* EMA decay of the saved weights */
    float adv_clamp;
    float listwise;      /* weight of the listwise term per episode (0: policy gradient
                            only); the policy-gradient loss is a mean over samples */
    int n_sink, n_recent;   /* rows always kept, as rank-and-keep (4, 16) */
    /* Streaming-shaped episodes (docs/training.md, "Streaming decisions"): this share of
     * the episodes (0: none, the plain cuts only) is the decision chunked eviction makes
     * at the cut for a budget drawn from stream_budgets: the agent ranks the rows that
     * just left the "kvp" policy's recent window (stream_chunk of them) together with
     * the older rows its current weights kept at the earlier evictions. */
    float stream_share;
    int stream_chunk;
    int n_stream_budgets;
    int stream_budgets[KVP_TRAIN_MAX_STREAM_BUDGETS];
    int val_cut;         /* validation ranks the first val_cut rows of each sequence (a cut
                            of the trace's grid); episodes use every cut of the grid */
    long eval_every;     /* validation and a progress line every so many steps */
    double max_seconds;  /* > 0: stop at the first validation past this much time (the
                            schedule is cut short, the EMA weights saved); 0: no limit */
    FILE *log;           /* progress lines; NULL: quiet */
    FILE *curve;         /* CSV: step,train_cost,val_cost,lr,elapsed_s; NULL: none */
} kvp_train_cfg;

/* The settings docs/training.md reports for stories260K. */
void kvp_train_defaults(kvp_train_cfg *c);

/* Learning rate at step t (0-based): linear warm-up, then cosine decay to lr_min. */
float kvp_train_lr(const kvp_train_cfg *c, long t);

/* Mean C/C* over the validation sequences (trace->h.n_train ..) and agents, ranking rows
 * n_sink..cut-n_recent-1 of the first `cut` rows by deterministic argsort of the agent
 * scores. per_agent (NULL or [n_layers * n_kv_heads]) receives each agent's mean.
 * 0, -EINVAL (cut not on the trace's grid, no validation sequence long enough) or
 * -ENOMEM, with a message. */
int kvp_train_validate(const kvp_trace *t, const kvp_agent_set *s, int cut, int n_sink,
                       int n_recent, int threads, double *mean, double *per_agent,
                       char *err, size_t errlen);

/* Trains every agent of s (initialised by the caller, shape checked against the trace)
 * on the training sequences of t and leaves the EMA weights in s. *val_cost (may be
 * NULL) gets the final validation C/C*. 0, -EINVAL (bad settings, trace too short) or
 * -ENOMEM, with a message. */
int kvp_train(const kvp_trace *t, kvp_agent_set *s, const kvp_train_cfg *c,
              double *val_cost, char *err, size_t errlen);

#endif
