/* What the two runs of `kvp learn` (from a model's data, tools/cmd_learn.c, and from
 * kvpd's transcripts, tools/cmd_learn_transcripts.c) share: where their files go, the
 * settings they give the policy-init, train and calibrate stages, the cut validation
 * ranks at, and installing the calibrated policy. */
#ifndef KVP_TOOLS_LEARN_COMMON_H
#define KVP_TOOLS_LEARN_COMMON_H

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>

#include "model/model.h"
#include "tools/stages.h"

/* The options both runs take, and their values. */
typedef struct {
    const char *model, *tokenizer, *out, *work, *budgets;
    long seq_len, max_seqs, steps, eval_seqs, threads, seed;
    long fit_seqs;                         /* fit-window's sequences; 0: no fit */
    int max_seqs_given, eval_seqs_given;   /* --max-seqs, --eval-seqs were given */
} kvp_learn_args;

/* Their getopt_long entries (--help is 'h', for the caller's own usage text). */
#define KVP_LEARN_OPTIONS                                                                   \
    {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'z'}, {"out", 1, 0, 'o'},                     \
    {"work", 1, 0, 'w'}, {"budgets", 1, 0, 'b'}, {"seq-len", 1, 0, 'n'},                     \
    {"max-seqs", 1, 0, 'N'}, {"steps", 1, 0, 's'}, {"eval-seqs", 1, 0, 'e'},                 \
    {"threads", 1, 0, 't'}, {"seed", 1, 0, 'r'}, {"fit-seqs", 1, 0, 'f'},                   \
    {"help", 0, 0, 'h'}

/* The value arg of option c (one of KVP_LEARN_OPTIONS but 'h') into a: 1, or 0 when arg
 * is out of its range; -1 when c is none of them. */
int kvp_learn_option(int c, const char *arg, kvp_learn_args *a);

/* Parses argv with getopt_long over opts (KVP_LEARN_OPTIONS and the run's own): each
 * option goes to own(c, optarg, ctx) (1 taken, 0 a bad value, -1 not its), else to
 * kvp_learn_option into a. --help prints usage to stdout and returns 0; an unknown option
 * prints it to stderr, a bad value names itself, and both return 2; -1 when every option
 * was taken (the caller checks what is required). */
int kvp_learn_getopt(int argc, char **argv, const struct option *opts, kvp_learn_args *a,
                     int (*own)(int c, const char *arg, void *ctx), void *ctx,
                     void (*usage)(FILE *f));

/* The settings both runs give every stage. */
typedef struct {
    const char *model, *tokenizer;
    const char *work;          /* the directory the trace and the policy files go to */
    long seq_len, max_seqs, steps, threads, seed;
} kvp_learn_run;

/* out: the given --out, else kvpd's default for the model (KVP_DATA_DIR/policy/weights/
 * <model file stem>.kvp); work: the given --work, else /tmp/<prefix>-<model file stem>,
 * created with mode. 0, or -1 with a message when work cannot be created. */
int kvp_learn_dirs(const char *model, const char *out_opt, const char *work_opt,
                   const char *prefix, unsigned mode, char *out, size_t out_len, char *work,
                   size_t work_len);

/* The model's shape (and, when not NULL, whether it has a chat template and its weights'
 * megabytes), loaded and let go again. 0, or 1 with a message (kvp learn's exit status). */
int kvp_learn_model_shape(const kvp_learn_args *a, kvp_model_config *cfg, int *has_template,
                          double *weights_mb);

/* The cut validation and evaluation rank at: the first 3/4 of a sequence, down to a cut
 * of the trace's grid. */
long kvp_learn_val_cut(long seq_len);

/* The stages' options: the trace of text (conversations: as kvp_trace_opts has it) into
 * work, max_seqs sequences of seq_len tokens; the model's agents at the default sizes with positions up to
 * seq_len (init written to init); training on work's trace from init to trained at
 * lr 3e-3, 16 episodes of 8 samples, stopping after max_seconds (0: no limit);
 * calibration of trained into calibrated. */
void kvp_learn_trace_opts(const kvp_learn_run *r, const char *text, int conversations,
                          kvp_trace_opts *to);
void kvp_learn_policy_init_opts(const kvp_learn_run *r, const char *init,
                                kvp_policy_init_opts *po);
void kvp_learn_train_opts(const kvp_learn_run *r, const char *init, const char *trained,
                          long val_cut, double max_seconds, kvp_train_opts *tr);
void kvp_learn_calibrate_opts(const kvp_learn_run *r, const char *trained,
                              const char *calibrated, kvp_calibrate_opts *co);
/* The per-layer caps fitted into the calibrated file in place, on seqs of work's training
 * sequences, no layer started past max_seconds (0: no limit). */
void kvp_learn_fit_window_opts(const kvp_learn_run *r, const char *calibrated, long seqs,
                               double max_seconds, kvp_fit_window_opts *fo);

/* Installs the policy file calibrated at out: loading checks it against the model's cfg
 * again, saving writes it atomically (temporary file, fsync, rename). 0, or -1 with a
 * message. */
int kvp_learn_install(const char *calibrated, const char *out, const kvp_model_config *cfg);

#endif
