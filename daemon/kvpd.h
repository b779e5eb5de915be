/* The daemon's state, owned by the loop thread (workers see only env and sessions
 * handed to them through the scheduler). */
#ifndef KVPD_H
#define KVPD_H

#include <uv.h>

#include "daemon/config.h"
#include "daemon/scheduler.h"
#include "model/model.h"
#include "sessions/session.h"
#include "web/metrics.h"

struct lws_context;
struct kvpd_listener;

typedef struct kvpd {
    kvpd_config cfg;
    int argc;                     /* the command line, read again on SIGHUP */
    char **argv;
    uv_loop_t loop;
    kvp_model model;
    int ready;                    /* model loaded, scheduler running */
    int draining;                 /* shutting down: no new connections or turns */
    int exit_code;
    int reloading, reload_again;  /* a SIGHUP reload is off the loop; another one asked */
    kvp_session_env env;
    kvp_policy_conf *pconf;       /* the policy in force for new sessions */
    kvp_snapshot_identity model_ident;
    size_t row_bytes;             /* cache bytes per row per head (cache/kvcache.c's count) */
    kvp_session_table sessions;
    kvpd_sched *sched;
    kvpd_metrics metrics;
    struct lws_context *lws;
    struct kvpd_listener *listener;   /* web/listen.c */
    int port;                     /* bound port */
    int connections_open;         /* HTTP and websocket connections lws holds */
    char admin_token_generated[33];   /* without admin_token: made at start ("" = closed) */
    int frames_pending;           /* websocket frames queued, not yet written */
    double started;               /* kvp_now() at start */
} kvpd;

/* Tells systemd (and the log) the daemon serves: READY=1 and a STATUS= line. */
void kvpd_announce_ready(kvpd *d);

/* Loop-thread log line to stderr with a level tag. */
void kvpd_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
