/* The Jinja lexer: a template's text becomes text tokens and the tokens of its tags.
 * Whitespace as transformers sets it: trim_blocks (a block or comment tag eats the newline
 * after it), lstrip_blocks (spaces and tabs from a line's start up to a block or comment
 * tag go), "-" on a tag strips all white space on its side, "+" keeps it. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja_impl.h"

__attribute__((noreturn, format(printf, 3, 4)))
void jp_fail(jparser *p, int line, const char *fmt, ...)
{
    if (p->errlen) {
        int k = snprintf(p->err, p->errlen, "line %d: ", line);
        va_list ap;
        va_start(ap, fmt);
        if (k >= 0 && (size_t)k < p->errlen)
            vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    longjmp(p->jb, 1);
}

void *jp_alloc(jparser *p, size_t n)
{
    void *q = ja_alloc(p->a, n);
    if (!q)
        jp_fail(p, 0, "out of memory");
    return q;
}

static jtok *push(jparser *p, int type, int line)
{
    if (p->nt == p->cap) {
        int cap = p->cap ? p->cap * 2 : 256;
        jtok *t = jp_alloc(p, (size_t)cap * sizeof *t);
        if (p->nt)
            memcpy(t, p->t, (size_t)p->nt * sizeof *t);
        p->t = t;
        p->cap = cap;
    }
    jtok *t = &p->t[p->nt++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* The line of src[at]; positions are asked for mostly in increasing order. */
static int line_of(jparser *p, size_t at)
{
    if (at < p->lpos || !p->lno) {
        p->lpos = 0;
        p->lno = 1;
    }
    for (; p->lpos < at && p->lpos < p->len; p->lpos++)
        p->lno += p->src[p->lpos] == '\n';
    return p->lno;
}

static void put_utf8(char *o, size_t *k, unsigned cp)
{
    if (cp < 0x80) {
        o[(*k)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*k)++] = (char)(0xc0 | cp >> 6);
        o[(*k)++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xe0 | cp >> 12);
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[(*k)++] = (char)(0x80 | (cp & 0x3f));
    } else {
        o[(*k)++] = (char)(0xf0 | cp >> 18);
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[(*k)++] = (char)(0x80 | (cp & 0x3f));
    }
}

static int hexval(char c)
{
    return is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
         : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
}

/* A string literal at src[*at] (a quote), decoded with Python's escapes. */
static void lex_string(jparser *p, size_t *at, int line)
{
    char q = p->src[*at];
    size_t i = *at + 1;
    char *o = jp_alloc(p, p->len - i + 1);
    size_t k = 0;
    for (;; i++) {
        if (i >= p->len)
            jp_fail(p, line, "unterminated string literal");
        char c = p->src[i];
        if (c == q)
            break;
        if (c != '\\' || i + 1 >= p->len) {
            o[k++] = c;
            continue;
        }
        char e = p->src[++i];
        int nhex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (nhex) {
            unsigned cp = 0;
            int ok = i + (size_t)nhex < p->len;
            for (int j = 1; ok && j <= nhex; j++) {
                int h = hexval(p->src[i + (size_t)j]);
                ok = h >= 0;
                cp = cp * 16 + (unsigned)(h < 0 ? 0 : h);
            }
            if (!ok || cp > 0x10ffff)
                jp_fail(p, line, "bad \\%c escape in a string literal", e);
            put_utf8(o, &k, cp);
            i += (size_t)nhex;
            continue;
        }
        const char *from = "ntr\\'\"abfv0\n", *to = "\n\t\r\\'\"\a\b\f\v";
        const char *f = strchr(from, e);
        if (f && e == '\n')
            continue;                       /* backslash-newline: a continuation */
        if (f)
            o[k++] = to[f - from];
        else {
            o[k++] = '\\';                  /* unknown escapes stay as written */
            o[k++] = e;
        }
    }
    jtok *t = push(p, T_STR, line);
    o[k] = 0;
    t->s = o;
    t->n = k;
    *at = i + 1;
}

static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};

/* The tokens of one tag, up to its closing delimiter; returns the position after it and
 * whether it had a "-" (strip what follows). */
static size_t lex_tag(jparser *p, size_t i, int var, int *strip_after)
{
    int depth = 0;
    char close = var ? '}' : '%';
    for (;;) {
        while (i < p->len && is_ws(p->src[i]))
            i++;
        int line = line_of(p, i);
        if (i >= p->len)
            jp_fail(p, line, "unclosed %s tag", var ? "'{{'" : "'{%'");
        const char *s = p->src + i;
        size_t left = p->len - i;
        if (depth == 0) {
            int mod = (s[0] == '-' || s[0] == '+') ? 1 : 0;
            if (left >= (size_t)mod + 2 && s[mod] == close && s[mod + 1] == '}') {
                *strip_after = s[0] == '-' ? 1 : s[0] == '+' ? -1 : 0;
                push(p, var ? T_VEND : T_BEND, line);
                return i + (size_t)mod + 2;
            }
        }
        if (is_alpha(s[0])) {
            size_t k = 1;
            while (k < left && (is_alpha(s[k]) || is_digit(s[k])))
                k++;
            jtok *t = push(p, T_NAME, line);
            t->s = s;
            t->n = k;
            i += k;
        } else if (is_digit(s[0])) {
            char *end;
            size_t k = 0;
            while (k < left && (is_digit(s[k]) || s[k] == '_'))
                k++;
            int flt = k + 1 < left && s[k] == '.' && is_digit(s[k + 1]);
            char buf[64];
            if (flt) {
                k++;
                while (k < left && (is_digit(s[k]) || s[k] == '_'))
                    k++;
            }
            if (k < left && (s[k] == 'e' || s[k] == 'E')) {
                size_t e = k + 1 + (k + 1 < left && (s[k + 1] == '+' || s[k + 1] == '-'));
                if (e < left && is_digit(s[e])) {
                    flt = 1;
                    for (k = e; k < left && is_digit(s[k]); k++)
                        ;
                }
            }
            if (k >= sizeof buf)
                jp_fail(p, line, "number literal too long");
            size_t m = 0;
            for (size_t j = 0; j < k; j++)
                if (s[j] != '_')
                    buf[m++] = s[j];
            buf[m] = 0;
            jtok *t = push(p, flt ? T_FLOAT : T_INT, line);
            if (flt)
                t->f = strtod(buf, &end);
            else {
                errno = 0;
                t->i = strtoll(buf, &end, 10);
                if (errno == ERANGE)
                    jp_fail(p, line, "integer literal %s does not fit in 64 bits", buf);
            }
            i += k;
        } else if (s[0] == '\'' || s[0] == '"') {
            lex_string(p, &i, line);
        } else {
            size_t k = 0;
            for (size_t o = 0; o < sizeof ops2 / sizeof *ops2; o++)
                if (left >= 2 && !memcmp(s, ops2[o], 2))
                    k = 2;
            if (!k && strchr("+-*/%~<>=()[]{}.,:|", s[0]))
                k = 1;
            if (!k || !s[0])
                jp_fail(p, line, "unexpected character '%c'", s[0]);
            if (strchr("([{", s[0]))
                depth++;
            if (strchr(")]}", s[0]) && depth > 0)
                depth--;
            jtok *t = push(p, T_OP, line);
            t->s = s;
            t->n = k;
            i += k;
        }
    }
}

void jp_lex(jparser *p)
{
    /* Jinja drops one newline at the template's end (keep_trailing_newline off) */
    if (p->len && p->src[p->len - 1] == '\n')
        p->len -= p->len > 1 && p->src[p->len - 2] == '\r' ? 2 : 1;
    size_t i = 0;
    int strip_next = 0;            /* 1: the previous tag had "-"; 2: trim_blocks */
    while (i <= p->len) {
        /* the next tag start */
        size_t j = i;
        int kind = 0;              /* '{', '%', '#' */
        for (; j + 1 < p->len; j++)
            if (p->src[j] == '{' && strchr("{%#", p->src[j + 1])) {
                kind = p->src[j + 1];
                break;
            }
        if (!kind)
            j = p->len;
        const char *ts = p->src + i;
        size_t tn = j - i;
        if (strip_next == 1)
            while (tn && is_ws(*ts))
                ts++, tn--;
        else if (strip_next == 2 && tn && *ts == '\n')
            ts++, tn--;
        char mod = kind && j + 2 < p->len ? p->src[j + 2] : 0;
        if (kind && mod == '-') {
            while (tn && is_ws(ts[tn - 1]))
                tn--;
        } else if ((kind == '%' || kind == '#') && mod != '+') {
            /* lstrip_blocks: only spaces and tabs between the line's start and the tag */
            size_t l = tn;
            while (l && (ts[l - 1] == ' ' || ts[l - 1] == '\t'))
                l--;
            if ((l > 0 && ts[l - 1] == '\n') || (l == 0 && (ts == p->src || ts[-1] == '\n')))
                tn = l;
        }
        if (tn) {
            jtok *t = push(p, T_TEXT, line_of(p, (size_t)(ts - p->src)));
            t->s = ts;
            t->n = tn;
        }
        if (!kind)
            break;
        size_t at = j + 2 + (mod == '-' || mod == '+');
        int sa = 0;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t k = at; k + 1 < p->len && !e; k++)
                if (p->src[k] == '#' && p->src[k + 1] == '}')
                    e = p->src + k;
            if (!e)
                jp_fail(p, line_of(p, j), "unclosed comment");
            sa = e > p->src + at && e[-1] == '-' ? 1 : e > p->src + at && e[-1] == '+' ? -1 : 0;
            i = (size_t)(e - p->src) + 2;
        } else {
            push(p, kind == '{' ? T_VBEGIN : T_BBEGIN, line_of(p, j));
            i = lex_tag(p, at, kind == '{', &sa);
        }
        strip_next = sa == 1 ? 1 : (sa == 0 && kind != '{') ? 2 : 0;
    }
    push(p, T_EOF, line_of(p, p->len));
}

