/* Tool calling over /chat (docs/protocol.md, "Tools"): the connection's tools (from its
 * hello), a turn's tools and tool_choice as the hub's options (web/oai_tools.h, as the
 * OpenAI API takes them), the reply's calls as tool_call frames held out of its tokens,
 * and a tool_result's results as the hub's tool message. Loop thread only. */
#ifndef KVPD_CHAT_TOOLS_H
#define KVPD_CHAT_TOOLS_H

#include <stddef.h>

#include "web/conn.h"
#include "web/protocol.h"

/* hello's tools (NULL: none given) become the connection's: later messages without
 * their own render them. */
void kvpd_ws_tools_hello(kvpd_conn *c, json_t *tools);

/* A message or tool_result about to go to the hub: its tools (or the connection's) and
 * tool_choice into m->opts (format: the model's, kvp_hub_info.tool_format); for a
 * tool_result, *text is the hub's tool message (malloc'd, *len bytes): a JSON array of
 * {tool_call_id, name, content}, a name taken from the connection's last reply when the
 * result does not give it. 0; -1 with msg set (bad_request); -2 while a turn with
 * tools runs on this connection (busy). */
int kvpd_ws_tools_turn(kvpd_conn *c, kvpd_client_msg *m, int format, char **text, size_t *len,
                       char *msg, size_t msglen);
/* The submitted turn was answered (synchronously) or not: errors the hub sends while
 * submitting end the turn that was set up. */
void kvpd_ws_tools_submitting(kvpd_conn *c, int on);

/* The hub's events for a turn with tools: token: its text outside calls as token
 * frames, each call as a tool_call frame once whole; done: the rest, then done with
 * tool_calls. 1 when handled, 0 when the connection's turn has no tools. */
int kvpd_ws_tools_token(kvpd_conn *c, const kvp_hub_event *ev);
int kvpd_ws_tools_done(kvpd_conn *c, const kvp_hub_event *ev);
/* An error event: the turn it ends (not a busy answer to another request) is over. */
void kvpd_ws_tools_error(kvpd_conn *c, const kvp_hub_event *ev);

void kvpd_ws_tools_free(kvpd_conn *c);

#endif
