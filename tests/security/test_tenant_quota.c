/* One API key (tenant) flooding one-shot requests must not crowd out another: at
 * max_sessions_per_tenant resident sessions (default with two or more keys: half of
 * max_sessions) a tenant's new session makes room among its own sessions only, least
 * recently used first, and when none of its own can go it is refused 429 with a
 * Retry-After, while the other tenant is still served. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"
#include "tests/security/seclib.h"

TestSuite(security_tenant_quota, .timeout = 180);

#define KA "Authorization: Bearer key-a\r\n"
#define KB "Authorization: Bearer key-b\r\n"

/* B's idle conversation is the least recently used session of all when A floods: only
 * A's own sessions may make room for A's. */
static void b_survives(const char *args)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    sec_answer b = sec_post(&d, KB, SEC_FIRST);
    cr_assert_eq(b.status, 200, "%s", b.raw);
    sec_flood(&d, KA, 0, 20);
    sec_assert_resumes(&d, KB, &b, 0, "B's conversation after A's flood");
    sec_answer_free(&b);
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
    sec_answer a = sec_post(&d, KA, SEC_FIRST);
    cr_assert_eq(a.status, 429, "%s", a.raw);
    cr_assert(strstr(a.raw, "max_sessions_per_tenant"), "%s", a.raw);
    cr_assert_geq(atoi(h_header(a.raw, "retry-after:")), 1, "%s", a.raw);
    sec_answer_free(&a);
    sec_answer b = sec_post(&d, KB, SEC_FIRST);
    cr_assert_eq(b.status, 200, "the other tenant was refused: %s", b.raw);
    sec_answer_free(&b);
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

/* Bytes per tenant (max_cache_bytes_per_tenant): one key's sessions, attached and so
 * never dropped without a state dir, must not take the whole max_cache_bytes. */

static json_int_t memory_stat(const kvpd_proc *d, const char *name)
{
    json_t *st = h_stats(d);
    cr_assert(st, "no /admin/stats");
    json_int_t v = json_integer_value(json_object_get(json_object_get(st, "memory"), name));
    json_decref(st);
    return v;
}

/* A long prompt: the session's cache fills to the budget. */
static const char LONG[] =
    "Once upon a time there was a little girl named Lily. She liked to play in the park "
    "with her red ball. One day she saw a big dog near the old tree. The dog was sad "
    "because it had lost its bone. Lily wanted to help the dog, so she looked under the "
    "bench, behind the swings and near the pond. At last she found the bone in the sand. "
    "The dog was very happy and wagged its tail. Lily and the dog became best friends and "
    "they played together every day after school until the sun went down.";

/* A's websocket session i: one turn of the long prompt; 1 when it was done, 0 when it
 * was refused overloaded (why: its message). */
static int a_session(const kvpd_proc *d, ws_client *c, char *why, size_t n)
{
    cr_assert_eq(ws_connect_headers(c, "127.0.0.1", d->port, "/chat", KA, 5000), 0);
    json_t *done = h_turn(c, LONG, 1, NULL);
    cr_assert(done, "no answer to A's turn");
    const char *t = json_string_value(json_object_get(done, "type"));
    int ok = !strcmp(t, "done");
    if (!ok) {
        cr_assert_str_eq(json_string_value(json_object_get(done, "code")), "overloaded");
        snprintf(why, n, "%s", json_string_value(json_object_get(done, "message")));
    }
    json_decref(done);
    return ok;
}

/* One idle A session's accounted bytes (I) and one turn's reservation (T), measured. */
static void measure(json_int_t *idle, json_int_t *turn)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key key-a,key-b --max-sessions 64"), 0, "log %s", d.log);
    ws_client c;
    char why[256];
    cr_assert(a_session(&d, &c, why, sizeof why));
    *idle = memory_stat(&d, "accounted_bytes");
    *turn = memory_stat(&d, "turn_reserve_bytes");
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    cr_assert_gt(*idle, 0);
    cr_assert_gt(*turn, 0);
}

/* The default with two keys and a max_cache_bytes: half of it per key. The global cap
 * fits four of A's sessions and not a fifth turn, so without a bound per key B's new
 * conversation would find the cache full of A's attached sessions. */
Test(security_tenant_quota, by_default_a_key_attached_sessions_leave_room_for_another_key)
{
    json_int_t idle, turn;
    measure(&idle, &turn);
    cr_assert_gt(idle * 7, turn * 2, "the setup needs an idle session of over 2/7 of a turn "
                 "(%lld, turn %lld)", (long long)idle, (long long)turn);
    long long cap = 3 * idle + turn + idle / 2;
    char args[256];
    snprintf(args, sizeof args, "--api-key key-a,key-b --max-sessions 64 --max-cache-bytes %lld",
             cap);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    ws_client c[4];
    char why[256];
    int served = 0;
    for (int i = 0; i < 4; i++)
        served += a_session(&d, &c[i], why, sizeof why);
    cr_assert_lt(served, 4, "all of A's sessions were served: no bound per key");
    cr_assert(strstr(why, "max_cache_bytes_per_tenant"), "%s", why);
    sec_answer b = sec_post(&d, KB, SEC_FIRST);
    cr_assert_eq(b.status, 200, "B's new conversation was refused after A's: %s", b.raw);
    sec_answer_free(&b);
    for (int i = 0; i < 4; i++)
        ws_close(&c[i]);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* The setting: A's sessions fit while they stay under it, the next turn of A is refused
 * (its sessions are attached: none can go), B is served, and A's own sessions still take
 * turns within the bound. */
Test(security_tenant_quota, a_key_over_its_bytes_is_refused_and_the_other_key_is_served)
{
    json_int_t idle, turn;
    measure(&idle, &turn);
    long long per = 2 * idle + turn, cap = 8 * idle + 4 * turn;
    char args[320];
    snprintf(args, sizeof args, "--api-key key-a,key-b --max-sessions 64 --max-cache-bytes %lld "
             "--max-cache-bytes-per-tenant %lld", cap, per);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    ws_client c[4];
    char why[256] = "";
    for (int i = 0; i < 3; i++)
        cr_assert(a_session(&d, &c[i], why, sizeof why), "A's session %d: %s", i, why);
    cr_assert(!a_session(&d, &c[3], why, sizeof why), "A's fourth session passed its bound");
    cr_assert(strstr(why, "max_cache_bytes_per_tenant"), "%s", why);
    sec_answer b = sec_post(&d, KB, SEC_FIRST);
    cr_assert_eq(b.status, 200, "%s", b.raw);
    sec_answer_free(&b);
    /* the refusal over the API: 429, naming the setting */
    sec_answer a = sec_post(&d, KA, SEC_FIRST);
    cr_assert_eq(a.status, 429, "%s", a.raw);
    cr_assert(strstr(a.raw, "max_cache_bytes_per_tenant"), "%s", a.raw);
    sec_answer_free(&a);
    for (int i = 0; i < 3; i++) {
        json_t *done = h_turn(&c[i], "Then?", 1, NULL);
        cr_assert(done);
        cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done",
                         "A's own session %d lost its turn", i);
        json_decref(done);
    }
    for (int i = 0; i < 4; i++)
        ws_close(&c[i]);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* 1 when session id is in memory (listed and not parked). */
static int resident_id(const kvpd_proc *d, const char *id)
{
    json_t *st = h_stats(d);
    cr_assert(st);
    json_t *list = json_object_get(st, "session_list"), *e;
    size_t i;
    int found = 0;
    json_array_foreach(list, i, e)
        if (!strcmp(json_string_value(json_object_get(e, "id")) ?: "", id))
            found = !json_is_true(json_object_get(e, "parked"));
    json_decref(st);
    return found;
}

/* With a state dir A's own least recently used idle sessions are parked instead: A is
 * served, and B's session, older than all of A's (the global LRU), stays in memory,
 * where without the bound A's turns would park it. */
Test(security_tenant_quota, with_a_state_dir_a_key_over_its_bytes_parks_its_own)
{
    json_int_t idle, turn;
    measure(&idle, &turn);
    char dir[64], args[384];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    long long per = 2 * idle + turn, cap = 3 * idle + turn + idle / 2;
    snprintf(args, sizeof args, "--api-key key-a,key-b --max-sessions 64 --max-cache-bytes %lld "
             "--max-cache-bytes-per-tenant %lld --state-dir %s", cap, per, dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    sec_answer b = sec_post(&d, KB, SEC_FIRST);
    cr_assert_eq(b.status, 200, "%s", b.raw);
    ws_client c[5];
    char why[256] = "";
    for (int i = 0; i < 5; i++) {
        cr_assert(a_session(&d, &c[i], why, sizeof why), "A's session %d: %s", i, why);
        ws_close(&c[i]);   /* left: parkable */
    }
    cr_assert(resident_id(&d, b.session), "B's session was parked to make room for A's");
    char *body = sec_second_turn(b.reply, NULL);
    sec_answer b2 = sec_post(&d, KB, body);
    free(body);
    cr_assert_eq(b2.status, 200, "%s", b2.raw);
    /* continued, found by its transcript: cached, and no id answered (a new session would
     * name its own) */
    cr_assert_eq(b2.session[0], '\0', "%s", b2.raw);
    cr_assert_gt(json_integer_value(json_object_get(json_object_get(json_object_get(b2.j,
                     "usage"), "prompt_tokens_details"), "cached_tokens")), 0, "%s", b2.raw);
    sec_answer_free(&b);
    sec_answer_free(&b2);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(dir);
}

Test(security_tenant_quota, a_bytes_bound_below_one_turn_or_malformed_is_refused)
{
    static const char *const bad[] = {"1k", "-5", "lots", "1.5M", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[128];
        snprintf(args, sizeof args, "--api-key key-a,key-b --max-cache-bytes-per-tenant %s",
                 bad[i]);
        kvpd_proc d;
        if (kvpd_spawn(&d, args) == 0) {
            int rc = kvpd_wait(&d, 20000);
            cr_assert_neq(rc, 0, "started with max_cache_bytes_per_tenant '%s'", bad[i]);
        }
        cr_assert(kvpd_log_has(&d, "max_cache_bytes_per_tenant") ||
                  kvpd_log_has(&d, "max-cache-bytes-per-tenant"), "'%s': log %s", bad[i], d.log);
        unlink(d.log);
    }
}
