/* JSON Schema to grammar (model/grammar.h) for structured output: the grammar's documents
 * are JSON texts that validate against the schema. Supported: type (object, array,
 * string, number, integer, boolean, null, and lists of them), properties, required,
 * additionalProperties, items, enum, const, anyOf and oneOf (both as anyOf), allOf of one
 * schema, minLength/maxLength, minItems/maxItems, minimum/maximum/exclusiveMinimum/
 * exclusiveMaximum (integers exactly; numbers with integer bounds), pattern (a regex
 * subset), $ref into the same document ($defs, definitions, any JSON pointer; recursion
 * through objects and arrays), and the annotations (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly). Anything else is
 * refused naming the keyword.
 *
 * What the grammar writes (a subset of what validates, so every document it allows is
 * valid): an object's properties in the order the schema lists them, only those listed
 * (additionalProperties absent or true adds none; a schema there with no properties is a
 * map of any keys); whitespace between tokens bounded (nothing, one space, or a newline
 * and up to 20 spaces or tabs); unbounded integers and numbers at most 16 digits before
 * and after the point; no whitespace before or after the document.
 *
 * Costs are bounded: a schema over KVP_SCHEMA_MAX_BYTES serialized, nesting deeper than
 * KVP_SCHEMA_MAX_DEPTH, counts above KVP_SCHEMA_MAX_REPEAT, an enum or anyOf of more than
 * KVP_SCHEMA_MAX_ALTERNATIVES, or a grammar over KVP_GRAMMAR_MAX_STATES states,
 * KVP_GRAMMAR_MAX_ARCS arcs or KVP_GRAMMAR_MAX_FANOUT arcs out of one state is refused,
 * the message naming the bound. */
#ifndef KVP_SCHEMA_H
#define KVP_SCHEMA_H

#include <stddef.h>

#include <jansson.h>

#include "model/grammar.h"

#define KVP_SCHEMA_MAX_BYTES (64 * 1024)
#define KVP_SCHEMA_MAX_DEPTH 32
#define KVP_SCHEMA_MAX_REPEAT 4096   /* maxLength, maxItems, {n,m} in a pattern */
#define KVP_SCHEMA_MAX_ALTERNATIVES 1024   /* values of an enum, schemas of an anyOf */

/* The grammar of the documents valid against schema (an object or a boolean), or NULL
 * with a message in err naming the keyword and where it is ("format is not supported at
 * /properties/when"). */
kvp_grammar *kvp_schema_compile(const json_t *schema, char *err, size_t errlen);

/* Any JSON object (response_format json_object). */
kvp_grammar *kvp_schema_any_object(char *err, size_t errlen);

/* A function a call may name: its name and its parameters' schema (NULL: any object). */
typedef struct kvp_schema_fn {
    const char *name;
    const json_t *parameters;
} kvp_schema_fn;

/* The documents `prefix {"name": NAME, "arguments": ARGS} suffix` for one of fns[0..n)
 * (NAME the function's name, ARGS an object valid against its parameters), whitespace
 * between tokens as above; prefix and suffix (NULL: none) are written as given, e.g.
 * "<tool_call>\n" and "\n</tool_call>". For n == 1 that is a named function; for a
 * `tool_choice: required` the list of all. NULL with err as kvp_schema_compile. */
kvp_grammar *kvp_schema_compile_calls(const kvp_schema_fn *fns, int n, const char *prefix,
                                      const char *suffix, char *err, size_t errlen);
/* As kvp_schema_compile_calls with the arguments under args_key (a format's, e.g.
 * "parameters" for Llama 3.1: model/toolcall.h kvp_toolcall_frame), and the frame around
 * the arguments spaced exactly as kvp_toolcall_write writes it (`{"name": "N", "KEY": `
 * ARGS `}`; whitespace is free only inside ARGS), so a call sent back in the history
 * renders to the bytes the reply holds. */
kvp_grammar *kvp_schema_compile_calls_as(const kvp_schema_fn *fns, int n, const char *prefix,
                                         const char *args_key, const char *suffix, char *err,
                                         size_t errlen);
/* One to max_calls (at most 64) such calls, `between` (NULL: nothing) written between
 * two: parallel tool calls, e.g. between "\n". */
kvp_grammar *kvp_schema_compile_call_list(const kvp_schema_fn *fns, int n, const char *prefix,
                                          const char *suffix, const char *between,
                                          int max_calls, char *err, size_t errlen);

#endif
