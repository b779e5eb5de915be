/* The Jinja interpreter's filters, tests, string and dict methods and global functions:
 * the ones Hugging Face chat templates use, with transformers' additions (tojson without
 * ASCII escaping or key sorting, raise_exception, strftime_now). Unknown names are errors
 * that name them. Case mapping is ASCII. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/jinja_impl.h"
#include "model/unicode.h"

enum { F_NAMESPACE = 1, F_RANGE, F_RAISE, F_STRFTIME, F_DICT, F_CYCLE,
       M_STARTSWITH, M_ENDSWITH, M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_REPLACE, M_UPPER,
       M_LOWER, M_TITLE, M_CAPITALIZE, M_FIND, M_JOIN, M_ITEMS, M_KEYS, M_VALUES, M_GET };

static const struct { const char *name; int fn, on; } methods[] = {
    {"startswith", M_STARTSWITH, JV_STR}, {"endswith", M_ENDSWITH, JV_STR},
    {"strip", M_STRIP, JV_STR}, {"lstrip", M_LSTRIP, JV_STR}, {"rstrip", M_RSTRIP, JV_STR},
    {"split", M_SPLIT, JV_STR}, {"replace", M_REPLACE, JV_STR}, {"upper", M_UPPER, JV_STR},
    {"lower", M_LOWER, JV_STR}, {"title", M_TITLE, JV_STR},
    {"capitalize", M_CAPITALIZE, JV_STR}, {"find", M_FIND, JV_STR}, {"join", M_JOIN, JV_STR},
    {"items", M_ITEMS, JV_DICT}, {"keys", M_KEYS, JV_DICT}, {"values", M_VALUES, JV_DICT},
    {"get", M_GET, JV_DICT},
};

static const struct { const char *name; int fn; } globals[] = {
    {"namespace", F_NAMESPACE}, {"range", F_RANGE}, {"raise_exception", F_RAISE},
    {"strftime_now", F_STRFTIME}, {"dict", F_DICT},
};

static kvp_jv *func(jctx *c, int fn, kvp_jv *self)
{
    kvp_jv *f = jv_new(c, JV_FUNC);
    f->fn = fn;
    f->self = self;
    return f;
}

static void *must_alloc(jctx *c, size_t n)
{
    void *p = ja_alloc(c->a, n);
    if (!p)
        jx_fail(c, 0, "the template needs more than %zu bytes of memory", c->a->max);
    return p;
}

kvp_jv *jx_method(jctx *c, kvp_jv *self, const char *name, int line)
{
    (void)line;
    if (self->ns)
        return NULL;
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
        if ((int)self->type == methods[i].on && !strcmp(methods[i].name, name))
            return func(c, methods[i].fn, self);
    return NULL;
}

kvp_jv *jx_loop_method(jctx *c, kvp_jv *loop, const char *name)
{
    return !strcmp(name, "cycle") ? func(c, F_CYCLE, loop) : NULL;
}

kvp_jv *jx_global(jctx *c, const char *name)
{
    for (size_t i = 0; i < sizeof globals / sizeof *globals; i++)
        if (!strcmp(globals[i].name, name))
            return func(c, globals[i].fn, NULL);
    return NULL;
}

/* Argument `i` or keyword `name`, NULL when absent. */
kvp_jv *jx_arg(kvp_jv **args, int nargs, const char **kwn, kvp_jv **kwv, int nkw, int i,
                   const char *name)
{
    if (i < nargs)
        return args[i];
    for (int k = 0; name && k < nkw; k++)
        if (!strcmp(kwn[k], name))
            return kwv[k];
    return NULL;
}

kvp_jv *jx_need_str(jctx *c, kvp_jv *v, const char *what, int line)
{
    if (!v || v->type != JV_STR)
        jx_fail(c, line, "%s needs a string, not %s", what, v ? jv_type_name(v) : "nothing");
    return v;
}

kvp_jv *jx_list_of(jctx *c, kvp_jv *v, const char *what, int line)
{
    if (v->type == JV_LIST)
        return v;
    if (v->type == JV_UNDEF)
        return jv_new(c, JV_LIST);
    kvp_jv *l = jv_new(c, JV_LIST);
    if (v->type == JV_DICT) {
        for (size_t i = 0; i < v->len; i++)
            jv_push(c, l, v->k[i]);
        return l;
    }
    if (v->type == JV_STR) {
        size_t n, *cp = jv_cps(c, v, &n);
        for (size_t i = 0; i < n; i++)
            jv_push(c, l, jv_sub(c, v, cp[i], cp[i + 1]));
        return l;
    }
    jx_fail(c, line, "%s needs a sequence, not %s", what, jv_type_name(v));
}

/* ---- strings ---- */

static size_t cp_len(const char *s, size_t n, size_t at)
{
    size_t k = 1;
    while (at + k < n && ((unsigned char)s[at + k] & 0xc0) == 0x80)
        k++;
    return k;
}

/* The character at s[at] and its length: a code point, or 0x110000 + the byte for a byte
 * that does not start UTF-8. */
static uint32_t char_at(const char *s, size_t n, size_t at, size_t *len)
{
    uint32_t cp;
    *len = kvp_utf8_decode((const unsigned char *)s + at, n - at, &cp);
    return cp == 0xFFFD && *len == 1 ? 0x110000u + (unsigned char)s[at] : cp;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A strip's `chars` as a sorted set: each test is a binary search, so a long `chars`
 * costs its length once, not once per character stripped. */
typedef struct charset {
    uint32_t *v;
    size_t n;
} charset;

static int strippable(const kvp_jv *v, size_t at, const charset *set, size_t *len)
{
    if (!set)
        return jv_is_space_at(v->s, v->n, at, len);
    uint32_t ch = char_at(v->s, v->n, at, len);
    return bsearch(&ch, set->v, set->n, sizeof ch, cmp_u32) != NULL;
}

kvp_jv *jx_strip(jctx *c, kvp_jv *v, kvp_jv *chars, int left, int right)
{
    charset set = {0}, *cs = NULL;
    if (chars && chars->type != JV_NONE) {
        jx_need_str(c, chars, "strip", 0);
        set.v = must_alloc(c, (chars->n + 1) * sizeof *set.v);
        for (size_t i = 0, len; i < chars->n; i += len)
            set.v[set.n++] = char_at(chars->s, chars->n, i, &len);
        qsort(set.v, set.n, sizeof *set.v, cmp_u32);
        cs = &set;
    }
    size_t from = 0, to = v->n, len;
    while (left && from < to && strippable(v, from, cs, &len))
        from += len;
    while (right && to > from) {
        size_t at = to - 1;
        while (at > from && ((unsigned char)v->s[at] & 0xc0) == 0x80)
            at--;
        if (!strippable(v, at, cs, &len) || at + len != to)
            break;
        to = at;
    }
    return jv_sub(c, v, from, to);
}

/* Python's Final_Sigma rule for U+03A3 at cps[i] of the string cps[lo, hi): a cased
 * letter before it (case-ignorable ones skipped) and none after it make it the final
 * form. */
static uint32_t sigma(const uint32_t *cps, size_t lo, size_t hi, size_t i)
{
    size_t j = i;
    while (j > lo && kvp_unicode_is_case_ignorable(cps[j - 1]))
        j--;
    if (j == lo || !kvp_unicode_is_cased(cps[j - 1]))
        return 0x3C3;
    for (j = i + 1; j < hi && kvp_unicode_is_case_ignorable(cps[j]); j++)
        ;
    return j < hi && kvp_unicode_is_cased(cps[j]) ? 0x3C3 : 0x3C2;
}

/* jinja2's title filter splits at runs of [-\s({\[<] (\s: Python's isspace). */
static int title_separator(const kvp_jv *v, size_t at, uint32_t cp)
{
    size_t len;
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' ||
           jv_is_space_at(v->s, v->n, at, &len);
}

/* Case mapping with Unicode's full mappings, as Python does it: mode 0 str.lower, 1
 * str.upper, 2 str.title, 3 str.capitalize, 4 jinja2's title filter (each word between
 * separators is word[0].upper() + word[1:].lower()). Bytes that are not UTF-8 pass
 * through unchanged; each output character keeps the taint of the one it comes from. */
kvp_jv *jx_casemap(jctx *c, const kvp_jv *v, int mode)
{
    /* the code points and where each starts; an invalid byte is 0xFFFD of length 1 */
    size_t *at = ja_alloc(c->a, (v->n + 1) * sizeof *at), n = 0;
    uint32_t *cps = ja_alloc(c->a, (v->n + 1) * sizeof *cps);
    if (!at || !cps)
        jx_fail(c, 0, "out of memory");
    const unsigned char *s = (const unsigned char *)v->s;
    for (size_t i = 0; i < v->n; n++) {
        at[n] = i;
        i += kvp_utf8_decode(s + i, v->n - i, &cps[n]);
    }
    at[n] = v->n;
    jbuf b = {0};
    int prev_cased = 0;
    size_t word = 0, word_end = n;   /* mode 4: the word holding i */
    for (size_t i = 0; i < n; i++) {
        size_t len = at[i + 1] - at[i];
        const unsigned char *taint = v->taint ? v->taint + at[i] : NULL;
        uint32_t cp = cps[i], out[3];
        if (cp == 0xFFFD && len == 1) {
            jb_put(c, &b, (const char *)s + at[i], len, taint, 0);
            prev_cased = 0;
            continue;
        }
        size_t lo = 0, hi = n;       /* the string Final_Sigma looks at */
        int lower;
        if (mode == 4) {
            if (title_separator(v, at[i], cp)) {
                jb_put(c, &b, (const char *)s + at[i], len, taint, 0);
                word = i + 1;
                continue;
            }
            if (i == word)
                for (word_end = i + 1; word_end < n && !title_separator(v, at[word_end],
                                                                         cps[word_end]);
                     word_end++)
                    ;
            lower = i > word;
            lo = word + 1;
            hi = word_end;
        } else {
            lower = mode == 0 || (mode == 2 && prev_cased) || (mode == 3 && i > 0);
        }
        int k;
        if (lower && cp == 0x3A3)
            out[0] = sigma(cps, lo, hi, i), k = 1;
        else
            k = kvp_unicode_case(cp, lower ? KVP_UCASE_LOWER
                                     : mode == 1 || mode == 4 ? KVP_UCASE_UPPER
                                                              : KVP_UCASE_TITLE, out);
        int all = taint && *taint;
        for (int j = 0; j < k; j++) {
            char u[4];
            jb_put(c, &b, u, kvp_utf8_encode(out[j], u), NULL, all);
        }
        prev_cased = kvp_unicode_is_cased(cp);
    }
    return jb_value(c, &b);
}

static kvp_jv *split(jctx *c, kvp_jv *v, kvp_jv *sep, long long max, int line)
{
    kvp_jv *l = jv_new(c, JV_LIST);
    if (sep && sep->type == JV_NONE)
        sep = NULL;
    if (sep) {
        jx_need_str(c, sep, "split", line);
        if (!sep->n)
            jx_fail(c, line, "split: empty separator");
        size_t from = 0;
        const char *hit;
        while ((max < 0 || (long long)l->len < max) &&
               (hit = memmem(v->s + from, v->n - from, sep->s, sep->n))) {
            size_t at = (size_t)(hit - v->s);
            jv_push(c, l, jv_sub(c, v, from, at));
            from = at + sep->n;
        }
        jv_push(c, l, jv_sub(c, v, from, v->n));
        return l;
    }
    size_t i = 0, len;
    for (;;) {
        while (i < v->n && jv_is_space_at(v->s, v->n, i, &len))
            i += len;
        if (i >= v->n)
            break;
        if (max >= 0 && (long long)l->len >= max) {
            size_t to = v->n;
            jv_push(c, l, jx_strip(c, jv_sub(c, v, i, to), NULL, 0, 1));
            break;
        }
        size_t from = i;
        while (i < v->n && !jv_is_space_at(v->s, v->n, i, &len))
            i += cp_len(v->s, v->n, i);
        jv_push(c, l, jv_sub(c, v, from, i));
    }
    return l;
}

kvp_jv *jx_replace(jctx *c, kvp_jv *v, kvp_jv *old, kvp_jv *new, long long count, int line)
{
    jx_need_str(c, old, "replace", line);
    jx_need_str(c, new, "replace", line);
    jbuf o = {0};
    size_t from = 0;
    long long done = 0;
    if (!old->n) {                  /* Python: the new text between every code point */
        size_t n, *cp = jv_cps(c, v, &n);
        for (size_t i = 0; i <= n; i++) {
            if (count < 0 || done++ < count)
                jb_put(c, &o, new->s, new->n, new->taint, 0);
            if (i < n)
                jb_put(c, &o, v->s + cp[i], cp[i + 1] - cp[i], v->taint ? v->taint + cp[i] : NULL, 0);
        }
        return jb_value(c, &o);
    }
    const char *hit;
    while ((count < 0 || done < count) && (hit = memmem(v->s + from, v->n - from, old->s, old->n))) {
        size_t at = (size_t)(hit - v->s);
        jb_put(c, &o, v->s + from, at - from, v->taint ? v->taint + from : NULL, 0);
        jb_put(c, &o, new->s, new->n, new->taint, 0);
        from = at + old->n;
        done++;
    }
    jb_put(c, &o, v->s + from, v->n - from, v->taint ? v->taint + from : NULL, 0);
    return jb_value(c, &o);
}

kvp_jv *jx_join(jctx *c, kvp_jv *seq, kvp_jv *sep, kvp_jv *attribute, int line)
{
    seq = jx_list_of(c, seq, "join", line);
    jbuf o = {0};
    for (size_t i = 0; i < seq->len; i++) {
        if (i && sep)
            jb_put(c, &o, sep->s, sep->n, sep->taint, 0);
        kvp_jv *x = seq->v[i];
        if (attribute && x->type == JV_DICT)
            x = jx_dget(c, x, attribute->s, attribute->n) ?: jv_undef(c, NULL);
        jb_str(c, &o, x);
    }
    return jb_value(c, &o);
}

static int affix(jctx *c, kvp_jv *v, kvp_jv *a, int end, int line)
{
    if (a && a->type == JV_LIST) {
        for (size_t i = 0; i < a->len; i++)
            if (affix(c, v, a->v[i], end, line))
                return 1;
        return 0;
    }
    jx_need_str(c, a, end ? "endswith" : "startswith", line);
    jx_scan(c, a->n);
    return a->n <= v->n && !memcmp(v->s + (end ? v->n - a->n : 0), a->s, a->n);
}

/* ---- calls ---- */

kvp_jv *jx_pairs(jctx *c, kvp_jv *d, int what)   /* 0 items, 1 keys, 2 values */
{
    kvp_jv *l = jv_new(c, JV_LIST);
    for (size_t i = 0; i < d->len; i++) {
        if (what == 0) {
            kvp_jv *p = jv_new(c, JV_LIST);
            jv_push(c, p, d->k[i]);
            jv_push(c, p, d->v[i]);
            jv_push(c, l, p);
        } else {
            jv_push(c, l, what == 1 ? d->k[i] : d->v[i]);
        }
    }
    return l;
}

kvp_jv *jx_call_builtin(jctx *c, kvp_jv *f, kvp_jv **args, int nargs, const char **kwn,
                        kvp_jv **kwv, int nkw, int line)
{
    kvp_jv *self = f->self;
#define A(i, name) jx_arg(args, nargs, kwn, kwv, nkw, i, name)
    switch (f->fn) {
    case F_NAMESPACE: case F_DICT: {
        kvp_jv *d = jv_new(c, JV_DICT);
        d->ns = f->fn == F_NAMESPACE;
        if (nargs > 1 || (nargs == 1 && args[0]->type != JV_DICT))
            jx_fail(c, line, "%s() takes a dict or keyword arguments",
                    d->ns ? "namespace" : "dict");
        for (size_t i = 0; nargs && i < args[0]->len; i++)
            jv_dset(c, d, args[0]->k[i], args[0]->v[i]);
        for (int k = 0; k < nkw; k++)
            jv_dset(c, d, jv_cstr(c, kwn[k]), kwv[k]);
        return d;
    }
    case F_RANGE: {
        long long v[3] = {0, 0, 1};
        if (nargs < 1 || nargs > 3)
            jx_fail(c, line, "range() takes 1 to 3 integers");
        for (int i = 0; i < nargs; i++) {
            if (args[i]->type != JV_INT && args[i]->type != JV_BOOL)
                jx_fail(c, line, "range() takes integers");
            v[nargs == 1 ? 1 : i] = args[i]->i;
        }
        if (!v[2])
            jx_fail(c, line, "range() step cannot be zero");
        /* its length first: a huge range fails before it is built */
        unsigned long long span, step = v[2] > 0 ? (unsigned long long)v[2]
                                                 : 0ULL - (unsigned long long)v[2];
        if (v[2] > 0 ? v[1] <= v[0] : v[1] >= v[0])
            span = 0;
        else
            span = v[2] > 0 ? (unsigned long long)v[1] - (unsigned long long)v[0]
                            : (unsigned long long)v[0] - (unsigned long long)v[1];
        unsigned long long count = span / step + (span % step != 0);
        if (count > (unsigned long long)(c->lim.max_steps - c->steps))
            jx_fail(c, line, "range() of %llu items: more than the %ld loop iterations "
                    "a template may run", count, c->lim.max_steps);
        c->steps += (long)count;            /* building it is work of its length */
        kvp_jv *l = jv_new(c, JV_LIST);
        /* start + k * step is in range for each k < count; unsigned arithmetic wraps to it */
        for (unsigned long long k = 0; k < count; k++)
            jv_push(c, l, jv_int(c, (long long)((unsigned long long)v[0] +
                                                 k * (unsigned long long)v[2])));
        return l;
    }
    case F_RAISE: {
        kvp_jv *m = A(0, NULL);
        jbuf b = {0};
        if (m)
            jb_str(c, &b, m);
        jx_fail(c, line, "the template raised an exception: %s", b.s ? b.s : "");
    }
    case F_STRFTIME: {
        kvp_jv *fmt = jx_need_str(c, A(0, NULL), "strftime_now", line);
        if (memchr(fmt->s, 0, fmt->n))
            jx_fail(c, line, "strftime_now: the format has a NUL character");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        /* strftime's 0 means "empty" or "did not fit": a buffer far larger than any
         * conversion needs, up to the output bound, tells them apart */
        size_t cap = fmt->n <= c->lim.max_output / 64 ? fmt->n * 64 + 256 : 0;
        if (!cap || cap > c->lim.max_output)
            cap = c->lim.max_output + 1;
        char *out = must_alloc(c, cap);
        size_t n = fmt->n ? strftime(out, cap, fmt->s, &tm) : 0;
        if (n == 0 && fmt->n && cap > c->lim.max_output)
            jx_fail(c, line, "strftime_now: the output exceeds %zu bytes", c->lim.max_output);
        if (n > c->lim.max_output)
            jx_fail(c, line, "strftime_now: the output exceeds %zu bytes", c->lim.max_output);
        return jv_strn(c, out, n, NULL, 0);
    }
    case F_CYCLE:
        if (!nargs)
            jx_fail(c, line, "loop.cycle: no items for cycling given");
        return args[self->i % nargs];
    case M_STARTSWITH: case M_ENDSWITH:
        return jv_bool(c, affix(c, self, A(0, NULL), f->fn == M_ENDSWITH, line));
    case M_STRIP: case M_LSTRIP: case M_RSTRIP:
        return jx_strip(c, self, A(0, NULL), f->fn != M_RSTRIP, f->fn != M_LSTRIP);
    case M_SPLIT: {
        kvp_jv *max = A(1, "maxsplit");
        return split(c, self, A(0, "sep"), max && max->type == JV_INT ? max->i : -1, line);
    }
    case M_REPLACE: {
        kvp_jv *n = A(2, "count");
        return jx_replace(c, self, A(0, NULL), A(1, NULL), n && n->type == JV_INT ? n->i : -1, line);
    }
    case M_UPPER: return jx_casemap(c, self, 1);
    case M_LOWER: return jx_casemap(c, self, 0);
    case M_TITLE: return jx_casemap(c, self, 2);
    case M_CAPITALIZE: return jx_casemap(c, self, 3);
    case M_FIND: {
        kvp_jv *x = jx_need_str(c, A(0, NULL), "find", line);
        jx_scan(c, self->n);
        const char *hit = memmem(self->s, self->n, x->s, x->n);
        if (!hit)
            return jv_int(c, -1);
        long long cps = 0;
        for (const char *p = self->s; p < hit; p++)
            cps += ((unsigned char)*p & 0xc0) != 0x80;
        return jv_int(c, cps);
    }
    case M_JOIN: return jx_join(c, A(0, NULL) ?: jv_new(c, JV_LIST), self, NULL, line);
    case M_ITEMS: return jx_pairs(c, self, 0);
    case M_KEYS: return jx_pairs(c, self, 1);
    case M_VALUES: return jx_pairs(c, self, 2);
    case M_GET: {
        kvp_jv *k = A(0, NULL), *d = A(1, "default");
        kvp_jv *v = k && k->type == JV_STR ? jx_dget(c, self, k->s, k->n) : NULL;
        return v ? v : d ? d : jv_new(c, JV_NONE);
    }
    default: jx_fail(c, line, "unknown function");
    }
#undef A
}

/* ---- tests ---- */

static const char *test_names[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number",
    "integer", "float", "boolean", "true", "false", "callable", "equalto", "eq", "==", "ne",
    "!=", "lt", "<", "le", "<=", "gt", ">", "ge", ">=", "in", "odd", "even", "divisibleby",
    "sameas", "lower", "upper", NULL};

int jx_is_test(const char *name)
{
    for (int i = 0; test_names[i]; i++)
        if (!strcmp(test_names[i], name))
            return 1;
    return 0;
}

static int cmp_test(jctx *c, const char *op, kvp_jv *v, kvp_jv *x, int line)
{
    static const struct { const char *a, *b; int bin; } ops[] = {
        {"lt", "<", B_LT}, {"le", "<=", B_LE}, {"gt", ">", B_GT}, {"ge", ">=", B_GE}};
    for (size_t i = 0; i < 4; i++)
        if (!strcmp(op, ops[i].a) || !strcmp(op, ops[i].b)) {
            jnode a = {.kind = N_LIT, .lit = v, .line = line}, b = {.kind = N_LIT, .lit = x, .line = line};
            jnode e = {.kind = N_BIN, .op = ops[i].bin, .a = &a, .b = &b, .line = line};
            return jv_truthy(jx_eval(c, NULL, &e));
        }
    return -1;
}

int jx_test(jctx *c, const char *name, kvp_jv *v, kvp_jv **args, int nargs, int line)
{
    kvp_jv *x = nargs ? args[0] : NULL;
    int t = (int)v->type;
    if (!jx_is_test(name))
        jx_fail(c, line, "unknown test '%s'", name);
    if (!strcmp(name, "defined")) return t != JV_UNDEF;
    if (!strcmp(name, "undefined")) return t == JV_UNDEF;
    if (!strcmp(name, "none")) return t == JV_NONE;
    if (!strcmp(name, "string")) return t == JV_STR;
    if (!strcmp(name, "mapping")) return t == JV_DICT;
    if (!strcmp(name, "iterable") || !strcmp(name, "sequence"))
        return t == JV_STR || t == JV_LIST || t == JV_DICT;
    if (!strcmp(name, "number")) return t == JV_INT || t == JV_FLOAT || t == JV_BOOL;
    if (!strcmp(name, "integer")) return t == JV_INT;
    if (!strcmp(name, "float")) return t == JV_FLOAT;
    if (!strcmp(name, "boolean")) return t == JV_BOOL;
    if (!strcmp(name, "true")) return t == JV_BOOL && v->i;
    if (!strcmp(name, "false")) return t == JV_BOOL && !v->i;
    if (!strcmp(name, "callable")) return t == JV_MACRO || t == JV_FUNC;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (t != JV_STR)
            return 0;
        kvp_jv *m = jx_casemap(c, v, name[0] == 'u');
        return !memcmp(m->s, v->s, v->n);
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (t != JV_INT && t != JV_BOOL)
            jx_fail(c, line, "test '%s' needs an integer", name);
        return (v->i % 2 == 0) == (name[0] == 'e');
    }
    if (!x)
        jx_fail(c, line, "test '%s' needs an argument", name);
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "=="))
        return jv_equal(c, v, x);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_equal(c, v, x);
    if (!strcmp(name, "sameas"))
        return v == x || (t == (int)x->type && (t == JV_NONE || t == JV_BOOL) && v->i == x->i);
    if (!strcmp(name, "in")) {
        jnode a = {.kind = N_LIT, .lit = v, .line = line}, b = {.kind = N_LIT, .lit = x, .line = line};
        jnode e = {.kind = N_BIN, .op = B_IN, .a = &a, .b = &b, .line = line};
        return jv_truthy(jx_eval(c, NULL, &e));
    }
    if (!strcmp(name, "divisibleby")) {
        if ((t != JV_INT && t != JV_BOOL) || (x->type != JV_INT && x->type != JV_BOOL))
            jx_fail(c, line, "test 'divisibleby' needs integers");
        if (!x->i)
            jx_fail(c, line, "test 'divisibleby': division by zero");
        return x->i == -1 || v->i % x->i == 0;     /* INT64_MIN % -1 traps in C */
    }
    int r = cmp_test(c, name, v, x, line);
    if (r >= 0)
        return r;
    jx_fail(c, line, "unknown test '%s'", name);
}
