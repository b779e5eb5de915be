/* turns/scheduler.c in-process with a fake step and a fake event sink: the order in
 * which queued turns get their units (round robin, one batched step at a time), that
 * every turn's final event comes once, that a long turn does not hold back short ones,
 * that turns a full step leaves out go first in the next one, and which worker (and at
 * what priority) runs the steps and which the jobs. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/thread.h"
#include "turns/scheduler.h"

#define N_SESS 3
#define MAX_UNITS 256

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int gate_open;
static int order[MAX_UNITS * N_SESS], n_order;
static int units_left[N_SESS];
static kvp_session sess[N_SESS];
static int done_events[N_SESS], token_events[N_SESS], done_at[N_SESS], n_done;
static int batches[MAX_UNITS * N_SESS], n_batches;   /* turns in each step */

static int index_of(const kvp_session *s) { return (int)(s - sess); }

/* One step: each turn it is given takes part (one unit, one row) while the step has
 * rows left; records who ran; a token each unit, done on the last. The very first step
 * waits for the gate so the test can queue everyone before the worker moves on. */
static int fake_step(kvp_session **ss, int n, const kvp_session_env *env, kvp_runstate *rs,
                     const kvp_turn_sink *sink, int *more, int *rows)
{
    int take = n < rs->max_tokens ? n : rs->max_tokens;
    (void)env;
    pthread_mutex_lock(&mu);
    while (!gate_open)
        pthread_cond_wait(&cv, &mu);
    batches[n_batches++] = take;
    pthread_mutex_unlock(&mu);
    for (int k = 0; k < take; k++) {
        kvp_session *s = ss[k];
        int i = index_of(s);
        pthread_mutex_lock(&mu);
        order[n_order++] = i;
        int left = --units_left[i];
        pthread_mutex_unlock(&mu);
        sink->token(sink->ctx, s, "x", 1);
        more[k] = left > 0;
        if (left == 0) {
            kvp_turn_stats st = {.stop = "eos"};
            sink->done(sink->ctx, s, &st, "reply", 5);
        }
    }
    *rows = take;
    return take;
}

static void on_event(void *ctx, const kvpd_event *ev)
{
    (void)ctx;
    if (ev->type == KVPD_EV_STEP) {
        cr_assert_eq(ev->step.rows, ev->step.sessions);
        return;
    }
    int i = index_of(ev->session);
    if (ev->type == KVPD_EV_TOKEN) {
        token_events[i]++;
    } else {
        cr_assert_eq(ev->type, KVPD_EV_DONE);
        cr_assert_str_eq(ev->text, "reply");
        done_events[i]++;
        done_at[i] = n_done++;
    }
}

/* The model the fake steps never run: only its shape sizes the workers' runstates. */
static void tiny_model(kvp_model *model)
{
    memset(model, 0, sizeof *model);
    model->cfg = (kvp_model_config){.dim = 8, .hidden_dim = 16, .n_layers = 1, .n_heads = 1,
                                    .n_kv_heads = 1, .head_dim = 8, .vocab_size = 4,
                                    .seq_len = 16, .rope = {.n_rot = 8, .base = 10000.0f},
                                    .rms_eps = 1e-5f};
}

static void run(const int *units, int step_tokens)
{
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    kvp_model model;
    tiny_model(&model);
    kvp_session_env env = {.model = &model, .chunk = 1, .step_tokens = step_tokens};
    memset(sess, 0, sizeof sess);
    n_order = n_done = n_batches = 0;
    gate_open = 0;
    for (int i = 0; i < N_SESS; i++) {
        units_left[i] = units[i];
        sess[i].state = KVP_SESSION_TURN;
        done_events[i] = token_events[i] = 0;
    }
    kvpd_sched *s;
    char err[256];
    cr_assert_eq(kvpd_sched_start(&s, &loop, 1, &env, fake_step, on_event, NULL, err,
                                  sizeof err), 0, "%s", err);
    for (int i = 0; i < N_SESS; i++)
        kvpd_sched_submit(s, &sess[i]);
    pthread_mutex_lock(&mu);
    gate_open = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    double end = kvp_now() + 20;
    while (n_done < N_SESS) {
        cr_assert_lt(kvp_now(), end, "jobs did not finish");
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    cr_assert_eq(kvpd_sched_depth(s), 0);
    kvpd_sched_stop(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    kvpd_sched_free(s);
    cr_assert_eq(uv_loop_close(&loop), 0);
}

/* Three equal jobs on one worker: a b c a b c ... */
Test(scheduler, equal_jobs_interleave_round_robin, .timeout = 30)
{
    int units[N_SESS] = {5, 5, 5};
    run(units, 8);
    cr_assert_eq(n_order, 15);
    /* one step per round (the first may start before all three are queued) */
    cr_assert_leq(n_batches, 6, "%d steps", n_batches);
    for (int k = 1; k < n_batches - 1; k++)
        cr_assert_eq(batches[k], N_SESS, "step %d ran %d turns", k, batches[k]);
    for (int k = 0; k < n_order; k++)
        cr_assert_eq(order[k], k % N_SESS, "unit %d went to %d", k, order[k]);
    for (int i = 0; i < N_SESS; i++) {
        cr_assert_eq(done_events[i], 1);
        cr_assert_eq(token_events[i], 5);
    }
}

/* A long job (a big prefill) does not delay short ones: they finish within their own
 * units' worth of rounds, and the long one goes on alone after. */
Test(scheduler, a_long_job_does_not_starve_short_ones, .timeout = 30)
{
    int units[N_SESS] = {100, 2, 3};
    run(units, 8);
    cr_assert_eq(n_order, 105);
    /* rounds: a b c | a b c | a c | a a a ... */
    int want[8] = {0, 1, 2, 0, 1, 2, 0, 2};
    for (int k = 0; k < 8; k++)
        cr_assert_eq(order[k], want[k], "unit %d went to %d", k, order[k]);
    for (int k = 8; k < n_order; k++)
        cr_assert_eq(order[k], 0);
    cr_assert_eq(done_at[1], 0, "the 2-unit job finished first");
    cr_assert_eq(done_at[2], 1);
    cr_assert_eq(done_at[0], 2);
}

/* A step of two rows for three turns: the one left out goes first in the next step, so
 * the order stays a b c a b c and every step is full. */
Test(scheduler, turns_left_out_of_a_full_step_go_first, .timeout = 30)
{
    int units[N_SESS] = {4, 4, 4};
    run(units, 2);
    cr_assert_eq(n_order, 12);
    for (int k = 0; k < n_order; k++)
        cr_assert_eq(order[k], k % N_SESS, "unit %d went to %d", k, order[k]);
    cr_assert_leq(n_batches, 7, "%d steps", n_batches);
    for (int k = 1; k < n_batches - 1; k++)
        cr_assert_eq(batches[k], 2, "step %d ran %d turns", k, batches[k]);
}

/* Who runs what: every unit's thread and nice value, steps and jobs apart. */
#define ROLE_UNITS 64
static pthread_t unit_thread[ROLE_UNITS];
static int unit_nice[ROLE_UNITS], unit_job[ROLE_UNITS], n_units;
static int role_left[2], role_finals;

/* Session 0 takes turn units; session 1 is a job (a snapshot SAVE) queued again after
 * each run until its units are done, so jobs and steps keep coming while both exist. */
static int role_step(kvp_session **ss, int n, const kvp_session_env *env, kvp_runstate *rs,
                     const kvp_turn_sink *sink, int *more, int *rows)
{
    (void)env;
    (void)rs;
    int job = kvp_session_job_next(ss[0]);
    cr_assert(!job || n == 1, "a job runs alone");
    for (int k = 0; k < n; k++) {
        int i = index_of(ss[k]);
        pthread_mutex_lock(&mu);
        if (n_units < ROLE_UNITS) {
            unit_thread[n_units] = pthread_self();
            unit_nice[n_units] = kvp_thread_nice_now();
            unit_job[n_units] = job;
            n_units++;
        }
        int left = --role_left[i];
        pthread_mutex_unlock(&mu);
        more[k] = left > 0;
        if (left == 0)
            sink->job(sink->ctx, ss[k], 0, "");
    }
    *rows = job ? 0 : n;
    return n;
}

static void role_event(void *ctx, const kvpd_event *ev)
{
    (void)ctx;
    if (ev->type == KVPD_EV_JOB)
        role_finals++;
}

static void run_roles(int workers)
{
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    kvp_model model;
    tiny_model(&model);
    kvp_session_env env = {.model = &model, .chunk = 1, .step_tokens = 4};
    memset(sess, 0, sizeof sess);
    sess[0].state = KVP_SESSION_TURN;
    sess[1].state = KVP_SESSION_SAVE;
    role_left[0] = role_left[1] = 20;
    n_units = role_finals = 0;
    kvpd_sched *s;
    char err[256];
    cr_assert_eq(kvpd_sched_start(&s, &loop, workers, &env, role_step, role_event, NULL, err,
                                  sizeof err), 0, "%s", err);
    kvpd_sched_submit(s, &sess[0]);
    kvpd_sched_submit(s, &sess[1]);
    double end = kvp_now() + 20;
    while (role_finals < 2) {
        cr_assert_lt(kvp_now(), end, "the units did not finish");
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    kvpd_sched_stop(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    kvpd_sched_free(s);
    cr_assert_eq(uv_loop_close(&loop), 0);
    cr_assert_eq(n_units, 40);
}

/* With two workers or more, one thread runs every step, at the daemon's own nice value,
 * and the jobs run on the others at the background's (base/thread.h): a job's compute
 * never takes the step's worker. */
Test(scheduler, steps_keep_their_worker_and_jobs_run_in_the_background, .timeout = 30)
{
    int mine = kvp_thread_nice_now();
    cr_assert_lt(mine, KVP_BACKGROUND_NICE, "run the suite below nice %d", KVP_BACKGROUND_NICE);
    for (int workers = 2; workers <= 3; workers++) {
        run_roles(workers);
        pthread_t stepper = 0;
        for (int k = 0; k < n_units; k++) {
            if (unit_job[k]) {
                cr_assert_eq(unit_nice[k], KVP_BACKGROUND_NICE, "%d workers: job at nice %d",
                             workers, unit_nice[k]);
                continue;
            }
            cr_assert_eq(unit_nice[k], mine, "%d workers: step at nice %d", workers,
                         unit_nice[k]);
            if (!stepper)
                stepper = unit_thread[k];
            cr_assert(pthread_equal(stepper, unit_thread[k]), "%d workers: steps moved "
                      "between threads", workers);
        }
        for (int k = 0; k < n_units; k++)
            cr_assert(!unit_job[k] || !pthread_equal(stepper, unit_thread[k]),
                      "%d workers: a job ran on the step's thread", workers);
    }
}

/* One worker does both, at the daemon's nice value: a step is never demoted. */
Test(scheduler, one_worker_runs_steps_and_jobs_at_the_daemons_priority, .timeout = 30)
{
    int mine = kvp_thread_nice_now();
    run_roles(1);
    for (int k = 1; k < n_units; k++)
        cr_assert(pthread_equal(unit_thread[0], unit_thread[k]));
    for (int k = 0; k < n_units; k++)
        cr_assert_eq(unit_nice[k], mine, "unit %d (%s) at nice %d", k,
                     unit_job[k] ? "a job" : "a step", unit_nice[k]);
}
