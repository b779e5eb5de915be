/* The model side: the step loop. Worker threads pull from one run queue:
 *   - turns run in batched steps, one step in flight at a time: a worker takes every
 *     queued turn, the step fn advances each by one unit (a prefill chunk or one decoded
 *     token) in one forward pass while the step has rows left (its runstate's
 *     env->step_tokens; decodes first, then prefill chunks within env->prefill_tokens,
 *     fewest tokens left first, turns/step_plan.h), those
 *     that took part go back to the tail and those left out stay at the head, so
 *     sessions join and leave between steps and a long prefill never stalls the others;
 *   - jobs (snapshot LOAD and SAVE, a turn's start and its end-of-turn snapshot: the
 *     units that wait on I/O or take a while without the model, kvp_session_job_next)
 *     run alone meanwhile. One worker does both; with two or more, the first runs only
 *     the steps and the others only the jobs (and background work), at a lower
 *     priority (base/thread.h), so a stalled store never leaves the batched step
 *     without a worker and a job's compute never takes the step's core.
 * A session is on at most one worker at a time. Workers report through a
 * mutex-protected event queue and uv_async_send; the loop thread drains it. */
#ifndef KVPD_SCHED_H
#define KVPD_SCHED_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "turns/session.h"

enum kvpd_event_type { KVPD_EV_TOKEN, KVPD_EV_DONE, KVPD_EV_ERROR, KVPD_EV_JOB, KVPD_EV_STEP };

/* A batched step, for the metrics. A value inside kvpd_event. */
typedef struct kvpd_step_info {
    int sessions;              /* turns that took part */
    int rows;                  /* tokens the forward pass ran */
    double duration_s;
} kvpd_step_info;

/* One event from a worker to the loop. Owner: the worker that makes it, until it is on
 * the event queue; then the loop's, which frees it. Never written by both. */
typedef struct kvpd_event {
    enum kvpd_event_type type;
    kvp_session *session;
    char *text;                /* token text, reply (DONE), message (ERROR, JOB) */
    size_t len;
    int code;                  /* ERROR: negative errno; JOB: 0 or negative errno */
    kvp_turn_stats stats;      /* DONE */
    kvpd_step_info step;       /* STEP (session NULL) */
    int lp_from, lp_to;        /* TOKEN: the reply tokens whose logprobs go with it */
    struct kvpd_event *next;
} kvpd_event;

/* Called on the loop thread for each event; the event is freed after the call. */
typedef void (*kvpd_event_fn)(void *ctx, const kvpd_event *ev);

typedef struct kvpd_sched kvpd_sched;

/* One step on a worker over queued sessions ss[0..n) (kvp_turn_batch; tests pass their
 * own): a job alone, or turns batched. Reorders ss so those that took part come first
 * (the others keep their order), returns how many took part and sets more[i] for
 * those; *rows: the tokens the forward pass ran. */
typedef int (*kvpd_step_fn)(kvp_session **ss, int n, const kvp_session_env *env,
                            kvp_runstate *rs, const kvp_turn_sink *sink, int *more, int *rows);

/* Starts `workers` threads (each with its own runstate of env->step_tokens rows) that
 * run `step` on queued sessions and deliver their events to fn on the loop. */
int kvpd_sched_start(kvpd_sched **out, uv_loop_t *loop, int workers,
                     const kvp_session_env *env, kvpd_step_fn step, kvpd_event_fn fn,
                     void *ctx, char *err, size_t errlen);
/* Background work (observe/background.h) the workers run when they have nothing else:
 * run(ctx, busy, bctx) is called on a worker only while no turn is queued, no step runs
 * and no job is in flight, one at a time, and no step starts until it returns (a turn
 * queued meanwhile waits for it); busy(bctx) says whether anything else waits or runs
 * now, for run to give way between its chunks. pending(ctx) is asked under the
 * scheduler's lock (it must not call back). Set before the first submit; NULL: none. */
typedef struct kvpd_idle_ops {
    int (*pending)(void *ctx);
    void (*run)(void *ctx, int (*busy)(void *), void *bctx);
    void *ctx;
} kvpd_idle_ops;
void kvpd_sched_set_idle(kvpd_sched *s, const kvpd_idle_ops *ops);
/* Wakes a worker for background work queued since (loop thread). */
void kvpd_sched_kick(kvpd_sched *s);
/* Background runs so far, and how many of them began or went on while a step ran (the
 * rule above makes it 0; counted to show it). */
void kvpd_sched_idle_counts(kvpd_sched *s, uint64_t *runs, uint64_t *in_step);

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
