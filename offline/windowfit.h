/* Fitting the "kvp" policy's per-layer caps (kvp_agent_set.caps, `kvp fit-window`): how
 * many older rows the agents of each layer choose at a large budget, the rest of the
 * budget going to the newest rows (kvp_agent_recent_window).
 *
 * The measure is the one-shot protocol of `kvp eval` (offline/eval.h) on a trace's
 * training sequences, spread evenly over them so the whole training text is sampled:
 * the first 3/4 of a sequence is run with the policy attached, compressed once to a
 * budget, the rest teacher-forced; the mean KL(full || evicted) at each budget.
 *
 * The caps are a table (kvp_agent_set.caps): per layer, a cap at each of the fit's
 * budgets, used from that budget up to the next. KL at a budget depends only on the caps
 * at that budget, so each budget's column is fitted on its own. Layers are fitted one after
 * the other (coordinate descent, layer 0 first, each on top of the caps already chosen).
 * A layer's candidates are its current caps, the default for the model's context and D,
 * 3D/4, D/2, 3D/8, D/4, 3D/16 and D/8 with D = KVP_AGENT_CAP_DEFAULT(trace seq_len); a
 * candidate whose window at a budget is an earlier one's shares its run. A layer takes
 * one cap: a candidate helps at the budgets where its mean one-shot KL is below (1 -
 * min_gain) times the current cap's, and the layer takes the candidate whose summed log
 * gain over those budgets is the largest, at those budgets only; elsewhere it keeps its
 * caps (one number per layer where it helps, not a free choice per budget, which would
 * fit noise and trade the importance the rows carry for small KL gains). */
#ifndef KVP_WINDOWFIT_H
#define KVP_WINDOWFIT_H

#include <stdio.h>

#include "model/model.h"
#include "offline/eval.h"
#include "offline/trace.h"
#include "policy/kvp_agent.h"

#define KVP_WINDOWFIT_SEQS 64        /* sequences measured by default */

typedef struct kvp_windowfit_opts {
    int seqs;             /* training sequences used, spread evenly (KVP_WINDOWFIT_SEQS) */
    int n_budgets;        /* 0: seq_len / 16, / 8, / 4, / 2; ascending, at most 16 */
    int budgets[KVP_EVAL_MAX_BUDGETS];
    double min_gain;      /* 0.01: a cap must lower the KL at its budget by 1% */
    double max_seconds;   /* 0: no limit; else no layer starts after it has passed */
    int threads;
} kvp_windowfit_opts;

void kvp_windowfit_defaults(kvp_windowfit_opts *o);

typedef struct kvp_windowfit_result {
    int n_budgets, budgets[KVP_EVAL_MAX_BUDGETS];
    int seqs;                                 /* sequences measured */
    int layers_fitted;                        /* layers decided before the time limit */
    double kl_before[KVP_EVAL_MAX_BUDGETS];   /* mean one-shot KL with the caps given */
    double kl_after[KVP_EVAL_MAX_BUDGETS];    /* and with the fitted ones */
} kvp_windowfit_result;

/* Fits set's caps for model m (the weights the set is bound to) on t's training
 * sequences and installs them at the fit's budgets (kvp_agent_set_caps, replacing any
 * table the set had; its other fields are left alone). Progress on log (may be NULL). 0, or -EINVAL (no training sequence of the
 * trace's length, a budget that is not below 3/4 of it) / -ENOMEM / a forward pass's
 * error, with a message; on error the set's caps are unchanged. */
int kvp_windowfit(kvp_agent_set *set, const kvp_model *m, const kvp_trace *t,
                  const kvp_windowfit_opts *o, kvp_windowfit_result *res, FILE *log,
                  char *err, size_t errlen);

#endif
