/* A Jinja interpreter for the subset Hugging Face chat templates use (tokenizer.chat_template
 * in a GGUF or tokenizer_config.json), rendering as transformers' apply_chat_template does:
 * trim_blocks and lstrip_blocks on, loop controls, tojson without key sorting or ASCII
 * escaping, raise_exception() and strftime_now().
 * Statements: if/elif/else, for (loop.*, else, `for x in y if c`, break/continue), set
 * (namespace attributes, block set), macro and call. Expressions: literals, lists, dicts,
 * attribute and item access, slices, calls, filters, tests, `in`, `~`, arithmetic,
 * comparisons, `x if c else y`. Values: none, bool, int, float, string, list, dict.
 * Rendering is bounded (nesting depth, output size, steps, memory; integers are 64-bit and
 * an operation leaving that range is an error): a hostile template gets an error, never a
 * hang, a crash or a wrong number (docs/chat-templates.md, "Bounds").
 * Every string byte carries whether it came from the caller's data (kvp_jv_str) or from
 * the template's own text (literals, and kvp_jv_str_trusted values such as bos_token):
 * the output's mask lets the tokenizer take control tokens only from the template. */
#ifndef KVP_JINJA_H
#define KVP_JINJA_H

#include <stddef.h>

typedef struct kvp_jarena kvp_jarena;   /* owns the values of a rendering */
typedef struct kvp_jv kvp_jv;           /* a value */
typedef struct kvp_jinja kvp_jinja;     /* a parsed template */

/* Limits of a rendering; zero fields take the defaults below. */
typedef struct kvp_jinja_limits {
    size_t max_output;      /* bytes of output (default 8 MiB) */
    size_t max_memory;      /* bytes of values the rendering may allocate (default 64 MiB) */
    long max_steps;         /* loop iterations, macro calls, comparisons and scans
                               (default 1,000,000) */
    int max_depth;          /* nested macro calls and expressions (default 64) */
} kvp_jinja_limits;

/* An arena; NULL when out of memory. max_memory 0: the default. */
kvp_jarena *kvp_jarena_new(size_t max_memory);
void kvp_jarena_free(kvp_jarena *a);

/* Values live in their arena. Constructors return NULL when out of memory; a NULL
 * argument to kvp_jv_append/kvp_jv_set makes them fail (returning -1), so a chain of
 * builders needs one check at the end (kvp_jinja_render refuses an arena that ran out). */
kvp_jv *kvp_jv_none(kvp_jarena *a);
kvp_jv *kvp_jv_bool(kvp_jarena *a, int b);
kvp_jv *kvp_jv_int(kvp_jarena *a, long long i);
kvp_jv *kvp_jv_float(kvp_jarena *a, double f);
/* A string from the caller's data (messages, tools): never a control token. */
kvp_jv *kvp_jv_str(kvp_jarena *a, const char *s, size_t n);
/* A string the template may use as control text (bos_token, eos_token). */
kvp_jv *kvp_jv_str_trusted(kvp_jarena *a, const char *s, size_t n);
kvp_jv *kvp_jv_list(kvp_jarena *a);
kvp_jv *kvp_jv_dict(kvp_jarena *a);
int kvp_jv_append(kvp_jarena *a, kvp_jv *list, kvp_jv *v);
/* Sets (or replaces) key in a dict; keys keep their first insertion's order. */
int kvp_jv_set(kvp_jarena *a, kvp_jv *dict, const char *key, kvp_jv *v);

/* Parses a template; NULL with a message ("line N: ...") in err on a syntax error. */
kvp_jinja *kvp_jinja_parse(const char *src, size_t len, char *err, size_t errlen);
void kvp_jinja_free(kvp_jinja *t);

/* Renders with the variables of `vars` (a dict). *out (NUL-terminated, malloc'd) and,
 * when mask is not NULL, *mask (malloc'd, one byte per output byte: 1 where the byte came
 * from the caller's data). Returns the output length, or -1 with err set ("line N: ...").
 * lim may be NULL. */
long kvp_jinja_render(const kvp_jinja *t, kvp_jarena *a, const kvp_jv *vars,
                      const kvp_jinja_limits *lim, char **out, unsigned char **mask,
                      char *err, size_t errlen);

#endif
