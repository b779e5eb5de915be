/* The vocabulary a tokenizer holds (kvp_tokenizer: pieces, scores, special ids and
 * the sorted index) and the lookups over it. Both encoders read it: SentencePiece-style
 * BPE (model/tokenizer.c) and byte-level BPE (model/bpe.c); model/tokenizer.h loads
 * and frees it. */
#ifndef KVP_VOCAB_H
#define KVP_VOCAB_H

#include <stddef.h>

struct kvp_bpe;

typedef struct kvp_tokenizer {
    int vocab_size;
    char **pieces;          /* [vocab] NUL-terminated; the SentencePiece space marker
                               U+2581 is stored as ' '; byte tokens stay "<0xNN>";
                               byte-level BPE text pieces are stored as their bytes
                               ("Ġthe" as " the"), special pieces as written */
    int *piece_len;         /* [vocab] */
    float *scores;          /* [vocab] merge priority (higher merges first) */
    int byte_token[256];    /* token id of <0xNN> (byte-level BPE: of the one-byte piece),
                               -1 if the vocabulary lacks it */
    int bos_id, eos_id, unk_id;
    int eot_id;             /* end of turn (tokenizer.ggml.eot_token_id), -1 if none */
    int max_piece_len;
    int add_space_prefix;   /* prepend " " to non-empty text (SentencePiece dummy prefix) */
    int *sorted;            /* [vocab] token ids sorted by piece, for lookup: first the
                               n_text text tokens, then (sorted apart) the byte tokens and
                               GGUF unknown/control/unused tokens, which the encoder never
                               produces from text */
    int n_text;
    struct kvp_bpe *bpe;    /* byte-level BPE merges and pre-tokenizer; NULL for
                               SentencePiece */
    /* User-defined tokens (GGUF token type 4) the encoder takes where the text spells
     * them, longest first, merging the text on each side apart. SentencePiece: all
     * (Gemma's "\n\n", "<table>") but those holding a space (U+2581 in the file), which
     * the references match only against a literal U+2581. Byte-level BPE: only runs of
     * whitespace (GPT-NeoX's); others ("<think>") stay text. Sorted by piece. */
    int *user_ids;
    int n_user;
    unsigned char user_max_len[256];   /* longest such piece by first byte, 0 if none */
} kvp_tokenizer;

/* Token id of an exact piece (spaces as ' '), -1 if absent. Finds special pieces such
 * as "<|im_start|>" too; a text token wins over a special one with the same piece. */
int kvp_tokenizer_lookup(const kvp_tokenizer *t, const char *piece, size_t len);
/* Token id of a special (control, user-defined, unknown, unused or byte) token with
 * exactly this piece, -1 if there is none: the chat template's markers. */
int kvp_tokenizer_special(const kvp_tokenizer *t, const char *piece, size_t len);
/* The id of a text (non-special) piece given as raw bytes, or -1: what the encoders
 * merge into. */
int kvp_tokenizer_lookup_text(const kvp_tokenizer *t, const char *piece, size_t len);
/* The longest piece of t->user_ids at text[0..len) (len > 0): its id, *n its length;
 * -1 if none. */
int kvp_vocab_user_at(const kvp_tokenizer *t, const char *text, size_t len, size_t *n);
/* memcmp order of two byte strings, a shorter prefix first: the order of t->sorted. */
int kvp_vocab_cmp(const char *a, size_t alen, const char *b, size_t blen);

#endif
