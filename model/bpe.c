#include "model/bpe.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "model/merges.h"
#include "model/unicode.h"

/* ---- GPT-2's byte-to-unicode alphabet ----
 * Printable bytes (! .. ~, ¡ .. ¬, ® .. ÿ) stand for themselves; the 68 others (controls,
 * space, DEL, NBSP, soft hyphen) are U+0100 onwards in byte order. */
static int printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

static uint32_t byte_to_cp(unsigned b)
{
    if (printable(b))
        return b;
    uint32_t k = 0;
    for (unsigned x = 0; x < b; x++)
        k += !printable(x);
    return 256 + k;
}

/* The byte a spelling code point stands for, or -1. */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68)
        return -1;
    uint32_t k = cp - 256;
    for (unsigned b = 0; b < 256; b++)
        if (!printable(b) && k-- == 0)
            return (int)b;
    return -1;
}

int kvp_bpe_unspell(const char *piece, size_t len, char *dst)
{
    const unsigned char *s = (const unsigned char *)piece;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t u = kvp_utf8_decode(s + i, len - i, &cp);
        int b = u > 1 || s[i] < 0x80 ? cp_to_byte(cp) : -1;
        if (b < 0)
            return -1;
        dst[o++] = (char)b;
        i += u;
    }
    return (int)o;
}

size_t kvp_bpe_spell(const char *bytes, size_t len, char *dst)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++)
        o += kvp_utf8_encode(byte_to_cp((unsigned char)bytes[i]), dst + o);
    return o;
}

/* ---- merge table ---- */

static uint64_t pair_key(int left, int right)
{
    return ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
}

static uint64_t slot_of(uint64_t key, uint64_t mask)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return key & mask;
}

/* Rank and result of merging (left, right); 0 when no merge exists. */
static int find_merge(const kvp_bpe *b, int left, int right, int *rank, int *result)
{
    uint64_t key = pair_key(left, right);
    for (uint64_t s = slot_of(key, b->mask);; s = (s + 1) & b->mask) {
        if (b->keys[s] == 0)
            return 0;
        if (b->keys[s] == key) {
            *rank = b->rank[s];
            *result = b->result[s];
            return 1;
        }
    }
}

void kvp_bpe_free(kvp_bpe *b)
{
    free(b->keys);
    free(b->rank);
    free(b->result);
    memset(b, 0, sizeof *b);
}

int kvp_bpe_load_merges(kvp_bpe *b, const kvp_tokenizer *t, const kvp_gguf_kv *kv,
                        char *err, size_t errlen)
{
    if (kv->type != KVP_GGUF_ARRAY || kv->val.arr.type != KVP_GGUF_STRING)
        return kvp_errorf(err, errlen, -EINVAL, "tokenizer.ggml.merges is not a string array");
    uint64_t n = kv->val.arr.n;
    /* Ranks are merge priorities as floats (model/merges.h): exact below 2^24. */
    if (n > (1u << 24))
        return kvp_errorf(err, errlen, -EINVAL, "tokenizer.ggml.merges has %llu entries",
                          (unsigned long long)n);
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    kvp_gguf_str *strs = malloc((n ? n : 1) * sizeof *strs);
    char *buf = malloc((size_t)t->max_piece_len * 2 + 2);
    b->keys = calloc(cap, sizeof *b->keys);
    b->rank = malloc(cap * sizeof *b->rank);
    b->result = malloc(cap * sizeof *b->result);
    b->mask = cap - 1;
    int rc = 0;
    if (!strs || !buf || !b->keys || !b->rank || !b->result) {
        rc = kvp_errorf(err, errlen, -ENOMEM, "out of memory for %llu merges",
                        (unsigned long long)n);
        goto out;
    }
    if ((rc = kvp_gguf_str_array(kv, strs, n)) < 0) {
        rc = kvp_errorf(err, errlen, rc, "tokenizer.ggml.merges: bad string array");
        goto out;
    }
    for (uint64_t r = 0; r < n; r++) {
        const char *s = strs[r].ptr;
        size_t len = strs[r].len;
        const char *sp = memchr(s, ' ', len);
        /* A merge joins two pieces no longer than the longest token. */
        if (!sp || len > (size_t)t->max_piece_len * 2 + 1) {
            rc = kvp_errorf(err, errlen, -EINVAL,
                            "tokenizer.ggml.merges[%llu] is not two pieces \"A B\"",
                            (unsigned long long)r);
            goto out;
        }
        size_t la = (size_t)(sp - s);
        int na = kvp_bpe_unspell(s, la, buf);
        int nb = na < 0 ? -1 : kvp_bpe_unspell(sp + 1, len - la - 1, buf + na);
        int left = na <= 0 ? -1 : kvp_tokenizer_lookup_text(t, buf, (size_t)na);
        int right = nb <= 0 ? -1 : kvp_tokenizer_lookup_text(t, buf + na, (size_t)nb);
        int result = left < 0 || right < 0 ? -1
                   : kvp_tokenizer_lookup_text(t, buf, (size_t)na + (size_t)nb);
        /* Converters keep merges whose pieces the vocabulary lacks; they can never
         * apply, so they are skipped, as HF tokenizers skips them. */
        if (result < 0)
            continue;
        uint64_t key = pair_key(left, right), slot = slot_of(key, b->mask);
        while (b->keys[slot] && b->keys[slot] != key)
            slot = (slot + 1) & b->mask;
        if (b->keys[slot])
            continue; /* a duplicate: the first (lowest) rank wins */
        b->keys[slot] = key;
        b->rank[slot] = (int32_t)r;
        b->result[slot] = result;
        b->n_merges++;
    }
out:
    free(strs);
    free(buf);
    return rc;
}

/* ---- merging one chunk ---- */
typedef struct enc {
    const kvp_tokenizer *t;
    const kvp_bpe *b;
    kvp_merges m;
    int *out, max, n;   /* n counts past max, to report -ENOSPC */
} enc;

static void emit(enc *e, int tok)
{
    if (e->n < e->max)
        e->out[e->n] = tok;
    e->n++;
}

static void try_pair(void *ctx, int left)
{
    enc *e = ctx;
    kvp_sym *syms = e->m.syms;
    if (left < 0 || syms[left].next < 0)
        return;
    int right = syms[left].next, rank, id;
    int a = syms[left].tok, b = syms[right].tok;
    if (find_merge(e->b, a, b, &rank, &id))
        kvp_merges_push(&e->m, (kvp_merge){ -(float)rank, left, right, a, b, id });
}

/* BPE over the bytes of one pre-tokenizer chunk. */
static void encode_chunk(enc *e, const char *s, int len)
{
    if (len <= 0)
        return;
    if (len > 1 && e->b->ignore_merges) {
        int id = kvp_tokenizer_lookup_text(e->t, s, (size_t)len);
        if (id >= 0) {
            emit(e, id);
            return;
        }
    }
    /* A byte the vocabulary has no token for is left out (as Hugging Face's BPE without
     * an unknown token, and llama.cpp, leave it out); its neighbours become adjacent. */
    int n = 0;
    for (int i = 0; i < len; i++) {
        int tok = e->t->byte_token[(unsigned char)s[i]];
        if (tok >= 0)
            e->m.syms[n++].tok = tok;
    }
    if (n == 0)
        return;
    kvp_merges_run(&e->m, n, try_pair, e);
    for (int i = 0; i >= 0; i = e->m.syms[i].next)
        emit(e, e->m.syms[i].tok);
}

static int encode_text(const kvp_tokenizer *t, const char *text, size_t len, int *out, int max);

int kvp_bpe_encode(const kvp_tokenizer *t, const char *text, size_t len, int *out, int max)
{
    if (!t->bpe->nfc)
        return encode_text(t, text, len, out, max);
    /* ASCII is already NFC. */
    size_t i = 0;
    while (i < len && (unsigned char)text[i] < 0x80)
        i++;
    if (i == len)
        return encode_text(t, text, len, out, max);
    char *norm;
    size_t norm_len;
    int rc = kvp_nfc(text, len, &norm, &norm_len);
    if (rc < 0)
        return rc;
    rc = encode_text(t, norm, norm_len, out, max);
    free(norm);
    return rc;
}

/* Pre-tokenizer chunks, each merged on its own. */
static int encode_text(const kvp_tokenizer *t, const char *text, size_t len, int *out, int max)
{
    int *ends = malloc((len + 1) * sizeof *ends);
    enc e = { .t = t, .b = t->bpe, .out = out, .max = max };
    e.m.syms = malloc((len + 1) * sizeof *e.m.syms);
    e.m.heap = malloc(3 * (len + 1) * sizeof *e.m.heap);
    int rc = -ENOMEM;
    if (!ends || !e.m.syms || !e.m.heap)
        goto out;
    /* User-defined whitespace runs are taken first, longest at the leftmost place (as
     * Hugging Face's added tokens); the text between them is split and merged apart. */
    size_t seg = 0;
    do {
        size_t end = seg, u = 0;
        int user = -1;
        for (; end < len; end++)
            if (t->n_user && t->user_max_len[(unsigned char)text[end]] &&
                (user = kvp_vocab_user_at(t, text + end, len - end, &u)) >= 0)
                break;
        int n = kvp_bpe_split(t->bpe->pre, text + seg, end - seg, ends);
        if ((rc = n) < 0)
            goto out;
        for (int k = 0, start = 0; k < n; start = ends[k++])
            encode_chunk(&e, text + seg + start, ends[k] - start);
        if (user >= 0) {
            if (e.n < max)
                out[e.n] = user;
            e.n++;
        }
        seg = end + u;
    } while (seg < len);
    rc = e.n > max ? -ENOSPC : e.n;
out:
    free(ends);
    free(e.m.syms);
    free(e.m.heap);
    return rc;
}
