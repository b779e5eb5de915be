/* The prefix index's conversations on disk, so that a restart rebuilds it without reading
 * a snapshot: STATE_DIR/prefix.index, one line per saved turn,
 *
 *     <id> <tenant, or "-" for none> <blocks> <check, 16 hex> <hash, 16 hex> x blocks
 *
 * the chain hashes of the conversation's token blocks as the index makes them
 * (kvp_prefix_chain: tenant-seeded), at most KVP_PREFIX_MAX_PER of them; blocks 0 says
 * the conversation has no prefix to give (its cache no longer holds its tokens from the
 * start), and the last line of an id wins. The check is a hash of the other fields: a
 * line damaged in any of them is skipped. Appended by the worker that saved the
 * conversation, after its snapshot is written; read and rewritten compacted at start (the
 * last line per id, lines whose snapshot is gone and lines of 0 blocks dropped), and again
 * by an append once the file is past KVP_PREFIX_FILE_COMPACT_MIN bytes and twice its
 * compacted size. A hint, never fsynced: a lost or damaged line costs a fork (a fresh
 * prefill), never a wrong one (the hub compares the tokens once the snapshot is read).
 * Reads are bounded: a line longer than KVP_PREFIX_FILE_LINE_MAX is skipped unread. The
 * file is a hint file (store/hintfile.h: bounded reads, the rewrite, appends and their
 * compaction); this room parses and formats its lines and decides what a load keeps.
 *
 * With Redis instead of a state directory, the same line is kept under the session's
 * hint:<id> key (kvp_prefix_store_put, _load).
 *
 * Bytes per conversation on disk: about 100 plus 17 per block, at most about 70 KB (4096
 * blocks, 65536 tokens), twice that between compactions. */
#ifndef KVP_PREFIX_FILE_H
#define KVP_PREFIX_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "store/prefix.h"
#include "store/snapshot.h"

#define KVP_PREFIX_FILE "prefix.index"
#define KVP_PREFIX_FILE_COMPACT_MIN (256 * 1024)
#define KVP_PREFIX_FILE_TENANT_MAX 16
#define KVP_PREFIX_FILE_LINE_MAX (KVP_SNAPSHOT_ID_MAX + KVP_PREFIX_FILE_TENANT_MAX + 48 + \
                                  17 * KVP_PREFIX_MAX_PER)

/* One conversation's line. */
typedef struct kvp_prefix_rec {
    char id[KVP_SNAPSHOT_ID_MAX + 1];
    char tenant[KVP_PREFIX_FILE_TENANT_MAX + 1];
    int n;              /* blocks */
    uint64_t *chain;    /* [n], malloc'd (NULL when n is 0) */
    long seq;           /* its line's place in the file (the last of an id wins) */
} kvp_prefix_rec;

typedef struct kvp_prefix_recs {
    kvp_prefix_rec *v;
    int n, cap;
} kvp_prefix_recs;

void kvp_prefix_recs_free(kvp_prefix_recs *x);

/* line[0..len) (without its newline) into *r (r->chain malloc'd): 0, or -1 for a line
 * that is not one of ours whole (r then holds nothing to free). */
int kvp_prefix_line_parse(const char *line, size_t len, kvp_prefix_rec *r);
/* The line (with its newline) into buf: its length, or -1 when it does not fit or a field
 * is invalid. A buffer of KVP_PREFIX_FILE_LINE_MAX + 1 bytes holds any line. */
int kvp_prefix_line_format(char *buf, size_t cap, const char *id, const char *tenant,
                           const uint64_t *chain, int n);

/* Reads <dir>/prefix.index (missing: nothing) into x, one record per id (its last line)
 * whose snapshot still exists and that has blocks, skipping damaged and oversized lines;
 * then rewrites the file with those only (a temporary file renamed over it). Returns the
 * records kept, or a negative code with a message; a positive or zero count with err set
 * says how many lines were skipped. Before the hub starts (or under the append lock). */
int kvp_prefix_file_load(kvp_prefix_recs *x, const char *dir, char *err, size_t errlen);
/* Appends id's line to <dir>/prefix.index (O_APPEND, one write, one appending worker at
 * a time), compacting the file when it has grown (see above). 0 or a negative code with a
 * message. */
int kvp_prefix_file_append(const char *dir, const char *id, const char *tenant,
                           const uint64_t *chain, int n, char *err, size_t errlen);

/* The same lines in a shared store (Redis: store/store.h, kvp_store_hint_put), one per
 * session under its id: put replaces it (a worker, after the snapshot's write); load
 * reads every one into x (at most KVP_PREFIX_FILE_LINE_MAX + 1 bytes of each; longer and
 * damaged ones skipped and counted in err's message, as those whose line names another id,
 * has no blocks, or whose snapshot is gone). Load returns the records kept or a negative
 * code with a message; before the hub starts. */
struct kvp_store;
int kvp_prefix_store_put(struct kvp_store *st, const char *id, const char *tenant,
                         const uint64_t *chain, int n, char *err, size_t errlen);
int kvp_prefix_store_load(kvp_prefix_recs *x, struct kvp_store *st, char *err, size_t errlen);

#endif
