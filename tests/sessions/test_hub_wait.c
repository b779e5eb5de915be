/* New conversations that share a long prefix with one whose first turn is prefilling it
 * wait for that turn and fork it (sessions/hub_wait.c): the waiter forks once the source
 * is done; a source that fails or is cancelled lets its waiters prefill themselves; a
 * waiter whose client closes is freed; admission applies when a waiter goes on; drain
 * answers waiters overloaded; another tenant's request never waits. Every case runs both requests from one loop callback,
 * so the first one's turn is running (from the loop's side) when the second arrives. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sessions/hub_impl.h"
#include "tests/model/testutil.h"
#include "tests/sessions/hubtest.h"

static ht_hub g;

TestSuite(hub_wait, .timeout = 120);

/* Clients are large (their event logs): static, freed at the end of each test. */
static ht_client a, b, c;
static char *shared_text, *a_text, *b_text;

static void finish(void)
{
    ht_client *all[] = {&a, &b, &c};
    ht_finish(&g, all, sizeof all / sizeof all[0]);
    free(shared_text);
    free(a_text);
    free(b_text);
    shared_text = a_text = b_text = NULL;
}

/* a's and b's messages: the same long opening (about 200 tokens), then a_tail words of
 * their own for a and a short ending for b. */
static void texts(int a_tail)
{
    shared_text = ht_text(100);
    char *tail = ht_text(a_tail);
    size_t n = strlen(shared_text) + strlen(tail) + 64;
    a_text = malloc(n);
    b_text = malloc(n);
    snprintf(a_text, n, "%s %s", shared_text, tail);
    snprintf(b_text, n, "%s The bird sang a song.", shared_text);
    free(tail);
}

static void request(ht_client *cl, const char *tenant, const char *text, int max_tokens)
{
    ht_client_new(&g, cl);
    if (tenant)
        kvp_hub_client_set_tenant(cl->c, tenant);
    kvp_message m = {1, (char *)text, strlen(text)};
    kvp_turn_opts o = {.max_tokens = max_tokens};
    kvp_hub_chat(cl->c, NULL, NULL, 0, &m, 1, &o);
}

Test(hub_wait, a_waiter_forks_the_source_once_its_turn_is_done, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    texts(3);
    request(&a, NULL, a_text, 8);
    request(&b, NULL, b_text, 8);
    cr_assert_eq(g.metrics.prefix_waits, 1, "b did not wait for a's turn");
    cr_assert_eq(g.hub->n_waits, 1);
    cr_assert_eq(ht_find(&b, 0, KVP_HUB_DONE), -1);
    cr_assert_eq(ht_find(&b, 0, KVP_HUB_SESSION), -1, "a waiting request was named a session");
    int i = ht_wait(&g, &a, 0, KVP_HUB_DONE, 60);
    int j = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    const kvp_turn_stats *sa = &a.ev[i].stats, *sb = &b.ev[j].stats;
    cr_assert_eq(g.hub->n_waits, 0);
    cr_assert_eq(sa->cached_tokens, 0);
    cr_assert_eq(sb->cached_from, KVP_REUSE_SHARED, "b did not fork a (cached %d of %d, from %d, hits %llu)", sb->cached_tokens, sb->context_tokens, sb->cached_from, (unsigned long long)g.metrics.prefix_hits);
    cr_assert_eq(sb->context_tokens, sb->cached_tokens + sb->prefilled_tokens);
    cr_assert_geq(sb->cached_tokens, 2 * KVP_PREFIX_BLOCK);
    cr_assert_lt(sb->prefilled_tokens, sa->prefilled_tokens / 2,
                 "b prefilled the shared opening again (%d of %d)", sb->prefilled_tokens,
                 sa->prefilled_tokens);
    cr_assert_eq(g.metrics.prefix_hits, 1);
    /* the waiter's answer names the session it got, its one session event */
    int k = ht_find(&b, 0, KVP_HUB_SESSION);
    cr_assert_geq(k, 0);
    cr_assert_eq(ht_find(&b, k + 1, KVP_HUB_SESSION), -1, "the waiter was named two sessions");
    cr_assert(ht_session(&g, b.ev[k].id), "the waiter's session is not held");
    cr_assert_str_neq(b.ev[k].id, a.ev[0].id);
}

Test(hub_wait, a_failed_source_lets_its_waiters_prefill_themselves, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    /* a's prompt is over max_prompt_tokens: its turn fails before any prefill */
    texts(400);
    g.cfg.max_prompt_tokens = 400;
    request(&a, NULL, a_text, 8);
    request(&b, NULL, b_text, 8);
    cr_assert_eq(g.metrics.prefix_waits, 1);
    int i = ht_wait(&g, &a, 0, KVP_HUB_ERROR, 60);
    cr_assert_str_eq(a.ev[i].code, KVPD_E_TOO_LARGE);
    int j = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    const kvp_turn_stats *sb = &b.ev[j].stats;
    cr_assert_eq(sb->cached_tokens, 0);
    cr_assert_eq(sb->prefilled_tokens, sb->context_tokens);
    cr_assert_eq(g.hub->n_waits, 0);
    cr_assert_eq(g.metrics.prefix_waits, 1, "a released waiter waited again");
}

Test(hub_wait, admission_applies_when_a_waiter_goes_on, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    g.cfg.max_sessions = 2;
    texts(3);
    request(&a, NULL, a_text, 8);
    request(&b, NULL, b_text, 8);   /* admitted to render, then holds no session */
    cr_assert_eq(g.hub->n_waits, 1);
    ht_client_new(&g, &c);          /* takes the second slot while b waits */
    kvp_hub_open(c.c, NULL, NULL, 0);
    cr_assert_eq(c.ev[0].type, KVP_HUB_SESSION);
    ht_wait(&g, &a, 0, KVP_HUB_DONE, 60);
    /* a (attached) and c hold both slots: b is refused as any new session would be */
    int j = ht_wait(&g, &b, 0, KVP_HUB_ERROR, 60);
    cr_assert_str_eq(b.ev[j].code, KVPD_E_OVERLOADED);
    cr_assert_eq(g.hub->n_waits, 0);
}

Test(hub_wait, a_cancelled_source_releases_its_waiters, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    texts(3);
    request(&a, NULL, a_text, 64);
    request(&b, NULL, b_text, 8);
    cr_assert_eq(g.metrics.prefix_waits, 1);
    kvp_hub_close(a.c);   /* its turn is cancelled wherever it is */
    a.c = NULL;
    int j = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    const kvp_turn_stats *sb = &b.ev[j].stats;
    cr_assert_eq(sb->context_tokens, sb->cached_tokens + sb->prefilled_tokens);
    cr_assert_gt(sb->generated_tokens, 0);
    cr_assert_eq(g.hub->n_waits, 0);
}

Test(hub_wait, a_waiter_whose_client_closes_is_freed, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    texts(3);
    request(&a, NULL, a_text, 8);
    request(&b, NULL, b_text, 8);
    request(&c, NULL, b_text, 8);
    cr_assert_eq(g.metrics.prefix_waits, 2);
    cr_assert_eq(g.hub->n_waits, 2);
    kvp_hub_close(b.c);
    b.c = NULL;
    cr_assert_eq(g.hub->n_waits, 1);
    ht_wait(&g, &a, 0, KVP_HUB_DONE, 60);
    int j = ht_wait(&g, &c, 0, KVP_HUB_DONE, 60);
    cr_assert_eq(c.ev[j].stats.cached_from, KVP_REUSE_SHARED);
    ht_settle(&g);
    cr_assert_eq(ht_find(&b, 0, KVP_HUB_DONE), -1);
    cr_assert_eq(g.hub->n_waits, 0);
}

Test(hub_wait, drain_answers_waiters_overloaded, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    texts(3);
    request(&a, NULL, a_text, 8);
    request(&b, NULL, b_text, 8);
    cr_assert_eq(g.hub->n_waits, 1);
    kvp_hub_drain(g.hub);
    int j = ht_find(&b, 0, KVP_HUB_ERROR);
    cr_assert_geq(j, 0, "the waiter was not answered at drain");
    cr_assert_str_eq(b.ev[j].code, KVPD_E_OVERLOADED);
    cr_assert_eq(g.hub->n_waits, 0);
    ht_settle(&g);
}

Test(hub_wait, another_tenant_never_waits, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    texts(40);
    request(&a, "00000000000000aa", a_text, 8);
    request(&b, "00000000000000bb", b_text, 8);
    cr_assert_eq(g.metrics.prefix_waits, 0, "b waited on another tenant's turn");
    ht_wait(&g, &a, 0, KVP_HUB_DONE, 60);
    int j = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    cr_assert_eq(b.ev[j].stats.cached_tokens, 0);
    /* and once a is idle, b's tenant does not fork it either: c (a's text, b's tenant)
     * reuses only the opening it shares with b, not a's 40 more words */
    request(&c, "00000000000000bb", a_text, 8);
    int k = ht_wait(&g, &c, 0, KVP_HUB_DONE, 60);
    const kvp_turn_stats *sc = &c.ev[k].stats;
    cr_assert_gt(sc->cached_tokens, 0, "c did not fork b");
    cr_assert_lt(sc->cached_tokens, sc->context_tokens - 40,
                 "c reused more than it shares with its own tenant's b (%d of %d)",
                 sc->cached_tokens, sc->context_tokens);
}

Test(hub_wait, one_tenant_holds_at_most_its_share_of_the_waits, .fini = finish)
{
    ht_start_forkable(&g, NULL);
    texts(3);
    request(&a, "00000000000000aa", a_text, 8);
    enum { N = KVP_HUB_MAX_WAITS_PER_TENANT + 1 };
    ht_client *w = calloc(N, sizeof *w);
    cr_assert_not_null(w);
    for (int i = 0; i < N; i++)
        request(&w[i], "00000000000000aa", b_text, 8);
    cr_assert_eq(g.hub->n_waits, KVP_HUB_MAX_WAITS_PER_TENANT, "%d wait", g.hub->n_waits);
    cr_assert_geq(ht_find(&w[N - 1], 0, KVP_HUB_SESSION), 0,
                  "the request past the tenant's share does not go on by itself");
    /* another tenant still waits on its own running turn */
    request(&b, "00000000000000bb", a_text, 8);
    request(&c, "00000000000000bb", b_text, 8);
    cr_assert_eq(g.hub->n_waits, KVP_HUB_MAX_WAITS_PER_TENANT + 1,
                 "another tenant's request could not wait");
    for (int i = 0; i < N; i++) {
        kvp_hub_close(w[i].c);
        w[i].c = NULL;
        ht_client_free(&w[i]);
    }
    free(w);
    cr_assert_eq(g.hub->n_waits, 1);
}
