/* Internals shared by the Jinja interpreter's files: values (jinja_value.c), the lexer and
 * parser (jinja_parse.c), the evaluator (jinja_eval.c) and the filters, tests and methods
 * (jinja_builtin.c). Errors unwind with longjmp to the entry point (parse or render); all
 * memory of a parse or a rendering lives in an arena freed as a whole. */
#ifndef KVP_JINJA_IMPL_H
#define KVP_JINJA_IMPL_H

#include <setjmp.h>
#include <stddef.h>

#include "model/jinja.h"

enum jv_type { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
               JV_MACRO, JV_FUNC, JV_LOOP };

struct jnode;
struct jscope;

struct kvp_jv {
    enum jv_type type;
    int ns;                        /* dict made by namespace(): attributes assignable */
    long long i;                   /* bool, int; loop: index0 */
    double f;
    const char *s;                 /* str: bytes (NUL-terminated), undef: its name */
    size_t n;
    const unsigned char *taint;    /* str: per byte 1 = caller's data; NULL = none is */
    kvp_jv **v;                    /* list items, dict values; loop: the items */
    kvp_jv **k;                    /* dict keys (strings) */
    size_t len, cap;               /* loop: len = loop.length */
    const struct jnode *node;      /* macro */
    int fn;                        /* builtin function id (jinja_builtin.c) */
    kvp_jv *self;                  /* bound method: its receiver; call block: caller */
    struct jscope *scope;          /* call block: the scope its body runs in */
};

struct kvp_jarena {
    struct jblock *head;
    size_t used, max;
    int oom;
};

void *ja_alloc(kvp_jarena *a, size_t n);   /* zeroed; NULL when over the limit */

/* ---- nodes ---- */
enum jnode_kind {
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER,
    N_TEST, N_NOT, N_NEG, N_POS, N_BIN, N_AND, N_OR, N_COND, N_KWARG,
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_BREAK,
    N_CONTINUE,
};

enum jbin { B_ADD, B_SUB, B_MUL, B_DIV, B_FDIV, B_MOD, B_POW, B_CAT, B_EQ, B_NE, B_LT,
            B_LE, B_GT, B_GE, B_IN, B_NOTIN };

typedef struct jnode {
    enum jnode_kind kind;
    int line;
    int op;                        /* N_BIN: enum jbin; N_TEST: negated */
    const char *name;              /* name, attribute, filter, test, macro, kwarg */
    kvp_jv *lit;                   /* N_LIT, N_TEXT */
    struct jnode *a, *b, *c;       /* operands; N_FOR: a target, b iterable, c filter */
    struct jnode **kids;           /* args, items, a body */
    int nkids;
    struct jnode **kids2;          /* N_IF/N_FOR: else body; N_MACRO: defaults;
                                      N_DICT: values */
    int nkids2;
    const char **names;            /* N_FOR / N_SET targets, N_MACRO parameters */
    int nnames;
} jnode;

struct kvp_jinja {
    kvp_jarena *arena;
    jnode *body;                   /* N_TEXT-less root: kids are the statements */
};

/* ---- values (jinja_value.c) ---- */
typedef struct jbuf {              /* a growing string with its taint mask */
    char *s;
    unsigned char *t;
    size_t n, cap;
    int tainted;                   /* some byte is */
} jbuf;

typedef struct jctx jctx;
void jx_fail(jctx *c, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
kvp_jv *jv_new(jctx *c, enum jv_type t);
kvp_jv *jv_undef(jctx *c, const char *name);
kvp_jv *jv_strn(jctx *c, const char *s, size_t n, const unsigned char *taint, int all);
kvp_jv *jv_cstr(jctx *c, const char *s);       /* template text */
kvp_jv *jv_bool(jctx *c, int b);
kvp_jv *jv_int(jctx *c, long long i);
void jv_push(jctx *c, kvp_jv *list, kvp_jv *v);
void jv_dset(jctx *c, kvp_jv *dict, kvp_jv *key, kvp_jv *v);
kvp_jv *jv_dget(const kvp_jv *dict, const char *key, size_t n);
/* jv_dget in a rendering: a lookup costs steps by the dict's size (jx_scan: 16 a key) */
kvp_jv *jx_dget(jctx *c, const kvp_jv *dict, const char *key, size_t n);
int jv_truthy(const kvp_jv *v);
int jv_equal(jctx *c, const kvp_jv *a, const kvp_jv *b);   /* Python's == */
int jv_num_cmp(const kvp_jv *a, const kvp_jv *b);   /* exact: -1, 0, 1; 2 with a NaN */
/* How deep values may nest when printed or compared (Python's recursion limit's role). */
#define JV_MAX_NEST(c) ((c)->lim.max_depth * 8)
const char *jv_type_name(const kvp_jv *v);
void jb_put(jctx *c, jbuf *b, const char *s, size_t n, const unsigned char *taint, int all);
void jb_str(jctx *c, jbuf *b, const kvp_jv *v);    /* str(v) as Python prints it */
void jb_json(jctx *c, jbuf *b, const kvp_jv *v, long long indent, int level);
kvp_jv *jb_value(jctx *c, jbuf *b);                /* the buffer as a string value */
kvp_jv *jv_to_str(jctx *c, const kvp_jv *v);
/* A string's code points: offsets of each start, and n+1 entries (the last = v->n). */
size_t *jv_cps(jctx *c, const kvp_jv *v, size_t *count);
/* The number of code points of a string, and its code point i (negative: from the end)
 * or NULL when out of range, without memory of the string's size. */
size_t jv_cp_count(jctx *c, const kvp_jv *v);
kvp_jv *jv_cp_at(jctx *c, const kvp_jv *v, long long i);
/* The bytes [from, to) of a string as a new string with their taint. */
kvp_jv *jv_sub(jctx *c, const kvp_jv *v, size_t from, size_t to);
int jv_is_space_at(const char *s, size_t n, size_t at, size_t *len);   /* Python isspace */

/* ---- rendering context (jinja_eval.c) ---- */
typedef struct jscope {
    struct jscope *parent;
    kvp_jv *vars;                  /* dict */
} jscope;

struct jctx {
    jmp_buf jb;
    char *err;
    size_t errlen;
    kvp_jarena *a;
    kvp_jinja_limits lim;
    long steps;
    size_t scan;                   /* units of scanning not yet charged as a step */
    int depth;                     /* nested expression evaluations */
    int mdepth;                    /* nested macro calls */
    jscope *globals;
    jbuf *out;                     /* where output goes (a macro's body: its own) */
    int line;                      /* the statement being run, for errors */
    kvp_jv *small[256];            /* the ints 0..255, made once (values are immutable) */
};

void jx_step(jctx *c, int line);
void jx_scan(jctx *c, size_t units);      /* bytes scanned, 64 per item compared */
kvp_jv *jx_eval(jctx *c, jscope *s, const jnode *e);
kvp_jv *jx_call_value(jctx *c, jscope *s, kvp_jv *f, kvp_jv **args, int nargs,
                      const char **kwn, kvp_jv **kwv, int nkw, int line);

/* ---- builtins (jinja_builtin.c) ---- */
kvp_jv *jx_filter(jctx *c, jscope *s, const char *name, kvp_jv *v, kvp_jv **args, int nargs,
                  const char **kwn, kvp_jv **kwv, int nkw, int line);
int jx_test(jctx *c, const char *name, kvp_jv *v, kvp_jv **args, int nargs, int line);
kvp_jv *jx_method(jctx *c, kvp_jv *self, const char *name, int line);   /* NULL: none */
kvp_jv *jx_global(jctx *c, const char *name);                           /* NULL: none */
kvp_jv *jx_loop_method(jctx *c, kvp_jv *loop, const char *name);        /* NULL: none */
kvp_jv *jx_call_builtin(jctx *c, kvp_jv *f, kvp_jv **args, int nargs, const char **kwn,
                        kvp_jv **kwv, int nkw, int line);
int jx_is_test(const char *name);
/* helpers the filters share with the methods (jinja_builtin.c) */
kvp_jv *jx_arg(kvp_jv **args, int nargs, const char **kwn, kvp_jv **kwv, int nkw, int i,
               const char *name);
kvp_jv *jx_need_str(jctx *c, kvp_jv *v, const char *what, int line);
kvp_jv *jx_list_of(jctx *c, kvp_jv *v, const char *what, int line);
kvp_jv *jx_strip(jctx *c, kvp_jv *v, kvp_jv *chars, int left, int right);
/* Case mapping as Python does it (jinja_builtin.c): 0 lower, 1 upper, 2 str.title, 3
 * capitalize, 4 the title filter. */
kvp_jv *jx_casemap(jctx *c, const kvp_jv *v, int mode);
kvp_jv *jx_replace(jctx *c, kvp_jv *v, kvp_jv *old, kvp_jv *new, long long count, int line);
kvp_jv *jx_join(jctx *c, kvp_jv *seq, kvp_jv *sep, kvp_jv *attribute, int line);
kvp_jv *jx_pairs(jctx *c, kvp_jv *d, int what);            /* 0 items, 1 keys, 2 values */

/* ---- lexer (jinja_lex.c) and parser (jinja_parse.c) ---- */
enum { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP,
       T_EOF };

typedef struct jtok {
    int type, line;
    const char *s;                 /* T_NAME, T_OP, T_STR (decoded), T_TEXT */
    size_t n;
    long long i;
    double f;
} jtok;

typedef struct jparser {
    jmp_buf jb;
    char *err;
    size_t errlen;
    kvp_jarena *a;
    const char *src;
    size_t len;
    jtok *t;
    int nt, cap, pos, nest;
    size_t lpos;                   /* line_of's position and line */
    int lno;
} jparser;

void jp_fail(jparser *p, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
void *jp_alloc(jparser *p, size_t n);   /* zeroed; unwinds when out of memory */
void jp_lex(jparser *p);                /* p->t: the tokens, T_EOF last */
jnode *jp_parse(kvp_jarena *a, const char *src, size_t len, char *err, size_t errlen);

#endif
