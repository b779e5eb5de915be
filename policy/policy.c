/* Policy registry and the rank-and-keep step every policy shares. */
#include "policy/policy.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "policy/kvp_agent.h"

static const struct {
    const char *name;
    int (*create)(kvp_policy *p, const char *policy_file, char *err, size_t errlen);
} registry[] = {
    { "none", kvp_none_policy_create },
    { "random", kvp_random_policy_create },
    { "streaming", kvp_streaming_policy_create },
    { "knorm", kvp_knorm_policy_create },
    { "keydiff", kvp_keydiff_policy_create },
    { "lagkv", kvp_lagkv_policy_create },
    { "h2o", kvp_h2o_policy_create },
    { "tova", kvp_tova_policy_create },
    { "snapkv", kvp_snapkv_policy_create },
    { "expected_attention", kvp_expected_attention_policy_create },
    { "kvp", kvp_agent_policy_create },
};

const char *kvp_policy_names(void)
{
    return "none random streaming knorm keydiff lagkv h2o tova snapkv expected_attention kvp";
}

/* A policy with its defaults, before its constructor installs the ops; NULL with a
 * message when out of memory. */
static kvp_policy *policy_alloc(const char *name, const kvp_model_config *cfg, uint64_t seed,
                                char *err, size_t errlen)
{
    kvp_policy *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "policy %s: out of memory", name);
        return NULL;
    }
    if (cfg)
        p->cfg = *cfg;
    p->n_sink = KVP_DEFAULT_SINKS;
    p->n_recent = KVP_DEFAULT_RECENT;
    p->rng = kvp_rng_seed(seed);
    return p;
}

int kvp_policy_make(kvp_policy **out,
                    int (*create)(kvp_policy *p, const char *policy_file, char *err, size_t errlen),
                    const char *name, const char *policy_file, const kvp_model_config *cfg,
                    uint64_t seed, char *err, size_t errlen)
{
    *out = NULL;
    kvp_policy *p = policy_alloc(name, cfg, seed, err, errlen);
    if (!p)
        return -ENOMEM;
    int rc = create(p, policy_file, err, errlen);
    if (rc < 0) {
        free(p);
        return rc;
    }
    *out = p;
    return 0;
}

int kvp_policy_create(kvp_policy **out, const char *name, const char *policy_file,
                      const kvp_model_config *cfg, uint64_t seed, char *err, size_t errlen)
{
    *out = NULL;
    size_t i = 0, n = sizeof registry / sizeof registry[0];
    while (i < n && !(name && strcmp(name, registry[i].name) == 0))
        i++;
    if (i == n) {
        snprintf(err, errlen, "unknown policy '%s' (one of: %s)", name ? name : "(null)",
                 kvp_policy_names());
        return -EINVAL;
    }
    return kvp_policy_make(out, registry[i].create, name, policy_file, cfg, seed, err, errlen);
}

struct kvp_policy_weights {
    char name[32];
    int has_set;            /* the kvp policy: its agents, loaded once */
    kvp_agent_set set;
};

int kvp_policy_weights_load(kvp_policy_weights **out, const char *name, const char *policy_file,
                            const kvp_model_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    kvp_policy_weights *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "policy %s: out of memory", name ? name : "(null)");
        return -ENOMEM;
    }
    int rc;
    if (name && !strcmp(name, "kvp") && policy_file && *policy_file) {
        rc = kvp_agent_set_load(&w->set, policy_file, cfg, err, errlen);
        w->has_set = rc == 0;
    } else {
        /* nothing to share: made once here so a bad name fails now, as it would later */
        kvp_policy *p;
        if ((rc = kvp_policy_create(&p, name, policy_file, cfg, 0, err, errlen)) == 0)
            kvp_policy_destroy(p);
    }
    if (rc < 0) {
        free(w);
        return rc;
    }
    snprintf(w->name, sizeof w->name, "%s", name);
    *out = w;
    return 0;
}

void kvp_policy_weights_free(kvp_policy_weights *w)
{
    if (!w)
        return;
    if (w->has_set)
        kvp_agent_set_free(&w->set);
    free(w);
}

int kvp_policy_create_shared(kvp_policy **out, const kvp_policy_weights *w,
                             const kvp_model_config *cfg, uint64_t seed, char *err,
                             size_t errlen)
{
    *out = NULL;
    if (!w->has_set)
        return kvp_policy_create(out, w->name, NULL, cfg, seed, err, errlen);
    kvp_policy *p = policy_alloc(w->name, cfg, seed, err, errlen);
    if (!p)
        return -ENOMEM;
    int rc = kvp_agent_policy_create_shared(p, &w->set, err, errlen);
    if (rc < 0) {
        free(p);
        return rc;
    }
    *out = p;
    return 0;
}

static void hook_score(void *ctx, int layer, int kvh, kvp_head *h, int first, int n)
{
    kvp_policy *p = ctx;
    /* new rows are private; a head with shared rows is shown as its private rows alone,
     * so the policy's indices reach its own arrays (on_insert reads only the new rows) */
    if (h->n_shared) {
        kvp_head own = kvp_head_private(h);
        p->ops->on_insert(p, layer, kvh, &own, first - h->n_shared, n);
        return;
    }
    p->ops->on_insert(p, layer, kvh, h, first, n);
}

static void hook_attention(void *ctx, int layer, int kvh, kvp_head *h, const float *q,
                           int q_stride, const float *att, int att_stride, int n_q)
{
    kvp_policy *p = ctx;
    p->ops->on_attention(p, layer, kvh, h, q, q_stride, att, att_stride, n_q);
}

void kvp_policy_attach(kvp_forward_hooks *hooks, kvp_policy *p)
{
    hooks->ctx = p;
    hooks->score = p && p->ops->on_insert ? hook_score : NULL;
    hooks->attention = p && p->ops->wants_attention ? hook_attention : NULL;
}

void kvp_policy_destroy(kvp_policy *p)
{
    if (!p)
        return;
    if (p->ops && p->ops->destroy)
        p->ops->destroy(p);
    free(p);
}

void kvp_policy_truncate(kvp_policy *p, kvp_cache *c, int64_t from)
{
    if (p && p->ops->truncate)
        p->ops->truncate(p, c, from);
}

int kvp_policy_fork(kvp_policy *dst, const kvp_policy *src, kvp_cache *cache, int64_t from)
{
    if (!dst || !src || dst == src || dst->ops != src->ops ||
        dst->cfg.n_layers != src->cfg.n_layers || dst->cfg.n_heads != src->cfg.n_heads ||
        dst->cfg.n_kv_heads != src->cfg.n_kv_heads || dst->cfg.head_dim != src->cfg.head_dim)
        return -EINVAL;
    if (src->ops->copy) {
        int rc = src->ops->copy(dst, src);
        if (rc)
            return rc;
    }
    dst->rng = src->rng;
    dst->n_sink = src->n_sink;
    dst->n_recent = src->n_recent;
    kvp_policy_truncate(dst, cache, from);
    return 0;
}

void kvp_policy_mark(kvp_policy *p, const kvp_cache *c)
{
    if (p && p->ops->mark)
        p->ops->mark(p, c);
}

int kvp_policy_shares_rows(const kvp_policy *p)
{
    return !p || !(p->ops->wants_attention || p->ops->truncate || p->ops->mark);
}

int kvp_policy_is_none(const kvp_policy *p)
{
    return !p || strcmp(p->ops->name, "none") == 0;
}

typedef struct ranked {
    float score;
    int row;
} ranked;

/* best first: higher score, then older row */
static int by_score(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

static int by_row(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    return (x->row > y->row) - (x->row < y->row);
}

/* The rows of h rank-and-keep protects at `budget`: sinks [0, *ns) and the recent window
 * [n - *nr, n), disjoint. */
static void protected_rows(const kvp_policy *p, const kvp_head *h, int layer, int budget,
                           int *ns, int *nr)
{
    int n = h->n;
    int recent = p->ops->recent_window ? p->ops->recent_window(p, layer, budget) : p->n_recent;
    *ns = p->n_sink < 0 ? 0 : p->n_sink < n ? p->n_sink : n;
    *nr = recent < 0 ? 0 : recent < n - *ns ? recent : n - *ns;
}

int kvp_policy_evict_head(kvp_policy *p, kvp_cache *c, int layer, int kvh, int budget)
{
    kvp_head *h = kvp_cache_head(c, layer, kvh);
    if (kvp_policy_is_none(p) || budget <= 0 || h->n <= budget)
        return 0;
    /* rescoring and ranking read and write every row */
    if (kvp_head_unshare(c, h))
        return -ENOMEM;
    if (p->ops->before_evict)
        p->ops->before_evict(p, layer, kvh, h);
    int n = h->n, ns, nr;
    protected_rows(p, h, layer, budget, &ns, &nr);
    int *keep = malloc((size_t)budget * sizeof *keep);
    if (!keep)
        return -ENOMEM;
    int k = 0;
    if (budget <= ns + nr) {
        /* closest to the budget: sinks first, then the newest */
        int ks = ns < budget ? ns : budget;
        for (int i = 0; i < ks; i++)
            keep[k++] = i;
        for (int i = n - (budget - ks); i < n; i++)
            keep[k++] = i;
    } else {
        /* here n > budget > ns + nr, so the middle [ns, n - nr) has more rows than slots */
        int n_mid = n - ns - nr, slots = budget - ns - nr;
        ranked *mid = malloc((size_t)n_mid * sizeof *mid);
        if (!mid) {
            free(keep);
            return -ENOMEM;
        }
        for (int i = 0; i < n_mid; i++) {
            float s = h->score[ns + i];
            mid[i] = (ranked){ isnan(s) ? -INFINITY : s, ns + i };
        }
        qsort(mid, (size_t)n_mid, sizeof *mid, by_score);
        qsort(mid, (size_t)slots, sizeof *mid, by_row);
        for (int i = 0; i < ns; i++)
            keep[k++] = i;
        for (int i = 0; i < slots; i++)
            keep[k++] = mid[i].row;
        for (int i = n - nr; i < n; i++)
            keep[k++] = i;
        free(mid);
    }
    kvp_cache_keep(c, h, keep, budget);
    free(keep);
    return n - budget;
}

int kvp_policy_evict(kvp_policy *p, kvp_cache *c, int budget)
{
    int dropped = 0;
    /* a sliding-window layer is bounded by its window, not by the budget */
    for (int l = 0; l < c->n_layers; l++)
        for (int kvh = 0; kvh < c->n_kv_heads && !kvp_cache_window(c, l); kvh++) {
            int rc = kvp_policy_evict_head(p, c, l, kvh, budget);
            if (rc < 0)
                return rc;
            dropped += rc;
        }
    return dropped;
}

/* ---- global budgets ---------------------------------------------------------------- */

int kvp_budget_mode_parse(const char *name)
{
    return !name ? -1 : !strcmp(name, "per_head") ? KVP_BUDGET_PER_HEAD
                      : !strcmp(name, "global") ? KVP_BUDGET_GLOBAL : -1;
}

const char *kvp_budget_mode_name(int mode)
{
    return mode == KVP_BUDGET_GLOBAL ? "global" : "per_head";
}

int kvp_policy_head_cap(int budget)
{
    return KVP_GLOBAL_CAP_FACTOR * budget;
}

int kvp_policy_head_floor(const kvp_policy *p, int layer, int budget)
{
    int recent = p->ops->recent_window ? p->ops->recent_window(p, layer, budget) : p->n_recent;
    int protect = (p->n_sink > 0 ? p->n_sink : 0) + (recent > 0 ? recent : 0);
    if (budget <= protect)
        return protect;
    int share = (budget - protect) / KVP_GLOBAL_FLOOR_DIV;
    return protect + (share > 1 ? share : 1);
}

/* A row of the session-wide ranking: its calibrated and raw scores, its head and row. */
typedef struct global_ranked {
    float score, raw;
    int head, row;
} global_ranked;

/* Calibrated score first; equal ones (a calibration is flat above its last knot and
 * where it pooled violators) by raw score, so a head's rows still enter in its own
 * order: without this its best rows tied and went oldest first. */
static int by_global_score(const void *a, const void *b)
{
    const global_ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->raw != y->raw)
        return x->raw > y->raw ? -1 : 1;
    if (x->head != y->head)
        return (x->head > y->head) - (x->head < y->head);
    return (x->row > y->row) - (x->row < y->row);
}

/* Calibration: scores comparable across heads. A policy may map each head's scores
 * (ops->calibrate: KVP's per-head monotone map to expected future attention, fitted on
 * traces by `kvp calibrate`); otherwise its raw scores are ranked across heads. NaN
 * scores (unscored) rank last. */
static void calibrate(const kvp_policy *p, int layer, int kvh, const kvp_head *h, float *out)
{
    if (!h->n)   /* an empty head may have no score array yet */
        return;
    if (p->ops->calibrate)
        p->ops->calibrate(p, layer, kvh, h->score, h->n, out);
    else
        memcpy(out, h->score, (size_t)h->n * sizeof *out);
    for (int i = 0; i < h->n; i++)
        if (isnan(out[i]))
            out[i] = -INFINITY;
}

int kvp_policy_evict_global(kvp_policy *p, kvp_cache *c, int budget)
{
    int H = c->n_layers * c->n_kv_heads;
    if (kvp_policy_is_none(p) || budget <= 0)
        return 0;
    int floor = 0, cap = kvp_policy_head_cap(budget);
    for (int l = 0; l < c->n_layers; l++) {
        int f = kvp_policy_head_floor(p, l, budget);
        floor = f > floor ? f : floor;
    }
    if (budget < floor)   /* no room to share: every head keeps its budget */
        return kvp_policy_evict(p, c, budget);
    /* the heads of sliding-window layers are bounded by their windows: they neither
     * share the budget nor lose rows to it */
    long total = (long)budget * kvp_cache_budget_heads(c), rows = 0;
    int over_cap = 0, most = 0;
    for (int i = 0; i < H; i++) {
        if (kvp_cache_window(c, i / c->n_kv_heads))
            continue;
        rows += c->heads[i].n;
        over_cap |= c->heads[i].n > cap;
        most = c->heads[i].n > most ? c->heads[i].n : most;
    }
    if (rows <= total && !over_cap)
        return 0;
    for (int i = 0; i < H; i++)   /* rescoring and ranking read and write every row */
        if (!kvp_cache_window(c, i / c->n_kv_heads) && kvp_head_unshare(c, &c->heads[i]))
            return -ENOMEM;
    int *kept = calloc((size_t)H, sizeof *kept);        /* rows each head keeps so far */
    char *keep = calloc((size_t)H * most + 1, 1);         /* [H][most]: row is kept */
    float *cal = malloc(((size_t)most + 1) * sizeof *cal);
    global_ranked *pool = malloc(((size_t)rows + 1) * sizeof *pool);
    int *idx = malloc(((size_t)most + 1) * sizeof *idx);
    ranked *mid = malloc(((size_t)most + 1) * sizeof *mid);
    int rc = kept && keep && cal && pool && idx && mid ? 0 : -ENOMEM;
    long n_pool = 0, used = 0;
    for (int hi = 0; hi < H && !rc; hi++) {
        kvp_head *h = &c->heads[hi];
        char *kh = keep + (size_t)hi * most;
        if (kvp_cache_window(c, hi / c->n_kv_heads))
            continue;
        if (p->ops->before_evict && h->n)
            p->ops->before_evict(p, hi / c->n_kv_heads, hi % c->n_kv_heads, h);
        int ns, nr;
        int layer = hi / c->n_kv_heads, floor_l = kvp_policy_head_floor(p, layer, budget);
        protected_rows(p, h, layer, budget, &ns, &nr);
        if (ns + nr > budget)   /* a policy's own window: never past the budget (exact total) */
            nr = budget - ns;
        /* the sinks and the recent window, then the head's best rows up to its floor */
        for (int i = 0; i < ns; i++)
            kh[i] = 1;
        for (int i = h->n - nr; i < h->n; i++)
            kh[i] = 1;
        int n_mid = h->n - ns - nr, want = (floor_l < h->n ? floor_l : h->n) - ns - nr;
        for (int i = 0; i < n_mid; i++) {
            float s = h->score[ns + i];
            mid[i] = (ranked){isnan(s) ? -INFINITY : s, ns + i};
        }
        qsort(mid, (size_t)n_mid, sizeof *mid, by_score);
        for (int i = 0; i < want; i++)
            kh[mid[i].row] = 1;
        kept[hi] = ns + nr + (want > 0 ? want : 0);
        used += kept[hi];
        /* the rest compete across heads */
        calibrate(p, hi / c->n_kv_heads, hi % c->n_kv_heads, h, cal);
        for (int i = 0; i < h->n; i++)
            if (!kh[i])
                pool[n_pool++] = (global_ranked){cal[i], isnan(h->score[i]) ? -INFINITY : h->score[i], hi, i};
    }
    if (!rc) {
        qsort(pool, (size_t)n_pool, sizeof *pool, by_global_score);
        for (long j = 0; j < n_pool && used < total; j++) {
            global_ranked *g = &pool[j];
            if (kept[g->head] >= cap)
                continue;
            keep[(size_t)g->head * most + g->row] = 1;
            kept[g->head]++;
            used++;
        }
        for (int hi = 0; hi < H; hi++) {
            kvp_head *h = &c->heads[hi];
            if (kvp_cache_window(c, hi / c->n_kv_heads) || kept[hi] == h->n)
                continue;
            int k = 0;
            for (int i = 0; i < h->n; i++)
                if (keep[(size_t)hi * most + i])
                    idx[k++] = i;
            kvp_cache_keep(c, h, idx, k);
        }
    }
    free(kept);
    free(keep);
    free(cal);
    free(pool);
    free(idx);
    free(mid);
    return rc ? rc : (int)(rows - used);
}
