/* The schema compiler's structure (model/schema.h): keywords, $ref, anyOf, objects,
 * arrays, any value, and the entry points. Each schema a document uses is a rule, made
 * once per schema node and called from every place it appears, so a $ref back to a
 * schema being compiled is recursion through the matcher's stack. */
#include "model/schema_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sc_fail(sc *c, const char *fmt, ...)
{
    if (c->err[0])
        return -1;   /* the first error stands */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < c->errlen)
        snprintf(c->err + n, c->errlen - (size_t)n, " at %s", c->path[0] ? c->path : "/");
    return -1;
}

/* The message of a builder's failure (model/grammar.h), naming the bound passed. */
static void size_fail(sc *c, int rc)
{
    if (rc == -E2BIG)
        sc_fail(c, "the schema is too large: its grammar is over %d states",
                KVP_GRAMMAR_MAX_STATES);
    else if (rc == -EFBIG)
        sc_fail(c, "the schema is too large: its grammar is over %d arcs", KVP_GRAMMAR_MAX_ARCS);
    else if (rc == -EMLINK)
        sc_fail(c, "the schema is too large: a state of its grammar has over %d arcs",
                KVP_GRAMMAR_MAX_FANOUT);
    else
        sc_fail(c, "out of memory");
}

int sc_state(sc *c)
{
    int s = kvp_gbuild_state(c->b);
    if (s < 0)
        size_fail(c, kvp_gbuild_failed(c->b));
    return s;
}

int sc_literal(sc *c, int from, int to, const char *s, size_t len)
{
    if (len == 0) {
        kvp_gbuild_eps(c->b, from, to);
        return 0;
    }
    int at = len > 1 ? kvp_gbuild_literal(c->b, from, s, len - 1) : from;
    if (at < 0)
        return sc_fail(c, "the schema is too large");
    kvp_gbuild_range(c->b, at, (uint8_t)s[len - 1], (uint8_t)s[len - 1], to);
    return 0;
}

int sc_ws(sc *c, int from, int to)
{
    if (c->ws < 0) {
        /* "" | " " | "\n" [ \t]{0,20} */
        int s = sc_state(c), sp = sc_state(c), nl = sc_state(c);
        if (nl < 0)
            return -1;
        kvp_gbuild_end(c->b, s);
        kvp_gbuild_end(c->b, sp);
        kvp_gbuild_end(c->b, nl);
        kvp_gbuild_range(c->b, s, ' ', ' ', sp);
        kvp_gbuild_range(c->b, s, '\n', '\n', nl);
        int at = nl;
        for (int i = 0; i < 20; i++) {
            int n = sc_state(c);
            if (n < 0)
                return -1;
            kvp_gbuild_end(c->b, n);
            kvp_gbuild_range(c->b, at, ' ', ' ', n);
            kvp_gbuild_range(c->b, at, '\t', '\t', n);
            at = n;
        }
        c->ws = s;
    }
    kvp_gbuild_call(c->b, from, c->ws, to);
    return 0;
}

static int rule(sc *c, const json_t *s, int *start);

/* Pushes "/key" onto the path; returns the old length to restore. */
static size_t path_push(sc *c, const char *key)
{
    size_t n = strlen(c->path);
    snprintf(c->path + n, sizeof c->path - n, "/%s", key);
    return n;
}

static int call_schema(sc *c, const json_t *s, const char *key, int from, int to)
{
    size_t mark = path_push(c, key);
    int start, rc = rule(c, s, &start);
    c->path[mark] = '\0';
    if (rc < 0)
        return -1;
    kvp_gbuild_call(c->b, from, start, to);
    return 0;
}

/* "{" ws ( "}" | KV ( "," ws KV )* "}" ), KV = string ws ":" ws value ws, value the
 * rule at `value`. */
static int map_object(sc *c, int from, int to, int value)
{
    int o = sc_state(c), k = sc_state(c), q = sc_state(c), q2 = sc_state(c), q3 = sc_state(c),
        q4 = sc_state(c), q5 = sc_state(c), q6 = sc_state(c), q7 = sc_state(c), q8 = sc_state(c);
    if (q8 < 0)
        return -1;
    kvp_gbuild_range(c->b, from, '{', '{', o);
    sc_ws(c, o, q8);
    kvp_gbuild_range(c->b, q8, '}', '}', to);
    kvp_gbuild_eps(c->b, q8, k);
    kvp_gbuild_range(c->b, k, '"', '"', q);
    if (sc_char(c, q, q) < 0)   /* the key's text */
        return -1;
    kvp_gbuild_range(c->b, q, '"', '"', q2);
    sc_ws(c, q2, q3);
    kvp_gbuild_range(c->b, q3, ':', ':', q4);
    sc_ws(c, q4, q5);
    kvp_gbuild_call(c->b, q5, value, q6);
    sc_ws(c, q6, q7);
    kvp_gbuild_range(c->b, q7, '}', '}', to);
    int q9 = sc_state(c);
    if (q9 < 0)
        return -1;
    kvp_gbuild_range(c->b, q7, ',', ',', q9);
    sc_ws(c, q9, k);
    return 0;
}

/* Any JSON value (arrays and objects nest through the matcher's stack). */
static int any_value(sc *c, int *start)
{
    if (c->any >= 0) {
        *start = c->any;
        return 0;
    }
    int v = sc_state(c), end = sc_state(c);
    if (end < 0)
        return -1;
    c->any = v;
    *start = v;
    kvp_gbuild_end(c->b, end);
    static const char *const lit[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++)
        if (sc_literal(c, v, end, lit[i], strlen(lit[i])) < 0)
            return -1;
    json_t *str = json_pack("{s:s}", "type", "string"), *num = json_pack("{s:s}", "type", "number");
    int rc = !str || !num ? sc_fail(c, "out of memory")
             : sc_string(c, str, v, end) < 0 || sc_number(c, num, v, end) < 0 ? -1 : 0;
    json_decref(str);
    json_decref(num);
    if (rc < 0)
        return -1;
    /* "[" ws ( "]" | value ws ( "," ws value ws )* "]" ) */
    int a = sc_state(c), a1 = sc_state(c), a2 = sc_state(c), a3 = sc_state(c), a4 = sc_state(c),
        a5 = sc_state(c);
    if (a5 < 0)
        return -1;
    kvp_gbuild_range(c->b, v, '[', '[', a);
    sc_ws(c, a, a1);
    kvp_gbuild_range(c->b, a1, ']', ']', end);
    kvp_gbuild_call(c->b, a1, v, a2);
    sc_ws(c, a2, a3);
    kvp_gbuild_range(c->b, a3, ']', ']', end);
    kvp_gbuild_range(c->b, a3, ',', ',', a4);
    sc_ws(c, a4, a5);
    kvp_gbuild_call(c->b, a5, v, a2);
    return map_object(c, v, end, v);
}

static int is_annotation(const char *k)
{
    static const char *const a[] = {"title", "description", "default", "examples", "$schema",
                                    "$id", "$comment", "deprecated", "readOnly", "writeOnly",
                                    "$defs", "definitions"};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if (!strcmp(k, a[i]))
            return 1;
    return 0;
}

static int known(const char *k)
{
    static const char *const a[] = {"type", "properties", "required", "additionalProperties",
                                    "items", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                                    "minLength", "maxLength", "pattern", "minItems", "maxItems",
                                    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if (!strcmp(k, a[i]))
            return 1;
    return is_annotation(k);
}

/* The literal of a JSON value as the grammar writes it (compact). */
static int value_literal(sc *c, const json_t *v, int from, int to)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s)
        return sc_fail(c, "out of memory");
    int rc = sc_literal(c, from, to, s, strlen(s));
    free(s);
    return rc;
}

typedef struct lit {
    char *s;
    size_t len;
} lit;

static int cmp_lit(const void *a, const void *b)
{
    const lit *x = a, *y = b;
    int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* An enum's values as one trie of their compact literals: values that share a prefix
 * share its states, so the matcher follows one thread through them however many values
 * start alike (apart, more than KVP_GRAMMAR_MAX_THREADS of them would crowd some out). */
static int enum_trie(sc *c, const json_t *values, int from, int to)
{
    size_t n = json_array_size(values), maxlen = 0;
    lit *l = calloc(n, sizeof *l);
    int rc = l ? 0 : sc_fail(c, "out of memory");
    for (size_t i = 0; i < n && rc == 0; i++) {
        l[i].s = json_dumps(json_array_get(values, i), JSON_COMPACT | JSON_ENCODE_ANY);
        if (!l[i].s)
            rc = sc_fail(c, "out of memory");
        else if ((l[i].len = strlen(l[i].s)) > maxlen)
            maxlen = l[i].len;
    }
    int *path = rc == 0 ? malloc((maxlen + 1) * sizeof *path) : NULL;
    if (rc == 0 && !path)
        rc = sc_fail(c, "out of memory");
    if (rc == 0) {
        qsort(l, n, sizeof *l, cmp_lit);
        /* path[k]: the state after the first k bytes of the previous value */
        path[0] = from;
        for (size_t i = 0; i < n && rc == 0; i++) {
            size_t k = 0;
            if (i > 0)
                while (k < l[i].len && k < l[i - 1].len && l[i].s[k] == l[i - 1].s[k])
                    k++;
            for (; k < l[i].len; k++) {
                int st = sc_state(c);
                if (st < 0) {
                    rc = -1;
                    break;
                }
                kvp_gbuild_range(c->b, path[k], (uint8_t)l[i].s[k], (uint8_t)l[i].s[k], st);
                path[k + 1] = st;
            }
            if (rc == 0 && (i + 1 == n || cmp_lit(&l[i], &l[i + 1])))   /* once per value */
                kvp_gbuild_eps(c->b, path[l[i].len], to);
        }
    }
    for (size_t i = 0; l && i < n; i++)
        free(l[i].s);
    free(l);
    free(path);
    return rc;
}

/* The schema "#/a/b" (or "#") points to, as a JSON pointer into c->root. */
static const json_t *resolve(sc *c, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const json_t *at = c->root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        p++;
        char key[256];
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1'))
                ch = *++p == '0' ? '~' : '/';
            else if (ch == '%')
                return NULL;
            if (n + 1 >= sizeof key)
                return NULL;
            key[n++] = ch;
        }
        key[n] = '\0';
        if (json_is_object(at))
            at = json_object_get(at, key);
        else if (json_is_array(at)) {
            char *e;
            long i = strtol(key, &e, 10);
            at = *e || n == 0 ? NULL : json_array_get(at, (size_t)i);
        } else
            at = NULL;
    }
    return *p ? NULL : at;
}

/* ---- oneOf: written only when its alternatives cannot both hold ---- */

enum { K_NULL = 1, K_BOOL = 2, K_NUM = 4, K_STR = 8, K_ARR = 16, K_OBJ = 32, K_ALL = 63 };

/* The schema s refers to through $ref (s itself without one; NULL when it points out). */
static const json_t *deref(sc *c, const json_t *s)
{
    for (int i = 0; i < KVP_SCHEMA_MAX_DEPTH && json_is_object(s); i++) {
        const json_t *r = json_object_get(s, "$ref");
        if (!r)
            return s;
        s = json_is_string(r) ? resolve(c, json_string_value(r)) : NULL;
    }
    return json_is_object(s) && !json_object_get(s, "$ref") ? s : NULL;
}

static unsigned value_kind(const json_t *v)
{
    return json_is_null(v) ? K_NULL : json_is_boolean(v) ? K_BOOL : json_is_number(v) ? K_NUM
           : json_is_string(v) ? K_STR : json_is_array(v) ? K_ARR : K_OBJ;
}

static unsigned type_kind(const char *t)
{
    static const char *const n[] = {"null", "boolean", "integer", "number", "string", "array",
                                    "object"};
    static const unsigned k[] = {K_NULL, K_BOOL, K_NUM, K_NUM, K_STR, K_ARR, K_OBJ};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, n[i]))
            return k[i];
    return K_ALL;
}

static const char *implied_type(const json_t *s);

/* The kinds of JSON value s may hold (more, never fewer); *budget bounds the schemas
 * looked at (past it: any kind). */
static unsigned kinds(sc *c, const json_t *s, int depth, int *budget)
{
    if (json_is_false(s))
        return 0;
    s = deref(c, s);
    if (!s || depth > KVP_SCHEMA_MAX_DEPTH || --*budget < 0)
        return K_ALL;
    const json_t *v;
    size_t i;
    const json_t *e;
    unsigned k = 0;
    static const char *const alts[] = {"anyOf", "oneOf", "allOf"};
    for (int a = 0; a < 3; a++)
        if ((v = json_object_get(s, alts[a])) && json_is_array(v)) {
            json_array_foreach(v, i, e)
                k |= kinds(c, e, depth + 1, budget);
            return k;
        }
    if ((v = json_object_get(s, "const")))
        return value_kind(v);
    if ((v = json_object_get(s, "enum")) && json_is_array(v)) {
        json_array_foreach(v, i, e)
            k |= value_kind(e);
        return k;
    }
    v = json_object_get(s, "type");
    if (json_is_string(v))
        return type_kind(json_string_value(v));
    if (json_is_array(v)) {
        json_array_foreach(v, i, e)
            k |= json_is_string(e) ? type_kind(json_string_value(e)) : K_ALL;
        return k;
    }
    const char *t = implied_type(s);
    return t ? type_kind(t) : K_ALL;
}

/* The values s allows when it is a const or an enum (an array, or a const alone), else
 * NULL; *one holds the const. */
static const json_t *values_of(const json_t *s, const json_t **one, size_t *n)
{
    const json_t *v;
    if (!json_is_object(s))
        return NULL;
    if ((v = json_object_get(s, "const"))) {
        *one = v;
        *n = 1;
        return v;
    }
    if ((v = json_object_get(s, "enum")) && json_is_array(v)) {
        *n = json_array_size(v);
        return v;
    }
    return NULL;
}

static const json_t *value_at(const json_t *set, const json_t *one, size_t i)
{
    return one ? one : json_array_get(set, i);
}

/* Whether no value is in both sets: scalars compared as a validator does (1 and 1.0 are
 * one number); an array or object is taken as possibly equal to any of its kind. */
static int values_apart(const json_t *a, const json_t *a1, size_t na, const json_t *b,
                        const json_t *b1, size_t nb)
{
    if (na * nb > 65536)
        return 0;
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < nb; j++) {
            const json_t *x = value_at(a, a1, i), *y = value_at(b, b1, j);
            unsigned kx = value_kind(x), ky = value_kind(y);
            if (kx != ky)
                continue;
            if (kx == K_NUM) {
                if (json_is_integer(x) && json_is_integer(y)
                        ? json_integer_value(x) == json_integer_value(y)
                        : json_number_value(x) == json_number_value(y))
                    return 0;
            } else if (kx == K_ARR || kx == K_OBJ || json_equal((json_t *)x, (json_t *)y))
                return 0;
        }
    return 1;
}

/* Whether one document can never hold under both a and b: their kinds are apart, or
 * their const/enum values, or both are objects requiring a property whose const/enum
 * values are apart (a tag). */
static int apart(sc *c, const json_t *a, const json_t *b, unsigned ka, unsigned kb)
{
    if (!(ka & kb))
        return 1;
    a = deref(c, a);
    b = deref(c, b);
    if (!a || !b)
        return 0;
    const json_t *a1 = NULL, *b1 = NULL;
    size_t na = 0, nb = 0;
    const json_t *va = values_of(a, &a1, &na), *vb = values_of(b, &b1, &nb);
    if (va && vb)
        return values_apart(va, a1, na, vb, b1, nb);
    if (ka != K_OBJ || kb != K_OBJ)
        return 0;
    const json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    const json_t *ra = json_object_get(a, "required"), *rb = json_object_get(b, "required");
    size_t i, j;
    const json_t *x, *y;
    json_array_foreach(ra, i, x)
        json_array_foreach(rb, j, y) {
            if (!json_is_string(x) || !json_is_string(y) ||
                strcmp(json_string_value(x), json_string_value(y)))
                continue;
            const json_t *sa = deref(c, json_object_get(pa, json_string_value(x)));
            const json_t *sb = deref(c, json_object_get(pb, json_string_value(x)));
            const json_t *ta = NULL, *tb = NULL;
            size_t ma = 0, mb = 0;
            const json_t *wa = values_of(sa, &ta, &ma), *wb = values_of(sb, &tb, &mb);
            if (wa && wb && values_apart(wa, ta, ma, wb, tb, mb))
                return 1;
        }
    return 0;
}

/* oneOf holds when exactly one alternative does; the grammar writes any alternative's
 * documents, so it takes a oneOf only when no two alternatives can hold at once. */
static int one_of_apart(sc *c, const json_t *alts)
{
    size_t n = json_array_size(alts);
    unsigned *k = malloc((n ? n : 1) * sizeof *k);
    if (!k)
        return sc_fail(c, "out of memory");
    int budget = 100000;
    for (size_t i = 0; i < n; i++)
        k[i] = kinds(c, json_array_get(alts, i), 0, &budget);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        for (size_t j = i + 1; j < n && rc == 0; j++)
            if (!apart(c, json_array_get(alts, i), json_array_get(alts, j), k[i], k[j]))
                rc = sc_fail(c, "oneOf: alternatives %zu and %zu may both hold for one "
                             "document (kvpd takes a oneOf whose alternatives differ in type, "
                             "in const/enum values, or in a required property's const/enum; "
                             "else use anyOf)", i, j);
    free(k);
    return rc;
}

static int object(sc *c, const json_t *s, int from, int to)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return sc_fail(c, "properties must be an object");
    if (req && !json_is_array(req))
        return sc_fail(c, "required must be an array of property names");
    if (add && !json_is_boolean(add) && !json_is_object(add))
        return sc_fail(c, "additionalProperties must be a boolean or a schema");
    size_t n = props ? json_object_size(props) : 0;
    size_t i;
    const json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_is_string(r))
            return sc_fail(c, "required must be an array of property names");
        if (!props || !json_object_get(props, json_string_value(r)))
            return sc_fail(c, "required names \"%s\", which properties does not list "
                           "(kvpd writes only the listed properties)", json_string_value(r));
    }
    c->container++;
    int rc;
    if (n == 0 && !json_is_false(add)) {
        /* no properties: a map of any keys to the additionalProperties schema */
        int value;
        size_t mark = path_push(c, "additionalProperties");
        rc = json_is_object(add) ? rule(c, add, &value) : any_value(c, &value);
        c->path[mark] = '\0';
        rc = rc < 0 ? -1 : map_object(c, from, to, value);
        c->container--;
        return rc;
    }
    /* Q[i][e]: before property i, e: one was written (a comma comes first) */
    int open = sc_state(c), close = sc_state(c);
    int *q = malloc((n + 1) * 2 * sizeof *q);
    if (!q || close < 0) {
        free(q);
        return sc_fail(c, "out of memory");
    }
    for (size_t k = 0; k < (n + 1) * 2; k++)
        if ((q[k] = sc_state(c)) < 0) {
            free(q);
            return -1;
        }
    kvp_gbuild_range(c->b, from, '{', '{', open);
    sc_ws(c, open, q[0]);
    kvp_gbuild_eps(c->b, q[2 * n], close);
    kvp_gbuild_eps(c->b, q[2 * n + 1], close);
    kvp_gbuild_range(c->b, close, '}', '}', to);
    const char *key;
    const json_t *ps;
    size_t k = 0;
    rc = 0;
    json_object_foreach((json_t *)props, key, ps) {
        int required = 0;
        json_array_foreach(req, i, r)
            required |= !strcmp(json_string_value(r), key);
        int kv = sc_state(c), comma = sc_state(c), s1 = sc_state(c), s2 = sc_state(c),
            s3 = sc_state(c), s4 = sc_state(c), s5 = sc_state(c);
        if (s5 < 0) {
            rc = -1;
            break;
        }
        kvp_gbuild_eps(c->b, q[2 * k], kv);
        kvp_gbuild_range(c->b, q[2 * k + 1], ',', ',', comma);
        sc_ws(c, comma, kv);
        json_t *ks = json_string(key);
        rc = ks ? value_literal(c, ks, kv, s1) : sc_fail(c, "out of memory");
        json_decref(ks);
        if (rc < 0)
            break;
        sc_ws(c, s1, s2);
        kvp_gbuild_range(c->b, s2, ':', ':', s3);
        sc_ws(c, s3, s4);
        size_t mark = path_push(c, "properties");
        rc = call_schema(c, ps, key, s4, s5);
        c->path[mark] = '\0';
        if (rc < 0)
            break;
        sc_ws(c, s5, q[2 * (k + 1) + 1]);
        if (!required) {
            kvp_gbuild_eps(c->b, q[2 * k], q[2 * (k + 1)]);
            kvp_gbuild_eps(c->b, q[2 * k + 1], q[2 * (k + 1) + 1]);
        }
        k++;
    }
    free(q);
    c->container--;
    return rc;
}

int sc_count(sc *c, const json_t *s, const char *key, long dflt, long *out)
{
    const json_t *v = json_object_get(s, key);
    *out = dflt;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return sc_fail(c, "%s must be a non-negative integer", key);
    if (json_integer_value(v) > KVP_SCHEMA_MAX_REPEAT)
        return sc_fail(c, "%s above %d is not supported", key, KVP_SCHEMA_MAX_REPEAT);
    *out = (long)json_integer_value(v);
    return 0;
}

static int array(sc *c, const json_t *s, int from, int to)
{
    long lo, hi;
    if (sc_count(c, s, "minItems", 0, &lo) < 0 || sc_count(c, s, "maxItems", -1, &hi) < 0)
        return -1;
    if (hi >= 0 && lo > hi)
        return sc_fail(c, "minItems is above maxItems: no array fits");
    const json_t *items = json_object_get(s, "items");
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return sc_fail(c, "items must be a schema (tuples, prefixItems, are not supported)");
    if (json_is_false(items) && lo > 0)
        return sc_fail(c, "items is false but minItems is above 0");
    c->container++;
    int item = -1;
    if (json_is_false(items))
        hi = 0;
    else {
        size_t mark = path_push(c, "items");
        int rc = items && !json_is_true(items) ? rule(c, items, &item) : any_value(c, &item);
        c->path[mark] = '\0';
        if (rc < 0) {
            c->container--;
            return -1;
        }
    }
    /* after k items (w[k], before "," or "]"); the loop state repeats past lo */
    int open = sc_state(c), first = sc_state(c);
    if (first < 0)
        goto fail;
    kvp_gbuild_range(c->b, from, '[', '[', open);
    sc_ws(c, open, first);
    if (lo == 0)
        kvp_gbuild_range(c->b, first, ']', ']', to);
    long unroll = hi >= 0 ? hi : (lo > 1 ? lo : 1);
    int prev = first;   /* where the next item starts */
    for (long k = 1; k <= unroll; k++) {
        int after = sc_state(c), w = sc_state(c);
        if (w < 0)
            goto fail;
        kvp_gbuild_call(c->b, prev, item, after);
        sc_ws(c, after, w);
        if (k >= lo)
            kvp_gbuild_range(c->b, w, ']', ']', to);
        if (k < unroll || hi < 0) {
            int comma = sc_state(c), next = sc_state(c);
            if (next < 0)
                goto fail;
            kvp_gbuild_range(c->b, w, ',', ',', comma);
            sc_ws(c, comma, next);
            if (k == unroll)   /* unbounded: the next item leads back here */
                kvp_gbuild_call(c->b, next, item, after);
            prev = next;
        }
    }
    c->container--;
    return 0;
fail:
    c->container--;
    return -1;
}

static int typed(sc *c, const json_t *s, const char *type, int from, int to)
{
    if (!strcmp(type, "null"))
        return sc_literal(c, from, to, "null", 4);
    if (!strcmp(type, "boolean"))
        return sc_literal(c, from, to, "true", 4) < 0 ? -1 : sc_literal(c, from, to, "false", 5);
    if (!strcmp(type, "string"))
        return sc_string(c, s, from, to);
    if (!strcmp(type, "integer"))
        return sc_integer(c, s, from, to);
    if (!strcmp(type, "number"))
        return sc_number(c, s, from, to);
    if (!strcmp(type, "object"))
        return object(c, s, from, to);
    if (!strcmp(type, "array"))
        return array(c, s, from, to);
    return sc_fail(c, "type \"%s\" is not a JSON Schema type", type);
}

/* The type a schema without `type` has by its keywords, or NULL (any value). */
static const char *implied_type(const json_t *s)
{
    static const char *const k[][2] = {
        {"properties", "object"}, {"required", "object"}, {"additionalProperties", "object"},
        {"items", "array"}, {"minItems", "array"}, {"maxItems", "array"},
        {"minLength", "string"}, {"maxLength", "string"}, {"pattern", "string"},
        {"minimum", "number"}, {"maximum", "number"}, {"exclusiveMinimum", "number"},
        {"exclusiveMaximum", "number"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (json_object_get(s, k[i][0]))
            return k[i][1];
    return NULL;
}

/* The only keywords beside `key` are annotations. */
static int alone(sc *c, const json_t *s, const char *key)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
        if (strcmp(k, key) && !is_annotation(k))
            return sc_fail(c, "%s beside %s is not supported", k, key);
    return 0;
}

static int body(sc *c, const json_t *s, int from, int to)
{
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        int any;
        if (any_value(c, &any) < 0)
            return -1;
        kvp_gbuild_call(c->b, from, any, to);
        return 0;
    }
    if (json_is_false(s))
        return sc_fail(c, "the schema false allows no value");
    if (!json_is_object(s))
        return sc_fail(c, "a schema must be an object or a boolean");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
        if (!known(k))
            return sc_fail(c, "%s is not supported", k);
    if ((v = json_object_get(s, "$ref"))) {
        if (alone(c, s, "$ref") < 0)
            return -1;
        const json_t *t = json_is_string(v) ? resolve(c, json_string_value(v)) : NULL;
        if (!t)
            return sc_fail(c, "$ref \"%s\" does not point into this schema",
                           json_is_string(v) ? json_string_value(v) : "?");
        return call_schema(c, t, "$ref", from, to);
    }
    static const char *const alts[] = {"anyOf", "oneOf", "allOf"};
    for (int a = 0; a < 3; a++) {
        if (!(v = json_object_get(s, alts[a])))
            continue;
        if (alone(c, s, alts[a]) < 0)
            return -1;
        if (!json_is_array(v) || json_array_size(v) == 0)
            return sc_fail(c, "%s must be a non-empty array of schemas", alts[a]);
        if (a == 2 && json_array_size(v) != 1)
            return sc_fail(c, "allOf of more than one schema is not supported");
        if (json_array_size(v) > KVP_SCHEMA_MAX_ALTERNATIVES)
            return sc_fail(c, "%s has %zu schemas, over the limit of %d", alts[a],
                           json_array_size(v), KVP_SCHEMA_MAX_ALTERNATIVES);
        if (a == 1) {
            size_t mark = path_push(c, "oneOf");
            int rc = one_of_apart(c, v);
            c->path[mark] = '\0';
            if (rc < 0)
                return -1;
        }
        size_t i;
        const json_t *alt;
        size_t mark = path_push(c, alts[a]);
        json_array_foreach(v, i, alt) {
            char idx[24];
            snprintf(idx, sizeof idx, "%zu", i);
            if (call_schema(c, alt, idx, from, to) < 0)
                return -1;
        }
        c->path[mark] = '\0';
        return 0;
    }
    if ((v = json_object_get(s, "const")))
        return value_literal(c, v, from, to);
    if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return sc_fail(c, "enum must be a non-empty array");
        if (json_array_size(v) > KVP_SCHEMA_MAX_ALTERNATIVES)
            return sc_fail(c, "enum has %zu values, over the limit of %d", json_array_size(v),
                           KVP_SCHEMA_MAX_ALTERNATIVES);
        return enum_trie(c, v, from, to);
    }
    const json_t *type = json_object_get(s, "type");
    if (!type) {
        const char *t = implied_type(s);
        if (t)
            return typed(c, s, t, from, to);
        int any;
        if (any_value(c, &any) < 0)
            return -1;
        kvp_gbuild_call(c->b, from, any, to);
        return 0;
    }
    if (json_is_string(type))
        return typed(c, s, json_string_value(type), from, to);
    if (!json_is_array(type) || json_array_size(type) == 0)
        return sc_fail(c, "type must be a type name or a non-empty list of them");
    size_t i;
    const json_t *t;
    json_array_foreach(type, i, t) {
        if (!json_is_string(t))
            return sc_fail(c, "type must be a type name or a non-empty list of them");
        if (typed(c, s, json_string_value(t), from, to) < 0)
            return -1;
    }
    return 0;
}

/* The rule of schema s: made once, called wherever s is used. */
static int rule(sc *c, const json_t *s, int *start)
{
    for (int i = 0; i < c->n_rules; i++)
        if (c->rules[i].node == s) {
            if (c->rules[i].busy && c->rules[i].container == c->container)
                return sc_fail(c, "$ref: a schema refers to itself outside any object or "
                               "array (it could never be written)");
            *start = c->rules[i].start;
            return 0;
        }
    if (++c->depth > KVP_SCHEMA_MAX_DEPTH) {
        c->depth--;
        return sc_fail(c, "the schema nests deeper than %d", KVP_SCHEMA_MAX_DEPTH);
    }
    if (c->n_rules == c->cap_rules) {
        int cap = c->cap_rules ? c->cap_rules * 2 : 32;
        sc_rule *r = realloc(c->rules, (size_t)cap * sizeof *r);
        if (!r)
            return sc_fail(c, "out of memory");
        c->rules = r;
        c->cap_rules = cap;
    }
    int st = sc_state(c), end = sc_state(c);
    if (end < 0)
        return -1;
    kvp_gbuild_end(c->b, end);
    int me = c->n_rules++;
    c->rules[me] = (sc_rule){s, st, 1, c->container};
    int rc = body(c, s, st, end);
    c->rules[me].busy = 0;
    c->depth--;
    *start = st;
    return rc;
}

static void sc_init(sc *c, const json_t *root, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->root = root;
    c->err = err;
    c->errlen = errlen;
    c->ws = c->any = -1;
    err[0] = '\0';
    c->b = kvp_gbuild_new();
    if (!c->b)
        snprintf(err, errlen, "out of memory");
}

static kvp_grammar *sc_done(sc *c, int start, int ok)
{
    free(c->rules);
    if (!ok || !c->b) {
        kvp_gbuild_free(c->b);
        return NULL;
    }
    int rc;
    kvp_grammar *g = kvp_grammar_finish(c->b, start, &rc);
    if (!g && rc == -ENOENT)
        snprintf(c->err, c->errlen, "the schema has no finite document (a required property "
                 "that must hold itself, at any depth)");
    else if (!g)
        size_fail(c, rc);
    return g;
}

static int size_ok(sc *c, const json_t *s)
{
    size_t n = json_dumpb(s, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);
    if (n > KVP_SCHEMA_MAX_BYTES)
        return sc_fail(c, "the schema is %zu bytes, over the limit of %d", n,
                       KVP_SCHEMA_MAX_BYTES);
    return 0;
}

kvp_grammar *kvp_schema_compile(const json_t *schema, char *err, size_t errlen)
{
    sc c;
    sc_init(&c, schema, err, errlen);
    int start = -1;
    int ok = c.b && size_ok(&c, schema) == 0 && rule(&c, schema, &start) == 0;
    return sc_done(&c, start, ok);
}

kvp_grammar *kvp_schema_any_object(char *err, size_t errlen)
{
    json_t *s = json_pack("{s:s}", "type", "object");
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    kvp_grammar *g = kvp_schema_compile(s, err, errlen);
    json_decref(s);
    return g;
}

/* Between two tokens of a call's frame: bounded whitespace, or (fixed) exactly lit. */
static void frame_gap(sc *c, int fixed, int from, int to, const char *lit)
{
    if (!fixed)
        sc_ws(c, from, to);
    else if (*lit)
        sc_literal(c, from, to, lit, strlen(lit));
    else
        kvp_gbuild_eps(c->b, from, to);
}

/* The rule `prefix CALL suffix` for one of fns[0..n) into *out; 1 when made. fixed: the
 * frame around the arguments is spaced as kvp_toolcall_write writes it. */
static int calls_rule(sc *c, const kvp_schema_fn *fns, int n, const char *prefix,
                      const char *args_key, const char *suffix, int fixed, int *out)
{
    char *err = c->err;
    size_t errlen = c->errlen;
    int start = c->b ? sc_state(c) : -1, end = c->b ? sc_state(c) : -1, body_s = -1,
        after = -1;
    int ok = end >= 0 && n > 0;
    if (n <= 0)
        snprintf(err, errlen, "no function to call");
    json_t *key = json_string(args_key);
    ok = ok && key;
    if (ok) {
        body_s = sc_state(c);
        after = sc_state(c);
        kvp_gbuild_end(c->b, end);
        ok = after >= 0 &&
             sc_literal(c, start, body_s, prefix ? prefix : "", prefix ? strlen(prefix) : 0) == 0 &&
             sc_literal(c, after, end, suffix ? suffix : "", suffix ? strlen(suffix) : 0) == 0;
    }
    for (int i = 0; ok && i < n; i++) {
        const json_t *params = fns[i].parameters;
        json_t *any = params ? NULL : json_pack("{s:s}", "type", "object");
        c->root = params ? params : any;
        snprintf(c->path, sizeof c->path, "/%s", fns[i].name ? fns[i].name : "?");
        int s[12];
        for (int k = 0; k < 12 && ok; k++)
            ok = (s[k] = sc_state(c)) >= 0;
        json_t *name = json_string(fns[i].name ? fns[i].name : "");
        ok = ok && name && c->root && size_ok(c, c->root) == 0;
        if (ok) {
            /* { "name" : NAME , ARGS_KEY : ARGS } */
            kvp_gbuild_range(c->b, body_s, '{', '{', s[0]);
            frame_gap(c, fixed, s[0], s[1], "");
            ok = sc_literal(c, s[1], s[2], "\"name\"", 6) == 0;
            frame_gap(c, fixed, s[2], s[3], "");
            kvp_gbuild_range(c->b, s[3], ':', ':', s[4]);
            frame_gap(c, fixed, s[4], s[5], " ");
            ok = ok && value_literal(c, name, s[5], s[6]) == 0;
            frame_gap(c, fixed, s[6], s[7], "");
            kvp_gbuild_range(c->b, s[7], ',', ',', s[8]);
            frame_gap(c, fixed, s[8], s[9], " ");
            ok = ok && value_literal(c, key, s[9], s[10]) == 0;
            int s11 = sc_state(c), s12 = sc_state(c), s13 = sc_state(c), rs;
            ok = ok && s13 >= 0;
            if (ok) {
                frame_gap(c, fixed, s[10], s[11], "");
                kvp_gbuild_range(c->b, s[11], ':', ':', s11);
                frame_gap(c, fixed, s11, s12, " ");
                ok = rule(c, c->root, &rs) == 0;
            }
            if (ok) {
                kvp_gbuild_call(c->b, s12, rs, s13);
                int s14 = sc_state(c);
                ok = s14 >= 0;
                if (ok) {
                    frame_gap(c, fixed, s13, s14, "");
                    kvp_gbuild_range(c->b, s14, '}', '}', after);
                }
            }
        }
        json_decref(name);
        json_decref(any);   /* its rule's memo entry is dropped below: nodes may repeat */
        for (int r = 0; r < c->n_rules; r++)
            if (c->rules[r].node == any)
                c->rules[r].node = NULL;
    }
    json_decref(key);
    *out = start;
    return ok && !err[0];
}

kvp_grammar *kvp_schema_compile_call_list(const kvp_schema_fn *fns, int n, const char *prefix,
                                          const char *suffix, const char *between,
                                          int max_calls, char *err, size_t errlen)
{
    sc c;
    sc_init(&c, NULL, err, errlen);
    int call = -1, root = -1;
    int ok = c.b && calls_rule(&c, fns, n, prefix, "arguments", suffix, 0, &call);
    if (ok && (max_calls < 1 || max_calls > 64)) {
        snprintf(err, errlen, "max_calls must be 1 to 64");
        ok = 0;
    }
    ok = ok && (root = sc_state(&c)) >= 0;
    for (int k = 1, at = root; ok && k <= max_calls; k++) {
        int after = sc_state(&c), next = sc_state(&c);
        if (!(ok = next >= 0))
            break;
        kvp_gbuild_call(c.b, at, call, after);
        kvp_gbuild_end(c.b, after);
        if (k < max_calls)
            ok = sc_literal(&c, after, next, between ? between : "",
                            between ? strlen(between) : 0) == 0;
        at = next;
    }
    return sc_done(&c, root, ok && !err[0]);
}

kvp_grammar *kvp_schema_compile_calls(const kvp_schema_fn *fns, int n, const char *prefix,
                                      const char *suffix, char *err, size_t errlen)
{
    return kvp_schema_compile_call_list(fns, n, prefix, suffix, NULL, 1, err, errlen);
}

kvp_grammar *kvp_schema_compile_calls_as(const kvp_schema_fn *fns, int n, const char *prefix,
                                         const char *args_key, const char *suffix, char *err,
                                         size_t errlen)
{
    sc c;
    sc_init(&c, NULL, err, errlen);
    int call = -1;
    if (!args_key || !*args_key) {
        snprintf(err, errlen, "no key for the arguments");
        return sc_done(&c, -1, 0);
    }
    int ok = c.b && calls_rule(&c, fns, n, prefix, args_key, suffix, 1, &call);
    return sc_done(&c, call, ok && !err[0]);
}
