/* daemon/config.c: defaults, file parsing, flags over file over defaults. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"

static const char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvpd-conf-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

Test(config, defaults)
{
    kvpd_config c;
    kvpd_config_defaults(&c);
    cr_assert_str_eq(c.listen_host, "127.0.0.1");
    cr_assert_eq(c.listen_port, 8080);
    cr_assert(strstr(c.model, "models/stories260K.bin"));
    cr_assert_eq(c.reuse_cache, 1);
    cr_assert_eq(c.admin_token[0], '\0');
}

Test(config, flags_override_file_override_defaults)
{
    const char *path = write_tmp("# comment\n\nbudget = 100  # trailing\nworkers=3\n"
                                 "admin_token = \"tok en\"\nlisten = 0.0.0.0:9000\n");
    char *argv[] = {"kvpd", "--budget", "7", "--config", (char *)path, "--max-tokens=12",
                    "--no-reuse-cache", NULL};
    kvpd_config c;
    enum kvpd_action a;
    char err[256];
    cr_assert_eq(kvpd_config_from_args(&c, 7, argv, &a, err, sizeof err), 0, "%s", err);
    unlink(path);
    cr_assert_eq(a, KVPD_RUN);
    cr_assert_eq(c.budget, 7);            /* flag beats file */
    cr_assert_eq(c.workers, 3);           /* file beats default */
    cr_assert_eq(c.max_tokens, 12);
    cr_assert_eq(c.reuse_cache, 0);
    cr_assert_str_eq(c.admin_token, "tok en");
    cr_assert_str_eq(c.listen_host, "0.0.0.0");
    cr_assert_eq(c.listen_port, 9000);
    cr_assert_eq(c.chunk, 32);            /* default */
}

Test(config, actions)
{
    kvpd_config c;
    enum kvpd_action a;
    char err[256];
    char *v[] = {"kvpd", "--version", NULL}, *h[] = {"kvpd", "--budget", "1", "--help", NULL},
         *k[] = {"kvpd", "--check-config", NULL};
    cr_assert_eq(kvpd_config_from_args(&c, 2, v, &a, err, sizeof err), 0);
    cr_assert_eq(a, KVPD_VERSION);
    cr_assert_eq(kvpd_config_from_args(&c, 4, h, &a, err, sizeof err), 0);
    cr_assert_eq(a, KVPD_HELP);
    cr_assert_eq(kvpd_config_from_args(&c, 2, k, &a, err, sizeof err), 0);
    cr_assert_eq(a, KVPD_CHECK);
}

Test(config, rejects_bad_values_with_a_reason)
{
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    cr_assert_lt(kvpd_config_set(&c, "budget", "-1", err, sizeof err), 0);
    cr_assert(strstr(err, "budget"));
    cr_assert_lt(kvpd_config_set(&c, "budget", "12x", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "chunk", "0", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "top_p", "1.5", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "temperature", "nan", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "reuse_cache", "maybe", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "listen", "8080", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "listen", "127.0.0.1:70000", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "seed", "-3", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "nope", "1", err, sizeof err), 0);
    cr_assert(strstr(err, "unknown key"));
    cr_assert_eq(kvpd_config_set(&c, "listen", "[::1]:81", err, sizeof err), 0);
    cr_assert_str_eq(c.listen_host, "::1");
    cr_assert_eq(c.listen_port, 81);
    char longv[1000];
    memset(longv, 'x', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    cr_assert_lt(kvpd_config_set(&c, "model", longv, err, sizeof err), 0);
}

Test(config, file_errors_name_the_line)
{
    const char *path = write_tmp("budget = 10\nthis line has no equals\n");
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    cr_assert_lt(kvpd_config_load_file(&c, path, err, sizeof err), 0);
    cr_assert(strstr(err, ":2:"), "%s", err);
    unlink(path);
    cr_assert_lt(kvpd_config_load_file(&c, "/nonexistent/kvpd.conf", err, sizeof err), 0);
    char *argv[] = {"kvpd", "--budget", NULL};
    enum kvpd_action a;
    cr_assert_lt(kvpd_config_from_args(&c, 2, argv, &a, err, sizeof err), 0);
    char *argv2[] = {"kvpd", "--what", "1", NULL};
    cr_assert_lt(kvpd_config_from_args(&c, 3, argv2, &a, err, sizeof err), 0);
}

Test(config, validate)
{
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    snprintf(c.static_dir, sizeof c.static_dir, "/tmp");
    cr_assert_eq(kvpd_config_validate(&c, err, sizeof err), 0, "%s", err);
    snprintf(c.policy, sizeof c.policy, "kvp");
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
    snprintf(c.policy, sizeof c.policy, "h2o");
    snprintf(c.state_dir, sizeof c.state_dir, "/nonexistent-dir");
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
}
