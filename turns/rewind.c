/* Continuing a session from an earlier point (turns/rewind.h). */
#include "turns/rewind.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"
#include "model/model.h"
#include "turns/persist.h"

static void free_msgs(kvp_message *m, int n)
{
    for (int i = 0; i < n; i++)
        free(m[i].text);
    free(m);
}

int kvp_session_rewind(kvp_session *s, const kvp_message *msgs, int n)
{
    kvp_session_rewind_clear(s);
    kvp_message *m = n > 0 ? calloc((size_t)n, sizeof *m) : NULL;
    if (n > 0 && !m)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        m[i].user = msgs[i].user;
        m[i].len = msgs[i].len;
        if (!(m[i].text = malloc(msgs[i].len + 1))) {
            free_msgs(m, i);
            return -ENOMEM;
        }
        memcpy(m[i].text, msgs[i].text, msgs[i].len);
        m[i].text[msgs[i].len] = '\0';
    }
    s->rq.rewind_msgs = m;
    s->rq.rewind_n = n;
    s->rq.rewind_set = 1;
    return 0;
}

void kvp_session_rewind_rendered(kvp_session *s, int *tokens, int n_tokens, int *msg_tok)
{
    free(s->rq.rewind_tokens);
    free(s->rq.rewind_msg_tok);
    s->rq.rewind_tokens = tokens;
    s->rq.rewind_n_tokens = n_tokens;
    s->rq.rewind_msg_tok = msg_tok;
}

int kvp_token_lcp(const int *a, int na, const int *b, int nb)
{
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

int kvp_session_rewind_apply(kvp_session *s, const kvp_session_env *env, int **old, int *n_old)
{
    *old = NULL;
    *n_old = 0;
    if (!s->rq.rewind_set)
        return 0;
    /* the cache's tokens, when the cache starts the transcript (no dropped history);
     * without memory for them the cache goes, and the rewind is taken all the same (an
     * armed rewind is always taken: its caller lets go of the request) */
    int keep = s->hist_tokens == 0 && s->cache.n_seen == s->n_cached && s->n_cached > 0;
    int nomem = keep && !(*old = malloc((size_t)s->n_cached * sizeof **old));
    if (keep && !nomem) {
        memcpy(*old, s->tokens, (size_t)s->n_cached * sizeof **old);
        *n_old = s->n_cached;
    } else {
        kvp_cache_reset(&s->cache);
    }
    kvp_session_clear_transcript(s);
    /* the request's history (and its rendering, by the request's render job) taken over
     * as they are; the request itself is the caller's to let go of (kvp_session_rewind_let_go) */
    s->msgs = s->rq.rewind_msgs;
    s->n_msgs = s->cap_msgs = s->rq.rewind_n;
    int *pre = s->rq.rewind_tokens, *pre_tok = s->rq.rewind_msg_tok, n_pre = s->rq.rewind_n_tokens;
    s->hist_msgs = 0;
    s->hist_tokens = 0;
    s->n_cached = 0;
    s->journal_ok = 0;   /* the transcript no longer extends the journal's */
    s->reply_open = s->n_msgs > 0;
    int rc = 0;
    if (pre_tok && s->n_msgs > 0) {
        free(s->tokens);
        s->tokens = pre;
        s->n_tokens = s->cap_tokens = n_pre;
        s->msg_tok = pre_tok;
        s->jinja_rendered = 0;   /* the family's tokens, as kvp_session_retokenize's */
        pre = pre_tok = NULL;
    } else if (s->n_msgs > 0 && !(s->msg_tok = calloc((size_t)s->n_msgs, sizeof *s->msg_tok))) {
        rc = -ENOMEM;
    } else if (s->n_msgs > 0) {
        rc = kvp_session_retokenize(s, env);
    }
    free(pre);
    free(pre_tok);
    if (nomem && rc == 0)
        rc = -ENOMEM;
    if (rc < 0) {
        free(*old);
        *old = NULL;
        *n_old = 0;
        kvp_cache_reset(&s->cache);
    }
    return rc;
}

int kvp_session_rewind_cut(kvp_session *s, int *old, int n_old)
{
    if (!old)
        return 0;
    int keep = kvp_token_lcp(old, n_old, s->tokens, s->n_tokens - 1);
    free(old);
    if (n_old > keep) {
        kvp_cache_drop_newest(&s->cache, n_old - keep);
        kvp_policy_truncate(s->policy, &s->cache, keep);
    }
    s->n_cached = keep;
    return keep;
}

int kvp_session_fork(kvp_session *dst, kvp_session *src, const kvp_session_env *env,
                     size_t *bytes)
{
    *bytes = 0;
    if (src->pconf != dst->pconf || !dst->pconf->weights ||
        src->hist_tokens || src->hist_msgs || src->n_cached <= 0 ||
        src->cache.n_seen != src->n_cached || src->n_cached > src->n_tokens ||
        dst->n_tokens || dst->n_msgs || dst->cache.n_seen || dst->policy)
        return -EINVAL;
    int n = src->n_cached;
    int *tok = malloc((size_t)n * sizeof *tok);
    if (!tok)
        return -ENOMEM;
    memcpy(tok, src->tokens, (size_t)n * sizeof *tok);
    kvp_policy *p;
    char err[160];
    int rc = kvp_policy_create_shared(&p, dst->pconf->weights, &env->model->cfg, dst->seed, err,
                                      sizeof err);
    if (rc) {
        free(tok);
        return rc < 0 ? rc : -EINVAL;
    }
    /* the rows are shared (src and dst read one copy) unless the conf's policy writes
     * every row at each step; src and dst have the same conf, so the same policy */
    kvp_cache c;
    rc = env->share_rows && kvp_policy_shares_rows(p) ? kvp_cache_fork_shared(&c, &src->cache, n)
                                                      : kvp_cache_fork(&c, &src->cache, n);
    /* src without a policy (read from its snapshot, no turn since): dst's starts fresh
     * on the copy, as src's own next turn's would on its cache */
    if (!rc && src->policy && (rc = kvp_policy_fork(p, src->policy, &c, n)))
        kvp_cache_free(&c);
    if (rc) {
        kvp_policy_destroy(p);
        free(tok);
        return rc < 0 ? rc : -EINVAL;
    }
    *bytes = kvp_cache_bytes(&c);   /* what was copied: dst pays for no block */
    kvp_cache_free(&dst->cache);
    dst->cache = c;
    dst->policy = p;
    free(dst->tokens);
    dst->tokens = tok;
    dst->n_tokens = dst->cap_tokens = dst->n_cached = n;
    dst->jinja_rendered = src->jinja_rendered;
    return 0;
}
