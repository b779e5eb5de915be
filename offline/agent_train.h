/* Training the KVP agents (policy/kvp_agent.h has the network): initialisation and the
 * backward pass that offline/train.c's optimizer drives. Offline only: the daemon scores
 * with trained weights and never links this. */
#ifndef KVP_OFFLINE_AGENT_TRAIN_H
#define KVP_OFFLINE_AGENT_TRAIN_H

#include "policy/kvp_agent.h"

#include <stdint.h>

/* Xavier-uniform matrices, unit-variance position table, zero biases, LayerNorm gains 1.
 * Deterministic for a seed on every platform. */
void kvp_agent_init(const kvp_agent_arch *a, float *params, uint64_t seed);

/* Training: a forward pass that keeps the activations of up to n_max rows, and the
 * backward pass from dL/ds of every row to dL/dparams. One kvp_agent_acts per thread;
 * params are only read, so threads may share them. */
typedef struct kvp_agent_acts kvp_agent_acts;
kvp_agent_acts *kvp_agent_acts_new(const kvp_agent_arch *a, int n_max);   /* NULL: OOM */
void kvp_agent_acts_free(kvp_agent_acts *t);
/* Same scores as kvp_agent_score (batched path). k, v and pos are not copied: they must
 * stay valid until the matching kvp_agent_backward. */
void kvp_agent_forward(kvp_agent_acts *t, const float *params, const float *k,
                       const float *v, const int32_t *pos, int n, float *scores);
/* Adds dL/dparams for the last forward's rows to grad (kvp_agent_n_params floats), given
 * dscores[i] = dL/ds_i; zero grad first for a fresh gradient. */
void kvp_agent_backward(kvp_agent_acts *t, const float *params, const float *dscores,
                        float *grad);

/* Initialises every agent from one seed (each agent gets its own derived stream). */
void kvp_agent_set_init(kvp_agent_set *s, uint64_t seed);

#endif
