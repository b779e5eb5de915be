/* A turn's reply text on the worker (turns/turn_reply.c): appended as tokens are
 * sampled, held back while it may begin a stop string, given to the sink in whole UTF-8
 * characters, cut at a stop string. Lengths are bytes of the reply; 0 or -ENOMEM unless
 * said. Private to turns/. */
#ifndef KVP_TURN_REPLY_H
#define KVP_TURN_REPLY_H

#include "turns/session.h"

/* With logprobs: how many of the reply's tokens have all their text in reply[0..upto)
 * (a token that ends inside a character is whole once a later token ends it). */
int turn_lp_whole(const kvp_turn *t, size_t upto);
/* Gives the sink the reply up to `upto` (what it has not had yet), with the logprobs of
 * the tokens that text completes (lp_from..lp_to, read by the sink). */
void turn_emit(kvp_session *s, const kvp_turn_sink *sink, size_t upto);
/* Reply text (valid UTF-8): kept and looked through for the turn's stop strings; returns
 * how much of the reply may go to the sink: all but what could still begin one (held
 * back until it cannot, or the turn ends). After a stop string nothing more is kept.
 * *err: 0 or -ENOMEM. */
size_t turn_reply_keep(kvp_session *s, const char *p, size_t n, int *err);
/* turn_reply_keep, then the sink gets what may go out. */
int turn_reply_text(kvp_session *s, const kvp_turn_sink *sink, const char *p, size_t n);
/* The reply's opening (kvpd's forced tool call, or the client's assistant prefill): its
 * tokens go into the transcript unless the template rendered them (rendered), its text
 * starts the reply; kvpd's is looked through for the stop strings and sent, the client's
 * is neither. */
int turn_reply_prefix(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                      int rendered);
/* With stop strings: where the reply stood after its newest token. */
int turn_note_token_end(kvp_turn *t);
/* A stop string ended the reply at stop_at: the transcript ends there too (the stop text
 * and what followed leave the tokens and the cache), so a client that sends the reply
 * back continues this session. */
int turn_cut_at_stop(kvp_session *s, const kvp_session_env *env);

#endif
