/* policy.c: the registry and the shared rank-and-keep step, checked against a plain
 * reference on random heads (with ties and NaN scores). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"

#define D 4
static const kvp_rope ROPE = {.n_rot = D, .base = 10000.0f};

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int rng_int(uint64_t *s, int lo, int hi)  /* [lo, hi] */
{
    return lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static kvp_model_config test_cfg(void)
{
    return (kvp_model_config){ .dim = 16, .hidden_dim = 32, .n_layers = 2, .n_heads = 4,
                               .n_kv_heads = 2, .head_dim = D, .vocab_size = 32,
                               .seq_len = 4096, .rope = {.n_rot = D, .base = 10000.0f}, .rms_eps = 1e-5f };
}

/* Appends n rows to h; every field of row seq s encodes s so compaction can be checked. */
static void add_rows(kvp_cache *c, kvp_head *h, int n)
{
    cr_assert_eq(kvp_head_reserve(h, c->head_dim, h->n + n), 0);
    for (int i = h->n; i < h->n + n; i++) {
        int64_t s = c->n_seen + (i - h->n);
        for (int j = 0; j < c->head_dim; j++) {
            ((float *)h->k)[(size_t)i * c->head_dim + j] = (float)s + 0.25f * (float)j;
            ((float *)h->v)[(size_t)i * c->head_dim + j] = -(float)s - 0.25f * (float)j;
        }
        h->pos[i] = (int32_t)s;
        h->seq[i] = s;
        h->score[i] = 0.0f;
        h->stat[i] = (float)s * 0.5f;
    }
    h->n += n;
}

static void check_rows_intact(const kvp_cache *c, const kvp_head *h)
{
    for (int i = 0; i < h->n; i++) {
        int64_t s = h->seq[i];
        cr_assert_eq(h->pos[i], (int32_t)s);
        cr_assert_eq(h->stat[i], (float)s * 0.5f);
        for (int j = 0; j < c->head_dim; j++) {
            cr_assert_eq(((float *)h->k)[(size_t)i * c->head_dim + j], (float)s + 0.25f * (float)j);
            cr_assert_eq(((float *)h->v)[(size_t)i * c->head_dim + j], -(float)s - 0.25f * (float)j);
        }
    }
}

/* A policy whose scores the test writes itself; counts before_evict calls and may
 * override the recent window. */
typedef struct probe {
    int before_calls;
    int window;  /* < 0: no recent_window op behaviour (n_recent) */
    int per_layer;   /* the window grows by this many rows per layer */
} probe;

static void probe_before(kvp_policy *p, int layer, int kvh, kvp_head *h)
{
    (void)layer;
    (void)kvh;
    (void)h;
    ((probe *)p->impl)->before_calls++;
}

static int probe_window(const kvp_policy *p, int layer, int budget)
{
    (void)budget;
    const probe *pr = p->impl;
    return (pr->window >= 0 ? pr->window : p->n_recent) + layer * pr->per_layer;
}

static const kvp_policy_ops probe_ops = {
    .name = "probe", .before_evict = probe_before, .recent_window = probe_window,
};

/* ---- the reference: the rule written out plainly ------------------------------------ */

typedef struct cand {
    double score;
    int row;
} cand;

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->score > y->score)
        return -1;
    if (x->score < y->score)
        return 1;
    return x->row - y->row;
}

/* kept[r] = 1 for the rows rank-and-keep must keep */
static void ref_keep(const float *score, int n, int n_sink, int window, int budget, char *kept)
{
    memset(kept, 0, (size_t)n);
    if (n <= budget) {
        memset(kept, 1, (size_t)n);
        return;
    }
    char *prot = calloc((size_t)n, 1);
    int n_prot = 0;
    for (int r = 0; r < n; r++) {
        prot[r] = r < n_sink || r >= n - window;
        n_prot += prot[r];
    }
    if (budget <= n_prot) {
        int sinks = 0;
        for (int r = 0; r < n && r < n_sink && sinks < budget; r++, sinks++)
            kept[r] = 1;
        for (int r = n - 1, left = budget - sinks; left > 0; r--, left--)
            kept[r] = 1;
    } else {
        cand *cs = malloc((size_t)n * sizeof *cs);
        int m = 0;
        for (int r = 0; r < n; r++) {
            if (prot[r]) {
                kept[r] = 1;
                continue;
            }
            cs[m].score = isnan(score[r]) ? -INFINITY : score[r];
            cs[m].row = r;
            m++;
        }
        qsort(cs, (size_t)m, sizeof *cs, cand_cmp);
        for (int i = 0; i < budget - n_prot; i++)
            kept[cs[i].row] = 1;
        free(cs);
    }
    free(prot);
}

Test(rank_and_keep, matches_reference_on_random_heads)
{
    uint64_t s = 0x1234567u;
    for (int it = 0; it < 3000; it++) {
        kvp_cache c;
        cr_assert_eq(kvp_cache_init(&c, 1, 1, D, &ROPE), 0);
        kvp_head *h = kvp_cache_head(&c, 0, 0);
        int n = rng_int(&s, 1, 200);
        add_rows(&c, h, n);
        c.n_seen = n;
        int levels = rng_int(&s, 1, 6);  /* few levels: many ties */
        for (int i = 0; i < n; i++)
            h->score[i] = rng_int(&s, 0, 20) == 0 ? NAN : (float)rng_int(&s, 0, levels);
        probe pr = { 0, rng_int(&s, 0, 3) == 0 ? rng_int(&s, 0, 60) : -1, 0 };
        kvp_policy p = { .ops = &probe_ops, .n_sink = rng_int(&s, 0, 8),
                         .n_recent = rng_int(&s, 0, 40), .impl = &pr };
        int budget = rng_int(&s, 1, n + 5);
        int window = pr.window >= 0 ? pr.window : p.n_recent;

        float *score = malloc((size_t)n * sizeof *score);
        memcpy(score, h->score, (size_t)n * sizeof *score);
        char *kept = malloc((size_t)n);
        ref_keep(score, n, p.n_sink, window, budget, kept);

        int dropped = kvp_policy_evict_head(&p, &c, 0, 0, budget);
        cr_assert_eq(dropped, n > budget ? n - budget : 0, "it %d", it);
        cr_assert_eq(h->n, n > budget ? budget : n);
        cr_assert_eq(c.evicted_rows, (uint64_t)dropped);
        cr_assert_eq(pr.before_calls, n > budget ? 1 : 0);
        int r = 0;
        for (int i = 0; i < n; i++)
            if (kept[i]) {
                cr_assert_lt(r, h->n);
                cr_assert_eq(h->seq[r], i, "it %d: row %d holds seq %lld, expected %d",
                             it, r, (long long)h->seq[r], i);
                r++;
            }
        cr_assert_eq(r, h->n);
        check_rows_intact(&c, h);
        free(score);
        free(kept);
        kvp_cache_free(&c);
    }
}

Test(rank_and_keep, ties_keep_the_older_row)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, 1, D, &ROPE), 0);
    kvp_head *h = kvp_cache_head(&c, 0, 0);
    add_rows(&c, h, 10);
    for (int i = 0; i < 10; i++)
        h->score[i] = 1.0f;
    probe pr = { 0, -1, 0 };
    kvp_policy p = { .ops = &probe_ops, .n_sink = 1, .n_recent = 1, .impl = &pr };
    cr_assert_eq(kvp_policy_evict_head(&p, &c, 0, 0, 5), 5);
    int64_t want[] = { 0, 1, 2, 3, 9 };
    for (int i = 0; i < 5; i++)
        cr_assert_eq(h->seq[i], want[i]);
    kvp_cache_free(&c);
}

Test(rank_and_keep, small_budget_keeps_sinks_then_newest)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, 1, D, &ROPE), 0);
    kvp_head *h = kvp_cache_head(&c, 0, 0);
    add_rows(&c, h, 40);
    for (int i = 0; i < 40; i++)
        h->score[i] = 100.0f - (float)i;  /* the middle would win on score */
    probe pr = { 0, -1, 0 };
    kvp_policy p = { .ops = &probe_ops, .n_sink = 4, .n_recent = 16, .impl = &pr };
    cr_assert_eq(kvp_policy_evict_head(&p, &c, 0, 0, 7), 33);
    int64_t want[] = { 0, 1, 2, 3, 37, 38, 39 };
    for (int i = 0; i < 7; i++)
        cr_assert_eq(h->seq[i], want[i]);
    cr_assert_eq(kvp_policy_evict_head(&p, &c, 0, 0, 3), 4);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(h->seq[i], i);
    kvp_cache_free(&c);
}

Test(rank_and_keep, nan_scores_rank_last)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, 1, D, &ROPE), 0);
    kvp_head *h = kvp_cache_head(&c, 0, 0);
    add_rows(&c, h, 6);
    float sc[] = { 0, NAN, -5.0f, NAN, -1.0f, 0 };
    memcpy(h->score, sc, sizeof sc);
    probe pr = { 0, -1, 0 };
    kvp_policy p = { .ops = &probe_ops, .n_sink = 0, .n_recent = 0, .impl = &pr };
    cr_assert_eq(kvp_policy_evict_head(&p, &c, 0, 0, 4), 2);
    int64_t want[] = { 0, 2, 4, 5 };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(h->seq[i], want[i]);
    kvp_cache_free(&c);
}

Test(rank_and_keep, nonpositive_budget_is_unbounded)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, 1, D, &ROPE), 0);
    kvp_head *h = kvp_cache_head(&c, 0, 0);
    add_rows(&c, h, 30);
    probe pr = { 0, -1, 0 };
    kvp_policy p = { .ops = &probe_ops, .n_sink = 4, .n_recent = 16, .impl = &pr };
    cr_assert_eq(kvp_policy_evict_head(&p, &c, 0, 0, 0), 0);
    cr_assert_eq(kvp_policy_evict(&p, &c, -3), 0);
    cr_assert_eq(h->n, 30);
    cr_assert_eq(pr.before_calls, 0);
    kvp_cache_free(&c);
}

Test(rank_and_keep, evict_covers_every_head)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 3, 2, D, &ROPE), 0);
    int total = 0;
    for (int i = 0; i < 6; i++) {
        kvp_head *h = &c.heads[i];
        add_rows(&c, h, 10 + 7 * i);
        for (int r = 0; r < h->n; r++)
            h->score[r] = (float)((r * 7919) % 13);
        total += h->n > 25 ? h->n - 25 : 0;
    }
    probe pr = { 0, -1, 0 };
    kvp_policy p = { .ops = &probe_ops, .n_sink = 4, .n_recent = 16, .impl = &pr };
    cr_assert_eq(kvp_policy_evict(&p, &c, 25), total);
    cr_assert_eq(c.evicted_rows, (uint64_t)total);
    for (int i = 0; i < 6; i++) {
        cr_assert_leq(c.heads[i].n, 25);
        check_rows_intact(&c, &c.heads[i]);
    }
    cr_assert_eq(pr.before_calls, 3);  /* heads of 10, 17 and 24 rows need nothing */
    kvp_cache_free(&c);
}

/* A policy whose recent window depends on the layer: per-head and global eviction both
 * keep each head's own layer's newest rows, and global eviction each layer's floor. */
Test(rank_and_keep, each_layer_keeps_its_own_window)
{
    for (int global = 0; global < 2; global++) {
        kvp_cache c;
        cr_assert_eq(kvp_cache_init(&c, 3, 2, D, &ROPE), 0);
        for (int i = 0; i < 6; i++) {
            kvp_head *h = &c.heads[i];
            add_rows(&c, h, 120);
            /* the oldest rows score highest: only the window keeps the newest */
            for (int r = 0; r < h->n; r++)
                h->score[r] = (float)(h->n - r);
        }
        probe pr = { 0, 8, 10 };
        kvp_policy p = { .ops = &probe_ops, .n_sink = 2, .n_recent = 8, .impl = &pr };
        int budget = 48;
        int rc = global ? kvp_policy_evict_global(&p, &c, budget) : kvp_policy_evict(&p, &c, budget);
        cr_assert_eq(rc, 6 * (120 - budget));
        for (int i = 0; i < 6; i++) {
            const kvp_head *h = &c.heads[i];
            int layer = i / 2, win = 8 + 10 * layer;
            if (global)
                cr_assert_geq(h->n, kvp_policy_head_floor(&p, layer, budget), "head %d", i);
            else
                cr_assert_eq(h->n, budget);
            /* the window's rows are there, and the row just before it is not (its score is
             * the lowest of the rows the agents ranked) */
            for (int r = 0; r < win; r++)
                cr_assert_eq(h->seq[h->n - 1 - r], c.n_seen + 119 - r, "%s head %d row %d",
                             global ? "global" : "per head", i, r);
            cr_assert_neq(h->seq[h->n - 1 - win], c.n_seen + 119 - win, "%s head %d",
                          global ? "global" : "per head", i);
        }
        kvp_cache_free(&c);
    }
}

/* ---- registry ------------------------------------------------------------------------ */

Test(registry, every_listed_baseline_creates_with_defaults)
{
    kvp_model_config cfg = test_cfg();
    char names[256], err[256];
    snprintf(names, sizeof names, "%s", kvp_policy_names());
    int count = 0;
    for (char *save, *name = strtok_r(names, " ", &save); name; name = strtok_r(NULL, " ", &save)) {
        count++;
        if (strcmp(name, "kvp") == 0)
            continue;  /* needs a policy file: tests/policy/test_kvp_agent.c */
        kvp_policy *p = NULL;
        cr_assert_eq(kvp_policy_create(&p, name, NULL, &cfg, 1, err, sizeof err), 0,
                     "%s: %s", name, err);
        cr_assert_str_eq(p->ops->name, name);
        cr_assert_eq(p->n_sink, 4);
        cr_assert_eq(p->n_recent, 16);
        cr_assert_neq(p->rng, 0);
        cr_assert_eq(kvp_policy_is_none(p), strcmp(name, "none") == 0);
        kvp_policy_destroy(p);
    }
    cr_assert_eq(count, 11);
}

/* The oracle only makes sense inside the evaluator (it needs the future): the runtime
 * registry, which the daemon uses, refuses it and names what it allows. */
Test(registry, oracle_is_not_a_runtime_policy)
{
    kvp_model_config cfg = test_cfg();
    char err[512] = "";
    kvp_policy *p = NULL;
    cr_assert_eq(kvp_policy_create(&p, "oracle", NULL, &cfg, 1, err, sizeof err), -EINVAL);
    cr_assert_null(p);
    cr_assert(strstr(err, "streaming"), "%s", err);
    cr_assert_null(strstr(kvp_policy_names(), "oracle"));
}

Test(registry, unknown_name_lists_every_name)
{
    kvp_model_config cfg = test_cfg();
    char err[512] = "";
    kvp_policy dummy = { 0 }, *p = &dummy;
    cr_assert_eq(kvp_policy_create(&p, "lru", NULL, &cfg, 1, err, sizeof err), -EINVAL);
    cr_assert_null(p);
    cr_assert(strstr(err, "lru"), "%s", err);
    cr_assert(strstr(err, kvp_policy_names()), "%s", err);
}

Test(registry, kvp_needs_a_policy_file)
{
    kvp_model_config cfg = test_cfg();
    char err[512] = "";
    kvp_policy *p = NULL;
    cr_assert_lt(kvp_policy_create(&p, "kvp", NULL, &cfg, 1, err, sizeof err), 0);
    cr_assert_null(p);
    cr_assert_neq(err[0], '\0');
    err[0] = '\0';
    cr_assert_lt(kvp_policy_create(&p, "kvp", "/nonexistent/policy.kvp", &cfg, 1, err,
                                   sizeof err), 0);
    cr_assert_null(p);
    cr_assert_neq(err[0], '\0');
}

Test(registry, shape_needing_policies_reject_a_missing_config)
{
    const char *need[] = { "knorm", "keydiff", "lagkv", "h2o", "tova", "snapkv",
                           "expected_attention" };
    const char *free_[] = { "none", "random", "streaming" };
    char err[256];
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        kvp_policy *p = NULL;
        err[0] = '\0';
        cr_assert_eq(kvp_policy_create(&p, need[i], NULL, NULL, 1, err, sizeof err), -EINVAL,
                     "%s", need[i]);
        cr_assert_null(p);
        cr_assert(strstr(err, need[i]), "%s", err);
    }
    for (size_t i = 0; i < sizeof free_ / sizeof free_[0]; i++) {
        kvp_policy *p = NULL;
        cr_assert_eq(kvp_policy_create(&p, free_[i], NULL, NULL, 1, err, sizeof err), 0);
        kvp_policy_destroy(p);
    }
}

/* Shapes the query-window policies cannot use are refused, naming the policy and what is
 * wrong: query heads not a multiple of the KV heads; Expected Attention also refuses a
 * RoPE whose rotated floats are odd or more than a head holds. */
Test(registry, query_window_policies_refuse_bad_shapes)
{
    const char *names[] = { "h2o", "tova", "snapkv", "expected_attention" };
    char err[256];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        kvp_model_config cfg = test_cfg();
        cfg.n_heads = cfg.n_kv_heads + 1;
        kvp_policy *p = NULL;
        err[0] = '\0';
        cr_assert_eq(kvp_policy_create(&p, names[i], NULL, &cfg, 1, err, sizeof err), -EINVAL,
                     "%s", names[i]);
        cr_assert_null(p);
        cr_assert(strstr(err, names[i]) && strstr(err, "KV heads"), "%s", err);
    }
    int bad_rot[] = { 3, -2, D + 2 };
    for (size_t i = 0; i < sizeof bad_rot / sizeof bad_rot[0]; i++) {
        kvp_model_config cfg = test_cfg();
        cfg.rope.n_rot = bad_rot[i];
        kvp_policy *p = NULL;
        err[0] = '\0';
        cr_assert_eq(kvp_policy_create(&p, "expected_attention", NULL, &cfg, 1, err, sizeof err),
                     -EINVAL, "n_rot %d", bad_rot[i]);
        cr_assert_null(p);
        cr_assert(strstr(err, "expected_attention") && strstr(err, "RoPE"), "%s", err);
    }
}

Test(registry, none_and_null_never_evict)
{
    kvp_model_config cfg = test_cfg();
    char err[256];
    kvp_policy *p = NULL;
    cr_assert_eq(kvp_policy_create(&p, "none", NULL, &cfg, 1, err, sizeof err), 0);
    cr_assert(kvp_policy_is_none(p));
    cr_assert(kvp_policy_is_none(NULL));
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 2, 2, D, &ROPE), 0);
    for (int i = 0; i < 4; i++)
        add_rows(&c, &c.heads[i], 50);
    cr_assert_eq(kvp_policy_evict(p, &c, 8), 0);
    cr_assert_eq(kvp_policy_evict(NULL, &c, 8), 0);
    cr_assert_eq(kvp_policy_evict_head(p, &c, 1, 1, 8), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(c.heads[i].n, 50);
    kvp_cache_free(&c);
    kvp_policy_destroy(p);
    kvp_policy_destroy(NULL);
}

Test(registry, seeds_give_distinct_rng_states)
{
    kvp_model_config cfg = test_cfg();
    char err[256];
    kvp_policy *a, *b, *z;
    cr_assert_eq(kvp_policy_create(&a, "random", NULL, &cfg, 7, err, sizeof err), 0);
    cr_assert_eq(kvp_policy_create(&b, "random", NULL, &cfg, 8, err, sizeof err), 0);
    cr_assert_eq(kvp_policy_create(&z, "random", NULL, &cfg, 0, err, sizeof err), 0);
    cr_assert_neq(a->rng, b->rng);
    cr_assert_neq(z->rng, 0);
    kvp_policy_destroy(a);
    kvp_policy_destroy(b);
    kvp_policy_destroy(z);
}

/* ---- global budgets ---------------------------------------------------------------- */

/* Heads of many sizes and random scores (ties, NaN): after a global eviction the session
 * holds exactly budget x heads rows (or all it had, when fewer and no head is over its
 * cap); every head keeps its sinks, its recent window, at least its floor (or all its
 * rows) and at most its cap; the rows kept are whole and in order; and no row left out
 * outranks, by the calibrated score, a row kept beyond a head's floor. */
Test(global_budget, the_total_is_exact_and_every_head_within_floor_and_cap)
{
    uint64_t s = 0x5eed;
    for (int it = 0; it < 300; it++) {
        kvp_cache c;
        int layers = rng_int(&s, 1, 3), kvh = rng_int(&s, 1, 3), H = layers * kvh;
        cr_assert_eq(kvp_cache_init(&c, layers, kvh, D, &ROPE), 0);
        int budget = rng_int(&s, 20, 60), sizes[9], rows = 0;
        for (int i = 0; i < H; i++) {
            kvp_head *h = &c.heads[i];
            add_rows(&c, h, sizes[i] = rng_int(&s, 0, 5 * budget));
            rows += h->n;
            int spread = rng_int(&s, 0, 3);
            for (int r = 0; r < h->n; r++)
                h->score[r] = rng_int(&s, 0, 40) == 0 ? NAN : (float)rng_int(&s, 0, 8 << spread) / 4.0f;
        }
        probe pr = { 0, -1, 0 };
        kvp_policy p = { .ops = &probe_ops, .n_sink = 4, .n_recent = 16, .impl = &pr };
        int floor = kvp_policy_head_floor(&p, 0, budget), cap = kvp_policy_head_cap(budget);
        /* the protected rows, then 1/8 of the rest, at least one (when there is a rest) */
        cr_assert_eq(floor, budget <= 20 ? 20 : 20 + ((budget - 20) / 8 > 1 ? (budget - 20) / 8 : 1),
                     "budget %d", budget);
        int over_cap = 0;
        for (int i = 0; i < H; i++)
            over_cap |= sizes[i] > cap;
        int dropped = kvp_policy_evict_global(&p, &c, budget);
        cr_assert_geq(dropped, 0);
        int after = (int)kvp_cache_rows(&c);
        cr_assert_eq(after, rows - dropped);
        if (rows > budget * H)
            cr_assert_eq(after, budget * H, "it %d: %d rows kept, total %d", it, after, budget * H);
        else if (!over_cap)
            cr_assert_eq(dropped, 0);
        else
            cr_assert_leq(after, budget * H);
        for (int i = 0; i < H; i++) {
            const kvp_head *h = &c.heads[i];
            int n0 = sizes[i];
            cr_assert_leq(h->n, cap);
            cr_assert_geq(h->n, n0 < floor ? n0 : floor, "it %d head %d: %d rows, floor %d", it, i, h->n, floor);
            check_rows_intact(&c, h);
            for (int r = 1; r < h->n; r++)
                cr_assert_lt(h->seq[r - 1], h->seq[r]);
            if (h->n == n0)
                continue;
            /* the sinks and the 16 newest */
            for (int r = 0; r < 4; r++)
                cr_assert_eq(h->seq[r], c.n_seen + r);
            for (int r = 0; r < 16; r++)
                cr_assert_eq(h->seq[h->n - 1 - r], c.n_seen + n0 - 1 - r);
        }
        kvp_cache_free(&c);
    }
}

/* Calibration moves rows to the heads that need them: a head whose scores single out a
 * few rows gives rows to a head whose scores are flat, and the total stays the budget's. */
Test(global_budget, a_peaked_head_gives_rows_to_a_flat_one)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, 2, D, &ROPE), 0);
    kvp_head *peaked = &c.heads[0], *flat = &c.heads[1];
    add_rows(&c, peaked, 300);
    add_rows(&c, flat, 300);
    for (int r = 0; r < 300; r++) {
        peaked->score[r] = r % 50 == 7 ? 20.0f : 0.0f;   /* 6 rows stand out */
        flat->score[r] = 0.01f * (float)(r % 3);
    }
    probe pr = { 0, -1, 0 };
    kvp_policy p = { .ops = &probe_ops, .n_sink = 4, .n_recent = 16, .impl = &pr };
    cr_assert_eq(kvp_policy_evict_global(&p, &c, 64), 600 - 128);
    cr_assert_eq(peaked->n + flat->n, 128);
    cr_assert_eq(peaked->n, kvp_policy_head_floor(&p, 0, 64) > 20 + 6 ? kvp_policy_head_floor(&p, 0, 64) : 20 + 6,
                 "peaked head kept %d", peaked->n);
    cr_assert_gt(flat->n, 64, "flat head kept %d", flat->n);
    /* the peaked head's standouts all stay */
    int standouts = 0;
    for (int r = 0; r < peaked->n; r++)
        standouts += peaked->seq[r] % 50 == 7;
    cr_assert_eq(standouts, 6);
    /* a budget below the floor: per head, as kvp_policy_evict */
    kvp_cache_free(&c);
    cr_assert_eq(kvp_cache_init(&c, 1, 2, D, &ROPE), 0);
    add_rows(&c, &c.heads[0], 50);
    add_rows(&c, &c.heads[1], 50);
    cr_assert_eq(kvp_policy_evict_global(&p, &c, 12), 76);
    cr_assert_eq(c.heads[0].n, 12);
    cr_assert_eq(c.heads[1].n, 12);
    kvp_cache_free(&c);
}

/* A calibration that puts head 1's scores ten times above head 0's. */
static void probe_calibrate(const kvp_policy *p, int layer, int kvh, const float *in, int n,
                            float *out)
{
    (void)p, (void)layer;
    for (int i = 0; i < n; i++)
        out[i] = kvh == 1 ? 10.0f * in[i] : in[i];
}

/* The global ranking reads the policy's calibrated scores: two heads with the same raw
 * scores split the rows evenly, and when the calibration says head 1's rows matter more,
 * head 1 takes everything above head 0's floor, up to its cap. */
Test(global_budget, the_ranking_uses_the_policys_calibration)
{
    for (int calibrated = 0; calibrated < 2; calibrated++) {
        kvp_cache c;
        cr_assert_eq(kvp_cache_init(&c, 1, 2, D, &ROPE), 0);
        add_rows(&c, &c.heads[0], 200);
        add_rows(&c, &c.heads[1], 200);
        for (int r = 0; r < 200; r++)   /* distinct, shuffled */
            c.heads[0].score[r] = c.heads[1].score[r] = 1.0f + (float)((r * 37) % 200) / 10.0f;
        probe pr = { 0, -1, 0 };
        kvp_policy_ops ops = probe_ops;
        ops.calibrate = calibrated ? probe_calibrate : NULL;
        kvp_policy p = { .ops = &ops, .n_sink = 4, .n_recent = 16, .impl = &pr };
        int budget = 40, floor = kvp_policy_head_floor(&p, 0, budget);
        cr_assert_eq(kvp_policy_evict_global(&p, &c, budget), 400 - 2 * budget);
        if (!calibrated) {
            /* equal raw scores: ties go to the lower head, at most one row apart */
            cr_assert_leq(abs(c.heads[0].n - c.heads[1].n), 1, "%d %d", c.heads[0].n, c.heads[1].n);
        } else {
            cr_assert_eq(c.heads[0].n, floor, "head 0 kept %d", c.heads[0].n);
            cr_assert_eq(c.heads[1].n, 2 * budget - floor);
        }
        kvp_cache_free(&c);
    }
}

Test(global_budget, mode_names_parse_and_refuse_others)
{
    cr_expect_eq(kvp_budget_mode_parse("per_head"), KVP_BUDGET_PER_HEAD);
    cr_expect_eq(kvp_budget_mode_parse("global"), KVP_BUDGET_GLOBAL);
    const char *bad[] = {"", "Global", "per-head", "perhead", "global ", "1", NULL};
    for (int i = 0; bad[i]; i++)
        cr_expect_eq(kvp_budget_mode_parse(bad[i]), -1, "'%s'", bad[i]);
    cr_expect_eq(kvp_budget_mode_parse(NULL), -1);
    cr_expect_str_eq(kvp_budget_mode_name(KVP_BUDGET_GLOBAL), "global");
    cr_expect_str_eq(kvp_budget_mode_name(KVP_BUDGET_PER_HEAD), "per_head");
}

/* A calibration flat over a head's top scores (above its last knot): one value per head. */
static void flat_calibrate(const kvp_policy *p, int layer, int kvh, const float *in, int n,
                           float *out)
{
    (void)p, (void)layer, (void)in;
    for (int i = 0; i < n; i++)
        out[i] = kvh == 1 ? 5.0f : 1.0f;
}

/* Where the calibration ties a head's rows, the head's own ranking decides which of them
 * stay (its best raw scores, not its oldest rows), and a head the calibration ranks last
 * still keeps its best unprotected row (the floor): losing it cost stories260K 3.8x the
 * one-shot KL at budget 32. */
Test(global_budget, calibration_ties_keep_each_heads_best_rows)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, 2, D, &ROPE), 0);
    add_rows(&c, &c.heads[0], 120);
    add_rows(&c, &c.heads[1], 120);
    for (int r = 0; r < 120; r++)   /* distinct, shuffled; the best rows are late */
        c.heads[0].score[r] = c.heads[1].score[r] = (float)((r * 53) % 120);
    probe pr = { 0, -1, 0 };
    kvp_policy_ops ops = probe_ops;
    ops.calibrate = flat_calibrate;
    kvp_policy p = { .ops = &ops, .n_sink = 4, .n_recent = 16, .impl = &pr };
    int budget = 32, floor = kvp_policy_head_floor(&p, 0, budget);
    cr_assert_eq(floor, 4 + 16 + 1);
    cr_assert_eq(kvp_policy_evict_global(&p, &c, budget), 240 - 2 * budget);
    cr_assert_eq(c.heads[0].n, floor);
    cr_assert_eq(c.heads[1].n, 2 * budget - floor);
    /* each head's unprotected rows kept are exactly its best raw scores among them */
    for (int hi = 0; hi < 2; hi++) {
        const kvp_head *h = &c.heads[hi];
        float worst_kept = INFINITY;
        char kept[120] = {0};
        for (int r = 4; r < h->n - 16; r++) {
            kept[h->seq[r] - c.n_seen] = 1;
            float s = (float)((h->seq[r] - c.n_seen) * 53 % 120);
            worst_kept = s < worst_kept ? s : worst_kept;
        }
        for (int r = 4; r < 120 - 16; r++)
            if (!kept[r])
                cr_assert_lt((float)(r * 53 % 120), worst_kept, "head %d: row %d (score %d) evicted "
                             "below a kept score %g", hi, r, r * 53 % 120, worst_kept);
    }
    kvp_cache_free(&c);
}
