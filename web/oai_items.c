/* The Responses API's items and fields in chat completions' terms (web/oai_items.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "web/oai_items.h"
#include "web/oai_reply.h"

/* A string member without a NUL inside, or NULL. */
static const char *str(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v)
               ? json_string_value(v) : NULL;
}

static int present(const json_t *v)
{
    return v && !json_is_null(v);
}

/* ---- the request's fields ---- */

/* A function tool's fields as chat has them: name, description, body ("parameters") and
 * strict, those of from that are there. */
static json_t *named_fields(json_t *from, const char *body)
{
    json_t *to = json_object();
    const char *keys[] = {"name", "description", body, "strict"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (json_object_get(from, keys[k]))
            json_object_set(to, keys[k], json_object_get(from, keys[k]));
    return to;
}

/* A Responses function tool's fields beyond chat's, checked: the keys OpenAI's API
 * defines ({type, name, description, parameters, strict} and allowed_callers, async,
 * defer_loading, output_schema), the extra ones at the values that change nothing kvpd
 * does. allowed_callers must let the model call it ("direct": kvpd runs no programmatic
 * tool calling); async, defer_loading (loaded by tool search, which kvpd has not) and
 * output_schema (the template renders chat's function, which has no place for it) ask for
 * what kvpd does not do. at: "tools[i]". 0, or -1 with e set. */
static int function_tool(json_t *t, const char *at, kvpd_oai_err *e)
{
    static const char *const known[] = {"type", "name", "description", "parameters", "strict",
                                        "allowed_callers", "async", "defer_loading",
                                        "output_schema", NULL};
    const char *k = kvpd_oai_unknown_key(t, known);
    if (k)
        return kvpd_oai_unknown(e, at, k);
    char param[64];
    json_t *ac = json_object_get(t, "allowed_callers");
    if (present(ac)) {
        snprintf(param, sizeof param, "%s.allowed_callers", at);
        int direct = 0, ok = json_is_array(ac);
        size_t i;
        json_t *c;
        json_array_foreach(ac, i, c) {
            const char *v = json_string_value(c);
            ok &= v && (!strcmp(v, "direct") || !strcmp(v, "programmatic"));
            direct |= v && !strcmp(v, "direct");
        }
        if (!ok)
            return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param, "%s must be an array of "
                                "\"direct\" and \"programmatic\"", param);
        if (!direct)
            return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, param, "%s without "
                                "\"direct\" is not supported by kvpd: it has no programmatic "
                                "tool calling", param);
    }
    static const char *const flags[] = {"async", "defer_loading"};
    for (size_t f = 0; f < 2; f++) {
        json_t *v = json_object_get(t, flags[f]);
        snprintf(param, sizeof param, "%s.%s", at, flags[f]);
        if (present(v) && !json_is_boolean(v))
            return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param, "%s must be a boolean",
                                param);
        if (json_is_true(v))
            return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, param, "%s is not "
                                "supported by kvpd (only false)%s", param, f ? ": it has no "
                                "tool search to load a deferred function" : "");
    }
    json_t *os = json_object_get(t, "output_schema");
    snprintf(param, sizeof param, "%s.output_schema", at);
    if (present(os) && !json_is_object(os))
        return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param, "%s must be a JSON schema "
                            "object", param);
    if (present(os))
        return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, param, "%s is not supported "
                            "by kvpd: the model's chat template is given chat's function, "
                            "which has no place for it", param);
    return 0;
}

static json_t *chat_tools(json_t *tools, kvpd_oai_err *e)
{
    if (!json_is_array(tools)) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "tools", "tools must be an array");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *t;
    char param[48];
    json_array_foreach(tools, i, t) {
        const char *type = str(t, "type");
        snprintf(param, sizeof param, "tools[%zu].type", i);
        if (!json_is_object(t) || !type) {
            kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param, "%s is required", param);
            goto bad;
        }
        if (strcmp(type, "function"))
            continue;   /* a hosted or custom tool: skipped (kvpd_items_skipped_tools) */
        snprintf(param, sizeof param, "tools[%zu]", i);
        if (function_tool(t, param, e) < 0)
            goto bad;
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function",
                                             named_fields(t, "parameters")));
    }
    return out;
bad:
    json_decref(out);
    return NULL;
}

static json_t *chat_tool_choice(json_t *tc, kvpd_oai_err *e)
{
    if (json_is_string(tc))
        return json_incref(tc);   /* auto, none, required: chat's names too */
    const char *type = str(tc, "type"), *name = str(tc, "name");
    static const char *const known[] = {"type", "name", NULL};
    const char *k = type && !strcmp(type, "function") ? kvpd_oai_unknown_key(tc, known) : NULL;
    if (k) {
        kvpd_oai_unknown(e, "tool_choice", k);
        return NULL;
    }
    if (json_is_object(tc) && type && !strcmp(type, "function") && name)
        return json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name);
    kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "tool_choice",
                 "tool_choice must be \"auto\", \"none\", \"required\" or "
                 "{\"type\": \"function\", \"name\": ...}");
    return NULL;
}

/* text.format as response_format (NULL and e clear: plain text): json_schema's fields
 * (all but the type) as json_schema's, another type's object as it is, so that chat's
 * check (web/format.c) refuses what either has besides OpenAI's keys, named back as
 * text.format's (kvpd_items_error_names). json_object's `schema` is llama.cpp's server's,
 * for chat's response_format only. */
static json_t *chat_format(json_t *text, kvpd_oai_err *e)
{
    json_t *format = json_object_get(text, "format");
    if (present(text) && !json_is_object(text)) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "text", "text must be an object");
        return NULL;
    }
    if (!present(format))
        return NULL;
    const char *type = str(format, "type");
    if (type && !strcmp(type, "text") && json_object_size(format) == 1)
        return NULL;
    if (type && !strcmp(type, "json_object") && json_object_get(format, "schema")) {
        kvpd_oai_unknown(e, "text.format", "schema");
        return NULL;
    }
    if (type && !strcmp(type, "json_schema")) {
        json_t *js = json_copy(format);
        json_object_del(js, "type");
        return json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js);
    }
    if (type && (!strcmp(type, "text") || !strcmp(type, "json_object")))
        return json_copy(format);
    kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "text.format",
                 "text.format must be of type text, json_object or json_schema");
    return NULL;
}

/* The request's field key, when present, converted by fn into out's field of that name.
 * 0, or -1 with e set. */
static int convert_field(json_t *req, json_t *out, const char *key,
                         json_t *(*fn)(json_t *, kvpd_oai_err *), kvpd_oai_err *e)
{
    json_t *v = json_object_get(req, key);
    if (!present(v))
        return 0;
    json_t *t = fn(v, e);
    if (!t)
        return -1;
    json_object_set_new(out, key, t);
    return 0;
}

json_t *kvpd_items_skipped_tools(json_t *req)
{
    json_t *out = json_array(), *tools = json_object_get(req, "tools");
    size_t i;
    json_t *t;
    if (out && json_is_array(tools))
        json_array_foreach(tools, i, t) {
            const char *type = str(t, "type");
            if (json_is_object(t) && type && strcmp(type, "function"))
                json_array_append_new(out, json_string(type));
        }
    return out;
}

json_t *kvpd_items_request(json_t *req, kvpd_oai_err *e)
{
    json_t *out = json_copy(req);
    if (!out) {
        kvpd_oai_bad(e, KVPD_OAI_E_SERVER, NULL, "out of memory");
        return NULL;
    }
    e->code = KVPD_OAI_E_INVALID_REQUEST;
    e->message[0] = '\0';
    json_object_del(out, "text");
    if (convert_field(req, out, "tools", chat_tools, e) ||
        convert_field(req, out, "tool_choice", chat_tool_choice, e))
        goto bad;
    json_t *v = json_object_get(req, "include");
    if (present(v)) {
        size_t i;
        json_t *x;
        if (!json_is_array(v)) {
            kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "include", "include must be an array");
            goto bad;
        }
        json_array_foreach(v, i, x) {
            const char *what = json_string_value(x);
            if (!what || strcmp(what, "message.output_text.logprobs")) {
                kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "include",
                             "include: only \"message.output_text.logprobs\" is supported by kvpd");
                goto bad;
            }
            json_object_set_new(out, "logprobs", json_true());
        }
        json_object_del(out, "include");
    }
    json_t *rf = chat_format(json_object_get(req, "text"), e);
    if (!rf && e->message[0])
        goto bad;
    if (rf)
        json_object_set_new(out, "response_format", rf);
    return out;
bad:
    json_decref(out);
    return NULL;
}

/* Replaces every `from` in s (a NUL-terminated buffer of cap bytes) with `to`; what
 * would pass cap is cut. */
static void rename_in(char *s, size_t cap, const char *from, const char *to)
{
    char out[1024];
    size_t fl = strlen(from), n = 0;
    if (cap > sizeof out)
        cap = sizeof out;
    for (const char *p = s; *p && n + 1 < cap;) {
        if (!strncmp(p, from, fl)) {
            n += (size_t)snprintf(out + n, cap - n, "%s", to);
            if (n >= cap)
                n = cap - 1;
            p += fl;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    memcpy(s, out, n + 1);
}

void kvpd_items_error_names(kvpd_oai_err *e, const json_t *tools)
{
    /* chat's tools[n] is the request's n-th function tool, at its own index there */
    unsigned n;
    int at;
    if (sscanf(e->param, "tools[%u]%n", &n, &at) == 1 && at > 0) {
        size_t i, k = 0;
        json_t *t;
        json_array_foreach(tools, i, t) {
            const char *type = str(t, "type");
            if (!type || strcmp(type, "function"))
                continue;
            if (k++ < n)
                continue;
            if (i != n) {
                char from[32], to[32];
                snprintf(from, sizeof from, "tools[%u]", n);
                snprintf(to, sizeof to, "tools[%zu]", i);
                rename_in(e->param, sizeof e->param, from, to);
                rename_in(e->message, sizeof e->message, from, to);
            }
            break;
        }
    }
    const char *pairs[][2] = {{"].function.", "]."}, {"tool_choice.function.", "tool_choice."},
                              {"response_format.json_schema.", "text.format."},
                              {"response_format", "text.format"},
                              {"needs logprobs: true", "needs include [\"message.output_text.logprobs\"]"},
                              {"logprobs with tools", "include message.output_text.logprobs with tools"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        rename_in(e->param, sizeof e->param, pairs[i][0], pairs[i][1]);
        rename_in(e->message, sizeof e->message, pairs[i][0], pairs[i][1]);
    }
    if (!strcmp(e->param, "logprobs"))
        snprintf(e->param, sizeof e->param, "include");
}

/* ---- the conversation ---- */

json_t *kvpd_items_input(json_t *input, kvpd_oai_err *e)
{
    if (json_is_string(input))
        return json_pack("[{s:s, s:s, s:O}]", "type", "message", "role", "user", "content", input);
    if (!json_is_array(input) || json_array_size(input) == 0) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "input",
                     "input must be a string or a non-empty array of items");
        return NULL;
    }
    return json_copy(input);
}

/* Copies the "text" strings of the parts in arr (with nested: of the parts in each of
 * arr's items' "content") to t + *len, end to end, advancing *len; t NULL: only counts. */
static void part_texts(const json_t *arr, int nested, char *t, size_t *len)
{
    size_t i;
    json_t *part;
    json_array_foreach(arr, i, part) {
        if (nested) {
            part_texts(json_object_get(part, "content"), 0, t, len);
            continue;
        }
        json_t *x = json_object_get(part, "text");
        size_t n = json_string_length(x);
        if (t && n)
            memcpy(t + *len, json_string_value(x), n);
        *len += n;
    }
}

/* Those texts joined as a new JSON string, or NULL when out of memory. */
static json_t *join_texts(const json_t *arr, int nested)
{
    size_t total = 0, len = 0;
    part_texts(arr, nested, NULL, &total);
    char *t = malloc(total + 1);
    if (!t)
        return NULL;
    part_texts(arr, nested, t, &len);
    json_t *s = json_stringn_nocheck(t, len);
    free(t);
    return s;
}

/* A message item's text: a string, or parts of type input_text, output_text or text
 * (a new string), or NULL. */
static json_t *item_text(json_t *content)
{
    if (json_is_string(content))
        return json_incref(content);
    if (!json_is_array(content))
        return NULL;
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const char *type = str(part, "type");
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text") &&
                      strcmp(type, "text")) || !json_is_string(json_object_get(part, "text")))
            return NULL;
    }
    return join_texts(content, 0);
}

json_t *kvpd_items_chat(const json_t *items, size_t first_input, const char *instructions,
                        size_t instructions_len, kvpd_oai_err *e)
{
    json_t *out = json_array(), *calls = json_object();   /* call_id -> 1 */
    json_t *last_assistant = NULL;   /* the message a function_call run joins */
    json_t *reasoning = NULL;        /* a reasoning item's text, for the reply after it */
    char param[64];
    if (instructions)
        json_array_append_new(out, json_pack("{s:s, s:s%}", "role", "system", "content",
                                             instructions, instructions_len));
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item) {
        size_t at = i >= first_input ? i - first_input : i;
        const char *type = json_is_object(item) ? str(item, "type") : NULL;
        if (json_is_object(item) && !json_object_get(item, "type"))
            type = "message";   /* an easy input message: {role, content} */
        if (!type) {
            snprintf(param, sizeof param, "input[%zu]", at);
            kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param, "%s must be an item object", param);
            goto bad;
        }
        if (!strcmp(type, "message")) {
            const char *role = str(item, "role");
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") &&
                          strcmp(role, "system") && strcmp(role, "developer"))) {
                snprintf(param, sizeof param, "input[%zu].role", at);
                kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param,
                             "a message's role must be user, assistant, system or developer");
                goto bad;
            }
            json_t *text = item_text(json_object_get(item, "content"));
            if (!text) {
                snprintf(param, sizeof param, "input[%zu].content", at);
                kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param,
                             "a message's content must be a string or an array of "
                             "input_text / output_text parts");
                goto bad;
            }
            json_t *m = json_pack("{s:s, s:o}", "role", role, "content", text);
            json_array_append_new(out, m);
            last_assistant = !strcmp(role, "assistant") ? m : NULL;
            if (last_assistant && reasoning)
                json_object_set(m, "reasoning_content", reasoning);
            json_decref(reasoning);
            reasoning = NULL;
        } else if (!strcmp(type, "reasoning")) {
            /* the reasoning of the reply that follows: its reasoning_text parts */
            json_t *parts = json_object_get(item, "content"), *enc = json_object_get(item,
                                                                           "encrypted_content");
            if (enc && !json_is_null(enc)) {
                snprintf(param, sizeof param, "input[%zu].encrypted_content", at);
                kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, param,
                             "%s: kvpd keeps no encrypted reasoning", param);
                goto bad;
            }
            json_t *text = json_string("");
            size_t k;
            json_t *part;
            int ok = !parts || json_is_null(parts) || json_is_array(parts);
            json_array_foreach(parts, k, part) {
                const char *pt = str(part, "type");
                json_t *pv = json_object_get(part, "text");
                if (!pt || strcmp(pt, "reasoning_text") || !json_is_string(pv)) {
                    ok = 0;
                    break;
                }
                size_t a = json_string_length(text), b = json_string_length(pv);
                char *joined = malloc(a + b + 1);
                if (!joined)
                    break;
                memcpy(joined, json_string_value(text), a);
                memcpy(joined + a, json_string_value(pv), b);
                json_decref(text);
                text = json_stringn_nocheck(joined, a + b);
                free(joined);
            }
            if (!ok) {
                json_decref(text);
                snprintf(param, sizeof param, "input[%zu].content", at);
                kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param,
                             "%s must be an array of reasoning_text parts", param);
                goto bad;
            }
            json_decref(reasoning);
            reasoning = text;
            last_assistant = NULL;   /* it opens a reply of its own */
        } else if (!strcmp(type, "function_call")) {
            const char *call_id = str(item, "call_id"), *name = str(item, "name");
            json_t *args = json_object_get(item, "arguments");
            const char *miss = !call_id ? "call_id" : !name ? "name"
                               : !json_is_string(args) ? "arguments" : NULL;
            if (miss) {
                snprintf(param, sizeof param, "input[%zu].%s", at, miss);
                kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param,
                             "%s is required and must be a string", param);
                goto bad;
            }
            if (!last_assistant) {
                last_assistant = json_pack("{s:s, s:n}", "role", "assistant", "content");
                json_array_append_new(out, last_assistant);
                if (reasoning)
                    json_object_set(last_assistant, "reasoning_content", reasoning);
                json_decref(reasoning);
                reasoning = NULL;
            }
            json_t *tc = json_object_get(last_assistant, "tool_calls");
            if (!tc) {
                tc = json_array();
                json_object_set_new(last_assistant, "tool_calls", tc);
            }
            json_array_append_new(tc, json_pack("{s:s, s:s, s:{s:s, s:O}}", "id", call_id,
                                                 "type", "function", "function", "name", name,
                                                 "arguments", args));
            json_object_set_new(calls, call_id, json_true());
        } else if (!strcmp(type, "function_call_output")) {
            const char *call_id = str(item, "call_id");
            snprintf(param, sizeof param, "input[%zu].call_id", at);
            if (!call_id || !json_object_get(calls, call_id)) {
                kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param, call_id
                             ? "%s '%.64s' names no function_call earlier in the conversation"
                             : "%s is required%.0s", param, call_id ? call_id : "");
                goto bad;
            }
            json_t *text = item_text(json_object_get(item, "output"));
            if (!text) {
                snprintf(param, sizeof param, "input[%zu].output", at);
                kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param,
                             "%s must be a string or an array of input_text parts", param);
                goto bad;
            }
            json_array_append_new(out, json_pack("{s:s, s:s, s:o}", "role", "tool",
                                                 "tool_call_id", call_id, "content", text));
            last_assistant = NULL;
        } else {
            snprintf(param, sizeof param, "input[%zu].type", at);
            kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, param,
                         "%s '%.40s': only message, reasoning, function_call and "
                         "function_call_output items are supported by kvpd", param, type);
            goto bad;
        }
    }
    json_decref(calls);
    json_decref(reasoning);
    return out;
bad:
    json_decref(reasoning);
    json_decref(calls);
    json_decref(out);
    return NULL;
}

/* ---- the answer ---- */

json_t *kvpd_items_message(const char *id, const char *text, size_t len, const char *status,
                           json_t *logprobs)
{
    json_t *content = text ? json_pack("[{s:s, s:s%, s:[], s:o}]", "type", "output_text",
                                       "text", text, len, "annotations", "logprobs",
                                       logprobs ? logprobs : json_array())
                           : json_array();
    if (!text)
        json_decref(logprobs);
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", id, "status", status,
                     "role", "assistant", "content", content);
}

json_t *kvpd_items_call(const char *id, const char *call_id, const char *name,
                        const char *arguments, const char *status)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", id,
                     "call_id", call_id, "name", name, "arguments", arguments, "status", status);
}

json_t *kvpd_items_reasoning(const char *id, const char *text, size_t len, const char *status)
{
    json_t *content = text ? json_pack("[{s:s, s:s%}]", "type", "reasoning_text", "text", text,
                                       len)
                           : json_array();
    return json_pack("{s:s, s:s, s:s, s:[], s:o}", "type", "reasoning", "id", id, "status",
                     status, "summary", "content", content);
}

json_t *kvpd_items_output(const json_t *msg, const char *msg_id, const char *status)
{
    json_t *out = json_array(), *content = json_object_get(msg, "content");
    json_t *calls = json_object_get(msg, "tool_calls");
    json_t *reasoning = json_object_get(msg, "reasoning_content");
    char rs_id[64];
    if (json_is_string(reasoning) && kvpd_oai_new_id(rs_id, sizeof rs_id, "rs_") == 0)
        json_array_append_new(out, kvpd_items_reasoning(rs_id, json_string_value(reasoning),
                                                        json_string_length(reasoning),
                                                        "completed"));
    if ((json_is_string(content) && json_string_length(content)) || !json_array_size(calls))
        json_array_append_new(out, kvpd_items_message(msg_id, json_string_value(content) ?
                                                      json_string_value(content) : "",
                                                      json_string_length(content), status,
                                                      NULL));
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        char id[64];
        if (kvpd_oai_new_id(id, sizeof id, "fc_") < 0)
            continue;
        json_t *fn = json_object_get(c, "function");
        json_array_append_new(out, kvpd_items_call(id, json_string_value(json_object_get(c, "id")),
                                                   json_string_value(json_object_get(fn, "name")),
                                                   json_string_value(json_object_get(fn, "arguments")),
                                                   "completed"));
    }
    return out;
}

json_t *kvpd_items_output_text(const json_t *output)
{
    /* the messages' output_text parts only: a reasoning item's text is not the answer */
    json_t *msgs = json_array();
    size_t i;
    json_t *item;
    json_array_foreach(output, i, item)
        if (!strcmp(str(item, "type") ? str(item, "type") : "", "message"))
            json_array_append(msgs, item);
    json_t *s = msgs ? join_texts(msgs, 1) : NULL;
    json_decref(msgs);
    return s ? s : json_string("");
}
