/* kvp_policy_truncate / kvp_policy_mark: after the cache is cut back, a policy's own
 * state holds nothing of the tokens removed. SnapKV's query window equals that of a
 * policy that never saw them; H2O's accumulators come back to the mark's exactly when
 * cut there, and are scaled by the share of each row's queries that stay otherwise. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"

#define D 4
#define LAYERS 2
#define KVH 2
#define GROUP 2

static const kvp_rope ROPE = {.n_rot = D, .base = 10000.0f};

static kvp_model_config cfg(void)
{
    return (kvp_model_config){.dim = 16, .hidden_dim = 32, .n_layers = LAYERS,
                              .n_heads = KVH * GROUP, .n_kv_heads = KVH, .head_dim = D,
                              .vocab_size = 32, .seq_len = 4096, .rope = ROPE, .rms_eps = 1e-5f};
}

static float val(int64_t seq, int salt)
{
    return sinf((float)(seq * 7 + salt) * 0.37f);
}

/* One token into every head: its row (key from its seq), on_insert, then its query's
 * attention over the head's rows (deterministic from seq), as the forward pass does. */
static void feed(kvp_policy *p, kvp_cache *c)
{
    int64_t s = c->n_seen;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < KVH; k++) {
            kvp_head *h = kvp_cache_head(c, l, k);
            cr_assert_eq(kvp_head_reserve(h, D, h->n + 1), 0);
            int r = h->n++;
            for (int j = 0; j < D; j++) {
                ((float *)h->k)[(size_t)r * D + j] = val(s, j);
                ((float *)h->v)[(size_t)r * D + j] = val(s, j + 9);
            }
            h->pos[r] = (int32_t)s;
            h->seq[r] = s;
            h->score[r] = h->stat[r] = 0.0f;
            if (p->ops->on_insert)
                p->ops->on_insert(p, l, k, h, r, 1);
            float q[GROUP * D], att[GROUP * 64];
            cr_assert(h->n <= 64);
            for (int g = 0; g < GROUP; g++) {
                float sum = 0.0f;
                for (int j = 0; j < D; j++)
                    q[g * D + j] = val(s, 20 + g * D + j + l + k);
                for (int i = 0; i < h->n; i++)
                    sum += att[g * 64 + i] = 1.0f + val(s + i, g + l * 3 + k);
                for (int i = 0; i < h->n; i++)
                    att[g * 64 + i] /= sum;
            }
            p->ops->on_attention(p, l, k, h, q, GROUP * D, att, 64, 1);
        }
    c->n_seen++;
    c->next_pos++;
}

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

/* SnapKV cut at `from` after `total` tokens scores every head as a policy that saw
 * only the queries its window still holds (first .. from-1). */
static void snapkv_case(int total, int from, int first)
{
    kvp_policy *a = make("snapkv"), *b = make("snapkv");
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
                cr_assert_float_eq(ha->score[i], hb->score[i], 1e-6f,
                                   "head %d/%d row %d: %g vs %g", l, k, i, ha->score[i], hb->score[i]);
        }
    kvp_cache_free(&ca);
    kvp_cache_free(&cb);
    kvp_policy_destroy(a);
    kvp_policy_destroy(b);
}

Test(truncate, snapkv_window_forgets_the_removed_queries)
{
    snapkv_case(20, 12, 0);   /* a window not yet full */
}

Test(truncate, snapkv_window_after_wrapping)
{
    snapkv_case(40, 36, 8);   /* the ring wrapped: queries 8..39 were held, 8..35 stay */
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
