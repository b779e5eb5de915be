/* Error messages: every fallible function takes (char *err, size_t errlen) and writes one
 * human-readable line there; this formats it and returns the error code, so an error
 * path reads `return kvp_errorf(err, errlen, -EINVAL, "...", ...)` (or KVP_ERR(-EINVAL,
 * "...") where the parameters have those names). */
#ifndef KVP_ERRORS_H
#define KVP_ERRORS_H

#include <stddef.h>

/* Writes the message when err is not NULL and errlen > 0; returns rc. */
int kvp_errorf(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define KVP_ERR(code, ...) kvp_errorf(err, errlen, (code), __VA_ARGS__)

#endif
