/* The OpenAI-compatible API's request state and the helpers its codecs share (web/
 * internal): web/openai.c reads the request, routes it and owns the answer's transport
 * (headers, queued frames, Server-Sent Events); web/oai_parse.c parses the bodies and
 * web/oai_reply.c builds the answers' JSON, neither with any transport; the codecs of
 * the other endpoints (web/oai_completions.c, web/oai_responses.c) parse their bodies
 * and shape the hub's events through these. Loop thread only. */
#ifndef KVPD_OPENAI_IMPL_H
#define KVPD_OPENAI_IMPL_H

#include <jansson.h>
#include <stddef.h>

#include "model/reasoning.h"
#include "web/conn.h"
#include "web/oai_parse.h"
#include "web/oai_reply.h"
#include "web/openai.h"

/* How a codec shapes the hub's events (NULL members: the chat completion's own). */
typedef struct kvpd_oai_codec {
    void (*token)(kvpd_conn *c, const kvp_hub_event *ev);
    void (*done)(kvpd_conn *c, const kvp_hub_event *ev);   /* not a cut (cancel) turn */
    /* an error once the stream's 200 is out; the codec ends the stream */
    void (*stream_error)(kvpd_conn *c, enum kvpd_oai_code code, const char *msg, size_t len);
    void (*free)(void *state);
    /* the hub's answer about a stored response (KVP_HUB_RESPONSE) */
    void (*stored)(kvpd_conn *c, const kvp_hub_event *ev);
} kvpd_oai_codec;

/* One of a request's other choices (n > 1; web/oai_choices.c): index 1.. */
typedef struct kvpd_oai_choice {
    kvpd_conn *c;
    int index;
    kvp_hub_client *client;
    int started;                  /* streaming: its role chunk is queued */
    int done;
    int lp_sent;                  /* logprobs: its reply tokens streamed so far */
    int generated, prefilled;     /* its completion and prefilled tokens */
    kvp_reasoning_stream rs;      /* streaming with reasoning: its split */
    json_t *choice;               /* not streaming: its entry of `choices` once done */
} kvpd_oai_choice;

typedef struct kvpd_oai {
    char *body;                   /* the POST body, bounded by max_body_bytes */
    size_t body_len, body_cap;
    int body_too_large;
    int body_done;                /* the body is in: the request was routed */
    kvp_hub_client *client;       /* while the turn runs */
    kvpd_oai_req req;             /* the parsed request: its options are lent to the
                                   * hub's call (web/oai_parse.h) */
    int ended;                    /* the answer is complete: nothing more gets queued */
    int started;                  /* streaming: the 200 headers and the role chunk are queued */
    int headers_sent;
    int status;                   /* of the answer (200 or an error's) */
    int retry_after_s;            /* > 0: a Retry-After header */
    int close;                    /* close after the answer (streams, unread bodies) */
    uint64_t queued_bytes;        /* the whole body when not streaming */
    char session[KVP_SESSION_ID_LEN + 1];   /* the session the turn runs in ("" none yet) */
    char named[KVP_SESSION_ID_LEN + 1];     /* the session the request named ("" none) */
    int session_hidden;           /* the request continues a session it neither made nor
                                   * named (matched by its transcript): the id is kept
                                   * for kvpd's own use and never answered */
    int durable;                  /* the turn's (kvp_hub_event): 1 saved, 0 not, -1 no store */
    char id[64];                  /* chatcmpl-... */
    long created;
    char model[128];
    char origin[256];             /* CORS: Access-Control-Allow-Origin ("" none) */
    enum kvpd_oai_path path;
    const char *allow;            /* a 405's Allow header (NULL: none) */
    enum kvpd_oai_code error;     /* of an error answer (web/oai_error.h), for the metrics */
    const kvpd_oai_codec *codec;  /* NULL: the chat completion */
    void *codec_state;            /* freed by codec->free */
    const json_t *items_tools;    /* Responses: its request's tools while its chat twin is
                                   * parsed, to name errors by them (kvpd_items_error_names) */
    int tool_format;              /* the model's (kvp_hub_info) */
    int reasoning;                /* its replies may open with a reasoning block */
    int reasoning_open;           /* a free reply starts inside a block its generation
                                   * prompt opened (kvp_hub_info); rs.opened: this one does */
    kvp_reasoning_stream rs;      /* streaming with reasoning: the first choice's split */
    int tool_calls;               /* calls in the reply: finish_reason "tool_calls" */
    /* n > 1 (web/oai_choices.c): the first choice is the one above (client, req.lp_sent,
     * tool_calls); the others are more[0..n_choices - 1). The answer is complete once
     * every choice is done. */
    int n_choices;
    kvpd_oai_choice *more;
    int first_done;
    kvp_turn_stats first;         /* the first choice's figures (usage, kvpd) */
    json_t *whole;                /* not streaming: the completion, the first choice in it */
    /* work of the request's on libuv's thread pool (kvpd_oai_offload_run): what it uses
     * is the pool's until it is back; a connection closed meanwhile leaves the request
     * to be freed then */
    struct kvpd_oai_offload *offload;
} kvpd_oai;

/* ---- web/openai.c, for the codecs ---- */

/* Work whose cost grows with the request (parsing a chat completion, tokenizing) off the
 * loop: run(arg) on libuv's thread pool, then done(c, arg) back on the loop, or drop(arg)
 * when the connection closed meanwhile or the work could not run (it is answered 500).
 * run must touch neither the connection nor the hub's state (only what is fixed while it
 * runs: the model's templates). 0, or -1 when it cannot be queued (nothing was run; the
 * caller answers). */
int kvpd_oai_offload_run(kvpd_conn *c, void (*run)(void *arg),
                         void (*done)(kvpd_conn *c, void *arg), void (*drop)(void *arg),
                         void *arg);

/* The session id an answer may carry (X-Session-Id, `session`, `kvpd.session`): the one
 * the request made or named; NULL when it has none yet or continues a session found by
 * its transcript, whose id would let a stranger who sent the same transcript attach to
 * that conversation. */
const char *kvpd_oai_shown_session(const kvpd_oai *o);
/* The hub named the session the turn runs in (KVP_HUB_SESSION). */
void kvpd_oai_took_session(kvpd_oai *o, const kvp_hub_event *ev);

/* The whole answer: a JSON body (taken) with a status. */
void kvpd_oai_answer(kvpd_conn *c, int status, json_t *j);
/* The same with the body already serialized (compact JSON; NULL: a 500), for an answer
 * built off the loop. */
void kvpd_oai_answer_text(kvpd_conn *c, int status, const char *s);
/* OpenAI's error shape with the code's status (param may be NULL), counted by status and
 * code. */
void kvpd_oai_fail(kvpd_conn *c, enum kvpd_oai_code code, const char *param, const char *msg);
/* One Server-Sent Event: "event: NAME" first when name is not NULL, then the JSON (taken)
 * as its data. */
void kvpd_oai_sse(kvpd_conn *c, const char *name, json_t *j);
/* Queues raw bytes of the answer's body (a stream's "data: [DONE]"). */
void kvpd_oai_queue(kvpd_conn *c, const char *text, size_t len);
/* The body as JSON: an object, or NULL after answering 400. */
json_t *kvpd_oai_parse(kvpd_conn *c);
/* The request's `model` checked (kvpd_oai_parse_model). 0, or -1 after answering. */
int kvpd_oai_model_ok(kvpd_conn *c, json_t *req);
/* The turn's options (kvpd_oai_parse_options, kept in o->req) copied into t; -1 after
 * answering. */
int kvpd_oai_options(kvpd_conn *c, json_t *req, kvp_turn_opts *t);
/* A hub client for the request, with its tenant; NULL after answering 500. The stream's
 * end is the connection's. */
kvp_hub_client *kvpd_oai_client(kvpd_conn *c);

/* Streaming: the 200 and the first choice's role chunk queued (once). */
void kvpd_oai_stream_start(kvpd_conn *c);
/* Streaming: choice index's delta with the logprobs of the n tokens it completes (added
 * to *lp_sent); with rs (the model's reasoning blocks), the reply's text is split: its
 * reasoning goes out as delta.reasoning_content, its answer as delta.content (final: the
 * reply's end, what was held goes out). */
void kvpd_oai_stream_text(kvpd_conn *c, int index, kvp_reasoning_stream *rs, const char *text,
                          size_t len, int final, const kvp_hub_logprob *lp, int n, int top,
                          int *lp_sent);
/* The assistant message of a whole reply (not streamed): its content, with the model's
 * reasoning blocks its reasoning_content, with tools (may be NULL) its calls (their count
 * in *calls). */
json_t *kvpd_oai_message(const kvpd_oai *o, kvpd_oai_tools *tools, const char *text, size_t len,
                         int *calls);
/* A choice's turn cut by the shutdown: the request's answer is an error. */
void kvpd_oai_cut(kvpd_conn *c);
/* A choice's hub error: the request's answer (or the stream's end). */
void kvpd_oai_hub_error(kvpd_conn *c, const kvp_hub_event *ev);

/* ---- a request's other choices (web/oai_choices.c) ---- */

/* n (2..KVP_HUB_MAX_CHOICES) choices: a hub client for each after the first into
 * more[0..n-1), of the request's tenant; -1 after answering 500. */
int kvpd_oai_choices_open(kvpd_conn *c, int n, kvp_hub_client **more);
/* The first choice is done: whole is the completion holding it (taken; NULL when
 * streaming, its finish chunk queued) and st its figures. The answer goes out with the
 * last choice. */
void kvpd_oai_choices_first_done(kvpd_conn *c, json_t *whole, const kvp_turn_stats *st);
/* The request is over: the other choices' clients closed (after the first's), all freed. */
void kvpd_oai_choices_close(kvpd_oai *o);

/* ---- the codecs ---- */

/* POST /v1/completions (web/oai_completions.c). */
void kvpd_oai_completions(kvpd_conn *c);
/* POST /completion, llama.cpp's server's (web/oai_completions.c), and the parameters its
 * answers and GET /props show: t's (NULL: the defaults) with cfg's defaults. */
void kvpd_oai_llama_completion(kvpd_conn *c);
json_t *kvpd_oai_llama_params(const kvpd_config *cfg, const kvp_turn_opts *t, int n_predict,
                              int stream);
/* POST /tokenize, POST /detokenize, GET /props, GET /slots: llama.cpp's server's
 * (web/oai_llama.c). */
void kvpd_oai_tokenize(kvpd_conn *c);
void kvpd_oai_detokenize(kvpd_conn *c);
void kvpd_oai_props(kvpd_conn *c);
void kvpd_oai_slots(kvpd_conn *c);
/* POST /v1/responses, GET and DELETE /v1/responses/{id} (web/oai_responses.c). */
void kvpd_oai_responses(kvpd_conn *c);
void kvpd_oai_response_get(kvpd_conn *c, const char *id, int delete);

#endif
