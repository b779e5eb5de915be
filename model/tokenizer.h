/* Tokenizers: SentencePiece-style BPE (llama2.c encode: merges by score, byte fallback;
 * tokenizer.ggml.model "llama") and byte-level BPE (merges by rank after a
 * pre-tokenizer split; tokenizer.ggml.model "gpt2", model/bpe.h).
 * Loaded from a llama2.c tokenizer.bin or from GGUF tokenizer.ggml.* metadata.
 * Encoding never produces a special token (control, unknown, unused; in byte-level BPE
 * also user-defined, but for runs of whitespace only, as GPT-NeoX's) from text: "<|im_start|>" in a user's message is plain text; only the chat template puts
 * special tokens in, by id (kvp_tokenizer_lookup). The vocabulary and its lookups are
 * model/vocab.h. */
#ifndef KVP_TOKENIZER_H
#define KVP_TOKENIZER_H

#include <stddef.h>
#include "model/gguf.h"
#include "model/vocab.h"


/* llama2.c format: int max_token_length, then vocab_size x {float score, int len, bytes}. */
int kvp_tokenizer_load_file(kvp_tokenizer *t, const char *path, int vocab_size,
                            char *err, size_t errlen);
/* tokenizer.ggml.model "llama": tokens, scores (optional: default 0), token_type
 * (optional), bos/eos/unk/eot ids and add_space_prefix are read when present.
 * "gpt2": tokens, token_type (optional), merges and pre (tokenizer.ggml.pre: the names
 * of model/bpe.h, kvp_bpe_pre_names(); absent means gpt2; another is refused naming it)
 * are read; no dummy prefix. A byte-level vocabulary may lack the bytes UTF-8 never
 * uses (the encoder drops them), not a printable ASCII one. */
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
 * SentencePiece's leading space after BOS is dropped, special tokens give their text. Returns a pointer valid while t lives and
 * sets *len; NULL/0 for an id out of range. */
const char *kvp_tokenizer_piece(const kvp_tokenizer *t, int prev, int tok, size_t *len);

#endif
