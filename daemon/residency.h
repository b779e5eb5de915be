/* Which sessions are resident in memory, within max_sessions and max_cache_bytes (loop
 * thread only). The cap counts kvp_cache_bytes of idle resident sessions and, for a
 * session with a job in flight, its reservation: the most its cache can take during the
 * turn, from the model's shape. So resident bytes stay under the cap even mid-turn. To
 * make room, the least recently used idle sessions are parked (their snapshot is up to
 * date; memory is freed, nothing is written); when that is not enough the job is
 * refused and the client told `overloaded`. */
#ifndef KVPD_RESIDENCY_H
#define KVPD_RESIDENCY_H

#include <stddef.h>

#include "daemon/kvpd.h"

/* The most one session's cache can take during a turn at the current budget: every
 * head's allocation for min(budget + chunk, context) rows (seq_len with no eviction). */
size_t kvpd_turn_bytes(const kvpd *d);
/* The same for a budget and policy not in force yet (a reload checks the cap with it). */
size_t kvpd_turn_bytes_at(const kvpd *d, int budget, const kvp_policy_conf *pc);
/* What the cap counts now, and the sum of the resident sessions' actual cache bytes. */
size_t kvpd_accounted_bytes(const kvpd *d, size_t *actual);
/* Makes room for session s, or for a new one when s is NULL (a resident slot), and when
 * `job` is set for a job on it (a turn's reservation), parking idle sessions other than
 * s as needed. On success sets *reserve (bytes to hold while the job runs; 0 without
 * one). -EBUSY with a message when even parking cannot make room. */
int kvpd_admit(kvpd *d, kvp_session *s, int job, size_t *reserve, char *why, size_t whylen);
/* Parks an idle resident session (kvp_session_parkable) and counts it. */
void kvpd_park(kvpd *d, kvp_session *s);
/* Milliseconds a refused client should wait before trying again. */
int kvpd_retry_hint_ms(const kvpd *d);

#endif
