/* kvp_cache_fork_shared: a fork reads its source's rows instead of copying them, and
 * whatever either side does next (append, evict, cut back, slide, shift, convert) gives
 * exactly what it gives after kvp_cache_fork's copy, while the other side's rows stay
 * byte for byte what they were. The block is counted once and freed by its last holder
 * (the ASan build checks the leaks). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kvcache.h"
#include "cache/kvrow.h"
#include "cache/rope.h"

enum { L = 2, H = 3, D = 64 };
static const kvp_rope ROPE = {.n_rot = D, .base = 10000.0f};

/* n new tokens on every head; salt tells one side's tokens from the other's. Written
 * through the accessors, as the forward pass appends: a new row is private. */
static void append(kvp_cache *c, int n, int salt)
{
    float k[D], v[D];
    for (int i = 0; i < L * H; i++) {
        kvp_head *h = &c->heads[i];
        cr_assert_eq(kvp_head_reserve(h, D, h->n + n), 0);
        for (int t = 0; t < n; t++) {
            int r = h->n + t, j = r - h->n_shared;
            int64_t seq = c->n_seen + t;
            for (int d = 0; d < D; d++) {
                k[d] = sinf((float)(seq * 7 + d + i * 13 + salt * 101));
                v[d] = cosf((float)(seq * 3 + d + i + salt * 37));
            }
            kvp_kv_row_store(h->type, kvp_head_krow(h, D, r), k, D);
            kvp_kv_row_store(h->type, kvp_head_vrow(h, D, r), v, D);
            h->pos[j] = c->next_pos + t;
            h->seq[j] = seq;
            h->score[j] = (float)(seq + salt);
            h->stat[j] = (float)-seq;
        }
        h->n += n;
    }
    c->next_pos += n;
    c->n_seen += n;
}

static void make(kvp_cache *c, kvp_kv_type type, int n)
{
    cr_assert_eq(kvp_cache_init(c, L, H, D, &ROPE), 0);
    cr_assert_eq(kvp_cache_convert(c, type), 0);
    append(c, n, 0);
}

static void *snap(const kvp_cache *c, size_t *len)
{
    void *buf;
    cr_assert_eq(kvp_cache_serialize(c, &buf, len), 0);
    return buf;
}

/* a and b read the same rows, positions, counters (their serializations agree). */
static void expect_same(const kvp_cache *a, const kvp_cache *b, const char *what)
{
    size_t la, lb;
    void *x = snap(a, &la), *y = snap(b, &lb);
    cr_expect_eq(la, lb, "%s: %zu vs %zu bytes", what, la, lb);
    cr_expect(la == lb && memcmp(x, y, la) == 0, "%s: the rows differ", what);
    free(x);
    free(y);
}

/* c's rows are still those of the snapshot taken before. */
static void expect_unchanged(const kvp_cache *c, const void *before, size_t len, const char *what)
{
    size_t n;
    void *now = snap(c, &n);
    cr_expect(n == len && memcmp(now, before, len) == 0, "%s changed the other side", what);
    free(now);
}

static const kvp_kv_type TYPES[] = {KVP_KV_F32, KVP_KV_F16, KVP_KV_Q8_0};

Test(shared, a_fork_reads_the_same_rows_as_a_copy_and_copies_none)
{
    for (int t = 0; t < 3; t++) {
        kvp_cache src, ref, dst;
        make(&src, TYPES[t], 100);
        size_t before = kvp_cache_bytes(&src), rows = kvp_cache_rows(&src);
        size_t len;
        void *s0 = snap(&src, &len);
        cr_assert_eq(kvp_cache_fork(&ref, &src, 100), 0);
        cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 100), 0);
        expect_same(&dst, &ref, "shared fork vs copy");
        expect_unchanged(&src, s0, len, "forking");
        /* every row is in one block per head, charged to the source once */
        size_t block = rows * kvp_cache_row_cost(TYPES[t], D);
        cr_expect_eq(kvp_cache_borrowed_bytes(&dst), block);
        cr_expect_eq(kvp_cache_borrowed_bytes(&src), block);
        cr_expect_eq(kvp_cache_shared_bytes(&src), block);
        cr_expect_eq(kvp_cache_shared_bytes(&dst), 0, "the block counted twice");
        cr_expect_eq(kvp_cache_bytes(&dst), 0, "the fork copied rows");
        cr_expect_leq(kvp_cache_bytes(&src) + kvp_cache_bytes(&dst), before);
        cr_expect_eq(kvp_cache_bytes(&ref), before, "the copy's bytes (the old cost)");
        for (int i = 0; i < L * H; i++)
            cr_expect_eq(dst.heads[i].n_shared, src.heads[i].n);
        free(s0);
        kvp_cache_free(&src);
        kvp_cache_free(&ref);
        kvp_cache_free(&dst);
    }
}

Test(shared, appends_on_both_sides_stay_apart)
{
    kvp_cache src, ref, dst;
    make(&src, KVP_KV_Q8_0, 70);
    cr_assert_eq(kvp_cache_fork(&ref, &src, 70), 0);
    cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 70), 0);
    kvp_cache own;   /* what src would read had it never been forked */
    cr_assert_eq(kvp_cache_fork(&own, &src, 70), 0);
    append(&src, 40, 1);
    append(&own, 40, 1);
    append(&dst, 33, 2);
    append(&ref, 33, 2);
    expect_same(&dst, &ref, "the fork after appends");
    expect_same(&src, &own, "the source after appends");
    kvp_cache_free(&src);
    kvp_cache_free(&own);
    kvp_cache_free(&ref);
    kvp_cache_free(&dst);
}

/* Eviction on the fork drops shared rows: the fork copies first; the source's rows are
 * byte-identical; keeping every shared row in place copies nothing. */
Test(shared, eviction_on_the_fork_leaves_the_source_unchanged)
{
    kvp_cache src, ref, dst;
    make(&src, KVP_KV_Q8_0, 90);
    cr_assert_eq(kvp_cache_fork(&ref, &src, 90), 0);
    cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 90), 0);
    append(&dst, 10, 3);
    append(&ref, 10, 3);
    size_t len;
    void *s0 = snap(&src, &len);
    /* rows past the shared ones only: the block stays */
    int keep[100], k = 0;
    for (int r = 0; r < 100; r++)
        if (r < 90 || r % 2)
            keep[k++] = r;
    for (int i = 0; i < L * H; i++) {
        kvp_cache_keep(&dst, &dst.heads[i], keep, k);
        kvp_cache_keep(&ref, &ref.heads[i], keep, k);
        cr_expect_eq(dst.heads[i].n_shared, 90, "a private eviction copied the shared rows");
    }
    expect_same(&dst, &ref, "private eviction");
    /* then shared rows go: the head copies them first */
    k = 0;
    for (int r = 0; r < 95; r++)
        if (r % 3 != 1)
            keep[k++] = r;
    for (int i = 0; i < L * H; i++) {
        kvp_cache_keep(&dst, &dst.heads[i], keep, k);
        kvp_cache_keep(&ref, &ref.heads[i], keep, k);
        cr_expect_eq(dst.heads[i].n_shared, 0);
        cr_expect_null(dst.heads[i].blk);
    }
    expect_same(&dst, &ref, "eviction of shared rows");
    cr_expect_eq(dst.evicted_rows, ref.evicted_rows);
    expect_unchanged(&src, s0, len, "the fork's eviction");
    free(s0);
    kvp_cache_free(&src);
    kvp_cache_free(&ref);
    kvp_cache_free(&dst);
}

/* The source evicts instead: the fork's view is unchanged. */
Test(shared, eviction_on_the_source_leaves_the_fork_unchanged)
{
    kvp_cache src, dst;
    make(&src, KVP_KV_F32, 64);
    cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 64), 0);
    size_t len;
    void *d0 = snap(&dst, &len);
    int keep[64], k = 0;
    for (int r = 0; r < 64; r += 2)
        keep[k++] = r;
    for (int i = 0; i < L * H; i++)
        kvp_cache_keep(&src, &src.heads[i], keep, k);
    expect_unchanged(&dst, d0, len, "the source's eviction");
    /* the source let its blocks go: the fork pays for them now */
    cr_expect_eq(kvp_cache_borrowed_bytes(&src), 0);
    cr_expect_eq(kvp_cache_shared_bytes(&dst), kvp_cache_borrowed_bytes(&dst));
    cr_expect_gt(kvp_cache_shared_bytes(&dst), 0);
    free(d0);
    kvp_cache_free(&src);
    kvp_cache_free(&dst);
}

Test(shared, the_last_holder_frees_the_block_and_reads_it_until_then)
{
    kvp_cache src, ref, a, b;
    make(&src, KVP_KV_F16, 50);
    cr_assert_eq(kvp_cache_fork(&ref, &src, 50), 0);
    cr_assert_eq(kvp_cache_fork_shared(&a, &src, 50), 0);
    cr_assert_eq(kvp_cache_fork_shared(&b, &a, 50), 0);   /* a fork of a fork: the same block */
    cr_expect_eq(b.heads[0].blk, src.heads[0].blk);
    cr_expect_eq(atomic_load(&src.heads[0].blk->refs), 3);
    kvp_cache_free(&src);
    cr_expect_eq(atomic_load(&a.heads[0].blk->refs), 2);
    expect_same(&a, &ref, "a after the source is freed");
    /* the payer left: one of the holders is charged, once */
    size_t sa = kvp_cache_shared_bytes(&a), sb = kvp_cache_shared_bytes(&b);
    cr_expect_eq(sa + sb, kvp_cache_borrowed_bytes(&a), "charged %zu + %zu", sa, sb);
    kvp_cache_free(&a);
    expect_same(&b, &ref, "b after a is freed");
    cr_expect_eq(kvp_cache_shared_bytes(&b), kvp_cache_borrowed_bytes(&b));
    kvp_cache_free(&b);   /* the last: ASan reports the block if it stayed */
    kvp_cache_free(&ref);
}

/* Cut back below the shared rows, then grown again: another token than the source's. */
Test(shared, a_fork_cut_back_into_the_shared_rows_grows_apart)
{
    kvp_cache src, ref, dst;
    make(&src, KVP_KV_Q8_0, 80);
    cr_assert_eq(kvp_cache_fork(&ref, &src, 80), 0);
    cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 80), 0);
    size_t len;
    void *s0 = snap(&src, &len);
    kvp_cache_drop_newest(&dst, 30);
    kvp_cache_drop_newest(&ref, 30);
    cr_expect_eq(dst.heads[0].n_shared, 50);
    append(&dst, 20, 5);
    append(&ref, 20, 5);
    expect_same(&dst, &ref, "cut back and grown");
    expect_unchanged(&src, s0, len, "the fork's cut");
    /* a fork at an earlier token shares only that far */
    kvp_cache early, eref;
    cr_assert_eq(kvp_cache_fork_shared(&early, &src, 31), 0);
    cr_assert_eq(kvp_cache_fork(&eref, &src, 31), 0);
    expect_same(&early, &eref, "a fork at token 31");
    cr_expect_eq(early.heads[0].n_shared, 31);
    free(s0);
    kvp_cache_free(&early);
    kvp_cache_free(&eref);
    kvp_cache_free(&src);
    kvp_cache_free(&ref);
    kvp_cache_free(&dst);
}

/* The source's rows past its block (appended after a first fork) are copied by a second
 * fork, which shares the block part; a block held by the source alone is taken back and
 * made again over the longer prefix. */
Test(shared, a_second_fork_past_the_block_copies_the_rest)
{
    kvp_cache src, a, b, bref;
    make(&src, KVP_KV_Q8_0, 40);
    cr_assert_eq(kvp_cache_fork_shared(&a, &src, 40), 0);
    append(&src, 24, 1);
    cr_assert_eq(kvp_cache_fork_shared(&b, &src, 64), 0);
    cr_assert_eq(kvp_cache_fork(&bref, &src, 64), 0);
    expect_same(&b, &bref, "the second fork");
    cr_expect_eq(b.heads[0].n_shared, 40);
    cr_expect_eq(b.heads[0].n, 64);
    kvp_cache_free(&a);
    kvp_cache_free(&b);
    /* src alone holds its block now: a fork past it shares the whole prefix */
    cr_assert_eq(kvp_cache_fork_shared(&b, &src, 64), 0);
    expect_same(&b, &bref, "the fork after the others went");
    cr_expect_eq(b.heads[0].n_shared, 64);
    kvp_cache_free(&b);
    kvp_cache_free(&bref);
    kvp_cache_free(&src);
}

Test(shared, convert_and_shift_on_a_shared_head_copy_first)
{
    kvp_cache src, ref, dst;
    make(&src, KVP_KV_F32, 120);
    cr_assert_eq(kvp_cache_fork(&ref, &src, 120), 0);
    cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 120), 0);
    size_t len;
    void *s0 = snap(&src, &len);
    cr_assert_eq(kvp_cache_shift(&dst, 4, 128), 0);
    cr_assert_eq(kvp_cache_shift(&ref, 4, 128), 0);
    cr_expect_eq(dst.shifts, 1);
    expect_same(&dst, &ref, "shifted");
    expect_unchanged(&src, s0, len, "the fork's shift");
    kvp_cache_free(&dst);
    kvp_cache_free(&ref);
    cr_assert_eq(kvp_cache_fork(&ref, &src, 120), 0);
    cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 120), 0);
    cr_assert_eq(kvp_cache_convert(&dst, KVP_KV_Q8_0), 0);
    cr_assert_eq(kvp_cache_convert(&ref, KVP_KV_Q8_0), 0);
    expect_same(&dst, &ref, "converted");
    expect_unchanged(&src, s0, len, "the fork's conversion");
    cr_expect_eq(kvp_cache_borrowed_bytes(&dst), 0);
    free(s0);
    kvp_cache_free(&src);
    kvp_cache_free(&ref);
    kvp_cache_free(&dst);
}

/* A sliding-window layer drops a shared head's oldest rows by moving its view along the
 * block: nothing copied, the source unchanged. */
Test(shared, a_window_slides_over_shared_rows_without_copying)
{
    kvp_cache src, ref, dst;
    cr_assert_eq(kvp_cache_init(&src, L, H, D, &ROPE), 0);
    int win[L] = {16, 0};
    cr_assert_eq(kvp_cache_set_windows(&src, win, 10000.0f), 0);
    append(&src, 40, 0);
    cr_assert_eq(kvp_cache_fork(&ref, &src, 40), 0);
    cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 40), 0);
    size_t len;
    void *s0 = snap(&src, &len);
    kvp_cache_slide(&dst, 0, 45);
    kvp_cache_slide(&ref, 0, 45);
    expect_same(&dst, &ref, "slid");
    cr_expect_eq(dst.heads[0].n, 10);
    cr_expect_eq(dst.heads[0].n_shared, 10, "the slide copied rows");
    append(&dst, 20, 4);
    append(&ref, 20, 4);
    kvp_cache_slide(&dst, 0, 60);   /* past every shared row: the view lets the block go */
    kvp_cache_slide(&ref, 0, 60);
    expect_same(&dst, &ref, "slid past the block");
    cr_expect_eq(dst.heads[0].n_shared, 0);
    expect_unchanged(&src, s0, len, "the fork's slides");
    free(s0);
    kvp_cache_free(&src);
    kvp_cache_free(&ref);
    kvp_cache_free(&dst);
}

/* kvp_head_keys over a run that crosses from the shared rows into the private ones. */
Test(shared, rows_read_across_the_shared_boundary)
{
    for (int t = 0; t < 3; t++) {
        kvp_cache src, ref, dst;
        make(&src, TYPES[t], 30);
        cr_assert_eq(kvp_cache_fork(&ref, &src, 30), 0);
        cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 30), 0);
        append(&dst, 10, 6);
        append(&ref, 10, 6);
        static float ta[40 * D], tb[40 * D];
        const kvp_head *hd = &dst.heads[1], *hr = &ref.heads[1];
        const float *a = kvp_head_keys(hd, D, 25, 10, ta), *b = kvp_head_keys(hr, D, 25, 10, tb);
        cr_expect_eq(memcmp(a, b, 10 * D * sizeof *a), 0, "keys across the boundary");
        a = kvp_head_values(hd, D, 0, 40, ta);
        b = kvp_head_values(hr, D, 0, 40, tb);
        cr_expect_eq(memcmp(a, b, 40 * D * sizeof *a), 0, "values across the boundary");
        for (int r = 0; r < 40; r++) {
            cr_expect_eq(kvp_head_pos(hd, r), hr->pos[r]);
            cr_expect_eq(kvp_head_seq(hd, r), hr->seq[r]);
            cr_expect_eq(kvp_head_score(hd, r), hr->score[r]);
            cr_expect_eq(kvp_head_stat(hd, r), hr->stat[r]);
        }
        kvp_cache_free(&src);
        kvp_cache_free(&ref);
        kvp_cache_free(&dst);
    }
}

/* A shared fork's snapshot stands alone: it restores to a private cache that reads the
 * same rows, after the source is gone. */
Test(shared, a_snapshot_of_a_fork_restores_exactly_without_its_source)
{
    kvp_cache src, dst, back;
    make(&src, KVP_KV_Q8_0, 60);
    cr_assert_eq(kvp_cache_fork_shared(&dst, &src, 60), 0);
    append(&dst, 7, 8);
    size_t len;
    void *buf = snap(&dst, &len);
    kvp_cache_free(&src);
    char err[128];
    cr_assert_eq(kvp_cache_deserialize(&back, buf, len, err, sizeof err), 0, "%s", err);
    expect_same(&back, &dst, "restored");
    cr_expect_eq(kvp_cache_borrowed_bytes(&back), 0);
    free(buf);
    kvp_cache_free(&dst);
    kvp_cache_free(&back);
}

/* Holders let go on different threads (sessions end on any worker): the count is atomic,
 * the block freed once (ASan: no double free, no leak). */
static void *free_one(void *arg)
{
    kvp_cache_free(arg);
    return NULL;
}

Test(shared, holders_on_many_threads_free_the_block_once)
{
    enum { N = 8 };
    kvp_cache src, forks[N];
    make(&src, KVP_KV_Q8_0, 64);
    for (int i = 0; i < N; i++)
        cr_assert_eq(kvp_cache_fork_shared(&forks[i], &src, 64 - i), 0);
    cr_expect_eq(atomic_load(&src.heads[0].blk->refs), N + 1);
    pthread_t th[N];
    for (int i = 0; i < N; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, free_one, &forks[i]), 0);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    cr_expect_eq(atomic_load(&src.heads[0].blk->refs), 1);
    cr_expect_eq(kvp_cache_shared_bytes(&src), kvp_cache_borrowed_bytes(&src));
    kvp_cache_free(&src);
}

/* Bad arguments are refused as kvp_cache_fork refuses them. */
Test(shared, a_fork_past_the_source_is_refused)
{
    kvp_cache src, dst;
    make(&src, KVP_KV_F32, 10);
    cr_expect_eq(kvp_cache_fork_shared(&dst, &src, 11), -EINVAL);
    cr_expect_eq(kvp_cache_fork_shared(&dst, &src, -1), -EINVAL);
    cr_expect_null(dst.heads);
    for (int i = 0; i < L * H; i++)
        cr_expect_null(src.heads[i].blk, "a refused fork changed the source");
    kvp_cache_free(&src);
}
