/* Policy confs: the policy new sessions take, its weights loaded once and shared, and the
 * identity their snapshots carry (the model and the policy's file). Made off the loop at
 * start and on SIGHUP (it reads files), swapped in with kvp_hub_set_policy. */
#include "sessions/hub.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"
#include "sessions/residency.h"
#include "turns/session.h"

static int weights_load(kvp_policy_conf *pc, const kvp_model *model, char *err, size_t errlen)
{
    return kvp_policy_weights_load(&pc->weights, pc->name, pc->file[0] ? pc->file : NULL,
                                   &model->cfg, err, errlen);
}

static void conf_free(kvp_policy_conf *pc)
{
    kvp_policy_weights_free(pc->weights);
    free(pc);
}

int kvp_hub_policy_make(const kvp_hub_policy_params *p, const kvp_model *model,
                        kvp_policy_conf **out, char *note, size_t notelen, char *err,
                        size_t errlen)
{
    *out = NULL;
    kvp_policy_conf *pc = calloc(1, sizeof *pc);
    if (!pc) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int dflt = !p->policy || !p->policy[0], found = dflt && p->default_file && p->default_file[0];
    if (dflt) {
        snprintf(pc->name, sizeof pc->name, "%s", found ? "kvp" : "streaming");
        if (found)
            snprintf(pc->file, sizeof pc->file, "%s", p->default_file);
    } else {
        snprintf(pc->name, sizeof pc->name, "%s", p->policy);
        /* Only kvp reads a file: another policy's identity must not depend on one. */
        if (!strcmp(pc->name, "kvp") && p->policy_file)
            snprintf(pc->file, sizeof pc->file, "%s", p->policy_file);
    }
    char why[256];
    int rc = weights_load(pc, model, why, sizeof why);
    if (rc < 0 && found) {
        /* The default must not keep the daemon from starting. */
        snprintf(note, notelen, "policy streaming: the default %s does not load (%s); "
                 "learned eviction for this model: kvp learn --model %s", pc->file, why,
                 p->model_path);
        snprintf(pc->name, sizeof pc->name, "streaming");
        pc->file[0] = '\0';
        rc = weights_load(pc, model, why, sizeof why);
    } else if (rc == 0 && dflt) {
        if (found)
            snprintf(note, notelen, "policy kvp with %s (the default for this model)", pc->file);
        else
            snprintf(note, notelen, "policy streaming (the default: there is no %s; learned "
                     "eviction for this model: kvp learn --model %s)",
                     p->looked ? p->looked : "policy file", p->model_path);
    } else if (rc == 0) {
        snprintf(note, notelen, "policy %s%s%s", pc->name, pc->file[0] ? " with " : "", pc->file);
    }
    if (rc < 0) {
        snprintf(err, errlen, "%s", why);
        conf_free(pc);
        return rc;
    }
    if ((rc = kvp_snapshot_identity_init(&pc->ident, model->name, p->model_path, pc->name,
                                         pc->file, err, errlen)) < 0) {
        conf_free(pc);
        return rc;
    }
    pc->refs = 1;
    *out = pc;
    return 0;
}

void kvp_hub_policy_unref(kvp_policy_conf *pc)
{
    kvp_policy_conf_unref(pc);
}

const char *kvp_hub_policy_name(const kvp_policy_conf *pc)
{
    return pc ? pc->name : "";
}

const char *kvp_hub_policy_file(const kvp_policy_conf *pc)
{
    return pc ? pc->file : "";
}

const char *kvp_hub_policy_names(void)
{
    return kvp_policy_names();
}

size_t kvp_hub_turn_bytes_for(const kvp_model *m, kvp_kv_type kv_type, int budget, int chunk,
                              const kvp_policy_conf *pc, int budget_mode)
{
    return kvp_turn_bytes(&m->cfg, kvp_cache_row_cost(kv_type, m->cfg.head_dim), budget, chunk,
                          pc->name, budget_mode);
}
