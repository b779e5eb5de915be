/* kvp_hub_chat_choices (sessions/hub_choices.c): temperature 0 gives the same reply n
 * times; a choice that does not fit is overloaded; n out of range is bad_request. (One
 * prefill and the seeded forks are checked through the API: tests/openai/choices.mjs.) */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tests/sessions/hubtest.h"

static ht_hub g;

TestSuite(choices, .timeout = 120);

static const char PROMPT[] = "Once upon a time there was a little dog named Spot who";

/* Clients are large (their event logs): static, freed at the end of each test. */
static ht_client a, b, c, d;

static void finish(void)
{
    ht_client *all[] = {&a, &b, &c, &d};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ht_client_free(all[i]);
    ht_stop(&g);
}

/* Three choices of PROMPT with options o: a is the first, b and c the others. Returns
 * the index of each one's done in done[]. */
static void three(const kvp_turn_opts *o, int done[3])
{
    ht_client_new(&g, &a);
    ht_client_new(&g, &b);
    ht_client_new(&g, &c);
    kvp_message m = {1, (char *)PROMPT, strlen(PROMPT)};
    kvp_hub_client *more[2] = {b.c, c.c};
    kvp_hub_chat_choices(a.c, more, 2, NULL, NULL, 0, &m, 1, o);
    done[0] = ht_wait(&g, &a, 0, KVP_HUB_DONE, 60);
    done[1] = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    done[2] = ht_wait(&g, &c, 0, KVP_HUB_DONE, 60);
}

Test(choices, greedy_choices_are_one_reply, .fini = finish)
{
    ht_start(&g, NULL, "streaming");
    kvp_turn_opts o = {.max_tokens = 16};
    int k[3];
    three(&o, k);
    cr_assert_str_eq(b.ev[k[1]].text, a.ev[k[0]].text);
    cr_assert_str_eq(c.ev[k[2]].text, a.ev[k[0]].text);
}

Test(choices, a_choice_that_does_not_fit_is_overloaded, .fini = finish)
{
    ht_start(&g, NULL, "streaming");
    g.cfg.max_sessions = 3;
    /* d holds one of the three: the first choice and one more fit, the third does not */
    ht_client_new(&g, &d);
    kvp_hub_open(d.c, NULL, NULL, 0);
    cr_assert_eq(d.ev[0].type, KVP_HUB_SESSION);
    ht_client_new(&g, &a);
    ht_client_new(&g, &b);
    ht_client_new(&g, &c);
    kvp_message m = {1, (char *)PROMPT, strlen(PROMPT)};
    kvp_hub_client *more[2] = {b.c, c.c};
    kvp_turn_opts o = {.max_tokens = 8};
    kvp_hub_chat_choices(a.c, more, 2, NULL, NULL, 0, &m, 1, &o);
    ht_wait(&g, &a, 0, KVP_HUB_DONE, 60);
    ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    int e = ht_wait(&g, &c, 0, KVP_HUB_ERROR, 60);
    cr_assert_str_eq(c.ev[e].code, KVPD_E_OVERLOADED);
    ht_settle(&g);

    /* more choices than max_sessions ever holds: refused at once, nothing runs */
    g.cfg.max_sessions = 2;
    ht_client *old[] = {&a, &b, &c};
    for (int i = 0; i < 3; i++) {
        kvp_hub_close(old[i]->c);
        ht_client_free(old[i]);
    }
    ht_client_new(&g, &a);
    ht_client_new(&g, &b);
    ht_client_new(&g, &c);
    kvp_hub_client *more2[2] = {b.c, c.c};
    kvp_hub_chat_choices(a.c, more2, 2, NULL, NULL, 0, &m, 1, &o);
    cr_assert_eq(a.n, 1);
    cr_assert_eq(a.ev[0].type, KVP_HUB_ERROR);
    cr_assert_str_eq(a.ev[0].code, KVPD_E_OVERLOADED);
    cr_assert_eq(b.n + c.n, 0);
}

Test(choices, n_out_of_range_is_bad_request, .fini = finish)
{
    ht_start(&g, NULL, "streaming");
    ht_client_new(&g, &a);
    kvp_message m = {1, (char *)PROMPT, strlen(PROMPT)};
    kvp_hub_client *more[KVP_HUB_MAX_CHOICES] = {0};
    kvp_turn_opts o = {.max_tokens = 8};
    kvp_hub_chat_choices(a.c, more, KVP_HUB_MAX_CHOICES, NULL, NULL, 0, &m, 1, &o);
    cr_assert_eq(a.n, 1);
    cr_assert_eq(a.ev[0].type, KVP_HUB_ERROR);
    cr_assert_str_eq(a.ev[0].code, KVPD_E_BAD_REQUEST);
}

/* The other choices read the first one's rows instead of copying them (share_rows): with
 * seeded sampling each choice's reply is, token for token, the one it gives when every
 * fork copies its rows (q8_0 rows, as the daemon stores them by default). */
Test(choices, shared_rows_give_the_replies_copies_give, .fini = finish)
{
    char *text[2][3];
    size_t shared_seen[2] = {0, 0};
    for (int run = 0; run < 2; run++) {
        ht_share_rows = run == 0;
        ht_kv_type = KVP_KV_Q8_0;
        ht_start_forkable(&g, NULL);   /* the conf's shared weights: the choices fork */
        g.cfg.budget = 0;   /* no eviction: the prompt's rows stay shared to the end */
        kvp_turn_opts o = {.max_tokens = 24, .has_temperature = 1, .temperature = 0.9f,
                           .has_seed = 1, .seed = 7};
        int k[3];
        three(&o, k);
        ht_client *cl[3] = {&a, &b, &c};
        for (int i = 0; i < 3; i++)
            text[run][i] = strdup(cl[i]->ev[k[i]].text);
        /* a's conversation stays: its rows became the block the choices read */
        kvp_hub_info info;
        kvp_hub_info_get(g.hub, &info);
        shared_seen[run] = info.cache_bytes_shared;
        ht_client *all[] = {&a, &b, &c, &d};
        ht_finish(&g, all, sizeof all / sizeof all[0]);   /* closes the clients too */
        memset(&g, 0, sizeof g);
    }
    cr_expect_gt(shared_seen[0], 0, "the choices did not share the first one's rows");
    cr_expect_eq(shared_seen[1], 0, "rows shared with share_rows off");
    int differ = 0;
    for (int i = 0; i < 3; i++) {
        cr_expect_str_eq(text[0][i], text[1][i], "choice %d: shared rows gave another reply", i);
        differ |= strcmp(text[0][i], text[0][0]) != 0;
    }
    cr_expect(differ, "the seeded choices gave one reply: the comparison shows nothing");
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++)
            free(text[r][i]);
    ht_start(&g, NULL, "streaming");   /* for .fini */
}
