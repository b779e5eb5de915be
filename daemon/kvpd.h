/* The daemon's state, owned by the loop thread: the configuration, the model, the
 * session hub that runs every conversation, and the web front end in front of it. */
#ifndef KVPD_H
#define KVPD_H

#include <uv.h>

#include "base/log.h"
#include "config/config.h"
#include "model/model.h"
#include "sessions/hub.h"
#include "web/server.h"

typedef struct kvpd {
    kvpd_config cfg;
    int argc;                     /* the command line, read again on SIGHUP */
    char **argv;
    uv_loop_t loop;
    kvp_model model;
    int model_loaded;
    int draining;                 /* shutting down: no new connections or turns */
    int exit_code;
    int reloading, reload_again;  /* a SIGHUP reload is off the loop; another one asked */
    struct kvp_policy_conf *pconf;   /* the policy in force for new sessions */
    kvp_hub_config hub_cfg;       /* the hub's view of cfg (kvpd_hub_config_sync) */
    kvp_hub *hub;                 /* NULL until the model is loaded */
    kvpd_web web;
    kvpd_metrics metrics;
} kvpd;

/* Copies the keys the hub reads from cfg (at start and after a reload). */
void kvpd_hub_config_sync(kvpd *d);
/* max_sessions_per_tenant in force: the setting, or its default from the keys. */
int kvpd_tenant_cap(const kvpd_config *c);
/* max_cache_bytes_per_tenant in force: the setting, or its default from the keys and
 * max_cache_bytes. */
uint64_t kvpd_tenant_bytes_cap(const kvpd_config *c);

#endif
