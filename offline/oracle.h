/* The oracle: an evaluation-only eviction policy. It scores nothing itself; the evaluator
 * writes each row's true future importance into h->score before every eviction, so the
 * shared rank-and-keep step keeps the rows a perfect policy would. It is not in the
 * runtime registry (policy/policy.h): the daemon cannot serve it. */
#ifndef KVP_ORACLE_H
#define KVP_ORACLE_H

#include "policy/policy.h"

/* Every runtime policy and "oracle". */
const char *kvp_offline_policy_names(void);
/* kvp_policy_create, with "oracle" too. */
int kvp_offline_policy_create(kvp_policy **out, const char *name, const char *policy_file,
                              const kvp_model_config *cfg, uint64_t seed, char *err,
                              size_t errlen);
/* 1 when p is the oracle (its scores come from the evaluator). */
int kvp_policy_is_oracle(const kvp_policy *p);

#endif
