/* The Responses API's shapes in chat completions' terms (docs/openai.md, "Responses"):
 * a conversation's items (messages, function calls and their outputs) as chat messages;
 * function tools, tool_choice and text.format as chat's tools, tool_choice and
 * response_format; a chat reply message back as output items. The Responses codec
 * (web/oai_responses.c) then serves a response as a chat completion. No I/O: JSON in,
 * JSON out. */
#ifndef KVPD_OAI_ITEMS_H
#define KVPD_OAI_ITEMS_H

#include <jansson.h>
#include <stddef.h>

#include "web/oai_parse.h"

/* req's chat-shaped twin (a new object sharing req's other members): function tools
 * ({type, name, description, parameters, strict}) as chat's {type, function:{...}},
 * tool_choice {type:"function", name} as {type:"function", function:{name}}, text.format
 * json_object / json_schema as response_format, include ["message.output_text.logprobs"]
 * as logprobs: true (top_logprobs stays). Tools of another type (hosted ones such as
 * web_search, Codex's local_shell or custom tools) are left out: a declared tool is an
 * offer the model may take, and the reply is whole without it
 * (kvpd_items_skipped_tools names them). A tool without a type, other tool_choice forms
 * (a hosted tool forced cannot be honoured) and other formats or include values are
 * refused naming the field. NULL with e set. */
json_t *kvpd_items_request(json_t *req, kvpd_oai_err *e);
/* The types of req's tools kvpd_items_request leaves out, in order (a new array; NULL
 * only without memory). */
json_t *kvpd_items_skipped_tools(json_t *req);

/* An error of chat's parse of the twin named as the Responses API names its fields:
 * tools[i].function.x is tools[j].x (j: the index in tools, the request's tools, of the
 * twin's i-th tool, the tools kvpd leaves out counted), tool_choice.function.name is
 * tool_choice.name, response_format is text.format, logprobs is include (in the param and
 * the message). */
void kvpd_items_error_names(kvpd_oai_err *e, const json_t *tools);

/* input (a string, or an array of items) as an array of items, a new reference: a string
 * is one user message item. NULL with e set. */
json_t *kvpd_items_input(json_t *input, kvpd_oai_err *e);

/* The conversation as chat messages (a new reference): the instructions (NULL: none)
 * first as the system message, then each item: a message item as its role's message
 * (its text parts joined), a run of function_call items as one assistant message's
 * tool_calls (after the assistant message just before them, if any), a
 * function_call_output as a tool message, a reasoning item's reasoning_text parts as the
 * next assistant message's reasoning_content. Items from first_input on are the request's
 * input[0...]: an error names input[i - first_input]. NULL with e set. */
json_t *kvpd_items_chat(const json_t *items, size_t first_input, const char *instructions,
                        size_t instructions_len, kvpd_oai_err *e);

/* Output items. */
/* A message item (text NULL: no content part yet) whose output_text part carries
 * logprobs (taken; NULL: none, an empty array). */
json_t *kvpd_items_message(const char *id, const char *text, size_t len, const char *status,
                           json_t *logprobs);
json_t *kvpd_items_call(const char *id, const char *call_id, const char *name,
                        const char *arguments, const char *status);
/* A reasoning item (text NULL: no content part yet). */
json_t *kvpd_items_reasoning(const char *id, const char *text, size_t len, const char *status);
/* A chat reply message ({role:"assistant", content, tool_calls, reasoning_content}) as
 * output items: a reasoning item (rs_...) with reasoning_content, a message item (msg_id)
 * when it has content or no calls, then one function_call item per call (ids fc_...). A
 * new reference. */
json_t *kvpd_items_output(const json_t *msg, const char *msg_id, const char *status);
/* The texts of the message items of output, joined (a new reference: a string). */
json_t *kvpd_items_output_text(const json_t *output);

#endif
