/* Connections are bounded (max_connections), idle websockets are
 * closed (connection_idle_timeout), and running out of file descriptors does not spin
 * the loop (lws's accept would log EMFILE at every turn of the loop, at 100% CPU). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(security_fds, .timeout = 90);

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int hello_ok(ws_client *c)
{
    if (ws_send_text(c, "{\"type\":\"hello\"}") < 0)
        return 0;
    json_t *s = h_expect(c, "session", 5000);
    int ok = s != NULL;
    json_decref(s);
    return ok;
}

Test(security_fds, max_connections_is_enforced)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, "--max-connections 3"), 0, "log %s", p.log);
    ws_client c[3], extra;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(h_connect(&p, &c[i]), 0, "connection %d", i);
        cr_assert(hello_ok(&c[i]), "connection %d got no session", i);
    }
    /* A fourth is turned away, websocket or HTTP. */
    int rc = h_connect(&p, &extra);
    if (rc == 0) {
        cr_expect(!hello_ok(&extra), "a fourth connection was served");
        ws_close(&extra);
    }
    /* Health checks still get through (a few connections are kept for them), anything
     * else on those gets 503. */
    char *body = NULL;
    int status = h_get(&p, "/healthz", NULL, &body);
    cr_expect_eq(status, 200, "/healthz over the cap answered %d: %s", status, body);
    free(body);
    body = NULL;
    cr_expect_eq(h_get(&p, "/metrics", NULL, &body), 200);
    free(body);
    body = NULL;
    cr_expect_eq(h_get(&p, "/health", NULL, &body), 200, "/health over the cap: %s", body);
    free(body);
    body = NULL;
    status = h_get(&p, "/v1/models", NULL, &body);
    cr_expect_eq(status, 503, "/v1/models over the cap answered %d", status);
    cr_expect(body && strstr(body, "too many connections"), "%s", body);
    free(body);
    /* One leaves: room for another. */
    ws_close(&c[0]);
    int served = 0;
    for (int tries = 0; tries < 40 && !served; tries++) {
        sleep_ms(50);
        if (h_connect(&p, &extra) == 0) {
            served = hello_ok(&extra);
            ws_close(&extra);
        }
    }
    cr_expect(served, "no connection was served after one closed");
    for (int i = 1; i < 3; i++)
        ws_close(&c[i]);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_fds, an_idle_websocket_is_closed)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, "--connection-idle-timeout 1"), 0, "log %s", p.log);
    ws_client idle, busy;
    cr_assert_eq(h_connect(&p, &idle), 0);
    cr_assert(hello_ok(&idle));
    cr_assert_eq(h_connect(&p, &busy), 0);
    cr_assert(hello_ok(&busy));
    /* The busy one talks every 400 ms; the idle one says nothing. */
    for (int i = 0; i < 8; i++) {
        sleep_ms(400);
        cr_assert(hello_ok(&busy), "an active connection was closed");
    }
    char *payload = NULL;
    size_t len;
    double t0 = ws_now_ms();
    int op = ws_read(&idle, 3000, &payload, &len);
    free(payload);
    cr_expect(op != -ETIMEDOUT, "an idle websocket stayed open %.0f ms", ws_now_ms() - t0);
    cr_expect(op == WS_CLOSE || op < 0, "read %d", op);
    ws_close(&idle);
    ws_close(&busy);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

/* utime + stime in seconds. */
static double cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');   /* fields after the command name */
    unsigned long ut = 0, st = 0;
    cr_assert(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
                          &st) == 2);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int count_lines_with(const char *file, const char *text)
{
    FILE *f = fopen(file, "r");
    cr_assert(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

static int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

Test(security_fds, running_out_of_descriptors_does_not_spin)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    struct rlimit old, low;
    cr_assert_eq(prlimit(p.pid, RLIMIT_NOFILE, NULL, &old), 0);
    int fds = h_open_fds(p.pid);
    cr_assert_geq(fds, 0, "cannot read /proc/%d/fd", (int)p.pid);
    low.rlim_cur = (rlim_t)fds + 3;
    low.rlim_max = old.rlim_max;
    cr_assert_eq(prlimit(p.pid, RLIMIT_NOFILE, &low, NULL), 0);
    int socks[24], n = 0;
    for (int i = 0; i < 24; i++)
        if ((socks[n] = tcp_connect(p.port)) >= 0)
            n++;
    sleep_ms(300);
    double c0 = cpu_s(p.pid);
    sleep_ms(2000);
    double used = cpu_s(p.pid) - c0;
    cr_expect_lt(used, 0.5, "kvpd used %.2f s of CPU in 2 s while out of descriptors", used);
    int lines = count_lines_with(p.log, "accept");
    cr_expect_lt(lines, 20, "%d accept lines in the log", lines);
    /* Descriptors come back: it serves again. */
    for (int i = 0; i < n; i++)
        close(socks[i]);
    cr_assert_eq(prlimit(p.pid, RLIMIT_NOFILE, &old, NULL), 0);
    int status = -1;
    for (int tries = 0; tries < 60 && status != 200; tries++) {
        sleep_ms(100);
        char *body = NULL;
        status = h_get(&p, "/healthz", NULL, &body);
        free(body);
    }
    cr_expect_eq(status, 200, "kvpd did not serve again");
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_fds, idle_websockets_of_one_address_cannot_take_every_slot)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, "--max-connections 8 --max-connections-per-address 3"), 0,
                 "log %s", p.log);
    ws_client c[3], extra;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(h_connect(&p, &c[i]), 0, "connection %d", i);
        cr_assert(hello_ok(&c[i]), "connection %d got no session", i);
    }
    int rc = h_connect(&p, &extra);
    if (rc == 0) {
        cr_expect(!hello_ok(&extra), "a fourth connection from the address was served");
        ws_close(&extra);
    }
    char *body = NULL;
    int status = h_get(&p, "/healthz", NULL, &body);
    cr_expect(status == 503 || status < 0, "%d", status);
    if (status == 503)
        cr_expect(body && strstr(body, "from this address"), "%s", body);
    free(body);
    ws_close(&c[0]);
    int served = 0;
    for (int tries = 0; tries < 40 && !served; tries++) {
        sleep_ms(50);
        body = NULL;
        served = h_get(&p, "/healthz", NULL, &body) == 200;
        free(body);
    }
    cr_expect(served, "the address got no connection after one of its own closed");
    for (int i = 1; i < 3; i++)
        ws_close(&c[i]);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}
