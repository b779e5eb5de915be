/* Generation with bounded memory: the prefill/decode drivers every caller (kvp generate,
 * eval, the daemon) uses. They run the eviction triggers and the context shift:
 *   - prefill runs in chunks of `chunk` tokens; before a chunk (or a decoded token)
 *     would take any head past budget + chunk rows, every head is evicted back to
 *     `budget`. So a head never holds more than budget + chunk rows, even during the
 *     forward pass, and decode evicts once every `chunk` tokens. With global budgets
 *     (mode KVP_BUDGET_GLOBAL) the session's heads share budget x heads rows: eviction
 *     runs before the total would pass (budget + chunk) x heads or a head its cap +
 *     chunk (kvp_policy_evict_global);
 *   - kvp_gen_compress evicts to `budget` now (turn boundaries);
 *   - before next_pos would reach the model's context length the cache is shifted
 *     (kvp_cache_shift), so a conversation can run forever.
 * The drivers attach e->policy to the sequence's forward hooks (so it scores and
 * observes the rows it will rank); with e NULL the runstate's own hooks, if any, serve. budget 0 or policy "none" never evicts (the context shift then drops nothing, so a
 * session without eviction is limited to seq_len tokens: -E2BIG past it). */
#ifndef KVP_GENERATE_H
#define KVP_GENERATE_H

#include "model/forward.h"
#include "policy/policy.h"

/* Tokens per prefill chunk, and the slack a head may grow past the budget. */
#define KVP_DEFAULT_CHUNK 32

typedef struct kvp_evict_cfg {
    kvp_policy *policy;   /* NULL = none */
    int budget;           /* rows per KV head (global: on average), 0 = unbounded */
    int chunk;            /* 0: KVP_DEFAULT_CHUNK */
    int mode;             /* enum kvp_budget_mode (policy.h); 0 = per head */
} kvp_evict_cfg;

/* Feeds tokens; last logits in s->logits; all_logits NULL or [n][vocab]. */
int kvp_gen_prefill(const kvp_model *m, kvp_runstate *s, kvp_cache *c,
                    const kvp_evict_cfg *e, const int *tokens, int n, float *all_logits);
/* One token (equivalent to prefill of 1 with the decode trigger). */
int kvp_gen_decode(const kvp_model *m, kvp_runstate *s, kvp_cache *c,
                   const kvp_evict_cfg *e, int token);
/* One batched step (continuous batching): each sequence's block goes through the same
 * bounds as a single feed (the eviction trigger, the context shift; with its own
 * evict[i], which may be NULL), then one kvp_forward_batch runs them all. seqs[i]: its
 * cache, block and logits (model/forward.h); the hooks are set here. A sequence whose
 * bounds or pass fail gets rc < 0 and the others run. Returns 0, or negative when the
 * batch is malformed (then nothing ran). */
int kvp_gen_step(const kvp_model *m, kvp_runstate *s, kvp_batch_seq *seqs,
                 const kvp_evict_cfg *const *evict, int n_seqs);
/* Positions the context has left for more tokens: without eviction seq_len minus the
 * cache's next position (a block past them fails, -E2BIG); with it INT_MAX (the context
 * shifts). */
int kvp_gen_room(const kvp_model *m, const kvp_cache *c, const kvp_evict_cfg *e);
/* Evicts every head down to the budget. Returns rows dropped. */
int kvp_gen_compress(kvp_cache *c, const kvp_evict_cfg *e);

#endif
