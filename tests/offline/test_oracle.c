/* offline/oracle.c: the evaluation-only policy and the offline registry. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "offline/oracle.h"

static kvp_model_config test_cfg(void)
{
    kvp_model_config c = {.dim = 32, .hidden_dim = 64, .n_layers = 2, .n_heads = 2,
                          .n_kv_heads = 2, .head_dim = 16, .vocab_size = 10,
                          .seq_len = 256, .rope = {.n_rot = 16, .base = 10000.0f}, .rms_eps = 1e-5f};
    return c;
}

/* The oracle computes nothing: the evaluator's scores are all that ranks. */
Test(oracle, never_scores)
{
    kvp_model_config cfg = test_cfg();
    char err[256];
    kvp_policy *p;
    cr_assert_eq(kvp_offline_policy_create(&p, "oracle", NULL, &cfg, 1, err, sizeof err), 0);
    cr_assert(kvp_policy_is_oracle(p));
    cr_assert_null(p->ops->on_insert);
    cr_assert_null(p->ops->on_attention);
    cr_assert_null(p->ops->before_evict);
    kvp_policy_destroy(p);
}

/* kvzip computes nothing either: its scores are the evaluator's reconstruction pass. */
Test(oracle, kvzip_never_scores)
{
    kvp_model_config cfg = test_cfg();
    char err[256];
    kvp_policy *p;
    cr_assert_eq(kvp_offline_policy_create(&p, "kvzip", NULL, &cfg, 1, err, sizeof err), 0);
    cr_assert(kvp_policy_is_kvzip(p));
    cr_assert_not(kvp_policy_is_oracle(p));
    cr_assert_str_eq(p->ops->name, "kvzip");
    cr_assert_null(p->ops->on_insert);
    cr_assert_null(p->ops->on_attention);
    cr_assert_null(p->ops->before_evict);
    kvp_policy_destroy(p);
}

/* The offline registry is the runtime one plus kvzap (the kvp policy on a KVzap
 * surrogate's file: it needs one) and the evaluation-only kvzip and oracle. */
Test(oracle, offline_registry_adds_only_kvzap_kvzip_and_the_oracle)
{
    kvp_model_config cfg = test_cfg();
    char err[256];
    kvp_policy *p;
    cr_assert_eq(kvp_offline_policy_create(&p, "tova", NULL, &cfg, 1, err, sizeof err), 0);
    cr_assert_str_eq(p->ops->name, "tova");
    cr_assert_not(kvp_policy_is_oracle(p));
    cr_assert_not(kvp_policy_is_kvzip(p));
    kvp_policy_destroy(p);
    cr_assert_eq(kvp_policy_create(&p, "kvzip", NULL, &cfg, 1, err, sizeof err), -EINVAL,
                 "the runtime registry has no kvzip");
    cr_assert(kvp_offline_policy_eval_only("kvzip") && kvp_offline_policy_eval_only("oracle"));
    cr_assert_not(kvp_offline_policy_eval_only("expected_attention"));
    cr_assert_not(kvp_offline_policy_eval_only("kvzap"));
    cr_assert_neq(kvp_offline_policy_create(&p, "kvzap", NULL, &cfg, 1, err, sizeof err), 0,
                  "kvzap without its file");
    cr_assert_eq(kvp_offline_policy_create(&p, "lru", NULL, &cfg, 1, err, sizeof err), -EINVAL);
    char want[256];
    snprintf(want, sizeof want, "%s kvzap kvzip oracle", kvp_policy_names());
    cr_assert_str_eq(kvp_offline_policy_names(), want);
}
