/* sessions/session.c: the turn state machine run unit by unit on this thread. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"
#include "sessions/persist.h"
#include "sessions/session.h"
#include "sessions/store.h"
#include "tests/model/testutil.h"
#include "tests/sessions/hubtest.h"

typedef struct outcome {
    int done, error;
    int code;
} outcome;

static void on_token(void *ctx, kvp_session *s, const char *t, size_t n)
{
    (void)ctx, (void)s, (void)t, (void)n;
}

static void on_done(void *ctx, kvp_session *s, const kvp_turn_stats *st, const char *r,
                    size_t n)
{
    (void)s, (void)st, (void)r, (void)n;
    ((outcome *)ctx)->done++;
}

static void on_error(void *ctx, kvp_session *s, int code, const char *msg)
{
    (void)s, (void)msg;
    ((outcome *)ctx)->error++;
    ((outcome *)ctx)->code = code;
}

static kvp_policy_conf *conf(const char *name, const char *file)
{
    kvp_policy_conf *pc = calloc(1, sizeof *pc);
    pc->refs = 1;
    snprintf(pc->name, sizeof pc->name, "%s", name);
    snprintf(pc->file, sizeof pc->file, "%s", file);
    return pc;
}

static outcome run_turn(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs,
                        const char *text, int max_tokens)
{
    outcome o = {0};
    kvp_turn_sink sink = {on_token, on_done, on_error, NULL, &o};
    cr_assert_eq(kvp_session_begin_turn(s, text, strlen(text), max_tokens, 0.0f, 0, 0.0), 0);
    s->state = KVP_SESSION_TURN;
    while (kvp_turn_step(s, env, rs, &sink))
        ;
    s->state = KVP_SESSION_IDLE;
    return o;
}

/* A turn that failed in decode keeps its user message (the reply was under way); a later
 * turn that fails before it records anything (its policy cannot be made) must not take
 * that earlier message away: text and token ids of the transcript stay in step. */
Test(session, a_turn_failing_before_it_starts_undoes_nothing_of_earlier_turns, .timeout = 60)
{
    kvp_model model;
    char err[512];
    cr_assert_eq(kvp_model_load(&model, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    kvp_session_env env = {.model = &model, .chunk = 32, .reuse_cache = 1, .top_p = 0.9f,
                           .seed = 1, .state_dir = ""};
    kvp_template_init(&env.tpl, &model, NULL, NULL, 0);
    kvp_runstate rs;
    cr_assert_eq(kvp_runstate_init(&rs, &model.cfg, env.chunk), 0);
    kvp_session_table t;
    cr_assert_eq(kvp_session_table_init(&t), 0);
    kvp_policy_conf *none = conf("none", "");
    kvp_session *s;
    cr_assert_eq(kvp_session_create(&t, &env, none, NULL, 0.0, &s, err, sizeof err), 0, "%s", err);

    /* Turn 1: a message that nearly fills the context, so decode passes it (no eviction). */
    int words = 40;
    char *text = ht_text(words);
    int *ids = NULL;
    while (kvp_template_turn(&env.tpl, NULL, 0, 1, 0, text, strlen(text), &ids) < model.cfg.seq_len - 8) {
        free(ids);
        free(text);
        text = ht_text(words += 20);
    }
    free(ids);
    outcome o = run_turn(s, &env, &rs, text, 64);
    cr_assert_eq(o.error, 1, "turn 1 should fail in decode");
    cr_assert_eq(o.code, -E2BIG);
    cr_assert_eq(s->n_msgs, 1);
    int tokens_after_1 = s->n_tokens;

    /* Turn 2: its policy cannot be made (the policy changed to a file that is gone). */
    kvp_policy_destroy(s->policy);
    s->policy = NULL;
    kvp_policy_conf_unref(s->pconf);
    s->pconf = conf("kvp", "/nonexistent/policy.kvp");
    o = run_turn(s, &env, &rs, "A cat.", 8);
    cr_assert_eq(o.error, 1);
    cr_assert_eq(s->n_msgs, 1, "the earlier turn's message was dropped");
    cr_assert(s->msgs[0].user);
    cr_assert_str_eq(s->msgs[0].text, text);
    cr_assert_eq(s->n_tokens, tokens_after_1);

    free(text);
    kvp_session_table_clear(&t);
    kvp_policy_conf_unref(none);
    kvp_runstate_free(&rs);
    kvp_model_free(&model);
}

/* The id table: every session is found by id among thousands (the buckets grow),
 * removal keeps the others reachable, and creation order is kept for listing. */
Test(session, the_table_finds_every_id_after_growth_and_removal, .timeout = 60)
{
    kvp_model model;
    char err[512];
    cr_assert_eq(kvp_model_load(&model, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    kvp_session_env env = {.model = &model, .chunk = 32, .top_p = 0.9f, .state_dir = ""};
    kvp_session_table t;
    cr_assert_eq(kvp_session_table_init(&t), 0);
    kvp_policy_conf *pc = conf("streaming", "");
    enum { N = 3000 };
    static kvp_session *all[N];
    for (int i = 0; i < N; i++)
        cr_assert_eq(kvp_session_create(&t, &env, pc, NULL, 0.0, &all[i], err, sizeof err), 0);
    cr_assert_eq(t.count, N);
    cr_assert_geq(t.n_buckets, (size_t)N);
    for (int i = 0; i < N; i++)
        cr_assert_eq(kvp_session_find(&t, all[i]->id), all[i]);
    for (int i = 0; i < N; i += 2)
        kvp_session_remove(&t, all[i]);
    cr_assert_eq(t.count, N / 2);
    cr_assert_eq(t.resident, N / 2);
    int k = 1;
    for (kvp_session *s = t.head; s; s = s->next, k += 2) {
        cr_assert_eq(s, all[k], "creation order is lost");
        cr_assert_eq(kvp_session_find(&t, s->id), s);
    }
    cr_assert_eq(k, N + 1);
    cr_assert_null(kvp_session_find(&t, "0123456789abcdef0123456789abcdef"));
    kvp_session_table_clear(&t);
    kvp_policy_conf_unref(pc);
    kvp_model_free(&model);
}

/* A snapshot keeps the rows as they were stored; restored where another kv_type is
 * configured, they are converted (never read as the other type): every type to every
 * other, the transcript and position intact, and the next turn runs on the restored
 * cache without re-prefilling. */
Test(session, a_snapshot_of_one_kv_type_restores_under_every_other, .timeout = 60)
{
    kvp_model model;
    char err[512], dir[] = "/tmp/kvp-kvtype-XXXXXX";
    cr_assert(mkdtemp(dir));
    cr_assert_eq(kvp_model_load(&model, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    kvp_runstate rs;
    cr_assert_eq(kvp_runstate_init(&rs, &model.cfg, 32), 0);
    kvp_policy_conf *pc = conf("streaming", "");
    snprintf(pc->ident.model_name, sizeof pc->ident.model_name, "%s", model.name);
    snprintf(pc->ident.policy_name, sizeof pc->ident.policy_name, "streaming");
    kvp_store *store;
    kvp_store_params sp = {.state_dir = dir};
    cr_assert_eq(kvp_store_open(&store, &sp, err, sizeof err), 0, "%s", err);
    for (int from = 0; from < KVP_KV_N_TYPES; from++)
        for (int to = 0; to < KVP_KV_N_TYPES; to++) {
            kvp_session_env env = {.model = &model, .chunk = 32, .reuse_cache = 1, .top_p = 0.9f,
                                   .seed = 1, .store = store, .state_dir = dir,
                                   .kv_type = (kvp_kv_type)from};
            kvp_template_init(&env.tpl, &model, NULL, NULL, 0);
            kvp_session_table t;
            cr_assert_eq(kvp_session_table_init(&t), 0);
            kvp_session *s;
            cr_assert_eq(kvp_session_create(&t, &env, pc, NULL, 0.0, &s, err, sizeof err), 0, "%s", err);
            cr_assert_eq(s->cache.kv_type, (kvp_kv_type)from);
            outcome o = run_turn(s, &env, &rs, "Once upon a time, there was a cat.", 16);
            cr_assert_eq(o.done, 1);
            cr_assert_eq(kvp_session_save(s, &env, err, sizeof err), 0, "%s", err);
            char id[sizeof s->id];
            memcpy(id, s->id, sizeof id);
            int64_t seen = s->cache.n_seen;
            int n_tokens = s->n_tokens;
            /* the first head's values as the saved type decodes them */
            const kvp_head *h0 = &s->cache.heads[0];
            int rows = h0->n, hd = model.cfg.head_dim;
            float *want = malloc((size_t)rows * hd * sizeof *want);
            memcpy(want, kvp_head_values(h0, hd, 0, rows, want), (size_t)rows * hd * sizeof *want);
            kvp_session_table_clear(&t);

            env.kv_type = (kvp_kv_type)to;
            cr_assert_eq(kvp_session_table_init(&t), 0);
            cr_assert_eq(kvp_session_create(&t, &env, pc, id, 0.0, &s, err, sizeof err), 0, "%s", err);
            cr_assert_eq(kvp_session_restore(s, &env, 0, err, sizeof err), 0, "%s", err);
            cr_assert_eq(s->cache.kv_type, (kvp_kv_type)to, "%d -> %d", from, to);
            cr_assert_eq(s->cache.n_seen, seen, "%d -> %d: the cache was rebuilt, not converted", from, to);
            cr_assert_eq(s->n_tokens, n_tokens);
            cr_assert_eq(s->cache.heads[0].n, rows);
            float *got = malloc((size_t)rows * hd * sizeof *got);
            const float *g = kvp_head_values(&s->cache.heads[0], hd, 0, rows, got);
            /* decoding is exact into f32; into f16 / q8_0 within their rounding */
            float tol = to == KVP_KV_F32 || to == from ? 0.0f : to == KVP_KV_F16 ? 1e-3f : 1.2e-2f;
            for (int i = 0; i < rows * hd; i++)
                cr_assert_leq(fabsf(g[i] - want[i]), tol * fmaxf(1.0f, fabsf(want[i])),
                              "%d -> %d: value %d %f vs %f", from, to, i, g[i], want[i]);
            o = run_turn(s, &env, &rs, "The cat sat.", 8);
            cr_assert_eq(o.done, 1, "%d -> %d: no turn after the restore", from, to);
            cr_assert_gt(s->cache.n_seen, seen);
            free(want);
            free(got);
            kvp_session_table_clear(&t);
        }
    kvp_store_close(store);
    kvp_policy_conf_unref(pc);
    kvp_runstate_free(&rs);
    kvp_model_free(&model);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
