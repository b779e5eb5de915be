/* API keys are tenants: every model endpoint (the /chat websocket too) needs a key, a
 * session belongs to the key that made it (kept across a restart), and neither an id
 * nor a transcript reaches another tenant's session or prompt cache. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"
#include "tests/security/seclib.h"

TestSuite(security_tenants, .timeout = 120);

#define K1 "Authorization: Bearer key-one\r\n"
#define K2 "Authorization: Bearer key-two\r\n"
#define K3 "Authorization: Bearer key-from-file\r\n"

static int ws_keyed(const kvpd_proc *p, ws_client *c, const char *headers)
{
    return ws_connect_headers(c, "127.0.0.1", p->port, "/chat", headers, 5000);
}

/* Sends a hello: 1 when the answer is a close with 1008 and nothing else came. */
static int closed_1008_on_hello(ws_client *c)
{
    cr_assert_eq(ws_send_text(c, "{\"type\":\"hello\"}"), 0);
    char *payload = NULL;
    size_t len = 0;
    int op = ws_read(c, 5000, &payload, &len);
    int code = op == WS_CLOSE && len >= 2
                   ? ((unsigned char)payload[0] << 8 | (unsigned char)payload[1]) : 0;
    free(payload);
    return code == 1008;
}

Test(security_tenants, the_websocket_needs_a_key_and_sessions_stay_with_their_key)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key key-one,key-two"), 0, "log %s", d.log);
    ws_client c;
    /* Without a key (or with a wrong one) on the upgrade, a hello is not answered: the
     * first frame must be the auth frame, and the connection closes with 1008. */
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(closed_1008_on_hello(&c), 1, "a keyless websocket was served");
    ws_close(&c);
    cr_assert_eq(ws_connect_headers(&c, "127.0.0.1", d.port, "/chat",
                                    "Authorization: Bearer wrong\r\n", 5000), 0);
    cr_assert_eq(closed_1008_on_hello(&c), 1, "a websocket with a wrong key was served");
    ws_close(&c);
    sec_answer a = sec_post(&d, NULL, SEC_FIRST);
    cr_assert_eq(a.status, 401, "%s", a.raw);
    sec_answer_free(&a);

    a = sec_post(&d, K1, SEC_FIRST);
    cr_assert_eq(a.status, 200, "%s", a.raw);
    cr_assert(a.session[0]);
    char buf[64];
    /* Key two names key one's session over /chat: it does not exist for it. */
    cr_assert_eq(ws_keyed(&d, &c, K2), 0);
    cr_assert_str_eq(sec_hello_answer(&c, a.session, buf, sizeof buf), "unknown_session");
    ws_close(&c);
    /* Key one gets it back, with its history. */
    cr_assert_eq(ws_keyed(&d, &c, K1), 0);
    cr_assert_str_eq(sec_hello_answer(&c, a.session, buf, sizeof buf), "session");
    json_t *done = h_turn(&c, "The end.", 2, NULL);
    cr_assert(done);
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);
    ws_close(&c);
    sec_answer_free(&a);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_tenants, a_transcript_or_an_id_does_not_cross_tenants)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key key-one,key-two"), 0, "log %s", d.log);
    sec_answer a = sec_post(&d, K1, SEC_FIRST);
    cr_assert_eq(a.status, 200, "%s", a.raw);
    char *next = sec_second_turn(a.reply, NULL);
    /* Key two sends key one's exact transcript: a new session, nothing cached. */
    sec_answer b = sec_post(&d, K2, next);
    cr_assert_eq(b.status, 200, "%s", b.raw);
    cr_assert_str_neq(b.session, a.session, "another tenant's session id was handed out");
    json_t *u = json_object_get(json_object_get(b.j, "usage"), "prompt_tokens_details");
    cr_assert_eq(json_integer_value(json_object_get(u, "cached_tokens")), 0,
                 "another tenant's prompt cache was used: %s", b.raw);
    /* ... and naming key one's session id does not help. */
    char *named = sec_second_turn(a.reply, a.session);
    sec_answer n = sec_post(&d, K2, named);
    cr_assert_eq(n.status, 200, "%s", n.raw);
    cr_assert_str_neq(n.session, a.session, "a named session of another tenant was continued");
    /* Key one continues its own (found by its transcript: cached, and, not named, the id
     * is not answered again). */
    sec_answer c = sec_post(&d, K1, next);
    cr_assert_eq(c.status, 200, "%s", c.raw);
    u = json_object_get(json_object_get(c.j, "usage"), "prompt_tokens_details");
    cr_assert_gt(json_integer_value(json_object_get(u, "cached_tokens")), 0,
                 "the owner's conversation was not continued: %s", c.raw);
    cr_assert_eq(c.session[0], '\0', "%s", c.raw);
    sec_answer_free(&a);
    sec_answer_free(&b);
    sec_answer_free(&n);
    sec_answer_free(&c);
    free(next);
    free(named);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_tenants, keys_from_a_file_and_the_tenant_survives_a_restart)
{
    char dir[64], keys[128], args[512];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(keys, sizeof keys, "%s/keys", dir);
    FILE *f = fopen(keys, "w");
    cr_assert(f);
    fputs("# one key per line\n\nkey-from-file\n", f);
    fclose(f);
    snprintf(args, sizeof args, "--api-key key-two --api-key-file %s --state-dir %s", keys, dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    sec_answer a = sec_post(&d, K3, SEC_FIRST);
    cr_assert_eq(a.status, 200, "%s", a.raw);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    char *named = sec_second_turn(a.reply, a.session);
    sec_answer n = sec_post(&d, K2, named);
    cr_assert_eq(n.status, 200, "%s", n.raw);
    cr_assert_str_neq(n.session, a.session, "after a restart another tenant took the session");
    ws_client c;
    char buf[64];
    cr_assert_eq(ws_keyed(&d, &c, K2), 0);
    cr_assert_str_eq(sec_hello_answer(&c, a.session, buf, sizeof buf), "unknown_session");
    ws_close(&c);
    sec_answer o = sec_post(&d, K3, named);
    cr_assert_eq(o.status, 200, "%s", o.raw);
    cr_assert_str_eq(o.session, a.session, "the owner lost its session in the restart");
    sec_answer_free(&a);
    sec_answer_free(&n);
    sec_answer_free(&o);
    free(named);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(dir);
}

/* Without keys every client is one tenant: a stranger who sends another client's exact
 * transcript continues that conversation (its rows are reused), but is never handed its
 * session id, in a header or in the body, so it cannot attach to it over /chat; the
 * client that names the id it was given keeps it. */
Test(security_tenants, open_mode_never_hands_a_matched_sessions_id_out)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    sec_answer a = sec_post(&d, "", SEC_FIRST);
    cr_assert_eq(a.status, 200, "%s", a.raw);
    cr_assert_eq(strlen(a.session), 32, "the creator is given its session id: %s", a.raw);
    char *next = sec_second_turn(a.reply, NULL);
    sec_answer b = sec_post(&d, "", next);
    cr_assert_eq(b.status, 200, "%s", b.raw);
    json_t *u = json_object_get(json_object_get(b.j, "usage"), "prompt_tokens_details");
    cr_assert_gt(json_integer_value(json_object_get(u, "cached_tokens")), 0,
                 "the matched conversation was not continued: %s", b.raw);
    cr_assert_null(strstr(b.raw, a.session), "the stranger was handed the session id: %s",
                   b.raw);
    cr_assert_eq(b.session[0], '\0', "%s", b.raw);
    cr_assert(json_is_null(json_object_get(b.j, "session")), "%s", b.raw);
    cr_assert(json_is_null(json_object_get(json_object_get(b.j, "kvpd"), "session")), "%s",
              b.raw);
    /* streamed too: no chunk carries it */
    char *streamed = strdup(next);
    char *brace = strrchr(streamed, '}');
    *brace = '\0';
    char sbody[2048];
    snprintf(sbody, sizeof sbody, "%s,\"stream\":true,\"stream_options\":"
             "{\"include_usage\":true}}", streamed);
    free(streamed);
    sec_answer s = sec_post(&d, "", sbody);
    cr_assert_eq(s.status, 200, "%s", s.raw);
    cr_assert_null(strstr(s.raw, a.session), "a stream handed the session id out: %s", s.raw);
    /* the creator names its id: it is answered with it */
    char *named = sec_second_turn(a.reply, a.session);
    sec_answer n = sec_post(&d, "", named);
    cr_assert_eq(n.status, 200, "%s", n.raw);
    cr_assert_str_eq(n.session, a.session, "%s", n.raw);
    sec_answer_free(&a);
    sec_answer_free(&b);
    sec_answer_free(&s);
    sec_answer_free(&n);
    free(next);
    free(named);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
