/* The /chat websocket protocol (docs/protocol.md): client messages parsed and checked
 * with jansson, server frames built as compact JSON. No libwebsockets here. */
#ifndef KVPD_PROTOCOL_H
#define KVPD_PROTOCOL_H

#include <stddef.h>

#include "sessions/hub.h"
#include "web/sampling.h"

enum kvpd_msg_type { KVPD_MSG_HELLO, KVPD_MSG_MESSAGE, KVPD_MSG_CANCEL, KVPD_MSG_AUTH };

typedef struct kvpd_client_msg {
    enum kvpd_msg_type type;
    char session[KVP_SESSION_ID_LEN + 1];   /* hello: "" = new session */
    char *system;                           /* hello: malloc'd, valid UTF-8; NULL: none given */
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
/* durable: -1 without a state directory (no field), 1 when the turn's snapshot is on
 * disk, 0 when writing it failed (with the reason in "durable_error"). */
char *kvpd_proto_done(const char *reply, size_t len, const kvp_turn_stats *st, int durable,
                      const char *not_durable_why);
char *kvpd_proto_error(const char *code, const char *message);
/* {"type":"auth","ok":true}: the auth frame's key was accepted. */
char *kvpd_proto_auth_ok(void);
/* An error with "retry_after_ms" (overloaded). */
char *kvpd_proto_error_retry(const char *code, const char *message, int retry_after_ms);

#endif
