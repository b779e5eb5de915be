/* The step planner: which queued sessions' units go into one batched forward pass (every
 * decoding turn, then prefill chunks within the step's prefill slice, fewest tokens left
 * first),
 * the pass itself (kvp_gen_step), then each unit's logits sampled and taken in. No I/O:
 * units that wait on the store run alone as jobs (turns/turn.h). */
#include "turns/step_plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "model/matmul.h"
#include "policy/policy.h"
#include "observe/canary.h"
#include "turns/rewind.h"
#include "turns/turn.h"

/* The canary's record of s's turn while it takes tokens (NULL: not sampled, or dropped). */
static kvp_canary_rec *canary_of(const kvp_session *s)
{
    return s->res.canary_dropped ? NULL : s->rq.spec.canary;
}

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
        t->stats.queue_ms = (kvp_now() - s->rq.spec.t_start) * 1e3;
    }
    t->evict = turn_evict_cfg(s, env);
    if (atomic_load(&s->rq.cancel))
        return turn_finish(s, env, sink, "cancel") ? ENDED : 0;
    if (t->state == KVP_TURN_DECODE) {
        *q = (kvp_batch_seq){.cache = &s->cache, .tokens = &t->next_token, .n = 1,
                             .hidden = canary_of(s) ? kvp_canary_row(canary_of(s)) : NULL};
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
                         .hidden = canary_of(s) ? kvp_canary_row(canary_of(s)) : NULL};
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
    int tok = kvp_turn_draw(s, env, logits);
    kvp_canary_rec *c = canary_of(s);
    if (c && kvp_canary_note(c, s->tokens, s->n_tokens, s->hist_tokens, tok) < 0)
        s->res.canary_dropped = 1;   /* the loop frees it after the turn */
    return tok;
}

/* With logprobs: the raw row is kept before the sampler changes it, and the drawn
 * token's entry (with its alternatives) goes where take_token will count it. */
static int draw(kvp_session *s, const kvp_session_env *env, float *logits)
{
    const kvp_turn_spec *sp = &s->rq.spec;
    int g = s->turn.stats.generated_tokens;
    if (!sp->lp_on || g >= sp->lp_cap)
        return draw_sampled(s, env, logits);
    int vocab = s->sampler.vocab_size;
    memcpy(sp->lp_row, logits, (size_t)vocab * sizeof *logits);
    int tok = draw_sampled(s, env, logits);
    kvp_hub_logprob *e = sp->lp + (size_t)g * (size_t)(1 + sp->lp_k);
    kvp_logprob top[KVP_LOGPROBS_MAX_TOP], own;
    int m = kvp_logprobs(sp->lp_row, vocab, tok < 0 || tok >= vocab ? 0 : tok, sp->lp_k, &own, top);
    int prev = s->n_tokens ? s->tokens[s->n_tokens - 1] : -1;
    for (int j = 0; j <= sp->lp_k; j++) {
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

/* Whether its next unit takes no rows: a job, or a turn's start (armed; run inline). */
static int no_rows(const kvp_session *s)
{
    return kvp_session_job_next(s);
}

/* Whether it is a turn whose next unit is a prefill chunk. */
static int prefilling(const kvp_session *s)
{
    return !no_rows(s) && s->turn.state == KVP_TURN_PREFILL;
}

static int min_int(int a, int b) { return a < b ? a : b; }

/* The rows a step gives prefill chunks at most: env->prefill_tokens (at least one
 * chunk, so a prompt always moves on), or no bound but the step's rows when 0. */
static int prefill_budget(const kvp_session_env *env)
{
    if (env->prefill_tokens <= 0)
        return 1 << 30;
    return env->prefill_tokens > env->chunk ? env->prefill_tokens : env->chunk;
}

/* Steps in a row a prompt may be passed over by the prefill slice before its chunk goes
 * first: a long prompt behind a stream of short ones still moves on at least once every
 * PASSED_MAX + 1 steps. */
#define PASSED_MAX 4

/* Whether prefilling turn a goes before b in a step's prefill slice: a prompt passed
 * over PASSED_MAX steps in a row first (the earlier request first among those), then
 * fewer tokens left to prefill, then the earlier request. */
static int admits_before(const kvp_session *a, const kvp_session *b)
{
    if (!prefilling(a) || !prefilling(b))
        return prefilling(a) > prefilling(b);
    int sa = a->turn.passed_over >= PASSED_MAX, sb = b->turn.passed_over >= PASSED_MAX;
    if (sa != sb)
        return sa;
    if (sa)
        return a->rq.spec.t_start < b->rq.spec.t_start;
    int la = a->n_tokens - a->n_cached, lb = b->n_tokens - b->n_cached;
    if (la != lb)
        return la < lb;
    return a->rq.spec.t_start < b->rq.spec.t_start;
}

/* Whether the rows s's cache holds are those a lone run of its tokens makes: nothing
 * evicted, shifted or slid out, no history dropped. */
static int clean_rows(const kvp_session *s)
{
    return s->policy && !s->hist_tokens && s->cache.n_seen == s->n_cached &&
           !s->cache.evicted_rows && !s->cache.shifts && !s->cache.window;
}

/* Whether s is a prompt that may take another turn's rows for the rest of its prefill:
 * clean rows, at least two tokens left, not a canary turn (which records every row's
 * hidden state). */
static int sharing_prompt(const kvp_session *s)
{
    return prefilling(s) && clean_rows(s) && !canary_of(s) && s->n_tokens > s->n_cached + 1;
}

/* Whether src's cached rows are those a lone prefill of their tokens makes: a turn of this
 * worker's step (not a job), nothing evicted, shifted or slid out, dst's conf, tenant and
 * row type, a policy that scores each row on its own (kvp_policy_shares_rows). */
static int rows_source(const kvp_session *src, const kvp_session *dst)
{
    return src != dst && (decoding(src) || prefilling(src)) && clean_rows(src) &&
           src->cache.kv_type == dst->cache.kv_type && src->pconf == dst->pconf &&
           !strcmp(src->tenant, dst->tenant) && kvp_policy_shares_rows(dst->policy);
}

/* How many of prompt dst's leading tokens it may hold from src, which holds its
 * tokens[0..n_src) in the cache (or will, after this step): the common prefix, short of
 * dst's last token (run again for its logits). When dst's prompt could face an eviction
 * during its prefill (longer than its budget), dst moves on by whole chunks only, so its
 * remaining chunks, and so its eviction points, are those of a lone run. */
static int rows_shareable(const kvp_session *dst, const kvp_session *src, int n_src,
                          const kvp_session_env *env)
{
    int n = kvp_token_lcp(dst->tokens, dst->n_tokens - 1, src->tokens, n_src);
    if (n > dst->n_cached && dst->rq.spec.budget > 0 && dst->n_tokens > dst->rq.spec.budget)
        n -= (n - dst->n_cached) % env->chunk;
    return n;
}

/* Prompts that share a prefix with another turn of the step: a prompt whose next
 * tokens another turn holds already (rows_source) takes those rows instead of
 * computing them again (shared, kvp_cache_fork_shared, when env->share_rows; copied
 * otherwise) with the source's policy state for them (kvp_policy_fork), and prefills only
 * the rest. Its rows are the bits its own prefill would have written (each row depends
 * on the tokens up to it alone, in any batch), so its reply is the one it gets unshared.
 * Out of memory it prefills them itself. */
static void share_prefixes(kvp_session **ss, int n, const kvp_session_env *env)
{
    for (int i = 0; i < n; i++) {
        kvp_session *dst = ss[i];
        if (!sharing_prompt(dst))
            continue;
        kvp_session *best = NULL;
        int len = dst->n_cached;
        for (int j = 0; j < n; j++) {
            kvp_session *src = ss[j];
            if (src->n_cached <= len || !rows_source(src, dst))
                continue;
            int m = rows_shareable(dst, src, src->n_cached, env);
            if (m > len) {
                len = m;
                best = src;
            }
        }
        if (!best)
            continue;
        kvp_cache c;
        int rc = env->share_rows ? kvp_cache_fork_shared(&c, &best->cache, len)
                                 : kvp_cache_fork(&c, &best->cache, len);
        if (rc)
            continue;
        if (kvp_policy_fork(dst->policy, best->policy, &c, len)) {
            kvp_cache_free(&c);
            continue;
        }
        kvp_cache_free(&dst->cache);
        dst->cache = c;
        dst->turn.stats.cached_tokens += len - dst->n_cached;
        dst->n_cached = len;
        dst->turn.stats.cached_from = env->share_rows ? KVP_REUSE_SHARED : KVP_REUSE_OTHER;
        turn_note_rows(dst);
    }
}

/* Whether prompt s waits a step instead of running its next chunk: a chunk the step
 * admitted already (fed[0..n_fed)) computes the same rows, which s then takes
 * (share_prefixes) rather than compute them again side by side. */
static int shares_later(const kvp_session *s, kvp_session *const *fed, int n_fed,
                        const kvp_session_env *env)
{
    if (!env->share_prompts || !sharing_prompt(s))
        return 0;
    int want = s->n_cached + min_int(env->chunk, s->n_tokens - 1 - s->n_cached);
    for (int k = 0; k < n_fed; k++) {
        const kvp_session *p = fed[k];
        int upto = p->n_cached + min_int(p->n_tokens - p->n_cached, env->chunk);
        if (rows_source(p, s) && rows_shareable(s, p, upto, env) >= want)
            return 1;
    }
    return 0;
}

/* A step's bookkeeping over its n queued sessions. b, e: the blocks of the forward pass
 * and their eviction bounds; who[j]: block j's index in order; order[k]: the queue index
 * of the k-th to take part, unit_more[k] its result; took[i]: queue entry i took part;
 * rank: the queue in the order the prefill slice admits it; sorted: the queue reordered. */
typedef struct step_work {
    kvp_batch_seq *b;
    const kvp_evict_cfg **e;
    int *who, *order, *unit_more, *rank;
    char *took;
    kvp_session **sorted;
    kvp_session **fed;       /* the prefilling turns admitted so far */
    char *waits;             /* waits[i]: queue entry i waits a step for shared rows */
} step_work;

static void work_free(step_work *w)
{
    free(w->b);
    free(w->e);
    free(w->who);
    free(w->order);
    free(w->unit_more);
    free(w->rank);
    free(w->took);
    free(w->sorted);
    free(w->fed);
    free(w->waits);
}

/* 0, or -1 when out of memory (nothing left allocated). */
static int work_alloc(step_work *w, int n)
{
    size_t m = (size_t)n;
    *w = (step_work){malloc(m * sizeof *w->b), malloc(m * sizeof *w->e),
                     malloc(m * sizeof *w->who), malloc(m * sizeof *w->order),
                     malloc(m * sizeof *w->unit_more), malloc(m * sizeof *w->rank),
                     calloc(m, 1), malloc(m * sizeof *w->sorted), malloc(m * sizeof *w->fed),
                     calloc(m, 1)};
    if (w->b && w->e && w->who && w->order && w->unit_more && w->rank && w->took &&
        w->sorted && w->fed && w->waits)
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
    int *who = w.who, *order = w.order, *unit_more = w.unit_more, *rank = w.rank;
    char *took = w.took;
    kvp_session **sorted = w.sorted;
    /* Who takes part, in three passes:
     * 0. every decoding turn (one row each), so a prompt never holds back the next token
     *    of a reply;
     * 1. every turn whose next unit takes no rows (its start, run inline here when the
     *    caller queued one; the scheduler runs those as jobs instead);
     * 2. the prefill chunks, within the step's prefill slice (env->prefill_tokens, and
     *    the rows the decodes left), in admission order (admits_before): a prompt the
     *    slice has passed over for PASSED_MAX steps in a row first, so none waits
     *    forever; then the fewest tokens left to prefill first (a short prompt, a
     *    returning session's few new tokens on its cached transcript), the earlier
     *    request among equals. A chunk that does not fit is skipped, not split. A
     *    prompt's first token is sampled in the step that runs its last chunk, so a
     *    short prompt admitted behind a long one answers while the long one still
     *    prefills, and under a burst of equal prompts first tokens come in arrival
     *    order. With env->share_prompts, a prompt first takes the rows of its next
     *    tokens that another turn of the step holds (share_prefixes), and one whose
     *    next chunk a chunk admitted before it computes waits a step to take those rows
     *    (shares_later). */
    if (env->share_prompts)
        share_prefixes(ss, n, env);
    for (int i = 0; i < n; i++)
        rank[i] = i;
    for (int i = 1; i < n; i++) {   /* stable insertion sort by admission order */
        int v = rank[i], k = i;
        for (; k > 0 && admits_before(ss[v], ss[rank[k - 1]]); k--)
            rank[k] = rank[k - 1];
        rank[k] = v;
    }
    int room = rs->max_tokens, taken = 0, nb = 0, slice = 0, n_fed = 0;
    int budget = prefill_budget(env);
    for (int pass = 0; pass < 3; pass++)
        for (int q = 0; q < n && room > 0; q++) {
            int i = pass < 2 ? q : rank[q];
            kvp_session *s = ss[i];
            if (took[i] || (pass == 0 && !decoding(s)) || (pass == 1 && !no_rows(s)) ||
                (pass == 2 && !prefilling(s)))
                continue;
            int r, fit = pass == 2 ? min_int(room, budget - slice) : room;
            if (pass == 1) {
                r = turn_run_job(s, env, sink);   /* the scheduler runs these as jobs instead */
            } else if (pass == 2 && shares_later(s, w.fed, n_fed, env)) {
                w.waits[i] = 1;
                continue;
            } else if ((r = plan_unit(s, env, sink, fit, &b[nb])) == NO_ROOM) {
                continue;
            } else if (r == ENDED) {
                r = 1;   /* no block: its end is its next unit */
            } else if (r) {
                e[nb] = &s->turn.evict;
                room -= b[nb].n;
                slice += pass == 2 ? b[nb].n : 0;
                if (pass == 2)
                    w.fed[n_fed++] = s;
                who[nb++] = taken;
            }
            took[i] = 1;
            unit_more[taken] = r;
            order[taken++] = i;
        }
    /* The prompts this slice passed over while it ran others' chunks (a step whose
     * decodes left no room for any chunk passed over none; one that waits for rows
     * another computes is not passed over). */
    for (int i = 0; i < n; i++)
        if (took[i])
            ss[i]->turn.passed_over = 0;
        else if (prefilling(ss[i]) && slice > 0 && !w.waits[i])
            ss[i]->turn.passed_over++;
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
