/* Sets of KVP agents (policy/kvp_agent_net.h has one agent's network): all the agents
 * of a model with their calibration, the policy file that holds them
 * (policy/kvp_agent_file.c) and the "kvp" policy's recent window
 * (policy/kvp_agent_policy.c, created through policy/policy.h). */
#ifndef KVP_AGENT_H
#define KVP_AGENT_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "policy/kvp_agent_net.h"

/* All agents of a model, layer-major: agent (layer, kvh) is at index
 * layer * n_kv_heads + kvh. */
#define KVP_POLICY_MODEL_NAME 64

#define KVP_AGENT_MAX_CAP_BUDGETS 16

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
    /* Agents with relative keys (arch.relative): the rotation they turn keys back with,
     * the model's RoPE (kvp_agent_set_rope; factors is the set's own copy). */
    kvp_rope rope;
    /* The most older rows the agents of a layer choose (the "kvp" policy's recent window,
     * kvp_agent_recent_window), fitted by `kvp fit-window` (offline/windowfit.h) at
     * n_cap_budgets budgets (ascending): at budget b a layer uses the cap of the largest
     * fitted budget <= b, and KVP_AGENT_CAP_DEFAULT(seq_len) below the smallest one or
     * where the table holds 0. caps NULL: the default everywhere. */
    int n_cap_budgets;
    int cap_budgets[KVP_AGENT_MAX_CAP_BUDGETS];
    int *caps;                /* [n_layers][n_cap_budgets] */
} kvp_agent_set;

/* The agents' share of a large budget without fitted caps: an eighth of the context. */
#define KVP_AGENT_CAP_DEFAULT(seq_len) ((seq_len) / 8)
#define KVP_AGENT_MAX_CAP (1 << 24)

#define KVP_CALIBRATION_MAX_KNOTS 256

/* Allocates (uninitialised) parameters for n_layers x n_kv_heads agents. 0, -EINVAL
 * (bad sizes) or -ENOMEM, with a message. */
int kvp_agent_set_alloc(kvp_agent_set *s, int n_layers, int n_kv_heads,
                        const kvp_agent_arch *a, char *err, size_t errlen);
void kvp_agent_set_free(kvp_agent_set *s);
/* Sets the rotation of agents with relative keys (a copy of r, factors included). -EINVAL
 * with a message when r is not a rotation of the set's head_dim (n_rot even, 2..head_dim,
 * base finite and > 0, factors finite and > 0), -ENOMEM. */
int kvp_agent_set_rope(kvp_agent_set *s, const kvp_rope *r, char *err, size_t errlen);

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

/* Sets (caps[n_layers][n_budgets] copied, each 0..KVP_AGENT_MAX_CAP, 0 the default; the
 * budgets 1..KVP_AGENT_MAX_CAP, strictly ascending, 1..KVP_AGENT_MAX_CAP_BUDGETS of them)
 * or clears (caps NULL) the fitted caps. -EINVAL with a message naming what is wrong,
 * -ENOMEM; the set is unchanged on error. */
int kvp_agent_set_caps(kvp_agent_set *s, int n_budgets, const int *budgets, const int *caps,
                       char *err, size_t errlen);
/* Layer's cap at budget: the fitted one, else KVP_AGENT_CAP_DEFAULT(seq_len) (seq_len: the
 * context the agents run in). */
int kvp_agent_set_cap(const kvp_agent_set *s, int layer, int budget, int seq_len);

/* The newest rows the "kvp" policy always keeps at a budget (its recent_window op) when
 * the agents choose at most cap older rows: max(budget / 2, budget - cap, n_recent)
 * (cap <= 0: no cap). Training mirrors the streaming decisions with it (offline/train.h). */
int kvp_agent_recent_window(int budget, int cap, int n_recent);

/* 0, or -EINVAL with a message naming agent (layer, kvh) when a knot is not finite, the
 * scores x[n_knots] are not strictly ascending or the values y[n_knots] decrease. */
int kvp_agent_check_knots(int n_knots, const float *x, const float *y, int layer, int kvh,
                          char *err, size_t errlen);

/* 0, or -EINVAL with a message starting with what: the set's shape (layers, KV heads,
 * head_dim) must be cfg's, a set bound to a model must be bound to cfg's weights, and
 * agents with relative keys need cfg's RoPE (checked when cfg is a loaded model, i.e.
 * has a fingerprint). */
int kvp_agent_set_check_model(const kvp_agent_set *s, const kvp_model_config *cfg,
                              const char *what, char *err, size_t errlen);

#endif
