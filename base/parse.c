#include "base/parse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* strtol and strtod skip leading spaces and take '+', "0x", "inf" and "nan": a number
 * here starts with a digit (or '-' then a digit, or '.') and is decimal. */
static int decimal(const char *s, int float_ok)
{
    if (*s == '-')
        s++;
    if (!((*s >= '0' && *s <= '9') || (float_ok && *s == '.')))
        return 0;
    for (; *s; s++)
        if (*s == 'x' || *s == 'X' || *s == 'p' || *s == 'P')
            return 0;
    return 1;
}

int kvp_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!decimal(s, 0) || errno || end == s || *end || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

int kvp_parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!decimal(s, 1) || errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

int kvp_parse_u64(const char *s, unsigned long long *out, const char **end_out)
{
    char *end;
    errno = 0;
    if (!(*s >= '0' && *s <= '9'))
        return 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || (!end_out && *end))
        return 0;
    if (end_out)
        *end_out = end;
    *out = v;
    return 1;
}

int kvp_split_list(char *s, char **out, int max, int *n)
{
    *n = 0;
    for (char *p = s;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (!*p || *n == max)
            return 0;
        out[(*n)++] = p;
        if (!comma)
            return 1;
        p = comma + 1;
    }
}
