/* The agents' network: one small scoring network per (layer, KV head) that ranks cached
 * rows by predicted future attention from the row's key, value and position alone
 * (docs/policy-format.md has the file layout, docs/training.md the method).
 *
 *   kh = LN(Wk k + bk)   vh = LN(Wv v + bv)   ph = LN(Emb[clamp(p, 0, pmax-1)])
 *   h1 = SiLU(LN(W1 [kh;vh;ph] + b1))   h2 = SiLU(LN(W2 h1 + b2))   s = w3.h2 + b3
 * where k is the key minus the mean key of the head's cached rows for agents with centred
 * keys (arch.centered, below), the key itself for the others, and for agents with relative
 * keys (arch.relative) that key turned back by the decision's position.
 *
 * Every LayerNorm has a learned gain and bias. An agent's parameters are one flat float
 * vector (layout in kvp_agent_layout), so an optimizer can treat it as a single array
 * and a gradient has the same shape. This header is what the scorer (policy/kvp_agent_net.c)
 * and the offline trainer share: the shape, the forward pass with its activation
 * buffers, and the limits a policy file's sizes are checked against. Training (init,
 * the backward pass) is in offline/agent_train.c; sets of agents, their file and the
 * "kvp" policy are policy/kvp_agent.h. */
#ifndef KVP_AGENT_NET_H
#define KVP_AGENT_NET_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/rope.h"

typedef struct kvp_agent_arch {
    int d;      /* input width = the model's head_dim */
    int P;      /* key / value projection width */
    int E;      /* position embedding width */
    int H;      /* hidden width */
    int pmax;   /* position table rows; positions >= pmax share the last row */
    int centered;   /* 1: an agent sees a key minus the mean key of the head's rows at the
                       decision (kvp_agent_key_mean, kvp_agent_center_keys); 0: the key */
    int relative;   /* 1: ... and that key turned back by the decision's position n with the
                       model's RoPE (kvp_agent_relative_keys); 0: as cached */
} kvp_agent_arch;

/* Defaults: the sizes of the shipped stories260K agents, which kvp learn builds too. */
#define KVP_AGENT_DEFAULT_P 32
#define KVP_AGENT_DEFAULT_E 4
#define KVP_AGENT_DEFAULT_H 32
#define KVP_AGENT_DEFAULT_PMAX 512

/* Offsets (in floats) of each parameter group inside one agent's vector, in file order.
 * Matrices are row-major [out][in]; ln*_g / ln*_b are LayerNorm gain / bias. */
typedef struct kvp_agent_layout {
    size_t wk, bk, lnk_g, lnk_b;        /* [P][d], [P], [P], [P] */
    size_t wv, bv, lnv_g, lnv_b;        /* [P][d], [P], [P], [P] */
    size_t emb, lne_g, lne_b;           /* [pmax][E], [E], [E] */
    size_t w1, b1, ln1_g, ln1_b;        /* [H][2P+E], [H], [H], [H] */
    size_t w2, b2, ln2_g, ln2_b;        /* [H][H], [H], [H], [H] */
    size_t w3, b3;                      /* [H], [1] */
    size_t n;                           /* total floats per agent */
} kvp_agent_layout;

/* Centred keys. Softmax attention does not change when one vector is added to every key
 * a query sees, so what decides a row's share of a head's attention is its key's offset
 * from the keys around it, not the key itself: with arch.centered the agents score
 * k - mean(keys of the head's cached rows) (the rows of the cache when it is ranked, all
 * of them, sinks and recent window included). mean[d] of keys k[n][d] (zeros for n 0): */
void kvp_agent_key_mean(int d, const float *k, int n, float *mean);
/* k[n][d] -= mean[d] */
void kvp_agent_center_keys(int d, float *k, int n, const float *mean);

/* Relative keys. A cached key is rotated by its own position p, and the query at position t
 * sees it through R(t - p): the same key content means something else to the queries that
 * follow depending on how far back it sits, which the key alone does not say. With
 * arch.relative an agent scores R(-n) k, the key as a query at the decision's position n
 * (the position the next token takes: a cut's length in training, the newest row's
 * position + 1 in the daemon) sees it, so the queries after the decision see it through
 * R(n - t) whatever n is: one frame for every decision. The rotation is the model's own
 * (kvp_agent_set.rope, checked against the model at load); rotating by -n is linear, so
 * it commutes with the centring. Turns k[m][d] back by n positions. */
void kvp_agent_relative_keys(const kvp_rope *r, int d, float *k, int m, int64_t n);

/* 0, or -EINVAL with a message when a size is outside what a policy file may hold
 * (each at least 1; d <= 4096, P, E, H <= 65536, pmax <= 2^24; centered 0 or 1). */
int kvp_agent_arch_check(const kvp_agent_arch *a, char *err, size_t errlen);
/* Layout for a checked arch. */
void kvp_agent_layout_of(const kvp_agent_arch *a, kvp_agent_layout *l);
size_t kvp_agent_n_params(const kvp_agent_arch *a);

/* Inference: scores of n rows (k, v: [n][d]; pos: [n]) into scores[n]. Batched with
 * sgemm for n > 1, a gemv path for n == 1; the two agree to float rounding. work holds
 * kvp_agent_score_work(a, n) floats. */
size_t kvp_agent_score_work(const kvp_agent_arch *a, int n);
void kvp_agent_score(const kvp_agent_arch *a, const float *params, const float *k,
                     const float *v, const int32_t *pos, int n, float *scores, float *work);

#define KVP_AGENT_MAX_D 4096
#define KVP_AGENT_MAX_WIDTH 65536
#define KVP_AGENT_MAX_PMAX (1 << 24)
#define KVP_AGENT_MAX_LAYERS 4096
#define KVP_AGENT_MAX_KV_HEADS 4096

/* Activation buffers of one forward pass; the x*hat / r* ones are NULL when scoring. */
typedef struct kvp_agent_fwd_bufs {
    float *x;        /* [n][2P+E] = [kh; vh; ph] */
    float *xhat;     /* [n][2P+E] normalised before gain/bias */
    float *rk, *rv, *re;
    float *a1, *z1hat, *r1, *h1;   /* [n][H]: LN output, its xhat, 1/std, SiLU(a1) */
    float *a2, *z2hat, *r2, *h2;
} kvp_agent_fwd_bufs;

/* Scores of n rows (k, v: [n][d]; pos: [n]) into scores[n], keeping the activations in f
 * (the training buffers when f->xhat is set). */
void kvp_agent_net_forward(const kvp_agent_arch *a, const float *w, const float *k,
                           const float *v, const int32_t *pos, int n,
                           const kvp_agent_fwd_bufs *f, float *scores);

/* The position table row of position p: clamped to [0, pmax). */
static inline int kvp_agent_pos_index(const kvp_agent_arch *a, int32_t p)
{
    return p < 0 ? 0 : p >= a->pmax ? a->pmax - 1 : (int)p;
}

static inline float kvp_agent_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* 0, or -EINVAL with a message "<what> = v is outside [1, max]". */
int kvp_agent_check_range(const char *what, int64_t v, int64_t max, char *err, size_t errlen);

#endif
