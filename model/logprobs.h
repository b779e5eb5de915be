/* Log-probabilities of a logit row as OpenAI's `logprobs` report them: the model's own
 * distribution, a log-softmax at temperature 1 of the raw logits (before any penalty,
 * bias or grammar mask), for the drawn token and the k most likely alternatives. One
 * pass over the vocabulary for the normalizer plus a bounded selection of k entries: no
 * sort of the row. */
#ifndef KVP_LOGPROBS_H
#define KVP_LOGPROBS_H

/* The most alternatives a request may ask for (OpenAI's bound on top_logprobs). */
#define KVP_LOGPROBS_MAX_TOP 20

typedef struct kvp_logprob {
    int token;
    float logprob;       /* natural log; -inf for a token the row gives no mass */
} kvp_logprob;

/* logits[0..vocab): the raw row. *chosen_out gets the chosen token's log-probability;
 * top[0..return) the min(k, vocab) most likely tokens, most likely first, equal
 * logprobs in token order. k is clamped to [0, KVP_LOGPROBS_MAX_TOP]. NaN logits count
 * as -inf; +inf logits share the whole mass. Returns the number of entries in top, or
 * -1 for vocab <= 0 or chosen outside [0, vocab). */
int kvp_logprobs(const float *logits, int vocab, int chosen, int k, kvp_logprob *chosen_out,
                 kvp_logprob *top);

/* KL(softmax(p) || softmax(q)) of two raw logit rows [vocab], in nats; exactly 0 when
 * they are equal. What eviction costs a prediction (kvp eval, the live canary). */
double kvp_logits_kl(const float *p, const float *q, int vocab);
/* log sum exp x[i] over n >= 1 values, summed in double from the largest. */
double kvp_log_sum_exp(const float *x, int n);

#endif
