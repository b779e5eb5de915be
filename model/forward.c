#include "model/forward.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/rope.h"
#include "model/matmul.h"

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
    if (((c->rope_base_swa > 0 && c->rope_base_swa != c->rope.base) || c->rope_factors_swa) &&
        !(s->rope_swa = malloc(T * c->rope.n_rot * sizeof(float)))) {
        kvp_runstate_free(s);
        return -ENOMEM;
    }
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
    for (int i = 0; i < KVP_MATMUL_MAX_THREADS; i++)
        free(s->att[i]);
    free(s->logits);
    free(s->batch_logits);
    free(s->rope);
    free(s->rope_swa);
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

/* x[n] = cap tanh(x / cap): gemma's soft cap of attention scores and logits */
static void softcap(float *x, size_t n, float cap)
{
    for (size_t i = 0; i < n; i++)
        x[i] = cap * tanhf(x[i] / cap);
}

/* GELU, tanh approximation, in f32 (gemma's GeGLU) */
static float gelu(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

/* x[T][n] += b[n] */
static void add_bias(float *x, const float *b, int T, int n)
{
    for (int t = 0; t < T; t++)
        for (int j = 0; j < n; j++)
            x[(size_t)t * n + j] += b[j];
}

static int ensure_att(kvp_runstate *s, int slot, size_t need)
{
    if (need <= s->att_cap[slot])
        return 0;
    size_t cap = need + need / 2;
    float *a = realloc(s->att[slot], cap * sizeof *a);
    if (!a)
        return -ENOMEM;
    s->att[slot] = a;
    s->att_cap[slot] = cap;
    return 0;
}

/* Scores att[T][R] = q[T][hd] . K[R][hd]^T * scale of one query head over a head's
 * rows: OpenBLAS on f32 rows; f16 / q8_0 rows are read as stored (decoded in registers
 * by kvp_kv_dots, four rows at a time), never copied out as f32. Rows a query cannot
 * see yet (j >= base + t + 1) are left for the softmax to clear. */
static void head_scores(const kvp_head *h, int hd, const float *q, int qd, int T, int base,
                        float scale, float *att)
{
    /* rows [0, S) are the shared block's, [S, R) the head's own: two runs, each row's
     * score computed as in one */
    int R = h->n, S = h->n_shared;
    for (int run = 0; run < 2; run++) {
        int r0 = run ? S : 0, nr = run ? R - S : S;
        if (!nr)
            continue;
        const void *rows = kvp_head_krow(h, hd, r0);
        if (h->type == KVP_KV_F32) {
            const float *k = rows;
            if (T == 1)
                cblas_sgemv(CblasRowMajor, CblasNoTrans, nr, hd, scale, k, hd, q, 1, 0.0f,
                            att + r0, 1);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, nr, hd, scale, q, qd, k,
                            hd, 0.0f, att + r0, R);
            continue;
        }
        for (int t = 0; t < T; t++) {
            int seen = base + t + 1 - r0;   /* rows of this run query t sees */
            if (seen > 0)
                kvp_kv_dots(h->type, rows, seen < nr ? seen : nr, q + (size_t)t * qd, hd, scale,
                            att + (size_t)t * R + r0);
        }
    }
}

/* out[T][hd] (rows qd apart) = att[T][R] . V[R][hd], the same way as head_scores. */
static void head_values(const kvp_head *h, int hd, const float *att, int T, int base, float *out,
                        int qd)
{
    int R = h->n, S = h->n_shared;
    if (h->type == KVP_KV_F32) {
        /* the shared run from 0, the head's own rows added to it */
        for (int run = 0; run < 2; run++) {
            int r0 = run ? S : 0, nr = run ? R - S : S;
            float beta = run && S ? 1.0f : 0.0f;
            if (!nr)
                continue;
            const float *v = kvp_head_vrow(h, hd, r0);
            if (T == 1)
                cblas_sgemv(CblasRowMajor, CblasTrans, nr, hd, 1.0f, v, hd, att + r0, 1, beta,
                            out, 1);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, nr, 1.0f, att + r0,
                            R, v, hd, beta, out, qd);
        }
        return;
    }
    /* kvp_kv_mix sums the rows in order from 0 as kvp_kv_axpy adds them, so the rows
     * past the shared run are added one by one after it: the same sum as one run */
    for (int t = 0; t < T; t++) {
        int seen = base + t + 1;
        const float *a = att + (size_t)t * R;
        float *y = out + (size_t)t * qd;
        if (!S || seen <= S) {
            kvp_kv_mix(h->type, kvp_head_vrow(h, hd, 0), seen, a, hd, y);
            continue;
        }
        kvp_kv_mix(h->type, kvp_head_vrow(h, hd, 0), S, a, hd, y);
        for (int r = S; r < seen; r++)
            kvp_kv_axpy(h->type, y, a[r], kvp_head_vrow(h, hd, r), hd);
    }
}

/* Attention of one sequence's T queries (batch rows r0..r0+T) over one KV head's rows.
 * Rows [0, base) predate the block; query t also sees the block's rows base..base+t, and
 * with a sliding window (window > 0) only rows of its last `window` tokens (query t is
 * token seq0 + t). Writes att_out for the group's query heads and leaves their
 * probabilities in att_buf ([g][t][rows]). */
static void attend_head(kvp_runstate *s, const kvp_model_config *c, const kvp_head *h,
                        int kvh, int r0, int T, int base, int window, int64_t seq0,
                        float *att_buf)
{
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads, R = h->n;
    int qd = c->n_heads * hd;
    float scale = c->query_scale > 0 ? c->query_scale : 1.0f / sqrtf((float)hd);
    for (int g = 0; g < group; g++) {
        int qh = kvh * group + g;
        const float *q = s->q + (size_t)r0 * qd + (size_t)qh * hd;
        float *att = att_buf + (size_t)g * T * R;
        float *out = s->att_out + (size_t)r0 * qd + (size_t)qh * hd;
        /* att[T][R] = q[T][hd] . K[R][hd]^T * scale */
        head_scores(h, hd, q, qd, T, base, scale, att);
        for (int t = 0; t < T; t++) {
            float *a = att + (size_t)t * R;
            int visible = base + t + 1, first = 0;   /* rows [first, visible) are seen */
            while (window > 0 && first < visible - 1 && kvp_head_seq(h, first) <= seq0 + t - window)
                first++;
            if (c->attn_softcap > 0)
                softcap(a + first, (size_t)(visible - first), c->attn_softcap);
            float mx = a[first];
            for (int j = first + 1; j < visible; j++)
                mx = a[j] > mx ? a[j] : mx;
            float sum = 0.0f;
            for (int j = first; j < visible; j++) {
                a[j] = expf(a[j] - mx);
                sum += a[j];
            }
            float inv = 1.0f / sum;
            for (int j = 0; j < first; j++)
                a[j] = 0.0f;
            for (int j = first; j < visible; j++)
                a[j] *= inv;
            for (int j = visible; j < R; j++)
                a[j] = 0.0f;
        }
        /* out[T][hd] = att[T][R] . V[R][hd] */
        head_values(h, hd, att, T, base, out, qd);
    }
}

/* A sequence's block enters its cache for one layer, per KV head: the block's K/V rows
 * are appended to the head's store and the policy scores them (in head order: a policy
 * may draw random numbers). A sliding-window layer's rows are not scored: its window,
 * not the policy, bounds it. */
static void store_seq(kvp_runstate *s, const kvp_model_config *p, kvp_batch_seq *q, int l,
                      int window)
{
    int hd = p->head_dim, qd = p->n_heads * hd, kvd = p->n_kv_heads * hd;
    int T = q->n, r0 = q->row0;
    kvp_cache *c = q->cache;
    const kvp_forward_hooks *hk = &q->hooks;
    if (hk->tap)
        hk->tap(hk->tap_ctx, l, s->q + (size_t)r0 * qd, s->k + (size_t)r0 * kvd,
                s->v + (size_t)r0 * kvd, T);
    for (int kvh = 0; kvh < p->n_kv_heads; kvh++) {
        kvp_head *h = kvp_cache_head(c, l, kvh);
        int base = h->n;
        for (int t = 0; t < T; t++) {
            int r = base + t, j = r - h->n_shared;   /* appended rows are private */
            const float *k = s->k + (size_t)(r0 + t) * kvd + kvh * hd;
            const float *v = s->v + (size_t)(r0 + t) * kvd + kvh * hd;
            kvp_kv_store(h->type, kvp_head_krow(h, hd, r), k, hd);
            kvp_kv_store(h->type, kvp_head_vrow(h, hd, r), v, hd);
            h->pos[j] = c->next_pos + t;
            h->seq[j] = c->n_seen + t;
            h->score[j] = 0.0f;
            h->stat[j] = 0.0f;
        }
        h->n = base + T;
        if (hk->score && !window)
            hk->score(hk->ctx, l, kvh, h, base, T);
    }
}

/* One layer's attention over the batch: items (sequence, KV head), each over that
 * sequence's own rows, on any thread of the pass. */
typedef struct attend_job {
    kvp_runstate *s;
    const kvp_model_config *p;
    kvp_batch_seq *seqs;
    int layer;
    int window;         /* the layer's sliding window, 0: none */
} attend_job;

/* Item i: sequence i / n_kv_heads, KV head i % n_kv_heads, its block already stored; the
 * policy observes the probabilities. */
static void attend_item(void *arg, int i, int slot)
{
    const attend_job *a = arg;
    const kvp_model_config *p = a->p;
    kvp_batch_seq *q = &a->seqs[i / p->n_kv_heads];
    int kvh = i % p->n_kv_heads, hd = p->head_dim, qd = p->n_heads * hd;
    int group = p->n_heads / p->n_kv_heads;
    if (q->rc)
        return;
    kvp_head *h = kvp_cache_head(q->cache, a->layer, kvh);
    float *att = a->s->att[slot];
    attend_head(a->s, p, h, kvh, q->row0, q->n, h->n - q->n, a->window, q->cache->n_seen, att);
    if (q->hooks.attention && !a->window)
        q->hooks.attention(q->hooks.ctx, a->layer, kvh, h,
                           a->s->q + (size_t)q->row0 * qd + (size_t)kvh * group * hd, qd, att,
                           h->n, q->n);
}

/* A cache meets a model with sliding windows: an empty cache takes the model's windows
 * (and their RoPE base and factors); one that holds rows must already have them (a
 * snapshot of another model is refused). */
static int cache_windows(const kvp_model *m, kvp_cache *c)
{
    const kvp_model_config *p = &m->cfg;
    if (c->n_layers != p->n_layers)
        return -EINVAL;
    int same = c->rope_base_swa == (p->rope_base_swa > 0 ? p->rope_base_swa : p->rope.base);
    for (int l = 0; same && l < p->n_layers; l++)
        same = kvp_cache_window(c, l) == m->layers[l].window;
    const float *fs = c->window ? p->rope_factors_swa : NULL;
    size_t fn = (size_t)p->rope.n_rot / 2 * sizeof(float);
    if (same && !fs == !c->factors_swa && (!fs || !memcmp(fs, c->factors_swa, fn)))
        return 0;
    int win[p->n_layers];
    for (int l = 0; l < p->n_layers; l++)
        win[l] = m->layers[l].window;
    int rc = same ? 0 : kvp_cache_set_windows(c, win, p->rope_base_swa > 0 ? p->rope_base_swa
                                                                            : p->rope.base);
    if (rc || !c->window)
        return rc;
    for (int i = 0; i < c->n_layers * c->n_kv_heads; i++)
        if (c->heads[i].n)
            return -EBUSY;
    return kvp_cache_set_swa_factors(c, p->rope_factors_swa);
}

/* Checks a sequence before the step and makes room for its block in every head (and
 * for its attention probabilities), so that nothing can fail once its rows start to
 * enter the cache. */
static int admit_seq(kvp_runstate *s, const kvp_model *m, kvp_batch_seq *q,
                     size_t *att_need)
{
    const kvp_model_config *p = &m->cfg;
    int rows = 0, rc;
    if (!q->cache || !q->tokens || q->n <= 0)
        return -EINVAL;
    if ((rc = cache_windows(m, q->cache)))
        return rc;
    for (int t = 0; t < q->n; t++)
        if (q->tokens[t] < 0 || q->tokens[t] >= p->vocab_size)
            return -EINVAL;
    for (int l = 0; l < p->n_layers; l++)
        for (int kvh = 0; kvh < p->n_kv_heads; kvh++) {
            kvp_head *h = kvp_cache_head(q->cache, l, kvh);
            if ((rc = kvp_head_reserve(h, p->head_dim, h->n + q->n)))
                return rc;
            rows = h->n + q->n > rows ? h->n + q->n : rows;
        }
    size_t need = (size_t)(p->n_heads / p->n_kv_heads) * q->n * rows;
    rc = ensure_att(s, 0, need);
    if (!rc && need > *att_need)
        *att_need = need;
    return rc;
}

static int ensure_batch_logits(kvp_runstate *s, int seqs, int vocab)
{
    if (seqs <= s->batch_logits_cap)
        return 0;
    float *b = realloc(s->batch_logits, (size_t)seqs * vocab * sizeof *b);
    if (!b)
        return -ENOMEM;
    s->batch_logits = b;
    s->batch_logits_cap = seqs;
    return 0;
}

/* x += in . w^T, or with a post-norm (gemma) x += rmsnorm(in . w^T) */
static void residual_add(kvp_runstate *s, const float *post_norm, const float *in,
                         const kvp_weight *w, int T, const kvp_model_config *p)
{
    if (!post_norm) {
        kvp_matmul(s->x, in, w, T, 1);
        return;
    }
    int dim = p->dim;
    kvp_matmul(s->xb, in, w, T, 0);
    for (int t = 0; t < T; t++) {
        float *y = s->xb + (size_t)t * dim, *x = s->x + (size_t)t * dim;
        rmsnorm(y, y, post_norm, dim, p->rms_eps);
        for (int j = 0; j < dim; j++)
            x[j] += y[j];
    }
}

static void output_logits(const kvp_model *m, const float *x, int n, float *logits)
{
    kvp_matmul(logits, x, &m->output, n, 0);
    if (m->cfg.final_softcap > 0)
        softcap(logits, (size_t)n * m->cfg.vocab_size, m->cfg.final_softcap);
}

static int forward_batch(const kvp_model *m, kvp_runstate *s, kvp_batch_seq *seqs, int n_seqs)
{
    const kvp_model_config *p = &m->cfg;
    int dim = p->dim, hd = p->head_dim, hid = p->hidden_dim, V = p->vocab_size;
    int qd = p->n_heads * hd, kvd = p->n_kv_heads * hd, nr = p->rope.n_rot;
    int rc;
    kvp_rope rope_swa = p->rope;   /* the sliding-window layers' RoPE */
    rope_swa.base = p->rope_base_swa > 0 ? p->rope_base_swa : p->rope.base;
    if (p->rope_factors_swa)
        rope_swa.factors = p->rope_factors_swa;

    /* the batch: its rows, one cache per sequence */
    long total = 0;
    for (int i = 0; i < n_seqs; i++) {
        total += !seqs[i].rc && seqs[i].n > 0 ? seqs[i].n : 0;
        for (int j = 0; j < i; j++)
            if (seqs[i].cache == seqs[j].cache)
                return -EINVAL;
    }
    if (n_seqs <= 0 || total > s->max_tokens)
        return -EINVAL;
    if ((rc = ensure_batch_logits(s, n_seqs, V)))
        return rc;
    int T = 0;
    size_t att_need = 0, kv_bytes = 0;   /* the largest attention buffer; rows read */
    for (int i = 0; i < n_seqs; i++) {
        kvp_batch_seq *q = &seqs[i];
        if (q->rc || (q->rc = admit_seq(s, m, q, &att_need)))
            continue;
        kv_bytes += (size_t)q->n * kvp_cache_head(q->cache, 0, 0)->n * kvd * 2 * sizeof(float);
        q->row0 = T;
        /* token embeddings and the RoPE table at the sequence's own positions */
        for (int t = 0; t < q->n; t++) {
            float *x = s->x + (size_t)(T + t) * dim;
            kvp_weight_row(&m->tok_embd, q->tokens[t], x);
            if (p->embd_scale > 0)   /* gemma */
                for (int j = 0; j < dim; j++)
                    x[j] *= p->embd_scale;
            kvp_rope_table(&p->rope, s->rope + (size_t)(T + t) * nr, q->cache->next_pos + t);
            if (s->rope_swa)
                kvp_rope_table(&rope_swa, s->rope_swa + (size_t)(T + t) * nr, q->cache->next_pos + t);
        }
        T += q->n;
    }
    if (T == 0)
        return 0;
    /* a buffer of attention probabilities for every thread the items may run on (fewer
     * threads if memory is short) */
    int slots = 1, threads = kvp_matmul_threads();
    while (slots < threads && !ensure_att(s, slots, att_need))
        slots++;

    for (int l = 0; l < p->n_layers; l++) {
        const kvp_layer *w = &m->layers[l];
        for (int t = 0; t < T; t++)
            rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, w->attn_norm, dim, p->rms_eps);
        kvp_matmul_shared(3, (float *const[]){s->q, s->k, s->v}, s->xb,
                          (const kvp_weight *const[]){&w->wq, &w->wk, &w->wv}, T);
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
        /* RoPE on every q and k head at its token's position (a sliding-window layer
         * with its own base: its own table); phi3's attn_factor then scales the rotated
         * dims, as ggml scales cos and sin */
        const float *table = w->window && s->rope_swa ? s->rope_swa : s->rope;
        float af = p->rope_attn_factor > 0 ? p->rope_attn_factor : 1.0f;
        for (int t = 0; t < T; t++) {
            const float *cs = table + (size_t)t * nr;
            for (int h = 0; h < p->n_heads; h++)
                kvp_rope_apply(&p->rope, s->q + (size_t)t * qd + h * hd, cs);
            for (int h = 0; h < p->n_kv_heads; h++)
                kvp_rope_apply(&p->rope, s->k + (size_t)t * kvd + h * hd, cs);
            for (int h = 0; af != 1.0f && h < p->n_heads + p->n_kv_heads; h++) {
                float *x = h < p->n_heads ? s->q + (size_t)t * qd + h * hd
                                          : s->k + (size_t)t * kvd + (h - p->n_heads) * hd;
                for (int j = 0; j < nr; j++)
                    x[j] *= af;
            }
        }
        /* attention, each sequence over its own cache: the blocks' rows enter the caches
         * (and are scored) in order, then the (sequence, KV head) items run on every
         * core; the pool's threads poll for more only when the pool runs the matmuls */
        for (int i = 0; i < n_seqs; i++)
            if (!seqs[i].rc)
                store_seq(s, p, &seqs[i], l, w->window);
        attend_job aj = {s, p, seqs, l, w->window};
        kvp_matmul_parallel(n_seqs * p->n_kv_heads, attend_item, &aj, kv_bytes, slots,
                            kvp_matmul_pooled(&w->wo, T));
        /* a sliding-window layer keeps only what the next token can see */
        for (int i = 0; w->window && i < n_seqs; i++)
            if (!seqs[i].rc)
                kvp_cache_slide(seqs[i].cache, l, seqs[i].cache->n_seen + seqs[i].n);
        residual_add(s, w->post_attn_norm, s->att_out, &w->wo, T, p);

        for (int t = 0; t < T; t++)
            rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, w->ffn_norm, dim, p->rms_eps);
        kvp_matmul_shared(2, (float *const[]){s->hb, s->hb2}, s->xb,
                          (const kvp_weight *const[]){&w->w_gate, &w->w_up}, T);
        for (size_t i = 0; i < (size_t)T * hid; i++) {
            float g = s->hb[i];
            s->hb[i] = (p->gelu ? gelu(g) : g / (1.0f + expf(-g))) * s->hb2[i];
        }
        residual_add(s, w->post_ffn_norm, s->hb, &w->w_down, T, p);
    }

    /* logits: every row of a sequence that asks for them, else its last row only (those
     * gathered into xb2 and run together) */
    int n_last = 0;
    for (int i = 0; i < n_seqs; i++) {
        kvp_batch_seq *q = &seqs[i];
        if (q->rc)
            continue;
        if (q->all_logits) {
            for (int t = q->row0; t < q->row0 + q->n; t++)
                rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, m->out_norm, dim, p->rms_eps);
            output_logits(m, s->xb + (size_t)q->row0 * dim, q->n, q->all_logits);
            if (q->hidden)
                memcpy(q->hidden, s->xb + (size_t)(q->row0 + q->n - 1) * dim, dim * sizeof(float));
            float *last = q->all_logits + (size_t)(q->n - 1) * V;
            if (q->logits)
                memcpy(q->logits, last, V * sizeof(float));
            else
                q->logits = last;
        } else {
            float *row = s->xb2 + (size_t)n_last++ * dim;
            rmsnorm(row, s->x + (size_t)(q->row0 + q->n - 1) * dim, m->out_norm, dim, p->rms_eps);
            if (q->hidden)
                memcpy(q->hidden, row, dim * sizeof(float));
        }
    }
    if (n_last)
        output_logits(m, s->xb2, n_last, s->batch_logits);
    for (int i = 0, j = 0; i < n_seqs; i++) {
        kvp_batch_seq *q = &seqs[i];
        if (q->rc)
            continue;
        if (!q->all_logits) {
            float *row = s->batch_logits + (size_t)j++ * V;
            if (q->logits)
                memcpy(q->logits, row, V * sizeof(float));
            else
                q->logits = row;
        }
        q->cache->next_pos += q->n;
        q->cache->n_seen += q->n;
    }
    return 0;
}

int kvp_forward_batch(const kvp_model *m, kvp_runstate *s, kvp_batch_seq *seqs, int n_seqs)
{
    kvp_matmul_enter();  /* the matmul pool serves one forward pass at a time */
    int rc = forward_batch(m, s, seqs, n_seqs);
    kvp_matmul_leave();
    return rc;
}

void kvp_forward_logits(const kvp_model *m, const float *x, int n, float *logits)
{
    kvp_matmul_enter();
    output_logits(m, x, n, logits);
    kvp_matmul_leave();
}

int kvp_forward(const kvp_model *m, kvp_runstate *s, kvp_cache *c,
                const int *tokens, int n, float *all_logits)
{
    kvp_batch_seq one = {.cache = c, .tokens = tokens, .n = n, .logits = s->logits,
                         .all_logits = all_logits, .hooks = s->hooks};
    int rc = kvp_forward_batch(m, s, &one, 1);
    return rc ? rc : one.rc;
}
