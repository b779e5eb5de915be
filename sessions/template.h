/* Chat templates: the tokens that wrap each user message so the model sees its own
 * conversation format. Plain continuation for base models (stories260K); ChatML,
 * Llama-2 [INST] and Llama-3 headers when the GGUF declares one (model->chat_format). */
#ifndef KVP_TEMPLATE_H
#define KVP_TEMPLATE_H

#include <stddef.h>
#include "model/model.h"

typedef struct kvp_template {
    enum kvp_chat_format format;   /* the one in use (PLAIN when markers are missing) */
    const kvp_tokenizer *tok;
    int bos, eos;
    int open, close;               /* ChatML <|im_start|> <|im_end|>; Llama-3 header ids */
    int eot;                       /* Llama-3 <|eot_id|> */
    int stop[3];                   /* tokens that end a reply, -1 unused */
} kvp_template;

/* Picks the model's format; falls back to plain (returns 1) when a marker token is
 * missing from the vocabulary. */
int kvp_template_init(kvp_template *t, const kvp_model *m);
const char *kvp_template_name(enum kvp_chat_format f);
/* Tokens for one user turn, up to the start of the assistant's reply.
 * first: the conversation's first turn; reply_open: the previous reply ended without
 * its end-of-turn marker (cut by max_tokens or cancel), so the marker goes first.
 * *out is malloc'd. Returns the count or a negative code. */
int kvp_template_turn(const kvp_template *t, int first, int reply_open,
                      const char *text, size_t len, int **out);
/* Tokens for an assistant reply's text (rebuilding a transcript from its messages):
 * the text as the model would have generated it, without markers. */
int kvp_template_reply(const kvp_template *t, const char *text, size_t len, int **out);
/* 1 when `tok` ends a reply. */
int kvp_template_is_stop(const kvp_template *t, int tok);
/* 1 when a reply's stop token belongs in the transcript (the format's end marker). */
int kvp_template_keeps_stop(const kvp_template *t);

#endif
