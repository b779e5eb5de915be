#include "base/fileio.h"
#include "policy/kvp_agent.h"

#include "base/bytes.h"
#include "base/checksum.h"
#include "base/rng.h"
#include "base/errors.h"

#include <assert.h>
#include <cblas.h>
#include <stdatomic.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Parameters are stored as raw host floats; the file format is little-endian IEEE f32. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "policy files hold little-endian f32: add byte swapping for this host");
_Static_assert(sizeof(float) == 4, "f32 parameters");
_Static_assert(sizeof(size_t) >= 8, "parameter counts up to 2^42 need a 64-bit size_t");

#define LN_EPS 1e-5f

/* ---------------------------------------------------------------- sizes and layout */

#define MAX_D 4096
#define MAX_WIDTH 65536
#define MAX_PMAX (1 << 24)
#define MAX_LAYERS 4096
#define MAX_KV_HEADS 4096

static int check_range(const char *what, int64_t v, int64_t max, char *err, size_t errlen)
{
    if (v >= 1 && v <= max)
        return 0;
    kvp_errorf(err, errlen, 0, "%s = %lld is out of range [1, %lld]", what, (long long)v,
           (long long)max);
    return -EINVAL;
}

int kvp_agent_arch_check(const kvp_agent_arch *a, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_range("head_dim", a->d, MAX_D, err, errlen)) ||
        (rc = check_range("width P", a->P, MAX_WIDTH, err, errlen)) ||
        (rc = check_range("position dim E", a->E, MAX_WIDTH, err, errlen)) ||
        (rc = check_range("hidden H", a->H, MAX_WIDTH, err, errlen)) ||
        (rc = check_range("position table size pmax", a->pmax, MAX_PMAX, err, errlen)))
        return rc;
    return 0;
}

/* With the limits above every count stays below 2^42. */
void kvp_agent_layout_of(const kvp_agent_arch *a, kvp_agent_layout *l)
{
    size_t d = (size_t)a->d, P = (size_t)a->P, E = (size_t)a->E, H = (size_t)a->H;
    size_t C = 2 * P + E, o = 0;
    l->wk = o;    o += P * d;
    l->bk = o;    o += P;
    l->lnk_g = o; o += P;
    l->lnk_b = o; o += P;
    l->wv = o;    o += P * d;
    l->bv = o;    o += P;
    l->lnv_g = o; o += P;
    l->lnv_b = o; o += P;
    l->emb = o;   o += (size_t)a->pmax * E;
    l->lne_g = o; o += E;
    l->lne_b = o; o += E;
    l->w1 = o;    o += H * C;
    l->b1 = o;    o += H;
    l->ln1_g = o; o += H;
    l->ln1_b = o; o += H;
    l->w2 = o;    o += H * H;
    l->b2 = o;    o += H;
    l->ln2_g = o; o += H;
    l->ln2_b = o; o += H;
    l->w3 = o;    o += H;
    l->b3 = o;    o += 1;
    l->n = o;
}

size_t kvp_agent_n_params(const kvp_agent_arch *a)
{
    kvp_agent_layout l;
    kvp_agent_layout_of(a, &l);
    return l.n;
}

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

/* ---------------------------------------------------------------- forward */

static int pos_index(const kvp_agent_arch *a, int32_t p)
{
    return p < 0 ? 0 : p >= a->pmax ? a->pmax - 1 : (int)p;
}

/* out[i][0..m) = W in[i] + b for n rows; W is [m][kd] row-major. One row goes through
 * gemv, several through one sgemm. */
static void affine(int n, int m, int kd, const float *W, const float *b, const float *in,
                   int ldin, float *out, int ldout)
{
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * ldout, b, (size_t)m * sizeof(float));
    if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, m, kd, 1.0f, W, kd, in, 1, 1.0f, out, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, kd, 1.0f, in, ldin, W, kd,
                    1.0f, out, ldout);
}

/* LayerNorm of n rows of width m, in place: y = g * xhat + b. Keeps xhat and 1/std
 * when the pointers are set (training). */
static void ln_rows(int n, int m, float *y, int ldy, const float *g, const float *b,
                    float *xhat, int ldx, float *rstd)
{
    for (int i = 0; i < n; i++) {
        float *r = y + (size_t)i * ldy;
        float mean = 0.0f, var = 0.0f;
        for (int j = 0; j < m; j++)
            mean += r[j];
        mean /= (float)m;
        for (int j = 0; j < m; j++)
            var += (r[j] - mean) * (r[j] - mean);
        float rs = 1.0f / sqrtf(var / (float)m + LN_EPS);
        for (int j = 0; j < m; j++) {
            float xh = (r[j] - mean) * rs;
            if (xhat)
                xhat[(size_t)i * ldx + j] = xh;
            r[j] = g[j] * xh + b[j];
        }
        if (rstd)
            rstd[i] = rs;
    }
}

static float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* Activation buffers of one forward pass; the x*hat / r* ones are NULL when scoring. */
typedef struct fwd_bufs {
    float *x;        /* [n][2P+E] = [kh; vh; ph] */
    float *xhat;     /* [n][2P+E] normalised before gain/bias */
    float *rk, *rv, *re;
    float *a1, *z1hat, *r1, *h1;   /* [n][H]: LN output, its xhat, 1/std, SiLU(a1) */
    float *a2, *z2hat, *r2, *h2;
} fwd_bufs;

static void forward(const kvp_agent_arch *a, const float *w, const float *k, const float *v,
                    const int32_t *pos, int n, const fwd_bufs *f, float *scores)
{
    kvp_agent_layout l;
    kvp_agent_layout_of(a, &l);
    int P = a->P, E = a->E, H = a->H, C = 2 * P + E;
    float *xh = f->xhat;

    affine(n, P, a->d, w + l.wk, w + l.bk, k, a->d, f->x, C);
    ln_rows(n, P, f->x, C, w + l.lnk_g, w + l.lnk_b, xh, C, f->rk);
    affine(n, P, a->d, w + l.wv, w + l.bv, v, a->d, f->x + P, C);
    ln_rows(n, P, f->x + P, C, w + l.lnv_g, w + l.lnv_b, xh ? xh + P : NULL, C, f->rv);
    for (int i = 0; i < n; i++)
        memcpy(f->x + (size_t)i * C + 2 * P, w + l.emb + (size_t)pos_index(a, pos[i]) * E,
               (size_t)E * sizeof(float));
    ln_rows(n, E, f->x + 2 * P, C, w + l.lne_g, w + l.lne_b, xh ? xh + 2 * P : NULL, C, f->re);

    affine(n, H, C, w + l.w1, w + l.b1, f->x, C, f->a1, H);
    ln_rows(n, H, f->a1, H, w + l.ln1_g, w + l.ln1_b, f->z1hat, H, f->r1);
    for (size_t i = 0; i < (size_t)n * H; i++)
        f->h1[i] = f->a1[i] * sigmoid(f->a1[i]);
    affine(n, H, H, w + l.w2, w + l.b2, f->h1, H, f->a2, H);
    ln_rows(n, H, f->a2, H, w + l.ln2_g, w + l.ln2_b, f->z2hat, H, f->r2);
    for (size_t i = 0; i < (size_t)n * H; i++)
        f->h2[i] = f->a2[i] * sigmoid(f->a2[i]);

    if (n == 1)
        scores[0] = cblas_sdot(H, f->h2, 1, w + l.w3, 1);
    else
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n, H, 1.0f, f->h2, H, w + l.w3, 1, 0.0f,
                    scores, 1);
    for (int i = 0; i < n; i++)
        scores[i] += w[l.b3];
}

size_t kvp_agent_score_work(const kvp_agent_arch *a, int n)
{
    return (size_t)n * (size_t)(2 * a->P + a->E + 2 * a->H);
}

void kvp_agent_score(const kvp_agent_arch *a, const float *params, const float *k,
                     const float *v, const int32_t *pos, int n, float *scores, float *work)
{
    if (n <= 0)
        return;
    size_t C = (size_t)(2 * a->P + a->E), H = (size_t)a->H;
    /* SiLU in place: h1 aliases a1, h2 aliases a2. */
    fwd_bufs f = {.x = work, .a1 = work + (size_t)n * C};
    f.h1 = f.a1;
    f.a2 = f.a1 + (size_t)n * H;
    f.h2 = f.a2;
    forward(a, params, k, v, pos, n, &f, scores);
}

/* ---------------------------------------------------------------- training */

struct kvp_agent_acts {
    kvp_agent_arch arch;
    int n_max, n;
    const float *k, *v;
    const int32_t *pos;
    fwd_bufs f;
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
    forward(&t->arch, params, k, v, pos, n, &t->f, scores);
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
        float s = sigmoid(a[i]);
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
    const fwd_bufs *f = &t->f;
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
        float *ge = grad + l.emb + (size_t)pos_index(a, t->pos[i]) * E;
        const float *d = t->dx + (size_t)i * C + 2 * P;
        for (int j = 0; j < E; j++)
            ge[j] += d[j];
    }
}

/* ---------------------------------------------------------------- agent sets */

int kvp_agent_set_alloc(kvp_agent_set *s, int n_layers, int n_kv_heads,
                        const kvp_agent_arch *a, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    int rc;
    if ((rc = check_range("n_layers", n_layers, MAX_LAYERS, err, errlen)) ||
        (rc = check_range("n_kv_heads", n_kv_heads, MAX_KV_HEADS, err, errlen)) ||
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
    memset(s, 0, sizeof *s);
}

void kvp_agent_set_init(kvp_agent_set *s, uint64_t seed)
{
    for (int l = 0; l < s->n_layers; l++)
        for (int h = 0; h < s->n_kv_heads; h++) {
            /* Independent stream per agent, derived from (seed, agent index). */
            uint64_t st = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(l * s->n_kv_heads + h + 1));
            kvp_agent_init(&s->arch, kvp_agent_set_params(s, l, h), kvp_splitmix64(&st));
        }
}

/* ---------------------------------------------------------------- calibration */

static int check_knots(int n_knots, const float *x, const float *y, int layer, int kvh,
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
            int rc = check_knots(n_knots, x, x + n_knots, l, h, err, errlen);
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

/* ---------------------------------------------------------------- file format */

static const uint8_t MAGIC[8] = {'K', 'V', 'P', 'P', 'O', 'L', 0, 1};
#define FORMAT_VERSION 3u
/* Version 1: the 48 bytes of shape. Version 2 adds the model the agents were trained for:
 * u64 weights fingerprint (kvp_model_config.fingerprint) and its name, 64 bytes NUL-padded.
 * Version 3 adds the calibration after the parameters: u32 n_knots (2..256), then per agent
 * n_knots f32 scores and n_knots f32 values. A set without a calibration is written as
 * version 2, so an uncalibrated policy's file is unchanged. */
#define HEADER_V1_BYTES 48
#define HEADER_BYTES (HEADER_V1_BYTES + 8 + KVP_POLICY_MODEL_NAME)
#define CHECKSUM_BYTES 8

int kvp_agent_set_save(const kvp_agent_set *s, const char *path, char *err, size_t errlen)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= sizeof tmp) {
        kvp_errorf(err, errlen, 0, "%s: path too long", path);
        return -ENAMETOOLONG;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int rc = -errno;
        kvp_errorf(err, errlen, 0, "%s: cannot create a temporary file: %s", path, strerror(errno));
        return rc;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int rc = -errno;
        kvp_errorf(err, errlen, 0, "%s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return rc;
    }

    uint8_t hdr[HEADER_BYTES];
    memcpy(hdr, MAGIC, 8);
    kvp_put_u32(hdr + 8, s->n_knots ? 3u : 2u);
    kvp_put_u32(hdr + 12, (uint32_t)s->n_layers);
    kvp_put_u32(hdr + 16, (uint32_t)s->n_kv_heads);
    kvp_put_u32(hdr + 20, (uint32_t)s->arch.d);
    kvp_put_u32(hdr + 24, (uint32_t)s->arch.P);
    kvp_put_u32(hdr + 28, (uint32_t)s->arch.E);
    kvp_put_u32(hdr + 32, (uint32_t)s->arch.H);
    kvp_put_u32(hdr + 36, (uint32_t)s->arch.pmax);
    kvp_put_u64(hdr + 40, s->n_params);
    kvp_put_u64(hdr + 48, s->model_fingerprint);
    memset(hdr + 56, 0, KVP_POLICY_MODEL_NAME);
    memcpy(hdr + 56, s->model_name, strnlen(s->model_name, KVP_POLICY_MODEL_NAME - 1));

    size_t nf = (size_t)s->n_layers * (size_t)s->n_kv_heads * s->n_params;
    size_t nk = (size_t)s->n_layers * (size_t)s->n_kv_heads * 2u * (size_t)s->n_knots;
    uint8_t cal[4], tail[CHECKSUM_BYTES];
    kvp_put_u32(cal, (uint32_t)s->n_knots);
    uint64_t sum = kvp_fnv1a(kvp_fnv1a(KVP_FNV1A_INIT, hdr, sizeof hdr), s->params,
                             nf * sizeof(float));
    if (s->n_knots)
        sum = kvp_fnv1a(kvp_fnv1a(sum, cal, sizeof cal), s->knots, nk * sizeof(float));
    kvp_put_u64(tail, sum);

    /* The daemon may run as another user: make the file world-readable like a normal
     * create would (mkstemp uses 0600). */
    errno = 0;
    int ok = fchmod(fd, 0644) == 0 && fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr &&
             fwrite(s->params, sizeof(float), nf, f) == nf &&
             (!s->n_knots || (fwrite(cal, 1, sizeof cal, f) == sizeof cal &&
                              fwrite(s->knots, sizeof(float), nk, f) == nk)) &&
             fwrite(tail, 1, sizeof tail, f) == sizeof tail && fflush(f) == 0 &&
             fsync(fd) == 0;
    int saved = errno ? errno : EIO;   /* a short fwrite need not set errno */
    if (fclose(f) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        kvp_errorf(err, errlen, 0, "%s: write failed: %s", path, strerror(saved));
        unlink(tmp);
        return -saved;
    }
    return 0;
}

/* Validates the header, and the file size against it, before anything is allocated. */
static int parse_header(const uint8_t *hdr, uint64_t file_size, const char *path,
                        int *n_layers, int *n_kv_heads, kvp_agent_arch *a, int *header_bytes,
                        int *calibrated, char *err, size_t errlen)
{
    if (memcmp(hdr, MAGIC, 8) != 0) {
        kvp_errorf(err, errlen, 0, "%s: not a KVP policy file (bad magic)", path);
        return -EINVAL;
    }
    uint32_t version = kvp_get_u32(hdr + 8);
    if (version < 1 || version > FORMAT_VERSION) {
        kvp_errorf(err, errlen, 0, "%s: unsupported policy file version %u (this build reads 1 to %u)",
               path, version, FORMAT_VERSION);
        return -EINVAL;
    }
    *header_bytes = version == 1 ? HEADER_V1_BYTES : HEADER_BYTES;
    *calibrated = version == 3;
    static const struct { const char *name; int off; int64_t max; } fields[] = {
        {"n_layers", 12, MAX_LAYERS}, {"n_kv_heads", 16, MAX_KV_HEADS},
        {"head_dim", 20, MAX_D},      {"width P", 24, MAX_WIDTH},
        {"position dim E", 28, MAX_WIDTH}, {"hidden H", 32, MAX_WIDTH},
        {"position table size pmax", 36, MAX_PMAX},
    };
    int v[7];
    for (int i = 0; i < 7; i++) {
        char msg[160];
        if (check_range(fields[i].name, kvp_get_u32(hdr + fields[i].off), fields[i].max, msg,
                        sizeof msg)) {
            kvp_errorf(err, errlen, 0, "%s: %s", path, msg);
            return -EINVAL;
        }
        v[i] = (int)kvp_get_u32(hdr + fields[i].off);
    }
    *n_layers = v[0];
    *n_kv_heads = v[1];
    *a = (kvp_agent_arch){.d = v[2], .P = v[3], .E = v[4], .H = v[5], .pmax = v[6]};

    uint64_t np = kvp_agent_n_params(a), stored = kvp_get_u64(hdr + 40);
    if (stored != np) {
        kvp_errorf(err, errlen, 0,
               "%s: parameter count %llu per agent does not match the sizes "
               "(d=%d P=%d E=%d H=%d pmax=%d need %llu)",
               path, (unsigned long long)stored, a->d, a->P, a->E, a->H, a->pmax,
               (unsigned long long)np);
        return -EINVAL;
    }
    /* Compare by division first: absurd sizes would overflow the byte count. */
    uint64_t agents = (uint64_t)v[0] * (uint64_t)v[1];
    uint64_t want = np > file_size / 4u / agents
                        ? UINT64_MAX
                        : (uint64_t)*header_bytes + agents * np * 4u + CHECKSUM_BYTES;
    /* version 3: the knot count and at least its u32; read_calibration checks that the
     * count matches the bytes left before it allocates the knots */
    if (*calibrated && want != UINT64_MAX) {
        want += 4;
        if (file_size > want)
            want = file_size;
    }
    if (file_size < want) {
        kvp_errorf(err, errlen, 0,
               "%s: truncated: %llu bytes, %llu agents x %llu parameters do not fit", path,
               (unsigned long long)file_size, (unsigned long long)agents,
               (unsigned long long)np);
        return -EINVAL;
    }
    if (file_size > want) {
        kvp_errorf(err, errlen, 0, "%s: %llu trailing bytes after the checksum", path,
               (unsigned long long)(file_size - want));
        return -EINVAL;
    }
    return 0;
}

/* Version 3's calibration, after the parameters: the knot count must match the bytes left
 * (parse_header checked they hold a whole number of knots per agent). */
static int read_calibration(kvp_agent_set *s, FILE *f, uint64_t file_size, int header_bytes,
                            uint64_t *sum, const char *path, char *err, size_t errlen)
{
    uint8_t cal[4];
    if (fread(cal, 1, sizeof cal, f) != sizeof cal) {
        kvp_errorf(err, errlen, 0, "%s: read error", path);
        return -EIO;
    }
    uint64_t agents = (uint64_t)s->n_layers * (uint64_t)s->n_kv_heads;
    uint64_t left = file_size - (uint64_t)header_bytes - agents * s->n_params * 4u - 4u - CHECKSUM_BYTES;
    uint32_t k = kvp_get_u32(cal);
    if (k < 2 || k > KVP_CALIBRATION_MAX_KNOTS || left != agents * 8u * k) {
        kvp_errorf(err, errlen, 0, "%s: calibration of %u knots does not match the %llu bytes "
                   "it has (2..%d knots per agent)", path, k, (unsigned long long)left,
                   KVP_CALIBRATION_MAX_KNOTS);
        return -EINVAL;
    }
    size_t nk = (size_t)agents * 2u * k;
    float *knots = malloc(nk * sizeof *knots);
    if (!knots) {
        kvp_errorf(err, errlen, 0, "%s: out of memory", path);
        return -ENOMEM;
    }
    if (fread(knots, sizeof(float), nk, f) != nk) {
        free(knots);
        kvp_errorf(err, errlen, 0, "%s: read error (file changed while reading?)", path);
        return -EIO;
    }
    *sum = kvp_fnv1a(kvp_fnv1a(*sum, cal, sizeof cal), knots, nk * sizeof(float));
    s->knots = knots;
    s->n_knots = (int)k;
    return 0;
}

static int check_params(const kvp_agent_set *s, const char *path, char *err, size_t errlen)
{
    for (int l = 0; l < s->n_layers; l++)
        for (int h = 0; h < s->n_kv_heads; h++) {
            const float *w = kvp_agent_set_params(s, l, h);
            for (size_t i = 0; i < s->n_params; i++)
                if (!isfinite(w[i])) {
                    kvp_errorf(err, errlen, 0, "%s: parameter %zu of agent (layer %d, KV head %d) "
                           "is not finite", path, i, l, h);
                    return -EINVAL;
                }
        }
    return 0;
}

static int check_calibration(const kvp_agent_set *s, const char *path, char *err, size_t errlen)
{
    for (int l = 0; l < s->n_layers && s->n_knots; l++)
        for (int h = 0; h < s->n_kv_heads; h++) {
            const float *x = kvp_agent_set_knots(s, l, h);
            char msg[256];
            if (check_knots(s->n_knots, x, x + s->n_knots, l, h, msg, sizeof msg)) {
                kvp_errorf(err, errlen, 0, "%s: %s", path, msg);
                return -EINVAL;
            }
        }
    return 0;
}

static int check_shape(const kvp_agent_set *s, const kvp_model_config *cfg,
                       const char *path, char *err, size_t errlen)
{
    if (s->n_layers == cfg->n_layers && s->n_kv_heads == cfg->n_kv_heads &&
        s->arch.d == cfg->head_dim)
        return 0;
    kvp_errorf(err, errlen, 0,
           "%s: policy file is for %d layers x %d KV heads x head_dim %d, "
           "model has %d layers x %d KV heads x head_dim %d",
           path, s->n_layers, s->n_kv_heads, s->arch.d, cfg->n_layers, cfg->n_kv_heads,
           cfg->head_dim);
    return -EINVAL;
}

/* A file bound to a model (version 2) loads only for that model's weights; an unbound
 * file (version 1) or an unknown model (fingerprint 0, as in the tests' shapes) is
 * checked by shape alone. */
static int check_model(const kvp_agent_set *s, const kvp_model_config *cfg,
                       const char *path, char *err, size_t errlen)
{
    if (!s->model_fingerprint || !cfg->fingerprint || s->model_fingerprint == cfg->fingerprint)
        return 0;
    kvp_errorf(err, errlen, 0,
               "%s: policy file is for the model '%s' (weights %016llx), not this one (weights "
               "%016llx); make one for this model with `kvp learn --model MODEL`",
               path, s->model_name, (unsigned long long)s->model_fingerprint,
               (unsigned long long)cfg->fingerprint);
    return -EINVAL;
}

/* Policy files read by this process (kvp_agent_set_loads). */
static atomic_ullong set_loads;

unsigned long long kvp_agent_set_loads(void)
{
    return atomic_load(&set_loads);
}

int kvp_agent_set_load(kvp_agent_set *s, const char *path, const kvp_model_config *cfg,
                       char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    atomic_fetch_add(&set_loads, 1);
    FILE *f = kvp_fopen_input(path);
    if (!f) {
        int rc = -errno;
        kvp_errorf(err, errlen, 0, "%s: cannot open: %s", path, kvp_fileio_strerror(rc));
        return rc;
    }
    int rc;
    struct stat st;
    uint8_t hdr[HEADER_BYTES], tail[CHECKSUM_BYTES];
    int n_layers, n_kv_heads;
    kvp_agent_arch a;
    if (fstat(fileno(f), &st) != 0) {
        rc = -errno;
        kvp_errorf(err, errlen, 0, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        kvp_errorf(err, errlen, 0, "%s: not a regular file", path);
        rc = -EINVAL;
        goto fail;
    }
    if (st.st_size < HEADER_V1_BYTES) {
        kvp_errorf(err, errlen, 0, "%s: truncated: %lld bytes, the header alone is %d", path,
               (long long)st.st_size, HEADER_V1_BYTES);
        rc = -EINVAL;
        goto fail;
    }
    int header_bytes, calibrated;
    if (fread(hdr, 1, HEADER_V1_BYTES, f) != HEADER_V1_BYTES) {
        kvp_errorf(err, errlen, 0, "%s: read error", path);
        rc = -EIO;
        goto fail;
    }
    if ((rc = parse_header(hdr, (uint64_t)st.st_size, path, &n_layers, &n_kv_heads, &a,
                           &header_bytes, &calibrated, err, errlen)))
        goto fail;
    if (fread(hdr + HEADER_V1_BYTES, 1, (size_t)header_bytes - HEADER_V1_BYTES, f) !=
        (size_t)header_bytes - HEADER_V1_BYTES) {
        kvp_errorf(err, errlen, 0, "%s: read error", path);
        rc = -EIO;
        goto fail;
    }
    if ((rc = kvp_agent_set_alloc(s, n_layers, n_kv_heads, &a, err, errlen)))
        goto fail;

    size_t nf = (size_t)n_layers * (size_t)n_kv_heads * s->n_params;
    if (fread(s->params, sizeof(float), nf, f) != nf) {
        kvp_errorf(err, errlen, 0, "%s: read error (file changed while reading?)", path);
        rc = -EIO;
        goto fail;
    }
    uint64_t sum = kvp_fnv1a(kvp_fnv1a(KVP_FNV1A_INIT, hdr, (size_t)header_bytes), s->params,
                             nf * sizeof(float));
    if (calibrated &&
        (rc = read_calibration(s, f, (uint64_t)st.st_size, header_bytes, &sum, path, err, errlen)))
        goto fail;
    if (fread(tail, 1, sizeof tail, f) != sizeof tail) {
        kvp_errorf(err, errlen, 0, "%s: read error (file changed while reading?)", path);
        rc = -EIO;
        goto fail;
    }
    if (sum != kvp_get_u64(tail)) {
        kvp_errorf(err, errlen, 0, "%s: checksum mismatch (file %016llx, computed %016llx): corrupt",
               path, (unsigned long long)kvp_get_u64(tail), (unsigned long long)sum);
        rc = -EBADMSG;
        goto fail;
    }
    if (header_bytes == HEADER_BYTES) {
        s->model_fingerprint = kvp_get_u64(hdr + 48);
        memcpy(s->model_name, hdr + 56, KVP_POLICY_MODEL_NAME);
        s->model_name[KVP_POLICY_MODEL_NAME - 1] = 0;
    }
    if ((rc = check_params(s, path, err, errlen)) ||
        (rc = check_calibration(s, path, err, errlen)) ||
        (cfg && (rc = check_shape(s, cfg, path, err, errlen))) ||
        (cfg && (rc = check_model(s, cfg, path, err, errlen))))
        goto fail;
    fclose(f);
    return 0;
fail:
    kvp_agent_set_free(s);
    fclose(f);
    return rc;
}

/* ---------------------------------------------------------------- policy glue */

/* Rows scored per sgemm batch; bounds the scratch buffer for any insert size. */
#define SCORE_BLOCK 256

typedef struct kvp_agent_policy {
    kvp_agent_set own;          /* the weights it loaded itself (kvp_agent_policy_create) */
    const kvp_agent_set *set;   /* &own, or a set shared read-only with other instances */
} kvp_agent_policy;

/* Scoring scratch: kvp_agent_score_work(SCORE_BLOCK) floats, then [2][SCORE_BLOCK][d] for
 * a block's keys and values decoded (f16 / q8_0 rows). One buffer per thread, not per
 * instance: an instance is used by one thread at a time and scoring does not nest, so
 * the sessions of a daemon, which share their policy's weights, add nothing per session
 * but the instance itself. Freed when the thread ends. */
typedef struct scratch {
    float *buf;
    size_t n;
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_ok;

static void scratch_free(void *p)
{
    scratch *sc = p;
    free(sc->buf);
    free(sc);
}

static void scratch_init(void)
{
    scratch_ok = pthread_key_create(&scratch_key, scratch_free) == 0;
}

/* This thread's scratch of at least n floats, or NULL (out of memory). */
static float *thread_scratch(size_t n)
{
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_ok)
        return NULL;
    scratch *sc = pthread_getspecific(scratch_key);
    if (!sc) {
        if (!(sc = calloc(1, sizeof *sc)))
            return NULL;
        if (pthread_setspecific(scratch_key, sc) != 0) {
            free(sc);
            return NULL;
        }
    }
    if (sc->n < n) {
        float *b = realloc(sc->buf, n * sizeof *b);
        if (!b)
            return NULL;
        sc->buf = b;
        sc->n = n;
    }
    return sc->buf;
}

/* Rows older than this many tokens before the next eviction would leave the model's own
 * window (seq_len - 1 tokens after the sink) within one eviction chunk (generate.h's
 * default, 32): they are evicted first, so the cache approximates the model with a full
 * window rather than keeping rows that model could no longer see. */
#define KVP_WINDOW_MARGIN 32

/* Scores are computed lazily and in sgemm batches: on_insert marks new rows unscored
 * (NaN) and before_evict scores every row whose score is stale, a decode step costs
 * nothing and the rows of a chunk are scored together when they first face an eviction.
 * A score is stale when it is NaN or when the row's position input has changed since it
 * was scored (h->stat keeps that position): a context shift re-rotates the keys and moves
 * the positions, and scores of the old positions would rank rows scored before a shift
 * against rows scored after it on different inputs (measured: streaming KL 0.25 -> 0.23 at
 * budget 32, docs/evaluation.md). A shift happens once every quarter context, so the
 * rescoring costs about one extra score per row per quarter context. */
static void kvp_on_insert(kvp_policy *p, int layer, int kvh, kvp_head *h, int first, int n)
{
    (void)p, (void)layer, (void)kvh;
    for (int i = first; i < first + n; i++)
        h->score[i] = NAN;
}

static int stale(const kvp_head *h, int i)
{
    return isnan(h->score[i]) || h->stat[i] != (float)h->pos[i];
}

static void kvp_before_evict(kvp_policy *p, int layer, int kvh, kvp_head *h)
{
    kvp_agent_policy *ap = p->impl;
    const kvp_agent_arch *a = &ap->set->arch;
    const float *w = kvp_agent_set_params(ap->set, layer, kvh);
    size_t nwork = kvp_agent_score_work(a, SCORE_BLOCK);
    /* without scratch (out of memory) the stale rows stay unscored: NaN ranks last */
    float *work = thread_scratch(nwork + 2 * (size_t)SCORE_BLOCK * a->d);
    for (int i = 0; work && i < h->n;) {
        if (!stale(h, i)) {
            i++;
            continue;
        }
        int m = 1;
        while (m < SCORE_BLOCK && i + m < h->n && stale(h, i + m))
            m++;
        float *kt = work + nwork, *vt = kt + (size_t)SCORE_BLOCK * a->d;
        kvp_agent_score(a, w, kvp_head_keys(h, a->d, i, m, kt), kvp_head_values(h, a->d, i, m, vt),
                        h->pos + i, m, h->score + i, work);
        for (int j = i; j < i + m; j++)
            h->stat[j] = (float)h->pos[j];
        i += m;
    }
    /* out of the model's window by the next eviction: dropped first (-inf ranks after
     * every finite score; a row only gets older, so it stays out) */
    int64_t window = (int64_t)p->cfg.seq_len - 1 - KVP_WINDOW_MARGIN;
    if (h->n > 0 && window > 0)
        for (int i = 0; i < h->n; i++)
            if (h->seq[h->n - 1] - h->seq[i] >= window)
                h->score[i] = -INFINITY;
}

static void kvp_calibrate_op(const kvp_policy *p, int layer, int kvh, const float *in, int n,
                             float *out)
{
    const kvp_agent_policy *ap = p->impl;
    kvp_agent_calibrate(ap->set, layer, kvh, in, n, out);
}

static void kvp_destroy(kvp_policy *p)
{
    kvp_agent_policy *ap = p->impl;
    if (!ap)
        return;
    kvp_agent_set_free(&ap->own);
    free(ap);
    p->impl = NULL;
}

/* The recent window: the newest max(budget / 2, budget - seq_len / 8) rows are always
 * kept, the agents choose among the older ones. Half the budget (as H2O keeps): the
 * next-token distribution depends on the recent rows more than their share of future
 * attention says. Past that, the old rows worth keeping are few and do not grow with
 * the budget (heavy hitters), so the agents' share is capped at an eighth of the context
 * and the rest of a large budget goes to recency. Measured on held-out TinyStories and
 * zero-shot OpenAssistant text, one-shot and streaming (docs/evaluation.md, "Recent
 * window"): at budget 256 of a 512 context (window 192 instead of 128) one-shot KL
 * 0.0083 -> 0.0073 and streaming KL 0.0433 -> 0.0383 on 64 held-out TinyStories
 * sequences / 8 streams, equal or better zero-shot on a smaller sample; at budgets up to
 * 128 the window stays the half. */
int kvp_agent_recent_window(int budget, int seq_len, int n_recent)
{
    int w = budget / 2, agents_max = seq_len / 8;
    if (agents_max > 0 && budget - agents_max > w)
        w = budget - agents_max;
    return w > n_recent ? w : n_recent;
}

static int kvp_recent_window(const kvp_policy *p, int budget)
{
    return kvp_agent_recent_window(budget, p->cfg.seq_len, p->n_recent);
}

static const kvp_policy_ops kvp_ops = {
    .name = "kvp",
    .on_insert = kvp_on_insert,
    .before_evict = kvp_before_evict,
    .recent_window = kvp_recent_window,
    .calibrate = kvp_calibrate_op,
    .destroy = kvp_destroy,
};

int kvp_agent_policy_create(kvp_policy *p, const char *policy_file, char *err, size_t errlen)
{
    if (!policy_file || !*policy_file) {
        kvp_errorf(err, errlen, 0, "the kvp policy needs a policy file");
        return -EINVAL;
    }
    kvp_agent_policy *ap = calloc(1, sizeof *ap);
    if (!ap) {
        kvp_errorf(err, errlen, 0, "out of memory");
        return -ENOMEM;
    }
    int rc = kvp_agent_set_load(&ap->own, policy_file, &p->cfg, err, errlen);
    if (rc) {
        free(ap);
        return rc;
    }
    ap->set = &ap->own;
    p->ops = &kvp_ops;
    p->impl = ap;
    return 0;
}

int kvp_agent_policy_create_shared(kvp_policy *p, const kvp_agent_set *set, char *err,
                                   size_t errlen)
{
    int rc;
    if ((rc = check_shape(set, &p->cfg, "shared policy weights", err, errlen)) < 0 ||
        (rc = check_model(set, &p->cfg, "shared policy weights", err, errlen)) < 0)
        return rc;
    kvp_agent_policy *ap = calloc(1, sizeof *ap);
    if (!ap) {
        kvp_errorf(err, errlen, 0, "out of memory");
        return -ENOMEM;
    }
    ap->set = set;
    p->ops = &kvp_ops;
    p->impl = ap;
    return 0;
}
