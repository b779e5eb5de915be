/* policy/kvp_agent_policy.c: the "kvp" policy on loaded and on shared weights. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offline/agent_train.h"
#include "policy/kvp_agent.h"
#include "policy/policy.h"
#include "tests/model/testutil.h"
#include "tests/policy/agentutil.h"

Test(kvp_agent_policy, policy_scores_inserted_rows)
{
    const char *path = write_policy(&default_arch, 5, 4, 11);
    kvp_policy p = {.cfg = {.n_layers = 5, .n_kv_heads = 4, .head_dim = 8, .n_heads = 8}};
    char err[256];
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_load(&s, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_policy_create(&p, path, err, sizeof err), 0, "%s", err);
    unlink(path);
    cr_assert_str_eq(p.ops->name, "kvp");
    cr_assert_eq(p.ops->wants_attention, 0);
    cr_assert_not_null(p.ops->before_evict);
    /* the newest half of the budget is protected, never less than the default window;
     * with a known context the agents choose at most an eighth of it (the rest of a
     * large budget is the newest rows) */
    p.n_recent = KVP_DEFAULT_RECENT;
    cr_assert_eq(p.ops->recent_window(&p, 0, 256), 128);
    cr_assert_eq(p.ops->recent_window(&p, 0, 33), KVP_DEFAULT_RECENT);
    cr_assert_eq(p.ops->recent_window(&p, 0, 40), 20);
    p.cfg.seq_len = 512;
    cr_assert_eq(p.ops->recent_window(&p, 0, 32), KVP_DEFAULT_RECENT);
    cr_assert_eq(p.ops->recent_window(&p, 0, 128), 64);
    cr_assert_eq(p.ops->recent_window(&p, 0, 200), 136);
    cr_assert_eq(p.ops->recent_window(&p, 0, 256), 192);
    cr_assert_eq(p.ops->recent_window(&p, 0, 448), 384);
    p.cfg.seq_len = 0;

    /* A head with more rows than one scoring block, inserted as 1 row, then 599. */
    enum { N = 600, D = 8 };
    float *k = malloc(N * D * sizeof(float)), *v = malloc(N * D * sizeof(float));
    float *score = calloc(N, sizeof(float)), *stat = calloc(N, sizeof(float)), want[N];
    int32_t *pos = malloc(N * sizeof(int32_t));
    int64_t *seq = malloc(N * sizeof(int64_t));
    fill(k, N * D, 2.0f);
    fill(v, N * D, 1.0f);
    for (int i = 0; i < N; i++)
        pos[i] = i, seq[i] = i;
    kvp_head h = {.n = N, .cap = N, .k = k, .v = v, .pos = pos, .seq = seq, .score = score,
                  .stat = stat};
    /* scoring is deferred to the eviction, batched over the rows not yet scored */
    p.ops->on_insert(&p, 3, 2, &h, 0, 1);
    cr_assert(isnan(score[0]), "row 0 scored at insertion");
    h.n = 1;
    p.ops->before_evict(&p, 3, 2, &h);
    float first = score[0];
    cr_assert(!isnan(first));
    h.n = N;
    p.ops->on_insert(&p, 3, 2, &h, 1, N - 1);
    p.ops->before_evict(&p, 3, 2, &h);
    cr_assert_eq(score[0], first, "a scored row is never rescored");

    float *work = malloc(kvp_agent_score_work(&s.arch, N) * sizeof(float));
    kvp_agent_score(&s.arch, kvp_agent_set_params(&s, 3, 2), k, v, pos, N, want, work);
    for (int i = 0; i < N; i++)
        cr_assert_float_eq(score[i], want[i], 1e-5f * (1.0f + fabsf(want[i])), "row %d", i);
    /* Another agent gives other scores. */
    kvp_agent_score(&s.arch, kvp_agent_set_params(&s, 0, 0), k, v, pos, N, want, work);
    cr_assert_neq(memcmp(score, want, sizeof want), 0);

    /* A context shift moves the positions of rows 4.. (keys re-rotated with them): their
     * scores went stale and are recomputed on the new positions; the sinks' stay. */
    float before[N];
    memcpy(before, score, sizeof before);
    for (int i = 4; i < N; i++)
        pos[i] = 4 + (i - 4) / 2;
    p.ops->before_evict(&p, 3, 2, &h);
    kvp_agent_score(&s.arch, kvp_agent_set_params(&s, 3, 2), k, v, pos, N, want, work);
    for (int i = 0; i < N; i++)
        cr_assert_float_eq(score[i], want[i], 1e-5f * (1.0f + fabsf(want[i])), "row %d", i);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(score[i], before[i], "sink %d rescored", i);
    int moved = 0;
    for (int i = 4; i < N; i++)
        moved += score[i] != before[i];
    cr_assert_gt(moved, N / 2, "only %d rows got new scores after the shift", moved);

    /* Rows that would leave the model's window (seq_len - 1 tokens) within the next
     * eviction chunk (32 tokens) rank last; the rest keep their scores. */
    p.cfg.seq_len = 400;
    memcpy(before, score, sizeof before);
    p.ops->before_evict(&p, 3, 2, &h);
    for (int i = 0; i < N; i++) {
        if (N - 1 - i >= 400 - 1 - 32)
            cr_assert(isinf(score[i]) && score[i] < 0, "row %d (age %d): %g", i, N - 1 - i,
                      score[i]);
        else
            cr_assert_eq(score[i], before[i], "row %d (age %d)", i, N - 1 - i);
    }

    p.ops->destroy(&p);
    cr_assert_null(p.impl);
    kvp_agent_set_free(&s);
    free(work);
    free(k);
    free(v);
    free(score);
    free(stat);
    free(pos);
    free(seq);
}

/* Through the shared rank-and-keep, as the daemon and kvp eval evict: a 384-row head of
 * a 512-token model compressed to 256 keeps the 4 sinks, the newest 192 rows whatever
 * their scores, and the agents' 60 best of the rows in between. */
Test(kvp_agent_policy, a_large_budget_keeps_the_newest_rows_and_the_agents_best_older_ones)
{
    enum { N = 384, B = 256, D = 8, WINDOW = 192, SINKS = 4 };
    const char *path = write_policy(&default_arch, 1, 1, 5);
    kvp_policy *p;
    kvp_model_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = D, .n_heads = 1,
                            .seq_len = 512};
    char err[256];
    cr_assert_eq(kvp_policy_create(&p, "kvp", path, &cfg, 1, err, sizeof err), 0, "%s", err);
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_load(&s, path, NULL, err, sizeof err), 0, "%s", err);
    unlink(path);
    kvp_cache c;
    kvp_rope rope = {.n_rot = D, .base = 10000.0f};
    cr_assert_eq(kvp_cache_init(&c, 1, 1, D, &rope), 0);
    kvp_head *h = kvp_cache_head(&c, 0, 0);
    cr_assert_eq(kvp_head_reserve(h, D, N), 0);
    fill(h->k, N * D, 2.0f);
    fill(h->v, N * D, 1.0f);
    for (int i = 0; i < N; i++)
        h->pos[i] = i, h->seq[i] = i;
    h->n = N;
    p->ops->on_insert(p, 0, 0, h, 0, N);
    /* the agents' scores of the rows between the sinks and the window */
    float want[N], *work = malloc(kvp_agent_score_work(&s.arch, N) * sizeof(float));
    kvp_agent_score(&s.arch, kvp_agent_set_params(&s, 0, 0), h->k, h->v, h->pos, N, want, work);
    float mid[N - SINKS - WINDOW];
    memcpy(mid, want + SINKS, sizeof mid);
    int n_mid = N - SINKS - WINDOW, slots = B - SINKS - WINDOW;
    /* the slots-th best score of the middle: the agents keep the rows at or above it */
    for (int i = 0; i < slots; i++)
        for (int j = i + 1; j < n_mid; j++)
            if (mid[j] > mid[i]) {
                float t = mid[i];
                mid[i] = mid[j], mid[j] = t;
            }
    float cut = mid[slots - 1];

    cr_assert_eq(kvp_policy_evict_head(p, &c, 0, 0, B), N - B);
    cr_assert_eq(h->n, B);
    char kept[N] = {0};
    for (int i = 0; i < h->n; i++)
        kept[h->seq[i]] = 1;
    for (int r = 0; r < N; r++) {
        if (r < SINKS || r >= N - WINDOW)
            cr_assert(kept[r], "protected row %d dropped", r);
        else if (want[r] > cut)
            cr_assert(kept[r], "row %d (score %g above the %d-th best %g) dropped", r,
                      want[r], slots, cut);
        else if (want[r] < cut)
            cr_assert(!kept[r], "row %d (score %g below the %d-th best %g) kept", r, want[r],
                      slots, cut);
    }
    free(work);
    kvp_cache_free(&c);
    kvp_agent_set_free(&s);
    kvp_policy_destroy(p);
}

Test(kvp_agent_policy, policy_create_reports_mismatch_and_missing_file)
{
    const char *path = write_policy(&tiny_arch, 5, 4, 1);
    kvp_policy p = {.cfg = {.n_layers = 8, .n_kv_heads = 4, .head_dim = 8}};
    char err[512] = "";
    cr_assert_eq(kvp_agent_policy_create(&p, path, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "model has 8 layers x 4 KV heads x head_dim 8"), "%s", err);
    cr_assert_null(p.ops);
    cr_assert_null(p.impl);
    unlink(path);
    cr_assert_lt(kvp_agent_policy_create(&p, NULL, err, sizeof err), 0);
    cr_assert(strstr(err, "policy file"), "%s", err);
    cr_assert_eq(kvp_agent_policy_create(&p, "/nonexistent.kvp", err, sizeof err), -ENOENT);
}

/* One head of n rows from a fixed stream, for scoring. */
enum { SH_N = 700, SH_D = 8 };
typedef struct shared_head {
    float k[SH_N * SH_D], v[SH_N * SH_D], score[SH_N], stat[SH_N];
    int32_t pos[SH_N];
    int64_t seq[SH_N];
    kvp_head h;
} shared_head;

static void shared_head_init(shared_head *x)
{
    rng_state = 777;
    fill(x->k, SH_N * SH_D, 2.0f);
    fill(x->v, SH_N * SH_D, 1.0f);
    for (int i = 0; i < SH_N; i++)
        x->pos[i] = i, x->seq[i] = i;
    x->h = (kvp_head){.n = SH_N, .cap = SH_N, .k = x->k, .v = x->v, .pos = x->pos,
                      .seq = x->seq, .score = x->score, .stat = x->stat};
}

static void score_all(kvp_policy *p, shared_head *x, int layer, int kvh)
{
    p->ops->on_insert(p, layer, kvh, &x->h, 0, SH_N);
    p->ops->before_evict(p, layer, kvh, &x->h);
}

typedef struct scorer {
    kvp_policy *p;
    shared_head x;
} scorer;

static void *score_thread(void *arg)
{
    scorer *sc = arg;
    shared_head_init(&sc->x);
    for (int r = 0; r < 20; r++)
        score_all(sc->p, &sc->x, 3, 1);
    return NULL;
}

/* Weights loaded once (kvp_policy_weights_load: the file is read once, whatever the
 * number of instances) give every instance made on them the scores of an instance that
 * loaded the file itself, also with instances scoring on several threads at once (each
 * thread has its own scratch); a model of another shape is refused naming both. */
Test(kvp_agent_policy, instances_on_shared_weights_score_as_one_that_loaded_the_file)
{
    const char *path = write_policy(&default_arch, 5, 4, 23);
    kvp_model_config cfg = {.n_layers = 5, .n_kv_heads = 4, .head_dim = 8, .n_heads = 8};
    char err[512];
    kvp_policy *own, *shared[4];
    cr_assert_eq(kvp_policy_create(&own, "kvp", path, &cfg, 1, err, sizeof err), 0, "%s", err);
    unsigned long long loads = kvp_agent_set_loads();
    kvp_policy_weights *w;
    cr_assert_eq(kvp_policy_weights_load(&w, "kvp", path, &cfg, err, sizeof err), 0, "%s", err);
    unlink(path);   /* the instances below never read it */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(kvp_policy_create_shared(&shared[i], w, &cfg, (uint64_t)i, err, sizeof err),
                     0, "%s", err);
    cr_assert_eq(kvp_agent_set_loads(), loads + 1, "one read for four instances");
    cr_assert_str_eq(shared[0]->ops->name, "kvp");

    static shared_head want;
    shared_head_init(&want);
    score_all(own, &want, 3, 1);
    static scorer sc[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        sc[i].p = shared[i];
        cr_assert_eq(pthread_create(&th[i], NULL, score_thread, &sc[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        for (int j = 0; j < SH_N; j++)
            cr_assert_eq(memcmp(&sc[i].x.score[j], &want.score[j], sizeof(float)), 0,
                         "instance %d row %d: %g, want %g", i, j, sc[i].x.score[j], want.score[j]);
    }
    for (int j = 0; j < SH_N; j++)
        cr_assert(isfinite(want.score[j]), "row %d scored", j);

    kvp_model_config other = cfg;
    other.n_layers = 6;
    kvp_policy *bad = NULL;
    cr_assert_eq(kvp_policy_create_shared(&bad, w, &other, 0, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "model has 6 layers"), "%s", err);
    cr_assert_null(bad);
    for (int i = 0; i < 4; i++)
        kvp_policy_destroy(shared[i]);
    kvp_policy_destroy(own);
    kvp_policy_weights_free(w);

    /* a policy without a file keeps only its name; a bad name fails at the load */
    cr_assert_eq(kvp_policy_weights_load(&w, "streaming", NULL, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_policy_create_shared(&bad, w, &cfg, 0, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(bad->ops->name, "streaming");
    kvp_policy_destroy(bad);
    kvp_policy_weights_free(w);
    cr_assert_eq(kvp_policy_weights_load(&w, "no-such", NULL, &cfg, err, sizeof err), -EINVAL);
    cr_assert_null(w);
    cr_assert(strstr(err, "unknown policy"), "%s", err);
}

/* Centred keys: the agents score each row's key minus the mean key of the head's rows, so
 * adding one vector to every key of the head (which leaves softmax attention unchanged)
 * leaves the scores as they are, and the mean moving with the rows the head holds changes
 * every row's score. An agent on raw keys sees the shift. */
Test(kvp_agent_policy, centred_keys_score_the_offset_from_the_heads_mean_key)
{
    enum { N = 300, D = 8 };
    kvp_agent_arch ca = default_arch;
    ca.centered = 1;
    const char *paths[2] = {write_policy(&ca, 2, 2, 5), write_policy(&default_arch, 2, 2, 5)};
    float *k = malloc(N * D * sizeof(float)), *v = malloc(N * D * sizeof(float));
    float *k0 = malloc(N * D * sizeof(float));
    float *score = calloc(N, sizeof(float)), *stat = calloc(N, sizeof(float));
    float first[N], want[N], mean[D];
    int32_t *pos = malloc(N * sizeof(int32_t));
    int64_t *seq = malloc(N * sizeof(int64_t));
    fill(k0, N * D, 2.0f);
    fill(v, N * D, 1.0f);
    for (int i = 0; i < N; i++)
        pos[i] = i, seq[i] = i;
    for (int c = 0; c < 2; c++) {
        kvp_policy p = {.cfg = {.n_layers = 2, .n_kv_heads = 2, .head_dim = D, .n_heads = 4}};
        char err[256];
        cr_assert_eq(kvp_agent_policy_create(&p, paths[c], err, sizeof err), 0, "%s", err);
        memcpy(k, k0, N * D * sizeof(float));
        kvp_head h = {.n = N, .cap = N, .k = k, .v = v, .pos = pos, .seq = seq, .score = score,
                      .stat = stat};
        p.ops->on_insert(&p, 1, 0, &h, 0, N);
        p.ops->before_evict(&p, 1, 0, &h);
        memcpy(first, score, sizeof first);
        if (c == 0) {   /* the scores are the agent's on the centred keys */
            kvp_agent_set s;
            cr_assert_eq(kvp_agent_set_load(&s, paths[c], NULL, err, sizeof err), 0, "%s", err);
            float *kc = malloc(N * D * sizeof(float));
            float *work = malloc(kvp_agent_score_work(&s.arch, N) * sizeof(float));
            memcpy(kc, k0, N * D * sizeof(float));
            kvp_agent_key_mean(D, kc, N, mean);
            kvp_agent_center_keys(D, kc, N, mean);
            kvp_agent_score(&s.arch, kvp_agent_set_params(&s, 1, 0), kc, v, pos, N, want, work);
            for (int i = 0; i < N; i++)
                cr_assert_float_eq(score[i], want[i], 1e-4f * (1.0f + fabsf(want[i])), "row %d", i);
            free(kc);
            free(work);
            kvp_agent_set_free(&s);
        }
        for (int i = 0; i < N; i++)   /* one vector added to every key */
            for (int j = 0; j < D; j++)
                k[i * D + j] += 3.0f - 0.5f * (float)j;
        p.ops->before_evict(&p, 1, 0, &h);
        float diff = 0.0f;
        for (int i = 0; i < N; i++)
            diff = fmaxf(diff, fabsf(score[i] - first[i]) / (1.0f + fabsf(first[i])));
        if (c == 0) {
            cr_assert_leq(diff, 1e-4f, "centred scores moved by %g with the shift", diff);
            /* the rows the head holds set the mean: dropping half of them moves it */
            h.n = N / 2;
            p.ops->before_evict(&p, 1, 0, &h);
            diff = 0.0f;
            for (int i = 0; i < N / 2; i++)
                diff = fmaxf(diff, fabsf(score[i] - first[i]));
            cr_assert_gt(diff, 1e-3f, "the mean of the rows held did not count");
        } else {
            /* raw keys: the rows were scored already, so the shift is seen once they are
             * scored again */
            for (int i = 0; i < N; i++)
                score[i] = NAN;
            p.ops->before_evict(&p, 1, 0, &h);
            diff = 0.0f;
            for (int i = 0; i < N; i++)
                diff = fmaxf(diff, fabsf(score[i] - first[i]));
            cr_assert_gt(diff, 1e-3f, "raw-key scores ignored the shift");
        }
        p.ops->destroy(&p);
    }
    unlink(paths[0]);
    unlink(paths[1]);
    free(k), free(k0), free(v), free(score), free(stat), free(pos), free(seq);
}

/* Relative keys: the agents score each key centred, then turned back by the position the
 * next token takes (the newest row's + 1), with the set's rotation: what a query at that
 * position sees. The turn is R(-n): a key rotated by p becomes the key rotated by p - n. */
Test(kvp_agent_policy, relative_keys_are_seen_from_the_next_position)
{
    enum { N = 200, D = 8 };
    char err[256];
    kvp_rope rope = {.n_rot = D, .neox = 0, .base = 10000.0f};
    float x[D], y[D];
    fill(x, D, 1.0f);
    memcpy(y, x, sizeof x);
    kvp_rope_rotate(&rope, x, 37.0);
    kvp_agent_relative_keys(&rope, D, x, 1, 50);
    kvp_rope_rotate(&rope, y, 37.0 - 50.0);
    for (int j = 0; j < D; j++)
        cr_assert_float_eq(x[j], y[j], 1e-5f, "dim %d", j);

    kvp_agent_arch ra = default_arch;
    ra.centered = 1;
    ra.relative = 1;
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_alloc(&s, 2, 2, &ra, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_agent_set_rope(&s, &rope, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&s, 11);
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);

    float *k = malloc(N * D * sizeof(float)), *v = malloc(N * D * sizeof(float));
    float *kc = malloc(N * D * sizeof(float)), *score = calloc(N, sizeof(float));
    float *stat = calloc(N, sizeof(float)), *want = malloc(N * sizeof(float)), mean[D];
    float *work = malloc(kvp_agent_score_work(&ra, N) * sizeof(float));
    int32_t *pos = malloc(N * sizeof(int32_t));
    int64_t *seq = malloc(N * sizeof(int64_t));
    fill(k, N * D, 2.0f);
    fill(v, N * D, 1.0f);
    for (int i = 0; i < N; i++)   /* a cache with gaps, as after evictions */
        pos[i] = 3 * i, seq[i] = 3 * i;
    kvp_policy p = {.cfg = {.n_layers = 2, .n_kv_heads = 2, .head_dim = D, .n_heads = 4}};
    cr_assert_eq(kvp_agent_policy_create(&p, path, err, sizeof err), 0, "%s", err);
    kvp_head h = {.n = N, .cap = N, .k = k, .v = v, .pos = pos, .seq = seq, .score = score,
                  .stat = stat};
    p.ops->on_insert(&p, 1, 1, &h, 0, N);
    p.ops->before_evict(&p, 1, 1, &h);
    memcpy(kc, k, N * D * sizeof(float));
    kvp_agent_key_mean(D, kc, N, mean);
    kvp_agent_center_keys(D, kc, N, mean);
    for (int i = 0; i < N; i++)
        kvp_rope_rotate(&rope, kc + i * D, -(double)(pos[N - 1] + 1));
    kvp_agent_score(&ra, kvp_agent_set_params(&s, 1, 1), kc, v, pos, N, want, work);
    for (int i = 0; i < N; i++)
        cr_assert_float_eq(score[i], want[i], 1e-4f * (1.0f + fabsf(want[i])), "row %d", i);

    /* the same keys seen centred only: other scores, so the turn is applied */
    ra.relative = 0;
    memcpy(kc, k, N * D * sizeof(float));
    kvp_agent_center_keys(D, kc, N, mean);
    kvp_agent_score(&ra, kvp_agent_set_params(&s, 1, 1), kc, v, pos, N, want, work);
    float diff = 0.0f;
    for (int i = 0; i < N; i++)
        diff = fmaxf(diff, fabsf(score[i] - want[i]));
    cr_assert_gt(diff, 1e-3f, "relative scores equal the centred ones");
    p.ops->destroy(&p);
    kvp_agent_set_free(&s);
    unlink(path);
    free(k), free(v), free(kc), free(score), free(stat), free(want), free(work), free(pos),
        free(seq);
}
