#include "cache/kvcache.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bytes.h"
#include "base/checksum.h"
#include "cache/rope.h"

size_t kvp_cache_row_cost(kvp_kv_type type, int head_dim)
{
    return 2 * kvp_kv_row_bytes(type, head_dim) + sizeof(int32_t) + sizeof(int64_t) +
           2 * sizeof(float);
}

/* Cache ids start at 1: a block's payer 0 is nobody. */
static atomic_uint_least64_t next_cache_id = 1;

int kvp_cache_init(kvp_cache *c, int n_layers, int n_kv_heads, int head_dim, const kvp_rope *rope)
{
    memset(c, 0, sizeof *c);
    c->id = atomic_fetch_add(&next_cache_id, 1);
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim > KVP_MAX_HEAD_DIM ||
        rope->n_rot <= 0 ||
        rope->n_rot % 2 || rope->n_rot > head_dim)
        return -EINVAL;
    c->heads = calloc((size_t)n_layers * n_kv_heads, sizeof *c->heads);
    if (!c->heads)
        return -ENOMEM;
    c->rope = *rope;
    c->rope_base_swa = rope->base;
    if (rope->factors) {
        /* own copy: a restored cache has no model to borrow from */
        size_t n = (size_t)rope->n_rot / 2 * sizeof(float);
        float *f = malloc(n);
        if (!f) {
            free(c->heads);
            c->heads = NULL;
            return -ENOMEM;
        }
        c->rope.factors = memcpy(f, rope->factors, n);
    }
    c->n_layers = n_layers;
    c->n_kv_heads = n_kv_heads;
    c->head_dim = head_dim;
    return 0;
}

static void block_free(kvp_rows_block *b)
{
    free(b->k);
    free(b->v);
    free(b->pos);
    free(b->seq);
    free(b->score);
    free(b->stat);
    free(b);
}

/* c lets go of block b: no longer its payer, and the last holder frees it. */
static void block_release(kvp_cache *c, kvp_rows_block *b)
{
    uint_least64_t me = c->id;
    atomic_compare_exchange_strong(&b->payer, &me, 0);
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        block_free(b);
}

static size_t block_bytes(const kvp_rows_block *b, int head_dim)
{
    return (size_t)b->n * kvp_cache_row_cost(b->type, head_dim);
}

/* Whether c pays for b, claiming it when nobody does. */
static int block_charged(const kvp_cache *c, kvp_rows_block *b)
{
    uint_least64_t none = 0;
    return atomic_load(&b->payer) == c->id ||
           atomic_compare_exchange_strong(&b->payer, &none, c->id);
}

/* Lets the head's block go (its view of shared rows ends). */
static void head_drop_block(kvp_cache *c, kvp_head *h)
{
    if (h->blk)
        block_release(c, h->blk);
    h->blk = NULL;
    h->sh0 = h->n_shared = 0;
}

/* Frees the private arrays only (a block stays). */
static void head_free_private(kvp_head *h)
{
    free(h->k);
    free(h->v);
    free(h->pos);
    free(h->seq);
    free(h->score);
    free(h->stat);
    h->k = h->v = NULL;
    h->pos = NULL;
    h->seq = NULL;
    h->score = h->stat = NULL;
    h->cap = 0;
}

static void head_free(kvp_cache *c, kvp_head *h)
{
    head_free_private(h);
    head_drop_block(c, h);
    kvp_kv_type type = h->type;
    memset(h, 0, sizeof *h);
    h->type = type;
}

void kvp_cache_free(kvp_cache *c)
{
    if (c->heads)
        for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
            head_free(c, &c->heads[i]);
    free(c->heads);
    free((float *)c->rope.factors);
    free(c->window);
    free(c->factors_swa);
    memset(c, 0, sizeof *c);
}

int kvp_cache_set_windows(kvp_cache *c, const int *window, float rope_base_swa)
{
    int any = 0;
    for (int l = 0; window && l < c->n_layers; l++) {
        if (window[l] < 0)
            return -EINVAL;
        any |= window[l] > 0;
    }
    if (!(rope_base_swa > 0))
        return -EINVAL;
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        if (c->heads[i].n)
            return -EBUSY;
    int32_t *w = NULL;
    if (any) {
        if (!(w = malloc((size_t)c->n_layers * sizeof *w)))
            return -ENOMEM;
        for (int l = 0; l < c->n_layers; l++)
            w[l] = window[l];
    }
    free(c->window);
    c->window = w;
    c->rope_base_swa = rope_base_swa;
    if (!w) {   /* no windowed layers: no factors of their own */
        free(c->factors_swa);
        c->factors_swa = NULL;
    }
    return 0;
}

int kvp_cache_set_swa_factors(kvp_cache *c, const float *factors)
{
    if (!c->window)
        return -EINVAL;
    float *f = NULL;
    if (factors) {
        size_t n = (size_t)c->rope.n_rot / 2 * sizeof *f;
        if (!(f = malloc(n)))
            return -ENOMEM;
        memcpy(f, factors, n);
    }
    free(c->factors_swa);
    c->factors_swa = f;
    return 0;
}

kvp_rope kvp_cache_layer_rope(const kvp_cache *c, int layer)
{
    kvp_rope r = c->rope;
    if (kvp_cache_window(c, layer) && c->rope_base_swa > 0)
        r.base = c->rope_base_swa;
    if (kvp_cache_window(c, layer) && c->factors_swa)
        r.factors = c->factors_swa;
    return r;
}

void kvp_cache_slide(kvp_cache *c, int layer, int64_t next_seq)
{
    int w = kvp_cache_window(c, layer), hd = c->head_dim;
    for (int kvh = 0; w > 0 && kvh < c->n_kv_heads; kvh++) {
        kvp_head *h = kvp_cache_head(c, layer, kvh);
        int k = 0;
        while (k < h->n && kvp_head_seq(h, k) <= next_seq - w)
            k++;
        if (!k)
            continue;
        /* shared rows leave the view by moving its start along the block (nothing to
         * copy, nothing another holder sees); the private ones by moving down */
        int ks = k < h->n_shared ? k : h->n_shared;
        h->sh0 += ks;
        h->n_shared -= ks;
        h->n -= ks;
        if (!h->n_shared)
            head_drop_block(c, h);
        k -= ks;
        if (!k)
            continue;
        size_t n = (size_t)(h->n - h->n_shared - k), rb = kvp_kv_row_bytes(h->type, hd);
        memmove(h->k, (uint8_t *)h->k + (size_t)k * rb, n * rb);
        memmove(h->v, (uint8_t *)h->v + (size_t)k * rb, n * rb);
        memmove(h->pos, h->pos + k, n * sizeof *h->pos);
        memmove(h->seq, h->seq + k, n * sizeof *h->seq);
        memmove(h->score, h->score + k, n * sizeof *h->score);
        memmove(h->stat, h->stat + k, n * sizeof *h->stat);
        h->n -= k;
    }
}

void kvp_cache_reset(kvp_cache *c)
{
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        head_free(c, &c->heads[i]);
    c->next_pos = 0;
    c->n_seen = 0;
}

/* Reallocates every private row array of h to exactly `cap` rows (cap >= its private
 * rows, h->n - h->n_shared). */
static int head_resize(kvp_head *h, int head_dim, int cap)
{
    if (cap == 0) {
        head_free_private(h);
        return 0;
    }
    size_t rb = kvp_kv_row_bytes(h->type, head_dim);
    uint8_t *k = realloc(h->k, (size_t)cap * rb);
    if (k)
        h->k = k;
    uint8_t *v = realloc(h->v, (size_t)cap * rb);
    if (v)
        h->v = v;
    int32_t *pos = realloc(h->pos, (size_t)cap * sizeof *pos);
    if (pos)
        h->pos = pos;
    int64_t *seq = realloc(h->seq, (size_t)cap * sizeof *seq);
    if (seq)
        h->seq = seq;
    float *score = realloc(h->score, (size_t)cap * sizeof *score);
    if (score)
        h->score = score;
    float *stat = realloc(h->stat, (size_t)cap * sizeof *stat);
    if (stat)
        h->stat = stat;
    if (!k || !v || !pos || !seq || !score || !stat) {
        /* arrays that grew are kept; cap stays at what all of them hold */
        if (cap < h->cap)
            h->cap = cap;
        return -ENOMEM;
    }
    h->cap = cap;
    return 0;
}

int kvp_head_reserve(kvp_head *h, int head_dim, int rows)
{
    rows -= h->n_shared;   /* the shared rows need no room of their own */
    if (rows <= h->cap)
        return 0;
    int cap = h->cap ? h->cap : 16;
    while (cap < rows)
        cap = cap > (1 << 29) ? rows : cap * 2;
    return head_resize(h, head_dim, cap);
}

void kvp_cache_keep(kvp_cache *c, kvp_head *h, const int *keep, int n_keep)
{
    int S = h->n_shared;
    /* keep[] strictly increases from 0, so the shared rows all stay in place exactly
     * when the last of them does */
    if (S && !(n_keep >= S && keep[S - 1] == S - 1)) {
        if (kvp_head_unshare(c, h))
            return;   /* out of memory: the rows stay, the next eviction tries again */
        S = 0;
    }
    size_t rb = kvp_kv_row_bytes(h->type, c->head_dim);
    for (int i = S; i < n_keep; i++) {
        int r = keep[i] - S, j = i - S;   /* private indices */
        if (r == j)
            continue;
        memcpy((uint8_t *)h->k + (size_t)j * rb, (uint8_t *)h->k + (size_t)r * rb, rb);
        memcpy((uint8_t *)h->v + (size_t)j * rb, (uint8_t *)h->v + (size_t)r * rb, rb);
        h->pos[j] = h->pos[r];
        h->seq[j] = h->seq[r];
        h->score[j] = h->score[r];
        h->stat[j] = h->stat[r];
    }
    c->evicted_rows += (uint64_t)(h->n - n_keep);
    h->n = n_keep;
    /* give memory back once less than half is used (shrinking never fails for realloc
     * in practice; if it does, the larger arrays are simply kept) */
    int priv = n_keep - S;
    if (h->cap > 32 && priv < h->cap / 2)
        (void)head_resize(h, c->head_dim, priv < 16 ? 16 : priv);
}

/* Copies rows [first, first + n) of s (shared or private) into d's private arrays from
 * private index at, in at most two runs. */
static void rows_copy(kvp_head *d, int at, const kvp_head *s, int first, int n, int hd)
{
    size_t rb = kvp_kv_row_bytes(s->type, hd);
    while (n > 0) {
        int shared = first < s->n_shared;
        int run = shared ? s->n_shared - first : n;
        if (run > n)
            run = n;
        int from = shared ? s->sh0 + first : first - s->n_shared;
        const uint8_t *k = shared ? s->blk->k : s->k, *v = shared ? s->blk->v : s->v;
        const int32_t *pos = shared ? s->blk->pos : s->pos;
        const int64_t *seq = shared ? s->blk->seq : s->seq;
        const float *score = shared ? s->blk->score : s->score;
        const float *stat = shared ? s->blk->stat : s->stat;
        size_t nn = (size_t)run;
        memcpy((uint8_t *)d->k + (size_t)at * rb, k + (size_t)from * rb, nn * rb);
        memcpy((uint8_t *)d->v + (size_t)at * rb, v + (size_t)from * rb, nn * rb);
        memcpy(d->pos + at, pos + from, nn * sizeof *pos);
        memcpy(d->seq + at, seq + from, nn * sizeof *seq);
        memcpy(d->score + at, score + from, nn * sizeof *score);
        memcpy(d->stat + at, stat + from, nn * sizeof *stat);
        at += run;
        first += run;
        n -= run;
    }
}

int kvp_head_unshare(kvp_cache *c, kvp_head *h)
{
    if (!h->blk)
        return 0;
    kvp_head p = {.type = h->type};
    int n = h->n;
    if (head_resize(&p, c->head_dim, n < 16 ? 16 : n)) {
        head_free_private(&p);
        return -ENOMEM;
    }
    rows_copy(&p, 0, h, 0, n, c->head_dim);
    head_free_private(h);
    head_drop_block(c, h);
    h->k = p.k;
    h->v = p.v;
    h->pos = p.pos;
    h->seq = p.seq;
    h->score = p.score;
    h->stat = p.stat;
    h->cap = p.cap;
    return 0;
}

int kvp_cache_unshare(kvp_cache *c)
{
    for (int i = 0; c->heads && i < c->n_layers * c->n_kv_heads; i++)
        if (kvp_head_unshare(c, &c->heads[i]))
            return -ENOMEM;
    return 0;
}

static const float *rows_f32(const kvp_head *h, int values, int hd, int first, int n,
                             float *tmp)
{
    void *(*row)(const kvp_head *, int, int) = values ? kvp_head_vrow : kvp_head_krow;
    /* f32 rows in one run (all shared or all private) are read where they lie */
    if (h->type == KVP_KV_F32 && (first >= h->n_shared || first + n <= h->n_shared))
        return (const float *)row(h, hd, first);
    for (int r = 0; r < n; r++)
        kvp_kv_row_load(h->type, tmp + (size_t)r * hd, row(h, hd, first + r), hd);
    return tmp;
}

const float *kvp_head_keys(const kvp_head *h, int head_dim, int first, int n, float *tmp)
{
    return rows_f32(h, 0, head_dim, first, n, tmp);
}

const float *kvp_head_values(const kvp_head *h, int head_dim, int first, int n, float *tmp)
{
    return rows_f32(h, 1, head_dim, first, n, tmp);
}

/* Re-encodes one head's n rows of `from` (at *rows) as `to`, into a new array of cap rows. */
static uint8_t *convert_rows(const uint8_t *rows, int n, int cap, int hd, kvp_kv_type from,
                             kvp_kv_type to, float *tmp)
{
    size_t rf = kvp_kv_row_bytes(from, hd), rt = kvp_kv_row_bytes(to, hd);
    uint8_t *out = malloc((size_t)cap * rt);
    if (!out)
        return NULL;
    for (int r = 0; r < n; r++) {
        kvp_kv_row_load(from, tmp, rows + (size_t)r * rf, hd);
        kvp_kv_row_store(to, out + (size_t)r * rt, tmp, hd);
    }
    return out;
}

int kvp_cache_convert(kvp_cache *c, kvp_kv_type type)
{
    if ((unsigned)type >= KVP_KV_N_TYPES)
        return -EINVAL;
    if (type == c->kv_type)
        return 0;
    if (kvp_cache_unshare(c))   /* re-encoded rows are the cache's own */
        return -ENOMEM;
    int nh = c->n_layers * c->n_kv_heads, hd = c->head_dim;
    /* every head's new rows first, so that a failure leaves the cache as it was */
    uint8_t **nk = calloc((size_t)nh, sizeof *nk), **nv = calloc((size_t)nh, sizeof *nv);
    float *tmp = malloc((size_t)hd * sizeof *tmp);
    int rc = nk && nv && tmp ? 0 : -ENOMEM;
    for (int i = 0; !rc && i < nh; i++) {
        const kvp_head *h = &c->heads[i];
        if (!h->cap)
            continue;
        nk[i] = convert_rows(h->k, h->n, h->cap, hd, h->type, type, tmp);
        nv[i] = convert_rows(h->v, h->n, h->cap, hd, h->type, type, tmp);
        if (!nk[i] || !nv[i])
            rc = -ENOMEM;
    }
    for (int i = 0; i < nh && nk && nv; i++) {
        kvp_head *h = &c->heads[i];
        if (rc) {
            free(nk[i]);
            free(nv[i]);
            continue;
        }
        if (h->cap) {
            free(h->k);
            free(h->v);
            h->k = nk[i];
            h->v = nv[i];
        }
        h->type = type;
    }
    if (!rc)
        c->kv_type = type;
    free(nk);
    free(nv);
    free(tmp);
    return rc;
}

size_t kvp_head_bytes(const kvp_cache *c, const kvp_head *h)
{
    return (size_t)h->cap * kvp_cache_row_cost(h->type, c->head_dim);
}

size_t kvp_cache_shared_bytes(const kvp_cache *c)
{
    size_t b = 0;
    for (int i = 0; c->heads && i < c->n_layers * c->n_kv_heads; i++)
        if (c->heads[i].blk && block_charged(c, c->heads[i].blk))
            b += block_bytes(c->heads[i].blk, c->head_dim);
    return b;
}

size_t kvp_cache_borrowed_bytes(const kvp_cache *c)
{
    size_t b = 0;
    for (int i = 0; c->heads && i < c->n_layers * c->n_kv_heads; i++)
        if (c->heads[i].blk)
            b += block_bytes(c->heads[i].blk, c->head_dim);
    return b;
}

size_t kvp_cache_bytes(const kvp_cache *c)
{
    size_t rows = 0;
    for (int i = 0; c->heads && i < c->n_layers * c->n_kv_heads; i++)
        rows += (size_t)c->heads[i].cap;
    return rows * kvp_cache_row_cost(c->kv_type, c->head_dim) + kvp_cache_shared_bytes(c);
}

size_t kvp_cache_rows(const kvp_cache *c)
{
    size_t rows = 0;
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        rows += (size_t)c->heads[i].n;
    return rows;
}

int kvp_cache_max_rows(const kvp_cache *c)
{
    int m = 0;
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        if (c->heads[i].n > m)
            m = c->heads[i].n;
    return m;
}

size_t kvp_cache_budget_rows(const kvp_cache *c)
{
    size_t rows = 0;
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        if (!kvp_cache_window(c, i / c->n_kv_heads))
            rows += (size_t)c->heads[i].n;
    return rows;
}

int kvp_cache_budget_max_rows(const kvp_cache *c)
{
    int m = 0;
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        if (!kvp_cache_window(c, i / c->n_kv_heads) && c->heads[i].n > m)
            m = c->heads[i].n;
    return m;
}

int kvp_cache_budget_heads(const kvp_cache *c)
{
    int n = 0;
    for (int l = 0; l < c->n_layers; l++)
        n += kvp_cache_window(c, l) ? 0 : c->n_kv_heads;
    return n;
}

void kvp_cache_drop_newest(kvp_cache *c, int n)
{
    if (n <= 0)
        return;
    int64_t from = c->n_seen - n;
    int last_pos = -1;   /* of the rows that stay */
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++) {
        kvp_head *h = &c->heads[i];
        while (h->n > 0 && kvp_head_seq(h, h->n - 1) >= from)
            h->n--;
        if (h->n < h->n_shared) {   /* the view of the block ends sooner */
            h->n_shared = h->n;
            if (!h->n_shared)
                head_drop_block(c, h);
        }
        if (h->n > 0 && kvp_head_pos(h, h->n - 1) > last_pos)
            last_pos = kvp_head_pos(h, h->n - 1);
    }
    c->n_seen = from;
    /* The newest tokens sit at consecutive positions (a context shift keeps the newest
     * quarter's distances), so they free the last n; never below a row that stays. */
    c->next_pos -= n;
    if (c->next_pos <= last_pos)
        c->next_pos = last_pos + 1;
}

/* Rows of h with seq < from: a prefix, the rows being in insertion order. */
static int head_prefix_rows(const kvp_head *h, int64_t from)
{
    int n = h->n;
    while (n > 0 && kvp_head_seq(h, n - 1) >= from)
        n--;
    return n;
}

size_t kvp_cache_prefix_bytes(const kvp_cache *c, int64_t from)
{
    size_t rows = 0;
    for (int i = 0; c->heads && i < c->n_layers * c->n_kv_heads; i++)
        rows += (size_t)head_prefix_rows(&c->heads[i], from);
    return rows * kvp_cache_row_cost(c->kv_type, c->head_dim);
}

/* dst (uninitialised) becomes an empty cache of src's shape, type, RoPE and windows. */
static int fork_shape(kvp_cache *dst, const kvp_cache *src, int64_t from)
{
    memset(dst, 0, sizeof *dst);
    if (from < 0 || from > src->n_seen || !src->heads)
        return -EINVAL;
    int rc = kvp_cache_init(dst, src->n_layers, src->n_kv_heads, src->head_dim, &src->rope);
    if (rc)
        return rc;
    if (src->window) {
        if ((rc = kvp_cache_set_windows(dst, src->window, src->rope_base_swa)) ||
            (src->factors_swa && (rc = kvp_cache_set_swa_factors(dst, src->factors_swa))))
            goto fail;
    } else {
        dst->rope_base_swa = src->rope_base_swa;
    }
    if ((rc = kvp_cache_convert(dst, src->kv_type)))   /* empty: sets the type */
        goto fail;
    return 0;
fail:
    kvp_cache_free(dst);
    return rc;
}

/* The counters of a fork at `from` (its rows in place). */
static void fork_finish(kvp_cache *dst, const kvp_cache *src, int64_t from)
{
    int last_pos = -1;
    for (int i = 0; i < dst->n_layers * dst->n_kv_heads; i++) {
        const kvp_head *d = &dst->heads[i];
        if (d->n && kvp_head_pos(d, d->n - 1) > last_pos)
            last_pos = kvp_head_pos(d, d->n - 1);
    }
    dst->n_seen = from;
    dst->evicted_rows = src->evicted_rows;
    dst->shifts = src->shifts;
    /* as kvp_cache_drop_newest: the newest tokens held consecutive positions */
    int64_t np = (int64_t)src->next_pos - (src->n_seen - from);
    dst->next_pos = np <= last_pos ? last_pos + 1 : (int)np;
}

int kvp_cache_fork(kvp_cache *dst, const kvp_cache *src, int64_t from)
{
    int rc = fork_shape(dst, src, from);
    if (rc)
        return rc;
    for (int i = 0; i < src->n_layers * src->n_kv_heads; i++) {
        const kvp_head *s = &src->heads[i];
        kvp_head *d = &dst->heads[i];
        int n = head_prefix_rows(s, from);
        if (!n)
            continue;
        if ((rc = kvp_head_reserve(d, src->head_dim, n))) {
            kvp_cache_free(dst);
            return rc;
        }
        rows_copy(d, 0, s, 0, n, src->head_dim);
        d->n = n;
    }
    fork_finish(dst, src, from);
    return 0;
}

/* Makes src's head s share its first n rows: they become a block (s's arrays handed to
 * it, not copied) and s keeps rows [n, s->n) in new arrays. 0 or -ENOMEM (s unchanged). */
static int head_make_block(kvp_cache *src, kvp_head *s, int n)
{
    int hd = src->head_dim, tail = s->n - n;
    kvp_rows_block *b = calloc(1, sizeof *b);
    kvp_head t = {.type = s->type};
    if (!b || (tail && kvp_head_reserve(&t, hd, tail))) {
        free(b);
        head_free_private(&t);
        return -ENOMEM;
    }
    if (tail)
        rows_copy(&t, 0, s, n, tail, hd);
    size_t rb = kvp_kv_row_bytes(s->type, hd), nn = (size_t)n;
    /* the arrays shrink to the block's rows (a shrink that fails keeps them larger) */
    void *p;
    b->k = (p = realloc(s->k, nn * rb)) ? p : s->k;
    b->v = (p = realloc(s->v, nn * rb)) ? p : s->v;
    b->pos = (p = realloc(s->pos, nn * sizeof *b->pos)) ? p : s->pos;
    b->seq = (p = realloc(s->seq, nn * sizeof *b->seq)) ? p : s->seq;
    b->score = (p = realloc(s->score, nn * sizeof *b->score)) ? p : s->score;
    b->stat = (p = realloc(s->stat, nn * sizeof *b->stat)) ? p : s->stat;
    b->n = n;
    b->type = s->type;
    atomic_init(&b->refs, 1);
    atomic_init(&b->payer, src->id);
    s->k = t.k;
    s->v = t.v;
    s->pos = t.pos;
    s->seq = t.seq;
    s->score = t.score;
    s->stat = t.stat;
    s->cap = t.cap;
    s->blk = b;
    s->sh0 = 0;
    s->n_shared = n;
    return 0;
}

int kvp_cache_fork_shared(kvp_cache *dst, kvp_cache *src, int64_t from)
{
    int rc = fork_shape(dst, src, from);
    if (rc)
        return rc;
    int hd = src->head_dim;
    for (int i = 0; i < src->n_layers * src->n_kv_heads; i++) {
        kvp_head *s = &src->heads[i];
        kvp_head *d = &dst->heads[i];
        int n = head_prefix_rows(s, from);
        if (!n)
            continue;
        /* a block src alone holds is src's own rows: taking them back costs a copy of
         * what will be shared, and the longer prefix is then shared whole */
        if (s->blk && n > s->n_shared && atomic_load(&s->blk->refs) == 1 &&
            (rc = kvp_head_unshare(src, s)))
            goto fail;
        if (!s->blk && (rc = head_make_block(src, s, n)))
            goto fail;
        int k = n < s->n_shared ? n : s->n_shared;   /* rows read from the block */
        if (n > k && (rc = kvp_head_reserve(d, hd, n - k)))
            goto fail;
        atomic_fetch_add_explicit(&s->blk->refs, 1, memory_order_relaxed);
        d->blk = s->blk;
        d->sh0 = s->sh0;
        d->n_shared = k;
        d->n = n;
        if (n > k)   /* src's rows past its block: copied */
            rows_copy(d, 0, s, k, n - k, hd);
    }
    fork_finish(dst, src, from);
    return 0;
fail:
    kvp_cache_free(dst);
    return rc;
}

int kvp_cache_shift(kvp_cache *c, int n_sink, int ctx)
{
    int target = ctx - ctx / 4, window = ctx / 4;
    int delta = c->next_pos - target;
    if (delta <= 0 || target - window < n_sink)
        return 0;
    if (kvp_cache_unshare(c))   /* the keys are rotated in place */
        return -ENOMEM;
    int old_end = c->next_pos - window, new_old_end = target - window;
    float tmp[KVP_MAX_HEAD_DIM];   /* one key row decoded */
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++) {
        kvp_head *h = &c->heads[i];
        kvp_rope rope = kvp_cache_layer_rope(c, i / c->n_kv_heads);
        for (int r = 0; r < h->n; r++) {
            int p = h->pos[r], np;
            if (p < n_sink)
                np = p;
            else if (p >= old_end)
                np = p - delta;
            else
                np = n_sink + (int)((int64_t)(p - n_sink) * (new_old_end - n_sink) /
                                    (old_end - n_sink));
            if (np == p)
                continue;
            /* the key is decoded, rotated and stored again in its own type */
            uint8_t *row = kvp_head_krow(h, c->head_dim, r);
            kvp_kv_row_load(h->type, tmp, row, c->head_dim);
            kvp_rope_rotate(&rope, tmp, np - p);
            kvp_kv_row_store(h->type, row, tmp, c->head_dim);
            h->pos[r] = np;
        }
    }
    c->next_pos = target;
    c->shifts++;
    return 0;
}

/* ---- serialization ---------------------------------------------------------------
 * Layout (little-endian, as the host writes it; snapshots are machine-local):
 *   "KVPCACHE" u32 version, i32 n_layers, n_kv_heads, head_dim, f32 rope base,
 *   i32 rope n_rot, i32 rope neox, i32 n_factors (0 or n_rot/2), f32 factors[n_factors],
 *   i32 next_pos, i64 n_seen, u64 evicted_rows, u64 shifts, u32 kv_type,
 *   (version 4 and 5:) f32 rope_base_swa, i32 window[n_layers],
 *   (version 5 only:) f32 factors_swa[n_rot/2],
 *   per head: i32 n, then n k rows, n v rows (as stored: kvp_kv_row_bytes each),
 *   n pos, n seq, n score, n stat;
 *   u64 FNV-1a of everything before it.
 * A cache without sliding windows is written as version 3, which has no windows; one
 * whose windowed layers have their own factors as version 5, others as version 4. Version 2 had no kv_type (its rows are f32). Version 1 had only the rope base: its
 * keys were rotated on consecutive pairs over the whole head without factors, and it
 * still reads as such. A reader wanting another kv_type converts (kvp_cache_convert). */
#define CACHE_MAGIC "KVPCACHE"
#define CACHE_VERSION 5u

static uint64_t fnv1a(const void *p, size_t n) { return kvp_fnv1a(KVP_FNV1A_INIT, p, n); }

int kvp_cache_serialize(const kvp_cache *c, void **buf, size_t *len)
{
    size_t rb = kvp_kv_row_bytes(c->kv_type, c->head_dim);
    int n_factors = c->rope.factors ? c->rope.n_rot / 2 : 0;
    int n_windows = c->window ? c->n_layers : 0;
    int n_swa = n_windows && c->factors_swa ? c->rope.n_rot / 2 : 0;
    size_t total = 8 + 4 + 4 * 4 + 3 * 4 + (size_t)n_factors * 4 + 4 + 8 + 8 + 8 + 4 + 8 +
                   (n_windows ? 4 + (size_t)n_windows * 4 : 0) + (size_t)n_swa * 4;
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        total += 4 + (size_t)c->heads[i].n * kvp_cache_row_cost(c->kv_type, c->head_dim);
    kvp_wbuf w = {malloc(total), 0};
    if (!w.p)
        return -ENOMEM;
    uint32_t version = n_swa ? 5u : n_windows ? 4u : 3u;
    kvp_w_bytes(&w, CACHE_MAGIC, 8);
    kvp_w_bytes(&w, &version, 4);
    kvp_w_bytes(&w, &c->n_layers, 4);
    kvp_w_bytes(&w, &c->n_kv_heads, 4);
    kvp_w_bytes(&w, &c->head_dim, 4);
    kvp_w_bytes(&w, &c->rope.base, 4);
    kvp_w_bytes(&w, &c->rope.n_rot, 4);
    kvp_w_bytes(&w, &c->rope.neox, 4);
    kvp_w_bytes(&w, &n_factors, 4);
    if (n_factors)
        kvp_w_bytes(&w, c->rope.factors, (size_t)n_factors * 4);
    kvp_w_bytes(&w, &c->next_pos, 4);
    kvp_w_bytes(&w, &c->n_seen, 8);
    kvp_w_bytes(&w, &c->evicted_rows, 8);
    kvp_w_bytes(&w, &c->shifts, 8);
    uint32_t kv_type = (uint32_t)c->kv_type;
    kvp_w_bytes(&w, &kv_type, 4);
    if (n_windows) {
        kvp_w_bytes(&w, &c->rope_base_swa, 4);
        kvp_w_bytes(&w, c->window, (size_t)n_windows * 4);
    }
    if (n_swa)
        kvp_w_bytes(&w, c->factors_swa, (size_t)n_swa * 4);
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++) {
        /* shared rows are written out as the head's own: a snapshot stands alone */
        const kvp_head *h = &c->heads[i];
        const kvp_rows_block *b = h->blk;
        size_t n = (size_t)h->n, ns = (size_t)h->n_shared, np = n - ns, o = (size_t)h->sh0;
        kvp_w_bytes(&w, &h->n, 4);
        if (!n)
            continue;
        /* each array: the shared run, then the head's own (b is NULL without shared rows) */
        const void *sk = ns ? (const uint8_t *)b->k + o * rb : NULL;
        const void *sv = ns ? (const uint8_t *)b->v + o * rb : NULL;
        const void *spos = ns ? (const void *)(b->pos + o) : NULL;
        const void *sseq = ns ? (const void *)(b->seq + o) : NULL;
        const void *sscore = ns ? (const void *)(b->score + o) : NULL;
        const void *sstat = ns ? (const void *)(b->stat + o) : NULL;
        kvp_w_bytes(&w, sk, ns * rb);
        kvp_w_bytes(&w, h->k, np * rb);
        kvp_w_bytes(&w, sv, ns * rb);
        kvp_w_bytes(&w, h->v, np * rb);
        kvp_w_bytes(&w, spos, ns * sizeof *h->pos);
        kvp_w_bytes(&w, h->pos, np * sizeof *h->pos);
        kvp_w_bytes(&w, sseq, ns * sizeof *h->seq);
        kvp_w_bytes(&w, h->seq, np * sizeof *h->seq);
        kvp_w_bytes(&w, sscore, ns * sizeof *h->score);
        kvp_w_bytes(&w, h->score, np * sizeof *h->score);
        kvp_w_bytes(&w, sstat, ns * sizeof *h->stat);
        kvp_w_bytes(&w, h->stat, np * sizeof *h->stat);
    }
    uint64_t sum = fnv1a(w.p, w.n);
    kvp_w_bytes(&w, &sum, 8);
    *buf = w.p;
    *len = w.n;
    return 0;
}

int kvp_cache_deserialize(kvp_cache *c, const void *buf, size_t len, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    kvp_rbuf r = {buf, len, 0};
    char magic[8];
    uint32_t version = 0;
    int n_layers, n_kv, hd, next_pos;
    kvp_rope rope = {0};
    int n_factors = 0;
    float factors[2048];
    if (len < 8 + 8 || kvp_r_bytes(&r, magic, 8) || memcmp(magic, CACHE_MAGIC, 8)) {
        snprintf(err, errlen, "cache snapshot: bad magic or too short (%zu bytes)", len);
        return -EINVAL;
    }
    uint64_t want;
    memcpy(&want, (const unsigned char *)buf + len - 8, 8);
    if (fnv1a(buf, len - 8) != want) {
        snprintf(err, errlen, "cache snapshot: checksum mismatch (truncated or altered)");
        return -EINVAL;
    }
    r.n = len - 8;
    if (kvp_r_bytes(&r, &version, 4) || version < 1 || version > CACHE_VERSION) {
        snprintf(err, errlen, "cache snapshot: unsupported version %u", version);
        return -EINVAL;
    }
    if (kvp_r_bytes(&r, &n_layers, 4) || kvp_r_bytes(&r, &n_kv, 4) || kvp_r_bytes(&r, &hd, 4) ||
        kvp_r_bytes(&r, &rope.base, 4) || n_layers <= 0 || n_kv <= 0 || hd <= 0 ||
        n_layers > 4096 || n_kv > 4096 || hd > 4096) {
        snprintf(err, errlen, "cache snapshot: bad shape");
        return -EINVAL;
    }
    rope.n_rot = hd;
    if (version > 1 &&
        (kvp_r_bytes(&r, &rope.n_rot, 4) || kvp_r_bytes(&r, &rope.neox, 4) ||
         kvp_r_bytes(&r, &n_factors, 4) ||
         rope.n_rot <= 0 || rope.n_rot > hd || rope.n_rot % 2 || (rope.neox & ~1) ||
         (n_factors && n_factors != rope.n_rot / 2) ||
         kvp_r_bytes(&r, factors, (size_t)n_factors * sizeof *factors))) {
        snprintf(err, errlen, "cache snapshot: bad rope description");
        return -EINVAL;
    }
    rope.factors = n_factors ? factors : NULL;
    if (kvp_r_bytes(&r, &next_pos, 4) || next_pos < 0) {
        snprintf(err, errlen, "cache snapshot: bad shape");
        return -EINVAL;
    }
    int rc = kvp_cache_init(c, n_layers, n_kv, hd, &rope);
    if (rc)
        return rc;
    c->next_pos = next_pos;
    if (kvp_r_bytes(&r, &c->n_seen, 8) || kvp_r_bytes(&r, &c->evicted_rows, 8) || kvp_r_bytes(&r, &c->shifts, 8))
        goto bad;
    uint32_t kv_type = KVP_KV_F32;
    if (version >= 3 && (kvp_r_bytes(&r, &kv_type, 4) || kv_type >= KVP_KV_N_TYPES)) {
        kvp_cache_free(c);
        snprintf(err, errlen, "cache snapshot: unknown kv_type %u", kv_type);
        return -EINVAL;
    }
    (void)kvp_cache_convert(c, (kvp_kv_type)kv_type);   /* no rows yet: cannot fail */
    if (version >= 4) {
        float base_swa;
        int win[4096];
        if (kvp_r_bytes(&r, &base_swa, 4) ||
            kvp_r_bytes(&r, win, (size_t)n_layers * sizeof *win) ||
            kvp_cache_set_windows(c, win, base_swa) || !c->window) {
            kvp_cache_free(c);
            snprintf(err, errlen, "cache snapshot: bad sliding windows");
            return -EINVAL;
        }
    }
    if (version >= 5) {
        int ok = kvp_r_bytes(&r, factors, (size_t)rope.n_rot / 2 * sizeof *factors) == 0;
        for (int i = 0; ok && i < rope.n_rot / 2; i++)
            ok = factors[i] > 0 && isfinite(factors[i]);
        if (!ok || kvp_cache_set_swa_factors(c, factors)) {
            kvp_cache_free(c);
            snprintf(err, errlen, "cache snapshot: bad sliding-window frequency factors");
            return -EINVAL;
        }
    }
    size_t rb = kvp_kv_row_bytes(c->kv_type, hd);
    for (int i = 0; i < n_layers * n_kv; i++) {
        kvp_head *h = &c->heads[i];
        int n;
        if (kvp_r_bytes(&r, &n, 4) || n < 0 ||
            (size_t)n > (r.n - r.off) / kvp_cache_row_cost(c->kv_type, hd))
            goto bad;
        if (!n)
            continue;
        if (kvp_head_reserve(h, hd, n)) {
            kvp_cache_free(c);
            snprintf(err, errlen, "cache snapshot: out of memory");
            return -ENOMEM;
        }
        h->n = n;
        size_t nn = (size_t)n;
        if (kvp_r_bytes(&r, h->k, nn * rb) || kvp_r_bytes(&r, h->v, nn * rb) ||
            kvp_r_bytes(&r, h->pos, nn * sizeof *h->pos) || kvp_r_bytes(&r, h->seq, nn * sizeof *h->seq) ||
            kvp_r_bytes(&r, h->score, nn * sizeof *h->score) || kvp_r_bytes(&r, h->stat, nn * sizeof *h->stat))
            goto bad;
    }
    if (r.off != r.n)
        goto bad;
    return 0;
bad:
    kvp_cache_free(c);
    snprintf(err, errlen, "cache snapshot: inconsistent contents");
    return -EINVAL;
}
