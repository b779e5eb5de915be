/* What both runs of `kvp learn` share (tools/learn_common.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/parse.h"
#include "offline/trace.h"
#include "policy/kvp_agent.h"
#include "tools/learn_common.h"

/* The model file's name without its directory and last extension (kvpd's rule). */
static void model_stem(const char *path, char *out, size_t len)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    int n = dot && dot != base ? (int)(dot - base) : (int)strlen(base);
    snprintf(out, len, "%.*s", n, base);
}

int kvp_learn_dirs(const char *model, const char *out_opt, const char *work_opt,
                   const char *prefix, unsigned mode, char *out, size_t out_len, char *work,
                   size_t work_len)
{
    char stem[256];
    model_stem(model, stem, sizeof stem);
    if (out_opt)
        snprintf(out, out_len, "%s", out_opt);
    else
        snprintf(out, out_len, "%s/policy/weights/%s.kvp", KVP_DATA_DIR, stem);
    if (work_opt)
        snprintf(work, work_len, "%s", work_opt);
    else
        snprintf(work, work_len, "/tmp/%s-%s", prefix, stem);
    if (mkdir(work, (mode_t)mode) && errno != EEXIST) {
        fprintf(stderr, "kvp learn: cannot create %s: %s\n", work, strerror(errno));
        return -1;
    }
    return 0;
}

int kvp_learn_model_shape(const kvp_learn_args *a, kvp_model_config *cfg, int *has_template,
                          double *weights_mb)
{
    char err[512];
    kvp_model m;
    if (kvp_model_load(&m, a->model, a->tokenizer, err, sizeof err)) {
        fprintf(stderr, "kvp learn: %s\n", err);
        return 1;
    }
    *cfg = m.cfg;
    if (has_template)
        *has_template = m.chat_template != NULL;
    if (weights_mb)
        *weights_mb = (double)m.weight_bytes / 1e6;
    kvp_model_free(&m);
    return 0;
}

long kvp_learn_val_cut(long seq_len)
{
    long cut = seq_len * 3 / 4;
    if (cut > KVP_TRACE_CUT_MIN)
        cut -= (cut - KVP_TRACE_CUT_MIN) % KVP_TRACE_CUT_STRIDE;
    return cut;
}

void kvp_learn_trace_opts(const kvp_learn_run *r, const char *text, int conversations,
                          kvp_trace_opts *to)
{
    kvp_trace_defaults(to);
    to->model = r->model;
    to->tokenizer = r->tokenizer;
    to->text = text;
    to->conversations = conversations;
    to->out = r->work;
    to->seq_len = r->seq_len;
    to->max_seqs = r->max_seqs;
}

void kvp_learn_policy_init_opts(const kvp_learn_run *r, const char *init,
                                kvp_policy_init_opts *po)
{
    kvp_policy_init_defaults(po);
    po->model = r->model;
    po->tokenizer = r->tokenizer;
    po->out = init;
    po->seed = (uint64_t)r->seed;
    po->arch.pmax = (int)r->seq_len;
}

void kvp_learn_train_opts(const kvp_learn_run *r, const char *init, const char *trained,
                          long val_cut, double max_seconds, kvp_train_opts *tr)
{
    kvp_train_opts_defaults(tr);
    tr->traces = r->work;
    tr->init = init;
    tr->out = trained;
    tr->cfg.seed = (uint64_t)r->seed;
    tr->cfg.threads = (int)r->threads;
    tr->cfg.steps = r->steps;
    tr->cfg.lr = 3e-3f;
    tr->cfg.episodes = 16;
    tr->cfg.samples = 8;
    tr->cfg.val_cut = (int)val_cut;
    tr->cfg.max_seconds = max_seconds;
}

void kvp_learn_calibrate_opts(const kvp_learn_run *r, const char *trained,
                              const char *calibrated, kvp_calibrate_opts *co)
{
    kvp_calibrate_defaults(co);
    co->traces = r->work;
    co->in = trained;
    co->out = calibrated;
    co->threads = (int)r->threads;
}

void kvp_learn_fit_window_opts(const kvp_learn_run *r, const char *calibrated, long seqs,
                               double max_seconds, kvp_fit_window_opts *fo)
{
    kvp_fit_window_defaults(fo);
    fo->model = r->model;
    fo->tokenizer = r->tokenizer;
    fo->traces = r->work;
    fo->in = fo->out = calibrated;
    fo->fit.seqs = (int)seqs;
    fo->fit.threads = (int)r->threads;
    fo->fit.max_seconds = max_seconds;
}

int kvp_learn_install(const char *calibrated, const char *out, const kvp_model_config *cfg)
{
    char err[512];
    kvp_agent_set set;
    if (kvp_agent_set_load(&set, calibrated, cfg, err, sizeof err) ||
        kvp_agent_set_save(&set, out, err, sizeof err)) {
        fprintf(stderr, "kvp learn: cannot install the policy: %s\n", err);
        kvp_agent_set_free(&set);
        return -1;
    }
    kvp_agent_set_free(&set);
    return 0;
}

int kvp_learn_option(int c, const char *arg, kvp_learn_args *a)
{
    switch (c) {
    case 'm': a->model = arg; return 1;
    case 'z': a->tokenizer = arg; return 1;
    case 'o': a->out = arg; return 1;
    case 'w': a->work = arg; return 1;
    case 'b': a->budgets = arg; return 1;
    case 'n': return kvp_parse_long(arg, 64, 1 << 20, &a->seq_len);
    case 'N': a->max_seqs_given = 1; return kvp_parse_long(arg, 2, 1 << 24, &a->max_seqs);
    case 's': return kvp_parse_long(arg, 1, 100000000, &a->steps);
    case 'e': a->eval_seqs_given = 1; return kvp_parse_long(arg, 1, 1 << 20, &a->eval_seqs);
    case 't': return kvp_parse_long(arg, 1, 64, &a->threads);
    case 'r': return kvp_parse_long(arg, 0, 0x7fffffffL, &a->seed);
    case 'f': return kvp_parse_long(arg, 0, 1 << 20, &a->fit_seqs);
    default: return -1;
    }
}

int kvp_learn_getopt(int argc, char **argv, const struct option *opts, kvp_learn_args *a,
                     int (*own)(int c, const char *arg, void *ctx), void *ctx,
                     void (*usage)(FILE *f))
{
    int c, idx = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        int ok = c == '?' ? -1 : own(c, optarg, ctx);
        if (ok < 0 && c != '?')
            ok = kvp_learn_option(c, optarg, a);
        if (ok < 0) {
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvp learn: bad value '%s' for --%s\n", optarg, opts[idx].name);
            return 2;
        }
    }
    return -1;
}
