/* Integration: every protocol error, hostile frames and disconnects; after each the
 * connection (when it stays open) and the daemon keep serving. */
#include <criterion/criterion.h>
#include <string.h>
#include <time.h>

#include "tests/daemon/harness.h"

static kvpd_proc d;

static void start(void)
{
    cr_assert_eq(kvpd_start(&d, "--max-message-bytes 1024 --max-sessions 6 --max-tokens 200"), 0,
                 "kvpd did not start (log %s)", d.log);
}

static void stop(void)
{
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
}

TestSuite(errors, .init = start, .fini = stop, .timeout = 90);

static void expect_error(ws_client *c, const char *code)
{
    json_t *e = h_expect(c, "error", 5000);
    cr_assert(e, "no error frame (wanted %s)", code);
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), code);
    cr_assert(json_is_string(json_object_get(e, "message")));
    json_decref(e);
}

/* The connection still works: a short turn completes. */
static void expect_serving(ws_client *c)
{
    json_t *done = h_turn(c, "Tim ran.", 3, NULL);
    cr_assert(done, "no answer after the error");
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);
}

static void sleep_ms(int ms)
{
    nanosleep(&(struct timespec){0, ms * 1000000L}, NULL);
}

Test(errors, bad_json)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{not json"), 0);
    expect_error(&c, "bad_json");
    cr_assert_eq(ws_send_text(&c, "[1,2"), 0);
    expect_error(&c, "bad_json");
    /* Invalid UTF-8 inside a string is not JSON either. */
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"\xff\xfe\"}"), 0);
    expect_error(&c, "bad_json");
    expect_serving(&c);
    ws_close(&c);
}

Test(errors, bad_request)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    static const char *bad[] = {
        "{\"type\":\"dance\"}", "{\"text\":\"hi\"}", "[\"message\"]", "{\"type\":\"message\"}",
        "{\"type\":\"message\",\"text\":5}", "{\"type\":\"message\",\"text\":\"\"}",
        "{\"type\":\"message\",\"text\":\"hi\",\"max_tokens\":-1}",
        "{\"type\":\"message\",\"text\":\"hi\",\"max_tokens\":\"many\"}",
        "{\"type\":\"message\",\"text\":\"hi\",\"temperature\":-2}",
        "{\"type\":\"hello\",\"session\":42}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(ws_send_text(&c, bad[i]), 0);
        expect_error(&c, "bad_request");
    }
    expect_serving(&c);
    ws_close(&c);
}

Test(errors, busy_while_a_turn_runs)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"Once upon a time\",\"max_tokens\":150}"), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"again\"}"), 0);
    expect_error(&c, "busy");
    json_t *done = h_expect(&c, "done", 20000);   /* the first turn still completes */
    cr_assert(done);
    json_decref(done);
    expect_serving(&c);
    ws_close(&c);
}

Test(errors, too_large_frames_and_max_tokens)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    char big[4096];
    int n = snprintf(big, sizeof big, "{\"type\":\"message\",\"text\":\"");
    memset(big + n, 'a', 3000);
    snprintf(big + n + 3000, sizeof big - (size_t)n - 3000, "\"}");
    cr_assert_eq(ws_send_text(&c, big), 0);
    expect_error(&c, "too_large");
    /* The same, fragmented into three frames. */
    size_t len = strlen(big), third = len / 3;
    cr_assert_eq(ws_send_frame(&c, WS_TEXT, 0, big, third), 0);
    cr_assert_eq(ws_send_frame(&c, WS_CONT, 0, big + third, third), 0);
    cr_assert_eq(ws_send_frame(&c, WS_CONT, 1, big + 2 * third, len - 2 * third), 0);
    expect_error(&c, "too_large");
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"hi\",\"max_tokens\":100000}"), 0);
    expect_error(&c, "too_large");
    expect_serving(&c);
    ws_close(&c);
}

Test(errors, unknown_session)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\",\"session\":\"0123456789abcdef0123456789abcdef\"}"), 0);
    expect_error(&c, "unknown_session");
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\",\"session\":\"../../etc/passwd\"}"), 0);
    expect_error(&c, "unknown_session");
    expect_serving(&c);
    ws_close(&c);
}

Test(errors, overloaded_when_sessions_are_full)
{
    enum { MAX = 6 };
    ws_client c[MAX + 1];
    for (int i = 0; i < MAX; i++) {
        cr_assert_eq(h_connect(&d, &c[i]), 0);
        cr_assert_eq(ws_send_text(&c[i], "{\"type\":\"hello\"}"), 0);
        json_t *s = h_expect(&c[i], "session", 5000);
        cr_assert(s);
        json_decref(s);
    }
    cr_assert_eq(h_connect(&d, &c[MAX]), 0);
    cr_assert_eq(ws_send_text(&c[MAX], "{\"type\":\"hello\"}"), 0);
    expect_error(&c[MAX], "overloaded");
    cr_assert_eq(ws_send_text(&c[MAX], "{\"type\":\"message\",\"text\":\"hi\"}"), 0);
    expect_error(&c[MAX], "overloaded");
    expect_serving(&c[0]);   /* existing sessions are unaffected */
    for (int i = 0; i <= MAX; i++)
        ws_close(&c[i]);
}

Test(errors, binary_frames_are_refused)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_frame(&c, WS_BINARY, 1, "\x01\x02\x03", 3), 0);
    expect_error(&c, "bad_request");
    expect_serving(&c);
    ws_close(&c);
}

Test(errors, fragmented_message_is_reassembled)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    const char *msg = "{\"type\":\"message\",\"text\":\"The sun was hot.\",\"max_tokens\":3}";
    size_t len = strlen(msg);
    cr_assert_eq(ws_send_frame(&c, WS_TEXT, 0, msg, 10), 0);
    cr_assert_eq(ws_send_frame(&c, WS_CONT, 0, msg + 10, 10), 0);
    cr_assert_eq(ws_send_frame(&c, WS_CONT, 1, msg + 20, len - 20), 0);
    json_t *done = h_expect(&c, "done", 10000);
    cr_assert(done);
    json_decref(done);
    ws_close(&c);
}

Test(errors, half_sent_frame_does_not_block_others)
{
    ws_client slow, other;
    cr_assert_eq(h_connect(&d, &slow), 0);
    cr_assert_eq(h_connect(&d, &other), 0);
    const char *msg = "{\"type\":\"message\",\"text\":\"A bird sang.\",\"max_tokens\":3}";
    unsigned char frame[256];
    size_t n = ws_frame(frame, WS_TEXT, 1, msg, strlen(msg));
    cr_assert_eq(ws_send_raw(&slow, frame, 5), 0);   /* header and a byte of payload */
    sleep_ms(100);
    expect_serving(&other);
    cr_assert_eq(ws_send_raw(&slow, frame + 5, n - 5), 0);
    json_t *done = h_expect(&slow, "done", 10000);
    cr_assert(done, "the completed frame was not answered");
    json_decref(done);
    /* A frame cut off by a disconnect is simply dropped. */
    ws_client cut;
    cr_assert_eq(h_connect(&d, &cut), 0);
    cr_assert_eq(ws_send_raw(&cut, frame, n / 2), 0);
    ws_close(&cut);
    expect_serving(&other);
    ws_close(&slow);
    ws_close(&other);
}

Test(errors, disconnect_mid_generation_cancels_the_turn)
{
    ws_client c, other;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(h_connect(&d, &other), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"Once upon a time\",\"max_tokens\":200}"), 0);
    json_t *tok = h_expect(&c, "token", 10000);
    cr_assert(tok);
    json_decref(tok);
    ws_close(&c);
    expect_serving(&other);
    /* The orphaned turn ends (cancelled, or finished if it was quicker). */
    int idle = 0;
    for (int i = 0; i < 200 && !idle; i++) {
        char *body = NULL;
        cr_assert_eq(h_get(&d, "/metrics", NULL, &body), 200);
        idle = h_metric(body, "kvpd_turns_running") == 0;
        free(body);
        if (!idle)
            sleep_ms(20);
    }
    cr_assert(idle, "the disconnected client's turn kept running");
    ws_close(&other);
}

Test(errors, non_chat_websocket_path_is_refused)
{
    ws_client c;
    cr_assert_lt(ws_connect(&c, "127.0.0.1", d.port, "/elsewhere", 5000), 0);
    cr_assert_eq(h_connect(&d, &c), 0);
    expect_serving(&c);
    ws_close(&c);
}

Test(errors, cancel_at_any_point_always_ends_with_done)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"Sam and Max went out.\",\"max_tokens\":50}"), 0);
        if (i % 2)
            sleep_ms(i % 5);
        cr_assert_eq(ws_send_text(&c, "{\"type\":\"cancel\"}"), 0);
        json_t *done = h_expect(&c, "done", 10000);
        cr_assert(done, "turn %d: no done after cancel", i);
        json_decref(done);
    }
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"cancel\"}"), 0);   /* idle: ignored */
    expect_serving(&c);
    ws_close(&c);
}
