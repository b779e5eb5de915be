/* systemd/kvpd.service: the directives the daemon relies on, and systemd's own verdict
 * (systemd-analyze verify) on a copy whose ExecStart is the kvpd just built. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char *read_source(const char *rel)
{
    const char *src = getenv("KVP_SOURCE");
    cr_assert_not_null(src, "KVP_SOURCE is not set (run through meson test)");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", src, rel);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    /* the whole file, whatever its size (the README outgrew a fixed buffer) */
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    cr_assert_geq(size, 0);
    rewind(f);
    char *buf = malloc((size_t)size + 1);
    cr_assert_not_null(buf);
    size_t n = fread(buf, 1, (size_t)size, f);
    fclose(f);
    cr_assert_eq(n, (size_t)size, "%s: short read", path);
    buf[n] = 0;
    return buf;
}

static char *read_unit(void)
{
    static char *unit;
    if (!unit)
        unit = read_source("systemd/kvpd.service");
    return unit;
}

/* 1 when the unit has the line "key=value" exactly. */
static int has_line(const char *unit, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = unit; (p = strstr(p, line)); p += n)
        if ((p == unit || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0))
            return 1;
    return 0;
}

Test(service, has_the_required_directives)
{
    const char *unit = read_unit();
    const char *want[] = {
        "[Service]",
        "Type=notify",
        "ExecStart=/usr/local/bin/kvpd --config /etc/kvpd/kvpd.conf --state-dir ${STATE_DIRECTORY}",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "DynamicUser=yes",
        "StateDirectory=kvpd",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictNamespaces=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "NotifyAccess=main",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "SystemCallFilter=@system-service",
        "MemoryDenyWriteExecute=yes",
        "UMask=0077",
        "[Install]",
        "WantedBy=multi-user.target",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_expect(has_line(unit, want[i]), "missing: %s", want[i]);
    cr_expect_not_null(strstr(unit, "\nWatchdogSec="), "no WatchdogSec");
    cr_expect_not_null(strstr(unit, "\nLimitNOFILE="), "no LimitNOFILE");
}

/* The README's install steps put the chat page and the policy weights where the
 * configuration it writes tells kvpd to look: the unit's ExecStart adds only the state
 * directory, since the build's defaults point into the source tree (hidden by
 * ProtectHome, or simply elsewhere). */
Test(service, readme_install_matches_the_unit)
{
    char *readme = read_source("README.md");
    const char *unit = read_unit();
    const char *want[] = {
        "sudo install -m 0755 build/daemon/kvpd /usr/local/bin/kvpd",
        "sudo cp -r web/static /usr/local/share/kvpd/static",
        "static_dir = /usr/local/share/kvpd/static",
        "policy/weights/stories260K.kvp /usr/local/share/kvpd/weights/stories260K.kvp",
        "policy_dir = /usr/local/share/kvpd/weights",
        "model = /usr/local/share/kvpd/stories260K.bin",
        "sudo tee /etc/kvpd/kvpd.conf",
        "sudo install -m 0644 systemd/kvpd.service /etc/systemd/system/kvpd.service",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_expect_not_null(strstr(readme, want[i]), "README does not say: %s", want[i]);
    cr_expect_not_null(strstr(unit, "--config /etc/kvpd/kvpd.conf"));
    cr_expect_not_null(strstr(unit, "--state-dir ${STATE_DIRECTORY}"));
    cr_expect_null(strstr(unit, "--static-dir"), "the configuration file names static_dir");
    free(readme);
}

static int have_systemd_analyze(void)
{
    return system("command -v systemd-analyze >/dev/null 2>&1") == 0;
}

/* Runs `systemd-analyze verify` on the unit text; returns its exit status and output. */
static int verify(const char *unit, char *out, size_t cap)
{
    char dir[] = "/tmp/kvpd_unit_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[128], cmd[256];
    snprintf(path, sizeof path, "%s/kvpd.service", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(unit, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "systemd-analyze verify --man=no %s 2>&1", path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int status = pclose(p);
    unlink(path);
    rmdir(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A unit with ExecStart= pointing at this build's kvpd (verify wants the binary). */
static char *unit_for_build(const char *unit)
{
    const char *build = getenv("KVP_BUILD");
    cr_assert_not_null(build);
    char kvpd[1024];
    snprintf(kvpd, sizeof kvpd, "%s/daemon/kvpd", build);
    cr_assert_eq(access(kvpd, X_OK), 0, "%s is not built", kvpd);
    const char *from = "ExecStart=/usr/local/bin/kvpd";
    const char *at = strstr(unit, from);
    cr_assert_not_null(at);
    static char out[20000];
    snprintf(out, sizeof out, "%.*sExecStart=%s%s", (int)(at - unit), unit, kvpd,
             at + strlen(from));
    return out;
}

Test(service, systemd_analyze_verify_accepts_it, .timeout = 60)
{
    if (!have_systemd_analyze())
        cr_skip_test("systemd-analyze not installed (Debian package systemd)");
    char out[8192];
    int rc = verify(unit_for_build(read_unit()), out, sizeof out);
    /* verify exits 0 on directives it ignores; it says so on stderr, so silence is
     * the real pass. */
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect_str_empty(out, "systemd-analyze verify said:\n%s", out);
}

Test(service, systemd_analyze_verify_catches_a_bad_directive, .timeout = 60)
{
    if (!have_systemd_analyze())
        cr_skip_test("systemd-analyze not installed (Debian package systemd)");
    /* The check above would notice a typo: the same unit with one spoiled value. */
    char *unit = unit_for_build(read_unit());
    char *t = strstr(unit, "Type=notify");
    cr_assert_not_null(t);
    memcpy(t, "Type=notifX", 11);
    char out[8192];
    verify(unit, out, sizeof out);
    cr_expect_not_null(strstr(out, "notifX"), "not reported: %s", out);
}

/* deploy/kvpd-node.service (a node of a cluster, docs/cluster.md): no state directory,
 * its sessions in Redis; systemd accepts it as it accepts kvpd.service. */
Test(service, the_cluster_node_unit_verifies, .timeout = 60)
{
    char *unit = read_source("deploy/kvpd-node.service");
    cr_expect(has_line(unit, "ExecStart=/usr/local/bin/kvpd --config /etc/kvpd/kvpd-node.conf "
                             "--node-id %H --admin-token-file ${RUNTIME_DIRECTORY}/admin.token"));
    cr_expect(has_line(unit, "Type=notify"));
    cr_expect_null(strstr(unit, "--state-dir"), "a node keeps no state directory");
    char *conf = read_source("deploy/kvpd-node.conf");
    cr_expect_not_null(strstr(conf, "\nstate_url = redis://"), "kvpd-node.conf names no Redis");
    free(conf);
    if (!have_systemd_analyze()) {
        free(unit);
        cr_skip_test("systemd-analyze not installed (Debian package systemd)");
    }
    char out[8192];
    int rc = verify(unit_for_build(unit), out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect_str_empty(out, "systemd-analyze verify said:\n%s", out);
    free(unit);
}

/* systemd/kvpd-learn.service and .timer: the nightly kvp learn --transcripts run at
 * idle priority that reloads kvpd only when a policy was installed; systemd accepts
 * both (the timer's unit beside it), and would report a spoiled directive. */
static int verify_learn(const char *service, const char *timer, char *out, size_t cap)
{
    char dir[] = "/tmp/kvpd_learn_unit_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char sp[128], tp[128], cmd[512];
    snprintf(sp, sizeof sp, "%s/kvpd-learn.service", dir);
    snprintf(tp, sizeof tp, "%s/kvpd-learn.timer", dir);
    FILE *f = fopen(sp, "w");
    fputs(service, f);
    fclose(f);
    f = fopen(tp, "w");
    fputs(timer, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "systemd-analyze verify --man=no %s %s 2>&1", tp, sp);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int status = pclose(p);
    unlink(sp);
    unlink(tp);
    rmdir(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(service, the_learn_timer_and_service_verify, .timeout = 60)
{
    char *service = read_source("systemd/kvpd-learn.service");
    char *timer = read_source("systemd/kvpd-learn.timer");
    cr_expect(has_line(service, "Nice=19"));
    cr_expect(has_line(service, "IOSchedulingClass=idle"));
    cr_expect(has_line(service, "Type=oneshot"));
    cr_expect_not_null(strstr(service, "--transcripts"));
    cr_expect_not_null(strstr(service, "systemctl reload kvpd.service"),
                       "kvpd is not reloaded after an install");
    cr_expect_not_null(strstr(service, "\"$rc\" -ne 3"), "exit 3 (policy kept) must not fail");
    cr_expect(has_line(timer, "Unit=kvpd-learn.service"));
    cr_expect(has_line(timer, "OnCalendar=*-*-* 03:00:00"));
    if (!have_systemd_analyze()) {
        free(service);
        free(timer);
        cr_skip_test("systemd-analyze not installed (Debian package systemd)");
    }
    char out[8192];
    int rc = verify_learn(service, timer, out, sizeof out);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, out);
    cr_expect_str_empty(out, "systemd-analyze verify said:\n%s", out);
    char *bad = strdup(timer);
    char *at = strstr(bad, "OnCalendar=");
    cr_assert_not_null(at);
    memcpy(at, "OnCalendaX=", 11);
    verify_learn(service, bad, out, sizeof out);
    cr_expect_not_null(strstr(out, "OnCalendaX"), "a spoiled timer was not reported: %s", out);
    free(bad);
    free(service);
    free(timer);
}
