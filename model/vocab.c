#include "model/vocab.h"

#include <string.h>

int kvp_vocab_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c)
        return c;
    return (alen > blen) - (alen < blen);
}

/* Lowest id with the exact piece among sorted[lo, hi), or -1. */
static int search(const kvp_tokenizer *t, int lo, int hi, const char *piece, size_t len)
{
    int end = hi;
    while (lo < hi) { /* lower bound */
        int mid = lo + (hi - lo) / 2, id = t->sorted[mid];
        if (kvp_vocab_cmp(t->pieces[id], (size_t)t->piece_len[id], piece, len) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < end) {
        int id = t->sorted[lo];
        if (kvp_vocab_cmp(t->pieces[id], (size_t)t->piece_len[id], piece, len) == 0)
            return id;
    }
    return -1;
}

/* The encoder only looks among text tokens. */
int kvp_tokenizer_lookup_text(const kvp_tokenizer *t, const char *piece, size_t len)
{
    return search(t, 0, t->n_text, piece, len);
}

int kvp_tokenizer_special(const kvp_tokenizer *t, const char *piece, size_t len)
{
    return search(t, t->n_text, t->vocab_size, piece, len);
}

int kvp_tokenizer_lookup(const kvp_tokenizer *t, const char *piece, size_t len)
{
    int id = kvp_tokenizer_lookup_text(t, piece, len);
    return id >= 0 ? id : search(t, t->n_text, t->vocab_size, piece, len);
}

int kvp_vocab_user_at(const kvp_tokenizer *t, const char *text, size_t len, size_t *n)
{
    size_t max = t->user_max_len[(unsigned char)text[0]];
    for (size_t l = max < len ? max : len; l > 0; l--) {
        int lo = 0, hi = t->n_user;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2, id = t->user_ids[mid];
            int c = kvp_vocab_cmp(t->pieces[id], (size_t)t->piece_len[id], text, l);
            if (c == 0) {
                *n = l;
                return id;
            }
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
    }
    return -1;
}
