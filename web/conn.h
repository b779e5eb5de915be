/* Per-connection state shared by the HTTP and websocket handlers (web/ internal). */
#ifndef KVPD_CONN_H
#define KVPD_CONN_H

#include <libwebsockets.h>
#include <stddef.h>
#include <stdint.h>

#include "web/web.h"

typedef struct kvpd_frame {
    struct kvpd_frame *next;
    size_t len;
    unsigned char buf[];     /* LWS_PRE bytes of headroom, then the payload */
} kvpd_frame;

enum kvpd_rx_skip { KVPD_RX_KEEP = 0, KVPD_RX_BINARY, KVPD_RX_TOO_LARGE };

typedef struct kvpd_conn {
    struct lws *wsi;
    kvpd_web *w;
    int is_ws;
    int head;                          /* HTTP: a HEAD request (headers only) */
    int close_after;                   /* HTTP: close once this answer is out (its body,
                                        * if any, was never read) */
    int drain_close;                   /* HTTP: the answer is out, the close waits for the
                                        * refused body to be read (kvpd_wsguard_drain) */
    kvp_hub_client *client;            /* made on the first hello or message */
    char session_arg[KVP_SESSION_ID_LEN + 1];   /* /chat?session=ID ("" none): what a
                                                 * hello without an id resumes */
    kvpd_frame *out_head, *out_tail;   /* ws frames, or one HTTP body */
    char *rx;                          /* the websocket message being assembled */
    size_t rx_len, rx_cap;
    enum kvpd_rx_skip rx_skip;
    struct kvpd_oai *oai;              /* an OpenAI API request (web/openai.c) */
    char tenant[KVP_TENANT_LEN + 1];   /* the API key's tenant (kvpd_api_tenant) */
    int authed;                        /* websocket: a valid key came (on the upgrade or in
                                        * the auth frame), or none is configured */
    int close_code;                    /* websocket: close with this code and close_why
                                        * on the next writeable callback (0: none) */
    const char *close_why;
    const char *path_label;            /* HTTP: the endpoint, for kvpd_http_requests_total */
    char cors[256];                    /* HTTP: the answer's Access-Control-Allow-Origin
                                        * (kvpd_guard_cors; "" none) */
    struct kvpd_ws_tools *tools;       /* websocket: tool calling state (web/chat.c) */
} kvpd_conn;

/* The listening socket (web/listen.c): accepts, bounds and hands connections to lws. */
int kvpd_listen_start(kvpd_web *w, const char *host, char *err, size_t errlen);
void kvpd_listen_stop(kvpd_web *w);
/* 1 for a connection accepted past max_connections, into the few kept for /healthz,
 * /health and /metrics: anything else is refused, and it closes after its answer. */
int kvpd_listen_reserved(struct lws *wsi);
/* The connection's wsi is going: its client address counts one connection less. */
void kvpd_listen_closed(struct lws *wsi);

/* web/wsguard.c: client frames must be masked (RFC 6455 5.1), checked before lws reads
 * them. init at start, on the loop thread (0 or < 0; only that thread's reads are
 * guarded), check: 0 when lws's reads do go through the guard; accept: a connection kvpd
 * accepted, before lws adopts it: *out is its state, which the connection owns and
 * hands to close when it goes (-EMFILE: a descriptor past the index, not to be served;
 * -ENOMEM); close: fd is no longer guarded as this connection's, and the state is freed
 * (NULL: nothing); upgraded: the websocket handshake completed (< 0: the client
 * sent bytes before it, fail the connection); failed: 1 once an unmasked frame came (the
 * callbacks close with 1002). */
typedef struct kvpd_wsguard kvpd_wsguard;
int kvpd_wsguard_init(void);
void kvpd_wsguard_free(void);
int kvpd_wsguard_check(void);
int kvpd_wsguard_accept(int fd, kvpd_wsguard **out);
void kvpd_wsguard_close(kvpd_wsguard *g);
int kvpd_wsguard_upgraded(int fd, struct lws *wsi);
int kvpd_wsguard_failed(int fd);
/* HTTP requests: after a request's header, body: len bytes of body go to lws, and what
 * follows is held back from it (read and dropped) until release, when the answer is out.
 * release: 1 when bytes other than blank lines were dropped (a pipelined request: the
 * connection must close), or the body was not all read. */
void kvpd_wsguard_body(int fd, uint64_t len);
int kvpd_wsguard_release(int fd);
/* A refused request's body: its len bytes are read and dropped (lws never sees them);
 * once they all came, lws is asked for a writeable callback on wsi, where the answer's
 * connection may close without resetting the client's sending. draining: 1 until then. */
void kvpd_wsguard_drain(int fd, struct lws *wsi, uint64_t len);
int kvpd_wsguard_draining(int fd);
/* The largest refused body read that way, and the seconds it may take (a client slower
 * than that is cut off). */
#define KVPD_DRAIN_MAX ((uint64_t)64 << 20)
#define KVPD_DRAIN_S 10
/* Between body and release: 1 when bytes other than blank lines came after the body
 * (dropped already, or still unread in the socket: looked at without reading), so the
 * answer says `Connection: close` and the client sends that request again. */
int kvpd_wsguard_pipelined(int fd);

/* web/guard.c. The Host and Origin rules for a request: NULL when allowed, else the
 * reason and the HTTP status to answer (400, 421, 403). */
const char *kvpd_guard_check(kvpd_web *w, struct lws *wsi, int *status);
/* CORS (docs/openai.md): the Access-Control-Allow-Origin value for the request's
 * Origin: the origin itself (copied into buf) when allowed_origins lists it, "*" when
 * allowed_origins is "*", NULL when there is no Origin or CORS is not allowed for it
 * (a page of the daemon's own origin needs none). Credentials are never allowed. */
const char *kvpd_guard_cors(kvpd_web *w, struct lws *wsi, char *buf, size_t len);
/* The CORS headers of every answer under /v1 ("name:", "value" pairs, NULL-ended;
 * none when origin is NULL): at most KVPD_CORS_HEADERS pairs. */
#define KVPD_CORS_HEADERS 3
int kvpd_cors_headers(const char *origin, const char **extra);
/* The same for a websocket upgrade, plus Sec-WebSocket-Version 13 (400). */
const char *kvpd_guard_upgrade(kvpd_web *w, struct lws *wsi, int *status);
/* 1 when the request of wsi carries "Authorization: Bearer <want>" (constant time); 0
 * when not, or when want is empty. */
int kvpd_bearer_is(struct lws *wsi, const char *want);
/* 1 when the tl bytes at tok are exactly want (constant time in want's length); 0 when
 * not, or when want is empty. */
int kvpd_token_is(const char *tok, size_t tl, const char *want);
/* The model endpoints' key check: with API keys configured, 1 when the request carries
 * "Authorization: Bearer <one of them>" (constant time), its tenant (16 hex digits of
 * the key's hash) in tenant[KVP_TENANT_LEN + 1]; 0 without a valid key. Without keys,
 * 1 and tenant "". */
int kvpd_api_tenant(const kvpd_web *w, struct lws *wsi, char *tenant);
/* The same for a token of len bytes given outside a header (the /chat auth frame). */
int kvpd_api_tenant_token(const kvpd_web *w, const char *tok, size_t len, char *tenant);
/* 1 when tenant is one of the configured keys' tenants (or "" without keys). */
int kvpd_api_tenant_known(const kvpd_web *w, const char *tenant);
/* The bearer token the admin endpoints require: admin_token, or the generated one. */
const char *kvpd_admin_token(const kvpd_web *w);
/* At start: without admin_token, generates one and writes it (mode 0600) to
 * admin_token_file, or <state_dir>/admin.token; with neither, the admin endpoints are closed. */
int kvpd_admin_token_init(kvpd_web *w, char *err, size_t errlen);

/* Queues payload (copied) and asks lws for a writeable callback. 0 or -ENOMEM. */
int kvpd_conn_queue(kvpd_conn *c, const char *payload, size_t len);
/* Queues a frame built by web/protocol.c and frees it. NULL (it could not be built)
 * sends an internal error instead; no memory to queue closes the connection: an answer
 * is never dropped silently. */
void kvpd_conn_send(kvpd_conn *c, char *json);
void kvpd_conn_free_frames(kvpd_conn *c);

#endif
