/* Settings that used to hurt, checked through the daemon: a `#` inside a quoted value is
 * part of it (an admin token keeps its full strength), a snapshot_ttl below idle_timeout
 * is refused at start, the time to live never deletes the snapshot of a session in memory
 * or attached however long it stays idle, and a state_dir kvpd cannot write is refused at
 * start. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(security_settings, .timeout = 90);

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

Test(security_settings, a_hash_inside_a_quoted_admin_token_is_part_of_it)
{
    char dir[64], conf[128];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(conf, sizeof conf, "%s/kvpd.conf", dir);
    FILE *f = fopen(conf, "w");
    cr_assert(f);
    fputs("admin_token = \"Zq#9xV2LmP7rT4kW\"  # the comment\n", f);
    fclose(f);
    char args[256];
    snprintf(args, sizeof args, "--config %s", conf);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, args), 0, "log %s", p.log);
    char *body = NULL;
    cr_assert_eq(h_get(&p, "/admin/stats", "Zq", &body), 401,
                 "the token was cut at '#': %s", body ? body : "");
    free(body);
    body = NULL;
    cr_assert_eq(h_get(&p, "/admin/stats", "Zq#9xV2LmP7rT4kW", &body), 200, "%s",
                 body ? body : "");
    free(body);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
    h_rmdir(dir);
}

Test(security_settings, snapshot_ttl_below_idle_timeout_is_refused_at_start)
{
    char dir[64], args[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--state-dir %s --idle-timeout 600 --snapshot-ttl 60", dir);
    kvpd_proc p;
    if (kvpd_spawn(&p, args) == 0) {
        int rc = kvpd_wait(&p, 10000);
        cr_assert_neq(rc, 0, "kvpd started with snapshot_ttl below idle_timeout");
    }
    cr_assert(kvpd_log_has(&p, "snapshot_ttl") && kvpd_log_has(&p, "idle_timeout"),
              "log %s", p.log);
    unlink(p.log);
    h_rmdir(dir);
}

static int snapshot_exists(const char *dir, const char *id)
{
    char path[256];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s.snap", dir, id);
    return stat(path, &sb) == 0;
}

/* A session stays attached past its snapshot's time to live (it parks after
 * idle_timeout, the sweep runs every second): its snapshot must stay, and its next turn
 * continue it. A session nobody holds any more loses its old snapshot as before. */
Test(security_settings, the_snapshot_of_an_attached_session_never_expires, .timeout = 120)
{
    char dir[64], args[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--state-dir %s --idle-timeout 2 --snapshot-ttl 2", dir);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, args), 0, "log %s", p.log);
    ws_client c, d;
    cr_assert_eq(h_connect(&p, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(&c, "session", 5000);
    cr_assert(s);
    char id[80];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    json_t *done = h_turn(&c, "Once upon a time", 4, NULL);
    cr_assert(done);
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);
    /* a second session, let go at once: its snapshot may expire */
    cr_assert_eq(h_connect(&p, &d), 0);
    cr_assert_eq(ws_send_text(&d, "{\"type\":\"hello\"}"), 0);
    s = h_expect(&d, "session", 5000);
    cr_assert(s);
    char gone[80];
    snprintf(gone, sizeof gone, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    done = h_turn(&d, "The dog ran", 4, NULL);
    cr_assert(done);
    json_decref(done);
    ws_close(&d);
    cr_assert(snapshot_exists(dir, id) && snapshot_exists(dir, gone));
    /* past the time to live by several sweeps (mtimes count in whole seconds), and past
     * the forgetting of the released session (twice idle_timeout) */
    int expired = 0;
    for (int i = 0; i < 100 && !expired; i++) {
        sleep_ms(100);
        expired = !snapshot_exists(dir, gone);
    }
    cr_assert(expired, "the released session's snapshot was not expired (log %s)", p.log);
    sleep_ms(2500);
    cr_assert(snapshot_exists(dir, id),
              "the attached session's snapshot expired (log %s)", p.log);
    h_turn_ok(&c, "and then", 4);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
    h_rmdir(dir);
}

/* Root writes anywhere: the check runs as an unprivileged user (--check-config stops
 * after the settings are checked). */
Test(security_settings, a_read_only_state_dir_is_refused_at_start)
{
    char dir[64];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    cr_assert_eq(chmod(dir, 0555), 0);
    char exe[512], model[512], tok[512];
    snprintf(exe, sizeof exe, "%s", h_kvpd());
    snprintf(model, sizeof model, "%s", h_shared("models/stories260K.bin"));
    snprintf(tok, sizeof tok, "%s", h_shared("models/tok512.bin"));
    int out[2];
    cr_assert_eq(pipe(out), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (geteuid() == 0 && (chown(dir, 65534, 65534) < 0 || setgid(65534) < 0 ||
                               setuid(65534) < 0))
            _exit(99);
        dup2(out[1], 2);
        dup2(out[1], 1);
        execl(exe, "kvpd", "--model", model, "--tokenizer", tok, "--state-dir", dir,
              "--check-config", (char *)NULL);
        _exit(98);
    }
    close(out[1]);
    static char text[4096];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof text - 1 && (r = read(out[0], text + got, sizeof text - 1 - got)) > 0)
        got += (size_t)r;
    text[got] = '\0';
    close(out[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    chown(dir, 0, 0);
    chmod(dir, 0755);
    h_rmdir(dir);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) < 98,
              "status %d: %s", status, text);
    cr_assert(strstr(text, "not writable"), "%s", text);
}
