/* Background work on the scheduler's idle workers (turns/scheduler.h's idle hook, as
 * the canary and the learn_dir writes use it): it never runs while a batched step does,
 * it gives way when a turn is queued, and it does not run at all while turns keep the
 * step loop busy. A fake step and fake background work, on two workers. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "turns/scheduler.h"

#define N_SESS 3

static kvp_session sess[N_SESS];
static atomic_int units_left[N_SESS];
static atomic_int n_done, n_ended;
static atomic_int in_step, in_idle;      /* a step / background work is running now */
static atomic_int overlaps;              /* seen both at once */
static atomic_int idle_pending;          /* background items waiting */
static atomic_int idle_runs, idle_yields, idle_chunks;
static atomic_int idle_runs_at_last_done, steps;

static void pause_ms(int ms)
{
    uv_sleep((unsigned)ms);
}

static int fake_step(kvp_session **ss, int n, const kvp_session_env *env, kvp_runstate *rs,
                     const kvp_turn_sink *sink, int *more, int *rows)
{
    (void)env, (void)rs;
    atomic_store(&in_step, 1);
    atomic_fetch_add(&steps, 1);
    if (atomic_load(&in_idle))
        atomic_fetch_add(&overlaps, 1);
    pause_ms(1);
    for (int k = 0; k < n; k++) {
        int i = (int)(ss[k] - sess);
        int left = atomic_fetch_sub(&units_left[i], 1) - 1;
        more[k] = left > 0;
        if (left == 0) {
            kvp_turn_stats st = {.stop = "eos"};
            sink->done(sink->ctx, ss[k], &st, "r", 1);
            if (atomic_fetch_add(&n_ended, 1) + 1 == N_SESS)   /* still inside the step */
                atomic_store(&idle_runs_at_last_done, atomic_load(&idle_runs));
        }
    }
    if (atomic_load(&in_idle))
        atomic_fetch_add(&overlaps, 1);
    atomic_store(&in_step, 0);
    *rows = n;
    return n;
}

static void on_event(void *ctx, const kvpd_event *ev)
{
    (void)ctx;
    if (ev->type == KVPD_EV_DONE)
        atomic_fetch_add(&n_done, 1);
}

static int fake_pending(void *ctx)
{
    (void)ctx;
    return atomic_load(&idle_pending) > 0;
}

/* One item: up to 20 chunks of 2 ms, asking busy() before each like the canary. */
static void fake_run(void *ctx, int (*busy)(void *), void *bctx)
{
    (void)ctx;
    atomic_fetch_sub(&idle_pending, 1);
    atomic_store(&in_idle, 1);
    atomic_fetch_add(&idle_runs, 1);
    for (int c = 0; c < 20; c++) {
        if (atomic_load(&in_step))
            atomic_fetch_add(&overlaps, 1);
        if (busy(bctx)) {
            atomic_fetch_add(&idle_yields, 1);
            break;
        }
        atomic_fetch_add(&idle_chunks, 1);
        pause_ms(2);
        if (atomic_load(&in_step))
            atomic_fetch_add(&overlaps, 1);
    }
    atomic_store(&in_idle, 0);
}

typedef struct rig {
    uv_loop_t loop;
    kvp_model model;
    kvp_session_env env;
    kvpd_sched *s;
} rig;

static void rig_start(rig *r, int workers)
{
    cr_assert_eq(uv_loop_init(&r->loop), 0);
    memset(&r->model, 0, sizeof r->model);
    r->model.cfg = (kvp_model_config){.dim = 8, .hidden_dim = 16, .n_layers = 1, .n_heads = 1,
                                      .n_kv_heads = 1, .head_dim = 8, .vocab_size = 4,
                                      .seq_len = 16, .rope = {.n_rot = 8, .base = 10000.0f},
                                      .rms_eps = 1e-5f};
    r->env = (kvp_session_env){.model = &r->model, .chunk = 1, .step_tokens = 8};
    memset(sess, 0, sizeof sess);
    atomic_store(&n_done, 0);
    atomic_store(&n_ended, 0);
    atomic_store(&overlaps, 0);
    atomic_store(&idle_runs, 0);
    atomic_store(&idle_yields, 0);
    atomic_store(&idle_chunks, 0);
    atomic_store(&steps, 0);
    char err[256];
    cr_assert_eq(kvpd_sched_start(&r->s, &r->loop, workers, &r->env, fake_step, on_event, NULL,
                                  err, sizeof err), 0, "%s", err);
    kvpd_sched_set_idle(r->s, &(kvpd_idle_ops){fake_pending, fake_run, NULL});
}

static void rig_submit(rig *r, int units)
{
    for (int i = 0; i < N_SESS; i++) {
        atomic_store(&units_left[i], units);
        sess[i].state = KVP_SESSION_TURN;
        kvpd_sched_submit(r->s, &sess[i]);
    }
}

static void rig_wait_done(rig *r)
{
    double end = kvp_now() + 60;
    while (atomic_load(&n_done) < N_SESS) {
        cr_assert_lt(kvp_now(), end, "the turns did not finish");
        uv_run(&r->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
}

static void rig_stop(rig *r)
{
    kvpd_sched_stop(r->s);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    kvpd_sched_free(r->s);
    cr_assert_eq(uv_loop_close(&r->loop), 0);
}

/* Background work always waiting, turns coming and going: it runs while the scheduler
 * is idle (before and after the turns), gives way to the turns, and is never seen at
 * the same time as a step, by either side or by the scheduler's own count. */
Test(background, never_runs_inside_a_step_and_gives_way_to_turns, .timeout = 120)
{
    rig r;
    atomic_store(&idle_pending, 1 << 20);
    rig_start(&r, 2);
    double end = kvp_now() + 30;
    while (atomic_load(&idle_chunks) < 3) {   /* it runs while nothing else does */
        cr_assert_lt(kvp_now(), end, "background work did not run on an idle scheduler");
        uv_sleep(1);
    }
    for (int round = 0; round < 5; round++) {
        atomic_store(&n_done, 0);
        atomic_store(&n_ended, 0);
        rig_submit(&r, 20);
        rig_wait_done(&r);
        int before = atomic_load(&idle_chunks);
        end = kvp_now() + 30;
        while (atomic_load(&idle_chunks) <= before) {   /* and again once they are done */
            cr_assert_lt(kvp_now(), end, "background work did not resume");
            uv_sleep(1);
        }
    }
    uint64_t runs, in_step;
    kvpd_sched_idle_counts(r.s, &runs, &in_step);
    atomic_store(&idle_pending, 0);
    rig_stop(&r);
    cr_assert_eq(atomic_load(&overlaps), 0, "background work and a step ran at once");
    cr_assert_eq(in_step, 0);
    cr_assert_gt(runs, 0);
    cr_assert_gt(atomic_load(&idle_yields), 0, "background work never gave way to a turn");
}

/* While turns keep the step loop busy, no background work starts at all. */
Test(background, does_not_start_while_turns_run, .timeout = 120)
{
    rig r;
    atomic_store(&idle_pending, 0);
    rig_start(&r, 2);
    rig_submit(&r, 200);
    double end = kvp_now() + 30;
    while (atomic_load(&steps) == 0) {
        cr_assert_lt(kvp_now(), end, "no step ran");
        uv_sleep(1);
    }
    atomic_store(&idle_pending, 1 << 20);   /* queued while the turns run */
    kvpd_sched_kick(r.s);
    rig_wait_done(&r);
    int runs_at_done = atomic_load(&idle_runs_at_last_done);
    end = kvp_now() + 30;
    while (atomic_load(&idle_runs) == 0) {   /* it does run once they are done */
        cr_assert_lt(kvp_now(), end, "background work did not run after the turns");
        uv_sleep(1);
    }
    atomic_store(&idle_pending, 0);
    rig_stop(&r);
    cr_assert_eq(runs_at_done, 0, "background work ran while turns were queued");
    cr_assert_eq(atomic_load(&overlaps), 0);
}
