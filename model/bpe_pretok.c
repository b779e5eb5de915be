/* The pre-tokenizers of byte-level BPE: each tokenizer.ggml.pre kind is one row of
 * pretoks[], naming the tokenizer.ggml.pre values llama.cpp's loader maps to it and its
 * steps, llama.cpp's list of split regexes for it (llama-vocab.cpp). A step is one regex
 * written out by hand over the classes of model/unicode.h: a matcher kind and its
 * parameters. kvp_bpe_split applies the steps as Hugging Face's Split(Isolated)
 * sequence: every step splits every chunk of the one before into its matches and the
 * text between them. */
#include "model/bpe.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/unicode.h"

/* ---- matchers ----
 * Each returns the length of its regex's match at i (0 or less: none) within [i, end). */

/* The text as code points: cls[i] its class, cp[i] its value (0xFFFD for an invalid
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

/* \s*[\r\n]+ at i (white space): up to the last line break of the run, 0 if none. */
static int space_to_newline(const cps *c, int i, int end)
{
    int n = run(c, i, end, KVP_UCLS_SPACE), last = -1;
    for (int j = i; j < i + n; j++)
        if (is_rn(c, j, end))
            last = j;
    return last >= 0 ? last + 1 - i : 0;
}

/* \s*[\r\n]+|\s+(?!\S)|\s+, the white space alternatives that end most regexes. */
static int space_tail(const cps *c, int i, int end)
{
    int k = space_to_newline(c, i, end);
    return k ? k : spaces(c, i, end);
}

/* \p{N}{1,max} (max INT_MAX: \p{N}+) */
static int digits(const cps *c, int i, int end, int max)
{
    int k = run(c, i, end, KVP_UCLS_NUMBER);
    return k < max ? k : max;
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

/* Llama 3 / Qwen 2 / GLM-4: one match at i < end; max_digits 3 or 1. */
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
    if (c->cls[i] == KVP_UCLS_NUMBER)
        return digits(c, i, end, max_digits);
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    if ((k = space_then(c, i, end, KVP_UCLS_OTHER))) {
        while (is_rn(c, i + k, end))
            k++;
        return k;
    }
    return space_tail(c, i, end);
}

/* ---- the class and range steps ---- */

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

/* [...]+ over a range table, and \s?[...]+. */
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

/* \s+$: white space that ends the chunk; a run that does not cannot match anywhere, so
 * *skip steps over all of it. */
static int trailing_space(const cps *c, int i, int end, int *skip)
{
    int k = run(c, i, end, KVP_UCLS_SPACE);
    if (k && i + k == end)
        return k;
    *skip = k ? k : 1;
    return 0;
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

/* Falcon: [\p{P}\$\+<=>\^~\|`]+ */
static int falcon_punct(const cps *c, int i, int end)
{
    int j = i;
    while (j < end && (c->gc[j] == KVP_UGC_PUNCT ||
                       (c->cp[j] < 0x80 && strchr("$+<=>^~|`", (int)c->cp[j]) && c->cp[j])))
        j++;
    return j - i;
}

/* Falcon: [0-9][0-9][0-9] */
static int ascii_digits3(const cps *c, int i, int end)
{
    for (int k = 0; k < 3; k++)
        if (i + k >= end || c->cp[i + k] < '0' || c->cp[i + k] > '9')
            return 0;
    return 3;
}

/* ---- DeepSeek V3 and GPT-4o ---- */

static int is_punct_or_symbol(const cps *c, int i, int end)
{
    return i < end && (c->gc[i] == KVP_UGC_PUNCT || c->gc[i] == KVP_UGC_SYMBOL);
}

static int is_letter_or_mark(const cps *c, int i, int end)
{
    return i < end && (c->cls[i] == KVP_UCLS_LETTER || c->gc[i] == KVP_UGC_MARK);
}

/* DeepSeek V3's third regex (see KVP_PRE_DEEPSEEK3). */
static int match_deepseek3(const cps *c, int i, int end)
{
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
    return space_tail(c, i, end);
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

/* GPT-4o / tekken: one match at i < end; contractions: the (?i:'s|...) suffixes. */
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
        return digits(c, i, end, max_digits);
    /*  ?[^\s\p{L}\p{N}]+[\r\n/]* */
    if ((k = space_then(c, i, end, KVP_UCLS_OTHER))) {
        while (i + k < end && (is_rn(c, i + k, end) || c->cp[i + k] == '/'))
            k++;
        return k;
    }
    return space_tail(c, i, end);
}

/* ---- the pre-tokenizer table ---- */

enum step_kind {
    STEP_END,            /* after a row's last step */
    STEP_GPT2,           /* GPT-2's regex */
    STEP_LLAMA3,         /* Llama 3's regex with \p{N}{1,digits} */
    STEP_GPT4O,          /* GPT-4o's regex with \p{N}{1,digits}, with or without contractions */
    STEP_DEEPSEEK3,      /* DeepSeek V3's third regex */
    STEP_DIGITS,         /* \p{N}{1,digits} */
    STEP_ASCII_DIGITS3,  /* [0-9][0-9][0-9] */
    STEP_NEWLINE,        /* [\r\n] */
    STEP_RANGES,         /* [ranges]+, or \s?[ranges]+ with space */
    STEP_SPACE_LETTERS,  /* \s?\p{L}+ */
    STEP_SPACE_PUNCT,    /* \s?\p{P}+ */
    STEP_FALCON_PUNCT,   /* [\p{P}\$\+<=>\^~\|`]+ */
    STEP_TRAILING_SPACE, /* \s+$ */
};

typedef struct step {
    enum step_kind kind;
    int digits;                    /* LLAMA3, GPT4O, DIGITS */
    int contractions;              /* GPT4O */
    int space;                     /* RANGES */
    const uint32_t (*ranges)[2];   /* RANGES: sorted, disjoint */
    size_t n_ranges;
} step;

#define S_GPT2 {.kind = STEP_GPT2}
#define S_LLAMA3(d) {.kind = STEP_LLAMA3, .digits = (d)}
#define S_GPT4O(d, con) {.kind = STEP_GPT4O, .digits = (d), .contractions = (con)}
#define S_DEEPSEEK3 {.kind = STEP_DEEPSEEK3}
#define S_DIGITS(d) {.kind = STEP_DIGITS, .digits = (d)}
#define S_ASCII_DIGITS3 {.kind = STEP_ASCII_DIGITS3}
#define S_NEWLINE {.kind = STEP_NEWLINE}
#define S_RANGES(t) {.kind = STEP_RANGES, .ranges = (t), .n_ranges = sizeof(t) / sizeof((t)[0])}
#define S_SPACE_RANGES(t) {.kind = STEP_RANGES, .space = 1, .ranges = (t), \
                           .n_ranges = sizeof(t) / sizeof((t)[0])}
#define S_SPACE_LETTERS {.kind = STEP_SPACE_LETTERS}
#define S_SPACE_PUNCT {.kind = STEP_SPACE_PUNCT}
#define S_FALCON_PUNCT {.kind = STEP_FALCON_PUNCT}
#define S_TRAILING_SPACE {.kind = STEP_TRAILING_SPACE}

#define MAX_NAMES 4
#define MAX_STEPS 6

/* One row a kind: its tokenizer.ggml.pre names and its steps in the order they split. */
static const struct pretok {
    enum kvp_bpe_pre pre;
    const char *names[MAX_NAMES];
    step steps[MAX_STEPS];
} pretoks[] = {
    {KVP_PRE_GPT2, {"gpt2", "gpt-2", "mpt", "olmo"}, {S_GPT2}},
    {KVP_PRE_SMOLLM, {"smollm", "starcoder", "refact", "command-r"}, {S_DIGITS(1), S_GPT2}},
    {KVP_PRE_LLAMA3, {"llama-bpe", "llama3", "llama-v3"}, {S_LLAMA3(3)}},
    {KVP_PRE_QWEN2, {"qwen2", "deepseek-r1-qwen"}, {S_LLAMA3(1)}},
    {KVP_PRE_FALCON, {"falcon"}, {S_FALCON_PUNCT, S_GPT2, S_ASCII_DIGITS3}},
    {KVP_PRE_DEEPSEEK_LLM, {"deepseek-llm"},
     {S_NEWLINE, S_SPACE_RANGES(ds_letters), S_SPACE_RANGES(ds_punct), S_TRAILING_SPACE,
      S_RANGES(ds_cjk), S_DIGITS(INT_MAX)}},
    {KVP_PRE_DEEPSEEK_CODER, {"deepseek-coder"},
     {S_NEWLINE, S_SPACE_LETTERS, S_SPACE_PUNCT, S_RANGES(ds_cjk), S_DIGITS(1)}},
    {KVP_PRE_DEEPSEEK3, {"deepseek-v3"}, {S_DIGITS(3), S_RANGES(ds3_cjk), S_DEEPSEEK3}},
    {KVP_PRE_GPT4O, {"gpt-4o", "llama4"}, {S_GPT4O(3, 1)}},
    {KVP_PRE_TEKKEN, {"tekken"}, {S_GPT4O(1, 0)}},
    {KVP_PRE_CHATGLM4, {"chatglm-bpe", "glm4"}, {S_LLAMA3(3)}},
};
#define N_PRETOKS (sizeof pretoks / sizeof pretoks[0])

/* The match of step s at i (0 or less: none); *skip is how many positions a failed
 * match lets the scan step over (1 unless the step says otherwise). */
static int match(const cps *c, const step *s, int i, int end, int *skip)
{
    switch (s->kind) {
    case STEP_GPT2: return match_gpt2(c, i, end);
    case STEP_LLAMA3: return match_llama3(c, i, end, s->digits);
    case STEP_GPT4O: return match_gpt4o(c, i, end, s->contractions, s->digits);
    case STEP_DEEPSEEK3: return match_deepseek3(c, i, end);
    case STEP_DIGITS: return digits(c, i, end, s->digits);
    case STEP_ASCII_DIGITS3: return ascii_digits3(c, i, end);
    case STEP_NEWLINE: return is_rn(c, i, end);
    case STEP_RANGES:
        return s->space ? space_run_in(c, i, end, s->ranges, s->n_ranges)
                        : run_in(c, i, end, s->ranges, s->n_ranges);
    case STEP_SPACE_LETTERS: return space_gc_run(c, i, end, gc_letter);
    case STEP_SPACE_PUNCT: return space_gc_run(c, i, end, gc_punct);
    case STEP_FALCON_PUNCT: return falcon_punct(c, i, end);
    case STEP_TRAILING_SPACE: return trailing_space(c, i, end, skip);
    case STEP_END: break;
    }
    return 0;
}

int kvp_bpe_pre_from_name(const char *name, size_t len)
{
    for (size_t r = 0; r < N_PRETOKS; r++)
        for (int k = 0; k < MAX_NAMES && pretoks[r].names[k]; k++)
            if (strlen(pretoks[r].names[k]) == len && !memcmp(pretoks[r].names[k], name, len))
                return (int)pretoks[r].pre;
    return -1;
}

/* kvp_bpe_pre_names' list, made once from the table. */
static char names_list[512];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void make_names_list(void)
{
    size_t o = 0;
    for (size_t r = 0; r < N_PRETOKS; r++)
        for (int k = 0; k < MAX_NAMES && pretoks[r].names[k]; k++) {
            size_t n = strlen(pretoks[r].names[k]);
            if (o + 2 + n >= sizeof names_list)   /* the table outgrew the buffer */
                abort();
            if (o) {
                memcpy(names_list + o, ", ", 2);
                o += 2;
            }
            memcpy(names_list + o, pretoks[r].names[k], n);
            o += n;
        }
    names_list[o] = 0;
}

const char *kvp_bpe_pre_names(void)
{
    pthread_once(&names_once, make_names_list);
    return names_list;
}

/* ---- splitting ---- */

/* Splits every chunk of ends[0..n) (code point indices where each ends) at the matches
 * of step s into out: matches and the text between them become chunks. Returns the
 * count. */
static int split_pass(const cps *c, const step *s, const int *ends, int n, int *out)
{
    int n_out = 0;
    for (int k = 0, start = 0; k < n; start = ends[k++]) {
        int end = ends[k], gap = start;
        for (int i = start; i < end;) {
            int skip = 1, len = match(c, s, i, end, &skip);
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
    while (p + 1 < N_PRETOKS && pretoks[p].pre != pre)
        p++;
    /* The passes alternate between tmp and ends; chunks are code point indices until the
     * end, when they become byte offsets. */
    int *cur = tmp, *next = ends;
    cur[0] = n;
    n_chunks = 1;
    for (int k = 0; k < MAX_STEPS && pretoks[p].steps[k].kind != STEP_END; k++) {
        n_chunks = split_pass(&c, &pretoks[p].steps[k], cur, n_chunks, next);
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
