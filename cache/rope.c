#include "cache/rope.h"

#include <math.h>

void kvp_rope_table(float *cs, int head_dim, double pos, float base)
{
    for (int i = 0; i < head_dim; i += 2) {
        /* float arithmetic exactly as llama2.c's run.c, so greedy output matches it */
        float freq = 1.0f / powf(base, (float)i / (float)head_dim);
        float a = (float)pos * freq;
        cs[i] = cosf(a);
        cs[i + 1] = sinf(a);
    }
}

void kvp_rope_apply(float *x, int head_dim, const float *cs)
{
    for (int i = 0; i < head_dim; i += 2) {
        float x0 = x[i], x1 = x[i + 1];
        x[i] = x0 * cs[i] - x1 * cs[i + 1];
        x[i + 1] = x0 * cs[i + 1] + x1 * cs[i];
    }
}

void kvp_rope(float *x, int head_dim, double pos, float base)
{
    float cs[head_dim];
    kvp_rope_table(cs, head_dim, pos, base);
    kvp_rope_apply(x, head_dim, cs);
}
