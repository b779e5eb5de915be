/* Quality of a forked cache (`kvp forkeval`, docs/evaluation.md "Forked caches").
 * When the daemon forks a conversation, the new session starts from the source's
 * compressed cache cut at the divergence point (kvp_cache_fork, kvp_policy_fork): rows
 * the source had already evicted while it went on past that point stay evicted. For one
 * sequence P | A | B (a shared prefix, the source's continuation, the fork's own):
 *   full     P + B prefilled without eviction (the reference);
 *   source   P + A prefilled under the policy at the budget (chunked eviction);
 *   fork     the source cut at |P|, then B prefilled under the same policy and budget;
 *   scratch  P + B prefilled from an empty cache under the same policy and budget.
 * The one-shot KL(full || fork) and KL(full || scratch) of the next-token distribution
 * after B measure what the fork costs against a fresh prefill. */
#ifndef KVP_FORKEVAL_H
#define KVP_FORKEVAL_H

#include "generate/generate.h"
#include "model/forward.h"
#include "policy/policy.h"

typedef struct kvp_forkeval_case {
    const int *prefix;  /* P, BOS first */
    int n_prefix;
    const int *source;  /* A: the source's continuation */
    int n_source;
    const int *branch;  /* B: the fork's continuation */
    int n_branch;
    int budget;         /* rows per KV head; 0 = no eviction */
    int chunk;          /* eviction chunk, 0 = KVP_DEFAULT_CHUNK */
} kvp_forkeval_case;

/* Runs the four caches of one case. src, fork and scratch are three fresh instances of
 * the same policy (per-sequence state); fork takes src's state by kvp_policy_fork.
 * full_logits: the reference's next-token logits after P + B (vocab floats), computed by
 * kvp_forkeval_full. *kl_fork and *kl_scratch get the KLs. fork_cache / scratch_cache,
 * when not NULL, receive the two caches after B (uninitialised on entry, the caller's
 * to kvp_cache_free on success). 0 or a negative code. */
int kvp_forkeval_run(const kvp_model *m, kvp_runstate *s, const kvp_forkeval_case *fc,
                     kvp_policy *src, kvp_policy *fork, kvp_policy *scratch,
                     const float *full_logits, double *kl_fork, double *kl_scratch,
                     kvp_cache *fork_cache, kvp_cache *scratch_cache);

/* The reference: P + B without eviction; out gets vocab floats. 0 or a negative code. */
int kvp_forkeval_full(const kvp_model *m, kvp_runstate *s, const kvp_forkeval_case *fc,
                      float *out);

#endif
