/* kvp train: train the KVP agents of a model on `kvp trace` output (offline/train.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "policy/kvp_agent.h"
#include "offline/agent_train.h"
#include "offline/train.h"
#include "tools/cli.h"
#include "tools/stages.h"
#include "base/parse.h"

static void usage(FILE *f, const kvp_train_cfg *d)
{
    fprintf(f,
        "usage: kvp train --traces DIR --out POLICY [options]\n"
        "Trains one KVP agent per (layer, KV head) on DIR/trace.kvpt (from kvp trace) and\n"
        "writes the EMA weights to POLICY. Progress on stderr; docs/training.md has details.\n"
        "  --init FILE        start from this policy file (kvp policy-init; sets the agent\n"
        "                     sizes); default: default sizes initialised from --seed\n"
        "  --steps N          optimiser steps (default %ld)\n"
        "  --seed S           initialisation, episodes and sampling (default %llu)\n"
        "  --threads N        agents trained at once (default: online CPUs)\n"
        "  --episodes N       episodes per step and agent (default %d)\n"
        "  --samples K        rankings per episode, for the leave-one-out baseline (default %d)\n"
        "  --lr F             peak learning rate (default %g)\n"
        "  --lr-min F         end of the cosine decay (default %g)\n"
        "  --warmup N         linear warm-up steps (default %ld)\n"
        "  --weight-decay F   AdamW decoupled weight decay (default %g)\n"
        "  --clip F           gradient-norm clip (default %g)\n"
        "  --ema F            EMA decay of the saved weights (default %g)\n"
        "  --listwise W       weight of the listwise term: cross-entropy between the rows'\n"
        "                     importance shares and the softmax of their scores, per\n"
        "                     episode (default %g; 0: the policy gradient alone)\n"
        "  --val-cut N        validation ranks the first N rows, a cut of the trace's grid\n"
        "                     (default %d); episodes use every cut of the grid (kvp trace\n"
        "                     --cut-min, --cut-stride, --cut-tail)\n"
        "  --eval-every N     validation and progress interval in steps (default %ld)\n"
        "  --max-seconds S    stop at the first validation past S seconds (default: no limit)\n"
        "  --curve FILE       training curve CSV (default POLICY.csv)\n"
        "  --stream-share F   share of the episodes shaped as streaming decisions (default\n"
        "                     %g): the rows that just left the kvp policy's recent window\n"
        "                     and the older rows the agent kept before, at a budget drawn\n"
        "                     from --stream-budgets\n"
        "  --stream-budgets L their budgets, comma-separated (default 32,64,128,256)\n"
        "  --stream-chunk N   their eviction chunk (default %d)\n",
        d->steps, (unsigned long long)d->seed, d->episodes, d->samples, (double)d->lr,
        (double)d->lr_min, d->warmup, (double)d->adamw.weight_decay, (double)d->clip,
        (double)d->ema, (double)d->listwise, d->val_cut, d->eval_every, (double)d->stream_share, d->stream_chunk);
}

/* "32,64,..." into c->stream_budgets; 0 when it is not 1..KVP_TRAIN_MAX_STREAM_BUDGETS
 * integers in 1..2^20. */
static int parse_budgets(const char *arg, kvp_train_cfg *c)
{
    char buf[512], *fields[KVP_TRAIN_MAX_STREAM_BUDGETS];
    int n;
    if (snprintf(buf, sizeof buf, "%s", arg) >= (int)sizeof buf ||
        !kvp_split_list(buf, fields, KVP_TRAIN_MAX_STREAM_BUDGETS, &n))
        return 0;
    for (int i = 0; i < n; i++) {
        long b;
        if (!kvp_parse_long(fields[i], 1, 1 << 20, &b))
            return 0;
        c->stream_budgets[i] = (int)b;
    }
    c->n_stream_budgets = n;
    return 1;
}

void kvp_train_opts_defaults(kvp_train_opts *o)
{
    *o = (kvp_train_opts){0};
    kvp_train_defaults(&o->cfg);
    o->cfg.threads = kvp_stage_threads();
}

int kvp_cmd_train(int argc, char **argv)
{
    kvp_train_opts to;
    kvp_train_opts_defaults(&to);
    kvp_train_cfg *cp = &to.cfg;
    static const struct option opts[] = {
        {"traces", 1, 0, 't'}, {"out", 1, 0, 'o'}, {"init", 1, 0, 'i'}, {"steps", 1, 0, 'n'},
        {"seed", 1, 0, 's'}, {"threads", 1, 0, 'j'}, {"episodes", 1, 0, 'b'},
        {"samples", 1, 0, 'k'}, {"lr", 1, 0, 'l'}, {"lr-min", 1, 0, 'L'}, {"warmup", 1, 0, 'w'},
        {"weight-decay", 1, 0, 'W'}, {"clip", 1, 0, 'c'}, {"ema", 1, 0, 'e'},
        {"val-cut", 1, 0, 'v'}, {"eval-every", 1, 0, 'E'}, {"curve", 1, 0, 'C'},
        {"max-seconds", 1, 0, 'X'}, {"stream-share", 1, 0, 'S'}, {"stream-budgets", 1, 0, 'B'},
        {"stream-chunk", 1, 0, 'K'}, {"listwise", 1, 0, 'P'},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o, idx = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        long l = 0;
        double f = 0.0;
        int ok = 1;
        switch (o) {
        case 't': to.traces = optarg; break;
        case 'o': to.out = optarg; break;
        case 'i': to.init = optarg; break;
        case 'C': to.curve = optarg; break;
        case 'n': ok = kvp_parse_long(optarg, 1, 100000000, &cp->steps); break;
        case 's': ok = kvp_parse_long(optarg, 0, LONG_MAX, &l); cp->seed = (uint64_t)l; break;
        case 'j': ok = kvp_parse_long(optarg, 1, 1024, &l); cp->threads = (int)l; break;
        case 'b': ok = kvp_parse_long(optarg, 1, 4096, &l); cp->episodes = (int)l; break;
        case 'k': ok = kvp_parse_long(optarg, 2, 4096, &l); cp->samples = (int)l; break;
        case 'l': ok = kvp_parse_double(optarg, 1e-9, 10.0, &f); cp->lr = (float)f; break;
        case 'L': ok = kvp_parse_double(optarg, 0.0, 10.0, &f); cp->lr_min = (float)f; break;
        case 'w': ok = kvp_parse_long(optarg, 0, 100000000, &cp->warmup); break;
        case 'W': ok = kvp_parse_double(optarg, 0.0, 1.0, &f); cp->adamw.weight_decay = (float)f; break;
        case 'c': ok = kvp_parse_double(optarg, 1e-6, 1e6, &f); cp->clip = (float)f; break;
        case 'e': ok = kvp_parse_double(optarg, 0.0, 0.999999, &f); cp->ema = (float)f; break;
        case 'v': ok = kvp_parse_long(optarg, 2, 1 << 20, &l); cp->val_cut = (int)l; break;
        case 'E': ok = kvp_parse_long(optarg, 1, 100000000, &cp->eval_every); break;
        case 'X': ok = kvp_parse_double(optarg, 1.0, 1e9, &cp->max_seconds); break;
        case 'S': ok = kvp_parse_double(optarg, 0.0, 1.0, &f); cp->stream_share = (float)f; break;
        case 'B': ok = parse_budgets(optarg, cp); break;
        case 'K': ok = kvp_parse_long(optarg, 1, 1 << 20, &l); cp->stream_chunk = (int)l; break;
        case 'P': ok = kvp_parse_double(optarg, 0.0, 1e6, &f); cp->listwise = (float)f; break;
        case 'h': usage(stdout, cp); return 0;
        default: usage(stderr, cp); return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvp train: bad value '%s' for --%s\n", optarg, opts[idx].name);
            return 2;
        }
    }
    if (!to.traces || !to.out || optind < argc) {
        fprintf(stderr, "kvp train: --traces and --out are required\n");
        usage(stderr, cp);
        return 2;
    }
    return kvp_train_run(&to);
}

int kvp_train_run(const kvp_train_opts *to)
{
    kvp_train_cfg c = to->cfg;
    const char *traces = to->traces, *out = to->out, *init = to->init, *curve_path = to->curve;
    if (c.lr_min > c.lr) {
        fprintf(stderr, "kvp train: --lr-min %g exceeds --lr %g\n", (double)c.lr_min, (double)c.lr);
        return 2;
    }

    char err[512], path[1024];
    snprintf(path, sizeof path, "%s/trace.kvpt", traces);
    kvp_trace t;
    if (kvp_trace_open(&t, path, NULL, err, sizeof err)) {
        fprintf(stderr, "kvp train: %s\n", err);
        return 1;
    }
    if (t.h.targets == KVP_TRACE_TARGETS_KVZIP)
        fprintf(stderr, "kvp train: the trace's targets are KVzip's scores: the agents learn "
                "to predict them (a KVzap surrogate); C/C* is against those scores\n");
    /* the trace gives the model's shape; an --init file must match it */
    kvp_model_config cfg = {.n_layers = t.h.n_layers, .n_heads = t.h.n_heads,
                            .n_kv_heads = t.h.n_kv_heads, .head_dim = t.h.head_dim,
                            .seq_len = t.h.seq_len};
    kvp_agent_set s;
    int rc;
    if (init) {
        rc = kvp_agent_set_load(&s, init, &cfg, err, sizeof err);
        /* a calibration fits the agents it was fitted on, not the ones trained here */
        if (!rc)
            rc = kvp_agent_set_calibration(&s, 0, NULL, err, sizeof err);
    } else {
        kvp_agent_arch a = {.d = cfg.head_dim, .P = KVP_AGENT_DEFAULT_P,
                            .E = KVP_AGENT_DEFAULT_E, .H = KVP_AGENT_DEFAULT_H,
                            .pmax = KVP_AGENT_DEFAULT_PMAX};
        rc = kvp_agent_set_alloc(&s, cfg.n_layers, cfg.n_kv_heads, &a, err, sizeof err);
        if (!rc)
            kvp_agent_set_init(&s, c.seed);
    }
    if (rc) {
        fprintf(stderr, "kvp train: %s\n", err);
        kvp_trace_close(&t);
        return 1;
    }
    char csv[1040];
    snprintf(csv, sizeof csv, "%s.csv", out);
    if (!curve_path)
        curve_path = csv;
    FILE *curve = fopen(curve_path, "w");
    if (!curve) {
        fprintf(stderr, "kvp train: cannot create %s: %m\n", curve_path);
        kvp_agent_set_free(&s);
        kvp_trace_close(&t);
        return 1;
    }
    c.log = stderr;
    c.curve = curve;
    double val = 0.0;
    rc = kvp_train(&t, &s, &c, &val, err, sizeof err);
    if (fclose(curve) && !rc) {
        fprintf(stderr, "kvp train: cannot write %s\n", curve_path);
        kvp_agent_set_free(&s);
        kvp_trace_close(&t);
        return 1;
    }
    if (!rc)
        rc = kvp_agent_set_save(&s, out, err, sizeof err);
    if (rc)
        fprintf(stderr, "kvp train: %s\n", err);
    else
        fprintf(stderr, "kvp train: wrote %s (validation C/C* %.3f at cut %d) and %s\n", out,
                val, c.val_cut, curve_path);
    kvp_agent_set_free(&s);
    kvp_trace_close(&t);
    return rc ? 1 : 0;
}
