/* /chat protocol: jansson in, jansson out. */
#include "web/protocol.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/grammar.h"
#include "web/format.h"

static int reject(const char **code, const char *c, char *msg, size_t msglen,
                  const char *text)
{
    *code = c;
    snprintf(msg, msglen, "%s", text);
    return -EINVAL;
}

/* The fields each client message may carry. */
static const char *const hello_fields[] = {"type", "session", "system", "tools", "fork", NULL};
static const char *const message_fields[] = {
    "type", "text", "max_tokens", "response_format", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
    "seed", "stop", "tools", "tool_choice", "parallel_tool_calls", NULL};
static const char *const tool_result_fields[] = {
    "type", "results", "max_tokens", "response_format", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias",
    "seed", "stop", "tools", "tool_choice", "parallel_tool_calls", NULL};
static const char *const cancel_fields[] = {"type", NULL};
static const char *const auth_fields[] = {"type", "token", NULL};

/* -EINVAL naming the first field the message type does not have (an unknown type is
 * left to the caller). */
static int unknown_field(json_t *root, const char *type, const char **code, char *msg,
                         size_t msglen)
{
    const char *const *known = !strcmp(type, "hello")     ? hello_fields
                               : !strcmp(type, "message") ? message_fields
                               : !strcmp(type, "cancel")  ? cancel_fields
                               : !strcmp(type, "auth")    ? auth_fields
                               : !strcmp(type, "tool_result") ? tool_result_fields
                                                          : NULL;
    if (!known)
        return 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++)
            ok = !strcmp(key, known[i]);
        if (!ok) {
            *code = KVPD_E_BAD_REQUEST;
            snprintf(msg, msglen, "%s has no field \"%.64s\"", type, key);
            return -EINVAL;
        }
    }
    return 0;
}

/* tools (an array when given), tool_choice and parallel_tool_calls, kept as given. */
static int tool_fields(json_t *root, int with_choice, kvpd_client_msg *out, const char **code,
                       char *msg, size_t msglen)
{
    json_t *tools = json_object_get(root, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return reject(code, KVPD_E_BAD_REQUEST, msg, msglen, "tools must be an array");
        out->tools = json_incref(tools);
    }
    if (!with_choice)
        return 0;
    json_t *tc = json_object_get(root, "tool_choice");
    if (tc && !json_is_null(tc))
        out->tool_choice = json_incref(tc);
    json_t *ptc = json_object_get(root, "parallel_tool_calls");
    if (ptc && !json_is_null(ptc))
        out->parallel_tool_calls = json_incref(ptc);
    return 0;
}

/* hello's fork: {"session": ID, "turn": N}, alone (no session, no system: the new
 * session takes the source's system text). */
static int fork_field(json_t *root, kvpd_client_msg *out, const char **code, char *msg,
                      size_t msglen)
{
    json_t *f = json_object_get(root, "fork");
    if (!f || json_is_null(f))
        return 0;
    if (!json_is_object(f))
        return reject(code, KVPD_E_BAD_REQUEST, msg, msglen,
                      "fork must be an object {\"session\": ID, \"turn\": N}");
    const char *key;
    json_t *v;
    json_object_foreach(f, key, v)
        if (strcmp(key, "session") && strcmp(key, "turn")) {
            *code = KVPD_E_BAD_REQUEST;
            snprintf(msg, msglen, "fork has no field \"%.64s\"", key);
            return -EINVAL;
        }
    json_t *id = json_object_get(f, "session"), *turn = json_object_get(f, "turn");
    json_t *sys = json_object_get(root, "system"), *own = json_object_get(root, "session");
    if (own && !json_is_null(own))
        return reject(code, KVPD_E_BAD_REQUEST, msg, msglen,
                      "hello takes session (resume) or fork (branch), not both");
    if (sys && !json_is_null(sys))
        return reject(code, KVPD_E_BAD_REQUEST, msg, msglen,
                      "a fork keeps its source's system text: hello with fork takes no system");
    if (!json_is_string(id) || strlen(json_string_value(id)) != json_string_length(id))
        return reject(code, KVPD_E_BAD_REQUEST, msg, msglen,
                      "fork.session must be the id of the session to fork (a string)");
    if (!kvp_session_id_ok(json_string_value(id)))
        return reject(code, KVPD_E_UNKNOWN_SESSION, msg, msglen, "no such session");
    if (!json_is_integer(turn) || json_integer_value(turn) < 0 ||
        json_integer_value(turn) > KVPD_PROTO_FORK_TURN_MAX) {
        *code = KVPD_E_BAD_REQUEST;
        snprintf(msg, msglen, "fork.turn must be an integer from 0 to %d: the source's turn "
                 "to branch at", KVPD_PROTO_FORK_TURN_MAX);
        return -EINVAL;
    }
    snprintf(out->fork_session, sizeof out->fork_session, "%s", json_string_value(id));
    out->fork_turn = (int)json_integer_value(turn);
    out->has_fork = 1;
    return 0;
}

/* tool_result's results. */
static int results(json_t *root, kvpd_client_msg *out, const char **code, char *msg,
                   size_t msglen)
{
    json_t *r = json_object_get(root, "results");
    size_t n = json_array_size(r), i;
    if (!json_is_array(r) || n == 0 || n > KVPD_PROTO_MAX_RESULTS) {
        *code = KVPD_E_BAD_REQUEST;
        snprintf(msg, msglen, "results must be an array of 1 to %d {id, content} objects",
                 KVPD_PROTO_MAX_RESULTS);
        return -EINVAL;
    }
    json_t *e;
    json_array_foreach(r, i, e) {
        json_t *id = json_object_get(e, "id"), *content = json_object_get(e, "content");
        json_t *name = json_object_get(e, "name");
        const char *why = NULL;
        if (!json_is_object(e))
            why = "must be an object";
        else if (!json_is_string(id) || !json_string_length(id) ||
                 json_string_length(id) > KVPD_PROTO_CALL_ID_MAX ||
                 strlen(json_string_value(id)) != json_string_length(id))
            why = "id must be the call's id: a non-empty string without NUL";
        else if (!json_is_string(content))
            why = "content must be a string";
        else if (name && !json_is_null(name) && (!json_is_string(name) ||
                 strlen(json_string_value(name)) != json_string_length(name)))
            why = "name must be a string without NUL";
        else {
            const char *k;
            json_t *v;
            json_object_foreach(e, k, v)
                if (strcmp(k, "id") && strcmp(k, "content") && strcmp(k, "name")) {
                    *code = KVPD_E_BAD_REQUEST;
                    snprintf(msg, msglen, "results[%zu] has no field \"%.64s\"", i, k);
                    return -EINVAL;
                }
        }
        if (why) {
            *code = KVPD_E_BAD_REQUEST;
            snprintf(msg, msglen, "results[%zu]: %s", i, why);
            return -EINVAL;
        }
    }
    out->results = json_incref(r);
    return 0;
}

/* A turn's fields (message and tool_result): max_tokens, sampling, response_format,
 * tools. */
static int turn_fields(json_t *root, int max_tokens_limit, kvpd_client_msg *out,
                       const char **code, char *msg, size_t msglen)
{
    json_t *mt = json_object_get(root, "max_tokens");
    const char *param;
    int rc;
    if (mt && !json_is_null(mt) && (!json_is_integer(mt) || json_integer_value(mt) < 1))
        return reject(code, KVPD_E_BAD_REQUEST, msg, msglen,
                      "max_tokens must be a positive integer");
    if (mt && json_is_integer(mt) && json_integer_value(mt) > max_tokens_limit) {
        *code = KVPD_E_TOO_LARGE;
        snprintf(msg, msglen, "max_tokens is limited to %d", max_tokens_limit);
        return -EINVAL;
    }
    if ((rc = kvpd_sampling_parse(root, 10, &out->own, &out->opts, &param, msg, msglen)) < 0) {
        *code = rc == -ENOMEM ? KVPD_E_INTERNAL : KVPD_E_BAD_REQUEST;
        return rc;
    }
    out->max_tokens = json_is_integer(mt) ? (int)json_integer_value(mt) : 0;
    char rf_param[96];
    if (kvpd_response_format(json_object_get(root, "response_format"), &out->grammar, rf_param,
                             sizeof rf_param, msg, msglen) < 0) {
        *code = KVPD_E_BAD_REQUEST;
        return -EINVAL;
    }
    out->opts.max_tokens = out->max_tokens;
    out->opts.grammar = out->grammar;
    return tool_fields(root, 1, out, code, msg, msglen);
}

int kvpd_proto_parse(const char *buf, size_t len, int max_tokens_limit,
                     kvpd_client_msg *out, const char **code, char *msg, size_t msglen)
{
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    /* The API's rule: an escaped NUL is text like any other (texts go by their length);
     * names and ids with one are refused below. */
    json_t *root = json_loadb(buf, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        *code = KVPD_E_BAD_JSON;
        snprintf(msg, msglen, "invalid JSON at %d: %s", jerr.position, jerr.text);
        return -EINVAL;
    }
    int rc = 0;
    const char *type = json_string_value(json_object_get(root, "type"));
    json_t *tj = json_object_get(root, "type"), *idj = json_object_get(root, "session");
    if (!json_is_object(root) || !type) {
        rc = reject(code, KVPD_E_BAD_REQUEST, msg, msglen, "expected an object with a \"type\"");
    } else if (strlen(type) != json_string_length(tj) ||
               (json_is_string(idj) &&
                strlen(json_string_value(idj)) != json_string_length(idj))) {
        rc = reject(code, KVPD_E_BAD_REQUEST, msg, msglen, "a NUL in type or session");
    } else if ((rc = unknown_field(root, type, code, msg, msglen)) < 0) {
        /* refused */
    } else if (!strcmp(type, "hello")) {
        out->type = KVPD_MSG_HELLO;
        json_t *id = json_object_get(root, "session");
        if (id && !json_is_null(id)) {
            if (!json_is_string(id))
                rc = reject(code, KVPD_E_BAD_REQUEST, msg, msglen, "session must be a string");
            else if (!kvp_session_id_ok(json_string_value(id)))
                rc = reject(code, KVPD_E_UNKNOWN_SESSION, msg, msglen, "no such session");
            else
                snprintf(out->session, sizeof out->session, "%s", json_string_value(id));
        }
        json_t *sys = json_object_get(root, "system");
        if (!rc && sys && !json_is_null(sys)) {
            if (!json_is_string(sys)) {
                rc = reject(code, KVPD_E_BAD_REQUEST, msg, msglen, "system must be a string");
            } else if (json_string_length(sys) > KVP_HUB_SYSTEM_MAX) {
                *code = KVPD_E_TOO_LARGE;
                snprintf(msg, msglen, "the system text is limited to %d bytes", KVP_HUB_SYSTEM_MAX);
                rc = -EINVAL;
            } else if (!(out->system = malloc(json_string_length(sys) + 1))) {
                rc = reject(code, KVPD_E_INTERNAL, msg, msglen, "out of memory");
            } else {
                out->system_len = json_string_length(sys);
                memcpy(out->system, json_string_value(sys), out->system_len + 1);
            }
        }
        if (!rc)
            rc = fork_field(root, out, code, msg, msglen);
        if (!rc)
            rc = tool_fields(root, 0, out, code, msg, msglen);
    } else if (!strcmp(type, "message")) {
        out->type = KVPD_MSG_MESSAGE;
        json_t *text = json_object_get(root, "text");
        if (!json_is_string(text) || json_string_length(text) == 0) {
            rc = reject(code, KVPD_E_BAD_REQUEST, msg, msglen, "text must be a non-empty string");
        } else if ((rc = turn_fields(root, max_tokens_limit, out, code, msg, msglen)) < 0) {
            /* refused */
        } else if (!(out->text = malloc(json_string_length(text) + 1))) {
            rc = reject(code, KVPD_E_INTERNAL, msg, msglen, "out of memory");
        } else {
            out->text_len = json_string_length(text);
            memcpy(out->text, json_string_value(text), out->text_len + 1);
        }
    } else if (!strcmp(type, "tool_result")) {
        out->type = KVPD_MSG_TOOL_RESULT;
        if ((rc = results(root, out, code, msg, msglen)) == 0)
            rc = turn_fields(root, max_tokens_limit, out, code, msg, msglen);
    } else if (!strcmp(type, "cancel")) {
        out->type = KVPD_MSG_CANCEL;
    } else if (!strcmp(type, "auth")) {
        out->type = KVPD_MSG_AUTH;
        json_t *tok = json_object_get(root, "token");
        if (!json_is_string(tok))
            rc = reject(code, KVPD_E_BAD_REQUEST, msg, msglen, "token must be a string");
        else if (!(out->text = malloc(json_string_length(tok) + 1)))
            rc = reject(code, KVPD_E_INTERNAL, msg, msglen, "out of memory");
        else {
            out->text_len = json_string_length(tok);
            memcpy(out->text, json_string_value(tok), out->text_len + 1);
        }
    } else {
        rc = reject(code, KVPD_E_BAD_REQUEST, msg, msglen, "unknown message type");
    }
    json_decref(root);
    if (rc < 0)   /* nothing of a refused message is kept */
        kvpd_proto_msg_free(out);
    return rc;
}

void kvpd_proto_msg_free(kvpd_client_msg *m)
{
    kvpd_sampling_free(&m->own);
    memset(&m->opts, 0, sizeof m->opts);
    kvp_grammar_unref(m->grammar);
    m->grammar = NULL;
    free(m->text);
    m->text = NULL;
    free(m->system);
    m->system = NULL;
    json_decref(m->tools);
    json_decref(m->tool_choice);
    json_decref(m->parallel_tool_calls);
    json_decref(m->results);
    m->tools = m->tool_choice = m->parallel_tool_calls = m->results = NULL;
    m->has_fork = 0;
}

static char *dump(json_t *o)
{
    if (!o)
        return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

char *kvpd_proto_session(const char *id, int resumed, int turns, const kvp_message *history,
                         int n_history, int history_dropped, const char *system,
                         size_t system_len, int max_tokens)
{
    json_t *h = json_array();
    for (int i = 0; h && i < n_history; i++)
        if (json_array_append_new(h, json_pack("{s:s, s:s%}", "role",
                                               history[i].user == 1 ? "user"
                                               : history[i].user == KVP_MESSAGE_TOOL ? "tool"
                                                                                     : "assistant",
                                               "text", history[i].text,
                                               history[i].len)) < 0) {
            json_decref(h);
            h = NULL;
        }
    if (!h)
        return NULL;
    json_t *o = json_pack("{s:s, s:s, s:b, s:i, s:o, s:i, s:i}", "type", "session", "id", id,
                          "resumed", resumed, "turns", turns, "history", h,
                          "history_dropped", history_dropped, "max_tokens", max_tokens);
    if (o && system && json_object_set_new(o, "system", json_stringn(system, system_len)) < 0) {
        json_decref(o);
        o = NULL;
    }
    return dump(o);
}

char *kvpd_proto_token(const char *text, size_t len)
{
    return dump(json_pack("{s:s, s:s%}", "type", "token", "text", text, len));
}

char *kvpd_proto_tool_call(const char *id, const char *name, const char *arguments)
{
    return dump(json_pack("{s:s, s:s, s:s, s:s}", "type", "tool_call", "id", id, "name", name,
                          "arguments", arguments));
}

char *kvpd_proto_done(const char *reply, size_t len, const kvp_turn_stats *st, int durable,
                      const char *not_durable_why)
{
    return kvpd_proto_done_calls(reply, len, st, durable, not_durable_why, NULL);
}

char *kvpd_proto_done_calls(const char *reply, size_t len, const kvp_turn_stats *st,
                            int durable, const char *not_durable_why, json_t *calls)
{
    json_t *stats = json_pack(
        "{s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:s}",
        "prompt_tokens", st->prompt_tokens, "prefilled_tokens", st->prefilled_tokens,
        "generated_tokens", st->generated_tokens, "transcript_tokens", st->transcript_tokens,
        "cache_rows_max", st->cache_rows_max, "cache_rows", st->cache_rows,
        "cache_bytes", (json_int_t)st->cache_bytes,
        "cache_bytes_max", (json_int_t)st->cache_bytes_max, "evicted_rows", (json_int_t)st->evicted_rows,
        "evicted_rows_total", (json_int_t)st->evicted_total, "ttft_ms", st->ttft_ms,
        "duration_ms", st->duration_ms, "tokens_per_s", st->tokens_per_s,
        "stop", st->stop ? st->stop : "eos");
    if (!stats)
        return NULL;
    json_t *o = json_pack("{s:s, s:s%, s:o}", "type", "done", "reply", reply, len,
                          "stats", stats);
    if (o && calls && json_object_set(o, "tool_calls", calls) < 0) {
        json_decref(o);
        o = NULL;
    }
    if (o && durable >= 0 &&
        (json_object_set_new(o, "durable", json_boolean(durable)) < 0 ||
         (!durable && json_object_set_new(o, "durable_error",
                                          json_string(not_durable_why ? not_durable_why : "")) < 0))) {
        json_decref(o);
        o = NULL;
    }
    return dump(o);
}

char *kvpd_proto_auth_ok(void)
{
    return dump(json_pack("{s:s, s:b}", "type", "auth", "ok", 1));
}

char *kvpd_proto_error(const char *code, const char *message)
{
    return dump(json_pack("{s:s, s:s, s:s}", "type", "error", "code", code,
                          "message", message));
}

char *kvpd_proto_error_retry(const char *code, const char *message, int retry_after_ms)
{
    return dump(json_pack("{s:s, s:s, s:s, s:i}", "type", "error", "code", code,
                          "message", message, "retry_after_ms", retry_after_ms));
}
