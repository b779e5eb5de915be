/* response_format to a grammar (web/format.h). */
#include "web/format.h"

#include <stdio.h>
#include <string.h>

#include "model/schema.h"
#include "web/oai_error.h"

static int bad(char *param, size_t plen, const char *p, char *msg, size_t len, const char *text)
{
    snprintf(param, plen, "%s", p);
    snprintf(msg, len, "%s", text);
    return -1;
}

/* An unknown key of obj (at its path `at`) refused: KVPD_FORMAT_UNKNOWN, else 0. */
static int keys(const json_t *obj, const char *at, const char *const *known, char *param,
                size_t plen, char *msg, size_t msglen)
{
    const char *k = kvpd_oai_unknown_key(obj, known);
    if (!k)
        return 0;
    kvpd_oai_unknown_at(param, plen, msg, msglen, at, k);
    return KVPD_FORMAT_UNKNOWN;
}

int kvpd_response_format(const json_t *rf, kvp_grammar **out, char *param, size_t paramlen,
                         char *msg, size_t msglen)
{
    /* The keys of each type: OpenAI's ({type}, {type, json_schema}) and, for json_object,
     * llama.cpp's server's `schema` */
    static const char *const text_keys[] = {"type", NULL};
    static const char *const object_keys[] = {"type", "schema", NULL};
    static const char *const schema_keys[] = {"type", "json_schema", NULL};
    static const char *const js_keys[] = {"name", "description", "schema", "strict", NULL};
    *out = NULL;
    if (!rf || json_is_null(rf))
        return 0;
    if (!json_is_object(rf))
        return bad(param, paramlen, "response_format", msg, msglen,
                   "response_format must be an object");
    const char *type = json_string_value(json_object_get(rf, "type"));
    const char *const *known = !type ? NULL : !strcmp(type, "text") ? text_keys
                             : !strcmp(type, "json_object") ? object_keys
                             : !strcmp(type, "json_schema") ? schema_keys : NULL;
    if (!known)
        return bad(param, paramlen, "response_format.type", msg, msglen,
                   "response_format.type must be text, json_object or json_schema");
    int rc = keys(rf, "response_format", known, param, paramlen, msg, msglen);
    if (rc < 0)
        return rc;
    char err[320];
    if (!strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object")) {
        /* llama.cpp's server's form: json_object with a schema is that schema's documents */
        const json_t *schema = json_object_get(rf, "schema");
        if (schema && !json_is_null(schema)) {
            if (!(*out = kvp_schema_compile(schema, err, sizeof err))) {
                snprintf(param, paramlen, "response_format.schema");
                snprintf(msg, msglen, "response_format.schema: %s", err);
                return -1;
            }
            return 0;
        }
        if (!(*out = kvp_schema_any_object(err, sizeof err)))
            return bad(param, paramlen, "response_format", msg, msglen, err);
        return 0;
    }
    const json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return bad(param, paramlen, "response_format.json_schema", msg, msglen,
                   "response_format.json_schema must be an object with a name and a schema");
    if ((rc = keys(js, "response_format.json_schema", js_keys, param, paramlen, msg, msglen)) < 0)
        return rc;
    const json_t *name = json_object_get(js, "name");
    if (!json_is_string(name) || json_string_length(name) == 0 || json_string_length(name) > 64)
        return bad(param, paramlen, "response_format.json_schema.name", msg, msglen,
                   "response_format.json_schema.name must be a string of 1 to 64 characters");
    const json_t *desc = json_object_get(js, "description");
    if (desc && !json_is_string(desc) && !json_is_null(desc))
        return bad(param, paramlen, "response_format.json_schema.description", msg, msglen,
                   "response_format.json_schema.description must be a string");
    const json_t *strict = json_object_get(js, "strict");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return bad(param, paramlen, "response_format.json_schema.strict", msg, msglen,
                   "response_format.json_schema.strict must be a boolean");
    const json_t *schema = json_object_get(js, "schema");
    if (!schema)
        return bad(param, paramlen, "response_format.json_schema.schema", msg, msglen,
                   "response_format.json_schema.schema is required");
    /* strict or not, the grammar writes only documents that validate */
    if (!(*out = kvp_schema_compile(schema, err, sizeof err))) {
        snprintf(param, paramlen, "response_format.json_schema.schema");
        snprintf(msg, msglen, "response_format.json_schema.schema: %s", err);
        return -1;
    }
    return 0;
}
