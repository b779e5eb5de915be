#include "offline/oracle.h"

#include <string.h>

static const kvp_policy_ops oracle_ops = { .name = "oracle" };
static const kvp_policy_ops kvzip_ops = { .name = "kvzip" };

static int oracle_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen)
{
    (void)policy_file;
    (void)err;
    (void)errlen;
    p->ops = &oracle_ops;
    return 0;
}

static int kvzip_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen)
{
    (void)policy_file;
    (void)err;
    (void)errlen;
    p->ops = &kvzip_ops;
    return 0;
}

const char *kvp_offline_policy_names(void)
{
    return "none random streaming knorm keydiff lagkv h2o tova snapkv expected_attention kvp "
           "kvzap kvzip oracle";
}

int kvp_offline_policy_create(kvp_policy **out, const char *name, const char *policy_file,
                              const kvp_model_config *cfg, uint64_t seed, char *err,
                              size_t errlen)
{
    if (name && !strcmp(name, "oracle"))
        return kvp_policy_make(out, oracle_create, name, policy_file, cfg, seed, err, errlen);
    if (name && !strcmp(name, "kvzip"))
        return kvp_policy_make(out, kvzip_create, name, policy_file, cfg, seed, err, errlen);
    if (name && !strcmp(name, "kvzap"))
        return kvp_policy_create(out, "kvp", policy_file, cfg, seed, err, errlen);
    return kvp_policy_create(out, name, policy_file, cfg, seed, err, errlen);
}

int kvp_policy_is_oracle(const kvp_policy *p)
{
    return p && p->ops == &oracle_ops;
}

int kvp_policy_is_kvzip(const kvp_policy *p)
{
    return p && p->ops == &kvzip_ops;
}

int kvp_offline_policy_eval_only(const char *name)
{
    return name && (!strcmp(name, "oracle") || !strcmp(name, "kvzip"));
}
