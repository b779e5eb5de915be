/* The merge loop both tokenizers share: a doubly linked list of symbols and a max-heap of
 * candidate merges of adjacent pairs, applied best first. SentencePiece ranks a pair by
 * its piece's score, byte-level BPE by its merge rank (priority = -rank, exact below
 * 2^24 merges); ties go to the leftmost pair. */
#ifndef KVP_MERGES_H
#define KVP_MERGES_H

typedef struct kvp_sym {
    int tok, prev, next;   /* tok -1: merged into its left neighbour */
} kvp_sym;

typedef struct kvp_merge {
    float priority;        /* higher first */
    int left, right;       /* symbol indices */
    int ltok, rtok;        /* their tokens when queued: a later merge makes it stale */
    int id;                /* the merged token */
} kvp_merge;

typedef struct kvp_merges {
    kvp_sym *syms;
    kvp_merge *heap;       /* room for 3 candidates per symbol: each merge queues at most 2 */
    int nheap;
} kvp_merges;

void kvp_merges_push(kvp_merges *m, kvp_merge c);

/* Links syms[0..n) in order and merges until no candidate is left. pair(ctx, left) queues
 * the pair (left, syms[left].next) if it merges (it is called with left = -1 and for a
 * last symbol too). The result is the list from syms[0]. */
void kvp_merges_run(kvp_merges *m, int n, void (*pair)(void *ctx, int left), void *ctx);

#endif
