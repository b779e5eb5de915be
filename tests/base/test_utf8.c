/* sessions/utf8.c: pieces split mid-character, invalid bytes. */
#include <criterion/criterion.h>
#include <string.h>

#include "base/utf8.h"

static size_t feed(kvp_utf8 *u, const char *s, size_t n, char *out)
{
    return kvp_utf8_feed(u, s, n, out);
}

Test(utf8, ascii_passes_through)
{
    kvp_utf8 u = {0};
    char out[64];
    size_t n = feed(&u, "hello", 5, out);
    cr_assert_eq(n, 5);
    cr_assert_eq(memcmp(out, "hello", 5), 0);
}

Test(utf8, split_character_waits_for_its_bytes)
{
    const char *euro = "\xe2\x82\xac";   /* U+20AC in three byte tokens */
    kvp_utf8 u = {0};
    char out[64];
    cr_assert_eq(feed(&u, euro, 1, out), 0);
    cr_assert_eq(feed(&u, euro + 1, 1, out), 0);
    cr_assert_eq(feed(&u, euro + 2, 1, out), 3);
    cr_assert_eq(memcmp(out, euro, 3), 0);
    /* A 4-byte emoji split 2+2 with text around it. */
    size_t n = feed(&u, "a\xf0\x9f", 3, out);
    cr_assert_eq(n, 1);
    n = feed(&u, "\x98\x80z", 3, out);
    cr_assert_eq(n, 5);
    cr_assert_eq(memcmp(out, "\xf0\x9f\x98\x80z", 5), 0);
}

Test(utf8, invalid_bytes_become_replacement_characters)
{
    kvp_utf8 u = {0};
    char out[64];
    /* stray continuation, overlong lead, surrogate, a lead cut by ASCII */
    size_t n = feed(&u, "\x80", 1, out);
    cr_assert_eq(n, 3);
    cr_assert_eq(memcmp(out, "\xef\xbf\xbd", 3), 0);
    cr_assert_eq(feed(&u, "\xc0", 1, out), 3);
    cr_assert_eq(feed(&u, "\xed\xa0\x80", 3, out), 9);   /* lead breaks; 2 strays */
    n = feed(&u, "\xe2\x82x", 3, out);
    cr_assert_eq(n, 4);
    cr_assert_eq(memcmp(out, "\xef\xbf\xbdx", 4), 0);
}

Test(utf8, flush_replaces_an_unfinished_character)
{
    kvp_utf8 u = {0};
    char out[8];
    cr_assert_eq(feed(&u, "\xe2\x82", 2, out), 0);
    cr_assert_eq(kvp_utf8_flush(&u, out), 3);
    cr_assert_eq(kvp_utf8_flush(&u, out), 0);
}
