/* Training the agents: initialisation and the backward pass (offline/agent_train.h). */
#include "offline/agent_train.h"

#include "policy/kvp_agent_net.h"
#include "base/rng.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- init */

/* Uniform in [-a, a), from 24 random bits so the value is exact in float. */
static void fill_uniform(float *x, size_t n, float a, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++) {
        float u = (float)(kvp_splitmix64(rng) >> 40) * (1.0f / 16777216.0f);
        x[i] = (2.0f * u - 1.0f) * a;
    }
}

static void fill_const(float *x, size_t n, float c)
{
    for (size_t i = 0; i < n; i++)
        x[i] = c;
}

static float xavier(int fan_in, int fan_out)
{
    return sqrtf(6.0f / (float)(fan_in + fan_out));
}

void kvp_agent_init(const kvp_agent_arch *a, float *params, uint64_t seed)
{
    kvp_agent_layout l;
    kvp_agent_layout_of(a, &l);
    uint64_t rng = seed;
    int C = 2 * a->P + a->E;
    /* Biases and LayerNorm shifts 0, gains 1; overwrite the weights below. */
    memset(params, 0, l.n * sizeof(float));
    fill_const(params + l.lnk_g, (size_t)a->P, 1.0f);
    fill_const(params + l.lnv_g, (size_t)a->P, 1.0f);
    fill_const(params + l.lne_g, (size_t)a->E, 1.0f);
    fill_const(params + l.ln1_g, (size_t)a->H, 1.0f);
    fill_const(params + l.ln2_g, (size_t)a->H, 1.0f);
    fill_uniform(params + l.wk, (size_t)a->P * (size_t)a->d, xavier(a->d, a->P), &rng);
    fill_uniform(params + l.wv, (size_t)a->P * (size_t)a->d, xavier(a->d, a->P), &rng);
    fill_uniform(params + l.emb, (size_t)a->pmax * (size_t)a->E, sqrtf(3.0f), &rng);
    fill_uniform(params + l.w1, (size_t)a->H * (size_t)C, xavier(C, a->H), &rng);
    fill_uniform(params + l.w2, (size_t)a->H * (size_t)a->H, xavier(a->H, a->H), &rng);
    fill_uniform(params + l.w3, (size_t)a->H, xavier(a->H, 1), &rng);
}
/* ---------------------------------------------------------------- training */

struct kvp_agent_acts {
    kvp_agent_arch arch;
    int n_max, n;
    const float *k, *v;
    const int32_t *pos;
    kvp_agent_fwd_bufs f;
    float *dx;       /* [n][2P+E] */
    float *dh, *dz;  /* [n][H] */
    float *buf;
};

kvp_agent_acts *kvp_agent_acts_new(const kvp_agent_arch *a, int n_max)
{
    assert(n_max >= 1);
    kvp_agent_acts *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    size_t n = (size_t)n_max, C = (size_t)(2 * a->P + a->E), H = (size_t)a->H;
    /* x, xhat, dx: n*C each; rk, rv, re, r1, r2: n each; a, zhat, h (x2), dh, dz: n*H. */
    t->buf = malloc((3 * n * C + 5 * n + 8 * n * H) * sizeof(float));
    if (!t->buf) {
        free(t);
        return NULL;
    }
    t->arch = *a;
    t->n_max = n_max;
    float *p = t->buf;
#define TAKE(field, count) (field = p, p += (count))
    TAKE(t->f.x, n * C);
    TAKE(t->f.xhat, n * C);
    TAKE(t->dx, n * C);
    TAKE(t->f.rk, n);
    TAKE(t->f.rv, n);
    TAKE(t->f.re, n);
    TAKE(t->f.r1, n);
    TAKE(t->f.r2, n);
    TAKE(t->f.a1, n * H);
    TAKE(t->f.z1hat, n * H);
    TAKE(t->f.h1, n * H);
    TAKE(t->f.a2, n * H);
    TAKE(t->f.z2hat, n * H);
    TAKE(t->f.h2, n * H);
    TAKE(t->dh, n * H);
    TAKE(t->dz, n * H);
#undef TAKE
    return t;
}

void kvp_agent_acts_free(kvp_agent_acts *t)
{
    if (!t)
        return;
    free(t->buf);
    free(t);
}

void kvp_agent_forward(kvp_agent_acts *t, const float *params, const float *k,
                       const float *v, const int32_t *pos, int n, float *scores)
{
    assert(n >= 1 && n <= t->n_max);
    t->n = n;
    t->k = k;
    t->v = v;
    t->pos = pos;
    kvp_agent_net_forward(&t->arch, params, k, v, pos, n, &t->f, scores);
}

/* dy (n rows of width m, stride ld) holds dL/d(LN output) on entry and dL/d(LN input) on
 * exit; adds the gain and bias gradients. */
static void ln_back(int n, int m, float *dy, int ld, const float *xhat, const float *rstd,
                    const float *g, float *dg, float *db)
{
    for (int i = 0; i < n; i++) {
        float *d = dy + (size_t)i * ld;
        const float *xh = xhat + (size_t)i * ld;
        float m1 = 0.0f, m2 = 0.0f;
        for (int j = 0; j < m; j++) {
            dg[j] += d[j] * xh[j];
            db[j] += d[j];
            d[j] *= g[j];
            m1 += d[j];
            m2 += d[j] * xh[j];
        }
        m1 /= (float)m;
        m2 /= (float)m;
        for (int j = 0; j < m; j++)
            d[j] = rstd[i] * (d[j] - m1 - xh[j] * m2);
    }
}

/* d (dL/dSiLU(a)) becomes dL/da. */
static void silu_back(size_t n, float *d, const float *a)
{
    for (size_t i = 0; i < n; i++) {
        float s = kvp_agent_sigmoid(a[i]);
        d[i] *= s * (1.0f + a[i] * (1.0f - s));
    }
}

static void col_sums(int n, int m, const float *x, int ld, float *out)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++)
            out[j] += x[(size_t)i * ld + j];
}

/* grad_W += dZ^T In, with dZ [n][m] (stride ldz) and In [n][kd] (stride ldin). */
static void grad_weight(int n, int m, int kd, const float *dz, int ldz, const float *in,
                        int ldin, float *gw)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, kd, n, 1.0f, dz, ldz, in, ldin,
                1.0f, gw, kd);
}

void kvp_agent_backward(kvp_agent_acts *t, const float *params, const float *dscores,
                        float *grad)
{
    const kvp_agent_arch *a = &t->arch;
    const kvp_agent_fwd_bufs *f = &t->f;
    const float *w = params;
    kvp_agent_layout l;
    kvp_agent_layout_of(a, &l);
    int n = t->n, P = a->P, E = a->E, H = a->H, C = 2 * P + E;
    size_t nH = (size_t)n * H;

    /* s = w3.h2 + b3 */
    for (int i = 0; i < n; i++)
        grad[l.b3] += dscores[i];
    cblas_sgemv(CblasRowMajor, CblasTrans, n, H, 1.0f, f->h2, H, dscores, 1, 1.0f,
                grad + l.w3, 1);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < H; j++)
            t->dh[(size_t)i * H + j] = dscores[i] * w[l.w3 + j];

    /* h2 = SiLU(LN(W2 h1 + b2)) */
    silu_back(nH, t->dh, f->a2);
    ln_back(n, H, t->dh, H, f->z2hat, f->r2, w + l.ln2_g, grad + l.ln2_g, grad + l.ln2_b);
    grad_weight(n, H, H, t->dh, H, f->h1, H, grad + l.w2);
    col_sums(n, H, t->dh, H, grad + l.b2);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, H, H, 1.0f, t->dh, H,
                w + l.w2, H, 0.0f, t->dz, H);

    /* h1 = SiLU(LN(W1 x + b1)) */
    silu_back(nH, t->dz, f->a1);
    ln_back(n, H, t->dz, H, f->z1hat, f->r1, w + l.ln1_g, grad + l.ln1_g, grad + l.ln1_b);
    grad_weight(n, H, C, t->dz, H, f->x, C, grad + l.w1);
    col_sums(n, H, t->dz, H, grad + l.b1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, H, 1.0f, t->dz, H,
                w + l.w1, C, 0.0f, t->dx, C);

    /* x = [LN(Wk k + bk); LN(Wv v + bv); LN(Emb[p])] */
    ln_back(n, P, t->dx, C, f->xhat, f->rk, w + l.lnk_g, grad + l.lnk_g, grad + l.lnk_b);
    ln_back(n, P, t->dx + P, C, f->xhat + P, f->rv, w + l.lnv_g, grad + l.lnv_g,
            grad + l.lnv_b);
    ln_back(n, E, t->dx + 2 * P, C, f->xhat + 2 * P, f->re, w + l.lne_g, grad + l.lne_g,
            grad + l.lne_b);
    grad_weight(n, P, a->d, t->dx, C, t->k, a->d, grad + l.wk);
    col_sums(n, P, t->dx, C, grad + l.bk);
    grad_weight(n, P, a->d, t->dx + P, C, t->v, a->d, grad + l.wv);
    col_sums(n, P, t->dx + P, C, grad + l.bv);
    for (int i = 0; i < n; i++) {
        float *ge = grad + l.emb + (size_t)kvp_agent_pos_index(a, t->pos[i]) * E;
        const float *d = t->dx + (size_t)i * C + 2 * P;
        for (int j = 0; j < E; j++)
            ge[j] += d[j];
    }
}
/* ---------------------------------------------------------------- agent sets */

void kvp_agent_set_init(kvp_agent_set *s, uint64_t seed)
{
    for (int l = 0; l < s->n_layers; l++)
        for (int h = 0; h < s->n_kv_heads; h++) {
            /* Independent stream per agent, derived from (seed, agent index). */
            uint64_t st = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(l * s->n_kv_heads + h + 1));
            kvp_agent_init(&s->arch, kvp_agent_set_params(s, l, h), kvp_splitmix64(&st));
        }
}
