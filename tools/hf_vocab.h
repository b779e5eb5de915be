/* Converts a Hugging Face tokenizer.json (+ tokenizer_config.json) into GGUF tokenizer
 * metadata the way GGUF converters do, for `kvp synth --tokenizer-json`. */
#ifndef KVP_HF_VOCAB_H
#define KVP_HF_VOCAB_H

#include <stddef.h>

#include "model/gguf.h"

/* Adds tokenizer.ggml.{model, pre, tokens, token_type, scores, merges, bos/eos/eot ids}
 * and tokenizer.chat_template to w. config_path may be NULL. Byte-level BPE files
 * (ByteLevel decoder) become "gpt2" with the pre-tokenizer named from the split regex;
 * SentencePiece-style BPE (byte fallback, U+2581 spaces) becomes "llama" with scores
 * from the merge ranks. Sets *vocab to the vocabulary size (highest id + 1). Returns 0
 * or a negative code with a message in err. */
int kvp_hf_vocab_add(kvp_gguf_writer *w, const char *tokenizer_path, const char *config_path,
                     long *vocab, char *err, size_t errlen);

#endif
