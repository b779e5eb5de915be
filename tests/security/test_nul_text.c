/* One rule for NUL on both front ends: an escaped \u0000 in message text is accepted by
 * the websocket as by the API (texts go by their length), while a NUL in a message's
 * type or a session id is refused with a clear error and the connection keeps serving. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/daemon/harness.h"

TestSuite(security_nul_text, .timeout = 90);

Test(security_nul_text, the_websocket_accepts_an_escaped_nul_in_text_like_the_api)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\\u0000x\"}"), 0);
    json_t *e = h_expect(&c, "error", 5000);
    cr_assert(e, "a NUL in the type was not refused");
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "bad_request");
    json_decref(e);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"A frog\\u0000 sat.\","
                                  "\"max_tokens\":2}"), 0);
    json_t *done = NULL;
    for (int i = 0; i < 64 && !done; i++) {
        json_t *j = h_read_json(&c, 30000);
        cr_assert(j, "no answer to a text with a NUL");
        const char *t = json_string_value(json_object_get(j, "type"));
        cr_assert_str_neq(t, "error", "%s", json_string_value(json_object_get(j, "message")));
        if (!strcmp(t, "done"))
            done = j;
        else
            json_decref(j);
    }
    cr_assert(done);
    json_decref(done);
    /* the API takes the same text */
    char *raw = NULL;
    const char *b;
    int st = h_request(p.port, "POST", "/v1/chat/completions", NULL,
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"A frog\\u0000 sat.\"}],"
                       "\"max_tokens\":2}", &raw, &b);
    cr_assert_eq(st, 200, "%s", raw);
    free(raw);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}

/* The same rule for names, ids and repeated keys on both front ends: a NUL in the API's
 * role or session id is a 400 as a NUL in the websocket's type or session is
 * bad_request, and a key given twice is refused by both. */
Test(security_nul_text, both_front_ends_refuse_a_nul_in_an_id_and_a_repeated_key)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\",\"session\":"
                                  "\"0123456789abcdef\\u00000123456789abcde\"}"), 0);
    json_t *e = h_expect(&c, "error", 5000);
    cr_assert(e, "a NUL in the session id was not refused");
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "bad_request");
    json_decref(e);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"a\",\"text\":\"b\"}"), 0);
    e = h_expect(&c, "error", 5000);
    cr_assert(e, "a repeated key was not refused");
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "bad_json");
    json_decref(e);
    ws_close(&c);
    static const char *const bodies[] = {
        "{\"messages\":[{\"role\":\"user\\u0000\",\"content\":\"A frog.\"}],\"max_tokens\":2}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"A frog.\"}],\"max_tokens\":2,"
        "\"session\":\"0123456789abcdef\\u00000123456789abcde\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"content\":\"b\"}],"
        "\"max_tokens\":2}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        char *raw = NULL;
        const char *b;
        int st = h_request(p.port, "POST", "/v1/chat/completions", NULL, bodies[i], &raw, &b);
        cr_assert_eq(st, 400, "body %zu: %s", i, raw);
        free(raw);
    }
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}
