/* Tool calling in the OpenAI API (docs/openai.md, "Tool calling"): the request's tools,
 * tool_choice and parallel_tool_calls checked and turned into the turn's options; the
 * history's assistant tool_calls and tool messages turned into the hub's messages; the
 * reply's calls (model/toolcall.h) turned into message.tool_calls, whole or as streamed
 * delta.tool_calls. No I/O: JSON in, JSON out. */
#ifndef KVPD_OAI_TOOLS_H
#define KVPD_OAI_TOOLS_H

#include <jansson.h>
#include <stddef.h>

#include "model/toolcall.h"
#include "sessions/hub.h"

typedef struct kvpd_oai_tools {
    enum kvp_tool_format format;  /* the model's (0: it has none) */
    int parse;                    /* the reply is looked through for calls */
    int single;                   /* at most one call (parallel_tool_calls false, or a
                                   * forced call): calls after the first are dropped */
    char *tools;                  /* the tools as JSON text, for the template */
    size_t tools_len;
    char prefix[160];             /* a forced call's opening */
    size_t prefix_len;
    char end_after[160];          /* "" or what ends the reply after one call */
    json_t *names;                /* the declared functions (an object: name -> true) */
    /* A forced call (tool_choice required or a named function): the grammar of the call
     * in the model's own format, one of the allowed functions with arguments valid
     * against its parameters (NULL: the reply is free, or the call is written whole) */
    struct kvp_grammar *grammar;
    /* streaming */
    char *text;                   /* the reply so far */
    size_t len, cap;
    size_t sent;                  /* bytes of content sent */
    int calls_sent;               /* calls sent (and so their ids made) */
    char ids[KVP_TOOLCALL_MAX][32];
} kvpd_oai_tools;

/* An error: the field it names and why; unknown: the field is a key its object has not
 * (param its whole path, msg kvpd_oai_unknown_at's: OpenAI's unknown_parameter). */
typedef struct kvpd_oai_tools_err {
    char param[96];
    char msg[320];
    int unknown;
} kvpd_oai_tools_err;

/* tools, tool_choice and parallel_tool_calls of req into t and the turn's options (which
 * borrow t's texts and grammar). A forced call's grammar is built from each allowed
 * tool's parameters schema (model/schema.h): a schema kvpd cannot compile is refused
 * naming `tools`. format: the model's tool format (kvp_hub_info.tool_format). 0, or
 * -1 with e set (a 400). */
int kvpd_oai_tools_request(kvpd_oai_tools *t, json_t *req, int format, kvp_turn_opts *o,
                           kvpd_oai_tools_err *e);

/* The request's messages with the tool parts rewritten for the hub (a new reference in
 * *out): an assistant message's tool_calls become its text in the model's own format
 * after its content; a run of tool messages becomes one message of role "tool" whose
 * content is a JSON array of {tool_call_id, name, content}. Every tool_call_id must name
 * a call of an earlier assistant message. 0, or -1 with e set. */
int kvpd_oai_tools_messages(const kvpd_oai_tools *t, json_t *msgs, json_t **out,
                            kvpd_oai_tools_err *e);

/* The whole reply as the answer's message (a new reference); *calls: how many it holds
 * (finish_reason "tool_calls" when > 0). */
json_t *kvpd_oai_tools_reply(kvpd_oai_tools *t, const char *text, size_t len, int *calls);

/* Streaming: the reply's next text; returns the deltas to send now (an array, a new
 * reference; each a chat.completion.chunk's delta), content held back while it may still
 * be a call. final: the reply is whole (sends what was held). */
json_t *kvpd_oai_tools_feed(kvpd_oai_tools *t, const char *text, size_t len, int final);

/* One of those deltas read back, for a protocol other than chat's: its text (content NULL
 * when it has none, or an empty one) and, for a tool call, either the call's opening
 * (call_id and call_name) or its arguments (arguments not NULL; "" when it sent none).
 * The strings are the delta's. */
typedef struct {
    const char *content;
    size_t content_len;
    const char *call_id, *call_name;
    const char *arguments;
} kvpd_oai_delta;
void kvpd_oai_tools_delta(json_t *d, kvpd_oai_delta *out);

void kvpd_oai_tools_free(kvpd_oai_tools *t);

#endif
