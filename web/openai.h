/* The OpenAI-compatible API's transport (web/openai.c, docs/openai.md): requests under
 * /v1 that web/http.c admitted, their POST bodies, the streamed answer, and the
 * connection's end (which cancels the turn). Called by web/server.c's callback; each
 * returns as an lws callback. */
#ifndef KVPD_OPENAI_H
#define KVPD_OPENAI_H

#include <stddef.h>

#include "web/conn.h"

int kvpd_openai_request(kvpd_conn *c, const char *uri);
int kvpd_openai_body(kvpd_conn *c, const void *in, size_t len);
int kvpd_openai_body_done(kvpd_conn *c);
int kvpd_openai_writeable(kvpd_conn *c);
void kvpd_openai_closed(kvpd_conn *c);

#endif
