/* Which sessions are resident in memory, within max_sessions and max_cache_bytes (loop
 * thread only). The cap counts kvp_cache_bytes of idle resident sessions and, for a
 * session with a job in flight, its reservation: the most its cache can take during the
 * turn, from the model's shape, plus its logprob buffers when it asks for logprobs. So
 * resident bytes stay under the cap even mid-turn. To
 * make room, the least recently used idle sessions are parked (their snapshot is up to
 * date; memory is freed, nothing is written), or without a store the least recently
 * used idle ones no client is attached to are dropped; when that is not enough the job
 * is refused and the client told `overloaded`. Only resident sessions are visited, so the
 * cost is bounded by max_sessions, not by the sessions on disk. */
#ifndef KVP_RESIDENCY_H
#define KVP_RESIDENCY_H

#include <stddef.h>

#include "sessions/hub_state.h"

/* The most one session's cache can take during a turn: every head's allocation for
 * min(budget + chunk, context) rows (the whole context when the policy never evicts).
 * With global budgets (policy.h) a head may hold more and another less, but the heads'
 * allocations together stay under twice (budget + chunk) x heads rows. */
size_t kvp_turn_bytes(const kvp_model_config *m, size_t row_bytes, int budget, int chunk,
                      const char *policy, int budget_mode);
/* The same with the hub's budget and policy in force. */
size_t kvp_hub_turn_bytes(const kvp_hub *h);
/* What the cap counts now, and (when not NULL) the sum of the resident sessions' actual
 * cache bytes and of the shared blocks among them; each shared block counts once, in
 * the bytes of the one session it is charged to. */
size_t kvp_hub_accounted_bytes(kvp_hub *h, size_t *actual, size_t *shared);
/* Makes room for session s, or for a new one when s is NULL (a resident slot), and when
 * `job` is set for a job on it (a turn's reservation), parking idle sessions other than
 * s as needed. `extra`: the job's bytes beside its cache (a turn's logprob buffers,
 * kvp_session_logprobs_bytes), which must fit with it; the caller holds them in
 * s->reserve_lp. On success sets *reserve (cache bytes to hold while the job runs; 0
 * without one). -EBUSY with a message when even parking cannot make room. */
int kvp_hub_admit(kvp_hub *h, kvp_session *s, int job, size_t extra, size_t *reserve,
                  char *why, size_t whylen);
/* Before a session of `tenant` becomes resident (s: the parked one to load, or NULL for
 * a new one; a resident s needs nothing) or, with `job` set, runs a job: at
 * max_sessions_per_tenant resident sessions of that tenant, or when the job's
 * reservation (plus `extra`, as for kvp_hub_admit) would take the tenant's sessions past
 * max_cache_bytes_per_tenant, its own
 * least recently used idle ones are parked (dropped without a store, when no client is
 * attached). 0, or -EBUSY with a message when every one of them is busy or attached
 * (the refusal's retry hint is set): a tenant never makes room by parking another's. */
int kvp_hub_admit_tenant(kvp_hub *h, const kvp_session *s, const char *tenant, int job,
                         size_t extra, char *why, size_t whylen);
/* Parks an idle resident session (kvp_session_parkable) and counts it. */
void kvp_hub_park(kvp_hub *h, kvp_session *s);
/* An idle session leaves memory (its snapshot, if any, stays on disk, and its entry in
 * the transcript index with it): kvp_hub_remove leaves the attached client's pointer to
 * the caller, kvp_hub_drop detaches it too. */
void kvp_hub_remove(kvp_hub *h, kvp_session *s);
void kvp_hub_drop(kvp_hub *h, kvp_session *s);

#endif
