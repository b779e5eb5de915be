/* The /chat websocket protocol (docs/protocol.md): client messages parsed and checked
 * with jansson, server frames built as compact JSON. No libwebsockets here. */
#ifndef KVPD_PROTOCOL_H
#define KVPD_PROTOCOL_H

#include <jansson.h>
#include <stddef.h>

#include "sessions/hub.h"
#include "web/sampling.h"

enum kvpd_msg_type {
    KVPD_MSG_HELLO, KVPD_MSG_MESSAGE, KVPD_MSG_CANCEL, KVPD_MSG_AUTH, KVPD_MSG_TOOL_RESULT
};

/* The results a tool_result message may carry, and the bytes of a call id. */
#define KVPD_PROTO_MAX_RESULTS 32
#define KVPD_PROTO_CALL_ID_MAX 64
/* The largest fork.turn a hello may name (a larger one is bad_request, as is a turn past
 * the source's end). */
#define KVPD_PROTO_FORK_TURN_MAX 1000000

typedef struct kvpd_client_msg {
    enum kvpd_msg_type type;
    char session[KVP_SESSION_ID_LEN + 1];   /* hello: "" = new session */
    char *system;                           /* hello: malloc'd, valid UTF-8; NULL: none given */
    /* hello: fork {session, turn} given (then session and system are not): branch a new
     * session from turn fork_turn of session fork_session (kvp_hub_open_fork) */
    int has_fork, fork_turn;
    char fork_session[KVP_SESSION_ID_LEN + 1];
    size_t system_len;
    char *text;                             /* message: malloc'd, valid UTF-8; auth: the
                                               token */
    size_t text_len;
    int max_tokens;                         /* 0 = not given */
    /* message: its sampling fields (web/sampling.h) in opts, which points into own;
     * max_tokens and grammar are set in opts too */
    kvp_turn_opts opts;
    kvpd_sampling own;
    struct kvp_grammar *grammar;            /* message: its response_format (web/format.h),
                                               NULL: none; freed with the message */
    /* Tool calling (OpenAI's shapes, checked against the model by the caller; new
     * references, NULL: not given). hello, message, tool_result: tools (an array);
     * message, tool_result: tool_choice, parallel_tool_calls as given. */
    json_t *tools, *tool_choice, *parallel_tool_calls;
    /* tool_result: [{id, content, name?}], each id a non-empty string without NUL of at
     * most KVPD_PROTO_CALL_ID_MAX bytes, content a string, name (optional) a string. */
    json_t *results;
} kvpd_client_msg;

/* Error codes of the protocol: KVPD_E_* in sessions/hub.h. */

/* Parses one text message. A field the message type does not have is refused naming it
 * (bad_request), so a client never believes a setting took effect that did not. On
 * failure returns a negative code and sets *code to one of
 * the codes above and msg to a human-readable reason. */
int kvpd_proto_parse(const char *buf, size_t len, int max_tokens_limit,
                     kvpd_client_msg *out, const char **code, char *msg, size_t msglen);
void kvpd_proto_msg_free(kvpd_client_msg *m);

/* Server frames, malloc'd NUL-terminated JSON (NULL when out of memory). */
/* history: the transcript's stored messages (NULL/0 for none; only while no turn runs),
 * after history_dropped earlier ones that max_history_tokens dropped. system: the
 * session's system text (NULL: none, no field). max_tokens: the daemon's cap of a
 * message's max_tokens, so a client can check its own before sending. */
char *kvpd_proto_session(const char *id, int resumed, int turns, const kvp_message *history,
                         int n_history, int history_dropped, const char *system,
                         size_t system_len, int max_tokens);
char *kvpd_proto_token(const char *text, size_t len);
/* {"type":"tool_call","id","name","arguments"}: a call the reply holds, once it is whole. */
char *kvpd_proto_tool_call(const char *id, const char *name, const char *arguments);
/* durable: -1 without a state directory (no field), 1 when the turn's snapshot is on
 * disk, 0 when writing it failed (with the reason in "durable_error"). */
char *kvpd_proto_done(const char *reply, size_t len, const kvp_turn_stats *st, int durable,
                      const char *not_durable_why);
/* The same with "tool_calls": calls (an array of {id, name, arguments}, borrowed; NULL:
 * the turn had no tools, no field). */
char *kvpd_proto_done_calls(const char *reply, size_t len, const kvp_turn_stats *st,
                            int durable, const char *not_durable_why, json_t *calls);
char *kvpd_proto_error(const char *code, const char *message);
/* {"type":"auth","ok":true}: the auth frame's key was accepted. */
char *kvpd_proto_auth_ok(void);
/* An error with "retry_after_ms" (overloaded). */
char *kvpd_proto_error_retry(const char *code, const char *message, int retry_after_ms);

#endif
