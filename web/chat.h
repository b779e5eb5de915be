/* The /chat websocket (web/chat.c, docs/protocol.md), called by web/server.c's
 * callback. */
#ifndef KVPD_CHAT_H
#define KVPD_CHAT_H

#include <stddef.h>

#include "web/conn.h"

/* The websocket upgrade's ?session=ID (a balancer's affinity key, docs/cluster.md) into
 * out (KVP_SESSION_ID_LEN + 1 bytes; "" when absent). NULL, or why it is refused: not
 * 32 lowercase hex digits, or given twice. */
const char *kvpd_chat_session_arg(struct lws *wsi, char *out);
/* Message bytes as they arrive; complete messages are handled. */
int kvpd_chat_receive(kvpd_conn *c, const void *in, size_t len);
/* The connection closed; the hub lets go of it. */
void kvpd_chat_closed(kvpd_conn *c);

#endif
