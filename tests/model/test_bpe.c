/* Byte-level BPE: the pre-tokenizer splits (each regex's cases worked out by hand), NFC,
 * merges by rank on a small vocabulary built with the GGUF writer, the special-token
 * guard, raw-byte round trips and refused metadata. The real vocabularies are compared
 * against transformers.js in tests/tokref. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/bpe.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

/* The chunks of text under pre, joined with '|'. */
static char *split(enum kvp_bpe_pre pre, const char *text, size_t len)
{
    int *ends = malloc((len + 1) * sizeof *ends);
    int n = kvp_bpe_split(pre, text, len, ends);
    cr_assert_geq(n, 0);
    char *out = malloc(len + (size_t)n + 1);
    size_t o = 0;
    for (int i = 0, start = 0; i < n; start = ends[i++]) {
        if (i)
            out[o++] = '|';
        memcpy(out + o, text + start, (size_t)(ends[i] - start));
        o += (size_t)(ends[i] - start);
    }
    out[o] = 0;
    free(ends);
    return out;
}

static void assert_split(enum kvp_bpe_pre pre, const char *text, const char *want)
{
    char *got = split(pre, text, strlen(text));
    cr_assert_str_eq(got, want, "pre %d: \"%s\"", (int)pre, text);
    free(got);
}

Test(bpe, gpt2_split)
{
    assert_split(KVP_PRE_GPT2, "Hello world", "Hello| world");
    assert_split(KVP_PRE_GPT2, "it's we'll I'M", "it|'s| we|'ll| I|'|M");
    assert_split(KVP_PRE_GPT2, "  a", " | a");
    assert_split(KVP_PRE_GPT2, "a  \n", "a|  \n");
    assert_split(KVP_PRE_GPT2, "x123 45 y", "x|123| 45| y");
    assert_split(KVP_PRE_GPT2, "a\nb", "a|\n|b");
    assert_split(KVP_PRE_GPT2, "hi!!! ?", "hi|!!!| ?");
    assert_split(KVP_PRE_GPT2, "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87", "caf\xc3\xa9| \xe4\xb8\xad\xe6\x96\x87");
}

Test(bpe, llama3_split)
{
    assert_split(KVP_PRE_LLAMA3, "I'M it'S we'LL", "I|'M| it|'S| we|'LL");
    assert_split(KVP_PRE_LLAMA3, "1234567", "123|456|7");
    assert_split(KVP_PRE_LLAMA3, "\n\n  x", "\n\n| | x");
    assert_split(KVP_PRE_LLAMA3, "a...\n\nb", "a|...\n\n|b");
    assert_split(KVP_PRE_LLAMA3, "\tx", "\tx");
    assert_split(KVP_PRE_LLAMA3, "x  \n y", "x|  \n| y");
    assert_split(KVP_PRE_LLAMA3, "$x (y)", "$x| (|y|)");
    assert_split(KVP_PRE_LLAMA3, "end   ", "end|   ");
}

Test(bpe, qwen2_and_smollm_split)
{
    assert_split(KVP_PRE_QWEN2, "12345 x", "1|2|3|4|5| x");
    /* SmolLM isolates every \p{N} (½ and Arabic-Indic digits too, as Hugging Face
     * tokenizers' Digits does), then runs GPT-2's regex between them. */
    assert_split(KVP_PRE_SMOLLM, "a\xc2\xbd" "b 12", "a|\xc2\xbd|b| |1|2");
    assert_split(KVP_PRE_SMOLLM, "x \xd9\xa3\xd9\xa4", "x| |\xd9\xa3|\xd9\xa4");
    assert_split(KVP_PRE_SMOLLM, "it's 3", "it|'s| |3");
}

/* The pre-tokenizers without an npm reference, each case worked out by hand from
 * llama.cpp's regex list for it (llama-vocab.cpp, quoted in model/bpe.h), the regexes
 * applied in order, each to every chunk of the one before. */
Test(bpe, falcon_split)
{
    /* [\p{P}\$\+<=>\^~\|`]+ first: punctuation and these symbols split off, even
     * inside contractions; then GPT-2's regex; then [0-9][0-9][0-9] from the left. */
    assert_split(KVP_PRE_FALCON, "Hello, world!", "Hello|,| world|!");
    assert_split(KVP_PRE_FALCON, "x=1+2", "x|=|1|+|2");
    assert_split(KVP_PRE_FALCON, "it's", "it|'|s");
    assert_split(KVP_PRE_FALCON, "12345 678", "123|45| |678");
    assert_split(KVP_PRE_FALCON, "a  b\nc", "a| | b|\n|c");
    /* [0-9] is ASCII only: Arabic-Indic digits stay one GPT-2 number chunk */
    assert_split(KVP_PRE_FALCON, "\xd9\xa3\xd9\xa4\xd9\xa5\xd9\xa6",
                 "\xd9\xa3\xd9\xa4\xd9\xa5\xd9\xa6");
}

Test(bpe, deepseek_llm_split)
{
    /* [\r\n] | \s?[cased letters]+ | \s?[!-/:-~...]+ | \s+$ | [CJK]+ | \p{N}+ */
    assert_split(KVP_PRE_DEEPSEEK_LLM, "Hello world\nfoo", "Hello| world|\n|foo");
    /* é is one of the letters of the second regex, not of the third's ASCII range: the
     * third splits the word around it */
    assert_split(KVP_PRE_DEEPSEEK_LLM, "H\xc3\xa9llo", "H|\xc3\xa9|llo");
    assert_split(KVP_PRE_DEEPSEEK_LLM, "abc 123", "abc| |123");
    assert_split(KVP_PRE_DEEPSEEK_LLM, "x!? y", "x|!?| y");
    assert_split(KVP_PRE_DEEPSEEK_LLM, "end   ", "end|   ");
    /* 中文字 한국: CJK and Hangul runs, the space between them alone */
    assert_split(KVP_PRE_DEEPSEEK_LLM, "\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97 \xed\x95\x9c\xea\xb5\xad",
                 "\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97| |\xed\x95\x9c\xea\xb5\xad");
    /* no contractions: the letter runs split off first, so the apostrophe between them
     * stays a chunk of its own (the third regex only splits chunks further) */
    assert_split(KVP_PRE_DEEPSEEK_LLM, "don't", "don|'|t");
    assert_split(KVP_PRE_DEEPSEEK_LLM, "\r\n\n", "\r|\n|\n");
}

Test(bpe, deepseek_coder_split)
{
    /* [\r\n] | \s?\p{L}+ | \s?\p{P}+ | [CJK]+ | \p{N} */
    assert_split(KVP_PRE_DEEPSEEK_CODER, "def f(x):\n  return 42",
                 "def| f|(|x|):|\n| | return| |4|2");
    /* 中文 abc: CJK are \p{L} */
    assert_split(KVP_PRE_DEEPSEEK_CODER, "\xe4\xb8\xad\xe6\x96\x87 abc",
                 "\xe4\xb8\xad\xe6\x96\x87| abc");
    /* + is a symbol, not \p{P}: a chunk of the text between matches */
    assert_split(KVP_PRE_DEEPSEEK_CODER, "a+b", "a|+|b");
    assert_split(KVP_PRE_DEEPSEEK_CODER, "it's", "it|'|s");
}

Test(bpe, gpt4o_and_tekken_split)
{
    /* Words are [U]*[L]+ or [U]+[L]*: a capital starts a new word (camel case) */
    assert_split(KVP_PRE_GPT4O, "HelloWorld", "Hello|World");
    assert_split(KVP_PRE_GPT4O, "ABCdef", "ABCdef");
    assert_split(KVP_PRE_GPT4O, "HELLO world", "HELLO| world");
    /* GPT-4o keeps a contraction on its word, case-insensitively; tekken has none */
    assert_split(KVP_PRE_GPT4O, "don't I'LL", "don't| I'LL");
    assert_split(KVP_PRE_TEKKEN, "don't", "don|'t");
    /* \p{N}{1,3} against tekken's \p{N} */
    assert_split(KVP_PRE_GPT4O, "12345", "123|45");
    assert_split(KVP_PRE_TEKKEN, "12345", "1|2|3|4|5");
    /* punctuation takes the line breaks and slashes after it */
    assert_split(KVP_PRE_TEKKEN, "a.\n/b", "a|.\n/|b");
    assert_split(KVP_PRE_GPT4O, "http://x", "http|://|x");
    /* e + combining acute (a mark is in both classes) is one word; CJK (Lo) too */
    assert_split(KVP_PRE_GPT4O, "caf" "e\xcc\x81 \xe4\xb8\xad\xe6\x96\x87",
                 "caf" "e\xcc\x81| \xe4\xb8\xad\xe6\x96\x87");
    /* a title-case letter (U+01C5) counts as upper */
    assert_split(KVP_PRE_GPT4O, "x\xc7\x85x", "x|\xc7\x85x");
    assert_split(KVP_PRE_GPT4O, "x  \n y", "x|  \n| y");
}

Test(bpe, chatglm_split)
{
    /* Llama 3's regex */
    assert_split(KVP_PRE_CHATGLM4, "1234567 it'S", "123|456|7| it|'S");
}

Test(bpe, pre_names)
{
    static const struct { const char *name; enum kvp_bpe_pre pre; } names[] = {
        {"mpt", KVP_PRE_GPT2}, {"olmo", KVP_PRE_GPT2}, {"starcoder", KVP_PRE_SMOLLM},
        {"refact", KVP_PRE_SMOLLM}, {"command-r", KVP_PRE_SMOLLM},
        {"deepseek-r1-qwen", KVP_PRE_QWEN2}, {"falcon", KVP_PRE_FALCON},
        {"deepseek-llm", KVP_PRE_DEEPSEEK_LLM}, {"deepseek-coder", KVP_PRE_DEEPSEEK_CODER},
        {"deepseek-v3", KVP_PRE_DEEPSEEK3}, {"gpt-4o", KVP_PRE_GPT4O}, {"tekken", KVP_PRE_TEKKEN},
        {"chatglm-bpe", KVP_PRE_CHATGLM4},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        cr_assert_eq(kvp_bpe_pre_from_name(names[i].name, strlen(names[i].name)),
                     (int)names[i].pre, "%s", names[i].name);
        cr_assert(strstr(kvp_bpe_pre_names(), names[i].name), "%s", names[i].name);
    }
    cr_assert_eq(kvp_bpe_pre_from_name("bert", 4), -1);
    /* a name is matched whole, never by a prefix either way */
    cr_assert_eq(kvp_bpe_pre_from_name("gpt", 3), -1);
    cr_assert_eq(kvp_bpe_pre_from_name("gpt2x", 5), -1);
    cr_assert_eq(kvp_bpe_pre_from_name("", 0), -1);
    /* every name the error message lists is one the loader takes */
    const char *list = kvp_bpe_pre_names();
    int listed = 0;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        cr_assert(n > 0 && n < 32, "list '%s'", list);
        cr_assert_geq(kvp_bpe_pre_from_name(p, n), 0, "%.*s", (int)n, p);
        listed++;
        p += n;
        if (*p)
            p += 2;   /* ", " */
    }
    cr_assert_eq(listed, 22, "list '%s'", list);
}

Test(bpe, long_runs_split_linearly)
{
    /* 1M spaces then a word: one chunk of spaces, one " x" (no quadratic rescans; the
     * suite's timeout would catch one). */
    size_t n = 1 << 20;
    char *text = malloc(n + 2);
    memset(text, ' ', n);
    text[n] = 'x';
    text[n + 1] = 0;
    for (int pre = KVP_PRE_GPT2; pre <= KVP_PRE_CHATGLM4; pre++) {
        int *ends = malloc((n + 2) * sizeof *ends);
        cr_assert_eq(kvp_bpe_split((enum kvp_bpe_pre)pre, text, n + 1, ends), 2);
        cr_assert_eq(ends[0], (int)n - 1);
        cr_assert_eq(ends[1], (int)n + 1);
        free(ends);
    }
    free(text);
}

static char *nfc(const char *s)
{
    char *out;
    size_t len;
    cr_assert_eq(kvp_nfc(s, strlen(s), &out, &len), 0);
    out = realloc(out, len + 1);
    out[len] = 0;
    return out;
}

Test(bpe, nfc)
{
    static const char *const cases[][2] = {
        {"e\xcc\x81", "\xc3\xa9"},                            /* e + acute -> é */
        {"\xe2\x84\xab", "\xc3\x85"},                         /* Angstrom sign -> Å */
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"}, /* jamo -> 각 */
        {"q\xcc\x87\xcc\xa3", "q\xcc\xa3\xcc\x87"},           /* reordered by class */
        {"\xcd\x84", "\xcc\x88\xcc\x81"},                     /* U+0344: excluded */
        {"\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc"},         /* U+0958: excluded */
        {"\xef\xac\x81", "\xef\xac\x81"},                     /* ﬁ: compatibility only */
        {"a\xff\xcc\x81", "a\xff\xcc\x81"},                   /* invalid byte blocks */
        {"plain ascii", "plain ascii"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = nfc(cases[i][0]);
        cr_assert_str_eq(got, cases[i][1], "case %zu", i);
        free(got);
    }
}

/* ---------------------------------------------- a small byte-level vocabulary */

/* ids 0..255: the bytes; then the merge results; then the specials. */
static const char *const merges[] = {"h e", "l l", "he ll", "\xc4\xa0 w", "a a", "o r"};
static const char *const merged[] = {"he", "ll", "hell", "\xc4\xa0w", "aa", "or"};
#define N_MERGED 6
#define ID_HE 256
#define ID_LL 257
#define ID_HELL 258
#define ID_SPW 259
#define ID_AA 260
#define ID_OR 261
#define ID_IM_START 262
#define ID_THINK 263
#define ID_SP2 264   /* user-defined "  " and "   " (GPT-NeoX's runs of spaces) */
#define ID_SP3 265

typedef struct vocab_spec {
    const char *pre;          /* NULL: no tokenizer.ggml.pre */
    int pre_as_u32;
    int n_merges;             /* -1: no tokenizer.ggml.merges */
    const char *bad_merge;    /* replaces the first merge */
    int drop_byte;            /* 1: the byte 'z' token is renamed away; 2: those of the
                                 bytes UTF-8 never uses (0xC0, 0xC1, 0xF5..0xFF) */
} vocab_spec;

static int load(const vocab_spec *s, kvp_tokenizer *t, char *err, size_t errlen)
{
    int n = 256 + N_MERGED + 4;
    char **toks = calloc((size_t)n, sizeof *toks);
    int32_t *types = calloc((size_t)n, sizeof *types);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        toks[b] = calloc(8, 1);
        kvp_bpe_spell(&c, 1, toks[b]);
        types[b] = 1;
    }
    for (int b = 0; b < 256 && s->drop_byte; b++)
        if (s->drop_byte == 1 ? b == 'z' : b == 0xC0 || b == 0xC1 || b >= 0xF5) {
            free(toks[b]);
            toks[b] = calloc(32, 1);
            snprintf(toks[b], 32, "not-a-byte-%d", b);
        }
    for (int i = 0; i < N_MERGED; i++) {
        toks[256 + i] = strdup(merged[i]);
        types[256 + i] = 1;
    }
    toks[ID_IM_START] = strdup("<|im_start|>");
    types[ID_IM_START] = 3;
    toks[ID_THINK] = strdup("<think>");
    types[ID_THINK] = 4;
    toks[ID_SP2] = strdup("  ");
    types[ID_SP2] = 4;
    toks[ID_SP3] = strdup("   ");
    types[ID_SP3] = 4;
    const char *m[N_MERGED];
    memcpy(m, merges, sizeof m);
    if (s->bad_merge)
        m[0] = s->bad_merge;

    kvp_gguf_writer *w = kvp_gguf_writer_new();
    cr_assert_eq(kvp_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2"), 0);
    if (s->pre_as_u32)
        cr_assert_eq(kvp_gguf_writer_add_u32(w, "tokenizer.ggml.pre", 7), 0);
    else if (s->pre)
        cr_assert_eq(kvp_gguf_writer_add_str(w, "tokenizer.ggml.pre", s->pre), 0);
    cr_assert_eq(kvp_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens",
                                               (const char *const *)toks, (uint64_t)n), 0);
    cr_assert_eq(kvp_gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", types,
                                               (uint64_t)n), 0);
    if (s->n_merges >= 0)
        cr_assert_eq(kvp_gguf_writer_add_str_array(w, "tokenizer.ggml.merges", m,
                                                   (uint64_t)s->n_merges), 0);
    char *mem = NULL;
    size_t size;
    FILE *f = open_memstream(&mem, &size);
    char werr[256];
    cr_assert_eq(kvp_gguf_writer_write(w, f, NULL, NULL, werr, sizeof werr), 0, "%s", werr);
    fclose(f);
    kvp_gguf_writer_free(w);
    kvp_gguf g;
    cr_assert_eq(kvp_gguf_parse(&g, mem, size, werr, sizeof werr), 0, "%s", werr);
    int rc = kvp_tokenizer_load_gguf(t, &g, err, errlen);
    kvp_gguf_close(&g);
    free(mem);
    for (int i = 0; i < n; i++)
        free(toks[i]);
    free(toks);
    free(types);
    return rc;
}

static const vocab_spec good = { "gpt2", 0, N_MERGED, NULL, 0 };

static void assert_ids(const kvp_tokenizer *t, const char *text, const int *want, int n)
{
    int out[64];
    int got = kvp_tokenizer_encode(t, text, strlen(text), 0, out, 64);
    cr_assert_eq(got, n, "\"%s\": %d tokens, want %d", text, got, n);
    for (int i = 0; i < n; i++)
        cr_assert_eq(out[i], want[i], "\"%s\": token %d is %d, want %d", text, i, out[i], want[i]);
}

Test(bpe, merges_by_rank)
{
    kvp_tokenizer t;
    char err[256];
    cr_assert_eq(load(&good, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.add_space_prefix, 0);
    /* he + ll -> hell, then o; " w" + or + l + d */
    assert_ids(&t, "hello world", (int[]){ ID_HELL, 'o', ID_SPW, ID_OR, 'l', 'd' }, 6);
    /* equal ranks: leftmost first */
    assert_ids(&t, "aaa", (int[]){ ID_AA, 'a' }, 2);
    /* a merge never crosses a chunk: "he" and " llo" are separate words, no "hell" */
    assert_ids(&t, "he llo", (int[]){ ID_HE, ' ', ID_LL, 'o' }, 4);
    /* BOS/EOS flags with no such ids in the vocabulary add nothing */
    int out[8];
    cr_assert_eq(kvp_tokenizer_encode(&t, "aa", 2, KVP_ENCODE_BOS | KVP_ENCODE_EOS, out, 8), 1);
    cr_assert_eq(kvp_tokenizer_encode(&t, "hello", 5, 0, out, 1), -ENOSPC);
    kvp_tokenizer_free(&t);
}

Test(bpe, specials_only_by_lookup)
{
    kvp_tokenizer t;
    char err[256];
    cr_assert_eq(load(&good, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_tokenizer_lookup(&t, "<|im_start|>", 12), ID_IM_START);
    cr_assert_eq(kvp_tokenizer_lookup(&t, "<think>", 7), ID_THINK);
    const char *text = "<|im_start|>system\n<think>";
    int out[64];
    int n = kvp_tokenizer_encode(&t, text, strlen(text), 0, out, 64);
    cr_assert_gt(n, 2);
    for (int i = 0; i < n; i++)
        cr_assert(out[i] != ID_IM_START && out[i] != ID_THINK, "special token %d from text", out[i]);
    size_t len;
    const char *p = kvp_tokenizer_piece(&t, -1, ID_IM_START, &len);
    cr_assert_eq(len, 12);
    cr_assert(!memcmp(p, "<|im_start|>", 12));
    kvp_tokenizer_free(&t);
}

/* User-defined runs of whitespace are taken from text, longest at the leftmost place,
 * before the split; the text on each side is split and merged apart. */
Test(bpe, user_defined_space_runs_from_text)
{
    kvp_tokenizer t;
    char err[256];
    cr_assert_eq(load(&good, &t, err, sizeof err), 0, "%s", err);
    assert_ids(&t, "  hello", (int[]){ ID_SP2, ID_HELL, 'o' }, 3);
    assert_ids(&t, "   hello", (int[]){ ID_SP3, ID_HELL, 'o' }, 3);
    assert_ids(&t, "     ", (int[]){ ID_SP3, ID_SP2 }, 2);
    assert_ids(&t, "he  llo\n   ", (int[]){ ID_HE, ID_SP2, ID_LL, 'o', '\n', ID_SP3 }, 6);
    /* one space is no run: " w" still merges */
    assert_ids(&t, "hello world", (int[]){ ID_HELL, 'o', ID_SPW, ID_OR, 'l', 'd' }, 6);
    int out[2];
    cr_assert_eq(kvp_tokenizer_encode(&t, "a  b  c", 7, 0, out, 2), -ENOSPC);
    cr_assert_eq(kvp_tokenizer_encode(&t, "", 0, 0, out, 2), 0);
    kvp_tokenizer_free(&t);
}

Test(bpe, raw_bytes_round_trip)
{
    kvp_tokenizer t;
    char err[256];
    cr_assert_eq(load(&good, &t, err, sizeof err), 0, "%s", err);
    unsigned char text[512];
    for (int i = 0; i < 512; i++)
        text[i] = (unsigned char)(i * 7 + (i >> 3));   /* every byte, invalid UTF-8 too */
    int out[512];
    for (int pre = KVP_PRE_GPT2; pre <= KVP_PRE_CHATGLM4; pre++) {
        t.bpe->pre = (enum kvp_bpe_pre)pre;
        t.bpe->nfc = 0;
        int n = kvp_tokenizer_encode(&t, (const char *)text, sizeof text, 0, out, 512);
        cr_assert_gt(n, 0);
        unsigned char back[512];
        size_t o = 0;
        for (int i = 0; i < n; i++) {
            size_t len;
            const char *p = kvp_tokenizer_piece(&t, i ? out[i - 1] : -1, out[i], &len);
            cr_assert_leq(o + len, sizeof back);
            memcpy(back + o, p, len);
            o += len;
        }
        cr_assert_eq(o, sizeof text);
        cr_assert(!memcmp(back, text, sizeof text), "pre %d", pre);
    }
    kvp_tokenizer_free(&t);
}

static void assert_refused(vocab_spec s, const char *needle)
{
    kvp_tokenizer t;
    char err[256] = "";
    cr_assert_lt(load(&s, &t, err, sizeof err), 0, "loaded; wanted \"%s\"", needle);
    cr_assert(strstr(err, needle), "message \"%s\" lacks \"%s\"", err, needle);
}

Test(bpe, refused_metadata)
{
    vocab_spec s = good;
    s.pre = "klingon";
    assert_refused(s, "tokenizer.ggml.pre \"klingon\"");
    s = good;
    s.pre_as_u32 = 1;
    assert_refused(s, "tokenizer.ggml.pre is not a string");
    s = good;
    s.n_merges = -1;
    assert_refused(s, "tokenizer.ggml.merges");
    s = good;
    s.bad_merge = "nospace";
    assert_refused(s, "tokenizer.ggml.merges[0]");
    s = good;
    s.drop_byte = 1;
    assert_refused(s, "byte 0x7A");
    s.pre = "klingon";
    assert_refused(s, "deepseek-v3");   /* the message lists the known names */
    /* absent pre: GPT-2's split */
    s = good;
    s.pre = NULL;
    kvp_tokenizer t;
    char err[256];
    cr_assert_eq(load(&s, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.bpe->pre, KVP_PRE_GPT2);
    kvp_tokenizer_free(&t);
    /* merges naming pieces the vocabulary lacks are skipped, as HF skips them */
    s = good;
    s.bad_merge = "q z";
    cr_assert_eq(load(&s, &t, err, sizeof err), 0, "%s", err);
    assert_ids(&t, "he", (int[]){ 'h', 'e' }, 2);
    kvp_tokenizer_free(&t);
}

/* StarCoder's vocabulary has no tokens for the bytes UTF-8 never uses: it loads, and
 * those bytes are dropped from the ids (as transformers.js and llama.cpp drop them). */
Test(bpe, vocabulary_without_unused_bytes)
{
    vocab_spec s = good;
    s.pre = "starcoder";
    s.drop_byte = 2;
    kvp_tokenizer t;
    char err[256];
    cr_assert_eq(load(&s, &t, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.byte_token[0xC0], -1);
    cr_assert_eq(t.byte_token[0xFF], -1);
    cr_assert_eq(t.byte_token[0xC3], 0xC3);
    assert_ids(&t, "hello", (int[]){ ID_HELL, 'o' }, 2);
    assert_ids(&t, "a\xc0" "b", (int[]){ 'a', 'b' }, 2);
    int out[4];
    cr_assert_eq(kvp_tokenizer_encode(&t, "\xc0\xc1\xff", 3, 0, out, 4), 0);
    /* valid UTF-8 keeps every byte: é is C3 A9 */
    assert_ids(&t, "\xc3\xa9", (int[]){ 0xC3, 0xA9 }, 2);
    kvp_tokenizer_free(&t);
}
