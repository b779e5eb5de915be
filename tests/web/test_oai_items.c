/* web/oai_items.c: the Responses API's tools, tool_choice, text.format and items in chat
 * completions' shapes, the output items of a chat reply, and every refusal with its
 * field. */
#include <criterion/criterion.h>
#include <string.h>

#include "web/oai_items.h"

static json_t *js(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    cr_assert_not_null(j, "bad test JSON: %s: %s", text, err.text);
    return j;
}

/* a and b (JSON texts) are equal. */
static void same(json_t *got, const char *want)
{
    json_t *w = js(want);
    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
    cr_assert(json_equal(got, w), "got %s, want %s", g, want);
    free(g);
    json_decref(w);
}

Test(oai_items, function_tools_tool_choice_and_text_format_take_chats_shapes)
{
    kvpd_oai_err e;
    json_t *req = js("{\"model\":\"m\",\"tools\":[{\"type\":\"function\",\"name\":\"add\","
                     "\"description\":\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
                     "\"tool_choice\":{\"type\":\"function\",\"name\":\"add\"},"
                     "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
                     "\"schema\":{\"type\":\"object\"},\"strict\":true}}}");
    json_t *chat = kvpd_items_request(req, &e);
    cr_assert_not_null(chat, "%s", e.message);
    same(json_object_get(chat, "tools"),
         "[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"d\","
         "\"parameters\":{\"type\":\"object\"},\"strict\":true}}]");
    same(json_object_get(chat, "tool_choice"),
         "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}");
    same(json_object_get(chat, "response_format"),
         "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
         "{\"type\":\"object\"},\"strict\":true}}");
    cr_assert_null(json_object_get(chat, "text"));
    cr_assert_str_eq(json_string_value(json_object_get(chat, "model")), "m");
    /* the request itself is unchanged */
    cr_assert_eq(json_string_value(json_object_get(json_array_get(json_object_get(req, "tools"), 0),
                                                   "name"))[0], 'a');
    json_decref(chat);
    json_decref(req);

    req = js("{\"tool_choice\":\"required\",\"text\":{\"format\":{\"type\":\"text\"}},"
             "\"include\":[\"message.output_text.logprobs\"],\"top_logprobs\":2}");
    chat = kvpd_items_request(req, &e);
    cr_assert_not_null(chat);
    cr_assert(json_is_true(json_object_get(chat, "logprobs")), "include asks for logprobs");
    cr_assert_null(json_object_get(chat, "include"));
    cr_assert_eq(json_integer_value(json_object_get(chat, "top_logprobs")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(chat, "tool_choice")), "required");
    cr_assert_null(json_object_get(chat, "response_format"), "text is plain text");
    json_decref(chat);
    json_decref(req);
}

static void request_refused(const char *body, const char *param)
{
    kvpd_oai_err e;
    memset(&e, 0, sizeof e);
    json_t *req = js(body);
    cr_assert_null(kvpd_items_request(req, &e), "accepted: %s", body);
    cr_assert_str_eq(e.param, param, "%s: param %s", body, e.param);
    cr_assert_eq(e.status, 400, "%s", body);
    cr_assert(e.message[0]);
    json_decref(req);
}

/* A tool of a type kvpd does not serve (hosted, Codex's local_shell or custom) is left
 * out of the twin's tools, and named by kvpd_items_skipped_tools; the function tools
 * around it stay, in order. */
Test(oai_items, tools_of_other_types_are_left_out_and_named)
{
    kvpd_oai_err e;
    memset(&e, 0, sizeof e);
    json_t *req = js("{\"tools\":[{\"type\":\"web_search\"},{\"type\":\"function\",\"name\":\"a\"},"
                     "{\"type\":\"local_shell\"},{\"type\":\"custom\",\"name\":\"apply_patch\"},"
                     "{\"type\":\"function\",\"name\":\"b\"}]}");
    json_t *chat = kvpd_items_request(req, &e);
    cr_assert(chat, "%s", e.message);
    json_t *tools = json_object_get(chat, "tools");
    cr_assert_eq(json_array_size(tools), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(tools, 0),
                                                                       "function"), "name")), "a");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(tools, 1),
                                                                       "function"), "name")), "b");
    json_t *skipped = kvpd_items_skipped_tools(req);
    cr_assert_eq(json_array_size(skipped), 3);
    cr_assert_str_eq(json_string_value(json_array_get(skipped, 0)), "web_search");
    cr_assert_str_eq(json_string_value(json_array_get(skipped, 1)), "local_shell");
    cr_assert_str_eq(json_string_value(json_array_get(skipped, 2)), "custom");
    json_decref(skipped);
    json_decref(chat);
    json_decref(req);
    /* none skipped: an empty list */
    req = js("{\"tools\":[{\"type\":\"function\",\"name\":\"a\"}]}");
    skipped = kvpd_items_skipped_tools(req);
    cr_assert_eq(json_array_size(skipped), 0);
    json_decref(skipped);
    json_decref(req);
}

Test(oai_items, hosted_tools_other_choices_and_formats_are_refused_naming_the_field)
{
    request_refused("{\"tools\":[{\"name\":\"web_search\"}]}", "tools[0].type");
    request_refused("{\"tools\":[{\"type\":\"function\",\"name\":\"a\"},7]}", "tools[1].type");
    request_refused("{\"tools\":{\"type\":\"function\"}}", "tools");
    request_refused("{\"tool_choice\":{\"type\":\"file_search\"}}", "tool_choice");
    request_refused("{\"tool_choice\":{\"type\":\"function\"}}", "tool_choice");
    request_refused("{\"tool_choice\":3}", "tool_choice");
    request_refused("{\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format");
    request_refused("{\"text\":{\"format\":{}}}", "text.format");
    request_refused("{\"text\":\"json\"}", "text");
    request_refused("{\"include\":[\"reasoning.encrypted_content\"]}", "include");
    request_refused("{\"include\":\"message.output_text.logprobs\"}", "include");
}

Test(oai_items, a_conversation_of_items_becomes_chat_messages)
{
    kvpd_oai_err e;
    json_t *items = js(
        "[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
        "\"text\":\"let me \"},{\"type\":\"output_text\",\"text\":\"see\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{\\\"a\\\":1}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":\"two\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":[{\"type\":\"input_text\","
        "\"text\":\"one\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c3\",\"name\":\"f\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c3\",\"output\":\"x\"}]");
    json_t *chat = kvpd_items_chat(items, 0, "be brief", 8, &e);
    cr_assert_not_null(chat, "%s: %s", e.param, e.message);
    same(chat,
         "[{\"role\":\"system\",\"content\":\"be brief\"},"
         "{\"role\":\"user\",\"content\":\"hi\"},"
         "{\"role\":\"assistant\",\"content\":\"let me see\",\"tool_calls\":["
         "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
         "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
         "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"two\"},"
         "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"one\"},"
         "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
         "{\"id\":\"c3\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
         "{\"role\":\"tool\",\"tool_call_id\":\"c3\",\"content\":\"x\"}]");
    json_decref(chat);
    /* without instructions, the conversation is the items alone */
    chat = kvpd_items_chat(items, 0, NULL, 0, &e);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(chat, 0), "role")), "user");
    json_decref(chat);
    json_decref(items);
}

static void chat_refused(const char *items_text, size_t first_input, const char *param)
{
    kvpd_oai_err e;
    memset(&e, 0, sizeof e);
    json_t *items = js(items_text);
    cr_assert_null(kvpd_items_chat(items, first_input, NULL, 0, &e), "accepted: %s", items_text);
    cr_assert_str_eq(e.param, param, "%s: param %s", items_text, e.param);
    cr_assert_eq(e.status, 400);
    json_decref(items);
}

Test(oai_items, malformed_items_are_refused_naming_the_input_item)
{
    chat_refused("[7]", 0, "input[0]");
    chat_refused("[{\"role\":\"robot\",\"content\":\"x\"}]", 0, "input[0].role");
    chat_refused("[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]", 0,
                 "input[0].content");
    chat_refused("[{\"role\":\"user\",\"content\":5}]", 0, "input[0].content");
    chat_refused("[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]", 0,
                 "input[0].call_id");
    chat_refused("[{\"type\":\"function_call\",\"call_id\":\"c\",\"arguments\":\"{}\"}]", 0,
                 "input[0].name");
    chat_refused("[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":{}}]",
                 0, "input[0].arguments");
    chat_refused("[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"x\"}]", 0,
                 "input[0].call_id");
    chat_refused("[{\"type\":\"function_call_output\",\"output\":\"x\"}]", 0, "input[0].call_id");
    chat_refused("[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},"
                 "{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":7}]", 0,
                 "input[1].output");
    chat_refused("[{\"type\":\"item_reference\",\"id\":\"x\"}]", 0, "input[0].type");
    /* a reasoning item: reasoning_text parts, nothing encrypted */
    chat_refused("[{\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"output_text\","
                 "\"text\":\"x\"}]}]", 0, "input[0].content");
    chat_refused("[{\"type\":\"reasoning\",\"content\":[{\"type\":\"reasoning_text\",\"text\":1}]}]",
                 0, "input[0].content");
    chat_refused("[{\"type\":\"reasoning\",\"content\":\"x\"}]", 0, "input[0].content");
    chat_refused("[{\"type\":\"reasoning\",\"summary\":[],\"encrypted_content\":\"gAAA\"}]", 0,
                 "input[0].encrypted_content");
    /* items of the previous response come first: the input's own are counted from 0 */
    chat_refused("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
                 "{\"type\":\"item_reference\",\"id\":\"x\"}]", 2, "input[0].type");
    /* a call made by the previous response may be answered */
    kvpd_oai_err e;
    json_t *items = js("[{\"role\":\"user\",\"content\":\"a\"},{\"type\":\"function_call\","
                       "\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},"
                       "{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"x\"}]");
    json_t *chat = kvpd_items_chat(items, 2, NULL, 0, &e);
    cr_assert_not_null(chat);
    json_decref(chat);
    json_decref(items);
}

Test(oai_items, input_strings_become_one_user_message_and_bad_input_is_refused)
{
    kvpd_oai_err e;
    json_t *in = json_string("hello");
    json_t *items = kvpd_items_input(in, &e);
    same(items, "[{\"type\":\"message\",\"role\":\"user\",\"content\":\"hello\"}]");
    json_decref(items);
    json_decref(in);
    json_t *bad[] = {json_array(), json_integer(3), json_object(), NULL};
    for (int i = 0; i < 4; i++) {
        memset(&e, 0, sizeof e);
        cr_assert_null(kvpd_items_input(bad[i], &e), "input %d accepted", i);
        cr_assert_str_eq(e.param, "input");
        json_decref(bad[i]);
    }
}

Test(oai_items, a_chat_reply_becomes_output_items)
{
    json_t *msg = js("{\"role\":\"assistant\",\"content\":\"ok\",\"tool_calls\":["
                     "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                     "\"arguments\":\"{}\"}},{\"id\":\"call_2\",\"type\":\"function\","
                     "\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"a\\\":1}\"}}]}");
    json_t *out = kvpd_items_output(msg, "msg_1", "completed");
    cr_assert_eq(json_array_size(out), 3);
    json_t *m = json_array_get(out, 0), *c = json_array_get(out, 2);
    cr_assert_str_eq(json_string_value(json_object_get(m, "type")), "message");
    cr_assert_str_eq(json_string_value(json_object_get(m, "id")), "msg_1");
    cr_assert_str_eq(json_string_value(json_object_get(c, "type")), "function_call");
    cr_assert_str_eq(json_string_value(json_object_get(c, "call_id")), "call_2");
    cr_assert_str_eq(json_string_value(json_object_get(c, "name")), "g");
    cr_assert_str_eq(json_string_value(json_object_get(c, "arguments")), "{\"a\":1}");
    cr_assert_eq(strncmp(json_string_value(json_object_get(c, "id")), "fc_", 3), 0);
    cr_assert_str_neq(json_string_value(json_object_get(c, "id")),
                      json_string_value(json_object_get(json_array_get(out, 1), "id")));
    json_t *text = kvpd_items_output_text(out);
    cr_assert_str_eq(json_string_value(text), "ok");
    json_decref(text);
    json_decref(out);
    json_decref(msg);
    /* calls without text: no message item */
    msg = js("{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":"
             "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}");
    out = kvpd_items_output(msg, "msg_2", "completed");
    cr_assert_eq(json_array_size(out), 1);
    text = kvpd_items_output_text(out);
    cr_assert_str_eq(json_string_value(text), "");
    json_decref(text);
    json_decref(out);
    json_decref(msg);
    /* neither: one empty message */
    msg = js("{\"role\":\"assistant\",\"content\":\"\"}");
    out = kvpd_items_output(msg, "msg_3", "incomplete");
    cr_assert_eq(json_array_size(out), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(out, 0), "status")),
                     "incomplete");
    json_decref(out);
    json_decref(msg);
}

Test(oai_items, chat_errors_are_named_as_the_responses_api_names_its_fields)
{
    kvpd_oai_err e = {.status = 400};
    snprintf(e.param, sizeof e.param, "tools[2].function.name");
    snprintf(e.message, sizeof e.message, "tools[2].function.name must be 1 to 64 letters; "
             "response_format cannot be combined");
    kvpd_items_error_names(&e, NULL);
    cr_assert_str_eq(e.param, "tools[2].name");
    cr_assert_str_eq(e.message, "tools[2].name must be 1 to 64 letters; text.format cannot be "
                     "combined");
    snprintf(e.param, sizeof e.param, "response_format.json_schema.schema");
    kvpd_items_error_names(&e, NULL);
    cr_assert_str_eq(e.param, "text.format.schema");
    snprintf(e.param, sizeof e.param, "tool_choice.function.name");
    kvpd_items_error_names(&e, NULL);
    cr_assert_str_eq(e.param, "tool_choice.name");
    snprintf(e.param, sizeof e.param, "logprobs");
    snprintf(e.message, sizeof e.message, "top_logprobs needs logprobs: true");
    kvpd_items_error_names(&e, NULL);
    cr_assert_str_eq(e.param, "include");
    cr_assert_str_eq(e.message, "top_logprobs needs include [\"message.output_text.logprobs\"]");
    /* a message at the buffer's size that a rename lengthens is cut, still terminated */
    memset(e.message, 'x', sizeof e.message - 1);
    memcpy(e.message, "needs logprobs: true", 20);
    e.message[sizeof e.message - 1] = '\0';
    kvpd_items_error_names(&e, NULL);
    cr_assert_eq(strlen(e.message), sizeof e.message - 1);
    cr_assert_eq(strncmp(e.message, "needs include [", 15), 0);
}

/* A reasoning item's reasoning_text parts, joined, are the next assistant message's
 * reasoning_content (or its calls'); with none after it, nothing. */
Test(oai_items, a_reasoning_item_goes_to_the_reply_after_it)
{
    kvpd_oai_err e;
    memset(&e, 0, sizeof e);
    json_t *items = js("[{\"role\":\"user\",\"content\":\"Hi\"},"
                       "{\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\","
                       "\"text\":\"Let \"},{\"type\":\"reasoning_text\",\"text\":\"me see\"}]},"
                       "{\"type\":\"message\",\"role\":\"assistant\",\"content\":\"Hello\"},"
                       "{\"role\":\"user\",\"content\":\"Next\"},"
                       "{\"type\":\"reasoning\",\"content\":[{\"type\":\"reasoning_text\",\"text\":\"tool\"}]},"
                       "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
                       "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"1\"},"
                       "{\"type\":\"reasoning\",\"content\":[]},"
                       "{\"role\":\"user\",\"content\":\"And?\"}]");
    json_t *chat = kvpd_items_chat(items, 0, NULL, 0, &e);
    cr_assert(chat, "%s", e.message);
    cr_assert_eq(json_array_size(chat), 6);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(chat, 1), "reasoning_content")),
                     "Let me see");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(chat, 3), "reasoning_content")),
                     "tool");
    cr_assert(json_object_get(json_array_get(chat, 3), "tool_calls"));
    cr_assert_null(json_object_get(json_array_get(chat, 5), "reasoning_content"));
    json_decref(chat);
    json_decref(items);
}

/* output_text is the message items' text only: a reasoning item before the message is not
 * part of the answer. */
Test(oai_items, output_text_leaves_the_reasoning_out)
{
    json_t *out = js("[{\"type\":\"reasoning\",\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hmm \"}]},"
                     "{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hel\"},"
                     "{\"type\":\"output_text\",\"text\":\"lo\"}]},"
                     "{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]");
    json_t *t = kvpd_items_output_text(out);
    cr_assert_str_eq(json_string_value(t), "Hello");
    json_decref(t);
    json_decref(out);
}

/* A Responses request through the twin as the codec serves it: kvpd_items_request, then
 * chat's parse of the twin, its error named back (web/oai_responses.c). 0, or -1 with e
 * set. */
static int responses_parse(const char *body, kvpd_oai_err *e)
{
    static const kvpd_oai_limits lim = {.max_tokens = 100, .model_alias = "", .model = "m",
                                        .tool_format = KVP_TOOLS_HERMES};
    memset(e, 0, sizeof *e);
    json_t *req = js(body);
    json_t *twin = kvpd_items_request(req, e);
    int rc = -1;
    if (twin) {
        kvpd_oai_req r;
        memset(&r, 0, sizeof r);
        rc = kvpd_oai_parse_options(twin, &lim, &r, e);
        if (rc < 0)
            kvpd_items_error_names(e, json_object_get(req, "tools"));
        kvpd_oai_release(&r);
    }
    json_decref(twin);
    json_decref(req);
    return rc;
}

static void responses_refused(const char *body, enum kvpd_oai_code code, const char *param)
{
    kvpd_oai_err e;
    cr_assert_eq(responses_parse(body, &e), -1, "accepted: %s", body);
    cr_assert_eq(e.status, 400, "%s", body);
    cr_assert_eq(e.code, code, "%s: code %d (%s)", body, e.code, e.message);
    cr_assert_str_eq(e.param, param, "%s: %s", body, e.message);
    cr_assert(strstr(e.message, param), "%s: %s", body, e.message);
    if (code == KVPD_OAI_E_UNKNOWN_PARAMETER)
        cr_assert(strstr(e.message, "unknown parameter '"), "%s", e.message);
}

/* Responses' function tools, named tool_choice and text.format: the keys OpenAI's API
 * defines pass in the shapes the SDKs send (openai's zodTextFormat and
 * zodResponsesFunction, the Agents SDK's tools and handoffs: strict, description null,
 * allowed_callers ["direct"], defer_loading false); its function tool's extra fields at a
 * value kvpd cannot honour are refused by path, as is any unknown key (the Responses
 * index of the tool, the tools left out counted) and a wrong type; tools of other types
 * stay left out, whatever they hold. */
Test(oai_items, the_keys_of_tools_tool_choice_and_text_format_are_checked)
{
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                         "\"required\":[\"a\"],\"additionalProperties\":false}";
    char body[1024];
    const char *fine[] = {
        "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"final_output\","
        "\"strict\":true,\"schema\":%s},\"verbosity\":\"medium\"}}",
        "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
        "\"description\":\"d\",\"strict\":false,\"schema\":%s}}}",
        "{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\",\"filters\":{}},{\"type\":\"function\","
        "\"name\":\"f\",\"description\":null,\"parameters\":%s,\"strict\":true,"
        "\"allowed_callers\":[\"direct\"],\"defer_loading\":false,\"async\":false,"
        "\"output_schema\":null},{\"type\":\"local_shell\"}],\"tool_choice\":{\"type\":\"function\","
        "\"name\":\"f\"}}",
        "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":null,"
        "\"strict\":null,\"allowed_callers\":[\"direct\",\"programmatic\"]}],\"tool_choice\":\"auto\"}",
        "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_object\"}}}",
    };
    kvpd_oai_err e;
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        snprintf(body, sizeof body, fine[i], schema);
        cr_assert_eq(responses_parse(body, &e), 0, "%s: %s", body, e.message);
    }
    /* unknown keys */
    responses_refused("{\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
                      "\"schema\":{},\"foo\":1}}}", KVPD_OAI_E_UNKNOWN_PARAMETER,
                      "text.format.foo");
    responses_refused("{\"text\":{\"format\":{\"type\":\"json_schema\",\"json_schema\":"
                      "{\"name\":\"n\",\"schema\":{}}}}}", KVPD_OAI_E_UNKNOWN_PARAMETER,
                      "text.format.json_schema");
    responses_refused("{\"text\":{\"format\":{\"type\":\"text\",\"strict\":true}}}",
                      KVPD_OAI_E_UNKNOWN_PARAMETER, "text.format.strict");
    responses_refused("{\"text\":{\"format\":{\"type\":\"json_object\",\"name\":\"n\"}}}",
                      KVPD_OAI_E_UNKNOWN_PARAMETER, "text.format.name");
    responses_refused("{\"text\":{\"format\":{\"type\":\"json_object\",\"schema\":{}}}}",
                      KVPD_OAI_E_UNKNOWN_PARAMETER, "text.format.schema");
    responses_refused("{\"tools\":[{\"type\":\"web_search\"},{\"type\":\"function\",\"name\":\"a\"},"
                      "{\"type\":\"function\",\"name\":\"b\",\"bar\":1}]}",
                      KVPD_OAI_E_UNKNOWN_PARAMETER, "tools[2].bar");
    responses_refused("{\"tools\":[{\"type\":\"function\",\"name\":\"a\",\"function\":{}}]}",
                      KVPD_OAI_E_UNKNOWN_PARAMETER, "tools[0].function");
    responses_refused("{\"tools\":[{\"type\":\"function\",\"name\":\"a\"}],\"tool_choice\":"
                      "{\"type\":\"function\",\"name\":\"a\",\"function\":{\"name\":\"a\"}}}",
                      KVPD_OAI_E_UNKNOWN_PARAMETER, "tool_choice.function");
    /* OpenAI's fields at what kvpd cannot honour */
    responses_refused("{\"tools\":[{\"type\":\"function\",\"name\":\"a\",\"defer_loading\":true}]}",
                      KVPD_OAI_E_UNSUPPORTED_PARAMETER, "tools[0].defer_loading");
    responses_refused("{\"tools\":[{\"type\":\"function\",\"name\":\"a\",\"async\":true}]}",
                      KVPD_OAI_E_UNSUPPORTED_PARAMETER, "tools[0].async");
    responses_refused("{\"tools\":[{\"type\":\"function\",\"name\":\"a\","
                      "\"allowed_callers\":[\"programmatic\"]}]}",
                      KVPD_OAI_E_UNSUPPORTED_PARAMETER, "tools[0].allowed_callers");
    responses_refused("{\"tools\":[{\"type\":\"function\",\"name\":\"a\","
                      "\"output_schema\":{\"type\":\"string\"}}]}",
                      KVPD_OAI_E_UNSUPPORTED_PARAMETER, "tools[0].output_schema");
    /* wrong types, named by the Responses API's path */
    responses_refused("{\"tools\":[{\"type\":\"function\",\"name\":\"a\",\"allowed_callers\":\"direct\"}]}",
                      KVPD_OAI_E_INVALID_REQUEST, "tools[0].allowed_callers");
    responses_refused("{\"tools\":[{\"type\":\"function\",\"name\":\"a\",\"defer_loading\":1}]}",
                      KVPD_OAI_E_INVALID_REQUEST, "tools[0].defer_loading");
    responses_refused("{\"tools\":[{\"type\":\"custom\",\"name\":\"p\"},{\"type\":\"function\","
                      "\"name\":\"a\",\"strict\":\"yes\"}]}", KVPD_OAI_E_INVALID_REQUEST,
                      "tools[1].strict");
    responses_refused("{\"tools\":[{\"type\":\"web_search\"},{\"type\":\"local_shell\"},"
                      "{\"type\":\"function\",\"name\":\"a\",\"description\":[]}]}",
                      KVPD_OAI_E_INVALID_REQUEST, "tools[2].description");
    responses_refused("{\"tools\":[{\"type\":\"function\",\"name\":5}]}",
                      KVPD_OAI_E_INVALID_REQUEST, "tools[0].name");
    responses_refused("{\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
                      "\"strict\":\"yes\",\"schema\":{}}}}", KVPD_OAI_E_UNSUPPORTED_PARAMETER,
                      "text.format.strict");
    responses_refused("{\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
                      "\"description\":[],\"schema\":{}}}}", KVPD_OAI_E_UNSUPPORTED_PARAMETER,
                      "text.format.description");
}
