/* The eviction-quality canary: what eviction costs a turn, measured after the fact.
 *
 * While a sampled turn runs, its session records, for each reply position, what the token
 * was drawn from under eviction: the model's final-normed hidden row (dim floats), from
 * which the output projection gives back the logits exactly (kvp_forward_logits). The
 * pass writes the row where kvp_canary_row points; kvp_canary_note keeps it when the token
 * is drawn (inside the step: a copy of dim floats per position, no vocabulary-sized work).
 * At most KVP_CANARY_MAX_POS positions are kept: a record is the transcript's token ids
 * (4 bytes each) plus 4 x dim bytes per position (3.5 KB for a 896-wide model), grown as
 * the reply grows.
 *
 * After the turn, on a worker and outside every step (observe/background.h), the canary
 * runs the same token stream through the model with a full cache (teacher forced, no
 * eviction, the session's kv_type) and compares each position (kvp_canary_run), over the
 * whole vocabulary, the distributions being the log-softmax of the raw logits (temperature
 * 1, before penalties, biases and truncation):
 *   - KL(full || evicted), in nats;
 *   - top-1 agreement: the two distributions' most likely tokens are the same.
 * A turn's figure is the mean over its positions. */
#ifndef KVP_CANARY_H
#define KVP_CANARY_H

#include <stdint.h>

#include "cache/kvrow.h"
#include "model/model.h"

#define KVP_CANARY_MAX_POS 256

typedef struct kvp_canary_rec {
    char policy[32];
    int budget;                    /* KV rows per head of the turn (0: unbounded) */
    int dim;                       /* floats per hidden row (the model's dim) */
    int *tokens;                   /* the stream: prompt, then the drawn tokens */
    int n_tokens, cap_tokens;
    int reply_from;                /* hidden row i gave the distribution of
                                      tokens[reply_from + i] */
    float *hidden;                 /* [cap_pos][dim]; rows 0..n_pos-1 recorded */
    int n_pos, cap_pos;
    int unusable;                  /* the session's tokens do not start its cache's stream */
} kvp_canary_rec;

/* A record for a turn of a model dim floats wide (loop thread, when it is armed). NULL
 * when out of memory. */
kvp_canary_rec *kvp_canary_rec_new(const char *policy, int budget, int dim);
void kvp_canary_rec_free(kvp_canary_rec *r);
/* Where the pass that gives the next reply position's logits writes its hidden row
 * (kvp_batch_seq.hidden); NULL when nothing more is recorded (unusable, full, or out of
 * memory: the record is then dropped by kvp_canary_note). Worker, inside the step. */
float *kvp_canary_row(kvp_canary_rec *r);
/* Keeps the row written at kvp_canary_row as one reply position: stream[0..n) is the
 * session's transcript the logits follow, hist the tokens dropped before it (a record
 * with hist > 0 is unusable: the cache saw tokens the transcript lost), tok the token
 * drawn. Positions past KVP_CANARY_MAX_POS are not recorded. 0 or -ENOMEM. */
int kvp_canary_note(kvp_canary_rec *r, const int *stream, int n, int64_t hist, int tok);


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
