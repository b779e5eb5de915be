/* The Jinja parser: tokens (jinja_lex.c) become a tree of jnodes (jinja_impl.h), with
 * Jinja's precedence: `x if c else y` < or < and < not < comparisons and `in` < + - < ~
 * < * / // % < ** < unary minus < filters and tests < attribute, item and call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja_impl.h"

#define MAX_NEST 200     /* nested statements and expressions while parsing */

/* ---- parser ---- */

static jtok *cur(jparser *p) { return &p->t[p->pos]; }
static int is_op(const jtok *t, const char *op) { return t->type == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static int is_name(const jtok *t, const char *n) { return t->type == T_NAME && t->n == strlen(n) && !memcmp(t->s, n, t->n); }

static int accept_op(jparser *p, const char *op)
{
    if (!is_op(cur(p), op))
        return 0;
    p->pos++;
    return 1;
}

static int accept_name(jparser *p, const char *n)
{
    if (!is_name(cur(p), n))
        return 0;
    p->pos++;
    return 1;
}

static const char *tok_desc(jparser *p, const jtok *t)
{
    static const char *names[] = {"text", "'{{'", "'}}'", "'{%'", "'%}'", "name", "string",
                                  "integer", "float", "operator", "end of template"};
    if (t->type == T_NAME || t->type == T_OP) {
        char *s = jp_alloc(p, t->n + 3);
        snprintf(s, t->n + 3, "'%.*s'", (int)t->n, t->s);
        return s;
    }
    return names[t->type];
}

static void expect_op(jparser *p, const char *op)
{
    if (!accept_op(p, op))
        jp_fail(p, cur(p)->line, "expected '%s', found %s", op, tok_desc(p, cur(p)));
}

static const char *expect_name(jparser *p)
{
    jtok *t = cur(p);
    if (t->type != T_NAME)
        jp_fail(p, t->line, "expected a name, found %s", tok_desc(p, t));
    p->pos++;
    char *s = jp_alloc(p, t->n + 1);
    memcpy(s, t->s, t->n);
    return s;
}

static jnode *node(jparser *p, enum jnode_kind k, int line)
{
    jnode *n = jp_alloc(p, sizeof *n);
    n->kind = k;
    n->line = line;
    return n;
}

typedef struct nlist { jnode **v; int n, cap; } nlist;

static void nl_push(jparser *p, nlist *l, jnode *n)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        jnode **v = jp_alloc(p, (size_t)cap * sizeof *v);
        if (l->n)
            memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = n;
}

static void enter(jparser *p)
{
    if (++p->nest > MAX_NEST)
        jp_fail(p, cur(p)->line, "the template nests deeper than %d", MAX_NEST);
}

static jnode *expr(jparser *p);
static jnode *or_expr(jparser *p);
static jnode *unary(jparser *p, int with_filter);

static jnode *lit(jparser *p, kvp_jv *v, int line)
{
    if (!v)
        jp_fail(p, line, "out of memory");
    jnode *n = node(p, N_LIT, line);
    n->lit = v;
    return n;
}

/* Call arguments after '(': positional, then name=value. */
static void args(jparser *p, jnode *n)
{
    nlist l = {0};
    while (!accept_op(p, ")")) {
        if (l.n)
            expect_op(p, ",");
        if (accept_op(p, ")"))
            break;
        jtok *t = cur(p);
        if (t->type == T_NAME && is_op(&p->t[p->pos + 1], "=")) {
            jnode *k = node(p, N_KWARG, t->line);
            k->name = expect_name(p);
            p->pos++;
            k->a = expr(p);
            nl_push(p, &l, k);
        } else {
            nl_push(p, &l, expr(p));
        }
    }
    n->kids = l.v;
    n->nkids = l.n;
}

static jnode *primary(jparser *p)
{
    jtok *t = cur(p);
    int line = t->line;
    enter(p);
    jnode *n;
    if (t->type == T_NAME) {
        p->pos++;
        if (is_name(t, "true") || is_name(t, "True"))
            n = lit(p, kvp_jv_bool(p->a, 1), line);
        else if (is_name(t, "false") || is_name(t, "False"))
            n = lit(p, kvp_jv_bool(p->a, 0), line);
        else if (is_name(t, "none") || is_name(t, "None"))
            n = lit(p, kvp_jv_none(p->a), line);
        else {
            n = node(p, N_NAME, line);
            p->pos--;
            n->name = expect_name(p);
        }
    } else if (t->type == T_STR) {
        size_t total = 0;
        int k = p->pos;
        for (; p->t[k].type == T_STR; k++)
            total += p->t[k].n;
        char *s = jp_alloc(p, total + 1);
        size_t o = 0;
        for (; p->t[p->pos].type == T_STR; p->pos++) {
            memcpy(s + o, p->t[p->pos].s, p->t[p->pos].n);
            o += p->t[p->pos].n;
        }
        n = lit(p, kvp_jv_str_trusted(p->a, s, total), line);
    } else if (t->type == T_INT) {
        p->pos++;
        n = lit(p, kvp_jv_int(p->a, t->i), line);
    } else if (t->type == T_FLOAT) {
        p->pos++;
        n = lit(p, kvp_jv_float(p->a, t->f), line);
    } else if (accept_op(p, "(")) {
        if (accept_op(p, ")")) {
            n = node(p, N_TUPLE, line);
        } else {
            n = expr(p);
            if (is_op(cur(p), ",")) {
                nlist l = {0};
                nl_push(p, &l, n);
                while (accept_op(p, ",") && !is_op(cur(p), ")"))
                    nl_push(p, &l, expr(p));
                n = node(p, N_TUPLE, line);
                n->kids = l.v;
                n->nkids = l.n;
            }
            expect_op(p, ")");
        }
    } else if (accept_op(p, "[")) {
        nlist l = {0};
        while (!accept_op(p, "]")) {
            if (l.n)
                expect_op(p, ",");
            if (accept_op(p, "]"))
                break;
            nl_push(p, &l, expr(p));
        }
        n = node(p, N_LIST, line);
        n->kids = l.v;
        n->nkids = l.n;
    } else if (accept_op(p, "{")) {
        nlist k = {0}, v = {0};
        while (!accept_op(p, "}")) {
            if (k.n)
                expect_op(p, ",");
            if (accept_op(p, "}"))
                break;
            nl_push(p, &k, expr(p));
            expect_op(p, ":");
            nl_push(p, &v, expr(p));
        }
        n = node(p, N_DICT, line);
        n->kids = k.v;
        n->nkids = k.n;
        n->kids2 = v.v;
        n->nkids2 = v.n;
    } else {
        jp_fail(p, line, "unexpected %s", tok_desc(p, t));
    }
    p->nest--;
    return n;
}

/* A node of kind k over operand a. */
static jnode *wrap(jparser *p, enum jnode_kind k, int line, jnode *a)
{
    jnode *n = node(p, k, line);
    n->a = a;
    return n;
}

/* f(...) after its '(' */
static jnode *call(jparser *p, jnode *f, int line)
{
    jnode *c = wrap(p, N_CALL, line, f);
    args(p, c);
    return c;
}

static jnode *postfix(jparser *p, jnode *n)
{
    for (;;) {
        int line = cur(p)->line;
        if (accept_op(p, ".")) {
            jnode *a = wrap(p, N_ATTR, line, n);
            if (cur(p)->type == T_INT) {       /* x.0 is x[0] */
                a->kind = N_ITEM;
                a->b = lit(p, kvp_jv_int(p->a, cur(p)->i), line);
                p->pos++;
            } else {
                a->name = expect_name(p);
            }
            n = a;
        } else if (accept_op(p, "[")) {
            jnode *parts[3] = {0};
            int k = 0, colons = 0;
            while (!is_op(cur(p), "]")) {
                if (accept_op(p, ":")) {
                    if (++colons > 2)
                        jp_fail(p, line, "bad slice");
                    k = colons;
                    continue;
                }
                if (parts[k])
                    jp_fail(p, line, "expected ']' or ':'");
                parts[k] = expr(p);
            }
            p->pos++;
            jnode *s = wrap(p, colons ? N_SLICE : N_ITEM, line, n);
            if (!colons && !parts[0])
                jp_fail(p, line, "empty subscript");
            s->b = parts[0];
            s->c = parts[1];
            if (colons)
                s->kids2 = jp_alloc(p, sizeof(jnode *)), s->kids2[0] = parts[2], s->nkids2 = 1;
            n = s;
        } else if (accept_op(p, "(")) {
            n = call(p, n, line);
        } else {
            return n;
        }
    }
}

static jnode *filters(jparser *p, jnode *n)
{
    for (;;) {
        int line = cur(p)->line;
        if (accept_op(p, "|")) {
            jnode *f = wrap(p, N_FILTER, line, n);
            f->name = expect_name(p);
            while (accept_op(p, ".")) {           /* dotted filter names */
                const char *more = expect_name(p);
                size_t l = strlen(f->name) + strlen(more) + 2;
                char *s = jp_alloc(p, l);
                snprintf(s, l, "%s.%s", f->name, more);
                f->name = s;
            }
            if (accept_op(p, "("))
                args(p, f);
            n = f;
        } else if (accept_name(p, "is")) {
            jnode *t = wrap(p, N_TEST, line, n);
            t->op = accept_name(p, "not");
            t->name = expect_name(p);
            jtok *k = cur(p);
            if (accept_op(p, "(")) {
                args(p, t);
            } else if ((k->type == T_NAME && !is_name(k, "else") && !is_name(k, "or") &&
                        !is_name(k, "and") && !is_name(k, "if")) ||
                       k->type == T_STR || k->type == T_INT || k->type == T_FLOAT ||
                       is_op(k, "[") || is_op(k, "{")) {
                t->kids = jp_alloc(p, sizeof(jnode *));
                t->kids[0] = postfix(p, primary(p));
                t->nkids = 1;
            }
            n = t;
        } else if (accept_op(p, "(")) {
            n = call(p, n, line);
        } else {
            return n;
        }
    }
}

static jnode *unary(jparser *p, int with_filter)
{
    int line = cur(p)->line;
    jnode *n;
    enter(p);
    if (accept_op(p, "-")) {
        n = wrap(p, N_NEG, line, unary(p, 0));
    } else if (accept_op(p, "+")) {
        n = wrap(p, N_POS, line, unary(p, 0));
    } else {
        n = primary(p);
    }
    n = postfix(p, n);
    if (with_filter)
        n = filters(p, n);
    p->nest--;
    return n;
}

static jnode *bin(jparser *p, int op, jnode *a, jnode *b, int line)
{
    jnode *n = node(p, N_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

typedef jnode *(*parse_fn)(jparser *p);

/* One left-associative level of binary operators: ops[i] makes a B_ node of codes[i]. */
static jnode *left_assoc(jparser *p, parse_fn next, const char *const *ops, const int *codes)
{
    jnode *n = next(p);
    for (;;) {
        int line = cur(p)->line, k = -1;
        for (int i = 0; ops[i] && k < 0; i++)
            if (accept_op(p, ops[i]))
                k = i;
        if (k < 0)
            return n;
        n = bin(p, codes[k], n, next(p), line);
    }
}

static jnode *unary_filtered(jparser *p) { return unary(p, 1); }

static jnode *power(jparser *p)
{
    static const char *const ops[] = {"**", NULL};
    static const int codes[] = {B_POW};
    return left_assoc(p, unary_filtered, ops, codes);
}

static jnode *math2(jparser *p)
{
    static const char *const ops[] = {"*", "//", "/", "%", NULL};
    static const int codes[] = {B_MUL, B_FDIV, B_DIV, B_MOD};
    return left_assoc(p, power, ops, codes);
}

static jnode *concat(jparser *p)
{
    static const char *const ops[] = {"~", NULL};
    static const int codes[] = {B_CAT};
    return left_assoc(p, math2, ops, codes);
}

static jnode *math1(jparser *p)
{
    static const char *const ops[] = {"+", "-", NULL};
    static const int codes[] = {B_ADD, B_SUB};
    return left_assoc(p, concat, ops, codes);
}

static jnode *compare(jparser *p)
{
    jnode *n = math1(p);
    for (;;) {
        int line = cur(p)->line, op;
        if (accept_op(p, "==")) op = B_EQ;
        else if (accept_op(p, "!=")) op = B_NE;
        else if (accept_op(p, "<=")) op = B_LE;
        else if (accept_op(p, ">=")) op = B_GE;
        else if (accept_op(p, "<")) op = B_LT;
        else if (accept_op(p, ">")) op = B_GT;
        else if (accept_name(p, "in")) op = B_IN;
        else if (is_name(cur(p), "not") && is_name(&p->t[p->pos + 1], "in")) {
            p->pos += 2;
            op = B_NOTIN;
        } else return n;
        n = bin(p, op, n, math1(p), line);
    }
}

static jnode *not_expr(jparser *p)
{
    int line = cur(p)->line;
    if (accept_name(p, "not")) {
        enter(p);
        jnode *n = node(p, N_NOT, line);
        n->a = not_expr(p);
        p->nest--;
        return n;
    }
    return compare(p);
}

/* `and` / `or`: Python's, returning an operand */
static jnode *logic(jparser *p, parse_fn next, const char *word, enum jnode_kind kind)
{
    jnode *n = next(p);
    while (is_name(cur(p), word)) {
        jnode *a = node(p, kind, cur(p)->line);
        p->pos++;
        a->a = n;
        a->b = next(p);
        n = a;
    }
    return n;
}

static jnode *and_expr(jparser *p) { return logic(p, not_expr, "and", N_AND); }
static jnode *or_expr(jparser *p) { return logic(p, and_expr, "or", N_OR); }

/* x if cond else y (else optional: undefined) */
static jnode *expr(jparser *p)
{
    enter(p);
    jnode *n = or_expr(p);
    while (is_name(cur(p), "if")) {
        jnode *c = node(p, N_COND, cur(p)->line);
        p->pos++;
        c->a = n;
        c->b = or_expr(p);
        if (accept_name(p, "else"))
            c->c = expr(p);
        n = c;
    }
    p->nest--;
    return n;
}

/* ---- statements ---- */

static void end_tag(jparser *p)
{
    if (cur(p)->type != T_BEND)
        jp_fail(p, cur(p)->line, "expected '%%}', found %s", tok_desc(p, cur(p)));
    p->pos++;
}

static void targets(jparser *p, jnode *n)
{
    const char *v[16];
    int k = 0, paren = accept_op(p, "(");
    do {
        if (k == 16)
            jp_fail(p, cur(p)->line, "too many targets");
        v[k++] = expect_name(p);
    } while (accept_op(p, ","));
    if (paren)
        expect_op(p, ")");
    n->names = jp_alloc(p, (size_t)k * sizeof *n->names);
    memcpy(n->names, v, (size_t)k * sizeof *v);
    n->nnames = k;
}

static jnode **body(jparser *p, int *n, const char *const *ends, const char **found);

static const char *stmt_name(jparser *p)
{
    jtok *t = cur(p);
    if (t->type != T_NAME)
        jp_fail(p, t->line, "expected a statement name, found %s", tok_desc(p, t));
    return expect_name(p);
}

static jnode *statement(jparser *p, int line)
{
    const char *kw = stmt_name(p);
    jnode *n;
    enter(p);
    if (!strcmp(kw, "if")) {
        n = node(p, N_IF, line);
        n->a = expr(p);
        end_tag(p);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        const char *f;
        n->kids = body(p, &n->nkids, ends, &f);
        jnode *last = n;
        while (!strcmp(f, "elif")) {
            jnode *e = node(p, N_IF, cur(p)->line);
            e->a = expr(p);
            end_tag(p);
            e->kids = body(p, &e->nkids, ends, &f);
            last->kids2 = jp_alloc(p, sizeof(jnode *));
            last->kids2[0] = e;
            last->nkids2 = 1;
            last = e;
        }
        if (!strcmp(f, "else")) {
            end_tag(p);
            static const char *const endif[] = {"endif", NULL};
            last->kids2 = body(p, &last->nkids2, endif, &f);
        }
        end_tag(p);
    } else if (!strcmp(kw, "for")) {
        n = node(p, N_FOR, line);
        targets(p, n);
        if (!accept_name(p, "in"))
            jp_fail(p, cur(p)->line, "expected 'in' in a for statement");
        n->b = or_expr(p);
        if (accept_name(p, "if"))
            n->c = expr(p);
        if (accept_name(p, "recursive"))
            jp_fail(p, line, "recursive for loops are not supported");
        end_tag(p);
        static const char *const ends[] = {"else", "endfor", NULL};
        const char *f;
        n->kids = body(p, &n->nkids, ends, &f);
        if (!strcmp(f, "else")) {
            end_tag(p);
            static const char *const endfor[] = {"endfor", NULL};
            n->kids2 = body(p, &n->nkids2, endfor, &f);
        }
        end_tag(p);
    } else if (!strcmp(kw, "set")) {
        n = node(p, N_SET, line);
        targets(p, n);
        if (n->nnames == 1 && accept_op(p, ".")) {
            n->name = n->names[0];
            n->names[0] = expect_name(p);
            n->op = 1;
        }
        if (accept_op(p, "=")) {
            n->b = expr(p);
            if (is_op(cur(p), ",")) {
                nlist l = {0};
                nl_push(p, &l, n->b);
                while (accept_op(p, ","))
                    nl_push(p, &l, expr(p));
                n->b = node(p, N_TUPLE, line);
                n->b->kids = l.v;
                n->b->nkids = l.n;
            }
            end_tag(p);
        } else {
            if (n->nnames != 1 || n->op)
                jp_fail(p, line, "a block set takes one name");
            n->kind = N_SETBLOCK;
            end_tag(p);
            static const char *const ends[] = {"endset", NULL};
            const char *f;
            n->kids = body(p, &n->nkids, ends, &f);
            end_tag(p);
        }
    } else if (!strcmp(kw, "macro")) {
        n = node(p, N_MACRO, line);
        n->name = expect_name(p);
        expect_op(p, "(");
        nlist d = {0};
        const char *v[64];
        int k = 0;
        while (!accept_op(p, ")")) {
            if (k)
                expect_op(p, ",");
            if (k == 64)
                jp_fail(p, line, "too many macro parameters");
            v[k++] = expect_name(p);
            nl_push(p, &d, accept_op(p, "=") ? expr(p) : NULL);
        }
        n->names = jp_alloc(p, (size_t)(k + 1) * sizeof *n->names);
        memcpy(n->names, v, (size_t)k * sizeof *v);
        n->nnames = k;
        n->kids2 = d.v;
        n->nkids2 = d.n;
        end_tag(p);
        static const char *const ends[] = {"endmacro", NULL};
        const char *f;
        n->kids = body(p, &n->nkids, ends, &f);
        if (cur(p)->type == T_NAME)
            p->pos++;                             /* {% endmacro name %} */
        end_tag(p);
    } else if (!strcmp(kw, "call")) {
        n = node(p, N_CALLBLOCK, line);
        if (is_op(cur(p), "(")) {
            p->pos++;
            const char *v[16];
            int k = 0;
            while (!accept_op(p, ")")) {
                if (k)
                    expect_op(p, ",");
                if (k == 16)
                    jp_fail(p, line, "too many caller parameters");
                v[k++] = expect_name(p);
            }
            n->names = jp_alloc(p, (size_t)(k + 1) * sizeof *n->names);
            memcpy(n->names, v, (size_t)k * sizeof *v);
            n->nnames = k;
        }
        n->a = expr(p);
        if (n->a->kind != N_CALL)
            jp_fail(p, line, "call block needs a macro call");
        end_tag(p);
        static const char *const ends[] = {"endcall", NULL};
        const char *f;
        n->kids = body(p, &n->nkids, ends, &f);
        end_tag(p);
    } else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        n = node(p, kw[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        end_tag(p);
    } else if (!strcmp(kw, "generation")) {
        /* transformers' assistant-mask marker: renders its body */
        end_tag(p);
        n = node(p, N_IF, line);
        n->a = lit(p, kvp_jv_bool(p->a, 1), line);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *f;
        n->kids = body(p, &n->nkids, ends, &f);
        end_tag(p);
    } else {
        jp_fail(p, line, "unknown statement '%s'", kw);
    }
    p->nest--;
    return n;
}

/* Statements up to one of `ends` (NULL: the end of the template); *found is the end
 * tag's name, its tag left open after the name. */
static jnode **body(jparser *p, int *count, const char *const *ends, const char **found)
{
    nlist l = {0};
    int start = cur(p)->line;
    for (;;) {
        jtok *t = cur(p);
        if (t->type == T_EOF) {
            if (ends) {
                int k = 0;
                while (ends[k + 1])
                    k++;
                jp_fail(p, start, "unclosed block: no {%% %s %%}", ends[k]);
            }
            break;
        }
        p->pos++;
        if (t->type == T_TEXT) {
            jnode *n = lit(p, kvp_jv_str_trusted(p->a, t->s, t->n), t->line);
            n->kind = N_TEXT;
            nl_push(p, &l, n);
        } else if (t->type == T_VBEGIN) {
            jnode *n = node(p, N_OUT, t->line);
            n->a = expr(p);
            if (cur(p)->type != T_VEND)
                jp_fail(p, cur(p)->line, "expected '}}', found %s", tok_desc(p, cur(p)));
            p->pos++;
            nl_push(p, &l, n);
        } else if (t->type == T_BBEGIN) {
            jtok *k = cur(p);
            int is_end = 0;
            for (int i = 0; ends && ends[i]; i++)
                if (is_name(k, ends[i])) {
                    *found = ends[i];
                    is_end = 1;
                }
            if (is_end) {
                p->pos++;
                break;
            }
            if (k->type == T_NAME && ((k->n > 3 && !memcmp(k->s, "end", 3)) ||
                                      is_name(k, "elif") || is_name(k, "else")))
                jp_fail(p, k->line, "unexpected {%% %.*s %%}", (int)k->n, k->s);
            nl_push(p, &l, statement(p, t->line));
        } else {
            jp_fail(p, t->line, "unexpected %s", tok_desc(p, t));
        }
    }
    *count = l.n;
    return l.v;
}

jnode *jp_parse(kvp_jarena *a, const char *src, size_t len, char *err, size_t errlen)
{
    jparser p = {.err = err, .errlen = errlen, .a = a, .src = src, .len = len};
    if (errlen)
        err[0] = 0;
    if (setjmp(p.jb))
        return NULL;
    jp_lex(&p);
    jnode *root = node(&p, N_IF, 1);
    root->a = lit(&p, kvp_jv_bool(a, 1), 1);
    const char *f;
    root->kids = body(&p, &root->nkids, NULL, &f);
    return root;
}

kvp_jinja *kvp_jinja_parse(const char *src, size_t len, char *err, size_t errlen)
{
    kvp_jinja *t = calloc(1, sizeof *t);
    if (!t || !(t->arena = kvp_jarena_new(0))) {
        free(t);
        if (errlen)
            snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!(t->body = jp_parse(t->arena, src, len, err, errlen))) {
        kvp_jinja_free(t);
        return NULL;
    }
    return t;
}

void kvp_jinja_free(kvp_jinja *t)
{
    if (!t)
        return;
    kvp_jarena_free(t->arena);
    free(t);
}
