/* The agents' network as the scorer and the offline trainer share it: the forward pass
 * with its activation buffers (policy/kvp_agent.c), and the limits a policy file's sizes
 * are checked against. Training (the backward pass, init) is in offline/agent_train.c. */
#ifndef KVP_AGENT_NET_H
#define KVP_AGENT_NET_H

#include "policy/kvp_agent.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

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

/* 0, or -EINVAL with a message naming agent (layer, kvh) when a knot is not finite, the
 * scores x[n_knots] are not strictly ascending or the values y[n_knots] decrease. */
int kvp_agent_check_knots(int n_knots, const float *x, const float *y, int layer, int kvh,
                          char *err, size_t errlen);

/* 0, or -EINVAL with a message starting with what: the set's shape (layers, KV heads,
 * head_dim) must be cfg's, and a set bound to a model must be bound to cfg's weights. */
int kvp_agent_set_check_model(const kvp_agent_set *s, const kvp_model_config *cfg,
                              const char *what, char *err, size_t errlen);

#endif
