/* OpenAI's response_format (web/openai.c): {type: text}, {type: json_object} (any JSON
 * object; with llama.cpp's server's `schema` beside the type, that schema's documents)
 * and {type: json_schema, json_schema: {name, schema, strict, description}} (the
 * documents valid against schema, model/schema.h) as a grammar for the turn. */
#ifndef KVPD_FORMAT_H
#define KVPD_FORMAT_H

#include <stddef.h>

#include <jansson.h>

struct kvp_grammar;

/* rf: the request's response_format (NULL or null: text). 0 with *out the grammar (NULL
 * for text; the caller unrefs it), or with param the offending field's path and a
 * message naming what was refused in msg: KVPD_FORMAT_UNKNOWN for a key the object has
 * not (OpenAI's unknown_parameter: kvpd_oai_unknown_at's param and message), -1 for a
 * value refused. */
#define KVPD_FORMAT_UNKNOWN (-2)
int kvpd_response_format(const json_t *rf, struct kvp_grammar **out, char *param,
                         size_t paramlen, char *msg, size_t msglen);

#endif
