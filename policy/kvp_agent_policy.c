/* The "kvp" policy: the agents' scores behind the policy interface (policy/policy.h). */
#include "policy/kvp_agent.h"
#include "policy/policy.h"

#include "base/errors.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- policy glue */

/* Rows scored per sgemm batch; bounds the scratch buffer for any insert size. Small
 * enough that OpenBLAS runs each of the agent's products on the calling thread (it
 * threads an sgemm from m x n x k = 2^18 on; the default agents' largest product is
 * 64 x 32 x 68): the policy scores inside a step, beside the model's own threads, and a
 * threaded product of a few hundred rows there waits on busy cores. */
#define SCORE_BLOCK 64

typedef struct kvp_agent_policy {
    kvp_agent_set own;          /* the weights it loaded itself (kvp_agent_policy_create) */
    const kvp_agent_set *set;   /* &own, or a set shared read-only with other instances */
} kvp_agent_policy;

/* Scoring scratch: d doubles, kvp_agent_score_work(SCORE_BLOCK) floats, then
 * [2][SCORE_BLOCK][d] for a block's keys and values decoded (f16 / q8_0 rows), then d floats. One buffer per thread, not per
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

/* Centred and relative keys (kvp_agent_net.h): the mean key of every row the head holds,
 * then every row scored again on its key minus that mean, turned back by the position the
 * next token takes for relative keys, since the mean and that position move with each
 * chunk and each eviction. kt, vt hold SCORE_BLOCK rows, mean d floats, acc d doubles. */
static void score_all(const kvp_agent_set *set, const float *w, kvp_head *h, float *work,
                      float *kt, float *vt, float *mean, double *acc)
{
    const kvp_agent_arch *a = &set->arch;
    int d = a->d;
    for (int j = 0; j < d; j++)
        acc[j] = 0.0;
    for (int i = 0; a->centered && i < h->n; i += SCORE_BLOCK) {
        int m = h->n - i < SCORE_BLOCK ? h->n - i : SCORE_BLOCK;
        const float *k = kvp_head_keys(h, d, i, m, kt);
        for (int r = 0; r < m; r++)
            for (int j = 0; j < d; j++)
                acc[j] += k[(size_t)r * d + j];
    }
    for (int j = 0; j < d; j++)
        mean[j] = h->n ? (float)(acc[j] / h->n) : 0.0f;
    int64_t next = h->n ? (int64_t)h->pos[h->n - 1] + 1 : 0;
    for (int i = 0; i < h->n; i += SCORE_BLOCK) {
        int m = h->n - i < SCORE_BLOCK ? h->n - i : SCORE_BLOCK;
        const float *k = kvp_head_keys(h, d, i, m, kt);
        if (k != kt)
            memcpy(kt, k, (size_t)m * d * sizeof *kt);
        kvp_agent_center_keys(d, kt, m, mean);
        if (a->relative)
            kvp_agent_relative_keys(&set->rope, d, kt, m, next);
        kvp_agent_score(a, w, kt, kvp_head_values(h, d, i, m, vt), h->pos + i, m, h->score + i,
                        work);
        for (int j = i; j < i + m; j++)
            h->stat[j] = (float)h->pos[j];
    }
}

static void kvp_before_evict(kvp_policy *p, int layer, int kvh, kvp_head *h)
{
    kvp_agent_policy *ap = p->impl;
    const kvp_agent_arch *a = &ap->set->arch;
    const float *w = kvp_agent_set_params(ap->set, layer, kvh);
    size_t nwork = kvp_agent_score_work(a, SCORE_BLOCK);
    /* the scratch: d doubles (centred keys' sums; first, so aligned), then the scoring
     * work, a block of keys, a block of values, the mean key. Without it (out of memory)
     * the stale rows stay unscored: NaN ranks last */
    float *base = thread_scratch(2 * (size_t)a->d + nwork + 2 * (size_t)SCORE_BLOCK * a->d + a->d);
    float *work = base ? base + 2 * (size_t)a->d : NULL;
    int all = a->centered || a->relative;
    if (work && all) {
        float *kt = work + nwork, *vt = kt + (size_t)SCORE_BLOCK * a->d;
        score_all(ap->set, w, h, work, kt, vt, vt + (size_t)SCORE_BLOCK * a->d, (double *)(void *)base);
    }
    for (int i = 0; work && !all && i < h->n;) {
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

/* The recent window: the newest max(budget / 2, budget - cap) rows are always kept, the
 * agents choose among the older ones. Half the budget (as H2O keeps): the next-token
 * distribution depends on the recent rows more than their share of future attention
 * says. Past that, the old rows worth keeping are few and do not grow with the budget
 * (heavy hitters), so the agents' share is capped, by default at an eighth of the
 * context, and the rest of a large budget goes to recency. docs/evaluation.md ("Recent
 * window") has the measurements; `kvp fit-window` fits the cap per layer
 * (offline/windowfit.h). */
int kvp_agent_recent_window(int budget, int cap, int n_recent)
{
    int w = budget / 2;
    if (cap > 0 && budget - cap > w)
        w = budget - cap;
    return w > n_recent ? w : n_recent;
}

static int kvp_recent_window(const kvp_policy *p, int layer, int budget)
{
    const kvp_agent_policy *ap = p->impl;
    return kvp_agent_recent_window(budget, kvp_agent_set_cap(ap->set, layer, budget, p->cfg.seq_len),
                                   p->n_recent);
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
    if ((rc = kvp_agent_set_check_model(set, &p->cfg, "shared policy weights", err, errlen)) < 0)
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
