/* sd_notify by hand: kvpd needs only "send this text to that socket", and libsystemd
 * would be a dependency for a dozen lines. */
#include "daemon/notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/kvpd.h"

/* One warning per process: a broken socket would otherwise log every watchdog tick. */
static atomic_flag g_warned = ATOMIC_FLAG_INIT;

static int fail(int rc, const char *what, const char *addr)
{
    if (!atomic_flag_test_and_set(&g_warned))
        kvpd_log("warning", "systemd notify: %s %s: %s (not logged again)", what, addr,
                 strerror(-rc));
    return rc;
}

/* "/path" or "@abstract" into a sockaddr_un; the length excludes padding. */
static int notify_addr(const char *e, struct sockaddr_un *sa, socklen_t *salen)
{
    size_t n = strlen(e);
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    if (e[0] == '/') {
        if (n >= sizeof sa->sun_path)
            return -ENAMETOOLONG;
        memcpy(sa->sun_path, e, n + 1);
        *salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
        return 0;
    }
    if (e[0] == '@') {
        if (n < 2)
            return -EINVAL;
        if (n > sizeof sa->sun_path)
            return -ENAMETOOLONG;
        /* Abstract: a leading NUL, the name, no terminator; the length delimits it. */
        memcpy(sa->sun_path + 1, e + 1, n - 1);
        *salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
        return 0;
    }
    return -EAFNOSUPPORT;
}

int kvpd_notify(const char *fmt, ...)
{
    const char *e = getenv("NOTIFY_SOCKET");
    if (!e || !e[0])
        return 0;
    struct sockaddr_un sa;
    socklen_t salen;
    int rc = notify_addr(e, &sa, &salen);
    if (rc < 0)
        return fail(rc, "unusable NOTIFY_SOCKET", e);

    char *msg;
    va_list ap;
    va_start(ap, fmt);
    int len = vasprintf(&msg, fmt, ap);
    va_end(ap);
    if (len < 0)
        return fail(-ENOMEM, "formatting a message for", e);

    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        rc = fail(-errno, "socket() for", e);
        free(msg);
        return rc;
    }
    ssize_t sent;
    do
        sent = sendto(fd, msg, (size_t)len, MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
    while (sent < 0 && errno == EINTR);
    if (sent < 0)
        rc = fail(-errno, "sendto", e);
    else if (sent != len)   /* datagrams are all or nothing; be sure */
        rc = fail(-EMSGSIZE, "short sendto", e);
    else
        rc = 1;
    close(fd);
    free(msg);
    return rc;
}

/* A decimal u64, nothing else. */
static int parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (!s || !*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 0;
}

uint64_t kvpd_notify_watchdog_usec(void)
{
    const char *usec_s = getenv("WATCHDOG_USEC");
    if (!usec_s)
        return 0;
    uint64_t usec, pid;
    if (parse_u64(usec_s, &usec) < 0 || usec == 0) {
        kvpd_log("warning", "systemd watchdog: ignoring WATCHDOG_USEC=%s", usec_s);
        return 0;
    }
    /* Set by systemd so that a child inheriting the environment does not ping for us. */
    const char *pid_s = getenv("WATCHDOG_PID");
    if (pid_s && (parse_u64(pid_s, &pid) < 0 || pid != (uint64_t)getpid()))
        return 0;
    return usec;
}
