/* kvp_policy_fork: a policy forked with its cache at token `from` decides as its source
 * would after the source's cache and state were cut back to `from` (kvp_cache_drop_newest
 * + kvp_policy_truncate): the same scores, then the same rows kept at every eviction of
 * the tokens that follow. The source is left as it was. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <errno.h>
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

static void evict(kvp_policy *p, kvp_cache *c, int budget)
{
    cr_assert_geq(kvp_policy_evict(p, c, budget), 0);
}

static void same_heads(const kvp_cache *a, const kvp_cache *b, const char *what)
{
    cr_assert_eq(a->n_seen, b->n_seen, "%s", what);
    for (int i = 0; i < LAYERS * KVH; i++) {
        const kvp_head *x = &a->heads[i], *y = &b->heads[i];
        cr_assert_eq(x->n, y->n, "%s: head %d holds %d vs %d rows", what, i, x->n, y->n);
        for (int r = 0; r < x->n; r++) {
            cr_assert_eq(x->seq[r], y->seq[r], "%s: head %d row %d", what, i, r);
            cr_assert_float_eq(x->stat[r], y->stat[r], 1e-6f, "%s: head %d row %d stat", what, i, r);
            cr_assert_float_eq(x->score[r], y->score[r], 1e-6f, "%s: head %d row %d score", what, i,
                               r);
        }
    }
}

/* A source that saw `total` tokens under `budget` (a mark at `mark`, when >= 0), forked
 * at `from`; the source is then cut back to `from` the way a rewind does, and both
 * continue with the same 30 tokens. */
static void fork_case(const char *name, int total, int mark, int from, int budget)
{
    kvp_policy *src = make(name), *dst = make(name);
    kvp_cache cs, cd;
    fresh_cache(&cs);
    for (int i = 0; i < total; i++) {
        if (i == mark)
            kvp_policy_mark(src, &cs);
        feed(src, &cs);
        if (cs.n_seen % 4 == 0)
            evict(src, &cs, budget);
    }
    void *before;
    size_t len_before;
    cr_assert_eq(kvp_cache_serialize(&cs, &before, &len_before), 0);
    uint64_t rng_before = src->rng;

    cr_assert_eq(kvp_cache_fork(&cd, &cs, from), 0);
    cr_assert_eq(kvp_policy_fork(dst, src, &cd, from), 0);

    /* the source is untouched by the fork */
    void *after;
    size_t len_after;
    cr_assert_eq(kvp_cache_serialize(&cs, &after, &len_after), 0);
    cr_assert_eq(len_before, len_after);
    cr_assert_eq(memcmp(before, after, len_before), 0, "the fork changed the source's cache");
    cr_assert_eq(src->rng, rng_before);
    free(before);
    free(after);

    /* the reference: the source itself, cut back the same way */
    kvp_cache_drop_newest(&cs, (int)(cs.n_seen - from));
    kvp_policy_truncate(src, &cs, from);
    same_heads(&cd, &cs, "after the fork");
    cr_assert_eq(dst->rng, src->rng);

    for (int i = 0; i < 30; i++) {
        feed(src, &cs);
        feed(dst, &cd);
        if (cs.n_seen % 4 == 0) {
            evict(src, &cs, budget);
            evict(dst, &cd, budget);
        }
        same_heads(&cd, &cs, "continuing");
    }
    kvp_cache_free(&cs);
    kvp_cache_free(&cd);
    kvp_policy_destroy(src);
    kvp_policy_destroy(dst);
}

Test(policy_fork, h2o_at_its_mark) { fork_case("h2o", 40, 30, 30, 24); }
Test(policy_fork, h2o_before_its_mark) { fork_case("h2o", 40, 30, 17, 24); }
Test(policy_fork, h2o_without_a_mark) { fork_case("h2o", 40, -1, 25, 24); }
Test(policy_fork, snapkv_window_full) { fork_case("snapkv", 60, -1, 50, 40); }
Test(policy_fork, snapkv_window_cut_below_full) { fork_case("snapkv", 60, -1, 20, 40); }
Test(policy_fork, expected_attention_window_wrapped) { fork_case("expected_attention", 100, -1, 90, 40); }
Test(policy_fork, expected_attention_window_not_full) { fork_case("expected_attention", 60, -1, 50, 30); }
Test(policy_fork, random_carries_its_rng) { fork_case("random", 40, -1, 33, 20); }
Test(policy_fork, stateless_policies)
{
    const char *names[] = {"none", "streaming", "knorm", "keydiff", "lagkv", "tova"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        fork_case(names[i], 40, 20, 27, 24);
}

Test(policy_fork, from_zero_is_a_fresh_start) { fork_case("h2o", 20, 10, 0, 24); }

Test(policy_fork, another_kind_or_shape_is_refused)
{
    kvp_policy *h = make("h2o"), *s = make("snapkv");
    kvp_cache c;
    fresh_cache(&c);
    cr_assert_eq(kvp_policy_fork(s, h, &c, 0), -EINVAL);
    cr_assert_eq(kvp_policy_fork(h, s, &c, 0), -EINVAL);
    cr_assert_eq(kvp_policy_fork(h, h, &c, 0), -EINVAL);
    cr_assert_eq(kvp_policy_fork(NULL, h, &c, 0), -EINVAL);
    kvp_model_config m = cfg();
    m.n_layers = 1;
    kvp_policy *small;
    char err[160];
    cr_assert_eq(kvp_policy_create(&small, "h2o", NULL, &m, 1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_policy_fork(small, h, &c, 0), -EINVAL);
    kvp_policy_destroy(small);
    kvp_cache_free(&c);
    kvp_policy_destroy(h);
    kvp_policy_destroy(s);
}
