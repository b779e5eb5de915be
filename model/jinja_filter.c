/* The Jinja interpreter's filters, as Jinja 3 defines them, with transformers' tojson
 * (json.dumps with ensure_ascii=False, no key sorting, indent). An unknown filter is an
 * error naming it. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja_impl.h"

/* attribute "a.b.0" of x: dict keys and list indexes; undefined when missing */
static kvp_jv *path(jctx *c, kvp_jv *x, const kvp_jv *attr)
{
    const char *s = attr->s, *end = attr->s + attr->n;
    while (s <= end) {
        const char *dot = memchr(s, '.', (size_t)(end - s));
        size_t n = dot ? (size_t)(dot - s) : (size_t)(end - s);
        if (x->type == JV_DICT) {
            x = jx_dget(c, x, s, n);
        } else if (x->type == JV_LIST && n && n < 20 && strspn(s, "0123456789") >= n) {
            char num[24];
            memcpy(num, s, n);
            num[n] = 0;
            size_t i = (size_t)strtoull(num, NULL, 10);
            x = i < x->len ? x->v[i] : NULL;
        } else {
            x = NULL;
        }
        if (!x)
            return jv_undef(c, NULL);
        if (!dot)
            break;
        s = dot + 1;
    }
    return x;
}

/* select/reject(test, args...) and selectattr/rejectattr(attr, test, args...) */
static kvp_jv *select_items(jctx *c, kvp_jv *seq, kvp_jv **args, int nargs, int by_attr, int keep,
                      const char *fname, int line)
{
    seq = jx_list_of(c, seq, fname, line);
    kvp_jv *attr = NULL;
    if (by_attr) {
        if (!nargs || args[0]->type != JV_STR)
            jx_fail(c, line, "%s needs an attribute name", fname);
        attr = args[0];
        args++;
        nargs--;
    }
    const char *test = NULL;
    if (nargs) {
        if (args[0]->type != JV_STR)
            jx_fail(c, line, "%s needs a test name", fname);
        test = args[0]->s;
        if (!jx_is_test(test))
            jx_fail(c, line, "unknown test '%s'", test);
    }
    kvp_jv *l = jv_new(c, JV_LIST);
    for (size_t i = 0; i < seq->len; i++) {
        jx_step(c, line);
        kvp_jv *x = attr ? path(c, seq->v[i], attr) : seq->v[i];
        int ok = test ? jx_test(c, test, x, args + 1, nargs - 1, line) : jv_truthy(x);
        if (ok == keep)
            jv_push(c, l, seq->v[i]);
    }
    return l;
}

/* The text of a string without Python's leading and trailing white space, in a new
 * NUL-terminated buffer. */
static char *stripped(jctx *c, const kvp_jv *v)
{
    kvp_jv *t = jx_strip(c, (kvp_jv *)v, NULL, 1, 1);
    return (char *)t->s;
}

/* Python's int(s): optional sign, decimal digits with single underscores between them.
 * 1 with *out set; 0 when s is not such a number; fails when it does not fit. */
static int parse_int(jctx *c, const char *s, long long *out, int line)
{
    int neg = *s == '-';
    if (*s == '-' || *s == '+')
        s++;
    if (!(*s >= '0' && *s <= '9'))
        return 0;
    unsigned long long m = 0, lim = neg ? 9223372036854775808ULL : 9223372036854775807ULL;
    int big = 0;
    for (; *s; s++) {
        if (*s == '_') {
            if (!(s[1] >= '0' && s[1] <= '9'))
                return 0;
            continue;
        }
        if (!(*s >= '0' && *s <= '9'))
            return 0;
        unsigned d = (unsigned)(*s - '0');
        if (m > (lim - d) / 10)
            big = 1;
        else
            m = m * 10 + d;
    }
    if (big)
        jx_fail(c, line, "integer overflow in int: the value leaves the 64-bit range");
    *out = neg ? (long long)(0ULL - m) : (long long)m;
    return 1;
}

/* Python's float(s): what strtod reads, without C's hexadecimal forms, with single
 * underscores between digits. */
static int parse_float(jctx *c, const char *s, double *out)
{
    size_t n = strlen(s);
    char *buf = ja_alloc(c->a, n + 1), *end;
    if (!buf)
        jx_fail(c, 0, "the template needs more than %zu bytes of memory", c->a->max);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == 'x' || s[i] == 'X' || s[i] == 'p' || s[i] == 'P')
            return 0;
        if (s[i] == '_') {
            int dl = i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9';
            int dr = s[i + 1] >= '0' && s[i + 1] <= '9';
            if (!dl || !dr)
                return 0;
            continue;
        }
        buf[k++] = s[i];
    }
    buf[k] = 0;
    if (!k)
        return 0;
    *out = strtod(buf, &end);
    return *end == 0;
}

/* A float (not NaN) as an int, truncated; infinity cannot be, a value beyond int64 is
 * an overflow. */
static long long float_to_int(jctx *c, double f, int line)
{
    if (isinf(f))
        jx_fail(c, line, "int: cannot convert float infinity to integer");
    if (f >= 9223372036854775808.0 || f < -9223372036854775808.0)
        jx_fail(c, line, "integer overflow in int: the value leaves the 64-bit range");
    return (long long)f;
}

/* Jinja's int filter: int(s) for a string, else int(float(s)); a string that is neither
 * (or a NaN or an infinity), or a NaN float, gives the default. */
static kvp_jv *to_int(jctx *c, kvp_jv *v, kvp_jv *def, int line)
{
    if (v->type == JV_INT)
        return v;
    if (v->type == JV_BOOL)
        return jv_int(c, v->i);
    if (v->type == JV_FLOAT && !isnan(v->f))
        return jv_int(c, float_to_int(c, v->f, line));
    if (v->type == JV_STR && !memchr(v->s, 0, v->n)) {
        const char *s = stripped(c, v);
        long long i;
        double f;
        if (parse_int(c, s, &i, line))
            return jv_int(c, i);
        if (parse_float(c, s, &f) && isfinite(f))
            return jv_int(c, float_to_int(c, f, line));
    }
    return def ? def : jv_int(c, 0);
}

static kvp_jv *to_float(jctx *c, kvp_jv *v, kvp_jv *def)
{
    kvp_jv *r = jv_new(c, JV_FLOAT);
    if (v->type == JV_FLOAT)
        return v;
    if (v->type == JV_INT || v->type == JV_BOOL) {
        r->f = (double)v->i;
        return r;
    }
    if (v->type == JV_STR && !memchr(v->s, 0, v->n) && parse_float(c, stripped(c, v), &r->f))
        return r;
    if (def)
        return def;
    r->f = 0;
    return r;
}

/* Jinja's indent(width=4, first=False, blank=False): every line after the first (and the
 * first with first=True) gets the indentation; blank lines only with blank=True. */
static kvp_jv *indent(jctx *c, kvp_jv *v, kvp_jv *w, int first, int blank, int line)
{
    jbuf ind = {0};
    if (!w || w->type == JV_INT) {
        long long n = w ? w->i : 4;
        for (long long i = 0; i < n; i++)     /* the output bound stops a huge width */
            jb_put(c, &ind, " ", 1, NULL, 0);
    } else {
        jx_need_str(c, w, "indent", line);
        jb_put(c, &ind, w->s, w->n, w->taint, 0);
    }
    jbuf o = {0};
    size_t from = 0;
    for (int ln = 0; from <= v->n; ln++) {
        const char *nl = memchr(v->s + from, '\n', v->n - from);
        size_t to = nl ? (size_t)(nl - v->s) : v->n;
        if (ln)
            jb_put(c, &o, "\n", 1, NULL, 0);
        if ((ln || first) && (to > from || blank))
            jb_put(c, &o, ind.s, ind.n, ind.tainted ? ind.t : NULL, 0);
        jb_put(c, &o, v->s + from, to - from, v->taint ? v->taint + from : NULL, 0);
        if (!nl)
            break;
        from = to + 1;
    }
    return jb_value(c, &o);
}

static kvp_jv *map(jctx *c, jscope *s, kvp_jv *seq, kvp_jv **args, int nargs,
                   const char **kwn, kvp_jv **kwv, int nkw, int line)
{
    seq = jx_list_of(c, seq, "map", line);
    kvp_jv *attr = jx_arg(args, 0, kwn, kwv, nkw, 0, "attribute");
    kvp_jv *def = jx_arg(args, 0, kwn, kwv, nkw, 0, "default");
    kvp_jv *l = jv_new(c, JV_LIST);
    if (!attr && (!nargs || args[0]->type != JV_STR))
        jx_fail(c, line, "map needs a filter name or attribute=");
    for (size_t i = 0; i < seq->len; i++) {
        jx_step(c, line);
        kvp_jv *x;
        if (attr) {
            x = path(c, seq->v[i], jv_to_str(c, attr));
            if (x->type == JV_UNDEF && def)
                x = def;
        } else {
            x = jx_filter(c, s, args[0]->s, seq->v[i], args + 1, nargs - 1, NULL, NULL, 0, line);
        }
        jv_push(c, l, x);
    }
    return l;
}

static int is(const char *a, const char *b) { return !strcmp(a, b); }

kvp_jv *jx_filter(jctx *c, jscope *s, const char *name, kvp_jv *v, kvp_jv **args, int nargs,
                  const char **kwn, kvp_jv **kwv, int nkw, int line)
{
#define A(i, n) jx_arg(args, nargs, kwn, kwv, nkw, i, n)
    if (is(name, "default") || is(name, "d")) {
        kvp_jv *def = A(0, "default_value"), *boolean = A(1, "boolean");
        int use = v->type == JV_UNDEF || (boolean && jv_truthy(boolean) && !jv_truthy(v));
        return use ? (def ? def : jv_cstr(c, "")) : v;
    }
    if (is(name, "safe"))
        return v;
    if (is(name, "string"))
        return jv_to_str(c, v);
    if (is(name, "tojson")) {
        kvp_jv *ind = A(0, "indent");
        if (ind && ind->type != JV_INT && ind->type != JV_NONE)
            jx_fail(c, line, "tojson: indent must be an integer");
        jbuf o = {0};
        /* an indent past the output bound fails at the first newline, as any wider one */
        long long w = !ind || ind->type != JV_INT ? -1 : ind->i < 0 ? 0
                      : (unsigned long long)ind->i > c->lim.max_output ? (long long)c->lim.max_output + 1
                                                                        : ind->i;
        jb_json(c, &o, v, w, 0);
        return jb_value(c, &o);
    }
    if (is(name, "length") || is(name, "count")) {
        if (v->type == JV_STR)
            return jv_int(c, (long long)jv_cp_count(c, v));
        if (v->type == JV_LIST || v->type == JV_DICT)
            return jv_int(c, (long long)v->len);
        if (v->type == JV_UNDEF)
            return jv_int(c, 0);
        jx_fail(c, line, "a %s has no length", jv_type_name(v));
    }
    if (is(name, "list"))
        return jx_list_of(c, v, "list", line);
    if (is(name, "first") || is(name, "last")) {
        kvp_jv *l = jx_list_of(c, v, name, line);
        return l->len ? l->v[name[0] == 'f' ? 0 : l->len - 1] : jv_undef(c, NULL);
    }
    if (is(name, "reverse")) {
        kvp_jv *l = jx_list_of(c, v, "reverse", line), *r = jv_new(c, JV_LIST);
        for (size_t i = l->len; i-- > 0;)
            jv_push(c, r, l->v[i]);
        if (v->type != JV_STR)
            return r;
        return jx_join(c, r, NULL, NULL, line);
    }
    if (is(name, "join")) {
        kvp_jv *sep = A(0, "d"), *attr = A(1, "attribute");
        if (sep)
            jx_need_str(c, sep, "join", line);
        return jx_join(c, v, sep, attr ? jv_to_str(c, attr) : NULL, line);
    }
    if (is(name, "items")) {
        if (v->type == JV_UNDEF)
            return jv_new(c, JV_LIST);
        if (v->type != JV_DICT)
            jx_fail(c, line, "items needs a dict, not %s", jv_type_name(v));
        return jx_pairs(c, v, 0);
    }
    if (is(name, "selectattr") || is(name, "rejectattr"))
        return select_items(c, v, args, nargs, 1, name[0] == 's', name, line);
    if (is(name, "select") || is(name, "reject"))
        return select_items(c, v, args, nargs, 0, name[0] == 's', name, line);
    if (is(name, "map"))
        return map(c, s, v, args, nargs, kwn, kwv, nkw, line);
    if (is(name, "int"))
        return to_int(c, v, A(0, "default"), line);
    if (is(name, "float"))
        return to_float(c, v, A(0, "default"));
    if (is(name, "abs")) {
        if (v->type == JV_INT && v->i == INT64_MIN)
            jx_fail(c, line, "integer overflow in abs: the result leaves the 64-bit range");
        if (v->type == JV_INT || v->type == JV_BOOL)
            return v->i < 0 ? jv_int(c, -v->i) : v->type == JV_BOOL ? jv_int(c, v->i) : v;
        if (v->type == JV_FLOAT) {
            kvp_jv *r = jv_new(c, JV_FLOAT);
            r->f = v->f < 0 ? -v->f : v->f;
            return r;
        }
        jx_fail(c, line, "abs needs a number");
    }
    /* string filters */
    int str_filter = is(name, "trim") || is(name, "upper") || is(name, "lower") ||
                     is(name, "title") || is(name, "capitalize") || is(name, "replace") ||
                     is(name, "indent");
    if (!str_filter)
        jx_fail(c, line, "unknown filter '%s'", name);
    if (v->type == JV_UNDEF && !is(name, "replace"))
        v = jv_cstr(c, "");
    v = jv_to_str(c, v);
    if (is(name, "trim"))
        return jx_strip(c, v, A(0, "chars"), 1, 1);
    if (is(name, "upper"))
        return jx_casemap(c, v, 1);
    if (is(name, "lower"))
        return jx_casemap(c, v, 0);
    if (is(name, "title"))
        return jx_casemap(c, v, 4);
    if (is(name, "capitalize"))
        return jx_casemap(c, v, 3);
    if (is(name, "indent")) {
        kvp_jv *f = A(1, "first"), *b = A(2, "blank");
        return indent(c, v, A(0, "width"), f && jv_truthy(f), b && jv_truthy(b), line);
    }
    kvp_jv *n = A(2, "count");
    return jx_replace(c, v, jv_to_str(c, A(0, "old") ?: jv_cstr(c, "")),
                      jv_to_str(c, A(1, "new") ?: jv_cstr(c, "")),
                      n && n->type == JV_INT ? n->i : -1, line);
#undef A
}
