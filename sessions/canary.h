/* The eviction-quality canary: what eviction costs a turn, measured after the fact.
 *
 * While a sampled turn runs, its session records, for each reply position, the
 * distribution the token was drawn from under eviction: the model's log-softmax of the
 * raw logits (temperature 1, before penalties, biases and truncation) at its top
 * KVP_CANARY_TOPK tokens, plus the drawn token's (kvp_canary_note, inside the step:
 * compute only, O(vocabulary) per position). At most KVP_CANARY_MAX_POS positions are
 * kept: a record is the transcript's token ids (4 bytes each) plus 136 bytes per
 * position, about 35 KB at most beyond the transcript.
 *
 * After the turn, on a worker and outside every step (sessions/background.h), the
 * canary runs the same token stream through the model with a full cache (teacher
 * forced, no eviction, the session's kv_type) and compares each position
 * (kvp_canary_run):
 *   - KL(full || evicted) on the partition {recorded tokens S, the rest}: the sum over S
 *     of p log(p / q), plus p_rest log(p_rest / q_rest) with p_rest = 1 - p(S) and
 *     q_rest = 1 - q(S) (q floored at 1e-12). Merging tokens never raises a KL, so this
 *     is a lower bound of the full-vocabulary KL, equal to it when the tokens outside S
 *     carry no mass under either distribution;
 *   - top-1 agreement: the full cache's most likely token is the evicted run's.
 * A turn's figure is the mean over its positions. */
#ifndef KVP_CANARY_H
#define KVP_CANARY_H

#include <stdint.h>

#include "cache/kvrow.h"
#include "model/model.h"

#define KVP_CANARY_TOPK 16
#define KVP_CANARY_MAX_POS 256

typedef struct kvp_canary_pos {
    int32_t id[KVP_CANARY_TOPK];   /* the evicted run's top tokens, most likely first */
    float lp[KVP_CANARY_TOPK];     /* their log-probabilities (natural log) */
    int32_t tok;                   /* the token drawn */
    float tok_lp;
} kvp_canary_pos;

typedef struct kvp_canary_rec {
    char policy[32];
    int budget;                    /* KV rows per head of the turn (0: unbounded) */
    int *tokens;                   /* the stream: prompt, then the drawn tokens */
    int n_tokens, cap_tokens;
    int reply_from;                /* pos[i] is the distribution of tokens[reply_from + i] */
    kvp_canary_pos *pos;
    int n_pos;
    int unusable;                  /* the session's tokens do not start its cache's stream */
} kvp_canary_rec;

/* A record for a turn (loop thread, when it is armed). NULL when out of memory. */
kvp_canary_rec *kvp_canary_rec_new(const char *policy, int budget);
void kvp_canary_rec_free(kvp_canary_rec *r);
/* One reply position (worker, before the sampler changes logits[vocab]): stream[0..n)
 * is the session's transcript the logits follow and hist the tokens dropped before it
 * (a record with hist > 0 is unusable: the cache saw tokens the transcript lost).
 * Positions past KVP_CANARY_MAX_POS are not recorded. 0 or -ENOMEM. */
int kvp_canary_note(kvp_canary_rec *r, const int *stream, int n, int64_t hist,
                    const float *logits, int vocab, int tok);

/* One position's estimate against the full cache's log-probabilities full_lp[vocab]
 * (normalised); *agree: whether their most likely tokens are the same. */
double kvp_canary_kl_pos(const kvp_canary_pos *q, const float *full_lp, int vocab, int *agree);
/* logits[vocab] into log-probabilities in place; returns the index of the largest. */
int kvp_canary_log_softmax(float *logits, int vocab);

typedef struct kvp_canary_result {
    double kl;                     /* mean over the positions, nats */
    double top1;                   /* share of positions whose top-1 agree */
    int positions;
} kvp_canary_result;

/* The run returned because busy(ctx) said so between two chunks. */
#define KVP_CANARY_YIELDED 1
/* The full-cache reference for a record on model m: chunks of `chunk` tokens (the rows
 * of rs, which the caller made for the model), busy(ctx) asked before each (NULL: never
 * yields). 0 with *out, KVP_CANARY_YIELDED, or a negative code with a message (-E2BIG:
 * longer than the model's context). */
struct kvp_runstate;
int kvp_canary_run(const kvp_model *m, struct kvp_runstate *rs, kvp_kv_type kv_type, int chunk,
                   const kvp_canary_rec *r, int (*busy)(void *), void *ctx,
                   kvp_canary_result *out, char *err, size_t errlen);

#endif
