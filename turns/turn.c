/* The turn state machine on a worker: a turn's start as a unit of its own (the lease,
 * the snapshot restored, the policy made, a rewind applied, the transcript rendered),
 * each sampled token taken in (stop conditions, log-probabilities), and its end (the
 * snapshot written, then done or error); snapshot loads and saves as jobs. The step
 * planner (turns/step_plan.c) runs the model for it. */
#include "turns/turn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "model/tokenizer.h"
#include "policy/policy.h"
#include "observe/canary.h"
#include "turns/persist.h"
#include "turns/rewind.h"
#include "turns/session_impl.h"
#include "turns/turn_reply.h"
#include "store/store.h"
#include "base/log.h"

void turn_note_rows(kvp_session *s)
{
    int r = kvp_cache_max_rows(&s->cache);
    if (r > s->turn.stats.cache_rows_max)
        s->turn.stats.cache_rows_max = r;
    size_t b = kvp_cache_bytes(&s->cache);
    if (b > s->turn.stats.cache_bytes_max)
        s->turn.stats.cache_bytes_max = b;
}

kvp_evict_cfg turn_evict_cfg(const kvp_session *s, const kvp_session_env *env)
{
    kvp_evict_cfg e = {s->policy, s->rq.spec.budget, env->chunk, env->budget_mode};
    return e;
}

/* The end of every turn, done or failed: the snapshot follows memory. With leases, the
 * write needs the turn's lease still live in the store (kvp_store_put_leased). */
static void save(kvp_session *s, const kvp_session_env *env)
{
    if (!env->store || s->ephemeral)   /* keeps nothing (session.h) */
        return;
    s->save_leased = 1;
    int rc = kvp_session_save(s, env, s->res.save_err, sizeof s->res.save_err);
    s->save_leased = 0;
    s->res.save_rc = rc < 0 ? rc : 1;
    s->saved = rc == 0;
    s->has_snapshot |= rc == 0;
}

/* Whether this node's lease on the session surely lasts beyond the margin a turn leaves
 * unused (always, without leases, and for an ephemeral session, which has none). */
static int lease_lasts(const kvp_session *s, const kvp_session_env *env)
{
    return !env->store || s->ephemeral ||
           kvp_store_lease_left_ms(env->store, s->id) > kvp_store_lease_margin_ms(env->store);
}

#define CUT_MSG "this node's lease ran out before the turn ended (the store did not " \
                "answer in time); the turn is cut, not kept: the session is at its last " \
                "stored turn, send it again"

/* The turn ran past this node's lease: another node may serve the session now, so the
 * turn produces nothing more and is not written. What memory holds is dropped (the
 * turn's tokens, its cache rows, its message, or all of the turn when it had finished):
 * the session goes back to its last stored turn, read from the store at its next job,
 * as every other node would read it (the hub parks it). A session never stored goes back
 * to empty. */
static void cut_memory(kvp_session *s)
{
    kvp_turn *t = &s->turn;
    t->cut = 1;
    t->end_code = -ENOLCK;
    snprintf(t->end_msg, sizeof t->end_msg, "lease: %s", CUT_MSG);
    kvp_session_forget(s);
    s->jinja_rendered = 0;
    s->turns_done = s->has_snapshot ? t->turns_before : 0;
    s->saved = s->has_snapshot;
}

/* A turn's last unit: its snapshot written (with a store), then its final event, the
 * worker's last touch of the session. A turn whose lease runs out before its write, or
 * whose write finds the lease gone, is cut instead (cut_memory): its done never goes
 * out. A write that lands is the turn's commit under its lease: done follows it.
 * Returns 0 (the turn ended). */
static int turn_report(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink)
{
    const kvp_turn_spec *sp = &s->rq.spec;
    kvp_turn *t = &s->turn;
    s->io_next = 0;
    t->end = 0;
    int leases = kvp_store_has_leases(env->store) && !s->ephemeral;
    if (leases && !t->cut && t->end_code == 0 && !lease_lasts(s, env))
        cut_memory(s);
    if (!t->cut) {
        save(s, env);
        if (leases && t->end_code == 0 && s->res.save_rc < 0 &&
            (s->res.save_rc == -ESTALE || !lease_lasts(s, env))) {
            kvpd_log("warning", "session %.8s: %s", s->id, s->res.save_err);
            s->res.save_rc = 0;
            cut_memory(s);
        }
    }
    if (t->end_code < 0)
        sink->error(sink->ctx, s, t->end_code, t->end_msg);
    else if (sp->prefill && t->reply_len >= sp->prefix_len)   /* the new text only */
        sink->done(sink->ctx, s, &t->stats, t->reply + sp->prefix_len, t->reply_len - sp->prefix_len);
    else
        sink->done(sink->ctx, s, &t->stats, t->reply ? t->reply : "", t->reply_len);
    return 0;
}

/* The end of every turn, done (code 0) or failed (code < 0, msg): the final event is
 * sent only once the snapshot is written, and that write waits on the disk or the
 * network, so with a store the turn leaves the batched step here and its end is a unit
 * of its own (turn_report, run as a job: the step never waits on the store). Returns as
 * kvp_turn_step. */
static int end_turn(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                    int code, const char *msg)
{
    kvp_turn *t = &s->turn;
    t->end = 1;
    t->end_code = code;
    snprintf(t->end_msg, sizeof t->end_msg, "%s", msg ? msg : "");
    if (!env->store)
        return turn_report(s, env, sink);
    s->io_next = 1;
    return 1;
}

/* Ends the turn: turn-boundary eviction, transcript, stats. */
int turn_finish(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                const char *stop)
{
    const kvp_turn_spec *sp = &s->rq.spec;
    kvp_turn *t = &s->turn;
    char tail[4];
    size_t n = kvp_utf8_flush(&t->utf8, tail);
    if (sp->lp_on && !t->stopped)   /* the reply's end ends its last tokens */
        for (int i = t->stats.generated_tokens - 1; i >= 0 && t->tok_end[i] == SIZE_MAX; i--)
            t->tok_end[i] = t->reply_len + n;
    int rc = n ? turn_reply_text(s, sink, tail, n) : 0;
    if (sp->lp_on)   /* the tokens whose text is returned: up to a stop string's cut */
        s->res.lp_n = turn_lp_whole(t, t->stopped ? t->stop_at : SIZE_MAX - 1);
    if (!rc && t->stopped) {
        rc = turn_cut_at_stop(s, env);
        stop = "stop";
        t->reply_len = t->stop_at;
        if (t->reply)
            t->reply[t->reply_len] = '\0';
    }
    turn_emit(s, sink, t->reply_len);   /* what was held back for the stop strings */
    kvp_evict_cfg e = turn_evict_cfg(s, env);
    int dropped = kvp_gen_compress(&s->cache, &e);
    if (dropped < 0 && !rc)
        rc = dropped;
    if (!rc)
        rc = kvp_session_push_message(s, 0, t->reply ? t->reply : "", t->reply_len, t->reply_from);
    if (rc < 0)
        return end_turn(s, env, sink, rc, "could not finish the turn");
    kvp_session_bound_history(s, sp->max_history);
    double end = kvp_now();
    kvp_turn_stats *st = &t->stats;
    st->transcript_tokens = (int)(s->hist_tokens + s->n_tokens);
    st->cache_rows = kvp_cache_max_rows(&s->cache);
    if (st->cache_rows > st->cache_rows_max)
        st->cache_rows_max = st->cache_rows;
    st->cache_bytes = kvp_cache_bytes(&s->cache);
    st->evicted_total = s->cache.evicted_rows;
    st->evicted_rows = s->cache.evicted_rows - t->evicted_at_start;
    st->duration_ms = (end - sp->t_start) * 1e3;
    st->ttft_ms = t->t_first > 0 ? (t->t_first - sp->t_start) * 1e3 : st->duration_ms;
    st->tokens_per_s = end > sp->t_start ? st->generated_tokens / (end - sp->t_start) : 0;
    st->stop = stop;
    st->stop_word = t->stopped ? t->stop_word : -1;
    if (st->cache_bytes > st->cache_bytes_max)
        st->cache_bytes_max = st->cache_bytes;
    s->turns_done++;
    return end_turn(s, env, sink, 0, NULL);
}

/* Ends a failed turn so the session stays usable: the cache may be half-updated, so it
 * is dropped and the next turn re-prefills the transcript. With `undo` (the turn failed
 * before its reply began) the transcript goes back to where this turn found it: its
 * tokens, and its user message if it was recorded; never anything of earlier turns. */
int turn_fail(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
              int undo, int rc, const char *what, const char *detail)
{
    kvp_turn *t = &s->turn;
    kvp_cache_reset(&s->cache);
    s->n_cached = 0;
    if (undo) {
        s->n_tokens = t->undo_tokens;
        if (t->recorded)
            free(s->msgs[--s->n_msgs].text);
    }
    kvp_session_restart_tokens(s);
    char msg[160];
    snprintf(msg, sizeof msg, "%s: %s", what, detail ? detail :
             rc == -E2BIG ? "the conversation outgrew the model's context" : strerror(-rc));
    return end_turn(s, env, sink, rc, msg);
}

/* A sampled token: stop, or stream it and keep going. Returns as kvp_turn_step. */
int turn_take_token(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                    int tok)
{
    const kvp_turn_spec *sp = &s->rq.spec;
    kvp_turn *t = &s->turn;
    /* Past the lease this node surely holds (less the margin its output needs to reach
     * the client), another node may serve the session: the turn stops here, before any
     * more of its text goes out, and is not kept (the client sends it again). */
    if (!lease_lasts(s, env)) {   /* (so with a store: the end is a job of its own) */
        (void)sink;
        cut_memory(s);
        t->end = 1;
        s->io_next = 1;
        return 1;
    }
    if (t->stopped)   /* the reply's prefix ended it: the sampled token is not kept */
        return turn_finish(s, env, sink, "stop");
    if (kvp_template_is_stop(kvp_session_tpl(s, env), tok)) {
        /* A chat format's end marker belongs to the transcript (fed next turn). */
        if (kvp_template_keeps_stop(kvp_session_tpl(s, env)) && kvp_session_push_token(s, tok) < 0)
            return turn_fail(s, env, sink, 0, -ENOMEM, "transcript", NULL);
        s->reply_open = 0;
        /* a constrained reply the length budget shaped is still whole: it ends as any
         * reply the model ended, its stats saying the limit shaped it */
        t->stats.shaped = t->gshaped;
        return turn_finish(s, env, sink, "eos");
    }
    int prev = s->n_tokens ? s->tokens[s->n_tokens - 1] : -1;
    if (kvp_session_push_token(s, tok) < 0)
        return turn_fail(s, env, sink, 0, -ENOMEM, "transcript", NULL);
    t->stats.generated_tokens++;
    if (t->t_first == 0)
        t->t_first = kvp_now();
    size_t plen = 0, upto = t->sent;
    const char *piece = kvp_tokenizer_piece(&env->model->tok, prev, tok, &plen);
    if (piece && plen) {
        char buf[3 * 64 + 4];
        size_t off = 0;
        while (off < plen) {   /* pieces are short; chunk anyway to bound buf */
            size_t n = plen - off > 64 ? 64 : plen - off;
            size_t o = kvp_utf8_feed(&t->utf8, piece + off, n, buf);
            int err = 0;
            if (o)
                upto = turn_reply_keep(s, buf, o, &err);
            if (err)
                return turn_fail(s, env, sink, 0, -ENOMEM, "reply", NULL);
            off += n;
        }
    }
    /* the token's end first, so the text it sends carries its logprobs */
    if ((sp->n_stop || sp->lp_on) && turn_note_token_end(t) < 0)
        return turn_fail(s, env, sink, 0, -ENOMEM, "reply", NULL);
    turn_emit(s, sink, upto);
    t->stats.shaped = t->gshaped;   /* a forced call's end string may follow a shaped call */
    if (t->stopped)
        return turn_finish(s, env, sink, "stop");
    if (t->stats.generated_tokens >= sp->max_tokens) {
        /* the length budget closes a constrained reply by its last token: a whole
         * document the limit shaped ends as one the model ended; anything else was cut */
        if (kvp_turn_doc_whole(t)) {
            t->stats.shaped = 1;
            return turn_finish(s, env, sink, "eos");
        }
        return turn_finish(s, env, sink, "length");
    }
    /* Without eviction the reply also ends once it and the prompt fill the context: the
     * token just sampled takes its last position, so no further one could be fed. */
    kvp_evict_cfg e = turn_evict_cfg(s, env);
    if (kvp_gen_room(env->model, &s->cache, &e) <= 1)
        return turn_finish(s, env, sink, "length");
    t->next_token = tok;
    t->state = KVP_TURN_DECODE;
    return 1;
}

/* Before a load or a turn: this node takes the session's lease (store/store.h). 0 to
 * go on; -EADDRINUSE when another node serves it (s->res.elsewhere_ms: for how long
 * yet). *restore: the session must be read from the store first (the loop's
 * need_restore, copied by the caller); set here too when the store's snapshot is another
 * version than the one memory descends from (another node served turns meanwhile):
 * memory is dropped for the snapshot. When the store cannot be reached, a session in
 * memory goes on only while this node's lease surely lasts (its snapshot write will fail
 * and say so): past that another node may hold it. One that must be read first cannot. */
static int take_lease(kvp_session *s, const kvp_session_env *env, int *restore, char *err,
                      size_t errlen)
{
    /* an ephemeral session is served here only and never stored: no other node can
     * take it, so it needs no lease (and leaves no key in the store) */
    if (!env->store || s->ephemeral)
        return 0;
    int stored, left;
    uint64_t version;
    char holder[KVP_STORE_NODE_MAX + 1];
    int rc = kvp_store_lease_take(env->store, s->id, &stored, &version, &left, holder,
                                  sizeof holder, err, errlen);
    if (rc < 0) {   /* in memory and still ours: served from there */
        if (*restore || lease_lasts(s, env))
            return *restore ? rc : 0;
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, "; this node's lease on session %.8s has run out, "
                 "so it is not served until the store answers (try again)", s->id);
        return rc;
    }
    if (rc == KVP_LEASE_OTHER) {
        s->res.elsewhere_ms = left > 0 ? left : 1;
        snprintf(err, errlen, "session %s is being served by another node (%s); retry in %d ms",
                 s->id, holder, s->res.elsewhere_ms);
        return -EADDRINUSE;
    }
    if (!*restore && kvp_store_has_leases(env->store) && version &&
        version != s->store_version) {
        kvp_session_forget(s);
        *restore = 1;
        kvp_store_note_takeover(env->store);
    }
    return 0;
}

/* The session's policy, on the conf's shared weights (no file read); a conf without them
 * (made by hand) has its file read here, on this worker. 0 or a negative code with a
 * message (s->policy then NULL). */
static int make_policy(kvp_session *s, const kvp_session_env *env, char *err, size_t errlen)
{
    int rc = s->pconf->weights
                 ? kvp_policy_create_shared(&s->policy, s->pconf->weights, &env->model->cfg,
                                            s->seed, err, errlen)
                 : kvp_policy_create(&s->policy, s->pconf->name,
                                     s->pconf->file[0] ? s->pconf->file : NULL,
                                     &env->model->cfg, s->seed, err, errlen);
    if (rc < 0)
        s->policy = NULL;
    return rc;
}

/* A turn's first unit, run as a job before the turn joins a batched step: everything
 * here may wait on the disk or the network, or take a while without the model (the
 * reply's grammar matcher, the lease, the snapshot of an unparked session, its policy, a
 * seeded transcript tokenized, the user message into the transcript), so none of it holds back the other turns.
 * Returns as kvp_turn_step. */
static int turn_start(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink)
{
    const kvp_turn_spec *sp = &s->rq.spec;
    kvp_turn *t = &s->turn;
    kvp_job_result_reset(&s->res);   /* the job's own, from its start */
    kvp_turn_reset(t);               /* the last turn's buffers go */
    t->serial = sp->serial;          /* started: no longer armed */
    if (sp->lp_on) {   /* the tokens' ends in the spec's buffer, with room for each */
        t->tok_end = sp->lp_ends;
        t->tok_end_cap = sp->lp_cap;
        t->tok_end_lent = 1;
    }
    s->io_next = 0;
    if (sp->gsrc) {
        /* the reply's matcher, before anything of the session changes: a grammar the
         * reply cannot follow refuses the request as it stands */
        char err[256];
        int rc = kvp_session_start_grammar(s, env, err, sizeof err);
        if (rc < 0) {
            s->res.refused = rc == -EINVAL || rc == -E2BIG;
            sink->error(sink->ctx, s, rc, err);
            return 0;
        }
    }
    /* unparked (the loop's need_restore, which only the loop writes): the snapshot comes
     * back before the turn's first unit; the job says whether it did (res.restored,
     * res.unrestored) */
    int restore = s->need_restore;
    {
        char err[256];
        int rc = take_lease(s, env, &restore, err, sizeof err);
        s->res.unrestored = restore;   /* until the snapshot is read back */
        if (rc < 0) {
            sink->error(sink->ctx, s, rc, err);
            return 0;
        }
    }
    if (restore) {
        char err[256];
        int rc = kvp_session_restore(s, env, s->reserve, err, sizeof err);
        if (rc < 0) {
            s->res.lost = rc == -ENOENT || rc == -EBADMSG;
            sink->error(sink->ctx, s, rc, err);
            return 0;
        }
        s->res.unrestored = 0;
    }
    t->undo_tokens = s->n_tokens;   /* where a failure before the reply goes back to */
    t->turns_before = s->turns_done;
    if (!s->policy) {
        char err[160];
        int rc = make_policy(s, env, err, sizeof err);
        if (rc < 0)
            return turn_fail(s, env, sink, 1, rc, "policy", err);
    }

    /* A request that continues this session from an earlier point (turns/rewind.h):
     * its history replaces the transcript, the cache is cut back below. */
    int *rw_old = NULL, rw_n = 0;
    {
        s->res.took_rewind = s->rq.rewind_set;   /* applied now, whatever comes of it */
        int rc = kvp_session_rewind_apply(s, env, &rw_old, &rw_n);
        t->undo_tokens = s->n_tokens;
        if (rc < 0)
            return turn_fail(s, env, sink, 1, rc, "transcript", NULL);
    }
    /* A session seeded with a conversation (kvp_session_seed): its messages first. */
    if (s->n_tokens == 0 && s->n_msgs > 0) {
        int rc = kvp_session_retokenize(s, env);
        if (rc < 0)
            return turn_fail(s, env, sink, 1, rc, "tokenize", NULL);
        s->reply_open = 1;
    }
    /* A cancel that came before any work still records the message: the next turn
     * prefills it (prefill checks the flag first). */
    int *ids = NULL;
    int n = s->raw_ids ? 0 : kvp_session_jinja_turn(s, env, &ids);
    int rendered = sp->prefill && n >= 0 && !s->raw_ids;   /* the template wrote the prefill's tokens */
    if (s->raw_ids) {   /* the prompt's own tokens, taken as they are */
        n = s->n_raw_ids;
        ids = malloc((size_t)n * sizeof *ids);
        if (ids)
            memcpy(ids, s->raw_ids, (size_t)n * sizeof *ids);
        else
            n = -ENOMEM;
    } else if (n == -ENOENT && s->rq.turn_ids) {
        /* the family's rendering of this message, made by the request's render job */
        s->jinja_rendered = 0;
        ids = s->rq.turn_ids;
        n = s->rq.n_turn_ids;
        s->res.took_turn_ids = 1;   /* freed here with ids, not by the loop's release */
    } else if (n == -ENOENT) {
        s->jinja_rendered = 0;
        n = kvp_template_turn(kvp_session_tpl(s, env), s->system, s->system_len, s->n_tokens == 0,
                              s->reply_open, sp->text, sp->text_len, &ids);
    }
    /* (pre-rendered ids a Jinja rendering or raw ids replaced go with the request's release) */
    int first = s->n_tokens;
    if (n < 0) {
        free(rw_old);
        return turn_fail(s, env, sink, 1, n, "tokenize", NULL);
    }
    for (int i = 0; i < n; i++)
        if (kvp_session_push_token(s, ids[i]) < 0) {
            free(ids);
            free(rw_old);
            return turn_fail(s, env, sink, 1, -ENOMEM, "transcript", NULL);
        }
    free(ids);
    if (kvp_session_push_message(s, sp->role ? sp->role : 1, sp->text, sp->text_len, first) < 0) {
        free(rw_old);
        return turn_fail(s, env, sink, 1, -ENOMEM, "transcript", NULL);
    }
    t->recorded = 1;
    kvp_session_rewind_cut(s, rw_old, rw_n);
    int reply_at = s->n_tokens;
    if (rendered && t->prefill_at >= first && t->prefill_at <= s->n_tokens)
        reply_at = t->prefill_at;
    if (sp->prefix_len && turn_reply_prefix(s, env, sink, rendered) < 0)
        return turn_fail(s, env, sink, 1, -ENOMEM, "transcript", NULL);
    t->gen_start = s->n_tokens;
    t->stats.prompt_tokens = s->n_tokens - s->n_cached;
    if (sp->max_prompt > 0 && t->stats.prompt_tokens > sp->max_prompt) {
        /* refused before any prefill: its cost grows with the prompt */
        char why[96];
        snprintf(why, sizeof why, "%d tokens to prefill, over the %d of max_prompt_tokens",
                 t->stats.prompt_tokens, sp->max_prompt);
        return turn_fail(s, env, sink, 1, -E2BIG, "prompt", why);
    }
    if (!env->reuse_cache) {
        /* Benchmark baseline: forget the cache, run the whole (kept) transcript again. */
        kvp_cache_reset(&s->cache);
        s->n_cached = 0;
        if (s->hist_tokens > 0) {
            kvp_session_restart_tokens(s);
            int rc = kvp_session_retokenize(s, env);
            t->undo_tokens = s->msg_tok[s->n_msgs - 1];   /* in the new rendering */
            if (rc < 0)
                return turn_fail(s, env, sink, 1, rc, "tokenize", NULL);
        }
    }
    t->reply_from = reply_at;
    t->evicted_at_start = s->cache.evicted_rows;
    /* of the whole conversation: the cache holds the dropped history's tokens too */
    t->stats.context_tokens = (int)(s->hist_tokens + s->n_tokens);
    t->stats.cached_tokens = (int)(s->hist_tokens + s->n_cached);
    /* a fork's rows came from another session (until this turn, the only rows it has) */
    t->stats.cached_from = s->n_cached > 0 ? s->rq.reuse_from : KVP_REUSE_OWN;
    s->sampler.temperature = sp->temperature;
    s->sampler.top_p = sp->top_p >= 0 ? sp->top_p : env->top_p;
    if (sp->has_seed)
        kvp_sampler_seed(&s->sampler, sp->seed);
    if (kvp_sampler_set_opts(&s->sampler, &sp->sampling) < 0)   /* checked by the hub */
        return turn_fail(s, env, sink, 1, -ENOMEM, "sampler", NULL);
    s->reply_open = 1;    /* the assistant's reply has begun */
    t->state = KVP_TURN_PREFILL;
    return 1;
}

/* A unit run alone, outside any forward pass: a snapshot load (for a hello) or save (at
 * shutdown), or a new session's request rendered (RENDER), then the job event; or a
 * turn's start (turn_start) or end (turn_report).
 * Returns as kvp_turn_step. */
int turn_run_job(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink)
{
    if (s->state == KVP_SESSION_TURN) {
        int more = 1;
        if (kvp_turn_armed(s))
            more = turn_start(s, env, sink);
        if (more && s->turn.end)   /* it failed there: its end follows in the same job */
            more = turn_report(s, env, sink);
        return more;
    }
    char err[256] = "";
    int rc;
    kvp_job_result_reset(&s->res);   /* a LOAD, SAVE or RENDER job's, from its start */
    if (s->state == KVP_SESSION_RENDER) {
        /* a new session's request (its messages seeded), rendered as its turns would
         * render it, for the loop's fork-source search and then the turn itself */
        rc = kvp_session_retokenize(s, env);
        if (rc < 0)
            snprintf(err, sizeof err, "rendering the request: %s", strerror(-rc));
        sink->job(sink->ctx, s, rc, err);
        return 0;
    }
    if (s->state == KVP_SESSION_LOAD) {
        /* In memory already (a shared store): only the lease, and the snapshot when
         * another node served the session meanwhile. */
        int restore = s->need_restore;
        rc = take_lease(s, env, &restore, err, sizeof err);
        if (rc == 0 && restore)
            rc = kvp_session_restore(s, env, s->reserve, err, sizeof err);
        s->res.unrestored = restore && rc < 0;
        s->res.lost = rc == -ENOENT || rc == -EBADMSG;
        /* its policy too, so that a loaded session can be forked before it takes a turn
         * (one that cannot be made now is tried again by the turn) */
        char perr[160];
        if (rc == 0 && !s->policy && s->n_cached > 0)
            (void)make_policy(s, env, perr, sizeof perr);
    } else {
        rc = kvp_session_save(s, env, err, sizeof err);
        s->saved = rc == 0;
        s->has_snapshot |= rc == 0;
    }
    sink->job(sink->ctx, s, rc, err);
    return 0;
}
