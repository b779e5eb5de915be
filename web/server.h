/* libwebsockets on the daemon's libuv loop (foreign loop): one protocol serves HTTP
 * (chat page, /healthz, /metrics, /admin/stats, the OpenAI API under /v1) and the /chat
 * websocket. Transport only:
 * every conversation request goes to the session hub (sessions/hub.h). */
#ifndef KVPD_SERVER_H
#define KVPD_SERVER_H

#include <stddef.h>

#include "web/web.h"

/* Creates the lws context on w->loop and binds cfg->listen_*; sets w->port. On failure
 * w->lws may still be set: kvpd_web_stop it from inside the running loop. */
int kvpd_web_start(kvpd_web *w, char *err, size_t errlen);
/* Destroys the context from the loop (its handles close as the loop runs on). */
void kvpd_web_stop(kvpd_web *w);

#endif
