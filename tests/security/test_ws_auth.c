/* With api_key set, a /chat websocket without a valid key on its upgrade must send
 * {"type":"auth","token":KEY} as its first frame (docs/protocol.md): anything else, a
 * wrong key, or 10 s of silence closes it with 1008 and a reason, before any turn. An
 * authenticated connection is its key's tenant: another key's session is unknown. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/daemon/harness.h"
#include "tests/security/seclib.h"

TestSuite(security_ws_auth, .timeout = 120);

#define KEYS "--api-key key-one,key-two"

static void expect_1008(ws_client *c, int timeout_ms, const char *what)
{
    char why[128], seen[256];
    int code = sec_close_code(c, timeout_ms, why, sizeof why, seen, sizeof seen);
    cr_expect_eq(code, 1008, "%s: close code %d (frames before: %s)", what, code, seen);
    cr_expect(why[0], "%s: the close has no reason", what);
    cr_expect(!strstr(seen, "session") && !strstr(seen, "token") && !strstr(seen, "done"),
              "%s: served before the close: %s", what, seen);
}

static int auth(ws_client *c, const char *key)
{
    char msg[128];
    snprintf(msg, sizeof msg, "{\"type\":\"auth\",\"token\":\"%s\"}", key);
    cr_assert_eq(ws_send_text(c, msg), 0);
    json_t *j = h_read_json(c, 5000);
    int ok = j && !strcmp(json_string_value(json_object_get(j, "type")) ?: "", "auth") &&
             json_is_true(json_object_get(j, "ok"));
    json_decref(j);
    return ok;
}

/* A new session's id over an authenticated connection, its turn done. */
static void new_session(ws_client *c, char *id)
{
    cr_assert_eq(ws_send_text(c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(c, "session", 5000);
    cr_assert(s, "no session frame");
    snprintf(id, 40, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    json_t *done = h_turn(c, "Once upon a time", 2, NULL);
    cr_assert(done);
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);
}

Test(security_ws_auth, a_keyless_client_is_closed_unless_it_authenticates_first)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, KEYS), 0, "log %s", d.log);
    ws_client c;
    /* hello or message first: closed, no session, no turn */
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    expect_1008(&c, 5000, "hello first");
    ws_close(&c);
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"hi\"}"), 0);
    expect_1008(&c, 5000, "message first");
    ws_close(&c);
    /* a wrong key, and a wrong key on the upgrade then none in the frame */
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"auth\",\"token\":\"key-on\"}"), 0);
    expect_1008(&c, 5000, "a wrong key");
    ws_close(&c);
    cr_assert_eq(ws_connect_headers(&c, "127.0.0.1", d.port, "/chat",
                                    "Authorization: Bearer wrong\r\n", 5000), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    expect_1008(&c, 5000, "a wrong key on the upgrade");
    ws_close(&c);
    /* the right key, then served */
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert(auth(&c, "key-two"), "the auth frame was not accepted");
    char id[40];
    new_session(&c, id);
    /* a second auth frame is refused, the connection kept */
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"auth\",\"token\":\"key-one\"}"), 0);
    json_t *e = h_expect(&c, "error", 5000);
    cr_assert(e, "a second auth frame was not refused");
    json_decref(e);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_ws_auth, malformed_first_frames_close_with_1008)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, KEYS), 0, "log %s", d.log);
    static const char *const bad[] = {
        "{\"type\":\"auth\"}",                       /* no token */
        "{\"type\":\"auth\",\"token\":42}",          /* wrong type */
        "{\"type\":\"auth\",\"token\":null}",
        "{\"type\":\"auth\",\"token\":\"key-one\"",  /* truncated */
        "{\"type\":\"auth\",\"token\":\"key-one\\u0000\"}",   /* a NUL after the key */
        "{\"type\":\"auth\",\"token\":\"key-one\",\"type\":\"auth\"}",   /* duplicate key */
        "[\"auth\",\"key-one\"]",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ws_client c;
        cr_assert_eq(h_connect(&d, &c), 0);
        cr_assert_eq(ws_send_text(&c, bad[i]), 0);
        expect_1008(&c, 5000, bad[i]);
        ws_close(&c);
    }
    /* a binary first frame, and an oversized one */
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_frame(&c, 0x2, 1, "{\"type\":\"auth\"}", 15), 0);
    expect_1008(&c, 5000, "binary");
    ws_close(&c);
    size_t big = 300000;
    char *huge = malloc(big + 64);
    cr_assert(huge);
    int n = snprintf(huge, 64, "{\"type\":\"auth\",\"token\":\"");
    memset(huge + n, 'k', big);
    strcpy(huge + n + big, "\"}");
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, huge), 0);
    expect_1008(&c, 5000, "oversized");
    ws_close(&c);
    free(huge);
    /* still serving */
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert(auth(&c, "key-one"));
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_ws_auth, silence_closes_after_10_seconds)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, KEYS), 0, "log %s", d.log);
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    double t0 = ws_now_ms();
    char why[128];
    int code = sec_close_code(&c, 20000, why, sizeof why, NULL, 0);
    double took = ws_now_ms() - t0;
    cr_expect_eq(code, 1008, "close code %d after %.0f ms", code, took);
    cr_expect(why[0], "no reason");
    cr_expect(took > 8000 && took < 15000, "closed after %.0f ms", took);
    ws_close(&c);
    /* a key on the upgrade needs no auth frame: no close for the silence */
    cr_assert_eq(ws_connect_headers(&c, "127.0.0.1", d.port, "/chat",
                                    "Authorization: Bearer key-one\r\n", 5000), 0);
    cr_expect_eq(sec_close_code(&c, 12000, why, sizeof why, NULL, 0), -1,
                 "a keyed upgrade was closed: %s", why);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_ws_auth, sessions_stay_with_the_key_of_the_auth_frame)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, KEYS), 0, "log %s", d.log);
    ws_client c;
    char id[40], buf[64];
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert(auth(&c, "key-one"));
    new_session(&c, id);
    ws_close(&c);
    /* the other key, by frame or header: unknown */
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert(auth(&c, "key-two"));
    cr_assert_str_eq(sec_hello_answer(&c, id, buf, sizeof buf), "unknown_session");
    ws_close(&c);
    cr_assert_eq(ws_connect_headers(&c, "127.0.0.1", d.port, "/chat",
                                    "Authorization: Bearer key-two\r\n", 5000), 0);
    cr_assert_str_eq(sec_hello_answer(&c, id, buf, sizeof buf), "unknown_session");
    ws_close(&c);
    /* the same session named in ?session= without a key: closed, never opened */
    char path[96];
    snprintf(path, sizeof path, "/chat?session=%s", id);
    cr_assert_eq(ws_connect(&c, "127.0.0.1", d.port, path, 5000), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    expect_1008(&c, 5000, "?session= without a key");
    ws_close(&c);
    /* the owner's key in the header gets it back */
    cr_assert_eq(ws_connect_headers(&c, "127.0.0.1", d.port, "/chat",
                                    "Authorization: Bearer key-one\r\n", 5000), 0);
    cr_assert_str_eq(sec_hello_answer(&c, id, buf, sizeof buf), "session");
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_ws_auth, without_keys_an_auth_frame_is_answered_and_nothing_is_required)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert(auth(&c, "anything"));
    char id[40];
    new_session(&c, id);
    ws_close(&c);
    cr_assert_eq(h_connect(&d, &c), 0);
    new_session(&c, id);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
