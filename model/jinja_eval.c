/* The Jinja evaluator: expressions to values, statements to output, as Jinja 3 runs them
 * (Python semantics for operators; undefined values print as "" and fail in arithmetic
 * and attribute access). A for loop's body has its own scope (a `set` inside it does not
 * leak out: namespace() objects carry state across); if blocks do not. */
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja_impl.h"

#define DEFAULT_OUTPUT ((size_t)8 << 20)
#define DEFAULT_STEPS 1000000L
#define DEFAULT_DEPTH 64

enum { RUN_OK, RUN_BREAK, RUN_CONTINUE };

void jx_fail(jctx *c, int line, const char *fmt, ...)
{
    if (c->errlen) {
        int k = snprintf(c->err, c->errlen, "line %d: ", line ? line : c->line);
        va_list ap;
        va_start(ap, fmt);
        if (k >= 0 && (size_t)k < c->errlen)
            vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    longjmp(c->jb, 1);
}

void jx_step(jctx *c, int line)
{
    if (++c->steps > c->lim.max_steps)
        jx_fail(c, line, "the template runs more than %ld steps (loop iterations, calls, "
                "comparisons, scans)", c->lim.max_steps);
}

/* A scan inside one step costs steps too: one per 4 KiB of text, or per 64 items
 * (units: a byte is 1, an item 64). */
void jx_scan(jctx *c, size_t units)
{
    c->scan += units;
    if (c->scan < 4096)
        return;
    size_t k = c->scan / 4096;
    c->scan %= 4096;
    if (k > (size_t)(c->lim.max_steps - c->steps))
        c->steps = c->lim.max_steps;
    else
        c->steps += (long)k;
    jx_step(c, 0);
}

static jscope *scope_new(jctx *c, jscope *parent)
{
    jscope *s = ja_alloc(c->a, sizeof *s);
    if (!s)
        jx_fail(c, 0, "the template needs more than %zu bytes of memory", c->a->max);
    s->parent = parent;
    s->vars = jv_new(c, JV_DICT);
    return s;
}

static kvp_jv *lookup(jctx *c, jscope *s, const char *name)
{
    size_t n = strlen(name);
    for (; s; s = s->parent) {
        kvp_jv *v = jx_dget(c, s->vars, name, n);
        if (v)
            return v;
    }
    kvp_jv *g = jx_global(c, name);
    return g ? g : jv_undef(c, name);
}

static void assign(jctx *c, jscope *s, const char *name, kvp_jv *v)
{
    kvp_jv *d = s->vars;
    size_t n = strlen(name);
    jx_scan(c, d->len * 16);
    for (size_t i = 0; i < d->len; i++)     /* rebinding allocates nothing */
        if (d->k[i]->n == n && !memcmp(d->k[i]->s, name, n)) {
            d->v[i] = v;
            return;
        }
    jv_dset(c, d, jv_cstr(c, name), v);
}

__attribute__((noreturn))
static void undefined_error(jctx *c, const kvp_jv *v, int line)
{
    if (v->s)
        jx_fail(c, line, "'%s' is undefined", v->s);
    jx_fail(c, line, "a value is undefined");
}

static int is_num(const kvp_jv *v)
{
    return v->type == JV_INT || v->type == JV_BOOL || v->type == JV_FLOAT;
}

static double num(const kvp_jv *v) { return v->type == JV_FLOAT ? v->f : (double)v->i; }

/* Integers are 64-bit: an operation whose exact result does not fit is an error (Python
 * would give a bigger integer; the template gets no silently wrong number). */
__attribute__((noreturn))
static void int_overflow(jctx *c, const char *op, int line)
{
    jx_fail(c, line, "integer overflow in %s: the result leaves the 64-bit range", op);
}

/* Python's floor division and modulo of integers (y != 0). */
static long long int_fdiv(jctx *c, long long x, long long y, int mod, int line)
{
    if (y == -1) {
        if (!mod && x == INT64_MIN)
            int_overflow(c, "//", line);
        return mod ? 0 : -x;
    }
    long long q = x / y, r = x % y;
    if (r && ((r < 0) != (y < 0))) {
        q--;
        r += y;
    }
    return mod ? r : q;
}

/* x ** y for y >= 0, exactly. */
static long long int_pow(jctx *c, long long x, long long y, int line)
{
    if (x == 0 || x == 1)
        return y == 0 ? 1 : x;
    if (x == -1)
        return y % 2 ? -1 : 1;
    if (y >= 64)                    /* |x| >= 2: at least 2**64 */
        int_overflow(c, "**", line);
    long long r = 1;
    for (long long i = 0; i < y; i++)
        if (__builtin_mul_overflow(r, x, &r))
            int_overflow(c, "**", line);
    return r;
}

/* Python's float floor division and modulo (float_divmod): the remainder takes the
 * divisor's sign, the quotient is exact for large operands. */
static double float_fdiv(double a, double b, int mod)
{
    double m = fmod(a, b), q = (a - m) / b;
    if (m != 0) {
        if ((b < 0) != (m < 0)) {
            m += b;
            q -= 1;
        }
    } else {
        m = copysign(0, b);
    }
    if (mod)
        return m;
    if (q != 0) {
        double f = floor(q);
        return q - f > 0.5 ? f + 1 : f;
    }
    return copysign(0, a / b);
}

static double float_pow(jctx *c, double a, double b, int line)
{
    if (a == 0 && b < 0)
        jx_fail(c, line, "division by zero: 0.0 cannot be raised to a negative power");
    if (a < 0 && isfinite(b) && b != floor(b))
        jx_fail(c, line, "a negative number to a fractional power is a complex number");
    double r = pow(a, b);
    if (isinf(r) && isfinite(a) && isfinite(b))
        jx_fail(c, line, "float overflow in **: the result is out of range");
    return r;
}

static kvp_jv *jfloat(jctx *c, double f)
{
    kvp_jv *v = jv_new(c, JV_FLOAT);
    v->f = f;
    return v;
}

static kvp_jv *concat2(jctx *c, const kvp_jv *a, const kvp_jv *b)
{
    jbuf o = {0};
    jb_put(c, &o, a->s, a->n, a->taint, 0);
    jb_put(c, &o, b->s, b->n, b->taint, 0);
    return jb_value(c, &o);
}

static kvp_jv *repeat(jctx *c, const kvp_jv *seq, long long k, int line)
{
    size_t unit = seq->type == JV_STR ? seq->n : seq->len;
    if (k <= 0 || unit == 0)        /* nothing to repeat: done at once, whatever k is */
        return seq->type == JV_STR ? jv_cstr(c, "") : jv_new(c, JV_LIST);
    if ((unsigned long long)k > c->lim.max_output / unit)
        jx_fail(c, line, "a repetition longer than %zu", c->lim.max_output);
    if (seq->type == JV_STR) {
        jbuf o = {0};
        for (long long i = 0; i < k; i++)
            jb_put(c, &o, seq->s, seq->n, seq->taint, 0);
        return jb_value(c, &o);
    }
    kvp_jv *l = jv_new(c, JV_LIST);
    for (long long i = 0; i < k; i++)
        for (size_t j = 0; j < seq->len; j++)
            jv_push(c, l, seq->v[j]);
    return l;
}

static int compare(jctx *c, const kvp_jv *a, const kvp_jv *b, int line)
{
    if (is_num(a) && is_num(b))
        return jv_num_cmp(a, b);
    if (a->type == JV_STR && b->type == JV_STR) {
        size_t n = a->n < b->n ? a->n : b->n;
        int r = memcmp(a->s, b->s, n);
        return r ? (r > 0) - (r < 0) : (a->n > b->n) - (a->n < b->n);
    }
    if (a->type == JV_UNDEF)
        undefined_error(c, a, line);
    if (b->type == JV_UNDEF)
        undefined_error(c, b, line);
    jx_fail(c, line, "cannot compare a %s with a %s", jv_type_name(a), jv_type_name(b));
}

static int contains(jctx *c, const kvp_jv *hay, const kvp_jv *x, int line)
{
    switch (hay->type) {
    case JV_STR:
        if (x->type != JV_STR)
            jx_fail(c, line, "'in <string>' needs a string on the left, not a %s",
                    jv_type_name(x));
        jx_scan(c, hay->n);
        return x->n == 0 || memmem(hay->s, hay->n, x->s, x->n) != NULL;
    case JV_LIST:
        jx_scan(c, hay->len * 64);
        for (size_t i = 0; i < hay->len; i++)
            if (jv_equal(c, hay->v[i], x))
                return 1;
        return 0;
    case JV_DICT:
        return x->type == JV_STR && jx_dget(c, hay, x->s, x->n) != NULL;
    case JV_UNDEF:
        return 0;
    default:
        jx_fail(c, line, "a %s is not a container ('in')", jv_type_name(hay));
    }
}

static kvp_jv *binop(jctx *c, int op, kvp_jv *a, kvp_jv *b, int line)
{
    switch (op) {
    case B_EQ: return jv_bool(c, jv_equal(c, a, b));
    case B_NE: return jv_bool(c, !jv_equal(c, a, b));
    case B_LT: case B_LE: case B_GT: case B_GE: {
        int r = compare(c, a, b, line);     /* 2: a NaN, and every order is false */
        return jv_bool(c, r != 2 && (op == B_LT ? r < 0 : op == B_LE ? r <= 0
                                     : op == B_GT ? r > 0 : r >= 0));
    }
    case B_IN: return jv_bool(c, contains(c, b, a, line));
    case B_NOTIN: return jv_bool(c, !contains(c, b, a, line));
    case B_CAT: return concat2(c, jv_to_str(c, a), jv_to_str(c, b));
    default: break;
    }
    if (a->type == JV_UNDEF)
        undefined_error(c, a, line);
    if (b->type == JV_UNDEF)
        undefined_error(c, b, line);
    if (is_num(a) && is_num(b)) {
        int flt = a->type == JV_FLOAT || b->type == JV_FLOAT;
        long long x = a->i, y = b->i, r;
        switch (op) {
        case B_ADD:
            if (flt)
                return jfloat(c, num(a) + num(b));
            if (__builtin_add_overflow(x, y, &r))
                int_overflow(c, "+", line);
            return jv_int(c, r);
        case B_SUB:
            if (flt)
                return jfloat(c, num(a) - num(b));
            if (__builtin_sub_overflow(x, y, &r))
                int_overflow(c, "-", line);
            return jv_int(c, r);
        case B_MUL:
            if (flt)
                return jfloat(c, num(a) * num(b));
            if (__builtin_mul_overflow(x, y, &r))
                int_overflow(c, "*", line);
            return jv_int(c, r);
        case B_DIV:
            if (num(b) == 0)
                jx_fail(c, line, "division by zero");
            return jfloat(c, num(a) / num(b));
        case B_FDIV: case B_MOD:
            if (num(b) == 0)
                jx_fail(c, line, "division by zero");
            if (flt)
                return jfloat(c, float_fdiv(num(a), num(b), op == B_MOD));
            return jv_int(c, int_fdiv(c, x, y, op == B_MOD, line));
        case B_POW:
            if (!flt && y >= 0)
                return jv_int(c, int_pow(c, x, y, line));
            return jfloat(c, float_pow(c, num(a), num(b), line));
        default: break;
        }
    }
    if (op == B_ADD && a->type == JV_STR && b->type == JV_STR)
        return concat2(c, a, b);
    if (op == B_ADD && a->type == JV_LIST && b->type == JV_LIST) {
        kvp_jv *l = jv_new(c, JV_LIST);
        for (size_t i = 0; i < a->len; i++)
            jv_push(c, l, a->v[i]);
        for (size_t i = 0; i < b->len; i++)
            jv_push(c, l, b->v[i]);
        return l;
    }
    if (op == B_MUL && (a->type == JV_STR || a->type == JV_LIST) &&
        (b->type == JV_INT || b->type == JV_BOOL))
        return repeat(c, a, b->i, line);
    if (op == B_MUL && (b->type == JV_STR || b->type == JV_LIST) &&
        (a->type == JV_INT || a->type == JV_BOOL))
        return repeat(c, b, a->i, line);
    static const char *names[] = {"+", "-", "*", "/", "//", "%", "**"};
    jx_fail(c, line, "unsupported operand types for %s: %s and %s", names[op],
            jv_type_name(a), jv_type_name(b));
}

/* Python's index of a sequence of n: negative counts from the end; -1 when out of range. */
static long long norm_index(long long i, size_t n)
{
    if (i < 0)
        i += (long long)n;
    return i < 0 || i >= (long long)n ? -1 : i;
}

static kvp_jv *item(jctx *c, kvp_jv *o, kvp_jv *k, int line)
{
    switch (o->type) {
    case JV_DICT: {
        if (k->type != JV_STR)
            return jv_undef(c, NULL);
        kvp_jv *v = jx_dget(c, o, k->s, k->n);
        return v ? v : jv_undef(c, NULL);
    }
    case JV_LIST: case JV_STR: {
        if (k->type != JV_INT && k->type != JV_BOOL)
            return o->type == JV_STR ? (jx_method(c, o, k->type == JV_STR ? k->s : "", line)
                                        ?: jv_undef(c, NULL))
                                     : jv_undef(c, NULL);
        if (o->type == JV_LIST) {
            long long i = norm_index(k->i, o->len);
            return i < 0 ? jv_undef(c, NULL) : o->v[i];
        }
        kvp_jv *ch = jv_cp_at(c, o, k->i);
        return ch ? ch : jv_undef(c, NULL);
    }
    case JV_UNDEF:
        undefined_error(c, o, line);
    default:
        return jv_undef(c, NULL);
    }
}

static long long slice_bound(jctx *c, jscope *s, const jnode *e, long long n, long long step,
                             int is_start)
{
    if (!e)
        return step > 0 ? (is_start ? 0 : n) : (is_start ? n - 1 : -1);
    kvp_jv *v = jx_eval(c, s, e);
    if (v->type == JV_NONE)
        return slice_bound(c, s, NULL, n, step, is_start);
    if (v->type != JV_INT && v->type != JV_BOOL)
        jx_fail(c, e->line, "slice indices must be integers");
    long long i = v->i;
    if (i < 0)
        i += n;
    if (step > 0)
        return i < 0 ? 0 : i > n ? n : i;
    return i < -1 ? -1 : i >= n ? n - 1 : i;
}

static kvp_jv *slice(jctx *c, jscope *s, const jnode *e)
{
    kvp_jv *o = jx_eval(c, s, e->a);
    if (o->type == JV_UNDEF)
        undefined_error(c, o, e->line);
    if (o->type != JV_LIST && o->type != JV_STR)
        jx_fail(c, e->line, "a %s cannot be sliced", jv_type_name(o));
    long long step = 1;
    if (e->kids2[0]) {
        kvp_jv *st = jx_eval(c, s, e->kids2[0]);
        if (st->type != JV_INT && st->type != JV_NONE)
            jx_fail(c, e->line, "slice step must be an integer");
        step = st->type == JV_INT ? st->i : 1;
        if (step == 0)
            jx_fail(c, e->line, "slice step cannot be zero");
    }
    size_t n = o->len, *cp = NULL;
    if (o->type == JV_STR)
        cp = jv_cps(c, o, &n);
    long long from = slice_bound(c, s, e->b, (long long)n, step, 1);
    long long to = slice_bound(c, s, e->c, (long long)n, step, 0);
    if (o->type == JV_STR && step == 1)
        return from < to ? jv_sub(c, o, cp[from], cp[to]) : jv_cstr(c, "");
    kvp_jv *l = jv_new(c, JV_LIST);
    jbuf b = {0};
    for (long long i = from; step > 0 ? i < to : i > to;) {
        if (o->type == JV_LIST)
            jv_push(c, l, o->v[i]);
        else
            jb_put(c, &b, o->s + cp[i], cp[i + 1] - cp[i], o->taint ? o->taint + cp[i] : NULL, 0);
        /* the next index would be past `to` (adding a huge step would overflow) */
        if (step > 0 ? to - i <= step
                     : (unsigned long long)(i - to) <= 0ULL - (unsigned long long)step)
            break;
        i += step;
    }
    return o->type == JV_LIST ? l : jb_value(c, &b);
}

/* Arguments of a call, filter or test: positional values and name=value pairs. */
typedef struct jargs {
    kvp_jv **v;
    const char **kn;
    kvp_jv **kv;
    int n, nk;
} jargs;

static jargs eval_args(jctx *c, jscope *s, jnode **kids, int nkids)
{
    jargs a = {0};
    a.v = ja_alloc(c->a, (size_t)(nkids + 1) * sizeof *a.v);
    a.kn = ja_alloc(c->a, (size_t)(nkids + 2) * sizeof *a.kn);
    a.kv = ja_alloc(c->a, (size_t)(nkids + 2) * sizeof *a.kv);
    if (!a.v || !a.kn || !a.kv)
        jx_fail(c, 0, "the template needs more than %zu bytes of memory", c->a->max);
    for (int i = 0; i < nkids; i++) {
        if (kids[i]->kind == N_KWARG) {
            a.kn[a.nk] = kids[i]->name;
            a.kv[a.nk++] = jx_eval(c, s, kids[i]->a);
        } else {
            if (a.nk)
                jx_fail(c, kids[i]->line, "positional argument after a keyword argument");
            a.v[a.n++] = jx_eval(c, s, kids[i]);
        }
    }
    return a;
}

/* loop.index, ... computed when read: a loop's state costs one value however long it runs */
static kvp_jv *loop_attr(jctx *c, const kvp_jv *l, const char *name)
{
    long long i = l->i, n = (long long)l->len;
    if (!strcmp(name, "index")) return jv_int(c, i + 1);
    if (!strcmp(name, "index0")) return jv_int(c, i);
    if (!strcmp(name, "revindex")) return jv_int(c, n - i);
    if (!strcmp(name, "revindex0")) return jv_int(c, n - i - 1);
    if (!strcmp(name, "first")) return jv_bool(c, i == 0);
    if (!strcmp(name, "last")) return jv_bool(c, i + 1 == n);
    if (!strcmp(name, "length")) return jv_int(c, n);
    if (!strcmp(name, "depth")) return jv_int(c, 1);
    if (!strcmp(name, "depth0")) return jv_int(c, 0);
    if (!strcmp(name, "previtem")) return i > 0 ? l->v[i - 1] : jv_undef(c, "previtem");
    if (!strcmp(name, "nextitem")) return i + 1 < n ? l->v[i + 1] : jv_undef(c, "nextitem");
    return jv_undef(c, name);
}

static kvp_jv *attr(jctx *c, kvp_jv *o, const char *name, int line)
{
    if (o->type == JV_UNDEF)
        undefined_error(c, o, line);
    if (o->type == JV_LOOP)
        return jx_loop_method(c, o, name) ?: loop_attr(c, o, name);
    kvp_jv *m = jx_method(c, o, name, line);
    if (m)
        return m;
    if (o->type == JV_DICT) {
        kvp_jv *v = jx_dget(c, o, name, strlen(name));
        if (v)
            return v;
    }
    return jv_undef(c, name);
}

static int run_body(jctx *c, jscope *s, jnode **kids, int n);

kvp_jv *jx_eval(jctx *c, jscope *s, const jnode *e)
{
    if (++c->depth > c->lim.max_depth * 8)
        jx_fail(c, e->line, "expressions nest deeper than %d", c->lim.max_depth * 8);
    kvp_jv *r;
    switch (e->kind) {
    case N_LIT: r = e->lit; break;
    case N_NAME: r = lookup(c, s, e->name); break;
    case N_LIST: case N_TUPLE:
        r = jv_new(c, JV_LIST);
        for (int i = 0; i < e->nkids; i++)
            jv_push(c, r, jx_eval(c, s, e->kids[i]));
        break;
    case N_DICT:
        r = jv_new(c, JV_DICT);
        for (int i = 0; i < e->nkids; i++) {
            kvp_jv *k = jx_eval(c, s, e->kids[i]);
            if (k->type != JV_STR)
                jx_fail(c, e->line, "dict keys must be strings, not %s", jv_type_name(k));
            jv_dset(c, r, k, jx_eval(c, s, e->kids2[i]));
        }
        break;
    case N_ATTR: r = attr(c, jx_eval(c, s, e->a), e->name, e->line); break;
    case N_ITEM: {
        kvp_jv *o = jx_eval(c, s, e->a);
        r = item(c, o, jx_eval(c, s, e->b), e->line);
        if (r->type == JV_UNDEF && o->type == JV_DICT && e->b->kind == N_LIT &&
            e->b->lit->type == JV_STR)
            r = jx_method(c, o, e->b->lit->s, e->line) ?: r;
        break;
    }
    case N_SLICE: r = slice(c, s, e); break;
    case N_CALL: {
        kvp_jv *f = jx_eval(c, s, e->a);
        jargs a = eval_args(c, s, e->kids, e->nkids);
        r = jx_call_value(c, s, f, a.v, a.n, a.kn, a.kv, a.nk, e->line);
        break;
    }
    case N_FILTER: {
        kvp_jv *v = jx_eval(c, s, e->a);
        jargs a = eval_args(c, s, e->kids, e->nkids);
        r = jx_filter(c, s, e->name, v, a.v, a.n, a.kn, a.kv, a.nk, e->line);
        break;
    }
    case N_TEST: {
        kvp_jv *v = jx_eval(c, s, e->a);
        jargs a = eval_args(c, s, e->kids, e->nkids);
        r = jv_bool(c, jx_test(c, e->name, v, a.v, a.n, e->line) != e->op);
        break;
    }
    case N_NOT: r = jv_bool(c, !jv_truthy(jx_eval(c, s, e->a))); break;
    case N_NEG: case N_POS: {
        kvp_jv *v = jx_eval(c, s, e->a);
        if (v->type == JV_UNDEF)
            undefined_error(c, v, e->line);
        if (!is_num(v))
            jx_fail(c, e->line, "bad operand type for unary %c: %s", e->kind == N_NEG ? '-' : '+',
                    jv_type_name(v));
        if (e->kind == N_POS)
            r = v->type == JV_BOOL ? jv_int(c, v->i) : v;
        else if (v->type == JV_FLOAT)
            r = jfloat(c, -v->f);
        else if (v->i == INT64_MIN)
            int_overflow(c, "unary -", e->line);
        else
            r = jv_int(c, -v->i);
        break;
    }
    case N_BIN: {
        kvp_jv *a = jx_eval(c, s, e->a);
        r = binop(c, e->op, a, jx_eval(c, s, e->b), e->line);
        break;
    }
    case N_AND: {
        kvp_jv *a = jx_eval(c, s, e->a);
        r = jv_truthy(a) ? jx_eval(c, s, e->b) : a;
        break;
    }
    case N_OR: {
        kvp_jv *a = jx_eval(c, s, e->a);
        r = jv_truthy(a) ? a : jx_eval(c, s, e->b);
        break;
    }
    case N_COND:
        if (jv_truthy(jx_eval(c, s, e->b)))
            r = jx_eval(c, s, e->a);
        else
            r = e->c ? jx_eval(c, s, e->c) : jv_undef(c, NULL);
        break;
    default:
        jx_fail(c, e->line, "not an expression");
    }
    c->depth--;
    return r;
}

/* A macro or a call block's caller(): its body rendered in a scope of its parameters. */
static kvp_jv *call_macro(jctx *c, kvp_jv *m, kvp_jv **args, int nargs, const char **kwn,
                          kvp_jv **kwv, int nkw, int line)
{
    const jnode *d = m->node;
    if (++c->mdepth > c->lim.max_depth)
        jx_fail(c, line, "macro calls nest deeper than %d", c->lim.max_depth);
    jx_step(c, line);
    jscope *s = scope_new(c, m->scope);
    if (nargs > d->nnames)
        jx_fail(c, line, "macro '%s' takes %d arguments, %d given", d->name ? d->name : "caller",
                d->nnames, nargs);
    for (int i = 0; i < d->nnames; i++) {
        kvp_jv *v = i < nargs ? args[i] : NULL;
        for (int k = 0; k < nkw; k++)
            if (!strcmp(kwn[k], d->names[i]))
                v = kwv[k];
        if (!v)
            v = i < d->nkids2 && d->kids2[i] ? jx_eval(c, m->scope, d->kids2[i])
                                             : jv_undef(c, d->names[i]);
        assign(c, s, d->names[i], v);
    }
    for (int k = 0; k < nkw; k++) {
        int known = !strcmp(kwn[k], "caller");
        for (int i = 0; i < d->nnames; i++)
            known |= !strcmp(kwn[k], d->names[i]);
        if (!known)
            jx_fail(c, line, "macro '%s' has no parameter '%s'", d->name ? d->name : "caller",
                    kwn[k]);
        if (!strcmp(kwn[k], "caller"))
            assign(c, s, "caller", kwv[k]);
    }
    jbuf out = {0}, *saved = c->out;
    c->out = &out;
    int saved_line = c->line;
    run_body(c, s, d->kids, d->nkids);
    c->out = saved;
    c->line = saved_line;
    c->mdepth--;
    return jb_value(c, &out);
}

kvp_jv *jx_call_value(jctx *c, jscope *s, kvp_jv *f, kvp_jv **args, int nargs,
                      const char **kwn, kvp_jv **kwv, int nkw, int line)
{
    (void)s;
    if (f->type == JV_MACRO)
        return call_macro(c, f, args, nargs, kwn, kwv, nkw, line);
    if (f->type == JV_FUNC)
        return jx_call_builtin(c, f, args, nargs, kwn, kwv, nkw, line);
    if (f->type == JV_UNDEF)
        undefined_error(c, f, line);
    jx_fail(c, line, "a %s is not callable", jv_type_name(f));
}

static void emit(jctx *c, const kvp_jv *v)
{
    if (v->type == JV_STR)
        jb_put(c, c->out, v->s, v->n, v->taint, 0);
    else
        jb_str(c, c->out, v);
}

static void bind(jctx *c, jscope *s, const jnode *n, kvp_jv *v, int line)
{
    if (n->nnames == 1) {
        assign(c, s, n->names[0], v);
        return;
    }
    if (v->type != JV_LIST || v->len != (size_t)n->nnames)
        jx_fail(c, line, "cannot unpack a %s into %d names", jv_type_name(v), n->nnames);
    for (int i = 0; i < n->nnames; i++)
        assign(c, s, n->names[i], v->v[i]);
}

static kvp_jv *iterable(jctx *c, kvp_jv *v, int line)
{
    switch (v->type) {
    case JV_LIST: return v;
    case JV_UNDEF: return jv_new(c, JV_LIST);
    case JV_DICT: {
        kvp_jv *l = jv_new(c, JV_LIST);
        for (size_t i = 0; i < v->len; i++)
            jv_push(c, l, v->k[i]);
        return l;
    }
    case JV_STR: {
        kvp_jv *l = jv_new(c, JV_LIST);
        size_t n, *cp = jv_cps(c, v, &n);
        for (size_t i = 0; i < n; i++)
            jv_push(c, l, jv_sub(c, v, cp[i], cp[i + 1]));
        return l;
    }
    default: jx_fail(c, line, "a %s is not iterable", jv_type_name(v));
    }
}

static int run_for(jctx *c, jscope *s, const jnode *n)
{
    kvp_jv *seq = iterable(c, jx_eval(c, s, n->b), n->line);
    jscope *ls = scope_new(c, s);
    if (n->c) {                     /* the loop filter runs first: loop.length counts kept items */
        kvp_jv *kept = jv_new(c, JV_LIST);
        for (size_t i = 0; i < seq->len; i++) {
            jx_step(c, n->line);
            bind(c, ls, n, seq->v[i], n->line);
            if (jv_truthy(jx_eval(c, ls, n->c)))
                jv_push(c, kept, seq->v[i]);
        }
        seq = kept;
    }
    size_t len = seq->len;
    kvp_jv *loop = jv_new(c, JV_LOOP);
    loop->v = seq->v;
    loop->len = len;
    assign(c, ls, "loop", loop);
    for (size_t i = 0; i < len; i++) {
        jx_step(c, n->line);
        loop->i = (long long)i;
        bind(c, ls, n, seq->v[i], n->line);
        if (run_body(c, ls, n->kids, n->nkids) == RUN_BREAK)
            break;
    }
    if (!len)
        return run_body(c, s, n->kids2, n->nkids2);
    return RUN_OK;
}

static int run(jctx *c, jscope *s, const jnode *n)
{
    c->line = n->line;
    switch (n->kind) {
    case N_TEXT: emit(c, n->lit); return RUN_OK;
    case N_OUT: emit(c, jx_eval(c, s, n->a)); return RUN_OK;
    case N_IF:
        if (jv_truthy(jx_eval(c, s, n->a)))
            return run_body(c, s, n->kids, n->nkids);
        return run_body(c, s, n->kids2, n->nkids2);
    case N_FOR: return run_for(c, s, n);
    case N_SET: {
        kvp_jv *v = jx_eval(c, s, n->b);
        if (n->op) {
            kvp_jv *ns = lookup(c, s, n->name);
            if (ns->type != JV_DICT || !ns->ns)
                jx_fail(c, n->line, "cannot set attribute '%s' of '%s': not a namespace()",
                        n->names[0], n->name);
            jv_dset(c, ns, jv_cstr(c, n->names[0]), v);
        } else {
            bind(c, s, n, v, n->line);
        }
        return RUN_OK;
    }
    case N_SETBLOCK: {
        jbuf out = {0}, *saved = c->out;
        c->out = &out;
        run_body(c, s, n->kids, n->nkids);
        c->out = saved;
        assign(c, s, n->names[0], jb_value(c, &out));
        return RUN_OK;
    }
    case N_MACRO: {
        kvp_jv *m = jv_new(c, JV_MACRO);
        m->node = n;
        m->scope = s;
        assign(c, s, n->name, m);
        return RUN_OK;
    }
    case N_CALLBLOCK: {
        kvp_jv *caller = jv_new(c, JV_MACRO);
        caller->node = n;
        caller->scope = s;
        const jnode *call = n->a;
        kvp_jv *f = jx_eval(c, s, call->a);
        jargs a = eval_args(c, s, call->kids, call->nkids);
        a.kn[a.nk] = "caller";
        a.kv[a.nk++] = caller;
        emit(c, jx_call_value(c, s, f, a.v, a.n, a.kn, a.kv, a.nk, n->line));
        return RUN_OK;
    }
    case N_BREAK: return RUN_BREAK;
    case N_CONTINUE: return RUN_CONTINUE;
    default: jx_fail(c, n->line, "not a statement");
    }
}

static int run_body(jctx *c, jscope *s, jnode **kids, int n)
{
    for (int i = 0; i < n; i++) {
        int r = run(c, s, kids[i]);
        if (r != RUN_OK)
            return r;
    }
    return RUN_OK;
}

long kvp_jinja_render(const kvp_jinja *t, kvp_jarena *a, const kvp_jv *vars,
                      const kvp_jinja_limits *lim, char **out, unsigned char **mask,
                      char *err, size_t errlen)
{
    jctx c_, *c = &c_;
    memset(c, 0, sizeof *c);
    c->err = err;
    c->errlen = errlen;
    c->a = a;
    if (lim)
        c->lim = *lim;
    if (!c->lim.max_output)
        c->lim.max_output = DEFAULT_OUTPUT;
    if (!c->lim.max_steps)
        c->lim.max_steps = DEFAULT_STEPS;
    if (!c->lim.max_depth)
        c->lim.max_depth = DEFAULT_DEPTH;
    if (errlen)
        err[0] = 0;
    *out = NULL;
    if (mask)
        *mask = NULL;
    if (!t || !a || a->oom || !vars || vars->type != JV_DICT) {
        if (errlen)
            snprintf(err, errlen, "%s", !t || !a || (a && a->oom) ? "out of memory"
                                                                : "the variables are not a dict");
        return -1;
    }
    jbuf o = {0};
    c->out = &o;
    if (setjmp(c->jb))
        return -1;
    jscope *top = scope_new(c, NULL);
    top->vars = (kvp_jv *)vars;
    jscope *s = scope_new(c, top);
    c->globals = s;
    run_body(c, s, t->body->kids, t->body->nkids);
    char *r = malloc(o.n + 1);
    unsigned char *m = mask ? malloc(o.n + 1) : NULL;
    if (!r || (mask && !m)) {
        free(r);
        free(m);
        if (errlen)
            snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (o.n)
        memcpy(r, o.s, o.n);
    r[o.n] = 0;
    if (m) {
        if (o.n)
            memcpy(m, o.t, o.n);
        *mask = m;
    }
    *out = r;
    return (long)o.n;
}
