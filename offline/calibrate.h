/* Calibration of KVP scores across heads (budget_mode = global): per agent, a monotone
 * piecewise-linear map from its raw score to the row's expected future attention, fitted
 * on a trace's training sequences.
 *
 * For every training sequence the agent scores all rows once (a score depends only on the
 * row's key, value and position). At every cut n of the trace's grid, each row the
 * shared rank-and-keep could evict (past the sinks, before the recent window) gives a pair
 * (score, I_i(n) / (len - n)): its future importance per future query, the oracle's
 * score put on one scale whatever the horizon. The pairs are sorted by score and cut into
 * n_knots bins of equal count; a knot is the bin's mean score and mean target, and the
 * targets are made non-decreasing by pooling adjacent violators (weighted by count), so
 * the map keeps each head's own ranking and only changes how heads compare. */
#ifndef KVP_CALIBRATE_H
#define KVP_CALIBRATE_H

#include <stdio.h>
#include "offline/trace.h"
#include "policy/kvp_agent.h"

/* Fits and installs s's calibration (kvp_agent_set_calibration) from t's training
 * sequences, n_knots (2..KVP_CALIBRATION_MAX_KNOTS) per agent, agents fitted `threads` at
 * a time. Progress on log (may be NULL). 0, or -EINVAL (no training rows, bad sizes) /
 * -ENOMEM with a message. */
int kvp_calibrate_fit(kvp_agent_set *s, const kvp_trace *t, int n_knots, int threads,
                      FILE *log, char *err, size_t errlen);

#endif
