/* Reasoning blocks: a reply that opens with `<think>` (after any whitespace) holds the
 * model's reasoning up to `</think>`, then its answer, as Qwen3, QwQ and DeepSeek-R1 write
 * them. The split of a reply's text into the two, whole (kvp_reasoning_split) and as the
 * text streams in (kvp_reasoning_feed), the same either way: the reasoning without the
 * markers and trimmed of whitespace, the answer after `</think>` without its leading
 * whitespace; a block never closed is all reasoning; a reply that does not open with the
 * marker is all answer, unchanged; a reply whose prompt opened the block starts inside it.
 * Whether a model writes them is its vocabulary's (both markers are tokens of it:
 * kvp_template.think; kvp_template.think_open: its generation prompt opens one). No I/O. */
#ifndef KVP_REASONING_H
#define KVP_REASONING_H

#include <stddef.h>

#define KVP_THINK_OPEN "<think>"
#define KVP_THINK_CLOSE "</think>"

/* The parts of text[0..len): found 0 (no block: content is all of it) or 1, the reasoning
 * text[r_from..r_to) and the answer text[c_from..c_to). */
typedef struct kvp_reasoning_parts {
    int found;
    size_t r_from, r_to, c_from, c_to;
} kvp_reasoning_parts;
kvp_reasoning_parts kvp_reasoning_split(const char *text, size_t len);
/* As kvp_reasoning_split, for a reply whose prompt opened the block (opened: the
 * template's generation prompt ends with `<think>`, as Qwen3's thinking templates and
 * DeepSeek-R1's do): the reply starts inside it, so its text up to `</think>` is the
 * reasoning (an opening marker the model writes again is skipped), and a reply that
 * never closes it is all reasoning. opened 0: kvp_reasoning_split. */
kvp_reasoning_parts kvp_reasoning_split_in(const char *text, size_t len, int opened);

/* A streamed reply: feed its text piece by piece; each call gives the reasoning and the
 * answer settled since the last one (pointers into the stream's buffer, valid until the
 * next feed; text that may still be a marker or trimmed whitespace is held), and with
 * final everything left. Zero it to start; kvp_reasoning_free frees it. */
typedef struct kvp_reasoning_stream {
    char *buf;
    size_t len, cap;
    int opened;                /* set before the first feed: the prompt opened the block,
                                * so the reply starts inside it (kvp_reasoning_split_in) */
    int phase;                 /* 0 undecided, 1 reasoning, 2 answer */
    int found;                 /* the reply opened a block */
    size_t r_from, r_sent;     /* the reasoning's start and how far it was given */
    size_t c_from, c_sent;     /* the answer's start (SIZE_MAX: not yet) and how far */
    size_t scan;               /* where the search for the close marker goes on */
} kvp_reasoning_stream;
typedef struct kvp_reasoning_delta {
    const char *reasoning, *content;
    size_t reasoning_len, content_len;
} kvp_reasoning_delta;
/* 0, or -ENOMEM (nothing taken). */
int kvp_reasoning_feed(kvp_reasoning_stream *s, const char *text, size_t len, int final,
                       kvp_reasoning_delta *out);
void kvp_reasoning_free(kvp_reasoning_stream *s);

#endif
