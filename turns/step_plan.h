/* The step planner (turns/step_plan.c): which queued sessions' units go into one
 * batched forward pass on a worker, the pass itself, then each unit's logits sampled and
 * taken in. The scheduler (turns/scheduler.h) calls kvp_turn_batch on its workers;
 * kvp_turn_step runs one session's job alone. */
#ifndef KVP_STEP_PLAN_H
#define KVP_STEP_PLAN_H

#include "turns/session.h"

/* One batched step on a worker's runstate over queued sessions ss[0..n): each TURN
 * takes part with its next unit (its decoded token, or its next prefill chunk of
 * env->chunk tokens) while the unit fits the rows the step has left (rs->max_tokens in
 * all, at least a chunk): every decoding turn first, then the prefill chunks wherever
 * they fit the step's prefill slice (env->prefill_tokens, at least a chunk; 0: the rows
 * left), a chunk never split: a prompt passed over for 4 steps in a row first, then the
 * fewest tokens left to prefill (short prompts, returning sessions' new messages), the
 * earlier request among equals. A prompt's first token is drawn in the step that runs
 * its last chunk. The matrices run once for all of
 * them (kvp_gen_step), while the eviction triggers, context shift, cancel, sampling,
 * stop conditions and failures stay per session. A LOAD or SAVE job runs alone as its
 * unit. Reorders ss: those that took part first (in the order they ran), then the
 * others in their queue order; returns how many took part. more[i] for those: 1 when
 * more work remains, 0 when the job ended (done, error or job was reported: the
 * worker's last touch); *rows: the tokens the forward pass ran. A turn's start (lease,
 * restore, policy, transcript) is a unit of its own that runs alone, outside the pass,
 * as is its end with a store (the snapshot written, then done or error): the units
 * kvp_session_job_next names, which the scheduler runs as jobs on another worker. */
int kvp_turn_batch(kvp_session **ss, int n, const kvp_session_env *env, kvp_runstate *rs,
                   const kvp_turn_sink *sink, int *more, int *rows);
/* A batch of one: advances the session's job by one unit. Returns 1 when more work
 * remains, 0 when the job ended. */
int kvp_turn_step(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs,
                  const kvp_turn_sink *sink);

#endif
