/* A hello's fork in process (sessions/hub_fork.c): the new session's copy of the source's
 * cache counts against the memory cap when it is made, as a turn's reservation does: a
 * fork that cannot fit beside what is held is refused overloaded (with nothing left
 * behind) instead of holding the cache past max_cache_bytes, and the connection keeps
 * the session it had; a fork that has not run a turn of its own is not written by the
 * shutdown's save. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sessions/hub_impl.h"
#include "sessions/residency.h"
#include "store/snapshot.h"
#include "tests/model/testutil.h"
#include "tests/sessions/hubtest.h"

static ht_hub g;

TestSuite(hub_fork, .timeout = 120);

/* Clients are large (their event logs): static, freed at the end of each test. */
static ht_client a, f;

static void finish(void)
{
    ht_client *all[] = {&a, &f};
    ht_finish(&g, all, sizeof all / sizeof all[0]);
}

/* a's new session, one turn of `text` done and settled: the fork source. Its id in id. */
static void source(const char *text, char *id)
{
    ht_client_new(&g, &a);
    kvp_hub_open(a.c, NULL, NULL, 0);
    snprintf(id, KVP_SESSION_ID_LEN + 1, "%s", a.ev[0].id);
    kvp_hub_message(a.c, text, strlen(text), 8, 0, 0);
    ht_wait(&g, &a, 1, KVP_HUB_DONE, 60);
    ht_settle(&g);
}

Test(hub_fork, a_fork_whose_copy_does_not_fit_the_memory_cap_is_refused, .fini = finish)
{
    ht_share_rows = 0;   /* forks copy their rows: the copy is what must fit */
    ht_start_forkable(&g, NULL);
    char id[KVP_SESSION_ID_LEN + 1];
    char *t = ht_text(60);
    source(t, id);
    free(t);
    size_t held = ht_session(&g, id)->bytes;
    cr_assert_gt(held, 0);
    /* room for a's cache and a quarter of it more: a (attached) cannot be let go */
    g.cfg.max_cache_bytes = held + held / 4;
    ht_client_new(&g, &f);
    int sessions = g.hub->sessions.count;
    kvp_hub_open_fork(f.c, id, 1);
    cr_assert_eq(f.n, 1);
    cr_assert_eq(f.ev[0].type, KVP_HUB_ERROR, "the fork was made past the memory cap "
                 "(%zu bytes counted, cap %llu)", kvp_hub_accounted_bytes(g.hub, NULL, NULL),
                 (unsigned long long)g.cfg.max_cache_bytes);
    cr_assert_str_eq(f.ev[0].code, KVPD_E_OVERLOADED);
    cr_assert_eq(g.hub->sessions.count, sessions, "the refused fork's session stayed");
    cr_assert_leq(kvp_hub_accounted_bytes(g.hub, NULL, NULL), g.cfg.max_cache_bytes);

    /* with room for both, the fork is made */
    g.cfg.max_cache_bytes = 3 * held;
    kvp_hub_open_fork(f.c, id, 1);
    int k = ht_find(&f, 1, KVP_HUB_SESSION);
    cr_assert_geq(k, 0, "the fork was refused with room for it");
    cr_assert_eq(f.ev[k].turns, 1);
}

Test(hub_fork, a_fork_whose_copy_does_not_fit_the_tenants_bytes_is_refused, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    char id[KVP_SESSION_ID_LEN + 1];
    char *t = ht_text(60);
    source(t, id);
    free(t);
    size_t held = ht_session(&g, id)->bytes, turn = kvp_hub_turn_bytes(g.hub);
    size_t need = turn > held ? turn : held;
    /* the tenant's source (attached: it cannot be parked) and less than the fork needs */
    g.cfg.max_cache_bytes_per_tenant = held + need / 2;
    ht_client_new(&g, &f);
    int sessions = g.hub->sessions.count;
    kvp_hub_open_fork(f.c, id, 1);
    cr_assert_eq(f.n, 1);
    cr_assert_eq(f.ev[0].type, KVP_HUB_ERROR, "the fork was made past the tenant's bytes");
    cr_assert_str_eq(f.ev[0].code, KVPD_E_OVERLOADED);
    cr_assert(strstr(f.ev[0].text, "max_cache_bytes_per_tenant"), "%s", f.ev[0].text);
    cr_assert_eq(g.hub->sessions.count, sessions, "the refused fork's session stayed");

    /* with room for both, the fork is made */
    g.cfg.max_cache_bytes_per_tenant = held + need + held;
    kvp_hub_open_fork(f.c, id, 1);
    int k = ht_find(&f, 1, KVP_HUB_SESSION);
    cr_assert_geq(k, 0, "the fork was refused with room for it");
}

/* A fork that has not run a turn of its own holds only its source's history: nothing of
 * its own to keep. The shutdown's save of unsaved sessions leaves it unwritten (a snapshot
 * of it would count against its tenant's stored bytes and outlive its connection). */
Test(hub_fork, a_fork_that_never_ran_is_not_saved_at_shutdown, .fini = finish)
{
    char dir[] = "/tmp/kvp-hfork-XXXXXX";
    cr_assert(mkdtemp(dir));
    ht_start_forkable(&g, dir);
    char id[KVP_SESSION_ID_LEN + 1];
    source("A frog sat on a log.", id);
    ht_client_new(&g, &f);
    kvp_hub_open_fork(f.c, id, 1);
    int k = ht_find(&f, 0, KVP_HUB_SESSION);
    cr_assert_geq(k, 0);
    char fid[KVP_SESSION_ID_LEN + 1];
    snprintf(fid, sizeof fid, "%s", f.ev[k].id);
    cr_assert_eq(kvp_hub_save_unsaved(g.hub), 0, "the unrun fork was written");
    ht_settle(&g);
    cr_assert_not(kvp_snapshot_exists(dir, fid));
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* A refused fork leaves the connection as it was: its own session stays its session (the
 * next message continues it), even when making room for the copy parked it. */
Test(hub_fork, a_refused_fork_leaves_the_connection_its_session, .fini = finish)
{
    char dir[] = "/tmp/kvp-hfork-XXXXXX";
    cr_assert(mkdtemp(dir));
    ht_start_forkable(&g, dir);
    char id[KVP_SESSION_ID_LEN + 1];
    char *t = ht_text(60);
    source(t, id);
    free(t);
    ht_client_new(&g, &f);
    kvp_hub_open(f.c, NULL, NULL, 0);
    char own[KVP_SESSION_ID_LEN + 1];
    snprintf(own, sizeof own, "%s", f.ev[0].id);
    kvp_hub_message(f.c, "A frog sat on a log.", 20, 4, 0, 0);
    ht_wait(&g, &f, 1, KVP_HUB_DONE, 60);
    ht_settle(&g);
    /* a cap below the copy: refused even with every idle session parked */
    g.cfg.max_cache_bytes = ht_session(&g, id)->bytes / 8;
    int from = f.n;
    kvp_hub_open_fork(f.c, id, 1);
    cr_assert_eq(f.n, from + 1);
    cr_assert_str_eq(f.ev[from].code, KVPD_E_OVERLOADED);
    cr_assert(f.c->session, "the refused fork left the connection without its session");
    cr_assert_str_eq(f.c->session->id, own);
    cr_assert_eq(ht_session(&g, own)->client, f.c);
    g.cfg.max_cache_bytes = 0;
    kvp_hub_message(f.c, "The end.", 8, 4, 0, 0);   /* its session, read back */
    int k = ht_wait(&g, &f, from + 1, KVP_HUB_DONE, 60);
    cr_assert_gt(f.ev[k].stats.context_tokens, 20);
    ht_settle(&g);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* With shared rows (the default) the same fork fits beside its source: it reads the
 * source's rows instead of copying them, the hub counts them once (charged to the
 * source) and reports them as shared; the fork's turn then runs on them. */
Test(hub_fork, a_fork_shares_its_sources_rows_counted_once, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    char id[KVP_SESSION_ID_LEN + 1];
    char *t = ht_text(60);
    source(t, id);
    free(t);
    size_t held = ht_session(&g, id)->bytes;
    cr_assert_gt(held, 0);
    g.cfg.max_cache_bytes = held + held / 4;
    ht_client_new(&g, &f);
    kvp_hub_open_fork(f.c, id, 1);
    int k = ht_find(&f, 0, KVP_HUB_SESSION);
    cr_assert_geq(k, 0, "the fork was refused though it copies almost nothing");
    size_t actual, shared;
    size_t counted = kvp_hub_accounted_bytes(g.hub, &actual, &shared);
    cr_assert_leq(counted, g.cfg.max_cache_bytes);
    /* every row the source held is now one block both read */
    const kvp_cache *sc = &ht_session(&g, id)->cache;
    size_t rows = kvp_cache_rows(sc) * kvp_cache_row_cost(sc->kv_type, sc->head_dim);
    cr_assert_eq(shared, rows, "the source's rows are not reported shared (%zu, rows %zu)",
                 shared, rows);
    kvp_hub_info info;
    kvp_hub_info_get(g.hub, &info);
    cr_assert_eq(info.cache_bytes_shared, shared);
    cr_assert_eq(info.cache_bytes_total, actual);
    /* two readers of each block: one counted, the other borrowed */
    cr_assert_geq(info.cache_bytes_borrowed, 2 * shared - shared / 4,
                  "borrowed %zu, shared %zu", info.cache_bytes_borrowed, shared);
    cr_assert_lt(actual, held + held / 4, "the fork's rows were counted twice");
}

/* A fork's turn on shared rows gives the reply it gives on a copy, token for token, and
 * the source's next turn too (greedy, q8_0 rows as the daemon stores them). */
Test(hub_fork, a_forks_reply_on_shared_rows_is_the_copys, .fini = finish)
{
    char *reply[2][2];
    for (int run = 0; run < 2; run++) {
        ht_share_rows = run == 0;
        ht_kv_type = KVP_KV_Q8_0;
        ht_start_forkable(&g, NULL);
        g.cfg.budget = 0;
        char id[KVP_SESSION_ID_LEN + 1];
        char *t = ht_text(40);
        source(t, id);
        free(t);
        ht_client_new(&g, &f);
        kvp_hub_open_fork(f.c, id, 1);
        cr_assert_geq(ht_find(&f, 0, KVP_HUB_SESSION), 0);
        static const char fm[] = "The dog ran to the park and", am[] = "Then the cat said";
        int from_f = f.n, from_a = a.n;
        kvp_hub_message(f.c, fm, strlen(fm), 12, 0, 0);
        kvp_hub_message(a.c, am, strlen(am), 12, 0, 0);
        int kf = ht_wait(&g, &f, from_f, KVP_HUB_DONE, 60);
        int ka = ht_wait(&g, &a, from_a, KVP_HUB_DONE, 60);
        reply[run][0] = strdup(f.ev[kf].text);
        reply[run][1] = strdup(a.ev[ka].text);
        finish();
        memset(&g, 0, sizeof g);
    }
    cr_expect_str_eq(reply[0][0], reply[1][0], "the fork's reply on shared rows differs");
    cr_expect_str_eq(reply[0][1], reply[1][1], "the source's reply after the fork differs");
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 2; i++)
            free(reply[r][i]);
    ht_start(&g, NULL, "streaming");   /* for .fini */
}
