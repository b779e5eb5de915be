/* Tool calling's request and answer codec for the OpenAI API (web/oai_tools.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/textbuf.h"
#include "model/grammar.h"
#include "model/schema.h"
#include "web/oai_error.h"
#include "web/oai_tools.h"

__attribute__((format(printf, 3, 4)))
static int bad(kvpd_oai_tools_err *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof e->param, "%s", param);
    e->unknown = 0;
    return -1;
}

/* obj's first key not among known (NULL-terminated), refused by its path "<at>.<key>";
 * 0 when it has none. */
static int keys(kvpd_oai_tools_err *e, const json_t *obj, const char *at,
                const char *const *known)
{
    const char *k = kvpd_oai_unknown_key(obj, known);
    if (!k)
        return 0;
    kvpd_oai_unknown_at(e->param, sizeof e->param, e->msg, sizeof e->msg, at, k);
    e->unknown = 1;
    return -1;
}

/* The keys OpenAI's API defines for a function tool ({type, function: {name, description,
 * parameters, strict}}) and a named tool_choice ({type, function: {name}}). The template
 * is given the whole function; a forced call is generated under its parameters schema,
 * strict or not (docs/openai.md, "Tool calling"). */
static const char *const tool_keys[] = {"type", "function", NULL};
static const char *const function_keys[] = {"name", "description", "parameters", "strict", NULL};
static const char *const choice_keys[] = {"type", "function", NULL};
static const char *const choice_function_keys[] = {"name", NULL};

static const char *str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v)
               ? json_string_value(v) : NULL;
}

/* A function whose parameters admit only {}: none declared, or an object schema without
 * properties that forbids others. Its forced call is written whole. */
static int takes_nothing(json_t *fn)
{
    json_t *p = json_object_get(fn, "parameters");
    if (!p || json_is_null(p))
        return 1;
    json_t *props = json_object_get(p, "properties"), *req = json_object_get(p, "required");
    return (!props || (json_is_object(props) && json_object_size(props) == 0)) &&
           json_is_false(json_object_get(p, "additionalProperties")) &&
           (!req || json_array_size(req) == 0);
}

static int check_tools(kvpd_oai_tools *t, json_t *tools, kvpd_oai_tools_err *e)
{
    char param[96];
    if (!json_is_array(tools))
        return bad(e, "tools", "tools must be an array of function tools");
    if (json_array_size(tools) > KVP_HUB_MAX_TOOLS)
        return bad(e, "tools", "at most %d tools per request (this one has %zu)",
                   KVP_HUB_MAX_TOOLS, json_array_size(tools));
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        snprintf(param, sizeof param, "tools[%zu]", i);
        const char *type = str(tool, "type");
        if (!json_is_object(tool) || !type || strcmp(type, "function"))
            return bad(e, param, "%s must be {\"type\": \"function\", \"function\": {...}} "
                       "(kvpd has function tools only)", param);
        if (keys(e, tool, param, tool_keys) < 0)
            return -1;
        json_t *fn = json_object_get(tool, "function");
        snprintf(param, sizeof param, "tools[%zu].function", i);
        if (!json_is_object(fn))
            return bad(e, param, "%s must be an object: {\"name\": ..., \"description\": ..., "
                       "\"parameters\": {...}}", param);
        if (keys(e, fn, param, function_keys) < 0)
            return -1;
        const char *name = str(fn, "name");
        snprintf(param, sizeof param, "tools[%zu].function.name", i);
        if (!name || !kvp_toolcall_name_ok(name, strlen(name)))
            return bad(e, param, "%s must be 1 to %d letters, digits, '_' or '-'", param,
                       KVP_TOOLCALL_NAME_MAX);
        if (json_object_get(t->names, name))
            return bad(e, param, "the function '%s' is declared twice", name);
        json_t *d = json_object_get(fn, "description"), *p = json_object_get(fn, "parameters");
        json_t *strict = json_object_get(fn, "strict");
        const char *wrong = d && !json_is_null(d) && !json_is_string(d) ? "description must be a string"
                          : p && !json_is_null(p) && !json_is_object(p) ? "parameters must be a JSON schema object"
                          : strict && !json_is_null(strict) && !json_is_boolean(strict)
                          ? "strict must be a boolean" : NULL;
        if (wrong) {
            snprintf(param, sizeof param, "tools[%zu].function.%.*s", i,
                     (int)strcspn(wrong, " "), wrong);
            return bad(e, param, "tools[%zu].function.%s", i, wrong);
        }
        json_object_set_new(t->names, name, json_pack("{s:b}", "empty", takes_nothing(fn)));
    }
    return 0;
}

/* The grammar of a forced call: the format's opening is prefilled (it may hold control
 * tokens, which only the template encodes), the rest is sampled under the grammar of
 * `{"name": NAME, KEY: ARGS}` and the format's close, for the named function or (NULL)
 * any declared one. */
static int forced_grammar(kvpd_oai_tools *t, json_t *tools, const char *named,
                          kvpd_oai_tools_err *e)
{
    kvp_toolcall_shape shape;
    if (kvp_toolcall_frame(t->format, &shape) < 0)
        return bad(e, "tools", "this model's chat template has no tool-call format");
    kvp_schema_fn fns[KVP_HUB_MAX_TOOLS];
    int n = 0;
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        const char *name = str(fn, "name");
        if (named && strcmp(name, named))
            continue;
        json_t *p = json_object_get(fn, "parameters");
        if (n < KVP_HUB_MAX_TOOLS)
            fns[n++] = (kvp_schema_fn){name, p && !json_is_null(p) ? p : NULL};
    }
    char err[256];
    t->grammar = kvp_schema_compile_calls_as(fns, n, NULL, shape.args_key, shape.close, err,
                                             sizeof err);
    if (!t->grammar)
        return bad(e, "tools", "tool_choice forces a call, so the tools' parameters must "
                   "compile to a grammar, and one does not: %s", err);
    size_t len = strlen(shape.open);
    if (len >= sizeof t->prefix)
        return bad(e, "tool_choice", "the call's opening does not fit");
    memcpy(t->prefix, shape.open, len + 1);
    t->prefix_len = len;
    return 0;
}

int kvpd_oai_tools_request(kvpd_oai_tools *t, json_t *req, int format, kvp_turn_opts *o,
                           kvpd_oai_tools_err *e)
{
    t->format = (enum kvp_tool_format)format;
    json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice");
    json_t *par = json_object_get(req, "parallel_tool_calls");
    if (par && !json_is_null(par) && !json_is_boolean(par))
        return bad(e, "parallel_tool_calls", "parallel_tool_calls must be a boolean");
    if (!(t->names = json_object()))
        return bad(e, "tools", "out of memory");
    int declared = tools && !json_is_null(tools) && json_array_size(tools) > 0;
    if (declared && t->format == KVP_TOOLS_NONE)
        return bad(e, "tools", "this model's chat template has no tool-call format (kvpd "
                   "renders tools with the model's own Jinja template: Hermes/Qwen, Llama 3.1+ "
                   "or Mistral)");
    if (tools && !json_is_null(tools) && check_tools(t, tools, e) < 0)
        return -1;
    /* tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {name}} */
    const char *mode = json_is_string(choice) ? json_string_value(choice) : NULL;
    const char *named = NULL;
    if (json_is_object(choice)) {
        named = str(json_object_get(choice, "function"), "name");
        const char *type = str(choice, "type");
        if (type && !strcmp(type, "function") &&
            (keys(e, choice, "tool_choice", choice_keys) < 0 ||
             (json_is_object(json_object_get(choice, "function")) &&
              keys(e, json_object_get(choice, "function"), "tool_choice.function",
                   choice_function_keys) < 0)))
            return -1;
        if (!type || strcmp(type, "function") || !named)
            return bad(e, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" "
                       "or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (!json_object_get(t->names, named))
            return bad(e, "tool_choice", "tool_choice names the function '%s', which tools does "
                       "not declare", named);
    } else if (choice && !json_is_null(choice) &&
               (!mode || (strcmp(mode, "none") && strcmp(mode, "auto") && strcmp(mode, "required")))) {
        return bad(e, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or "
                   "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    int required = mode && !strcmp(mode, "required");
    if ((required || named) && !declared)
        return bad(e, "tool_choice", "tool_choice %s needs tools", required ? "required" : "names a function and");
    if (!declared)
        return 0;
    if (t->format == KVP_TOOLS_NONE)
        return bad(e, "tools", "this model's chat template has no tool-call format (kvpd "
                   "renders tools with the model's own Jinja template: Hermes/Qwen, Llama 3.1+ "
                   "or Mistral)");
    if (!(t->tools = json_dumps(tools, JSON_COMPACT)))
        return bad(e, "tools", "out of memory");
    t->tools_len = strlen(t->tools);
    o->tools = t->tools;
    o->tools_len = t->tools_len;
    /* "none": the tools are rendered (the model knows them, the prompt stays the same
     * across turns) but the reply is not parsed for calls */
    t->parse = !(mode && !strcmp(mode, "none"));
    int single = json_is_false(par) || required || named;
    t->single = single;
    if (required && json_object_size(t->names) == 1)
        named = json_object_iter_key(json_object_iter(t->names));
    if (named && json_is_true(json_object_get(json_object_get(t->names, named), "empty"))) {
        /* a call without arguments is written whole: nothing is left to sample */
        int n = kvp_toolcall_opening(t->format, named, 1, t->prefix, sizeof t->prefix);
        if (n < 0)
            return bad(e, "tool_choice", "the call's opening does not fit");
        t->prefix_len = (size_t)n;
        if (t->format != KVP_TOOLS_HERMES)   /* the whole call, written: done */
            snprintf(t->end_after, sizeof t->end_after, "%s", t->prefix);
    } else if (named || required) {
        if (forced_grammar(t, tools, named, e) < 0)
            return -1;
        o->grammar = t->grammar;
    }
    if (single && !t->end_after[0])
        snprintf(t->end_after, sizeof t->end_after, "%s", kvp_toolcall_close(t->format));
    o->reply_prefix = t->prefix_len ? t->prefix : NULL;
    o->reply_prefix_len = t->prefix_len;
    o->end_after = t->end_after[0] ? t->end_after : NULL;
    o->end_after_len = strlen(t->end_after);
    return 0;
}

/* ---- the history ---- */

/* A content: a string, text parts, or (allow_null) null/absent as "". A new string. */
static json_t *content_of(json_t *c, int allow_null)
{
    if (json_is_string(c))
        return json_incref(c);
    if ((!c || json_is_null(c)) && allow_null)
        return json_string("");
    if (!json_is_array(c))
        return NULL;
    json_t *s = json_string("");
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        const char *type = str(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!type || strcmp(type, "text") || !json_is_string(text)) {
            json_decref(s);
            return NULL;
        }
        size_t a = json_string_length(s), b = json_string_length(text);
        char *buf = malloc(a + b + 1);
        if (!buf) {
            json_decref(s);
            return NULL;
        }
        memcpy(buf, json_string_value(s), a);
        memcpy(buf + a, json_string_value(text), b);
        json_decref(s);
        s = json_stringn(buf, a + b);
        free(buf);
    }
    return s;
}

/* An assistant message with tool_calls as the model's own text; names holds the ids
 * seen (id -> function name). */
static json_t *assistant(const kvpd_oai_tools *t, json_t *msg, size_t i, json_t *ids,
                         kvpd_oai_tools_err *e)
{
    char param[96];
    json_t *calls = json_object_get(msg, "tool_calls");
    snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
    if (!json_is_array(calls) || json_array_size(calls) > KVP_TOOLCALL_MAX) {
        bad(e, param, "%s must be an array of at most %d calls", param, KVP_TOOLCALL_MAX);
        return NULL;
    }
    if (t->format == KVP_TOOLS_NONE) {
        bad(e, param, "this model's chat template has no tool-call format");
        return NULL;
    }
    json_t *content = content_of(json_object_get(msg, "content"), 1);
    if (!content) {
        snprintf(param, sizeof param, "messages[%zu].content", i);
        bad(e, param, "%s must be a string, text parts or null", param);
        return NULL;
    }
    size_t len = json_string_length(content);
    char *text = malloc(len + 1);
    if (text)
        memcpy(text, json_string_value(content), len + 1);
    json_decref(content);
    size_t j;
    json_t *call;
    json_array_foreach(calls, j, call) {
        json_t *fn = json_object_get(call, "function");
        const char *id = str(call, "id"), *name = str(fn, "name"), *type = str(call, "type");
        json_t *args = json_object_get(fn, "arguments");
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu]", i, j);
        if (!id || !*id || strlen(id) > 64 || (type && strcmp(type, "function")) || !name ||
            !kvp_toolcall_name_ok(name, strlen(name)) || !json_is_string(args)) {
            free(text);
            bad(e, param, "%s must be {\"id\": ..., \"type\": \"function\", \"function\": "
                "{\"name\": ..., \"arguments\": \"<JSON object>\"}}", param);
            return NULL;
        }
        const char *a = json_string_value(args);
        size_t alen = json_string_length(args), at = 0;
        while (at < alen && strchr(" \t\r\n", a[at]))
            at++;
        size_t end = at < alen && a[at] == '{' ? kvp_json_value_end(a + at, alen - at) : 0;
        size_t tail = at + end;
        while (tail < alen && strchr(" \t\r\n", a[tail]))
            tail++;
        if (!end || tail != alen) {
            free(text);
            snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function.arguments", i, j);
            bad(e, param, "%s must be the JSON text of an object", param);
            return NULL;
        }
        json_object_set_new(ids, id, json_string(name));
        if (text && kvp_toolcall_write(t->format, name, strlen(name), a + at, end,
                                       j > 0 || len > 0, &text, &len) < 0) {
            free(text);
            text = NULL;
        }
    }
    if (!text) {
        bad(e, "messages", "out of memory");
        return NULL;
    }
    json_t *out = json_pack("{s:s, s:s%}", "role", "assistant", "content", text, len);
    free(text);
    json_t *reasoning = json_object_get(msg, "reasoning_content");   /* checked by the parse */
    if (out && reasoning)
        json_object_set(out, "reasoning_content", reasoning);
    return out;
}

int kvpd_oai_tools_messages(const kvpd_oai_tools *t, json_t *msgs, json_t **out,
                            kvpd_oai_tools_err *e)
{
    *out = NULL;
    if (!json_is_array(msgs))
        return bad(e, "messages", "messages must be a non-empty array");
    json_t *res = json_array(), *ids = json_object(), *run = NULL;
    char param[96];
    size_t i;
    json_t *msg;
    json_array_foreach(msgs, i, msg) {
        const char *role = str(msg, "role");
        int tool = role && !strcmp(role, "tool");
        if (run && !tool) {   /* the run of tool results ends */
            char *s = json_dumps(run, JSON_COMPACT | JSON_ENCODE_ANY);
            json_array_append_new(res, json_pack("{s:s, s:s}", "role", "tool", "content", s ? s : "[]"));
            free(s);
            json_decref(run);
            run = NULL;
        }
        json_t *calls = json_object_get(msg, "tool_calls");
        if (role && !strcmp(role, "assistant") && calls && !json_is_null(calls) &&
            !(json_is_array(calls) && json_array_size(calls) == 0)) {
            json_t *a = assistant(t, msg, i, ids, e);
            if (!a)
                goto fail;
            json_array_append_new(res, a);
        } else if (tool) {
            const char *id = str(msg, "tool_call_id");
            snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
            if (!id) {
                bad(e, param, "%s is required: the id of the call this is the result of", param);
                goto fail;
            }
            json_t *name = json_object_get(ids, id);
            if (!name) {
                bad(e, param, "%s '%.64s' names no tool call of an earlier assistant message",
                    param, id);
                goto fail;
            }
            json_t *content = content_of(json_object_get(msg, "content"), 0);
            if (!content) {
                snprintf(param, sizeof param, "messages[%zu].content", i);
                bad(e, param, "%s must be a string or an array of text parts", param);
                goto fail;
            }
            if (!run)
                run = json_array();
            json_array_append_new(run, json_pack("{s:s, s:O, s:o}", "tool_call_id", id, "name",
                                                 name, "content", content));
        } else {
            json_array_append(res, msg);
        }
    }
    if (run) {
        char *s = json_dumps(run, JSON_COMPACT);
        json_array_append_new(res, json_pack("{s:s, s:s}", "role", "tool", "content", s ? s : "[]"));
        free(s);
        json_decref(run);
    }
    json_decref(ids);
    *out = res;
    return 0;
fail:
    json_decref(run);
    json_decref(ids);
    json_decref(res);
    return -1;
}

/* ---- the answer ---- */

static void new_id(char *out, size_t cap)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char raw[24];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        memset(raw, 0, sizeof raw);
    int k = snprintf(out, cap, "call_");
    for (size_t i = 0; i < sizeof raw && (size_t)k + 1 < cap; i++)
        out[k++] = abc[raw[i] % (sizeof abc - 1)];
    out[k] = '\0';
}

static json_t *args_of(const char *text, kvp_range a)
{
    return a.to > a.from ? json_stringn(text + a.from, a.to - a.from) : json_string("{}");
}

static json_t *joined_content(const char *text, const kvp_toolcalls *tc, size_t upto)
{
    size_t n = 0;
    for (int i = 0; i < tc->n_content && tc->content[i].from < upto; i++)
        n += (tc->content[i].to < upto ? tc->content[i].to : upto) - tc->content[i].from;
    char *buf = malloc(n + 1);
    if (!buf)
        return NULL;
    n = 0;
    for (int i = 0; i < tc->n_content && tc->content[i].from < upto; i++) {
        size_t to = tc->content[i].to < upto ? tc->content[i].to : upto;
        memcpy(buf + n, text + tc->content[i].from, to - tc->content[i].from);
        n += to - tc->content[i].from;
    }
    json_t *s = json_stringn(buf, n);
    free(buf);
    return s;
}

/* The reply's calls: with t->single only the first, as parallel_tool_calls false asks (a
 * Hermes reply ends after its first call; a Llama 3 or Mistral one may hold a list, whose
 * later calls are dropped, their text with them). Returns the count. */
static int parse_calls(const kvpd_oai_tools *t, const char *text, size_t len, int final,
                       kvp_toolcalls *tc)
{
    kvp_toolcall_parse(t->format, text, len, final, tc);
    if (t->single && tc->n > 1) {
        size_t cut = tc->call[1].name.from;   /* inside the second call */
        int k = 0;
        while (k < tc->n_content && tc->content[k].from < cut)
            k++;
        tc->n_content = k;
        tc->n = 1;
    }
    return tc->n;
}

json_t *kvpd_oai_tools_reply(kvpd_oai_tools *t, const char *text, size_t len, int *calls)
{
    kvp_toolcalls tc;
    *calls = 0;
    if (!t->parse || parse_calls(t, text, len, 1, &tc) == 0)
        return json_pack("{s:s, s:s%}", "role", "assistant", "content", text, len);
    json_t *arr = json_array();
    for (int i = 0; i < tc.n; i++) {
        char id[32];
        new_id(id, sizeof id);
        kvp_range n = tc.call[i].name;
        json_array_append_new(arr, json_pack("{s:s, s:s, s:{s:s%, s:o}}", "id", id, "type",
                                             "function", "function", "name", text + n.from,
                                             n.to - n.from, "arguments", args_of(text, tc.call[i].args)));
    }
    *calls = tc.n;
    json_t *content = joined_content(text, &tc, len);
    if (content && json_string_length(content) == 0) {
        json_decref(content);
        content = json_null();
    }
    return json_pack("{s:s, s:o, s:o}", "role", "assistant", "content",
                     content ? content : json_null(), "tool_calls", arr);
}

json_t *kvpd_oai_tools_feed(kvpd_oai_tools *t, const char *text, size_t len, int final)
{
    json_t *out = json_array();
    if (len) {
        if (kvp_text_append(&t->text, &t->len, &t->cap, text, len))
            return out;
    }
    kvp_toolcalls tc;
    parse_calls(t, t->text ? t->text : "", t->len, final, &tc);
    json_t *content = joined_content(t->text, &tc, tc.held);
    if (content && json_string_length(content) > t->sent) {
        size_t n = json_string_length(content);
        json_array_append_new(out, json_pack("{s:s%}", "content", json_string_value(content) + t->sent,
                                             n - t->sent));
        t->sent = n;
    }
    json_decref(content);
    for (; t->calls_sent < tc.n; t->calls_sent++) {
        int i = t->calls_sent;
        new_id(t->ids[i], sizeof t->ids[i]);
        kvp_range n = tc.call[i].name;
        json_array_append_new(out, json_pack("{s:[{s:i, s:s, s:s, s:{s:s%, s:s}}]}", "tool_calls",
                                             "index", i, "id", t->ids[i], "type", "function",
                                             "function", "name", t->text + n.from, n.to - n.from,
                                             "arguments", ""));
        json_array_append_new(out, json_pack("{s:[{s:i, s:{s:o}}]}", "tool_calls", "index", i,
                                             "function", "arguments",
                                             args_of(t->text, tc.call[i].args)));
    }
    return out;
}

void kvpd_oai_tools_free(kvpd_oai_tools *t)
{
    free(t->tools);
    free(t->text);
    kvp_grammar_unref(t->grammar);
    json_decref(t->names);
    memset(t, 0, sizeof *t);
}

void kvpd_oai_tools_delta(json_t *d, kvpd_oai_delta *out)
{
    memset(out, 0, sizeof *out);
    json_t *content = json_object_get(d, "content");
    if (json_is_string(content) && json_string_length(content)) {
        out->content = json_string_value(content);
        out->content_len = json_string_length(content);
    }
    json_t *call = json_array_get(json_object_get(d, "tool_calls"), 0);
    json_t *fn = json_object_get(call, "function");
    const char *id = json_string_value(json_object_get(call, "id"));
    if (id) {   /* a call's opening: its id and name; its arguments come next */
        const char *name = json_string_value(json_object_get(fn, "name"));
        out->call_id = id;
        out->call_name = name ? name : "";
    } else if (call) {
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        out->arguments = args ? args : "";
    }
}
