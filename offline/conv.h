/* The conversation protocol of `kvp eval` (docs/evaluation.md "Conversations"): what
 * eviction costs over a multi-turn conversation, evicting as the daemon evicts. A story
 * of held-out text is split over the user turns; after each user turn the model draws a
 * greedy reply. The policy's cache (kvp_gen_prefill / kvp_gen_decode with the daemon's
 * eviction config, kvp_gen_compress at every turn's end, the turn boundary) is compared
 * with a full cache (f32, no policy) fed the same tokens in the same blocks:
 *   per turn   the mean KL(full || evicted) of the reply's next-token distributions;
 *   recall     at user turn N (each of recall_at), the user asks for turn 1 again: on
 *              copies of both caches as that turn finds them, a cue and then turn 1's
 *              text (BOS left out) are teacher-forced without eviction; the recall score
 *              is the mean log-likelihood per token of turn 1's text, in nats (the full
 *              cache's beside it). The conversation itself goes on without the cue.
 * With `protect` the policy is wrapped so that the rows a turn-boundary compression kept
 * rank above every newer row at later evictions (among themselves by the policy's own
 * scores): a compressed turn's rows are only dropped when they alone exceed the budget. */
#ifndef KVP_CONV_H
#define KVP_CONV_H

#include "offline/eval.h"

#define KVP_CONV_MAX_TURNS 16
#define KVP_CONV_MAX_RECALL 4
/* What the recall turn's user says before turn 1's text is teacher-forced. */
#define KVP_CONV_CUE "\nTell me the start of the story again.\n"

typedef struct kvp_conv_opts {
    int turns;        /* user turns with story text (7) */
    int turn_len;     /* story tokens per user turn (40; turn 1's begin with BOS) */
    int reply_len;    /* tokens each reply draws (24) */
    int n_recall;
    int recall_at[KVP_CONV_MAX_RECALL];   /* user turns that ask for turn 1: 2..turns + 1 */
    int protect;      /* rows kept at a turn boundary rank above newer rows */
} kvp_conv_opts;

void kvp_conv_defaults(kvp_conv_opts *o);
/* Story tokens one conversation reads: turns x turn_len (BOS first). */
int kvp_conv_story_len(const kvp_conv_opts *o);
/* Positions one conversation takes at most (its longest run, the last recall's
 * included), for a cue of n_cue tokens. */
int kvp_conv_positions(const kvp_conv_opts *o, int n_cue);
/* 0 when o is usable with a model of context ctx and a cue of n_cue tokens; otherwise
 * -EINVAL / -E2BIG with a message in err. */
int kvp_conv_check(const kvp_conv_opts *o, int ctx, int n_cue, char *err, size_t errlen);

/* One conversation (kvp_conv_run). */
typedef struct kvp_conv_result {
    int n_tokens;                          /* tokens fed to the conversation's caches */
    int user_at[KVP_CONV_MAX_TURNS];       /* token index where user turn k's text begins */
    int reply_at[KVP_CONV_MAX_TURNS];      /* ... and where its reply begins */
    int rows_after[KVP_CONV_MAX_TURNS];    /* largest head after turn k's compression */
    double turn_kl[KVP_CONV_MAX_TURNS];    /* mean KL over turn k's reply positions */
    double recall[KVP_CONV_MAX_RECALL];    /* mean log-likelihood of turn 1's text */
    double recall_full[KVP_CONV_MAX_RECALL];
    double kept_t1[KVP_CONV_MAX_RECALL];   /* share of turn 1's rows the policy's cache
                                            * still holds at each recall (all heads) */
} kvp_conv_result;

/* Sums over conversations, per budget. */
typedef struct kvp_conv_acc {
    long convs[KVP_EVAL_MAX_BUDGETS];
    double kl[KVP_EVAL_MAX_BUDGETS];    /* each conversation's mean over its turns */
    double turn_kl[KVP_EVAL_MAX_BUDGETS][KVP_CONV_MAX_TURNS];
    double recall[KVP_EVAL_MAX_BUDGETS][KVP_CONV_MAX_RECALL];
    double recall_full[KVP_EVAL_MAX_BUDGETS][KVP_CONV_MAX_RECALL];
    double kept_t1[KVP_EVAL_MAX_BUDGETS][KVP_CONV_MAX_RECALL];
} kvp_conv_acc;

/* One conversation for policy p (fresh; not the oracle: -EINVAL; kvzip is scored before
 * every eviction by kvp_eval_kvzip_scores) at eo->budgets[bi] (eo->chunk,
 * eo->budget_mode, eo->kv_type rows). story: kvp_conv_story_len(o) tokens; cue: n_cue
 * tokens. With o->protect, p is wrapped for the run (and still the caller's; per-head
 * budgets only: -EINVAL with a global one). s: any run
 * state of the model holding blocks of eo->chunk tokens and of n_cue + turn_len (its
 * hooks are cleared). out may be NULL. Adds to acc. 0 or a negative code. */
int kvp_conv_run(const kvp_model *m, kvp_runstate *s, kvp_policy *p, const int *story,
                 const int *cue, int n_cue, int bi, const kvp_eval_opts *eo,
                 const kvp_conv_opts *o, kvp_conv_result *out, kvp_conv_acc *acc);

void kvp_conv_acc_add(kvp_conv_acc *dst, const kvp_conv_acc *src);
/* Rows of protocol "conversation": metrics kl, kl_t1..kl_tK, recall_N (the policy's),
 * recall_gap_N (the full cache's minus the policy's) and kept_t1_N per budget. Returns the count (at most KVP_CONV_ROWS_PER_POLICY). */
#define KVP_CONV_ROWS_PER_POLICY \
    (KVP_EVAL_MAX_BUDGETS * (1 + KVP_CONV_MAX_TURNS + 3 * KVP_CONV_MAX_RECALL))
int kvp_conv_rows(const char *policy, const kvp_conv_acc *a, const kvp_eval_opts *eo,
                  const kvp_conv_opts *o, kvp_eval_row *rows);

#endif
