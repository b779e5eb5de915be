/* kvp trace: record q/k/v of the unmodified model over real text (teacher forcing). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "base/checksum.h"
#include "base/parse.h"
#include "model/forward.h"
#include "offline/trace.h"
#include "model/template.h"
#include "tools/cli.h"

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
        "  --split F          the first F of the text (by bytes, moved to a line start:\n"
        "                     whole conversations) gives training sequences, the rest\n"
        "                     validation (default 0.8)\n"
        "Writes DIR/trace.kvpt (format: docs/trace-format.md).\n");
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

/* The conversations of JSON lines text[0..len) rendered one after the other with the
 * model's chat template, as the daemon would have them in its cache. *out is malloc'd;
 * returns the token count, or -1 with a message naming the line. */
static long render_conversations(const kvp_template *t, const char *path, const char *text,
                                 size_t len, long first_line, int **out, char *err, size_t errlen)
{
    long n = 0, cap = 0, line = first_line;
    int *ids = NULL;
    for (size_t off = 0; off < len; line++) {
        const char *nl = memchr(text + off, '\n', len - off);
        size_t end = nl ? (size_t)(nl - text) : len;
        const char *at = text + off;
        size_t llen = end - off;
        off = end + 1;
        while (llen && (at[llen - 1] == '\r' || at[llen - 1] == ' '))
            llen--;
        if (!llen)
            continue;
        json_error_t je;
        json_t *j = json_loadb(at, llen, 0, &je);
        json_t *msgs = json_is_object(j) ? json_object_get(j, "messages") : NULL;
        size_t nm = json_is_array(msgs) ? json_array_size(msgs) : 0;
        kvp_chat_msg *cm = calloc(nm ? nm : 1, sizeof *cm);
        const char *system = NULL, *bad = !j ? je.text : !nm ? "no \"messages\" array" : NULL;
        size_t system_len = 0;
        int nc = 0;
        for (size_t i = 0; !bad && cm && i < nm; i++) {
            json_t *m = json_array_get(msgs, i), *c = json_object_get(m, "content");
            const char *role = json_string_value(json_object_get(m, "role"));
            if (!role || !json_is_string(c))
                bad = "a message without a string role and content";
            else if (!strcmp(role, "system") && i == 0) {
                system = json_string_value(c);
                system_len = json_string_length(c);
            } else if (!strcmp(role, "user") || !strcmp(role, "assistant"))
                cm[nc++] = (kvp_chat_msg){!strcmp(role, "user"), json_string_value(c),
                                          json_string_length(c)};
            else
                bad = "a role other than system (first), user or assistant";
        }
        int *tok = NULL;
        long k = bad || !cm ? -1 : kvp_template_render(t, system, system_len, cm, nc, &tok);
        if (k >= 0 && n + k > cap) {
            long want = cap ? cap : 4096;
            while (want < n + k)
                want *= 2;
            int *grown = realloc(ids, (size_t)want * sizeof *ids);
            if (grown) {
                ids = grown;
                cap = want;
            } else {
                k = -1;
                bad = "out of memory";
            }
        }
        if (k >= 0) {
            memcpy(ids + n, tok, (size_t)k * sizeof *ids);
            n += k;
        }
        free(tok);
        free(cm);
        json_decref(j);
        if (k < 0) {
            snprintf(err, errlen, "%s:%ld: %s", path, line, bad ? bad : "cannot render it");
            free(ids);
            return -1;
        }
    }
    *out = ids;
    return n;
}

int kvp_cmd_trace(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *text_path = NULL, *out_dir = NULL;
    int conversations = 0;
    long seq_len = 512, max_seqs = 400;
    double split = 0.8;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'z'}, {"text", 1, 0, 'x'}, {"out", 1, 0, 'o'},
        {"conversations", 1, 0, 'C'}, {"seq-len", 1, 0, 'n'}, {"max-seqs", 1, 0, 'N'}, {"split", 1, 0, 's'},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o, idx = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        int ok = 1;
        switch (o) {
        case 'm': model_path = optarg; break;
        case 'z': tok_path = optarg; break;
        case 'x': text_path = optarg; break;
        case 'C': text_path = optarg; conversations = 1; break;
        case 'o': out_dir = optarg; break;
        case 'n': ok = kvp_parse_long(optarg, 8, 1 << 20, &seq_len); break;
        case 'N': ok = kvp_parse_long(optarg, 2, 1 << 24, &max_seqs); break;
        case 's': ok = kvp_parse_double(optarg, 0.01, 0.99, &split); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvp trace: bad value '%s' for --%s\n", optarg, opts[idx].name);
            return 2;
        }
    }
    if (!model_path || !text_path || !out_dir || optind < argc) {
        fprintf(stderr, "kvp trace: --model, --text or --conversations, and --out are required\n");
        usage(stderr);
        return 2;
    }
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
    int status = 1;
    size_t text_len = 0;
    char *text = NULL;
    int *ids[2] = {NULL, NULL};
    capture cap = {0};
    kvp_runstate s = {0};
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
    if (conversations) {
        kvp_template tmpl;
        char note[256];
        if (kvp_template_init(&tmpl, &m, NULL, note, sizeof note) < 0) {
            fprintf(stderr, "kvp trace: %s\n", note);
            goto out;
        }
        long lines_before_cut = 1;
        for (size_t i = 0; i < cut; i++)
            lines_before_cut += text[i] == '\n';
        n_ids[0] = render_conversations(&tmpl, text_path, text, cut, 1, &ids[0], err, sizeof err);
        n_ids[1] = n_ids[0] < 0 ? -1
                 : render_conversations(&tmpl, text_path, text + cut, text_len - cut,
                                        lines_before_cut, &ids[1], err, sizeof err);
        if (n_ids[0] < 0 || n_ids[1] < 0) {
            fprintf(stderr, "kvp trace: %s\n", err);
            goto out;
        }
        fprintf(stderr, "kvp trace: conversations rendered with the %s template: %ld + %ld tokens\n",
                kvp_template_name(tmpl.format), n_ids[0], n_ids[1]);
    } else {
        n_ids[0] = kvp_trace_tokenize(&m.tok, text, cut, &ids[0]);
        n_ids[1] = kvp_trace_tokenize(&m.tok, text + cut, text_len - cut, &ids[1]);
        if (n_ids[0] < 0 || n_ids[1] < 0) {
            fprintf(stderr, "kvp trace: cannot tokenize %s\n", text_path);
            goto out;
        }
    }
    /* at least one sequence on each side of the split */
    long want[2] = {(long)(max_seqs * split + 0.5), 0};
    want[0] = want[0] < 1 ? 1 : want[0] > max_seqs - 1 ? max_seqs - 1 : want[0];
    want[1] = max_seqs - want[0];
    long have[2] = {n_ids[0] / (seq_len - 1), n_ids[1] / (seq_len - 1)};
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

    if (mkdir(out_dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "kvp trace: cannot create %s: %s\n", out_dir, strerror(errno));
        goto out;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/trace.kvpt", out_dir);
    kvp_trace_header h = {
        .n_layers = m.cfg.n_layers, .n_heads = m.cfg.n_heads, .n_kv_heads = m.cfg.n_kv_heads,
        .head_dim = m.cfg.head_dim, .seq_len = (int32_t)seq_len, .split = split,
        .text_bytes = text_len, .text_hash = kvp_fnv1a(KVP_FNV1A_INIT, text, text_len)};
    snprintf(h.model, sizeof h.model, "%.63s", m.name);
    if (kvp_trace_writer_open(&w, path, &h, err, sizeof err)) {
        fprintf(stderr, "kvp trace: %s\n", err);
        goto out;
    }
    writer_open = 1;
    int32_t *seq = malloc(seq_len * sizeof *seq);
    if (!seq)
        goto oom;
    for (int p = 0; p < 2; p++)
        for (long i = 0; i < want[p]; i++) {
            seq[0] = m.tok.bos_id;
            for (long j = 1; j < seq_len; j++)
                seq[j] = ids[p][i * (seq_len - 1) + j - 1];
            kvp_cache c;
            int rc = kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim, &m.cfg.rope);
            if (!rc)
                rc = kvp_forward(&m, &s, &c, seq, (int)seq_len, NULL);
            kvp_cache_free(&c);
            if (!rc)
                rc = kvp_trace_writer_add(&w, seq, (int)seq_len, (const float *const *)cap.q,
                                          (const float *const *)cap.k, (const float *const *)cap.v);
            if (rc) {
                free(seq);
                fprintf(stderr, "kvp trace: sequence %ld: %s\n", i, strerror(-rc));
                goto out;
            }
            fprintf(stderr, "\rkvp trace: %s sequence %ld/%ld", p ? "validation" : "training",
                    i + 1, want[p]);
        }
    free(seq);
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
    free(ids[0]);
    free(ids[1]);
    free(text);
    kvp_model_free(&m);
    return status;
}
