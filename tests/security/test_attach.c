/* Security: a session wanted by two connections. The attachment
 * rule (docs/protocol.md): while a session's turn runs, or its snapshot loads, another
 * connection's hello is answered `busy` and the connection that started the job gets
 * its answer; while it is idle the newest connection takes it and the previous one is
 * told `unknown_session`. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "tests/daemon/harness.h"

TestSuite(attach, .timeout = 120);

static const char *type_of(json_t *j)
{
    return json_string_value(json_object_get(j, "type"));
}

static const char *code_of(json_t *j)
{
    return json_string_value(json_object_get(j, "code"));
}

static void hello(ws_client *c, const char *id)
{
    char msg[128];
    if (id)
        snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    else
        snprintf(msg, sizeof msg, "{\"type\":\"hello\"}");
    cr_assert_eq(ws_send_text(c, msg), 0);
}

/* A new session on c; its id into id. */
static void new_session(ws_client *c, char *id)
{
    hello(c, NULL);
    json_t *s = h_expect(c, "session", 5000);
    cr_assert(s);
    snprintf(id, 33, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
}

/* A second connection's hello during a turn does not take the turn away. */
Test(attach, hello_from_another_connection_during_a_turn_is_busy)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 400 --workers 1"), 0, "log %s", d.log);
    ws_client a, b;
    cr_assert_eq(h_connect(&d, &a), 0);
    cr_assert_eq(h_connect(&d, &b), 0);
    char id[33];
    new_session(&a, id);
    cr_assert_eq(ws_send_text(&a, "{\"type\":\"message\",\"text\":\"Once upon a time\","
                                  "\"max_tokens\":400}"), 0);
    json_t *t = h_expect(&a, "token", 5000);   /* the turn is running */
    cr_assert(t);
    json_decref(t);
    hello(&b, id);
    json_t *e = h_read_json(&b, 5000);
    cr_assert(e, "the second hello was not answered");
    cr_assert_str_eq(type_of(e), "error", "the second connection got '%s'", type_of(e));
    cr_assert_str_eq(code_of(e), "busy");
    json_decref(e);
    json_t *done = h_expect(&a, "done", 20000);
    cr_assert(done, "the connection that started the turn never got its done");
    json_int_t first = json_integer_value(json_object_get(json_object_get(done, "stats"),
                                                          "transcript_tokens"));
    json_decref(done);
    /* b saw nothing of the turn. */
    json_t *more = h_read_json(&b, 300);
    cr_assert_null(more, "the second connection got a '%s' frame", more ? type_of(more) : "");
    /* a's next message continues the same session (no new session frame). */
    cr_assert_eq(ws_send_text(&a, "{\"type\":\"message\",\"text\":\"The end.\","
                                  "\"max_tokens\":2}"), 0);
    for (;;) {
        done = h_read_json(&a, 10000);
        cr_assert(done, "no done for a's next message");
        cr_assert(!strcmp(type_of(done), "token") || !strcmp(type_of(done), "done"),
                  "a got '%s' (%s)", type_of(done), code_of(done));
        if (!strcmp(type_of(done), "done"))
            break;
        json_decref(done);
    }
    cr_assert_gt(json_integer_value(json_object_get(json_object_get(done, "stats"),
                                                    "transcript_tokens")), first,
                 "a's next message did not continue its session");
    json_decref(done);
    ws_close(&a);
    ws_close(&b);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* Idle: the newest connection takes the session, and the previous one is told
 * instead of silently starting a new session with its next message. */
Test(attach, an_idle_session_moves_and_the_old_connection_is_told)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    ws_client a, b;
    cr_assert_eq(h_connect(&d, &a), 0);
    cr_assert_eq(h_connect(&d, &b), 0);
    char id[33];
    new_session(&a, id);
    json_t *done = h_turn(&a, "A frog sat.", 4, NULL);
    cr_assert(done);
    json_decref(done);
    hello(&b, id);
    json_t *s = h_expect(&b, "session", 5000);
    cr_assert(s);
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 1);
    json_decref(s);
    json_t *e = h_read_json(&a, 5000);
    cr_assert(e, "the previous connection was not told");
    cr_assert_str_eq(type_of(e), "error");
    cr_assert_str_eq(code_of(e), "unknown_session");
    json_decref(e);
    ws_close(&a);
    ws_close(&b);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* Two hellos for a session that is only on disk: both answered, the first with
 * the session and the second busy while the snapshot loads, or, when the load ended
 * first, the newest with it and the other told (the attachment rule); five times. */
Test(attach, two_hellos_for_a_session_on_disk_are_both_answered)
{
    char dir[128], args[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--state-dir %s", dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    enum { N = 5 };
    char ids[N][33];
    for (int i = 0; i < N; i++) {
        ws_client c;
        cr_assert_eq(h_connect(&d, &c), 0);
        new_session(&c, ids[i]);
        json_t *done = h_turn(&c, "A frog sat.", 4, NULL);
        cr_assert(done);
        json_decref(done);
        ws_close(&c);
    }
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    for (int i = 0; i < N; i++) {
        ws_client a, b;
        cr_assert_eq(h_connect(&d, &a), 0);
        cr_assert_eq(h_connect(&d, &b), 0);
        hello(&a, ids[i]);
        hello(&b, ids[i]);
        json_t *ja = h_read_json(&a, 5000), *jb = h_read_json(&b, 5000);
        cr_assert(ja, "try %d: a's hello was never answered", i);
        cr_assert(jb, "try %d: b's hello was never answered", i);
        int a_won;
        if (!strcmp(type_of(ja), "session") && !strcmp(type_of(jb), "session")) {
            /* The load ended before the second hello was read: the idle session went to
             * the newest hello, and the connection it left is told so. */
            json_t *e = h_read_json(&a, 2000);
            a_won = !(e && !strcmp(type_of(e), "error"));
            if (a_won) {
                json_decref(e);
                e = h_read_json(&b, 2000);
            }
            cr_assert(e, "try %d: both got the session and neither was told it left", i);
            cr_assert_str_eq(type_of(e), "error");
            cr_assert_str_eq(code_of(e), "unknown_session", "try %d", i);
            json_decref(e);
        } else {
            /* The second hello came while the snapshot loaded: it is told busy. */
            a_won = !strcmp(type_of(ja), "session");
            json_t *won = a_won ? ja : jb, *lost = a_won ? jb : ja;
            cr_assert_str_eq(type_of(won), "session", "try %d: neither got the session", i);
            cr_assert_eq(json_integer_value(json_object_get(won, "turns")), 1);
            cr_assert_str_eq(type_of(lost), "error", "try %d", i);
            cr_assert_str_eq(code_of(lost), "busy");
        }
        json_decref(ja);
        json_decref(jb);
        json_t *done = h_turn(a_won ? &a : &b, "The end.", 2, NULL);   /* it holds it */
        cr_assert(done);
        cr_assert_str_eq(type_of(done), "done");
        json_decref(done);
        ws_close(&a);
        ws_close(&b);
    }
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(dir);
}
