/* Strings, integers and numbers of the schema compiler (model/schema_impl.h). Lengths
 * count characters as JSON Schema does (code points: an escape or a UTF-8 sequence is
 * one); an integer range is the exact set of decimal spellings without leading zeros; a
 * number's bounds must be integers, its fraction and exponent are bounded in digits. */
#include "model/schema_impl.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define DIGITS_MAX 16              /* digits of an unbounded integer or fraction */
#define UNBOUNDED 9999999999999999LL   /* DIGITS_MAX nines */
#define BOUND_MAX 9000000000000000000LL   /* the largest |bound|: 19 digits, with room */

/* Bytes 0x80-0xBF after a lead byte, `left` of them still to come, then `to`. */
static int cont(sc *c, int left, int to)
{
    int at = to;
    for (int i = 0; i < left; i++) {
        int s = sc_state(c);
        if (s < 0)
            return -1;
        kvp_gbuild_range(c->b, s, 0x80, 0xBF, at);
        at = s;
    }
    return at;
}

/* A valid UTF-8 sequence of two to four bytes (no surrogates, no overlongs). */
int sc_utf8(sc *c, int from, int to)
{
    int c1 = cont(c, 1, to), c2 = cont(c, 1, c1), c3 = cont(c, 1, c2);
    int e0 = sc_state(c), ed = sc_state(c), f0 = sc_state(c), f4 = sc_state(c);
    if (c3 < 0 || f4 < 0)
        return -1;
    kvp_gbuild_range(c->b, from, 0xC2, 0xDF, c1);
    kvp_gbuild_range(c->b, from, 0xE0, 0xE0, e0);
    kvp_gbuild_range(c->b, e0, 0xA0, 0xBF, c1);
    kvp_gbuild_range(c->b, from, 0xE1, 0xEC, c2);
    kvp_gbuild_range(c->b, from, 0xED, 0xED, ed);
    kvp_gbuild_range(c->b, ed, 0x80, 0x9F, c1);
    kvp_gbuild_range(c->b, from, 0xEE, 0xEF, c2);
    kvp_gbuild_range(c->b, from, 0xF0, 0xF0, f0);
    kvp_gbuild_range(c->b, f0, 0x90, 0xBF, c2);
    kvp_gbuild_range(c->b, from, 0xF1, 0xF3, c3);
    kvp_gbuild_range(c->b, from, 0xF4, 0xF4, f4);
    kvp_gbuild_range(c->b, f4, 0x80, 0x8F, c2);
    return 0;
}

int sc_char(sc *c, int from, int to)
{
    int esc = sc_state(c), u = sc_state(c), ud = sc_state(c), h2 = sc_state(c), h3 = sc_state(c),
        h4 = sc_state(c);
    if (h4 < 0)
        return -1;
    kvp_gbuild_range(c->b, from, 0x20, 0x21, to);
    kvp_gbuild_range(c->b, from, 0x23, 0x5B, to);
    kvp_gbuild_range(c->b, from, 0x5D, 0x7F, to);
    kvp_gbuild_range(c->b, from, '\\', '\\', esc);
    static const char simple[] = "\"\\/bfnrt";
    for (const char *p = simple; *p; p++)
        kvp_gbuild_range(c->b, esc, (uint8_t)*p, (uint8_t)*p, to);
    /* \uXXXX, not a surrogate (D800-DFFF: a lone one is not text) */
    kvp_gbuild_range(c->b, esc, 'u', 'u', u);
    kvp_gbuild_range(c->b, u, '0', '9', h2);
    kvp_gbuild_range(c->b, u, 'a', 'c', h2);
    kvp_gbuild_range(c->b, u, 'A', 'C', h2);
    kvp_gbuild_range(c->b, u, 'e', 'f', h2);
    kvp_gbuild_range(c->b, u, 'E', 'F', h2);
    kvp_gbuild_range(c->b, u, 'd', 'd', ud);
    kvp_gbuild_range(c->b, u, 'D', 'D', ud);
    kvp_gbuild_range(c->b, ud, '0', '7', h3);
    int hex[3] = {h2, h3, h4};
    for (int i = 0; i < 3; i++) {
        int next = i < 2 ? hex[i + 1] : to;
        kvp_gbuild_range(c->b, hex[i], '0', '9', next);
        kvp_gbuild_range(c->b, hex[i], 'a', 'f', next);
        kvp_gbuild_range(c->b, hex[i], 'A', 'F', next);
    }
    return sc_utf8(c, from, to);
}

int sc_string(sc *c, const json_t *s, int from, int to)
{
    long lo, hi;
    if (sc_count(c, s, "minLength", 0, &lo) < 0 || sc_count(c, s, "maxLength", -1, &hi) < 0)
        return -1;
    if (hi >= 0 && lo > hi)
        return sc_fail(c, "minLength is above maxLength: no string fits");
    const json_t *pat = json_object_get(s, "pattern");
    int open = sc_state(c), close = sc_state(c);
    if (close < 0)
        return -1;
    kvp_gbuild_range(c->b, from, '"', '"', open);
    kvp_gbuild_range(c->b, close, '"', '"', to);
    if (pat) {
        if (!json_is_string(pat))
            return sc_fail(c, "pattern must be a string");
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return sc_fail(c, "pattern beside minLength or maxLength is not supported");
        return sc_pattern(c, json_string_value(pat), open, close);
    }
    /* at[k]: k characters written */
    long unroll = hi >= 0 ? hi : lo;
    int at = open;
    for (long k = 0; k <= unroll; k++) {
        if (k >= lo)   /* the closing quote straight from here: one state per position */
            kvp_gbuild_range(c->b, at, '"', '"', to);
        if (k == unroll) {
            if (hi < 0 && sc_char(c, at, at) < 0)   /* unbounded: more of them */
                return -1;
            break;
        }
        int next = sc_state(c);
        if (next < 0 || sc_char(c, at, next) < 0)
            return -1;
        at = next;
    }
    return 0;
}

/* Any n digits. */
static int digits(sc *c, int from, int to, int n)
{
    int at = from;
    for (int i = 0; i < n; i++) {
        int next = i + 1 == n ? to : sc_state(c);
        if (next < 0)
            return -1;
        kvp_gbuild_range(c->b, at, '0', '9', next);
        at = next;
    }
    if (n == 0)
        kvp_gbuild_eps(c->b, from, to);
    return 0;
}

/* Decimal strings of length len from x to y (digit arrays of that length), from digit k. */
static int fixed(sc *c, int from, int to, const char *x, const char *y, int k, int len)
{
    if (k == len) {
        kvp_gbuild_eps(c->b, from, to);
        return 0;
    }
    int rest_low = 1, rest_high = 1;
    for (int i = k + 1; i < len; i++) {
        rest_low &= x[i] == '0';
        rest_high &= y[i] == '9';
    }
    if (rest_low && rest_high) {
        int s = k + 1 == len ? to : sc_state(c);
        if (s < 0)
            return -1;
        kvp_gbuild_range(c->b, from, (uint8_t)x[k], (uint8_t)y[k], s);
        return k + 1 == len ? 0 : digits(c, s, to, len - k - 1);
    }
    if (x[k] == y[k]) {
        int s = sc_state(c);
        if (s < 0)
            return -1;
        kvp_gbuild_range(c->b, from, (uint8_t)x[k], (uint8_t)x[k], s);
        return fixed(c, s, to, x, y, k + 1, len);
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    int lo = sc_state(c), hi = sc_state(c);
    if (hi < 0)
        return -1;
    kvp_gbuild_range(c->b, from, (uint8_t)x[k], (uint8_t)x[k], lo);
    if (fixed(c, lo, to, x, nines, k + 1, len) < 0)
        return -1;
    if (x[k] + 1 <= y[k] - 1) {
        int mid = sc_state(c);
        if (mid < 0)
            return -1;
        kvp_gbuild_range(c->b, from, (uint8_t)(x[k] + 1), (uint8_t)(y[k] - 1), mid);
        if (digits(c, mid, to, len - k - 1) < 0)
            return -1;
    }
    kvp_gbuild_range(c->b, from, (uint8_t)y[k], (uint8_t)y[k], hi);
    return fixed(c, hi, to, zeros, y, k + 1, len);
}

/* The decimal spellings (no leading zero) of the integers in [a, b], 0 <= a <= b. */
static int naturals(sc *c, int from, int to, long long a, long long b)
{
    long long p = 1;
    for (int len = 1; len <= 19 && a <= b; len++) {
        long long top = len == 19 ? LLONG_MAX : p * 10 - 1;   /* largest of len digits */
        long long lo = a, hi = b < top ? b : top;
        if (lo <= hi) {
            char x[24], y[24];
            snprintf(x, sizeof x, "%0*lld", len, lo);
            snprintf(y, sizeof y, "%0*lld", len, hi);
            if (fixed(c, from, to, x, y, 0, len) < 0)
                return -1;
            a = hi + 1;
        }
        if (len < 19)
            p *= 10;
    }
    return 0;
}

/* The integers in [lo, hi]. */
static int int_range(sc *c, int from, int to, long long lo, long long hi)
{
    if (hi >= 0 && naturals(c, from, to, lo > 0 ? lo : 0, hi) < 0)
        return -1;
    if (lo < 0) {
        int neg = sc_state(c);
        if (neg < 0)
            return -1;
        kvp_gbuild_range(c->b, from, '-', '-', neg);
        return naturals(c, neg, to, hi < 0 ? -hi : 1, -lo);
    }
    return 0;
}

/* A bound keyword's value exactly: *fl its floor, *frac 1 when it has a fraction. An
 * integer is jansson's json_int_t as written (exact past 2^53); a real is a double, whole
 * past 2^53, so its floor is exact too. 0 when absent, 1 when read, -1 refused. */
static int bound_value(sc *c, const json_t *s, const char *key, long long *fl, int *frac)
{
    const json_t *j = json_object_get(s, key);
    if (!j)
        return 0;
    if (json_is_integer(j)) {
        json_int_t v = json_integer_value(j);
        if (v > BOUND_MAX || v < -BOUND_MAX)
            return sc_fail(c, "%s beyond 9e18 is not supported", key);
        *fl = (long long)v;
        *frac = 0;
        return 1;
    }
    double v = json_real_value(j);
    if (!(fabs(v) <= (double)BOUND_MAX))
        return sc_fail(c, "%s beyond 9e18 is not supported", key);
    double f = floor(v);
    *fl = (long long)f;
    *frac = v != f;
    return 1;
}

/* The bounds of s, each the tighter of the inclusive and exclusive keyword (draft 4: a
 * boolean exclusiveMinimum/Maximum makes minimum/maximum exclusive). integer: *a and *b
 * are the least and greatest integers allowed; else (number) they are the bounds, *ax
 * and *bx 1 when exclusive, and a bound with a fraction is refused. -1 refused. */
static int bounds(sc *c, const json_t *s, int integer, int *has_a, long long *a, int *ax,
                  int *has_b, long long *b, int *bx)
{
    static const char *const key[4] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        const json_t *j = json_object_get(s, key[k]);
        if (j && !json_is_number(j) && !((k & 1) && json_is_boolean(j)))
            return sc_fail(c, "%s must be a number", key[k]);
    }
    *has_a = *has_b = *ax = *bx = 0;
    for (int k = 0; k < 4; k++) {
        long long fl = 0;
        int frac = 0, upper = k >= 2;
        /* exclusive: the exclusive keyword's number, or a minimum/maximum beside a true */
        int excl = (k & 1) || json_is_true(json_object_get(s, key[k + 1]));
        if ((k & 1) && json_is_boolean(json_object_get(s, key[k])))
            continue;
        int r = bound_value(c, s, key[k], &fl, &frac);
        if (r < 0)
            return -1;
        if (r == 0)
            continue;
        if (!integer && frac)
            return sc_fail(c, "%s: a number's bounds must be integers in kvpd", key[k]);
        long long v;
        if (integer)   /* the integers allowed: v inclusive */
            v = upper ? (excl && !frac ? fl - 1 : fl) : (excl || frac ? fl + 1 : fl);
        else
            v = fl;
        if (!upper && (!*has_a || v > *a || (v == *a && !integer && excl))) {
            *a = v;
            *ax = !integer && excl;
        }
        if (upper && (!*has_b || v < *b || (v == *b && !integer && excl))) {
            *b = v;
            *bx = !integer && excl;
        }
        *(upper ? has_b : has_a) = 1;
    }
    return 0;
}

/* The names of the keywords that set the lower and the upper bound, for a message. */
static void bound_names(const json_t *s, int ax, int bx, const char **lo, const char **hi)
{
    *lo = ax || (json_is_number(json_object_get(s, "exclusiveMinimum")) &&
                 !json_object_get(s, "minimum")) ? "exclusiveMinimum" : "minimum";
    *hi = bx || (json_is_number(json_object_get(s, "exclusiveMaximum")) &&
                 !json_object_get(s, "maximum")) ? "exclusiveMaximum" : "maximum";
}

int sc_integer(sc *c, const json_t *s, int from, int to)
{
    int has_lo, has_hi, ax, bx;
    long long a = -UNBOUNDED, b = UNBOUNDED;
    if (bounds(c, s, 1, &has_lo, &a, &ax, &has_hi, &b, &bx) < 0)
        return -1;
    if (!has_lo)
        a = has_hi && b < -UNBOUNDED ? b - UNBOUNDED : -UNBOUNDED;
    if (!has_hi)
        b = has_lo && a > UNBOUNDED ? a + UNBOUNDED : UNBOUNDED;
    if (a > b) {
        const char *lo, *hi;
        bound_names(s, 0, 0, &lo, &hi);
        return sc_fail(c, "%s is above %s: no integer fits", lo, hi);
    }
    return int_range(c, from, to, a, b);
}

enum { FRAC_ANY, FRAC_NONZERO, FRAC_ZEROS };

/* What may follow an integer part: FRAC_ANY an optional fraction of 1 to ndig digits,
 * FRAC_NONZERO such a fraction that is not all zeros, FRAC_ZEROS an optional one of
 * zeros (ndig 0: no fraction). */
static int fraction(sc *c, int from, int to, int kind, int ndig)
{
    if (kind != FRAC_NONZERO)
        kvp_gbuild_eps(c->b, from, to);
    if (ndig == 0)
        return 0;
    int dot = sc_state(c);
    if (dot < 0)
        return -1;
    kvp_gbuild_range(c->b, from, '.', '.', dot);
    /* z[k]: k digits, all zeros so far; n[k]: k digits, one not zero */
    int z = dot, n = -1;
    for (int k = 1; k <= ndig; k++) {
        int z2 = sc_state(c), n2 = kind == FRAC_ZEROS ? -2 : sc_state(c);
        if (z2 < 0 || n2 == -1)
            return -1;
        kvp_gbuild_range(c->b, z, '0', '0', z2);
        if (kind != FRAC_ZEROS) {
            kvp_gbuild_range(c->b, z, '1', '9', n2);
            if (n >= 0)
                kvp_gbuild_range(c->b, n, '0', '9', n2);
            kvp_gbuild_eps(c->b, n2, to);
        }
        if (kind != FRAC_NONZERO)
            kvp_gbuild_eps(c->b, z2, to);
        z = z2;
        n = n2;
    }
    return 0;
}

/* Under bounds a number has at most SIG_DIGITS significant digits in all (its integer
 * part's digits, then a fraction of the rest), so its value is as far from a bound when
 * a reader parses it to a double: decimals of 15 digits each have a double of their own,
 * in the same order, and one with a fraction is below 10^14, where every integer bound
 * is exact. */
#define SIG_DIGITS 15

static int int_digits(long long v)
{
    int n = 1;
    for (; v >= 10; v /= 10)
        n++;
    return n;
}

static int frac_digits(long long v)
{
    int n = int_digits(v);
    return n >= SIG_DIGITS ? 0 : SIG_DIGITS - n;
}

/* Numbers x with |x| in [a, b] spelled after from (a sign, if any, already written):
 * a_ex / b_ex make that end exclusive. */
static int magnitudes(sc *c, int from, int to, long long a, long long b, int a_ex, int b_ex)
{
    if (a == b) {
        if (a_ex || b_ex)
            return 0;
        int s = sc_state(c);
        return s < 0 || naturals(c, from, s, a, a) < 0
                   ? -1 : fraction(c, s, to, FRAC_ZEROS, frac_digits(a));
    }
    int s1 = sc_state(c), s3 = sc_state(c);
    if (s3 < 0)
        return -1;
    /* a with a fraction (any, or not zero when a is excluded) */
    if (!(a_ex && frac_digits(a) == 0) &&
        (naturals(c, from, s1, a, a) < 0 ||
         fraction(c, s1, to, a_ex ? FRAC_NONZERO : FRAC_ANY, frac_digits(a)) < 0))
        return -1;
    /* between them, by the number of digits (which sets the fraction's) */
    for (long long lo = a + 1; lo <= b - 1;) {
        long long top = 9;   /* the largest number of lo's digits (19 digits: any) */
        for (int k = 1; k < int_digits(lo) && top < LLONG_MAX / 10; k++)
            top = top * 10 + 9;
        if (int_digits(lo) >= 19)
            top = LLONG_MAX;
        long long hi = b - 1 < top ? b - 1 : top;
        int s2 = sc_state(c);
        if (s2 < 0 || naturals(c, from, s2, lo, hi) < 0 ||
            fraction(c, s2, to, FRAC_ANY, frac_digits(lo)) < 0)
            return -1;
        lo = hi + 1;
    }
    if (!b_ex && (naturals(c, from, s3, b, b) < 0 ||
                  fraction(c, s3, to, FRAC_ZEROS, frac_digits(b)) < 0))
        return -1;
    return 0;
}

int sc_number(sc *c, const json_t *s, int from, int to)
{
    int has_lo, has_hi, ex_lo, ex_hi;
    long long a = 0, b = 0;
    if (bounds(c, s, 0, &has_lo, &a, &ex_lo, &has_hi, &b, &ex_hi) < 0)
        return -1;
    if (!has_lo && !has_hi) {
        /* -? (0 | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?: two
         * exponent digits keep every value finite and above the least double */
        int sign = sc_state(c), in = sc_state(c), e = sc_state(c), es = sc_state(c),
            d1 = sc_state(c), d2 = sc_state(c);
        if (d2 < 0)
            return -1;
        kvp_gbuild_eps(c->b, from, sign);
        kvp_gbuild_range(c->b, from, '-', '-', sign);
        if (int_range(c, sign, in, 0, UNBOUNDED) < 0 ||
            fraction(c, in, e, FRAC_ANY, DIGITS_MAX) < 0)
            return -1;
        kvp_gbuild_eps(c->b, e, to);
        kvp_gbuild_range(c->b, e, 'e', 'e', es);
        kvp_gbuild_range(c->b, e, 'E', 'E', es);
        int es2 = sc_state(c);
        if (es2 < 0)
            return -1;
        kvp_gbuild_eps(c->b, es, es2);
        kvp_gbuild_range(c->b, es, '-', '-', es2);
        kvp_gbuild_range(c->b, es, '+', '+', es2);
        kvp_gbuild_range(c->b, es2, '0', '9', d1);
        kvp_gbuild_range(c->b, d1, '0', '9', d2);
        kvp_gbuild_eps(c->b, d1, to);
        kvp_gbuild_eps(c->b, d2, to);
        return 0;
    }
    if (!has_lo)
        a = b < -UNBOUNDED ? b - UNBOUNDED : -UNBOUNDED;
    if (!has_hi)
        b = a > UNBOUNDED ? a + UNBOUNDED : UNBOUNDED;
    if (a > b || (a == b && (ex_lo || ex_hi))) {
        const char *lo, *hi;
        bound_names(s, ex_lo, ex_hi, &lo, &hi);
        return sc_fail(c, "%s is above %s: no number fits", lo, hi);
    }
    if (b >= 0 && magnitudes(c, from, to, a > 0 ? a : 0, b, a >= 0 && ex_lo, ex_hi) < 0)
        return -1;
    if (a < 0) {
        int neg = sc_state(c);
        if (neg < 0)
            return -1;
        kvp_gbuild_range(c->b, from, '-', '-', neg);
        /* -y for y in [max(-b, 0), -a] */
        long long d = b < 0 ? -b : 0;
        if (magnitudes(c, neg, to, d, -a, b <= 0 && ex_hi, ex_lo) < 0)
            return -1;
    }
    return 0;
}
