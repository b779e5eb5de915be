/* eval.c on stories260K with short held-out sequences: the oracle's ranking cost is the
 * minimum (C/C* = 1 exactly, per budget too), no eviction means the full cache's numbers,
 * the importance equals the trace reader's, streaming accounts for every token; and
 * `kvp eval`: its files, its determinism across threads, its errors. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "generate/generate.h"
#include "offline/eval.h"
#include "offline/oracle.h"
#include "offline/trace.h"
#include "tests/model/testutil.h"

#define LEN 128
#define CUT 96
#define NSEQ 3

static const char *const all_policies[] = {
    "none", "random", "streaming", "knorm", "keydiff", "lagkv", "h2o", "tova", "snapkv", "oracle",
};
#define NPOL (int)(sizeof all_policies / sizeof all_policies[0])

static kvp_model model;
static int *ids;          /* held-out tokens of TinyStories */
static long n_ids;
static kvp_runstate rs;
/* 16..64 exercise eviction, 128 >= LEN keeps everything */
static const kvp_eval_opts opts = {.cut = CUT, .chunk = 32, .lookahead = 64, .n_budgets = 5,
                                   .budgets = {16, 32, 48, 64, 128}};

static void setup(void)
{
    char err[256];
    cr_assert_eq(kvp_model_load(&model, tu_shared("models/stories260K.bin"), NULL, err, sizeof err),
                 0, "%s", err);
    size_t len;
    char *text = tu_slurp(tu_shared("datasets/tinystories/tinystories-dev.txt"), &len);
    size_t at = kvp_trace_split_at(text, len, 0.8);
    n_ids = kvp_trace_tokenize(&model.tok, text + at, 20000, &ids);
    free(text);
    cr_assert_gt(n_ids, 2000);
    cr_assert_eq(kvp_runstate_init(&rs, &model.cfg, 512), 0);
}

static void teardown(void)
{
    kvp_runstate_free(&rs);
    free(ids);
    kvp_model_free(&model);
}

/* sequence i: BOS + LEN - 1 held-out tokens */
static void sequence(int i, int *tok)
{
    tok[0] = model.tok.bos_id;
    memcpy(tok + 1, ids + (size_t)i * (LEN - 1), (LEN - 1) * sizeof *tok);
}

static kvp_policy *make(const char *name, uint64_t seed)
{
    kvp_policy *p;
    char err[256];
    cr_assert_eq(kvp_offline_policy_create(&p, name, NULL, &model.cfg, seed, err, sizeof err), 0, "%s", err);
    return p;
}

/* acc[p] for every policy over NSEQ sequences (each sequence's sums kept apart too) */
static void run_all(kvp_eval_acc acc[NSEQ][NPOL])
{
    memset(acc, 0, sizeof(kvp_eval_acc) * NSEQ * NPOL);
    kvp_eval_ref r;
    cr_assert_eq(kvp_eval_ref_init(&r, &model.cfg, LEN, &opts), 0);
    for (int i = 0; i < NSEQ; i++) {
        int tok[LEN];
        sequence(i, tok);
        cr_assert_eq(kvp_eval_ref_compute(&r, &model, &rs, tok), 0);
        for (int p = 0; p < NPOL; p++) {
            kvp_policy *pol = make(all_policies[p], (uint64_t)i);
            cr_assert_eq(kvp_eval_sequence(&model, &rs, pol, tok, &r, &acc[i][p]), 0, "%s",
                         all_policies[p]);
            kvp_policy_destroy(pol);
        }
    }
    kvp_eval_ref_free(&r);
}

TestSuite(eval, .init = setup, .fini = teardown, .timeout = 120);

Test(eval, oracle_ranking_cost_is_the_minimum)
{
    static kvp_eval_acc acc[NSEQ][NPOL];
    run_all(acc);
    int heads = model.cfg.n_layers * model.cfg.n_kv_heads;
    for (int i = 0; i < NSEQ; i++)
        for (int p = 0; p < NPOL; p++) {
            const kvp_eval_acc *a = &acc[i][p];
            const char *name = all_policies[p];
            if (!strcmp(name, "none")) {
                cr_assert_eq(a->cases, 0, "none has no ranking");
                continue;
            }
            cr_assert_eq(a->cases, heads);
            if (!strcmp(name, "oracle"))
                cr_assert_eq(a->cc_ratio, (double)heads, "oracle C/C* = %.17g", a->cc_ratio / heads);
            else
                cr_assert_geq(a->cc_ratio, (double)heads, "%s C/C* = %g < 1", name,
                              a->cc_ratio / heads);
            for (int bi = 0; bi < opts.n_budgets; bi++) {
                if (!strcmp(name, "oracle")) {
                    cr_assert_eq(a->evicted[bi], a->min_evicted[bi], "budget %d", opts.budgets[bi]);
                    cr_assert_leq(a->recall[bi], (double)heads);
                }
                /* from 2 x 16 rows every policy keeps the sinks and the 16 newest, the
                 * set the oracle optimises over (H2O's half window is smaller below) */
                if (opts.budgets[bi] >= 32)
                    cr_assert_geq(a->evicted[bi], a->min_evicted[bi] * (1 - 1e-12),
                                  "%s at budget %d evicts less than the oracle", name,
                                  opts.budgets[bi]);
                if (opts.budgets[bi] >= CUT) {
                    cr_assert_eq(a->evicted[bi], 0.0);
                    cr_assert_eq(a->recall[bi], (double)heads);
                }
            }
        }
    /* and as reported */
    kvp_eval_acc oracle = {0};
    for (int i = 0; i < NSEQ; i++)
        kvp_eval_acc_add(&oracle, &acc[i][NPOL - 1]);
    kvp_eval_row rows[KVP_EVAL_ROWS_PER_POLICY];
    int n = kvp_eval_rows("oracle", &oracle, &opts, rows);
    cr_assert_eq(n, 1 + 4 * opts.n_budgets);   /* no streaming sums here */
    for (int k = 0; k < n; k++)
        if (!strcmp(rows[k].metric, "cc_ratio") || !strcmp(rows[k].metric, "cost"))
            cr_assert_eq(rows[k].value, 1.0, "%s %s %d", rows[k].protocol, rows[k].metric,
                         rows[k].budget);
}

Test(eval, no_eviction_gives_the_full_cache_numbers)
{
    static kvp_eval_acc acc[NSEQ][NPOL];
    run_all(acc);
    int full = opts.n_budgets - 1;   /* budget 128 >= LEN */
    for (int i = 0; i < NSEQ; i++) {
        const kvp_eval_acc *none = &acc[i][0];
        cr_assert_eq(none->tokens, LEN - CUT - 1);
        for (int bi = 0; bi < opts.n_budgets; bi++) {
            cr_assert_eq(none->kl[bi], 0.0);
            cr_assert_eq(none->nll[bi], none->nll[full]);
        }
        for (int p = 1; p < NPOL; p++) {
            cr_assert_eq(acc[i][p].nll[full], none->nll[full], "%s", all_policies[p]);
            cr_assert_eq(acc[i][p].kl[full], 0.0, "%s", all_policies[p]);
            /* with eviction the distributions move */
            cr_assert_gt(acc[i][p].kl[0], 0.0, "%s", all_policies[p]);
        }
    }
}

typedef struct capture {
    float *q[16], *k[16], *v[16];
    size_t qn, kn;
} capture;

static void tap(void *ctx, int layer, const float *q, const float *k, const float *v, int n)
{
    capture *c = ctx;
    memcpy(c->q[layer], q, (size_t)n * c->qn * sizeof(float));
    memcpy(c->k[layer], k, (size_t)n * c->kn * sizeof(float));
    memcpy(c->v[layer], v, (size_t)n * c->kn * sizeof(float));
}

Test(eval, importance_equals_the_trace_readers)
{
    const kvp_model_config *cfg = &model.cfg;
    int tok[LEN];
    sequence(5, tok);
    kvp_eval_ref r;
    cr_assert_eq(kvp_eval_ref_init(&r, cfg, LEN, &opts), 0);
    cr_assert_eq(kvp_eval_ref_compute(&r, &model, &rs, tok), 0);

    /* the same tokens recorded as a trace */
    capture cap = {.qn = (size_t)cfg->n_heads * cfg->head_dim,
                   .kn = (size_t)cfg->n_kv_heads * cfg->head_dim};
    for (int l = 0; l < cfg->n_layers; l++) {
        cap.q[l] = malloc(LEN * cap.qn * sizeof(float));
        cap.k[l] = malloc(LEN * cap.kn * sizeof(float));
        cap.v[l] = malloc(LEN * cap.kn * sizeof(float));
    }
    kvp_runstate s;
    cr_assert_eq(kvp_runstate_init(&s, cfg, LEN), 0);
    s.hooks.tap = tap;
    s.hooks.tap_ctx = &cap;
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &cfg->rope), 0);
    cr_assert_eq(kvp_forward(&model, &s, &c, tok, LEN, NULL), 0);
    char path[64], err[256];
    snprintf(path, sizeof path, "/tmp/kvp-eval-test-%d.kvpt", (int)getpid());
    kvp_trace_header h = {.n_layers = cfg->n_layers, .n_heads = cfg->n_heads,
                          .n_kv_heads = cfg->n_kv_heads, .head_dim = cfg->head_dim,
                          .seq_len = LEN, .cut_min = CUT, .cut_stride = LEN, .cut_tail = 1};
    kvp_trace_writer w;
    cr_assert_eq(kvp_trace_writer_open(&w, path, &h, err, sizeof err), 0, "%s", err);
    int32_t t32[LEN];
    for (int i = 0; i < LEN; i++)
        t32[i] = tok[i];
    cr_assert_eq(kvp_trace_writer_add(&w, t32, LEN, (const float *const *)cap.q,
                                      (const float *const *)cap.k, (const float *const *)cap.v), 0);
    cr_assert_eq(kvp_trace_writer_close(&w, 0, err, sizeof err), 0, "%s", err);
    kvp_trace t;
    cr_assert_eq(kvp_trace_open(&t, path, cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_trace_n_cuts(&t.h, LEN), 1, "the one cut, CUT");
    double total = 0.0;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int kvh = 0; kvh < cfg->n_kv_heads; kvh++) {
            const float *imp = kvp_trace_importance(&t, 0, l, kvh, 0);
            const float *mine = r.imp + (size_t)(l * cfg->n_kv_heads + kvh) * CUT;
            for (int i = 0; i < CUT; i++) {
                cr_assert(fabsf(mine[i] - imp[i]) <= 1e-5f * (1.0f + imp[i]),
                          "layer %d head %d row %d: %g vs %g", l, kvh, i, mine[i], imp[i]);
                total += mine[i];
            }
        }
    /* each future query's max over a group is at least 1/group of the mass on old rows */
    cr_assert_gt(total, 0.0);
    kvp_trace_close(&t);
    unlink(path);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    for (int l = 0; l < cfg->n_layers; l++) {
        free(cap.q[l]);
        free(cap.k[l]);
        free(cap.v[l]);
    }
    kvp_eval_ref_free(&r);
}

Test(eval, streaming_counts_every_token_and_matches_the_full_cache_without_eviction)
{
    enum { SHORT = 300, LONG = 1200 };
    int *tok = malloc(LONG * sizeof *tok);
    tok[0] = model.tok.bos_id;
    memcpy(tok + 1, ids, (LONG - 1) * sizeof *tok);
    /* a budget above the stream: no eviction, no shift, so the plain forward's numbers
     * (up to the chunked blocks' float rounding) */
    kvp_eval_opts big = opts;
    big.n_budgets = 1;
    big.budgets[0] = 480;
    kvp_eval_acc a = {0};
    kvp_policy *p = make("streaming", 1);
    cr_assert_eq(kvp_eval_stream(&model, &rs, p, tok, SHORT, 0, &big, NULL, &a), 0);
    kvp_policy_destroy(p);
    cr_assert_eq(a.stream_tokens[0], SHORT - 1);
    float *logits = malloc((size_t)SHORT * model.cfg.vocab_size * sizeof *logits);
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, model.cfg.n_layers, model.cfg.n_kv_heads, model.cfg.head_dim,
                                &model.cfg.rope), 0);
    cr_assert_eq(kvp_forward(&model, &rs, &c, tok, SHORT, logits), 0);
    double nll = 0.0;
    for (int t = 0; t + 1 < SHORT; t++) {
        const float *x = logits + (size_t)t * model.cfg.vocab_size;
        double mx = x[0], s = 0.0;
        for (int v = 1; v < model.cfg.vocab_size; v++)
            mx = fmax(mx, x[v]);
        for (int v = 0; v < model.cfg.vocab_size; v++)
            s += exp(x[v] - mx);
        nll += mx + log(s) - x[tok[t + 1]];
    }
    cr_assert(fabs(a.stream_nll[0] - nll) < 1e-3, "%.6f vs %.6f", a.stream_nll[0], nll);
    kvp_cache_free(&c);
    free(logits);

    /* past the context: every policy but none streams, the oracle with its lookahead */
    for (int k = 1; k < NPOL; k++) {
        kvp_eval_acc b = {0};
        p = make(all_policies[k], 2);
        cr_assert_eq(kvp_eval_stream(&model, &rs, p, tok, LONG, 1, &opts, NULL, &b), 0, "%s",
                     all_policies[k]);
        kvp_policy_destroy(p);
        cr_assert_eq(b.stream_tokens[1], LONG - 1);
        double ppl = exp(b.stream_nll[1] / (LONG - 1));
        cr_assert(isfinite(ppl) && ppl > 1.0 && ppl < 100.0, "%s: %g", all_policies[k], ppl);
    }
    free(tok);
}

/* ---- streaming fidelity ------------------------------------------------------------------- */

static double softmax_kl(const float *p, const float *q, int n)
{
    double mp = p[0], mq = q[0], zp = 0.0, zq = 0.0, kl = 0.0;
    for (int i = 1; i < n; i++) {
        mp = fmax(mp, p[i]);
        mq = fmax(mq, q[i]);
    }
    for (int i = 0; i < n; i++) {
        zp += exp(p[i] - mp);
        zq += exp(q[i] - mq);
    }
    for (int i = 0; i < n; i++) {
        double lp = p[i] - mp - log(zp), lq = q[i] - mq - log(zq);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

static int best(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* A budget above the stream (and the stream within the context): the policy is the
 * full window, so KL 0 and full agreement at every sampled position. */
Test(eval, streaming_kl_is_zero_when_nothing_is_evicted)
{
    enum { SHORT = 300, EVERY = 16 };
    int *tok = malloc(SHORT * sizeof *tok);
    tok[0] = model.tok.bos_id;
    memcpy(tok + 1, ids, (SHORT - 1) * sizeof *tok);
    kvp_eval_stream_ref ref;
    cr_assert_eq(kvp_eval_stream_ref_init(&ref, &model.cfg, SHORT, EVERY), 0);
    cr_assert_eq(kvp_eval_stream_ref_compute(&ref, &model, &rs, tok, model.tok.bos_id), 0);
    cr_assert_eq(ref.n_pos, (SHORT - 1) / EVERY);
    kvp_eval_opts big = opts;
    big.n_budgets = 1;
    big.budgets[0] = 480;
    kvp_eval_acc a = {0};
    kvp_policy *p = make("tova", 1);
    cr_assert_eq(kvp_eval_stream(&model, &rs, p, tok, SHORT, 0, &big, &ref, &a), 0);
    kvp_policy_destroy(p);
    cr_assert_eq(a.stream_samples[0], ref.n_pos);
    cr_assert_eq(a.stream_top1[0], ref.n_pos);
    cr_assert(a.stream_kl[0] / ref.n_pos < 1e-6, "KL %g", a.stream_kl[0] / ref.n_pos);
    kvp_eval_stream_ref_free(&ref);
    free(tok);
}

/* Past the context with eviction: the metric equals a brute-force computation. The
 * reference at t: the model run from scratch on tokens[0..t] (t < context), else on BOS +
 * tokens[t - 510..t]; the policy's distribution at t: its own chunked run over the
 * whole stream. */
Test(eval, streaming_kl_equals_a_brute_force_computation)
{
    enum { LEN2 = 700, EVERY = 50, CTX = 512 };
    cr_assert_eq(model.cfg.seq_len, CTX);
    int V = model.cfg.vocab_size;
    int *tok = malloc(LEN2 * sizeof *tok), *window = malloc(CTX * sizeof *window);
    tok[0] = model.tok.bos_id;
    memcpy(tok + 1, ids + 3000, (LEN2 - 1) * sizeof *tok);
    kvp_eval_stream_ref ref;
    cr_assert_eq(kvp_eval_stream_ref_init(&ref, &model.cfg, LEN2, EVERY), 0);
    cr_assert_eq(kvp_eval_stream_ref_compute(&ref, &model, &rs, tok, model.tok.bos_id), 0);
    kvp_eval_acc a = {0};
    kvp_policy *p = make("streaming", 1);
    cr_assert_eq(kvp_eval_stream(&model, &rs, p, tok, LEN2, 0, &opts, &ref, &a), 0);
    kvp_policy_destroy(p);

    /* the policy's logits at every position, chunk by chunk as the protocol runs */
    float *pol = malloc((size_t)LEN2 * V * sizeof *pol), *want = malloc((size_t)V * sizeof *want);
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, model.cfg.n_layers, model.cfg.n_kv_heads, model.cfg.head_dim,
                                &model.cfg.rope), 0);
    p = make("streaming", 1);
    kvp_evict_cfg e = {.policy = p, .budget = opts.budgets[0], .chunk = opts.chunk};
    for (int off = 0; off < LEN2; off += opts.chunk) {
        int n = LEN2 - off < opts.chunk ? LEN2 - off : opts.chunk;
        kvp_policy_attach(&rs.hooks, p);
        cr_assert_eq(kvp_gen_prefill(&model, &rs, &c, &e, tok + off, n, pol + (size_t)off * V), 0);
        kvp_policy_attach(&rs.hooks, NULL);
    }
    kvp_policy_destroy(p);
    kvp_cache_free(&c);

    double kl = 0.0;
    long agree = 0, n = 0;
    for (int t = EVERY - 1; t + 1 < LEN2; t += EVERY, n++) {
        cr_assert_eq(kvp_cache_init(&c, model.cfg.n_layers, model.cfg.n_kv_heads,
                                    model.cfg.head_dim, &model.cfg.rope), 0);
        if (t < CTX) {
            cr_assert_eq(kvp_forward(&model, &rs, &c, tok, t + 1, NULL), 0);
        } else {
            window[0] = model.tok.bos_id;
            memcpy(window + 1, tok + t - CTX + 2, (CTX - 1) * sizeof *window);
            cr_assert_eq(kvp_forward(&model, &rs, &c, window, CTX, NULL), 0);
        }
        memcpy(want, rs.logits, (size_t)V * sizeof *want);
        kvp_cache_free(&c);
        kl += softmax_kl(want, pol + (size_t)t * V, V);
        agree += best(want, V) == best(pol + (size_t)t * V, V);
    }
    cr_assert_eq(a.stream_samples[0], n);
    cr_assert_eq(a.stream_top1[0], agree);
    /* blocks of other sizes round the floats differently: equal to 1e-4 of the sum */
    cr_assert(fabs(a.stream_kl[0] - kl) <= 1e-4 * kl + 1e-6, "KL %.8f vs brute force %.8f",
              a.stream_kl[0], kl);
    cr_assert_gt(kl, 0.0);   /* the policy evicted: it is not the full window */
    kvp_eval_stream_ref_free(&ref);
    free(pol);
    free(want);
    free(tok);
    free(window);
}

/* ---- the command --------------------------------------------------------------------------- */

static int run_eval(const char *args, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s eval --model %s --text %s %s 2>&1", tu_build("tools/kvp"),
             tu_shared("models/stories260K.bin"),
             tu_shared("datasets/tinystories/tinystories-dev.txt"), args);
    return tu_run(cmd, out);
}

static const char *small_run =
    "--policies none,random,oracle --budgets 64,32 --seqs 2 --seq-len 128 --cut 96 "
    "--streams 1 --stream-len 700";

/* --policies none alone (no policy the streams run): the one-shot protocol still runs,
 * and with q8_0 rows its KL is the rows' own error against the f32 reference (it crashed
 * on a division by the streams' empty policy list). */
Test(eval, cli_runs_the_full_cache_alone)
{
    char dir[64], args[512], *out, path[128];
    snprintf(dir, sizeof dir, "/tmp/kvp-eval-none-%d", (int)getpid());
    snprintf(args, sizeof args, "--policies none --budgets 32 --seqs 2 --seq-len 128 --cut 96 "
             "--kv-type q8_0 --out %s --threads 2", dir);
    cr_assert_eq(run_eval(args, &out), 0, "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/results.csv", dir);
    char *csv = tu_slurp(path, NULL);
    cr_assert(csv);
    const char *row = strstr(csv, "oneshot,none,32,kl,");
    cr_assert(row, "%s", csv);
    double kl = atof(row + strlen("oneshot,none,32,kl,"));
    cr_expect(kl > 0.0 && kl < 0.05, "q8_0 rows' KL %g", kl);
    cr_expect_null(strstr(csv, "streaming,"), "%s", csv);
    free(csv);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(eval, cli_writes_one_csv_row_per_protocol_policy_budget_metric)
{
    char dir[2][64], args[512], *out;
    for (int run = 0; run < 2; run++) {
        snprintf(dir[run], sizeof dir[run], "/tmp/kvp-eval-cli-%d-%d", (int)getpid(), run);
        snprintf(args, sizeof args, "%s --out %s --threads %d", small_run, dir[run], run + 1);
        cr_assert_eq(run_eval(args, &out), 0, "%s", out);
        cr_assert(strstr(out, "2 sequences of 128 tokens"), "%s", out);
        free(out);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/results.csv", dir[0]);
    char *csv = tu_slurp(path, NULL);
    snprintf(path, sizeof path, "%s/results.csv", dir[1]);
    char *csv1 = tu_slurp(path, NULL);
    cr_assert_str_eq(csv, csv1, "results depend on the thread count");
    free(csv1);

    const char *header = "protocol,policy,budget,metric,value\n";
    cr_assert_eq(strncmp(csv, header, strlen(header)), 0, "%s", csv);
    /* the expected keys: ranking for the policies that evict, oneshot for all,
     * streaming for the policies that can pass the context */
    static const char *const expected[] = {
        "ranking,random,all,cc_ratio", "ranking,oracle,all,cc_ratio",
        "ranking,random,32,cost", "ranking,random,64,cost", "ranking,oracle,32,cost",
        "ranking,oracle,64,cost", "ranking,random,32,recall", "ranking,random,64,recall",
        "ranking,oracle,32,recall", "ranking,oracle,64,recall",
        "oneshot,none,32,ppl", "oneshot,none,64,ppl", "oneshot,none,32,kl", "oneshot,none,64,kl",
        "oneshot,random,32,ppl", "oneshot,random,64,ppl", "oneshot,random,32,kl",
        "oneshot,random,64,kl", "oneshot,oracle,32,ppl", "oneshot,oracle,64,ppl",
        "oneshot,oracle,32,kl", "oneshot,oracle,64,kl",
        "streaming,random,32,ppl", "streaming,random,64,ppl", "streaming,oracle,32,ppl",
        "streaming,oracle,64,ppl", "streaming,random,32,kl", "streaming,random,64,kl",
        "streaming,oracle,32,kl", "streaming,oracle,64,kl", "streaming,random,32,top1",
        "streaming,random,64,top1", "streaming,oracle,32,top1", "streaming,oracle,64,top1",
    };
    int n_exp = (int)(sizeof expected / sizeof expected[0]), seen[48] = {0}, rows = 0;
    for (char *line = csv + strlen(header); *line; rows++) {
        char *nl = strchr(line, '\n');
        cr_assert(nl, "unterminated line");
        *nl = '\0';
        char *comma = strrchr(line, ',');
        cr_assert(comma, "%s", line);
        *comma = '\0';
        char *end;
        double v = strtod(comma + 1, &end);
        cr_assert(*end == '\0' && isfinite(v), "value '%s'", comma + 1);
        int k = 0;
        while (k < n_exp && strcmp(expected[k], line))
            k++;
        cr_assert_lt(k, n_exp, "unexpected row %s", line);
        cr_assert_eq(seen[k]++, 0, "row %s twice", line);
        if (strstr(line, "oracle") && (strstr(line, "cost") || strstr(line, "cc_ratio")))
            cr_assert_eq(v, 1.0, "%s = %g", line, v);
        line = nl + 1;
    }
    cr_assert_eq(rows, n_exp);
    free(csv);

    snprintf(path, sizeof path, "%s/results.md", dir[0]);
    char *md = tu_slurp(path, NULL);
    cr_assert(strstr(md, "| policy | b=32 | b=64 |"), "%s", md);
    cr_assert(strstr(md, "--policies none,random,oracle"), "the command is recorded");
    free(md);
    static const char *const plots[] = {"ranking-cost", "ranking-recall", "oneshot-ppl",
                                        "oneshot-kl", "streaming-ppl", "streaming-kl",
                                        "streaming-top1"};
    for (int i = 0; i < 7; i++) {
        size_t len;
        snprintf(path, sizeof path, "%s/%s.svg", dir[0], plots[i]);
        char *svg = tu_slurp(path, &len);
        cr_assert_eq(strncmp(svg, "<?xml", 5), 0, "%s", path);
        cr_assert(len > 8 && !strcmp(svg + len - 7, "</svg>\n"), "%s", path);
        cr_assert(strstr(svg, ">oracle</text>") && strstr(svg, "<polyline"), "%s", path);
        free(svg);
    }
    for (int run = 0; run < 2; run++) {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir[run]);
        cr_assert_eq(system(cmd), 0);
    }
}

Test(eval, cli_rejects_bad_input_with_a_message)
{
    static const struct {
        const char *args;
        int status;
        const char *msg;
    } cases[] = {
        {"--out /tmp/x --policies random,bogus", 2, "unknown policy 'bogus'"},
        {"--out /tmp/x --policies random,random", 2, "listed twice"},
        {"--out /tmp/x --policies kvp", 2, "needs --policy-file"},
        {"--out /tmp/x --budgets 16,,32", 2, "bad budget list"},
        {"--out /tmp/x --budgets 16,abc", 2, "bad budget 'abc'"},
        {"--out /tmp/x --budgets 0", 2, "bad budget '0'"},
        {"--out /tmp/x --budgets 32,32", 2, "listed twice"},
        {"--out /tmp/x --budgets 500", 2, "exceeds the model's context"},
        {"--out /tmp/x --seqs 0", 2, "bad value '0' for --seqs"},
        {"--out /tmp/x --cut 600", 2, "must be below --seq-len"},
        {"--out /tmp/x --kv-type q4_0", 2, "bad value 'q4_0' for --kv-type"},
        {"--out /tmp/x --kv-type ''", 2, "bad value '' for --kv-type"},
        {"--out /tmp/x --kv-type F16", 2, "bad value 'F16' for --kv-type"},
        {"--out /tmp/x --budget-mode Global", 2, "bad value 'Global' for --budget-mode"},
        {"--out /tmp/x --budget-mode ''", 2, "bad value '' for --budget-mode"},
        {"--out /tmp/x --budget-mode per-head", 2, "bad value 'per-head' for --budget-mode"},
        {"", 2, "--out are required"},
        {"--out /tmp/x --text /nonexistent/text.txt", 1, "cannot read /nonexistent/text.txt"},
        {"--out /tmp/x --policies kvp --policy-file /nonexistent.kvp", 1, "/nonexistent.kvp"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int st = run_eval(cases[i].args, &out);
        cr_assert_eq(st, cases[i].status, "'%s': exit %d\n%s", cases[i].args, st, out);
        cr_assert(strstr(out, cases[i].msg), "'%s': no '%s' in\n%s", cases[i].args, cases[i].msg, out);
        free(out);
    }
    char cmd[512], *out;
    snprintf(cmd, sizeof cmd, "%s eval --model /nonexistent.bin --text x --out /tmp/x 2>&1",
             tu_build("tools/kvp"));
    cr_assert_eq(tu_run(cmd, &out), 1, "%s", out);
    cr_assert(strstr(out, "/nonexistent.bin"), "%s", out);
    free(out);
}
