/* The step loop: worker threads, one run queue, one batched step in flight; worker ->
 * loop events through a locked list + uv_async. */
#include "turns/scheduler.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/thread.h"
#include "model/matmul.h"

struct kvpd_sched {
    uv_async_t async;
    const kvp_session_env *env;
    kvpd_step_fn step;
    kvpd_event_fn fn;
    void *ctx;
    pthread_mutex_t rq_mu;
    pthread_cond_t rq_cv;
    kvp_session *rq_head, *rq_tail;
    int depth;
    int stopping;
    int stepping;              /* a worker runs a batched step */
    int jobs;                  /* workers in a job; at most n_workers - 1 (see role_of) */
    pthread_mutex_t ev_mu;
    kvpd_event *ev_head, *ev_tail;
    int n_workers;
    pthread_t *threads;
    kvp_runstate *rs;
    int rows;                  /* of each runstate: the step's token budget */
    int started;               /* threads actually running */
    kvp_turn_sink sink;
    kvpd_idle_ops idle;
    int idle_running;          /* a worker runs background work (no step may start) */
    uint64_t idle_runs, idle_in_step;
};

typedef struct worker_arg {
    kvpd_sched *s;
    int index;
} worker_arg;

static void post(kvpd_sched *s, kvpd_event *ev)
{
    pthread_mutex_lock(&s->ev_mu);
    if (s->ev_tail)
        s->ev_tail->next = ev;
    else
        s->ev_head = ev;
    s->ev_tail = ev;
    pthread_mutex_unlock(&s->ev_mu);
    uv_async_send(&s->async);
}

/* Final events must arrive (the loop ends the job on them), so they wait for memory. */
static kvpd_event *new_event(enum kvpd_event_type type, kvp_session *session,
                             const char *text, size_t len, int must)
{
    for (;;) {
        kvpd_event *ev = calloc(1, sizeof *ev);
        char *copy = malloc(len + 1);
        if (ev && copy) {
            memcpy(copy, text, len);
            copy[len] = '\0';
            ev->type = type;
            ev->session = session;
            ev->text = copy;
            ev->len = len;
            return ev;
        }
        free(ev);
        free(copy);
        if (!must)
            return NULL;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
}

static void sink_token(void *ctx, kvp_session *session, const char *text, size_t len)
{
    kvpd_event *ev = new_event(KVPD_EV_TOKEN, session, text, len, 0);
    if (ev) {   /* a lost token frame is survivable; the done frame has the full reply */
        /* the entries themselves stay in the spec's buffer (s->rq.spec.lp), written
         * before this post and untouched after it while the turn runs */
        ev->lp_from = session->turn.lp_from;
        ev->lp_to = session->turn.lp_to;
        post(ctx, ev);
    }
}

static void sink_done(void *ctx, kvp_session *session, const kvp_turn_stats *st,
                      const char *reply, size_t len)
{
    kvpd_event *ev = new_event(KVPD_EV_DONE, session, reply, len, 1);
    ev->stats = *st;
    post(ctx, ev);
}

static void sink_error(void *ctx, kvp_session *session, int code, const char *msg)
{
    kvpd_event *ev = new_event(KVPD_EV_ERROR, session, msg, strlen(msg), 1);
    ev->code = code;
    post(ctx, ev);
}

static void sink_job(void *ctx, kvp_session *session, int code, const char *msg)
{
    kvpd_event *ev = new_event(KVPD_EV_JOB, session, msg, strlen(msg), 1);
    ev->code = code;
    post(ctx, ev);
}

/* Appends a session at the tail of the run queue; rq_mu is held. */
static void enqueue_locked(kvpd_sched *s, kvp_session *sess)
{
    sess->rq_next = NULL;
    if (s->rq_tail)
        s->rq_tail->rq_next = sess;
    else
        s->rq_head = sess;
    s->rq_tail = sess;
    s->depth++;
    pthread_cond_broadcast(&s->rq_cv);   /* the workers differ in what they take */
}

/* Unlinks a queued session; rq_mu is held. */
static void unlink_locked(kvpd_sched *s, kvp_session *prev, kvp_session *sess)
{
    *(prev ? &prev->rq_next : &s->rq_head) = sess->rq_next;
    if (s->rq_tail == sess)
        s->rq_tail = prev;
    sess->rq_next = NULL;
    s->depth--;
}

/* The first queued job (a snapshot LOAD or SAVE, a turn's start or end: I/O the
 * batched step must not wait on), unlinked; rq_mu is held. */
static kvp_session *take_job_locked(kvpd_sched *s)
{
    for (kvp_session *prev = NULL, *q = s->rq_head; q; prev = q, q = q->rq_next)
        if (kvp_session_job_next(q)) {
            unlink_locked(s, prev, q);
            return q;
        }
    return NULL;
}

/* Up to max queued turns in queue order, unlinked; rq_mu is held. */
static int take_turns_locked(kvpd_sched *s, kvp_session **out, int max)
{
    int n = 0;
    kvp_session *prev = NULL, *q = s->rq_head;
    while (q && n < max) {
        kvp_session *next = q->rq_next;
        if (!kvp_session_job_next(q)) {
            unlink_locked(s, prev, q);
            out[n++] = q;
        } else {
            prev = q;
        }
        q = next;
    }
    return n;
}

static void post_step(kvpd_sched *s, int sessions, int rows, double duration)
{
    kvpd_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return;   /* a lost figure; the metrics survive it */
    ev->type = KVPD_EV_STEP;
    ev->step = (kvpd_step_info){sessions, rows, duration};
    post(s, ev);
}

/* Whether background work should give way: a turn queued, a step or job running, or
 * shutdown. Counts a step seen running under background work (never, by the rule in
 * worker_main). */
static int sched_busy(void *arg)
{
    kvpd_sched *s = arg;
    pthread_mutex_lock(&s->rq_mu);
    int busy = s->depth > 0 || s->stepping || s->jobs > 0 || s->stopping;
    if (s->stepping && s->idle_running)
        s->idle_in_step++;
    pthread_mutex_unlock(&s->rq_mu);
    return busy;
}

/* A worker's share of the work. One worker does all of it. With more, worker 0 runs the
 * batched steps and nothing else, and the others the jobs and the background work, at
 * KVP_BACKGROUND_NICE: a job (a turn's start renders and tokenizes its prompt and
 * builds its grammar's matcher, a snapshot waits on the store) never holds the step's
 * worker, and on a machine with more runnable threads than cores it takes the time the
 * step and the loop leave. At most n_workers - 1 are in a job at a time, so a store that
 * answers late never leaves the queued turns without a worker to step them. */
enum worker_role { ROLE_ALL, ROLE_STEP, ROLE_JOBS };

static enum worker_role role_of(const kvpd_sched *s, int index)
{
    return s->n_workers == 1 ? ROLE_ALL : index == 0 ? ROLE_STEP : ROLE_JOBS;
}

static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    kvpd_sched *s = wa->s;
    kvp_runstate *rs = &s->rs[wa->index];
    enum worker_role role = role_of(s, wa->index);
    char name[16];   /* as top -H, ps -L and perf show it */
    if (role == ROLE_JOBS) {
        snprintf(name, sizeof name, "kvpd-job%d", wa->index);
        (void)kvp_thread_nice(KVP_BACKGROUND_NICE);   /* refused: it runs at the step's */
    } else {
        snprintf(name, sizeof name, role == ROLE_STEP ? "kvpd-step" : "kvpd-worker");
    }
    kvp_thread_name(name);
    free(wa);
    /* a session takes at least one row of a step */
    kvp_session **batch = malloc((size_t)s->rows * sizeof *batch);
    int *more = malloc((size_t)s->rows * sizeof *more);
    for (;;) {
        kvp_session *job = NULL;
        int n = 0, idle = 0;
        pthread_mutex_lock(&s->rq_mu);
        for (;;) {
            if (s->stopping)
                break;
            if (role != ROLE_STEP && (job = take_job_locked(s))) {
                s->jobs++;
                break;
            }
            if (role != ROLE_JOBS && batch && more && !s->stepping && !s->idle_running &&
                (n = take_turns_locked(s, batch, s->rows))) {
                s->stepping = 1;
                break;
            }
            /* Background work only when there is nothing else at all. */
            if (role != ROLE_STEP && s->idle.run && !s->stepping && !s->idle_running &&
                s->jobs == 0 &&
                s->depth == 0 && s->idle.pending(s->idle.ctx)) {
                s->idle_running = 1;
                idle = 1;
                break;
            }
            pthread_cond_wait(&s->rq_cv, &s->rq_mu);
        }
        pthread_mutex_unlock(&s->rq_mu);
        if (idle) {
            s->idle.run(s->idle.ctx, sched_busy, s);
            pthread_mutex_lock(&s->rq_mu);
            s->idle_running = 0;
            s->idle_runs++;
            pthread_cond_broadcast(&s->rq_cv);   /* a step may be waiting for it */
            pthread_mutex_unlock(&s->rq_mu);
            continue;
        }
        if (!job && !n)
            break;   /* stopping */
        if (job) {
            int job_more = 0, rows;
            s->step(&job, 1, s->env, rs, &s->sink, &job_more, &rows);
            pthread_mutex_lock(&s->rq_mu);
            s->jobs--;
            if (job_more && !s->stopping)
                enqueue_locked(s, job);
            pthread_cond_broadcast(&s->rq_cv);   /* a job may be waiting for a free worker */
            pthread_mutex_unlock(&s->rq_mu);
            continue;
        }

        double t0 = kvp_now();
        int rows = 0;
        int taken = s->step(batch, n, s->env, rs, &s->sink, more, &rows);
        if (rows > 0)
            post_step(s, taken, rows, kvp_now() - t0);

        pthread_mutex_lock(&s->rq_mu);
        if (!s->stopping) {
            /* those left out stay first, in order; those that took part go to the tail */
            for (int i = n - 1; i >= taken; i--) {
                batch[i]->rq_next = s->rq_head;
                s->rq_head = batch[i];
                if (!s->rq_tail)
                    s->rq_tail = batch[i];
                s->depth++;
            }
            for (int i = 0; i < taken; i++)
                if (more[i])
                    enqueue_locked(s, batch[i]);
        }
        s->stepping = 0;
        pthread_cond_broadcast(&s->rq_cv);
        pthread_mutex_unlock(&s->rq_mu);
    }
    free(batch);
    free(more);
    return NULL;
}

/* Takes every queued worker event, oldest first. */
static kvpd_event *take_events(kvpd_sched *s)
{
    pthread_mutex_lock(&s->ev_mu);
    kvpd_event *ev = s->ev_head;
    s->ev_head = s->ev_tail = NULL;
    pthread_mutex_unlock(&s->ev_mu);
    return ev;
}

static void on_async(uv_async_t *h)
{
    kvpd_sched *s = h->data;
    kvpd_event *ev = take_events(s);
    while (ev) {
        kvpd_event *next = ev->next;
        s->fn(s->ctx, ev);
        free(ev->text);
        free(ev);
        ev = next;
    }
}

int kvpd_sched_start(kvpd_sched **out, uv_loop_t *loop, int workers,
                     const kvp_session_env *env, kvpd_step_fn step, kvpd_event_fn fn,
                     void *ctx, char *err, size_t errlen)
{
    kvpd_sched *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    s->env = env;
    s->step = step;
    s->fn = fn;
    s->ctx = ctx;
    s->n_workers = workers;
    /* a step holds at least one prefill chunk */
    s->rows = env->step_tokens > env->chunk ? env->step_tokens : env->chunk;
    s->sink = (kvp_turn_sink){sink_token, sink_done, sink_error, sink_job, s};
    pthread_mutex_init(&s->rq_mu, NULL);
    pthread_cond_init(&s->rq_cv, NULL);
    pthread_mutex_init(&s->ev_mu, NULL);
    s->threads = calloc((size_t)workers, sizeof *s->threads);
    s->rs = calloc((size_t)workers, sizeof *s->rs);
    int rc = uv_async_init(loop, &s->async, on_async);
    if (!s->threads || !s->rs || rc < 0) {
        snprintf(err, errlen, "scheduler: %s", rc < 0 ? uv_strerror(rc) : "out of memory");
        free(s->threads);
        free(s->rs);
        free(s);
        return rc < 0 ? rc : -ENOMEM;
    }
    s->async.data = s;
    *out = s;   /* from here the caller stops and frees on failure */
    kvp_matmul_start();   /* the step's helpers at this thread's priority, not a job's */
    for (int i = 0; i < workers; i++) {
        if ((rc = kvp_runstate_init(&s->rs[i], &env->model->cfg, s->rows)) < 0) {
            snprintf(err, errlen, "runstate: %s", strerror(-rc));
            return rc;
        }
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            kvp_runstate_free(&s->rs[i]);
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        wa->s = s;
        wa->index = i;
        if ((rc = pthread_create(&s->threads[i], NULL, worker_main, wa)) != 0) {
            free(wa);
            kvp_runstate_free(&s->rs[i]);
            snprintf(err, errlen, "pthread_create: %s", strerror(rc));
            return -rc;
        }
        s->started++;
    }
    return 0;
}

void kvpd_sched_set_idle(kvpd_sched *s, const kvpd_idle_ops *ops)
{
    pthread_mutex_lock(&s->rq_mu);
    s->idle = ops ? *ops : (kvpd_idle_ops){0};
    pthread_cond_broadcast(&s->rq_cv);   /* work may be waiting already */
    pthread_mutex_unlock(&s->rq_mu);
}

void kvpd_sched_kick(kvpd_sched *s)
{
    pthread_mutex_lock(&s->rq_mu);
    pthread_cond_broadcast(&s->rq_cv);
    pthread_mutex_unlock(&s->rq_mu);
}

void kvpd_sched_idle_counts(kvpd_sched *s, uint64_t *runs, uint64_t *in_step)
{
    pthread_mutex_lock(&s->rq_mu);
    *runs = s->idle_runs;
    *in_step = s->idle_in_step;
    pthread_mutex_unlock(&s->rq_mu);
}

void kvpd_sched_submit(kvpd_sched *s, kvp_session *session)
{
    pthread_mutex_lock(&s->rq_mu);
    enqueue_locked(s, session);
    pthread_mutex_unlock(&s->rq_mu);
}

int kvpd_sched_depth(kvpd_sched *s)
{
    pthread_mutex_lock(&s->rq_mu);
    int d = s->depth;
    pthread_mutex_unlock(&s->rq_mu);
    return d;
}

void kvpd_sched_stop(kvpd_sched *s)
{
    pthread_mutex_lock(&s->rq_mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->rq_cv);
    pthread_mutex_unlock(&s->rq_mu);
    for (int i = 0; i < s->started; i++) {
        pthread_join(s->threads[i], NULL);
        kvp_runstate_free(&s->rs[i]);
    }
    s->started = 0;
    kvpd_event *ev = take_events(s);
    while (ev) {
        kvpd_event *next = ev->next;
        free(ev->text);
        free(ev);
        ev = next;
    }
    uv_close((uv_handle_t *)&s->async, NULL);
}

void kvpd_sched_free(kvpd_sched *s)
{
    pthread_mutex_destroy(&s->rq_mu);
    pthread_cond_destroy(&s->rq_cv);
    pthread_mutex_destroy(&s->ev_mu);
    free(s->threads);
    free(s->rs);
    free(s);
}
