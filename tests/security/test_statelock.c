/* One daemon per state directory: a second kvpd on a state_dir in use refuses to start,
 * naming the directory and the holder's pid (<state_dir>/kvpd.lock, flock), while
 * --check-config takes no lock; the lock goes with the holder, and a link, directory or
 * FIFO in the lock file's place is refused. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(security_statelock, .timeout = 120);

/* Runs kvpd on dir with args (at most 20 s: a second daemon that started would run
 * on), its stderr into log (malloc'd); the exit status (124: it did not exit). */
static int run(const char *dir, const char *args, char **log)
{
    char out[] = "/tmp/kvpd-lock-XXXXXX", cmd[4096];
    int fd = mkstemp(out);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "timeout 20 '%s' --listen 127.0.0.1:0 --model '%s' "
             "--tokenizer '%s' --state-dir '%s' %s >/dev/null 2>'%s'", h_kvpd(),
             h_shared("models/stories260K.bin"), h_shared("models/tok512.bin"), dir, args, out);
    int st = system(cmd);
    FILE *f = fopen(out, "r");
    cr_assert(f);
    *log = calloc(1, 65536);
    size_t n = fread(*log, 1, 65535, f);
    (*log)[n] = '\0';
    fclose(f);
    unlink(out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(security_statelock, a_second_daemon_on_the_same_state_dir_refuses_to_start)
{
    char dir[64], args[128], pid[32], path[128];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--state-dir %s", dir);
    kvpd_proc a;
    cr_assert_eq(kvpd_start(&a, args), 0, "log %s", a.log);
    snprintf(pid, sizeof pid, "pid %d", (int)a.pid);
    /* the lock file holds the pid */
    snprintf(path, sizeof path, "%s/kvpd.lock", dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    long in_file = 0;
    cr_assert_eq(fscanf(f, "%ld", &in_file), 1);
    fclose(f);
    cr_assert_eq(in_file, (long)a.pid);

    char *log;
    int rc = run(dir, "", &log);
    cr_assert(rc != 0 && rc != 124, "a second daemon started on %s (status %d): %s", dir, rc,
              log);
    cr_assert(strstr(log, dir) && strstr(log, pid), "the refusal names neither the directory "
              "nor the holder (%s): %s", pid, log);
    free(log);
    /* --check-config takes no lock */
    rc = run(dir, "--check-config", &log);
    cr_assert_eq(rc, 0, "--check-config was refused on a locked state dir: %s", log);
    free(log);
    /* the first daemon is unaffected */
    char *body = NULL;
    cr_assert_eq(h_get(&a, "/healthz", NULL, &body), 200);
    free(body);
    cr_assert_eq(kvpd_stop(&a, 10000), 0);

    /* once it is gone, the stale file (its old pid) does not keep the next one out */
    kvpd_proc b;
    cr_assert_eq(kvpd_start(&b, args), 0, "log %s", b.log);
    cr_assert_eq(kvpd_stop(&b, 10000), 0);
    /* nor after a kill -9 */
    cr_assert_eq(kvpd_start(&b, args), 0, "log %s", b.log);
    kvpd_kill(&b);
    cr_assert_eq(kvpd_start(&b, args), 0, "after a kill -9 the lock stayed: log %s", b.log);
    cr_assert_eq(kvpd_stop(&b, 10000), 0);
    h_rmdir(dir);
}

Test(security_statelock, without_a_state_dir_nothing_is_locked)
{
    kvpd_proc a, b;
    cr_assert_eq(kvpd_start(&a, ""), 0, "log %s", a.log);
    cr_assert_eq(kvpd_start(&b, ""), 0, "a second daemon without a state dir: log %s", b.log);
    cr_assert_eq(kvpd_stop(&a, 10000), 0);
    cr_assert_eq(kvpd_stop(&b, 10000), 0);
}

Test(security_statelock, a_link_directory_or_fifo_as_the_lock_is_refused)
{
    for (int k = 0; k < 3; k++) {
        char dir[64], path[128], *log;
        cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
        snprintf(path, sizeof path, "%s/kvpd.lock", dir);
        if (k == 0)
            cr_assert_eq(symlink("/tmp/kvpd-lock-elsewhere", path), 0);
        else if (k == 1)
            cr_assert_eq(mkdir(path, 0700), 0);
        else
            cr_assert_eq(mkfifo(path, 0600), 0);
        int rc = run(dir, "", &log);
        cr_assert(rc != 0 && rc != 124, "kind %d: started (status %d): %s", k, rc, log);
        cr_assert(strstr(log, "kvpd.lock"), "kind %d: the refusal does not name the lock: %s",
                  k, log);
        free(log);
        struct stat sb;
        cr_assert_neq(lstat("/tmp/kvpd-lock-elsewhere", &sb), 0, "the link was followed");
        if (k == 1)
            rmdir(path);
        else
            unlink(path);
        h_rmdir(dir);
    }
}
