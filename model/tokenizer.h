/* SentencePiece-style BPE tokenizer (llama2.c encode: merges by score, byte fallback).
 * Loaded from a llama2.c tokenizer.bin or from GGUF tokenizer.ggml.* metadata. */
#ifndef KVP_TOKENIZER_H
#define KVP_TOKENIZER_H

#include <stddef.h>
#include "model/gguf.h"

typedef struct kvp_tokenizer {
    int vocab_size;
    char **pieces;          /* [vocab] NUL-terminated; the SentencePiece space marker
                               U+2581 is stored as ' '; byte tokens stay "<0xNN>" */
    int *piece_len;         /* [vocab] */
    float *scores;          /* [vocab] merge priority (higher merges first) */
    int byte_token[256];    /* token id of <0xNN>, -1 if the vocabulary lacks it */
    int bos_id, eos_id, unk_id;
    int eot_id;             /* end of turn (tokenizer.ggml.eot_token_id), -1 if none */
    int max_piece_len;
    int add_space_prefix;   /* prepend " " to non-empty text (SentencePiece dummy prefix) */
    int *sorted;            /* [vocab] token ids sorted by piece, for lookup: first the
                               n_text text tokens, then (sorted apart) the byte tokens and
                               GGUF unknown/control/unused tokens, which the encoder never
                               produces from text */
    int n_text;
} kvp_tokenizer;

/* llama2.c format: int max_token_length, then vocab_size x {float score, int len, bytes}. */
int kvp_tokenizer_load_file(kvp_tokenizer *t, const char *path, int vocab_size,
                            char *err, size_t errlen);
/* tokenizer.ggml.model must be "llama"; tokens, scores (optional: default 0), token_type
 * (optional), bos/eos/unk/eot ids and add_space_prefix are read when present. */
int kvp_tokenizer_load_gguf(kvp_tokenizer *t, const kvp_gguf *g, char *err, size_t errlen);
void kvp_tokenizer_free(kvp_tokenizer *t);

/* Flags of kvp_tokenizer_encode. */
enum {
    KVP_ENCODE_BOS = 1,        /* start with BOS */
    KVP_ENCODE_EOS = 2,        /* end with EOS */
    KVP_ENCODE_NO_PREFIX = 4,  /* no dummy leading space even when add_space_prefix is
                                  set: for text that continues earlier text */
};

/* Encodes len bytes of text (need not be NUL-terminated, may hold any bytes).
 * Writes at most max tokens; returns the count, or -ENOSPC if max is too small
 * (-ENOMEM, or -E2BIG for len above INT_MAX / 4). */
int kvp_tokenizer_encode(const kvp_tokenizer *t, const char *text, size_t len,
                         unsigned flags, int *out, int max);
/* The bytes token `tok` contributes after token `prev`: byte tokens become their byte,
 * the leading space after BOS is dropped. Returns a pointer valid while t lives and
 * sets *len; NULL/0 for an id out of range. */
const char *kvp_tokenizer_piece(const kvp_tokenizer *t, int prev, int tok, size_t *len);
/* Token id of an exact piece (spaces as ' '), -1 if absent. Finds special pieces such
 * as "<|im_start|>" too; a text token wins over a special one with the same piece. */
int kvp_tokenizer_lookup(const kvp_tokenizer *t, const char *piece, size_t len);

#endif
