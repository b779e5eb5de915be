/* The OpenAI API's request codec (docs/openai.md): a request body in, the hub's turn
 * options and messages out, or the error to answer. No I/O and no transport: the
 * connection's side (web/openai.c) passes the body and what the server serves, and
 * answers the error it gets back. */
#ifndef KVPD_OAI_PARSE_H
#define KVPD_OAI_PARSE_H

#include <jansson.h>
#include <stddef.h>

#include "sessions/hub.h"
#include "web/oai_error.h"
#include "web/oai_tools.h"
#include "web/sampling.h"

/* The endpoint a request is for, its path without the /v1 prefix. */
enum kvpd_oai_path {
    KVPD_OAI_NONE = 0, KVPD_OAI_CHAT, KVPD_OAI_MODELS, KVPD_OAI_COMPLETIONS,
    KVPD_OAI_RESPONSES, KVPD_OAI_RESPONSE,   /* /responses/{id} */
    KVPD_OAI_LEARN,                          /* /learn/transcripts (kvpd's own) */
    /* llama.cpp's server's own, without /v1 only */
    KVPD_OAI_LLAMA_COMPLETION,               /* /completion */
    KVPD_OAI_TOKENIZE, KVPD_OAI_DETOKENIZE, KVPD_OAI_PROPS, KVPD_OAI_SLOTS,
    KVPD_OAI_UNKNOWN,                        /* under /v1, no such endpoint */
};

/* Which endpoint uri names (enum kvpd_oai_path; 0: not the API): the API's paths with or
 * without the /v1 prefix, llama.cpp's (/completion, /tokenize, /detokenize, /props,
 * /slots) without it, and anything else under /v1. id: the {id} of
 * /v1/responses/{id} (may be NULL). */
int kvpd_openai_path(const char *uri, const char **id);
/* The endpoint's label in kvpd_http_requests_total (NULL: not the API). */
const char *kvpd_openai_path_label(const char *uri);
/* The methods the endpoint takes, as an Allow header lists them. */
const char *kvpd_openai_path_allow(enum kvpd_oai_path path);

/* A request refused: the HTTP status (the code's), the error code (web/oai_error.h),
 * the field it names ("" for none) and the message. */
typedef struct kvpd_oai_err {
    int status;
    enum kvpd_oai_code code;
    char param[96];
    char message[512];
} kvpd_oai_err;

/* Sets e with the code's status (param may be NULL: none) and returns -1. */
int kvpd_oai_bad(kvpd_oai_err *e, enum kvpd_oai_code code, const char *param, const char *fmt,
                 ...) __attribute__((format(printf, 4, 5)));

/* An unknown key inside one of the request's objects: e set as kvpd_oai_unknown_at
 * (web/oai_error.h) writes it, KVPD_OAI_E_UNKNOWN_PARAMETER naming "<at>.<key>"; -1. */
int kvpd_oai_unknown(kvpd_oai_err *e, const char *at, const char *key);

/* What the server serves, as the parse checks a request against it. */
typedef struct kvpd_oai_limits {
    int max_tokens;               /* the ceiling of max_tokens (kvp_hub_reply_cap) */
    int strict_model_name;        /* `model` must name the model or an alias */
    const char *model_alias;      /* comma-separated ids ("" none) */
    const char *model;            /* the loaded model's name */
    int tool_format;              /* the model's (kvp_hub_info.tool_format) */
    int reasoning;                /* the model's replies may open with a reasoning block
                                   * (kvp_hub_info.reasoning) */
    int fixed_seed;               /* a request without a seed samples with seed */
    uint64_t seed;
} kvpd_oai_limits;

/* A parsed request. Zeroed before the first parse; kvpd_oai_release frees it. */
typedef struct kvpd_oai_req {
    kvp_turn_opts turn;           /* borrows own, grammar and tools below */
    int stream, include_usage;
    int reasoning;                /* the model's replies may hold a reasoning block: its
                                   * reasoning_content is split off, and sent back into it */
    int n_choices;                /* n: 1..KVP_HUB_MAX_CHOICES */
    kvpd_sampling own;            /* logit_bias and the stop strings (web/sampling.h) */
    struct kvp_grammar *grammar;  /* response_format */
    kvpd_oai_tools tools;         /* tool calling (web/oai_tools.h) */
    /* chat completions (kvpd_oai_parse_chat) */
    kvp_message *msgs;            /* the hub's messages; texts malloc'd */
    int n_msgs;
    char *system;                 /* the conversation's system text (NULL: none) */
    size_t system_len;
    char *prefill;                /* chat completions: the assistant's unfinished message
                                   * last, which the reply continues (NULL: none) */
    size_t prefill_len;
    int lp_sent;                  /* logprobs: reply tokens streamed so far */
    size_t lp_offset;             /* legacy logprobs: the next token's text_offset */
    int has_session;              /* the body named a session ... */
    char session[KVP_SESSION_ID_LEN + 1];   /* ... this one (checked) */
} kvpd_oai_req;

/* The body as JSON (texts may hold NUL; duplicate keys are refused): an object (a new
 * reference), or NULL with e set. */
json_t *kvpd_oai_parse_json(const char *body, size_t len, kvpd_oai_err *e);
/* The endpoints whose top-level fields kvpd_oai_check_fields knows. */
enum kvpd_oai_api { KVPD_OAI_API_CHAT, KVPD_OAI_API_COMPLETIONS, KVPD_OAI_API_RESPONSES };
/* Every top-level field of req is one endpoint api reads (serving it, or refusing a value
 * it cannot honour by name) or one of the benign fields real clients send that change
 * nothing kvpd does (docs/openai.md): else a 400 unknown_parameter naming the first other
 * field, never ignored. 0, or -1 with e set. */
int kvpd_oai_check_fields(json_t *req, enum kvpd_oai_api api, kvpd_oai_err *e);
/* The request's `model`: a string or absent; with strict_model_name, the model's name or
 * one of model_alias. 0, or -1 with e set. */
int kvpd_oai_parse_model(json_t *req, const kvpd_oai_limits *l, kvpd_oai_err *e);
/* The turn's options (sampling, max_tokens, stop, seed, tools, response_format) and the
 * answer's form (stream, stream_options) into r->turn and r. 0, or -1 with e set. */
int kvpd_oai_parse_options(json_t *req, const kvpd_oai_limits *l, kvpd_oai_req *r,
                           kvpd_oai_err *e);
/* Chat completions' logprobs (a boolean) and top_logprobs (0..20, only with logprobs)
 * into r->turn; with tools they are refused. 0, or -1 with e set. */
int kvpd_oai_parse_logprobs(json_t *req, kvpd_oai_req *r, kvpd_oai_err *e);
/* A whole POST /v1/chat/completions body: the JSON, model, options, messages (a system
 * or developer message first is the system text, later ones fold into the user message
 * that follows) and session. 0, or -1 with e set and no messages held. */
int kvpd_oai_parse_chat(const char *body, size_t len, const kvpd_oai_limits *l,
                        kvpd_oai_req *r, kvpd_oai_err *e);
/* Chat messages (JSON) as the hub's, into r's msgs and system text: tool parts rewritten
 * by r->tools (kvpd_oai_tools_messages), a system or developer message first is the system
 * text, later ones fold into the user message that follows, the last message is the
 * user's or tool results, or with prefill an assistant's text after them (r->prefill:
 * non-empty, without tool_calls). system_param: the field an oversized system text is
 * named by. 0, or -1 with e set and no messages held. */
int kvpd_oai_parse_messages(json_t *msgs, const char *system_param, int prefill,
                            kvpd_oai_req *r, kvpd_oai_err *e);
/* Frees r's messages and system text (the hub copied them). */
void kvpd_oai_release_messages(kvpd_oai_req *r);
/* Frees everything r holds and zeroes it. */
void kvpd_oai_release(kvpd_oai_req *r);

#endif
