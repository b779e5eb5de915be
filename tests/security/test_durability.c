/* A `done` the client saw must be on disk, or say it is not. With the
 * session's state unwritable (directories squat on <id>.snap.tmp and <id>.journal, as a
 * full disk or no descriptors would fail the write), the turn's done says durable: false with the
 * reason, /healthz answers 503 "degraded", and SIGTERM exits non-zero. Once a write
 * succeeds again, all three recover. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

static char g_dir[128];

static void setup(void)
{
    cr_assert_eq(h_mkdtemp(g_dir, sizeof g_dir), 0);
}

static void teardown(void)
{
    h_rmdir(g_dir);
}

TestSuite(security_durability, .init = setup, .fini = teardown, .timeout = 90);

static const char *str_of(json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

static json_t *turn(ws_client *c, const char *text)
{
    json_t *done = h_turn(c, text, 8, NULL);
    cr_assert(done, "no answer to '%s'", text);
    cr_assert_str_eq(str_of(done, "type"), "done", "%s", str_of(done, "message"));
    return done;
}

/* Directories where the session's next writes go (<base>.snap.tmp, <base>.journal). */
static void squat_on(const char *base)
{
    char path[600];
    snprintf(path, sizeof path, "%s.snap.tmp", base);
    cr_assert_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s.journal", base);
    unlink(path);
    cr_assert_eq(mkdir(path, 0700), 0);
}

static void unsquat(const char *base)
{
    char path[600];
    snprintf(path, sizeof path, "%s.snap.tmp", base);
    rmdir(path);
    snprintf(path, sizeof path, "%s.journal", base);
    rmdir(path);
}

static int health(const kvpd_proc *p, char **body)
{
    return h_get(p, "/healthz", NULL, body);
}

Test(security_durability, a_turn_not_on_disk_says_so_and_the_daemon_is_degraded)
{
    kvpd_proc p;
    char args[256], squat[512];
    snprintf(args, sizeof args, "--state-dir %s", g_dir);
    cr_assert_eq(kvpd_start(&p, args), 0, "kvpd did not start (log %s)", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);

    json_t *done = turn(&c, "Once upon a time");
    cr_expect(json_is_true(json_object_get(done, "durable")), "a written turn is durable");
    json_decref(done);
    /* The session's id, from its snapshot's name. */
    json_t *stats = h_stats(&p);
    cr_assert(stats);
    const char *id = str_of(json_array_get(json_object_get(stats, "session_list"), 0), "id");
    cr_assert(id);
    snprintf(squat, sizeof squat, "%s/%s", g_dir, id);
    json_decref(stats);
    squat_on(squat);

    done = turn(&c, "The dog ran to the park.");
    cr_expect(json_is_false(json_object_get(done, "durable")),
              "a turn whose snapshot failed is not reported durable");
    const char *why = str_of(done, "durable_error");
    cr_expect(why && strstr(why, squat), "reason: %s", why ? why : "(none)");
    json_decref(done);
    char *body = NULL;
    cr_expect_eq(health(&p, &body), 503, "/healthz: %s", body);
    cr_expect(body && strstr(body, "degraded"), "%s", body);
    free(body);

    /* The disk comes back: the next turn is written, and the daemon is healthy again. */
    unsquat(squat);
    done = turn(&c, "Then it went home.");
    cr_expect(json_is_true(json_object_get(done, "durable")));
    json_decref(done);
    body = NULL;
    cr_expect_eq(health(&p, &body), 200, "/healthz: %s", body);
    free(body);
    ws_close(&c);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

Test(security_durability, shutdown_with_a_turn_not_on_disk_exits_non_zero)
{
    kvpd_proc p;
    char args[256], squat[512];
    snprintf(args, sizeof args, "--state-dir %s", g_dir);
    cr_assert_eq(kvpd_start(&p, args), 0, "kvpd did not start (log %s)", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    json_t *done = turn(&c, "Once upon a time");
    json_decref(done);
    json_t *stats = h_stats(&p);
    const char *id = str_of(json_array_get(json_object_get(stats, "session_list"), 0), "id");
    cr_assert(id);
    snprintf(squat, sizeof squat, "%s/%s", g_dir, id);
    json_decref(stats);
    squat_on(squat);
    done = turn(&c, "The dog ran to the park.");
    cr_expect(json_is_false(json_object_get(done, "durable")));
    json_decref(done);
    ws_close(&c);
    /* The shutdown's retry fails too: the exit status says so. */
    int rc = kvpd_stop(&p, 10000);
    cr_expect(rc != 0 && rc != -1, "kvpd exited %d with a turn not on disk", rc);
    cr_expect(kvpd_log_has(&p, "could not be written"), "log %s", p.log);
    unsquat(squat);
}

Test(security_durability, without_a_state_dir_done_makes_no_durability_claim)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "kvpd did not start (log %s)", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    json_t *done = turn(&c, "Once upon a time");
    cr_expect_null(json_object_get(done, "durable"));
    json_decref(done);
    ws_close(&c);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}

/* The other way a write fails: no file descriptor left for the snapshot. */
Test(security_durability, no_descriptor_for_the_snapshot_is_not_durable)
{
    kvpd_proc p;
    char args[256];
    snprintf(args, sizeof args, "--state-dir %s", g_dir);
    cr_assert_eq(kvpd_start(&p, args), 0, "kvpd did not start (log %s)", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    json_t *done = turn(&c, "Once upon a time");
    cr_expect(json_is_true(json_object_get(done, "durable")));
    json_decref(done);
    struct rlimit old, none;
    cr_assert_eq(prlimit(p.pid, RLIMIT_NOFILE, NULL, &old), 0);
    int fds = h_open_fds(p.pid);
    cr_assert_geq(fds, 0, "cannot read /proc/%d/fd", (int)p.pid);
    none.rlim_cur = (rlim_t)fds;
    none.rlim_max = old.rlim_max;
    cr_assert_eq(prlimit(p.pid, RLIMIT_NOFILE, &none, NULL), 0);
    done = turn(&c, "The dog ran to the park.");
    cr_expect(json_is_false(json_object_get(done, "durable")),
              "a turn whose snapshot could not even be opened was reported durable");
    json_decref(done);
    cr_assert_eq(prlimit(p.pid, RLIMIT_NOFILE, &old, NULL), 0);
    char *body = NULL;
    cr_expect_eq(health(&p, &body), 503, "/healthz: %s", body);
    free(body);
    done = turn(&c, "Then it went home.");
    cr_expect(json_is_true(json_object_get(done, "durable")));
    json_decref(done);
    ws_close(&c);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}
