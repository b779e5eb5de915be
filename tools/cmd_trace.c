/* kvp trace: run the unmodified model over real text (teacher forcing) and record what
 * training reads: each agent's keys and values in f16 and the future importance of its
 * rows at a grid of cuts, computed from the queries while they are in memory (one
 * sequence at a time, so memory does not grow with the trace). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/clock.h"
#include "base/parse.h"
#include "model/forward.h"
#include "offline/eval.h"
#include "offline/trace.h"
#include "tools/cli.h"
#include "tools/stages.h"
#include "tools/corpus.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp trace --model M (--text FILE | --conversations FILE) --out DIR [options]\n"
        "  --text FILE        plain text, tokenized line by line\n"
        "  --conversations F  JSON lines, each {\"messages\": [{\"role\": \"system\"|\"user\"|\n"
        "                     \"assistant\", \"content\": TEXT}, ...]}, rendered with the\n"
        "                     model's chat template (special tokens included)\n"
        "  --tokenizer PATH   tokenizer for llama2.c checkpoints\n"
        "  --seq-len N        tokens per sequence, BOS included (default 512, at most the\n"
        "                     model's context)\n"
        "  --max-seqs N       sequences in all (default 400)\n"
        "  --max-seconds S    after the first sequences, trace only as many as fit in S\n"
        "                     seconds in all (their measured time; the split kept)\n"
        "  --split F          the first F of the text (by bytes, moved to a line start:\n"
        "                     whole conversations) gives training sequences, the rest\n"
        "                     validation (default 0.8)\n"
        "  --cut-min N        the grid of cuts whose future importance is stored: N,\n"
        "  --cut-stride S     N + S, N + 2S, ... while at least T tokens follow\n"
        "  --cut-tail T       (defaults %d, %d, %d; kvp train ranks at these cuts)\n"
        "  --targets KIND     the scores stored at each cut: future (the future importance,\n"
        "                     default) or kvzip (KVzip's context-reconstruction scores of\n"
        "                     the prefix, what a KVzap surrogate is trained on; a second\n"
        "                     pass over each cut's prefix, so use a coarser --cut-stride)\n"
        "Writes DIR/trace.kvpt (format: docs/trace-format.md).\n",
        KVP_TRACE_CUT_MIN, KVP_TRACE_CUT_STRIDE, KVP_TRACE_CUT_TAIL);
}

typedef struct {
    int n_layers;
    size_t qn, kn;           /* floats per token */
    float **q, **k, **v;     /* [layer] -> [seq_len][...] */
} capture;

static void tap(void *ctx, int layer, const float *q, const float *k, const float *v, int n)
{
    capture *c = ctx;
    memcpy(c->q[layer], q, (size_t)n * c->qn * sizeof(float));
    memcpy(c->k[layer], k, (size_t)n * c->kn * sizeof(float));
    memcpy(c->v[layer], v, (size_t)n * c->kn * sizeof(float));
}

/* --max-seconds, checked after every sequence from the third on: with `done` sequences
 * traced in `el` seconds (phase p: 0 training, 1 validation) and `per` seconds for each
 * after the first (which also pages the model in), trace only the sequences that still fit,
 * training and validation in the split's proportion. Says so at the first cut and when
 * the count falls by another tenth (a machine that gets busier). */
static void plan(long want[2], int p, long done, double split, double max_seconds, double el,
                 double per, long *said)
{
    long total = want[0] + want[1];
    long fit = done + (long)((max_seconds - el) / (per > 1e-6 ? per : 1e-6));
    if (fit >= total)
        return;
    if (!p) {
        /* the training sequences already traced stay, with their share of validation
         * (so the split holds even when the machine slows down after many of them) */
        long need = (long)ceil((double)done / split);
        if (need >= total)
            return;
        fit = fit < need ? need : fit;
        fit = fit < done + 1 ? done + 1 : fit;   /* one validation sequence at least */
        long train = (long)((double)fit * split + 0.5);
        train = train < done ? done : train > fit - 1 ? fit - 1 : train;
        want[1] = fit - train < want[1] ? fit - train : want[1];
        want[0] = train;
    } else {
        /* the training sequences keep their share of validation here too (a machine that
         * slows down during validation must not leave more training than the split) */
        long need = (long)ceil((double)want[0] / split);
        fit = fit < need ? need : fit;
        want[1] = fit < done ? done - want[0] : fit - want[0];   /* what is done stays */
    }
    if (!*said || want[0] + want[1] <= *said * 9 / 10) {
        fprintf(stderr, "kvp trace: %.1f s a sequence; %ld of the %ld sequences fit in "
                "--max-seconds %.0f: tracing %ld training + %ld validation\n",
                per, want[0] + want[1], *said ? *said : total, max_seconds, want[0], want[1]);
        *said = want[0] + want[1];
    }
}

void kvp_trace_defaults(kvp_trace_opts *o)
{
    *o = (kvp_trace_opts){.seq_len = 512, .max_seqs = 400, .cut_min = KVP_TRACE_CUT_MIN,
                          .cut_stride = KVP_TRACE_CUT_STRIDE, .cut_tail = KVP_TRACE_CUT_TAIL,
                          .split = 0.8, .targets = KVP_TRACE_TARGETS_FUTURE};
}

int kvp_cmd_trace(int argc, char **argv)
{
    kvp_trace_opts t;
    kvp_trace_defaults(&t);
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'z'}, {"text", 1, 0, 'x'}, {"out", 1, 0, 'o'},
        {"conversations", 1, 0, 'C'}, {"seq-len", 1, 0, 'n'}, {"max-seqs", 1, 0, 'N'}, {"split", 1, 0, 's'},
        {"max-seconds", 1, 0, 'M'},
        {"cut-min", 1, 0, 'c'}, {"cut-stride", 1, 0, 'S'}, {"cut-tail", 1, 0, 'T'},
        {"targets", 1, 0, 'K'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o, idx = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        int ok = 1;
        switch (o) {
        case 'm': t.model = optarg; break;
        case 'z': t.tokenizer = optarg; break;
        case 'x': t.text = optarg; break;
        case 'C': t.text = optarg; t.conversations = 1; break;
        case 'o': t.out = optarg; break;
        case 'n': ok = kvp_parse_long(optarg, 8, 1 << 20, &t.seq_len); break;
        case 'N': ok = kvp_parse_long(optarg, 2, 1 << 24, &t.max_seqs); break;
        case 's': ok = kvp_parse_double(optarg, 0.01, 0.99, &t.split); break;
        case 'M': ok = kvp_parse_double(optarg, 1.0, 1e9, &t.max_seconds); break;
        case 'c': ok = kvp_parse_long(optarg, 1, 1 << 20, &t.cut_min); break;
        case 'S': ok = kvp_parse_long(optarg, 1, 1 << 20, &t.cut_stride); break;
        case 'T': ok = kvp_parse_long(optarg, 1, 1 << 20, &t.cut_tail); break;
        case 'K': ok = (t.targets = kvp_trace_targets_parse(optarg)) >= 0; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvp trace: bad value '%s' for --%s\n", optarg, opts[idx].name);
            return 2;
        }
    }
    if (!t.model || !t.text || !t.out || optind < argc) {
        fprintf(stderr, "kvp trace: --model, --text or --conversations, and --out are required\n");
        usage(stderr);
        return 2;
    }
    return kvp_trace_run(&t);
}

/* A trace of KVzip targets: the scores of every agent's rows at every cut n_g of the
 * grid, from the sequence's full cache c: its first n_g tokens (a fork at n_g, the prefix
 * the cut leaves) scored by KVzip's reconstruction pass (kvp_eval_kvzip_scores) on s, a
 * run state without the tracer's tap. buf holds every agent's cuts one after the other,
 * scores[a * grid + g] points at agent a's cut g. */
static int kvzip_targets(const kvp_model *m, kvp_runstate *s, const kvp_cache *c,
                         const int32_t *seq, const kvp_trace_header *h, int len, float *buf,
                         float **scores)
{
    int grid = kvp_trace_n_cuts(h, len), agents = h->n_layers * h->n_kv_heads;
    float *at = buf;
    for (int a = 0; a < agents; a++)
        for (int g = 0; g < grid; g++) {
            scores[(size_t)a * grid + g] = at;
            at += h->cut_min + g * h->cut_stride;
        }
    for (int g = 0; g < grid; g++) {
        int n = h->cut_min + g * h->cut_stride;
        kvp_cache pre;
        int rc = kvp_cache_fork(&pre, c, n);
        if (!rc)
            rc = kvp_eval_kvzip_scores(m, s, &pre, seq);
        for (int a = 0; !rc && a < agents; a++)
            memcpy(scores[(size_t)a * grid + g], pre.heads[a].score, (size_t)n * sizeof(float));
        kvp_cache_free(&pre);
        if (rc)
            return rc;
    }
    return 0;
}

int kvp_trace_run(const kvp_trace_opts *t)
{
    const char *model_path = t->model, *tok_path = t->tokenizer, *text_path = t->text,
               *out_dir = t->out;
    int conversations = t->conversations;
    long seq_len = t->seq_len, max_seqs = t->max_seqs, cut_min = t->cut_min,
         cut_stride = t->cut_stride, cut_tail = t->cut_tail;
    double split = t->split, max_seconds = t->max_seconds;
    char err[512];
    kvp_model m;
    if (kvp_model_load(&m, model_path, tok_path, err, sizeof err)) {
        fprintf(stderr, "kvp trace: %s\n", err);
        return 1;
    }
    if (seq_len > m.cfg.seq_len) {
        fprintf(stderr, "kvp trace: --seq-len %ld exceeds the model's context %d\n", seq_len, m.cfg.seq_len);
        kvp_model_free(&m);
        return 2;
    }
    kvp_model_use_cores(&m);   /* one forward pass at a time */
    int status = 1;
    size_t text_len = 0;
    char *text = NULL;
    int *ids[2] = {NULL, NULL};
    capture cap = {0};
    kvp_runstate s = {0}, zs = {0};   /* zs: KVzip's passes, without the tap */
    float *zbuf = NULL, **zptr = NULL;
    kvp_trace_writer w = {0};
    int writer_open = 0;
    FILE *tf = fopen(text_path, "rb");
    if (!tf || fseek(tf, 0, SEEK_END) || (long)(text_len = (size_t)ftell(tf)) < 0 ||
        fseek(tf, 0, SEEK_SET) || !(text = malloc(text_len + 1)) ||
        fread(text, 1, text_len, tf) != text_len) {
        fprintf(stderr, "kvp trace: cannot read %s: %s\n", text_path, strerror(errno));
        if (tf)
            fclose(tf);
        goto out;
    }
    fclose(tf);
    size_t cut = kvp_trace_split_at(text, text_len, split);
    long n_ids[2];
    if (conversations)
        fprintf(stderr, "kvp trace: conversations rendered with the model's %s template\n",
                kvp_corpus_format(&m));
    for (int p = 0; p < 2; p++) {
        size_t from = p ? cut : 0, to = p ? text_len : cut;
        n_ids[p] = kvp_corpus_tokens(&m, text_path, text, from, to, conversations, &ids[p],
                                     err, sizeof err);
        if (n_ids[p] < 0) {
            fprintf(stderr, "kvp trace: %s\n", err);
            goto out;
        }
    }
    /* at least one sequence on each side of the split */
    long want[2] = {(long)(max_seqs * split + 0.5), 0};
    want[0] = want[0] < 1 ? 1 : want[0] > max_seqs - 1 ? max_seqs - 1 : want[0];
    want[1] = max_seqs - want[0];
    long have[2] = {kvp_corpus_count(n_ids[0], seq_len, m.tok.bos_id),
                    kvp_corpus_count(n_ids[1], seq_len, m.tok.bos_id)};
    for (int p = 0; p < 2; p++)
        if (want[p] > have[p])
            want[p] = have[p];
    if (want[0] < 1 || want[1] < 1) {
        fprintf(stderr, "kvp trace: %s is too short for one training and one validation "
                "sequence of %ld tokens\n", text_path, seq_len);
        goto out;
    }

    cap.n_layers = m.cfg.n_layers;
    cap.qn = (size_t)m.cfg.n_heads * m.cfg.head_dim;
    cap.kn = (size_t)m.cfg.n_kv_heads * m.cfg.head_dim;
    cap.q = calloc((size_t)m.cfg.n_layers, sizeof *cap.q);
    cap.k = calloc((size_t)m.cfg.n_layers, sizeof *cap.k);
    cap.v = calloc((size_t)m.cfg.n_layers, sizeof *cap.v);
    if (!cap.q || !cap.k || !cap.v || kvp_runstate_init(&s, &m.cfg, (int)seq_len))
        goto oom;
    for (int l = 0; l < m.cfg.n_layers; l++)
        if (!(cap.q[l] = malloc(seq_len * cap.qn * sizeof(float))) ||
            !(cap.k[l] = malloc(seq_len * cap.kn * sizeof(float))) ||
            !(cap.v[l] = malloc(seq_len * cap.kn * sizeof(float))))
            goto oom;
    s.hooks.tap = tap;
    s.hooks.tap_ctx = &cap;
    int zip = t->targets == KVP_TRACE_TARGETS_KVZIP;
    if (zip) {
        kvp_trace_header g = {.cut_min = (int32_t)cut_min, .cut_stride = (int32_t)cut_stride,
                              .cut_tail = (int32_t)cut_tail};
        size_t grid = (size_t)kvp_trace_n_cuts(&g, (int)seq_len), agents = (size_t)m.cfg.n_layers * m.cfg.n_kv_heads;
        size_t floats = grid * (size_t)cut_min + (size_t)cut_stride * grid * (grid - 1) / 2;
        if (kvp_runstate_init(&zs, &m.cfg, (int)seq_len) ||
            !(zbuf = malloc((agents * floats + 1) * sizeof *zbuf)) ||
            !(zptr = malloc((agents * grid + 1) * sizeof *zptr)))
            goto oom;
        fprintf(stderr, "kvp trace: targets: KVzip's scores at %zu cuts a sequence\n", grid);
    }

    if (mkdir(out_dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "kvp trace: cannot create %s: %s\n", out_dir, strerror(errno));
        goto out;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/trace.kvpt", out_dir);
    kvp_trace_header h = {
        .n_layers = m.cfg.n_layers, .n_heads = m.cfg.n_heads, .n_kv_heads = m.cfg.n_kv_heads,
        .head_dim = m.cfg.head_dim, .seq_len = (int32_t)seq_len, .split = split,
        .text_bytes = text_len, .text_hash = kvp_fnv1a(KVP_FNV1A_INIT, text, text_len),
        .cut_min = (int32_t)cut_min, .cut_stride = (int32_t)cut_stride, .cut_tail = (int32_t)cut_tail,
        .targets = t->targets};
    snprintf(h.model, sizeof h.model, "%.63s", m.name);
    if (kvp_trace_writer_open(&w, path, &h, err, sizeof err)) {
        fprintf(stderr, "kvp trace: %s\n", err);
        goto out;
    }
    writer_open = 1;
    int32_t *seq = malloc(seq_len * sizeof *seq);
    if (!seq)
        goto oom;
    double t0 = kvp_now(), t1 = 0.0;
    long said = 0;   /* the sequence count --max-seconds last announced */
    int tty = isatty(2);
    for (int p = 0; p < 2; p++)
        for (long i = 0; i < want[p]; i++) {
            kvp_corpus_sequence(ids[p], i, seq_len, m.tok.bos_id, seq);
            kvp_cache c;
            int rc = kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim, &m.cfg.rope);
            if (!rc)
                rc = kvp_forward(&m, &s, &c, seq, (int)seq_len, NULL);
            if (!rc && zip)
                rc = kvzip_targets(&m, &zs, &c, seq, &h, (int)seq_len, zbuf, zptr);
            kvp_cache_free(&c);
            if (!rc && zip)
                rc = kvp_trace_writer_add_scores(&w, seq, (int)seq_len, (const float *const *)cap.k,
                                                 (const float *const *)cap.v,
                                                 (const float *const *)zptr);
            else if (!rc)
                rc = kvp_trace_writer_add(&w, seq, (int)seq_len, (const float *const *)cap.q,
                                          (const float *const *)cap.k, (const float *const *)cap.v);
            if (rc) {
                free(seq);
                fprintf(stderr, "kvp trace: sequence %ld: %s\n", i, strerror(-rc));
                goto out;
            }
            long done = (p ? want[0] : 0) + i + 1;
            double el = kvp_now() - t0;
            if (done == 1)
                t1 = el;
            if (max_seconds > 0 && done >= (want[0] < 3 ? want[0] : 3))
                plan(want, p, done, split, max_seconds, el,
                     done > 1 ? (el - t1) / (double)(done - 1) : el, &said);
            /* One line rewritten on a terminal; a line per tenth in a log. */
            long total = want[0] + want[1];
            if (tty || done * 10 / total != (done - 1) * 10 / total || done == total)
                fprintf(stderr, "%skvp trace: %s sequence %ld/%ld (%.0f%%, left %.0f s)%s",
                        tty ? "\r" : "", p ? "validation" : "training", i + 1, want[p],
                        100.0 * (double)done / (double)total,
                        el / (double)done * (double)(total - done), tty ? "  " : "\n");
        }
    free(seq);
    if (tty)
        fprintf(stderr, "\n");
    writer_open = 0;
    if (kvp_trace_writer_close(&w, (int)want[0], err, sizeof err)) {
        fprintf(stderr, "kvp trace: %s\n", err);
        goto out;
    }
    fprintf(stderr, "kvp trace: wrote %s: %ld training + %ld validation sequences of %ld tokens "
            "(split at byte %zu of %zu)\n", path, want[0], want[1], seq_len, cut, text_len);
    status = 0;
    goto out;
oom:
    fprintf(stderr, "kvp trace: out of memory\n");
out:
    if (writer_open)
        kvp_trace_writer_abort(&w);
    for (int l = 0; cap.q && l < m.cfg.n_layers; l++) {
        free(cap.q[l]);
        free(cap.k[l]);
        free(cap.v[l]);
    }
    free(cap.q);
    free(cap.k);
    free(cap.v);
    kvp_runstate_free(&s);
    kvp_runstate_free(&zs);
    free(zbuf);
    free(zptr);
    free(ids[0]);
    free(ids[1]);
    free(text);
    kvp_model_free(&m);
    return status;
}
