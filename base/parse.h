/* Strict numeric parsing (command-line values, config) (whole string, range-checked). */
#ifndef KVP_PARSE_H
#define KVP_PARSE_H

#include <limits.h>

/* Return 1 and set *out when s is a number within [lo, hi], else 0. */
int kvp_parse_long(const char *s, long lo, long hi, long *out);
int kvp_parse_double(const char *s, double lo, double hi, double *out);
/* Decimal digits only (no sign, space or "0x"), at most UINT64_MAX. With end NULL the whole
 * string must be the number; otherwise *end is set to the first byte after the digits. */
int kvp_parse_u64(const char *s, unsigned long long *out, const char **end);
/* "a,b,c" -> out[0..*n), in place (the commas become NULs). Returns 1, or 0 on an empty
 * field (",a", "a,,b", "a,", "") or more than max fields. */
int kvp_split_list(char *s, char **out, int max, int *n);

/* A macro's value as a string literal: "(default " KVP_STR(KVP_DEFAULT_CHUNK) ")". */
#define KVP_STR_(x) #x
#define KVP_STR(x) KVP_STR_(x)

#endif
