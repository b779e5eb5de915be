/* kvp calibrate: fit a KVP policy's per-head score calibration on `kvp trace` output
 * (offline/calibrate.h) and write the policy file with it (version 3). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/parse.h"
#include "offline/calibrate.h"
#include "policy/kvp_agent.h"
#include "tools/cli.h"
#include "tools/stages.h"

#define DEFAULT_KNOTS 32

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp calibrate --traces DIR --policy-file IN --out OUT [options]\n"
        "Fits, for each KVP agent of IN, a monotone map from its score to the row's expected\n"
        "future attention on DIR/trace.kvpt's training sequences, and writes IN's agents with\n"
        "it to OUT (policy file version 3; OUT may be IN). The map makes scores comparable\n"
        "across heads for budget_mode = global; each head's own ranking is unchanged.\n"
        "  --knots K          knots per agent, 2..%d (default %d)\n"
        "  --threads N        agents fitted at once (default: online CPUs)\n",
        KVP_CALIBRATION_MAX_KNOTS, DEFAULT_KNOTS);
}

void kvp_calibrate_defaults(kvp_calibrate_opts *o)
{
    *o = (kvp_calibrate_opts){.knots = DEFAULT_KNOTS, .threads = kvp_stage_threads()};
}

int kvp_cmd_calibrate(int argc, char **argv)
{
    kvp_calibrate_opts c;
    kvp_calibrate_defaults(&c);
    long knots = c.knots, threads = c.threads;
    static const struct option opts[] = {
        {"traces", 1, 0, 't'}, {"policy-file", 1, 0, 'p'}, {"out", 1, 0, 'o'},
        {"knots", 1, 0, 'k'}, {"threads", 1, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o, idx = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        int ok = 1;
        switch (o) {
        case 't': c.traces = optarg; break;
        case 'p': c.in = optarg; break;
        case 'o': c.out = optarg; break;
        case 'k': ok = kvp_parse_long(optarg, 2, KVP_CALIBRATION_MAX_KNOTS, &knots); break;
        case 'j': ok = kvp_parse_long(optarg, 1, 1024, &threads); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvp calibrate: bad value '%s' for --%s\n", optarg, opts[idx].name);
            return 2;
        }
    }
    if (!c.traces || !c.in || !c.out || optind < argc) {
        fprintf(stderr, "kvp calibrate: --traces, --policy-file and --out are required\n");
        usage(stderr);
        return 2;
    }
    c.knots = (int)knots;
    c.threads = (int)threads;
    return kvp_calibrate_run(&c);
}

int kvp_calibrate_run(const kvp_calibrate_opts *c)
{
    const char *traces = c->traces, *in = c->in, *out = c->out;
    char err[512], path[1024];
    snprintf(path, sizeof path, "%s/trace.kvpt", traces);
    kvp_trace t;
    if (kvp_trace_open(&t, path, NULL, err, sizeof err)) {
        fprintf(stderr, "kvp calibrate: %s\n", err);
        return 1;
    }
    kvp_model_config cfg = {.n_layers = t.h.n_layers, .n_heads = t.h.n_heads,
                            .n_kv_heads = t.h.n_kv_heads, .head_dim = t.h.head_dim,
                            .seq_len = t.h.seq_len};
    kvp_agent_set s;
    int rc = kvp_agent_set_load(&s, in, &cfg, err, sizeof err);
    if (!rc)
        rc = kvp_calibrate_fit(&s, &t, c->knots, c->threads, stderr, err, sizeof err);
    if (!rc)
        rc = kvp_agent_set_save(&s, out, err, sizeof err);
    if (rc)
        fprintf(stderr, "kvp calibrate: %s\n", err);
    else
        fprintf(stderr, "kvp calibrate: wrote %s\n", out);
    kvp_agent_set_free(&s);
    kvp_trace_close(&t);
    return rc ? 1 : 0;
}
