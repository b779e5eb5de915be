/* A string's `pattern` (model/schema_impl.h): the regex subset kvpd compiles into the
 * grammar. Supported: literal characters, ".", classes "[a-z_]" and "[^...]" (ASCII
 * members), the escapes \d \w \s \D \W \S \n \t \r \f \v and escaped punctuation, groups
 * "(...)" and "(?:...)", "|", and the quantifiers * + ? {n} {n,} {n,m} (lazy ones match
 * the same strings). "^" and "$" only at the pattern's ends; without them the pattern may
 * match anywhere (JSON Schema's search semantics: any characters before and after).
 * Refused: backreferences, lookaround, word boundaries, \p classes, flags, a repeated
 * part that can be empty. The grammar writes the characters of a class as plain bytes,
 * '"' and '\' escaped, and of the control characters only \b \f \n \r \t. */
#include "model/schema_impl.h"

#include <stdlib.h>
#include <string.h>

#define RE_MAX_NODES 1024

enum { RE_SET, RE_BYTES, RE_CAT, RE_ALT, RE_REP };

typedef struct re_node {
    int kind;
    uint64_t set[2];       /* RE_SET: ASCII members */
    int nonascii;          /* RE_SET: every character past ASCII */
    char bytes[4];         /* RE_BYTES: one UTF-8 character */
    int n_bytes;
    int kid[2];            /* RE_CAT, RE_ALT: two children; RE_REP: kid[0] */
    int min, max;          /* RE_REP: max -1 is unbounded */
} re_node;

typedef struct re {
    sc *c;
    const char *p;
    re_node *n;
    int count;
} re;

static int node(re *r, int kind)
{
    if (r->count >= RE_MAX_NODES)
        return sc_fail(r->c, "pattern is too long (over %d parts)", RE_MAX_NODES);
    memset(&r->n[r->count], 0, sizeof r->n[0]);
    r->n[r->count].kind = kind;
    return r->count++;
}

static void set_add(re_node *s, int lo, int hi)
{
    for (int ch = lo; ch <= hi; ch++)
        s->set[ch >> 6] |= 1ull << (ch & 63);
}

/* \d \w \s and their complements into s; 0, or -1 when e is not one. */
static int class_escape(re_node *s, char e)
{
    re_node t = {0};
    switch (e | 0x20) {
    case 'd': set_add(&t, '0', '9'); break;
    case 'w': set_add(&t, '0', '9'); set_add(&t, 'a', 'z'); set_add(&t, 'A', 'Z');
              set_add(&t, '_', '_'); break;
    case 's': set_add(&t, ' ', ' '); set_add(&t, '\t', '\r'); break;
    default: return -1;
    }
    if (e >= 'A' && e <= 'Z') {
        t.set[0] = ~t.set[0];
        t.set[1] = ~t.set[1];
        t.nonascii = 1;
    }
    s->set[0] |= t.set[0];
    s->set[1] |= t.set[1];
    s->nonascii |= t.nonascii;
    return 0;
}

/* The character an escape stands for, or -1 when kvpd does not take it. */
static int escape_char(char e)
{
    static const char map[][2] = {{'n', '\n'}, {'t', '\t'}, {'r', '\r'}, {'f', '\f'}, {'v', '\v'}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (e == map[i][0])
            return map[i][1];
    if ((e >= 0x21 && e <= 0x2F) || (e >= 0x3A && e <= 0x40) || (e >= 0x5B && e <= 0x60) ||
        (e >= 0x7B && e <= 0x7E))
        return e;
    return -1;
}

static int parse_alt(re *r);

static int parse_class(re *r)
{
    int id = node(r, RE_SET);
    if (id < 0)
        return -1;
    re_node *s = &r->n[id];
    int neg = *r->p == '^';
    r->p += neg;
    int first = 1;
    while (*r->p && (*r->p != ']' || first)) {
        first = 0;
        int lo;
        if (*r->p == '\\') {
            char e = r->p[1];
            if (!e)
                break;
            r->p += 2;
            if (class_escape(s, e) == 0)
                continue;
            if ((lo = escape_char(e)) < 0)
                return sc_fail(r->c, "pattern: \\%c is not supported", e);
        } else if ((unsigned char)*r->p >= 0x80) {
            return sc_fail(r->c, "pattern: a character past ASCII in a class is not supported");
        } else
            lo = (unsigned char)*r->p++;
        int hi = lo;
        if (r->p[0] == '-' && r->p[1] && r->p[1] != ']') {
            if (r->p[1] == '\\' || (unsigned char)r->p[1] >= 0x80)
                return sc_fail(r->c, "pattern: this class range is not supported");
            hi = (unsigned char)r->p[1];
            r->p += 2;
            if (hi < lo)
                return sc_fail(r->c, "pattern: a class range runs backwards");
        }
        set_add(s, lo, hi);
    }
    if (*r->p != ']')
        return sc_fail(r->c, "pattern: a class is not closed");
    r->p++;
    if (neg) {
        s->set[0] = ~s->set[0];
        s->set[1] = ~s->set[1];
        s->nonascii = !s->nonascii;
    }
    return id;
}

static int parse_atom(re *r)
{
    char ch = *r->p;
    if (ch == '(') {
        r->p++;
        if (r->p[0] == '?') {
            if (r->p[1] != ':')
                return sc_fail(r->c, "pattern: (?%c is not supported", r->p[1] ? r->p[1] : ' ');
            r->p += 2;
        }
        int a = parse_alt(r);
        if (a < 0)
            return -1;
        if (*r->p != ')')
            return sc_fail(r->c, "pattern: a group is not closed");
        r->p++;
        return a;
    }
    if (ch == '[') {
        r->p++;
        return parse_class(r);
    }
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{')
        return sc_fail(r->c, "pattern: %c repeats nothing", ch);
    if (ch == '^' || ch == '$')
        return sc_fail(r->c, "pattern: %c is supported only at the pattern's ends", ch);
    int id = node(r, RE_SET);
    if (id < 0)
        return -1;
    re_node *s = &r->n[id];
    if (ch == '.') {
        r->p++;
        set_add(s, 0, 127);
        s->set[0] &= ~(1ull << '\n');
        s->nonascii = 1;
    } else if (ch == '\\') {
        char e = r->p[1];
        if (!e)
            return sc_fail(r->c, "pattern: it ends in a backslash");
        r->p += 2;
        if (class_escape(s, e) < 0) {
            int v = escape_char(e);
            if (v < 0)
                return sc_fail(r->c, "pattern: \\%c is not supported", e);
            set_add(s, v, v);
        }
    } else if ((unsigned char)ch >= 0x80) {
        unsigned char u = (unsigned char)ch;
        int len = u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : u >= 0xC0 ? 2 : 0;
        for (int i = 1; i < len; i++)
            if (((unsigned char)r->p[i] & 0xC0) != 0x80)
                len = 0;
        if (!len)
            return sc_fail(r->c, "pattern: it is not UTF-8");
        s->kind = RE_BYTES;
        memcpy(s->bytes, r->p, (size_t)len);
        s->n_bytes = len;
        r->p += len;
    } else {
        set_add(s, (unsigned char)ch, (unsigned char)ch);
        r->p++;
    }
    return id;
}

static int number(re *r, int *v)
{
    if (*r->p < '0' || *r->p > '9')
        return -1;
    long n = 0;
    while (*r->p >= '0' && *r->p <= '9') {
        n = n * 10 + (*r->p++ - '0');
        if (n > KVP_SCHEMA_MAX_REPEAT)
            return sc_fail(r->c, "pattern: a count above %d is not supported",
                           KVP_SCHEMA_MAX_REPEAT);
    }
    *v = (int)n;
    return 0;
}

static int parse_quant(re *r, int a)
{
    for (;;) {
        int min = 0, max = 0;
        char ch = *r->p;
        if (ch == '*' || ch == '+' || ch == '?') {
            min = ch == '+';
            max = ch == '?' ? 1 : -1;
            r->p++;
        } else if (ch == '{') {
            r->p++;
            if (number(r, &min) < 0)
                return sc_fail(r->c, "pattern: a count {n,m} is malformed");
            max = min;
            if (*r->p == ',') {
                r->p++;
                max = -1;
                if (*r->p != '}' && number(r, &max) < 0)
                    return sc_fail(r->c, "pattern: a count {n,m} is malformed");
            }
            if (*r->p != '}' || (max >= 0 && max < min))
                return sc_fail(r->c, "pattern: a count {n,m} is malformed");
            r->p++;
        } else
            return a;
        if (*r->p == '?')
            r->p++;   /* lazy: the same strings */
        else if (*r->p == '+')
            return sc_fail(r->c, "pattern: possessive quantifiers are not supported");
        int q = node(r, RE_REP);
        if (q < 0)
            return -1;
        r->n[q].kid[0] = a;
        r->n[q].min = min;
        r->n[q].max = max;
        a = q;
    }
}

/* Joins a and b under kind; either may be -2 (nothing yet). */
static int join(re *r, int kind, int a, int b)
{
    if (a == -2)
        return b;
    int j = node(r, kind);
    if (j < 0)
        return -1;
    r->n[j].kid[0] = a;
    r->n[j].kid[1] = b;
    return j;
}

static int parse_seq(re *r)
{
    int s = -2;
    while (*r->p && *r->p != '|' && *r->p != ')') {
        if (*r->p == '$' && r->p[1] == '\0')
            break;
        int a = parse_atom(r);
        if (a < 0 || (a = parse_quant(r, a)) < 0 || (s = join(r, RE_CAT, s, a)) < 0)
            return -1;
    }
    if (s == -2) {   /* empty: a node that matches nothing but the empty string */
        if ((s = node(r, RE_REP)) < 0)
            return -1;
        r->n[s].min = r->n[s].max = 0;
        r->n[s].kid[0] = -1;
    }
    return s;
}

static int parse_alt(re *r)
{
    int a = parse_seq(r);
    while (a >= 0 && *r->p == '|') {
        r->p++;
        int b = parse_seq(r);
        a = b < 0 ? -1 : join(r, RE_ALT, a, b);
    }
    return a;
}

static int nullable(const re *r, int i)
{
    const re_node *n = &r->n[i];
    switch (n->kind) {
    case RE_CAT: return nullable(r, n->kid[0]) && nullable(r, n->kid[1]);
    case RE_ALT: return nullable(r, n->kid[0]) || nullable(r, n->kid[1]);
    case RE_REP: return n->min == 0 || nullable(r, n->kid[0]);
    default: return 0;
    }
}

static int emit_set(sc *c, const re_node *n, int from, int to)
{
    int arcs = 0, esc = -1;
    for (int lo = 0x20; lo < 0x80;) {
        if (lo == '"' || lo == '\\' || !(n->set[lo >> 6] >> (lo & 63) & 1)) {
            lo++;
            continue;
        }
        int hi = lo;
        while (hi + 1 < 0x80 && hi + 1 != '"' && hi + 1 != '\\' &&
               (n->set[(hi + 1) >> 6] >> ((hi + 1) & 63) & 1))
            hi++;
        kvp_gbuild_range(c->b, from, (unsigned)lo, (unsigned)hi, to);
        arcs++;
        lo = hi + 1;
    }
    static const char escaped[][2] = {{'"', '"'}, {'\\', '\\'}, {'\b', 'b'}, {'\f', 'f'},
                                      {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}};
    for (size_t i = 0; i < sizeof escaped / sizeof escaped[0]; i++) {
        int ch = escaped[i][0];
        if (!(n->set[ch >> 6] >> (ch & 63) & 1))
            continue;
        if (esc < 0) {
            if ((esc = sc_state(c)) < 0)
                return -1;
            kvp_gbuild_range(c->b, from, '\\', '\\', esc);
        }
        kvp_gbuild_range(c->b, esc, (uint8_t)escaped[i][1], (uint8_t)escaped[i][1], to);
        arcs++;
    }
    if (n->nonascii) {
        if (sc_utf8(c, from, to) < 0)
            return -1;
        arcs++;
    }
    if (!arcs)
        return sc_fail(c, "pattern: a class holds only characters kvpd cannot write");
    return 0;
}

static int emit(re *r, int i, int from, int to)
{
    sc *c = r->c;
    if (i < 0) {
        kvp_gbuild_eps(c->b, from, to);
        return 0;
    }
    const re_node *n = &r->n[i];
    switch (n->kind) {
    case RE_SET:
        return emit_set(c, n, from, to);
    case RE_BYTES:
        return sc_literal(c, from, to, n->bytes, (size_t)n->n_bytes);
    case RE_ALT:
        return emit(r, n->kid[0], from, to) < 0 ? -1 : emit(r, n->kid[1], from, to);
    case RE_CAT: {
        int mid = sc_state(c);
        return mid < 0 || emit(r, n->kid[0], from, mid) < 0 ? -1 : emit(r, n->kid[1], mid, to);
    }
    }
    /* RE_REP */
    if (n->kid[0] < 0 || (n->max == 0)) {
        kvp_gbuild_eps(c->b, from, to);
        return 0;
    }
    if (n->max < 0 && nullable(r, n->kid[0]))
        return sc_fail(c, "pattern: a repeated part that can be empty is not supported");
    int at = from;
    for (int k = 0; k < n->min; k++) {
        int next = sc_state(c);
        if (next < 0 || emit(r, n->kid[0], at, next) < 0)
            return -1;
        at = next;
    }
    if (n->max < 0) {
        /* a state of its own: looping back to `at` would reach at's other arcs */
        int loop = sc_state(c), back = sc_state(c);
        if (back < 0 || emit(r, n->kid[0], loop, back) < 0)
            return -1;
        kvp_gbuild_eps(c->b, at, loop);
        kvp_gbuild_eps(c->b, back, loop);
        kvp_gbuild_eps(c->b, loop, to);
        return 0;
    }
    for (int k = n->min; k < n->max; k++) {
        kvp_gbuild_eps(c->b, at, to);
        int next = sc_state(c);
        if (next < 0 || emit(r, n->kid[0], at, next) < 0)
            return -1;
        at = next;
    }
    kvp_gbuild_eps(c->b, at, to);
    return 0;
}

int sc_pattern(sc *c, const char *pattern, int from, int to)
{
    re r = {c, pattern, malloc(RE_MAX_NODES * sizeof(re_node)), 0};
    if (!r.n)
        return sc_fail(c, "out of memory");
    size_t len = strlen(pattern);
    int start = pattern[0] == '^';
    size_t bs = 0;   /* backslashes before a final '$' */
    while (len >= 2 + bs && pattern[len - 2 - bs] == '\\')
        bs++;
    int end = len > (size_t)start && pattern[len - 1] == '$' && bs % 2 == 0;
    r.p += start;
    int root = parse_alt(&r);
    int rc = -1;
    if (root >= 0 && *r.p == ')')
        sc_fail(c, "pattern: ) closes no group");
    else if (root >= 0 && !(*r.p == '\0' || (end && r.p[0] == '$' && r.p[1] == '\0')))
        sc_fail(c, "pattern: %c is not supported here", *r.p);
    else if (root >= 0) {
        int a = from, b = to;
        rc = 0;
        if (!start) {   /* any characters first */
            if ((a = sc_state(c)) < 0 || sc_char(c, a, a) < 0)
                rc = -1;
            else
                kvp_gbuild_eps(c->b, from, a);
        }
        if (rc == 0 && !end) {
            if ((b = sc_state(c)) < 0 || sc_char(c, b, b) < 0)
                rc = -1;
            else
                kvp_gbuild_eps(c->b, b, to);
        }
        if (rc == 0)
            rc = emit(&r, root, a, b);
    }
    free(r.n);
    return rc;
}
