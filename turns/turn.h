/* The turn state machine's units on a worker (turns/turn.c), as the step planner
 * (turns/step_plan.c) calls them. Each returns as kvp_turn_step: 1 when the job has
 * more work, 0 when it ended (its final event reported: the worker's last touch).
 * Private to turns/. */
#ifndef KVP_TURN_H
#define KVP_TURN_H

#include "turns/session.h"

/* The cache's peak rows and bytes over the turn's units, into its stats. */
void turn_note_rows(kvp_session *s);
/* The eviction bounds of the session's next unit: its policy, budget, chunk, budget mode. */
kvp_evict_cfg turn_evict_cfg(const kvp_session *s, const kvp_session_env *env);
/* Ends the turn (stop: "eos", "length", "cancel", "stop"): turn-boundary eviction,
 * transcript, stats. Returns 1 when its end (the snapshot write) is a unit of its own. */
int turn_finish(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                const char *stop);
/* Ends a failed turn so the session stays usable: the cache is dropped and the next turn
 * re-prefills the transcript; with `undo` (before its reply began) the transcript goes
 * back to where this turn found it. */
int turn_fail(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
              int undo, int rc, const char *what, const char *detail);
/* A sampled token: stop, or stream it and keep going. */
int turn_take_token(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                    int tok);
/* A unit run alone, outside any forward pass: a snapshot load or save then the job
 * event, or a turn's start or end. */
int turn_run_job(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink);

#endif
