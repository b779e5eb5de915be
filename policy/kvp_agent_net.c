/* One agent's network: its shape and parameter layout, and the forward pass. */
#include "policy/kvp_agent_net.h"

#include "base/errors.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


#define LN_EPS 1e-5f

int kvp_agent_check_range(const char *what, int64_t v, int64_t max, char *err, size_t errlen)
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
    if ((rc = kvp_agent_check_range("head_dim", a->d, KVP_AGENT_MAX_D, err, errlen)) ||
        (rc = kvp_agent_check_range("width P", a->P, KVP_AGENT_MAX_WIDTH, err, errlen)) ||
        (rc = kvp_agent_check_range("position dim E", a->E, KVP_AGENT_MAX_WIDTH, err, errlen)) ||
        (rc = kvp_agent_check_range("hidden H", a->H, KVP_AGENT_MAX_WIDTH, err, errlen)) ||
        (rc = kvp_agent_check_range("position table size pmax", a->pmax, KVP_AGENT_MAX_PMAX, err, errlen)))
        return rc;
    if (a->centered != 0 && a->centered != 1)
        return kvp_agent_check_range("centered + 1", (int64_t)a->centered + 1, 2, err, errlen);
    if (a->relative != 0 && a->relative != 1)
        return kvp_agent_check_range("relative + 1", (int64_t)a->relative + 1, 2, err, errlen);
    return 0;
}

void kvp_agent_key_mean(int d, const float *k, int n, float *mean)
{
    for (int j = 0; j < d; j++)
        mean[j] = 0.0f;
    if (n <= 0)
        return;
    /* summed in double: a head may hold many thousand rows */
    for (int j = 0; j < d; j++) {
        double s = 0.0;
        for (int i = 0; i < n; i++)
            s += k[(size_t)i * d + j];
        mean[j] = (float)(s / n);
    }
}

void kvp_agent_center_keys(int d, float *k, int n, const float *mean)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++)
            k[(size_t)i * d + j] -= mean[j];
}

void kvp_agent_relative_keys(const kvp_rope *r, int d, float *k, int m, int64_t n)
{
    if (r->n_rot <= 0 || r->n_rot > d)
        return;
    float cs[KVP_AGENT_MAX_D];
    kvp_rope_table(r, cs, -(double)n);
    for (int i = 0; i < m; i++)
        kvp_rope_apply(r, k + (size_t)i * d, cs);
}

/* A dense layer of `out` units over `in` inputs, then its layer norm, from offset o:
 * the weights [out][in], the bias, the norm's gain and shift. The offset after them. */
static size_t dense_norm(size_t o, size_t in, size_t out, size_t *w, size_t *b, size_t *g,
                         size_t *shift)
{
    *w = o;
    o += out * in;
    *b = o;
    *g = o + out;
    *shift = o + 2 * out;
    return o + 3 * out;
}

/* With the limits above every count stays below 2^42. */
void kvp_agent_layout_of(const kvp_agent_arch *a, kvp_agent_layout *l)
{
    size_t d = (size_t)a->d, P = (size_t)a->P, E = (size_t)a->E, H = (size_t)a->H;
    size_t C = 2 * P + E, o = 0;
    o = dense_norm(o, d, P, &l->wk, &l->bk, &l->lnk_g, &l->lnk_b);
    o = dense_norm(o, d, P, &l->wv, &l->bv, &l->lnv_g, &l->lnv_b);
    l->emb = o;   o += (size_t)a->pmax * E;
    l->lne_g = o; o += E;
    l->lne_b = o; o += E;
    o = dense_norm(o, C, H, &l->w1, &l->b1, &l->ln1_g, &l->ln1_b);
    o = dense_norm(o, H, H, &l->w2, &l->b2, &l->ln2_g, &l->ln2_b);
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
/* ---------------------------------------------------------------- forward */

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

void kvp_agent_net_forward(const kvp_agent_arch *a, const float *w, const float *k,
                           const float *v, const int32_t *pos, int n,
                           const kvp_agent_fwd_bufs *f, float *scores)
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
        memcpy(f->x + (size_t)i * C + 2 * P, w + l.emb + (size_t)kvp_agent_pos_index(a, pos[i]) * E,
               (size_t)E * sizeof(float));
    ln_rows(n, E, f->x + 2 * P, C, w + l.lne_g, w + l.lne_b, xh ? xh + 2 * P : NULL, C, f->re);

    affine(n, H, C, w + l.w1, w + l.b1, f->x, C, f->a1, H);
    ln_rows(n, H, f->a1, H, w + l.ln1_g, w + l.ln1_b, f->z1hat, H, f->r1);
    for (size_t i = 0; i < (size_t)n * H; i++)
        f->h1[i] = f->a1[i] * kvp_agent_sigmoid(f->a1[i]);
    affine(n, H, H, w + l.w2, w + l.b2, f->h1, H, f->a2, H);
    ln_rows(n, H, f->a2, H, w + l.ln2_g, w + l.ln2_b, f->z2hat, H, f->r2);
    for (size_t i = 0; i < (size_t)n * H; i++)
        f->h2[i] = f->a2[i] * kvp_agent_sigmoid(f->a2[i]);

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
    kvp_agent_fwd_bufs f = {.x = work, .a1 = work + (size_t)n * C};
    f.h1 = f.a1;
    f.a2 = f.a1 + (size_t)n * H;
    f.h2 = f.a2;
    kvp_agent_net_forward(a, params, k, v, pos, n, &f, scores);
}
