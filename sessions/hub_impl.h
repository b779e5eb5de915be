/* What the files of the hub (hub.c: the client API and attachment; hub_match.c:
 * matching stateless requests; hub_events.c: the workers' events; hub_life.c: start,
 * expiry, shutdown; hub_stats.c: what the endpoints show) share beyond the hub's state
 * (sessions/hub_state.h). Private to sessions/; loop thread. */
#ifndef KVP_HUB_IMPL_H
#define KVP_HUB_IMPL_H

#include "sessions/hub.h"
#include "sessions/hub_state.h"
#include "sessions/step_plan.h"   /* kvp_turn_batch, the workers' step (hub_life.c) */

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
    kvp_turn_opts o;                 /* its stop strings point into stops, its biases
                                      * into bias */
    char *stops[KVP_HUB_MAX_STOPS];
    kvp_logit_bias *bias;
    char *tools, *prefix, *end_after;   /* the copies o's tool options point to */
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

/* ---- a request's other choices (hub_choices.c) ---- */

/* The turn on src of the request whose other choices ch are (taken from its client) is
 * done: with go, they start (forked from src); ch is freed either way. */
struct kvp_hub_choices;
void hub_choices_run(kvp_hub *h, kvp_session *src, struct kvp_hub_choices *ch, int go);
/* c's request's other choices are forgotten (its turn failed, or c is closed). */
void hub_choices_free(kvp_hub_client *c);
/* c, one of a request's other choices, is closed: that request will not start it. */
void hub_choices_leave(kvp_hub_client *c);

/* ---- the workers' events (hub_events.c) ---- */

/* The scheduler's callback for every event of a job (sessions/scheduler.h). */
void hub_on_event(void *ctx, const kvpd_event *ev);

#endif
