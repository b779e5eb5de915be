/* The stages of `kvp learn` as functions: each `kvp <stage>` command parses its flags into
 * one of these option structs and calls its run function, and `kvp learn` fills the
 * structs itself and calls the same functions in order. Each struct's defaults come from
 * its *_defaults function (the values `--help` prints); a run returns the process exit
 * status (0 ok, 1 runtime error, 2 a setting the model or trace cannot take). */
#ifndef KVP_TOOLS_STAGES_H
#define KVP_TOOLS_STAGES_H

#include <stdint.h>

#include "offline/train.h"
#include "offline/windowfit.h"
#include "policy/kvp_agent.h"

/* kvp trace */
typedef struct {
    const char *model, *tokenizer;   /* tokenizer: NULL for the file's own or beside it */
    const char *text;                /* plain text, or a conversations file (below) */
    int conversations;               /* text is JSONL conversations, rendered with the template */
    const char *out;                 /* directory; the trace goes to OUT/trace.kvpt */
    long seq_len, max_seqs;          /* tokens per sequence; sequences on both sides of the split */
    long cut_min, cut_stride, cut_tail;   /* the grid of cuts the targets are computed at */
    double split;                    /* share of the text before the validation part */
    double max_seconds;              /* 0: no limit; else trace only what fits (re-planned) */
    int targets;                     /* enum kvp_trace_targets: future importance or KVzip's */
} kvp_trace_opts;
void kvp_trace_defaults(kvp_trace_opts *o);
int kvp_trace_run(const kvp_trace_opts *o);

/* kvp policy-init */
typedef struct {
    const char *model, *tokenizer, *out;
    uint64_t seed;
    kvp_agent_arch arch;             /* d is taken from the model */
} kvp_policy_init_opts;
void kvp_policy_init_defaults(kvp_policy_init_opts *o);
int kvp_policy_init_run(const kvp_policy_init_opts *o);

/* kvp train */
typedef struct {
    const char *traces, *out;        /* traces: a kvp trace output directory */
    const char *init;                /* NULL: the default agent sizes, initialised from cfg.seed */
    const char *curve;               /* NULL: OUT.csv */
    kvp_train_cfg cfg;               /* log and curve are set by the run */
} kvp_train_opts;
void kvp_train_opts_defaults(kvp_train_opts *o);
int kvp_train_run(const kvp_train_opts *o);

/* kvp calibrate */
typedef struct {
    const char *traces, *in, *out;
    int knots, threads;
} kvp_calibrate_opts;
void kvp_calibrate_defaults(kvp_calibrate_opts *o);
int kvp_calibrate_run(const kvp_calibrate_opts *o);

/* kvp fit-window */
typedef struct {
    const char *model, *tokenizer, *traces, *in, *out;
    kvp_windowfit_opts fit;
} kvp_fit_window_opts;
void kvp_fit_window_defaults(kvp_fit_window_opts *o);
int kvp_fit_window_run(const kvp_fit_window_opts *o);

/* kvp eval */
typedef struct {
    const char *model, *tokenizer, *text, *out;
    int conversations;               /* text is JSONL conversations */
    const char *policies;            /* comma-separated; NULL: every policy (kvp with a file) */
    const char *policy_file;         /* the kvp policy's file */
    const char *kvzap_file;          /* kvzap's: agents trained on KVzip targets (NULL: no kvzap) */
    const char *budgets;             /* comma-separated rows per KV head; NULL: the default */
    double split;                    /* the held-out part starts after this share of the text */
    long seqs, seq_len, cut;         /* one-shot and ranking: sequences, length, compression cut */
    long streams, stream_len, chunk; /* streaming: streams, length (0: 4 x context), chunk */
    long lookahead, kl_every, seed, threads;
    int kv_type, budget_mode;        /* kvp_kv_type, KVP_BUDGET_* */
    const char *prompts;             /* one user message a line: the replies protocol alone
                                        (text NULL) */
    long max_prompts;                /* 0: every non-empty line */
    long reply_len;                  /* replies: tokens drawn at most */
    long dialogs;                    /* > 0: the conversation protocol alone, on that many
                                        conversations of the held-out text */
    long turn_len, turn_reply;       /* conversation: story tokens per user turn, reply tokens */
    int protect_turns;               /* conversation: every policy also with per-turn
                                        protection ("P+protect") */
} kvp_eval_cli_opts;
void kvp_eval_defaults(kvp_eval_cli_opts *o);
int kvp_eval_run(const kvp_eval_cli_opts *o);

/* The threads a stage uses by default: the online CPUs. */
int kvp_stage_threads(void);

#endif
