/* Baseline eviction policies (the KVP method, "Baseline scoring rules"). Each only sets
 * scores; kvp_policy_evict_head (policy.c) does the protecting, ranking and compaction. */
#include "policy/policy.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/rope.h"
#include "model/sampler.h"

#define LAGKV_PARTITION 128
#define SNAPKV_WINDOW 32
#define SNAPKV_POOL 5

/* Policies without per-session state only install their ops. */
#define KVP_STATELESS_CTOR(fn, ops_)                                                \
    int fn(kvp_policy *p, const char *policy_file, char *err, size_t errlen)        \
    {                                                                               \
        (void)policy_file;                                                          \
        (void)err;                                                                  \
        (void)errlen;                                                               \
        p->ops = &ops_;                                                             \
        return 0;                                                                   \
    }

static void free_impl(kvp_policy *p)
{
    free(p->impl);
    p->impl = NULL;
}

static int need_shape(const kvp_policy *p, const char *name, char *err, size_t errlen)
{
    const kvp_model_config *c = &p->cfg;
    if (c->head_dim > 0 && c->n_layers > 0 && c->n_kv_heads > 0 && c->n_heads > 0 &&
        c->n_heads % c->n_kv_heads == 0)
        return 0;
    snprintf(err, errlen, "policy %s needs the model shape (layers, heads, KV heads, head_dim)",
             name);
    return -EINVAL;
}

static int no_memory(const char *name, char *err, size_t errlen)
{
    snprintf(err, errlen, "policy %s: out of memory", name);
    return -ENOMEM;
}

static float head_norm(const float *x, int d)
{
    float s = 0.0f;
    for (int c = 0; c < d; c++)
        s += x[c] * x[c];
    return sqrtf(s);
}

/* ---- none: no scoring ----------------------------------------------------------------- */

static const kvp_policy_ops none_ops = { .name = "none" };
KVP_STATELESS_CTOR(kvp_none_policy_create, none_ops)

/* ---- random ------------------------------------------------------------------------- */

static void random_insert(kvp_policy *p, int layer, int kvh, kvp_head *h, int first, int n)
{
    (void)layer;
    (void)kvh;
    for (int i = first; i < first + n; i++)
        h->score[i] = kvp_rand_f32(&p->rng);
}

static const kvp_policy_ops random_ops = { .name = "random", .on_insert = random_insert };
KVP_STATELESS_CTOR(kvp_random_policy_create, random_ops)

/* ---- streaming (StreamingLLM) -------------------------------------------------------- */

static void streaming_insert(kvp_policy *p, int layer, int kvh, kvp_head *h, int first, int n)
{
    (void)p;
    (void)layer;
    (void)kvh;
    for (int i = first; i < first + n; i++)
        h->score[i] = (float)h->seq[i];
}

/* Ranking by seq is "keep the newest": protecting the whole budget as recent gives the
 * same rows and stays exact past float's 2^24 integers. */
static int streaming_window(const kvp_policy *p, int layer, int budget)
{
    (void)layer;
    (void)p;
    return budget;
}

static const kvp_policy_ops streaming_ops = {
    .name = "streaming", .on_insert = streaming_insert, .recent_window = streaming_window,
};
KVP_STATELESS_CTOR(kvp_streaming_policy_create, streaming_ops)

/* ---- knorm ------------------------------------------------------------------------- */

static void knorm_insert(kvp_policy *p, int layer, int kvh, kvp_head *h, int first, int n)
{
    (void)layer;
    (void)kvh;
    int d = p->cfg.head_dim;
    float tmp[KVP_MAX_HEAD_DIM];
    for (int i = first; i < first + n; i++)
        h->score[i] = -head_norm(kvp_head_keys(h, d, i, 1, tmp), d);
}

static const kvp_policy_ops knorm_ops = { .name = "knorm", .on_insert = knorm_insert };

int kvp_knorm_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen)
{
    (void)policy_file;
    if (p->cfg.head_dim <= 0)
        return need_shape(p, "knorm", err, errlen);
    p->ops = &knorm_ops;
    return 0;
}

/* ---- keydiff ----------------------------------------------------------------------- */

/* impl: float[2][head_dim], the mean unit key and one key decoded */
static void keydiff_evict(kvp_policy *p, int layer, int kvh, kvp_head *h)
{
    (void)layer;
    (void)kvh;
    int d = p->cfg.head_dim;
    float *a = p->impl;
    memset(a, 0, (size_t)d * sizeof *a);
    for (int i = 0; i < h->n; i++) {
        const float *k = kvp_head_keys(h, d, i, 1, a + d);
        float nk = head_norm(k, d);
        if (nk > 0.0f)
            for (int c = 0; c < d; c++)
                a[c] += k[c] / nk;
    }
    float na = head_norm(a, d);  /* the 1/n of the mean cancels in the cosine */
    for (int i = 0; i < h->n; i++) {
        const float *k = kvp_head_keys(h, d, i, 1, a + d);
        float nk = head_norm(k, d), dot = 0.0f;
        for (int c = 0; c < d; c++)
            dot += k[c] * a[c];
        h->score[i] = nk > 0.0f && na > 0.0f ? -dot / (nk * na) : 0.0f;
    }
}

static const kvp_policy_ops keydiff_ops = {
    .name = "keydiff", .before_evict = keydiff_evict, .destroy = free_impl,
};

int kvp_keydiff_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen)
{
    (void)policy_file;
    if (p->cfg.head_dim <= 0)
        return need_shape(p, "keydiff", err, errlen);
    if (!(p->impl = malloc(2 * (size_t)p->cfg.head_dim * sizeof(float))))
        return no_memory("keydiff", err, errlen);
    p->ops = &keydiff_ops;
    return 0;
}

/* ---- lagkv ------------------------------------------------------------------------- */

typedef struct lagkv_state {
    /* rows of the newest partition of the head before_evict just scored: recent_window
     * protects them (rank-and-keep calls the two back to back on one head) */
    int last_part;
    float *mn, *mx;   /* [head_dim] per-channel range of the next partition */
    float *z;         /* [LAGKV_PARTITION] per-token std, then its softmax */
    float *rows;      /* [2 * LAGKV_PARTITION][head_dim]: two partitions decoded (f16 / q8_0) */
} lagkv_state;

/* z[r] = softmax over the partition's rows of the std over channels of x[r] normalised
 * by the per-channel min/max of the next partition's rows. */
static void lagkv_part(lagkv_state *st, const float *x, const float *next, int n_next, int d)
{
    for (int c = 0; c < d; c++)
        st->mn[c] = st->mx[c] = next[c];
    for (int r = 1; r < n_next; r++)
        for (int c = 0; c < d; c++) {
            float y = next[(size_t)r * d + c];
            st->mn[c] = fminf(st->mn[c], y);
            st->mx[c] = fmaxf(st->mx[c], y);
        }
    float zmax = -INFINITY;
    for (int r = 0; r < LAGKV_PARTITION; r++) {
        const float *xr = x + (size_t)r * d;
        float mean = 0.0f, ss = 0.0f;
        for (int c = 0; c < d; c++) {
            float range = st->mx[c] - st->mn[c];
            /* a constant reference channel carries no scale: leave it unscaled */
            mean += (xr[c] - st->mn[c]) / (range > 0.0f ? range : 1.0f);
        }
        mean /= (float)d;
        for (int c = 0; c < d; c++) {
            float range = st->mx[c] - st->mn[c];
            float y = (xr[c] - st->mn[c]) / (range > 0.0f ? range : 1.0f) - mean;
            ss += y * y;
        }
        /* unbiased std, as LagKV's torch.std */
        st->z[r] = d > 1 ? sqrtf(ss / (float)(d - 1)) : 0.0f;
        zmax = fmaxf(zmax, st->z[r]);
    }
    float sum = 0.0f;
    for (int r = 0; r < LAGKV_PARTITION; r++)
        sum += st->z[r] = expf(st->z[r] - zmax);
    for (int r = 0; r < LAGKV_PARTITION; r++)
        st->z[r] /= sum;
}

static void lagkv_evict(kvp_policy *p, int layer, int kvh, kvp_head *h)
{
    (void)layer;
    (void)kvh;
    lagkv_state *st = p->impl;
    int d = p->cfg.head_dim, ns = p->n_sink > 0 ? p->n_sink : 0;
    int rest = h->n - ns;
    st->last_part = rest > 0 ? (rest - 1) % LAGKV_PARTITION + 1 : 0;
    /* every partition but the last has a full one after it as its reference */
    for (int start = ns; start + LAGKV_PARTITION < h->n; start += LAGKV_PARTITION) {
        int next = start + LAGKV_PARTITION;
        int n_next = h->n - next < LAGKV_PARTITION ? h->n - next : LAGKV_PARTITION;
        const float *k = kvp_head_keys(h, d, start, LAGKV_PARTITION + n_next, st->rows);
        lagkv_part(st, k, k + (size_t)LAGKV_PARTITION * d, n_next, d);
        for (int r = 0; r < LAGKV_PARTITION; r++)
            h->score[start + r] = 0.5f * st->z[r];
        const float *v = kvp_head_values(h, d, start, LAGKV_PARTITION + n_next, st->rows);
        lagkv_part(st, v, v + (size_t)LAGKV_PARTITION * d, n_next, d);
        for (int r = 0; r < LAGKV_PARTITION; r++)
            h->score[start + r] += 0.5f * st->z[r];
    }
}

static int lagkv_window(const kvp_policy *p, int layer, int budget)
{
    (void)layer;
    (void)budget;
    const lagkv_state *st = p->impl;
    return st->last_part > p->n_recent ? st->last_part : p->n_recent;
}

static void lagkv_destroy(kvp_policy *p)
{
    lagkv_state *st = p->impl;
    free(st->mn);
    free(st->mx);
    free(st->z);
    free(st->rows);
    free_impl(p);
}

static const kvp_policy_ops lagkv_ops = {
    .name = "lagkv", .before_evict = lagkv_evict, .recent_window = lagkv_window,
    .destroy = lagkv_destroy,
};

int kvp_lagkv_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen)
{
    (void)policy_file;
    if (p->cfg.head_dim <= 0)
        return need_shape(p, "lagkv", err, errlen);
    lagkv_state *st = calloc(1, sizeof *st);
    if (!st)
        return no_memory("lagkv", err, errlen);
    p->impl = st;
    st->mn = malloc((size_t)p->cfg.head_dim * sizeof *st->mn);
    st->mx = malloc((size_t)p->cfg.head_dim * sizeof *st->mx);
    st->z = malloc(LAGKV_PARTITION * sizeof *st->z);
    st->rows = malloc(2 * LAGKV_PARTITION * (size_t)p->cfg.head_dim * sizeof *st->rows);
    if (!st->mn || !st->mx || !st->z || !st->rows) {
        lagkv_destroy(p);
        return no_memory("lagkv", err, errlen);
    }
    p->ops = &lagkv_ops;
    return 0;
}

/* ---- h2o --------------------------------------------------------------------------- */

static void h2o_insert(kvp_policy *p, int layer, int kvh, kvp_head *h, int first, int n)
{
    (void)p;
    (void)layer;
    (void)kvh;
    for (int i = first; i < first + n; i++)
        h->score[i] = h->stat[i] = 0.0f;
}

static void h2o_attention(kvp_policy *p, int layer, int kvh, kvp_head *h, const float *q,
                          int q_stride, const float *att, int att_stride, int n_q)
{
    (void)layer;
    (void)kvh;
    (void)q;
    (void)q_stride;
    int group = p->cfg.n_heads / p->cfg.n_kv_heads;
    float inv = 1.0f / (float)group;
    for (int g = 0; g < group; g++)
        for (int t = 0; t < n_q; t++) {
            const float *a = att + (size_t)(g * n_q + t) * att_stride;
            for (int i = 0; i < h->n; i++)
                h->stat[i] += a[i] * inv;
        }
    memcpy(h->score, h->stat, (size_t)h->n * sizeof *h->score);
}

/* heavy hitters fill one half of the budget, the recent window the other */
static int h2o_window(const kvp_policy *p, int layer, int budget)
{
    (void)layer;
    (void)p;
    return budget / 2;
}

/* Rolling the accumulators back (truncate). A row's accumulator is the attention the
 * queries of tokens seq_i .. seen-1 paid it. At a mark (a reply's start) every head's
 * (seq, stat) pairs are copied. A cut starts from the mark's sums for the rows it holds
 * (from the current sums for rows that came after it, or when there is no mark) and
 * scales each row's sum by the share of its queries the cut leaves, (from - seq_i) /
 * (then - seq_i): the attention of the queries removed (or, past the mark, kept) is
 * estimated at the row's mean per query. A cut exactly at the mark restores its sums.
 * The copy costs 12 bytes per cache row. */
typedef struct h2o_state {
    int64_t seen;        /* tokens whose queries are in the sums (the newest row's seq + 1) */
    int64_t ck_seen;     /* the mark's n_seen; -1: no mark */
    int *ck_first;       /* [heads + 1] where each head's pairs begin in ck_seq / ck_stat */
    int64_t *ck_seq;
    float *ck_stat;
    size_t ck_cap;
} h2o_state;

static void h2o_attention_st(kvp_policy *p, int layer, int kvh, kvp_head *h, const float *q,
                             int q_stride, const float *att, int att_stride, int n_q)
{
    h2o_attention(p, layer, kvh, h, q, q_stride, att, att_stride, n_q);
    h2o_state *st = p->impl;
    if (h->n > 0 && h->seq[h->n - 1] + 1 > st->seen)
        st->seen = h->seq[h->n - 1] + 1;
}

static void h2o_mark(kvp_policy *p, const kvp_cache *c)
{
    h2o_state *st = p->impl;
    size_t rows = kvp_cache_rows(c);
    if (rows > st->ck_cap) {
        int64_t *sq = realloc(st->ck_seq, rows * sizeof *sq);
        if (sq)
            st->ck_seq = sq;
        float *sv = sq ? realloc(st->ck_stat, rows * sizeof *sv) : NULL;
        if (!sv) {   /* no mark: a later cut scales the current sums */
            st->ck_seen = -1;
            return;
        }
        st->ck_stat = sv;
        st->ck_cap = rows;
    }
    int heads = c->n_layers * c->n_kv_heads, k = 0;
    for (int i = 0; i < heads; i++) {
        const kvp_head *h = &c->heads[i];
        st->ck_first[i] = k;
        memcpy(st->ck_seq + k, h->seq, (size_t)h->n * sizeof *h->seq);
        memcpy(st->ck_stat + k, h->stat, (size_t)h->n * sizeof *h->stat);
        k += h->n;
    }
    st->ck_first[heads] = k;
    st->ck_seen = c->n_seen;
}

static void h2o_truncate(kvp_policy *p, kvp_cache *c, int64_t from)
{
    h2o_state *st = p->impl;
    int use_ck = st->ck_seen >= 0 && st->ck_seen <= st->seen;
    int heads = c->n_layers * c->n_kv_heads;
    for (int i = 0; i < heads; i++) {
        kvp_head *h = &c->heads[i];
        int j = use_ck ? st->ck_first[i] : 0, end = use_ck ? st->ck_first[i + 1] : 0;
        for (int r = 0; r < h->n; r++) {
            int64_t sq = h->seq[r], base = st->seen;
            float v = h->stat[r];
            if (use_ck) {   /* both in seq order: merge */
                while (j < end && st->ck_seq[j] < sq)
                    j++;
                if (j < end && st->ck_seq[j] == sq) {
                    v = st->ck_stat[j];
                    base = st->ck_seen;
                }
            }
            if (base > sq && from != base)
                v *= (float)(from - sq) / (float)(base - sq);
            h->stat[r] = v;
            h->score[r] = v;
        }
    }
    st->seen = from;
    if (st->ck_seen > from)
        st->ck_seen = -1;
}

static void h2o_destroy(kvp_policy *p)
{
    h2o_state *st = p->impl;
    if (st) {
        free(st->ck_first);
        free(st->ck_seq);
        free(st->ck_stat);
    }
    free_impl(p);
}

static int h2o_copy(kvp_policy *dst, const kvp_policy *src)
{
    h2o_state *d = dst->impl;
    const h2o_state *s = src->impl;
    int heads = src->cfg.n_layers * src->cfg.n_kv_heads;
    size_t rows = s->ck_seen >= 0 ? (size_t)s->ck_first[heads] : 0;
    if (rows > d->ck_cap) {
        int64_t *sq = malloc(rows * sizeof *sq);
        float *sv = malloc(rows * sizeof *sv);
        if (!sq || !sv) {
            free(sq);
            free(sv);
            return -ENOMEM;
        }
        free(d->ck_seq);
        free(d->ck_stat);
        d->ck_seq = sq;
        d->ck_stat = sv;
        d->ck_cap = rows;
    }
    d->seen = s->seen;
    d->ck_seen = s->ck_seen;
    memcpy(d->ck_first, s->ck_first, ((size_t)heads + 1) * sizeof *d->ck_first);
    if (rows) {
        memcpy(d->ck_seq, s->ck_seq, rows * sizeof *d->ck_seq);
        memcpy(d->ck_stat, s->ck_stat, rows * sizeof *d->ck_stat);
    }
    return 0;
}

static const kvp_policy_ops h2o_ops = {
    .name = "h2o", .wants_attention = 1, .on_insert = h2o_insert,
    .on_attention = h2o_attention_st, .recent_window = h2o_window, .truncate = h2o_truncate,
    .mark = h2o_mark, .destroy = h2o_destroy, .copy = h2o_copy,
};

int kvp_h2o_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen)
{
    (void)policy_file;
    if (need_shape(p, "h2o", err, errlen))
        return -EINVAL;
    h2o_state *st = calloc(1, sizeof *st);
    if (!st)
        return no_memory("h2o", err, errlen);
    p->impl = st;
    st->ck_seen = -1;
    st->ck_first = calloc((size_t)p->cfg.n_layers * p->cfg.n_kv_heads + 1, sizeof *st->ck_first);
    if (!st->ck_first) {
        h2o_destroy(p);
        return no_memory("h2o", err, errlen);
    }
    p->ops = &h2o_ops;
    return 0;
}

/* ---- tova -------------------------------------------------------------------------- */

static void tova_attention(kvp_policy *p, int layer, int kvh, kvp_head *h, const float *q,
                           int q_stride, const float *att, int att_stride, int n_q)
{
    (void)layer;
    (void)kvh;
    (void)q;
    (void)q_stride;
    int group = p->cfg.n_heads / p->cfg.n_kv_heads;
    memset(h->score, 0, (size_t)h->n * sizeof *h->score);
    for (int g = 0; g < group; g++) {
        const float *a = att + (size_t)(g * n_q + n_q - 1) * att_stride;
        for (int i = 0; i < h->n; i++)
            h->score[i] += a[i];
    }
    for (int i = 0; i < h->n; i++)
        h->score[i] /= (float)group;
}

static const kvp_policy_ops tova_ops = {
    .name = "tova", .wants_attention = 1, .on_attention = tova_attention,
};

int kvp_tova_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen)
{
    (void)policy_file;
    if (need_shape(p, "tova", err, errlen))
        return -EINVAL;
    p->ops = &tova_ops;
    return 0;
}

/* ---- snapkv ------------------------------------------------------------------------ */

/* A ring of the last SNAPKV_WINDOW queries of each (layer, KV head), group heads each. */
typedef struct snapkv_state {
    int group, d;
    float *q;        /* [heads][SNAPKV_WINDOW][group * d] */
    int64_t *seq;    /* [heads][SNAPKV_WINDOW] the query's own token */
    int32_t *pos;    /* [heads][SNAPKV_WINDOW] the position the query is rotated at */
    int *next;       /* [heads] ring slot to write */
    int *count;      /* [heads] queries held (<= SNAPKV_WINDOW) */
    float *row;      /* [d]: one key decoded (f16 / q8_0 rows) */
} snapkv_state;

static void snapkv_attention(kvp_policy *p, int layer, int kvh, kvp_head *h, const float *q,
                             int q_stride, const float *att, int att_stride, int n_q)
{
    (void)att;
    (void)att_stride;
    snapkv_state *st = p->impl;
    int head = layer * p->cfg.n_kv_heads + kvh;
    size_t qlen = (size_t)st->group * st->d;
    /* the block's own rows are h's newest n_q rows, query t is row h->n - n_q + t */
    for (int t = n_q > SNAPKV_WINDOW ? n_q - SNAPKV_WINDOW : 0; t < n_q; t++) {
        int slot = head * SNAPKV_WINDOW + st->next[head];
        memcpy(st->q + (size_t)slot * qlen, q + (size_t)t * q_stride, qlen * sizeof(float));
        st->seq[slot] = h->seq[h->n - n_q + t];
        st->pos[slot] = h->pos[h->n - n_q + t];
        st->next[head] = (st->next[head] + 1) % SNAPKV_WINDOW;
        if (st->count[head] < SNAPKV_WINDOW)
            st->count[head]++;
    }
}

static void snapkv_evict(kvp_policy *p, int layer, int kvh, kvp_head *h)
{
    snapkv_state *st = p->impl;
    int head = layer * p->cfg.n_kv_heads + kvh, d = st->d, n = h->n;
    float scale = 1.0f / sqrtf((float)d);
    memset(h->score, 0, (size_t)n * sizeof *h->score);
    if (!st->count[head])
        return;
    float w = 1.0f / (float)(st->count[head] * st->group);
    for (int j = 0; j < st->count[head]; j++) {
        int slot = head * SNAPKV_WINDOW + j;
        /* causal: the query sees the rows up to its own token (a prefix of h) */
        int seen = 0;
        while (seen < n && h->seq[seen] <= st->seq[slot])
            seen++;
        /* a context shift re-rotated the keys: follow the query's own (protected) row */
        if (seen && h->seq[seen - 1] == st->seq[slot] && h->pos[seen - 1] != st->pos[slot]) {
            for (int g = 0; g < st->group; g++)
                kvp_rope_rotate(&p->cfg.rope, st->q + ((size_t)slot * st->group + g) * d,
                                h->pos[seen - 1] - st->pos[slot]);
            st->pos[slot] = h->pos[seen - 1];
        }
        for (int g = 0; g < st->group; g++) {
            const float *qg = st->q + ((size_t)slot * st->group + g) * d;
            /* online log-sum-exp, then a second pass for the probabilities */
            float mx = -INFINITY, sum = 0.0f;
            for (int i = 0; i < seen; i++) {
                const float *k = kvp_head_keys(h, d, i, 1, st->row);
                float l = 0.0f;
                for (int c = 0; c < d; c++)
                    l += qg[c] * k[c];
                l *= scale;
                if (l > mx) {
                    sum = sum * expf(mx - l) + 1.0f;
                    mx = l;
                } else {
                    sum += expf(l - mx);
                }
            }
            for (int i = 0; i < seen; i++) {
                const float *k = kvp_head_keys(h, d, i, 1, st->row);
                float l = 0.0f;
                for (int c = 0; c < d; c++)
                    l += qg[c] * k[c];
                h->score[i] += w * expf(l * scale - mx) / sum;
            }
        }
    }
    /* width-5 average pool along the rows, zero padding counted (avg_pool1d, padding 2);
     * in place: s[i+1], s[i+2] are still raw, the two raw values behind are carried */
    float back2 = 0.0f, back1 = 0.0f;
    for (int i = 0; i < n; i++) {
        float cur = h->score[i];
        float sum = back2 + back1 + cur;
        for (int o = 1; o <= SNAPKV_POOL / 2 && i + o < n; o++)
            sum += h->score[i + o];
        h->score[i] = sum / (float)SNAPKV_POOL;
        back2 = back1;
        back1 = cur;
    }
}

static int snapkv_window(const kvp_policy *p, int layer, int budget)
{
    (void)layer;
    (void)budget;
    return p->n_recent > SNAPKV_WINDOW ? p->n_recent : SNAPKV_WINDOW;
}

static void snapkv_destroy(kvp_policy *p)
{
    snapkv_state *st = p->impl;
    free(st->q);
    free(st->seq);
    free(st->pos);
    free(st->next);
    free(st->count);
    free(st->row);
    free_impl(p);
}

/* The queries of tokens seq >= from leave every head's window; the others stay in age
 * order (oldest first in slots 0.., the next write after them). */
static void snapkv_truncate(kvp_policy *p, kvp_cache *c, int64_t from)
{
    (void)c;
    snapkv_state *st = p->impl;
    size_t qlen = (size_t)st->group * st->d;
    int heads = p->cfg.n_layers * p->cfg.n_kv_heads;
    for (int hd = 0; hd < heads; hd++) {
        int n = st->count[hd], first = n == SNAPKV_WINDOW ? st->next[hd] : 0, k = 0;
        int order[SNAPKV_WINDOW];
        for (int j = 0; j < n; j++) {
            int slot = (first + j) % SNAPKV_WINDOW;
            if (st->seq[hd * SNAPKV_WINDOW + slot] < from)
                order[k++] = slot;
        }
        if (k == n && first == 0)
            continue;
        /* the kept queries, oldest first, through a copy (slots may move either way) */
        float *q = malloc((size_t)k * qlen * sizeof *q);
        int64_t sq[SNAPKV_WINDOW];
        int32_t ps[SNAPKV_WINDOW];
        if (!q && k)   /* out of memory: the window is emptied rather than left stale */
            k = 0;
        for (int j = 0; j < k; j++) {
            int s = hd * SNAPKV_WINDOW + order[j];
            memcpy(q + (size_t)j * qlen, st->q + (size_t)s * qlen, qlen * sizeof *q);
            sq[j] = st->seq[s];
            ps[j] = st->pos[s];
        }
        for (int j = 0; j < k; j++) {
            int s = hd * SNAPKV_WINDOW + j;
            memcpy(st->q + (size_t)s * qlen, q + (size_t)j * qlen, qlen * sizeof *q);
            st->seq[s] = sq[j];
            st->pos[s] = ps[j];
        }
        free(q);
        st->count[hd] = k;
        st->next[hd] = k % SNAPKV_WINDOW;
    }
}

static int snapkv_copy(kvp_policy *dst, const kvp_policy *src)
{
    snapkv_state *d = dst->impl;
    const snapkv_state *s = src->impl;
    size_t heads = (size_t)src->cfg.n_layers * src->cfg.n_kv_heads;
    memcpy(d->q, s->q, heads * SNAPKV_WINDOW * s->group * s->d * sizeof *d->q);
    memcpy(d->seq, s->seq, heads * SNAPKV_WINDOW * sizeof *d->seq);
    memcpy(d->pos, s->pos, heads * SNAPKV_WINDOW * sizeof *d->pos);
    memcpy(d->next, s->next, heads * sizeof *d->next);
    memcpy(d->count, s->count, heads * sizeof *d->count);
    return 0;
}

static const kvp_policy_ops snapkv_ops = {
    .name = "snapkv", .wants_attention = 1, .on_attention = snapkv_attention,
    .before_evict = snapkv_evict, .recent_window = snapkv_window, .destroy = snapkv_destroy,
    .truncate = snapkv_truncate, .copy = snapkv_copy,
};

int kvp_snapkv_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen)
{
    (void)policy_file;
    if (need_shape(p, "snapkv", err, errlen))
        return -EINVAL;
    snapkv_state *st = calloc(1, sizeof *st);
    if (!st)
        return no_memory("snapkv", err, errlen);
    p->impl = st;
    size_t heads = (size_t)p->cfg.n_layers * p->cfg.n_kv_heads;
    st->group = p->cfg.n_heads / p->cfg.n_kv_heads;
    st->d = p->cfg.head_dim;
    st->q = malloc(heads * SNAPKV_WINDOW * st->group * st->d * sizeof *st->q);
    st->seq = malloc(heads * SNAPKV_WINDOW * sizeof *st->seq);
    st->pos = malloc(heads * SNAPKV_WINDOW * sizeof *st->pos);
    st->next = calloc(heads, sizeof *st->next);
    st->count = calloc(heads, sizeof *st->count);
    st->row = malloc((size_t)st->d * sizeof *st->row);
    if (!st->q || !st->seq || !st->pos || !st->next || !st->count || !st->row) {
        snapkv_destroy(p);
        return no_memory("snapkv", err, errlen);
    }
    p->ops = &snapkv_ops;
    return 0;
}
