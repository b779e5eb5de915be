/* Policy confs and SIGHUP reloads. */
#include "daemon/reload.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/notify.h"
#include "sessions/residency.h"
#include "policy/policy.h"

void kvpd_hub_config_sync(kvpd *d)
{
    d->hub_cfg = (kvp_hub_config){
        .budget = d->cfg.budget, .max_tokens = d->cfg.max_tokens,
        .temperature = d->cfg.temperature, .max_sessions = d->cfg.max_sessions,
        .max_cache_bytes = d->cfg.max_cache_bytes, .idle_timeout_s = d->cfg.idle_timeout_s,
        .max_sessions_per_client = d->cfg.max_sessions_per_connection,
        .max_history_tokens = d->cfg.max_history_tokens,
        .max_prompt_tokens = d->cfg.max_prompt_tokens,
        .max_sessions_per_tenant = kvpd_tenant_cap(&d->cfg)};
}

int kvpd_tenant_cap(const kvpd_config *c)
{
    if (c->max_sessions_per_tenant > 0)
        return c->max_sessions_per_tenant;
    /* several tenants: none may take more than half the resident slots */
    return c->n_api_keys > 1 ? (c->max_sessions / 2 > 0 ? c->max_sessions / 2 : 1) : 0;
}

void kvpd_announce_ready(kvpd *d)
{
    kvp_hub_info info;
    kvp_hub_info_get(d->hub, &info);
    kvpd_notify("READY=1\nSTATUS=serving on %s:%d: model %s, policy %s, budget %d, "
                "%d resident session(s)", d->cfg.listen_host, d->web.port, d->model.name,
                d->pconf->name, d->cfg.budget, info.sessions_resident);
}

/* One turn's cache reservation under cfg's budget and pc's policy. */
static size_t turn_bytes(const kvpd *d, const kvpd_config *cfg, const kvp_policy_conf *pc)
{
    const kvp_model_config *m = &d->model.cfg;
    return kvp_turn_bytes(m, kvp_cache_row_cost(cfg->kv_type, m->head_dim), cfg->budget,
                          cfg->chunk, pc->name, cfg->budget_mode);
}

/* Loads the policy's file into pc: the one copy every session under pc shares. */
static int policy_loads(kvp_policy_conf *pc, const kvp_model *model, char *err, size_t errlen)
{
    return kvp_policy_weights_load(&pc->weights, pc->name, pc->file[0] ? pc->file : NULL,
                                   &model->cfg, err, errlen);
}

static void conf_free(kvp_policy_conf *pc)
{
    kvp_policy_weights_free(pc->weights);
    free(pc);
}

int kvpd_policy_conf_make(const kvpd_config *cfg, const kvp_model *model,
                          const kvp_snapshot_identity *model_ident, kvp_policy_conf **out,
                          char *note, size_t notelen, char *err, size_t errlen)
{
    kvp_policy_conf *pc = calloc(1, sizeof *pc);
    if (!pc) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    char looked[KVP_SESSION_PATH_MAX];
    int dflt = !cfg->policy[0], found = 0;
    if (dflt) {
        found = kvpd_config_default_policy(cfg, pc->name, sizeof pc->name, looked, sizeof looked);
        if (found)
            snprintf(pc->file, sizeof pc->file, "%s", looked);
    } else {
        snprintf(pc->name, sizeof pc->name, "%s", cfg->policy);
        /* Only kvp reads a file: another policy's identity must not depend on one. */
        if (!strcmp(pc->name, "kvp"))
            snprintf(pc->file, sizeof pc->file, "%s", cfg->policy_file);
    }
    char why[256];
    int rc = policy_loads(pc, model, why, sizeof why);
    if (rc < 0 && found) {
        /* The default must not keep the daemon from starting. */
        snprintf(note, notelen, "policy streaming: the default %s does not load (%s); "
                 "learned eviction for this model: kvp learn --model %s", pc->file, why, cfg->model);
        snprintf(pc->name, sizeof pc->name, "streaming");
        pc->file[0] = '\0';
        rc = policy_loads(pc, model, why, sizeof why);
    } else if (rc == 0 && dflt) {
        if (found)
            snprintf(note, notelen, "policy kvp with %s (the default for this model)", pc->file);
        else
            snprintf(note, notelen, "policy streaming (the default: there is no %s; learned "
                     "eviction for this model: kvp learn --model %s)", looked, cfg->model);
    } else if (rc == 0) {
        snprintf(note, notelen, "policy %s%s%s", pc->name, pc->file[0] ? " with " : "", pc->file);
    }
    if (rc < 0) {
        snprintf(err, errlen, "%s", why);
        conf_free(pc);
        return rc;
    }
    pc->ident = *model_ident;
    snprintf(pc->ident.policy_name, sizeof pc->ident.policy_name, "%s", pc->name);
    pc->ident.policy_hash = 0;
    if (pc->file[0] && (rc = kvp_snapshot_hash_file(pc->file, UINT64_MAX, &pc->ident.policy_hash,
                                                    err, errlen)) < 0) {
        conf_free(pc);
        return rc;
    }
    pc->refs = 1;
    *out = pc;
    return 0;
}

size_t kvpd_turn_bytes(const kvpd *d)
{
    return turn_bytes(d, &d->cfg, d->pconf);
}

typedef struct reload_job {
    uv_work_t work;
    kvpd *d;
    int workers;               /* the running value, for a config that leaves it to kvpd */
    kvpd_config cfg;
    kvp_policy_conf *pc;
    char note[768], err[768];
    int rc;
} reload_job;

static void reload_work(uv_work_t *w)
{
    reload_job *j = w->data;
    kvpd *d = j->d;
    enum kvpd_action action;
    j->rc = kvpd_config_from_args(&j->cfg, d->argc, d->argv, &action, j->err, sizeof j->err);
    if (j->rc == 0)
        j->rc = kvpd_config_resolve_state_dir(&j->cfg, j->err, sizeof j->err);
    if (j->rc == 0)
        j->rc = kvpd_config_validate(&j->cfg, j->err, sizeof j->err);
    if (j->rc == 0)
        j->rc = kvpd_config_load_keys(&j->cfg, j->err, sizeof j->err);
    if (j->rc == 0) {
        if (j->cfg.workers == 0)
            j->cfg.workers = j->workers;
        j->rc = kvpd_policy_conf_make(&j->cfg, &d->model, &d->model_ident, &j->pc, j->note,
                                      sizeof j->note, j->err, sizeof j->err);
    }
}

static void refuse(kvpd *d, const char *why)
{
    d->metrics.reloads_refused++;
    kvpd_log("error", "reload refused: %s (the previous configuration keeps serving)", why);
}

static void reload_done(uv_work_t *w, int status)
{
    reload_job *j = w->data;
    kvpd *d = j->d;
    d->reloading = 0;
    if (d->draining) {
        /* shutting down: nothing to apply */
    } else if (status < 0) {
        refuse(d, uv_strerror(status));
    } else if (j->rc < 0) {
        refuse(d, j->err);
    } else if (j->cfg.max_cache_bytes && j->cfg.max_cache_bytes < turn_bytes(d, &j->cfg, j->pc)) {
        char why[256];
        snprintf(why, sizeof why, "max_cache_bytes %llu is less than one turn needs (%zu)",
                 (unsigned long long)j->cfg.max_cache_bytes, turn_bytes(d, &j->cfg, j->pc));
        refuse(d, why);
    } else {
        char fixed[512];
        kvpd_config_apply_live(&d->cfg, &j->cfg, fixed, sizeof fixed);
        kvpd_hub_config_sync(d);
        kvp_policy_conf_unref(d->pconf);
        d->pconf = j->pc;
        j->pc = NULL;
        kvp_hub_set_policy(d->hub, d->pconf);
        d->metrics.reloads++;
        kvpd_log("info", "reloaded: %s, budget %d, max_sessions %d, max_cache_bytes %llu",
                 j->note, d->cfg.budget, d->cfg.max_sessions,
                 (unsigned long long)d->cfg.max_cache_bytes);
        if (fixed[0])
            kvpd_log("warning", "reload: %s changed; that takes a restart", fixed);
    }
    kvp_policy_conf_unref(j->pc);
    free(j);
    if (d->draining)
        return;
    kvpd_announce_ready(d);
    if (d->reload_again) {
        d->reload_again = 0;
        kvpd_reload(d);
    }
}

void kvpd_reload(kvpd *d)
{
    if (d->draining)
        return;
    if (!d->hub) {
        kvpd_log("warning", "reload ignored: the model is still loading");
        return;
    }
    if (d->reloading) {   /* one at a time; the last SIGHUP's files win */
        d->reload_again = 1;
        return;
    }
    reload_job *j = calloc(1, sizeof *j);
    if (!j) {
        refuse(d, "out of memory");
        return;
    }
    j->d = d;
    j->workers = d->cfg.workers;
    j->work.data = j;
    int rc = uv_queue_work(&d->loop, &j->work, reload_work, reload_done);
    if (rc < 0) {
        free(j);
        refuse(d, uv_strerror(rc));
        return;
    }
    d->reloading = 1;
    kvpd_log("info", "SIGHUP: reloading the configuration");
    kvpd_notify("RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading the configuration",
                (unsigned long long)(kvp_now() * 1e6));
}
