/* libwebsockets on the daemon's libuv loop (foreign loop): one protocol serves HTTP
 * (chat page, /healthz, /metrics, /admin/stats) and the /chat websocket. */
#ifndef KVPD_SERVER_H
#define KVPD_SERVER_H

#include <stddef.h>

#include "daemon/kvpd.h"

/* Creates the lws context on d->loop and binds d->cfg.listen_*; sets d->port. On
 * failure d->lws may still be set: kvpd_web_stop it from inside the running loop. */
int kvpd_web_start(kvpd *d, char *err, size_t errlen);
/* Destroys the context from the loop (its handles close as the loop runs on). */
void kvpd_web_stop(kvpd *d);
/* The scheduler's event callback: frames for the session's connection. */
void kvpd_web_on_event(void *ctx, const kvpd_event *ev);
/* The idle timeout: with a state directory, parks idle sessions (their snapshot is up
 * to date) and lets go of parked ones nobody is attached to after another timeout;
 * without one, drops idle sessions (telling an attached client). */
void kvpd_web_expire(kvpd *d, double now);
/* Sessions whose last snapshot write failed (turns a client saw that are not on disk):
 * /healthz reports the daemon degraded and shutdown exits non-zero while any remain. */
int kvpd_web_unsaved(const kvpd *d);
/* Shutdown: asks every running turn to stop. Returns the turns still running. */
int kvpd_web_cancel_all(kvpd *d);

#endif
