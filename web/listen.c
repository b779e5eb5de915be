/* The listening socket. kvpd accepts connections itself and hands each one to lws
 * (lws_adopt_socket_vhost), so that it can bound them (max_connections) and live
 * through running out of file descriptors: lws's own accept logs EMFILE and returns
 * with the connection still queued, and the level-triggered poll fires again at once,
 * 100% CPU. Here a reserve descriptor is given up to accept and close the connection
 * (redis/nginx's technique), and when even that fails accepting pauses with a back-off. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "web/conn.h"

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000
#define LOG_EVERY_S 10.0
#define ACCEPTS_PER_WAKEUP 64     /* then the loop serves others */
/* Connections accepted past max_connections, for /healthz, /health and /metrics only
 * (each is answered and closed): health checks get through while clients hold every
 * slot. */
#define HEALTH_RESERVE 4

/* A client address with connections open (max_connections_per_address). Loop thread
 * only; outlives the listener: connections close after it. */
typedef struct kvpd_peer {
    struct kvpd_peer *next;
    int count;
    size_t len;
    unsigned char addr[16];
} kvpd_peer;

/* A connection kvpd accepted: lws's opaque user data of its wsi. */
typedef struct kvpd_slot {
    kvpd_peer *peer;
    int reserve;                  /* accepted into HEALTH_RESERVE */
    kvpd_wsguard *guard;          /* its frame guard's state (web/wsguard.c) */
} kvpd_slot;

static kvpd_peer *peers;

struct kvpd_listener {
    uv_poll_t poll;
    uv_timer_t backoff;
    int fd;
    int reserve_fd;               /* /dev/null, held for the out-of-descriptors case */
    int backoff_ms;
    uint64_t shed_since_log;      /* connections closed unserved since the last log line */
    double last_log;
    kvpd_web *w;
    int closing;
};

static void listener_log(struct kvpd_listener *l, const char *why)
{
    double now = kvp_now();
    if (now - l->last_log < LOG_EVERY_S)
        return;
    kvpd_log("warning", "accept: %s: new connections are closed unserved (%llu so far "
             "since the last report)", why, (unsigned long long)l->shed_since_log);
    l->last_log = now;
    l->shed_since_log = 0;
}

static void on_readable(uv_poll_t *h, int status, int events);

static void on_backoff(uv_timer_t *t)
{
    struct kvpd_listener *l = t->data;
    if (l->closing)
        return;
    if (l->reserve_fd < 0)
        l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    uv_poll_start(&l->poll, UV_READABLE, on_readable);
}

/* Stops accepting for a while (doubling up to BACKOFF_MAX_MS while it keeps failing). */
static void back_off(struct kvpd_listener *l)
{
    uv_poll_stop(&l->poll);
    l->backoff_ms = l->backoff_ms ? l->backoff_ms * 2 : BACKOFF_MIN_MS;
    if (l->backoff_ms > BACKOFF_MAX_MS)
        l->backoff_ms = BACKOFF_MAX_MS;
    uv_timer_start(&l->backoff, on_backoff, (uint64_t)l->backoff_ms, 0);
}

/* Out of descriptors: the reserve makes room to take the connection off the queue and
 * close it, so the client learns at once instead of hanging in the backlog. */
static int shed_one(struct kvpd_listener *l)
{
    if (l->reserve_fd < 0)
        return -1;
    close(l->reserve_fd);
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0)
        close(fd);
    l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    l->w->metrics->connections_refused++;
    l->shed_since_log++;
    return l->reserve_fd < 0 ? -1 : 0;
}

/* Over max_connections: a short HTTP answer (it fits any socket buffer), then close. */
static void refuse(struct kvpd_listener *l, int fd, const char *why)
{
    char busy[256];
    int len = snprintf(busy, sizeof busy, "HTTP/1.1 503 Service Unavailable\r\nConnection: "
                       "close\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n\r\n%s\n",
                       strlen(why) + 1, why);
    ssize_t n = send(fd, busy, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)n;   /* best effort: the close says the same */
    shutdown(fd, SHUT_WR);
    close(fd);
    l->w->metrics->connections_refused++;
    l->shed_since_log++;
    listener_log(l, why);
}

/* The peer of an accepted connection (made with count 0); NULL when out of memory. */
static kvpd_peer *peer_of(const struct sockaddr_storage *sa)
{
    const unsigned char *a = sa->ss_family == AF_INET6
        ? ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr
        : (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr;
    size_t len = sa->ss_family == AF_INET6 ? 16 : 4;
    for (kvpd_peer *p = peers; p; p = p->next)
        if (p->len == len && !memcmp(p->addr, a, len))
            return p;
    kvpd_peer *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->len = len;
    memcpy(p->addr, a, len);
    p->next = peers;
    peers = p;
    return p;
}

static void peer_unref(kvpd_peer *p)
{
    if (--p->count > 0)
        return;
    for (kvpd_peer **pp = &peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            free(p);
            return;
        }
}

int kvpd_listen_reserved(struct lws *wsi)
{
    const kvpd_slot *s = lws_get_opaque_user_data(wsi);
    return s && s->reserve;
}

void kvpd_listen_closed(struct lws *wsi)
{
    kvpd_slot *s = lws_get_opaque_user_data(wsi);
    if (!s)
        return;
    lws_set_opaque_user_data(wsi, NULL);
    kvpd_wsguard_close(s->guard);
    peer_unref(s->peer);
    free(s);
}

static void on_readable(uv_poll_t *h, int status, int events)
{
    struct kvpd_listener *l = h->data;
    kvpd_web *w = l->w;
    (void)events;
    if (status < 0 || l->closing)
        return;
    for (int i = 0; i < ACCEPTS_PER_WAKEUP; i++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        memset(&sa, 0, sizeof sa);
        int fd = accept4(l->fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED)
                continue;
            if (e == EAGAIN || e == EWOULDBLOCK)
                break;
            if ((e == EMFILE || e == ENFILE) && shed_one(l) == 0) {
                listener_log(l, strerror(e));
                continue;
            }
            listener_log(l, strerror(e));
            back_off(l);
            return;
        }
        l->backoff_ms = 0;
        if (w->draining) {
            close(fd);
            continue;
        }
        int max = w->cfg->max_connections;
        if (max && w->connections_open >= max + HEALTH_RESERVE) {
            refuse(l, fd, "too many connections");
            continue;
        }
        kvpd_peer *peer = peer_of(&sa);
        int per = w->cfg->max_connections_per_address;
        if (!peer || (per && peer->count >= per)) {
            if (peer && !peer->count)
                peer_unref(peer);
            refuse(l, fd, "too many connections from this address");
            continue;
        }
        /* Each token goes out as its own small frame: without TCP_NODELAY (which lws
         * sets on the sockets it accepts itself) Nagle holds it until the client's
         * delayed ACK, and tokens arrive in bursts about 40 ms apart. */
        int one = 1;
        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 && errno != EOPNOTSUPP)
            listener_log(l, strerror(errno));
        kvpd_slot *slot = malloc(sizeof *slot);
        kvpd_wsguard *guard = NULL;
        if (!slot || kvpd_wsguard_accept(fd, &guard) < 0) {   /* its frames could not be checked */
            free(slot);
            if (!peer->count)
                peer_unref(peer);
            refuse(l, fd, "too many connections");
            continue;
        }
        *slot = (kvpd_slot){peer, max && w->connections_open >= max, guard};
        peer->count++;
        struct lws_vhost *vh = lws_get_vhost_by_name(w->lws, "default");
        struct lws *wsi = vh ? lws_adopt_socket_vhost(vh, fd) : NULL;
        if (wsi) {
            lws_set_opaque_user_data(wsi, slot);
        } else {   /* lws closed fd on failure */
            kvpd_wsguard_close(guard);
            peer_unref(peer);
            free(slot);
            listener_log(l, "lws could not adopt a connection");
        }
    }
}

static int bind_listen(const char *host, int port, int *out, int *bound_port, char *err,
                       size_t errlen)
{
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICHOST,
                             .ai_socktype = SOCK_STREAM}, *ai;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &ai);
    if (rc) {
        snprintf(err, errlen, "listen: '%s' is not an IP address: %s", host, gai_strerror(rc));
        return -EINVAL;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol), one = 1;
    rc = fd < 0 ? -errno : 0;
    if (!rc && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
        rc = -errno;
    if (!rc && ai->ai_family == AF_INET6 &&
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) < 0)
        rc = -errno;
    if (!rc && bind(fd, ai->ai_addr, ai->ai_addrlen) < 0)
        rc = -errno;
    if (!rc && listen(fd, SOMAXCONN) < 0)
        rc = -errno;
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (!rc && getsockname(fd, (struct sockaddr *)&sa, &sl) < 0)
        rc = -errno;
    freeaddrinfo(ai);
    if (rc) {
        if (fd >= 0)
            close(fd);
        snprintf(err, errlen, "could not listen on %s:%d: %s", host ? host : "*", port,
                 strerror(-rc));
        return rc;
    }
    *bound_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                 : ((struct sockaddr_in *)&sa)->sin_port);
    *out = fd;
    return 0;
}

int kvpd_listen_start(kvpd_web *w, const char *host, char *err, size_t errlen)
{
    struct kvpd_listener *l = calloc(1, sizeof *l);
    if (!l) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    l->w = w;
    int rc = kvpd_wsguard_init();
    if (rc < 0) {
        snprintf(err, errlen, "websocket frame guard: %s", strerror(-rc));
        free(l);
        return rc;
    }
    if (kvpd_wsguard_check() < 0) {
        snprintf(err, errlen, "websocket frame guard: lws's reads do not go through it "
                 "(recv is not bound to kvpd's)");
        free(l);
        return -ENOSYS;
    }
    rc = bind_listen(host, w->cfg->listen_port, &l->fd, &w->port, err, errlen);
    if (rc < 0) {
        free(l);
        return rc;
    }
    l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    uv_poll_init(w->loop, &l->poll, l->fd);
    uv_timer_init(w->loop, &l->backoff);
    l->poll.data = l->backoff.data = l;
    uv_poll_start(&l->poll, UV_READABLE, on_readable);
    w->listener = l;
    return 0;
}

static void on_closed(uv_handle_t *h)
{
    struct kvpd_listener *l = h->data;
    if (++l->closing == 3) {   /* 1 (stop) + both handles */
        if (l->reserve_fd >= 0)
            close(l->reserve_fd);
        close(l->fd);
        free(l);
        kvpd_wsguard_free();
    }
}

void kvpd_listen_stop(kvpd_web *w)
{
    struct kvpd_listener *l = w->listener;
    if (!l)
        return;
    w->listener = NULL;
    l->closing = 1;
    uv_close((uv_handle_t *)&l->poll, on_closed);
    uv_close((uv_handle_t *)&l->backoff, on_closed);
}
