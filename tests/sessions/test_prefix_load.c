/* Where the three ways a new conversation reuses another's prefix meet (a wait for a
 * running first turn, sessions/hub_wait.c; a source read from disk first,
 * sessions/prefix_load.c; a hello's fork, sessions/hub_fork.c): a request whose source
 * load ends while another conversation prefills more of its prefix waits for that one; a
 * request whose client closes while its source is read leaves the hub serving; drain
 * answers a request whose source is being read; a read refused for want of room keeps
 * the on-disk source known for the next request. Each case saves a conversation, restarts
 * the hub on the same state directory and sends the requests from one loop callback. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "sessions/hub_impl.h"
#include "sessions/prefix_load.h"
#include "tests/model/testutil.h"
#include "tests/sessions/hubtest.h"

static ht_hub g;
static char dir[64];

TestSuite(prefix_load, .timeout = 120);

/* Clients are large (their event logs): static, freed at the end of each test. */
static ht_client a, b, c, f;

static void finish(void)
{
    ht_client *all[] = {&a, &b, &c, &f};
    ht_finish(&g, all, sizeof all / sizeof all[0]);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static void request(ht_client *cl, const char *text, int max_tokens)
{
    ht_client_new(&g, cl);
    kvp_message m = {1, (char *)text, strlen(text)};
    kvp_turn_opts o = {.max_tokens = max_tokens};
    kvp_hub_chat(cl->c, NULL, NULL, 0, &m, 1, &o);
}

/* "<words of story> <tail>" in a malloc'd string. */
static char *text(int words, const char *tail)
{
    char *w = ht_text(words);
    size_t n = strlen(w) + strlen(tail) + 2;
    char *s = malloc(n);
    snprintf(s, n, "%s %s", w, tail);
    free(w);
    return s;
}

/* A conversation of `words` words saved, then the hub restarted on its directory: the
 * conversation is known only from the prefix file. Its id in id. */
static void saved_then_restart(int words, char *id)
{
    snprintf(dir, sizeof dir, "/tmp/kvp-pload-XXXXXX");
    cr_assert(mkdtemp(dir));
    ht_start_forkable(&g, dir);
    char *t = text(words, "The end.");
    request(&a, t, 4);
    free(t);
    ht_wait(&g, &a, 0, KVP_HUB_DONE, 60);
    snprintf(id, KVP_SESSION_ID_LEN + 1, "%s", a.ev[ht_find(&a, 0, KVP_HUB_SESSION)].id);
    ht_settle(&g);
    kvp_hub_close(a.c);
    a.c = NULL;
    ht_client_free(&a);
    ht_stop(&g);
    ht_start_forkable(&g, dir);
    cr_assert_eq(hub_prefix_disk_count(g.hub), 1, "the saved conversation is no source");
}

Test(prefix_load, a_request_whose_source_is_read_then_waits_for_a_longer_running_prefix,
     .fini = finish)
{
    char id[KVP_SESSION_ID_LEN + 1];
    saved_then_restart(30, id);
    /* b shares the saved one's 30 words; c shares 120 with b, and starts while b's source
     * is read (that session is busy: c finds no source and prefills) */
    char *bt = text(120, "The bird sang a song.");
    char *ct = text(120, "The cat slept all day long.");
    request(&b, bt, 4);
    cr_assert(b.c->pending, "b did not read the saved conversation first");
    request(&c, ct, 32);
    cr_assert_eq(g.hub->n_waits, 0);
    int j = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    ht_wait(&g, &c, 0, KVP_HUB_DONE, 60);
    const kvp_turn_stats *sb = &b.ev[j].stats;
    cr_assert_eq(g.metrics.prefix_waits, 1, "b did not wait for c's turn");
    cr_assert_gt(sb->cached_tokens, 100, "b did not fork c (cached %d of %d)", sb->cached_tokens,
                 sb->context_tokens);
    free(bt);
    free(ct);
}

/* A saved conversation after a restart (its id in id), and b's request, sharing its
 * prefix, waiting while the source is read: b's message (the caller frees it). */
static char *source_being_read(char *id)
{
    saved_then_restart(60, id);
    char *bt = text(60, "The bird sang a song.");
    request(&b, bt, 4);
    cr_assert(b.c->pending);
    return bt;
}

Test(prefix_load, a_request_closed_while_its_source_is_read_leaves_the_hub_serving,
     .fini = finish)
{
    char id[KVP_SESSION_ID_LEN + 1];
    char *bt = source_being_read(id);
    kvp_hub_close(b.c);
    b.c = NULL;
    ht_settle(&g);
    request(&c, bt, 4);   /* the source is resident now: forked at once */
    int k = ht_wait(&g, &c, 0, KVP_HUB_DONE, 60);
    cr_assert_gt(c.ev[k].stats.cached_tokens, 0);
    free(bt);
}

Test(prefix_load, drain_answers_a_request_whose_source_is_being_read, .fini = finish)
{
    char id[KVP_SESSION_ID_LEN + 1];
    char *bt = source_being_read(id);
    kvp_hub_drain(g.hub);
    int k = ht_wait(&g, &b, 0, KVP_HUB_ERROR, 60);
    cr_assert_str_eq(b.ev[k].code, KVPD_E_OVERLOADED);
    ht_settle(&g);
    cr_assert_eq(g.hub->n_waits, 0);
    free(bt);
}

Test(prefix_load, a_hello_fork_of_a_source_read_for_a_request_is_busy_then_forks,
     .fini = finish)
{
    char id[KVP_SESSION_ID_LEN + 1];
    char *bt = source_being_read(id);
    ht_client_new(&g, &f);
    kvp_hub_open_fork(f.c, id, 1);
    cr_assert_eq(f.n, 1);
    cr_assert_str_eq(f.ev[0].code, KVPD_E_BUSY);
    ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    kvp_hub_open_fork(f.c, id, 1);
    int k = ht_wait(&g, &f, 1, KVP_HUB_SESSION, 60);
    cr_assert_eq(f.ev[k].turns, 1);
    free(bt);
}

Test(prefix_load, a_request_during_a_hello_forks_read_and_a_closed_forker, .fini = finish)
{
    char id[KVP_SESSION_ID_LEN + 1];
    saved_then_restart(60, id);
    ht_client_new(&g, &f);
    kvp_hub_open_fork(f.c, id, 1);
    cr_assert(f.c->fork_src);
    char *bt = text(60, "The bird sang a song.");
    request(&b, bt, 4);   /* the source is busy: b prefills */
    kvp_hub_close(f.c);
    f.c = NULL;
    int k = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    cr_assert_eq(b.ev[k].stats.cached_tokens, 0);
    ht_settle(&g);
    request(&c, bt, 4);
    k = ht_wait(&g, &c, 0, KVP_HUB_DONE, 60);
    cr_assert_gt(c.ev[k].stats.cached_tokens, 0);
    free(bt);
}

Test(prefix_load, a_refused_read_keeps_the_source_known, .fini = finish)
{
    char id[KVP_SESSION_ID_LEN + 1];
    saved_then_restart(60, id);
    /* the one slot taken by a running turn: the source's read is refused */
    g.cfg.max_sessions = 1;
    char *other = ht_text(30);
    ht_client_new(&g, &f);
    kvp_hub_message(f.c, other, strlen(other), 32, 0, 0);
    free(other);
    char *bt = text(60, "The bird sang a song.");
    request(&b, bt, 4);
    int k = ht_find(&b, 0, KVP_HUB_ERROR);
    cr_assert_geq(k, 0, "b's read was not refused");
    cr_assert_str_eq(b.ev[k].code, KVPD_E_OVERLOADED);
    cr_assert_eq(hub_prefix_disk_count(g.hub), 1, "a refused read forgot the source");
    ht_wait(&g, &f, 0, KVP_HUB_DONE, 60);
    ht_settle(&g);
    g.cfg.max_sessions = 2;   /* room for the source and the fork beside it */
    request(&c, bt, 4);
    k = ht_wait(&g, &c, 0, KVP_HUB_DONE, 60);
    cr_assert_gt(c.ev[k].stats.cached_tokens, 0, "the source was not read and forked");
    free(bt);
}

Test(prefix_load, a_conversation_let_go_from_memory_stays_a_fork_source, .fini = finish)
{
    snprintf(dir, sizeof dir, "/tmp/kvp-pload-XXXXXX");
    cr_assert(mkdtemp(dir));
    ht_start_forkable(&g, dir);
    char *t = text(60, "The end.");
    request(&a, t, 4);
    free(t);
    ht_wait(&g, &a, 0, KVP_HUB_DONE, 60);
    ht_settle(&g);
    kvp_hub_close(a.c);
    a.c = NULL;
    cr_assert_eq(hub_prefix_disk_count(g.hub), 0);
    /* idle past the timeout: parked; parked past twice the timeout: let go */
    double later = kvp_now() + 3 * g.cfg.idle_timeout_s;
    kvp_hub_expire(g.hub, later);
    kvp_hub_expire(g.hub, later + 3 * g.cfg.idle_timeout_s);
    cr_assert_eq(g.hub->sessions.count, 0, "the conversation is still in memory");
    cr_assert_eq(hub_prefix_disk_count(g.hub), 1, "the let-go conversation is no source");
    char *bt = text(60, "The bird sang a song.");
    request(&b, bt, 4);
    cr_assert(b.c->pending, "b did not read the let-go conversation first");
    int k = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    cr_assert_gt(b.ev[k].stats.cached_tokens, 32, "b did not fork it (cached %d)",
                 b.ev[k].stats.cached_tokens);
    cr_assert_eq(hub_prefix_disk_count(g.hub), 0, "a read source is still counted");
    free(bt);
}
