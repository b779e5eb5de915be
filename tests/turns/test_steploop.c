/* The step loop's turns (kvp_turn_batch) on this thread: sessions with different
 * policies, budgets, message lengths and reply lengths join and leave a run of batched
 * steps mid-reply (second turns start while others decode) and give the greedy replies,
 * cache rows and evictions they give alone; a step with too little room leaves the
 * later turns for the next step; one turn's failure ends only that turn. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "policy/policy.h"
#include "turns/session.h"
#include "turns/step_plan.h"
#include "tests/model/testutil.h"
#include "tests/sessions/hubtest.h"

#define N_SESS 6
#define N_TURNS 2

typedef struct spec {
    const char *policy;
    int budget;        /* rows per head (0: none) */
    int words;         /* first message; the second is longer */
    int max_tokens;
    int join;          /* the step its first turn arrives at */
} spec;

static const spec specs[N_SESS] = {
    {"none", 0, 3, 40, 0},
    {"h2o", 48, 30, 60, 0},
    {"streaming", 40, 12, 25, 1},
    {"snapkv", 56, 45, 50, 3},
    {"knorm", 44, 8, 70, 6},
    {"tova", 40, 20, 12, 9},
};

typedef struct record {
    kvp_session *sess[N_SESS];
    char *reply[N_SESS][N_TURNS];
    int turn[N_SESS];           /* turns done */
    int errors;
} record;

static int index_of(const record *r, const kvp_session *s)
{
    for (int i = 0; i < N_SESS; i++)
        if (r->sess[i] == s)
            return i;
    cr_assert_fail("unknown session");
    return -1;
}

static void on_token(void *ctx, kvp_session *s, const char *t, size_t n)
{
    (void)ctx, (void)s, (void)t, (void)n;
}

static void on_done(void *ctx, kvp_session *s, const kvp_turn_stats *st, const char *reply,
                    size_t n)
{
    record *r = ctx;
    int i = index_of(r, s);
    (void)st;
    r->reply[i][r->turn[i]++] = strndup(reply, n);
}

static void on_error(void *ctx, kvp_session *s, int code, const char *msg)
{
    record *r = ctx;
    cr_log_info("session %d: %d %s", index_of(r, s), code, msg);
    r->errors++;
    r->turn[index_of(r, s)]++;
}

typedef struct world {
    kvp_model model;
    kvp_session_env env;
    kvp_session_table table;
    kvp_policy_conf *pc[N_SESS];
} world;

static kvp_policy_conf *conf(const char *name)
{
    kvp_policy_conf *pc = calloc(1, sizeof *pc);
    pc->refs = 1;
    snprintf(pc->name, sizeof pc->name, "%s", name);
    return pc;
}

static void world_open(world *w, const char *model, const char *tok, record *r)
{
    char err[512];
    memset(w, 0, sizeof *w);
    memset(r, 0, sizeof *r);
    cr_assert_eq(kvp_model_load(&w->model, model, tok, err, sizeof err), 0, "%s", err);
    w->env = (kvp_session_env){.model = &w->model, .chunk = 16, .reuse_cache = 1,
                               .top_p = 0.9f, .seed = 1, .state_dir = ""};
    kvp_template_init(&w->env.tpl, &w->model, NULL, NULL, 0);
    cr_assert_eq(kvp_session_table_init(&w->table), 0);
    /* made in the same order in every run (a sampler's own seed is random: begin()
     * seeds each turn, as an API request's `seed` does) */
    for (int i = 0; i < N_SESS; i++) {
        w->pc[i] = conf(specs[i].policy);
        cr_assert_eq(kvp_session_create(&w->table, &w->env, w->pc[i], NULL, 0.0, &r->sess[i],
                                        err, sizeof err), 0, "%s", err);
    }
}

static void world_close(world *w, record *r)
{
    kvp_session_table_clear(&w->table);
    for (int i = 0; i < N_SESS; i++) {
        kvp_policy_conf_unref(w->pc[i]);
        for (int k = 0; k < N_TURNS; k++)
            free(r->reply[i][k]);
    }
    kvp_template_free(&w->env.tpl);
    kvp_model_free(&w->model);
}

/* The temperature of every turn (0: greedy) and, when set, a frequency penalty for the
 * odd sessions. */
static float turn_temperature;
static float turn_penalty;

static void begin(world *w, record *r, int i)
{
    kvp_session *s = r->sess[i];
    char *text = ht_text(specs[i].words + 9 * r->turn[i]);
    cr_assert_eq(kvp_session_begin_turn(s, text, strlen(text), specs[i].max_tokens,
                                        turn_temperature, specs[i].budget, kvp_now()), 0);
    s->rq.spec.has_seed = 1;   /* each (session, turn) its own stream, the same in every run */
    s->rq.spec.seed = 1000u * (uint64_t)i + (uint64_t)r->turn[i] + 1;
    kvp_sample_opts so = {.frequency_penalty = i % 2 ? turn_penalty : 0.0f};
    cr_assert_eq(kvp_session_turn_sampling(s, &so), 0);
    free(text);
    s->state = KVP_SESSION_TURN;
    (void)w;
}

/* Each session alone, its turns one after the other (kvp_turn_step). */
static void run_alone(world *w, record *r)
{
    kvp_runstate rs;
    cr_assert_eq(kvp_runstate_init(&rs, &w->model.cfg, w->env.chunk), 0);
    kvp_turn_sink sink = {on_token, on_done, on_error, NULL, r};
    for (int i = 0; i < N_SESS; i++)
        while (r->turn[i] < N_TURNS) {
            begin(w, r, i);
            while (kvp_turn_step(r->sess[i], &w->env, &rs, &sink))
                ;
            r->sess[i]->state = KVP_SESSION_IDLE;
        }
    kvp_runstate_free(&rs);
}

typedef struct step_log {
    int steps, max_batch, left_out, mixed;
    int decodes_left_out;   /* decoding turns a step left out while prefills ran */
    int prefills_behind;    /* steps that left a prefill out while decodes ran */
} step_log;

/* All of them through batched steps of step_tokens rows, as the scheduler runs them:
 * a run queue, those left out of a full step first in the next one, those that took
 * part at the tail; a session's next turn arrives the step after its last one ended. */
static step_log run_batched(world *w, record *r, int step_tokens)
{
    kvp_runstate rs;
    cr_assert_eq(kvp_runstate_init(&rs, &w->model.cfg, step_tokens), 0);
    kvp_turn_sink sink = {on_token, on_done, on_error, NULL, r};
    kvp_session *queue[N_SESS], *next[N_SESS];
    int nq = 0, more[N_SESS], pending[N_SESS];
    step_log log = {0};
    for (int i = 0; i < N_SESS; i++)
        pending[i] = specs[i].join;   /* the step the next turn arrives at; -1: none */
    for (int step = 0;; step++) {
        for (int i = 0; i < N_SESS; i++)
            if (pending[i] == step) {
                begin(w, r, i);
                queue[nq++] = r->sess[i];
                pending[i] = -1;
            }
        if (nq == 0) {
            int waiting = 0;
            for (int i = 0; i < N_SESS; i++)
                waiting |= pending[i] >= 0;
            if (!waiting)
                break;
            continue;
        }
        int decoding = 0, prefilling = 0;
        for (int k = 0; k < nq; k++) {
            decoding += queue[k]->turn.state == KVP_TURN_DECODE;
            prefilling += queue[k]->turn.state != KVP_TURN_DECODE;
        }
        int rows = 0, was_decoding[N_SESS];
        kvp_session *before[N_SESS];
        for (int k = 0; k < nq; k++) {
            before[k] = queue[k];
            was_decoding[k] = queue[k]->turn.state == KVP_TURN_DECODE;
        }
        int taken = kvp_turn_batch(queue, nq, &w->env, &rs, &sink, more, &rows);
        cr_assert_gt(taken, 0);
        /* the queue comes back reordered: those that took part first */
        int prefill_left = 0;
        for (int k = 0; k < nq; k++) {
            int at = -1;
            for (int m = 0; m < nq; m++)
                if (queue[m] == before[k])
                    at = m;
            cr_assert_geq(at, 0, "a queued session is still queued");
            log.decodes_left_out += was_decoding[k] && at >= taken && decoding <= rs.max_tokens;
            prefill_left += !was_decoding[k] && at >= taken;
        }
        log.prefills_behind += prefill_left && decoding;
        log.steps++;
        log.max_batch = taken > log.max_batch ? taken : log.max_batch;
        log.left_out += taken < nq;
        log.mixed |= decoding && prefilling && taken == nq;
        int nn = 0;
        for (int k = taken; k < nq; k++)
            next[nn++] = queue[k];
        for (int k = 0; k < taken; k++) {
            if (more[k]) {
                next[nn++] = queue[k];
                continue;
            }
            int i = index_of(r, queue[k]);
            queue[k]->state = KVP_SESSION_IDLE;
            if (r->turn[i] < N_TURNS)
                pending[i] = step + 1;
        }
        memcpy(queue, next, (size_t)nn * sizeof *queue);
        nq = nn;
    }
    kvp_runstate_free(&rs);
    return log;
}

static void check(const char *model, const char *tok, int step_tokens)
{
    world wa, wb;
    record alone, batched;
    world_open(&wa, model, tok, &alone);
    run_alone(&wa, &alone);
    world_open(&wb, model, tok, &batched);
    step_log log = run_batched(&wb, &batched, step_tokens);
    cr_assert_eq(alone.errors, 0);
    cr_assert_eq(batched.errors, 0);
    cr_assert_geq(log.max_batch, 4, "sessions overlap");
    cr_assert(log.mixed, "a step mixes prefill chunks with decodes");
    cr_assert_eq(log.decodes_left_out, 0, "every decoding turn takes part in each step");
    cr_log_info("%s: %d steps, largest batch %d, %d steps left turns out", model, log.steps,
                log.max_batch, log.left_out);
    for (int i = 0; i < N_SESS; i++) {
        for (int k = 0; k < N_TURNS; k++) {
            cr_assert(alone.reply[i][k] && batched.reply[i][k]);
            cr_assert_gt(strlen(alone.reply[i][k]), 0);
            cr_expect_str_eq(batched.reply[i][k], alone.reply[i][k],
                             "session %d (%s, budget %d), turn %d", i, specs[i].policy,
                             specs[i].budget, k);
        }
        kvp_session *a = alone.sess[i], *b = batched.sess[i];
        cr_expect_eq(b->n_tokens, a->n_tokens, "session %d: transcript", i);
        cr_expect_eq(kvp_cache_rows(&b->cache), kvp_cache_rows(&a->cache), "session %d: rows", i);
        cr_expect_eq(b->cache.evicted_rows, a->cache.evicted_rows, "session %d: evicted", i);
        if (specs[i].budget)
            cr_expect_gt(a->cache.evicted_rows, 0, "session %d evicts", i);
    }
    world_close(&wa, &alone);
    world_close(&wb, &batched);
    if (step_tokens < 64) {
        cr_assert_gt(log.left_out, 0, "the step budget left turns out");
        cr_assert_gt(log.prefills_behind, 0, "prefills waited while decodes ran");
    }
}

Test(steploop, stories260K_batched_turns_equal_alone, .timeout = 120)
{
    check(tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), 256);
}

/* A step of 24 rows: chunks of 16 do not all fit, so turns wait for the next step. */
Test(steploop, a_small_step_budget_changes_no_reply, .timeout = 120)
{
    check(tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), 24);
}

/* Writes a `kvp synth` model of that shape to path (its own SentencePiece vocabulary). */
static void synth(char *path, size_t len, const char *tag, const char *shape)
{
    char cmd[768];
    snprintf(path, len, "/tmp/kvp-test-steploop%s-%d.gguf", tag, (int)getpid());
    snprintf(cmd, sizeof cmd, "%s synth --out %s %s --ctx 512 2>&1", tu_build("tools/kvp"), path,
             shape);
    cr_assert_eq(tu_run(cmd, NULL), 0, "%s", cmd);
}

/* A GQA synthetic with its own SentencePiece vocabulary. */
Test(steploop, gqa_synthetic_batched_turns_equal_alone, .timeout = 120)
{
    char path[128];
    synth(path, sizeof path, "", "--dim 64 --hidden 160 --layers 2 --heads 8 --kv-heads 2 "
          "--vocab 600 --seed 3");
    check(path, NULL, 40);
    remove(path);
}

/* In one step, a turn whose policy cannot be made ends with its error; the other turns
 * of the step go on and give their replies alone. */
Test(steploop, one_failing_turn_ends_only_itself, .timeout = 120)
{
    world wa, wb;
    record alone, batched;
    world_open(&wa, tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), &alone);
    run_alone(&wa, &alone);
    world_open(&wb, tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), &batched);
    kvp_session *bad = batched.sess[2];
    kvp_policy_conf_unref(bad->pconf);
    bad->pconf = conf("kvp");
    snprintf(bad->pconf->file, sizeof bad->pconf->file, "/nonexistent/policy.kvp");
    kvp_runstate rs;
    cr_assert_eq(kvp_runstate_init(&rs, &wb.model.cfg, 256), 0);
    kvp_turn_sink sink = {on_token, on_done, on_error, NULL, &batched};
    kvp_session *queue[N_SESS];
    int more[N_SESS], rows, nq = N_SESS;
    for (int i = 0; i < N_SESS; i++) {
        begin(&wb, &batched, i);
        queue[i] = batched.sess[i];
    }
    while (nq) {
        int taken = kvp_turn_batch(queue, nq, &wb.env, &rs, &sink, more, &rows);
        cr_assert_eq(taken, nq);
        int nn = 0;
        for (int k = 0; k < nq; k++)
            if (more[k])
                queue[nn++] = queue[k];
        nq = nn;
    }
    cr_assert_eq(batched.errors, 1);
    cr_assert_null(batched.reply[2][0]);
    for (int i = 0; i < N_SESS; i++)
        if (i != 2)
            cr_expect_str_eq(batched.reply[i][0], alone.reply[i][0], "session %d", i);
    kvp_runstate_free(&rs);
    world_close(&wa, &alone);
    world_close(&wb, &batched);
}

/* Sampled turns (temperature 0.8, some with a frequency penalty) on a synthetic with a
 * 70000-token vocabulary, so a step's samplers are worth the matmul pool: the replies of
 * batched steps with the pool are those with every step on one thread. */
Test(steploop, samplers_on_the_pool_draw_what_a_serial_step_draws)
{
    char path[128];
    synth(path, sizeof path, "-v", "--dim 64 --hidden 128 --layers 1 --heads 4 --kv-heads 2 "
          "--vocab 70000 --seed 5");
    turn_temperature = 0.8f;
    turn_penalty = 0.7f;
    world ws, wp;
    record serial, pooled;
    kvp_matmul_force_threads(1);
    world_open(&ws, path, NULL, &serial);
    run_batched(&ws, &serial, 256);
    kvp_matmul_force_threads(0);
    world_open(&wp, path, NULL, &pooled);
    run_batched(&wp, &pooled, 256);
    remove(path);
    cr_assert_eq(serial.errors, 0);
    cr_assert_eq(pooled.errors, 0);
    int differ = 0;
    for (int i = 0; i < N_SESS; i++)
        for (int k = 0; k < N_TURNS; k++) {
            cr_assert(serial.reply[i][k] && pooled.reply[i][k]);
            cr_assert_gt(strlen(serial.reply[i][k]), 0);
            cr_expect_str_eq(pooled.reply[i][k], serial.reply[i][k], "session %d turn %d", i, k);
            differ += i && strcmp(serial.reply[i][k], serial.reply[0][0]) != 0;
        }
    cr_expect_gt(differ, 0, "the sessions draw their own streams");
    world_close(&ws, &serial);
    world_close(&wp, &pooled);
    turn_temperature = turn_penalty = 0.0f;
}

/* A burst of prompts: every turn arrives at once, queued in the reverse of the order
 * their requests arrived in, with a step that has room for two chunks. Prefills take the
 * rows oldest first, so first tokens come in arrival order, and the first request's
 * first token waits only for its own chunks, not for every prompt's. */
static int burst_step;
static int burst_first[N_SESS];

static void on_first_token(void *ctx, kvp_session *s, const char *t, size_t n)
{
    record *r = ctx;
    int i = index_of(r, s);
    (void)t, (void)n;
    if (burst_first[i] < 0)
        burst_first[i] = burst_step;
}

Test(steploop, a_burst_of_prompts_gets_first_tokens_in_arrival_order, .timeout = 120)
{
    world w;
    record r;
    world_open(&w, tu_shared("models/stories260K.bin"), tu_shared("models/tok512.bin"), &r);
    kvp_runstate rs;
    cr_assert_eq(kvp_runstate_init(&rs, &w.model.cfg, 2 * w.env.chunk), 0);
    kvp_turn_sink sink = {on_first_token, on_done, on_error, NULL, &r};
    kvp_session *queue[N_SESS];
    int more[N_SESS], rows, nq = N_SESS, chunks = 0;
    char *text = ht_text(40);
    for (int i = 0; i < N_SESS; i++) {
        kvp_session *s = r.sess[i];
        /* request i arrived at 100 + i s; the queue holds them newest first */
        cr_assert_eq(kvp_session_begin_turn(s, text, strlen(text), 4, 0.0f, 0, 100.0 + i), 0);
        s->state = KVP_SESSION_TURN;
        queue[N_SESS - 1 - i] = s;
        burst_first[i] = -1;
    }
    free(text);
    for (burst_step = 0; nq; burst_step++) {
        int taken = kvp_turn_batch(queue, nq, &w.env, &rs, &sink, more, &rows);
        cr_assert_gt(taken, 0);
        cr_assert_leq(rows, rs.max_tokens);
        kvp_session *next[N_SESS];
        int nn = 0;
        for (int k = taken; k < nq; k++)
            next[nn++] = queue[k];
        for (int k = 0; k < taken; k++)
            if (more[k])
                next[nn++] = queue[k];
        memcpy(queue, next, (size_t)nn * sizeof *queue);
        nq = nn;
    }
    cr_assert_eq(r.errors, 0);
    chunks = (r.sess[0]->turn.stats.prefilled_tokens + w.env.chunk - 1) / w.env.chunk;
    cr_assert_gt(chunks, 2, "each prompt takes several steps' chunks");
    for (int i = 0; i < N_SESS; i++) {
        cr_assert_geq(burst_first[i], 0, "session %d answered", i);
        if (i)
            cr_expect_geq(burst_first[i], burst_first[i - 1],
                          "request %d's first token (step %d) after request %d's (step %d)", i,
                          burst_first[i], i - 1, burst_first[i - 1]);
    }
    /* two chunks a step: the two oldest prompts are done after their own chunks */
    cr_expect_leq(burst_first[0], chunks, "the first request waited %d steps for %d chunks",
                  burst_first[0], chunks);
    cr_expect_gt(burst_first[N_SESS - 1], burst_first[0] + chunks / 2,
                 "the last request waited behind the others");
    kvp_runstate_free(&rs);
    world_close(&w, &r);
}
