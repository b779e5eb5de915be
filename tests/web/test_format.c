/* web/format.c: response_format as a grammar: none for text, any JSON object for
 * json_object, the schema's documents for json_schema; every malformed field named. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "model/grammar.h"
#include "web/format.h"
#include "tests/model/testutil.h"

static kvp_grammar *parsed(const char *rf_text)
{
    json_t *rf = json_loads(rf_text, JSON_DECODE_ANY, NULL);
    cr_assert(rf, "%s", rf_text);
    kvp_grammar *g = (kvp_grammar *)1;
    char param[96] = "", msg[512] = "";
    int rc = kvpd_response_format(rf, &g, param, sizeof param, msg, sizeof msg);
    json_decref(rf);
    cr_assert_eq(rc, 0, "%s refused: %s: %s", rf_text, param, msg);
    return g;
}

/* rc_want: -1 (a value refused) or KVPD_FORMAT_UNKNOWN (a key the object has not). */
static void refused_as(const char *rf_text, int rc_want, const char *param_want, const char *want)
{
    json_t *rf = json_loads(rf_text, JSON_DECODE_ANY, NULL);
    cr_assert(rf, "%s", rf_text);
    kvp_grammar *g = (kvp_grammar *)1;
    char param[96] = "", msg[512] = "";
    cr_assert_eq(kvpd_response_format(rf, &g, param, sizeof param, msg, sizeof msg), rc_want,
                 "%s: %s", rf_text, msg);
    json_decref(rf);
    cr_assert_null(g, "no grammar is left on a refusal");
    cr_assert_str_eq(param, param_want, "%s: %s", rf_text, msg);
    cr_assert(strstr(msg, want), "%s: wanted \"%s\" in \"%s\"", rf_text, want, msg);
}

static void refused(const char *rf_text, const char *param_want, const char *want)
{
    refused_as(rf_text, -1, param_want, want);
}

/* An unknown key: refused naming its whole path, in the message too. */
static void unknown(const char *rf_text, const char *path)
{
    refused_as(rf_text, KVPD_FORMAT_UNKNOWN, path, path);
}

Test(format, text_and_absent_need_no_grammar)
{
    cr_assert_null(parsed("{\"type\":\"text\"}"));
    cr_assert_null(parsed("null"));
    kvp_grammar *g = (kvp_grammar *)1;
    char param[96], msg[64];
    cr_assert_eq(kvpd_response_format(NULL, &g, param, sizeof param, msg, sizeof msg), 0);
    cr_assert_null(g);
}

Test(format, json_object_takes_any_object_only)
{
    kvp_grammar *g = parsed("{\"type\":\"json_object\"}");
    cr_assert_not_null(g);
    cr_assert(tu_grammar_whole(g, "{}"));
    cr_assert(tu_grammar_whole(g, "{\"a\": [1, \"x\", {\"b\": null}]}"));
    cr_assert_not(tu_grammar_whole(g, "[1]"));
    cr_assert_not(tu_grammar_whole(g, "\"text\""));
    cr_assert_not(tu_grammar_whole(g, "{\"a\": }"));
    kvp_grammar_unref(g);
}

Test(format, json_schema_takes_its_documents)
{
    kvp_grammar *g = parsed(
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\",\"strict\":true,"
        "\"description\":\"d\",\"schema\":{\"type\":\"object\",\"properties\":{\"age\":"
        "{\"type\":\"integer\"}},\"required\":[\"age\"],\"additionalProperties\":false}}}");
    cr_assert_not_null(g);
    cr_assert(tu_grammar_whole(g, "{\"age\": 7}") || tu_grammar_whole(g, "{\"age\":7}"));
    cr_assert_not(tu_grammar_whole(g, "{}"), "age is required");
    cr_assert_not(tu_grammar_whole(g, "{\"age\": \"7\"}"));
    cr_assert_not(tu_grammar_whole(g, "{\"name\": \"x\"}"));
    kvp_grammar_unref(g);
    /* strict null is allowed */
    g = parsed("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":null,"
               "\"schema\":{\"type\":\"boolean\"}}}");
    cr_assert(tu_grammar_whole(g, "true"));
    cr_assert_not(tu_grammar_whole(g, "1"));
    kvp_grammar_unref(g);
}

/* llama.cpp's server's json_object with a schema beside the type: that schema's documents */
Test(format, json_object_with_a_schema_takes_its_documents)
{
    kvp_grammar *g = parsed("{\"type\":\"json_object\",\"schema\":{\"type\":\"object\","
                            "\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"],"
                            "\"additionalProperties\":false}}");
    cr_assert_not_null(g);
    cr_assert(tu_grammar_whole(g, "{\"n\": 3}") || tu_grammar_whole(g, "{\"n\":3}"));
    cr_assert_not(tu_grammar_whole(g, "{}"), "n is required");
    cr_assert_not(tu_grammar_whole(g, "{\"a\": 1}"));
    kvp_grammar_unref(g);
    g = parsed("{\"type\":\"json_object\",\"schema\":{\"const\":\"42\"}}");
    cr_assert(tu_grammar_whole(g, "\"42\""));
    cr_assert_not(tu_grammar_whole(g, "{}"), "the schema's documents, not any object");
    kvp_grammar_unref(g);
    /* null: any object, as without it */
    g = parsed("{\"type\":\"json_object\",\"schema\":null}");
    cr_assert(tu_grammar_whole(g, "{}"));
    kvp_grammar_unref(g);
    refused("{\"type\":\"json_object\",\"schema\":123}", "response_format.schema",
            "response_format.schema: ");
    refused("{\"type\":\"json_object\",\"schema\":{\"type\":\"hiccup\"}}",
            "response_format.schema", "response_format.schema: ");
    unknown("{\"type\":\"text\",\"schema\":{}}", "response_format.schema");
}

Test(format, malformed_formats_are_named)
{
    refused("[]", "response_format", "must be an object");
    refused("{}", "response_format.type", "text, json_object or json_schema");
    refused("{\"type\":\"yaml\"}", "response_format.type", "text, json_object or json_schema");
    unknown("{\"type\":\"text\",\"extra\":1}", "response_format.extra");
    unknown("{\"type\":\"json_object\",\"json_schema\":{}}", "response_format.json_schema");
    refused("{\"type\":\"json_schema\"}", "response_format.json_schema", "must be an object");
    unknown("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{},"
            "\"x\":1}}", "response_format.json_schema.x");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}",
            "response_format.json_schema.name", "1 to 64 characters");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"\",\"schema\":{}}}",
            "response_format.json_schema.name", "1 to 64 characters");
    char longname[256];
    snprintf(longname, sizeof longname, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":"
             "\"%065d\",\"schema\":{}}}", 0);
    refused(longname, "response_format.json_schema.name", "1 to 64 characters");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":\"yes\","
            "\"schema\":{}}}", "response_format.json_schema.strict", "must be a boolean");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}",
            "response_format.json_schema.schema", "is required");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
            "{\"type\":\"integer\",\"minimum\":\"x\"}}}", "response_format.json_schema.schema",
            "response_format.json_schema.schema: ");
}

/* The keys OpenAI's API defines for each format pass, in the shapes the SDK helpers send
 * (openai's zodResponseFormat: name, strict, schema; the AI SDK and LangChain add
 * description, possibly null); any other key is refused by its whole path, at either
 * level, and so is a key of another format's type; a wrong type is refused by name. */
Test(format, the_keys_of_each_format_are_checked)
{
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                         "\"required\":[\"a\"],\"additionalProperties\":false}";
    char rf[512];
    snprintf(rf, sizeof rf, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\","
             "\"strict\":true,\"schema\":%s}}", schema);
    kvp_grammar *g = parsed(rf);
    cr_assert(tu_grammar_whole(g, "{\"a\": 1}"));
    kvp_grammar_unref(g);
    snprintf(rf, sizeof rf, "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":%s,"
             "\"strict\":false,\"name\":\"response\",\"description\":\"a person\"}}", schema);
    kvp_grammar_unref(parsed(rf));
    snprintf(rf, sizeof rf, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"r\","
             "\"description\":null,\"strict\":null,\"schema\":%s}}", schema);
    kvp_grammar_unref(parsed(rf));
    kvp_grammar_unref(parsed("{\"type\":\"json_object\"}"));
    /* unknown keys: beside the type, inside json_schema, another type's key */
    unknown("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{}},"
            "\"strict\":true}", "response_format.strict");
    unknown("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{},"
            "\"Strict\":true}}", "response_format.json_schema.Strict");
    unknown("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{}},"
            "\"schema\":{}}", "response_format.schema");
    unknown("{\"type\":\"text\",\"json_schema\":{\"name\":\"n\",\"schema\":{}}}",
            "response_format.json_schema");
    /* wrong types */
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"name\":5,\"schema\":{}}}",
            "response_format.json_schema.name", "must be a string");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"description\":[],"
            "\"schema\":{}}}", "response_format.json_schema.description", "must be a string");
    refused("{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":1,"
            "\"schema\":{}}}", "response_format.json_schema.strict", "must be a boolean");
    refused("{\"type\":5}", "response_format.type", "text, json_object or json_schema");
}
