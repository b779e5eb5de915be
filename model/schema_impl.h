/* Internal to the schema compiler (model/schema.c, schema_scalar.c, schema_regex.c):
 * the compiler's state and the pieces each file emits. Every emitter writes a path of
 * the grammar from state `from` to state `to` and returns 0, or -1 with c->err set. */
#ifndef KVP_SCHEMA_IMPL_H
#define KVP_SCHEMA_IMPL_H

#include <stdint.h>

#include "model/schema.h"

typedef struct sc_rule {
    const json_t *node;
    int start;
    int busy;            /* being compiled: a $ref back to it is recursion */
    int container;       /* c->container when it began */
} sc_rule;

typedef struct sc {
    kvp_gbuild *b;
    const json_t *root;  /* what "#" refers to */
    char *err;
    size_t errlen;
    char path[256];      /* where the compiler is, as a JSON pointer */
    int depth;           /* schemas open */
    int container;       /* objects and arrays open */
    sc_rule *rules;
    int n_rules, cap_rules;
    int ws;              /* the whitespace rule's start, -1 until made */
    int any;             /* any JSON value's rule, -1 until made */
} sc;

/* Sets the error (printf-style, "at PATH" appended) and returns -1. */
int sc_fail(sc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int sc_state(sc *c);                 /* a new state, or -1 with the error set */
int sc_ws(sc *c, int from, int to);  /* bounded whitespace */
int sc_literal(sc *c, int from, int to, const char *s, size_t len);
/* A count keyword (minItems, maxLength, ...) of schema s into *out: dflt when absent, else
 * an integer from 0 to KVP_SCHEMA_MAX_REPEAT. Returns 0, or -1 with the error set. */
int sc_count(sc *c, const json_t *s, const char *key, long dflt, long *out);
/* One character of a JSON string's text (an unescaped character, an escape, a UTF-8
 * sequence). */
int sc_char(sc *c, int from, int to);
/* A UTF-8 sequence of two to four bytes (a character past ASCII). */
int sc_utf8(sc *c, int from, int to);
int sc_string(sc *c, const json_t *s, int from, int to);
int sc_integer(sc *c, const json_t *s, int from, int to);
int sc_number(sc *c, const json_t *s, int from, int to);
/* A string's text matching pattern (between the quotes). */
int sc_pattern(sc *c, const char *pattern, int from, int to);

#endif
