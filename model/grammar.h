/* Byte-level grammars for constrained decoding: a recursive transition network (states
 * joined by byte-range, epsilon and call arcs; a call pushes its return state), the
 * incremental matcher that follows it byte by byte (a pushdown automaton: a small set of
 * threads, each a state and a stack of return states), and the trie of a vocabulary's
 * byte strings that gives the tokens allowed next in one walk.
 *
 * Shapes and units: states and arcs are int32 indices; a document is the bytes of the
 * root rule; a thread's stack is a chain of frames in the matcher's arena (depth at most
 * KVP_GRAMMAR_MAX_DEPTH); a mask is a bitset of vocab_size bits, bit i set when token i
 * may come next. Grammars are immutable once built and shared by reference count. */
#ifndef KVP_GRAMMAR_H
#define KVP_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"

/* A grammar larger than these is refused: states, arcs, arcs out of one state. */
#define KVP_GRAMMAR_MAX_STATES (1 << 18)
#define KVP_GRAMMAR_MAX_ARCS (1 << 20)
#define KVP_GRAMMAR_MAX_FANOUT 2048
#define KVP_GRAMMAR_MAX_DEPTH 256          /* return states on one thread's stack */
#define KVP_GRAMMAR_MAX_THREADS 128        /* threads the matcher follows at once */


typedef struct kvp_grammar kvp_grammar;

/* Building: states are made, joined, and one rule (a start state whose end states are
 * marked) is the root. Every call fails only for lack of memory or room: the builder then
 * remembers the failure (-ENOMEM; -E2BIG past KVP_GRAMMAR_MAX_STATES, -EFBIG past
 * KVP_GRAMMAR_MAX_ARCS, -EMLINK past KVP_GRAMMAR_MAX_FANOUT arcs out of one state) and
 * kvp_grammar_finish returns NULL. */
typedef struct kvp_gbuild kvp_gbuild;

kvp_gbuild *kvp_gbuild_new(void);
void kvp_gbuild_free(kvp_gbuild *b);
int kvp_gbuild_state(kvp_gbuild *b);                                   /* its id, or -1 */
void kvp_gbuild_range(kvp_gbuild *b, int from, unsigned lo, unsigned hi, int to);
void kvp_gbuild_eps(kvp_gbuild *b, int from, int to);
/* From `from`: run the rule starting at `start`; where it ends, go on at `ret`. */
void kvp_gbuild_call(kvp_gbuild *b, int from, int start, int ret);
void kvp_gbuild_end(kvp_gbuild *b, int state);                 /* the rule may end here */
/* The literal bytes from `from`; returns the state after them (-1 on failure). */
int kvp_gbuild_literal(kvp_gbuild *b, int from, const char *s, size_t len);
int kvp_gbuild_failed(const kvp_gbuild *b);   /* a failure above, or 0 */
int kvp_gbuild_count(const kvp_gbuild *b);    /* states made */
/* The grammar whose documents are the root rule's (root: a start state); frees b. Paths
 * that can never end are dropped. NULL with *rc: the builder's failure, -ENOMEM, or
 * -ENOENT when no document is finite. */
kvp_grammar *kvp_grammar_finish(kvp_gbuild *b, int root, int *rc);

/* Distances: for each state, the fewest bytes that finish its rule from there (calls
 * counted with their own rule's fewest bytes), made when the grammar is finished; a
 * thread's distance adds those of the return states on its stack. KVP_GRAMMAR_FAR: no
 * way to finish (or more bytes than any reply). kvp_grammar_min_len: the shortest
 * document's bytes. */
#define KVP_GRAMMAR_FAR (1 << 30)
int kvp_grammar_min_len(const kvp_grammar *g);

kvp_grammar *kvp_grammar_ref(kvp_grammar *g);
void kvp_grammar_unref(kvp_grammar *g);   /* NULL is fine */
int kvp_grammar_states(const kvp_grammar *g);

/* A thread: a state with byte arcs, and its stack (a frame index, -1 at the root). */
typedef struct kvp_gthread {
    int32_t state, frame;
} kvp_gthread;

typedef struct kvp_gset {
    int n;
    int complete;        /* the bytes so far are a whole document */
    kvp_gthread t[KVP_GRAMMAR_MAX_THREADS];
} kvp_gset;

typedef struct kvp_gmatch {
    kvp_grammar *g;      /* a reference */
    int32_t *ret, *parent;   /* frames: the return state, the frame below (-1: none) */
    uint16_t *depth;
    int n_frames, cap_frames;
    int32_t *htab;       /* the frames by (ret, parent): each stack is made once */
    int hcap, hused;
    kvp_gset cur;        /* where the bytes accepted so far lead */
    kvp_gset *level;     /* the trie walk's sets, one per depth (max piece length + 1) */
    int n_level;
    void *scratch;       /* the closure's work list and visit marks (grammar.c) */
    const int32_t *dist; /* the states' distances: the grammar's, or own (kvp_gmatch_bind) */
    int32_t *own_dist;
    int32_t *fdist;      /* frames: the distances of the return states on the stack */
    void *cache;         /* recent masks by thread set (grammar.c) */
    int shaped;          /* the last mask's length budget left out a token it allowed */
    long cache_hits;     /* masks the cache gave (kvp_gmatch_mask_left) */
    long cut_walks;      /* masks the budget cut short */
    /* Work units: one per arc tested, closure expansion, and pair of threads or stack
     * frames compared. work counts them all (masks and accepts); limit is where the mask
     * in progress stops (LONG_MAX outside one); mask_work is what the last mask took. */
    long work, limit, mask_work;
} kvp_gmatch;

/* At the document's start. 0 or -ENOMEM. */
int kvp_gmatch_init(kvp_gmatch *m, kvp_grammar *g);
void kvp_gmatch_free(kvp_gmatch *m);
/* Accepts len bytes: 0, or -EINVAL when they cannot continue a document (nothing
 * changes), -ENOMEM. */
int kvp_gmatch_accept(kvp_gmatch *m, const char *bytes, size_t len);
/* Whether the bytes so far are a whole document; whether nothing can follow them. */
int kvp_gmatch_complete(const kvp_gmatch *m);
int kvp_gmatch_closed(const kvp_gmatch *m);
/* The fewest bytes (once bound to a trie, tokens: kvp_gmatch_bind) that finish the
 * document from the bytes so far (0 when whole). */
int kvp_gmatch_distance(const kvp_gmatch *m);

/* The vocabulary as a trie of byte strings in preorder: node i spells the path to it,
 * its subtree is [i, skip[i]), tokens tok[off[i] .. off[i+1]) spell exactly it. Control,
 * user-defined and unknown tokens are left out (text never holds them); byte tokens are
 * their byte. */
typedef struct kvp_vocab_trie {
    int vocab_size;
    int n_nodes;
    uint8_t *byte;
    uint16_t *depth;     /* 1 for a first byte */
    int32_t *skip;
    int32_t *off;        /* [n_nodes + 1] */
    int32_t *tok;
    int max_len;         /* the longest piece kept */
    int n_end;           /* the tokens that end a reply (set by the caller) */
    int n_lone;          /* bytes with a one-byte token */
    uint32_t lone[8];    /* those bytes as a bitset */
    int end_tok[8];
} kvp_vocab_trie;

int kvp_vocab_trie_build(kvp_vocab_trie *tr, const kvp_tokenizer *t);
void kvp_vocab_trie_free(kvp_vocab_trie *tr);

/* The tokens that may come next into mask (vocab_size bits, all written): those whose
 * bytes continue a document (all of them unless the walk reaches the budget below), and
 * the trie's end tokens only when the document is whole. Returns how many are allowed
 * (0: none; the caller ends the reply), or -ENOMEM. */
int kvp_gmatch_mask(kvp_gmatch *m, const kvp_vocab_trie *tr, uint32_t *mask);
/* The work units (kvp_gmatch's counter) one mask may take on trie tr: PER_NODE per node
 * of the trie plus BASE, about twice what one thread's whole walk of the trie takes (a
 * plain schema's masks are never cut: inside a string, where nearly every token may
 * follow, a walk takes about 10 units per node). A mask that reaches it stops there and
 * offers the tokens found so far (all valid; the one-byte tokens first); when none was
 * found by then, one more step (at most KVP_GRAMMAR_STEP_WORK) offers the first byte
 * that may come next, so a document that can go on always has a token. A mask runs over
 * the budget by at most KVP_GRAMMAR_MASK_OVERRUN (that step; and past the limit one
 * thread's arcs, one closure expansion and the threads one step compares); an accept of
 * a token it offered repeats at most the steps of that token's path. */
#define KVP_GRAMMAR_WORK_PER_NODE 16L
#define KVP_GRAMMAR_WORK_BASE 65536L
#define KVP_GRAMMAR_STEP_WORK (1L << 17)
#define KVP_GRAMMAR_MASK_OVERRUN \
    (KVP_GRAMMAR_STEP_WORK +                                                       \
     2L * (2L * KVP_GRAMMAR_MAX_FANOUT + KVP_GRAMMAR_MAX_THREADS * KVP_GRAMMAR_MAX_THREADS))
long kvp_grammar_mask_budget(const kvp_vocab_trie *tr);

/* The length budget. kvp_gmatch_bind turns the matcher's distances into tokens of trie
 * tr: a byte counts as one token (arcs of bytes without a one-byte token are left out),
 * and a run of forced bytes (a literal: a key, a call's frame) as the fewest tokens of
 * tr that spell it, so a document D away can always be finished in at most D tokens;
 * 0 or -ENOMEM. Unbound, distances are bytes.
 * kvp_gmatch_mask_left is kvp_gmatch_mask for a reply with `left` tokens to go (this one
 * included; < 0: no limit): it offers only tokens after which the document can still be
 * finished in left - 1 tokens, and the end tokens once it is whole, so a reply that
 * starts within its distance (kvp_gmatch_distance <= left) always ends whole. m->shaped
 * says whether it left out a token the grammar allowed. Its last few masks are kept by
 * thread set, with the tokens leading farther than the set's own distance: when that
 * set comes back they are given again, less the far tokens that no longer fit. */
int kvp_gmatch_bind(kvp_gmatch *m, const kvp_vocab_trie *tr);
int kvp_gmatch_mask_left(kvp_gmatch *m, const kvp_vocab_trie *tr, uint32_t *mask, int left);
/* Sets the logits of the tokens mask leaves out to -inf. */
void kvp_grammar_apply_mask(float *logits, const uint32_t *mask, int vocab_size);

#endif
