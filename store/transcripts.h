/* Conversations by the hash of their transcript (kvp_session_transcript_hash: system text
 * and messages), so that a stateless request (kvp_hub_chat) finds the one it extends
 * among every session — resident, parked, or only on disk after a restart — in O(1).
 *
 * In memory: one entry per session id, in two hash tables (by transcript hash, by id).
 * On disk: STATE_DIR/transcripts.index, one line "<id> <hash, 16 hex> <messages>\n"
 * appended by the worker that saved a session (after its snapshot is written), the last
 * line of an id winning; read and rewritten compacted at start, and again by an append
 * once the file is past KVP_TRANSCRIPTS_COMPACT_MIN bytes and twice its compacted size. The file is a hint,
 * never fsynced: a line lost in a crash costs a match (the request starts a new
 * conversation), never a wrong one (a candidate's transcript is compared once its
 * snapshot is read). The file is a hint file (store/hintfile.h: bounded reads, the
 * rewrite, appends and their compaction); this room parses and formats its lines. Loop
 * thread only, but for kvp_transcripts_append (workers) and kvp_transcripts_load (before
 * the hub starts). */
#ifndef KVP_TRANSCRIPTS_H
#define KVP_TRANSCRIPTS_H

#include <stddef.h>
#include <stdint.h>

#include "store/snapshot.h"

#define KVP_TRANSCRIPTS_FILE "transcripts.index"
#define KVP_TRANSCRIPTS_COMPACT_MIN (64 * 1024)

typedef struct kvp_transcript_entry {
    char id[KVP_SNAPSHOT_ID_MAX + 1];
    uint64_t hash;
    int n_msgs;
    struct kvp_transcript_entry *hnext, *inext;   /* chains: by hash, by id */
} kvp_transcript_entry;

typedef struct kvp_transcripts {
    kvp_transcript_entry **by_hash, **by_id;
    size_t n_buckets;                /* a power of two, for both tables */
    int count;
} kvp_transcripts;

int kvp_transcripts_init(kvp_transcripts *x);
void kvp_transcripts_free(kvp_transcripts *x);
/* id's transcript is now (hash, n_msgs): its entry is replaced. 0 or -ENOMEM. */
int kvp_transcripts_put(kvp_transcripts *x, const char *id, uint64_t hash, int n_msgs);
void kvp_transcripts_remove(kvp_transcripts *x, const char *id);
const kvp_transcript_entry *kvp_transcripts_get(const kvp_transcripts *x, const char *id);
/* The entries with this hash and message count: pass NULL for the first, then the
 * previous one; NULL after the last. */
const kvp_transcript_entry *kvp_transcripts_next(const kvp_transcripts *x, uint64_t hash,
                                                 int n_msgs, const kvp_transcript_entry *prev);

/* Reads <dir>/transcripts.index into x (an empty index: nothing to read), keeping the
 * last line of each id whose snapshot still exists and skipping damaged lines, then
 * rewrites the file with those entries only (a temporary file renamed over it). Costs one
 * pass over the file and one stat per session. Returns the entries kept, or a negative
 * code with a message (x then holds what was read). */
int kvp_transcripts_load(kvp_transcripts *x, const char *dir, char *err, size_t errlen);
/* Appends id's line to <dir>/transcripts.index (O_APPEND, one write per line, one
 * appending worker at a time), then compacts the file when it has grown (see above).
 * 0 or a negative code with a message. */
int kvp_transcripts_append(const char *dir, const char *id, uint64_t hash, int n_msgs,
                           char *err, size_t errlen);

#endif
