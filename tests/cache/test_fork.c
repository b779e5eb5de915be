/* kvp_cache_fork: the copy holds exactly the source's rows of tokens before the fork
 * point (evicted ones stay out), byte for byte, and the source is not changed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kvcache.h"
#include "cache/rope.h"

enum { L = 2, H = 3, D = 8 };
static const kvp_rope ROPE = {.n_rot = D, .base = 10000.0f};

static void append(kvp_cache *c, int n)
{
    for (int i = 0; i < L * H; i++) {
        kvp_head *h = &c->heads[i];
        cr_assert_eq(kvp_head_reserve(h, D, h->n + n), 0);
        for (int t = 0; t < n; t++) {
            int r = h->n + t;
            int64_t seq = c->n_seen + t;
            for (int d = 0; d < D; d++) {
                ((float *)h->k)[(size_t)r * D + d] = sinf((float)(seq * 7 + d + i * 13));
                ((float *)h->v)[(size_t)r * D + d] = cosf((float)(seq * 3 + d + i));
            }
            h->pos[r] = c->next_pos + t;
            h->seq[r] = seq;
            h->score[r] = (float)seq;
            h->stat[r] = (float)-seq;
        }
        h->n += n;
    }
    c->next_pos += n;
    c->n_seen += n;
}

/* A source whose heads evicted different rows: head i drops every (i+2)-th row. */
static void make_source(kvp_cache *c, kvp_kv_type type)
{
    cr_assert_eq(kvp_cache_init(c, L, H, D, &ROPE), 0);
    append(c, 100);
    for (int i = 0; i < L * H; i++) {
        kvp_head *h = &c->heads[i];
        int keep[100], k = 0;
        for (int r = 0; r < h->n; r++)
            if (r % (i + 2) != 1)
                keep[k++] = r;
        kvp_cache_keep(c, h, keep, k);
    }
    cr_assert_eq(kvp_cache_convert(c, type), 0);
}

static void *snap(const kvp_cache *c, size_t *len)
{
    void *buf;
    cr_assert_eq(kvp_cache_serialize(c, &buf, len), 0);
    return buf;
}

/* dst's head i equals src's head i's rows with seq < from. */
static void check_prefix(const kvp_cache *dst, const kvp_cache *src, int64_t from)
{
    cr_assert_eq(dst->n_layers, src->n_layers);
    cr_assert_eq(dst->kv_type, src->kv_type);
    cr_assert_eq(dst->n_seen, from);
    size_t rows = 0;
    for (int i = 0; i < L * H; i++) {
        const kvp_head *s = &src->heads[i], *d = &dst->heads[i];
        int n = 0;
        while (n < s->n && s->seq[n] < from)
            n++;
        cr_assert_eq(d->n, n, "head %d: %d rows, want %d", i, d->n, n);
        cr_assert_eq(d->type, s->type);
        size_t rb = kvp_kv_row_bytes(s->type, D);
        if (!n)
            continue;
        cr_assert_eq(memcmp(d->k, s->k, (size_t)n * rb), 0);
        cr_assert_eq(memcmp(d->v, s->v, (size_t)n * rb), 0);
        cr_assert_eq(memcmp(d->pos, s->pos, (size_t)n * sizeof *d->pos), 0);
        cr_assert_eq(memcmp(d->seq, s->seq, (size_t)n * sizeof *d->seq), 0);
        cr_assert_eq(memcmp(d->score, s->score, (size_t)n * sizeof *d->score), 0);
        cr_assert_eq(memcmp(d->stat, s->stat, (size_t)n * sizeof *d->stat), 0);
        for (int r = 0; r < n; r++)
            cr_assert_lt(d->seq[r], from);
        rows += (size_t)n;
    }
    cr_assert_eq(kvp_cache_prefix_bytes(src, from), rows * kvp_cache_row_cost(src->kv_type, D));
    cr_assert_eq(kvp_cache_prefix_bytes(dst, from), kvp_cache_prefix_bytes(src, from));
}

static void fork_case(kvp_kv_type type)
{
    kvp_cache src, dst;
    make_source(&src, type);
    size_t la, lb;
    void *before = snap(&src, &la);
    int64_t points[] = {1, 37, 64, 99, 100};
    for (size_t j = 0; j < sizeof points / sizeof points[0]; j++) {
        cr_assert_eq(kvp_cache_fork(&dst, &src, points[j]), 0);
        check_prefix(&dst, &src, points[j]);
        cr_assert_eq(dst.next_pos, (int)points[j]);   /* no shift: next_pos is the token */
        /* the copy is independent: appending to it does not touch src */
        cr_assert_eq(kvp_cache_convert(&dst, KVP_KV_F32), 0);
        append(&dst, 5);
        kvp_cache_free(&dst);
    }
    void *after = snap(&src, &lb);
    cr_assert_eq(la, lb);
    cr_assert_eq(memcmp(before, after, la), 0, "the source changed");
    free(before);
    free(after);
    kvp_cache_free(&src);
}

Test(cache_fork, f32_rows_and_positions_equal_src_unchanged) { fork_case(KVP_KV_F32); }
Test(cache_fork, f16_rows_equal) { fork_case(KVP_KV_F16); }
Test(cache_fork, q8_0_rows_equal) { fork_case(KVP_KV_Q8_0); }

Test(cache_fork, equals_a_copy_cut_by_drop_newest_after_a_shift)
{
    kvp_cache src, dst, ref;
    make_source(&src, KVP_KV_F32);
    kvp_cache_shift(&src, 4, 96);   /* next_pos 100 -> 72, older positions compressed */
    cr_assert_eq(src.shifts, 1);
    void *buf;
    size_t len;
    char err[128];
    cr_assert_eq(kvp_cache_serialize(&src, &buf, &len), 0);
    cr_assert_eq(kvp_cache_deserialize(&ref, buf, len, err, sizeof err), 0, "%s", err);
    free(buf);
    kvp_cache_drop_newest(&ref, 30);
    cr_assert_eq(kvp_cache_fork(&dst, &src, 70), 0);
    check_prefix(&dst, &ref, 70);
    cr_assert_eq(dst.next_pos, ref.next_pos);
    cr_assert_eq(dst.shifts, src.shifts);
    cr_assert_eq(dst.evicted_rows, src.evicted_rows);
    kvp_cache_free(&dst);
    kvp_cache_free(&ref);
    kvp_cache_free(&src);
}

Test(cache_fork, sliding_windows_are_copied)
{
    kvp_cache src, dst;
    cr_assert_eq(kvp_cache_init(&src, L, H, D, &ROPE), 0);
    int win[L] = {0, 8};
    float f[D / 2] = {1, 2, 3, 4};
    cr_assert_eq(kvp_cache_set_windows(&src, win, 500.0f), 0);
    cr_assert_eq(kvp_cache_set_swa_factors(&src, f), 0);
    append(&src, 40);
    kvp_cache_slide(&src, 1, 40);
    cr_assert_eq(kvp_cache_fork(&dst, &src, 35), 0);
    cr_assert_neq(dst.window, NULL);
    cr_assert_eq(dst.window[1], 8);
    cr_assert_float_eq(dst.rope_base_swa, 500.0f, 0);
    cr_assert_neq(dst.factors_swa, NULL);
    cr_assert_float_eq(dst.factors_swa[3], 4.0f, 0);
    check_prefix(&dst, &src, 35);
    kvp_cache_free(&dst);
    kvp_cache_free(&src);
}

Test(cache_fork, from_zero_is_empty)
{
    kvp_cache src, dst;
    make_source(&src, KVP_KV_F32);
    cr_assert_eq(kvp_cache_fork(&dst, &src, 0), 0);
    cr_assert_eq(kvp_cache_rows(&dst), 0);
    cr_assert_eq(dst.n_seen, 0);
    cr_assert_eq(dst.next_pos, 0);
    cr_assert_eq(kvp_cache_prefix_bytes(&src, 0), 0);
    append(&dst, 3);   /* usable */
    cr_assert_eq(kvp_cache_rows(&dst), 3 * L * H);
    kvp_cache_free(&dst);
    kvp_cache_free(&src);
}

Test(cache_fork, from_past_the_end_or_negative_is_refused)
{
    kvp_cache src, dst;
    make_source(&src, KVP_KV_F32);
    cr_assert_eq(kvp_cache_fork(&dst, &src, 101), -EINVAL);
    cr_assert_eq(dst.heads, NULL);
    cr_assert_eq(kvp_cache_fork(&dst, &src, -1), -EINVAL);
    cr_assert_eq(kvp_cache_fork(&dst, &src, INT64_MAX), -EINVAL);
    kvp_cache_free(&dst);   /* a refused dst is zeroed: freeing it is harmless */
    kvp_cache empty = {0};
    cr_assert_eq(kvp_cache_fork(&dst, &empty, 0), -EINVAL);
    kvp_cache_free(&src);
}
