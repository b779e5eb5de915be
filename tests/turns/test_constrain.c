/* turns/constrain.c: a vocabulary trie a constrained reply cannot be written with is
 * refused with its reason (not as a lack of memory), and a matcher starts on a grammar
 * with documents, and only when the turn's limit can hold one. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "model/grammar.h"
#include "model/schema.h"
#include "turns/session.h"

Test(constrain, an_unusable_trie_is_refused_with_its_reason)
{
    kvp_vocab_trie tr;
    memset(&tr, 0, sizeof tr);
    char err[200] = "";
    tr.n_nodes = 0;
    tr.n_end = 1;
    cr_expect_eq(kvp_session_grammar_usable(&tr, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "no") && strstr(err, "text tokens"), "%s", err);
    cr_expect_null(strstr(err, "memory"), "%s", err);
    tr.n_nodes = 10;
    tr.n_end = 0;
    err[0] = '\0';
    cr_expect_eq(kvp_session_grammar_usable(&tr, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "stop token"), "%s", err);
    tr.n_end = 1;
    err[0] = '\0';
    cr_expect_eq(kvp_session_grammar_usable(&tr, err, sizeof err), 0);
    cr_expect_str_eq(err, "");
}

Test(constrain, a_turn_grammar_starts_and_is_freed)
{
    char err[200];
    kvp_grammar *g = kvp_schema_any_object(err, sizeof err);
    cr_assert(g, "%s", err);
    kvp_session s;
    memset(&s, 0, sizeof s);
    cr_expect_eq(kvp_session_turn_grammar(&s, g, NULL, NULL), 0);
    cr_expect_not_null(s.turn.gm);
    cr_expect_eq(kvp_session_turn_grammar(&s, NULL, NULL, NULL), 0);   /* frees the matcher */
    cr_expect_null(s.turn.gm);
    kvp_grammar_unref(g);
}

/* A turn whose max_tokens cannot hold the grammar's shortest document is refused before
 * it starts (-E2BIG, with the count that would), never begun to be cut; one that can,
 * starts. */
Test(constrain, a_limit_below_the_shortest_document_is_refused)
{
    char err[200];
    json_t *sc = json_loads("{\"type\":\"object\",\"properties\":{\"abc\":{\"type\":\"integer\"}},"
                            "\"required\":[\"abc\"]}", 0, NULL);
    kvp_grammar *g = kvp_schema_compile(sc, err, sizeof err);
    json_decref(sc);
    cr_assert(g, "%s", err);
    int bytes = kvp_grammar_min_len(g);   /* {"abc":0} */
    cr_expect_eq(bytes, 9);
    kvp_session s;
    memset(&s, 0, sizeof s);
    s.rq.spec.max_tokens = bytes - 1;
    int need = -1;
    cr_expect_eq(kvp_session_turn_grammar(&s, g, NULL, &need), -E2BIG);
    cr_expect_eq(need, bytes);
    cr_expect_null(s.turn.gm);
    s.rq.spec.max_tokens = bytes;
    cr_expect_eq(kvp_session_turn_grammar(&s, g, NULL, &need), 0);
    cr_expect_not_null(s.turn.gm);
    cr_expect_eq(kvp_session_turn_grammar(&s, NULL, NULL, NULL), 0);
    kvp_grammar_unref(g);
}

/* A reply is a whole document only once its grammar's bytes are complete: what decides
 * whether a constrained reply that used all of its max_tokens finishes "stop" (shaped)
 * or "length" (cut). An unconstrained turn never is. */
Test(constrain, a_whole_document_is_told_from_a_cut_one)
{
    char err[200];
    kvp_grammar *g = kvp_schema_any_object(err, sizeof err);
    cr_assert(g, "%s", err);
    kvp_session s;
    memset(&s, 0, sizeof s);
    cr_expect_not(kvp_turn_doc_whole(&s.turn), "no grammar: no document");
    s.rq.spec.max_tokens = 64;
    cr_assert_eq(kvp_session_turn_grammar(&s, g, NULL, NULL), 0);
    cr_expect_not(kvp_turn_doc_whole(&s.turn), "nothing written yet");
    kvp_gmatch_accept(s.turn.gm, "{\"a\":", 5);
    cr_expect_not(kvp_turn_doc_whole(&s.turn), "an open object");
    kvp_gmatch_accept(s.turn.gm, "1}", 2);
    cr_expect(kvp_turn_doc_whole(&s.turn), "a closed object");
    cr_expect_eq(kvp_session_turn_grammar(&s, NULL, NULL, NULL), 0);
    kvp_grammar_unref(g);
}
