/* Reasoning blocks (model/reasoning.h): the split of a reply into its reasoning and its
 * answer, whole and streamed. */
#include "model/reasoning.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define OPEN_LEN (sizeof KVP_THINK_OPEN - 1)
#define CLOSE_LEN (sizeof KVP_THINK_CLOSE - 1)

static int space(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static size_t skip_space(const char *t, size_t from, size_t len)
{
    while (from < len && space(t[from]))
        from++;
    return from;
}

/* The end of t[from..to) without its trailing whitespace. */
static size_t trim_end(const char *t, size_t from, size_t to)
{
    while (to > from && space(t[to - 1]))
        to--;
    return to;
}

/* Where the reasoning of a reply starting at t[0..len) begins when the block is open
 * there (opened) or opens there, else SIZE_MAX: after the opening marker (which a reply
 * inside an opened block may still write) and the whitespace around it. */
static size_t reasoning_start(const char *t, size_t len, int opened)
{
    size_t at = skip_space(t, 0, len);
    if (len - at >= OPEN_LEN && !memcmp(t + at, KVP_THINK_OPEN, OPEN_LEN))
        return skip_space(t, at + OPEN_LEN, len);
    return opened ? at : SIZE_MAX;
}

kvp_reasoning_parts kvp_reasoning_split(const char *text, size_t len)
{
    return kvp_reasoning_split_in(text, len, 0);
}

kvp_reasoning_parts kvp_reasoning_split_in(const char *text, size_t len, int opened)
{
    kvp_reasoning_parts p = {0, 0, 0, 0, len};
    size_t from = reasoning_start(text, len, opened);
    if (from == SIZE_MAX)
        return p;
    p.found = 1;
    p.r_from = from;
    const char *close = memmem(text + p.r_from, len - p.r_from, KVP_THINK_CLOSE, CLOSE_LEN);
    if (!close) {   /* never closed: all reasoning */
        p.r_to = trim_end(text, p.r_from, len);
        p.c_from = p.c_to = len;
        return p;
    }
    size_t c = (size_t)(close - text);
    p.r_to = trim_end(text, p.r_from, c);
    p.c_from = skip_space(text, c + CLOSE_LEN, len);
    return p;
}

/* The longest suffix of t[from..len) that is a proper prefix of the marker m. */
static size_t partial_marker(const char *t, size_t from, size_t len, const char *m, size_t mlen)
{
    for (size_t k = mlen - 1; k > 0; k--)
        if (len - from >= k && !memcmp(t + len - k, m, k))
            return k;
    return 0;
}

int kvp_reasoning_feed(kvp_reasoning_stream *s, const char *text, size_t len, int final,
                       kvp_reasoning_delta *out)
{
    memset(out, 0, sizeof *out);
    if (len) {
        if (s->len + len + 1 > s->cap) {
            size_t cap = s->cap ? s->cap : 256;
            while (cap < s->len + len + 1)
                cap *= 2;
            char *b = realloc(s->buf, cap);
            if (!b)
                return -ENOMEM;
            s->buf = b;
            s->cap = cap;
        }
        memcpy(s->buf + s->len, text, len);
        s->len += len;
    }
    const char *b = s->buf;
    size_t n = s->len;
    if (s->phase == 0) {
        size_t at = skip_space(b, 0, n);
        size_t rest = n - at;
        /* inside an opened block: decided once the text cannot be the opening marker
         * written again (which is then skipped, as a block's opening is) */
        if (s->opened && !(rest >= OPEN_LEN && !memcmp(b + at, KVP_THINK_OPEN, OPEN_LEN)) &&
            (final || (rest && (rest >= OPEN_LEN || memcmp(b + at, KVP_THINK_OPEN, rest))))) {
            s->phase = 1;
            s->found = 1;
            s->r_from = s->r_sent = SIZE_MAX;
            s->scan = at;
        } else if (rest >= OPEN_LEN && !memcmp(b + at, KVP_THINK_OPEN, OPEN_LEN)) {
            s->phase = 1;
            s->found = 1;
            s->r_from = s->r_sent = SIZE_MAX;   /* after the whitespace that follows */
            s->scan = at + OPEN_LEN;
        } else if (final || (rest && (rest >= OPEN_LEN || memcmp(b + at, KVP_THINK_OPEN, rest)))) {
            s->phase = 2;   /* no block: the answer is the text as it is */
            s->c_from = s->c_sent = 0;
        } else {
            return 0;       /* it may still open one */
        }
    }
    if (s->phase == 1) {
        if (s->r_from == SIZE_MAX) {
            size_t at = skip_space(b, s->scan, n);
            if (at == n && !final)
                return 0;
            s->r_from = s->r_sent = at;
            s->scan = at;
        }
        /* (an empty reply inside an opened block has no buffer yet) */
        const char *close = b ? memmem(b + s->scan, n - s->scan, KVP_THINK_CLOSE, CLOSE_LEN)
                              : NULL;
        size_t end;
        if (close) {
            size_t c = (size_t)(close - b);
            end = trim_end(b, s->r_from, c);
            s->phase = 2;
            s->c_from = s->c_sent = SIZE_MAX;
            s->scan = c + CLOSE_LEN;
        } else {
            size_t hold = final ? 0 : partial_marker(b, s->r_from, n, KVP_THINK_CLOSE, CLOSE_LEN);
            end = trim_end(b, s->r_from, n - hold);
            /* the search goes on where a marker could still begin */
            s->scan = n >= CLOSE_LEN - 1 && n - (CLOSE_LEN - 1) > s->r_from ? n - (CLOSE_LEN - 1)
                                                                             : s->r_from;
        }
        if (end > s->r_sent) {
            out->reasoning = b + s->r_sent;
            out->reasoning_len = end - s->r_sent;
            s->r_sent = end;
        }
    }
    if (s->phase == 2) {
        if (s->c_from == SIZE_MAX) {
            size_t at = skip_space(b, s->scan, n);
            if (at == n && !final)
                return 0;
            s->c_from = s->c_sent = at;
        }
        if (n > s->c_sent) {
            out->content = b + s->c_sent;
            out->content_len = n - s->c_sent;
            s->c_sent = n;
        }
    }
    return 0;
}

void kvp_reasoning_free(kvp_reasoning_stream *s)
{
    free(s->buf);
    memset(s, 0, sizeof *s);
}
