/* The messages and tools of a conversation as the Jinja template's values: a user message,
 * tool results (a message whose text is a JSON array of {"tool_call_id", "name",
 * "content"}, one template message each), and an assistant reply, whose tool calls (in
 * the template's own format, model/toolcall.h) become the message's tool_calls with the
 * text outside them as its content, so the template renders them as it renders any
 * client's; and `tools` (a JSON array, OpenAI's shape) as they are. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja.h"
#include "model/jinja_json.h"
#include "model/reasoning.h"
#include "model/template_impl.h"
#include "model/toolcall.h"

static kvp_jv *from_json(kvp_jarena *a, json_t *j, int depth)
{
    if (depth > 64)
        return NULL;
    switch (json_typeof(j)) {
    case JSON_NULL: return kvp_jv_none(a);
    case JSON_TRUE: return kvp_jv_bool(a, 1);
    case JSON_FALSE: return kvp_jv_bool(a, 0);
    case JSON_INTEGER: return kvp_jv_int(a, json_integer_value(j));
    case JSON_REAL: return kvp_jv_float(a, json_real_value(j));
    case JSON_STRING: return kvp_jv_str(a, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        kvp_jv *l = kvp_jv_list(a);
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x)
            if (kvp_jv_append(a, l, from_json(a, x, depth + 1)))
                return NULL;
        return l;
    }
    case JSON_OBJECT: {
        kvp_jv *d = kvp_jv_dict(a);
        const char *k;
        json_t *x;
        json_object_foreach(j, k, x)
            if (kvp_jv_set(a, d, k, from_json(a, x, depth + 1)))
                return NULL;
        return d;
    }
    }
    return NULL;
}

kvp_jv *kvp_jv_from_json(kvp_jarena *a, json_t *j)
{
    return from_json(a, j, 0);
}

kvp_jv *kvp_tpl_json(kvp_jarena *a, const char *text, size_t len)
{
    json_t *j = json_loadb(text, len, JSON_ALLOW_NUL, NULL);
    kvp_jv *v = j ? from_json(a, j, 0) : NULL;
    json_decref(j);
    return v;
}

static kvp_jv *plain(kvp_jarena *a, const char *role, const char *text, size_t len)
{
    kvp_jv *m = kvp_jv_dict(a);
    kvp_jv_set(a, m, "role", kvp_jv_str(a, role, strlen(role)));
    kvp_jv_set(a, m, "content", kvp_jv_str(a, text, len));
    return m;
}

/* Tool results: one template message per element; a text that is not such an array is
 * one tool message with the text as its content. */
static int tool_results(kvp_jarena *a, kvp_jv *list, const char *text, size_t len)
{
    json_t *j = json_loadb(text, len, JSON_ALLOW_NUL, NULL);
    if (!json_is_array(j) || !json_array_size(j)) {
        json_decref(j);
        return kvp_jv_append(a, list, plain(a, "tool", text, len));
    }
    size_t i;
    json_t *r;
    int rc = 0;
    json_array_foreach(j, i, r) {
        json_t *content = json_object_get(r, "content");
        kvp_jv *m = json_is_string(content)
                        ? plain(a, "tool", json_string_value(content), json_string_length(content))
                        : plain(a, "tool", "", 0);
        static const char *const keys[] = {"tool_call_id", "name"};
        for (int k = 0; k < 2; k++) {
            json_t *v = json_object_get(r, keys[k]);
            if (json_is_string(v))
                kvp_jv_set(a, m, keys[k], kvp_jv_str(a, json_string_value(v), json_string_length(v)));
        }
        rc |= kvp_jv_append(a, list, m);
    }
    json_decref(j);
    return rc;
}

static kvp_jv *reply(kvp_jarena *a, enum kvp_tool_format f, const char *text, size_t len)
{
    kvp_toolcalls tc;
    if (f == KVP_TOOLS_NONE || kvp_toolcall_parse(f, text, len, 1, &tc) == 0)
        return plain(a, "assistant", text, len);
    size_t clen = 0;
    for (int i = 0; i < tc.n_content; i++)
        clen += tc.content[i].to - tc.content[i].from;
    char *c = malloc(clen + 1);
    if (!c)
        return NULL;
    clen = 0;
    for (int i = 0; i < tc.n_content; i++) {
        memcpy(c + clen, text + tc.content[i].from, tc.content[i].to - tc.content[i].from);
        clen += tc.content[i].to - tc.content[i].from;
    }
    kvp_jv *m = plain(a, "assistant", c, clen), *calls = kvp_jv_list(a);
    free(c);
    for (int i = 0; i < tc.n; i++) {
        kvp_range n = tc.call[i].name, g = tc.call[i].args;
        kvp_jv *fn = kvp_jv_dict(a), *call = kvp_jv_dict(a);
        kvp_jv_set(a, fn, "name", kvp_jv_str(a, text + n.from, n.to - n.from));
        /* as the client sends them back: the JSON text of the arguments, a string */
        kvp_jv_set(a, fn, "arguments", g.to > g.from ? kvp_jv_str(a, text + g.from, g.to - g.from)
                                                     : kvp_jv_str(a, "{}", 2));
        kvp_jv_set(a, call, "type", kvp_jv_str(a, "function", 8));
        kvp_jv_set(a, call, "function", fn);
        kvp_jv_append(a, calls, call);
    }
    kvp_jv_set(a, m, "tool_calls", calls);
    return m;
}

/* A reply that opens with a reasoning block, for a template that reads
 * reasoning_content: the block there, the answer as the message (its content, its calls). */
static kvp_jv *reply_reasoning(kvp_jarena *a, enum kvp_tool_format f, const char *text,
                               size_t len)
{
    kvp_reasoning_parts p = kvp_reasoning_split(text, len);
    if (!p.found)
        return reply(a, f, text, len);
    kvp_jv *m = reply(a, f, text + p.c_from, p.c_to - p.c_from);
    if (m)
        kvp_jv_set(a, m, "reasoning_content", kvp_jv_str(a, text + p.r_from, p.r_to - p.r_from));
    return m;
}

int kvp_tpl_jinja_messages(kvp_jarena *a, kvp_jv *list, enum kvp_tool_format f, int reasoning,
                           const kvp_chat_msg *msgs, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (msgs[i].user == KVP_CHAT_TOOL)
            rc |= tool_results(a, list, msgs[i].text, msgs[i].len);
        else if (msgs[i].user)
            rc |= kvp_jv_append(a, list, plain(a, "user", msgs[i].text, msgs[i].len));
        else
            rc |= kvp_jv_append(a, list, reasoning ? reply_reasoning(a, f, msgs[i].text, msgs[i].len)
                                                   : reply(a, f, msgs[i].text, msgs[i].len));
    }
    return rc;
}
