/* A JSON value (jansson) as a Jinja template value (model/jinja.h): null, booleans,
 * numbers, strings, arrays and objects as none, bool, int/float, string, list and dict,
 * object keys in their order. Strings are the caller's data (kvp_jv_str), never the
 * template's. */
#ifndef KVP_JINJA_JSON_H
#define KVP_JINJA_JSON_H

#include <jansson.h>

#include "model/jinja.h"

/* The value in a's memory; NULL when nested deeper than 64 levels or out of memory. */
kvp_jv *kvp_jv_from_json(kvp_jarena *a, json_t *j);

#endif
