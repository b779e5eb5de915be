/* model/unicode.c: UTF-8 decoding (invalid, overlong, surrogate and truncated sequences
 * as one byte of U+FFFD) and encoding, the classes and general categories the
 * pre-tokenizers split on, full case mappings, and NFC. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "model/unicode.h"

static size_t dec(const char *s, size_t n, uint32_t *cp)
{
    return kvp_utf8_decode((const unsigned char *)s, n, cp);
}

Test(unicode, decoding_valid_and_invalid_sequences)
{
    uint32_t cp;
    cr_assert_eq(dec("A", 1, &cp), 1);
    cr_assert_eq(cp, 'A');
    cr_assert_eq(dec("\xc3\xa9", 2, &cp), 2);
    cr_assert_eq(cp, 0xE9);
    cr_assert_eq(dec("\xe4\xb8\xad", 3, &cp), 3);
    cr_assert_eq(cp, 0x4E2D);
    cr_assert_eq(dec("\xf0\x9f\x98\x80", 4, &cp), 4);
    cr_assert_eq(cp, 0x1F600);
    cr_assert_eq(dec("\xf4\x8f\xbf\xbf", 4, &cp), 4);
    cr_assert_eq(cp, 0x10FFFF);
    static const char *const bad[] = {
        "\x80",             /* a continuation byte alone */
        "\xc0\x80",         /* overlong NUL */
        "\xc1\xbf",         /* overlong */
        "\xe0\x80\x80",     /* overlong */
        "\xed\xa0\x80",     /* a surrogate */
        "\xf0\x80\x80\x80", /* overlong */
        "\xf4\x90\x80\x80", /* above U+10FFFF */
        "\xf5\x80\x80\x80", /* no such lead byte */
        "\xff",
        "\xe4\xb8",         /* truncated */
        "\xe4\x41\x41",     /* not a continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cp = 0;
        cr_assert_eq(dec(bad[i], strlen(bad[i]), &cp), 1, "sequence %zu", i);
        cr_assert_eq(cp, 0xFFFD, "sequence %zu", i);
    }
    cr_assert_eq(dec("\xe4\xb8\xad", 2, &cp), 1, "fewer bytes left than the sequence needs");
}

/* Every scalar value encodes to the sequence that decodes to it, of the right length. */
Test(unicode, every_code_point_round_trips)
{
    char buf[4];
    for (uint32_t c = 0; c <= 0x10FFFF; c++) {
        if (c >= 0xD800 && c <= 0xDFFF)
            continue;
        size_t n = kvp_utf8_encode(c, buf);
        size_t want = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        cr_assert_eq(n, want, "U+%04X", c);
        uint32_t back;
        cr_assert_eq(kvp_utf8_decode((unsigned char *)buf, n, &back), n, "U+%04X", c);
        cr_assert_eq(back, c, "U+%04X", c);
    }
}

Test(unicode, classes)
{
    static const struct {
        uint32_t cp;
        enum kvp_ucls cls;
    } c[] = {
        {'a', KVP_UCLS_LETTER},   {'Z', KVP_UCLS_LETTER},   {0xE9, KVP_UCLS_LETTER},
        {0x4E2D, KVP_UCLS_LETTER}, {0x05D0, KVP_UCLS_LETTER}, {'7', KVP_UCLS_NUMBER},
        {0x0663, KVP_UCLS_NUMBER}, /* Arabic-Indic three */
        {0x216B, KVP_UCLS_NUMBER}, /* Roman numeral twelve: Nl */
        {0x00BD, KVP_UCLS_NUMBER}, /* one half: No */
        {' ', KVP_UCLS_SPACE},    {'\t', KVP_UCLS_SPACE},   {'\n', KVP_UCLS_SPACE},
        {0x00A0, KVP_UCLS_SPACE}, {0x3000, KVP_UCLS_SPACE}, {0x2029, KVP_UCLS_SPACE},
        {'!', KVP_UCLS_OTHER},    {'_', KVP_UCLS_OTHER},    {0x200B, KVP_UCLS_OTHER},
        {0x0301, KVP_UCLS_OTHER}, {0x1F600, KVP_UCLS_OTHER}, {0x10FFFF, KVP_UCLS_OTHER},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        cr_assert_eq(kvp_unicode_class(c[i].cp), c[i].cls, "U+%04X", c[i].cp);
}

Test(unicode, general_categories)
{
    static const struct {
        uint32_t cp;
        enum kvp_ugc gc;
    } c[] = {
        {'A', KVP_UGC_LU},      {0xC9, KVP_UGC_LU},     {'a', KVP_UGC_LL},
        {0x3B1, KVP_UGC_LL},    {0x01C5, KVP_UGC_LT},   {0x02B0, KVP_UGC_LM},
        {0x4E2D, KVP_UGC_LO},   {0x0301, KVP_UGC_MARK}, {'3', KVP_UGC_NUMBER},
        {0x216B, KVP_UGC_NUMBER}, {'-', KVP_UGC_PUNCT}, {'"', KVP_UGC_PUNCT},
        {0x300C, KVP_UGC_PUNCT}, {'$', KVP_UGC_SYMBOL}, {'+', KVP_UGC_SYMBOL},
        {0x1F600, KVP_UGC_SYMBOL}, {' ', KVP_UGC_OTHER}, {0x0007, KVP_UGC_OTHER},
        {0xE000, KVP_UGC_OTHER}, /* private use */
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        cr_assert_eq(kvp_unicode_gc(c[i].cp), c[i].gc, "U+%04X", c[i].cp);
}

static void cased(uint32_t cp, enum kvp_ucase which, int n, uint32_t a, uint32_t b)
{
    uint32_t out[3] = {0};
    cr_assert_eq(kvp_unicode_case(cp, which, out), n, "U+%04X to case %d", cp, which);
    cr_assert_eq(out[0], a, "U+%04X to case %d", cp, which);
    if (n > 1)
        cr_assert_eq(out[1], b, "U+%04X to case %d", cp, which);
}

Test(unicode, case_mappings)
{
    cased('a', KVP_UCASE_UPPER, 1, 'A', 0);
    cased('A', KVP_UCASE_LOWER, 1, 'a', 0);
    cased('1', KVP_UCASE_UPPER, 1, '1', 0);
    cased(0x3A3, KVP_UCASE_LOWER, 1, 0x3C3, 0);              /* Sigma, no conditions */
    cased(0xDF, KVP_UCASE_UPPER, 2, 'S', 'S');                /* sharp s: SS */
    cased(0xDF, KVP_UCASE_TITLE, 2, 'S', 's');                /* Ss */
    cased(0x130, KVP_UCASE_LOWER, 2, 'i', 0x307);             /* dotted I */
    cased(0x1C6, KVP_UCASE_TITLE, 1, 0x1C5, 0);               /* dz with caron: Dz */
    cased(0x1C6, KVP_UCASE_UPPER, 1, 0x1C4, 0);
    cased(0xFB01, KVP_UCASE_UPPER, 2, 'F', 'I');              /* the fi ligature */
    cr_assert(kvp_unicode_is_cased('a'));
    cr_assert(kvp_unicode_is_cased(0x3A3));
    cr_assert_not(kvp_unicode_is_cased('1'));
    cr_assert_not(kvp_unicode_is_cased(0x4E2D));
    cr_assert(kvp_unicode_is_case_ignorable('\''));
    cr_assert(kvp_unicode_is_case_ignorable('.'));
    cr_assert(kvp_unicode_is_case_ignorable(0x0301));
    cr_assert_not(kvp_unicode_is_case_ignorable('a'));
    cr_assert_not(kvp_unicode_is_case_ignorable(' '));
}

static void nfc(const char *in, size_t in_len, const char *want, size_t want_len)
{
    char *out = NULL;
    size_t n = 0;
    cr_assert_eq(kvp_nfc(in, in_len, &out, &n), 0);
    cr_assert_eq(n, want_len, "length %zu, not %zu", n, want_len);
    cr_assert_eq(memcmp(out, want, n), 0);
    free(out);
}

#define NFC(in, want) nfc(in, sizeof in - 1, want, sizeof want - 1)

Test(unicode, normalization_form_c)
{
    NFC("plain text", "plain text");
    NFC("", "");
    NFC("e\xcc\x81", "\xc3\xa9");                       /* e + acute: e-acute */
    NFC("A\xcc\x8a", "\xc3\x85");                       /* A + ring: A-ring */
    NFC("\xe1\x84\x80\xe1\x85\xa1", "\xea\xb0\x80");    /* Hangul L + V: GA */
    NFC("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81");   /* + T: GAG */
    /* marks in canonical order: dot below (220) before dot above (230) */
    NFC("q\xcc\x87\xcc\xa3", "q\xcc\xa3\xcc\x87");
    /* a composed character whose mark is already in: d + dot below + dot above */
    NFC("d\xcc\x87\xcc\xa3", "\xe1\xb8\x8d\xcc\x87");
    /* singletons are replaced: the Angstrom sign becomes A-ring */
    NFC("\xe2\x84\xab", "\xc3\x85");
    /* an invalid byte passes through and blocks the composition across it */
    NFC("e\xff\xcc\x81", "e\xff\xcc\x81");
}
