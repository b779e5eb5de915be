/* Chat templates rendered by the model's own Jinja template (model/jinja.h) to token ids.
 * The output's bytes carry whether they came from the template or from the conversation:
 * special tokens are matched (longest piece first) only in the template's bytes, and
 * everything between two special tokens is encoded as one text run, as Hugging Face
 * tokenizes a rendered template. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja.h"
#include "model/reasoning.h"
#include "model/template_impl.h"
#include "model/tokenizer.h"

static const kvp_tokenizer *tk(const kvp_template *t) { return t->tok; }

static int by_length(const void *a, const void *b, void *tokp)
{
    const kvp_tokenizer *tok = tokp;
    int x = *(const int *)a, y = *(const int *)b;
    return tok->piece_len[y] - tok->piece_len[x];
}

/* The special pieces of the vocabulary (control and user-defined tokens of two bytes or
 * more; byte tokens are not markers), and the family's markers, BOS and EOS, which a
 * vocabulary without token types holds as plain pieces. */
static int collect_specials(kvp_template *t)
{
    const kvp_tokenizer *tok = tk(t);
    render r;
    kvp_tpl_start(&r, t);                  /* for r.p: the family's marker ids */
    int *v = malloc(sizeof *v * (size_t)(tok->vocab_size + N_MK + 2)), n = 0;
    if (!v)
        return -ENOMEM;
    for (int id = 0; id < tok->vocab_size; id++) {
        int len = tok->piece_len[id], mark = id == t->bos || id == t->eos;
        for (int k = 0; k < N_MK; k++)
            mark |= r.p.mk[k] == id;
        if (len < 2 || (!mark && kvp_tokenizer_special(tok, tok->pieces[id], (size_t)len) != id))
            continue;
        if (len == 6 && !memcmp(tok->pieces[id], "<0x", 3))
            continue;
        v[n++] = id;
    }
    qsort_r(v, (size_t)n, sizeof *v, by_length, (void *)tok);
    t->specials = v;
    t->n_specials = n;
    return 0;
}

static kvp_jv *piece_value(kvp_jarena *a, const kvp_tokenizer *tok, int id)
{
    size_t n = 0;
    const char *p = id >= 0 ? kvp_tokenizer_piece(tok, -1, id, &n) : NULL;
    return kvp_jv_str_trusted(a, p ? p : "", p ? n : 0);
}

static kvp_jv *message(kvp_jarena *a, const char *role, const char *text, size_t len)
{
    kvp_jv *m = kvp_jv_dict(a);
    kvp_jv_set(a, m, "role", kvp_jv_str(a, role, strlen(role)));
    kvp_jv_set(a, m, "content", kvp_jv_str(a, text, len));
    return m;
}

/* Renders to text and mask; the length or -1 with err. */
static long render_text_tools(const kvp_template *t, kvp_jinja *j, const char *system,
                              size_t system_len, const kvp_chat_msg *msgs, int n,
                              const char *tools, size_t tools_len, char **out,
                              unsigned char **mask, char *err, size_t errlen)
{
    kvp_jarena *a = kvp_jarena_new(0);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    kvp_jv *vars = kvp_jv_dict(a), *list = kvp_jv_list(a);
    if (system_len)
        kvp_jv_append(a, list, message(a, "system", system, system_len));
    kvp_tpl_jinja_messages(a, list, t->tool_format, t->think && t->reasoning_var, msgs, n);
    kvp_jv_set(a, vars, "messages", list);
    if (tools_len) {
        kvp_jv *tv = kvp_tpl_json(a, tools, tools_len);
        if (!tv) {
            snprintf(err, errlen, "the tools are not a JSON array");
            kvp_jarena_free(a);
            return -1;
        }
        kvp_jv_set(a, vars, "tools", tv);
    }
    kvp_jv_set(a, vars, "add_generation_prompt", kvp_jv_bool(a, n > 0 && msgs[n - 1].user));
    kvp_jv_set(a, vars, "bos_token", piece_value(a, tk(t), t->bos));
    kvp_jv_set(a, vars, "eos_token", piece_value(a, tk(t), t->eos));
    long len = kvp_jinja_render(j, a, vars, NULL, out, mask, err, errlen);
    kvp_jarena_free(a);
    return len;
}

static long render_text(const kvp_template *t, kvp_jinja *j, const char *system,
                        size_t system_len, const kvp_chat_msg *msgs, int n, char **out,
                        unsigned char **mask, char *err, size_t errlen)
{
    return render_text_tools(t, j, system, system_len, msgs, n, NULL, 0, out, mask, err, errlen);
}

/* The special token whose piece starts at s[0..n), -1 if none. */
static int special_at(const kvp_template *t, const char *s, size_t n)
{
    const kvp_tokenizer *tok = tk(t);
    for (int i = 0; i < t->n_specials; i++) {
        int id = t->specials[i];
        size_t len = (size_t)tok->piece_len[id];
        if (len <= n && tok->pieces[id][0] == s[0] && !memcmp(tok->pieces[id], s, len))
            return id;
    }
    return -1;
}

/* Tokens of text[from, len): special tokens only where the mask says template. */
static int tokenize(const kvp_template *t, const char *text, const unsigned char *mask,
                    size_t from, size_t len, int run_start, int **out)
{
    render r;
    kvp_tpl_start(&r, t);
    r.run_start = run_start;
    size_t at = from;
    for (size_t i = from; i < len;) {
        int id = mask[i] ? -1 : special_at(t, text + i, len - i);
        if (id < 0) {
            i++;
            continue;
        }
        kvp_tpl_txt(&r, text + at, i - at);
        kvp_tpl_tok(&r, id);
        i += (size_t)tk(t)->piece_len[id];
        at = i;
    }
    kvp_tpl_txt(&r, text + at, len - at);
    return kvp_tpl_finish(&r, out);
}

static int alternates(const kvp_chat_msg *msgs, int n, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++)
        if (!!msgs[i].user != !(i % 2)) {
            snprintf(err, errlen, "user and assistant messages must alternate");
            return 0;
        }
    return 1;
}

/* msgs[0..n) checked to alternate, then rendered with the request's tools: the text's
 * length with text and mask malloc'd, or -1 with why in err. */
static long render_conversation(const kvp_template *t, const char *system, size_t system_len,
                                const kvp_chat_msg *msgs, int n, const char *tools,
                                size_t tools_len, char **text, unsigned char **mask, char *err,
                                size_t errlen)
{
    if (!alternates(msgs, n, err, errlen))
        return -1;
    return render_text_tools(t, t->jinja, system, system_len, msgs, n, tools, tools_len, text,
                             mask, err, errlen);
}

int kvp_template_render_jinja(const kvp_template *t, const char *system, size_t system_len,
                              const kvp_chat_msg *msgs, int n, int **out, char *err,
                              size_t errlen)
{
    return kvp_template_render_jinja_tools(t, system, system_len, msgs, n, NULL, 0, out, err,
                                           errlen);
}

int kvp_template_render_jinja_tools(const kvp_template *t, const char *system,
                                    size_t system_len, const kvp_chat_msg *msgs, int n,
                                    const char *tools, size_t tools_len, int **out, char *err,
                                    size_t errlen)
{
    char ebuf[256];
    if (!err || !errlen) {
        err = ebuf;
        errlen = sizeof ebuf;
    }
    char *text;
    unsigned char *mask;
    long len = render_conversation(t, system, system_len, msgs, n, tools, tools_len, &text,
                                   &mask, err, errlen);
    if (len < 0)
        return -EINVAL;
    int rc = tokenize(t, text, mask, 0, (size_t)len, 1, out);
    free(text);
    free(mask);
    return rc;
}

/* The reply's tokens stay as generated: when the new rendering goes on from the
 * rendering up to the previous user message (the transcript's start, as the caller
 * vouches) with the reply's text, only what follows the reply (after its kept stop
 * token) is new. */
static int extend(const kvp_template *t, const char *system, size_t system_len,
                  const kvp_chat_msg *msgs, int n, const char *tools, size_t tools_len,
                  const int *have, int n_have, const char *text, const unsigned char *mask,
                  size_t len, int **out)
{
    char err[64], *ptext;
    unsigned char *pmask;
    long plen = render_text_tools(t, t->jinja, system, system_len, msgs, n - 2, tools,
                                  tools_len, &ptext, &pmask, err, sizeof err);
    if (plen < 0)
        return -ENOENT;
    const kvp_chat_msg *reply = &msgs[n - 2];
    size_t at = (size_t)plen + reply->len;
    /* the same text (which bytes are the caller's may differ: a role the template wrote
     * as a literal in the generation prompt comes from the message now) */
    int ok = (size_t)plen <= len && !memcmp(ptext, text, (size_t)plen) && at <= len &&
             !memcmp(text + plen, reply->text, reply->len);
    free(ptext);
    free(pmask);
    if (!ok)
        return -ENOENT;
    int last = have[n_have - 1], after_special = 0;
    size_t pl = 0;
    const char *piece = kvp_template_is_stop(t, last) ? kvp_tokenizer_piece(tk(t), -1, last, &pl)
                                                      : NULL;
    if (piece && pl && at + pl <= len && !mask[at] && !memcmp(text + at, piece, pl)) {
        at += pl;                  /* the stop token the transcript kept is the template's */
        after_special = 1;
    }
    return tokenize(t, text, mask, at, len, after_special, out);
}

int kvp_template_jinja_turn(const kvp_template *t, const char *system, size_t system_len,
                            const kvp_chat_msg *msgs, int n, const int *have, int n_have,
                            int rendered, int *keep, int **out)
{
    return kvp_template_jinja_turn_tools(t, system, system_len, msgs, n, NULL, 0, have, n_have,
                                         rendered, keep, out);
}

int kvp_template_jinja_turn_tools(const kvp_template *t, const char *system, size_t system_len,
                                  const kvp_chat_msg *msgs, int n, const char *tools,
                                  size_t tools_len, const int *have, int n_have, int rendered,
                                  int *keep, int **out)
{
    char err[64];
    if (!t->jinja || n < 1 || !msgs[n - 1].user)
        return -EINVAL;
    char *text;
    unsigned char *mask;
    long len = render_conversation(t, system, system_len, msgs, n, tools, tools_len, &text,
                                   &mask, err, sizeof err);
    if (len < 0)
        return -EINVAL;
    int rc = -ENOENT;
    if (rendered && n >= 3 && n_have > 0) {
        rc = extend(t, system, system_len, msgs, n, tools, tools_len, have, n_have, text, mask,
                    (size_t)len, out);
        if (rc >= 0)
            *keep = n_have;
    }
    if (rc == -ENOENT) {
        /* from scratch: the longest prefix the transcript shares with the rendering */
        int *full;
        rc = tokenize(t, text, mask, 0, (size_t)len, 1, &full);
        if (rc >= 0) {
            int common = 0;
            while (common < rc && common < n_have && full[common] == have[common])
                common++;
            *out = malloc(sizeof **out * (size_t)(rc - common + 1));
            if (*out)
                memcpy(*out, full + common, sizeof **out * (size_t)(rc - common));
            *keep = common;
            rc = *out ? rc - common : -ENOMEM;
            free(full);
        }
    }
    free(text);
    free(mask);
    return rc;
}

/* Where the last message's content ends in the rendering: the last run of the caller's
 * bytes must end with the content, whole and verbatim, and nothing of the caller's may
 * follow it (so the cut is that message's end, not an earlier copy of the same text).
 * Sets *start and returns the cut, or -1. */
static long content_end(const char *text, const unsigned char *mask, size_t len,
                        const kvp_chat_msg *last, size_t *start)
{
    size_t end = len;
    while (end > 0 && !mask[end - 1])
        end--;
    if (end < last->len || memcmp(text + end - last->len, last->text, last->len))
        return -1;
    for (size_t i = end - last->len; i < end; i++)
        if (!mask[i])
            return -1;
    *start = end - last->len;
    return (long)end;
}

int kvp_template_jinja_prefill(const kvp_template *t, const char *system, size_t system_len,
                               const kvp_chat_msg *msgs, int n, const char *tools,
                               size_t tools_len, const int *have, int n_have, int *keep,
                               int *content_at, int **out, char *err, size_t errlen)
{
    char ebuf[160];
    if (!err || !errlen) {
        err = ebuf;
        errlen = sizeof ebuf;
    }
    if (!t->jinja || n < 2 || msgs[n - 1].user || !msgs[n - 1].len) {
        snprintf(err, errlen, "the last message must be a non-empty assistant message");
        return -EINVAL;
    }
    char *text;
    unsigned char *mask;
    long len = render_conversation(t, system, system_len, msgs, n, tools, tools_len, &text,
                                   &mask, err, errlen);
    if (len < 0)
        return -EINVAL;
    size_t start = 0;
    long cut = content_end(text, mask, (size_t)len, &msgs[n - 1], &start);
    int rc = -EINVAL;
    int *full = NULL, *before = NULL;
    if (cut < 0) {
        snprintf(err, errlen, "the chat template does not render the last assistant message's "
                 "content verbatim at the end of the conversation, so it cannot be continued");
        goto out;
    }
    int nf = tokenize(t, text, mask, 0, (size_t)cut, 1, &full);
    int nb = nf < 0 ? nf : tokenize(t, text, mask, 0, start, 1, &before);
    if (nf < 0 || nb < 0) {
        rc = nf < 0 ? nf : nb;
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    /* the content's tokens begin after those the rendering before it shares */
    int at = 0;
    while (at < nb && at < nf && before[at] == full[at])
        at++;
    int common = 0;
    while (common < nf && common < n_have && full[common] == have[common])
        common++;
    *out = malloc(sizeof **out * (size_t)(nf - common + 1));
    if (!*out) {
        rc = -ENOMEM;
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    memcpy(*out, full + common, sizeof **out * (size_t)(nf - common));
    *keep = common;
    *content_at = at;
    rc = nf - common;
out:
    free(full);
    free(before);
    free(text);
    free(mask);
    return rc;
}

int kvp_template_use_jinja(kvp_template *t, const char *src, size_t len, char *note,
                           size_t notelen)
{
    char err[200];
    kvp_jinja *j = kvp_jinja_parse(src, len, err, sizeof err);
    if (!j) {
        snprintf(note, notelen, "the Jinja interpreter refuses it (%s)", err);
        return -EINVAL;
    }
    /* a first conversation, so a template that fails on every input is refused now */
    kvp_chat_msg hello = {.user = 1, .text = "Hello", .len = 5};
    char *text;
    unsigned char *mask;
    long n = render_text(t, j, NULL, 0, &hello, 1, &text, &mask, err, sizeof err);
    if (n < 0) {
        snprintf(note, notelen, "the Jinja interpreter cannot render it (%s)", err);
        kvp_jinja_free(j);
        return -EINVAL;
    }
    long data = 0;
    for (long i = 0; i < n; i++)
        data += mask[i];
    /* the generation prompt leaves a reasoning block open: the rendering ends with the
     * opening marker (and whitespace), the template's own text, not the message's */
    long end = n;
    while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == ' ' || text[end - 1] == '\r' ||
                       text[end - 1] == '\t'))
        end--;
    long olen = (long)strlen(KVP_THINK_OPEN);
    int opens = end >= olen && !memcmp(text + end - olen, KVP_THINK_OPEN, (size_t)olen) &&
                !mask[end - olen];
    free(text);
    free(mask);
    if (!data) {
        /* not a chat template: the family's markers alone, say */
        snprintf(note, notelen, "it does not render the messages");
        kvp_jinja_free(j);
        return -EINVAL;
    }
    if (!t->specials && collect_specials(t) < 0) {
        snprintf(note, notelen, "out of memory");
        kvp_jinja_free(j);
        return -ENOMEM;
    }
    kvp_jinja_free(t->jinja);
    t->jinja = j;
    t->tool_format = kvp_toolcall_detect(src, len, kvp_template_name(t->format));
    t->reasoning_var = memmem(src, len, "reasoning_content", 17) != NULL;
    t->think_open = t->think && opens;
    return 0;
}

int kvp_template_encode_trusted(const kvp_template *t, const char *text, size_t len, int **out)
{
    if (!t->jinja)
        return kvp_template_reply(t, text, len, out);
    unsigned char *mask = calloc(len + 1, 1);   /* all of it the template's */
    if (!mask)
        return -ENOMEM;
    int rc = tokenize(t, text, mask, 0, len, 0, out);
    free(mask);
    return rc;
}

void kvp_template_free(kvp_template *t)
{
    kvp_jinja_free(t->jinja);
    free(t->specials);
    t->jinja = NULL;
    t->specials = NULL;
    t->n_specials = 0;
}
