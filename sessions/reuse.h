/* Which held conversation a request reuses when none holds its history exactly
 * (kvp_hub_chat's fallback): the hub's choice of a session to continue from an earlier
 * point (turns/rewind.h). Loop thread; private to sessions/. */
#ifndef KVP_REUSE_H
#define KVP_REUSE_H

#include "sessions/hub_state.h"

/* The resident idle session of c's tenant, with the request's system text and its whole
 * history kept, that shares the most leading messages with msgs[0..n) and that the
 * request continues from within its last turn (the shared messages reach at least its
 * last user message: a regenerated reply, an edited last message, a reply sent back
 * changed), the one it names (id) first. Cutting it back in place loses only the reply
 * the request replaces; a request that continues from further back forks instead
 * (kvp_reuse_fork_find), so the branch it leaves stays usable. NULL when none; a session
 * another client is attached to, or an ephemeral one, is never taken. */
kvp_session *kvp_reuse_rewind_find(kvp_hub *h, const kvp_hub_client *c, const char *id,
                                   const char *system, size_t system_len,
                                   const kvp_message *msgs, int n);

/* The idle resident session of c's tenant and of the policy in force, with the request's
 * system text, its whole history kept and its cache built, that a new session for
 * msgs[0..n) best forks from (turns/rewind.h, kvp_session_fork): the most leading
 * messages shared, at least one, or none when the system text is not empty (a shared
 * system prompt); then the most tokens cached, then the newest. *shared gets the messages
 * shared. NULL when none. */
kvp_session *kvp_reuse_fork_find(kvp_hub *h, const kvp_hub_client *c, const char *system,
                                 size_t system_len, const kvp_message *msgs, int n,
                                 int *shared);

/* The leading messages s shares with msgs[0..n) (0 when the system texts differ). */
int kvp_reuse_shared_msgs(const kvp_session *s, const char *system, size_t system_len,
                          const kvp_message *msgs, int n);
/* Whether s may be forked from for a new session of c (loop): idle and resident with its
 * policy made, not ephemeral, of c's tenant and of the policy in force, its cache holding
 * exactly its tokens from the conversation's start. */
int kvp_reuse_fork_source_ok(const kvp_hub *h, const kvp_hub_client *c, const kvp_session *s);

/* A turn's cached tokens into the metrics' reuse counters, by their source. */
void kvp_reuse_count(kvpd_metrics *m, const kvp_turn_stats *st);

#endif
