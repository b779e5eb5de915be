/* Log-probabilities of a reply through the hub: per generated token, the model's own
 * distribution (temperature 1, before penalties and biases), streamed with the token
 * events and whole with done, trimmed at a stop string's cut. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "sessions/residency.h"
#include "tests/sessions/hubtest.h"

static ht_hub g;

static const char *PROMPT = "Once upon a time";

/* One turn on a new session: returns the index of its done event in c. */
static int run(ht_client *c, const kvp_turn_opts *o)
{
    ht_client_new(&g, c);
    kvp_hub_message_opts(c->c, PROMPT, strlen(PROMPT), o);
    int d = ht_wait(&g, c, 0, KVP_HUB_DONE, 60);
    return d;
}

static const kvp_hub_logprob *entry(const ht_event *e, int i)
{
    return &e->lp[(size_t)i * (size_t)(1 + e->lp_top)];
}

/* The done event's tokens: the concatenation of their bytes is the reply, the streamed
 * entries are the same tokens in the same order, each once. */
static void check_consistent(const ht_client *c, int d)
{
    const ht_event *done = &c->ev[d];
    cr_assert(done->lp, "done carries the logprobs");
    char bytes[8192];
    size_t n = 0;
    for (int i = 0; i < done->n_lp; i++) {
        const kvp_hub_logprob *e = entry(done, i);
        cr_assert_lt(n + (size_t)e->len, sizeof bytes);
        memcpy(bytes + n, e->bytes, (size_t)e->len);
        n += (size_t)e->len;
    }
    cr_assert_eq(n, strlen(done->text), "the tokens' bytes spell the reply (%zu vs %zu)", n,
                 strlen(done->text));
    cr_assert(!memcmp(bytes, done->text, n));
    int streamed = 0;
    for (int k = 0; k < d; k++) {
        const ht_event *t = &c->ev[k];
        if (t->type != KVP_HUB_TOKEN || !t->lp)
            continue;
        for (int i = 0; i < t->n_lp; i++, streamed++) {
            cr_assert_lt(streamed, done->n_lp);
            cr_assert_eq(entry(t, i)->token, entry(done, streamed)->token);
            cr_assert_eq(entry(t, i)->logprob, entry(done, streamed)->logprob);
        }
    }
    cr_assert_leq(streamed, done->n_lp);
    cr_assert_geq(streamed, done->n_lp - 1, "all but the last tokens go out with the text");
    for (int i = 0; i < done->n_lp; i++) {
        const kvp_hub_logprob *e = entry(done, i);
        cr_assert_leq(e->logprob, 0.0f);
        double mass = 0.0;
        for (int j = 1; j <= done->lp_top; j++) {
            mass += exp((double)e[j].logprob);
            if (j > 1)
                cr_assert_geq(e[j - 1].logprob, e[j].logprob, "most likely first");
        }
        cr_assert_leq(mass, 1.0 + 1e-5, "token %d: alternatives' mass %g", i, mass);
    }
}

/* The reference: the model run over the whole transcript at once, log-softmax in double
 * of the logits before each reply token. */
static void check_against_model(const ht_event *done, const char *session)
{
    ht_settle(&g);
    kvp_session *s = ht_session(&g, session);
    cr_assert(s);
    const kvp_model_config *cfg = &g.model.cfg;
    int n = s->n_tokens, r0 = n - done->n_lp;
    cr_assert_gt(r0, 0);
    for (int i = 0; i < done->n_lp; i++)
        cr_assert_eq(s->tokens[r0 + i], entry(done, i)->token, "reply token %d", i);
    kvp_runstate rs;
    kvp_cache cache;
    cr_assert_eq(kvp_runstate_init(&rs, cfg, n), 0);
    cr_assert_eq(kvp_cache_init(&cache, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &cfg->rope), 0);
    float *all = malloc((size_t)n * (size_t)cfg->vocab_size * sizeof *all);
    cr_assert(all);
    cr_assert_eq(kvp_forward(&g.model, &rs, &cache, s->tokens, n, all), 0);
    for (int i = 0; i < done->n_lp; i++) {
        const float *l = all + (size_t)(r0 + i - 1) * (size_t)cfg->vocab_size;
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < cfg->vocab_size; v++)
            mx = l[v] > mx ? l[v] : mx;
        for (int v = 0; v < cfg->vocab_size; v++)
            sum += exp((double)l[v] - mx);
        double lse = mx + log(sum);
        const kvp_hub_logprob *e = entry(done, i);
        for (int j = 0; j <= done->lp_top; j++)
            cr_expect(fabs((double)e[j].logprob - ((double)l[e[j].token] - lse)) < 2e-3,
                      "token %d entry %d: %g, the model's %g", i, j, e[j].logprob,
                      (double)l[e[j].token] - lse);
    }
    free(all);
    kvp_cache_free(&cache);
    kvp_runstate_free(&rs);
}

Test(logprobs, greedy_reply_matches_the_model)
{
    ht_start(&g, NULL, "streaming");
    ht_client a;
    kvp_turn_opts o = {.max_tokens = 24, .has_temperature = 1, .temperature = 0.0f,
                       .logprobs = 1, .top_logprobs = 5};
    int d = run(&a, &o);
    const ht_event *done = &a.ev[d];
    cr_assert_str_eq(done->stats.stop, "length");
    cr_assert_eq(done->n_lp, 24);
    cr_assert_eq(done->lp_top, 5);
    check_consistent(&a, d);
    for (int i = 0; i < done->n_lp; i++) {
        const kvp_hub_logprob *e = entry(done, i);
        cr_assert_eq(e[1].token, e[0].token, "greedy: the most likely is the one drawn (%d)", i);
        cr_assert_eq(e[1].logprob, e[0].logprob);
    }
    check_against_model(done, a.ev[0].id);
    kvp_hub_close(a.c);
    ht_client_free(&a);
    ht_stop(&g);
}

/* The values are the model's: a temperature, a penalty and a bias that bans the greedy
 * first token change the draw, not the first token's distribution. */
Test(logprobs, before_penalties_and_biases)
{
    ht_start(&g, NULL, "streaming");
    ht_client a, b;
    kvp_turn_opts o = {.max_tokens = 4, .has_temperature = 1, .temperature = 0.0f,
                       .logprobs = 1, .top_logprobs = 20};
    int da = run(&a, &o);
    const kvp_hub_logprob *ga = entry(&a.ev[da], 0);
    kvp_logit_bias ban = {ga[0].token, -100.0f};
    kvp_turn_opts p = o;
    p.temperature = 1.3f;
    p.has_seed = 1;
    p.seed = 7;
    p.sampling = (kvp_sample_opts){.presence_penalty = 2.0f, .frequency_penalty = 1.0f,
                                   .bias = &ban, .n_bias = 1};
    int db = run(&b, &p);
    const kvp_hub_logprob *gb = entry(&b.ev[db], 0);
    cr_assert_neq(gb[0].token, ga[0].token, "the banned token is not drawn");
    for (int j = 1; j <= 20; j++) {
        cr_assert_eq(gb[j].token, ga[j].token, "alternative %d", j);
        cr_assert_eq(gb[j].logprob, ga[j].logprob, "alternative %d", j);
    }
    cr_assert_eq(gb[1].token, ga[0].token, "the banned token is still the model's most likely");
    check_consistent(&b, db);
    kvp_hub_close(a.c);
    kvp_hub_close(b.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_stop(&g);
}

/* A stop string cuts the reply: the logprobs are those of the tokens whose text is
 * returned. */
Test(logprobs, trimmed_at_a_stop_string)
{
    ht_start(&g, NULL, "streaming");
    ht_client a, b;
    kvp_turn_opts o = {.max_tokens = 24, .has_temperature = 1, .temperature = 0.0f,
                       .logprobs = 1, .top_logprobs = 2};
    int da = run(&a, &o);
    const ht_event *full = &a.ev[da];
    /* the stop string: the 3 bytes that start at the end of the 5th token, cutting
     * inside the 6th or later */
    size_t at = 0;
    for (int i = 0; i < 5; i++)
        at += (size_t)entry(full, i)->len;
    cr_assert_lt(at + 3, strlen(full->text));
    char stop[4];
    memcpy(stop, full->text + at + 1, 3);
    stop[3] = '\0';
    cr_assert_eq(strstr(full->text, stop), full->text + at + 1,
                 "the stop string first appears where it is cut");
    kvp_turn_opts p = o;
    p.stop[0] = stop;
    p.stop_len[0] = 3;
    p.n_stop = 1;
    int db = run(&b, &p);
    const ht_event *cut = &b.ev[db];
    cr_assert_str_eq(cut->stats.stop, "stop");
    size_t len = strlen(cut->text);
    cr_assert_eq(len, at + 1, "the reply ends before the stop string");
    /* the tokens wholly within the returned text */
    int want = 0;
    size_t end = 0;
    while (want < full->n_lp && end + (size_t)entry(full, want)->len <= len)
        end += (size_t)entry(full, want++)->len;
    cr_assert_eq(cut->n_lp, want, "%d tokens returned, %d logprobs", want, cut->n_lp);
    for (int i = 0; i < cut->n_lp; i++)
        cr_assert_eq(entry(cut, i)->token, entry(full, i)->token);
    int streamed = 0;
    for (int k = 0; k < db; k++)
        if (b.ev[k].type == KVP_HUB_TOKEN)
            streamed += b.ev[k].n_lp;
    cr_assert_leq(streamed, cut->n_lp, "no logprobs of cut text were streamed");
    kvp_hub_close(a.c);
    kvp_hub_close(b.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_stop(&g);
}

Test(logprobs, none_unless_asked_and_top_bounded)
{
    ht_start(&g, NULL, "streaming");
    ht_client a, b, c;
    kvp_turn_opts o = {.max_tokens = 4, .has_temperature = 1, .temperature = 0.0f};
    int d = run(&a, &o);
    for (int k = 0; k <= d; k++)
        cr_assert_null(a.ev[k].lp);
    kvp_turn_opts p = o;
    p.logprobs = 1;
    p.top_logprobs = KVP_LOGPROBS_MAX_TOP + 1;
    ht_client_new(&g, &b);
    kvp_hub_message_opts(b.c, PROMPT, strlen(PROMPT), &p);
    int e = ht_wait(&g, &b, 0, KVP_HUB_ERROR, 10);
    cr_assert_str_eq(b.ev[e].code, KVPD_E_BAD_REQUEST);
    cr_assert(strstr(b.ev[e].text, "top_logprobs"), "%s", b.ev[e].text);
    p.top_logprobs = 0;
    d = run(&c, &p);
    cr_assert_eq(c.ev[d].lp_top, 0);
    cr_assert_eq(c.ev[d].n_lp, 4);
    check_consistent(&c, d);
    kvp_hub_close(a.c);
    kvp_hub_close(b.c);
    kvp_hub_close(c.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_client_free(&c);
    ht_stop(&g);
}

/* The memory cap reserves a logprob turn's buffers (max_tokens x (1 + top) entries, a
 * vocabulary-sized row) with its cache: with room for a turn's cache and half of those
 * buffers, a turn asking for 20 alternatives of 256 tokens is refused, a plain one is
 * admitted. */
Test(logprobs, buffers_count_in_the_memory_cap)
{
    ht_start(&g, NULL, "streaming");
    const int vocab = g.model.cfg.vocab_size;
    size_t lp = kvp_session_logprobs_bytes(256, vocab, 20);
    cr_assert_geq(lp, (size_t)256 * 21 * sizeof(kvp_hub_logprob) + (size_t)vocab * sizeof(float));
    size_t turn = kvp_hub_turn_bytes(g.hub);
    g.cfg.max_cache_bytes = turn + lp / 2;
    ht_client a, b;
    kvp_turn_opts o = {.max_tokens = 256, .has_temperature = 1, .temperature = 0.0f,
                       .logprobs = 1, .top_logprobs = 20};
    ht_client_new(&g, &a);
    kvp_hub_message_opts(a.c, PROMPT, strlen(PROMPT), &o);
    int e = ht_wait(&g, &a, 0, KVP_HUB_ERROR, 10);
    cr_assert_str_eq(a.ev[e].code, KVPD_E_OVERLOADED);
    cr_assert(strstr(a.ev[e].text, "memory cap"), "%s", a.ev[e].text);
    cr_assert_eq(ht_find(&a, 0, KVP_HUB_DONE), -1);
    kvp_turn_opts p = o;
    p.logprobs = 0;
    p.top_logprobs = 0;
    ht_client_new(&g, &b);
    kvp_hub_message_opts(b.c, PROMPT, strlen(PROMPT), &p);
    int d = ht_wait(&g, &b, 0, KVP_HUB_DONE, 60);
    cr_assert_eq(ht_find(&b, 0, KVP_HUB_ERROR), -1, "the plain turn is admitted");
    cr_assert_null(b.ev[d].lp);
    kvp_hub_close(a.c);
    kvp_hub_close(b.c);
    ht_client_free(&a);
    ht_client_free(&b);
    ht_stop(&g);
}

/* While a logprob turn runs, the bytes the cap counts are its cache's reservation plus
 * its buffers; when it ends, only its cache. */
Test(logprobs, accounted_bytes_hold_the_buffers)
{
    ht_start(&g, NULL, "streaming");
    const int vocab = g.model.cfg.vocab_size;
    size_t turn = kvp_hub_turn_bytes(g.hub);
    ht_client a;
    kvp_turn_opts o = {.max_tokens = 64, .has_temperature = 1, .temperature = 0.0f,
                       .logprobs = 1, .top_logprobs = 20};
    ht_client_new(&g, &a);
    kvp_hub_message_opts(a.c, PROMPT, strlen(PROMPT), &o);
    /* admitted and queued now; the worker has not ended it before the loop runs */
    size_t lp = kvp_session_logprobs_bytes(64, vocab, 20);
    cr_assert_geq(lp, (size_t)64 * 21 * sizeof(kvp_hub_logprob) + (size_t)vocab * sizeof(float));
    cr_assert_eq(kvp_hub_accounted_bytes(g.hub, NULL, NULL), turn + lp, "%zu counted, %zu + %zu",
                 kvp_hub_accounted_bytes(g.hub, NULL, NULL), turn, lp);
    int d = ht_wait(&g, &a, 0, KVP_HUB_DONE, 60);
    cr_assert_gt(a.ev[d].n_lp, 0);
    ht_settle(&g);
    size_t actual;
    cr_assert_eq(kvp_hub_accounted_bytes(g.hub, &actual, NULL), actual, "idle: its cache alone");
    kvp_hub_close(a.c);
    ht_client_free(&a);
    ht_stop(&g);
}
