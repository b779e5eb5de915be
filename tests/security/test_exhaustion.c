/* Security: session exhaustion. One connection cannot lock others out
 * by opening sessions, sessions that never ran a turn do not pile up, and /admin/stats
 * pages its session list. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/daemon/harness.h"

TestSuite(exhaustion, .timeout = 120);

static const char *type_of(json_t *j)
{
    return json_string_value(json_object_get(j, "type"));
}

static json_int_t resident(const kvpd_proc *d)
{
    json_t *st = h_stats(d);
    cr_assert(st);
    json_int_t n = json_integer_value(json_object_get(json_object_get(st, "sessions"),
                                                      "resident"));
    json_decref(st);
    return n;
}

/* 64 hellos on one connection: each empty session ends as the next one starts, so one
 * stays and another client still gets in; a connection can hold at most
 * max_sessions_per_connection conversations. */
Test(exhaustion, one_connection_cannot_lock_others_out)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-sessions 16"), 0,   /* 8 per connection by default */
                 "log %s", d.log);
    ws_client a, b;
    cr_assert_eq(h_connect(&d, &a), 0);
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(ws_send_text(&a, "{\"type\":\"hello\"}"), 0);
        json_t *j = h_read_json(&a, 5000);
        cr_assert(j, "hello %d was not answered", i);
        cr_assert_str_eq(type_of(j), "session", "hello %d: %s", i,
                         json_string_value(json_object_get(j, "message")));
        json_decref(j);
    }
    cr_assert_eq(resident(&d), 1, "never-used sessions were kept");
    cr_assert_eq(h_connect(&d, &b), 0);
    cr_assert_eq(ws_send_text(&b, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(&b, "session", 5000);
    cr_assert(s, "another client was locked out");
    json_decref(s);
    json_t *done = h_turn(&b, "A frog sat.", 3, NULL);
    cr_assert(done);
    cr_assert_str_eq(type_of(done), "done");
    json_decref(done);
    /* Conversations: a's current session and 7 more, then the bound. */
    for (int i = 0; i < 8; i++) {
        if (i) {
            cr_assert_eq(ws_send_text(&a, "{\"type\":\"hello\"}"), 0);
            json_t *j = h_expect(&a, "session", 5000);
            cr_assert(j, "conversation %d", i);
            json_decref(j);
        }
        json_t *t = h_turn(&a, "A frog sat.", 2, NULL);
        cr_assert(t);
        cr_assert_str_eq(type_of(t), "done");
        json_decref(t);
    }
    cr_assert_eq(ws_send_text(&a, "{\"type\":\"hello\"}"), 0);
    json_t *e = h_read_json(&a, 5000);
    cr_assert(e);
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "overloaded");
    json_decref(e);
    cr_assert_eq(resident(&d), 9);
    /* A never-used session ends with its connection. */
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    cr_assert(s = h_expect(&c, "session", 5000));
    json_decref(s);
    cr_assert_eq(resident(&d), 10);
    ws_close(&c);
    for (int i = 0; i < 100 && resident(&d) != 9; i++)
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    cr_assert_eq(resident(&d), 9);
    ws_close(&a);
    ws_close(&b);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

static json_t *stats_page(const kvpd_proc *d, const char *query, int *status)
{
    char path[128], *body = NULL;
    snprintf(path, sizeof path, "/admin/stats%s", query);
    *status = h_get(d, path, h_admin_token(d), &body);
    json_t *j = *status == 200 && body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    return j;
}

/* session_list comes in pages: ?offset=N&limit=M (at most 1000, 100 by default). */
Test(exhaustion, admin_stats_pages_the_session_list)
{
    char dir[128], args[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--state-dir %s", dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    enum { N = 5 };
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
        json_t *s = h_expect(&c, "session", 5000);
        cr_assert(s);
        json_decref(s);
        json_t *done = h_turn(&c, "A frog sat.", 2, NULL);
        cr_assert(done);
        json_decref(done);
    }
    int st;
    json_t *p = stats_page(&d, "?limit=2", &st);
    cr_assert(p, "status %d", st);
    cr_assert_eq(json_array_size(json_object_get(p, "session_list")), 2);
    json_t *page = json_object_get(p, "session_page");
    cr_assert_eq(json_integer_value(json_object_get(page, "total")), N);
    cr_assert_eq(json_integer_value(json_object_get(page, "next_offset")), 2);
    json_decref(p);
    p = stats_page(&d, "?offset=4&limit=2", &st);
    cr_assert(p, "status %d", st);
    cr_assert_eq(json_array_size(json_object_get(p, "session_list")), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(p, "session_page"),
                                                    "next_offset")), -1);
    json_decref(p);
    p = stats_page(&d, "", &st);
    cr_assert(p);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(p, "session_page"),
                                                    "limit")), 100);
    json_decref(p);
    cr_assert_null(stats_page(&d, "?limit=abc", &st));
    cr_assert_eq(st, 400);
    cr_assert_null(stats_page(&d, "?limit=100000", &st));
    cr_assert_eq(st, 400);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(dir);
}
