/* Hostile local files: a FIFO where kvpd expects its model or policy file (at start and
 * in a SIGHUP reload) must not hang it, and an admin_token_file that belongs to another
 * user must be left as it was. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(security_local_files, .timeout = 90);

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

Test(security_local_files, a_fifo_as_the_model_fails_the_start_instead_of_hanging)
{
    char dir[64];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    char fifo[128], args[256];
    snprintf(fifo, sizeof fifo, "%s/model.bin", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    snprintf(args, sizeof args, "--model %s", fifo);
    kvpd_proc p;
    /* The port is bound before the model is read: kvpd must then stop by itself. */
    if (kvpd_spawn(&p, args) == 0) {
        int rc = kvpd_wait(&p, 5000);
        cr_assert_eq(rc, 1, "kvpd did not fail its start (rc %d), log %s", rc, p.log);
    }
    cr_assert(kvpd_log_has(&p, "not a regular file"), "log %s", p.log);
    unlink(p.log);
    h_rmdir(dir);
}

static json_int_t reload_count(const kvpd_proc *d, const char *key)
{
    json_t *st = h_stats(d);
    if (!st)
        return -1;
    json_int_t n = json_integer_value(json_object_get(json_object_get(st, "persistence"), key));
    json_decref(st);
    return n;
}

Test(security_local_files, a_fifo_as_the_policy_file_is_refused_by_a_reload_and_sigterm_works)
{
    char dir[64];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    char fifo[128], conf[128], text[512], args[256];
    snprintf(fifo, sizeof fifo, "%s/policy.kvp", dir);
    snprintf(conf, sizeof conf, "%s/kvpd.conf", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    write_text(conf, "policy = streaming\n");
    snprintf(args, sizeof args, "--config %s", conf);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, args), 0, "log %s", p.log);
    snprintf(text, sizeof text, "policy = kvp\npolicy_file = %s\n", fifo);
    write_text(conf, text);
    kill(p.pid, SIGHUP);
    int i;
    for (i = 0; i < 250 && reload_count(&p, "reloads_refused") < 1; i++)
        sleep_ms(20);
    cr_assert_eq(reload_count(&p, "reloads_refused"), 1, "the reload hung, log %s", p.log);
    cr_assert(kvpd_log_has(&p, "not a regular file"), "log %s", p.log);
    /* A second SIGHUP is not swallowed: the same file is refused again. */
    kill(p.pid, SIGHUP);
    for (i = 0; i < 250 && reload_count(&p, "reloads_refused") < 2; i++)
        sleep_ms(20);
    cr_assert_eq(reload_count(&p, "reloads_refused"), 2, "log %s", p.log);
    char *body = NULL;
    cr_assert_eq(h_get(&p, "/healthz", NULL, &body), 200);
    free(body);
    cr_assert_eq(kvpd_stop(&p, 5000), 0, "SIGTERM did not stop kvpd");
    h_rmdir(dir);
}

Test(security_local_files, an_admin_token_file_of_another_user_is_left_untouched)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to make a file of another user");
    char dir[64];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    cr_assert_eq(chmod(dir, 0777), 0);
    char file[128], args[256];
    snprintf(file, sizeof file, "%s/their.token", dir);
    write_text(file, "someone else's data\n");
    cr_assert_eq(chown(file, 65534, 65534), 0);
    cr_assert_eq(chmod(file, 0666), 0);
    snprintf(args, sizeof args, "--admin-token-file %s", file);
    kvpd_proc p;
    cr_assert_neq(kvpd_start(&p, args), 0, "kvpd started with another user's token file");
    if (p.pid > 0)
        kvpd_stop(&p, 5000);
    cr_assert(kvpd_log_has(&p, "not a regular file of this user"), "log %s", p.log);
    char buf[64] = {0};
    FILE *f = fopen(file, "r");
    cr_assert(f);
    cr_assert_gt(fread(buf, 1, sizeof buf - 1, f), 0);
    fclose(f);
    cr_assert_str_eq(buf, "someone else's data\n", "the file was changed before the check");
    struct stat st;
    cr_assert_eq(stat(file, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0666, "its mode was changed");
    unlink(p.log);
    h_rmdir(dir);
}
