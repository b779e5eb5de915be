#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"
#include "base/half.h"
#include "base/rng.h"
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
                ((float *)h->k)[(size_t)r * D + d] = k;
                ((float *)h->v)[(size_t)r * D + d] = (float)(seq * 100 + d + i);
            }
            kvp_rope_rotate(&c->rope, (float *)h->k + (size_t)r * D, c->next_pos + t);
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
        cr_expect_eq(((float *)h->v)[(size_t)i * D + 3], (float)(i * 10 * 100 + 3 + 5));
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
                cr_assert(fabsf(((float *)h->k)[(size_t)r * D + d] - want[d]) < 1e-4f,
                          "head %d row %d dim %d: %f vs %f", i, r, d, ((float *)h->k)[(size_t)r * D + d], want[d]);
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

/* Rewrites a version-3 buffer of an f32 cache without rope factors as version 2 wrote
 * it: no kv_type after the counters (offset 8 + 4 + 3*4 + 4 + 3*4 + 4 + 3*8). */
static void to_version_2(unsigned char *buf, size_t *len)
{
    size_t at = 8 + 4 + 3 * 4 + 4 + 3 * 4 + 4 + 3 * 8;
    uint32_t two = 2, type;
    memcpy(&type, buf + at, 4);
    cr_assert_eq(type, KVP_KV_F32);
    memcpy(buf + 8, &two, 4);
    memmove(buf + at, buf + at + 4, *len - at - 4);
    *len -= 4;
    uint64_t sum = kvp_fnv1a(KVP_FNV1A_INIT, buf, *len - 8);
    memcpy(buf + *len - 8, &sum, 8);
}

Test(kvcache, deserialize_reads_version_2_as_f32_rows)
{
    kvp_cache c, d;
    cr_assert_eq(kvp_cache_init(&c, L, H, D, &ROPE), 0);
    append(&c, 13, NULL);
    unsigned char *buf;
    size_t len;
    char err[128];
    cr_assert_eq(kvp_cache_serialize(&c, (void **)&buf, &len), 0);
    to_version_2(buf, &len);
    cr_assert_eq(kvp_cache_deserialize(&d, buf, len, err, sizeof err), 0, "%s", err);
    cr_expect_eq(d.kv_type, KVP_KV_F32);
    for (int i = 0; i < L * H; i++) {
        cr_assert_eq(d.heads[i].n, 13);
        cr_expect_eq(memcmp(d.heads[i].k, c.heads[i].k, 13 * D * sizeof(float)), 0);
        cr_expect_eq(memcmp(d.heads[i].v, c.heads[i].v, 13 * D * sizeof(float)), 0);
    }
    kvp_cache_free(&d);
    free(buf);
    kvp_cache_free(&c);
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
    to_version_2(buf, &len);
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

/* ---- stored row types ------------------------------------------------------------- */

static const kvp_kv_type TYPES[] = {KVP_KV_F32, KVP_KV_F16, KVP_KV_Q8_0};

/* worst error of a decoded row against x, relative to the row's largest |x| */
static float row_error(kvp_kv_type t, const float *x, int n)
{
    unsigned char row[4 * 80 + 16];
    float y[80], amax = 0.0f, worst = 0.0f;
    kvp_kv_row_store(t, row, x, n);
    kvp_kv_row_load(t, y, row, n);
    for (int i = 0; i < n; i++) {
        amax = fmaxf(amax, fabsf(x[i]));
        worst = fmaxf(worst, fabsf(y[i] - x[i]));
    }
    return amax > 0.0f ? worst / amax : worst;
}

Test(kvrow, rows_round_trip_within_their_precision)
{
    float x[80];
    for (int n = 1; n <= 80; n++) {
        for (int i = 0; i < n; i++)
            x[i] = sinf((float)(i * 3 + n)) * (i % 7 == 0 ? 40.0f : 1.0f);
        cr_expect_eq(row_error(KVP_KV_F32, x, n), 0.0f);
        cr_expect_leq(row_error(KVP_KV_F16, x, n), 1.0f / 1024, "f16 n=%d", n);
        /* q8_0: half a step of at most max|x| / (127 - KVP_KV_Q8_SEARCH) per block, the f16
         * scale's rounding on top */
        cr_expect_leq(row_error(KVP_KV_Q8_0, x, n), 0.5f / (127 - KVP_KV_Q8_SEARCH) * 1.01f,
                      "q8_0 n=%d", n);
    }
    cr_expect_eq(kvp_kv_row_bytes(KVP_KV_Q8_0, 8), 8 + 2);
    cr_expect_eq(kvp_kv_row_bytes(KVP_KV_Q8_0, 64), 64 + 4);
    cr_expect_eq(kvp_kv_row_bytes(KVP_KV_Q8_0, 80), 80 + 6);
    cr_expect_eq(kvp_kv_row_bytes(KVP_KV_F16, 64), 128);
    /* a zero block stays zero (no division by a zero scale) */
    float z[40] = {0}, back[40];
    unsigned char row[64];
    z[35] = 1.0f;
    kvp_kv_row_store(KVP_KV_Q8_0, row, z, 40);
    kvp_kv_row_load(KVP_KV_Q8_0, back, row, 40);
    for (int i = 0; i < 32; i++)
        cr_expect_eq(back[i], 0.0f, "element %d: %f", i, back[i]);
    cr_expect(fabsf(back[35] - 1.0f) < 1e-3f);
}

/* sum |x| (x - y)^2: the error the q8_0 scale search minimizes */
static float weighted_error(const float *x, const float *y, int n)
{
    float err = 0.0f;
    for (int i = 0; i < n; i++)
        err += fabsf(x[i]) * (x[i] - y[i]) * (x[i] - y[i]);
    return err;
}

/* ggml's Q8_0 rule on one block, decoded: d = max|x| / 127 rounded to f16, codes against it */
static void ggml_q8(const float *x, float *y, int n)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float d = kvp_f16_to_f32(kvp_f32_to_f16(amax / 127.0f));
    for (int i = 0; i < n; i++) {
        float c = d > 0.0f ? rintf(x[i] / d) : 0.0f;
        y[i] = fminf(127.0f, fmaxf(-127.0f, c)) * d;
    }
}

/* The q8_0 scale search: never more error than ggml's max / 127, less on most blocks, and
 * the block's largest number is never clipped (its code is 127 - k, up to the f16
 * rounding of the scale). */
Test(kvrow, q8_0_scale_search_never_worse_than_max_over_127)
{
    uint64_t s = 7;
    int better = 0, blocks = 0;
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + trial % KVP_KV_BLOCK;
        float x[KVP_KV_BLOCK], y[KVP_KV_BLOCK], g[KVP_KV_BLOCK], amax = 0.0f;
        int big = 0;
        unsigned char row[KVP_KV_BLOCK + 2];
        for (int i = 0; i < n; i++) {
            x[i] = (float)((int64_t)(kvp_splitmix64(&s) >> 11) - (1ll << 52)) / (float)(1ll << 52);
            x[i] *= trial % 3 == 0 ? 30.0f : 1.0f;
            if (fabsf(x[i]) > amax) {
                amax = fabsf(x[i]);
                big = i;
            }
        }
        kvp_kv_row_store(KVP_KV_Q8_0, row, x, n);
        kvp_kv_row_load(KVP_KV_Q8_0, y, row, n);
        ggml_q8(x, g, n);
        cr_expect_leq(fabsf(y[big] - x[big]), amax * 1e-3f, "n=%d largest %g -> %g", n, x[big], y[big]);
        float err = weighted_error(x, y, n), ref = weighted_error(x, g, n);
        cr_expect_leq(err, ref * (1.0f + 1e-5f), "n=%d: %g against max / 127's %g", n, err, ref);
        better += err < ref * 0.99f;
        blocks++;
    }
    cr_expect_gt(better, blocks / 2, "the search lowered the error of %d blocks of %d", better, blocks);
}

Test(kvrow, kernels_equal_decode_then_f32)
{
    unsigned char row[4 * 72];
    float x[72], q[72], y[72], dec[72];
    for (int n = 1; n <= 72; n++)
        for (unsigned t = 0; t < 3; t++) {
            for (int i = 0; i < n; i++) {
                x[i] = cosf((float)(i * 5 + n + (int)t));
                q[i] = sinf((float)(i + 2 * n));
                y[i] = 0.5f;
            }
            kvp_kv_row_store(TYPES[t], row, x, n);
            kvp_kv_row_load(TYPES[t], dec, row, n);
            double want = 0.0;
            for (int i = 0; i < n; i++)
                want += (double)dec[i] * q[i];
            cr_expect(fabs(kvp_kv_row_dot(TYPES[t], row, q, n) - want) < 1e-5 * (1 + fabs(want)),
                      "%s n=%d", kvp_kv_type_name(TYPES[t]), n);
            kvp_kv_row_axpy(TYPES[t], y, -2.0f, row, n);
            for (int i = 0; i < n; i++)
                cr_expect(fabsf(y[i] - (0.5f - 2.0f * dec[i])) < 1e-6f);
        }
}

Test(kvrow, type_names_parse_and_refuse_others)
{
    for (unsigned t = 0; t < 3; t++)
        cr_expect_eq(kvp_kv_type_parse(kvp_kv_type_name(TYPES[t])), (int)TYPES[t]);
    const char *bad[] = {"", "F32", "q8", "q4_0", "f32 ", "bf16", NULL};
    for (int i = 0; bad[i]; i++)
        cr_expect_eq(kvp_kv_type_parse(bad[i]), -1, "'%s' accepted", bad[i]);
    cr_expect_eq(kvp_kv_type_parse(NULL), -1);
}

/* Every type: bytes count the stored rows, keep and shift work on them, a snapshot reads
 * back byte for byte and as its own type, and converting re-encodes (never misreads). */
Test(kvcache, every_kv_type_counts_keeps_shifts_and_round_trips)
{
    for (unsigned t = 0; t < 3; t++) {
        kvp_cache f, c, d;
        cr_assert_eq(kvp_cache_init(&f, L, H, D, &ROPE), 0);
        cr_assert_eq(kvp_cache_init(&c, L, H, D, &ROPE), 0);
        append(&f, 120, NULL);
        append(&c, 120, NULL);
        cr_assert_eq(kvp_cache_convert(&c, TYPES[t]), 0);
        cr_expect_eq(c.kv_type, TYPES[t]);
        size_t row = kvp_cache_row_cost(TYPES[t], D);
        cr_expect_eq(row, 2 * kvp_kv_row_bytes(TYPES[t], D) + 4 + 8 + 4 + 4);
        cr_expect_eq(kvp_cache_bytes(&c), kvp_cache_rows(&c) / 120 * c.heads[0].cap * row);
        if (TYPES[t] == KVP_KV_Q8_0)
            cr_expect_lt(kvp_cache_bytes(&c) * 2, kvp_cache_bytes(&f), "q8_0 rows under half of f32");
        /* keep and shift on both; the typed cache stays the f32 one within its precision */
        int keep[30];
        for (int i = 0; i < 30; i++)
            keep[i] = i * 4;
        for (int i = 0; i < L * H; i++) {
            kvp_cache_keep(&f, &f.heads[i], keep, 30);
            kvp_cache_keep(&c, &c.heads[i], keep, 30);
        }
        f.next_pos = c.next_pos = 4000;
        kvp_cache_shift(&f, 4, 1024);
        kvp_cache_shift(&c, 4, 1024);
        float tmp[D], tol = TYPES[t] == KVP_KV_F32 ? 0.0f : TYPES[t] == KVP_KV_F16 ? 2e-3f : 1.5e-2f;
        for (int i = 0; i < L * H; i++) {
            cr_assert_eq(c.heads[i].n, 30);
            for (int r = 0; r < 30; r++) {
                cr_expect_eq(c.heads[i].pos[r], f.heads[i].pos[r]);
                const float *a = kvp_head_keys(&c.heads[i], D, r, 1, tmp);
                const float *b = (const float *)f.heads[i].k + (size_t)r * D;
                for (int j = 0; j < D; j++)
                    cr_assert_leq(fabsf(a[j] - b[j]), tol, "%s head %d row %d", kvp_kv_type_name(TYPES[t]), i, r);
            }
        }
        void *buf;
        size_t len;
        char err[128];
        cr_assert_eq(kvp_cache_serialize(&c, &buf, &len), 0);
        cr_assert_eq(kvp_cache_deserialize(&d, buf, len, err, sizeof err), 0, "%s", err);
        cr_expect_eq(d.kv_type, TYPES[t]);
        size_t rb = kvp_kv_row_bytes(TYPES[t], D);
        for (int i = 0; i < L * H; i++) {
            cr_assert_eq(d.heads[i].n, 30);
            cr_expect_eq(d.heads[i].type, TYPES[t]);
            cr_expect_eq(memcmp(d.heads[i].k, c.heads[i].k, 30 * rb), 0);
            cr_expect_eq(memcmp(d.heads[i].v, c.heads[i].v, 30 * rb), 0);
        }
        /* loaded as another type: converted, every value within that type's precision */
        for (unsigned u = 0; u < 3; u++) {
            kvp_cache e;
            cr_assert_eq(kvp_cache_deserialize(&e, buf, len, err, sizeof err), 0, "%s", err);
            cr_assert_eq(kvp_cache_convert(&e, TYPES[u]), 0);
            cr_expect_eq(kvp_cache_bytes(&e), kvp_cache_rows(&e) / 30 * e.heads[0].cap *
                                                  kvp_cache_row_cost(TYPES[u], D));
            float tu = TYPES[u] == KVP_KV_Q8_0 ? 1.5e-2f : TYPES[u] == KVP_KV_F16 ? 2e-3f : 0.0f;
            for (int i = 0; i < L * H; i++)
                for (int r = 0; r < 30; r++) {
                    float x[D], y[D];
                    kvp_kv_row_load(TYPES[t], x, (const unsigned char *)c.heads[i].v + r * rb, D);
                    const float *got = kvp_head_values(&e.heads[i], D, r, 1, y);
                    for (int j = 0; j < D; j++)
                        cr_assert_leq(fabsf(got[j] - x[j]), tu * fmaxf(1.0f, fabsf(x[j])),
                                      "%s -> %s", kvp_kv_type_name(TYPES[t]), kvp_kv_type_name(TYPES[u]));
                }
            kvp_cache_free(&e);
        }
        /* an unknown kv_type in the buffer is refused by name */
        kvp_cache d2;
        unsigned char *b = buf;
        uint32_t bad = 7;
        memcpy(b + 8 + 4 + 12 + 4 + 12 + 4 + 24, &bad, 4);
        uint64_t sum = kvp_fnv1a(KVP_FNV1A_INIT, b, len - 8);
        memcpy(b + len - 8, &sum, 8);
        cr_expect_lt(kvp_cache_deserialize(&d2, buf, len, err, sizeof err), 0);
        cr_expect(strstr(err, "kv_type"), "%s", err);
        cr_expect_eq(kvp_cache_convert(&c, (kvp_kv_type)3), -EINVAL);
        free(buf);
        kvp_cache_free(&d);
        kvp_cache_free(&c);
        kvp_cache_free(&f);
    }
}
