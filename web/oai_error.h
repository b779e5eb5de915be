/* The OpenAI API's error codes (docs/openai.md): one table gives each its HTTP status,
 * OpenAI's error type and the `code` string of the error body (none for the generic
 * ones, whose metrics label is then their type). No I/O. */
#ifndef KVPD_OAI_ERROR_H
#define KVPD_OAI_ERROR_H

#include <stddef.h>

#include <jansson.h>

enum kvpd_oai_code {
    KVPD_OAI_E_INVALID_REQUEST,       /* 400: a field is wrong (param names it) */
    KVPD_OAI_E_INVALID_JSON,          /* 400: the body is not a JSON object */
    KVPD_OAI_E_UNSUPPORTED_PARAMETER, /* 400: a field kvpd cannot honour */
    KVPD_OAI_E_UNKNOWN_PARAMETER,     /* 400: a field the endpoint does not have */
    KVPD_OAI_E_UNSUPPORTED_MODEL,     /* 400: the endpoint does not serve this model */
    KVPD_OAI_E_PREVIOUS_RESPONSE,     /* 400: previous_response_id is not stored */
    KVPD_OAI_E_CONTEXT_LENGTH,        /* 400: the conversation is over the context */
    KVPD_OAI_E_BAD_REQUEST,           /* 400: the hub refused the turn */
    KVPD_OAI_E_UNKNOWN_SESSION,       /* 400: the hub has no such session */
    KVPD_OAI_E_INVALID_API_KEY,       /* 401 */
    KVPD_OAI_E_NOT_FOUND,             /* 404: no such stored response */
    KVPD_OAI_E_MODEL_NOT_FOUND,       /* 404: strict_model_name and another model */
    KVPD_OAI_E_UNKNOWN_URL,           /* 404: no such endpoint */
    KVPD_OAI_E_METHOD_NOT_ALLOWED,    /* 405 */
    KVPD_OAI_E_REQUEST_TOO_LARGE,     /* 413: over max_body_bytes */
    KVPD_OAI_E_OVERLOADED,            /* 429: the hub's queue is full */
    KVPD_OAI_E_BUSY,                  /* 429: the session has a turn running */
    KVPD_OAI_E_OVERLOADED_DRAINING,   /* 503: overloaded while the server drains */
    KVPD_OAI_E_BUSY_DRAINING,         /* 503: busy while the server drains */
    KVPD_OAI_E_SERVER,                /* 500: out of memory and the like */
    KVPD_OAI_E_INTERNAL,              /* 500: the hub failed */
    KVPD_OAI_E_BAD_JSON,              /* 500: the hub could not read what it was given */
    KVPD_OAI_E_UNAVAILABLE,           /* 503: loading or shutting down, before a turn */
    KVPD_OAI_E_SHUTTING_DOWN,         /* 503: the shutdown cut the turn */
    KVPD_OAI_E_ELSEWHERE,             /* 503: another node serves the session now */
    KVPD_OAI_E_COUNT
};

/* The code's HTTP status. */
int kvpd_oai_code_status(enum kvpd_oai_code code);
/* OpenAI's error type: invalid_request_error, authentication_error, ... */
const char *kvpd_oai_code_type(enum kvpd_oai_code code);
/* The error body's `code` (NULL: null). */
const char *kvpd_oai_code_name(enum kvpd_oai_code code);
/* The label of kvpd_api_errors_total: the name, else the type. */
const char *kvpd_oai_code_label(enum kvpd_oai_code code);
/* A hub error event's code (KVPD_E_*, sessions/hub.h) as the API's; draining: the server
 * is shutting down (overloaded and busy are then 503s). An unknown code is
 * KVPD_OAI_E_INTERNAL. */
enum kvpd_oai_code kvpd_oai_code_of_hub(const char *hub_code, int draining);

/* Unknown keys inside a request's objects (response_format, tools, tool_choice,
 * stream_options, ...): every codec refuses them the one way, as
 * KVPD_OAI_E_UNKNOWN_PARAMETER naming the key's whole path. */
/* The first key of obj (an object) not among keys (NULL-terminated), or NULL. */
const char *kvpd_oai_unknown_key(const json_t *obj, const char *const *keys);
/* An unknown key's refusal: param = "<at>.<key>" (the key cut at 64 bytes), msg =
 * "unknown parameter '<param>': kvpd refuses what it would not honour". */
void kvpd_oai_unknown_at(char *param, size_t paramlen, char *msg, size_t msglen,
                         const char *at, const char *key);

#endif
