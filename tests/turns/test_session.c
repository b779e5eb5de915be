/* turns/session.c, turn.c, turn_reply.c, step_plan.c: the session object and the turn
 * state machine run unit by unit on this thread. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"
#include "policy/policy.h"
#include "turns/persist.h"
#include "turns/session.h"
#include "turns/step_plan.h"
#include "store/store.h"
#include "tests/model/testutil.h"
#include "tests/sessions/hubtest.h"

typedef struct outcome {
    int done, error;
    int code;
    char reply[1024];   /* the done reply, NUL-terminated (cut to fit) */
} outcome;

static void on_token(void *ctx, kvp_session *s, const char *t, size_t n)
{
    (void)ctx, (void)s, (void)t, (void)n;
}

static void on_done(void *ctx, kvp_session *s, const kvp_turn_stats *st, const char *r,
                    size_t n)
{
    (void)s, (void)st;
    outcome *o = ctx;
    o->done++;
    snprintf(o->reply, sizeof o->reply, "%.*s", (int)n, r);
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

/* What the snapshot tests share: stories260K, a runstate of `chunk` rows, a policy conf
 * named for snapshots, and a directory store in a fresh temporary folder. */
typedef struct snap_rig {
    kvp_model model;
    kvp_runstate rs;
    kvp_policy_conf *pc;
    kvp_store *store;
    char dir[64];
} snap_rig;

static void rig_open(snap_rig *r, const char *tag, int chunk, const char *policy,
                     const char *pfile)
{
    char err[512];
    snprintf(r->dir, sizeof r->dir, "/tmp/kvp-%s-XXXXXX", tag);
    cr_assert(mkdtemp(r->dir));
    cr_assert_eq(kvp_model_load(&r->model, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_runstate_init(&r->rs, &r->model.cfg, chunk), 0);
    r->pc = conf(policy, pfile);
    snprintf(r->pc->ident.model_name, sizeof r->pc->ident.model_name, "%s", r->model.name);
    snprintf(r->pc->ident.policy_name, sizeof r->pc->ident.policy_name, "%s", policy);
    kvp_store_params sp = {.state_dir = r->dir};
    cr_assert_eq(kvp_store_open(&r->store, &sp, err, sizeof err), 0, "%s", err);
}

static void rig_close(snap_rig *r)
{
    kvp_store_close(r->store);
    kvp_policy_conf_unref(r->pc);
    kvp_runstate_free(&r->rs);
    kvp_model_free(&r->model);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", r->dir);
    cr_assert_eq(system(cmd), 0);
}

/* Runs the turn already armed on s to its end, as a worker does. */
static outcome run_armed(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs)
{
    outcome o = {0};
    kvp_turn_sink sink = {on_token, on_done, on_error, NULL, &o};
    s->state = KVP_SESSION_TURN;
    while (kvp_turn_step(s, env, rs, &sink))
        ;
    s->state = KVP_SESSION_IDLE;
    return o;
}

/* A greedy turn; budget: KV rows per head (0: unbounded). */
static outcome run_turn_budget(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs,
                               const char *text, int max_tokens, int budget)
{
    cr_assert_eq(kvp_session_begin_turn(s, text, strlen(text), max_tokens, 0.0f, budget, 0.0), 0);
    return run_armed(s, env, rs);
}

static outcome run_turn(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs,
                        const char *text, int max_tokens)
{
    return run_turn_budget(s, env, rs, text, max_tokens, 0);
}

/* As run_turn, but once the reply is under way the cache's next position is set to the
 * context's end, so the next decode fails there (-E2BIG, as a block past the context does;
 * a reply by itself ends at the context with "length" instead). */
static outcome run_turn_failing_in_decode(kvp_session *s, const kvp_session_env *env,
                                          kvp_runstate *rs, const char *text, int max_tokens)
{
    outcome o = {0};
    kvp_turn_sink sink = {on_token, on_done, on_error, NULL, &o};
    cr_assert_eq(kvp_session_begin_turn(s, text, strlen(text), max_tokens, 0.0f, 0, 0.0), 0);
    s->state = KVP_SESSION_TURN;
    int filled = 0;
    while (kvp_turn_step(s, env, rs, &sink)) {
        if (!filled && s->turn.state == KVP_TURN_DECODE) {
            s->cache.next_pos = env->model->cfg.seq_len;
            filled = 1;
        }
    }
    s->state = KVP_SESSION_IDLE;
    cr_assert(filled, "the reply never got under way");
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

    /* Turn 1: a message that nearly fills the context, whose decode fails (no eviction). */
    int words = 40;
    char *text = ht_text(words);
    int *ids = NULL;
    while (kvp_template_turn(&env.tpl, NULL, 0, 1, 0, text, strlen(text), &ids) < model.cfg.seq_len - 8) {
        free(ids);
        free(text);
        text = ht_text(words += 20);
    }
    free(ids);
    outcome o = run_turn_failing_in_decode(s, &env, &rs, text, 64);
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
    char err[512];
    snap_rig r;
    rig_open(&r, "kvtype", 32, "streaming", "");
    for (int from = 0; from < KVP_KV_N_TYPES; from++)
        for (int to = 0; to < KVP_KV_N_TYPES; to++) {
            kvp_session_env env = {.model = &r.model, .chunk = 32, .reuse_cache = 1, .top_p = 0.9f,
                                   .seed = 1, .store = r.store, .state_dir = r.dir,
                                   .kv_type = (kvp_kv_type)from};
            kvp_template_init(&env.tpl, &r.model, NULL, NULL, 0);
            kvp_session_table t;
            cr_assert_eq(kvp_session_table_init(&t), 0);
            kvp_session *s;
            cr_assert_eq(kvp_session_create(&t, &env, r.pc, NULL, 0.0, &s, err, sizeof err), 0, "%s", err);
            cr_assert_eq(s->cache.kv_type, (kvp_kv_type)from);
            outcome o = run_turn(s, &env, &r.rs, "Once upon a time, there was a cat.", 16);
            cr_assert_eq(o.done, 1);
            cr_assert_eq(kvp_session_save(s, &env, err, sizeof err), 0, "%s", err);
            char id[sizeof s->id];
            memcpy(id, s->id, sizeof id);
            int64_t seen = s->cache.n_seen;
            int n_tokens = s->n_tokens;
            /* the first head's values as the saved type decodes them */
            const kvp_head *h0 = &s->cache.heads[0];
            int rows = h0->n, hd = r.model.cfg.head_dim;
            float *want = malloc((size_t)rows * hd * sizeof *want);
            memcpy(want, kvp_head_values(h0, hd, 0, rows, want), (size_t)rows * hd * sizeof *want);
            kvp_session_table_clear(&t);

            env.kv_type = (kvp_kv_type)to;
            cr_assert_eq(kvp_session_table_init(&t), 0);
            cr_assert_eq(kvp_session_create(&t, &env, r.pc, id, 0.0, &s, err, sizeof err), 0, "%s", err);
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
            o = run_turn(s, &env, &r.rs, "The cat sat.", 8);
            cr_assert_eq(o.done, 1, "%d -> %d: no turn after the restore", from, to);
            cr_assert_gt(s->cache.n_seen, seen);
            free(want);
            free(got);
            kvp_session_table_clear(&t);
        }
    rig_close(&r);
}

static void on_job(void *ctx, kvp_session *s, int code, const char *msg)
{
    (void)s, (void)msg;
    ((outcome *)ctx)->done++;
    ((outcome *)ctx)->code = code;
}

/* A load job (an open of a session on disk) run on this thread, as a worker runs it. */
static outcome run_load(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs)
{
    outcome o = {0};
    kvp_turn_sink sink = {on_token, on_done, on_error, on_job, &o};
    s->state = KVP_SESSION_LOAD;
    while (kvp_turn_step(s, env, rs, &sink))
        ;
    s->state = KVP_SESSION_IDLE;
    return o;
}

/* A job's outcome (s->res) is the worker's alone: arming a turn on the loop leaves the
 * last job's as it was, and the next job's start resets it, so nothing of an earlier job
 * (a failed write, a lost snapshot, another node's lease, a restore that did not happen)
 * reads as this one's. need_restore is the loop's: a job that reads the snapshot back, or
 * finds none, says so in s->res and leaves the flag for the loop to clear. */
Test(session, a_jobs_outcome_is_its_own_and_need_restore_is_left_to_the_loop, .timeout = 60)
{
    char err[512];
    snap_rig r;
    rig_open(&r, "outcome", 32, "streaming", "");
    kvp_session_env env = {.model = &r.model, .chunk = 32, .reuse_cache = 1, .top_p = 0.9f,
                           .seed = 1, .store = r.store, .state_dir = r.dir};
    kvp_template_init(&env.tpl, &r.model, NULL, NULL, 0);
    kvp_session_table t;
    cr_assert_eq(kvp_session_table_init(&t), 0);
    kvp_session *s;
    cr_assert_eq(kvp_session_create(&t, &env, r.pc, NULL, 0.0, &s, err, sizeof err), 0, "%s", err);
    outcome o = run_turn(s, &env, &r.rs, "Once upon a time, there was a cat.", 16);
    cr_assert_eq(o.done, 1);
    cr_assert_eq(s->res.save_rc, 1, "the turn's snapshot write is not in its outcome");
    cr_assert_gt(s->res.save_bytes, 0);
    cr_assert(s->saved && s->has_snapshot);

    /* what a failed job would have left */
    s->res.save_rc = -EIO;
    snprintf(s->res.save_err, sizeof s->res.save_err, "stale");
    s->res.save_ms = -1;
    s->res.lost = s->res.unrestored = 1;
    s->res.elsewhere_ms = 9;
    const char *text = "The cat sat.";
    cr_assert_eq(kvp_session_begin_turn(s, text, strlen(text), 8, 0.0f, 0, 0.0), 0);
    cr_assert(s->res.save_rc == -EIO && s->res.lost && s->res.unrestored &&
              s->res.elsewhere_ms == 9, "arming a turn on the loop wrote the job's outcome");
    o = run_armed(s, &env, &r.rs);
    cr_assert_eq(o.done, 1);
    cr_assert_eq(s->res.save_rc, 1);
    cr_assert_str_neq(s->res.save_err, "stale", "the last job's error outlived it");
    cr_assert_geq(s->res.save_ms, 0);
    cr_assert_eq(s->res.lost, 0, "the last job's lost snapshot outlived it");
    cr_assert_eq(s->res.unrestored, 0, "the last job's failed restore outlived it");
    cr_assert_eq(s->res.elsewhere_ms, 0, "the last job's other node outlived it");

    /* parked and unparked: the next turn reads the snapshot back first */
    cr_assert(kvp_session_parkable(s));
    kvp_session_park(&t, s);
    cr_assert_eq(kvp_session_unpark(&t, s, &env), 0);
    cr_assert_eq(s->need_restore, 1);
    o = run_turn(s, &env, &r.rs, "It was happy.", 8);
    cr_assert_eq(o.done, 1);
    cr_assert(s->res.restored.pending, "the restore is not in the turn's outcome");
    cr_assert_eq(s->res.unrestored, 0);
    cr_assert_eq(s->need_restore, 1, "the worker wrote need_restore, the loop's");
    s->need_restore = 0;   /* the loop's, at the job's end */

    /* an id the r.store has no snapshot of: the load finds none, and says so */
    kvp_session *u;
    cr_assert_eq(kvp_session_create(&t, &env, r.pc, NULL, 0.0, &u, err, sizeof err), 0, "%s", err);
    u->need_restore = 1;
    o = run_load(u, &env, &r.rs);
    cr_assert_eq(o.done, 1);
    cr_assert_eq(o.code, -ENOENT);
    cr_assert(u->res.lost && u->res.unrestored && !u->res.restored.pending,
              "the load's outcome does not say the session is gone");
    cr_assert_eq(u->need_restore, 1, "the worker wrote need_restore, the loop's");

    kvp_session_table_clear(&t);
    rig_close(&r);
}

/* Every head of a and b holds the same rows: positions, token indices, scores, policy
 * accumulators and the stored key and value bytes. */
static void same_rows(const kvp_cache *a, const kvp_cache *b, const char *what)
{
    cr_assert_eq(a->kv_type, b->kv_type, "%s", what);
    cr_assert_eq(a->n_seen, b->n_seen, "%s", what);
    cr_assert_eq(a->next_pos, b->next_pos, "%s", what);
    size_t row = kvp_kv_row_bytes(a->kv_type, a->head_dim);
    for (int i = 0; i < a->n_layers * a->n_kv_heads; i++) {
        const kvp_head *x = &a->heads[i], *y = &b->heads[i];
        cr_assert_eq(x->n, y->n, "%s: head %d holds %d rows, restored %d", what, i, x->n, y->n);
        size_t n = (size_t)x->n;
        cr_assert_eq(memcmp(x->pos, y->pos, n * sizeof *x->pos), 0, "%s: head %d positions", what, i);
        cr_assert_eq(memcmp(x->seq, y->seq, n * sizeof *x->seq), 0, "%s: head %d tokens", what, i);
        cr_assert_eq(memcmp(x->score, y->score, n * sizeof *x->score), 0, "%s: head %d scores", what, i);
        cr_assert_eq(memcmp(x->stat, y->stat, n * sizeof *x->stat), 0, "%s: head %d stats", what, i);
        cr_assert_eq(memcmp(x->k, y->k, n * row), 0, "%s: head %d keys", what, i);
        cr_assert_eq(memcmp(x->v, y->v, n * row), 0, "%s: head %d values", what, i);
    }
}

/* Global budgets (budget_mode = global, KVP with its calibration) leave the heads with
 * different row counts. For every kv_type: the session keeps at most budget x heads rows
 * plus a chunk per head, no head above its cap + chunk; a snapshot restores each head's
 * rows exactly; the next greedy turn gives the same reply and leaves the same cache as in
 * the session that was never saved. Restored where budgets are per head, the next turn
 * brings every head back within budget + chunk. */
Test(session, a_snapshot_with_global_budgets_restores_the_same_rows_and_reply, .timeout = 120)
{
    char err[512], pfile[KVP_SESSION_PATH_MAX];
    enum { BUDGET = 32, CHUNK = 8 };
    snprintf(pfile, sizeof pfile, "%s/policy/weights/stories260K.kvp", getenv("KVP_SOURCE"));
    snap_rig g;
    rig_open(&g, "global", CHUNK, "kvp", pfile);
    char *text = ht_text(150);
    int H = g.model.cfg.n_layers * g.model.cfg.n_kv_heads;
    for (int t = 0; t < KVP_KV_N_TYPES; t++) {
        const char *type = kvp_kv_type_name((kvp_kv_type)t);
        kvp_session_env env = {.model = &g.model, .chunk = CHUNK, .reuse_cache = 1, .top_p = 0.9f,
                               .seed = 1, .store = g.store, .state_dir = g.dir,
                               .kv_type = (kvp_kv_type)t, .budget_mode = KVP_BUDGET_GLOBAL};
        kvp_template_init(&env.tpl, &g.model, NULL, NULL, 0);
        kvp_session_table ta, tb;
        cr_assert_eq(kvp_session_table_init(&ta), 0);
        cr_assert_eq(kvp_session_table_init(&tb), 0);
        kvp_session *s, *r;
        cr_assert_eq(kvp_session_create(&ta, &env, g.pc, NULL, 0.0, &s, err, sizeof err), 0, "%s", err);
        outcome o = run_turn_budget(s, &env, &g.rs, text, 24, BUDGET);
        cr_assert_eq(o.done, 1, "%s", type);
        cr_assert_gt(s->cache.evicted_rows, 0, "%s: nothing was evicted", type);
        /* the bound: the total, and every head within its cap (+ a chunk between evictions) */
        int lo = 1 << 30, hi = 0;
        for (int i = 0; i < H; i++) {
            int n = s->cache.heads[i].n;
            lo = n < lo ? n : lo;
            hi = n > hi ? n : hi;
        }
        cr_assert_leq(kvp_cache_rows(&s->cache), (size_t)H * (BUDGET + CHUNK), "%s", type);
        cr_assert_leq(hi, kvp_policy_head_cap(BUDGET) + CHUNK, "%s", type);
        cr_assert_neq(lo, hi, "%s: every head holds %d rows: the budget was not shared", type, lo);
        cr_assert_gt(hi, BUDGET + CHUNK, "%s: no head above a per-head budget (%d rows)", type, hi);

        cr_assert_eq(kvp_session_save(s, &env, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kvp_session_create(&tb, &env, g.pc, s->id, 0.0, &r, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kvp_session_restore(r, &env, 0, err, sizeof err), 0, "%s", err);
        same_rows(&s->cache, &r->cache, type);

        /* the next turn: the same reply, the same rows kept */
        outcome a = run_turn_budget(s, &env, &g.rs, "The dog ran to the park.", 16, BUDGET);
        outcome b = run_turn_budget(r, &env, &g.rs, "The dog ran to the park.", 16, BUDGET);
        cr_assert_eq(a.done, 1);
        cr_assert_eq(b.done, 1);
        cr_assert_gt(strlen(a.reply), 0);
        cr_assert_str_eq(b.reply, a.reply, "%s: the restored session answered otherwise", type);
        same_rows(&s->cache, &r->cache, type);
        cr_assert_eq(kvp_session_save(s, &env, err, sizeof err), 0, "%s", err);
        kvp_session_table_clear(&tb);

        /* restored under per-head budgets: the next turn evicts every head to its budget */
        env.budget_mode = KVP_BUDGET_PER_HEAD;
        cr_assert_eq(kvp_session_table_init(&tb), 0);
        cr_assert_eq(kvp_session_create(&tb, &env, g.pc, s->id, 0.0, &r, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kvp_session_restore(r, &env, 0, err, sizeof err), 0, "%s", err);
        same_rows(&s->cache, &r->cache, type);
        o = run_turn_budget(r, &env, &g.rs, "It was happy.", 8, BUDGET);
        cr_assert_eq(o.done, 1);
        for (int i = 0; i < H; i++)
            cr_assert_leq(r->cache.heads[i].n, BUDGET + CHUNK, "%s: head %d holds %d rows per head",
                          type, i, r->cache.heads[i].n);
        kvp_session_table_clear(&ta);
        kvp_session_table_clear(&tb);
    }
    free(text);
    rig_close(&g);
}

/* Sampler seeds come from the CSPRNG: two tables with the same configuration (two
 * daemons, or one before and after a restart) give their n-th sessions unrelated seeds,
 * and no two sessions of one table share one. */
Test(session, sampler_seeds_are_unpredictable_per_session, .timeout = 60)
{
    kvp_model model;
    char err[512];
    cr_assert_eq(kvp_model_load(&model, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    kvp_session_env env = {.model = &model, .chunk = 32, .top_p = 0.9f, .seed = 42,
                           .state_dir = ""};
    kvp_session_table a, b;
    cr_assert_eq(kvp_session_table_init(&a), 0);
    cr_assert_eq(kvp_session_table_init(&b), 0);
    kvp_policy_conf *pc = conf("streaming", "");
    enum { N = 16 };
    kvp_session *sa[N], *sb[N];
    for (int i = 0; i < N; i++) {
        cr_assert_eq(kvp_session_create(&a, &env, pc, NULL, 0.0, &sa[i], err, sizeof err), 0);
        cr_assert_eq(kvp_session_create(&b, &env, pc, NULL, 0.0, &sb[i], err, sizeof err), 0);
    }
    for (int i = 0; i < N; i++) {
        cr_assert_neq(sa[i]->seed, sb[i]->seed, "session %d got the same seed in both", i);
        for (int j = 0; j < i; j++)
            cr_assert_neq(sa[i]->seed, sa[j]->seed);
        /* not the old derivation from the base seed and the creation index */
        cr_assert_neq(sa[i]->seed, 42 ^ (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)));
    }
    kvp_session_table_clear(&a);
    kvp_session_table_clear(&b);
    kvp_policy_conf_unref(pc);
    kvp_model_free(&model);
}
