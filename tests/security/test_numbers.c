/* Numbers are parsed strictly everywhere (config file, kvpd flags, kvp
 * flags): no leading space or '+', no hex or octal, no "inf"/"nan". `--max-cache-bytes
 * " -1"` must not become 2^64-1 by a space getting past the sign check. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "base/parse.h"

static const struct { const char *key, *value; } refused[] = {
    {"max_cache_bytes", " -1"}, {"max_cache_bytes", "-1"}, {"max_cache_bytes", "+5"},
    {"max_cache_bytes", " 5"}, {"max_cache_bytes", "\t7M"}, {"max_cache_bytes", "0x10"},
    {"seed", " -1"}, {"seed", "+1"}, {"seed", "0x10"}, {"seed", " 3"},
    {"budget", " 5"}, {"budget", "+5"}, {"budget", "5 "}, {"budget", "0x40"},
    {"max_tokens", "\n8"}, {"idle_timeout", " -1"},
    {"temperature", " 0.5"}, {"temperature", "+0.5"}, {"temperature", "inf"},
    {"temperature", "0x1p-2"}, {"temperature", "nan"}, {"top_p", " 1"},
    {"listen", "127.0.0.1: 80"}, {"listen", "127.0.0.1:+80"}, {"listen", "127.0.0.1:0x50"},
};

Test(security_numbers, config_values_are_strict)
{
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        kvpd_config c;
        char err[256] = "";
        kvpd_config_defaults(&c);
        uint64_t bytes = c.max_cache_bytes, seed = c.seed;
        cr_expect_lt(kvpd_config_set(&c, refused[i].key, refused[i].value, err, sizeof err), 0,
                     "%s = '%s' was accepted", refused[i].key, refused[i].value);
        cr_expect(strstr(err, refused[i].key), "no key in '%s'", err);
        cr_expect_eq(c.max_cache_bytes, bytes);
        cr_expect_eq(c.seed, seed);
    }
}

Test(security_numbers, good_values_still_parse)
{
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    cr_assert_eq(kvpd_config_set(&c, "max_cache_bytes", "64M", err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.max_cache_bytes, 64ull << 20);
    cr_assert_eq(kvpd_config_set(&c, "seed", "010", err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.seed, 10);   /* decimal, not octal */
    cr_assert_eq(kvpd_config_set(&c, "temperature", "1e-2", err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvpd_config_set(&c, "temperature", ".5", err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvpd_config_set(&c, "listen", "127.0.0.1:8081", err, sizeof err), 0, "%s", err);
    cr_expect_eq(c.listen_port, 8081);
}

Test(security_numbers, flags_are_strict)
{
    char *argv[] = {"kvpd", "--max-cache-bytes", " -1", NULL};
    kvpd_config c;
    enum kvpd_action a;
    char err[256] = "";
    cr_expect_lt(kvpd_config_from_args(&c, 3, argv, &a, err, sizeof err), 0);
    cr_expect(strstr(err, "max_cache_bytes"), "%s", err);
}

Test(security_numbers, config_file_quotes_do_not_smuggle_a_sign)
{
    char path[] = "/tmp/kvp-numbers-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "max_cache_bytes = \" -1\"\n");
    fclose(f);
    kvpd_config c;
    char err[256] = "";
    kvpd_config_defaults(&c);
    cr_expect_lt(kvpd_config_load_file(&c, path, err, sizeof err), 0);
    cr_expect(strstr(err, ":1:"), "%s", err);
    cr_expect_eq(c.max_cache_bytes, 0);
    unlink(path);
}

Test(security_numbers, cli_numbers_are_strict)
{
    long l;
    double d;
    const char *bad_long[] = {" 5", "+5", "0x10", "5 ", "", "-", " -1"};
    for (size_t i = 0; i < sizeof bad_long / sizeof *bad_long; i++)
        cr_expect_eq(kvp_parse_long(bad_long[i], -100, 100, &l), 0, "'%s'", bad_long[i]);
    const char *bad_double[] = {" 0.5", "+0.5", "0x1p-1", "inf", "nan", "-nan", ""};
    for (size_t i = 0; i < sizeof bad_double / sizeof *bad_double; i++)
        cr_expect_eq(kvp_parse_double(bad_double[i], -100, 100, &d), 0, "'%s'", bad_double[i]);
    cr_expect_eq(kvp_parse_long("-7", -100, 100, &l), 1);
    cr_expect_eq(l, -7);
    cr_expect_eq(kvp_parse_double("-.25", -1, 1, &d), 1);
    cr_expect_eq(d, -0.25);
}
