/* The step planner: which queued sessions' units go into one batched forward pass (every
 * decoding turn, then prefill chunks in queue order while they fit the step's rows),
 * the pass itself (kvp_gen_step), then each unit's logits sampled and taken in. No I/O:
 * units that wait on the store run alone as jobs (sessions/turn.h). */
#include "sessions/step_plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "model/matmul.h"
#include "policy/policy.h"
#include "sessions/canary.h"
#include "sessions/turn.h"

/* A started turn's next unit for a batched step: its next prefill chunk or the token
 * sampled last. Returns 1 with the block in q, 0 when the turn ended here (cancelled,
 * nothing to run: reported), ENDED when it ended and its end is a unit of its own
 * (end_turn), NO_ROOM when its chunk does not fit the `room` the step has left: it
 * waits for the next step rather than split the chunk, so its chunks, and so its
 * eviction points, are those of the turn run alone. */
#define NO_ROOM 2
#define ENDED 3
static int plan_unit(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                     int room, kvp_batch_seq *q)
{
    kvp_turn *t = &s->turn;
    if (!t->planned) {   /* its wait for its first step, its start job included */
        t->planned = 1;
        t->stats.queue_ms = (kvp_now() - t->t_start) * 1e3;
    }
    t->evict = turn_evict_cfg(s, env);
    if (atomic_load(&t->cancel))
        return turn_finish(s, env, sink, "cancel") ? ENDED : 0;
    if (t->state == KVP_TURN_DECODE) {
        *q = (kvp_batch_seq){.cache = &s->cache, .tokens = &t->next_token, .n = 1,
                             .hidden = t->canary ? kvp_canary_row(t->canary) : NULL};
        return 1;
    }
    /* KVP_TURN_PREFILL: the next chunk of the transcript not yet run */
    int left = s->n_tokens - s->n_cached;
    int n = left < env->chunk ? left : env->chunk;
    if (n == 0)   /* nothing new to run: no fresh logits to sample from */
        return turn_finish(s, env, sink, "eos") ? ENDED : 0;
    if (n > room)
        return NO_ROOM;
    *q = (kvp_batch_seq){.cache = &s->cache, .tokens = s->tokens + s->n_cached, .n = n,
                         .hidden = t->canary ? kvp_canary_row(t->canary) : NULL};
    return 1;
}

/* Whether the unit's logits are sampled after the step: the block ran and ends the
 * transcript (the prompt's last chunk, or a decoded token). */
static int samples(const kvp_session *s, const kvp_batch_seq *q)
{
    return q->rc >= 0 && s->n_cached + q->n >= s->n_tokens;
}

/* Draws the session's next token from logits (which the sampler overwrites); a canary
 * turn keeps the hidden row the pass wrote for it (on failure the record is dropped). */
static int draw_sampled(kvp_session *s, const kvp_session_env *env, float *logits)
{
    kvp_turn *t = &s->turn;
    int tok = kvp_turn_draw(s, env, logits);
    if (t->canary &&
        kvp_canary_note(t->canary, s->tokens, s->n_tokens, s->hist_tokens, tok) < 0) {
        kvp_canary_rec_free(t->canary);
        t->canary = NULL;
    }
    return tok;
}

/* With logprobs: the raw row is kept before the sampler changes it, and the drawn
 * token's entry (with its alternatives) goes where take_token will count it. */
static int draw(kvp_session *s, const kvp_session_env *env, float *logits)
{
    kvp_turn *t = &s->turn;
    int g = t->stats.generated_tokens;
    if (!t->lp_on || g >= t->lp_cap)
        return draw_sampled(s, env, logits);
    int vocab = s->sampler.vocab_size;
    memcpy(t->lp_row, logits, (size_t)vocab * sizeof *logits);
    int tok = draw_sampled(s, env, logits);
    kvp_hub_logprob *e = t->lp + (size_t)g * (size_t)(1 + t->lp_k);
    kvp_logprob top[KVP_LOGPROBS_MAX_TOP], own;
    int m = kvp_logprobs(t->lp_row, vocab, tok < 0 || tok >= vocab ? 0 : tok, t->lp_k, &own, top);
    int prev = s->n_tokens ? s->tokens[s->n_tokens - 1] : -1;
    for (int j = 0; j <= t->lp_k; j++) {
        kvp_logprob l = j == 0 ? own : j - 1 < m ? top[j - 1] : (kvp_logprob){-1, -INFINITY};
        size_t len = 0;
        const char *p = l.token >= 0 ? kvp_tokenizer_piece(&env->model->tok, prev, l.token, &len)
                                     : NULL;
        e[j] = (kvp_hub_logprob){l.token, l.logprob, p ? p : "", (int)len};
    }
    return tok;
}

typedef struct sample_job {
    kvp_session **ss;
    const int *order, *who;
    kvp_batch_seq *b;
    int *tok;
    const kvp_session_env *env;
} sample_job;

static void sample_item(void *ctx, int j, int slot)
{
    sample_job *sj = ctx;
    kvp_session *s = sj->ss[sj->order[sj->who[j]]];
    (void)slot;
    sj->tok[j] = samples(s, &sj->b[j]) ? draw(s, sj->env, sj->b[j].logits) : -1;
}

/* The unit's result after the step: the block is in the cache; the prompt's last chunk
 * and every decoded token give logits to sample from (tok: drawn already, or -1 to draw
 * here). Returns as kvp_turn_step. */
static int advance_unit(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                        const kvp_batch_seq *q, int tok)
{
    kvp_turn *t = &s->turn;
    int prefill = t->state == KVP_TURN_PREFILL;
    if (q->rc < 0)
        return turn_fail(s, env, sink, prefill, q->rc, prefill ? "prefill" : "decode", NULL);
    s->n_cached += q->n;
    if (prefill)
        t->stats.prefilled_tokens += q->n;
    if (prefill && s->n_cached >= s->n_tokens)
        kvp_policy_mark(s->policy, &s->cache);   /* the reply begins: a rollback point */
    turn_note_rows(s);
    if (s->n_cached < s->n_tokens)
        return 1;
    return turn_take_token(s, env, sink, tok >= 0 ? tok : draw(s, env, q->logits));
}

/* Whether a queued session is a turn that decodes next (one row). */
static int decoding(const kvp_session *s)
{
    return !kvp_session_job_next(s) && s->turn.state == KVP_TURN_DECODE;
}

/* A step's bookkeeping over its n queued sessions. b, e: the blocks of the forward pass
 * and their eviction bounds; who[j]: block j's index in order; order[k]: the queue index
 * of the k-th to take part, unit_more[k] its result; took[i]: queue entry i took part;
 * arrival: the queue by arrival; sorted: the queue reordered. */
typedef struct step_work {
    kvp_batch_seq *b;
    const kvp_evict_cfg **e;
    int *who, *order, *unit_more, *arrival;
    char *took;
    kvp_session **sorted;
} step_work;

static void work_free(step_work *w)
{
    free(w->b);
    free(w->e);
    free(w->who);
    free(w->order);
    free(w->unit_more);
    free(w->arrival);
    free(w->took);
    free(w->sorted);
}

/* 0, or -1 when out of memory (nothing left allocated). */
static int work_alloc(step_work *w, int n)
{
    size_t m = (size_t)n;
    *w = (step_work){malloc(m * sizeof *w->b), malloc(m * sizeof *w->e),
                     malloc(m * sizeof *w->who), malloc(m * sizeof *w->order),
                     malloc(m * sizeof *w->unit_more), malloc(m * sizeof *w->arrival),
                     calloc(m, 1), malloc(m * sizeof *w->sorted)};
    if (w->b && w->e && w->who && w->order && w->unit_more && w->arrival && w->took &&
        w->sorted)
        return 0;
    work_free(w);
    return -1;
}

int kvp_turn_batch(kvp_session **ss, int n, const kvp_session_env *env, kvp_runstate *rs,
                   const kvp_turn_sink *sink, int *more, int *rows)
{
    *rows = 0;
    step_work w;
    if (work_alloc(&w, n) < 0)
        return 0;   /* nobody took part: they stay queued for the next step */
    kvp_batch_seq *b = w.b;
    const kvp_evict_cfg **e = w.e;
    int *who = w.who, *order = w.order, *unit_more = w.unit_more, *arrival = w.arrival;
    char *took = w.took;
    kvp_session **sorted = w.sorted;
    /* Who takes part: first every decoding turn (one row each), so a prompt never holds
     * back the next token of a reply; then each other turn's unit (its next prefill
     * chunk), oldest turn first (by the time its request arrived; queue order among
     * equals), wherever it fits the rows left. A chunk that does not fit is skipped, not
     * split. Under a burst of prompts the oldest ones fill the rows decodes leave, so
     * first tokens come in arrival order and the mean wait is that of a queue served in
     * order, not that of every prompt finishing together; a long prompt still takes one
     * chunk per step, so it cannot hold back the prompts behind it for more than that. */
    for (int i = 0; i < n; i++)
        arrival[i] = i;
    for (int i = 1; i < n; i++) {   /* stable insertion sort of the queue by arrival */
        int v = arrival[i], k = i;
        for (; k > 0 && ss[arrival[k - 1]]->turn.t_start > ss[v]->turn.t_start; k--)
            arrival[k] = arrival[k - 1];
        arrival[k] = v;
    }
    int room = rs->max_tokens, taken = 0, nb = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int q = 0; q < n && room > 0; q++) {
            int i = pass == 0 ? q : arrival[q];
            kvp_session *s = ss[i];
            if (took[i] || decoding(s) != (pass == 0))
                continue;
            int r;
            if (kvp_session_job_next(s) || s->turn.state == KVP_TURN_START) {
                r = turn_run_job(s, env, sink);   /* the scheduler runs these as jobs instead */
            } else if ((r = plan_unit(s, env, sink, room, &b[nb])) == NO_ROOM) {
                continue;
            } else if (r == ENDED) {
                r = 1;   /* no block: its end is its next unit */
            } else if (r) {
                e[nb] = &s->turn.evict;
                room -= b[nb].n;
                who[nb++] = taken;
            }
            took[i] = 1;
            unit_more[taken] = r;
            order[taken++] = i;
        }
    /* One forward step for all of them; each one's failure is its own. */
    if (nb) {
        int rc = kvp_gen_step(env->model, rs, b, e, nb);
        *rows = rs->max_tokens - room;
        /* The samplers of the step on the matmul pool, one session per item (each has
         * its own sampler and logits, so the tokens are those of a serial run); out of
         * memory, each advance_unit draws its own. */
        int *tok = malloc((size_t)nb * sizeof *tok), n_sample = 0;
        for (int j = 0; j < nb; j++) {
            if (rc < 0)
                b[j].rc = rc;
            n_sample += samples(ss[order[who[j]]], &b[j]);
        }
        if (tok) {
            sample_job sj = {ss, order, who, b, tok, env};
            kvp_matmul_enter();
            kvp_matmul_parallel(nb, sample_item, &sj,
                                (size_t)n_sample * (size_t)env->model->cfg.vocab_size * sizeof(float),
                                KVP_MATMUL_MAX_THREADS, 0);
            kvp_matmul_leave();
        }
        for (int j = 0; j < nb; j++)
            unit_more[who[j]] = advance_unit(ss[order[who[j]]], env, sink, &b[j], tok ? tok[j] : -1);
        free(tok);
    }
    /* Those that took part first, in the order they took part, then the others in theirs. */
    for (int k = 0; k < taken; k++) {
        sorted[k] = ss[order[k]];
        more[k] = unit_more[k];
    }
    for (int i = 0, k = taken; i < n; i++)
        if (!took[i])
            sorted[k++] = ss[i];
    memcpy(ss, sorted, (size_t)n * sizeof *ss);
    work_free(&w);
    return taken;
}

int kvp_turn_step(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs,
                  const kvp_turn_sink *sink)
{
    int more = 0, rows;
    return kvp_turn_batch(&s, 1, env, rs, sink, &more, &rows) ? more : 1;
}
