/* kvp_policy_truncate / kvp_policy_mark: after the cache is cut back, a policy's own
 * state holds nothing of the tokens removed. The query windows of SnapKV and Expected
 * Attention equal those of a policy that never saw them; H2O's accumulators come back to the mark's exactly when
 * cut there, and are scaled by the share of each row's queries that stay otherwise. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"
#include "tests/policy/feedutil.h"

static kvp_policy *make(const char *name)
{
    kvp_policy *p;
    char err[160];
    kvp_model_config m = cfg();
    cr_assert_eq(kvp_policy_create(&p, name, NULL, &m, 1, err, sizeof err), 0, "%s", err);
    return p;
}

static void fresh_cache(kvp_cache *c)
{
    cr_assert_eq(kvp_cache_init(c, LAYERS, KVH, D, &ROPE), 0);
}

/* A query-window policy cut at `from` after `total` tokens scores every head as a policy
 * that saw only the queries its window still holds (first .. from-1). */
static void window_case(const char *name, int total, int from, int first)
{
    kvp_policy *a = make(name), *b = make(name);
    kvp_cache ca, cb;
    fresh_cache(&ca);
    fresh_cache(&cb);
    for (int i = 0; i < total; i++)
        feed(a, &ca);
    kvp_cache_drop_newest(&ca, total - from);
    kvp_policy_truncate(a, &ca, from);
    /* b: the same rows, but only the queries from `first` on were observed */
    for (int i = 0; i < from; i++) {
        if (i < first) {
            /* rows without their queries: inserted by hand */
            for (int l = 0; l < LAYERS; l++)
                for (int k = 0; k < KVH; k++) {
                    kvp_head *h = kvp_cache_head(&cb, l, k);
                    cr_assert_eq(kvp_head_reserve(h, D, h->n + 1), 0);
                    int r = h->n++;
                    for (int j = 0; j < D; j++) {
                        ((float *)h->k)[(size_t)r * D + j] = val(i, j);
                        ((float *)h->v)[(size_t)r * D + j] = val(i, j + 9);
                    }
                    h->pos[r] = i;
                    h->seq[r] = i;
                    h->score[r] = h->stat[r] = 0.0f;
                }
            cb.n_seen++;
            cb.next_pos++;
        } else {
            feed(b, &cb);
        }
    }
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < KVH; k++) {
            kvp_head *ha = kvp_cache_head(&ca, l, k), *hb = kvp_cache_head(&cb, l, k);
            cr_assert_eq(ha->n, hb->n);
            a->ops->before_evict(a, l, k, ha);
            b->ops->before_evict(b, l, k, hb);
            for (int i = 0; i < ha->n; i++)
                cr_assert_float_eq(ha->score[i], hb->score[i], 1e-6f, "%s head %d/%d row %d: %g vs %g",
                                   name, l, k, i, ha->score[i], hb->score[i]);
        }
    kvp_cache_free(&ca);
    kvp_cache_free(&cb);
    kvp_policy_destroy(a);
    kvp_policy_destroy(b);
}

Test(truncate, snapkv_window_forgets_the_removed_queries)
{
    window_case("snapkv", 20, 12, 0);   /* a window not yet full */
}

Test(truncate, snapkv_window_after_wrapping)
{
    window_case("snapkv", 40, 36, 8);   /* the ring wrapped: queries 8..39 were held, 8..35 stay */
}

/* Expected Attention holds the queries of the newest 64 tokens past the 4 sinks. */
Test(truncate, expected_attention_window_forgets_the_removed_queries)
{
    window_case("expected_attention", 40, 25, 0);
}

Test(truncate, expected_attention_window_after_wrapping)
{
    window_case("expected_attention", 100, 90, 36);   /* 36..99 were held, 36..89 stay */
}

/* The removed queries weigh: without the cut the scores differ. */
Test(truncate, expected_attention_scores_depend_on_the_window)
{
    kvp_policy *a = make("expected_attention"), *b = make("expected_attention");
    kvp_cache ca, cb;
    fresh_cache(&ca);
    fresh_cache(&cb);
    for (int i = 0; i < 40; i++) {
        feed(a, &ca);
        feed(b, &cb);
    }
    kvp_cache_drop_newest(&ca, 10);
    kvp_cache_drop_newest(&cb, 10);
    kvp_policy_truncate(a, &ca, 30);   /* b keeps the queries of tokens 30..39 */
    kvp_head *ha = kvp_cache_head(&ca, 0, 0), *hb = kvp_cache_head(&cb, 0, 0);
    a->ops->before_evict(a, 0, 0, ha);
    b->ops->before_evict(b, 0, 0, hb);
    float worst = 0.0f;
    for (int i = 0; i < ha->n; i++)
        worst = fmaxf(worst, fabsf(ha->score[i] - hb->score[i]));
    cr_assert_gt(worst, 1e-4f, "the removed queries changed nothing");
    kvp_cache_free(&ca);
    kvp_cache_free(&cb);
    kvp_policy_destroy(a);
    kvp_policy_destroy(b);
}

Test(truncate, h2o_restores_the_mark_and_scales_past_it)
{
    kvp_policy *p = make("h2o");
    kvp_cache c;
    fresh_cache(&c);
    for (int i = 0; i < 10; i++)
        feed(p, &c);
    float at_mark[LAYERS * KVH][10];
    for (int h = 0; h < LAYERS * KVH; h++)
        memcpy(at_mark[h], c.heads[h].stat, sizeof at_mark[h]);
    kvp_policy_mark(p, &c);
    for (int i = 0; i < 6; i++)
        feed(p, &c);
    cr_assert_neq(c.heads[0].stat[0], at_mark[0][0], "the reply's queries added attention");
    /* cut exactly at the mark (a regenerate): the sums are the mark's */
    kvp_cache_drop_newest(&c, 6);
    kvp_policy_truncate(p, &c, 10);
    for (int h = 0; h < LAYERS * KVH; h++) {
        cr_assert_eq(c.heads[h].n, 10);
        for (int r = 0; r < 10; r++) {
            cr_assert_eq(c.heads[h].stat[r], at_mark[h][r]);
            cr_assert_eq(c.heads[h].score[r], at_mark[h][r]);
        }
    }
    /* cut before it (an edited message): each sum scaled by the share of its queries kept */
    kvp_cache_drop_newest(&c, 4);
    kvp_policy_truncate(p, &c, 6);
    for (int h = 0; h < LAYERS * KVH; h++)
        for (int r = 0; r < 6; r++)
            cr_assert_float_eq(c.heads[h].stat[r], at_mark[h][r] * (float)(6 - r) / (float)(10 - r),
                               1e-6f);
    kvp_cache_free(&c);
    kvp_policy_destroy(p);
}

Test(truncate, stateless_policies_accept_it)
{
    const char *names[] = {"none", "random", "streaming", "knorm", "keydiff", "lagkv", "tova"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        kvp_policy *p = make(names[i]);
        kvp_cache c;
        fresh_cache(&c);
        kvp_policy_mark(p, &c);
        kvp_policy_truncate(p, &c, 0);
        kvp_cache_free(&c);
        kvp_policy_destroy(p);
    }
    kvp_policy_truncate(NULL, NULL, 0);   /* no policy: nothing to do */
}
