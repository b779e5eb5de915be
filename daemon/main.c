/* kvpd: the chat daemon. One libuv loop runs HTTP/websockets (libwebsockets on the same
 * loop), signals and timers; the model is loaded and run on other threads only. */
#include <errno.h>
#include <libwebsockets.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "daemon/kvpd.h"
#include "daemon/notify.h"
#include "daemon/reload.h"
#include "daemon/statelock.h"

typedef struct daemon_handles {
    uv_signal_t sigint, sigterm, sighup;
    uv_timer_t idle, drain, watchdog;
    uv_work_t load;
    double drain_deadline;
    int saves_sent;            /* shutdown: snapshots of sessions whose last one failed */
    char load_err[512];
    char policy_note[768];
    int load_rc;
    int store_rc;              /* opening the snapshot store */
    char store_err[512];
    kvp_hub_storage *storage;  /* opened at start, moved into the hub */
} daemon_handles;

static kvpd g_d;
static daemon_handles g_h;

static int busy_turns(kvpd *d)
{
    return d->hub ? kvp_hub_jobs(d->hub) : 0;
}

static void finalize(kvpd *d)
{
    uv_timer_stop(&g_h.drain);
    uv_close((uv_handle_t *)&g_h.drain, NULL);
    uv_close((uv_handle_t *)&g_h.idle, NULL);
    uv_close((uv_handle_t *)&g_h.watchdog, NULL);
    uv_close((uv_handle_t *)&g_h.sigint, NULL);
    uv_close((uv_handle_t *)&g_h.sigterm, NULL);
    uv_close((uv_handle_t *)&g_h.sighup, NULL);
    kvpd_web_stop(&d->web);
    kvp_hub_stop(d->hub);
}

/* Waits for cancelled turns to report (each writes its snapshot) and their last frames
 * to be written, then for the snapshots of sessions still unsaved. */
static void on_drain(uv_timer_t *t)
{
    kvpd *d = t->data;
    int busy = busy_turns(d);
    int deadline = kvp_now() > g_h.drain_deadline;
    if (busy == 0 && d->web.frames_pending == 0 && !g_h.saves_sent && !deadline) {
        g_h.saves_sent = 1;
        /* Every turn wrote its session's snapshot as it ended; a session whose last
         * write failed gets one more try on a worker. */
        int n = d->hub ? kvp_hub_save_unsaved(d->hub) : 0;
        if (n) {
            kvpd_log("info", "writing %d session snapshot(s) that failed before", n);
            return;
        }
    }
    if ((busy == 0 && d->web.frames_pending == 0 && g_h.saves_sent) || deadline) {
        if (busy)
            kvpd_log("warning", "%d job(s) still running at the shutdown deadline", busy);
        int unsaved = d->hub ? kvp_hub_unsaved(d->hub) : 0;
        if (unsaved) {   /* turns a client saw are not on disk: not a clean stop */
            kvpd_log("error", "%d session(s) could not be written to the state directory", unsaved);
            d->exit_code = 1;
        }
        finalize(d);
    }
}

static void begin_shutdown(kvpd *d, const char *why)
{
    if (d->draining)
        return;
    d->draining = 1;
    d->web.draining = 1;
    int running = d->hub ? kvp_hub_drain(d->hub) : 0;
    kvpd_log("info", "%s: stopping (%d turn(s) to finish)", why, running);
    kvpd_notify("STOPPING=1\nSTATUS=stopping: %d turn(s) to finish", running);
    g_h.drain_deadline = kvp_now() + d->cfg.shutdown_timeout_ms / 1e3;
    uv_timer_start(&g_h.drain, on_drain, 0, 20);
}

static void on_signal(uv_signal_t *h, int signum)
{
    if (signum == SIGHUP)
        kvpd_reload(h->data);
    else
        begin_shutdown(h->data, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* From the loop itself, so a stuck loop stops the pings and systemd restarts us. */
static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    kvpd_notify("WATCHDOG=1");
}

static void on_idle_timer(uv_timer_t *t)
{
    kvpd *d = t->data;
    if (!d->draining && d->hub)
        kvp_hub_expire(d->hub, kvp_now());
}

/* The policy conf (its identity names the model's file). */
static int prepare(kvpd *d, char *err, size_t errlen)
{
    return kvpd_policy_conf_make(&d->cfg, &d->model, &d->pconf, g_h.policy_note,
                                 sizeof g_h.policy_note, err, errlen);
}

/* Thread pool: loading a model is model work and may take seconds; the snapshot store
 * is opened (a state directory is swept of writes a crash interrupted and of expired
 * snapshots; a Redis server must answer). */
static void load_work(uv_work_t *w)
{
    kvpd *d = w->data;
    kvp_hub_storage_params sp = {.state_dir = d->cfg.state_dir, .state_url = d->cfg.state_url,
                                 .ttl_s = d->cfg.snapshot_ttl_s, .lease_ms = d->cfg.lease_ms,
                                 .node_id = d->cfg.node_id,
                                 .tenant_bytes_max = d->cfg.max_state_bytes_per_tenant,
                                 .tenant_snaps_max = d->cfg.max_state_snapshots_per_tenant};
    g_h.store_rc = kvp_hub_storage_open(&g_h.storage, &sp, g_h.store_err, sizeof g_h.store_err);
    if (g_h.store_rc < 0)
        return;
    g_h.load_rc = kvp_model_load(&d->model, d->cfg.model,
                                 d->cfg.tokenizer[0] ? d->cfg.tokenizer : NULL,
                                 g_h.load_err, sizeof g_h.load_err);
    if (g_h.load_rc == 0) {
        g_h.load_rc = prepare(d, g_h.load_err, sizeof g_h.load_err);
        if (g_h.load_rc < 0)
            kvp_model_free(&d->model);
    }
}

static void load_done(uv_work_t *w, int status)
{
    kvpd *d = w->data;
    if (d->draining) {   /* a signal came during the load; nothing to start */
        kvp_hub_storage_close(g_h.storage);
        g_h.storage = NULL;
        if (status == 0 && g_h.load_rc == 0)
            kvp_model_free(&d->model);
        return;
    }
    if (g_h.store_rc < 0) {
        snprintf(g_h.load_err, sizeof g_h.load_err, "%s", g_h.store_err);
        g_h.load_rc = g_h.store_rc;
    }
    if (status == 0 && g_h.load_rc == 0 && d->cfg.max_cache_bytes &&
        d->cfg.max_cache_bytes < kvpd_turn_bytes(d)) {
        snprintf(g_h.load_err, sizeof g_h.load_err,
                 "max_cache_bytes %llu is less than one turn needs (%zu at budget %d, chunk %d)",
                 (unsigned long long)d->cfg.max_cache_bytes, kvpd_turn_bytes(d), d->cfg.budget,
                 d->cfg.chunk);
        g_h.load_rc = -EINVAL;
        kvp_model_free(&d->model);
    } else if (status == 0 && g_h.load_rc == 0 && d->cfg.max_cache_bytes_per_tenant &&
               d->cfg.max_cache_bytes_per_tenant < kvpd_turn_bytes(d)) {
        snprintf(g_h.load_err, sizeof g_h.load_err,
                 "max_cache_bytes_per_tenant %llu is less than one turn needs (%zu at budget "
                 "%d, chunk %d)", (unsigned long long)d->cfg.max_cache_bytes_per_tenant,
                 kvpd_turn_bytes(d), d->cfg.budget, d->cfg.chunk);
        g_h.load_rc = -EINVAL;
        kvp_model_free(&d->model);
    }
    if (status < 0 || g_h.load_rc < 0) {
        kvp_hub_storage_close(g_h.storage);
        g_h.storage = NULL;
        kvpd_log("error", "%s", status < 0 ? uv_strerror(status) : g_h.load_err);
        kvpd_notify("STATUS=failed: %s", status < 0 ? uv_strerror(status) : g_h.load_err);
        if (g_h.load_rc == 0)
            kvp_model_free(&d->model);
        d->exit_code = 1;
        begin_shutdown(d, g_h.store_rc < 0 ? "snapshot store unavailable" : "model load failed");
        return;
    }
    d->model_loaded = 1;
    /* one batched step runs at a time (turns/scheduler.h): its matrices get every core */
    kvp_model_use_cores(&d->model);
    char err[256];
    kvp_hub_params hp = {.loop = &d->loop, .model = &d->model, .cfg = &d->hub_cfg,
                         .metrics = &d->metrics, .policy = d->pconf,
                         .storage = g_h.storage, .chunk = d->cfg.chunk,
                         .kv_type = d->cfg.kv_type, .budget_mode = d->cfg.budget_mode,
                         .step_tokens = d->cfg.step_tokens, .prefill_tokens = d->cfg.prefill_tokens, .share_prompts = d->cfg.share_prompts, .workers = d->cfg.workers, .reuse_cache = d->cfg.reuse_cache, .share_rows = d->cfg.share_rows,
                         .top_p = d->cfg.top_p, .seed = d->cfg.seed,
                         .chat_template = d->cfg.chat_template,
                         .chat_template_file = d->cfg.chat_template_file,
                         .learn_dir = d->cfg.learn_dir, .learn_rate = d->cfg.learn_rate,
                         .learn_max_bytes = d->cfg.learn_max_bytes,
                         .learn_max_age_s = d->cfg.learn_max_age_days * 86400.0,
                         .learn_exclude_system = d->cfg.learn_exclude_system};
    char where[512];
    kvp_hub_storage_describe(g_h.storage, where, sizeof where);
    g_h.storage = NULL;   /* the hub's now, also when it fails to start */
    int rc = kvp_hub_start(&d->hub, &hp, err, sizeof err);
    if (rc < 0) {
        kvpd_log("error", "%s", err);
        d->exit_code = 1;
        begin_shutdown(d, "scheduler failed");
        return;
    }
    d->web.hub = d->hub;
    kvp_hub_info info;
    kvp_hub_info_get(d->hub, &info);
    kvpd_log("info", "%s", g_h.policy_note);
    if (strcmp(kvp_hub_policy_name(d->pconf), "kvp") || !kvp_hub_policy_file(d->pconf)[0])
        kvpd_log("info", "model %s runs without a learned eviction policy (policy %s); to get "
                 "one: kvp learn --model %s%s%s, then reload (SIGHUP)", d->model.name,
                 kvp_hub_policy_name(d->pconf), d->cfg.model, d->cfg.learn_dir[0] ? " --transcripts " : "",
                 d->cfg.learn_dir);
    if (d->cfg.learn_dir[0])
        kvpd_log("info", "learn_dir %s: keeping the token ids (with the public vocabulary, "
                 "the text) of %.0f%% of conversations, %s (at most %llu bytes, %d days)",
                 d->cfg.learn_dir, 100.0 * d->cfg.learn_rate, d->cfg.learn_exclude_system
                 ? "without their system prompts" : "system prompts included",
                 (unsigned long long)d->cfg.learn_max_bytes, d->cfg.learn_max_age_days);
    kvpd_log("info", "model %s (%s, %s, %d layers, context %d), policy %s, budget %d, chunk %d, "
             "%d worker(s), state %s, cache cap %llu (%zu per turn)",
             d->model.name, d->model.arch, info.chat_format, d->model.cfg.n_layers,
             d->model.cfg.seq_len, kvp_hub_policy_name(d->pconf), d->cfg.budget, d->cfg.chunk,
             d->cfg.workers, where,
             (unsigned long long)d->cfg.max_cache_bytes, kvpd_turn_bytes(d));
    char mix[256];
    kvp_model_weight_mix(&d->model, mix, sizeof mix);
    kvpd_log("info", "weights: %s (matmul kernels %s), fingerprint %016llx", mix, kvp_matmul_simd(),
             (unsigned long long)d->model.cfg.fingerprint);
    kvpd_announce_ready(d);
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
    rc = prepare(d, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "kvpd: %s\n", err);
    else
        printf("kvpd: configuration ok (model %s, %s, budget %d)\n", d->model.name,
               g_h.policy_note, d->cfg.budget);
    kvp_hub_policy_unref(d->pconf);
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
        printf("\npolicies: %s\n", kvp_hub_policy_names());
        return 0;
    }
    if (action == KVPD_VERSION) {
        printf("kvpd %s\n", KVP_VERSION);
        return 0;
    }
    if (kvpd_config_resolve_state_dir(&d->cfg, err, sizeof err) < 0 ||
        kvpd_config_validate(&d->cfg, err, sizeof err) < 0 ||
        kvpd_config_load_keys(&d->cfg, err, sizeof err) < 0) {
        fprintf(stderr, "kvpd: %s\n", err);
        return 2;
    }
    if (action == KVPD_CHECK)   /* takes no lock: it may check a running daemon's config */
        return check_config(d);
    /* One daemon per state directory: a second would write the same files. */
    int state_lock = -1;
    if (d->cfg.state_dir[0] && (state_lock = kvpd_statelock_take(d->cfg.state_dir, err,
                                                                  sizeof err)) < 0) {
        fprintf(stderr, "kvpd: %s\n", err);
        return 1;
    }

    if (d->cfg.workers == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        d->cfg.workers = n > 0 ? (int)n : 1;
    }
    signal(SIGPIPE, SIG_IGN);

    d->argc = argc;
    d->argv = argv;
    kvpd_hub_config_sync(d);
    kvpd_metrics_init(&d->metrics);
    d->web.cfg = &d->cfg;
    d->web.metrics = &d->metrics;
    d->web.loop = &d->loop;
    d->web.started = kvp_now();

    int rc = uv_loop_init(&d->loop);
    if (rc < 0) {
        fprintf(stderr, "kvpd: uv_loop_init: %s\n", uv_strerror(rc));
        return 1;
    }
    if (kvpd_web_start(&d->web, err, sizeof err) < 0) {
        fprintf(stderr, "kvpd: %s\n", err);
        if (d->web.lws) {
            /* lws 4.1 crashes tearing down a context whose vhost failed (a bind lost
             * to a race after the probe): nothing is running yet, so just leave. */
            _exit(1);
        }
        uv_loop_close(&d->loop);
        return 1;
    }
    fprintf(stderr, "kvpd: listening on %s:%d\n", d->cfg.listen_host, d->web.port);
    kvpd_notify("STATUS=loading model %s", d->cfg.model);

    uv_signal_init(&d->loop, &g_h.sigint);
    uv_signal_init(&d->loop, &g_h.sigterm);
    uv_signal_init(&d->loop, &g_h.sighup);
    uv_timer_init(&d->loop, &g_h.idle);
    uv_timer_init(&d->loop, &g_h.drain);
    uv_timer_init(&d->loop, &g_h.watchdog);
    g_h.sigint.data = g_h.sigterm.data = g_h.sighup.data = g_h.idle.data = g_h.drain.data =
        g_h.load.data = d;
    uint64_t wd_usec = kvpd_notify_watchdog_usec();
    uint64_t wd_ms = wd_usec / 2000 ? wd_usec / 2000 : 1;   /* half the interval */
    if ((rc = uv_signal_start(&g_h.sigint, on_signal, SIGINT)) < 0 ||
        (rc = uv_signal_start(&g_h.sigterm, on_signal, SIGTERM)) < 0 ||
        (rc = uv_signal_start(&g_h.sighup, on_signal, SIGHUP)) < 0 ||
        (wd_usec && (rc = uv_timer_start(&g_h.watchdog, on_watchdog, 0, wd_ms)) < 0) ||
        (rc = uv_timer_start(&g_h.idle, on_idle_timer, 1000, 1000)) < 0 ||
        (rc = uv_queue_work(&d->loop, &g_h.load, load_work, load_done)) < 0) {
        kvpd_log("error", "start: %s", uv_strerror(rc));
        d->exit_code = 1;
        begin_shutdown(d, "start failed");
    }

    uv_run(&d->loop, UV_RUN_DEFAULT);

    /* lws finishes tearing down once its handles have closed. */
    if (d->web.lws)
        lws_context_destroy(d->web.lws);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    kvp_hub_free(d->hub);
    kvp_hub_storage_close(g_h.storage);   /* when the hub never took it */
    kvp_hub_policy_unref(d->pconf);
    if (d->model_loaded)
        kvp_model_free(&d->model);
    if (uv_loop_close(&d->loop) == UV_EBUSY) {
        uv_walk(&d->loop, close_walk, NULL);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        uv_loop_close(&d->loop);
    }
    kvpd_statelock_release(state_lock);
    kvpd_log("info", "stopped");
    return d->exit_code;
}
