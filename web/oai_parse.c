/* The OpenAI API's request codec (web/oai_parse.h): JSON in, the hub's turn options and
 * messages or an error out. No I/O. */
#include "web/oai_parse.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/grammar.h"
#include "model/reasoning.h"
#include "web/format.h"

/* Sets e (param may be NULL) and returns -1. */
int kvpd_oai_bad(kvpd_oai_err *e, enum kvpd_oai_code code, const char *param, const char *fmt,
                 ...)
{
    e->status = kvpd_oai_code_status(code);
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

int kvpd_oai_unknown(kvpd_oai_err *e, const char *at, const char *key)
{
    e->status = kvpd_oai_code_status(KVPD_OAI_E_UNKNOWN_PARAMETER);
    e->code = KVPD_OAI_E_UNKNOWN_PARAMETER;
    kvpd_oai_unknown_at(e->param, sizeof e->param, e->message, sizeof e->message, at, key);
    return -1;
}

json_t *kvpd_oai_parse_json(const char *body, size_t len, kvpd_oai_err *e)
{
    json_error_t jerr;
    /* Texts may hold NUL (\u0000): kvpd's own replies can, and they come back in the
     * history; every text is handled by its length. Duplicate keys are refused, as on
     * the websocket (docs/protocol.md). */
    json_t *req = json_loadb(body ? body : "", body ? len : 0,
                             JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
    if (!req) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_JSON, NULL, "the body is not valid JSON: %s (at byte %d)",
            jerr.text, jerr.position);
        return NULL;
    }
    if (!json_is_object(req)) {
        json_decref(req);
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_JSON, NULL, "the body must be a JSON object");
        return NULL;
    }
    return req;
}

/* 1 when name is one of the comma-separated ids in list. */
static int listed(const char *list, const char *name, size_t len)
{
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == len && !memcmp(p, name, n))
            return 1;
        p += n + (e != NULL);
    }
    return 0;
}

int kvpd_oai_parse_model(json_t *req, const kvpd_oai_limits *l, kvpd_oai_err *e)
{
    json_t *model = json_object_get(req, "model");
    if (!model || json_is_null(model))
        return 0;
    if (!json_is_string(model))
        return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "model", "model must be a string");
    const char *m = json_string_value(model);
    size_t len = json_string_length(model);
    /* One model is loaded: any name is served, unless strict_model_name asks for its
     * own (or an alias). The answer always names the real model. */
    if (!l->strict_model_name || (len == strlen(l->model) && !strcmp(m, l->model)) ||
        listed(l->model_alias, m, len))
        return 0;
    return kvpd_oai_bad(e, KVPD_OAI_E_MODEL_NOT_FOUND, "model", "the model '%.*s' does not exist; this "
               "server has '%s'", len > 100 ? 100 : (int)len, m, l->model);
}

/* The top-level fields each endpoint reads besides the sampling ones (sampling.c's
 * kvpd_sampling_fields, which every endpoint reads): those it serves and those it
 * refuses by name when their value asks for what kvpd cannot do. NULL-terminated. */
static const char *const chat_fields[] = {
    "messages", "model", "max_completion_tokens", "max_tokens", "stream", "stream_options",
    "tools", "tool_choice", "parallel_tool_calls", "response_format", "n", "logprobs",
    "top_logprobs", "session", "store", "functions", "function_call", "audio", "prediction",
    "modalities",
    /* llama.cpp's server's chat fields (honoured, or refused by value) */
    "json_schema", "continue_final_message", "add_generation_prompt", "grammar",
    "return_progress", "timings_per_token", "ignore_eos", "post_sampling_probs", "id_slot",
    "n_probs", NULL};
static const char *const completions_fields[] = {
    "prompt", "model", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n",
    "logprobs", "echo", "suffix", "best_of", "top_logprobs", "tools", "tool_choice",
    "parallel_tool_calls", "response_format", NULL};
static const char *const responses_fields[] = {
    "input", "instructions", "previous_response_id", "store", "max_output_tokens", "model",
    "stream", "tools", "tool_choice", "parallel_tool_calls", "text", "include", "top_logprobs",
    "metadata", "truncation", "n", "generate", "reasoning", "conversation", "prompt",
    "background", "logprobs", "max_tokens", "max_completion_tokens", NULL};

/* Benign fields: sent by real clients (the openai SDK's types, LangChain, the AI SDK, the
 * Agents SDK, Codex), accepted and without effect, because what they ask changes nothing
 * kvpd does. user and safety_identifier name the end user for the provider's abuse
 * monitoring; service_tier picks a processing tier (kvpd has one); prompt_cache_key is a
 * routing hint for the prompt cache (kvpd finds a conversation's cached prefix itself);
 * chat's metadata tags a stored completion (kvpd stores none: store true is refused);
 * Responses' stream_options holds only include_obfuscation, padding kvpd's events do not
 * need (a loopback or TLS peer, not a third party's network). */
static const char *const chat_benign[] = {"user", "safety_identifier", "service_tier",
                                          "prompt_cache_key", "metadata", NULL};
static const char *const completions_benign[] = {"user", NULL};
static const char *const responses_benign[] = {"user", "safety_identifier", "service_tier",
                                               "prompt_cache_key", "stream_options", NULL};

static int in_list(const char *const *list, const char *key)
{
    for (; *list; list++)
        if (!strcmp(*list, key))
            return 1;
    return 0;
}

/* Objects inside a request whose keys are checked as the top level's are: the keys OpenAI's
 * API defines there that kvpd reads or that change nothing it does. stream_options'
 * include_obfuscation pads stream events (not needed on a loopback or TLS peer); text's
 * verbosity is checked by value below. NULL-terminated lists. */
static const char *const chat_stream_options[] = {"include_usage", "include_obfuscation", NULL};
static const char *const responses_stream_options[] = {"include_obfuscation", NULL};
static const char *const responses_text[] = {"format", "verbosity", NULL};
static const struct nested { enum kvpd_oai_api api; const char *field; const char *const *keys; }
    nested[] = {
        {KVPD_OAI_API_CHAT, "stream_options", chat_stream_options},
        {KVPD_OAI_API_COMPLETIONS, "stream_options", chat_stream_options},
        {KVPD_OAI_API_RESPONSES, "stream_options", responses_stream_options},
        {KVPD_OAI_API_RESPONSES, "text", responses_text},
};

/* An unknown key inside one of the nested objects, refused by its dotted path. */
static int check_nested(json_t *req, enum kvpd_oai_api api, kvpd_oai_err *e)
{
    for (size_t i = 0; i < sizeof nested / sizeof nested[0]; i++) {
        json_t *obj = nested[i].api == api ? json_object_get(req, nested[i].field) : NULL;
        if (!json_is_object(obj))
            continue;
        const char *key = kvpd_oai_unknown_key(obj, nested[i].keys);
        if (key)
            return kvpd_oai_unknown(e, nested[i].field, key);
    }
    /* text.verbosity asks for a shorter or longer reply than the model would write:
     * only the default ("medium") changes nothing. */
    json_t *verb = api == KVPD_OAI_API_RESPONSES
                 ? json_object_get(json_object_get(req, "text"), "verbosity") : NULL;
    if (verb && !json_is_null(verb) &&
        !(json_is_string(verb) && !strcmp(json_string_value(verb), "medium")))
        return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "text.verbosity",
                            "text.verbosity is not supported by kvpd (only \"medium\", the "
                            "default: kvpd does not steer a reply's length)");
    return 0;
}

int kvpd_oai_check_fields(json_t *req, enum kvpd_oai_api api, kvpd_oai_err *e)
{
    static const char *const *const fields[] = {chat_fields, completions_fields,
                                                responses_fields};
    static const char *const *const benign[] = {chat_benign, completions_benign,
                                                responses_benign};
    static const char *const name[] = {"chat completions", "completions", "the Responses API"};
    if ((unsigned)api > KVPD_OAI_API_RESPONSES)
        return kvpd_oai_bad(e, KVPD_OAI_E_SERVER, NULL, "no such endpoint");
    const char *key;
    json_t *v;
    json_object_foreach(req, key, v) {
        if (in_list(fields[api], key) || in_list(kvpd_sampling_fields, key) ||
            in_list(benign[api], key))
            continue;
        return kvpd_oai_bad(e, KVPD_OAI_E_UNKNOWN_PARAMETER, key, "unknown parameter '%.64s': "
                            "%s has no such field, and kvpd refuses what it would not honour",
                            key, name[api]);
    }
    return check_nested(req, api, e);
}

/* Fields whose meaning kvpd cannot honour: the first one present, or NULL. */
static const char *unsupported(json_t *req)
{
    static const char *absent[] = {"functions", "function_call", "audio", "prediction"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        json_t *v = json_object_get(req, absent[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
            return absent[i];
    }
    json_t *mod = json_object_get(req, "modalities");
    if (mod && !json_is_null(mod) && (json_array_size(mod) != 1 ||
                                      !json_is_string(json_array_get(mod, 0)) ||
                                      strcmp(json_string_value(json_array_get(mod, 0)), "text")))
        return "modalities";
    return NULL;
}

/* Fields of llama.cpp's server that kvpd takes only at the value that changes nothing:
 * the first one at another value, with why in msg, or NULL. */
static const char *llama_unsupported(json_t *req, char *msg, size_t msglen)
{
    static const struct { const char *name, *why; } off[] = {
        {"return_progress", "kvpd does not report prompt progress (only false)"},
        {"timings_per_token", "kvpd does not report timings in the stream (only false)"},
        {"ignore_eos", "only false here (/completion bans EOS with it)"},
        {"post_sampling_probs", "only false (logprobs are the model's distribution)"},
    };
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        json_t *v = json_object_get(req, off[i].name);
        if (v && !json_is_null(v) && !json_is_false(v)) {
            snprintf(msg, msglen, "%s is not supported by kvpd: %s", off[i].name, off[i].why);
            return off[i].name;
        }
    }
    json_t *g = json_object_get(req, "grammar");
    if (g && !json_is_null(g) && !(json_is_string(g) && json_string_length(g) == 0)) {
        snprintf(msg, msglen, "grammar is not supported by kvpd: GBNF grammars are not read "
                 "(response_format json_schema, or json_schema, constrains a reply)");
        return "grammar";
    }
    static const struct { const char *name; int neutral; } num[] = {{"id_slot", -1}, {"n_probs", 0}};
    for (size_t i = 0; i < sizeof num / sizeof num[0]; i++) {
        json_t *v = json_object_get(req, num[i].name);
        if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == num[i].neutral)) {
            snprintf(msg, msglen, "%s is not supported by kvpd (only %d)", num[i].name,
                     num[i].neutral);
            return num[i].name;
        }
    }
    return NULL;
}

/* A number field in [lo, hi] (absent or null: *has 0). -1 with e set. */
static int number(json_t *req, const char *name, double lo, double hi, int *has, double *out,
                  kvpd_oai_err *e)
{
    json_t *v = json_object_get(req, name);
    *has = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
        return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, name, "%s must be a number from %g to %g",
                   name, lo, hi);
    *has = 1;
    *out = json_number_value(v);
    return 0;
}

int kvpd_oai_parse_options(json_t *req, const kvpd_oai_limits *l, kvpd_oai_req *r,
                           kvpd_oai_err *e)
{
    kvp_turn_opts *t = &r->turn;
    memset(t, 0, sizeof *t);
    r->reasoning = l->reasoning;
    const char *field = unsupported(req);
    if (field)
        return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, field, "%s is not supported by kvpd",
                   field);
    kvpd_oai_tools_err te;
    if (kvpd_oai_tools_request(&r->tools, req, l->tool_format, t, &te) < 0)
        return kvpd_oai_bad(e, te.unknown ? KVPD_OAI_E_UNKNOWN_PARAMETER
                            : KVPD_OAI_E_INVALID_REQUEST, te.param, "%s", te.msg);
    int has;
    double v = 0;
    /* n choices: one prefill, the others forked from it (kvp_hub_chat_choices) */
    json_t *n = json_object_get(req, "n");
    r->n_choices = 1;
    if (n && !json_is_null(n)) {
        if (!json_is_integer(n) || json_integer_value(n) < 1 ||
            json_integer_value(n) > KVP_HUB_MAX_CHOICES)
            return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "n",
                       "n must be an integer from 1 to %d", KVP_HUB_MAX_CHOICES);
        r->n_choices = (int)json_integer_value(n);
    }
    /* the tool-call parser follows one reply */
    if (r->n_choices > 1 && (t->tools_len || r->tools.parse))
        return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "n",
                   "n above 1 is not supported with tools");
    const char *caps[] = {"max_completion_tokens", "max_tokens"};
    for (int i = 0; i < 2; i++) {
        if (number(req, caps[i], 1, 1e9, &has, &v, e) < 0)
            return -1;
        if (has && v != (long)v)
            return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, caps[i], "%s must be an integer", caps[i]);
        if (has && !t->max_tokens)   /* the newer name wins */
            t->max_tokens = v > l->max_tokens ? l->max_tokens : (int)v;
    }
    const char *param = NULL;
    char msg[400];
    int rc = kvpd_sampling_parse(req, 2, &r->own, t, &param, msg, sizeof msg);
    if (rc < 0)
        return kvpd_oai_bad(e, rc == -ENOMEM ? KVPD_OAI_E_SERVER : KVPD_OAI_E_INVALID_REQUEST, param,
                   "%s", msg);
    if (!t->has_seed && l->fixed_seed) {   /* the server's seed as the request's */
        t->has_seed = 1;
        t->seed = l->seed;
    }
    field = llama_unsupported(req, msg, sizeof msg);
    if (field)
        return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, field, "%s", msg);
    kvp_grammar_unref(r->grammar);
    r->grammar = NULL;
    /* llama.cpp's server's top-level json_schema: the response format of that schema */
    json_t *rf = json_object_get(req, "response_format"), *js = json_object_get(req, "json_schema");
    json_t *own = NULL;
    if (js && !json_is_null(js)) {
        if (rf && !json_is_null(rf))
            return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "json_schema",
                                "json_schema and response_format shape the same reply: give one");
        rf = own = json_pack("{s:s, s:O}", "type", "json_object", "schema", js);
        if (!own)
            return kvpd_oai_bad(e, KVPD_OAI_E_SERVER, NULL, "out of memory");
    }
    char rf_param[96];
    rc = kvpd_response_format(rf, &r->grammar, rf_param, sizeof rf_param, msg, sizeof msg);
    json_decref(own);
    if (rc < 0 && own && !strcmp(rf_param, "response_format.schema"))
        snprintf(rf_param, sizeof rf_param, "json_schema");
    if (rc < 0)
        return kvpd_oai_bad(e, rc == KVPD_FORMAT_UNKNOWN ? KVPD_OAI_E_UNKNOWN_PARAMETER
                            : KVPD_OAI_E_UNSUPPORTED_PARAMETER, rf_param, "%s", msg);
    t->grammar = r->grammar;
    /* A forced call: its grammar is the reply's. response_format shapes text replies,
     * which a forced call's turn has none of (OpenAI's API takes both together: an agent
     * with a typed output that must first call a tool). */
    if (r->tools.grammar)
        t->grammar = r->tools.grammar;
    json_t *stream = json_object_get(req, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream))
        return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "stream", "stream must be a boolean");
    r->stream = json_is_true(stream);
    json_t *so = json_object_get(req, "stream_options");
    r->include_usage = json_is_true(json_object_get(so, "include_usage"));
    return 0;
}

/* A message's text: a string, or an array of {"type":"text","text":...} parts. */
static int content_text(json_t *content, char **out, size_t *len)
{
    if (json_is_string(content)) {
        *len = json_string_length(content);
        *out = malloc(*len + 1);
        if (!*out)
            return -ENOMEM;
        memcpy(*out, json_string_value(content), *len + 1);
        return 0;
    }
    if (!json_is_array(content))
        return -EINVAL;
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(json_object_get(part, "type")) ||
            strcmp(json_string_value(json_object_get(part, "type")), "text") ||
            !json_is_string(text))
            return -EINVAL;
        total += json_string_length(text);
    }
    *out = malloc(total + 1);
    if (!*out)
        return -ENOMEM;
    *len = 0;
    json_array_foreach(content, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(*out + *len, json_string_value(text), json_string_length(text));
        *len += json_string_length(text);
    }
    (*out)[*len] = '\0';
    return 0;
}

/* A reply's text with its reasoning block first, as the model writes it (model/reasoning.h):
 * the open marker, a newline, the reasoning, a newline, the close marker, a blank line,
 * the answer. *text is replaced (freed). 0 or -ENOMEM (*text freed). */
static int with_reasoning(char **text, size_t *len, json_t *reasoning)
{
    static const char open[] = KVP_THINK_OPEN "\n", close[] = "\n" KVP_THINK_CLOSE "\n\n";
    size_t rl = json_string_length(reasoning), ol = sizeof open - 1, cl = sizeof close - 1;
    char *t = malloc(ol + rl + cl + *len + 1);
    if (!t) {
        free(*text);
        *text = NULL;
        return -ENOMEM;
    }
    memcpy(t, open, ol);
    memcpy(t + ol, json_string_value(reasoning), rl);
    memcpy(t + ol + rl, close, cl);
    memcpy(t + ol + rl + cl, *text, *len + 1);
    free(*text);
    *text = t;
    *len += ol + rl + cl;
    return 0;
}

static void free_messages(kvp_message *m, int n)
{
    for (int i = 0; i < n; i++)
        free(m[i].text);
    free(m);
}

/* The request's messages as the hub's: a system (or developer) message first is the
 * conversation's system text (r->system, malloc'd; NULL for none), as the chat template
 * renders it; later ones are folded into the user message that follows them. 0, or -1
 * with e set. */
static int messages(json_t *arr, const char *prefill_param, kvpd_oai_req *r, kvpd_oai_err *e)
{
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) || n == 0)
        return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "messages", "messages must be a non-empty array");
    kvp_message *m = calloc(n, sizeof *m);
    char *system = NULL;
    size_t system_len = 0;
    char *pending = NULL;   /* system text waiting for its user message */
    size_t pending_len = 0;
    int k = 0;
    char param[64];
    for (size_t i = 0; m && i < n; i++) {
        json_t *msg = json_array_get(arr, i);
        json_t *jrole = json_object_get(msg, "role");
        const char *role = json_string_value(jrole);
        if (role && strlen(role) != json_string_length(jrole))
            role = NULL;   /* a NUL inside: no role */
        snprintf(param, sizeof param, "messages[%zu].role", i);
        int sys_role = role && (!strcmp(role, "system") || !strcmp(role, "developer"));
        if (!role || (!sys_role && strcmp(role, "user") && strcmp(role, "assistant") &&
                      strcmp(role, "tool"))) {
            kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param,
                "%s must be system, developer, user, assistant or tool", param);
            goto bad;
        }
        char *text;
        size_t len;
        int rc = content_text(json_object_get(msg, "content"), &text, &len);
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (rc == -ENOMEM)
            goto oom;
        if (rc < 0) {
            kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param,
                "%s must be a string or an array of text parts", param);
            goto bad;
        }
        json_t *reasoning = json_object_get(msg, "reasoning_content");
        if (!strcmp(role, "assistant") && reasoning && !json_is_null(reasoning)) {
            /* the reasoning of a reply sent back goes back into its text as the model
             * wrote it, where the template finds it (and Qwen3's drops it) */
            snprintf(param, sizeof param, "messages[%zu].reasoning_content", i);
            if (!json_is_string(reasoning)) {
                free(text);
                kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, param, "%s must be a string", param);
                goto bad;
            }
            if (r->reasoning && (rc = with_reasoning(&text, &len, reasoning)) < 0)
                goto oom;
        }
        if (sys_role && i == 0) {
            system = text;
            system_len = len;
            continue;
        }
        if (sys_role) {
            char *p = realloc(pending, pending_len + len + 3);
            if (!p) {
                free(text);
                goto oom;
            }
            pending = p;
            memcpy(pending + pending_len, text, len);
            pending_len += len;
            memcpy(pending + pending_len, "\n\n", 3);
            pending_len += 2;
            free(text);
            continue;
        }
        int user = !strcmp(role, "user") ? 1 : !strcmp(role, "tool") ? KVP_MESSAGE_TOOL : 0;
        if (user == 1 && pending) {
            char *p = realloc(pending, pending_len + len + 1);
            if (!p) {
                free(text);
                goto oom;
            }
            memcpy(p + pending_len, text, len + 1);
            free(text);
            text = p;
            len += pending_len;
            pending = NULL;
            pending_len = 0;
        }
        m[k++] = (kvp_message){user, text, len};
    }
    if (!m)
        goto oom;
    if (prefill_param && k > 1 && !m[k - 1].user && !pending) {
        /* an assistant prefill: the reply continues the last message */
        if (!m[k - 1].len) {
            kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, prefill_param,
                "%s is empty: an assistant message last is continued (assistant prefill), "
                "so it needs text", prefill_param);
            goto bad;
        }
        k--;
        r->prefill = m[k].text;
        r->prefill_len = m[k].len;
    }
    if (k == 0 || !m[k - 1].user || pending) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "messages",
            "the last message must be the user's (or tool results)");
        goto bad;
    }
    r->msgs = m;
    r->n_msgs = k;
    r->system = system;
    r->system_len = system_len;
    return 0;
oom:
    kvpd_oai_bad(e, KVPD_OAI_E_SERVER, NULL, "out of memory");
bad:
    free(pending);
    free(system);
    if (m)
        free_messages(m, k);
    return -1;
}

int kvpd_oai_parse_logprobs(json_t *req, kvpd_oai_req *r, kvpd_oai_err *e)
{
    json_t *lp = json_object_get(req, "logprobs"), *top = json_object_get(req, "top_logprobs");
    if (lp && !json_is_null(lp) && !json_is_boolean(lp))
        return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "logprobs", "logprobs must be a boolean");
    int on = json_is_true(lp);
    if (top && !json_is_null(top)) {
        if (!json_is_integer(top) || json_integer_value(top) < 0 ||
            json_integer_value(top) > KVP_LOGPROBS_MAX_TOP)
            return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "top_logprobs",
                       "top_logprobs must be an integer from 0 to %d", KVP_LOGPROBS_MAX_TOP);
        if (!on)
            return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "top_logprobs",
                       "top_logprobs needs logprobs: true");
        r->turn.top_logprobs = (int)json_integer_value(top);
    }
    if (on && r->tools.parse)
        return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "logprobs",
                   "logprobs with tools is not supported by kvpd");
    r->turn.logprobs = on;
    return 0;
}

int kvpd_oai_parse_messages(json_t *msgs, const char *system_param, int prefill,
                            kvpd_oai_req *r, kvpd_oai_err *e)
{
    json_t *hist = NULL;
    kvpd_oai_tools_err te;
    char pparam[48] = "";
    size_t last = json_array_size(msgs);
    json_t *lm = last ? json_array_get(msgs, last - 1) : NULL;
    const char *lrole = json_string_value(json_object_get(lm, "role"));
    if (prefill && lrole && !strcmp(lrole, "assistant")) {
        json_t *calls = json_object_get(lm, "tool_calls");
        if (calls && !json_is_null(calls) && !(json_is_array(calls) && !json_array_size(calls))) {
            snprintf(pparam, sizeof pparam, "messages[%zu].tool_calls", last - 1);
            return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, pparam,
                "%s: an assistant message last is continued (assistant prefill), which "
                "kvpd does only for text, not for tool calls", pparam);
        }
        json_t *reasoning = json_object_get(lm, "reasoning_content");
        if (reasoning && !json_is_null(reasoning)) {
            snprintf(pparam, sizeof pparam, "messages[%zu].reasoning_content", last - 1);
            return kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, pparam,
                "%s: an assistant message last is continued (assistant prefill), which kvpd "
                "does for its content only", pparam);
        }
        snprintf(pparam, sizeof pparam, "messages[%zu].content", last - 1);
    }
    if (kvpd_oai_tools_messages(&r->tools, msgs, &hist, &te) < 0)
        return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, te.param, "%s", te.msg);
    kvpd_oai_release_messages(r);
    int n = messages(hist, pparam[0] ? pparam : NULL, r, e);
    json_decref(hist);
    if (n < 0)
        return -1;
    if (r->system_len > KVP_HUB_SYSTEM_MAX) {
        kvpd_oai_release_messages(r);
        return kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, system_param,
                            "the system text is limited to %d bytes", KVP_HUB_SYSTEM_MAX);
    }
    return 0;
}

int kvpd_oai_parse_chat(const char *body, size_t len, const kvpd_oai_limits *l,
                        kvpd_oai_req *r, kvpd_oai_err *e)
{
    json_t *req = kvpd_oai_parse_json(body, len, e);
    if (!req)
        return -1;
    int rc = -1;
    if (kvpd_oai_check_fields(req, KVPD_OAI_API_CHAT, e) < 0)
        goto out;
    /* store: true asks for the completion to be kept for OpenAI's listing and evals, which
     * kvpd has not (the conversation is kept as its session either way) */
    json_t *store = json_object_get(req, "store");
    if (store && !json_is_null(store) && !json_is_boolean(store)) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "store", "store must be a boolean");
        goto out;
    }
    if (json_is_true(store)) {
        kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "store", "store: true is not "
                     "supported by kvpd: it keeps no chat completions to list or retrieve "
                     "(only store: false)");
        goto out;
    }
    if (kvpd_oai_parse_model(req, l, e) < 0 || kvpd_oai_parse_options(req, l, r, e) < 0 ||
        kvpd_oai_parse_logprobs(req, r, e) < 0)
        goto out;
    if (kvpd_oai_parse_messages(json_object_get(req, "messages"), "messages[0].content", 1, r,
                                e) < 0)
        goto out;
    /* continue_final_message (vLLM's and transformers') and add_generation_prompt: kvpd
     * continues an assistant message that comes last, and opens a reply after any other */
    json_t *cfm = json_object_get(req, "continue_final_message"),
           *agp = json_object_get(req, "add_generation_prompt");
    const char *bad_bool = cfm && !json_is_null(cfm) && !json_is_boolean(cfm) ? "continue_final_message"
                         : agp && !json_is_null(agp) && !json_is_boolean(agp) ? "add_generation_prompt"
                         : NULL;
    if (bad_bool) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, bad_bool, "%s must be a boolean", bad_bool);
        goto out;
    }
    if (json_is_true(cfm) && json_is_true(agp)) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "continue_final_message",
                     "continue_final_message and add_generation_prompt cannot both be true");
        goto out;
    }
    if (json_is_true(cfm) && !r->prefill) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "continue_final_message",
                     "continue_final_message needs an assistant message last");
        goto out;
    }
    if (json_is_false(agp) && !r->prefill) {
        kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "add_generation_prompt",
                     "add_generation_prompt false is not supported by kvpd after a message "
                     "that is not the assistant's: a reply always opens its own turn");
        goto out;
    }
    if (r->prefill) {
        /* what cannot continue the assistant's own text */
        if (r->tools.grammar || r->turn.reply_prefix) {
            kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "tool_choice",
                "tool_choice forcing a call cannot continue an assistant message (assistant "
                "prefill): the call would start a reply of its own");
            goto out;
        }
        if (r->grammar) {
            kvpd_oai_bad(e, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "response_format",
                "response_format cannot continue an assistant message (assistant prefill): "
                "the document would have to begin in text the grammar did not write");
            goto out;
        }
        r->turn.reply_prefix = r->prefill;
        r->turn.reply_prefix_len = r->prefill_len;
        r->turn.prefill = 1;
    }
    json_t *named = json_object_get(req, "session");
    if (json_is_string(named)) {
        char sid[KVP_SESSION_ID_LEN + 8] = "";
        snprintf(sid, sizeof sid, "%s", json_string_value(named));
        /* a NUL inside ends the C string early: the id is the whole JSON string */
        if ((sid[0] && !kvp_session_id_ok(sid)) ||
            strlen(json_string_value(named)) != json_string_length(named)) {
            kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "session",
                "a session id is 32 lowercase hex digits");
            goto out;
        }
        r->has_session = 1;
        memcpy(r->session, sid, sizeof r->session - 1);
        r->session[sizeof r->session - 1] = '\0';
    } else if (named && !json_is_null(named)) {
        kvpd_oai_bad(e, KVPD_OAI_E_INVALID_REQUEST, "session", "session must be a string");
        goto out;
    }
    rc = 0;
out:
    if (rc < 0)
        kvpd_oai_release_messages(r);
    json_decref(req);
    return rc;
}

void kvpd_oai_release_messages(kvpd_oai_req *r)
{
    if (r->msgs)
        free_messages(r->msgs, r->n_msgs);
    if (r->prefill && r->turn.reply_prefix == r->prefill) {
        r->turn.reply_prefix = NULL;
        r->turn.reply_prefix_len = 0;
        r->turn.prefill = 0;
    }
    free(r->prefill);
    r->prefill = NULL;
    r->prefill_len = 0;
    free(r->system);
    r->msgs = NULL;
    r->n_msgs = 0;
    r->system = NULL;
    r->system_len = 0;
}

void kvpd_oai_release(kvpd_oai_req *r)
{
    kvpd_oai_release_messages(r);
    kvpd_sampling_free(&r->own);
    kvp_grammar_unref(r->grammar);
    kvpd_oai_tools_free(&r->tools);
    memset(r, 0, sizeof *r);
}

int kvpd_openai_path(const char *uri, const char **id)
{
    int v1 = !strncmp(uri, "/v1/", 4);
    const char *p = v1 ? uri + 3 : uri;
    if (id)
        *id = NULL;
    if (!strcmp(p, "/chat/completions"))
        return KVPD_OAI_CHAT;
    if (!strcmp(p, "/models"))
        return KVPD_OAI_MODELS;
    if (!strcmp(p, "/completions"))
        return KVPD_OAI_COMPLETIONS;
    if (!strcmp(p, "/responses"))
        return KVPD_OAI_RESPONSES;
    if (!strcmp(p, "/learn/transcripts"))
        return KVPD_OAI_LEARN;
    static const struct { const char *path; enum kvpd_oai_path id; } llama[] = {
        {"/completion", KVPD_OAI_LLAMA_COMPLETION}, {"/tokenize", KVPD_OAI_TOKENIZE},
        {"/detokenize", KVPD_OAI_DETOKENIZE}, {"/props", KVPD_OAI_PROPS},
        {"/slots", KVPD_OAI_SLOTS}};
    for (size_t i = 0; !v1 && i < sizeof llama / sizeof llama[0]; i++)
        if (!strcmp(uri, llama[i].path))
            return llama[i].id;
    if (!strncmp(p, "/responses/", 11) && p[11] && !strchr(p + 11, '/')) {
        if (id)
            *id = p + 11;
        return KVPD_OAI_RESPONSE;
    }
    return v1 || !strcmp(uri, "/v1") ? KVPD_OAI_UNKNOWN : KVPD_OAI_NONE;
}

const char *kvpd_openai_path_label(const char *uri)
{
    static const char *const label[] = {
        [KVPD_OAI_CHAT] = "/v1/chat/completions", [KVPD_OAI_MODELS] = "/v1/models",
        [KVPD_OAI_COMPLETIONS] = "/v1/completions", [KVPD_OAI_RESPONSES] = "/v1/responses",
        [KVPD_OAI_RESPONSE] = "/v1/responses/{id}", [KVPD_OAI_LEARN] = "/v1/learn/transcripts",
        [KVPD_OAI_LLAMA_COMPLETION] = "/completion", [KVPD_OAI_TOKENIZE] = "/tokenize",
        [KVPD_OAI_DETOKENIZE] = "/detokenize", [KVPD_OAI_PROPS] = "/props",
        [KVPD_OAI_SLOTS] = "/slots", [KVPD_OAI_UNKNOWN] = "/v1/other"};
    enum kvpd_oai_path p = kvpd_openai_path(uri, NULL);
    return p == KVPD_OAI_NONE ? NULL : label[p];
}

const char *kvpd_openai_path_allow(enum kvpd_oai_path path)
{
    switch (path) {
    case KVPD_OAI_MODELS: case KVPD_OAI_PROPS: case KVPD_OAI_SLOTS:
        return "GET";
    case KVPD_OAI_RESPONSE:
        return "GET, DELETE";
    case KVPD_OAI_LEARN:
        return "DELETE";
    default:
        return "POST";
    }
}
