/* The OpenAI API's answers as JSON and bytes (docs/openai.md): error bodies, usage and
 * kvpd's figures, chat completion objects and stream chunks, Server-Sent Event frames,
 * the model list and fresh ids. No I/O and no transport: web/openai.c and the codecs
 * queue what these build. */
#ifndef KVPD_OAI_REPLY_H
#define KVPD_OAI_REPLY_H

#include <jansson.h>
#include <stddef.h>

#include "sessions/hub.h"
#include "web/oai_error.h"

/* OpenAI's error shape {"error": {message, type, param, code}}, type and code from the
 * code's row of the table (web/oai_error.h); param may be NULL (null). */
json_t *kvpd_oai_error_json(enum kvpd_oai_code code, const char *param, const char *msg,
                            size_t len);
/* usage as chat completions report it. */
json_t *kvpd_oai_usage(const kvp_turn_stats *st);
/* kvpd's own figures of the turn beside OpenAI's: session (NULL: null), cache and durable
 * (1 saved, 0 not yet, -1 no store: null). */
json_t *kvpd_oai_kvpd_stats(const char *session, int durable, const kvp_turn_stats *st);
/* "tool_calls" when tool_calls > 0, "length" when the reply was cut by max_tokens, else
 * "stop". */
const char *kvpd_oai_finish_reason(const kvp_turn_stats *st, int tool_calls);
/* A whole reply the length budget shaped (st->shaped: its document is whole, so it
 * finishes "stop", docs/openai.md) says so in obj, a choice or a response: kvpd's field
 * "kvpd_shaped_by" naming the limit (limit: "max_tokens", "max_output_tokens"). Returns
 * obj. */
json_t *kvpd_oai_with_shaped(json_t *obj, const kvp_turn_stats *st, const char *limit);

/* Log-probabilities of n reply tokens (kvp_hub_event.logprobs, top alternatives each) as
 * chat completions give them: the `content` array of {token, logprob, bytes,
 * top_logprobs: [{token, logprob, bytes}]}. A token's string is its bytes as UTF-8 (a
 * partial character as U+FFFD; bytes are exact); a logprob of no mass is -9999. */
json_t *kvpd_oai_logprobs_content(const kvp_hub_logprob *lp, int n, int top);
/* The same in the legacy completions' shape {tokens, token_logprobs, top_logprobs (one
 * object token -> logprob per token), text_offset}: the byte offset of each token, the
 * first at *offset, which is moved past the last. */
json_t *kvpd_oai_logprobs_legacy(const kvp_hub_logprob *lp, int n, int top, size_t *offset);

/* Sets choices[0].logprobs of a chat completion or chunk j to {"content": [...]} of
 * those tokens (kvpd_oai_logprobs_content); returns j. */
json_t *kvpd_oai_with_logprobs(json_t *j, const kvp_hub_logprob *lp, int n, int top);

/* The fields every chat completion object and chunk carries. */
typedef struct kvpd_oai_meta {
    const char *id;
    long created;
    const char *model;
} kvpd_oai_meta;

/* A chat.completion.chunk with its choices (taken). */
json_t *kvpd_oai_chunk(const kvpd_oai_meta *m, json_t *choices);
/* The choices of a chunk: the assistant's role, a delta (taken), or the finish. */
json_t *kvpd_oai_chunk_role(void);
json_t *kvpd_oai_chunk_delta(json_t *delta);
json_t *kvpd_oai_chunk_finish(const char *finish_reason, const kvp_turn_stats *st);
/* Those choices (one) as choice index's; returns them. */
json_t *kvpd_oai_chunk_at(json_t *choices, int index);
/* A whole chat.completion: the reply's message (taken), its finish and figures (session
 * NULL: null). */
json_t *kvpd_oai_completion(const kvpd_oai_meta *m, json_t *message, const char *finish,
                            const kvp_turn_stats *st, const char *session, int durable);
/* GET /v1/models: one entry per comma-separated alias id, the model's own name when
 * there are none. */
json_t *kvpd_oai_models(const char *aliases, const char *model, long created);

/* One Server-Sent Event as bytes (malloc'd, *len set): "event: NAME\n" first when name
 * is not NULL, then "data: <JSON>\n\n". j is taken. NULL when it could not be built. */
char *kvpd_oai_sse_frame(const char *name, json_t *j, size_t *len);
/* The end of a chat or text completion stream. */
#define KVPD_OAI_SSE_DONE "data: [DONE]\n\n"

/* A fresh random id: prefix, then 24 hex digits (nothing of the session's). 0 or -1. */
int kvpd_oai_new_id(char *out, size_t len, const char *prefix);

#endif
