/* Policy confs and SIGHUP reloads. */
#include "daemon/reload.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "daemon/notify.h"

void kvpd_hub_config_sync(kvpd *d)
{
    d->hub_cfg = (kvp_hub_config){
        .budget = d->cfg.budget, .max_tokens = d->cfg.max_tokens,
        .temperature = d->cfg.temperature, .max_sessions = d->cfg.max_sessions,
        .max_cache_bytes = d->cfg.max_cache_bytes, .idle_timeout_s = d->cfg.idle_timeout_s,
        .max_sessions_per_client = d->cfg.max_sessions_per_connection,
        .max_history_tokens = d->cfg.max_history_tokens,
        .canary_rate = d->cfg.canary_rate,
        .max_stored_responses_per_tenant = d->cfg.max_stored_responses_per_tenant,
        .max_stored_response_bytes_per_tenant = d->cfg.max_stored_response_bytes_per_tenant,
        .max_prompt_tokens = d->cfg.max_prompt_tokens,
        .max_sessions_per_tenant = kvpd_tenant_cap(&d->cfg),
        .max_cache_bytes_per_tenant = kvpd_tenant_bytes_cap(&d->cfg)};
}

uint64_t kvpd_tenant_bytes_cap(const kvpd_config *c)
{
    if (c->max_cache_bytes_per_tenant > 0)
        return c->max_cache_bytes_per_tenant;
    /* several tenants and a cap: none may take more than half the cache */
    return c->n_api_keys > 1 ? c->max_cache_bytes / 2 : 0;
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
                kvp_hub_policy_name(d->pconf), d->cfg.budget, info.sessions_resident);
}

/* One turn's cache reservation under cfg's budget and pc's policy. */
static size_t turn_bytes(const kvpd *d, const kvpd_config *cfg, const struct kvp_policy_conf *pc)
{
    return kvp_hub_turn_bytes_for(&d->model, cfg->kv_type, cfg->budget, cfg->chunk, pc,
                                  cfg->budget_mode);
}

int kvpd_policy_conf_make(const kvpd_config *cfg, const kvp_model *model,
                          struct kvp_policy_conf **out, char *note, size_t notelen, char *err,
                          size_t errlen)
{
    char name[32], looked[KVPD_PATH_MAX];
    int found = 0;
    if (!cfg->policy[0])   /* the default: a stat, off the loop */
        found = kvpd_config_default_policy(cfg, name, sizeof name, looked, sizeof looked);
    kvp_hub_policy_params pp = {.policy = cfg->policy, .policy_file = cfg->policy_file,
                                .default_file = found ? looked : NULL,
                                .looked = cfg->policy[0] ? NULL : looked,
                                .model_path = cfg->model};
    return kvp_hub_policy_make(&pp, model, out, note, notelen, err, errlen);
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
    struct kvp_policy_conf *pc;
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
        j->rc = kvpd_policy_conf_make(&j->cfg, &d->model, &j->pc, j->note, sizeof j->note,
                                      j->err, sizeof j->err);
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
    } else if (j->cfg.max_cache_bytes_per_tenant &&
               j->cfg.max_cache_bytes_per_tenant < turn_bytes(d, &j->cfg, j->pc)) {
        char why[256];
        snprintf(why, sizeof why, "max_cache_bytes_per_tenant %llu is less than one turn "
                 "needs (%zu)", (unsigned long long)j->cfg.max_cache_bytes_per_tenant,
                 turn_bytes(d, &j->cfg, j->pc));
        refuse(d, why);
    } else {
        char fixed[512];
        kvpd_config_apply_live(&d->cfg, &j->cfg, fixed, sizeof fixed);
        kvpd_hub_config_sync(d);
        kvp_hub_policy_unref(d->pconf);
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
    kvp_hub_policy_unref(j->pc);
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
