/* Byte-level BPE (tokenizer.ggml.model "gpt2": Llama 3, Qwen 2.5/3, SmolLM2): the GPT-2
 * byte-to-unicode spelling of pieces and merge ranks from tokenizer.ggml.merges
 * (model/bpe.c), and the pre-tokenizers named by tokenizer.ggml.pre, one table row each
 * naming its split regexes, written out by hand over the classes of model/unicode.h
 * (model/bpe_pretok.c). Internal to model/: kvp_tokenizer_* dispatches here. */
#ifndef KVP_BPE_H
#define KVP_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/vocab.h"

/* Each pre-tokenizer is llama.cpp's list of split regexes for its tokenizer.ggml.pre
 * names (llama-vocab.cpp), applied as Hugging Face's Split(Isolated) sequence: every
 * regex splits every chunk of the one before into its matches and the text between. */
enum kvp_bpe_pre {
    /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
     * (gpt2, mpt, olmo) */
    KVP_PRE_GPT2,
    /* \p{N}, then GPT2 (smollm, starcoder, refact, command-r) */
    KVP_PRE_SMOLLM,
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
     *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    KVP_PRE_LLAMA3,
    /* LLAMA3 with single digits: \p{N} for \p{N}{1,3} */
    KVP_PRE_QWEN2,
    /* [\p{P}\$\+<=>\^~\|`]+, then GPT2, then [0-9][0-9][0-9] */
    KVP_PRE_FALCON,
    /* [\r\n], \s?[cased letters of the Latin, Greek, Cyrillic, Armenian, Georgian,
     * Cherokee, Glagolitic, Coptic, Deseret, Osage, Old Hungarian, Warang Citi, Adlam
     * blocks]+, \s?[!-/:-~！-／：-～‘-‟　-。]+, \s+$, [一-龥ࠀ-一가-퟿]+, \p{N}+ */
    KVP_PRE_DEEPSEEK_LLM,
    /* [\r\n], \s?\p{L}+, \s?\p{P}+, [一-龥ࠀ-一가-퟿]+, \p{N} */
    KVP_PRE_DEEPSEEK_CODER,
    /* \p{N}{1,3}, [一-龥぀-ゟ゠-ヿ]+, then
     * [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
     *  ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    KVP_PRE_DEEPSEEK3,
    /* [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
     * [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
     * \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+  (gpt-4o, llama4) */
    KVP_PRE_GPT4O,
    /* GPT4O without the contractions and with \p{N} for \p{N}{1,3} (tekken) */
    KVP_PRE_TEKKEN,
    /* LLAMA3's regex, without Llama 3's whole-token rule (chatglm-bpe, glm4) */
    KVP_PRE_CHATGLM4,
};

typedef struct kvp_bpe {
    enum kvp_bpe_pre pre;
    int ignore_merges;     /* a chunk that is a whole token is that token (Llama 3,
                              tekken: llama.cpp's ignore_merges) */
    int nfc;               /* text is NFC-normalized first (Qwen's tokenizers) */
    /* merge table, open addressing: key = (left << 32 | right) + 1, 0 = empty slot */
    uint64_t *keys;
    int32_t *rank;         /* lower merges first */
    int32_t *result;       /* token id of the merged piece */
    uint64_t mask;
    int n_merges;
} kvp_bpe;

/* The pre-tokenizer for a tokenizer.ggml.pre name; -1 when unknown. */
int kvp_bpe_pre_from_name(const char *name, size_t len);
/* The names kvp_bpe_pre_from_name knows, comma-separated, for error messages. */
const char *kvp_bpe_pre_names(void);
/* Turns a piece spelled in GPT-2's byte-to-unicode alphabet ("Ġthe") into its bytes
 * (" the") in dst (at most len bytes). Returns the length, or -1 when the piece holds a
 * character outside that alphabet. */
int kvp_bpe_unspell(const char *piece, size_t len, char *dst);
/* Writes the byte-to-unicode spelling of len bytes into dst (2 * len bytes). */
size_t kvp_bpe_spell(const char *bytes, size_t len, char *dst);
/* Reads tokenizer.ggml.merges ("A B" per entry, spelled) into b; the tokenizer's text
 * pieces and byte tokens must be set. */
int kvp_bpe_load_merges(kvp_bpe *b, const kvp_tokenizer *t, const kvp_gguf_kv *merges,
                        char *err, size_t errlen);
void kvp_bpe_free(kvp_bpe *b);
/* Splits len bytes of text into the chunks of a pre-tokenizer (before NFC: the caller
 * normalizes): writes the byte offset where each chunk ends to ends[] (room for len
 * entries); returns the count, -ENOMEM or -E2BIG. */
int kvp_bpe_split(enum kvp_bpe_pre pre, const char *text, size_t len, int *ends);
/* Encodes text as kvp_tokenizer_encode does (no BOS/EOS: the caller adds them).
 * Returns the count, -ENOSPC when more than max, -ENOMEM. */
int kvp_bpe_encode(const kvp_tokenizer *t, const char *text, size_t len, int *out, int max);

#endif
