/* A growing text buffer: appends bytes to *buf (malloc'd, *len bytes used of *cap), keeping
 * it NUL-terminated so it can be read as a C string as it grows; the capacity doubles from
 * 256 bytes. And a copy of n bytes as a NUL-terminated string. */
#ifndef KVP_TEXTBUF_H
#define KVP_TEXTBUF_H

#include <stdlib.h>
#include <string.h>

/* 0, or -1 when out of memory (the buffer is then as it was). */
static inline int kvp_text_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return -1;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

/* n bytes of s and a NUL after them (malloc'd); NULL when out of memory. */
static inline char *kvp_text_dup(const char *s, size_t n)
{
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, s, n);
        c[n] = '\0';
    }
    return c;
}

#endif
