/* Eviction policies behind one interface. A policy scores rows when they enter a head's
 * store (KVP, K-Norm, Random, StreamingLLM), may observe attention or queries (H2O, TOVA,
 * SnapKV, Expected Attention), may rescore just before eviction (KeyDiff, LagKV, SnapKV,
 * Expected Attention), and then the shared rank-and-keep
 * step decides: protect the n_sink oldest rows and the newest window, keep the highest
 * scores of the rest up to the budget. */
#ifndef KVP_POLICY_H
#define KVP_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/model.h"

/* The rows every policy protects unless told otherwise: the oldest (attention sinks) and
 * the newest window. */
#define KVP_DEFAULT_SINKS 4
#define KVP_DEFAULT_RECENT 16

typedef struct kvp_policy kvp_policy;

typedef struct kvp_policy_ops {
    const char *name;
    int wants_attention;   /* the forward pass calls on_attention only when set */
    /* Rows [first, first+n) were just appended to h: set h->score (and h->stat) for them. */
    void (*on_insert)(kvp_policy *p, int layer, int kvh, kvp_head *h, int first, int n);
    /* Attention of the n_q newest queries of the KV group over h's rows (rows h->n, the
     * block's own rows included). Query head g (0..group-1) of query t: q at
     * q + t*q_stride + g*head_dim, probabilities at att + (g*n_q + t)*att_stride, with
     * zeros where the causal mask hides a row. */
    void (*on_attention)(kvp_policy *p, int layer, int kvh, kvp_head *h,
                         const float *q, int q_stride, const float *att, int att_stride,
                         int n_q);
    /* Optional: final scores right before rank-and-keep. */
    void (*before_evict)(kvp_policy *p, int layer, int kvh, kvp_head *h);
    /* Optional: newest rows of a head of `layer` always kept at this budget (default
     * p->n_recent). */
    int (*recent_window)(const kvp_policy *p, int layer, int budget);
    /* Optional: scores of head (layer, kvh) made comparable across heads, for global
     * budgets (in[n] raw, out[n]; NaN stays NaN). Default: the raw scores. */
    void (*calibrate)(const kvp_policy *p, int layer, int kvh, const float *in, int n,
                      float *out);
    void (*destroy)(kvp_policy *p);
    /* Optional: the cache's rows of tokens seq >= from were just taken back
     * (kvp_cache_drop_newest): forget what those tokens contributed to the state the
     * policy keeps beside the rows (SnapKV's query window, H2O's accumulators). */
    void (*truncate)(kvp_policy *p, kvp_cache *c, int64_t from);
    /* Optional: a rollback point at c->n_seen (the session marks the start of each
     * reply, where a regenerate cuts back to). */
    void (*mark)(kvp_policy *p, const kvp_cache *c);
    /* Optional, for policies with per-session state beside the rows (H2O's accumulators
     * and mark, SnapKV's query window): dst (the same policy, the same model shape)
     * takes a copy of src's state. 0 or -ENOMEM (dst's state is then unchanged). */
    int (*copy)(kvp_policy *dst, const kvp_policy *src);
} kvp_policy_ops;

struct kvp_policy {
    const kvp_policy_ops *ops;
    kvp_model_config cfg;
    int n_sink;       /* KVP_DEFAULT_SINKS */
    int n_recent;     /* KVP_DEFAULT_RECENT */
    uint64_t rng;
    void *impl;
};

/* Names: none random streaming knorm keydiff lagkv h2o tova snapkv expected_attention kvp
 * (the runtime policies; the evaluation-only oracle is offline/oracle.h). policy_file is required for
 * kvp and ignored otherwise. */
int kvp_policy_create(kvp_policy **out, const char *name, const char *policy_file,
                      const kvp_model_config *cfg, uint64_t seed, char *err, size_t errlen);
void kvp_policy_destroy(kvp_policy *p);
/* What a policy reads from its file (the kvp policy's agent weights), loaded once and
 * shared read-only by every instance made from it, so a daemon holds one copy however
 * many sessions use it: each instance adds only its per-session scratch. Loading checks
 * the policy as kvp_policy_create does (the same errors and messages); a policy without
 * a file keeps only its name. The weights must outlive every instance made from them. */
typedef struct kvp_policy_weights kvp_policy_weights;
int kvp_policy_weights_load(kvp_policy_weights **out, const char *name, const char *policy_file,
                            const kvp_model_config *cfg, char *err, size_t errlen);
void kvp_policy_weights_free(kvp_policy_weights *w);
/* A new instance of w's policy for cfg (the model w was loaded for); reads no file. */
int kvp_policy_create_shared(kvp_policy **out, const kvp_policy_weights *w,
                             const kvp_model_config *cfg, uint64_t seed, char *err,
                             size_t errlen);
/* Makes a policy with the constructor `create` (the registry's path, open to policies
 * defined outside it such as offline/oracle.h). */
int kvp_policy_make(kvp_policy **out,
                    int (*create)(kvp_policy *p, const char *policy_file, char *err, size_t errlen),
                    const char *name, const char *policy_file, const kvp_model_config *cfg,
                    uint64_t seed, char *err, size_t errlen);
/* Points forward hooks (a runstate's, or one sequence's of a batch) at p: scoring of new
 * rows, attention when p wants it; NULL clears them. The tap is left alone. */
void kvp_policy_attach(kvp_forward_hooks *hooks, kvp_policy *p);
/* The cache was cut back to its tokens seq < from (kvp_cache_drop_newest): the policy's
 * own state follows (a no-op for policies whose state is only the rows' scores). */
void kvp_policy_truncate(kvp_policy *p, kvp_cache *c, int64_t from);
/* Forking: dst, a policy of src's kind made for the same model, takes src's state (the
 * rng, n_sink / n_recent, and what ops->copy copies), then follows `cache` cut back to its
 * tokens seq < from (kvp_policy_truncate): cache is dst's own, a kvp_cache_fork of src's
 * cache at `from`. So dst decides as src would after its cache and state were cut back
 * the same way; src is not changed. 0, -EINVAL (another policy kind or model shape) or
 * -ENOMEM (dst unchanged). */
int kvp_policy_fork(kvp_policy *dst, const kvp_policy *src, kvp_cache *cache, int64_t from);
/* A rollback point at the cache's current length (see kvp_policy_ops.mark). */
void kvp_policy_mark(kvp_policy *p, const kvp_cache *c);
/* Space-separated list of every policy name (for --help and errors). */
const char *kvp_policy_names(void);
/* 1 for "none" (and for NULL, generate.h's "no policy"): never evicts. */
int kvp_policy_is_none(const kvp_policy *p);
/* 1 when p works on a cache whose heads share rows (kvp_cache_fork_shared): it reads
 * only the rows it is given as new outside an eviction (which unshares the head first).
 * 0 for the policies that observe attention or roll per-row state back (they read and
 * write every row at each step): their forks copy (kvp_cache_fork). NULL: 1. */
int kvp_policy_shares_rows(const kvp_policy *p);

/* Rank-and-keep on one head: when h->n > budget, keep the n_sink oldest rows, the
 * recent window, and the highest-scoring others to reach exactly `budget` rows
 * (ties: older row first; NaN scores rank last). When budget is at most the protected
 * rows, keep the sinks first, then the newest. budget <= 0 means unbounded (as in
 * generate.h). Returns the rows dropped, or -ENOMEM. */
int kvp_policy_evict_head(kvp_policy *p, kvp_cache *c, int layer, int kvh, int budget);
/* All heads. Returns the rows dropped, or -ENOMEM. */
int kvp_policy_evict(kvp_policy *p, kvp_cache *c, int budget);

/* Global budgets (budget_mode = global): the session keeps budget x heads rows in all,
 * shared among its heads by score. Every head keeps its sinks and recent window and its
 * best rows up to kvp_policy_head_floor (at least its one best other row: a calibration
 * is flat above its last knot, so it undervalues the rows a head ranks highest, and on
 * stories260K a head that lost them all cost 3.8x the KL at budget 32, docs/
 * quality-per-byte.md); the remaining rows go to the highest calibrated
 * scores of any head (calibrate() in policy.c), no head above kvp_policy_head_cap. So
 * the session holds at most budget x heads rows after an eviction (exactly that many when
 * it had more), a head at most its cap; between evictions each head grows by at most a
 * chunk (generate.h). A budget below the floor falls back to per-head eviction. Returns
 * the rows dropped, or -ENOMEM. */
enum kvp_budget_mode { KVP_BUDGET_PER_HEAD = 0, KVP_BUDGET_GLOBAL = 1 };
/* "per_head" / "global" -> the mode, -1 for anything else; and back. */
int kvp_budget_mode_parse(const char *name);
const char *kvp_budget_mode_name(int mode);
#define KVP_GLOBAL_CAP_FACTOR 4   /* a head's cap: 4 x budget */
#define KVP_GLOBAL_FLOOR_DIV 8    /* a head's floor: its protected rows + 1/8 of the rest (at least 1) */
int kvp_policy_evict_global(kvp_policy *p, kvp_cache *c, int budget);
int kvp_policy_head_cap(int budget);
/* The floor of the heads of `layer` (their protected rows depend on it). */
int kvp_policy_head_floor(const kvp_policy *p, int layer, int budget);

/* Constructors kvp_policy_create dispatches to by name (policy/baselines.c; "kvp" is
 * kvp_agent_policy_create below). Each installs p->ops (and p->impl) on a
 * policy whose cfg, n_sink, n_recent and rng are already set; on failure it frees what
 * it allocated and writes a message to err. A policy instance carries per-session state
 * (rng, SnapKV's query window): one instance per cache, used by one thread at a time. */
int kvp_none_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
int kvp_random_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
int kvp_streaming_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
int kvp_knorm_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
int kvp_keydiff_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
int kvp_lagkv_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
int kvp_h2o_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
int kvp_tova_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
int kvp_snapkv_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
int kvp_expected_attention_policy_create(kvp_policy *p, const char *policy_file, char *err,
                                         size_t errlen);
/* The "kvp" policy (policy/kvp_agent_policy.c, agents of policy/kvp_agent.h): loads
 * policy_file for p->cfg and sets p->ops and p->impl. Each row is scored once from its
 * k, v and pos, but lazily: on_insert marks new rows unscored (NaN) and before_evict
 * scores the unscored rows in sgemm batches before the shared rank-and-keep.
 * ops->destroy frees p->impl only. An instance is used by one thread at a time; its
 * scoring scratch is the thread's. */
int kvp_agent_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
/* The same policy on weights loaded once and shared read-only: the instance holds only
 * a pointer to set, which must outlive it (and match p->cfg's shape and model: -EINVAL
 * otherwise). */
struct kvp_agent_set;
int kvp_agent_policy_create_shared(kvp_policy *p, const struct kvp_agent_set *set, char *err,
                                   size_t errlen);

#endif
