/* The session hub: the front ends' requests (open, message, cancel, close), the workers'
 * events back to the clients, and each session's lifecycle between them. */
#include "sessions/hub.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/log.h"
#include "model/grammar.h"
#include "policy/kvp_agent.h"
#include "sessions/hub_impl.h"
#include "sessions/background.h"
#include "sessions/residency.h"
#include "sessions/persist.h"
#include "sessions/prefix.h"
#include "sessions/reuse.h"
#include "sessions/rewind.h"
#include "store/store.h"

/* ---- events to clients ---- */

static void emit_error_retry(kvp_hub_client *c, const char *code, const char *msg, int retry)
{
    if (!c)
        return;
    kvp_hub_event ev = {.type = KVP_HUB_ERROR, .code = code, .text = msg, .len = strlen(msg),
                        .retry_after_ms = retry};
    c->sink(c->ctx, &ev);
}

static void emit_error(kvp_hub_client *c, const char *code, const char *msg)
{
    emit_error_retry(c, code, msg, 0);
}

/* overloaded, with a hint of when to try again. */
static void overloaded(kvp_hub_client *c, const char *msg)
{
    kvp_hub *h = c->hub;
    int retry = h->refused_retry_ms ? h->refused_retry_ms : kvp_hub_retry_hint_ms(h);
    h->refused_retry_ms = 0;
    emit_error_retry(c, KVPD_E_OVERLOADED, msg, retry);
}

static void emit_session(kvp_hub_client *c, int resumed)
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

/* Nothing to keep: no turn ever ran and nothing is on disk. */
static int never_used(const kvp_session *s)
{
    return !kvp_session_busy(s) && s->n_msgs == 0 && !s->has_snapshot && s->turns_done == 0;
}

/* A session leaves memory; it stays in the transcript index while it is on disk. */
static void drop(kvp_hub *h, kvp_session *s)
{
    if (!h->env.store || !s->has_snapshot || s->lost)
        kvp_transcripts_remove(&h->transcripts, s->id);
    kvp_store_lease_drop(h->env.store, s->id);
    kvp_prefix_remove(h->prefix, s);
    kvp_session_remove(&h->sessions, s);
}

void kvp_hub_drop(kvp_hub *h, kvp_session *s)
{
    if (s->client)
        s->client->session = NULL;
    drop(h, s);
}

static void remove_session(kvp_hub *h, kvp_session *s)
{
    kvp_hub_drop(h, s);
}

/* The client lets go of its session; one that was never used ends here (and no longer
 * counts against its creator's sessions). */
static void leave(kvp_hub_client *c)
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
    if (never_used(s)) {
        if (s->creator == c->serial)
            c->created--;
        drop(c->hub, s);
    }
}

/* An idle session follows the newest client that names it; the previous one is told. */
static void attach(kvp_hub_client *c, kvp_session *s)
{
    if (c->session == s)
        return;
    leave(c);
    kvp_hub_client *old = s->client;
    if (old && old != c) {
        old->session = NULL;
        emit_error(old, KVPD_E_UNKNOWN_SESSION,
                   "another connection resumed this session; send hello to take it back");
    }
    s->client = c;
    c->session = s;
}

static void submit(kvp_hub *h, kvp_session *s, enum kvp_session_state job, size_t reserve)
{
    s->reserve = reserve;
    s->state = job;
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
static int same_tenant(const kvp_hub_client *c, const kvp_session *s)
{
    return !strcmp(c->tenant, s->tenant);
}

/* The system text a hello or a request gives may be stored. */
static int system_ok(kvp_hub_client *c, size_t len)
{
    if (len <= KVP_HUB_SYSTEM_MAX)
        return 1;
    char err[96];
    snprintf(err, sizeof err, "the system text is limited to %d bytes", KVP_HUB_SYSTEM_MAX);
    emit_error(c, KVPD_E_TOO_LARGE, err);
    return 0;
}

static int same_system(const kvp_session *s, const char *system, size_t len)
{
    return s->system_len == len && (!len || !memcmp(s->system, system, len));
}

/* A hello's system text against the session it resumes: never re-templated. */
static int system_matches(kvp_hub_client *c, const kvp_session *s, const char *system,
                          size_t len)
{
    if (!system || same_system(s, system, len))
        return 1;
    emit_error(c, KVPD_E_BAD_REQUEST, s->system_len
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

static int new_session(kvp_hub_client *c, const char *system, size_t system_len)
{
    kvp_hub *h = c->hub;
    char err[256];
    if (c->session && never_used(c->session))
        leave(c);   /* its slot is free for the new one */
    if (c->created >= h->cfg->max_sessions_per_client) {
        snprintf(err, sizeof err, "a connection may start at most %d conversations; open a "
                 "new connection", h->cfg->max_sessions_per_client);
        emit_error(c, KVPD_E_OVERLOADED, err);
        return -EBUSY;
    }
    size_t reserve;
    int rc = kvp_hub_admit_tenant(h, NULL, c->tenant, 0, err, sizeof err);
    if (rc == 0)
        rc = kvp_hub_admit(h, NULL, 0, &reserve, err, sizeof err);
    if (rc < 0) {
        overloaded(c, err);
        return rc;
    }
    kvp_session *s;
    rc = kvp_session_create(&h->sessions, &h->env, h->pconf, NULL, kvp_now(), &s, err,
                            sizeof err);
    if (rc < 0) {
        kvpd_log("error", "session: %s", err);
        emit_error(c, KVPD_E_INTERNAL, err);
        return rc;
    }
    if (kvp_session_set_system(s, system, system_len) < 0) {
        kvp_session_remove(&h->sessions, s);
        emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return -ENOMEM;
    }
    c->created++;
    s->creator = c->serial;
    snprintf(s->tenant, sizeof s->tenant, "%s", c->tenant);
    h->m->sessions_created++;
    attach(c, s);
    emit_session(c, 0);
    return 0;
}

/* A parked session comes back under the policy in force (rebuilt from its transcript if
 * its snapshot was made under another). */
static int unpark(kvp_hub *h, kvp_session *s)
{
    if (s->pconf != h->pconf) {
        kvp_policy_conf_unref(s->pconf);
        s->pconf = kvp_policy_conf_ref(h->pconf);
    }
    return kvp_session_unpark(&h->sessions, s, &h->env);
}

/* open naming a session whose state is on disk: parked here, or from before a restart
 * (s NULL), or, with a shared store, in memory here but maybe served by another node
 * since (the job takes the lease and reads the snapshot if it moved on). The snapshot
 * is read on a worker; the session event follows the job. */
static void open_from_disk(kvp_hub_client *c, kvp_session *s, const char *id,
                           const char *system, size_t system_len)
{
    kvp_hub *h = c->hub;
    char err[256];
    size_t reserve;
    if (kvp_hub_admit_tenant(h, s, c->tenant, 1, err, sizeof err) < 0 ||
        kvp_hub_admit(h, s, 1, &reserve, err, sizeof err) < 0) {
        overloaded(c, err);
        return;
    }
    if (!s) {
        if (kvp_session_create(&h->sessions, &h->env, h->pconf, id, kvp_now(), &s, err,
                               sizeof err) < 0) {
            kvpd_log("error", "session: %s", err);
            emit_error(c, KVPD_E_INTERNAL, err);
            return;
        }
        s->need_restore = 1;   /* has_snapshot stays 0 until the load finds one */
    } else if (s->state == KVP_SESSION_PARKED && unpark(h, s) < 0) {
        emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    int shared = kvp_store_has_leases(h->env.store);
    if (!s->need_restore && !shared) {   /* parked with nothing to keep: nothing to read */
        if (system_matches(c, s, system, system_len)) {
            attach(c, s);
            s->last_active = kvp_now();
            emit_session(c, 1);
        }
        return;
    }
    attach(c, s);
    s->last_active = kvp_now();
    forget_system_check(c);
    if (system) {   /* the session's own is known once its snapshot is read */
        c->want_system = system_len ? malloc(system_len) : NULL;
        if (system_len && !c->want_system) {
            emit_error(c, KVPD_E_INTERNAL, "out of memory");
            leave(c);
            return;
        }
        if (system_len)
            memcpy(c->want_system, system, system_len);
        c->want_system_len = system_len;
        c->check_system = 1;
    }
    submit(h, s, KVP_SESSION_LOAD, reserve);
}

void kvp_hub_open(kvp_hub_client *c, const char *id, const char *system, size_t system_len)
{
    kvp_hub *h = c->hub;
    kvp_session *cur = c->session;
    if (h->draining) {
        emit_error(c, KVPD_E_OVERLOADED, "the daemon is shutting down");
        return;
    }
    if (!system_ok(c, system_len))
        return;
    if (cur && kvp_session_busy(cur)) {
        emit_error(c, KVPD_E_BUSY, cur->state == KVP_SESSION_LOAD
                   ? "this connection's session is being loaded from disk; its session frame follows"
                   : "a turn is running on this connection's session");
        return;
    }
    if (!id || !id[0]) {
        new_session(c, system, system_len);
        return;
    }
    kvp_session *s = kvp_session_find(&h->sessions, id);
    /* (one named before a restart and not read yet has no tenant yet: its load checks) */
    if (s && !(s->need_restore && !s->has_snapshot) && !same_tenant(c, s)) {
        emit_error(c, KVPD_E_UNKNOWN_SESSION, "no such session (expired or never existed)");
        return;
    }
    if (s && s->client && s->client != c && kvp_session_busy(s)) {
        /* The connection whose job runs keeps the session and gets its answer. */
        emit_error(c, KVPD_E_BUSY, s->state == KVP_SESSION_LOAD
                   ? "the session is being loaded from disk for another connection; try again"
                   : "the session is in use by another connection (a turn is running); "
                     "try again after it ends");
        return;
    }
    if (s && s->state == KVP_SESSION_LOAD) {   /* its loader left: the answer comes here */
        if (system) {
            emit_error(c, KVPD_E_BUSY, "the session is being loaded from disk; send hello "
                       "again once it is in (its system text is not known yet)");
            return;
        }
        attach(c, s);
        return;
    }
    if ((s && s->state == KVP_SESSION_PARKED) || (!s && h->env.store) ||
        (s && !kvp_session_busy(s) && kvp_store_has_leases(h->env.store))) {
        open_from_disk(c, s, id, system, system_len);
        return;
    }
    if (!s) {
        emit_error(c, KVPD_E_UNKNOWN_SESSION, "no such session (expired or never existed)");
        return;
    }
    if (!system_matches(c, s, system, system_len))
        return;
    s->last_active = kvp_now();
    attach(c, s);
    emit_session(c, 1);
}

/* The turn's reply follows g; the vocabulary's trie is made for the first such turn.
 * 0, or the error to answer: -ENOMEM (internal) or -EINVAL (the request cannot be
 * constrained here, a bad_request), the reason in err. */
static int start_grammar(kvp_hub *h, kvp_session *s, kvp_grammar *g, char *err, size_t errlen)
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
    int rc = kvp_session_grammar_usable(h->trie, err, errlen);
    if (rc < 0)
        return rc;
    rc = kvp_session_turn_grammar(s, g);
    if (rc == -EINVAL)
        snprintf(err, errlen, "the grammar has no document that can be started");
    else if (rc < 0)
        snprintf(err, errlen, "out of memory starting the grammar's matcher (%d states)",
                 kvp_grammar_states(g));
    return rc;
}

/* Arms and queues a turn on the client's session (made first when it has none). */
static void start_turn(kvp_hub_client *c, const char *text, size_t len, const kvp_turn_opts *o)
{
    kvp_hub *h = c->hub;
    if (h->draining) {
        emit_error(c, KVPD_E_OVERLOADED, "the daemon is shutting down");
        return;
    }
    const char *field;
    if (kvp_sample_opts_check(&o->sampling, h->env.model->cfg.vocab_size, &field) < 0) {
        char err[160];
        snprintf(err, sizeof err, "%s is out of range%s", field,
                 strcmp(field, "logit_bias") ? ""
                 : ": token ids below the vocabulary size, biases in [-100, 100]");
        emit_error(c, KVPD_E_BAD_REQUEST, err);
        return;
    }
    if (o->logprobs && (o->top_logprobs < 0 || o->top_logprobs > KVP_LOGPROBS_MAX_TOP)) {
        char err[96];
        snprintf(err, sizeof err, "top_logprobs is out of range: 0 to %d", KVP_LOGPROBS_MAX_TOP);
        emit_error(c, KVPD_E_BAD_REQUEST, err);
        return;
    }
    if (!c->session && new_session(c, NULL, 0) < 0)
        return;
    kvp_session *s = c->session;
    if (kvp_session_busy(s)) {
        emit_error(c, KVPD_E_BUSY, s->state == KVP_SESSION_LOAD
                   ? "the session is being loaded from disk; wait for its session frame"
                   : "a turn is already running; wait for done or cancel it");
        return;
    }
    char err[256];
    size_t reserve;
    if (kvp_hub_admit_tenant(h, s, c->tenant, 1, err, sizeof err) < 0 ||
        kvp_hub_admit(h, s, 1, &reserve, err, sizeof err) < 0) {
        overloaded(c, err);
        return;
    }
    /* Parked: it comes back transparently, its snapshot read by the turn's worker. */
    if (s->state == KVP_SESSION_PARKED && unpark(h, s) < 0) {
        emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    double now = kvp_now();
    if (kvp_session_begin_turn(s, text, len, o->max_tokens ? o->max_tokens : h->cfg->max_tokens,
                               o->has_temperature ? o->temperature : h->cfg->temperature,
                               h->cfg->budget, now) < 0) {
        emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    int rc = kvp_session_turn_stops(s, o->stop, o->stop_len, o->n_stop);
    if (rc < 0) {
        char err[96];
        snprintf(err, sizeof err, "at most %d stop strings of 1 to %d bytes", KVP_HUB_MAX_STOPS,
                 KVP_HUB_STOP_MAX);
        emit_error(c, rc == -EINVAL ? KVPD_E_BAD_REQUEST : KVPD_E_INTERNAL,
                   rc == -EINVAL ? err : "out of memory");
        return;
    }
    if (kvp_session_turn_sampling(s, &o->sampling) < 0 || kvp_session_turn_tools(s, o) < 0) {
        emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    if (kvp_session_turn_logprobs(s, h->env.model->cfg.vocab_size,
                                  o->logprobs ? o->top_logprobs : -1) < 0) {
        emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    if (o->grammar) {
        char gerr[200];
        int grc = start_grammar(h, s, o->grammar, gerr, sizeof gerr);
        if (grc < 0) {
            emit_error(c, grc == -EINVAL ? KVPD_E_BAD_REQUEST : KVPD_E_INTERNAL, gerr);
            return;
        }
    }
    if (o->has_top_p)
        s->turn.top_p = o->top_p;
    s->turn.has_seed = o->has_seed;
    s->turn.seed = o->seed;
    s->turn.max_history = h->cfg->max_history_tokens;
    s->turn.max_prompt = h->cfg->max_prompt_tokens > 0 ? h->cfg->max_prompt_tokens
                         : h->env.model->cfg.seq_len + h->cfg->budget;
    if (kvp_background_sample(h->bg, h->cfg->canary_rate))
        s->turn.canary = kvp_canary_rec_new(s->pconf->name, h->cfg->budget);
    s->last_active = now;
    s->owner = c;
    submit(h, s, KVP_SESSION_TURN, reserve);
}

void kvp_hub_message(kvp_hub_client *c, const char *text, size_t len, int max_tokens,
                     int has_temperature, float temperature)
{
    kvp_turn_opts o = {.max_tokens = max_tokens, .has_temperature = has_temperature,
                       .temperature = temperature};
    start_turn(c, text, len, &o);
}

void kvp_hub_message_opts(kvp_hub_client *c, const char *text, size_t len,
                          const kvp_turn_opts *o)
{
    start_turn(c, text, len, o);
}

/* s holds exactly msgs[0..n) and is free to take a turn. A parked session's texts are on
 * disk: its hash and count stand for them. Messages dropped from a bounded history
 * (max_history_tokens) are known by the hash alone: such a session is continued only when
 * the request names it (`named`: its id is the key to the conversation); an anonymous
 * request whose history reaches into them starts a new session instead. */
static int continues(const kvp_hub_client *c, const kvp_session *s, int named, uint64_t hash,
                     const char *system, size_t system_len, const kvp_message *msgs, int n)
{
    if (kvp_session_busy(s) || !same_tenant(c, s) || s->transcript_hash != hash ||
        s->transcript_msgs != n ||
        (s->transcript_dropped && !named) || !same_system(s, system, system_len))
        return 0;
    if (s->state == KVP_SESSION_PARKED)
        return 1;
    const kvp_message *kept = msgs + s->hist_msgs;
    for (int i = 0; i < s->n_msgs; i++)
        if (s->msgs[i].user != kept[i].user || s->msgs[i].len != kept[i].len ||
            memcmp(s->msgs[i].text, kept[i].text, kept[i].len))
            return 0;
    return 1;
}

/* A request waiting for the snapshot of the session it extends (kvp_hub_chat). */
typedef struct kvp_hub_pending {
    uint64_t hash;                   /* of system and msgs[0..n-1) */
    char *system;
    size_t system_len;
    kvp_message *msgs;
    int n;
    int named;                       /* the session it waits for is the one it named */
    kvp_turn_opts o;                 /* its stop strings point into stops, its biases
                                      * into bias */
    char *stops[KVP_HUB_MAX_STOPS];
    kvp_logit_bias *bias;
    char *tools, *prefix, *end_after;   /* the copies o's tool options point to */
} kvp_hub_pending;

static void pending_free(kvp_hub_pending *p)
{
    if (!p)
        return;
    free(p->system);
    for (int i = 0; i < p->n; i++)
        free(p->msgs[i].text);
    free(p->msgs);
    for (int i = 0; i < KVP_HUB_MAX_STOPS; i++)
        free(p->stops[i]);
    free(p->bias);
    kvp_grammar_unref(p->o.grammar);
    free(p->tools);
    free(p->prefix);
    free(p->end_after);
    free(p);
}

static char *copy_bytes(const char *s, size_t n)
{
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, s, n);
        c[n] = '\0';
    }
    return c;
}

static kvp_hub_pending *pending_new(uint64_t hash, const char *system, size_t system_len,
                                   const kvp_message *msgs, int n, const kvp_turn_opts *o)
{
    kvp_hub_pending *p = calloc(1, sizeof *p);
    if (!p || !(p->msgs = calloc((size_t)n, sizeof *p->msgs)))
        goto oom;
    p->hash = hash;
    p->o = *o;
    kvp_grammar_ref(p->o.grammar);
    if (system_len && !(p->system = copy_bytes(system, system_len)))
        goto oom;
    p->system_len = system_len;
    for (; p->n < n; p->n++) {
        p->msgs[p->n] = msgs[p->n];
        if (!(p->msgs[p->n].text = copy_bytes(msgs[p->n].text, msgs[p->n].len)))
            goto oom;
    }
    for (int i = 0; i < o->n_stop && i < KVP_HUB_MAX_STOPS; i++) {
        if (!(p->stops[i] = copy_bytes(o->stop[i], o->stop_len[i])))
            goto oom;
        p->o.stop[i] = p->stops[i];
    }
    if (o->sampling.n_bias > 0) {
        if (!(p->bias = malloc((size_t)o->sampling.n_bias * sizeof *p->bias)))
            goto oom;
        memcpy(p->bias, o->sampling.bias, (size_t)o->sampling.n_bias * sizeof *p->bias);
        p->o.sampling.bias = p->bias;
    }
    if ((o->tools_len && !(p->o.tools = p->tools = copy_bytes(o->tools, o->tools_len))) ||
        (o->reply_prefix_len &&
         !(p->o.reply_prefix = p->prefix = copy_bytes(o->reply_prefix, o->reply_prefix_len))) ||
        (o->end_after_len &&
         !(p->o.end_after = p->end_after = copy_bytes(o->end_after, o->end_after_len))))
        goto oom;
    return p;
oom:
    pending_free(p);
    return NULL;
}

/* The request goes on: on s (it continues s), or on a new session seeded with its
 * history. */
static void chat_go(kvp_hub_client *c, kvp_session *s, const char *system, size_t system_len,
                    const kvp_message *msgs, int n, const kvp_turn_opts *o)
{
    if (s) {
        attach(c, s);
        emit_session(c, 1);
    } else {
        if (new_session(c, system, system_len) < 0)
            return;
        if (kvp_session_seed(c->session, msgs, n - 1) < 0) {
            emit_error(c, KVPD_E_INTERNAL, "out of memory");
            return;
        }
    }
    kvp_turn_opts with_role = *o;
    with_role.role = msgs[n - 1].user;
    start_turn(c, msgs[n - 1].text, msgs[n - 1].len, &with_role);
}

typedef struct fork_filter {
    kvp_hub *h;
    const kvp_hub_client *c;
} fork_filter;

static int fork_filter_ok(void *ctx, const void *owner)
{
    const fork_filter *f = ctx;
    return kvp_reuse_fork_source_ok(f->h, f->c, owner);
}

/* The held conversation the new session s best forks for the request msgs[0..n): the
 * one of the prefix index with the longest token prefix of the request's rendering (at least a block, checked token by token), else the message-level choice
 * (kvp_reuse_fork_find: shorter conversations, a shared system text). *other: it shares
 * messages with the request, not only a prefix of its rendering. Renders the request on
 * the loop (in s) and leaves s with no transcript (the caller seeds or forks it). */
static kvp_session *fork_source(kvp_hub *h, kvp_hub_client *c, kvp_session *s,
                                const char *system, size_t system_len,
                                const kvp_message *msgs, int n, int *other)
{
    kvp_session *src = NULL;
    int shared = 0;
    /* the rendering of the whole request, its last message as its turn renders it */
    kvp_session_clear_transcript(s);
    if (h->prefix && kvp_session_seed(s, msgs, n) >= 0 &&
        kvp_session_retokenize(s, &h->env) >= 0) {
        fork_filter f = {h, c};
        int len;
        kvp_session *t = (kvp_session *)kvp_prefix_lookup(h->prefix, c->tenant, s->tokens,
                                                          s->n_tokens, fork_filter_ok, &f, &len);
        if (t && kvp_token_lcp(t->tokens, t->n_cached, s->tokens, s->n_tokens) >= KVP_PREFIX_BLOCK) {
            src = t;
            shared = kvp_reuse_shared_msgs(t, system, system_len, msgs, n);
        }
    }
    kvp_session_clear_transcript(s);
    s->n_cached = 0;
    s->reply_open = 0;
    s->jinja_rendered = 0;
    if (!src)
        src = kvp_reuse_fork_find(h, c, system, system_len, msgs, n, &shared);
    *other = shared > 0;
    return src;
}

/* A new session s, before its first turn (its history msgs[0..n-1) seeded or not, the
 * turn's message msgs[n-1]): forked from the held conversation that shares the most with
 * the request when there is one (it starts with a copy of that one's cache and its turn
 * prefills only what follows the common prefix; the source is not changed). Leaves s
 * seeded with the history either way (as a rewind to be applied when forked). */
static void try_fork(kvp_hub_client *c, kvp_session *s, const kvp_message *msgs, int n)
{
    kvp_hub *h = c->hub;
    if (!h->env.reuse_cache)
        return;
    int forked = 0, other = 0;
    size_t bytes = 0;
    kvp_session *src = fork_source(h, c, s, s->system, s->system_len, msgs, n, &other);
    if (src && kvp_session_fork(s, src, &h->env, &bytes) == 0) {
        if (kvp_session_rewind(s, msgs, n - 1) == 0)
            forked = 1;
        else   /* no room for the history: the copy goes, the history is prefilled */
            kvp_session_forget(s);
    }
    if (forked) {
        s->reuse_from = other ? KVP_REUSE_OTHER : KVP_REUSE_SHARED;
        s->bytes = bytes;   /* its own copy counts against the memory cap */
        h->m->prefix_hits++;
        h->m->prefix_bytes_copied += bytes;
    } else {
        h->m->prefix_misses++;
        if (!s->n_msgs && kvp_session_seed(s, msgs, n - 1) < 0)
            kvp_session_forget(s);   /* out of memory: the turn fails on its own */
    }
}

/* The request starts a new session, forked when it can be (try_fork), else seeded with
 * the request's history, prefilled whole. */
static void new_chat(kvp_hub_client *c, const char *system, size_t system_len,
                     const kvp_message *msgs, int n, const kvp_turn_opts *o)
{
    if (new_session(c, system, system_len) < 0)
        return;
    kvp_session *s = c->session;
    if (kvp_session_seed(s, msgs, n - 1) < 0) {
        emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    try_fork(c, s, msgs, n);
    if (n > 1 && !s->n_msgs && !s->rewind_set) {
        emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    kvp_turn_opts with_role = *o;
    with_role.role = msgs[n - 1].user;
    start_turn(c, msgs[n - 1].text, msgs[n - 1].len, &with_role);
    if (s->rewind_set && s->state != KVP_SESSION_TURN)
        kvp_session_rewind_clear(s);
}

void kvp_hub_chat(kvp_hub_client *c, const char *id, const char *system, size_t system_len,
                  const kvp_message *msgs, int n, const kvp_turn_opts *o)
{
    kvp_hub *h = c->hub;
    if (h->draining) {
        emit_error(c, KVPD_E_OVERLOADED, "the daemon is shutting down");
        return;
    }
    if (n < 1) {
        emit_error(c, KVPD_E_BAD_REQUEST, "a conversation needs a message");
        return;
    }
    if (!system_ok(c, system_len))
        return;
    leave(c);
    int prefix = n - 1;
    uint64_t hash = kvp_session_transcript_hash(system, system_len, msgs, prefix) ^
                    kvp_tenant_mix(c->tenant);
    kvp_session *s = NULL;
    const char *disk = NULL;   /* a session it extends that is only on disk */
    kvp_session *stale = NULL; /* ... or in memory here, but maybe moved on elsewhere */
    int named = 0;
    if (prefix > 0 && id && id[0]) {   /* the named session first */
        kvp_session *t = kvp_session_find(&h->sessions, id);
        const kvp_transcript_entry *e = t ? NULL : kvp_transcripts_get(&h->transcripts, id);
        if (t && continues(c, t, 1, hash, system, system_len, msgs, prefix))
            s = t;
        else if (e && e->hash == hash && e->n_msgs == prefix && h->env.store)
            disk = e->id;
        else if (h->env.store && !h->env.state_dir[0] && kvp_snapshot_id_valid(id) &&
                 (!t || !kvp_session_busy(t))) {
            /* A shared store (Redis) keeps no index here, and another node may have served
             * turns since this copy: the load takes the lease, reads the snapshot when it
             * moved on, and the answer compares. */
            disk = id;
            stale = t;
        }
        named = disk != NULL;
    }
    /* Then every session with this transcript hash: one in memory if any is free. */
    for (const kvp_transcript_entry *e = prefix > 0 && !s && !disk
             ? kvp_transcripts_next(&h->transcripts, hash, prefix, NULL) : NULL;
         e && !s; e = kvp_transcripts_next(&h->transcripts, hash, prefix, e)) {
        kvp_session *t = kvp_session_find(&h->sessions, e->id);
        if (t && continues(c, t, 0, hash, system, system_len, msgs, prefix))
            s = t;
        else if (!t && !disk && h->env.store)
            disk = e->id;
    }
    /* A parked session is read before its turn, as one only on disk: when its snapshot
     * is gone (snapshot_ttl, max_state_bytes_per_tenant) the request starts a new one. */
    if (s && s->state == KVP_SESSION_PARKED && s->has_snapshot) {
        named = id && !strcmp(id, s->id);
        stale = s;
        disk = s->id;
        s = NULL;
    }
    if (!s && !disk && (s = kvp_reuse_rewind_find(h, c, id, system, system_len, msgs, n))) {
        /* continued from an earlier point: its history replaces the session's */
        if (kvp_session_rewind(s, msgs, n - 1) < 0) {
            emit_error(c, KVPD_E_INTERNAL, "out of memory");
            return;
        }
        chat_go(c, s, system, system_len, msgs, n, o);
        if (s->state != KVP_SESSION_TURN)
            kvp_session_rewind_clear(s);   /* refused: the session stays as it was */
        else
            h->m->prefix_rewinds++;
        return;
    }
    if (!s && !disk) {
        new_chat(c, system, system_len, msgs, n, o);
        return;
    }
    if (s) {
        chat_go(c, s, system, system_len, msgs, n, o);
        return;
    }
    /* Read it first (a load job); the request waits on the client (chat_loaded). */
    kvp_hub_pending *p = pending_new(hash, system, system_len, msgs, n, o);
    if (!p) {
        emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    p->named = named;
    char sid[KVP_SNAPSHOT_ID_MAX + 1];
    snprintf(sid, sizeof sid, "%s", disk);
    open_from_disk(c, stale, sid, NULL, 0);
    if (c->session && c->session->state == KVP_SESSION_LOAD)
        c->pending = p;
    else
        pending_free(p);   /* refused (overloaded): answered */
}

void kvp_hub_cancel(kvp_hub_client *c)
{
    /* Answered by the turn's done (stop "cancel"); a no-op when idle. */
    kvp_session *s = c->session;
    if (s && s->state == KVP_SESSION_TURN && s->owner == c)
        atomic_store(&s->turn.cancel, 1);
}

void kvp_hub_close(kvp_hub_client *c)
{
    kvp_session *s = c->session;
    if (s && s->owner == c) {
        /* Nobody is listening: stop generating; the partial reply stays. */
        s->owner = NULL;
        atomic_store(&s->turn.cancel, 1);
    }
    leave(c);
    forget_system_check(c);
    pending_free(c->pending);
    free(c);
}

/* ---- worker events ---- */

/* A job's final event: the loop owns the whole session again and takes in what the
 * worker left (restored counters, the snapshot's fate, the cache's size). Returns the
 * client the job answers (the turn's owner, or the attached client for a load). */
static kvp_hub_client *job_ended(kvp_hub *h, kvp_session *s)
{
    kvpd_metrics *m = h->m;
    kvp_hub_client *to = s->state == KVP_SESSION_TURN ? s->owner : s->client;
    h->jobs--;
    s->state = KVP_SESSION_IDLE;
    /* its tokens into the prefix index while its cache holds them from the start (an
     * entry that cannot be made only costs a later fork) */
    if (s->policy && !s->hist_tokens && s->cache.n_seen == s->n_cached && s->n_cached > 0)
        (void)kvp_prefix_put(h->prefix, s, s->tenant, s->tokens, s->n_cached);
    else
        kvp_prefix_remove(h->prefix, s);
    s->owner = NULL;
    s->reserve = 0;
    s->last_active = kvp_now();
    /* The lease runs out lease_ms after this job, or goes now when nobody is attached. */
    if (s->client)
        kvp_store_lease_idle(h->env.store, s->id);
    else
        kvp_store_lease_drop(h->env.store, s->id);
    if (s->restored.pending) {
        s->restored.pending = 0;
        m->unparks++;
        if (s->restored.rebuilt) {
            m->rebuilds++;
            kvpd_log("info", "session %.8s: rebuilt from its transcript: %s", s->id,
                     s->restored.note);
        } else if (s->restored.note[0]) {   /* e.g. a damaged journal tail was ignored */
            kvpd_log("warning", "session %.8s: %s", s->id, s->restored.note);
        }
    }
    if (s->save_rc < 0) {
        m->snapshot_failures++;
        /* -ESTALE: not written because the store holds a newer version (or another node
         * the lease): the store is fine, no degraded health; the next job takes the
         * lease and reloads this copy */
        s->save_failed = s->save_rc != -ESTALE;
        kvpd_log("warning", "session %.8s: %s", s->id, s->save_err);
    } else if (s->save_rc > 0) {
        m->snapshots_written++;
        s->save_failed = 0;
        s->save_retries = 0;
        kvpd_hist_observe(&m->snapshot_write, s->save_ms / 1e3);
        kvpd_hist_observe(&m->snapshot_bytes, (double)s->save_bytes);
    }
    s->save_rc = 0;
    s->turns = s->turns_done;
    s->transcript_hash = kvp_session_index_hash(s);
    s->transcript_msgs = s->hist_msgs + s->n_msgs;
    s->transcript_dropped = s->hist_msgs;
    if (s->transcript_msgs > 0 && kvp_transcripts_put(&h->transcripts, s->id, s->transcript_hash,
                                                      s->transcript_msgs) < 0)
        kvpd_log("warning", "session %.8s: out of memory for the transcript index", s->id);
    s->evicted_rows = s->cache.evicted_rows;
    s->rows_max = kvp_cache_max_rows(&s->cache);
    s->bytes = kvp_cache_bytes(&s->cache);
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
    emit_error(to, KVPD_E_UNKNOWN_SESSION, code == -EBADMSG
               ? "the session's snapshot was damaged; it was moved aside"
               : "no such session (expired or never existed)");
    remove_session(h, s);
}

/* Another node holds the session's lease: this node's copy, if any, is not the one to
 * serve, so it leaves memory (the store keeps the session); the client is told to retry
 * (through the balancer, which sends it to the holder or back here once the lease ends). */
static void elsewhere(kvp_hub *h, kvp_session *s, kvp_hub_client *to, const char *why)
{
    kvpd_log("info", "session %.8s: %s", s->id, why);
    emit_error_retry(to, KVPD_E_ELSEWHERE, why, s->elsewhere_ms > 0 ? s->elsewhere_ms : 1);
    remove_session(h, s);
}

/* A restore that failed for a reason that may pass (I/O, memory): parked again (or let
 * go, when the session was never in memory). */
static void restore_failed(kvp_hub *h, kvp_session *s, kvp_hub_client *to, const char *why)
{
    kvpd_log("warning", "session %.8s: %s", s->id, why);
    emit_error(to, KVPD_E_INTERNAL, "the session could not be loaded; try again");
    if (!s->has_snapshot) {
        remove_session(h, s);
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
        pending_free(p);
        return;
    }
    if (ev->code < 0) {
        /* the session first (leave() would drop one that never ran a turn here) */
        if (ev->code == -EADDRINUSE)
            elsewhere(h, s, NULL, ev->text);
        else if (s->lost)
            lose(h, s, NULL, ev->code, ev->text);
        else
            restore_failed(h, s, NULL, ev->text);
        leave(c);   /* still attached when it was parked again */
    } else if (continues(c, s, p->named, p->hash, p->system, p->system_len, p->msgs, p->n - 1)) {
        kvpd_log("info", "session %.8s: loaded from its snapshot for a request that extends it",
                 s->id);
        use = s;
    } else {
        leave(c);   /* it stays in memory, idle, under its real transcript */
    }
    chat_go(c, use, p->system, p->system_len, p->msgs, p->n, &p->o);
    pending_free(p);
}

static void on_job(kvp_hub *h, kvp_session *s, const kvpd_event *ev)
{
    int was_load = s->state == KVP_SESSION_LOAD, read = s->restored.pending;
    kvp_hub_client *to = job_ended(h, s);
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
    } else if (was_load && ev->code < 0 && s->lost) {
        lose(h, s, to, ev->code, ev->text);
    } else if (was_load && ev->code < 0) {
        restore_failed(h, s, to, ev->text);
    } else if (was_load) {
        if (read)   /* (a shared store's session in memory and current is not read) */
            kvpd_log("info", "session %.8s: loaded from its snapshot (%d turns)", s->id,
                     s->turns);
        if (to && !same_tenant(to, s)) {   /* another tenant's: as if it did not exist */
            emit_error(to, KVPD_E_UNKNOWN_SESSION, "no such session (expired or never existed)");
            leave(to);
        } else if (check && !system_matches(to, s, want ? want : "", want_len))
            leave(to);
        else if (to)
            emit_session(to, 1);
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
    kvp_background_canary(h->bg, s->turn.canary);
    s->turn.canary = NULL;
    if (s->hist_tokens == 0 && kvp_learnlog_sampled(kvp_background_learnlog(h->bg), s->id))
        kvp_background_transcript(h->bg, s->id, s->tokens, s->n_tokens);
    kvp_background_drain(h->bg, h->m);
    kvpd_sched_kick(h->sched);
}

static void on_event(void *ctx, const kvpd_event *ev)
{
    kvp_hub *h = ctx;
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
            if (s->turn.lp_on) {
                e.logprobs = s->turn.lp + (size_t)ev->lp_from * (size_t)(1 + s->turn.lp_k);
                e.n_logprobs = ev->lp_to - ev->lp_from;
                e.logprobs_top = s->turn.lp_k;
            }
            s->owner->sink(s->owner->ctx, &e);
        }
        return;
    case KVPD_EV_JOB:
        on_job(h, s, ev);
        return;
    case KVPD_EV_DONE: {
        const kvp_turn_stats *st = &ev->stats;
        int stale = s->save_rc == -ESTALE;
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
        if (to) {
            kvp_hub_event e = {.type = KVP_HUB_DONE, .text = ev->text, .len = ev->len,
                               .stats = st,
                               .durable = h->env.store ? !s->save_failed && !stale : -1,
                               .durable_error = s->save_err};
            if (s->turn.lp_on) {
                e.logprobs = s->turn.lp;
                e.n_logprobs = s->turn.lp_n;
                e.logprobs_top = s->turn.lp_k;
            }
            to->sink(to->ctx, &e);
        }
        return;
    }
    case KVPD_EV_ERROR: {
        kvp_hub_client *to = job_ended(h, s);
        if (ev->code == -EADDRINUSE) {
            elsewhere(h, s, to, ev->text);
            return;
        }
        if (s->need_restore) {   /* the turn could not get the session back from disk */
            if (s->lost)
                lose(h, s, to, ev->code, ev->text);
            else
                restore_failed(h, s, to, ev->text);
            return;
        }
        m->turns_failed++;
        kvpd_log("warning", "session %.8s: %s", s->id, ev->text);
        emit_error(to, error_code(ev->code), ev->text);
        return;
    }
    }
}

/* ---- the daemon's side ---- */

/* chat_template_file: the Jinja template read and tried now, so a bad file stops the
 * start with the reason (where and which construct) instead of each turn. */
static int use_template_file(kvp_template *t, const char *path, char *err, size_t errlen)
{
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd < 0) {
        snprintf(err, errlen, "chat_template_file %s: %s", path,
                 fd == KVP_E_NOT_REGULAR ? "not a regular file" : strerror(-fd));
        return fd;
    }
    char *src = st.st_size <= (16 << 20) ? malloc((size_t)st.st_size + 1) : NULL;
    long long n = src ? kvp_read_full(fd, src, (size_t)st.st_size) : -EFBIG;
    close(fd);
    if (n < 0) {
        free(src);
        snprintf(err, errlen, "chat_template_file %s: %s", path,
                 n == -EFBIG ? "larger than 16 MiB" : strerror((int)-n));
        return (int)n;
    }
    char note[256];
    int rc = kvp_template_use_jinja(t, src, (size_t)n, note, sizeof note);
    free(src);
    if (rc < 0)
        snprintf(err, errlen, "chat_template_file %s: %s", path, note);
    else
        kvpd_log("info", "chat template: %s (Jinja)", path);
    return rc;
}

int kvp_hub_start(kvp_hub **out, const kvp_hub_params *p, char *err, size_t errlen)
{
    kvp_hub *h = calloc(1, sizeof *h);
    *out = h;
    if (!h) {
        kvp_hub_storage_close(p->storage);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    h->loop = p->loop;
    h->cfg = p->cfg;
    h->m = p->metrics;
    h->env.model = p->model;
    h->env.chunk = p->chunk;
    h->env.kv_type = p->kv_type;
    h->env.budget_mode = p->budget_mode;
    h->env.step_tokens = p->step_tokens;
    h->env.reuse_cache = p->reuse_cache;
    h->env.top_p = p->top_p;
    h->env.seed = p->seed;
    h->storage = p->storage;
    h->env.store = h->storage ? h->storage->store : NULL;
    h->env.state_dir = h->env.store ? kvp_store_dir(h->env.store) : "";
    h->workers = p->workers;
    h->pconf = kvp_policy_conf_ref(p->policy);
    h->row_bytes = kvp_cache_row_cost(p->kv_type, p->model->cfg.head_dim);
    char note[256];
    int rc = kvp_template_init(&h->env.tpl, p->model, p->chat_template, note, sizeof note);
    if (rc < 0) {
        snprintf(err, errlen, "%s", note);
        return rc;
    }
    if (rc > 0 && !(p->chat_template_file && p->chat_template_file[0]))
        kvpd_log("warning", "chat template: %s", note);
    if (p->chat_template_file && p->chat_template_file[0] &&
        (rc = use_template_file(&h->env.tpl, p->chat_template_file, err, errlen)) < 0)
        return rc;
    rc = kvp_session_table_init(&h->sessions);
    if (rc == 0 && h->storage) {
        h->transcripts = h->storage->transcripts;
        memset(&h->storage->transcripts, 0, sizeof h->storage->transcripts);
    } else if (rc == 0) {
        rc = kvp_transcripts_init(&h->transcripts);
    }
    if (rc < 0) {
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    kvp_learnlog_cfg lc = {.dir = p->learn_dir, .rate = p->learn_rate,
                           .max_bytes = p->learn_max_bytes, .max_age_s = p->learn_max_age_s,
                           .fingerprint = p->model->cfg.fingerprint};
    h->prefix = kvp_prefix_create(0, 0);   /* NULL: forks only by messages */
    if (!(h->bg = kvp_background_new(p->model, p->kv_type, p->chunk, &lc, p->seed))) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    rc = kvpd_sched_start(&h->sched, h->loop, p->workers, &h->env, kvp_turn_batch, on_event,
                          h, err, errlen);
    if (rc == 0)
        kvpd_sched_set_idle(h->sched, &(kvpd_idle_ops){kvp_background_pending,
                                                        kvp_background_run, h->bg});
    return rc;
}

void kvp_hub_set_policy(kvp_hub *h, kvp_policy_conf *pc)
{
    kvp_policy_conf_unref(h->pconf);
    h->pconf = kvp_policy_conf_ref(pc);
}

static void submit_save(kvp_hub *h, kvp_session *s)
{
    kvp_session_begin_job(s);
    submit(h, s, KVP_SESSION_SAVE, 0);
}

/* A session whose snapshot write failed (a full or failing disk, Redis away or refusing
 * writes) is written again, 1 s after the failure, then 2, 4 ... up to 60 s apart, until
 * a write succeeds: the node recovers (/healthz, parking) once the store takes writes
 * again. With a shared store the write is fenced (store/store.h): it lands only under
 * this node's newest lease or a free one, over the version this copy descends from; a
 * copy another node has moved past comes back -ESTALE and is not retried again. */
static int retry_save(kvp_hub *h, kvp_session *s, double now)
{
    if (!s->save_failed || s->state != KVP_SESSION_IDLE || h->draining ||
        now < s->save_retry_at)
        return 0;
    int shift = s->save_retries < 6 ? s->save_retries : 6;
    double wait = (double)(1 << shift);
    s->save_retry_at = now + (wait > 60 ? 60 : wait);
    s->save_retries++;
    submit_save(h, s);
    return 1;
}

/* The store keeps the snapshots of sessions in memory or attached, whatever their age
 * (store/store.h): the set is given again at every sweep of the hub's. */
static void mark_live(kvp_hub *h)
{
    int n = 0;
    for (kvp_session *s = h->sessions.head; s; s = s->next)
        n++;
    const char **ids = n ? malloc((size_t)n * sizeof *ids) : NULL;
    if (n && !ids)
        return;   /* the previous set stays */
    int k = 0;
    for (kvp_session *s = h->sessions.head; s; s = s->next)
        if (s->state != KVP_SESSION_PARKED || s->client)
            ids[k++] = s->id;
    kvp_store_set_live(h->env.store, ids, k);
    free(ids);
}

void kvp_hub_expire(kvp_hub *h, double now)
{
    double timeout = h->cfg->idle_timeout_s;
    kvp_session *s = h->sessions.head;
    while (s) {
        kvp_session *next = s->next;
        double idle = now - s->last_active;
        if (kvp_session_busy(s) || retry_save(h, s, now)) {
            /* its job's end decides */
        } else if (!s->client && never_used(s)) {
            drop(h, s);
        } else if (h->env.store) {
            /* With a state directory nothing is dropped: idle sessions are parked (if
             * their snapshot is up to date), and parked ones nobody is attached to are
             * let go from memory after another timeout (open loads them again). */
            if (s->state == KVP_SESSION_IDLE && idle > timeout && kvp_session_parkable(s)) {
                kvp_hub_park(h, s);
            } else if (s->state == KVP_SESSION_PARKED && !s->client && idle > 2 * timeout) {
                h->m->sessions_forgotten++;
                drop(h, s);   /* its snapshot stays, and its index entry */
            }
        } else if (idle > timeout) {
            emit_error(s->client, KVPD_E_UNKNOWN_SESSION,
                       "session expired after the idle timeout");
            h->m->sessions_expired++;
            remove_session(h, s);
        }
        s = next;
    }
    if (h->env.store)
        mark_live(h);
}

int kvp_hub_drain(kvp_hub *h)
{
    h->draining = 1;
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext)
        if (s->state == KVP_SESSION_TURN)
            atomic_store(&s->turn.cancel, 1);
    return h->jobs;
}

int kvp_hub_unsaved(const kvp_hub *h)
{
    /* Only resident sessions: one whose write failed is never parked. */
    int n = 0;
    for (const kvp_session *s = h->sessions.resident_head; s; s = s->rnext)
        n += s->save_failed;
    return n;
}

int kvp_hub_jobs(const kvp_hub *h)
{
    return h->jobs;
}

int kvp_hub_save_unsaved(kvp_hub *h)
{
    int n = 0;
    if (!h->env.store)
        return 0;
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext)
        if (s->state == KVP_SESSION_IDLE && !s->saved && (s->n_msgs > 0 || s->has_snapshot)) {
            submit_save(h, s);
            n++;
        }
    return n;
}

void kvp_hub_stop(kvp_hub *h)
{
    if (h && h->sched)
        kvpd_sched_stop(h->sched);
}

void kvp_hub_free(kvp_hub *h)
{
    if (!h)
        return;
    if (h->sched)
        kvpd_sched_free(h->sched);
    /* Clients outlive the hub only in their front end's memory: cut their links. */
    for (kvp_session *s = h->sessions.head; s; s = s->next)
        if (s->client)
            s->client->session = NULL;
    kvp_session_table_clear(&h->sessions);
    kvp_transcripts_free(&h->transcripts);
    kvp_background_free(h->bg);
    kvp_prefix_free(h->prefix);
    kvp_policy_conf_unref(h->pconf);
    kvp_hub_storage_close(h->storage);
    kvp_template_free(&h->env.tpl);
    if (h->trie) {
        kvp_vocab_trie_free(h->trie);
        free(h->trie);
    }
    free(h);
}

/* ---- what the endpoints show ---- */

int kvp_hub_retry_hint_ms(const kvp_hub *h)
{
    /* About one turn's time: a running turn should have ended by then. */
    const kvpd_hist *t = &h->m->turn_duration;
    double ms = t->count ? t->sum / (double)t->count * 1e3 : 100;
    return ms < 50 ? 50 : ms > 5000 ? 5000 : (int)ms;
}

void kvp_hub_info_get(kvp_hub *h, kvp_hub_info *o)
{
    const kvp_model *md = h->env.model;
    memset(o, 0, sizeof *o);
    o->model_name = md->name;
    o->chat_format = kvp_template_name(h->env.tpl.format);
    o->tool_format = h->env.tpl.jinja ? (int)h->env.tpl.tool_format : 0;
    o->policy = h->pconf->name;
    o->policy_file = h->pconf->file;
    o->state_dir = h->env.state_dir;
    o->kv_type = kvp_kv_type_name(h->env.kv_type);
    o->budget_mode = kvp_budget_mode_name(h->env.budget_mode);
    o->store = h->env.store ? kvp_store_kind(h->env.store) : "";
    o->store_where = h->env.store ? kvp_store_where(h->env.store) : "";
    o->node = h->env.store ? kvp_store_node(h->env.store) : "";
    if (h->env.store) {
        kvp_store_stats ss;
        kvp_store_stats_get(h->env.store, &ss);
        o->lease_conflicts = ss.lease_conflicts;
        o->lease_takeovers = ss.lease_takeovers;
        o->snapshots_expired = ss.expired;
        o->snapshots_over_quota = ss.over_quota;
        o->store_errors = ss.errors;
        o->leases_renewing = ss.leases_renewing;
    }
    o->layers = md->cfg.n_layers;
    o->kv_heads = md->cfg.n_kv_heads;
    o->head_dim = md->cfg.head_dim;
    o->context = md->cfg.seq_len;
    kvp_model_weight_mix(md, o->weights, sizeof o->weights);
    for (int t = 0; t < KVP_N_WEIGHT_TYPES; t++)
        o->weight_bytes += md->type_bytes[t];
    o->chunk = h->env.chunk;
    o->step_tokens = h->env.step_tokens;
    o->workers = h->workers;
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext) {
        o->turns_running += kvp_session_busy(s);
        if (s->bytes > o->cache_bytes_max_session)
            o->cache_bytes_max_session = s->bytes;
    }
    o->sessions_resident = h->sessions.resident;
    o->sessions_parked = h->sessions.count - h->sessions.resident;
    o->sessions_total = h->sessions.created_total;
    o->cache_bytes_accounted = kvp_hub_accounted_bytes(h, &o->cache_bytes_total);
    o->turn_reserve_bytes = kvp_hub_turn_bytes(h);
    o->prefix_index_bytes = kvp_prefix_bytes(h->prefix);
    o->queue_depth = kvpd_sched_depth(h->sched);
    o->policy_file_loads = kvp_agent_set_loads();
    kvp_background_drain(h->bg, h->m);
    o->learn_dir = h->bg ? kvp_background_learnlog(h->bg)->dir : "";
}

int kvp_hub_list(kvp_hub *h, int offset, int limit,
                 void (*fn)(void *ctx, const kvp_hub_session_info *si), void *ctx)
{
    double now = kvp_now();
    int i = 0;
    for (kvp_session *s = h->sessions.head; s && i < offset + limit; s = s->next, i++) {
        if (i < offset)
            continue;
        kvp_hub_session_info si = {
            .id = s->id, .policy = s->pconf->name, .turns = s->turns, .rows = s->rows_max,
            .busy = kvp_session_busy(s), .parked = s->state == KVP_SESSION_PARKED,
            .connected = s->client != NULL, .bytes = s->bytes, .evicted_rows = s->evicted_rows,
            .last_active_s_ago = now - s->last_active, .age_s = now - s->created};
        fn(ctx, &si);
    }
    return h->sessions.count;
}
