/* One API key (tenant) flooding one-shot requests must not crowd out another: at
 * max_sessions_per_tenant resident sessions (default with two or more keys: half of
 * max_sessions) a tenant's new session makes room among its own sessions only, least
 * recently used first, and when none of its own can go it is refused 429 with a
 * Retry-After, while the other tenant is still served. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/daemon/harness.h"

TestSuite(security_tenant_quota, .timeout = 180);

#define KA "Authorization: Bearer key-a\r\n"
#define KB "Authorization: Bearer key-b\r\n"

typedef struct answer {
    int status;
    char *raw;
    json_t *j;
    char session[64];
    char reply[512];
} answer;

static answer post(const kvpd_proc *p, const char *headers, const char *body)
{
    answer a = {0};
    const char *b = NULL;
    a.status = h_request(p->port, "POST", "/v1/chat/completions", headers, body, &a.raw, &b);
    cr_assert(a.raw, "no answer");
    a.j = b ? json_loads(b, 0, NULL) : NULL;
    snprintf(a.session, sizeof a.session, "%s", h_header(a.raw, "x-session-id:"));
    const char *r = json_string_value(json_object_get(json_object_get(
        json_array_get(json_object_get(a.j, "choices"), 0), "message"), "content"));
    snprintf(a.reply, sizeof a.reply, "%s", r ? r : "");
    return a;
}

static void answer_free(answer *a)
{
    json_decref(a->j);
    free(a->raw);
}

static const char FIRST[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":4}";

static char *second_turn(const char *reply)
{
    json_t *req = json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}], s:i}", "messages",
                            "role", "user", "content", "Once upon a time", "role",
                            "assistant", "content", reply, "role", "user", "content", "Then?",
                            "max_tokens", 4);
    char *s = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return s;
}

static void flood(const kvpd_proc *d, int n)
{
    for (int i = 0; i < n; i++) {
        char body[160];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Story %d: "
                 "a frog.\"}],\"max_tokens\":2}", i);
        answer a = post(d, KA, body);
        cr_assert_eq(a.status, 200, "request %d of the flood: %s", i, a.raw);
        answer_free(&a);
    }
}

/* B's idle conversation is the least recently used session of all when A floods: only
 * A's own sessions may make room for A's. */
static void b_survives(const char *args)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    answer b = post(&d, KB, FIRST);
    cr_assert_eq(b.status, 200, "%s", b.raw);
    flood(&d, 20);
    char *body = second_turn(b.reply);
    answer b2 = post(&d, KB, body);
    free(body);
    cr_assert_eq(b2.status, 200, "%s", b2.raw);
    cr_assert_str_eq(b2.session, b.session, "B's conversation was pushed out by A's flood");
    json_t *cached = json_object_get(json_object_get(json_object_get(b2.j, "usage"),
                                                     "prompt_tokens_details"), "cached_tokens");
    cr_assert_gt(json_integer_value(cached), 0, "%s", b2.raw);
    answer_free(&b);
    answer_free(&b2);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_tenant_quota, by_default_with_two_keys_a_flood_of_one_key_keeps_the_others_session)
{
    b_survives("--api-key key-a,key-b --max-sessions 8");
}

Test(security_tenant_quota, with_the_setting_a_flood_of_one_key_keeps_the_others_session)
{
    b_survives("--api-key key-a,key-b --max-sessions 8 --max-sessions-per-tenant 3");
}

Test(security_tenant_quota, a_tenant_whose_sessions_cannot_go_gets_429_and_the_other_is_served)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key key-a,key-b --max-sessions 8 "
                                "--max-sessions-per-tenant 2"), 0, "log %s", d.log);
    /* A's two websocket sessions stay attached: without a state dir they cannot go. */
    ws_client c[2];
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ws_connect_headers(&c[i], "127.0.0.1", d.port, "/chat", KA, 5000), 0);
        json_t *done = h_turn(&c[i], "A frog sat on a log.", 2, NULL);
        cr_assert(done);
        cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
        json_decref(done);
    }
    answer a = post(&d, KA, FIRST);
    cr_assert_eq(a.status, 429, "%s", a.raw);
    cr_assert(strstr(a.raw, "max_sessions_per_tenant"), "%s", a.raw);
    cr_assert_geq(atoi(h_header(a.raw, "retry-after:")), 1, "%s", a.raw);
    answer_free(&a);
    answer b = post(&d, KB, FIRST);
    cr_assert_eq(b.status, 200, "the other tenant was refused: %s", b.raw);
    answer_free(&b);
    /* A's own sessions are untouched: each takes another turn. */
    for (int i = 0; i < 2; i++) {
        json_t *done = h_turn(&c[i], "Then it jumped.", 2, NULL);
        cr_assert(done);
        cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
        json_decref(done);
        ws_close(&c[i]);
    }
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
