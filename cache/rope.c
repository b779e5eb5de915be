#include "cache/rope.h"

#include <math.h>

void kvp_rope(float *x, int head_dim, double pos, float base)
{
    for (int i = 0; i < head_dim; i += 2) {
        /* float arithmetic exactly as llama2.c's run.c, so greedy output matches it */
        float freq = 1.0f / powf(base, (float)i / (float)head_dim);
        float a = (float)pos * freq;
        float c = cosf(a), s = sinf(a);
        float x0 = x[i], x1 = x[i + 1];
        x[i] = x0 * c - x1 * s;
        x[i + 1] = x0 * s + x1 * c;
    }
}
