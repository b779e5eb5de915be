/* The step planner (turns/step_plan.c) in process, driven as the scheduler drives it
 * (those a step left out first, those that took part at the tail): a step's prefill
 * slice never passes env->prefill_tokens; decoding turns get a token in every step while
 * a long prompt prefills; a short prompt admitted behind a long one, and a returning
 * session's few new tokens, answer before the long prompt is done, each first token in
 * the step that runs its prompt's last chunk; a long prompt behind a stream of short
 * ones still moves on; and greedy replies of chunked, interleaved prefill are those of
 * each prompt prefilled alone in one block. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "turns/session.h"
#include "turns/step_plan.h"
#include "tests/model/testutil.h"
#include "tests/sessions/hubtest.h"

#define MAXS 12
#define CHUNK 16

typedef struct run {
    kvp_model model;
    kvp_session_env env;
    kvp_session_table table;
    kvp_policy_conf *pc;
    kvp_session *sess[MAXS];
    int n;
    int step;                  /* the step being run */
    int first_step[MAXS];      /* the step of the turn's first token (-1: none yet) */
    int prompt_end_step[MAXS]; /* the step that ran the prompt's last chunk */
    char *reply[MAXS];         /* the last turn's reply */
    int errors;
} run;

static int index_of(const run *r, const kvp_session *s)
{
    for (int i = 0; i < r->n; i++)
        if (r->sess[i] == s)
            return i;
    cr_assert_fail("unknown session");
    return -1;
}

static void on_token(void *ctx, kvp_session *s, const char *t, size_t n)
{
    run *r = ctx;
    int i = index_of(r, s);
    (void)t, (void)n;
    if (r->first_step[i] < 0)
        r->first_step[i] = r->step;
}

static void on_done(void *ctx, kvp_session *s, const kvp_turn_stats *st, const char *reply,
                    size_t n)
{
    run *r = ctx;
    int i = index_of(r, s);
    (void)st;
    free(r->reply[i]);
    r->reply[i] = strndup(reply, n);
}

static void on_error(void *ctx, kvp_session *s, int code, const char *msg)
{
    run *r = ctx;
    cr_log_error("session %d: %d %s", index_of(r, s), code, msg);
    r->errors++;
}

/* n sessions on stories260K, no eviction (so chunk sizes change no cache), chunks of
 * `chunk` tokens and a prefill slice of prefill_tokens. */
static void run_open(run *r, int n, int chunk, int prefill_tokens)
{
    char err[512];
    memset(r, 0, sizeof *r);
    cr_assert_eq(kvp_model_load(&r->model, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    r->env = (kvp_session_env){.model = &r->model, .chunk = chunk, .reuse_cache = 1,
                               .prefill_tokens = prefill_tokens, .top_p = 0.9f, .seed = 1,
                               .state_dir = ""};
    kvp_template_init(&r->env.tpl, &r->model, NULL, NULL, 0);
    cr_assert_eq(kvp_session_table_init(&r->table), 0);
    r->pc = calloc(1, sizeof *r->pc);
    r->pc->refs = 1;
    snprintf(r->pc->name, sizeof r->pc->name, "none");
    r->n = n;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(kvp_session_create(&r->table, &r->env, r->pc, NULL, 0.0, &r->sess[i], err,
                                        sizeof err), 0, "%s", err);
        r->first_step[i] = r->prompt_end_step[i] = -1;
    }
}

static void run_close(run *r)
{
    kvp_session_table_clear(&r->table);
    kvp_policy_conf_unref(r->pc);
    for (int i = 0; i < r->n; i++)
        free(r->reply[i]);
    kvp_template_free(&r->env.tpl);
    kvp_model_free(&r->model);
}

/* Arms session i's next turn: a message of `words` words, a greedy reply of max_tokens,
 * its request arrived at `at` (seconds). */
static void begin(run *r, int i, int words, int max_tokens, double at)
{
    kvp_session *s = r->sess[i];
    char *text = ht_text(words);
    cr_assert_eq(kvp_session_begin_turn(s, text, strlen(text), max_tokens, 0.0f, 0, at), 0);
    free(text);
    s->state = KVP_SESSION_TURN;
    r->first_step[i] = r->prompt_end_step[i] = -1;
}

/* What one step did, seen from outside the planner. */
typedef struct step_seen {
    int prefill_rows;           /* prompt tokens the step ran */
    int decoders, decoded;      /* turns decoding before it; of them, those that drew a token */
} step_seen;

typedef void (*arrivals_fn)(run *r, int step, kvp_session **queue, int *nq);
typedef void (*seen_fn)(run *r, int step, const step_seen *st);

/* Steps until the queue is empty and no arrivals are left (arrive returns nothing new
 * once its scenario ended), as the scheduler runs them. Returns the steps run. */
static int drive(run *r, int step_tokens, kvp_session **queue, int nq, arrivals_fn arrive,
                 seen_fn seen)
{
    kvp_runstate rs;
    cr_assert_eq(kvp_runstate_init(&rs, &r->model.cfg, step_tokens), 0);
    kvp_turn_sink sink = {on_token, on_done, on_error, NULL, r};
    int more[MAXS], rows;
    for (r->step = 0; r->step < 10000; r->step++) {
        if (arrive)
            arrive(r, r->step, queue, &nq);
        if (!nq)
            break;
        int cached[MAXS], state[MAXS], gen[MAXS];
        for (int i = 0; i < r->n; i++) {
            kvp_session *s = r->sess[i];
            cached[i] = s->n_cached;
            state[i] = s->state == KVP_SESSION_TURN ? (int)s->turn.state : -1;
            gen[i] = s->turn.stats.generated_tokens;
        }
        int taken = kvp_turn_batch(queue, nq, &r->env, &rs, &sink, more, &rows);
        cr_assert_gt(taken, 0);
        step_seen st = {0};
        for (int i = 0; i < r->n; i++) {
            kvp_session *s = r->sess[i];
            if (state[i] == KVP_TURN_PREFILL) {
                st.prefill_rows += s->n_cached - cached[i];
                if (s->n_cached > cached[i] &&
                    (s->state != KVP_SESSION_TURN || s->turn.state != KVP_TURN_PREFILL))
                    r->prompt_end_step[i] = r->step;
            }
            if (state[i] == KVP_TURN_DECODE) {
                st.decoders++;
                st.decoded += s->turn.stats.generated_tokens == gen[i] + 1;
            }
        }
        if (seen)
            seen(r, r->step, &st);
        kvp_session *next[MAXS];
        int nn = 0;
        for (int k = taken; k < nq; k++)
            next[nn++] = queue[k];
        for (int k = 0; k < taken; k++)
            if (more[k])
                next[nn++] = queue[k];
            else
                queue[k]->state = KVP_SESSION_IDLE;   /* the job ended: the worker's last touch */
        memcpy(queue, next, (size_t)nn * sizeof *queue);
        nq = nn;
    }
    kvp_runstate_free(&rs);
    cr_assert_eq(r->errors, 0);
    return r->step;
}

/* Every session's prompt arrives at once, all long, so the prefill slice is the bound. */
static int max_slice;
static void note_slice(run *r, int step, const step_seen *st)
{
    (void)r, (void)step;
    if (st->prefill_rows > max_slice)
        max_slice = st->prefill_rows;
}

static int burst_slice(int prefill_tokens)
{
    run r;
    run_open(&r, 8, CHUNK, prefill_tokens);
    kvp_session *queue[MAXS];
    for (int i = 0; i < 8; i++) {
        begin(&r, i, 30 + 3 * i, 4, 100.0 + i);
        queue[i] = r.sess[i];
    }
    max_slice = 0;
    drive(&r, 256, queue, 8, NULL, note_slice);
    for (int i = 0; i < 8; i++)
        cr_assert(r.reply[i], "session %d answered", i);
    run_close(&r);
    return max_slice;
}

Test(step_plan, a_steps_prefill_slice_never_exceeds_the_budget, .timeout = 120)
{
    cr_expect_leq(burst_slice(2 * CHUNK), 2 * CHUNK, "a step prefilled %d rows", max_slice);
    cr_expect_eq(max_slice, 2 * CHUNK, "the slice is used to its bound");
    /* a slice below one chunk still takes one chunk (prompts never stall) */
    cr_expect_eq(burst_slice(1), CHUNK);
    /* without a bound the step's rows are the limit: the burst takes more at once */
    cr_expect_gt(burst_slice(0), 2 * CHUNK, "no slice bound: %d rows", max_slice);
}

/* Session 0 decodes a long reply; session 1's long prompt arrives at step 2. */
static int decode_steps_checked;
static void long_prompt_arrives(run *r, int step, kvp_session **queue, int *nq)
{
    if (step == 2) {
        begin(r, 1, 120, 2, 101.0);
        queue[(*nq)++] = r->sess[1];
    }
}

static void decodes_every_step(run *r, int step, const step_seen *st)
{
    kvp_session *l = r->sess[1];
    if (step < 2 || st->prefill_rows == 0)
        return;
    cr_assert_eq(st->decoded, st->decoders, "step %d: every decoding turn drew its token", step);
    decode_steps_checked += st->decoders == 1 && l->state == KVP_SESSION_TURN;
}

Test(step_plan, decoding_turns_get_a_token_every_step_while_a_long_prompt_prefills,
     .timeout = 120)
{
    run r;
    run_open(&r, 2, CHUNK, CHUNK);
    kvp_session *queue[MAXS];
    begin(&r, 0, 3, 80, 100.0);
    queue[0] = r.sess[0];
    decode_steps_checked = 0;
    drive(&r, 256, queue, 1, long_prompt_arrives, decodes_every_step);
    int chunks = (r.sess[1]->turn.stats.prefilled_tokens + CHUNK - 1) / CHUNK;
    cr_assert_gt(chunks, 4, "the long prompt takes several steps");
    cr_expect_geq(decode_steps_checked, 4, "the reply decoded beside %d of %d chunks",
                  decode_steps_checked, chunks);
    cr_assert(r.reply[0] && r.reply[1]);
    run_close(&r);
}

/* The two ways a step runs out of prefill rows: a slice of one chunk in a large step,
 * and a step of one chunk and a row with no slice bound. */
static const int limits[2][2] = {{256, CHUNK}, {CHUNK + 1, 0}};

/* A long prompt (request 0), then a short one (request 1): the short prompt answers
 * first, each first token in the step of its prompt's last chunk. */
Test(step_plan, a_short_prompt_admitted_after_a_long_one_answers_first, .timeout = 120)
{
    for (int v = 0; v < 2; v++) {
        run r;
        run_open(&r, 2, CHUNK, limits[v][1]);
        kvp_session *queue[MAXS];
        begin(&r, 0, 120, 4, 100.0);
        begin(&r, 1, 3, 4, 101.0);
        queue[0] = r.sess[0];
        queue[1] = r.sess[1];
        drive(&r, limits[v][0], queue, 2, NULL, NULL);
        cr_assert_leq(r.sess[1]->turn.stats.prefilled_tokens, CHUNK, "the short prompt: one chunk");
        cr_assert_gt(r.sess[0]->turn.stats.prefilled_tokens, 4 * CHUNK);
        cr_expect_lt(r.first_step[1], r.prompt_end_step[0],
                     "step of %d rows, slice %d: the short prompt's first token (step %d) "
                     "before the long prompt is done (step %d)", limits[v][0], limits[v][1],
                     r.first_step[1], r.prompt_end_step[0]);
        for (int i = 0; i < 2; i++)
            cr_expect_eq(r.first_step[i], r.prompt_end_step[i],
                         "session %d: first token in step %d, prompt's last chunk in step %d", i,
                         r.first_step[i], r.prompt_end_step[i]);
        run_close(&r);
    }
}

/* Session 1 had a turn and comes back with a few words on its cached transcript while
 * session 0's long first prompt, which arrived before, prefills. */
Test(step_plan, a_returning_session_with_few_new_tokens_goes_first, .timeout = 120)
{
    for (int v = 0; v < 2; v++) {
        run r;
        run_open(&r, 2, CHUNK, limits[v][1]);
        kvp_session *queue[MAXS];
        begin(&r, 1, 40, 6, 90.0);
        queue[0] = r.sess[1];
        drive(&r, limits[v][0], queue, 1, NULL, NULL);
        cr_assert_gt(r.sess[1]->n_cached, CHUNK, "the first turn is in the cache");
        begin(&r, 0, 120, 4, 100.0);
        begin(&r, 1, 2, 4, 101.0);
        queue[0] = r.sess[0];
        queue[1] = r.sess[1];
        drive(&r, limits[v][0], queue, 2, NULL, NULL);
        cr_assert_leq(r.sess[1]->turn.stats.prefilled_tokens, CHUNK, "a few new tokens");
        /* step 0 runs both starts; step 1 the first chunks */
        cr_expect_eq(r.first_step[1], 1, "step of %d rows, slice %d: the returning session "
                     "answered in step %d", limits[v][0], limits[v][1], r.first_step[1]);
        cr_expect_lt(r.first_step[1], r.prompt_end_step[0]);
        run_close(&r);
    }
}

/* One long prompt, and a new one-chunk prompt arriving at every step: the long prompt
 * is passed over for a bounded number of steps at a time, so it still finishes. */
static void short_prompts_keep_coming(run *r, int step, kvp_session **queue, int *nq)
{
    int i = 1 + step % (r->n - 1);
    if (step < 200 && r->sess[i]->state != KVP_SESSION_TURN) {
        begin(r, i, 2, 1, 200.0 + step);
        queue[(*nq)++] = r->sess[i];
    }
}

Test(step_plan, a_long_prompt_behind_a_stream_of_short_ones_still_moves_on, .timeout = 120)
{
    run r;
    run_open(&r, MAXS, CHUNK, CHUNK);
    kvp_session *queue[MAXS];
    begin(&r, 0, 120, 2, 100.0);
    queue[0] = r.sess[0];
    drive(&r, 256, queue, 1, short_prompts_keep_coming, NULL);
    int chunks = (r.sess[0]->turn.stats.prefilled_tokens + CHUNK - 1) / CHUNK;
    cr_assert(r.reply[0], "the long prompt was answered");
    cr_expect_lt(r.prompt_end_step[0], 200, "it finished while short prompts still came");
    /* after its start, at least one chunk in every 5 steps */
    cr_expect_leq(r.prompt_end_step[0], 5 * chunks, "%d chunks took %d steps", chunks,
                  r.prompt_end_step[0]);
    run_close(&r);
}

/* Prompts of several lengths arriving over time beside decoding turns, in chunks of 16
 * within a slice of two chunks, against each prompt alone in one block (chunk 4096):
 * the same greedy replies. */
static const int words[6] = {3, 45, 12, 80, 25, 60};

static void staggered(run *r, int step, kvp_session **queue, int *nq)
{
    for (int i = 0; i < 6; i++)
        if (step == 2 * i) {
            begin(r, i, words[i], 24, 100.0 + i);
            queue[(*nq)++] = r->sess[i];
        }
}

Test(step_plan, chunked_interleaved_prefill_replies_equal_unchunked, .timeout = 120)
{
    run one, batched;
    run_open(&one, 6, 4096, 0);
    for (int i = 0; i < 6; i++) {
        kvp_session *queue[MAXS] = {one.sess[i]};
        begin(&one, i, words[i], 24, 100.0 + i);
        drive(&one, 4096, queue, 1, NULL, NULL);
        cr_assert_eq(one.prompt_end_step[i], 1, "session %d: its start, then one block", i);
    }
    run_open(&batched, 6, CHUNK, 2 * CHUNK);
    kvp_session *queue[MAXS];
    drive(&batched, 256, queue, 0, staggered, NULL);
    int chunked = 0;
    for (int i = 0; i < 6; i++) {
        cr_assert(one.reply[i] && batched.reply[i], "session %d answered", i);
        cr_assert_gt(strlen(one.reply[i]), 0);
        cr_expect_str_eq(batched.reply[i], one.reply[i], "session %d", i);
        chunked += batched.sess[i]->turn.stats.prefilled_tokens > CHUNK;
    }
    cr_assert_geq(chunked, 3, "prompts took several chunks");
    run_close(&one);
    run_close(&batched);
}

/* A burst of prompts that share prefixes (the same opening, some the same prompt, some
 * running on past it: ht_text's words), with env.share_prompts against without: the same
 * greedy replies, with rows shared (share_rows) or copied, and the shared rows computed
 * once. budget > 0: policy knorm with eviction inside the prompts. */
static const int burst_words[8] = {40, 40, 52, 40, 64, 52, 40, 90};

static void burst_run(run *r, int share, int share_rows, const char *policy, int budget)
{
    run_open(r, 8, CHUNK, 4 * CHUNK);
    snprintf(r->pc->name, sizeof r->pc->name, "%s", policy);
    r->env.share_prompts = share;
    r->env.share_rows = share_rows;
    kvp_session *queue[MAXS];
    for (int i = 0; i < 8; i++) {
        kvp_session *s = r->sess[i];
        char *text = ht_text(burst_words[i]);
        cr_assert_eq(kvp_session_begin_turn(s, text, strlen(text), 20, 0.0f, budget, 100.0 + i), 0);
        free(text);
        s->state = KVP_SESSION_TURN;
        queue[i] = s;
    }
    drive(r, 256, queue, 8, NULL, NULL);
}

static int prefilled(const run *r)
{
    int n = 0;
    for (int i = 0; i < r->n; i++)
        n += r->sess[i]->turn.stats.prefilled_tokens;
    return n;
}

static void burst_compare(const char *policy, int budget)
{
    run off;
    burst_run(&off, 0, 1, policy, budget);
    uint64_t evicted = 0;
    for (int i = 0; i < 8; i++)
        evicted += off.sess[i]->cache.evicted_rows;
    cr_assert(budget == 0 || evicted > 0, "the budget evicts inside the prompts");
    for (int rows = 0; rows < 2; rows++) {
        run on;
        burst_run(&on, 1, rows, policy, budget);
        int took = 0;
        for (int i = 0; i < 8; i++) {
            cr_assert(off.reply[i] && on.reply[i], "session %d answered", i);
            cr_assert_gt(strlen(off.reply[i]), 0);
            cr_expect_str_eq(on.reply[i], off.reply[i], "%s budget %d share_rows %d: session %d",
                             policy, budget, rows, i);
            const kvp_turn_stats *st = &on.sess[i]->turn.stats;
            took += st->cached_tokens > 0;
            cr_expect_eq(st->prefilled_tokens + st->cached_tokens,
                         off.sess[i]->turn.stats.prefilled_tokens,
                         "session %d: every prompt token run or taken", i);
            if (st->cached_tokens)
                cr_expect_eq(st->cached_from, rows ? KVP_REUSE_SHARED : KVP_REUSE_OTHER);
        }
        cr_expect_geq(took, 6, "%d of 8 prompts took another's rows", took);
        /* one opening of 40 words is common to all: far fewer rows than 8 prompts */
        cr_expect_lt(2 * prefilled(&on), prefilled(&off), "prefilled %d rows shared, %d not",
                     prefilled(&on), prefilled(&off));
        if (budget == 0)
            for (int i = 0; i < 8; i++)
                cr_expect_eq(on.sess[i]->cache.evicted_rows, 0);
        run_close(&on);
    }
    run_close(&off);
}

Test(step_plan, a_burst_sharing_prefixes_prefills_them_once_with_the_same_replies,
     .timeout = 240)
{
    burst_compare("none", 0);
}

/* With eviction inside the longer prompts, a prompt takes a whole number of chunks
 * (its eviction points stay those of a lone run): the same replies. */
Test(step_plan, shared_prefixes_under_eviction_give_the_same_replies, .timeout = 240)
{
    burst_compare("knorm", 3 * CHUNK);
}

/* A prompt whose next chunk another prompt of the step computes waits a step for those
 * rows, every chunk of a long prompt too (waiting is not being passed over): 2 identical
 * prompts, one chunk long and many chunks long. */
Test(step_plan, identical_prompts_run_their_common_rows_once, .timeout = 120)
{
    static const int lengths[2] = {10, 120};
    for (int v = 0; v < 2; v++) {
        run r;
        run_open(&r, 2, CHUNK, 4 * CHUNK);
        r.env.share_prompts = 1;
        r.env.share_rows = 1;
        kvp_session *queue[MAXS];
        for (int i = 0; i < 2; i++) {
            begin(&r, i, lengths[v], 8, 100.0 + i);
            queue[i] = r.sess[i];
        }
        drive(&r, 256, queue, 2, NULL, NULL);
        cr_assert(r.reply[0] && r.reply[1]);
        cr_expect_str_eq(r.reply[1], r.reply[0]);
        const kvp_turn_stats *a = &r.sess[0]->turn.stats, *b = &r.sess[1]->turn.stats;
        cr_assert_gt(a->prefilled_tokens, v ? 8 * CHUNK : 1);
        cr_expect_eq(b->prefilled_tokens, 1, "%d words: the second prompt ran only its last "
                     "token, not %d", lengths[v], b->prefilled_tokens);
        cr_expect_eq(b->cached_tokens, a->prefilled_tokens - 1);
        cr_expect_eq(r.first_step[1], r.first_step[0] + 1, "its first token a step later");
        run_close(&r);
    }
}
