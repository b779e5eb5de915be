/* base/parse: comma-separated lists split in place, empty fields and overflow refused. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/parse.h"

Test(parse, split_list_takes_fields_in_order)
{
    char s[] = "32,64,128";
    char *f[4];
    int n = -1;
    cr_assert_eq(kvp_split_list(s, f, 4, &n), 1);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(f[0], "32");
    cr_assert_str_eq(f[1], "64");
    cr_assert_str_eq(f[2], "128");
    char one[] = "kvp";
    cr_assert_eq(kvp_split_list(one, f, 1, &n), 1);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(f[0], "kvp");
}

Test(parse, split_list_refuses_empty_fields_and_too_many)
{
    static const char *bad[] = {"", ",", ",32", "32,", "32,,64"};
    char *f[4];
    int n;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char s[16];
        strcpy(s, bad[i]);
        cr_assert_eq(kvp_split_list(s, f, 4, &n), 0, "'%s' accepted", bad[i]);
    }
    char s[] = "1,2,3,4,5";
    cr_assert_eq(kvp_split_list(s, f, 4, &n), 0, "five fields into four");
}

Test(parse, u64_takes_digits_only_and_reports_where_they_end)
{
    unsigned long long v;
    cr_assert_eq(kvp_parse_u64("18446744073709551615", &v, NULL), 1);
    cr_assert_eq(v, 18446744073709551615ull);
    static const char *bad[] = {"", " 1", "-1", "+1", "0x10", "1 ", "18446744073709551616", "1k"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(kvp_parse_u64(bad[i], &v, NULL), 0, "'%s' accepted", bad[i]);
    const char *end;
    cr_assert_eq(kvp_parse_u64("64M", &v, &end), 1);
    cr_assert_eq(v, 64);
    cr_assert_str_eq(end, "M");
    cr_assert_eq(kvp_parse_u64("M", &v, &end), 0);
}
