/* KVP agents: one small scoring network per (layer, KV head) that ranks cached rows by
 * predicted future attention from the row's key, value and position alone
 * (docs/policy-format.md has the file layout, docs/training.md the method).
 *
 *   kh = LN(Wk k + bk)   vh = LN(Wv v + bv)   ph = LN(Emb[clamp(p, 0, pmax-1)])
 *   h1 = SiLU(LN(W1 [kh;vh;ph] + b1))   h2 = SiLU(LN(W2 h1 + b2))   s = w3.h2 + b3
 *
 * Every LayerNorm has a learned gain and bias. An agent's parameters are one flat float
 * vector (layout in kvp_agent_layout), so an optimizer can treat it as a single array
 * and a gradient has the same shape. Training (init, the backward pass) is offline, in
 * offline/agent_train.h. */
#ifndef KVP_AGENT_H
#define KVP_AGENT_H

#include <stddef.h>
#include <stdint.h>
#include "policy/policy.h"

typedef struct kvp_agent_arch {
    int d;      /* input width = the model's head_dim */
    int P;      /* key / value projection width */
    int E;      /* position embedding width */
    int H;      /* hidden width */
    int pmax;   /* position table rows; positions >= pmax share the last row */
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

/* 0, or -EINVAL with a message when a size is outside what a policy file may hold
 * (each at least 1; d <= 4096, P, E, H <= 65536, pmax <= 2^24). */
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

/* All agents of a model, layer-major: agent (layer, kvh) is at index
 * layer * n_kv_heads + kvh. */
#define KVP_POLICY_MODEL_NAME 64

typedef struct kvp_agent_set {
    int n_layers, n_kv_heads;
    kvp_agent_arch arch;      /* arch.d is the model's head_dim */
    size_t n_params;          /* per agent */
    float *params;            /* [n_layers * n_kv_heads][n_params] */
    /* The model the agents are for (kvp_model_config.fingerprint and its name); 0 and ""
     * when unbound (a version-1 file, or a set made for a bare shape). */
    uint64_t model_fingerprint;
    char model_name[KVP_POLICY_MODEL_NAME];
    /* Calibration (policy file version 3; `kvp calibrate`, offline/calibrate.h): per agent
     * a monotone piecewise-linear map from its raw score to the expected future attention
     * of the row, so scores compare across heads (global budgets). n_knots 0: none. */
    int n_knots;
    float *knots;             /* [agents][2][n_knots]: scores ascending, then the values */
} kvp_agent_set;

#define KVP_CALIBRATION_MAX_KNOTS 256

/* Allocates (uninitialised) parameters for n_layers x n_kv_heads agents. 0, -EINVAL
 * (bad sizes) or -ENOMEM, with a message. */
int kvp_agent_set_alloc(kvp_agent_set *s, int n_layers, int n_kv_heads,
                        const kvp_agent_arch *a, char *err, size_t errlen);
void kvp_agent_set_free(kvp_agent_set *s);

static inline float *kvp_agent_set_params(const kvp_agent_set *s, int layer, int kvh)
{
    return s->params + ((size_t)layer * (size_t)s->n_kv_heads + (size_t)kvh) * s->n_params;
}

/* Agent (layer, kvh)'s knots: x[n_knots] ascending, then y[n_knots] non-decreasing. */
static inline float *kvp_agent_set_knots(const kvp_agent_set *s, int layer, int kvh)
{
    return s->knots + ((size_t)layer * (size_t)s->n_kv_heads + (size_t)kvh) * 2u * (size_t)s->n_knots;
}
/* Sets (n_knots > 0, knots [agents][2][n_knots] copied after validation) or clears
 * (n_knots 0) the calibration. -EINVAL with a message when a knot is not finite, the
 * scores not strictly ascending or the values decreasing; -ENOMEM. */
int kvp_agent_set_calibration(kvp_agent_set *s, int n_knots, const float *knots, char *err,
                              size_t errlen);
/* The calibrated score of agent (layer, kvh) for raw scores in[n] into out[n]: linear
 * between knots, the end values outside them; NaN (unscored) stays NaN and an infinite
 * score stays infinite (-inf: a row the policy drops first, such as one leaving the
 * model's window). Without a calibration the raw scores are copied. */
void kvp_agent_calibrate(const kvp_agent_set *s, int layer, int kvh, const float *in, int n,
                         float *out);

/* Writes the policy file atomically (temporary file, fsync, rename). 0 or -errno. */
int kvp_agent_set_save(const kvp_agent_set *s, const char *path, char *err, size_t errlen);
/* Reads a policy file into an unallocated *s. When cfg is not NULL the file's shape
 * (layers, KV heads, head_dim) must match it. Errors, each with a message naming the
 * file: -errno (open), -EIO (read), -EINVAL (not a regular file, truncated, bad magic,
 * unknown version, bad or inconsistent sizes, trailing bytes, non-finite parameter,
 * shape mismatch, a file bound to other weights than cfg->fingerprint), -EBADMSG
 * (checksum mismatch), -ENOMEM. Sizes are validated against
 * the file size before anything is allocated. A file with a calibration is written as
 * version 3, one without as version 2; both load. */
int kvp_agent_set_load(kvp_agent_set *s, const char *path, const kvp_model_config *cfg,
                       char *err, size_t errlen);
/* How many times this process has read a policy file (kvp_agent_set_load calls, from
 * any thread): what shows that a daemon loads its policy's weights once, not per session. */
unsigned long long kvp_agent_set_loads(void);

/* The newest rows the "kvp" policy always keeps at a budget (its recent_window op):
 * max(budget / 2, budget - seq_len / 8, n_recent). Training mirrors the streaming
 * decisions with it (offline/train.h). */
int kvp_agent_recent_window(int budget, int seq_len, int n_recent);

/* The "kvp" policy: loads policy_file for p->cfg (filled by the caller) and sets p->ops
 * and p->impl. Each row is scored once from its k, v and pos, but lazily: on_insert marks
 * new rows unscored (NaN) and before_evict scores the unscored rows in sgemm batches
 * before the shared rank-and-keep. ops->destroy frees p->impl only.
 * An instance is used by one thread at a time; its scoring scratch is the thread's. */
int kvp_agent_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
/* The same policy on weights loaded once and shared read-only: the instance holds only
 * a pointer to set, which must outlive it (and match p->cfg's
 * shape and model: -EINVAL otherwise). */
int kvp_agent_policy_create_shared(kvp_policy *p, const kvp_agent_set *set, char *err,
                                   size_t errlen);

#endif
