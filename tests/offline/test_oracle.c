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

/* The offline registry is the runtime one plus the oracle. */
Test(oracle, offline_registry_adds_only_the_oracle)
{
    kvp_model_config cfg = test_cfg();
    char err[256];
    kvp_policy *p;
    cr_assert_eq(kvp_offline_policy_create(&p, "tova", NULL, &cfg, 1, err, sizeof err), 0);
    cr_assert_str_eq(p->ops->name, "tova");
    cr_assert_not(kvp_policy_is_oracle(p));
    kvp_policy_destroy(p);
    cr_assert_eq(kvp_offline_policy_create(&p, "lru", NULL, &cfg, 1, err, sizeof err), -EINVAL);
    char want[256];
    snprintf(want, sizeof want, "%s oracle", kvp_policy_names());
    cr_assert_str_eq(kvp_offline_policy_names(), want);
}
