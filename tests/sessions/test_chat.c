/* kvp_hub_chat: stateless requests that carry the whole conversation find the session
 * whose transcript they extend (only the new message is prefilled), or start one seeded
 * with their history; busy sessions are not matched; per-turn top_p and seed; an
 * ephemeral request keeps nothing. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"
#include "tests/sessions/hubtest.h"

static ht_hub g;

TestSuite(chat, .timeout = 120);

static kvp_message msg(int user, const char *text)
{
    kvp_message m = {user, (char *)text, strlen(text)};
    return m;
}

/* Sends msgs on a fresh client; waits for done; returns its index (the session event is
 * the client's first). */
static int chat(ht_client *c, const char *id, const kvp_message *msgs, int n,
                const kvp_turn_opts *o)
{
    ht_client_new(&g, c);
    kvp_hub_chat(c->c, id, NULL, 0, msgs, n, o);
    cr_assert_geq(c->n, 1);
    cr_assert_eq(c->ev[0].type, KVP_HUB_SESSION, "%s", c->ev[0].text ? c->ev[0].text : "");
    return ht_wait(&g, c, 1, KVP_HUB_DONE, 60);
}

/* The request is over: the client lets go of its session (its events stay readable). */
static void end(ht_client *c)
{
    kvp_hub_close(c->c);
    c->c = NULL;
}

/* Clients are large (their event logs): static, freed at the end of each test. */
static ht_client a, b, c, d, e, x;

static void finish(void)
{
    ht_client *all[] = {&a, &b, &c, &d, &e, &x};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ht_client_free(all[i]);
    ht_stop(&g);
}

Test(chat, a_request_that_extends_a_transcript_continues_it)
{
    ht_start(&g, NULL, "streaming");
    kvp_turn_opts o = {.max_tokens = 12};
    kvp_message m[3] = {msg(1, "Once upon a time")};
    int i = chat(&a, NULL, m, 1, &o);
    const kvp_turn_stats *s1 = &a.ev[i].stats;
    cr_assert_eq(a.ev[0].resumed, 0);
    cr_assert_eq(s1->cached_tokens, 0);
    cr_assert_eq(s1->prefilled_tokens, s1->context_tokens);
    cr_assert_gt(s1->context_tokens, 0);
    end(&a);   /* a's request is over: the session is free */

    m[1] = msg(0, a.ev[i].text);
    m[2] = msg(1, "The cat sat");
    int j = chat(&b, NULL, m, 3, &o);
    const kvp_turn_stats *s2 = &b.ev[j].stats;
    cr_assert_eq(b.ev[0].resumed, 1, "the conversation was not found");
    cr_assert_str_eq(b.ev[0].id, a.ev[0].id);
    cr_assert_geq(s2->cached_tokens, s1->transcript_tokens - 1,
                  "the earlier turns were recomputed");
    cr_assert_eq(s2->context_tokens, s2->cached_tokens + s2->prefilled_tokens);
    cr_assert_lt(s2->prefilled_tokens, 10, "more than the new message was prefilled");
    end(&b);

    /* The same first message with another reply is another conversation: prefilled whole. */
    m[1] = msg(0, "a reply the model never gave");
    int f = chat(&x, NULL, m, 3, &o);
    cr_assert_eq(x.ev[0].resumed, 0);
    cr_assert_str_neq(x.ev[0].id, a.ev[0].id);
    cr_assert_eq(x.ev[f].stats.cached_tokens, 0);
    cr_assert_eq(x.ev[f].stats.prefilled_tokens, x.ev[f].stats.context_tokens);
    cr_assert_gt(x.ev[f].stats.context_tokens, s2->prefilled_tokens + s1->context_tokens,
                 "the seeded history was not prefilled");
    end(&x);
    finish();
}

Test(chat, a_busy_session_is_not_matched_and_a_named_one_is_preferred)
{
    ht_start(&g, NULL, "streaming");
    kvp_turn_opts o = {.max_tokens = 6};
    kvp_message m[3] = {msg(1, "A dog ran")};
    int i = chat(&a, NULL, m, 1, &o);
    end(&a);
    m[1] = msg(0, a.ev[i].text);
    m[2] = msg(1, "Then it rained");
    /* b's turn runs long on the session; c with the same history gets a new one. */
    kvp_turn_opts longer = {.max_tokens = 200};
    ht_client_new(&g, &b);
    kvp_hub_chat(b.c, NULL, NULL, 0, m, 3, &longer);
    cr_assert_eq(b.ev[0].resumed, 1);
    int j = chat(&c, NULL, m, 3, &o);
    cr_assert_eq(c.ev[0].resumed, 0, "a busy session was matched");
    cr_assert_str_neq(c.ev[0].id, a.ev[0].id);
    cr_assert_eq(c.ev[j].stats.cached_tokens, 0);
    ht_wait(&g, &b, 1, KVP_HUB_DONE, 60);
    end(&b);
    end(&c);

    /* Two sessions hold the same history; the named one (the newer) is continued. */
    kvp_message one[3] = {msg(1, "Hello")};
    int i1 = chat(&d, NULL, one, 1, &o);
    end(&d);
    int i2 = chat(&e, NULL, one, 1, &o);
    end(&e);
    cr_assert_str_eq(d.ev[i1].text, e.ev[i2].text, "greedy replies differ");
    one[1] = msg(0, d.ev[i1].text);
    one[2] = msg(1, "again");
    ht_client_free(&x);
    chat(&x, e.ev[0].id, one, 3, &o);
    cr_assert_eq(x.ev[0].resumed, 1);
    cr_assert_str_eq(x.ev[0].id, e.ev[0].id, "the named session was not preferred");
    end(&x);
    finish();
}

/* A seed reproduces a sampled reply; top_p near 0 is greedy whatever the temperature. */
Test(chat, seed_and_top_p_apply_to_the_turn)
{
    ht_start(&g, NULL, "streaming");
    kvp_message m[1] = {msg(1, "Once upon a time")};
    kvp_turn_opts seeded = {.max_tokens = 16, .has_temperature = 1, .temperature = 1.5f,
                            .has_seed = 1, .seed = 42};
    kvp_turn_opts other = seeded;
    other.seed = 43;
    kvp_turn_opts greedy = {.max_tokens = 16};
    kvp_turn_opts narrow = {.max_tokens = 16, .has_temperature = 1, .temperature = 1.5f,
                            .has_top_p = 1, .top_p = 1e-6f};
    int ia = chat(&a, NULL, m, 1, &seeded), ib = chat(&b, NULL, m, 1, &seeded);
    int ic = chat(&c, NULL, m, 1, &other);
    int id = chat(&d, NULL, m, 1, &greedy), ie = chat(&e, NULL, m, 1, &narrow);
    cr_assert_str_eq(a.ev[ia].text, b.ev[ib].text, "the same seed drew another reply");
    cr_assert_str_neq(a.ev[ia].text, c.ev[ic].text, "the seed was not used");
    cr_assert_str_eq(d.ev[id].text, e.ev[ie].text, "top_p was not applied");
    end(&a);
    end(&b);
    end(&c);
    end(&d);
    end(&e);
    finish();
}

/* The system text is part of the conversation: a request under another one (or none) is
 * another conversation; under the same one it continues. */
Test(chat, the_system_text_is_part_of_the_match)
{
    ht_start(&g, NULL, "streaming");
    kvp_turn_opts o = {.max_tokens = 6};
    kvp_message m[3] = {msg(1, "A dog ran")};
    ht_client_new(&g, &a);
    kvp_hub_chat(a.c, NULL, "Be brief.", 9, m, 1, &o);
    cr_assert(a.ev[0].has_system);
    cr_assert_str_eq(a.ev[0].system, "Be brief.");
    int i = ht_wait(&g, &a, 1, KVP_HUB_DONE, 60);
    end(&a);
    m[1] = msg(0, a.ev[i].text);
    m[2] = msg(1, "Then?");
    ht_client_new(&g, &b);
    kvp_hub_chat(b.c, NULL, "Be long.", 8, m, 3, &o);   /* another system text */
    cr_assert_eq(b.ev[0].resumed, 0);
    ht_wait(&g, &b, 1, KVP_HUB_DONE, 60);
    end(&b);
    chat(&c, NULL, m, 3, &o);   /* none */
    cr_assert_eq(c.ev[0].resumed, 0);
    end(&c);
    ht_client_new(&g, &d);
    kvp_hub_chat(d.c, NULL, "Be brief.", 9, m, 3, &o);
    cr_assert_eq(d.ev[0].resumed, 1, "the same system text and history were not matched");
    cr_assert_str_eq(d.ev[0].id, a.ev[0].id);
    int j = ht_wait(&g, &d, 1, KVP_HUB_DONE, 60);
    cr_assert_gt(d.ev[j].stats.cached_tokens, 0);
    end(&d);
    finish();
}

/* A stop string ends the reply in the hub's turn: never streamed, and the session's
 * transcript tokens and cache end before it (the cut token's text re-tokenized), so the
 * request that sends the reply back continues the session. */
Test(chat, a_stop_string_cuts_the_transcript_and_the_cache)
{
    ht_start(&g, NULL, "streaming");
    kvp_turn_opts plain = {.max_tokens = 30};
    kvp_message m[3] = {msg(1, "Once upon a time")};
    int i = chat(&a, NULL, m, 1, &plain);
    end(&a);
    const char *full = a.ev[i].text;   /* greedy: ", there was a little girl named Lily..." */
    const char *lily = strstr(full, "Lily");
    cr_assert(lily, "%s", full);
    kvp_turn_opts o = {.max_tokens = 30, .stop = {"zzz", "Lily"}, .stop_len = {3, 4}, .n_stop = 2};
    int j = chat(&b, NULL, m, 1, &o);
    cr_assert_str_eq(b.ev[j].stats.stop, "stop");
    cr_assert_eq(strlen(b.ev[j].text), (size_t)(lily - full));
    cr_assert_eq(strncmp(b.ev[j].text, full, (size_t)(lily - full)), 0);
    char streamed[4096] = "";
    for (int k = 1; k < j; k++)
        strcat(streamed, b.ev[k].text);
    cr_assert_str_eq(streamed, b.ev[j].text, "the stop text was streamed");
    end(&b);
    /* The transcript as text ends where the reply does. */
    kvp_session *s = ht_session(&g, b.ev[0].id);
    cr_assert(s);
    char text[4096] = "";
    cr_assert_eq(s->tokens[0], g.model.tok.bos_id);
    for (int k = 1; k < s->n_tokens; k++) {   /* after BOS */
        size_t pl;
        const char *p = kvp_tokenizer_piece(&g.model.tok, s->tokens[k - 1], s->tokens[k], &pl);
        strncat(text, p, pl);
    }
    char want[4096];
    snprintf(want, sizeof want, "Once upon a time%s", b.ev[j].text);
    cr_assert_str_eq(text, want, "the transcript kept the stop text");
    /* the cache holds only tokens that stay */
    cr_assert_leq(s->n_cached, s->n_tokens);
    cr_assert_eq(s->cache.n_seen, s->n_cached);
    for (int h = 0; h < s->cache.n_layers * s->cache.n_kv_heads; h++)
        for (int r = 0; r < s->cache.heads[h].n; r++)
            cr_assert_lt(s->cache.heads[h].seq[r], s->n_cached);

    m[1] = msg(0, b.ev[j].text);
    m[2] = msg(1, "She liked cats");
    int k = chat(&c, NULL, m, 3, &plain);
    cr_assert_str_eq(c.ev[0].id, b.ev[0].id, "the cut reply was not matched");
    cr_assert_geq(c.ev[k].stats.cached_tokens, b.ev[j].stats.context_tokens);
    cr_assert_lt(c.ev[k].stats.prefilled_tokens, 10);
    end(&c);
    finish();
}

/* The .snap files in dir. */
static int snapshots(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert(d, "%s", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        n += l > 5 && !strcmp(e->d_name + l - 5, ".snap");
    }
    closedir(d);
    return n;
}

/* An ephemeral request (kvp_turn_opts.ephemeral: a Responses turn with store false) keeps
 * nothing: it names no session, forks the held conversation it extends instead of
 * continuing it, leaves that one exactly as it was (a later request continues it as if
 * the ephemeral turn had never run) and leaves no snapshot and no session behind; a
 * websocket message cannot be ephemeral. */
Test(chat, an_ephemeral_request_keeps_nothing_and_leaves_the_held_conversation_as_it_was)
{
    char dir[] = "/tmp/kvp-chat-XXXXXX";
    cr_assert(mkdtemp(dir));
    ht_start_forkable(&g, dir);
    kvp_turn_opts o = {.max_tokens = 12}, eo = o;
    eo.ephemeral = 1;
    kvp_message m[3] = {msg(1, "Once upon a time")};
    int i = chat(&a, NULL, m, 1, &o);
    const kvp_turn_stats *s1 = &a.ev[i].stats;
    end(&a);
    ht_settle(&g);
    char id[KVP_SESSION_ID_LEN + 1];
    snprintf(id, sizeof id, "%s", a.ev[0].id);
    kvp_session *held = ht_session(&g, id);
    cr_assert(held);
    int turns = held->turns_done, n_msgs = held->n_msgs, n_tokens = held->n_tokens;
    uint64_t hash = held->transcript_hash;
    kvp_hub_info info;
    kvp_hub_info_get(g.hub, &info);
    int resident = info.sessions_resident, parked = info.sessions_parked;
    cr_assert_eq(snapshots(dir), 1);

    m[1] = msg(0, a.ev[i].text);
    m[2] = msg(1, "The cat sat");
    ht_client_new(&g, &b);
    kvp_hub_chat(b.c, id, NULL, 0, m, 3, &eo);
    int j = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    cr_assert_eq(ht_find(&b, 0, KVP_HUB_SESSION), -1, "an ephemeral turn named its session");
    const kvp_turn_stats *s2 = &b.ev[j].stats;
    cr_assert_geq(s2->cached_tokens, s1->transcript_tokens - 1,
                  "the held conversation's cache was not forked (%d cached of %d, %d held)",
                  s2->cached_tokens, s2->context_tokens, s1->transcript_tokens);
    cr_assert_lt(s2->prefilled_tokens, 10, "more than the new message was prefilled");
    end(&b);
    ht_settle(&g);
    cr_assert_eq(ht_session(&g, id), held);
    cr_assert_eq(held->state, KVP_SESSION_IDLE);
    cr_assert_eq(held->turns_done, turns, "the ephemeral turn was the held session's");
    cr_assert_eq(held->n_msgs, n_msgs);
    cr_assert_eq(held->n_tokens, n_tokens);
    cr_assert_eq(held->transcript_hash, hash);
    kvp_hub_info_get(g.hub, &info);
    cr_assert_eq(info.sessions_resident, resident, "the ephemeral session stayed");
    cr_assert_eq(info.sessions_parked, parked);
    cr_assert_eq(snapshots(dir), 1, "the ephemeral turn wrote a snapshot");

    /* the held conversation is continued as before */
    int k = chat(&c, NULL, m, 3, &o);
    cr_assert_eq(c.ev[0].resumed, 1);
    cr_assert_str_eq(c.ev[0].id, id);
    cr_assert_geq(c.ev[k].stats.cached_tokens, s1->transcript_tokens - 1);
    end(&c);

    ht_client_new(&g, &x);
    kvp_hub_message_opts(x.c, "Hi", 2, &eo);
    cr_assert_eq(x.n, 1);
    cr_assert_eq(x.ev[0].type, KVP_HUB_ERROR);
    cr_assert_str_eq(x.ev[0].code, KVPD_E_BAD_REQUEST, "%s", x.ev[0].text);
    end(&x);
    finish();
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
