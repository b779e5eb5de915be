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

/* ---- the query ring (SnapKV, Expected Attention) --------------------------------------- */

/* The newest `window` queries of each (layer, KV head), the group's query heads each,
 * with the token each belongs to and the position it is rotated at. Slots 0..count-1 of
 * a head hold its queries (when full, the oldest is at `next`); truncate keeps the
 * survivors oldest first from slot 0. */
typedef struct qring {
    int heads, window;
    size_t qlen;     /* floats per query: group * head_dim */
    float *q;        /* [heads][window][qlen] */
    int64_t *seq;    /* [heads][window] the query's own token */
    int32_t *pos;    /* [heads][window] the position the query is rotated at */
    int *next;       /* [heads] slot to write */
    int *count;      /* [heads] queries held (<= window) */
} qring;

static void qring_free(qring *r)
{
    free(r->q);
    free(r->seq);
    free(r->pos);
    free(r->next);
    free(r->count);
    memset(r, 0, sizeof *r);
}

static int qring_init(qring *r, int heads, int window, size_t qlen)
{
    r->heads = heads;
    r->window = window;
    r->qlen = qlen;
    size_t slots = (size_t)heads * window;
    r->q = malloc(slots * qlen * sizeof *r->q);
    r->seq = malloc(slots * sizeof *r->seq);
    r->pos = malloc(slots * sizeof *r->pos);
    r->next = calloc((size_t)heads, sizeof *r->next);
    r->count = calloc((size_t)heads, sizeof *r->count);
    if (r->q && r->seq && r->pos && r->next && r->count)
        return 0;
    qring_free(r);
    return -ENOMEM;
}

/* The query of the slot (head, j). */
static float *qring_q(const qring *r, int head, int j)
{
    return r->q + ((size_t)head * r->window + j) * r->qlen;
}

/* Takes the head's next slot for the query of token seq at position pos (the oldest is
 * overwritten when full); returns where its qlen floats go. */
static float *qring_push(qring *r, int head, int64_t seq, int32_t pos)
{
    int j = r->next[head];
    r->seq[head * r->window + j] = seq;
    r->pos[head * r->window + j] = pos;
    r->next[head] = (j + 1) % r->window;
    if (r->count[head] < r->window)
        r->count[head]++;
    return qring_q(r, head, j);
}

/* The queries of tokens seq >= from leave every head's window; the others stay in age
 * order (oldest first in slots 0.., the next write after them). */
static void qring_truncate(qring *r, int64_t from)
{
    int W = r->window;
    size_t qlen = r->qlen;
    int *order = malloc((size_t)W * sizeof *order);
    int64_t *sq = malloc((size_t)W * sizeof *sq);
    int32_t *ps = malloc((size_t)W * sizeof *ps);
    for (int hd = 0; hd < r->heads; hd++) {
        int n = r->count[hd], first = n == W ? r->next[hd] : 0, k = 0;
        if (!order || !sq || !ps) {   /* out of memory: the window is emptied rather than left stale */
            r->count[hd] = r->next[hd] = 0;
            continue;
        }
        for (int j = 0; j < n; j++) {
            int slot = (first + j) % W;
            if (r->seq[hd * W + slot] < from)
                order[k++] = slot;
        }
        if (k == n && first == 0)
            continue;
        /* the kept queries, oldest first, through a copy (slots may move either way) */
        float *q = k ? malloc((size_t)k * qlen * sizeof *q) : NULL;
        if (!q)
            k = 0;
        for (int j = 0; j < k; j++) {
            memcpy(q + (size_t)j * qlen, qring_q(r, hd, order[j]), qlen * sizeof *q);
            sq[j] = r->seq[hd * W + order[j]];
            ps[j] = r->pos[hd * W + order[j]];
        }
        for (int j = 0; j < k; j++) {
            memcpy(qring_q(r, hd, j), q + (size_t)j * qlen, qlen * sizeof *q);
            r->seq[hd * W + j] = sq[j];
            r->pos[hd * W + j] = ps[j];
        }
        free(q);
        r->count[hd] = k;
        r->next[hd] = k % W;
    }
    free(order);
    free(sq);
    free(ps);
}

/* dst (of src's shape) takes src's queries. */
static void qring_copy(qring *dst, const qring *src)
{
    size_t slots = (size_t)src->heads * src->window;
    memcpy(dst->q, src->q, slots * src->qlen * sizeof *dst->q);
    memcpy(dst->seq, src->seq, slots * sizeof *dst->seq);
    memcpy(dst->pos, src->pos, slots * sizeof *dst->pos);
    memcpy(dst->next, src->next, (size_t)src->heads * sizeof *dst->next);
    memcpy(dst->count, src->count, (size_t)src->heads * sizeof *dst->count);
}

/* ---- snapkv ------------------------------------------------------------------------ */

/* The last SNAPKV_WINDOW queries of each (layer, KV head), as the model rotated them. */
typedef struct snapkv_state {
    int group, d;
    qring ring;
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
        int r = h->n - n_q + t;
        memcpy(qring_push(&st->ring, head, h->seq[r], h->pos[r]), q + (size_t)t * q_stride,
               qlen * sizeof(float));
    }
}

static void snapkv_evict(kvp_policy *p, int layer, int kvh, kvp_head *h)
{
    snapkv_state *st = p->impl;
    qring *ring = &st->ring;
    int head = layer * p->cfg.n_kv_heads + kvh, d = st->d, n = h->n;
    float scale = 1.0f / sqrtf((float)d);
    memset(h->score, 0, (size_t)n * sizeof *h->score);
    if (!ring->count[head])
        return;
    float w = 1.0f / (float)(ring->count[head] * st->group);
    for (int j = 0; j < ring->count[head]; j++) {
        int slot = head * SNAPKV_WINDOW + j;
        float *qs = qring_q(ring, head, j);
        /* causal: the query sees the rows up to its own token (a prefix of h) */
        int seen = 0;
        while (seen < n && h->seq[seen] <= ring->seq[slot])
            seen++;
        /* a context shift re-rotated the keys: follow the query's own (protected) row */
        if (seen && h->seq[seen - 1] == ring->seq[slot] && h->pos[seen - 1] != ring->pos[slot]) {
            for (int g = 0; g < st->group; g++)
                kvp_rope_rotate(&p->cfg.rope, qs + (size_t)g * d,
                                h->pos[seen - 1] - ring->pos[slot]);
            ring->pos[slot] = h->pos[seen - 1];
        }
        for (int g = 0; g < st->group; g++) {
            const float *qg = qs + (size_t)g * d;
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
    qring_free(&st->ring);
    free(st->row);
    free_impl(p);
}

static void snapkv_truncate(kvp_policy *p, kvp_cache *c, int64_t from)
{
    (void)c;
    snapkv_state *st = p->impl;
    qring_truncate(&st->ring, from);
}

static int snapkv_copy(kvp_policy *dst, const kvp_policy *src)
{
    snapkv_state *d = dst->impl;
    const snapkv_state *s = src->impl;
    qring_copy(&d->ring, &s->ring);
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
    st->group = p->cfg.n_heads / p->cfg.n_kv_heads;
    st->d = p->cfg.head_dim;
    st->row = malloc((size_t)st->d * sizeof *st->row);
    if (!st->row || qring_init(&st->ring, p->cfg.n_layers * p->cfg.n_kv_heads, SNAPKV_WINDOW,
                               (size_t)st->group * st->d)) {
        snapkv_destroy(p);
        return no_memory("snapkv", err, errlen);
    }
    p->ops = &snapkv_ops;
    return 0;
}

/* ---- expected_attention (kvpress's ExpectedAttentionPress) -------------------------- */

/* Each query head's queries are modelled as a Gaussian q ~ N(mu, Sigma), estimated from
 * the head's EXPATT_WINDOW newest queries before RoPE. The queries to come sit at the next
 * EXPATT_FUTURE positions p0.. (p0: one past the head's newest row); rotated by the mean
 * of their RoPE rotations, Rbar, a future query is taken as N(Rbar mu, Rbar Sigma Rbar^T).
 * Then E[exp(s q.k)] = exp(s (Rbar mu).k + s^2 k^T Rbar Sigma Rbar^T k / 2) for a cached
 * (rotated) key k, s the model's score scale (1/sqrt(head_dim) unless the model sets its
 * own); normalised over the head's rows but the sinks (a softmax), averaged over the KV
 * group's query heads, times the value's norm. The sinks take the head's best score (they
 * are protected anyway).
 *
 * Sigma is the full covariance of the window (divided by the count, as kvpress), never
 * formed as a d x d matrix: with u_j = Rbar (q_j - mu), k^T Rbar Sigma Rbar^T k is the mean
 * of (u_j . k)^2, exact and costing EXPATT_WINDOW + 1 dot products per row and query head
 * (SnapKV's two passes over its window take as many), so the only state is the ring of
 * queries. The ring holds the
 * queries before RoPE (each un-rotated by its own position when it arrives), so a context
 * shift, which moves positions and re-rotates the keys, leaves it valid: the scores then
 * follow from the keys' new positions and the new p0. Queries of the first n_sink tokens
 * are not recorded (kvpress leaves the sinks' hidden states out of the statistics). */
#define EXPATT_WINDOW 64
#define EXPATT_FUTURE 512

typedef struct expatt_state {
    int group, d;
    qring ring;       /* pre-RoPE queries */
    float *cs;        /* [n_rot] one position's (cos, sin) per pair */
    float *avg;       /* [n_rot] the mean (cos, sin) of positions rot_from.. +EXPATT_FUTURE */
    int64_t rot_from; /* the p0 avg holds; -1: none yet */
    float *mu;        /* [d] one query head's mean, then rotated */
    float *u;         /* [EXPATT_WINDOW][d] its centred queries, rotated */
    float *row;       /* [d] one key or value decoded (f16 / q8_0 rows) */
} expatt_state;

static void expatt_attention(kvp_policy *p, int layer, int kvh, kvp_head *h, const float *q,
                             int q_stride, const float *att, int att_stride, int n_q)
{
    (void)att;
    (void)att_stride;
    expatt_state *st = p->impl;
    int head = layer * p->cfg.n_kv_heads + kvh, d = st->d;
    for (int t = n_q > EXPATT_WINDOW ? n_q - EXPATT_WINDOW : 0; t < n_q; t++) {
        int r = h->n - n_q + t;
        if (h->seq[r] < p->n_sink)
            continue;
        float *dst = qring_push(&st->ring, head, h->seq[r], h->pos[r]);
        memcpy(dst, q + (size_t)t * q_stride, st->ring.qlen * sizeof *dst);
        /* one (cos, sin) table for the group: every query head un-rotates by -pos */
        kvp_rope_table(&p->cfg.rope, st->cs, -(double)h->pos[r]);
        for (int g = 0; g < st->group; g++)
            kvp_rope_apply(&p->cfg.rope, dst + (size_t)g * d, st->cs);
    }
}

/* avg = the mean over positions p0 .. p0 + EXPATT_FUTURE - 1 of each pair's (cos, sin):
 * kvp_rope_apply with it multiplies a vector by the mean rotation Rbar (the pass-through
 * dims of a partial rotary stay as they are, as Rbar's identity block). */
static void expatt_rotation(kvp_policy *p, expatt_state *st, int64_t p0)
{
    if (st->rot_from == p0)
        return;
    int n_rot = p->cfg.rope.n_rot;
    double acc[n_rot > 0 ? n_rot : 1];
    memset(acc, 0, sizeof acc);
    for (int f = 0; f < EXPATT_FUTURE; f++) {
        kvp_rope_table(&p->cfg.rope, st->cs, (double)(p0 + f));
        for (int i = 0; i < n_rot; i++)
            acc[i] += st->cs[i];
    }
    for (int i = 0; i < n_rot; i++)
        st->avg[i] = (float)(acc[i] / EXPATT_FUTURE);
    st->rot_from = p0;
}

static void expatt_evict(kvp_policy *p, int layer, int kvh, kvp_head *h)
{
    expatt_state *st = p->impl;
    const qring *ring = &st->ring;
    int head = layer * p->cfg.n_kv_heads + kvh, d = st->d, n = h->n;
    int m = ring->count[head], ns = p->n_sink < 0 ? 0 : p->n_sink < n ? p->n_sink : n;
    float s = p->cfg.query_scale > 0 ? p->cfg.query_scale : 1.0f / sqrtf((float)d);
    if (!n)
        return;
    memset(h->score, 0, (size_t)n * sizeof *h->score);
    expatt_rotation(p, st, (int64_t)h->pos[n - 1] + 1);
    for (int g = 0; g < st->group && ns < n; g++) {
        memset(st->mu, 0, (size_t)d * sizeof *st->mu);
        for (int j = 0; j < m; j++) {
            const float *qj = qring_q(ring, head, j) + (size_t)g * d;
            for (int c = 0; c < d; c++)
                st->mu[c] += qj[c];
        }
        for (int c = 0; m && c < d; c++)
            st->mu[c] /= (float)m;
        for (int j = 0; j < m; j++) {
            const float *qj = qring_q(ring, head, j) + (size_t)g * d;
            float *uj = st->u + (size_t)j * d;
            for (int c = 0; c < d; c++)
                uj[c] = qj[c] - st->mu[c];
            kvp_rope_apply(&p->cfg.rope, uj, st->avg);
        }
        kvp_rope_apply(&p->cfg.rope, st->mu, st->avg);
        /* this query head's expected logits in h->stat (the policy's scratch row), then
         * its softmax over the rows past the sinks, added into h->score */
        float mx = -INFINITY, var_w = m ? 0.5f * s * s / (float)m : 0.0f;
        for (int i = ns; i < n; i++) {
            const float *k = kvp_head_keys(h, d, i, 1, st->row);
            float dot = 0.0f, var = 0.0f;
            for (int c = 0; c < d; c++)
                dot += st->mu[c] * k[c];
            for (int j = 0; j < m; j++) {
                const float *uj = st->u + (size_t)j * d;
                float x = 0.0f;
                for (int c = 0; c < d; c++)
                    x += uj[c] * k[c];
                var += x * x;
            }
            h->stat[i] = s * dot + var_w * var;
            mx = fmaxf(mx, h->stat[i]);
        }
        float sum = 0.0f;
        for (int i = ns; i < n; i++)
            sum += h->stat[i] = expf(h->stat[i] - mx);
        for (int i = ns; i < n; i++)
            h->score[i] += h->stat[i] / sum / (float)st->group;
    }
    float best = -INFINITY;
    for (int i = ns; i < n; i++) {
        h->score[i] *= head_norm(kvp_head_values(h, d, i, 1, st->row), d);
        best = fmaxf(best, h->score[i]);
    }
    for (int i = 0; i < ns; i++)
        h->score[i] = ns < n ? best : 0.0f;
}

static void expatt_destroy(kvp_policy *p)
{
    expatt_state *st = p->impl;
    qring_free(&st->ring);
    free(st->cs);
    free(st->avg);
    free(st->mu);
    free(st->u);
    free(st->row);
    free_impl(p);
}

static void expatt_truncate(kvp_policy *p, kvp_cache *c, int64_t from)
{
    (void)c;
    expatt_state *st = p->impl;
    qring_truncate(&st->ring, from);
}

static int expatt_copy(kvp_policy *dst, const kvp_policy *src)
{
    expatt_state *d = dst->impl;
    const expatt_state *s = src->impl;
    qring_copy(&d->ring, &s->ring);
    return 0;
}

static const kvp_policy_ops expatt_ops = {
    .name = "expected_attention", .wants_attention = 1, .on_attention = expatt_attention,
    .before_evict = expatt_evict, .destroy = expatt_destroy, .truncate = expatt_truncate,
    .copy = expatt_copy,
};

int kvp_expected_attention_policy_create(kvp_policy *p, const char *policy_file, char *err,
                                         size_t errlen)
{
    (void)policy_file;
    const char *name = "expected_attention";
    if (need_shape(p, name, err, errlen))
        return -EINVAL;
    const kvp_rope *r = &p->cfg.rope;
    if (r->n_rot < 0 || r->n_rot % 2 || r->n_rot > p->cfg.head_dim) {
        snprintf(err, errlen, "policy %s: RoPE rotates %d of the head's %d floats (want an "
                 "even count up to head_dim)", name, r->n_rot, p->cfg.head_dim);
        return -EINVAL;
    }
    expatt_state *st = calloc(1, sizeof *st);
    if (!st)
        return no_memory(name, err, errlen);
    p->impl = st;
    st->group = p->cfg.n_heads / p->cfg.n_kv_heads;
    st->d = p->cfg.head_dim;
    st->rot_from = -1;
    size_t n_rot = r->n_rot > 0 ? (size_t)r->n_rot : 1;
    st->cs = malloc(n_rot * sizeof *st->cs);
    st->avg = malloc(n_rot * sizeof *st->avg);
    st->mu = malloc((size_t)st->d * sizeof *st->mu);
    st->u = malloc((size_t)EXPATT_WINDOW * st->d * sizeof *st->u);
    st->row = malloc((size_t)st->d * sizeof *st->row);
    if (!st->cs || !st->avg || !st->mu || !st->u || !st->row ||
        qring_init(&st->ring, p->cfg.n_layers * p->cfg.n_kv_heads, EXPATT_WINDOW,
                   (size_t)st->group * st->d)) {
        expatt_destroy(p);
        return no_memory(name, err, errlen);
    }
    p->ops = &expatt_ops;
    return 0;
}
