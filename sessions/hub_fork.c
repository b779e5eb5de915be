/* A hello's fork (kvp_hub_open_fork, sessions/hub.h): a new session branched from the
 * end of a turn of a held conversation of the same tenant. It is made as a stateless
 * request's fork is (sessions/hub_match.c): a copy of the source's cache, policy state
 * and tokens (kvp_session_fork), then the history up to that turn armed as a rewind
 * (kvp_session_rewind). With at least one turn of history the rewind is applied at once
 * on the loop (the history rendered, the copy cut back to the longest token prefix that
 * rendering shares with the source's tokens), so the new session holds its history as a
 * resumed session does from its session event on, and its first turn prefills only what
 * follows the kept prefix. A fork at turn 0 keeps the rewind armed for its first turn,
 * which cuts the copy back to what the system text and the new message share with the
 * source. A source that is parked or only on disk is read first by a load job whose
 * owner is the forking client (hub_events.c hands its end to hub_fork_loaded). The
 * source is never changed, attached or written. Loop thread. */
#include "sessions/hub.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "sessions/hub_impl.h"
#include "turns/persist.h"
#include "sessions/residency.h"
#include "turns/rewind.h"
#include "store/store.h"

static const char no_such[] = "no such session (expired or never existed)";

int hub_fork_idle(kvp_hub_client *c)
{
    if (!c->fork_src)
        return 1;
    hub_emit_error(c, KVPD_E_BUSY, "the session to fork is being loaded from disk; the new "
               "session's frame follows");
    return 0;
}

int hub_fork_waited(kvp_hub_client *c, const kvp_session *s)
{
    int waited = c->fork_src == s;
    if (waited)
        c->fork_src = NULL;
    return waited;
}

void hub_fork_forget(kvp_hub_client *c)
{
    if (c->fork_src && c->fork_src->owner == c)
        c->fork_src->owner = NULL;
    c->fork_src = NULL;
}

/* The turns src holds whole (each ends with a reply), and through *end the messages up
 * to and with the turn-th reply (0 for turn 0; -1 when src holds fewer turns). */
static int turns_held(const kvp_session *src, int turn, int *end)
{
    int replies = 0;
    *end = turn == 0 ? 0 : -1;
    for (int i = 0; i < src->n_msgs; i++)
        if (src->msgs[i].user == 0 && ++replies == turn)
            *end = i + 1;
    return replies;
}

/* The armed rewind applied now, on the loop (as a turn's start applies it on its worker):
 * s's transcript becomes the history, its copy of the cache keeps the longest prefix of
 * the source's tokens the history's rendering starts with, short of its last token (the
 * next turn runs that one again, as it does a reply's final token). 0 or < 0. */
static int cut_now(kvp_hub *h, kvp_session *s)
{
    int *old, n_old;
    int armed = s->rq.rewind_set;
    int rc = kvp_session_rewind_apply(s, &h->env, &old, &n_old);
    if (armed)   /* taken by the transcript: the request lets go of it */
        kvp_session_rewind_let_go(s);
    if (rc == 0)
        kvp_session_rewind_cut(s, old, n_old);
    return rc;
}

/* A fork refused once its new session was made: the new session goes and c gets back
 * the session it held before the hello (old_id; "" for none), when that one is still
 * here, idle and free, so that a refusal leaves the connection as it was. */
static void refuse_after_new(kvp_hub_client *c, const char *old_id)
{
    kvp_hub *h = c->hub;
    hub_leave(c);
    kvp_session *old = old_id[0] ? kvp_session_find(&h->sessions, old_id) : NULL;
    if (old && !old->client && !kvp_session_busy(old))
        hub_attach(c, old);
}

/* c's new session from src (resident, idle, of c's tenant) at the end of its turn-th
 * turn: forked when src's cache can be copied, else seeded with the history (its first
 * turn then prefills it whole: a source made under another policy, reuse_cache off). */
static void fork_from(kvp_hub_client *c, kvp_session *src, int turn)
{
    kvp_hub *h = c->hub;
    char err[200];
    int end;
    if (src->hist_msgs || src->transcript_dropped) {
        hub_emit_error(c, KVPD_E_BAD_REQUEST, "this session's oldest turns were dropped "
                   "(max_history_tokens): a fork needs its conversation from the start");
        return;
    }
    /* (such a session ends when its client leaves it: the new one's would free it) */
    if (hub_never_used(src)) {
        hub_emit_error(c, KVPD_E_BAD_REQUEST, "this session has not run a turn of its own "
                   "yet: fork the session it was forked from, or start a new one");
        return;
    }
    int held = turns_held(src, turn, &end);
    if (end < 0) {
        snprintf(err, sizeof err, "fork.turn %d is past the session's end: it holds %d "
                 "turns (0 to %d may be forked)", turn, held, held);
        hub_emit_error(c, KVPD_E_BAD_REQUEST, err);
        return;
    }
    char id[KVP_SESSION_ID_LEN + 1], old_id[KVP_SESSION_ID_LEN + 1] = "";
    memcpy(id, src->id, sizeof id);
    if (c->session)
        memcpy(old_id, c->session->id, sizeof old_id);
    if (hub_new_session_quiet(c, NULL, 0) < 0)
        return;   /* answered */
    kvp_session *s = c->session;
    s->fork_unrun = 1;
    /* The new session's admission may have parked the source (or, without a store,
     * dropped it) to make room: it is looked up again. */
    src = kvp_session_find(&h->sessions, id);
    if (!src || src->state != KVP_SESSION_IDLE) {
        hub_overloaded(c, "no room for the new session beside the one to fork (max_sessions "
                          "or the memory cap)");
        refuse_after_new(c, old_id);
        return;
    }
    if (kvp_session_set_system(s, src->system, src->system_len) < 0) {
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        refuse_after_new(c, old_id);
        return;
    }
    size_t bytes = 0;
    int forked = 0;
    if (h->env.reuse_cache && kvp_session_fork(s, src, &h->env, &bytes) == 0) {
        if (kvp_session_rewind(s, src->msgs, end) == 0 && (end == 0 || cut_now(h, s) == 0)) {
            forked = 1;
        } else {   /* out of memory: the copy goes, the history is prefilled */
            kvp_session_rewind_clear(s);
            kvp_session_forget(s);
        }
    }
    if (!forked && kvp_session_seed(s, src->msgs, end) < 0) {
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        refuse_after_new(c, old_id);
        return;
    }
    /* Its own copy counts against the memory cap from now on: it must fit beside what is
     * held, other idle sessions parked (or dropped) to make room as for a turn's
     * reservation; else the fork is refused and its session goes. (The source is not
     * touched again.) */
    kvp_session_count_bytes(s);
    kvp_session_count_bytes(src);   /* its rows may have become a block the fork reads */
    size_t unused;
    if (kvp_hub_admit(h, s, 0, s->bytes, &unused, err, sizeof err) < 0) {
        hub_overloaded(c, "no room for the fork's copy of the cache beside the sessions "
                          "held (max_cache_bytes)");
        refuse_after_new(c, old_id);
        return;
    }
    /* and within the tenant's bytes, as its first turn's reservation (at least the copy)
     * will be: the tenant's own idle sessions are parked to make room, never another's */
    if (kvp_hub_admit_tenant(h, s, s->tenant, 1, 0, err, sizeof err) < 0) {
        hub_overloaded(c, err);
        refuse_after_new(c, old_id);
        return;
    }
    if (forked) {
        s->rq.reuse_from = KVP_REUSE_OTHER;
        h->m->prefix_hits++;
        h->m->prefix_bytes_copied += bytes;
    } else {
        h->m->prefix_misses++;
    }
    s->turns = s->turns_done = turn;
    s->last_active = kvp_now();
    hub_emit_session(c, 0);
}

void hub_fork_loaded(kvp_hub_client *c, kvp_session *s)
{
    if (!hub_same_tenant(c, s)) {   /* another tenant's: as if it did not exist */
        hub_emit_error(c, KVPD_E_UNKNOWN_SESSION, no_such);
        return;
    }
    kvpd_log("info", "session %.8s: loaded from its snapshot for a fork", s->id);
    fork_from(c, s, c->fork_turn);
}

void kvp_hub_open_fork(kvp_hub_client *c, const char *src_id, int turn)
{
    kvp_hub *h = c->hub;
    if (!hub_open_ready(c))
        return;
    if (turn < 0) {
        hub_emit_error(c, KVPD_E_BAD_REQUEST, "fork.turn must be an integer >= 0");
        return;
    }
    kvp_session *s = src_id && kvp_session_id_ok(src_id)
                     ? kvp_session_find(&h->sessions, src_id) : NULL;
    if (!src_id || !kvp_session_id_ok(src_id) ||
        /* (one named before a restart and not read yet has no tenant yet: its load checks) */
        (s && !s->unread && !hub_same_tenant(c, s))) {
        hub_emit_error(c, KVPD_E_UNKNOWN_SESSION, no_such);
        return;
    }
    if (s && kvp_session_busy(s)) {
        hub_emit_error(c, KVPD_E_BUSY, s->state == KVP_SESSION_TURN
                   ? "the session to fork has a turn running; try again after it ends"
                   : s->state == KVP_SESSION_LOAD
                   ? "the session to fork is being loaded from disk; try again"
                   : "the session to fork is being written to disk; try again");
        return;
    }
    if (!s && !h->env.store) {
        hub_emit_error(c, KVPD_E_UNKNOWN_SESSION, no_such);
        return;
    }
    if (s && s->state != KVP_SESSION_PARKED) {
        fork_from(c, s, turn);
        return;
    }
    /* Parked, or only on disk: read first (the fork is made when the load ends). */
    size_t reserve;
    if (!(s = hub_load_prepare(c, s, src_id, &reserve)))
        return;   /* answered */
    if (!s->need_restore && !kvp_store_has_leases(h->env.store)) {
        fork_from(c, s, turn);   /* parked with nothing to read */
        return;
    }
    s->owner = c;
    s->fork_read = 1;
    c->fork_src = s;
    c->fork_turn = turn;
    hub_submit(h, s, KVP_SESSION_LOAD, reserve);
}
