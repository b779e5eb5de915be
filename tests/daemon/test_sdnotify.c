/* Integration: kvpd under a systemd-like supervisor. The test binds the AF_UNIX
 * datagram socket named by NOTIFY_SOCKET, as systemd does, and reads what kvpd sends:
 * STATUS= while loading, READY=1 once it serves, WATCHDOG=1 at half WATCHDOG_USEC from
 * the loop, RELOADING=1 and READY=1 around a SIGHUP, STOPPING=1 on SIGTERM. */
#include <criterion/criterion.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

static char g_dir[128], g_sock[256];
static int g_fd = -1;

static void setup(void)
{
    cr_assert_eq(h_mkdtemp(g_dir, sizeof g_dir), 0);
    snprintf(g_sock, sizeof g_sock, "%s/notify", g_dir);
    g_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(g_fd, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    cr_assert_lt(strlen(g_sock), sizeof sa.sun_path);
    memcpy(sa.sun_path, g_sock, strlen(g_sock) + 1);
    cr_assert_eq(bind(g_fd, (struct sockaddr *)&sa, sizeof sa), 0);
}

static void teardown(void)
{
    close(g_fd);
    h_rmdir(g_dir);
}

TestSuite(sdnotify, .init = setup, .fini = teardown, .timeout = 60);

/* Reads datagrams for ms milliseconds (or until one has `until`), appending each to
 * log with a '|' after it. Returns how many came. */
static int collect(char *log, size_t cap, int ms, const char *until)
{
    int n = 0;
    double end = ws_now_ms() + ms;
    for (;;) {
        int left = (int)(end - ws_now_ms());
        struct pollfd p = {.fd = g_fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) != 1)
            return n;
        char buf[4096];
        ssize_t k = recv(g_fd, buf, sizeof buf - 1, 0);
        if (k < 0)
            return n;
        buf[k] = '\0';
        size_t used = strlen(log);
        snprintf(log + used, cap - used, "%s|", buf);
        n++;
        if (until && strstr(buf, until))
            return n;
    }
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

Test(sdnotify, ready_status_watchdog_reload_and_stopping)
{
    setenv("NOTIFY_SOCKET", g_sock, 1);
    setenv("WATCHDOG_USEC", "100000", 1);   /* pings every 50 ms */
    unsetenv("WATCHDOG_PID");
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0, "log %s", d.log);
    static char log[1 << 16];
    collect(log, sizeof log, 400, NULL);
    const char *loading = strstr(log, "STATUS=loading model");
    const char *ready = strstr(log, "READY=1\nSTATUS=serving on 127.0.0.1:");
    cr_assert(loading, "no loading status in '%s'", log);
    cr_assert(ready, "no READY=1 in '%s'", log);
    cr_assert_lt(loading, ready, "READY=1 came before loading");
    char port[32];
    snprintf(port, sizeof port, ":%d:", d.port);
    cr_assert(strstr(ready, port), "READY's status does not name port %d", d.port);
    cr_assert_geq(count(log, "WATCHDOG=1"), 4, "watchdog pings in 400 ms: %d",
                  count(log, "WATCHDOG=1"));

    log[0] = '\0';
    kill(d.pid, SIGHUP);
    collect(log, sizeof log, 5000, "READY=1");
    const char *reloading = strstr(log, "RELOADING=1\nMONOTONIC_USEC=");
    cr_assert(reloading, "no RELOADING=1 in '%s'", log);
    cr_assert(strstr(reloading, "READY=1\nSTATUS=serving"), "no READY=1 after the reload");

    log[0] = '\0';
    kill(d.pid, SIGTERM);
    collect(log, sizeof log, 5000, "STOPPING=1");
    cr_assert(strstr(log, "STOPPING=1\nSTATUS=stopping"), "no STOPPING=1 in '%s'", log);
    cr_assert_eq(kvpd_wait(&d, 10000), 0);
}

Test(sdnotify, no_notify_socket_no_datagrams)
{
    unsetenv("NOTIFY_SOCKET");
    setenv("WATCHDOG_USEC", "100000", 1);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    static char log[4096];
    cr_assert_eq(collect(log, sizeof log, 200, NULL), 0);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
