/* observe/canary.c and its place in a turn: the canary's KL and top-1 agreement for a
 * turn run under eviction equal the same figures computed here from an independent replay
 * of the evicted run and the full cache's logits from `kvp logits` (another program,
 * other chunks); with no eviction it finds nothing;
 * in the hub, canary_rate 0 records and runs nothing, and rate 1 puts each checked turn
 * in /metrics per policy and budget. stories260K. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "generate/generate.h"
#include "observe/background.h"
#include "observe/canary.h"
#include "web/metrics.h"
#include "sessions/hub_impl.h"
#include "turns/session.h"
#include "turns/step_plan.h"
#include "tests/model/testutil.h"
#include "tests/sessions/hubtest.h"

static void on_token(void *ctx, kvp_session *s, const char *t, size_t n)
{
    (void)ctx, (void)s, (void)t, (void)n;
}

static void on_done(void *ctx, kvp_session *s, const kvp_turn_stats *st, const char *r, size_t n)
{
    (void)s, (void)st, (void)r, (void)n;
    (*(int *)ctx)++;
}

static void on_error(void *ctx, kvp_session *s, int code, const char *msg)
{
    (void)ctx, (void)s;
    cr_assert_fail("turn failed: %d %s", code, msg);
}

static kvp_policy_conf *conf(const char *name)
{
    kvp_policy_conf *pc = calloc(1, sizeof *pc);
    pc->refs = 1;
    snprintf(pc->name, sizeof pc->name, "%s", name);
    return pc;
}

typedef struct fixture {
    kvp_model model;
    kvp_session_env env;
    kvp_runstate rs;
    kvp_session_table t;
    kvp_policy_conf *pc;
} fixture;

static void fx_init(fixture *f, const char *policy)
{
    char err[512];
    cr_assert_eq(kvp_model_load(&f->model, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    f->env = (kvp_session_env){.model = &f->model, .chunk = 32, .reuse_cache = 1,
                               .top_p = 0.9f, .seed = 1, .state_dir = "", .step_tokens = 32};
    kvp_template_init(&f->env.tpl, &f->model, NULL, NULL, 0);
    cr_assert_eq(kvp_runstate_init(&f->rs, &f->model.cfg, f->env.chunk), 0);
    cr_assert_eq(kvp_session_table_init(&f->t), 0);
    f->pc = conf(policy);
}

static void fx_free(fixture *f)
{
    kvp_session_table_clear(&f->t);
    kvp_policy_conf_unref(f->pc);
    kvp_runstate_free(&f->rs);
    kvp_template_free(&f->env.tpl);
    kvp_model_free(&f->model);
}

/* One sampled turn (temperature 0.8: the draws are not all the top token) at this
 * budget; returns its record. */
static kvp_canary_rec *canary_turn(fixture *f, int budget, int words, int max_tokens)
{
    char err[256];
    kvp_session *s;
    cr_assert_eq(kvp_session_create(&f->t, &f->env, f->pc, NULL, 0.0, &s, err, sizeof err), 0,
                 "%s", err);
    char *text = ht_text(words);
    int done = 0;
    kvp_turn_sink sink = {on_token, on_done, on_error, NULL, &done};
    cr_assert_eq(kvp_session_begin_turn(s, text, strlen(text), max_tokens, 0.8f, budget, 0.0), 0);
    s->rq.spec.canary = kvp_canary_rec_new(f->pc->name, budget, f->model.cfg.dim);
    s->state = KVP_SESSION_TURN;
    while (kvp_turn_step(s, &f->env, &f->rs, &sink))
        ;
    s->state = KVP_SESSION_IDLE;
    cr_assert_eq(done, 1);
    cr_assert_not(s->res.canary_dropped);
    kvp_canary_rec *r = s->rq.spec.canary;
    s->rq.spec.canary = NULL;
    cr_assert_not_null(r);
    cr_assert(!r->unusable);
    cr_assert_eq(r->n_pos, s->turn.stats.generated_tokens +
                 (strcmp(s->turn.stats.stop, "eos") == 0));   /* the end marker was drawn too */
    free(text);
    return r;
}

/* The full cache's logits of tokens[0..n) from `kvp logits` (one causal block, another
 * program and other chunks than the canary's reference run): [n][vocab], malloc'd. */
static float *kvp_logits(const int *tokens, int n, int vocab)
{
    char out[] = "/tmp/kvp-canary-logits-XXXXXX";
    int fd = mkstemp(out);
    cr_assert_geq(fd, 0);
    close(fd);
    size_t cap = 256 + (size_t)n * 12;
    char *cmd = malloc(cap);
    int at = snprintf(cmd, cap, "'%s' logits --model '%s' --tokenizer '%s' --out '%s' --tokens ",
                      tu_build("tools/kvp"), tu_shared("models/stories260K.bin"),
                      tu_shared("models/tok512.bin"), out);
    for (int i = 0; i < n; i++)
        at += snprintf(cmd + at, cap - (size_t)at, "%s%d", i ? "," : "", tokens[i]);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    free(cmd);
    float *lg = malloc((size_t)n * (size_t)vocab * sizeof *lg);
    FILE *f = fopen(out, "rb");
    cr_assert_not_null(f);
    cr_assert_eq(fread(lg, sizeof *lg, (size_t)n * (size_t)vocab, f), (size_t)n * (size_t)vocab);
    cr_assert_eq(fgetc(f), EOF, "kvp logits wrote more than [n][vocab]");
    fclose(f);
    unlink(out);
    return lg;
}

/* The canary's figures computed again without the record's hidden rows: the evicted run
 * replayed here (a fresh instance of the policy at the same budget and chunk, the prompt
 * prefilled, then the reply's tokens decoded one at a time under eviction, as the turn
 * ran them), the full cache's logits from `kvp logits`, and the KL over the whole
 * vocabulary in double precision. */
static void offline(const kvp_model *m, const char *policy, int budget,
                    const kvp_canary_rec *r, double *kl, double *top1)
{
    const int V = m->cfg.vocab_size;
    kvp_runstate ev_rs;
    cr_assert_eq(kvp_runstate_init(&ev_rs, &m->cfg, 32), 0);
    kvp_cache ev;
    cr_assert_eq(kvp_cache_init(&ev, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim,
                                &m->cfg.rope), 0);
    kvp_policy *pol;
    char err[256];
    cr_assert_eq(kvp_policy_create(&pol, policy, NULL, &m->cfg, 1, err, sizeof err), 0, "%s", err);
    kvp_evict_cfg e = {pol, budget, 32, 0};
    double sum = 0.0;
    int agree = 0;
    double *lp = malloc((size_t)V * sizeof *lp), *lq = malloc((size_t)V * sizeof *lq);
    float *q = malloc((size_t)V * sizeof *q);
    int n = r->reply_from + r->n_pos - 1;
    float *full = kvp_logits(r->tokens, n, V);
    cr_assert_eq(kvp_gen_prefill(m, &ev_rs, &ev, &e, r->tokens, r->reply_from, NULL), 0);
    memcpy(q, ev_rs.logits, (size_t)V * sizeof *q);
    for (int k = 0; k < r->n_pos; k++) {
        if (k > 0) {   /* the evicted run's logits after the reply's token k - 1 */
            cr_assert_eq(kvp_gen_decode(m, &ev_rs, &ev, &e, r->tokens[r->reply_from + k - 1]), 0);
            memcpy(q, ev_rs.logits, (size_t)V * sizeof *q);
        }
        const float *p = full + (size_t)(r->reply_from - 1 + k) * V;
        double mp = -INFINITY, mq = -INFINITY, zp = 0.0, zq = 0.0;
        int bp = 0, bq = 0;
        for (int v = 0; v < V; v++) {
            if (p[v] > mp) {
                mp = p[v];
                bp = v;
            }
            if (q[v] > mq) {
                mq = q[v];
                bq = v;
            }
        }
        for (int v = 0; v < V; v++) {
            zp += exp(p[v] - mp);
            zq += exp(q[v] - mq);
        }
        double d = 0.0;
        for (int v = 0; v < V; v++) {
            lp[v] = p[v] - mp - log(zp);
            lq[v] = q[v] - mq - log(zq);
            d += exp(lp[v]) * (lp[v] - lq[v]);
        }
        sum += fmax(d, 0.0);
        agree += bp == bq;
    }
    *kl = sum / r->n_pos;
    *top1 = (double)agree / r->n_pos;
    free(full);
    free(lp);
    free(lq);
    free(q);
    kvp_policy_destroy(pol);
    kvp_cache_free(&ev);
    kvp_runstate_free(&ev_rs);
}

static kvp_canary_result run_canary(fixture *f, const kvp_canary_rec *r)
{
    kvp_runstate rs;
    cr_assert_eq(kvp_runstate_init(&rs, &f->model.cfg, 32), 0);
    kvp_canary_result res;
    char err[256];
    int rc = kvp_canary_run(&f->model, &rs, f->env.kv_type, 32, r, NULL, NULL, &res, err,
                            sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(res.positions, r->n_pos);
    kvp_runstate_free(&rs);
    return res;
}

Test(canary, its_kl_equals_the_offline_computation_under_eviction, .timeout = 120)
{
    fixture f;
    fx_init(&f, "streaming");
    kvp_canary_rec *r = canary_turn(&f, 16, 60, 64);
    cr_assert_gt(r->n_pos, 8);
    kvp_canary_result c = run_canary(&f, r);
    double kl, top1;
    offline(&f.model, "streaming", 16, r, &kl, &top1);
    cr_assert_gt(kl, 1e-3, "budget 16 should cost something (KL %g)", kl);
    cr_assert(fabs(c.kl - kl) <= 1e-3 * kl + 1e-6, "canary %.9g, offline %.9g", c.kl, kl);
    cr_assert(fabs(c.top1 - top1) < 1e-9, "top-1 agreement %g against %g", c.top1, top1);
    cr_assert_lt(top1, 1.0 + 1e-12);
    kvp_canary_rec_free(r);
    fx_free(&f);
}

/* Without eviction the reply's distributions are the full cache's: what the canary
 * recorded lines up position by position with the reference. */
Test(canary, without_eviction_it_finds_nothing, .timeout = 120)
{
    fixture f;
    fx_init(&f, "streaming");
    kvp_canary_rec *r = canary_turn(&f, 0, 60, 64);
    kvp_canary_result c = run_canary(&f, r);
    cr_assert_lt(c.kl, 1e-5, "KL %g with the full cache on both sides", c.kl);
    cr_assert_eq(c.top1, 1.0);
    kvp_canary_rec_free(r);
    fx_free(&f);
}

/* A record over the model's context is refused, not run past it. */
Test(canary, a_record_longer_than_the_context_is_refused, .timeout = 60)
{
    fixture f;
    fx_init(&f, "streaming");
    kvp_canary_rec *r = canary_turn(&f, 16, 20, 8);
    int *big = realloc(r->tokens, sizeof *big * (size_t)(f.model.cfg.seq_len + 8));
    r->tokens = big;
    memmove(big + f.model.cfg.seq_len, big + r->reply_from, (size_t)r->n_pos * sizeof *big);
    for (int i = r->reply_from; i < f.model.cfg.seq_len; i++)
        big[i] = 1;
    r->reply_from = f.model.cfg.seq_len;
    kvp_runstate rs;
    cr_assert_eq(kvp_runstate_init(&rs, &f.model.cfg, 32), 0);
    kvp_canary_result res;
    char err[256];
    cr_assert_eq(kvp_canary_run(&f.model, &rs, f.env.kv_type, 32, r, NULL, NULL, &res, err,
                                sizeof err), -E2BIG);
    kvp_runstate_free(&rs);
    kvp_canary_rec_free(r);
    fx_free(&f);
}

static void turn(ht_hub *h, ht_client *c)
{
    char *text = ht_text(40);
    int from = c->n;
    kvp_hub_message(c->c, text, strlen(text), 24, 1, 0.8f);
    ht_wait(h, c, from, KVP_HUB_DONE, 60);
    free(text);
}

Test(canary, rate_zero_records_nothing_and_rate_one_reaches_the_metrics, .timeout = 180)
{
    ht_hub h;
    ht_start(&h, NULL, "streaming");
    h.cfg.canary_rate = 0.0;
    ht_client c;
    ht_client_new(&h, &c);
    for (int i = 0; i < 3; i++)
        turn(&h, &c);
    ht_settle(&h);
    for (int i = 0; i < 50; i++) {   /* give the idle worker its chance */
        uv_run(&h.loop, UV_RUN_NOWAIT);
        uv_sleep(2);
    }
    kvp_hub_info hi;
    kvp_hub_info_get(h.hub, &hi);
    uint64_t runs, in_step;
    kvpd_sched_idle_counts(h.hub->sched, &runs, &in_step);
    cr_assert_eq(runs, 0, "background work ran with canary_rate 0");
    cr_assert_eq(kvp_background_pending(h.hub->bg), 0);
    cr_assert_eq(h.metrics.canary.runs + h.metrics.canary.skipped_busy + h.metrics.canary.failed, 0);

    h.cfg.canary_rate = 1.0;
    for (int i = 0; i < 2; i++)
        turn(&h, &c);
    double end = kvp_now() + 60;
    while (h.metrics.canary.runs + h.metrics.canary.skipped_busy < 2) {
        cr_assert_lt(kvp_now(), end, "the canary did not report");
        uv_run(&h.loop, UV_RUN_NOWAIT);
        uv_sleep(2);
        kvp_hub_info_get(h.hub, &hi);
    }
    cr_assert_gt(h.metrics.canary.runs, 0, "every canary was skipped on an idle hub");
    kvpd_sched_idle_counts(h.hub->sched, &runs, &in_step);
    cr_assert_eq(in_step, 0);
    size_t len;
    kvpd_gauges g = {0};
    char *text = kvpd_metrics_render(&h.metrics, &g, &len);
    cr_assert(strstr(text, "kvpd_eviction_kl_bucket{policy=\"streaming\",budget=\"64\",le=\"+Inf\"}"),
              "%s", text);
    cr_assert(strstr(text, "kvpd_eviction_top1_agreement_count{policy=\"streaming\",budget=\"64\"}"));
    free(text);
    double kl, top1;
    cr_assert_gt(kvpd_canary_recent(&h.metrics, &kl, &top1), 0);
    cr_assert(kl >= 0.0 && top1 > 0.0 && top1 <= 1.0, "kl %g top1 %g", kl, top1);
    kvp_hub_close(c.c);
    ht_client_free(&c);
    ht_stop(&h);
}
