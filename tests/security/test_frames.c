/* The websocket side of strict input: a client frame that is not masked fails the
 * connection (RFC 6455 5.1: a close frame with code 1002), wherever the
 * frame falls in the reads: alone, after good frames in the same write, split over
 * writes, or sent with the upgrade request. Masked frames keep working however they are
 * split or packed, and the daemon keeps serving the other clients. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"
#include "tests/security/seclib.h"

TestSuite(security_frames, .timeout = 90);

static const char HELLO[] = "{\"type\":\"hello\"}";

static void sleep_ms(int ms)
{
    nanosleep(&(struct timespec){0, (long)ms * 1000000L}, NULL);
}

/* An unmasked text frame (what a server sends; a client must not). */
static size_t unmasked_frame(unsigned char *out, const char *text)
{
    size_t n = strlen(text);
    out[0] = 0x81;
    out[1] = (unsigned char)n;   /* the tests' texts are under 126 bytes */
    memcpy(out + 2, text, n);
    return n + 2;
}

/* What the server did after a protocol violation: 1 for 1002 in a close frame (the
 * documented answer, docs/protocol.md); 0 when the connection stayed open or closed
 * without a close frame. Text frames before it are skipped. */
static int failed_with_1002(ws_client *c, int timeout_ms)
{
    char why[128];
    int code = sec_close_code(c, timeout_ms, why, sizeof why, NULL, 0);
    if (code == -1)
        return 0;
    if (code == 0) {
        cr_expect_fail("the connection closed without a close frame");
        return 0;
    }
    cr_expect_eq(code, 1002, "close code %d", code);
    return 1;
}

/* Another client is served as usual. */
static void others_are_served(const kvpd_proc *p)
{
    ws_client c;
    cr_assert_eq(h_connect(p, &c), 0);
    cr_assert_eq(ws_send_text(&c, HELLO), 0);
    json_t *s = h_expect(&c, "session", 10000);
    cr_expect(s, "a well-behaved client was not answered");
    json_decref(s);
    char *text = NULL;
    json_t *d = h_turn(&c, "Once upon a time", 4, &text);
    cr_expect(d && !strcmp(json_string_value(json_object_get(d, "type")), "done"));
    json_decref(d);
    free(text);
    ws_close(&c);
}

Test(security_frames, an_unmasked_frame_fails_the_connection)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    unsigned char f[160];
    size_t n = unmasked_frame(f, HELLO);
    cr_assert_eq(ws_send_raw(&c, f, n), 0);
    cr_expect(failed_with_1002(&c, 8000), "an unmasked frame was accepted");
    ws_close(&c);
    others_are_served(&p);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_frames, after_good_frames_in_the_same_read)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    /* A masked hello, a masked 200-byte message (16-bit length), then an unmasked frame,
     * all in one write. */
    unsigned char buf[1024];
    size_t n = ws_frame(buf, WS_TEXT, 1, HELLO, strlen(HELLO));
    char big[200];
    memset(big, ' ', sizeof big);
    memcpy(big, HELLO, strlen(HELLO));
    n += ws_frame(buf + n, WS_TEXT, 1, big, sizeof big);
    n += unmasked_frame(buf + n, "{\"type\":\"message\",\"text\":\"hi\"}");
    cr_assert_eq(ws_send_raw(&c, buf, n), 0);
    cr_expect(failed_with_1002(&c, 8000), "an unmasked frame after good ones was accepted");
    ws_close(&c);
    others_are_served(&p);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_frames, split_over_reads)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    /* A masked frame split after its first byte and inside its mask key, then an
     * unmasked one whose two header bytes come in separate writes. */
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    unsigned char buf[256];
    size_t n = ws_frame(buf, WS_TEXT, 1, HELLO, strlen(HELLO));
    size_t cuts[] = {1, 4, n};
    for (size_t i = 0, at = 0; i < 3; at = cuts[i++]) {
        cr_assert_eq(ws_send_raw(&c, buf + at, cuts[i] - at), 0);
        sleep_ms(30);
    }
    json_t *s = h_expect(&c, "session", 10000);
    cr_expect(s, "a masked hello split over three writes was not answered");
    json_decref(s);
    n = unmasked_frame(buf, "{\"type\":\"message\",\"text\":\"hi\"}");
    cr_assert_eq(ws_send_raw(&c, buf, 1), 0);
    sleep_ms(50);
    cr_assert_eq(ws_send_raw(&c, buf + 1, n - 1), 0);
    cr_expect(failed_with_1002(&c, 8000), "a split unmasked frame was accepted");
    ws_close(&c);
    others_are_served(&p);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_frames, masked_frames_of_every_length_and_packing_are_served)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    /* A 70000-byte message (64-bit length: too_large, not a close),
     * a fragmented hello and a ping, one byte per write for the hello. */
    size_t big_len = 70000;
    char *big = malloc(big_len);
    memset(big, 'x', big_len);
    unsigned char *buf = malloc(big_len + 64);
    size_t n = ws_frame(buf, WS_TEXT, 1, big, big_len);
    cr_assert_eq(ws_send_raw(&c, buf, n), 0);
    json_t *e = h_expect(&c, "error", 10000);
    cr_expect(e, "a masked 70000-byte frame was not answered");
    json_decref(e);
    n = ws_frame(buf, WS_TEXT, 0, HELLO, 5);
    n += ws_frame(buf + n, WS_PING, 1, "p", 1);
    n += ws_frame(buf + n, WS_CONT, 1, HELLO + 5, strlen(HELLO) - 5);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ws_send_raw(&c, buf + i, 1), 0);
    json_t *s = h_expect(&c, "session", 10000);
    cr_expect(s, "a fragmented hello sent byte by byte was not answered");
    json_decref(s);
    char *text = NULL;
    json_t *d = h_turn(&c, "Once upon a time", 8, &text);
    cr_expect(d && !strcmp(json_string_value(json_object_get(d, "type")), "done"));
    json_decref(d);
    free(text);
    free(big);
    free(buf);
    ws_close(&c);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_frames, frames_sent_with_the_upgrade_request)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    /* A client that does not wait for the 101 (RFC 6455 4.1): its bytes reach lws with
     * the request, before the frame guard knows where frames start: refused. */
    ws_client c = {0};
    char req[512];
    int len = snprintf(req, sizeof req,
                       "GET /chat HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                       "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                       "Sec-WebSocket-Version: 13\r\n\r\n", p.port);
    unsigned char buf[768];
    memcpy(buf, req, (size_t)len);
    size_t n = (size_t)len + unmasked_frame(buf + len, HELLO);
    c.fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p.port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert(c.fd >= 0 && connect(c.fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    cr_assert_eq(ws_send_raw(&c, buf, n), 0);
    /* Whatever comes back (a 101, then a close), no session frame. */
    char got[4096];
    size_t have = 0;
    double end = ws_now_ms() + 8000;
    int closed = 0;
    while (!closed && ws_now_ms() < end && have < sizeof got - 1) {
        struct pollfd pf = {c.fd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t k = recv(c.fd, got + have, sizeof got - 1 - have, 0);
        if (k <= 0)
            closed = 1;
        else
            have += (size_t)k;
    }
    got[have] = '\0';
    cr_expect(closed, "the connection stayed open");
    cr_expect(!memmem(got, have, "\"session\"", 9), "the unmasked hello was answered");
    ws_close(&c);
    others_are_served(&p);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

/* The close code the server answers a client's close frame with (-1: none came). */
static int close_answer(const kvpd_proc *p, const void *payload, size_t len)
{
    ws_client c;
    cr_assert_eq(h_connect(p, &c), 0);
    cr_assert_eq(ws_send_frame(&c, WS_CLOSE, 1, payload, len), 0);
    char why[128];
    int code = sec_close_code(&c, 5000, why, sizeof why, NULL, 0);
    ws_close(&c);
    return code;
}

Test(security_frames, an_invalid_close_code_is_answered_1002_not_echoed)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    const unsigned char c5000[] = {0x13, 0x88}, c999[] = {0x03, 0xe7}, c1015[] = {0x03, 0xf7},
                        c2000[] = {0x07, 0xd0}, one[] = {0x03}, c1000[] = {0x03, 0xe8, 'o', 'k'},
                        c4001[] = {0x0f, 0xa1};
    cr_expect_eq(close_answer(&p, c5000, 2), 1002);
    cr_expect_eq(close_answer(&p, c999, 2), 1002);
    cr_expect_eq(close_answer(&p, c1015, 2), 1002);
    cr_expect_eq(close_answer(&p, c2000, 2), 1002);
    cr_expect_eq(close_answer(&p, one, 1), 1002, "a one-byte close payload");
    cr_expect_eq(close_answer(&p, c1000, 4), 1000, "a normal close is echoed");
    cr_expect_eq(close_answer(&p, c4001, 2), 4001, "an application code is echoed");
    others_are_served(&p);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}
