/* The workers' events back on the loop: a job's end taken in (counters, the snapshot's
 * fate, the prefix index), the turn's tokens, done and errors sent to the client that
 * started it, and a load's waiting request resumed. Loop thread. */
#include "sessions/hub.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "observe/background.h"
#include "observe/canary.h"
#include "sessions/hub_impl.h"
#include "store/prefix.h"
#include "sessions/prefix_load.h"
#include "sessions/residency.h"
#include "sessions/reuse.h"
#include "store/store.h"

/* ---- worker events ---- */

/* A job's final event: the loop owns the whole session again and takes in what the
 * worker left (restored counters, the snapshot's fate, the cache's size). Returns the
 * client the job answers (the turn's owner, or the attached client for a load). */
static kvp_hub_client *job_ended(kvp_hub *h, kvp_session *s)
{
    kvpd_metrics *m = h->m;
    kvp_hub_client *to = s->state == KVP_SESSION_TURN || s->fork_read ? s->owner : s->client;
    if (s->state == KVP_SESSION_TURN)   /* its request is the loop's again */
        kvp_session_request_release(s);
    s->fork_read = 0;
    if (s->res.restored.pending) {   /* the snapshot's tenant, before anything compares it */
        snprintf(s->tenant, sizeof s->tenant, "%s", s->res.restored.tenant);
        s->unread = 0;
    }
    /* need_restore is the loop's alone: cleared once a job read the snapshot back, set
     * when one had to and could not (memory is not the session then) */
    if (s->res.restored.pending)
        s->need_restore = 0;
    else if (s->res.unrestored)
        s->need_restore = 1;
    h->jobs--;
    s->state = KVP_SESSION_IDLE;
    s->prefix_inflight = 0;   /* its entry is replaced or removed now */
    /* its tokens into the prefix index while its cache holds them from the start (an
     * entry that cannot be made only costs a later fork); an ephemeral session's never:
     * nothing forks it */
    if (!s->ephemeral && s->policy && !s->hist_tokens && s->cache.n_seen == s->n_cached &&
        s->n_cached > 0)
        (void)kvp_prefix_put(h->prefix, s, s->tenant, s->tokens, s->n_cached);
    else
        kvp_prefix_remove(h->prefix, s);
    s->owner = NULL;
    s->reserve = 0;
    s->reserve_lp = 0;
    s->last_active = kvp_now();
    /* The lease runs out lease_ms after this job, or goes now when nobody is attached. */
    if (s->client)
        kvp_store_lease_idle(h->env.store, s->id);
    else
        kvp_store_lease_drop(h->env.store, s->id);
    if (s->res.restored.pending) {
        m->unparks++;
        if (s->res.restored.rebuilt) {
            m->rebuilds++;
            kvpd_log("info", "session %.8s: rebuilt from its transcript: %s", s->id,
                     s->res.restored.note);
        } else if (s->res.restored.note[0]) {   /* e.g. a damaged journal tail was ignored */
            kvpd_log("warning", "session %.8s: %s", s->id, s->res.restored.note);
        }
    }
    if (s->res.save_rc < 0) {
        m->snapshot_failures++;
        /* -ESTALE: not written because the store holds a newer version (or another node
         * the lease): the store is fine, no degraded health; the next job takes the
         * lease and reloads this copy */
        s->save_failed = s->res.save_rc != -ESTALE;
        kvpd_log("warning", "session %.8s: %s", s->id, s->res.save_err);
    } else if (s->res.save_rc > 0) {
        m->snapshots_written++;
        s->save_failed = 0;
        s->save_retries = 0;
        kvpd_hist_observe(&m->snapshot_write, s->res.save_ms / 1e3);
        kvpd_hist_observe(&m->snapshot_bytes, (double)s->res.save_bytes);
    }
    s->turns = s->turns_done;
    s->transcript_hash = kvp_session_index_hash(s);
    s->transcript_msgs = s->hist_msgs + s->n_msgs;
    s->transcript_dropped = s->hist_msgs;
    if (s->transcript_msgs > 0 && !s->ephemeral &&
        kvp_transcripts_put(&h->transcripts, s->id, s->transcript_hash, s->transcript_msgs) < 0)
        kvpd_log("warning", "session %.8s: out of memory for the transcript index", s->id);
    s->evicted_rows = s->cache.evicted_rows;
    s->rows_max = kvp_cache_max_rows(&s->cache);
    kvp_session_count_bytes(s);
    return to;
}

/* The session's snapshot was missing or bad when it was needed: it is gone (or, for an
 * open naming an id with no snapshot, it never was). */
static void lose(kvp_hub *h, kvp_session *s, kvp_hub_client *to, int code, const char *why)
{
    if (s->has_snapshot || code == -EBADMSG) {
        h->m->sessions_lost++;
        kvpd_log("warning", "session %.8s lost: %s", s->id, why);
    }
    hub_emit_error(to, KVPD_E_UNKNOWN_SESSION, code == -EBADMSG
               ? "the session's snapshot was damaged; it was moved aside"
               : "no such session (expired or never existed)");
    kvp_hub_drop(h, s);
}

/* Another node holds the session's lease: this node's copy, if any, is not the one to
 * serve, so it leaves memory (the store keeps the session); the client is told to retry
 * (through the balancer, which sends it to the holder or back here once the lease ends). */
static void elsewhere(kvp_hub *h, kvp_session *s, kvp_hub_client *to, const char *why)
{
    kvpd_log("info", "session %.8s: %s", s->id, why);
    hub_emit_error_retry(to, KVPD_E_ELSEWHERE, why, s->res.elsewhere_ms > 0 ? s->res.elsewhere_ms : 1);
    kvp_hub_drop(h, s);
}

/* The turn was cut because this node's lease ran out (turns/turn.c): the worker has
 * dropped what memory held of the session, so it is parked, to be read from the store at
 * its next job: its last stored turn, as any node reads it. Nothing of the cut turn is
 * left to write again. */
static void lease_cut(kvp_hub *h, kvp_session *s, kvp_hub_client *to, const char *why)
{
    h->m->turns_failed++;
    kvpd_log("warning", "session %.8s: %s", s->id, why);
    hub_emit_error(to, KVPD_E_INTERNAL, why);
    s->save_failed = 0;
    s->save_retries = 0;
    s->turns = s->turns_done;
    kvp_store_lease_drop(h->env.store, s->id);
    kvp_session_park(&h->sessions, s);
}

/* A restore that failed for a reason that may pass (I/O, memory): parked again (or let
 * go, when the session was never in memory). */
static void restore_failed(kvp_hub *h, kvp_session *s, kvp_hub_client *to, const char *why)
{
    kvpd_log("warning", "session %.8s: %s", s->id, why);
    hub_emit_error(to, KVPD_E_INTERNAL, "the session could not be loaded; try again");
    if (!s->has_snapshot) {
        kvp_hub_drop(h, s);
    } else {
        kvp_store_lease_drop(h->env.store, s->id);
        kvp_session_park(&h->sessions, s);
    }
}

/* The load a request waited for ended: it continues that session when the session's
 * transcript is the request's history (the index is a hint: compared now), else a new
 * one. A load that failed is not the request's error. */
static void chat_loaded(kvp_hub *h, kvp_session *s, kvp_hub_client *c, const kvpd_event *ev)
{
    kvp_hub_pending *p = c->pending;
    c->pending = NULL;
    kvp_session *use = NULL;
    if (ev->code == -EADDRINUSE && p->named) {   /* the named one is served elsewhere */
        elsewhere(h, s, c, ev->text);
        hub_pending_free(p);
        return;
    }
    if (ev->code < 0) {
        /* the session first (hub_leave() would drop one that never ran a turn here) */
        if (ev->code == -EADDRINUSE)
            elsewhere(h, s, NULL, ev->text);
        else if (s->res.lost)
            lose(h, s, NULL, ev->code, ev->text);
        else
            restore_failed(h, s, NULL, ev->text);
        hub_leave(c);   /* still attached when it was parked again */
    } else if (hub_continues(c, s, p->named, p->hash, p->system, p->system_len, p->msgs, p->n - 1)) {
        kvpd_log("info", "session %.8s: loaded from its snapshot for a request that extends it",
                 s->id);
        use = s;
    } else {
        hub_leave(c);   /* it stays in memory, idle, under its real transcript */
    }
    if (!use && p->fork)   /* the source is in memory now (or not): a fork, or a prefill */
        hub_chat_new(c, p->system, p->system_len, p->msgs, p->n, &p->o, 0, 0);
    else
        hub_chat_go(c, use, p->system, p->system_len, p->msgs, p->n, &p->o);
    hub_pending_free(p);
}

static void on_job(kvp_hub *h, kvp_session *s, const kvpd_event *ev)
{
    if (s->state == KVP_SESSION_RENDER) {   /* a new session's request is rendered */
        hub_chat_rendered(h, s, ev->code);
        return;
    }
    int was_load = s->state == KVP_SESSION_LOAD, read = s->res.restored.pending;
    kvp_hub_client *to = job_ended(h, s);
    int fork = was_load && to && hub_fork_waited(to, s);
    if (was_load && to && to->pending) {
        chat_loaded(h, s, to, ev);
        return;
    }
    int check = to && to->check_system;
    char *want = check ? to->want_system : NULL;
    size_t want_len = check ? to->want_system_len : 0;
    if (to) {   /* the check is this load's only */
        to->want_system = NULL;
        to->check_system = 0;
    }
    if (was_load && ev->code == -EADDRINUSE) {
        elsewhere(h, s, to, ev->text);
    } else if (was_load && ev->code < 0 && s->res.lost) {
        lose(h, s, to, ev->code, ev->text);
    } else if (was_load && ev->code < 0) {
        restore_failed(h, s, to, ev->text);
    } else if (fork) {
        hub_fork_loaded(to, s);
    } else if (was_load) {
        if (read)   /* (a shared store's session in memory and current is not read) */
            kvpd_log("info", "session %.8s: loaded from its snapshot (%d turns)", s->id,
                     s->turns);
        if (to && !hub_same_tenant(to, s)) {   /* another tenant's: as if it did not exist */
            hub_emit_error(to, KVPD_E_UNKNOWN_SESSION, "no such session (expired or never existed)");
            hub_leave(to);
        } else if (check && !hub_system_matches(to, s, want ? want : "", want_len))
            hub_leave(to);
        else if (to)
            hub_emit_session(to, 1);
    } else {   /* a save job (a retry, or shutdown): its outcome decides durability */
        /* -ESTALE: the store holds a newer version (or another node the lease); this
         * copy is not written and nothing acknowledged is lost with it */
        s->save_failed = ev->code < 0 && ev->code != -ESTALE;
        if (ev->code < 0)
            kvpd_log("warning", "session %.8s: %s", s->id, ev->text);
        else if (s->save_retries)
            kvpd_log("info", "session %.8s: its snapshot was written on retry %d", s->id,
                     s->save_retries);
        if (ev->code >= 0)
            s->save_retries = 0;
    }
    free(want);
}

static const char *error_code(int rc)
{
    return rc == -E2BIG ? KVPD_E_TOO_LARGE : KVPD_E_INTERNAL;
}

/* A turn is done: its canary record and (for a sampled conversation with learn_dir)
 * its transcript go to the background queue, for a worker with nothing else to do. */
static void background_after_turn(kvp_hub *h, kvp_session *s)
{
    if (!h->bg)
        return;
    /* the record the loop made when it armed the turn, written by the worker: the
     * background queue owns it from here (one the worker dropped is freed) */
    kvp_turn_spec *sp = &s->rq.spec;
    if (s->res.canary_dropped)
        kvp_canary_rec_free(sp->canary);
    else
        kvp_background_canary(h->bg, sp->canary);
    sp->canary = NULL;
    /* an ephemeral session keeps nothing, in learn_dir neither */
    if (!s->ephemeral && s->hist_tokens == 0 &&
        kvp_learnlog_sampled(kvp_background_learnlog(h->bg), s->id)) {
        /* tokens[0] is the conversation's start: the system prompt, then msgs[0] */
        kvp_background_conv conv = {.tenant = s->tenant, .session_id = s->id,
                                    .tokens = s->tokens, .n = s->n_tokens,
                                    .system = s->system, .system_len = s->system_len};
        if (s->n_msgs > 0) {
            conv.first = s->msgs[0].text;
            conv.first_len = s->msgs[0].len;
            conv.first_user = s->msgs[0].user;
        }
        kvp_background_transcript(h->bg, &conv);
    }
    kvp_background_drain(h->bg, h->m);
    kvpd_sched_kick(h->sched);
}

static void on_event(kvp_hub *h, const kvpd_event *ev)
{
    kvp_session *s = ev->session;
    kvpd_metrics *m = h->m;
    switch (ev->type) {
    case KVPD_EV_STEP:
        kvpd_hist_observe(&m->step_sessions, ev->step.sessions);
        kvpd_hist_observe(&m->step_tokens, ev->step.rows);
        kvpd_hist_observe(&m->step_duration, ev->step.duration_s);
        return;
    case KVPD_EV_TOKEN:
        if (s->owner) {
            kvp_hub_event e = {.type = KVP_HUB_TOKEN, .text = ev->text, .len = ev->len};
            const kvp_turn_spec *sp = &s->rq.spec;
            if (sp->lp_on) {   /* entries the worker wrote before it posted the event */
                e.logprobs = sp->lp + (size_t)ev->lp_from * (size_t)(1 + sp->lp_k);
                e.n_logprobs = ev->lp_to - ev->lp_from;
                e.logprobs_top = sp->lp_k;
            }
            s->owner->sink(s->owner->ctx, &e);
        }
        return;
    case KVPD_EV_JOB:
        on_job(h, s, ev);
        return;
    case KVPD_EV_DONE: {
        const kvp_turn_stats *st = &ev->stats;
        int stale = s->res.save_rc == -ESTALE;
        if (st->cache_bytes_max > s->reserve) {
            m->reserve_overruns++;
            kvpd_log("error", "session %.8s: its cache reached %zu bytes, over the %zu reserved",
                     s->id, st->cache_bytes_max, s->reserve);
        }
        kvp_hub_client *to = job_ended(h, s);
        background_after_turn(h, s);
        m->turns++;
        if (!strcmp(st->stop, "cancel"))
            m->turns_cancelled++;
        m->prompt_tokens += (uint64_t)st->prompt_tokens;
        m->prefilled_tokens += (uint64_t)st->prefilled_tokens;
        m->cached_tokens += (uint64_t)st->cached_tokens;
        kvp_reuse_count(m, st);
        m->generated_tokens += (uint64_t)st->generated_tokens;
        m->evicted_rows += st->evicted_rows;
        kvpd_hist_observe(&m->ttft, st->ttft_ms / 1e3);
        kvpd_hist_observe(&m->turn_duration, st->duration_ms / 1e3);
        kvpd_hist_observe(&m->queue_wait, st->queue_ms / 1e3);
        /* the request's other choices fork this cache once its done is sent (taken now:
         * the sink may close the client) */
        struct kvp_hub_choices *more = to ? to->choices : NULL;
        if (to)
            to->choices = NULL;
        if (to) {
            kvp_hub_event e = {.type = KVP_HUB_DONE, .text = ev->text, .len = ev->len,
                               .stats = st,
                               /* null for a turn no store keeps (ephemeral) */
                               .durable = h->env.store && !s->ephemeral
                                              ? !s->save_failed && !stale : -1,
                               .durable_error = s->res.save_err};
            if (s->rq.spec.lp_on) {
                e.logprobs = s->rq.spec.lp;
                e.n_logprobs = s->res.lp_n;
                e.logprobs_top = s->rq.spec.lp_k;
            }
            to->sink(to->ctx, &e);
        }
        if (more)
            hub_choices_run(h, s, more, strcmp(st->stop, "cancel") != 0);
        if (s->ephemeral)   /* keeps nothing: never continued */
            kvp_hub_drop(h, s);
        return;
    }
    case KVPD_EV_ERROR: {
        kvp_hub_client *to = job_ended(h, s);
        hub_choices_free(to);   /* the request failed: its other choices do not start */
        if (s->res.refused) {   /* the request's own error, found at its turn's start */
            kvp_session_rewind_clear(s);
            kvp_session_turn_ids_clear(s);
            hub_emit_error(to, KVPD_E_BAD_REQUEST, ev->text);
            if (s->ephemeral)
                kvp_hub_drop(h, s);
            return;
        }
        if (ev->code == -EADDRINUSE) {
            elsewhere(h, s, to, ev->text);
            return;
        }
        if (ev->code == -ENOLCK && kvp_store_has_leases(h->env.store)) {
            lease_cut(h, s, to, ev->text);
            return;
        }
        if (s->res.unrestored) {   /* the turn could not get the session back from disk */
            if (s->res.lost)
                lose(h, s, to, ev->code, ev->text);
            else
                restore_failed(h, s, to, ev->text);
            return;
        }
        m->turns_failed++;
        kvpd_log("warning", "session %.8s: %s", s->id, ev->text);
        hub_emit_error(to, error_code(ev->code), ev->text);
        if (s->ephemeral)
            kvp_hub_drop(h, s);
        return;
    }
    }
}

void hub_on_event(void *ctx, const kvpd_event *ev)
{
    kvp_hub *h = ctx;
    /* A job's end: the requests waiting for this session's turn go on once its own
     * client is answered and whatever the event does to the session is done (they are
     * marked first: the session may leave memory meanwhile). */
    int ends = ev->type == KVPD_EV_JOB || ev->type == KVPD_EV_DONE ||
               ev->type == KVPD_EV_ERROR;
    int waited = ends && hub_wait_take(h, ev->session) > 0;
    on_event(h, ev);
    if (waited)
        hub_wait_resume(h);
}
