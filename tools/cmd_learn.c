/* kvp learn: one command from a model to its installed KVP policy. It checks that the
 * disk and memory the run needs are there, then runs the six stages in this process —
 * trace (chat conversations rendered with the model's template, or text), policy-init
 * (bound to the model's weights), train, calibrate (scores comparable across heads, for
 * budget_mode = global), fit-window (each layer's cap on the older rows its agents
 * choose), eval against the baselines on the held-out part
 * — installs the policy where kvpd looks for its model's default, and writes a report
 * of each stage's time, memory and disk beside the evaluation tables. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/parse.h"
#include "model/model.h"
#include "offline/trace.h"
#include "policy/kvp_agent.h"
#include "policy/policy.h"
#include "tools/cli.h"
#include "tools/learn_common.h"
#include "tools/stages.h"


/* --budget-hours: the trace's share of the budget, the evaluation's (training gets the
 * rest); the policies evaluated; an evaluated token with its logits, against a traced
 * one (the vocabulary-wide output row and the KL over it); below this many sequences
 * the evaluation drops to two budgets; and its fewest sequences. */
#define TRACE_SHARE 0.40
#define EVAL_SHARE 0.25
#define LEARN_POLICIES "kvp,streaming,h2o,tova,snapkv,expected_attention,keydiff,knorm,random,kvzip"
#define N_POLICIES 10.0   /* the names in LEARN_POLICIES */
#define CONT_COST 1.4
#define EVAL_FOUR_BUDGETS_MIN 32
#define EVAL_SEQS_MIN 4
/* fit-window's share of the budget, the continuations it runs per sequence and layer
 * (about: the current cap's four budgets and the candidates' differing ones), and the
 * fewest sequences it is run on (fewer would choose caps from noise: it is skipped) */
#define FIT_SHARE 0.10
#define FIT_RUNS 22.0
#define FIT_SEQS_MIN 16

typedef struct {
    kvp_learn_args a;
    const char *text, *conversations;
    double budget_hours, trace_gb;
} learn_opts;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp learn --model M [options]\n"
        "Traces the model, trains its KVP agents, calibrates their scores across heads,\n"
        "evaluates them against the baselines on held-out data and installs the policy\n"
        "where kvpd finds it (docs/training.md).\n"
        "  --tokenizer PATH     tokenizer for llama2.c checkpoints\n"
        "  --conversations F    JSON-lines chat conversations ({\"messages\": [...]}, OpenAI's\n"
        "                       shape), rendered with the model's chat template (default for\n"
        "                       a model with a template: %s/datasets/oasst/oasst_en100_longest_threads.jsonl)\n"
        "  --text F             plain text instead (default for a model without a template:\n"
        "                       %s/datasets/tinystories/tinystories-dev.txt)\n"
        "  --out FILE           the installed policy (default: kvpd's default for this model,\n"
        "                       %s/<model file stem>.kvp)\n"
        "  --work DIR           trace, checkpoints, evaluation and report (default\n"
        "                       /tmp/kvp-learn-<model file stem>)\n"
        "  --budget-hours H     the whole run's wall time (default 1.5; 0: no limit): the\n"
        "                       trace keeps to %.0f%% of it (as many sequences as its measured\n"
        "                       time allows), the evaluation is sized from the trace's cost\n"
        "                       per token to %.0f%% of it, training stops at its first\n"
        "                       validation past what is left\n"
        "  --seq-len N          tokens per traced sequence (default 512, at most the context)\n"
        "  --max-seqs N         traced sequences, 80%% training (default 300, fewer when\n"
        "                       that many would not fit in --trace-gb)\n"
        "  --trace-gb G         the trace's disk budget when --max-seqs is not given\n"
        "                       (default 4): bounds disk and memory whatever the model\n"
        "  --steps N            training steps (default 3000)\n"
        "  --fit-seqs N         sequences fit-window measures (default %d; fewer when\n"
        "                       --budget-hours gives it too little of its %.0f%%, none below\n"
        "                       %d; 0: no fit, every layer keeps the default cap)\n"
        "  --eval-seqs N        evaluation sequences (default 64, fewer when --budget-hours\n"
        "                       does not fit them)\n"
        "  --budgets LIST       evaluated budgets, rows per KV head (default 16,32,64,128;\n"
        "                       32,128 when fewer than %d sequences of four would fit)\n"
        "  --threads N          (default: the online CPUs)\n"
        "  --seed S             (default 1)\n"
        "  --transcripts DIR    learn from kvpd's learn_dir instead (kvp learn --model M\n"
        "                       --transcripts DIR --help)\n",
        KVP_SHARED_DIR, KVP_SHARED_DIR, KVP_DATA_DIR "/policy/weights",
        100.0 * TRACE_SHARE, 100.0 * EVAL_SHARE, KVP_WINDOWFIT_SEQS, 100.0 * FIT_SHARE,
        FIT_SEQS_MIN, EVAL_FOUR_BUDGETS_MIN);
}

static double peak_rss_mb(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0.0 : (double)ru.ru_maxrss / 1024.0;
}

/* CPU seconds of this process so far, every thread: with the wall time it says how much a
 * stage was slowed by other work on the machine. */
static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru))
        return 0.0;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double file_mb(const char *path)
{
    struct stat st;
    return stat(path, &st) ? 0.0 : (double)st.st_size / 1e6;
}

/* Sequences in a finished trace (its header), or -1. */
static long trace_seqs(const char *path)
{
    kvp_trace_header h;
    FILE *f = fopen(path, "rb");
    int ok = f && fread(&h, sizeof h, 1, f) == 1;
    if (f)
        fclose(f);
    return ok ? h.n_seqs : -1;
}

static double mem_available_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0.0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024.0;
}

typedef struct {
    const char *name;
    double seconds, cpu, rss_mb, disk_mb;
} stage_cost;

/* One stage's cost: wall and CPU time from stage_begin to stage_end, the peak memory so
 * far, and the size of what it wrote. */
static double stage_t0, stage_c0;

static void stage_begin(stage_cost *cost, int k, int n)
{
    fprintf(stderr, "kvp learn: [%d/%d] %s\n", k, n, cost->name);
    stage_t0 = kvp_now();
    stage_c0 = cpu_seconds();
}

/* rc: the stage's exit status; nonzero when it failed. */
static int stage_end(stage_cost *cost, int rc, const char *disk_file)
{
    fflush(stdout);
    cost->seconds = kvp_now() - stage_t0;
    cost->cpu = cpu_seconds() - stage_c0;
    cost->rss_mb = peak_rss_mb();
    cost->disk_mb = disk_file ? file_mb(disk_file) : 0.0;
    if (rc)
        fprintf(stderr, "kvp learn: %s failed (exit %d); its output is above\n", cost->name, rc);
    return rc;
}

/* A time limit in whole seconds, at least one (what the stages accept). */
static double at_least_one(double seconds)
{
    seconds = (double)(long)(seconds + 0.5);
    return seconds > 1.0 ? seconds : 1.0;
}

/* kvp learn's own options (kvp_learn_getopt). */
static int own_option(int c, const char *arg, void *ctx)
{
    learn_opts *o = ctx;
    switch (c) {
    case 'x': o->text = arg; return 1;
    case 'C': o->conversations = arg; return 1;
    case 'H': return kvp_parse_double(arg, 0.0, 1e4, &o->budget_hours);
    case 'G': return kvp_parse_double(arg, 0.001, 1e6, &o->trace_gb);
    default: return -1;
    }
}

static int parse(int argc, char **argv, learn_opts *o)
{
    static const struct option opts[] = {
        KVP_LEARN_OPTIONS, {"text", 1, 0, 'x'}, {"conversations", 1, 0, 'C'},
        {"budget-hours", 1, 0, 'H'}, {"trace-gb", 1, 0, 'G'}, {0, 0, 0, 0}};
    int rc = kvp_learn_getopt(argc, argv, opts, &o->a, own_option, o, usage);
    if (rc >= 0)
        return rc;
    if (!o->a.model || optind < argc) {
        fprintf(stderr, "kvp learn: --model is required\n");
        usage(stderr);
        return 2;
    }
    if (o->text && o->conversations) {
        fprintf(stderr, "kvp learn: --text and --conversations exclude each other\n");
        return 2;
    }
    return -1;
}

int kvp_cmd_learn(int argc, char **argv)
{
    learn_opts o = {.a = {.seq_len = 512, .max_seqs = 300, .steps = 3000, .seed = 1,
                          .eval_seqs = 64, .threads = kvp_stage_threads(),
                          .fit_seqs = KVP_WINDOWFIT_SEQS},
                    .trace_gb = 4.0, .budget_hours = 1.5};
    for (int i = 1; i < argc; i++)   /* learning from kvpd's learn_dir is its own run */
        if (!strncmp(argv[i], "--transcripts", 13))
            return kvp_cmd_learn_transcripts(argc, argv);
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.a.threads < 1)
        o.a.threads = 1;

    /* The model: its shape, identity and template decide the defaults. */
    kvp_model_config cfg;
    int has_template;
    double model_mb;
    if (kvp_learn_model_shape(&o.a, &cfg, &has_template, &model_mb))
        return 1;
    if (o.a.seq_len > cfg.seq_len)
        o.a.seq_len = cfg.seq_len;
    const char *shared = getenv("KVP_SHARED") ? getenv("KVP_SHARED") : KVP_SHARED_DIR;
    char data[1024], out[1024], work[1024];
    int conversations = o.conversations || (!o.text && has_template);
    if (o.conversations || o.text)
        snprintf(data, sizeof data, "%s", o.conversations ? o.conversations : o.text);
    else if (conversations)
        snprintf(data, sizeof data, "%s/datasets/oasst/oasst_en100_longest_threads.jsonl", shared);
    else
        snprintf(data, sizeof data, "%s/datasets/tinystories/tinystories-dev.txt", shared);
    if (access(data, R_OK)) {
        fprintf(stderr, "kvp learn: cannot read the training data %s: %s (give --%s FILE)\n",
                data, strerror(errno), conversations ? "conversations" : "text");
        return 1;
    }
    if (kvp_learn_dirs(o.a.model, o.a.out, o.a.work, "kvp-learn", 0777, out, sizeof out, work,
                       sizeof work))
        return 1;

    /* What the run needs: the trace on disk (per agent and position f16 k and v, and the
     * f32 importance of the rows at every cut of the grid), and in memory the model, one
     * sequence's f32 q, k, v while tracing, and the trace (mapped, read whole by
     * training). */
    kvp_trace_header grid = {.cut_min = KVP_TRACE_CUT_MIN, .cut_stride = KVP_TRACE_CUT_STRIDE,
                             .cut_tail = KVP_TRACE_CUT_TAIL};
    long cuts = kvp_trace_n_cuts(&grid, (int)o.a.seq_len);
    double imp_floats = (double)cuts * KVP_TRACE_CUT_MIN +
                        (double)KVP_TRACE_CUT_STRIDE * (double)cuts * (double)(cuts - 1) / 2.0;
    double agents = (double)cfg.n_layers * cfg.n_kv_heads;
    double per_seq = 4.0 + 4.0 * (double)o.a.seq_len +
                     agents * (4.0 * (double)o.a.seq_len * cfg.head_dim + 4.0 * imp_floats);
    if (!o.a.max_seqs_given) {
        /* a larger model gets fewer sequences, so the trace stays within its budget */
        double fit = (o.trace_gb * 1e9 - (double)sizeof(kvp_trace_header) - 8.0) / per_seq;
        if (fit < (double)o.a.max_seqs) {
            o.a.max_seqs = fit < 10.0 ? 10 : (long)fit;
            fprintf(stderr, "kvp learn: %ld sequences fit in the trace's %g GB budget "
                    "(--trace-gb); tracing those\n", o.a.max_seqs, o.trace_gb);
        }
    }
    double trace_bytes = (double)sizeof(kvp_trace_header) + 8.0 + per_seq * (double)o.a.max_seqs;
    double capture_bytes = 4.0 * (double)o.a.seq_len * cfg.n_layers *
                           (double)(cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim;
    double need_mem = model_mb * 1e6 + capture_bytes + trace_bytes;
    struct statvfs vfs;
    double free_disk = statvfs(work, &vfs) ? 0.0 : (double)vfs.f_bavail * (double)vfs.f_frsize;
    double avail_mem = mem_available_bytes();
    fprintf(stderr, "kvp learn: model %s (%d layers x %d KV heads x head_dim %d, weights %016llx); "
            "data %s (%s); %ld sequences of %ld tokens\n",
            o.a.model, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
            (unsigned long long)cfg.fingerprint, data,
            conversations ? "conversations, the model's chat template" : "text", o.a.max_seqs,
            o.a.seq_len);
    fprintf(stderr, "kvp learn: needs %.1f MB of disk in %s (%.2f GB free) and about %.2f GB of "
            "memory (%.2f GB available)\n", trace_bytes / 1e6, work, free_disk / 1e9,
            need_mem / 1e9, avail_mem / 1e9);
    if (free_disk < trace_bytes * 1.05 + 64e6 || (avail_mem > 0 && avail_mem < need_mem)) {
        fprintf(stderr, "kvp learn: not enough %s to start; lower --max-seqs or --seq-len%s\n",
                free_disk < trace_bytes * 1.05 + 64e6 ? "disk" : "memory",
                free_disk < trace_bytes * 1.05 + 64e6 ? ", or give --work on a larger disk" : "");
        return 1;
    }

    char trace_file[1100], init[1100], trained[1100], eval_dir[1100], calibrated[1100];
    char plan[1024] = "";
    double budget = o.budget_hours * 3600.0;
    snprintf(trace_file, sizeof trace_file, "%s/trace.kvpt", work);
    snprintf(init, sizeof init, "%s/init.kvp", work);
    snprintf(trained, sizeof trained, "%s/trained.kvp", work);
    snprintf(calibrated, sizeof calibrated, "%s/policy.kvp", work);
    snprintf(eval_dir, sizeof eval_dir, "%s/eval", work);
    enum { N_STAGES = 6 };
    stage_cost cost[N_STAGES] = {{.name = "trace"}, {.name = "policy-init"}, {.name = "train"},
                                 {.name = "calibrate"}, {.name = "fit-window"}, {.name = "eval"}};
    double start = kvp_now();

    /* the trace: as many of the sequences as fit in its share of the budget */
    kvp_learn_run run = {.model = o.a.model, .tokenizer = o.a.tokenizer, .work = work,
                         .seq_len = o.a.seq_len, .max_seqs = o.a.max_seqs, .steps = o.a.steps,
                         .threads = o.a.threads, .seed = o.a.seed};
    kvp_trace_opts to;
    kvp_learn_trace_opts(&run, data, conversations, &to);
    to.max_seconds = budget > 0 ? at_least_one(budget * TRACE_SHARE) : 0.0;
    stage_begin(&cost[0], 1, N_STAGES);
    if (stage_end(&cost[0], kvp_trace_run(&to), trace_file))
        return 1;
    long traced = trace_seqs(trace_file);
    if (traced < 2) {
        fprintf(stderr, "kvp learn: cannot read the trace's header %s\n", trace_file);
        return 1;
    }
    /* The default agent sizes (those of the shipped policy, docs/training.md), positions
     * up to the traced length. */
    kvp_policy_init_opts po;
    kvp_learn_policy_init_opts(&run, init, &po);
    stage_begin(&cost[1], 2, N_STAGES);
    if (stage_end(&cost[1], kvp_policy_init_run(&po), init))
        return 1;
    long val_cut = kvp_learn_val_cut(o.a.seq_len);

    /* The evaluation's size from the trace's measured cost: a traced sequence is one
     * forward pass over seq_len tokens; an evaluated one is the reference (seq_len
     * tokens) and, per policy, the prefix (val_cut tokens) and per budget the rest with
     * every row's logits (CONT_COST each). */
    double per_trace_seq = cost[0].seconds / (double)traced, cont = (double)(o.a.seq_len - val_cut);
    const char *budgets = o.a.budgets ? o.a.budgets : "16,32,64,128";
    int n_budgets = 4;
    double eval_seq_s = 0.0, train_seconds = 0.0, fit_seconds = 0.0;
    int fit_asked = o.a.fit_seqs > 0;   /* the plan may still leave it out */
    char fit_note[256] = "";
    if (budget > 0) {
        double ref_tokens = (double)val_cut + CONT_COST * cont;
        /* fit-window: per sequence and layer the reference, the prefix and the runs */
        double fit_seq_s = per_trace_seq * (ref_tokens + (double)val_cut + FIT_RUNS * CONT_COST * cont) /
                           (double)o.a.seq_len * cfg.n_layers;
        long fit_fits = (long)(budget * FIT_SHARE / fit_seq_s);
        if (fit_fits < o.a.fit_seqs)
            o.a.fit_seqs = fit_fits < FIT_SEQS_MIN ? 0 : fit_fits;
        fit_seconds = fit_seq_s * (double)o.a.fit_seqs;
        if (!fit_asked)
            snprintf(fit_note, sizeof fit_note, " fit-window off (--fit-seqs 0).");
        else if (!o.a.fit_seqs)
            snprintf(fit_note, sizeof fit_note, " fit-window skipped: a sequence takes about "
                     "%.0f s over the %d layers, so fewer than %d fit in its %.0f s (every layer "
                     "keeps the default cap; `kvp fit-window` fits them later).", fit_seq_s,
                     cfg.n_layers, FIT_SEQS_MIN, budget * FIT_SHARE);
        else
            snprintf(fit_note, sizeof fit_note, " fit-window: %ld sequences (about %.0f s).",
                     o.a.fit_seqs, fit_seconds);
        for (;;) {
            /* the references, kvzip's reconstruction pass in each (the prefix again),
             * then every policy's prefix and continuations */
            double tokens = ref_tokens + (double)val_cut +
                            N_POLICIES * ((double)val_cut + n_budgets * CONT_COST * cont);
            eval_seq_s = per_trace_seq * tokens / (double)o.a.seq_len;
            long fit = (long)(budget * EVAL_SHARE / eval_seq_s);
            if (!o.a.budgets && n_budgets == 4 && fit < EVAL_FOUR_BUDGETS_MIN) {
                budgets = "32,128";
                n_budgets = 2;
                continue;
            }
            if (!o.a.eval_seqs_given && fit < o.a.eval_seqs)
                o.a.eval_seqs = fit < EVAL_SEQS_MIN ? EVAL_SEQS_MIN : fit;
            break;
        }
        snprintf(plan, sizeof plan, "Plan for the %.2f h budget: the trace kept to %.0f s "
                 "and took %.0f s for %ld sequences (%.1f s each); an evaluated sequence "
                 "estimated at %.0f s (%d policies, %d budgets) gives %ld evaluation "
                 "sequences (about %.0f s);%s training gets what is left.",
                 o.budget_hours, budget * TRACE_SHARE, cost[0].seconds, traced, per_trace_seq,
                 eval_seq_s, (int)N_POLICIES, n_budgets, o.a.eval_seqs,
                 eval_seq_s * (double)o.a.eval_seqs, fit_note);
        fprintf(stderr, "kvp learn: %s\n", plan);
        train_seconds = at_least_one(budget - (kvp_now() - start) - eval_seq_s * (double)o.a.eval_seqs -
                                     fit_seconds);
    }
    kvp_train_opts tr;
    kvp_learn_train_opts(&run, init, trained, val_cut, train_seconds, &tr);
    stage_begin(&cost[2], 3, N_STAGES);
    if (stage_end(&cost[2], kvp_train_run(&tr), trained))
        return 1;
    /* Calibration fits on the training sequences the agents saw; what is evaluated and
     * installed is the calibrated file. */
    kvp_calibrate_opts co;
    kvp_learn_calibrate_opts(&run, trained, calibrated, &co);
    stage_begin(&cost[3], 4, N_STAGES);
    if (stage_end(&cost[3], kvp_calibrate_run(&co), calibrated))
        return 1;
    /* The caps are fitted on the calibrated file, in place: what is evaluated and
     * installed has them. */
    stage_begin(&cost[4], 5, N_STAGES);
    if (o.a.fit_seqs > 0) {
        kvp_fit_window_opts fo;
        kvp_learn_fit_window_opts(&run, calibrated, o.a.fit_seqs,
                                  budget > 0 ? at_least_one(budget * FIT_SHARE) : 0.0, &fo);
        if (stage_end(&cost[4], kvp_fit_window_run(&fo), calibrated))
            return 1;
    } else {
        fprintf(stderr, "kvp learn: fit-window skipped (%s): every layer keeps the default cap\n",
                fit_asked ? "too little of the time budget, the plan above" : "--fit-seqs 0");
        stage_end(&cost[4], 0, NULL);
    }
    kvp_eval_cli_opts eo;
    kvp_eval_defaults(&eo);
    eo.model = o.a.model;
    eo.tokenizer = o.a.tokenizer;
    eo.text = data;
    eo.conversations = conversations;
    eo.out = eval_dir;
    eo.policies = LEARN_POLICIES;
    eo.policy_file = calibrated;
    eo.budgets = budgets;
    eo.seqs = o.a.eval_seqs;
    eo.seq_len = o.a.seq_len;
    eo.cut = val_cut;
    eo.threads = o.a.threads;
    eo.streams = 0;
    stage_begin(&cost[5], 6, N_STAGES);
    if (stage_end(&cost[5], kvp_eval_run(&eo), NULL))
        return 1;

    if (kvp_learn_install(calibrated, out, &cfg))
        return 1;

    char report[1100], results[1200];
    snprintf(report, sizeof report, "%s/report.md", work);
    snprintf(results, sizeof results, "%s/results.md", eval_dir);
    FILE *r = fopen(report, "w");
    if (!r) {
        fprintf(stderr, "kvp learn: cannot write %s: %s\n", report, strerror(errno));
        return 1;
    }
    fprintf(r, "# kvp learn: %s\n\nPolicy installed at `%s` (bound to weights %016llx).\n"
            "Data: `%s` (%s), %ld sequences of %ld tokens traced (80%% training); at most "
            "%ld training steps, seed %ld, %ld threads; the evaluation: %ld held-out "
            "sequences, budgets %s.\n\n%s%s| stage | wall time (s) | CPU time (s) | peak "
            "memory (MB) | output (MB) |\n|---|---:|---:|---:|---:|\n",
            o.a.model, out, (unsigned long long)cfg.fingerprint, data,
            conversations ? "conversations rendered with the model's chat template" : "text",
            traced, o.a.seq_len, o.a.steps, o.a.seed, o.a.threads, o.a.eval_seqs, budgets, plan,
            plan[0] ? "\n\n" : "");
    for (int i = 0; i < N_STAGES; i++)
        fprintf(r, "| %s | %.1f | %.1f | %.0f | %.1f |\n", cost[i].name, cost[i].seconds,
                cost[i].cpu, cost[i].rss_mb, cost[i].disk_mb);
    fprintf(r, "| all | %.1f | %.1f | %.0f | %.1f |\n\nThe evaluation (held-out part of the data): "
            "`%s`.\n\n", kvp_now() - start, cpu_seconds(), peak_rss_mb(), file_mb(trace_file) + file_mb(trained) + file_mb(calibrated),
            results);
    FILE *e = fopen(results, "r");
    char buf[4096];
    size_t got;
    while (e && (got = fread(buf, 1, sizeof buf, e)) > 0)
        fwrite(buf, 1, got, r);
    if (e)
        fclose(e);
    int werr = ferror(r) | fclose(r);
    fprintf(stderr, "kvp learn: installed %s; report %s (%.0f s in all)%s\n", out, report,
            kvp_now() - start, werr ? " — the report could not be written whole" : "");
    fprintf(stderr, "kvp learn: kvpd --model %s picks it up as its default policy%s\n", o.a.model,
            o.a.out ? " when policy_dir is its directory" : "");
    return werr ? 1 : 0;
}
