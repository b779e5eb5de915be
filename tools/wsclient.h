/* A minimal websocket and HTTP/1.1 client for tests and the load generator: plain
 * sockets, so a test controls exactly what goes on the wire (masked frames,
 * fragments, half-sent frames). */
#ifndef KVP_WSCLIENT_H
#define KVP_WSCLIENT_H

#include <stddef.h>
#include <stdint.h>

enum { WS_CONT = 0x0, WS_TEXT = 0x1, WS_BINARY = 0x2, WS_CLOSE = 0x8, WS_PING = 0x9,
       WS_PONG = 0xA };

typedef struct ws_client {
    int fd;
    unsigned char *buf;      /* received, not yet consumed */
    size_t len, cap;
} ws_client;

/* Connects to host:port and upgrades `path`. 0, or a negative errno (-EPROTO when the
 * server refuses the upgrade). */
int ws_connect(ws_client *c, const char *host, int port, const char *path, int timeout_ms);
/* The same with more request headers: whole "Name: value\r\n" lines, or NULL. */
int ws_connect_headers(ws_client *c, const char *host, int port, const char *path,
                       const char *headers, int timeout_ms);
void ws_close(ws_client *c);
/* Builds one masked client frame into out (len + 14 bytes); returns its size. */
size_t ws_frame(unsigned char *out, int opcode, int fin, const void *data, size_t len);
/* Sends one frame / raw bytes. 0 or negative errno. */
int ws_send_frame(ws_client *c, int opcode, int fin, const void *data, size_t len);
int ws_send_text(ws_client *c, const char *text);
int ws_send_raw(ws_client *c, const void *data, size_t len);
/* Reads one whole message (joining fragments, answering pings). *payload is malloc'd
 * and NUL-terminated. Returns the opcode (WS_TEXT, WS_BINARY, WS_CLOSE) or a negative
 * errno (-ETIMEDOUT, -ECONNRESET). */
int ws_read(ws_client *c, int timeout_ms, char **payload, size_t *len);

/* One HTTP GET (Connection: close). auth: NULL or the Authorization value. Returns the
 * status code (body malloc'd) or a negative errno. */
int http_get(const char *host, int port, const char *path, const char *auth,
             char **body, int timeout_ms);

/* Milliseconds on the monotonic clock. */
double ws_now_ms(void);

#endif
