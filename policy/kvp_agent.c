/* Sets of agents: allocation and the calibration of their scores. */
#include "policy/kvp_agent.h"

#include "base/errors.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- agent sets */

int kvp_agent_set_alloc(kvp_agent_set *s, int n_layers, int n_kv_heads,
                        const kvp_agent_arch *a, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    int rc;
    if ((rc = kvp_agent_check_range("n_layers", n_layers, KVP_AGENT_MAX_LAYERS, err, errlen)) ||
        (rc = kvp_agent_check_range("n_kv_heads", n_kv_heads, KVP_AGENT_MAX_KV_HEADS, err, errlen)) ||
        (rc = kvp_agent_arch_check(a, err, errlen)))
        return rc;
    size_t np = kvp_agent_n_params(a), agents = (size_t)n_layers * (size_t)n_kv_heads;
    if (np > SIZE_MAX / sizeof(float) / agents) {
        kvp_errorf(err, errlen, 0, "policy of %zu agents x %zu parameters is too large", agents, np);
        return -EINVAL;
    }
    s->params = malloc(agents * np * sizeof(float));
    if (!s->params) {
        kvp_errorf(err, errlen, 0, "out of memory for %zu agents x %zu parameters", agents, np);
        return -ENOMEM;
    }
    s->n_layers = n_layers;
    s->n_kv_heads = n_kv_heads;
    s->arch = *a;
    s->n_params = np;
    return 0;
}

void kvp_agent_set_free(kvp_agent_set *s)
{
    free(s->params);
    free(s->knots);
    free((float *)s->rope.factors);
    free(s->caps);
    memset(s, 0, sizeof *s);
}

int kvp_agent_set_caps(kvp_agent_set *s, int n_budgets, const int *budgets, const int *caps,
                       char *err, size_t errlen)
{
    int *c = NULL;
    if (caps) {
        if (n_budgets < 1 || n_budgets > KVP_AGENT_MAX_CAP_BUDGETS) {
            kvp_errorf(err, errlen, 0, "caps at %d budgets: 1..%d are allowed", n_budgets,
                       KVP_AGENT_MAX_CAP_BUDGETS);
            return -EINVAL;
        }
        for (int b = 0; b < n_budgets; b++)
            if (budgets[b] < 1 || budgets[b] > KVP_AGENT_MAX_CAP ||
                (b && budgets[b] <= budgets[b - 1])) {
                kvp_errorf(err, errlen, 0, "cap budget %d (the %d-th) is out of range (1..%d) or "
                           "not above the one before", budgets[b], b + 1, KVP_AGENT_MAX_CAP);
                return -EINVAL;
            }
        for (int l = 0; l < s->n_layers; l++)
            for (int b = 0; b < n_budgets; b++) {
                int v = caps[(size_t)l * n_budgets + b];
                if (v < 0 || v > KVP_AGENT_MAX_CAP) {
                    kvp_errorf(err, errlen, 0, "layer %d's cap of %d rows at budget %d is out of "
                               "range (0..%d)", l, v, budgets[b], KVP_AGENT_MAX_CAP);
                    return -EINVAL;
                }
            }
        if (!(c = malloc((size_t)s->n_layers * n_budgets * sizeof *c))) {
            kvp_errorf(err, errlen, 0, "out of memory");
            return -ENOMEM;
        }
        memcpy(c, caps, (size_t)s->n_layers * n_budgets * sizeof *c);
    }
    free(s->caps);
    s->caps = c;
    s->n_cap_budgets = c ? n_budgets : 0;
    memset(s->cap_budgets, 0, sizeof s->cap_budgets);
    if (c)
        memcpy(s->cap_budgets, budgets, (size_t)n_budgets * sizeof *budgets);
    return 0;
}

int kvp_agent_set_cap(const kvp_agent_set *s, int layer, int budget, int seq_len)
{
    int j = -1;
    for (int b = 0; s->caps && b < s->n_cap_budgets && s->cap_budgets[b] <= budget; b++)
        j = b;
    int v = j >= 0 && layer >= 0 && layer < s->n_layers ? s->caps[(size_t)layer * s->n_cap_budgets + j] : 0;
    return v > 0 ? v : KVP_AGENT_CAP_DEFAULT(seq_len);
}

int kvp_agent_set_rope(kvp_agent_set *s, const kvp_rope *r, char *err, size_t errlen)
{
    if (r->n_rot < 2 || r->n_rot > s->arch.d || r->n_rot % 2 || !isfinite(r->base) ||
        !(r->base > 0.0f) || (r->neox != 0 && r->neox != 1)) {
        kvp_errorf(err, errlen, 0, "RoPE of %d rotated dims (layout %d, base %g) is not one of "
                   "head_dim %d: the dims must be even and 2..head_dim, the base above 0",
                   r->n_rot, r->neox, (double)r->base, s->arch.d);
        return -EINVAL;
    }
    for (int i = 0; r->factors && i < r->n_rot / 2; i++)
        if (!isfinite(r->factors[i]) || !(r->factors[i] > 0.0f)) {
            kvp_errorf(err, errlen, 0, "RoPE frequency factor %d is %g (must be finite and > 0)",
                       i, (double)r->factors[i]);
            return -EINVAL;
        }
    float *f = NULL;
    if (r->factors) {
        if (!(f = malloc((size_t)(r->n_rot / 2) * sizeof *f))) {
            kvp_errorf(err, errlen, 0, "out of memory");
            return -ENOMEM;
        }
        memcpy(f, r->factors, (size_t)(r->n_rot / 2) * sizeof *f);
    }
    free((float *)s->rope.factors);
    s->rope = *r;
    s->rope.factors = f;
    return 0;
}

/* ---------------------------------------------------------------- calibration */

int kvp_agent_check_knots(int n_knots, const float *x, const float *y, int layer, int kvh,
                          char *err, size_t errlen)
{
    for (int i = 0; i < n_knots; i++) {
        const char *bad = !isfinite(x[i]) || !isfinite(y[i]) ? "is not finite"
                          : i && x[i] <= x[i - 1]            ? "score is not above the previous"
                          : i && y[i] < y[i - 1]             ? "value is below the previous"
                                                             : NULL;
        if (bad) {
            kvp_errorf(err, errlen, 0, "calibration of agent (layer %d, KV head %d): knot %d %s",
                       layer, kvh, i, bad);
            return -EINVAL;
        }
    }
    return 0;
}

int kvp_agent_set_calibration(kvp_agent_set *s, int n_knots, const float *knots, char *err,
                              size_t errlen)
{
    if (n_knots < 0 || n_knots > KVP_CALIBRATION_MAX_KNOTS || n_knots == 1) {
        kvp_errorf(err, errlen, 0, "calibration of %d knots (0, or 2..%d)", n_knots,
                   KVP_CALIBRATION_MAX_KNOTS);
        return -EINVAL;
    }
    size_t nf = (size_t)s->n_layers * (size_t)s->n_kv_heads * 2u * (size_t)n_knots;
    for (int l = 0; l < s->n_layers; l++)
        for (int h = 0; h < s->n_kv_heads; h++) {
            const float *x = knots + ((size_t)l * (size_t)s->n_kv_heads + (size_t)h) * 2u * (size_t)n_knots;
            int rc = kvp_agent_check_knots(n_knots, x, x + n_knots, l, h, err, errlen);
            if (rc)
                return rc;
        }
    float *copy = NULL;
    if (n_knots && !(copy = malloc(nf * sizeof *copy))) {
        kvp_errorf(err, errlen, 0, "out of memory");
        return -ENOMEM;
    }
    if (n_knots)
        memcpy(copy, knots, nf * sizeof *copy);
    free(s->knots);
    s->knots = copy;
    s->n_knots = n_knots;
    return 0;
}

void kvp_agent_calibrate(const kvp_agent_set *s, int layer, int kvh, const float *in, int n,
                         float *out)
{
    if (n <= 0)
        return;
    if (!s->n_knots) {
        memmove(out, in, (size_t)n * sizeof *out);
        return;
    }
    int K = s->n_knots;
    const float *x = kvp_agent_set_knots(s, layer, kvh), *y = x + K;
    for (int i = 0; i < n; i++) {
        float v = in[i];
        if (!isfinite(v)) {
            out[i] = v;
            continue;
        }
        /* the first knot at or above v (binary search) */
        int lo = 0, hi = K;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (x[mid] < v)
                lo = mid + 1;
            else
                hi = mid;
        }
        out[i] = lo == 0 ? y[0] : lo == K ? y[K - 1]
                 : y[lo - 1] + (y[lo] - y[lo - 1]) * ((v - x[lo - 1]) / (x[lo] - x[lo - 1]));
    }
}
