/* Continuing a session from an earlier point (a regenerated reply, an edited last
 * message, a reply sent back trimmed): the request's history replaces the session's,
 * and the tokens and the cache go back to where the new rendering and the old tokens
 * diverge, so only the rest is prefilled.
 *
 * The loop arms it (kvp_session_rewind) on an idle resident session before queuing the
 * turn; the turn's start applies it on its worker (kvp_session_rewind_apply, then
 * kvp_session_rewind_cut once the turn's own tokens are in). Rows the cache had
 * evicted before the divergence stay evicted: the cache is the session's compressed
 * cache cut at the divergence position. Only sessions that kept their whole history
 * (no max_history_tokens drop) are rewound; others prefill the new rendering whole. */
#ifndef KVP_REWIND_H
#define KVP_REWIND_H

#include "turns/session.h"

/* Loop: the turn about to be queued on s continues from msgs[0..n) (copied) instead of
 * s's transcript. 0 or -ENOMEM. */
int kvp_session_rewind(kvp_session *s, const kvp_message *msgs, int n);

/* Loop, after kvp_session_rewind: the history as a render job already rendered it
 * (kvp_session_retokenize's tokens[0..n_tokens) and msg_tok[rewind_n], both malloc'd and
 * taken over), so the turn's start uses them instead of rendering it again. */
void kvp_session_rewind_rendered(kvp_session *s, int *tokens, int n_tokens, int *msg_tok);
/* Worker, at the turn's start: when a rewind is armed, the messages are replaced and
 * rendered again, or the rendering kvp_session_rewind_rendered gave taken (tokens[]
 * anew, n_cached 0; the cache untouched) and *old (malloc'd)
 * gets the tokens the cache held, *n_old their count. Nothing armed: *old NULL. 0 or a
 * negative code (the transcript is then the new one, the cache dropped). An armed
 * rewind is always taken, whatever it returns: the request's buffers are the
 * transcript's now, and the caller lets go of them (the worker through
 * s->res.took_rewind, the loop with kvp_session_rewind_let_go). */
int kvp_session_rewind_apply(kvp_session *s, const kvp_session_env *env, int **old, int *n_old);
/* Worker, once the turn's tokens are in tokens[]: the cache keeps the longest prefix of
 * old[0..n_old) that tokens[] starts with (at most n_tokens - 1 tokens: the prompt's
 * last token is run again for its logits), the newer rows leave it and the policy's
 * state follows. Returns the tokens kept. Frees old. */
int kvp_session_rewind_cut(kvp_session *s, int *old, int n_old);

/* Loop, on a new session dst that was never run and an idle resident src of the same
 * policy conf whose cache starts its transcript (no dropped history): dst gets src's
 * cache, policy state and tokens (kvp_policy_fork), src reads what it read. The cache's
 * rows are shared with src (kvp_cache_fork_shared: src's rows become a block both read,
 * each side's changes copied first) when env->share_rows is set and the policy allows
 * it (kvp_policy_shares_rows), else copied (kvp_cache_fork). Arm a rewind on dst next (kvp_session_rewind): its turn's start cuts the copy
 * back to where the request and src's tokens diverge, as for src itself. Rows src had
 * evicted stay evicted in the copy. A src without a policy (read from its snapshot, no
 * turn since) gives dst a fresh one, as src's next turn would make for itself. *bytes
 * gets the cache bytes copied. 0, -EINVAL (src cannot serve: another conf, dropped
 * history, nothing cached; the conf has no shared weights), -ENOMEM; dst is unchanged on
 * failure. */
int kvp_session_fork(kvp_session *dst, kvp_session *src, const kvp_session_env *env,
                     size_t *bytes);

/* The longest common prefix of a[0..na) and b[0..nb). */
int kvp_token_lcp(const int *a, int na, const int *b, int nb);

#endif
