/* kvp learn --transcripts DIR: a KVP policy learned from the daemon's own traffic (the
 * files kvpd keeps in learn_dir, observe/learnlog.h). It reads every transcript file of
 * DIR and of its tenant folders one level down (so DIR may be the whole learn_dir or one
 * tenant's folder; a damaged file, or one of another model, is skipped with a message),
 * holds out a share
 * of them by a hash of their names, and runs the stages on the token ids (trace,
 * policy-init, train, calibrate on the rest), then evaluates the new policy and the one
 * installed now (the kvp file at --out, or the streaming fallback when there is none) on
 * the held-out transcripts with the same settings. The new one is installed (temporary
 * file, fsync, rename) only when both its ranking C/C* and its mean streaming KL over
 * the budgets are lower; both are printed. An interrupted run never touches --out.
 * Exit status: 0 installed, 3 the installed policy was kept (it is not beaten, or there
 * are too few transcripts), 1 a failure, 2 bad arguments. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/parse.h"
#include "model/model.h"
#include "policy/kvp_agent.h"
#include "base/tokfile.h"
#include "tools/cli.h"
#include "tools/corpus.h"
#include "tools/learn_common.h"
#include "tools/stages.h"

#define KEPT 3

typedef struct {
    kvp_learn_args a;
    const char *dir;
    double holdout, max_seconds;
    long streams, stream_len, min_files;
} opts;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp learn --model M --transcripts DIR [options]\n"
        "Learns a KVP policy from the transcripts kvpd keeps in its learn_dir, and installs\n"
        "it only if it beats the installed one on held-out transcripts (exit 0: installed,\n"
        "3: the installed one was kept).\n"
        "  --tokenizer PATH     tokenizer for llama2.c checkpoints\n"
        "  --out FILE           the installed policy (default: kvpd's default for the model,\n"
        "                       %s/<model file stem>.kvp)\n"
        "  --work DIR           (default /tmp/kvp-learn-transcripts-<model file stem>)\n"
        "  --holdout F          share of the transcripts held out for the comparison (0.2)\n"
        "  --min-transcripts N  fewer usable files than this: nothing is learned (default 4)\n"
        "  --seq-len N          tokens per traced and evaluated sequence (default 512)\n"
        "  --max-seqs N         traced sequences at most (default 300)\n"
        "  --steps N            training steps (default 3000)\n"
        "  --max-seconds S      training's wall-time limit (default 3600; 0: none)\n"
        "  --eval-seqs N        ranking sequences of the comparison (default 32)\n"
        "  --streams N          streaming sequences of the comparison (default 8)\n"
        "  --stream-len N       their length (default 0: 4 x the context)\n"
        "  --budgets LIST       the comparison's budgets (default 16,32,64,128)\n"
        "  --fit-seqs N         sequences fit-window measures (default %d; 0: no fit)\n"
        "  --threads N          (default: the online CPUs)\n"
        "  --seed S             (default 1)\n", KVP_DATA_DIR "/policy/weights", KVP_WINDOWFIT_SEQS);
}

/* kvp learn --transcripts' own options (kvp_learn_getopt). */
static int own_option(int c, const char *arg, void *ctx)
{
    opts *o = ctx;
    switch (c) {
    case 'T': o->dir = arg; return 1;
    case 'H': return kvp_parse_double(arg, 0.01, 0.9, &o->holdout);
    case 'M': return kvp_parse_long(arg, 2, 1 << 24, &o->min_files);
    case 'S': return kvp_parse_double(arg, 0.0, 1e7, &o->max_seconds);
    case 'R': return kvp_parse_long(arg, 1, 1 << 20, &o->streams);
    case 'L': return kvp_parse_long(arg, 0, 1 << 24, &o->stream_len);
    default: return -1;
    }
}

static int parse(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        KVP_LEARN_OPTIONS, {"transcripts", 1, 0, 'T'}, {"holdout", 1, 0, 'H'},
        {"min-transcripts", 1, 0, 'M'}, {"max-seconds", 1, 0, 'S'}, {"streams", 1, 0, 'R'},
        {"stream-len", 1, 0, 'L'}, {0, 0, 0, 0}};
    int rc = kvp_learn_getopt(argc, argv, lo, &o->a, own_option, o, usage);
    if (rc >= 0)
        return rc;
    if (!o->a.model || !o->dir || optind < argc) {
        fprintf(stderr, "kvp learn: --model and --transcripts are required\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether a file goes to the held-out share: by a hash of its name, so a transcript
 * stays on its side from one run to the next. */
static int held_out(const char *name, double share)
{
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, name, strlen(name));
    h ^= h >> 31;
    return (double)(h >> 11) * (1.0 / 9007199254740992.0) < share;
}

static int write_ids(FILE *f, const int *ids, int n)
{
    for (int i = 0; i < n; i++)
        fprintf(f, i ? " %d" : "%d", ids[i]);
    return fputc('\n', f) == EOF ? -1 : 0;
}

typedef struct names {
    char **v;
    size_t n, cap;
} names_t;

/* The transcript files of DIR/sub (sub "": DIR itself, and then each folder in it, one
 * level down: the tenants' folders), as paths relative to DIR. -1 when DIR cannot be
 * read. */
static int list_transcripts(const char *dir, const char *sub, names_t *out)
{
    char folder[2048];
    snprintf(folder, sizeof folder, sub[0] ? "%s/%s" : "%s%s", dir, sub);
    DIR *d = opendir(folder);
    if (!d) {
        if (!sub[0])
            fprintf(stderr, "kvp learn: cannot read %s: %s\n", dir, strerror(errno));
        return -1;
    }
    size_t ext = strlen(KVP_TOKFILE_EXT);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char rel[1024], path[3100];
        snprintf(rel, sizeof rel, sub[0] ? "%s/%.256s" : "%s%.256s", sub, e->d_name);
        size_t len = strlen(e->d_name);
        if (len <= ext || strcmp(e->d_name + len - ext, KVP_TOKFILE_EXT)) {
            struct stat st;
            snprintf(path, sizeof path, "%s/%s", dir, rel);
            if (!sub[0] && lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
                list_transcripts(dir, e->d_name, out);
            continue;
        }
        if (out->n == out->cap) {
            size_t cap = out->cap ? 2 * out->cap : 64;
            char **v = realloc(out->v, cap * sizeof *v);
            if (!v)
                break;
            out->v = v;
            out->cap = cap;
        }
        if (!(out->v[out->n] = strdup(rel)))
            break;
        out->n++;
    }
    closedir(d);
    return 0;
}

/* Reads the transcript files into train and held-out id files; returns the usable
 * files (counts in n_train, n_held), or -1. */
static int gather(const opts *o, const kvp_model_config *cfg, const char *train_path,
                  const char *held_path, int *n_train, int *n_held, long *tok_train,
                  long *tok_held)
{
    names_t list = {0};
    if (list_transcripts(o->dir, "", &list) < 0)
        return -1;
    char **names = list.v;
    size_t n = list.n;
    qsort(names, n, sizeof *names, by_name);
    FILE *ft = fopen(train_path, "w"), *fh = fopen(held_path, "w");
    int rc = ft && fh ? 0 : -1;
    if (rc < 0)
        fprintf(stderr, "kvp learn: cannot write %s: %s\n", ft ? held_path : train_path,
                strerror(errno));
    *n_train = *n_held = 0;
    *tok_train = *tok_held = 0;
    int skipped = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char path[3100], err[3500];
        snprintf(path, sizeof path, "%s/%s", o->dir, names[i]);
        int *ids = NULL, count = 0;
        uint64_t fp = 0;
        int r = kvp_tokfile_read(path, cfg->vocab_size, &ids, &count, &fp, err, sizeof err);
        if (r == 0 && fp != cfg->fingerprint) {
            snprintf(err, sizeof err, "%s: another model's transcript (weights %016llx, not "
                     "%016llx)", path, (unsigned long long)fp, (unsigned long long)cfg->fingerprint);
            r = -EINVAL;
        }
        if (r < 0) {
            fprintf(stderr, "kvp learn: skipping %s\n", err);
            skipped++;
        } else if (count > 1) {
            int h = held_out(names[i], o->holdout);
            if (write_ids(h ? fh : ft, ids, count) < 0)
                rc = -1;
            *(h ? n_held : n_train) += 1;
            *(h ? tok_held : tok_train) += count;
        }
        free(ids);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (ft && fclose(ft))
        rc = -1;
    if (fh && fclose(fh))
        rc = -1;
    if (rc < 0)
        return -1;
    fprintf(stderr, "kvp learn: %d transcripts for training (%ld tokens), %d held out (%ld "
            "tokens), %d skipped\n", *n_train, *tok_train, *n_held, *tok_held, skipped);
    return *n_train + *n_held;
}

/* From an evaluation's results.csv: the policy's ranking C/C* and its streaming KL
 * averaged over the budgets. 0, or -1 when a figure is missing. */
static int figures(const char *eval_dir, const char *policy, double *cc, double *kl)
{
    char path[1200], line[512];
    snprintf(path, sizeof path, "%s/results.csv", eval_dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int have_cc = 0, n_kl = 0;
    double sum = 0.0;
    while (fgets(line, sizeof line, f)) {
        char proto[32], pol[64], budget[16], metric[32];
        double v;
        if (sscanf(line, "%31[^,],%63[^,],%15[^,],%31[^,],%lf", proto, pol, budget, metric, &v) != 5 ||
            strcmp(pol, policy))
            continue;
        if (!strcmp(proto, "ranking") && !strcmp(metric, "cc_ratio")) {
            *cc = v;
            have_cc = 1;
        } else if (!strcmp(proto, "streaming") && !strcmp(metric, "kl")) {
            sum += v;
            n_kl++;
        }
    }
    fclose(f);
    *kl = n_kl ? sum / n_kl : 0.0;
    return have_cc && n_kl ? 0 : -1;
}

static int evaluate(const opts *o, const char *held, const char *dir, const char *policies,
                    const char *file, long cut)
{
    kvp_eval_cli_opts eo;
    kvp_eval_defaults(&eo);
    eo.model = o->a.model;
    eo.tokenizer = o->a.tokenizer;
    eo.text = held;
    eo.conversations = KVP_CORPUS_IDS;
    eo.out = dir;
    eo.policies = policies;
    eo.policy_file = file;
    eo.budgets = o->a.budgets;
    eo.split = 0.0;
    eo.seqs = o->a.eval_seqs;
    eo.seq_len = o->a.seq_len;
    eo.cut = cut;
    eo.streams = o->streams;
    eo.stream_len = o->stream_len;
    eo.threads = o->a.threads;
    eo.seed = o->a.seed;
    return kvp_eval_run(&eo);
}

int kvp_cmd_learn_transcripts(int argc, char **argv)
{
    opts o = {.a = {.seq_len = 512, .max_seqs = 300, .steps = 3000, .eval_seqs = 32,
                    .threads = kvp_stage_threads(), .seed = 1, .budgets = "16,32,64,128",
                    .fit_seqs = KVP_WINDOWFIT_SEQS},
              .holdout = 0.2, .max_seconds = 3600, .streams = 8, .min_files = 4};
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kvp_model_config cfg;
    if (kvp_learn_model_shape(&o.a, &cfg, NULL, NULL))
        return 1;
    if (o.a.seq_len > cfg.seq_len)
        o.a.seq_len = cfg.seq_len;
    char out[1024], work[1024];
    if (kvp_learn_dirs(o.a.model, o.a.out, o.a.work, "kvp-learn-transcripts", 0700, out, sizeof out,
                       work, sizeof work))
        return 1;
    char train_ids[1100], held_ids[1100], init[1100], trained[1100], calibrated[1100];
    char eval_new[1100], eval_cur[1100];
    snprintf(train_ids, sizeof train_ids, "%s/train.ids", work);
    snprintf(held_ids, sizeof held_ids, "%s/heldout.ids", work);
    snprintf(init, sizeof init, "%s/init.kvp", work);
    snprintf(trained, sizeof trained, "%s/trained.kvp", work);
    snprintf(calibrated, sizeof calibrated, "%s/policy.kvp", work);
    snprintf(eval_new, sizeof eval_new, "%s/eval-new", work);
    snprintf(eval_cur, sizeof eval_cur, "%s/eval-installed", work);
    int n_train, n_held;
    long tok_train, tok_held;
    int usable = gather(&o, &cfg, train_ids, held_ids, &n_train, &n_held, &tok_train, &tok_held);
    if (usable < 0)
        return 1;
    if (usable < o.min_files || n_train < 1 || n_held < 1) {
        fprintf(stderr, "kvp learn: %d usable transcripts (%d for training, %d held out): "
                "fewer than needed (--min-transcripts %ld, one on each side); the installed "
                "policy is kept\n", usable, n_train, n_held, o.min_files);
        return KEPT;
    }

    kvp_learn_run run = {.model = o.a.model, .tokenizer = o.a.tokenizer, .work = work,
                         .seq_len = o.a.seq_len, .max_seqs = o.a.max_seqs, .steps = o.a.steps,
                         .threads = o.a.threads, .seed = o.a.seed};
    kvp_trace_opts to;
    kvp_learn_trace_opts(&run, train_ids, KVP_CORPUS_IDS, &to);
    fprintf(stderr, "kvp learn: [1/7] trace\n");
    if (kvp_trace_run(&to))
        return 1;
    kvp_policy_init_opts po;
    kvp_learn_policy_init_opts(&run, init, &po);
    fprintf(stderr, "kvp learn: [2/7] policy-init\n");
    if (kvp_policy_init_run(&po))
        return 1;
    long cut = kvp_learn_val_cut(o.a.seq_len);
    kvp_train_opts tr;
    kvp_learn_train_opts(&run, init, trained, cut, o.max_seconds, &tr);
    fprintf(stderr, "kvp learn: [3/7] train\n");
    if (kvp_train_run(&tr))
        return 1;
    kvp_calibrate_opts co;
    kvp_learn_calibrate_opts(&run, trained, calibrated, &co);
    fprintf(stderr, "kvp learn: [4/7] calibrate\n");
    if (kvp_calibrate_run(&co))
        return 1;
    if (o.a.fit_seqs > 0) {
        kvp_fit_window_opts fo;
        kvp_learn_fit_window_opts(&run, calibrated, o.a.fit_seqs, 0.0, &fo);
        fprintf(stderr, "kvp learn: [5/7] fit-window\n");
        if (kvp_fit_window_run(&fo))
            return 1;
    } else {
        fprintf(stderr, "kvp learn: [5/7] fit-window skipped (--fit-seqs 0)\n");
    }

    /* The comparison on the held-out transcripts: the new policy and streaming in one
     * evaluation; the installed file, if any, in another with the same settings. */
    fprintf(stderr, "kvp learn: [6/7] eval (new policy and the streaming fallback)\n");
    if (evaluate(&o, held_ids, eval_new, "kvp,streaming", calibrated, cut))
        return 1;
    double cc_new, kl_new, cc_cur, kl_cur;
    if (figures(eval_new, "kvp", &cc_new, &kl_new)) {
        fprintf(stderr, "kvp learn: the evaluation in %s has no ranking or streaming figures "
                "for the new policy (too few held-out tokens for --seq-len %ld / --stream-len "
                "%ld?)\n", eval_new, o.a.seq_len, o.stream_len);
        return 1;
    }
    kvp_agent_set cur;
    char err[512] = "";
    int have_cur = access(out, F_OK) == 0 &&
                   kvp_agent_set_load(&cur, out, &cfg, err, sizeof err) == 0;
    if (have_cur)
        kvp_agent_set_free(&cur);
    else if (access(out, F_OK) == 0)
        fprintf(stderr, "kvp learn: the installed %s does not load (%s): compared with the "
                "streaming fallback kvpd uses then\n", out, err);
    const char *cur_name = have_cur ? out : "streaming (no learned policy installed)";
    fprintf(stderr, "kvp learn: [7/7] eval (%s)\n", cur_name);
    if (have_cur) {
        if (evaluate(&o, held_ids, eval_cur, "kvp", out, cut) ||
            figures(eval_cur, "kvp", &cc_cur, &kl_cur)) {
            fprintf(stderr, "kvp learn: cannot evaluate the installed policy\n");
            return 1;
        }
    } else if (figures(eval_new, "streaming", &cc_cur, &kl_cur)) {
        fprintf(stderr, "kvp learn: no figures for the streaming fallback in %s\n", eval_new);
        return 1;
    }
    int better = cc_new < cc_cur && kl_new < kl_cur;
    printf("held-out transcripts: %d (%ld tokens), budgets %s\n", n_held, tok_held, o.a.budgets);
    printf("%-44s %8s %14s\n", "policy", "C/C*", "streaming KL");
    printf("%-44s %8.4f %14.6f\n", "new (learned from the transcripts)", cc_new, kl_new);
    printf("%-44.44s %8.4f %14.6f\n", cur_name, cc_cur, kl_cur);
    fflush(stdout);
    if (!better) {
        fprintf(stderr, "kvp learn: the new policy does not beat %s on both (C/C* %.4f vs "
                "%.4f, streaming KL %.6f vs %.6f); kept the installed one, the new one is %s\n",
                cur_name, cc_new, cc_cur, kl_new, kl_cur, calibrated);
        return KEPT;
    }
    if (kvp_learn_install(calibrated, out, &cfg))
        return 1;
    fprintf(stderr, "kvp learn: installed %s (C/C* %.4f, streaming KL %.6f on held-out "
            "transcripts); reload kvpd (SIGHUP) to use it\n", out, cc_new, kl_new);
    return 0;
}
