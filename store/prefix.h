/* The prefix index: which held conversation has cached the longest prefix of a token
 * list. A conversation's tokens are cut into blocks of KVP_PREFIX_BLOCK tokens; block i
 * is indexed by a chain hash of blocks 0..i seeded by the conversation's tenant, so a
 * hit at block i means the whole prefix up to it matches (up to a 64-bit hash collision:
 * the caller compares the tokens themselves before using a hit) and the hashes of two
 * tenants never meet (a lookup also compares the tenant's seed, and the caller's filter
 * is the last word). Only whole blocks are indexed: a hit is a multiple of the block,
 * and the caller extends it token by token against the owner's tokens.
 *
 * Bounded: at most max_per blocks of a conversation (its first max_per * 16 tokens) and
 * max_total blocks in all; putting a conversation past the total drops the least
 * recently used conversations' entries whole. Memory: an entry is 24 bytes, its id in
 * its owner's list 4, its bucket head 4 to 8 (buckets are a power of two, at least one
 * per entry) and the entry array grows by doubling up to max_total, so a block indexed
 * costs at most KVP_PREFIX_ENTRY_BYTES: 240 KiB for a conversation at the 4096-block cap
 * (65536 tokens); at the 512Ki-block total the index holds at most 12 MiB of entries,
 * 2 MiB of ids and 4 MiB of buckets, plus 40 bytes per conversation.
 *
 * Owners are opaque pointers (the hub's sessions); one thread uses an index. */
#ifndef KVP_PREFIX_H
#define KVP_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#define KVP_PREFIX_BLOCK 16
#define KVP_PREFIX_MAX_PER 4096             /* blocks per conversation */
#define KVP_PREFIX_MAX_TOTAL (512 * 1024)   /* blocks in all */
/* an entry (24) with the array's doubling slack (x2), its id (4), two bucket heads (8) */
#define KVP_PREFIX_ENTRY_BYTES 60

typedef struct kvp_prefix_index kvp_prefix_index;

/* max_per, max_total <= 0: the defaults above. NULL when out of memory. */
kvp_prefix_index *kvp_prefix_create(int max_per, int max_total);
void kvp_prefix_free(kvp_prefix_index *ix);

/* Indexes owner's tokens[0..n) under tenant (NULL or "": the default tenant), replacing
 * what owner had. n <= 0 or fewer than a block: owner is just removed. 0 or -ENOMEM
 * (owner is then not indexed). */
int kvp_prefix_put(kvp_prefix_index *ix, const void *owner, const char *tenant,
                   const int *tokens, int n);
/* The chain hashes of tenant's tokens[0..n): out[b] is block b's (the hash put and looked
 * up under), for at most max blocks. Returns the blocks written. Any thread. */
int kvp_prefix_chain(const char *tenant, const int *tokens, int n, uint64_t *out, int max);
/* As kvp_prefix_put, from chain[0..blocks) as kvp_prefix_chain made them (a conversation
 * known by its hashes only, read back from disk). */
int kvp_prefix_put_chain(kvp_prefix_index *ix, const void *owner, const char *tenant,
                         const uint64_t *chain, int blocks);
/* owner's chain hashes as put (out[b] is block b's), at most max; the blocks written (0
 * when owner is not indexed). With kvp_prefix_put_chain, moves a conversation from one
 * index to another without its tokens. */
int kvp_prefix_owner_chain(const kvp_prefix_index *ix, const void *owner, uint64_t *out,
                           int max);
/* Forgets owner (nothing when it is not indexed). */
void kvp_prefix_remove(kvp_prefix_index *ix, const void *owner);

/* Whether owner may serve the lookup (idle, the same policy, ...): nonzero accepts. */
typedef int (*kvp_prefix_filter)(void *ctx, const void *owner);
/* The owner of tenant's conversations with the longest indexed prefix of tokens[0..n)
 * that filter (NULL: any) accepts, and *len that prefix's length in tokens (a multiple of
 * KVP_PREFIX_BLOCK); ties go to the most recently put or hit. NULL and *len 0 when none. */
const void *kvp_prefix_lookup(kvp_prefix_index *ix, const char *tenant, const int *tokens,
                              int n, kvp_prefix_filter filter, void *ctx, int *len);

/* Bytes the index holds (entries, buckets, owners). */
size_t kvp_prefix_bytes(const kvp_prefix_index *ix);
/* Blocks indexed in all, and for owner (0 when not indexed). */
size_t kvp_prefix_blocks(const kvp_prefix_index *ix);
int kvp_prefix_owner_blocks(const kvp_prefix_index *ix, const void *owner);
/* Conversations dropped to stay within max_total, all time. */
uint64_t kvp_prefix_evictions(const kvp_prefix_index *ix);

#endif
