/* Matching a stateless request (kvp_hub_chat) to the conversation it continues: the
 * idle session holding its history exactly (by transcript hash, then compared), one on
 * disk read first (the request waits for its snapshot), a session rewound or forked
 * from a shared prefix, or a new one. Loop thread. */
#include "sessions/hub.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/textbuf.h"
#include "model/grammar.h"
#include "sessions/hub_impl.h"
#include "turns/persist.h"
#include "store/prefix.h"
#include "sessions/prefix_load.h"
#include "sessions/residency.h"
#include "sessions/reuse.h"
#include "turns/rewind.h"
#include "store/store.h"

/* s holds exactly msgs[0..n) and is free to take a turn. A parked session's texts are on
 * disk: its hash and count stand for them. Messages dropped from a bounded history
 * (max_history_tokens) are known by the hash alone: such a session is continued only when
 * the request names it (`named`: its id is the key to the conversation); an anonymous
 * request whose history reaches into them starts a new session instead. */
int hub_continues(const kvp_hub_client *c, const kvp_session *s, int named, uint64_t hash,
                  const char *system, size_t system_len, const kvp_message *msgs, int n)
{
    if (kvp_session_busy(s) || s->ephemeral || !hub_same_tenant(c, s) ||
        s->transcript_hash != hash ||
        s->transcript_msgs != n ||
        (s->transcript_dropped && !named) || !hub_same_system(s, system, system_len))
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

void hub_pending_free(kvp_hub_pending *p)
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

kvp_hub_pending *hub_pending_new(uint64_t hash, const char *system, size_t system_len,
                                 const kvp_message *msgs, int n, const kvp_turn_opts *o)
{
    kvp_hub_pending *p = calloc(1, sizeof *p);
    if (!p || !(p->msgs = calloc((size_t)n, sizeof *p->msgs)))
        goto oom;
    p->hash = hash;
    p->o = *o;
    kvp_grammar_ref(p->o.grammar);
    if (system_len && !(p->system = kvp_text_dup(system, system_len)))
        goto oom;
    p->system_len = system_len;
    for (; p->n < n; p->n++) {
        p->msgs[p->n] = msgs[p->n];
        if (!(p->msgs[p->n].text = kvp_text_dup(msgs[p->n].text, msgs[p->n].len)))
            goto oom;
    }
    for (int i = 0; i < o->n_stop && i < KVP_HUB_MAX_STOPS; i++) {
        if (!(p->stops[i] = kvp_text_dup(o->stop[i], o->stop_len[i])))
            goto oom;
        p->o.stop[i] = p->stops[i];
    }
    if (o->sampling.n_bias > 0) {
        if (!(p->bias = malloc((size_t)o->sampling.n_bias * sizeof *p->bias)))
            goto oom;
        memcpy(p->bias, o->sampling.bias, (size_t)o->sampling.n_bias * sizeof *p->bias);
        p->o.sampling.bias = p->bias;
    }
    if ((o->tools_len && !(p->o.tools = p->tools = kvp_text_dup(o->tools, o->tools_len))) ||
        (o->reply_prefix_len &&
         !(p->o.reply_prefix = p->prefix = kvp_text_dup(o->reply_prefix, o->reply_prefix_len))) ||
        (o->end_after_len &&
         !(p->o.end_after = p->end_after = kvp_text_dup(o->end_after, o->end_after_len))))
        goto oom;
    return p;
oom:
    hub_pending_free(p);
    return NULL;
}

/* The request goes on: on s (it continues s), or on a new session seeded with its
 * history. */
void hub_chat_go(kvp_hub_client *c, kvp_session *s, const char *system, size_t system_len,
                 const kvp_message *msgs, int n, const kvp_turn_opts *o)
{
    if (s) {
        hub_attach(c, s);
        hub_emit_session(c, 1);
    } else {
        if (hub_new_session(c, system, system_len) < 0)
            return;
        if (kvp_session_seed(c->session, msgs, n - 1) < 0) {
            hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
            return;
        }
    }
    kvp_turn_opts with_role = *o;
    with_role.role = msgs[n - 1].user;
    hub_start_turn(c, msgs[n - 1].text, msgs[n - 1].len, &with_role);
}

int hub_resident_source_ok(void *ctx, const void *owner)
{
    const hub_source_filter *f = ctx;
    return kvp_reuse_fork_source_ok(f->h, f->c, owner);
}

/* The held conversation the new session s best forks for the request msgs[0..n): the
 * one of the prefix index with the longest token prefix of the request's rendering (at
 * least a block, checked token by token), else the message-level choice
 * (kvp_reuse_fork_find: shorter conversations, a shared system text). *other: it shares
 * messages with the request, not only a prefix of its rendering. With `rendered`, s
 * holds the request's rendering (its render job's: msgs[0..n) seeded, the last as its
 * turn renders it); it goes into the index marked in flight (hub_wait_mark). Without,
 * only the message-level choice applies. With may_wait, *wait_on: a session whose
 * running turn prefills a longer prefix of the rendering (hub_wait_source), NULL when
 * none. Loop thread: a lookup and comparisons of tokens, no rendering. */
static kvp_session *fork_source(kvp_hub *h, kvp_hub_client *c, kvp_session *s, int rendered,
                                const kvp_message *msgs, int n, int *other, int may_wait,
                                const kvp_session **wait_on, hub_far_source *far)
{
    kvp_session *src = NULL;
    int shared = 0, have = 0;
    *wait_on = NULL;
    if (far)
        far->len = 0;
    if (rendered) {
        hub_source_filter f = {h, c};
        int len;
        kvp_session *t = (kvp_session *)kvp_prefix_lookup(h->prefix, c->tenant, s->tokens,
                                                          s->n_tokens, hub_resident_source_ok, &f, &len);
        int lcp = t ? kvp_token_lcp(t->tokens, t->n_cached, s->tokens, s->n_tokens) : 0;
        if (lcp >= KVP_PREFIX_BLOCK) {
            src = t;
            have = lcp;
            shared = kvp_reuse_shared_msgs(t, s->system, s->system_len, msgs, n);
        }
    }
    if (!src && (src = kvp_reuse_fork_find(h, c, s->system, s->system_len, msgs, n, &shared)) &&
        rendered)
        have = kvp_token_lcp(src->tokens, src->n_cached, s->tokens, s->n_tokens);
    if (rendered) {
        if (may_wait)
            *wait_on = hub_wait_source(h, c, s->tokens, s->n_tokens, have);
        if (far)
            hub_prefix_far_source(h, c, s->tokens, s->n_tokens, have, far);
        hub_wait_mark(h, s);
    }
    *other = shared > 0;
    return src;
}

/* s held the rendering of the request msgs[0..n) (its render job's): it keeps that of
 * the history msgs[0..n-1) as its transcript, as a seeded session's turn would render it
 * first, and the last message's tokens go to the turn (s->rq.turn_ids), so the turn's start
 * renders nothing again. -ENOMEM: s is left seeded with the history, unrendered. */
static int keep_rendering(kvp_session *s, const kvp_message *msgs, int n)
{
    int at = s->msg_tok[n - 1], k = s->n_tokens - at;
    kvp_session_turn_ids_clear(s);
    if (k > 0 && !(s->rq.turn_ids = malloc((size_t)k * sizeof *s->rq.turn_ids))) {
        kvp_session_clear_transcript(s);
        (void)kvp_session_seed(s, msgs, n - 1);   /* out of memory: the turn fails then */
        return -ENOMEM;
    }
    if (k > 0)
        memcpy(s->rq.turn_ids, s->tokens + at, (size_t)k * sizeof *s->rq.turn_ids);
    s->rq.n_turn_ids = k;
    free(s->msgs[n - 1].text);
    s->n_msgs = n - 1;
    s->n_tokens = at;
    s->reply_open = n > 1;   /* as the turn's start leaves a rendered history */
    s->jinja_rendered = 0;   /* the family's tokens (kvp_session_retokenize) */
    return 0;
}

/* A new session s, before its first turn (the turn's message msgs[n-1]): forked from the
 * held conversation that shares the most with the request when there is one (it starts
 * with a copy of that one's cache and its turn prefills only what follows the common
 * prefix; the source is not changed). `rendered`: s holds the request's rendering (see
 * fork_source); else s is seeded with the history. Leaves s seeded with the history
 * either way (as a rewind to be applied when forked), with the rendering handed on to
 * the turn when there is one. Returns 1 when the request waits instead (may_wait,
 * hub_wait.c) or has a parked or on-disk source read first (may_load, prefix_load.c): s
 * is gone, c has no session. */
static int try_fork(kvp_hub_client *c, kvp_session *s, int rendered, const kvp_message *msgs,
                    int n, const kvp_turn_opts *o, int may_wait, int may_load)
{
    kvp_hub *h = c->hub;
    if (!h->env.reuse_cache)
        return 0;
    int forked = 0, other = 0;
    size_t bytes = 0;
    const kvp_session *wait_on;
    hub_far_source far;
    kvp_session *src = fork_source(h, c, s, rendered, msgs, n, &other, may_wait, &wait_on,
                                   may_load ? &far : NULL);
    if (rendered && keep_rendering(s, msgs, n) < 0)
        rendered = 0;
    int waits = wait_on && hub_wait_park(c, wait_on, s->system, s->system_len, msgs, n, o) == 0;
    /* a read's request, copied while s holds the system text; hash 0: its history extends
     * no held conversation exactly (kvp_hub_chat looked first), so what follows the read
     * is a fork, never a continuation (out of memory: it goes on without the source) */
    kvp_hub_pending *p = NULL;
    int reads = !waits && may_load && far.len > 0 &&
                (p = hub_pending_new(0, s->system, s->system_len, msgs, n, o)) != NULL;
    if (waits || reads) {
        /* the session made to render the request goes unused (its index entry with it);
         * the request makes another when it goes on */
        h->m->sessions_created--;
        kvp_session_clear_transcript(s);
        kvp_session_turn_ids_clear(s);
        hub_leave(c);
        if (reads)
            hub_prefix_load(c, &far, p);
        return 1;
    }
    if (src) {
        /* the fork needs s empty: its rendered history goes to the rewind instead */
        int *hist = rendered ? s->tokens : NULL, *hist_tok = rendered ? s->msg_tok : NULL;
        int n_hist = rendered ? s->n_tokens : 0;
        if (rendered) {
            s->tokens = NULL;
            s->msg_tok = NULL;
            s->cap_tokens = 0;
        }
        kvp_session_clear_transcript(s);
        if (kvp_session_fork(s, src, &h->env, &bytes) == 0) {
            if (kvp_session_rewind(s, msgs, n - 1) == 0) {
                forked = 1;
                if (n > 1 && hist_tok) {
                    kvp_session_rewind_rendered(s, hist, n_hist, hist_tok);
                    hist = hist_tok = NULL;
                }
            } else {   /* no room for the history: the copy goes, the history is prefilled */
                kvp_session_forget(s);
            }
        }
        free(hist);
        free(hist_tok);
        if (!forked)   /* its rendering went with the attempt: the turn renders it */
            kvp_session_turn_ids_clear(s);
    }
    if (forked) {
        s->rq.reuse_from = other ? KVP_REUSE_OTHER : KVP_REUSE_SHARED;
        /* its own rows count against the memory cap, and src's, which may have become
         * a block both read (charged to src) */
        kvp_session_count_bytes(s);
        kvp_session_count_bytes(src);
        h->m->prefix_hits++;
        h->m->prefix_bytes_copied += bytes;
    } else {
        h->m->prefix_misses++;
        if (!s->n_msgs && kvp_session_seed(s, msgs, n - 1) < 0)
            kvp_session_forget(s);   /* out of memory: the turn fails on its own */
    }
    return 0;
}

/* The text a request's rendering is made from, in bytes. */
static size_t request_bytes(size_t system_len, const kvp_message *msgs, int n)
{
    size_t b = system_len;
    for (int i = 0; i < n; i++)
        b += msgs[i].len;
    return b;
}

/* The request could not be rendered for the search: s is seeded with the history only,
 * so the search goes on by messages and the turn renders the request (and answers the
 * template's error) as it would have. */
static void unrendered(kvp_session *s, const kvp_message *msgs, int n)
{
    kvp_session_clear_transcript(s);
    if (kvp_session_seed(s, msgs, n - 1) < 0)
        kvp_session_forget(s);   /* out of memory: the turn fails on its own */
}

/* The new session s goes on (hub_chat_new, once rendered when it was). */
static void chat_new_go(kvp_hub_client *c, kvp_session *s, int rendered,
                        const kvp_message *msgs, int n, const kvp_turn_opts *o, int may_wait,
                        double since, int may_load)
{
    if (try_fork(c, s, rendered, msgs, n, o, may_wait, may_load))
        return;   /* it waits (hub_wait.c), or its source is read first (prefix_load.c) */
    if (!s->ephemeral)
        hub_emit_session(c, 0);
    if (n > 1 && !s->n_msgs && !s->rq.rewind_set) {
        hub_wait_unmark(c->hub, s);
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    kvp_turn_opts with_role = *o;
    with_role.role = msgs[n - 1].user;
    c->turn_since = since;
    hub_start_turn(c, msgs[n - 1].text, msgs[n - 1].len, &with_role);
    /* A queued turn's session is its worker's now (rewind_set included: the turn's start
     * clears it), so the loop looks no further than the state it set itself. */
    if (s->state != KVP_SESSION_TURN) {
        hub_wait_unmark(c->hub, s);   /* refused: no turn prefills its prompt */
        kvp_session_turn_ids_clear(s);
        if (s->rq.rewind_set)
            kvp_session_rewind_clear(s);
    }
}

void hub_chat_new(kvp_hub_client *c, const char *system, size_t system_len,
                  const kvp_message *msgs, int n, const kvp_turn_opts *o, double waited_since,
                  int may_load)
{
    /* the session event only once the request does not wait: a waiting request holds no
     * session, and the one made to render it is never named */
    if (hub_new_session_quiet(c, system, system_len) < 0)
        return;
    kvp_session *s = c->session;
    /* an ephemeral turn's session is never named: it does not last */
    s->ephemeral = o->ephemeral;
    /* The fork-source search needs the request rendered. A request of more than
     * KVP_HUB_RENDER_INLINE_BYTES of text is rendered by a render job on a worker (the
     * whole request seeded) and the search goes on when it ends (hub_chat_rendered); a
     * smaller one renders here, at a cost bounded by that size. Either way the rendering
     * is handed on to the turn, which does not render it again. */
    kvp_hub *h = c->hub;
    int search = h->env.reuse_cache && h->prefix != NULL;
    int job = search && request_bytes(system_len, msgs, n) > KVP_HUB_RENDER_INLINE_BYTES;
    kvp_hub_pending *p = NULL;
    if (kvp_session_seed(s, msgs, search ? n : n - 1) < 0 ||
        (job && !(p = hub_pending_new(0, system, system_len, msgs, n, o)))) {
        if (!s->ephemeral)
            hub_emit_session(c, 0);
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    if (job) {
        p->render = s;
        p->may_wait = waited_since == 0;
        p->may_load = may_load;
        /* a new request's queue time counts from now, a waiter's from its arrival */
        p->since = waited_since ? waited_since : kvp_now();
        hub_pending_free(c->pending);
        c->pending = p;
        hub_submit(h, s, KVP_SESSION_RENDER, 0);
        return;
    }
    int rendered = search && kvp_session_retokenize(s, &h->env) >= 0;
    if (search && !rendered)
        unrendered(s, msgs, n);
    chat_new_go(c, s, rendered, msgs, n, o, waited_since == 0, waited_since, may_load);
}

void hub_chat_rendered(kvp_hub *h, kvp_session *s, int rc)
{
    h->jobs--;
    s->state = KVP_SESSION_IDLE;
    s->owner = NULL;
    s->reserve = 0;
    s->last_active = kvp_now();
    kvp_hub_client *c = s->client;
    kvp_hub_pending *p = c && c->pending && c->pending->render == s ? c->pending : NULL;
    if (!p) {   /* its client left or sent another request: nobody needs it */
        h->m->sessions_created--;
        kvp_session_clear_transcript(s);
        kvp_hub_drop(h, s);
        return;
    }
    c->pending = NULL;
    if (h->draining) {
        h->m->sessions_created--;
        kvp_session_clear_transcript(s);
        hub_leave(c);
        hub_emit_error(c, KVPD_E_OVERLOADED, "the daemon is shutting down");
        hub_pending_free(p);
        return;
    }
    int rendered = rc >= 0 && s->n_msgs == p->n;
    if (!rendered)
        unrendered(s, p->msgs, p->n);
    chat_new_go(c, s, rendered, p->msgs, p->n, &p->o, p->may_wait, p->since, p->may_load);
    hub_pending_free(p);
}

int kvp_hub_prefill_check(const kvp_hub *h, const char *system, size_t system_len,
                          const kvp_message *msgs, int n, const char *tools, size_t tools_len,
                          const char *prefill, size_t prefill_len, char *err, size_t errlen)
{
    if (!h->env.tpl.jinja)   /* a family renders a reply's text as it is */
        return 0;
    kvp_chat_msg *cm = malloc(sizeof *cm * ((size_t)n + 1));
    if (!cm) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++)
        cm[i] = (kvp_chat_msg){msgs[i].user, msgs[i].text, msgs[i].len};
    cm[n] = (kvp_chat_msg){0, prefill, prefill_len};
    int *ids = NULL, keep = 0, at = 0;
    int rc = kvp_template_jinja_prefill(&h->env.tpl, system, system_len, cm, n + 1, tools,
                                        tools_len, NULL, 0, &keep, &at, &ids, err, errlen);
    free(cm);
    free(ids);
    return rc < 0 ? rc : 0;
}

void kvp_hub_chat(kvp_hub_client *c, const char *id, const char *system, size_t system_len,
                  const kvp_message *msgs, int n, const kvp_turn_opts *o)
{
    kvp_hub *h = c->hub;
    hub_wait_leave(c);   /* a request it sent before waits no more */
    if (h->draining) {
        hub_emit_error(c, KVPD_E_OVERLOADED, "the daemon is shutting down");
        return;
    }
    if (n < 1) {
        hub_emit_error(c, KVPD_E_BAD_REQUEST, "a conversation needs a message");
        return;
    }
    if (!hub_system_ok(c, system_len))
        return;
    if (o && o->prefill && (!o->reply_prefix_len || !msgs[n - 1].user)) {
        hub_emit_error(c, KVPD_E_BAD_REQUEST,
                       "an assistant prefill continues a non-empty message after the user's");
        return;
    }
    hub_leave(c);
    if (o->ephemeral) {
        /* keeps nothing: a session of its own, forked from a held conversation sharing
         * its prefix (read first when that one is parked or on disk) or seeded with its
         * history; never a held session continued or cut back in place */
        hub_chat_new(c, system, system_len, msgs, n, o, 0, 1);
        return;
    }
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
        if (t && hub_continues(c, t, 1, hash, system, system_len, msgs, prefix))
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
        if (t && hub_continues(c, t, 0, hash, system, system_len, msgs, prefix))
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
            hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
            return;
        }
        hub_chat_go(c, s, system, system_len, msgs, n, o);
        if (s->state != KVP_SESSION_TURN)
            kvp_session_rewind_clear(s);   /* refused: the session stays as it was */
        else
            h->m->prefix_rewinds++;
        return;
    }
    if (!s && !disk) {
        hub_chat_new(c, system, system_len, msgs, n, o, 0, 1);
        return;
    }
    if (s) {
        hub_chat_go(c, s, system, system_len, msgs, n, o);
        return;
    }
    /* Read it first (a load job); the request waits on the client (chat_loaded). */
    kvp_hub_pending *p = hub_pending_new(hash, system, system_len, msgs, n, o);
    if (!p) {
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    p->named = named;
    char sid[KVP_SNAPSHOT_ID_MAX + 1];
    snprintf(sid, sizeof sid, "%s", disk);
    hub_open_from_disk(c, stale, sid, NULL, 0);
    if (c->session && c->session->state == KVP_SESSION_LOAD)
        c->pending = p;
    else
        hub_pending_free(p);   /* refused (overloaded): answered */
}
