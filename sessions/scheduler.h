/* The model side: a pool of worker threads pulling turns from a run queue. Each pull
 * advances one turn by one unit (a prefill chunk or one decoded token) and requeues it
 * at the tail, so sessions share the cores fairly and a long prefill never starves the
 * others; a session is on at most one worker at a time. Workers report through a
 * mutex-protected event queue and uv_async_send; the loop thread drains it. */
#ifndef KVPD_SCHED_H
#define KVPD_SCHED_H

#include <stddef.h>
#include <uv.h>

#include "sessions/session.h"

enum kvpd_event_type { KVPD_EV_TOKEN, KVPD_EV_DONE, KVPD_EV_ERROR, KVPD_EV_JOB };

typedef struct kvpd_event {
    enum kvpd_event_type type;
    kvp_session *session;
    char *text;                /* token text, reply (DONE), message (ERROR, JOB) */
    size_t len;
    int code;                  /* ERROR: negative errno; JOB: 0 or negative errno */
    kvp_turn_stats stats;      /* DONE */
    struct kvpd_event *next;
} kvpd_event;

/* Called on the loop thread for each event; the event is freed after the call. */
typedef void (*kvpd_event_fn)(void *ctx, const kvpd_event *ev);

typedef struct kvpd_sched kvpd_sched;

/* One unit of a session's job on a worker (kvp_turn_step; tests pass their own). */
typedef int (*kvpd_step_fn)(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs,
                            const kvp_turn_sink *sink);

/* Starts `workers` threads (each with its own runstate of env->chunk tokens) that run
 * `step` on queued sessions and deliver their events to fn on the loop. */
int kvpd_sched_start(kvpd_sched **out, uv_loop_t *loop, int workers,
                     const kvp_session_env *env, kvpd_step_fn step, kvpd_event_fn fn,
                     void *ctx, char *err, size_t errlen);
/* Queues a session whose job was armed (its state names the job; loop thread). */
void kvpd_sched_submit(kvpd_sched *s, kvp_session *session);
/* Turns waiting for a worker (not counting those on a worker right now). */
int kvpd_sched_depth(kvpd_sched *s);
/* Joins the workers after their current unit; queued turns are abandoned and their
 * pending events dropped. Closes the async handle (the loop must run to finish). */
void kvpd_sched_stop(kvpd_sched *s);
/* Frees the scheduler once the loop has closed its handle. */
void kvpd_sched_free(kvpd_sched *s);

#endif
