/* RFC 6455 5.1: a server MUST fail the connection on a client frame that is not masked.
 * libwebsockets 4.1 (Debian 12's) parses frames itself, accepts unmasked ones and reports
 * the mask bit nowhere (no option, callback or accessor; the check "client unmasked" came
 * in later releases). So kvpd looks at the frame headers before lws does: lws reads the
 * sockets kvpd accepted (web/listen.c) with recv(), and this file defines recv() in the
 * executable, which the dynamic linker binds lws's calls to (kvpd_wsguard_check() verifies
 * that at start). For a socket registered at accept:
 *   - HTTP (before the upgrade): each read ends at the first empty line (LF, optional CR,
 *     LF) it reaches, so the read that holds the end of a request's header holds nothing
 *     after it. lws handles a read before it reads again, so when the upgrade completes
 *     (kvpd_wsguard_upgraded) the next byte read is the first frame's first byte - unless
 *     the client sent bytes after the upgrade request without waiting for the 101
 *     (RFC 6455 4.1 forbids it): that connection is failed. One MSG_PEEK more per read,
 *     on the HTTP side only.
 *   - HTTP body (kvpd_wsguard_body, from the request's callback): reads deliver the
 *     Content-Length bytes of the body and nothing past them; what follows is read and
 *     dropped until the answer is out (kvpd_wsguard_release), so one request is routed
 *     once and a pipelined one is never parsed while this one runs.
 *   - HTTP refused body (kvpd_wsguard_drain): its Content-Length bytes are read and
 *     dropped, lws sees none of them; then as past a body (held), and lws is asked for a
 *     writeable callback, where the answer's connection closes with nothing unread.
 *   - websocket: each read's bytes go to lws as they are; a small state machine walks the
 *     frame headers in them (at most 14 bytes each; payloads are skipped by length, so the
 *     cost is per frame, not per byte, and nothing is copied) across any split of frames
 *     over reads. The bytes before the first unmasked frame go to lws; that frame and
 *     everything after it never do, and the connection is failed: close code 1002 from
 *     lws (kvpd_wsguard_failed, checked by the callbacks), or a plain close when the
 *     client does not even read.
 * The state is the connection's: kvpd_wsguard_accept makes it, the connection's slot
 * (web/listen.c) owns it, and kvpd_wsguard_close, when the connection goes, takes it out
 * of the descriptor index recv() looks it up in, so a later descriptor of that number is
 * never taken for it. Only the loop thread (the one that called kvpd_wsguard_init, where
 * lws runs) is ever looked at: a recv() on any other thread, and on any descriptor
 * without a connection's state (and a MSG_PEEK read), goes straight to the system call
 * without reading the index, so other threads share nothing with the guard. */
#undef _FORTIFY_SOURCE   /* its inline recv() wrapper would clash with the definition below */

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "web/conn.h"

enum guard_mode { GUARD_HTTP = 0, GUARD_BODY, GUARD_DRAIN, GUARD_HOLD, GUARD_WS, GUARD_FAILED };

/* Bytes a client may send after a request it must wait the answer of before they are
 * only dropped no more: past this the connection is closed. */
#define HOLD_MAX (64 * 1024)

typedef struct kvpd_wsguard {
    int fd;
    enum guard_mode mode;
    struct lws *wsi;             /* websocket: for the close; a drained body: its end */
    /* HTTP: how much of an empty line the bytes so far end with (0: none, 1: LF, 2: LF CR)
     * and whether the last byte read ended one. */
    int eol, at_end;
    /* websocket: the frame header being read and the payload bytes still to skip */
    unsigned char hdr[14];
    int hdr_have;
    uint64_t payload_left;
    /* HTTP body: its bytes still to deliver; then, until the answer is out, what came
     * after it (dropped: held[0] CR/LF only, held[1] anything else) */
    uint64_t body_left;
    uint64_t held;
    int held_request;
} guard;

/* The open connections' states by descriptor (borrowed: each connection owns its own).
 * Read and written on the loop thread only. */
static guard **table;
static int table_n;
static pthread_t loop_thread;

static ssize_t sys_recv(int fd, void *buf, size_t len, int flags)
{
    return syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL);
}

int kvpd_wsguard_init(void)
{
    struct rlimit rl;
    if (table)
        return 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -errno;
    /* Every descriptor accept() can return is below the soft limit (kvpd never raises it). */
    rlim_t n = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1u << 20) ? (1u << 20) : rl.rlim_cur;
    if (!(table = calloc((size_t)n, sizeof *table)))
        return -ENOMEM;
    table_n = (int)n;
    loop_thread = pthread_self();
    return 0;
}

void kvpd_wsguard_free(void)
{
    /* the states stay their connections' (freed by kvpd_wsguard_close) */
    free(table);
    table = NULL;
    table_n = 0;
}

int kvpd_wsguard_check(void)
{
    /* lws's calls resolve like this lookup: to the first definition in the global scope. */
    return dlsym(RTLD_DEFAULT, "recv") == (void *)recv ? 0 : -ENOSYS;
}

int kvpd_wsguard_accept(int fd, kvpd_wsguard **out)
{
    *out = NULL;
    if (fd < 0 || fd >= table_n)
        return -EMFILE;
    /* A state still indexed under fd is of a connection whose descriptor is closed (accept
     * just returned the number) and whose close is yet to come: it is no longer looked
     * up, and its close leaves this one's entry alone. */
    guard *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    g->fd = fd;
    table[fd] = g;
    *out = g;
    return 0;
}

void kvpd_wsguard_close(kvpd_wsguard *g)
{
    if (!g)
        return;
    if (table && g->fd >= 0 && g->fd < table_n && table[g->fd] == g)
        table[g->fd] = NULL;
    free(g);
}

int kvpd_wsguard_upgraded(int fd, struct lws *wsi)
{
    guard *g = fd >= 0 && fd < table_n ? table[fd] : NULL;
    if (!g)
        return -EINVAL;   /* not a connection kvpd accepted: it cannot be checked */
    g->wsi = wsi;
    if (!g->at_end) {     /* bytes after the upgrade request already went to lws */
        g->mode = GUARD_FAILED;
        return -EPROTO;
    }
    g->mode = GUARD_WS;
    g->hdr_have = 0;
    g->payload_left = 0;
    return 0;
}

static guard *guard_of(int fd)
{
    return fd >= 0 && fd < table_n ? table[fd] : NULL;
}

void kvpd_wsguard_body(int fd, uint64_t len)
{
    guard *g = guard_of(fd);
    if (!g || g->mode != GUARD_HTTP)
        return;
    g->body_left = len;
    g->held = 0;
    g->held_request = 0;
    g->mode = len ? GUARD_BODY : GUARD_HOLD;
}

void kvpd_wsguard_drain(int fd, struct lws *wsi, uint64_t len)
{
    guard *g = guard_of(fd);
    if (!g || g->mode != GUARD_HTTP || !len)
        return;
    g->wsi = wsi;
    g->body_left = len;
    g->held = 0;
    g->held_request = 0;
    g->mode = GUARD_DRAIN;
}

int kvpd_wsguard_draining(int fd)
{
    guard *g = guard_of(fd);
    return g && g->mode == GUARD_DRAIN;
}

int kvpd_wsguard_release(int fd)
{
    guard *g = guard_of(fd);
    if (!g || (g->mode != GUARD_BODY && g->mode != GUARD_HOLD))
        return 0;
    int unclean = g->held_request || g->mode == GUARD_BODY;
    g->mode = GUARD_HTTP;
    g->eol = g->at_end = 0;
    return unclean;
}

int kvpd_wsguard_pipelined(int fd)
{
    guard *g = guard_of(fd);
    if (!g || (g->mode != GUARD_BODY && g->mode != GUARD_HOLD))
        return 0;
    if (g->held_request)
        return 1;
    if (g->mode == GUARD_BODY)   /* the body is still coming: nothing after it yet */
        return 0;
    unsigned char buf[512];
    ssize_t n = sys_recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    for (ssize_t i = 0; i < n; i++)
        if (buf[i] != '\r' && buf[i] != '\n')
            return g->held_request = 1;   /* so release closes, as the answer said */
    return 0;
}

int kvpd_wsguard_failed(int fd)
{
    return fd >= 0 && fd < table_n && table[fd] && table[fd]->mode == GUARD_FAILED;
}

/* HTTP: how many of buf[0..n) to deliver: up to the end of the first empty line. */
static size_t http_cut(guard *g, const unsigned char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = buf[i];
        if (ch == '\n') {
            if (g->eol) {         /* LF LF or LF CR LF: an empty line ends here */
                g->eol = 0;
                g->at_end = 1;
                return i + 1;
            }
            g->eol = 1;
        } else if (ch == '\r' && g->eol == 1) {
            g->eol = 2;
        } else {
            g->eol = 0;
        }
        g->at_end = 0;
    }
    return n;
}

/* Websocket: walks the frame headers in buf[0..n); returns how many bytes come before
 * the first unmasked frame (n when there is none). */
static size_t ws_scan(guard *g, const unsigned char *buf, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (g->payload_left) {
            uint64_t skip = n - i < g->payload_left ? n - i : g->payload_left;
            i += (size_t)skip;
            g->payload_left -= skip;
            continue;
        }
        g->hdr[g->hdr_have++] = buf[i++];
        if (g->hdr_have < 2)
            continue;
        if (g->hdr_have == 2 && !(g->hdr[1] & 0x80))
            return i >= 2 ? i - 2 : 0;   /* its first byte may have come in the last read */
        int len7 = g->hdr[1] & 0x7f;
        int need = 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + 4;
        if (g->hdr_have < need)
            continue;
        uint64_t len = (uint64_t)len7;
        if (len7 >= 126) {
            len = 0;
            for (int k = 2; k < need - 4; k++)
                len = len << 8 | g->hdr[k];
        }
        g->payload_left = len;
        g->hdr_have = 0;
    }
    return n;
}

/* Every recv() in the process comes here (see the top of the file). */
ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    if (!table || !pthread_equal(pthread_self(), loop_thread))
        return sys_recv(fd, buf, len, flags);
    guard *g = fd >= 0 && fd < table_n ? table[fd] : NULL;
    if (!g || (flags & MSG_PEEK))
        return sys_recv(fd, buf, len, flags);
    ssize_t n;
    switch (g->mode) {
    case GUARD_HTTP:
        if ((n = sys_recv(fd, buf, len, flags | MSG_PEEK)) <= 0)
            return n;
        return sys_recv(fd, buf, http_cut(g, buf, (size_t)n), flags);
    case GUARD_BODY:
        if ((n = sys_recv(fd, buf, len < g->body_left ? len : (size_t)g->body_left, flags)) <= 0)
            return n;
        g->body_left -= (uint64_t)n;
        if (!g->body_left)
            g->mode = GUARD_HOLD;
        return n;
    case GUARD_DRAIN:
        if ((n = sys_recv(fd, buf, len < g->body_left ? len : (size_t)g->body_left, flags)) <= 0)
            return n;
        g->body_left -= (uint64_t)n;
        if (!g->body_left) {
            g->mode = GUARD_HOLD;
            lws_callback_on_writable(g->wsi);
        }
        errno = EAGAIN;
        return -1;
    case GUARD_HOLD:
        /* Past the body, before the answer: lws must not see these bytes (lws 4.1 reports
         * the body complete again for each read, and would parse them as a request
         * before this one is answered). They are read (so the poll does not spin) and
         * dropped; blank lines are allowed (RFC 9112 2.2), anything else was a
         * pipelined request, and the connection closes after this answer. */
        if ((n = sys_recv(fd, buf, len, flags)) <= 0)
            return n;
        for (ssize_t i = 0; i < n; i++)
            if (((unsigned char *)buf)[i] != '\r' && ((unsigned char *)buf)[i] != '\n')
                g->held_request = 1;
        g->held += (uint64_t)n;
        if (g->held > HOLD_MAX)
            return 0;   /* lws closes it as if the peer had */
        errno = EAGAIN;
        return -1;
    case GUARD_WS: {
        if ((n = sys_recv(fd, buf, len, flags)) <= 0)
            return n;
        size_t ok = ws_scan(g, buf, (size_t)n);
        if (ok == (size_t)n)
            return n;
        /* An unmasked frame: what came before it is delivered, it and the rest never
         * are. The callbacks see kvpd_wsguard_failed() and close with 1002; the timeout
         * closes a client that reads nothing (so no writeable callback comes). */
        g->mode = GUARD_FAILED;
        lws_set_timeout(g->wsi, PENDING_TIMEOUT_CLOSE_SEND, 5);
        lws_callback_on_writable(g->wsi);
        if (ok)
            return (ssize_t)ok;
        errno = EAGAIN;
        return -1;
    }
    case GUARD_FAILED:
    default:
        /* Read and drop: nothing more reaches lws; 0 (the peer closed) lets lws close. */
        if ((n = sys_recv(fd, buf, len, flags)) <= 0)
            return n;
        errno = EAGAIN;
        return -1;
    }
}
