/* HTTP on a connection (web/http.c): the plain endpoints, and the status line and
 * headers every HTTP answer writes (the OpenAI API's too). Below web/openai.c, which
 * uses the answer half; above web/conn.h. */
#ifndef KVPD_HTTP_H
#define KVPD_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "web/conn.h"

/* Handles LWS_CALLBACK_HTTP for uri; returns as an lws callback. A request for the
 * OpenAI API that passed the framing, connection and Host/Origin checks is not
 * answered: *api is set to 1, and the caller hands it to kvpd_openai_request. */
int kvpd_http_request(kvpd_conn *c, const char *uri, int *api);
/* Status line and headers now (len KVPD_HTTP_NO_LENGTH: none, the body ends when the
 * connection closes), no-store, and the `extra` "name:", "value" pairs up to a NULL.
 * 0, or 1 when they could not be written. */
#define KVPD_HTTP_NO_LENGTH UINT64_MAX
int kvpd_http_headers(kvpd_conn *c, int status, const char *type, uint64_t len,
                      const char *const *extra);
/* The headers, then the body (queued as one frame) on the writeable callback. */
int kvpd_http_respond(kvpd_conn *c, int status, const char *type, const char *body,
                      size_t len, const char *const *extra);
/* 1 when the request carries "Authorization: Bearer <want>" (constant time); 0 when not,
 * or when want is empty. */
int kvpd_http_bearer_ok(kvpd_conn *c, const char *want);
/* Writes the queued body once writeable; returns as an lws callback. */
int kvpd_http_writeable(kvpd_conn *c);

struct json_t;
/* Deletes tenant's learn_dir transcripts (kvp_hub_learn_forget; "" the tenant of a
 * daemon without keys): 0 with *answer the JSON {"object": "learn.transcripts.deleted",
 * "tenant", "deleted"}, or the error's HTTP status with its code and message (404
 * unknown_tenant: no key has that id and it has no transcripts; 404 not_found: no
 * learn_dir; 503 while the model loads). */
int kvpd_learn_forget(kvpd_web *w, const char *tenant, struct json_t **answer,
                      const char **code, char *msg, size_t msglen);

#endif
