#include "model/unicode.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/unicode_table.h"

/* The value of the range holding cp in a sorted table, 0 if none does. */
static unsigned range_value(const struct unicode_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp > r[mid].hi)
            lo = mid + 1;
        else if (cp < r[mid].lo)
            hi = mid;
        else
            return r[mid].v;
    }
    return 0;
}

size_t kvp_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    *cp = 0xFFFD;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        lo = c == 0xE0 ? 0xA0 : lo; /* overlong */
        hi = c == 0xED ? 0x9F : hi; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        lo = c == 0xF0 ? 0x90 : lo; /* overlong */
        hi = c == 0xF4 ? 0x8F : hi; /* above U+10FFFF */
    } else {
        return 1;
    }
    if (n < need || s[1] < lo || s[1] > hi)
        return 1;
    for (size_t i = 2; i < need; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 1;
    uint32_t v = c & (0xFF >> (need + 1));
    for (size_t i = 1; i < need; i++)
        v = v << 6 | (s[i] & 0x3F);
    *cp = v;
    return need;
}

enum kvp_ucls kvp_unicode_class(uint32_t cp)
{
    /* ASCII is most text: answer it without the search. */
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
            return KVP_UCLS_LETTER;
        if (cp >= '0' && cp <= '9')
            return KVP_UCLS_NUMBER;
        if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D))
            return KVP_UCLS_SPACE;
        return KVP_UCLS_OTHER;
    }
    return (enum kvp_ucls)range_value(unicode_ranges,
                                      sizeof unicode_ranges / sizeof unicode_ranges[0], cp);
}

enum kvp_ugc kvp_unicode_gc(uint32_t cp)
{
    if (cp < 0x80) {
        if (cp >= 'a' && cp <= 'z')
            return KVP_UGC_LL;
        if (cp >= 'A' && cp <= 'Z')
            return KVP_UGC_LU;
        if (cp >= '0' && cp <= '9')
            return KVP_UGC_NUMBER;
        if (cp <= ' ' || cp == 0x7F)
            return KVP_UGC_OTHER;
        /* ASCII symbols: $ + < = > ^ ` | ~; the rest of the printable ones are P. */
        return strchr("$+<=>^`|~", (int)cp) ? KVP_UGC_SYMBOL : KVP_UGC_PUNCT;
    }
    return (enum kvp_ugc)range_value(unicode_gc, sizeof unicode_gc / sizeof unicode_gc[0], cp);
}

size_t kvp_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- NFC ----
 * Code points in a uint32 array; an invalid byte b is kept as INVALID | b (a starter
 * that neither decomposes nor composes). */
#define INVALID 0x80000000u

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7,
       LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT,
       SCOUNT = LCOUNT * NCOUNT };

static unsigned ccc_of(uint32_t cp)
{
    if (cp < 0x300 || cp & INVALID)
        return 0;
    return range_value(unicode_ccc, sizeof unicode_ccc / sizeof unicode_ccc[0], cp);
}

/* Index of cp's one-level canonical decomposition, or -1. */
static long decomp_of(uint32_t cp)
{
    if (cp < 0xC0 || cp & INVALID)
        return -1;
    size_t lo = 0, hi = sizeof unicode_decomp / sizeof unicode_decomp[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (unicode_decomp[mid].cp < cp)
            lo = mid + 1;
        else if (unicode_decomp[mid].cp > cp)
            hi = mid;
        else
            return (long)mid;
    }
    return -1;
}

/* Appends the full canonical decomposition of cp (at most 4 code points); returns the
 * new count. */
static size_t decompose(uint32_t cp, uint32_t *out, size_t n)
{
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        out[n++] = LBASE + s / NCOUNT;
        out[n++] = VBASE + (s % NCOUNT) / TCOUNT;
        if (s % TCOUNT)
            out[n++] = TBASE + s % TCOUNT;
        return n;
    }
    long d = decomp_of(cp);
    if (d < 0) {
        out[n++] = cp;
        return n;
    }
    n = decompose(unicode_decomp[d].a, out, n);
    if (unicode_decomp[d].b)
        n = decompose(unicode_decomp[d].b, out, n);
    return n;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = sizeof unicode_compose / sizeof unicode_compose[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (unicode_compose[mid].a < a || (unicode_compose[mid].a == a && unicode_compose[mid].b < b))
            lo = mid + 1;
        else if (unicode_compose[mid].a == a && unicode_compose[mid].b == b)
            return unicode_compose[mid].cp;
        else
            hi = mid;
    }
    return 0;
}

int kvp_nfc(const char *in, size_t len, char **out, size_t *out_len)
{
    /* A full canonical decomposition is at most 4 code points, and every code point
     * takes at least one byte. */
    if (len > ((size_t)1 << 40))
        return -E2BIG;
    uint32_t *cp = malloc((len * 4 + 1) * sizeof *cp);
    char *o = malloc(len * 4 + 1);
    if (!cp || !o) {
        free(cp);
        free(o);
        return -ENOMEM;
    }
    const unsigned char *s = (const unsigned char *)in;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        size_t u = kvp_utf8_decode(s + i, len - i, &c);
        if (c == 0xFFFD && !(u == 3 && s[i] == 0xEF && s[i + 1] == 0xBF && s[i + 2] == 0xBD))
            c = INVALID | s[i];
        n = decompose(c, cp, n);
        i += u;
    }
    /* Canonical order: each run of non-starters sorted by class (stable insertion). */
    for (size_t i = 1; i < n; i++) {
        unsigned c = ccc_of(cp[i]);
        if (!c)
            continue;
        uint32_t x = cp[i];
        size_t j = i;
        while (j > 0 && ccc_of(cp[j - 1]) > c) {
            cp[j] = cp[j - 1];
            j--;
        }
        cp[j] = x;
    }
    /* Composition: a character joins the last starter when nothing stands between
     * them or what does has a lower, non-zero class (else it is blocked). */
    size_t w = 0;
    long starter = -1;
    int last = -1;   /* class of the last character kept since the starter; -1: none */
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cp[i];
        int k = (int)ccc_of(c);
        if (starter >= 0 && (last < 0 || last < k) && !((cp[starter] | c) & INVALID)) {
            uint32_t comp = compose(cp[starter], c);
            if (comp) {
                cp[starter] = comp;
                continue;
            }
        }
        if (k == 0) {
            starter = (long)w;
            last = -1;
        } else {
            last = k;
        }
        cp[w++] = c;
    }
    size_t ol = 0;
    for (size_t i = 0; i < w; i++)
        if (cp[i] & INVALID)
            o[ol++] = (char)(cp[i] & 0xFF);
        else
            ol += kvp_utf8_encode(cp[i], o + ol);
    free(cp);
    *out = o;
    *out_len = ol;
    return 0;
}

int kvp_unicode_case(uint32_t cp, enum kvp_ucase which, uint32_t out[3])
{
    size_t lo = 0, hi = sizeof unicode_case / sizeof unicode_case[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp > unicode_case[mid].cp) {
            lo = mid + 1;
        } else if (cp < unicode_case[mid].cp) {
            hi = mid;
        } else {
            const unsigned *m = unicode_case[mid].m[which];
            int n = 0;
            while (n < 3 && m[n])
                out[n] = m[n], n++;
            return n;
        }
    }
    out[0] = cp;
    return 1;
}

int kvp_unicode_is_cased(uint32_t cp)
{
    return (int)(range_value(unicode_caseprop, sizeof unicode_caseprop / sizeof unicode_caseprop[0],
                             cp) & 1);
}

int kvp_unicode_is_case_ignorable(uint32_t cp)
{
    return (int)(range_value(unicode_caseprop, sizeof unicode_caseprop / sizeof unicode_caseprop[0],
                             cp) >> 1 & 1);
}
