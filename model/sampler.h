/* Next-token sampling: greedy (temperature 0), temperature, top-k, top-p, min-p, the
 * frequency / presence / repetition penalties and per-token logit biases; seeded
 * xorshift so a seed reproduces a run. Whatever the logits (NaN, +-inf, all equal), the
 * token is an index in [0, vocab_size).
 *
 * The order of a draw: penalties (over the tokens drawn since the last
 * kvp_sampler_set_opts / kvp_sampler_reset: the current reply), then logit biases, then
 * greedy or softmax at the temperature, then min-p, top-k, top-p over what is left
 * (renormalized), then one draw. Every stage is one pass over the vocabulary plus a
 * bounded selection: no sort of the whole distribution (see sampler.c). */
#ifndef KVP_SAMPLER_H
#define KVP_SAMPLER_H

#include <stdint.h>

/* Temperatures below this are greedy: dividing by them only amplifies rounding. */
#define KVP_SAMPLER_GREEDY_BELOW 1e-3f
/* logit_bias entries a request may set. */
#define KVP_SAMPLER_MAX_BIAS 1024
/* A bias at or below this bans the token (OpenAI: -100 "should result in a ban"). */
#define KVP_SAMPLER_BAN_BIAS (-100.0f)

typedef struct kvp_logit_bias {
    int token;
    float bias;          /* [-100, 100], added to the token's logit */
} kvp_logit_bias;

/* Settings beyond temperature and top-p; all zeros: none of them. */
typedef struct kvp_sample_opts {
    int top_k;                  /* keep the k most likely tokens (0: all) */
    float min_p;                /* [0, 1]: keep tokens with p >= min_p * p(most likely) */
    float frequency_penalty;    /* [-2, 2] (OpenAI): logit -= count * frequency_penalty */
    float presence_penalty;     /* [-2, 2] (OpenAI): logit -= presence_penalty once seen */
    float repetition_penalty;   /* (0, 10] (CTRL / llama.cpp): a seen token's logit is
                                 * divided by it when > 0, multiplied when <= 0; 0 or 1: off */
    const kvp_logit_bias *bias; /* n_bias entries (copied by kvp_sampler_set_opts) */
    int n_bias;
} kvp_sample_opts;

typedef struct kvp_sampler_hist kvp_sampler_hist;

typedef struct kvp_sampler {
    int vocab_size;
    float temperature;  /* < KVP_SAMPLER_GREEDY_BELOW: greedy */
    float top_p;        /* 1 = off */
    int top_k;
    float min_p;
    float frequency_penalty, presence_penalty, repetition_penalty;
    kvp_logit_bias *bias;
    int n_bias;
    uint64_t rng;
    struct { float p; int i; } *scratch;
    /* the tokens drawn since the last reset, with their counts (only with a penalty) */
    int *hist_tok, *hist_cnt, *hist_slot;
    int n_hist, cap_hist;
} kvp_sampler;

int kvp_sampler_init(kvp_sampler *s, int vocab_size, float temperature, float top_p, uint64_t seed);
/* Restarts the random stream: the same seed draws the same tokens again. */
void kvp_sampler_seed(kvp_sampler *s, uint64_t seed);
void kvp_sampler_free(kvp_sampler *s);
/* Whether o holds values the sampler takes (each in the range above, bias tokens in
 * [0, vocab_size)); 0 or -EINVAL with the offending field's name in *field. */
int kvp_sample_opts_check(const kvp_sample_opts *o, int vocab_size, const char **field);
/* Takes o's settings (NULL: none) and forgets the drawn tokens: call at a reply's start.
 * 0, -EINVAL (as kvp_sample_opts_check; nothing changes) or -ENOMEM. */
int kvp_sampler_set_opts(kvp_sampler *s, const kvp_sample_opts *o);
/* Forgets the drawn tokens the penalties count. */
void kvp_sampler_reset(kvp_sampler *s);
/* Samples from logits (modified in place) and counts the token for the penalties. */
int kvp_sample(kvp_sampler *s, float *logits);
/* The distribution kvp_sample would draw from (without drawing or counting): n tokens
 * in ids[] with their probabilities in p[] (each array vocab_size long); returns n. */
int kvp_sampler_dist(kvp_sampler *s, float *logits, int *ids, float *p);
/* Uniform float in [0,1) from a xorshift64* state (shared by sampler and policies). */
float kvp_rand_f32(uint64_t *state);
/* The softmax path in use: "avx2" or "scalar" (KVP_SIMD=scalar forces the latter). */
const char *kvp_sampler_simd(void);

#endif
