/* What the files of the hub (hub.c: the client API and attachment; hub_match.c:
 * matching stateless requests; hub_wait.c: new requests waiting for a running turn's
 * shared prefix; hub_fork.c: a hello's fork; hub_events.c: the workers' events;
 * hub_life.c: start, expiry, shutdown; hub_stats.c: what the endpoints show) share beyond
 * the hub's state (sessions/hub_state.h). Private to sessions/; loop thread. */
#ifndef KVP_HUB_IMPL_H
#define KVP_HUB_IMPL_H

#include "sessions/hub.h"
#include "sessions/hub_state.h"
#include "store/prefix.h"
#include "turns/step_plan.h"   /* kvp_turn_batch, the workers' step (hub_life.c) */

/* ---- events to clients (hub.c) ---- */

void hub_emit_error_retry(kvp_hub_client *c, const char *code, const char *msg, int retry);
void hub_emit_error(kvp_hub_client *c, const char *code, const char *msg);
/* overloaded, with a hint of when to try again. */
void hub_overloaded(kvp_hub_client *c, const char *msg);
/* The session event for c's session (its history when it is idle). */
void hub_emit_session(kvp_hub_client *c, int resumed);

/* ---- attachment (hub.c) ---- */

/* Nothing to keep: no turn ever ran and nothing is on disk. */
int hub_never_used(const kvp_session *s);
/* The client lets go of its session (one never used ends). */
void hub_leave(kvp_hub_client *c);
/* An idle session follows the newest client that names it; the previous one is told. */
void hub_attach(kvp_hub_client *c, kvp_session *s);
/* Hands s to the scheduler for `job`, holding `reserve` bytes while it runs. */
void hub_submit(kvp_hub *h, kvp_session *s, enum kvp_session_state job, size_t reserve);
/* s belongs to c's tenant. */
int hub_same_tenant(const kvp_hub_client *c, const kvp_session *s);
/* A system text of len bytes is within KVP_HUB_SYSTEM_MAX (else c is told too_large). */
int hub_system_ok(kvp_hub_client *c, size_t len);
/* s's system text is system[0..len). */
int hub_same_system(const kvp_session *s, const char *system, size_t len);
/* A resume's system text (system NULL: not given) against s's; a mismatch is answered
 * bad_request and leaves c without a session. */
int hub_system_matches(kvp_hub_client *c, const kvp_session *s, const char *system,
                       size_t len);
/* A new session for c, attached (events are c's to send); 0 or answered with an error. */
int hub_new_session(kvp_hub_client *c, const char *system, size_t system_len);
/* The same without the session event (the caller sends it once the session is ready). */
int hub_new_session_quiet(kvp_hub_client *c, const char *system, size_t system_len);
/* c may open a session now: the daemon is not draining and c has no job in flight
 * (else c is told overloaded or busy: 0). */
int hub_open_ready(kvp_hub_client *c);
/* A parked session back in memory under the policy in force (its job reads it). */
int hub_unpark(kvp_hub *h, kvp_session *s);
/* Before a load job for c of session id (s: its parked entry, or NULL): admission, then
 * the session resident (unparked, or made to be read: need_restore). The session, or
 * NULL when c was answered (overloaded, out of memory). *reserve: the job's bytes. */
kvp_session *hub_load_prepare(kvp_hub_client *c, kvp_session *s, const char *id,
                              size_t *reserve);
/* c resumes session id from the store (s: its parked entry, or NULL). */
void hub_open_from_disk(kvp_hub_client *c, kvp_session *s, const char *id,
                        const char *system, size_t system_len);
/* c's message as a turn on its session. */
void hub_start_turn(kvp_hub_client *c, const char *text, size_t len, const kvp_turn_opts *o);

/* ---- matching stateless requests (hub_match.c) ---- */

/* A request waiting for the snapshot of the session it extends (kvp_hub_chat). */
typedef struct kvp_hub_pending {
    uint64_t hash;                   /* of system and msgs[0..n-1) */
    char *system;
    size_t system_len;
    kvp_message *msgs;
    int n;
    int named;                       /* the session it waits for is the one it named */
    int fork;                        /* ... or a source to fork (sessions/prefix_load.h):
                                      * a new session follows (hub_chat_new) */
    kvp_turn_opts o;                 /* its stop strings point into stops, its biases
                                      * into bias */
    char *stops[KVP_HUB_MAX_STOPS];
    kvp_logit_bias *bias;
    char *tools, *prefix, *end_after;   /* the copies o's tool options point to */
    /* a new session's request waiting for its render job (hub_chat_new): the session
     * rendering it, whether it may wait for a running turn or read a source first, and
     * when its queue time began */
    struct kvp_session *render;
    int may_wait, may_load;
    double since;
} kvp_hub_pending;

/* s holds exactly msgs[0..n) (hash: theirs with system) and is free to take a turn. */
int hub_continues(const kvp_hub_client *c, const kvp_session *s, int named, uint64_t hash,
                  const char *system, size_t system_len, const kvp_message *msgs, int n);
void hub_pending_free(kvp_hub_pending *p);
/* A copy of the request (its options' borrowed bytes copied, the grammar referenced);
 * NULL when out of memory. */
kvp_hub_pending *hub_pending_new(uint64_t hash, const char *system, size_t system_len,
                                 const kvp_message *msgs, int n, const kvp_turn_opts *o);
/* The request's turn on s, which holds its history. */
void hub_chat_go(kvp_hub_client *c, kvp_session *s, const char *system, size_t system_len,
                 const kvp_message *msgs, int n, const kvp_turn_opts *o);

/* A new session for the request (kvp_hub_chat found none to continue or cut back), forked
 * when it can be. waited_since 0: a new request, which may instead wait for a
 * conversation whose turn prefills a longer shared prefix (hub_wait.c); else the time
 * (kvp_now) a request that waited arrived: it goes on now without waiting again, and its
 * turn counts its queue time and time to first token from then. may_load: a parked or
 * on-disk conversation that gives a longer prefix than any resident one is read first
 * (prefix_load.c; the request goes on here once it is in, without reading again). */
/* A new session's request of more than this many bytes of text (system and messages) is
 * rendered for its fork-source search by a render job on a worker; a smaller one on the
 * loop (a cost bounded by this size). */
#define KVP_HUB_RENDER_INLINE_BYTES 4096
void hub_chat_new(kvp_hub_client *c, const char *system, size_t system_len,
                  const kvp_message *msgs, int n, const kvp_turn_opts *o, double waited_since,
                  int may_load);
/* The render job of a new session s (hub_chat_new) ended (rc: 0, or the rendering's
 * error): the request waiting on s's client goes on, its fork source looked up in the
 * rendering; nobody waiting (the client left or moved on), s goes. */
void hub_chat_rendered(kvp_hub *h, kvp_session *s, int rc);

/* What a prefix index filter (kvp_prefix_filter) of the hub is given: the hub and the
 * client whose request looks a source up. */
typedef struct hub_source_filter {
    kvp_hub *h;
    const kvp_hub_client *c;
} hub_source_filter;
/* The filter for resident fork sources (kvp_reuse_fork_source_ok); ctx a
 * hub_source_filter. */
int hub_resident_source_ok(void *ctx, const void *owner);

/* ---- requests waiting for a shared prefix (hub_wait.c) ---- */

/* Requests that wait at once, at most (beyond: they prefill their prefix themselves). */
#define KVP_HUB_MAX_WAITS 256
/* ... and of one tenant, so that one key's burst leaves room for the others' waits. */
#define KVP_HUB_MAX_WAITS_PER_TENANT (KVP_HUB_MAX_WAITS / 4)
/* What waiting must gain over the best idle source, in tokens, at least. */
#define KVP_HUB_WAIT_GAIN (2 * KVP_PREFIX_BLOCK)

/* s, a new session, renders its request in s->tokens: they go into the prefix index,
 * marked in flight, for requests that arrive while its first turn runs. */
void hub_wait_mark(kvp_hub *h, kvp_session *s);
/* s's turn did not start: the mark goes. */
void hub_wait_unmark(kvp_hub *h, kvp_session *s);
/* The session of c's tenant and policy whose turn is prefilling the longest prefix of
 * tokens[0..n), when it is at least KVP_HUB_WAIT_GAIN longer than `have` (what an idle
 * source gives); NULL: none. Compared by the index's hashes only: a turn's tokens are
 * its worker's (the fork that follows compares them). */
const kvp_session *hub_wait_source(kvp_hub *h, const kvp_hub_client *c, const int *tokens,
                                   int n, int have);
/* c's request (copied) waits for src's job to end; 0, or -1 when it cannot (the bound,
 * memory, c waits already): it goes on now. */
int hub_wait_park(kvp_hub_client *c, const kvp_session *src, const char *system,
                  size_t system_len, const kvp_message *msgs, int n, const kvp_turn_opts *o);
/* c's waiting request is forgotten (c is closed, or sends another). */
void hub_wait_leave(kvp_hub_client *c);
/* src's job ended: its waiters are marked to go on; how many. */
int hub_wait_take(kvp_hub *h, const kvp_session *src);
/* The marked waiters go on: each matched again, without waiting (hub_chat_new). */
void hub_wait_resume(kvp_hub *h);
/* Drain: every waiter is answered overloaded. */
void hub_wait_drain(kvp_hub *h);
/* The hub goes: waiting requests are freed unanswered, their clients' links cut. */
void hub_wait_free(kvp_hub *h);

/* ---- a request's other choices (hub_choices.c) ---- */

/* The turn on src of the request whose other choices ch are (taken from its client) is
 * done: with go, they start (forked from src); ch is freed either way. */
struct kvp_hub_choices;
void hub_choices_run(kvp_hub *h, kvp_session *src, struct kvp_hub_choices *ch, int go);
/* c's request's other choices are forgotten (its turn failed, or c is closed). */
void hub_choices_free(kvp_hub_client *c);
/* c, one of a request's other choices, is closed: that request will not start it. */
void hub_choices_leave(kvp_hub_client *c);

/* ---- a hello's fork (hub_fork.c) ---- */

/* c has no fork waiting for its source's snapshot; else c is told busy (0). */
int hub_fork_idle(kvp_hub_client *c);
/* s's load job ended for c's fork (c->fork_src was s): whether c waited for it. Clears
 * the wait either way. */
int hub_fork_waited(kvp_hub_client *c, const kvp_session *s);
/* The load c's fork waited for succeeded: the fork is made from s now. */
void hub_fork_loaded(kvp_hub_client *c, kvp_session *s);
/* c is closed: a load its fork waits for answers nobody. */
void hub_fork_forget(kvp_hub_client *c);

/* Stored responses (sessions/hub_resp.c): start (the thread, on the storage's store or
 * in memory), stop (joins it; the loop then closes its handle), free, the ops not
 * answered yet (jobs for the drain), and a closing client's ops (answered to nobody). */
int hub_resp_start(kvp_hub *h, char *err, size_t errlen);
void hub_resp_stop(kvp_hub *h);
void hub_resp_free(kvp_hub *h);
int hub_resp_pending(const kvp_hub *h);
void hub_resp_leave(kvp_hub_client *c);

/* ---- the workers' events (hub_events.c) ---- */

/* The scheduler's callback for every event of a job (turns/scheduler.h). */
void hub_on_event(void *ctx, const kvpd_event *ev);

#endif
