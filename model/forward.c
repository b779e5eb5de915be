#include "model/forward.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/rope.h"

int kvp_runstate_init(kvp_runstate *s, const kvp_model_config *c, int max_tokens)
{
    memset(s, 0, sizeof *s);
    if (max_tokens <= 0)
        return -EINVAL;
    size_t T = (size_t)max_tokens;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    s->max_tokens = max_tokens;
    s->x = malloc(T * c->dim * sizeof(float));
    s->xb = malloc(T * c->dim * sizeof(float));
    s->xb2 = malloc(T * c->dim * sizeof(float));
    s->q = malloc(T * qd * sizeof(float));
    s->k = malloc(T * kvd * sizeof(float));
    s->v = malloc(T * kvd * sizeof(float));
    s->att_out = malloc(T * qd * sizeof(float));
    s->hb = malloc(T * c->hidden_dim * sizeof(float));
    s->hb2 = malloc(T * c->hidden_dim * sizeof(float));
    s->logits = malloc((size_t)c->vocab_size * sizeof(float));
    s->rope = malloc(T * c->rope.n_rot * sizeof(float));
    if (!s->x || !s->rope || !s->xb || !s->xb2 || !s->q || !s->k || !s->v || !s->att_out || !s->hb ||
        !s->hb2 || !s->logits) {
        kvp_runstate_free(s);
        return -ENOMEM;
    }
    return 0;
}

void kvp_runstate_free(kvp_runstate *s)
{
    free(s->x);
    free(s->xb);
    free(s->xb2);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att_out);
    free(s->hb);
    free(s->hb2);
    free(s->att);
    free(s->logits);
    free(s->rope);
    memset(s, 0, sizeof *s);
}

static void rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
    float ss = 0.0f;
    for (int j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss = 1.0f / sqrtf(ss / n + eps);
    for (int j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

/* x[T][n] += b[n] */
static void add_bias(float *x, const float *b, int T, int n)
{
    for (int t = 0; t < T; t++)
        for (int j = 0; j < n; j++)
            x[(size_t)t * n + j] += b[j];
}

/* y[T][out] = x[T][in] . W[out][in]^T (+ y when accumulate) */
static void matmul(float *y, const float *x, const float *w, int T, int in, int out, int accumulate)
{
    float beta = accumulate ? 1.0f : 0.0f;
    if (T == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1, beta, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, in, 1.0f, x, in, w, in,
                    beta, y, out);
}

static int ensure_att(kvp_runstate *s, size_t need)
{
    if (need <= (size_t)s->att_cap)
        return 0;
    size_t cap = need + need / 2;
    float *a = realloc(s->att, cap * sizeof *a);
    if (!a)
        return -ENOMEM;
    s->att = a;
    s->att_cap = (int)cap;
    return 0;
}

/* Attention of the block's T queries over one KV head's rows. Rows [0, base) predate the
 * block; query t also sees the block's rows base..base+t. Writes att_out for the
 * group's query heads and leaves their probabilities in s->att ([g][t][rows]). */
static void attend_head(kvp_runstate *s, const kvp_model_config *c, const kvp_head *h,
                        int kvh, int T, int base)
{
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, R = h->n;
    int qd = c->n_heads * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int g = 0; g < group; g++) {
        int qh = kvh * group + g;
        const float *q = s->q + (size_t)qh * hd;
        float *att = s->att + (size_t)g * T * R;
        float *out = s->att_out + (size_t)qh * hd;
        /* att[T][R] = q[T][hd] . K[R][hd]^T * scale */
        if (T == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, R, hd, scale, h->k, hd, q, 1, 0.0f, att, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, R, hd, scale, q, qd,
                        h->k, hd, 0.0f, att, R);
        for (int t = 0; t < T; t++) {
            float *a = att + (size_t)t * R;
            int visible = base + t + 1;
            float mx = a[0];
            for (int j = 1; j < visible; j++)
                mx = a[j] > mx ? a[j] : mx;
            float sum = 0.0f;
            for (int j = 0; j < visible; j++) {
                a[j] = expf(a[j] - mx);
                sum += a[j];
            }
            float inv = 1.0f / sum;
            for (int j = 0; j < visible; j++)
                a[j] *= inv;
            for (int j = visible; j < R; j++)
                a[j] = 0.0f;
        }
        /* out[T][hd] = att[T][R] . V[R][hd] */
        if (T == 1)
            cblas_sgemv(CblasRowMajor, CblasTrans, R, hd, 1.0f, h->v, hd, att, 1, 0.0f, out, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, R, 1.0f, att, R,
                        h->v, hd, 0.0f, out, qd);
    }
}

int kvp_forward(const kvp_model *m, kvp_runstate *s, kvp_cache *c,
                const int *tokens, int T, float *all_logits)
{
    const kvp_model_config *p = &m->cfg;
    int dim = p->dim, hd = p->head_dim, hid = p->hidden_dim;
    int qd = p->n_heads * hd, kvd = p->n_kv_heads * hd, group = p->n_heads / p->n_kv_heads;
    if (T <= 0 || T > s->max_tokens)
        return -EINVAL;
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= p->vocab_size)
            return -EINVAL;
    int pos0 = c->next_pos;
    int rc;

    int nr = p->rope.n_rot;
    for (int t = 0; t < T; t++) {
        memcpy(s->x + (size_t)t * dim, m->tok_embd + (size_t)tokens[t] * dim, dim * sizeof(float));
        kvp_rope_table(&p->rope, s->rope + (size_t)t * nr, pos0 + t);
    }

    for (int l = 0; l < p->n_layers; l++) {
        const kvp_layer *w = &m->layers[l];
        for (int t = 0; t < T; t++)
            rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, w->attn_norm, dim, p->rms_eps);
        matmul(s->q, s->xb, w->wq, T, dim, qd, 0);
        matmul(s->k, s->xb, w->wk, T, dim, kvd, 0);
        matmul(s->v, s->xb, w->wv, T, dim, kvd, 0);
        /* Q/K/V biases (qwen2) */
        if (w->bq)
            add_bias(s->q, w->bq, T, qd);
        if (w->bk)
            add_bias(s->k, w->bk, T, kvd);
        if (w->bv)
            add_bias(s->v, w->bv, T, kvd);
        /* per-head RMSNorm of q[T][n_heads][hd] and k[T][n_kv_heads][hd] (qwen3) */
        if (w->q_norm) {
            for (int i = 0; i < T * p->n_heads; i++)
                rmsnorm(s->q + (size_t)i * hd, s->q + (size_t)i * hd, w->q_norm, hd, p->rms_eps);
            for (int i = 0; i < T * p->n_kv_heads; i++)
                rmsnorm(s->k + (size_t)i * hd, s->k + (size_t)i * hd, w->k_norm, hd, p->rms_eps);
        }
        /* RoPE on every q and k head at its token's position */
        for (int t = 0; t < T; t++) {
            const float *cs = s->rope + (size_t)t * nr;
            for (int h = 0; h < p->n_heads; h++)
                kvp_rope_apply(&p->rope, s->q + (size_t)t * qd + h * hd, cs);
            for (int h = 0; h < p->n_kv_heads; h++)
                kvp_rope_apply(&p->rope, s->k + (size_t)t * kvd + h * hd, cs);
        }
        if (s->hooks.tap)
            s->hooks.tap(s->hooks.tap_ctx, l, s->q, s->k, s->v, T);

        for (int kvh = 0; kvh < p->n_kv_heads; kvh++) {
            kvp_head *h = kvp_cache_head(c, l, kvh);
            int base = h->n;
            if ((rc = kvp_head_reserve(h, hd, base + T)))
                return rc;
            for (int t = 0; t < T; t++) {
                int r = base + t;
                memcpy(h->k + (size_t)r * hd, s->k + (size_t)t * kvd + kvh * hd, hd * sizeof(float));
                memcpy(h->v + (size_t)r * hd, s->v + (size_t)t * kvd + kvh * hd, hd * sizeof(float));
                h->pos[r] = pos0 + t;
                h->seq[r] = c->n_seen + t;
                h->score[r] = 0.0f;
                h->stat[r] = 0.0f;
            }
            h->n = base + T;
            if (s->hooks.score)
                s->hooks.score(s->hooks.ctx, l, kvh, h, base, T);
            if ((rc = ensure_att(s, (size_t)group * T * h->n)))
                return rc;
            attend_head(s, p, h, kvh, T, base);
            if (s->hooks.attention)
                s->hooks.attention(s->hooks.ctx, l, kvh, h, s->q + (size_t)kvh * group * hd, qd,
                                   s->att, h->n, T);
        }
        matmul(s->x, s->att_out, w->wo, T, qd, dim, 1);

        for (int t = 0; t < T; t++)
            rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, w->ffn_norm, dim, p->rms_eps);
        matmul(s->hb, s->xb, w->w_gate, T, dim, hid, 0);
        matmul(s->hb2, s->xb, w->w_up, T, dim, hid, 0);
        for (size_t i = 0; i < (size_t)T * hid; i++) {
            float g = s->hb[i];
            s->hb[i] = g / (1.0f + expf(-g)) * s->hb2[i];
        }
        matmul(s->x, s->hb, w->w_down, T, hid, dim, 1);
    }

    for (int t = 0; t < T; t++)
        rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, m->out_norm, dim, p->rms_eps);
    if (all_logits) {
        matmul(all_logits, s->xb, m->output, T, dim, p->vocab_size, 0);
        memcpy(s->logits, all_logits + (size_t)(T - 1) * p->vocab_size, p->vocab_size * sizeof(float));
    } else {
        matmul(s->logits, s->xb + (size_t)(T - 1) * dim, m->output, 1, dim, p->vocab_size, 0);
    }
    c->next_pos += T;
    c->n_seen += T;
    return 0;
}
