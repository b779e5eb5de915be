/* Websocket client (RFC 6455, client side) and a one-shot HTTP GET. */
#include "tools/wsclient.h"
#include "base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

double ws_now_ms(void)
{
    return kvp_now() * 1e3;
}

static int tcp_connect(const char *host, int port)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -EINVAL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int send_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads more bytes into c->buf, waiting until the deadline. */
static int fill(ws_client *c, double deadline)
{
    int wait = (int)(deadline - ws_now_ms());
    if (wait < 0)
        return -ETIMEDOUT;
    struct pollfd p = {c->fd, POLLIN, 0};
    int r = poll(&p, 1, wait);
    if (r < 0)
        return errno == EINTR ? 0 : -errno;
    if (r == 0)
        return -ETIMEDOUT;
    if (c->cap - c->len < 4096) {
        size_t cap = c->cap ? c->cap * 2 : 16384;
        unsigned char *b = realloc(c->buf, cap);
        if (!b)
            return -ENOMEM;
        c->buf = b;
        c->cap = cap;
    }
    ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    if (n == 0)
        return -ECONNRESET;
    c->len += (size_t)n;
    return 0;
}

static void consume(ws_client *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

static void b64(const unsigned char *in, size_t n, char *out)
{
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        out[o++] = t[v >> 18 & 63];
        out[o++] = t[v >> 12 & 63];
        out[o++] = i + 1 < n ? t[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? t[v & 63] : '=';
    }
    out[o] = '\0';
}

int ws_connect(ws_client *c, const char *host, int port, const char *path, int timeout_ms)
{
    return ws_connect_headers(c, host, port, path, NULL, timeout_ms);
}

int ws_connect_headers(ws_client *c, const char *host, int port, const char *path,
                       const char *headers, int timeout_ms)
{
    if (!headers)
        headers = "";
    memset(c, 0, sizeof *c);
    c->fd = tcp_connect(host, port);
    if (c->fd < 0)
        return c->fd;
    unsigned char nonce[16];
    char key[32];
    if (getrandom(nonce, sizeof nonce, 0) != sizeof nonce)
        memset(nonce, 7, sizeof nonce);
    b64(nonce, sizeof nonce, key);
    /* sized for the path: tests send oversized ones on purpose */
    size_t cap = strlen(path) + strlen(host) + strlen(headers) + 256;
    char *req = malloc(cap);
    if (!req) {
        ws_close(c);
        return -ENOMEM;
    }
    int n = snprintf(req, cap,
                     "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                     "Sec-WebSocket-Version: 13\r\n%s\r\n", path, host, port, key, headers);
    int rc = send_all(c->fd, req, (size_t)n);
    free(req);
    double deadline = ws_now_ms() + timeout_ms;
    while (!rc) {
        unsigned char *end = c->len >= 4 ? memmem(c->buf, c->len, "\r\n\r\n", 4) : NULL;
        if (end) {
            size_t hl = (size_t)(end - c->buf) + 4;
            rc = (c->len >= 12 && !memcmp(c->buf, "HTTP/1.1 101", 12)) ? 0 : -EPROTO;
            consume(c, hl);
            break;
        }
        rc = fill(c, deadline);
    }
    if (rc) {
        ws_close(c);
        return rc;
    }
    return 0;
}

void ws_close(ws_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
    c->len = c->cap = 0;
}

size_t ws_frame(unsigned char *out, int opcode, int fin, const void *data, size_t len)
{
    size_t h = 0;
    out[h++] = (unsigned char)((fin ? 0x80 : 0) | (opcode & 0x0f));
    if (len < 126) {
        out[h++] = (unsigned char)(0x80 | len);
    } else if (len < 65536) {
        out[h++] = 0x80 | 126;
        out[h++] = (unsigned char)(len >> 8);
        out[h++] = (unsigned char)len;
    } else {
        out[h++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--)
            out[h++] = (unsigned char)((uint64_t)len >> (8 * i));
    }
    unsigned char mask[4];
    if (getrandom(mask, 4, 0) != 4)
        memcpy(mask, "kvpd", 4);
    memcpy(out + h, mask, 4);
    h += 4;
    const unsigned char *d = data;
    for (size_t i = 0; i < len; i++)
        out[h + i] = d[i] ^ mask[i & 3];
    return h + len;
}

int ws_send_frame(ws_client *c, int opcode, int fin, const void *data, size_t len)
{
    unsigned char *f = malloc(len + 14);
    if (!f)
        return -ENOMEM;
    size_t n = ws_frame(f, opcode, fin, data, len);
    int rc = send_all(c->fd, f, n);
    free(f);
    return rc;
}

int ws_send_text(ws_client *c, const char *text)
{
    return ws_send_frame(c, WS_TEXT, 1, text, strlen(text));
}

int ws_send_raw(ws_client *c, const void *data, size_t len)
{
    return send_all(c->fd, data, len);
}

/* Waits until at least n bytes are buffered. */
static int want(ws_client *c, size_t n, double deadline)
{
    while (c->len < n) {
        int rc = fill(c, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int ws_read(ws_client *c, int timeout_ms, char **payload, size_t *plen)
{
    double deadline = ws_now_ms() + timeout_ms;
    char *msg = NULL;
    size_t mlen = 0;
    int msg_op = -1, rc;
    for (;;) {
        if ((rc = want(c, 2, deadline)) < 0)
            break;
        unsigned l7 = c->buf[1] & 0x7f;
        int masked = c->buf[1] & 0x80;
        size_t h = 2 + (l7 == 126 ? 2 : l7 == 127 ? 8 : 0), len = 0;
        if ((rc = want(c, h + (masked ? 4 : 0), deadline)) < 0)
            break;
        if (l7 < 126)
            len = l7;
        else if (l7 == 126)
            len = (size_t)c->buf[2] << 8 | c->buf[3];
        else
            for (int i = 0; i < 8; i++)
                len = len << 8 | c->buf[2 + i];
        const unsigned char *mask = c->buf + h;
        if (masked)
            h += 4;
        if ((rc = want(c, h + len, deadline)) < 0)
            break;
        mask = c->buf + h - 4;   /* the buffer may have moved */
        unsigned char *data = c->buf + h;
        if (masked)
            for (size_t i = 0; i < len; i++)
                data[i] ^= mask[i & 3];
        int fin = c->buf[0] & 0x80, op = c->buf[0] & 0x0f;
        if (op == WS_PING) {
            unsigned char pong[140];
            size_t n = ws_frame(pong, WS_PONG, 1, data, len > 125 ? 125 : len);
            consume(c, h + len);
            if ((rc = send_all(c->fd, pong, n)) < 0)
                break;
            continue;
        }
        if (op == WS_PONG) {
            consume(c, h + len);
            continue;
        }
        if (op != WS_CONT)
            msg_op = op;
        char *m = realloc(msg, mlen + len + 1);
        if (!m) {
            rc = -ENOMEM;
            break;
        }
        msg = m;
        memcpy(msg + mlen, data, len);
        mlen += len;
        msg[mlen] = '\0';
        consume(c, h + len);
        if (fin || op == WS_CLOSE) {
            *payload = msg;
            *plen = mlen;
            return msg_op;
        }
    }
    free(msg);
    return rc;
}

int http_get(const char *host, int port, const char *path, const char *auth,
             char **body, int timeout_ms)
{
    ws_client c;
    memset(&c, 0, sizeof c);
    c.fd = tcp_connect(host, port);
    if (c.fd < 0)
        return c.fd;
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s:%d\r\n%s%s%s"
                     "Connection: close\r\n\r\n", path, host, port,
                     auth ? "Authorization: " : "", auth ? auth : "", auth ? "\r\n" : "");
    int rc = send_all(c.fd, req, (size_t)n);
    double deadline = ws_now_ms() + timeout_ms;
    long clen = -1;
    unsigned char *end = NULL;
    while (!rc) {
        end = c.len >= 4 ? memmem(c.buf, c.len, "\r\n\r\n", 4) : NULL;
        if (end && clen < 0) {
            char hdr[4096];
            size_t hl = (size_t)(end - c.buf) < sizeof hdr - 1 ? (size_t)(end - c.buf) : sizeof hdr - 1;
            memcpy(hdr, c.buf, hl);
            hdr[hl] = '\0';
            const char *cl = strcasestr(hdr, "\r\ncontent-length:");
            clen = cl ? atol(cl + 17) : -2;
        }
        if (end && clen >= 0 && c.len >= (size_t)(end - c.buf) + 4 + (size_t)clen)
            break;
        rc = fill(&c, deadline);
    }
    if (rc == -ECONNRESET) {
        end = c.len >= 4 ? memmem(c.buf, c.len, "\r\n\r\n", 4) : NULL;
        if (end)
            rc = 0;
    }
    if (rc || c.len < 12) {
        ws_close(&c);
        return rc ? rc : -EPROTO;
    }
    int status = atoi((char *)c.buf + 9);
    size_t off = (size_t)(end - c.buf) + 4;
    if (clen >= 0 && off + (size_t)clen < c.len)
        c.len = off + (size_t)clen;
    *body = malloc(c.len - off + 1);
    if (!*body) {
        ws_close(&c);
        return -ENOMEM;
    }
    memcpy(*body, c.buf + off, c.len - off);
    (*body)[c.len - off] = '\0';
    ws_close(&c);
    return status;
}
