/* The session hub's client API and its attachment rule (sessions/hub.h): clients made
 * and closed, hello (a new session, one resumed from memory or disk), messages armed as
 * turns and queued, cancel; the error and session events sent to a client. Stateless
 * requests are matched in hub_match.c, the workers' events taken in hub_events.c. */
#include "sessions/hub.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/grammar.h"
#include "sessions/hub_impl.h"
#include "observe/background.h"
#include "sessions/residency.h"
#include "store/store.h"

/* ---- events to clients ---- */

void hub_emit_error_retry(kvp_hub_client *c, const char *code, const char *msg, int retry)
{
    if (!c)
        return;
    kvp_hub_event ev = {.type = KVP_HUB_ERROR, .code = code, .text = msg, .len = strlen(msg),
                        .retry_after_ms = retry};
    c->sink(c->ctx, &ev);
}

void hub_emit_error(kvp_hub_client *c, const char *code, const char *msg)
{
    hub_emit_error_retry(c, code, msg, 0);
}

/* overloaded, with a hint of when to try again. */
void hub_overloaded(kvp_hub_client *c, const char *msg)
{
    kvp_hub *h = c->hub;
    int retry = h->refused_retry_ms ? h->refused_retry_ms : kvp_hub_retry_hint_ms(h);
    h->refused_retry_ms = 0;
    hub_emit_error_retry(c, KVPD_E_OVERLOADED, msg, retry);
}

void hub_emit_session(kvp_hub_client *c, int resumed)
{
    kvp_session *s = c->session;
    /* The transcript belongs to the worker while a job runs: no history then. */
    int idle = !kvp_session_busy(s);
    kvp_hub_event ev = {.type = KVP_HUB_SESSION, .id = s->id, .resumed = resumed,
                        .turns = s->turns, .history = idle ? s->msgs : NULL,
                        .n_history = idle ? s->n_msgs : 0,
                        .history_dropped = idle ? s->hist_msgs : 0, .system = s->system,
                        .system_len = s->system_len};
    c->sink(c->ctx, &ev);
}

/* ---- attachment ---- */

/* Nothing to keep: no turn ever ran and nothing is on disk (a hello's fork holds only
 * its source's history until its own first turn), or an ephemeral session, which keeps
 * nothing by design (session.h). */
int hub_never_used(const kvp_session *s)
{
    return !kvp_session_busy(s) && !s->has_snapshot &&
           ((s->n_msgs == 0 && s->turns_done == 0) || s->fork_unrun || s->ephemeral);
}

/* The client lets go of its session; one that was never used ends here (and no longer
 * counts against its creator's sessions). */
void hub_leave(kvp_hub_client *c)
{
    kvp_session *s = c->session;
    if (!s)
        return;
    c->session = NULL;
    if (s->client == c)
        s->client = NULL;
    s->last_active = kvp_now();
    /* Nobody here serves it now: another node may take it at once (store/store.h). */
    if (!s->client && !kvp_session_busy(s))
        kvp_store_lease_drop(c->hub->env.store, s->id);
    if (hub_never_used(s)) {
        if (s->creator == c->serial)
            c->created--;
        kvp_hub_remove(c->hub, s);
    }
}

/* An idle session follows the newest client that names it; the previous one is told. */
void hub_attach(kvp_hub_client *c, kvp_session *s)
{
    if (c->session == s)
        return;
    hub_leave(c);
    kvp_hub_client *old = s->client;
    if (old && old != c) {
        old->session = NULL;
        hub_emit_error(old, KVPD_E_UNKNOWN_SESSION,
                   "another connection resumed this session; send hello to take it back");
    }
    s->client = c;
    c->session = s;
}

void hub_submit(kvp_hub *h, kvp_session *s, enum kvp_session_state job, size_t reserve)
{
    s->reserve = reserve;
    s->state = job;
    s->rq.given |= job == KVP_SESSION_TURN;   /* the request goes with the turn */
    h->jobs++;
    kvpd_sched_submit(h->sched, s);
}

/* ---- requests ---- */

kvp_hub_client *kvp_hub_client_new(kvp_hub *h, kvp_hub_sink sink, void *ctx)
{
    kvp_hub_client *c = calloc(1, sizeof *c);
    if (c) {
        c->hub = h;
        c->sink = sink;
        c->ctx = ctx;
        c->serial = ++h->clients_made;
    }
    return c;
}

void kvp_hub_client_set_tenant(kvp_hub_client *c, const char *tenant)
{
    snprintf(c->tenant, sizeof c->tenant, "%s", tenant);
}

/* The session belongs to the client's tenant (a session still to be read from disk is
 * checked once its snapshot says whose it is). */
int hub_same_tenant(const kvp_hub_client *c, const kvp_session *s)
{
    return !strcmp(c->tenant, s->tenant);
}

/* The system text a hello or a request gives may be stored. */
int hub_system_ok(kvp_hub_client *c, size_t len)
{
    if (len <= KVP_HUB_SYSTEM_MAX)
        return 1;
    char err[96];
    snprintf(err, sizeof err, "the system text is limited to %d bytes", KVP_HUB_SYSTEM_MAX);
    hub_emit_error(c, KVPD_E_TOO_LARGE, err);
    return 0;
}

int hub_same_system(const kvp_session *s, const char *system, size_t len)
{
    return s->system_len == len && (!len || !memcmp(s->system, system, len));
}

/* A hello's system text against the session it resumes: never re-templated. */
int hub_system_matches(kvp_hub_client *c, const kvp_session *s, const char *system,
                       size_t len)
{
    if (!system || hub_same_system(s, system, len))
        return 1;
    hub_emit_error(c, KVPD_E_BAD_REQUEST, s->system_len
               ? "this session was started with another system text, which cannot change; "
                 "resume it without one, or start a new session"
               : "this session was started without a system text, which cannot change; "
                 "resume it without one, or start a new session");
    return 0;
}

static void forget_system_check(kvp_hub_client *c)
{
    free(c->want_system);
    c->want_system = NULL;
    c->want_system_len = 0;
    c->check_system = 0;
}

int hub_new_session_quiet(kvp_hub_client *c, const char *system, size_t system_len)
{
    kvp_hub *h = c->hub;
    char err[256];
    if (c->session && hub_never_used(c->session))
        hub_leave(c);   /* its slot is free for the new one */
    if (c->created >= h->cfg->max_sessions_per_client) {
        snprintf(err, sizeof err, "a connection may start at most %d conversations; open a "
                 "new connection", h->cfg->max_sessions_per_client);
        hub_emit_error(c, KVPD_E_OVERLOADED, err);
        return -EBUSY;
    }
    size_t reserve;
    int rc = kvp_hub_admit_tenant(h, NULL, c->tenant, 0, 0, err, sizeof err);
    if (rc == 0)
        rc = kvp_hub_admit(h, NULL, 0, 0, &reserve, err, sizeof err);
    if (rc < 0) {
        hub_overloaded(c, err);
        return rc;
    }
    kvp_session *s;
    rc = kvp_session_create(&h->sessions, &h->env, h->pconf, NULL, kvp_now(), &s, err,
                            sizeof err);
    if (rc < 0) {
        kvpd_log("error", "session: %s", err);
        hub_emit_error(c, KVPD_E_INTERNAL, err);
        return rc;
    }
    if (kvp_session_set_system(s, system, system_len) < 0) {
        kvp_session_remove(&h->sessions, s);
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return -ENOMEM;
    }
    c->created++;
    s->creator = c->serial;
    snprintf(s->tenant, sizeof s->tenant, "%s", c->tenant);
    h->m->sessions_created++;
    hub_attach(c, s);
    return 0;
}

int hub_new_session(kvp_hub_client *c, const char *system, size_t system_len)
{
    int rc = hub_new_session_quiet(c, system, system_len);
    if (rc == 0)
        hub_emit_session(c, 0);
    return rc;
}

/* A parked session comes back under the policy in force (rebuilt from its transcript if
 * its snapshot was made under another). */
int hub_unpark(kvp_hub *h, kvp_session *s)
{
    if (s->pconf != h->pconf) {
        kvp_policy_conf_unref(s->pconf);
        s->pconf = kvp_policy_conf_ref(h->pconf);
    }
    return kvp_session_unpark(&h->sessions, s, &h->env);
}

/* A load's admission, and the session made resident for it (sessions/hub_impl.h). */
kvp_session *hub_load_prepare(kvp_hub_client *c, kvp_session *s, const char *id,
                              size_t *reserve)
{
    kvp_hub *h = c->hub;
    char err[256];
    if (kvp_hub_admit_tenant(h, s, c->tenant, 1, 0, err, sizeof err) < 0 ||
        kvp_hub_admit(h, s, 1, 0, reserve, err, sizeof err) < 0) {
        hub_overloaded(c, err);
        return NULL;
    }
    if (!s) {
        if (kvp_session_create(&h->sessions, &h->env, h->pconf, id, kvp_now(), &s, err,
                               sizeof err) < 0) {
            kvpd_log("error", "session: %s", err);
            hub_emit_error(c, KVPD_E_INTERNAL, err);
            return NULL;
        }
        s->need_restore = 1;   /* has_snapshot stays 0 until the load finds one */
        s->unread = 1;
    } else if (s->state == KVP_SESSION_PARKED && hub_unpark(h, s) < 0) {
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return NULL;
    }
    return s;
}

/* open naming a session whose state is on disk: parked here, or from before a restart
 * (s NULL), or, with a shared store, in memory here but maybe served by another node
 * since (the job takes the lease and reads the snapshot if it moved on). The snapshot
 * is read on a worker; the session event follows the job. */
void hub_open_from_disk(kvp_hub_client *c, kvp_session *s, const char *id,
                        const char *system, size_t system_len)
{
    kvp_hub *h = c->hub;
    size_t reserve;
    if (!(s = hub_load_prepare(c, s, id, &reserve)))
        return;
    int shared = kvp_store_has_leases(h->env.store);
    if (!s->need_restore && !shared) {   /* parked with nothing to keep: nothing to read */
        if (hub_system_matches(c, s, system, system_len)) {
            hub_attach(c, s);
            s->last_active = kvp_now();
            hub_emit_session(c, 1);
        }
        return;
    }
    hub_attach(c, s);
    s->last_active = kvp_now();
    forget_system_check(c);
    if (system) {   /* the session's own is known once its snapshot is read */
        c->want_system = system_len ? malloc(system_len) : NULL;
        if (system_len && !c->want_system) {
            hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
            hub_leave(c);
            return;
        }
        if (system_len)
            memcpy(c->want_system, system, system_len);
        c->want_system_len = system_len;
        c->check_system = 1;
    }
    hub_submit(h, s, KVP_SESSION_LOAD, reserve);
}

int hub_open_ready(kvp_hub_client *c)
{
    kvp_session *cur = c->session;
    if (c->hub->draining) {
        hub_emit_error(c, KVPD_E_OVERLOADED, "the daemon is shutting down");
        return 0;
    }
    if (!hub_fork_idle(c))
        return 0;
    if (cur && kvp_session_busy(cur)) {
        hub_emit_error(c, KVPD_E_BUSY, cur->state == KVP_SESSION_LOAD
                   ? "this connection's session is being loaded from disk; its session frame follows"
                   : "a turn is running on this connection's session");
        return 0;
    }
    return 1;
}

void kvp_hub_open(kvp_hub_client *c, const char *id, const char *system, size_t system_len)
{
    kvp_hub *h = c->hub;
    if (!hub_open_ready(c) || !hub_system_ok(c, system_len))
        return;
    if (!id || !id[0]) {
        hub_new_session(c, system, system_len);
        return;
    }
    kvp_session *s = kvp_session_find(&h->sessions, id);
    /* (one named before a restart and not read yet has no tenant yet: its load checks) */
    if (s && !s->unread && !hub_same_tenant(c, s)) {
        hub_emit_error(c, KVPD_E_UNKNOWN_SESSION, "no such session (expired or never existed)");
        return;
    }
    if (s && s->client && s->client != c && kvp_session_busy(s)) {
        /* The connection whose job runs keeps the session and gets its answer. */
        hub_emit_error(c, KVPD_E_BUSY, s->state == KVP_SESSION_LOAD
                   ? "the session is being loaded from disk for another connection; try again"
                   : "the session is in use by another connection (a turn is running); "
                     "try again after it ends");
        return;
    }
    if (s && s->state == KVP_SESSION_LOAD) {   /* its loader left: the answer comes here */
        if (s->fork_read) {   /* read for a fork (hub_fork.c): its answer goes there */
            hub_emit_error(c, KVPD_E_BUSY, "the session is being loaded from disk for a "
                       "fork; try again");
            return;
        }
        if (system) {
            hub_emit_error(c, KVPD_E_BUSY, "the session is being loaded from disk; send hello "
                       "again once it is in (its system text is not known yet)");
            return;
        }
        hub_attach(c, s);
        return;
    }
    if ((s && s->state == KVP_SESSION_PARKED) || (!s && h->env.store) ||
        (s && !kvp_session_busy(s) && kvp_store_has_leases(h->env.store))) {
        hub_open_from_disk(c, s, id, system, system_len);
        return;
    }
    if (!s) {
        hub_emit_error(c, KVPD_E_UNKNOWN_SESSION, "no such session (expired or never existed)");
        return;
    }
    if (!hub_system_matches(c, s, system, system_len))
        return;
    s->last_active = kvp_now();
    hub_attach(c, s);
    hub_emit_session(c, 1);
}

/* The vocabulary's trie a constrained turn's matcher is bound to, made for the first
 * such turn (once for the daemon: a pass over the vocabulary). 0, or the error to
 * answer: -ENOMEM (internal) or -EINVAL (this model's replies cannot be constrained; a
 * bad_request), the reason in err. The matcher itself is made and bound at the turn's
 * start on its worker (kvp_session_start_grammar): its cost grows with the grammar. */
static int grammar_trie(kvp_hub *h, char *err, size_t errlen)
{
    if (!h->trie) {
        kvp_vocab_trie *tr = calloc(1, sizeof *tr);
        if (!tr || kvp_session_trie_build(tr, &h->env) < 0) {
            free(tr);
            snprintf(err, errlen, "out of memory building the vocabulary's byte trie for "
                     "constrained decoding (%d tokens)", h->env.model->cfg.vocab_size);
            return -ENOMEM;
        }
        h->trie = tr;
        h->env.trie = tr;
    }
    return kvp_session_grammar_usable(h->trie, err, errlen);
}

/* Arms and queues a turn on the client's session (made first when it has none). */
int kvp_hub_reply_cap(const kvp_hub *h)
{
    return h->cfg->max_tokens > 0 ? h->cfg->max_tokens : h->env.model->cfg.seq_len;
}

void hub_start_turn(kvp_hub_client *c, const char *text, size_t len, const kvp_turn_opts *o)
{
    kvp_hub *h = c->hub;
    double since = c->turn_since;
    c->turn_since = 0;
    if (h->draining) {
        hub_emit_error(c, KVPD_E_OVERLOADED, "the daemon is shutting down");
        return;
    }
    const char *field;
    if (kvp_sample_opts_check(&o->sampling, h->env.model->cfg.vocab_size, &field) < 0) {
        char err[160];
        snprintf(err, sizeof err, "%s is out of range%s", field,
                 strcmp(field, "logit_bias") ? ""
                 : ": token ids below the vocabulary size, biases in [-100, 100]");
        hub_emit_error(c, KVPD_E_BAD_REQUEST, err);
        return;
    }
    if (o->logprobs && (o->top_logprobs < 0 || o->top_logprobs > KVP_LOGPROBS_MAX_TOP)) {
        char err[96];
        snprintf(err, sizeof err, "top_logprobs is out of range: 0 to %d", KVP_LOGPROBS_MAX_TOP);
        hub_emit_error(c, KVPD_E_BAD_REQUEST, err);
        return;
    }
    if (!hub_fork_idle(c) || (!c->session && hub_new_session(c, NULL, 0) < 0))
        return;
    kvp_session *s = c->session;
    if (kvp_session_busy(s)) {
        hub_emit_error(c, KVPD_E_BUSY, s->state == KVP_SESSION_LOAD
                   ? "the session is being loaded from disk; wait for its session frame"
                   : "a turn is already running; wait for done or cancel it");
        return;
    }
    char err[256];
    size_t reserve;
    int cap = kvp_hub_reply_cap(h);
    int max_tokens = o->max_tokens > 0 && o->max_tokens < cap ? o->max_tokens : cap;
    /* the logprob buffers are made when the turn is armed and live while it runs */
    size_t lp_bytes = kvp_session_logprobs_bytes(max_tokens, h->env.model->cfg.vocab_size,
                                                 o->logprobs ? o->top_logprobs : -1);
    if (kvp_hub_admit_tenant(h, s, c->tenant, 1, lp_bytes, err, sizeof err) < 0 ||
        kvp_hub_admit(h, s, 1, lp_bytes, &reserve, err, sizeof err) < 0) {
        hub_overloaded(c, err);
        return;
    }
    /* Parked: it comes back transparently, its snapshot read by the turn's worker. */
    if (s->state == KVP_SESSION_PARKED && hub_unpark(h, s) < 0) {
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    double now = kvp_now();
    if (kvp_session_begin_turn(s, text, len, max_tokens,
                               o->has_temperature ? o->temperature : h->cfg->temperature,
                               h->cfg->budget, since > 0 && since < now ? since : now) < 0) {
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    kvp_turn_spec *sp = &s->rq.spec;   /* the turn's request, the loop's alone */
    int rc = kvp_session_turn_stops(s, o->stop, o->stop_len, o->n_stop);
    if (rc < 0) {
        char err[96];
        snprintf(err, sizeof err, "at most %d stop strings of 1 to %d bytes", KVP_HUB_MAX_STOPS,
                 KVP_HUB_STOP_MAX);
        hub_emit_error(c, rc == -EINVAL ? KVPD_E_BAD_REQUEST : KVPD_E_INTERNAL,
                   rc == -EINVAL ? err : "out of memory");
        return;
    }
    if (kvp_session_turn_sampling(s, &o->sampling) < 0 || kvp_session_turn_tools(s, o) < 0) {
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    if (kvp_session_turn_logprobs(s, h->env.model->cfg.vocab_size,
                                  o->logprobs ? o->top_logprobs : -1) < 0) {
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    if (o->grammar) {
        char gerr[256];
        int grc = grammar_trie(h, gerr, sizeof gerr);
        if (grc < 0) {
            hub_emit_error(c, grc == -EINVAL ? KVPD_E_BAD_REQUEST : KVPD_E_INTERNAL, gerr);
            return;
        }
        sp->gsrc = kvp_grammar_ref(o->grammar);
        sp->gasked = o->max_tokens > 0 && o->max_tokens <= cap;
    }
    if (o->has_top_p)
        sp->top_p = o->top_p;
    sp->has_seed = o->has_seed;
    sp->seed = o->seed;
    sp->max_history = h->cfg->max_history_tokens;
    sp->max_prompt = h->cfg->max_prompt_tokens > 0 ? h->cfg->max_prompt_tokens
                     : h->env.model->cfg.seq_len + h->cfg->budget;
    if (kvp_background_sample(h->bg, h->cfg->canary_rate))
        sp->canary = kvp_canary_rec_new(s->pconf->name, h->cfg->budget, h->env.model->cfg.dim);
    s->last_active = now;
    s->owner = c;
    s->reserve_lp = lp_bytes;
    s->fork_unrun = 0;   /* a fork's own turn: it holds a conversation of its own now */
    hub_submit(h, s, KVP_SESSION_TURN, reserve);
}

void kvp_hub_message(kvp_hub_client *c, const char *text, size_t len, int max_tokens,
                     int has_temperature, float temperature)
{
    kvp_turn_opts o = {.max_tokens = max_tokens, .has_temperature = has_temperature,
                       .temperature = temperature};
    hub_start_turn(c, text, len, &o);
}

void kvp_hub_message_opts(kvp_hub_client *c, const char *text, size_t len,
                          const kvp_turn_opts *o)
{
    if (o->ephemeral) {   /* a websocket session is kept by design */
        hub_emit_error(c, KVPD_E_BAD_REQUEST, "an ephemeral turn is for a stateless request "
                       "(kvp_hub_chat), not a session's next message");
        return;
    }
    hub_start_turn(c, text, len, o);
}

void kvp_hub_cancel(kvp_hub_client *c)
{
    /* Answered by the turn's done (stop "cancel"); a no-op when idle. */
    kvp_session *s = c->session;
    if (s && s->state == KVP_SESSION_TURN && s->owner == c)
        atomic_store(&s->rq.cancel, 1);
}

void kvp_hub_close(kvp_hub_client *c)
{
    kvp_session *s = c->session;
    if (s && s->owner == c) {
        /* Nobody is listening: stop generating; the partial reply stays. */
        s->owner = NULL;
        atomic_store(&s->rq.cancel, 1);
    }
    hub_leave(c);
    hub_wait_leave(c);
    hub_fork_forget(c);
    hub_resp_leave(c);
    forget_system_check(c);
    hub_pending_free(c->pending);
    hub_choices_free(c);
    hub_choices_leave(c);
    free(c);
}
