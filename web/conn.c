/* A connection's outgoing frames (web/conn.h): websocket messages or one HTTP body,
 * queued until lws says the socket is writeable. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "web/conn.h"

int kvpd_conn_queue(kvpd_conn *c, const char *payload, size_t len)
{
    kvpd_frame *f = malloc(sizeof *f + LWS_PRE + len);
    if (!f)
        return -ENOMEM;
    f->next = NULL;
    f->len = len;
    memcpy(f->buf + LWS_PRE, payload, len);
    if (c->out_tail)
        c->out_tail->next = f;
    else
        c->out_head = f;
    c->out_tail = f;
    c->w->frames_pending++;
    lws_callback_on_writable(c->wsi);
    return 0;
}

void kvpd_conn_send(kvpd_conn *c, char *json)
{
    /* A frame jansson could not build (memory, or text it refused) still gets an answer. */
    static const char fallback[] = "{\"type\":\"error\",\"code\":\"" KVPD_E_INTERNAL
                                   "\",\"message\":\"the server could not build its answer\"}";
    const char *payload = json ? json : fallback;
    if (!json)
        kvpd_log("warning", "could not build a frame; sent an internal error instead");
    if (kvpd_conn_queue(c, payload, strlen(payload)) < 0) {
        /* Not even that fits in memory: close, so the client is not left waiting. */
        kvpd_log("warning", "out of memory for a frame; closing the connection");
        lws_set_timeout(c->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
    }
    free(json);
}

void kvpd_conn_free_frames(kvpd_conn *c)
{
    while (c->out_head) {
        kvpd_frame *f = c->out_head;
        c->out_head = f->next;
        free(f);
        c->w->frames_pending--;
    }
    c->out_tail = NULL;
}
