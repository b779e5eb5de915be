/* Incremental UTF-8 validation (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). */
#include "base/utf8.h"

#include <string.h>

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Length of the sequence a lead byte starts, 0 if it cannot start one. */
static int seq_len(unsigned char b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF)
        return 3;
    if (b >= 0xF0 && b <= 0xF4)
        return 4;
    return 0;
}

/* Whether byte i (1-based continuation index) may follow lead byte `lead`. */
static int cont_ok(unsigned char lead, int i, unsigned char b)
{
    if ((b & 0xC0) != 0x80)
        return 0;
    if (i != 1)
        return 1;
    switch (lead) {
    case 0xE0: return b >= 0xA0;   /* no overlong 3-byte forms */
    case 0xED: return b <= 0x9F;   /* no surrogates */
    case 0xF0: return b >= 0x90;   /* no overlong 4-byte forms */
    case 0xF4: return b <= 0x8F;   /* <= U+10FFFF */
    default: return 1;
    }
}

int kvp_utf8_valid(const char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        unsigned char lead = (unsigned char)s[i];
        int need = seq_len(lead);
        if (need == 0 || (size_t)need > len - i)
            return 0;
        for (int k = 1; k < need; k++)
            if (!cont_ok(lead, k, (unsigned char)s[i + (size_t)k]))
                return 0;
        i += (size_t)need;
    }
    return 1;
}

size_t kvp_utf8_feed(kvp_utf8 *u, const char *in, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)in[i];
        if (u->n == 0) {
            int need = seq_len(b);
            if (need == 1)
                out[o++] = (char)b;
            else if (need == 0) {
                memcpy(out + o, replacement, 3);
                o += 3;
            } else
                u->pend[u->n++] = b;
            continue;
        }
        if (!cont_ok(u->pend[0], u->n, b)) {
            /* Broken sequence: replace what we held, then re-read b as a new lead. */
            memcpy(out + o, replacement, 3);
            o += 3;
            u->n = 0;
            i--;
            continue;
        }
        u->pend[u->n++] = b;
        if (u->n == seq_len(u->pend[0])) {
            memcpy(out + o, u->pend, (size_t)u->n);
            o += (size_t)u->n;
            u->n = 0;
        }
    }
    return o;
}

size_t kvp_utf8_flush(kvp_utf8 *u, char *out)
{
    if (!u->n)
        return 0;
    u->n = 0;
    memcpy(out, replacement, 3);
    return 3;
}
