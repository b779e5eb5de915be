/* A turn's reply text on the worker: bytes appended as tokens are sampled, held back
 * while they may be the start of a stop string, given to the sink once whole UTF-8 and
 * clear of every stop string, and cut at the first stop string found (the transcript's
 * tokens with it). Per reply token, tok_end records the reply's length after it. */
#include "turns/turn_reply.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"
#include "turns/session_impl.h"

static int reply_append(kvp_turn *t, const char *p, size_t n)
{
    if (t->reply_len + n + 1 > t->reply_cap) {
        size_t cap = t->reply_cap ? t->reply_cap : 256;
        while (cap < t->reply_len + n + 1)
            cap *= 2;
        char *r = realloc(t->reply, cap);
        if (!r)
            return -ENOMEM;
        t->reply = r;
        t->reply_cap = cap;
    }
    memcpy(t->reply + t->reply_len, p, n);
    t->reply_len += n;
    t->reply[t->reply_len] = '\0';
    return 0;
}

/* With logprobs: how many of the reply's tokens have all their text in reply[0..upto)
 * (a token that ends inside a character is whole once a later token ends it). */
int turn_lp_whole(const kvp_turn *t, size_t upto)
{
    int n = t->lp_sent;
    for (int i = t->lp_sent; i < t->stats.generated_tokens; i++) {
        if (t->tok_end[i] == SIZE_MAX)
            continue;
        if (t->tok_end[i] > upto)
            break;
        n = i + 1;
    }
    return n;
}

/* Gives the sink the reply up to `upto` (what it has not had yet), with the logprobs of
 * the tokens that text completes (lp_from..lp_to, read by the sink). */
void turn_emit(kvp_session *s, const kvp_turn_sink *sink, size_t upto)
{
    kvp_turn *t = &s->turn;
    if (upto > t->sent) {
        t->lp_from = t->lp_to = t->lp_sent;
        if (s->rq.spec.lp_on)
            t->lp_to = t->lp_sent = turn_lp_whole(t, upto);
        sink->token(sink->ctx, s, t->reply + t->sent, upto - t->sent);
        t->lp_from = t->lp_to = t->lp_sent;
        t->sent = upto;
    }
}

/* Reply text (valid UTF-8): kept and looked through for the turn's stop strings; returns
 * how much of the reply may go to the sink: all but what could still begin one (held
 * back until it cannot, or the turn ends). After a stop string nothing more is kept.
 * *err: 0 or -ENOMEM. */
size_t turn_reply_keep(kvp_session *s, const char *p, size_t n, int *err)
{
    const kvp_turn_spec *sp = &s->rq.spec;
    kvp_turn *t = &s->turn;
    *err = 0;
    if (t->stopped)
        return t->sent;
    size_t from = t->reply_len;
    if (reply_append(t, p, n) < 0) {
        *err = -ENOMEM;
        return t->sent;
    }
    size_t upto = t->reply_len;
    if (sp->n_stop) {
        /* only where a stop string could end in the new text */
        size_t start = from > sp->stop_hold ? from - sp->stop_hold : 0;
        if (sp->prefill && start < sp->prefix_len)
            start = sp->prefix_len;   /* the client's prefill is not the reply's text */
        for (int i = 0; i < sp->n_stop; i++) {
            const char *hit = memmem(t->reply + start, t->reply_len - start, sp->stop[i],
                                     sp->stop_len[i]);
            size_t end = hit ? (size_t)(hit - t->reply) + (sp->stop_keep[i] ? sp->stop_len[i] : 0) : 0;
            if (hit && (!t->stopped || end < t->stop_at)) {
                t->stopped = 1;
                t->stop_at = end;
                t->stop_word = i;
            }
        }
        upto = t->stopped ? t->stop_at : t->reply_len > sp->stop_hold ? t->reply_len - sp->stop_hold : 0;
        while (upto > t->sent && upto < t->reply_len &&
               ((unsigned char)t->reply[upto] & 0xC0) == 0x80)
            upto--;   /* whole characters only */
    }
    return upto;
}

/* reply_keep, then the sink gets what may go out. */
int turn_reply_text(kvp_session *s, const kvp_turn_sink *sink, const char *p, size_t n)
{
    int err;
    size_t upto = turn_reply_keep(s, p, n, &err);
    if (err)
        return err;
    turn_emit(s, sink, upto);
    return 0;
}

/* Appends ids[0..n) (an encoder's result: n < 0 is its error) to the session's tokens
 * and frees ids. 0 or a negative errno. */
static int push_tokens(kvp_session *s, int *ids, int n)
{
    int rc = n < 0 ? n : 0;
    for (int i = 0; i < n && !rc; i++)
        rc = kvp_session_push_token(s, ids[i]);
    free(ids);
    return rc;
}

/* The reply's opening: its tokens go into the transcript to be prefilled with the prompt
 * (unless the template rendered them: rendered), its text starts the reply. kvpd's own
 * (a forced tool call) is encoded as the template's text and looked through for the stop
 * strings, so a whole forced call may end the turn at once; the client's (an assistant
 * prefill) is reply text, and neither sent back nor looked through: the stop strings
 * apply to the new text. */
int turn_reply_prefix(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                      int rendered)
{
    const kvp_turn_spec *sp = &s->rq.spec;
    kvp_turn *t = &s->turn;
    const kvp_template *tpl = kvp_session_tpl(s, env);
    if (!rendered) {
        int *ids = NULL;
        int n = sp->prefill ? kvp_template_reply(tpl, sp->prefix, sp->prefix_len, &ids)
                            : kvp_template_encode_trusted(tpl, sp->prefix, sp->prefix_len, &ids);
        int rc = push_tokens(s, ids, n);
        if (rc)
            return rc;
    }
    if (!sp->prefill)
        return turn_reply_text(s, sink, sp->prefix, sp->prefix_len);
    if (reply_append(t, sp->prefix, sp->prefix_len) < 0)
        return -ENOMEM;
    t->sent = sp->prefix_len;
    return 0;
}

/* With stop strings: where the reply stood after its newest token. */
int turn_note_token_end(kvp_turn *t)
{
    int g = t->stats.generated_tokens;
    if (g > t->tok_end_cap) {
        int cap = t->tok_end_cap ? 2 * t->tok_end_cap : 64;
        /* a lent buffer (the spec's) is the loop's to free: the ends move to one of the
         * turn's own */
        size_t *v = t->tok_end_lent ? malloc((size_t)cap * sizeof *v)
                                    : realloc(t->tok_end, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        if (t->tok_end_lent && t->tok_end_cap)
            memcpy(v, t->tok_end, (size_t)t->tok_end_cap * sizeof *v);
        t->tok_end = v;
        t->tok_end_cap = cap;
        t->tok_end_lent = 0;
    }
    t->tok_end[g - 1] = t->utf8.n ? SIZE_MAX : t->reply_len;
    return 0;
}

/* A stop string ended the reply at stop_at: the transcript ends there too — the stop
 * text and what followed leave the tokens and the cache — so the client's next request,
 * which sends the reply back without the stop text, continues this session. The reply's
 * tokens stay up to the last one that ends at or before the cut; the text between it and
 * the cut is tokenized again (not yet run: the next turn prefills it). */
int turn_cut_at_stop(kvp_session *s, const kvp_session_env *env)
{
    kvp_turn *t = &s->turn;
    int keep = 0;
    size_t at = s->rq.spec.prefix_len;   /* the prefix's tokens stand before gen_start */
    for (int i = t->stats.generated_tokens - 1; i >= 0; i--)
        if (t->tok_end[i] <= t->stop_at) {
            keep = i + 1;
            at = t->tok_end[i];
            break;
        }
    int end = t->gen_start + keep;
    if (s->n_cached > end) {
        kvp_cache_drop_newest(&s->cache, s->n_cached - end);
        s->n_cached = end;
    }
    s->n_tokens = end;
    int *ids = NULL;
    int n = kvp_template_reply(kvp_session_tpl(s, env), t->reply + at, t->stop_at - at, &ids);
    return push_tokens(s, ids, n);
}
