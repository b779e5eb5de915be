/* turns/turn_reply.c on a bare turn: the reply text kept, what of it may go to the
 * client while a stop string could still begin (whole UTF-8 characters only), the first
 * stop string cutting the reply, a kept end_after string, and where each token ended. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "turns/turn_reply.h"

static kvp_session sess;   /* its turn (sess.turn) and the turn's stop strings (sess.rq.spec) */

static void clear(void)
{
    free(sess.turn.reply);
    if (!sess.turn.tok_end_lent)
        free(sess.turn.tok_end);
    memset(&sess, 0, sizeof sess);
}

TestSuite(turn_reply, .init = clear, .fini = clear);

/* The turn's stop strings (borrowed: the test's own literals); keep: end_after strings. */
static void stops(const char *const *str, const int *keep, int n)
{
    kvp_turn_spec *sp = &sess.rq.spec;
    sp->n_stop = n;
    for (int i = 0; i < n; i++) {
        sp->stop[i] = (char *)str[i];
        sp->stop_len[i] = strlen(str[i]);
        sp->stop_keep[i] = keep ? keep[i] : 0;
        if (sp->stop_len[i] - 1 > sp->stop_hold)
            sp->stop_hold = sp->stop_len[i] - 1;
    }
}

/* Keeps text as the worker does and lets out what it may: the new bytes sent. */
static size_t feed(const char *text)
{
    int err = -1;
    size_t upto = turn_reply_keep(&sess, text, strlen(text), &err);
    cr_assert_eq(err, 0);
    cr_assert_geq(upto, sess.turn.sent, "what went out cannot be taken back");
    cr_assert_leq(upto, sess.turn.reply_len);
    size_t n = upto - sess.turn.sent;
    sess.turn.sent = upto;
    return n;
}

Test(turn_reply, without_stop_strings_everything_goes_out)
{
    cr_assert_eq(feed("Once "), 5);
    cr_assert_eq(feed("upon"), 4);
    cr_assert_str_eq(sess.turn.reply, "Once upon");
    cr_assert_eq(sess.turn.reply_len, 9);
    cr_assert_not(sess.turn.stopped);
}

/* "END": two bytes are held while they may begin it; the reply stops before it, even
 * when it comes across two pieces, and nothing after it is kept. */
Test(turn_reply, a_stop_string_is_held_back_then_cuts_the_reply)
{
    static const char *const s[] = {"END"};
    stops(s, NULL, 1);
    cr_assert_eq(feed("Hello E"), 5, "\"Hello\" out, \" E\" held");
    cr_assert_eq(feed("N"), 1, "the space cannot begin END any more");
    cr_assert_not(sess.turn.stopped);
    cr_assert_eq(feed("D and more"), 0, "the reply ends at the stop string");
    cr_assert(sess.turn.stopped);
    cr_assert_eq(sess.turn.stop_at, 6);
    cr_assert_eq(sess.turn.sent, 6);
    size_t len = sess.turn.reply_len;
    cr_assert_eq(feed("ignored"), 0);
    cr_assert_eq(sess.turn.reply_len, len, "nothing is kept after a stop");
}

Test(turn_reply, a_false_start_is_let_out)
{
    static const char *const s[] = {"END"};
    stops(s, NULL, 1);
    cr_assert_eq(feed("EN"), 0);
    cr_assert_eq(feed("x"), 1, "\"E\" can no longer begin END");
    cr_assert_eq(feed("yz"), 2);
    cr_assert_str_eq(sess.turn.reply, "ENxyz");
    cr_assert_not(sess.turn.stopped);
}

/* Of several stop strings in one piece, the one that comes first ends the reply. */
Test(turn_reply, the_first_of_several_stop_strings_wins)
{
    static const char *const s[] = {"b", "xyz"};
    stops(s, NULL, 2);
    cr_assert_eq(feed("axyzb"), 1);
    cr_assert(sess.turn.stopped);
    cr_assert_eq(sess.turn.stop_at, 1);
}

/* An end_after string (a tool call's close) stays in the reply: the cut is after it. */
Test(turn_reply, a_kept_stop_string_ends_the_reply_after_it)
{
    static const char *const s[] = {"</tool_call>", "STOP"};
    static const int keep[] = {1, 0};
    stops(s, keep, 2);
    const char *call = "<tool_call>\n{}\n</tool_call>";
    feed(call);
    feed(" trailing");
    cr_assert(sess.turn.stopped);
    cr_assert_eq(sess.turn.stop_at, strlen(call));
    cr_assert_eq(sess.turn.sent, strlen(call));
}

/* Held bytes end on a character boundary: a two-byte character is let out whole. */
Test(turn_reply, only_whole_characters_go_out)
{
    static const char *const s[] = {"!!"};
    stops(s, NULL, 1);
    cr_assert_eq(feed("a\xc3\xa9"), 1, "'a' out; the held byte ends inside \xc3\xa9, so it all waits");
    cr_assert_eq(feed("b"), 2, "\xc3\xa9 is whole and clear now, 'b' held");
    cr_assert_str_eq(sess.turn.reply, "a\xc3\xa9" "b");
}

/* tok_end: the reply's length after each token, SIZE_MAX while a character is open;
 * a token is whole once the reply up to its end has gone out. */
Test(turn_reply, token_ends_and_whole_tokens)
{
    static const char *const s[] = {"END"};
    stops(s, NULL, 1);
    const char *pieces[] = {"ab", "c", "de", "fgh"};
    size_t ends[] = {2, 3, 5, 8};
    for (int i = 0; i < 4; i++) {
        feed(pieces[i]);
        sess.turn.stats.generated_tokens = i + 1;
        sess.turn.utf8.n = i == 1;   /* the second token ends inside a character */
        cr_assert_eq(turn_note_token_end(&sess.turn), 0);
        cr_assert_eq(sess.turn.tok_end[i], i == 1 ? SIZE_MAX : ends[i]);
    }
    cr_assert_geq(sess.turn.tok_end_cap, 4);
    cr_assert_eq(turn_lp_whole(&sess.turn, 5), 3, "tokens 0..2 end by 5 (1 is skipped as open)");
    cr_assert_eq(turn_lp_whole(&sess.turn, 4), 1);
    cr_assert_eq(turn_lp_whole(&sess.turn, 8), 4);
    sess.turn.lp_sent = 3;
    cr_assert_eq(turn_lp_whole(&sess.turn, 5), 3, "none after the ones sent");
    /* past 64 tokens the array grows */
    for (int i = 4; i < 100; i++) {
        feed("x");
        sess.turn.stats.generated_tokens = i + 1;
        sess.turn.utf8.n = 0;
        cr_assert_eq(turn_note_token_end(&sess.turn), 0);
    }
    cr_assert_geq(sess.turn.tok_end_cap, 100);
    cr_assert_eq(sess.turn.tok_end[99], 8 + 96);
}

/* With logprobs the ends go into the spec's buffer, lent to the turn: one that would
 * outgrow it moves to a buffer of the turn's own, the ends so far kept, the lent one
 * left to its owner. */
Test(turn_reply, a_lent_token_end_buffer_is_copied_never_grown)
{
    size_t *lent = malloc(2 * sizeof *lent);
    cr_assert_not_null(lent);
    sess.turn.tok_end = lent;
    sess.turn.tok_end_cap = 2;
    sess.turn.tok_end_lent = 1;
    for (int i = 0; i < 3; i++) {
        feed("ab");
        sess.turn.stats.generated_tokens = i + 1;
        cr_assert_eq(turn_note_token_end(&sess.turn), 0);
    }
    cr_assert_neq(sess.turn.tok_end, lent, "the lent buffer is not reallocated");
    cr_assert_not(sess.turn.tok_end_lent);
    cr_assert_eq(sess.turn.tok_end[0], 2);
    cr_assert_eq(sess.turn.tok_end[1], 4);
    cr_assert_eq(sess.turn.tok_end[2], 6);
    cr_assert_eq(lent[1], 4, "the lent buffer still holds what was written into it");
    free(lent);   /* its owner's: still live */
}
