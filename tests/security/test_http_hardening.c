/* The HTTP side: a cross-site page (Origin) or a DNS-rebinding
 * page (Host) cannot drive the daemon, the admin endpoints are closed by default (a generated
 * token in a 0600 file), the websocket version is checked, HEAD is served. Requests
 * are written by hand so every header is the test's choice. */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(security_http, .timeout = 60);

typedef struct reply {
    int status;
    char head[4096];       /* status line and headers */
    size_t body_len;       /* bytes after the headers that arrived within the wait */
    int closed;            /* the server closed the connection */
} reply;

static int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    return fd;
}

/* Sends req, reads the head, then whatever follows for up to linger_ms. */
static reply raw(int port, const char *req, int linger_ms)
{
    reply r;
    memset(&r, 0, sizeof r);
    int fd = tcp_connect(port);
    cr_assert_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    char buf[8192];
    size_t got = 0;
    char *end = NULL;
    int waited = 0;
    while (!end && waited < 5000 && got < sizeof buf - 1) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) {
            waited += 100;
            continue;
        }
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (n <= 0) {
            r.closed = 1;
            break;
        }
        got += (size_t)n;
        buf[got] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    if (end) {
        size_t hl = (size_t)(end + 4 - buf);
        snprintf(r.head, sizeof r.head, "%.*s", (int)hl, buf);
        r.body_len = got - hl;
        sscanf(buf, "HTTP/1.%*d %d", &r.status);
        for (waited = 0; !r.closed && waited < linger_ms; waited += 50) {
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, 50) <= 0)
                continue;
            ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n <= 0)
                r.closed = 1;
            else
                r.body_len += (size_t)n;
        }
    }
    close(fd);
    return r;
}

static reply get(const kvpd_proc *p, const char *method, const char *path, const char *host,
                 const char *extra)
{
    char req[2048];
    snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n",
             method, path, host, extra ? extra : "");
    return raw(p->port, req, 300);
}

static reply upgrade(const kvpd_proc *p, const char *host, const char *origin,
                     const char *version)
{
    char req[2048], o[512] = "";
    if (origin)
        snprintf(o, sizeof o, "Origin: %s\r\n", origin);
    snprintf(req, sizeof req,
             "GET /chat HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: %s\r\n"
             "%s\r\n", host, version, o);
    return raw(p->port, req, 0);
}

static const char *self(const kvpd_proc *p, const char *name)
{
    static char buf[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s:%d", name, p->port);
    return buf[k];
}

static const char *origin_of(const kvpd_proc *p, const char *name)
{
    static char buf[4][160];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "http://%s:%d", name, p->port);
    return buf[k];
}

Test(security_http, a_foreign_origin_cannot_open_chat)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    const char *host = self(&p, "127.0.0.1");
    cr_expect_neq(upgrade(&p, host, "http://evil.example", "13").status, 101,
                  "a page from http://evil.example got a websocket");
    cr_expect_neq(upgrade(&p, host, origin_of(&p, "evil.example"), "13").status, 101);
    cr_expect_neq(upgrade(&p, host, "null", "13").status, 101);
    char suffixed[160];
    snprintf(suffixed, sizeof suffixed, "%s0", origin_of(&p, "127.0.0.1"));
    cr_expect_neq(upgrade(&p, host, suffixed, "13").status, 101, "%s was allowed", suffixed);
    snprintf(suffixed, sizeof suffixed, "%s/", origin_of(&p, "127.0.0.1"));
    cr_expect_neq(upgrade(&p, host, suffixed, "13").status, 101, "%s was allowed", suffixed);
    cr_expect_neq(upgrade(&p, host, "https://127.0.0.1", "13").status, 101);
    cr_expect_eq(upgrade(&p, host, origin_of(&p, "127.0.0.1"), "13").status, 101,
                 "the daemon's own page was refused");
    cr_expect_eq(upgrade(&p, self(&p, "localhost"), origin_of(&p, "localhost"), "13").status, 101);
    cr_expect_eq(upgrade(&p, host, NULL, "13").status, 101, "a client without Origin was refused");
    /* Plain HTTP from a foreign origin too. */
    char extra[128];
    snprintf(extra, sizeof extra, "Origin: http://evil.example\r\n");
    cr_expect_eq(get(&p, "GET", "/healthz", host, extra).status, 403);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, a_rebinding_host_is_refused)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", h_admin_token(&p));
    reply r = get(&p, "GET", "/admin/stats", self(&p, "evil.example"), auth);
    cr_expect_eq(r.status, 421, "a rebinding page read /admin/stats: %d", r.status);
    cr_expect_eq(get(&p, "GET", "/", self(&p, "evil.example"), NULL).status, 421);
    cr_expect_neq(upgrade(&p, self(&p, "evil.example"), NULL, "13").status, 101);
    cr_expect_eq(get(&p, "GET", "/admin/stats", self(&p, "127.0.0.1"), auth).status, 200);
    cr_expect_eq(get(&p, "GET", "/healthz", "localhost", NULL).status, 200);
    cr_expect_eq(get(&p, "GET", "/healthz", self(&p, "[::1]"), NULL).status, 200);
    cr_expect_eq(raw(p.port, "GET /healthz HTTP/1.0\r\n\r\n", 0).status, 400, "no Host");
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, configured_hosts_and_origins)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, "--allowed-hosts kvpd.example,127.0.0.1 "
                                "--allowed-origins https://app.example"), 0, "log %s", p.log);
    cr_expect_eq(get(&p, "GET", "/healthz", self(&p, "kvpd.example"), NULL).status, 200);
    cr_expect_eq(get(&p, "GET", "/healthz", self(&p, "localhost"), NULL).status, 421);
    const char *host = self(&p, "127.0.0.1");
    cr_expect_eq(upgrade(&p, host, "https://app.example", "13").status, 101);
    cr_expect_neq(upgrade(&p, host, origin_of(&p, "127.0.0.1"), "13").status, 101);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, admin_is_closed_by_default)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char *body = NULL;
    cr_expect_eq(h_get(&p, "/admin/stats", NULL, &body), 401);
    free(body);
    const char *tok = h_admin_token(&p);
    cr_assert_eq(strlen(tok), 32, "no generated token in %s", p.admin_file);
    struct stat st;
    cr_assert_eq(stat(p.admin_file, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600, "token file mode %o", st.st_mode & 0777);
    cr_expect(kvpd_log_has(&p, p.admin_file), "the log does not say where the token is");
    body = NULL;
    cr_expect_eq(h_get(&p, "/admin/stats", tok, &body), 200);
    free(body);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);

    /* Nowhere to write a token (no admin_token_file, no state_dir): closed. */
    cr_assert_eq(kvpd_start(&p, "--admin-token-file="), 0, "log %s", p.log);
    body = NULL;
    cr_expect_eq(h_get(&p, "/admin/stats", NULL, &body), 401);
    free(body);
    cr_expect(kvpd_log_has(&p, "closed"), "log %s", p.log);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, the_websocket_version_must_be_13)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    const char *host = self(&p, "127.0.0.1");
    cr_expect_neq(upgrade(&p, host, NULL, "99").status, 101, "version 99 was accepted");
    cr_expect_neq(upgrade(&p, host, NULL, "8").status, 101, "version 8 was accepted");
    cr_expect_eq(upgrade(&p, host, NULL, "13").status, 101);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, head_is_served)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", h_admin_token(&p));
    const char *paths[] = {"/healthz", "/metrics", "/admin/stats"};
    for (int i = 0; i < 3; i++) {
        reply r = get(&p, "HEAD", paths[i], self(&p, "127.0.0.1"), auth);
        cr_expect_eq(r.status, 200, "HEAD %s: %d", paths[i], r.status);
        cr_expect(strcasestr(r.head, "content-length:"), "HEAD %s: no length", paths[i]);
        cr_expect_eq(r.body_len, 0, "HEAD %s sent a body of %zu bytes", paths[i], r.body_len);
    }
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, connect_is_answered_and_closed)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char req[256];
    snprintf(req, sizeof req, "CONNECT example.com:443 HTTP/1.1\r\nHost: %s\r\n\r\n",
             self(&p, "127.0.0.1"));
    double t0 = ws_now_ms();
    reply r = raw(p.port, req, 2000);
    cr_expect_eq(r.status, 405, "CONNECT got %d", r.status);
    cr_expect(r.closed, "the connection stayed open");
    cr_expect_lt(ws_now_ms() - t0, 3000);
    cr_expect_eq(get(&p, "GET", "/healthz", self(&p, "127.0.0.1"), NULL).status, 200);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

/* ---- request framing: bodies, pipelining, Transfer-Encoding, Expect ---- */

/* Sends req on fd, then reads until the server closes, max bytes came, or wait_ms
 * passed; the bytes NUL-terminated (malloc'd), *closed 1 when the server closed. */
static char *exchange(int fd, const char *req, size_t max, int wait_ms, int *closed)
{
    if (req)
        cr_assert_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    char *buf = malloc(max + 1);
    size_t got = 0;
    double end = ws_now_ms() + wait_ms;
    *closed = 0;
    while (got < max && ws_now_ms() < end) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        ssize_t n = recv(fd, buf + got, max - got, 0);
        if (n <= 0) {
            *closed = 1;
            break;
        }
        got += (size_t)n;
    }
    buf[got] = '\0';
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static const char CHAT_BODY[] =
    "{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}]}";

static void chat_post(char *out, size_t len, const char *extra_headers)
{
    snprintf(out, len, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n%s",
             strlen(CHAT_BODY), extra_headers ? extra_headers : "", CHAT_BODY);
}

/* The one answer in buf is whole: its Content-Length bytes follow the head, nothing else. */
static void one_whole_answer(const char *buf, int status)
{
    int st = 0;
    cr_assert_eq(sscanf(buf, "HTTP/1.1 %d", &st), 1, "no answer: %.300s", buf);
    cr_expect_eq(st, status, "%.600s", buf);
    cr_expect_eq(count(buf, "HTTP/1.1 "), 1, "more than one answer: %.2000s", buf);
    const char *body = strstr(buf, "\r\n\r\n");
    const char *cl = strcasestr(buf, "content-length:");
    cr_assert(body && cl, "%.600s", buf);
    cr_expect_eq(strlen(body + 4), (size_t)atol(cl + 15), "the body is not its length: %.2000s",
                 buf);
    json_t *j = json_loads(body + 4, 0, NULL);
    cr_expect(j, "the body is not one JSON value: %.2000s", body + 4);
    json_decref(j);
}

Test(security_http, a_request_pipelined_behind_a_post_is_never_routed_twice)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char one[1024], two[2048];
    chat_post(one, sizeof one, NULL);
    snprintf(two, sizeof two, "%s%s", one, one);
    int fd = tcp_connect(p.port), closed;
    double t0 = ws_now_ms();
    char *buf = exchange(fd, two, 1 << 20, 5000, &closed);
    close(fd);
    one_whole_answer(buf, 200);
    cr_expect(strstr(buf, "\"finish_reason\""), "%.1000s", buf);
    cr_expect(closed, "the connection stayed open with a request dropped unanswered");
    /* the answer says it closes, so the client sends the second request again */
    const char *end = strstr(buf, "\r\n\r\n"), *cc = strcasestr(buf, "\r\nconnection: close");
    cr_expect(cc && end && cc < end, "no Connection: close before the close: %.600s", buf);
    cr_expect_lt(ws_now_ms() - t0, 4000);
    free(buf);
    cr_expect_eq(get(&p, "GET", "/healthz", self(&p, "127.0.0.1"), NULL).status, 200);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, a_trailing_crlf_after_a_post_body_keeps_the_connection)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char req[1024], req2[1100];
    chat_post(req, sizeof req, NULL);
    snprintf(req2, sizeof req2, "%s\r\n", req);
    int fd = tcp_connect(p.port), closed;
    char *buf = exchange(fd, req2, 1 << 20, 1500, &closed);
    one_whole_answer(buf, 200);
    cr_expect(!closed, "a blank line after the body closed the connection");
    free(buf);
    /* the connection serves its next request */
    buf = exchange(fd, req, 1 << 20, 1500, &closed);
    one_whole_answer(buf, 200);
    free(buf);
    close(fd);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, a_chunked_post_is_answered_411_at_once)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char req[1024];
    snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n"
             "0\r\n\r\n", strlen(CHAT_BODY), CHAT_BODY);
    int fd = tcp_connect(p.port), closed;
    double t0 = ws_now_ms();
    char *buf = exchange(fd, req, 1 << 16, 4000, &closed);
    close(fd);
    cr_expect(!strncmp(buf, "HTTP/1.1 411", 12), "%.300s", buf);
    cr_expect(closed);
    cr_expect_lt(ws_now_ms() - t0, 1500, "the answer took %.0f ms", ws_now_ms() - t0);
    free(buf);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, expect_100_continue_is_served_and_other_expectations_get_417)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char head[1024];
    snprintf(head, sizeof head, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n"
             "Expect: 100-continue\r\nConnection: close\r\n\r\n", strlen(CHAT_BODY));
    int fd = tcp_connect(p.port), closed;
    char *buf = exchange(fd, head, 25, 3000, &closed);   /* the body waits for the 100 */
    cr_expect(!strcmp(buf, "HTTP/1.1 100 Continue\r\n\r\n"), "got '%s'", buf);
    free(buf);
    buf = exchange(fd, CHAT_BODY, 1 << 20, 5000, &closed);
    close(fd);
    one_whole_answer(buf, 200);
    free(buf);

    snprintf(head, sizeof head, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Content-Length: %zu\r\nExpect: 200-ok\r\n\r\n%s", strlen(CHAT_BODY), CHAT_BODY);
    fd = tcp_connect(p.port);
    buf = exchange(fd, head, 1 << 16, 3000, &closed);
    close(fd);
    cr_expect(!strncmp(buf, "HTTP/1.1 417", 12), "%.300s", buf);
    cr_expect(closed);
    free(buf);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

/* A GET's "body" (with Transfer-Encoding, TE: chunked or Content-Length) is never run as
 * the next request: the admin request smuggled in it would carry the token. */
Test(security_http, a_body_on_a_get_is_never_parsed_as_a_request)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char inner[512], auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", h_admin_token(&p));
    snprintf(inner, sizeof inner, "GET /admin/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n", auth);
    const char *framings[] = {"Transfer-Encoding: chunked\r\n", "TE: chunked\r\n",
                              "Content-Length: %zu\r\n"};
    for (int i = 0; i < 3; i++) {
        char hdr[128], req[2048];
        snprintf(hdr, sizeof hdr, framings[i], strlen(inner));
        if (i < 2)
            snprintf(req, sizeof req, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n"
                     "%zx\r\n%s\r\n0\r\n\r\n", hdr, strlen(inner), inner);
        else
            snprintf(req, sizeof req, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n%s",
                     hdr, inner);
        int fd = tcp_connect(p.port), closed;
        char *buf = exchange(fd, req, 1 << 16, 3000, &closed);
        close(fd);
        cr_expect(!strncmp(buf, "HTTP/1.1 400", 12), "%s: %.300s", hdr, buf);
        cr_expect_eq(count(buf, "HTTP/1.1 "), 1, "%s: the body ran as a request: %.2000s", hdr,
                     buf);
        cr_expect(!strstr(buf, "session_list"), "%s: /admin/stats was served", hdr);
        cr_expect(closed, "%s", hdr);
        free(buf);
    }
    cr_expect_eq(get(&p, "GET", "/healthz", self(&p, "127.0.0.1"), NULL).status, 200);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

/* ---- CORS for the API, and the status of a refused upgrade ---- */

static const char *hdr_value(const reply *r, const char *name, char *out, size_t len)
{
    const char *v = h_header(r->head, name);
    snprintf(out, len, "%.*s", (int)strcspn(v, "\r\n"), v);
    return out;
}

Test(security_http, cors_preflight_and_headers_for_allowed_origins)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, "--allowed-origins https://app.example --api-key k3y"), 0,
                 "log %s", p.log);
    const char *host = self(&p, "127.0.0.1");
    char v[256];
    reply r = get(&p, "OPTIONS", "/v1/chat/completions", host,
                  "Origin: https://app.example\r\nAccess-Control-Request-Method: POST\r\n"
                  "Access-Control-Request-Headers: authorization, content-type\r\n");
    cr_expect_eq(r.status, 204, "%s", r.head);
    cr_expect_str_eq(hdr_value(&r, "access-control-allow-origin:", v, sizeof v),
                     "https://app.example", "%s", r.head);
    cr_expect(strstr(hdr_value(&r, "access-control-allow-methods:", v, sizeof v), "POST"),
              "%s", r.head);
    cr_expect(strcasestr(hdr_value(&r, "access-control-allow-headers:", v, sizeof v),
                         "authorization"), "%s", r.head);
    cr_expect(strstr(hdr_value(&r, "vary:", v, sizeof v), "Origin"), "%s", r.head);
    cr_expect(!strcasestr(r.head, "access-control-allow-credentials"), "%s", r.head);

    /* the answers themselves, errors included, carry the origin */
    char req[1024];
    snprintf(req, sizeof req, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n"
             "Origin: https://app.example\r\nAuthorization: Bearer k3y\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n"
             "\r\n%s", host, strlen(CHAT_BODY), CHAT_BODY);
    r = raw(p.port, req, 300);
    cr_expect_eq(r.status, 200, "%s", r.head);
    cr_expect_str_eq(hdr_value(&r, "access-control-allow-origin:", v, sizeof v),
                     "https://app.example", "%s", r.head);
    cr_expect(strstr(hdr_value(&r, "vary:", v, sizeof v), "Origin"), "%s", r.head);
    cr_expect(strcasestr(hdr_value(&r, "access-control-expose-headers:", v, sizeof v),
                         "x-session-id"), "%s", r.head);
    r = get(&p, "GET", "/v1/models", host, "Origin: https://app.example\r\n");
    cr_expect_eq(r.status, 401, "%s", r.head);
    cr_expect_str_eq(hdr_value(&r, "access-control-allow-origin:", v, sizeof v),
                     "https://app.example", "%s", r.head);
    /* another origin gets no CORS grant (and 403 as before) */
    r = get(&p, "OPTIONS", "/v1/chat/completions", host, "Origin: https://evil.example\r\n");
    cr_expect_eq(r.status, 403, "%s", r.head);
    cr_expect(!strcasestr(r.head, "access-control-allow-origin"), "%s", r.head);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);

    /* "*": any origin, never with credentials */
    cr_assert_eq(kvpd_start(&p, "--allowed-origins *"), 0, "log %s", p.log);
    r = get(&p, "OPTIONS", "/v1/chat/completions", self(&p, "127.0.0.1"),
            "Origin: https://any.example\r\nAccess-Control-Request-Method: POST\r\n");
    cr_expect_eq(r.status, 204, "%s", r.head);
    cr_expect_str_eq(hdr_value(&r, "access-control-allow-origin:", v, sizeof v), "*", "%s",
                     r.head);
    cr_expect(!strcasestr(r.head, "access-control-allow-credentials"), "%s", r.head);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, cors_preflight_on_every_endpoint)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, "--allowed-origins https://app.example --api-key k3y"), 0,
                 "log %s", p.log);
    const char *host = self(&p, "127.0.0.1");
    char v[256];
    static const struct { const char *path, *method; } eps[] = {
        {"/completion", "POST"}, {"/tokenize", "POST"}, {"/detokenize", "POST"},
        {"/props", "GET"}, {"/slots", "GET"}, {"/health", "GET"}, {"/healthz", "GET"},
        {"/v1/models", "GET"}, {"/v1/responses/resp_x", "DELETE"}};
    for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
        char hdrs[256];
        snprintf(hdrs, sizeof hdrs, "Origin: https://app.example\r\nAccess-Control-Request-"
                 "Method: %s\r\nAccess-Control-Request-Headers: Authorization\r\n", eps[i].method);
        reply r = get(&p, "OPTIONS", eps[i].path, host, hdrs);
        cr_expect_eq(r.status, 204, "%s: %s", eps[i].path, r.head);
        cr_expect_str_eq(hdr_value(&r, "access-control-allow-origin:", v, sizeof v),
                         "https://app.example", "%s: %s", eps[i].path, r.head);
        cr_expect(strstr(hdr_value(&r, "access-control-allow-methods:", v, sizeof v),
                         eps[i].method), "%s: %s", eps[i].path, r.head);
        cr_expect(strcasestr(hdr_value(&r, "access-control-allow-headers:", v, sizeof v),
                             "authorization"), "%s: %s", eps[i].path, r.head);
        cr_expect(strstr(hdr_value(&r, "allow:", v, sizeof v), eps[i].method), "%s: %s",
                  eps[i].path, r.head);
        cr_expect(!strcasestr(r.head, "access-control-allow-credentials"), "%s", r.head);
        /* another origin: refused, no grant */
        r = get(&p, "OPTIONS", eps[i].path, host, "Origin: https://evil.example\r\n"
                "Access-Control-Request-Method: POST\r\n");
        cr_expect_eq(r.status, 403, "%s: %s", eps[i].path, r.head);
        cr_expect(!strcasestr(r.head, "access-control-allow"), "%s: %s", eps[i].path, r.head);
    }
    /* asked headers that are not a plain list get the API's own */
    reply r = get(&p, "OPTIONS", "/completion", host, "Origin: https://app.example\r\n"
                  "Access-Control-Request-Method: POST\r\n"
                  "Access-Control-Request-Headers: x;evil=1\r\n");
    cr_expect_eq(r.status, 204, "%s", r.head);
    cr_expect_str_eq(hdr_value(&r, "access-control-allow-headers:", v, sizeof v),
                     "authorization, content-type, x-session-id", "%s", r.head);
    /* no such path: 404, no grant of methods */
    r = get(&p, "OPTIONS", "/nosuch", host, "Origin: https://app.example\r\n"
            "Access-Control-Request-Method: POST\r\n");
    cr_expect_eq(r.status, 404, "%s", r.head);
    cr_expect(!strcasestr(r.head, "access-control-allow-methods"), "%s", r.head);
    /* the answers outside the API carry the origin too */
    r = get(&p, "GET", "/health", host, "Origin: https://app.example\r\n");
    cr_expect_eq(r.status, 200, "%s", r.head);
    cr_expect_str_eq(hdr_value(&r, "access-control-allow-origin:", v, sizeof v),
                     "https://app.example", "%s", r.head);
    r = get(&p, "GET", "/health", host, NULL);
    cr_expect(!strcasestr(r.head, "access-control-allow-origin"), "%s", r.head);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_http, a_refused_upgrade_gets_its_http_status)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    const char *host = self(&p, "127.0.0.1");
    cr_expect_eq(upgrade(&p, host, "http://evil.example", "13").status, 403,
                 "a foreign Origin's upgrade was not answered 403");
    cr_expect_eq(upgrade(&p, host, NULL, "8").status, 400);
    cr_expect_eq(upgrade(&p, self(&p, "evil.example"), NULL, "13").status, 421);
    cr_expect_eq(upgrade(&p, host, NULL, "13").status, 101);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}
