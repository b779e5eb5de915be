/* A session to and from its snapshot (store/snapshot.h, docs/snapshot-format.md).
 * Both run on the worker that owns the session (disk I/O and (de)serialization never
 * run on the loop). */
#ifndef KVP_PERSIST_H
#define KVP_PERSIST_H

#include <stddef.h>

#include "turns/session.h"

/* Puts the session as it is now in env->store (store/store.h). In a store with
 * journals (the directory): a record appended to its journal (what the transcript gained
 * since the last save, the counters and the cache), or, for the first save, after a
 * rebuild or a failed append, and when the journal has grown past the snapshot (or
 * KVP_JOURNAL_MIN_BYTES), a full snapshot that replaces the journal. So a turn's write
 * does not grow with the conversation (amortized: each full rewrite follows at least as
 * many journal bytes). Redis takes whole snapshots. Sets s->res.save_ms and
 * s->res.save_bytes.
 * 0 or a negative code with a message (-ESTALE: another node holds the lease now, or,
 * for a turn's own save (s->save_leased), this node's lease ran out). */
int kvp_session_save(kvp_session *s, const kvp_session_env *env, char *err, size_t errlen);

#define KVP_JOURNAL_MIN_BYTES (1u << 20)

/* Fills a parked session (empty cache and transcript) from its snapshot. When the
 * snapshot's model or policy identity differs from s->pconf's, its cache does not
 * decode, or it would take more than `max_bytes` (0: no limit), the session is rebuilt
 * from its transcript instead: the cache stays empty so the next turn prefills the
 * whole stored transcript (re-tokenized from the messages when the model differs or
 * history was dropped: docs/snapshot-format.md, "Bounded history"). Sets
 * s->res.restored. Errors leave the session empty: -ENOENT (no snapshot) and -EBADMSG (bad
 * file, moved aside) mean the session is lost; others (I/O, memory) may be retried. */
int kvp_session_restore(kvp_session *s, const kvp_session_env *env, size_t max_bytes,
                        char *err, size_t errlen);

/* Worker: drops what memory holds of the conversation (cache, transcript, policy), to be
 * restored from the store (a snapshot newer than memory). */
void kvp_session_forget(kvp_session *s);

/* Token ids from the messages, as the turns would have made them with this model
 * (restoring a transcript, or a session seeded with a conversation). 0 or < 0. */
int kvp_session_retokenize(kvp_session *s, const kvp_session_env *env);

#endif
