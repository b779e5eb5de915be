/* trace.c: the reader returns what the writer was given (keys and values rounded to
 * f16, the tokens exactly); the stored importance at every cut of the grid against a
 * plain double-precision reference; `kvp trace` stores what the forward pass puts in the
 * cache, on the text split it documents; damaged and mismatched files are refused with a
 * message. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "model/forward.h"
#include "model/quant.h"
#include "offline/eval.h"
#include "offline/trace.h"
#include "tests/model/testutil.h"

/* a small shape: 2 layers, 4 query heads in 2 KV groups, head_dim 4 */
#define NL 2
#define NH 4
#define NKV 2
#define HD 4
#define MAXLEN 40
/* the grid of cuts: 6, 11, 16, ... while 3 tokens follow */
#define CUT_MIN 6
#define CUT_STRIDE 5
#define CUT_TAIL 3

static uint64_t rng_state = 7;

static float frand(void)   /* uniform [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) / 8388608.0f - 1.0f;
}

static const char *tmp_name(const char *tag)
{
    static char paths[4][96];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "/tmp/kvp-trace-test-%d-%s", (int)getpid(), tag);
    return p;
}

typedef struct seqdata {
    int len;
    int32_t tokens[MAXLEN];
    float q[NL][MAXLEN * NH * HD], k[NL][MAXLEN * NKV * HD], v[NL][MAXLEN * NKV * HD];
} seqdata;

static const int lens[] = {MAXLEN, 17, 2, 31, 9};
#define NSEQ (int)(sizeof lens / sizeof lens[0])
static seqdata seqs[NSEQ];

/* Writes NSEQ random sequences (the first 3 marked training) to path. */
static void write_synthetic(const char *path)
{
    kvp_trace_header h = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD,
                          .seq_len = MAXLEN, .split = 0.75, .text_bytes = 1234,
                          .text_hash = 0x1234567890abcdefull, .cut_min = CUT_MIN,
                          .cut_stride = CUT_STRIDE, .cut_tail = CUT_TAIL};
    snprintf(h.model, sizeof h.model, "synthetic");
    kvp_trace_writer w;
    char err[256];
    cr_assert_eq(kvp_trace_writer_open(&w, path, &h, err, sizeof err), 0, "%s", err);
    for (int s = 0; s < NSEQ; s++) {
        seqdata *d = &seqs[s];
        d->len = lens[s];
        const float *q[NL], *k[NL], *v[NL];
        for (int t = 0; t < d->len; t++)
            d->tokens[t] = (int32_t)(frand() * 1000.0f);
        for (int l = 0; l < NL; l++) {
            for (int i = 0; i < d->len * NH * HD; i++)
                d->q[l][i] = 2.0f * frand();
            for (int i = 0; i < d->len * NKV * HD; i++) {
                d->k[l][i] = 2.0f * frand();
                d->v[l][i] = frand();
            }
            q[l] = d->q[l];
            k[l] = d->k[l];
            v[l] = d->v[l];
        }
        cr_assert_eq(kvp_trace_writer_add(&w, d->tokens, d->len, q, k, v), 0);
    }
    cr_assert_eq(kvp_trace_writer_close(&w, 3, err, sizeof err), 0, "%s", err);
}

static void write_bytes(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* Opening must fail with a message; returns the code. */
static int open_fails(const char *path, const kvp_model_config *cfg, char *err, size_t errlen)
{
    kvp_trace t;
    err[0] = '\0';
    int rc = kvp_trace_open(&t, path, cfg, err, errlen);
    cr_assert_lt(rc, 0, "%s opened", path);
    cr_assert_neq(err[0], '\0', "no message");
    return rc;
}

static void reseal(unsigned char *buf, size_t len)
{
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, buf, len - 8);
    memcpy(buf + len - 8, &h, 8);
}

Test(trace, written_trace_reads_back_exactly)
{
    const char *path = tmp_name("rt.kvpt");
    write_synthetic(path);
    kvp_trace t;
    char err[256];
    cr_assert_eq(kvp_trace_open(&t, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(t.h.magic, "KVPTRACE", 8), 0);
    cr_assert_eq(t.h.version, 2u);
    cr_assert_eq(t.h.cut_min, CUT_MIN);
    cr_assert_eq(t.h.cut_stride, CUT_STRIDE);
    cr_assert_eq(t.h.cut_tail, CUT_TAIL);
    cr_assert_eq(t.h.n_layers, NL);
    cr_assert_eq(t.h.n_heads, NH);
    cr_assert_eq(t.h.n_kv_heads, NKV);
    cr_assert_eq(t.h.head_dim, HD);
    cr_assert_eq(t.h.seq_len, MAXLEN);
    cr_assert_eq(t.h.n_seqs, NSEQ);
    cr_assert_eq(t.h.n_train, 3);
    cr_assert_eq(t.h.split, 0.75);
    cr_assert_eq(t.h.text_bytes, 1234u);
    cr_assert_eq(t.h.text_hash, 0x1234567890abcdefull);
    cr_assert_str_eq(t.h.model, "synthetic");
    for (int s = 0; s < NSEQ; s++) {
        const seqdata *d = &seqs[s];
        cr_assert_eq(kvp_trace_len(&t, s), d->len);
        cr_assert_eq(memcmp(kvp_trace_tokens(&t, s), d->tokens, d->len * sizeof(int32_t)), 0);
        for (int l = 0; l < NL; l++)
            for (int kvh = 0; kvh < NKV; kvh++) {
                const uint16_t *k = kvp_trace_k(&t, s, l, kvh), *v = kvp_trace_v(&t, s, l, kvh);
                for (int r = 0; r < d->len; r++)
                    for (int x = 0; x < HD; x++) {
                        size_t at = (size_t)r * NKV * HD + (size_t)kvh * HD + x;
                        cr_assert_eq(k[r * HD + x], kvp_f32_to_f16(d->k[l][at]),
                                     "seq %d layer %d head %d row %d: k", s, l, kvh, r);
                        cr_assert_eq(v[r * HD + x], kvp_f32_to_f16(d->v[l][at]),
                                     "seq %d layer %d head %d row %d: v", s, l, kvh, r);
                    }
            }
    }
    kvp_trace_close(&t);
    unlink(path);
}

/* I_i(n) straight from the definition in double: per query t >= n, the softmax of each
 * query head of the group, the max over the group, summed over queries. */
static void importance_ref(const seqdata *d, int layer, int kvh, int n, double *imp)
{
    int group = NH / NKV;
    double p[MAXLEN], mx_g[MAXLEN];
    for (int i = 0; i < n; i++)
        imp[i] = 0.0;
    for (int t = n; t < d->len; t++) {
        for (int i = 0; i < n; i++)
            mx_g[i] = 0.0;
        for (int g = 0; g < group; g++) {
            const float *q = d->q[layer] + (size_t)t * NH * HD + (size_t)(kvh * group + g) * HD;
            double mx = -INFINITY, sum = 0.0;
            for (int j = 0; j <= t; j++) {
                const float *k = d->k[layer] + (size_t)j * NKV * HD + (size_t)kvh * HD;
                double dot = 0.0;
                for (int x = 0; x < HD; x++)
                    dot += (double)q[x] * k[x];
                p[j] = dot / sqrt((double)HD);
                mx = fmax(mx, p[j]);
            }
            for (int j = 0; j <= t; j++)
                sum += p[j] = exp(p[j] - mx);
            for (int i = 0; i < n; i++)
                mx_g[i] = fmax(mx_g[i], p[i] / sum);
        }
        for (int i = 0; i < n; i++)
            imp[i] += mx_g[i];
    }
}

Test(trace, stored_importance_matches_double_precision_reference_at_every_cut)
{
    const char *path = tmp_name("imp.kvpt");
    write_synthetic(path);
    kvp_trace t;
    char err[256];
    cr_assert_eq(kvp_trace_open(&t, path, NULL, err, sizeof err), 0, "%s", err);
    double ref[MAXLEN];
    int checked = 0;
    for (int s = 0; s < NSEQ; s++) {
        /* the grid: every cut with CUT_TAIL tokens after it, no other */
        int want = 0;
        for (int n = CUT_MIN; n + CUT_TAIL <= seqs[s].len; n += CUT_STRIDE)
            want++;
        cr_assert_eq(kvp_trace_n_cuts(&t.h, seqs[s].len), want, "seq %d", s);
        for (int l = 0; l < NL; l++)
            for (int kvh = 0; kvh < NKV; kvh++)
                for (int g = 0; g < want; g++) {
                    int n = CUT_MIN + g * CUT_STRIDE;
                    cr_assert_eq(kvp_trace_cut_index(&t.h, n), g);
                    const float *imp = kvp_trace_importance(&t, s, l, kvh, g);
                    importance_ref(&seqs[s], l, kvh, n, ref);
                    checked++;
                    for (int i = 0; i < n; i++)
                        cr_assert(fabs(imp[i] - ref[i]) <= 1e-5 * (1.0 + ref[i]),
                                  "seq %d layer %d head %d n %d row %d: %g vs %g", s, l, kvh, n,
                                  i, imp[i], ref[i]);
                }
    }
    cr_assert_gt(checked, 20);
    cr_assert_eq(kvp_trace_cut_index(&t.h, CUT_MIN + 1), -1);
    cr_assert_eq(kvp_trace_cut_index(&t.h, CUT_MIN - CUT_STRIDE), -1);
    kvp_trace_close(&t);
    unlink(path);
}

Test(trace, truncated_or_altered_files_are_refused_with_a_message)
{
    const char *path = tmp_name("bad.kvpt"), *bad = tmp_name("bad2.kvpt");
    write_synthetic(path);
    size_t len;
    unsigned char *buf = (unsigned char *)tu_slurp(path, &len);
    char err[256];
    /* every prefix shorter than the file, in steps that hit the header, the sequence
     * table and the checksum */
    for (size_t cut = 0; cut < len; cut += cut < 160 ? 1 : 97) {
        write_bytes(bad, buf, cut);
        open_fails(bad, NULL, err, sizeof err);
    }
    write_bytes(bad, buf, len - 1);
    open_fails(bad, NULL, err, sizeof err);
    /* one altered byte anywhere after the magic and version: the checksum catches it */
    for (size_t at = 12; at < len; at += 61) {
        buf[at] ^= 0x40;
        write_bytes(bad, buf, len);
        int rc = open_fails(bad, NULL, err, sizeof err);
        if (at >= sizeof(kvp_trace_header)) {
            cr_assert_eq(rc, -EBADMSG, "byte %zu: %s", at, err);
            cr_assert(strstr(err, "checksum"), "%s", err);
        }
        buf[at] ^= 0x40;
    }
    /* a trailing byte */
    unsigned char *longer = malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = 0;
    write_bytes(bad, longer, len + 1);
    open_fails(bad, NULL, err, sizeof err);
    free(longer);
    /* wrong magic and version, even with a valid checksum */
    buf[0] = 'X';
    reseal(buf, len);
    write_bytes(bad, buf, len);
    open_fails(bad, NULL, err, sizeof err);
    cr_assert(strstr(err, "magic"), "%s", err);
    buf[0] = 'K';
    uint32_t v3 = 3;
    memcpy(buf + 8, &v3, 4);
    reseal(buf, len);
    write_bytes(bad, buf, len);
    open_fails(bad, NULL, err, sizeof err);
    cr_assert(strstr(err, "version 3"), "%s", err);
    /* the f32 format of before: refused with the way out */
    uint32_t v1 = 1;
    memcpy(buf + 8, &v1, 4);
    reseal(buf, len);
    write_bytes(bad, buf, len);
    open_fails(bad, NULL, err, sizeof err);
    cr_assert(strstr(err, "version 1") && strstr(err, "trace again"), "%s", err);
    /* a bad grid of cuts, resealed */
    uint32_t v2 = 2;
    memcpy(buf + 8, &v2, 4);
    int32_t zero = 0, good;
    size_t at_stride = offsetof(kvp_trace_header, cut_stride);
    memcpy(&good, buf + at_stride, 4);
    memcpy(buf + at_stride, &zero, 4);
    reseal(buf, len);
    write_bytes(bad, buf, len);
    open_fails(bad, NULL, err, sizeof err);
    cr_assert(strstr(err, "header"), "%s", err);
    memcpy(buf + at_stride, &good, 4);
    /* a sequence length past the end, resealed */
    int32_t huge = 1000;
    memcpy(buf + sizeof(kvp_trace_header), &huge, 4);
    reseal(buf, len);
    write_bytes(bad, buf, len);
    open_fails(bad, NULL, err, sizeof err);
    cr_assert(strstr(err, "sequence 0"), "%s", err);
    free(buf);
    /* a missing file */
    cr_assert_eq(open_fails("/nonexistent/trace.kvpt", NULL, err, sizeof err), -ENOENT);
    unlink(bad);
    unlink(path);
}

Test(trace, shape_mismatch_with_the_model_is_an_error_naming_both)
{
    const char *path = tmp_name("shape.kvpt");
    write_synthetic(path);
    kvp_model_config cfg = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD};
    kvp_trace t;
    char err[256];
    cr_assert_eq(kvp_trace_open(&t, path, &cfg, err, sizeof err), 0, "%s", err);
    kvp_trace_close(&t);
    kvp_model_config wrong[] = {cfg, cfg, cfg, cfg};
    wrong[0].n_layers = NL + 1;
    wrong[1].n_heads = NH * 2;
    wrong[2].n_kv_heads = 1;
    wrong[3].head_dim = HD * 2;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(open_fails(path, &wrong[i], err, sizeof err), -EINVAL);
        cr_assert(strstr(err, "trace is for") && strstr(err, "model has"), "%s", err);
    }
    unlink(path);
}

/* `kvp trace` on a slice of TinyStories: the sequences are BOS + consecutive tokens of
 * the two parts of the split, and each sequence's k/v are the rows kvp_forward caches. */
Test(trace, kvp_trace_stores_what_the_forward_pass_caches)
{
    const char *model_path = tu_shared("models/stories260K.bin");
    size_t full_len;
    char *full = tu_slurp(tu_shared("datasets/tinystories/tinystories-dev.txt"), &full_len);
    size_t text_len = 12000;
    cr_assert_gt(full_len, text_len);
    const char *text_path = tmp_name("text.txt"), *dir = tmp_name("dir");
    write_bytes(text_path, full, text_len);
    enum { L = 64 };
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s trace --model %s --text %s --out %s --seq-len %d "
             "--max-seqs 6 --split 0.5 --cut-min 24 --cut-stride 8 --cut-tail 16 2>&1",
             tu_build("tools/kvp"), model_path, text_path,
             dir, L);
    char *out;
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    free(out);

    kvp_model m;
    char err[256];
    cr_assert_eq(kvp_model_load(&m, model_path, NULL, err, sizeof err), 0, "%s", err);
    char tpath[256];
    snprintf(tpath, sizeof tpath, "%s/trace.kvpt", dir);
    kvp_trace t;
    cr_assert_eq(kvp_trace_open(&t, tpath, &m.cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.h.n_seqs, 6);
    cr_assert_eq(t.h.n_train, 3);
    cr_assert_eq(t.h.text_bytes, text_len);
    cr_assert_eq(t.h.text_hash, kvp_fnv1a(KVP_FNV1A_INIT, full, text_len));
    cr_assert_eq(t.h.cut_min, 24);
    cr_assert_eq(kvp_trace_n_cuts(&t.h, L), 4, "cuts 24, 32, 40, 48");

    /* the split and the tokens, by the shared helpers' documented rule */
    size_t at = kvp_trace_split_at(full, text_len, 0.5);
    cr_assert(at > 0 && at < text_len && full[at - 1] == '\n');
    cr_assert(at - (size_t)(0.5 * text_len) < 1000);
    int *ids[2];
    cr_assert_gt(kvp_trace_tokenize(&m.tok, full, at, &ids[0]), 3 * (L - 1));
    cr_assert_gt(kvp_trace_tokenize(&m.tok, full + at, text_len - at, &ids[1]), 3 * (L - 1));

    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, &m.cfg, L), 0);
    int hd = m.cfg.head_dim;
    for (int q = 0; q < 6; q++) {
        int part = q >= 3, i = q % 3;
        const int32_t *tok = kvp_trace_tokens(&t, q);
        cr_assert_eq(kvp_trace_len(&t, q), L);
        cr_assert_eq(tok[0], m.tok.bos_id);
        for (int j = 1; j < L; j++)
            cr_assert_eq(tok[j], ids[part][i * (L - 1) + j - 1], "seq %d token %d", q, j);
        int toks[L];
        for (int j = 0; j < L; j++)
            toks[j] = tok[j];
        kvp_cache c;
        cr_assert_eq(kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, hd, &m.cfg.rope), 0);
        cr_assert_eq(kvp_forward(&m, &s, &c, toks, L, NULL), 0);
        for (int l = 0; l < m.cfg.n_layers; l++)
            for (int kvh = 0; kvh < m.cfg.n_kv_heads; kvh++) {
                const kvp_head *h = kvp_cache_head(&c, l, kvh);
                cr_assert_eq(h->n, L);
                const uint16_t *tk = kvp_trace_k(&t, q, l, kvh), *tv = kvp_trace_v(&t, q, l, kvh);
                for (int i = 0; i < L * hd; i++) {
                    cr_assert_eq(tk[i], kvp_f32_to_f16(((const float *)h->k)[i]),
                                 "seq %d layer %d head %d row %d: k differs", q, l, kvh, i / hd);
                    cr_assert_eq(tv[i], kvp_f32_to_f16(((const float *)h->v)[i]),
                                 "seq %d layer %d head %d row %d: v differs", q, l, kvh, i / hd);
                }
            }
        kvp_cache_free(&c);
    }
    kvp_runstate_free(&s);
    free(ids[0]);
    free(ids[1]);
    kvp_trace_close(&t);
    kvp_model_free(&m);
    free(full);
    unlink(tpath);
    rmdir(dir);
    unlink(text_path);
}

/* `kvp trace --targets kvzip`: the header says so, and every cut's stored scores are
 * KVzip's scores of that prefix (kvp_eval_kvzip_scores on the cut's first tokens,
 * prefilled afresh); a writer takes only the kind of targets its header names, and a
 * header naming another kind is refused. */
Test(trace, kvzip_targets_are_kvzips_scores_of_each_cut)
{
    const char *model_path = tu_shared("models/stories260K.bin");
    size_t full_len;
    char *full = tu_slurp(tu_shared("datasets/tinystories/tinystories-dev.txt"), &full_len);
    const char *text_path = tmp_name("ztext.txt"), *dir = tmp_name("zdir");
    write_bytes(text_path, full, 12000);
    free(full);
    enum { L = 64 };
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "%s trace --model %s --text %s --out %s --seq-len %d "
             "--max-seqs 4 --split 0.5 --cut-min 24 --cut-stride 16 --cut-tail 16 "
             "--targets kvzip 2>&1", tu_build("tools/kvp"), model_path, text_path, dir, L);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s trace --model %s --text %s --out %s --targets future2 2>&1",
             tu_build("tools/kvp"), model_path, text_path, dir);
    cr_assert_eq(tu_run(cmd, &out), 2, "%s", out);
    cr_assert(strstr(out, "bad value 'future2' for --targets"), "%s", out);
    free(out);

    kvp_model m;
    char err[256], tpath[256];
    cr_assert_eq(kvp_model_load(&m, model_path, NULL, err, sizeof err), 0, "%s", err);
    snprintf(tpath, sizeof tpath, "%s/trace.kvpt", dir);
    kvp_trace t;
    cr_assert_eq(kvp_trace_open(&t, tpath, &m.cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.h.targets, KVP_TRACE_TARGETS_KVZIP);
    cr_assert_str_eq(kvp_trace_targets_name(t.h.targets), "kvzip");
    cr_assert_eq(kvp_trace_n_cuts(&t.h, L), 2, "cuts 24 and 40");
    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, &m.cfg, L), 0);
    int nh = m.cfg.n_layers * m.cfg.n_kv_heads;
    for (int q = 0; q < t.h.n_seqs; q++)
        for (int g = 0; g < 2; g++) {
            int n = 24 + 16 * g, toks[L];
            const int32_t *tok = kvp_trace_tokens(&t, q);
            for (int j = 0; j < L; j++)
                toks[j] = tok[j];
            kvp_cache c;
            cr_assert_eq(kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim,
                                        &m.cfg.rope), 0);
            cr_assert_eq(kvp_forward(&m, &s, &c, toks, n, NULL), 0);
            cr_assert_eq(kvp_eval_kvzip_scores(&m, &s, &c, toks), 0);
            for (int a = 0; a < nh; a++) {
                const float *got = kvp_trace_importance(&t, q, a / m.cfg.n_kv_heads,
                                                        a % m.cfg.n_kv_heads, g);
                for (int i = 0; i < n; i++)
                    cr_assert_float_eq(got[i], c.heads[a].score[i], 1e-4f,
                                       "seq %d cut %d agent %d row %d: %g, want %g", q, n, a, i,
                                       got[i], c.heads[a].score[i]);
            }
            kvp_cache_free(&c);
        }
    kvp_runstate_free(&s);
    kvp_trace_close(&t);
    kvp_model_free(&m);

    /* the header's last field: 1 (KVzip) reads, 2 is no kind of targets */
    size_t len;
    unsigned char *buf = (unsigned char *)tu_slurp(tpath, &len);
    int32_t kind = 2;
    memcpy(buf + offsetof(kvp_trace_header, targets), &kind, 4);
    reseal(buf, len);
    const char *bad = tmp_name("zbad.kvpt");
    write_bytes(bad, buf, len);
    open_fails(bad, NULL, err, sizeof err);
    cr_assert(strstr(err, "bad trace header"), "%s", err);
    free(buf);
    unlink(bad);

    /* a writer takes the targets its header names */
    kvp_trace_header h = {.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD,
                          .seq_len = MAXLEN, .cut_min = CUT_MIN, .cut_stride = CUT_STRIDE,
                          .cut_tail = CUT_TAIL, .targets = KVP_TRACE_TARGETS_KVZIP};
    kvp_trace_writer w;
    cr_assert_eq(kvp_trace_writer_open(&w, bad, &h, err, sizeof err), 0, "%s", err);
    static float q0[MAXLEN * NH * HD], k0[MAXLEN * NKV * HD];
    const float *qs[NL] = {q0, q0}, *ks[NL] = {k0, k0};
    int32_t tk[MAXLEN] = {0};
    cr_assert_eq(kvp_trace_writer_add(&w, tk, MAXLEN, qs, ks, ks), -EINVAL);
    kvp_trace_writer_abort(&w);
    h.targets = KVP_TRACE_TARGETS_FUTURE;
    cr_assert_eq(kvp_trace_writer_open(&w, bad, &h, err, sizeof err), 0, "%s", err);
    const float *sc[1] = {k0};
    cr_assert_eq(kvp_trace_writer_add_scores(&w, tk, MAXLEN, ks, ks, sc), -EINVAL);
    kvp_trace_writer_abort(&w);
    h.targets = 5;
    cr_assert_lt(kvp_trace_writer_open(&w, bad, &h, err, sizeof err), 0);
    cr_assert(strstr(err, "targets"), "%s", err);

    unlink(tpath);
    rmdir(dir);
    unlink(text_path);
}
