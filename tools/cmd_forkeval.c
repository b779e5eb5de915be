/* kvp forkeval: the quality of forked caches (offline/forkeval.h, docs/evaluation.md
 * "Forked caches"): per policy and budget, the mean one-shot KL(full || fork) and
 * KL(full || scratch) over held-out sequences, printed as a markdown table. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "offline/eval.h"
#include "offline/forkeval.h"
#include "offline/oracle.h"
#include "offline/trace.h"
#include "tools/cli.h"
#include "tools/corpus.h"

#define MAX_ITEMS 16

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp forkeval --model M --text FILE [options]\n"
        "  --tokenizer PATH   tokenizer for llama2.c checkpoints\n"
        "  --policies LIST    comma-separated, from: %s\n"
        "                     (default streaming,tova,h2o,snapkv,expected_attention,kvp;\n"
        "                     kvp only with --policy-file)\n"
        "  --policy-file F    KVP policy file (for kvp, or a KVzap surrogate for kvzap)\n"
        "  --budgets LIST     rows per KV head, comma-separated (default 64,128)\n"
        "  --split F          evaluate on the text after the first F of it (default 0.8)\n"
        "  --seqs N           held-out sequences (default 16)\n"
        "  --prefix N         tokens of the shared prefix P, BOS included (default 256)\n"
        "  --source N         tokens of the source's continuation A (default 64)\n"
        "  --branch N         tokens of the fork's continuation B (default 64)\n"
        "  --chunk N          eviction chunk (default " KVP_STR(KVP_DEFAULT_CHUNK) ")\n"
        "Per sequence: the source streams P + A under the policy at the budget; the fork is\n"
        "the source's cache cut at |P| plus B; scratch is P + B from an empty cache; full is\n"
        "P + B without eviction. Prints the mean KL(full || fork), KL(full || scratch) of\n"
        "the next-token distribution after B, and their ratio.\n",
        kvp_offline_policy_names());
}

static int usage_error(const char *what, const char *val)
{
    fprintf(stderr, "kvp forkeval: %s%s%s\n(kvp forkeval --help for usage)\n", what,
            val ? " " : "", val ? val : "");
    return 2;
}

int kvp_cmd_forkeval(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *text_path = NULL, *policy_file = NULL;
    char pol_buf[512] = "", bud_buf[256] = "64,128";
    int pol_given = 0;
    long n_seqs = 16, n_prefix = 256, n_source = 64, n_branch = 64, chunk = KVP_DEFAULT_CHUNK;
    double split = 0.8;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'z'}, {"text", 1, 0, 'x'},
        {"policies", 1, 0, 'p'}, {"policy-file", 1, 0, 'f'}, {"budgets", 1, 0, 'b'},
        {"split", 1, 0, 's'}, {"seqs", 1, 0, 'n'}, {"prefix", 1, 0, 'P'},
        {"source", 1, 0, 'A'}, {"branch", 1, 0, 'B'}, {"chunk", 1, 0, 'c'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0},
    };
    int ch, idx;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        int ok = 1;
        switch (ch) {
        case 'm': model_path = optarg; break;
        case 'z': tok_path = optarg; break;
        case 'x': text_path = optarg; break;
        case 'f': policy_file = optarg; break;
        case 'p': snprintf(pol_buf, sizeof pol_buf, "%s", optarg); pol_given = 1; break;
        case 'b': snprintf(bud_buf, sizeof bud_buf, "%s", optarg); break;
        case 's': ok = kvp_parse_double(optarg, 0.0, 1.0, &split); break;
        case 'n': ok = kvp_parse_long(optarg, 1, 1 << 20, &n_seqs); break;
        case 'P': ok = kvp_parse_long(optarg, 2, 1 << 20, &n_prefix); break;
        case 'A': ok = kvp_parse_long(optarg, 1, 1 << 20, &n_source); break;
        case 'B': ok = kvp_parse_long(optarg, 1, 1 << 20, &n_branch); break;
        case 'c': ok = kvp_parse_long(optarg, 1, 1 << 20, &chunk); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvp forkeval: bad value '%s' for --%s\n(kvp forkeval --help for "
                    "usage)\n", optarg, opts[idx].name);
            return 2;
        }
    }
    if (!model_path || !text_path || optind < argc)
        return usage_error("--model and --text are required", NULL);
    if (!pol_given)
        snprintf(pol_buf, sizeof pol_buf, "%s",
                 policy_file ? "streaming,tova,h2o,snapkv,expected_attention,kvp"
                             : "streaming,tova,h2o,snapkv,expected_attention");
    char *names[MAX_ITEMS], *fields[MAX_ITEMS];
    int n_pol, n_bud, budgets[MAX_ITEMS];
    if (!kvp_split_list(pol_buf, names, MAX_ITEMS, &n_pol))
        return usage_error("bad policy list", pol_buf);
    for (int i = 0; i < n_pol; i++) {
        if (kvp_eval_policy_index(names[i]) < 0 || kvp_offline_policy_eval_only(names[i]))
            return usage_error("unknown policy (the oracle cannot fork, nor can kvzip: both "
                               "are evaluation-only):", names[i]);
        if (!strcmp(names[i], "kvp") && !policy_file)
            return usage_error("policy kvp needs --policy-file", NULL);
        if (!strcmp(names[i], "kvzap") && !policy_file)
            return usage_error("policy kvzap needs --policy-file (the surrogate's file)", NULL);
    }
    if (!kvp_split_list(bud_buf, fields, MAX_ITEMS, &n_bud))
        return usage_error("bad budget list", bud_buf);
    for (int i = 0; i < n_bud; i++) {
        long b;
        if (!kvp_parse_long(fields[i], 1, 1 << 20, &b))
            return usage_error("bad budget (a positive integer):", fields[i]);
        budgets[i] = (int)b;
    }

    char err[600];
    kvp_model m;
    if (kvp_model_load(&m, model_path, tok_path, err, sizeof err)) {
        fprintf(stderr, "kvp forkeval: %s\n", err);
        return 1;
    }
    int status = 1, V = m.cfg.vocab_size, bos = m.tok.bos_id;
    long seq_len = n_prefix + n_source + n_branch;
    char *text = NULL;
    int *ids = NULL, *seq = NULL;
    float *full = NULL;
    double *kl = NULL;
    kvp_runstate rs;
    int have_rs = 0;
    if (n_prefix + (n_source > n_branch ? n_source : n_branch) > m.cfg.seq_len) {
        fprintf(stderr, "kvp forkeval: --prefix %ld + --source %ld or --branch %ld exceeds the "
                "model's context %d\n", n_prefix, n_source, n_branch, m.cfg.seq_len);
        status = 2;
        goto out;
    }
    size_t text_len;
    if (!(text = kvp_corpus_read(text_path, &text_len))) {
        fprintf(stderr, "kvp forkeval: cannot read %s: %s\n", text_path, strerror(errno));
        goto out;
    }
    char cerr[512];
    long n_ids = kvp_corpus_tokens(&m, text_path, text, kvp_trace_split_at(text, text_len, split),
                                   text_len, 0, &ids, cerr, sizeof cerr);
    if (n_ids < 0) {
        fprintf(stderr, "kvp forkeval: %s\n", cerr);
        goto out;
    }
    long have = kvp_corpus_count(n_ids, seq_len, bos);
    int n_seq = (int)(n_seqs < have ? n_seqs : have);
    if (n_seq < 1) {
        fprintf(stderr, "kvp forkeval: the held-out part of %s (%ld tokens) is too short for a "
                "sequence of %ld tokens\n", text_path, n_ids, seq_len);
        goto out;
    }
    for (int i = 0; i < n_pol; i++) {
        kvp_policy *p;
        if (kvp_offline_policy_create(&p, names[i], policy_file, &m.cfg, 0, err, sizeof err)) {
            fprintf(stderr, "kvp forkeval: %s\n", err);
            goto out;
        }
        kvp_policy_destroy(p);
    }
    seq = malloc((size_t)seq_len * sizeof *seq);
    full = malloc((size_t)V * sizeof *full);
    kl = calloc((size_t)n_pol * n_bud * 2, sizeof *kl);
    if (!seq || !full || !kl || kvp_runstate_init(&rs, &m.cfg, 512)) {
        fprintf(stderr, "kvp forkeval: out of memory\n");
        goto out;
    }
    have_rs = 1;
    for (int si = 0; si < n_seq; si++) {
        kvp_corpus_sequence(ids, si, seq_len, bos, seq);
        kvp_forkeval_case fc = {seq, (int)n_prefix, seq + n_prefix, (int)n_source,
                                seq + n_prefix + n_source, (int)n_branch, 0, (int)chunk};
        int rc = kvp_forkeval_full(&m, &rs, &fc, full);
        for (int pi = 0; pi < n_pol && !rc; pi++)
            for (int bi = 0; bi < n_bud && !rc; bi++) {
                kvp_policy *p[3] = {0};
                for (int k = 0; k < 3 && !rc; k++)
                    rc = kvp_offline_policy_create(&p[k], names[pi], policy_file, &m.cfg, 1,
                                                   err, sizeof err);
                fc.budget = budgets[bi];
                double kf = 0, ks = 0;
                if (!rc)
                    rc = kvp_forkeval_run(&m, &rs, &fc, p[0], p[1], p[2], full, &kf, &ks,
                                          NULL, NULL);
                for (int k = 0; k < 3; k++)
                    if (p[k])
                        kvp_policy_destroy(p[k]);
                kl[((size_t)pi * n_bud + bi) * 2] += kf;
                kl[((size_t)pi * n_bud + bi) * 2 + 1] += ks;
            }
        if (rc) {
            fprintf(stderr, "kvp forkeval: sequence %d: %s\n", si, strerror(-rc));
            goto out;
        }
    }
    printf("Forked caches on %d sequences of %s: |P| = %ld, |A| = %ld, "
           "|B| = %ld tokens, chunk %ld\n\n", n_seq, text_path, n_prefix, n_source, n_branch, chunk);
    printf("| policy | budget | KL(full\\|\\|fork) | KL(full\\|\\|scratch) | fork / scratch |\n");
    printf("|---|---:|---:|---:|---:|\n");
    for (int pi = 0; pi < n_pol; pi++)
        for (int bi = 0; bi < n_bud; bi++) {
            double kf = kl[((size_t)pi * n_bud + bi) * 2] / n_seq;
            double ks = kl[((size_t)pi * n_bud + bi) * 2 + 1] / n_seq;
            printf("| %s | %d | %.5f | %.5f | ", names[pi], budgets[bi], kf, ks);
            if (ks > 0)
                printf("%.2f |\n", kf / ks);
            else
                printf("- |\n");
        }
    status = 0;
out:
    if (have_rs)
        kvp_runstate_free(&rs);
    free(kl);
    free(full);
    free(seq);
    free(ids);
    free(text);
    kvp_model_free(&m);
    return status;
}
