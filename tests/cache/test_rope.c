#include <criterion/criterion.h>
#include <math.h>

#include "cache/rope.h"

static void randvec(float *x, int n, unsigned seed)
{
    srand(seed);
    for (int i = 0; i < n; i++)
        x[i] = (float)rand() / RAND_MAX - 0.5f;
}

Test(rope, composition_with_negative_offset)
{
    float a[64], b[64];
    randvec(a, 64, 1);
    for (int i = 0; i < 64; i++)
        b[i] = a[i];
    kvp_rope(a, 64, 300, 10000.0f);
    kvp_rope(a, 64, -290, 10000.0f);   /* now at 10 */
    kvp_rope(b, 64, 10, 10000.0f);
    for (int i = 0; i < 64; i++)
        cr_expect(fabsf(a[i] - b[i]) < 1e-4f, "dim %d: %f vs %f", i, a[i], b[i]);
}

Test(rope, preserves_norm_and_position_zero_is_identity)
{
    float a[16], b[16];
    randvec(a, 16, 2);
    for (int i = 0; i < 16; i++)
        b[i] = a[i];
    kvp_rope(b, 16, 0, 10000.0f);
    for (int i = 0; i < 16; i++)
        cr_expect_eq(a[i], b[i]);
    float n0 = 0, n1 = 0;
    for (int i = 0; i < 16; i++)
        n0 += a[i] * a[i];
    kvp_rope(a, 16, 1234, 500000.0f);
    for (int i = 0; i < 16; i++)
        n1 += a[i] * a[i];
    cr_expect(fabsf(n0 - n1) < 1e-5f * n0);
}

Test(rope, rotates_consecutive_pairs)
{
    /* first pair has frequency 1: position 1 rotates (1, 0) to (cos 1, sin 1) */
    float x[4] = {1, 0, 1, 0};
    kvp_rope(x, 4, 1, 10000.0f);
    cr_expect(fabsf(x[0] - cosf(1.0f)) < 1e-6f && fabsf(x[1] - sinf(1.0f)) < 1e-6f);
    float f = 1.0f / powf(10000.0f, 0.5f);
    cr_expect(fabsf(x[2] - cosf(f)) < 1e-6f && fabsf(x[3] - sinf(f)) < 1e-6f);
}
