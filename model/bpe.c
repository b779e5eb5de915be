#include "model/bpe.h"

#include <errno.h>
#include <limits.h>
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

/* tokenizer.ggml.pre names as llama.cpp's loader maps them. */
static const struct { const char *name; enum kvp_bpe_pre pre; } pre_names[] = {
    {"gpt2", KVP_PRE_GPT2},             {"gpt-2", KVP_PRE_GPT2},
    {"mpt", KVP_PRE_GPT2},              {"olmo", KVP_PRE_GPT2},
    {"smollm", KVP_PRE_SMOLLM},         {"starcoder", KVP_PRE_SMOLLM},
    {"refact", KVP_PRE_SMOLLM},         {"command-r", KVP_PRE_SMOLLM},
    {"llama-bpe", KVP_PRE_LLAMA3},      {"llama3", KVP_PRE_LLAMA3},
    {"llama-v3", KVP_PRE_LLAMA3},
    {"qwen2", KVP_PRE_QWEN2},           {"deepseek-r1-qwen", KVP_PRE_QWEN2},
    {"falcon", KVP_PRE_FALCON},
    {"deepseek-llm", KVP_PRE_DEEPSEEK_LLM},
    {"deepseek-coder", KVP_PRE_DEEPSEEK_CODER},
    {"deepseek-v3", KVP_PRE_DEEPSEEK3},
    {"gpt-4o", KVP_PRE_GPT4O},          {"llama4", KVP_PRE_GPT4O},
    {"tekken", KVP_PRE_TEKKEN},
    {"chatglm-bpe", KVP_PRE_CHATGLM4},  {"glm4", KVP_PRE_CHATGLM4},
};

int kvp_bpe_pre_from_name(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
        if (strlen(pre_names[i].name) == len && !memcmp(pre_names[i].name, name, len))
            return (int)pre_names[i].pre;
    return -1;
}

const char *kvp_bpe_pre_names(void)
{
    return "gpt2, gpt-2, mpt, olmo, smollm, starcoder, refact, command-r, llama-bpe, llama3, "
           "llama-v3, qwen2, deepseek-r1-qwen, falcon, deepseek-llm, deepseek-coder, "
           "deepseek-v3, gpt-4o, llama4, tekken, chatglm-bpe, glm4";
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

/* ---- pre-tokenizers ----
 * The text as code points: cls[i] its class, cp[i] its value (0xFFFD for an invalid
 * byte, which keeps its byte through off[]), off[i] its first byte (off[n] = len). */
typedef struct cps {
    const uint32_t *cp;
    const unsigned char *cls;
    const unsigned char *gc;   /* general category (enum kvp_ugc) */
    int n;
} cps;

static int is_cls(const cps *c, int i, int end, int cls)
{
    return i < end && c->cls[i] == cls;
}

static int is_rn(const cps *c, int i, int end)
{
    return i < end && (c->cp[i] == '\r' || c->cp[i] == '\n');
}

static int run(const cps *c, int i, int end, int cls)
{
    int j = i;
    while (j < end && c->cls[j] == cls)
        j++;
    return j - i;
}

static int lower(uint32_t cp)
{
    return cp >= 'A' && cp <= 'Z' ? (int)(cp + 32) : (int)cp;
}

/* 's|'t|'re|'ve|'m|'ll|'d, ASCII case-insensitive when fold is set. */
static int contraction(const cps *c, int i, int end, int fold)
{
    if (c->cp[i] != '\'' || i + 1 >= end)
        return 0;
    int a = fold ? lower(c->cp[i + 1]) : (int)c->cp[i + 1];
    int b = i + 2 < end ? (fold ? lower(c->cp[i + 2]) : (int)c->cp[i + 2]) : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at i (which holds white space): the whole run when it ends the text or
 * is one character, else all but its last character (that one goes with the next word). */
static int spaces(const cps *c, int i, int end)
{
    int k = run(c, i, end, KVP_UCLS_SPACE);
    return i + k == end || k == 1 ? k : k - 1;
}

/* ' ?' then a run of class cls (at least one). */
static int space_then(const cps *c, int i, int end, int cls)
{
    int j = i + (c->cp[i] == ' ');
    int k = run(c, j, end, cls);
    return k ? j - i + k : 0;
}

/* GPT-2: one match at i < end. */
static int match_gpt2(const cps *c, int i, int end)
{
    int k;
    if ((k = contraction(c, i, end, 0)) || (k = space_then(c, i, end, KVP_UCLS_LETTER)) ||
        (k = space_then(c, i, end, KVP_UCLS_NUMBER)) ||
        (k = space_then(c, i, end, KVP_UCLS_OTHER)))
        return k;
    return spaces(c, i, end);
}

/* Llama 3 / Qwen 2: one match at i < end; max_digits 3 or 1. */
static int match_llama3(const cps *c, int i, int end, int max_digits)
{
    int k;
    if ((k = contraction(c, i, end, 1)))
        return k;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c->cls[i] == KVP_UCLS_LETTER)
        return run(c, i, end, KVP_UCLS_LETTER);
    if (!is_rn(c, i, end) && c->cls[i] != KVP_UCLS_NUMBER && is_cls(c, i + 1, end, KVP_UCLS_LETTER))
        return 1 + run(c, i + 1, end, KVP_UCLS_LETTER);
    /* \p{N}{1,max} */
    if (c->cls[i] == KVP_UCLS_NUMBER) {
        k = run(c, i, end, KVP_UCLS_NUMBER);
        return k < max_digits ? k : max_digits;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    if ((k = space_then(c, i, end, KVP_UCLS_OTHER))) {
        while (is_rn(c, i + k, end))
            k++;
        return k;
    }
    /* \s*[\r\n]+: up to the last line break of the white space run */
    int n = run(c, i, end, KVP_UCLS_SPACE), last = -1;
    for (int j = i; j < i + n; j++)
        if (is_rn(c, j, end))
            last = j;
    if (last >= 0)
        return last + 1 - i;
    return spaces(c, i, end);
}

/* ---- the matchers of the other pre-tokenizers ----
 * Each returns the length of its regex's match at i (0: none) within [i, end); *skip is
 * how many positions a failed match lets the scan step over (1 unless told). */
typedef int (*matcher)(const cps *c, int i, int end, int *skip);

static int in_ranges(uint32_t cp, const uint32_t (*r)[2], size_t n)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp > r[mid][1])
            lo = mid + 1;
        else if (cp < r[mid][0])
            hi = mid;
        else
            return 1;
    }
    return 0;
}

/* DeepSeek LLM's letter class, as its regex lists it (the cased letters of these blocks). */
static const uint32_t ds_letters[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
    {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
    {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
    {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
    {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
    {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
/* [!-/:-~！-／：-～‘-‟　-。] */
static const uint32_t ds_punct[][2] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F},
    {0xFF1A, 0xFF5E},
};
/* [一-龥ࠀ-一가-퟿] (the second range, U+0800..U+4E00, is as the regex writes it) */
static const uint32_t ds_cjk[][2] = { {0x800, 0x4E00}, {0x4E00, 0x9FA5}, {0xAC00, 0xD7FF} };
/* [一-龥぀-ゟ゠-ヿ] */
static const uint32_t ds3_cjk[][2] = { {0x3040, 0x309F}, {0x30A0, 0x30FF}, {0x4E00, 0x9FA5} };

static int is_space(const cps *c, int i, int end)
{
    return is_cls(c, i, end, KVP_UCLS_SPACE);
}

/* [\r\n] */
static int m_newline(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return is_rn(c, i, end);
}

/* Runs of code points in a range table: [...]+, or \s?[...]+ when space is set. */
static int run_in(const cps *c, int i, int end, const uint32_t (*r)[2], size_t nr)
{
    int j = i;
    while (j < end && in_ranges(c->cp[j], r, nr))
        j++;
    return j - i;
}

static int space_run_in(const cps *c, int i, int end, const uint32_t (*r)[2], size_t nr)
{
    int k;
    if (is_space(c, i, end) && (k = run_in(c, i + 1, end, r, nr)))
        return 1 + k;
    return run_in(c, i, end, r, nr);
}

static int m_ds_letters(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return space_run_in(c, i, end, ds_letters, sizeof ds_letters / sizeof ds_letters[0]);
}

static int m_ds_punct(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return space_run_in(c, i, end, ds_punct, sizeof ds_punct / sizeof ds_punct[0]);
}

static int m_ds_cjk(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return run_in(c, i, end, ds_cjk, sizeof ds_cjk / sizeof ds_cjk[0]);
}

static int m_ds3_cjk(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return run_in(c, i, end, ds3_cjk, sizeof ds3_cjk / sizeof ds3_cjk[0]);
}

/* \s+$: white space that ends the chunk; a run that does not cannot match anywhere. */
static int m_trailing_space(const cps *c, int i, int end, int *skip)
{
    int k = run(c, i, end, KVP_UCLS_SPACE);
    if (k && i + k == end)
        return k;
    *skip = k ? k : 1;
    return 0;
}

/* \p{N}+, \p{N}{1,3} and \p{N} */
static int m_digits(const cps *c, int i, int end, int max)
{
    int k = run(c, i, end, KVP_UCLS_NUMBER);
    return k < max ? k : max;
}

static int m_num_run(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return m_digits(c, i, end, INT_MAX);
}

static int m_num3(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return m_digits(c, i, end, 3);
}

static int m_num1(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return m_digits(c, i, end, 1);
}

/* \s?\p{L}+ and \s?\p{P}+ */
static int space_gc_run(const cps *c, int i, int end, int (*in)(const cps *, int))
{
    int j = i, k;
    if (is_space(c, i, end)) {
        for (k = i + 1; k < end && in(c, k); k++)
            ;
        if (k > i + 1)
            return k - i;
    }
    while (j < end && in(c, j))
        j++;
    return j - i;
}

static int gc_letter(const cps *c, int i)
{
    return c->cls[i] == KVP_UCLS_LETTER;
}

static int gc_punct(const cps *c, int i)
{
    return c->gc[i] == KVP_UGC_PUNCT;
}

static int m_space_letters(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return space_gc_run(c, i, end, gc_letter);
}

static int m_space_punct(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return space_gc_run(c, i, end, gc_punct);
}

/* Falcon: [\p{P}\$\+<=>\^~\|`]+ */
static int m_falcon_punct(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    int j = i;
    while (j < end && (c->gc[j] == KVP_UGC_PUNCT ||
                       (c->cp[j] < 0x80 && strchr("$+<=>^~|`", (int)c->cp[j]) && c->cp[j])))
        j++;
    return j - i;
}

/* Falcon: [0-9][0-9][0-9] */
static int m_ascii_digits3(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    for (int k = 0; k < 3; k++)
        if (i + k >= end || c->cp[i + k] < '0' || c->cp[i + k] > '9')
            return 0;
    return 3;
}

static int m_gpt2(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return match_gpt2(c, i, end);
}

static int m_llama3(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return match_llama3(c, i, end, 3);
}

static int m_qwen2(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return match_llama3(c, i, end, 1);
}

/* \s*[\r\n]+ at i (white space): up to the last line break of the run, 0 if none. */
static int space_to_newline(const cps *c, int i, int end)
{
    int n = run(c, i, end, KVP_UCLS_SPACE), last = -1;
    for (int j = i; j < i + n; j++)
        if (is_rn(c, j, end))
            last = j;
    return last >= 0 ? last + 1 - i : 0;
}

static int is_punct_or_symbol(const cps *c, int i, int end)
{
    return i < end && (c->gc[i] == KVP_UGC_PUNCT || c->gc[i] == KVP_UGC_SYMBOL);
}

static int is_letter_or_mark(const cps *c, int i, int end)
{
    return i < end && (c->cls[i] == KVP_UCLS_LETTER || c->gc[i] == KVP_UGC_MARK);
}

/* DeepSeek V3's third regex (see KVP_PRE_DEEPSEEK3). */
static int m_deepseek3(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    uint32_t cp = c->cp[i];
    int k;
    /* [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ */
    if (((cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
         (cp >= 0x7B && cp <= 0x7E))) {
        for (k = i + 1; k < end && c->cp[k] < 0x80 && c->cls[k] == KVP_UCLS_LETTER; k++)
            ;
        if (k > i + 1)
            return k - i;
    }
    /* [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ */
    if (!is_rn(c, i, end) && c->cls[i] != KVP_UCLS_LETTER && !is_punct_or_symbol(c, i, end) &&
        is_letter_or_mark(c, i + 1, end)) {
        for (k = i + 1; is_letter_or_mark(c, k, end); k++)
            ;
        return k - i;
    }
    if (is_letter_or_mark(c, i, end)) {
        for (k = i; is_letter_or_mark(c, k, end); k++)
            ;
        return k - i;
    }
    /*  ?[\p{P}\p{S}]+[\r\n]* */
    int j = i + (cp == ' ' && is_punct_or_symbol(c, i + 1, end));
    if (is_punct_or_symbol(c, j, end)) {
        while (is_punct_or_symbol(c, j, end))
            j++;
        while (is_rn(c, j, end))
            j++;
        return j - i;
    }
    if (c->cls[i] != KVP_UCLS_SPACE)
        return 0;
    /* \s*[\r\n]+|\s+(?!\S)|\s+ */
    if ((k = space_to_newline(c, i, end)))
        return k;
    return spaces(c, i, end);
}

/* GPT-4o's classes: U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], L = [\p{Ll}\p{Lm}\p{Lo}\p{M}]. */
static int is_upperish(const cps *c, int i, int end)
{
    return i < end && (c->gc[i] == KVP_UGC_LU || c->gc[i] == KVP_UGC_LT ||
                       c->gc[i] == KVP_UGC_LM || c->gc[i] == KVP_UGC_LO || c->gc[i] == KVP_UGC_MARK);
}

static int is_lowerish(const cps *c, int i, int end)
{
    return i < end && (c->gc[i] == KVP_UGC_LL || c->gc[i] == KVP_UGC_LM ||
                       c->gc[i] == KVP_UGC_LO || c->gc[i] == KVP_UGC_MARK);
}

static int lower_run(const cps *c, int i, int end)
{
    int j = i;
    while (is_lowerish(c, j, end))
        j++;
    return j;
}

/* U*L+ from j, with the regex engine's backtracking: U* takes its longest run, then
 * gives back until L+ can start. Returns the end, or -1. */
static int word_lower(const cps *c, int j, int end)
{
    int q = j;
    while (is_upperish(c, q, end))
        q++;
    if (is_lowerish(c, q, end))
        return lower_run(c, q, end);
    for (int m = q - 1; m >= j; m--)
        if (is_lowerish(c, m, end))
            return m + 1;
    return -1;
}

/* U+L* from j; -1 when no U. */
static int word_upper(const cps *c, int j, int end)
{
    int q = j;
    while (is_upperish(c, q, end))
        q++;
    return q > j ? lower_run(c, q, end) : -1;
}

/* [^\r\n\p{L}\p{N}] */
static int is_word_prefix(const cps *c, int i, int end)
{
    return i < end && !is_rn(c, i, end) && c->cls[i] != KVP_UCLS_LETTER &&
           c->cls[i] != KVP_UCLS_NUMBER;
}

static int match_gpt4o(const cps *c, int i, int end, int contractions, int max_digits)
{
    int e = -1, k;
    int (*const word[2])(const cps *, int, int) = { word_lower, word_upper };
    for (int w = 0; w < 2 && e < 0; w++) {
        if (is_word_prefix(c, i, end))
            e = word[w](c, i + 1, end);
        if (e < 0)
            e = word[w](c, i, end);
    }
    if (e >= 0) {
        if (contractions && e < end)
            e += contraction(c, e, end, 1);
        return e - i;
    }
    if (c->cls[i] == KVP_UCLS_NUMBER)
        return m_digits(c, i, end, max_digits);
    /*  ?[^\s\p{L}\p{N}]+[\r\n/]* */
    if ((k = space_then(c, i, end, KVP_UCLS_OTHER))) {
        while (i + k < end && (is_rn(c, i + k, end) || c->cp[i + k] == '/'))
            k++;
        return k;
    }
    if ((k = space_to_newline(c, i, end)))
        return k;
    return spaces(c, i, end);
}

static int m_gpt4o(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return match_gpt4o(c, i, end, 1, 3);
}

static int m_tekken(const cps *c, int i, int end, int *skip)
{
    (void)skip;
    return match_gpt4o(c, i, end, 0, 1);
}

/* Each pre-tokenizer's regexes in the order they split. */
static const struct { enum kvp_bpe_pre pre; matcher m[6]; } passes[] = {
    {KVP_PRE_GPT2, {m_gpt2}},
    {KVP_PRE_SMOLLM, {m_num1, m_gpt2}},
    {KVP_PRE_LLAMA3, {m_llama3}},
    {KVP_PRE_QWEN2, {m_qwen2}},
    {KVP_PRE_FALCON, {m_falcon_punct, m_gpt2, m_ascii_digits3}},
    {KVP_PRE_DEEPSEEK_LLM, {m_newline, m_ds_letters, m_ds_punct, m_trailing_space, m_ds_cjk,
                            m_num_run}},
    {KVP_PRE_DEEPSEEK_CODER, {m_newline, m_space_letters, m_space_punct, m_ds_cjk, m_num1}},
    {KVP_PRE_DEEPSEEK3, {m_num3, m_ds3_cjk, m_deepseek3}},
    {KVP_PRE_GPT4O, {m_gpt4o}},
    {KVP_PRE_TEKKEN, {m_tekken}},
    {KVP_PRE_CHATGLM4, {m_llama3}},
};

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

/* Splits every chunk of ends[0..n) (code point indices where each ends) at the matches
 * of m into out: matches and the text between them become chunks. Returns the count. */
static int split_pass(const cps *c, matcher m, const int *ends, int n, int *out)
{
    int n_out = 0;
    for (int k = 0, start = 0; k < n; start = ends[k++]) {
        int end = ends[k], gap = start;
        for (int i = start; i < end;) {
            int skip = 1, len = m(c, i, end, &skip);
            if (len <= 0) {
                i += skip;
                continue;
            }
            if (gap < i)
                out[n_out++] = i;
            i += len;
            out[n_out++] = gap = i;
        }
        if (gap < end)
            out[n_out++] = end;
    }
    return n_out;
}

int kvp_bpe_split(enum kvp_bpe_pre pre, const char *text, size_t len, int *ends)
{
    if (len > (size_t)INT_MAX / 4)
        return -E2BIG;
    int n = 0, n_chunks = 0;
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    unsigned char *cls = malloc(len + 1), *gc = malloc(len + 1);
    int *off = malloc((len + 1) * sizeof *off), *tmp = malloc((len + 1) * sizeof *tmp);
    if (!cp || !cls || !gc || !off || !tmp) {
        n_chunks = -ENOMEM;
        goto out;
    }
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len; n++) {
        off[n] = (int)i;
        i += kvp_utf8_decode(s + i, len - i, &cp[n]);
        cls[n] = (unsigned char)kvp_unicode_class(cp[n]);
        gc[n] = (unsigned char)kvp_unicode_gc(cp[n]);
    }
    off[n] = (int)len;
    if (n == 0)
        goto out;
    cps c = { cp, cls, gc, n };
    size_t p = 0;
    while (p + 1 < sizeof passes / sizeof passes[0] && passes[p].pre != pre)
        p++;
    /* The passes alternate between tmp and ends; chunks are code point indices until the
     * end, when they become byte offsets. */
    int *cur = tmp, *next = ends;
    cur[0] = n;
    n_chunks = 1;
    for (int k = 0; k < 6 && passes[p].m[k]; k++) {
        n_chunks = split_pass(&c, passes[p].m[k], cur, n_chunks, next);
        int *t = cur;
        cur = next;
        next = t;
    }
    for (int k = 0; k < n_chunks; k++)
        ends[k] = off[cur[k]];
out:
    free(cp);
    free(cls);
    free(gc);
    free(off);
    free(tmp);
    return n_chunks;
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
    int n = kvp_bpe_split(t->bpe->pre, text, len, ends);
    if ((rc = n) < 0)
        goto out;
    for (int i = 0, start = 0; i < n; start = ends[i++])
        encode_chunk(&e, text + start, ends[i] - start);
    rc = e.n > max ? -ENOSPC : e.n;
out:
    free(ends);
    free(e.m.syms);
    free(e.m.heap);
    return rc;
}
