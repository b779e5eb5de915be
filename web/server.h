/* libwebsockets on the daemon's libuv loop (foreign loop): one protocol serves HTTP
 * (chat page, /healthz, /metrics, /admin/stats, the OpenAI API under /v1) and the /chat
 * websocket. Transport only:
 * every conversation request goes to the session hub (sessions/hub.h). */
#ifndef KVPD_SERVER_H
#define KVPD_SERVER_H

#include <stddef.h>
#include <uv.h>

#include "config/config.h"
#include "sessions/hub.h"

struct lws_context;
struct kvpd_listener;

typedef struct kvpd_web {
    const kvpd_config *cfg;       /* read live (SIGHUP changes the live keys) */
    kvpd_metrics *metrics;        /* connections, HTTP requests, errors sent */
    kvp_hub *hub;                 /* NULL until the model is loaded */
    int draining;                 /* shutting down: no new connections */
    uv_loop_t *loop;
    struct lws_context *lws;
    struct kvpd_listener *listener;   /* web/listen.c */
    int port;                     /* bound port */
    int connections_open;         /* HTTP and websocket connections lws holds */
    char admin_token_generated[33];   /* without admin_token: made at start ("" = closed) */
    int frames_pending;           /* frames queued, not yet written */
    double started;               /* kvp_now() at start */
    struct kvpd_oai_store *responses;   /* stored /v1/responses (web/oai_responses.c) */
} kvpd_web;

/* Creates the lws context on w->loop and binds cfg->listen_*; sets w->port. On failure
 * w->lws may still be set: kvpd_web_stop it from inside the running loop. */
int kvpd_web_start(kvpd_web *w, char *err, size_t errlen);
/* Destroys the context from the loop (its handles close as the loop runs on). */
void kvpd_web_stop(kvpd_web *w);

#endif
