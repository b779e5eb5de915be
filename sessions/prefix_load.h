/* Fork sources that are not resident: parked conversations (in the hub's prefix index,
 * which keeps them) and conversations known only from the state directory's prefix file
 * (store/prefix_file.h), read at start into an index of their own whose owners are
 * records of an id and a tenant. A new conversation whose rendering such a source shares
 * more of than any resident idle one has its source read first (a load job, the request
 * waiting as for an exact match), then forks it; a load that fails leaves the request to
 * a fresh prefill. Private to sessions/; loop thread.
 *
 * Memory: per conversation known only on disk, its record (96 bytes) and its owner entry
 * in the index (40), plus at most KVP_PREFIX_ENTRY_BYTES per block; records added after
 * the start are freed once read or dropped by the index's bound (kept within twice the
 * conversations the index still holds), within the defaults
 * of store/prefix.h (at most 4096 blocks of a conversation and 512Ki in all). */
#ifndef KVP_PREFIX_LOAD_H
#define KVP_PREFIX_LOAD_H

#include "sessions/hub_impl.h"
#include "store/prefix_file.h"

/* At the hub's start: the records read from the state directory become the on-disk
 * sources (x is emptied). 0, or -ENOMEM (then there are none). */
int hub_prefix_adopt(kvp_hub *h, kvp_prefix_recs *x);
void hub_prefix_disk_free(kvp_hub *h);
/* Conversations known only on disk, still sources (not read since the start). */
int hub_prefix_disk_count(const kvp_hub *h);
/* The bytes their records and index hold (part of kvpd_prefix_index_bytes). */
size_t hub_prefix_disk_bytes(const kvp_hub *h);

/* s, parked, is let go from memory: when its snapshot stays in the store and the hub's
 * index has its blocks, they move to the on-disk sources, so it stays a fork source
 * (read first, as those read at start). */
void hub_prefix_disk_keep(kvp_hub *h, const kvp_session *s);

/* A parked or on-disk conversation to read before a new conversation forks it. */
typedef struct hub_far_source {
    kvp_session *parked;   /* the parked session; NULL: `record` of the on-disk sources */
    void *record;
    char id[KVP_SNAPSHOT_ID_MAX + 1];
    int len;               /* its indexed prefix of the request's rendering; 0: none */
} hub_far_source;

/* The parked or on-disk conversation of c's tenant with the longest indexed prefix of
 * the rendering tok[0..nt), when it is longer than `have` (what the best resident source
 * gives): far->len > 0; else far->len 0. Costs nothing while there is no parked session
 * and no on-disk record. */
void hub_prefix_far_source(kvp_hub *h, const kvp_hub_client *c, const int *tok, int nt,
                           int have, hub_far_source *far);
/* Reads far's snapshot for the request p (taken; c holds no session): a load job, the
 * request waiting on c->pending, then hub_chat_new, which forks it. A read refused is
 * answered (overloaded) and leaves the source known. */
void hub_prefix_load(kvp_hub_client *c, const hub_far_source *far, kvp_hub_pending *p);

#endif
