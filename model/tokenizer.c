#include "base/fileio.h"
#include "model/tokenizer.h"

#include "base/errors.h"
#include "model/bpe.h"
#include "model/merges.h"
#include "model/unicode.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* GGUF token types (llama.cpp's llama_token_type). */
enum { TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* One single-byte string per byte value, returned by kvp_tokenizer_piece for byte tokens. */
#define B4(n) n, n + 1, n + 2, n + 3
#define B16(n) B4(n), B4(n + 4), B4(n + 8), B4(n + 12)
#define B64(n) B16(n), B16(n + 16), B16(n + 32), B16(n + 48)
static const unsigned char byte_chars[256] = { B64(0), B64(64), B64(128), B64(192) };

void kvp_tokenizer_free(kvp_tokenizer *t)
{
    /* All pieces live in one block that starts at pieces[0]. */
    if (t->pieces)
        free(t->pieces[0]);
    free(t->pieces);
    free(t->piece_len);
    free(t->scores);
    free(t->sorted);
    free(t->user_ids);
    if (t->bpe)
        kvp_bpe_free(t->bpe);
    free(t->bpe);
    memset(t, 0, sizeof *t);
}

/* raw: a byte-level piece not spelled in GPT-2's alphabet (stored as it reads). */
typedef struct sort_entry { const char *piece; int len, id, raw; } sort_entry;

static int cmp_entries(const void *pa, const void *pb)
{
    const sort_entry *a = pa, *b = pb;
    int c = kvp_vocab_cmp(a->piece, (size_t)a->len, b->piece, (size_t)b->len);
    /* Duplicate pieces: one spelled in the byte alphabet before one stored raw (byte-level
     * BPE only ever builds the former: Command-R's vocabulary has a raw "\u200d" besides
     * the spelled one), then the lowest id; the first is the one lookup returns. */
    if (c || a->raw != b->raw)
        return c ? c : a->raw - b->raw;
    return (a->id > b->id) - (a->id < b->id);
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The byte a "<0xNN>" piece stands for, or -1. */
static int byte_piece_value(const char *p, int len)
{
    if (len != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return -1;
    int hi = hex_digit(p[3]), lo = hex_digit(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Byte tokens stand for raw bytes, not for their "<0xNN>" spelling (a merge must never
 * turn the text "<0x41>" into the byte 'A'), and no text may encode to a control token
 * (nor, in byte-level BPE, to an added user-defined one such as "<think>"). */
static int is_special(const kvp_tokenizer *t, const int32_t *types, int i)
{
    if (t->bpe)
        return types && (types[i] == TT_UNKNOWN || types[i] == TT_CONTROL ||
                         types[i] == TT_USER_DEFINED || types[i] == TT_UNUSED);
    int b = byte_piece_value(t->pieces[i], t->piece_len[i]);
    if (b >= 0 && t->byte_token[b] == i)
        return 1;
    return types && (types[i] == TT_UNKNOWN || types[i] == TT_CONTROL || types[i] == TT_UNUSED);
}

/* Whether len > 0 bytes are all ASCII whitespace. */
static int all_space(const char *p, int len)
{
    for (int i = 0; i < len; i++)
        if (!memchr(" \t\n\r\v\f", p[i], 6))
            return 0;
    return 1;
}

/* Fills byte_token, max_piece_len and the lookup index once pieces, piece_len and
 * scores are set. types is the GGUF token_type array, or NULL; raw (or NULL) flags the
 * byte-level text pieces stored as they read. */
static int finish(kvp_tokenizer *t, const int32_t *types, const unsigned char *raw, char *err,
                  size_t errlen)
{
    for (int b = 0; b < 256; b++)
        t->byte_token[b] = -1;
    t->max_piece_len = 0;
    for (int i = 0; i < t->vocab_size; i++) {
        int b = t->bpe ? -1 : byte_piece_value(t->pieces[i], t->piece_len[i]);
        if (b >= 0 && (!types || types[i] == TT_BYTE) && t->byte_token[b] < 0)
            t->byte_token[b] = i;
        if (t->piece_len[i] > t->max_piece_len)
            t->max_piece_len = t->piece_len[i];
    }
    t->sorted = malloc((size_t)t->vocab_size * sizeof *t->sorted);
    sort_entry *ents = malloc((size_t)t->vocab_size * sizeof *ents);
    if (!t->sorted || !ents) {
        free(ents);
        return kvp_errorf(err, errlen, -ENOMEM, "out of memory for the tokenizer index");
    }
    /* Text tokens first, specials after them; each part sorted on its own. */
    int n = 0;
    for (int special = 0; special < 2; special++) {
        int start = n;
        for (int i = 0; i < t->vocab_size; i++)
            if (is_special(t, types, i) == special)
                ents[n++] = (sort_entry){ t->pieces[i], t->piece_len[i], i, raw ? raw[i] : 0 };
        qsort(ents + start, (size_t)(n - start), sizeof *ents, cmp_entries);
        if (!special)
            t->n_text = n;
    }
    for (int i = 0; i < n; i++)
        t->sorted[i] = ents[i].id;
    /* The user-defined pieces the encoder takes from text, sorted (ents is in piece
     * order within each part): SentencePiece's, and in byte-level BPE the runs of
     * whitespace only (GPT-NeoX's "  " .. 24 spaces, as Hugging Face and llama.cpp
     * match them); a byte-level user-defined piece holding anything else ("<think>")
     * stays text. */
    t->n_user = 0;
    for (int i = 0; types && i < (t->bpe ? n : t->n_text); i++) {
        int id = ents[i].id;
        if (types[id] == TT_USER_DEFINED && ents[i].len > 0 &&
            (t->bpe ? all_space(ents[i].piece, ents[i].len)
                    : !memchr(ents[i].piece, ' ', (size_t)ents[i].len)))
            ents[t->n_user++] = ents[i];
    }
    if (t->n_user && !(t->user_ids = malloc((size_t)t->n_user * sizeof *t->user_ids))) {
        free(ents);
        return kvp_errorf(err, errlen, -ENOMEM, "out of memory for the tokenizer index");
    }
    for (int i = 0; i < t->n_user; i++) {
        unsigned char first = (unsigned char)ents[i].piece[0];
        t->user_ids[i] = ents[i].id;
        if (ents[i].len > t->user_max_len[first])
            t->user_max_len[first] = (unsigned char)(ents[i].len < 255 ? ents[i].len : 255);
    }
    free(ents);
    /* Byte-level BPE starts every chunk from one token per byte. Some vocabularies
     * leave out the bytes UTF-8 never uses (StarCoder's has no 0xC0, 0xC1, 0xF5..0xFF):
     * those stay -1 and the encoder drops them, as the reference tokenizers do; the
     * vocabulary must still cover ASCII. */
    for (int b = 0; t->bpe && b < 256; b++) {
        char c = (char)b;
        t->byte_token[b] = kvp_tokenizer_lookup_text(t, &c, 1);
        if (t->byte_token[b] < 0 && b >= 0x20 && b < 0x7F)
            return kvp_errorf(err, errlen, -EINVAL,
                              "byte-level vocabulary has no token for byte 0x%02X ('%c')", b,
                              b);
    }
    return 0;
}

static int alloc_vocab(kvp_tokenizer *t, int n, size_t blob_size, char *err, size_t errlen)
{
    t->vocab_size = n;
    t->pieces = calloc((size_t)n, sizeof *t->pieces);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->scores = calloc((size_t)n, sizeof *t->scores);
    char *blob = malloc(blob_size ? blob_size : 1);
    if (!t->pieces || !t->piece_len || !t->scores || !blob) {
        free(blob);
        return kvp_errorf(err, errlen, -ENOMEM, "out of memory for %d tokens", n);
    }
    t->pieces[0] = blob;
    return 0;
}

/* Parses a whole llama2.c tokenizer file held in buf. */
static int parse_bin(kvp_tokenizer *t, const unsigned char *buf, size_t size, int vocab_size,
                     const char *path, char *err, size_t errlen)
{
    int32_t max_len;
    if (size < 4)
        return kvp_errorf(err, errlen, -EINVAL, "%s: truncated: no max_token_length (%zu bytes)",
                    path, size);
    memcpy(&max_len, buf, 4);
    if (max_len <= 0)
        return kvp_errorf(err, errlen, -EINVAL, "%s: bad max_token_length %d", path, (int)max_len);
    /* Every record takes 8 + len file bytes and len + 1 blob bytes, so size bounds the blob. */
    int rc = alloc_vocab(t, vocab_size, size, err, errlen);
    if (rc < 0)
        return rc;
    char *dst = t->pieces[0];
    size_t off = 4;
    for (int i = 0; i < vocab_size; i++) {
        int32_t len;
        if (size - off < 8)
            return kvp_errorf(err, errlen, -EINVAL,
                        "%s: truncated at token %d of %d (offset %zu of %zu)",
                        path, i, vocab_size, off, size);
        memcpy(&t->scores[i], buf + off, 4);
        memcpy(&len, buf + off + 4, 4);
        off += 8;
        if (len < 0 || len > max_len)
            return kvp_errorf(err, errlen, -EINVAL,
                        "%s: token %d has length %d (max_token_length %d)",
                        path, i, (int)len, (int)max_len);
        if (size - off < (size_t)len)
            return kvp_errorf(err, errlen, -EINVAL,
                        "%s: truncated in token %d of %d (needs %d bytes at offset %zu of %zu)",
                        path, i, vocab_size, (int)len, off, size);
        memcpy(dst, buf + off, (size_t)len);
        dst[len] = 0;
        t->pieces[i] = dst;
        t->piece_len[i] = len;
        dst += len + 1;
        off += (size_t)len;
    }
    if (off != size)
        return kvp_errorf(err, errlen, -EINVAL,
                    "%s: %zu bytes left after %d tokens: the file holds another vocab_size",
                    path, size - off, vocab_size);
    return 0;
}

int kvp_tokenizer_load_file(kvp_tokenizer *t, const char *path, int vocab_size,
                            char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    /* unk, bos and eos are ids 0, 1, 2 in this format. */
    if (vocab_size < 3)
        return kvp_errorf(err, errlen, -EINVAL, "%s: vocab_size %d is too small", path, vocab_size);
    FILE *f = kvp_fopen_input(path);
    if (!f) {
        int e = errno;
        return kvp_errorf(err, errlen, -e, "cannot open %s: %s", path, kvp_fileio_strerror(-e));
    }
    struct stat st;
    int rc = 0;
    unsigned char *buf = NULL;
    if (fstat(fileno(f), &st) != 0) {
        int e = errno;
        rc = kvp_errorf(err, errlen, -e, "cannot stat %s: %s", path, strerror(e));
        goto out;
    }
    /* A tokenizer never exceeds 4 + vocab x (8 + INT_MAX) bytes; refuse to slurp a
     * mistaken multi-gigabyte path beyond that. */
    size_t size = (size_t)st.st_size;
    if ((uint64_t)st.st_size > 4 + (uint64_t)vocab_size * (8 + (uint64_t)INT_MAX)) {
        rc = kvp_errorf(err, errlen, -EINVAL, "%s: %zu bytes is too large for %d tokens",
                  path, size, vocab_size);
        goto out;
    }
    buf = malloc(size ? size : 1);
    if (!buf) {
        rc = kvp_errorf(err, errlen, -ENOMEM, "%s: out of memory for %zu bytes", path, size);
        goto out;
    }
    if (fread(buf, 1, size, f) != size) {
        rc = kvp_errorf(err, errlen, -EIO, "%s: read error", path);
        goto out;
    }
    rc = parse_bin(t, buf, size, vocab_size, path, err, errlen);
    if (rc == 0) {
        t->unk_id = 0;
        t->bos_id = 1;
        t->eos_id = 2;
        t->eot_id = -1;
        t->add_space_prefix = 1;
        rc = finish(t, NULL, NULL, err, errlen);
    }
out:
    free(buf);
    fclose(f);
    if (rc < 0)
        kvp_tokenizer_free(t);
    return rc;
}

/* A required-shape array kv: absent is fine (NULL) when optional. */
static int gguf_array(const kvp_gguf *g, const char *key, uint32_t elem_type, uint64_t n,
                      const kvp_gguf_kv **out, char *err, size_t errlen)
{
    const kvp_gguf_kv *kv = kvp_gguf_find(g, key);
    *out = kv;
    if (!kv)
        return 0;
    if (kv->type != KVP_GGUF_ARRAY || kv->val.arr.type != elem_type)
        return kvp_errorf(err, errlen, -EINVAL, "%s has the wrong type (want an array of type %u)",
                    key, (unsigned)elem_type);
    if (kv->val.arr.n != n)
        return kvp_errorf(err, errlen, -EINVAL, "%s has %llu entries, the vocabulary %llu",
                    key, (unsigned long long)kv->val.arr.n, (unsigned long long)n);
    return 0;
}

static int gguf_id(const kvp_gguf *g, const char *key, int def, int vocab, int *out,
                   char *err, size_t errlen)
{
    uint32_t v;
    int rc = kvp_gguf_get_u32(g, key, &v);
    if (rc == -ENOENT && def < 0) {
        *out = -1;
        return 0;
    }
    if (rc == -ENOENT)
        v = (uint32_t)def;
    else if (rc < 0)
        return kvp_errorf(err, errlen, rc, "%s is not a valid token id", key);
    if (v >= (uint32_t)vocab)
        return kvp_errorf(err, errlen, -EINVAL, "%s %u is outside the vocabulary of %d",
                    key, (unsigned)v, vocab);
    *out = (int)v;
    return 0;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Copies a piece, turning each U+2581 (SentencePiece's space marker) into ' '. */
static int copy_piece(char *dst, const char *src, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (i + 2 < len && (unsigned char)src[i] == 0xE2 && (unsigned char)src[i + 1] == 0x96 &&
            (unsigned char)src[i + 2] == 0x81) {
            dst[o++] = ' ';
            i += 2;
        } else {
            dst[o++] = src[i];
        }
    }
    dst[o] = 0;
    return (int)o;
}

static int load_gguf(kvp_tokenizer *t, const kvp_gguf *g, kvp_gguf_str **strs,
                     int32_t **types, unsigned char **raw, char *err, size_t errlen)
{
    const kvp_gguf_kv *kv = kvp_gguf_find(g, "tokenizer.ggml.model");
    if (!kv)
        return kvp_errorf(err, errlen, -ENOENT, "GGUF has no tokenizer.ggml.model");
    if (kv->type != KVP_GGUF_STRING)
        return kvp_errorf(err, errlen, -EINVAL, "tokenizer.ggml.model is not a string");
    int bpe = kv->val.str.len == 4 && memcmp(kv->val.str.ptr, "gpt2", 4) == 0;
    if (!bpe && (kv->val.str.len != 5 || memcmp(kv->val.str.ptr, "llama", 5) != 0))
        return kvp_errorf(err, errlen, -ENOTSUP,
                    "tokenizer.ggml.model \"%.*s\" is not supported (\"llama\": SentencePiece "
                    "BPE, or \"gpt2\": byte-level BPE)",
                    (int)(kv->val.str.len < 64 ? kv->val.str.len : 64), kv->val.str.ptr);
    const kvp_gguf_kv *merges = NULL;
    if (bpe) {
        t->bpe = calloc(1, sizeof *t->bpe);
        if (!t->bpe)
            return kvp_errorf(err, errlen, -ENOMEM, "out of memory for the tokenizer");
        t->bpe->pre = KVP_PRE_GPT2;
        kv = kvp_gguf_find(g, "tokenizer.ggml.pre");
        if (kv) {
            int pre = kv->type == KVP_GGUF_STRING
                    ? kvp_bpe_pre_from_name(kv->val.str.ptr, (size_t)kv->val.str.len) : -1;
            if (pre < 0 && kv->type != KVP_GGUF_STRING)
                return kvp_errorf(err, errlen, -EINVAL, "tokenizer.ggml.pre is not a string");
            if (pre < 0)
                return kvp_errorf(err, errlen, -ENOTSUP,
                                  "tokenizer.ggml.pre \"%.*s\" is not supported (known: %s)",
                                  (int)(kv->val.str.len < 64 ? kv->val.str.len : 64),
                                  kv->val.str.ptr, kvp_bpe_pre_names());
            t->bpe->pre = (enum kvp_bpe_pre)pre;
        }
        /* llama.cpp's Llama 3 and tekken vocabularies, like HF's ignore_merges, take a
         * chunk that is a whole token as that token. */
        t->bpe->ignore_merges = t->bpe->pre == KVP_PRE_LLAMA3 || t->bpe->pre == KVP_PRE_TEKKEN;
        /* Qwen's and Command-R's tokenizer.json normalize to NFC before splitting (GGUF
         * has no key for a normalizer; the pre-tokenizer name implies it). */
        t->bpe->nfc = t->bpe->pre == KVP_PRE_QWEN2 ||
                      (kv && kv->type == KVP_GGUF_STRING && kv->val.str.len == 9 &&
                       !memcmp(kv->val.str.ptr, "command-r", 9));
        merges = kvp_gguf_find(g, "tokenizer.ggml.merges");
        if (!merges)
            return kvp_errorf(err, errlen, -ENOENT, "GGUF has no tokenizer.ggml.merges");
    }

    kv = kvp_gguf_find(g, "tokenizer.ggml.tokens");
    if (!kv)
        return kvp_errorf(err, errlen, -ENOENT, "GGUF has no tokenizer.ggml.tokens");
    if (kv->type != KVP_GGUF_ARRAY || kv->val.arr.type != KVP_GGUF_STRING)
        return kvp_errorf(err, errlen, -EINVAL, "tokenizer.ggml.tokens is not a string array");
    uint64_t n = kv->val.arr.n;
    if (n < 3 || n > INT_MAX)
        return kvp_errorf(err, errlen, -EINVAL, "tokenizer.ggml.tokens has %llu entries",
                    (unsigned long long)n);
    *strs = malloc(n * sizeof **strs);
    if (!*strs)
        return kvp_errorf(err, errlen, -ENOMEM, "out of memory for %llu tokens", (unsigned long long)n);
    int rc = kvp_gguf_str_array(kv, *strs, n);
    if (rc < 0)
        return kvp_errorf(err, errlen, rc, "tokenizer.ggml.tokens: bad string array");
    /* Strings are bounded by the file, so the sum cannot overflow size_t. */
    size_t blob = 0;
    for (uint64_t i = 0; i < n; i++) {
        if ((*strs)[i].len > INT_MAX)
            return kvp_errorf(err, errlen, -EINVAL, "token %llu is %llu bytes long",
                        (unsigned long long)i, (unsigned long long)(*strs)[i].len);
        blob += (size_t)(*strs)[i].len + 1;
    }

    const kvp_gguf_kv *scores, *ttype;
    if ((rc = gguf_array(g, "tokenizer.ggml.scores", KVP_GGUF_FLOAT32, n, &scores, err,
                         errlen)) < 0 ||
        (rc = gguf_array(g, "tokenizer.ggml.token_type", KVP_GGUF_INT32, n, &ttype, err,
                         errlen)) < 0)
        return rc;
    if ((rc = alloc_vocab(t, (int)n, blob, err, errlen)) < 0)
        return rc;
    if (bpe && !(*raw = calloc(n, 1)))
        return kvp_errorf(err, errlen, -ENOMEM, "out of memory for %llu tokens", (unsigned long long)n);
    /* Array data is unaligned little-endian inside the mapping: decode, do not cast. */
    if (scores)
        for (uint64_t i = 0; i < n; i++) {
            uint32_t bits = le32(scores->val.arr.data + 4 * i);
            memcpy(&t->scores[i], &bits, 4);
        }
    if (ttype) {
        *types = malloc(n * sizeof **types);
        if (!*types)
            return kvp_errorf(err, errlen, -ENOMEM, "out of memory for token types");
        for (uint64_t i = 0; i < n; i++)
            (*types)[i] = (int32_t)le32(ttype->val.arr.data + 4 * i);
    }
    char *dst = t->pieces[0];
    for (uint64_t i = 0; i < n; i++) {
        const char *src = (*strs)[i].ptr;
        size_t len = (size_t)(*strs)[i].len;
        t->pieces[i] = dst;
        /* Byte-level text pieces are spelled in GPT-2's alphabet; special ones are
         * stored as they read. Neither spelling is ever longer than the bytes. */
        int special = *types && ((*types)[i] == TT_CONTROL || (*types)[i] == TT_USER_DEFINED);
        int n_bytes = bpe && !special ? kvp_bpe_unspell(src, len, dst) : -1;
        if (n_bytes >= 0) {
            dst[n_bytes] = 0;
            t->piece_len[i] = n_bytes;
        } else if (bpe) {
            (*raw)[i] = !special;
            memcpy(dst, src, len);
            dst[len] = 0;
            t->piece_len[i] = (int)len;
        } else {
            t->piece_len[i] = copy_piece(dst, src, len);
        }
        dst += t->piece_len[i] + 1;
    }

    /* SentencePiece numbers <unk> <s> </s> as 0 1 2; byte-level vocabularies have no
     * such convention. */
    if ((rc = gguf_id(g, "tokenizer.ggml.bos_token_id", bpe ? -1 : 1, (int)n, &t->bos_id, err,
                      errlen)) < 0 ||
        (rc = gguf_id(g, "tokenizer.ggml.eos_token_id", bpe ? -1 : 2, (int)n, &t->eos_id, err,
                      errlen)) < 0 ||
        (rc = gguf_id(g, "tokenizer.ggml.unknown_token_id", bpe ? -1 : 0, (int)n, &t->unk_id,
                      err, errlen)) < 0)
        return rc;
    t->eot_id = -1;
    if (kvp_gguf_find(g, "tokenizer.ggml.eot_token_id") &&
        (rc = gguf_id(g, "tokenizer.ggml.eot_token_id", 0, (int)n, &t->eot_id, err, errlen)) < 0)
        return rc;
    t->add_space_prefix = !bpe;
    kv = kvp_gguf_find(g, "tokenizer.ggml.add_space_prefix");
    if (kv) {
        if (kv->type != KVP_GGUF_BOOL)
            return kvp_errorf(err, errlen, -EINVAL, "tokenizer.ggml.add_space_prefix is not a bool");
        t->add_space_prefix = kv->val.u64 != 0;
    }
    if ((rc = finish(t, *types, *raw, err, errlen)) < 0)
        return rc;
    return bpe ? kvp_bpe_load_merges(t->bpe, t, merges, err, errlen) : 0;
}

int kvp_tokenizer_load_gguf(kvp_tokenizer *t, const kvp_gguf *g, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    kvp_gguf_str *strs = NULL;
    int32_t *types = NULL;
    unsigned char *raw = NULL;
    int rc = load_gguf(t, g, &strs, &types, &raw, err, errlen);
    free(strs);
    free(types);
    free(raw);
    if (rc < 0)
        kvp_tokenizer_free(t);
    return rc;
}

/* Encoding state: the symbols and candidates of the shared merge loop (model/merges.h),
 * ranked by piece score (higher first, then the leftmost pair, as llama2.c picks). */
typedef struct enc {
    const kvp_tokenizer *t;
    kvp_merges m;
    int n;
    char *buf; /* 2 x max_piece_len: a pair's concatenation */
} enc;

static void push_unit(enc *e, const char *s, size_t len)
{
    int id = kvp_tokenizer_lookup_text(e->t, s, len);
    if (id >= 0) {
        e->m.syms[e->n++].tok = id;
        return;
    }
    for (size_t i = 0; i < len; i++) {
        int b = e->t->byte_token[(unsigned char)s[i]];
        e->m.syms[e->n++].tok = b >= 0 ? b : e->t->unk_id;
    }
}

/* Queues the pair (left, left's next) if its concatenation is a piece. */
static void try_pair(void *ctx, int left)
{
    enc *e = ctx;
    if (left < 0 || e->m.syms[left].next < 0)
        return;
    int right = e->m.syms[left].next;
    const kvp_tokenizer *t = e->t;
    int a = e->m.syms[left].tok, b = e->m.syms[right].tok;
    memcpy(e->buf, t->pieces[a], (size_t)t->piece_len[a]);
    memcpy(e->buf + t->piece_len[a], t->pieces[b], (size_t)t->piece_len[b]);
    int id = kvp_tokenizer_lookup_text(t, e->buf, (size_t)t->piece_len[a] + (size_t)t->piece_len[b]);
    /* llama2.c starts its best score at -1e10 and only takes strictly better ones. */
    if (id >= 0 && t->scores[id] > -1e10f)
        kvp_merges_push(&e->m, (kvp_merge){ t->scores[id], left, right, a, b, id });
}

/* Byte-level BPE between the optional BOS and EOS. */
static int encode_bpe(const kvp_tokenizer *t, const char *text, size_t len, unsigned flags,
                      int *out, int max)
{
    int add_bos = (flags & KVP_ENCODE_BOS) && t->bos_id >= 0;
    int add_eos = (flags & KVP_ENCODE_EOS) && t->eos_id >= 0;
    if (max < add_bos + add_eos)
        return -ENOSPC;
    int n = kvp_bpe_encode(t, text, len, out + add_bos, max - add_bos - add_eos);
    if (n < 0)
        return n;
    if (add_bos)
        out[0] = t->bos_id;
    if (add_eos)
        out[add_bos + n] = t->eos_id;
    return add_bos + n + add_eos;
}

/* Merges the symbols e->n pushed so far and appends their tokens to out[*n..max). */
static void flush_units(enc *e, int *out, int max, int *n)
{
    if (e->n == 0)
        return;
    kvp_merges_run(&e->m, e->n, try_pair, e);
    for (int i = 0; i >= 0; i = e->m.syms[i].next) {
        if (*n < max)
            out[*n] = e->m.syms[i].tok;
        (*n)++;
    }
    e->n = 0;
}

int kvp_tokenizer_encode(const kvp_tokenizer *t, const char *text, size_t len,
                         unsigned flags, int *out, int max)
{
    if (t->bpe)
        return encode_bpe(t, text, len, flags, out, max);
    /* One symbol per byte plus the dummy prefix; counts must fit an int. */
    if (len > (size_t)INT_MAX / 4)
        return -E2BIG;
    size_t cap = len + 1;
    enc e = { .t = t };
    e.m.syms = malloc(cap * sizeof *e.m.syms);
    e.m.heap = malloc(3 * cap * sizeof *e.m.heap);
    e.buf = malloc(2 * (size_t)t->max_piece_len + 1);
    int rc = -ENOMEM;
    if (!e.m.syms || !e.m.heap || !e.buf)
        goto out;

    int add_bos = (flags & KVP_ENCODE_BOS) != 0, add_eos = (flags & KVP_ENCODE_EOS) != 0;
    int n = 0;
    if (add_bos) {
        if (n < max)
            out[n] = t->bos_id;
        n++;
    }
    if (t->add_space_prefix && !(flags & KVP_ENCODE_NO_PREFIX) && len > 0)
        push_unit(&e, " ", 1);
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t u;
        int user = t->n_user && t->user_max_len[s[i]] ? kvp_vocab_user_at(t, text + i, len - i, &u)
                                                      : -1;
        if (user >= 0) {
            /* A user-defined token stands alone: the text on each side merges apart. */
            flush_units(&e, out, max, &n);
            if (n < max)
                out[n] = user;
            n++;
            i += u;
            continue;
        }
        uint32_t cp;
        u = kvp_utf8_decode(s + i, len - i, &cp);
        /* U+2581 is the space marker itself: the references map a space to it and then
         * match pieces, so both are one symbol. */
        if (cp == 0x2581)
            push_unit(&e, " ", 1);
        else
            push_unit(&e, text + i, u);
        i += u;
    }
    flush_units(&e, out, max, &n);
    if (add_eos) {
        if (n < max)
            out[n] = t->eos_id;
        n++;
    }
    rc = n > max ? -ENOSPC : n;
out:
    free(e.m.syms);
    free(e.m.heap);
    free(e.buf);
    return rc;
}

const char *kvp_tokenizer_piece(const kvp_tokenizer *t, int prev, int tok, size_t *len)
{
    *len = 0;
    if (tok < 0 || tok >= t->vocab_size)
        return NULL;
    const char *p = t->pieces[tok];
    size_t n = (size_t)t->piece_len[tok];
    if (t->bpe) {
        *len = n;
        return p;
    }
    int b = byte_piece_value(p, (int)n);
    if (b >= 0 && t->byte_token[b] == tok) {
        *len = 1;
        return (const char *)&byte_chars[b];
    }
    /* SentencePiece drops the dummy-prefix space of the first word. */
    if (prev == t->bos_id && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    *len = n;
    return p;
}
