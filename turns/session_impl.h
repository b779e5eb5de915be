/* The session object's transcript operations that the turn machine (turns/turn.c,
 * turns/turn_reply.c) uses on its worker; defined in session.c. Private to turns/.
 * Counts are tokens or messages; a negative return is an errno code. */
#ifndef KVP_SESSION_IMPL_H
#define KVP_SESSION_IMPL_H

#include "turns/session.h"

/* Appends one token id to the transcript's tokens. 0 or -ENOMEM. */
int kvp_session_push_token(kvp_session *s, int id);
/* Appends a message (a copy of text[0..len)); first: where its tokens begin in
 * tokens[]. 0 or -ENOMEM. */
int kvp_session_push_message(kvp_session *s, int user, const char *text, size_t len,
                             int first);
/* With the model's own Jinja template (kvp_template_jinja_turn): the whole conversation
 * with the new user message rendered, the transcript kept as far as the rendering agrees
 * with it. Where the template renders an earlier turn differently now (Qwen3 drops an
 * earlier reply's think block), the transcript and the cache go back to the longest
 * shared prefix (the journal's next save is a full one) and the rest is prefilled anew.
 * *ids (malloc'd) are the tokens to append. Returns their count, or -ENOENT when the
 * family renders this turn: no Jinja template, dropped history (the rendering would
 * start at the conversation's beginning), or a conversation the template refuses. */
int kvp_session_jinja_turn(kvp_session *s, const kvp_session_env *env, int **ids);
/* Frees the turn's buffers (reply, tok_end unless lent, matcher) and zeroes it, keeping
 * its serial: the worker at the turn's start, or the loop when the session parks or goes
 * (not busy then). */
void kvp_turn_reset(kvp_turn *t);
/* max_history_tokens, at the end of a turn: drops the oldest whole turns (a user message
 * and the replies after it) while the tokens from the next kept turn on are more than
 * max; the newest turn always stays. Only tokens that are in the cache go. */
void kvp_session_bound_history(kvp_session *s, int max);
/* The cache was dropped: with history dropped before, the next turn renders the kept
 * messages again as a conversation of their own. */
void kvp_session_restart_tokens(kvp_session *s);

#endif
