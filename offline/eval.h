/* Evaluation of eviction policies (`kvp eval`, docs/evaluation.md). Four protocols, each
 * comparing a policy with the unmodified model, three on held-out text:
 *   ranking    the first `cut` tokens of a sequence run with the policy attached (so
 *              attention-based policies observe them); per (layer, KV head) the policy's
 *              order of the rows is scored against their future importance I_i(cut)
 *              (kvp-method.md): C/C* over all budgets, and at each budget the importance
 *              the policy's eviction drops, against the oracle's, and keeps;
 *   oneshot    that cache compressed once to each budget, then the rest of the sequence
 *              teacher-forced: perplexity and KL(full || evicted) of the next-token
 *              distributions (the paper's protocol);
 *   streaming  a text longer than the context through kvp_gen_prefill with chunked
 *              eviction and the context shift (the daemon's protocol): perplexity, and
 *              fidelity to the model itself: at every `every`-th position, KL(reference
 *              || policy) of the next-token distributions and top-1 agreement, the
 *              reference being the model with a full window (kvp_eval_stream_ref);
 * and one on chat prompts:
 *   replies    the model's own greedy reply to a prompt, decoded under eviction as the
 *              daemon decodes it, against a full cache fed the same tokens: at every
 *              reply position, KL(full || evicted) of the next-token distributions over
 *              the whole vocabulary and top-1 agreement (what the daemon's eviction
 *              canary estimates, observe/canary.h, computed exactly).
 * kvzip's scores are KVzip's (kvp_eval_kvzip_scores): of the prefix in the first two, of
 * the cache before every chunk in streaming; like the oracle it has no replies.
 * The oracle's scores are true future importance: I_i(cut) in the first two; in streaming,
 * before every chunk, the attention the next `lookahead` tokens pay each row, measured on
 * a copy of the cache (shifted first when the lookahead would pass the context); it has
 * no replies (its scores need the future of a reply not yet drawn). */
#ifndef KVP_EVAL_H
#define KVP_EVAL_H

#include <stddef.h>

#include "model/forward.h"
#include "model/template.h"
#include "policy/policy.h"

#define KVP_EVAL_MAX_BUDGETS 16
/* rows kvp_eval_rows adds for one policy at most */
#define KVP_EVAL_ROWS_PER_POLICY (1 + 10 * KVP_EVAL_MAX_BUDGETS)

typedef struct kvp_eval_opts {
    int cut;          /* tokens in the cache when it is ranked / compressed (384) */
    int chunk;        /* streaming: eviction chunk (KVP_DEFAULT_CHUNK) */
    int lookahead;    /* streaming: tokens the oracle's scores look ahead (128) */
    int n_budgets;
    int budgets[KVP_EVAL_MAX_BUDGETS];   /* rows per KV head */
    kvp_kv_type kv_type;                 /* the policies' cache rows (the references: f32) */
    int budget_mode;                     /* enum kvp_budget_mode: per head or global */
    int reply_len;                       /* replies: tokens drawn at most (256) */
    int kvzip;                           /* the references carry KVzip's scores (kvzip runs) */
} kvp_eval_opts;

/* The unmodified model on one sequence of len tokens: what every policy is compared with.
 * Heads are numbered layer * n_kv_heads + kvh. */
typedef struct kvp_eval_ref {
    int len, cut, n_heads, vocab, n_budgets;
    int budgets[KVP_EVAL_MAX_BUDGETS];
    float *imp;            /* [n_heads][cut] I_i(cut): attention of tokens cut..len-1 */
    float *logits;         /* [len - cut][vocab] full-cache logits at tokens cut..len-1 */
    double *min_evicted;   /* [n_budgets][n_heads] importance the oracle's eviction drops */
    float *zip;            /* [n_heads][cut] KVzip's scores of the prefix rows (NULL unless
                            * opts->kvzip) */
    double nll;            /* summed over the len - 1 predictions of the whole sequence */
    kvp_kv_type kv_type;   /* rows of the caches the policies are run on (opts) */
    int budget_mode;       /* how the policies' budgets apply (opts) */
} kvp_eval_ref;

/* Sums over the cases evaluated for one policy (kvp_eval_rows turns them into metrics). */
typedef struct kvp_eval_acc {
    long cases;                                   /* ranking: (sequence, head) cases */
    double cc_ratio;                              /* sum of C/C* */
    double evicted[KVP_EVAL_MAX_BUDGETS];         /* importance dropped */
    double min_evicted[KVP_EVAL_MAX_BUDGETS];     /* the oracle's, same cases */
    double recall[KVP_EVAL_MAX_BUDGETS];          /* sum of kept / total importance */
    long tokens;                                  /* oneshot: predictions per budget */
    double nll[KVP_EVAL_MAX_BUDGETS], kl[KVP_EVAL_MAX_BUDGETS];
    long stream_tokens[KVP_EVAL_MAX_BUDGETS];     /* streaming: predictions */
    double stream_nll[KVP_EVAL_MAX_BUDGETS];
    long stream_samples[KVP_EVAL_MAX_BUDGETS];    /* streaming: positions compared with */
    double stream_kl[KVP_EVAL_MAX_BUDGETS];       /* the reference, their KL and */
    long stream_top1[KVP_EVAL_MAX_BUDGETS];       /* top-1 agreements */
    long reply_convs[KVP_EVAL_MAX_BUDGETS];       /* replies: conversations used, */
    long reply_skipped[KVP_EVAL_MAX_BUDGETS];     /* left out (past the context), */
    long reply_draws[KVP_EVAL_MAX_BUDGETS];       /* tokens drawn in the used ones; */
    double reply_kl[KVP_EVAL_MAX_BUDGETS];        /* sums over the used conversations of */
    double reply_top1[KVP_EVAL_MAX_BUDGETS];      /* each one's mean KL and top-1 share */
} kvp_eval_acc;

/* What the model itself predicts with a full window, at the sampled positions of one
 * stream of len tokens: t = every - 1, 2 every - 1, ... below len - 1 (the prediction of
 * token t + 1). While t is below the context the window is the plain full cache of
 * tokens[0..t]; past it, the model run fresh on the last context - 1 tokens,
 * tokens[t - context + 2..t], after BOS when the model has one. Shared by every policy
 * and budget streamed over that text. */
typedef struct kvp_eval_stream_ref {
    int len, every, n_pos, vocab;
    int *pos;              /* [n_pos] the positions t */
    float *logits;         /* [n_pos][vocab] */
} kvp_eval_stream_ref;

/* KVzip (Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context
 * Reconstruction", arXiv 2505.23416, 2025): the importance of a cached row is the
 * attention it receives when the model, after the context, is made to repeat that
 * context. On a copy of c the model is fed KVP_KVZIP_PROMPT and then, teacher-forced, the
 * tokens c's rows hold (tokens[seq] of every seq some head holds, in order, BOS left out),
 * in chunks that each start from a fresh copy of c, so every chunk attends to c's rows
 * as they are (the paper's chunked scoring of long contexts); a chunk is at most
 * s->max_tokens tokens with the prompt and fits the context left after c's newest
 * position (the copy's context is shifted first, kvp_cache_shift, when fewer than
 * KVP_KVZIP_MIN_CHUNK tokens would fit). A row's score is the largest attention any
 * query of the repeated tokens (not the prompt's) pays it, max over the KV group's query
 * heads: written into
 * c->heads[..].score (c's rows and counters are not changed). tokens: the text c was fed,
 * indexed by seq. s: any run state of the model (its hooks are cleared). 0, -ERANGE when
 * the prompt and a chunk cannot fit the context, or another negative code. */
#define KVP_KVZIP_PROMPT "\n\nRepeat the previous context exactly.\n"
#define KVP_KVZIP_MIN_CHUNK 16
int kvp_eval_kvzip_scores(const kvp_model *m, kvp_runstate *s, kvp_cache *c, const int *tokens);

/* Allocates r for sequences of len tokens (cut < len <= the model's context). */
int kvp_eval_ref_init(kvp_eval_ref *r, const kvp_model_config *cfg, int len,
                      const kvp_eval_opts *o);
void kvp_eval_ref_free(kvp_eval_ref *r);
/* Fills r for tokens[0..len) (BOS first). s must hold blocks of r->len tokens; the
 * s->policy is NULL afterwards. 0 or a negative code. */
int kvp_eval_ref_compute(kvp_eval_ref *r, const kvp_model *m, kvp_runstate *s,
                         const int *tokens);

/* Ranking and oneshot protocols for policy p (a fresh instance: it keeps per-sequence
 * state) on the sequence r was computed for; adds to acc. "none" keeps every row, so it
 * only gets the oneshot protocol (the full-cache numbers). 0 or a negative code. */
int kvp_eval_sequence(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *tokens,
                      const kvp_eval_ref *r, kvp_eval_acc *acc);
/* The oneshot protocol in two parts, for callers that compress one prefix many ways
 * (offline/windowfit.h). kvp_eval_prefix: tokens[0..r->cut) run into *prefix (a new cache
 * of r->kv_type rows; kvp_cache_free it) with p attached (the oracle's scores are
 * r->imp). kvp_eval_oneshot: a copy of that prefix compressed once to `budget` rows by p
 * (r->budget_mode), then tokens[r->cut..r->len) teacher-forced on it; adds the summed
 * KL(full || evicted) of its r->len - r->cut - 1 predictions to *kl. 0 or a negative
 * code. */
int kvp_eval_prefix(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *tokens,
                    const kvp_eval_ref *r, kvp_cache *prefix);
int kvp_eval_oneshot(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *tokens,
                     const kvp_eval_ref *r, const kvp_cache *prefix, int budget, double *kl);

int kvp_eval_stream_ref_init(kvp_eval_stream_ref *r, const kvp_model_config *cfg, int len,
                             int every);
void kvp_eval_stream_ref_free(kvp_eval_stream_ref *r);
/* Fills r for tokens[0..len) (bos: the model's BOS id, -1 if none). s must hold blocks
 * of `every` tokens. 0 or a negative code. */
int kvp_eval_stream_ref_compute(kvp_eval_stream_ref *r, const kvp_model *m, kvp_runstate *s,
                                const int *tokens, int bos);

/* Streaming protocol for policy p (fresh, not "none") at budgets[bi] over tokens[0..len),
 * len >= 2; s must hold blocks of chunk and lookahead tokens. ref (NULL: perplexity only)
 * was computed for the same tokens. Adds to acc. */
int kvp_eval_stream(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *tokens,
                    int len, int bi, const kvp_eval_opts *o, const kvp_eval_stream_ref *ref,
                    kvp_eval_acc *acc);

/* One conversation of the replies protocol (kvp_eval_replies). tokens and kl are the
 * caller's (NULL, or room for opts->reply_len values), the rest is filled in. */
typedef struct kvp_eval_reply {
    int *tokens;          /* the tokens drawn, in order */
    double *kl;           /* each draw's KL(full || evicted), nats */
    int draws;            /* tokens drawn, a stop token included: the reply positions */
    int agree;            /* draws whose most likely token is the same in both runs */
    int skipped;          /* the conversation would pass the context: not in acc */
    double kl_mean;       /* mean KL over the draws (0 when skipped) */
    double top1;          /* agree / draws (0 when skipped) */
} kvp_eval_reply;

/* Replies protocol for policy p (fresh: it keeps per-conversation state; not the oracle
 * or kvzip:
 * -EINVAL) at budgets[bi] on one rendered prompt prompt[0..n_prompt) (the tokens of a
 * conversation's first turn, up to the start of the reply). Two caches: the policy's
 * (rows of o->kv_type; kvp_gen_prefill / kvp_gen_decode with {p, budget, o->chunk,
 * o->budget_mode}, the daemon's eviction config) and a full one (f32, no policy, no
 * eviction; prefilled in the blocks the policy's run uses, so that without eviction the
 * two runs are the same computation). At every step, p = the full run's logits and q
 * the evicted run's for the same position: KL(p || q) over the whole vocabulary
 * (kvp_logits_kl, model/logprobs.h) and top-1 agreement (first index of the largest logit in each); the
 * token drawn is the daemon's greedy choice from q (model/sampler.h at temperature 0).
 * The reply ends at a stop token of t (kvp_template_is_stop) or after o->reply_len
 * draws, the last draw counted; otherwise the token is fed to both. A conversation whose
 * prompt + draws - 1 tokens would pass the model's context (the canary's refusal rule),
 * or whose prompt alone does, is skipped: acc->reply_skipped[bi] counts it. A used one
 * adds its mean KL and top-1 share (every conversation weighs the same) and its draws to
 * acc. s: any run state of the model (its hooks are cleared). out may be NULL. 0 or a
 * negative code. */
int kvp_eval_replies(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const kvp_template *t,
                     const int *prompt, int n_prompt, int bi, const kvp_eval_opts *o,
                     kvp_eval_reply *out, kvp_eval_acc *acc);

/* Position of a policy name in kvp_policy_names(), -1 if it is not one. */
int kvp_eval_policy_index(const char *name);

/* dst += src, field by field (sums from separate runs, e.g. one per thread). */
void kvp_eval_acc_add(kvp_eval_acc *dst, const kvp_eval_acc *src);

/* One result: protocol "ranking" | "oneshot" | "streaming" | "replies"; metric "cc_ratio"
 * (C/C*, budget 0 = all budgets), "cost" (evicted importance / the oracle's), "recall"
 * (share of the importance kept), "ppl", "kl", "top1" (streaming: share of the sampled
 * positions whose most likely next token is the reference's; replies: the mean over
 * conversations of each one's share of reply positions whose most likely token is the
 * full cache's), "reply_len" (replies: mean tokens drawn per conversation). Replies' kl
 * is the mean over conversations of each one's mean over its reply positions. Strings
 * are static or the caller's policy name. */
typedef struct kvp_eval_row {
    const char *protocol, *policy, *metric;
    int budget;
    double value;
} kvp_eval_row;

/* Appends the metrics of one policy's sums (a protocol without cases adds nothing);
 * returns the rows added (at most KVP_EVAL_ROWS_PER_POLICY). */
int kvp_eval_rows(const char *policy, const kvp_eval_acc *a, const kvp_eval_opts *o,
                  kvp_eval_row *rows);

/* DIR/results.csv (protocol,policy,budget,metric,value), DIR/results.md (one table per
 * protocol and metric: policies x budgets; `intro` markdown goes first) and one SVG per
 * protocol and per-budget metric, DIR/<protocol>-<metric>.svg. 0 or -errno + message. */
int kvp_eval_write(const char *dir, const kvp_eval_row *rows, int n, const char *intro,
                   char *err, size_t errlen);

#endif
