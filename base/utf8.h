/* Reassembles UTF-8 from token pieces: byte-fallback tokens can split one character
 * across tokens, and JSON text frames must be valid UTF-8. */
#ifndef KVP_UTF8_H
#define KVP_UTF8_H

#include <stddef.h>

typedef struct kvp_utf8 {
    unsigned char pend[4];   /* bytes of an incomplete character */
    int n;
} kvp_utf8;

/* 1 when the len bytes are valid UTF-8 (NUL bytes are), else 0. */
int kvp_utf8_valid(const char *s, size_t len);
/* Appends len bytes of `in` and writes the complete, valid text so far to out (which
 * needs 3 * len + 4 bytes): incomplete trailing sequences wait for the next call, invalid
 * bytes become U+FFFD. Returns the bytes written. */
size_t kvp_utf8_feed(kvp_utf8 *u, const char *in, size_t len, char *out);
/* Flushes a pending incomplete sequence as U+FFFD (end of the reply). out: 4 bytes. */
size_t kvp_utf8_flush(kvp_utf8 *u, char *out);

#endif
