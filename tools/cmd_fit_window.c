/* kvp fit-window: fit a KVP policy's per-layer caps (how many older rows each layer's
 * agents choose; offline/windowfit.h) by one-shot KL on `kvp trace` output, and write
 * the policy file with them. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "model/model.h"
#include "offline/windowfit.h"
#include "policy/kvp_agent.h"
#include "tools/cli.h"
#include "tools/stages.h"

static void usage(FILE *f)
{
    kvp_windowfit_opts d;
    kvp_windowfit_defaults(&d);
    fprintf(f,
        "usage: kvp fit-window --model M --traces DIR --policy-file IN --out OUT [options]\n"
        "Fits, for each layer of IN, how many older rows its agents choose at a large budget\n"
        "(the rest of the budget keeps the newest rows), by the one-shot KL of the model's\n"
        "next-token distributions on DIR/trace.kvpt's training sequences, and writes IN's\n"
        "agents with the caps to OUT (OUT may be IN). docs/training.md, \"Per-layer caps\".\n"
        "  --tokenizer PATH   tokenizer for llama2.c checkpoints\n"
        "  --seqs N           training sequences measured, spread over the text (default %d)\n"
        "  --budgets LIST     rows per KV head (default: the trace's length / 16, 8, 4, 2)\n"
        "  --min-gain G       relative drop of the budgets' geometric-mean KL a layer's new\n"
        "                     cap must bring (default %g)\n"
        "  --max-seconds S    no layer starts when it would end past S (default 0: no limit)\n"
        "  --threads N        sequences measured at once (default: online CPUs)\n",
        d.seqs, d.min_gain);
}

void kvp_fit_window_defaults(kvp_fit_window_opts *o)
{
    memset(o, 0, sizeof *o);
    kvp_windowfit_defaults(&o->fit);
    o->fit.threads = kvp_stage_threads();
}

int kvp_cmd_fit_window(int argc, char **argv)
{
    kvp_fit_window_opts c;
    kvp_fit_window_defaults(&c);
    long seqs = c.fit.seqs, threads = c.fit.threads;
    double gain = c.fit.min_gain, secs = 0.0;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'k'}, {"traces", 1, 0, 't'},
        {"policy-file", 1, 0, 'p'}, {"out", 1, 0, 'o'}, {"seqs", 1, 0, 's'},
        {"budgets", 1, 0, 'b'}, {"min-gain", 1, 0, 'g'}, {"max-seconds", 1, 0, 'x'},
        {"threads", 1, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o, idx = 0;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        int ok = 1;
        switch (o) {
        case 'm': c.model = optarg; break;
        case 'k': c.tokenizer = optarg; break;
        case 't': c.traces = optarg; break;
        case 'p': c.in = optarg; break;
        case 'o': c.out = optarg; break;
        case 's': ok = kvp_parse_long(optarg, 1, 1000000, &seqs); break;
        case 'b': {
            char buf[512], *f[KVP_EVAL_MAX_BUDGETS];
            int n = 0;
            snprintf(buf, sizeof buf, "%s", optarg);
            ok = strlen(optarg) < sizeof buf && kvp_split_list(buf, f, KVP_EVAL_MAX_BUDGETS, &n);
            for (int i = 0; ok && i < n; i++) {
                long v;
                ok = kvp_parse_long(f[i], 1, 1 << 24, &v);
                c.fit.budgets[i] = (int)v;
            }
            c.fit.n_budgets = ok ? n : 0;
            break;
        }
        case 'g': ok = kvp_parse_double(optarg, 0.0, 0.99, &gain); break;
        case 'x': ok = kvp_parse_double(optarg, 0.0, 1e9, &secs); break;
        case 'j': ok = kvp_parse_long(optarg, 1, 1024, &threads); break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "kvp fit-window: unknown option or missing value: %s\n",
                    argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvp fit-window: bad value '%s' for --%s\n", optarg, opts[idx].name);
            return 2;
        }
    }
    if (!c.model || !c.traces || !c.in || !c.out || optind < argc) {
        fprintf(stderr, "kvp fit-window: --model, --traces, --policy-file and --out are required\n");
        usage(stderr);
        return 2;
    }
    c.fit.seqs = (int)seqs;
    c.fit.threads = (int)threads;
    c.fit.min_gain = gain;
    c.fit.max_seconds = secs;
    return kvp_fit_window_run(&c);
}

int kvp_fit_window_run(const kvp_fit_window_opts *c)
{
    char err[512], path[1024];
    snprintf(path, sizeof path, "%s/trace.kvpt", c->traces);
    kvp_model m;
    if (kvp_model_load(&m, c->model, c->tokenizer, err, sizeof err)) {
        fprintf(stderr, "kvp fit-window: cannot load model %s: %s\n", c->model, err);
        return 1;
    }
    kvp_trace t;
    if (kvp_trace_open(&t, path, &m.cfg, err, sizeof err)) {
        fprintf(stderr, "kvp fit-window: %s\n", err);
        kvp_model_free(&m);
        return 1;
    }
    kvp_agent_set s;
    kvp_windowfit_result res;
    int rc = kvp_agent_set_load(&s, c->in, &m.cfg, err, sizeof err), status = 1;
    if (!rc) {
        rc = kvp_windowfit(&s, &m, &t, &c->fit, &res, stderr, err, sizeof err);
        status = rc == -EINVAL ? 2 : 1;
    }
    if (!rc)
        rc = kvp_agent_set_save(&s, c->out, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvp fit-window: %s\n", err);
    } else {
        fprintf(stderr, "kvp fit-window: %d of %d layers fitted on %d sequences; caps per layer "
                "at budgets", res.layers_fitted, s.n_layers, res.seqs);
        for (int b = 0; b < s.n_cap_budgets; b++)
            fprintf(stderr, " %d", s.cap_budgets[b]);
        fprintf(stderr, " (0: the default)");
        for (int l = 0; l < s.n_layers; l++)
            for (int b = 0; b < s.n_cap_budgets; b++)
                fprintf(stderr, "%s%d", b ? "/" : " ", s.caps[l * s.n_cap_budgets + b]);
        fprintf(stderr, "; one-shot KL at budgets");
        for (int b = 0; b < res.n_budgets; b++)
            fprintf(stderr, " %d: %.5f -> %.5f", res.budgets[b], res.kl_before[b], res.kl_after[b]);
        fprintf(stderr, "\nkvp fit-window: wrote %s\n", c->out);
        status = 0;
    }
    kvp_agent_set_free(&s);
    kvp_trace_close(&t);
    kvp_model_free(&m);
    return status;
}
