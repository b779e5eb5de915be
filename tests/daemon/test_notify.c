/* The notify protocol against real AF_UNIX datagram sockets, as systemd binds them. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/notify.h"

static char g_dir[64];
static char g_path[128];

static void setup(void)
{
    strcpy(g_dir, "/tmp/kvpd_notify_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/notify", g_dir);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    cr_redirect_stderr();
}

static void teardown(void)
{
    unlink(g_path);
    rmdir(g_dir);
}

TestSuite(notify, .init = setup, .fini = teardown);

/* A receiving socket bound to a path or, with a leading '@', to an abstract name. */
static int bind_receiver(const char *name)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    socklen_t len;
    if (name[0] == '@') {
        memcpy(sa.sun_path + 1, name + 1, n - 1);
        len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    } else {
        memcpy(sa.sun_path, name, n + 1);
        len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    }
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, len), 0, "bind %s: %s", name, strerror(errno));
    return fd;
}

/* One datagram, or -1 when none arrives within ms. */
static ssize_t receive(int fd, char *buf, size_t cap, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) != 1)
        return -1;
    return recvfrom(fd, buf, cap, 0, NULL, NULL);
}

static void expect_datagram(int fd, const char *want)
{
    char buf[8192];
    ssize_t n = receive(fd, buf, sizeof buf, 2000);
    cr_assert_eq(n, (ssize_t)strlen(want), "received %zd bytes, want %zu", n, strlen(want));
    cr_expect_eq(memcmp(buf, want, (size_t)n), 0, "got '%.*s'", (int)n, buf);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static char *captured_stderr(void)
{
    fflush(stderr);
    FILE *f = cr_get_redirected_stderr();
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    return buf;
}

Test(notify, sends_one_datagram_to_a_path_socket)
{
    int fd = bind_receiver(g_path);
    setenv("NOTIFY_SOCKET", g_path, 1);
    cr_assert_eq(kvpd_notify("READY=1\nSTATUS=%s", "x"), 1);
    expect_datagram(fd, "READY=1\nSTATUS=x");
    close(fd);
}

Test(notify, sends_one_datagram_to_an_abstract_socket)
{
    char name[64];
    snprintf(name, sizeof name, "@kvpd-test-notify-%d", (int)getpid());
    int fd = bind_receiver(name);
    setenv("NOTIFY_SOCKET", name, 1);
    cr_assert_eq(kvpd_notify("READY=1\nSTATUS=x"), 1);
    expect_datagram(fd, "READY=1\nSTATUS=x");
    close(fd);
}

Test(notify, each_call_is_its_own_datagram_in_order)
{
    int fd = bind_receiver(g_path);
    setenv("NOTIFY_SOCKET", g_path, 1);
    cr_assert_eq(kvpd_notify("STATUS=loading model %s", "stories260K"), 1);
    cr_assert_eq(kvpd_notify("WATCHDOG=1"), 1);
    cr_assert_eq(kvpd_notify("STOPPING=1\nSTATUS=stopping (%d turn(s) to finish)", 3), 1);
    expect_datagram(fd, "STATUS=loading model stories260K");
    expect_datagram(fd, "WATCHDOG=1");
    expect_datagram(fd, "STOPPING=1\nSTATUS=stopping (3 turn(s) to finish)");
    close(fd);
}

Test(notify, a_long_status_arrives_whole)
{
    int fd = bind_receiver(g_path);
    setenv("NOTIFY_SOCKET", g_path, 1);
    char status[4001];
    memset(status, 'z', 4000);
    status[4000] = 0;
    cr_assert_eq(kvpd_notify("STATUS=%s", status), 1);
    char want[4100];
    snprintf(want, sizeof want, "STATUS=%s", status);
    expect_datagram(fd, want);
    close(fd);
}

Test(notify, no_op_without_notify_socket)
{
    int fd = bind_receiver(g_path);
    cr_expect_eq(kvpd_notify("READY=1"), 0);
    setenv("NOTIFY_SOCKET", "", 1);
    cr_expect_eq(kvpd_notify("READY=1"), 0);
    char buf[64];
    cr_expect_eq(receive(fd, buf, sizeof buf, 100), -1, "something was sent");
    cr_expect_str_empty(captured_stderr());
    close(fd);
}

Test(notify, a_missing_socket_fails_and_is_logged_once)
{
    setenv("NOTIFY_SOCKET", g_path, 1);   /* nothing bound there */
    cr_expect_eq(kvpd_notify("READY=1"), -ENOENT);
    cr_expect_eq(kvpd_notify("WATCHDOG=1"), -ENOENT);
    cr_expect_eq(kvpd_notify("WATCHDOG=1"), -ENOENT);
    const char *log = captured_stderr();
    cr_expect_eq(count(log, "systemd notify"), 1, "log: %s", log);
    cr_expect_eq(count(log, g_path), 1, "log: %s", log);
}

Test(notify, a_closed_receiver_is_refused)
{
    int fd = bind_receiver(g_path);
    close(fd);   /* the path stays, nobody reads */
    setenv("NOTIFY_SOCKET", g_path, 1);
    cr_expect_eq(kvpd_notify("READY=1"), -ECONNREFUSED);
}

Test(notify, unusable_addresses_are_errors)
{
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    cr_expect_eq(kvpd_notify("READY=1"), -EAFNOSUPPORT);
    setenv("NOTIFY_SOCKET", "vsock:2:1234", 1);
    cr_expect_eq(kvpd_notify("READY=1"), -EAFNOSUPPORT);
    setenv("NOTIFY_SOCKET", "@", 1);
    cr_expect_eq(kvpd_notify("READY=1"), -EINVAL);
    char longp[200] = "/";
    memset(longp + 1, 'p', 150);
    longp[151] = 0;
    setenv("NOTIFY_SOCKET", longp, 1);
    cr_expect_eq(kvpd_notify("READY=1"), -ENAMETOOLONG);
    longp[0] = '@';
    setenv("NOTIFY_SOCKET", longp, 1);
    cr_expect_eq(kvpd_notify("READY=1"), -ENAMETOOLONG);
    const char *log = captured_stderr();
    cr_expect_eq(count(log, "systemd notify"), 1, "log: %s", log);
}

Test(notify, the_longest_path_fits)
{
    /* sun_path holds 108 bytes: a 107-character path plus its NUL. */
    char p[108];
    int n = snprintf(p, sizeof p, "%s/", g_dir);
    memset(p + n, 's', sizeof p - 1 - (size_t)n);
    p[sizeof p - 1] = 0;
    int fd = bind_receiver(p);
    setenv("NOTIFY_SOCKET", p, 1);
    cr_expect_eq(kvpd_notify("READY=1"), 1);
    expect_datagram(fd, "READY=1");
    close(fd);
    unlink(p);
}

Test(notify, watchdog_interval)
{
    cr_expect_eq(kvpd_notify_watchdog_usec(), 0);
    setenv("WATCHDOG_USEC", "30000000", 1);
    cr_expect_eq(kvpd_notify_watchdog_usec(), 30000000);
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    cr_expect_eq(kvpd_notify_watchdog_usec(), 30000000);
    cr_expect_str_empty(captured_stderr());
}

Test(notify, watchdog_for_another_pid_is_off)
{
    setenv("WATCHDOG_USEC", "30000000", 1);
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);
    cr_expect_eq(kvpd_notify_watchdog_usec(), 0);
    setenv("WATCHDOG_PID", "1", 1);
    cr_expect_eq(kvpd_notify_watchdog_usec(), 0);
    setenv("WATCHDOG_PID", "", 1);
    cr_expect_eq(kvpd_notify_watchdog_usec(), 0);
    setenv("WATCHDOG_PID", "abc", 1);
    cr_expect_eq(kvpd_notify_watchdog_usec(), 0);
}

Test(notify, malformed_watchdog_usec_is_off)
{
    const char *bad[] = {"", "0", "-5", "12x", " 12", "1e6", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("WATCHDOG_USEC", bad[i], 1);
        cr_expect_eq(kvpd_notify_watchdog_usec(), 0, "'%s'", bad[i]);
    }
    setenv("WATCHDOG_USEC", "18446744073709551615", 1);   /* UINT64_MAX itself parses */
    cr_expect_eq(kvpd_notify_watchdog_usec(), UINT64_MAX);
    cr_expect_neq(strstr(captured_stderr(), "WATCHDOG_USEC=12x"), NULL);
}
