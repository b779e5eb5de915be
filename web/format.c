/* response_format to a grammar (web/format.h). */
#include "web/format.h"

#include <stdio.h>
#include <string.h>

#include "model/schema.h"

static int bad(const char **param, const char *p, char *msg, size_t len, const char *text)
{
    *param = p;
    snprintf(msg, len, "%s", text);
    return -1;
}

int kvpd_response_format(const json_t *rf, kvp_grammar **out, const char **param, char *msg,
                         size_t msglen)
{
    *out = NULL;
    if (!rf || json_is_null(rf))
        return 0;
    if (!json_is_object(rf))
        return bad(param, "response_format", msg, msglen, "response_format must be an object");
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!type)
        return bad(param, "response_format.type", msg, msglen,
                   "response_format.type must be text, json_object or json_schema");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)rf, k, v)
        if (strcmp(k, "type") && (strcmp(type, "json_schema") || strcmp(k, "json_schema")) &&
            (strcmp(type, "json_object") || strcmp(k, "schema"))) {
            *param = "response_format";
            snprintf(msg, msglen, "response_format.%s is not supported", k);
            return -1;
        }
    char err[320];
    if (!strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object")) {
        /* llama.cpp's server's form: json_object with a schema is that schema's documents */
        const json_t *schema = json_object_get(rf, "schema");
        if (schema && !json_is_null(schema)) {
            if (!(*out = kvp_schema_compile(schema, err, sizeof err))) {
                *param = "response_format.schema";
                snprintf(msg, msglen, "response_format.schema: %s", err);
                return -1;
            }
            return 0;
        }
        if (!(*out = kvp_schema_any_object(err, sizeof err)))
            return bad(param, "response_format", msg, msglen, err);
        return 0;
    }
    if (strcmp(type, "json_schema"))
        return bad(param, "response_format.type", msg, msglen,
                   "response_format.type must be text, json_object or json_schema");
    const json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return bad(param, "response_format.json_schema", msg, msglen,
                   "response_format.json_schema must be an object with a name and a schema");
    json_object_foreach((json_t *)js, k, v) {
        static const char *const ok[] = {"name", "schema", "strict", "description"};
        int known = 0;
        for (int i = 0; i < 4; i++)
            known |= !strcmp(k, ok[i]);
        if (!known) {
            *param = "response_format.json_schema";
            snprintf(msg, msglen, "response_format.json_schema.%s is not supported", k);
            return -1;
        }
    }
    const json_t *name = json_object_get(js, "name");
    if (!json_is_string(name) || json_string_length(name) == 0 || json_string_length(name) > 64)
        return bad(param, "response_format.json_schema.name", msg, msglen,
                   "response_format.json_schema.name must be a string of 1 to 64 characters");
    const json_t *strict = json_object_get(js, "strict");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return bad(param, "response_format.json_schema.strict", msg, msglen,
                   "response_format.json_schema.strict must be a boolean");
    const json_t *schema = json_object_get(js, "schema");
    if (!schema)
        return bad(param, "response_format.json_schema.schema", msg, msglen,
                   "response_format.json_schema.schema is required");
    /* strict or not, the grammar writes only documents that validate */
    if (!(*out = kvp_schema_compile(schema, err, sizeof err))) {
        *param = "response_format.json_schema.schema";
        snprintf(msg, msglen, "response_format.json_schema.schema: %s", err);
        return -1;
    }
    return 0;
}
