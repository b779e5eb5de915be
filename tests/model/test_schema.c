/* model/schema.c: schemas compiled to grammars accept the documents that validate and
 * refuse the others; hostile schemas get an error naming the keyword or the limit. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/schema.h"
#include "tests/model/testutil.h"
#include "model/toolcall.h"

static kvp_grammar *compile(const char *schema)
{
    json_error_t je;
    json_t *s = json_loads(schema, JSON_DECODE_ANY, &je);
    cr_assert(s, "bad test schema: %s", je.text);
    char err[256];
    kvp_grammar *g = kvp_schema_compile(s, err, sizeof err);
    json_decref(s);
    cr_assert(g, "compile failed: %s", err);
    return g;
}

/* The error compiling schema gives (the grammar must fail). */
static const char *refuse(const char *schema)
{
    static char err[256];
    json_error_t je;
    json_t *s = json_loads(schema, JSON_DECODE_ANY, &je);
    cr_assert(s, "bad test schema: %s", je.text);
    kvp_grammar *g = kvp_schema_compile(s, err, sizeof err);
    json_decref(s);
    cr_assert_null(g, "schema %s compiled", schema);
    cr_assert(err[0]);
    return err;
}

static void check(const char *schema, const char *const *good, const char *const *bad)
{
    kvp_grammar *g = compile(schema);
    for (; good && *good; good++)
        cr_expect(tu_grammar_whole(g, *good), "%s should accept %s", schema, *good);
    for (; bad && *bad; bad++)
        cr_expect(!tu_grammar_whole(g, *bad), "%s should refuse %s", schema, *bad);
    kvp_grammar_unref(g);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

Test(schema, object_properties_in_order_required_and_optional)
{
    check("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
          "\"b\":{\"type\":\"string\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}",
          L("{\"b\":\"x\"}", "{\"a\":1,\"b\":\"\"}", "{\"a\": -3, \"b\": \"q\", \"c\": true}",
            "{\n  \"b\":\"x\",\n  \"c\":false\n}", "{ \"b\" : \"x\" }"),
          L("{}", "{\"a\":1}", "{\"b\":\"x\",\"a\":1}", "{\"b\":\"x\",\"d\":1}",
            "{\"b\":1}", "{\"b\":\"x\",}", "{\"b\":\"x\"", "{\"b\":\"x\"} ", " {\"b\":\"x\"}",
            "{\"b\":\"x\",\"c\":null}"));
}

Test(schema, additional_false_and_nested)
{
    check("{\"type\":\"object\",\"additionalProperties\":false,\"properties\":{\"p\":{\"type\":"
          "\"object\",\"properties\":{\"q\":{\"type\":\"array\",\"items\":{\"type\":\"null\"}}},"
          "\"required\":[\"q\"]}},\"required\":[\"p\"]}",
          L("{\"p\":{\"q\":[]}}", "{\"p\":{\"q\":[null, null]}}"),
          L("{\"p\":{}}", "{\"p\":{\"q\":[0]}}", "{\"p\":{\"q\":[null,]}}"));
}

Test(schema, map_and_any_object)
{
    check("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
          L("{}", "{\"x\":1,\"y\":-2}"), L("{\"x\":\"1\"}", "[]"));
    char err[128];
    kvp_grammar *g = kvp_schema_any_object(err, sizeof err);
    cr_assert(g, "%s", err);
    cr_expect(tu_grammar_whole(g, "{\"a\":[1,{\"b\":null},\"s\\n\"],\"c\":{}}"));
    cr_expect(tu_grammar_whole(g, "{}"));
    cr_expect(!tu_grammar_whole(g, "[]"));
    cr_expect(!tu_grammar_whole(g, "\"s\""));
    cr_expect(!tu_grammar_whole(g, "{\"a\":}"));
    cr_expect(!tu_grammar_whole(g, "{\"a\":tru}"));
    kvp_grammar_unref(g);
}

Test(schema, integer_ranges_exact)
{
    check("{\"type\":\"integer\",\"minimum\":-12,\"maximum\":345}",
          L("-12", "-1", "0", "7", "99", "100", "299", "345", "-10"),
          L("-13", "-0", "346", "350", "400", "1000", "01", "", "3.0", "+1", "-"));
    check("{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}",
          L("1", "9"), L("0", "10", "-1"));
    check("{\"type\":\"integer\",\"minimum\":1000}", L("1000", "123456789"), L("999", "-5"));
    check("{\"type\":\"integer\",\"maximum\":-5}", L("-5", "-123"), L("-4", "0", "5"));
    check("{\"type\":\"integer\"}", L("0", "-9999999999999999", "42"),
          L("00", "12345678901234567", "1e3"));
    /* every value of a small range, and its neighbours */
    kvp_grammar *g = compile("{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1203}");
    for (int v = -60; v < 1300; v++) {
        char s[16];
        snprintf(s, sizeof s, "%d", v);
        cr_expect_eq(tu_grammar_whole(g, s), v >= -37 && v <= 1203, "%d", v);
    }
    kvp_grammar_unref(g);
}

Test(schema, number_bounds)
{
    check("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
          L("0", "0.5", "1", "1.0", "1.000", "0.999", "0.0"),
          L("1.5", "1.01", "-0.1", "2", "-1", ".5"));
    check("{\"type\":\"number\",\"minimum\":-2,\"exclusiveMaximum\":1}",
          L("-2", "-1.5", "0.25", "0.999"), L("1", "1.0", "-2.5", "-2.1", "-3"));
    check("{\"type\":\"number\",\"exclusiveMinimum\":0}", L("0.1", "3", "0.001"),
          L("0", "0.0", "-1"));
    check("{\"type\":\"number\"}", L("0", "-1.5", "2e10", "3.25E-7", "12", "9e99", "1e-99"),
          L("1.", "01", "e1", "--1", "1e"));
    /* an exponent of two digits at most: every value is finite as a double */
    check("{\"type\":\"number\"}", L("20.0129e+60"), L("20.0129e+607", "1e999", "1e-400"));
    cr_expect(strstr(refuse("{\"type\":\"number\",\"minimum\":0.5}"), "minimum"));
}

/* Bounds are exact past 2^53 (jansson keeps integers as written), float bounds round to
 * the integers inside them, and under bounds a number has at most 15 significant digits,
 * so a reader that parses it to a double sees it inside the bounds too. */
Test(schema, bounds_are_exact_beyond_2_53)
{
    check("{\"type\":\"integer\",\"minimum\":1152921504606846977,"
          "\"maximum\":1152921504606846977}",
          L("1152921504606846977"), L("1152921504606846976", "1152921504606846978", "0"));
    check("{\"type\":\"number\",\"minimum\":1152921504606846977,"
          "\"maximum\":1152921504606846977}",
          L("1152921504606846977"),
          L("1152921504606846976", "1152921504606846978", "1152921504606846977.0"));
    check("{\"type\":\"integer\",\"exclusiveMinimum\":9007199254740993,"
          "\"exclusiveMaximum\":9007199254740996}",
          L("9007199254740994", "9007199254740995"), L("9007199254740993", "9007199254740996"));
    check("{\"type\":\"integer\",\"maximum\":-9007199254740993}",
          L("-9007199254740993", "-9007199254740999"), L("-9007199254740992", "0"));
    check("{\"type\":\"number\",\"exclusiveMinimum\":9007199254740993,"
          "\"maximum\":9007199254740995}",
          L("9007199254740994", "9007199254740995"),
          L("9007199254740993", "9007199254740993.5", "9007199254740994.5"));
    /* float bounds: the integers inside them; a whole float is an integer bound */
    check("{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":5.5}", L("3", "5"),
          L("2", "6"));
    check("{\"type\":\"integer\",\"exclusiveMinimum\":2.5,\"exclusiveMaximum\":5.0}",
          L("3", "4"), L("2", "5"));
    check("{\"type\":\"integer\",\"minimum\":1.0e18}", L("1000000000000000000"),
          L("999999999999999999"));
    check("{\"type\":\"number\",\"minimum\":-2.0,\"exclusiveMaximum\":1.0}",
          L("-2", "0.5"), L("1", "-2.5"));
    /* negative zero is zero */
    check("{\"type\":\"integer\",\"minimum\":-0.0,\"maximum\":0}", L("0"), L("-0", "1", "-1"));
    check("{\"type\":\"number\",\"minimum\":-0.0,\"maximum\":1}", L("0", "0.5", "1"),
          L("-1", "-0.5"));
    /* draft 4: a boolean beside the bound */
    check("{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":true,\"maximum\":7,"
          "\"exclusiveMaximum\":false}", L("6", "7"), L("5", "8"));
    /* the tighter of the two keywords */
    check("{\"type\":\"integer\",\"minimum\":3,\"exclusiveMinimum\":3,\"maximum\":9,"
          "\"exclusiveMaximum\":20}", L("4", "9"), L("3", "10"));
    /* 15 significant digits: a fraction that a double would round onto the bound is out */
    check("{\"type\":\"number\",\"minimum\":0,\"exclusiveMaximum\":10}",
          L("9.99999999999999", "0.00000000000001"),
          L("9.99999999999999999", "9.999999999999999", "10"));
    /* refusals name the keywords */
    cr_expect(strstr(refuse("{\"type\":\"integer\",\"exclusiveMinimum\":5,"
                            "\"exclusiveMaximum\":6}"),
                     "exclusiveMinimum is above exclusiveMaximum"), "%s",
              refuse("{\"type\":\"integer\",\"exclusiveMinimum\":5,\"exclusiveMaximum\":6}"));
    cr_expect(strstr(refuse("{\"type\":\"number\",\"minimum\":7,\"maximum\":6}"),
                     "minimum is above maximum"));
    cr_expect(strstr(refuse("{\"type\":\"integer\",\"minimum\":9200000000000000000}"),
                     "minimum beyond 9e18"));
    cr_expect(strstr(refuse("{\"type\":\"integer\",\"maximum\":-1.5e19}"),
                     "maximum beyond 9e18"));
    cr_expect(strstr(refuse("{\"type\":\"number\",\"maximum\":2.5}"), "maximum"));
    cr_expect(strstr(refuse("{\"type\":\"number\",\"exclusiveMinimum\":\"1\"}"),
                     "exclusiveMinimum must be a number"));
}

Test(schema, strings_lengths_and_escapes)
{
    check("{\"type\":\"string\",\"minLength\":1,\"maxLength\":3}",
          L("\"a\"", "\"abc\"", "\"\\u00e9b\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"",
            "\"\\\"\\\\\\n\""),
          L("\"\"", "\"abcd\"", "\"a\nb\"", "\"\\x\"", "\"\\ud800\"", "\"\xc3\"", "\"\xed\xa0\x80\"",
            "abc"));
    check("{\"type\":\"string\"}", L("\"\"", "\"any \\\" text\""), L("\"\x01\""));
}

Test(schema, enum_const_types_anyof)
{
    check("{\"enum\":[\"red\",\"green\",3,null,{\"a\":1}]}",
          L("\"red\"", "\"green\"", "3", "null", "{\"a\":1}"), L("\"blue\"", "4", "\"re\""));
    check("{\"const\":\"x\"}", L("\"x\""), L("\"y\""));
    check("{\"type\":[\"integer\",\"null\"],\"maximum\":3}", L("3", "null", "-1"), L("4", "\"3\""));
    check("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"boolean\"}]}",
          L("\"a\"", "true"), L("\"ab\"", "1"));
    check("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"type\":\"integer\"},"
          "\"minItems\":1,\"maxItems\":2}]}",
          L("5", "[1]", "[1, 2]"), L("[]", "[1,2,3]"));
}

/* oneOf holds when exactly one alternative does: taken only when no document can hold
 * under two alternatives, else refused naming them. */
Test(schema, one_of_only_with_alternatives_apart)
{
    /* apart by type, by values, by a required tag */
    check("{\"oneOf\":[{\"type\":\"string\"},{\"type\":[\"integer\",\"null\"]}]}",
          L("\"a\"", "3", "null"), L("true"));
    check("{\"oneOf\":[{\"enum\":[1,\"a\"]},{\"const\":2},{\"enum\":[\"b\",null]}]}",
          L("1", "2", "\"b\"", "null"), L("3"));
    check("{\"$defs\":{\"cat\":{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":"
          "\"cat\"},\"lives\":{\"type\":\"integer\"}},\"required\":[\"kind\"]},"
          "\"dog\":{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"dog\"]},"
          "\"good\":{\"type\":\"boolean\"}},\"required\":[\"kind\",\"good\"]}},"
          "\"oneOf\":[{\"$ref\":\"#/$defs/cat\"},{\"$ref\":\"#/$defs/dog\"}]}",
          L("{\"kind\":\"cat\"}", "{\"kind\":\"dog\",\"good\":true}"),
          L("{\"kind\":\"dog\"}", "{}"));
    /* alternatives that may both hold */
    cr_expect(strstr(refuse("{\"oneOf\":[{\"type\":\"integer\",\"minimum\":44},"
                            "{\"type\":\"integer\"}]}"),
                     "oneOf: alternatives 0 and 1 may both hold"));
    cr_expect(strstr(refuse("{\"oneOf\":[{\"type\":\"number\"},{\"const\":1}]}"),
                     "alternatives 0 and 1"));
    cr_expect(strstr(refuse("{\"oneOf\":[{\"enum\":[1,2]},{\"enum\":[3,2.0]}]}"),
                     "alternatives 0 and 1"));
    cr_expect(strstr(refuse("{\"oneOf\":[{\"type\":\"string\"},{}]}"), "alternatives 0 and 1"));
    cr_expect(strstr(refuse("{\"type\":\"object\",\"properties\":{\"p\":{\"oneOf\":["
                            "{\"type\":\"null\"},{\"type\":\"object\"},{\"type\":\"object\","
                            "\"properties\":{\"a\":{\"const\":1}}}]}}}"),
                     "alternatives 1 and 2 may both hold for one document"));
}

Test(schema, arrays_counts)
{
    check("{\"type\":\"array\",\"items\":{\"enum\":[1,2]},\"minItems\":2}",
          L("[1,2]", "[1,1,2,2,1]", "[ 1 , 2 ]"), L("[]", "[1]", "[1,3]", "[1,2,]"));
    check("{\"type\":\"array\",\"maxItems\":0}", L("[]"), L("[1]"));
    check("{\"type\":\"array\"}", L("[]", "[1,\"a\",[null]]"), L("[,]"));
}

Test(schema, refs_and_recursion)
{
    check("{\"$defs\":{\"n\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}},"
          "\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/n\"},"
          "\"y\":{\"$ref\":\"#/$defs/n\"}},\"required\":[\"x\",\"y\"]}",
          L("{\"x\":1,\"y\":9}"), L("{\"x\":10,\"y\":1}"));
    const char *tree = "{\"definitions\":{\"t\":{\"type\":\"object\",\"properties\":{"
                       "\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":"
                       "{\"$ref\":\"#/definitions/t\"}}},\"required\":[\"v\"]}},"
                       "\"$ref\":\"#/definitions/t\"}";
    check(tree, L("{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}"),
          L("{\"v\":1,\"kids\":[{}]}", "{\"kids\":[]}"));
    cr_expect(strstr(refuse("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}"),
                     "$ref"));
    cr_expect(strstr(refuse("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}"), "$ref"));
    cr_expect(strstr(refuse("{\"$ref\":\"#/$defs/missing\"}"), "$ref"));
    /* a required property that must hold the object itself: no finite document */
    cr_expect(strstr(refuse("{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#\"}},"
                            "\"required\":[\"x\"]}"), "no finite document"));
    /* optional, it is fine, and the endless branch of an anyOf is dropped */
    check("{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#\"}}}",
          L("{}", "{\"x\":{\"x\":{}}}"), L("{\"x\":1}"));
    kvp_grammar *g = compile("{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\",\"items\":"
                             "{\"$ref\":\"#/anyOf/1\"},\"minItems\":1}]}");
    cr_expect(tu_grammar_whole(g, "null"));
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    cr_expect_eq(kvp_gmatch_accept(&m, "[", 1), -EINVAL, "the endless branch is not offered");
    kvp_gmatch_free(&m);
    kvp_grammar_unref(g);
    cr_expect(strstr(refuse("{\"$ref\":\"http://example.com/s.json\"}"), "$ref"));
}

Test(schema, patterns)
{
    check("{\"type\":\"string\",\"pattern\":\"^[a-z]{2,3}-\\\\d+$\"}",
          L("\"ab-1\"", "\"xyz-0123\""), L("\"a-1\"", "\"abcd-1\"", "\"ab-\"", "\"AB-1\""));
    check("{\"type\":\"string\",\"pattern\":\"^(cat|dog)s?$\"}", L("\"cat\"", "\"dogs\""),
          L("\"cow\"", "\"cats!\""));
    check("{\"type\":\"string\",\"pattern\":\"x\\\\.y\"}", L("\"x.y\"", "\"aax.ybb\""),
          L("\"xzy\"", "\"\""));
    check("{\"type\":\"string\",\"pattern\":\"^(a*|b)$\"}", L("\"aaa\"", "\"b\"", "\"\""),
          L("\"ab\"", "\"ba\""));
    check("{\"type\":\"string\",\"pattern\":\"^[^\\\"]+$\"}", L("\"abc\""), L("\"a\\\"b\""));
    cr_expect(strstr(refuse("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}"), "pattern"));
    cr_expect(strstr(refuse("{\"type\":\"string\",\"pattern\":\"(a*)*\"}"), "pattern"));
    cr_expect(strstr(refuse("{\"type\":\"string\",\"pattern\":\"(?=a)\"}"), "pattern"));
    cr_expect(strstr(refuse("{\"type\":\"string\",\"pattern\":\"[a\"}"), "pattern"));
    cr_expect(strstr(refuse("{\"type\":\"string\",\"pattern\":\"a{5000}\"}"), "pattern"));
}

Test(schema, whitespace_is_bounded)
{
    kvp_grammar *g = compile("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}");
    char doc[64];
    snprintf(doc, sizeof doc, "[\n%*s1]", 20, "");
    cr_expect(tu_grammar_whole(g, doc));
    snprintf(doc, sizeof doc, "[\n%*s1]", 21, "");
    cr_expect(!tu_grammar_whole(g, doc));
    cr_expect(!tu_grammar_whole(g, "[  1]"));
    cr_expect(!tu_grammar_whole(g, "[\n\n1]"));
    kvp_grammar_unref(g);
}

Test(schema, refused_keywords_are_named)
{
    cr_expect(strstr(refuse("{\"type\":\"string\",\"format\":\"date-time\"}"), "format"));
    cr_expect(strstr(refuse("{\"type\":\"integer\",\"multipleOf\":3}"), "multipleOf"));
    cr_expect(strstr(refuse("{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}"),
                     "not is not supported at /properties/a"));
    cr_expect(strstr(refuse("{\"type\":\"object\",\"required\":[\"z\"]}"), "required"));
    cr_expect(strstr(refuse("{\"type\":\"strin\"}"), "strin"));
    cr_expect(strstr(refuse("{\"type\":\"string\",\"maxLength\":1000000}"), "maxLength"));
    cr_expect(strstr(refuse("{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}"), "minLength"));
    cr_expect(strstr(refuse("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}"), "minimum"));
    cr_expect(strstr(refuse("{\"allOf\":[{},{}]}"), "allOf"));
    cr_expect(strstr(refuse("{\"enum\":[]}"), "enum"));
    cr_expect(strstr(refuse("false"), "false"));
    cr_expect(strstr(refuse("[1]"), "schema"));
    cr_expect(strstr(refuse("{\"type\":\"array\",\"prefixItems\":[{}]}"), "prefixItems"));
    /* the count keywords of strings and arrays: wrong type, negative, over the limit */
    cr_expect(strstr(refuse("{\"type\":\"string\",\"minLength\":-1}"),
                     "minLength must be a non-negative integer"));
    cr_expect(strstr(refuse("{\"type\":\"string\",\"maxLength\":\"3\"}"),
                     "maxLength must be a non-negative integer"));
    cr_expect(strstr(refuse("{\"type\":\"array\",\"minItems\":1.5}"),
                     "minItems must be a non-negative integer"));
    cr_expect(strstr(refuse("{\"type\":\"array\",\"maxItems\":1000000}"),
                     "maxItems above"));
    cr_expect(strstr(refuse("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}"),
                     "minItems is above maxItems"));
}

Test(schema, hostile_sizes_fail_fast)
{
    /* 100 KB of properties */
    size_t cap = 120 * 1024, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; n < 100 * 1024; i++)
        n += (size_t)snprintf(s + n, cap - n, "%s\"p%d\":{\"type\":\"string\"}", i ? "," : "", i);
    snprintf(s + n, cap - n, "}}");
    cr_expect(strstr(refuse(s), "bytes, over the limit"));
    /* nesting 200 deep */
    n = 0;
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"array\",\"items\":");
    n += (size_t)snprintf(s + n, cap - n, "{}");
    for (int i = 0; i < 200; i++)
        s[n++] = '}';
    s[n] = '\0';
    cr_expect(strstr(refuse(s), "deeper"));
    /* a shared schema is one rule however often it is used: this stays small */
    kvp_grammar *g = compile("{\"type\":\"array\",\"maxItems\":4096,\"items\":{\"type\":"
                             "\"array\",\"maxItems\":4096,\"items\":{\"type\":\"string\","
                             "\"maxLength\":4096}}}");
    cr_expect_lt(kvp_grammar_states(g), 300000);
    kvp_grammar_unref(g);
    /* distinct long strings add up: refused past the state limit */
    n = 0;
    n += (size_t)snprintf(s + n, cap - n, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(s + n, cap - n, "%s\"p%d\":{\"type\":\"string\",\"maxLength\":4096}",
                              i ? "," : "", i);
    snprintf(s + n, cap - n, "}}");
    cr_expect(strstr(refuse(s), "too large"));
    free(s);
}

/* Each bound on the grammar's size is named with its value when a schema passes it. */
Test(schema, grammar_size_bounds_are_named)
{
    char *s = malloc(70 * 1024), want[96];
    size_t n = 0;
    /* states: eight strings of 4096 characters */
    n += (size_t)sprintf(s + n, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 8; i++)
        n += (size_t)sprintf(s + n, "%s\"p%d\":{\"type\":\"string\",\"maxLength\":4096}",
                             i ? "," : "", i);
    sprintf(s + n, "}}");
    snprintf(want, sizeof want, "its grammar is over %d states", KVP_GRAMMAR_MAX_STATES);
    cr_expect(strstr(refuse(s), want), "%s", refuse(s));
    /* arcs: classes of many single characters, 4000 times each */
    n = (size_t)sprintf(s, "{\"anyOf\":[");
    for (int i = 0; i < 6; i++)
        n += (size_t)sprintf(s + n, "%s{\"type\":\"string\",\"pattern\":"
                             "\"^[!#%%')+/13579;=?ACEGIKMOQSUWY_acegikmoqsuwy{}]{4000}$\"}",
                             i ? "," : "");
    sprintf(s + n, "]}");
    snprintf(want, sizeof want, "its grammar is over %d arcs", KVP_GRAMMAR_MAX_ARCS);
    cr_expect(strstr(refuse(s), want), "%s", refuse(s));
    /* alternatives: an enum or an anyOf of more than KVP_SCHEMA_MAX_ALTERNATIVES */
    n = (size_t)sprintf(s, "{\"enum\":[");
    for (int i = 0; i <= KVP_SCHEMA_MAX_ALTERNATIVES; i++)
        n += (size_t)sprintf(s + n, "%s%d", i ? "," : "", i);
    sprintf(s + n, "]}");
    snprintf(want, sizeof want, "enum has %d values, over the limit of %d",
             KVP_SCHEMA_MAX_ALTERNATIVES + 1, KVP_SCHEMA_MAX_ALTERNATIVES);
    cr_expect(strstr(refuse(s), want), "%s", refuse(s));
    n = (size_t)sprintf(s, "{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[");
    for (int i = 0; i <= KVP_SCHEMA_MAX_ALTERNATIVES; i++)
        n += (size_t)sprintf(s + n, "%s{\"const\":%d}", i ? "," : "", i);
    sprintf(s + n, "]}}}");
    snprintf(want, sizeof want, "anyOf has %d schemas, over the limit of %d at /properties/x",
             KVP_SCHEMA_MAX_ALTERNATIVES + 1, KVP_SCHEMA_MAX_ALTERNATIVES);
    cr_expect(strstr(refuse(s), want), "%s", refuse(s));
    /* at the limit it compiles */
    n = (size_t)sprintf(s, "{\"enum\":[");
    for (int i = 0; i < KVP_SCHEMA_MAX_ALTERNATIVES; i++)
        n += (size_t)sprintf(s + n, "%s%d", i ? "," : "", i);
    sprintf(s + n, "]}");
    kvp_grammar *g = compile(s);
    cr_expect(tu_grammar_whole(g, "1023"));
    cr_expect(!tu_grammar_whole(g, "1024"));
    kvp_grammar_unref(g);
    free(s);
}

Test(schema, calls)
{
    json_t *p1 = json_loads("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","
                            "\"maxLength\":8}},\"required\":[\"city\"]}", 0, NULL);
    kvp_schema_fn fns[] = {{"weather", p1}, {"time", NULL}};
    char err[256];
    kvp_grammar *g = kvp_schema_compile_calls(fns, 2, "<tool_call>\n", "\n</tool_call>", err,
                                              sizeof err);
    cr_assert(g, "%s", err);
    cr_expect(tu_grammar_whole(g, "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}"
                       "\n</tool_call>"));
    cr_expect(tu_grammar_whole(g, "<tool_call>\n{\"name\":\"time\",\"arguments\":{\"tz\":[1]}}\n</tool_call>"));
    cr_expect(!tu_grammar_whole(g, "<tool_call>\n{\"name\":\"weather\",\"arguments\":{}}\n</tool_call>"));
    cr_expect(!tu_grammar_whole(g, "<tool_call>\n{\"name\":\"other\",\"arguments\":{}}\n</tool_call>"));
    cr_expect(!tu_grammar_whole(g, "{\"name\":\"time\",\"arguments\":{}}"));
    kvp_grammar_unref(g);
    /* parallel calls: one to three, a newline between */
    g = kvp_schema_compile_call_list(fns, 2, "<tool_call>\n", "\n</tool_call>", "\n", 3, err,
                                     sizeof err);
    cr_assert(g, "%s", err);
    const char *one = "<tool_call>\n{\"name\":\"time\",\"arguments\":{}}\n</tool_call>";
    char doc[1024];
    cr_expect(tu_grammar_whole(g, one));
    snprintf(doc, sizeof doc, "%s\n%s", one, one);
    cr_expect(tu_grammar_whole(g, doc));
    snprintf(doc, sizeof doc, "%s\n%s\n%s", one, one, one);
    cr_expect(tu_grammar_whole(g, doc));
    snprintf(doc, sizeof doc, "%s\n%s\n%s\n%s", one, one, one, one);
    cr_expect(!tu_grammar_whole(g, doc));
    snprintf(doc, sizeof doc, "%s%s", one, one);
    cr_expect(!tu_grammar_whole(g, doc));
    kvp_grammar_unref(g);
    cr_expect_null(kvp_schema_compile_call_list(fns, 2, NULL, NULL, NULL, 0, err, sizeof err));
    cr_expect_null(kvp_schema_compile_calls(fns, 0, NULL, NULL, err, sizeof err));
    json_t *badp = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"format\":\"x\"}}}",
                              0, NULL);
    kvp_schema_fn bad[] = {{"f", badp}};
    cr_expect_null(kvp_schema_compile_calls(bad, 1, NULL, NULL, err, sizeof err));
    cr_expect(strstr(err, "format is not supported at /f/properties/a"), "%s", err);
    json_decref(badp);
    json_decref(p1);
}

/* ---- random schemas: whatever compiles writes only JSON ---- */

static uint64_t rng_state = 88172645463325252ull;

static unsigned rnd(unsigned n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state % n);
}

static json_t *random_schema(int depth)
{
    static const char *const types[] = {"string", "integer", "number", "boolean", "null",
                                        "object", "array"};
    int k = (int)rnd(depth > 3 ? 5 : 10);
    switch (k) {
    case 0: return json_pack("{s:s, s:i}", "type", "string", "maxLength", (int)rnd(6));
    case 1: return json_pack("{s:s, s:i, s:i}", "type", "integer", "minimum", (int)rnd(30) - 15,
                             "maximum", 15 + (int)rnd(300));
    case 2: return json_pack("{s:[s, i, n]}", "enum", "a\"b", (int)rnd(9));
    case 3: return json_pack("{s:s, s:s}", "type", "string", "pattern", rnd(2) ? "^[a-c]+x?$" : "d|e");
    case 4: return json_pack("{s:s}", "type", types[rnd(7)]);
    case 5: {
        json_t *p = json_object();
        int n = 1 + (int)rnd(3);
        json_t *req = json_array();
        for (int i = 0; i < n; i++) {
            char key[8];
            snprintf(key, sizeof key, "k%d", i);
            json_object_set_new(p, key, random_schema(depth + 1));
            if (rnd(2))
                json_array_append_new(req, json_string(key));
        }
        return json_pack("{s:s, s:o, s:o, s:b}", "type", "object", "properties", p, "required",
                         req, "additionalProperties", 0);
    }
    case 6: return json_pack("{s:s, s:o, s:i}", "type", "array", "items", random_schema(depth + 1),
                             "maxItems", (int)rnd(4));
    case 7: return json_pack("{s:[o, o]}", "anyOf", random_schema(depth + 1),
                             random_schema(depth + 1));
    case 8: return json_pack("{s:s, s:i, s:i}", "type", "number", "minimum", -(int)rnd(3),
                             "exclusiveMaximum", 1 + (int)rnd(3));
    default: return json_pack("{s:[s, s], s:i}", "type", "string", "null", "maxLength", 2);
    }
}

Test(schema, random_schemas_write_only_json)
{
    static const char bytes[] = "{}[],:\" \n\tabcdexk0123456789-.eE+tfrunl\\/\x01\xc3\xa9";
    int compiled = 0, documents = 0;
    for (int round = 0; round < 300; round++) {
        json_t *s = random_schema(0);
        char err[256];
        kvp_grammar *g = kvp_schema_compile(s, err, sizeof err);
        json_decref(s);
        if (!g)
            continue;
        compiled++;
        kvp_gmatch m;
        cr_assert_eq(kvp_gmatch_init(&m, g), 0);
        char doc[512];
        size_t len = 0;
        while (len < sizeof doc - 1 && !kvp_gmatch_closed(&m)) {
            if (kvp_gmatch_complete(&m) && rnd(4) == 0)
                break;
            int took = 0;
            for (int tries = 0; tries < 64 && !took; tries++) {
                char b = bytes[rnd(sizeof bytes - 1)];
                int before = kvp_gmatch_complete(&m);
                if (kvp_gmatch_accept(&m, &b, 1) == 0) {
                    doc[len++] = b;
                    took = 1;
                } else
                    cr_assert_eq(kvp_gmatch_complete(&m), before, "a refusal changed the state");
            }
            if (!took)
                break;
        }
        doc[len] = '\0';
        if (kvp_gmatch_complete(&m)) {
            json_error_t je;
            json_t *v = json_loadb(doc, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            cr_expect(v, "not JSON (%s): %s", je.text, doc);
            json_decref(v);
            documents++;
        }
        kvp_gmatch_free(&m);
        kvp_grammar_unref(g);
    }
    cr_expect_gt(compiled, 200);
    cr_expect_gt(documents, 100);
}

static const char *text_of(const char *open, const char *doc)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s%s", open, doc);
    return buf;
}

/* A forced call in each format: the format's frame around the grammar's documents, with
 * the format's arguments key, and what it accepts parses back as that call. */
Test(schema, calls_in_each_formats_frame)
{
    json_t *p = json_loads("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\","
                           "\"minimum\":1,\"maximum\":9}},\"required\":[\"n\"],"
                           "\"additionalProperties\":false}", 0, NULL);
    kvp_schema_fn fns[] = {{"pick", p}, {"other", NULL}};
    struct { enum kvp_tool_format f; const char *doc, *wrong; } cs[] = {
        {KVP_TOOLS_HERMES, "{\"name\": \"pick\", \"arguments\": {\"n\": 3}}\n</tool_call>",
         "{\"name\": \"pick\", \"parameters\": {\"n\": 3}}\n</tool_call>"},
        {KVP_TOOLS_LLAMA3, "{\"name\": \"pick\", \"parameters\": {\"n\": 3}}",
         "{\"name\": \"pick\", \"arguments\": {\"n\": 3}}"},
        {KVP_TOOLS_MISTRAL, "{\"name\": \"pick\", \"arguments\": {\"n\": 3}}]",
         "{\"name\": \"pick\", \"arguments\": {\"n\": 3}}"},
    };
    char err[256], text[512];
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        kvp_toolcall_shape sh;
        cr_assert_eq(kvp_toolcall_frame(cs[i].f, &sh), 0);
        kvp_grammar *g = kvp_schema_compile_calls_as(fns, 2, NULL, sh.args_key, sh.close, err,
                                                     sizeof err);
        cr_assert(g, "%s", err);
        cr_expect(tu_grammar_whole(g, cs[i].doc), "format %d: %s", cs[i].f, cs[i].doc);
        cr_expect(!tu_grammar_whole(g, cs[i].wrong), "format %d: %s", cs[i].f, cs[i].wrong);
        /* the frame is spaced as kvp_toolcall_write writes it; only the arguments vary */
        char compact[256];
        snprintf(compact, sizeof compact, "{\"name\":\"pick\",\"%s\":{\"n\": 3}}%s", sh.args_key,
                 sh.close);
        cr_expect(!tu_grammar_whole(g, compact), "format %d: %s", cs[i].f, compact);
        snprintf(compact, sizeof compact, "{\"name\": \"pick\", \"%s\": {\n  \"n\" : 3 }}%s",
                 sh.args_key, sh.close);
        cr_expect(tu_grammar_whole(g, compact), "format %d: %s", cs[i].f, compact);
        char *w = NULL;
        size_t wl = 0;
        cr_assert_eq(kvp_toolcall_write(cs[i].f, "pick", 4, "{\"n\": 3}", 8, 0, &w, &wl), 0);
        cr_expect_str_eq(w, text_of(sh.open, cs[i].doc), "format %d", cs[i].f);
        free(w);
        snprintf(text, sizeof text, "%s%s", sh.open, cs[i].doc);
        kvp_toolcalls tc;
        cr_expect_eq(kvp_toolcall_parse(cs[i].f, text, strlen(text), 1, &tc), 1, "%s", text);
        cr_expect_eq(tc.call[0].name.to - tc.call[0].name.from, 4);
        cr_expect(!memcmp(text + tc.call[0].name.from, "pick", 4));
        cr_expect(!tc.broken);
        kvp_grammar_unref(g);
    }
    kvp_toolcall_shape sh;
    cr_expect_eq(kvp_toolcall_frame(KVP_TOOLS_NONE, &sh), -1);
    cr_expect_str_eq(sh.args_key, "");
    cr_expect_null(kvp_schema_compile_calls_as(fns, 2, NULL, "", NULL, err, sizeof err));
    cr_expect_null(kvp_schema_compile_calls_as(fns, 0, NULL, "arguments", NULL, err, sizeof err));
    json_decref(p);
}
