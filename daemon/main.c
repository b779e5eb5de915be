/* kvpd: the chat daemon. One libuv loop runs HTTP/websockets (libwebsockets on the same
 * loop), signals and timers; the model is loaded and run on other threads only. */
#include <cblas.h>
#include <errno.h>
#include <libwebsockets.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/kvpd.h"
#include "policy/policy.h"
#include "web/server.h"

typedef struct daemon_handles {
    uv_signal_t sigint, sigterm;
    uv_timer_t idle, drain;
    uv_work_t load;
    double drain_deadline;
    char load_err[512];
    int load_rc;
} daemon_handles;

static kvpd g_d;
static daemon_handles g_h;

static int busy_turns(kvpd *d)
{
    int n = 0;
    for (kvp_session *s = d->sessions.head; s; s = s->next)
        n += s->busy;
    return n;
}

static void finalize(kvpd *d)
{
    uv_timer_stop(&g_h.drain);
    uv_close((uv_handle_t *)&g_h.drain, NULL);
    uv_close((uv_handle_t *)&g_h.idle, NULL);
    uv_close((uv_handle_t *)&g_h.sigint, NULL);
    uv_close((uv_handle_t *)&g_h.sigterm, NULL);
    kvpd_web_stop(d);
    if (d->sched)
        kvpd_sched_stop(d->sched);
}

/* Waits for cancelled turns to report and their last frames to be written. */
static void on_drain(uv_timer_t *t)
{
    kvpd *d = t->data;
    int busy = busy_turns(d);
    if ((busy == 0 && d->frames_pending == 0) || kvp_now() > g_h.drain_deadline) {
        if (busy)
            kvpd_log("warning", "%d turn(s) still running at the shutdown deadline", busy);
        finalize(d);
    }
}

static void begin_shutdown(kvpd *d, const char *why)
{
    if (d->draining)
        return;
    d->draining = 1;
    int running = kvpd_web_cancel_all(d);
    kvpd_log("info", "%s: stopping (%d turn(s) to finish)", why, running);
    g_h.drain_deadline = kvp_now() + d->cfg.shutdown_timeout_ms / 1e3;
    uv_timer_start(&g_h.drain, on_drain, 0, 20);
}

static void on_signal(uv_signal_t *h, int signum)
{
    begin_shutdown(h->data, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

static void on_idle_timer(uv_timer_t *t)
{
    kvpd *d = t->data;
    if (!d->draining)
        kvpd_web_expire(d, kvp_now());
}

static int create_policy_check(kvpd *d, char *err, size_t errlen)
{
    kvp_policy *p;
    int rc = kvp_policy_create(&p, d->cfg.policy, d->cfg.policy_file[0] ? d->cfg.policy_file : NULL,
                               &d->model.cfg, d->cfg.seed, err, errlen);
    if (rc == 0)
        kvp_policy_destroy(p);
    return rc;
}

/* Thread pool: loading a model is model work and may take seconds. */
static void load_work(uv_work_t *w)
{
    kvpd *d = w->data;
    g_h.load_rc = kvp_model_load(&d->model, d->cfg.model,
                                 d->cfg.tokenizer[0] ? d->cfg.tokenizer : NULL,
                                 g_h.load_err, sizeof g_h.load_err);
    if (g_h.load_rc == 0) {
        g_h.load_rc = create_policy_check(d, g_h.load_err, sizeof g_h.load_err);
        if (g_h.load_rc < 0)
            kvp_model_free(&d->model);
    }
}

static void load_done(uv_work_t *w, int status)
{
    kvpd *d = w->data;
    if (d->draining) {   /* a signal came during the load; nothing to start */
        if (status == 0 && g_h.load_rc == 0)
            kvp_model_free(&d->model);
        return;
    }
    if (status < 0 || g_h.load_rc < 0) {
        kvpd_log("error", "%s", status < 0 ? uv_strerror(status) : g_h.load_err);
        if (g_h.load_rc == 0)
            kvp_model_free(&d->model);
        d->exit_code = 1;
        begin_shutdown(d, "model load failed");
        return;
    }
    d->env.model = &d->model;
    if (kvp_template_init(&d->env.tpl, &d->model))
        kvpd_log("warning", "chat template markers missing from the vocabulary: plain text");
    char err[256];
    int rc = kvpd_sched_start(&d->sched, &d->loop, d->cfg.workers, &d->env,
                              kvpd_web_on_event, d, err, sizeof err);
    if (rc < 0) {
        kvpd_log("error", "%s", err);
        d->exit_code = 1;
        begin_shutdown(d, "scheduler failed");
        return;
    }
    d->ready = 1;
    kvpd_log("info", "model %s (%s, %d layers, context %d), policy %s, budget %d, chunk %d, %d worker(s)",
             d->model.name, kvp_template_name(d->env.tpl.format), d->model.cfg.n_layers,
             d->model.cfg.seq_len, d->cfg.policy, d->cfg.budget, d->cfg.chunk, d->cfg.workers);
}

static int check_config(kvpd *d)
{
    char err[512];
    int rc = kvp_model_load(&d->model, d->cfg.model, d->cfg.tokenizer[0] ? d->cfg.tokenizer : NULL,
                            err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "kvpd: %s\n", err);
        return 1;
    }
    rc = create_policy_check(d, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "kvpd: %s\n", err);
    else
        printf("kvpd: configuration ok (model %s, policy %s, budget %d)\n", d->model.name,
               d->cfg.policy, d->cfg.budget);
    kvp_model_free(&d->model);
    return rc < 0 ? 1 : 0;
}

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

int main(int argc, char **argv)
{
    kvpd *d = &g_d;
    char err[512];
    enum kvpd_action action;
    if (kvpd_config_from_args(&d->cfg, argc, argv, &action, err, sizeof err) < 0) {
        fprintf(stderr, "kvpd: %s\n", err);
        return 2;
    }
    if (action == KVPD_HELP) {
        kvpd_config_usage(stdout);
        printf("\npolicies: %s\n", kvp_policy_names());
        return 0;
    }
    if (action == KVPD_VERSION) {
        printf("kvpd %s\n", KVP_VERSION);
        return 0;
    }
    if (kvpd_config_validate(&d->cfg, err, sizeof err) < 0) {
        fprintf(stderr, "kvpd: %s\n", err);
        return 2;
    }
    if (action == KVPD_CHECK)
        return check_config(d);

    if (d->cfg.workers == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        d->cfg.workers = n > 0 ? (int)n : 1;
    }
    /* workers x BLAS threads must not exceed the cores. */
    if (d->cfg.workers > 1)
        openblas_set_num_threads(1);
    signal(SIGPIPE, SIG_IGN);

    d->env.policy_name = d->cfg.policy;
    d->env.policy_file = d->cfg.policy_file;
    d->env.budget = d->cfg.budget;
    d->env.chunk = d->cfg.chunk;
    d->env.reuse_cache = d->cfg.reuse_cache;
    d->env.top_p = d->cfg.top_p;
    d->env.seed = d->cfg.seed;
    d->sessions.max = d->cfg.max_sessions;
    d->started = kvp_now();
    kvpd_metrics_init(&d->metrics);

    int rc = uv_loop_init(&d->loop);
    if (rc < 0) {
        fprintf(stderr, "kvpd: uv_loop_init: %s\n", uv_strerror(rc));
        return 1;
    }
    if (kvpd_web_start(d, err, sizeof err) < 0) {
        fprintf(stderr, "kvpd: %s\n", err);
        if (d->lws) {
            /* lws 4.1 crashes tearing down a context whose vhost failed (a bind lost
             * to a race after the probe): nothing is running yet, so just leave. */
            _exit(1);
        }
        uv_loop_close(&d->loop);
        return 1;
    }
    fprintf(stderr, "kvpd: listening on %s:%d\n", d->cfg.listen_host, d->port);

    uv_signal_init(&d->loop, &g_h.sigint);
    uv_signal_init(&d->loop, &g_h.sigterm);
    uv_timer_init(&d->loop, &g_h.idle);
    uv_timer_init(&d->loop, &g_h.drain);
    g_h.sigint.data = g_h.sigterm.data = g_h.idle.data = g_h.drain.data = g_h.load.data = d;
    if ((rc = uv_signal_start(&g_h.sigint, on_signal, SIGINT)) < 0 ||
        (rc = uv_signal_start(&g_h.sigterm, on_signal, SIGTERM)) < 0 ||
        (rc = uv_timer_start(&g_h.idle, on_idle_timer, 1000, 1000)) < 0 ||
        (rc = uv_queue_work(&d->loop, &g_h.load, load_work, load_done)) < 0) {
        kvpd_log("error", "start: %s", uv_strerror(rc));
        d->exit_code = 1;
        begin_shutdown(d, "start failed");
    }

    uv_run(&d->loop, UV_RUN_DEFAULT);

    /* lws finishes tearing down once its handles have closed. */
    if (d->lws)
        lws_context_destroy(d->lws);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    if (d->sched)
        kvpd_sched_free(d->sched);
    kvp_session_table_clear(&d->sessions);
    if (d->env.model)
        kvp_model_free(&d->model);
    if (uv_loop_close(&d->loop) == UV_EBUSY) {
        uv_walk(&d->loop, close_walk, NULL);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        uv_loop_close(&d->loop);
    }
    kvpd_log("info", "stopped");
    return d->exit_code;
}
