#include "cache/rope.h"

#include <math.h>
#include <string.h>

void kvp_rope_table(const kvp_rope *r, float *cs, double pos)
{
    for (int i = 0; i < r->n_rot; i += 2) {
        /* float arithmetic exactly as llama2.c's run.c, so greedy output matches it */
        float freq = 1.0f / powf(r->base, (float)i / (float)r->n_rot);
        if (r->factors)
            freq /= r->factors[i / 2];
        float a = (float)pos * freq;
        cs[i] = cosf(a);
        cs[i + 1] = sinf(a);
    }
}

void kvp_rope_apply(const kvp_rope *r, float *x, const float *cs)
{
    /* pair i is (x[a], x[b]): consecutive floats, or the two halves of the rotated part */
    int half = r->n_rot / 2;
    for (int i = 0; i < half; i++) {
        int a = r->neox ? i : 2 * i, b = r->neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

void kvp_rope_rotate(const kvp_rope *r, float *x, double pos)
{
    float cs[r->n_rot > 0 ? r->n_rot : 1];
    kvp_rope_table(r, cs, pos);
    kvp_rope_apply(r, x, cs);
}

int kvp_rope_same(const kvp_rope *a, const kvp_rope *b)
{
    if (a->n_rot != b->n_rot || a->neox != b->neox || a->base != b->base ||
        !a->factors != !b->factors)
        return 0;
    return !a->factors || !memcmp(a->factors, b->factors, (size_t)(a->n_rot / 2) * sizeof(float));
}
