/* Oversized and refused bodies (web/http.c, web/wsguard.c): a client that sends a body
 * the daemon refuses (413 over max_body_bytes, 404 on no such path, 405, a GET with a
 * body) must read the answer, every time, instead of a connection reset: the daemon reads
 * and drops the body up to its Content-Length before it closes. A client that promises a
 * body and stalls is cut off within the time bound, one that promises more than the
 * hard cap is answered and closed at once, and others are served meanwhile. */
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

#include "base/clock.h"
#include "tests/daemon/harness.h"
#include "web/conn.h"

TestSuite(big_body, .timeout = 120);

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect");
    return fd;
}

/* Sends the header and len bytes of body, then reads the answer; its status (-1: none
 * came), or -2 when the body could not all be sent (the connection was reset under it:
 * what an HTTP client such as Node's fetch reports as a failed request, whatever the
 * answer), and the answer in *answer (malloc'd). */
static int send_body(int port, const char *method, const char *path, size_t len, char **answer)
{
    int fd = dial(port);
    char head[512];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", method,
                     path, len);
    char *body = malloc(len);
    cr_assert(body);
    memset(body, ' ', len);
    body[0] = '{';
    ssize_t w = send(fd, head, (size_t)n, MSG_NOSIGNAL);
    size_t sent = 0;
    while (w > 0 && sent < len) {
        while ((w = send(fd, body + sent, len - sent, MSG_NOSIGNAL)) < 0 && errno == EINTR)
            ;
        if (w > 0)
            sent += (size_t)w;
    }
    free(body);
    size_t got;
    char *buf = h_read_all(fd, 20000, &got);
    close(fd);
    int status = -1;
    if (buf)
        sscanf(buf, "HTTP/1.1 %d", &status);
    *answer = buf;
    if (sent < len)
        return -2;
    return status;
}

static void expect_code(const char *raw, const char *code)
{
    const char *b = raw ? strstr(raw, "\r\n\r\n") : NULL;
    json_t *j = b ? json_loads(b + 4, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    const char *got = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    cr_expect(got && !strcmp(got, code), "code %s, want %s: %s", got ? got : "(none)", code,
              raw ? raw : "(no answer)");
    json_decref(j);
}

Test(big_body, an_oversized_body_gets_its_413_twenty_times_of_twenty)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-body-bytes 1048576"), 0, "log %s", d.log);
    int ok = 0;
    for (int i = 0; i < 20; i++) {
        char *raw = NULL;
        size_t len = (size_t)(2 + i % 7) << 20;   /* 2 to 8 MB */
        int st = send_body(d.port, "POST", i & 1 ? "/v1/completions" : "/v1/chat/completions",
                           len, &raw);
        /* the whole answer: its status and its body, which says why */
        const char *b = raw ? strstr(raw, "\r\n\r\n") : NULL;
        int whole = st == 413 && b && strstr(b, "max_body_bytes");
        cr_expect(whole, "try %d (%zu bytes): %d %.300s", i, len, st, raw ? raw : "");
        ok += whole;
        if (i == 0)
            expect_code(raw, "request_too_large");
        free(raw);
    }
    cr_expect_eq(ok, 20);
    /* refused for another reason, the same: the body is read before the close */
    char *raw = NULL;
    cr_expect_eq(send_body(d.port, "POST", "/nosuch", 3 << 20, &raw), 404, "%.200s", raw);
    expect_code(raw, "unknown_url");
    free(raw);
    cr_expect_eq(send_body(d.port, "POST", "/healthz", 3 << 20, &raw), 405, "%.200s", raw);
    expect_code(raw, "method_not_allowed");
    free(raw);
    cr_expect_eq(send_body(d.port, "GET", "/v1/models", 2 << 20, &raw), 400, "%.200s", raw);
    free(raw);
    char *body = NULL;
    cr_expect_eq(h_get(&d, "/healthz", NULL, &body), 200);
    free(body);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}

Test(big_body, a_stalled_or_too_large_body_is_cut_off)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, ""), 0, "log %s", d.log);
    /* promises 8 MB, sends 1 KB and stalls: answered, then closed within the bound */
    int fd = dial(d.port);
    char head[512];
    int n = snprintf(head, sizeof head, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Length: %d\r\n\r\n", 8 << 20);
    char kb[1024];
    memset(kb, ' ', sizeof kb);
    cr_assert_eq(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
    cr_assert_eq(send(fd, kb, sizeof kb, MSG_NOSIGNAL), (ssize_t)sizeof kb);
    /* meanwhile others are served */
    char *body = NULL;
    cr_expect_eq(h_get(&d, "/healthz", NULL, &body), 200);
    free(body);
    double t0 = kvp_now();
    size_t got;
    char *buf = h_read_all(fd, (KVPD_DRAIN_S + 10) * 1000, &got);
    double took = kvp_now() - t0;
    close(fd);
    int status = -1;
    sscanf(buf ? buf : "", "HTTP/1.1 %d", &status);
    cr_expect_eq(status, 413, "%s", buf ? buf : "");
    cr_expect_lt(took, KVPD_DRAIN_S + 5, "held %.1f s", took);
    free(buf);

    /* promises more than the cap: answered and closed without waiting for it */
    fd = dial(d.port);
    n = snprintf(head, sizeof head, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Content-Length: %llu\r\n\r\n", (unsigned long long)KVPD_DRAIN_MAX * 4);
    cr_assert_eq(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
    t0 = kvp_now();
    buf = h_read_all(fd, 10000, &got);
    took = kvp_now() - t0;
    close(fd);
    status = -1;
    sscanf(buf ? buf : "", "HTTP/1.1 %d", &status);
    cr_expect_eq(status, 413, "%s", buf ? buf : "");
    cr_expect_lt(took, 3, "held %.1f s", took);
    free(buf);
    cr_expect_eq(h_get(&d, "/healthz", NULL, &body), 200);
    free(body);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}
