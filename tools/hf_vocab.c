#include "tools/hf_vocab.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"

/* GGUF token types (llama.cpp's llama_token_type). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5,
       TT_BYTE = 6 };

#define MAX_VOCAB (1 << 22)

/* The split regexes of the byte-level pre-tokenizers kvpd implements (model/bpe.h),
 * exactly as tokenizer.json spells them. */
static const char LLAMA3_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* GPT-4o's (o200k) split regex; gpt-oss and Llama 4 use it too. */
static const char GPT4O_RE[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}"
    "\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}"
    "\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Mistral's tekken: GPT-4o's without the contractions, one digit at a time. */
static const char TEKKEN_RE[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}"
    "\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}"
    "\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* DeepSeek V3's three splits (CR and LF stand as themselves in its third regex). */
static const char DS3_RE1[] = "\\p{N}{1,3}";
static const char DS3_RE2[] = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
static const char DS3_RE3[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

/* llama.cpp's split regexes for Falcon, DeepSeek LLM and DeepSeek Coder, as a Sequence
 * of Splits spells them. */
static const char FALCON_RE1[] = "[\\p{P}\\$\\+<=>\\^~\\|`]+";
static const char FALCON_RE2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char FALCON_RE3[] = "[0-9][0-9][0-9]";
static const char DS_NEWLINE_RE[] = "[\\r\\n]";
static const char DS_LETTERS_RE[] =
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376-\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
    "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183-\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2-\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+";
static const char DS_PUNCT_RE[] = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+";
static const char DS_TRAILING_RE[] = "\\s+$";
static const char DS_CJK_RE[] = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+";

#define MAX_SPLITS 6

/* The byte-level pre-tokenizers written as a Sequence of regex Splits, then ByteLevel
 * without its own regex. */
static const struct { const char *name; const char *re[MAX_SPLITS]; } split_pres[] = {
    {"llama-bpe", {LLAMA3_RE}},
    {"qwen2", {QWEN2_RE}},
    {"gpt-4o", {GPT4O_RE}},
    {"tekken", {TEKKEN_RE}},
    {"deepseek-v3", {DS3_RE1, DS3_RE2, DS3_RE3}},
    {"falcon", {FALCON_RE1, FALCON_RE2, FALCON_RE3}},
    {"deepseek-llm", {DS_NEWLINE_RE, DS_LETTERS_RE, DS_PUNCT_RE, DS_TRAILING_RE, DS_CJK_RE,
                      "\\p{N}+"}},
    {"deepseek-coder", {DS_NEWLINE_RE, "\\s?\\p{L}+", "\\s?\\p{P}+", DS_CJK_RE, "\\p{N}"}},
};

static const char *type_of(json_t *o)
{
    const char *s = json_string_value(json_object_get(o, "type"));
    return s ? s : "";
}

/* Whether a normalizer is NFC (alone or as a Sequence's only member). */
static int is_nfc(json_t *norm)
{
    if (!strcmp(type_of(norm), "Sequence") && json_array_size(json_object_get(norm, "normalizers")) == 1)
        norm = json_array_get(json_object_get(norm, "normalizers"), 0);
    return !strcmp(type_of(norm), "NFC");
}

/* tokenizer.ggml.pre for a byte-level tokenizer.json's pre_tokenizer (and normalizer),
 * or NULL. */
static const char *pre_name(json_t *pre, json_t *norm)
{
    if (!strcmp(type_of(pre), "ByteLevel"))
        return json_is_false(json_object_get(pre, "use_regex")) ? NULL : "gpt2";
    if (strcmp(type_of(pre), "Sequence"))
        return NULL;
    json_t *seq = json_object_get(pre, "pretokenizers");
    size_t n = json_array_size(seq);
    if (n < 2 || strcmp(type_of(json_array_get(seq, n - 1)), "ByteLevel"))
        return NULL;
    json_t *first = json_array_get(seq, 0), *bl = json_array_get(seq, n - 1);
    int bl_regex = !json_is_false(json_object_get(bl, "use_regex"));
    if (n == 2 && !strcmp(type_of(first), "Digits") &&
        json_is_true(json_object_get(first, "individual_digits")) && bl_regex)
        return is_nfc(norm) ? "command-r" : "smollm";
    if (bl_regex)
        return NULL;
    /* Each Split keeps its matches and the text between them: "Isolated", or "Removed"
     * with invert (it removes the gaps, and these regexes leave none). */
    for (size_t p = 0; p < sizeof split_pres / sizeof split_pres[0]; p++) {
        size_t k = 0;
        for (; k + 1 < n; k++) {
            json_t *sp = json_array_get(seq, k);
            const char *behavior = json_string_value(json_object_get(sp, "behavior")) ?: "";
            const char *re = json_string_value(json_object_get(json_object_get(sp, "pattern"),
                                                               "Regex"));
            int keeps = !strcmp(behavior, "Isolated") ? !json_is_true(json_object_get(sp, "invert"))
                      : !strcmp(behavior, "Removed") && json_is_true(json_object_get(sp, "invert"));
            if (k >= MAX_SPLITS || strcmp(type_of(sp), "Split") || !keeps || !re || !split_pres[p].re[k] ||
                strcmp(re, split_pres[p].re[k]))
                break;
        }
        if (k + 1 == n && (k == MAX_SPLITS || !split_pres[p].re[k]))
            return split_pres[p].name;
    }
    return NULL;
}

/* Whether a normalizer (or one in its Sequence) is Prepend("▁"). */
static int has_prepend(json_t *norm)
{
    if (!strcmp(type_of(norm), "Prepend"))
        return !strcmp(json_string_value(json_object_get(norm, "prepend")) ?: "", "\u2581");
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(norm, "normalizers"), i, v)
        if (has_prepend(v))
            return 1;
    return 0;
}

/* A config entry naming a token: "<s>" or {"content": "<s>", ...}. */
static const char *token_text(json_t *v)
{
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_string_value(v);
}

static json_t *load_json(const char *path, size_t flags, char *err, size_t errlen)
{
    json_error_t je;
    json_t *j = json_load_file(path, flags, &je);
    if (!j)
        kvp_errorf(err, errlen, -EINVAL, "%s: line %d: %s", path, je.line, je.text);
    else if (!json_is_object(j)) {
        kvp_errorf(err, errlen, -EINVAL, "%s: not a JSON object", path);
        json_decref(j);
        j = NULL;
    }
    return j;
}

/* The id of a piece among tok[0..n), -1 if absent (configs name few tokens). */
static long find_piece(char **tok, long n, const char *s)
{
    for (long i = 0; s && i < n; i++)
        if (tok[i] && !strcmp(tok[i], s))
            return i;
    return -1;
}

/* Merges as "A B" strings: tokenizer.json has them either so or as ["A", "B"]. */
static int merge_text(json_t *m, char **out)
{
    if (json_is_string(m)) {
        *out = strdup(json_string_value(m));
    } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
        const char *a = json_string_value(json_array_get(m, 0));
        const char *b = json_string_value(json_array_get(m, 1));
        size_t la = strlen(a), lb = strlen(b);
        if ((*out = malloc(la + lb + 2))) {
            memcpy(*out, a, la);
            (*out)[la] = ' ';
            memcpy(*out + la + 1, b, lb + 1);
        }
    } else {
        return -EINVAL;
    }
    return *out ? 0 : -ENOMEM;
}

int kvp_hf_vocab_add(kvp_gguf_writer *w, const char *tokenizer_path, const char *config_path,
                     long *vocab, char *err, size_t errlen)
{
    json_t *tj = load_json(tokenizer_path, 0, err, errlen), *cj = NULL;
    if (!tj)
        return -EINVAL;
    /* Configs carry integers beyond 64 bits (model_max_length 1e30); only their strings
     * are read. */
    if (config_path && !(cj = load_json(config_path, JSON_DECODE_INT_AS_REAL, err, errlen))) {
        json_decref(tj);
        return -EINVAL;
    }
    char **tok = NULL, **merges = NULL;
    int32_t *type = NULL;
    float *score = NULL;
    size_t n_merges = 0;
    long n = 0;
    int rc = -EINVAL;

    json_t *model = json_object_get(tj, "model");
    json_t *vj = json_object_get(model, "vocab"), *mj = json_object_get(model, "merges");
    json_t *added = json_object_get(tj, "added_tokens");
    if (strcmp(type_of(model), "BPE") || !json_is_object(vj) || !json_is_array(mj)) {
        kvp_errorf(err, errlen, rc, "%s: model is not BPE with a vocab and merges",
                   tokenizer_path);
        goto out;
    }
    int byte_level = !strcmp(type_of(json_object_get(tj, "decoder")), "ByteLevel");
    const char *pre = NULL;
    if (byte_level && !(pre = pre_name(json_object_get(tj, "pre_tokenizer"),
                                            json_object_get(tj, "normalizer")))) {
        kvp_errorf(err, errlen, rc, "%s: pre_tokenizer is none kvpd implements (the split "
                   "regexes of Llama 3, Qwen 2, GPT-4o, tekken, DeepSeek V3, DeepSeek LLM or "
                   "Coder, or Falcon, SmolLM's "
                   "or Command-R's digits + ByteLevel, GPT-2's ByteLevel)",
                   tokenizer_path);
        goto out;
    }
    if (!byte_level && !json_is_true(json_object_get(model, "byte_fallback"))) {
        kvp_errorf(err, errlen, rc, "%s: neither byte-level (ByteLevel decoder) nor "
                   "SentencePiece-style (byte_fallback) BPE", tokenizer_path);
        goto out;
    }

    /* Vocabulary size: the highest id of the vocab and the added tokens, plus one. */
    const char *key;
    json_t *v;
    json_object_foreach(vj, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= MAX_VOCAB) {
            kvp_errorf(err, errlen, rc, "%s: vocab entry \"%.40s\" has a bad id", tokenizer_path, key);
            goto out;
        }
        if (id >= n)
            n = (long)id + 1;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (!json_is_integer(json_object_get(v, "id")) || id < 0 || id >= MAX_VOCAB ||
            !json_is_string(json_object_get(v, "content"))) {
            kvp_errorf(err, errlen, rc, "%s: added_tokens[%zu] has no id or content",
                       tokenizer_path, i);
            goto out;
        }
        if (id >= n)
            n = (long)id + 1;
    }
    tok = calloc((size_t)n + 1, sizeof *tok);
    type = calloc((size_t)n + 1, sizeof *type);
    score = calloc((size_t)n + 1, sizeof *score);
    n_merges = json_array_size(mj);
    merges = calloc(n_merges + 1, sizeof *merges);
    rc = -ENOMEM;
    if (!tok || !type || !score || !merges) {
        kvp_errorf(err, errlen, rc, "out of memory for %ld tokens", n);
        goto out;
    }
    json_object_foreach(vj, key, v) {
        long id = (long)json_integer_value(v);
        free(tok[id]);
        if (!(tok[id] = strdup(key)))
            goto out;
        int b;
        char c;
        type[id] = !byte_level && sscanf(key, "<0x%2X%c", &b, &c) == 2 && c == '>' &&
                   strlen(key) == 6 ? TT_BYTE : TT_NORMAL;
        /* SentencePiece merges by piece score: a merge result scores minus its rank,
         * every other piece can only come from the text as it is. */
        score[id] = -1e30f;
    }
    json_array_foreach(added, i, v) {
        long id = (long)json_integer_value(json_object_get(v, "id"));
        const char *content = json_string_value(json_object_get(v, "content"));
        free(tok[id]);
        if (!(tok[id] = strdup(content)))
            goto out;
        int special = json_is_true(json_object_get(v, "special"));
        type[id] = !byte_level && !strcmp(content, "<unk>") ? TT_UNKNOWN
                 : special ? TT_CONTROL : TT_USER_DEFINED;
    }
    /* Holes in the id range become unused padding pieces, as converters write them. */
    for (long id = 0; id < n; id++) {
        if (tok[id])
            continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%ld]", id);
        if (!(tok[id] = strdup(pad)))
            goto out;
        type[id] = TT_UNUSED;
    }
    json_array_foreach(mj, i, v) {
        if ((rc = merge_text(v, &merges[i])) < 0) {
            kvp_errorf(err, errlen, rc, "%s: merges[%zu] is not \"A B\" or [\"A\", \"B\"]",
                       tokenizer_path, i);
            goto out;
        }
        if (byte_level)
            continue;
        /* The merged piece's score: minus the rank of its first merge. */
        char *sp = strchr(merges[i], ' ');
        if (!sp)
            continue;
        *sp = 0;
        size_t la = strlen(merges[i]), lb = strlen(sp + 1);
        char *joined = malloc(la + lb + 1);
        if (!joined) {
            *sp = ' ';
            rc = -ENOMEM;
            goto out;
        }
        memcpy(joined, merges[i], la);
        memcpy(joined + la, sp + 1, lb + 1);
        *sp = ' ';
        json_t *idv = json_object_get(vj, joined);
        free(joined);
        long id = json_is_integer(idv) ? (long)json_integer_value(idv) : -1;
        if (id >= 0 && score[id] < -(float)i)
            score[id] = -(float)i;
    }

    rc = kvp_gguf_writer_add_str(w, "tokenizer.ggml.model", byte_level ? "gpt2" : "llama");
    if (byte_level) {
        rc = rc ? rc : kvp_gguf_writer_add_str(w, "tokenizer.ggml.pre", pre);
        rc = rc ? rc : kvp_gguf_writer_add_str_array(w, "tokenizer.ggml.merges",
                                                    (const char *const *)merges, n_merges);
    } else {
        /* User-defined pieces keep their merge scores: Gemma's whitespace runs ("▁▁")
         * are both added tokens and merge results, and merge in rank order. */
        for (long id = 0; id < n; id++)
            if (type[id] != TT_NORMAL && (type[id] != TT_USER_DEFINED || score[id] < -1e29f))
                score[id] = 0.0f;
        /* SentencePiece's dummy prefix is the normalizer's Prepend("▁") (Llama 2 has
         * it, Gemma does not). */
        rc = rc ? rc : kvp_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix",
                                               has_prepend(json_object_get(tj, "normalizer")));
        rc = rc ? rc : kvp_gguf_writer_add_f32_array(w, "tokenizer.ggml.scores", score,
                                                    (uint64_t)n);
    }
    rc = rc ? rc : kvp_gguf_writer_add_str_array(w, "tokenizer.ggml.tokens",
                                                (const char *const *)tok, (uint64_t)n);
    rc = rc ? rc : kvp_gguf_writer_add_i32_array(w, "tokenizer.ggml.token_type", type,
                                                (uint64_t)n);
    /* Roles: BOS and EOS from the config; the end-of-turn token is the first of the
     * known turn markers the vocabulary has (as llama.cpp picks it). */
    static const char *const eot_names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>",
                                            "<end_of_turn>", "<|endoftext|>"};
    long bos = find_piece(tok, n, token_text(json_object_get(cj, "bos_token")));
    long eos = find_piece(tok, n, token_text(json_object_get(cj, "eos_token")));
    long unk = find_piece(tok, n, token_text(json_object_get(cj, "unk_token")));
    long eot = -1;
    for (size_t k = 0; cj && eot < 0 && k < sizeof eot_names / sizeof eot_names[0]; k++)
        eot = find_piece(tok, n, eot_names[k]);
    if (!rc && bos >= 0)
        rc = kvp_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (!rc && eos >= 0)
        rc = kvp_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (!rc && unk >= 0)
        rc = kvp_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk);
    if (!rc && eot >= 0)
        rc = kvp_gguf_writer_add_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)eot);
    /* chat_template: a string, or a list of named templates ("default" is the chat one). */
    json_t *ct = json_object_get(cj, "chat_template");
    const char *tmpl = json_string_value(ct);
    json_array_foreach(ct, i, v)
        if (!strcmp(json_string_value(json_object_get(v, "name")) ?: "", "default"))
            tmpl = json_string_value(json_object_get(v, "template"));
    if (!rc && tmpl)
        rc = kvp_gguf_writer_add_str(w, "tokenizer.chat_template", tmpl);
    if (rc)
        kvp_errorf(err, errlen, rc, "cannot add the tokenizer metadata");
    *vocab = n;
out:
    for (long id = 0; tok && id < n; id++)
        free(tok[id]);
    for (size_t k = 0; merges && k < n_merges; k++)
        free(merges[k]);
    free(tok);
    free(merges);
    free(type);
    free(score);
    json_decref(tj);
    json_decref(cj);
    return rc;
}
