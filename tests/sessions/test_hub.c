/* The session hub (sessions/hub*.c) driven by fake front ends (no sockets): the events a
 * client gets for open, message, cancel and close, and the attachment rule. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/sessions/hubtest.h"

static ht_hub g;

TestSuite(hub, .timeout = 120);

static const char *session_id(const ht_client *c, int i)
{
    cr_assert_geq(i, 0);
    cr_assert_eq(c->ev[i].type, KVP_HUB_SESSION);
    return c->ev[i].id;
}

/* open then message: a session event, tokens that concatenate to done's reply. */
Test(hub, a_turn_streams_tokens_then_done)
{
    ht_start(&g, NULL, "streaming");
    ht_client a;
    ht_client_new(&g, &a);
    kvp_hub_open(a.c, NULL, NULL, 0);
    cr_assert_eq(a.n, 1, "open answers at once");
    cr_assert_eq(strlen(session_id(&a, 0)), KVP_SESSION_ID_LEN);
    cr_assert_eq(a.ev[0].resumed, 0);
    kvp_hub_message(a.c, "Once upon a time", 16, 24, 0, 0);
    int d = ht_wait(&g, &a, 1, KVP_HUB_DONE, 30);
    char reply[4096] = "";
    for (int i = 1; i < d; i++) {
        cr_assert_eq(a.ev[i].type, KVP_HUB_TOKEN);
        strcat(reply, a.ev[i].text);
    }
    cr_assert_str_eq(reply, a.ev[d].text);
    cr_assert_eq(a.ev[d].stats.generated_tokens, 24);
    cr_assert_str_eq(a.ev[d].stats.stop, "length");
    /* Resuming by id gives the history of that turn. */
    ht_client b;
    ht_client_new(&g, &b);
    kvp_hub_open(b.c, a.ev[0].id, NULL, 0);
    cr_assert_eq(b.ev[0].type, KVP_HUB_SESSION);
    cr_assert_eq(b.ev[0].resumed, 1);
    cr_assert_eq(b.ev[0].turns, 1);
    cr_assert_eq(b.ev[0].n_history, 2);
    kvp_hub_close(a.c);
    kvp_hub_close(b.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_stop(&g);
}

/* A second client naming a session whose turn runs gets busy; the first keeps it and
 * gets its done; a message from the second starts nothing on that session. */
Test(hub, open_during_a_turn_is_busy_and_the_starter_gets_done)
{
    ht_start(&g, NULL, "streaming");
    ht_client a, b;
    ht_client_new(&g, &a);
    ht_client_new(&g, &b);
    kvp_hub_open(a.c, NULL, NULL, 0);
    kvp_hub_message(a.c, "Once upon a time", 16, 200, 0, 0);
    kvp_hub_open(b.c, session_id(&a, 0), NULL, 0);
    cr_assert_eq(b.n, 1);
    cr_assert_eq(b.ev[0].type, KVP_HUB_ERROR);
    cr_assert_str_eq(b.ev[0].code, KVPD_E_BUSY, "%s", b.ev[0].text);
    int d = ht_wait(&g, &a, 1, KVP_HUB_DONE, 60);
    cr_assert_eq(a.ev[d].stats.generated_tokens, 200);
    cr_assert_eq(ht_find(&b, 0, KVP_HUB_TOKEN), -1, "the second client got the turn's tokens");
    cr_assert_eq(ht_find(&b, 0, KVP_HUB_DONE), -1, "the second client got the turn's done");
    kvp_hub_close(a.c);
    kvp_hub_close(b.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_stop(&g);
}

/* While idle the newest client takes the session; the previous one is told, and its
 * next message starts a new session with a session event first. */
Test(hub, an_idle_session_moves_to_the_newest_client_and_the_old_one_is_told)
{
    ht_start(&g, NULL, "streaming");
    ht_client a, b;
    ht_client_new(&g, &a);
    ht_client_new(&g, &b);
    kvp_hub_open(a.c, NULL, NULL, 0);
    kvp_hub_message(a.c, "A cat", 5, 4, 0, 0);
    ht_wait(&g, &a, 1, KVP_HUB_DONE, 30);
    int n = a.n;
    kvp_hub_open(b.c, session_id(&a, 0), NULL, 0);
    cr_assert_eq(b.ev[0].type, KVP_HUB_SESSION);
    cr_assert_eq(a.n, n + 1);
    cr_assert_str_eq(a.ev[n].code, KVPD_E_UNKNOWN_SESSION);
    kvp_hub_message(a.c, "A dog", 5, 4, 0, 0);
    cr_assert_eq(a.ev[n + 1].type, KVP_HUB_SESSION, "a new session is announced");
    cr_assert_str_neq(a.ev[n + 1].id, a.ev[0].id);
    ht_wait(&g, &a, n + 2, KVP_HUB_DONE, 30);
    kvp_hub_close(a.c);
    kvp_hub_close(b.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_stop(&g);
}

/* cancel ends the turn with done "cancel"; close mid-turn stops it and sends nothing. */
Test(hub, cancel_and_close)
{
    ht_start(&g, NULL, "streaming");
    ht_client a, b;
    ht_client_new(&g, &a);
    ht_client_new(&g, &b);
    kvp_hub_open(a.c, NULL, NULL, 0);
    kvp_hub_message(a.c, "Once upon a time", 16, 250, 0, 0);
    ht_wait(&g, &a, 1, KVP_HUB_TOKEN, 30);
    kvp_hub_cancel(a.c);
    int d = ht_wait(&g, &a, 1, KVP_HUB_DONE, 30);
    cr_assert_str_eq(a.ev[d].stats.stop, "cancel");
    cr_assert_lt(a.ev[d].stats.generated_tokens, 250);
    kvp_hub_open(b.c, NULL, NULL, 0);
    kvp_hub_message(b.c, "Once upon a time", 16, 250, 0, 0);
    ht_wait(&g, &b, 1, KVP_HUB_TOKEN, 30);
    int got = b.n;
    kvp_hub_close(b.c);   /* b's recorder stays valid: nothing may be delivered now */
    ht_settle(&g);
    cr_assert_eq(b.n, got, "a closed client got an event");
    cr_assert_eq(g.metrics.turns_cancelled, 2);
    kvp_hub_close(a.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_stop(&g);
}

/* A session that never ran a turn ends when its client leaves it. */
Test(hub, a_never_used_session_ends_when_its_client_leaves)
{
    ht_start(&g, NULL, "streaming");
    ht_client a, b;
    ht_client_new(&g, &a);
    ht_client_new(&g, &b);
    kvp_hub_open(a.c, NULL, NULL, 0);
    char first[KVP_SESSION_ID_LEN + 1];
    snprintf(first, sizeof first, "%s", session_id(&a, 0));
    for (int i = 0; i < 5; i++)
        kvp_hub_open(a.c, NULL, NULL, 0);
    kvp_hub_info info;
    kvp_hub_info_get(g.hub, &info);
    cr_assert_eq(info.sessions_resident, 1);
    kvp_hub_open(b.c, first, NULL, 0);
    cr_assert_str_eq(b.ev[0].code, KVPD_E_UNKNOWN_SESSION);
    kvp_hub_close(a.c);
    kvp_hub_info_get(g.hub, &info);
    cr_assert_eq(info.sessions_resident, 0);
    kvp_hub_close(b.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_stop(&g);
}

/* A client may start at most max_sessions_per_client conversations; sessions it left
 * unused do not count. */
Test(hub, sessions_per_client_are_bounded)
{
    ht_start(&g, NULL, "streaming");
    g.cfg.max_sessions_per_client = 3;
    ht_client a;
    ht_client_new(&g, &a);
    for (int i = 0; i < 10; i++) {   /* empty ones end as they are left */
        kvp_hub_open(a.c, NULL, NULL, 0);
        cr_assert_eq(a.ev[a.n - 1].type, KVP_HUB_SESSION);
    }
    for (int i = 0; i < 3; i++) {
        if (i)
            kvp_hub_open(a.c, NULL, NULL, 0);
        cr_assert_eq(a.ev[a.n - 1].type, KVP_HUB_SESSION);
        kvp_hub_message(a.c, "A cat", 5, 2, 0, 0);
        ht_wait(&g, &a, a.n, KVP_HUB_DONE, 30);
    }
    kvp_hub_open(a.c, NULL, NULL, 0);
    cr_assert_eq(a.ev[a.n - 1].type, KVP_HUB_ERROR);
    cr_assert_str_eq(a.ev[a.n - 1].code, KVPD_E_OVERLOADED);
    kvp_hub_info info;
    kvp_hub_info_get(g.hub, &info);
    cr_assert_eq(info.sessions_resident, 3);
    kvp_hub_close(a.c);
    ht_client_free(&a);
    ht_stop(&g);
}

/* Shutdown: running turns stop, new ones are refused. */
Test(hub, drain_cancels_and_refuses)
{
    ht_start(&g, NULL, "streaming");
    ht_client a;
    ht_client_new(&g, &a);
    kvp_hub_open(a.c, NULL, NULL, 0);
    kvp_hub_message(a.c, "Once upon a time", 16, 250, 0, 0);
    cr_assert_eq(kvp_hub_drain(g.hub), 1);
    int d = ht_wait(&g, &a, 1, KVP_HUB_DONE, 30);
    cr_assert_str_eq(a.ev[d].stats.stop, "cancel");
    kvp_hub_message(a.c, "more", 4, 4, 0, 0);
    cr_assert_str_eq(a.ev[a.n - 1].code, KVPD_E_OVERLOADED);
    kvp_hub_close(a.c);
    ht_client_free(&a);
    ht_stop(&g);
}

/* With a state directory: two clients open a session that is only on disk; the first
 * gets the session once it is read, the second busy, and nobody waits forever. */
Test(hub, two_opens_of_a_session_on_disk)
{
    char dir[] = "/tmp/kvp-hub-XXXXXX";
    cr_assert(mkdtemp(dir));
    ht_start(&g, dir, "streaming");
    ht_client a;
    ht_client_new(&g, &a);
    kvp_hub_open(a.c, NULL, NULL, 0);
    char id[KVP_SESSION_ID_LEN + 1];
    snprintf(id, sizeof id, "%s", session_id(&a, 0));
    kvp_hub_message(a.c, "A frog", 6, 8, 0, 0);
    ht_wait(&g, &a, 1, KVP_HUB_DONE, 30);
    kvp_hub_close(a.c);
    ht_client_free(&a);
    ht_stop(&g);

    ht_start(&g, dir, "streaming");   /* a restart: the session is on disk only */
    ht_client b, c;
    ht_client_new(&g, &b);
    ht_client_new(&g, &c);
    kvp_hub_open(b.c, id, NULL, 0);
    kvp_hub_open(c.c, id, NULL, 0);
    cr_assert_eq(c.n, 1);
    cr_assert_str_eq(c.ev[0].code, KVPD_E_BUSY, "%s", c.ev[0].text);
    int s = ht_wait(&g, &b, 0, KVP_HUB_SESSION, 30);
    cr_assert_eq(b.ev[s].turns, 1);
    cr_assert_eq(b.ev[s].n_history, 2);
    kvp_hub_close(b.c);
    kvp_hub_close(c.c);
    ht_client_free(&b);
    ht_client_free(&c);
    ht_stop(&g);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* A hello's system text is the session's for good: given on a new session, reported on
 * every resume, kept across a restart; a resume naming another one (in memory, or once
 * the snapshot is read) is refused and leaves the client without a session; too long is
 * too_large. */
Test(hub, a_system_text_is_set_once_and_never_changed)
{
    char dir[] = "/tmp/kvp-hub-XXXXXX";
    cr_assert(mkdtemp(dir));
    ht_start(&g, dir, "streaming");
    static ht_client a, b;
    ht_client_new(&g, &a);
    kvp_hub_open(a.c, NULL, "Be kind.", 8);
    cr_assert(a.ev[0].has_system);
    cr_assert_str_eq(a.ev[0].system, "Be kind.");
    char id[KVP_SESSION_ID_LEN + 1];
    snprintf(id, sizeof id, "%s", session_id(&a, 0));
    kvp_hub_message(a.c, "A frog", 6, 8, 0, 0);
    ht_wait(&g, &a, 1, KVP_HUB_DONE, 30);

    ht_client_new(&g, &b);
    kvp_hub_open(b.c, id, "Be cruel.", 9);
    cr_assert_eq(b.n, 1);
    cr_assert_str_eq(b.ev[0].code, KVPD_E_BAD_REQUEST);
    cr_assert(strstr(b.ev[0].text, "another system text"), "%s", b.ev[0].text);
    kvp_hub_open(b.c, id, "", 0);   /* "" is "none": not this session's either */
    cr_assert_str_eq(b.ev[1].code, KVPD_E_BAD_REQUEST);
    kvp_hub_message(b.c, "hi", 2, 2, 0, 0);   /* b has no session: a new one starts */
    cr_assert_eq(b.ev[2].type, KVP_HUB_SESSION);
    cr_assert_str_neq(b.ev[2].id, id, "a refused resume attached the session");
    cr_assert_not(b.ev[2].has_system);
    ht_wait(&g, &b, 3, KVP_HUB_DONE, 30);
    kvp_hub_open(b.c, id, "Be kind.", 8);   /* the same text: resumed */
    int k = ht_find(&b, 3, KVP_HUB_SESSION);
    cr_assert_geq(k, 0);
    cr_assert_str_eq(b.ev[k].id, id);
    cr_assert_str_eq(b.ev[k].system, "Be kind.");
    kvp_hub_open(b.c, id, NULL, 0);   /* none given: resumed as it is */
    cr_assert_str_eq(b.ev[b.n - 1].system, "Be kind.");

    char *big = malloc(KVP_HUB_SYSTEM_MAX + 1);
    memset(big, 'x', KVP_HUB_SYSTEM_MAX + 1);
    int before = b.n;
    kvp_hub_open(b.c, NULL, big, KVP_HUB_SYSTEM_MAX + 1);
    cr_assert_eq(b.n, before + 1);
    cr_assert_str_eq(b.ev[before].code, KVPD_E_TOO_LARGE);
    free(big);
    kvp_hub_close(a.c);
    kvp_hub_close(b.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_stop(&g);

    ht_start(&g, dir, "streaming");   /* a restart: the system text is on disk */
    ht_client_new(&g, &a);
    kvp_hub_open(a.c, id, "Be cruel.", 9);
    int e = ht_wait(&g, &a, 0, KVP_HUB_ERROR, 30);
    cr_assert_str_eq(a.ev[e].code, KVPD_E_BAD_REQUEST, "%s", a.ev[e].text);
    cr_assert_eq(ht_find(&a, 0, KVP_HUB_SESSION), -1, "a mismatched load was answered as resumed");
    kvp_hub_open(a.c, id, "Be kind.", 8);
    int s = ht_wait(&g, &a, 0, KVP_HUB_SESSION, 30);
    cr_assert_str_eq(a.ev[s].system, "Be kind.");
    cr_assert_eq(a.ev[s].turns, 1);
    kvp_hub_close(a.c);
    ht_client_free(&a);
    ht_stop(&g);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
