/* eval.c on stories260K with short held-out sequences: the oracle's ranking cost is the
 * minimum (C/C* = 1 exactly, per budget too), no eviction means the full cache's numbers,
 * the importance equals the trace reader's, streaming accounts for every token; the
 * replies protocol: KL 0 without eviction, a brute-force recomputation below it, the
 * context rule; and `kvp eval`: its files, its determinism across threads, its errors
 * (with --text and with --prompts). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "generate/generate.h"
#include "offline/eval.h"
#include "offline/oracle.h"
#include "offline/trace.h"
#include "model/template.h"
#include "tests/model/testutil.h"
#include "tests/offline/traceutil.h"

#define LEN 128
#define CUT 96
#define NSEQ 3

static const char *const all_policies[] = {
    "none", "random", "streaming", "knorm", "keydiff", "lagkv", "h2o", "tova", "snapkv",
    "expected_attention", "oracle",
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
    n_ids = heldout_story_ids(&model, 20000, &ids);
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


/* ---- KVzip ----------------------------------------------------------------------------- */

/* An observer of our own: for each (layer, KV head), the largest attention any query of
 * the block after its first `skip` pays each of the first `rows` rows, max over the
 * group's query heads. */
typedef struct zip_obs {
    float *mx;   /* [heads][rows] */
    int rows, skip;
} zip_obs;

static void zip_attention(kvp_policy *p, int layer, int kvh, kvp_head *h, const float *q,
                          int q_stride, const float *att, int att_stride, int n_q)
{
    (void)h;
    (void)q;
    (void)q_stride;
    zip_obs *z = p->impl;
    int group = p->cfg.n_heads / p->cfg.n_kv_heads;
    float *mx = z->mx + (size_t)(layer * p->cfg.n_kv_heads + kvh) * z->rows;
    for (int g = 0; g < group; g++)
        for (int t = z->skip; t < n_q; t++)
            for (int i = 0; i < z->rows; i++)
                mx[i] = fmaxf(mx[i], att[(size_t)(g * n_q + t) * att_stride + i]);
}

static const kvp_policy_ops zip_ops = {.name = "zip", .wants_attention = 1,
                                       .on_attention = zip_attention};

/* One reconstruction pass fits after CUT tokens: the scores are exactly what our observer
 * sees the repeated context (BOS left out; the prompt before it does not count) pay each
 * row. */
Test(eval, kvzip_scores_are_the_largest_attention_of_the_reconstruction)
{
    int tok[LEN], nh = model.cfg.n_layers * model.cfg.n_kv_heads;
    sequence(0, tok);
    kvp_cache c, d;
    cr_assert_eq(kvp_cache_init(&c, model.cfg.n_layers, model.cfg.n_kv_heads, model.cfg.head_dim,
                                &model.cfg.rope), 0);
    cr_assert_eq(kvp_cache_init(&d, model.cfg.n_layers, model.cfg.n_kv_heads, model.cfg.head_dim,
                                &model.cfg.rope), 0);
    kvp_policy_attach(&rs.hooks, NULL);
    cr_assert_eq(kvp_gen_prefill(&model, &rs, &c, NULL, tok, CUT, NULL), 0);
    cr_assert_eq(kvp_gen_prefill(&model, &rs, &d, NULL, tok, CUT, NULL), 0);

    int block[512], n = kvp_tokenizer_encode(&model.tok, KVP_KVZIP_PROMPT,
                                             strlen(KVP_KVZIP_PROMPT), 0, block, 64);
    cr_assert_gt(n, 2);
    memcpy(block + n, tok + 1, (CUT - 1) * sizeof *block);
    float *mx = calloc((size_t)nh * CUT, sizeof *mx);
    zip_obs z = {mx, CUT, n};
    kvp_policy obs = {.ops = &zip_ops, .cfg = model.cfg, .impl = &z};
    kvp_policy_attach(&rs.hooks, &obs);
    cr_assert_eq(kvp_forward(&model, &rs, &d, block, n + CUT - 1, NULL), 0);
    kvp_policy_attach(&rs.hooks, NULL);

    cr_assert_eq(kvp_eval_kvzip_scores(&model, &rs, &c, tok), 0);
    cr_assert_eq(c.next_pos, CUT, "the cache itself is not fed");
    for (int hi = 0; hi < nh; hi++) {
        const float *sc = c.heads[hi].score, *want = mx + (size_t)hi * CUT;
        cr_assert_eq(c.heads[hi].n, CUT);
        float lo = 1.0f, hi_s = 0.0f;
        for (int i = 0; i < CUT; i++) {
            cr_assert_float_eq(sc[i], want[i], 1e-6f, "head %d row %d: %g, want %g", hi, i,
                               sc[i], want[i]);
            cr_assert(sc[i] >= 0.0f && sc[i] <= 1.0f);
            lo = fminf(lo, sc[i]);
            hi_s = fmaxf(hi_s, sc[i]);
        }
        cr_assert_gt(hi_s, lo, "head %d: the scores tell rows apart", hi);
    }
    free(mx);
    kvp_cache_free(&c);
    kvp_cache_free(&d);
}

/* A cache near the end of the context: the copy is shifted and the context is repeated
 * in several chunks; every row is scored (a probability, some row of each head above 0)
 * and the cache is left as it was. */
Test(eval, kvzip_scores_a_full_context_in_chunks)
{
    int ctx = model.cfg.seq_len, len = ctx - 4, nh = model.cfg.n_layers * model.cfg.n_kv_heads;
    int *tok = malloc((size_t)len * sizeof *tok);
    tok[0] = model.tok.bos_id;
    memcpy(tok + 1, ids, (size_t)(len - 1) * sizeof *tok);
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, model.cfg.n_layers, model.cfg.n_kv_heads, model.cfg.head_dim,
                                &model.cfg.rope), 0);
    kvp_policy_attach(&rs.hooks, NULL);
    cr_assert_eq(kvp_gen_prefill(&model, &rs, &c, NULL, tok, len, NULL), 0);
    for (int hi = 0; hi < nh; hi++)
        for (int i = 0; i < len; i++)
            c.heads[hi].score[i] = -1.0f;
    cr_assert_eq(kvp_eval_kvzip_scores(&model, &rs, &c, tok), 0);
    cr_assert_eq(c.next_pos, len);
    for (int hi = 0; hi < nh; hi++) {
        float best = 0.0f;
        cr_assert_eq(c.heads[hi].n, len);
        cr_assert_eq(c.heads[hi].pos[len - 1], len - 1, "positions untouched");
        for (int i = 0; i < len; i++) {
            float v = c.heads[hi].score[i];
            cr_assert(v >= 0.0f && v <= 1.0f, "head %d row %d: %g", hi, i, v);
            best = fmaxf(best, v);
        }
        cr_assert_gt(best, 0.0f);
    }
    kvp_cache_free(&c);
    free(tok);
}

/* The kvzip policy ranks by the reference's KVzip scores: its one-shot eviction keeps the
 * highest-scored rows, and its ranking of future importance is better than random's. A
 * reference made without opts.kvzip cannot evaluate it. */
Test(eval, kvzip_policy_keeps_the_highest_scores_and_beats_random)
{
    kvp_eval_opts o = opts;
    o.kvzip = 1;
    kvp_eval_ref r;
    cr_assert_eq(kvp_eval_ref_init(&r, &model.cfg, LEN, &o), 0);
    cr_assert_not_null(r.zip);
    kvp_eval_acc zip = {0}, rnd = {0};
    int nh = r.n_heads;
    for (int i = 0; i < NSEQ; i++) {
        int tok[LEN];
        sequence(i, tok);
        cr_assert_eq(kvp_eval_ref_compute(&r, &model, &rs, tok), 0);
        kvp_policy *pz = make("kvzip", 1), *pr = make("random", (uint64_t)i);
        cr_assert(kvp_policy_is_kvzip(pz));
        cr_assert_eq(kvp_eval_sequence(&model, &rs, pz, tok, &r, &zip), 0);
        cr_assert_eq(kvp_eval_sequence(&model, &rs, pr, tok, &r, &rnd), 0);
        /* one compression to 32: every kept row that is not protected scores at least as
         * high as every dropped one */
        kvp_cache pre, b;
        cr_assert_eq(kvp_eval_prefix(&model, &rs, pz, tok, &r, &pre), 0);
        cr_assert_eq(kvp_cache_fork(&b, &pre, CUT), 0);
        kvp_evict_cfg e = {.policy = pz, .budget = 32};
        cr_assert_gt(kvp_gen_compress(&b, &e), 0);
        for (int hi = 0; hi < nh; hi++) {
            const float *zs = r.zip + (size_t)hi * CUT;
            char kept[CUT] = {0};
            for (int k = 0; k < b.heads[hi].n; k++)
                kept[b.heads[hi].seq[k]] = 1;
            float min_kept = INFINITY, max_dropped = -INFINITY;
            for (int k = pz->n_sink; k < CUT - pz->n_recent; k++)
                if (kept[k])
                    min_kept = fminf(min_kept, zs[k]);
                else
                    max_dropped = fmaxf(max_dropped, zs[k]);
            cr_assert_geq(min_kept, max_dropped, "head %d", hi);
        }
        kvp_cache_free(&pre);
        kvp_cache_free(&b);
        kvp_policy_destroy(pz);
        kvp_policy_destroy(pr);
    }
    cr_assert_eq(zip.cases, rnd.cases);
    cr_assert_lt(zip.cc_ratio, rnd.cc_ratio, "kvzip %g, random %g", zip.cc_ratio / zip.cases,
                 rnd.cc_ratio / rnd.cases);
    kvp_eval_ref_free(&r);

    /* without opts.kvzip the reference has no KVzip scores */
    cr_assert_eq(kvp_eval_ref_init(&r, &model.cfg, LEN, &opts), 0);
    cr_assert_null(r.zip);
    int tok[LEN];
    sequence(0, tok);
    cr_assert_eq(kvp_eval_ref_compute(&r, &model, &rs, tok), 0);
    kvp_policy *pz = make("kvzip", 1);
    kvp_eval_acc a = {0};
    cr_assert_eq(kvp_eval_sequence(&model, &rs, pz, tok, &r, &a), -EINVAL);
    kvp_policy_destroy(pz);
    kvp_eval_ref_free(&r);
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

/* ---- replies ------------------------------------------------------------------------------ */

/* prompt i: BOS + n held-out tokens (a plain-template first turn is BOS + the text) */
static int reply_prompt(int i, int n, int *tok)
{
    cr_assert_leq(4000 + (long)i * 600 + n, n_ids);
    tok[0] = model.tok.bos_id;
    memcpy(tok + 1, ids + 4000 + (size_t)i * 600, (size_t)n * sizeof *tok);
    return n + 1;
}

static void plain_template(kvp_template *t)
{
    char note[256];
    cr_assert_geq(kvp_template_init(t, &model, NULL, note, sizeof note), 0, "%s", note);
    cr_assert_eq(t->format, KVP_CHAT_PLAIN);
}

/* Nothing evicted (policy none, or a budget at the context): the two caches are the same
 * computation, so every reply position has KL exactly 0 and the same top token. */
Test(eval, replies_kl_is_zero_without_eviction)
{
    enum { RLEN = 96 };
    static const char *const pols[] = {"none", "random", "streaming", "knorm", "keydiff",
                                       "lagkv", "h2o", "tova", "snapkv", "expected_attention"};
    kvp_template t;
    plain_template(&t);
    kvp_eval_opts o = opts;
    o.n_budgets = 2;
    o.budgets[0] = 32;
    o.budgets[1] = model.cfg.seq_len;
    o.reply_len = RLEN;
    int tok[256], reply[RLEN];
    double kl[RLEN];
    for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++) {
        int none = !strcmp(pols[k], "none");
        kvp_eval_acc acc = {0};
        for (int i = 0; i < 3; i++) {
            int n = reply_prompt(i, 40 + 30 * i, tok);
            for (int bi = none ? 0 : 1; bi < 2; bi++) {
                kvp_policy *p = make(pols[k], (uint64_t)i);
                kvp_eval_reply r = {.tokens = reply, .kl = kl};
                cr_assert_eq(kvp_eval_replies(&model, &rs, p, &t, tok, n, bi, &o, &r, &acc), 0,
                             "%s", pols[k]);
                kvp_policy_destroy(p);
                cr_assert_eq(r.skipped, 0);
                cr_assert(r.draws >= 1 && r.draws <= RLEN);
                for (int d = 0; d < r.draws; d++)
                    cr_assert_eq(kl[d], 0.0, "%s prompt %d budget %d position %d: KL %g",
                                 pols[k], i, o.budgets[bi], d, kl[d]);
                cr_assert_eq(r.agree, r.draws, "%s", pols[k]);
                cr_assert_eq(r.kl_mean, 0.0);
                cr_assert_eq(r.top1, 1.0);
                /* the reply ends at a stop token or at the cap */
                cr_assert(r.draws == RLEN || kvp_template_is_stop(&t, reply[r.draws - 1]));
            }
        }
        int b0 = none ? 0 : 1;
        cr_assert_eq(acc.reply_convs[1], 3);
        cr_assert_eq(acc.reply_convs[0], none ? 3 : 0);
        cr_assert_eq(acc.reply_kl[1], 0.0);
        cr_assert_eq(acc.reply_top1[1], 3.0);
        cr_assert_eq(acc.reply_skipped[b0], 0);
    }
    /* the oracle cannot decode: its scores need the future */
    kvp_policy *p = make("oracle", 1);
    kvp_eval_acc acc = {0};
    int n = reply_prompt(0, 40, tok);
    cr_assert_eq(kvp_eval_replies(&model, &rs, p, &t, tok, n, 0, &o, NULL, &acc), -EINVAL);
    kvp_policy_destroy(p);
    kvp_template_free(&t);
}

/* Below the context: the protocol equals a brute-force recomputation. The evicted side
 * decodes greedily under eviction keeping every logits row; the full side is one
 * teacher-forced pass of a fresh f32 cache over the prompt and the reply (the last
 * drawn token is never fed). */
Test(eval, replies_kl_equals_a_brute_force_computation)
{
    enum { RLEN = 200 };
    static const char *const pols[] = {"streaming", "h2o", "random"};
    static const int budgets[] = {32, 64};
    const int V = model.cfg.vocab_size, ctx = model.cfg.seq_len;
    kvp_template t;
    plain_template(&t);
    kvp_eval_opts o = opts;
    o.n_budgets = 2;
    o.budgets[0] = budgets[0];
    o.budgets[1] = budgets[1];
    o.reply_len = RLEN;
    int *toks = malloc((size_t)ctx * sizeof *toks), reply[RLEN];
    float *q_all = malloc((size_t)RLEN * V * sizeof *q_all);
    float *p_all = malloc((size_t)ctx * V * sizeof *p_all);
    double kl[RLEN], worst = 0.0;
    int evicted_any = 0;
    for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++)
        for (int bi = 0; bi < 2; bi++) {
            kvp_eval_acc acc = {0};
            double mean_sum = 0.0, top1_sum = 0.0;
            long draws_sum = 0;
            for (int i = 0; i < 3; i++) {
                int n = reply_prompt(i, 60 + 40 * i, toks);
                kvp_policy *p = make(pols[k], (uint64_t)i);
                kvp_eval_reply r = {.tokens = reply, .kl = kl};
                cr_assert_eq(kvp_eval_replies(&model, &rs, p, &t, toks, n, bi, &o, &r, &acc), 0);
                kvp_policy_destroy(p);
                cr_assert_eq(r.skipped, 0);

                /* brute force, evicted side: greedy under eviction, every row kept */
                p = make(pols[k], (uint64_t)i);
                kvp_evict_cfg e = {p, budgets[bi], o.chunk, 0};
                kvp_cache c;
                cr_assert_eq(kvp_cache_init(&c, model.cfg.n_layers, model.cfg.n_kv_heads,
                                            model.cfg.head_dim, &model.cfg.rope), 0);
                kvp_policy_attach(&rs.hooks, NULL);
                cr_assert_eq(kvp_gen_prefill(&model, &rs, &c, &e, toks, n, NULL), 0);
                int d = 0;
                for (;;) {
                    float *q = q_all + (size_t)d * V;
                    memcpy(q, rs.logits, (size_t)V * sizeof *q);
                    int tk = best(q, V);
                    toks[n + d++] = tk;
                    if (kvp_template_is_stop(&t, tk) || d == RLEN)
                        break;
                    cr_assert_eq(kvp_gen_decode(&model, &rs, &c, &e, tk), 0);
                }
                evicted_any |= c.evicted_rows > 0;
                kvp_cache_free(&c);
                kvp_policy_destroy(p);
                cr_assert_eq(r.draws, d, "%s b=%d prompt %d: %d draws, brute force %d",
                             pols[k], budgets[bi], i, r.draws, d);
                cr_assert_eq(memcmp(reply, toks + n, (size_t)d * sizeof *reply), 0,
                             "%s b=%d prompt %d: the replies differ", pols[k], budgets[bi], i);

                /* brute force, full side: one teacher-forced pass */
                cr_assert_eq(kvp_cache_init(&c, model.cfg.n_layers, model.cfg.n_kv_heads,
                                            model.cfg.head_dim, &model.cfg.rope), 0);
                cr_assert_eq(kvp_forward(&model, &rs, &c, toks, n + d - 1, p_all), 0);
                kvp_cache_free(&c);
                double sum = 0.0;
                int agree = 0;
                for (int j = 0; j < d; j++) {
                    const float *pl = p_all + (size_t)(n - 1 + j) * V, *q = q_all + (size_t)j * V;
                    double want = softmax_kl(pl, q, V);
                    cr_assert(fabs(kl[j] - want) <= 1e-4 * want + 1e-6,
                              "%s b=%d prompt %d position %d: KL %.9g, brute force %.9g",
                              pols[k], budgets[bi], i, j, kl[j], want);
                    sum += want;
                    agree += best(pl, V) == best(q, V);
                }
                double mean = sum / d;
                worst = fmax(worst, fabs(r.kl_mean - mean) / mean);
                cr_assert(fabs(r.kl_mean - mean) <= 1e-5 * mean,
                          "%s b=%d prompt %d: mean KL %.9g, brute force %.9g", pols[k],
                          budgets[bi], i, r.kl_mean, mean);
                cr_assert_gt(mean, 0.0, "%s b=%d: eviction moved nothing", pols[k], budgets[bi]);
                cr_assert_eq(r.agree, agree, "%s b=%d prompt %d", pols[k], budgets[bi], i);
                mean_sum += mean;
                top1_sum += (double)agree / d;
                draws_sum += d;
            }
            /* the sums: every conversation weighs the same */
            cr_assert_eq(acc.reply_convs[bi], 3);
            cr_assert_eq(acc.reply_skipped[bi], 0);
            cr_assert_eq(acc.reply_draws[bi], draws_sum);
            cr_assert(fabs(acc.reply_kl[bi] - mean_sum) <= 1e-5 * mean_sum);
            cr_assert(fabs(acc.reply_top1[bi] - top1_sum) < 1e-12);
            cr_assert_eq(acc.reply_convs[1 - bi], 0);
        }
    cr_assert(evicted_any);
    cr_log_info("replies: worst relative error of a conversation's mean KL %.3g", worst);
    free(toks);
    free(q_all);
    free(p_all);
    kvp_template_free(&t);
}

/* The canary's refusal rule: a conversation whose prompt + draws - 1 tokens pass the
 * context is skipped and counted, one that ends exactly at the context is used; so is a
 * prompt longer than the context. With no stop token every reply runs to its cap. */
Test(eval, replies_past_the_context_are_skipped_and_counted)
{
    const int ctx = model.cfg.seq_len;
    kvp_template t;
    plain_template(&t);
    kvp_template nostop = t;   /* a shallow copy: t owns what it points to */
    nostop.stop[0] = nostop.stop[1] = nostop.stop[2] = -1;
    kvp_eval_opts o = opts;
    o.n_budgets = 1;
    o.budgets[0] = 64;
    int *tok = malloc(((size_t)ctx + 1) * sizeof *tok), reply[8];
    kvp_eval_acc acc = {0};
    kvp_eval_reply r = {.tokens = reply};

    /* ctx - 2 prompt tokens and 3 draws: ctx tokens, the context exactly */
    int n = reply_prompt(0, ctx - 3, tok);
    cr_assert_eq(n, ctx - 2);
    o.reply_len = 3;
    kvp_policy *p = make("streaming", 1);
    cr_assert_eq(kvp_eval_replies(&model, &rs, p, &nostop, tok, n, 0, &o, &r, &acc), 0);
    kvp_policy_destroy(p);
    cr_assert_eq(r.skipped, 0);
    cr_assert_eq(r.draws, 3);
    cr_assert_eq(acc.reply_convs[0], 1);
    cr_assert_eq(acc.reply_skipped[0], 0);
    cr_assert_eq(acc.reply_draws[0], 3);

    /* a fourth draw would make ctx + 1 */
    o.reply_len = 8;
    p = make("streaming", 1);
    cr_assert_eq(kvp_eval_replies(&model, &rs, p, &nostop, tok, n, 0, &o, &r, &acc), 0);
    kvp_policy_destroy(p);
    cr_assert_eq(r.skipped, 1);
    cr_assert_eq(r.draws, 3, "skipped when the next token would pass the context");
    cr_assert_eq(acc.reply_convs[0], 1);
    cr_assert_eq(acc.reply_skipped[0], 1);
    cr_assert_eq(acc.reply_draws[0], 3, "a skipped conversation adds no draws");

    /* none (no eviction, no shift) is held to the same rule */
    p = make("none", 1);
    cr_assert_eq(kvp_eval_replies(&model, &rs, p, &nostop, tok, n, 0, &o, &r, &acc), 0);
    kvp_policy_destroy(p);
    cr_assert_eq(r.skipped, 1);
    cr_assert_eq(acc.reply_skipped[0], 2);

    /* a prompt longer than the context */
    n = reply_prompt(0, ctx, tok);
    p = make("streaming", 1);
    cr_assert_eq(kvp_eval_replies(&model, &rs, p, &t, tok, n, 0, &o, &r, &acc), 0);
    kvp_policy_destroy(p);
    cr_assert_eq(r.skipped, 1);
    cr_assert_eq(r.draws, 0);
    cr_assert_eq(acc.reply_convs[0], 1);
    cr_assert_eq(acc.reply_skipped[0], 3);

    /* the rows: the one used conversation's means */
    kvp_eval_row rows[KVP_EVAL_ROWS_PER_POLICY];
    int nr = kvp_eval_rows("streaming", &acc, &o, rows);
    cr_assert_eq(nr, 3);
    cr_assert_str_eq(rows[2].metric, "reply_len");
    cr_assert_eq(rows[2].value, 3.0);
    free(tok);
    kvp_template_free(&t);
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

/* The results.csv of two runs (1 and 2 threads), which must be the same; the first's,
 * malloc'd. */
static char *same_csv(char dir[2][64])
{
    char path[128];
    snprintf(path, sizeof path, "%s/results.csv", dir[0]);
    char *csv = tu_slurp(path, NULL);
    snprintf(path, sizeof path, "%s/results.csv", dir[1]);
    char *csv1 = tu_slurp(path, NULL);
    cr_assert_str_eq(csv, csv1, "results depend on the thread count");
    free(csv1);
    return csv;
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
    char *csv = same_csv(dir);

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

    char path[128];
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

/* kvzip in the tables: a row of every metric of the three text protocols, marked
 * evaluation-only in the report; with --prompts it is left out (alone: nothing to run). */
Test(eval, cli_tables_list_kvzip)
{
    char dir[64], args[512], *out;
    snprintf(dir, sizeof dir, "/tmp/kvp-eval-kvzip-%d", (int)getpid());
    snprintf(args, sizeof args, "--policies random,kvzip --budgets 64,32 --seqs 2 --seq-len 128 "
             "--cut 96 --streams 1 --stream-len 700 --out %s", dir);
    cr_assert_eq(run_eval(args, &out), 0, "%s", out);
    free(out);
    char path[128];
    snprintf(path, sizeof path, "%s/results.csv", dir);
    char *csv = tu_slurp(path, NULL);
    static const char *const want[] = {
        "ranking,kvzip,all,cc_ratio,", "ranking,kvzip,32,cost,", "ranking,kvzip,64,recall,",
        "oneshot,kvzip,32,ppl,", "oneshot,kvzip,64,kl,", "streaming,kvzip,32,ppl,",
        "streaming,kvzip,64,kl,", "streaming,kvzip,32,top1,",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(strstr(csv, want[i]), "%s missing:\n%s", want[i], csv);
    free(csv);
    snprintf(path, sizeof path, "%s/results.md", dir);
    char *md = tu_slurp(path, NULL);
    int tables = 0;
    for (const char *at = md; (at = strstr(at, "\n| kvzip |")); at++)
        tables++;
    cr_assert_eq(tables, 8, "a kvzip row in each of the 8 tables:\n%s", md);
    cr_assert(strstr(md, "evaluation only"), "%s", md);
    free(md);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);

    char good[64];
    snprintf(good, sizeof good, "%s", tu_write_tmp("Once upon a time\n", 17));
    snprintf(args, sizeof args, "--out %s --prompts %s --policies kvzip", dir, good);
    char cmd2[2048];
    snprintf(cmd2, sizeof cmd2, "%s eval --model %s %s 2>&1", tu_build("tools/kvp"),
             tu_shared("models/stories260K.bin"), args);
    cr_assert_eq(tu_run(cmd2, &out), 2, "%s", out);
    cr_assert(strstr(out, "kvzip is left out of the replies"), "%s", out);
    cr_assert(strstr(out, "no policy to run"), "%s", out);
    free(out);
}

/* kvzap is the kvp policy on the file --kvzap-file names: given the file kvp runs, its
 * rows equal kvp's; it is left out without the file, and named alone without it is a
 * usage error. */
Test(eval, cli_kvzap_is_the_kvp_policy_on_its_own_file)
{
    char dir[64], pol[96], args[1024], *out;
    snprintf(dir, sizeof dir, "/tmp/kvp-eval-kvzap-%d", (int)getpid());
    snprintf(pol, sizeof pol, "%s.kvp", dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s policy-init --model %s --out %s --seed 3 2>&1",
             tu_build("tools/kvp"), tu_shared("models/stories260K.bin"), pol);
    cr_assert_eq(tu_run(cmd, &out), 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "--policies kvp,kvzap --policy-file %s --kvzap-file %s "
             "--budgets 32 --seqs 2 --seq-len 128 --cut 96 --streams 1 --stream-len 700 "
             "--out %s", pol, pol, dir);
    cr_assert_eq(run_eval(args, &out), 0, "%s", out);
    free(out);
    char path[128];
    snprintf(path, sizeof path, "%s/results.csv", dir);
    char *csv = tu_slurp(path, NULL);
    int rows = 0;
    for (char *line = strstr(csv, "\n") + 1; *line; line = strchr(line, '\n') + 1) {
        char *kvp = strstr(line, ",kvp,");
        if (kvp && kvp < strchr(line, '\n')) {
            /* the same protocol, budget, metric and value under kvzap */
            char want[256];
            int n = (int)(strchr(line, '\n') - line);
            snprintf(want, sizeof want, "%.*s,kvzap,%.*s\n", (int)(kvp - line), line,
                     n - (int)(kvp - line) - 5, kvp + 5);
            cr_assert(strstr(csv, want), "%s missing:\n%s", want, csv);
            rows++;
        }
    }
    cr_assert_geq(rows, 7, "%s", csv);
    free(csv);
    snprintf(path, sizeof path, "%s/results.md", dir);
    char *md = tu_slurp(path, NULL);
    cr_assert(strstr(md, "--kvzap-file"), "the command is recorded");
    cr_assert(strstr(md, "\n| kvzap |"), "%s", md);
    free(md);
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, pol);
    cr_assert_eq(system(cmd), 0);

    cr_assert_eq(run_eval("--out /tmp/x --policies kvzap", &out), 2, "%s", out);
    cr_assert(strstr(out, "policy kvzap needs --kvzap-file"), "%s", out);
    free(out);
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

/* ---- the command: replies ------------------------------------------------------------------ */

static int run_replies(const char *args, char **out)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s eval --model %s %s 2>&1", tu_build("tools/kvp"),
             tu_shared("models/stories260K.bin"), args);
    return tu_run(cmd, out);
}

/* The held-out lines of at least 20 words: the first four as they are, then one line
 * longer than the context (the next lines joined), with empty lines between. */
static char *prompt_file_text(char lines[4][700])
{
    size_t len;
    char *text = tu_slurp(tu_shared("datasets/tinystories/tinystories-dev.txt"), &len);
    size_t at = kvp_trace_split_at(text, len, 0.8);
    char *buf = calloc(8192, 1);
    cr_assert(buf);
    int got = 0;
    size_t long_at = 0;
    for (char *line = text + at; *line && got < 5;) {
        char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        int words = 0;
        for (size_t i = 0; i < n; i++)
            words += line[i] != ' ' && (i == 0 || line[i - 1] == ' ');
        if (words >= 20 && n < 600 && got < 4) {
            memcpy(lines[got], line, n);
            lines[got][n] = '\0';
            strcat(buf, lines[got++]);
            strcat(buf, "\n\n");
            long_at = strlen(buf);
        } else if (got == 4 && n) {
            /* the long line: about 2500 bytes, over 512 tokens */
            strncat(buf, line, n < 600 ? n : 600);
            if (strlen(buf) - long_at > 2500)
                got++;
            else
                strcat(buf, " ");
        }
        line = nl ? nl + 1 : line + n;
    }
    cr_assert_eq(got, 5);
    strcat(buf, "\n");
    free(text);
    return buf;
}

static double csv_value(const char *csv, const char *key)
{
    const char *row = strstr(csv, key);
    cr_assert(row, "no %s in\n%s", key, csv);
    return atof(row + strlen(key));
}

Test(eval, cli_replies_rows_threads_and_the_library)
{
    char lines[4][700];
    char *ptext = prompt_file_text(lines);
    char prompts[64];
    snprintf(prompts, sizeof prompts, "%s", tu_write_tmp(ptext, strlen(ptext)));
    free(ptext);
    char dir[2][64], args[1024], *out;
    for (int run = 0; run < 2; run++) {
        snprintf(dir[run], sizeof dir[run], "/tmp/kvp-eval-replies-%d-%d", (int)getpid(), run);
        snprintf(args, sizeof args, "--tokenizer %s --prompts %s --policies none,streaming,"
                 "random,oracle --budgets 64,16 --reply-len 40 --out %s --threads %d",
                 tu_shared("models/tok512.bin"), prompts, dir[run], run + 1);
        cr_assert_eq(run_replies(args, &out), 0, "%s", out);
        cr_assert(strstr(out, "5 prompts"), "%s", out);
        cr_assert(strstr(out, "oracle is left out"), "%s", out);
        free(out);
    }
    char *csv = same_csv(dir);

    /* exactly the replies rows of the policies that decode */
    const char *header = "protocol,policy,budget,metric,value\n";
    cr_assert_eq(strncmp(csv, header, strlen(header)), 0, "%s", csv);
    static const char *const pol[] = {"none", "streaming", "random"};
    static const char *const met[] = {"kl", "top1", "reply_len"};
    static const int bud[] = {16, 64};
    int seen[3][3][2] = {{{0}}}, rows = 0;
    char *copy = strdup(csv);
    for (char *line = copy + strlen(header); *line; rows++) {
        char *nl = strchr(line, '\n');
        cr_assert(nl);
        *nl = '\0';
        char p[32], m[32];
        int b;
        double v;
        cr_assert_eq(sscanf(line, "replies,%31[^,],%d,%31[^,],%lf", p, &b, m, &v), 4,
                     "unexpected row %s", line);
        int pi = 0, mi = 0, bi = 0;
        while (pi < 3 && strcmp(pol[pi], p))
            pi++;
        while (mi < 3 && strcmp(met[mi], m))
            mi++;
        while (bi < 2 && bud[bi] != b)
            bi++;
        cr_assert(pi < 3 && mi < 3 && bi < 2, "unexpected row %s", line);
        cr_assert_eq(seen[pi][mi][bi]++, 0, "row %s twice", line);
        if (mi == 0)
            cr_assert(v >= 0.0 && (pi || v == 0.0), "%s", line);
        if (mi == 1)
            cr_assert(v >= 0.0 && v <= 1.0 && (pi || v == 1.0), "%s", line);
        if (mi == 2)
            cr_assert(v >= 1.0 && v <= 40.0, "%s", line);
        line = nl + 1;
    }
    cr_assert_eq(rows, 18);
    free(copy);

    /* the same numbers from the library on the lines rendered as kvpd renders a first
     * turn; the long line is skipped; random's seed is --seed + the prompt's index */
    kvp_template t;
    plain_template(&t);
    kvp_eval_opts o = opts;
    o.n_budgets = 2;
    o.budgets[0] = 16;
    o.budgets[1] = 64;
    o.reply_len = 40;
    for (int k = 1; k < 3; k++) {
        kvp_eval_acc acc = {0};
        for (int i = 0; i < 4; i++) {
            int *tok;
            int n = kvp_template_turn(&t, "", 0, 1, 0, lines[i], strlen(lines[i]), &tok);
            cr_assert_gt(n, 1);
            cr_assert_eq(tok[0], model.tok.bos_id);
            for (int bi = 0; bi < 2; bi++) {
                kvp_policy *p = make(pol[k], 1 + (uint64_t)i);
                cr_assert_eq(kvp_eval_replies(&model, &rs, p, &t, tok, n, bi, &o, NULL, &acc), 0);
                kvp_policy_destroy(p);
            }
            free(tok);
        }
        /* at 16 the sinks and the recent window fill the budget: every policy keeps the
         * same rows; at 64 random draws from its seed */
        for (int bi = 0; bi < 2; bi++) {
            cr_assert_eq(acc.reply_convs[bi], 4);
            char key[64];
            snprintf(key, sizeof key, "replies,%s,%d,kl,", pol[k], o.budgets[bi]);
            double kl = acc.reply_kl[bi] / 4, got = csv_value(csv, key);
            cr_assert(fabs(got - kl) <= 1e-5 * kl, "%s %.9g, library %.9g", key, got, kl);
            cr_assert_gt(kl, 0.0);
            snprintf(key, sizeof key, "replies,%s,%d,top1,", pol[k], o.budgets[bi]);
            cr_assert(fabs(csv_value(csv, key) - acc.reply_top1[bi] / 4) <= 1e-5, "%s", key);
            snprintf(key, sizeof key, "replies,%s,%d,reply_len,", pol[k], o.budgets[bi]);
            cr_assert(fabs(csv_value(csv, key) - acc.reply_draws[bi] / 4.0) <= 1e-4, "%s", key);
        }
    }
    kvp_template_free(&t);
    free(csv);

    char path[128];
    snprintf(path, sizeof path, "%s/results.md", dir[0]);
    char *md = tu_slurp(path, NULL);
    cr_assert(strstr(md, "--prompts"), "the command is recorded");
    cr_assert(strstr(md, "Prompts: 5"), "%s", md);
    cr_assert(strstr(md, "| streaming | 4 / 1 | 4 / 1 |"), "used / skipped\n%s", md);
    cr_assert(strstr(md, "| policy | b=16 | b=64 |"), "%s", md);
    free(md);
    static const char *const plots[] = {"replies-kl", "replies-top1", "replies-reply_len"};
    for (int i = 0; i < 3; i++) {
        size_t len;
        snprintf(path, sizeof path, "%s/%s.svg", dir[0], plots[i]);
        char *svg = tu_slurp(path, &len);
        cr_assert(len > 8 && !strcmp(svg + len - 7, "</svg>\n"), "%s", path);
        cr_assert(strstr(svg, ">streaming</text>"), "%s", path);
        free(svg);
    }
    /* --max-prompts: the first N lines with text */
    snprintf(args, sizeof args, "--prompts %s --policies none --budgets 16 --max-prompts 2 "
             "--reply-len 8 --out %s --threads 1", prompts, dir[0]);
    cr_assert_eq(run_replies(args, &out), 0, "%s", out);
    cr_assert(strstr(out, "2 prompts"), "%s", out);
    free(out);
    for (int run = 0; run < 2; run++) {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir[run]);
        cr_assert_eq(system(cmd), 0);
    }
}

Test(eval, cli_replies_rejects_bad_input_with_a_message)
{
    char empty[64], blank[64], bad_utf8[64], good[64];
    snprintf(empty, sizeof empty, "%s", tu_write_tmp("", 0));
    snprintf(blank, sizeof blank, "%s", tu_write_tmp("\n\n\n", 3));
    snprintf(bad_utf8, sizeof bad_utf8, "%s", tu_write_tmp("Once upon a time\nab\xff\n", 20));
    snprintf(good, sizeof good, "%s", tu_write_tmp("Once upon a time\n", 17));
    struct {
        char args[256];
        int status;
        char msg[160];
    } cases[] = {
        {"--out /tmp/x --prompts /nonexistent/prompts.txt", 1,
         "cannot read /nonexistent/prompts.txt"},
        {"", 1, "has no prompt"},
        {"", 1, "has no prompt"},
        {"", 1, ":2: not valid UTF-8"},
        {"", 2, "bad value '0' for --reply-len"},
        {"", 2, "bad value '-3' for --reply-len"},
        {"", 2, "bad value 'abc' for --reply-len"},
        {"", 2, "bad value '0' for --max-prompts"},
        {"", 2, "--prompts cannot be combined with --text"},
        {"", 2, "--prompts cannot be combined with --text"},
        {"", 2, "no policy to run"},
        {"--out /tmp/x --text x --reply-len 5", 2, "go with --prompts"},
        {"", 2, "bad budget '0'"},
    };
    snprintf(cases[1].args, sizeof cases[1].args, "--out /tmp/x --prompts %s", empty);
    snprintf(cases[2].args, sizeof cases[2].args, "--out /tmp/x --prompts %s", blank);
    snprintf(cases[3].args, sizeof cases[3].args, "--out /tmp/x --prompts %s", bad_utf8);
    snprintf(cases[3].msg, sizeof cases[3].msg, "%s:2: not valid UTF-8", bad_utf8);
    const char *rl[] = {"0", "-3", "abc"};
    for (int i = 0; i < 3; i++)
        snprintf(cases[4 + i].args, sizeof cases[4].args, "--out /tmp/x --prompts %s --reply-len %s",
                 good, rl[i]);
    snprintf(cases[7].args, sizeof cases[7].args, "--out /tmp/x --prompts %s --max-prompts 0", good);
    snprintf(cases[8].args, sizeof cases[8].args, "--out /tmp/x --prompts %s --text %s", good, good);
    snprintf(cases[9].args, sizeof cases[9].args, "--out /tmp/x --conversations %s --prompts %s",
             good, good);
    snprintf(cases[10].args, sizeof cases[10].args, "--out /tmp/x --prompts %s --policies oracle",
             good);
    snprintf(cases[12].args, sizeof cases[12].args, "--out /tmp/x --prompts %s --budgets 0", good);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int st = run_replies(cases[i].args, &out);
        cr_assert_eq(st, cases[i].status, "'%s': exit %d\n%s", cases[i].args, st, out);
        cr_assert(strstr(out, cases[i].msg), "'%s': no '%s' in\n%s", cases[i].args, cases[i].msg,
                  out);
        free(out);
    }
}
