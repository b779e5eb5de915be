/* The front end's shared state: what every room of web/ (the callback, the /chat
 * protocol, HTTP, the OpenAI API, the guards) reads of the daemon. Types only, so the
 * rooms that use it do not depend on the server that owns it. */
#ifndef KVPD_WEB_H
#define KVPD_WEB_H

#include <uv.h>

#include "config/config.h"
#include "sessions/hub.h"
#include "web/metrics.h"

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
} kvpd_web;

#endif
