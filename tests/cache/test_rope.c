#include <criterion/criterion.h>
#include <math.h>

#include "cache/rope.h"

static void randvec(float *x, int n, unsigned seed)
{
    srand(seed);
    for (int i = 0; i < n; i++)
        x[i] = (float)rand() / RAND_MAX - 0.5f;
}

static const float factors8[8] = {1.0f, 1.0f, 1.5f, 2.0f, 4.0f, 8.0f, 8.0f, 32.0f};

/* The variants GGUF models use, over a head of 16 floats. */
static const kvp_rope variants[] = {
    {.n_rot = 16, .neox = 0, .base = 10000.0f},                      /* llama */
    {.n_rot = 16, .neox = 1, .base = 1000000.0f},                    /* qwen2, qwen3 */
    {.n_rot = 8, .neox = 1, .base = 10000.0f},                       /* partial rotary */
    {.n_rot = 8, .neox = 0, .base = 10000.0f},
    {.n_rot = 16, .neox = 0, .base = 500000.0f, .factors = factors8}, /* Llama 3.1 */
    {.n_rot = 16, .neox = 1, .base = 500000.0f, .factors = factors8},
};
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])
#define HD 16

/* RoPE written from its definition, in double: pair i of the rotated part is
 * (x[2i], x[2i+1]) or (x[i], x[i + n_rot/2]); it turns by pos * base^(-2i/n_rot) / f_i. */
static void reference(const kvp_rope *r, const float *x, double pos, double *out)
{
    for (int j = 0; j < HD; j++)
        out[j] = x[j];
    for (int i = 0; i < r->n_rot / 2; i++) {
        int a = r->neox ? i : 2 * i, b = r->neox ? i + r->n_rot / 2 : 2 * i + 1;
        double th = pos * pow(r->base, -2.0 * i / r->n_rot) / (r->factors ? r->factors[i] : 1.0);
        out[a] = x[a] * cos(th) - x[b] * sin(th);
        out[b] = x[a] * sin(th) + x[b] * cos(th);
    }
}

Test(rope, every_variant_matches_the_definition)
{
    for (int v = 0; v < N_VARIANTS; v++) {
        for (int pos = 0; pos < 300; pos += 37) {
            float x[HD];
            double want[HD];
            randvec(x, HD, (unsigned)(v * 1000 + pos + 1));
            reference(&variants[v], x, pos, want);
            kvp_rope_rotate(&variants[v], x, pos);
            for (int j = 0; j < HD; j++)
                cr_assert(fabs(x[j] - want[j]) < 2e-4, "variant %d pos %d dim %d: %f vs %f",
                          v, pos, j, x[j], want[j]);
        }
    }
}

Test(rope, composition_with_negative_offset_in_every_variant)
{
    for (int v = 0; v < N_VARIANTS; v++) {
        float a[HD], b[HD];
        randvec(a, HD, (unsigned)v + 7);
        for (int i = 0; i < HD; i++)
            b[i] = a[i];
        kvp_rope_rotate(&variants[v], a, 300);
        kvp_rope_rotate(&variants[v], a, -290);   /* now at 10 */
        kvp_rope_rotate(&variants[v], b, 10);
        for (int i = 0; i < HD; i++)
            cr_expect(fabsf(a[i] - b[i]) < 1e-4f, "variant %d dim %d: %f vs %f", v, i, a[i], b[i]);
    }
}

Test(rope, preserves_norm_and_position_zero_is_identity)
{
    for (int v = 0; v < N_VARIANTS; v++) {
        float a[HD], b[HD];
        randvec(a, HD, 2);
        for (int i = 0; i < HD; i++)
            b[i] = a[i];
        kvp_rope_rotate(&variants[v], b, 0);
        for (int i = 0; i < HD; i++)
            cr_expect_eq(a[i], b[i]);
        float n0 = 0, n1 = 0;
        for (int i = 0; i < HD; i++)
            n0 += a[i] * a[i];
        kvp_rope_rotate(&variants[v], a, 1234);
        for (int i = 0; i < HD; i++)
            n1 += a[i] * a[i];
        cr_expect(fabsf(n0 - n1) < 1e-5f * n0);
    }
}

Test(rope, rotates_consecutive_pairs)
{
    /* first pair has frequency 1: position 1 rotates (1, 0) to (cos 1, sin 1) */
    kvp_rope r = {.n_rot = 4, .base = 10000.0f};
    float x[4] = {1, 0, 1, 0};
    kvp_rope_rotate(&r, x, 1);
    cr_expect(fabsf(x[0] - cosf(1.0f)) < 1e-6f && fabsf(x[1] - sinf(1.0f)) < 1e-6f);
    float f = 1.0f / powf(10000.0f, 0.5f);
    cr_expect(fabsf(x[2] - cosf(f)) < 1e-6f && fabsf(x[3] - sinf(f)) < 1e-6f);
}

Test(rope, neox_rotates_halves_and_partial_leaves_the_tail)
{
    /* NeoX over 4 of 6 floats: pairs (x0, x2) at frequency 1 and (x1, x3); x4, x5 stay */
    kvp_rope r = {.n_rot = 4, .neox = 1, .base = 10000.0f};
    float x[6] = {1, 0, 0, 0, 5, 6};
    kvp_rope_rotate(&r, x, 1);
    cr_expect(fabsf(x[0] - cosf(1.0f)) < 1e-6f && fabsf(x[2] - sinf(1.0f)) < 1e-6f);
    cr_expect(x[1] == 0 && x[3] == 0 && x[4] == 5 && x[5] == 6);
}

Test(rope, factors_divide_the_frequency)
{
    /* a factor of 2 on pair 0 is the same as half the position for that pair */
    static const float f2[2] = {2.0f, 1.0f};
    kvp_rope with = {.n_rot = 4, .base = 10000.0f, .factors = f2};
    float x[4] = {1, 0, 0, 0};
    kvp_rope_rotate(&with, x, 3);
    cr_expect(fabsf(x[0] - cosf(1.5f)) < 1e-6f && fabsf(x[1] - sinf(1.5f)) < 1e-6f);
}

Test(rope, same_compares_layout_dims_base_and_factors)
{
    static const float other[8] = {1, 1, 1.5f, 2, 4, 8, 8, 31};
    for (int a = 0; a < N_VARIANTS; a++)
        for (int b = 0; b < N_VARIANTS; b++)
            cr_expect_eq(kvp_rope_same(&variants[a], &variants[b]), a == b, "%d vs %d", a, b);
    kvp_rope copy = variants[4];
    copy.factors = other;
    cr_expect(!kvp_rope_same(&copy, &variants[4]));
}
