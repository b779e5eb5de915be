#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "cache/kvcache.h"
#include "cache/rope.h"

enum { L = 2, H = 3, D = 8 };
static const kvp_rope ROPE = {.n_rot = D, .base = 10000.0f};

/* Appends n rows to every head with values derived from (head, seq), the way the forward
 * pass does. Raw (unrotated) keys are returned through raw_k when given. */
static void append(kvp_cache *c, int n, float *raw_k)
{
    for (int i = 0; i < L * H; i++) {
        kvp_head *h = &c->heads[i];
        cr_assert_eq(kvp_head_reserve(h, D, h->n + n), 0);
        for (int t = 0; t < n; t++) {
            int r = h->n + t;
            int64_t seq = c->n_seen + t;
            for (int d = 0; d < D; d++) {
                float k = sinf((float)(seq * 7 + d + i * 13));
                if (raw_k)
                    raw_k[(size_t)(i * 10000 + seq) * D + d] = k;
                h->k[(size_t)r * D + d] = k;
                h->v[(size_t)r * D + d] = (float)(seq * 100 + d + i);
            }
            kvp_rope_rotate(&c->rope, h->k + (size_t)r * D, c->next_pos + t);
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

Test(kvcache, keep_compacts_in_order_and_frees_memory)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, L, H, D, &ROPE), 0);
    append(&c, 200, NULL);
    size_t before = kvp_cache_bytes(&c);
    size_t row = 2 * D * sizeof(float) + 4 + 8 + 8;
    cr_expect_eq(before % row, 0);
    cr_expect_geq(before, (size_t)L * H * 200 * row);
    kvp_head *h = kvp_cache_head(&c, 1, 2);
    int keep[20];
    for (int i = 0; i < 20; i++)
        keep[i] = i * 10;
    kvp_cache_keep(&c, h, keep, 20);
    cr_expect_eq(h->n, 20);
    for (int i = 0; i < 20; i++) {
        cr_expect_eq(h->seq[i], i * 10);
        cr_expect_eq(h->pos[i], i * 10);
        cr_expect_eq(h->v[(size_t)i * D + 3], (float)(i * 10 * 100 + 3 + 5));
        cr_expect_eq(h->score[i], (float)(i * 10));
    }
    cr_expect_eq(c.evicted_rows, 180);
    cr_expect_lt(h->cap, 64, "capacity not released: %d", h->cap);
    cr_expect_lt(kvp_cache_bytes(&c), before);
    size_t rows = 0, alloc = 0;
    for (int i = 0; i < L * H; i++) {
        rows += c.heads[i].n;
        alloc += c.heads[i].cap;
    }
    cr_expect_eq(kvp_cache_rows(&c), rows);
    cr_expect_eq(kvp_cache_bytes(&c), alloc * row, "bytes must equal what rows allocate");
    size_t per_head = 0;
    for (int i = 0; i < L * H; i++)
        per_head += kvp_head_bytes(&c, &c.heads[i]);
    cr_expect_eq(per_head, kvp_cache_bytes(&c));
    cr_expect_eq(kvp_head_bytes(&c, h), (size_t)h->cap * row);
    cr_expect_eq(kvp_cache_max_rows(&c), 200);
    kvp_cache_free(&c);
}

/* Shifts a cache rotated with `rope` and checks every kept key against its raw key
 * rotated directly to its new position. */
static void check_shift(const kvp_rope *rope)
{
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, L, H, D, rope), 0);
    float *raw = calloc((size_t)L * H * 10000 * D, sizeof *raw);
    append(&c, 500, raw);
    /* uneven heads: head 0 keeps 4 sinks + every 5th + the last 16; head 1 the last 60 */
    int keep[500], k = 0;
    for (int r = 0; r < 500; r++)
        if (r < 4 || r % 5 == 0 || r >= 484)
            keep[k++] = r;
    kvp_cache_keep(&c, &c.heads[0], keep, k);
    int k1 = 0;
    for (int r = 440; r < 500; r++)
        keep[k1++] = r;
    kvp_cache_keep(&c, &c.heads[1], keep, k1);
    const int ctx = 512, target = 384, window = 128;
    kvp_cache_shift(&c, 4, ctx);
    cr_expect_eq(c.next_pos, target);
    cr_expect_eq(c.shifts, 1);
    for (int i = 0; i < L * H; i++) {
        kvp_head *h = &c.heads[i];
        for (int r = 0; r < h->n; r++) {
            int64_t old = h->seq[r];   /* appended at position == seq */
            float want[D];
            memcpy(want, raw + (size_t)(i * 10000 + old) * D, sizeof want);
            kvp_rope_rotate(rope, want, h->pos[r]);
            for (int d = 0; d < D; d++)
                cr_assert(fabsf(h->k[(size_t)r * D + d] - want[d]) < 1e-4f,
                          "head %d row %d dim %d: %f vs %f", i, r, d, h->k[(size_t)r * D + d], want[d]);
            if (old < 4)
                cr_assert_eq(h->pos[r], old, "sinks keep their positions");
            else if (old >= 500 - window)
                cr_assert_eq(target - h->pos[r], 500 - old, "recent rows keep their distance");
            else
                cr_assert(h->pos[r] >= 4 && h->pos[r] < target - window,
                          "old row %lld at %d", (long long)old, h->pos[r]);
            if (r > 0)
                cr_assert_geq(h->pos[r], h->pos[r - 1], "order kept");
        }
    }
    /* every head maps a token to the same position */
    cr_expect_eq(c.heads[0].pos[c.heads[0].n - 1], c.heads[1].pos[c.heads[1].n - 1]);
    cr_expect_eq(c.heads[2].pos[100], 69, "old rows are spread linearly: 4 + 96 * 252 / 368");
    /* a second shift is a no-op until next_pos passes 3/4 of the context again */
    kvp_cache_shift(&c, 4, ctx);
    cr_expect_eq(c.shifts, 1);
    free(raw);
    kvp_cache_free(&c);
}

static const float factors[D / 2] = {1.0f, 2.0f, 8.0f, 32.0f};

Test(kvcache, shift_rerotates_keys_consecutive_pairs) { check_shift(&ROPE); }
Test(kvcache, shift_rerotates_keys_neox)
{
    check_shift(&(kvp_rope){.n_rot = D, .neox = 1, .base = 1000000.0f});
}
Test(kvcache, shift_rerotates_keys_partial_rotary)
{
    check_shift(&(kvp_rope){.n_rot = D / 2, .neox = 1, .base = 10000.0f});
    check_shift(&(kvp_rope){.n_rot = D / 2, .neox = 0, .base = 10000.0f});
}
Test(kvcache, shift_rerotates_keys_with_frequency_factors)
{
    check_shift(&(kvp_rope){.n_rot = D, .base = 500000.0f, .factors = factors});
}

Test(kvcache, serialize_round_trip_is_exact)
{
    kvp_cache c, d;
    float f[D / 2] = {1.0f, 2.0f, 8.0f, 32.0f};
    cr_assert_eq(kvp_cache_init(&c, L, H, D,
                                &(kvp_rope){.n_rot = D, .neox = 1, .base = 500000.0f, .factors = f}), 0);
    f[0] = 99.0f;   /* the cache keeps its own copy */
    append(&c, 37, NULL);
    int keep[3] = {0, 5, 36};
    kvp_cache_keep(&c, &c.heads[4], keep, 3);
    void *buf;
    size_t len;
    char err[128];
    cr_assert_eq(kvp_cache_serialize(&c, &buf, &len), 0);
    cr_assert_eq(kvp_cache_deserialize(&d, buf, len, err, sizeof err), 0, "%s", err);
    cr_expect_eq(d.n_layers, L);
    cr_expect_eq(d.n_kv_heads, H);
    cr_expect_eq(d.head_dim, D);
    cr_expect(kvp_rope_same(&d.rope, &c.rope));
    cr_expect(d.rope.neox && d.rope.factors && d.rope.factors[0] == 1.0f && d.rope.base == 500000.0f);
    cr_expect_eq(d.next_pos, c.next_pos);
    cr_expect_eq(d.n_seen, c.n_seen);
    cr_expect_eq(d.evicted_rows, c.evicted_rows);
    for (int i = 0; i < L * H; i++) {
        kvp_head *a = &c.heads[i], *b = &d.heads[i];
        cr_assert_eq(a->n, b->n);
        cr_expect_eq(memcmp(a->k, b->k, (size_t)a->n * D * 4), 0);
        cr_expect_eq(memcmp(a->v, b->v, (size_t)a->n * D * 4), 0);
        cr_expect_eq(memcmp(a->pos, b->pos, (size_t)a->n * 4), 0);
        cr_expect_eq(memcmp(a->seq, b->seq, (size_t)a->n * 8), 0);
        cr_expect_eq(memcmp(a->score, b->score, (size_t)a->n * 4), 0);
        cr_expect_eq(memcmp(a->stat, b->stat, (size_t)a->n * 4), 0);
    }
    kvp_cache_free(&d);
    free(buf);
    kvp_cache_free(&c);
}

Test(kvcache, deserialize_rejects_truncated_and_altered_buffers)
{
    kvp_cache c, d;
    cr_assert_eq(kvp_cache_init(&c, L, H, D, &ROPE), 0);
    append(&c, 9, NULL);
    unsigned char *buf;
    size_t len;
    char err[128];
    cr_assert_eq(kvp_cache_serialize(&c, (void **)&buf, &len), 0);
    for (size_t cut = 0; cut < len; cut++) {
        err[0] = 0;
        cr_assert_lt(kvp_cache_deserialize(&d, buf, cut, err, sizeof err), 0, "cut %zu accepted", cut);
        cr_assert_neq(err[0], 0);
    }
    for (size_t i = 0; i < len; i += 3) {
        buf[i] ^= 0x10;
        cr_assert_lt(kvp_cache_deserialize(&d, buf, len, err, sizeof err), 0, "flip at %zu accepted", i);
        buf[i] ^= 0x10;
    }
    cr_assert_eq(kvp_cache_deserialize(&d, buf, len, err, sizeof err), 0);
    kvp_cache_free(&d);
    free(buf);
    kvp_cache_free(&c);
}

Test(kvcache, init_rejects_bad_shapes)
{
    kvp_cache c;
    cr_expect_lt(kvp_cache_init(&c, 0, 1, 8, &ROPE), 0);
    cr_expect_lt(kvp_cache_init(&c, 1, 0, 8, &ROPE), 0);
    cr_expect_lt(kvp_cache_init(&c, 1, 1, 7, &ROPE), 0, "rotated dims beyond the head");
    cr_expect_lt(kvp_cache_init(&c, 1, 1, 8, &(kvp_rope){.n_rot = 7, .base = 1e4f}), 0, "odd");
    cr_expect_lt(kvp_cache_init(&c, 1, 1, 8, &(kvp_rope){.n_rot = 0, .base = 1e4f}), 0);
}

/* Snapshots written before the rope description (version 1) read as consecutive pairs
 * over the whole head, without factors. */
Test(kvcache, deserialize_reads_version_1)
{
    kvp_cache c, d;
    cr_assert_eq(kvp_cache_init(&c, L, H, D, &ROPE), 0);
    append(&c, 11, NULL);
    unsigned char *buf;
    size_t len;
    char err[128];
    cr_assert_eq(kvp_cache_serialize(&c, (void **)&buf, &len), 0);
    /* v2 = v1 + i32 n_rot, neox, n_factors after the base (offset 8 + 4 + 3 * 4 + 4) */
    size_t at = 8 + 4 + 3 * 4 + 4;
    uint32_t one = 1;
    memcpy(buf + 8, &one, 4);
    memmove(buf + at, buf + at + 12, len - at - 12);
    len -= 12;
    uint64_t sum = kvp_fnv1a(KVP_FNV1A_INIT, buf, len - 8);
    memcpy(buf + len - 8, &sum, 8);
    cr_assert_eq(kvp_cache_deserialize(&d, buf, len, err, sizeof err), 0, "%s", err);
    cr_expect(kvp_rope_same(&d.rope, &ROPE));
    cr_expect_eq(d.next_pos, 11);
    cr_expect_eq(memcmp(d.heads[5].k, c.heads[5].k, 11 * D * sizeof(float)), 0);
    kvp_cache_free(&d);
    free(buf);
    kvp_cache_free(&c);
}
