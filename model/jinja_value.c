/* Values of the Jinja interpreter: the arena, constructors, Python's truth, equality and
 * str(), and transformers' tojson (json.dumps with ensure_ascii=False, insertion order,
 * optional indent). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja_impl.h"

#define DEFAULT_MEMORY ((size_t)64 << 20)
#define BLOCK (64 * 1024)

struct jblock {
    struct jblock *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

kvp_jarena *kvp_jarena_new(size_t max_memory)
{
    kvp_jarena *a = calloc(1, sizeof *a);
    if (a)
        a->max = max_memory ? max_memory : DEFAULT_MEMORY;
    return a;
}

void kvp_jarena_free(kvp_jarena *a)
{
    if (!a)
        return;
    for (struct jblock *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    free(a);
}

void *ja_alloc(kvp_jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (a->oom || n > a->max || a->used + n > a->max) {
        a->oom = 1;
        return NULL;
    }
    struct jblock *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > BLOCK ? n : BLOCK;
        b = malloc(sizeof *b + cap);
        if (!b) {
            a->oom = 1;
            return NULL;
        }
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

/* ---- public constructors ---- */

static kvp_jv *mk(kvp_jarena *a, enum jv_type t)
{
    kvp_jv *v = a ? ja_alloc(a, sizeof *v) : NULL;
    if (v)
        v->type = t;
    return v;
}

kvp_jv *kvp_jv_none(kvp_jarena *a) { return mk(a, JV_NONE); }
kvp_jv *kvp_jv_list(kvp_jarena *a) { return mk(a, JV_LIST); }
kvp_jv *kvp_jv_dict(kvp_jarena *a) { return mk(a, JV_DICT); }

kvp_jv *kvp_jv_bool(kvp_jarena *a, int b)
{
    kvp_jv *v = mk(a, JV_BOOL);
    if (v)
        v->i = !!b;
    return v;
}

kvp_jv *kvp_jv_int(kvp_jarena *a, long long i)
{
    kvp_jv *v = mk(a, JV_INT);
    if (v)
        v->i = i;
    return v;
}

kvp_jv *kvp_jv_float(kvp_jarena *a, double f)
{
    kvp_jv *v = mk(a, JV_FLOAT);
    if (v)
        v->f = f;
    return v;
}

static kvp_jv *mkstr(kvp_jarena *a, const char *s, size_t n, const unsigned char *taint,
                     int all)
{
    kvp_jv *v = mk(a, JV_STR);
    char *p = v ? ja_alloc(a, n + 1) : NULL;
    if (!p)
        return NULL;
    if (n)
        memcpy(p, s, n);
    v->s = p;
    v->n = n;
    if (n && (all || taint)) {
        unsigned char *t = ja_alloc(a, n);
        if (!t)
            return NULL;
        if (all)
            memset(t, 1, n);
        else
            memcpy(t, taint, n);
        v->taint = t;
    }
    return v;
}

kvp_jv *kvp_jv_str(kvp_jarena *a, const char *s, size_t n) { return mkstr(a, s, n, NULL, 1); }

kvp_jv *kvp_jv_str_trusted(kvp_jarena *a, const char *s, size_t n)
{
    return mkstr(a, s, n, NULL, 0);
}

static int grow(kvp_jarena *a, kvp_jv *c, int keys)
{
    if (c->len < c->cap)
        return 0;
    size_t cap = c->cap ? c->cap * 2 : 4;
    kvp_jv **v = ja_alloc(a, cap * sizeof *v);
    kvp_jv **k = keys ? ja_alloc(a, cap * sizeof *k) : NULL;
    if (!v || (keys && !k))
        return -1;
    if (c->len) {
        memcpy(v, c->v, c->len * sizeof *v);
        if (keys)
            memcpy(k, c->k, c->len * sizeof *k);
    }
    c->v = v;
    c->k = k;
    c->cap = cap;
    return 0;
}

int kvp_jv_append(kvp_jarena *a, kvp_jv *list, kvp_jv *v)
{
    if (!list || !v || list->type != JV_LIST || grow(a, list, 0))
        return -1;
    list->v[list->len++] = v;
    return 0;
}

kvp_jv *jv_dget(const kvp_jv *d, const char *key, size_t n)
{
    for (size_t i = 0; i < d->len; i++)
        if (d->k[i]->n == n && !memcmp(d->k[i]->s, key, n))
            return d->v[i];
    return NULL;
}

static int dset(kvp_jarena *a, kvp_jv *d, kvp_jv *key, kvp_jv *v)
{
    for (size_t i = 0; i < d->len; i++)
        if (d->k[i]->n == key->n && !memcmp(d->k[i]->s, key->s, key->n)) {
            d->v[i] = v;
            return 0;
        }
    if (grow(a, d, 1))
        return -1;
    d->k[d->len] = key;
    d->v[d->len++] = v;
    return 0;
}

int kvp_jv_set(kvp_jarena *a, kvp_jv *dict, const char *key, kvp_jv *v)
{
    if (!dict || !v || !key || dict->type != JV_DICT)
        return -1;
    kvp_jv *k = kvp_jv_str(a, key, strlen(key));
    return k ? dset(a, dict, k, v) : -1;
}

/* ---- internal constructors: failure unwinds ---- */

static void *must(jctx *c, void *p)
{
    if (!p)
        jx_fail(c, 0, "the template needs more than %zu bytes of memory", c->a->max);
    return p;
}

kvp_jv *jv_new(jctx *c, enum jv_type t) { return must(c, mk(c->a, t)); }

kvp_jv *jv_undef(jctx *c, const char *name)
{
    kvp_jv *v = jv_new(c, JV_UNDEF);
    v->s = name;
    return v;
}

kvp_jv *jv_strn(jctx *c, const char *s, size_t n, const unsigned char *taint, int all)
{
    return must(c, mkstr(c->a, s, n, taint, all));
}

kvp_jv *jv_cstr(jctx *c, const char *s) { return jv_strn(c, s, strlen(s), NULL, 0); }
kvp_jv *jv_bool(jctx *c, int b) { return must(c, kvp_jv_bool(c->a, b)); }
kvp_jv *jv_int(jctx *c, long long i)
{
    if (i >= 0 && i < 256)
        return c->small[i] ? c->small[i] : (c->small[i] = must(c, kvp_jv_int(c->a, i)));
    return must(c, kvp_jv_int(c->a, i));
}

void jv_push(jctx *c, kvp_jv *list, kvp_jv *v)
{
    if (kvp_jv_append(c->a, list, v))
        must(c, NULL);
}

kvp_jv *jx_dget(jctx *c, const kvp_jv *d, const char *key, size_t n)
{
    jx_scan(c, d->len * 16);
    return jv_dget(d, key, n);
}

void jv_dset(jctx *c, kvp_jv *d, kvp_jv *key, kvp_jv *v)
{
    jx_scan(c, d->len * 16);
    if (dset(c->a, d, key, v))
        must(c, NULL);
}

int jv_truthy(const kvp_jv *v)
{
    switch (v->type) {
    case JV_BOOL: case JV_INT: return v->i != 0;
    case JV_FLOAT: return v->f != 0;
    case JV_STR: return v->n != 0;
    case JV_LIST: case JV_DICT: return v->len != 0;
    case JV_MACRO: case JV_FUNC: case JV_LOOP: return 1;
    default: return 0;
    }
}

static int is_num(const kvp_jv *v)
{
    return v->type == JV_INT || v->type == JV_BOOL || v->type == JV_FLOAT;
}


/* Python's ==, where a namespace() is equal only to itself (it has no __eq__) and a
 * container is equal to itself without a look inside (Python compares items by identity
 * first). Each pair of containers compared is a step: values that share parts can have
 * exponentially many paths; nesting deeper than the value bound is an error. */
static int equal(jctx *c, const kvp_jv *a, const kvp_jv *b, int depth)
{
    if (is_num(a) && is_num(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT)
            return a->i == b->i;
        return jv_num_cmp(a, b) == 0;
    }
    if (a->type != b->type)
        return 0;
    if ((a->type == JV_LIST || a->type == JV_DICT) && (a == b || a->ns || b->ns))
        return a == b;
    if (a->type == JV_LIST || a->type == JV_DICT) {
        if (a->len != b->len)
            return 0;
        if (depth >= JV_MAX_NEST(c))
            jx_fail(c, 0, "a value nested deeper than %d", JV_MAX_NEST(c));
        jx_step(c, 0);
        jx_scan(c, a->len * 64);
    }
    switch (a->type) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR:
        if (a->n != b->n)
            return 0;
        jx_scan(c, a->n);
        return !memcmp(a->s, b->s, a->n);
    case JV_LIST:
        for (size_t i = 0; i < a->len; i++)
            if (!equal(c, a->v[i], b->v[i], depth + 1))
                return 0;
        return 1;
    case JV_DICT:
        for (size_t i = 0; i < a->len; i++) {
            kvp_jv *o = jx_dget(c, b, a->k[i]->s, a->k[i]->n);
            if (!o || !equal(c, a->v[i], o, depth + 1))
                return 0;
        }
        return 1;
    default: return a == b;
    }
}

int jv_equal(jctx *c, const kvp_jv *a, const kvp_jv *b) { return equal(c, a, b, 0); }

/* Compares two numbers exactly, as Python does (an int is not rounded to a double):
 * -1, 0, 1, or 2 when one is NaN. */
int jv_num_cmp(const kvp_jv *a, const kvp_jv *b)
{
    if (a->type != JV_FLOAT && b->type != JV_FLOAT)
        return (a->i > b->i) - (a->i < b->i);
    if (a->type == JV_FLOAT && b->type == JV_FLOAT)
        return isnan(a->f) || isnan(b->f) ? 2 : (a->f > b->f) - (a->f < b->f);
    int flip = a->type == JV_FLOAT;
    long long i = flip ? b->i : a->i;
    double f = flip ? a->f : b->f;
    int r;
    if (isnan(f))
        return 2;
    if (f >= 9223372036854775808.0)
        r = -1;
    else if (f < -9223372036854775808.0)
        r = 1;
    else {
        /* f is in int64's range: compare its integer part, then its fraction */
        double t = trunc(f);
        long long fi = (long long)t;
        r = i < fi ? -1 : i > fi ? 1 : f > t ? -1 : f < t ? 1 : 0;
    }
    return flip ? -r : r;
}

const char *jv_type_name(const kvp_jv *v)
{
    static const char *n[] = {"undefined", "none", "bool", "int", "float", "string", "list",
                              "dict", "macro", "function", "loop"};
    return n[v->type];
}

/* ---- output buffers ---- */

void jb_put(jctx *c, jbuf *b, const char *s, size_t n, const unsigned char *taint, int all)
{
    if (!n)
        return;
    if (b->n + n > c->lim.max_output)
        jx_fail(c, 0, "the output exceeds %zu bytes", c->lim.max_output);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = must(c, ja_alloc(c->a, cap));
        unsigned char *nt = must(c, ja_alloc(c->a, cap));
        if (b->n) {
            memcpy(ns, b->s, b->n);
            memcpy(nt, b->t, b->n);
        }
        b->s = ns;
        b->t = nt;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    if (all || taint) {
        if (all)
            memset(b->t + b->n, 1, n);
        else
            memcpy(b->t + b->n, taint, n);
        b->tainted = 1;
    }
    b->n += n;
    b->s[b->n] = 0;
}

static void put(jctx *c, jbuf *b, const char *s) { jb_put(c, b, s, strlen(s), NULL, 0); }

kvp_jv *jb_value(jctx *c, jbuf *b)
{
    return jv_strn(c, b->s ? b->s : "", b->n, b->tainted ? b->t : NULL, 0);
}

/* Python's repr of a float: the shortest digits that read back, exponent form below 1e-4
 * and from 1e16. */
static void put_float(jctx *c, jbuf *b, double f)
{
    char s[64];
    if (isnan(f)) {
        put(c, b, "nan");
        return;
    }
    if (isinf(f)) {
        put(c, b, f < 0 ? "-inf" : "inf");
        return;
    }
    int p = 1;
    for (; p < 17; p++) {
        snprintf(s, sizeof s, "%.*e", p - 1, f);
        if (strtod(s, NULL) == f)
            break;
    }
    snprintf(s, sizeof s, "%.*e", p - 1, f);
    char *e = strchr(s, 'e');
    int exp = atoi(e + 1);
    *e = 0;
    char digits[32];
    int nd = 0, neg = s[0] == '-';
    for (char *q = s + neg; *q; q++)
        if (*q != '.')
            digits[nd++] = *q;
    digits[nd] = 0;
    char o[96];
    int k = neg ? sprintf(o, "-") : 0;
    if (exp < -4 || exp >= 16) {
        k += sprintf(o + k, "%c", digits[0]);
        if (nd > 1)
            k += sprintf(o + k, ".%s", digits + 1);
        sprintf(o + k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        k += sprintf(o + k, "0.");
        for (int i = 0; i < -exp - 1; i++)
            o[k++] = '0';
        sprintf(o + k, "%s", digits);
    } else {
        for (int i = 0; i <= exp; i++)
            o[k++] = i < nd ? digits[i] : '0';
        o[k++] = '.';
        if (nd > exp + 1)
            sprintf(o + k, "%s", digits + exp + 1);
        else
            sprintf(o + k, "0");
    }
    put(c, b, o);
}

static void put_repr_str(jctx *c, jbuf *b, const kvp_jv *v)
{
    int dq = memchr(v->s, '\'', v->n) && !memchr(v->s, '"', v->n);
    put(c, b, dq ? "\"" : "'");
    for (size_t i = 0; i < v->n; i++) {
        unsigned char ch = (unsigned char)v->s[i];
        char e[8];
        const char *r = NULL;
        if (ch == '\\') r = "\\\\";
        else if (ch == '\n') r = "\\n";
        else if (ch == '\r') r = "\\r";
        else if (ch == '\t') r = "\\t";
        else if (ch == '\'' && !dq) r = "\\'";
        else if (ch < 0x20 || ch == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", ch);
            r = e;
        }
        if (r)
            jb_put(c, b, r, strlen(r), NULL, v->taint != NULL);
        else
            jb_put(c, b, v->s + i, 1, v->taint ? v->taint + i : NULL, 0);
    }
    put(c, b, dq ? "\"" : "'");
}

/* The containers being printed, outermost first: one met again inside itself prints
 * as Python's recursion guard prints it ([...], {...}). */
typedef struct pystack {
    const kvp_jv *v;
    const struct pystack *up;
    int depth;
} pystack;

static int on_stack(const pystack *st, const kvp_jv *v)
{
    for (; st; st = st->up)
        if (st->v == v)
            return 1;
    return 0;
}

/* Python's str() (repr inside containers). */
static void put_py(jctx *c, jbuf *b, const kvp_jv *v, int repr, const pystack *up)
{
    if ((v->type == JV_LIST || v->type == JV_DICT) && on_stack(up, v)) {
        put(c, b, v->type == JV_LIST ? "[...]" : v->ns ? "<Namespace {...}>" : "{...}");
        return;
    }
    pystack st = {v, up, up ? up->depth + 1 : 0};
    if ((v->type == JV_LIST || v->type == JV_DICT) && st.depth >= JV_MAX_NEST(c))
        jx_fail(c, 0, "a value nested deeper than %d", JV_MAX_NEST(c));
    switch (v->type) {
    case JV_UNDEF: break;
    case JV_NONE: put(c, b, "None"); break;
    case JV_BOOL: put(c, b, v->i ? "True" : "False"); break;
    case JV_INT: {
        char s[32];
        snprintf(s, sizeof s, "%lld", v->i);
        put(c, b, s);
        break;
    }
    case JV_FLOAT: put_float(c, b, v->f); break;
    case JV_STR:
        if (repr)
            put_repr_str(c, b, v);
        else
            jb_put(c, b, v->s, v->n, v->taint, 0);
        break;
    case JV_LIST:
        put(c, b, "[");
        for (size_t i = 0; i < v->len; i++) {
            if (i)
                put(c, b, ", ");
            put_py(c, b, v->v[i], 1, &st);
        }
        put(c, b, "]");
        break;
    case JV_DICT:
        put(c, b, v->ns ? "<Namespace {" : "{");
        for (size_t i = 0; i < v->len; i++) {
            if (i)
                put(c, b, ", ");
            put_py(c, b, v->k[i], 1, &st);
            put(c, b, ": ");
            put_py(c, b, v->v[i], 1, &st);
        }
        put(c, b, v->ns ? "}>" : "}");
        break;
    default: put(c, b, v->type == JV_MACRO ? "<macro>" : "<function>"); break;
    }
}

void jb_str(jctx *c, jbuf *b, const kvp_jv *v) { put_py(c, b, v, 0, NULL); }

kvp_jv *jv_to_str(jctx *c, const kvp_jv *v)
{
    if (v->type == JV_STR)
        return (kvp_jv *)v;
    jbuf b = {0};
    jb_str(c, &b, v);
    return jb_value(c, &b);
}

static void json_str(jctx *c, jbuf *b, const kvp_jv *v, int all)
{
    jb_put(c, b, "\"", 1, NULL, all);
    size_t from = 0;
    for (size_t i = 0; i < v->n; i++) {
        unsigned char ch = (unsigned char)v->s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        jb_put(c, b, v->s + from, i - from, v->taint ? v->taint + from : NULL, all);
        char e[8];
        switch (ch) {
        case '"': strcpy(e, "\\\""); break;
        case '\\': strcpy(e, "\\\\"); break;
        case '\n': strcpy(e, "\\n"); break;
        case '\r': strcpy(e, "\\r"); break;
        case '\t': strcpy(e, "\\t"); break;
        case '\b': strcpy(e, "\\b"); break;
        case '\f': strcpy(e, "\\f"); break;
        default: snprintf(e, sizeof e, "\\u%04x", ch); break;
        }
        jb_put(c, b, e, strlen(e), NULL, all || v->taint != NULL);
        from = i + 1;
    }
    jb_put(c, b, v->s + from, v->n - from, v->taint ? v->taint + from : NULL, all);
    jb_put(c, b, "\"", 1, NULL, all);
}

static void newline(jctx *c, jbuf *b, long long indent, int level, int all)
{
    jb_put(c, b, "\n", 1, NULL, all);
    for (long long i = 0; i < indent * level; i++)
        jb_put(c, b, " ", 1, NULL, all);
}

/* json.dumps(v, ensure_ascii=False, indent=indent or None). The JSON text of a value
 * that holds caller data is marked as the caller's: punctuation and keys alike. */
static void json_rec(jctx *c, jbuf *b, const kvp_jv *v, long long indent, int level, int all)
{
    if (level > c->lim.max_depth)
        jx_fail(c, 0, "tojson: a value nested deeper than %d", c->lim.max_depth);
    switch (v->type) {
    case JV_UNDEF: jx_fail(c, 0, "tojson: undefined value%s%s", v->s ? " " : "", v->s ? v->s : "");
    case JV_NONE: jb_put(c, b, "null", 4, NULL, all); break;
    case JV_BOOL: jb_put(c, b, v->i ? "true" : "false", v->i ? 4 : 5, NULL, all); break;
    case JV_INT: case JV_FLOAT: {
        if (v->type == JV_FLOAT && isnan(v->f)) {
            jb_put(c, b, "NaN", 3, NULL, all);
            break;
        }
        if (v->type == JV_FLOAT && isinf(v->f)) {
            const char *s = v->f < 0 ? "-Infinity" : "Infinity";
            jb_put(c, b, s, strlen(s), NULL, all);
            break;
        }
        jbuf t = {0};
        put_py(c, &t, v, 1, NULL);
        jb_put(c, b, t.s, t.n, NULL, all);
        break;
    }
    case JV_STR: json_str(c, b, v, all); break;
    case JV_LIST: case JV_DICT: {
        int dict = v->type == JV_DICT;
        if (v->ns)
            jx_fail(c, 0, "tojson: a namespace is not JSON serializable");
        jb_put(c, b, dict ? "{" : "[", 1, NULL, all);
        for (size_t i = 0; i < v->len; i++) {
            if (i)
                jb_put(c, b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2, NULL, all);
            if (indent >= 0)
                newline(c, b, indent, level + 1, all);
            if (dict) {
                json_str(c, b, v->k[i], all);
                jb_put(c, b, ": ", 2, NULL, all);
            }
            json_rec(c, b, v->v[i], indent, level + 1, all);
        }
        if (indent >= 0 && v->len)
            newline(c, b, indent, level, all);
        jb_put(c, b, dict ? "}" : "]", 1, NULL, all);
        break;
    }
    default: jx_fail(c, 0, "tojson: a %s is not JSON serializable", jv_type_name(v));
    }
}

/* The JSON text is rendered with each byte's own mark first; when some byte of it came
 * from the caller's data, all of it is marked as the caller's. */
void jb_json(jctx *c, jbuf *b, const kvp_jv *v, long long indent, int level)
{
    size_t start = b->n;
    int tainted = b->tainted;
    b->tainted = 0;
    json_rec(c, b, v, indent, level, 0);
    if (b->tainted)
        memset(b->t + start, 1, b->n - start);
    b->tainted |= tainted;
}

size_t *jv_cps(jctx *c, const kvp_jv *v, size_t *count)
{
    size_t *o = must(c, ja_alloc(c->a, (v->n + 1) * sizeof *o)), k = 0;
    for (size_t i = 0; i < v->n; i++)
        if (((unsigned char)v->s[i] & 0xc0) != 0x80)
            o[k++] = i;
    o[k] = v->n;
    *count = k;
    return o;
}

size_t jv_cp_count(jctx *c, const kvp_jv *v)
{
    size_t k = 0;
    jx_scan(c, v->n);
    for (size_t i = 0; i < v->n; i++)
        k += ((unsigned char)v->s[i] & 0xc0) != 0x80;
    return k;
}

kvp_jv *jv_cp_at(jctx *c, const kvp_jv *v, long long i)
{
    if (i < 0) {
        long long n = (long long)jv_cp_count(c, v);
        if (i < -n)
            return NULL;
        i += n;
    }
    jx_scan(c, v->n);
    size_t at = 0;
    for (long long k = 0;; at++) {         /* at: the start of code point k */
        if (at >= v->n)
            return NULL;
        if (((unsigned char)v->s[at] & 0xc0) != 0x80 && k++ == i)
            break;
    }
    size_t to = at + 1;
    while (to < v->n && ((unsigned char)v->s[to] & 0xc0) == 0x80)
        to++;
    return jv_sub(c, v, at, to);
}

kvp_jv *jv_sub(jctx *c, const kvp_jv *v, size_t from, size_t to)
{
    return jv_strn(c, v->s + from, to - from, v->taint ? v->taint + from : NULL, 0);
}

/* The code point at s[at] is white space as Python's str.isspace says; *len its bytes. */
int jv_is_space_at(const char *s, size_t n, size_t at, size_t *len)
{
    unsigned char b = (unsigned char)s[at];
    *len = 1;
    if (b < 0x80)
        return (b >= 0x09 && b <= 0x0d) || (b >= 0x1c && b <= 0x20);
    unsigned cp;
    if ((b & 0xe0) == 0xc0 && at + 1 < n) {
        cp = (unsigned)(b & 0x1f) << 6 | ((unsigned char)s[at + 1] & 0x3f);
        *len = 2;
    } else if ((b & 0xf0) == 0xe0 && at + 2 < n) {
        cp = (unsigned)(b & 0x0f) << 12 | ((unsigned)((unsigned char)s[at + 1] & 0x3f) << 6) |
             ((unsigned char)s[at + 2] & 0x3f);
        *len = 3;
    } else {
        return 0;
    }
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}
