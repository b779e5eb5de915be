/* baselines.c: every policy is driven the way the forward pass and generate.c drive it
 * (blocks of rows appended to every head, on_insert, on_attention with random causal
 * attention rows, evictions on a trigger, at random turn boundaries and of single
 * heads), and after every eviction the kept rows of every head must be exactly those of
 * a brute-force reference of the policy's rule, written out plainly below. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "offline/oracle.h"
#include "cache/rope.h"
#include "model/sampler.h"
#include "policy/policy.h"

#define LAYERS 2
#define KVH 2
#define GROUP 2
#define NH (KVH * GROUP)
#define D 8
#define HEADS (LAYERS * KVH)
#define SINKS 4
#define RECENT 16
#define CHUNK 32
#define TOKENS 520
#define LAG 128
#define SNAP_W 32
#define EA_W 64        /* Expected Attention's query window */
#define EA_FUTURE 512  /* and the future positions it averages RoPE over */

static const int budgets[] = { 3, 12, 20, 36, 64, 150, 300, 100000 };
static const uint64_t seeds[] = { 1, 2, 3 };

/* ---- test inputs ------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double rng_unit(uint64_t *s)  /* (0, 1) */
{
    return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

static int rng_int(uint64_t *s, int lo, int hi)  /* [lo, hi] */
{
    return lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static double rng_normal(uint64_t *s)
{
    return sqrt(-2.0 * log(rng_unit(s))) * cos(6.283185307179586 * rng_unit(s));
}

static kvp_model_config test_cfg(void)
{
    return (kvp_model_config){ .dim = NH * D, .hidden_dim = 64, .n_layers = LAYERS,
                               .n_heads = NH, .n_kv_heads = KVH, .head_dim = D,
                               .vocab_size = 32, .seq_len = 4096, .rope = {.n_rot = D, .base = 10000.0f},
                               .rms_eps = 1e-5f };
}

/* ---- the simulation and its mirror --------------------------------------------------- */

typedef struct mrow {
    int64_t seq;
    int32_t pos;
    float k[D], v[D];
    float rnd;        /* random: the draw it got at insertion */
    double h2o;       /* attention received, summed over queries, mean over the group */
    double tova;      /* attention of the newest query, mean over the group */
    float oracle;     /* the evaluator's score */
} mrow;

typedef struct mquery {
    int64_t seq;
    int32_t pos;      /* the position the query was rotated at */
    float q[GROUP * D];
} mquery;

typedef struct mhead {
    mrow rows[TOKENS];
    int n;
    mquery qs[TOKENS];
    int nq;
} mhead;

typedef struct sim {
    const char *name;
    int budget;
    uint64_t seed;
    kvp_policy *p;
    kvp_cache c;
    mhead *m;             /* [HEADS] */
    uint64_t in;          /* test input stream */
    uint64_t replay;      /* copy of the policy's rng: random's expected draws */
    float offset[HEADS][D];
    int evictions;        /* evictions that dropped rows */
} sim;

static void sim_init(sim *s, const char *name, uint64_t seed, int budget)
{
    memset(s, 0, sizeof *s);
    s->name = name;
    s->budget = budget;
    s->seed = seed;
    s->in = 0x9E3779B97F4A7C15ull ^ (seed * 0x100000001B3ull) ^ (uint64_t)budget;
    kvp_model_config cfg = test_cfg();
    char err[256];
    cr_assert_eq(kvp_offline_policy_create(&s->p, name, NULL, &cfg, seed, err, sizeof err), 0,
                 "%s: %s", name, err);
    s->replay = s->p->rng;
    cr_assert_eq(kvp_cache_init(&s->c, LAYERS, KVH, D, &cfg.rope), 0);
    s->m = calloc(HEADS, sizeof *s->m);
    cr_assert_not_null(s->m);
    /* a shared direction per head gives KeyDiff a meaningful mean key */
    for (int hi = 0; hi < HEADS; hi++)
        for (int j = 0; j < D; j++)
            s->offset[hi][j] = (float)rng_normal(&s->in);
}

static void sim_free(sim *s)
{
    kvp_policy_destroy(s->p);
    kvp_cache_free(&s->c);
    free(s->m);
}

/* One block of n tokens: rows into every head (as the forward pass writes them), then
 * on_insert, then on_attention with n queries whose attention is causal. */
static void sim_block(sim *s, int n)
{
    const kvp_policy_ops *ops = s->p->ops;
    for (int l = 0; l < LAYERS; l++)
        for (int kvh = 0; kvh < KVH; kvh++) {
            int hi = l * KVH + kvh;
            kvp_head *h = kvp_cache_head(&s->c, l, kvh);
            mhead *mh = &s->m[hi];
            int base = h->n;
            cr_assert_eq(kvp_head_reserve(h, D, base + n), 0);
            for (int t = 0; t < n; t++) {
                int r = base + t;
                mrow *mr = &mh->rows[mh->n + t];
                memset(mr, 0, sizeof *mr);
                mr->seq = s->c.n_seen + t;
                mr->pos = (int32_t)(s->c.next_pos + t);
                float scale = (float)(0.3 + 1.7 * rng_unit(&s->in));
                for (int j = 0; j < D; j++) {
                    mr->k[j] = s->offset[hi][j] + scale * (float)rng_normal(&s->in);
                    mr->v[j] = (float)rng_normal(&s->in);
                }
                memcpy((float *)h->k + (size_t)r * D, mr->k, sizeof mr->k);
                memcpy((float *)h->v + (size_t)r * D, mr->v, sizeof mr->v);
                h->pos[r] = s->c.next_pos + t;
                h->seq[r] = mr->seq;
                h->score[r] = 0.0f;
                h->stat[r] = 0.0f;
            }
            h->n = base + n;
            if (ops->on_insert) {
                ops->on_insert(s->p, l, kvh, h, base, n);
                for (int t = 0; t < n; t++)
                    mh->rows[mh->n + t].rnd = kvp_rand_f32(&s->replay);
            }
            mh->n += n;
            cr_assert_eq(mh->n, h->n);
            if (!ops->wants_attention)
                continue;

            /* queries of all query heads, as the forward pass lays them out */
            float *q = malloc((size_t)n * NH * D * sizeof *q);
            for (int i = 0; i < n * NH * D; i++)
                q[i] = (float)rng_normal(&s->in);
            int stride = h->n + 3;
            float *att = malloc((size_t)GROUP * n * stride * sizeof *att);
            for (int g = 0; g < GROUP; g++)
                for (int t = 0; t < n; t++) {
                    float *a = att + (size_t)(g * n + t) * stride;
                    int seen = h->n - n + t + 1;  /* causal: rows up to the query's own */
                    double sum = 0.0;
                    for (int i = 0; i < seen; i++)
                        sum += a[i] = (float)(1.0 / (rng_unit(&s->in) + 0.01));  /* heavy tail */
                    for (int i = 0; i < seen; i++)
                        a[i] = (float)(a[i] / sum);
                    for (int i = seen; i < h->n; i++)
                        a[i] = 0.0f;
                    for (int i = h->n; i < stride; i++)
                        a[i] = NAN;  /* past the rows: must never be read */
                }
            ops->on_attention(s->p, l, kvh, h, q + (size_t)kvh * GROUP * D, NH * D, att,
                              stride, n);
            for (int i = 0; i < h->n; i++) {
                double last = 0.0;
                for (int g = 0; g < GROUP; g++) {
                    for (int t = 0; t < n; t++)
                        mh->rows[i].h2o += att[(size_t)(g * n + t) * stride + i] / GROUP;
                    last += att[(size_t)(g * n + n - 1) * stride + i];
                }
                mh->rows[i].tova = last / GROUP;
            }
            for (int t = 0; t < n; t++) {
                mquery *mq = &mh->qs[mh->nq++];
                mq->seq = mh->rows[mh->n - n + t].seq;
                mq->pos = mh->rows[mh->n - n + t].pos;
                for (int g = 0; g < GROUP; g++)
                    memcpy(mq->q + g * D, q + (size_t)t * NH * D + (size_t)(kvh * GROUP + g) * D,
                           D * sizeof(float));
            }
            free(q);
            free(att);
        }
    s->c.n_seen += n;
    s->c.next_pos += n;
}

/* ---- the reference rules ------------------------------------------------------------- */

static double norm(const float *x)
{
    double s = 0.0;
    for (int j = 0; j < D; j++)
        s += (double)x[j] * x[j];
    return sqrt(s);
}

/* LagKV for K (which = 0) or V (1): adds half the partition softmax of normalised
 * per-token std to sc; returns the rows after the last scored partition. */
static int ref_lagkv(const mhead *mh, int which, double *sc)
{
    int start = SINKS;
    for (; start + LAG < mh->n; start += LAG) {
        int next = start + LAG, n_next = mh->n - next < LAG ? mh->n - next : LAG;
        double mn[D], mx[D], sd[LAG], top = -INFINITY, z = 0.0;
        for (int j = 0; j < D; j++) {
            mn[j] = INFINITY;
            mx[j] = -INFINITY;
            for (int r = next; r < next + n_next; r++) {
                double x = which ? mh->rows[r].v[j] : mh->rows[r].k[j];
                mn[j] = x < mn[j] ? x : mn[j];
                mx[j] = x > mx[j] ? x : mx[j];
            }
        }
        for (int r = 0; r < LAG; r++) {
            double y[D], mean = 0.0, var = 0.0;
            for (int j = 0; j < D; j++) {
                double x = which ? mh->rows[start + r].v[j] : mh->rows[start + r].k[j];
                y[j] = (x - mn[j]) / (mx[j] > mn[j] ? mx[j] - mn[j] : 1.0);
                mean += y[j] / D;
            }
            for (int j = 0; j < D; j++)
                var += (y[j] - mean) * (y[j] - mean) / (D - 1);
            sd[r] = sqrt(var);
            top = sd[r] > top ? sd[r] : top;
        }
        for (int r = 0; r < LAG; r++)
            z += exp(sd[r] - top);
        for (int r = 0; r < LAG; r++)
            sc[start + r] += 0.5 * exp(sd[r] - top) / z;
    }
    return mh->n - start;
}

static void ref_snapkv(const mhead *mh, double *sc)
{
    int first = mh->nq > SNAP_W ? mh->nq - SNAP_W : 0, w = mh->nq - first;
    double *acc = calloc((size_t)mh->n, sizeof *acc);
    for (int j = first; j < mh->nq; j++)
        for (int g = 0; g < GROUP; g++) {
            const float *q = mh->qs[j].q + g * D;
            double *lg = malloc((size_t)mh->n * sizeof *lg), top = -INFINITY, z = 0.0;
            int seen = 0;
            for (int i = 0; i < mh->n; i++) {
                if (mh->rows[i].seq > mh->qs[j].seq)
                    continue;
                double dot = 0.0;
                for (int c = 0; c < D; c++)
                    dot += (double)q[c] * mh->rows[i].k[c];
                lg[i] = dot / sqrt((double)D);
                top = lg[i] > top ? lg[i] : top;
                seen = i + 1;
            }
            for (int i = 0; i < seen; i++)
                z += exp(lg[i] - top);
            for (int i = 0; i < seen; i++)
                acc[i] += exp(lg[i] - top) / z / (w * GROUP);
            free(lg);
        }
    for (int i = 0; i < mh->n; i++) {
        double s = 0.0;
        for (int j = i - 2; j <= i + 2; j++)
            if (j >= 0 && j < mh->n)
                s += acc[j];
        sc[i] = s / 5.0;
    }
    free(acc);
}

/* ---- Expected Attention, written out with d x d matrices in double precision ---------- */

/* RoPE's rotation at `pos` as a matrix m[d][d]: pair i turns by pos * base^(-2i/n_rot) /
 * factors[i], its floats consecutive or the two halves of the rotated part. */
static void ref_rope_matrix(const kvp_rope *r, int d, double pos, double *m)
{
    memset(m, 0, (size_t)d * d * sizeof *m);
    for (int c = 0; c < d; c++)
        m[c * d + c] = 1.0;
    for (int i = 0; i < r->n_rot / 2; i++) {
        double th = pos * pow((double)r->base, -2.0 * i / r->n_rot);
        if (r->factors)
            th /= r->factors[i];
        int a = r->neox ? i : 2 * i, b = r->neox ? i + r->n_rot / 2 : 2 * i + 1;
        m[a * d + a] = cos(th);
        m[a * d + b] = -sin(th);
        m[b * d + a] = sin(th);
        m[b * d + b] = cos(th);
    }
}

/* What the reference leaves out, to show the comparisons can tell. */
enum { EA_EXACT, EA_NO_VARIANCE, EA_ROTATE_AT_NEXT, EA_NO_ROTATION };

/* Scores of n rows (keys k, values v, [n][d]) from m queries qs[m][group * d] as the model
 * rotated them (query j at position qpos[j]); the future starts one past newest_pos. */
static void ref_expatt(const kvp_rope *rope, double scale, int d, int group, const float *k,
                       const float *v, int n, int32_t newest_pos, const float *qs,
                       const int32_t *qpos, int m, int variant, double *sc)
{
    double *R = malloc((size_t)d * d * sizeof *R), *Rb = calloc((size_t)d * d, sizeof *Rb);
    double *S = malloc((size_t)d * d * sizeof *S), *T = malloc((size_t)d * d * sizeof *T);
    double *q0 = malloc((size_t)m * d * sizeof *q0), *mu = malloc((size_t)d * sizeof *mu);
    double *mur = malloc((size_t)d * sizeof *mur), *lg = malloc((size_t)n * sizeof *lg);
    int ns = n < SINKS ? n : SINKS;
    int futures = variant == EA_ROTATE_AT_NEXT ? 1 : EA_FUTURE;
    for (int f = 0; f < futures; f++) {
        ref_rope_matrix(rope, d, (double)newest_pos + 1 + f, R);
        for (int i = 0; i < d * d; i++)
            Rb[i] += R[i] / futures;
    }
    if (variant == EA_NO_ROTATION)
        ref_rope_matrix(rope, d, 0.0, Rb);
    for (int i = 0; i < n; i++)
        sc[i] = 0.0;
    for (int g = 0; g < group; g++) {
        /* the queries before RoPE: R(pos)^T q */
        for (int j = 0; j < m; j++) {
            ref_rope_matrix(rope, d, qpos[j], R);
            const float *q = qs + ((size_t)j * group + g) * d;
            for (int a = 0; a < d; a++) {
                q0[j * d + a] = 0.0;
                for (int b = 0; b < d; b++)
                    q0[j * d + a] += R[b * d + a] * q[b];
            }
        }
        for (int a = 0; a < d; a++) {
            mu[a] = 0.0;
            for (int j = 0; j < m; j++)
                mu[a] += q0[j * d + a] / m;
        }
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) {
                S[a * d + b] = 0.0;
                for (int j = 0; j < m; j++)
                    S[a * d + b] += (q0[j * d + a] - mu[a]) * (q0[j * d + b] - mu[b]) / m;
            }
        /* mean and covariance of the future query: Rbar mu, Rbar S Rbar^T */
        for (int a = 0; a < d; a++) {
            mur[a] = 0.0;
            for (int b = 0; b < d; b++)
                mur[a] += Rb[a * d + b] * mu[b];
        }
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) {
                T[a * d + b] = 0.0;
                for (int c = 0; c < d; c++)
                    T[a * d + b] += S[a * d + c] * Rb[b * d + c];   /* S Rbar^T */
            }
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) {
                S[a * d + b] = 0.0;
                for (int c = 0; c < d; c++)
                    S[a * d + b] += Rb[a * d + c] * T[c * d + b];
            }
        double top = -INFINITY, z = 0.0;
        for (int i = ns; i < n; i++) {
            const float *ki = k + (size_t)i * d;
            double dot = 0.0, quad = 0.0;
            for (int a = 0; a < d; a++) {
                dot += mur[a] * ki[a];
                for (int b = 0; b < d; b++)
                    quad += ki[a] * S[a * d + b] * ki[b];
            }
            lg[i] = scale * dot + (variant == EA_NO_VARIANCE ? 0.0 : scale * scale * quad / 2.0);
            top = lg[i] > top ? lg[i] : top;
        }
        for (int i = ns; i < n; i++)
            z += exp(lg[i] - top);
        for (int i = ns; i < n; i++)
            sc[i] += exp(lg[i] - top) / z / group;
    }
    double best = -INFINITY;
    for (int i = ns; i < n; i++) {
        double vn = 0.0;
        for (int a = 0; a < d; a++)
            vn += (double)v[(size_t)i * d + a] * v[(size_t)i * d + a];
        sc[i] *= sqrt(vn);
        best = sc[i] > best ? sc[i] : best;
    }
    for (int i = 0; i < ns; i++)
        sc[i] = ns < n ? best : 0.0;
    free(R);
    free(Rb);
    free(S);
    free(T);
    free(q0);
    free(mu);
    free(mur);
    free(lg);
}

/* The simulation's head: its last EA_W queries of tokens past the sinks. */
static void ref_expatt_sim(const mhead *mh, double *sc)
{
    int idx[TOKENS], m = 0;
    for (int j = 0; j < mh->nq; j++)
        if (mh->qs[j].seq >= SINKS)
            idx[m++] = j;
    int first = m > EA_W ? m - EA_W : 0;
    m -= first;
    float *k = malloc((size_t)mh->n * D * sizeof *k), *v = malloc((size_t)mh->n * D * sizeof *v);
    float *qs = malloc(((size_t)m + 1) * GROUP * D * sizeof *qs);
    int32_t qpos[EA_W];
    for (int i = 0; i < mh->n; i++) {
        memcpy(k + (size_t)i * D, mh->rows[i].k, sizeof mh->rows[i].k);
        memcpy(v + (size_t)i * D, mh->rows[i].v, sizeof mh->rows[i].v);
    }
    for (int j = 0; j < m; j++) {
        memcpy(qs + (size_t)j * GROUP * D, mh->qs[idx[first + j]].q, sizeof mh->qs[0].q);
        qpos[j] = mh->qs[idx[first + j]].pos;
    }
    kvp_model_config cfg = test_cfg();
    ref_expatt(&cfg.rope, 1.0 / sqrt((double)D), D, GROUP, k, v, mh->n,
               mh->rows[mh->n - 1].pos, qs, qpos, m, EA_EXACT, sc);
    free(k);
    free(v);
    free(qs);
}

/* Scores (higher = keep) of mh's rows under the policy's rule and its recent window. */
static void ref_scores(const sim *s, const mhead *mh, double *sc, int *window)
{
    const char *nm = s->name;
    *window = RECENT;
    memset(sc, 0, (size_t)mh->n * sizeof *sc);
    if (!strcmp(nm, "random")) {
        for (int i = 0; i < mh->n; i++)
            sc[i] = mh->rows[i].rnd;
    } else if (!strcmp(nm, "streaming")) {
        for (int i = 0; i < mh->n; i++)
            sc[i] = (double)mh->rows[i].seq;
    } else if (!strcmp(nm, "knorm")) {
        for (int i = 0; i < mh->n; i++)
            sc[i] = -norm(mh->rows[i].k);
    } else if (!strcmp(nm, "keydiff")) {
        double a[D] = { 0 };
        for (int i = 0; i < mh->n; i++)
            for (int j = 0; j < D; j++)
                a[j] += mh->rows[i].k[j] / norm(mh->rows[i].k) / mh->n;
        double na = 0.0;
        for (int j = 0; j < D; j++)
            na += a[j] * a[j];
        for (int i = 0; i < mh->n; i++) {
            double dot = 0.0;
            for (int j = 0; j < D; j++)
                dot += mh->rows[i].k[j] * a[j];
            sc[i] = -dot / (norm(mh->rows[i].k) * sqrt(na));
        }
    } else if (!strcmp(nm, "lagkv")) {
        int last = ref_lagkv(mh, 0, sc);
        ref_lagkv(mh, 1, sc);
        *window = last > RECENT ? last : RECENT;
    } else if (!strcmp(nm, "h2o")) {
        for (int i = 0; i < mh->n; i++)
            sc[i] = mh->rows[i].h2o;
        *window = s->budget / 2;
    } else if (!strcmp(nm, "tova")) {
        for (int i = 0; i < mh->n; i++)
            sc[i] = mh->rows[i].tova;
    } else if (!strcmp(nm, "snapkv")) {
        ref_snapkv(mh, sc);
        *window = SNAP_W > RECENT ? SNAP_W : RECENT;
    } else if (!strcmp(nm, "expected_attention")) {
        ref_expatt_sim(mh, sc);
    } else if (!strcmp(nm, "oracle")) {
        for (int i = 0; i < mh->n; i++)
            sc[i] = mh->rows[i].oracle;
    } else {
        cr_assert_fail("no reference for %s", nm);
    }
}

typedef struct cand {
    double score;
    int64_t seq;
    int row;
} cand;

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Marks kept[r] for the rows the rule keeps at s->budget; returns how many. */
static int ref_keep(const sim *s, const mhead *mh, char *kept, int *window)
{
    int n = mh->n, b = s->budget;
    memset(kept, 1, (size_t)n);
    if (!strcmp(s->name, "none") || n <= b)
        return n;
    double *sc = malloc((size_t)n * sizeof *sc);
    ref_scores(s, mh, sc, window);
    memset(kept, 0, (size_t)n);
    char *prot = calloc((size_t)n, 1);
    int n_prot = 0;
    for (int r = 0; r < n; r++)
        if (r < SINKS || r >= n - *window) {
            prot[r] = 1;
            n_prot++;
        }
    if (b <= n_prot) {
        int k = 0;
        for (int r = 0; r < SINKS && k < b; r++, k++)
            kept[r] = 1;
        for (int r = n - 1; k < b; r--, k++)
            kept[r] = 1;
    } else {
        cand *cs = malloc((size_t)n * sizeof *cs);
        int m = 0;
        for (int r = 0; r < n; r++)
            if (prot[r])
                kept[r] = 1;
            else
                cs[m++] = (cand){ sc[r], mh->rows[r].seq, r };
        qsort(cs, (size_t)m, sizeof *cs, cand_cmp);
        for (int i = 0; i < b - n_prot; i++)
            kept[cs[i].row] = 1;
        free(cs);
    }
    free(prot);
    free(sc);
    return b;
}

/* Evicts head hi (or every head when hi < 0) and checks the result against the mirror. */
static void sim_evict(sim *s, int hi)
{
    if (!strcmp(s->name, "oracle"))
        for (int x = 0; x < HEADS; x++) {
            kvp_head *h = &s->c.heads[x];
            for (int i = 0; i < h->n; i++)
                h->score[i] = s->m[x].rows[i].oracle = (float)rng_unit(&s->in);
        }
    char *kept[HEADS] = { 0 };
    int want[HEADS], window[HEADS], expect_drop = 0;
    for (int x = 0; x < HEADS; x++) {
        if (hi >= 0 && x != hi)
            continue;
        kept[x] = malloc((size_t)s->m[x].n);
        window[x] = RECENT;
        want[x] = ref_keep(s, &s->m[x], kept[x], &window[x]);
        expect_drop += s->m[x].n - want[x];
    }
    int dropped = hi < 0 ? kvp_policy_evict(s->p, &s->c, s->budget)
                         : kvp_policy_evict_head(s->p, &s->c, hi / KVH, hi % KVH, s->budget);
    cr_assert_eq(dropped, expect_drop, "%s seed %llu budget %d: dropped %d, want %d", s->name,
                 (unsigned long long)s->seed, s->budget, dropped, expect_drop);
    if (dropped > 0)
        s->evictions++;
    for (int x = 0; x < HEADS; x++) {
        kvp_head *h = &s->c.heads[x];
        mhead *mh = &s->m[x];
        if (!kept[x])
            continue;
        int old_n = mh->n;
        if (strcmp(s->name, "none"))
            cr_assert_leq(h->n, s->budget);
        cr_assert_eq(h->n, want[x], "%s seed %llu budget %d head %d: %d rows, want %d",
                     s->name, (unsigned long long)s->seed, s->budget, x, h->n, want[x]);
        /* sinks and the recent window survive whenever the budget holds them */
        if (old_n > s->budget && s->budget >= SINKS + window[x]) {
            for (int i = 0; i < SINKS; i++)
                cr_assert_eq(h->seq[i], mh->rows[i].seq, "%s: sink %d evicted", s->name, i);
            for (int i = 1; i <= window[x]; i++)
                cr_assert_eq(h->seq[h->n - i], mh->rows[old_n - i].seq,
                             "%s: recent row evicted", s->name);
        }
        int r = 0;
        for (int i = 0; i < old_n; i++) {
            if (!kept[x][i])
                continue;
            cr_assert_eq(h->seq[r], mh->rows[i].seq,
                         "%s seed %llu budget %d head %d: row %d holds seq %lld, want %lld",
                         s->name, (unsigned long long)s->seed, s->budget, x, r,
                         (long long)h->seq[r], (long long)mh->rows[i].seq);
            cr_assert_eq(memcmp((float *)h->k + (size_t)r * D, mh->rows[i].k, sizeof mh->rows[i].k), 0);
            cr_assert_eq(memcmp((float *)h->v + (size_t)r * D, mh->rows[i].v, sizeof mh->rows[i].v), 0);
            mh->rows[r++] = mh->rows[i];
        }
        mh->n = r;
        free(kept[x]);
    }
}

/* A conversation of TOKENS tokens: a prefill, then decode steps and small blocks. */
static void sim_run(sim *s)
{
    for (int fed = 0, first = 1; fed < TOKENS; first = 0) {
        int n = first ? rng_int(&s->in, 1, 96)
                      : rng_int(&s->in, 0, 1) ? 1 : rng_int(&s->in, 2, 40);
        n = n < TOKENS - fed ? n : TOKENS - fed;
        sim_block(s, n);
        fed += n;
        if (kvp_cache_max_rows(&s->c) > s->budget + CHUNK || rng_int(&s->in, 0, 9) == 0)
            sim_evict(s, -1);
        else if (rng_int(&s->in, 0, 7) == 0)
            sim_evict(s, rng_int(&s->in, 0, HEADS - 1));
    }
    sim_evict(s, -1);
}

static void check_policy(const char *name)
{
    int evictions = 0;
    for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++)
        for (size_t bi = 0; bi < sizeof budgets / sizeof budgets[0]; bi++) {
            sim s;
            sim_init(&s, name, seeds[si], budgets[bi]);
            sim_run(&s);
            for (int x = 0; x < HEADS; x++)
                cr_assert_leq(s.c.heads[x].n, strcmp(name, "none") ? s.budget : TOKENS);
            evictions += s.evictions;
            sim_free(&s);
        }
    if (strcmp(name, "none"))
        cr_assert_gt(evictions, 100, "%s: the runs hardly evicted", name);
    else
        cr_assert_eq(evictions, 0);
}

Test(baselines, none_matches_reference) { check_policy("none"); }
Test(baselines, random_matches_reference) { check_policy("random"); }
Test(baselines, streaming_matches_reference) { check_policy("streaming"); }
Test(baselines, knorm_matches_reference) { check_policy("knorm"); }
Test(baselines, keydiff_matches_reference) { check_policy("keydiff"); }
Test(baselines, lagkv_matches_reference) { check_policy("lagkv"); }
Test(baselines, h2o_matches_reference) { check_policy("h2o"); }
Test(baselines, tova_matches_reference) { check_policy("tova"); }
Test(baselines, snapkv_matches_reference) { check_policy("snapkv"); }
Test(baselines, expected_attention_matches_reference) { check_policy("expected_attention"); }
Test(baselines, oracle_matches_reference) { check_policy("oracle"); }

/* ---- properties beyond the reference ------------------------------------------------ */

/* The scores and kept rows of a whole random run, for comparing runs. */
static void random_run(uint64_t seed, float *scores, int64_t *seqs)
{
    sim s;
    sim_init(&s, "random", seed, 64);
    s.in = 42;  /* the same inputs and triggers for every seed */
    sim_run(&s);
    for (int x = 0; x < HEADS; x++)
        for (int i = 0; i < 64; i++) {
            cr_assert_eq(s.c.heads[x].n, 64);
            scores[x * 64 + i] = s.c.heads[x].score[i];
            seqs[x * 64 + i] = s.c.heads[x].seq[i];
        }
    sim_free(&s);
}

Test(baselines, random_is_reproducible_by_seed)
{
    static float sa[HEADS * 64], sb[HEADS * 64], sc[HEADS * 64];
    static int64_t qa[HEADS * 64], qb[HEADS * 64], qc[HEADS * 64];
    random_run(11, sa, qa);
    random_run(11, sb, qb);
    random_run(12, sc, qc);
    cr_assert_eq(memcmp(sa, sb, sizeof sa), 0);
    cr_assert_eq(memcmp(qa, qb, sizeof qa), 0);
    cr_assert_neq(memcmp(sa, sc, sizeof sa), 0);
    cr_assert_neq(memcmp(qa, qc, sizeof qa), 0);
}

Test(baselines, only_attention_policies_want_attention)
{
    const char *names[] = { "none", "random", "streaming", "knorm", "keydiff", "lagkv",
                            "h2o", "tova", "snapkv", "expected_attention" };
    kvp_model_config cfg = test_cfg();
    char err[256];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        kvp_policy *p;
        cr_assert_eq(kvp_offline_policy_create(&p, names[i], NULL, &cfg, 1, err, sizeof err), 0);
        int want = !strcmp(names[i], "h2o") || !strcmp(names[i], "tova") ||
                   !strcmp(names[i], "snapkv") || !strcmp(names[i], "expected_attention");
        cr_assert_eq(p->ops->wants_attention, want, "%s", names[i]);
        cr_assert_eq(p->ops->on_attention != NULL, want, "%s", names[i]);
        kvp_policy_destroy(p);
    }
}

/* A context shift that moves every row by the same offset keeps all relative positions,
 * so the scores of SnapKV and Expected Attention must not change: SnapKV's stored window
 * queries follow their rows, Expected Attention's future positions follow the newest row,
 * in the model's RoPE variant. */
static void shift_case(const char *name, kvp_rope rope)
{
    kvp_model_config cfg = {.dim = 32, .hidden_dim = 64, .n_layers = 1, .n_heads = 2,
                            .n_kv_heads = 1, .head_dim = 16, .vocab_size = 10,
                            .seq_len = 512, .rope = rope, .rms_eps = 1e-5f};
    char err[128];
    kvp_policy *p;
    cr_assert_eq(kvp_offline_policy_create(&p, name, NULL, &cfg, 1, err, sizeof err), 0, "%s", err);
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, 1, 16, &cfg.rope), 0);
    kvp_head *h = kvp_cache_head(&c, 0, 0);
    enum { N = 100, P0 = 400 };   /* rows at positions 400..499: all in the newest quarter */
    cr_assert_eq(kvp_head_reserve(h, 16, N), 0);
    uint64_t rng = 5;
    float q[N][2 * 16];
    for (int r = 0; r < N; r++) {
        for (int d = 0; d < 16; d++) {
            ((float *)h->k)[r * 16 + d] = kvp_rand_f32(&rng) - 0.5f;
            ((float *)h->v)[r * 16 + d] = kvp_rand_f32(&rng);
            q[r][d] = kvp_rand_f32(&rng) - 0.5f;
            q[r][16 + d] = kvp_rand_f32(&rng) - 0.5f;
        }
        kvp_rope_rotate(&cfg.rope, (float *)h->k + r * 16, P0 + r);
        kvp_rope_rotate(&cfg.rope, q[r], P0 + r);
        kvp_rope_rotate(&cfg.rope, q[r] + 16, P0 + r);
        h->pos[r] = P0 + r;
        h->seq[r] = 1000 + r;
        h->n = r + 1;
        p->ops->on_attention(p, 0, 0, h, q[r], 32, NULL, 0, 1);
    }
    c.next_pos = P0 + N;
    c.n_seen = 1000 + N;
    float before[N];
    p->ops->before_evict(p, 0, 0, h);
    memcpy(before, h->score, sizeof before);
    kvp_cache_shift(&c, 4, 512);
    cr_assert_eq(h->pos[0], P0 - (P0 + N - 384), "a uniform shift");
    p->ops->before_evict(p, 0, 0, h);
    for (int r = 0; r < N; r++)
        cr_assert_float_eq(h->score[r], before[r], 1e-5f, "%s row %d: %g vs %g", name, r,
                           h->score[r], before[r]);
    kvp_cache_free(&c);
    kvp_policy_destroy(p);
}

static const float snap_factors[8] = {1, 1, 2, 4, 8, 16, 32, 64};
/* consecutive pairs; then NeoX, partial rotary and frequency factors */
static const kvp_rope shift_ropes[] = {
    {.n_rot = 16, .base = 10000.0f},
    {.n_rot = 16, .neox = 1, .base = 1000000.0f},
    {.n_rot = 8, .neox = 1, .base = 10000.0f},
    {.n_rot = 16, .base = 500000.0f, .factors = snap_factors},
};
#define N_SHIFT_ROPES (int)(sizeof shift_ropes / sizeof shift_ropes[0])
Test(baselines, snapkv_scores_survive_a_context_shift)
{
    shift_case("snapkv", shift_ropes[0]);
}
Test(baselines, snapkv_scores_survive_a_context_shift_neox_partial_factors)
{
    for (int i = 1; i < N_SHIFT_ROPES; i++)
        shift_case("snapkv", shift_ropes[i]);
}
Test(baselines, expected_attention_scores_survive_a_context_shift)
{
    for (int i = 0; i < N_SHIFT_ROPES; i++)
        shift_case("expected_attention", shift_ropes[i]);
}

/* ---- Expected Attention at model shapes --------------------------------------------- */

/* One KV head pair (two KV heads of one layer) of head_dim 16 and `group` query heads
 * each, fed 150 tokens in blocks at positions 300.. as the forward pass does: keys and
 * queries rotated at their positions, the queries drawn around a per-head mean with
 * per-channel spreads (so the mean, the variance term and the RoPE averaging all weigh).
 * Every head's scores must match the double-precision reference, and differ from it
 * clearly when the reference drops the variance term, rotates the statistics to the next
 * position only, or not at all. */
static void ea_shape(kvp_rope rope, int group, float query_scale)
{
    enum { ED = 16, EKV = 2, N = 150, P0 = 300 };
    int nh = EKV * group;
    kvp_model_config cfg = {.dim = nh * ED, .hidden_dim = 64, .n_layers = 1, .n_heads = nh,
                            .n_kv_heads = EKV, .head_dim = ED, .vocab_size = 10, .seq_len = 4096,
                            .rope = rope, .rms_eps = 1e-5f, .query_scale = query_scale};
    char err[160];
    kvp_policy *p;
    cr_assert_eq(kvp_policy_create(&p, "expected_attention", NULL, &cfg, 1, err, sizeof err), 0,
                 "%s", err);
    kvp_cache c;
    cr_assert_eq(kvp_cache_init(&c, 1, EKV, ED, &cfg.rope), 0);
    uint64_t in = 0x5EEDull + (uint64_t)group * 131 + (uint64_t)rope.n_rot + (uint64_t)rope.neox;
    float *qmean = malloc((size_t)nh * ED * sizeof *qmean), *qsd = malloc((size_t)nh * ED * sizeof *qsd);
    for (int i = 0; i < nh * ED; i++) {
        qmean[i] = (float)(1.5 * rng_normal(&in));
        qsd[i] = (float)(0.2 + 1.3 * rng_unit(&in));
    }
    float *keys[EKV], *vals[EKV], *qs[EKV];
    int32_t qpos[EKV][N];
    int nq[EKV] = {0};
    for (int kvh = 0; kvh < EKV; kvh++) {
        keys[kvh] = malloc((size_t)N * ED * sizeof(float));
        vals[kvh] = malloc((size_t)N * ED * sizeof(float));
        qs[kvh] = malloc((size_t)N * group * ED * sizeof(float));
        cr_assert_eq(kvp_head_reserve(kvp_cache_head(&c, 0, kvh), ED, N), 0);
    }
    float *q = malloc((size_t)N * nh * ED * sizeof *q);
    for (int fed = 0; fed < N;) {
        int n = rng_int(&in, 1, 40);
        n = n < N - fed ? n : N - fed;
        for (int t = 0; t < n; t++)
            for (int i = 0; i < nh * ED; i++)
                q[(size_t)t * nh * ED + i] = qmean[i] + qsd[i] * (float)rng_normal(&in);
        for (int t = 0; t < n; t++)
            for (int hq = 0; hq < nh; hq++)
                kvp_rope_rotate(&cfg.rope, q + ((size_t)t * nh + hq) * ED, P0 + fed + t);
        for (int kvh = 0; kvh < EKV; kvh++) {
            kvp_head *h = kvp_cache_head(&c, 0, kvh);
            for (int t = 0; t < n; t++) {
                int r = fed + t;
                float *k = keys[kvh] + (size_t)r * ED, *v = vals[kvh] + (size_t)r * ED;
                for (int j = 0; j < ED; j++) {
                    k[j] = (float)(0.5 + rng_normal(&in));
                    v[j] = (float)rng_normal(&in);
                }
                kvp_rope_rotate(&cfg.rope, k, P0 + r);
                memcpy((float *)h->k + (size_t)r * ED, k, ED * sizeof *k);
                memcpy((float *)h->v + (size_t)r * ED, v, ED * sizeof *v);
                h->pos[r] = P0 + r;
                h->seq[r] = r;
                h->score[r] = h->stat[r] = 0.0f;
                if (r >= SINKS) {
                    memcpy(qs[kvh] + (size_t)nq[kvh] * group * ED,
                           q + (size_t)t * nh * ED + (size_t)kvh * group * ED,
                           (size_t)group * ED * sizeof(float));
                    qpos[kvh][nq[kvh]++] = P0 + r;
                }
            }
            h->n = fed + n;
            p->ops->on_attention(p, 0, kvh, h, q + (size_t)kvh * group * ED, nh * ED, NULL, 0, n);
        }
        fed += n;
    }
    double scale = query_scale > 0 ? query_scale : 1.0 / sqrt((double)ED);
    double ref[N], other[N];
    for (int kvh = 0; kvh < EKV; kvh++) {
        kvp_head *h = kvp_cache_head(&c, 0, kvh);
        p->ops->before_evict(p, 0, kvh, h);
        int m = nq[kvh] < EA_W ? nq[kvh] : EA_W, first = nq[kvh] - m;
        const float *window = qs[kvh] + (size_t)first * group * ED;
        ref_expatt(&cfg.rope, scale, ED, group, keys[kvh], vals[kvh], N, P0 + N - 1, window,
                   qpos[kvh] + first, m, EA_EXACT, ref);
        double top = 0.0;
        for (int i = 0; i < N; i++)
            top = ref[i] > top ? ref[i] : top;
        for (int i = 0; i < N; i++)
            cr_assert(fabs(h->score[i] - ref[i]) <= 1e-3 * fabs(ref[i]) + 1e-6 * top,
                      "n_rot %d neox %d group %d head %d row %d: %.8g, want %.8g", rope.n_rot,
                      rope.neox, group, kvh, i, h->score[i], ref[i]);
        for (int variant = EA_NO_VARIANCE; variant <= EA_NO_ROTATION; variant++) {
            ref_expatt(&cfg.rope, scale, ED, group, keys[kvh], vals[kvh], N, P0 + N - 1, window,
                       qpos[kvh] + first, m, variant, other);
            double worst = 0.0;
            for (int i = SINKS; i < N; i++) {
                double rel = fabs(other[i] - ref[i]) / ref[i];
                worst = rel > worst ? rel : worst;
            }
            cr_assert_gt(worst, 0.05, "variant %d hardly changes the scores (%g)", variant, worst);
        }
    }
    for (int kvh = 0; kvh < EKV; kvh++) {
        free(keys[kvh]);
        free(vals[kvh]);
        free(qs[kvh]);
    }
    free(q);
    free(qmean);
    free(qsd);
    kvp_cache_free(&c);
    kvp_policy_destroy(p);
}

static const float ea_factors[8] = {1, 1, 2, 4, 8, 16, 32, 64};

Test(baselines, expected_attention_matches_reference_consecutive_pairs)
{
    ea_shape((kvp_rope){.n_rot = 16, .base = 10000.0f}, 1, 0.0f);
    ea_shape((kvp_rope){.n_rot = 16, .base = 10000.0f}, 2, 0.0f);
}

Test(baselines, expected_attention_matches_reference_neox_gqa)
{
    ea_shape((kvp_rope){.n_rot = 16, .neox = 1, .base = 1000000.0f}, 4, 0.0f);
}

Test(baselines, expected_attention_matches_reference_partial_rotary)
{
    ea_shape((kvp_rope){.n_rot = 8, .neox = 1, .base = 10000.0f}, 3, 0.0f);
    ea_shape((kvp_rope){.n_rot = 8, .base = 10000.0f}, 2, 0.0f);
}

Test(baselines, expected_attention_matches_reference_frequency_factors_and_scale)
{
    ea_shape((kvp_rope){.n_rot = 16, .base = 500000.0f, .factors = ea_factors}, 2, 0.0f);
    ea_shape((kvp_rope){.n_rot = 16, .neox = 1, .base = 10000.0f}, 2, 0.2f);
}
