/* The evaluation-only eviction policies. They score nothing themselves; the evaluator
 * writes each row's score into h->score before every eviction, so the shared
 * rank-and-keep step keeps the rows those scores rank first:
 *   oracle  the true future importance of each row (the attention the text still to come
 *           pays it);
 *   kvzip   KVzip's context-reconstruction scores (offline/eval.h,
 *           kvp_eval_kvzip_scores): the attention a teacher-forced "repeat the context"
 *           pass pays each row, too costly to run live.
 * They are not in the runtime registry (policy/policy.h): the daemon cannot serve them. */
#ifndef KVP_ORACLE_H
#define KVP_ORACLE_H

#include "policy/policy.h"

/* Every runtime policy, "kvzap", "kvzip" and "oracle". */
const char *kvp_offline_policy_names(void);
/* kvp_policy_create, with "kvzap", "kvzip" and "oracle" too. "kvzap" is the "kvp" policy
 * on policy_file, a KVzap surrogate: agents trained (kvp train) on a trace of KVzip
 * targets (kvp trace --targets kvzip), so they predict KVzip's scores from each row's k,
 * v and position; it runs live, as "kvp" with that file (the name only tells the
 * evaluation's tables which file it is). */
int kvp_offline_policy_create(kvp_policy **out, const char *name, const char *policy_file,
                              const kvp_model_config *cfg, uint64_t seed, char *err,
                              size_t errlen);
/* 1 when p is the oracle (its scores come from the evaluator). */
int kvp_policy_is_oracle(const kvp_policy *p);
/* 1 when p is kvzip (its scores come from the evaluator's reconstruction pass). */
int kvp_policy_is_kvzip(const kvp_policy *p);
/* 1 for the names of the evaluation-only policies (oracle, kvzip): they have no replies
 * protocol, whose decode driver cannot hand them the evaluator's scores. */
int kvp_offline_policy_eval_only(const char *name);

#endif
