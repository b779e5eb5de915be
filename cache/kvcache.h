/* Per-session KV cache: one compact store per (layer, KV head).
 * Rows are kept in insertion order (row 0 is the oldest), so "sinks" are the first rows
 * and the "recent window" the last ones; eviction keeps a row subset and compacts in
 * place. Heads hold different tokens, so their lengths differ. Keys and values are
 * stored as the cache's kv_type (f32, f16 or q8_0 rows, cache/kvrow.h); the scores,
 * positions and counters stay full width. */
#ifndef KVP_KVCACHE_H
#define KVP_KVCACHE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/kvrow.h"
#include "cache/rope.h"

#define KVP_MAX_HEAD_DIM 4096

/* Rows shared between caches (kvp_cache_fork_shared): one head's leading rows, frozen.
 * A block is reference-counted (refs, atomic: the caches holding it live on different
 * step workers) and freed by the last kvp_head that lets it go; its rows are never
 * written once it is made, so readers on any thread need no lock. Its bytes are charged
 * to one holder at a time (payer, a kvp_cache id): the cache that made it, then, once
 * that one lets go, the next holder whose bytes are counted (kvp_cache_bytes). */
typedef struct kvp_rows_block {
    atomic_int refs;
    atomic_uint_least64_t payer; /* id of the cache it is charged to, 0: none yet */
    int n;                       /* rows */
    kvp_kv_type type;
    void *k, *v;                 /* [n] rows as in kvp_head */
    int32_t *pos;
    int64_t *seq;
    float *score, *stat;
} kvp_rows_block;

typedef struct kvp_head {
    int n;            /* rows held */
    int cap;          /* rows the private arrays below have room for */
    kvp_kv_type type; /* how k and v rows are stored (the cache's kv_type) */
    void *k;          /* [cap] key rows of kvp_kv_row_bytes(type, head_dim), RoPE-rotated at pos[] */
    void *v;          /* [cap] value rows, the same size */
    int32_t *pos;     /* [cap] RoPE position the key is currently rotated at */
    int64_t *seq;     /* [cap] absolute token index in the conversation (never renumbered) */
    float *score;     /* [cap] policy score, higher = keep */
    float *stat;      /* [cap] policy accumulator (e.g. H2O's attention sum) */
    /* Shared rows: rows [0, n_shared) of the head are rows [sh0, sh0 + n_shared) of blk
     * (read only), and the arrays above hold rows [n_shared, n) at index r - n_shared.
     * Without a block (n_shared 0) the arrays hold every row, index r. Anything that
     * would change a shared row copies the head's rows first (kvp_head_unshare). */
    kvp_rows_block *blk;
    int sh0, n_shared;
} kvp_head;

typedef struct kvp_cache {
    int n_layers, n_kv_heads, head_dim;
    kvp_rope rope;           /* how the keys are rotated; rope.factors is the cache's own copy */
    /* Sliding-window layers (gemma2, gemma3, phi3; kvp_cache_set_windows): window[l] > 0
     * bounds layer l to the rows of its last window[l] tokens (the forward pass drops the
     * older ones, kvp_cache_slide); the budget and the eviction policy apply to the other
     * layers only. Windowed layers rotate with rope_base_swa instead of rope.base. */
    int32_t *window;         /* [n_layers], or NULL: every layer holds the whole context */
    float rope_base_swa;
    float *factors_swa;      /* [rope.n_rot/2] the windowed layers' frequency factors when
                                they differ from rope.factors (gemma3's local layers do not
                                take the linear scaling of its global ones); NULL: the same */
    kvp_head *heads;         /* [n_layers * n_kv_heads] */
    kvp_kv_type kv_type;     /* every head's row type (f32 after init) */
    int next_pos;            /* RoPE position of the next token */
    int64_t n_seen;          /* tokens ever appended: the next token's seq */
    uint64_t evicted_rows;   /* rows dropped by eviction, all heads, all time */
    uint64_t shifts;         /* context shifts performed */
    uint64_t id;             /* unique per cache made (init, fork, restore): who pays a
                                shared block (kvp_rows_block.payer) */
} kvp_cache;

/* rope: the model's RoPE (n_rot <= head_dim); its factors are copied. Rows are f32
 * until kvp_cache_convert chooses another type. */
int kvp_cache_init(kvp_cache *c, int n_layers, int n_kv_heads, int head_dim, const kvp_rope *rope);
/* Stores every head's rows as `type` from now on, re-encoding the rows held (decoded,
 * then stored again: f32 -> q8_0 rounds, q8_0 -> f32 is exact). On an empty cache it
 * just sets the type. 0, -EINVAL (unknown type) or -ENOMEM (the cache is unchanged). */
int kvp_cache_convert(kvp_cache *c, kvp_kv_type type);
void kvp_cache_free(kvp_cache *c);
/* Drops every row (keeps the allocation small again). */
void kvp_cache_reset(kvp_cache *c);

static inline kvp_head *kvp_cache_head(const kvp_cache *c, int layer, int kvh)
{
    return &c->heads[layer * c->n_kv_heads + kvh];
}

/* Sets the layers' sliding windows (window[n_layers], 0: the layer holds the whole
 * context; all 0 or NULL: none) and the RoPE base of the windowed layers. Only on an
 * empty cache (-EBUSY otherwise); 0, -EINVAL or -ENOMEM. */
int kvp_cache_set_windows(kvp_cache *c, const int *window, float rope_base_swa);
/* Sets the windowed layers' frequency factors (copied; NULL: rope.factors), on a cache
 * with windows. 0, -EINVAL (no windows) or -ENOMEM (unchanged). */
int kvp_cache_set_swa_factors(kvp_cache *c, const float *factors);
/* Layer l's window (0: none). */
static inline int kvp_cache_window(const kvp_cache *c, int layer)
{
    return c->window ? c->window[layer] : 0;
}
/* The RoPE layer l's keys are rotated with. */
kvp_rope kvp_cache_layer_rope(const kvp_cache *c, int layer);
/* Drops the rows of every head of windowed layer l that the token seq next_seq and later
 * ones cannot see (seq <= next_seq - window): the oldest rows, positions untouched. Not
 * an eviction (evicted_rows stays). */
void kvp_cache_slide(kvp_cache *c, int layer, int64_t next_seq);

/* Makes room for `rows` rows in total (grows geometrically). 0 or -ENOMEM. */
int kvp_head_reserve(kvp_head *h, int head_dim, int rows);

/* Row r's stored key / value (kvp_kv_row_bytes(h->type, head_dim) bytes). A shared
 * row's (r < n_shared) must not be written. */
static inline void *kvp_head_krow(const kvp_head *h, int head_dim, int r)
{
    size_t rb = kvp_kv_row_bytes(h->type, head_dim);
    if (r < h->n_shared)
        return (uint8_t *)h->blk->k + (size_t)(h->sh0 + r) * rb;
    return (uint8_t *)h->k + (size_t)(r - h->n_shared) * rb;
}
static inline void *kvp_head_vrow(const kvp_head *h, int head_dim, int r)
{
    size_t rb = kvp_kv_row_bytes(h->type, head_dim);
    if (r < h->n_shared)
        return (uint8_t *)h->blk->v + (size_t)(h->sh0 + r) * rb;
    return (uint8_t *)h->v + (size_t)(r - h->n_shared) * rb;
}
/* Row r's position, token index, score and accumulator, shared or not. */
static inline int32_t kvp_head_pos(const kvp_head *h, int r)
{
    return r < h->n_shared ? h->blk->pos[h->sh0 + r] : h->pos[r - h->n_shared];
}
static inline int64_t kvp_head_seq(const kvp_head *h, int r)
{
    return r < h->n_shared ? h->blk->seq[h->sh0 + r] : h->seq[r - h->n_shared];
}
static inline float kvp_head_score(const kvp_head *h, int r)
{
    return r < h->n_shared ? h->blk->score[h->sh0 + r] : h->score[r - h->n_shared];
}
static inline float kvp_head_stat(const kvp_head *h, int r)
{
    return r < h->n_shared ? h->blk->stat[h->sh0 + r] : h->stat[r - h->n_shared];
}
/* The head's private rows [n_shared, n) as a head of their own (no block, index 0 is
 * row n_shared): what a caller that indexes the arrays directly may write. */
static inline kvp_head kvp_head_private(const kvp_head *h)
{
    kvp_head p = *h;
    p.n = h->n - h->n_shared;
    p.blk = NULL;
    p.sh0 = p.n_shared = 0;
    return p;
}
/* Copies the shared rows of h into its own arrays and lets the block go, so that every
 * row is private again (index r); the rows read the same. 0 or -ENOMEM (h unchanged). */
int kvp_head_unshare(kvp_cache *c, kvp_head *h);
/* The same for every head. 0 or -ENOMEM (the heads done stay done; every head reads the
 * same rows either way). */
int kvp_cache_unshare(kvp_cache *c);
/* Keys / values of rows [first, first + n) as f32 rows, head_dim apart: the store itself
 * for f32 heads, else decoded into tmp[n * head_dim]. What a policy reads: the rows
 * attention uses. */
const float *kvp_head_keys(const kvp_head *h, int head_dim, int first, int n, float *tmp);
const float *kvp_head_values(const kvp_head *h, int head_dim, int first, int n, float *tmp);
/* Keeps rows keep[0..n_keep) (strictly increasing indices), compacting in place and
 * releasing capacity that is no longer needed. Counts the dropped rows. Shared rows
 * that stay where they are stay shared; otherwise the head is unshared first (out of
 * memory: nothing is dropped). */
void kvp_cache_keep(kvp_cache *c, kvp_head *h, const int *keep, int n_keep);

/* Takes back the newest n tokens appended (seq >= n_seen - n): their rows leave every
 * head (rows are in insertion order: each head's last ones), n_seen and next_pos step
 * back, as if they had never been run. Not an eviction (evicted_rows stays). For a reply
 * cut back by a stop string. */
void kvp_cache_drop_newest(kvp_cache *c, int n);

/* Forking: *dst (uninitialised, as for kvp_cache_deserialize) becomes a copy of src cut
 * at token `from`: the rows of tokens seq < from, with their positions, scores and
 * counters, in src's shape, kv_type, RoPE and sliding windows; src is not changed. The
 * copy is src's compressed cache cut at the divergence, not a fresh prefill: rows src had
 * already evicted (and rows a windowed layer had slid out) stay out of dst. dst's n_seen
 * is `from` and its next_pos steps back as kvp_cache_drop_newest's would, so dst equals
 * src copied and then cut back by drop_newest(src->n_seen - from). evicted_rows and
 * shifts are src's (the history that made the rows). 0, -EINVAL (from < 0 or past
 * src->n_seen; dst is left zeroed) or -ENOMEM (dst zeroed). */
int kvp_cache_fork(kvp_cache *dst, const kvp_cache *src, int64_t from);
/* The same rows as kvp_cache_fork, shared instead of copied: each head of dst references
 * the rows of src it takes (a block: src's rows become one when they are not one yet,
 * which changes how src stores them, never what it reads), and both sides append,
 * evict, shift and convert on their own from then on (copy-on-write), so neither ever
 * sees a change the other makes. The rows of a head past src's block (src's own rows
 * beyond rows it shares already) are copied. Same results as kvp_cache_fork. */
int kvp_cache_fork_shared(kvp_cache *dst, kvp_cache *src, int64_t from);
/* Bytes the rows of tokens seq < from cost across all heads (what a fork at `from`
 * copies, at kvp_cache_row_cost each; allocation slack not counted). */
size_t kvp_cache_prefix_bytes(const kvp_cache *c, int64_t from);

/* Bytes one row costs in a head of `type`: its key and value rows, pos, seq, score, stat. */
size_t kvp_cache_row_cost(kvp_kv_type type, int head_dim);
/* Bytes allocated for rows across all heads (k, v, pos, seq, score, stat): the private
 * arrays, plus the shared blocks charged to c. A block no holder pays for (its payer let
 * go) is charged to c here, so across caches each shared block counts once. */
size_t kvp_cache_bytes(const kvp_cache *c);
/* Of kvp_cache_bytes(c), the shared blocks' bytes charged to c (the same claim). */
size_t kvp_cache_shared_bytes(const kvp_cache *c);
/* The bytes of every shared block c reads (charged to it or not): what a fork of it
 * saved against a copy. */
size_t kvp_cache_borrowed_bytes(const kvp_cache *c);
/* The private arrays of one head. */
size_t kvp_head_bytes(const kvp_cache *c, const kvp_head *h);
size_t kvp_cache_rows(const kvp_cache *c);       /* sum over heads */
int kvp_cache_max_rows(const kvp_cache *c);      /* largest head */
/* The same over the heads the budget bounds: those of layers without a window. */
size_t kvp_cache_budget_rows(const kvp_cache *c);
int kvp_cache_budget_max_rows(const kvp_cache *c);
int kvp_cache_budget_heads(const kvp_cache *c);

/* Context shift for a model trained on ctx positions: re-rotates kept keys (each layer's
 * RoPE, kvp_cache_layer_rope, by a negative offset) so that next_pos drops to 3/4 of ctx. One map of old to new positions
 * serves every head, so a token sits at the same position in all of them:
 *   - sinks (positions < n_sink) stay;
 *   - rows of the newest quarter of the context keep their exact distances to the next
 *     query (they move down by next_pos - 3/4 ctx);
 *   - older rows are compressed linearly, in order, into [n_sink, ctx/2): they stay far
 *     from the query instead of landing right behind the recent window.
 * Does nothing when next_pos is already at or below 3/4 ctx. Shared heads whose keys move
 * are unshared first. 0 or -ENOMEM (nothing shifted). */
int kvp_cache_shift(kvp_cache *c, int n_sink, int ctx);

/* Serialization for session snapshots: a self-describing buffer with a magic, a version,
 * the shape and a checksum. *buf is malloc'd. */
int kvp_cache_serialize(const kvp_cache *c, void **buf, size_t *len);
/* Restores into an uninitialised *c; rejects a truncated, altered or mis-shaped buffer
 * with a message. Returns 0 or a negative code. */
int kvp_cache_deserialize(kvp_cache *c, const void *buf, size_t len, char *err, size_t errlen);

#endif
